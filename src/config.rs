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
//!   flowControl: {}               # hold requests while every pod is full (flow_control); on by
//!                                 # default with the affinity mode
//! sync: {redis: {url: ...}}       # optional index sharing through Redis (crate::sync::config)
//! ```
//! An `EndpointPickerConfig` (llm-d's, by `kind:`) is read instead of `scheduler:`, strictly
//! ([`endpoint_picker`]), beside the same `endpoints`/`discovery`/`picker`/`sync` sections.
//! Kthena's leniencies are kept and warned about: unknown top-level keys, unknown plugin names
//! (`Failed to get plugin <name>.`), `disabled` lists (no effect), `random` next to other scorers
//! (removed). Errors stop start-up and are all reported at once; the weight error is Kthena's
//! exact text.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value as Yaml};
use thiserror::Error;

use crate::discovery::{DiscoveryConfig, DiscoveryError};
pub use crate::scheduler::config::{FilterKind, SchedulerConfig, ScorerKind};
use crate::scheduler::pd::{PdGroup, PdGroupError};

mod affinity;
pub mod endpoint_picker;
mod endpoints;
mod kvcache_args;
mod location;
mod picker;
mod prefix_cache_args;
mod scheduler;
pub use affinity::{AffinitySection, ExperimentalAffinity, ValidAffinity};
pub use endpoints::{StaticEndpoint, is_tcp_endpoint};
pub use kvcache_args::{ParsedKvCacheArgs, UNPARSABLE_KVCACHE_ARGS, parse_kvcache_aware_args};
pub use picker::{LoadSheddingSection, NOTHING_TO_SHED, PickerConfig};
pub use prefix_cache_args::{ParsedArgs, UNPARSABLE_ARGS, parse_prefix_cache_args};
use scheduler::parse_scheduler;

/// `pdGroup:`, as written (Kthena's ModelServer `spec.workloadSelector.pdGroup`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PdGroupSection {
    group_key: String,
    prefill_labels: BTreeMap<String, String>,
    decode_labels: BTreeMap<String, String>,
}

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
    /// `auth.jwksUri` is set: Kthena would authenticate each request and know its user by its
    /// JWT's `sub` (flow control's flows, with Kthena's fairness settings).
    pub jwt_auth: bool,
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
    /// Kthena's fairness settings (its router's environment, read in Kthena's mode).
    #[error("{0}")]
    KthenaFairness(#[from] crate::flow_control::kthena::KthenaFairnessError),
    /// A problem of an `EndpointPickerConfig` document; `file` is ` <path>` once known.
    #[error("EndpointPickerConfig{file}: {message}")]
    EndpointPicker { file: String, message: String },
    /// A problem of a document read from `file`, where it is: `<file>:<line>: <field>:
    /// <error>` ([`ConfigErrors::in_file`]).
    #[error("{}", located(.file, *.line, .field, .error))]
    Located {
        file: String,
        line: Option<usize>,
        field: String,
        error: Box<ConfigError>,
    },
}

fn located(file: &str, line: Option<usize>, field: &str, error: &ConfigError) -> String {
    match line {
        Some(n) => format!("{file}:{n}: {field}: {error}"),
        None => format!("{file}: {field}: {error}"),
    }
}

