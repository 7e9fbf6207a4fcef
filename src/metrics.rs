//! Every metric prefix-picker exports, declared together and registered explicitly.
//!
//! Kthena's names are kept where they exist (semantics doc §7); prefix-picker's own metrics use the
//! `prefix_picker_` prefix, seconds for durations and enum-valued labels. Per-pod series are
//! removed when a pod leaves. docs/metrics.md lists them all.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::prefix_index::{ModelKey, RecordOutcome};

/// This build's version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// This build's git revision (`build.rs`: `PREFIX_PICKER_REVISION`, else git, else `unknown`).
pub const REVISION: &str = env!("PREFIX_PICKER_REVISION");

/// Buckets of `kthena_router_prefix_cache_match_ratio` (Kthena's).
pub const MATCH_RATIO_BUCKETS: [f64; 9] = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0];

const LATENCY_BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.5,
];

/// The prefix-cache plugin's metrics (Kthena names).
#[derive(Debug, Clone)]
pub struct PrefixCacheMetrics {
    pub match_ratio: HistogramVec,
    pub evictions: IntCounterVec,
    pub entries: IntGauge,
    model_names: Arc<RwLock<HashMap<ModelKey, String>>>,
}

impl PrefixCacheMetrics {
    pub fn register(registry: &Registry) -> PrefixCacheMetrics {
        let m = PrefixCacheMetrics {
            match_ratio: HistogramVec::new(
                HistogramOpts::new(
                    "kthena_router_prefix_cache_match_ratio",
                    "Fraction of the prompt's blocks matched by the best pod, per scoring (0 is a miss)",
                )
                .buckets(MATCH_RATIO_BUCKETS.to_vec()),
                &["model"],
            )
            .expect("valid metric"),
            evictions: IntCounterVec::new(
                Opts::new(
                    "kthena_router_prefix_cache_evictions_total",
                    "Entries dropped because a pod's list was full, by the evicted entry's model",
                ),
                &["model"],
            )
            .expect("valid metric"),
            entries: IntGauge::new(
                "kthena_router_prefix_cache_entries",
                "Entries currently stored across all pods (a block held by 3 pods counts 3)",
            )
            .expect("valid metric"),
            model_names: Arc::default(),
        };
        register(registry, m.match_ratio.clone());
        register(registry, m.evictions.clone());
        register(registry, m.entries.clone());
        m
    }

    /// A detached set (not exported), for tests and tools.
    pub fn unregistered() -> PrefixCacheMetrics {
        PrefixCacheMetrics::register(&Registry::new())
    }

    /// Counts a record's evictions, by the evicted entry's model, and remembers the recorded
    /// model's name.
    pub fn count_record(&self, model: &str, outcome: &RecordOutcome) {
        for &(evicted, count) in &outcome.evicted {
            if evicted == ModelKey::of(model) {
                self.evictions.with_label_values(&[model]).inc_by(count);
            } else {
                let name = self.model_name(evicted);
                self.evictions
                    .with_label_values(&[name.as_str()])
                    .inc_by(count);
            }
        }
        self.remember_model(model);
    }

    /// Remembers a model's name so evictions of its entries can be labelled.
    pub fn remember_model(&self, model: &str) {
        let key = ModelKey::of(model);
        if !self.model_names.read().contains_key(&key) {
            self.model_names.write().insert(key, model.to_string());
        }
    }

    /// The name of a model seen in a record (hex key if unknown).
    pub fn model_name(&self, key: ModelKey) -> String {
        self.model_names
            .read()
            .get(&key)
            .cloned()
            .unwrap_or_else(|| format!("{:016x}", key.0))
    }
}

/// Scheduler and sidecar metrics.
#[derive(Debug, Clone)]
pub struct RouterMetrics {
    pub plugin_duration: HistogramVec,
    pub decisions: IntCounterVec,
    pub decision_duration: Histogram,
    pub unscored: IntCounterVec,
    pub records: IntCounterVec,
    pub access_log_entries: IntCounterVec,
    pub inflight_streams: IntGauge,
    pub pending_routes: IntGauge,
    pub pod_inflight: IntGaugeVec,
    pub pod_picks: IntCounterVec,
    pub immediate_responses: IntCounterVec,
    pub engine_scrapes: IntCounterVec,
    pub engine_scrape_timestamp: GaugeVec,
    pub tentative: IntCounterVec,
    pub tentative_holds: IntGauge,
    pub pod_budget: IntGaugeVec,
    pub cached_tokens: IntCounterVec,
    pub estimate_dropped: IntCounter,
}

