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
//! - `multi-tenant`: `tenants` system prompts (~6 KB each) with Zipf popularity, more than one
//!   pod's cache holds; sessions of 1-3 turns that re-send their history.
//! - [`agent`]: one shared tool preamble longer than the router's 8 KiB hash coverage, then
//!   sessions that grow append-only over several turns (tool calls and results): as text chat
//!   (`agent`), and with the same words as Anthropic Messages (`agent-messages`) and as chat
//!   completions with tool calls (`agent-chat`).
//! - `hot-prefix`: one prefix carries `hot_share` of the requests, the others share the rest.
//! - [`mid_message`]: prefixes that end inside a message (`retrieval`, `completion-doc`,
//!   `few-shot`, `tool-result`).
//! - [`restarts`]: when each engine restarts in the `engine-restarts` workload (one at a time,
//!   evenly through the run).
//! - [`noisy_neighbour`]: tenants of many and few closed-loop clients sharing a pool, each
//!   request naming its tenant (GIE's fairness header; the driver reports TTFT per tenant).
//! - [`ramp`]: arrival times that rise linearly from a low rate to a peak and back (open loop),
//!   for a load that crosses the cluster's capacity and leaves it again.
//!
//! Every request names its affinity group (`group`: the shared prefix, tenant or session), so
//! [`super::oracle`] can place groups with perfect knowledge. Streams ask
//! `stream_options.include_usage`, so engines report `cached_tokens` at the end of each stream
//! (a Messages stream always reports `cache_read_input_tokens`).

use std::io::BufRead;
use std::path::Path;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::{Value, json};

pub mod agent;
pub mod mid_message;
pub use agent::{AgentScript, agent_chat_tools, agent_messages, agent_sessions};
pub use mid_message::{completion_doc, few_shot, retrieval, tool_result};

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

/// The model a workload's requests name (`model` when none does).
pub fn model(requests: &[BenchRequest]) -> &str {
    requests
        .iter()
        .find_map(|r| r.body.get("model")?.as_str())
        .unwrap_or("model")
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
    /// Affinity group: the shared prefix, tenant or session the request belongs to.
    pub group: Option<u32>,
    /// Send straight to this engine (by index) instead of the router (the oracle's placement).
    pub pin_to: Option<usize>,
    /// Extra request headers (the PD baseline names its prefill pod in one).
    pub headers: Vec<(&'static str, String)>,
}

impl BenchRequest {
    /// A request of `group` with no ordering constraint.
    pub fn new(path: &'static str, body: Value, group: Option<u32>) -> BenchRequest {
        BenchRequest {
            path,
            body,
            conversation: None,
            burst: None,
            at_ms: None,
            group,
            pin_to: None,
            headers: Vec::new(),
        }
    }

    /// The same request, one turn of `conversation`.
    fn turn_of(mut self, conversation: u32) -> BenchRequest {
        self.conversation = Some(conversation);
        self
    }
}

fn chat(messages: Value, output_tokens: usize, model: &str) -> Value {
    json!({"model": model, "messages": messages, "max_tokens": output_tokens, "stream": true,
        "stream_options": {"include_usage": true}})
}

fn completion(prompt: String, output_tokens: usize, model: &str) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": output_tokens, "stream": true,
        "stream_options": {"include_usage": true}})
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
            out.push(BenchRequest::new(
                "/v1/chat/completions",
                chat(
                    json!([{"role": "system", "content": system}, {"role": "user", "content": question}]),
                    output_tokens,
                    model,
                ),
                Some(g as u32),
            ));
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
            out.push(
                BenchRequest::new(
                    "/v1/chat/completions",
                    chat(Value::Array(history.clone()), output_tokens, model),
                    Some(c as u32),
                )
                .turn_of(c as u32),
            );
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
            let mut r = BenchRequest::new(
                "/v1/completions",
                completion(format!("{prefix} request {i}"), output_tokens, model),
                Some(b as u32),
            );
            r.burst = Some(b as u32);
            out.push(r);
        }
    }
    out
}

/// The header naming a request's tenant (GIE's fairness id); the driver reports TTFT per value.
pub const TENANT_HEADER: &str = "x-gateway-inference-fairness-id";

/// One tenant of [`noisy_neighbour`]: its closed-loop clients, each sending `requests` in a
/// row, prompts of `prompt_tokens` (distinct per request), answers of `output_tokens`.
#[derive(Debug, Clone, Copy)]
pub struct Tenant {
    pub name: &'static str,
    pub clients: usize,
    pub requests: usize,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
}

