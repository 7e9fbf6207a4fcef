//! `precise-prefix-cache-producer` and `token-producer` as an `EndpointPickerConfig` declares
//! them, mapped onto this project's engine truth (docs/engine-truth.md).
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/producer.go`
//! (`PluginConfig`: `tokenProcessorConfig`, `indexerConfig`, `kvEventsConfig`,
//! `speculativeIndexing`, `speculativeTTL`; `tokenizersPoolConfig` refused), `extractor.go`
//! (one subscriber per endpoint at `tcp://<address>:<socketPort>`, replay at
//! `replaySocketPort`), `pkg/kvevents/pool.go` (`Config`: `zmqEndpoint`, `topicFilter` default
//! `kv@`, `concurrency`, `engineType`, `discoverPods` default true, `podDiscoveryConfig`
//! `{podLabelSelector, podNamespace, socketPort 5557, replaySocketPort}`),
//! `pkg/kvcache/kvblock/token_processor.go` (`TokenProcessorConfig`: `blockSize`,
//! `blockSizeTokens`, `hashSeed`, `hashAlgorithm`), `pkg/kvcache/indexer.go` (`Config`:
//! `kvBlockIndexConfig`, `kvCacheBackendConfigs`, `tokenizersPoolConfig`),
//! `pkg/kvcache/kvblock/index.go` (`IndexConfig`: `inMemoryConfig`, `redisConfig`,
//! `costAwareMemoryConfig`, `enableMetrics`, `metricsLoggingInterval`) and
//! `dataproducer/tokenizer/README.md` (`token-producer`: `modelName`, `vllm {url, timeout,
//! mmTimeout}`, `estimate`, `udsTokenizerConfig`), and the deprecated wrapper
//! `pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache/precise_prefix_cache.go`
//! (`precise-prefix-cache-scorer`: the producer's parameters, a `prefix-cache-scorer` reading
//! its own producer, or an existing producer's with its own parameters ignored;
//! `tokenizersPoolConfig` allowed, its pool tokenizing the prompts).
//!
//! The mapping: the producer's events feed the pods' engine views (`picker.kvEvents`, as the
//! shipped config's do): `topicFilter` is the publishers' topic prefix (ZeroMQ's subscription
//! filter), `podDiscoveryConfig.socketPort` / `replaySocketPort` give each pod without its own
//! `kvEventsEndpoint` one on its address (discovered pods: `kvEventsPort` /
//! `kvEventsReplayPort`). A `token-producer` with a `vllm` backend is `picker.tokenizer:
//! {source: engine}` (each pod's own `/tokenize`, not one `vllm.url`). The block keys are the
//! engine view's own (token chains at the engine's block size), so `tokenProcessorConfig` and
//! the index's internals change nothing here. `zmqEndpoint` (one socket the engines connect to,
//! each naming its pod in its topic, `kv@<pod>@<model>`; llm-d's sim configs use it) is
//! `picker.kvEvents.bind` (`engine_events::shared`); with it `discoverPods` defaults to off here
//! (the engines connect to the picker: per-pod subscriptions to sockets no engine binds would
//! only fail), and `discoverPods: true` reads both (a pod with its own publisher is read there).
//! Refused by name: `tokenizersPoolConfig` (as llm-d),
//! `kvBlockIndexConfig.redisConfig` (replicas share what they record by `sync:`).

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

use crate::kv_events::shared::BindEndpoint;

