//! Tentative entries: prompts picked for a pod and not yet completed (the affinity mode's
//! decision-time records).
//!
//! They live beside the index, not in it: a pick adds its prompt's blocks here for the chosen
//! pod, so the next request with that prefix sees them at once; the completion records the
//! prompt in the index for the pod that served and removes them; a failure, abort or expiry only
//! removes them. Kept apart, a rollback is exact (it takes away this request's hold and nothing
//! else, even when other requests hold the same blocks), tentative entries cause no eviction,
//! never reach the replicas (sync publishes index records only) and cost nothing when the mode is
//! off. Each `(model, block)` key maps to its holders, a pod and a count of the requests holding
//! it there; the whole set is bounded by the requests in flight.
//!
//! Lookups use the chain property: a hold covers every block of its prompt, and two chained
//! prompts that share block `i` share every block before it, so the blocks a pod holds along any
//! prompt form a prefix. The longest match per candidate is therefore found by bisection
//! (`log2(blocks)` probes per distinct match length), not by a walk over every block.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{ModelKey, PodSlot};
use crate::hashing::BlockHash;

const SHARDS: usize = 16;

/// Keys are block hashes already: a multiply-fold is enough to spread them.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let p = u128::from(self.0) * 0x9E37_79B9_7F4A_7C15_u128;
        (p as u64) ^ ((p >> 64) as u64)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(29) ^ n;
    }
}

type Holders = Vec<(PodSlot, u32)>;
type Shard = HashMap<(u64, u64), Holders, BuildHasherDefault<KeyHasher>>;

/// The tentative entries of every pod. All methods take `&self`.
#[derive(Debug, Default)]
pub struct TentativeEntries {
    shards: [Mutex<Shard>; SHARDS],
    /// Holds in place (one per `add` not yet removed); scoring skips the table when 0.
    holds: AtomicUsize,
}

fn shard_of(model: ModelKey, hash: BlockHash) -> usize {
    let x = (model.0 ^ hash.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 60) as usize & (SHARDS - 1)
}