/// Tenants sharing a pool: each client is a unit that sends its requests one after another
/// (run them with a closed loop of as many workers as clients in all, so every client starts
/// at once), each request naming its tenant in [`TENANT_HEADER`]; the affinity group is the
/// client. Prompts are distinct (no tenant gains from another's cache).
pub fn noisy_neighbour(tenants: &[Tenant], seed: u64, model: &str) -> Vec<BenchRequest> {
    clients_naming(TENANT_HEADER, tenants, seed, model)
}

/// The header naming a request's objective (GIE's); the driver reports TTFT per value when a
/// request names no tenant.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// [`noisy_neighbour`]'s clients, each request naming its `tenants` entry as an objective in
/// [`OBJECTIVE_HEADER`] instead of a flow: every request in one flow, so only the objectives'
/// priorities (the picker's `flowControl.priorities`) tell them apart.
pub fn objectives(tenants: &[Tenant], seed: u64, model: &str) -> Vec<BenchRequest> {
    clients_naming(OBJECTIVE_HEADER, tenants, seed, model)
}

/// Closed-loop clients of `tenants`, each request naming its tenant in `header`.
fn clients_naming(
    header: &'static str,
    tenants: &[Tenant],
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let mut out = Vec::new();
    let mut client = 0u32;
    for t in tenants {
        for _ in 0..t.clients {
            for i in 0..t.requests {
                let prompt = text(
                    seed ^ (u64::from(client) << 20 | i as u64).wrapping_mul(0x2545_F491),
                    t.prompt_tokens * 4,
                );
                let mut r = BenchRequest::new(
                    "/v1/completions",
                    completion(prompt, t.output_tokens, model),
                    Some(client),
                )
                .turn_of(client);
                r.headers.push((header, t.name.to_string()));
                out.push(r);
            }
            client += 1;
        }
    }
    out
}

/// Multi-tenant chat: `tenants` system prompts of `system_tokens`, picked with Zipf(`zipf`)
/// popularity by `sessions` sessions of 1-3 turns (half are single questions); follow-up turns
/// re-send the session's history. Questions vary from half to 1.5x `question_tokens`.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn multi_tenant(
    tenants: usize,
    sessions: usize,
    system_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    zipf: f64,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let systems: Vec<String> = (0..tenants)
        .map(|t| {
            text(
                seed ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D),
                system_tokens * 4,
            )
        })
        .collect();
    let weights: Vec<f64> = (0..tenants)
        .map(|t| 1.0 / (t as f64 + 1.0).powf(zipf))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x007E_4A17);
    let mut out = Vec::new();
    for s in 0..sessions {
        let mut x = rng.random::<f64>() * total;
        let tenant = weights
            .iter()
            .position(|w| {
                x -= w;
                x < 0.0
            })
            .unwrap_or(tenants - 1);
        let turns = [1, 1, 2, 3][rng.random_range(0..4)];
        let cs = seed ^ (s as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A);
        let mut history = vec![json!({"role": "system", "content": systems[tenant]})];
        for t in 0..turns {
            let q = rng.random_range(question_tokens / 2..=question_tokens * 3 / 2);
            history.push(json!({"role": "user", "content": text(cs ^ (2 * t as u64 + 1), q * 4)}));
            out.push(
                BenchRequest::new(
                    "/v1/chat/completions",
                    chat(Value::Array(history.clone()), output_tokens, model),
                    Some(tenant as u32),
                )
                .turn_of(s as u32),
            );
            history.push(json!({"role": "assistant", "content": text(cs ^ (2 * t as u64 + 2), output_tokens * 4)}));
        }
    }
    out
}

/// Hot prefix: `requests` questions over `prefixes` system prompts, prefix 0 drawing
/// `hot_share` of them and the others sharing the rest evenly, in random order.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn hot_prefix(
    prefixes: usize,
    requests: usize,
    hot_share: f64,
    system_tokens: usize,
    question_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let systems: Vec<String> = (0..prefixes)
        .map(|p| {
            text(
                seed ^ (p as u64 + 3).wrapping_mul(0x1656_67B1),
                system_tokens * 4,
            )
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x407);
    (0..requests)
        .map(|i| {
            let p = if prefixes < 2 || rng.random::<f64>() < hot_share {
                0
            } else {
                rng.random_range(1..prefixes)
            };
            let question = text(
                seed ^ (i as u64 + 1).wrapping_mul(0x27D4_EB2F) ^ 0x55,
                question_tokens * 4,
            );
            BenchRequest::new(
                "/v1/chat/completions",
                chat(
                    json!([{"role": "system", "content": systems[p]}, {"role": "user", "content": question}]),
                    output_tokens,
                    model,
                ),
                Some(p as u32),
            )
        })
        .collect()
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
        // The group: requests that start with the same 512-token block.
        let group = t.hash_ids.first().map(|id| *id as u32);
        let mut r = BenchRequest::new(
            "/v1/completions",
            completion(prompt, t.output_length.clamp(1, output_cap), model),
            group,
        );
        r.at_ms = Some(t.timestamp / speedup.max(1e-9));
        out.push(r);
    }
    Ok(out)
}

