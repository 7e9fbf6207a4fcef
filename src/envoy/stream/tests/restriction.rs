//! The subset hint and the conformance test header, as read from the wire.

use super::*;

// Subset hint and the conformance header

/// What a request may be routed to, given the subset hint and the conformance test header.
enum Allowed {
    /// Exactly these ports.
    Pods(&'static [u16]),
    /// A 503 whose message contains this (`None`: any message).
    Refused(Option<&'static str>),
}

/// One row: a subset hint in the headers message's metadata and/or the test selection header,
/// through the default router or one that honours the header.
struct Restriction {
    name: &'static str,
    header_enabled: bool,
    hint: Option<Value>,
    header: Option<&'static str>,
    allowed: Allowed,
}

#[test]
fn subset_hint_and_test_selection_restrict_the_pick() {
    use Allowed::{Pods, Refused};
    let number = Value {
        kind: Some(Kind::NumberValue(3.0)),
    };
    let row = |name, header_enabled, hint: Option<Value>, header, allowed| Restriction {
        name,
        header_enabled,
        hint,
        header,
        allowed,
    };
    let list = |items: &[&str]| Some(list_value(items));
    let string = |s: &str| Some(string_value(s));
    #[rustfmt::skip]
    let rows = [
        // The subset hint as a list, as a comma string; a bare IP matches every port.
        row("list hint of two", false, list(&["127.0.0.1:18001", "127.0.0.1:18003"]), None, Pods(&[18001, 18003])),
        row("list hint of one", false, list(&["127.0.0.1:18002"]), None, Pods(&[18002])),
        row("comma-string hint", false, string("127.0.0.1:18002, 127.0.0.1:18003"), None, Pods(&[18002, 18003])),
        row("bare-IP string hint", false, string("127.0.0.1"), None, Pods(&[18001, 18002, 18003])),
        // An empty or unusable hint, or one listing only pods that are not ours: nothing eligible.
        row("empty list hint", false, list(&[]), None, Refused(Some("subset"))),
        row("empty string hint", false, string(""), None, Refused(Some("subset"))),
        row("hint that is not an address", false, list(&["not-an-address"]), None, Refused(Some("subset"))),
        row("hint that is a number", false, Some(number), None, Refused(Some("subset"))),
        row("hint listing another pod", false, list(&["10.9.9.9:80"]), None, Refused(Some("subset"))),
        // The conformance test header: ignored unless enabled.
        row("test header, not enabled", false, None, Some("127.0.0.1:18002"), Pods(&[18001, 18002, 18003])),
        row("test header of one", true, None, Some("127.0.0.1:18002"), Pods(&[18002])),
        row("test header of two", true, None, Some("127.0.0.1:18001,127.0.0.1:18003"), Pods(&[18001, 18003])),
        row("bare-IP test header", true, None, Some("127.0.0.1"), Pods(&[18001, 18002, 18003])),
        row("test header listing another pod", true, None, Some("10.1.1.1:80"), Refused(None)),
        // Both: intersected, a bare IP on either side meaning any port.
        row("test header and list hint", true, list(&["127.0.0.1:18001", "127.0.0.1:18002"]), Some("127.0.0.1:18002,127.0.0.1:18003"), Pods(&[18002])),
        row("bare-IP test header and a port-specific hint", true, list(&["127.0.0.1:18001", "127.0.0.1:18002"]), Some("127.0.0.1"), Pods(&[18001, 18002])),
        row("bare-IP hint and a port-specific test header", true, string("127.0.0.1"), Some("127.0.0.1:18002"), Pods(&[18002])),
    ];
    for Restriction {
        name,
        header_enabled,
        hint,
        header,
        allowed,
    } in rows
    {
        let router = if header_enabled {
            test_selection_router()
        } else {
            router()
        };
        let extra: Vec<_> = header
            .map(|h| (TEST_SELECTION_HEADER, h))
            .into_iter()
            .collect();
        // Several times: the pick's random tie-breaking never leaves the allowed set.
        for _ in 0..10 {
            let r = route_with_hint(&router, hint.clone().map(subset_hint), &extra);
            match allowed {
                Pods(ports) => {
                    assert_eq!(r.len(), 1, "{name}: {r:?}");
                    let want: HashSet<_> = ports.iter().map(|&p| addr(p)).collect();
                    assert_eq!(pick_set(&r), want, "{name}");
                }
                Refused(contains) => {
                    assert_eq!(r.len(), 1, "{name}: {r:?}");
                    assert!(
                        matches!(r[0].response, Some(Out::ImmediateResponse(_))),
                        "{name}: {r:?}"
                    );
                    assert_eq!(immediate_of(&r[0]).0, 503, "{name}");
                    let msg = assert_error(&r, 503);
                    if let Some(part) = contains {
                        assert!(msg.contains(part), "{name}: {msg}");
                    }
                    assert_eq!(inflight(&router), [0, 0, 0], "{name}");
                }
            }
        }
    }
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

/// (Its pick is a row of the table above.)
#[test]
fn test_selection_header_is_ignored_unless_enabled() {
    let router = router();
    // No conformance echo either.
    let mut s = StreamState::new(router.clone());
    s.handle(modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED));
    let r = s.handle(response_headers(200, Some("127.0.0.1:18002")));
    assert_eq!(set_header_of(&r[0], CONFORMANCE_SERVED_HEADER), None);
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
