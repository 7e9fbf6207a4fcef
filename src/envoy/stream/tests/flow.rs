//! Flow control on the wire: a held request's message answered late (after an
//! `override_message_timeout` reply in BUFFERED mode, none in FULL_DUPLEX), its pick once
//! released, its refusal as a 429 with `retry-after` and the drop reason, the flow and
//! objective headers read.

use std::time::Instant;

use super::*;
use crate::routing::flow::Released;

/// Three pods taking one request each, flow control on (`requestTtlSeconds` 30).
fn full_router(extra: &str) -> (Arc<Router>, Vec<Routed>) {
    let yaml = format!(
        "picker:\n  affinity: {{}}\n  flowControl: {{enabled: true, maxInFlightPerPod: 1, messageTimeoutSeconds: 12.5, priorities: {{vip: 5}}, {extra}}}\n"
    );
    let router = Arc::new(router_from_config(
        &yaml,
        three(),
        &prometheus::Registry::new(),
    ));
    let tickets = (0..3)
        .map(|i| {
            router
                .route(
                    "/v1/completions",
                    Some(&completion("m", &format!("fill {i}"))),
                    None,
                )
                .unwrap()
        })
        .collect();
    (router, tickets)
}

fn free_one(router: &Router, tickets: &mut Vec<Routed>) {
    router.complete(tickets.remove(0).ticket, Ending::Aborted);
    router.dispatch(Instant::now(), false);
}

#[tokio::test]
async fn buffered_a_held_body_gets_the_timeout_override_then_its_pick() {
    let (router, mut tickets) = full_router("");
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers(
            "/v1/completions",
            false,
            &[
                ("x-request-id", "held-1"),
                ("x-gateway-inference-fairness-id", "tenant-a"),
                ("x-gateway-inference-objective", "vip"),
            ],
        ),
        BUFFERED,
        NONE,
    ));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&completion("m", "held prompt"), true));
    // The only reply: Envoy's timer for this message replaced (12.5 s), nothing else set.
    assert_eq!(r.len(), 1, "{r:?}");
    let timeout = r[0].override_message_timeout.as_ref().expect("override");
    assert_eq!((timeout.seconds, timeout.nanos), (12, 500_000_000));
    assert!(r[0].response.is_none());
    let mut hold = s.take_hold().expect("held");
    assert_eq!(router.flow.depths(), [(5, 1)], "the objective's band");
    assert!(s.take_hold().is_none());
    free_one(&router, &mut tickets);
    let released = hold.wait().await;
    let r = StreamHandler::released(&mut s, released);
    assert_eq!(r.len(), 1);
    assert!(is_request_body(&r[0]), "{r:?}");
    assert!(!pick_of(&r[0]).is_empty());
    let decision = reply_lb_string(&r[0], DECISION_HEADER).unwrap();
    assert!(decision.contains("request_id=held-1"), "{decision}");
    let served = &router.metrics.flow.served_tokens;
    assert!(served.with_label_values(&["tenant-a"]).get() > 0);
}

#[tokio::test]
async fn full_duplex_holds_without_an_override_and_sends_the_body_back_after_the_pick() {
    let (router, mut tickets) = full_router("");
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", "fd")]),
        FULL_DUPLEX,
        NONE,
    ));
    assert!(r.is_empty());
    let bytes = completion("m", "duplex prompt");
    let r = s.handle(body(&bytes, true));
    assert!(r.is_empty(), "no timer to override in FULL_DUPLEX: {r:?}");
    let mut hold = s.take_hold().expect("held");
    free_one(&router, &mut tickets);
    let r = StreamHandler::released(&mut s, hold.wait().await);
    assert!(is_request_headers(&r[0]), "the pick on the held headers");
    assert!(!pick_of(&r[0]).is_empty());
    let (echoed, eos) = streamed(&r[1]).expect("the body back");
    assert_eq!((echoed, eos), (bytes.as_slice(), true));
}

#[tokio::test]
async fn a_refused_hold_is_a_429_with_retry_after_and_the_reason() {
    let (router, _tickets) = full_router("requestTtlSeconds: 0.01, retryAfterSeconds: 4");
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", "ttl")]),
        BUFFERED,
        NONE,
    ));
    s.handle(body(&completion("m", "expires"), true));
    let mut hold = s.take_hold().expect("held");
    router.dispatch(Instant::now() + std::time::Duration::from_millis(20), false);
    let released = hold.wait().await;
    assert!(matches!(released, Released::Refused(_)));
    let r = StreamHandler::released(&mut s, released);
    let message = assert_error(&r, 429);
    assert!(message.contains("ttl_expired"), "{message}");
    let (_, _, headers) = immediate_of(&r[0]);
    assert_eq!(headers["retry-after"], "4");
    assert_eq!(headers[DROPPED_REASON_HEADER], "ttl_expired");
    // The stream answers nothing more of the request.
    assert!(s.handle(request_trailers()).is_empty());
}

#[tokio::test]
async fn a_stream_that_ends_while_held_leaves_the_queue() {
    let (router, _tickets) = full_router("");
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        NONE,
    ));
    s.handle(body(&completion("m", "gone"), true));
    let hold = s.take_hold().expect("held");
    assert_eq!(router.flow.queued(), 1);
    // What the driver does when Envoy closes the stream.
    assert!(hold.cancel().is_none());
    s.finish();
    assert_eq!(router.flow.queued(), 0);
    assert_eq!(
        router
            .metrics
            .flow
            .drops
            .with_label_values(&["cancelled"])
            .get(),
        1
    );
}
