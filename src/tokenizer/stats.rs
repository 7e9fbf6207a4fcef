//! Counters of the tokenizer, plain atomics: the integrator exports them (the Prometheus
//! families live with the metrics module, not here).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::ErrorKind;

/// Upper bounds (seconds) of the call-latency buckets; a last bucket counts the rest.
pub const LATENCY_BUCKETS: [f64; 9] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0];

/// What the tokenizer did since it was built. Every field only grows.
#[derive(Debug, Default)]
pub struct TokenizerStats {
    /// `tokenize` calls.
    pub requests: AtomicU64,
    /// Answered from the cache.
    pub cache_hits: AtomicU64,
    /// Joined a call already in flight for the same input (single-flight).
    pub joined: AtomicU64,
    /// HTTP calls made to engines.
    pub calls: AtomicU64,
    /// Failed calls (and invalid inputs), by [`ErrorKind`] (index: `kind as usize`).
    pub errors: [AtomicU64; ErrorKind::ALL.len()],
    /// Cached answers evicted to stay within the budget.
    pub evictions: AtomicU64,
    /// Sum of the calls' latencies, in microseconds (successes and failures).
    pub latency_micros_sum: AtomicU64,
    /// Calls by latency: `latency_buckets[i]` counts calls with
    /// `LATENCY_BUCKETS[i-1] < latency <= LATENCY_BUCKETS[i]`; the last, the slower ones.
    /// Not cumulative.
    pub latency_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
}

impl TokenizerStats {
    /// Errors of one kind so far.
    pub fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Relaxed)
    }

    pub(super) fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Relaxed);
    }

    pub(super) fn call_took(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_micros_sum.fetch_add(micros, Relaxed);
        let secs = latency.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency_buckets[bucket].fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_bucket() {
        let s = TokenizerStats::default();
        s.call_took(Duration::from_micros(500));
        s.call_took(Duration::from_millis(1));
        s.call_took(Duration::from_millis(30));
        s.call_took(Duration::from_secs(3));
        let counts: Vec<u64> = s.latency_buckets.iter().map(|b| b.load(Relaxed)).collect();
        assert_eq!(counts, [2, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(s.latency_micros_sum.load(Relaxed), 3_031_500);
    }
}
