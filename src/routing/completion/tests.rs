//! The affinity mode's record path, at `route` and `complete`: decision-time records that
//! the next request sees, confirmed, moved or rolled back at completion, never outliving their
//! request; and a config without the mode deciding exactly as Kthena.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::endpoints::EngineStats;
use crate::routing::PendingRoutes;
use crate::testing::{router_from_config, spec};

const PODS: usize = 4;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 19000 + i as u16))
}

/// A router from a config document (scheduler and picker sections) over `PODS` static pods.
fn router_from(yaml: &str) -> Router {
    let pods = (0..PODS)
        .map(|i| spec(&format!("pod-{i}"), addr(i).port(), &[]))
        .collect();
    router_from_config(yaml, pods, &prometheus::Registry::new())
}

/// The shipped scheduler (Kthena's default plugins) with the affinity mode on.
fn affinity_router() -> Router {
    router_from(
        "scheduler:\n  plugins:\n    Filter: {enabled: [least-request]}\n    Score:\n      enabled:\n      - {name: least-request, weight: 1}\n      - {name: gpu-usage, weight: 1}\n      - {name: least-latency, weight: 1}\n      - {name: prefix-cache, weight: 1}\npicker:\n  affinity: {}\n",
    )
}

fn body(prefix: &str, question: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": format!("{prefix} {question}")}))
        .unwrap()
}

fn prefix(seed: usize) -> String {
    (0..300)
        .map(|i| format!("w{} ", (i * 7 + seed * 13) % 97))
        .collect()
}

/// Routes as the ext_proc stream does and returns the ticket.
fn route(router: &Router, body: &[u8]) -> Ticket {
    router
        .route("/v1/completions", Some(body), None)
        .expect("routed")
        .ticket
}

fn primary(route: &Ticket) -> SocketAddr {
    route.primary().spec.address
}

fn ok(served: Served) -> Ending {
    Ending::Completed {
        status: Some(200),
        served,
        cached_tokens: None,
        first_byte: None,
        events: None,
    }
}

fn tentative(router: &Router, outcome: TentativeOutcome) -> u64 {
    router
        .metrics
        .tentative
        .with_label_values(&[outcome.as_str()])
        .get()
}

fn holds(router: &Router) -> usize {
    router.scheduler.tentative().holds()
}

#[test]
fn sixteen_concurrent_requests_of_a_new_prefix_land_on_one_pod() {
    let router = affinity_router();
    let p = prefix(1);
    let tickets: Vec<Ticket> = (0..16)
        .map(|q| route(&router, &body(&p, &format!("question {q}"))))
        .collect();
    let first = primary(&tickets[0]);
    assert!(tickets.iter().all(|t| primary(t) == first));
    assert_eq!(holds(&router), 16);
    for t in tickets {
        router.complete(t, ok(Served::NotReported));
    }
    assert_eq!(tentative(&router, TentativeOutcome::Confirmed), 16);
    assert_eq!(holds(&router), 0);
    assert_eq!(router.scheduler.tentative().blocks(), 0);
}

#[test]
fn kthena_mode_scatters_the_same_burst() {
    // The contrast that makes the test above meaningful: without decision-time records the
    // burst's requests see an empty index and spread.
    let router = router_from("picker: {}\n");
    let p = prefix(1);
    let pods: std::collections::HashSet<SocketAddr> = (0..16)
        .map(|q| primary(&route(&router, &body(&p, &format!("question {q}")))))
        .collect();
    assert!(pods.len() > 1, "{pods:?}");
}

