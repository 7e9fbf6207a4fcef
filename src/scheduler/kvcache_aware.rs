//! Kthena's `kvcache-aware` score plugin, the pure part (volcano-sh/kthena at 3cc0572,
//! `pkg/kthena-router/scheduler/plugins/kvcache_aware.go`).
//!
//! The engines' KV caches are published to Redis by a writer beside each engine (Kthena's
//! Runtime, or `prefix-picker kv-relay`): per token block, a hash
//! `matrix:kv:block:{model}@{hash}` whose fields are the holders, `podName.namespace` -> the
//! unix second written. Per request:
//!
//! 1. the prompt's engine tokens (asked of a candidate's `/tokenize` by the platform) are cut
//!    into blocks of `blockSizeToHash` tokens, at most `maxBlocksToMatch` blocks (the last one
//!    may be partial);
//! 2. each block gets its *standardized hash* ([`standardized_hash`]): SHA-256 over the block's
//!    token ids as big-endian u32, the first 8 bytes read big-endian, masked to 63 bits. Blocks
//!    are not chained: a block's hash depends on its own tokens only;
//! 3. the platform reads every block's hash with one pipelined `HGETALL` ([`KvBlockOwners`]);
//! 4. [`score`]: an owner whose field was written at or before its pod's containers last started
//!    is dropped (its cache is gone; pods without a known start time, such as static endpoints,
//!    keep theirs; an unparsable value is kept, as Kthena keeps it), owners that are not
//!    candidates are dropped, and each candidate scores Kthena's `calculatePodScores`: the blocks
//!    it holds consecutively from the first, over all blocks, x 100, truncated. A pod missing the
//!    first block scores 0. The match ratio observed is the longest such run over all blocks.
//!
//! No lookup (tokenizer or Redis failed, no prompt): the plugin returns nothing for the request,
//! as Kthena's returns `nil`. This module does no I/O; the lookup is `crate::kvcache`'s.

use sha2::{Digest, Sha256};

use super::Candidate;

/// The plugin's name in Kthena's `Score.enabled` and `pluginConfig`.
pub const PLUGIN: &str = "kvcache-aware";

/// The Redis key prefix of the block hashes (Kthena's `kvCacheKeyPrefix`).
pub const KEY_PREFIX: &str = "matrix:kv:block:";

/// The plugin's arguments, in range (Kthena's leniencies are applied by the config parser).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheAwareArgs {
    /// Tokens per hashed block (`blockSizeToHash`, default 16).
    pub block_size_to_hash: usize,
    /// Blocks looked up at most (`maxBlocksToMatch`, default 128).
    pub max_blocks_to_match: usize,
    /// Where a vLLM pod serves `/tokenize` (`vllmTokenizerPort`, default 8000).
    pub vllm_tokenizer_port: u16,
    /// Where an SGLang pod serves `/tokenize` (`sglangTokenizerPort`, default 30000).
    pub sglang_tokenizer_port: u16,
}

impl KvCacheAwareArgs {
    pub const DEFAULT_BLOCK_SIZE_TO_HASH: usize = 16;
    pub const DEFAULT_MAX_BLOCKS_TO_MATCH: usize = 128;
    pub const DEFAULT_VLLM_TOKENIZER_PORT: u16 = 8000;
    pub const DEFAULT_SGLANG_TOKENIZER_PORT: u16 = 30000;
}

impl Default for KvCacheAwareArgs {
    fn default() -> Self {
        KvCacheAwareArgs {
            block_size_to_hash: Self::DEFAULT_BLOCK_SIZE_TO_HASH,
            max_blocks_to_match: Self::DEFAULT_MAX_BLOCKS_TO_MATCH,
            vllm_tokenizer_port: Self::DEFAULT_VLLM_TOKENIZER_PORT,
            sglang_tokenizer_port: Self::DEFAULT_SGLANG_TOKENIZER_PORT,
        }
    }
}

/// A block's standardized hash: 63 bits, the same for the writer and the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StdBlockHash(pub u64);

