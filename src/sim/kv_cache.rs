//! A vLLM-like prefix KV cache: token blocks hashed as a chain, pinned while a request runs,
//! evicted least-recently-freed first.
//!
//! The prompt (rendered exactly as the router renders it, so the model is honest about what is
//! shareable) is cut into blocks of `block_tokens` tokens at `BYTES_PER_TOKEN` bytes per token;
//! only full blocks are cached, as in vLLM. A request's cached tokens = the longest run of its
//! leading blocks already present. Admission pins every block of the prompt (allocating missing
//! ones, evicting free blocks LRU); when no free block is left the rest of the prompt is simply
//! not cached (vLLM would preempt). Release unpins; a block with no users stays cached until
//! evicted. `usage` = pinned blocks / capacity (`vllm:kv_cache_usage_perc`).

use std::collections::{BTreeMap, HashMap};

use crate::hashing::{BlockChain, BlockHash};

/// Bytes of rendered prompt per simulated token.
pub const BYTES_PER_TOKEN: usize = 4;

#[derive(Debug, Clone, Copy)]
struct Block {
    pins: u32,
    /// Position in the free list when unpinned.
    freed_at: u64,
}

/// Tokens of a prompt: `ceil(bytes / BYTES_PER_TOKEN)`.
pub fn tokens(prompt_bytes: usize) -> usize {
    prompt_bytes.div_ceil(BYTES_PER_TOKEN)
}

/// What admission found and pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Blocks pinned for the request (release them when it ends).
    pub pinned: Vec<BlockHash>,
}

#[derive(Debug)]
pub struct KvCache {
    block_tokens: usize,
    capacity: usize,
    blocks: HashMap<BlockHash, Block>,
    free: BTreeMap<u64, BlockHash>,
    clock: u64,
    pinned: usize,
}

impl KvCache {
    pub fn new(block_tokens: usize, capacity: usize) -> KvCache {
        KvCache {
            block_tokens: block_tokens.max(1),
            capacity,
            blocks: HashMap::new(),
            free: BTreeMap::new(),
            clock: 0,
            pinned: 0,
        }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Fraction of blocks pinned by running requests.
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.pinned as f64 / self.capacity as f64
        }
    }

    /// Blocks present (pinned or free).
    pub fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The chain hashes of a prompt's full blocks.
    pub fn block_hashes(&self, model: &str, prompt: &[u8]) -> Vec<BlockHash> {
        let block_bytes = self.block_tokens * BYTES_PER_TOKEN;
        let full = prompt.len() / block_bytes;
        BlockChain {
            block_size: block_bytes,
            max_blocks: full.max(1),
        }
        .hash(model, &prompt[..full * block_bytes])
    }

    /// Looks up and pins a prompt's blocks.
    pub fn admit(&mut self, model: &str, prompt: &[u8]) -> Admission {
        let hashes = self.block_hashes(model, prompt);
        let hit = hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        let mut pinned = Vec::with_capacity(hashes.len());
        for h in hashes {
            if self.pin(h) {
                pinned.push(h);
            } else {
                break;
            }
        }
        Admission {
            prompt_tokens: tokens(prompt.len()),
            cached_tokens: hit * self.block_tokens,
            pinned,
        }
    }

    /// Unpins blocks of a finished request; they stay cached until evicted.
    pub fn release(&mut self, pinned: &[BlockHash]) {
        for h in pinned {
            if let Some(b) = self.blocks.get_mut(h) {
                b.pins -= 1;
                if b.pins == 0 {
                    self.clock += 1;
                    b.freed_at = self.clock;
                    self.free.insert(self.clock, *h);
                    self.pinned -= 1;
                }
            }
        }
    }

    fn pin(&mut self, h: BlockHash) -> bool {
        if let Some(b) = self.blocks.get_mut(&h) {
            if b.pins == 0 {
                self.free.remove(&b.freed_at);
                self.pinned += 1;
            }
            b.pins += 1;
            return true;
        }
        if self.blocks.len() >= self.capacity {
            let Some((_, victim)) = self.free.pop_first() else {
                return false;
            };
            self.blocks.remove(&victim);
        }
        self.blocks.insert(
            h,
            Block {
                pins: 1,
                freed_at: 0,
            },
        );
        self.pinned += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_identical_prompt_is_cached() {
        let mut kv = KvCache::new(16, 100);
        let prompt = "x".repeat(64 * 4 + 10);
        let a = kv.admit("m", prompt.as_bytes());
        assert_eq!(a.cached_tokens, 0);
        assert_eq!(a.prompt_tokens, (64 * 4 + 10usize).div_ceil(4));
        assert_eq!(a.pinned.len(), 4);
        assert!(kv.usage() > 0.0);
        kv.release(&a.pinned);
        assert_eq!(kv.usage(), 0.0);
        let b = kv.admit("m", prompt.as_bytes());
        assert_eq!(b.cached_tokens, 64);
        // Another model shares nothing.
        assert_eq!(kv.admit("other", prompt.as_bytes()).cached_tokens, 0);
    }

    #[test]
    fn free_blocks_are_evicted_lru_and_pinned_ones_never() {
        let mut kv = KvCache::new(1, 4); // 4-byte blocks, 4 of them
        let a = kv.admit("m", b"aaaabbbb");
        kv.release(&a.pinned);
        let b = kv.admit("m", b"ccccdddd");
        kv.release(&b.pinned);
        // Full: admitting a new 2-block prompt evicts a's blocks (freed first).
        let c = kv.admit("m", b"eeeeffff");
        assert_eq!(kv.admit("m", b"ccccdddd").cached_tokens, 2);
        assert_eq!(kv.admit("m", b"aaaabbbb").cached_tokens, 0);
        // Everything is pinned now: nothing more can be cached.
        let d = kv.admit("m", b"gggg");
        assert!(d.pinned.is_empty());
        kv.release(&c.pinned);
    }
}
