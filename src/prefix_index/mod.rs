//! The prefix index: which pods were recently sent which prompt blocks (semantics doc §3).
//!
//! Two structures kept exactly in step:
//! - per pod, a bounded recency list ([`pod_lru`]) of `(model, block hash)` entries,
//!   `maxHashCacheSize` long;
//! - a reverse map ([`reverse`]) from entry to the pods holding it and, per pod, the list node
//!   that holds it. It is split into [`SHARDS`] shards by key so scoring and recording from many
//!   tasks rarely meet. "Does this pod hold the entry, and where" is a reverse-map lookup, so the
//!   lists need no lookup table of their own.
//!
//! Each pod also keeps its churn ([`PrefixIndex::churn`]): the entries its records evicted, as a
//! fraction of its capacity, a moving average over about [`CHURN_WINDOW`] records per pod (two
//! atomics per record, no lock); the affinity mode places new work where it is lowest.
//!
//! Models are interned to `u32` ids ([`models`]); an entry costs a 20-byte list node plus a
//! 16-byte reverse slot and its 1-byte tag (shared by the pods holding it) at 47-94 % table load.
//! The slot stores the key as one word, the block hash xor a keyed salt of the model
//! ([`model_salt`]), instead of hash and model id.
//!
//! Recording for a pod takes that pod's mutex and, while holding it, shard locks (lock order:
//! pod, then shard; never two shards at once), so the reverse map equals the union of the lists
//! whenever no record is in progress. It runs in three steps, each shard lock taken at most once
//! per step ([`shard_batch`]): (1) under read locks, find which of the prompt's entries the pod
//! already holds and in which node (only this pod's recorder, which holds the pod mutex, changes
//! that); (2) without shard locks, apply the inserts to the pod's list deepest first, refreshing
//! held entries and reusing the least recent node when full; (3) under write locks, apply the
//! resulting reverse-map changes (evicted entries lose the pod, new ones gain it), in the order
//! they were made for each entry. Scoring takes only shard read locks and never touches a list,
//! so lookups never refresh recency. No lock spans the whole index on the hot path; the pod table
//! behind an `RwLock` is used only to add, remove and count pods.
//!
//! Record inserts a prompt's hashes deepest first, so its first blocks are the most recent and a
//! full list drops the deepest blocks of old prompts first. Longest match walks hashes from the
//! last to the first; each candidate in a hash's pod set without a match yet gets `index + 1`,
//! until `top_k` candidates have matched. When a set holds more unmatched candidates than slots
//! remain, the winners are drawn with the caller's seeded RNG. The walk looks hashes up in
//! batches (the last [`FIRST_BATCH`], then doubling), each batch grouped by shard; candidates
//! are found by pod slot in a small hash table ([`candidates`]). The affinity mode's lookup
//! bisects each chain instead ([`chain`]).
//!
//! Neither call allocates on its hot path except for its result: each reuses a per-thread set of
//! buffers.
//!
//! The index is far larger than the CPU caches, so nearly every entry a call reads is a cache
//! (and TLB) miss. Before a batch's lookups, a branch-free pass reads the tag words of all its
//! keys, and before refreshing held list nodes one reads those nodes: the misses then overlap
//! instead of each waiting behind the mispredicted branches of the one before (the same effect
//! as prefetching, in safe code). Lookups first read-lock every shard of the batch
//! ([`PrefixIndex::read_batch`]), so the whole batch's misses form one wave; a lock taken between
//! shard groups would end the wave, since its atomic waits for the loads before it. Writes lock
//! one shard at a time and touch that shard's group first ([`touch_all`]); a read-locked warm-up
//! wave before them, and touching the slots as well, measured slower (`benches/RESULTS.md`).

mod candidates;
mod chain;
mod models;
mod pod_lru;
mod reverse;
mod shard_batch;
mod tentative;
#[cfg(test)]
mod tests;

pub use tentative::{HoldId, TentativeEntries};

use std::cell::RefCell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use rand::Rng;
use rand::seq::index::sample;

use crate::decaying_sum::DecayingSum;
use crate::hashing::BlockHash;
use candidates::CandidatePositions;
use models::{ModelId, ModelIds};
use pod_lru::{NIL, Placed, PodLru};
use reverse::{PodSet, ReverseShard, SHARED};
use shard_batch::ShardBatch;

