//! The scheduler on plain candidates: no endpoint store, no metrics, no YAML.

use std::net::SocketAddr;

use super::*;
use affinity::{RecentPicks, rendezvous_key};
use config::SchedulerConfig;
use test_pod::{Pod, engine_pods, req};

fn setup(scorers: Vec<(ScorerKind, u32)>, pods: usize) -> (Scheduler, Vec<Arc<Pod>>) {
    setup_with(
        SchedulerConfig {
            scorers,
            ..SchedulerConfig::default()
        },
        pods,
        EngineStats::default(),
    )
}

fn setup_with(
    config: SchedulerConfig,
    pods: usize,
    stats: EngineStats,
) -> (Scheduler, Vec<Arc<Pod>>) {
    let s = Scheduler::new(config, 5, 1);
    let pods = (0..pods)
        .map(|i| {
            let address = SocketAddr::from(([10, 0, 0, i as u8 + 1], 8000));
            Arc::new(Pod {
                handle: s.prefix_cache().index().add_pod(),
                label: format!("default/pod-{i}"),
                labels: Default::default(),
                stats,
                recent: RecentPicks::default(),
                rendezvous: rendezvous_key(&address),
                engine: None,
            })
        })
        .collect();
    (s, pods)
}

fn match_ratios<C>(d: &Decision<C>) -> Vec<f64> {
    d.observations
        .iter()
        .filter_map(|o| match o {
            Observation::MatchRatio(r) => Some(*r),
            _ => None,
        })
        .collect()
}

#[test]
fn repeated_prompt_goes_to_the_recorded_pod() {
    let (s, pods) = setup(SchedulerConfig::default().scorers, 4);
    let prompt = "system prompt ".repeat(50);
    let first = s.schedule(req(&prompt), pods.clone()).unwrap();
    assert_eq!(first.reason, DecisionReason::PrefixMiss);
    assert_eq!(first.ranked.len(), 4);
    assert_eq!(match_ratios(&first), [0.0]);
    let served = first.primary().clone();
    let outcome = s.record("m", &first.hashes, &served.handle);
    assert_eq!(outcome.inserted, first.hashes.len());
    let second = s.schedule(req(&prompt), pods.clone()).unwrap();
    assert_eq!(second.reason, DecisionReason::PrefixHit);
    assert_eq!(second.primary().label, served.label);
    assert_eq!(match_ratios(&second), [1.0]);
    let prefix = second
        .plugins
        .iter()
        .find(|p| p.plugin == "prefix-cache")
        .unwrap();
    let scores = prefix.scores.as_ref().unwrap();
    assert_eq!(scores.iter().filter(|&&x| x == 100).count(), 1);
}

