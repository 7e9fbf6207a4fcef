use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::scheduler::affinity::rendezvous_key;

/// `n` idle pods ([`loads_in_flight`]).
fn loads(n: usize) -> Vec<PodLoad> {
    loads_in_flight(&vec![0; n])
}

/// Pods `10.0.0.{i}:8000` with `inflight[i]` requests in flight and nothing else (no engine
/// queue, share or wait): the load fixture of the pipeline's tests and of its steps' tests.
pub(super) fn loads_in_flight(inflight: &[i64]) -> Vec<PodLoad> {
    inflight
        .iter()
        .enumerate()
        .map(|(i, &inflight)| PodLoad {
            key: rendezvous_key(&format!("10.0.0.{i}:8000").parse().unwrap()),
            inflight,
            waiting: 0.0,
            share: 0.0,
            head_inflight: 0,
            has_slot: true,
            fill: 0.0,
            written: 0.0,
            wait: 0.0,
            backlog: 0.0,
            reuses: true,
        })
        .collect()
}

/// [`loads`] with each pod's recent share, every pod's engine slots full (`fill` 1: busy
/// enough for the share gate).
fn with_shares(shares: &[f64]) -> Vec<PodLoad> {
    let mut l = loads(shares.len());
    for (p, &share) in l.iter_mut().zip(shares) {
        p.share = share;
        p.fill = 1.0;
    }
    l
}

/// The gates of `latencyModel: false` (`podCapacity`, `maxQueue`).
const GATES: AffinityConfig = AffinityConfig {
    latency_model: false,
    ..AffinityConfig::DEFAULT
};

fn hashes(n: u64) -> Vec<BlockHash> {
    (1..=n).map(BlockHash).collect()
}

/// [`pick`] of a match held whole in the index, without a session, churn or latency model.
fn pick_one(
    config: &AffinityConfig,
    matched: &[usize],
    loads: &[PodLoad],
    h: &[BlockHash],
) -> (usize, AffinityReason) {
    pick_held(config, matched, matched, loads, h, 7)
}

/// [`pick`] without a session, churn or latency model: of each pod's `matched` blocks,
/// `held` are in the index (the rest in flight only); ties drawn from `seed`.
fn pick_held(
    config: &AffinityConfig,
    matched: &[usize],
    held: &[usize],
    loads: &[PodLoad],
    h: &[BlockHash],
    seed: u64,
) -> (usize, AffinityReason) {
    pick(
        config,
        matched,
        held,
        loads,
        h,
        None,
        &|_| 0.0,
        0.0,
        &mut SmallRng::seed_from_u64(seed),
    )
}

#[test]
fn the_longest_match_wins_whatever_the_load_while_the_pod_has_room() {
    let c = AffinityConfig::default();
    // Busier and above the mean share, but within the headroom (limit 1.25 x 0.25).
    let mut l = with_shares(&[0.24, 0.24, 0.28, 0.24]);
    l[2].inflight = 40;
    assert_eq!(
        pick_one(&c, &[1, 0, 8, 3], &l, &hashes(8)),
        (2, AffinityReason::Hit)
    );
}

#[test]
fn a_saturated_pod_loses_affinity_and_the_prefix_spills() {
    let c = GATES;
    let mut l = loads(4);
    l[2].waiting = 1.0;
    l[1].inflight = 3;
    // Pod 0 holds part of the prompt: the spill goes there.
    assert_eq!(
        pick_one(&c, &[2, 0, 8, 0], &l, &hashes(8)),
        (0, AffinityReason::Spill)
    );
    // Nobody else holds any of it: the least-loaded available pod (0 and 3 tie on load).
    let (i, why) = pick_one(&c, &[0, 0, 8, 0], &l, &hashes(8));
    assert!(i == 0 || i == 3, "{i}");
    assert_eq!(why, AffinityReason::Spill);
    // At capacity counts as saturated too.
    let mut l = loads(2);
    l[0].inflight = i64::from(c.pod_capacity);
    assert_eq!(
        pick_one(&c, &[8, 0], &l, &hashes(8)).1,
        AffinityReason::Spill
    );
}