impl TentativeEntries {
    /// Adds a hold of every block of `hashes` for `pod`.
    pub fn add(&self, model: ModelKey, hashes: &[BlockHash], pod: PodSlot) {
        if hashes.is_empty() {
            return;
        }
        for &h in hashes {
            let mut shard = self.shards[shard_of(model, h)].lock();
            let holders = shard.entry((model.0, h.0)).or_default();
            match holders.iter_mut().find(|(p, _)| *p == pod) {
                Some((_, n)) => *n += 1,
                None => holders.push((pod, 1)),
            }
        }
        self.holds.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes one hold that [`TentativeEntries::add`] made with the same arguments.
    pub fn remove(&self, model: ModelKey, hashes: &[BlockHash], pod: PodSlot) {
        if hashes.is_empty() {
            return;
        }
        for &h in hashes {
            let mut shard = self.shards[shard_of(model, h)].lock();
            let key = (model.0, h.0);
            let Some(holders) = shard.get_mut(&key) else {
                continue;
            };
            if let Some(i) = holders.iter().position(|(p, _)| *p == pod) {
                holders[i].1 -= 1;
                if holders[i].1 == 0 {
                    holders.swap_remove(i);
                }
            }
            if holders.is_empty() {
                shard.remove(&key);
            }
        }
        self.holds.fetch_sub(1, Ordering::Relaxed);
    }

    /// Holds in place.
    pub fn holds(&self) -> usize {
        self.holds.load(Ordering::Relaxed)
    }

    /// Distinct `(model, block, pod)` entries (for tests and inspection).
    pub fn entries(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().values().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// Raises `matched[i]` to candidate `i`'s longest tentative match (blocks), if longer.
    pub fn extend_matches(
        &self,
        model: ModelKey,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        matched: &mut [usize],
    ) {
        if self.holds() == 0 || hashes.is_empty() {
            return;
        }
        let mut holding = Vec::new();
        self.probe(model, hashes[0], candidates, &mut holding);
        if holding.is_empty() {
            return;
        }
        // (lo, hi, pods): every pod holds block lo; none is known to hold block hi.
        let mut work = vec![(0usize, hashes.len(), holding)];
        let mut found = Vec::new();
        while let Some((lo, hi, pods)) = work.pop() {
            if hi - lo == 1 {
                for ci in pods {
                    matched[ci] = matched[ci].max(lo + 1);
                }
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            found.clear();
            self.probe(model, hashes[mid], candidates, &mut found);
            let (deeper, shallower): (Vec<usize>, Vec<usize>) =
                pods.into_iter().partition(|ci| found.contains(ci));
            if !shallower.is_empty() {
                work.push((lo, mid, shallower));
            }
            if !deeper.is_empty() {
                work.push((mid, hi, deeper));
            }
        }
    }

    /// Appends the positions of the candidates holding `hash` to `out`.
    fn probe(
        &self,
        model: ModelKey,
        hash: BlockHash,
        candidates: &[PodSlot],
        out: &mut Vec<usize>,
    ) {
        let shard = self.shards[shard_of(model, hash)].lock();
        if let Some(holders) = shard.get(&(model.0, hash.0)) {
            for (pod, _) in holders {
                if let Some(ci) = candidates.iter().position(|c| c == pod) {
                    out.push(ci);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::BlockChain;

    fn chain(prompt: &str) -> Vec<BlockHash> {
        BlockChain {
            block_size: 4,
            max_blocks: 64,
        }
        .hash("m", prompt.as_bytes())
    }

    #[test]
    fn longest_match_per_candidate_by_bisection() {
        let t = TentativeEntries::default();
        let m = ModelKey::of("m");
        let pods = [PodSlot(0), PodSlot(1), PodSlot(2)];
        // Pod 0 holds 3 blocks of the query, pod 1 holds 7, pod 2 none.
        t.add(m, &chain("aaaabbbbccccXXXX"), pods[0]);
        t.add(m, &chain("aaaabbbbccccddddeeeeffffggggYYYY"), pods[1]);
        let query = chain("aaaabbbbccccddddeeeeffffgggghhhh");
        let mut matched = vec![0; 3];
        t.extend_matches(m, &query, &pods, &mut matched);
        assert_eq!(matched, [3, 7, 0]);
        // A longer match from the index is kept.
        let mut matched = vec![5, 2, 1];
        t.extend_matches(m, &query, &pods, &mut matched);
        assert_eq!(matched, [5, 7, 1]);
    }

    #[test]
    fn a_removed_hold_leaves_other_holds_of_the_same_blocks() {
        let t = TentativeEntries::default();
        let m = ModelKey::of("m");
        let p = chain("aaaabbbbcccc");
        t.add(m, &p, PodSlot(4));
        t.add(m, &p, PodSlot(4));
        t.add(m, &p, PodSlot(5));
        assert_eq!((t.holds(), t.entries()), (3, 6));
        t.remove(m, &p, PodSlot(4));
        let mut matched = vec![0, 0];
        t.extend_matches(m, &p, &[PodSlot(4), PodSlot(5)], &mut matched);
        assert_eq!(matched, [3, 3]);
        t.remove(m, &p, PodSlot(4));
        t.remove(m, &p, PodSlot(5));
        assert_eq!((t.holds(), t.entries()), (0, 0));
        let mut matched = vec![0, 0];
        t.extend_matches(m, &p, &[PodSlot(4), PodSlot(5)], &mut matched);
        assert_eq!(matched, [0, 0]);
    }

    #[test]
    fn models_do_not_share_holds() {
        let t = TentativeEntries::default();
        let p = chain("aaaabbbb");
        t.add(ModelKey::of("m"), &p, PodSlot(0));
        let mut matched = vec![0];
        t.extend_matches(ModelKey::of("other"), &p, &[PodSlot(0)], &mut matched);
        assert_eq!(matched, [0]);
    }
}
