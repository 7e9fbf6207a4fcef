//! The subset hint and the conformance test header, as read from the wire.

use super::*;

// Subset hint and the conformance header

#[test]
fn subset_hint_as_a_list_restricts_the_pick() {
    let router = router();
    for _ in 0..10 {
        let r = route_with_hint(
            &router,
            Some(subset_hint(list_value(&[
                "127.0.0.1:18001",
                "127.0.0.1:18003",
            ]))),
            &[],
        );
        assert_eq!(pick_set(&r), HashSet::from([addr(18001), addr(18003)]));
    }
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&["127.0.0.1:18002"]))),
        &[],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
}

#[test]
fn subset_hint_as_a_comma_string_restricts_the_pick() {
    let router = router();
    let r = route_with_hint(
        &router,
        Some(subset_hint(string_value(
            "127.0.0.1:18002, 127.0.0.1:18003",
        ))),
        &[],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002), addr(18003)]));
    // A bare IP matches every port.
    let r = route_with_hint(&router, Some(subset_hint(string_value("127.0.0.1"))), &[]);
    assert_eq!(pick_set(&r).len(), 3);
}

#[test]
fn subset_hint_applies_to_unknown_apis_too() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(with_metadata(
        modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED),
        subset_hint(list_value(&["127.0.0.1:18003"])),
    ));
    assert_eq!(pick_set(&r), HashSet::from([addr(18003)]));
}

#[test]
fn empty_or_unusable_subset_hint_is_503() {
    let router = router();
    for hint in [
        list_value(&[]),
        string_value(""),
        list_value(&["not-an-address"]),
        Value {
            kind: Some(Kind::NumberValue(3.0)),
        },
    ] {
        let r = route_with_hint(&router, Some(subset_hint(hint.clone())), &[]);
        let msg = assert_error(&r, 503);
        assert!(msg.contains("subset"), "{hint:?}: {msg}");
    }
    // Listed but not one of ours: nothing eligible.
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&["10.9.9.9:80"]))),
        &[],
    );
    let msg = assert_error(&r, 503);
    assert!(msg.contains("subset"), "{msg}");
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn test_selection_header_is_ignored_unless_enabled() {
    let router = router();
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1:18002")]);
    assert_eq!(pick_set(&r).len(), 3);
    // No conformance echo either.
    let mut s = StreamState::new(router.clone());
    s.handle(modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED));
    let r = s.handle(response_headers(200, Some("127.0.0.1:18002")));
    assert_eq!(set_header_of(&r[0], CONFORMANCE_SERVED_HEADER), None);
}

#[test]
fn test_selection_header_restricts_when_enabled() {
    let router = test_selection_router();
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1:18002")]);
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
    let r = route_with_hint(
        &router,
        None,
        &[(TEST_SELECTION_HEADER, "127.0.0.1:18001,127.0.0.1:18003")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18001), addr(18003)]));
    // Bare IP = any port.
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1")]);
    assert_eq!(pick_set(&r).len(), 3);
    // Intersected with the subset hint.
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&[
            "127.0.0.1:18001",
            "127.0.0.1:18002",
        ]))),
        &[(TEST_SELECTION_HEADER, "127.0.0.1:18002,127.0.0.1:18003")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
    // Nothing eligible.
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "10.1.1.1:80")]);
    assert_error(&r, 503);
}

#[test]
fn conformance_echoes_the_served_endpoint_when_enabled() {
    let router = test_selection_router();
    let (mut s, _) = route_buffered(&router, "echo", &completion("m", "hi"), STREAMED);
    let r = s.handle(response_headers(200, Some("127.0.0.1:18003")));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    let (v, action) = set_header_of(&r[0], CONFORMANCE_SERVED_HEADER).unwrap();
    assert_eq!(v, "127.0.0.1:18003");
    assert_eq!(action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
}
