//! Step 2, filters: Kthena's filter plugins in order (`least-request`: keep a pod iff its
//! engine's queue is under `maxWaitingRequests`; `lora-affinity`: keep a pod iff its engine
//! lists the request's model), each timed; a filter that leaves no pod ends the decision, named
//! ([`crate::scheduler::Filtered`]).
//!
//! The affinity mode's latency model routes around queues itself: with it (and a prompt to
//! match) no load filter runs, since Kthena's least-request filter would only refuse requests
//! once every pod queues (load shedding is the opt-in for that); lora-affinity, a constraint,
//! still does.

use std::sync::Arc;
use std::time::Instant;

use crate::scheduler::config::{FilterKind, SchedulerConfig};
use crate::scheduler::{
    Candidate, Observation, PluginType, RouteRequest, least_request, lora_affinity,
};

/// The filters that run for `request`, in order.
pub(super) fn active<'a>(
    config: &'a SchedulerConfig,
    request: &RouteRequest<'_>,
) -> impl Iterator<Item = FilterKind> + 'a {
    let no_load = matches!(&config.affinity,
        Some(a) if a.load_gate && a.latency_model && request.prompt.is_ok());
    let filters = config.filters.iter().copied();
    filters.filter(move |f| !(no_load && f.reads_load()))
}

/// Runs `filters` over `candidates` in order, each timed into `observations`; the filter that
/// left no pod, if one did (the later ones do not run).
/// `model` is the request's (lora-affinity's key).
pub(super) fn run<C: Candidate + Clone>(
    filters: impl IntoIterator<Item = FilterKind>,
    max_waiting: u64,
    model: &str,
    candidates: &mut Arc<[C]>,
    observations: &mut Vec<Observation>,
) -> Option<&'static str> {
    for filter in filters {
        let t = Instant::now();
        match filter {
            FilterKind::LeastRequest => least_request::filter(candidates, max_waiting),
            FilterKind::LoraAffinity => lora_affinity::filter(candidates, model),
        }
        observations.push(Observation::PluginTime {
            plugin: filter.as_str(),
            kind: PluginType::Filter,
            elapsed: t.elapsed(),
        });
        if candidates.is_empty() {
            return Some(filter.as_str());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::affinity::{AffinityConfig, RecentPicks};
    use crate::scheduler::test_pod::{Pod, req};
    use crate::scheduler::{EngineStats, Scheduler, Unscored};

    fn pods(waiting: &[f64]) -> Arc<[Arc<Pod>]> {
        let s = Scheduler::new(Default::default(), 5, 1);
        waiting
            .iter()
            .map(|&waiting| {
                Arc::new(Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: "default/pod".into(),
                    labels: Default::default(),
                    stats: EngineStats {
                        waiting,
                        ..EngineStats::default()
                    },
                    recent: RecentPicks::default(),
                    rendezvous: 0,
                    engine: None,
                })
            })
            .collect()
    }

    #[test]
    fn least_request_keeps_pods_under_the_queue_limit_and_is_timed() {
        let mut candidates = pods(&[9.0, 10.0, 0.0]);
        let mut seen = Vec::new();
        let left = run(
            [FilterKind::LeastRequest],
            10,
            "m",
            &mut candidates,
            &mut seen,
        );
        assert_eq!(left, None);
        let waiting: Vec<f64> = candidates.iter().map(|p| p.stats.waiting).collect();
        assert_eq!(waiting, [9.0, 0.0]);
        assert!(matches!(
            seen[..],
            [Observation::PluginTime {
                plugin: "least-request",
                kind: PluginType::Filter,
                ..
            }]
        ));
    }

    #[test]
    fn a_filter_that_leaves_no_pod_is_named() {
        let mut candidates = pods(&[10.0, 11.0]);
        let mut seen = Vec::new();
        let left = run(
            [FilterKind::LeastRequest],
            10,
            "m",
            &mut candidates,
            &mut seen,
        );
        assert_eq!(left, Some("least-request"));
        assert_eq!(seen.len(), 1, "its time is observed");
    }

    #[test]
    fn the_latency_model_runs_no_filter_for_a_prompt() {
        let active = |c: &SchedulerConfig, r: &RouteRequest<'_>| active(c, r).collect::<Vec<_>>();
        let mut config = SchedulerConfig::default();
        assert_eq!(active(&config, &req("x")), [FilterKind::LeastRequest]);
        config.apply_affinity(Some(AffinityConfig::DEFAULT));
        assert_eq!(active(&config, &req("x")), [] as [FilterKind; 0]);
        let no_prompt = RouteRequest {
            prompt: Err(Unscored::UnknownApi),
            ..req("x")
        };
        assert_eq!(active(&config, &no_prompt), [FilterKind::LeastRequest]);
        config.apply_affinity(Some(AffinityConfig {
            latency_model: false,
            ..AffinityConfig::DEFAULT
        }));
        assert_eq!(active(&config, &req("x")), [FilterKind::LeastRequest]);
    }

    #[test]
    fn lora_affinity_runs_under_the_latency_model_too() {
        let mut config = SchedulerConfig {
            filters: vec![FilterKind::LeastRequest, FilterKind::LoraAffinity],
            ..SchedulerConfig::default()
        };
        let all = [FilterKind::LeastRequest, FilterKind::LoraAffinity];
        assert_eq!(active(&config, &req("x")).collect::<Vec<_>>(), all);
        config.apply_affinity(Some(AffinityConfig::DEFAULT));
        assert_eq!(
            active(&config, &req("x")).collect::<Vec<_>>(),
            [FilterKind::LoraAffinity]
        );
    }

    #[test]
    fn lora_affinity_filters_by_the_request_model_and_is_named_when_none_is_left() {
        // Test pods list no model: lora-affinity keeps none of them.
        let mut candidates = pods(&[0.0, 0.0]);
        let mut seen = Vec::new();
        let left = run(
            [FilterKind::LoraAffinity],
            10,
            "sql-lora",
            &mut candidates,
            &mut seen,
        );
        assert_eq!(left, Some("lora-affinity"));
    }
}