#[test]
fn every_plugin_is_timed_in_order() {
    let (s, pods) = setup(SchedulerConfig::default().scorers, 2);
    let d = s.schedule(req("x"), pods).unwrap();
    let timed: Vec<_> = d
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::PluginTime { plugin, kind, .. } => Some((*plugin, kind.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        timed,
        [
            ("least-request", "filter"),
            ("least-request", "score"),
            ("gpu-usage", "score"),
            ("least-latency", "score"),
            ("prefix-cache", "score"),
        ]
    );
}

#[test]
fn no_prompt_is_unscored_not_rejected() {
    let (s, pods) = setup(SchedulerConfig::default().scorers, 2);
    let d = s
        .schedule(
            RouteRequest {
                model: "m",
                prompt: Err(Unscored::NoPrompt(crate::prompt::NoPrompt::PromptNotString)),
                salt: None,
                session_pod: None,
                hashes: None,
                engine_tokens: None,
                kv_blocks: None,
                headers: &[],
            },
            pods.clone(),
        )
        .unwrap();
    assert_eq!(d.reason, DecisionReason::Unscored);
    assert_eq!(d.unscored.map(Unscored::as_str), Some("prompt_not_string"));
    assert!(match_ratios(&d).is_empty());
    let d = s.schedule(req(""), pods).unwrap();
    assert_eq!(d.unscored.map(Unscored::as_str), Some("empty_prompt"));
    assert!(
        match_ratios(&d).is_empty(),
        "an empty prompt is not observed"
    );
    assert!(
        d.plugins
            .iter()
            .any(|p| p.plugin == "prefix-cache" && p.scores.is_none())
    );
}

#[test]
fn ties_are_broken_randomly_but_reproducibly() {
    let (s, pods) = setup(vec![(ScorerKind::LeastRequest, 1)], 5);
    let primaries: std::collections::HashSet<String> = (0..40)
        .map(|_| {
            s.schedule(req("x"), pods.clone())
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
fn explain_is_the_next_decision_and_changes_nothing() {
    let (s, pods) = setup(vec![(ScorerKind::LeastRequest, 1)], 5);
    let ranked = |d: Decision<Arc<Pod>>| -> Vec<String> {
        d.ranked.iter().map(|p| p.label.clone()).collect()
    };
    for _ in 0..10 {
        let explained = ranked(s.explain(req("x"), pods.clone()).unwrap());
        assert_eq!(
            ranked(s.explain(req("x"), pods.clone()).unwrap()),
            explained
        );
        assert_eq!(
            ranked(s.schedule(req("x"), pods.clone()).unwrap()),
            explained
        );
    }
}

#[test]
fn explain_counts_no_affinity_pick() {
    let mut config = SchedulerConfig::default();
    config.apply_affinity(Some(AffinityConfig::default()));
    let (s, pods) = setup_with(config, 3, EngineStats::default());
    let prompt = "p".repeat(1000);
    let d = s.explain(req(&prompt), pods.clone()).unwrap();
    assert_eq!(d.reason, DecisionReason::AffinityMiss);
    assert!(pods.iter().all(|p| p.recent.share(1, 0.5) == 0.0));
    assert_eq!(s.tentative().holds(), 0);
    let d = s.schedule(req(&prompt), pods.clone()).unwrap();
    let hold = s.commit("m", &d).expect("tentative is on");
    assert_eq!(hold.pod(), d.primary().slot());
    assert_eq!(s.tentative().holds(), 1);
    assert!(
        d.primary().recent.share(1, 0.5) > 0.0,
        "the pick is counted"
    );
    // With the prompt's tokens it did not hold (all of them: nothing was recorded).
    let uncached = d.primary_prediction().unwrap().uncached_tokens;
    assert!(uncached > 0.0);
    assert!(d.primary().recent.share_written_ln(1, 0.5f64.ln()).1 > 0.0);
    drop(hold);
    assert_eq!(s.tentative().holds(), 0);
}

#[test]
fn all_filtered_is_an_error_with_the_filter_times() {
    let backed_up = EngineStats {
        waiting: 10.0,
        ..Default::default()
    };
    let (s, pods) = setup_with(SchedulerConfig::default(), 3, backed_up);
    let err = s.schedule(req("x"), pods).unwrap_err();
    assert_eq!(err.filter, "least-request");
    assert!(matches!(
        err.observations[..],
        [Observation::PluginTime {
            plugin: "least-request",
            kind: PluginType::Filter,
            ..
        }]
    ));
    assert_eq!(PickError::from(err), PickError::Filtered("least-request"));
}

/// Kthena's scheduler with session affinity: the session's pod leads while the filters keep it,
/// whatever the scores; a filtered-out session pod leaves the decision as Kthena's.
#[test]
fn a_session_pod_leads_while_the_filters_keep_it() {
    let (s, pods) = setup(SchedulerConfig::default().scorers, 3);
    let prompt = "system prompt ".repeat(50);
    let first = s.schedule(req(&prompt), pods.clone()).unwrap();
    s.record("m", &first.hashes, &first.primary().handle);
    let holder = first.primary().slot();
    let o = pods.iter().position(|p| p.slot() != holder).unwrap();
    let other = pods[o].clone();
    let mut request = req(&prompt);
    request.session_pod = Some(other.slot());
    let d = s.schedule(request, pods.clone()).unwrap();
    assert_eq!(d.reason, DecisionReason::Session);
    assert_eq!(d.primary().slot(), other.slot());
    assert_eq!(d.ranked[1].slot(), holder, "the fallbacks keep their order");
    assert_eq!(d.ranked.len(), 3);
    // The least-request filter removes the session's pod when its engine queues too much:
    // the decision is Kthena's.
    let mut pods = pods;
    let busy = SchedulerConfig::default().max_waiting_requests as f64;
    pods[o] = Arc::new(Pod {
        handle: other.handle.clone(),
        label: other.label.clone(),
        labels: Default::default(),
        stats: EngineStats {
            waiting: busy,
            ..EngineStats::default()
        },
        recent: RecentPicks::default(),
        rendezvous: other.rendezvous,
        engine: None,
    });
    let mut request = req(&prompt);
    request.session_pod = Some(other.slot());
    let d = s.schedule(request, pods.clone()).unwrap();
    assert_eq!(d.reason, DecisionReason::PrefixHit);
    assert_eq!(d.primary().slot(), holder);
    assert!(d.candidates.iter().all(|c| c.slot() != other.slot()));
}

#[test]
fn at_most_five_are_ranked() {
    let (s, pods) = setup(vec![(ScorerKind::LeastRequest, 1)], 7);
    let d = s.schedule(req("x"), pods).unwrap();
    assert_eq!(d.ranked.len(), 5);
    assert_eq!(d.candidates.len(), 7);
}

/// Cache salts and LoRA adapters: prompts the engine will not share never score against each
/// other (issue 27, point 4).
mod namespaces {
    use super::*;
    use crate::hashing::CacheSalt;
    use crate::request::InferenceRequest;

    fn salted<'a>(
        model: &'a str,
        prompt: &'a str,
        salt: Option<&'a CacheSalt>,
    ) -> RouteRequest<'a> {
        RouteRequest {
            model,
            prompt: Ok(prompt),
            salt,
            session_pod: None,
            hashes: None,
            engine_tokens: None,
            kv_blocks: None,
            headers: &[],
        }
    }

    fn prefix_scores<C>(d: &Decision<C>) -> Vec<u32> {
        d.plugins
            .iter()
            .find(|p| p.plugin == "prefix-cache")
            .and_then(|p| p.scores.clone())
            .unwrap()
    }

    fn kthena() -> (Scheduler, Vec<Arc<Pod>>) {
        setup(SchedulerConfig::default().scorers, 4)
    }

    fn affinity() -> (Scheduler, Vec<Arc<Pod>>) {
        let mut config = SchedulerConfig::default();
        config.apply_affinity(Some(AffinityConfig::default()));
        setup_with(config, 4, EngineStats::default())
    }

    #[test]
    fn salts_never_score_against_each_other_in_kthena_mode() {
        let (s, pods) = kthena();
        let (a, b) = (CacheSalt::new("tenant-a"), CacheSalt::new("tenant-b"));
        let prompt = "You are a helpful assistant. ".repeat(20);
        let first = s
            .schedule(salted("m", &prompt, a.as_ref()), pods.clone())
            .unwrap();
        let holder = first.primary().clone();
        let recorded = s.record("m", &first.hashes, &holder.handle);
        assert_eq!(recorded.inserted, first.hashes.len());
        // The same salt hits the pod that served it.
        let again = s
            .schedule(salted("m", &prompt, a.as_ref()), pods.clone())
            .unwrap();
        assert_eq!(again.reason, DecisionReason::PrefixHit);
        assert_eq!(again.primary().label, holder.label);
        assert_eq!(match_ratios(&again), [1.0]);
        // Another salt, and no salt, match nothing: explicit zeros, a miss.
        for other in [b.as_ref(), None] {
            let d = s
                .schedule(salted("m", &prompt, other), pods.clone())
                .unwrap();
            assert_eq!(d.reason, DecisionReason::PrefixMiss, "{other:?}");
            assert_eq!(prefix_scores(&d), [0, 0, 0, 0]);
            assert_eq!(match_ratios(&d), [0.0]);
            assert!(d.hashes.iter().all(|h| !first.hashes.contains(h)));
        }
        // One pod holding the prompt under two salts keeps both (one model key, distinct
        // hashes): neither replaces the other.
        let d = s
            .schedule(salted("m", &prompt, b.as_ref()), pods.clone())
            .unwrap();
        let both = s.record("m", &d.hashes, &holder.handle);
        assert_eq!(both.inserted, d.hashes.len());
        assert_eq!(
            s.prefix_cache().index().entries(),
            first.hashes.len() + d.hashes.len()
        );
    }

    /// The affinity mode's tentative holds are keyed by model and salted hashes: a burst of one
    /// tenant does not pull another tenant's identical prompt.
    #[test]
    fn salts_never_share_a_hold_or_a_record_in_affinity_mode() {
        let (s, pods) = affinity();
        let (a, b) = (CacheSalt::new("tenant-a"), CacheSalt::new("tenant-b"));
        let prompt = "agent tool preamble ".repeat(200);
        let d = s
            .schedule(salted("m", &prompt, a.as_ref()), pods.clone())
            .unwrap();
        let hold = s.commit("m", &d).expect("tentative is on");
        let same = s
            .explain(salted("m", &prompt, a.as_ref()), pods.clone())
            .unwrap();
        assert_eq!(same.reason, DecisionReason::AffinityHit, "the hold counts");
        for other in [b.as_ref(), None] {
            let e = s
                .explain(salted("m", &prompt, other), pods.clone())
                .unwrap();
            assert_eq!(e.reason, DecisionReason::AffinityMiss, "{other:?}");
            assert_eq!(prefix_scores(&e), [0, 0, 0, 0]);
        }
        s.record("m", &d.hashes, &d.primary().handle);
        drop(hold);
        for other in [b.as_ref(), None] {
            let e = s
                .explain(salted("m", &prompt, other), pods.clone())
                .unwrap();
            assert_eq!(e.reason, DecisionReason::AffinityMiss, "{other:?}");
            assert_eq!(e.predicted_blocks, 0);
        }
        let e = s.explain(salted("m", &prompt, a.as_ref()), pods).unwrap();
        assert_eq!(e.reason, DecisionReason::AffinityHit);
        assert_eq!(e.primary().label, d.primary().label);
    }

    /// A LoRA adapter is requested by its own `model` name, which seeds the chain and keys the
    /// index: the adapter and its base model never share entries, either way round.
    #[test]
    fn an_adapter_and_its_base_model_never_share_entries() {
        for (s, pods) in [kthena(), affinity()] {
            let prompt = "shared system prompt ".repeat(30);
            for (served, asked) in [("llama-3", "llama-3-sql-lora"), ("sql-lora", "base")] {
                let d = s
                    .schedule(salted(served, &prompt, None), pods.clone())
                    .unwrap();
                s.record(served, &d.hashes, &d.primary().handle);
                let hit = s
                    .explain(salted(served, &prompt, None), pods.clone())
                    .unwrap();
                assert!(matches!(
                    hit.reason,
                    DecisionReason::PrefixHit | DecisionReason::AffinityHit
                ));
                let other = s
                    .explain(salted(asked, &prompt, None), pods.clone())
                    .unwrap();
                assert!(
                    matches!(
                        other.reason,
                        DecisionReason::PrefixMiss | DecisionReason::AffinityMiss
                    ),
                    "{asked} after {served}: {:?}",
                    other.reason
                );
                assert_eq!(prefix_scores(&other), [0, 0, 0, 0]);
            }
        }
    }

    /// Through the request path: bodies parsed by the request module, the salt carried into
    /// the route request, for chat and completions alike.
    #[test]
    fn salted_bodies_through_the_request_path() {
        let (s, pods) = kthena();
        let body = |salt: &str, chat: bool| {
            let salt = if salt.is_empty() {
                String::new()
            } else {
                format!(r#","cache_salt":"{salt}""#)
            };
            let text = "Summarise the quarterly report. ".repeat(10);
            if chat {
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]{salt}}}"#
                )
            } else {
                format!(r#"{{"model":"m","prompt":"{text}"{salt}}}"#)
            }
        };
        for chat in [false, true] {
            let route = |body: &str| {
                let parsed = InferenceRequest::parse(body.as_bytes()).unwrap();
                let request = RouteRequest {
                    model: &parsed.model,
                    prompt: parsed.prompt.as_deref().map_err(|&r| Unscored::NoPrompt(r)),
                    salt: parsed.salt.as_ref(),
                    session_pod: None,
                    hashes: None,
                    engine_tokens: None,
                    kv_blocks: None,
                    headers: &[],
                };
                s.schedule(request, pods.clone()).unwrap()
            };
            let tenant = format!("tenant-{chat}");
            let first = route(&body(&tenant, chat));
            s.record("m", &first.hashes, &first.primary().handle);
            let same = route(&body(&tenant, chat));
            assert_eq!(same.reason, DecisionReason::PrefixHit, "chat {chat}");
            assert_eq!(same.primary().label, first.primary().label);
            for other in ["other-tenant", ""] {
                let d = route(&body(other, chat));
                assert_eq!(
                    d.reason,
                    DecisionReason::PrefixMiss,
                    "chat {chat} {other:?}"
                );
                assert_eq!(prefix_scores(&d), [0, 0, 0, 0]);
            }
        }
    }
}

