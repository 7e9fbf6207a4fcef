//! Step 6, place: the affinity pick once each candidate's availability is known ([`super::gate`]).
//! The cases, by the longest match among the available pods (`best`) and overall (`best_all`):
//!
//! | best available | pick | reason |
//! | --- | --- | --- |
//! | 0, with `balanceNew` | new work ([`new_work`]): the quietest pods (`placeByChurn`), then the least recent share among the least loaded | miss (spill when some unavailable pod holds a block) |
//! | `best_all` | the tie among the available pods holding it | hit (miss when it is 0) |
//! | above 0, below `best_all` | the tie among the available pods holding `best` | spill |
//! | 0, without `balanceNew` | the tie among the least-loaded available pods | spill |
//! | none available | the tie among the longest matches on pods not saturated, else among the least-loaded pods | saturated |
//!
//! New work and a spill that nobody holds go to pods whose engines reuse their cache while any
//! is available (a pod with prefix caching off matches nothing and keeps nothing: overflow).
//!
//! The tie rule is step 7 ([`super::tie`]); its key is the deepest block the tied pods hold (the
//! first block when none holds any).

use rand::Rng;

use super::gate::Gates;
use super::tie::{least_load, load, near, near_least_loaded, tie_break, tie_break_within};
use crate::hashing::BlockHash;
use crate::scheduler::affinity::{AffinityConfig, AffinityReason, PodLoad};

/// The pick once each pod's gates are known: its position and why. The longest matches and
/// the least load among the available pods holding the longest come with the gates, so a hit
/// takes one more pass over the candidates (the tie).
pub(super) fn place<R: Rng>(
    config: &AffinityConfig,
    gates: &Gates,
    loads: &[PodLoad],
    hashes: &[BlockHash],
    churn: &dyn Fn(usize) -> f64,
    rng: &mut R,
) -> (usize, AffinityReason) {
    let matched = gates.matched();
    let n = matched.len();
    let best_all = gates.best_all();
    let tie_key = |m: usize| hashes.get(m.saturating_sub(1)).map(|h| h.0);
    let pool = (0..n).filter(|&i| gates.available(i));
    match gates.best_available() {
        // No available pod holds any block: new work for this pod set, by share.
        Some((0, _)) if config.balance_new => {
            let limit = gates.share_limit();
            let pool = reusing_first(pool, loads);
            let i = new_work(config, pool, loads, limit, churn, tie_key(0), rng);
            (i, reason(0, best_all))
        }
        Some((best, least)) if best == best_all || best > 0 => {
            let holding = pool.filter(|&i| matched[i] == best);
            let i = tie_break_within(config, holding, loads, least, tie_key(best), rng);
            (i, reason(best, best_all))
        }
        Some(_) => (
            least_loaded(config, reusing_first(pool, loads), loads, tie_key(0), rng),
            AffinityReason::Spill,
        ),
        None => {
            let saturated = |i: usize| gates.saturated(i);
            let i = nothing_available(config, matched, loads, &saturated, &tie_key, rng);
            (i, AffinityReason::Saturated)
        }
    }
}

/// The pods of `pool` whose engines reuse their KV cache, or all of `pool` when none does: a
/// pod with prefix caching off keeps nothing of the work it is given, so it takes new work only
/// as overflow.
fn reusing_first(
    pool: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
) -> impl Iterator<Item = usize> + Clone {
    let any = pool.clone().any(|i| loads[i].reuses);
    pool.filter(move |&i| !any || loads[i].reuses)
}

/// Why a pod holding `best` blocks was placed when the longest match is `best_all`: a hit when
/// it holds the longest, a miss when nobody holds a block, else a spill.
pub(super) fn reason(best: usize, best_all: usize) -> AffinityReason {
    match (best == best_all, best > 0) {
        (true, true) => AffinityReason::Hit,
        (true, false) => AffinityReason::Miss,
        (false, _) => AffinityReason::Spill,
    }
}

