//! The `discovery:` config section (strict: unknown keys are errors).
//!
//! ```yaml
//! discovery:
//!   kubernetes:
//!     namespace: default   # default: POD_NAMESPACE, else the service-account namespace file, else "default"
//!     selector: "app=vllm" # label selector (required unless inferencePool is set)
//!     targetPorts: [8000]  # one endpoint per pod IP x port (required unless inferencePool is set)
//!     inferencePool: ""    # InferencePool name; selector and ports then come from the pool (watched)
//!                          # or {name, namespace, group} (GIE's --pool-name/-namespace/-group); the
//!                          # pool's namespace is the namespace above, group inference.networking.k8s.io
//!     roleLabel: ""        # deprecated: labels prefix_picker_discovery_endpoints only (use pdGroup)
//!     modelLabel: ""       # pod label holding the served model name
//!     kvEventsPort: 0      # the pods' KV-event publisher port (vLLM's default 5557; 0: none)
//!     kvEventsReplayPort: 0 # its replay port (0: none; docs/engine-truth.md)
//!     inferenceObjectives: false # watch InferenceObjectives: flow control's priorities
//!                          # (llm-d.ai and inference.networking.x-k8s.io, v1alpha2)
//! ```
//! `selector`/`targetPorts` and `inferencePool` exclude each other. Discovered pods join the
//! static `endpoints:` (which stay).

use std::path::Path;

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;
use thiserror::Error;

use super::target::{self, Target, TargetError};

/// Where the service-account namespace is mounted in a pod.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The validated `discovery:` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiscoveryConfig {
    pub kubernetes: Option<KubernetesConfig>,
}

/// The validated `discovery.kubernetes:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// `None`: resolved at start ([`KubernetesConfig::namespace`]).
    pub namespace: Option<String>,
    pub source: Source,
    pub role_label: Option<String>,
    pub model_label: Option<String>,
    /// The pods' KV-event publisher and replay ports (`kvEventsPort`, `kvEventsReplayPort`).
    pub kv_events_port: Option<u16>,
    pub kv_events_replay_port: Option<u16>,
    /// Watch InferenceObjectives for flow control's priorities (`inferenceObjectives`).
    pub inference_objectives: bool,
}

/// Where the selector and ports come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Static(Target),
    /// An InferencePool name, watched.
    InferencePool(String),
}

