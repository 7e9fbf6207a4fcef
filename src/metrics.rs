//! Every metric prefix-picker exports, declared together and registered explicitly.
//!
//! Kthena's names are kept where they exist (semantics doc §7); prefix-picker's own metrics use the
//! `prefix_picker_` prefix, seconds for durations and enum-valued labels. A help string lists
//! the values of each enum-valued label, generated from the enum ([`listing`]). Per-pod series
//! carry [`POD_LABELS`] and are removed when a pod leaves. The process metrics
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...) come with the router's.
//! docs/metrics.md lists them all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::pod_id::PodId;
use crate::prefix_index::{ModelKey, RecordOutcome};
use crate::scheduler::{DecisionReason, Unscored};
use outcomes::{Claim, RouteOutcome, SessionDrop, SessionOutcome, TentativeOutcome};

/// This build's version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// This build's git revision (`build.rs`: `PREFIX_PICKER_REVISION`, else git, else `unknown`).
pub const REVISION: &str = env!("PREFIX_PICKER_REVISION");

/// The labels of per-pod series: the model server's pod name and namespace. Not `pod` and
/// `namespace`: Prometheus' Kubernetes discovery sets those on every series to the picker's own.
pub const POD_LABELS: [&str; 2] = ["model_server_pod", "model_server_namespace"];

/// A pod's values of [`POD_LABELS`].
pub fn pod_label_values(id: &PodId) -> [&str; 2] {
    [&id.name, &id.namespace]
}

/// Help text that lists the values of enum-valued labels: `text (label: a, b; other: c, d)`.
/// Tests read the list back and compare it with what is emitted.
pub fn listing(text: &str, labels: &[(&str, &[&str])]) -> String {
    let lists: Vec<String> = labels
        .iter()
        .map(|(label, values)| format!("{label}: {}", values.join(", ")))
        .collect();
    format!("{text} ({})", lists.join("; "))
}

/// The label lists of a help string written by [`listing`]: `text (label: a, b; other: c)`.
pub fn listed(help: &str) -> BTreeMap<String, BTreeSet<String>> {
    let Some(open) = help.rfind(" (").filter(|_| help.ends_with(')')) else {
        return BTreeMap::new();
    };
    help[open + 2..help.len() - 1]
        .split("; ")
        .map_while(|list| {
            let (label, values) = list.split_once(": ")?;
            let is_name = label.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            is_name.then(|| {
                let values = values.split(", ").map(str::to_string).collect();
                (label.to_string(), values)
            })
        })
        .collect()
}

/// The `result` of an engine scrape (`prefix_picker_engine_scrapes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeResult {
    Ok,
    Error,
}

impl ScrapeResult {
    pub const ALL: [ScrapeResult; 2] = [ScrapeResult::Ok, ScrapeResult::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            ScrapeResult::Ok => "ok",
            ScrapeResult::Error => "error",
        }
    }
}

/// The `result` of a config reload (`prefix_picker_config_reloads_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// The new config is live.
    Success,
    /// Refused (invalid, or a key that needs a restart changed): the old config stays.
    Failure,
    /// Nothing that matters changed (e.g. a comment, or a SIGHUP with the same file).
    Unchanged,
}

impl ReloadResult {
    pub const ALL: [ReloadResult; 3] = [
        ReloadResult::Success,
        ReloadResult::Failure,
        ReloadResult::Unchanged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Success => "success",
            ReloadResult::Failure => "failure",
            ReloadResult::Unchanged => "unchanged",
        }
    }
}

/// The `source` of `prefix_picker_cached_tokens_total`.
pub const CACHED_TOKEN_SOURCES: [&str; 2] = ["predicted", "reported"];

/// Buckets of `kthena_router_prefix_cache_match_ratio` (Kthena's).
pub const MATCH_RATIO_BUCKETS: [f64; 9] = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0];