/// Number of reverse-map shards (a power of two).
pub const SHARDS: usize = 16;

/// Hashes the longest-match walk looks up in its first batch (then 2x, 4x, ... as many).
const FIRST_BATCH: usize = 8;

/// A pod's dense identity inside the index (never reused within a process; below 2^31).
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

/// An entry as stored: the block hash and the interned model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    hash: u64,
    model: ModelId,
}

/// The salt of a model's key words. The reverse map stores and compares a key as one word,
/// its block hash xor the salt of its model, drawn from the model id and the index seed, which
/// keeps its slots at 16 bytes. For one model the word is the hash xored with one constant, so no
/// two keys of a model ever share a word; keys of two models share one only if their hashes
/// differ by exactly the xor of the two (secret) salts: odds of 2^-64 per pair, the same as two
/// block hashes colliding, which the chain already accepts.
fn model_salt(model: ModelId, seed: u64) -> u64 {
    fold(u64::from(model) ^ seed)
}

/// Keyed 64-bit mix of a key word for the tables (the seed is random per index, so crafted
/// prompts cannot aim at one slot).
fn mix_word(word: u64, seed: u64) -> u64 {
    fold(word ^ seed.rotate_left(32))
}

/// Folded multiply: the two halves of a 64 x 64-bit product, xored.
fn fold(x: u64) -> u64 {
    let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15_u128;
    (p as u64) ^ ((p >> 64) as u64)
}

/// A key with its word and mix computed once: tables take their slot from the low bits of the
/// mix, the shard comes from bits 32.. (independent of any table size below 2^32 slots).
#[derive(Debug, Clone, Copy)]
struct Hashed {
    key: Key,
    /// The block hash xor the model's salt ([`model_salt`]).
    word: u64,
    mix: u64,
}

impl Hashed {
    fn new(key: Key, seed: u64) -> Hashed {
        Hashed::salted(key, model_salt(key.model, seed), seed)
    }

    /// [`Hashed::new`] with the model's salt computed once for many keys of one model.
    fn salted(key: Key, salt: u64, seed: u64) -> Hashed {
        let word = key.hash ^ salt;
        Hashed {
            key,
            word,
            mix: mix_word(word, seed),
        }
    }

    /// The key of block `hash` of `model`, whose salt ([`model_salt`]) is `salt`.
    #[inline]
    fn block(hash: BlockHash, model: ModelId, salt: u64, seed: u64) -> Hashed {
        Hashed::salted(
            Key {
                hash: hash.0,
                model,
            },
            salt,
            seed,
        )
    }

    fn shard(self) -> usize {
        (self.mix >> 32) as usize & (SHARDS - 1)
    }
}

#[derive(Debug)]
struct PodState {
    lru: PodLru,
    removed: bool,
}

/// Buffers of one record, one set per thread, so a record allocates nothing but its outcome:
/// about 120 bytes per block of the longest prompt the thread recorded (15 KiB at 128 blocks).
#[derive(Debug, Default)]
struct RecordScratch {
    keys: Vec<Hashed>,
    held: Vec<u32>,
    earlier: Vec<u32>,
    latest: Vec<u32>,
    at: Vec<u32>,
    changes: Vec<Change>,
    batch: ShardBatch,
}

#[derive(Debug)]
struct PodEntry {
    slot: PodSlot,
    state: Mutex<PodState>,
    /// Entries this pod's records evicted, as a fraction of its capacity, decaying per record
    /// of the whole index ([`PrefixIndex::churn`]).
    churn: DecayingSum,
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

/// Buffers of one longest-match walk, one set per thread (scoring runs on many threads at once).
#[derive(Debug, Default)]
struct ScoreScratch {
    positions: CandidatePositions,
    fresh: Vec<usize>,
    pods: Vec<PodSlot>,
    keys: Vec<Hashed>,
    sets: Vec<PodSet>,
    batch: ShardBatch,
}

thread_local! {
    static SCORE_SCRATCH: RefCell<ScoreScratch> = RefCell::new(ScoreScratch::default());
    static RECORD_SCRATCH: RefCell<RecordScratch> = RefCell::new(RecordScratch::default());
}

/// The read locks of a batch's shards ([`PrefixIndex::read_batch`]).
struct BatchGuards<'a>([Option<RwLockReadGuard<'a, ReverseShard>>; SHARDS]);

