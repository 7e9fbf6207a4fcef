//! Immediate responses (400, 404, 413, 503) and the generated `x-request-id`.

use super::*;

// Failures

fn buffered_failure(router: &Arc<Router>, path: &str, b: &[u8]) -> Vec<ProcessingResponse> {
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(headers(path, false, &[]), BUFFERED, STREAMED));
    assert_continue_headers(&r[0]);
    s.handle(body(b, true))
}

#[test]
fn bad_bodies_are_400_naming_the_problem() {
    let router = router();
    let cases: [(&[u8], &str); 6] = [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1,2]", "must be a JSON object"),
        (br#"{"prompt":"hi"}"#, "no `model` field"),
        (
            br#"{"model":42,"prompt":"hi"}"#,
            "`model` must be a string, got a number",
        ),
        (br#"{"model":"","prompt":"hi"}"#, "must not be empty"),
    ];
    for (b, expected) in cases {
        let r = buffered_failure(&router, "/v1/completions", b);
        let msg = assert_error(&r, 400);
        assert!(
            msg.contains(expected),
            "{msg:?} should contain {expected:?}"
        );
        let (_, json, _) = immediate_of(&r[0]);
        assert_eq!(json["error"]["type"], "invalid_request_error");
    }
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn body_over_the_limit_is_413() {
    let limit = 200;
    let router = router_with(
        PickerConfig {
            max_body_bytes: limit,
            ..PickerConfig::default()
        },
        three(),
    );
    // Exactly at the limit is accepted.
    let pad = limit - completion("m", "x").len();
    let ok = completion("m", &"x".repeat(1 + pad));
    assert_eq!(ok.len(), limit);
    let r = buffered_failure(&router, "/v1/completions", &ok);
    assert_eq!(pick_of(&r[0]).len(), 3);

    let over = completion("m", &"x".repeat(2 + pad));
    let r = buffered_failure(&router, "/v1/completions", &over);
    let msg = assert_error(&r, 413);
    assert!(msg.contains("200 bytes"), "{msg}");

    // FULL_DUPLEX: the chunk that crosses the limit is answered 413, later chunks not at all.
    let mut s = StreamState::new(router.clone());
    assert!(
        s.handle(modes(
            headers("/v1/completions", false, &[]),
            FULL_DUPLEX,
            FULL_DUPLEX
        ))
        .is_empty()
    );
    assert!(s.handle(body(&over[..150], false)).is_empty());
    assert_error(&s.handle(body(&over[150..], false)), 413);
    assert!(s.handle(body(b"", true)).is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn unknown_model_is_404_when_endpoints_list_models() {
    let router = router_with(
        PickerConfig::default(),
        vec![
            spec("a", PORTS[0], &["llama"]),
            spec("b", PORTS[1], &["llama", "qwen"]),
            spec("c", PORTS[2], &["qwen"]),
        ],
    );
    let r = buffered_failure(&router, "/v1/completions", &completion("mistral", "hi"));
    let msg = assert_error(&r, 404);
    assert!(msg.contains("mistral"), "{msg}");
    let (_, json, _) = immediate_of(&r[0]);
    assert_eq!(json["error"]["type"], "invalid_request_error");

    // A listed model goes only to the pods that serve it.
    let r = buffered_failure(&router, "/v1/completions", &completion("qwen", "hi"));
    let pick: HashSet<_> = pick_of(&r[0]).into_iter().collect();
    assert_eq!(pick, HashSet::from([addr(PORTS[1]), addr(PORTS[2])]));
}

#[test]
fn no_endpoints_is_503() {
    let router = router_with(PickerConfig::default(), vec![]);
    let r = buffered_failure(&router, "/v1/completions", &completion("m", "hi"));
    let msg = assert_error(&r, 503);
    assert!(msg.contains("no model server endpoints"), "{msg}");
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED));
    assert_error(&r, 503);
}

// x-request-id

#[test]
fn request_id_is_generated_when_missing() {
    let router = router();
    for (extra, generated) in [
        (vec![], true),
        (vec![("x-request-id", "")], true),
        (vec![("x-request-id", "given-id")], false),
    ] {
        // BUFFERED: on the body reply.
        let mut s = StreamState::new(router.clone());
        s.handle(modes(
            headers("/v1/completions", false, &extra),
            BUFFERED,
            STREAMED,
        ));
        let r = s.handle(body(&completion("m", "hi"), true));
        let id = set_header_of(&r[0], "x-request-id");
        // FULL_DUPLEX: on the held headers reply. Header-only: on the immediate headers reply.
        let mut s2 = StreamState::new(router.clone());
        s2.handle(modes(
            headers("/v1/completions", false, &extra),
            FULL_DUPLEX,
            FULL_DUPLEX,
        ));
        let r2 = s2.handle(body(&completion("m", "hi"), true));
        let id2 = set_header_of(&r2[0], "x-request-id");
        let mut s3 = StreamState::new(router.clone());
        let r3 = s3.handle(modes(
            headers("/v1/models", true, &extra),
            BUFFERED,
            STREAMED,
        ));
        let id3 = set_header_of(&r3[0], "x-request-id");
        if generated {
            for id in [&id, &id2, &id3] {
                let (v, action) = id.clone().expect("x-request-id generated");
                assert!(uuid::Uuid::parse_str(&v).is_ok(), "{v}");
                assert_eq!(action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
            }
            assert_ne!(id.unwrap().0, id2.unwrap().0, "fresh per request");
        } else {
            assert_eq!((id, id2, id3), (None, None, None));
        }
        for st in [&mut s, &mut s2, &mut s3] {
            st.finish();
        }
    }
}

#[test]
fn immediate_response_carries_the_generated_request_id() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(body(b"nope", true));
    assert_error(&r, 400);
    let (_, _, headers) = immediate_of(&r[0]);
    assert!(uuid::Uuid::parse_str(&headers["x-request-id"]).is_ok());
}
