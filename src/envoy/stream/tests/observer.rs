//! The split setup: a routing stream that leaves its ticket, an observer stream that claims it.

use super::*;

// Split setup: routing stream + observer stream

/// An observer's request headers, with `route_key` in the `envoy.lb` metadata Envoy forwards.
fn observer_headers(route_key: &str) -> ProcessingRequest {
    with_metadata(
        observed(modes(
            headers("/v1/completions", false, &[("x-request-id", "client-id")]),
            NONE,
            STREAMED,
        )),
        metadata(LB_NAMESPACE, ROUTE_KEY, string_value(route_key)),
    )
}

/// The route key a routing stream issued.
fn key_of(routing: &StreamState) -> String {
    routing.route_key.clone().expect("a pending route")
}

#[test]
fn observer_stream_claims_the_pending_route_and_records() {
    let router = router();
    let prompt_body = completion("m", &long_prompt("split"));
    let (mut routing, pick) = route_buffered(&router, "split-1", &prompt_body, NONE);
    assert_eq!(router.pending.len(), 1, "deposited under its route key");
    let key = key_of(&routing);
    routing.finish();
    drop(routing);
    assert_eq!(router.pending.len(), 1, "still waiting for the observer");
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    assert_eq!(records(&router, "aborted"), 0);

    let served = pick[2];
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers(&key)).is_empty());
    assert!(
        obs.handle(observed(response_headers(200, Some(&served.to_string()))))
            .is_empty()
    );
    assert_eq!(total_entries(&router), 0);
    assert_eq!(obs.first_body, None);
    assert!(
        obs.handle(observed(response_body(b"data: {}\n\n", false)))
            .is_empty()
    );
    let first = obs.first_body.expect("the first body bytes are timed");
    assert!(obs.handle(observed(response_body(b"", true))).is_empty());
    assert_eq!(obs.first_body, Some(first), "only the first bytes");
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(inflight(&router), [0, 0, 0]);
    obs.finish();
    assert_eq!(records(&router, "recorded"), 1);
    assert_eq!(records(&router, "aborted"), 0);

    let (_s, pick2) = route_buffered(&router, "split-2", &prompt_body, NONE);
    assert_eq!(pick2[0], served);
}

#[test]
fn observer_never_answers_even_trailers_or_bodies() {
    let router = router();
    let (routing, _) = route_buffered(&router, "split-q", &completion("m", "hi"), NONE);
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers(&key_of(&routing))).is_empty());
    assert!(obs.handle(observed(body(b"{}", true))).is_empty());
    assert!(obs.handle(observed(request_trailers())).is_empty());
    assert!(obs.handle(observed(response_headers(200, None))).is_empty());
    assert!(obs.handle(observed(response_trailers())).is_empty());
    assert!(router.pending.is_empty());
}

#[test]
fn observer_ending_early_records_nothing_and_drops_the_pending_route() {
    let router = router();
    let (routing, pick) = route_buffered(
        &router,
        "split-3",
        &completion("m", &long_prompt("s3")),
        NONE,
    );
    let key = key_of(&routing);
    drop(routing);
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers(&key)).is_empty());
    assert!(
        obs.handle(observed(response_headers(200, Some(&pick[0].to_string()))))
            .is_empty()
    );
    assert!(
        obs.handle(observed(response_body(b"data: {}\n\n", false)))
            .is_empty()
    );
    assert_eq!(router.pending.len(), 1);
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 1);
}

#[test]
fn observer_of_a_failed_response_records_nothing() {
    let router = router();
    let (routing, pick) = route_buffered(
        &router,
        "split-4",
        &completion("m", &long_prompt("s4")),
        NONE,
    );
    let key = key_of(&routing);
    drop(routing);
    let mut obs = StreamState::new(router.clone());
    obs.handle(observer_headers(&key));
    obs.handle(observed(response_headers(503, Some(&pick[0].to_string()))));
    obs.handle(observed(response_body(b"", true)));
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "failed"), 1);
}

#[test]
fn observer_without_an_issued_route_key_does_not_claim() {
    let router = router();
    let (_routing, _) = route_buffered(
        &router,
        "split-5",
        &completion("m", &long_prompt("s5")),
        NONE,
    );
    // A key it was not issued, and the route's own request id without a key: neither claims.
    let by_request_id = observed(modes(
        headers("/v1/completions", false, &[("x-request-id", "split-5")]),
        NONE,
        STREAMED,
    ));
    for first in [observer_headers("someone-else"), by_request_id] {
        let mut obs = StreamState::new(router.clone());
        obs.handle(first);
        obs.handle(observed(response_headers(200, None)));
        obs.handle(observed(response_body(b"", true)));
        obs.finish();
    }
    assert_eq!(router.pending.len(), 1);
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router).iter().sum::<i64>(), 1);
}

