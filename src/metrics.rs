//! Every metric prefix-picker exports, declared together as data ([`family::Family`]: name,
//! help, labels, kind) and registered explicitly from those declarations.
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
    Encoder, Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Registry, TextEncoder,
};

use crate::pod_id::PodId;
use crate::prefix_index::{ModelKey, RecordOutcome};
use crate::scheduler::{DecisionReason, Unscored};
use family::Label::{Enum, Free};
use family::{Family, Label};
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
pub mod family;
pub mod kvcache;
pub mod model_labels;
pub mod outcomes;

const LATENCY_BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.5,
];

/// The prefix-cache plugin's families (Kthena's names and help).
const MATCH_RATIO: Family = Family::histogram(
    "kthena_router_prefix_cache_match_ratio",
    "Fraction of the prompt's blocks matched by the best pod, per scoring (0 is a miss)",
    &[Free("model")],
    &MATCH_RATIO_BUCKETS,
);
const EVICTIONS: Family = Family::counter(
    "kthena_router_prefix_cache_evictions_total",
    "Entries dropped because a pod's list was full, by the evicted entry's model",
    &[Free("model")],
);
const ENTRIES: Family = Family::gauge(
    "kthena_router_prefix_cache_entries",
    "Entries currently stored across all pods (a block held by 3 pods counts 3)",
    &[],
);

/// The prefix-cache plugin's metrics (Kthena names).
#[derive(Debug, Clone)]
pub struct PrefixCacheMetrics {
    pub match_ratio: HistogramVec,
    pub evictions: IntCounterVec,
    pub entries: IntGauge,
    /// The `model` label's bound, for `evictions` and the names remembered for it.
    pub models: model_labels::ModelLabels,
    model_names: Arc<RwLock<HashMap<ModelKey, String>>>,
}

