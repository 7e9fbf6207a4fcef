//! The latency model's prediction of each candidate of an affinity decision, derived when read
//! (the primary's at commit, every candidate's for explain and `--v 4`) from the loads the pick
//! read, each candidate's match and the prompt's size: the pick stores no prediction per
//! candidate (48 bytes each, written for every candidate of every decision and read for one).

use super::affinity::PodLoad;
use super::latency::Prediction;

/// What every candidate's prediction shares: the prompt's blocks, the tokens in a block and
/// the prefill seconds per token.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PredictionBasis {
    pub blocks: usize,
    pub tokens_per_block: f64,
    pub seconds_per_token: f64,
}

/// Each candidate's prediction, in candidate order; empty outside the affinity mode.
#[derive(Debug, Clone, Default)]
pub struct Predictions {
    loads: Vec<PodLoad>,
    /// Blocks each candidate matched (index, engine and holds in flight).
    matched: Vec<usize>,
    basis: PredictionBasis,
}

impl Predictions {
    /// The predictions of candidates with `loads` that matched `matched` blocks of the prompt.
    pub fn new(loads: Vec<PodLoad>, matched: Vec<usize>, basis: PredictionBasis) -> Predictions {
        debug_assert_eq!(loads.len(), matched.len());
        Predictions {
            loads,
            matched,
            basis,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }

    pub fn len(&self) -> usize {
        self.loads.len()
    }

    /// Candidate `i`'s prediction; `None` past the last candidate.
    pub fn get(&self, i: usize) -> Option<Prediction> {
        let (l, &matched) = (self.loads.get(i)?, self.matched.get(i)?);
        let b = self.basis;
        let uncached_tokens = b.blocks.saturating_sub(matched) as f64 * b.tokens_per_block;
        Some(Prediction {
            wait: l.wait,
            backlog: l.backlog,
            prefill: uncached_tokens * b.seconds_per_token,
            uncached_tokens,
            has_slot: l.has_slot,
            running: l.inflight as f64,
        })
    }

    /// Tokens of the prompt candidate `i` holds (its matched blocks, at most the prompt's, times
    /// the tokens in a block); `None` past the last candidate.
    pub fn matched_tokens(&self, i: usize) -> Option<f64> {
        let b = self.basis;
        let matched = (*self.matched.get(i)?).min(b.blocks);
        Some(matched as f64 * b.tokens_per_block)
    }

    /// Tokens of the prompt candidate `i` holds beyond the least any other candidate holds
    /// (what a move to the worst other pod would lose; with no other candidate, all it holds);
    /// `None` past the last candidate.
    pub fn lead(&self, i: usize) -> Option<f64> {
        let own = self.matched_tokens(i)?;
        let least = (0..self.len())
            .filter(|&j| j != i)
            .filter_map(|j| self.matched_tokens(j))
            .reduce(f64::min)
            .unwrap_or(0.0);
        Some((own - least).max(0.0))
    }

    /// Every candidate's prediction, in candidate order.
    pub fn iter(&self) -> impl Iterator<Item = Prediction> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_the_pods_wait_and_the_prefill_of_what_it_does_not_hold() {
        let load = PodLoad {
            key: 1,
            inflight: 3,
            waiting: 0.0,
            share: 0.0,
            head_inflight: 0,
            has_slot: false,
            fill: 1.0,
            written: 0.0,
            wait: 0.25,
            backlog: 0.5,
            reuses: true,
        };
        let basis = PredictionBasis {
            blocks: 10,
            tokens_per_block: 32.0,
            seconds_per_token: 1e-4,
        };
        let p = Predictions::new(vec![load, load], vec![4, 12], basis);
        assert_eq!(p.len(), 2);
        let first = p.get(0).unwrap();
        assert_eq!(
            (
                first.wait,
                first.backlog,
                first.uncached_tokens,
                first.has_slot,
                first.running
            ),
            (0.25, 0.5, 6.0 * 32.0, false, 3.0)
        );
        assert!((first.prefill - 6.0 * 32.0 * 1e-4).abs() < 1e-15);
        // A match past the prompt's blocks (an engine's longer view) leaves nothing uncached.
        assert_eq!(p.get(1).unwrap().uncached_tokens, 0.0);
        assert_eq!(p.matched_tokens(0), Some(4.0 * 32.0));
        assert_eq!(p.matched_tokens(1), Some(10.0 * 32.0), "at most the prompt");
        assert_eq!(p.matched_tokens(2), None);
        // Candidate 1 holds 6 blocks more than 0 (its 10 counted: the prompt's); 0 holds none
        // beyond 1.
        assert_eq!(p.lead(1), Some(6.0 * 32.0));
        assert_eq!(p.lead(0), Some(0.0));
        assert_eq!(p.lead(2), None);
        // Beyond the least of the others: 2 holds 8 more than 0, though 1 holds as much.
        let three = Predictions::new(vec![load; 3], vec![2, 10, 10], basis);
        assert_eq!(three.lead(2), Some(8.0 * 32.0));
        assert_eq!(p.get(2), None);
        assert_eq!(p.iter().count(), 2);
        assert!(Predictions::default().is_empty());
    }
}
