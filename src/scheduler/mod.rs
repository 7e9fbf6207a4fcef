//! The scheduler: filters in order, weighted score plugins, then the pick (primary + fallbacks).
//!
//! For one request: candidates (pods serving the model, optionally narrowed by a subset hint)
//! -> each filter in order (a filter that leaves no pod is an error) -> each score plugin returns
//! 0..=100 per pod, or nothing (prefix-cache with no prompt) -> total = sum(score * weight) ->
//! the best `maxEndpoints` (<= 5) pods, ties broken by an RNG seeded from `picker.seed` and a
//! decision counter, become the primary pick and its ordered fallbacks. The result is a
//! [`Decision`] value carrying every plugin's scores, so it can be logged (`--v 4` prints Kthena's
//! score lines), explained (`/debug/explain`) and tested. One file per plugin.

pub mod affinity;
pub mod gpu_usage;
pub mod least_latency;
pub mod least_request;
pub mod prefix_cache;
pub mod random;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use thiserror::Error;

use crate::config::{FilterKind, SchedulerConfig, ScorerKind};
use crate::endpoints::{Endpoint, EndpointSet};
use crate::hashing::BlockHash;
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
use crate::prefix_index::{HoldId, ModelKey, TentativeEntries};
use affinity::{AffinityConfig, AffinityReason, PodLoad};
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
}

impl DecisionReason {
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
        }
    }
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
pub struct Decision {
    /// Pods that passed the filters, in scoring order.
    pub candidates: Vec<Arc<Endpoint>>,
    pub plugins: Vec<PluginScores>,
    /// Weighted totals per candidate.
    pub totals: Vec<u64>,
    /// Primary pick first, then fallbacks.
    pub ranked: Vec<Arc<Endpoint>>,
    pub reason: DecisionReason,
    /// The prompt's block hashes (empty when unscored); recorded for the serving pod.
    pub hashes: Vec<BlockHash>,
    pub prompt_bytes: usize,
    /// Why prefix-cache did not score, when it did not.
    pub unscored: Option<&'static str>,
    /// Affinity mode: blocks of the prompt the primary pick holds in the index (what its
    /// engine should report as cached).
    pub predicted_blocks: usize,
}

impl Decision {
    pub fn primary(&self) -> &Arc<Endpoint> {
        &self.ranked[0]
    }

    /// `ip:port[,ip:port...]`, the value of the pick header and metadata.
    pub fn destination(&self) -> String {
        self.ranked
            .iter()
            .map(|e| e.host.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What the scheduler needs of a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// The rendered prompt, or why there is none (a snake_case reason label).
    pub prompt: Result<&'a str, &'static str>,
}

/// Where a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOrigin {
    /// A completion this replica saw (published to the record sink).
    Local,
    /// A record another replica made (never published again).
    Replica,
}

/// Receives every local record (after a served request), e.g. to share it with other replicas.
/// Called on the routing path: it must not block.
pub trait RecordSink: Send + Sync + std::fmt::Debug {
    fn recorded(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint);
}

/// The scheduler. Shared by all streams (`Arc`); holds the prefix index.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    prefix: PrefixCache,
    prefix_enabled: bool,
    max_endpoints: usize,
    seed: u64,
    decisions: AtomicU64,
    metrics: RouterMetrics,
    sink: OnceLock<Arc<dyn RecordSink>>,
    /// The affinity mode's tentative entries (empty unless `tentative` is on).
    tentative: Arc<TentativeEntries>,
    /// Affinity picks made (the clock of the pods' recent shares).
    picks: AtomicU64,
}

