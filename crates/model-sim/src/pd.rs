//! Prefill/decode (PD) roles: `--role prefill|decode`, the way llm-d's decode-side sidecar and
//! vLLM's KV connectors split a request.
//!
//! A decode sim that receives `x-prefiller-host-port: host:port` first sends the request to that
//! prefill sim (same path and body, `max_tokens` 1, not streamed; llm-d's
//! `kv_transfer_params.do_remote_decode`), waits for it (at most `prefill_timeout`, wall clock),
//! then admits the prompt to its own KV cache and receives from the peer the tokens its own cache
//! lacks, at `kv_transfer_per_token` each (divided by `--time-scale`, not slowed by the batch),
//! instead of prefilling them; then it decodes. A failed, refused or timed-out prefill answers the
//! client 502 and is counted by outcome. Without the header, or without `--role`, a sim prefills
//! locally; a prefill sim is an ordinary sim. docs/model-sim.md states how the counters treat a
//! received prompt.

use std::time::Duration;

use axum::http::HeaderMap;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::{Value, json};

use prefix_picker::request::Api;

/// The header naming the prefill peer (llm-d's convention).
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// The pod's part in PD serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// PD settings (the `--role`, `--kv-transfer-us-per-token` and `--prefill-timeout-ms` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct PdConfig {
    /// `None`: no PD role, the header is ignored (the simulator as it always was).
    pub role: Option<Role>,
    /// KV transfer time per received prompt token.
    pub kv_transfer_per_token: Duration,
    /// The longest a decode sim waits for its prefill peer (wall clock, not scaled).
    pub prefill_timeout: Duration,
}

/// 5 µs per token: a 7-8B model's KV (~128 KiB per token in bf16) over a ~25 GB/s RDMA link.
pub const DEFAULT_KV_TRANSFER_PER_TOKEN: Duration = Duration::from_micros(5);
pub const DEFAULT_PREFILL_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            role: None,
            kv_transfer_per_token: DEFAULT_KV_TRANSFER_PER_TOKEN,
            prefill_timeout: DEFAULT_PREFILL_TIMEOUT,
        }
    }
}

/// How a remote prefill ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The peer answered with an error status or an unreadable body.
    Failed,
    /// The peer could not be reached (refused, unresolvable).
    Unreachable,
    Timeout,
    /// The header is not `host:port`.
    BadHeader,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Failed,
        Outcome::Unreachable,
        Outcome::Timeout,
        Outcome::BadHeader,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Unreachable => "unreachable",
            Outcome::Timeout => "timeout",
            Outcome::BadHeader => "bad_header",
        }
    }
}

/// A remote prefill that did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillError {
    pub outcome: Outcome,
    pub message: String,
}

/// A decode sim's PD metrics. Every sim with a role exports `model_sim_role{role} 1`; a sim
/// without one exports what it always did.
#[derive(Debug, Clone)]
pub struct PdMetrics {
    remote_prefills: IntCounterVec,
    /// vLLM's KV-connector counters: tokens the local cache lacked / tokens received.
    pub external_queries: IntCounter,
    pub external_hits: IntCounter,
}