#[derive(Debug, Error, PartialEq)]
pub enum DiscoveryError {
    #[error("discovery: {0}")]
    Shape(String),
    #[error("discovery.kubernetes.{key}: {error}")]
    Target {
        key: &'static str,
        error: TargetError,
    },
    #[error("discovery.kubernetes.{key}: {value:?} is not a valid {what}")]
    Name {
        key: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("discovery.kubernetes: set either inferencePool or selector + targetPorts, got {0}")]
    Source(&'static str),
    #[error(
        "discovery.kubernetes.inferencePool.group: only {group} (v1) is watched, got {0:?}",
        group = super::inference_pool::GROUP
    )]
    PoolGroup(String),
    #[error(
        "discovery.kubernetes: namespace {namespace:?} and inferencePool.namespace {pool:?} differ (pods are watched in the pool's namespace)"
    )]
    PoolNamespace { namespace: String, pool: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    kubernetes: Option<RawKubernetes>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKubernetes {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    selector: String,
    #[serde(default)]
    target_ports: Vec<i64>,
    #[serde(default)]
    inference_pool: RawPool,
    #[serde(default)]
    role_label: String,
    #[serde(default)]
    model_label: String,
    #[serde(default)]
    kv_events_port: u16,
    #[serde(default)]
    kv_events_replay_port: u16,
    #[serde(default)]
    inference_objectives: bool,
}

/// `inferencePool:` as a name, or as GIE's pool reference.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawPool {
    Name(String),
    Ref(RawPoolRef),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPoolRef {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    group: String,
}

impl Default for RawPool {
    fn default() -> Self {
        RawPool::Name(String::new())
    }
}

impl DiscoveryConfig {
    /// Parses and validates the value of the top-level `discovery:` key.
    pub fn parse(value: &Yaml) -> Result<DiscoveryConfig, DiscoveryError> {
        if value.is_null() {
            return Ok(DiscoveryConfig::default());
        }
        let raw: RawDiscovery = serde_yaml_ng::from_value(value.clone())
            .map_err(|e| DiscoveryError::Shape(e.to_string()))?;
        Ok(DiscoveryConfig {
            kubernetes: raw.kubernetes.map(KubernetesConfig::try_from).transpose()?,
        })
    }
}

impl TryFrom<RawKubernetes> for KubernetesConfig {
    type Error = DiscoveryError;

    /// The checks in the order their errors are reported: the pool reference, the source, the
    /// namespace, the KV-event ports, the label keys.
    fn try_from(mut raw: RawKubernetes) -> Result<KubernetesConfig, DiscoveryError> {
        let pool = raw.pool()?;
        let source = source(pool, &raw.selector, &raw.target_ports)?;
        let namespace = match raw.namespace.as_str() {
            "" => None,
            ns => {
                check_name("namespace", ns, 63, "namespace (DNS label)")?;
                Some(ns.to_string())
            }
        };
        if raw.kv_events_replay_port != 0 && raw.kv_events_port == 0 {
            return Err(DiscoveryError::Shape(
                "kubernetes.kvEventsReplayPort needs kvEventsPort".into(),
            ));
        }
        let port = |p: u16| (p != 0).then_some(p);
        Ok(KubernetesConfig {
            namespace,
            source,
            role_label: label_key("roleLabel", raw.role_label)?,
            model_label: label_key("modelLabel", raw.model_label)?,
            kv_events_port: port(raw.kv_events_port),
            kv_events_replay_port: port(raw.kv_events_replay_port),
            inference_objectives: raw.inference_objectives,
        })
    }
}

impl RawKubernetes {
    /// The pool's name (empty without one); a reference's namespace fills `namespace` when
    /// that is unset, and must equal it otherwise.
    fn pool(&mut self) -> Result<String, DiscoveryError> {
        let r = match std::mem::take(&mut self.inference_pool) {
            RawPool::Name(name) => return Ok(name),
            RawPool::Ref(r) => r,
        };
        if !r.group.is_empty() && r.group != super::inference_pool::GROUP {
            return Err(DiscoveryError::PoolGroup(r.group));
        }
        match (self.namespace.as_str(), r.namespace.as_str()) {
            (_, "") => {}
            ("", _) => self.namespace = r.namespace,
            (ns, pool) if ns == pool => {}
            _ => {
                return Err(DiscoveryError::PoolNamespace {
                    namespace: std::mem::take(&mut self.namespace),
                    pool: r.namespace,
                });
            }
        }
        Ok(r.name)
    }
}

/// Where pods come from: the pool, or the selector and ports (exactly one of them).
fn source(pool: String, selector: &str, target_ports: &[i64]) -> Result<Source, DiscoveryError> {
    match (
        pool.is_empty(),
        selector.is_empty() && target_ports.is_empty(),
    ) {
        (false, false) => Err(DiscoveryError::Source("both")),
        (false, true) => {
            check_name("inferencePool", &pool, 253, "object name")?;
            Ok(Source::InferencePool(pool))
        }
        (true, _) => {
            let selector =
                target::parse_selector(selector).map_err(|error| DiscoveryError::Target {
                    key: "selector",
                    error,
                })?;
            let target =
                Target::new(selector, target_ports).map_err(|error| DiscoveryError::Target {
                    key: "targetPorts",
                    error,
                })?;
            Ok(Source::Static(target))
        }
    }
}

/// A label key setting: unset when empty, else a valid label key.
fn label_key(key: &'static str, value: String) -> Result<Option<String>, DiscoveryError> {
    match value.as_str() {
        "" => Ok(None),
        v if target::is_label_key(v) => Ok(Some(value)),
        _ => Err(DiscoveryError::Name {
            key,
            value,
            what: "label key",
        }),
    }
}

/// Lowercase alphanumerics, '-' (and '.' for object names), alphanumeric at both ends.
fn check_name(
    key: &'static str,
    value: &str,
    max: usize,
    what: &'static str,
) -> Result<(), DiscoveryError> {
    let dots = max > 63;
    let ok = value.len() <= max
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.')
        });
    if ok {
        Ok(())
    } else {
        Err(DiscoveryError::Name {
            key,
            value: value.to_string(),
            what,
        })
    }
}

