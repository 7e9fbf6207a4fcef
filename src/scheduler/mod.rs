//! The scheduler: for one request, the pick (primary + fallbacks) among candidate pods, as a
//! [`Decision`] value.
//!
//! `pipeline.rs` names the steps in the order they run, each in its own file under
//! `pipeline/`: candidates -> filters -> match (the affinity mode) -> load -> gate -> place ->
//! tie -> fallbacks; in Kthena's mode, after the filters, score (each plugin's 0..=100 per pod,
//! times its weight, summed) -> rank (best `maxEndpoints` (<= 5) first, ties broken by an RNG
//! seeded from `picker.seed` and a decision counter). The decision carries every plugin's
//! scores, so it can be logged (`--v 4` prints Kthena's score lines, [`score_lines`]), explained
//! (`/debug/explain`) and tested, and what it observed (plugin times, match ratios) for the
//! caller to count: the core writes no metrics. A routed decision is then committed ([`commit`]:
//! the affinity pick's share, the tentative hold); an explained one changes nothing. Before any
//! of it, with load shedding on, [`Scheduler::shed`] says whether every candidate is saturated
//! (the request is then refused, [`saturation`]). Candidates are anything that implements
//! [`Candidate`]. One file per plugin. With a `pdGroup`, [`pd`] runs the decision once over the
//! decode pods and once over each kept decode pod's prefill pods (Kthena's PD scheduling).

pub mod affinity;
pub mod candidate;
pub mod commit;
pub mod config;
pub mod decision;
pub mod engine_match;
pub mod epp;
pub mod gpu_usage;
mod hold;
pub mod kv_room;
pub mod kvcache_aware;
pub mod latency;
pub mod least_latency;
pub mod least_request;
pub mod lora_affinity;
pub mod pd;
mod pipeline;
pub mod predictions;
pub mod prefix_cache;
pub mod random;
pub mod route_request;
pub mod saturation;
pub mod score_lines;
#[cfg(test)]
pub(crate) mod test_pod;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hashing::BlockHash;
use crate::prefix_index::{PodHandle, RecordOutcome, TentativeEntries};
use affinity::AffinityConfig;
pub use candidate::{Candidate, EngineStats, LoraAdapters, LoraState};
use config::{SchedulerConfig, ScorerKind};
pub use decision::{
    Decision, DecisionReason, Filtered, Fractional, MatchSource, Observation, PickError,
    PickSummary, PluginScores, PluginType, Unscored,
};
pub use hold::{HoldEnd, TentativeHold};
pub use pd::{PdGroup, PdPairing, PdRole, PrefillPass, Unpaired};
use prefix_cache::PrefixCache;
pub use route_request::{EngineTokens, RouteRequest};

/// The scheduler. Shared by all streams (`Arc`); holds the prefix index.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    prefix: PrefixCache,
    prefix_enabled: bool,
    max_endpoints: usize,
    seed: u64,
    /// The sequences, shared with the schedulers a reload makes from this one.
    counters: Arc<Counters>,
    /// The affinity mode's tentative entries (empty unless `tentative` is on).
    tentative: Arc<TentativeEntries>,
}

/// A scheduler's sequences, kept across a config reload.
#[derive(Debug, Default)]
struct Counters {
    /// Decisions made (seeds each decision's RNG).
    decisions: AtomicU64,
    /// Prefix scorings made (seeds the tie-break beyond `topKMatches`).
    scorings: AtomicU64,
    /// Affinity picks made (the clock of the pods' recent shares).
    picks: AtomicU64,
    /// The latency model's prefill rate, learned over every pod.
    prefill: latency::PrefillRate,
    /// no-hit-lru-scorer's pods that took cold requests.
    no_hit: epp::NoHitLru,
    /// session-affinity-scorer's `session_id` bindings.
    sessions: epp::SessionBindings,
}