pub mod engine_truth;
pub mod kvcache;
pub mod outcomes;

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
    pub shed: IntCounter,
    pub engine_scrapes: IntCounterVec,
    pub engine_scrape_timestamp: GaugeVec,
    pub tentative: IntCounterVec,
    pub tentative_holds: IntGauge,
    pub pod_budget: IntGaugeVec,
    pub pod_churn: GaugeVec,
    pub cached_tokens: IntCounterVec,
    pub estimate_dropped: IntCounter,
    pub latency_model_ratio: Histogram,
    pub ttft_prediction_error: Histogram,
    pub pod_concurrency: GaugeVec,
    pub pod_service: GaugeVec,
    pub prefill_per_token: Gauge,
    pub sessions: IntGauge,
    pub session_requests: IntCounterVec,
    pub sessions_dropped: IntCounterVec,
    pub config_reloads: IntCounterVec,
    pub config_info: IntGaugeVec,
    /// KV-cache events, engine views, match sources, engine tokens.
    pub engine: engine_truth::EngineTruthMetrics,
    /// kvcache-aware's lookups, Redis connection and GC.
    pub kvcache: kvcache::KvCacheMetrics,
}

impl RouterMetrics {
    /// Every family, registered into `registry`, a group at a time; every value of an
    /// enum-valued label exists at 0 from the start ("none yet" is a value, not an absence;
    /// rates compare from the first event), so the exposition lists what the help string does.
    pub fn register(registry: &Registry) -> RouterMetrics {
        let decisions = Decisions::register(registry);
        let completions = Completions::register(registry);
        let pods = Pods::register(registry);
        let affinity = Affinity::register(registry);
        let latency = LatencyModel::register(registry);
        let sessions = Sessions::register(registry);
        let config = Config::register(registry);
        register_build_and_process(registry);
        RouterMetrics {
            plugin_duration: decisions.plugin_duration,
            decisions: decisions.decisions,
            decision_duration: decisions.decision_duration,
            unscored: decisions.unscored,
            records: completions.records,
            access_log_entries: completions.access_log_entries,
            inflight_streams: completions.inflight_streams,
            pending_routes: completions.pending_routes,
            immediate_responses: completions.immediate_responses,
            shed: completions.shed,
            pod_inflight: pods.pod_inflight,
            pod_picks: pods.pod_picks,
            engine_scrapes: pods.engine_scrapes,
            engine_scrape_timestamp: pods.engine_scrape_timestamp,
            tentative: affinity.tentative,
            tentative_holds: affinity.tentative_holds,
            cached_tokens: affinity.cached_tokens,
            estimate_dropped: affinity.estimate_dropped,
            pod_budget: affinity.pod_budget,
            pod_churn: affinity.pod_churn,
            latency_model_ratio: latency.latency_model_ratio,
            ttft_prediction_error: latency.ttft_prediction_error,
            pod_concurrency: latency.pod_concurrency,
            pod_service: latency.pod_service,
            prefill_per_token: latency.prefill_per_token,
            sessions: sessions.sessions,
            session_requests: sessions.session_requests,
            sessions_dropped: sessions.sessions_dropped,
            config_reloads: config.config_reloads,
            config_info: config.config_info,
            engine: engine_truth::EngineTruthMetrics::register(
                registry,
                &crate::scheduler::MatchSource::ALL.map(crate::scheduler::MatchSource::as_str),
                &crate::scheduler::HoldEnd::ALL.map(crate::scheduler::HoldEnd::as_str),
                &engine_truth::TokenizeErrorKind::ALL.map(engine_truth::TokenizeErrorKind::as_str),
            ),
            kvcache: kvcache::KvCacheMetrics::register(registry),
        }
    }

    /// Counts an engine scrape of a pod.
    pub fn count_scrape(&self, pod: &PodId, result: ScrapeResult) {
        let [name, namespace] = pod_label_values(pod);
        self.engine_scrapes
            .with_label_values(&[name, namespace, result.as_str()])
            .inc();
    }