/// The affinity mode places new prompts on the pod whose index evicts least: with two pods
/// churning through their budgets and a third full but quiet, every new prompt goes to the third
/// (without `placeByChurn`, the rendezvous rule spreads them).
#[test]
fn new_prompts_go_where_the_index_evicts_least() {
    for place_by_churn in [true, false] {
        let mut config = SchedulerConfig::default();
        config.prefix_cache.max_hash_cache_size = 16;
        config.apply_affinity(Some(AffinityConfig {
            place_by_churn,
            ..AffinityConfig::default()
        }));
        let (s, pods) = setup_with(config, 3, EngineStats::default());
        let text = |i: usize| format!("{i:04} ").repeat(400);
        let hashes = |prompt: &str| s.explain(req(prompt), pods.clone()).unwrap().hashes;
        // Pod 2: one prompt that fills its list. Pods 0 and 1: four each, evicting.
        s.record("m", &hashes(&text(0)), &pods[2].handle);
        for i in 1..=8 {
            s.record("m", &hashes(&text(i)), &pods[i % 2].handle);
        }
        let index = s.prefix_cache().index();
        assert_eq!(index.churn(&pods[2].handle), 0.0);
        assert!(index.churn(&pods[0].handle) > 0.5);
        let picked: std::collections::HashSet<String> = (100..120)
            .map(|i| {
                let d = s.explain(req(&text(i)), pods.clone()).unwrap();
                assert_eq!(d.reason, DecisionReason::AffinityMiss);
                d.primary().label.clone()
            })
            .collect();
        if place_by_churn {
            assert_eq!(picked, ["default/pod-2".to_string()].into());
        } else {
            assert!(picked.len() > 1, "{picked:?}");
        }
    }
}