impl ConfigError {
    /// Where in `text` the problem is (`None`: nowhere in particular, or already said).
    fn locate(&self, text: &str) -> Option<location::Location> {
        use location::{Location, key_line, line_with, serde_error};
        let at = |path: &[&str]| Location {
            line: key_line(text, path),
            field: path.join("."),
        };
        let quoted = |m: &str| m.split('"').nth(1).map(str::to_string);
        Some(match self {
            ConfigError::Weight { name, .. } => {
                let enabled = ["scheduler", "plugins", "Score", "enabled"];
                Location {
                    line: line_with(text, &enabled, name),
                    field: format!("scheduler.plugins.Score.enabled[{name}].weight"),
                }
            }
            ConfigError::Plugins(m) => match quoted(m) {
                Some(name) => Location {
                    line: line_with(text, &["scheduler", "plugins"], &name)
                        .or_else(|| key_line(text, &["scheduler"])),
                    field: format!("scheduler.plugins[{name}]"),
                },
                None => at(&["scheduler", "plugins"]),
            },
            ConfigError::WeightFactor(_) => Location {
                line: line_with(text, &["scheduler", "pluginConfig"], "TTFTTPOTWeightFactor"),
                field: "scheduler.pluginConfig[least-latency].args.TTFTTPOTWeightFactor".into(),
            },
            ConfigError::Endpoints(_) => serde_error::<Vec<StaticEndpoint>>(text, "endpoints")
                .unwrap_or_else(|| at(&["endpoints"])),
            ConfigError::Picker(m) => {
                serde_error::<PickerConfig>(text, "picker").unwrap_or_else(|| {
                    let head: String = m
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                        .collect();
                    let mut path = vec!["picker"];
                    path.extend(head.split('.').filter(|s| !s.is_empty()));
                    at(&path)
                })
            }
            ConfigError::PdGroupSyntax(_) => {
                serde_error::<PdGroupSection>(text, "pdGroup").unwrap_or_else(|| at(&["pdGroup"]))
            }
            ConfigError::PdGroup(_) => at(&["pdGroup"]),
            ConfigError::Discovery(_) => at(&["discovery"]),
            ConfigError::Sync(_) => at(&["sync"]),
            ConfigError::Yaml(m) => Location {
                line: m
                    .split_once("at line ")
                    .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse().ok()),
                field: "document".into(),
            },
            ConfigError::NotMapping => Location {
                line: Some(1),
                field: "document".into(),
            },
            ConfigError::Read { .. }
            | ConfigError::KthenaFairness(_)
            | ConfigError::EndpointPicker { .. }
            | ConfigError::Located { .. } => return None,
        })
    }
}