    /// Removes a departed pod's series.
    pub fn forget_pod(&self, pod: &PodId) {
        let labels = pod_label_values(pod);
        let _ = self.pod_inflight.remove_label_values(&labels);
        let _ = self.pod_picks.remove_label_values(&labels);
        let _ = self.engine_scrape_timestamp.remove_label_values(&labels);
        let _ = self.pod_budget.remove_label_values(&labels);
        let _ = self.pod_churn.remove_label_values(&labels);
        self.engine.forget_pod(labels);
        for result in ScrapeResult::ALL {
            let _ =
                self.engine_scrapes
                    .remove_label_values(&[labels[0], labels[1], result.as_str()]);
        }
    }
}

/// How requests were decided: the pick's reason, its duration, the plugins' times, why a request
/// went unscored.
#[derive(Debug)]
struct Decisions {
    plugin_duration: HistogramVec,
    decisions: IntCounterVec,
    decision_duration: Histogram,
    unscored: IntCounterVec,
}

impl Decisions {
    fn register(registry: &Registry) -> Decisions {
        let m = Decisions {
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
                    listing(
                        "Routing decisions, by reason (affinity_* in the affinity mode only, \
                         session with session affinity only)",
                        &[("reason", &DecisionReason::ALL.map(DecisionReason::as_str))],
                    ),
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
                    listing(
                        "Requests routed without prefix scoring, by reason",
                        &[("reason", &Unscored::ALL.map(Unscored::as_str))],
                    ),
                ),
                &["reason"],
            )
            .expect("valid metric"),
        };
        for reason in DecisionReason::ALL {
            m.decisions.with_label_values(&[reason.as_str()]);
        }
        for reason in Unscored::ALL {
            m.unscored.with_label_values(&[reason.as_str()]);
        }
        register(registry, m.plugin_duration.clone());
        register(registry, m.decisions.clone());
        register(registry, m.decision_duration.clone());
        register(registry, m.unscored.clone());
        m
    }
}

/// How routed requests ended and what the picker answered itself: records, access-log entries, open
/// streams, pending routes, immediate responses, shed requests.
#[derive(Debug)]
struct Completions {
    records: IntCounterVec,
    access_log_entries: IntCounterVec,
    inflight_streams: IntGauge,
    pending_routes: IntGauge,
    immediate_responses: IntCounterVec,
    shed: IntCounter,
}

impl Completions {
    fn register(registry: &Registry) -> Completions {
        let m = Completions {
            records: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_records_total",
                    listing(
                        "Request completions, by outcome",
                        &[("outcome", &RouteOutcome::ALL.map(RouteOutcome::as_str))],
                    ),
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            access_log_entries: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_access_log_entries_total",
                    listing(
                        "Envoy access-log entries received, by result (claimed: ended a routed request)",
                        &[("result", &Claim::ALL.map(Claim::as_str))],
                    ),
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
            immediate_responses: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_immediate_responses_total",
                    "Requests answered by the picker itself, by HTTP status",
                ),
                &["status"],
            )
            .expect("valid metric"),
            shed: IntCounter::new(
                "prefix_picker_shed_requests_total",
                "Requests refused with 429 by load shedding: every candidate pod was over a \
                 picker.loadShedding limit",
            )
            .expect("valid metric"),
        };
        for outcome in RouteOutcome::ALL {
            m.records.with_label_values(&[outcome.as_str()]);
        }
        for result in Claim::ALL {
            m.access_log_entries.with_label_values(&[result.as_str()]);
        }
        register(registry, m.records.clone());
        register(registry, m.access_log_entries.clone());
        register(registry, m.inflight_streams.clone());
        register(registry, m.pending_routes.clone());
        register(registry, m.immediate_responses.clone());
        register(registry, m.shed.clone());
        m
    }
}

/// Per pod: requests in flight, picks, and engine scrapes.
#[derive(Debug)]
struct Pods {
    pod_inflight: IntGaugeVec,
    pod_picks: IntCounterVec,
    engine_scrapes: IntCounterVec,
    engine_scrape_timestamp: GaugeVec,
}

