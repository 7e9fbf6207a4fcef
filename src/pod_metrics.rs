//! Engine-metrics scraping: every pod's `/metrics`, parsed into [`EngineStats`] for the
//! load-aware plugins (semantics doc §6).
//!
//! Every `scrapeIntervalSeconds` (default 1 s; 0 disables) each pod is fetched with a timeout
//! (`scrapeTimeoutSeconds`, default 0.5 s), at most `scrapeConcurrency` (default 16) at a time.
//! The text is parsed with `openmetrics-parser`. vLLM names are read first, SGLang's as a
//! fallback: waiting (`vllm:num_requests_waiting` / `sglang:num_queue_reqs`), running
//! (`vllm:num_requests_running` / `sglang:num_running_reqs`), KV usage
//! (`vllm:kv_cache_usage_perc` / `sglang:token_usage`), TTFT and TPOT histograms
//! (`*:time_to_first_token_seconds`, `*:inter_token_latency_seconds`). The last series of a
//! family wins; a missing family is 0. TTFT/TPOT are the mean over the last scrape period from the
//! histogram's sum/count deltas (after a counter reset: sum/count; no new samples: unchanged). A
//! failed scrape keeps the previous values; `prefix_picker_engine_scrape_timestamp_seconds{pod}`
//! exposes staleness.
//!
//! A static endpoint without `generation:` takes its engine's `process_start_time_seconds` as
//! its generation ([`Endpoints::engine_started`]): learned at the first scrape, and a new value
//! later (the engine restarted) starts the pod cold. The first round is signalled so that the
//! sync replay can wait for it (records stamped with an earlier life are then dropped).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use openmetrics_parser::{PrometheusType, PrometheusValue};
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::endpoints::{Endpoint, Endpoints, EngineStats};
use crate::metrics::RouterMetrics;
use crate::prefix_index::PodSlot;
use crate::scheduler::affinity::AffinityConfig;

/// Scrape settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScrapeConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub concurrency: usize,
    /// The affinity mode's `engineBudget`: size each pod's index from its engine's capacity.
    pub budget: Option<EngineBudget>,
}

/// How an engine's KV capacity becomes a pod's index budget: `tokens x bytes_per_token /
/// block_bytes` entries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineBudget {
    pub affinity: AffinityConfig,
    pub block_bytes: usize,
}

#[derive(Debug, Error)]
pub enum ScrapeError {
    #[error("GET /metrics failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("metrics text does not parse: {0}")]
    Parse(String),
}

/// A histogram's running totals.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Totals {
    pub sum: f64,
    pub count: u64,
}

/// Values read from one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RawEngineMetrics {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    pub ttft: Totals,
    pub tpot: Totals,
    /// Tokens of KV cache the engine has, when it says: vLLM's `vllm:cache_config_info`
    /// labels `num_gpu_blocks x block_size`, SGLang's `sglang:max_total_num_tokens`.
    pub kv_capacity_tokens: Option<u64>,
    /// `process_start_time_seconds` (Unix seconds), when exported.
    pub start_time: Option<f64>,
}

/// The generation of a static pod whose engine started at `start_time` (Unix seconds).
pub fn start_generation(start_time: f64) -> String {
    format!("started-{start_time}")
}

const WAITING: [&str; 2] = ["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
const RUNNING: [&str; 2] = ["vllm:num_requests_running", "sglang:num_running_reqs"];
// Current names first; older vLLM releases called these `gpu_cache_usage_perc` and
// `time_per_output_token_seconds`.
const KV_USAGE: [&str; 3] = [
    "vllm:kv_cache_usage_perc",
    "sglang:token_usage",
    "vllm:gpu_cache_usage_perc",
];
const TTFT: [&str; 2] = [
    "vllm:time_to_first_token_seconds",
    "sglang:time_to_first_token_seconds",
];
const TPOT: [&str; 3] = [
    "vllm:inter_token_latency_seconds",
    "sglang:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
];

/// The standard process collector's start time (Python's `prometheus_client`, Go's, Rust's).
const START_TIME: &str = "process_start_time_seconds";

type Exposition = openmetrics_parser::MetricsExposition<PrometheusType, PrometheusValue>;

/// Parses a Prometheus text exposition into the values the plugins need.
pub fn parse(text: &str) -> Result<RawEngineMetrics, ScrapeError> {
    let exposition = openmetrics_parser::prometheus::parse_prometheus(text)
        .map_err(|e| ScrapeError::Parse(format!("{e:?}")))?;
    Ok(RawEngineMetrics {
        waiting: scalar(&exposition, &WAITING),
        running: scalar(&exposition, &RUNNING),
        kv_usage: scalar(&exposition, &KV_USAGE),
        ttft: totals(&exposition, &TTFT),
        tpot: totals(&exposition, &TPOT),
        kv_capacity_tokens: kv_capacity(&exposition),
        start_time: exposition
            .families
            .contains_key(START_TIME)
            .then(|| scalar(&exposition, &[START_TIME]))
            .filter(|t| *t > 0.0),
    })
}

fn kv_capacity(e: &Exposition) -> Option<u64> {
    let from_vllm = e.families.get("vllm:cache_config_info").and_then(|f| {
        f.iter_samples().find_map(|s| {
            let labels = s.get_labelset().ok()?;
            let blocks: u64 = labels.get_label_value("num_gpu_blocks")?.parse().ok()?;
            let size: u64 = labels.get_label_value("block_size")?.parse().ok()?;
            Some(blocks.saturating_mul(size))
        })
    });
    let tokens = from_vllm.or_else(|| {
        e.families.get("sglang:max_total_num_tokens")?;
        Some(scalar(e, &["sglang:max_total_num_tokens"]) as u64)
    })?;
    (tokens > 0).then_some(tokens)
}

fn last_value<'a>(e: &'a Exposition, names: &[&str]) -> Option<&'a PrometheusValue> {
    names
        .iter()
        .find_map(|n| e.families.get(*n))
        .and_then(|f| f.iter_samples().last())
        .map(|s| &s.value)
}

