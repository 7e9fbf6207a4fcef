//! Blocks awaited from an engine: a decision-time hold on a pod whose view is live waits for
//! the engine's own `BlockStored` of the held head's last full block, and ends there.
//!
//! An [`Awaited`] is shared by the view (filed under the token-chain hash it waits for) and the
//! hold. Whichever comes first wins (one compare-exchange): the view's store marks it stored
//! when it applies a block with that hash; the hold's end (its request completed, failed or
//! expired) marks it ended. A block the view holds already when it is awaited is stored at
//! once (the engine announces a block when it stores it, not when it reuses it).
//!
//! The view files what it waits for in a small map behind its own mutex, apart from its blocks:
//! a store looks the map up only while it is not empty (one atomic load per event otherwise),
//! and an ending hold never takes a lock. Entries leave the map when their block is stored, or
//! in one sweep of the ended ones when the map has doubled since the last (a pod with caching
//! off stores nothing: its map stays within twice the holds in flight, and at least
//! [`SWEEP_MIN`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

/// Entries the map holds before its first sweep.
const SWEEP_MIN: usize = 64;

const WAITING: u8 = 0;
const STORED: u8 = 1;
const ENDED: u8 = 2;

/// One awaited block: waiting, stored by the engine, or given up by its hold.
#[derive(Debug)]
pub struct Awaited {
    state: AtomicU8,
}

impl Awaited {
    fn new(state: u8) -> Arc<Awaited> {
        Arc::new(Awaited {
            state: AtomicU8::new(state),
        })
    }

    /// Whether the engine stored the block (before the hold ended).
    pub fn is_stored(&self) -> bool {
        self.state.load(Ordering::Acquire) == STORED
    }

    /// Ends the wait, if it still waits; returns whether the engine stored the block first.
    pub fn end(&self) -> bool {
        match self
            .state
            .compare_exchange(WAITING, ENDED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => false,
            Err(state) => state == STORED,
        }
    }

    /// Marks the block stored, if it still waits; returns whether it did.
    fn store(&self) -> bool {
        self.state
            .compare_exchange(WAITING, STORED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }
}

#[derive(Debug)]
struct Map {
    by_hash: HashMap<u64, Vec<Arc<Awaited>>>,
    /// Entries (awaited blocks) in `by_hash`.
    entries: usize,
    /// The entry count at which the next [`Awaiting::add`] sweeps the ended ones.
    sweep_at: usize,
}

/// What one view waits for.
#[derive(Debug)]
pub(super) struct Awaiting {
    map: Mutex<Map>,
    /// Entries in the map, read without its lock by every store.
    entries: AtomicUsize,
}

impl Default for Awaiting {
    fn default() -> Self {
        Awaiting {
            map: Mutex::new(Map {
                by_hash: HashMap::new(),
                entries: 0,
                sweep_at: SWEEP_MIN,
            }),
            entries: AtomicUsize::new(0),
        }
    }
}

impl Awaiting {
    /// A wait for `hash`; `held`: the view holds it already (stored at once, not filed). The
    /// caller holds the view's read lock, so no store runs between its check and this filing.
    pub(super) fn add(&self, hash: u64, held: bool) -> Arc<Awaited> {
        if held {
            return Awaited::new(STORED);
        }
        let awaited = Awaited::new(WAITING);
        let mut map = self.map.lock();
        if map.entries >= map.sweep_at {
            let mut entries = 0;
            map.by_hash.retain(|_, list| {
                list.retain(|a| a.is_waiting());
                entries += list.len();
                !list.is_empty()
            });
            map.entries = entries;
            map.sweep_at = (2 * entries).max(SWEEP_MIN);
        }
        map.by_hash.entry(hash).or_default().push(awaited.clone());
        map.entries += 1;
        self.entries.store(map.entries, Ordering::Relaxed);
        awaited
    }

    /// The map, for a store to look its blocks up in; `None` (no lock taken) while it is
    /// empty. The caller holds the view's write lock: a wait filed before it took that lock is
    /// seen here.
    pub(super) fn lock_if_any(&self) -> Option<StoredBlocks<'_>> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(StoredBlocks {
            map: self.map.lock(),
            entries: &self.entries,
        })
    }
}

/// The awaited blocks, locked for one store.
pub(super) struct StoredBlocks<'a> {
    map: MutexGuard<'a, Map>,
    entries: &'a AtomicUsize,
}

impl StoredBlocks<'_> {
    /// The view stored `hash`: every wait for it ends stored; returns how many.
    pub(super) fn stored(&mut self, hash: u64) -> usize {
        let Some(list) = self.map.by_hash.remove(&hash) else {
            return 0;
        };
        self.map.entries -= list.len();
        self.entries.store(self.map.entries, Ordering::Relaxed);
        list.iter().filter(|a| a.store()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(a: &Awaiting) -> usize {
        a.map.lock().entries
    }

    #[test]
    fn the_first_of_store_and_end_wins() {
        let a = Awaiting::default();
        let stored = a.add(1, false);
        let ended = a.add(1, false);
        assert!(!ended.end(), "ended before any store");
        let mut blocks = a.lock_if_any().unwrap();
        assert_eq!(blocks.stored(2), 0);
        assert_eq!(blocks.stored(1), 1, "only the wait still waiting");
        drop(blocks);
        assert!(stored.is_stored() && !ended.is_stored());
        assert!(stored.end() && stored.end(), "stored stays stored");
        assert!(a.lock_if_any().is_none(), "nothing left to look up");
        assert!(a.add(3, true).is_stored(), "held already");
        assert_eq!(entries(&a), 0);
    }

    #[test]
    fn waits_that_end_unstored_are_swept() {
        // A pod that never stores (caching off): 10 requests in flight at a time.
        let a = Awaiting::default();
        let mut live = std::collections::VecDeque::new();
        for i in 0..10_000u64 {
            live.push_back(a.add(i, false));
            if live.len() > 10 {
                live.pop_front().unwrap().end();
            }
            assert!(
                entries(&a) <= SWEEP_MIN + 1,
                "{} entries at {i}",
                entries(&a)
            );
        }
        assert!(live.iter().all(|w| w.is_waiting()));
    }
}
