//! One request through the scheduler, top to bottom: this file names the steps in the order they
//! run, and each step lives in its own file.
//!
//! 1. **candidates** ([`candidates`]): the pods the caller passes (those serving the model,
//!    narrowed by a subset hint; in PD mode the decode pods, then each kept decode pod's prefill
//!    pods, [`super::pd`]);
//! 2. **filters** ([`filters`]): Kthena's filters in order, no load filter under the affinity
//!    mode's latency model; a filter that leaves no pod ends the decision;
//! 3. **match** ([`matching`], affinity mode): the prompt's blocks and every candidate's longest
//!    match on them. Without a match (Kthena's mode, no prompt, an empty one) the weighted
//!    plugins decide instead: **score** ([`score`]: each plugin's 0..=100 per pod, times its
//!    weight, summed), then **rank** ([`rank`]: best total first, equal totals in a seeded random
//!    order, the session's pod first, the first `keep` kept).
//!
//! Then the affinity mode's pick ([`pick`]; the rules: [`super::affinity`]):
//! 4. **load** ([`load`]): each candidate's load, recent share and predicted wait;
//! 5. **gate** ([`gate`]): which candidates are saturated, over their share, available; a
//!    session's pod is the pick while it is not saturated;
//! 6. **place** ([`place`]): the case the gates leave: the longest match on an available pod,
//!    new work by share and churn, a spill, or the least-loaded pod when nothing is available;
//! 7. **tie** ([`tie`]): among equal candidates the least loaded, then rendezvous hashing (or a
//!    seeded random pick);
//! 8. **fallbacks** ([`fallbacks`]): the next best candidates by match and load.
//!
//! With an `EndpointPickerConfig` profile ([`epp`]) its filters, scorers and picker replace
//! steps 2-8 (Kthena's filter list is then empty).
//!
//! The steps read the decision's seeded RNG in this order, so a decision is reproducible from
//! `picker.seed` and the decision counter.

mod candidates;
pub mod epp;
mod fallbacks;
mod filters;
mod gate;
mod load;
mod matching;
mod place;
mod rank;
mod score;
mod tie;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::affinity::{AffinityConfig, AffinityReason, PodLoad};
use super::config::ScorerKind;
use super::predictions::Predictions;
use super::{Candidate, Decision, Filtered, PluginScores, RouteRequest, Scheduler, next};
use crate::hashing::BlockHash;
use matching::Matched;
use place::place;

impl Scheduler {
    /// One decision over `candidates`. `take` = false: a dry run (explain) that leaves the
    /// decision and scoring counters as they are; `keep`: pods ranked (primary + fallbacks).
    pub(super) fn decide<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        mut candidates: Arc<[C]>,
        take: bool,
        keep: usize,
    ) -> Result<Decision<C>, Filtered> {
        let started = Instant::now();
        // 1. candidates: the caller's, in its order. One observation per plugin, plus
        // prefix-cache's match ratio.
        let mut observations =
            Vec::with_capacity(self.config.filters.len() + self.config.scorers.len() + 1);
        // 2. filters
        let active = filters::active(&self.config, &request);
        let max_waiting = self.config.max_waiting_requests;
        if let Some(filter) = filters::run(
            active,
            max_waiting,
            request.model,
            &mut candidates,
            &mut observations,
        ) {
            return Err(Filtered {
                filter,
                observations,
            });
        }
        let n = next(&self.counters.decisions, take);
        let mut rng = SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        // An EndpointPickerConfig profile: its own filters, scorers and picker (steps 2-4).
        if let Some(profile) = &self.config.epp {
            let decided = self.epp_disagg_decision(
                profile,
                &request,
                candidates,
                &mut rng,
                keep,
                &mut observations,
            );
            return match decided {
                Ok(mut decision) => {
                    decision.observations = observations;
                    decision.duration = started.elapsed();
                    Ok(decision)
                }
                Err(filter) => Err(Filtered {
                    filter,
                    observations,
                }),
            };
        }
        // 3. match: the affinity mode's pick (4-8) on it, else Kthena's score and rank.
        let mut decision = match self.affinity_match(&request, &candidates, &mut observations) {
            Some((config, matched)) => {
                self.affinity_decision(config, &request, candidates, matched, &mut rng, keep)
            }
            None => {
                let weighted = self.score(&request, &candidates, &mut rng, take, &mut observations);
                rank::decision(weighted, &request, candidates, &mut rng, keep)
            }
        };
        decision.observations = observations;
        decision.duration = started.elapsed();
        Ok(decision)
    }

    /// The affinity mode after its match: load (4), the pick (5-7), fallbacks (8). The weighted
    /// load plugins are not scored (the mode replaces their sum); the score lines show
    /// prefix-cache's percentages.
    fn affinity_decision<C: Candidate + Clone>(
        &self,
        config: &AffinityConfig,
        request: &RouteRequest<'_>,
        candidates: Arc<[C]>,
        mut matched: Matched,
        rng: &mut SmallRng,
        keep: usize,
    ) -> Decision<C> {
        let session = candidates::session_position(&candidates, request.session_pod);
        // 4. load; a pod whose engine reuses nothing holds nothing.
        let load = self.load(config, &candidates, &matched.scored, matched.hashes.len());
        if load.some_reuse_nothing {
            matched.scored.forget(|i| !load.loads[i].reuses);
        }
        let scored = &matched.scored;
        let index = self.prefix.index();
        let churn = |i: usize| candidates[i].index_pod().map_or(0.0, |p| index.churn(p));
        // 5-7. gate, place, tie
        let (primary, why) = pick(
            config,
            &scored.matched_blocks,
            &scored.held_blocks,
            &load.loads,
            &matched.hashes,
            session,
            &churn,
            load.prefill_per_block(),
            rng,
        );
        // 8. fallbacks
        let rest = keep.max(1) - 1;
        let ranked = std::iter::once(primary)
            .chain(fallbacks::fallbacks(
                primary,
                &scored.matched_blocks,
                &load.loads,
                rest,
            ))
            .map(|i| candidates[i].clone())
            .collect();
        self.affinity_result(candidates, ranked, primary, why, matched, load)
    }
}

