//! The affinity mode's match on engine truth: a candidate whose [`EngineView`] is live and a
//! request whose head is known in the engines' tokens ([`EngineTokens`]) is matched by what the
//! engine holds, counted in its tokens; every other candidate keeps the prefix index's estimate.
//!
//! The pick compares candidates in blocks of the rendered prompt, so an engine match converts
//! to the share of the prompt it covers: `tokens matched / head tokens x head bytes / prompt
//! bytes x prompt blocks`, rounded down. The request's token chain is hashed once per engine
//! block size among the candidates (one, in a pool of one engine). Its last hash (the head's
//! last full block) is what a hold for the pod awaits from the engine
//! ([`EngineView::await_block`]).

use super::candidate::Candidate;
use super::{EngineTokens, MatchSource};
use crate::engine_view::{EngineView, token_chain};

/// One candidate's engine match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineMatched {
    /// Engine tokens of the prompt the pod holds.
    pub tokens: usize,
    /// The same, in blocks of the rendered prompt (what the pick compares).
    pub blocks: usize,
    /// The token-chain hash of the head's last full block at the engine's block size: a hold
    /// for the pod ends when the engine stores it. `None`: no full block (or no block size yet).
    pub last_block: Option<u64>,
}

/// Per candidate, its engine match, or `None` where the estimate applies (no live view, or no
/// engine tokens for this request). Empty when no candidate is matched by its engine.
pub fn matches<C: Candidate>(
    candidates: &[C],
    tokens: Option<EngineTokens<'_>>,
    prompt_bytes: usize,
    prompt_blocks: usize,
) -> Vec<Option<EngineMatched>> {
    let Some(tokens) = tokens.filter(|t| !t.tokens.is_empty() && prompt_bytes > 0) else {
        return Vec::new();
    };
    fn live<C: Candidate>(c: &C) -> Option<&EngineView> {
        c.engine_view().filter(|v| v.is_live())
    }
    if !candidates.iter().any(|c| live(c).is_some()) {
        return Vec::new();
    }
    // Share of the prompt's blocks per engine token.
    let head_share = tokens.prompt_bytes.min(prompt_bytes) as f64 / prompt_bytes as f64;
    let blocks_per_token = head_share * prompt_blocks as f64 / tokens.tokens.len() as f64;
    let views: Vec<Option<(&EngineView, usize)>> = candidates
        .iter()
        .map(|c| live(c).map(|v| (v, v.block_size())))
        .collect();
    // A live view that has stored nothing since it went live holds nothing and does not know
    // its block size yet: a hold for it awaits its first store at the pool's (another live
    // view's, one engine kind per pool being the usual case; where the pod's differs, the hold
    // ends with its request).
    let pool = views.iter().flatten().map(|&(_, bs)| bs).find(|&bs| bs > 0);
    let mut chains = Chains::default();
    views
        .into_iter()
        .map(|view| {
            let (view, block_size) = view?;
            if block_size == 0 {
                return Some(EngineMatched {
                    tokens: 0,
                    blocks: 0,
                    last_block: pool.and_then(|bs| chains.of(tokens.tokens, bs).last().copied()),
                });
            }
            let chain = chains.of(tokens.tokens, block_size);
            let held = view.longest_match(chain) * block_size;
            let blocks = ((held as f64 * blocks_per_token) as usize).min(prompt_blocks);
            Some(EngineMatched {
                tokens: held,
                blocks,
                last_block: chain.last().copied(),
            })
        })
        .collect()
}

/// The request's token chain per block size, hashed once each.
#[derive(Default)]
struct Chains(Vec<(usize, Vec<u64>)>);

impl Chains {
    fn of(&mut self, tokens: &[u32], block_size: usize) -> &[u64] {
        let at = match self.0.iter().position(|(bs, _)| *bs == block_size) {
            Some(at) => at,
            None => {
                self.0.push((block_size, token_chain(tokens, block_size)));
                self.0.len() - 1
            }
        };
        &self.0[at].1
    }
}

/// Where candidate `i`'s match came from, given [`matches`]'s result.
pub fn source(engine: &[Option<EngineMatched>], i: usize) -> MatchSource {
    match engine.get(i) {
        Some(Some(_)) => MatchSource::Engine,
        _ => MatchSource::Estimate,
    }
}
