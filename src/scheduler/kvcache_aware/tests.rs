//! The standardized hash against vectors from Python's `hashlib` (the Runtime's
//! `compute_standardized_hash`), block cutting, and Kthena's `calculatePodScores` cases.

use super::*;
use crate::scheduler::affinity::RecentPicks;

/// A candidate that is only a cache owner (and a start time).
struct Owner(&'static str, Option<i64>, RecentPicks);

fn owner(name: &'static str, started: Option<i64>) -> Owner {
    Owner(name, started, RecentPicks::default())
}

impl Candidate for Owner {
    fn slot(&self) -> crate::prefix_index::PodSlot {
        crate::prefix_index::PodSlot(0)
    }
    fn inflight(&self) -> i64 {
        0
    }
    fn stats(&self) -> crate::scheduler::EngineStats {
        crate::scheduler::EngineStats::default()
    }
    fn recent(&self) -> &RecentPicks {
        &self.2
    }
    fn rendezvous(&self) -> u64 {
        0
    }
    fn label(&self) -> &str {
        self.0
    }
    fn cache_owner(&self) -> Option<&str> {
        Some(self.0)
    }
    fn containers_started(&self) -> Option<i64> {
        self.1
    }
}

#[test]
fn standardized_hash_matches_hashlib() {
    // python3: int.from_bytes(sha256(b''.join(t.to_bytes(4,'big') ...)).digest()[:8],'big') & (2**63-1)
    assert_eq!(standardized_hash(&[1, 2, 3, 4]).0, 4233425515844289900);
    assert_eq!(standardized_hash(&[0]).0, 6863311662677045211);
    assert_eq!(standardized_hash(&[u32::MAX, 7]).0, 8591069741335144491);
    assert_eq!(standardized_hash(&[]).0, 0);
}

#[test]
fn blocks_are_cut_unchained_with_a_partial_last_one() {
    let tokens: Vec<u32> = (0..19).collect();
    let hashes = block_hashes(&tokens, 16, 128);
    assert_eq!(hashes.len(), 2);
    assert_eq!(hashes[0].0, 6473494984593326032);
    assert_eq!(
        hashes[1].0, 5197912547321966246,
        "the partial block [16, 17, 18]"
    );
    // Not chained: the second block's hash is its own tokens' hash.
    assert_eq!(hashes[1], standardized_hash(&[16, 17, 18]));
    assert_eq!(
        block_hashes(&tokens, 4, 3).len(),
        3,
        "maxBlocksToMatch caps"
    );
    assert!(block_hashes(&[], 16, 128).is_empty());
    assert_eq!(
        block_key("org/m", hashes[0]),
        "matrix:kv:block:org/m@6473494984593326032"
    );
}

fn owners(blocks: &[&[(&str, &str)]]) -> KvBlockOwners {
    KvBlockOwners {
        hashes: (0..blocks.len() as u64).map(StdBlockHash).collect(),
        owners: blocks
            .iter()
            .map(|b| {
                b.iter()
                    .map(|(o, w)| (o.to_string(), w.to_string()))
                    .collect()
            })
            .collect(),
    }
}

#[test]
fn consecutive_blocks_from_the_first_truncated() {
    let pods = [
        owner("a.ns", None),
        owner("b.ns", None),
        owner("c.ns", None),
    ];
    // a holds 0,1,2; b holds 0 and 2 (broken at 1); c holds 1,2 only.
    let lookup = owners(&[
        &[("a.ns", "10"), ("b.ns", "10")],
        &[("a.ns", "10"), ("c.ns", "10")],
        &[("a.ns", "10"), ("b.ns", "10"), ("c.ns", "10")],
    ]);
    let s = score(&lookup, &pods);
    assert_eq!(s.matched, vec![3, 1, 0]);
    assert_eq!(s.scores, vec![100, 33, 0]);
    assert_eq!(s.longest, 3);
    assert_eq!(s.match_ratio(), 1.0);
}

#[test]
fn stale_and_foreign_owners_do_not_count() {
    // a restarted at 100: its field written at 100 is stale; b's start is unknown; "x" is no
    // candidate; an unparsable value is kept.
    let pods = [owner("a.ns", Some(100)), owner("b.ns", None)];
    let lookup = owners(&[
        &[("a.ns", "100"), ("b.ns", "5"), ("x.ns", "999")],
        &[("a.ns", "101"), ("b.ns", "not-a-number"), ("x.ns", "999")],
    ]);
    let s = score(&lookup, &pods);
    assert_eq!(s.matched, vec![0, 2]);
    assert_eq!(s.scores, vec![0, 100]);
    assert_eq!(s.stale_owners, 1);
    // The first block without a candidate owner: every score 0, ratio 0.
    let s = score(&owners(&[&[("x.ns", "1")], &[("a.ns", "200")]]), &pods);
    assert_eq!((s.scores, s.longest), (vec![0, 0], 0));
}

#[test]
fn no_blocks_score_zero() {
    let s = score(&KvBlockOwners::default(), &[owner("a.ns", None)]);
    assert_eq!((s.match_ratio(), s.total, s.scores), (0.0, 0, vec![0]));
}
