//! Kthena's step 4, rank: candidates best total first, equal totals in a seeded random order
//! (Kthena shuffles, then sorts stably); the session's pod, if the filters kept it, leads; the
//! first `keep` are the primary pick and its fallbacks. The reason: the session's, else by
//! prefix-cache's scores (a hit when the primary holds a prefix, overruled when only another
//! pod does, a miss when none does, unscored when prefix-cache gave nothing).

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

use super::candidates::session_position;
use super::score::Weighted;
use crate::scheduler::config::ScorerKind;
use crate::scheduler::{Candidate, Decision, DecisionReason, RouteRequest};

/// The weighted decision: `weighted`'s totals ranked, as a value.
pub(super) fn decision<C: Candidate + Clone>(
    weighted: Weighted,
    request: &RouteRequest<'_>,
    candidates: Arc<[C]>,
    rng: &mut SmallRng,
    keep: usize,
) -> Decision<C> {
    let session = session_position(&candidates, request.session_pod);
    let order = order(&weighted.totals, session, rng);
    let prefix_scores = weighted
        .plugins
        .iter()
        .find(|p| p.plugin == ScorerKind::PrefixCache.as_str())
        .and_then(|p| p.scores.as_deref());
    let reason = reason(prefix_scores, session.is_some(), order[0]);
    let ranked = order
        .iter()
        .take(keep)
        .map(|&i| candidates[i].clone())
        .collect();
    Decision {
        candidates,
        plugins: weighted.plugins,
        totals: weighted.totals,
        ranked,
        primary_at: order[0],
        reason,
        hashes: weighted.hashes,
        prompt_bytes: request.prompt.map_or(0, str::len),
        unscored: weighted.unscored,
        predicted_blocks: 0,
        predictions: Default::default(),
        engine: Vec::new(),
        observations: Vec::new(),
        duration: std::time::Duration::ZERO,
        pd: None,
        kv_matched: weighted.kv_matched,
        epp: Default::default(),
    }
}

/// Candidate positions, best total first, equal totals in `rng`'s order; the session's
/// position (if any) moved to the front.
fn order(totals: &[u64], session: Option<usize>, rng: &mut SmallRng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..totals.len()).collect();
    order.shuffle(rng);
    order.sort_by(|&a, &b| totals[b].cmp(&totals[a]));
    if let Some(at) = session.and_then(|i| order.iter().position(|&o| o == i)) {
        order[..=at].rotate_right(1);
    }
    order
}

/// Why the candidate at `first` leads.
fn reason(prefix_scores: Option<&[u32]>, session: bool, first: usize) -> DecisionReason {
    match prefix_scores {
        _ if session => DecisionReason::Session,
        None => DecisionReason::Unscored,
        Some(s) if s[first] > 0 => DecisionReason::PrefixHit,
        Some(s) if s.iter().any(|&x| x > 0) => DecisionReason::PrefixOverruled,
        Some(_) => DecisionReason::PrefixMiss,
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn best_total_first_and_ties_in_a_seeded_order() {
        let totals = [5, 9, 5, 5, 1];
        let orders: Vec<Vec<usize>> = (0..32)
            .map(|s| order(&totals, None, &mut SmallRng::seed_from_u64(s)))
            .collect();
        for o in &orders {
            assert_eq!((o[0], o[4]), (1, 4));
            let mut tied = o[1..4].to_vec();
            tied.sort_unstable();
            assert_eq!(tied, [0, 2, 3]);
        }
        assert!(
            orders.iter().any(|o| o[1] != orders[0][1]),
            "ties vary by seed"
        );
        let again = order(&totals, None, &mut SmallRng::seed_from_u64(3));
        assert_eq!(again, orders[3]);
    }

    #[test]
    fn the_session_pod_leads_and_the_rest_keep_their_order() {
        let totals = [3, 2, 1];
        let o = order(&totals, Some(2), &mut SmallRng::seed_from_u64(0));
        assert_eq!(o, [2, 0, 1]);
        assert_eq!(reason(Some(&[0, 0, 0]), true, 2), DecisionReason::Session);
    }

    #[test]
    fn the_reason_follows_prefix_cache_scores() {
        assert_eq!(reason(None, false, 0), DecisionReason::Unscored);
        assert_eq!(reason(Some(&[50, 0]), false, 0), DecisionReason::PrefixHit);
        assert_eq!(
            reason(Some(&[0, 50]), false, 0),
            DecisionReason::PrefixOverruled
        );
        assert_eq!(reason(Some(&[0, 0]), false, 0), DecisionReason::PrefixMiss);
    }
}
