//! Configuration: Kthena's `routerConfiguration` YAML plus prefix-picker's own sections.
//!
//! ```yaml
//! scheduler:            # Kthena's block, unchanged (semantics doc §5)
//!   pluginConfig: [{name: prefix-cache, args: {...}}, ...]
//!   plugins:
//!     Filter: {enabled: [least-request]}
//!     Score: {enabled: [{name: prefix-cache, weight: 1}, ...]}
//! auth: {...}           # accepted and ignored (warning)
//! endpoints:            # static discovery
//! - {name: my-model-0, namespace: default, address: 127.0.0.1:8001, models: [m]}  # generation: optional
//! - {name: p-0, address: 127.0.0.1:8002, labels: {role: prefill, group: g0}}  # pdGroup reads labels
//! discovery: {kubernetes: {...}}   # Kubernetes pods, joining the static ones (crate::discovery)
//! pdGroup:              # prefill/decode pairs, Kthena's ModelServer workloadSelector.pdGroup
//!   groupKey: group     # pods pair only within one value of this label
//!   prefillLabels: {role: prefill}
//!   decodeLabels: {role: decode}
//! picker:               # prefix-picker's own knobs (strict: unknown keys are errors)
//!   seed: 0             # tie-breaking RNG seed
//!   maxEndpoints: 5     # primary + fallbacks in the pick (1 for ORIGINAL_DST gateways)
//!   allowTestEndpointSelection: false
//!   maxBodyBytes: 16777216
//!   responseTimeoutSeconds: 600   # unobserved completions are dropped after this
//!   scrapeIntervalSeconds: 1      # engine /metrics period (0 = off)
//!   scrapeTimeoutSeconds: 0.5
//!   scrapeConcurrency: 16
//!   engineMetrics: {totalQueuedRequests: "name{label=value}", ...}  # crate::pod_metrics::names
//!   shutdownDelaySeconds: 0       # SIGTERM: not-ready for this long before closing
//!   shutdownGraceSeconds: 30      # SIGTERM: open streams get this long to finish
//!   tls: {mode: plaintext}        # gRPC port: plaintext | selfSigned | files (see `tls`)
//!   debug: {enabled: false}       # /debug/* on the admin port: off, loopback, token (debug_access)
//!   affinity: {}                  # the affinity mode (crate::scheduler::affinity; keys: config::affinity)
//!   loadShedding: {queueDepth: 5, kvCacheUtilization: 0.8, retryAfterSeconds: 1}  # 429 when every
//!                                 # pod is saturated (crate::scheduler::saturation); absent: off
//!   sessions: {enabled: false}    # session affinity by a request header (sessions)
//! sync: {redis: {url: ...}}       # optional index sharing through Redis (crate::sync::config)
//! ```
//! Kthena's leniencies are kept and warned about: unknown top-level keys, unknown plugin names
//! (`Failed to get plugin <name>.`), `disabled` lists (no effect), `random` next to other scorers
//! (removed). Errors stop start-up and are all reported at once; the weight error is Kthena's
//! exact text.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value as Yaml};
use thiserror::Error;

use crate::debug_access::DebugConfig;
use crate::discovery::{DiscoveryConfig, DiscoveryError};
use crate::pod_metrics::names::EngineMetricNames;
pub use crate::scheduler::config::{FilterKind, SchedulerConfig, ScorerKind};
use crate::scheduler::pd::{PdGroup, PdGroupError};
use crate::scheduler::prefix_cache::PrefixCacheArgs;
use crate::scheduler::saturation::SaturationLimits;
use crate::sessions::SessionsConfig;
use crate::tls::TlsConfig;

/// Plugin names Kthena knows that prefix-picker skips (with Kthena's own warning).
const KNOWN_ELSEWHERE: [&str; 2] = ["lora-affinity", "pd-group"];

mod affinity;
mod kvcache_args;
pub use affinity::{AffinitySection, ExperimentalAffinity, ValidAffinity};
pub use kvcache_args::{ParsedKvCacheArgs, UNPARSABLE_KVCACHE_ARGS, parse_kvcache_aware_args};

