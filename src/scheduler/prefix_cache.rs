//! The prefix-cache score plugin (Kthena's `prefix-cache`, semantics doc §2–§5).
//!
//! Score: hash the prompt into chained blocks, find each candidate's longest match in the
//! [`PrefixIndex`], and give `int(matched / total * 100)` (float, then truncate) to at most
//! `topKMatches` pods; every other candidate gets an explicit 0. An empty prompt gives no scores
//! at all, so the request is routed by the other plugins. Each scoring with a non-empty hash list
//! returns `longest / total`, which the caller observes in
//! `kthena_router_prefix_cache_match_ratio{model}`.
//! Record: after a pod served the request successfully, its hashes are added to that pod's list.
//!
//! Knobs (plugin args, Kthena names and defaults): `blockSizeToHash` 64, `maxBlocksToMatch` 128,
//! `maxHashCacheSize` 50000, `topKMatches` 5 (Kthena's leniency in reading them lives with the
//! config file's parser). Ties beyond `topKMatches` are broken by an RNG seeded from the scheduler
//! seed and a per-scoring counter, so runs are reproducible and no pod is always favoured.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::hashing::{BlockChain, BlockHash, CacheSalt, ChainScheme};
use crate::prefix_index::{
    ModelKey, PodHandle, PodSlot, PrefixIndex, RecordOutcome, TentativeEntries,
};

/// Validated plugin arguments (every value > 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheArgs {
    pub block_size_to_hash: usize,
    pub max_blocks_to_match: usize,
    pub max_hash_cache_size: usize,
    pub top_k_matches: usize,
}

impl Default for PrefixCacheArgs {
    fn default() -> Self {
        PrefixCacheArgs {
            block_size_to_hash: 64,
            max_blocks_to_match: 128,
            max_hash_cache_size: 50_000,
            top_k_matches: 5,
        }
    }
}

impl PrefixCacheArgs {
    pub fn chain(&self) -> BlockChain {
        BlockChain {
            block_size: self.block_size_to_hash,
            max_blocks: self.max_blocks_to_match,
        }
    }
}

/// The plugin: the index plus its arguments.
#[derive(Debug)]
pub struct PrefixCache {
    args: PrefixCacheArgs,
    chain: BlockChain,
    scheme: ChainScheme,
    index: Arc<PrefixIndex>,
    seed: u64,
}

/// One scoring's result: per-candidate scores (candidate order) and the best match ratio.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixScores {
    pub scores: Vec<u32>,
    pub matched_blocks: Vec<usize>,
    pub total_blocks: usize,
    /// Affinity mode: the blocks each candidate holds in the index alone (no tentative holds),
    /// the prediction the engine's `cached_tokens` report is checked against.
    pub held_blocks: Vec<usize>,
    /// Affinity mode: requests in flight on each candidate that share the prompt's first block.
    pub head_inflight: Vec<u32>,
    /// Affinity mode: the prompt's blocks that requests in flight on each candidate already
    /// occupy there (their longest common head with it), which a new request shares in the
    /// engine's KV cache instead of taking new blocks.
    pub pinned_blocks: Vec<usize>,
}

impl PrefixScores {
    /// Candidates for which `reuses_nothing(i)` holds match nothing: their engine runs with
    /// prefix caching off, whatever the index or a hold says.
    pub fn forget(&mut self, reuses_nothing: impl Fn(usize) -> bool) {
        let per_candidate = self
            .scores
            .iter_mut()
            .zip(&mut self.matched_blocks)
            .zip(&mut self.held_blocks)
            .zip(&mut self.pinned_blocks);
        for (i, (((score, matched), held), pinned)) in per_candidate.enumerate() {
            if reuses_nothing(i) {
                (*score, *matched, *held, *pinned) = (0, 0, 0, 0);
            }
        }
    }

    /// The longest match over the prompt's blocks (Kthena's match-ratio histogram).
    pub fn match_ratio(&self) -> f64 {
        let longest = self.matched_blocks.iter().copied().max().unwrap_or(0);
        longest as f64 / self.total_blocks as f64
    }
}

impl PrefixCache {
    pub fn new(args: PrefixCacheArgs, seed: u64) -> PrefixCache {
        PrefixCache {
            args,
            chain: args.chain(),
            scheme: ChainScheme::Kthena,
            index: Arc::new(PrefixIndex::new(args.max_hash_cache_size)),
            seed,
        }
    }

