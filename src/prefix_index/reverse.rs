//! One shard of the reverse map: entry -> the pods whose list holds it, and for each such pod the
//! node of its list that holds the entry.
//!
//! The table is a bucketed cuckoo hash: slots come in buckets of [`WAYS`], and an entry lives in
//! one of two buckets chosen by independent bits of its mix (`b1`, `b2`). Beside the 16-byte slots
//! (the key's word, pod, node; the word is the block hash xor a keyed salt of the model, see
//! [`super::model_salt`], so a slot never straddles two cache lines) each bucket has one 64-bit
//! word of 1-byte tags (0 = empty, else a 7-bit fingerprint of the key, never 0, and a flag for
//! "held by several pods"), compared eight at a time with word arithmetic, so a lookup reads at
//! most two tag words and reads a slot only on a fingerprint match (1 in 127 per occupied slot). A delete clears one tag: no shifting and
//! no tombstones, so a table under eviction churn stays the size of a freshly filled one. The
//! index only removes a pod from entries that pod holds, so when exactly one slot of the two
//! buckets matches the fingerprint and its flag says one holder, that slot is the entry and its
//! holder the pod: the delete then reads and writes no slot at all (the common eviction). An
//! insert takes a free slot of the emptier of its two buckets; when both are full it moves a
//! resident to that resident's other bucket (a random walk of at most [`MAX_KICKS`] moves, each
//! keeping every entry in one of its buckets).
//! The table doubles when it would pass 15/16 full, or if a walk fails: 17 bytes per slot, 18-36
//! bytes per distinct entry. Every operation costs a bounded, small number of probes whatever
//! the load, where linear probing at this load scanned runs of tens of slots per insert and
//! delete.
//!
//! The common set (one pod) lives in the slot. A set of two or more pods is an overflow list of
//! `(pod, node)` in a shard-local slab: the slot's `pod` then carries the [`SHARED`] flag and its
//! `node` the list's index. Pod order inside a set carries no meaning (ties are broken by the
//! caller's seeded RNG).
//!
//! [`ReverseShard::touch`] reads a key's two tag words without branching on them; the index calls
//! it for a whole batch before the batch's real operations so their cache misses overlap instead
//! of waiting one after another behind mispredicted branches. The tag words are 1/17 of the
//! table, so they also stay within far fewer pages (TLB entries) than the slots.

use super::{Hashed, PodSlot, mix_word};

/// Slots per bucket (one tag byte each, one tag word per bucket).
pub const WAYS: usize = 8;
/// Moves an insert may make before the table grows instead.
const MAX_KICKS: usize = 256;
/// Flag in a slot's `pod`: the set is the overflow list numbered by the slot's `node`.
pub const SHARED: u32 = 1 << 31;
const MIN_BUCKETS: usize = 2;
const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
/// The fingerprint bits of every tag of a word (the high bit of a tag is [`SHARED_TAG`]).
const FINGERPRINTS: u64 = !HIGH_BITS;
/// Tag bit set while the slot's set holds several pods (its `pod` carries [`SHARED`]).
const SHARED_TAG: u8 = 0x80;

/// 16 bytes: a slot never straddles two cache lines.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Slot {
    /// The key's word ([`super::model_salt`]).
    word: u64,
    pod: u32,
    node: u32,
}