impl Pods {
    fn register(registry: &Registry) -> Pods {
        let m = Pods {
            pod_inflight: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_inflight_requests",
                    "Requests picked for a pod (primary) and not yet completed",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
            pod_picks: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_pod_picks_total",
                    "Requests whose primary pick was this pod",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
            engine_scrapes: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_engine_scrapes_total",
                    listing(
                        "Engine /metrics scrapes, by pod and result",
                        &[("result", &ScrapeResult::ALL.map(ScrapeResult::as_str))],
                    ),
                ),
                &[POD_LABELS[0], POD_LABELS[1], "result"],
            )
            .expect("valid metric"),
            engine_scrape_timestamp: GaugeVec::new(
                Opts::new(
                    "prefix_picker_engine_scrape_timestamp_seconds",
                    "Unix time of the last successful engine scrape (staleness = time() - value)",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
        };
        register(registry, m.pod_inflight.clone());
        register(registry, m.pod_picks.clone());
        register(registry, m.engine_scrapes.clone());
        register(registry, m.engine_scrape_timestamp.clone());
        m
    }
}

/// The affinity mode's index: decision-time records, cached tokens predicted and reported, entries
/// dropped, each pod's budget and churn.
#[derive(Debug)]
struct Affinity {
    tentative: IntCounterVec,
    tentative_holds: IntGauge,
    cached_tokens: IntCounterVec,
    estimate_dropped: IntCounter,
    pod_budget: IntGaugeVec,
    pod_churn: GaugeVec,
}

impl Affinity {
    fn register(registry: &Registry) -> Affinity {
        let m = Affinity {
            tentative: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_tentative_records_total",
                    listing(
                        "Affinity mode: decision-time records ended, by outcome (confirmed for \
                         the picked pod, moved to the pod that served)",
                        &[(
                            "outcome",
                            &TentativeOutcome::ALL.map(TentativeOutcome::as_str),
                        )],
                    ),
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
                    listing(
                        "Affinity mode: prompt tokens the picker predicted the serving engine \
                         held and the engine reported as cached, over completions whose \
                         response carried usage.prompt_tokens_details",
                        &[("source", &CACHED_TOKEN_SOURCES)],
                    ),
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
                &POD_LABELS,
            )
            .expect("valid metric"),
            pod_churn: GaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_index_churn_ratio",
                    "Affinity mode with placeByChurn: entries a pod's index evicted over about \
                     the last 16 records per pod, as a fraction of its budget (new prefixes go \
                     where it is lowest); sampled every second",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
        };
        for source in CachedTokens::ALL {
            m.cached_tokens.with_label_values(&[source.as_str()]);
        }
        for outcome in TentativeOutcome::ALL {
            m.tentative.with_label_values(&[outcome.as_str()]);
        }
        register(registry, m.tentative.clone());
        register(registry, m.tentative_holds.clone());
        register(registry, m.cached_tokens.clone());
        register(registry, m.estimate_dropped.clone());
        register(registry, m.pod_budget.clone());
        register(registry, m.pod_churn.clone());
        m
    }
}

/// The affinity mode's latency model: its ratio and TTFT error, each pod's concurrency and service
/// time, the prefill cost per token.
#[derive(Debug)]
struct LatencyModel {
    latency_model_ratio: Histogram,
    ttft_prediction_error: Histogram,
    pod_concurrency: GaugeVec,
    pod_service: GaugeVec,
    prefill_per_token: Gauge,
}