/// A statically configured model-server pod.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticEndpoint {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub address: SocketAddr,
    /// Models this pod serves; when no endpoint lists any, every endpoint serves every model.
    #[serde(default)]
    pub models: Vec<String>,
    /// The pod's incarnation (a string or a number; change it when the pod restarts); unset:
    /// the engine's `process_start_time_seconds`, learned by the engine scrape.
    #[serde(default, deserialize_with = "generation")]
    pub generation: Option<String>,
    /// The pod's labels (`pdGroup` sorts pods into prefill and decode by them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where the pod's engine publishes KV-cache events (`tcp://host:port`, vLLM's
    /// `--kv-events-config` `endpoint` as seen from the picker); unset: none.
    #[serde(default, rename = "kvEventsEndpoint")]
    pub kv_events_endpoint: Option<String>,
    /// Its replay socket (`replay_endpoint`), which fills gaps; unset: a gap drops the view.
    #[serde(default, rename = "kvEventsReplayEndpoint")]
    pub kv_events_replay_endpoint: Option<String>,
}

/// `pdGroup:`, as written (Kthena's ModelServer `spec.workloadSelector.pdGroup`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PdGroupSection {
    group_key: String,
    prefill_labels: BTreeMap<String, String>,
    decode_labels: BTreeMap<String, String>,
}

/// A `generation:` value: a string, or a number taken as written.
fn generation<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    use serde::de::Error;
    match Yaml::deserialize(d)? {
        Yaml::String(s) => Ok(Some(s)),
        Yaml::Number(n) => Ok(Some(n.to_string())),
        other => Err(D::Error::custom(format!(
            "generation must be a string or a number, got {}",
            show(&other)
        ))),
    }
}

fn default_namespace() -> String {
    "default".to_string()
}

/// prefix-picker's own knobs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerConfig {
    pub seed: u64,
    pub max_endpoints: usize,
    pub allow_test_endpoint_selection: bool,
    pub max_body_bytes: usize,
    pub response_timeout_seconds: u64,
    /// Engine metrics scrape period (0 disables scraping).
    pub scrape_interval_seconds: f64,
    pub scrape_timeout_seconds: f64,
    pub scrape_concurrency: usize,
    /// Engine metric names per signal (GIE's metric specs); unset: the built-in names.
    pub engine_metrics: EngineMetricNames,
    /// On SIGTERM: seconds reported not-ready before streams stop being accepted.
    pub shutdown_delay_seconds: f64,
    /// On SIGTERM: seconds open streams get to finish.
    pub shutdown_grace_seconds: f64,
    /// TLS on the gRPC port.
    pub tls: TlsConfig,
    /// The admin listener's `/debug/*` routes: off unless enabled (see [`crate::debug_access`]).
    pub debug: DebugConfig,
    /// The affinity mode (`picker.affinity`); absent: Kthena's scheduler, exactly.
    pub affinity: Option<AffinitySection>,
    /// Session affinity (`picker.sessions`, see [`crate::sessions`]); off by default.
    pub sessions: SessionsConfig,
    /// Load shedding (`picker.loadShedding`); absent: never shed.
    #[serde(deserialize_with = "load_shedding")]
    pub load_shedding: Option<LoadSheddingSection>,
    /// KV-cache events (`picker.kvEvents`, [`crate::engine_events`]).
    pub kv_events: crate::engine_events::KvEventsSection,
    /// Engine tokens of prompts (`picker.tokenizer`, [`crate::tokenizer::heads`]); absent:
    /// pods with events are matched by the estimate.
    pub tokenizer: Option<crate::tokenizer::heads::TokenizerSection>,
}

/// `picker.loadShedding`, its errors naming the key (`loadShedding.queueDepth: invalid type`).
fn load_shedding<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<LoadSheddingSection>, D::Error> {
    use serde::de::Error;
    let value = Yaml::deserialize(d)?;
    if value.is_null() {
        return Ok(None);
    }
    serde_path_to_error::deserialize(value)
        .map(Some)
        .map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                D::Error::custom(format!("loadShedding: {inner}"))
            } else {
                D::Error::custom(format!("loadShedding.{path}: {inner}"))
            }
        })
}

/// `picker.loadShedding`, as written (see [`SaturationLimits`] and docs/routing.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LoadSheddingSection {
    pub enabled: bool,
    pub queue_depth: u32,
    pub kv_cache_utilization: f64,
    pub max_in_flight_per_pod: Option<u32>,
    /// Unset: three scrape intervals.
    pub metrics_staleness_seconds: Option<f64>,
    pub retry_after_seconds: u32,
}

