//! The prefix index: which pods were recently sent which prompt blocks (semantics doc §3).
//!
//! Two structures kept exactly in step:
//! - per pod, a bounded LRU ([`pod_lru`]) of `(model, block hash)` entries, `maxHashCacheSize` long;
//! - a reverse map ([`reverse`]) from entry to the set of pods holding it, split into
//!   [`SHARDS`] shards by key so scoring and recording from many tasks rarely meet.
//!
//! Recording for a pod takes that pod's mutex and, while holding it, the write lock of each shard
//! it changes (lock order: pod, then shard), so the reverse map always equals the union of the
//! LRUs. Scoring takes only shard read locks and never touches an LRU, so lookups never refresh
//! recency. No lock spans the whole index on the hot path; the pod table behind an `RwLock` is
//! used only to add, remove and count pods.
//!
//! Record inserts a prompt's hashes deepest first, so its first blocks are the most recent and a
//! full list drops the deepest blocks of old prompts first. Longest match walks hashes from the
//! last to the first; each candidate in a hash's pod set without a match yet gets `index + 1`,
//! until `top_k` candidates have matched. When a set holds more unmatched candidates than slots
//! remain, the winners are drawn with the caller's seeded RNG.

mod pod_lru;
mod reverse;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::{Mutex, RwLock};
use rand::Rng;
use rand::seq::index::sample;

use crate::hashing::BlockHash;
use pod_lru::{PodLru, Touch};
use reverse::ReverseShard;

/// Number of reverse-map shards (a power of two).
pub const SHARDS: usize = 64;

/// A pod's dense identity inside the index (never reused within a process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodSlot(pub u32);

/// A model's identity inside the index: `XXH64(model name)`, the seed of its hash chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey(pub u64);

impl ModelKey {
    pub fn of(model: &str) -> ModelKey {
        ModelKey(xxhash_rust::xxh64::xxh64(model.as_bytes(), 0))
    }
}

/// One index entry: a block hash recorded for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub model: ModelKey,
    pub hash: BlockHash,
}

impl EntryKey {
    #[cfg(test)]
    pub fn new(model: u64, hash: BlockHash) -> EntryKey {
        EntryKey {
            model: ModelKey(model),
            hash,
        }
    }

    /// Keyed 64-bit mix for hash tables (folded multiply; the seed is random per index so
    /// crafted prompts cannot aim at one bucket).
    fn mix(self, seed: u64) -> u64 {
        let x = self.hash.0 ^ self.model.0.rotate_left(29) ^ seed;
        let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15_u128;
        (p as u64) ^ ((p >> 64) as u64)
    }

    /// Shard from bits 32..38 of the mix: hashbrown uses the top 7 bits as slot tags and the low
    /// bits as the bucket index, so the shard must come from neither (taking the top bits left
    /// only 2 tag values per shard and tripled the cost of a lookup).
    fn shard(self, seed: u64) -> usize {
        (self.mix(seed) >> 32) as usize & (SHARDS - 1)
    }
}

#[derive(Debug)]
struct PodState {
    lru: PodLru,
    removed: bool,
}

#[derive(Debug)]
struct PodEntry {
    slot: PodSlot,
    state: Mutex<PodState>,
}

/// A registered pod. Recording goes through the handle; after `remove_pod` it records nothing.
#[derive(Debug, Clone)]
pub struct PodHandle(Arc<PodEntry>);

impl PodHandle {
    pub fn slot(&self) -> PodSlot {
        self.0.slot
    }
}

/// What one record changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecordOutcome {
    /// Entries newly added to the pod's list.
    pub inserted: usize,
    /// Entries evicted, counted per model of the evicted entry.
    pub evicted: Vec<(ModelKey, u64)>,
}

/// The index. Cheap to share (`Arc`); all methods take `&self`.
#[derive(Debug)]
pub struct PrefixIndex {
    capacity: usize,
    seed: u64,
    shards: Box<[RwLock<ReverseShard>]>,
    pods: RwLock<HashMap<PodSlot, Arc<PodEntry>>>,
    next_slot: AtomicU32,
}

