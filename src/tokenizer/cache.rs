//! The answer cache and the calls in flight, in one map per shard.
//!
//! A key (an input's 64-bit digest) is in one of two states: `Pending` (a call is in flight; its
//! shared future is handed to whoever asks meanwhile: single-flight) or `Ready` (the tokens).
//! A hit takes its shard's read lock only and sets the entry's reference bit; no lock is global.
//!
//! Eviction is CLOCK per shard: `Ready` keys sit in a ring in insertion order; to make room the
//! hand takes the oldest, and a key referenced since it last passed gets its bit cleared and a
//! second round, the others go. New entries start unreferenced, so a burst of one-off prompts
//! evicts itself before the prompts asked again. The budget (entries and total tokens) is split
//! evenly across the shards; an answer larger than a shard's token budget is not cached.
//! Failed calls are not cached.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use futures_util::future::{BoxFuture, Shared};
use parking_lot::RwLock;

use super::{TokenizeError, Tokens};

/// A call in flight, awaited by every asker of its key.
pub(super) type SharedCall = Shared<BoxFuture<'static, Result<Tokens, TokenizeError>>>;

/// Shards of a big cache (power of two).
const MAX_SHARDS: usize = 16;
/// A cache gets one shard per this many entries (up to [`MAX_SHARDS`]): a small cache is one
/// shard, so its bound is exact.
const ENTRIES_PER_SHARD: usize = 64;

/// What the cache has for a key.
pub(super) enum Found {
    Hit(Tokens),
    /// A call for this key is in flight.
    Join(SharedCall),
}

enum Slot {
    Ready {
        tokens: Tokens,
        referenced: AtomicBool,
    },
    Pending(SharedCall),
}

impl Slot {
    fn found(&self) -> Found {
        match self {
            Slot::Ready { tokens, referenced } => {
                referenced.store(true, Relaxed);
                Found::Hit(tokens.clone())
            }
            Slot::Pending(call) => Found::Join(call.clone()),
        }
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<u64, Slot>,
    /// The `Ready` keys, oldest first (invariant: exactly the `Ready` keys of `map`).
    ring: VecDeque<u64>,
    /// Tokens held by the `Ready` entries.
    tokens: usize,
}

pub(super) struct Cache {
    shards: Box<[RwLock<Shard>]>,
    entries_per_shard: usize,
    tokens_per_shard: usize,
}

impl Cache {
    /// A cache of at most `max_entries` answers and `max_tokens` tokens (0 entries: nothing is
    /// cached, calls in flight are still shared).
    pub(super) fn new(max_entries: usize, max_tokens: usize) -> Cache {
        let shards = (max_entries / ENTRIES_PER_SHARD)
            .clamp(1, MAX_SHARDS)
            .next_power_of_two();
        Cache {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            entries_per_shard: max_entries.div_ceil(shards),
            tokens_per_shard: max_tokens.div_ceil(shards),
        }
    }

    fn shard(&self, key: u64) -> &RwLock<Shard> {
        // The low bits pick the HashMap bucket; the shard takes high ones.
        &self.shards[(key >> 48) as usize & (self.shards.len() - 1)]
    }

    /// The hit path: one shard's read lock.
    pub(super) fn lookup(&self, key: u64) -> Option<Found> {
        self.shard(key).read().map.get(&key).map(Slot::found)
    }

    /// Looks again under the write lock; if the key is still unknown, registers the call that
    /// `start` makes and returns `Ok` with it (the caller leads), else what is there now.
    pub(super) fn lead_or_join(
        &self,
        key: u64,
        start: impl FnOnce() -> SharedCall,
    ) -> Result<SharedCall, Found> {
        let mut shard = self.shard(key).write();
        match shard.map.get(&key) {
            Some(slot) => Err(slot.found()),
            None => {
                let call = start();
                shard.map.insert(key, Slot::Pending(call.clone()));
                Ok(call)
            }
        }
    }

    /// Ends the call in flight for `key`: its answer is cached if it succeeded and fits.
    /// Returns the number of entries evicted to make room.
    pub(super) fn complete(&self, key: u64, result: &Result<Tokens, TokenizeError>) -> u64 {
        let mut shard = self.shard(key).write();
        shard.end_call(key);
        match result {
            Ok(tokens) => shard.insert(
                key,
                tokens.clone(),
                self.entries_per_shard,
                self.tokens_per_shard,
            ),
            Err(_) => 0,
        }
    }

    /// Forgets the call in flight for `key`, which ended without an answer: the next request
    /// for the key calls again instead of joining it.
    pub(super) fn abandon(&self, key: u64) {
        self.shard(key).write().end_call(key);
    }