impl std::fmt::Display for StdBlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Kthena's `computeStandardizedHash` (and the Runtime's `compute_standardized_hash`): 0 for no
/// tokens.
pub fn standardized_hash(tokens: &[u32]) -> StdBlockHash {
    if tokens.is_empty() {
        return StdBlockHash(0);
    }
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_be_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    StdBlockHash(u64::from_be_bytes(first) & 0x7FFF_FFFF_FFFF_FFFF)
}

/// The prompt's block hashes: blocks of `block_size` tokens (the last may be partial), at most
/// `max_blocks` (Kthena's `TokensToBlockHashes`). `block_size` 0 is taken as 1.
pub fn block_hashes(tokens: &[u32], block_size: usize, max_blocks: usize) -> Vec<StdBlockHash> {
    tokens
        .chunks(block_size.max(1))
        .take(max_blocks)
        .map(standardized_hash)
        .collect()
}

/// The Redis key of one block: `matrix:kv:block:{model}@{hash}`.
pub fn block_key(model: &str, hash: StdBlockHash) -> String {
    format!("{KEY_PREFIX}{model}@{hash}")
}

/// A cache owner's identity as the writer names it: `podName.namespace`.
pub fn owner_id(pod_name: &str, namespace: &str) -> String {
    format!("{pod_name}.{namespace}")
}

/// What Redis said of the request's blocks, in block order: each block's fields as stored
/// (owner -> the unix second it was written, as text). Filled by the platform's lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvBlockOwners {
    pub hashes: Vec<StdBlockHash>,
    /// Per block (same length as `hashes`): its fields.
    pub owners: Vec<Vec<(String, String)>>,
}

/// The plugin's result for one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheScores {
    /// Per candidate, 0..=100.
    pub scores: Vec<u32>,
    /// Per candidate, the blocks it holds consecutively from the first.
    pub matched: Vec<usize>,
    /// Blocks of the prompt.
    pub total: usize,
    /// The longest run any candidate holds (Kthena's `longestMatch`).
    pub longest: usize,
    /// Owners dropped because their field predates their pod's containers' start.
    pub stale_owners: usize,
}

impl KvCacheScores {
    /// Kthena's match ratio: the longest run over all blocks (0 is a miss).
    pub fn match_ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.longest as f64 / self.total as f64
        }
    }
}

/// Whether an owner's field is fresh: written after its pod's containers last started, or the
/// start is unknown, or the value does not parse (Kthena's `freshOwners`).
fn fresh(written: &str, started: Option<i64>) -> bool {
    match (started, written.parse::<i64>()) {
        (Some(started), Ok(written)) => written > started,
        _ => true,
    }
}

/// Scores `candidates` from the looked-up owners (see the module header).
pub fn score<C: Candidate>(lookup: &KvBlockOwners, candidates: &[C]) -> KvCacheScores {
    let total = lookup.hashes.len().min(lookup.owners.len());
    let mut matched = vec![0usize; candidates.len()];
    let mut stale_owners = 0;
    // A candidate is still matching at block i exactly when its run is i (Kthena's trick).
    for (i, fields) in lookup.owners.iter().take(total).enumerate() {
        let mut still = 0;
        for (owner, written) in fields {
            for (c, run) in candidates.iter().zip(matched.iter_mut()) {
                if c.cache_owner() != Some(owner.as_str()) {
                    continue;
                }
                if !fresh(written, c.containers_started()) {
                    stale_owners += 1;
                    continue;
                }
                if *run == i {
                    *run += 1;
                    still += 1;
                }
            }
        }
        if still == 0 {
            break;
        }
    }
    let longest = matched.iter().copied().max().unwrap_or(0);
    let scores = matched
        .iter()
        .map(|&m| {
            if total == 0 {
                0
            } else {
                ((m as f64 / total as f64) * 100.0) as u32
            }
        })
        .collect();
    KvCacheScores {
        scores,
        matched,
        total,
        longest,
        stale_owners,
    }
}

#[cfg(test)]
mod tests;
