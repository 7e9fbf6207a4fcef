//! Tentative entries: prompts picked for a pod and not yet completed (the affinity mode's
//! decision-time records).
//!
//! They live beside the index, not in it: a pick adds its prompt here for the chosen pod, so the
//! next request with that prefix sees it at once; the completion records the prompt in the index
//! for the pod that served and removes the hold; a failure, abort or expiry only removes it.
//! Kept apart, a rollback is exact (it takes away this request's hold and nothing else, even when
//! other requests hold the same blocks), holds cause no eviction, never reach the replicas (sync
//! publishes index records only) and cost nothing when the mode is off. The set is bounded by the
//! requests in flight.
//!
//! A hold on a pod whose engine view is live may await the engine's store of its head
//! ([`Awaited`]): once the engine stored it, the view holds what the hold claimed and the hold
//! no longer raises a match; it still counts as a request in flight on its head until its
//! request ends and removes it.
//!
//! A hold is stored whole (the prompt's hash chain, shared), filed under its first block: two
//! chained prompts share block `i` only if they share every block before it, so only holds
//! filed under the query's first block can match it, and each one's common prefix with the query
//! is found by bisection (`log2(blocks)` comparisons). Adding or removing a hold is one lock and
//! one push or swap-remove, whatever the prompt's length.
//!
//! Adding or removing a hold also says how many blocks its pod's holds pin together changed
//! by: the blocks of the hold that no other hold of that pod shares (its length less its longest
//! common prefix with them, found in the same list under the same lock). Summed per pod, that is
//! the union of the blocks its requests in flight occupy (a running request's blocks, shared
//! with the others on their common head, as an engine's paged KV cache keeps them), which the
//! latency model weighs against the pod's KV capacity ([`crate::scheduler::kv_room`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::candidates::CandidatePositions;
use super::{ModelKey, PodSlot};
use crate::engine_view::Awaited;
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

/// One hold: a prompt's chain held for a pod.
#[derive(Debug)]
struct Held {
    id: u64,
    pod: PodSlot,
    hashes: Arc<[BlockHash]>,
    /// The engine's store that ends the claim, for a pod whose view was live.
    engine: Option<Arc<Awaited>>,
}

impl Held {
    /// Whether the hold still claims its blocks (its engine has not stored them).
    fn claims(&self) -> bool {
        self.engine.as_ref().is_none_or(|a| !a.is_stored())
    }
}

type Shard = HashMap<(u64, u64), Vec<Held>, BuildHasherDefault<KeyHasher>>;

/// The tentative entries of every pod. All methods take `&self`.
#[derive(Debug, Default)]
pub struct TentativeEntries {
    shards: [Mutex<Shard>; SHARDS],
    /// Holds in place; scoring skips the table when 0.
    holds: AtomicUsize,
    next_id: AtomicU64,
}

/// What [`TentativeEntries::add`] filed, to remove it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldId {
    model: ModelKey,
    first: BlockHash,
    id: u64,
}

fn shard_of(model: ModelKey, first: BlockHash) -> usize {
    let x = (model.0 ^ first.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 60) as usize & (SHARDS - 1)
}

/// The longest common prefix of `hashes` with the holds of `pod` in `list` (the blocks of
/// `hashes` that another request in flight on `pod` pins too).
fn shared_on(list: &[Held], pod: PodSlot, hashes: &[BlockHash]) -> usize {
    let mut shared = 0;
    for held in list.iter().filter(|h| h.pod == pod) {
        if shared >= held.hashes.len().min(hashes.len()) {
            continue;
        }
        shared = shared.max(common_prefix(&held.hashes, hashes));
    }
    shared
}