impl PrefixIndex {
    /// An empty index holding up to `capacity` entries per pod (`maxHashCacheSize`).
    pub fn new(capacity: usize) -> PrefixIndex {
        let capacity = capacity.clamp(1, u32::MAX as usize - 1);
        let seed = rand::rng().random::<u64>();
        PrefixIndex {
            capacity,
            seed,
            shards: (0..SHARDS)
                .map(|_| RwLock::new(ReverseShard::new(seed)))
                .collect(),
            pods: RwLock::new(HashMap::new()),
            next_slot: AtomicU32::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Registers a new pod with an empty list.
    pub fn add_pod(&self) -> PodHandle {
        let slot = PodSlot(self.next_slot.fetch_add(1, Ordering::Relaxed));
        let entry = Arc::new(PodEntry {
            slot,
            state: Mutex::new(PodState {
                lru: PodLru::new(self.capacity, self.seed),
                removed: false,
            }),
        });
        self.pods.write().insert(slot, entry.clone());
        PodHandle(entry)
    }

    /// Drops a pod's list and removes it from every set. Returns the number of entries dropped
    /// (these are not evictions). Later records through its handle are ignored.
    pub fn remove_pod(&self, slot: PodSlot) -> usize {
        let Some(entry) = self.pods.write().remove(&slot) else {
            return 0;
        };
        let mut state = entry.state.lock();
        state.removed = true;
        let keys = state.lru.drain();
        for &key in &keys {
            self.shards[key.shard(self.seed)].write().remove(key, slot);
        }
        keys.len()
    }

    /// Records a prompt's hashes for a pod, deepest first.
    pub fn record(&self, pod: &PodHandle, model: ModelKey, hashes: &[BlockHash]) -> RecordOutcome {
        let mut outcome = RecordOutcome::default();
        let slot = pod.slot();
        let mut state = pod.0.state.lock();
        if state.removed {
            return outcome;
        }
        for &hash in hashes.iter().rev() {
            let key = EntryKey { model, hash };
            match state.lru.touch(key) {
                Touch::Refreshed => {}
                Touch::Inserted => {
                    outcome.inserted += 1;
                    self.shards[key.shard(self.seed)].write().add(key, slot);
                }
                Touch::Evicted(old) => {
                    outcome.inserted += 1;
                    self.shards[old.shard(self.seed)].write().remove(old, slot);
                    self.shards[key.shard(self.seed)].write().add(key, slot);
                    match outcome.evicted.iter_mut().find(|(m, _)| *m == old.model) {
                        Some((_, n)) => *n += 1,
                        None => outcome.evicted.push((old.model, 1)),
                    }
                }
            }
        }
        outcome
    }

    /// Longest match per candidate (blocks matched, 0 for none), in candidate order. At most
    /// `top_k` candidates get a non-zero match; `tie_rng` is called only if a tie must be broken.
    pub fn longest_matches<R: Rng>(
        &self,
        model: ModelKey,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        top_k: usize,
        tie_rng: impl FnOnce() -> R,
    ) -> Vec<usize> {
        let mut matched = vec![0usize; candidates.len()];
        let mut by_slot: Vec<(PodSlot, usize)> = candidates
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, i))
            .collect();
        by_slot.sort_unstable();
        let limit = top_k.min(candidates.len());
        let mut found = 0;
        let mut fresh: Vec<usize> = Vec::new();
        let mut rng_slot = None;
        let mut tie_rng = Some(tie_rng);
        for (i, &hash) in hashes.iter().enumerate().rev() {
            if found >= limit {
                break;
            }
            let key = EntryKey { model, hash };
            fresh.clear();
            self.shards[key.shard(self.seed)]
                .read()
                .for_each_pod(key, |pod| {
                    if let Ok(pos) = by_slot.binary_search_by_key(&pod, |&(s, _)| s) {
                        let ci = by_slot[pos].1;
                        if matched[ci] == 0 {
                            fresh.push(ci);
                        }
                    }
                });
            let room = limit - found;
            if fresh.len() > room {
                fresh.sort_unstable();
                let rng = rng_slot.get_or_insert_with(|| (tie_rng.take().expect("once"))());
                let chosen: Vec<usize> = sample(rng, fresh.len(), room)
                    .into_iter()
                    .map(|j| fresh[j])
                    .collect();
                fresh = chosen;
            }
            for &ci in &fresh {
                matched[ci] = i + 1;
            }
            found += fresh.len();
        }
        matched
    }

    /// Entries across all pods (a block held by three pods counts three).
    pub fn entries(&self) -> usize {
        self.pods
            .read()
            .values()
            .map(|p| p.state.lock().lru.len())
            .sum()
    }

    /// Entries of one pod.
    pub fn pod_entries(&self, slot: PodSlot) -> usize {
        self.pods
            .read()
            .get(&slot)
            .map_or(0, |p| p.state.lock().lru.len())
    }

    /// Distinct `(model, hash)` keys in the reverse map.
    pub fn distinct_entries(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Heap bytes held by all lists and shards (capacity-based).
    pub fn heap_bytes(&self) -> usize {
        let pods: usize = self
            .pods
            .read()
            .values()
            .map(|p| p.state.lock().lru.heap_bytes())
            .sum();
        pods + self
            .shards
            .iter()
            .map(|s| s.read().heap_bytes())
            .sum::<usize>()
    }

    /// The pods holding `key` (sorted; for tests and inspection).
    pub fn pods_holding(&self, model: ModelKey, hash: BlockHash) -> Vec<PodSlot> {
        let key = EntryKey { model, hash };
        let mut out = Vec::new();
        self.shards[key.shard(self.seed)]
            .read()
            .for_each_pod(key, |p| out.push(p));
        out.sort_unstable();
        out
    }

    /// A pod's entries from most to least recent (for tests and inspection).
    pub fn pod_keys_by_recency(&self, slot: PodSlot) -> Vec<EntryKey> {
        self.pods
            .read()
            .get(&slot)
            .map(|p| p.state.lock().lru.keys_by_recency())
            .unwrap_or_default()
    }
}