#[test]
fn an_over_share_pod_spills_and_the_mean_has_a_floor() {
    let c = AffinityConfig {
        spill_hot_only: false,
        ..AffinityConfig::default()
    };
    let l = with_shares(&[0.7, 0.1, 0.1, 0.1]);
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)).1,
        AffinityReason::Spill
    );
    // Early on (shares far below 1/n) a pod with a few picks is not over its share.
    let mut l = loads(4);
    l[0].share = 0.06;
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)),
        (0, AffinityReason::Hit)
    );
}

#[test]
fn without_the_load_gate_the_match_always_wins() {
    let c = AffinityConfig {
        load_gate: false,
        ..AffinityConfig::default()
    };
    let mut l = loads(3);
    l[1].waiting = 50.0;
    l[1].share = 0.9;
    assert_eq!(
        pick_one(&c, &[0, 5, 1], &l, &hashes(8)),
        (1, AffinityReason::Hit)
    );
}

#[test]
fn everything_saturated_goes_to_the_least_loaded() {
    let c = GATES;
    let mut l = loads(3);
    for (i, p) in l.iter_mut().enumerate() {
        p.waiting = 5.0 - i as f64;
    }
    assert_eq!(
        pick_one(&c, &[4, 0, 0], &l, &hashes(8)),
        (2, AffinityReason::Saturated)
    );
}

#[test]
fn ties_consolidate_on_the_deepest_block_held() {
    let c = AffinityConfig::default();
    let l = loads(8);
    // Any rng, any continuation past the shared 4 blocks: the same pod.
    let picks: Vec<_> = (0..20u64)
        .map(|s| {
            let mut h = hashes(4);
            h.extend((0..4).map(|j| BlockHash(1000 + s * 10 + j)));
            pick_held(
                &c,
                &[4, 4, 4, 0, 4, 4, 4, 4],
                &[4, 4, 4, 0, 4, 4, 4, 4],
                &l,
                &h,
                s,
            )
            .0
        })
        .collect();
    assert!(picks.iter().all(|&p| p == picks[0] && p != 3), "{picks:?}");
    // Different prefixes spread over the pods.
    let seen: std::collections::HashSet<_> = (0..64u64)
        .map(|k| pick_one(&c, &[0; 8], &l, &[BlockHash(k * 77 + 5)]).0)
        .collect();
    assert!(seen.len() >= 6, "{seen:?}");
}

#[test]
fn without_consolidation_ties_are_random() {
    let c = AffinityConfig {
        consolidate_ties: false,
        ..AffinityConfig::default()
    };
    let l = loads(4);
    let seen: std::collections::HashSet<_> = (0..64)
        .map(|s| pick_held(&c, &[2, 2, 2, 2], &[2, 2, 2, 2], &l, &hashes(4), s).0)
        .collect();
    assert_eq!(seen.len(), 4);
}

#[test]
fn a_match_held_only_in_flight_counts_when_it_covers_most_of_the_prompt() {
    let c = AffinityConfig::default();
    let l = loads(2);
    let h = hashes(10);
    // Pod 1 holds 9 of 10 blocks in flight only: the same prompt again, it follows.
    assert_eq!(
        pick_held(&c, &[0, 9], &[0, 0], &l, &h, 1),
        (1, AffinityReason::Hit)
    );
    // 8 of 10 in flight only: new work after a shared head, placed as a miss.
    assert_eq!(
        pick_held(&c, &[0, 8], &[0, 0], &l, &h, 1).1,
        AffinityReason::Miss
    );
    // The same 8 blocks completed (in the index) attract as usual.
    assert_eq!(pick_one(&c, &[0, 8], &l, &h), (1, AffinityReason::Hit));
}

