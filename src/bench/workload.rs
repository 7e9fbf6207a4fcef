//! Benchmark workloads, deterministic under a seed. Text is words from a fixed vocabulary at
//! ~4 bytes per token, never random bytes.
//!
//! - `shared-prefix`: `groups` system prompts x `per_group` questions, shuffled (SGLang's
//!   generated-shared-prefix: 64 x 16, 2048-token system, 128-token question, 256 output).
//! - `multi-turn`: conversations that re-send their whole history each turn (chat API).
//! - `trace`: a Mooncake trace; each 512-token hash id becomes ~2,048 bytes of text seeded by the
//!   id (so equal ids share bytes exactly), the last block cut to `input_length * 4` bytes;
//!   arrival times from the trace divided by a speed-up factor.
//! - `burst`: `bursts` new prefixes, each sent by `size` requests at once.

use std::io::BufRead;
use std::path::Path;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::{Value, json};

const VOCABULARY: [&str; 64] = [
    "alpha", "bravo", "cache", "delta", "engine", "fabric", "gamma", "harbor", "index", "jungle",
    "kernel", "ledger", "matrix", "nebula", "orbit", "prefix", "quartz", "router", "signal",
    "tensor", "update", "vector", "window", "xenon", "yield", "zephyr", "amber", "basalt",
    "cobalt", "dune", "ember", "fjord", "granite", "hollow", "ivory", "jasper", "kiln", "lumen",
    "mesa", "nickel", "onyx", "pylon", "quill", "ridge", "slate", "timber", "umber", "valley",
    "willow", "yarrow", "azure", "birch", "cedar", "delta", "elm", "fern", "grove", "heath",
    "iris", "juniper", "kelp", "lotus", "maple", "nectar",
];

/// Deterministic text of exactly `bytes` bytes.
pub fn text(seed: u64, bytes: usize) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(VOCABULARY[rng.random_range(0..VOCABULARY.len())]);
        s.push(' ');
    }
    s.truncate(bytes);
    s
}

/// One request of a workload.
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub path: &'static str,
    pub body: Value,
    /// Conversation id (turns of one conversation run in order).
    pub conversation: Option<u32>,
    /// Burst id (the requests of one burst are sent at the same moment).
    pub burst: Option<u32>,
    /// Arrival time (trace replay), ms from the start.
    pub at_ms: Option<f64>,
}

fn chat(messages: Value, output_tokens: usize, model: &str) -> Value {
    json!({"model": model, "messages": messages, "max_tokens": output_tokens, "stream": true})
}

pub fn shared_prefix(
    groups: usize,
    per_group: usize,
    system_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let mut out = Vec::with_capacity(groups * per_group);
    for g in 0..groups {
        let system = text(
            seed ^ (g as u64 + 1).wrapping_mul(0x9E37_79B9),
            system_tokens * 4,
        );
        for q in 0..per_group {
            let question = text(
                seed ^ ((g * per_group + q) as u64 + 1).wrapping_mul(0xC2B2_AE35) ^ 0xABCD,
                question_tokens * 4,
            );
            out.push(BenchRequest {
                path: "/v1/chat/completions",
                body: chat(
                    json!([{"role": "system", "content": system}, {"role": "user", "content": question}]),
                    output_tokens,
                    model,
                ),
                conversation: None,
                burst: None,
                at_ms: None,
            });
        }
    }
    out.shuffle(&mut SmallRng::seed_from_u64(seed));
    out
}

pub fn multi_turn(
    conversations: usize,
    turns: usize,
    system_tokens: usize,
    user_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let mut out = Vec::new();
    for c in 0..conversations {
        let cs = seed ^ (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A);
        let mut history = vec![json!({"role": "system", "content": text(cs, system_tokens * 4)})];
        for t in 0..turns {
            history.push(
                json!({"role": "user", "content": text(cs ^ (2 * t as u64 + 1), user_tokens * 4)}),
            );
            out.push(BenchRequest {
                path: "/v1/chat/completions",
                body: chat(Value::Array(history.clone()), output_tokens, model),
                conversation: Some(c as u32),
                burst: None,
                at_ms: None,
            });
            history.push(json!({"role": "assistant", "content": text(cs ^ (2 * t as u64 + 2), output_tokens * 4)}));
        }
    }
    out
}

