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
//! not cached. Under `--kv-admission vllm` ([`crate::scheduler`]) the scheduler admits a request
//! only when all its blocks fit ([`KvCache::allocate`]: full blocks hashed, the partial last one
//! held unhashed until filled) and preempts to grow one, as vLLM does. Release unpins; a block with no users stays cached until
//! evicted. `usage` = pinned blocks / capacity (`vllm:kv_cache_usage_perc`). A request's
//! answer continues its chain ([`KvCache::admit_output`]): the prompt's tokens then the
//! answer's, full blocks pinned with the request and cached after it, as in vLLM.
//!
//! With events on ([`KvCache::record_events`]) the cache logs, in order, what an observer of a
//! vLLM engine would see ([`KvEvent`]): each run of newly cached consecutive blocks of a prompt
//! (its parent is the block before the run), each eviction, each reset. With prefix caching off
//! ([`KvCache::without_prefix_caching`]) a request's blocks are its own: never found by another
//! request, dropped when it ends, and never reported (as in vLLM, whose events come from the
//! prefix cache).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use xxhash_rust::xxh64::xxh64;

use crate::tokenizer::{self, SimTokenizer, Tokens};

/// The chain hash of one cached block of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvBlock(pub u64);

#[derive(Debug, Clone, Copy)]
struct Block {
    pins: u32,
    /// Position in the free list when unpinned.
    freed_at: u64,
}

/// A change to the cache's contents, in vLLM's terms (`BlockStored`, `BlockRemoved`,
/// `AllBlocksCleared`; [`crate::kv_events`] puts them on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive blocks of one prompt newly cached; `parent` is the block before the first.
    Stored {
        blocks: Vec<KvBlock>,
        parent: Option<KvBlock>,
        /// The blocks' token ids ([`tokenizer::token_id`]), `block_tokens` per block.
        token_ids: Vec<u32>,
    },
    /// One block evicted.
    Removed(KvBlock),
    /// Everything dropped ([`KvCache::reset`]).
    Cleared,
}

/// A prompt cut into blocks ([`KvCache::prompt_blocks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptBlocks {
    /// The chain hashes of the full blocks.
    pub hashes: Vec<KvBlock>,
    /// The prompt's token count (the last partial block included).
    pub tokens: usize,
    /// The token ids of the full blocks, when the cache records events (else empty).
    pub token_ids: Vec<u32>,
}

/// What admission found and pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Blocks pinned for the request (release them when it ends).
    pub pinned: Vec<KvBlock>,
    /// Blocks held after `pinned` that are not full yet, so not hashed (vLLM admission only,
    /// [`KvCache::allocate`]; 0 otherwise).
    pub tail: usize,
}