const VACANT: Slot = Slot {
    word: 0,
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

/// A key's place in a table: its two buckets and its tag byte.
#[derive(Debug, Clone, Copy)]
struct Home {
    b1: usize,
    b2: usize,
    tag: u8,
}

impl Home {
    /// Bits of the mix: `b1` from the lowest, the shard is 32..36, the tag 36..43, `b2` from 44
    /// up (rotated, so tables of more than 2^20 buckets still get all their bits).
    fn of(mix: u64, buckets: usize) -> Home {
        let mask = buckets - 1;
        Home {
            b1: mix as usize & mask,
            b2: mix.rotate_right(44) as usize & mask,
            tag: ((mix >> 36) as u8 & !SHARED_TAG).max(1),
        }
    }
}

#[derive(Debug)]
pub struct ReverseShard {
    /// `WAYS` per bucket; empty, or a power of two of buckets.
    slots: Vec<Slot>,
    /// One word per bucket: the tag byte of each of its slots (0 = empty; the contents of an
    /// empty slot are stale and never read).
    tags: Vec<u64>,
    len: usize,
    overflow: Vec<Vec<Holder>>,
    free: Vec<u32>,
    seed: u64,
    /// State of the xorshift that picks which resident an insert moves.
    kick_rng: u64,
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
            kick_rng: seed | 1,
        }
    }

    /// Distinct entries in this shard.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes allocated (capacity-based, excluding allocator overhead).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<Slot>()
            + self.tags.capacity() * size_of::<u64>()
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
    #[inline(always)]
    pub fn add(&mut self, key: Hashed, pod: PodSlot, node: u32) {
        debug_assert!(pod.0 & SHARED == 0, "pod slots stay below 2^31");
        let Some(i) = self.find(key) else {
            self.insert(
                key,
                Slot {
                    word: key.word,
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
        self.set_shared_tag(i, true);
    }

    /// Removes `pod` from the set of `key`, which the caller guarantees `pod` holds; the entry
    /// disappears with its last pod.
    pub fn remove(&mut self, key: Hashed, pod: PodSlot) {
        if self.len == 0 {
            return;
        }
        if let Some(i) = self.sole_candidate(key) {
            debug_assert!(
                {
                    let slot = self.slots[i];
                    slot.word == key.word && slot.pod == pod.0
                },
                "remove of an entry the pod does not hold"
            );
            self.delete_at(i);
            return;
        }
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
            self.set_shared_tag(i, false);
        }
    }

    fn buckets(&self) -> usize {
        self.tags.len()
    }

    /// The slot holding `key`: its two buckets' tag words are compared with its tag, and a slot
    /// is read only where the tag matches.
    #[inline]
    fn find(&self, key: Hashed) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let home = Home::of(key.mix, self.buckets());
        self.find_in(home.b1, home.tag, key.word)
            .or_else(|| self.find_in(home.b2, home.tag, key.word))
    }

    #[inline]
    fn find_in(&self, bucket: usize, tag: u8, word: u64) -> Option<usize> {
        let mut hits = tag_hits(self.tags[bucket], tag);
        while hits != 0 {
            let i = bucket * WAYS + (hits.trailing_zeros() / 8) as usize;
            let slot = self.slots[i];
            if slot.word == word {
                return Some(i);
            }
            hits &= hits - 1;
        }
        None
    }

    /// The slot of `key` if the tags alone prove it and prove it has one holder: exactly one
    /// slot of its two buckets carries its fingerprint, without the shared flag. Valid only for
    /// a key known to be present (then that slot must be it).
    fn sole_candidate(&self, key: Hashed) -> Option<usize> {
        let home = Home::of(key.mix, self.buckets());
        let hits1 = tag_hits(self.tags[home.b1], home.tag);
        let hits2 = if home.b2 == home.b1 {
            0
        } else {
            tag_hits(self.tags[home.b2], home.tag)
        };
        let (bucket, hits) = if hits2 == 0 && one_bit(hits1) {
            (home.b1, hits1)
        } else if hits1 == 0 && one_bit(hits2) {
            (home.b2, hits2)
        } else {
            return None;
        };
        let way = (hits.trailing_zeros() / 8) as usize;
        let tag = (self.tags[bucket] >> (8 * way)) as u8;
        (tag & SHARED_TAG == 0).then_some(bucket * WAYS + way)
    }

    fn set_shared_tag(&mut self, i: usize, shared: bool) {
        let bit = u64::from(SHARED_TAG) << (8 * (i % WAYS));
        if shared {
            self.tags[i / WAYS] |= bit;
        } else {
            self.tags[i / WAYS] &= !bit;
        }
    }

    /// Reads the two tag words of `key` (the lines any lookup, insert or delete of the key
    /// reads first) and returns bits of them, so a loop of touches over a batch issues all the
    /// batch's cache misses at once. The caller passes the result to `black_box`.
    pub fn touch(&self, key: Hashed) -> u64 {
        if self.tags.is_empty() {
            return 0;
        }
        let home = Home::of(key.mix, self.buckets());
        self.tags[home.b1] ^ self.tags[home.b2]
    }

    /// Inserts an entry known to be absent.
    #[inline(always)]
    fn insert(&mut self, key: Hashed, slot: Slot) {
        if (self.len + 1) * 16 > self.slots.len() * 15 {
            self.grow();
        }
        // The common case, inline: a free slot in one of its buckets (the emptier one).
        let home = Home::of(key.mix, self.buckets());
        let free1 = zero_bytes(self.tags[home.b1]);
        let free2 = zero_bytes(self.tags[home.b2]);
        if free1 | free2 != 0 {
            let (bucket, free) = if marked_bytes(free2) > marked_bytes(free1) {
                (home.b2, free2)
            } else {
                (home.b1, free1)
            };
            self.put(bucket, (free.trailing_zeros() / 8) as usize, home.tag, slot);
            self.len += 1;
            return;
        }
        let mut walker = (key.mix, slot);
        while let Err(homeless) = self.place(walker.0, walker.1) {
            // The walk ended with a resident that has no room: a bigger table has.
            self.grow();
            walker = homeless;
        }
        self.len += 1;
    }

    /// Puts an entry in a free slot of the emptier of its buckets; if both are full, moves a
    /// resident of one of them (chosen by `kick_rng`) to make room and carries on placing that
    /// resident, at most [`MAX_KICKS`] times. On failure, returns the entry left without a slot
    /// (every other entry is in one of its buckets).
    fn place(&mut self, mix: u64, slot: Slot) -> Result<(), (u64, Slot)> {
        let buckets = self.buckets();
        let (mut mix, mut slot) = (mix, slot);
        let mut came_from = usize::MAX;
        for _ in 0..MAX_KICKS {
            let home = Home::of(mix, buckets);
            let free1 = zero_bytes(self.tags[home.b1]);
            let free2 = zero_bytes(self.tags[home.b2]);
            let (bucket, free) = if marked_bytes(free2) > marked_bytes(free1) {
                (home.b2, free2)
            } else {
                (home.b1, free1)
            };
            if free != 0 {
                let way = (free.trailing_zeros() / 8) as usize;
                self.put(bucket, way, home.tag, slot);
                return Ok(());
            }
            // Both full: move a resident out of the bucket this walker did not come from.
            let bucket = if home.b1 == came_from {
                home.b2
            } else {
                home.b1
            };
            let way = (self.next_kick() % WAYS as u64) as usize;
            let i = bucket * WAYS + way;
            let evicted = self.slots[i];
            self.put(bucket, way, home.tag, slot);
            slot = evicted;
            mix = mix_word(evicted.word, self.seed);
            came_from = bucket;
        }
        Err((mix, slot))
    }

    /// Writes `slot` at `bucket`/`way` under fingerprint `tag` (the shared flag follows the slot).
    fn put(&mut self, bucket: usize, way: usize, tag: u8, slot: Slot) {
        self.slots[bucket * WAYS + way] = slot;
        let tag = if slot.pod & SHARED != 0 {
            tag | SHARED_TAG
        } else {
            tag
        };
        let shift = 8 * way;
        self.tags[bucket] = (self.tags[bucket] & !(0xFF << shift)) | (u64::from(tag) << shift);
    }

    /// Empties slot `i` by clearing its tag (the slot itself is left as it was: not reading or
    /// writing it is what makes the common delete cheap).
    fn delete_at(&mut self, i: usize) {
        self.tags[i / WAYS] &= !(0xFF << (8 * (i % WAYS)));
        self.len -= 1;
    }

    fn next_kick(&mut self) -> u64 {
        let mut x = self.kick_rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.kick_rng = x;
        x
    }

    /// Doubles the table (or more, in the unheard-of case that a walk fails while refilling).
    fn grow(&mut self) {
        let mut buckets = (self.buckets() * 2).max(MIN_BUCKETS);
        let old_slots = std::mem::take(&mut self.slots);
        let old_tags = std::mem::take(&mut self.tags);
        'sizes: loop {
            self.slots = vec![VACANT; buckets * WAYS];
            self.tags = vec![0; buckets];
            for (i, slot) in old_slots.iter().enumerate() {
                if (old_tags[i / WAYS] >> (8 * (i % WAYS))) & 0xFF == 0 {
                    continue;
                }
                let mix = mix_word(slot.word, self.seed);
                if self.place(mix, *slot).is_err() {
                    buckets *= 2;
                    continue 'sizes;
                }
            }
            return;
        }
    }
}

