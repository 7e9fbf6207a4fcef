//! Request phase per body mode: BUFFERED, BUFFERED_PARTIAL, STREAMED, FULL_DUPLEX_STREAMED,
//! and requests without a body.

use super::*;

// BUFFERED

#[test]
fn chunks_are_bounded_and_last_ends_stream() {
    let body = vec![b'x'; BODY_CHUNK * 2 + 5];
    let chunks = body_chunks(body.clone(), BodyEnd::EndOfStream);
    assert_eq!(chunks.len(), 3);
    assert_eq!(streamed(&chunks[2]), Some((&body[..5], true)));
    assert_eq!(body_chunks(vec![], BodyEnd::EndOfStream).len(), 1);
    assert_eq!(
        streamed(&body_chunks(vec![], BodyEnd::EndOfStream).remove(0)),
        Some((&b""[..], true))
    );
    assert!(body_chunks(vec![], BodyEnd::Trailers).is_empty());
    // One chunk: the body itself, ending the stream only when no trailers follow.
    let one = vec![b'y'; BODY_CHUNK];
    for (end, ends) in [(BodyEnd::EndOfStream, true), (BodyEnd::Trailers, false)] {
        let chunks = body_chunks(one.clone(), end);
        assert_eq!(chunks.len(), 1);
        assert_eq!(streamed(&chunks[0]), Some((&one[..], ends)));
    }
    let two = body_chunks(vec![b'z'; BODY_CHUNK + 1], BodyEnd::Trailers);
    assert_eq!(streamed(&two[1]), Some((&b"z"[..], false)));
}

#[test]
fn buffered_pick_rides_on_the_body_reply() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers(
            "/v1/chat/completions",
            false,
            &[
                ("x-request-id", "req-1"),
                // A client-supplied pick must be overwritten.
                (DESTINATION_HEADER, "6.6.6.6:6666"),
            ],
        ),
        BUFFERED,
        STREAMED,
    ));
    assert_eq!(r.len(), 1);
    assert_continue_headers(&r[0]);
    assert_eq!(inflight(&router), [0, 0, 0]);

    let chat =
        json!({"model": "m", "messages": [{"role": "user", "content": long_prompt("chat")}]});
    let r = s.handle(body(&serde_json::to_vec(&chat).unwrap(), true));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]), "{r:?}");
    let pick = pick_of(&r[0]);
    assert_eq!(pick.len(), 3, "all three pods, primary first");
    let all: HashSet<_> = PORTS.iter().map(|&p| addr(p)).collect();
    assert_eq!(pick.iter().copied().collect::<HashSet<_>>(), all);
    assert!(common(&r[0]).unwrap().clear_route_cache);
    assert!(common(&r[0]).unwrap().body_mutation.is_none());
    // x-request-id was present: not touched.
    assert_eq!(set_header_of(&r[0], "x-request-id"), None);
    // The primary (only) counts one request in flight.
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    assert_eq!(inflight(&router).iter().sum::<i64>(), 1);
    assert_eq!(
        router
            .metrics
            .pod_picks
            .with_label_values(&crate::metrics::pod_label_values(
                &endpoint(&router, pick[0]).spec.id
            ))
            .get(),
        1
    );
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn pick_is_capped_at_five_and_honours_max_endpoints() {
    let seven: Vec<_> = (0..7)
        .map(|i| spec(&format!("p{i}"), 19000 + i, &[]))
        .collect();
    let router = router_with(PickerConfig::default(), seven.clone());
    let (_s, pick) = route_buffered(&router, "a", &completion("m", "hello"), STREAMED);
    assert_eq!(pick.len(), 5);

    let one = router_with(
        PickerConfig {
            max_endpoints: 1,
            ..PickerConfig::default()
        },
        seven,
    );
    let (_s, pick) = route_buffered(&one, "b", &completion("m", "hello"), STREAMED);
    assert_eq!(pick.len(), 1);
}

#[test]
fn ipv6_endpoints_are_bracketed() {
    let v6 = EndpointSpec {
        address: "[::1]:8000".parse().unwrap(),
        ..spec("v6", 0, &[])
    };
    let router = router_with(PickerConfig::default(), vec![v6]);
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(body(&completion("m", "hi"), true));
    assert_eq!(lb_value(&r[0]).as_deref(), Some("[::1]:8000"));
    assert_eq!(
        pick_of(&r[0]),
        ["[::1]:8000".parse::<SocketAddr>().unwrap()]
    );
}

#[test]
fn streamed_request_body_is_continued_until_the_end() {
    // Request body mode STREAMED: non-final chunks are answered with a plain body reply.
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[]),
        STREAMED,
        STREAMED,
    ));
    assert_continue_headers(&r[0]);
    let b = completion("m", &long_prompt("streamed"));
    let (a, z) = b.split_at(b.len() / 2);
    let r = s.handle(body(a, false));
    assert_eq!(r.len(), 1);
    assert!(is_request_body(&r[0]));
    assert!(common(&r[0]).is_none());
    let r = s.handle(body(z, true));
    assert_eq!(r.len(), 1);
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
}