#[derive(Debug)]
pub struct KvCache {
    block_tokens: usize,
    capacity: usize,
    blocks: HashMap<KvBlock, Block>,
    free: BTreeMap<u64, KvBlock>,
    clock: u64,
    /// Blocks in use by running requests: hashed ones pinned, plus `unhashed`.
    pinned: usize,
    /// Blocks held by running requests but not hashed (their tokens do not fill them yet, or
    /// prefix caching is off); vLLM admission only ([`KvCache::allocate`]).
    unhashed: usize,
    /// `None` unless events are recorded.
    events: Option<Vec<KvEvent>>,
    prefix_caching: bool,
    /// The next id of a block private to one request (prefix caching off).
    next_private: u64,
    tokenizer: SimTokenizer,
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
            unhashed: 0,
            events: None,
            prefix_caching: true,
            next_private: 0,
            tokenizer: SimTokenizer::Builtin,
        }
    }

    /// Tokenizes with `tokenizer` instead of the built-in one.
    pub fn with_tokenizer(mut self, tokenizer: SimTokenizer) -> KvCache {
        self.tokenizer = tokenizer;
        self
    }

    /// Starts logging [`KvEvent`]s (drain them with [`KvCache::take_events`]).
    pub fn record_events(mut self) -> KvCache {
        self.events = Some(Vec::new());
        self
    }

    /// vLLM's `--no-enable-prefix-caching`: nothing is ever found, a request's blocks are freed
    /// when it ends, and no event is logged.
    pub fn without_prefix_caching(mut self) -> KvCache {
        self.prefix_caching = false;
        self
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// The events logged since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Drops every cached block (vLLM's `reset_prefix_cache`), unless a running request pins
    /// one: then nothing changes and it answers `false`, as vLLM does.
    pub fn reset(&mut self) -> bool {
        if self.pinned > 0 {
            return false;
        }
        self.blocks.clear();
        self.free.clear();
        if let Some(events) = &mut self.events {
            events.push(KvEvent::Cleared);
        }
        true
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
        let b = self.cut(model, prompt, false);
        (b.hashes, b.tokens)
    }

    /// A prompt's blocks, with their token ids when the cache records events.
    pub fn prompt_blocks(&self, model: &str, prompt: &[u8]) -> PromptBlocks {
        self.cut(model, prompt, self.events.is_some())
    }

    fn cut(&self, model: &str, prompt: &[u8], with_ids: bool) -> PromptBlocks {
        self.cut_tokens(model, prompt, &self.tokenizer.tokens(prompt), with_ids)
    }

    /// The blocks of `text` cut into `tokens`.
    fn cut_tokens(
        &self,
        model: &str,
        text: &[u8],
        tokens: &Tokens,
        with_ids: bool,
    ) -> PromptBlocks {
        match tokens {
            Tokens::Spans(spans) => self.cut_spans(model, text, spans, with_ids),
            Tokens::Ids(ids) => self.cut_ids(model, ids, with_ids),
        }
    }

    /// The blocks of `text` cut into `tokens` (byte ranges covering it).
    fn cut_spans(
        &self,
        model: &str,
        text: &[u8],
        tokens: &[Range<usize>],
        with_ids: bool,
    ) -> PromptBlocks {
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
                    buf.extend_from_slice(&text[t.clone()]);
                }
                prev = xxh64(&buf, 0);
                KvBlock(prev)
            })
            .collect::<Vec<_>>();
        let token_ids = if with_ids {
            tokens[..hashes.len() * self.block_tokens]
                .iter()
                .map(|t| tokenizer::token_id(&text[t.clone()]))
                .collect()
        } else {
            Vec::new()
        };
        PromptBlocks {
            hashes,
            tokens: tokens.len(),
            token_ids,
        }
    }

    /// The blocks of a `tokenizer.json`'s ids: a block hashes its ids, chained.
    fn cut_ids(&self, model: &str, ids: &[u32], with_ids: bool) -> PromptBlocks {
        let mut prev = xxh64(model.as_bytes(), 0x5EED);
        let mut buf = Vec::new();
        let hashes = ids
            .chunks_exact(self.block_tokens)
            .map(|block| {
                buf.clear();
                buf.extend_from_slice(&prev.to_le_bytes());
                for id in block {
                    buf.extend_from_slice(&id.to_le_bytes());
                }
                prev = xxh64(&buf, 0);
                KvBlock(prev)
            })
            .collect::<Vec<_>>();
        let token_ids = if with_ids {
            ids[..hashes.len() * self.block_tokens].to_vec()
        } else {
            Vec::new()
        };
        PromptBlocks {
            hashes,
            tokens: ids.len(),
            token_ids,
        }
    }

    /// Caches the blocks a request's output fills: the prompt's tokens then the output's
    /// (each tokenized on its own, as an engine appends generated tokens), chained after the
    /// prompt's blocks; they are pinned with the request's (added to `admission.pinned`). Nothing
    /// when the prompt itself did not fit.
    pub fn admit_output(
        &mut self,
        model: &str,
        prompt: &[u8],
        output: &[u8],
        admission: &mut Admission,
    ) {
        let all = self.answer_blocks(model, prompt, output);
        let held = admission.pinned.len();
        if held < admission.prompt_tokens / self.block_tokens || held >= all.hashes.len() {
            return;
        }
        if !self.prefix_caching {
            let extra = self.admit_private(&PromptBlocks {
                hashes: all.hashes[held..].to_vec(),
                tokens: 0,
                token_ids: Vec::new(),
            });
            admission.pinned.extend(extra.pinned);
            return;
        }
        let mut run = None;
        for (i, &h) in all.hashes.iter().enumerate().skip(held) {
            match self.pin(h) {
                Pin::Found => self.report_stored(&all, &mut run, i),
                Pin::New => {
                    run.get_or_insert(i);
                }
                Pin::Full => {
                    self.report_stored(&all, &mut run, i);
                    return;
                }
            }
            admission.pinned.push(h);
        }
        self.report_stored(&all, &mut run, all.hashes.len());
    }

    /// The blocks of `prompt` followed by `output`, each tokenized on its own (as an engine
    /// appends generated tokens), with token ids when the cache records events.
    pub fn answer_blocks(&self, model: &str, prompt: &[u8], output: &[u8]) -> PromptBlocks {
        let mut text = Vec::with_capacity(prompt.len() + output.len());
        text.extend_from_slice(prompt);
        text.extend_from_slice(output);
        let mut tokens = self.tokenizer.tokens(prompt);
        tokens.append(self.tokenizer.tokens(output), prompt.len());
        self.cut_tokens(model, &text, &tokens, self.events.is_some())
    }

    /// Looks up and pins a prompt's blocks.
    pub fn admit(&mut self, model: &str, prompt: &[u8]) -> Admission {
        let blocks = self.prompt_blocks(model, prompt);
        self.admit_prompt(&blocks)
    }

    /// [`KvCache::admit`] for a prompt already cut into blocks ([`KvCache::block_hashes`]);
    /// events, if recorded, carry no token ids.
    pub fn admit_blocks(&mut self, hashes: &[KvBlock], prompt_tokens: usize) -> Admission {
        self.admit_prompt(&PromptBlocks {
            hashes: hashes.to_vec(),
            tokens: prompt_tokens,
            token_ids: Vec::new(),
        })
    }

    /// [`KvCache::admit`] for a prompt already cut ([`KvCache::prompt_blocks`]).
    pub fn admit_prompt(&mut self, prompt: &PromptBlocks) -> Admission {
        if !self.prefix_caching {
            return self.admit_private(prompt);
        }
        let hashes = &prompt.hashes;
        let hit = hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        let mut pinned = Vec::with_capacity(hashes.len());
        // The run of newly cached blocks not yet reported: its first index.
        let mut run: Option<usize> = None;
        for (i, &h) in hashes.iter().enumerate() {
            match self.pin(h) {
                Pin::Found => self.report_stored(prompt, &mut run, i),
                Pin::New => {
                    run.get_or_insert(i);
                }
                Pin::Full => break,
            }
            pinned.push(h);
        }
        self.report_stored(prompt, &mut run, pinned.len());
        Admission {
            prompt_tokens: prompt.tokens,
            cached_tokens: hit * self.block_tokens,
            pinned,
            tail: 0,
        }
    }

    /// Logs `BlockStored` for the run of new blocks `start..end`, if any.
    fn report_stored(&mut self, prompt: &PromptBlocks, run: &mut Option<usize>, end: usize) {
        let (Some(start), Some(events)) = (run.take(), self.events.as_mut()) else {
            return;
        };
        let ids = &prompt.token_ids;
        let bt = self.block_tokens;
        events.push(KvEvent::Stored {
            blocks: prompt.hashes[start..end].to_vec(),
            parent: start.checked_sub(1).map(|p| prompt.hashes[p]),
            token_ids: ids.get(start * bt..end * bt).unwrap_or_default().to_vec(),
        });
    }

    /// Prefix caching off: fresh blocks only this request uses, as many as the cache has free.
    fn admit_private(&mut self, prompt: &PromptBlocks) -> Admission {
        let mut pinned = Vec::with_capacity(prompt.hashes.len());
        while pinned.len() < prompt.hashes.len()
            && self.blocks.len() + self.unhashed < self.capacity
        {
            self.next_private += 1;
            let h = KvBlock(self.next_private);
            self.blocks.insert(
                h,
                Block {
                    pins: 1,
                    freed_at: 0,
                },
            );
            self.pinned += 1;
            pinned.push(h);
        }
        Admission {
            prompt_tokens: prompt.tokens,
            cached_tokens: 0,
            pinned,
            tail: 0,
        }
    }

    /// Unpins blocks of a finished request; they stay cached until evicted.
    pub fn release(&mut self, pinned: &[KvBlock]) {
        for h in pinned {
            if let Some(b) = self.blocks.get_mut(h) {
                b.pins -= 1;
                if b.pins == 0 && !self.prefix_caching {
                    self.blocks.remove(h);
                    self.pinned -= 1;
                } else if b.pins == 0 {
                    self.clock += 1;
                    b.freed_at = self.clock;
                    self.free.insert(self.clock, *h);
                    self.pinned -= 1;
                }
            }
        }
    }

    fn pin(&mut self, h: KvBlock) -> Pin {
        if let Some(b) = self.blocks.get_mut(&h) {
            if b.pins == 0 {
                self.free.remove(&b.freed_at);
                self.pinned += 1;
            }
            b.pins += 1;
            return Pin::Found;
        }
        if !self.make_room() {
            return Pin::Full;
        }
        self.blocks.insert(
            h,
            Block {
                pins: 1,
                freed_at: 0,
            },
        );
        self.pinned += 1;
        Pin::New
    }
}

