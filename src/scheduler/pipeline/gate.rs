//! Step 5, gate: which candidates the affinity pick may place on.
//!
//! First the match that counts: a match held only by requests in flight counts when it covers
//! `tentativeMinRatio` of the prompt, or all of it but one block (the same prompt sent again: a
//! burst); a request that adds more than that to a held head is new work and goes by what
//! completed requests left ([`effective`]). Then, per candidate, computed once ([`Gates`]):
//! - *queued*: with the latency model, it predicts a wait; without it, its in-flight count is at
//!   `podCapacity` or its engine queue over `maxQueue`;
//! - *over* its share: its share of recent picks exceeds the mean (at least `1/n`) by more than
//!   `shareHeadroom`, (`spillHotOnly`) the request's head makes up at least half of its
//!   requests in flight, and it is busy: its requests in flight fill `shareBusy` (1; 0: always)
//!   of its engine's slots, as learned from the engine's queue, or (`sharePressure`, 1.5) its
//!   recent picks wrote more than that many times the candidates' mean of uncached prompt
//!   tokens; an over-share pod still keeps a burst in progress that would lose more than
//!   `spillLoss` of the prompt on any other available pod;
//! - *saturated*: with the latency model, it costs (`wait + prefill x (1 + backlog)`) more than
//!   the least among the pods within their share; without it, queued;
//! - *available*: neither saturated nor over its share.
//!
//! A session's pod is the pick while it is not saturated. Without the load gate (`loadGate`
//! off) nothing is queued or over its share.

#[cfg(test)]
use super::tie::least_load;
use super::tie::load;
use crate::scheduler::affinity::{AffinityConfig, AffinityReason, PodLoad};

/// The match that counts, given a candidate's match with holds in flight (`m`) and without
/// them (`h`): `m`, or `h` where the rest is held only in flight and leaves more than
/// `allowed_rest` blocks of the prompt's `total` uncovered.
#[inline(always)]
fn effective(m: usize, h: usize, total: f64, allowed_rest: f64) -> usize {
    if m > h && total - m as f64 > allowed_rest {
        h
    } else {
        m
    }
}

/// One candidate's gates, each computed once (the placement reads them several times per
/// candidate; as closures they cost a third of the pick at 1,024 pods).
#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    queued: bool,
    over: bool,
    share_ok: bool,
    saturated: bool,
    cost: f64,
}

/// Every candidate's effective match and gates, the share limit they were judged by, and what
/// the placement reads of them all, from four passes over the candidates (as separate steps
/// the pick made a dozen; benches/RESULTS.md, "Cost growth with the pool").
#[derive(Debug)]
pub(super) struct Gates {
    /// The match that counts, per candidate.
    matched: Vec<usize>,
    gates: Vec<Gate>,
    /// `(1 + shareHeadroom) x` the mean share (at least `1/n`): above it a pod is over-share.
    limit: f64,
    /// With the latency model: every candidate predicts a wait.
    all_wait: bool,
    /// The longest match over every candidate.
    best_all: usize,
    /// The longest match among the available candidates, and the least load (in flight plus
    /// engine queue) among the available candidates holding it; `None`: none is available.
    best_available: Option<(usize, f64)>,
}

