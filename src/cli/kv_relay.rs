//! `prefix-picker kv-relay`'s flags: which engine to follow, who the pod is and which model it
//! serves. The pod comes from the flags or the downward API (`POD_NAME`, `POD_NAMESPACE`), Redis
//! from Kthena's `REDIS_HOST`/`REDIS_PORT`/`REDIS_PASSWORD` ([`crate::kvcache::redis_env`]).

use thiserror::Error;

use crate::kv_events::{Limits, SubscriberConfig};
use crate::kvcache::relay::RelayIdentity;
use crate::scheduler::kvcache_aware::owner_id;
use crate::tokenizer::EngineKind;

/// The engine beside the relay (`--engine`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayEngine {
    #[default]
    Vllm,
    Sglang,
}

#[derive(Debug, Clone, clap::Args)]
pub struct KvRelayArgs {
    /// The engine's KV-event publisher (vLLM's `--kv-events-config` `endpoint`, as reached from
    /// this container).
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    pub events_endpoint: String,
    /// Its replay socket (`replay_endpoint`); without it a gap clears the pod's blocks.
    #[arg(long)]
    pub replay_endpoint: Option<String>,
    /// The publishers' topic.
    #[arg(long, default_value = "")]
    pub topic: String,
    /// The served model name (what requests carry in `model`).
    #[arg(long)]
    pub model: String,
    /// The pod's name (default: `$POD_NAME`).
    #[arg(long)]
    pub pod_name: Option<String>,
    /// The pod's namespace (default: `$POD_NAMESPACE`, else `default`).
    #[arg(long)]
    pub pod_namespace: Option<String>,
    /// The engine: the mapping keys' prefix (`vllm:` or `sglang:`).
    #[arg(long, value_enum, default_value_t = RelayEngine::Vllm)]
    pub engine: RelayEngine,
    /// At shutdown (SIGTERM), remove the pod's fields from the blocks it holds within this
    /// many seconds (0: keep them until the router's GC).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub release_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = crate::cli::LogFormat::Text)]
    pub log_format: crate::cli::LogFormat,
    /// Log verbosity (0-5; 4 adds each write).
    #[arg(long, default_value_t = 2)]
    pub v: u8,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvRelayError {
    #[error("kv-relay: the pod's name is unknown: pass --pod-name or set POD_NAME")]
    NoPodName,
    #[error("kv-relay: --model must not be empty")]
    NoModel,
    #[error("kv-relay: --events-endpoint must be tcp://host:port, got {0:?}")]
    Endpoint(String),
}

impl KvRelayArgs {
    /// Who the relay writes as and what it subscribes to; `env` looks up the downward API.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(RelayIdentity, SubscriberConfig), KvRelayError> {
        let name = self
            .pod_name
            .clone()
            .or_else(|| env("POD_NAME"))
            .filter(|n| !n.is_empty())
            .ok_or(KvRelayError::NoPodName)?;
        let namespace = self
            .pod_namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        if self.model.is_empty() {
            return Err(KvRelayError::NoModel);
        }
        for e in std::iter::once(&self.events_endpoint).chain(&self.replay_endpoint) {
            if !e.starts_with("tcp://") {
                return Err(KvRelayError::Endpoint(e.clone()));
            }
        }
        let engine = match self.engine {
            RelayEngine::Vllm => EngineKind::Vllm,
            RelayEngine::Sglang => EngineKind::Sglang,
        };
        Ok((
            RelayIdentity {
                pod: owner_id(&name, &namespace),
                model: self.model.clone(),
                engine,
            },
            SubscriberConfig {
                endpoint: self.events_endpoint.clone(),
                replay_endpoint: self.replay_endpoint.clone(),
                topic: self.topic.clone(),
                topic_prefix: String::new(),
                limits: Limits::default(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: KvRelayArgs,
    }

    fn parse(args: &[&str]) -> KvRelayArgs {
        Cli::try_parse_from(std::iter::once("kv-relay").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_pod_comes_from_flags_or_the_downward_api() {
        let env = |name: &str| match name {
            "POD_NAME" => Some("vllm-0".to_string()),
            "POD_NAMESPACE" => Some("llm".to_string()),
            _ => None,
        };
        let (id, events) = parse(&[
            "--model",
            "org/m",
            "--replay-endpoint",
            "tcp://127.0.0.1:5558",
        ])
        .resolve(&env)
        .unwrap();
        assert_eq!(
            (id.pod.as_str(), id.model.as_str()),
            ("vllm-0.llm", "org/m")
        );
        assert_eq!(id.engine, EngineKind::Vllm);
        assert_eq!(events.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(
            events.replay_endpoint.as_deref(),
            Some("tcp://127.0.0.1:5558")
        );
        let (id, _) = parse(&["--model", "m", "--pod-name", "p", "--engine", "sglang"])
            .resolve(&|_| None)
            .unwrap();
        assert_eq!(
            (id.pod.as_str(), id.engine),
            ("p.default", EngineKind::Sglang)
        );
    }

    #[test]
    fn bad_flags_name_the_value() {
        let none = |_: &str| None;
        assert_eq!(
            parse(&["--model", "m"]).resolve(&none).unwrap_err(),
            KvRelayError::NoPodName
        );
        let e = parse(&[
            "--model",
            "m",
            "--pod-name",
            "p",
            "--events-endpoint",
            "ipc:///x",
        ])
        .resolve(&none)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "kv-relay: --events-endpoint must be tcp://host:port, got \"ipc:///x\""
        );
        assert_eq!(
            parse(&["--model", "", "--pod-name", "p"])
                .resolve(&none)
                .unwrap_err(),
            KvRelayError::NoModel
        );
    }
}