impl KvCache {
    /// Frees a slot for a new block when the cache is full, evicting the least recently freed
    /// block; `false` when every block is in use.
    fn make_room(&mut self) -> bool {
        if self.blocks.len() + self.unhashed < self.capacity {
            return true;
        }
        let Some((_, victim)) = self.free.pop_first() else {
            return false;
        };
        self.blocks.remove(&victim);
        if let Some(events) = &mut self.events {
            events.push(KvEvent::Removed(victim));
        }
        true
    }

    /// Blocks not used by a running request: empty or cached and evictable (vLLM's
    /// `BlockPool.get_num_free_blocks`, whose free queue holds both).
    pub fn free_blocks(&self) -> usize {
        self.capacity.saturating_sub(self.pinned)
    }

    /// Leading blocks of `hashes` in the cache (0 with prefix caching off).
    pub fn hits(&self, hashes: &[KvBlock]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
    }

    /// The free blocks `held` must take to cover `tokens` tokens of `blocks` (vLLM's
    /// `get_num_blocks_to_allocate`): every block it lacks, except those a running request
    /// already holds (an evictable cached block leaves the free pool when it is reused, so it
    /// counts).
    pub fn blocks_to_allocate(
        &self,
        blocks: &PromptBlocks,
        tokens: usize,
        held: &Admission,
    ) -> usize {
        let target = tokens.div_ceil(self.block_tokens).min(self.capacity);
        let have = held.pinned.len() + held.tail;
        if target <= have {
            return 0;
        }
        let full = (tokens / self.block_tokens).min(blocks.hashes.len());
        let shared = if self.prefix_caching && full > held.pinned.len() {
            blocks.hashes[held.pinned.len()..full]
                .iter()
                .filter(|h| self.blocks.get(h).is_some_and(|b| b.pins > 0))
                .count()
        } else {
            0
        };
        (target - have).saturating_sub(shared)
    }