impl Default for LoadSheddingSection {
    fn default() -> Self {
        let d = SaturationLimits::default();
        LoadSheddingSection {
            enabled: true,
            queue_depth: d.queue_depth,
            kv_cache_utilization: d.kv_cache_utilization,
            max_in_flight_per_pod: d.max_inflight,
            metrics_staleness_seconds: None,
            retry_after_seconds: 1,
        }
    }
}

impl LoadSheddingSection {
    /// The validated limits, `None` when `enabled: false`; errors name the key and value.
    /// `scrape_interval` (seconds, 0 = off) sizes the default staleness bound.
    pub fn validate(&self, scrape_interval: f64) -> Result<Option<SaturationLimits>, ConfigError> {
        let bad = |key: &str, value: String, want: &str| {
            Err(ConfigError::Picker(format!(
                "loadShedding.{key} must be {want}, got {value}"
            )))
        };
        if !self.enabled {
            return Ok(None);
        }
        if !(0.0..=1.0).contains(&self.kv_cache_utilization) {
            return bad(
                "kvCacheUtilization",
                self.kv_cache_utilization.to_string(),
                "in 0..=1",
            );
        }
        if self.max_in_flight_per_pod == Some(0) {
            return bad("maxInFlightPerPod", "0".into(), "> 0 (or unset)");
        }
        if !(1..=3600).contains(&self.retry_after_seconds) {
            return bad(
                "retryAfterSeconds",
                self.retry_after_seconds.to_string(),
                "in 1..=3600",
            );
        }
        let staleness = match self.metrics_staleness_seconds {
            Some(s) if !(s.is_finite() && s > 0.0 && s <= 86_400.0) => {
                return bad(
                    "metricsStalenessSeconds",
                    s.to_string(),
                    "a number of seconds in (0, 86400]",
                );
            }
            Some(s) if s < scrape_interval => {
                return bad(
                    "metricsStalenessSeconds",
                    s.to_string(),
                    &format!(
                        "at least scrapeIntervalSeconds ({scrape_interval}), or every pod's engine metrics go stale between scrapes"
                    ),
                );
            }
            Some(s) => s,
            None if scrape_interval > 0.0 => 3.0 * scrape_interval,
            None => 3.0,
        };
        Ok(Some(SaturationLimits {
            queue_depth: self.queue_depth,
            kv_cache_utilization: self.kv_cache_utilization,
            max_inflight: self.max_in_flight_per_pod,
            staleness: Duration::try_from_secs_f64(staleness).unwrap_or(Duration::MAX),
        }))
    }
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            seed: 0,
            max_endpoints: 5,
            allow_test_endpoint_selection: false,
            max_body_bytes: 16 << 20,
            response_timeout_seconds: 600,
            scrape_interval_seconds: 1.0,
            scrape_timeout_seconds: 0.5,
            scrape_concurrency: 16,
            engine_metrics: EngineMetricNames::default(),
            shutdown_delay_seconds: 0.0,
            shutdown_grace_seconds: 30.0,
            tls: TlsConfig::default(),
            debug: DebugConfig::default(),
            affinity: None,
            sessions: SessionsConfig::default(),
            load_shedding: None,
            kv_events: crate::engine_events::KvEventsSection::default(),
            tokenizer: None,
        }
    }
}

/// The warning for load shedding that can never shed.
pub const NOTHING_TO_SHED: &str = "picker.loadShedding never sheds: engine scraping is off (scrapeIntervalSeconds: 0) and maxInFlightPerPod is unset";

/// Kthena's `auth:` (JWT validation) is not implemented: a router it protected is open here,
/// so the warning says so in words, naming the key (`validate` and the start-up log print it).
pub(crate) const AUTH_IGNORED: &str = "auth: ignored: prefix-picker does not validate Kthena's \
     JWTs, so requests are NOT authenticated (a router that auth: protected is open here); \
     authenticate at the gateway (e.g. Envoy's jwt_authn filter, Istio's RequestAuthentication)";