impl RouterMetrics {
    pub fn register(registry: &Registry) -> RouterMetrics {
        let m = RouterMetrics {
            plugin_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kthena_router_scheduler_plugin_duration_seconds",
                    "Time spent in one scheduler plugin for one request",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["model", "plugin", "type"],
            )
            .expect("valid metric"),
            decisions: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_decisions_total",
                    "Routing decisions, by reason (prefix_hit, prefix_overruled, prefix_miss, \
                     unscored; affinity mode: affinity_hit, affinity_miss, affinity_spill, \
                     affinity_saturated)",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            decision_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "prefix_picker_decision_duration_seconds",
                    "Time from a complete request body to the pick (parse, render, hash, schedule)",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
            unscored: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_unscored_requests_total",
                    "Requests routed without prefix scoring, by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            records: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_records_total",
                    "Request completions, by outcome (recorded, failed, aborted, unknown_pod, unscored, expired)",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            access_log_entries: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_access_log_entries_total",
                    "Envoy access-log entries received, by result (claimed a routed request, unclaimed, no_route_key, forged, intermediate)",
                ),
                &["result"],
            )
            .expect("valid metric"),
            inflight_streams: IntGauge::new(
                "prefix_picker_inflight_streams",
                "Open ext_proc streams",
            )
            .expect("valid metric"),
            pending_routes: IntGauge::new(
                "prefix_picker_pending_routes",
                "Routed requests waiting for their completion from Envoy's access log or an \
                 observer filter (sampled every second)",
            )
            .expect("valid metric"),
            pod_inflight: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_inflight_requests",
                    "Requests picked for a pod (primary) and not yet completed",
                ),
                &["pod"],
            )
            .expect("valid metric"),
            pod_picks: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_pod_picks_total",
                    "Requests whose primary pick was this pod",
                ),
                &["pod"],
            )
            .expect("valid metric"),
            immediate_responses: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_immediate_responses_total",
                    "Requests answered by the picker itself, by HTTP status",
                ),
                &["status"],
            )
            .expect("valid metric"),
            engine_scrapes: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_engine_scrapes_total",
                    "Engine /metrics scrapes, by pod and result (ok, error)",
                ),
                &["pod", "result"],
            )
            .expect("valid metric"),
            engine_scrape_timestamp: GaugeVec::new(
                Opts::new(
                    "prefix_picker_engine_scrape_timestamp_seconds",
                    "Unix time of the last successful engine scrape (staleness = time() - value)",
                ),
                &["pod"],
            )
            .expect("valid metric"),
            tentative: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_tentative_records_total",
                    "Affinity mode: decision-time records ended, by outcome (confirmed for the \
                     picked pod, moved to the pod that served, rolled_back, expired)",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            tentative_holds: IntGauge::new(
                "prefix_picker_tentative_holds",
                "Affinity mode: requests in flight holding their prompt tentatively (sampled \
                 every second)",
            )
            .expect("valid metric"),
            cached_tokens: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_cached_tokens_total",
                    "Affinity mode: prompt tokens the picker predicted the serving engine held \
                     (source=predicted) and the engine reported as cached (source=reported), \
                     over completions whose response carried usage.prompt_tokens_details",
                ),
                &["source"],
            )
            .expect("valid metric"),
            estimate_dropped: IntCounter::new(
                "prefix_picker_estimate_dropped_entries_total",
                "Affinity mode: index entries dropped because an engine reported far fewer \
                 cached tokens than predicted (the missing block and everything older)",
            )
            .expect("valid metric"),
            pod_budget: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_index_budget_entries",
                    "Affinity mode: a pod's prefix-index budget in entries, sized from its \
                     engine's KV capacity",
                ),
                &["pod"],
            )
            .expect("valid metric"),
        };
        // Both sources exist from the start, so their rates compare from the first report.
        for source in CachedTokens::ALL {
            m.cached_tokens.with_label_values(&[source.as_str()]);
        }
        register(registry, m.cached_tokens.clone());
        register(registry, m.estimate_dropped.clone());
        register(registry, m.tentative.clone());
        register(registry, m.tentative_holds.clone());
        register(registry, m.pod_budget.clone());
        register(registry, m.engine_scrapes.clone());
        register(registry, m.engine_scrape_timestamp.clone());
        register(registry, m.plugin_duration.clone());
        register(registry, m.decisions.clone());
        register(registry, m.decision_duration.clone());
        register(registry, m.unscored.clone());
        register(registry, m.records.clone());
        register(registry, m.access_log_entries.clone());
        register(registry, m.inflight_streams.clone());
        register(registry, m.pending_routes.clone());
        register(registry, m.pod_inflight.clone());
        register(registry, m.pod_picks.clone());
        register(registry, m.immediate_responses.clone());
        let build = IntGaugeVec::new(
            Opts::new(
                "prefix_picker_build_info",
                "Always 1; the labels name the build (version, git revision)",
            ),
            &["version", "revision"],
        )
        .expect("valid metric");
        build.with_label_values(&[VERSION, REVISION]).set(1);
        register(registry, build);
        m
    }

    /// Removes a departed pod's series.
    pub fn forget_pod(&self, pod: &str) {
        let _ = self.pod_inflight.remove_label_values(&[pod]);
        let _ = self.pod_picks.remove_label_values(&[pod]);
        let _ = self.engine_scrape_timestamp.remove_label_values(&[pod]);
        let _ = self.pod_budget.remove_label_values(&[pod]);
        for result in ["ok", "error"] {
            let _ = self.engine_scrapes.remove_label_values(&[pod, result]);
        }
    }
}

