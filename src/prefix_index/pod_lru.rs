//! One pod's bounded recency list of block entries: a slab of 20-byte nodes with `u32` links.
//! Hand-written rather than the `lru` crate, for memory: `lru` adds its own hash map and a
//! boxed node with 64-bit links per entry, where this list's node is all a pod adds (42.3 B per
//! entry with the reverse map, against a 64 B goal; benches/RESULTS.md).
//!
//! Nodes live in a `Vec` (grown by doubling, capped at the capacity, so a full list allocates
//! exactly `capacity` nodes) and form a doubly linked list from most to least recent. There is
//! no per-pod lookup table: the reverse map stores, for each pod holding an entry, the node that
//! holds it, so "does this pod hold it, and where" is one reverse-map lookup. Inserting into a
//! full list reuses the least recent node and returns the entry it held (the eviction). A node
//! keeps its index while the entry stays, so the reverse map's node numbers stay valid.
//!
//! A removed entry (the affinity mode's corrections, [`PodLru::remove`]) leaves its node on the
//! list as a tombstone, moved to the tail: tombstones are always the least recent nodes, so a
//! full list reuses them before it evicts a live entry, and the insert path needs no check of
//! its own (the eviction reads the tail's key anyway; a tombstone's model is [`TOMBSTONE`]).

use super::Key;
use super::models::ModelId;

/// "No node" in links and lookups.
pub const NIL: u32 = u32::MAX;

/// The model of a tombstone node (never an interned model id, see [`ModelId`]).
const TOMBSTONE: ModelId = ModelId::MAX;

/// 20 bytes: the 8-byte hash is stored at 4-byte alignment.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
struct Node {
    hash: u64,
    model: ModelId,
    prev: u32,
    next: u32,
}

/// Where [`PodLru::insert_front`] put a new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// A new node; the list had room.
    Fresh(u32),
    /// The least recent node, whose entry (returned) was evicted.
    Replaced(u32, Key),
}

#[derive(Debug)]
pub struct PodLru {
    nodes: Vec<Node>,
    capacity: u32,
    head: u32,
    tail: u32,
    /// Tombstone nodes at the tail (0 unless the affinity mode corrects its estimate from the
    /// engine's reports).
    tombstones: u32,
}

impl PodLru {
    pub fn new(capacity: usize) -> PodLru {
        assert!(
            capacity > 0 && capacity < NIL as usize,
            "capacity out of range"
        );
        PodLru {
            nodes: Vec::new(),
            capacity: capacity as u32,
            head: NIL,
            tail: NIL,
            tombstones: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len() - self.tombstones as usize
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Nodes allocated, held or tombstones (a capacity below it needs a rebuild).
    pub fn slab_len(&self) -> usize {
        self.nodes.len()
    }

    /// Raises the capacity (never below the slab's length: shrinking means rebuilding).
    pub fn grow(&mut self, capacity: usize) {
        assert!(
            capacity >= self.nodes.len() && capacity < NIL as usize,
            "capacity out of range"
        );
        self.capacity = capacity as u32;
    }

    /// Heap bytes allocated.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
    }

    /// The entry held by node `idx` (a node of this list).
    pub fn key(&self, idx: u32) -> Key {
        let node = self.nodes[idx as usize];
        Key {
            hash: node.hash,
            model: node.model,
        }
    }

    /// Reads node `idx` and returns bits of it (for a batch of touches whose cache misses
    /// overlap, ahead of the dependent list updates; see [`super::touch_all`]).
    pub fn touch(&self, idx: u32) -> u32 {
        self.nodes[idx as usize].prev
    }

    /// Makes node `idx` the most recent.
    #[inline(always)]
    pub fn move_to_front(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.link_front(idx);
        }
    }

    /// Node `idx` (a held entry) and every held entry less recent than it, with their keys.
    pub fn node_and_older(&self, idx: u32) -> Vec<(u32, Key)> {
        let mut out = Vec::new();
        let mut i = idx;
        while i != NIL && self.nodes[i as usize].model != TOMBSTONE {
            out.push((i, self.key(i)));
            i = self.nodes[i as usize].next;
        }
        out
    }

    /// Removes the entry of node `idx` (a held entry of this list): the node becomes a
    /// tombstone at the tail, reused by a later insert into the full list.
    pub fn remove(&mut self, idx: u32) {
        self.unlink(idx);
        let old_tail = self.tail;
        {
            let node = &mut self.nodes[idx as usize];
            node.model = TOMBSTONE;
            node.prev = old_tail;
            node.next = NIL;
        }
        if old_tail == NIL {
            self.head = idx;
        } else {
            self.nodes[old_tail as usize].next = idx;
        }
        self.tail = idx;
        self.tombstones += 1;
    }