impl Gates {
    /// The gates of each candidate, from its match with holds in flight (`matched`), without
    /// them (`held`), its load, the prompt's block count and the seconds one uncached block
    /// costs.
    pub(super) fn new(
        config: &AffinityConfig,
        matched: &[usize],
        held: &[usize],
        loads: &[PodLoad],
        blocks: usize,
        prefill_per_block: f64,
    ) -> Gates {
        debug_assert!(matched.len() == held.len() && held.len() == loads.len());
        let n = matched.len();
        let latency = config.load_gate && config.latency_model;
        let total = blocks as f64;
        // 1. The match that counts; the shares' and writes' sums; the longest match.
        let allowed_rest = ((1.0 - config.tentative_min_ratio) * total).max(1.0);
        let (mut shares, mut written, mut best_all) = (0.0, 0.0, 0);
        let effective: Vec<usize> = matched
            .iter()
            .zip(held)
            .zip(loads)
            .map(|((&m, &h), l)| {
                shares += l.share;
                written += l.written;
                let e = effective(m, h, total, allowed_rest);
                best_all = best_all.max(e);
                e
            })
            .collect();
        let limit = (1.0 + config.share_headroom) * (shares / n as f64).max(1.0 / n as f64);
        let pressed = if config.share_pressure > 0.0 {
            config.share_pressure * written / n as f64
        } else {
            f64::INFINITY
        };
        // 2. Queued and over-share; the longest match elsewhere (on pods neither).
        let mut elsewhere = 0;
        let mut gates: Vec<Gate> = loads
            .iter()
            .zip(&effective)
            .map(|(l, &m)| {
                let queued = queued(config, l);
                let over = config.load_gate
                    && n > 1
                    && l.share > limit
                    && hot(config, l)
                    && busy(config, l, pressed);
                if !queued && !over {
                    elsewhere = elsewhere.max(m);
                }
                Gate {
                    queued,
                    over,
                    ..Gate::default()
                }
            })
            .collect();
        // 3. An over-share pod keeps a burst in progress that would lose more than
        // `spillLoss`; with the latency model each pod's cost and the least.
        let spill_loss = config.spill_loss * total;
        let (mut least_within, mut least_all) = (f64::INFINITY, f64::INFINITY);
        let mut all_wait = latency;
        for (i, g) in gates.iter_mut().enumerate() {
            let m = effective[i];
            let keeps = m > held[i] && m.saturating_sub(elsewhere) as f64 > spill_loss;
            g.share_ok = !g.over || keeps;
            if latency {
                let l = &loads[i];
                g.cost = l.wait + (total - m as f64) * prefill_per_block * (1.0 + l.backlog);
                all_wait &= g.queued;
                least_all = least_all.min(g.cost);
                if g.share_ok {
                    least_within = least_within.min(g.cost);
                }
            }
        }
        // 4. Saturated: with the latency model a cost above the least among the pods within
        // their share (among all when none is); without it, queued. The longest match on an
        // available pod, and the least load among those holding it.
        let least = if least_within.is_finite() {
            least_within
        } else {
            least_all
        };
        let mut best_available: Option<(usize, f64)> = None;
        for (i, g) in gates.iter_mut().enumerate() {
            g.saturated = if latency {
                g.cost > least + 1e-9 * least.abs()
            } else {
                g.queued
            };
            if g.saturated || !g.share_ok {
                continue;
            }
            let (m, load) = (effective[i], load(loads, i));
            // As `f64::min` folds from infinity (a NaN load never is the least).
            best_available = match best_available {
                Some((best, _)) if m < best => best_available,
                Some((best, least)) if m == best => Some((best, least.min(load))),
                _ => Some((m, f64::INFINITY.min(load))),
            };
        }
        Gates {
            matched: effective,
            gates,
            limit,
            all_wait,
            best_all,
            best_available,
        }
    }

    /// The match that counts, per candidate.
    pub(super) fn matched(&self) -> &[usize] {
        &self.matched
    }

    /// The longest match over every candidate.
    pub(super) fn best_all(&self) -> usize {
        self.best_all
    }

    /// The longest match among the available candidates and the least load among those
    /// holding it; `None` when none is available.
    pub(super) fn best_available(&self) -> Option<(usize, f64)> {
        self.best_available
    }

    pub(super) fn saturated(&self, i: usize) -> bool {
        self.gates[i].saturated
    }

    pub(super) fn available(&self, i: usize) -> bool {
        !self.gates[i].saturated && self.gates[i].share_ok
    }

    pub(super) fn share_limit(&self) -> f64 {
        self.limit
    }

    /// The session's pod, while it is a candidate and not saturated (over its share or not).
    pub(super) fn session(&self, session: Option<usize>) -> Option<usize> {
        session.filter(|&i| i < self.gates.len() && !self.saturated(i))
    }

    /// `affinity_saturated` for the placed pick when, with the latency model, it waits in a
    /// queue because every pod would; else the placement's reason.
    pub(super) fn reason(
        &self,
        loads: &[PodLoad],
        (i, why): (usize, AffinityReason),
    ) -> (usize, AffinityReason) {
        if self.all_wait && loads[i].wait > 0.0 {
            return (i, AffinityReason::Saturated);
        }
        (i, why)
    }
}

#[cfg(test)]
impl Gates {
    /// Gates as a test states them: candidate `i` available or saturated as the closures say
    /// (an unavailable pod that is not saturated is over its share), the share limit `limit`;
    /// the placement's summaries found from them.
    pub(super) fn given(
        matched: &[usize],
        loads: &[PodLoad],
        available: impl Fn(usize) -> bool,
        saturated: impl Fn(usize) -> bool,
        limit: f64,
    ) -> Gates {
        let gates: Vec<Gate> = (0..matched.len())
            .map(|i| Gate {
                saturated: saturated(i),
                share_ok: available(i) || saturated(i),
                ..Gate::default()
            })
            .collect();
        let pool = || (0..matched.len()).filter(|&i| available(i));
        let best_available = pool().map(|i| matched[i]).max().map(|best| {
            let least = least_load(pool().filter(|&i| matched[i] == best), loads);
            (best, least)
        });
        Gates {
            matched: matched.to_vec(),
            gates,
            limit,
            all_wait: false,
            best_all: matched.iter().copied().max().unwrap_or(0),
            best_available,
        }
    }
}

