//! vLLM's admission and preemption (`--kv-admission vllm`): a request runs only while the KV
//! cache holds its blocks.
//!
//! Followed from vLLM v1's scheduler (read at vllm-project/vllm 00024d314514, `vllm/v1/core/
//! sched/scheduler.py`, `Scheduler.schedule` and `Scheduler._preempt_request`; and
//! `vllm/v1/core/kv_cache_manager.py` at 003df2961dd8, `KVCacheManager.allocate_slots`,
//! `get_computed_blocks` and `free`), with the default FCFS policy:
//!
//! - **Admission.** Waiting requests start in FIFO order. The queue's head starts only when a
//!   running slot is free (`len(running) < max_num_seqs`) and the blocks of all its tokens fit
//!   in the free pool: the blocks it lacks, less those a running request already holds, must
//!   not exceed the free blocks, empty or cached and evictable ([`KvCache::allocate`], as
//!   `allocate_slots` returns `None`). When the head does not fit nothing behind it starts
//!   (`schedule` breaks out of its waiting loop).
//! - **Growth.** A running request takes a new block when its tokens (the prompt, then the
//!   answer's as they are computed) pass its last block; a block is hashed and cached when its
//!   tokens fill it.
//! - **Preemption by recompute.** When that block is not free, the request last in the running
//!   list (the most recently started or resumed: `self.running.pop()`) is preempted: its blocks
//!   freed (cached ones stay cached, evictable, the last freed first), it goes back to the front
//!   of the waiting queue (`waiting.prepend_request`) and `vllm:num_preemptions_total` counts
//!   it; this repeats until the block fits or the request preempted is the one growing. A
//!   preempted request resumes as a new one would, recomputing its prompt and the answer so far
//!   less what the prefix cache still holds, then decodes on; its first admission's cached
//!   tokens are the ones reported (`num_cached_tokens` is set once), and its resumptions are
//!   not prefix-cache queries (`PrefixCacheStats.record` keeps preempted requests apart).
//!
//! Not modelled: chunked prefill and the token budget (`max_num_batched_tokens`: here a prompt
//! is admitted whole), the watermark and `full_sequence_must_fit` gates of newer releases,
//! speculative lookahead, the priority policy, and vLLM's rule that all of a prompt's blocks
//! hitting still recomputes the last one. vLLM admits waiting requests only in a step with no
//! preemption; here they are considered after every finish, arrival and preemption (at most
//! one step earlier). A request whose prompt alone needs more blocks than the cache has is refused
//! ([`Scheduler::submit`]), as vLLM refuses one longer than its KV capacity at start-up; a
//! request's blocks are capped at the capacity, so one running alone always fits.
//!
//! This module is the state machine, with no clock: the engine ([`crate::engine`]) calls it
//! under its lock and sleeps the latency model between calls; each request's [`Shared`] tells
//! its task when it starts and when it is preempted.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::kv_cache::{Admission, KvCache, PromptBlocks};

/// How a request is admitted to the KV cache (`--kv-admission`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KvAdmission {
    /// Only `--max-num-seqs` limits running requests; a prompt's blocks that do not fit are not
    /// cached, and a running request is never preempted.
    #[default]
    Slots,
    /// vLLM's scheduler: admission counts running requests' blocks, preemption by recompute.
    Vllm,
}

/// Why the waiting queue's head has not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCause {
    /// Every running slot (`--max-num-seqs`) is taken.
    MaxNumSeqs,
    /// Its blocks do not fit in the free and evictable blocks.
    KvCache,
}

impl WaitCause {
    pub const ALL: [WaitCause; 2] = [WaitCause::MaxNumSeqs, WaitCause::KvCache];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitCause::MaxNumSeqs => "max_num_seqs",
            WaitCause::KvCache => "kv_cache",
        }
    }
}

/// A request's number in the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqId(u64);

