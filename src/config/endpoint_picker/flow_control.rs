//! An `EndpointPickerConfig`'s `flowControl` section, mapped onto `picker.flowControl`
//! (docs/flow-control.md; the table in docs/migration.md).
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `apix/config/v1alpha1/endpointpickerconfig_types.go` (`FlowControlConfig`,
//! `PriorityBandConfig`, `SaturationDetectorConfig`), `pkg/epp/config/loader/flowcontrol.go`
//! and `configloader.go` (the section applies only with the `flowControl` feature gate, else it
//! is ignored with a warning; quantities of 0 are "not set"), `pkg/epp/flowcontrol/registry/
//! config.go` (defaults: `fcfs-ordering-policy`, `global-strict-fairness-policy`,
//! `static-usage-limit-policy`; a band's limits 5000 requests and 1G bytes), `pkg/epp/
//! flowcontrol/controller/config.go` (`defaultRequestTTL` 60s) and
//! `pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/plugin.go` (`lasHalfLifeSeconds`
//! 60, `lasWeightHeadWait` 0.2, `strategy` `las`).
//!
//! Mapped: the gate to `enabled: true`; `maxRequests` and `maxBytes` (Kubernetes quantities;
//! unset or 0: llm-d's band defaults, 5000 and 1G, the bound of the one band most deployments
//! use) to the queue's bounds; `defaultRequestTTL` (a Go duration, default 60s) to
//! `requestTtlSeconds`; bands that name only a `priority`; the policies this queue is:
//! `fcfs-ordering-policy` (arrival order within a flow), `program-aware-fairness` with strategy
//! `las` (least attained service, its `lasHalfLifeSeconds` the decay's `halfLifeSeconds`),
//! `static-usage-limit-policy` without a threshold below 1, the saturation detector (this
//! project's measure of room, docs/flow-control.md). Refused, naming the field: per-band
//! limits, other fairness or ordering policies, `noEndpointRequestTTL`, a TTL of 0 (no
//! eviction), `enableEviction: true`, another usage-limit policy.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

/// llm-d's feature gate for flow control (`pkg/epp/flowcontrol/config.go`).
pub const FEATURE_GATE: &str = "flowControl";

/// Flow-control policy plugin types (`plugins[]`) that a `flowControl` section references.
pub(super) const POLICY_TYPES: [&str; 12] = [
    "fcfs-ordering-policy",
    "edf-ordering-policy",
    "slo-deadline-ordering-policy",
    "global-strict-fairness-policy",
    "round-robin-fairness-policy",
    "program-aware-fairness",
    "static-usage-limit-policy",
    "priority-holdback-policy",
    "soft-reflective-ceiling-policy",
    "sheddable-eviction-filter",
    "priority-then-time-eviction-order-policy",
    "concurrency-detector",
];

/// What the section sets in `picker.flowControl`.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControlMapping {
    pub max_requests: usize,
    pub max_bytes: usize,
    pub request_ttl_seconds: f64,
    /// program-aware-fairness's `lasHalfLifeSeconds`, when a band names it.
    pub half_life_seconds: Option<f64>,
}

