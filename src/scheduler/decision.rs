//! What a decision is: the pick (primary and fallbacks) with everything that produced it
//! ([`Decision`]), why it is what it is ([`DecisionReason`], the metric label), what it observed
//! for the caller to count ([`Observation`]), and why a request could not be routed
//! ([`PickError`]). Values only: the steps in `pipeline.rs` make them.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::affinity::AffinityReason;
use super::engine_match::{self, EngineMatched};
use super::latency;
use super::predictions::Predictions;
use super::{Candidate, PdPairing};
use crate::hashing::BlockHash;
use crate::prompt::NoPrompt;

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
    /// An `EndpointPickerConfig` scorer's own output ([`super::epp`]): its instance name,
    /// float weight and [0, 1] scores (`scores` above are these as whole percentages, `weight`
    /// rounded, for the Kthena-shaped readers).
    pub fractional: Option<Fractional>,
}

/// An `EndpointPickerConfig` scorer's output: llm-d's float weight and per-pod scores in [0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct Fractional {
    pub name: String,
    pub weight: f64,
    pub scores: Vec<f64>,
}

/// A routing decision, with everything that produced it.
#[derive(Debug, Clone)]
pub struct Decision<C> {
    /// Pods that passed the filters, in scoring order: the caller's list, shared (one
    /// reference count per decision, not one per pod), copied only when a filter removes a pod.
    pub candidates: Arc<[C]>,
    pub plugins: Vec<PluginScores>,
    /// Weighted totals per candidate.
    pub totals: Vec<u64>,
    /// Primary pick first, then fallbacks.
    pub ranked: Vec<C>,
    /// Where `ranked[0]` is in `candidates`, as the step that ranked knew it: the accessors of
    /// the primary's per-candidate values check it, and search by slot only when it does not
    /// name the primary (PD mode may promote another decode pod).
    pub primary_at: usize,
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
    pub predictions: Predictions,
    /// Affinity mode: each candidate's match on its engine's view, where it had one (empty when
    /// none did; [`Decision::match_source`]).
    pub engine: Vec<Option<EngineMatched>>,
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
    /// An `EndpointPickerConfig`'s state to commit: the primary's uncached prompt tokens (its
    /// in-flight token load while prefill runs) and the `session_id` sessions to bind.
    pub epp: EppCommit,
}

/// What an `EndpointPickerConfig` decision leaves to its commit ([`Decision::epp`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EppCommit {
    /// The prompt tokens the primary must compute (llm-d's inflight-load-producer's count).
    pub inflight_tokens: u64,
    /// P/D: the prompt tokens the prefill pod must compute.
    pub prefill_tokens: u64,
    /// `(session-affinity-scorer instance, session id)` of its `session_id` instances.
    pub sessions: Vec<(String, String)>,
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

    /// Where the primary pick is among the candidates: [`Decision::primary_at`] when it names
    /// the primary, else found by slot.
    pub fn primary_position(&self) -> Option<usize> {
        let slot = self.primary().slot();
        match self.candidates.get(self.primary_at) {
            Some(c) if c.slot() == slot => Some(self.primary_at),
            _ => self.candidates.iter().position(|c| c.slot() == slot),
        }
    }

    /// [`Decision::match_source`] of the primary pick.
    pub fn primary_source(&self) -> MatchSource {
        if self.engine.is_empty() {
            return MatchSource::Estimate;
        }
        self.primary_position()
            .map_or(MatchSource::Estimate, |i| self.match_source(i))
    }

    /// The token-chain hash of the request's head's last full block at the primary pick's
    /// engine block size, when the primary was matched by its live engine view (what a hold
    /// for it awaits).
    pub fn primary_last_block(&self) -> Option<u64> {
        if self.engine.is_empty() {
            return None;
        }
        let at = self.primary_position()?;
        self.engine.get(at).copied().flatten()?.last_block
    }

    /// What the decision says of its primary pick ([`PickSummary`]).
    pub fn pick_summary(&self) -> PickSummary {
        let at = self.primary_position();
        let prediction = self.primary_prediction();
        let matched = at.and_then(|i| self.predictions.matched_tokens(i));
        PickSummary {
            pod: self.primary().label().to_string(),
            reason: self.reason,
            matched_tokens: matched.map(|t| t.round() as u64),
            uncached_tokens: prediction.map(|p| p.uncached_tokens.round() as u64),
            queued: Duration::ZERO,
        }
    }

    /// The latency model's prediction for the primary pick (affinity mode only).
    pub fn primary_prediction(&self) -> Option<latency::Prediction> {
        if self.predictions.is_empty() {
            return None;
        }
        let at = self.primary_position()?;
        self.predictions.get(at)
    }
}

/// A decision's primary pick as an operator reads it (the decision header, `/debug/explain`):
/// the pod, why, and in the affinity mode the prompt tokens it holds and the tokens it is
/// predicted to prefill (estimates in tokens: blocks times the tokens in a block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickSummary {
    /// The pod's label (`namespace/name`).
    pub pod: String,
    pub reason: DecisionReason,
    /// Affinity mode: prompt tokens the pod holds (index, engine and holds in flight).
    pub matched_tokens: Option<u64>,
    /// Affinity mode: prompt tokens the pod is predicted to prefill.
    pub uncached_tokens: Option<u64>,
    /// Time the request waited in flow control's queue before the decision (zero here: the
    /// router sets it for a queued request).
    pub queued: Duration,
}

/// Where a candidate's match came from (the `source` of explain, `--v 4` and the
/// `prefix_picker_match_source_total` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchSource {
    /// The engine's own KV-cache events, counted in its tokens.
    Engine,
    /// The prefix index's estimate (what the picker sent the pod).
    Estimate,
    /// The engine's events for the prompt's head (every full block of it held), then the
    /// estimate past it (the head ends before the part the pod was sent).
    Mixed,
}

impl MatchSource {
    pub const ALL: [MatchSource; 3] = [
        MatchSource::Engine,
        MatchSource::Estimate,
        MatchSource::Mixed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MatchSource::Engine => "engine",
            MatchSource::Estimate => "estimate",
            MatchSource::Mixed => "engine+estimate",
        }
    }
}
