//! Longest matches of a chained prompt by bisection ([`PrefixIndex::chain_matches`]), the
//! affinity mode's lookup.
//!
//! Algorithm: the candidates holding block 0 form one group over the range `0..blocks`. A
//! group over `lo..hi` holds block `lo` and none of it is known to hold block `hi`; probing the
//! middle block splits it in place into those holding it (range `mid..hi`) and the rest
//! (`lo..mid`), until a range is one block wide: its group matched `lo + 1` blocks. Ranges wait
//! on a stack. A probe costs the probed block's pods, not the group's: where the block's pods
//! are block `lo`'s, in the same order (a prompt every pod holds, recorded whole), the group
//! moves whole without a look-up; else the block's holders are found among the candidates and
//! moved to the group's front through each candidate's place in it. No knobs.

use super::candidates::CandidatePositions;
use super::models::ModelId;
use super::{BlockHash, Hashed, ModelKey, PodSlot, PrefixIndex, model_salt};

impl PrefixIndex {
    /// Longest match per candidate (blocks, 0 for none) of a chained prompt, found by bisection:
    /// a pod that holds block `i` of a chain holds the blocks before it (a record adds whole
    /// prompts, deepest first, so a pod's list drops a prompt's deepest blocks first), so
    /// `log2(blocks)` lookups per distinct match length replace the walk over every block. No
    /// top-k limit and no tie-break: the affinity mode's lookup (the Kthena walk is
    /// [`PrefixIndex::longest_matches`]). A pod whose list broke the prefix property (a shared
    /// early block evicted before a deeper one) gets a match between the two, never an error.
    pub fn chain_matches(
        &self,
        model: ModelKey,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
    ) -> Vec<usize> {
        let mut matched = vec![0usize; candidates.len()];
        let Some(model) = self.models.get(model) else {
            return matched;
        };
        if hashes.is_empty() {
            return matched;
        }
        let mut probe = ChainProbe::new(self, model, hashes, candidates);
        let first = probe.fetch(0);
        let mut holding = Vec::new();
        probe.positions_of(first, &mut holding);
        if !holding.is_empty() {
            probe.bisect(&mut holding, &mut matched, first);
        }
        matched
    }
}

/// One chain lookup: which pods hold block `i` of the chain, and which candidates those are.
struct ChainProbe<'a> {
    index: &'a PrefixIndex,
    hashes: &'a [BlockHash],
    model: ModelId,
    salt: u64,
    positions: CandidatePositions,
    /// The pods of the probed blocks a group starts at, one block's after another (each group
    /// keeps the range of its first block's).
    pods: Vec<PodSlot>,
}

impl<'a> ChainProbe<'a> {
    fn new(
        index: &'a PrefixIndex,
        model: ModelId,
        hashes: &'a [BlockHash],
        candidates: &[PodSlot],
    ) -> ChainProbe<'a> {
        let mut positions = CandidatePositions::default();
        positions.rebuild(candidates);
        ChainProbe {
            index,
            hashes,
            model,
            salt: model_salt(model, index.seed),
            positions,
            pods: Vec::new(),
        }
    }

    /// Reads the pods holding block `i` (every pod, candidate or not) into `pods`; returns
    /// their range there.
    #[inline]
    fn fetch(&mut self, i: usize) -> (usize, usize) {
        let key = Hashed::block(self.hashes[i], self.model, self.salt, self.index.seed);
        let start = self.pods.len();
        self.index.shards[key.shard()]
            .read()
            .push_pods(key, &mut self.pods);
        (start, self.pods.len())
    }

    /// Drops the pods of the last fetched block, whose range starts at `start`.
    fn forget_last(&mut self, (start, _): (usize, usize)) {
        self.pods.truncate(start);
    }

    /// Appends to `out` the candidate positions of the pods in `range`.
    #[inline]
    fn positions_of(&self, (start, end): (usize, usize), out: &mut Vec<usize>) {
        out.extend(
            self.pods[start..end]
                .iter()
                .filter_map(|&p| self.positions.position(p)),
        );
    }

    /// Sets `matched[ci]` for each candidate `ci` of `holding` (those holding block 0) to the
    /// blocks it holds, bisecting every group of candidates that share a range.
    fn bisect(&mut self, holding: &mut [usize], matched: &mut [usize], first: (usize, usize)) {
        // (lo, hi, start, end, lo_pods): the candidates holding[start..end] each hold block lo,
        // whose pods are self.pods[lo_pods]; none is known to hold block hi. Groups are split in
        // place (those holding mid moved first).
        let mut work = vec![(0usize, self.hashes.len(), 0usize, holding.len(), first)];
        let mut found = Vec::new();
        // at[ci]: candidate ci's place in `holding`.
        let mut at = vec![usize::MAX; matched.len()];
        for (k, &ci) in holding.iter().enumerate() {
            at[ci] = k;
        }
        while let Some((lo, hi, start, end, lo_pods)) = work.pop() {
            if hi - lo == 1 {
                for &ci in &holding[start..end] {
                    matched[ci] = lo + 1;
                }
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            let mid_pods = self.fetch(mid);
            if self.pods[lo_pods.0..lo_pods.1] == self.pods[mid_pods.0..mid_pods.1] {
                // The same pods as block lo's: the whole group holds mid (and keeps lo's copy).
                self.forget_last(mid_pods);
                work.push((mid, hi, start, end, lo_pods));
                continue;
            }
            found.clear();
            self.positions_of(mid_pods, &mut found);
            let split = start + holders_first(holding, &mut at, start, end, &found);
            if split < end {
                work.push((lo, mid, split, end, lo_pods));
            }
            if split > start {
                work.push((mid, hi, start, split, mid_pods));
            } else {
                // No group starts at mid: its pods are not read again.
                self.forget_last(mid_pods);
            }
        }
    }
}

/// Moves the candidates of `found` that are in `holding[start..end]` to its front (by swaps,
/// keeping `at` each candidate's place in `holding`); returns how many there are.
#[inline]
fn holders_first(
    holding: &mut [usize],
    at: &mut [usize],
    start: usize,
    end: usize,
    found: &[usize],
) -> usize {
    let mut front = start;
    for &ci in found {
        let j = at[ci];
        // In the group and not moved yet (a pod listed twice in a set is moved once).
        if j < front || j >= end {
            continue;
        }
        let other = holding[front];
        holding.swap(front, j);
        at[other] = j;
        at[ci] = front;
        front += 1;
    }
    front - start
}