#[test]
fn a_burst_in_progress_stays_on_an_over_share_pod_new_work_does_not() {
    // Every prefix on an over-share pod may spill (the hot-only rule has its own test).
    let c = AffinityConfig {
        spill_hot_only: false,
        ..GATES
    };
    let mut l = with_shares(&[0.5, 0.16, 0.16, 0.16]);
    // Pod 0 holds the prompt only through requests in flight (held 0): the burst stays.
    assert_eq!(
        pick_held(&c, &[8, 0, 0, 0], &[0, 0, 0, 0], &l, &hashes(8), 1),
        (0, AffinityReason::Hit)
    );
    // The same match from the index (completed requests): the over-share pod spills it.
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)).1,
        AffinityReason::Spill
    );
    // Saturated is saturated, burst or not.
    l[0].waiting = 1.0;
    assert_eq!(
        pick_held(&c, &[8, 0, 0, 0], &[0, 0, 0, 0], &l, &hashes(8), 1).1,
        AffinityReason::Spill
    );
}

/// Pod 0 holds all 8 blocks at a 0.7 share against three pods at 0.1, its engine's slots half
/// full: `loads` with `set` applied, then the pick under `config` (`spillHotOnly` off).
fn idle_over_share_pick(
    config: AffinityConfig,
    set: impl FnOnce(&mut [PodLoad]),
) -> (usize, AffinityReason) {
    let mut l = with_shares(&[0.7, 0.1, 0.1, 0.1]);
    l[0].fill = 0.5;
    set(&mut l);
    let c = AffinityConfig {
        spill_hot_only: false,
        ..config
    };
    pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8))
}

#[test]
fn with_share_busy_an_over_share_pod_with_free_slots_keeps_its_prefixes() {
    let c = AffinityConfig {
        share_busy: 1.0,
        ..AffinityConfig::default()
    };
    assert_eq!(idle_over_share_pick(c, |_| {}), (0, AffinityReason::Hit));
    // Where the engine's slots are full, it spills.
    let full = idle_over_share_pick(c, |l| l[0].fill = 1.0);
    assert_eq!(full.1, AffinityReason::Spill);
}

#[test]
fn by_default_an_idle_over_share_pod_spills_only_while_it_writes_more_than_the_pool() {
    // Free slots: the share gate rests unless the pod's picks write (prefill and cache) more
    // than 1.5x the candidates' mean of uncached tokens.
    let c = AffinityConfig::default();
    assert_eq!((c.share_busy, c.share_pressure), (1.0, 1.5));
    // A tenant's prompt it holds: its requests write their questions, as elsewhere.
    let alike = |l: &mut [PodLoad]| l.iter_mut().for_each(|p| p.written = 100.0);
    assert_eq!(idle_over_share_pick(c, alike), (0, AffinityReason::Hit));
    // Sessions behind a shared preamble: each writes its own history there, 3x the mean.
    let pressed = idle_over_share_pick(c, |l| {
        alike(l);
        l[0].written = 1300.0;
    });
    assert_eq!(pressed.1, AffinityReason::Spill);
}

#[test]
fn an_over_share_pod_spills_only_the_prefix_that_drives_its_load() {
    let c = AffinityConfig {
        spill_hot_only: true,
        ..AffinityConfig::default()
    };
    let mut l = with_shares(&[0.7, 0.1, 0.1, 0.1]);
    l[0].inflight = 6;
    // A cold prefix (1 of the pod's 6 requests in flight) stays where its blocks are.
    l[0].head_inflight = 1;
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)),
        (0, AffinityReason::Hit)
    );
    // The prefix that makes up half of them spills.
    l[0].head_inflight = 3;
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)).1,
        AffinityReason::Spill
    );
    // Without decision-time records nothing shows a prefix in flight: every prefix spills.
    let c = AffinityConfig {
        tentative: false,
        ..c
    };
    l[0].head_inflight = 0;
    assert_eq!(
        pick_one(&c, &[8, 0, 0, 0], &l, &hashes(8)).1,
        AffinityReason::Spill
    );
}

