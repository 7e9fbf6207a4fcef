//! The affinity mode's match on engine truth: a candidate whose [`EngineView`] is live and a
//! request whose head is known in the engines' tokens ([`EngineTokens`]) is matched by what the
//! engine holds, counted in its tokens; every other candidate keeps the prefix index's estimate.
//!
//! The pick compares candidates in blocks of the rendered prompt, so an engine match converts
//! to the share of the prompt it covers: `tokens matched / head tokens x head bytes / prompt
//! bytes x prompt blocks`, rounded down. The request's token chain is hashed once per engine
//! block size among the candidates (one, in a pool of one engine).

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
    let mut chains: Vec<(usize, Vec<u64>)> = Vec::with_capacity(1);
    candidates
        .iter()
        .map(|c| {
            let view = live(c)?;
            let block_size = view.block_size();
            if block_size == 0 {
                // Live, and nothing stored since it went live: it holds nothing.
                return Some(EngineMatched {
                    tokens: 0,
                    blocks: 0,
                });
            }
            let at = match chains.iter().position(|(bs, _)| *bs == block_size) {
                Some(at) => at,
                None => {
                    chains.push((block_size, token_chain(tokens.tokens, block_size)));
                    chains.len() - 1
                }
            };
            let held = view.longest_match(&chains[at].1) * block_size;
            let blocks = ((held as f64 * blocks_per_token) as usize).min(prompt_blocks);
            Some(EngineMatched {
                tokens: held,
                blocks,
            })
        })
        .collect()
}

/// Where candidate `i`'s match came from, given [`matches`]'s result.
pub fn source(engine: &[Option<EngineMatched>], i: usize) -> MatchSource {
    match engine.get(i) {
        Some(Some(_)) => MatchSource::Engine,
        _ => MatchSource::Estimate,
    }
}
