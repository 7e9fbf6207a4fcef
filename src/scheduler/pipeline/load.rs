//! Step 4, load: what the affinity pick reads of each candidate, in one pass: its in-flight
//! count, its engine's queue, its share of recent picks and the tokens they wrote, its requests
//! in flight on the prompt's head, and the latency model's prediction (wait for a slot, the
//! queue it would join, the prefill of what it does not hold). Each engine's stats are read once
//! per pod; its scrape age only when it reported a queue.
//!
//! The prefill rate is the one learned over every pod (`latencySignals: prefillFit`), else the
//! prior; a pod that has not learned its concurrency yet borrows the least the pool learned.

use crate::scheduler::affinity::{self, AffinityConfig, PodLoad};
use crate::scheduler::latency::{self, LatencySignal, Pool, Prediction};
use crate::scheduler::prefix_cache::PrefixScores;
use crate::scheduler::{Candidate, Scheduler};

/// Every candidate's load and prediction (in candidate order), and the seconds one uncached
/// block of the prompt costs.
#[derive(Debug)]
pub(super) struct Load {
    pub loads: Vec<PodLoad>,
    pub predictions: Vec<Prediction>,
    pub prefill_per_block: f64,
}

/// What every candidate's reading shares.
#[derive(Debug, Clone, Copy)]
struct Shared {
    /// The pick clock (picks made), and the share's decay per pick, as a logarithm.
    now: u32,
    ln_keep: f64,
    per_token: f64,
    tokens_per_block: f64,
    pool: Pool,
    latency_model: bool,
    blocks: usize,
}

impl Scheduler {
    /// Step 4 over `candidates`, given the match (`scored`) of a prompt of `blocks` blocks.
    pub(super) fn load<C: Candidate>(
        &self,
        config: &AffinityConfig,
        candidates: &[C],
        scored: &PrefixScores,
        blocks: usize,
    ) -> Load {
        let shared = self.load_shared(config, candidates, blocks);
        let mut predictions = Vec::with_capacity(candidates.len());
        let loads = candidates
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let head_inflight = scored.head_inflight.get(i).copied().unwrap_or(0);
                let (load, prediction) = read(e, scored.matched_blocks[i], head_inflight, &shared);
                predictions.push(prediction);
                load
            })
            .collect();
        Load {
            loads,
            predictions,
            prefill_per_block: shared.per_token * shared.tokens_per_block,
        }
    }

    fn load_shared<C: Candidate>(
        &self,
        config: &AffinityConfig,
        candidates: &[C],
        blocks: usize,
    ) -> Shared {
        let now = self
            .counters
            .picks
            .load(std::sync::atomic::Ordering::Relaxed) as u32;
        let ln_keep = affinity::keep_factor(config.share_window, candidates.len()).ln();
        let per_token = if config.latency_signals.has(LatencySignal::PrefillFit) {
            self.counters.prefill.seconds_per_token()
        } else {
            latency::PRIOR_SECONDS_PER_TOKEN
        };
        let pool = Pool {
            concurrency: candidates
                .iter()
                .filter_map(|e| e.timing()?.concurrency())
                .reduce(f64::min),
            service: self.counters.prefill.service(),
            signals: config.latency_signals,
        };
        Shared {
            now,
            ln_keep,
            per_token,
            tokens_per_block: self.tokens_per_block(config),
            pool,
            latency_model: config.latency_model,
            blocks,
        }
    }
}