impl BatchGuards<'_> {
    /// The shard `s`, which the batch has a group in.
    fn get(&self, s: usize) -> &ReverseShard {
        self.0[s]
            .as_deref()
            .expect("a shard of the batch is locked")
    }
}

/// A reverse-map change made by a record: `key` gains the pod in `node`, or loses it (`NIL`).
#[derive(Debug, Clone, Copy)]
struct Change {
    key: Hashed,
    node: u32,
}

/// The index. Cheap to share (`Arc`); all methods take `&self`.
#[derive(Debug)]
pub struct PrefixIndex {
    capacity: usize,
    seed: u64,
    models: ModelIds,
    shards: Box<[RwLock<ReverseShard>]>,
    pods: RwLock<HashMap<PodSlot, Arc<PodEntry>>>,
    next_slot: AtomicU32,
    /// Records made so far: the clock of the pods' churn.
    records: AtomicU32,
    /// Pods registered (the churn's window scales with it).
    pod_count: AtomicU32,
}

/// Records per pod over which a pod's churn is averaged (an exponential moving average).
pub const CHURN_WINDOW: u32 = 16;

impl PrefixIndex {
    /// An empty index holding up to `capacity` entries per pod (`maxHashCacheSize`).
    pub fn new(capacity: usize) -> PrefixIndex {
        let capacity = capacity.clamp(1, NIL as usize - 1);
        let seed = rand::rng().random::<u64>();
        PrefixIndex {
            capacity,
            seed,
            models: ModelIds::default(),
            shards: (0..SHARDS)
                .map(|_| RwLock::new(ReverseShard::new(seed)))
                .collect(),
            pods: RwLock::new(HashMap::new()),
            next_slot: AtomicU32::new(0),
            records: AtomicU32::new(0),
            pod_count: AtomicU32::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How fast `pod`'s records evict: entries evicted over about the last [`CHURN_WINDOW`]
    /// records per pod, as a fraction of its capacity (0 for a pod with room). A pod with low
    /// churn keeps what it is sent longest, so new work evicts least there.
    pub fn churn(&self, pod: &PodHandle) -> f64 {
        pod.0
            .churn
            .value(self.records.load(Ordering::Relaxed), self.churn_keep())
    }

    fn churn_keep(&self) -> f64 {
        let pods = self.pod_count.load(Ordering::Relaxed).max(1);
        1.0 - 1.0 / f64::from(CHURN_WINDOW.saturating_mul(pods))
    }

    /// Registers a new pod with an empty list.
    pub fn add_pod(&self) -> PodHandle {
        let slot = PodSlot(self.next_slot.fetch_add(1, Ordering::Relaxed));
        assert!(slot.0 & SHARED == 0, "more than 2^31 pods added");
        let entry = Arc::new(PodEntry {
            slot,
            state: Mutex::new(PodState {
                lru: PodLru::new(self.capacity),
                removed: false,
            }),
            churn: DecayingSum::default(),
        });
        self.pods.write().insert(slot, entry.clone());
        self.pod_count.fetch_add(1, Ordering::Relaxed);
        PodHandle(entry)
    }

    /// Drops a pod's list and removes it from every set. Returns the number of entries dropped
    /// (these are not evictions). Later records through its handle are ignored.
    pub fn remove_pod(&self, slot: PodSlot) -> usize {
        let Some(entry) = self.pods.write().remove(&slot) else {
            return 0;
        };
        self.pod_count.fetch_sub(1, Ordering::Relaxed);
        let mut state = entry.state.lock();
        state.removed = true;
        self.drain_pod(slot, &mut state)
    }

    /// Drops one pod's entries, keeping it registered (its handle keeps recording): its engine
    /// said it holds nothing (it restarted, or its cache was reset). Returns the number of
    /// entries dropped (these are not evictions); 0 for a pod not registered.
    pub fn clear_pod(&self, slot: PodSlot) -> usize {
        let Some(entry) = self.pods.read().get(&slot).cloned() else {
            return 0;
        };
        let mut state = entry.state.lock();
        if state.removed {
            return 0;
        }
        self.drain_pod(slot, &mut state)
    }

    /// Drops every pod's entries, keeping the pods registered (their handles keep recording):
    /// the block layout changed, so no stored hash can match a new prompt. Returns the number of
    /// entries dropped (these are not evictions).
    pub fn clear(&self) -> usize {
        let pods: Vec<Arc<PodEntry>> = self.pods.read().values().cloned().collect();
        pods.iter()
            .map(|entry| {
                let mut state = entry.state.lock();
                if state.removed {
                    0
                } else {
                    self.drain_pod(entry.slot, &mut state)
                }
            })
            .sum()
    }

    /// Empties one pod's list and removes the pod from the reverse map's sets.
    fn drain_pod(&self, slot: PodSlot, state: &mut PodState) -> usize {
        let keys: Vec<Hashed> = state
            .lru
            .drain()
            .into_iter()
            .map(|k| Hashed::new(k, self.seed))
            .collect();
        let batch = ShardBatch::new(keys.iter().map(|k| k.shard()));
        for (s, group) in batch.groups() {
            let mut shard = self.shards[s].write();
            for &j in group {
                shard.remove(keys[j as usize], slot);
            }
        }
        keys.len()
    }

    /// Sets one pod's list capacity (its budget in entries, e.g. sized from its engine's KV
    /// cache); shrinking keeps the most recent entries and drops the rest, which are returned as
    /// evictions per model. A removed pod is left alone.
    pub fn set_pod_capacity(&self, slot: PodSlot, capacity: usize) -> Vec<(ModelKey, u64)> {
        let capacity = capacity.clamp(1, NIL as usize - 1);
        let Some(entry) = self.pods.read().get(&slot).cloned() else {
            return Vec::new();
        };
        let mut state = entry.state.lock();
        if state.removed {
            return Vec::new();
        }
        if capacity >= state.lru.slab_len() {
            state.lru.grow(capacity);
            return Vec::new();
        }
        // Rebuild: drop the pod from every entry, then re-add the most recent `capacity`
        // entries, least recent first so the most recent ends at the front.
        let keys = state.lru.keys_by_recency();
        let hashed: Vec<Hashed> = keys.iter().map(|&k| Hashed::new(k, self.seed)).collect();
        let batch = ShardBatch::new(hashed.iter().map(|k| k.shard()));
        for (s, group) in batch.groups() {
            let mut shard = self.shards[s].write();
            for &j in group {
                shard.remove(hashed[j as usize], slot);
            }
        }
        let mut lru = PodLru::new(capacity);
        let mut nodes = vec![NIL; capacity];
        for j in (0..capacity).rev() {
            nodes[j] = match lru.insert_front(keys[j]) {
                Placed::Fresh(node) | Placed::Replaced(node, _) => node,
            };
        }
        let kept = ShardBatch::new(hashed[..capacity].iter().map(|k| k.shard()));
        for (s, group) in kept.groups() {
            let mut shard = self.shards[s].write();
            for &j in group {
                shard.add(hashed[j as usize], slot, nodes[j as usize]);
            }
        }
        state.lru = lru;
        let mut evicted: Vec<(ModelId, u64)> = Vec::new();
        for k in &keys[capacity..] {
            match evicted.iter_mut().find(|(m, _)| *m == k.model) {
                Some((_, n)) => *n += 1,
                None => evicted.push((k.model, 1)),
            }
        }
        drop(state);
        self.models
            .keys(|key| evicted.iter().map(|&(m, n)| (key(m), n)).collect())
    }

    /// Removes `hashes` of `model` from one pod's list (the entries it holds; the others are
    /// ignored): the engine reported that it no longer holds them. Returns how many it removed.
    pub fn forget(&self, pod: &PodHandle, model: ModelKey, hashes: &[BlockHash]) -> usize {
        let Some(model) = self.models.get(model) else {
            return 0;
        };
        let slot = pod.slot();
        let mut state = pod.0.state.lock();
        if state.removed {
            return 0;
        }
        let salt = model_salt(model, self.seed);
        let mut removed = 0;
        for h in hashes {
            let key = Hashed::block(*h, model, salt, self.seed);
            let mut shard = self.shards[key.shard()].write();
            if let Some(node) = shard.holder_node(key, slot) {
                shard.remove(key, slot);
                state.lru.remove(node);
                removed += 1;
            }
        }
        removed
    }

    /// Drops from one pod's list the entry `hash` of `model` and every entry less recent than
    /// it: the engine reported that it no longer holds that block, so it holds nothing older
    /// either (its cache is LRU too). Returns how many entries were dropped.
    pub fn drop_older(&self, pod: &PodHandle, model: ModelKey, hash: BlockHash) -> usize {
        let Some(model) = self.models.get(model) else {
            return 0;
        };
        let slot = pod.slot();
        let mut state = pod.0.state.lock();
        if state.removed {
            return 0;
        }
        let key = Hashed::new(
            Key {
                hash: hash.0,
                model,
            },
            self.seed,
        );
        let Some(node) = self.shards[key.shard()].read().holder_node(key, slot) else {
            return 0;
        };
        let older = state.lru.node_and_older(node);
        for &(idx, k) in &older {
            let key = Hashed::new(k, self.seed);
            self.shards[key.shard()].write().remove(key, slot);
            state.lru.remove(idx);
        }
        older.len()
    }

    /// One pod's list capacity (0 for an unknown pod).
    pub fn pod_capacity(&self, slot: PodSlot) -> usize {
        self.pods
            .read()
            .get(&slot)
            .map_or(0, |p| p.state.lock().lru.capacity())
    }

    /// Records a prompt's hashes for a pod, deepest first.
    pub fn record(&self, pod: &PodHandle, model: ModelKey, hashes: &[BlockHash]) -> RecordOutcome {
        if hashes.is_empty() {
            return RecordOutcome::default();
        }
        let model = self.models.intern(model);
        RECORD_SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.record_with(pod, model, hashes, &mut scratch),
            // Not expected (a record calls no outside code), but never a panic.
            Err(_) => self.record_with(pod, model, hashes, &mut RecordScratch::default()),
        })
    }

