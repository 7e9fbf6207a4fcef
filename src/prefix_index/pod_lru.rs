//! One pod's bounded recency list of block entries: a slab of 20-byte nodes with `u32` links.
//!
//! Nodes live in a `Vec` (grown by doubling, capped at the capacity, so a full list allocates
//! exactly `capacity` nodes) and form a doubly linked list from most to least recent. There is
//! no per-pod lookup table: the reverse map stores, for each pod holding an entry, the node that
//! holds it, so "does this pod hold it, and where" is one reverse-map lookup. Inserting into a
//! full list reuses the least recent node and returns the entry it held (the eviction). A node
//! keeps its index while the entry stays, so the reverse map's node numbers stay valid.

use super::Key;
use super::models::ModelId;

/// "No node" in links and lookups.
pub const NIL: u32 = u32::MAX;

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
    capacity: usize,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
}

impl PodLru {
    pub fn new(capacity: usize) -> PodLru {
        assert!(
            capacity > 0 && capacity < NIL as usize,
            "capacity out of range"
        );
        PodLru {
            capacity,
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Raises the capacity (never below the current length: shrinking means rebuilding).
    pub fn grow(&mut self, capacity: usize) {
        assert!(
            capacity >= self.nodes.len() && capacity < NIL as usize,
            "capacity out of range"
        );
        self.capacity = capacity;
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
    pub fn move_to_front(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.link_front(idx);
        }
    }

    /// Adds `key` (not in the list) as the most recent entry, evicting the least recent if full.
    pub fn insert_front(&mut self, key: Key) -> Placed {
        if self.nodes.len() < self.capacity {
            if self.nodes.len() == self.nodes.capacity() {
                let target = (self.nodes.len() * 2).max(16).min(self.capacity);
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
        Placed::Replaced(idx, old)
    }

    /// Removes every entry, returning their keys (in no particular order).
    pub fn drain(&mut self) -> Vec<Key> {
        let keys = (0..self.nodes.len() as u32).map(|i| self.key(i)).collect();
        self.nodes = Vec::new();
        self.head = NIL;
        self.tail = NIL;
        keys
    }

    /// Keys from most to least recent (for tests and inspection).
    pub fn keys_by_recency(&self) -> Vec<Key> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut i = self.head;
        while i != NIL {
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
    fn full_list_allocates_exactly_its_capacity() {
        let mut lru = PodLru::new(100);
        for h in 0..250 {
            lru.insert_front(k(h));
        }
        assert_eq!(lru.heap_bytes(), 100 * 20);
    }
}