/// One candidate's load and prediction, given the blocks it matched and its requests in flight
/// on the prompt's head. Inlined into the pass over the candidates (as a call it cost 6% more
/// instructions per decision at 1,024 pods: callgrind, `benches/scale.rs`).
#[inline(always)]
fn read<C: Candidate>(
    e: &C,
    matched: usize,
    head_inflight: u32,
    shared: &Shared,
) -> (PodLoad, Prediction) {
    let (inflight, waiting) = (e.inflight(), e.waiting());
    let uncached_tokens = shared.blocks.saturating_sub(matched) as f64 * shared.tokens_per_block;
    let timing = e.timing();
    let (wait, backlog) = match timing {
        Some(t) if shared.latency_model => {
            let age = if waiting > 0.0 { e.stats_age() } else { None };
            t.queue(inflight, waiting, age, shared.pool)
        }
        _ => (0.0, 0.0),
    };
    let prediction = Prediction {
        wait,
        backlog,
        prefill: uncached_tokens * shared.per_token,
        uncached_tokens,
        has_slot: timing.is_none_or(|t| t.has_slot(inflight, shared.pool)),
        running: inflight as f64,
    };
    let (share, written) = e.recent().share_written_ln(shared.now, shared.ln_keep);
    let load = PodLoad {
        key: e.rendezvous(),
        inflight,
        waiting,
        share,
        head_inflight,
        fill: timing.map_or(0.0, |t| t.fill(inflight, shared.pool)),
        written,
        wait,
        backlog,
    };
    (load, prediction)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::test_pod::Pod;
    use crate::scheduler::{EngineStats, latency::PRIOR_SECONDS_PER_TOKEN};

    #[test]
    fn each_candidate_is_read_once_with_its_queue_share_and_uncached_prefill() {
        let mut config = SchedulerConfig::default();
        config.apply_affinity(Some(AffinityConfig::DEFAULT));
        let s = Scheduler::new(config, 5, 1);
        let affinity = *s.affinity().unwrap();
        let pods: Vec<Arc<Pod>> = (0..2)
            .map(|i| {
                Arc::new(Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: format!("default/pod-{i}"),
                    labels: Default::default(),
                    stats: EngineStats {
                        waiting: i as f64 * 3.0,
                        ..EngineStats::default()
                    },
                    recent: RecentPicks::default(),
                    rendezvous: 40 + i,
                    engine: None,
                })
            })
            .collect();
        // 10 blocks: pod 0 holds 4, pod 1 none; 2 requests in flight share pod 1's head.
        let scored = PrefixScores {
            scores: vec![40, 0],
            matched_blocks: vec![4, 0],
            total_blocks: 10,
            held_blocks: vec![4, 0],
            head_inflight: vec![0, 2],
        };
        let load = s.load(&affinity, &pods, &scored, 10);
        let keys: Vec<(u64, f64, u32, f64)> = load
            .loads
            .iter()
            .map(|l| (l.key, l.waiting, l.head_inflight, l.share))
            .collect();
        assert_eq!(keys, [(40, 0.0, 0, 0.0), (41, 3.0, 2, 0.0)]);
        // 128-byte blocks of 4 bytes a token: 32 tokens a block, at the prior rate.
        let per_block = 32.0 * PRIOR_SECONDS_PER_TOKEN;
        assert!((load.prefill_per_block - per_block).abs() < 1e-15);
        let uncached: Vec<f64> = load.predictions.iter().map(|p| p.uncached_tokens).collect();
        assert_eq!(uncached, [6.0 * 32.0, 10.0 * 32.0]);
        assert!(load.predictions.iter().all(|p| p.wait == 0.0 && p.has_slot));
        // No engine has shown its concurrency: no pod counts as filling its slots.
        assert!(load.loads.iter().all(|l| l.fill == 0.0));
        // Pick 0, on pod 1, wrote 320 tokens: read with its share at the pick clock's next step.
        pods[1].recent.add(0, 0.5, 320.0);
        s.counters
            .picks
            .store(1, std::sync::atomic::Ordering::Relaxed);
        let load = s.load(&affinity, &pods, &scored, 10);
        let read: Vec<(bool, bool)> = load
            .loads
            .iter()
            .map(|l| (l.share > 0.0, l.written > 0.0))
            .collect();
        assert_eq!(read, [(false, false), (true, true)]);
    }
}
