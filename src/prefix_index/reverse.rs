//! One shard of the reverse map: entry -> the pods whose list holds it, and for each such pod the
//! node of its list that holds the entry.
//!
//! The table is open addressing with linear probing and backward-shift deletion (Knuth's
//! algorithm R): an entry sits in the first free slot at or after its home (`mix & mask`), and a
//! delete moves later entries of the run back into the hole, so deletes leave no tombstones and a
//! table under eviction churn stays the size of a freshly filled one. Beside the 20-byte slots
//! (hash, model id, pod, node) runs an array of 2-byte tags (an 8-bit fingerprint and the
//! distance from home), so a lookup scans a few contiguous tags and reads a slot only when the
//! fingerprint matches (about 1 in 256 misses), and inserts and deletes read no slot to find
//! homes. The table doubles when it would pass 7/8 full: 22 bytes per slot, 25-50 bytes per
//! distinct entry.
//!
//! The common set (one pod) lives in the slot. A set of two or more pods is an overflow list of
//! `(pod, node)` in a shard-local slab: the slot's `pod` then carries the [`SHARED`] flag and its
//! `node` the list's index. Pod order inside a set carries no meaning (ties are broken by the
//! caller's seeded RNG).

use super::models::ModelId;
use super::{Hashed, Key, PodSlot};

/// Model id written to empty slots (the tags say which slots are empty).
const EMPTY: ModelId = ModelId::MAX;
/// Flag in a slot's `pod`: the set is the overflow list numbered by the slot's `node`.
pub const SHARED: u32 = 1 << 31;
const MIN_SLOTS: usize = 16;
/// Low byte of a tag: 0 for an empty slot, else the distance from home plus one.
const DIST: u16 = 0xFF;
/// Distance byte of an entry 254 or more slots from home (its distance is computed from its key).
const FAR: u16 = 0xFF;

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
    /// One per slot: fingerprint (high byte) and distance from home plus one (low byte; 0 =
    /// empty). Lookups scan these 2-byte tags and read a 20-byte slot only on a fingerprint match.
    tags: Vec<u16>,
    len: usize,
    overflow: Vec<Vec<Holder>>,
    free: Vec<u32>,
    seed: u64,
}

impl ReverseShard {
    pub fn new(seed: u64) -> ReverseShard {
        ReverseShard {
            slots: Vec::new(),
            tags: Vec::new(),
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
            + self.tags.capacity() * size_of::<u16>()
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

    /// How far occupied slot `i` is from its entry's home.
    fn distance(&self, i: usize) -> usize {
        match self.tags[i] & DIST {
            FAR => {
                let slot = self.slots[i];
                let key = Key {
                    hash: slot.hash,
                    model: slot.model,
                };
                i.wrapping_sub(key.mix(self.seed) as usize) & self.mask()
            }
            d => usize::from(d) - 1,
        }
    }

    /// Scans the tags from the home slot to the first empty one; a slot is read only when its
    /// fingerprint matches.
    fn find(&self, key: Hashed) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let fingerprint = tag(key.mix, 0) & !DIST;
        let mut i = key.mix as usize & mask;
        loop {
            let t = self.tags[i];
            if t & DIST == 0 {
                return None;
            }
            if t & !DIST == fingerprint {
                let slot = self.slots[i];
                if slot.hash == key.key.hash && slot.model == key.key.model {
                    return Some(i);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts an entry known to be absent.
    fn insert(&mut self, key: Hashed, slot: Slot) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.grow();
        }
        self.place(key.mix, slot);
        self.len += 1;
    }

    /// Puts `slot` in the first empty slot from its home.
    fn place(&mut self, mix: u64, slot: Slot) {
        let mask = self.mask();
        let mut i = mix as usize & mask;
        let mut distance = 0;
        while self.tags[i] & DIST != 0 {
            i = (i + 1) & mask;
            distance += 1;
        }
        self.slots[i] = slot;
        self.tags[i] = tag(mix, distance);
    }

    /// Backward-shift delete (Knuth's algorithm R): each later entry of the run that may sit
    /// in the hole (its home is not between the hole and itself) moves there, leaving a new hole.
    fn delete_at(&mut self, i: usize) {
        let mask = self.mask();
        let (mut hole, mut j) = (i, i);
        loop {
            j = (j + 1) & mask;
            if self.tags[j] & DIST == 0 {
                break;
            }
            let distance = self.distance(j);
            let gap = j.wrapping_sub(hole) & mask;
            if distance >= gap {
                self.slots[hole] = self.slots[j];
                self.tags[hole] = (self.tags[j] & !DIST) | dist_bits(distance - gap);
                hole = j;
            }
        }
        self.slots[hole] = VACANT;
        self.tags[hole] = 0;
        self.len -= 1;
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![VACANT; size]);
        let old_tags = std::mem::replace(&mut self.tags, vec![0; size]);
        for (slot, t) in old.into_iter().zip(old_tags) {
            if t & DIST != 0 {
                let key = Key {
                    hash: slot.hash,
                    model: slot.model,
                };
                self.place(key.mix(self.seed), slot);
            }
        }
    }
}

/// The tag of an entry `distance` slots from its home: fingerprint byte, distance byte.
fn tag(mix: u64, distance: usize) -> u16 {
    (((mix >> 56) as u16) << 8) | dist_bits(distance)
}

/// `distance + 1`, or [`FAR`] when that does not fit (the distance is then computed).
fn dist_bits(distance: usize) -> u16 {
    u16::try_from(distance + 1).map_or(FAR, |d| d.min(FAR))
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

    /// 300 entries with one home slot: distances past the tag's byte are computed, and deletes
    /// from the middle of the run keep every other entry findable.
    #[test]
    fn long_runs_past_the_distance_byte() {
        let mut shard = ReverseShard::new(5);
        let same_home: Vec<Hashed> = (0u64..)
            .map(|x| h(x, 0))
            .filter(|k| k.mix & 511 == 7)
            .take(300)
            .collect();
        for (n, &key) in same_home.iter().enumerate() {
            shard.add(key, PodSlot(1), n as u32);
        }
        assert_eq!(shard.slots.len(), 512);
        for n in (0..300).step_by(3) {
            shard.remove(same_home[n], PodSlot(1));
        }
        for (n, &key) in same_home.iter().enumerate() {
            let want = (n % 3 != 0).then_some(n as u32);
            assert_eq!(shard.holder_node(key, PodSlot(1)), want, "entry {n}");
        }
        assert_eq!(shard.len(), 200);
    }
}
