//! Kthena's step 3, score (and the affinity mode's when it has no match): each score plugin in
//! `Score.enabled` order gives 0..=100 per candidate, or nothing (prefix-cache with no prompt, an
//! empty prompt; kvcache-aware not looked up); `total = sum(score x weight)`. Each plugin is
//! timed; prefix-cache observes its match ratio, kvcache-aware its own. Why prefix-cache did not
//! score, when it did not, is kept for the `unscored` metric.

use std::time::Instant;

use rand::rngs::SmallRng;

use crate::hashing::BlockHash;
use crate::scheduler::config::ScorerKind;
use crate::scheduler::{
    Candidate, Observation, PluginScores, PluginType, RouteRequest, Scheduler, Unscored, gpu_usage,
    kvcache_aware, least_latency, least_request, next, random,
};

/// The weighted plugins' scores of one decision.
#[derive(Debug, Default)]
pub(super) struct Weighted {
    pub plugins: Vec<PluginScores>,
    /// Per candidate: the sum of each plugin's score times its weight.
    pub totals: Vec<u64>,
    /// The prompt's block hashes, when prefix-cache hashed it.
    pub hashes: Vec<BlockHash>,
    pub unscored: Option<Unscored>,
    /// kvcache-aware, when it scored: blocks each candidate holds from the first, and the
    /// prompt's blocks.
    pub kv_matched: Option<(Vec<usize>, usize)>,
}

impl Scheduler {
    /// Every score plugin over `candidates`, in order (the random plugin draws from `rng`);
    /// `take` = false leaves the scoring counter as it is.
    pub(super) fn score<C: Candidate>(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[C],
        rng: &mut SmallRng,
        take: bool,
        observations: &mut Vec<Observation>,
    ) -> Weighted {
        let mut w = Weighted {
            plugins: Vec::with_capacity(self.config.scorers.len()),
            totals: vec![0u64; candidates.len()],
            ..Weighted::default()
        };
        for &(kind, weight) in &self.config.scorers {
            let t = Instant::now();
            let scores = self.plugin(kind, request, candidates, rng, take, &mut w, observations);
            observations.push(Observation::PluginTime {
                plugin: kind.as_str(),
                kind: PluginType::Score,
                elapsed: t.elapsed(),
            });
            if let Some(s) = &scores {
                for (total, &score) in w.totals.iter_mut().zip(s) {
                    *total += u64::from(score) * u64::from(weight);
                }
            }
            w.plugins.push(PluginScores {
                plugin: kind.as_str(),
                weight,
                scores,
                fractional: None,
            });
        }
        if !self.prefix_enabled {
            w.unscored = Some(Unscored::PrefixCacheDisabled);
        }
        w
    }