    /// Answers cached and the tokens they hold.
    pub(super) fn size(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(e, t), s| {
            let s = s.read();
            (e + s.ring.len(), t + s.tokens)
        })
    }
}

impl Shard {
    /// Removes the call in flight for `key`, if one is (a `Ready` entry stays).
    fn end_call(&mut self, key: u64) {
        if let Some(Slot::Pending(_)) = self.map.get(&key) {
            self.map.remove(&key);
        }
    }

    fn insert(&mut self, key: u64, tokens: Tokens, max_entries: usize, max_tokens: usize) -> u64 {
        if max_entries == 0 || tokens.len() > max_tokens || self.map.contains_key(&key) {
            return 0;
        }
        let mut evicted = 0;
        while self.ring.len() >= max_entries || self.tokens + tokens.len() > max_tokens {
            let Some(victim) = self.ring.pop_front() else {
                break;
            };
            match self.map.get(&victim) {
                Some(Slot::Ready { referenced, .. }) if referenced.swap(false, Relaxed) => {
                    self.ring.push_back(victim);
                }
                Some(Slot::Ready { tokens, .. }) => {
                    self.tokens -= tokens.len();
                    self.map.remove(&victim);
                    evicted += 1;
                }
                // Not reached (the ring holds `Ready` keys only); dropping the key is safe.
                Some(Slot::Pending(_)) | None => {}
            }
        }
        self.tokens += tokens.len();
        self.ring.push_back(key);
        self.map.insert(
            key,
            Slot::Ready {
                tokens,
                referenced: AtomicBool::new(false),
            },
        );
        evicted
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tokens(n: usize) -> Tokens {
        Tokens(Arc::from(vec![7u32; n]))
    }

    fn fill(cache: &Cache, key: u64, n: usize) -> u64 {
        cache.complete(key, &Ok(tokens(n)))
    }

    fn cached(cache: &Cache, key: u64) -> bool {
        matches!(cache.lookup(key), Some(Found::Hit(_)))
    }

    #[test]
    fn a_hit_returns_the_same_tokens() {
        let cache = Cache::new(4, 100);
        assert!(cache.lookup(1).is_none());
        fill(&cache, 1, 3);
        let Some(Found::Hit(t)) = cache.lookup(1) else {
            panic!("a miss")
        };
        assert_eq!(&*t, &[7, 7, 7]);
        assert_eq!(cache.size(), (1, 3));
    }

    #[test]
    fn the_clock_spares_a_referenced_entry() {
        let cache = Cache::new(3, 100);
        for k in 1..=3 {
            fill(&cache, k, 1);
        }
        assert!(cached(&cache, 1)); // referenced: survives the next eviction
        assert_eq!(fill(&cache, 4, 1), 1);
        assert!(cached(&cache, 1));
        assert!(!cached(&cache, 2));
        assert!(cached(&cache, 3) && cached(&cache, 4));
        assert_eq!(cache.size(), (3, 3));
    }

    #[test]
    fn the_token_budget_evicts_and_an_oversized_answer_is_not_kept() {
        let cache = Cache::new(10, 10);
        fill(&cache, 1, 4);
        fill(&cache, 2, 4);
        assert_eq!(fill(&cache, 3, 4), 1);
        assert_eq!(cache.size(), (2, 8));
        assert!(!cached(&cache, 1));
        assert_eq!(fill(&cache, 4, 11), 0);
        assert!(!cached(&cache, 4));
        assert_eq!(cache.size(), (2, 8));
    }

    #[test]
    fn errors_and_a_zero_budget_cache_nothing() {
        let cache = Cache::new(4, 100);
        cache.complete(
            1,
            &Err(TokenizeError::ConnectionRefused {
                url: "http://x".into(),
            }),
        );
        assert!(!cached(&cache, 1));
        let none = Cache::new(0, 100);
        fill(&none, 1, 1);
        assert!(!cached(&none, 1));
        assert_eq!(none.size(), (0, 0));
    }

    #[test]
    fn a_big_cache_is_sharded_within_its_budget() {
        let cache = Cache::new(4096, 1 << 20);
        assert_eq!(cache.shards.len(), 16);
        for k in 0..10_000u64 {
            fill(&cache, k.wrapping_mul(0x9E37_79B9_7F4A_7C15), 10);
        }
        let (entries, tokens) = cache.size();
        assert!(entries <= 4096 && entries > 3000, "{entries}");
        assert_eq!(tokens, entries * 10);
    }
}
