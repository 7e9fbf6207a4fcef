//! One shard of the reverse map: entry -> the pods whose list holds it, and for each such pod the
//! node of its list that holds the entry.
//!
//! The table is open addressing with Robin Hood linear probing and backward-shift deletion: an
//! entry sits at or after its home slot (`mix & mask`), entries are ordered by home along a run,
//! a lookup stops at the first slot whose entry is closer to its own home than the probe is, and
//! a delete shifts the rest of the run back by one. Deletes therefore leave no tombstones, so a
//! table under eviction churn stays the size of a freshly filled one. Slots are 20 bytes (hash,
//! model id, pod, node); the table doubles when it would pass 7/8 full.
//!
//! The common set (one pod) lives in the slot. A set of two or more pods is an overflow list of
//! `(pod, node)` in a shard-local slab: the slot's `pod` then carries the [`SHARED`] flag and its
//! `node` the list's index. Pod order inside a set carries no meaning (ties are broken by the
//! caller's seeded RNG).

use super::models::ModelId;
use super::{Hashed, Key, PodSlot};

/// Model id of an empty slot.
const EMPTY: ModelId = ModelId::MAX;
/// Flag in a slot's `pod`: the set is the overflow list numbered by the slot's `node`.
pub const SHARED: u32 = 1 << 31;
const MIN_SLOTS: usize = 16;

#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
struct Slot {
    hash: u64,
    model: ModelId,
    pod: u32,
    node: u32,
}

const VACANT: Slot = Slot {
    hash: 0,
    model: EMPTY,
    pod: 0,
    node: 0,
};

/// The holders of an entry, as far as one slot tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSet {
    Empty,
    One(PodSlot),
    Several,
}

/// A pod holding an entry, and the node of its list that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pod: PodSlot,
    node: u32,
}

#[derive(Debug)]
pub struct ReverseShard {
    /// Empty, or a power of two long.
    slots: Vec<Slot>,
    len: usize,
    overflow: Vec<Vec<Holder>>,
    free: Vec<u32>,
    seed: u64,
}

impl ReverseShard {
    pub fn new(seed: u64) -> ReverseShard {
        ReverseShard {
            slots: Vec::new(),
            len: 0,
            overflow: Vec::new(),
            free: Vec::new(),
            seed,
        }
    }

