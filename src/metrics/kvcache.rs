//! The kvcache-aware families: Kthena's four (`kthena_router_kvcache_aware_*`, names, labels and
//! buckets of volcano-sh/kthena 3cc0572 `pkg/kthena-router/metrics/metrics.go`) and
//! prefix-picker's own: each lookup's result, the Redis connection and the hourly GC. Nothing
//! here knows Redis or the scheduler.

use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};

use super::MATCH_RATIO_BUCKETS;
use super::family::Family;
use super::family::Label::{Enum, Free};

/// Kthena's duration buckets for the tokenize and Redis histograms.
const DURATION_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Where a kvcache-aware match attempt failed (`stage` of Kthena's errors counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheStage {
    Tokenize,
    Redis,
}

impl KvCacheStage {
    pub const ALL: [KvCacheStage; 2] = [KvCacheStage::Tokenize, KvCacheStage::Redis];

    pub fn as_str(self) -> &'static str {
        match self {
            KvCacheStage::Tokenize => "tokenize",
            KvCacheStage::Redis => "redis",
        }
    }
}

/// How one request's lookup ended (`result` of `prefix_picker_kvcache_lookups_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// Owners read: the plugin scores.
    Ok,
    /// Nothing to look up: no prompt, an empty one, or no tokens.
    NoPrompt,
    /// No candidate pod to tokenize on.
    NoTokenizer,
    /// The tokenize call failed (error, timeout, garbage, too large).
    TokenizeError,
    /// Redis is not connected (the connection is being re-established).
    RedisUnavailable,
    /// The pipelined read failed (an error reply, a dropped connection, a wrong type).
    RedisError,
    /// The request's lookup deadline passed first.
    Deadline,
}

impl LookupResult {
    pub const ALL: [LookupResult; 7] = [
        LookupResult::Ok,
        LookupResult::NoPrompt,
        LookupResult::NoTokenizer,
        LookupResult::TokenizeError,
        LookupResult::RedisUnavailable,
        LookupResult::RedisError,
        LookupResult::Deadline,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LookupResult::Ok => "ok",
            LookupResult::NoPrompt => "no_prompt",
            LookupResult::NoTokenizer => "no_tokenizer",
            LookupResult::TokenizeError => "tokenize_error",
            LookupResult::RedisUnavailable => "redis_unavailable",
            LookupResult::RedisError => "redis_error",
            LookupResult::Deadline => "deadline",
        }
    }

    /// The Kthena error stage this result counts under, if it is an error.
    pub fn stage(self) -> Option<KvCacheStage> {
        match self {
            LookupResult::Ok | LookupResult::NoPrompt => None,
            LookupResult::NoTokenizer | LookupResult::TokenizeError => Some(KvCacheStage::Tokenize),
            LookupResult::RedisUnavailable | LookupResult::RedisError | LookupResult::Deadline => {
                Some(KvCacheStage::Redis)
            }
        }
    }
}

// Kthena's four (help and labels as Kthena wrote them), then prefix-picker's own.
const MATCH_RATIO: Family = Family::histogram(
    "kthena_router_kvcache_aware_match_ratio",
    "Fraction of the prompt's blocks whose KV cache the best-matching candidate pod \
     already held, per kvcache-aware match attempt (0 = miss)",
    &[Free("model")],
    &MATCH_RATIO_BUCKETS,
);
const REDIS_DURATION: Family = Family::histogram(
    "kthena_router_kvcache_aware_redis_duration_seconds",
    "Time spent in the batched Redis lookup during a kvcache-aware match attempt",
    &[Free("model")],
    &DURATION_BUCKETS,
);
const TOKENIZE_DURATION: Family = Family::histogram(
    "kthena_router_kvcache_aware_tokenize_duration_seconds",
    "Time spent tokenizing the prompt during a kvcache-aware match attempt",
    &[Free("model")],
    &DURATION_BUCKETS,
);
/// Its `stage` series start per model ([`KvCacheMetrics::touch_model`]).
const ERRORS: Family = Family::counter(
    "kthena_router_kvcache_aware_errors_total",
    "Number of kvcache-aware match attempts aborted by an error, labelled by \
     failing stage (tokenize or redis)",
    &[Free("model"), Free("stage")],
);
const LOOKUPS: Family = Family::counter(
    "prefix_picker_kvcache_lookups_total",
    "kvcache-aware lookups before routing (tokenize + Redis), by result; \
     every result but ok routes the request without the plugin's score",
    &[Enum("result", || {
        LookupResult::ALL.map(LookupResult::as_str).to_vec()
    })],
);
const REDIS_CONNECTED: Family = Family::gauge(
    "prefix_picker_kvcache_redis_connected",
    "1 while the kvcache-aware Redis connection is up (0 also when kvcache-aware is off)",
    &[],
);
const GC_REMOVED: Family = Family::counter(
    "prefix_picker_kvcache_gc_removed_total",
    "Owner fields older than 24 h removed by kvcache-aware's hourly GC",
    &[],
);

#[derive(Debug, Clone)]
pub struct KvCacheMetrics {
    pub match_ratio: HistogramVec,
    pub redis_duration: HistogramVec,
    pub tokenize_duration: HistogramVec,
    pub errors: IntCounterVec,
    pub lookups: IntCounterVec,
    pub redis_connected: IntGauge,
    pub gc_removed: IntCounter,
    /// The `model` label's bound.
    pub models: super::model_labels::ModelLabels,
}

impl KvCacheMetrics {
    /// Registers the families; `models` bounds their `model` label (shared with the
    /// decision's families).
    pub fn register(
        registry: &Registry,
        models: super::model_labels::ModelLabels,
    ) -> KvCacheMetrics {
        KvCacheMetrics {
            match_ratio: MATCH_RATIO.register(registry),
            redis_duration: REDIS_DURATION.register(registry),
            tokenize_duration: TOKENIZE_DURATION.register(registry),
            errors: ERRORS.register(registry),
            lookups: LOOKUPS.register(registry),
            redis_connected: REDIS_CONNECTED.register(registry),
            gc_removed: GC_REMOVED.register(registry),
            models,
        }
    }

    /// Starts a model's error series at 0 (both stages), once it is first looked up.
    pub fn touch_model(&self, model: &str) {
        let model = self.models.label(model);
        for s in KvCacheStage::ALL {
            self.errors.with_label_values(&[model, s.as_str()]);
        }
    }

    /// Counts one lookup's result (and Kthena's error by stage).
    pub fn count(&self, model: &str, result: LookupResult) {
        self.lookups.with_label_values(&[result.as_str()]).inc();
        if let Some(stage) = result.stage() {
            self.errors
                .with_label_values(&[self.models.label(model), stage.as_str()])
                .inc();
        }
    }
}