/// The next number of a sequence; a dry run (explain) reads it without taking it.
fn next(counter: &AtomicU64, take: bool) -> u64 {
    if take {
        counter.fetch_add(1, Ordering::Relaxed)
    } else {
        counter.load(Ordering::Relaxed)
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, max_endpoints: usize, seed: u64) -> Scheduler {
        let prefix = PrefixCache::new(config.prefix_cache, seed).with_scheme(config.chain_scheme());
        Scheduler::assemble(
            config,
            prefix,
            max_endpoints,
            seed,
            Arc::default(),
            Arc::default(),
        )
    }

    /// A scheduler with new settings over this one's state (a config reload): the prefix index,
    /// the tentative entries and the sequences are shared, so pods keep what they hold. The
    /// index's per-pod capacity stays as it was built; when the block layout
    /// ([`SchedulerConfig::block_layout`]) changes the caller must clear the index.
    pub fn reconfigured(
        &self,
        config: SchedulerConfig,
        max_endpoints: usize,
        seed: u64,
    ) -> Scheduler {
        let prefix = self
            .prefix
            .sharing(config.prefix_cache, seed)
            .with_scheme(config.chain_scheme());
        Scheduler::assemble(
            config,
            prefix,
            max_endpoints,
            seed,
            self.counters.clone(),
            self.tentative.clone(),
        )
    }

    fn assemble(
        config: SchedulerConfig,
        prefix: PrefixCache,
        max_endpoints: usize,
        seed: u64,
        counters: Arc<Counters>,
        tentative: Arc<TentativeEntries>,
    ) -> Scheduler {
        let prefix_enabled = config.affinity.is_some()
            || config
                .scorers
                .iter()
                .any(|(k, _)| *k == ScorerKind::PrefixCache)
            || config.epp.as_ref().is_some_and(|p| {
                p.scores_prefix()
                    || p.prefill
                        .as_ref()
                        .is_some_and(|s| s.profile.scores_prefix())
            });
        Scheduler {
            prefix,
            prefix_enabled,
            config,
            max_endpoints: max_endpoints.clamp(1, 5),
            seed,
            counters,
            tentative,
        }
    }

    /// The affinity mode's settings, when it is on.
    pub fn affinity(&self) -> Option<&AffinityConfig> {
        self.config.affinity.as_ref()
    }

    /// Whether a request's match reads the engines' views (with engine tokens): the affinity
    /// mode, or an `EndpointPickerConfig` whose prefix match is a precise producer's.
    pub fn matches_engine_truth(&self) -> bool {
        self.config.affinity.is_some() || self.config.epp.as_ref().is_some_and(|p| p.precise)
    }

    /// The tentative entries (decision-time records of the affinity mode).
    pub fn tentative(&self) -> &Arc<TentativeEntries> {
        &self.tentative
    }

    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.prefix
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Whether prompts are hashed and recorded (prefix-cache scores, or the affinity mode).
    pub fn prefix_enabled(&self) -> bool {
        self.prefix_enabled
    }

    /// Load shedding: `Some` when it is on and every candidate is saturated (the request is
    /// to be refused before the filters run); changes nothing, so explain calls it too.
    pub fn shed<C: Candidate>(&self, candidates: &[C]) -> Option<saturation::Shed> {
        self.config.load_shedding.as_ref()?.shed(candidates)
    }

    /// Runs filters and score plugins and picks. The decision returns what it observed; a
    /// routed request then [`commit`](Scheduler::commit)s it.
    pub fn schedule<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: impl Into<Arc<[C]>>,
    ) -> Result<Decision<C>, Filtered> {
        self.decide(request, candidates.into(), true, self.max_endpoints)
    }

    /// The decision [`schedule`](Scheduler::schedule) would make now, changing no state (its
    /// seeds are the next decision's); for `/debug/explain`.
    pub fn explain<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: impl Into<Arc<[C]>>,
    ) -> Result<Decision<C>, Filtered> {
        self.decide(request, candidates.into(), false, self.max_endpoints)
    }

    /// Engine tokens in one prompt block.
    fn tokens_per_block(&self, config: &AffinityConfig) -> f64 {
        self.prefix.args().block_size_to_hash as f64 / f64::from(config.bytes_per_token.max(1))
    }

    /// The learned prefill rate (the latency model's, over every pod; completions teach it).
    pub fn prefill_rate(&self) -> &latency::PrefillRate {
        &self.counters.prefill
    }

    /// Records a served request's prompt for the pod that served it: the one record path, for
    /// this replica's completions and for the records other replicas share. Returns what the
    /// index changed (nothing when prefix-cache is off), for the caller to count.
    pub fn record(&self, model: &str, hashes: &[BlockHash], pod: &PodHandle) -> RecordOutcome {
        if !self.prefix_enabled {
            return RecordOutcome::default();
        }
        self.prefix.record(model, hashes, pod)
    }
}

#[cfg(test)]
mod tests;