#[test]
fn a_failed_or_cut_request_leaves_nothing_behind() {
    let router = affinity_router();
    for (n, ending) in [
        Ending::Completed {
            status: Some(503),
            served: Served::NotReported,
            cached_tokens: None,
            first_byte: None,
            events: None,
        },
        Ending::Aborted,
        Ending::Completed {
            status: Some(200),
            served: Served::Unknown,
            cached_tokens: None,
            first_byte: None,
            events: None,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let t = route(&router, &body(&prefix(2), "q"));
        assert_eq!(holds(&router), 1);
        router.complete(t, ending);
        assert_eq!(holds(&router), 0);
        assert_eq!(router.scheduler.tentative().blocks(), 0);
        assert_eq!(router.scheduler.prefix_cache().index().entries(), 0);
        assert_eq!(
            tentative(&router, TentativeOutcome::RolledBack),
            n as u64 + 1
        );
    }
}

#[test]
fn a_fallback_moves_the_record_to_the_pod_that_served() {
    let router = affinity_router();
    let t = route(&router, &body(&prefix(3), "q"));
    let picked = primary(&t);
    let other = (0..PODS).map(addr).find(|a| *a != picked).unwrap();
    let served = Served::at(&router, Some(other));
    router.complete(t, ok(served));
    assert_eq!(tentative(&router, TentativeOutcome::Moved), 1);
    let index = router.scheduler.prefix_cache().index();
    let set = router.endpoints.snapshot();
    assert_eq!(
        index.pod_entries(set.by_address(&picked).unwrap().index.slot()),
        0
    );
    assert!(index.pod_entries(set.by_address(&other).unwrap().index.slot()) > 0);
    // The next request with that prefix follows the record.
    let next = route(&router, &body(&prefix(3), "another"));
    assert_eq!(primary(&next), other);
}

#[test]
fn an_expired_route_releases_its_hold() {
    let router = affinity_router();
    let pending = PendingRoutes::new(Duration::ZERO);
    pending.insert(route(&router, &body(&prefix(4), "q")));
    assert_eq!(holds(&router), 1);
    let expired = pending.expire(Instant::now() + Duration::from_millis(1));
    assert_eq!((expired.routes, expired.tentative), (1, 1));
    assert_eq!(holds(&router), 0);
    assert_eq!(router.scheduler.tentative().blocks(), 0);
}

#[test]
fn explain_holds_nothing() {
    let router = affinity_router();
    router
        .explain("/v1/completions", Some(&body(&prefix(5), "q")), None)
        .unwrap();
    assert_eq!(holds(&router), 0);
}

#[test]
fn a_hot_prefix_spreads_to_a_second_pod_under_load_and_returns_to_one() {
    let router = affinity_router();
    let p = prefix(6);
    let first = route(&router, &body(&p, "q0"));
    let home = primary(&first);
    router.complete(first, ok(Served::NotReported));
    // The home pod's engine queues (2 running, 3 waiting, 0.5 s a request): the prefix
    // spills, and the spill pod holds it too.
    let set = router.endpoints.snapshot();
    set.by_address(&home).unwrap().timing.observe_service(0.5);
    set.by_address(&home).unwrap().set_stats(EngineStats {
        running: 2.0,
        waiting: 3.0,
        ..EngineStats::default()
    });
    let spilled = route(&router, &body(&p, "q1"));
    let second = primary(&spilled);
    assert_ne!(second, home);
    router.complete(spilled, ok(Served::NotReported));
    // Load gone: both hold the prefix, and the tie rule sends every request to one of them.
    set.by_address(&home)
        .unwrap()
        .set_stats(EngineStats::default());
    let picks: std::collections::HashSet<SocketAddr> = (2..10)
        .map(|q| {
            let t = route(&router, &body(&p, &format!("q{q}")));
            let a = primary(&t);
            router.complete(t, ok(Served::NotReported));
            a
        })
        .collect();
    assert_eq!(picks.len(), 1, "{picks:?}");
    assert!(picks.contains(&home) || picks.contains(&second));
}

#[derive(Debug, Clone)]
enum Step {
    Route { prefix: usize, question: u8 },
    Complete { ticket: usize, status: u16 },
    Abort { ticket: usize },
    Expire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..3, any::<u8>()).prop_map(|(prefix, question)| Step::Route { prefix, question }),
        2 => (any::<usize>(), prop::sample::select(vec![200u16, 200, 500, 429])).prop_map(|(ticket, status)| Step::Complete { ticket, status }),
        1 => any::<usize>().prop_map(|ticket| Step::Abort { ticket }),
        1 => Just(Step::Expire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the order of routes and endings, holds equal the live tickets, and once every
    /// ticket has ended nothing tentative is left; the index holds only completed prompts.
    #[test]
    fn a_tentative_entry_never_outlives_its_request(steps in prop::collection::vec(step(), 1..40)) {
        let router = affinity_router();
        let pending = PendingRoutes::new(Duration::from_secs(3600));
        let mut live: Vec<String> = Vec::new();
        let mut served_ok = 0;
        for s in steps {
            match s {
                Step::Route { prefix: p, question } => {
                    let key = pending.insert(route(&router, &body(&prefix(p), &question.to_string())));
                    live.push(key);
                }
                Step::Complete { ticket, status } if !live.is_empty() => {
                    let key = live.swap_remove(ticket % live.len());
                    let t = pending.take(&key).unwrap();
                    served_ok += usize::from(status == 200);
                    router.complete(t, Ending::Completed { status: Some(u32::from(status)), served: Served::NotReported, cached_tokens: None, first_byte: None, events: None });
                }
                Step::Abort { ticket } if !live.is_empty() => {
                    let key = live.swap_remove(ticket % live.len());
                    router.complete(pending.take(&key).unwrap(), Ending::Aborted);
                }
                Step::Expire => {
                    let expired = pending.expire(Instant::now() + Duration::from_secs(7200));
                    prop_assert_eq!(expired.tentative, live.len());
                    live.clear();
                }
                _ => {}
            }
            prop_assert_eq!(holds(&router), live.len());
        }
        pending.expire(Instant::now() + Duration::from_secs(7200));
        prop_assert_eq!(holds(&router), 0);
        prop_assert_eq!(router.scheduler.tentative().blocks(), 0);
        if served_ok == 0 {
            prop_assert_eq!(router.scheduler.prefix_cache().index().entries(), 0);
        }
    }

    /// `affinity: {enabled: false}` is the Kthena scheduler: the same decisions, in order.
    #[test]
    fn with_the_mode_off_decisions_are_kthenas(requests in prop::collection::vec((0usize..3, any::<u8>(), any::<bool>()), 1..30)) {
        let kthena = router_from("picker: {seed: 5}\n");
        let off = router_from("picker: {seed: 5, affinity: {enabled: false}}\n");
        for (p, q, complete) in requests {
            let body = body(&prefix(p), &q.to_string());
            let route_both = |r: &Router| r.route("/v1/completions", Some(&body), None).unwrap();
            let (a, b) = (route_both(&kthena), route_both(&off));
            let ranked = |d: &crate::scheduler::Decision<Arc<crate::endpoints::Endpoint>>| d.ranked.iter().map(|e| e.spec.address).collect::<Vec<_>>();
            prop_assert_eq!(ranked(&a.decision), ranked(&b.decision));
            prop_assert_eq!(a.decision.reason, b.decision.reason);
            prop_assert_eq!(&a.decision.plugins, &b.decision.plugins);
            prop_assert!(a.ticket.tentative.is_none() && b.ticket.tentative.is_none());
            if complete {
                for (r, d) in [(&kthena, a), (&off, b)] {
                    r.record(&d.ticket.model, &d.ticket.hashes, d.decision.primary(), RecordOrigin::Local);
                }
            }
        }
    }
}

#[test]
fn long_prompts_are_told_apart_past_8_kib() {
    // Two 12 KiB documents sharing their first 10 KiB: the affinity chain sees the difference.
    let router = affinity_router();
    let head: String = prefix(7).repeat(10)[..10 * 1024].to_string();
    let a = route(&router, &body(&head, &"alpha ".repeat(300)));
    let b_hashes = route(&router, &body(&head, &"omega ".repeat(300))).hashes;
    assert!(a.hashes.len() > 40, "{}", a.hashes.len());
    assert_ne!(a.hashes.last(), b_hashes.last());
    let kthena = router_from("picker: {}\n");
    let ka = route(&kthena, &body(&head, &"alpha ".repeat(300))).hashes;
    let kb = route(&kthena, &body(&head, &"omega ".repeat(300))).hashes;
    assert_eq!(ka, kb, "Kthena's 8 KiB coverage cannot tell them apart");
}

/// Routes to pod 0 only (a subset hint).
fn route_to_first(router: &Router, body: &[u8]) -> Ticket {
    router
        .route("/v1/completions", Some(body), Some(&[addr(0).into()]))
        .expect("routed")
        .ticket
}

fn reported(cached_tokens: u64) -> Ending {
    Ending::Completed {
        status: Some(200),
        served: Served::NotReported,
        cached_tokens: Some(cached_tokens),
        first_byte: None,
        events: None,
    }
}

#[test]
fn an_engine_reporting_far_fewer_cached_tokens_loses_what_it_no_longer_holds() {
    let router = affinity_router();
    let index = router.scheduler.prefix_cache().index();
    let pod = router
        .endpoints
        .snapshot()
        .by_address(&addr(0))
        .unwrap()
        .clone();
    let score = |b: &[u8]| {
        let routed = router
            .explain("/v1/completions", Some(b), Some(&[addr(0).into()]))
            .unwrap();
        routed.decision.predicted_blocks
    };
    let (old, a, new) = (
        body(&prefix(10), "old"),
        body(&prefix(11), "a"),
        body(&prefix(12), "new"),
    );
    for b in [&old, &a, &new] {
        router.complete(route_to_first(&router, b), ok(Served::NotReported));
    }
    assert!(score(&old) > 0 && score(&a) > 0 && score(&new) > 0);
    // The engine confirms what was predicted: nothing changes.
    let t = route_to_first(&router, &a);
    let predicted = t.predicted_blocks as u64 * 256 / 4;
    assert!(predicted > 0);
    let before = index.pod_entries(pod.index.slot());
    router.complete(t, reported(predicted));
    assert_eq!(index.pod_entries(pod.index.slot()), before);
    assert_eq!(router.metrics.estimate_dropped.get(), 0);
    // It reports nothing cached for `old` (its oldest prompt): it lost it, and nothing newer.
    let t = route_to_first(&router, &old);
    router.complete(t, reported(0));
    assert!(router.metrics.estimate_dropped.get() > 0);
    assert!(score(&new) > 0 && score(&a) > 0, "newer prompts are kept");
    assert!(
        score(&old) > 0,
        "and the prompt just served is recorded again"
    );
    // Recency is now old, a, new (a was served again before). The engine reports nothing
    // cached for `a`: `a` and everything older (`new`) leave the list; `old` stays; `a` is
    // recorded again. `new` no longer attracts requests to this pod.
    let t = route_to_first(&router, &a);
    router.complete(t, reported(0));
    assert_eq!(
        score(&new),
        0,
        "an evicted prompt stops attracting requests"
    );
    assert!(score(&old) > 0 && score(&a) > 0);
    assert_eq!(
        router
            .metrics
            .cached_tokens
            .with_label_values(&["reported"])
            .get(),
        predicted
    );
}

/// The latency model's error: a completion whose source saw the first response bytes counts
/// observed minus predicted TTFT; one without (the access log) does not.
#[test]
fn a_first_byte_counts_the_ttft_prediction_error() {
    let router = affinity_router();
    let p = prefix(4);
    let errors = || router.metrics.ttft_prediction_error.get_sample_count();
    let first = route(&router, &body(&p, "q0"));
    assert!(first.prediction.is_some(), "the affinity pick predicts");
    router.complete(first, ok(Served::NotReported));
    assert_eq!(errors(), 0, "no first byte seen: nothing to compare");
    let second = route(&router, &body(&p, "q1"));
    let (prediction, at) = second.prediction.unwrap();
    let seen = at + Duration::from_millis(30);
    router.complete(
        second,
        Ending::Completed {
            status: Some(200),
            served: Served::NotReported,
            cached_tokens: None,
            first_byte: Some(seen),
            events: None,
        },
    );
    assert_eq!(errors(), 1);
    let sum = router.metrics.ttft_prediction_error.get_sample_sum();
    assert!((sum - (0.030 - prediction.ttft())).abs() < 1e-9, "{sum}");
}

/// A route on a pod whose engine view is live, its hold awaiting the engine's store of
/// `tokens` (as a request whose head is known in engine tokens is held).
fn route_awaiting(router: &Router, q: &str, tokens: &[u32]) -> Ticket {
    use crate::engine_view::token_chain;
    let mut ticket = route(router, &body(&prefix(6), q));
    let pod = ticket.primary().clone();
    let view = pod.engine.as_ref().expect("the pod publishes");
    let last = *token_chain(tokens, 16).last().unwrap();
    let live = router.scheduler.load();
    ticket.tentative =
        live.scheduler
            .hold_tentative("m", &ticket.hashes, pod.index.slot(), Some((view, last)));
    ticket
}

/// A hold its engine confirmed is counted once, by the engine family, whether its route then
/// completes or expires; one whose route ended first is a tentative record as before, and
/// counted as ended by the request.
#[test]
fn a_hold_the_engine_confirmed_is_not_counted_again_at_completion() {
    let pods = (0..PODS)
        .map(|i| {
            let mut s = spec(&format!("pod-{i}"), addr(i).port(), &[]);
            s.kv_events = Some(crate::endpoints::KvEventsAddress {
                endpoint: format!("tcp://127.0.0.1:{}", 5557 + i),
                replay: None,
            });
            s
        })
        .collect();
    let router = router_from_config(
        "picker:\n  affinity: {}\n",
        pods,
        &prometheus::Registry::new(),
    );
    let engine = |end: HoldEnd| {
        router
            .metrics
            .engine
            .holds
            .with_label_values(&[end.as_str()])
            .get()
    };
    // Four heads of 4 blocks each; the engine stores the first and the third.
    let heads: Vec<Vec<u32>> = (0..4)
        .map(|h| (h * 1000..h * 1000 + 64).collect())
        .collect();
    let [confirmed, unconfirmed, confirmed_expiring, expiring] =
        [0, 1, 2, 3].map(|h| route_awaiting(&router, &format!("q{h}"), &heads[h]));
    for (t, h) in [(&confirmed, 0), (&confirmed_expiring, 2)] {
        let view = t.primary().engine.as_ref().unwrap();
        let base = 10 * h as u64;
        view.store(None, &[base, base + 1, base + 2, base + 3], &heads[h], 16);
    }
    let stored = |t: &Ticket| t.tentative.as_ref().unwrap().stored_by_engine();
    assert!(stored(&confirmed) && stored(&confirmed_expiring));
    assert!(!stored(&unconfirmed) && !stored(&expiring));
    router.complete(confirmed, ok(Served::NotReported));
    router.complete(unconfirmed, ok(Served::NotReported));
    assert_eq!((engine(HoldEnd::Engine), engine(HoldEnd::Request)), (1, 1));
    assert_eq!(tentative(&router, TentativeOutcome::Confirmed), 1);
    router.pending.insert(confirmed_expiring);
    router.pending.insert(expiring);
    let expired = router.expire_pending(Instant::now() + Duration::from_secs(3600));
    assert_eq!((expired.routes, expired.tentative), (2, 1));
    assert_eq!((engine(HoldEnd::Engine), engine(HoldEnd::Request)), (2, 2));
    assert_eq!(tentative(&router, TentativeOutcome::Expired), 1);
    assert_eq!(
        (holds(&router), router.scheduler.tentative().blocks()),
        (0, 0)
    );
}

/// What an ending lets completion record: only a 2xx with blocks, for the pod Envoy named (else
/// the primary); everything else is the outcome that records nothing.
#[test]
fn only_a_2xx_with_blocks_is_recordable_for_the_pod_that_served() {
    let router = affinity_router();
    let p = "a shared system prompt long enough for a few blocks of hashes, ".repeat(40);
    let ticket = route(&router, &body(&p, "q"));
    let other = router
        .endpoints
        .snapshot()
        .all()
        .iter()
        .find(|e| !Arc::ptr_eq(e, ticket.primary()))
        .unwrap()
        .clone();
    let outcome = |ending| recordable(&ticket, ending).err();
    assert_eq!(outcome(Ending::Aborted), Some(RouteOutcome::Aborted));
    for status in [None, Some(199), Some(300), Some(503)] {
        let failed = Ending::Completed {
            status,
            served: Served::NotReported,
            cached_tokens: None,
            first_byte: None,
            events: None,
        };
        assert_eq!(outcome(failed), Some(RouteOutcome::Failed), "{status:?}");
    }
    assert_eq!(outcome(ok(Served::Unknown)), Some(RouteOutcome::UnknownPod));
    let primary = recordable(&ticket, ok(Served::NotReported)).ok().unwrap();
    assert!(Arc::ptr_eq(&primary.pod, ticket.primary()));
    let moved = recordable(&ticket, ok(Served::Pod(other.clone())))
        .ok()
        .unwrap();
    assert!(Arc::ptr_eq(&moved.pod, &other));
    let unscored = Ticket {
        hashes: vec![],
        ..route(&router, &body(&p, "r"))
    };
    assert_eq!(
        recordable(&unscored, ok(Served::NotReported)).err(),
        Some(RouteOutcome::Unscored)
    );
}

/// A streamed Messages answer is complete at `message_stop`: an `error` event fails it, a body
/// cut before the stop aborts it, whatever the status; a source that did not see the body
/// (the access log) records it as before, and other APIs never read the events.
#[test]
fn a_messages_stream_records_only_at_message_stop() {
    let router = affinity_router();
    let messages = |stream: bool| {
        serde_json::to_vec(
            &serde_json::json!({"model": "m", "max_tokens": 8, "stream": stream,
            "system": prefix(3), "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap()
    };
    let ticket = |stream: bool| {
        router
            .route("/v1/messages", Some(&messages(stream)), None)
            .expect("routed")
            .ticket
    };
    let ending = |events: Option<EventsEnd>| Ending::Completed {
        status: Some(200),
        served: Served::NotReported,
        cached_tokens: None,
        first_byte: None,
        events,
    };
    assert!(ticket(true).event_stream && !ticket(false).event_stream);
    let outcome = |t: Ticket, events| recordable(&t, ending(events)).err();
    assert_eq!(
        outcome(ticket(true), Some(EventsEnd::Error)),
        Some(RouteOutcome::Failed)
    );
    assert_eq!(
        outcome(ticket(true), Some(EventsEnd::Cut)),
        Some(RouteOutcome::Aborted)
    );
    assert_eq!(outcome(ticket(true), Some(EventsEnd::Stopped)), None);
    assert_eq!(outcome(ticket(true), None), None);
    // Not a stream (a JSON body has no events), or another API's stream: never read.
    assert_eq!(outcome(ticket(false), Some(EventsEnd::Cut)), None);
    let chat = route(&router, &body(&prefix(4), "q"));
    assert!(!chat.event_stream);
    assert_eq!(outcome(chat, Some(EventsEnd::Cut)), None);
}

#[test]
fn the_decode_hold_is_confirmed_moved_or_rolled_back() {
    let (held, other) = (PodSlot(1), PodSlot(2));
    assert_eq!(
        decode_hold_outcome(Some(held), held),
        TentativeOutcome::Confirmed
    );
    assert_eq!(
        decode_hold_outcome(Some(other), held),
        TentativeOutcome::Moved
    );
    assert_eq!(
        decode_hold_outcome(None, held),
        TentativeOutcome::RolledBack
    );
}