    /// One plugin's scores, or `None` when it returns nothing.
    #[expect(
        clippy::too_many_arguments,
        reason = "one plugin's inputs, each read by some plugin; a struct would only rename them"
    )]
    fn plugin<C: Candidate>(
        &self,
        kind: ScorerKind,
        request: &RouteRequest<'_>,
        candidates: &[C],
        rng: &mut SmallRng,
        take: bool,
        w: &mut Weighted,
        observations: &mut Vec<Observation>,
    ) -> Option<Vec<u32>> {
        match kind {
            ScorerKind::PrefixCache => {
                self.prefix_scores(request, candidates, take, w, observations)
            }
            ScorerKind::LeastRequest => Some(least_request::score(candidates)),
            ScorerKind::GpuUsage => Some(gpu_usage::score(candidates)),
            ScorerKind::LeastLatency => Some(least_latency::score(
                candidates,
                self.config.ttft_tpot_weight_factor,
            )),
            ScorerKind::Random => Some(random::score(candidates, rng)),
            ScorerKind::KvCacheAware => request.kv_blocks.map(|lookup| {
                let scored = kvcache_aware::score(lookup, candidates);
                observations.push(Observation::KvCacheMatchRatio(scored.match_ratio()));
                w.kv_matched = Some((scored.matched.clone(), scored.total));
                scored.scores
            }),
        }
    }

    /// prefix-cache's scores (Kthena's walk, top-k): the prompt hashed into `w.hashes`; `None`,
    /// with the reason in `w.unscored`, without a prompt or for an empty one.
    fn prefix_scores<C: Candidate>(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[C],
        take: bool,
        w: &mut Weighted,
        observations: &mut Vec<Observation>,
    ) -> Option<Vec<u32>> {
        let prompt = match request.prompt {
            Err(reason) => {
                w.unscored = Some(reason);
                return None;
            }
            Ok(prompt) => prompt,
        };
        w.hashes = self.hashes_of(request, prompt);
        let scored = if w.hashes.is_empty() {
            None
        } else {
            let slots: Vec<_> = candidates.iter().map(|e| e.slot()).collect();
            let scoring = next(&self.counters.scorings, take);
            self.prefix.score(request.model, &w.hashes, &slots, scoring)
        };
        match &scored {
            None => w.unscored = Some(Unscored::EmptyPrompt),
            Some(s) => observations.push(Observation::MatchRatio(s.match_ratio())),
        }
        scored.map(|s| s.scores)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;

    use super::*;
    use crate::scheduler::EngineStats;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::test_pod::{Pod, req};

    fn setup(scorers: Vec<(ScorerKind, u32)>) -> (Scheduler, Vec<Arc<Pod>>) {
        let s = Scheduler::new(
            SchedulerConfig {
                scorers,
                ..SchedulerConfig::default()
            },
            5,
            1,
        );
        let pods = (0..2)
            .map(|i| {
                Arc::new(Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: format!("default/pod-{i}"),
                    labels: Default::default(),
                    stats: EngineStats {
                        kv_usage: 0.5 * i as f64,
                        ..EngineStats::default()
                    },
                    recent: RecentPicks::default(),
                    rendezvous: i,
                    engine: None,
                })
            })
            .collect();
        (s, pods)
    }

    fn scored(s: &Scheduler, pods: &[Arc<Pod>], prompt: &str) -> (Weighted, Vec<Observation>) {
        let mut seen = Vec::new();
        let mut rng = SmallRng::seed_from_u64(1);
        let w = s.score(&req(prompt), pods, &mut rng, true, &mut seen);
        (w, seen)
    }

    #[test]
    fn totals_are_the_weighted_sum_of_the_plugins_in_order() {
        let (s, pods) = setup(vec![
            (ScorerKind::GpuUsage, 3),
            (ScorerKind::PrefixCache, 2),
        ]);
        let prompt = "a prompt long enough for a block or two ".repeat(4);
        let (first, _) = scored(&s, &pods, &prompt);
        s.record("m", &first.hashes, &pods[1].handle);
        let (w, seen) = scored(&s, &pods, &prompt);
        let names: Vec<&str> = w.plugins.iter().map(|p| p.plugin).collect();
        assert_eq!(names, ["gpu-usage", "prefix-cache"]);
        let gpu = w.plugins[0].scores.clone().unwrap();
        let prefix = w.plugins[1].scores.clone().unwrap();
        assert_eq!(prefix, [0, 100]);
        let expected: Vec<u64> = (0..2)
            .map(|i| u64::from(gpu[i]) * 3 + u64::from(prefix[i]) * 2)
            .collect();
        assert_eq!(w.totals, expected);
        assert_eq!(w.unscored, None);
        // Each plugin timed, prefix-cache's match ratio before its time.
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1], Observation::MatchRatio(1.0));
    }

    #[test]
    fn prefix_cache_says_why_it_did_not_score() {
        let (s, pods) = setup(vec![(ScorerKind::PrefixCache, 1)]);
        let (w, _) = scored(&s, &pods, "");
        assert_eq!(
            (w.plugins[0].scores.clone(), w.unscored),
            (None, Some(Unscored::EmptyPrompt))
        );
        assert_eq!(w.totals, [0, 0]);
        let (off, pods) = setup(vec![(ScorerKind::GpuUsage, 1)]);
        let (w, _) = scored(&off, &pods, "x");
        assert_eq!(w.unscored, Some(Unscored::PrefixCacheDisabled));
        assert!(w.hashes.is_empty());
    }
}