    /// The plugin with new arguments and seed over this one's index (a config reload). The
    /// index keeps its per-pod capacity (`maxHashCacheSize` is read once); when the block layout
    /// changes the caller clears the index.
    pub fn sharing(&self, args: PrefixCacheArgs, seed: u64) -> PrefixCache {
        PrefixCache {
            args,
            chain: args.chain(),
            scheme: ChainScheme::Kthena,
            index: self.index.clone(),
            seed,
        }
    }

    pub fn args(&self) -> PrefixCacheArgs {
        self.args
    }

    /// The same plugin hashing with `scheme` (the affinity mode's long prompts: seeded).
    pub fn with_scheme(mut self, scheme: ChainScheme) -> PrefixCache {
        self.scheme = scheme;
        self
    }

    pub fn scheme(&self) -> ChainScheme {
        self.scheme
    }

    pub fn index(&self) -> &Arc<PrefixIndex> {
        &self.index
    }

    /// The block hashes of a prompt for a model.
    pub fn hash(&self, model: &str, prompt: &[u8]) -> Vec<BlockHash> {
        self.hash_salted(model, None, prompt)
    }

    /// The block hashes of a prompt for a model and the request's `cache_salt`: a salt seeds
    /// the chain, so the index keeps a model's salts apart without a key of their own.
    pub fn hash_salted(
        &self,
        model: &str,
        salt: Option<&CacheSalt>,
        prompt: &[u8],
    ) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.chain
            .hash_salted(self.scheme, model, salt, prompt, &mut out);
        out
    }

    /// Scores candidates; `None` for an empty hash list (the plugin returns no scores).
    /// `scoring` numbers the scorings (it seeds the tie-break beyond `topKMatches`).
    pub fn score(
        &self,
        model: &str,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        scoring: u64,
    ) -> Option<PrefixScores> {
        if hashes.is_empty() {
            return None;
        }
        let seed = self.seed ^ scoring.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let matched = self.index.longest_matches(
            ModelKey::of(model),
            hashes,
            candidates,
            self.args.top_k_matches,
            || SmallRng::seed_from_u64(seed),
        );
        let total = hashes.len();
        let scores = matched.iter().map(|&m| percent(m, total)).collect();
        Some(PrefixScores {
            scores,
            matched_blocks: matched,
            total_blocks: total,
            held_blocks: Vec::new(),
            head_inflight: Vec::new(),
            pinned_blocks: Vec::new(),
        })
    }

    /// The affinity mode's scoring: every candidate's longest match, in the index (by
    /// bisection, [`PrefixIndex::chain_matches`]) combined, where `engine` has one, with its
    /// engine's view (in prompt blocks, [`engine_match::combine`](super::engine_match::combine),
    /// which notes in `engine` what the estimate added), or held tentatively, with no top-k
    /// limit; scores are the same percentages. `None` for an empty hash list.
    pub fn score_chained(
        &self,
        model: &str,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        tentative: &TentativeEntries,
        engine: &mut [Option<super::engine_match::EngineMatched>],
    ) -> Option<PrefixScores> {
        if hashes.is_empty() {
            return None;
        }
        let key = ModelKey::of(model);
        let mut held = self.index.chain_matches(key, hashes, candidates);
        super::engine_match::combine(engine, &mut held);
        let mut matched = held.clone();
        let mut heads = vec![0; candidates.len()];
        let mut pinned = vec![0; candidates.len()];
        tentative.extend_matches(
            key,
            hashes,
            candidates,
            &mut matched,
            &mut heads,
            &mut pinned,
        );
        let total = hashes.len();
        Some(PrefixScores {
            scores: matched.iter().map(|&m| percent(m, total)).collect(),
            matched_blocks: matched,
            total_blocks: total,
            held_blocks: held,
            head_inflight: heads,
            pinned_blocks: pinned,
        })
    }

    /// Records a served prompt for the pod that served it: the entries inserted and those
    /// evicted (per model) to make room, for the caller to count.
    pub fn record(&self, model: &str, hashes: &[BlockHash], pod: &PodHandle) -> RecordOutcome {
        if hashes.is_empty() {
            return RecordOutcome::default();
        }
        self.index.record(pod, ModelKey::of(model), hashes)
    }
}

/// `int(matched / total * 100)`, computed in f64 and truncated like Go's `int()`, clamped to 100.
pub fn percent(matched: usize, total: usize) -> u32 {
    if total == 0 {
        return 0;
    }
    (((matched as f64) / (total as f64)) * 100.0).clamp(0.0, 100.0) as u32
}

#[cfg(test)]
mod tests;
