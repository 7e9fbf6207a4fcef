//! What one engine holds in its KV cache, from its own KV-cache events: engine truth, beside
//! the prefix index's estimate.
//!
//! An engine names its blocks by its own hashes (vLLM: SHA-256 or Python's `hash` over the
//! parent's hash, the tokens and extra keys; not reproducible here), so the view re-hashes each
//! stored block by its token ids, chained on its parent's hash in this view ([`token_chain`]),
//! and keeps two tables: engine hash -> token-chain hash (to chain the next store and to apply
//! removals) and the set of token-chain hashes held (with a side count for the rare hash that
//! several engine blocks carry, so a block costs one 8-byte set slot, not a 16-byte entry). A request is matched by
//! hashing its engine tokens the same way and finding the longest run of leading blocks the
//! view holds. A stored block whose parent the view does not know (events missed) is skipped
//! and counted, and so is everything chained on it.
//!
//! One view per pod, behind its own lock: the pod's event consumer writes, requests read; no
//! lock spans pods. `live` says whether the view is current (events flowing, no unfilled gap);
//! a pod whose view is not live is routed by the estimate. `max_blocks` bounds the memory of a
//! view whatever a publisher sends (stores beyond it are refused and counted).
//!
//! A decision-time hold on a pod whose view is live awaits the engine's store of the held
//! head's last full block ([`EngineView::await_block`], `awaiting.rs`): the store that applies it
//! ends the hold's claim, which the view covers from then on.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use xxhash_rust::xxh3::xxh3_64_with_seed;

mod awaiting;

pub use awaiting::Awaited;
use awaiting::Awaiting;

/// The views' maps are keyed by block hashes (the engine's, and the token chain's): a fast
/// seeded hasher instead of SipHash (every event and every match hashes keys).
type Hasher = foldhash::fast::RandomState;

/// The chain's seed for a first block (no parent).
const CHAIN_SEED: u64 = 0x656e_6769_6e65_5f76;

/// The token-chain hash of each full block of `tokens` (`block_size` tokens per block): block
/// `i` hashes its token ids (little-endian u32) seeded by block `i - 1`'s hash.
pub fn token_chain(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = CHAIN_SEED;
    let mut bytes = block_buffer(block_size, tokens.len());
    for block in tokens.chunks_exact(block_size) {
        parent = block_hash(parent, block, &mut bytes);
        out.push(parent);
    }
    out
}

/// A buffer for one block's token bytes, never larger than `tokens` tokens' bytes: the block
/// size comes from the engine's events. None on a little-endian host ([`block_hash`] hashes
/// the ids in place).
fn block_buffer(block_size: usize, tokens: usize) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        return Vec::new();
    }
    Vec::with_capacity(block_size.min(tokens) * 4)
}

fn block_hash(parent: u64, block: &[u32], bytes: &mut Vec<u8>) -> u64 {
    // The chain hashes little-endian ids: on a little-endian host they are the slice's own
    // bytes (no copy: a 16-token block's ingest and match cost less, benches/engine_truth.rs).
    if cfg!(target_endian = "little") {
        return xxh3_64_with_seed(bytemuck::cast_slice(block), parent);
    }
    bytes.clear();
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(bytes, parent)
}

/// What applying one `BlockStored` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    /// Blocks added to the view (or re-stored).
    pub added: usize,
    /// Blocks skipped: unknown parent, too few token ids, or the view at `max_blocks`.
    pub skipped: usize,
}

/// A longest match in the engine's view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineMatch {
    /// Leading blocks of the request the engine holds.
    pub blocks: usize,
    /// Tokens per block (the engine's block size).
    pub block_size: usize,
}

impl EngineMatch {
    pub fn tokens(&self) -> usize {
        self.blocks * self.block_size
    }
}

#[derive(Debug, Default)]
struct ViewState {
    /// Tokens per block, from the engine's events (0 until the first store).
    block_size: usize,
    /// Engine block hash -> token-chain hash.
    by_engine: HashMap<u64, u64, Hasher>,
    /// Token-chain hashes held.
    held: Held,
    /// Scratch for hashing a block's token bytes.
    bytes: Vec<u8>,
}

