//! The scheduler: filters in order, weighted score plugins, then the pick (primary + fallbacks).
//!
//! For one request: candidates (pods serving the model, optionally narrowed by a subset hint)
//! -> each filter in order (a filter that leaves no pod is an error) -> each score plugin returns
//! 0..=100 per pod, or nothing (prefix-cache with no prompt) -> total = sum(score * weight) ->
//! the best `maxEndpoints` (<= 5) pods, ties broken by an RNG seeded from `picker.seed` and a
//! decision counter, become the primary pick and its ordered fallbacks. The result is a
//! [`Decision`] value carrying every plugin's scores, so it can be logged (`--v 4` prints Kthena's
//! score lines), explained (`/debug/explain`) and tested, and what it observed (plugin times,
//! match ratios) for the caller to count: the core writes no metrics. A routed decision is then
//! committed (the affinity pick's share, the tentative hold); an explained one changes nothing.
//! Before any of it, with load shedding on, [`Scheduler::shed`] says whether every candidate is
//! saturated (the request is then refused, [`saturation`]). Candidates are anything that
//! implements [`Candidate`]. One file per plugin. With a `pdGroup`, [`pd`] runs this decision
//! once over the decode pods and once over each kept decode pod's prefill pods (Kthena's PD
//! scheduling).

pub mod affinity;
pub mod candidate;
pub mod config;
pub mod engine_match;
pub mod gpu_usage;
mod hold;
pub mod kvcache_aware;
pub mod latency;
pub mod least_latency;
pub mod least_request;
pub mod pd;
pub mod prefix_cache;
pub mod random;
pub mod saturation;
#[cfg(test)]
pub(crate) mod test_pod;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use thiserror::Error;

use crate::engine_view::EngineView;
use crate::hashing::{BlockHash, CacheSalt};
use crate::prefix_index::{ModelKey, PodHandle, PodSlot, RecordOutcome, TentativeEntries};
use crate::prompt::NoPrompt;
use affinity::{AffinityConfig, AffinityReason, PodLoad};
pub use candidate::{Candidate, EngineStats};
use config::{FilterKind, SchedulerConfig, ScorerKind};
pub use hold::{HoldEnd, TentativeHold};
pub use pd::{PdGroup, PdPairing, PdRole, PrefillPass, Unpaired};
use prefix_cache::PrefixCache;

/// Why a request could not be routed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PickError {
    #[error("no model server endpoints are available")]
    NoEndpoints,
    #[error("model {0:?} is not served by any endpoint")]
    UnknownModel(String),
    #[error("no endpoint of the subset hint is available")]
    SubsetUnavailable,
    #[error("all endpoints were filtered out by the {0} filter")]
    Filtered(&'static str),
    /// PD mode: no pod carries the decode labels (Kthena's text).
    #[error("no decode pod found")]
    NoDecodePod,
    /// PD mode: no kept decode pod has a prefill pod of its group (Kthena's text).
    #[error("no valid prefill-decode pod pairs found")]
    NoPdPair,
}

/// The filters left no pod: the filter that removed the last ones, and what was observed
/// until then (the filters' times, for the caller to count).
#[derive(Debug, Clone, PartialEq)]
pub struct Filtered {
    pub filter: &'static str,
    pub observations: Vec<Observation>,
}

impl From<Filtered> for PickError {
    fn from(f: Filtered) -> Self {
        PickError::Filtered(f.filter)
    }
}

/// Why the pick is what it is (the `reason` label of `prefix_picker_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionReason {
    /// The primary pod holds a prefix of the prompt.
    PrefixHit,
    /// Some pod holds a prefix, but load-aware scores picked another.
    PrefixOverruled,
    /// No candidate holds any block of the prompt.
    PrefixMiss,
    /// Prefix-cache did not score (disabled, no prompt, or empty prompt).
    Unscored,
    /// Affinity mode: the pod with the longest match, available.
    AffinityHit,
    /// Affinity mode: no pod holds any block; placed by the tie rule.
    AffinityMiss,
    /// Affinity mode: the pods with the longest match were saturated or over their share.
    AffinitySpill,
    /// Affinity mode: every pod was saturated or over its share.
    AffinitySaturated,
    /// Session affinity: the pod that served the session's last request, with headroom.
    Session,
}