#[test]
fn new_prefixes_go_to_the_least_recent_share_among_the_least_loaded() {
    let c = AffinityConfig {
        balance_new: true,
        ..AffinityConfig::default()
    };
    let mut l = with_shares(&[0.4, 0.3, 0.05, 0.25]);
    // Every new prefix goes to pod 2, whatever its first block.
    for k in 0..32u64 {
        assert_eq!(
            pick_one(&c, &[0; 4], &l, &[BlockHash(k * 77 + 5)]),
            (2, AffinityReason::Miss)
        );
    }
    // Unless pod 2 is busier than the slack allows: then the least share of the others.
    l[2].inflight = i64::from(c.tie_load_slack) + 1;
    assert_eq!(pick_one(&c, &[0; 4], &l, &hashes(4)).0, 3);
    // At equal shares, new prefixes still spread (rendezvous on the first block).
    let l = loads(8);
    let seen: std::collections::HashSet<_> = (0..64u64)
        .map(|k| pick_one(&c, &[0; 8], &l, &[BlockHash(k * 77 + 5)]).0)
        .collect();
    assert!(seen.len() >= 6, "{seen:?}");
    // A match still wins over the share.
    let mut l = loads(4);
    l[0].share = 0.27;
    assert_eq!(
        pick_one(&c, &[3, 0, 0, 0], &l, &hashes(8)),
        (0, AffinityReason::Hit)
    );
}

#[test]
fn a_session_keeps_its_pod_until_the_pod_is_saturated() {
    let c = GATES;
    let mut l = loads(3);
    // Pod 0 holds the whole prompt; the session's pod 2 holds nothing and is over its share.
    l[2].share = 0.9;
    l[2].inflight = i64::from(c.pod_capacity) - 1;
    let pick_with = |l: &[PodLoad], session| {
        pick(
            &c,
            &[8, 0, 0],
            &[8, 0, 0],
            l,
            &hashes(8),
            session,
            &|_| 0.0,
            0.0,
            &mut SmallRng::seed_from_u64(3),
        )
    };
    assert_eq!(pick_with(&l, Some(2)), (2, AffinityReason::Session));
    assert_eq!(pick_with(&l, None), (0, AffinityReason::Hit));
    l[2].inflight = i64::from(c.pod_capacity);
    assert_eq!(
        pick_with(&l, Some(2)),
        (0, AffinityReason::Hit),
        "saturated"
    );
    l[2].inflight = 0;
    l[2].waiting = 1.0;
    assert_eq!(pick_with(&l, Some(2)), (0, AffinityReason::Hit), "queueing");
}

#[test]
fn new_prefixes_go_to_the_pod_that_evicts_least_within_its_share() {
    let c = AffinityConfig::default();
    assert!(c.place_by_churn && c.balance_new);
    let mut l = loads(4);
    // Pod 2 has the least share and the least load, but evicts a third of its cache per window;
    // pod 1 evicts least.
    l[2].share = 0.05;
    let churn = [0.2, 0.02, 0.3, 0.1];
    let pick_new = |c: &AffinityConfig, l: &[PodLoad], k: u64| {
        pick(
            c,
            &[0; 4],
            &[0; 4],
            l,
            &[BlockHash(k)],
            None,
            &|i| churn[i],
            0.0,
            &mut SmallRng::seed_from_u64(1),
        )
    };
    for k in 0..16 {
        assert_eq!(pick_new(&c, &l, k), (1, AffinityReason::Miss));
    }
    // Over the share limit (1.25 x the mean, at least 1/4), the quiet pod is passed over.
    l[1].share = 0.9;
    assert_eq!(pick_new(&c, &l, 3).0, 3);
    // Within `churnSlack` of the least, the share decides again.
    l[0].share = 0.1;
    l[3].share = 0.1;
    let slack = AffinityConfig {
        churn_slack: 0.25,
        ..c
    };
    assert_eq!(pick_new(&slack, &l, 3).0, 2);
    // Off: churn is not read at all.
    let off = AffinityConfig {
        place_by_churn: false,
        ..c
    };
    let panics = |_: usize| -> f64 { panic!("churn read with placeByChurn off") };
    let (i, _) = pick(
        &off,
        &[0; 4],
        &[0; 4],
        &l,
        &[BlockHash(3)],
        None,
        &panics,
        0.0,
        &mut SmallRng::seed_from_u64(1),
    );
    assert_eq!(i, 2);
    // A match is never moved by churn.
    let (i, why) = pick(
        &c,
        &[4, 0, 0, 0],
        &[4, 0, 0, 0],
        &loads(4),
        &hashes(8),
        None,
        &|i| churn[i],
        0.0,
        &mut SmallRng::seed_from_u64(1),
    );
    assert_eq!((i, why), (0, AffinityReason::Hit));
}

