//! A vLLM-like prefix KV cache: token blocks hashed as a chain, pinned while a request runs,
//! evicted least-recently-freed first.
//!
//! The prompt (rendered exactly as the router renders it, so the model is honest about what is
//! shareable) is tokenized by [`crate::tokenizer`] (variable bytes per token, ~4 on English
//! text, so token blocks do not line up with the router's byte blocks) and cut into blocks of
//! `block_tokens` tokens; only full blocks are cached, as in vLLM. A block's hash chains its
//! parent's hash with its tokens (bytes and boundaries) and is seeded by the model name (the
//! simulator's own hash, not the router's). A request's cached tokens = the longest run of its
//! leading blocks already present. Admission pins every block of the prompt (allocating missing
//! ones, evicting free blocks LRU); when no free block is left the rest of the prompt is simply
//! not cached (vLLM would preempt). Release unpins; a block with no users stays cached until
//! evicted. `usage` = pinned blocks / capacity (`vllm:kv_cache_usage_perc`).

use std::collections::{BTreeMap, HashMap};

use xxhash_rust::xxh64::xxh64;

use crate::tokenizer;

/// The chain hash of one cached block of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvBlock(pub u64);

#[derive(Debug, Clone, Copy)]
struct Block {
    pins: u32,
    /// Position in the free list when unpinned.
    freed_at: u64,
}

/// What admission found and pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Blocks pinned for the request (release them when it ends).
    pub pinned: Vec<KvBlock>,
}

#[derive(Debug)]
pub struct KvCache {
    block_tokens: usize,
    capacity: usize,
    blocks: HashMap<KvBlock, Block>,
    free: BTreeMap<u64, KvBlock>,
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

    /// The chain hashes of a prompt's full blocks, and the prompt's token count.
    pub fn block_hashes(&self, model: &str, prompt: &[u8]) -> (Vec<KvBlock>, usize) {
        let tokens = tokenizer::tokenize(prompt);
        let mut prev = xxh64(model.as_bytes(), 0x5EED);
        let mut buf = Vec::new();
        let hashes = tokens
            .chunks_exact(self.block_tokens)
            .map(|block| {
                buf.clear();
                buf.extend_from_slice(&prev.to_le_bytes());
                for t in block {
                    // The length first: equal bytes cut into other tokens are another block.
                    buf.push((t.end - t.start) as u8);
                    buf.extend_from_slice(&prompt[t.clone()]);
                }
                prev = xxh64(&buf, 0);
                KvBlock(prev)
            })
            .collect();
        (hashes, tokens.len())
    }

    /// Looks up and pins a prompt's blocks.
    pub fn admit(&mut self, model: &str, prompt: &[u8]) -> Admission {
        let (hashes, prompt_tokens) = self.block_hashes(model, prompt);
        self.admit_blocks(&hashes, prompt_tokens)
    }

    /// [`KvCache::admit`] for a prompt already cut into blocks ([`KvCache::block_hashes`]).
    pub fn admit_blocks(&mut self, hashes: &[KvBlock], prompt_tokens: usize) -> Admission {
        let hit = hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        let mut pinned = Vec::with_capacity(hashes.len());
        for &h in hashes {
            if self.pin(h) {
                pinned.push(h);
            } else {
                break;
            }
        }
        Admission {
            prompt_tokens,
            cached_tokens: hit * self.block_tokens,
            pinned,
        }
    }

    /// Unpins blocks of a finished request; they stay cached until evicted.
    pub fn release(&mut self, pinned: &[KvBlock]) {
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

    fn pin(&mut self, h: KvBlock) -> bool {
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
        // One 266-byte word: 45 tokens of at most 6 bytes, 2 full 16-token blocks.
        let prompt = "x".repeat(266);
        let a = kv.admit("m", prompt.as_bytes());
        assert_eq!(a.cached_tokens, 0);
        assert_eq!(a.prompt_tokens, 45);
        assert_eq!(a.pinned.len(), 2);
        assert!(kv.usage() > 0.0);
        kv.release(&a.pinned);
        assert_eq!(kv.usage(), 0.0);
        let b = kv.admit("m", prompt.as_bytes());
        assert_eq!(b.cached_tokens, 32);
        // Another model shares nothing.
        assert_eq!(kv.admit("other", prompt.as_bytes()).cached_tokens, 0);
    }

    #[test]
    fn free_blocks_are_evicted_lru_and_pinned_ones_never() {
        let mut kv = KvCache::new(1, 4); // 1-token blocks, 4 of them; each word is 2 tokens
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