impl DecisionReason {
    pub const ALL: [DecisionReason; 9] = [
        DecisionReason::PrefixHit,
        DecisionReason::PrefixOverruled,
        DecisionReason::PrefixMiss,
        DecisionReason::Unscored,
        DecisionReason::AffinityHit,
        DecisionReason::AffinityMiss,
        DecisionReason::AffinitySpill,
        DecisionReason::AffinitySaturated,
        DecisionReason::Session,
    ];

    /// A decision of the affinity mode's pick (not a session's).
    pub fn is_affinity(self) -> bool {
        matches!(
            self,
            DecisionReason::AffinityHit
                | DecisionReason::AffinityMiss
                | DecisionReason::AffinitySpill
                | DecisionReason::AffinitySaturated
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionReason::PrefixHit => "prefix_hit",
            DecisionReason::PrefixOverruled => "prefix_overruled",
            DecisionReason::PrefixMiss => "prefix_miss",
            DecisionReason::Unscored => "unscored",
            DecisionReason::AffinityHit => "affinity_hit",
            DecisionReason::AffinityMiss => "affinity_miss",
            DecisionReason::AffinitySpill => "affinity_spill",
            DecisionReason::AffinitySaturated => "affinity_saturated",
            DecisionReason::Session => "session",
        }
    }
}

impl From<AffinityReason> for DecisionReason {
    fn from(r: AffinityReason) -> Self {
        match r {
            AffinityReason::Hit => DecisionReason::AffinityHit,
            AffinityReason::Miss => DecisionReason::AffinityMiss,
            AffinityReason::Spill => DecisionReason::AffinitySpill,
            AffinityReason::Saturated => DecisionReason::AffinitySaturated,
            AffinityReason::Session => DecisionReason::Session,
        }
    }
}

/// Why prefix-cache did not score a request (the `reason` label of
/// `prefix_picker_unscored_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unscored {
    /// The body has no prompt to render.
    NoPrompt(NoPrompt),
    /// The path is not an inference API (routed by load, to any pod).
    UnknownApi,
    /// The request reached the picker without a path (Envoy skipped its headers).
    NoRequestPath,
    /// The prompt is empty: no block to hash.
    EmptyPrompt,
    /// prefix-cache is not enabled.
    PrefixCacheDisabled,
}

impl Unscored {
    pub const ALL: [Unscored; 8] = [
        Unscored::NoPrompt(NoPrompt::PromptNotString),
        Unscored::NoPrompt(NoPrompt::MessagesNotList),
        Unscored::NoPrompt(NoPrompt::InputNotStringOrList),
        Unscored::NoPrompt(NoPrompt::NoPromptField),
        Unscored::UnknownApi,
        Unscored::NoRequestPath,
        Unscored::EmptyPrompt,
        Unscored::PrefixCacheDisabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unscored::NoPrompt(reason) => reason.as_str(),
            Unscored::UnknownApi => "unknown_api",
            Unscored::NoRequestPath => "no_request_path",
            Unscored::EmptyPrompt => "empty_prompt",
            Unscored::PrefixCacheDisabled => "prefix_cache_disabled",
        }
    }
}

/// The two kinds of plugin (the `type` label of Kthena's plugin-duration histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginType {
    Filter,
    Score,
}

impl PluginType {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginType::Filter => "filter",
            PluginType::Score => "score",
        }
    }
}

/// One thing a decision observed, for the caller to count (the core writes no metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    /// Time spent in one plugin.
    PluginTime {
        plugin: &'static str,
        kind: PluginType,
        elapsed: Duration,
    },
    /// A prefix scoring's longest match over the prompt's blocks (0 is a miss).
    MatchRatio(f64),
    /// kvcache-aware's longest match over the prompt's blocks (Kthena's
    /// `kthena_router_kvcache_aware_match_ratio`).
    KvCacheMatchRatio(f64),
}

/// One score plugin's output for a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginScores {
    pub plugin: &'static str,
    pub weight: u32,
    /// Per candidate (in [`Decision::candidates`] order); `None` = the plugin returned nothing.
    pub scores: Option<Vec<u32>>,
}

