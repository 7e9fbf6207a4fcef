//! Step 3, match (the affinity mode): the prompt's block hashes (the request's own when a pass
//! before this one computed them), then every candidate's longest match on them: on its
//! engine's view, in the engine's tokens converted to prompt blocks, where it has a live one
//! ([`engine_match`]); else in the prefix index, by bisection; then extended by the tentative
//! holds of requests in flight ([`PrefixCache::score_chained`](crate::scheduler::prefix_cache::PrefixCache::score_chained)).
//! Timed as prefix-cache's score plugin, with its match ratio.
//!
//! No match, and Kthena's weighted scores decide instead ([`super::score`]): outside the
//! affinity mode, for a request without a prompt, or for an empty prompt (no block to match).

use std::time::Instant;

use crate::hashing::BlockHash;
use crate::scheduler::affinity::AffinityConfig;
use crate::scheduler::config::ScorerKind;
use crate::scheduler::engine_match::{self, EngineMatched};
use crate::scheduler::prefix_cache::PrefixScores;
use crate::scheduler::{Candidate, Observation, PluginType, RouteRequest, Scheduler};

/// The affinity mode's match of one request.
#[derive(Debug)]
pub(super) struct Matched {
    pub hashes: Vec<BlockHash>,
    pub scored: PrefixScores,
    /// Each candidate's engine match, where it had one (empty when none did).
    pub engine: Vec<Option<EngineMatched>>,
    pub prompt_bytes: usize,
}

impl Scheduler {
    /// Step 3: the mode's settings and the match, or `None` (the weighted scores decide).
    pub(super) fn affinity_match<C: Candidate>(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[C],
        observations: &mut Vec<Observation>,
    ) -> Option<(&AffinityConfig, Matched)> {
        let (Some(config), Ok(prompt)) = (&self.config.affinity, request.prompt) else {
            return None;
        };
        let hashes = self.hashes_of(request, prompt);
        let slots: Vec<_> = candidates.iter().map(|e| e.slot()).collect();
        let t = Instant::now();
        let mut engine = engine_match::matches(
            candidates,
            request.engine_tokens,
            prompt.len(),
            hashes.len(),
        );
        let scored = self.prefix.score_chained(
            request.model,
            &hashes,
            &slots,
            &self.tentative,
            &mut engine,
        )?;
        observations.push(Observation::PluginTime {
            plugin: ScorerKind::PrefixCache.as_str(),
            kind: PluginType::Score,
            elapsed: t.elapsed(),
        });
        observations.push(Observation::MatchRatio(scored.match_ratio()));
        let matched = Matched {
            hashes,
            scored,
            engine,
            prompt_bytes: prompt.len(),
        };
        Some((config, matched))
    }

    /// The prompt's block hashes: the request's own when a pass before computed them (PD's
    /// prefill passes reuse the decode pass's).
    pub(super) fn hashes_of(&self, request: &RouteRequest<'_>, prompt: &str) -> Vec<BlockHash> {
        match request.hashes {
            Some(hashes) => hashes.to_vec(),
            None => self
                .prefix
                .hash_salted(request.model, request.salt, prompt.as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scheduler::affinity::{RecentPicks, rendezvous_key};
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::test_pod::{Pod, req};
    use crate::scheduler::{EngineStats, Unscored};

    fn setup(affinity: bool) -> (Scheduler, Vec<Arc<Pod>>) {
        let mut config = SchedulerConfig::default();
        config.apply_affinity(affinity.then_some(AffinityConfig::DEFAULT));
        let s = Scheduler::new(config, 5, 1);
        let pods = (0..3u8)
            .map(|i| {
                Arc::new(Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: format!("default/pod-{i}"),
                    labels: Default::default(),
                    stats: EngineStats::default(),
                    recent: RecentPicks::default(),
                    rendezvous: rendezvous_key(&([10, 0, 0, i + 1], 8000).into()),
                    engine: None,
                })
            })
            .collect();
        (s, pods)
    }

    #[test]
    fn a_recorded_prompt_is_matched_whole_on_its_pod_and_timed_as_prefix_cache() {
        let (s, pods) = setup(true);
        let prompt = "a system prompt of some length ".repeat(40);
        let mut seen = Vec::new();
        let (_, first) = s.affinity_match(&req(&prompt), &pods, &mut seen).unwrap();
        assert_eq!(first.scored.matched_blocks, [0, 0, 0]);
        s.record("m", &first.hashes, &pods[1].handle);
        let mut seen = Vec::new();
        let (_, m) = s.affinity_match(&req(&prompt), &pods, &mut seen).unwrap();
        let blocks = m.hashes.len();
        assert!(blocks > 1);
        assert_eq!(m.hashes, first.hashes);
        assert_eq!(m.scored.matched_blocks, [0, blocks, 0]);
        assert_eq!(m.scored.scores, [0, 100, 0]);
        assert_eq!(m.prompt_bytes, prompt.len());
        assert!(m.engine.is_empty(), "no engine views: the estimate");
        assert!(matches!(
            seen[..],
            [
                Observation::PluginTime {
                    plugin: "prefix-cache",
                    kind: PluginType::Score,
                    ..
                },
                Observation::MatchRatio(r),
            ] if r == 1.0
        ));
    }

    #[test]
    fn no_match_without_the_mode_a_prompt_or_a_block() {
        let mut seen = Vec::new();
        let (kthena, pods) = setup(false);
        assert!(kthena.affinity_match(&req("x"), &pods, &mut seen).is_none());
        let (s, pods) = setup(true);
        let no_prompt = RouteRequest {
            prompt: Err(Unscored::UnknownApi),
            ..req("")
        };
        assert!(s.affinity_match(&no_prompt, &pods, &mut seen).is_none());
        assert!(s.affinity_match(&req(""), &pods, &mut seen).is_none());
        assert!(seen.is_empty(), "nothing observed without a match");
    }
}