#[test]
fn buffered_partial_body_that_did_not_fit_is_413() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED_PARTIAL,
        STREAMED,
    ));
    let r = s.handle(body(b"{\"model\":\"m\",\"prompt\":\"par", false));
    let msg = assert_error(&r, 413);
    assert!(msg.contains("buffer limit"), "{msg}");
    // Nothing more is answered for this request.
    assert!(s.handle(body(b"tial\"}", true)).is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn buffered_partial_whole_body_before_trailers_is_routed() {
    // Envoy sends a BUFFERED_PARTIAL body that request trailers follow with end_of_stream false,
    // as it does a body cut at its buffer limit: a body that parses whole is routed.
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED_PARTIAL,
        STREAMED,
    ));
    let r = s.handle(body(&completion("m", &long_prompt("partial")), false));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
    assert!(matches!(
        s.handle(request_trailers())[..],
        [ProcessingResponse {
            response: Some(Out::RequestTrailers(_)),
            ..
        }]
    ));
}

/// A filter that skips request headers: Envoy sends the body first and has already forwarded
/// the request. The body is still answered (never a stuck stream), routed by load and counted.
#[test]
fn body_without_request_headers_is_routed_by_load_and_counted() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        body(&completion("m", &long_prompt("headless")), true),
        BUFFERED,
        NONE,
    ));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]), "{r:?}");
    assert_eq!(pick_of(&r[0]).len(), 3);
    let unscored = |reason: &str| router.metrics.unscored.with_label_values(&[reason]).get();
    assert_eq!(unscored("no_request_path"), 1);
    assert_eq!(unscored("unknown_api"), 0);
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn missing_protocol_config_behaves_as_buffered() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(headers("/v1/completions", false, &[("x-request-id", "np")]));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&completion("m", "hello"), true));
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
}

// FULL_DUPLEX_STREAMED

/// Checks the FULL_DUPLEX answer to the body's end: headers reply with the pick, then the body,
/// with `end_of_stream` on its last chunk unless the body ended with trailers.
fn assert_full_duplex_answer(
    name: &str,
    r: &[ProcessingResponse],
    original: &[u8],
    end: BodyEnd,
) -> Vec<SocketAddr> {
    assert!(r.len() >= 2, "{name}: {r:?}");
    assert!(is_request_headers(&r[0]), "{name}: {:?}", r[0]);
    let c = common(&r[0]).unwrap();
    assert!(c.clear_route_cache, "{name}");
    assert!(c.body_mutation.is_none(), "{name}");
    let pick = pick_of(&r[0]);
    let chunks = &r[1..];
    let ends_stream = end == BodyEnd::EndOfStream;
    let min_chunks = usize::from(ends_stream);
    assert_eq!(
        chunks.len(),
        original.len().div_ceil(BODY_CHUNK).max(min_chunks),
        "{name}"
    );
    let mut resent = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        assert!(is_request_body(chunk), "{name}: {chunk:?}");
        assert!(chunk.dynamic_metadata.is_none(), "{name}");
        let c = common(chunk).unwrap();
        assert!(c.header_mutation.is_none(), "{name}");
        let (bytes, eos) = streamed(chunk).expect("streamed_response");
        assert!(bytes.len() <= BODY_CHUNK, "{name}");
        assert_eq!(
            eos,
            ends_stream && i == chunks.len() - 1,
            "{name}: end_of_stream only on the last chunk, and only if the body ended the stream"
        );
        resent.extend_from_slice(bytes);
    }
    assert_eq!(resent, original, "{name}: the body is sent back unchanged");
    pick
}

/// One FULL_DUPLEX request: its body cut at `cuts` and ended by end_of_stream or by trailers.
struct FullDuplex {
    name: &'static str,
    path: &'static str,
    request_id: Option<&'static str>,
    body: Vec<u8>,
    cuts: Vec<usize>,
    end: BodyEnd,
}