    /// [`PrefixIndex::record`] with its buffers.
    fn record_with(
        &self,
        pod: &PodHandle,
        model: ModelId,
        hashes: &[BlockHash],
        scratch: &mut RecordScratch,
    ) -> RecordOutcome {
        let mut outcome = RecordOutcome::default();
        let slot = pod.slot();
        let mut guard = pod.0.state.lock();
        let PodState { lru, removed } = &mut *guard;
        if *removed {
            return outcome;
        }
        let RecordScratch {
            keys,
            held,
            earlier,
            latest,
            at,
            changes,
            batch,
        } = scratch;
        // Processing order: deepest first.
        let salt = model_salt(model, self.seed);
        keys.clear();
        keys.extend(
            hashes
                .iter()
                .rev()
                .map(|&h| Hashed::block(h, model, salt, self.seed)),
        );

        // 1. Which entries the pod holds now, and in which node.
        self.find_held(slot, keys, held, batch);
        touch_held(lru, held);
        // 2. The pod's list.
        earlier_occurrences(keys, latest, earlier);
        let evicted = self.update_list(lru, keys, held, earlier, at, changes, &mut outcome);
        // 3. The reverse map.
        self.apply_changes(slot, changes, batch);
        let capacity = lru.capacity();
        drop(guard);
        self.note_evictions(pod, &evicted, capacity, &mut outcome);
        outcome
    }

