//! Engine-metrics scraping: every pod's `/metrics`, parsed into [`EngineStats`] for the
//! load-aware plugins (semantics doc §6).
//!
//! Every `scrapeIntervalSeconds` (default 1 s; 0 disables) each pod is fetched with a timeout
//! (`scrapeTimeoutSeconds`, default 0.5 s), at most `scrapeConcurrency` (default 16) at a time.
//! The families read are cut out of the text first ([`families`]: a line scanner that skips
//! every other family without parsing its samples), then parsed with `openmetrics-parser`. Each signal (waiting, running, KV usage, TTFT
//! and TPOT histograms) is read from the first of its names present ([`names`]: vLLM's current
//! names, SGLang's, vLLM's previous ones; or one configured spec per signal, GIE's syntax). The
//! last matching series of a family wins. TTFT/TPOT are the mean over the last scrape period from
//! the histogram's sum/count deltas (after a counter reset: sum/count; no new samples:
//! unchanged). A failed scrape keeps the previous values;
//! `prefix_picker_engine_scrape_timestamp_seconds{pod}` exposes staleness.
//!
//! A signal an engine does not export, or exports as no number (NaN, an infinity), is not read
//! as zero: it keeps its value of the last scrape that had it (0 if none did), is counted in
//! `prefix_picker_engine_metric_missing_total{signal}` at every scrape, and is warned about once
//! per pod, naming the metric names tried.
//!
//! A static endpoint without `generation:` takes its engine's `process_start_time_seconds` as
//! its generation ([`Endpoints::engine_started`]): learned at the first scrape, and a new value
//! later (the engine restarted) starts the pod cold. The first round is signalled so that the
//! sync replay can wait for it (records stamped with an earlier life are then dropped).

pub mod families;
pub mod names;
mod scraper;

#[cfg(test)]
mod tests;

pub use scraper::{MissingWarnings, run};

use std::time::Duration;

use openmetrics_parser::{PrometheusType, PrometheusValue};
use prometheus::{IntCounterVec, Opts, Registry};
use thiserror::Error;

use crate::metrics::listing;
use crate::scheduler::LoraAdapters;
use crate::scheduler::affinity::AffinityConfig;

use names::{MetricSpec, Signal, SignalSpecs, Signals};

/// Scrape settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub concurrency: usize,
    /// The affinity mode's `engineBudget`: size each pod's index from its engine's capacity.
    pub budget: Option<EngineBudget>,
    /// The metric names read for each signal.
    pub names: SignalSpecs,
}

/// The scraper's own metric (the per-pod scrape counters are in [`RouterMetrics`]).
#[derive(Debug, Clone)]
pub struct ScrapeMetrics {
    pub missing: IntCounterVec,
}