/// Queued: with the latency model a predicted wait; without it, in flight at `podCapacity` or
/// an engine queue over `maxQueue`; never without the load gate.
fn queued(config: &AffinityConfig, l: &PodLoad) -> bool {
    if config.load_gate && config.latency_model {
        l.wait > 0.0
    } else {
        config.load_gate
            && (l.waiting > f64::from(config.max_queue)
                || l.inflight >= i64::from(config.pod_capacity))
    }
}

/// Whether the pod is busy enough for the share gate: its requests in flight fill at least
/// `shareBusy` of its engine's concurrency (always with `shareBusy` 0), or (`sharePressure`) its
/// recent picks wrote more uncached tokens than `pressed`.
fn busy(config: &AffinityConfig, l: &PodLoad, pressed: f64) -> bool {
    l.fill >= config.share_busy || (l.written > 0.0 && l.written > pressed)
}

/// Whether the request's head drives the pod's load (half its requests in flight or more).
/// Holds are what show a prefix in flight: without `tentative` every prefix counts as hot.
fn hot(config: &AffinityConfig, l: &PodLoad) -> bool {
    !(config.spill_hot_only && config.tentative)
        || i64::from(l.head_inflight) * 2 >= l.inflight.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod whose requests in flight fill its engine's slots (`fill` 1: the share gate may act).
    fn load(inflight: i64, waiting: f64, share: f64) -> PodLoad {
        PodLoad {
            key: 0,
            inflight,
            waiting,
            share,
            head_inflight: 0,
            has_slot: true,
            fill: 1.0,
            written: 0.0,
            wait: 0.0,
            backlog: 0.0,
            reuses: true,
        }
    }

    /// `latencyModel: false`: the gates of `podCapacity` and `maxQueue`.
    const COUNTS: AffinityConfig = AffinityConfig {
        latency_model: false,
        ..AffinityConfig::DEFAULT
    };

    #[test]
    fn a_match_held_only_in_flight_counts_when_it_covers_most_of_the_prompt() {
        let c = AffinityConfig::DEFAULT; // tentativeMinRatio 0.9: 1 of 10 blocks may be missing
        let effective = |matched: &[usize], held: &[usize], blocks: usize| {
            let loads = vec![load(0, 0.0, 0.0); matched.len()];
            Gates::new(&c, matched, held, &loads, blocks, 0.0)
                .matched()
                .to_vec()
        };
        assert_eq!(effective(&[9, 5, 4], &[2, 5, 0], 10), [9, 5, 0]);
        // A short prompt: all of it but one block.
        assert_eq!(effective(&[2, 1], &[0, 0], 3), [2, 0]);
    }

    #[test]
    fn without_the_latency_model_a_full_pod_or_a_queue_saturates() {
        let loads = [load(64, 0.0, 0.0), load(0, 1.0, 0.0), load(63, 0.0, 0.0)];
        let g = Gates::new(&COUNTS, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert_eq!(
            (0..3).map(|i| g.saturated(i)).collect::<Vec<_>>(),
            [true, true, false]
        );
        let open = AffinityConfig {
            load_gate: false,
            ..COUNTS
        };
        let g = Gates::new(&open, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(
            (0..3).all(|i| g.available(i)),
            "no load gate: all available"
        );
    }

    #[test]
    fn over_share_pods_are_unavailable_but_not_saturated() {
        // Mean share 0.4, limit 1.25 x 0.4 = 0.5; pod 0 is over it, its prefix hot.
        let mut loads = [load(1, 0.0, 0.9), load(0, 0.0, 0.2), load(0, 0.0, 0.1)];
        loads[0].head_inflight = 1;
        let g = Gates::new(&COUNTS, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!((g.share_limit() - 0.5).abs() < 1e-12);
        assert!(!g.available(0) && !g.saturated(0));
        assert!(g.available(1) && g.available(2));
        // A session stays on its over-share pod; a saturated one it leaves.
        assert_eq!(g.session(Some(0)), Some(0));
        loads[0].inflight = 64;
        let g = Gates::new(&COUNTS, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert_eq!(g.session(Some(0)), None);
        assert_eq!(g.session(Some(7)), None, "not a candidate");
    }

    #[test]
    fn with_share_busy_only_a_pod_that_fills_its_slots_spills_for_its_share() {
        // Pod 0 is over its share with its prefix hot, as above.
        let mut loads = [load(1, 0.0, 0.9), load(0, 0.0, 0.2), load(0, 0.0, 0.1)];
        loads[0].head_inflight = 1;
        let busy = AffinityConfig {
            share_busy: 1.0,
            ..COUNTS
        };
        // Half of its engine's slots in flight (or no concurrency known: 0): it keeps its
        // prefixes.
        for fill in [0.0, 0.5] {
            loads[0].fill = fill;
            let g = Gates::new(&busy, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
            assert!(g.available(0), "fill {fill}");
        }
        // Every slot: the share gate acts.
        loads[0].fill = 1.0;
        let g = Gates::new(&busy, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(!g.available(0) && !g.saturated(0));
        // `shareBusy` 0: whatever the fill.
        loads[0].fill = 0.0;
        let always = AffinityConfig {
            share_busy: 0.0,
            ..COUNTS
        };
        let g = Gates::new(&always, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(!g.available(0));
    }

    #[test]
    fn with_share_pressure_a_pod_that_writes_more_than_the_pool_spills_for_its_share() {
        // Pod 0 is over its share with its prefix hot, its slots half full (not busy by them).
        let mut loads = [load(1, 0.0, 0.9), load(0, 0.0, 0.2), load(0, 0.0, 0.1)];
        loads[0].head_inflight = 1;
        loads[0].fill = 0.5;
        let pressed = AffinityConfig {
            share_busy: 1.0,
            share_pressure: 1.5,
            ..COUNTS
        };
        // Its picks wrote what the others' did (its hot prefix was cached): it keeps them.
        for (i, written) in [300.0, 300.0, 300.0].into_iter().enumerate() {
            loads[i].written = written;
        }
        let g = Gates::new(&pressed, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(g.available(0));
        // It wrote 2.25x the mean (1200 of 1600 over 3 pods): above 1.5x, the share gate acts.
        loads[0].written = 1200.0;
        loads[1].written = 400.0;
        loads[2].written = 0.0;
        let g = Gates::new(&pressed, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(!g.available(0) && !g.saturated(0));
        // Within its share, writing is no reason to spill.
        loads[0].share = 0.3;
        let g = Gates::new(&pressed, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(g.available(0));
        // `sharePressure` 0: writes are not read.
        loads[0].share = 0.9;
        let off = AffinityConfig {
            share_pressure: 0.0,
            ..pressed
        };
        let g = Gates::new(&off, &[0, 0, 0], &[0, 0, 0], &loads, 4, 0.0);
        assert!(g.available(0));
    }

    #[test]
    fn an_over_share_pod_keeps_a_burst_that_would_lose_much_elsewhere() {
        // Pod 0 holds 8 of 8 blocks, 6 only in flight; elsewhere at most 2: it keeps the burst.
        let loads = [load(2, 0.0, 0.9), load(0, 0.0, 0.0)];
        let mut hot = loads;
        hot[0].head_inflight = 2;
        let g = Gates::new(&COUNTS, &[8, 2], &[2, 2], &hot, 8, 0.0);
        assert!(g.available(0));
        // Held by completed requests alone, it is no burst: it spills.
        let g = Gates::new(&COUNTS, &[8, 2], &[8, 2], &hot, 8, 0.0);
        assert!(!g.available(0));
    }

    #[test]
    fn with_the_latency_model_a_pod_costing_more_than_the_least_saturates() {
        let c = AffinityConfig::DEFAULT;
        // Pod 0 holds all 10 blocks but waits 1 s; pod 1 holds 5, idle, at 0.1 s per block.
        let mut loads = [load(0, 0.0, 0.0), load(0, 0.0, 0.0)];
        loads[0].wait = 1.0;
        let g = Gates::new(&c, &[10, 5], &[10, 5], &loads, 10, 0.1);
        assert!(g.saturated(0) && g.available(1));
        // Cheap prefill: its queue costs less than the blocks it saves.
        let g = Gates::new(&c, &[10, 5], &[10, 5], &loads, 10, 0.3);
        assert!(g.available(0) && g.saturated(1));
    }

    #[test]
    fn a_pick_waits_as_saturated_only_when_every_pod_waits() {
        let c = AffinityConfig::DEFAULT;
        let mut loads = [load(0, 0.0, 0.0), load(0, 0.0, 0.0)];
        loads[0].wait = 0.5;
        let hit = (0, AffinityReason::Hit);
        let gates = |config: &AffinityConfig, loads: &[PodLoad]| {
            Gates::new(config, &[2, 0], &[2, 0], loads, 2, 0.0)
        };
        assert_eq!(gates(&c, &loads).reason(&loads, hit), hit);
        loads[1].wait = 0.1;
        let saturated = (0, AffinityReason::Saturated);
        assert_eq!(gates(&c, &loads).reason(&loads, hit), saturated);
        assert_eq!(
            gates(&c, &loads)
                .reason(&loads, (1, AffinityReason::Spill))
                .1,
            saturated.1
        );
        assert_eq!(gates(&COUNTS, &loads).reason(&loads, hit), hit, "no model");
    }
}
