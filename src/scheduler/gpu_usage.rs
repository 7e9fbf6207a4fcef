//! gpu-usage: prefer pods with free KV cache: `int((1 - kvCacheUsage) * 100)`, clamped to 0..=100
//! (Kthena can go negative for usage > 1; prefix-picker clamps).

use super::Candidate;

pub fn score_usage(usage: f64) -> u32 {
    ((1.0 - usage) * 100.0).clamp(0.0, 100.0) as u32
}

pub fn score<C: Candidate>(candidates: &[C]) -> Vec<u32> {
    candidates
        .iter()
        .map(|e| score_usage(e.stats().kv_usage))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_truncation() {
        assert_eq!(score_usage(0.9), 9);
        assert_eq!(score_usage(0.5), 50);
        assert_eq!(score_usage(0.0), 100);
        assert_eq!(score_usage(1.5), 0);
    }
}