/// What a request's task reads without the scheduler's lock.
#[derive(Debug, Default)]
pub struct Shared {
    /// Woken when the request starts (or resumes) and when it is preempted.
    pub wake: Notify,
    running: AtomicBool,
    preemptions: AtomicU32,
    /// Tokens found in the prefix cache when it last started.
    cached_tokens: AtomicUsize,
}

impl Shared {
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Times the request has been preempted.
    pub fn preemptions(&self) -> u32 {
        self.preemptions.load(Ordering::Acquire)
    }

    /// Tokens the prefix cache held when the request last started.
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Req {
    /// The blocks its tokens fill: the prompt's, then the prompt's and the answer's.
    blocks: PromptBlocks,
    /// Tokens its KV must hold now.
    tokens: usize,
    held: Admission,
    shared: Arc<Shared>,
    /// Causes it has been counted waiting for ([`WaitCause`] order).
    waited: [bool; 2],
}

/// A prompt that needs more blocks than the cache has: it could never start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    pub blocks: usize,
    pub capacity: usize,
}

/// A request that started in a [`Scheduler::schedule`] pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub id: ReqId,
    /// Its tokens found in the prefix cache.
    pub cached_tokens: usize,
    /// Resumed after a preemption (not counted as a prefix-cache query).
    pub resumed: bool,
}

/// What a scheduling pass did, for the engine's metrics.
#[derive(Debug, Default)]
pub struct Pass {
    pub started: Vec<Started>,
    pub preempted: u64,
    /// Requests newly counted waiting at the queue's head, by cause ([`WaitCause`] order).
    pub waits: [u64; 2],
}

/// The waiting queue and running list of one engine.
#[derive(Debug)]
pub struct Scheduler {
    max_num_seqs: usize,
    waiting: VecDeque<ReqId>,
    /// In start order: the last is preempted first.
    running: Vec<ReqId>,
    reqs: HashMap<ReqId, Req>,
    next: u64,
    /// What keeps the queue's head waiting, after the last pass.
    blocked: Option<WaitCause>,
}

