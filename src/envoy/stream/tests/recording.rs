//! Response phase: what is recorded for which pod, and when a stream completes.

use super::*;

// Recording the serving pod

#[test]
fn success_records_for_the_pod_that_served() {
    let router = router();
    let prompt_body = completion("m", &long_prompt("record"));
    let (mut s, pick) = route_buffered(&router, "rec-1", &prompt_body, STREAMED);
    let (primary, served) = (pick[0], pick[1]);
    assert_eq!(endpoint(&router, primary).inflight(), 1);

    let r = s.handle(response_headers(200, Some(&served.to_string())));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    assert_eq!(
        total_entries(&router),
        0,
        "not before the end of the response"
    );
    for chunk in [&b"data: {}\n\n"[..], b"data: [DONE]\n\n"] {
        let r = s.handle(response_body(chunk, false));
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0].response, Some(Out::ResponseBody(_))));
        assert!(streamed(&r[0]).is_none(), "STREAMED: plain continue");
    }
    assert_eq!(total_entries(&router), 0);
    let r = s.handle(response_body(b"", true));
    assert_eq!(r.len(), 1);

    assert!(
        entries(&router, served) > 0,
        "recorded for the pod that served"
    );
    assert_eq!(entries(&router, primary), 0, "not for the primary");
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(
        inflight(&router),
        [0, 0, 0],
        "primary's in-flight count released"
    );
    assert_eq!(records(&router, "recorded"), 1);
    s.finish();
    assert_eq!(records(&router, "aborted"), 0);

    // The same prompt now goes to the pod that served it.
    let (_s2, pick2) = route_buffered(&router, "rec-2", &prompt_body, STREAMED);
    assert_eq!(pick2[0], served);
}

#[test]
fn response_trailers_or_header_eos_also_complete() {
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "t-1",
        &completion("m", &long_prompt("t")),
        STREAMED,
    );
    s.handle(response_headers(200, Some(&pick[2].to_string())));
    s.handle(response_body(b"partial", false));
    let r = s.handle(response_trailers());
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseTrailers(_))));
    assert!(entries(&router, pick[2]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);

    let router = router_with(PickerConfig::default(), three());
    let (mut s, pick) = route_buffered(
        &router,
        "t-2",
        &completion("m", &long_prompt("h")),
        STREAMED,
    );
    s.handle(response_headers_eos(204, Some(&pick[1].to_string()), true));
    assert!(entries(&router, pick[1]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn served_pod_falls_back_to_metadata_then_primary() {
    // No attribute: the override_host `...-served` metadata key names the served pod.
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "md",
        &completion("m", &long_prompt("md")),
        STREAMED,
    );
    let served = pick[2];
    s.handle(with_metadata(
        response_headers(200, None),
        metadata(LB_NAMESPACE, SERVED_KEY, string_value(&served.to_string())),
    ));
    s.handle(response_body(b"", true));
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));

    // Neither: the primary pick.
    let router = router_with(PickerConfig::default(), three());
    let (mut s, pick) = route_buffered(
        &router,
        "pr",
        &completion("m", &long_prompt("pr")),
        STREAMED,
    );
    s.handle(response_headers(200, None));
    s.handle(response_body(b"", true));
    assert!(entries(&router, pick[0]) > 0);
    assert_eq!(total_entries(&router), entries(&router, pick[0]));
}

#[test]

fn unknown_served_address_is_not_credited_to_the_primary() {
    // Envoy reports that a pod outside the endpoint set served (e.g. the fallback LB policy):
    // the primary did not serve this prompt and must not be credited with its prefix.
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "unk",
        &completion("m", &long_prompt("u")),
        STREAMED,
    );
    s.handle(response_headers(200, Some("10.20.30.40:8000")));
    s.handle(response_body(b"", true));
    assert_eq!(
        entries(&router, pick[0]),
        0,
        "primary credited with a prompt it never saw"
    );
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn failed_response_records_nothing() {
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "f-1",
        &completion("m", &long_prompt("f")),
        STREAMED,
    );
    s.handle(response_headers(500, Some(&pick[0].to_string())));
    s.handle(response_body(b"{\"error\":{}}", true));
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "failed"), 1);
    assert_eq!(records(&router, "recorded"), 0);
    s.finish();
    assert_eq!(records(&router, "aborted"), 0);
}

#[test]
fn stream_ending_before_the_response_end_records_nothing() {
    let router = router();
    // Ends after the response headers.
    let (mut s, pick) = route_buffered(
        &router,
        "ab-1",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    s.handle(response_body(b"data: {}\n\n", false));
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    s.finish();
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 1);
    // Ends right after routing.
    let (mut s, _) = route_buffered(
        &router,
        "ab-2",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 2);
    assert!(router.pending.is_empty());
    // Dropping the stream without finish() also releases the count.
    let (s, _) = route_buffered(
        &router,
        "ab-3",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    drop(s);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(total_entries(&router), 0);
}

#[test]
fn full_duplex_response_chunks_are_echoed() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    let r = s.handle(body(&completion("m", &long_prompt("fdr")), true));
    let pick = pick_of(&r[0]);
    let r = s.handle(response_headers(200, Some(&pick[1].to_string())));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    let chunks: [(&[u8], bool); 3] = [
        (b"data: {\"a\":1}\n\n", false),
        (b"data: [DONE]\n\n", false),
        (b"", true),
    ];
    for (bytes, eos) in chunks {
        let r = s.handle(response_body(bytes, eos));
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0].response, Some(Out::ResponseBody(_))));
        assert_eq!(streamed(&r[0]), Some((bytes, eos)));
    }
    assert!(entries(&router, pick[1]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn response_mode_none_completes_at_the_response_headers() {
    // The routing stream itself sees the response headers (header SEND, body NONE): the 2xx
    // headers are the completion.
    let router = router();
    let (mut s, pick) =
        route_buffered(&router, "none-1", &completion("m", &long_prompt("n")), NONE);
    assert_eq!(router.pending.len(), 1);
    let r = s.handle(response_headers(200, Some(&pick[1].to_string())));
    assert_eq!(r.len(), 1);
    assert!(entries(&router, pick[1]) > 0);
    assert!(router.pending.is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
    s.finish();
    assert_eq!(records(&router, "recorded"), 1);
}

#[test]
fn open_streams_are_counted() {
    let router = router();
    let a = StreamState::new(router.clone());
    let b = StreamState::new(router.clone());
    assert_eq!(router.metrics.inflight_streams.get(), 2);
    drop(a);
    drop(b);
    assert_eq!(router.metrics.inflight_streams.get(), 0);
}