    /// After a record (its pod's mutex released): adds its evictions, `evicted` per model, to
    /// the pod's churn and to `outcome`.
    #[inline]
    fn note_evictions(
        &self,
        pod: &PodHandle,
        evicted: &[(ModelId, u64)],
        capacity: usize,
        outcome: &mut RecordOutcome,
    ) {
        let evicted_entries: u64 = evicted.iter().map(|&(_, n)| n).sum();
        let now = self.records.fetch_add(1, Ordering::Relaxed);
        pod.0.churn.add(
            now,
            self.churn_keep(),
            evicted_entries as f64 / capacity as f64,
        );
        if !evicted.is_empty() {
            outcome.evicted = self
                .models
                .keys(|key| evicted.iter().map(|&(m, n)| (key(m), n)).collect());
        }
    }

    /// Record step 1: `held[j]` = the node of `slot`'s list holding `keys[j]`, else `NIL`
    /// (under shard read locks; only the pod's own recorder, which holds its mutex, changes it).
    /// The three steps stay out of line so profiles (callgrind, perf) show each one's cost.
    #[inline(never)]
    fn find_held(
        &self,
        slot: PodSlot,
        keys: &[Hashed],
        held: &mut Vec<u32>,
        batch: &mut ShardBatch,
    ) {
        held.clear();
        held.resize(keys.len(), NIL);
        batch.regroup(keys.iter().map(|k| k.shard()));
        let shards = self.read_batch(batch, keys);
        for (s, group) in batch.groups() {
            let shard = shards.get(s);
            for &j in group {
                let j = j as usize;
                held[j] = shard.holder_node(keys[j], slot).unwrap_or(NIL);
            }
        }
    }

