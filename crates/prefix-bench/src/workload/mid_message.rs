//! Workloads whose reusable prefix ends inside a message (issue 55): the part worth routing on
//! is followed, in the same message or prompt, by text no other request shares, so a router
//! that only knows prefixes cut at message ends sees nothing past the last shared message.
//!
//! - [`retrieval`]: one instruction block (system message), then in the user message one of
//!   `docs` long documents, drawn Zipf(`zipf`), then a question of its own.
//! - [`completion_doc`]: `/v1/completions`, a `prompt` that starts with one of `docs` document
//!   heads (Zipf) and ends with a question of its own.
//! - [`few_shot`]: a short system message, then a last user message holding one of `sets`
//!   blocks of few-shot examples (Zipf) followed by the query.
//! - [`tool_result`]: scratchpad agent sessions over a shared tool preamble whose successive
//!   requests re-send the task and one long tool result inside their one user message, each
//!   followed by a new step note.
//!
//! Each request names its group (the document, example set or session) for the oracles.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{BenchRequest, chat, completion, text};

/// Zipf(`s`) popularity over `n` items: item `i` drawn with weight `1 / (i + 1)^s`.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut total = 0.0;
        let cumulative = (0..n.max(1))
            .map(|i| {
                total += 1.0 / (i as f64 + 1.0).powf(s);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut SmallRng) -> usize {
        let x = rng.random::<f64>() * self.cumulative.last().copied().unwrap_or(0.0);
        self.cumulative
            .iter()
            .position(|c| x < *c)
            .unwrap_or(self.cumulative.len() - 1)
    }
}

/// `n` shared texts of `tokens` tokens each, distinct under `salt`.
fn pool(n: usize, tokens: usize, seed: u64, salt: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            text(
                seed ^ salt ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                tokens * 4,
            )
        })
        .collect()
}

/// Request `i`'s own text (a question, a query, a step note) of `tokens` tokens.
fn own(seed: u64, salt: u64, i: usize, tokens: usize) -> String {
    text(
        seed ^ salt ^ (i as u64 + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
        tokens * 4,
    )
}

/// `requests` requests, each on one of `groups` shared texts drawn Zipf(`zipf`) by a generator
/// seeded with `seed`: `request(i, g)` builds request `i` on group `g`.
fn on_drawn_groups(
    groups: usize,
    requests: usize,
    zipf: f64,
    seed: u64,
    mut request: impl FnMut(usize, usize) -> BenchRequest,
) -> Vec<BenchRequest> {
    let popularity = Zipf::new(groups, zipf);
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..requests)
        .map(|i| {
            let group = popularity.sample(&mut rng);
            request(i, group)
        })
        .collect()
}

/// A chat of a system message and a user message, naming its `group`.
fn system_then_user(
    system: &str,
    user: &str,
    output_tokens: usize,
    model: &str,
    group: usize,
) -> BenchRequest {
    BenchRequest::new(
        "/v1/chat/completions",
        chat(
            json!([{"role": "system", "content": system}, {"role": "user", "content": user}]),
            output_tokens,
            model,
        ),
        Some(group as u32),
    )
}

/// Retrieval-augmented chat: `requests` single questions, each `[system: the instruction
/// block of instruction_tokens, user: "Document d:\n<doc>\n\nQuestion: <own question>"]`, the
/// document one of `docs` of `doc_tokens`, drawn Zipf(`zipf`).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn retrieval(
    docs: usize,
    requests: usize,
    instruction_tokens: usize,
    doc_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    zipf: f64,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let instruction = format!(
        "Answer the question from the document the user gives. {}",
        text(seed ^ 0x0125_70C7, instruction_tokens * 4)
    );
    let documents = pool(docs, doc_tokens, seed, 0xD0C5);
    on_drawn_groups(docs, requests, zipf, seed ^ 0x2E72_1E7A, |i, d| {
        let user = format!(
            "Document {d}:\n{}\n\nQuestion: {}",
            documents[d],
            own(seed, 0x0A5C, i, question_tokens)
        );
        system_then_user(&instruction, &user, output_tokens, model, d)
    })
}

/// Completions over shared document heads: `requests` prompts `"<doc>\n\nQuestion: <own
/// question>\nAnswer:"`, the document one of `docs` of `doc_tokens`, drawn Zipf(`zipf`).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn completion_doc(
    docs: usize,
    requests: usize,
    doc_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    zipf: f64,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let documents = pool(docs, doc_tokens, seed, 0xC0_3D0C);
    on_drawn_groups(docs, requests, zipf, seed ^ 0xC0_3E7A, |i, d| {
        let prompt = format!(
            "{}\n\nQuestion: {}\nAnswer:",
            documents[d],
            own(seed, 0xC0A5, i, question_tokens)
        );
        BenchRequest::new(
            "/v1/completions",
            completion(prompt, output_tokens, model),
            Some(d as u32),
        )
    })
}

/// The system message of [`few_shot`]: short, the same for every request.
pub const FEW_SHOT_SYSTEM: &str = "You are a helpful assistant.";

/// Few-shot prompting: `requests` chats `[system: FEW_SHOT_SYSTEM, user: "Examples:\n<set>\n\n
/// Query: <own query>"]`, the examples one of `sets` blocks of `examples_tokens`, drawn
/// Zipf(`zipf`).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn few_shot(
    sets: usize,
    requests: usize,
    examples_tokens: usize,
    query_tokens: usize,
    output_tokens: usize,
    zipf: f64,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let examples = pool(sets, examples_tokens, seed, 0xE8A3_9135);
    on_drawn_groups(sets, requests, zipf, seed ^ 0xF3_5407, |i, s| {
        let user = format!(
            "Examples:\n{}\n\nQuery: {}",
            examples[s],
            own(seed, 0x0F5E, i, query_tokens)
        );
        system_then_user(FEW_SHOT_SYSTEM, &user, output_tokens, model, s)
    })
}

/// Agent sessions re-sending a tool result, as a scratchpad agent does: one tool preamble of
/// `preamble_bytes` shared by every session (system); per session a task of `task_tokens` and
/// one tool result of `result_tokens`; then `turns` requests whose one user message is `"Task:
/// <task>\n\nTool result:\n<result>\n\nStep t: <note of step_tokens>"`: the same task and
/// result, a new note each turn. No message but the preamble ends where another request's does.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn tool_result(
    sessions: usize,
    turns: usize,
    preamble_bytes: usize,
    task_tokens: usize,
    result_tokens: usize,
    step_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let preamble = format!(
        "You are an agent. Call one tool per step. Tools: {}",
        text(seed ^ 0x7001_5E55, preamble_bytes)
    );
    let mut out = Vec::with_capacity(sessions * turns);
    for s in 0..sessions {
        let cs = seed ^ (s as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F);
        let task = text(cs ^ 0x7A5C, task_tokens * 4);
        let result = text(cs ^ 0x2E5, result_tokens * 4);
        for t in 0..turns {
            let user = format!(
                "Task: {task}\n\nTool result:\n{result}\n\nStep {t}: {}",
                own(cs, 0x57E9, t, step_tokens)
            );
            let mut r = system_then_user(&preamble, &user, output_tokens, model, s);
            r.conversation = Some(s as u32);
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests;
