//! llm-d's `token-load-scorer` and the in-flight token load it reads (the
//! `inflight-load-producer`'s), as formulas over plain numbers.
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go` scores a pod
//! `1 - min(1, t / queueThresholdTokens)` (1 when `t <= 0`), `t` the pod's in-flight tokens
//! plus the request's own uncached tokens on that pod; `queueThresholdTokens` defaults to
//! 4194304 (4Mi), and a value `<= 0` is the default.
//! `pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/producer.go`
//! (`uncachedInputTokens`): the tokens a pod must compute for a request are the prompt's
//! indexed blocks it does not hold, `(total - matched) * block tokens`, plus the prompt's tail
//! beyond the indexed blocks; without a prefix match, the whole prompt. A routed request adds
//! them to its pod until prefill is done (the response's first body chunk), or until it ends.
//! The input is the estimate token producer's count (`dataproducer/tokenizer/estimate.go`:
//! 4-byte pseudo-tokens), here `ceil(prompt bytes / 4)`.

/// `queueThresholdTokens`' default (128 requests of 32K tokens).
pub const DEFAULT_QUEUE_THRESHOLD_TOKENS: f64 = 4_194_304.0;

/// Bytes in one of the estimate token producer's pseudo-tokens.
pub const BYTES_PER_TOKEN: usize = 4;

/// The estimate token producer's input tokens for a prompt of `bytes` bytes.
pub fn input_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN) as u64
}

/// The tokens a pod must compute for a request of `input` tokens whose `total` indexed blocks
/// of `block_tokens` tokens it holds `matched` of (`None`: no prefix match known, the whole
/// input).
pub fn uncached_tokens(matched: Option<usize>, total: usize, block_tokens: u64, input: u64) -> u64 {
    let Some(matched) = matched else {
        return input;
    };
    let indexed = total as u64 * block_tokens;
    let uncached = total.saturating_sub(matched) as u64 * block_tokens;
    uncached + input.saturating_sub(indexed)
}

/// token-load-scorer: per pod, from its in-flight tokens and the request's uncached tokens on
/// it.
pub fn token_load_scores(inflight: &[u64], uncached: &[u64], threshold: f64) -> Vec<f64> {
    inflight
        .iter()
        .zip(uncached)
        .map(|(&load, &own)| {
            let t = (load + own) as f64;
            if t <= 0.0 {
                1.0
            } else {
                1.0 - t.min(threshold) / threshold
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand, threshold 1000: pod a idle, request uncached 0 -> 1; pod b 300 in flight +
    /// 200 uncached = 500 -> 0.5; pod c 900 + 300 = 1200, capped at 1000 -> 0.
    #[test]
    fn token_load_is_one_minus_the_capped_share_of_the_threshold() {
        let scores = token_load_scores(&[0, 300, 900], &[0, 200, 300], 1000.0);
        assert_eq!(scores, [1.0, 0.5, 0.0]);
        // The default threshold: 1 Mi tokens is a quarter of it -> 0.75.
        let d = token_load_scores(&[1 << 20], &[0], DEFAULT_QUEUE_THRESHOLD_TOKENS);
        assert_eq!(d, [0.75]);
    }

    /// 10 blocks of 16 tokens indexed, input 170 tokens (a 10-token tail): a pod holding 4
    /// blocks computes 6 * 16 + 10 = 106; one holding all, the tail 10; no match known: 170.
    #[test]
    fn uncached_tokens_are_the_blocks_not_held_plus_the_tail() {
        assert_eq!(uncached_tokens(Some(4), 10, 16, 170), 106);
        assert_eq!(uncached_tokens(Some(10), 10, 16, 170), 10);
        assert_eq!(uncached_tokens(None, 10, 16, 170), 170);
        assert_eq!(input_tokens(9), 3);
        assert_eq!(input_tokens(0), 0);
    }
}