impl ViewState {
    /// Starts the view over at `block_size` if it had another (an engine restarted with another
    /// `--block-size`; 0 before the first store).
    #[inline]
    fn set_block_size(&mut self, block_size: usize) {
        if self.block_size != block_size {
            self.by_engine.clear();
            self.held.clear();
            self.block_size = block_size;
        }
    }

    /// Maps engine block `engine` to token-chain hash `ours` and holds it; false, changing
    /// nothing, for a new block while the view holds `max_blocks`.
    #[inline]
    fn put(&mut self, engine: u64, ours: u64, max_blocks: usize) -> bool {
        let mapped = self.by_engine.len();
        match self.by_engine.entry(engine) {
            Entry::Occupied(e) => {
                // Stored again (vLLM re-announces a block it re-cached): same content.
                if *e.get() != ours {
                    let old = std::mem::replace(e.into_mut(), ours);
                    self.held.release(old);
                    self.held.add(ours);
                }
            }
            Entry::Vacant(e) => {
                // Engine blocks, not distinct contents: blocks of equal tokens under other
                // engine hashes (another LoRA, a cache salt) each take an entry.
                if mapped >= max_blocks {
                    return false;
                }
                e.insert(ours);
                self.held.add(ours);
            }
        }
        true
    }
}

/// One engine's KV cache as its events describe it.
#[derive(Debug)]
pub struct EngineView {
    state: RwLock<ViewState>,
    live: AtomicBool,
    max_blocks: usize,
    /// Blocks the view held at its last change (read without the lock, for gauges).
    blocks: AtomicU64,
    /// Blocks that holds wait for the engine to store.
    awaiting: Awaiting,
}

impl EngineView {
    /// An empty view, not live, holding at most `max_blocks` blocks.
    pub fn new(max_blocks: usize) -> EngineView {
        EngineView {
            state: RwLock::new(ViewState::default()),
            live: AtomicBool::new(false),
            max_blocks,
            blocks: AtomicU64::new(0),
            awaiting: Awaiting::default(),
        }
    }

    /// Awaits the engine's store of the block whose token-chain hash is `hash` (at this view's
    /// block size): the returned wait is stored when a `BlockStored` applies it, at once if
    /// the view holds it already.
    pub fn await_block(&self, hash: u64) -> Arc<Awaited> {
        // Under the read lock: no store runs between the check and the filing.
        let s = self.state.read();
        self.awaiting.add(hash, s.held.contains(hash))
    }