/// [`pick`] with the latency model's inputs: each pod's predicted wait and the seconds one
/// uncached block costs.
fn pick_timed(matched: &[usize], waits: &[f64], per_block: f64) -> (usize, AffinityReason) {
    let mut l = loads(matched.len());
    for (p, &w) in l.iter_mut().zip(waits) {
        p.wait = w;
    }
    pick(
        &AffinityConfig::default(),
        matched,
        matched,
        &l,
        &hashes(8),
        None,
        &|_| 0.0,
        per_block,
        &mut SmallRng::seed_from_u64(7),
    )
}

#[test]
fn a_full_match_on_a_queueing_pod_loses_to_a_half_match_on_an_idle_one() {
    // 10 ms a block: the half match prefills 40 ms; the full match waits 200 ms.
    assert_eq!(
        pick_timed(&[8, 4, 0], &[0.2, 0.0, 0.0], 0.01),
        (1, AffinityReason::Spill)
    );
    // Nobody else holds any of it: the idle pod with nothing costs 80 ms, still less.
    let (i, why) = pick_timed(&[8, 0, 0], &[0.2, 0.0, 0.0], 0.01);
    assert!(i == 1 || i == 2, "{i}");
    assert_eq!(why, AffinityReason::Spill);
}

#[test]
fn a_full_match_wins_while_its_queue_costs_less_than_the_prefill_it_saves() {
    // A free slot: no wait at all.
    assert_eq!(
        pick_timed(&[8, 4, 0], &[0.0, 0.0, 0.0], 0.01),
        (0, AffinityReason::Hit)
    );
    // A short queue (30 ms) is cheaper than prefilling half the prompt (40 ms) elsewhere.
    assert_eq!(
        pick_timed(&[8, 4, 0], &[0.03, 0.0, 0.0], 0.01),
        (0, AffinityReason::Hit)
    );
}

#[test]
fn when_every_pod_queues_the_pick_is_the_least_predicted_ttft() {
    // Waits 0.3, 0.1, 0.2 s; pod 2 holds the whole prompt (saves 80 ms): 0.3, 0.18, 0.2.
    assert_eq!(
        pick_timed(&[0, 0, 8], &[0.3, 0.1, 0.2], 0.01),
        (1, AffinityReason::Saturated)
    );
    assert_eq!(
        pick_timed(&[0, 0, 8], &[0.3, 0.15, 0.1], 0.01),
        (2, AffinityReason::Saturated)
    );
}