    /// vLLM admission: grows `held` to cover `tokens` tokens of `blocks`, all or nothing
    /// (vLLM's `KVCacheManager.allocate_slots`, `None` when the free pool is short). Full
    /// blocks are hashed and cached (found ones shared), the last partial one is held unhashed
    /// until its tokens fill it; with prefix caching off every block is private and unhashed.
    /// At most `capacity` blocks: a request alone always fits. `false` (nothing changed) when
    /// the free and evictable blocks are too few.
    pub fn allocate(&mut self, blocks: &PromptBlocks, tokens: usize, held: &mut Admission) -> bool {
        if self.blocks_to_allocate(blocks, tokens, held) > self.free_blocks() {
            return false;
        }
        let target = tokens.div_ceil(self.block_tokens).min(self.capacity);
        let full = if self.prefix_caching {
            (tokens / self.block_tokens)
                .min(blocks.hashes.len())
                .min(target)
        } else {
            0
        };
        let mut run = None;
        for i in held.pinned.len()..full {
            if held.tail > 0 {
                // The block now full was held unhashed: it becomes this hash.
                held.tail -= 1;
                self.unhashed -= 1;
                self.pinned -= 1;
            }
            match self.pin(blocks.hashes[i]) {
                Pin::Found => self.report_stored(blocks, &mut run, i),
                Pin::New => {
                    run.get_or_insert(i);
                }
                Pin::Full => unreachable!("room was checked"),
            }
            held.pinned.push(blocks.hashes[i]);
        }
        let end = held.pinned.len();
        self.report_stored(blocks, &mut run, end);
        while held.pinned.len() + held.tail < target {
            let room = self.make_room();
            debug_assert!(room, "room was checked");
            self.unhashed += 1;
            self.pinned += 1;
            held.tail += 1;
        }
        true
    }