/// The warning for a config with neither `endpoints:` nor `discovery:`.
pub const NO_ENDPOINTS: &str = "no endpoints configured: every request will get 503";

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub scheduler: SchedulerConfig,
    pub endpoints: Vec<StaticEndpoint>,
    pub picker: PickerConfig,
    /// `discovery:` (Kubernetes), see [`crate::discovery`].
    pub discovery: DiscoveryConfig,
    /// `sync:` (Redis Streams sharing of the prefix index), when present.
    pub sync: Option<crate::sync::SyncConfig>,
    /// Leniencies applied while loading (log them).
    pub warnings: Vec<String>,
    /// Environment values read before the process environment (kvcache-aware's `REDIS_*`);
    /// never from the file: tests set them so that they never touch the process environment.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("config is not valid YAML: {0}")]
    Yaml(String),
    #[error("config must be a YAML mapping")]
    NotMapping,
    #[error(
        "failed to Load Scheduler: failed to Unmarshal Plugins: score plugin {name:?} must set a weight greater than 0, got {weight}"
    )]
    Weight { name: String, weight: i64 },
    #[error("failed to Load Scheduler: failed to Unmarshal Plugins: {0}")]
    Plugins(String),
    #[error(
        "failed to Load Scheduler: least-latency: TTFTTPOTWeightFactor must be a finite number in [0, 1], got {0}"
    )]
    WeightFactor(String),
    #[error("endpoints: {0}")]
    Endpoints(String),
    #[error("picker: {0}")]
    Picker(String),
    #[error("{0}")]
    Discovery(#[from] DiscoveryError),
    #[error("sync: {0}")]
    Sync(String),
    #[error("pdGroup: {0}")]
    PdGroupSyntax(String),
    #[error("{0}")]
    PdGroup(#[from] PdGroupError),
    #[error(
        "this is GIE's EndpointPickerConfig ({0}); prefix-picker takes a Kthena routerConfiguration (scheduler:, endpoints:, discovery:, picker:). With GIE's inferencepool chart set inferenceExtension.pluginsCustomConfig.<file> to a routerConfiguration and inferenceExtension.pluginsConfigFile to <file>, or pass one with --config-text (see docs/gateways.md)"
    )]
    EndpointPickerConfig(String),
}