/// Pods whose engine publishes KV events are matched by what the engine holds, in its tokens:
/// the estimate's pick (the pod the prompt was sent to) loses to the pod whose engine reports
/// holding it, and a pod whose view is not live keeps the estimate.
#[test]
fn a_live_engine_view_outranks_the_estimate() {
    let mut config = SchedulerConfig::default();
    config.apply_affinity(Some(AffinityConfig::default()));
    let s = Scheduler::new(config, 5, 1);
    let pods = engine_pods(&s, 3, |i| i != 2);
    let prompt = "You are a helpful assistant. ".repeat(40);
    let tokens: Vec<u32> = (0..256).collect();
    let tokens: &'static [u32] = tokens.leak();
    // The estimate: pod 0 was sent the prompt. The engines: pod 1 holds all of it.
    let first = s.schedule(req(&prompt), pods.clone()).unwrap();
    s.record("m", &first.hashes, &pods[0].handle);
    let engine_hashes: Vec<u64> = (1..=16).collect();
    pods[1]
        .engine
        .as_ref()
        .unwrap()
        .store(None, &engine_hashes, tokens, 16);
    let with_tokens = |tokens: &'static [u32], bytes: usize| {
        let mut r = req(&prompt);
        r.engine_tokens = Some(EngineTokens::message_head(tokens, bytes));
        r
    };
    let d = s
        .schedule(with_tokens(tokens, prompt.len()), pods.clone())
        .unwrap();
    assert_eq!(
        d.primary().slot(),
        pods[1].slot(),
        "{:?} {:?}",
        d.engine,
        d.reason
    );
    assert_eq!(d.reason, DecisionReason::AffinityHit);
    assert_eq!(d.primary_source(), MatchSource::Engine);
    assert_eq!(d.engine[1].map(|m| m.tokens), Some(256));
    assert_eq!(
        d.engine[0].map(|m| m.tokens),
        Some(0),
        "its engine holds nothing"
    );
    assert_eq!(d.engine[2], None, "not live: the estimate");
    assert_eq!(d.match_source(2), MatchSource::Estimate);
    // Without engine tokens for the request, every pod is matched by the estimate.
    let d = s.schedule(req(&prompt), pods.clone()).unwrap();
    assert_eq!(d.primary().slot(), pods[0].slot());
    assert!(d.engine.is_empty());
    // A head known in tokens (half the prompt) matches in proportion: half the blocks.
    let d = s
        .schedule(with_tokens(&tokens[..128], prompt.len() / 2), pods.clone())
        .unwrap();
    assert_eq!(d.primary().slot(), pods[1].slot());
    let blocks = d.hashes.len();
    let half = d.engine[1].unwrap().blocks;
    assert!(half.abs_diff(blocks / 2) <= 1, "{half} of {blocks}");
}