/// Headers and body chunks are held (no reply) until the body ends; then the pick rides on the
/// held headers' reply and the body is sent back unchanged, whatever the API or the pieces.
#[test]
fn full_duplex_holds_headers_and_resends_the_body() {
    let big = completion("m", &"0123456789abcdef".repeat(12_500));
    assert!(big.len() > 200_000);
    let rows = [
        FullDuplex {
            name: "200 KB body in five pieces",
            path: "/v1/completions",
            request_id: Some("fd-1"),
            cuts: (1..5).map(|i| i * 45_000).collect(),
            body: big,
            end: BodyEnd::EndOfStream,
        },
        FullDuplex {
            name: "small body in one chunk",
            path: "/v1/completions",
            request_id: None,
            body: completion("m", "hi"),
            cuts: vec![],
            end: BodyEnd::EndOfStream,
        },
        FullDuplex {
            name: "body ended by trailers",
            path: "/v1/completions",
            request_id: None,
            body: completion("m", &long_prompt("trailers")),
            cuts: vec![10],
            end: BodyEnd::Trailers,
        },
        // Not an inference API: the body is not parsed (may be anything) but still sent back.
        FullDuplex {
            name: "unknown API body",
            path: "/v1/embeddings",
            request_id: None,
            body: b"\x00\x01 not json".to_vec(),
            cuts: vec![],
            end: BodyEnd::EndOfStream,
        },
    ];
    for row in rows {
        let name = row.name;
        let router = router();
        let mut s = StreamState::new(router.clone());
        let extra: Vec<_> = row
            .request_id
            .map(|id| ("x-request-id", id))
            .into_iter()
            .collect();
        let r = s.handle(modes(
            headers(row.path, false, &extra),
            FULL_DUPLEX,
            FULL_DUPLEX,
        ));
        assert!(r.is_empty(), "{name}: headers are held: {r:?}");
        let mut pieces = Vec::new();
        let mut at = 0;
        for &cut in row.cuts.iter().chain([row.body.len()].iter()) {
            pieces.push(&row.body[at..cut]);
            at = cut;
        }
        assert_eq!(pieces.len(), row.cuts.len() + 1, "{name}");
        let last = pieces.len() - 1;
        let mut answer = vec![];
        for (i, piece) in pieces.iter().enumerate() {
            let ends = i == last && row.end == BodyEnd::EndOfStream;
            let r = s.handle(body(piece, ends));
            if ends {
                answer = r;
            } else {
                assert!(r.is_empty(), "{name}: no reply to a non-final chunk: {r:?}");
            }
        }
        if row.end == BodyEnd::Trailers {
            answer = s.handle(request_trailers());
            assert!(
                matches!(
                    answer.pop().expect("a trailers reply").response,
                    Some(Out::RequestTrailers(_))
                ),
                "{name}"
            );
        }
        assert_eq!(
            answer.len(),
            1 + row.body.len().div_ceil(BODY_CHUNK).max(1),
            "{name}: the headers reply, then the body"
        );
        let pick = assert_full_duplex_answer(name, &answer, &row.body, row.end);
        assert_eq!(pick.len(), 3, "{name}");
        // A given request id is not touched; a generated one is part of the held headers' mutation.
        let id = set_header_of(&answer[0], "x-request-id");
        assert_eq!(id.is_some(), row.request_id.is_none(), "{name}: {id:?}");
        assert_eq!(endpoint(&router, pick[0]).inflight(), 1, "{name}");
        s.finish();
        assert_eq!(inflight(&router), [0, 0, 0], "{name}");
    }
}

#[test]
fn full_duplex_bad_body_is_a_single_immediate_response() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    assert!(s.handle(body(b"{\"prompt\":", false)).is_empty());
    let r = s.handle(body(b"\"x\"}", true));
    let msg = assert_error(&r, 400);
    assert!(msg.contains("model"), "{msg}");
    assert_eq!(inflight(&router), [0, 0, 0]);
}

// Requests without a body

#[test]
fn header_only_models_request_is_answered_at_once() {
    for mode in [BUFFERED, FULL_DUPLEX] {
        let router = router();
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers("/v1/models", true, &[("x-request-id", "m-1")]),
            mode,
            mode,
        ));
        assert_eq!(r.len(), 1, "mode {mode}: {r:?}");
        assert!(is_request_headers(&r[0]));
        assert!(common(&r[0]).unwrap().clear_route_cache);
        assert!(streamed(&r[0]).is_none());
        assert_eq!(pick_of(&r[0]).len(), 3);
        // No prompt: nothing to record later.
        let r = s.handle(response_headers(200, Some("127.0.0.1:18001")));
        assert_eq!(r.len(), 1);
        let r = s.handle(response_body(b"{}", true));
        assert_eq!(r.len(), 1);
        assert_eq!(total_entries(&router), 0);
        assert_eq!(records(&router, "unscored"), 1);
        assert_eq!(inflight(&router), [0, 0, 0]);
    }
}

#[test]
fn header_only_inference_request_is_400() {
    for mode in [BUFFERED, FULL_DUPLEX] {
        let router = router();
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers("/v1/chat/completions", true, &[("x-request-id", "c-1")]),
            mode,
            mode,
        ));
        let msg = assert_error(&r, 400);
        assert_eq!(msg, "request has no body");
        let (_, json, headers) = immediate_of(&r[0]);
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(headers["x-request-id"], "c-1");
        assert_eq!(inflight(&router), [0, 0, 0]);
        assert_eq!(
            router
                .metrics
                .immediate_responses
                .with_label_values(&["400"])
                .get(),
            1
        );
    }
}