/// The affinity pick (steps 5-7): the chosen candidate's position and why. `matched` and `held`
/// are each candidate's longest match with and without the holds of requests in flight;
/// `churn(i)` is candidate `i`'s churn, read only for new work; `prefill_per_block` the seconds
/// one uncached block of the prompt costs (the latency model's; unused without it).
#[expect(
    clippy::too_many_arguments,
    reason = "the pick's inputs, each used once; a struct would only rename them"
)]
pub fn pick<R: Rng>(
    config: &AffinityConfig,
    matched: &[usize],
    held: &[usize],
    loads: &[PodLoad],
    hashes: &[BlockHash],
    session: Option<usize>,
    churn: &dyn Fn(usize) -> f64,
    prefill_per_block: f64,
    rng: &mut R,
) -> (usize, AffinityReason) {
    debug_assert_eq!(matched.len(), loads.len());
    // 5. gate: a match held only in flight counts when it covers most of the prompt; then each
    // candidate's gates, and the session's pod while it is not saturated.
    let gates = gate::Gates::new(
        config,
        matched,
        held,
        loads,
        hashes.len(),
        prefill_per_block,
    );
    if let Some(i) = gates.session(session) {
        return (i, AffinityReason::Session);
    }
    // 6. place (7. tie, inside it, among equal candidates); with the latency model a pick that
    // waits because every pod would is `affinity_saturated`.
    let placed = place(config, &gates, loads, hashes, churn, rng);
    gates.reason(loads, placed)
}

impl Scheduler {
    /// The affinity decision as a value: prefix-cache's percentages (times its weight) as the
    /// only plugin's scores, the pick's prediction, the engine matches.
    fn affinity_result<C>(
        &self,
        candidates: Arc<[C]>,
        ranked: Vec<C>,
        primary: usize,
        why: AffinityReason,
        matched: Matched,
        load: load::Load,
    ) -> Decision<C> {
        let Matched {
            hashes,
            scored,
            engine,
            prompt_bytes,
        } = matched;
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
                fractional: None,
            }],
            totals,
            ranked,
            primary_at: primary,
            reason: why.into(),
            predicted_blocks: scored.held_blocks[primary],
            predictions: Predictions::new(load.loads, scored.matched_blocks, load.basis),
            engine,
            hashes,
            prompt_bytes,
            unscored: None,
            observations: Vec::new(),
            duration: Duration::ZERO,
            pd: None,
            kv_matched: None,
            epp: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests;
