//! One shard of the reverse map: entry key -> the pods whose LRU holds it (24 bytes per entry).
//!
//! The pod set is stored as `first` plus an optional overflow list in a shard-local slab, so the
//! common case (a block held by one pod) costs no extra allocation. Pod order inside a set carries
//! no meaning: ties are broken by the caller's seeded RNG.

use hashbrown::HashTable;

use super::{EntryKey, PodSlot};

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: EntryKey,
    first: PodSlot,
    more: u32,
}

#[derive(Debug, Default)]
pub struct ReverseShard {
    table: HashTable<Entry>,
    overflow: Vec<Vec<PodSlot>>,
    free: Vec<u32>,
    seed: u64,
}

impl ReverseShard {
    pub fn new(seed: u64) -> ReverseShard {
        ReverseShard {
            seed,
            ..ReverseShard::default()
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Heap bytes allocated (excludes allocator overhead).
    pub fn heap_bytes(&self) -> usize {
        self.table.allocation_size()
            + self.overflow.capacity() * size_of::<Vec<PodSlot>>()
            + self
                .overflow
                .iter()
                .map(|v| v.capacity() * size_of::<PodSlot>())
                .sum::<usize>()
            + self.free.capacity() * size_of::<u32>()
    }

    /// Adds `pod` to the set of `key` (the caller guarantees it is not there yet).
    pub fn add(&mut self, key: EntryKey, pod: PodSlot) {
        let seed = self.seed;
        let hash = key.mix(seed);
        match self
            .table
            .entry(hash, |e| e.key == key, |e| e.key.mix(seed))
        {
            hashbrown::hash_table::Entry::Occupied(mut occupied) => {
                let entry = occupied.get_mut();
                if entry.more == NIL {
                    entry.more = match self.free.pop() {
                        Some(i) => i,
                        None => {
                            self.overflow.push(Vec::new());
                            (self.overflow.len() - 1) as u32
                        }
                    };
                }
                self.overflow[entry.more as usize].push(pod);
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert(Entry {
                    key,
                    first: pod,
                    more: NIL,
                });
            }
        }
    }

    /// Removes `pod` from the set of `key`; the entry disappears with its last pod.
    pub fn remove(&mut self, key: EntryKey, pod: PodSlot) {
        let hash = key.mix(self.seed);
        let Ok(mut occupied) = self.table.find_entry(hash, |e| e.key == key) else {
            return;
        };
        let entry = occupied.get_mut();
        let more = entry.more;
        if entry.first == pod {
            if more == NIL {
                occupied.remove();
                return;
            }
            let list = &mut self.overflow[more as usize];
            entry.first = list.pop().expect("overflow lists are never empty");
            if list.is_empty() {
                entry.more = NIL;
                self.release(more);
            }
        } else if more != NIL {
            let list = &mut self.overflow[more as usize];
            if let Some(pos) = list.iter().position(|&p| p == pod) {
                list.swap_remove(pos);
                if list.is_empty() {
                    entry.more = NIL;
                    self.release(more);
                }
            }
        }
    }

    /// Calls `f` with every pod holding `key`.
    pub fn for_each_pod(&self, key: EntryKey, mut f: impl FnMut(PodSlot)) {
        let hash = key.mix(self.seed);
        if let Some(entry) = self.table.find(hash, |e| e.key == key) {
            f(entry.first);
            if entry.more != NIL {
                for &pod in &self.overflow[entry.more as usize] {
                    f(pod);
                }
            }
        }
    }

    fn release(&mut self, slot: u32) {
        let list = &mut self.overflow[slot as usize];
        list.clear();
        list.shrink_to(2);
        self.free.push(slot);
    }
}