    /// Distinct entries in this shard.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes allocated (capacity-based, excluding allocator overhead).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot>()
            + self.overflow.capacity() * size_of::<Vec<Holder>>()
            + self
                .overflow
                .iter()
                .map(|v| v.capacity() * size_of::<Holder>())
                .sum::<usize>()
            + self.free.capacity() * size_of::<u32>()
    }

    /// The node of `pod`'s list that holds `key`, if `pod` holds it.
    pub fn holder_node(&self, key: Hashed, pod: PodSlot) -> Option<u32> {
        let slot = self.slots[self.find(key)?];
        if slot.pod & SHARED == 0 {
            (slot.pod == pod.0).then_some(slot.node)
        } else {
            self.overflow[slot.node as usize]
                .iter()
                .find(|h| h.pod == pod)
                .map(|h| h.node)
        }
    }

    /// Who holds `key`: nobody, one pod, or several (read them with [`ReverseShard::push_pods`]).
    pub fn pod_set(&self, key: Hashed) -> PodSet {
        match self.find(key).map(|i| self.slots[i].pod) {
            None => PodSet::Empty,
            Some(pod) if pod & SHARED == 0 => PodSet::One(PodSlot(pod)),
            Some(_) => PodSet::Several,
        }
    }

    /// Appends every pod holding `key` to `out`.
    pub fn push_pods(&self, key: Hashed, out: &mut Vec<PodSlot>) {
        let Some(i) = self.find(key) else {
            return;
        };
        let slot = self.slots[i];
        if slot.pod & SHARED == 0 {
            out.push(PodSlot(slot.pod));
        } else {
            out.extend(self.overflow[slot.node as usize].iter().map(|h| h.pod));
        }
    }

    /// Adds `pod` (holding `key` in `node`) to the set of `key`; the caller guarantees `pod` is
    /// not in it yet.
    pub fn add(&mut self, key: Hashed, pod: PodSlot, node: u32) {
        debug_assert!(pod.0 & SHARED == 0, "pod slots stay below 2^31");
        let Some(i) = self.find(key) else {
            self.insert(
                key,
                Slot {
                    hash: key.key.hash,
                    model: key.key.model,
                    pod: pod.0,
                    node,
                },
            );
            return;
        };
        let slot = self.slots[i];
        let holder = Holder { pod, node };
        if slot.pod & SHARED != 0 {
            self.overflow[slot.node as usize].push(holder);
            return;
        }
        let first = Holder {
            pod: PodSlot(slot.pod),
            node: slot.node,
        };
        let list = match self.free.pop() {
            Some(list) => {
                self.overflow[list as usize].extend([first, holder]);
                list
            }
            None => {
                self.overflow.push(vec![first, holder]);
                (self.overflow.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[i];
        slot.pod = SHARED;
        slot.node = list;
    }

    /// Removes `pod` from the set of `key`; the entry disappears with its last pod.
    pub fn remove(&mut self, key: Hashed, pod: PodSlot) {
        let Some(i) = self.find(key) else {
            return;
        };
        let slot = self.slots[i];
        if slot.pod & SHARED == 0 {
            if slot.pod == pod.0 {
                self.delete_at(i);
            }
            return;
        }
        let list = &mut self.overflow[slot.node as usize];
        if let Some(pos) = list.iter().position(|h| h.pod == pod) {
            list.swap_remove(pos);
        }
        if let &[last] = &list[..] {
            list.clear();
            list.shrink_to(4);
            self.free.push(slot.node);
            let slot = &mut self.slots[i];
            slot.pod = last.pod.0;
            slot.node = last.node;
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// How far slot `i` (occupied) is from its entry's home.
    fn distance(&self, i: usize, slot: Slot) -> usize {
        let key = Key {
            hash: slot.hash,
            model: slot.model,
        };
        i.wrapping_sub(key.mix(self.seed) as usize) & self.mask()
    }

    fn find(&self, key: Hashed) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = key.mix as usize & mask;
        let mut probe = 0;
        loop {
            let slot = self.slots[i];
            if slot.model == EMPTY {
                return None;
            }
            if slot.hash == key.key.hash && slot.model == key.key.model {
                return Some(i);
            }
            if self.distance(i, slot) < probe {
                return None;
            }
            i = (i + 1) & mask;
            probe += 1;
        }
    }

    /// Inserts an entry known to be absent (Robin Hood: a probe that travelled further than the
    /// resident takes its slot, and the resident moves on).
    fn insert(&mut self, key: Hashed, slot: Slot) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.grow();
        }
        self.place(key.mix, slot);
        self.len += 1;
    }

    fn place(&mut self, mix: u64, mut carried: Slot) {
        let mask = self.mask();
        let mut i = mix as usize & mask;
        let mut probe = 0;
        loop {
            let resident = self.slots[i];
            if resident.model == EMPTY {
                self.slots[i] = carried;
                return;
            }
            let distance = self.distance(i, resident);
            if distance < probe {
                self.slots[i] = carried;
                carried = resident;
                probe = distance;
            }
            i = (i + 1) & mask;
            probe += 1;
        }
    }

    /// Backward-shift delete: pull the rest of the run one slot closer to home.
    fn delete_at(&mut self, mut i: usize) {
        let mask = self.mask();
        loop {
            let j = (i + 1) & mask;
            let next = self.slots[j];
            if next.model == EMPTY || self.distance(j, next) == 0 {
                self.slots[i] = VACANT;
                break;
            }
            self.slots[i] = next;
            i = j;
        }
        self.len -= 1;
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![VACANT; size]);
        for slot in old {
            if slot.model != EMPTY {
                let key = Key {
                    hash: slot.hash,
                    model: slot.model,
                };
                self.place(key.mix(self.seed), slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(hash: u64, model: ModelId) -> Hashed {
        Hashed::new(Key { hash, model }, 5)
    }

    #[test]
    fn slot_is_20_bytes() {
        assert_eq!(size_of::<Slot>(), 20);
    }

    #[test]
    fn sets_grow_and_shrink_back_inline() {
        let mut shard = ReverseShard::new(5);
        let (a, b, c) = (PodSlot(1), PodSlot(2), PodSlot(3));
        shard.add(h(9, 0), a, 10);
        shard.add(h(9, 0), b, 20);
        shard.add(h(9, 0), c, 30);
        assert_eq!(shard.holder_node(h(9, 0), b), Some(20));
        assert_eq!(shard.holder_node(h(9, 1), b), None);
        shard.remove(h(9, 0), a);
        shard.remove(h(9, 0), c);
        assert_eq!(shard.holder_node(h(9, 0), b), Some(20));
        assert_eq!(shard.free, [0]);
        shard.remove(h(9, 0), b);
        assert_eq!(shard.len(), 0);
        assert_eq!(shard.holder_node(h(9, 0), b), None);
    }

    /// Many inserts and deletes against a `HashMap`: every entry stays findable, no tombstones.
    #[test]
    fn churn_keeps_size_and_contents() {
        let mut shard = ReverseShard::new(5);
        let mut model = std::collections::HashMap::new();
        let mut x = 1u64;
        for round in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = h(x % 2000, (x >> 60) as ModelId % 2);
            if let std::collections::hash_map::Entry::Vacant(v) = model.entry(key.key) {
                shard.add(key, PodSlot(1), round);
                v.insert(round);
            } else {
                shard.remove(key, PodSlot(1));
                model.remove(&key.key);
            }
            assert_eq!(shard.len(), model.len());
        }
        for (&key, &node) in &model {
            assert_eq!(
                shard.holder_node(Hashed::new(key, 5), PodSlot(1)),
                Some(node)
            );
        }
        assert!(shard.slots.len() <= 4096, "{} slots", shard.slots.len());
    }
}