/// The pick as written before its gates were computed once per candidate ([`Gates`]): each
/// gate a closure, evaluated where it is read. The reference the pick is checked against.
#[expect(clippy::too_many_arguments, reason = "the pick's inputs")]
fn reference_pick<R: rand::Rng>(
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
    let n = matched.len();
    let total = hashes.len() as f64;
    let allowed_rest = ((1.0 - config.tentative_min_ratio) * total).max(1.0);
    let effective: Vec<usize> = matched
        .iter()
        .zip(held)
        .map(|(&m, &h)| {
            if m > h && total - m as f64 > allowed_rest {
                h
            } else {
                m
            }
        })
        .collect();
    let matched = &effective[..];
    let latency = config.load_gate && config.latency_model;
    let queued = |i: usize| {
        if latency {
            loads[i].wait > 0.0
        } else {
            config.load_gate
                && (loads[i].waiting > f64::from(config.max_queue)
                    || loads[i].inflight >= i64::from(config.pod_capacity))
        }
    };
    let mean = loads.iter().map(|l| l.share).sum::<f64>() / n as f64;
    let limit = (1.0 + config.share_headroom) * mean.max(1.0 / n as f64);
    let hot = |i: usize| {
        !(config.spill_hot_only && config.tentative)
            || i64::from(loads[i].head_inflight) * 2 >= loads[i].inflight.max(1)
    };
    let pressed = loads.iter().map(|l| l.written).sum::<f64>() / n as f64 * config.share_pressure;
    let busy = |i: usize| {
        loads[i].fill >= config.share_busy
            || (config.share_pressure > 0.0 && loads[i].written > 0.0 && loads[i].written > pressed)
    };
    let over = |i: usize| config.load_gate && n > 1 && loads[i].share > limit && hot(i) && busy(i);
    let elsewhere = (0..n)
        .filter(|&i| !queued(i) && !over(i))
        .map(|i| matched[i])
        .max()
        .unwrap_or(0);
    let keeps = |i: usize| {
        matched[i] > held[i]
            && (matched[i].saturating_sub(elsewhere)) as f64
                > config.spill_loss * hashes.len() as f64
    };
    let share_ok = |i: usize| !over(i) || keeps(i);
    let cost = |i: usize| {
        loads[i].wait + (total - matched[i] as f64) * prefill_per_block * (1.0 + loads[i].backlog)
    };
    let least_cost = {
        let within = (0..n).filter(|&i| share_ok(i)).map(cost);
        let least = within.fold(f64::INFINITY, f64::min);
        if least.is_finite() {
            least
        } else {
            (0..n).map(cost).fold(f64::INFINITY, f64::min)
        }
    };
    let saturated = |i: usize| {
        if latency {
            cost(i) > least_cost + 1e-9 * least_cost.abs()
        } else {
            queued(i)
        }
    };
    let available = |i: usize| !saturated(i) && share_ok(i);
    if let Some(i) = session.filter(|&i| i < n && !saturated(i)) {
        return (i, AffinityReason::Session);
    }
    let (i, why) = reference_place(
        config, matched, loads, hashes, &available, &saturated, churn, limit, rng,
    );
    if latency && loads[i].wait > 0.0 && loads.iter().all(|l| l.wait > 0.0) {
        return (i, AffinityReason::Saturated);
    }
    (i, why)
}

/// The placement as written before the gates found the longest matches and the least load
/// at the longest ([`Gates`]): each read through closures, each in its own pass.
#[expect(clippy::too_many_arguments, reason = "the placement's inputs")]
fn reference_place<R: rand::Rng>(
    config: &AffinityConfig,
    matched: &[usize],
    loads: &[PodLoad],
    hashes: &[BlockHash],
    available: &dyn Fn(usize) -> bool,
    saturated: &dyn Fn(usize) -> bool,
    churn: &dyn Fn(usize) -> f64,
    limit: f64,
    rng: &mut R,
) -> (usize, AffinityReason) {
    use super::place::{least_loaded, new_work, nothing_available, reason};
    use super::tie::tie_break;
    let n = matched.len();
    let best_all = matched.iter().copied().max().unwrap_or(0);
    let best_available = (0..n).filter(|&i| available(i)).map(|i| matched[i]).max();
    let tie_key = |m: usize| hashes.get(m.saturating_sub(1)).map(|h| h.0);
    let pool = (0..n).filter(|&i| available(i));
    match best_available {
        Some(0) if config.balance_new => {
            let i = new_work(config, pool, loads, limit, churn, tie_key(0), rng);
            (i, reason(0, best_all))
        }
        Some(best) if best == best_all || best > 0 => {
            let holding = pool.filter(|&i| matched[i] == best);
            let i = tie_break(config, holding, loads, tie_key(best), rng);
            (i, reason(best, best_all))
        }
        Some(_) => (
            least_loaded(config, pool, loads, tie_key(0), rng),
            AffinityReason::Spill,
        ),
        None => {
            let i = nothing_available(config, matched, loads, saturated, &tie_key, rng);
            (i, AffinityReason::Saturated)
        }
    }
}

