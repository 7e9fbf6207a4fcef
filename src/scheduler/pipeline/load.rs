//! Step 4, load: what the affinity pick reads of each candidate, in one pass: its in-flight
//! count, its engine's queue, its share of recent picks and the tokens they wrote, its requests
//! in flight on the prompt's head, and the latency model's wait for a slot or for KV space
//! (the prompt's blocks that no request in flight there pins, against the pod's KV room:
//! [`crate::scheduler::kv_room`]) and the queue it would join. Each engine's stats are read
//! once per pod; its scrape age only when it reported a queue. The predictions (those and the
//! prefill of what a pod does not hold) are derived from the loads when read
//! ([`crate::scheduler::predictions`]).
//!
//! The prefill rate is the one learned over every pod (`latencySignals: prefillFit`), else the
//! prior; a pod that has not learned its concurrency yet borrows the least the pool learned.

use crate::scheduler::affinity::{self, AffinityConfig, PodLoad};
use crate::scheduler::latency::{self, LatencySignal, Pool};
use crate::scheduler::predictions::PredictionBasis;
use crate::scheduler::prefix_cache::PrefixScores;
use crate::scheduler::{Candidate, Scheduler};

/// Every candidate's load (in candidate order), and what their predictions share.
#[derive(Debug)]
pub(super) struct Load {
    pub loads: Vec<PodLoad>,
    pub basis: PredictionBasis,
    /// Some candidate's engine runs with prefix caching off ([`PodLoad::reuses`] false).
    pub some_reuse_nothing: bool,
}

impl Load {
    /// The seconds one uncached block of the prompt costs.
    pub fn prefill_per_block(&self) -> f64 {
        self.basis.seconds_per_token * self.basis.tokens_per_block
    }
}

/// What every candidate's reading shares.
#[derive(Debug, Clone, Copy)]
struct Shared {
    /// The pick clock (picks made), and the share's decay per pick, as a logarithm.
    now: u32,
    ln_keep: f64,
    pool: Pool,
    latency_model: bool,
}

impl Scheduler {
    /// Step 4 over `candidates`, given the match (`scored`) of a prompt of `blocks` blocks. One
    /// pass reads every candidate and the least concurrency the pool learned; the pods that
    /// learned none are read again with it (only while some have and some have not).
    pub(super) fn load<C: Candidate>(
        &self,
        config: &AffinityConfig,
        candidates: &[C],
        scored: &PrefixScores,
        blocks: usize,
    ) -> Load {
        let mut shared = self.load_shared(config, candidates.len());
        let head_inflight = |i: usize| scored.head_inflight.get(i).copied().unwrap_or(0);
        // The blocks the prompt adds to each candidate's KV cache: those no request in flight
        // there pins.
        let adds =
            |i: usize| blocks.saturating_sub(scored.pinned_blocks.get(i).copied().unwrap_or(0));
        let (mut learned, mut unlearned, mut some_reuse_nothing) = (None::<f64>, false, false);
        let mut loads: Vec<PodLoad> = candidates
            .iter()
            .enumerate()
            .map(|(i, e)| {
                match e.timing().map(|t| t.concurrency()) {
                    Some(Some(c)) => learned = Some(learned.map_or(c, |l| l.min(c))),
                    Some(None) => unlearned = true,
                    None => {}
                }
                let l = read(e, head_inflight(i), adds(i), &shared);
                some_reuse_nothing |= !l.reuses;
                l
            })
            .collect();
        if unlearned && learned.is_some() {
            shared.pool.concurrency = learned;
            for (i, e) in candidates.iter().enumerate() {
                if e.timing().is_some_and(|t| t.concurrency().is_none()) {
                    loads[i] = read(e, head_inflight(i), adds(i), &shared);
                }
            }
        }
        let seconds_per_token = if config.latency_signals.has(LatencySignal::PrefillFit) {
            self.counters.prefill.seconds_per_token()
        } else {
            latency::PRIOR_SECONDS_PER_TOKEN
        };
        Load {
            loads,
            some_reuse_nothing,
            basis: PredictionBasis {
                blocks,
                tokens_per_block: self.tokens_per_block(config),
                seconds_per_token,
            },
        }
    }

    /// What every candidate's reading shares, before the pool's concurrency is known.
    fn load_shared(&self, config: &AffinityConfig, candidates: usize) -> Shared {
        let now = self
            .counters
            .picks
            .load(std::sync::atomic::Ordering::Relaxed) as u32;
        let ln_keep = affinity::keep_factor(config.share_window, candidates).ln();
        let pool = Pool {
            concurrency: None,
            service: self.counters.prefill.service(),
            signals: config.latency_signals,
        };
        Shared {
            now,
            ln_keep,
            pool,
            latency_model: config.latency_model,
        }
    }
}