/// llm-d's band defaults and TTL.
const BAND_MAX_REQUESTS: usize = 5000;
const BAND_MAX_BYTES: usize = 1_000_000_000;
const DEFAULT_TTL_SECONDS: f64 = 60.0;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Section {
    max_bytes: Option<Yaml>,
    max_requests: Option<Yaml>,
    #[serde(rename = "defaultRequestTTL")]
    default_request_ttl: Option<String>,
    #[serde(rename = "noEndpointRequestTTL")]
    no_endpoint_request_ttl: Option<String>,
    default_priority_band: Option<Band>,
    default_negative_priority_band: Option<Band>,
    #[serde(default)]
    priority_bands: Vec<Band>,
    usage_limit_policy_plugin_ref: Option<String>,
    saturation_detector: Option<Detector>,
    #[serde(default)]
    enable_eviction: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Band {
    #[serde(default)]
    priority: i64,
    max_bytes: Option<Yaml>,
    max_requests: Option<Yaml>,
    fairness_policy_ref: Option<String>,
    ordering_policy_ref: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Detector {
    plugin_ref: Option<String>,
}

/// program-aware-fairness's parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProgramAware {
    strategy: Option<String>,
    eviction_ttl_seconds: Option<f64>,
    eviction_sweep_seconds: Option<f64>,
    las_weight_service: Option<f64>,
    las_weight_head_wait: Option<f64>,
    las_half_life_seconds: Option<f64>,
}

/// A Kubernetes quantity (`1Gi`, `500M`, `1k`, `100`) as an integer; `None` for 0.
pub fn quantity(v: &Yaml, field: &str) -> Result<Option<usize>, String> {
    let bad = || {
        format!(
            "flowControl.{field} must be a non-negative quantity (e.g. 100, 1k, 1Gi), got {v:?}"
        )
    };
    let text = match v {
        Yaml::Number(n) => n.to_string(),
        Yaml::String(s) => s.trim().to_string(),
        _ => return Err(bad()),
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return Err(bad()),
    };
    let value = (number * scale).ceil();
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    Ok(Some(value.min(usize::MAX as f64) as usize).filter(|&n| n > 0))
}

/// A Go duration (`60s`, `1m30s`, `500ms`) in seconds, not negative.
pub fn duration(text: &str, field: &str) -> Result<f64, String> {
    crate::flow_control::go_duration::seconds(text.trim())
        .filter(|s| *s >= 0.0)
        .ok_or_else(|| {
            format!("flowControl.{field} must be a duration such as 30s, 1m or 500ms, got {text:?}")
        })
}

/// The section, checked against the policy plugins declared (`name -> type`); `gate`: the
/// `flowControl` feature gate is on. `Ok(None)`: nothing to apply (no gate: llm-d ignores the
/// section, with a warning here as there).
pub(super) fn map(
    section: Option<&Yaml>,
    gate: bool,
    policies: &BTreeMap<String, (String, Option<Yaml>)>,
    warnings: &mut Vec<String>,
) -> Result<Option<FlowControlMapping>, Vec<String>> {
    let s: Section = match section {
        None | Some(Yaml::Null) => Section::default(),
        Some(v) => {
            serde_yaml_ng::from_value(v.clone()).map_err(|e| vec![format!("flowControl: {e}")])?
        }
    };
    if !gate {
        if section.is_some() {
            warnings.push(format!(
                "flowControl is set but the {FEATURE_GATE} feature gate is not: its settings are ignored (as llm-d); add featureGates: [{FEATURE_GATE}] to queue requests"
            ));
        }
        return Ok(None);
    }
    let mut errors = Vec::new();
    let mut bound = |v: &Option<Yaml>, field: &str, default: usize| match v {
        None => default,
        Some(v) => match quantity(v, field) {
            Ok(n) => n.unwrap_or(default),
            Err(e) => {
                errors.push(e);
                default
            }
        },
    };
    let max_requests = bound(&s.max_requests, "maxRequests", BAND_MAX_REQUESTS);
    let max_bytes = bound(&s.max_bytes, "maxBytes", BAND_MAX_BYTES);
    let ttl = match &s.default_request_ttl {
        None => DEFAULT_TTL_SECONDS,
        Some(t) => match duration(t, "defaultRequestTTL") {
            Ok(0.0) => {
                errors.push("flowControl.defaultRequestTTL 0s (no eviction while the pool has endpoints) has no counterpart: a queued request here always has a TTL (requestTtlSeconds)".into());
                DEFAULT_TTL_SECONDS
            }
            Ok(secs) => secs,
            Err(e) => {
                errors.push(e);
                DEFAULT_TTL_SECONDS
            }
        },
    };
    if let Some(t) = &s.no_endpoint_request_ttl {
        errors.push(format!(
            "flowControl.noEndpointRequestTTL {t:?} has no counterpart: a request whose model has no endpoint is answered 503 at once here, never queued for a pod to appear"
        ));
    }
    if s.enable_eviction {
        errors.push("flowControl.enableEviction: true (ending in-flight requests of negative priority) has no counterpart: here a queued negative-priority request is displaced, never one in flight".into());
    }
    if let Some(r) = s
        .usage_limit_policy_plugin_ref
        .as_deref()
        .filter(|r| !r.is_empty())
    {
        match resolve(r, policies) {
            Some(("static-usage-limit-policy", params)) if static_limit_is_default(params) => {}
            Some((kind, _)) => errors.push(format!(
                "flowControl.usageLimitPolicyPluginRef {r:?} ({kind}) has no counterpart: the queue has no usage ceiling but its bounds (only static-usage-limit-policy without a threshold below 1 maps)"
            )),
            None => errors.push(format!(
                "flowControl.usageLimitPolicyPluginRef {r:?} names no plugin"
            )),
        }
    }
    if let Some(d) = &s.saturation_detector {
        let r = d.plugin_ref.as_deref().unwrap_or("utilization-detector");
        warnings.push(format!(
            "flowControl.saturationDetector {r:?}: a pod has room by this project's own measure (its engine's learned concurrency and predicted wait, picker.flowControl.maxWaitSeconds and maxInFlightPerPod)"
        ));
    }
    let mut half_life = None;
    let mut fairness_default = false;
    let bands = [
        (
            "defaultPriorityBand".to_string(),
            s.default_priority_band.as_ref(),
        ),
        (
            "defaultNegativePriorityBand".to_string(),
            s.default_negative_priority_band.as_ref(),
        ),
    ]
    .into_iter()
    .chain(
        s.priority_bands
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("priorityBands[{i}]"), Some(b))),
    );
    for (field, band) in bands {
        let Some(b) = band else { continue };
        let _ = b.priority;
        for (key, v) in [("maxRequests", &b.max_requests), ("maxBytes", &b.max_bytes)] {
            if v.is_some() {
                errors.push(format!(
                    "flowControl.{field}.{key} has no counterpart: one bound holds for every band here (flowControl.{key})"
                ));
            }
        }
        match b.ordering_policy_ref.as_deref().filter(|r| !r.is_empty()) {
            None => {}
            Some(r) => match resolve(r, policies) {
                Some(("fcfs-ordering-policy", _)) => {}
                Some((kind, _)) => errors.push(format!(
                    "flowControl.{field}.orderingPolicyRef {r:?} ({kind}) has no counterpart: within a flow requests leave in arrival order (fcfs-ordering-policy)"
                )),
                None => errors.push(format!(
                    "flowControl.{field}.orderingPolicyRef {r:?} names no plugin"
                )),
            },
        }
        match b.fairness_policy_ref.as_deref().filter(|r| !r.is_empty()) {
            None => fairness_default = true,
            Some(r) => match resolve(r, policies) {
                Some(("program-aware-fairness", params)) => {
                    match program_aware(params, &format!("flowControl.{field}.fairnessPolicyRef {r:?}"), warnings) {
                        Ok(h) => half_life = half_life.or(h),
                        Err(e) => errors.push(e),
                    }
                }
                Some((kind, _)) => errors.push(format!(
                    "flowControl.{field}.fairnessPolicyRef {r:?} ({kind}) has no counterpart: flows are served by least attained service over weighted tokens (program-aware-fairness, strategy las)"
                )),
                None => errors.push(format!(
                    "flowControl.{field}.fairnessPolicyRef {r:?} names no plugin"
                )),
            },
        }
    }
    if fairness_default || s.priority_bands.is_empty() {
        warnings.push("flowControl: no fairnessPolicyRef (llm-d's default global-strict-fairness-policy): flows are served here by least attained service over weighted tokens, as program-aware-fairness (docs/flow-control.md)".into());
    }
    match errors.is_empty() {
        true => Ok(Some(FlowControlMapping {
            max_requests,
            max_bytes,
            request_ttl_seconds: ttl,
            half_life_seconds: half_life,
        })),
        false => Err(errors),
    }
}