impl LatencyModel {
    fn register(registry: &Registry) -> LatencyModel {
        let m = LatencyModel {
            latency_model_ratio: Histogram::with_opts(
                HistogramOpts::new(
                    "prefix_picker_latency_model_ratio",
                    "Affinity mode: a completion's time from the pick to its end over the \
                     latency model's prediction for it (1 = exact), once the model is fitted",
                )
                .buckets(vec![0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0, 4.0]),
            )
            .expect("valid metric"),
            ttft_prediction_error: Histogram::with_opts(
                HistogramOpts::new(
                    "prefix_picker_ttft_prediction_error_seconds",
                    "Affinity mode's latency model: observed time to the response's first body \
                     bytes minus the predicted TTFT (wait + prefill) of the picked pod, for \
                     completions whose response an ext_proc stream saw (observer and GIE shapes); \
                     centred on the engine's fixed overhead, which the prediction leaves out",
                )
                .buckets(vec![
                    -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                ]),
            )
            .expect("valid metric"),
            pod_concurrency: GaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_concurrency",
                    "Affinity mode's latency model: requests a pod's engine runs at once, learned \
                     from scrapes that show a queue (absent until one did); sampled every second",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
            pod_service: GaugeVec::new(
                Opts::new(
                    "prefix_picker_pod_service_seconds",
                    "Affinity mode's latency model: mean seconds from the pick to the completion \
                     of a pod's requests picked with a free slot (absent until timed); sampled \
                     every second",
                ),
                &POD_LABELS,
            )
            .expect("valid metric"),
            prefill_per_token: Gauge::new(
                "prefix_picker_prefill_seconds_per_token",
                "Affinity mode's latency model: seconds one uncached prompt token adds, fitted \
                 over every pod's completions (the prior until fitted); sampled every second",
            )
            .expect("valid metric"),
        };
        register(registry, m.latency_model_ratio.clone());
        register(registry, m.ttft_prediction_error.clone());
        register(registry, m.pod_concurrency.clone());
        register(registry, m.pod_service.clone());
        register(registry, m.prefill_per_token.clone());
        m
    }
}

/// Session affinity: sessions remembered, requests by where they went, sessions forgotten.
#[derive(Debug)]
struct Sessions {
    sessions: IntGauge,
    session_requests: IntCounterVec,
    sessions_dropped: IntCounterVec,
}

impl Sessions {
    fn register(registry: &Registry) -> Sessions {
        let m = Sessions {
            sessions: IntGauge::new(
                "prefix_picker_sessions",
                "Session affinity: sessions this replica remembers",
            )
            .expect("valid metric"),
            session_requests: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_session_requests_total",
                    listing(
                        "Session affinity: routed requests that carried the session header, by \
                         where they went (kept on the session's pod; moved because it was \
                         saturated, filtered out or gone; new session)",
                        &[("outcome", &SessionOutcome::ALL.map(SessionOutcome::as_str))],
                    ),
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            sessions_dropped: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_sessions_dropped_total",
                    listing(
                        "Session affinity: sessions forgotten, by reason",
                        &[("reason", &SessionDrop::ALL.map(SessionDrop::as_str))],
                    ),
                ),
                &["reason"],
            )
            .expect("valid metric"),
        };
        for outcome in SessionOutcome::ALL {
            m.session_requests.with_label_values(&[outcome.as_str()]);
        }
        for reason in SessionDrop::ALL {
            m.sessions_dropped.with_label_values(&[reason.as_str()]);
        }
        register(registry, m.sessions.clone());
        register(registry, m.session_requests.clone());
        register(registry, m.sessions_dropped.clone());
        m
    }
}

/// Config reloads and the live config's hash.
#[derive(Debug)]
struct Config {
    config_reloads: IntCounterVec,
    config_info: IntGaugeVec,
}

impl Config {
    fn register(registry: &Registry) -> Config {
        let m = Config {
            config_reloads: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_config_reloads_total",
                    listing(
                        "Config reloads (SIGHUP or a changed config file), by result",
                        &[("result", &ReloadResult::ALL.map(ReloadResult::as_str))],
                    ),
                ),
                &["result"],
            )
            .expect("valid metric"),
            config_info: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_config_info",
                    "Always 1; the sha256 label is the SHA-256 of the live config text (as \
                     sha256sum prints it)",
                ),
                &["sha256"],
            )
            .expect("valid metric"),
        };
        for result in ReloadResult::ALL {
            m.config_reloads.with_label_values(&[result.as_str()]);
        }
        register(registry, m.config_reloads.clone());
        register(registry, m.config_info.clone());
        m
    }
}

/// The build's identity (`prefix_picker_build_info`) and the process's own families.
fn register_build_and_process(registry: &Registry) {
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
    // The process's CPU, memory, file descriptors and start time (Linux only).
    #[cfg(target_os = "linux")]
    register(
        registry,
        prometheus::process_collector::ProcessCollector::for_self(),
    );
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
mod tests;
