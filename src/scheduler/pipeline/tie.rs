//! Step 7, tie: one of several equal candidates (equal longest match, or equally new work).
//!
//! The tied pods within `tieLoadSlack` requests (in flight plus engine queue) of the least
//! loaded of them, then (`consolidateTies`) the highest rendezvous weight of the tie key (the
//! deepest block the tied pods hold) and each pod's address: at equal load every request with
//! that prefix, on every replica, picks the same pod, so a prefix that spilled to a second pod
//! returns to one when the load drops, while new work that only shares a head every pod holds
//! spreads by load. Without `consolidateTies`, or without a key, a seeded random pick.

use rand::Rng;

use crate::scheduler::affinity::{AffinityConfig, PodLoad};

/// One of `tied` (non-empty), among those within `tieLoadSlack` of the least loaded: the
/// highest rendezvous weight for `key`, or a random one.
pub(super) fn tie_break<R: Rng>(
    config: &AffinityConfig,
    tied: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let least = least_load(tied.clone(), loads);
    tie_break_within(config, tied, loads, least, key, rng)
}

/// [`tie_break`] given the least load among `tied` (in flight plus engine queue, as `f64::min`
/// folds it from infinity), which the caller found in a pass it made anyway.
pub(super) fn tie_break_within<R: Rng>(
    config: &AffinityConfig,
    tied: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    least: f64,
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let limit = least + f64::from(config.tie_load_slack);
    let tied = tied.filter(move |&i| near(load(loads, i), least, limit));
    match key {
        Some(key) if config.consolidate_ties => tied
            .max_by_key(|&i| mix(key ^ loads[i].key))
            .expect("a tie has a member"),
        _ => {
            let count = tied.clone().count();
            tied.clone()
                .nth(rng.random_range(0..count))
                .expect("a tie has a member")
        }
    }
}

/// The pods of `pods` within `tieLoadSlack` requests (in flight plus engine queue) of the
/// least loaded of them.
pub(super) fn near_least_loaded<'a>(
    config: &AffinityConfig,
    pods: impl Iterator<Item = usize> + Clone + 'a,
    loads: &'a [PodLoad],
) -> impl Iterator<Item = usize> + Clone + 'a {
    let least = least_load(pods.clone(), loads);
    let limit = least + f64::from(config.tie_load_slack);
    pods.filter(move |&i| near(load(loads, i), least, limit))
}

/// The least load of `pods`, as `f64::min` folds it from infinity (a NaN load is never the
/// least; infinity when none is a number).
pub(super) fn least_load(pods: impl Iterator<Item = usize>, loads: &[PodLoad]) -> f64 {
    pods.map(|i| load(loads, i)).fold(f64::INFINITY, f64::min)
}

/// Whether a pod of load `l` is near the `least` (within `limit`); every pod is when no load
/// was a number to compare (an engine that reported its queue as NaN): the tie still has its
/// members.
pub(super) fn near(l: f64, least: f64, limit: f64) -> bool {
    l <= limit || !least.is_finite()
}

/// A pod's load: in flight plus engine queue.
pub(super) fn load(loads: &[PodLoad], i: usize) -> f64 {
    loads[i].inflight as f64 + loads[i].waiting
}

/// The rendezvous weight of a key and a pod's identity (a 128-bit multiply, folded).
fn mix(x: u64) -> u64 {
    let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15_u128;
    (p as u64) ^ ((p >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::scheduler::pipeline::tests::loads_in_flight;

    fn rng() -> SmallRng {
        SmallRng::seed_from_u64(11)
    }

    #[test]
    fn the_least_loaded_of_the_tie_wins_within_the_slack() {
        let c = AffinityConfig::DEFAULT;
        let l = loads_in_flight(&[2, 0, 1]);
        assert_eq!(tie_break(&c, 0..3, &l, Some(9), &mut rng()), 1);
        let near: Vec<usize> = near_least_loaded(&c, 0..3, &l).collect();
        assert_eq!(near, [1]);
        let slack = AffinityConfig {
            tie_load_slack: 1,
            ..c
        };
        let near: Vec<usize> = near_least_loaded(&slack, 0..3, &l).collect();
        assert_eq!(near, [1, 2]);
    }

    #[test]
    fn equal_load_goes_by_rendezvous_the_same_pod_for_the_same_key_whatever_the_order() {
        let c = AffinityConfig::DEFAULT;
        let l = loads_in_flight(&[0; 8]);
        let picks: Vec<usize> = (0..64u64)
            .map(|key| tie_break(&c, 0..8, &l, Some(key), &mut rng()))
            .collect();
        for (key, &p) in picks.iter().enumerate() {
            let reversed = tie_break(&c, (0..8).rev(), &l, Some(key as u64), &mut rng());
            assert_eq!(reversed, p, "key {key}");
            assert_eq!(
                p,
                (0..8).max_by_key(|&i| mix(key as u64 ^ l[i].key)).unwrap()
            );
        }
        let mut distinct = picks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 4, "keys spread over the pods: {picks:?}");
    }

    #[test]
    fn without_consolidation_or_a_key_the_tie_is_a_seeded_random_pick() {
        let random = AffinityConfig {
            consolidate_ties: false,
            ..AffinityConfig::DEFAULT
        };
        let l = loads_in_flight(&[0; 4]);
        let picks: Vec<usize> = (0..64)
            .map(|s| tie_break(&random, 0..4, &l, Some(1), &mut SmallRng::seed_from_u64(s)))
            .collect();
        assert!((0..4).all(|p| picks.contains(&p)), "{picks:?}");
        let again = tie_break(&random, 0..4, &l, Some(1), &mut SmallRng::seed_from_u64(5));
        assert_eq!(again, picks[5], "the same seed, the same pick");
        let keyless = tie_break(&AffinityConfig::DEFAULT, 0..4, &l, None, &mut rng());
        assert_eq!(keyless, tie_break(&random, 0..4, &l, Some(1), &mut rng()));
    }
}