/// What the producer asks of the engine views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreciseEvents {
    /// `kvEventsConfig.topicFilter`: the publishers' topic prefix.
    pub topic_filter: String,
    /// `podDiscoveryConfig.socketPort` and `replaySocketPort` on each pod's address, when
    /// `discoverPods` (llm-d's default, without `zmqEndpoint`).
    pub ports: Option<(u16, Option<u16>)>,
    /// `zmqEndpoint`: the shared socket the engines connect to.
    pub bind: Option<BindEndpoint>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Parameters {
    token_processor_config: Option<TokenProcessor>,
    indexer_config: Option<Indexer>,
    kv_events_config: Option<KvEvents>,
    speculative_indexing: Option<bool>,
    #[serde(rename = "speculativeTTL")]
    speculative_ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TokenProcessor {
    block_size: Option<i64>,
    block_size_tokens: Option<i64>,
    hash_seed: Option<String>,
    hash_algorithm: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Indexer {
    kv_block_index_config: Option<BlockIndex>,
    kv_cache_backend_configs: Option<Yaml>,
    tokenizers_pool_config: Option<Yaml>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BlockIndex {
    in_memory_config: Option<Yaml>,
    redis_config: Option<Yaml>,
    cost_aware_memory_config: Option<Yaml>,
    enable_metrics: Option<bool>,
    metrics_logging_interval: Option<Yaml>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KvEvents {
    zmq_endpoint: Option<String>,
    topic_filter: Option<String>,
    concurrency: Option<i64>,
    engine_type: Option<String>,
    discover_pods: Option<bool>,
    pod_discovery_config: Option<PodDiscovery>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodDiscovery {
    pod_label_selector: Option<String>,
    pod_namespace: Option<String>,
    socket_port: Option<i64>,
    replay_socket_port: Option<i64>,
}

/// llm-d's defaults (`kvevents.DefaultConfig`, `DefaultPodReconcilerConfig`).
const DEFAULT_TOPIC_FILTER: &str = "kv@";
const DEFAULT_SOCKET_PORT: i64 = 5557;

/// A port as llm-d reads it: `None` for "not set" (0 or below, for the replay port).
fn port(v: i64, field: &str) -> Result<u16, String> {
    u16::try_from(v).ok().filter(|&p| p > 0).ok_or_else(|| {
        format!("kvEventsConfig.podDiscoveryConfig.{field} must be a port (1-65535), got {v}")
    })
}

/// The producer's parameters (none: llm-d's defaults), checked and mapped; with `legacy` (the
/// deprecated `precise-prefix-cache-scorer`, which owns a tokenizer pool when
/// `tokenizersPoolConfig` is set), also whether that pool gives real tokens.
pub(super) fn producer(
    parameters: Option<&Yaml>,
    name: &str,
    legacy: bool,
    warnings: &mut Vec<String>,
) -> Result<(PreciseEvents, bool), String> {
    let kind = match legacy {
        true => "precise-prefix-cache-scorer",
        false => "precise-prefix-cache-producer",
    };
    let p: Parameters = match parameters {
        None | Some(Yaml::Null) => Parameters::default(),
        Some(v) => serde_yaml_ng::from_value(v.clone())
            .map_err(|e| format!("parameters of {kind}: {e}"))?,
    };
    let t = p.token_processor_config.unwrap_or_default();
    for (field, v) in [
        ("blockSize", t.block_size),
        ("blockSizeTokens", t.block_size_tokens),
    ] {
        if let Some(v) = v.filter(|&v| v < 0) {
            return Err(format!(
                "tokenProcessorConfig.{field} must be >= 0, got {v}"
            ));
        }
    }
    match t.hash_algorithm.as_deref() {
        None | Some("" | "cbor-fnv" | "xxh64") => {}
        Some(other) => {
            return Err(format!(
                "tokenProcessorConfig.hashAlgorithm must be \"cbor-fnv\" or \"xxh64\", got {other:?}"
            ));
        }
    }
    let _ = t.hash_seed;
    let indexer = p.indexer_config.unwrap_or_default();
    let pool = indexer.tokenizers_pool_config.is_some();
    if pool && !legacy {
        return Err("indexerConfig.tokenizersPoolConfig is not supported (as llm-d); configure a token-producer plugin instead".into());
    }
    if pool {
        warnings.push(format!(
            "plugins[{name}]: indexerConfig.tokenizersPoolConfig: tokens come from each pod's own POST /tokenize (picker.tokenizer: {{source: engine}}), not from a tokenizer pool"
        ));
    }
    let index = indexer.kv_block_index_config.unwrap_or_default();
    if index.redis_config.is_some() {
        return Err("indexerConfig.kvBlockIndexConfig.redisConfig (an index shared through Redis) is not implemented by prefix-picker: each replica keeps its own engine views; replicas share their records by sync: (docs/replicas.md)".into());
    }
    let _ = (
        index.in_memory_config,
        index.cost_aware_memory_config,
        index.enable_metrics,
        index.metrics_logging_interval,
        indexer.kv_cache_backend_configs,
    );
    let events = p.kv_events_config.unwrap_or_default();
    // llm-d reads an empty zmqEndpoint as unset.
    let bind = match events.zmq_endpoint.filter(|e| !e.is_empty()) {
        Some(at) => Some(
            BindEndpoint::try_from(at).map_err(|e| format!("kvEventsConfig.zmqEndpoint: {e}"))?,
        ),
        None => None,
    };
    match events.engine_type.as_deref() {
        None | Some("" | "vllm" | "sglang") => {}
        Some(other) => {
            return Err(format!(
                "kvEventsConfig.engineType must be \"vllm\" or \"sglang\", got {other:?}"
            ));
        }
    }
    if let Some(c) = events.concurrency.filter(|&c| c < 0) {
        return Err(format!("kvEventsConfig.concurrency must be >= 0, got {c}"));
    }
    let ports = match events.discover_pods.unwrap_or(bind.is_none()) {
        false => None,
        true => {
            let d = events.pod_discovery_config.unwrap_or_default();
            let _ = (d.pod_label_selector, d.pod_namespace);
            let socket = port(d.socket_port.unwrap_or(DEFAULT_SOCKET_PORT), "socketPort")?;
            let replay = match d.replay_socket_port {
                Some(v) if v > 0 => Some(port(v, "replaySocketPort")?),
                _ => None,
            };
            Some((socket, replay))
        }
    };
    if p.speculative_indexing == Some(true) {
        warnings.push(format!(
            "plugins[{name}]: speculativeIndexing: a pick is not held for its pod here until its engine stores the prompt (the affinity mode's holds do that)"
        ));
    }
    let _ = p.speculative_ttl;
    let events = PreciseEvents {
        topic_filter: events
            .topic_filter
            .unwrap_or_else(|| DEFAULT_TOPIC_FILTER.to_string()),
        ports,
        bind,
    };
    Ok((events, pool))
}

/// `token-producer`'s parameters: whether they name a vLLM backend (`vllm` or `modelName`), whose
/// real tokens the precise producer needs (the default `estimate` backend's 4-byte
/// pseudo-tokens match no engine's).
pub(super) fn engine_tokens(parameters: Option<&Yaml>) -> Result<bool, String> {
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct TokenProducer {
        model_name: Option<String>,
        vllm: Option<Yaml>,
        estimate: Option<Yaml>,
        uds_tokenizer_config: Option<Yaml>,
    }
    let p: TokenProducer = match parameters {
        None | Some(Yaml::Null) => TokenProducer::default(),
        Some(v) => serde_yaml_ng::from_value(v.clone())
            .map_err(|e| format!("parameters of token-producer: {e}"))?,
    };
    let _ = p.estimate;
    Ok(p.vllm.is_some() || p.model_name.is_some() || p.uds_tokenizer_config.is_some())
}

#[cfg(test)]
mod tests;
