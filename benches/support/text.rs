//! Seeded, text-like prompt bytes and chat bodies for the benches (`mod text` in each bench
//! target): words drawn from a fixed vocabulary by a seeded RNG, so every run sees the same text.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The system prompt every [`chat_body`] shares.
pub const SYSTEM_BYTES: usize = 2 * 1024;

/// The words prompts are made of (common English plus serving/infra vocabulary).
pub const VOCABULARY: &str = "\
    the of and to in is that for it as was with be by on not he this are or his from at \
    which but have an had they you were their one all we can her has there been if more \
    when will would who so no she other its may these what them than some him time into \
    only do out could about two first then any like should over such our also model request \
    server cluster latency token prompt cache prefix block memory system user assistant \
    answer question document function value return result error example explain summarize \
    following context information please provide detailed response data table query \
    customer order account policy report analysis code python rust kubernetes deployment \
    service network storage database performance throughput schedule inference gateway \
    endpoint routing weight score plugin configuration version release feature support \
    because however therefore between through during without within important different \
    possible available specific general several number people world year state company \
    program problem process development research market product quality history language \
    reason";

/// Appends seeded text-like words to `out` until it is exactly `len` bytes long.
pub fn append_words(out: &mut Vec<u8>, seed: u64, len: usize) {
    let vocabulary: Vec<&str> = VOCABULARY.split_whitespace().collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut sentence_start = true;
    while out.len() < len {
        let word = vocabulary[rng.random_range(0..vocabulary.len())].as_bytes();
        if sentence_start {
            out.push(word[0].to_ascii_uppercase());
            out.extend_from_slice(&word[1..]);
            sentence_start = false;
        } else {
            out.push(b' ');
            out.extend_from_slice(word);
        }
        if rng.random_ratio(1, 12) {
            out.extend_from_slice(if rng.random_ratio(1, 6) {
                b".\n\n"
            } else {
                b". "
            });
            sentence_start = true;
        } else if rng.random_ratio(1, 15) {
            out.push(b',');
        }
    }
    out.truncate(len);
}

pub fn words(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    append_words(&mut out, seed, len);
    out
}

/// A chat body for `model` of about `bytes` bytes: a shared 2 KiB system prompt and a user
/// message.
pub fn chat_body(model: &str, seed: u64, bytes: usize) -> Vec<u8> {
    let system = String::from_utf8(words(7, SYSTEM_BYTES)).expect("ASCII");
    let user = String::from_utf8(words(seed, bytes - SYSTEM_BYTES)).expect("ASCII");
    serde_json::to_vec(&serde_json::json!({"model": model, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]}))
    .expect("serializable")
}