impl Scheduler {
    pub fn new(
        config: SchedulerConfig,
        max_endpoints: usize,
        seed: u64,
        prefix_metrics: PrefixCacheMetrics,
        metrics: RouterMetrics,
    ) -> Scheduler {
        let prefix_enabled = config.affinity.is_some()
            || config
                .scorers
                .iter()
                .any(|(k, _)| *k == ScorerKind::PrefixCache);
        Scheduler {
            prefix: PrefixCache::new(config.prefix_cache, seed, prefix_metrics)
                .with_scheme(config.chain_scheme()),
            prefix_enabled,
            config,
            max_endpoints: max_endpoints.clamp(1, 5),
            seed,
            decisions: AtomicU64::new(0),
            metrics,
            sink: OnceLock::new(),
            tentative: Arc::new(TentativeEntries::default()),
            picks: AtomicU64::new(0),
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

    /// Pods that may serve `model`, narrowed to `restrict` when given.
    pub fn candidates(
        &self,
        set: &EndpointSet,
        model: &str,
        restrict: Option<&[SocketAddr]>,
    ) -> Result<Vec<Arc<Endpoint>>, PickError> {
        if set.all().is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let lists = set.lists_models();
        let mut out: Vec<Arc<Endpoint>> = set
            .all()
            .iter()
            .filter(|e| !lists || e.serves(model))
            .cloned()
            .collect();
        if out.is_empty() {
            return Err(PickError::UnknownModel(model.to_string()));
        }
        if let Some(allowed) = restrict {
            out.retain(|e| {
                allowed.iter().any(|a| {
                    *a == e.spec.address || (a.port() == 0 && a.ip() == e.spec.address.ip())
                })
            });
            if out.is_empty() {
                return Err(PickError::SubsetUnavailable);
            }
        }
        Ok(out)
    }

    /// Runs filters and score plugins and picks. `observe` = false leaves the match-ratio
    /// histogram and decision counters untouched (used by `/debug/explain`).
    pub fn schedule(
        &self,
        request: RouteRequest<'_>,
        mut candidates: Vec<Arc<Endpoint>>,
        observe: bool,
    ) -> Result<Decision, PickError> {
        let started = Instant::now();
        let model = request.model;
        for filter in &self.config.filters {
            let t = Instant::now();
            match filter {
                FilterKind::LeastRequest => {
                    least_request::filter(&mut candidates, self.config.max_waiting_requests)
                }
            }
            if observe {
                self.plugin_time(model, filter.as_str(), "filter", t);
            }
            if candidates.is_empty() {
                return Err(PickError::Filtered(filter.as_str()));
            }
        }

        let n = self.decisions.fetch_add(1, Ordering::Relaxed);
        let mut rng = SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        let mut hashes = Vec::new();
        let mut unscored = None;
        // Affinity mode: the pick from every candidate's longest match (index and tentative).
        if let (Some(config), Ok(prompt)) = (&self.config.affinity, request.prompt) {
            hashes = self.prefix.hash(model, prompt.as_bytes());
            let slots: Vec<_> = candidates.iter().map(|e| e.index.slot()).collect();
            if let Some(scored) =
                self.prefix
                    .score_chained(model, &hashes, &slots, &self.tentative, observe)
            {
                let decision = self.affinity_decision(
                    config,
                    candidates,
                    scored,
                    hashes,
                    prompt.len(),
                    &mut rng,
                    observe,
                );
                if observe {
                    self.observe_decision(&decision, started);
                }
                return Ok(decision);
            }
        }
        let prompt_bytes = request.prompt.map_or(0, str::len);
        let mut plugins = Vec::with_capacity(self.config.scorers.len());
        let mut totals = vec![0u64; candidates.len()];
        for &(kind, weight) in &self.config.scorers {
            let t = Instant::now();
            let scores = match kind {
                ScorerKind::PrefixCache => match request.prompt {
                    Err(reason) => {
                        unscored = Some(reason);
                        None
                    }
                    Ok(prompt) => {
                        hashes = self.prefix.hash(model, prompt.as_bytes());
                        let slots: Vec<_> = candidates.iter().map(|e| e.index.slot()).collect();
                        let scored = self.prefix.score(model, &hashes, &slots, observe);
                        if scored.is_none() {
                            unscored = Some("empty_prompt");
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
            };
            if observe {
                self.plugin_time(model, kind.as_str(), "score", t);
            }
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
            unscored = Some("prefix_cache_disabled");
        }

        // Best first; equal totals in a seeded random order.
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.shuffle(&mut rng);
        order.sort_by(|&a, &b| totals[b].cmp(&totals[a]));

        let prefix_scores = plugins
            .iter()
            .find(|p| p.plugin == ScorerKind::PrefixCache.as_str())
            .and_then(|p| p.scores.as_ref());
        let reason = match prefix_scores {
            None => DecisionReason::Unscored,
            Some(s) if s[order[0]] > 0 => DecisionReason::PrefixHit,
            Some(s) if s.iter().any(|&x| x > 0) => DecisionReason::PrefixOverruled,
            Some(_) => DecisionReason::PrefixMiss,
        };
        let ranked: Vec<Arc<Endpoint>> = order
            .iter()
            .take(self.max_endpoints)
            .map(|&i| candidates[i].clone())
            .collect();
        let decision = Decision {
            candidates,
            plugins,
            totals,
            ranked,
            reason,
            hashes,
            prompt_bytes,
            unscored,
            predicted_blocks: 0,
        };
        if observe {
            self.observe_decision(&decision, started);
        }
        Ok(decision)
    }

    /// Counts a decision (reason, unscored reason, duration) and writes Kthena's score lines.
    fn observe_decision(&self, decision: &Decision, started: Instant) {
        self.metrics
            .decisions
            .with_label_values(&[decision.reason.as_str()])
            .inc();
        if let Some(u) = decision.unscored {
            self.metrics.unscored.with_label_values(&[u]).inc();
        }
        self.metrics
            .decision_duration
            .observe(started.elapsed().as_secs_f64());
        log_scores(decision);
    }

    /// The affinity mode's decision: its pick first, then the other candidates by longest
    /// match and load. The weighted load plugins are not scored (the mode replaces their sum);
    /// the score lines show prefix-cache's percentages.
    #[expect(clippy::too_many_arguments, reason = "the parts of one decision")]
    fn affinity_decision(
        &self,
        config: &AffinityConfig,
        candidates: Vec<Arc<Endpoint>>,
        scored: prefix_cache::PrefixScores,
        hashes: Vec<BlockHash>,
        prompt_bytes: usize,
        rng: &mut SmallRng,
        observe: bool,
    ) -> Decision {
        let (primary, why) =
            self.affinity_pick(config, &candidates, &scored, &hashes, rng, observe);
        // Fallbacks: longest match first, then least loaded (only the few kept are sorted).
        let mut rest: Vec<(std::cmp::Reverse<usize>, i64, usize)> = (0..candidates.len())
            .filter(|&i| i != primary)
            .map(|i| {
                let load = candidates[i].inflight() + candidates[i].stats().waiting as i64;
                (std::cmp::Reverse(scored.matched_blocks[i]), load, i)
            })
            .collect();
        let keep = (self.max_endpoints - 1).min(rest.len());
        if keep > 0 && keep < rest.len() {
            rest.select_nth_unstable(keep - 1);
        }
        rest.truncate(keep);
        rest.sort_unstable();
        let ranked = std::iter::once(primary)
            .chain(rest.iter().map(|&(_, _, i)| i))
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
            hashes,
            prompt_bytes,
            unscored: None,
        }
    }

    /// The affinity mode's pick among `candidates` ([`affinity::pick`]); counts it in the
    /// pod's recent share when `observe`.
    fn affinity_pick(
        &self,
        config: &AffinityConfig,
        candidates: &[Arc<Endpoint>],
        scored: &prefix_cache::PrefixScores,
        hashes: &[BlockHash],
        rng: &mut SmallRng,
        observe: bool,
    ) -> (usize, AffinityReason) {
        let now = self.picks.load(Ordering::Relaxed) as u32;
        let keep = affinity::keep_factor(config.share_window, candidates.len());
        let loads: Vec<PodLoad> = candidates
            .iter()
            .enumerate()
            .map(|(i, e)| PodLoad {
                key: e.rendezvous,
                inflight: e.inflight(),
                waiting: e.stats().waiting,
                share: e.recent.share(now, keep),
                head_inflight: scored.head_inflight.get(i).copied().unwrap_or(0),
            })
            .collect();
        let (primary, why) = affinity::pick(
            config,
            &scored.matched_blocks,
            &scored.held_blocks,
            &loads,
            hashes,
            rng,
        );
        if observe {
            let now = self.picks.fetch_add(1, Ordering::Relaxed) as u32;
            candidates[primary].recent.add(now, keep);
        }
        (primary, why)
    }

    /// Holds `hashes` tentatively for `endpoint` until the request completes (affinity mode with
    /// `tentative`); `None` when there is nothing to hold.
    pub fn hold_tentative(
        &self,
        model: &str,
        hashes: &[BlockHash],
        endpoint: &Endpoint,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        if !config.tentative || hashes.is_empty() {
            return None;
        }
        let pod = endpoint.index.slot();
        let id = self
            .tentative
            .add(ModelKey::of(model), hashes.into(), pod)?;
        Some(TentativeHold {
            entries: self.tentative.clone(),
            id,
            pod,
        })
    }

    /// Records a served request's prompt for the pod that served it: the one record path,
    /// for this replica's completions ([`RecordOrigin::Local`], shared with the other replicas
    /// through the sink) and for theirs ([`RecordOrigin::Replica`], applied as they made them).
    pub fn record(
        &self,
        model: &str,
        hashes: &[BlockHash],
        endpoint: &Endpoint,
        origin: RecordOrigin,
    ) -> usize {
        if !self.prefix_enabled {
            return 0;
        }
        if origin == RecordOrigin::Local
            && let Some(sink) = self.sink.get()
        {
            sink.recorded(model, hashes, endpoint);
        }
        self.prefix.record(model, hashes, &endpoint.index)
    }

    /// Installs the record sink (once); `false` if one was already set.
    pub fn set_record_sink(&self, sink: Arc<dyn RecordSink>) -> bool {
        self.sink.set(sink).is_ok()
    }

    fn plugin_time(&self, model: &str, plugin: &str, kind: &str, started: Instant) {
        self.metrics
            .plugin_duration
            .with_label_values(&[model, plugin, kind])
            .observe(started.elapsed().as_secs_f64());
    }
}

/// A prompt held tentatively for a pod ([`Scheduler::hold_tentative`]), released when dropped:
/// the request's ticket drops it at completion (after recording), rollback or expiry.
#[derive(Debug)]
pub struct TentativeHold {
    entries: Arc<TentativeEntries>,
    id: HoldId,
    pod: crate::prefix_index::PodSlot,
}

impl TentativeHold {
    /// The pod the prompt is held for.
    pub fn pod(&self) -> crate::prefix_index::PodSlot {
        self.pod
    }
}

impl Drop for TentativeHold {
    fn drop(&mut self) {
        self.entries.remove(self.id);
    }
}

/// Kthena's `--v=4` score lines, verbatim, at debug level on the `scores` target.
fn log_scores(d: &Decision) {
    if !tracing::enabled!(target: "scores", tracing::Level::DEBUG) {
        return;
    }
    for p in &d.plugins {
        let Some(scores) = &p.scores else { continue };
        tracing::debug!(target: "scores", "ScorePlugin: {}", p.plugin);
        for (e, s) in d.candidates.iter().zip(scores) {
            tracing::debug!(target: "scores", "Pod: {}, Score: {}", e.label, s);
        }
    }
    tracing::debug!(target: "scores", "Final Pod Scores:");
    for (e, t) in d.candidates.iter().zip(&d.totals) {
        tracing::debug!(target: "scores", "  Pod: {}, Final Score: {}", e.label, t);
    }
}

#[cfg(test)]
mod tests;
