//! What a stream tells about its decision and its cost: the decision in `envoy.lb` metadata
//! (always) and in the response's decision header (`picker.decisionHeader`), the response's
//! token counts as `io.envoy.ai_gateway` metadata on its last reply.

use super::*;

const USAGE: &[u8] = br#"{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":768}}}"#;

fn header_router(on: bool) -> Arc<Router> {
    router_with(
        PickerConfig {
            decision_header: on,
            ..PickerConfig::default()
        },
        three(),
    )
}

/// The numbers under `namespace` in a reply's dynamic metadata.
fn numbers(r: &ProcessingResponse, namespace: &str) -> HashMap<String, f64> {
    let Some(md) = &r.dynamic_metadata else {
        return HashMap::new();
    };
    let Some(Some(Kind::StructValue(inner))) = md.fields.get(namespace).map(|v| &v.kind) else {
        return HashMap::new();
    };
    inner
        .fields
        .iter()
        .filter_map(|(k, v)| match v.kind {
            Some(Kind::NumberValue(n)) => Some((k.clone(), n)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_decision_rides_in_lb_metadata_and_on_the_response_when_asked() {
    for on in [false, true] {
        let router = header_router(on);
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers("/v1/completions", false, &[("x-request-id", "dec-1")]),
            BUFFERED,
            STREAMED,
        ));
        assert_continue_headers(&r[0]);
        let r = s.handle(body(&completion("m", &long_prompt("decision")), true));
        let pick = pick_of(&r[0]);
        let label = endpoint(&router, pick[0]).label.clone();
        let want = format!("pod={label}; reason=prefix_miss; queued_ms=0; request_id=dec-1");
        assert_eq!(
            reply_lb_string(&r[0], DECISION_HEADER).as_deref(),
            Some(want.as_str()),
            "the access record's decision, header {on}"
        );
        let r = s.handle(response_headers(200, Some(&pick[0].to_string())));
        assert_eq!(
            set_header_of(&r[0], DECISION_HEADER).map(|(v, _)| v),
            on.then_some(want),
            "header {on}"
        );
    }
}

#[test]
fn the_last_reply_carries_the_token_counts() {
    let router = router();
    // A response body ending with end_of_stream: the last body reply.
    let (mut s, pick) = route_buffered(&router, "cost-1", &completion("m", "x"), STREAMED);
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    let (head, tail) = USAGE.split_at(40);
    let r = s.handle(response_body(head, false));
    assert!(r[0].dynamic_metadata.is_none(), "not before the end");
    let r = s.handle(response_body(tail, true));
    let want = HashMap::from([
        ("llm_input_token".to_string(), 900.0),
        ("llm_cached_input_token".to_string(), 768.0),
        ("llm_output_token".to_string(), 5.0),
        ("llm_total_token".to_string(), 905.0),
    ]);
    assert_eq!(numbers(&r[0], COST_NAMESPACE), want);

    // Ended by response trailers: the trailers reply.
    let (mut s, pick) = route_buffered(&router, "cost-2", &completion("m", "y"), STREAMED);
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    s.handle(response_body(USAGE, false));
    let r = s.handle(response_trailers());
    assert!(matches!(r[0].response, Some(Out::ResponseTrailers(_))));
    assert_eq!(numbers(&r[0], COST_NAMESPACE), want);

    // A body without usage: no metadata.
    let (mut s, pick) = route_buffered(&router, "cost-3", &completion("m", "z"), STREAMED);
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    let r = s.handle(response_body(b"{\"choices\":[]}", true));
    assert!(r[0].dynamic_metadata.is_none());
}