    /// vLLM admission: frees a request's blocks, the last first (vLLM's `KVCacheManager.free`,
    /// so a prompt's tail is evicted before its shared head); unhashed ones are dropped.
    pub fn free(&mut self, held: &mut Admission) {
        self.unhashed -= held.tail;
        self.pinned -= held.tail;
        held.tail = 0;
        let pinned = std::mem::take(&mut held.pinned);
        for h in pinned.iter().rev() {
            self.release(std::slice::from_ref(h));
        }
    }
}

/// What pinning one block did.
enum Pin {
    Found,
    New,
    /// No block free: not cached.
    Full,
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

    #[test]
    fn events_report_new_runs_evictions_and_resets_in_order() {
        let mut kv = KvCache::new(1, 4).record_events(); // 1-token blocks; a word is a token
        let ids = |text: &str| tokenizer::token_ids(text.as_bytes());
        let a = kv.admit("m", b"aaaa bbbb");
        let (ha, _) = kv.block_hashes("m", b"aaaa bbbb");
        assert_eq!(
            kv.take_events(),
            [KvEvent::Stored {
                blocks: ha.clone(),
                parent: None,
                token_ids: ids("aaaa bbbb"),
            }]
        );
        // A prompt that extends it stores only its new block, chained to the last shared one.
        let b = kv.admit("m", b"aaaa bbbb cccc");
        let (hb, _) = kv.block_hashes("m", b"aaaa bbbb cccc");
        assert_eq!(b.cached_tokens, 2);
        assert_eq!(
            kv.take_events(),
            [KvEvent::Stored {
                blocks: vec![hb[2]],
                parent: Some(ha[1]),
                token_ids: ids(" cccc"),
            }]
        );
        assert!(!kv.reset(), "blocks are pinned");
        assert!(kv.take_events().is_empty());
        kv.release(&a.pinned);
        kv.release(&b.pinned);
        // Full (3 of 4 used): two new blocks evict the least recently freed one first.
        let c = kv.admit("m", b"dddd eeee");
        let events = kv.take_events();
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(matches!(events[0], KvEvent::Removed(_)));
        assert!(
            matches!(&events[1], KvEvent::Stored { blocks, parent: None, .. } if blocks.len() == 2)
        );
        kv.release(&c.pinned);
        assert!(kv.reset());
        assert_eq!(kv.take_events(), [KvEvent::Cleared]);
        assert_eq!(kv.cached_blocks(), 0);
        assert_eq!(kv.admit("m", b"dddd eeee").cached_tokens, 0);
    }

    #[test]
    fn without_prefix_caching_nothing_is_shared_kept_or_reported() {
        let mut kv = KvCache::new(1, 4).record_events().without_prefix_caching();
        let a = kv.admit("m", b"aaaabbbb");
        let b = kv.admit("m", b"aaaabbbb");
        assert_eq!((a.cached_tokens, b.cached_tokens), (0, 0));
        assert_eq!((a.pinned.len(), b.pinned.len()), (2, 2));
        assert_eq!(kv.usage(), 1.0);
        kv.release(&a.pinned);
        kv.release(&b.pinned);
        assert_eq!((kv.usage(), kv.cached_blocks()), (0.0, 0));
        assert!(kv.take_events().is_empty());
    }

    #[test]
    fn an_answer_fills_blocks_after_its_prompt_held_then_cached() {
        let mut kv = KvCache::new(2, 100).record_events();
        let mut a = kv.admit("m", b"aaaa bbbb cccc"); // 3 tokens: 1 full block
        assert_eq!(a.pinned.len(), 1);
        kv.take_events();
        // The prompt's last token and the answer's three fill two more blocks, chained.
        kv.admit_output("m", b"aaaa bbbb cccc", b" dddd eeee ffff", &mut a);
        assert_eq!(a.pinned.len(), 3);
        let events = kv.take_events();
        let [
            KvEvent::Stored {
                blocks,
                parent,
                token_ids,
            },
        ] = events.as_slice()
        else {
            panic!("{events:?}");
        };
        assert_eq!((blocks.len(), *parent), (2, Some(a.pinned[0])));
        assert_eq!(token_ids, &tokenizer::token_ids(b" cccc dddd eeee ffff"));
        kv.release(&a.pinned);
        assert_eq!(kv.usage(), 0.0);
        // A prompt that re-sends the answer hits all three blocks.
        let again = kv.admit("m", b"aaaa bbbb cccc dddd eeee ffff more");
        assert_eq!(again.cached_tokens, 6);
    }
}