pub fn burst(
    bursts: usize,
    size: usize,
    prefix_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let mut out = Vec::new();
    for b in 0..bursts {
        let prefix = text(
            seed ^ (b as u64 + 7).wrapping_mul(0x51_7CC1_B727),
            prefix_tokens * 4,
        );
        for i in 0..size {
            out.push(BenchRequest {
                path: "/v1/completions",
                body: json!({"model": model, "prompt": format!("{prefix} request {i}"), "max_tokens": output_tokens, "stream": true}),
                conversation: None,
                burst: Some(b as u32),
                at_ms: None,
            });
        }
    }
    out
}

#[derive(Debug, Deserialize)]
struct TraceLine {
    timestamp: f64,
    input_length: usize,
    output_length: usize,
    hash_ids: Vec<u64>,
}

/// Mooncake trace replay (`limit` first requests; `output_cap` bounds output tokens).
pub fn trace(
    path: &Path,
    limit: usize,
    speedup: f64,
    output_cap: usize,
    model: &str,
) -> std::io::Result<Vec<BenchRequest>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut out = Vec::new();
    for line in file.lines().take(limit) {
        let t: TraceLine = serde_json::from_str(&line?)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let mut prompt = String::with_capacity(t.input_length * 4);
        for id in &t.hash_ids {
            prompt.push_str(&text(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED, 2048));
        }
        prompt.truncate(t.input_length * 4);
        out.push(BenchRequest {
            path: "/v1/completions",
            body: json!({"model": model, "prompt": prompt, "max_tokens": t.output_length.clamp(1, output_cap), "stream": true}),
            conversation: None,
            burst: None,
            at_ms: Some(t.timestamp / speedup.max(1e-9)),
        });
    }
    Ok(out)
}

/// The hit rate of an infinite cache with perfect routing (one engine sees everything), token
/// weighted, with model-sim's block size: the ceiling any router can reach on this workload.
pub fn ceiling_hit_rate(requests: &[BenchRequest], block_tokens: usize) -> f64 {
    let mut kv = crate::sim::kv_cache::KvCache::new(block_tokens, usize::MAX);
    let (mut hits, mut queries) = (0usize, 0usize);
    for r in requests {
        let body = serde_json::to_vec(&r.body).expect("serializable");
        let Ok(req) = crate::request::InferenceRequest::parse(&body) else {
            continue;
        };
        let prompt = req.prompt.unwrap_or_default();
        let a = kv.admit(&req.model, prompt.as_bytes());
        kv.release(&a.pinned);
        hits += a.cached_tokens;
        queries += a.prompt_tokens;
    }
    if queries == 0 {
        0.0
    } else {
        hits as f64 / queries as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_deterministic_words() {
        assert_eq!(text(3, 100), text(3, 100));
        assert_ne!(text(3, 100), text(4, 100));
        assert_eq!(text(3, 100).len(), 100);
        assert!(text(3, 100).contains(' '));
    }

    #[test]
    fn shared_prefix_ceiling_matches_its_structure() {
        let w = shared_prefix(4, 8, 512, 32, 8, 1, "m");
        assert_eq!(w.len(), 32);
        let c = ceiling_hit_rate(&w, 16);
        // 7 of 8 requests per group reuse the ~512-token system prompt out of ~560 tokens.
        assert!(c > 0.7 && c < 0.9, "{c}");
        let b = burst(2, 4, 256, 4, 1, "m");
        assert!(ceiling_hit_rate(&b, 16) > 0.7);
        assert_eq!(
            ceiling_hit_rate(&multi_turn(1, 1, 10, 10, 1, 1, "m"), 16),
            0.0
        );
    }
}

#[cfg(test)]
mod trace_tests {
    use super::*;

    #[test]
    fn trace_blocks_share_text_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(
            &path,
            "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 3, \"hash_ids\": [1, 2, 3]}\n{\"timestamp\": 5, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [1, 2, 9]}\n",
        )
        .unwrap();
        let w = trace(&path, 10, 1.0, 8, "m").unwrap();
        assert_eq!(w.len(), 2);
        let p0 = w[0].body["prompt"].as_str().unwrap();
        let p1 = w[1].body["prompt"].as_str().unwrap();
        assert_eq!(p0.len(), 6000);
        assert_eq!(p0[..4096], p1[..4096]);
        assert_ne!(p0[4096..4400], p1[4096..4400]);
        // The second request can reuse its first two 512-token blocks: 1024 of 1100 tokens.
        let c = ceiling_hit_rate(&w, 16);
        let expected = 1024.0 / (1500.0 + 1100.0);
        assert!((c - expected).abs() < 0.01, "{c} vs {expected}");
    }
}
