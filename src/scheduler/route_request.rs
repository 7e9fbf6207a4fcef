//! What the scheduler needs of a request ([`RouteRequest`]): the model, the rendered prompt
//! (or why there is none), its salt, the session's pod, and what a pass before this one or the
//! platform already knows of it (hashes, engine tokens, kvcache-aware's owners).

use super::Unscored;
use super::kvcache_aware::KvBlockOwners;
use crate::hashing::{BlockHash, CacheSalt};
use crate::prefix_index::PodSlot;

/// What the scheduler needs of a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// The rendered prompt, or why there is none.
    pub prompt: Result<&'a str, Unscored>,
    /// The request's `cache_salt`: it seeds the prompt's chain (the hashes are salted, the
    /// model's key in the index is not).
    pub salt: Option<&'a CacheSalt>,
    /// Session affinity: the pod that served the session's last request. It is the pick while
    /// it has headroom (it passed the filters, or, in the affinity mode, is not saturated).
    pub session_pod: Option<PodSlot>,
    /// The prompt's block hashes, when a pass before this one computed them (PD: the decode
    /// pass's, reused by each prefill pass); `None`: hashed here.
    pub hashes: Option<&'a [BlockHash]>,
    /// The prompt's head in the engines' own tokens, when known: the affinity mode matches pods
    /// with a live [`EngineView`](crate::engine_view::EngineView) by it.
    pub engine_tokens: Option<EngineTokens<'a>>,
    /// kvcache-aware: who holds the prompt's blocks, as the platform looked them up before the
    /// decision; `None`: not looked up (the plugin scores nothing).
    pub kv_blocks: Option<&'a KvBlockOwners>,
    /// The request headers an `EndpointPickerConfig` asked for (lowercase names; its
    /// session-affinity scorers' headers), empty otherwise.
    pub headers: &'a [(String, String)],
}

/// Engine token ids of the first `prompt_bytes` bytes of the rendered prompt (its head: the
/// messages before the last one, all of it, or a cut inside the last message).
#[derive(Debug, Clone, Copy)]
pub struct EngineTokens<'a> {
    pub tokens: &'a [u32],
    pub prompt_bytes: usize,
    /// The first of `tokens` that end at a message boundary (all of them, but for a cut: the
    /// messages before the last one, as far as known; 0 when none is).
    pub head_tokens: usize,
}

impl<'a> EngineTokens<'a> {
    /// Tokens that end at a message boundary, all of them.
    pub fn message_head(tokens: &'a [u32], prompt_bytes: usize) -> EngineTokens<'a> {
        EngineTokens {
            tokens,
            prompt_bytes,
            head_tokens: tokens.len(),
        }
    }
}
