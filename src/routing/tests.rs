//! Routing semantics at [`Router::route`] and [`Router::explain`]: which pods a request may go
//! to, which requests fail and how, what explain leaves alone. The wire (how Envoy carries a
//! hint or an error) is tested in the Envoy adapter.

use prometheus::proto::MetricType;

use super::*;
use crate::config::PickerConfig;
use crate::testing::{router, router_from_config, router_with, spec, three};

/// Samples of every series in `registry` (counts for histograms), by family name; the
/// `process_*` families (open files, CPU, memory) are left out: other tests running in the same
/// process move them.
fn samples(registry: &prometheus::Registry) -> Vec<(String, f64)> {
    registry
        .gather()
        .iter()
        .filter(|f| !f.name().starts_with("process_"))
        .flat_map(|f| {
            f.get_metric().iter().map(|m| {
                let v = match f.get_field_type() {
                    MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                    MetricType::COUNTER => m.get_counter().get_value(),
                    _ => m.get_gauge().get_value(),
                };
                (f.name().to_string(), v)
            })
        })
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

#[test]
fn explain_changes_no_state_and_counts_nothing() {
    let registry = prometheus::Registry::new();
    let router = router_from_config("picker: {affinity: {}}\n", three(), &registry);
    let body = br#"{"model": "m", "prompt": "an explained prompt, long enough for a block or two of hashes"}"#;
    let before = samples(&registry);
    let explained = router.explain("/v1/completions", Some(body), None).unwrap();
    assert_eq!(samples(&registry), before, "explain counts nothing");
    assert_eq!(router.scheduler.tentative().holds(), 0);
    let routed = router.route("/v1/completions", Some(body), None).unwrap();
    assert_eq!(
        routed.decision.primary().label,
        explained.decision.primary().label,
        "explain shows the next decision"
    );
    assert_eq!(router.scheduler.tentative().holds(), 1);
    let counted: Vec<String> = samples(&registry).into_iter().map(|(n, _)| n).collect();
    for family in [
        "kthena_router_scheduler_plugin_duration_seconds",
        "kthena_router_prefix_cache_match_ratio",
        "prefix_picker_decisions_total",
        "prefix_picker_decision_duration_seconds",
        "prefix_picker_pod_picks_total",
    ] {
        assert!(
            counted.iter().any(|n| n == family),
            "{family} in {counted:?}"
        );
    }
}

#[test]
fn a_client_naming_a_new_model_every_request_cannot_grow_the_model_label() {
    use crate::metrics::model_labels::{MAX_MODELS, OTHER_MODEL};
    let registry = prometheus::Registry::new();
    // Pods that list no models serve any: every model a client names is routed and counted.
    let router = router_from_config("picker: {affinity: {}}\n", three(), &registry);
    for i in 0..MAX_MODELS + 50 {
        let body = format!(
            r#"{{"model": "client-{i}", "prompt": "a prompt long enough for a block or two"}}"#
        );
        let routed = router.route("/v1/completions", Some(body.as_bytes()), None);
        assert!(routed.is_ok());
    }
    let models: std::collections::BTreeSet<String> = registry
        .gather()
        .iter()
        .filter(|f| f.name() == "kthena_router_prefix_cache_match_ratio")
        .flat_map(|f| f.get_metric().iter())
        .flat_map(|m| m.get_label().iter())
        .filter(|l| l.name() == "model")
        .map(|l| l.value().to_string())
        .collect();
    assert_eq!(
        models.len(),
        MAX_MODELS + 1,
        "the first {MAX_MODELS} and one more"
    );
    assert!(models.contains("client-0") && models.contains(OTHER_MODEL));
    assert!(!models.contains(&format!("client-{}", MAX_MODELS + 1)));
}

#[test]
fn failure_body_is_openai_shaped() {
    let f = RouteFailure::new(400, "invalid_request_error", "bad");
    let v: serde_json::Value = serde_json::from_slice(&f.body()).unwrap();
    assert_eq!(v["error"]["message"], "bad");
    assert_eq!(v["error"]["code"], 400);
}

const PROMPT: &[u8] =
    br#"{"model": "m", "prompt": "a prompt long enough for a block of hashes or two"}"#;

fn status(r: Result<Routed, RouteFailure>) -> u16 {
    r.map(|_| 200).unwrap_or_else(|f| f.status)
}

#[test]
fn failures_by_request_and_pod_set() {
    let listing = || {
        router_with(
            PickerConfig::default(),
            vec![spec("a", 18001, &["m"]), spec("b", 18002, &["x"])],
        )
    };
    let none = || router_with(PickerConfig::default(), vec![]);
    let only = |s: &str| AddressPattern::parse_list(s);
    type Case<'a> = (
        &'a str,
        Arc<Router>,
        &'a str,
        Option<&'a [u8]>,
        Option<Vec<AddressPattern>>,
        u16,
    );
    let cases: Vec<Case> = vec![
        (
            "routed",
            router(),
            "/v1/completions",
            Some(PROMPT),
            None,
            200,
        ),
        ("no body", router(), "/v1/completions", None, None, 400),
        (
            "not JSON",
            router(),
            "/v1/completions",
            Some(b"{"),
            None,
            400,
        ),
        (
            "no model",
            router(),
            "/v1/completions",
            Some(br#"{"prompt": "x"}"#),
            None,
            400,
        ),
        (
            "unknown model",
            listing(),
            "/v1/completions",
            Some(br#"{"model": "n", "prompt": "x"}"#),
            None,
            404,
        ),
        (
            "listed model",
            listing(),
            "/v1/completions",
            Some(PROMPT),
            None,
            200,
        ),
        (
            "no pods",
            none(),
            "/v1/completions",
            Some(PROMPT),
            None,
            503,
        ),
        (
            "no pods, unknown API",
            none(),
            "/v1/models",
            None,
            None,
            503,
        ),
        (
            "empty restriction",
            router(),
            "/v1/completions",
            Some(PROMPT),
            Some(vec![]),
            503,
        ),
        (
            "restriction naming no pod",
            router(),
            "/v1/completions",
            Some(PROMPT),
            Some(only("10.9.9.9")),
            503,
        ),
        (
            "restriction, unknown API",
            router(),
            "/v1/models",
            None,
            Some(only("10.9.9.9")),
            503,
        ),
        // The model is checked before the restriction.
        (
            "unknown model, restricted",
            listing(),
            "/v1/completions",
            Some(br#"{"model": "n", "prompt": "x"}"#),
            Some(only("10.9.9.9")),
            404,
        ),
    ];
    for (name, router, path, body, restrict, want) in cases {
        let got = status(router.route(path, body, restrict.as_deref()));
        assert_eq!(got, want, "{name}");
        let explained = router.explain(path, body, restrict.as_deref());
        assert_eq!(
            explained.map(|_| 200).unwrap_or_else(|f| f.status),
            want,
            "{name} (explain)"
        );
    }
}

#[test]
fn a_restriction_keeps_the_pods_its_patterns_name() {
    let router = router();
    for (patterns, allowed) in [
        ("127.0.0.1:18002", vec![18002]),
        ("127.0.0.1:18002,127.0.0.1:18003", vec![18002, 18003]),
        ("127.0.0.1", vec![18001, 18002, 18003]),
        ("127.0.0.1:18003, 10.0.0.1", vec![18003]),
    ] {
        let restrict = AddressPattern::parse_list(patterns);
        for path in ["/v1/completions", "/v1/models"] {
            let body = (path != "/v1/models").then_some(PROMPT);
            let routed = router.route(path, body, Some(&restrict)).unwrap();
            let picked: Vec<u16> = routed
                .decision
                .ranked
                .iter()
                .map(|e| e.spec.address.port())
                .collect();
            assert!(
                picked.iter().all(|p| allowed.contains(p)) && picked.len() == allowed.len(),
                "{patterns} on {path}: {picked:?}"
            );
        }
    }
}

#[test]
fn unknown_apis_and_missing_paths_go_by_load_unscored() {
    let router = router();
    for (path, body, unscored) in [
        ("/v1/models", None, Unscored::UnknownApi),
        ("/v1/models", Some(PROMPT), Unscored::UnknownApi),
        ("", Some(PROMPT), Unscored::NoRequestPath),
    ] {
        let routed = router.route(path, body, None).unwrap();
        assert_eq!(routed.decision.unscored, Some(unscored), "{path:?}");
        assert!(routed.ticket.hashes.is_empty());
        assert_eq!(routed.ticket.model, "");
    }
    let routed = router.route("/v1/completions", Some(PROMPT), None).unwrap();
    assert_eq!(routed.decision.unscored, None);
    assert_eq!(routed.ticket.model, "m");
    assert!(
        !routed.ticket.hashes.is_empty(),
        "the hashes move into the ticket"
    );
    assert!(routed.decision.hashes.is_empty());
}

#[test]
fn a_ticket_holds_the_primary_in_flight_until_it_ends() {
    let router = router();
    let routed = router.route("/v1/completions", Some(PROMPT), None).unwrap();
    let primary = routed.ticket.primary().clone();
    assert_eq!(primary.spec.address, routed.decision.primary().spec.address);
    assert_eq!(primary.inflight(), 1);
    router.complete(routed.ticket, Ending::Aborted);
    assert_eq!(primary.inflight(), 0);
    let dropped = router.route("/v1/completions", Some(PROMPT), None).unwrap();
    let primary = dropped.ticket.primary().clone();
    assert_eq!(primary.inflight(), 1);
    drop(dropped);
    assert_eq!(
        primary.inflight(),
        0,
        "a dropped ticket releases its count too"
    );
}

fn session_outcomes(router: &Router) -> [u64; 3] {
    SessionOutcome::ALL.map(|o| {
        router
            .metrics
            .session_requests
            .with_label_values(&[o.as_str()])
            .get()
    })
}

/// Session affinity and the explanation work for Anthropic Messages requests as for chat: the
/// session header keeps unrelated turns on the session's pod, and `explain` decides as `route`.
#[test]
fn a_messages_session_stays_on_its_pod_and_explains_alike() {
    let registry = prometheus::Registry::new();
    let router = router_from_config(
        "picker:\n  affinity: {podCapacity: 4, latencyModel: false}\n  sessions: {enabled: true}\n",
        three(),
        &registry,
    );
    let body = |turn: usize| {
        serde_json::to_vec(&serde_json::json!({"model": "m", "max_tokens": 4,
            "system": [{"type": "text", "text": format!("turn {turn}: {}", "unrelated words ".repeat(turn + 8))}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}))
        .unwrap()
    };
    let first = router
        .route_in_session("/v1/messages", Some(&body(0)), None, Some(b"s-1"))
        .unwrap();
    assert!(
        first.decision.unscored.is_none(),
        "a Messages body is scored"
    );
    let pod = first.decision.primary().spec.address;
    drop(first);
    for turn in 1..6 {
        let explained = router
            .explain("/v1/messages", Some(&body(turn)), None)
            .unwrap();
        assert!(explained.decision.unscored.is_none());
        let r = router
            .route_in_session("/v1/messages", Some(&body(turn)), None, Some(b"s-1"))
            .unwrap();
        assert_eq!(r.decision.reason, DecisionReason::Session, "turn {turn}");
        assert_eq!(r.decision.primary().spec.address, pod);
    }
}

/// Session affinity at `route`: ten turns with unrelated prompts stay on the session's pod
/// (affinity alone would spread them by share), the turns are still recorded, a fallback that
/// served moves the session, and a saturated pod gives the session up.
#[test]
fn a_session_stays_on_its_pod_until_it_is_saturated() {
    let registry = prometheus::Registry::new();
    let router = router_from_config(
        "picker:\n  affinity: {podCapacity: 4, latencyModel: false}\n  sessions: {enabled: true}\n",
        three(),
        &registry,
    );
    let body = |turn: usize| {
        format!(
            r#"{{"model": "m", "prompt": "turn {turn}: {}"}}"#,
            "unrelated words ".repeat(turn + 8)
        )
    };
    let route = |turn: usize, session: &str| {
        router
            .route_in_session(
                "/v1/completions",
                Some(body(turn).as_bytes()),
                None,
                Some(session.as_bytes()),
            )
            .unwrap()
    };
    let complete = |routed: Routed, served: Served| {
        router.complete(
            routed.ticket,
            Ending::Completed {
                status: Some(200),
                served,
                cached_tokens: None,
                first_byte: None,
                events: None,
            },
        )
    };
    let first = route(0, "s-1");
    let pod = first.decision.primary().clone();
    complete(first, Served::NotReported);
    for turn in 1..10 {
        let r = route(turn, "s-1");
        assert_eq!(r.decision.reason, DecisionReason::Session, "turn {turn}");
        assert_eq!(r.decision.primary().spec.address, pod.spec.address);
        complete(r, Served::NotReported);
    }
    assert_eq!(session_outcomes(&router), [9, 0, 1]);
    assert_eq!(crate::testing::records(&router, "recorded"), 10);
    // Without the header, the same turn goes by affinity alone (another pod, by share).
    let plain = router
        .route("/v1/completions", Some(body(10).as_bytes()), None)
        .unwrap();
    assert_ne!(plain.decision.primary().spec.address, pod.spec.address);
    drop(plain);
    // Envoy fell back: the session follows the pod that served.
    let r = route(11, "s-1");
    let other = router
        .endpoints
        .snapshot()
        .candidates(None, None)
        .unwrap()
        .iter()
        .find(|e| e.spec.address != pod.spec.address)
        .unwrap()
        .clone();
    complete(r, Served::Pod(other.clone()));
    let r = route(12, "s-1");
    assert_eq!(r.decision.primary().spec.address, other.spec.address);
    // Saturated (in flight at podCapacity, this request's own ticket included): moved.
    let held: Vec<Routed> = (0..3).map(|t| route(20 + t, "s-1")).collect();
    assert!(
        held.iter()
            .all(|h| h.decision.primary().spec.address == other.spec.address)
    );
    let moved = route(30, "s-1");
    assert_ne!(moved.decision.primary().spec.address, other.spec.address);
    assert_ne!(moved.decision.reason, DecisionReason::Session);
    let [kept, was_moved, new] = session_outcomes(&router);
    assert_eq!((was_moved, new), (1, 1), "kept {kept}");
    assert_eq!(router.metrics.sessions.get(), 1);
}

#[test]
fn sessions_are_off_unless_enabled() {
    let registry = prometheus::Registry::new();
    let router = router_from_config("picker: {affinity: {}}\n", three(), &registry);
    assert!(router.sessions.is_none());
    let body = br#"{"model": "m", "prompt": "a prompt"}"#;
    let r = router
        .route_in_session("/v1/completions", Some(body), None, Some(b"s"))
        .unwrap();
    assert_eq!(r.ticket.session, None);
    assert_eq!(session_outcomes(&router), [0, 0, 0]);
}

/// The affinity mode hashes the request's tools (and tool calls, non-text parts) with the
/// prompt; Kthena's mode hashes Kthena's rendering, which has none of them.
#[test]
fn only_the_affinity_mode_hashes_tools() {
    let body = |tool: &str| {
        format!(
            r#"{{"model":"m","tools":[{{"type":"function","function":{{"name":"{tool}"}}}}],
            "messages":[{{"role":"user","content":"a prompt long enough for a block of hashes"}}]}}"#
        )
    };
    let hashes = |router: &Router, tool: &str| {
        let explained = router.explain("/v1/chat/completions", Some(body(tool).as_bytes()), None);
        explained.unwrap().decision.hashes
    };
    let registry = prometheus::Registry::new();
    let affinity = router_from_config("picker: {affinity: {}}\n", three(), &registry);
    let (a, b) = (hashes(&affinity, "search"), hashes(&affinity, "browse"));
    assert!(!a.is_empty());
    assert!(a.iter().all(|h| !b.contains(h)), "every block differs");
    let kthena = router();
    let (a, b) = (hashes(&kthena, "search"), hashes(&kthena, "browse"));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

#[test]
fn a_session_request_is_kept_only_when_its_pod_was_the_reason() {
    let on_pod = SessionPod::Candidate(crate::prefix_index::PodSlot(3));
    let outcome = SessionPod::outcome;
    assert_eq!(
        outcome(on_pod, DecisionReason::Session),
        SessionOutcome::Kept
    );
    assert_eq!(
        outcome(on_pod, DecisionReason::PrefixHit),
        SessionOutcome::Moved
    );
    assert_eq!(
        outcome(SessionPod::NotCandidate, DecisionReason::Session),
        SessionOutcome::Moved
    );
    assert_eq!(
        outcome(SessionPod::New, DecisionReason::PrefixMiss),
        SessionOutcome::New
    );
}
