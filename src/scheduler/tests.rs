use std::net::SocketAddr;

use super::*;
use crate::config::SchedulerConfig;
use crate::endpoints::{EndpointSpec, Endpoints, PodId, Update};

fn setup(scorers: Vec<(ScorerKind, u32)>, pods: usize) -> (Scheduler, Endpoints) {
    let config = SchedulerConfig {
        scorers,
        ..SchedulerConfig::default()
    };
    let metrics = RouterMetrics::register(&prometheus::Registry::new());
    let s = Scheduler::new(
        config,
        5,
        1,
        PrefixCacheMetrics::unregistered(),
        metrics.clone(),
    );
    let eps = Endpoints::new(s.prefix_cache().index().clone(), metrics);
    let specs = (0..pods)
        .map(|i| EndpointSpec {
            id: PodId {
                namespace: "default".into(),
                name: format!("pod-{i}"),
            },
            address: SocketAddr::from(([10, 0, 0, i as u8 + 1], 8000)),
            models: vec![],
            generation: String::new(),
            role: None,
        })
        .collect();
    eps.apply(Update::Reset(specs));
    (s, eps)
}

fn req(prompt: &str) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        prompt: Ok(prompt),
    }
}

#[test]
fn repeated_prompt_goes_to_the_recorded_pod() {
    let (s, eps) = setup(SchedulerConfig::default().scorers, 4);
    let set = eps.snapshot();
    let prompt = "system prompt ".repeat(50);
    let first = s
        .schedule(req(&prompt), s.candidates(&set, "m", None).unwrap(), true)
        .unwrap();
    assert_eq!(first.reason, DecisionReason::PrefixMiss);
    assert_eq!(first.ranked.len(), 4);
    let served = first.primary().clone();
    s.record("m", &first.hashes, &served, RecordOrigin::Local);
    let second = s
        .schedule(req(&prompt), s.candidates(&set, "m", None).unwrap(), true)
        .unwrap();
    assert_eq!(second.reason, DecisionReason::PrefixHit);
    assert_eq!(second.primary().label, served.label);
    let prefix = second
        .plugins
        .iter()
        .find(|p| p.plugin == "prefix-cache")
        .unwrap();
    let scores = prefix.scores.as_ref().unwrap();
    assert_eq!(scores.iter().filter(|&&x| x == 100).count(), 1);
}

#[test]
fn no_prompt_is_unscored_not_rejected() {
    let (s, eps) = setup(SchedulerConfig::default().scorers, 2);
    let set = eps.snapshot();
    let d = s
        .schedule(
            RouteRequest {
                model: "m",
                prompt: Err(crate::prompt::NoPrompt::PromptNotString.as_str()),
            },
            s.candidates(&set, "m", None).unwrap(),
            true,
        )
        .unwrap();
    assert_eq!(d.reason, DecisionReason::Unscored);
    assert_eq!(d.unscored, Some("prompt_not_string"));
    let d = s
        .schedule(req(""), s.candidates(&set, "m", None).unwrap(), true)
        .unwrap();
    assert_eq!(d.unscored, Some("empty_prompt"));
    assert!(
        d.plugins
            .iter()
            .any(|p| p.plugin == "prefix-cache" && p.scores.is_none())
    );
}

#[test]
fn ties_are_broken_randomly_but_reproducibly() {
    let (s, eps) = setup(vec![(ScorerKind::LeastRequest, 1)], 5);
    let set = eps.snapshot();
    let primaries: std::collections::HashSet<String> = (0..40)
        .map(|_| {
            s.schedule(req("x"), s.candidates(&set, "m", None).unwrap(), true)
                .unwrap()
                .primary()
                .label
                .clone()
        })
        .collect();
    assert!(
        primaries.len() > 1,
        "equal totals must not always pick the same pod"
    );
}

#[test]
fn restrict_and_errors() {
    let (s, eps) = setup(SchedulerConfig::default().scorers, 3);
    let set = eps.snapshot();
    let only: SocketAddr = "10.0.0.2:8000".parse().unwrap();
    let c = s.candidates(&set, "m", Some(&[only])).unwrap();
    assert_eq!(c.len(), 1);
    let ip_only: SocketAddr = "10.0.0.3:0".parse().unwrap();
    assert_eq!(s.candidates(&set, "m", Some(&[ip_only])).unwrap().len(), 1);
    assert_eq!(
        s.candidates(&set, "m", Some(&[])).unwrap_err(),
        PickError::SubsetUnavailable
    );
    let (s2, empty) = setup(SchedulerConfig::default().scorers, 0);
    assert_eq!(
        s2.candidates(&empty.snapshot(), "m", None).unwrap_err(),
        PickError::NoEndpoints
    );
    // A backed-up pod is filtered out; all backed up = error.
    for e in set.all() {
        e.set_stats(crate::endpoints::EngineStats {
            waiting: 10.0,
            ..Default::default()
        });
    }
    assert_eq!(
        s.schedule(req("x"), s.candidates(&set, "m", None).unwrap(), true)
            .unwrap_err(),
        PickError::Filtered("least-request")
    );
}

#[test]
fn destination_lists_primary_then_fallbacks() {
    let (s, eps) = setup(vec![(ScorerKind::LeastRequest, 1)], 7);
    let set = eps.snapshot();
    let d = s
        .schedule(req("x"), s.candidates(&set, "m", None).unwrap(), true)
        .unwrap();
    assert_eq!(d.ranked.len(), 5);
    assert_eq!(d.destination().split(',').count(), 5);
    assert!(d.destination().starts_with(&d.primary().host));
}