/// A routing decision, with everything that produced it.
#[derive(Debug, Clone)]
pub struct Decision<C> {
    /// Pods that passed the filters, in scoring order.
    pub candidates: Vec<C>,
    pub plugins: Vec<PluginScores>,
    /// Weighted totals per candidate.
    pub totals: Vec<u64>,
    /// Primary pick first, then fallbacks.
    pub ranked: Vec<C>,
    pub reason: DecisionReason,
    /// The prompt's block hashes (empty when unscored); recorded for the serving pod.
    pub hashes: Vec<BlockHash>,
    pub prompt_bytes: usize,
    /// Why prefix-cache did not score, when it did not.
    pub unscored: Option<Unscored>,
    /// Affinity mode: blocks of the prompt the primary pick holds in the index (what its
    /// engine should report as cached).
    pub predicted_blocks: usize,
    /// Affinity mode: the latency model's prediction per candidate (empty otherwise).
    pub predictions: Vec<latency::Prediction>,
    /// Affinity mode: each candidate's match on its engine's view, where it had one (empty when
    /// none did; [`Decision::match_source`]).
    pub engine: Vec<Option<engine_match::EngineMatched>>,
    /// Plugin times and match ratios, in the order they happened.
    pub observations: Vec<Observation>,
    /// Time the decision took.
    pub duration: Duration,
    /// PD mode: the prefill pod paired with the primary decode pod, and every prefill pass
    /// (the fields above are the decode pass's).
    pub pd: Option<PdPairing<C>>,
    /// kvcache-aware, when it scored: blocks each candidate holds from the first (in
    /// `candidates` order) and the prompt's blocks.
    pub kv_matched: Option<(Vec<usize>, usize)>,
}

impl<C> Decision<C> {
    pub fn primary(&self) -> &C {
        &self.ranked[0]
    }
}

impl<C: Candidate> Decision<C> {
    /// Where candidate `i`'s match came from: its engine's events or the estimate.
    pub fn match_source(&self, i: usize) -> MatchSource {
        engine_match::source(&self.engine, i)
    }

    /// [`Decision::match_source`] of the primary pick.
    pub fn primary_source(&self) -> MatchSource {
        let slot = self.primary().slot();
        let at = self.candidates.iter().position(|c| c.slot() == slot);
        at.map_or(MatchSource::Estimate, |i| self.match_source(i))
    }

    /// The token-chain hash of the request's head's last full block at the primary pick's
    /// engine block size, when the primary was matched by its live engine view (what a hold
    /// for it awaits).
    pub fn primary_last_block(&self) -> Option<u64> {
        let slot = self.primary().slot();
        let at = self.candidates.iter().position(|c| c.slot() == slot)?;
        self.engine.get(at).copied().flatten()?.last_block
    }

    /// The latency model's prediction for the primary pick (affinity mode only).
    pub fn primary_prediction(&self) -> Option<latency::Prediction> {
        let slot = self.primary().slot();
        let at = self.candidates.iter().position(|c| c.slot() == slot)?;
        self.predictions.get(at).copied()
    }

    /// Kthena's `--v=4` score lines, verbatim, at debug level on the `scores` target; in PD
    /// mode with Kthena's phase lines before the decode pass and each prefill pass.
    pub fn log_scores(&self) {
        if !tracing::enabled!(target: "scores", tracing::Level::DEBUG) {
            return;
        }
        let Some(pd) = &self.pd else {
            self.log_pass();
            return;
        };
        tracing::debug!(target: "scores", "Using optimized PD disaggregated scheduling");
        tracing::debug!(target: "scores", "Running score plugins for decode pod");
        self.log_pass();
        for pass in &pd.passes {
            match pass {
                PrefillPass::Scored { decision, .. } => {
                    tracing::debug!(target: "scores", "Running score plugins for prefill pod");
                    decision.log_pass();
                }
                PrefillPass::NoPrefillPods { decode } => tracing::debug!(
                    target: "scores",
                    decode_instance = decode.label(),
                    "prefill pods for decode group not found"
                ),
                PrefillPass::FilteredOut { decode, filter } => tracing::debug!(
                    target: "scores",
                    decode_instance = decode.label(),
                    filter,
                    "prefill pods were filtered out"
                ),
            }
        }
    }