    /// Read-locks every shard `batch` has a group in, in ascending order, then touches the tag
    /// words of all of `keys` ([`ReverseShard::touch`]) in one loop, so the batch's misses overlap
    /// in one wave. A lock operation is an atomic read-modify-write, which waits for every
    /// earlier load: taking each shard's lock just before its group would cut the misses into a
    /// wave per shard. Holding several read locks cannot deadlock: writers hold one shard at a
    /// time and wait for nothing while they hold it.
    fn read_batch<'a>(&'a self, batch: &ShardBatch, keys: &[Hashed]) -> BatchGuards<'a> {
        let mut guards = BatchGuards(std::array::from_fn(|_| None));
        for (s, _) in batch.groups() {
            guards.0[s] = Some(self.shards[s].read());
        }
        let mut acc = 0;
        for (s, group) in batch.groups() {
            let shard = guards.get(s);
            for &j in group {
                acc ^= shard.touch(keys[j as usize]);
            }
        }
        black_box(acc);
        guards
    }

    /// Record step 2: applies the inserts to the pod's list deepest first and lists the
    /// reverse-map changes they make (in `changes`, in order). A node found in step 1 may have
    /// been reused by an eviction earlier in this record (its key then differs); a key seen
    /// earlier in this record is where that occurrence left it. Returns evictions per model.
    #[expect(
        clippy::too_many_arguments,
        reason = "the record's per-thread buffers, passed apart so each borrow is separate"
    )]
    #[inline(never)]
    fn update_list(
        &self,
        lru: &mut PodLru,
        keys: &[Hashed],
        held: &[u32],
        earlier: &[u32],
        at: &mut Vec<u32>,
        changes: &mut Vec<Change>,
        outcome: &mut RecordOutcome,
    ) -> Vec<(ModelId, u64)> {
        at.clear();
        at.resize(keys.len(), NIL);
        changes.clear();
        let mut evicted: Vec<(ModelId, u64)> = Vec::new();
        // The salt of the last evicted entry's model (evictions mostly share one model).
        let mut last_salt: Option<(ModelId, u64)> = None;
        for (j, k) in keys.iter().enumerate() {
            let known = match earlier[j] {
                NIL => held[j],
                e => at[e as usize],
            };
            if known != NIL && lru.key(known) == k.key {
                lru.move_to_front(known);
                at[j] = known;
                continue;
            }
            outcome.inserted += 1;
            let node = match lru.insert_front(k.key) {
                Placed::Fresh(node) => node,
                Placed::Replaced(node, old) => {
                    let salt = match last_salt {
                        Some((m, salt)) if m == old.model => salt,
                        _ => {
                            let salt = model_salt(old.model, self.seed);
                            last_salt = Some((old.model, salt));
                            salt
                        }
                    };
                    changes.push(Change {
                        key: Hashed::salted(old, salt, self.seed),
                        node: NIL,
                    });
                    match evicted.iter_mut().find(|(m, _)| *m == old.model) {
                        Some((_, n)) => *n += 1,
                        None => evicted.push((old.model, 1)),
                    }
                    node
                }
            };
            changes.push(Change { key: *k, node });
            at[j] = node;
        }
        evicted
    }

    /// Record step 3: applies `changes` to the reverse map under shard write locks, each entry's
    /// changes in the order they were made (evicted entries lose the pod, new ones gain it).
    #[inline(never)]
    fn apply_changes(&self, slot: PodSlot, changes: &[Change], batch: &mut ShardBatch) {
        batch.regroup(changes.iter().map(|c| c.key.shard()));
        for (s, group) in batch.groups() {
            let mut shard = self.shards[s].write();
            touch_all(&shard, group.iter().map(|&c| changes[c as usize].key));
            for &c in group {
                let Change { key, node } = changes[c as usize];
                if node == NIL {
                    shard.remove(key, slot);
                } else {
                    shard.add(key, slot, node);
                }
            }
        }
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
        let limit = top_k.min(candidates.len());
        let Some(model) = self.models.get(model) else {
            return matched;
        };
        SCORE_SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.walk(
                model,
                hashes,
                candidates,
                limit,
                tie_rng,
                &mut scratch,
                &mut matched,
            ),
            // Only if `tie_rng` itself scored on this thread: use fresh buffers.
            Err(_) => self.walk(
                model,
                hashes,
                candidates,
                limit,
                tie_rng,
                &mut ScoreScratch::default(),
                &mut matched,
            ),
        });
        matched
    }

    /// The longest-match walk of [`PrefixIndex::longest_matches`], writing into `matched`: looks
    /// hashes up in batches from the last ([`PrefixIndex::look_up_sets`]), then walks each batch
    /// from its last hash, crediting the candidates in its set ([`credit`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "the walk's inputs and its output buffers, passed apart so each borrow is separate"
    )]
    fn walk<R: Rng>(
        &self,
        model: ModelId,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        limit: usize,
        tie_rng: impl FnOnce() -> R,
        scratch: &mut ScoreScratch,
        matched: &mut [usize],
    ) {
        let ScoreScratch {
            positions,
            fresh,
            pods,
            keys,
            sets,
            batch,
        } = scratch;
        positions.rebuild(candidates);
        let salt = model_salt(model, self.seed);
        let mut found = 0;
        let mut tie = TieRng::new(tie_rng);
        let (mut end, mut batch_len) = (hashes.len(), FIRST_BATCH);
        while end > 0 && found < limit {
            // Look up hashes[start..end], then walk them from the last.
            let start = end.saturating_sub(batch_len);
            keys.clear();
            keys.extend(
                hashes[start..end]
                    .iter()
                    .map(|&h| Hashed::block(h, model, salt, self.seed)),
            );
            self.look_up_sets(keys, batch, sets);
            for p in (0..keys.len()).rev() {
                if found >= limit {
                    break;
                }
                pods.clear();
                match sets[p] {
                    PodSet::Empty => continue,
                    PodSet::One(pod) => pods.push(pod),
                    PodSet::Several => self.shards[keys[p].shard()].read().push_pods(keys[p], pods),
                }
                fresh.clear();
                fresh.extend(
                    pods.iter()
                        .filter_map(|&pod| positions.position(pod))
                        .filter(|&ci| matched[ci] == 0),
                );
                found += credit(fresh, matched, limit - found, start + p + 1, &mut tie);
            }
            end = start;
            batch_len = batch_len.saturating_mul(2);
        }
    }

    /// Walk step: `sets[p]` = the pod set of `keys[p]`, looked up grouped by shard under one
    /// wave of read locks ([`PrefixIndex::read_batch`]). A set of several pods is read again
    /// when the walk reaches it, so hashes the walk never reaches cost one probe, not a copy of
    /// their sets.
    #[inline]
    fn look_up_sets(&self, keys: &[Hashed], batch: &mut ShardBatch, sets: &mut Vec<PodSet>) {
        batch.regroup(keys.iter().map(|k| k.shard()));
        sets.clear();
        sets.resize(keys.len(), PodSet::Empty);
        let shards = self.read_batch(batch, keys);
        for (s, group) in batch.groups() {
            let shard = shards.get(s);
            for &p in group {
                sets[p as usize] = shard.pod_set(keys[p as usize]);
            }
        }
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

    /// Heap bytes held by all lists, shards and the model table (capacity-based).
    pub fn heap_bytes(&self) -> usize {
        let pods: usize = self
            .pods
            .read()
            .values()
            .map(|p| p.state.lock().lru.heap_bytes())
            .sum();
        pods + self.models.heap_bytes()
            + self
                .shards
                .iter()
                .map(|s| s.read().heap_bytes())
                .sum::<usize>()
    }

    /// The pods holding `key` (sorted; for tests and inspection).
    pub fn pods_holding(&self, model: ModelKey, hash: BlockHash) -> Vec<PodSlot> {
        let mut out = Vec::new();
        if let Some(model) = self.models.get(model) {
            let key = Hashed::new(
                Key {
                    hash: hash.0,
                    model,
                },
                self.seed,
            );
            self.shards[key.shard()].read().push_pods(key, &mut out);
        }
        out.sort_unstable();
        out
    }

    /// A pod's entries from most to least recent (for tests and inspection).
    pub fn pod_keys_by_recency(&self, slot: PodSlot) -> Vec<EntryKey> {
        let keys = self
            .pods
            .read()
            .get(&slot)
            .map(|p| p.state.lock().lru.keys_by_recency())
            .unwrap_or_default();
        self.models.keys(|model| {
            keys.iter()
                .map(|k| EntryKey {
                    model: model(k.model),
                    hash: BlockHash(k.hash),
                })
                .collect()
        })
    }
}

