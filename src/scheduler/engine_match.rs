//! The affinity mode's match on engine truth: a candidate whose [`EngineView`] is live and a
//! request whose head is known in the engines' tokens ([`EngineTokens`]) is matched by what the
//! engine holds, counted in its tokens; every other candidate keeps the prefix index's estimate.
//!
//! The pick compares candidates in blocks of the rendered prompt, so an engine match converts
//! to the share of the prompt it covers: `tokens matched / head tokens x head bytes / prompt
//! bytes x prompt blocks`, rounded down. The request's token chain is hashed once per engine
//! block size among the candidates (one, in a pool of one engine).
//!
//! The engine speaks only for the head: past it the request has no engine tokens. A head ends
//! at a message boundary or at a cut inside the last message (`tokenizer::heads`). [`combine`]
//! merges the two, never knowing less than the estimate: where the engine holds every full
//! block of the *message* head, the pod keeps the longer of the two matches (the estimate's,
//! past the head, is what the pod was sent: documents, examples or tool results that end
//! inside a message; the engine's, past the estimate, what the index does not know, after a
//! restart or from another replica); where it holds less, its cache is missing a block of the
//! head, and a prefix cache cannot hit past a missing block, so the engine's match stands
//! (evicted, restarted, never sent). [`MatchSource::Mixed`] marks the estimate's longer match.
//!
//! Inside the last message the engine's shorter match does not overrule the estimate: under KV
//! pressure an engine evicts documents within seconds, and a pick that then saw no pod holding
//! one spread its requests over three pods instead of one and a half, and lost 1-2 points of
//! hits on every document workload (benches/RESULTS.md, "Cut heads").
//!
//! A hold for the pod awaits the engine's store of the head's last full block
//! ([`EngineView::await_block`]) only when the head is the whole prompt: otherwise the store
//! would end the hold's claim on blocks past the head, which the view cannot see.

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
    /// The token-chain hash of the head's last full block at the engine's block size, when the
    /// head is the whole prompt: a hold for the pod ends when the engine stores it. `None`: no
    /// full block, no block size yet, or a head shorter than the prompt.
    pub last_block: Option<u64>,
    /// The engine holds every full block of the message head (the tokens that end at a message
    /// boundary): past it, the longer of the engine's match and the estimate's stands.
    pub whole_head: bool,
    /// Prompt blocks wholly inside the head (what the estimate must pass to add anything).
    pub head_blocks: usize,
    /// Prompt blocks the estimate adds past the engine's match ([`combine`]).
    pub estimate_beyond: usize,
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
    let whole_prompt = tokens.prompt_bytes >= prompt_bytes;
    let head_blocks = (head_share * prompt_blocks as f64) as usize;
    let mut chains = Chains::default();
    views
        .into_iter()
        .map(|view| {
            let (view, block_size) = view?;
            if block_size == 0 {
                // Live and nothing stored: the engine holds nothing, head included.
                return Some(EngineMatched {
                    tokens: 0,
                    blocks: 0,
                    last_block: pool
                        .filter(|_| whole_prompt)
                        .and_then(|bs| chains.of(tokens.tokens, bs).last().copied()),
                    whole_head: tokens.head_tokens == 0,
                    head_blocks,
                    estimate_beyond: 0,
                });
            }
            let chain = chains.of(tokens.tokens, block_size);
            let full = view.longest_match(chain);
            let held = full * block_size;
            let blocks = ((held as f64 * blocks_per_token) as usize).min(prompt_blocks);
            Some(EngineMatched {
                tokens: held,
                blocks,
                last_block: chain.last().copied().filter(|_| whole_prompt),
                whole_head: full >= tokens.head_tokens.min(tokens.tokens.len()) / block_size,
                head_blocks,
                estimate_beyond: 0,
            })
        })
        .collect()
}

/// Merges each candidate's engine match into `estimate` (its matched prompt blocks, from the
/// index): the longer of the two where the engine holds the whole message head, else the
/// engine's. Records in each match what the estimate added.
pub fn combine(engine: &mut [Option<EngineMatched>], estimate: &mut [usize]) {
    for (blocks, matched) in estimate.iter_mut().zip(engine.iter_mut()) {
        let Some(m) = matched else { continue };
        if m.whole_head && *blocks > m.blocks {
            m.estimate_beyond = *blocks - m.blocks;
        } else {
            m.estimate_beyond = 0;
            *blocks = m.blocks;
        }
    }
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
        Some(Some(m)) if m.estimate_beyond > 0 => MatchSource::Mixed,
        Some(Some(_)) => MatchSource::Engine,
        _ => MatchSource::Estimate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(blocks: usize, whole_head: bool) -> Option<EngineMatched> {
        Some(EngineMatched {
            tokens: blocks * 16,
            blocks,
            last_block: None,
            whole_head,
            head_blocks: 40,
            estimate_beyond: 0,
        })
    }

    #[test]
    fn past_a_message_head_held_whole_the_longer_match_stands() {
        // A cut head of 40 prompt blocks; pod 0 holds its message head and 10 blocks (the
        // engine evicted the rest of the document), the index says 60: the estimate's 60
        // stands. Pod 1 holds 50 where the index knows 20 (a restart): the engine's. Pod 2
        // lacks a block of its message head: its engine's 3, whatever the index says. Pod 3
        // has no live view: the estimate.
        let mut engine = vec![
            matched(10, true),
            matched(50, true),
            matched(3, false),
            None,
        ];
        let mut estimate = vec![60, 20, 60, 7];
        combine(&mut engine, &mut estimate);
        assert_eq!(estimate, [60, 50, 3, 7]);
        assert_eq!(
            (0..4).map(|i| source(&engine, i)).collect::<Vec<_>>(),
            [
                MatchSource::Mixed,
                MatchSource::Engine,
                MatchSource::Engine,
                MatchSource::Estimate
            ]
        );
        assert_eq!(engine[0].unwrap().estimate_beyond, 50);
    }
}