proptest::proptest! {
    /// The pick equals [`reference_pick`] on random pools: matches, holds, loads, shares,
    /// waits, sessions and churns, with and without the latency model and the load gate, the
    /// share gate acting always or only on busy pods (by their slots, or their writes), ties
    /// within a load slack or not, consolidated or random.
    #[test]
    fn the_pick_equals_the_reference(
        pods in proptest::collection::vec(
            (0usize..6, 0usize..3, 0i64..4, 0u8..3, 0u8..4, 0u32..3, 0u8..3, 0u8..3),
            1..12,
        ),
        blocks in 1u64..8,
        session in proptest::option::of(0usize..14),
        latency_model in proptest::bool::ANY,
        load_gate in proptest::bool::ANY,
        per_block in 0u8..3,
        share_busy in 0u8..3,
        share_pressure in 0u8..3,
        tie_load_slack in 0u32..3,
        consolidate_ties in proptest::bool::ANY,
        seed in 0u64..1000,
    ) {
        let share_busy = f64::from(share_busy) * 0.5;
        let share_pressure = f64::from(share_pressure) * 0.75;
        let config = AffinityConfig {
            latency_model,
            load_gate,
            share_busy,
            share_pressure,
            tie_load_slack,
            consolidate_ties,
            ..AffinityConfig::DEFAULT
        };
        let h = hashes(blocks);
        let b = blocks as usize;
        let matched: Vec<usize> = pods.iter().map(|p| p.0.min(b)).collect();
        let held: Vec<usize> = pods.iter().map(|p| p.0.min(b).saturating_sub(p.1)).collect();
        let mut l = loads(pods.len());
        for (load, p) in l.iter_mut().zip(&pods) {
            load.inflight = p.2;
            load.fill = p.2 as f64 / 2.0;
            load.waiting = f64::from(p.3);
            load.share = f64::from(p.4) * 0.1;
            load.head_inflight = p.5;
            load.wait = f64::from(p.6) * 0.01;
            load.backlog = f64::from(p.6) * 0.5;
            load.written = f64::from(p.3) * 100.0;
        }
        let churns: Vec<f64> = pods.iter().map(|p| f64::from(p.7) * 0.1).collect();
        let churn = |i: usize| churns[i];
        let per_block = f64::from(per_block) * 0.004;
        let ours = pick(&config, &matched, &held, &l, &h, session, &churn, per_block,
            &mut SmallRng::seed_from_u64(seed));
        let reference = reference_pick(&config, &matched, &held, &l, &h, session, &churn,
            per_block, &mut SmallRng::seed_from_u64(seed));
        proptest::prop_assert_eq!(ours, reference);
    }
}

/// An engine queue that is not a number (a NaN gauge) on every candidate leaves the pick a pod,
/// on a hit, on new work and without the latency model, never a panic.
#[test]
fn a_queue_that_is_not_a_number_still_picks_a_pod() {
    let mut l = loads_in_flight(&[0, 1, 0]);
    for load in &mut l {
        load.waiting = f64::NAN;
    }
    let counts = AffinityConfig {
        latency_model: false,
        ..AffinityConfig::DEFAULT
    };
    for c in [AffinityConfig::DEFAULT, counts] {
        let (i, why) = pick_one(&c, &[3, 3, 0], &l, &hashes(4));
        assert!(i < 2 && why == AffinityReason::Hit, "{i} {why:?}");
        let (i, _) = pick_one(&c, &[0, 0, 0], &l, &hashes(4));
        assert!(i < 3);
    }
    // Every pod full (`podCapacity`): the least loaded of all, none a number.
    let full = AffinityConfig {
        pod_capacity: 1,
        ..counts
    };
    for load in &mut l {
        load.inflight = 1;
    }
    let (i, why) = pick_one(&full, &[3, 3, 0], &l, &hashes(4));
    assert!(i < 3 && why == AffinityReason::Saturated, "{i} {why:?}");
}
