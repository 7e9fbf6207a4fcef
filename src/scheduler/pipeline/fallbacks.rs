//! Step 8, fallbacks: after the affinity pick, the candidates Envoy tries next when the primary
//! fails: longest match first, then least loaded (in flight plus engine queue, as the pick read
//! them), then position. At most `maxEndpoints - 1` of them.

use crate::scheduler::affinity::PodLoad;

/// Up to `keep` candidates other than `primary`, longest match first, then least loaded, then
/// position. The few kept are kept sorted in one scan: a selection over every candidate cost 4%
/// of the request path at 1,024 pods (benches/RESULTS.md, "Cost growth with the pool").
pub(super) fn fallbacks(
    primary: usize,
    matched: &[usize],
    loads: &[PodLoad],
    keep: usize,
) -> Vec<usize> {
    let keep = keep.min(matched.len().saturating_sub(1));
    let mut kept: Vec<(std::cmp::Reverse<usize>, i64, usize)> = Vec::with_capacity(keep + 1);
    for (i, (&m, l)) in matched.iter().zip(loads).enumerate() {
        // Once `keep` are kept, a shorter match than the last kept's cannot enter.
        if i == primary || (kept.len() == keep && kept.last().is_none_or(|last| m < last.0.0)) {
            continue;
        }
        // Saturating: an engine may report any queue (`1e19` casts to `i64::MAX`).
        let t = (
            std::cmp::Reverse(m),
            l.inflight.saturating_add(l.waiting as i64),
            i,
        );
        if kept.len() == keep && kept.last().is_none_or(|last| t >= *last) {
            continue;
        }
        let at = kept.partition_point(|x| *x < t);
        kept.insert(at, t);
        kept.truncate(keep);
    }
    kept.into_iter().map(|(_, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(inflight: i64, waiting: f64) -> PodLoad {
        PodLoad {
            key: 0,
            inflight,
            waiting,
            share: 0.0,
            head_inflight: 0,
            has_slot: true,
            fill: 0.0,
            written: 0.0,
            wait: 0.0,
            backlog: 0.0,
            reuses: true,
        }
    }

    #[test]
    fn longest_match_then_least_loaded_then_position_without_the_primary() {
        let matched = [3, 1, 3, 0, 1];
        let loads = [
            load(0, 0.0),
            load(2, 0.0),
            load(1, 0.0),
            load(0, 0.0),
            load(0, 1.0),
        ];
        assert_eq!(fallbacks(0, &matched, &loads, 4), [2, 4, 1, 3]);
        assert_eq!(fallbacks(2, &matched, &loads, 2), [0, 4]);
        assert_eq!(fallbacks(0, &matched, &loads, 0), [] as [usize; 0]);
        assert_eq!(fallbacks(0, &[5], &[load(0, 0.0)], 4), [] as [usize; 0]);
    }

    #[test]
    fn a_queue_past_any_integer_ranks_last_instead_of_wrapping() {
        // `vllm:num_requests_waiting 1e19` with a request in flight once wrapped to the least.
        let loads = [load(0, 0.0), load(1, 1e19), load(2, 0.0)];
        assert_eq!(fallbacks(0, &[1, 1, 1], &loads, 2), [2, 1]);
    }

    proptest::proptest! {
        /// The fallbacks equal the first `keep` of every other candidate sorted by (longest match,
        /// load, position).
        #[test]
        fn fallbacks_equal_a_full_sort(
            pods in proptest::collection::vec((0usize..4, 0i64..3, 0u8..3), 1..20),
            primary in 0usize..20,
            keep in 0usize..6,
        ) {
            let primary = primary % pods.len();
            let matched: Vec<usize> = pods.iter().map(|p| p.0).collect();
            let loads: Vec<PodLoad> = pods
                .iter()
                .map(|p| PodLoad {
                    key: 0,
                    inflight: p.1,
                    waiting: f64::from(p.2),
                    share: 0.0,
                    head_inflight: 0,
                    has_slot: true,
                    fill: 0.0,
                    written: 0.0,
                    wait: 0.0,
                    backlog: 0.0,
                    reuses: true,
                })
                .collect();
            let mut all: Vec<(std::cmp::Reverse<usize>, i64, usize)> = (0..pods.len())
                .filter(|&i| i != primary)
                .map(|i| (std::cmp::Reverse(matched[i]), pods[i].1 + i64::from(pods[i].2), i))
                .collect();
            all.sort_unstable();
            let expected: Vec<usize> = all.iter().take(keep).map(|&(_, _, i)| i).collect();
            proptest::prop_assert_eq!(fallbacks(primary, &matched, &loads, keep), expected);
        }
    }
}