/// Every problem found in a config.
#[derive(Debug, Error, PartialEq)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl Config {
    /// The environment variable `name`: [`Config::env`] first, then the process's.
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError::Read {
                path: path.display().to_string(),
                message: e.to_string(),
            }])
        })?;
        Config::parse(&text)
    }

    /// Parses and validates a config document.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        let doc: Yaml = serde_yaml_ng::from_str(text)
            .map_err(|e| ConfigErrors(vec![ConfigError::Yaml(e.to_string())]))?;
        let root = match doc {
            Yaml::Mapping(m) => m,
            Yaml::Null => Mapping::new(),
            _ => return Err(ConfigErrors(vec![ConfigError::NotMapping])),
        };
        if let Some(found) = endpoint_picker_config(&root) {
            return Err(ConfigErrors(vec![ConfigError::EndpointPickerConfig(found)]));
        }
        let mut config = Config::default();
        let mut errors = Vec::new();
        let mut pd = None;
        for (key, value) in &root {
            match key.as_str() {
                Some("scheduler") => {
                    config.scheduler = parse_scheduler(value, &mut config.warnings, &mut errors);
                }
                Some("auth") => config.warnings.push(AUTH_IGNORED.into()),
                Some("endpoints") => match serde_yaml_ng::from_value(value.clone()) {
                    Ok(eps) => config.endpoints = eps,
                    Err(e) => errors.push(ConfigError::Endpoints(e.to_string())),
                },
                Some("discovery") => match DiscoveryConfig::parse(value) {
                    Ok(d) => config.discovery = d,
                    Err(e) => errors.push(e.into()),
                },
                Some("picker") => match serde_yaml_ng::from_value(value.clone()) {
                    Ok(p) => config.picker = p,
                    Err(e) => errors.push(ConfigError::Picker(e.to_string())),
                },
                Some("sync") => match crate::sync::SyncConfig::parse(value) {
                    Ok(s) => config.sync = Some(s),
                    Err(e) => errors.push(ConfigError::Sync(e)),
                },
                Some("pdGroup") => match parse_pd_group(value) {
                    Ok(g) => pd = Some(g),
                    Err(e) => errors.push(e),
                },
                _ => config
                    .warnings
                    .push(format!("unknown top-level key {} ignored", show(key))),
            }
        }
        validate_endpoints(&config.endpoints, &mut errors);
        if let Some(g) = &pd {
            warn_unpaired(g, &config.endpoints, &mut config.warnings);
        }
        config.scheduler.pd = pd;
        if config
            .discovery
            .kubernetes
            .as_ref()
            .is_some_and(|k| k.role_label.is_some())
        {
            config.warnings.push(ROLE_LABEL_DEPRECATED.into());
        }
        if config.endpoints.is_empty() && config.discovery.kubernetes.is_none() {
            config.warnings.push(NO_ENDPOINTS.into());
        }
        if !(1..=5).contains(&config.picker.max_endpoints) {
            errors.push(ConfigError::Picker(format!(
                "maxEndpoints must be between 1 and 5, got {}",
                config.picker.max_endpoints
            )));
        }
        let p = &config.picker;
        let interval_ok = p.scrape_interval_seconds.is_finite() && p.scrape_interval_seconds >= 0.0;
        let timeout_ok = p.scrape_timeout_seconds.is_finite() && p.scrape_timeout_seconds > 0.0;
        let shutdown_ok = [p.shutdown_delay_seconds, p.shutdown_grace_seconds]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0);
        if !shutdown_ok {
            errors.push(ConfigError::Picker(format!(
                "shutdownDelaySeconds and shutdownGraceSeconds must be >= 0, got {} and {}",
                p.shutdown_delay_seconds, p.shutdown_grace_seconds
            )));
        }
        if !interval_ok || !timeout_ok {
            errors.push(ConfigError::Picker(format!(
                "scrapeIntervalSeconds must be >= 0 and scrapeTimeoutSeconds > 0, got {} and {}",
                p.scrape_interval_seconds, p.scrape_timeout_seconds
            )));
        }
        if config.picker.max_body_bytes == 0 {
            errors.push(ConfigError::Picker("maxBodyBytes must be > 0".into()));
        }
        if let Some(section) = &config.picker.affinity {
            match section.validate() {
                Ok(valid) => {
                    config.warnings.extend(valid.warnings);
                    config.scheduler.apply_affinity(valid.mode);
                }
                Err(e) => errors.push(e),
            }
        }
        if let Some(section) = &config.picker.load_shedding {
            match section.validate(p.scrape_interval_seconds) {
                Ok(limits) => {
                    let blind = limits.is_some_and(|l| l.max_inflight.is_none())
                        && config.picker.scrape_interval_seconds == 0.0;
                    if blind {
                        config.warnings.push(NOTHING_TO_SHED.into());
                    }
                    config.scheduler.load_shedding = limits;
                }
                Err(e) => errors.push(e),
            }
        }
        for e in config.picker.tls.validate() {
            errors.push(ConfigError::Picker(e.to_string()));
        }
        for e in config.picker.debug.validate() {
            errors.push(ConfigError::Picker(e.to_string()));
        }
        for e in config.picker.sessions.validate() {
            errors.push(ConfigError::Picker(e.to_string()));
        }
        if let Some(t) = &mut config.picker.tokenizer {
            let invalid = t.validate();
            if invalid.is_empty() {
                match t.load() {
                    Ok(warning) => config.warnings.extend(warning),
                    Err(e) => errors.push(ConfigError::Picker(e)),
                }
            }
            for e in invalid {
                errors.push(ConfigError::Picker(e));
            }
        }
        let publishing = config
            .endpoints
            .iter()
            .any(|e| e.kv_events_endpoint.is_some());
        if publishing && (config.picker.affinity.is_none() || config.picker.tokenizer.is_none()) {
            config.warnings.push(
                "kvEventsEndpoint: the pods' events are followed, but only the affinity mode with picker.tokenizer matches by them; these pods are matched by the estimate (docs/engine-truth.md)".into(),
            );
        }
        if config.picker.kv_events.max_blocks_per_pod == 0 {
            errors.push(ConfigError::Picker(
                "kvEvents.maxBlocksPerPod must be > 0, got 0".into(),
            ));
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

/// The warning for `discovery.kubernetes.roleLabel`.
pub const ROLE_LABEL_DEPRECATED: &str = "discovery.kubernetes.roleLabel is deprecated and will be removed in the next release: it only labels prefix_picker_discovery_endpoints; prefill/decode routing is configured with pdGroup (docs/configuration.md)";

/// `pdGroup:` into a [`PdGroup`]; errors name the key and the value.
fn parse_pd_group(value: &Yaml) -> Result<PdGroup, ConfigError> {
    let section: PdGroupSection = serde_yaml_ng::from_value(value.clone())
        .map_err(|e| ConfigError::PdGroupSyntax(e.to_string()))?;
    Ok(PdGroup::try_new(
        section.group_key,
        section.prefill_labels,
        section.decode_labels,
    )?)
}

/// Warns of static endpoints `group` sorts into neither role: they get no inference traffic.
fn warn_unpaired(group: &PdGroup, endpoints: &[StaticEndpoint], warnings: &mut Vec<String>) {
    for e in endpoints {
        if group
            .classify(|k| e.labels.get(k).map(String::as_str))
            .is_none()
        {
            warnings.push(format!(
                "endpoint {}/{} is neither a prefill nor a decode pod of pdGroup (labels {:?}; a pod needs a non-empty {:?} label and every prefillLabels or decodeLabels label): it gets no inference traffic",
                e.namespace,
                e.name,
                e.labels,
                group.group_key()
            ));
        }
    }
}

/// `kind: EndpointPickerConfig` or an `inference.networking.x-k8s.io` apiVersion: the config GIE's
/// chart mounts for its own picker, named as found.
fn endpoint_picker_config(root: &Mapping) -> Option<String> {
    let kind = get(root, "kind").and_then(Yaml::as_str).unwrap_or_default();
    let api = get(root, "apiVersion")
        .and_then(Yaml::as_str)
        .unwrap_or_default();
    (kind == "EndpointPickerConfig" || api.starts_with("inference.networking.x-k8s.io"))
        .then(|| format!("apiVersion: {api}, kind: {kind}"))
}

fn show(v: &Yaml) -> String {
    serde_yaml_ng::to_string(v)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Yaml> {
    map.get(key)
}

fn parse_scheduler(
    value: &Yaml,
    warnings: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> SchedulerConfig {
    let mut s = SchedulerConfig::default();
    let Yaml::Mapping(map) = value else {
        errors.push(ConfigError::Plugins("scheduler must be a mapping".into()));
        return s;
    };
    // pluginConfig: per-plugin args.
    let mut prefix_args = None;
    let mut kvcache_args = None;
    if let Some(list) = get(map, "pluginConfig") {
        let Yaml::Sequence(list) = list else {
            errors.push(ConfigError::Plugins("pluginConfig must be a list".into()));
            return s;
        };
        for item in list {
            let name = item.get("name").and_then(Yaml::as_str).unwrap_or_default();
            let args = item.get("args");
            match name {
                "prefix-cache" => prefix_args = Some(args.cloned()),
                "kvcache-aware" => kvcache_args = Some(args.cloned()),
                "least-request" => {
                    if let Some(n) = args
                        .and_then(|a| lookup_ci(a, "maxWaitingRequests"))
                        .and_then(Yaml::as_i64)
                    {
                        s.max_waiting_requests = if n > 0 { n as u64 } else { 10 };
                    }
                }
                "least-latency" => {
                    if let Some(v) = args.and_then(|a| lookup_ci(a, "TTFTTPOTWeightFactor")) {
                        match v.as_f64() {
                            Some(f) if f.is_finite() && (0.0..=1.0).contains(&f) => {
                                s.ttft_tpot_weight_factor = f
                            }
                            _ => errors.push(ConfigError::WeightFactor(show(v))),
                        }
                    }
                }
                other => warnings.push(format!("pluginConfig for {other:?} ignored")),
            }
        }
    }
    let parsed = parse_prefix_cache_args(prefix_args.flatten().as_ref());
    s.prefix_cache = parsed.args;
    warnings.extend(parsed.warnings);
    let parsed = parse_kvcache_aware_args(kvcache_args.flatten().as_ref());
    s.kvcache_aware = parsed.args;
    warnings.extend(parsed.warnings);

    let Some(plugins) = get(map, "plugins") else {
        return s;
    };
    let Yaml::Mapping(plugins) = plugins else {
        errors.push(ConfigError::Plugins("plugins must be a mapping".into()));
        return s;
    };
    if let Some(filter) = get(plugins, "Filter") {
        s.filters.clear();
        if filter.get("disabled").is_some() {
            warnings.push("plugins.Filter.disabled has no effect".into());
        }
        for name in filter
            .get("enabled")
            .and_then(Yaml::as_sequence)
            .into_iter()
            .flatten()
        {
            match name.as_str() {
                Some("least-request") => s.filters.push(FilterKind::LeastRequest),
                Some(other) => warnings.push(format!("Failed to get plugin {other}.")),
                None => errors.push(ConfigError::Plugins(format!(
                    "filter plugin names must be strings, got {}",
                    show(name)
                ))),
            }
        }
    }
    if let Some(score) = get(plugins, "Score") {
        s.scorers.clear();
        if score.get("disabled").is_some() {
            warnings.push("plugins.Score.disabled has no effect".into());
        }
        for item in score
            .get("enabled")
            .and_then(Yaml::as_sequence)
            .into_iter()
            .flatten()
        {
            let Some(name) = item.get("name").and_then(Yaml::as_str) else {
                errors.push(ConfigError::Plugins(format!(
                    "score plugin entry without a name: {}",
                    show(item)
                )));
                continue;
            };
            let weight = match item.get("weight") {
                None | Some(Yaml::Null) => 0,
                Some(w) => match w.as_i64() {
                    Some(w) => w,
                    None => {
                        errors.push(ConfigError::Plugins(format!(
                            "score plugin {name:?} weight must be an integer, got {}",
                            show(w)
                        )));
                        continue;
                    }
                },
            };
            if weight <= 0 {
                errors.push(ConfigError::Weight {
                    name: name.to_string(),
                    weight,
                });
                continue;
            }
            match ScorerKind::from_name(name) {
                Some(kind) => s.scorers.push((kind, weight.min(u32::MAX as i64) as u32)),
                None if KNOWN_ELSEWHERE.contains(&name) => warnings.push(format!(
                    "Failed to get plugin {name}. (not implemented by prefix-picker; skipped)"
                )),
                None => warnings.push(format!("Failed to get plugin {name}.")),
            }
        }
        if s.scorers.len() > 1 && s.scorers.iter().any(|(k, _)| *k == ScorerKind::Random) {
            s.scorers.retain(|(k, _)| *k != ScorerKind::Random);
            warnings.push("random score plugin removed: it cannot be combined with others".into());
        }
    }
    s
}

/// The exact log line Kthena writes when the args block cannot be parsed.
pub const UNPARSABLE_ARGS: &str = "Failed to unmarshal PrefixCacheArgs, using default values";

/// prefix-cache's arguments plus the warnings their parsing produced (for the caller to log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedArgs {
    pub args: PrefixCacheArgs,
    pub warnings: Vec<String>,
}

const KEYS: [&str; 4] = [
    "blockSizeToHash",
    "maxBlocksToMatch",
    "maxHashCacheSize",
    "topKMatches",
];

/// Parses prefix-cache's `args` value with Kthena's leniency (never fails): omitted, zero or
/// negative -> default; unknown names are ignored with a warning; an args block that cannot be
/// parsed (a string value, a fraction, a list) gives all defaults and [`UNPARSABLE_ARGS`].
pub fn parse_prefix_cache_args(args: Option<&Yaml>) -> ParsedArgs {
    let mut warnings = Vec::new();
    let mut values: [Option<i64>; 4] = [None; 4];
    let parsed = match args {
        None | Some(Yaml::Null) => true,
        Some(Yaml::Mapping(map)) => map.iter().all(|(k, v)| {
            let Some(name) = k.as_str() else {
                return false;
            };
            let Some(slot) = KEYS.iter().position(|key| key.eq_ignore_ascii_case(name)) else {
                warnings.push(format!(
                    "prefix-cache: unknown argument {name:?} ignored (known: {})",
                    KEYS.join(", ")
                ));
                return true;
            };
            match integral(v) {
                Ok(n) => {
                    values[slot] = n;
                    true
                }
                Err(()) => false,
            }
        }),
        Some(_) => false,
    };
    if !parsed {
        warnings.clear();
        warnings.push(UNPARSABLE_ARGS.to_string());
        return ParsedArgs {
            args: PrefixCacheArgs::default(),
            warnings,
        };
    }
    let d = PrefixCacheArgs::default();
    let pick = |v: Option<i64>, default: usize| match v {
        Some(n) if n > 0 => usize::try_from(n).unwrap_or(default),
        _ => default,
    };
    ParsedArgs {
        args: PrefixCacheArgs {
            block_size_to_hash: pick(values[0], d.block_size_to_hash),
            max_blocks_to_match: pick(values[1], d.max_blocks_to_match),
            max_hash_cache_size: pick(values[2], d.max_hash_cache_size).min(u32::MAX as usize - 1),
            top_k_matches: pick(values[3], d.top_k_matches),
        },
        warnings,
    }
}

/// An integer, an integral float, or null (= omitted); anything else is unparsable.
fn integral(v: &Yaml) -> Result<Option<i64>, ()> {
    match v {
        Yaml::Null => Ok(None),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i))
            } else if n.is_u64() {
                Err(())
            } else {
                let f = n.as_f64().ok_or(())?;
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Ok(Some(f as i64))
                } else {
                    Err(())
                }
            }
        }
        _ => Err(()),
    }
}