/// `dynamic_metadata["envoy.lb"]["x-prefix-picker-route"]`.
fn route_key_of(r: &ProcessingResponse) -> Option<String> {
    reply_lb_string(r, ROUTE_KEY)
}

#[test]
fn route_key_is_in_the_metadata_only_when_an_observer_must_claim_the_route() {
    let router = router();
    let prompt = completion("m", &long_prompt("rk"));
    for (response_mode, expected) in [(NONE, true), (STREAMED, false)] {
        let mut s = StreamState::new(router.clone());
        s.handle(modes(
            headers("/v1/completions", false, &[("x-request-id", "rk-1")]),
            BUFFERED,
            response_mode,
        ));
        let r = s.handle(body(&prompt, true));
        let key = route_key_of(&r[0]);
        assert_eq!(key.is_some(), expected, "{response_mode}");
        assert_ne!(key.as_deref(), Some("rk-1"), "never the request id");
        if let Some(key) = key {
            assert!(router.pending.take(&key).is_ok());
        }
    }
    // Nor a generated request id.
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        NONE,
    ));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&prompt, true));
    let (generated, _) = set_header_of(&r[0], "x-request-id").expect("request id generated");
    let key = route_key_of(&r[0]).expect("route key");
    assert_ne!(key, generated);
    assert!(router.pending.take(&generated).is_err());
    assert!(router.pending.take(&key).is_ok());
}

#[test]
fn a_reused_request_id_gets_its_own_route_key_and_the_observer_claims_by_it() {
    let router = router();
    let (a, b) = (
        completion("m", &long_prompt("reuse a")),
        completion("m", &long_prompt("reuse b")),
    );
    let (routing_a, _) = route_buffered(&router, "same-id", &a, NONE);
    let mut routing_b = StreamState::new(router.clone());
    routing_b.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", "same-id")]),
        BUFFERED,
        NONE,
    ));
    let r = routing_b.handle(body(&b, true));
    let key_b = route_key_of(&r[0]).expect("route key");
    assert_ne!(key_b, "same-id");
    assert_eq!(router.pending.len(), 2, "the first route still waits");
    // B's observer sees the request id and B's route key: it claims B's route, not A's.
    let mut observer = StreamState::new(router.clone());
    observer.handle(observer_headers(&key_b));
    let served = pick_of(&r[0])[0];
    observer.handle(observed(response_headers(200, Some(&served.to_string()))));
    observer.handle(observed(response_body(b"data: [DONE]\n\n", true)));
    assert_eq!(records(&router, "recorded"), 1);
    assert!(
        router.pending.take(&key_b).is_err(),
        "B's route was claimed"
    );
    assert!(
        router.pending.take(&key_of(&routing_a)).is_ok(),
        "A's route still waits"
    );
}

#[test]
fn observer_without_request_headers_claims_by_the_route_key() {
    let router = router();
    let prompt = completion("m", &long_prompt("skip"));
    let (routing, pick) = route_buffered(&router, "skip-1", &prompt, NONE);
    let route_key = key_of(&routing);
    drop(routing);
    let served = pick[1];
    let key = metadata(LB_NAMESPACE, ROUTE_KEY, string_value(&route_key));
    let mut obs = StreamState::new(router.clone());
    let first = with_metadata(
        response_headers(200, Some(&served.to_string())),
        key.clone(),
    );
    assert!(
        obs.handle(observed(modes(first, NONE, STREAMED)))
            .is_empty()
    );
    assert!(
        obs.handle(observed(with_metadata(response_body(b"", true), key)))
            .is_empty()
    );
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(records(&router, "recorded"), 1);
    assert_eq!(inflight(&router), [0, 0, 0]);

    // Aborted before the end: the route is dropped, nothing recorded.
    let (routing, pick) = route_buffered(&router, "skip-2", &prompt, NONE);
    let route_key = key_of(&routing);
    drop(routing);
    let key = metadata(LB_NAMESPACE, ROUTE_KEY, string_value(&route_key));
    let mut obs = StreamState::new(router.clone());
    let first = with_metadata(response_headers(200, Some(&pick[0].to_string())), key);
    obs.handle(observed(modes(first, NONE, STREAMED)));
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(records(&router, "aborted"), 1);
    assert_eq!(records(&router, "recorded"), 1);
}