    /// Whether requests are matched against this view (events flowing, nothing missed).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
    }

    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.blocks.load(Ordering::Relaxed) as usize
    }

    /// Tokens per block (0 before the first store).
    pub fn block_size(&self) -> usize {
        self.state.read().block_size
    }

    /// Heap bytes of the view's maps: hashbrown keeps a power-of-two number of buckets (its
    /// capacity is 7/8 of them), each an entry plus one control byte.
    pub fn heap_bytes(&self) -> usize {
        fn table<K, V, S: BuildHasher>(m: &HashMap<K, V, S>) -> usize {
            let buckets = (m.capacity() * 8).div_ceil(7).next_power_of_two();
            buckets * (std::mem::size_of::<(K, V)>() + 1)
        }
        fn set<K, S: BuildHasher>(m: &HashSet<K, S>) -> usize {
            let buckets = (m.capacity() * 8).div_ceil(7).next_power_of_two();
            buckets * (std::mem::size_of::<K>() + 1)
        }
        let s = self.state.read();
        table(&s.by_engine) + set(&s.held.once) + table(&s.held.more)
    }

    /// Applies a `BlockStored`: `engine_hashes[i]` holds `token_ids[i * block_size..][..block_size]`,
    /// chained on `parent` (the engine hash of the block before the first; `None`: the first
    /// block of a sequence). A block size different from the view's resets the view (an
    /// engine restarted with another `--block-size`).
    pub fn store(
        &self,
        parent: Option<u64>,
        engine_hashes: &[u64],
        token_ids: &[u32],
        block_size: usize,
    ) -> Stored {
        let mut out = Stored::default();
        if block_size == 0 {
            out.skipped = engine_hashes.len();
            return out;
        }
        let mut guard = self.state.write();
        let s = &mut *guard;
        s.set_block_size(block_size);
        let mut awaited = self.awaiting.lock_if_any();
        let mut chain = match parent {
            None => Some(CHAIN_SEED),
            Some(p) => s.by_engine.get(&p).copied(),
        };
        for (i, &engine) in engine_hashes.iter().enumerate() {
            let tokens = token_ids.get(i * block_size..(i + 1) * block_size);
            let (Some(parent), Some(tokens)) = (chain, tokens) else {
                out.skipped += engine_hashes.len() - i;
                break;
            };
            let ours = block_hash(parent, tokens, &mut s.bytes);
            if !s.put(engine, ours, self.max_blocks) {
                out.skipped += engine_hashes.len() - i;
                break;
            }
            out.added += 1;
            if let Some(awaited) = awaited.as_mut() {
                awaited.stored(ours);
            }
            chain = Some(ours);
        }
        self.blocks.store(s.held.len() as u64, Ordering::Relaxed);
        out
    }

    /// Applies a `BlockRemoved`; returns the blocks removed (unknown hashes are ignored).
    pub fn remove(&self, engine_hashes: &[u64]) -> usize {
        let mut s = self.state.write();
        let ViewState {
            by_engine, held, ..
        } = &mut *s;
        let mut removed = 0;
        for engine in engine_hashes {
            if let Some(ours) = by_engine.remove(engine) {
                held.release(ours);
                removed += 1;
            }
        }
        self.blocks.store(held.len() as u64, Ordering::Relaxed);
        removed
    }

    /// Applies `AllBlocksCleared` (or drops a view that can no longer be trusted); returns the
    /// blocks dropped.
    pub fn clear(&self) -> usize {
        let mut s = self.state.write();
        let dropped = s.held.len();
        s.by_engine = HashMap::default();
        s.held = Held::default();
        self.blocks.store(0, Ordering::Relaxed);
        dropped
    }

    /// The longest run of leading blocks of `chain` (the request's [`token_chain`] at this
    /// view's block size) the engine holds, found by bisection: engines evict a sequence's
    /// deepest blocks first, so a held block's parent is held too; where an engine broke that,
    /// the match lands between the two, never an error.
    pub fn longest_match(&self, chain: &[u64]) -> usize {
        let s = self.state.read();
        let holds = |i: usize| s.held.contains(chain[i]);
        let (mut lo, mut hi) = (0usize, chain.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if holds(mid - 1) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// The token-chain hashes a view holds, each with how many engine blocks carry it (equal
/// tokens under equal parents, e.g. stored under two LoRA ids, share one chain hash).
#[derive(Debug, Default)]
struct Held {
    /// Every hash held.
    once: HashSet<u64, Hasher>,
    /// Carriers beyond the first, for the hashes that have more than one.
    more: HashMap<u64, u32, Hasher>,
}

impl Held {
    fn add(&mut self, h: u64) {
        if !self.once.insert(h) {
            *self.more.entry(h).or_insert(0) += 1;
        }
    }

    /// One carrier of `h` fewer; the hash goes with its last.
    fn release(&mut self, h: u64) {
        match self.more.entry(h) {
            Entry::Occupied(mut e) => {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            Entry::Vacant(_) => {
                self.once.remove(&h);
            }
        }
    }

    fn contains(&self, h: u64) -> bool {
        self.once.contains(&h)
    }

    /// Distinct hashes held.
    fn len(&self) -> usize {
        self.once.len()
    }

    fn clear(&mut self) {
        self.once.clear();
        self.more.clear();
    }
}

#[cfg(test)]
mod tests;
