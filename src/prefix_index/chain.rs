//! Longest matches of a chained prompt by bisection ([`PrefixIndex::chain_matches`]), the
//! affinity mode's lookup.
//!
//! Algorithm: the candidates holding block 0 form one group over the range `0..blocks`. A
//! group over `lo..hi` holds block `lo` and none of it is known to hold block `hi`; probing the
//! middle block splits it in place into those holding it (range `mid..hi`) and the rest
//! (`lo..mid`), until a range is one block wide: its group matched `lo + 1` blocks. Ranges wait
//! on a stack. No knobs.

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
        let mut holding = Vec::new();
        probe.holders(0, &mut holding);
        if !holding.is_empty() {
            probe.bisect(&mut holding, &mut matched);
        }
        matched
    }
}

/// One chain lookup: which candidates hold block `i` of the chain.
struct ChainProbe<'a> {
    index: &'a PrefixIndex,
    hashes: &'a [BlockHash],
    model: ModelId,
    salt: u64,
    positions: CandidatePositions,
    /// The pods of the last probed block's set (a buffer reused across probes).
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

    /// Appends to `out` the positions of the candidates holding block `i`.
    #[inline]
    fn holders(&mut self, i: usize, out: &mut Vec<usize>) {
        let key = Hashed::block(self.hashes[i], self.model, self.salt, self.index.seed);
        self.pods.clear();
        self.index.shards[key.shard()]
            .read()
            .push_pods(key, &mut self.pods);
        out.extend(self.pods.iter().filter_map(|&p| self.positions.position(p)));
    }

    /// Sets `matched[ci]` for each candidate `ci` of `holding` (those holding block 0) to the
    /// blocks it holds, bisecting every group of candidates that share a range.
    fn bisect(&mut self, holding: &mut [usize], matched: &mut [usize]) {
        // (lo, hi, start, end): the candidates holding[start..end] each hold block lo; none is
        // known to hold block hi. Groups are split in place (those holding mid moved first).
        let mut work = vec![(0usize, self.hashes.len(), 0usize, holding.len())];
        let mut found = Vec::new();
        // seen[ci] == probe number: candidate ci holds the probed block.
        let mut seen = vec![0u32; matched.len()];
        let mut probes = 0u32;
        while let Some((lo, hi, start, end)) = work.pop() {
            if hi - lo == 1 {
                for &ci in &holding[start..end] {
                    matched[ci] = lo + 1;
                }
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            found.clear();
            self.holders(mid, &mut found);
            probes += 1;
            for &ci in &found {
                seen[ci] = probes;
            }
            let split = start + seen_first(&mut holding[start..end], &seen, probes);
            if split < end {
                work.push((lo, mid, split, end));
            }
            if split > start {
                work.push((mid, hi, start, split));
            }
        }
    }
}

/// Moves the candidates of `group` that `seen` marks with `probe` to its front (by swaps, in
/// place); returns how many there are.
#[inline]
fn seen_first(group: &mut [usize], seen: &[u32], probe: u32) -> usize {
    let mut split = 0;
    for j in 0..group.len() {
        if seen[group[j]] == probe {
            group.swap(split, j);
            split += 1;
        }
    }
    split
}
