//! llm-d's `prefix-cache-affinity-filter`: keep the pods that hold most of the prompt
//! ("sticky"), unless they are too slow.
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go`. With one pod,
//! or `affinityThreshold <= 0`, every pod is kept; with probability `explorationProbability`
//! every pod is kept (exploration); a pod is sticky when its prefix score, matched / total
//! blocks (0 with no block), is `>= affinityThreshold`; no sticky pod keeps every pod. The
//! TTFT gate (`maxTTFTPenaltyMs > 0` and some pod not sticky): a pod's TTFT is its in-flight
//! tokens / `peakPrefillThroughput` * 1000 ms (`ttftSource: prefillThroughput`), and when the
//! best sticky pod's exceeds the best other pod's by more than `maxTTFTPenaltyMs`, every pod
//! is kept; else the sticky pods are.
//!
//! Knobs (llm-d's defaults): `affinityThreshold` 0.80 (at most 1), `explorationProbability` 0
//! (0..=1), `maxTTFTPenaltyMs` 18000 (>= 0; 0: always stick), `peakPrefillThroughput` 15928
//! tokens/s (> 0 while the gate is on). `ttftSource: latencyPredictor` is refused by the
//! config (this project has no llm-d latency predictor).

/// The filter's parameters, validated by the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixAffinity {
    pub affinity_threshold: f64,
    pub exploration_probability: f64,
    pub max_ttft_penalty_ms: f64,
    pub peak_prefill_throughput: f64,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        PrefixAffinity {
            affinity_threshold: 0.80,
            exploration_probability: 0.0,
            max_ttft_penalty_ms: 18_000.0,
            peak_prefill_throughput: 15_928.0,
        }
    }
}

/// What the filter did, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityOutcome {
    /// One pod, or the threshold is off.
    Off,
    /// The exploration draw skipped the gate.
    Explored,
    /// No pod reaches the threshold.
    NoSticky,
    /// The sticky pods are too slow: every pod kept.
    TtftGateBroken,
    /// Narrowed to the sticky pods.
    Sticky,
}

impl AffinityOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AffinityOutcome::Off => "off",
            AffinityOutcome::Explored => "explored",
            AffinityOutcome::NoSticky => "no_sticky",
            AffinityOutcome::TtftGateBroken => "ttft_gate_broken",
            AffinityOutcome::Sticky => "sticky",
        }
    }
}

impl PrefixAffinity {
    /// Which pods pass, from each pod's matched blocks (`None`: no match known, score 0), the
    /// prompt's `total` blocks, each pod's in-flight tokens and an exploration draw `u` in
    /// [0, 1).
    pub fn keep(
        &self,
        matched: Option<&[usize]>,
        total: usize,
        inflight_tokens: &[u64],
        u: f64,
    ) -> (Vec<bool>, AffinityOutcome) {
        let n = inflight_tokens.len();
        if n <= 1 || self.affinity_threshold <= 0.0 {
            return (vec![true; n], AffinityOutcome::Off);
        }
        if u < self.exploration_probability {
            return (vec![true; n], AffinityOutcome::Explored);
        }
        let score = |i: usize| match matched {
            Some(m) if total > 0 => m[i] as f64 / total as f64,
            _ => 0.0,
        };
        let sticky: Vec<bool> = (0..n)
            .map(|i| score(i) >= self.affinity_threshold)
            .collect();
        if !sticky.contains(&true) {
            return (vec![true; n], AffinityOutcome::NoSticky);
        }
        if self.max_ttft_penalty_ms > 0.0 && sticky.contains(&false) {
            let ttft = |i: usize| inflight_tokens[i] as f64 / self.peak_prefill_throughput * 1000.0;
            let best = |want: bool| {
                (0..n)
                    .filter(|&i| sticky[i] == want)
                    .map(ttft)
                    .fold(f64::MAX, f64::min)
            };
            if best(true) - best(false) > self.max_ttft_penalty_ms {
                return (vec![true; n], AffinityOutcome::TtftGateBroken);
            }
        }
        (sticky, AffinityOutcome::Sticky)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand, 10-block prompt, threshold 0.8: pods hold 9, 8, 2 blocks (0.9, 0.8, 0.2):
    /// the first two are sticky.
    #[test]
    fn keeps_the_pods_at_or_above_the_threshold() {
        let f = PrefixAffinity::default();
        let (keep, out) = f.keep(Some(&[9, 8, 2]), 10, &[0, 0, 0], 0.5);
        assert_eq!(keep, [true, true, false]);
        assert_eq!(out, AffinityOutcome::Sticky);
        let (keep, out) = f.keep(Some(&[7, 0]), 10, &[0, 0], 0.5);
        assert_eq!((keep, out), (vec![true, true], AffinityOutcome::NoSticky));
        let (keep, out) = f.keep(None, 10, &[0, 0], 0.5);
        assert_eq!((keep, out), (vec![true, true], AffinityOutcome::NoSticky));
    }

    /// TTFT gate, peak 1000 tokens/s, penalty 5000 ms: sticky pod with 8000 in-flight tokens
    /// = 8000 ms, the other 2000 tokens = 2000 ms: 6000 > 5000, every pod kept. At 6000
    /// tokens (6000 ms): 4000 <= 5000, sticky kept. Penalty 0: always sticky.
    #[test]
    fn the_ttft_gate_breaks_stickiness_when_the_sticky_pods_are_too_slow() {
        let f = PrefixAffinity {
            max_ttft_penalty_ms: 5000.0,
            peak_prefill_throughput: 1000.0,
            ..PrefixAffinity::default()
        };
        let (keep, out) = f.keep(Some(&[10, 0]), 10, &[8000, 2000], 0.5);
        assert_eq!(
            (keep, out),
            (vec![true, true], AffinityOutcome::TtftGateBroken)
        );
        let (keep, out) = f.keep(Some(&[10, 0]), 10, &[6000, 2000], 0.5);
        assert_eq!((keep, out), (vec![true, false], AffinityOutcome::Sticky));
        let always = PrefixAffinity {
            max_ttft_penalty_ms: 0.0,
            ..f
        };
        let (keep, _) = always.keep(Some(&[10, 0]), 10, &[1_000_000, 0], 0.5);
        assert_eq!(keep, [true, false]);
    }

    #[test]
    fn exploration_and_a_lone_pod_keep_everything() {
        let f = PrefixAffinity {
            exploration_probability: 0.1,
            ..PrefixAffinity::default()
        };
        let (keep, out) = f.keep(Some(&[10, 0]), 10, &[0, 0], 0.05);
        assert_eq!((keep, out), (vec![true, true], AffinityOutcome::Explored));
        let (_, out) = f.keep(Some(&[10, 0]), 10, &[0, 0], 0.5);
        assert_eq!(out, AffinityOutcome::Sticky);
        let (keep, out) = f.keep(Some(&[0]), 10, &[0], 0.5);
        assert_eq!((keep, out), (vec![true], AffinityOutcome::Off));
    }
}