fn scalar(e: &Exposition, names: &[&str]) -> f64 {
    match last_value(e, names) {
        Some(PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n)) => n.as_f64(),
        Some(PrometheusValue::Counter(c)) => c.value.as_f64(),
        _ => 0.0,
    }
}

fn totals(e: &Exposition, names: &[&str]) -> Totals {
    match last_value(e, names) {
        Some(PrometheusValue::Histogram(h)) => Totals {
            sum: h.sum.as_ref().map_or(0.0, |s| s.as_f64()),
            count: h.count.unwrap_or(0),
        },
        _ => Totals::default(),
    }
}

/// Mean over the last period from running totals (see the module doc).
pub fn period_mean(previous: Option<Totals>, current: Totals, last_mean: f64) -> f64 {
    let whole = |t: Totals| {
        if t.count == 0 {
            0.0
        } else {
            t.sum / t.count as f64
        }
    };
    match previous {
        None => whole(current),
        Some(p) if current.count > p.count => {
            ((current.sum - p.sum) / (current.count - p.count) as f64).max(0.0)
        }
        Some(p) if current.count < p.count => whole(current),
        Some(_) => last_mean,
    }
}

async fn fetch(client: &reqwest::Client, e: &Endpoint) -> Result<RawEngineMetrics, ScrapeError> {
    let text = client
        .get(format!("http://{}/metrics", e.host))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    parse(&text)
}

/// Scrapes every pod until cancelled; `first_round` turns true once every pod was scraped (or
/// failed) once.
pub async fn run(
    endpoints: Arc<Endpoints>,
    metrics: RouterMetrics,
    config: ScrapeConfig,
    first_round: watch::Sender<bool>,
    token: CancellationToken,
) {
    let Ok(client) = reqwest::Client::builder().timeout(config.timeout).build() else {
        tracing::error!("cannot build the scrape HTTP client; engine metrics disabled");
        return;
    };
    let mut previous: HashMap<PodSlot, (RawEngineMetrics, EngineStats)> = HashMap::new();
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let set = endpoints.snapshot();
        let results: Vec<(Arc<Endpoint>, Result<RawEngineMetrics, ScrapeError>)> =
            futures_util::stream::iter(set.all().iter().cloned())
                .map(|e| {
                    let client = client.clone();
                    async move {
                        let r = fetch(&client, &e).await;
                        (e, r)
                    }
                })
                .buffer_unordered(config.concurrency.max(1))
                .collect()
                .await;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        for (e, result) in results {
            match result {
                Ok(raw) => {
                    let e = match raw
                        .start_time
                        .and_then(|t| endpoints.engine_started(&e, &start_generation(t)))
                    {
                        Some(fresh) => {
                            tracing::info!(pod = %fresh.label, generation = %fresh.generation(), "engine restarted (new process_start_time_seconds); the pod starts cold");
                            fresh
                        }
                        None => e,
                    };
                    let slot = e.index.slot();
                    let prev = previous.get(&slot);
                    let stats = EngineStats {
                        waiting: raw.waiting,
                        running: raw.running,
                        kv_usage: raw.kv_usage,
                        ttft: period_mean(
                            prev.map(|p| p.0.ttft),
                            raw.ttft,
                            prev.map_or(0.0, |p| p.1.ttft),
                        ),
                        tpot: period_mean(
                            prev.map(|p| p.0.tpot),
                            raw.tpot,
                            prev.map_or(0.0, |p| p.1.tpot),
                        ),
                    };
                    e.set_stats(stats);
                    if let (Some(budget), Some(tokens)) = (config.budget, raw.kv_capacity_tokens)
                        && prev.is_none_or(|p| p.0.kv_capacity_tokens != Some(tokens))
                    {
                        apply_budget(&endpoints, &metrics, &e, budget, tokens);
                    }
                    previous.insert(slot, (raw, stats));
                    metrics
                        .engine_scrapes
                        .with_label_values(&[&e.label, "ok"])
                        .inc();
                    metrics
                        .engine_scrape_timestamp
                        .with_label_values(&[&e.label])
                        .set(now);
                }
                Err(err) => {
                    tracing::debug!(pod = %e.label, error = %err, "engine metrics scrape failed");
                    metrics
                        .engine_scrapes
                        .with_label_values(&[&e.label, "error"])
                        .inc();
                }
            }
        }
        first_round.send_replace(true);
        let set = endpoints.snapshot();
        previous.retain(|slot, _| set.all().iter().any(|e| e.index.slot() == *slot));
    }
}

