//! least-request: prefer pods with fewer requests in flight; filter out backed-up pods.
//!
//! Score (Kthena): `base = onFlight + 100 * max(onFlight - running, 0)`, where `onFlight` is the
//! router's own in-flight count for the pod and `running` the engine's gauge (queued requests
//! weigh 100x); `score = int((maxBase - base) / maxBase * 100)`, 100 for all when `maxBase == 0`.
//! Filter: keep a pod iff the engine's `waiting < maxWaitingRequests` (default 10).

use std::sync::Arc;

use super::Candidate;

/// Scores from (onFlight, running) pairs.
pub fn score_counts(counts: &[(f64, f64)]) -> Vec<u32> {
    let bases: Vec<f64> = counts
        .iter()
        .map(|&(on_flight, running)| on_flight + 100.0 * (on_flight - running).max(0.0))
        .collect();
    let max = bases.iter().copied().fold(0.0, f64::max);
    bases
        .iter()
        .map(|&b| {
            if max <= 0.0 {
                100
            } else {
                ((max - b) / max * 100.0).clamp(0.0, 100.0) as u32
            }
        })
        .collect()
}

pub fn score<C: Candidate>(candidates: &[C]) -> Vec<u32> {
    let counts: Vec<(f64, f64)> = candidates
        .iter()
        .map(|e| (e.inflight().max(0) as f64, e.stats().running))
        .collect();
    score_counts(&counts)
}

/// Keeps the pods whose engine queue is below `max_waiting`; the shared list is copied only
/// when the filter removes a pod.
pub fn filter<C: Candidate + Clone>(candidates: &mut Arc<[C]>, max_waiting: u64) {
    if candidates.iter().all(|e| keeps(e, max_waiting)) {
        return;
    }
    *candidates = candidates
        .iter()
        .filter(|e| keeps(*e, max_waiting))
        .cloned()
        .collect();
}

/// Whether the filter keeps `e`: its engine queue is below `max_waiting`.
fn keeps<C: Candidate>(e: &C, max_waiting: u64) -> bool {
    e.stats().waiting < max_waiting as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_flight(v: &[f64]) -> Vec<u32> {
        score_counts(&v.iter().map(|&o| (o, 0.0)).collect::<Vec<_>>())
    }

    #[test]
    fn kthena_vectors() {
        assert_eq!(on_flight(&[0.0, 0.0, 0.0]), [100, 100, 100]);
        assert_eq!(on_flight(&[0.0, 10.0, 5.0]), [100, 0, 50]);
        assert_eq!(on_flight(&[1.0, 2.0, 3.0]), [66, 33, 0]);
        assert_eq!(
            score_counts(&[(5.0, 5.0), (5.0, 0.0), (0.0, 0.0)]),
            [99, 0, 100]
        );
    }
}