fn lookup_ci<'a>(args: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    args.as_mapping()?
        .iter()
        .find(|(k, _)| k.as_str().is_some_and(|k| k.eq_ignore_ascii_case(key)))
        .map(|(_, v)| v)
}

fn validate_endpoints(endpoints: &[StaticEndpoint], errors: &mut Vec<ConfigError>) {
    let mut names = std::collections::HashSet::new();
    let mut addresses = std::collections::HashSet::new();
    for e in endpoints {
        if e.name.is_empty() || e.namespace.is_empty() {
            errors.push(ConfigError::Endpoints(format!(
                "endpoint {} needs a non-empty name and namespace",
                e.address
            )));
        }
        if !names.insert((&e.namespace, &e.name)) {
            errors.push(ConfigError::Endpoints(format!(
                "duplicate endpoint {}/{}",
                e.namespace, e.name
            )));
        }
        if e.generation.as_deref() == Some("") {
            errors.push(ConfigError::Endpoints(format!(
                "endpoint {}/{}: generation must not be empty (leave it out to use the engine's start time)",
                e.namespace, e.name
            )));
        }
        for (key, value) in [
            ("kvEventsEndpoint", &e.kv_events_endpoint),
            ("kvEventsReplayEndpoint", &e.kv_events_replay_endpoint),
        ] {
            if let Some(v) = value
                && !is_tcp_endpoint(v)
            {
                errors.push(ConfigError::Endpoints(format!(
                    "endpoint {}/{}: {key} must be tcp://host:port, got {v:?}",
                    e.namespace, e.name
                )));
            }
        }
        if e.kv_events_replay_endpoint.is_some() && e.kv_events_endpoint.is_none() {
            errors.push(ConfigError::Endpoints(format!(
                "endpoint {}/{}: kvEventsReplayEndpoint needs kvEventsEndpoint",
                e.namespace, e.name
            )));
        }
        if !addresses.insert(e.address) {
            errors.push(ConfigError::Endpoints(format!(
                "duplicate address {}",
                e.address
            )));
        }
    }
}

impl Config {
    /// One line per static endpoint saying how the affinity mode matches it: by its engine's
    /// KV-cache events or by the estimate (and why). Empty without static endpoints.
    pub fn match_sources(&self) -> Vec<String> {
        let affinity = self.picker.affinity.is_some();
        let tokenizer = self.picker.tokenizer.as_ref();
        self.endpoints
            .iter()
            .map(|e| {
                let source = match (&e.kv_events_endpoint, affinity, tokenizer.is_some()) {
                    (Some(at), true, true) => format!(
                        "engine KV events ({at}), tokens from {}",
                        tokenizer.map(|t| t.describe()).unwrap_or_default()
                    ),
                    (Some(_), false, _) => {
                        "estimate (kvEventsEndpoint is used by the affinity mode only)".to_string()
                    }
                    (Some(_), true, false) => {
                        "estimate (kvEventsEndpoint needs picker.tokenizer)".to_string()
                    }
                    (None, _, _) => "estimate".to_string(),
                };
                format!("  {}/{}: matched by {source}", e.namespace, e.name)
            })
            .collect()
    }
}

/// `tcp://host:port` with a port (the only transport the subscriber speaks).
pub fn is_tcp_endpoint(value: &str) -> bool {
    value
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests;