/// Engine truth never knows less than the estimate: a pod whose engine holds every full block
/// of the head known in tokens keeps the estimate's longer match past it (a document inside
/// the last message, which no head covers), shown as `engine+estimate`; a pod whose engine
/// lacks a block of the head is matched by its engine alone, whatever the estimate says.
#[test]
fn past_a_head_the_engine_holds_whole_the_estimate_extends_the_match() {
    let mut config = SchedulerConfig::default();
    config.apply_affinity(Some(AffinityConfig::default()));
    let s = Scheduler::new(config, 5, 1);
    let pods = engine_pods(&s, 3, |_| true);
    // The head: an instruction block every engine holds; past it, a document sent to pod 1
    // alone (the estimate), inside the same message.
    let instruction = "Answer from the document below. ".repeat(16);
    let prompt = format!("{instruction}{}", "A long document line. ".repeat(60));
    let tokens: Vec<u32> = (0..128).collect();
    let tokens: &'static [u32] = tokens.leak();
    let engine_hashes: Vec<u64> = (1..=8).collect();
    for p in &pods[..2] {
        p.engine
            .as_ref()
            .unwrap()
            .store(None, &engine_hashes, tokens, 16);
    }
    // Pod 2's engine holds only the first half of the head.
    pods[2]
        .engine
        .as_ref()
        .unwrap()
        .store(None, &engine_hashes[..4], tokens, 16);
    let first = s.schedule(req(&prompt), pods.clone()).unwrap();
    s.record("m", &first.hashes, &pods[1].handle);
    s.record("m", &first.hashes, &pods[2].handle);
    let mut r = req(&prompt);
    r.engine_tokens = Some(EngineTokens::message_head(tokens, instruction.len()));
    let d = s.schedule(r, pods.clone()).unwrap();
    let all = d.hashes.len();
    let head = d.engine[0].unwrap().blocks;
    assert!(head > 0 && head < all, "{head} of {all}");
    assert_eq!(d.primary().slot(), pods[1].slot(), "{:?}", d.engine);
    assert_eq!(d.reason, DecisionReason::AffinityHit);
    assert_eq!(d.match_source(1), MatchSource::Mixed);
    assert_eq!(d.engine[1].unwrap().estimate_beyond, all - head);
    assert_eq!(d.engine[1].unwrap().tokens, 128);
    // Pod 0: the head, nothing past it: its engine's match.
    assert_eq!(d.match_source(0), MatchSource::Engine);
    // Pod 2: the estimate says all of it; its engine lacks half the head.
    assert_eq!(d.match_source(2), MatchSource::Engine);
    assert_eq!(d.engine[2].unwrap().tokens, 64);
    // A head shorter than the prompt: no hold awaits the engine (the store of the head would
    // end the hold's claim on the document, which the view cannot see).
    assert_eq!(d.primary_last_block(), None);
}