fn register<C: prometheus::core::Collector + 'static>(registry: &Registry, c: C) {
    registry
        .register(Box::new(c))
        .expect("metric names are unique");
}

/// Encodes a registry in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("text format is UTF-8")
}

/// Whose count of cached tokens (the `source` label of `prefix_picker_cached_tokens_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedTokens {
    /// The blocks the index predicted the pod held.
    Predicted,
    /// The engine's `cached_tokens` report.
    Reported,
}

impl CachedTokens {
    pub const ALL: [CachedTokens; 2] = [CachedTokens::Predicted, CachedTokens::Reported];

    pub fn as_str(self) -> &'static str {
        match self {
            CachedTokens::Predicted => "predicted",
            CachedTokens::Reported => "reported",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_count_evictions_by_the_evicted_model() {
        let m = PrefixCacheMetrics::unregistered();
        let (a, b) = (ModelKey::of("a"), ModelKey::of("b"));
        let outcome = |evicted| RecordOutcome {
            inserted: 1,
            evicted,
        };
        m.count_record("b", &outcome(vec![]));
        m.count_record("a", &outcome(vec![(a, 2)]));
        assert_eq!(m.evictions.with_label_values(&["a"]).get(), 2);
        m.count_record("a", &outcome(vec![(b, 1), (ModelKey(7), 3)]));
        assert_eq!(m.evictions.with_label_values(&["b"]).get(), 1);
        assert_eq!(
            m.evictions.with_label_values(&["0000000000000007"]).get(),
            3
        );
    }

    #[test]
    fn match_ratio_buckets_are_kthenas() {
        let m = PrefixCacheMetrics::unregistered();
        let h = m.match_ratio.with_label_values(&["m"]);
        h.observe(0.0);
        h.observe(0.75);
        let registry = Registry::new();
        registry.register(Box::new(m.match_ratio.clone())).unwrap();
        let text = encode(&registry);
        assert!(
            text.contains("kthena_router_prefix_cache_match_ratio_bucket{model=\"m\",le=\"0\"} 1")
        );
        assert!(text.contains("kthena_router_prefix_cache_match_ratio_sum{model=\"m\"} 0.75"));
    }

    #[test]
    fn build_info_names_this_build() {
        let registry = Registry::new();
        RouterMetrics::register(&registry);
        let text = encode(&registry);
        let line = format!(
            "prefix_picker_build_info{{revision=\"{REVISION}\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{line} not in:\n{text}");
        assert!(!REVISION.is_empty());
    }
}
