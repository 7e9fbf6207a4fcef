//! `endpoints:`, the statically configured pods: each a name, namespace and address, with
//! optional models, generation, labels and KV-event sockets; checked together (names and
//! addresses unique, sockets `tcp://host:port`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

use super::{Config, ConfigError, show};

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
    /// Its replay socket (`replay_endpoint`), which fills gaps and catches a new view up; unset: a
    /// gap drops the view and a new view starts from the next batch.
    #[serde(default, rename = "kvEventsReplayEndpoint")]
    pub kv_events_replay_endpoint: Option<String>,
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

/// Every problem of the endpoints together, one error each.
pub(super) fn validate_endpoints(endpoints: &[StaticEndpoint], errors: &mut Vec<ConfigError>) {
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
        let affinity = self.picker.affinity.is_some()
            || self.scheduler.epp.as_ref().is_some_and(|p| p.precise);
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
                        "estimate (kvEventsEndpoint is used by the affinity mode and a precise-prefix-cache-producer only)".to_string()
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