/// New work (no available pod holds a block): among `pool`, the pods that evict least
/// (`placeByChurn`, [`quietest`]), then the least recent share among the least loaded.
pub(super) fn new_work<R: Rng>(
    config: &AffinityConfig,
    pool: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    limit: f64,
    churn: &dyn Fn(usize) -> f64,
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    if config.place_by_churn {
        let quiet = quietest(config, pool, loads, limit, churn);
        balance(config, quiet.iter().map(|&(i, _)| i), loads, key, rng)
    } else {
        balance(config, pool, loads, key, rng)
    }
}

/// The tie among the least loaded (in flight plus engine queue) of `pool`.
pub(super) fn least_loaded<R: Rng>(
    config: &AffinityConfig,
    pool: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let least = least_load(pool.clone(), loads);
    let tied = pool.filter(|&i| near(load(loads, i), least, least));
    tie_break(config, tied, loads, key, rng)
}

/// Nothing available: the best match among the pods that are not saturated, else the least
/// loaded of all.
pub(super) fn nothing_available<R: Rng>(
    config: &AffinityConfig,
    matched: &[usize],
    loads: &[PodLoad],
    saturated: &dyn Fn(usize) -> bool,
    tie_key: &dyn Fn(usize) -> Option<u64>,
    rng: &mut R,
) -> usize {
    let n = matched.len();
    let roomy = (0..n).filter(|&i| !saturated(i)).map(|i| matched[i]).max();
    match roomy {
        Some(best) => {
            let holding = (0..n).filter(|&i| !saturated(i) && matched[i] == best);
            tie_break(config, holding, loads, tie_key(best), rng)
        }
        None => least_loaded(config, 0..n, loads, tie_key(0), rng),
    }
}

/// The pods of `pool` (non-empty) that new work evicts least from, with their churn: those
/// within the share `limit` (all of them when none is), then those whose churn is within
/// `churnSlack` of the least. One allocation; `churn` is read once per pod.
fn quietest(
    config: &AffinityConfig,
    pool: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    limit: f64,
    churn: &dyn Fn(usize) -> f64,
) -> Vec<(usize, f64)> {
    let mut within = pool.clone().filter(|&i| loads[i].share <= limit).peekable();
    let mut quiet: Vec<(usize, f64)> = if within.peek().is_some() {
        within.map(|i| (i, churn(i))).collect()
    } else {
        pool.map(|i| (i, churn(i))).collect()
    };
    let least = quiet.iter().map(|&(_, c)| c).fold(f64::INFINITY, f64::min);
    quiet.retain(|&(_, c)| c <= least + config.churn_slack);
    quiet
}