/// The walk's tie-break RNG, made by the caller's closure on first use (most walks break no tie).
struct TieRng<R, F> {
    make: Option<F>,
    rng: Option<R>,
}

impl<R, F: FnOnce() -> R> TieRng<R, F> {
    fn new(make: F) -> Self {
        TieRng {
            make: Some(make),
            rng: None,
        }
    }

    /// The RNG, made now if this is its first use.
    fn get(&mut self) -> &mut R {
        let make = &mut self.make;
        self.rng
            .get_or_insert_with(|| (make.take().expect("made once"))())
    }
}

/// Walk step: gives the match `blocks` to the candidates of `fresh` (none matched yet), or to
/// `room` of them drawn with the tie RNG when there are more; returns how many got it.
#[inline]
fn credit<R: Rng, F: FnOnce() -> R>(
    fresh: &mut [usize],
    matched: &mut [usize],
    room: usize,
    blocks: usize,
    tie: &mut TieRng<R, F>,
) -> usize {
    if fresh.len() > room {
        fresh.sort_unstable();
        for j in sample(tie.get(), fresh.len(), room) {
            matched[fresh[j]] = blocks;
        }
        room
    } else {
        for &ci in fresh.iter() {
            matched[ci] = blocks;
        }
        fresh.len()
    }
}

