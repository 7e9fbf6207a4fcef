//! `flowControl` as llm-d reads it, and what it sets in `picker.flowControl`.

use super::{duration, quantity};
use crate::config::Config;
use serde_yaml_ng::Value as Yaml;

/// llm-d's default profile with `gates`, `extra` plugins, `flow` as its `flowControl` and
/// `picker` (prefix-picker's own section).
fn doc(gates: &str, extra: &str, flow: &str, picker: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: {gates}
plugins:
- type: queue-scorer
{extra}flowControl: {flow}
endpoints:
- {{name: a, address: 10.0.0.1:8000}}
{picker}"
    )
}

#[test]
fn quantities_and_durations_read_as_kubernetes_and_go_write_them() {
    let q = |v: &str| quantity(&serde_yaml_ng::from_str::<Yaml>(v).unwrap(), "maxBytes");
    assert_eq!(q("100"), Ok(Some(100)));
    assert_eq!(q("'1k'"), Ok(Some(1000)));
    assert_eq!(q("1Gi"), Ok(Some(1 << 30)));
    assert_eq!(q("500M"), Ok(Some(500_000_000)));
    assert_eq!(q("1.5Ki"), Ok(Some(1536)));
    assert_eq!(q("0"), Ok(None), "0 is not set");
    assert!(q("-1").is_err());
    assert!(q("12 apples").unwrap_err().contains("flowControl.maxBytes"));
    assert_eq!(duration("60s", "d"), Ok(60.0));
    assert_eq!(duration("1m30s", "d"), Ok(90.0));
    assert_eq!(duration("1h", "d"), Ok(3600.0));
    assert_eq!(duration("0", "d"), Ok(0.0));
    assert!((duration("250ms", "d").unwrap() - 0.25).abs() < 1e-12);
    assert!(duration("60", "d").unwrap_err().contains("flowControl.d"));
    assert!(duration("1x", "d").is_err());
}

#[test]
fn with_its_feature_gate_the_section_sets_picker_flow_control() {
    // Bounds, TTL, a band naming only a priority, llm-d's own policies by type.
    let c = Config::parse(&doc(
        "[flowControl]",
        "",
        "{maxRequests: 2k, maxBytes: 64Mi, defaultRequestTTL: 45s, priorityBands: [{priority: 10, orderingPolicyRef: fcfs-ordering-policy}, {priority: -1}]}",
        "",
    ))
    .unwrap();
    let f = &c.picker.flow_control;
    assert_eq!(f.enabled, Some(true));
    assert!(f.active, "on with the gate, outside the affinity mode");
    assert_eq!((f.max_requests, f.max_bytes), (2000, 64 << 20));
    assert_eq!(f.request_ttl_seconds, 45.0);
    assert_eq!(f.message_timeout_seconds, 50.0, "Envoy waits past the TTL");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("global-strict-fairness-policy")),
        "{:?}",
        c.warnings
    );

    // Left out: llm-d's defaults (a band's 5000 requests and 1G bytes, 60s).
    let c = Config::parse(&doc("[flowControl]", "", "{}", "")).unwrap();
    let f = &c.picker.flow_control;
    assert_eq!((f.max_requests, f.max_bytes), (5000, 1_000_000_000));
    assert_eq!(
        (f.request_ttl_seconds, f.message_timeout_seconds),
        (60.0, 65.0)
    );

    // program-aware-fairness: least attained service, its half-life ours.
    let c = Config::parse(&doc(
        "[flowControl]",
        "- {type: program-aware-fairness, name: las, parameters: {lasHalfLifeSeconds: 30, lasWeightHeadWait: 0}}\n",
        "{priorityBands: [{priority: 0, fairnessPolicyRef: las}]}",
        "",
    ))
    .unwrap();
    assert_eq!(c.picker.flow_control.half_life_seconds, 30.0);
    assert!(
        !c.warnings.iter().any(|w| w.contains("global-strict")),
        "{:?}",
        c.warnings
    );

    // The picker's own keys the section does not set stay theirs.
    let c = Config::parse(&doc(
        "[flowControl]",
        "",
        "{maxRequests: 10}",
        "picker:\n  flowControl: {retryAfterSeconds: 3, messageTimeoutSeconds: 20}\n",
    ))
    .unwrap();
    let f = &c.picker.flow_control;
    assert_eq!((f.max_requests, f.retry_after_seconds), (10, 3));
    assert_eq!(
        f.message_timeout_seconds, 20.0,
        "written: kept (and warned about)"
    );
}

#[test]
fn without_its_feature_gate_the_section_is_ignored_as_llm_d_does() {
    for gates in ["[]", "['flowControl=false']"] {
        let c = Config::parse(&doc(gates, "", "{maxRequests: 10}", "")).unwrap();
        assert_eq!(c.picker.flow_control.enabled, None);
        assert_eq!(c.picker.flow_control.max_requests, 5000);
        assert!(
            !c.picker.flow_control.active,
            "off outside the affinity mode"
        );
        assert!(
            c.warnings.iter().any(|w| w.contains("feature gate is not")),
            "{:?}",
            c.warnings
        );
    }
}

#[test]
fn fields_without_a_counterpart_are_refused_naming_them() {
    let program_aware = "- {type: program-aware-fairness, name: pa, parameters: {lasWeightHeadWait: 0.5}}\n- {type: round-robin-fairness-policy, name: rr}\n- {type: edf-ordering-policy}\n- {type: priority-holdback-policy, name: hold}\n";
    for (flow, says) in [
        (
            "{priorityBands: [{priority: 1, maxRequests: 10}]}",
            "flowControl.priorityBands[0].maxRequests has no counterpart",
        ),
        (
            "{defaultPriorityBand: {maxBytes: 1Gi}}",
            "flowControl.defaultPriorityBand.maxBytes",
        ),
        (
            "{priorityBands: [{priority: 1, fairnessPolicyRef: rr}]}",
            "fairnessPolicyRef \"rr\" (round-robin-fairness-policy)",
        ),
        (
            "{priorityBands: [{priority: 1, fairnessPolicyRef: pa}]}",
            "lasWeightHeadWait 0.5",
        ),
        (
            "{priorityBands: [{priority: 1, orderingPolicyRef: edf-ordering-policy}]}",
            "orderingPolicyRef \"edf-ordering-policy\"",
        ),
        (
            "{priorityBands: [{priority: 1, orderingPolicyRef: nope}]}",
            "\"nope\" names no plugin",
        ),
        (
            "{noEndpointRequestTTL: 5m}",
            "flowControl.noEndpointRequestTTL",
        ),
        ("{defaultRequestTTL: 0s}", "defaultRequestTTL 0s"),
        ("{enableEviction: true}", "flowControl.enableEviction"),
        (
            "{usageLimitPolicyPluginRef: hold}",
            "usageLimitPolicyPluginRef \"hold\" (priority-holdback-policy)",
        ),
        ("{maxRequest: 10}", "unknown field `maxRequest`"),
    ] {
        let e = Config::parse(&doc("[flowControl]", program_aware, flow, ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{flow}: {e}");
        assert!(e.contains("(line 10)"), "the section's line: {e}");
    }
    // A key given both ways.
    let e = Config::parse(&doc(
        "[flowControl]",
        "",
        "{maxRequests: 10}",
        "picker:\n  flowControl: {maxRequests: 20}\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(
            "flowControl.maxRequests: set by the EndpointPickerConfig's flowControl.maxRequests too"
        ),
        "{e}"
    );
}