    /// Adds `key` (not in the list) as the most recent entry, evicting the least recent if full
    /// (a tombstone at the tail is reused without an eviction).
    #[inline(always)]
    pub fn insert_front(&mut self, key: Key) -> Placed {
        if self.nodes.len() < self.capacity as usize {
            if self.nodes.len() == self.nodes.capacity() {
                let target = (self.nodes.len() * 2).max(16).min(self.capacity as usize);
                self.nodes.reserve_exact(target - self.nodes.len());
            }
            let idx = self.nodes.len() as u32;
            self.nodes.push(Node {
                hash: key.hash,
                model: key.model,
                prev: NIL,
                next: NIL,
            });
            self.link_front(idx);
            return Placed::Fresh(idx);
        }
        // Full: the least recent node becomes the most recent, holding `key`.
        let idx = self.tail;
        let old = self.key(idx);
        if idx != self.head {
            let prev = self.nodes[idx as usize].prev;
            self.nodes[prev as usize].next = NIL;
            self.tail = prev;
            self.nodes[self.head as usize].prev = idx;
        }
        self.nodes[idx as usize] = Node {
            hash: key.hash,
            model: key.model,
            prev: NIL,
            next: if idx == self.head { NIL } else { self.head },
        };
        self.head = idx;
        if old.model == TOMBSTONE {
            self.tombstones -= 1;
            return Placed::Fresh(idx);
        }
        Placed::Replaced(idx, old)
    }

    /// Removes every entry, returning their keys (in no particular order).
    pub fn drain(&mut self) -> Vec<Key> {
        let keys = if self.tombstones == 0 {
            (0..self.nodes.len() as u32).map(|i| self.key(i)).collect()
        } else {
            self.keys_by_recency()
        };
        self.tombstones = 0;
        self.nodes = Vec::new();
        self.head = NIL;
        self.tail = NIL;
        keys
    }

    /// Held keys from most to least recent (for tests and inspection).
    pub fn keys_by_recency(&self) -> Vec<Key> {
        let mut out = Vec::with_capacity(self.len());
        let mut i = self.head;
        while i != NIL && self.nodes[i as usize].model != TOMBSTONE {
            out.push(self.key(i));
            i = self.nodes[i as usize].next;
        }
        out
    }

    fn unlink(&mut self, idx: u32) {
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn link_front(&mut self, idx: u32) {
        let old_head = self.head;
        {
            let node = &mut self.nodes[idx as usize];
            node.prev = NIL;
            node.next = old_head;
        }
        if old_head != NIL {
            self.nodes[old_head as usize].prev = idx;
        }
        self.head = idx;
        if self.tail == NIL {
            self.tail = idx;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(h: u64) -> Key {
        Key { hash: h, model: 0 }
    }

    #[test]
    fn node_is_20_bytes() {
        assert_eq!(size_of::<Node>(), 20);
    }

    #[test]
    fn evicts_least_recent() {
        let mut lru = PodLru::new(2);
        assert_eq!(lru.insert_front(k(1)), Placed::Fresh(0));
        assert_eq!(lru.insert_front(k(2)), Placed::Fresh(1));
        lru.move_to_front(0);
        assert_eq!(lru.insert_front(k(3)), Placed::Replaced(1, k(2)));
        assert_eq!(lru.keys_by_recency(), [k(3), k(1)]);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.insert_front(k(4)), Placed::Replaced(0, k(1)));
        lru.move_to_front(1);
        assert_eq!(lru.keys_by_recency(), [k(3), k(4)]);
        assert_eq!(lru.key(1), k(3));
    }

    #[test]
    fn capacity_one_and_drain() {
        let mut lru = PodLru::new(1);
        assert_eq!(lru.insert_front(k(1)), Placed::Fresh(0));
        assert_eq!(lru.insert_front(k(2)), Placed::Replaced(0, k(1)));
        assert_eq!(lru.drain(), [k(2)]);
        assert_eq!(lru.len(), 0);
        assert_eq!(lru.insert_front(k(5)), Placed::Fresh(0));
    }

    #[test]
    fn removed_entries_are_reused_before_any_eviction() {
        let mut lru = PodLru::new(3);
        for h in 1..=3 {
            lru.insert_front(k(h));
        }
        lru.remove(1); // k(2)
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.keys_by_recency(), [k(3), k(1)]);
        assert_eq!(lru.node_and_older(2), [(2, k(3)), (0, k(1))]);
        assert_eq!(lru.insert_front(k(4)), Placed::Fresh(1));
        assert_eq!(lru.insert_front(k(5)), Placed::Replaced(0, k(1)));
        assert_eq!(lru.keys_by_recency(), [k(5), k(4), k(3)]);
        // Everything removed, then refilled: no eviction until the list is full again.
        for idx in [0, 1, 2] {
            lru.remove(idx);
        }
        assert_eq!(lru.len(), 0);
        assert!(lru.keys_by_recency().is_empty());
        assert!(lru.drain().is_empty());
        lru.insert_front(k(6));
        lru.remove(0);
        assert_eq!(lru.insert_front(k(7)), Placed::Fresh(1));
        assert_eq!(lru.insert_front(k(8)), Placed::Fresh(2));
        assert_eq!(lru.insert_front(k(9)), Placed::Fresh(0));
        assert_eq!(lru.insert_front(k(10)), Placed::Replaced(1, k(7)));
        assert_eq!(lru.drain().len(), 3);
    }

    #[test]
    fn full_list_allocates_exactly_its_capacity() {
        let mut lru = PodLru::new(100);
        for h in 0..250 {
            lru.insert_front(k(h));
        }
        assert_eq!(lru.heap_bytes(), 100 * 20);
    }
}
