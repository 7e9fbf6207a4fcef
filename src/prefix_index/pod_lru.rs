//! One pod's bounded LRU of block entries, in a slab with `u32` links (24 bytes per node).
//!
//! Nodes live in a `Vec` and are linked into a doubly linked recency list by index; a
//! `hashbrown::HashTable<u32>` maps an entry key to its node. Touching an entry moves it to the
//! front (most recent); inserting into a full list reuses the least recent node and reports the
//! entry it evicted. Lookups are not offered: the reverse map answers "who has this block", so
//! scoring never touches (and never refreshes) a pod's list.

use hashbrown::HashTable;

use super::EntryKey;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: EntryKey,
    prev: u32,
    next: u32,
}

/// What [`PodLru::touch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The entry was present and is now the most recent.
    Refreshed,
    /// The entry was added; the list had room.
    Inserted,
    /// The entry was added in place of the least recent entry, which is returned.
    Evicted(EntryKey),
}

#[derive(Debug)]
pub struct PodLru {
    capacity: usize,
    nodes: Vec<Node>,
    table: HashTable<u32>,
    head: u32,
    tail: u32,
    seed: u64,
}

impl PodLru {
    pub fn new(capacity: usize, seed: u64) -> PodLru {
        assert!(
            capacity > 0 && capacity < NIL as usize,
            "capacity out of range"
        );
        PodLru {
            capacity,
            nodes: Vec::new(),
            table: HashTable::new(),
            head: NIL,
            tail: NIL,
            seed,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Heap bytes allocated (excludes allocator overhead; the unused tail of the node `Vec` is
    /// allocated but never touched, so not resident).
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>() + self.table.capacity() * (size_of::<u32>() + 1)
    }

    /// Makes `key` the most recent entry, inserting it (and evicting the least recent) if needed.
    pub fn touch(&mut self, key: EntryKey) -> Touch {
        let hash = key.mix(self.seed);
        let nodes = &self.nodes;
        if let Some(&idx) = self.table.find(hash, |&i| nodes[i as usize].key == key) {
            self.move_to_front(idx);
            return Touch::Refreshed;
        }
        if self.nodes.len() < self.capacity {
            let idx = self.nodes.len() as u32;
            self.nodes.push(Node {
                key,
                prev: NIL,
                next: NIL,
            });
            self.link_front(idx);
            let (nodes, seed) = (&self.nodes, self.seed);
            self.table
                .insert_unique(hash, idx, |&i| nodes[i as usize].key.mix(seed));
            return Touch::Inserted;
        }
        let idx = self.tail;
        let old = self.nodes[idx as usize].key;
        let old_hash = old.mix(self.seed);
        match self.table.find_entry(old_hash, |&i| i == idx) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("every node is in the table"),
        }
        self.unlink(idx);
        self.nodes[idx as usize].key = key;
        self.link_front(idx);
        let (nodes, seed) = (&self.nodes, self.seed);
        self.table
            .insert_unique(hash, idx, |&i| nodes[i as usize].key.mix(seed));
        Touch::Evicted(old)
    }

    /// Removes every entry, returning their keys (least recent last is not guaranteed).
    pub fn drain(&mut self) -> Vec<EntryKey> {
        let keys = self.nodes.iter().map(|n| n.key).collect();
        self.nodes = Vec::new();
        self.table = HashTable::new();
        self.head = NIL;
        self.tail = NIL;
        keys
    }

    /// Keys from most to least recent (for tests and inspection).
    pub fn keys_by_recency(&self) -> Vec<EntryKey> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut i = self.head;
        while i != NIL {
            out.push(self.nodes[i as usize].key);
            i = self.nodes[i as usize].next;
        }
        out
    }

    fn move_to_front(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.link_front(idx);
        }
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
    use crate::hashing::BlockHash;

    fn k(h: u64) -> EntryKey {
        EntryKey::new(0, BlockHash(h))
    }

    #[test]
    fn evicts_least_recent() {
        let mut lru = PodLru::new(2, 1);
        assert_eq!(lru.touch(k(1)), Touch::Inserted);
        assert_eq!(lru.touch(k(2)), Touch::Inserted);
        assert_eq!(lru.touch(k(1)), Touch::Refreshed);
        assert_eq!(lru.touch(k(3)), Touch::Evicted(k(2)));
        assert_eq!(lru.keys_by_recency(), [k(3), k(1)]);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.touch(k(4)), Touch::Evicted(k(1)));
        assert_eq!(lru.touch(k(3)), Touch::Refreshed);
        assert_eq!(lru.keys_by_recency(), [k(3), k(4)]);
    }

    #[test]
    fn capacity_one() {
        let mut lru = PodLru::new(1, 1);
        assert_eq!(lru.touch(k(1)), Touch::Inserted);
        assert_eq!(lru.touch(k(2)), Touch::Evicted(k(1)));
        assert_eq!(lru.touch(k(2)), Touch::Refreshed);
        assert_eq!(lru.drain(), [k(2)]);
        assert!(lru.is_empty());
        assert_eq!(lru.touch(k(5)), Touch::Inserted);
    }
}