impl PrefixCacheMetrics {
    pub fn register(registry: &Registry) -> PrefixCacheMetrics {
        PrefixCacheMetrics {
            match_ratio: MATCH_RATIO.register(registry),
            evictions: EVICTIONS.register(registry),
            entries: ENTRIES.register(registry),
            models: model_labels::ModelLabels::default(),
            model_names: Arc::default(),
        }
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
                self.evictions
                    .with_label_values(&[self.models.label(model)])
                    .inc_by(count);
            } else {
                let name = self.model_name(evicted);
                self.evictions
                    .with_label_values(&[self.models.label(&name)])
                    .inc_by(count);
            }
        }
        self.remember_model(model);
    }

    /// Remembers a model's name so evictions of its entries can be labelled (a model past
    /// the label's bound is not remembered: its evictions count under the bound's label).
    pub fn remember_model(&self, model: &str) {
        let key = ModelKey::of(model);
        if !self.model_names.read().contains_key(&key) && self.models.is_named(model) {
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
    /// 1 / 0: the pod's engine reports prefix caching on / off.
    pub engine_prefix_caching: IntGaugeVec,
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
    pub pod_kv_capacity: GaugeVec,
    pub prefill_per_token: Gauge,
    pub sessions: IntGauge,
    pub session_requests: IntCounterVec,
    pub sessions_dropped: IntCounterVec,
    pub config_reloads: IntCounterVec,
    pub config_info: IntGaugeVec,
    /// The `model` label's bound for the decision's families and kvcache-aware's.
    pub models: model_labels::ModelLabels,
    /// KV-cache events, engine views, match sources, engine tokens.
    pub engine: engine_truth::EngineTruthMetrics,
    /// kvcache-aware's lookups, Redis connection and GC.
    pub kvcache: kvcache::KvCacheMetrics,
    /// Flow control's queue.
    pub flow: FlowMetrics,
}

/// Flow control's metrics (`picker.flowControl`).
#[derive(Debug, Clone)]
pub struct FlowMetrics {
    pub queued: IntGaugeVec,
    pub queued_bytes: IntGauge,
    pub wait: Histogram,
    pub dispatches: IntCounterVec,
    pub drops: IntCounterVec,
    pub served_tokens: IntCounterVec,
    /// The `flow` label's bound (the first flows by name, the rest `__other__`).
    pub flows: model_labels::ModelLabels,
}

const FLOW_QUEUED: Family = Family::gauge(
    "prefix_picker_flow_queue_requests",
    "Flow control: requests held in the picker's queue, by priority band (bands \
     that queued once stay, at 0)",
    &[Free("priority")],
);
const FLOW_QUEUED_BYTES: Family = Family::gauge(
    "prefix_picker_flow_queue_bytes",
    "Flow control: the body bytes of the requests held in the queue",
    &[],
);
const FLOW_WAIT: Family = Family::histogram(
    "prefix_picker_flow_queued_seconds",
    "Flow control: time a dispatched request spent in the queue",
    &[],
    &[
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ],
);
const FLOW_DISPATCHES: Family = Family::counter(
    "prefix_picker_flow_dispatches_total",
    "Flow control: queued requests sent to a pod, by reason",
    &[Enum("reason", || {
        outcomes::DispatchReason::ALL
            .map(outcomes::DispatchReason::as_str)
            .to_vec()
    })],
);
const FLOW_DROPS: Family = Family::counter(
    "prefix_picker_flow_drops_total",
    "Flow control: requests refused by the queue or that left it unserved, by \
     reason (cancelled: the client went away; the others were answered 429)",
    &[Enum("reason", || {
        outcomes::DropReason::ALL
            .map(outcomes::DropReason::as_str)
            .to_vec()
    })],
);
const FLOW_SERVED_TOKENS: Family = Family::counter(
    "prefix_picker_flow_served_tokens_total",
    "Flow control: weighted tokens (prompt + outputWeight x expected output) \
     charged to each flow by requests dispatched from the queue, the service its \
     fairness compares (the first 256 flows by name, then __other__)",
    &[Free("flow")],
);

impl FlowMetrics {
    fn register(registry: &Registry) -> FlowMetrics {
        let m = FlowMetrics {
            queued: FLOW_QUEUED.register(registry),
            queued_bytes: FLOW_QUEUED_BYTES.register(registry),
            wait: FLOW_WAIT.register(registry),
            dispatches: FLOW_DISPATCHES.register(registry),
            drops: FLOW_DROPS.register(registry),
            served_tokens: FLOW_SERVED_TOKENS.register(registry),
            flows: model_labels::ModelLabels::default(),
        };
        // The default band and flow exist at 0 from the start (a dashboard reads them before
        // anything queued).
        m.queued.with_label_values(&["0"]);
        m.served_tokens.with_label_values(&[outcomes::DEFAULT_FLOW]);
        m
    }
}

// The families of [`RouterMetrics`], a group at a time.

// How requests were decided: the pick's reason, its duration, the plugins' times, why a request
// went unscored.
const PLUGIN_DURATION: Family = Family::histogram(
    "kthena_router_scheduler_plugin_duration_seconds",
    "Time spent in one scheduler plugin for one request",
    &[Free("model"), Free("plugin"), Free("type")],
    &LATENCY_BUCKETS,
);
const DECISIONS: Family = Family::counter(
    "prefix_picker_decisions_total",
    "Routing decisions, by reason (affinity_* in the affinity mode only, \
     session with session affinity only)",
    &[Enum("reason", || {
        DecisionReason::ALL.map(DecisionReason::as_str).to_vec()
    })],
);
const DECISION_DURATION: Family = Family::histogram(
    "prefix_picker_decision_duration_seconds",
    "Time from a complete request body to the pick (parse, render, hash, schedule)",
    &[],
    &LATENCY_BUCKETS,
);
const UNSCORED: Family = Family::counter(
    "prefix_picker_unscored_requests_total",
    "Requests routed without prefix scoring, by reason",
    &[Enum("reason", || {
        Unscored::ALL.map(Unscored::as_str).to_vec()
    })],
);

// How routed requests ended and what the picker answered itself: records, access-log entries,
// open streams, pending routes, immediate responses, shed requests.
const RECORDS: Family = Family::counter(
    "prefix_picker_records_total",
    "Request completions, by outcome",
    &[Enum("outcome", || {
        RouteOutcome::ALL.map(RouteOutcome::as_str).to_vec()
    })],
);
const ACCESS_LOG_ENTRIES: Family = Family::counter(
    "prefix_picker_access_log_entries_total",
    "Envoy access-log entries received, by result (claimed: ended a routed request)",
    &[Enum("result", || Claim::ALL.map(Claim::as_str).to_vec())],
);
const INFLIGHT_STREAMS: Family = Family::gauge(
    "prefix_picker_inflight_streams",
    "Open ext_proc streams",
    &[],
);
const PENDING_ROUTES: Family = Family::gauge(
    "prefix_picker_pending_routes",
    "Routed requests waiting for their completion from Envoy's access log or an \
     observer filter (sampled every second)",
    &[],
);
const IMMEDIATE_RESPONSES: Family = Family::counter(
    "prefix_picker_immediate_responses_total",
    "Requests answered by the picker itself, by HTTP status",
    &[Free("status")],
);
const SHED: Family = Family::counter(
    "prefix_picker_shed_requests_total",
    "Requests refused with 429 by load shedding: every candidate pod was over a \
     picker.loadShedding limit",
    &[],
);

// Per pod: requests in flight, picks, and engine scrapes.
const POD: [Label; 2] = [Free(POD_LABELS[0]), Free(POD_LABELS[1])];
const POD_INFLIGHT: Family = Family::gauge(
    "prefix_picker_pod_inflight_requests",
    "Requests picked for a pod (primary) and not yet completed",
    &POD,
);
const POD_PICKS: Family = Family::counter(
    "prefix_picker_pod_picks_total",
    "Requests whose primary pick was this pod",
    &POD,
);
const ENGINE_SCRAPES: Family = Family::counter(
    "prefix_picker_engine_scrapes_total",
    "Engine /metrics scrapes, by pod and result",
    &[
        POD[0],
        POD[1],
        Enum("result", || {
            ScrapeResult::ALL.map(ScrapeResult::as_str).to_vec()
        }),
    ],
);
const ENGINE_PREFIX_CACHING: Family = Family::gauge(
    "prefix_picker_pod_engine_prefix_caching",
    "1 when a pod's engine reports prefix caching on, 0 when off (vLLM's \
     vllm:cache_config_info{enable_prefix_caching}): the affinity mode matches \
     nothing on a pod at 0 and gives it new work only as overflow; absent when \
     the engine does not say",
    &POD,
);
const ENGINE_SCRAPE_TIMESTAMP: Family = Family::float_gauge(
    "prefix_picker_engine_scrape_timestamp_seconds",
    "Unix time of the last successful engine scrape (staleness = time() - value)",
    &POD,
);

// The affinity mode's index: decision-time records, cached tokens predicted and reported,
// entries dropped, each pod's budget and churn.
const TENTATIVE: Family = Family::counter(
    "prefix_picker_tentative_records_total",
    "Affinity mode: decision-time records ended, by outcome (confirmed for \
     the picked pod, moved to the pod that served)",
    &[Enum("outcome", || {
        TentativeOutcome::ALL.map(TentativeOutcome::as_str).to_vec()
    })],
);
const TENTATIVE_HOLDS: Family = Family::gauge(
    "prefix_picker_tentative_holds",
    "Affinity mode: requests in flight holding their prompt tentatively (sampled \
     every second)",
    &[],
);
const CACHED_TOKENS: Family = Family::counter(
    "prefix_picker_cached_tokens_total",
    "Affinity mode: prompt tokens the picker predicted the serving engine \
     held and the engine reported as cached, over completions whose \
     response carried usage.prompt_tokens_details",
    &[Enum("source", || {
        CachedTokens::ALL.map(CachedTokens::as_str).to_vec()
    })],
);
const ESTIMATE_DROPPED: Family = Family::counter(
    "prefix_picker_estimate_dropped_entries_total",
    "Affinity mode: index entries dropped because an engine reported far fewer \
     cached tokens than predicted (the missing block and everything older)",
    &[],
);
const POD_BUDGET: Family = Family::gauge(
    "prefix_picker_pod_index_budget_entries",
    "Affinity mode: a pod's prefix-index budget in entries, sized from its \
     engine's KV capacity",
    &POD,
);
const POD_CHURN: Family = Family::float_gauge(
    "prefix_picker_pod_index_churn_ratio",
    "Affinity mode with placeByChurn: entries a pod's index evicted over about \
     the last 16 records per pod, as a fraction of its budget (new prefixes go \
     where it is lowest); sampled every second",
    &POD,
);

// The affinity mode's latency model: its ratio and TTFT error, each pod's concurrency and
// service time, the prefill cost per token.
const LATENCY_MODEL_RATIO: Family = Family::histogram(
    "prefix_picker_latency_model_ratio",
    "Affinity mode: a completion's time from the pick to its end over the \
     latency model's prediction for it (1 = exact), once the model is fitted",
    &[],
    &[0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0, 4.0],
);
const TTFT_PREDICTION_ERROR: Family = Family::histogram(
    "prefix_picker_ttft_prediction_error_seconds",
    "Affinity mode's latency model: observed time to the response's first body \
     bytes minus the predicted TTFT (wait + prefill) of the picked pod, for \
     completions whose response an ext_proc stream saw (observer and GIE shapes); \
     centred on the engine's fixed overhead, which the prediction leaves out",
    &[],
    &[
        -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
    ],
);
const POD_CONCURRENCY: Family = Family::float_gauge(
    "prefix_picker_pod_concurrency",
    "Affinity mode's latency model: requests a pod's engine runs at once, learned \
     from scrapes that show a queue (absent until one did); sampled every second",
    &POD,
);
const POD_KV_CAPACITY: Family = Family::float_gauge(
    "prefix_picker_pod_kv_capacity_blocks",
    "Affinity mode's latency model: a pod's KV cache in prompt blocks, learned from \
     the blocks its requests in flight pin and the engine's KV usage at scrapes \
     without a queue; present once its engine showed a wait for KV space (a queue \
     while they filled it), the only engines the model predicts one for; sampled \
     every second",
    &POD,
);
const POD_SERVICE: Family = Family::float_gauge(
    "prefix_picker_pod_service_seconds",
    "Affinity mode's latency model: mean seconds from the pick to the completion \
     of a pod's requests picked with a free slot (absent until timed); sampled \
     every second",
    &POD,
);
const PREFILL_PER_TOKEN: Family = Family::float_gauge(
    "prefix_picker_prefill_seconds_per_token",
    "Affinity mode's latency model: seconds one uncached prompt token adds, fitted \
     over every pod's completions (the prior until fitted); sampled every second",
    &[],
);

// Session affinity: sessions remembered, requests by where they went, sessions forgotten.
const SESSIONS: Family = Family::gauge(
    "prefix_picker_sessions",
    "Session affinity: sessions this replica remembers",
    &[],
);
const SESSION_REQUESTS: Family = Family::counter(
    "prefix_picker_session_requests_total",
    "Session affinity: routed requests that carried the session header, by \
     where they went (kept on the session's pod; moved because it was \
     saturated, filtered out or gone; new session)",
    &[Enum("outcome", || {
        SessionOutcome::ALL.map(SessionOutcome::as_str).to_vec()
    })],
);
const SESSIONS_DROPPED: Family = Family::counter(
    "prefix_picker_sessions_dropped_total",
    "Session affinity: sessions forgotten, by reason",
    &[Enum("reason", || {
        SessionDrop::ALL.map(SessionDrop::as_str).to_vec()
    })],
);

// Config reloads and the live config's hash; the build's identity.
const CONFIG_RELOADS: Family = Family::counter(
    "prefix_picker_config_reloads_total",
    "Config reloads (SIGHUP or a changed config file), by result",
    &[Enum("result", || {
        ReloadResult::ALL.map(ReloadResult::as_str).to_vec()
    })],
);
const CONFIG_INFO: Family = Family::gauge(
    "prefix_picker_config_info",
    "Always 1; the sha256 label is the SHA-256 of the live config text (as \
     sha256sum prints it)",
    &[Free("sha256")],
);
const BUILD_INFO: Family = Family::gauge(
    "prefix_picker_build_info",
    "Always 1; the labels name the build (version, git revision)",
    &[Free("version"), Free("revision")],
);

impl RouterMetrics {
    /// Every family, registered into `registry` from its declaration above; every value of an
    /// enum-valued label exists at 0 from the start, so the exposition lists what the help
    /// string does. A table: one line per field.
    pub fn register(registry: &Registry) -> RouterMetrics {
        register_build_and_process(registry);
        let models = model_labels::ModelLabels::default();
        RouterMetrics {
            plugin_duration: PLUGIN_DURATION.register(registry),
            decisions: DECISIONS.register(registry),
            decision_duration: DECISION_DURATION.register(registry),
            unscored: UNSCORED.register(registry),
            records: RECORDS.register(registry),
            access_log_entries: ACCESS_LOG_ENTRIES.register(registry),
            inflight_streams: INFLIGHT_STREAMS.register(registry),
            pending_routes: PENDING_ROUTES.register(registry),
            immediate_responses: IMMEDIATE_RESPONSES.register(registry),
            shed: SHED.register(registry),
            pod_inflight: POD_INFLIGHT.register(registry),
            pod_picks: POD_PICKS.register(registry),
            engine_scrapes: ENGINE_SCRAPES.register(registry),
            engine_prefix_caching: ENGINE_PREFIX_CACHING.register(registry),
            engine_scrape_timestamp: ENGINE_SCRAPE_TIMESTAMP.register(registry),
            tentative: TENTATIVE.register(registry),
            tentative_holds: TENTATIVE_HOLDS.register(registry),
            cached_tokens: CACHED_TOKENS.register(registry),
            estimate_dropped: ESTIMATE_DROPPED.register(registry),
            pod_budget: POD_BUDGET.register(registry),
            pod_churn: POD_CHURN.register(registry),
            latency_model_ratio: LATENCY_MODEL_RATIO.register(registry),
            ttft_prediction_error: TTFT_PREDICTION_ERROR.register(registry),
            pod_concurrency: POD_CONCURRENCY.register(registry),
            pod_service: POD_SERVICE.register(registry),
            pod_kv_capacity: POD_KV_CAPACITY.register(registry),
            prefill_per_token: PREFILL_PER_TOKEN.register(registry),
            sessions: SESSIONS.register(registry),
            session_requests: SESSION_REQUESTS.register(registry),
            sessions_dropped: SESSIONS_DROPPED.register(registry),
            config_reloads: CONFIG_RELOADS.register(registry),
            config_info: CONFIG_INFO.register(registry),
            models: models.clone(),
            engine: engine_truth::EngineTruthMetrics::register(
                registry,
                &crate::scheduler::MatchSource::ALL.map(crate::scheduler::MatchSource::as_str),
                &crate::scheduler::HoldEnd::ALL.map(crate::scheduler::HoldEnd::as_str),
                &engine_truth::TokenizeErrorKind::ALL.map(engine_truth::TokenizeErrorKind::as_str),
            ),
            kvcache: kvcache::KvCacheMetrics::register(registry, models.clone()),
            flow: FlowMetrics::register(registry),
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
        let _ = self.engine_prefix_caching.remove_label_values(&labels);
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

/// The build's identity (`prefix_picker_build_info`) and the process's own families.
fn register_build_and_process(registry: &Registry) {
    let build: IntGaugeVec = BUILD_INFO.register(registry);
    build.with_label_values(&[VERSION, REVISION]).set(1);
    // The process's CPU, memory, file descriptors and start time (Linux only).
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
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