/// One candidate's load, given its requests in flight on the prompt's head and the blocks the
/// prompt would add to its KV cache. Inlined into the
/// pass over the candidates (as a call it cost 6% more instructions per decision at 1,024
/// pods: callgrind, `benches/scale.rs`).
#[inline(always)]
fn read<C: Candidate>(e: &C, head_inflight: u32, adds: usize, shared: &Shared) -> PodLoad {
    let (inflight, waiting) = (e.inflight(), e.waiting());
    let timing = e.timing();
    let (wait, backlog, kv_wait) = match timing {
        Some(t) if shared.latency_model => {
            let age = if waiting > 0.0 { e.stats_age() } else { None };
            let (wait, backlog) = t.queue(inflight, waiting, age, shared.pool, adds as f64);
            let kv_wait = t.kv_wait(inflight, adds as f64, shared.pool.signals) > 0.0;
            (wait, backlog, kv_wait)
        }
        _ => (0.0, 0.0, false),
    };
    let (share, written) = e.recent().share_written_ln(shared.now, shared.ln_keep);
    PodLoad {
        key: e.rendezvous(),
        inflight,
        waiting,
        share,
        head_inflight,
        // A request that waits for KV space times no service.
        has_slot: !kv_wait && timing.is_none_or(|t| t.has_slot(inflight, shared.pool)),
        fill: timing.map_or(0.0, |t| t.fill(inflight, shared.pool)),
        written,
        wait,
        backlog,
        reuses: e.reuses_cache(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::prefix_index::PodSlot;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::latency::PodTiming;
    use crate::scheduler::predictions::Predictions;
    use crate::scheduler::test_pod::Pod;
    use crate::scheduler::{EngineStats, latency::PRIOR_SECONDS_PER_TOKEN};

    /// A scheduler in the affinity mode's defaults, and those defaults.
    fn affinity_scheduler() -> (Scheduler, AffinityConfig) {
        let mut config = SchedulerConfig::default();
        config.apply_affinity(Some(AffinityConfig::DEFAULT));
        let s = Scheduler::new(config, 5, 1);
        let affinity = *s.affinity().unwrap();
        (s, affinity)
    }

    #[test]
    fn each_candidate_is_read_once_with_its_queue_share_and_uncached_prefill() {
        let (s, affinity) = affinity_scheduler();
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
            pinned_blocks: vec![0, 0],
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
        assert!((load.prefill_per_block() - per_block).abs() < 1e-15);
        let predictions = Predictions::new(load.loads.clone(), vec![4, 0], load.basis);
        let uncached: Vec<f64> = predictions.iter().map(|p| p.uncached_tokens).collect();
        assert_eq!(uncached, [6.0 * 32.0, 10.0 * 32.0]);
        assert!(predictions.iter().all(|p| p.wait == 0.0 && p.has_slot));
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

    /// A pod with the latency model's timing, for the pool's concurrency.
    struct Timed {
        inflight: i64,
        timing: PodTiming,
        recent: RecentPicks,
    }

    impl Candidate for Timed {
        fn slot(&self) -> PodSlot {
            PodSlot(0)
        }
        fn inflight(&self) -> i64 {
            self.inflight
        }
        fn stats(&self) -> EngineStats {
            EngineStats::default()
        }
        fn recent(&self) -> &RecentPicks {
            &self.recent
        }
        fn timing(&self) -> Option<&PodTiming> {
            Some(&self.timing)
        }
        fn rendezvous(&self) -> u64 {
            0
        }
        fn label(&self) -> &str {
            "default/timed"
        }
    }

    #[test]
    fn a_pod_that_learned_no_concurrency_borrows_the_least_the_pool_learned() {
        let (s, affinity) = affinity_scheduler();
        // Three requests in flight on each: the first runs 4 at once, the second 2, the third
        // has shown no queue yet.
        let pod = |running: Option<f64>| {
            let timing = PodTiming::default();
            if let Some(running) = running {
                timing.observe_engine(running, 1.0, 0.0);
            }
            Timed {
                inflight: 3,
                timing,
                recent: RecentPicks::default(),
            }
        };
        let scored = |n: usize| PrefixScores {
            scores: vec![0; n],
            matched_blocks: vec![0; n],
            total_blocks: 10,
            held_blocks: vec![0; n],
            head_inflight: vec![0; n],
            pinned_blocks: vec![0; n],
        };
        let read = |pods: &[Timed]| {
            let load = s.load(&affinity, pods, &scored(pods.len()), 10);
            load.loads
                .iter()
                .map(|l| (l.has_slot, l.fill))
                .collect::<Vec<_>>()
        };
        let mixed = [pod(Some(4.0)), pod(Some(2.0)), pod(None)];
        assert_eq!(read(&mixed), [(true, 0.75), (false, 1.5), (false, 1.5)]);
        // Alone, it has learned nothing to borrow: a free slot, no fill.
        assert_eq!(read(&mixed[2..]), [(true, 0.0)]);
        // Learned or not, a pod that learned its own keeps it.
        assert_eq!(read(&mixed[..1]), [(true, 0.75)]);
    }
}