/// Sizes `e`'s index budget from its engine's `tokens` of KV cache.
fn apply_budget(
    endpoints: &Endpoints,
    metrics: &RouterMetrics,
    e: &Endpoint,
    budget: EngineBudget,
    tokens: u64,
) {
    let entries = budget.affinity.budget_entries(tokens, budget.block_bytes);
    let dropped: u64 = endpoints
        .index()
        .set_pod_capacity(e.index.slot(), entries)
        .iter()
        .map(|(_, n)| n)
        .sum();
    metrics
        .pod_budget
        .with_label_values(&[&e.label])
        .set(i64::try_from(entries).unwrap_or(i64::MAX));
    tracing::info!(pod = %e.label, engine_tokens = tokens, entries, dropped, "index budget sized from the engine");
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Requests running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc 0.25
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4
vllm:time_to_first_token_seconds_sum 0.8
vllm:time_to_first_token_seconds_count 4
"#;

    #[test]
    fn parses_vllm_names_last_series_wins_missing_is_zero() {
        let m = parse(VLLM).unwrap();
        assert_eq!(m.running, 3.0);
        assert_eq!(m.waiting, 2.0);
        assert_eq!(m.kv_usage, 0.25);
        assert_eq!(m.ttft, Totals { sum: 0.8, count: 4 });
        assert_eq!(m.tpot, Totals::default());
    }

    #[test]
    fn parses_sglang_names() {
        let text = "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 7\n# TYPE sglang:token_usage gauge\nsglang:token_usage 0.5\n";
        let m = parse(text).unwrap();
        assert_eq!(m.waiting, 7.0);
        assert_eq!(m.kv_usage, 0.5);
    }

    #[test]
    fn parses_older_vllm_names_and_prefers_the_current_ones() {
        let old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.4\n\
            # TYPE vllm:time_per_output_token_seconds histogram\n\
            vllm:time_per_output_token_seconds_bucket{le=\"+Inf\"} 5\n\
            vllm:time_per_output_token_seconds_sum 0.1\n\
            vllm:time_per_output_token_seconds_count 5\n";
        let m = parse(old).unwrap();
        assert_eq!(m.kv_usage, 0.4);
        assert_eq!(m.tpot, Totals { sum: 0.1, count: 5 });
        let both =
            format!("{old}# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.7\n");
        assert_eq!(parse(&both).unwrap().kv_usage, 0.7);
    }

    #[test]
    fn reads_the_engine_start_time() {
        assert_eq!(parse(VLLM).unwrap().start_time, None);
        let text = format!(
            "{VLLM}# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.71234567825e+09\n"
        );
        let m = parse(&text).unwrap();
        assert_eq!(m.start_time, Some(1_712_345_678.25));
        assert_eq!(start_generation(1_712_345_678.25), "started-1712345678.25");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse("this is { not metrics").is_err());
    }

    #[test]
    fn period_means() {
        let t = |sum, count| Totals { sum, count };
        assert_eq!(period_mean(None, t(0.8, 4), 0.0), 0.2);
        assert_eq!(period_mean(Some(t(0.8, 4)), t(1.8, 6), 0.2), 0.5);
        assert_eq!(period_mean(Some(t(0.8, 4)), t(0.8, 4), 0.2), 0.2);
        assert_eq!(period_mean(Some(t(0.8, 4)), t(0.3, 1), 0.2), 0.3);
        assert_eq!(period_mean(None, t(0.0, 0), 0.0), 0.0);
    }
}