/// The model and the prompt an engine sees for `r` (rendered as the router renders it; a
/// Messages request as the chat request vLLM serves it as, as model-sim does), or `None` when
/// the body does not parse.
pub fn engine_prompt(r: &BenchRequest) -> Option<(String, String)> {
    use prefix_picker::request::Api;
    let body = match Api::from_path(r.path) {
        Some(Api::Messages) => model_sim::messages::chat_body(&r.body),
        _ => r.body.clone(),
    };
    let body = serde_json::to_vec(&body).expect("serializable");
    let req = prefix_picker::request::InferenceRequest::parse(&body).ok()?;
    Some((req.model, req.prompt.unwrap_or_default()))
}

/// The hit rate of an infinite cache with perfect routing (one engine sees everything), token
/// weighted, with model-sim's block size: the ceiling any router can reach on this workload.
pub fn ceiling_hit_rate(requests: &[BenchRequest], block_tokens: usize) -> f64 {
    let mut kv = model_sim::kv_cache::KvCache::new(block_tokens, usize::MAX);
    let (mut hits, mut queries) = (0usize, 0usize);
    for r in requests {
        let Some((model, prompt)) = engine_prompt(r) else {
            continue;
        };
        let a = kv.admit(&model, prompt.as_bytes());
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
    fn noisy_neighbour_clients_are_units_naming_their_tenant() {
        let tenant = |name, clients, requests, prompt_tokens| Tenant {
            name,
            clients,
            requests,
            prompt_tokens,
            output_tokens: 8,
        };
        let r = noisy_neighbour(
            &[tenant("heavy", 3, 2, 400), tenant("light", 1, 4, 16)],
            1,
            "m",
        );
        assert_eq!(r.len(), 3 * 2 + 4);
        let of = |t: &str| {
            r.iter()
                .filter(|x| x.headers == [(TENANT_HEADER, t.to_string())])
                .collect::<Vec<_>>()
        };
        assert_eq!(of("heavy").len(), 6);
        assert_eq!(of("light").len(), 4);
        // One unit (conversation) per client: 4 clients, each sent back to back.
        let clients: std::collections::BTreeSet<_> =
            r.iter().map(|x| x.conversation.unwrap()).collect();
        assert_eq!(clients.len(), 4);
        let prompt = |x: &BenchRequest| x.body["prompt"].as_str().unwrap().len();
        assert_eq!(prompt(of("heavy")[0]), 1600);
        assert_eq!(prompt(of("light")[0]), 64);
        // Distinct prompts: no tenant gains from another's cache.
        let distinct: std::collections::BTreeSet<_> =
            r.iter().map(|x| x.body["prompt"].to_string()).collect();
        assert_eq!(distinct.len(), r.len());
    }

    #[test]
    fn objectives_name_the_objective_and_no_flow() {
        let tenant = |name, clients| Tenant {
            name,
            clients,
            requests: 2,
            prompt_tokens: 16,
            output_tokens: 8,
        };
        let r = objectives(&[tenant("batch", 2), tenant("interactive", 1)], 1, "m");
        assert_eq!(r.len(), 6);
        let of = |o: &str| {
            r.iter()
                .filter(|x| x.headers == [(OBJECTIVE_HEADER, o.to_string())])
                .count()
        };
        assert_eq!((of("batch"), of("interactive")), (4, 2));
        // The same requests as noisy_neighbour's, but for the header.
        let n = noisy_neighbour(&[tenant("batch", 2), tenant("interactive", 1)], 1, "m");
        assert!(r.iter().zip(&n).all(|(a, b)| a.body == b.body));
    }

    // Properties of this vocabulary on model-sim's tokenizer and cache (moved from model-sim,
    // which does not know the benchmark's text).
    #[test]
    fn on_the_engine_cache_a_prompt_extending_another_reuses_its_full_blocks() {
        let mut kv = model_sim::kv_cache::KvCache::new(16, 1000);
        let short = text(3, 2000);
        let long = format!("{short} and a question that follows");
        let a = kv.admit("m", short.as_bytes());
        kv.release(&a.pinned);
        let b = kv.admit("m", long.as_bytes());
        // Every full block of the shorter prompt but possibly the one holding its last token.
        let full = a.prompt_tokens / 16;
        assert!(
            b.cached_tokens >= (full - 1) * 16,
            "{a:?} {}",
            b.cached_tokens
        );
        assert!(b.prompt_tokens > a.prompt_tokens);
    }

    #[test]
    fn the_vocabulary_is_about_four_bytes_per_engine_token() {
        let text = text(7, 64 * 1024);
        let per_token = text.len() as f64 / model_sim::tokenizer::count(text.as_bytes()) as f64;
        assert!((3.5..=4.5).contains(&per_token), "{per_token}");
        // The dense engine (`model-sim --tokenizer dense`, the kv-pressure profile's): ~3.2.
        let dense = model_sim::tokenizer::SimTokenizer::Dense.ids(text.as_bytes());
        let per_dense_token = text.len() as f64 / dense.len() as f64;
        assert!((3.0..=3.4).contains(&per_dense_token), "{per_dense_token}");
        // Token boundaries do not line up with 64-byte blocks.
        let ends: Vec<usize> = model_sim::tokenizer::tokenize(text.as_bytes())
            .iter()
            .map(|r| r.end)
            .collect();
        assert!(ends.iter().filter(|e| *e % 64 == 0).count() < ends.len() / 8);
    }

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
mod new_workload_tests {
    use super::*;

    fn messages(r: &BenchRequest) -> &Vec<Value> {
        r.body["messages"].as_array().unwrap()
    }

    fn system(r: &BenchRequest) -> &str {
        messages(r)[0]["content"].as_str().unwrap()
    }

    /// Turns of each conversation, in order.
    fn sessions(w: &[BenchRequest]) -> std::collections::BTreeMap<u32, Vec<&BenchRequest>> {
        let mut out = std::collections::BTreeMap::<u32, Vec<&BenchRequest>>::new();
        for r in w {
            out.entry(r.conversation.unwrap()).or_default().push(r);
        }
        out
    }

    #[test]
    fn a_workload_names_its_model() {
        assert_eq!(model(&shared_prefix(2, 2, 16, 8, 4, 1, "llama")), "llama");
        assert_eq!(model(&[]), "model");
    }

    #[test]
    fn multi_tenant_has_zipf_tenants_and_follow_ups_that_resend_history() {
        let w = multi_tenant(16, 200, 1536, 128, 64, 1.0, 1, "m");
        assert_eq!(
            w.len(),
            multi_tenant(16, 200, 1536, 128, 64, 1.0, 1, "m").len()
        );
        assert_eq!(
            w[5].body,
            multi_tenant(16, 200, 1536, 128, 64, 1.0, 1, "m")[5].body
        );
        let mut per_tenant = [0usize; 16];
        for r in &w {
            let g = r.group.unwrap() as usize;
            per_tenant[g] += 1;
            // ~6 KB system prompts, one per tenant.
            assert_eq!(system(r).len(), 1536 * 4);
        }
        assert!(per_tenant[0] > per_tenant[15] * 4, "{per_tenant:?}");
        assert!(per_tenant.iter().filter(|n| **n > 0).count() >= 14);
        let distinct: std::collections::HashSet<&str> = w.iter().map(system).collect();
        assert!(distinct.len() >= 14);
        let s = sessions(&w);
        assert_eq!(s.len(), 200);
        assert!(s.values().any(|turns| turns.len() == 3));
        for turns in s.values() {
            for pair in turns.windows(2) {
                let (a, b) = (messages(pair[0]), messages(pair[1]));
                assert_eq!(a[..], b[..a.len()], "a follow-up re-sends the history");
                assert_eq!(pair[0].group, pair[1].group);
            }
        }
        let c = ceiling_hit_rate(&w, 16);
        assert!(c > 0.8 && c < 0.97, "{c}");
    }

    #[test]
    fn agent_sessions_share_a_long_preamble_and_grow_append_only() {
        let w = agent_sessions(8, 6, 10 * 1024, 64, 256, 32, 1, "m");
        assert_eq!(w.len(), 48);
        let preamble = system(&w[0]);
        assert!(preamble.len() > 10 * 1024);
        for r in &w {
            assert_eq!(system(r), preamble);
        }
        let s = sessions(&w);
        assert_eq!(s.len(), 8);
        for (id, turns) in &s {
            assert_eq!(turns.len(), 6);
            for pair in turns.windows(2) {
                let (a, b) = (messages(pair[0]), messages(pair[1]));
                assert_eq!(b.len(), a.len() + 2);
                assert_eq!(a[..], b[..a.len()]);
            }
            assert!(turns.iter().all(|r| r.group == Some(*id)));
        }
        // The first turn of each session reuses only the preamble; later turns their history.
        let c = ceiling_hit_rate(&w, 16);
        assert!(c > 0.85 && c < 0.99, "{c}");
    }

    #[test]
    fn hot_prefix_draws_its_share() {
        let w = hot_prefix(16, 1000, 0.5, 1024, 128, 64, 1, "m");
        let hot = w.iter().filter(|r| r.group == Some(0)).count();
        assert!((420..580).contains(&hot), "{hot}");
        for g in 1..16 {
            let n = w.iter().filter(|r| r.group == Some(g)).count();
            assert!((15..60).contains(&n), "{g}: {n}");
        }
        assert!(w.iter().all(|r| r.conversation.is_none()));
        let c = ceiling_hit_rate(&w, 16);
        // 1024 shared of ~1160 tokens, all but 16 first requests.
        assert!(c > 0.8 && c < 0.9, "{c}");
    }

    #[test]
    fn a_ramp_rises_to_its_peak_and_falls_back() {
        let mut requests: Vec<BenchRequest> = (0..600)
            .map(|_| BenchRequest::new("/v1/completions", json!({}), None))
            .collect();
        ramp(&mut requests, 10.0, 110.0);
        let at: Vec<f64> = requests.iter().map(|r| r.at_ms.unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] <= w[1]), "in order");
        // 600 requests at a mean of 60/s: about 10 s.
        assert!((at[599] - 10_000.0).abs() < 200.0, "{}", at[599]);
        // Gaps: ~100 ms at the start (10/s), ~9 ms at the peak (110/s, the middle).
        assert!((at[1] - at[0] - 100.0).abs() < 30.0, "{}", at[1] - at[0]);
        assert!(
            (at[301] - at[300] - 9.1).abs() < 1.0,
            "{}",
            at[301] - at[300]
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
        // The second request can reuse the full 16-token blocks of its first two hash ids.
        let c = ceiling_hit_rate(&w, 16);
        let tokens = |s: &str| model_sim::tokenizer::count(s.as_bytes()) as f64;
        let expected = (tokens(&p1[..4096]) / 16.0).floor() * 16.0 / (tokens(p0) + tokens(p1));
        assert!((c - expected).abs() < 0.02, "{c} vs {expected}");
        assert_eq!(w[0].group, w[1].group);
    }
}

/// One engine restart of a run: engine `engine` restarts once `after` requests have finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    pub after: usize,
    pub engine: usize,
}

