//! The prefix-cache score plugin (Kthena's `prefix-cache`, semantics doc §2–§5).
//!
//! Score: hash the prompt into chained blocks, find each candidate's longest match in the
//! [`PrefixIndex`], and give `int(matched / total * 100)` (float, then truncate) to at most
//! `topKMatches` pods; every other candidate gets an explicit 0. An empty prompt gives no scores
//! at all, so the request is routed by the other plugins. Each scoring with a non-empty hash list
//! observes `longest / total` in `kthena_router_prefix_cache_match_ratio{model}`.
//! Record: after a pod served the request successfully, its hashes are added to that pod's list.
//!
//! Knobs (plugin args, Kthena names and defaults): `blockSizeToHash` 64, `maxBlocksToMatch` 128,
//! `maxHashCacheSize` 50000, `topKMatches` 5. Omitted, zero or negative -> default; unknown names
//! are ignored with a warning; an args block that cannot be parsed (a string value, a fraction, a
//! list) gives all defaults and the log line `Failed to unmarshal PrefixCacheArgs, using default
//! values`. Ties beyond `topKMatches` are broken by an RNG seeded from the scheduler seed and a
//! per-scoring counter, so runs are reproducible and no pod is always favoured.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_yaml_ng::Value as Yaml;

use crate::hashing::{BlockChain, BlockHash, ChainScheme};
use crate::metrics::PrefixCacheMetrics;
use crate::prefix_index::{ModelKey, PodHandle, PodSlot, PrefixIndex, TentativeEntries};

/// The exact log line Kthena writes when the args block cannot be parsed.
pub const UNPARSABLE_ARGS: &str = "Failed to unmarshal PrefixCacheArgs, using default values";

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

/// Arguments plus the warnings their parsing produced (to be logged by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedArgs {
    pub args: PrefixCacheArgs,
    pub warnings: Vec<String>,
}

const KEYS: [&str; 4] = [
    "blockSizeToHash",
    "maxBlocksToMatch",
    "maxHashCacheSize",
    "topKMatches",
];

impl PrefixCacheArgs {
    /// Parses the `args` value of the plugin with Kthena's leniency (never fails).
    pub fn parse(args: Option<&Yaml>) -> ParsedArgs {
        let mut warnings = Vec::new();
        let mut values: [Option<i64>; 4] = [None; 4];
        let parsed = match args {
            None | Some(Yaml::Null) => true,
            Some(Yaml::Mapping(map)) => map.iter().all(|(k, v)| {
                let Some(name) = k.as_str() else {
                    return false;
                };
                let Some(slot) = KEYS.iter().position(|key| key.eq_ignore_ascii_case(name)) else {
                    warnings.push(format!(
                        "prefix-cache: unknown argument {name:?} ignored (known: {})",
                        KEYS.join(", ")
                    ));
                    return true;
                };
                match integral(v) {
                    Ok(n) => {
                        values[slot] = n;
                        true
                    }
                    Err(()) => false,
                }
            }),
            Some(_) => false,
        };
        if !parsed {
            warnings.clear();
            warnings.push(UNPARSABLE_ARGS.to_string());
            return ParsedArgs {
                args: PrefixCacheArgs::default(),
                warnings,
            };
        }
        let d = PrefixCacheArgs::default();
        let pick = |v: Option<i64>, default: usize| match v {
            Some(n) if n > 0 => usize::try_from(n).unwrap_or(default),
            _ => default,
        };
        ParsedArgs {
            args: PrefixCacheArgs {
                block_size_to_hash: pick(values[0], d.block_size_to_hash),
                max_blocks_to_match: pick(values[1], d.max_blocks_to_match),
                max_hash_cache_size: pick(values[2], d.max_hash_cache_size)
                    .min(u32::MAX as usize - 1),
                top_k_matches: pick(values[3], d.top_k_matches),
            },
            warnings,
        }
    }

    pub fn chain(&self) -> BlockChain {
        BlockChain {
            block_size: self.block_size_to_hash,
            max_blocks: self.max_blocks_to_match,
        }
    }
}

