//! Flow control at the router: when requests queue, the order they leave in (fairness, bands),
//! and every way one leaves unserved (TTL, bounds, displacement, a client gone), counted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;
use crate::routing::Ending;
use crate::testing::{inflight, router_from_config, three};

/// A router over three pods that each take one request at a time (`maxInFlightPerPod: 1`).
fn one_slot_router(extra: &str) -> Router {
    let yaml = format!(
        "picker:\n  affinity: {{}}\n  flowControl: {{enabled: true, maxInFlightPerPod: 1, {extra}}}\n"
    );
    router_from_config(&yaml, three(), &prometheus::Registry::new())
}

fn body(prompt: &str) -> Vec<u8> {
    format!(r#"{{"model": "m", "prompt": "{prompt}"}}"#).into_bytes()
}

/// Routes through the gate with a fairness id and an objective.
fn admit(router: &Router, prompt: &str, flow: Option<&str>, objective: Option<&str>) -> Admitted {
    let b = body(prompt);
    router
        .route_flow(FlowRequest {
            path: "/v1/completions",
            body: Some(&b),
            flow,
            objective,
            ..FlowRequest::default()
        })
        .expect("admitted")
}

fn routed(a: Admitted) -> Routed {
    match a {
        Admitted::Routed(r) => r,
        Admitted::Held(_) => panic!("held"),
    }
}

fn held(a: Admitted) -> Hold {
    match a {
        Admitted::Held(h) => h,
        Admitted::Routed(r) => panic!("routed to {}", r.decision.primary().label),
    }
}

/// Fills the three pods: their tickets.
fn fill(router: &Router) -> Vec<Routed> {
    (0..3)
        .map(|i| routed(admit(router, &format!("filler {i}"), None, None)))
        .collect()
}

fn drops(router: &Router, reason: DropReason) -> u64 {
    router
        .metrics
        .flow
        .drops
        .with_label_values(&[reason.as_str()])
        .get()
}

/// Ends a routed request as a 2xx would, freeing its slot.
fn complete(router: &Router, r: Routed) {
    router.complete(
        r.ticket,
        Ending::Completed {
            status: Some(200),
            served: crate::routing::Served::NotReported,
            cached_tokens: None,
            first_byte: None,
            events: None,
        },
    );
}

/// What a hold was released with, if it was (without waiting).
fn try_released(h: &mut Hold) -> Option<Released> {
    futures_util::FutureExt::now_or_never(h.wait())
}

#[tokio::test]
async fn nothing_queues_while_a_pod_has_room_and_a_freed_slot_dispatches_the_head() {
    let router = one_slot_router("");
    let mut tickets = fill(&router);
    assert_eq!(router.flow.queued(), 0, "room on every pod: nothing queued");
    assert_eq!(inflight(&router), [1, 1, 1]);
    let mut h = held(admit(&router, "waits", None, None));
    assert_eq!(router.flow.queued(), 1);
    assert_eq!(router.flow.depths(), [(0, 1)]);
    // Nothing frees: a dispatch round sends nothing.
    router.dispatch(Instant::now(), false);
    assert!(try_released(&mut h).is_none());
    // A completion frees pod 1's slot: the queued request goes there, picked then.
    let freed = tickets.remove(1);
    let pod = freed.decision.primary().spec.address;
    complete(&router, freed);
    tokio::time::sleep(Duration::from_millis(5)).await;
    router.dispatch(Instant::now(), false);
    let Some(Released::Routed(r)) = try_released(&mut h) else {
        panic!("dispatched");
    };
    assert_eq!(r.decision.primary().spec.address, pod);
    assert!(r.queued >= Duration::from_millis(5), "{:?}", r.queued);
    assert_eq!(router.flow.queued(), 0);
    let m = &router.metrics.flow;
    assert_eq!(m.dispatches.with_label_values(&["room"]).get(), 1);
    assert_eq!(m.wait.get_sample_count(), 1);
    assert!(m.served_tokens.with_label_values(&["default"]).get() > 0);
    // While one waits, a newcomer queues behind it even if a slot frees first (arrival order).
    let _h2 = held(admit(&router, "second", None, None));
    complete(&router, tickets.remove(0));
    let h3 = admit(&router, "third", None, None);
    assert!(matches!(h3, Admitted::Held(_)), "behind the queued one");
    drop(r);
}

#[tokio::test]
async fn a_flood_of_one_tenant_does_not_starve_another() {
    let router = one_slot_router("");
    let mut tickets = fill(&router);
    // Heavy: 6 long prompts queued first (no shared prefix: the pick goes by load); light: 2
    // short ones after.
    let long = "x".repeat(4000);
    let mut heavy: Vec<Hold> = (0..6)
        .map(|i| held(admit(&router, &format!("{i} {long}"), Some("heavy"), None)))
        .collect();
    let mut light: Vec<Hold> = (0..2)
        .map(|i| held(admit(&router, &format!("short {i}"), Some("light"), None)))
        .collect();
    // Free one slot at a time; record who goes.
    let mut order = Vec::new();
    for _ in 0..8 {
        complete(&router, tickets.remove(0));
        router.dispatch(Instant::now(), false);
        let mut went = None;
        for (name, holds) in [("heavy", &mut heavy), ("light", &mut light)] {
            for (i, h) in holds.iter_mut().enumerate() {
                if let Some(Released::Routed(r)) = try_released(h) {
                    went = Some((name, i));
                    tickets.push(r);
                }
            }
        }
        order.push(went.expect("one dispatched per freed slot"));
    }
    // The first heavy request had no competitor; then light's two go before heavy's second,
    // each flow in its own arrival order.
    assert_eq!(order[0], ("heavy", 0));
    assert_eq!(&order[1..3], [("light", 0), ("light", 1)]);
    let heavy_order: Vec<usize> = order
        .iter()
        .filter(|(n, _)| *n == "heavy")
        .map(|(_, i)| *i)
        .collect();
    assert_eq!(heavy_order, [0, 1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn a_freed_slot_releases_one_request_a_round_and_room_only_picks_among_the_free_pods() {
    // Every request shares one long prefix, held by the pod that served the first: the
    // affinity pick prefers it even full (it knows no concurrency here), so a freed slot
    // elsewhere releases one request per round, not the whole queue.
    let long = "a shared document ".repeat(200);
    for room_only in [false, true] {
        let router = one_slot_router(&format!("roomOnly: {room_only}"));
        let mut tickets = fill(&router);
        let mut holds: Vec<Hold> = (0..3)
            .map(|i| held(admit(&router, &format!("{long} {i}"), None, None)))
            .collect();
        complete(&router, tickets.remove(0));
        router.dispatch(Instant::now(), false);
        let released: Vec<Routed> = holds
            .iter_mut()
            .filter_map(|h| match try_released(h) {
                Some(Released::Routed(r)) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(released.len(), 1, "roomOnly {room_only}");
        assert_eq!(router.flow.queued(), 2);
        if room_only {
            // Picked among the pods with room: the freed one, alone.
            assert_eq!(released[0].decision.ranked.len(), 1);
        }
    }
}

#[tokio::test]
async fn a_request_whose_prompt_one_pod_holds_waits_for_that_pod_not_the_first_free_one() {
    // A tenant's long prompt served once by pod k; every pod then full. The tenant's next
    // request is picked at once for k (k's in-flight count taken: the next picks see the
    // backlog), held for k: a slot freed elsewhere goes to a request without a cached prefix,
    // and k's own freed slot to the held one.
    let router = one_slot_router("");
    let tenant = "a tenant's long system prompt ".repeat(100);
    let first = routed(admit(&router, &format!("{tenant} first"), None, None));
    let k = first.decision.primary().spec.address;
    complete(&router, first);
    let mut tickets = fill(&router);
    let mut tenant_hold = held(admit(&router, &format!("{tenant} second"), Some("t"), None));
    let pods: Vec<_> = tickets
        .iter()
        .map(|t| t.decision.primary().spec.address)
        .collect();
    let at_k = pods.iter().position(|p| *p == k).expect("a filler on k");
    let mut counts = inflight(&router);
    counts.sort_unstable();
    assert_eq!(counts, [1, 1, 2], "the held request counted on k at once");
    let mut other_hold = held(admit(&router, "no shared prefix", Some("o"), None));
    // A slot frees on another pod: the request held for k stays; the other goes there.
    let elsewhere = tickets.remove(if at_k == 0 { 1 } else { 0 });
    let freed = elsewhere.decision.primary().spec.address;
    complete(&router, elsewhere);
    router.dispatch(Instant::now(), false);
    assert!(try_released(&mut tenant_hold).is_none(), "held for k");
    let Some(Released::Routed(o)) = try_released(&mut other_hold) else {
        panic!("the request without a cached prefix takes the free pod");
    };
    assert_eq!(o.decision.primary().spec.address, freed);
    // k's slot frees: the held request goes there, with the pick it queued with.
    let at_k = tickets
        .iter()
        .position(|t| t.decision.primary().spec.address == k)
        .unwrap();
    complete(&router, tickets.remove(at_k));
    router.dispatch(Instant::now(), false);
    let Some(Released::Routed(t)) = try_released(&mut tenant_hold) else {
        panic!("released to k");
    };
    assert_eq!(t.decision.primary().spec.address, k);
    assert_eq!(router.flow.queued(), 0);
}

#[tokio::test]
async fn higher_priority_objectives_dispatch_first() {
    let router = one_slot_router("priorities: {interactive: 10, batch: -1}");
    let mut tickets = fill(&router);
    let mut batch = held(admit(&router, "batch", None, Some("batch")));
    let mut normal = held(admit(&router, "normal", None, None));
    let mut urgent = held(admit(&router, "urgent", None, Some("interactive")));
    assert_eq!(router.flow.depths(), [(10, 1), (0, 1), (-1, 1)]);
    let mut order = Vec::new();
    for _ in 0..3 {
        complete(&router, tickets.remove(0));
        router.dispatch(Instant::now(), false);
        for (name, h) in [
            ("batch", &mut batch),
            ("normal", &mut normal),
            ("urgent", &mut urgent),
        ] {
            if let Some(Released::Routed(r)) = try_released(h) {
                order.push(name);
                tickets.push(r);
            }
        }
    }
    assert_eq!(order, ["urgent", "normal", "batch"]);
    assert_eq!(
        router.metrics.flow.queued.with_label_values(&["10"]).get(),
        0
    );
}

#[tokio::test]
async fn a_request_queued_past_its_ttl_is_refused_with_429_and_a_reason() {
    let router = one_slot_router("requestTtlSeconds: 0.05, retryAfterSeconds: 3");
    let _tickets = fill(&router);
    let mut h = held(admit(&router, "times out", None, None));
    router.dispatch(Instant::now(), false);
    assert!(try_released(&mut h).is_none());
    router.dispatch(Instant::now() + Duration::from_millis(60), false);
    let Some(Released::Refused(f)) = try_released(&mut h) else {
        panic!("refused");
    };
    assert_eq!(f.status, 429);
    assert_eq!(f.retry_after, Some(3));
    assert_eq!(f.dropped_reason, Some("ttl_expired"));
    assert_eq!(router.flow.queued(), 0);
    assert_eq!(drops(&router, DropReason::Ttl), 1);
}

#[tokio::test]
async fn a_client_gone_leaves_the_queue_at_once() {
    let router = one_slot_router("");
    let mut tickets = fill(&router);
    let h = held(admit(&router, "leaves", None, None));
    let mut stays = held(admit(&router, "stays", None, None));
    assert_eq!(router.flow.queued(), 2);
    drop(h);
    assert_eq!(router.flow.queued(), 1, "out at once");
    assert_eq!(drops(&router, DropReason::Cancelled), 1);
    complete(&router, tickets.remove(0));
    router.dispatch(Instant::now(), false);
    let Some(Released::Routed(_kept)) = try_released(&mut stays) else {
        panic!("dispatched");
    };
    // Cancelled after its dispatch: the routed request comes back to be ended.
    let c = held(admit(&router, "late", None, None));
    complete(&router, tickets.remove(0));
    router.dispatch(Instant::now(), false);
    let back = c.cancel();
    assert!(matches!(back, Some(Released::Routed(_))));
    drop(back);
    assert_eq!(
        inflight(&router).iter().sum::<i64>(),
        2,
        "its slot released"
    );
}

#[tokio::test]
async fn past_the_bounds_429_and_negative_priorities_are_displaced_first() {
    let router = one_slot_router("maxRequests: 2, priorities: {batch: -1}");
    let _tickets = fill(&router);
    let mut batch = held(admit(&router, "batch", None, Some("batch")));
    let _a = held(admit(&router, "a", None, None));
    // Full: a normal request displaces the sheddable one.
    let _b = held(admit(&router, "b", None, None));
    let Some(Released::Refused(f)) = try_released(&mut batch) else {
        panic!("displaced");
    };
    assert_eq!((f.status, f.dropped_reason), (429, Some("displaced")));
    // Full of normal requests: refused.
    let refused = router
        .route_flow(FlowRequest {
            path: "/v1/completions",
            body: Some(&body("c")),
            ..FlowRequest::default()
        })
        .unwrap_err();
    assert_eq!(refused.status, 429);
    assert_eq!(refused.dropped_reason, Some("queue_full"));
    assert_eq!(refused.retry_after, Some(1));
    assert_eq!(drops(&router, DropReason::QueueFull), 1);
    assert_eq!(drops(&router, DropReason::Displaced), 1);
    // The byte bound: a body over it alone is refused at once.
    let small = one_slot_router("maxBytes: 64");
    let _t = fill(&small);
    let e = small
        .route_flow(FlowRequest {
            path: "/v1/completions",
            body: Some(&body(&"y".repeat(100))),
            ..FlowRequest::default()
        })
        .unwrap_err();
    assert_eq!(e.dropped_reason, Some("bytes_full"));
}

#[tokio::test]
async fn off_in_kthena_mode_and_explain_says_when_it_would_queue() {
    let kthena = router_from_config(
        "picker: {flowControl: {maxInFlightPerPod: 1}}\n",
        three(),
        &prometheus::Registry::new(),
    );
    for i in 0..5 {
        assert!(matches!(
            admit(&kthena, &format!("k{i}"), None, None),
            Admitted::Routed(_)
        ));
    }
    let router = one_slot_router("");
    let b = body("explained");
    let e = router.explain("/v1/completions", Some(&b), None).unwrap();
    assert!(!e.would_queue);
    let _tickets = fill(&router);
    let e = router.explain("/v1/completions", Some(&b), None).unwrap();
    assert!(e.would_queue);
    assert_eq!(router.flow.queued(), 0, "explain queues nothing");
}

#[tokio::test]
async fn shutdown_sends_every_queued_request_on() {
    let router = std::sync::Arc::new(one_slot_router(""));
    let _tickets = fill(&router);
    let mut h = held(admit(&router, "drained", None, None));
    let token = CancellationToken::new();
    token.cancel();
    run_dispatcher(router.clone(), token).await;
    assert!(matches!(try_released(&mut h), Some(Released::Routed(_))));
    assert_eq!(
        router
            .metrics
            .flow
            .dispatches
            .with_label_values(&["drain"])
            .get(),
        1
    );
    // Draining: nothing queues any more.
    assert!(matches!(
        admit(&router, "after", None, None),
        Admitted::Routed(_)
    ));
}

/// A router over three pods in Kthena's mode with `auth.jwksUri` and Kthena's fairness
/// settings (`vars`, as its router's environment) on top of `ENABLE_FAIRNESS_SCHEDULING`.
fn kthena_fairness_router(vars: &[(&str, &str)]) -> Router {
    let mut env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("ENABLE_FAIRNESS_SCHEDULING".into(), "true".into());
    let config = crate::config::Config::parse_with_env(
        "auth: {jwksUri: https://issuer.example/jwks}\n",
        &|name| env.get(name).cloned(),
    )
    .expect("valid config");
    let registry = prometheus::Registry::new();
    let router = Router::assemble(
        config.scheduler,
        config.picker,
        crate::metrics::PrefixCacheMetrics::register(&registry),
        crate::metrics::RouterMetrics::register(&registry),
    );
    router
        .endpoints
        .apply(crate::endpoints::Update::Reset(three()));
    router
}

/// `Authorization: Bearer <JWT>` whose subject is `user` (unsigned: the gateway verifies).
fn bearer(user: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "Bearer {}.{}.sig",
        b64(r#"{"alg":"RS256"}"#),
        b64(&format!(r#"{{"sub":"{user}"}}"#))
    )
}

fn admit_as(router: &Router, prompt: &str, authorization: &str) -> Admitted {
    let b = body(prompt);
    router
        .route_flow(FlowRequest {
            path: "/v1/completions",
            body: Some(&b),
            authorization: Some(authorization),
            ..FlowRequest::default()
        })
        .expect("admitted")
}

#[tokio::test]
async fn kthenas_fairness_bounds_the_model_and_serves_a_light_user_before_a_flooding_one() {
    let router = kthena_fairness_router(&[("FAIRNESS_MAX_CONCURRENT", "2")]);
    let (flood, light) = (bearer("flood"), bearer("light"));
    // FAIRNESS_MAX_CONCURRENT bounds the model, not a pod: two requests in flight, the third
    // queues though a pod is idle.
    let mut tickets: Vec<Routed> = (0..2)
        .map(|i| routed(admit_as(&router, &format!("flood {i}"), &flood)))
        .collect();
    assert_eq!(inflight(&router).iter().sum::<i64>(), 2);
    let mut flooding: Vec<Hold> = (2..5)
        .map(|i| held(admit_as(&router, &format!("flood {i}"), &flood)))
        .collect();
    let mut waiting = held(admit_as(&router, "light 0", &light));
    assert_eq!(router.flow.queued(), 4);
    // One slot frees at a time: the flood's oldest goes first (nobody was charged yet), then
    // the light user, ahead of the flood's older requests (Kthena's order: the least usage).
    let mut order = Vec::new();
    for _ in 0..3 {
        complete(&router, tickets.remove(0));
        router.dispatch(Instant::now(), false);
        let mut went = Vec::new();
        for (who, h) in flooding
            .iter_mut()
            .map(|h| ("flood", h))
            .chain([("light", &mut waiting)])
        {
            if let Some(Released::Routed(r)) = try_released(h) {
                went.push(who);
                tickets.push(r);
            }
        }
        assert_eq!(went.len(), 1, "one slot, one dispatch: {went:?}");
        order.push(went[0]);
    }
    assert_eq!(order, ["flood", "light", "flood"]);
    assert_eq!(router.flow.queued(), 1);
    let served = &router.metrics.flow.served_tokens;
    assert!(served.with_label_values(&["light@m"]).get() > 0);
    assert!(served.with_label_values(&["flood@m"]).get() > 0);
}

#[tokio::test]
async fn kthenas_queue_timeout_is_the_ttl() {
    let router = kthena_fairness_router(&[
        ("FAIRNESS_MAX_CONCURRENT", "1"),
        ("FAIRNESS_QUEUE_TIMEOUT", "2s"),
    ]);
    let user = bearer("u");
    let _ticket = routed(admit_as(&router, "first", &user));
    let mut h = held(admit_as(&router, "second", &user));
    let now = Instant::now();
    router.dispatch(now + Duration::from_secs(1), false);
    assert!(
        try_released(&mut h).is_none(),
        "under the timeout: still queued"
    );
    router.dispatch(now + Duration::from_secs(3), false);
    let Some(Released::Refused(f)) = try_released(&mut h) else {
        panic!("refused past the timeout");
    };
    assert_eq!((f.status, f.dropped_reason), (429, Some("ttl_expired")));
}