/// Every engine restarts once, one at a time, in order, evenly spaced: engine `i` after
/// `(i + 1) / (engines + 1)` of the `requests` (so the first and last stretch run undisturbed).
pub fn restarts(requests: usize, engines: usize) -> Vec<Restart> {
    (0..engines)
        .map(|engine| Restart {
            after: (engine + 1) * requests / (engines + 1),
            engine,
        })
        .collect()
}

/// Open-loop arrival times for `requests`, in order: a rate rising linearly from `low` to
/// `peak` requests/s over the first half of the run and falling back over the second (the run
/// lasts `2 n / (low + peak)` seconds). Request `k` arrives when the expected count reaches
/// `k + 1/2`.
pub fn ramp(requests: &mut [BenchRequest], low: f64, peak: f64) {
    let n = requests.len() as f64;
    let seconds = 2.0 * n / (low + peak).max(1e-9);
    let rate = |t: f64| low + (peak - low) * (1.0 - (2.0 * t / seconds - 1.0).abs());
    let (mut t, mut arrived, step) = (0.0f64, 0.0f64, 1e-4);
    for (k, r) in requests.iter_mut().enumerate() {
        let due = k as f64 + 0.5;
        while arrived < due && t < seconds {
            arrived += rate(t + step / 2.0) * step;
            t += step;
        }
        r.at_ms = Some(t * 1000.0);
    }
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    #[test]
    fn every_engine_restarts_once_one_at_a_time_inside_the_run() {
        let r = restarts(400, 4);
        assert_eq!(
            r.iter().map(|r| r.engine).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            r.iter().map(|r| r.after).collect::<Vec<_>>(),
            vec![80, 160, 240, 320]
        );
        // Strictly increasing, after the start, before the end: never two at once.
        for n in [5, 17, 96, 1000] {
            let r = restarts(n, 4);
            assert!(r[0].after > 0 && r[3].after < n, "{n}: {r:?}");
            assert!(r.windows(2).all(|w| w[0].after < w[1].after), "{n}: {r:?}");
        }
    }
}