/// An integer, an integral float, or null (= omitted); anything else is unparsable.
fn integral(v: &Yaml) -> Result<Option<i64>, ()> {
    match v {
        Yaml::Null => Ok(None),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i))
            } else if n.is_u64() {
                Err(())
            } else {
                let f = n.as_f64().ok_or(())?;
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Ok(Some(f as i64))
                } else {
                    Err(())
                }
            }
        }
        _ => Err(()),
    }
}

/// The plugin: the index plus its arguments and metrics.
#[derive(Debug)]
pub struct PrefixCache {
    args: PrefixCacheArgs,
    chain: BlockChain,
    scheme: ChainScheme,
    index: Arc<PrefixIndex>,
    seed: u64,
    scorings: AtomicU64,
    metrics: PrefixCacheMetrics,
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
}

impl PrefixCache {
    pub fn new(args: PrefixCacheArgs, seed: u64, metrics: PrefixCacheMetrics) -> PrefixCache {
        PrefixCache {
            args,
            chain: args.chain(),
            scheme: ChainScheme::Kthena,
            index: Arc::new(PrefixIndex::new(args.max_hash_cache_size)),
            seed,
            scorings: AtomicU64::new(0),
            metrics,
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
        let mut out = Vec::new();
        self.chain.hash_with(self.scheme, model, prompt, &mut out);
        out
    }

    /// Scores candidates; `None` for an empty hash list (the plugin returns no scores).
    /// `observe` = false computes without touching the match-ratio histogram (explain).
    pub fn score(
        &self,
        model: &str,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        observe: bool,
    ) -> Option<PrefixScores> {
        if hashes.is_empty() {
            return None;
        }
        let n = self.scorings.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let matched = self.index.longest_matches(
            ModelKey::of(model),
            hashes,
            candidates,
            self.args.top_k_matches,
            || SmallRng::seed_from_u64(seed),
        );
        let total = hashes.len();
        let scores = matched.iter().map(|&m| percent(m, total)).collect();
        if observe {
            let longest = matched.iter().copied().max().unwrap_or(0);
            self.metrics
                .match_ratio
                .with_label_values(&[model])
                .observe(longest as f64 / total as f64);
        }
        Some(PrefixScores {
            scores,
            matched_blocks: matched,
            total_blocks: total,
            held_blocks: Vec::new(),
            head_inflight: Vec::new(),
        })
    }

    /// The affinity mode's scoring: every candidate's longest match, in the index (by
    /// bisection, [`PrefixIndex::chain_matches`]) or held tentatively, with no top-k limit;
    /// scores are the same percentages. `None` for an empty hash list.
    pub fn score_chained(
        &self,
        model: &str,
        hashes: &[BlockHash],
        candidates: &[PodSlot],
        tentative: &TentativeEntries,
        observe: bool,
    ) -> Option<PrefixScores> {
        if hashes.is_empty() {
            return None;
        }
        let key = ModelKey::of(model);
        let held = self.index.chain_matches(key, hashes, candidates);
        let mut matched = held.clone();
        let mut heads = vec![0; candidates.len()];
        tentative.extend_matches(key, hashes, candidates, &mut matched, &mut heads);
        let total = hashes.len();
        if observe {
            let longest = matched.iter().copied().max().unwrap_or(0);
            self.metrics
                .match_ratio
                .with_label_values(&[model])
                .observe(longest as f64 / total as f64);
        }
        Some(PrefixScores {
            scores: matched.iter().map(|&m| percent(m, total)).collect(),
            matched_blocks: matched,
            total_blocks: total,
            held_blocks: held,
            head_inflight: heads,
        })
    }

    /// Records a served prompt for the pod that served it.
    pub fn record(&self, model: &str, hashes: &[BlockHash], pod: &PodHandle) -> usize {
        if hashes.is_empty() {
            return 0;
        }
        let outcome = self.index.record(pod, ModelKey::of(model), hashes);
        for (evicted_model, count) in outcome.evicted {
            let name = if evicted_model == ModelKey::of(model) {
                model.to_string()
            } else {
                self.metrics.model_name(evicted_model)
            };
            self.metrics
                .evictions
                .with_label_values(&[name.as_str()])
                .inc_by(count);
        }
        self.metrics.remember_model(model);
        outcome.inserted
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