    /// One pass's score lines.
    fn log_pass(&self) {
        for p in &self.plugins {
            let Some(scores) = &p.scores else { continue };
            tracing::debug!(target: "scores", "ScorePlugin: {}", p.plugin);
            for (e, s) in self.candidates.iter().zip(scores) {
                tracing::debug!(target: "scores", "Pod: {}, Score: {}", e.label(), s);
            }
        }
        if let Some((matched, total)) = &self.kv_matched {
            // Kthena's calculatePodScores line per pod holding the first block.
            for (e, &m) in self.candidates.iter().zip(matched) {
                if m == 0 {
                    continue;
                }
                let score = (m as f64 / *total as f64 * 100.0) as u32;
                tracing::debug!(
                    target: "scores",
                    "KVCacheAware.calculateScores: pod={} matched={}/{} blocks, score={}",
                    e.cache_owner().unwrap_or(e.label()),
                    m,
                    total,
                    score
                );
            }
        }
        tracing::debug!(target: "scores", "Final Pod Scores:");
        for (e, t) in self.candidates.iter().zip(&self.totals) {
            tracing::debug!(target: "scores", "  Pod: {}, Final Score: {}", e.label(), t);
        }
        if self.predictions.is_empty() {
            return;
        }
        tracing::debug!(target: "scores", "Predicted TTFT:");
        for (e, p) in self.candidates.iter().zip(&self.predictions) {
            tracing::debug!(
                target: "scores",
                "  Pod: {}, Predicted TTFT: {:.1} ms (wait {:.1} ms, prefill {:.1} ms of {:.0} tokens)",
                e.label(),
                p.ttft() * 1e3,
                p.wait * 1e3,
                p.prefill * 1e3,
                p.uncached_tokens
            );
        }
        if self.engine.is_empty() {
            return;
        }
        tracing::debug!(target: "scores", "Match sources:");
        for (i, e) in self.candidates.iter().enumerate() {
            match self.engine.get(i).copied().flatten() {
                Some(m) => tracing::debug!(
                    target: "scores",
                    "  Pod: {}, Source: engine, Matched: {} tokens",
                    e.label(),
                    m.tokens
                ),
                None => tracing::debug!(target: "scores", "  Pod: {}, Source: estimate", e.label()),
            }
        }
    }
}

/// What the scheduler needs of a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// The rendered prompt, or why there is none.
    pub prompt: Result<&'a str, Unscored>,
    /// The request's `cache_salt`: it seeds the prompt's chain (the hashes are salted, the
    /// model's key in the index is not).
    pub salt: Option<&'a CacheSalt>,
    /// Session affinity: the pod that served the session's last request. It is the pick while
    /// it has headroom (it passed the filters, or, in the affinity mode, is not saturated).
    pub session_pod: Option<PodSlot>,
    /// The prompt's block hashes, when a pass before this one computed them (PD: the decode
    /// pass's, reused by each prefill pass); `None`: hashed here.
    pub hashes: Option<&'a [BlockHash]>,
    /// The prompt's head in the engines' own tokens, when known: the affinity mode matches pods
    /// with a live [`EngineView`](crate::engine_view::EngineView) by it.
    pub engine_tokens: Option<EngineTokens<'a>>,
    /// kvcache-aware: who holds the prompt's blocks, as the platform looked them up before the
    /// decision; `None`: not looked up (the plugin scores nothing).
    pub kv_blocks: Option<&'a kvcache_aware::KvBlockOwners>,
}

/// Engine token ids of the first `prompt_bytes` bytes of the rendered prompt (its head: the
/// messages before the last one, or all of it).
#[derive(Debug, Clone, Copy)]
pub struct EngineTokens<'a> {
    pub tokens: &'a [u32],
    pub prompt_bytes: usize,
}

/// Where a candidate's match came from (the `source` of explain, `--v 4` and the
/// `prefix_picker_match_source_total` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchSource {
    /// The engine's own KV-cache events, counted in its tokens.
    Engine,
    /// The prefix index's estimate (what the picker sent the pod).
    Estimate,
}

impl MatchSource {
    pub const ALL: [MatchSource; 2] = [MatchSource::Engine, MatchSource::Estimate];