/// A policy reference: a declared plugin's name, else one of llm-d's policy types by its
/// own name (llm-d registers its defaults under their types).
fn resolve<'a>(
    r: &str,
    policies: &'a BTreeMap<String, (String, Option<Yaml>)>,
) -> Option<(&'a str, Option<&'a Yaml>)> {
    match policies.get(r) {
        Some((kind, params)) => Some((kind.as_str(), params.as_ref())),
        None => POLICY_TYPES.iter().find(|t| **t == r).map(|t| (*t, None)),
    }
}

/// static-usage-limit-policy gates nothing unless its `threshold` is below 1.
fn static_limit_is_default(params: Option<&Yaml>) -> bool {
    let threshold = params
        .and_then(|p| p.get("threshold"))
        .and_then(Yaml::as_f64)
        .unwrap_or(1.0);
    threshold >= 1.0
}

/// program-aware-fairness's parameters: its half-life, when given; refused where they ask for
/// what this queue does not do.
fn program_aware(
    params: Option<&Yaml>,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<f64>, String> {
    let p: ProgramAware = match params {
        None | Some(Yaml::Null) => ProgramAware::default(),
        Some(v) => serde_yaml_ng::from_value(v.clone())
            .map_err(|e| format!("{at}: parameters of program-aware-fairness: {e}"))?,
    };
    let _ = (
        p.eviction_ttl_seconds,
        p.eviction_sweep_seconds,
        p.las_weight_service,
    );
    match p.strategy.as_deref() {
        None | Some("" | "las") => {}
        Some(other) => {
            return Err(format!(
                "{at}: program-aware-fairness strategy {other:?} has no counterpart (only las)"
            ));
        }
    }
    match p.las_weight_head_wait {
        Some(w) if w > 0.0 => {
            return Err(format!(
                "{at}: program-aware-fairness lasWeightHeadWait {w} has no counterpart: a flow's order here is its attained service alone (set it to 0)"
            ));
        }
        Some(_) => {}
        None => warnings.push(format!(
            "{at}: program-aware-fairness's default lasWeightHeadWait (0.2) does not apply: a flow's order here is its attained service alone"
        )),
    }
    match p.las_half_life_seconds {
        None => Ok(None),
        Some(h) if h.is_finite() && h > 0.0 => Ok(Some(h)),
        Some(h) => Err(format!(
            "{at}: program-aware-fairness lasHalfLifeSeconds must be > 0 here (a flow's service always decays), got {h}"
        )),
    }
}

#[cfg(test)]
mod tests;