/// Blocks `a` and `b` share from the start (both chains: equal at `i` means equal before it).
fn common_prefix(a: &[BlockHash], b: &[BlockHash]) -> usize {
    let (mut lo, mut hi) = (0, a.len().min(b.len()));
    // Invariant: the first `lo` blocks are shared; block `hi` (if any) is not known to be.
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if a[mid - 1] == b[mid - 1] {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

impl TentativeEntries {
    /// Holds the chain `hashes` (non-empty) for `pod`; with the blocks it pins that no other
    /// hold of `pod` did ([`TentativeEntries::add_awaiting`]).
    pub fn add(
        &self,
        model: ModelKey,
        hashes: Arc<[BlockHash]>,
        pod: PodSlot,
    ) -> Option<(HoldId, usize)> {
        self.add_awaiting(model, hashes, pod, None)
    }

    /// [`TentativeEntries::add`] for a pod whose engine view is live: the hold claims its blocks
    /// until `engine` is stored (or until removed). Returns the hold and the blocks it pins that
    /// no other hold of `pod` pinned (its length less its longest common prefix with them).
    pub fn add_awaiting(
        &self,
        model: ModelKey,
        hashes: Arc<[BlockHash]>,
        pod: PodSlot,
        engine: Option<Arc<Awaited>>,
    ) -> Option<(HoldId, usize)> {
        let first = *hashes.first()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shards[shard_of(model, first)].lock();
        let list = shard.entry((model.0, first.0)).or_default();
        let pinned = hashes.len() - shared_on(list, pod, &hashes);
        list.push(Held {
            id,
            pod,
            hashes,
            engine,
        });
        self.holds.fetch_add(1, Ordering::Relaxed);
        Some((HoldId { model, first, id }, pinned))
    }

    /// Removes the hold [`TentativeEntries::add`] returned; returns the blocks no other hold of
    /// its pod pins any more (0 when it was gone already).
    pub fn remove(&self, hold: HoldId) -> usize {
        let key = (hold.model.0, hold.first.0);
        let mut shard = self.shards[shard_of(hold.model, hold.first)].lock();
        let Some(list) = shard.get_mut(&key) else {
            return 0;
        };
        let mut unpinned = 0;
        if let Some(i) = list.iter().position(|h| h.id == hold.id) {
            let gone = list.swap_remove(i);
            self.holds.fetch_sub(1, Ordering::Relaxed);
            unpinned = gone.hashes.len() - shared_on(list, gone.pod, &gone.hashes);
        }
        if list.is_empty() {
            shard.remove(&key);
        }
        unpinned
    }

    /// Holds in place.
    pub fn holds(&self) -> usize {
        self.holds.load(Ordering::Relaxed)
    }

    /// Blocks held, summed over the holds (for tests and inspection).
    pub fn blocks(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .values()
                    .flatten()
                    .map(|h| h.hashes.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Raises `matched[i]` to candidate `i`'s longest tentative match (blocks) among the holds
    /// that still claim theirs, if longer, counts in `heads[i]` the requests in flight on
    /// candidate `i` that share the first block, and sets `pinned[i]` to the longest match
    /// among all its holds (the blocks requests in flight there pin, claiming or not).
    pub fn extend_matches(
        &self,
        model: ModelKey,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        matched: &mut [usize],
        heads: &mut [u32],
        pinned: &mut [usize],
    ) {
        let Some(&first) = hashes.first() else {
            return;
        };
        if self.holds() == 0 {
            return;
        }
        let shard = self.shards[shard_of(model, first)].lock();
        let Some(list) = shard.get(&(model.0, first.0)) else {
            return;
        };
        // Every in-flight request sharing the first block is in `list` (hundreds under a common
        // system prompt): find each hold's candidate in the walk's slot table, not by a scan.
        let mut positions = CandidatePositions::default();
        positions.rebuild(candidates);
        for held in list {
            let Some(ci) = positions.position(held.pod) else {
                continue;
            };
            heads[ci] += 1;
            let most = held.hashes.len().min(hashes.len());
            let claims = held.claims();
            if pinned[ci] >= most && (matched[ci] >= most || !claims) {
                continue;
            }
            let common = common_prefix(&held.hashes, hashes);
            pinned[ci] = pinned[ci].max(common);
            if claims {
                matched[ci] = matched[ci].max(common);
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
        t.add(m, chain("aaaabbbbccccXXXX").into(), pods[0]);
        t.add(m, chain("aaaabbbbccccddddeeeeffffggggYYYY").into(), pods[1]);
        let query = chain("aaaabbbbccccddddeeeeffffgggghhhh");
        let mut matched = vec![0; 3];
        t.extend_matches(m, &query, &pods, &mut matched, &mut [0; 8], &mut [0; 8]);
        assert_eq!(matched, [3, 7, 0]);
        // A longer match from the index is kept.
        let mut matched = vec![5, 2, 1];
        t.extend_matches(m, &query, &pods, &mut matched, &mut [0; 8], &mut [0; 8]);
        assert_eq!(matched, [5, 7, 1]);
    }

    #[test]
    fn a_removed_hold_leaves_other_holds_of_the_same_blocks() {
        let t = TentativeEntries::default();
        let m = ModelKey::of("m");
        let p: Arc<[BlockHash]> = chain("aaaabbbbcccc").into();
        let (a, _) = t.add(m, p.clone(), PodSlot(4)).unwrap();
        let (b, _) = t.add(m, p.clone(), PodSlot(4)).unwrap();
        let (c, _) = t.add(m, p.clone(), PodSlot(5)).unwrap();
        assert_eq!((t.holds(), t.blocks()), (3, 9));
        t.remove(a);
        let mut matched = vec![0, 0];
        t.extend_matches(
            m,
            &p,
            &[PodSlot(4), PodSlot(5)],
            &mut matched,
            &mut [0; 8],
            &mut [0; 8],
        );
        assert_eq!(matched, [3, 3]);
        t.remove(b);
        t.remove(c);
        t.remove(c);
        assert_eq!((t.holds(), t.blocks()), (0, 0));
        let mut matched = vec![0, 0];
        t.extend_matches(
            m,
            &p,
            &[PodSlot(4), PodSlot(5)],
            &mut matched,
            &mut [0; 8],
            &mut [0; 8],
        );
        assert_eq!(matched, [0, 0]);
    }

    #[test]
    fn a_pods_holds_pin_the_union_of_their_blocks() {
        let t = TentativeEntries::default();
        let m = ModelKey::of("m");
        let (pod, other) = (PodSlot(1), PodSlot(2));
        // A 4-block prompt, then one sharing its first 3 blocks: 4 + 1 blocks pinned.
        let (a, pinned_a) = t.add(m, chain("aaaabbbbccccdddd").into(), pod).unwrap();
        let (b, pinned_b) = t.add(m, chain("aaaabbbbccccXXXXYYYY").into(), pod).unwrap();
        assert_eq!((pinned_a, pinned_b), (4, 2));
        // The same prompt on another pod pins all its blocks there.
        let (c, pinned_c) = t.add(m, chain("aaaabbbbccccdddd").into(), other).unwrap();
        assert_eq!(pinned_c, 4);
        // Removing the first leaves the head pinned by the second: only its last block goes.
        assert_eq!(t.remove(a), 1);
        assert_eq!(t.remove(b), 5);
        assert_eq!(t.remove(b), 0, "already gone");
        assert_eq!(t.remove(c), 4);
        // The blocks in flight a query shares, per candidate, claiming or not.
        t.add(m, chain("aaaabbbbXXXX").into(), pod);
        let (mut matched, mut pinned) = (vec![0, 0], vec![0, 0]);
        let query = chain("aaaabbbbcccc");
        t.extend_matches(
            m,
            &query,
            &[pod, other],
            &mut matched,
            &mut [0; 2],
            &mut pinned,
        );
        assert_eq!((matched, pinned), (vec![2, 0], vec![2, 0]));
    }

    #[test]
    fn common_prefix_of_chains() {
        let a = chain("aaaabbbbccccdddd");
        for (other, want) in [
            ("aaaabbbbccccdddd", 4),
            ("aaaabbbbXXXX", 2),
            ("Xaaa", 0),
            ("aaaabbbbccccddddeeee", 4),
            ("", 0),
        ] {
            assert_eq!(common_prefix(&a, &chain(other)), want, "{other}");
        }
    }

    #[test]
    fn models_do_not_share_holds() {
        let t = TentativeEntries::default();
        let p = chain("aaaabbbb");
        t.add(ModelKey::of("m"), p.clone().into(), PodSlot(0));
        let mut matched = vec![0];
        t.extend_matches(
            ModelKey::of("other"),
            &p,
            &[PodSlot(0)],
            &mut matched,
            &mut [0; 8],
            &mut [0; 8],
        );
        assert_eq!(matched, [0]);
    }
}
