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

/// How a routed stream's response ends (`pick` is primary first), and what that must record.
struct Ending {
    name: &'static str,
    respond: fn(&str, &Router, StreamState, &[SocketAddr]),
    /// The index in the pick of the pod credited with the prompt; `None`: nobody.
    credited: Option<usize>,
    /// `records_total{outcome}` counted once; `None`: no outcome asserted.
    outcome: Option<&'static str>,
}

/// Every ending releases the in-flight count and leaves no pending route; the prompt is recorded
/// for the pod that served (attribute, then the `...-served` metadata key, then the primary) and
/// only for a complete successful response.
#[test]
fn response_endings_record_for_the_pod_that_served_or_nothing() {
    let rows = [
        Ending {
            name: "response trailers",
            respond: |name, _, mut s, pick| {
                s.handle(response_headers(200, Some(&pick[2].to_string())));
                s.handle(response_body(b"partial", false));
                let r = s.handle(response_trailers());
                assert_eq!(r.len(), 1, "{name}");
                assert!(
                    matches!(r[0].response, Some(Out::ResponseTrailers(_))),
                    "{name}"
                );
                s.finish();
            },
            credited: Some(2),
            outcome: Some("recorded"),
        },
        Ending {
            name: "response headers with end_of_stream",
            respond: |_, _, mut s, pick| {
                s.handle(response_headers_eos(204, Some(&pick[1].to_string()), true));
                s.finish();
            },
            credited: Some(1),
            outcome: Some("recorded"),
        },
        // No attribute: the override_host `...-served` metadata key names the served pod.
        Ending {
            name: "served metadata key",
            respond: |_, _, mut s, pick| {
                s.handle(with_metadata(
                    response_headers(200, None),
                    metadata(LB_NAMESPACE, SERVED_KEY, string_value(&pick[2].to_string())),
                ));
                s.handle(response_body(b"", true));
                s.finish();
            },
            credited: Some(2),
            outcome: Some("recorded"),
        },
        Ending {
            name: "neither attribute nor metadata: the primary",
            respond: |_, _, mut s, _| {
                s.handle(response_headers(200, None));
                s.handle(response_body(b"", true));
                s.finish();
            },
            credited: Some(0),
            outcome: Some("recorded"),
        },
        // Envoy reports that a pod outside the endpoint set served (e.g. the fallback LB
        // policy): the primary did not serve this prompt and must not be credited with its prefix.
        Ending {
            name: "an address outside the endpoint set",
            respond: |_, _, mut s, _| {
                s.handle(response_headers(200, Some("10.20.30.40:8000")));
                s.handle(response_body(b"", true));
                s.finish();
            },
            credited: None,
            outcome: Some("unknown_pod"),
        },
        Ending {
            name: "a 500",
            respond: |_, _, mut s, pick| {
                s.handle(response_headers(500, Some(&pick[0].to_string())));
                s.handle(response_body(b"{\"error\":{}}", true));
                s.finish();
            },
            credited: None,
            outcome: Some("failed"),
        },
        Ending {
            name: "stream ending after the response headers",
            respond: |name, router, mut s, pick| {
                s.handle(response_headers(200, Some(&pick[0].to_string())));
                s.handle(response_body(b"data: {}\n\n", false));
                assert_eq!(endpoint(router, pick[0]).inflight(), 1, "{name}");
                s.finish();
            },
            credited: None,
            outcome: Some("aborted"),
        },
        Ending {
            name: "stream ending right after routing",
            respond: |_, _, mut s, _| s.finish(),
            credited: None,
            outcome: Some("aborted"),
        },
        // Dropping the stream without finish() also releases the count.
        Ending {
            name: "stream dropped without finish()",
            respond: |_, _, s, _| drop(s),
            credited: None,
            outcome: None,
        },
    ];
    for Ending {
        name,
        respond,
        credited,
        outcome,
    } in rows
    {
        let router = router();
        let (s, pick) = route_buffered(
            &router,
            name,
            &completion("m", &long_prompt(name)),
            STREAMED,
        );
        assert_eq!(pick.len(), 3, "{name}");
        assert_eq!(endpoint(&router, pick[0]).inflight(), 1, "{name}");
        respond(name, &router, s, &pick);
        assert_eq!(
            inflight(&router),
            [0, 0, 0],
            "{name}: in-flight count released"
        );
        assert!(router.pending.is_empty(), "{name}: no pending route");
        match credited {
            Some(i) => {
                assert!(
                    entries(&router, pick[i]) > 0,
                    "{name}: recorded for pick[{i}]"
                );
                assert_eq!(
                    total_entries(&router),
                    entries(&router, pick[i]),
                    "{name}: only there"
                );
            }
            None => assert_eq!(total_entries(&router), 0, "{name}: nothing recorded"),
        }
        if let Some(outcome) = outcome {
            for o in ["recorded", "failed", "aborted", "unknown_pod"] {
                assert_eq!(
                    records(&router, o),
                    u64::from(o == outcome),
                    "{name}: records {{outcome={o}}}"
                );
            }
        }
    }
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
