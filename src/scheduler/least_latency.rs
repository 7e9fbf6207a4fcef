//! least-latency: prefer pods with low recent TTFT and TPOT.
//!
//! Pods with TTFT <= 0 or TPOT <= 0 (no data yet) get 50. Over the others,
//! `sX = 100 * (maxX - x) / (maxX - minX)` (100 when max == min) and
//! `score = int(f * sTTFT + (1 - f) * sTPOT)` with `f = TTFTTPOTWeightFactor` (default 0.5).

use super::Candidate;

pub fn score_latencies(latencies: &[(f64, f64)], factor: f64) -> Vec<u32> {
    let known = |&(ttft, tpot): &(f64, f64)| ttft > 0.0 && tpot > 0.0;
    let (mut min_t, mut max_t, mut min_p, mut max_p) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for l in latencies.iter().filter(|l| known(l)) {
        min_t = min_t.min(l.0);
        max_t = max_t.max(l.0);
        min_p = min_p.min(l.1);
        max_p = max_p.max(l.1);
    }
    let scaled = |x: f64, min: f64, max: f64| {
        if max == min {
            100.0
        } else {
            100.0 * (max - x) / (max - min)
        }
    };
    latencies
        .iter()
        .map(|l| {
            if !known(l) {
                return 50;
            }
            let s = factor * scaled(l.0, min_t, max_t) + (1.0 - factor) * scaled(l.1, min_p, max_p);
            s.clamp(0.0, 100.0) as u32
        })
        .collect()
}

pub fn score<C: Candidate>(candidates: &[C], factor: f64) -> Vec<u32> {
    let latencies: Vec<(f64, f64)> = candidates
        .iter()
        .map(|e| {
            let s = e.stats();
            (s.ttft, s.tpot)
        })
        .collect();
    score_latencies(&latencies, factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_pods_get_fifty_and_extremes_map_to_0_and_100() {
        let s = score_latencies(&[(0.0, 0.01), (0.1, 0.01), (0.3, 0.03), (0.2, 0.02)], 0.5);
        assert_eq!(s, [50, 100, 0, 50]);
        assert_eq!(
            score_latencies(&[(0.1, 0.01), (0.1, 0.01)], 0.5),
            [100, 100]
        );
        assert_eq!(score_latencies(&[(0.1, 0.03), (0.3, 0.01)], 1.0), [100, 0]);
        assert_eq!(score_latencies(&[(0.1, 0.03), (0.3, 0.01)], 0.0), [0, 100]);
    }
}