impl ScrapeMetrics {
    pub fn register(registry: &Registry) -> ScrapeMetrics {
        let missing = IntCounterVec::new(
            Opts::new(
                "prefix_picker_engine_metric_missing_total",
                listing(
                    "Successful engine scrapes that found none of a signal's metric names (the \
                     signal keeps its last value), by signal",
                    &[("signal", &Signal::ALL.map(Signal::as_str))],
                ),
            ),
            &["signal"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(missing.clone()))
            .expect("unique metric");
        for s in Signal::ALL {
            missing.with_label_values(&[s.as_str()]);
        }
        ScrapeMetrics { missing }
    }
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawEngineMetrics {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    pub ttft: Totals,
    pub tpot: Totals,
    /// Tokens of KV cache the engine has, when it says: vLLM's `vllm:cache_config_info`
    /// labels `num_gpu_blocks x block_size`, SGLang's `sglang:max_total_num_tokens`.
    pub kv_capacity_tokens: Option<u64>,
    /// Whether the engine reuses its KV cache across requests, when it says: vLLM's
    /// `vllm:cache_config_info` label `enable_prefix_caching` (`False`: started with
    /// `--no-enable-prefix-caching`).
    pub prefix_caching: Option<bool>,
    /// `process_start_time_seconds` (Unix seconds), when exported.
    pub start_time: Option<f64>,
    /// vLLM's LoRA adapters (`vllm:lora_requests_info`, the series with the latest value, as
    /// llm-d reads it: `extractor/metrics/loraspec.go`); `None`: not exported (vLLM exports it
    /// once an adapter was used).
    pub lora: Option<LoraAdapters>,
    /// Signals none of whose names had a matching series (their values above are 0).
    pub missing: Signals,
}

impl RawEngineMetrics {
    /// Takes each missing signal's value from `previous` (the last scrape's, itself filled).
    pub fn or_previous(mut self, previous: &RawEngineMetrics) -> RawEngineMetrics {
        for s in self.missing.iter() {
            match s {
                Signal::Waiting => self.waiting = previous.waiting,
                Signal::Running => self.running = previous.running,
                Signal::KvCacheUsage => self.kv_usage = previous.kv_usage,
                Signal::Ttft => self.ttft = previous.ttft,
                Signal::Tpot => self.tpot = previous.tpot,
            }
        }
        self
    }
}

/// The generation of a static pod whose engine started at `start_time` (Unix seconds).
pub fn start_generation(start_time: f64) -> String {
    format!("started-{start_time}")
}

/// The standard process collector's start time (Python's `prometheus_client`, Go's, Rust's).
const START_TIME: &str = "process_start_time_seconds";
/// vLLM's cache config, whose labels give its KV capacity.
const VLLM_CACHE_CONFIG: &str = "vllm:cache_config_info";
/// SGLang's KV capacity in tokens.
const SGLANG_MAX_TOKENS: &str = "sglang:max_total_num_tokens";
/// vLLM's LoRA state.
const VLLM_LORA: &str = "vllm:lora_requests_info";

type Exposition = openmetrics_parser::MetricsExposition<PrometheusType, PrometheusValue>;

/// Parses a Prometheus text exposition into the values the plugins need, by the built-in names.
pub fn parse(text: &str) -> Result<RawEngineMetrics, ScrapeError> {
    parse_with(text, &SignalSpecs::default())
}

/// The families any signal or engine fact is read from, with `names`.
fn wanted(names: &SignalSpecs) -> families::Wanted<'_> {
    let signals = Signal::ALL
        .into_iter()
        .flat_map(|s| names.get(s).iter().map(|spec| spec.name.as_str()));
    families::Wanted::new(signals.chain([
        VLLM_CACHE_CONFIG,
        SGLANG_MAX_TOKENS,
        START_TIME,
        VLLM_LORA,
    ]))
}

/// Parses a Prometheus text exposition, reading each signal by `names`: only the families read
/// are parsed ([`families`]). A text none of whose lines is kept (every line a well-formed
/// sample or description of a family not read) reads as every signal missing.
pub fn parse_with(text: &str, names: &SignalSpecs) -> Result<RawEngineMetrics, ScrapeError> {
    let kept = wanted(names).keep(text);
    if kept.is_empty() && !text.trim().is_empty() {
        let nothing = Exposition {
            families: std::collections::HashMap::new(),
        };
        return Ok(read(&nothing, names));
    }
    parse_whole_with(&kept, names)
}

/// [`parse_with`] parsing every family of the text: the reference the family filter is
/// tested (and benchmarked) against.
pub fn parse_whole_with(text: &str, names: &SignalSpecs) -> Result<RawEngineMetrics, ScrapeError> {
    let exposition = openmetrics_parser::prometheus::parse_prometheus(text)
        .map_err(|e| ScrapeError::Parse(format!("{e:?}")))?;
    Ok(read(&exposition, names))
}

/// The values read from a parsed exposition.
fn read(exposition: &Exposition, names: &SignalSpecs) -> RawEngineMetrics {
    let mut missing = Signals::default();
    let mut read = |s: Signal| {
        let specs = names.get(s);
        // A sample that is not a number (NaN, an infinity) is read as missing: the pick adds
        // and compares these.
        let found = last_value(exposition, specs).filter(|v| finite(v));
        if found.is_none() && !specs.is_empty() {
            missing.insert(s);
        }
        found
    };
    let (waiting, running, kv_usage) = (
        scalar(read(Signal::Waiting)),
        scalar(read(Signal::Running)),
        scalar(read(Signal::KvCacheUsage)),
    );
    let (ttft, tpot) = (totals(read(Signal::Ttft)), totals(read(Signal::Tpot)));
    RawEngineMetrics {
        waiting,
        running,
        kv_usage,
        ttft,
        tpot,
        missing,
        kv_capacity_tokens: kv_capacity(exposition),
        prefix_caching: prefix_caching(exposition),
        start_time: named(exposition, START_TIME)
            .map(|v| scalar(Some(v)))
            .filter(|t| *t > 0.0),
        lora: lora(exposition),
    }
}

/// `vllm:lora_requests_info`'s latest series (the greatest value: each is its creation time)
/// as adapter lists; a bad `max_lora` reads as 0.
fn lora(e: &Exposition) -> Option<LoraAdapters> {
    let family = e.families.get(VLLM_LORA)?;
    let latest = family
        .iter_samples()
        .max_by(|a, b| scalar(Some(&a.value)).total_cmp(&scalar(Some(&b.value))))?;
    let labels = latest.get_labelset().ok()?;
    let list = |name: &str| -> Vec<String> {
        labels
            .get_label_value(name)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    };
    Some(LoraAdapters {
        running: list("running_lora_adapters"),
        waiting: list("waiting_lora_adapters"),
        max: labels
            .get_label_value("max_lora")
            .and_then(|m| m.parse().ok())
            .unwrap_or(0),
    })
}

fn kv_capacity(e: &Exposition) -> Option<u64> {
    let from_vllm = e.families.get(VLLM_CACHE_CONFIG).and_then(|f| {
        f.iter_samples().find_map(|s| {
            let labels = s.get_labelset().ok()?;
            let blocks: u64 = labels.get_label_value("num_gpu_blocks")?.parse().ok()?;
            let size: u64 = labels.get_label_value("block_size")?.parse().ok()?;
            Some(blocks.saturating_mul(size))
        })
    });
    let tokens = from_vllm.or_else(|| Some(scalar(named(e, SGLANG_MAX_TOKENS)) as u64))?;
    (tokens > 0).then_some(tokens)
}

/// vLLM's `enable_prefix_caching` label (`True` / `False`, any case); `None`: not exported.
fn prefix_caching(e: &Exposition) -> Option<bool> {
    e.families.get(VLLM_CACHE_CONFIG).and_then(|f| {
        f.iter_samples().find_map(|s| {
            let labels = s.get_labelset().ok()?;
            let value = labels.get_label_value("enable_prefix_caching")?;
            match value.to_ascii_lowercase().as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            }
        })
    })
}