impl Scheduler {
    pub fn new(max_num_seqs: usize) -> Scheduler {
        Scheduler {
            max_num_seqs: max_num_seqs.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            reqs: HashMap::new(),
            next: 0,
            blocked: None,
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// What keeps the waiting requests waiting (`None` when none waits).
    pub fn blocked(&self) -> Option<WaitCause> {
        if self.waiting.is_empty() {
            None
        } else {
            self.blocked
        }
    }

    /// Queues a prompt cut into `blocks` and runs a pass; refused when its blocks exceed the
    /// cache's capacity.
    pub fn submit(
        &mut self,
        kv: &mut KvCache,
        blocks: PromptBlocks,
    ) -> Result<(ReqId, Arc<Shared>, Pass), TooLarge> {
        let need = blocks.tokens.div_ceil(kv.block_tokens());
        if need > kv.capacity() {
            return Err(TooLarge {
                blocks: need,
                capacity: kv.capacity(),
            });
        }
        let id = ReqId(self.next);
        self.next += 1;
        let shared = Arc::new(Shared::default());
        self.reqs.insert(
            id,
            Req {
                tokens: blocks.tokens,
                held: Admission {
                    prompt_tokens: blocks.tokens,
                    cached_tokens: 0,
                    pinned: Vec::new(),
                    tail: 0,
                },
                blocks,
                shared: shared.clone(),
                waited: [false; 2],
            },
        );
        self.waiting.push_back(id);
        let pass = self.schedule(kv);
        Ok((id, shared, pass))
    }

    /// Starts waiting requests, FIFO, while a slot is free and the head's blocks fit
    /// (`Scheduler.schedule`'s waiting loop).
    pub fn schedule(&mut self, kv: &mut KvCache) -> Pass {
        let mut pass = Pass::default();
        self.schedule_into(kv, &mut pass);
        pass
    }

    fn schedule_into(&mut self, kv: &mut KvCache, pass: &mut Pass) {
        self.blocked = None;
        while let Some(&id) = self.waiting.front() {
            let req = self.reqs.get_mut(&id).expect("a waiting request is known");
            let cause = if self.running.len() >= self.max_num_seqs {
                Some(WaitCause::MaxNumSeqs)
            } else {
                let fits =
                    kv.blocks_to_allocate(&req.blocks, req.tokens, &req.held) <= kv.free_blocks();
                let full = (req.tokens / kv.block_tokens()).min(req.blocks.hashes.len());
                let hits = if fits {
                    kv.hits(&req.blocks.hashes[..full])
                } else {
                    0
                };
                if fits && kv.allocate(&req.blocks, req.tokens, &mut req.held) {
                    let cached_tokens = hits * kv.block_tokens();
                    let resumed = req.shared.preemptions() > 0;
                    req.shared
                        .cached_tokens
                        .store(cached_tokens, Ordering::Release);
                    req.shared.running.store(true, Ordering::Release);
                    req.shared.wake.notify_one();
                    self.waiting.pop_front();
                    self.running.push(id);
                    pass.started.push(Started {
                        id,
                        cached_tokens,
                        resumed,
                    });
                    None
                } else {
                    Some(WaitCause::KvCache)
                }
            };
            if let Some(cause) = cause {
                let i = cause as usize;
                if !req.waited[i] {
                    req.waited[i] = true;
                    pass.waits[i] += 1;
                }
                self.blocked = Some(cause);
                break;
            }
        }
    }

    /// The answer is known: `blocks` (the prompt's then the answer's) replace the prompt's, so
    /// the blocks its tokens fill from now on are hashed as the answer's.
    pub fn set_blocks(&mut self, id: ReqId, blocks: PromptBlocks) {
        if let Some(req) = self.reqs.get_mut(&id) {
            req.blocks = blocks;
        }
    }

    /// A running request's KV must hold `tokens` tokens: takes the blocks it lacks, preempting
    /// the last running requests until they fit. The pass says how many were preempted;
    /// `false` when the request itself was (it waits again at the queue's front). After a
    /// preemption the waiting requests are considered (growth alone frees nothing).
    pub fn grow(&mut self, kv: &mut KvCache, id: ReqId, tokens: usize) -> (bool, Pass) {
        let mut pass = Pass::default();
        let grown = self.grow_into(kv, id, tokens, &mut pass);
        if pass.preempted > 0 {
            self.schedule_into(kv, &mut pass);
        }
        (grown, pass)
    }

    fn grow_into(&mut self, kv: &mut KvCache, id: ReqId, tokens: usize, pass: &mut Pass) -> bool {
        loop {
            let Some(req) = self.reqs.get_mut(&id) else {
                return false;
            };
            if !req.shared.running() {
                return false;
            }
            req.tokens = req.tokens.max(tokens);
            if kv.allocate(&req.blocks, req.tokens, &mut req.held) {
                return true;
            }
            let victim = self.running.pop().expect("the growing request runs");
            self.preempt(kv, victim);
            pass.preempted += 1;
            if victim == id {
                return false;
            }
        }
    }

    /// `Scheduler._preempt_request`: frees the request's blocks and queues it first.
    fn preempt(&mut self, kv: &mut KvCache, id: ReqId) {
        let req = self.reqs.get_mut(&id).expect("a running request is known");
        kv.free(&mut req.held);
        req.shared.running.store(false, Ordering::Release);
        req.shared.preemptions.fetch_add(1, Ordering::AcqRel);
        req.shared.wake.notify_one();
        self.waiting.push_front(id);
    }

    /// The request ended (answered, or its client left): its blocks are freed and waiting
    /// requests considered.
    pub fn finish(&mut self, kv: &mut KvCache, id: ReqId) -> Pass {
        if let Some(mut req) = self.reqs.remove(&id) {
            if let Some(i) = self.running.iter().position(|r| *r == id) {
                self.running.remove(i);
            } else if let Some(i) = self.waiting.iter().position(|r| *r == id) {
                self.waiting.remove(i);
            }
            kv.free(&mut req.held);
        }
        self.schedule(kv)
    }
}

#[cfg(test)]
mod tests;