/// One of `pods` (non-empty) for new work: the least recent share among the pods within
/// `tieLoadSlack` of the least loaded; pods within one pick's weight of that share go by the
/// tie rule ([`tie_break`]: rendezvous on `key`, or random without `consolidateTies`).
fn balance<R: Rng>(
    config: &AffinityConfig,
    pods: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let near = near_least_loaded(config, pods, loads);
    let least_share = near
        .clone()
        .map(|i| loads[i].share)
        .fold(f64::INFINITY, f64::min);
    let step = 1.0 / (f64::from(config.share_window.max(1)) * loads.len().max(1) as f64);
    tie_break(
        config,
        near.filter(move |&i| loads[i].share <= least_share + step),
        loads,
        Some(key.unwrap_or(0)),
        rng,
    )
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::scheduler::pipeline::tests::loads_in_flight;

    /// `place` with every pod available except those in `unavailable`, none saturated
    /// except those in `full`, churn 0.
    fn placed(
        config: &AffinityConfig,
        matched: &[usize],
        loads: &[PodLoad],
        unavailable: &[usize],
        full: &[usize],
    ) -> (usize, AffinityReason) {
        let hashes: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
        let gates = Gates::given(
            matched,
            loads,
            |i| !unavailable.contains(&i) && !full.contains(&i),
            |i| full.contains(&i),
            1.0,
        );
        place(
            config,
            &gates,
            loads,
            &hashes,
            &|_| 0.0,
            &mut SmallRng::seed_from_u64(3),
        )
    }

    const C: AffinityConfig = AffinityConfig::DEFAULT;

    #[test]
    fn the_longest_match_on_an_available_pod_is_a_hit() {
        let l = loads_in_flight(&[5, 0, 0]);
        assert_eq!(
            placed(&C, &[4, 2, 0], &l, &[], &[]),
            (0, AffinityReason::Hit)
        );
    }

    #[test]
    fn the_longest_match_on_an_unavailable_pod_spills_to_the_next_longest() {
        let l = loads_in_flight(&[0, 0, 0]);
        assert_eq!(
            placed(&C, &[4, 2, 0], &l, &[0], &[]),
            (1, AffinityReason::Spill)
        );
    }

    #[test]
    fn new_work_goes_to_the_least_loaded_and_is_a_miss_when_nobody_holds_it() {
        let l = loads_in_flight(&[3, 1, 2]);
        assert_eq!(
            placed(&C, &[0, 0, 0], &l, &[], &[]),
            (1, AffinityReason::Miss)
        );
        // Held only on an unavailable pod: the new work is a spill.
        assert_eq!(
            placed(&C, &[3, 0, 0], &l, &[0], &[]),
            (1, AffinityReason::Spill)
        );
        // Without balanceNew: the least-loaded available pod, a spill too.
        let plain = AffinityConfig {
            balance_new: false,
            ..C
        };
        assert_eq!(
            placed(&plain, &[3, 0, 0], &l, &[0], &[]),
            (1, AffinityReason::Spill)
        );
    }

    #[test]
    fn new_work_and_a_spill_nobody_holds_go_to_pods_that_reuse_their_cache() {
        // Pod 1 is the least loaded, but its engine reuses nothing (prefix caching off).
        let mut l = loads_in_flight(&[3, 1, 2]);
        l[1].reuses = false;
        assert_eq!(
            placed(&C, &[0, 0, 0], &l, &[], &[]),
            (2, AffinityReason::Miss)
        );
        // Held only on an unavailable pod, nobody else holding any of it: a spill, not to pod 1.
        assert_eq!(
            placed(&C, &[3, 0, 0], &l, &[0], &[]),
            (2, AffinityReason::Spill)
        );
        let plain = AffinityConfig {
            balance_new: false,
            ..C
        };
        assert_eq!(
            placed(&plain, &[3, 0, 0], &l, &[0], &[]),
            (2, AffinityReason::Spill)
        );
        // No pod that reuses is available: it takes the work (overflow).
        assert_eq!(
            placed(&C, &[3, 0, 0], &l, &[0, 2], &[]),
            (1, AffinityReason::Spill)
        );
        // None reuses: as if all did.
        for p in &mut l {
            p.reuses = false;
        }
        assert_eq!(
            placed(&C, &[0, 0, 0], &l, &[], &[]),
            (1, AffinityReason::Miss)
        );
    }

    #[test]
    fn nothing_available_takes_the_best_match_with_room_else_the_least_loaded() {
        let l = loads_in_flight(&[3, 1, 2]);
        // Pod 0 over its share (unavailable, not saturated) holds the longest match.
        let over = placed(&C, &[3, 1, 0], &l, &[0, 1, 2], &[1, 2]);
        assert_eq!(over, (0, AffinityReason::Saturated));
        let all_full = placed(&C, &[3, 1, 0], &l, &[], &[0, 1, 2]);
        assert_eq!(all_full, (1, AffinityReason::Saturated));
    }

    #[test]
    fn new_work_avoids_pods_that_evict_most_and_pods_over_their_share() {
        let l = loads_in_flight(&[0, 0, 0]);
        let churns = [0.5, 0.1, 0.1];
        let mut shares = l.clone();
        shares[1].share = 2.0; // over the limit of 1.0
        let quiet = quietest(&C, 0..3, &shares, 1.0, &|i| churns[i]);
        assert_eq!(quiet, [(2, 0.1)]);
        // Everyone over the limit: churn alone decides.
        let quiet = quietest(&C, 0..3, &shares, -1.0, &|i| churns[i]);
        assert_eq!(quiet, [(1, 0.1), (2, 0.1)]);
    }
}