impl KubernetesConfig {
    /// The namespace to watch: configured, else `POD_NAMESPACE` (through `env`), else the
    /// service-account file, else `default`.
    pub fn namespace(&self, env: impl Fn(&str) -> Option<String>, sa_file: &Path) -> String {
        self.namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE").filter(|s| !s.trim().is_empty()))
            .or_else(|| {
                std::fs::read_to_string(sa_file)
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".to_string())
    }

    /// The namespace from this process's environment.
    pub fn process_namespace(&self) -> String {
        self.namespace(
            |k| std::env::var(k).ok(),
            Path::new(SERVICE_ACCOUNT_NAMESPACE),
        )
    }

    /// One line for logs and `validate`.
    pub fn describe(&self, namespace: &str) -> String {
        let what = match &self.source {
            Source::Static(t) => {
                format!("selector {:?}, ports {:?}", t.selector.to_string(), t.ports)
            }
            Source::InferencePool(name) => format!("InferencePool {name:?}"),
        };
        format!("kubernetes discovery in namespace {namespace:?}: {what}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DiscoveryConfig, DiscoveryError> {
        DiscoveryConfig::parse(&serde_yaml_ng::from_str(text).unwrap())
    }

    #[test]
    fn inference_objectives_are_watched_only_when_asked() {
        let on = |text: &str| {
            parse(text)
                .unwrap()
                .kubernetes
                .unwrap()
                .inference_objectives
        };
        assert!(!on("kubernetes: {inferencePool: p}"));
        assert!(on(
            "kubernetes: {inferencePool: p, inferenceObjectives: true}"
        ));
    }

    #[test]
    fn a_selector_section_parses() {
        let c = parse("kubernetes: {namespace: llm, selector: app=vllm, targetPorts: [8000], roleLabel: example.com/role}")
            .unwrap()
            .kubernetes
            .unwrap();
        assert_eq!(c.namespace.as_deref(), Some("llm"));
        assert_eq!(c.role_label.as_deref(), Some("example.com/role"));
        assert_eq!(c.model_label, None);
        let Source::Static(t) = &c.source else {
            panic!("{c:?}")
        };
        assert_eq!(
            (t.selector.to_string(), t.ports.clone()),
            ("app=vllm".into(), vec![8000])
        );
        let pool = parse("kubernetes: {inferencePool: my-pool}")
            .unwrap()
            .kubernetes
            .unwrap();
        assert_eq!(pool.source, Source::InferencePool("my-pool".into()));
        assert_eq!(parse("").unwrap(), DiscoveryConfig::default());
        // GIE's pool reference: the namespace is the watch namespace.
        let by_ref = parse(
            "kubernetes: {inferencePool: {name: my-pool, namespace: llm, group: inference.networking.k8s.io}}",
        )
        .unwrap()
        .kubernetes
        .unwrap();
        assert_eq!(by_ref.source, Source::InferencePool("my-pool".into()));
        assert_eq!(by_ref.namespace.as_deref(), Some("llm"));
    }

    #[test]
    fn errors_name_the_key_and_value() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        assert!(
            err("kubernetes: {selector: a=b, targetPorts: [1], extra: 1}")
                .contains("unknown field `extra`")
        );
        assert!(err("consul: {}").contains("unknown field `consul`"));
        assert_eq!(
            err("kubernetes: {selector: 'a=b', targetPorts: [0]}"),
            "discovery.kubernetes.targetPorts: target port 0 is not in 1..=65535"
        );
        assert_eq!(
            err("kubernetes: {targetPorts: [80]}"),
            "discovery.kubernetes.selector: label selector must not be empty (it would select every pod)"
        );
        assert_eq!(
            err("kubernetes: {inferencePool: p, selector: a=b}"),
            "discovery.kubernetes: set either inferencePool or selector + targetPorts, got both"
        );
        assert_eq!(
            err("kubernetes: {inferencePool: {name: p, group: inference.networking.x-k8s.io}}"),
            "discovery.kubernetes.inferencePool.group: only inference.networking.k8s.io (v1) is watched, got \"inference.networking.x-k8s.io\""
        );
        assert_eq!(
            err("kubernetes: {namespace: a, inferencePool: {name: p, namespace: b}}"),
            "discovery.kubernetes: namespace \"a\" and inferencePool.namespace \"b\" differ (pods are watched in the pool's namespace)"
        );
        assert_eq!(
            err("kubernetes: {inferencePool: p, namespace: Bad_NS}"),
            "discovery.kubernetes.namespace: \"Bad_NS\" is not a valid namespace (DNS label)"
        );
        assert_eq!(
            err("kubernetes: {inferencePool: p, modelLabel: 'a b'}"),
            "discovery.kubernetes.modelLabel: \"a b\" is not a valid label key"
        );
    }

    #[test]
    fn namespace_falls_back_to_env_then_file_then_default() {
        let c = parse("kubernetes: {inferencePool: p}")
            .unwrap()
            .kubernetes
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("namespace");
        let no_env = |_: &str| None;
        assert_eq!(c.namespace(no_env, &file), "default");
        std::fs::write(&file, "from-file\n").unwrap();
        assert_eq!(c.namespace(no_env, &file), "from-file");
        assert_eq!(c.namespace(|_| Some("from-env".into()), &file), "from-env");
        let fixed = KubernetesConfig {
            namespace: Some("fixed".into()),
            ..c
        };
        assert_eq!(fixed.namespace(|_| Some("from-env".into()), &file), "fixed");
    }
}