impl PdMetrics {
    /// Registers the role info; returns the decode metrics for a decode sim.
    pub fn register(registry: &Registry, config: &PdConfig) -> Option<PdMetrics> {
        let role = config.role?;
        let info = IntGaugeVec::new(
            Opts::new("model_sim_role", "The simulator's PD role (--role)"),
            &["role"],
        )
        .expect("metric");
        registry.register(Box::new(info.clone())).expect("unique");
        info.with_label_values(&[role.as_str()]).set(1);
        if role != Role::Decode {
            return None;
        }
        let remote_prefills = IntCounterVec::new(
            Opts::new(
                "model_sim_remote_prefills_total",
                "Prefills a decode sim asked of the peer in x-prefiller-host-port, by outcome",
            ),
            &["outcome"],
        )
        .expect("metric");
        registry
            .register(Box::new(remote_prefills.clone()))
            .expect("unique");
        for o in Outcome::ALL {
            remote_prefills.with_label_values(&[o.as_str()]);
        }
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("metric");
            registry.register(Box::new(c.clone())).expect("unique");
            c
        };
        Some(PdMetrics {
            remote_prefills,
            external_queries: counter(
                "vllm:external_prefix_cache_queries_total",
                "Prompt tokens not in the local prefix cache, asked of the prefill peer",
            ),
            external_hits: counter(
                "vllm:external_prefix_cache_hits_total",
                "Prompt tokens received from the prefill peer",
            ),
        })
    }

    pub fn count(&self, outcome: Outcome) {
        self.remote_prefills
            .with_label_values(&[outcome.as_str()])
            .inc();
    }
}

/// The peer named by the header, if it is `host:port` (a host name, an IPv4 address or a
/// bracketed IPv6 address).
pub fn peer(headers: &HeaderMap) -> Option<Result<String, PrefillError>> {
    let value = headers.get(PREFILLER_HEADER)?;
    let bad = || PrefillError {
        outcome: Outcome::BadHeader,
        message: format!("{PREFILLER_HEADER} must be host:port, got {value:?}"),
    };
    let Ok(text) = value.to_str() else {
        return Some(Err(bad()));
    };
    let valid = text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && port.parse::<u16>().is_ok_and(|p| p != 0)
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b))
    });
    Some(if valid {
        Ok(text.to_string())
    } else {
        Err(bad())
    })
}

/// The prefill request's body: the client's request with one output token, not streamed.
pub fn prefill_body(api: Api, request: &Value) -> Value {
    let mut body = request.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("stream_options");
        o.insert("stream".into(), Value::Bool(false));
        let limits: &[&str] = match api {
            Api::Responses => &["max_output_tokens"],
            Api::Completions | Api::ChatCompletions => &["max_tokens", "max_completion_tokens"],
            Api::Messages => &["max_tokens"],
        };
        for k in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
            o.remove(k);
        }
        for k in limits {
            o.insert((*k).into(), json!(1));
        }
        o.insert(
            "kv_transfer_params".into(),
            json!({"do_remote_decode": true, "do_remote_prefill": false}),
        );
    }
    body
}

/// What a successful remote prefill tells the decode side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefilled {
    /// The peer's `x-served-by`, if any.
    pub served_by: Option<String>,
}

/// Asks `peer` to prefill: `POST http://{peer}{path}` with [`prefill_body`], bounded by the
/// client's timeout.
pub async fn remote_prefill(
    client: &reqwest::Client,
    peer: &str,
    path: &str,
    body: &Value,
) -> Result<Prefilled, PrefillError> {
    let err = |outcome, message: String| PrefillError { outcome, message };
    let sent = client
        .post(format!("http://{peer}{path}"))
        .json(body)
        .send()
        .await;
    let classify = |e: reqwest::Error| {
        if e.is_timeout() {
            err(
                Outcome::Timeout,
                format!("prefill peer {peer} did not answer in time: {e}"),
            )
        } else if e.is_connect() {
            err(
                Outcome::Unreachable,
                format!("prefill peer {peer} is unreachable: {e}"),
            )
        } else {
            err(
                Outcome::Failed,
                format!("prefill request to {peer} failed: {e}"),
            )
        }
    };
    let response = sent.map_err(classify)?;
    let status = response.status();
    let served_by = response
        .headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // Read the whole answer (the prefill is done when it has answered), within the timeout.
    let text = response.text().await.map_err(classify)?;
    if !status.is_success() {
        let snippet: String = text.chars().take(200).collect();
        return Err(err(
            Outcome::Failed,
            format!("prefill peer {peer} answered {status}: {snippet}"),
        ));
    }
    Ok(Prefilled { served_by })
}

#[cfg(test)]
mod tests;