/// Every problem found in a config.
#[derive(Debug, Error, PartialEq)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The errors of the document `text` read from `origin` (a path, `--config-text`): those
    /// that name no file name it, with the line and the field ([`location`]).
    pub fn in_file(self, origin: &str, text: &str) -> ConfigErrors {
        let errors = self.0.into_iter().map(|mut e| {
            if let ConfigError::EndpointPicker { file, .. } = &mut e
                && file.is_empty()
            {
                *file = format!(" {origin}");
            }
            match e.locate(text) {
                Some(at) => ConfigError::Located {
                    file: origin.to_string(),
                    line: at.line,
                    field: at.field,
                    error: Box::new(e),
                },
                None => e,
            }
        });
        ConfigErrors(errors.collect())
    }
}

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
        Config::parse(&text).map_err(|e| e.in_file(&path.display().to_string(), &text))
    }

    /// [`Config::parse`] of a document read from `epp.yaml` (its errors name that file).
    #[cfg(test)]
    pub(crate) fn load_text_for_test(text: &str) -> Result<Config, ConfigErrors> {
        Config::parse(text).map_err(|e| e.in_file("epp.yaml", text))
    }

    /// [`Config::parse_with_env`] with the process's environment.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with_env(text, &|name| std::env::var(name).ok())
    }

    /// Parses and validates a config document: the sections read, then each checked in turn
    /// (endpoints, pairs, discovery, the picker's numbers, the modes, Kthena's fairness
    /// settings from `env`, the listeners, the tokenizer, KV events). Every problem is
    /// reported, not just the first.
    pub fn parse_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let root = root_mapping(text).map_err(|e| ConfigErrors(vec![e]))?;
        let mut config = Config::default();
        let mut errors = Vec::new();
        let pd = if endpoint_picker::is_endpoint_picker_config(&root) {
            config.read_endpoint_picker(text, &root, &mut errors)
        } else {
            config.read_sections(&root, &mut errors)
        };
        endpoints::validate_endpoints(&config.endpoints, &mut errors);
        config.pair_pods(pd);
        config.warn_discovery();
        config.picker.check_numbers(&mut errors);
        config.apply_affinity(&mut errors);
        config.apply_load_shedding(&mut errors);
        config.check_lora_affinity(&mut errors);
        config.apply_kthena_fairness(env, &mut errors);
        config.apply_flow_control(&mut errors);
        config.picker.check_sections(&mut errors);
        config.load_tokenizer(&mut errors);
        config.check_kv_events(&mut errors);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The top-level sections into `self`, one error per section that does not parse; unknown
    /// keys are warnings (Kthena's leniency). Returns `pdGroup:`, which needs the endpoints.
    /// A table of keys: each section's parser is named beside its key.
    fn read_sections(&mut self, root: &Mapping, errors: &mut Vec<ConfigError>) -> Option<PdGroup> {
        let mut pd = None;
        for (key, value) in root {
            match key.as_str() {
                Some("scheduler") => {
                    self.scheduler = parse_scheduler(value, &mut self.warnings, errors);
                }
                Some("auth") => {
                    self.warnings.push(AUTH_IGNORED.into());
                    self.jwt_auth = value
                        .get("jwksUri")
                        .and_then(Yaml::as_str)
                        .is_some_and(|u| !u.is_empty());
                }
                Some("endpoints") => match serde_yaml_ng::from_value(value.clone()) {
                    Ok(eps) => self.endpoints = eps,
                    Err(e) => errors.push(ConfigError::Endpoints(e.to_string())),
                },
                Some("discovery") => match DiscoveryConfig::parse(value) {
                    Ok(d) => self.discovery = d,
                    Err(e) => errors.push(e.into()),
                },
                Some("picker") => match serde_yaml_ng::from_value(value.clone()) {
                    Ok(p) => self.picker = p,
                    Err(e) => errors.push(ConfigError::Picker(e.to_string())),
                },
                Some("sync") => match crate::sync::SyncConfig::parse(value) {
                    Ok(s) => self.sync = Some(s),
                    Err(e) => errors.push(ConfigError::Sync(e)),
                },
                Some("pdGroup") => match parse_pd_group(value) {
                    Ok(g) => pd = Some(g),
                    Err(e) => errors.push(e),
                },
                _ => self
                    .warnings
                    .push(format!("unknown top-level key {} ignored", show(key))),
            }
        }
        pd
    }

    /// An `EndpointPickerConfig`: its profile replaces Kthena's filters and scores; its
    /// prefix-picker sections (`endpoints`, `discovery`, `picker`, `sync`) are read as in a
    /// routerConfiguration.
    fn read_endpoint_picker(
        &mut self,
        text: &str,
        root: &Mapping,
        errors: &mut Vec<ConfigError>,
    ) -> Option<PdGroup> {
        let parsed =
            match endpoint_picker::parse(text, &mut self.warnings) {
                Ok(doc) => {
                    self.scheduler.filters = Vec::new();
                    self.scheduler.scorers = Vec::new();
                    self.scheduler.epp = Some(doc.profile.clone());
                    Some(doc)
                }
                Err(problems) => {
                    errors.extend(problems.into_iter().map(|message| {
                        ConfigError::EndpointPicker {
                            file: String::new(),
                            message,
                        }
                    }));
                    None
                }
            };
        let own: Mapping = root
            .iter()
            .filter(|(k, _)| {
                k.as_str()
                    .is_some_and(|k| endpoint_picker::OWN_SECTIONS.contains(&k))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let pd = self.read_sections(&own, errors);
        if let Some(doc) = parsed {
            self.apply_precise(&doc, errors);
            let written = own
                .get("picker")
                .and_then(|p| p.get("flowControl"))
                .and_then(Yaml::as_mapping);
            if let Some(f) = &doc.flow_control {
                self.apply_epp_flow_control(f, written, errors);
            }
        }
        pd
    }

    /// An `EndpointPickerConfig`'s `precise-prefix-cache-producer`: its topic filter, its
    /// shared socket (`zmqEndpoint`: `picker.kvEvents.bind`, refused when the picker section
    /// binds another) and its per-pod publisher ports feed the engine views
    /// (`picker.kvEvents`, each static endpoint without its own `kvEventsEndpoint`,
    /// `discovery.kubernetes.kvEventsPort`); a
    /// `token-producer` with a vLLM backend is `picker.tokenizer: {source: engine}` when the
    /// picker section gives no tokenizer.
    fn apply_precise(&mut self, doc: &endpoint_picker::EppDocument, errors: &mut Vec<ConfigError>) {
        let Some(p) = &doc.precise else {
            return;
        };
        self.picker.kv_events.topic_prefix = p.topic_filter.clone();
        if let Some(bind) = &p.bind {
            match &self.picker.kv_events.bind {
                Some(own) if own != bind => errors.push(ConfigError::Picker(format!(
                    "kvEvents.bind {own}: the EndpointPickerConfig's kvEventsConfig.zmqEndpoint binds {bind}; give one"
                ))),
                _ => self.picker.kv_events.bind = Some(bind.clone()),
            }
        }
        if let Some((port, replay)) = p.ports {
            for e in self
                .endpoints
                .iter_mut()
                .filter(|e| e.kv_events_endpoint.is_none())
            {
                let at =
                    |port| format!("tcp://{}", std::net::SocketAddr::new(e.address.ip(), port));
                e.kv_events_endpoint = Some(at(port));
                e.kv_events_replay_endpoint = replay.map(at);
            }
            if let Some(k) = &mut self.discovery.kubernetes
                && k.kv_events_port.is_none()
            {
                k.kv_events_port = Some(port);
                k.kv_events_replay_port = replay;
            }
        }
        if doc.engine_tokens && self.picker.tokenizer.is_none() {
            self.picker.tokenizer = serde_yaml_ng::from_str("source: engine").ok();
            self.warnings.push("token-producer (vllm): tokens come from each pod's own POST /tokenize (picker.tokenizer: {source: engine}), not from vllm.url".into());
        }
    }

    /// An `EndpointPickerConfig`'s `flowControl` (with its feature gate) into
    /// `picker.flowControl`; a key both set is refused, naming both.
    fn apply_epp_flow_control(
        &mut self,
        f: &endpoint_picker::FlowControlMapping,
        written: Option<&Mapping>,
        errors: &mut Vec<ConfigError>,
    ) {
        let set = |key: &str| written.is_some_and(|m| m.contains_key(key));
        for (llm_d, ours) in [
            ("flowControl.maxRequests", "maxRequests"),
            ("flowControl.maxBytes", "maxBytes"),
            ("flowControl.defaultRequestTTL", "requestTtlSeconds"),
            ("featureGates: [flowControl]", "enabled"),
        ] {
            if set(ours) {
                errors.push(ConfigError::Picker(format!(
                    "flowControl.{ours}: set by the EndpointPickerConfig's {llm_d} too; give it once"
                )));
            }
        }
        let fc = &mut self.picker.flow_control;
        fc.enabled = Some(true);
        fc.max_requests = f.max_requests;
        fc.max_bytes = f.max_bytes;
        fc.request_ttl_seconds = f.request_ttl_seconds;
        if let Some(h) = f.half_life_seconds {
            if set("halfLifeSeconds") {
                errors.push(ConfigError::Picker("flowControl.halfLifeSeconds: set by program-aware-fairness's lasHalfLifeSeconds too; give it once".into()));
            }
            fc.half_life_seconds = h;
        }
        // Envoy must wait for a request as long as it may stay queued (docs/flow-control.md).
        if !set("messageTimeoutSeconds") {
            fc.message_timeout_seconds =
                fc.message_timeout_seconds.max(f.request_ttl_seconds + 5.0);
        }
    }

    /// `pdGroup:` into the scheduler, warning of static endpoints it sorts into neither role.
    fn pair_pods(&mut self, pd: Option<PdGroup>) {
        if let Some(g) = &pd {
            warn_unpaired(g, &self.endpoints, &mut self.warnings);
        }
        self.scheduler.pd = pd;
    }

    /// Warnings about where pods come from: a deprecated key, or no source at all.
    fn warn_discovery(&mut self) {
        let kubernetes = self.discovery.kubernetes.as_ref();
        if kubernetes.is_some_and(|k| k.role_label.is_some()) {
            self.warnings.push(ROLE_LABEL_DEPRECATED.into());
        }
        if self.endpoints.is_empty() && kubernetes.is_none() {
            self.warnings.push(NO_ENDPOINTS.into());
        }
    }

    /// `picker.affinity`, validated, into the scheduler.
    fn apply_affinity(&mut self, errors: &mut Vec<ConfigError>) {
        let Some(section) = &self.picker.affinity else {
            return;
        };
        match section.validate() {
            Ok(valid) => {
                self.warnings.extend(valid.warnings);
                self.scheduler.apply_affinity(valid.mode);
            }
            Err(e) => errors.push(e),
        }
    }

    /// lora-affinity reads the served models the engine scrape fetches: without the scrape it
    /// would filter out every pod. An `EndpointPickerConfig` and the affinity mode exclude each
    /// other.
    fn check_lora_affinity(&self, errors: &mut Vec<ConfigError>) {
        if self.scheduler.epp.is_some() && self.picker.affinity.is_some() {
            errors.push(ConfigError::Picker(
                "affinity: the affinity mode replaces the scheduler's plugins, and an EndpointPickerConfig gives them: remove picker.affinity, or use a routerConfiguration with it (docs/migration.md)".into(),
            ));
        }
        if self.scheduler.needs_served_models() && self.picker.scrape_interval_seconds == 0.0 {
            errors.push(ConfigError::Picker(
                "the lora-affinity filter reads each pod's GET /v1/models, fetched by the engine scrape: picker.scrapeIntervalSeconds must not be 0".into(),
            ));
        }
    }

    /// `picker.loadShedding`, validated, into the scheduler; warns when it can never shed.
    fn apply_load_shedding(&mut self, errors: &mut Vec<ConfigError>) {
        let Some(section) = &self.picker.load_shedding else {
            return;
        };
        let scrape_interval = self.picker.scrape_interval_seconds;
        match section.validate(scrape_interval) {
            Ok(limits) => {
                let blind =
                    limits.is_some_and(|l| l.max_inflight.is_none()) && scrape_interval == 0.0;
                if blind {
                    self.warnings.push(NOTHING_TO_SHED.into());
                }
                self.scheduler.load_shedding = limits;
            }
            Err(e) => errors.push(e),
        }
    }

    /// `picker.flowControl`: on by default with the affinity mode (without `pdGroup`, whose
    /// pairs it does not measure); its numbers checked.
    fn apply_flow_control(&mut self, errors: &mut Vec<ConfigError>) {
        let fc = &mut self.picker.flow_control;
        let kthena = fc.kthena.is_some();
        fc.resolve(kthena || (self.scheduler.affinity.is_some() && self.scheduler.pd.is_none()));
        errors.extend(fc.validate().into_iter().map(ConfigError::Picker));
        self.warnings.extend(fc.warnings());
    }

    /// Kthena's fairness settings (`ENABLE_FAIRNESS_SCHEDULING`, `FAIRNESS_*` in `env`), in
    /// Kthena's mode: flow control on, mapped ([`crate::flow_control::kthena`]). Elsewhere,
    /// and for Kthena's session boost, a warning that they are not read.
    fn apply_kthena_fairness(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        errors: &mut Vec<ConfigError>,
    ) {
        use crate::flow_control::kthena;
        let kthena_mode = self.picker.affinity.is_none() && self.scheduler.epp.is_none();
        self.warnings
            .extend(kthena::unread_switches(env, kthena_mode));
        if !kthena_mode {
            return;
        }
        match kthena::from_env(env, self.jwt_auth) {
            Ok(None) => {}
            Ok(Some(fairness)) => {
                let warnings = fairness.apply(&mut self.picker.flow_control);
                self.warnings.extend(warnings);
            }
            Err(e) => errors.push(e.into()),
        }
    }

    /// `picker.tokenizer`: checked, then loaded (its file read) when the check passes.
    fn load_tokenizer(&mut self, errors: &mut Vec<ConfigError>) {
        let Some(t) = &mut self.picker.tokenizer else {
            return;
        };
        let invalid = t.validate();
        if invalid.is_empty() {
            match t.load() {
                Ok(warning) => self.warnings.extend(warning),
                Err(e) => errors.push(ConfigError::Picker(e)),
            }
        }
        errors.extend(invalid.into_iter().map(ConfigError::Picker));
    }

    /// KV events: a warning when pods publish events no mode reads; `maxBlocksPerPod` > 0.
    fn check_kv_events(&mut self, errors: &mut Vec<ConfigError>) {
        let publishing = self
            .endpoints
            .iter()
            .any(|e| e.kv_events_endpoint.is_some())
            || self.picker.kv_events.bind.is_some();
        let precise = self.scheduler.epp.as_ref().is_some_and(|p| p.precise);
        let reads = self.picker.affinity.is_some() || precise;
        if publishing && (!reads || self.picker.tokenizer.is_none()) {
            self.warnings.push(
                "kvEventsEndpoint / kvEvents.bind: the pods' events are followed, but only the affinity mode (or an EndpointPickerConfig's precise-prefix-cache-producer) with picker.tokenizer matches by them; these pods are matched by the estimate (docs/engine-truth.md)".into(),
            );
        }
        if self.picker.kv_events.max_blocks_per_pod == 0 {
            errors.push(ConfigError::Picker(
                "kvEvents.maxBlocksPerPod must be > 0, got 0".into(),
            ));
        }
    }
}

/// The document's top-level mapping (an empty document is an empty one).
fn root_mapping(text: &str) -> Result<Mapping, ConfigError> {
    let doc: Yaml = serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    match doc {
        Yaml::Mapping(m) => Ok(m),
        Yaml::Null => Ok(Mapping::new()),
        _ => Err(ConfigError::NotMapping),
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

fn show(v: &Yaml) -> String {
    serde_yaml_ng::to_string(v)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Yaml> {
    map.get(key)
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

#[cfg(test)]
mod tests;
