//! A pod's room in its engine's KV cache, in the picker's prompt blocks: what lets the latency
//! model ([`super::latency`]) tell a wait for KV space from a wait for a slot.
//!
//! An engine that admits a request only when its blocks fit (vLLM's scheduler: the waiting
//! queue's head starts when the blocks it lacks, less those running requests already hold, fit
//! in the free pool; nothing behind it starts before it) queues requests while slots are free.
//! How long a request waits for KV then depends on the request and the pod: one whose head the
//! requests running there already hold takes only its own tail, one the pod runs nothing of
//! takes every block of its prompt. Moving a tenant away from the pod that runs it makes its
//! wait longer, not shorter; and the engine's `running` while such a queue shows is not its
//! slot count but how many of those requests happened to fit.
//!
//! Per pod:
//! - **pinned**: the union of the prompt blocks of this picker's requests in flight on the pod
//!   (their tentative holds, [`crate::prefix_index::TentativeEntries`], which say what each
//!   hold adds to and frees from it), kept by the holds as they come and go ([`PinnedBlocks`]);
//! - **capacity**: learned from the engine's KV usage gauge (`vllm:kv_cache_usage_perc`,
//!   `sglang:token_usage`: the fraction of its blocks running requests hold) at every scrape
//!   that shows no queue (every request in flight is running), as the ratio of the moving sums
//!   of pinned blocks and usage over about [`CAPACITY_WINDOW`] scrapes (a scrape of an almost
//!   empty cache weighs little). In the picker's blocks, so the engine's tokenizer, template and
//!   block size need not be known; the output blocks of running requests come in as their
//!   share of the usage.
//!
//! Then, before a request is picked:
//! - a queue the engine shows waits for KV when a request of the running ones' mean size would
//!   not fit in what they leave free (by the engine's own usage at that scrape: usage x
//!   (running + 1) > running), or the picker's blocks in flight leave no room for one more of
//!   their mean size (the latency model learns the slot count from the other queues only, and
//!   forgets one learned before the room could tell them apart the first time a queue waits
//!   for KV); once one did, the engine is known to admit by KV space (an engine whose queues
//!   leave room in its cache never is, and no wait for KV is predicted for it);
//! - a request waits for KV when the blocks in flight on the pod and the blocks it would add
//!   there (its prompt's, less those requests in flight there pin) exceed the capacity, for as
//!   many completions as free the excess, each freeing the blocks one request in flight pins on
//!   average (rounded up).
//!
//! Nothing is predicted before a capacity is learned, or without holds (`tentative` off). The
//! picker sees only its own requests: with several replicas each learns the capacity its share
//! of the usage maps to.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Scrapes the capacity's moving sums weigh (each keeps `1 - 1/CAPACITY_WINDOW` of the last).
pub const CAPACITY_WINDOW: f64 = 16.0;

/// The blocks a pod's requests in flight pin, and how many holds pin them, shared with the
/// holds.
#[derive(Debug, Clone, Default)]
pub struct PinnedBlocks(Arc<[AtomicI64; 2]>);

impl PinnedBlocks {
    /// A hold that pinned `blocks` more.
    pub fn pin(&self, blocks: usize) {
        self.0[0].fetch_add(blocks as i64, Ordering::Relaxed);
        self.0[1].fetch_add(1, Ordering::Relaxed);
    }

    /// A hold's end, which freed `blocks`.
    pub fn unpin(&self, blocks: usize) {
        self.0[0].fetch_sub(blocks as i64, Ordering::Relaxed);
        self.0[1].fetch_sub(1, Ordering::Relaxed);
    }

    /// Blocks pinned now.
    pub fn get(&self) -> f64 {
        self.0[0].load(Ordering::Relaxed).max(0) as f64
    }

    /// Holds that pin them.
    pub fn holds(&self) -> f64 {
        self.0[1].load(Ordering::Relaxed).max(0) as f64
    }
}

/// What an engine scrape's queue waits for ([`KvRoom::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// No queue.
    None,
    /// A slot: the queue's head would fit in the KV cache.
    Slot,
    /// KV space; `first`: the first such queue the pod showed.
    Kv { first: bool },
}

/// What the model knows of one pod's KV room.
#[derive(Debug, Default)]
pub struct KvRoom {
    pinned: PinnedBlocks,
    /// Moving sums of the blocks pinned and of the usage, at scrapes without a queue.
    sums: Mutex<(f64, f64)>,
    /// Their ratio (`f64` bits; 0: not learned), read without the lock.
    capacity: AtomicU64,
    /// The engine has shown a queue while the blocks in flight filled the capacity.
    admits_by_kv: AtomicBool,
}

impl KvRoom {
    /// The counter the pod's holds keep.
    pub fn pins(&self) -> PinnedBlocks {
        self.pinned.clone()
    }

    /// Blocks the picker's requests in flight pin on the pod.
    pub fn pinned(&self) -> f64 {
        self.pinned.get()
    }