/// The last series of the first spec that matches one.
fn last_value<'a>(e: &'a Exposition, specs: &[MetricSpec]) -> Option<&'a PrometheusValue> {
    specs.iter().find_map(|spec| {
        e.families
            .get(&spec.name)?
            .iter_samples()
            .filter(|s| {
                spec.labels.is_empty()
                    || s.get_labelset().is_ok_and(|set| {
                        spec.labels
                            .iter()
                            .all(|(k, v)| set.get_label_value(k) == Some(v.as_str()))
                    })
            })
            .last()
            .map(|s| &s.value)
    })
}

/// The last series of the family `name`.
fn named<'a>(e: &'a Exposition, name: &str) -> Option<&'a PrometheusValue> {
    e.families
        .get(name)
        .and_then(|f| f.iter_samples().last())
        .map(|s| &s.value)
}

/// Whether a sample's value (a histogram's sum) is a finite number.
fn finite(value: &PrometheusValue) -> bool {
    match value {
        PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64().is_finite(),
        PrometheusValue::Counter(c) => c.value.as_f64().is_finite(),
        PrometheusValue::Histogram(h) => h.sum.as_ref().is_none_or(|s| s.as_f64().is_finite()),
        _ => true,
    }
}

fn scalar(value: Option<&PrometheusValue>) -> f64 {
    match value {
        Some(PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n)) => n.as_f64(),
        Some(PrometheusValue::Counter(c)) => c.value.as_f64(),
        _ => 0.0,
    }
}

fn totals(value: Option<&PrometheusValue>) -> Totals {
    match value {
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
