//! A batch of index operations grouped by reverse-map shard, so each shard lock is taken once
//! per batch instead of once per entry.
//!
//! Algorithm: a stable counting sort of batch positions by shard. Within a shard the positions
//! keep their original order, so the operations on one entry (which always maps to one shard)
//! reach it in the order they were made. Besides saving lock operations, this lets the CPU
//! overlap the cache misses of consecutive lookups: a lock's atomic read-modify-write waits for
//! every earlier load, so one lock per entry would serialise them.

use super::SHARDS;

#[derive(Debug, Default)]
pub struct ShardBatch {
    order: Vec<u32>,
    starts: [u32; SHARDS + 1],
}

impl ShardBatch {
    /// Groups positions `0..n` given the shard of each position.
    pub fn new(shards: impl ExactSizeIterator<Item = usize> + Clone) -> ShardBatch {
        let mut batch = ShardBatch::default();
        batch.regroup(shards);
        batch
    }

    /// Like [`ShardBatch::new`], reusing this batch's buffer (hot paths keep one per caller).
    #[inline(always)]
    pub fn regroup(&mut self, shards: impl ExactSizeIterator<Item = usize> + Clone) {
        let mut starts = [0u32; SHARDS + 1];
        for s in shards.clone() {
            starts[s + 1] += 1;
        }
        for s in 0..SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut next = starts;
        self.order.clear();
        self.order.resize(shards.len(), 0);
        for (pos, s) in shards.enumerate() {
            self.order[next[s] as usize] = pos as u32;
            next[s] += 1;
        }
        self.starts = starts;
    }

    /// Each shard that has positions, with its positions in their original order.
    pub fn groups(&self) -> impl Iterator<Item = (usize, &[u32])> {
        (0..SHARDS).filter_map(|s| {
            let group = &self.order[self.starts[s] as usize..self.starts[s + 1] as usize];
            (!group.is_empty()).then_some((s, group))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_stable_and_complete() {
        let shards = [3usize, 1, 3, 0, 1, 3];
        let batch = ShardBatch::new(shards.iter().copied());
        let groups: Vec<(usize, Vec<u32>)> = batch.groups().map(|(s, g)| (s, g.to_vec())).collect();
        assert_eq!(groups, [(0, vec![3]), (1, vec![1, 4]), (3, vec![0, 2, 5])]);
    }

    #[test]
    fn regroup_forgets_the_previous_batch() {
        let mut batch = ShardBatch::new([5usize, 5, 5, 2].iter().copied());
        batch.regroup([1usize, 0].iter().copied());
        let groups: Vec<(usize, Vec<u32>)> = batch.groups().map(|(s, g)| (s, g.to_vec())).collect();
        assert_eq!(groups, [(0, vec![1]), (1, vec![0])]);
    }
}