    /// Learns from one engine scrape: its KV `usage` (0..1) while `running` requests run and
    /// `waiting` queue; says what the queue, if any, waits for.
    pub fn observe(&self, usage: f64, running: f64, waiting: f64) -> Queue {
        if !(usage.is_finite() && running.is_finite() && waiting.is_finite()) || usage < 0.0 {
            return Queue::None;
        }
        if waiting >= 1.0 {
            // The head of the queue, of the running requests' mean size, would not fit in the
            // blocks they leave free; or the picker's blocks in flight leave no room.
            let engine_full = running >= 1.0 && usage * (running + 1.0) > running;
            if !(engine_full || self.full()) {
                return Queue::Slot;
            }
            let first = !self.admits_by_kv.swap(true, Ordering::Relaxed);
            return Queue::Kv { first };
        }
        let keep = 1.0 - 1.0 / CAPACITY_WINDOW;
        let mut sums = self.sums.lock();
        *sums = (
            sums.0 * keep + self.pinned(),
            sums.1 * keep + usage.min(1.0),
        );
        let capacity = if sums.0 > 0.0 && sums.1 > 0.0 {
            sums.0 / sums.1
        } else {
            0.0
        };
        self.capacity.store(capacity.to_bits(), Ordering::Relaxed);
        Queue::None
    }

    /// The capacity in prompt blocks; `None` until learned.
    pub fn capacity(&self) -> Option<f64> {
        Some(f64::from_bits(self.capacity.load(Ordering::Relaxed))).filter(|c| *c > 0.0)
    }

    /// Whether a queue the engine shows now waits for KV: the blocks in flight leave no room
    /// for one more request of their mean size (none learned: no). A queue's head that would
    /// fit waits for a slot.
    pub fn full(&self) -> bool {
        let (pinned, holds) = (self.pinned.get(), self.pinned.holds());
        holds >= 1.0
            && self
                .capacity()
                .is_some_and(|c| pinned + pinned / holds >= c)
    }

    /// Whether the engine has shown a wait for KV space.
    pub fn admits_by_kv(&self) -> bool {
        self.admits_by_kv.load(Ordering::Relaxed)
    }

    /// The completions a request that adds `blocks` on the pod waits for before its blocks
    /// fit, with `inflight` requests of this picker there (0 while they fit, nothing is
    /// learned, or the engine has shown no wait for KV space).
    pub fn completions_to_fit(&self, blocks: f64, inflight: i64) -> f64 {
        if !self.admits_by_kv() {
            return 0.0;
        }
        let (Some(capacity), pinned) = (self.capacity(), self.pinned()) else {
            return 0.0;
        };
        let excess = pinned + blocks - capacity;
        if excess <= 0.0 || inflight < 1 || pinned <= 0.0 {
            return 0.0;
        }
        (excess / (pinned / inflight as f64)).ceil()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacity_is_pinned_blocks_over_usage_at_scrapes_without_a_queue() {
        let room = KvRoom::default();
        assert_eq!(room.capacity(), None);
        room.pins().pin(50);
        room.observe(0.25, 1.0, 0.0);
        assert_eq!(room.capacity(), Some(200.0));
        // A queue says nothing of the capacity (its requests in flight are not all running).
        room.pins().pin(150);
        room.observe(0.3, 3.0, 2.0);
        assert_eq!(room.capacity(), Some(200.0));
        // An emptier cache weighs less: the ratio of the sums.
        room.pins().unpin(190);
        room.observe(0.05, 1.0, 0.0);
        let c = room.capacity().unwrap();
        assert!((c - (50.0 * 15.0 / 16.0 + 10.0) / (0.25 * 15.0 / 16.0 + 0.05)).abs() < 1e-9);
    }

    #[test]
    fn a_request_waits_for_kv_only_when_its_new_blocks_do_not_fit() {
        let room = KvRoom::default();
        // Nothing learned: no wait, not full. Then 200 blocks; 3 requests in flight pin 150
        // (50 each on average).
        for _ in 0..3 {
            room.pins().pin(50);
        }
        assert_eq!(room.completions_to_fit(100.0, 3), 0.0);
        assert!(!room.full());
        room.observe(0.75, 3.0, 0.0);
        assert_eq!(room.capacity(), Some(200.0));
        // An engine that has shown no queue while full predicts no wait for KV.
        assert_eq!(room.completions_to_fit(160.0, 3), 0.0);
        room.pins().pin(60);
        assert!(room.full());
        assert_eq!(room.observe(0.75, 3.0, 1.0), Queue::Kv { first: true });
        assert_eq!(room.observe(0.75, 3.0, 1.0), Queue::Kv { first: false });
        assert!(room.admits_by_kv());
        room.pins().unpin(60);
        // A request that shares their head and adds 10 blocks fits; one that adds 60 waits
        // for one completion, one that adds 160 for three.
        assert_eq!(room.completions_to_fit(10.0, 3), 0.0);
        assert_eq!(room.completions_to_fit(60.0, 3), 1.0);
        assert_eq!(room.completions_to_fit(160.0, 3), 3.0);
    }

    #[test]
    fn a_queue_with_room_for_one_more_request_is_no_wait_for_kv() {
        let room = KvRoom::default();
        // 200 blocks, two requests in flight pin 100: room for one more of 50.
        room.pins().pin(60);
        room.pins().pin(40);
        room.observe(0.5, 2.0, 0.0);
        assert!(!room.full());
        assert_eq!(room.observe(0.5, 2.0, 4.0), Queue::Slot);
        assert!(!room.admits_by_kv());
        // By the engine's own usage: two running hold 70%, a third of their size does not fit
        // in the 30% left (whatever the picker's own count says).
        assert_eq!(room.observe(0.7, 2.0, 1.0), Queue::Kv { first: true });
        let room = KvRoom::default();
        // A third: 150 pinned leave less than the mean (50).
        room.pins().pin(60);
        room.pins().pin(40);
        room.observe(0.5, 2.0, 0.0);
        room.pins().pin(51);
        assert!(room.full());
    }
}