/// The high bit of each tag of `word` whose fingerprint is `tag` (empty tags never match: their
/// fingerprint is 0 and `tag`'s is not).
fn tag_hits(word: u64, tag: u8) -> u64 {
    zero_bytes((word & FINGERPRINTS) ^ (LOW_BITS * u64::from(tag)))
}

/// Whether exactly one bit of `x` is set (`count_ones` is a long bit-twiddling sequence on
/// x86-64 CPUs without POPCNT, the default target).
fn one_bit(x: u64) -> bool {
    x != 0 && x & (x - 1) == 0
}

/// How many bytes of `marks` (a [`zero_bytes`] or [`tag_hits`] result: only high bits set) are
/// marked: the marks moved to each byte's low bit, summed into the top byte by one multiply.
fn marked_bytes(marks: u64) -> u64 {
    ((marks >> 7).wrapping_mul(LOW_BITS)) >> 56
}

/// A word with the high bit set in each byte of `word` that is zero, and no other bit (exact:
/// the per-byte sums cannot carry into the next byte).
fn zero_bytes(word: u64) -> u64 {
    !(((word & !HIGH_BITS) + !HIGH_BITS) | word) & HIGH_BITS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix_index::Key;
    use crate::prefix_index::models::ModelId;

    fn h(hash: u64, model: ModelId) -> Hashed {
        Hashed::new(Key { hash, model }, 5)
    }

    #[test]
    fn slot_is_16_bytes() {
        assert_eq!(size_of::<Slot>(), 16);
    }

    #[test]
    fn zero_bytes_is_exact() {
        assert_eq!(zero_bytes(0), HIGH_BITS);
        assert_eq!(zero_bytes(u64::MAX), 0);
        assert_eq!(zero_bytes(0x0100_8000_0001_FF00), 0x0080_0080_8000_0080);
        // A zero byte below bytes of 0x01 flags nothing above it (no borrow).
        assert_eq!(zero_bytes(0x0101_0101_0101_0100), 0x80);
    }

    #[test]
    fn bit_and_byte_counts_agree_with_count_ones() {
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let marks = zero_bytes(x & 0x0F0F_0F0F_0F0F_0F0F);
            assert_eq!(marked_bytes(marks), u64::from(marks.count_ones()));
            let bit = 1u64 << (x % 64);
            assert!(one_bit(bit));
            assert_eq!(one_bit(x), x.count_ones() == 1);
        }
        assert_eq!(marked_bytes(HIGH_BITS), 8);
        assert_eq!(marked_bytes(0), 0);
        assert!(!one_bit(0));
    }

    /// Every occupied slot is in one of its key's buckets, under its key's fingerprint, flagged
    /// shared exactly when its set is an overflow list; the count matches.
    fn assert_consistent(shard: &ReverseShard) {
        let mut occupied = 0;
        for (i, slot) in shard.slots.iter().enumerate() {
            let (bucket, way) = (i / WAYS, i % WAYS);
            let tag = (shard.tags[bucket] >> (8 * way)) as u8;
            if tag == 0 {
                continue;
            }
            occupied += 1;
            let home = Home::of(mix_word(slot.word, shard.seed), shard.buckets());
            assert!(bucket == home.b1 || bucket == home.b2, "slot {i}");
            assert_eq!(tag & !SHARED_TAG, home.tag, "slot {i}");
            assert_eq!(tag & SHARED_TAG != 0, slot.pod & SHARED != 0, "slot {i}");
        }
        assert_eq!(occupied, shard.len);
    }

    #[test]
    fn sets_grow_and_shrink_back_inline() {
        let mut shard = ReverseShard::new(5);
        shard.remove(h(9, 0), PodSlot(1));
        assert_eq!(shard.len(), 0);
        let (a, b, c) = (PodSlot(1), PodSlot(2), PodSlot(3));
        shard.add(h(9, 0), a, 10);
        shard.add(h(9, 0), b, 20);
        shard.add(h(9, 0), c, 30);
        assert_eq!(shard.holder_node(h(9, 0), b), Some(20));
        assert_eq!(shard.holder_node(h(9, 1), b), None);
        assert_consistent(&shard);
        shard.remove(h(9, 0), a);
        shard.remove(h(9, 0), c);
        assert_consistent(&shard);
        assert_eq!(shard.holder_node(h(9, 0), b), Some(20));
        assert_eq!(shard.free, [0]);
        shard.remove(h(9, 0), b);
        assert_eq!(shard.len(), 0);
        assert_eq!(shard.holder_node(h(9, 0), b), None);
    }

    /// Two entries with the same buckets and fingerprint: a delete cannot tell them apart by
    /// tags, reads the slots, and removes the right one.
    #[test]
    fn fingerprint_twins_are_told_apart() {
        let mut shard = ReverseShard::new(5);
        shard.add(h(u64::MAX, 0), PodSlot(1), 0);
        let buckets = shard.buckets();
        let first = h(0, 0);
        let home = Home::of(first.mix, buckets);
        let twin = (1u64..)
            .map(|x| h(x, 0))
            .find(|k| {
                let other = Home::of(k.mix, buckets);
                other.b1 == home.b1 && other.b2 == home.b2 && other.tag == home.tag
            })
            .expect("a twin exists");
        shard.add(first, PodSlot(1), 1);
        shard.add(twin, PodSlot(2), 2);
        assert_eq!(shard.sole_candidate(first), None);
        shard.remove(first, PodSlot(1));
        assert_consistent(&shard);
        assert_eq!(shard.holder_node(first, PodSlot(1)), None);
        assert_eq!(shard.holder_node(twin, PodSlot(2)), Some(2));
        assert!(shard.sole_candidate(twin).is_some());
        shard.remove(twin, PodSlot(2));
        assert_eq!(shard.len(), 1);
    }

    /// Many inserts and deletes against a `HashMap`: every entry stays findable, absent keys
    /// are not found, and churn does not grow the table.
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
                assert_eq!(shard.holder_node(key, PodSlot(1)), None);
                shard.add(key, PodSlot(1), round);
                v.insert(round);
            } else {
                shard.remove(key, PodSlot(1));
                model.remove(&key.key);
            }
            assert_eq!(shard.len(), model.len());
            if round % 1000 == 0 {
                assert_consistent(&shard);
            }
        }
        assert_consistent(&shard);
        for (&key, &node) in &model {
            assert_eq!(
                shard.holder_node(Hashed::new(key, 5), PodSlot(1)),
                Some(node)
            );
        }
        assert!(shard.slots.len() <= 4096, "{} slots", shard.slots.len());
    }

    /// Filling to the grow threshold: the walks place every entry, the table grows only when
    /// it passes 15/16, and everything stays findable.
    #[test]
    fn fills_to_fifteen_sixteenths() {
        let mut shard = ReverseShard::new(5);
        let keys: Vec<Hashed> = (0..15 * 4096 / 16).map(|x| h(x, 3)).collect();
        for (n, &key) in keys.iter().enumerate() {
            shard.add(key, PodSlot(2), n as u32);
        }
        assert_eq!(shard.slots.len(), 4096);
        assert_consistent(&shard);
        for (n, &key) in keys.iter().enumerate() {
            assert_eq!(shard.holder_node(key, PodSlot(2)), Some(n as u32));
        }
        shard.add(h(1 << 40, 3), PodSlot(2), 0);
        assert_eq!(shard.slots.len(), 8192);
        assert_consistent(&shard);
    }

    /// 40 entries whose two buckets are the same two buckets (room for 16): the walk fails, the
    /// table grows until they fit, and deletes keep every other entry findable.
    #[test]
    fn crowded_buckets_grow_the_table() {
        let mut shard = ReverseShard::new(5);
        shard.add(h(u64::MAX, 0), PodSlot(1), 0);
        let buckets = shard.buckets();
        let crowded: Vec<Hashed> = (0u64..)
            .map(|x| h(x, 0))
            .filter(|k| {
                let home = Home::of(k.mix, 64);
                home.b1 == 3 && home.b2 == 7
            })
            .take(40)
            .collect();
        for (n, &key) in crowded.iter().enumerate() {
            shard.add(key, PodSlot(1), n as u32);
        }
        assert!(
            shard.buckets() >= 8 * buckets,
            "{} buckets",
            shard.buckets()
        );
        assert_consistent(&shard);
        for n in (0..40).step_by(3) {
            shard.remove(crowded[n], PodSlot(1));
        }
        assert_consistent(&shard);
        for (n, &key) in crowded.iter().enumerate() {
            let want = (n % 3 != 0).then_some(n as u32);
            assert_eq!(shard.holder_node(key, PodSlot(1)), want, "entry {n}");
        }
        assert_eq!(shard.len(), 1 + 40 - 14);
    }
}
