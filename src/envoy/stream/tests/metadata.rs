//! Metadata merged across a stream's messages.

use super::*;

// Metadata merging across messages

#[test]
fn metadata_is_merged_across_messages() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    // Headers: the subset hint, plus an unrelated key of the same namespace.
    let mut hint = subset_hint(list_value(&["127.0.0.1:18002", "127.0.0.1:18003"]));
    hint.filter_metadata
        .get_mut(SUBSET_NAMESPACE)
        .unwrap()
        .fields
        .insert("other".into(), string_value("1"));
    let r = s.handle(with_metadata(
        modes(
            headers("/v1/completions", false, &[("x-request-id", "mm")]),
            BUFFERED,
            STREAMED,
        ),
        hint,
    ));
    assert_continue_headers(&r[0]);
    // Body: another key of the same namespace and another namespace.
    let mut more = metadata(SUBSET_NAMESPACE, "later", string_value("2"));
    more.filter_metadata.insert(
        "com.example".into(),
        Struct {
            fields: HashMap::from([("k".to_string(), string_value("v"))]),
        },
    );
    let r = s.handle(with_metadata(
        body(&completion("m", &long_prompt("mm")), true),
        more,
    ));
    // The hint from the headers message still restricts the pick.
    assert_eq!(pick_set(&r), HashSet::from([addr(18002), addr(18003)]));
    let ns = &s.metadata[SUBSET_NAMESPACE].fields;
    assert!(ns.contains_key(SUBSET_KEY) && ns.contains_key("other") && ns.contains_key("later"));
    assert!(s.metadata.contains_key("com.example"));

    // Response phase: the served key arrives in a third message; later values win.
    s.handle(with_metadata(
        response_headers(200, None),
        metadata(LB_NAMESPACE, SERVED_KEY, string_value("127.0.0.1:18003")),
    ));
    assert_eq!(
        s.metadata[SUBSET_NAMESPACE].fields["other"],
        string_value("1")
    );
    s.handle(with_metadata(
        response_body(b"", true),
        metadata(SUBSET_NAMESPACE, "other", string_value("3")),
    ));
    assert_eq!(
        s.metadata[SUBSET_NAMESPACE].fields["other"],
        string_value("3")
    );
    assert!(s.metadata[SUBSET_NAMESPACE].fields.contains_key(SUBSET_KEY));
    assert!(entries(&router, addr(18003)) > 0);
    assert_eq!(total_entries(&router), entries(&router, addr(18003)));
}

#[test]
fn subset_hint_arriving_on_the_body_message_is_honoured() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(with_metadata(
        body(&completion("m", "hi"), true),
        subset_hint(list_value(&["127.0.0.1:18001"])),
    ));
    assert_eq!(pick_set(&r), HashSet::from([addr(18001)]));
}

#[test]
fn destination_lists_primary_then_fallbacks() {
    let router = router();
    let ranked: Vec<_> = PORTS
        .iter()
        .rev()
        .map(|&p| endpoint(&router, addr(p)))
        .collect();
    assert_eq!(
        destination(&ranked),
        "127.0.0.1:18003,127.0.0.1:18002,127.0.0.1:18001"
    );
    let routed = router
        .explain(
            "/v1/completions",
            Some(br#"{"model":"m","prompt":"x"}"#),
            None,
        )
        .unwrap();
    let d = destination(&routed.decision.ranked);
    assert_eq!(d.split(',').count(), 3);
    assert!(d.starts_with(&routed.decision.primary().host));
}