    pub fn as_str(self) -> &'static str {
        match self {
            MatchSource::Engine => "engine",
            MatchSource::Estimate => "estimate",
        }
    }
}

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
                .any(|(k, _)| *k == ScorerKind::PrefixCache);
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
        candidates: Vec<C>,
    ) -> Result<Decision<C>, Filtered> {
        self.decide(request, candidates, true, self.max_endpoints)
    }

    /// The decision [`schedule`](Scheduler::schedule) would make now, changing no state (its
    /// seeds are the next decision's); for `/debug/explain`.
    pub fn explain<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: Vec<C>,
    ) -> Result<Decision<C>, Filtered> {
        self.decide(request, candidates, false, self.max_endpoints)
    }

    /// `take` = false: a dry run that leaves the decision and scoring counters as they are;
    /// `keep`: pods ranked (primary + fallbacks).
    fn decide<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        mut candidates: Vec<C>,
        take: bool,
        keep: usize,
    ) -> Result<Decision<C>, Filtered> {
        let started = Instant::now();
        let model = request.model;
        // One entry per plugin, plus prefix-cache's match ratio.
        let mut observations =
            Vec::with_capacity(self.config.filters.len() + self.config.scorers.len() + 1);
        // The latency model routes around queues itself: Kthena's least-request filter would
        // only refuse requests once every pod queues (load shedding is the opt-in for that).
        let filters = match &self.config.affinity {
            Some(a) if a.load_gate && a.latency_model && request.prompt.is_ok() => &[][..],
            _ => &self.config.filters[..],
        };
        for filter in filters {
            let t = Instant::now();
            match filter {
                FilterKind::LeastRequest => {
                    least_request::filter(&mut candidates, self.config.max_waiting_requests)
                }
            }
            observations.push(Observation::PluginTime {
                plugin: filter.as_str(),
                kind: PluginType::Filter,
                elapsed: t.elapsed(),
            });
            if candidates.is_empty() {
                return Err(Filtered {
                    filter: filter.as_str(),
                    observations,
                });
            }
        }

        let n = next(&self.counters.decisions, take);
        let mut rng = SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        let mut hashes = Vec::new();
        let mut unscored = None;
        // Affinity mode: the pick from every candidate's longest match (index and tentative).
        if let (Some(config), Ok(prompt)) = (&self.config.affinity, request.prompt) {
            hashes = self.hashes_of(&request, prompt);
            let slots: Vec<_> = candidates.iter().map(|e| e.slot()).collect();
            let t = Instant::now();
            let engine = engine_match::matches(
                &candidates,
                request.engine_tokens,
                prompt.len(),
                hashes.len(),
            );
            let scored =
                self.prefix
                    .score_chained(model, &hashes, &slots, &self.tentative, &engine);
            if let Some(scored) = scored {
                observations.push(Observation::PluginTime {
                    plugin: ScorerKind::PrefixCache.as_str(),
                    kind: PluginType::Score,
                    elapsed: t.elapsed(),
                });
                observations.push(Observation::MatchRatio(scored.match_ratio()));
                let session = session_position(&candidates, request.session_pod);
                let mut decision = self
                    .affinity_decision(config, candidates, scored, hashes, session, &mut rng, keep);
                decision.prompt_bytes = prompt.len();
                decision.engine = engine;
                decision.observations = observations;
                decision.duration = started.elapsed();
                return Ok(decision);
            }
        }
        let prompt_bytes = request.prompt.map_or(0, str::len);
        let mut plugins = Vec::with_capacity(self.config.scorers.len());
        let mut totals = vec![0u64; candidates.len()];
        let (mut kv_matched, mut kv_total) = (None, 0);
        for &(kind, weight) in &self.config.scorers {
            let t = Instant::now();
            let scores = match kind {
                ScorerKind::PrefixCache => match request.prompt {
                    Err(reason) => {
                        unscored = Some(reason);
                        None
                    }
                    Ok(prompt) => {
                        hashes = self.hashes_of(&request, prompt);
                        let scored = if hashes.is_empty() {
                            None
                        } else {
                            let slots: Vec<_> = candidates.iter().map(|e| e.slot()).collect();
                            let scoring = next(&self.counters.scorings, take);
                            self.prefix.score(model, &hashes, &slots, scoring)
                        };
                        match &scored {
                            None => unscored = Some(Unscored::EmptyPrompt),
                            Some(s) => observations.push(Observation::MatchRatio(s.match_ratio())),
                        }
                        scored.map(|s| s.scores)
                    }
                },
                ScorerKind::LeastRequest => Some(least_request::score(&candidates)),
                ScorerKind::GpuUsage => Some(gpu_usage::score(&candidates)),
                ScorerKind::LeastLatency => Some(least_latency::score(
                    &candidates,
                    self.config.ttft_tpot_weight_factor,
                )),
                ScorerKind::Random => Some(random::score(&candidates, &mut rng)),
                ScorerKind::KvCacheAware => request.kv_blocks.map(|lookup| {
                    let scored = kvcache_aware::score(lookup, &candidates);
                    observations.push(Observation::KvCacheMatchRatio(scored.match_ratio()));
                    kv_matched = Some(scored.matched.clone());
                    kv_total = scored.total;
                    scored.scores
                }),
            };
            observations.push(Observation::PluginTime {
                plugin: kind.as_str(),
                kind: PluginType::Score,
                elapsed: t.elapsed(),
            });
            if let Some(s) = &scores {
                for (total, &score) in totals.iter_mut().zip(s) {
                    *total += u64::from(score) * u64::from(weight);
                }
            }
            plugins.push(PluginScores {
                plugin: kind.as_str(),
                weight,
                scores,
            });
        }
        if !self.prefix_enabled {
            unscored = Some(Unscored::PrefixCacheDisabled);
        }

        // Best first; equal totals in a seeded random order.
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.shuffle(&mut rng);
        order.sort_by(|&a, &b| totals[b].cmp(&totals[a]));

        let prefix_scores = plugins
            .iter()
            .find(|p| p.plugin == ScorerKind::PrefixCache.as_str())
            .and_then(|p| p.scores.as_ref());
        // Session affinity: the session's pod, if the filters kept it, leads.
        let session = session_position(&candidates, request.session_pod);
        if let Some(at) = session.and_then(|i| order.iter().position(|&o| o == i)) {
            order[..=at].rotate_right(1);
        }
        let reason = match prefix_scores {
            _ if session.is_some() => DecisionReason::Session,
            None => DecisionReason::Unscored,
            Some(s) if s[order[0]] > 0 => DecisionReason::PrefixHit,
            Some(s) if s.iter().any(|&x| x > 0) => DecisionReason::PrefixOverruled,
            Some(_) => DecisionReason::PrefixMiss,
        };
        let ranked: Vec<C> = order
            .iter()
            .take(keep)
            .map(|&i| candidates[i].clone())
            .collect();
        Ok(Decision {
            candidates,
            plugins,
            totals,
            ranked,
            reason,
            hashes,
            prompt_bytes,
            unscored,
            predicted_blocks: 0,
            predictions: Vec::new(),
            engine: Vec::new(),
            observations,
            duration: started.elapsed(),
            pd: None,
            kv_matched: kv_matched.map(|m| (m, kv_total)),
        })
    }

    /// The affinity mode's decision: its pick first, then the other candidates by longest
    /// match and load. The weighted load plugins are not scored (the mode replaces their sum);
    /// the score lines show prefix-cache's percentages.
    #[expect(
        clippy::too_many_arguments,
        reason = "the pick's inputs, each used once; a struct would only rename them"
    )]
    fn affinity_decision<C: Candidate + Clone>(
        &self,
        config: &AffinityConfig,
        candidates: Vec<C>,
        scored: prefix_cache::PrefixScores,
        hashes: Vec<BlockHash>,
        session: Option<usize>,
        rng: &mut SmallRng,
        keep: usize,
    ) -> Decision<C> {
        let (primary, why, predictions, loads) =
            self.affinity_pick(config, &candidates, &scored, &hashes, session, rng);
        let ranked = std::iter::once(primary)
            .chain(fallbacks(
                primary,
                &scored.matched_blocks,
                &loads,
                keep.max(1) - 1,
            ))
            .map(|i| candidates[i].clone())
            .collect();
        let weight = self
            .config
            .scorers
            .iter()
            .find(|(k, _)| *k == ScorerKind::PrefixCache)
            .map_or(1, |&(_, w)| w);
        let totals = scored
            .scores
            .iter()
            .map(|&s| u64::from(s) * u64::from(weight))
            .collect();
        Decision {
            candidates,
            plugins: vec![PluginScores {
                plugin: ScorerKind::PrefixCache.as_str(),
                weight,
                scores: Some(scored.scores),
            }],
            totals,
            ranked,
            reason: why.into(),
            predicted_blocks: scored.held_blocks[primary],
            predictions,
            engine: Vec::new(),
            hashes,
            prompt_bytes: 0,
            unscored: None,
            observations: Vec::new(),
            duration: Duration::ZERO,
            pd: None,
            kv_matched: None,
        }
    }

    /// The affinity mode's pick among `candidates` ([`affinity::pick`]); [`Scheduler::commit`]
    /// counts it in the pod's recent share.
    fn affinity_pick<C: Candidate>(
        &self,
        config: &AffinityConfig,
        candidates: &[C],
        scored: &prefix_cache::PrefixScores,
        hashes: &[BlockHash],
        session: Option<usize>,
        rng: &mut SmallRng,
    ) -> (
        usize,
        AffinityReason,
        Vec<latency::Prediction>,
        Vec<PodLoad>,
    ) {
        let now = self.counters.picks.load(Ordering::Relaxed) as u32;
        let ln_keep = affinity::keep_factor(config.share_window, candidates.len()).ln();
        let per_token = if config
            .latency_signals
            .has(latency::LatencySignal::PrefillFit)
        {
            self.counters.prefill.seconds_per_token()
        } else {
            latency::PRIOR_SECONDS_PER_TOKEN
        };
        let tokens_per_block = self.tokens_per_block(config);
        let pool = latency::Pool {
            concurrency: candidates
                .iter()
                .filter_map(|e| e.timing()?.concurrency())
                .reduce(f64::min),
            service: self.counters.prefill.service(),
            signals: config.latency_signals,
        };
        // One pass over the candidates: each one's load and prediction (the engine's stats are
        // read once per pod; its scrape age only when it reported a queue).
        let mut predictions = Vec::with_capacity(candidates.len());
        let loads: Vec<PodLoad> = candidates
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (inflight, waiting) = (e.inflight(), e.waiting());
                let uncached_tokens =
                    hashes.len().saturating_sub(scored.matched_blocks[i]) as f64 * tokens_per_block;
                let timing = e.timing();
                let (wait, backlog) = match timing {
                    Some(t) if config.latency_model => {
                        let age = if waiting > 0.0 { e.stats_age() } else { None };
                        t.queue(inflight, waiting, age, pool)
                    }
                    _ => (0.0, 0.0),
                };
                predictions.push(latency::Prediction {
                    wait,
                    backlog,
                    prefill: uncached_tokens * per_token,
                    uncached_tokens,
                    has_slot: timing.is_none_or(|t| t.has_slot(inflight, pool)),
                    running: inflight as f64,
                });
                PodLoad {
                    key: e.rendezvous(),
                    inflight,
                    waiting,
                    share: e.recent().share_ln(now, ln_keep),
                    head_inflight: scored.head_inflight.get(i).copied().unwrap_or(0),
                    wait,
                    backlog,
                }
            })
            .collect();
        let index = self.prefix.index();
        let churn = |i: usize| candidates[i].index_pod().map_or(0.0, |p| index.churn(p));
        let (i, why) = affinity::pick(
            config,
            &scored.matched_blocks,
            &scored.held_blocks,
            &loads,
            hashes,
            session,
            &churn,
            per_token * tokens_per_block,
            rng,
        );
        (i, why, predictions, loads)
    }

    /// Engine tokens in one prompt block.
    fn tokens_per_block(&self, config: &AffinityConfig) -> f64 {
        self.prefix.args().block_size_to_hash as f64 / f64::from(config.bytes_per_token.max(1))
    }

    /// The learned prefill rate (the latency model's, over every pod; completions teach it).
    pub fn prefill_rate(&self) -> &latency::PrefillRate {
        &self.counters.prefill
    }

    /// Makes a routed decision's pick count: an affinity pick joins its pod's recent share, and
    /// (with `tentative`) the prompt is held for the pod until the request completes. Explained
    /// decisions are never committed.
    pub fn commit<C: Candidate>(
        &self,
        model: &str,
        decision: &Decision<C>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        let affinity_pick = matches!(
            decision.reason,
            DecisionReason::AffinityHit
                | DecisionReason::AffinityMiss
                | DecisionReason::AffinitySpill
                | DecisionReason::AffinitySaturated
                | DecisionReason::Session
        );
        if affinity_pick {
            let keep = affinity::keep_factor(config.share_window, decision.candidates.len());
            let now = self.counters.picks.fetch_add(1, Ordering::Relaxed) as u32;
            decision.primary().recent().add(now, keep);
        }
        let primary = decision.primary();
        let engine = primary.engine_view().zip(decision.primary_last_block());
        self.hold_tentative(model, &decision.hashes, primary.slot(), engine)
    }

    /// [`commit`](Scheduler::commit) for a PD decision's prefill pod: an affinity pick joins its
    /// recent share, and (with `tentative`) the prompt is held for it too. `None` outside PD
    /// mode or with nothing to hold.
    pub fn commit_prefill<C: Candidate>(
        &self,
        model: &str,
        decision: &Decision<C>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        let pd = decision.pd.as_ref()?;
        let affinity_pick = matches!(
            pd.prefill_reason,
            DecisionReason::AffinityHit
                | DecisionReason::AffinityMiss
                | DecisionReason::AffinitySpill
                | DecisionReason::AffinitySaturated
        );
        if affinity_pick {
            let keep = affinity::keep_factor(config.share_window, pd.prefill_candidates);
            let now = self.counters.picks.fetch_add(1, Ordering::Relaxed) as u32;
            pd.prefill.recent().add(now, keep);
        }
        self.hold_tentative(model, &decision.hashes, pd.prefill.slot(), None)
    }

    /// Holds `hashes` tentatively for the pod in `pod` until the request ends (affinity mode
    /// with `tentative`); `None` when there is nothing to hold. `engine`: the pod's live view and
    /// the token-chain hash of the request's head's last full block: the hold claims its blocks
    /// until that view stores it.
    pub fn hold_tentative(
        &self,
        model: &str,
        hashes: &[BlockHash],
        pod: PodSlot,
        engine: Option<(&EngineView, u64)>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        if !config.tentative || hashes.is_empty() {
            return None;
        }
        let engine = engine.map(|(view, block)| view.await_block(block));
        let id =
            self.tentative
                .add_awaiting(ModelKey::of(model), hashes.into(), pod, engine.clone())?;
        Some(TentativeHold {
            entries: self.tentative.clone(),
            id,
            pod,
            engine,
        })
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

impl Scheduler {
    /// The prompt's block hashes: the request's own when a pass before computed them.
    fn hashes_of(&self, request: &RouteRequest<'_>, prompt: &str) -> Vec<BlockHash> {
        match request.hashes {
            Some(hashes) => hashes.to_vec(),
            None => self
                .prefix
                .hash_salted(request.model, request.salt, prompt.as_bytes()),
        }
    }
}

/// The affinity mode's fallbacks: up to `keep` candidates other than `primary`, longest match
/// first, then least loaded (in flight plus engine queue, as the pick read them), then position.
/// The few kept are kept sorted in one scan: a selection over every candidate cost 4% of the
/// request path at 1,024 pods (benches/RESULTS.md, "Cost growth with the pool").
fn fallbacks(primary: usize, matched: &[usize], loads: &[PodLoad], keep: usize) -> Vec<usize> {
    let keep = keep.min(matched.len().saturating_sub(1));
    let mut kept: Vec<(std::cmp::Reverse<usize>, i64, usize)> = Vec::with_capacity(keep + 1);
    for i in (0..matched.len()).filter(|&i| i != primary) {
        let load = loads[i].inflight + loads[i].waiting as i64;
        let t = (std::cmp::Reverse(matched[i]), load, i);
        if kept.len() == keep && kept.last().is_none_or(|last| t >= *last) {
            continue;
        }
        let at = kept.partition_point(|x| *x < t);
        kept.insert(at, t);
        kept.truncate(keep);
    }
    kept.into_iter().map(|(_, _, i)| i).collect()
}

/// Where the session's pod is among `candidates`, if it is one.
fn session_position<C: Candidate>(candidates: &[C], pod: Option<PodSlot>) -> Option<usize> {
    let pod = pod?;
    candidates.iter().position(|c| c.slot() == pod)
}

#[cfg(test)]
mod tests;
