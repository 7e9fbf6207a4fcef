//! Prefill/decode mode through the stream: the prefiller header (set to the paired prefill pod,
//! a client's always stripped), the pick among decode pods only, and the completion recording
//! (and, with the affinity mode's tentative records, holding and releasing) both pods.

use super::*;

/// d0 and d1 decode pods of group `a`, p0 its prefill pod (ports 18001, 18002, 18003).
fn pd_pods() -> Vec<EndpointSpec> {
    let labelled = |name: &str, port: u16, role: &str| EndpointSpec {
        labels: [("role", role), ("group", "a")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..spec(name, port, &[])
    };
    vec![
        labelled("d0", PORTS[0], "decode"),
        labelled("d1", PORTS[1], "decode"),
        labelled("p0", PORTS[2], "prefill"),
    ]
}

const PD_GROUP: &str =
    "pdGroup: {groupKey: group, prefillLabels: {role: prefill}, decodeLabels: {role: decode}}\n";

fn pd_router(extra: &str) -> Arc<Router> {
    let registry = prometheus::Registry::new();
    Arc::new(router_from_config(
        &format!("{PD_GROUP}{extra}"),
        pd_pods(),
        &registry,
    ))
}

const PREFILL: u16 = PORTS[2];

/// The header names the reply removes.
fn removed(r: &ProcessingResponse) -> Vec<String> {
    common(r)
        .and_then(|c| c.header_mutation.as_ref())
        .map(|m| m.remove_headers.clone())
        .unwrap_or_default()
}

struct Row {
    name: &'static str,
    pd: bool,
    /// A client-supplied `x-prefiller-host-port`.
    client: Option<&'static str>,
    request_mode: i32,
}

#[test]
fn the_prefiller_header_is_the_picked_prefill_pod_and_a_clients_never_passes() {
    let rows = [
        Row {
            name: "pd, buffered, no client header",
            pd: true,
            client: None,
            request_mode: BUFFERED,
        },
        Row {
            name: "pd, buffered, client header overwritten",
            pd: true,
            client: Some("6.6.6.6:6666"),
            request_mode: BUFFERED,
        },
        Row {
            name: "pd, full duplex, client header overwritten",
            pd: true,
            client: Some("6.6.6.6:6666"),
            request_mode: FULL_DUPLEX,
        },
        Row {
            name: "aggregated, buffered, client header stripped",
            pd: false,
            client: Some("6.6.6.6:6666"),
            request_mode: BUFFERED,
        },
        Row {
            name: "aggregated, full duplex, stripped without a client header too",
            pd: false,
            client: None,
            request_mode: FULL_DUPLEX,
        },
    ];
    for row in rows {
        let name = row.name;
        let router = if row.pd { pd_router("") } else { router() };
        let mut s = StreamState::new(router.clone());
        let extra: Vec<(&str, &str)> = row
            .client
            .map(|v| (PREFILLER_HEADER, v))
            .into_iter()
            .collect();
        let r = s.handle(modes(
            headers("/v1/completions", false, &extra),
            row.request_mode,
            STREAMED,
        ));
        let first = r.len();
        let r2 = s.handle(body(&completion("m", &long_prompt(name)), true));
        // BUFFERED: the pick rides on the body reply; FULL_DUPLEX: on the held headers reply.
        let reply = if row.request_mode == BUFFERED {
            assert_eq!(first, 1, "{name}");
            &r2[0]
        } else {
            assert_eq!(first, 0, "{name}");
            assert!(is_request_headers(&r2[0]), "{name}");
            &r2[0]
        };
        let pick = pick_of(reply);
        let header = set_header_of(reply, PREFILLER_HEADER);
        if row.pd {
            let (value, action) = header.unwrap_or_else(|| panic!("{name}: header set"));
            assert_eq!(value, addr(PREFILL).to_string(), "{name}");
            assert_eq!(
                action,
                HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                "{name}: every client value replaced"
            );
            assert!(!pick.contains(&addr(PREFILL)), "{name}: decode pods only");
            assert_eq!(pick.len(), 2, "{name}: both decode pods of the group");
            assert_eq!(endpoint(&router, addr(PREFILL)).inflight(), 1, "{name}");
        } else {
            assert_eq!(header, None, "{name}");
            assert_eq!(removed(reply), [PREFILLER_HEADER], "{name}");
        }
        s.finish();
        assert_eq!(inflight(&router), [0, 0, 0], "{name}: counts released");
    }
}

#[test]
fn no_pair_is_a_503_with_kthenas_text() {
    let no_prefill: Vec<_> = pd_pods().into_iter().take(2).collect();
    let prefill_only: Vec<_> = pd_pods().into_iter().skip(2).collect();
    for (pods, expected) in [
        (no_prefill, "no valid prefill-decode pod pairs found"),
        (prefill_only, "no decode pod found"),
    ] {
        let registry = prometheus::Registry::new();
        let router = Arc::new(router_from_config(PD_GROUP, pods, &registry));
        let mut s = StreamState::new(router.clone());
        s.handle(modes(
            headers("/v1/completions", false, &[]),
            BUFFERED,
            STREAMED,
        ));
        let r = s.handle(body(&completion("m", "x"), true));
        assert_eq!(assert_error(&r, 503), expected);
    }
}

/// Routes `prompt` on a PD router and ends the response with `status` from the pick's pod
/// `served` (an index in the pick); returns the pick.
fn serve(router: &Arc<Router>, prompt: &[u8], status: u32, served: usize) -> Vec<SocketAddr> {
    let (mut s, pick) = route_buffered(router, "pd", prompt, STREAMED);
    s.handle(response_headers(status, Some(&pick[served].to_string())));
    s.handle(response_body(b"done", true));
    s.finish();
    pick
}

#[test]
fn a_served_request_is_recorded_for_the_decode_pod_and_the_prefill_pod() {
    let router = pd_router("");
    let prompt = completion("m", &long_prompt("both"));
    // A failure records nothing, for either pod.
    serve(&router, &prompt, 500, 0);
    assert_eq!(total_entries(&router), 0);
    assert_eq!(records(&router, "failed"), 1);
    // Envoy fell back to the second decode pod: it and the prefill pod are recorded.
    let pick = serve(&router, &prompt, 200, 1);
    let per_pod = entries(&router, pick[1]);
    assert!(per_pod > 0);
    assert_eq!(entries(&router, addr(PREFILL)), per_pod, "same prompt");
    assert_eq!(entries(&router, pick[0]), 0, "not the primary");
    assert_eq!(total_entries(&router), 2 * per_pod);
    assert_eq!(records(&router, "recorded"), 1, "one route, one outcome");
    assert_eq!(inflight(&router), [0, 0, 0]);
    // The next identical request goes to the decode pod that served.
    let (_s, again) = route_buffered(&router, "again", &prompt, STREAMED);
    assert_eq!(again[0], pick[1]);
}

fn tentative(router: &Router, outcome: &str) -> u64 {
    router.metrics.tentative.with_label_values(&[outcome]).get()
}

#[test]
fn with_tentative_records_both_pods_are_held_then_confirmed_or_rolled_back() {
    let router = pd_router("picker: {affinity: {tentative: true}}\n");
    let holds = || router.scheduler.tentative().holds();
    let prompt = completion("m", &long_prompt("held"));

    let (mut s, pick) = route_buffered(&router, "one", &prompt, STREAMED);
    assert_eq!(holds(), 2, "held for the decode and the prefill pod");
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    s.handle(response_body(b"", true));
    assert_eq!(holds(), 0);
    assert_eq!(tentative(&router, "confirmed"), 2);
    assert!(entries(&router, addr(PREFILL)) > 0);

    let other = completion("m", &long_prompt("rolled back"));
    let (mut s, _) = route_buffered(&router, "two", &other, STREAMED);
    assert_eq!(holds(), 2);
    s.finish();
    assert_eq!(holds(), 0);
    assert_eq!(tentative(&router, "rolled_back"), 2);

    // A route left for the access log that never completes expires with both holds.
    let (_s, _) = route_buffered(&router, "three", &other, NONE);
    assert_eq!(holds(), 2);
    let expired = router
        .pending
        .expire(std::time::Instant::now() + std::time::Duration::from_secs(3600));
    assert_eq!((expired.routes, expired.tentative), (1, 2));
    assert_eq!(holds(), 0);
}
