//! llm-d's (formerly GIE's) `EndpointPickerConfig` as a config document, detected by `kind:`
//! (`apiVersion: llm-d.ai/v1alpha1`, or the deprecated `inference.networking.x-k8s.io/v1alpha1`,
//! read with a warning as llm-d does), mapped onto one [`EppProfile`].
//!
//! Types and defaults: llm-d/llm-d-router ebab6879 (read, not copied),
//! `apix/config/v1alpha1/endpointpickerconfig_types.go` (`featureGates`, `plugins[] {name, type,
//! parameters}`, `schedulingProfiles[] {name, plugins[] {pluginRef, weight}}`, `dataLayer`,
//! `flowControl`, `requestHandler`, the deprecated `saturationDetector` and `parser`) and
//! `pkg/epp/config/loader/defaults.go`: a plugin's `name` defaults to its `type`; no
//! `schedulingProfiles` makes one profile `default` of every filter, scorer and picker; a scorer
//! without a weight weighs 1; a profile without a picker gets `max-score-picker`; a document
//! with neither plugins nor profiles is llm-d's default (queue 2, KV-cache utilization 2,
//! prefix cache 3).
//!
//! Strict as llm-d: an unknown field, plugin type or parameter is an error that names it (and
//! the line) and lists what is accepted. Plugin types are implemented ([`EppProfile`]),
//! accepted without effect here (data producers, sources and parsers whose work this project
//! does its own way: a warning each), or llm-d's but not implemented (an error naming it).
//! Beside llm-d's fields the document may carry prefix-picker's own sections (`endpoints`,
//! `discovery`, `picker`, `sync`), which `Config` reads as in a routerConfiguration. What the
//! document maps onto those sections rides in [`EppDocument`]: a `precise-prefix-cache-producer`
//! that the prefix consumers name (engine truth, [`precise`]) and `flowControl` with llm-d's
//! `flowControl` feature gate ([`flow_control`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

use crate::scheduler::epp::{
    EppFilter, EppPicker, EppProfile, EppScorer, EppScorerKind, LabelRequirement, LabelSelector,
    PREFIX_DEFAULT, PdDecider, PrefillStage, PrefixAffinity, SessionStrategy, session_affinity,
    token_load,
};

mod disagg;
pub mod flow_control;
pub mod precise;
use disagg::DisaggHandler;
pub use flow_control::FlowControlMapping;
pub use precise::PreciseEvents;

/// What an `EndpointPickerConfig` asks of the sidecar: the scheduling profile, and what it maps
/// onto the picker's sections (`Config` applies them).
#[derive(Debug, Clone, PartialEq)]
pub struct EppDocument {
    pub profile: EppProfile,
    /// A `precise-prefix-cache-producer` that the prefix match reads: its KV-events settings.
    pub precise: Option<PreciseEvents>,
    /// A `token-producer` with a vLLM backend: real tokens (`picker.tokenizer: {source:
    /// engine}` when the picker section gives none).
    pub engine_tokens: bool,
    /// `flowControl` with the `flowControl` feature gate.
    pub flow_control: Option<FlowControlMapping>,
}

/// The apiVersions read (the second with a deprecation warning).
pub const API_VERSIONS: [&str; 2] = [
    "llm-d.ai/v1alpha1",
    "inference.networking.x-k8s.io/v1alpha1",
];

/// prefix-picker's own top-level sections an `EndpointPickerConfig` may carry.
pub const OWN_SECTIONS: [&str; 4] = ["endpoints", "discovery", "picker", "sync"];

/// Plugin types implemented (filters, scorers, pickers, the profile handler, the producers).
const IMPLEMENTED: [&str; 23] = [
    "prefix-cache-scorer",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "running-requests-size-scorer",
    "load-aware-scorer",
    "lora-affinity-scorer",
    "no-hit-lru-scorer",
    "token-load-scorer",
    "session-affinity-scorer",
    "decode-filter",
    "prefill-filter",
    "label-selector-filter",
    "prefix-cache-affinity-filter",
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "single-profile-handler",
    "disagg-profile-handler",
    "prefix-based-pd-decider",
    "always-disagg-pd-decider",
    "precise-prefix-cache-producer",
    "token-producer",
    "precise-prefix-cache-scorer",
];

/// Plugin types accepted without effect: what each does in llm-d, and what does it here.
const NO_EFFECT: [(&str, &str); 12] = [
    (
        "approx-prefix-cache-producer",
        "the prefix-cache scorer matches this project's prefix index (64-byte blocks, recorded at completion)",
    ),
    (
        "metrics-data-source",
        "engine metrics are scraped by picker.scrapeIntervalSeconds",
    ),
    (
        "core-metrics-extractor",
        "engine metrics are read by picker.engineMetrics",
    ),
    (
        "endpoint-notification-source",
        "pods come from endpoints: or discovery:",
    ),
    (
        "k8s-notification-source",
        "pods come from endpoints: or discovery:",
    ),
    ("openai-parser", "requests are parsed by prefix-picker"),
    ("anthropic-parser", "requests are parsed by prefix-picker"),
    ("vllmhttp-parser", "requests are parsed by prefix-picker"),
    ("passthrough-parser", "requests are parsed by prefix-picker"),
    (
        "utilization-detector",
        "saturation is picker.loadShedding (docs/routing.md#load-shedding)",
    ),
    (
        "inflight-load-producer",
        "in-flight counts are the picker's own",
    ),
    (
        "models-data-source",
        "models come from endpoints: models or discovery",
    ),
];