/// Reads the list nodes step 1 of a record found held, in one loop of independent loads, so
/// their cache misses overlap before step 2 refreshes them one by one.
#[inline]
fn touch_held(lru: &PodLru, held: &[u32]) {
    black_box(
        held.iter()
            .filter(|&&node| node != NIL)
            .fold(0, |acc, &node| acc ^ lru.touch(node)),
    );
}

/// Touches the tag words of every key of a batch (see [`ReverseShard::touch`]): one loop of
/// independent loads, so their cache misses overlap. (Touching the slots too, in a second pass,
/// measured slower; see `benches/RESULTS.md`.)
fn touch_all(shard: &ReverseShard, keys: impl Iterator<Item = Hashed>) {
    black_box(keys.fold(0, |acc, key| acc ^ shard.touch(key)));
}

/// For each position of `keys`, the latest earlier position with the same key (`NIL` if none),
/// written to `out`; found with a small linear-probing table of positions (`latest`, at most
/// half full).
fn earlier_occurrences(keys: &[Hashed], latest: &mut Vec<u32>, out: &mut Vec<u32>) {
    let size = (keys.len() * 2).next_power_of_two().max(16);
    let mask = size - 1;
    latest.clear();
    latest.resize(size, NIL);
    out.clear();
    out.resize(keys.len(), NIL);
    for (j, k) in keys.iter().enumerate() {
        let mut i = k.mix.rotate_left(24) as usize & mask;
        loop {
            let e = latest[i];
            if e == NIL {
                latest[i] = j as u32;
                break;
            }
            if keys[e as usize].key == k.key {
                out[j] = e;
                latest[i] = j as u32;
                break;
            }
            i = (i + 1) & mask;
        }
    }
}