/// llm-d plugin types not implemented here.
const NOT_IMPLEMENTED: [&str; 21] = [
    "active-request-scorer",
    "latency-scorer",
    "context-length-aware",
    "mm-embeddings-cache-scorer",
    "header-label-affinity-scorer",
    "endpoint-attribute-scorer",
    "topology-affinity-scorer",
    "slo-headroom-tier-filter",
    "encode-filter",
    "utilization-filter",
    "session-affinity-filter",
    "endpoint-attribute-filter",
    "topology-affinity-filter",
    "always-disagg-multimodal-decider",
    "header-profile-handler",
    "pd-profile-handler",
    "data-parallel-profile-handler",
    "burst-prefix-cache-producer",
    "predicted-latency-producer",
    "session-id-producer",
    "file-discovery",
];

/// The document, as llm-d's types read it (strictly).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    api_version: String,
    kind: String,
    #[serde(default)]
    feature_gates: Vec<String>,
    #[serde(default)]
    plugins: Vec<PluginSpec>,
    #[serde(default)]
    scheduling_profiles: Vec<ProfileSpec>,
    data_layer: Option<Yaml>,
    flow_control: Option<Yaml>,
    request_handler: Option<Yaml>,
    saturation_detector: Option<Yaml>,
    parser: Option<Yaml>,
    // prefix-picker's own sections, read by `Config`.
    endpoints: Option<Yaml>,
    discovery: Option<Yaml>,
    picker: Option<Yaml>,
    sync: Option<Yaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginSpec {
    #[serde(default)]
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    parameters: Option<Yaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProfileSpec {
    name: String,
    #[serde(default)]
    plugins: Vec<ProfilePlugin>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProfilePlugin {
    plugin_ref: String,
    weight: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixCacheParameters {
    prefix_match_info_producer_name: Option<String>,
    match_length_weight: Option<f64>,
    match_length_scale_tokens: Option<i64>,
}

/// A Kubernetes `LabelSelector` as written (`label-selector-filter`'s parameters).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SelectorParameters {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    match_expressions: Vec<SelectorExpression>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectorExpression {
    key: String,
    operator: String,
    #[serde(default)]
    values: Vec<String>,
}

/// The selector, validated as Kubernetes does (`In`/`NotIn` need values, `Exists` and
/// `DoesNotExist` take none).
fn selector(p: SelectorParameters) -> Result<LabelSelector, String> {
    let mut expressions = Vec::new();
    for e in p.match_expressions {
        let (key, values) = (e.key, e.values);
        expressions.push(match (e.operator.as_str(), values.is_empty()) {
            ("In", false) => LabelRequirement::In(key, values),
            ("NotIn", false) => LabelRequirement::NotIn(key, values),
            ("Exists", true) => LabelRequirement::Exists(key),
            ("DoesNotExist", true) => LabelRequirement::DoesNotExist(key),
            ("In" | "NotIn", true) => {
                return Err(format!("matchExpressions {key:?}: operator {} needs values", e.operator));
            }
            ("Exists" | "DoesNotExist", false) => {
                return Err(format!("matchExpressions {key:?}: operator {} takes no values", e.operator));
            }
            (other, _) => {
                return Err(format!(
                    "matchExpressions {key:?}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                ));
            }
        });
    }
    Ok(LabelSelector {
        match_labels: p.match_labels.into_iter().collect(),
        match_expressions: expressions,
    })
}

/// prefix-cache-affinity-filter's parameters validated as llm-d does (`Config.validate`);
/// `ttftSource: latencyPredictor` is refused (no llm-d latency predictor here).
fn prefix_affinity(p: PrefixAffinityParameters) -> Result<PrefixAffinity, String> {
    let _ = (
        p.prefix_match_info_producer_name,
        p.latency_prediction_info_producer_name,
        p.in_flight_load_producer_name,
    );
    // llm-d decodes over its defaults: an absent key keeps the default, a 0 is a 0
    // (`affinityThreshold: 0` turns the filter off, `maxTTFTPenaltyMs: 0` always sticks).
    let d = PrefixAffinity::default();
    let f = PrefixAffinity {
        affinity_threshold: p.affinity_threshold.unwrap_or(d.affinity_threshold),
        exploration_probability: p
            .exploration_probability
            .unwrap_or(d.exploration_probability),
        max_ttft_penalty_ms: p.max_ttft_penalty_ms.unwrap_or(d.max_ttft_penalty_ms),
        peak_prefill_throughput: p
            .peak_prefill_throughput
            .unwrap_or(d.peak_prefill_throughput),
    };
    if !(f.affinity_threshold.is_finite() && f.affinity_threshold <= 1.0) {
        return Err(format!(
            "affinityThreshold must be <= 1.0, got {}",
            f.affinity_threshold
        ));
    }
    if !(0.0..=1.0).contains(&f.exploration_probability) {
        return Err(format!(
            "explorationProbability must be in [0, 1], got {}",
            f.exploration_probability
        ));
    }
    if !(f.max_ttft_penalty_ms.is_finite() && f.max_ttft_penalty_ms >= 0.0) {
        return Err(format!(
            "maxTTFTPenaltyMs must be >= 0, got {}",
            f.max_ttft_penalty_ms
        ));
    }
    if !(f.peak_prefill_throughput.is_finite() && f.peak_prefill_throughput >= 0.0) {
        return Err(format!(
            "peakPrefillThroughput must be >= 0, got {}",
            f.peak_prefill_throughput
        ));
    }
    if f.max_ttft_penalty_ms > 0.0 && f.peak_prefill_throughput == 0.0 {
        return Err("peakPrefillThroughput must be > 0 when maxTTFTPenaltyMs is > 0 (ttftSource prefillThroughput)".into());
    }
    match p.ttft_source.as_deref() {
        None | Some("") | Some("prefillThroughput") => Ok(f),
        Some("latencyPredictor") => Err(
            "ttftSource \"latencyPredictor\" is llm-d's but not implemented by prefix-picker (it reads llm-d's predicted-latency-producer); use prefillThroughput"
                .into(),
        ),
        Some(other) => Err(format!(
            "ttftSource must be \"latencyPredictor\" or \"prefillThroughput\", got {other:?}"
        )),
    }
}

/// A lowercase header name as llm-d normalises it (trimmed, lowercased), checked.
fn header_name(name: &str, field: &str) -> Result<String, String> {
    let h = name.trim().to_ascii_lowercase();
    let ok = !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    match ok {
        true => Ok(h),
        false => Err(format!("{field} must be an HTTP header name, got {name:?}")),
    }
}

/// session-affinity-scorer's strategy, with llm-d's defaults and checks.
fn session_strategy(p: SessionAffinityParameters) -> Result<SessionStrategy, String> {
    if let Some(profile) = p.profile_name.filter(|n| !n.is_empty()) {
        return Err(format!(
            "profileName {profile:?}: pinning another profile's pod needs disagg-profile-handler, which prefix-picker does not implement; leave it out (the picked pod is pinned)"
        ));
    }
    match p.strategy.as_deref().unwrap_or("encoded_endpoint_header") {
        "encoded_endpoint_header" => {
            let header = match p.encoded_endpoint_header_config.header.as_deref() {
                None | Some("") => session_affinity::DEFAULT_TOKEN_HEADER.to_string(),
                Some(h) => header_name(h, "encodedEndpointHeaderConfig.header")?,
            };
            Ok(SessionStrategy::EncodedEndpointHeader { header })
        }
        "session_id" => {
            let c = p.session_id_config;
            let mut headers = Vec::new();
            for (i, source) in c.sources.iter().enumerate() {
                match (&source.header, &source.attribute) {
                    (Some(h), None) if !h.is_empty() => {
                        headers.push(header_name(
                            h,
                            &format!("sessionIdConfig.sources[{i}].header"),
                        )?);
                    }
                    (None, Some(a)) if !a.is_empty() => {
                        let _ = &source.producer;
                        return Err(format!(
                            "sessionIdConfig.sources[{i}]: attribute {a:?} (another llm-d plugin's request attribute) is not implemented by prefix-picker; use a header source"
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "sessionIdConfig.sources[{i}]: exactly one of header or attribute must be set"
                        ));
                    }
                }
            }
            if headers.is_empty() {
                headers.push(session_affinity::DEFAULT_SESSION_ID_HEADER.to_string());
            }
            let seconds = |v: Option<f64>, default: f64, field: &str| {
                let s = v.filter(|&x| x != 0.0).unwrap_or(default);
                if s.is_finite() && s > 0.0 {
                    Ok(std::time::Duration::from_secs_f64(s))
                } else {
                    Err(format!("sessionIdConfig.{field} must be > 0, got {s}"))
                }
            };
            Ok(SessionStrategy::SessionId {
                headers,
                ttl: seconds(c.eviction_ttl_seconds, 300.0, "evictionTtlSeconds")?,
                sweep: seconds(c.eviction_sweep_seconds, 10.0, "evictionSweepSeconds")?,
            })
        }
        other => Err(format!(
            "strategy must be \"encoded_endpoint_header\" or \"session_id\", got {other:?}"
        )),
    }
}

/// no-hit-lru-scorer's parameters (`scorer/nohitlru/no_hit_lru.go`, `Parameters`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NoHitLruParameters {
    prefix_plugin_type: Option<String>,
    prefix_plugin_name: Option<String>,
    lru_size: Option<i64>,
    prefix_match_info_producer_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LoadAwareParameters {
    threshold: Option<f64>,
}

/// token-load-scorer's parameters (`scorer/tokenload/token_load.go`, `Config`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TokenLoadParameters {
    queue_threshold_tokens: Option<i64>,
    in_flight_load_producer_name: Option<String>,
}

/// prefix-cache-affinity-filter's parameters (`filter/prefixcacheaffinity/plugin.go`,
/// `Config`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixAffinityParameters {
    affinity_threshold: Option<f64>,
    exploration_probability: Option<f64>,
    #[serde(rename = "maxTTFTPenaltyMs")]
    max_ttft_penalty_ms: Option<f64>,
    ttft_source: Option<String>,
    peak_prefill_throughput: Option<f64>,
    prefix_match_info_producer_name: Option<String>,
    latency_prediction_info_producer_name: Option<String>,
    in_flight_load_producer_name: Option<String>,
}

/// session-affinity-scorer's parameters (`scorer/sessionaffinity/session_affinity.go`,
/// `util/sessionaffinity/{header,session_id}.go`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SessionAffinityParameters {
    strategy: Option<String>,
    #[serde(default)]
    encoded_endpoint_header_config: EncodedHeaderConfig,
    #[serde(default)]
    session_id_config: SessionIdConfig,
    profile_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodedHeaderConfig {
    header: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SessionIdConfig {
    #[serde(default)]
    sources: Vec<SessionIdSource>,
    eviction_ttl_seconds: Option<f64>,
    eviction_sweep_seconds: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionIdSource {
    header: Option<String>,
    attribute: Option<String>,
    producer: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PickerParameters {
    max_num_of_endpoints: Option<i64>,
}

/// What a plugin instance is here.
#[derive(Debug, Clone)]
enum Plugin {
    Filter(EppFilter),
    Scorer(EppScorerKind),
    Picker(EppPicker),
    /// A profile handler: `single-profile-handler` (`None`) or `disagg-profile-handler`.
    Handler(Option<DisaggHandler>),
    /// A prefill decider of `disagg-profile-handler`.
    Decider(PdDecider),
    /// `precise-prefix-cache-producer`: engine truth for the prefix match.
    Precise(PreciseEvents),
    /// The deprecated `precise-prefix-cache-scorer`: a prefix-cache-scorer (defaults) over its
    /// own precise producer; `pool`: its `tokenizersPoolConfig` tokenizes prompts.
    PreciseScorer {
        events: PreciseEvents,
        pool: bool,
    },
    /// `approx-prefix-cache-producer`: the prefix index's estimate (the default).
    Approximate,
    /// `token-producer`: whether it gives real (engine) tokens.
    TokenProducer {
        engine: bool,
    },
    /// A flow-control policy (`flowControl` references it by name).
    FlowPolicy,
    NoEffect,
}

/// Whether `root` is an `EndpointPickerConfig` (by `kind`, or by GIE's apiVersion).
pub fn is_endpoint_picker_config(root: &serde_yaml_ng::Mapping) -> bool {
    let kind = root.get("kind").and_then(Yaml::as_str).unwrap_or_default();
    let api = root
        .get("apiVersion")
        .and_then(Yaml::as_str)
        .unwrap_or_default();
    kind == "EndpointPickerConfig" || api.starts_with("inference.networking.x-k8s.io")
}

/// The line (1-based) of the first line of `text` holding `a` and `b`, for an error.
fn line_of(text: &str, a: &str, b: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.contains(a) && l.contains(b))
        .map(|i| i + 1)
}

/// ` (line N)` when found.
fn at(line: Option<usize>) -> String {
    line.map_or_else(String::new, |n| format!(" (line {n})"))
}

/// Parses an `EndpointPickerConfig` document into its profile and what it maps onto the
/// picker's sections; every problem is returned.
pub fn parse(text: &str, warnings: &mut Vec<String>) -> Result<EppDocument, Vec<String>> {
    let doc: Document = serde_yaml_ng::from_str(text).map_err(|e| {
        let mut message = e.to_string();
        if message.contains("unknown field") {
            message.push_str(&format!(
                " (prefix-picker's own sections also accepted: {})",
                OWN_SECTIONS.join(", ")
            ));
        }
        vec![message]
    })?;
    let mut errors = Vec::new();
    if !API_VERSIONS.contains(&doc.api_version.as_str()) {
        errors.push(format!(
            "apiVersion {:?}{} is not one of {}",
            doc.api_version,
            at(line_of(text, "apiVersion", &doc.api_version)),
            API_VERSIONS.join(", ")
        ));
    } else if doc.api_version == API_VERSIONS[1] {
        warnings.push(format!(
            "DEPRECATION: apiVersion {}/EndpointPickerConfig is deprecated, use {}",
            API_VERSIONS[1], API_VERSIONS[0]
        ));
    }
    if doc.kind != "EndpointPickerConfig" {
        errors.push(format!("kind {:?} must be EndpointPickerConfig", doc.kind));
    }
    let flow_gate = feature_gates(&doc.feature_gates, warnings);
    for (field, present, why) in [
        (
            "dataLayer",
            doc.data_layer.is_some(),
            "engine metrics are picker.scrapeIntervalSeconds and picker.engineMetrics",
        ),
        (
            "requestHandler",
            doc.request_handler.is_some(),
            "requests are parsed by prefix-picker",
        ),
        (
            "saturationDetector",
            doc.saturation_detector.is_some(),
            "saturation is picker.loadShedding",
        ),
        (
            "parser",
            doc.parser.is_some(),
            "requests are parsed by prefix-picker",
        ),
    ] {
        if present {
            warnings.push(format!("{field} ignored: {why}"));
        }
    }
    // prefix-picker's own sections are declared above only to be accepted; `Config` reads them.
    let _ = (&doc.endpoints, &doc.discovery, &doc.picker, &doc.sync);
    let mut refs = Vec::new();
    let plugins = instances(text, &doc.plugins, &mut refs, warnings, &mut errors);
    let policies: BTreeMap<String, (String, Option<Yaml>)> = doc
        .plugins
        .iter()
        .filter(|p| flow_control::POLICY_TYPES.contains(&p.kind.as_str()))
        .map(|p| {
            let name = if p.name.is_empty() { &p.kind } else { &p.name };
            (name.clone(), (p.kind.clone(), p.parameters.clone()))
        })
        .collect();
    let flow = match flow_control::map(doc.flow_control.as_ref(), flow_gate, &policies, warnings) {
        Ok(f) => f,
        Err(e) => {
            let line = at(line_of(text, "flowControl:", ""));
            errors.extend(e.into_iter().map(|e| format!("{e}{line}")));
            None
        }
    };
    let precise = precise_producer(&plugins, &refs, warnings, &mut errors);
    let engine_tokens = plugins.values().any(|(p, _)| {
        matches!(
            p,
            Plugin::TokenProducer { engine: true } | Plugin::PreciseScorer { pool: true, .. }
        )
    });
    if precise.is_some() && !engine_tokens {
        warnings.push("precise-prefix-cache-producer without a token-producer with a vllm backend: real tokens come from picker.tokenizer only; without it every pod is matched by the estimate (as llm-d's estimate tokens match no engine)".into());
    }
    let profile = if doc.plugins.is_empty() && doc.scheduling_profiles.is_empty() {
        Some(EppProfile::llm_d_default())
    } else {
        profile(text, &doc, &plugins, warnings, &mut errors)
    };
    match (profile, errors.is_empty()) {
        (Some(mut profile), true) => {
            let precise_match = precise.is_some();
            profile.precise = precise_match;
            if let Some(stage) = &mut profile.prefill {
                stage.profile.precise = precise_match;
            }
            Ok(EppDocument {
                profile,
                precise,
                engine_tokens,
                flow_control: flow,
            })
        }
        _ => Err(errors),
    }
}

/// `featureGates` (`name` or `name=false`): whether `flowControl` is on; the others are
/// warned about (prefix-picker has none of them).
fn feature_gates(gates: &[String], warnings: &mut Vec<String>) -> bool {
    let mut flow = false;
    let mut others = Vec::new();
    for g in gates {
        let (name, on) = match g.split_once('=') {
            Some((n, v)) => (n.trim(), !v.trim().eq_ignore_ascii_case("false")),
            None => (g.trim(), true),
        };
        if name == flow_control::FEATURE_GATE {
            flow = on;
        } else {
            others.push(g.as_str());
        }
    }
    if !others.is_empty() {
        warnings.push(format!(
            "featureGates {others:?} ignored: prefix-picker has none of these llm-d feature gates"
        ));
    }
    flow
}

/// The producer the prefix match reads: the precise one when a consumer names one by
/// `prefixMatchInfoProducerName`. One match per profile here: consumers that name both kinds
/// are refused. A precise producer no consumer names is warned about (llm-d's consumers then
/// read the approximate producer, as here).
fn precise_producer(
    plugins: &BTreeMap<String, (Plugin, String)>,
    refs: &[(String, String)],
    warnings: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> Option<PreciseEvents> {
    let mut precise: Option<(&str, &PreciseEvents)> = None;
    let mut approximate: Option<&str> = None;
    for (consumer, producer) in refs {
        match plugins.get(producer) {
            Some((Plugin::Precise(p), _)) => precise = Some((consumer, p)),
            Some((Plugin::Approximate, _)) => approximate = Some(consumer),
            Some((_, kind)) => errors.push(format!(
                "plugins[{consumer}]: prefixMatchInfoProducerName {producer:?} is a {kind}, not a prefix-cache producer (precise-prefix-cache-producer, approx-prefix-cache-producer)"
            )),
            None => errors.push(format!(
                "plugins[{consumer}]: prefixMatchInfoProducerName {producer:?} names no plugin; plugins: {}",
                plugins.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
    }
    // The deprecated precise-prefix-cache-scorer reads an existing producer (its own
    // parameters then ignored, as llm-d), else its own.
    for (name, (p, _)) in plugins {
        let Plugin::PreciseScorer { events, .. } = p else {
            continue;
        };
        let existing = plugins.values().find_map(|(p, _)| match p {
            Plugin::Precise(e) => Some(e),
            _ => None,
        });
        match existing {
            Some(e) => {
                warnings.push(format!(
                    "plugins[{name}]: a precise-prefix-cache-producer is configured: this scorer reads it and its own parameters are ignored (as llm-d)"
                ));
                precise = Some((name, e));
            }
            None => precise = Some((name, events)),
        }
    }
    if let (Some((p, _)), Some(a)) = (precise, approximate) {
        errors.push(format!(
            "plugins[{p}] reads a precise-prefix-cache-producer and plugins[{a}] an approx-prefix-cache-producer: prefix-picker matches a request once per profile; name one producer"
        ));
    }
    if precise.is_none() {
        for (name, (p, _)) in plugins {
            if matches!(p, Plugin::Precise(_)) {
                warnings.push(format!(
                    "plugins[{name}]: no plugin names this precise-prefix-cache-producer in prefixMatchInfoProducerName: the prefix match is the estimate (as llm-d, whose consumers then read the approximate producer)"
                ));
            }
        }
    }
    precise.map(|(_, p)| p.clone())
}

/// Every `plugins[]` entry by name: its type read into a [`Plugin`], its parameters checked.
fn instances(
    text: &str,
    specs: &[PluginSpec],
    refs: &mut Vec<(String, String)>,
    warnings: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> BTreeMap<String, (Plugin, String)> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let name = if spec.name.is_empty() {
            spec.kind.clone()
        } else {
            spec.name.clone()
        };
        let line = at(line_of(text, "type", &spec.kind));
        match plugin(spec, &name, &line, refs, warnings) {
            Ok(p) => {
                if out.insert(name.clone(), (p, spec.kind.clone())).is_some() {
                    errors.push(format!("plugins: the name {name:?}{line} is used twice"));
                }
            }
            Err(e) => errors.push(format!("plugins[{name}]{line}: {e}")),
        }
    }
    out
}

/// Reads `parameters` strictly into `T` (none: its defaults).
fn parameters<T: for<'de> Deserialize<'de> + Default>(spec: &PluginSpec) -> Result<T, String> {
    match &spec.parameters {
        None | Some(Yaml::Null) => Ok(T::default()),
        Some(v) => serde_yaml_ng::from_value(v.clone())
            .map_err(|e| format!("parameters of {}: {e}", spec.kind)),
    }
}

/// One plugin instance.
fn plugin(
    spec: &PluginSpec,
    name: &str,
    line: &str,
    refs: &mut Vec<(String, String)>,
    warnings: &mut Vec<String>,
) -> Result<Plugin, String> {
    let mut producer = |p: Option<String>| {
        if let Some(p) = p.filter(|p| !p.is_empty()) {
            refs.push((name.to_string(), p));
        }
    };
    let no_parameters = |warnings: &mut Vec<String>| {
        if spec.parameters.as_ref().is_some_and(|p| !p.is_null()) {
            warnings.push(format!(
                "plugins[{name}]{line}: {} takes no parameters; ignored (as llm-d)",
                spec.kind
            ));
        }
    };
    Ok(match spec.kind.as_str() {
        "prefix-cache-scorer" => {
            let p: PrefixCacheParameters = parameters(spec)?;
            let w = p.match_length_weight.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&w) {
                return Err(format!(
                    "matchLengthWeight must be between 0.0 and 1.0, got {w}"
                ));
            }
            let scale = p.match_length_scale_tokens.unwrap_or(8192);
            if w > 0.0 && scale <= 0 {
                return Err(format!(
                    "matchLengthScaleTokens must be greater than 0 when matchLengthWeight is greater than 0, got {scale}"
                ));
            }
            producer(p.prefix_match_info_producer_name);
            Plugin::Scorer(EppScorerKind::PrefixCache {
                match_length_weight: w,
                match_length_scale_tokens: scale.clamp(1, i64::from(u32::MAX)) as u32,
            })
        }
        "queue-scorer" => {
            no_parameters(warnings);
            Plugin::Scorer(EppScorerKind::Queue)
        }
        "kv-cache-utilization-scorer" => {
            no_parameters(warnings);
            Plugin::Scorer(EppScorerKind::KvCacheUtilization)
        }
        "running-requests-size-scorer" => {
            no_parameters(warnings);
            Plugin::Scorer(EppScorerKind::RunningRequestsSize)
        }
        "no-hit-lru-scorer" => {
            let p: NoHitLruParameters = parameters(spec)?;
            let _ = (p.prefix_plugin_type, p.prefix_plugin_name);
            producer(p.prefix_match_info_producer_name);
            // llm-d: a size that is not > 0 is its default, 1024.
            let lru_size = match p.lru_size {
                Some(n) if n > 0 => n as usize,
                _ => 1024,
            };
            Plugin::Scorer(EppScorerKind::NoHitLru { lru_size })
        }
        "lora-affinity-scorer" => {
            no_parameters(warnings);
            Plugin::Scorer(EppScorerKind::LoraAffinity)
        }
        "load-aware-scorer" => {
            let p: LoadAwareParameters = parameters(spec)?;
            let threshold = p.threshold.unwrap_or(128.0);
            if !(threshold.is_finite() && threshold > 0.0) {
                return Err(format!("threshold must be a number > 0, got {threshold}"));
            }
            Plugin::Scorer(EppScorerKind::LoadAware { threshold })
        }
        "token-load-scorer" => {
            let p: TokenLoadParameters = parameters(spec)?;
            let _ = p.in_flight_load_producer_name;
            // llm-d: a threshold that is not > 0 is its default.
            let threshold = match p.queue_threshold_tokens {
                Some(n) if n > 0 => n as f64,
                _ => token_load::DEFAULT_QUEUE_THRESHOLD_TOKENS,
            };
            Plugin::Scorer(EppScorerKind::TokenLoad {
                queue_threshold_tokens: threshold,
            })
        }
        "session-affinity-scorer" => Plugin::Scorer(EppScorerKind::SessionAffinity(
            session_strategy(parameters(spec)?)?,
        )),
        "prefix-cache-affinity-filter" => {
            let mut p: PrefixAffinityParameters = parameters(spec)?;
            producer(p.prefix_match_info_producer_name.take());
            Plugin::Filter(EppFilter::PrefixAffinity(prefix_affinity(p)?))
        }
        "precise-prefix-cache-producer" => {
            let (events, _) = precise::producer(spec.parameters.as_ref(), name, false, warnings)?;
            Plugin::Precise(events)
        }
        "precise-prefix-cache-scorer" => {
            warnings.push(format!(
                "plugins[{name}]: DEPRECATION: precise-prefix-cache-scorer is deprecated (as in llm-d); configure precise-prefix-cache-producer and prefix-cache-scorer with prefixMatchInfoProducerName"
            ));
            let (events, pool) = precise::producer(spec.parameters.as_ref(), name, true, warnings)?;
            Plugin::PreciseScorer { events, pool }
        }
        "approx-prefix-cache-producer" => {
            warnings.push(format!(
                "plugins[{name}]: approx-prefix-cache-producer: the prefix match is this project's prefix index (64-byte blocks, recorded at completion); its parameters are not read"
            ));
            Plugin::Approximate
        }
        "token-producer" => {
            let engine = precise::engine_tokens(spec.parameters.as_ref())?;
            if !engine {
                warnings.push(format!(
                    "plugins[{name}]: token-producer (estimate): prompts are matched as rendered bytes (4 bytes a token for matchLengthScaleTokens)"
                ));
            }
            Plugin::TokenProducer { engine }
        }
        kind if flow_control::POLICY_TYPES.contains(&kind) => Plugin::FlowPolicy,
        "decode-filter" => {
            no_parameters(warnings);
            Plugin::Filter(EppFilter::Decode)
        }
        "prefill-filter" => {
            no_parameters(warnings);
            Plugin::Filter(EppFilter::Prefill)
        }
        "label-selector-filter" => Plugin::Filter(EppFilter::Labels(selector(parameters(spec)?)?)),
        "max-score-picker" | "random-picker" | "weighted-random-picker" => {
            let p: PickerParameters = parameters(spec)?;
            if let Some(n) = p.max_num_of_endpoints
                && n < 1
            {
                return Err(format!("maxNumOfEndpoints must be >= 1, got {n}"));
            }
            if p.max_num_of_endpoints.is_some() {
                warnings.push(format!("plugins[{name}]: maxNumOfEndpoints: the pick and its fallbacks number picker.maxEndpoints"));
            }
            Plugin::Picker(match spec.kind.as_str() {
                "max-score-picker" => EppPicker::MaxScore,
                "random-picker" => EppPicker::Random,
                _ => EppPicker::WeightedRandom,
            })
        }
        "single-profile-handler" => {
            no_parameters(warnings);
            Plugin::Handler(None)
        }
        "disagg-profile-handler" => Plugin::Handler(Some(disagg::handler(spec, warnings)?)),
        "prefix-based-pd-decider" => Plugin::Decider(disagg::prefix_based(spec)?),
        "always-disagg-pd-decider" => {
            no_parameters(warnings);
            Plugin::Decider(PdDecider::Always)
        }
        other => {
            if let Some((_, why)) = NO_EFFECT.iter().find(|(t, _)| *t == other) {
                warnings.push(format!(
                    "plugins[{name}]: {other} accepted, no effect: {why}"
                ));
                Plugin::NoEffect
            } else if NOT_IMPLEMENTED.contains(&other) {
                return Err(format!(
                    "plugin type {other:?} is llm-d's but not implemented by prefix-picker (docs/migration.md); implemented: {}",
                    IMPLEMENTED.join(", ")
                ));
            } else {
                return Err(format!(
                    "unknown plugin type {other:?}; supported: {}; accepted without effect: {}",
                    IMPLEMENTED.join(", "),
                    NO_EFFECT.map(|(t, _)| t).join(", ")
                ));
            }
        }
    })
}

/// The scheduling profile: llm-d's single-profile-handler runs exactly one; a
/// disagg-profile-handler runs its decode profile and, when its decider says so, its prefill
/// profile ([`crate::scheduler::epp::disagg`]).
fn profile(
    text: &str,
    doc: &Document,
    plugins: &BTreeMap<String, (Plugin, String)>,
    warnings: &mut Vec<String>,
    errors: &mut Vec<String>,
) -> Option<EppProfile> {
    let handlers: Vec<(&String, &Option<DisaggHandler>)> = plugins
        .iter()
        .filter_map(|(n, (p, _))| match p {
            Plugin::Handler(h) => Some((n, h)),
            _ => None,
        })
        .collect();
    let handler = match handlers.as_slice() {
        [] => None,
        [(_, h)] => h.as_ref(),
        many => {
            let names: Vec<&str> = many.iter().map(|(n, _)| n.as_str()).collect();
            errors.push(format!(
                "plugins: {} profile handlers ({names:?}); give one",
                many.len()
            ));
            return None;
        }
    };
    let Some(disagg) = handler else {
        return single_profile(text, doc, plugins, errors);
    };
    let by_name = |name: &str| doc.scheduling_profiles.iter().find(|p| p.name == name);
    let Some(decode_spec) = by_name(&disagg.decode) else {
        let names: Vec<&str> = doc
            .scheduling_profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        errors.push(format!(
            "disagg-profile-handler: the decode profile {:?} names no schedulingProfile; profiles: {names:?}",
            disagg.decode
        ));
        return None;
    };
    for p in &doc.scheduling_profiles {
        if p.name != disagg.decode && p.name != disagg.prefill {
            warnings.push(format!(
                "schedulingProfiles[{}]: never run (disagg-profile-handler runs {:?} and {:?})",
                p.name, disagg.decode, disagg.prefill
            ));
        }
    }
    let mut decode = assemble(
        text,
        &decode_spec.name,
        &decode_spec.plugins,
        plugins,
        errors,
    );
    let decider = match &disagg.decider {
        None => {
            warnings.push("disagg-profile-handler: no deciders.prefill, P/D disaggregation off (as llm-d): every request is decode only".into());
            None
        }
        Some(name) => match plugins.get(name) {
            Some((Plugin::Decider(d), _)) => Some(*d),
            Some((_, kind)) => {
                errors.push(format!(
                    "disagg-profile-handler: deciders.prefill {name:?} is a {kind}, not a decider (prefix-based-pd-decider, always-disagg-pd-decider)"
                ));
                None
            }
            None => {
                errors.push(format!(
                    "disagg-profile-handler: deciders.prefill {name:?} names no plugin; plugins: {}",
                    plugins.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
                None
            }
        },
    };
    match (decider, by_name(&disagg.prefill)) {
        (Some(decider), Some(spec)) => {
            let profile = assemble(text, &spec.name, &spec.plugins, plugins, errors);
            decode.prefill = Some(Box::new(PrefillStage { profile, decider }));
        }
        (Some(_), None) => warnings.push(format!(
            "disagg-profile-handler: no schedulingProfile {:?}: every request is decode only (as llm-d)",
            disagg.prefill
        )),
        (None, _) => {}
    }
    Some(decode)
}

/// The one profile of a single-profile-handler (the default `default` profile when none is
/// given).
fn single_profile(
    text: &str,
    doc: &Document,
    plugins: &BTreeMap<String, (Plugin, String)>,
    errors: &mut Vec<String>,
) -> Option<EppProfile> {
    let default_refs: Vec<ProfilePlugin>;
    let (name, refs) = match doc.scheduling_profiles.as_slice() {
        [] => {
            // llm-d: one profile `default` of every filter, scorer and picker.
            default_refs = plugins
                .iter()
                .filter(|(_, (p, _))| {
                    matches!(
                        p,
                        Plugin::Filter(_)
                            | Plugin::Scorer(_)
                            | Plugin::PreciseScorer { .. }
                            | Plugin::Picker(_)
                    )
                })
                .map(|(n, _)| ProfilePlugin {
                    plugin_ref: n.clone(),
                    weight: None,
                })
                .collect();
            ("default".to_string(), default_refs.as_slice())
        }
        [one] => (one.name.clone(), one.plugins.as_slice()),
        many => {
            let names: Vec<&str> = many.iter().map(|p| p.name.as_str()).collect();
            errors.push(format!(
                "schedulingProfiles: {} profiles ({names:?}) need a multi-profile handler (disagg-profile-handler); give one profile or add it",
                many.len()
            ));
            return None;
        }
    };
    Some(assemble(text, &name, refs, plugins, errors))
}

/// One profile from its plugin references.
fn assemble(
    text: &str,
    name: &str,
    refs: &[ProfilePlugin],
    plugins: &BTreeMap<String, (Plugin, String)>,
    errors: &mut Vec<String>,
) -> EppProfile {
    let mut profile = EppProfile {
        name: name.to_string(),
        filters: Vec::new(),
        scorers: Vec::new(),
        picker: EppPicker::MaxScore,
        prefill: None,
        precise: false,
    };
    let mut picker: Option<&str> = None;
    for r in refs {
        let line = at(line_of(text, "pluginRef", &r.plugin_ref));
        let Some((plugin, kind)) = plugins.get(&r.plugin_ref) else {
            errors.push(format!(
                "schedulingProfiles[{}].plugins: pluginRef {:?}{line} names no plugin; plugins: {}",
                profile.name,
                r.plugin_ref,
                plugins.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        if r.weight.is_some() && !matches!(plugin, Plugin::Scorer(_) | Plugin::PreciseScorer { .. })
        {
            errors.push(format!(
                "schedulingProfiles[{}]: pluginRef {:?}{line} ({kind}) is not a scorer and takes no weight",
                profile.name, r.plugin_ref
            ));
        }
        match plugin {
            Plugin::Filter(f) => profile.filters.push(f.clone()),
            Plugin::Scorer(_) | Plugin::PreciseScorer { .. } => {
                let k = match plugin {
                    Plugin::Scorer(k) => k.clone(),
                    _ => PREFIX_DEFAULT,
                };
                let weight = r.weight.unwrap_or(1.0);
                if !(weight.is_finite() && weight >= 0.0) {
                    errors.push(format!(
                        "schedulingProfiles[{}]: weight of {:?}{line} must be a finite number >= 0, got {weight}",
                        profile.name, r.plugin_ref
                    ));
                    continue;
                }
                profile.scorers.push(EppScorer {
                    name: r.plugin_ref.clone(),
                    kind: k,
                    weight,
                });
            }
            Plugin::Picker(p) => {
                if let Some(first) = picker {
                    errors.push(format!(
                        "schedulingProfiles[{}]: two pickers ({first:?} and {:?}{line}); a profile has one",
                        profile.name, r.plugin_ref
                    ));
                }
                picker = Some(&r.plugin_ref);
                profile.picker = *p;
            }
            Plugin::Handler(_)
            | Plugin::Decider(_)
            | Plugin::Precise(_)
            | Plugin::Approximate
            | Plugin::TokenProducer { .. }
            | Plugin::FlowPolicy
            | Plugin::NoEffect => {}
        }
    }
    profile
}

#[cfg(test)]
mod tests;
