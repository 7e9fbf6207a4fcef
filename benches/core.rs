//! Benchmarks of the scheduling hot path: block hashing, prefix scoring and recording, concurrent
//! recording, and the memory cost of one index entry.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench core` (results: benches/RESULTS.md).
//!
//! - `request_path/{8KiB,220KB}_64pods`: the shipped config's router (affinity mode, 64 pods
//!   each sent 16 prompts) from the chat body's bytes to the pick (parse, render, hash, score,
//!   pick, tentative hold made and dropped); `*_floor`: one validating JSON pass plus one hash
//!   pass over the same body, the work no router can skip, as the in-run yardstick.
//!   `agent_64pods`: an agent turn of about 24 KB (12 tool definitions, tool calls and their
//!   results, an inline image), whose tools, calls and image the affinity mode renders too.
//! - `hash/*`: `BlockChain { 64, 128 }` over an 8 KiB and a 220 KB prompt (only the first 8192
//!   bytes are covered, so both cost the same), plus `220KB_full_coverage` which hashes it all.
//! - `score_record/*`: a default-args `PrefixCache` with 64 pods, each pod's list full (50,000
//!   entries); one score over all 64 candidates plus one record of a fresh 8 KiB prompt that shares
//!   a 2 KiB system prefix with every pod; also score alone, record alone, hash+score+record,
//!   and `next_turn`: a prompt whose first 6 KiB one pod was sent 1,024 prompts earlier (the
//!   router's common case: a 96-block match, 96 entries refreshed and 32 added).
//! - `record_throughput/*`: time per record with 1 thread, and with 2 OS threads recording into
//!   two different pods or into the same pod (`iter_custom`: wall time / records); as a control,
//!   2 threads recording into two separate, equally full indexes (nothing shared but the machine).
//! - `memory_floor/*`: what the record's unavoidable memory traffic costs on this machine, as
//!   a yardstick for `score_record` in the same run. An array as large as the fixture's index
//!   heap; per iteration 256 random 8-byte read-modify-writes (a fresh prompt's record must write
//!   at least one random line per new entry and one per evicted entry: 128 + 128), either with
//!   every address known up front (`independent`: the misses overlap as far as the CPU allows)
//!   or each address computed from the value read before it (`dependent`: one miss at a time).
//! - bytes per entry (not timed): 64 pods x 50,000 entries with distinct prompts (`unshared`),
//!   with half of each list shared by 4 pods (`shared4`), and `unshared` churned on to 3x the
//!   capacity (`unshared_churned_3x`); each built in a child process of this binary so the RSS
//!   delta is not blurred by the benches' own memory; printed before and after the benches,
//!   together with the scheduler fixture's heap per entry after all the benches' records.
//!
//! - `scrape/vllm_metrics_text{,_whole}`: one engine scrape's parse of a vLLM-shaped `/metrics`
//!   (50 KB, `src/pod_metrics/testdata/vllm-metrics.txt`): the families the picker reads cut
//!   out by the line scanner and parsed, against every family parsed (the reference, what the
//!   scrape did before), in the same run; checked equal first.
//!
//! - callgrind mode (not criterion): `PREFIX_PICKER_BENCH_CALLGRIND=200` runs 200 score + record
//!   rounds on the churned fixture inside one function, for
//!   `valgrind --tool=callgrind --toggle-collect='*callgrind_score_record*'` (see RESULTS.md).
//!
//! - `PREFIX_PICKER_BENCH_LIST_LEN=1000` gives the fixture 1,000-entry lists (capacity too), so
//!   the index fits in the CPU caches and the benches measure compute without memory misses. A
//!   filter argument (`cargo bench --bench core -- score_record`) skips the bytes-per-entry pass.
//!
//! Before measuring, each group checks once that what it measures is right (hashes equal a
//! plain reference of the chain, a fresh prompt's scores and record are the known numbers, a
//! recorded body is routed to its pod), so a broken build fails instead of reporting a fast
//! number; these checks also run under `cargo test --benches`.
//!
//! Prompts are words drawn from a fixed vocabulary by seeded RNGs: deterministic, text-like.
//! Under `cargo test --benches` (criterion's test mode) the fixtures are small and the
//! bytes-per-entry pass is skipped.

#[path = "support/text.rs"]
mod text;

use std::cell::OnceCell;
use std::hint::black_box;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use criterion::{BatchSize, Criterion, Throughput};
use prefix_picker::config::Config;
use prefix_picker::endpoints::{EndpointSpec, PodId, Update};
use prefix_picker::hashing::{BlockChain, BlockHash};
use prefix_picker::metrics::{PrefixCacheMetrics, RouterMetrics};
use prefix_picker::prefix_index::{ModelKey, PodHandle, PodSlot, PrefixIndex};
use prefix_picker::routing::{RecordOrigin, Router};
use prefix_picker::scheduler::prefix_cache::{PrefixCache, PrefixCacheArgs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use text::{SYSTEM_BYTES, words};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const PODS: usize = 64;
const CAPACITY: usize = 50_000;
const PROMPT_BYTES: usize = 8 * 1024;
const LONG_PROMPT_BYTES: usize = 220_000;
const SYSTEMS: usize = 8;
const USER_TEXTS: usize = 64;
/// Prompts per thread in `record_throughput`: 600 x 96 fresh blocks > 50,000, so a prompt's
/// blocks have left the pod's list before the pool comes round to it again.
const POOL: usize = 600;
/// Prompts recorded between a conversation's turn and its next one in `next_turn` (1,024 x
/// 128 blocks of other work touch far more memory than the CPU caches hold; 16 prompts per pod
/// leave the earlier turn in its pod's list).
const NEXT_TURN_LAG: usize = 1024;
/// Environment variable that turns this binary into a bytes-per-entry child.
const BPE_ENV: &str = "PREFIX_PICKER_BENCH_BYTES_PER_ENTRY";
/// Environment variable that turns this binary into a callgrind driver running that many
/// score + record iterations (see [`callgrind_driver`]).
const CALLGRIND_ENV: &str = "PREFIX_PICKER_BENCH_CALLGRIND";

/// Fixed text pieces that fresh prompts are assembled from (cheap: a header and two copies).
struct Texts {
    systems: Vec<Vec<u8>>,
    users: Vec<Vec<u8>>,
}

impl Texts {
    fn new() -> Texts {
        Texts {
            systems: (0..SYSTEMS as u64)
                .map(|i| words(1000 + i, SYSTEM_BYTES))
                .collect(),
            users: (0..USER_TEXTS as u64)
                .map(|i| words(2000 + i, PROMPT_BYTES))
                .collect(),
        }
    }

    /// Prompt number `tag`: one of the shared system prompts (exactly 32 blocks), then a user
    /// turn whose header carries `tag`, so every block after the system prompt is new.
    fn prompt_into(&self, tag: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.systems[(tag % SYSTEMS as u64) as usize]);
        writeln!(out, "\n\nUser (request {tag}):").expect("write to a Vec");
        let user = &self.users[(tag.wrapping_mul(7) % USER_TEXTS as u64) as usize];
        let room = PROMPT_BYTES - out.len();
        out.extend_from_slice(&user[..room]);
    }
}

/// The scheduler fixture: a default-args `PrefixCache` whose 64 pod lists are filled.
struct Scheduler {
    cache: PrefixCache,
    pods: Vec<PodHandle>,
    candidates: Vec<PodSlot>,
    texts: Texts,
    next_tag: AtomicU64,
    /// Scorings made (seeds each one's tie-break, as the scheduler's counter does).
    scorings: AtomicU64,
}

impl Scheduler {
    fn build(fill: usize) -> Scheduler {
        let started = Instant::now();
        let cache = PrefixCache::new(
            PrefixCacheArgs {
                max_hash_cache_size: fill,
                ..PrefixCacheArgs::default()
            },
            42,
        );
        let pods: Vec<PodHandle> = (0..PODS).map(|_| cache.index().add_pod()).collect();
        let candidates = pods.iter().map(PodHandle::slot).collect();
        let s = Scheduler {
            cache,
            pods,
            candidates,
            texts: Texts::new(),
            next_tag: AtomicU64::new(0),
            scorings: AtomicU64::new(0),
        };
        let index = s.cache.index();
        let mut prompt = Vec::with_capacity(PROMPT_BYTES);
        for pod in &s.pods {
            while index.pod_entries(pod.slot()) < fill {
                s.texts.prompt_into(s.tag(), &mut prompt);
                s.cache.record(MODEL, &s.cache.hash(MODEL, &prompt), pod);
            }
        }
        eprintln!(
            "fixture: {} pods, {} entries ({} distinct), heap {:.1} B/entry, filled in {:.1?}",
            PODS,
            index.entries(),
            index.distinct_entries(),
            index.heap_bytes() as f64 / index.entries() as f64,
            started.elapsed()
        );
        s.check();
        s
    }

    /// Checks, before any measurement, what the benches on this fixture measure: a fresh
    /// prompt's hashes are the reference chain's; its score finds the 32-block system prompt on
    /// exactly `topKMatches` pods (25 each, an explicit 0 elsewhere); recording it for the best
    /// pod inserts its new blocks, after which that pod alone scores 100.
    fn check(&self) {
        let prompt = self.fresh_prompt();
        let hashes = self.cache.hash(MODEL, &prompt);
        assert_eq!(hashes, reference_chain(MODEL, &prompt, 64, 128), "hashes");
        let scored = self
            .cache
            .score(MODEL, &hashes, &self.candidates, self.scoring())
            .expect("scores");
        assert_eq!(scored.total_blocks, 128);
        let top_k = PrefixCacheArgs::default().top_k_matches;
        let mut scores = scored.scores.clone();
        scores.sort_unstable();
        let mut expected = vec![0; PODS - top_k];
        expected.extend(std::iter::repeat_n(25, top_k));
        assert_eq!(scores, expected, "a fresh prompt's scores");
        // 96 new blocks; up to 128 when the pod's list is so short (test mode) that the record
        // evicts the system prompt's blocks before it refreshes them.
        let inserted = self.score_then_record(&hashes);
        assert!(
            (96..=128).contains(&inserted),
            "{inserted} entries inserted"
        );
        let again = self
            .cache
            .score(MODEL, &hashes, &self.candidates, self.scoring())
            .expect("scores");
        assert_eq!(
            again.scores.iter().filter(|&&x| x == 100).count(),
            1,
            "the recorded pod alone holds the whole prompt: {:?}",
            again.scores
        );
    }

    fn scoring(&self) -> u64 {
        self.scorings.fetch_add(1, Ordering::Relaxed)
    }

    fn tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    fn fresh_prompt(&self) -> Vec<u8> {
        let mut prompt = Vec::with_capacity(PROMPT_BYTES);
        self.texts.prompt_into(self.tag(), &mut prompt);
        prompt
    }

    fn fresh_hashes(&self) -> Vec<BlockHash> {
        self.cache.hash(MODEL, &self.fresh_prompt())
    }

    /// Score over all pods, then record for the best-scored pod (the pick, without other plugins).
    fn score_then_record(&self, hashes: &[BlockHash]) -> usize {
        let scored = self
            .cache
            .score(MODEL, hashes, &self.candidates, self.scoring())
            .expect("non-empty prompt");
        let best = (0..scored.scores.len())
            .max_by_key(|&i| (scored.scores[i], std::cmp::Reverse(i)))
            .expect("candidates");
        self.cache.record(MODEL, hashes, &self.pods[best]).inserted
    }
}

/// The Kthena block chain written plainly (hashing.rs's header): `prev = XXH64(model)`, then
/// per block of `block_size` bytes (the last may be shorter), at most `max_blocks`:
/// `prev = XXH64(decimal(prev) ++ block)`.
fn reference_chain(
    model: &str,
    prompt: &[u8],
    block_size: usize,
    max_blocks: usize,
) -> Vec<BlockHash> {
    let mut prev = xxhash_rust::xxh64::xxh64(model.as_bytes(), 0);
    prompt
        .chunks(block_size)
        .take(max_blocks)
        .map(|block| {
            let mut text = prev.to_string().into_bytes();
            text.extend_from_slice(block);
            prev = xxhash_rust::xxh64::xxh64(&text, 0);
            BlockHash(prev)
        })
        .collect()
}

fn bench_hash(c: &mut Criterion) {
    let short = words(1, PROMPT_BYTES);
    let long = words(2, LONG_PROMPT_BYTES);
    let default_chain = BlockChain {
        block_size: 64,
        max_blocks: 128,
    };
    let full_chain = BlockChain {
        block_size: 64,
        max_blocks: LONG_PROMPT_BYTES.div_ceil(64),
    };
    let mut g = c.benchmark_group("hash");
    for (name, chain, prompt) in [
        ("8KiB", default_chain, &short),
        ("220KB", default_chain, &long),
        ("220KB_full_coverage", full_chain, &long),
    ] {
        assert_eq!(
            chain.hash(MODEL, prompt),
            reference_chain(MODEL, prompt, chain.block_size, chain.max_blocks),
            "hash/{name}: the chain differs from the reference"
        );
        g.throughput(Throughput::Bytes(prompt.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| chain.hash(black_box(MODEL), black_box(prompt)))
        });
    }
    g.finish();
}

/// An agent turn: 12 tool definitions, a system prompt, a user turn with an inline image, then
/// three rounds of an assistant tool call and its result.
fn agent_body(seed: u64) -> Vec<u8> {
    let prose = |seed: u64, len: usize| String::from_utf8(words(seed, len)).expect("ASCII");
    let tools: Vec<serde_json::Value> = (0..12)
        .map(|i| {
            serde_json::json!({"type": "function", "function": {
                "name": format!("tool_{i}"), "description": prose(300 + i, 160),
                "parameters": {"type": "object", "required": ["query"], "properties": {
                    "query": {"type": "string", "description": prose(400 + i, 80)},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "mode": {"type": "string", "enum": ["fast", "exact", "fuzzy"]}}}}})
        })
        .collect();
    let image = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(600));
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": prose(7, SYSTEM_BYTES)}),
        serde_json::json!({"role": "user", "content": [
            {"type": "text", "text": prose(seed, 1024)},
            {"type": "image_url", "image_url": {"url": image, "detail": "high"}}]}),
    ];
    for round in 0..3 {
        let id = format!("call_{round}");
        messages.push(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": format!("tool_{round}"),
            "arguments": format!("{{\"query\":\"{}\",\"limit\":10}}", prose(seed + round, 40))}}]}),
        );
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": id,
            "content": prose(seed + 10 + round, 1500)}));
    }
    serde_json::to_vec(
        &serde_json::json!({"model": MODEL, "tools": tools, "messages": messages,
        "temperature": 0.2, "max_tokens": 512}),
    )
    .expect("serializable")
}

/// An agent conversation in Anthropic's Messages shape of about `bytes` (12 tools, a system
/// prompt, then rounds of a `tool_use` and its `tool_result`), and the chat-completions body
/// vLLM serves it as (`prompt::messages`): the same content in the two shapes.
fn messages_and_chat_bodies(seed: u64, bytes: usize) -> (Vec<u8>, Vec<u8>) {
    use prefix_picker::prompt::messages::{canonical_arguments, chat_form, chat_tools};
    let prose = |seed: u64, len: usize| String::from_utf8(words(seed, len)).expect("ASCII");
    let tools: Vec<serde_json::Value> = (0..12)
        .map(|i| {
            serde_json::json!({"name": format!("tool_{i}"), "description": prose(300 + i, 160),
                "input_schema": {"type": "object", "required": ["query"], "properties": {
                    "query": {"type": "string", "description": prose(400 + i, 80)},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50}}}})
        })
        .collect();
    let mut messages = vec![serde_json::json!({"role": "user", "content": prose(seed, 1024)})];
    let mut size = 0;
    let mut round = 0u64;
    while size < bytes {
        let id = format!("toolu_{round}");
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "text", "text": prose(seed + 50 + round, 120)},
            {"type": "tool_use", "id": id, "name": format!("tool_{}", round % 12),
             "input": {"query": prose(seed + round, 40), "limit": 10}}]}));
        messages.push(serde_json::json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": id, "content": [{"type": "text", "text": prose(seed + 10 + round, 1500)}]}]}));
        round += 1;
        let body = serde_json::json!({"model": MODEL, "max_tokens": 512, "tools": tools,
            "system": [{"type": "text", "text": prose(7, SYSTEM_BYTES),
                "cache_control": {"type": "ephemeral"}}], "messages": messages});
        size = serde_json::to_vec(&body).expect("serializable").len();
    }
    let anthropic = serde_json::json!({"model": MODEL, "max_tokens": 512, "tools": tools,
        "system": [{"type": "text", "text": prose(7, SYSTEM_BYTES),
            "cache_control": {"type": "ephemeral"}}], "messages": messages});
    let chat = serde_json::json!({"model": MODEL, "max_tokens": 512,
        "tools": chat_tools(anthropic.get("tools")),
        "messages": chat_form(anthropic.get("system"), &messages, canonical_arguments)});
    (
        serde_json::to_vec(&anthropic).expect("serializable"),
        serde_json::to_vec(&chat).expect("serializable"),
    )
}

/// The shipped config's router (affinity mode) over 64 static pods, each sent 16 prompts.
fn shipped_router() -> Router {
    let local = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/local/config.yaml"),
    )
    .expect("the shipped config");
    let mut doc = local[..local.find("endpoints:").expect("endpoints")].to_string();
    doc.push_str("endpoints:\n");
    for i in 0..PODS {
        doc.push_str(&format!(
            "- {{name: pod-{i}, address: 10.0.{}.{}:8000}}\n",
            i / 200,
            i % 200 + 1
        ));
    }
    doc.push_str(&local[local.find("\npicker:").expect("picker section")..]);
    let config = Config::parse(&doc).expect("valid");
    let router = Router::assemble(
        config.scheduler,
        config.picker,
        PrefixCacheMetrics::unregistered(),
        RouterMetrics::register(&prometheus::Registry::new()),
    );
    let specs = config
        .endpoints
        .iter()
        .map(|e| EndpointSpec {
            id: PodId {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
            },
            address: e.address,
            models: vec![],
            generation: String::new(),
            role: None,
            labels: Default::default(),
            kv_events: None,
            containers_started: None,
            engine_started: None,
        })
        .collect();
    router.endpoints.apply(Update::Reset(specs));
    for i in 0..(PODS * 16) as u64 {
        let routed = router
            .route(
                "/v1/chat/completions",
                Some(&text::chat_body(MODEL, 1000 + i, PROMPT_BYTES)),
                None,
            )
            .expect("routed");
        let (d, t) = (routed.decision, routed.ticket);
        router.record(&t.model, &t.hashes, d.primary(), RecordOrigin::Local);
    }
    router
}

/// Checks the routing of a `bytes`-sized body, before measuring: another body of that size
/// (the same shared system prompt) is hashed, its pod holds only part of it; once recorded
/// for that pod, the body is routed there again, predicted to be held whole.
fn check_request_path(router: &Router, bytes: usize) {
    let body = text::chat_body(MODEL, 90_000 + bytes as u64, bytes);
    let route = || {
        router
            .explain("/v1/chat/completions", Some(&body), None)
            .expect("routed")
    };
    let first = route().decision;
    let blocks = first.hashes.len();
    assert!(blocks > 0, "request_path/{bytes}: the prompt was hashed");
    assert!(
        first.predicted_blocks < blocks,
        "request_path/{bytes}: a new body is not held whole"
    );
    router.record(MODEL, &first.hashes, first.primary(), RecordOrigin::Local);
    let again = route().decision;
    assert_eq!(again.hashes, first.hashes);
    assert_eq!(
        (again.primary().label.as_str(), again.predicted_blocks),
        (first.primary().label.as_str(), blocks),
        "request_path/{bytes}: a recorded body goes back to its pod, held whole"
    );
}

/// `request_path/*`: parse + render + hash + score + pick from the body bytes, with the
/// shipped config (the tentative hold made and released), and the floor for the same body:
/// one validating JSON pass plus one hash pass over the prompt's bytes.
fn bench_request_path(c: &mut Criterion) {
    let router = shipped_router();
    let mut g = c.benchmark_group("request_path");
    for (name, bytes) in [
        ("8KiB_64pods", PROMPT_BYTES),
        ("220KB_64pods", LONG_PROMPT_BYTES),
    ] {
        check_request_path(&router, bytes);
        let body = text::chat_body(MODEL, 9, bytes);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                router
                    .route("/v1/chat/completions", Some(black_box(&body)), None)
                    .expect("routed")
            })
        });
        g.bench_function(format!("{name}_floor"), |b| {
            b.iter(|| {
                let v: serde::de::IgnoredAny =
                    serde_json::from_slice(black_box(&body)).expect("valid JSON");
                black_box(v);
                xxhash_rust::xxh64::xxh64(black_box(&body), 0)
            })
        });
    }
    let body = agent_body(9);
    let hashes = |body: &[u8]| {
        let explained = router.explain("/v1/chat/completions", Some(body), None);
        explained.expect("routed").decision.hashes
    };
    let other_image = String::from_utf8(body.clone())
        .expect("UTF-8")
        .replacen("iVBOR", "iVBOX", 1);
    let (a, b) = (hashes(&body), hashes(other_image.as_bytes()));
    assert!(
        a.len() > 32 && a[..16] == b[..16] && a[a.len() - 1] != b[b.len() - 1],
        "request_path/agent: hashed, the image's tail differs"
    );
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("agent_64pods", |b| {
        b.iter(|| {
            router
                .route("/v1/chat/completions", Some(black_box(&body)), None)
                .expect("routed")
        })
    });
    // The same 64 KiB agent conversation as an Anthropic Messages body and as the chat body
    // vLLM serves it as: they hash alike, and the Messages request path is measured against
    // the chat one.
    let (messages, chat) = messages_and_chat_bodies(9, 64 << 10);
    let hashes = |path: &str, body: &[u8]| {
        let explained = router.explain(path, Some(body), None);
        explained.expect("routed").decision.hashes
    };
    assert_eq!(
        hashes("/v1/messages", &messages),
        hashes("/v1/chat/completions", &chat),
        "request_path/messages: a Messages body hashes as its chat form"
    );
    for (name, path, body) in [
        ("messages_64KiB_64pods", "/v1/messages", &messages),
        (
            "messages_as_chat_64KiB_64pods",
            "/v1/chat/completions",
            &chat,
        ),
    ] {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                router
                    .route(path, Some(black_box(body)), None)
                    .expect("routed")
            })
        });
    }
    g.finish();
}

/// `scrape/*`: an engine scrape's parse, the families read only against every family.
fn bench_scrape(c: &mut Criterion) {
    use prefix_picker::pod_metrics::{names::SignalSpecs, parse_whole_with, parse_with};
    let text = include_str!("../src/pod_metrics/testdata/vllm-metrics.txt");
    let names = SignalSpecs::default();
    let whole = parse_whole_with(text, &names).expect("parses");
    assert_eq!(parse_with(text, &names).expect("parses"), whole);
    assert!(whole.missing.is_empty() && whole.ttft.count > 0);
    let mut g = c.benchmark_group("scrape");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("vllm_metrics_text", |b| {
        b.iter(|| parse_with(black_box(text), &names).expect("parses"))
    });
    g.bench_function("vllm_metrics_text_whole", |b| {
        b.iter(|| parse_whole_with(black_box(text), &names).expect("parses"))
    });
    g.finish();
}

fn bench_score_record(c: &mut Criterion, sched: &OnceCell<Scheduler>, fill: usize) {
    let mut g = c.benchmark_group("score_record");
    g.throughput(Throughput::Elements(1));
    g.bench_function("8KiB_64pods", |b| {
        let s = sched.get_or_init(|| Scheduler::build(fill));
        b.iter_batched(
            || s.fresh_hashes(),
            |hashes| s.score_then_record(&hashes),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("8KiB_64pods_score_only", |b| {
        let s = sched.get_or_init(|| Scheduler::build(fill));
        b.iter_batched(
            || s.fresh_hashes(),
            |hashes| s.cache.score(MODEL, &hashes, &s.candidates, s.scoring()),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("8KiB_64pods_record_only", |b| {
        let s = sched.get_or_init(|| Scheduler::build(fill));
        let mut next = 0usize;
        b.iter_batched(
            || s.fresh_hashes(),
            |hashes| {
                next = (next + 1) % PODS;
                s.cache.record(MODEL, &hashes, &s.pods[next])
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("8KiB_64pods_next_turn", |b| {
        // A conversation's next turn: the first 6 KiB of the prompt were sent to one pod
        // NEXT_TURN_LAG prompts ago (so they have left the CPU caches since), the last 2 KiB are
        // new. The score finds a 96-block match; the record refreshes 96 entries and adds 32.
        let s = sched.get_or_init(|| Scheduler::build(fill));
        let mut earlier = std::collections::VecDeque::with_capacity(NEXT_TURN_LAG);
        let mut pod = 0usize;
        let mut send_earlier = |earlier: &mut std::collections::VecDeque<Vec<u8>>| {
            let prompt = s.fresh_prompt();
            pod = (pod + 1) % PODS;
            s.cache
                .record(MODEL, &s.cache.hash(MODEL, &prompt), &s.pods[pod]);
            earlier.push_back(prompt);
        };
        while earlier.len() < NEXT_TURN_LAG {
            send_earlier(&mut earlier);
        }
        b.iter_batched(
            || {
                send_earlier(&mut earlier);
                let mut prompt = earlier.pop_front().expect("earlier prompts");
                prompt.truncate(PROMPT_BYTES * 3 / 4);
                prompt.extend_from_slice(&s.fresh_prompt()[PROMPT_BYTES * 3 / 4..]);
                s.cache.hash(MODEL, &prompt)
            },
            |hashes| s.score_then_record(&hashes),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("8KiB_64pods_hash_score_record", |b| {
        let s = sched.get_or_init(|| Scheduler::build(fill));
        b.iter_batched(
            || s.fresh_prompt(),
            |prompt| s.score_then_record(&s.cache.hash(MODEL, &prompt)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// Random lines touched per `memory_floor` iteration: one per new and one per evicted entry of a
/// fresh 128-block record.
const FLOOR_LINES: usize = 256;

/// `memory_floor/*`: random read-modify-writes over an array the size of the fixture's index.
fn bench_memory_floor(c: &mut Criterion, sched: &OnceCell<Scheduler>, fill: usize) {
    let s = sched.get_or_init(|| Scheduler::build(fill));
    let words = (s.cache.index().heap_bytes() / 8).max(FLOOR_LINES * 8);
    let mut array = vec![1u64; words];
    let mut rng = SmallRng::seed_from_u64(7);
    // Enough addresses that the pool itself is not what the CPU caches keep.
    let pool: Vec<u32> = (0..(1 << 20))
        .map(|_| rng.random_range(0..words as u32))
        .collect();
    let mut g = c.benchmark_group("memory_floor");
    g.throughput(Throughput::Elements(1));
    let mut at = 0usize;
    g.bench_function("independent", |b| {
        b.iter(|| {
            at = (at + FLOOR_LINES) % (pool.len() - FLOOR_LINES);
            for &i in &pool[at..at + FLOOR_LINES] {
                let w = &mut array[i as usize];
                *w = w.wrapping_add(1);
            }
        })
    });
    let mut next = 0u64;
    g.bench_function("dependent", |b| {
        b.iter(|| {
            for _ in 0..FLOOR_LINES {
                let i = (next % words as u64) as usize;
                let w = &mut array[i];
                *w = w.wrapping_add(1);
                // The next address depends on the value just read.
                next = (next ^ *w)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .rotate_left(29);
            }
        })
    });
    g.finish();
}

/// Per-thread prompt pools and cursors for `record_throughput`.
struct Pools {
    hashes: [Vec<Vec<BlockHash>>; 2],
    cursors: [AtomicUsize; 2],
}

impl Pools {
    fn new(s: &Scheduler) -> Pools {
        let pool = || (0..POOL).map(|_| s.fresh_hashes()).collect::<Vec<_>>();
        Pools {
            hashes: [pool(), pool()],
            cursors: [AtomicUsize::new(0), AtomicUsize::new(0)],
        }
    }
}

/// `iters` records split over `workers.len()` threads: thread `t` records pool `t` into pod
/// `workers[t].1` of fixture `workers[t].0`. Returns the wall time from the common start to the
/// last thread's end, so criterion reports wall time per record.
fn run_records(workers: &[(&Scheduler, usize)], pools: &Pools, iters: u64) -> Duration {
    let threads = workers.len() as u64;
    let barrier = Barrier::new(workers.len() + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter()
            .enumerate()
            .map(|(t, &(s, pod))| {
                let n = iters / threads + u64::from((t as u64) < iters % threads);
                let barrier = &barrier;
                scope.spawn(move || {
                    let pool = &pools.hashes[t];
                    let pod = &s.pods[pod];
                    let mut cursor = pools.cursors[t].load(Ordering::Relaxed);
                    barrier.wait();
                    for _ in 0..n {
                        black_box(s.cache.record(MODEL, &pool[cursor % pool.len()], pod));
                        cursor += 1;
                    }
                    pools.cursors[t].store(cursor, Ordering::Relaxed);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for handle in handles {
            handle.join().expect("record thread");
        }
        start.elapsed()
    })
}

fn bench_record_throughput(c: &mut Criterion, sched: &OnceCell<Scheduler>, fill: usize) {
    let pools: OnceCell<Pools> = OnceCell::new();
    // A second, independent filled index: the control for "is it the index or the machine?".
    let other: OnceCell<Scheduler> = OnceCell::new();
    let mut g = c.benchmark_group("record_throughput");
    g.throughput(Throughput::Elements(1));
    let (a, b) = (PODS - 2, PODS - 1);
    for name in [
        "1_thread",
        "2_threads",
        "2_threads_same_pod",
        "2_threads_separate_indexes",
    ] {
        g.bench_function(name, |bencher| {
            let s = sched.get_or_init(|| Scheduler::build(fill));
            let pools = pools.get_or_init(|| Pools::new(s));
            let workers: Vec<(&Scheduler, usize)> = match name {
                "1_thread" => vec![(s, a)],
                "2_threads" => vec![(s, a), (s, b)],
                "2_threads_same_pod" => vec![(s, a), (s, a)],
                _ => vec![(s, a), (other.get_or_init(|| Scheduler::build(fill)), a)],
            };
            bencher.iter_custom(|iters| run_records(&workers, pools, iters))
        });
    }
    g.finish();
}

// ---- bytes per entry -------------------------------------------------------------------------

/// Resident set size in bytes (`/proc/self/statm`, resident pages x 4096).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Child mode: builds one 64 pods x 50,000 entries index and prints its cost per entry.
/// `unshared`: every prompt distinct (every entry held by one pod). `shared4`: pods in groups of
/// four get the same first 4 KiB and their own last 4 KiB, so half of each list is shared by 4.
/// `unshared_churned`: `unshared`, then recorded on until each pod inserted 3x its capacity.
fn bytes_per_entry_child(kind: &str) {
    let users: Vec<Vec<u8>> = (0..USER_TEXTS as u64)
        .map(|i| words(3000 + i, PROMPT_BYTES))
        .collect();
    let chain = BlockChain {
        block_size: 64,
        max_blocks: 128,
    };
    let model = ModelKey::of(MODEL);
    let mut prompt: Vec<u8> = Vec::with_capacity(PROMPT_BYTES + 64);
    let mut hashes: Vec<BlockHash> = Vec::with_capacity(128);
    let fill = |prompt: &mut Vec<u8>, user: u64, len: usize| {
        let user = &users[(user % USER_TEXTS as u64) as usize];
        let room = len - prompt.len();
        prompt.extend_from_slice(&user[..room]);
    };
    // `PREFIX_PICKER_BENCH_CHURN=10` churns longer (default 3 x capacity).
    let churn = std::env::var("PREFIX_PICKER_BENCH_CHURN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(3);
    let index = PrefixIndex::new(CAPACITY);
    let before = rss_bytes().unwrap_or(0);
    let started = Instant::now();
    let pods: Vec<PodHandle> = (0..PODS).map(|_| index.add_pod()).collect();
    match kind {
        "unshared" | "unshared_churned" => {
            // `unshared_churned` keeps recording until each pod inserted `churn` x its capacity
            // (most of it evicted again: closer to the steady state of a long-running server).
            let inserts = if kind == "unshared" {
                0
            } else {
                churn * CAPACITY
            };
            // Round-robin over the pods, as a server's traffic would interleave them.
            let mut inserted = vec![0usize; PODS];
            for n in 0u64.. {
                let mut busy = false;
                for (p, pod) in pods.iter().enumerate() {
                    if index.pod_entries(pod.slot()) >= CAPACITY && inserted[p] >= inserts {
                        continue;
                    }
                    busy = true;
                    prompt.clear();
                    writeln!(prompt, "Conversation {p}-{n}").expect("write to a Vec");
                    fill(&mut prompt, n + p as u64, PROMPT_BYTES);
                    chain.hash_into(MODEL, &prompt, &mut hashes);
                    inserted[p] += index.record(pod, model, &hashes).inserted;
                }
                if !busy {
                    break;
                }
            }
        }
        "shared4" => {
            for (g, group) in pods.chunks(4).enumerate() {
                let mut n = 0u64;
                while group
                    .iter()
                    .any(|pod| index.pod_entries(pod.slot()) < CAPACITY)
                {
                    for (i, pod) in group.iter().enumerate() {
                        prompt.clear();
                        writeln!(prompt, "Conversation {g}-{n}").expect("write to a Vec");
                        fill(&mut prompt, n + g as u64, PROMPT_BYTES / 2);
                        write!(prompt, "\nPod {i} turn {n}: ").expect("write to a Vec");
                        fill(&mut prompt, n + 31 * (i as u64 + 1), PROMPT_BYTES);
                        chain.hash_into(MODEL, &prompt, &mut hashes);
                        index.record(pod, model, &hashes);
                    }
                    n += 1;
                }
            }
        }
        other => panic!("unknown bytes-per-entry kind {other:?}"),
    }
    let after = rss_bytes().unwrap_or(0);
    let entries = index.entries();
    let distinct = index.distinct_entries();
    let heap = index.heap_bytes();
    let kind = match kind {
        "unshared_churned" => format!("unshared_churned_{churn}x"),
        other => other.to_string(),
    };
    println!(
        "bytes_per_entry {kind} heap={:.1} rss={:.1} (entries={entries} distinct={distinct} \
         heap_bytes={heap} rss_delta={} heap_per_distinct={:.1} built_in={:.1?})",
        heap as f64 / entries as f64,
        after.saturating_sub(before) as f64 / entries as f64,
        after.saturating_sub(before),
        heap as f64 / distinct as f64,
        started.elapsed(),
    );
}

/// Runs the bytes-per-entry builds in child processes and returns their report lines.
fn bytes_per_entry_report() -> Vec<String> {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return vec![format!("bytes_per_entry skipped: no current_exe ({e})")],
    };
    ["unshared", "shared4", "unshared_churned"]
        .iter()
        .map(
            |kind| match Command::new(&exe).env(BPE_ENV, kind).output() {
                Ok(out) if out.status.success() => {
                    String::from_utf8_lossy(&out.stdout).trim().to_string()
                }
                Ok(out) => format!(
                    "bytes_per_entry {kind} failed: {} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => format!("bytes_per_entry {kind} failed to start: {e}"),
            },
        )
        .collect()
}

// ---- summary ---------------------------------------------------------------------------------

fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        PathBuf::from(home)
    } else if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(target).join("criterion")
    } else {
        PathBuf::from("target/criterion")
    }
}

/// Median (ns) of a benchmark measured by this run (estimates written after `since`).
fn median_ns(id: &str, since: SystemTime) -> Option<f64> {
    let path = criterion_dir().join(id).join("new/estimates.json");
    let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
    if modified < since {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn print_summary(since: SystemTime) {
    println!("\n== summary (criterion medians of this run) ==");
    let bytes = [
        ("hash/8KiB", PROMPT_BYTES),
        ("hash/220KB", LONG_PROMPT_BYTES),
        ("hash/220KB_full_coverage", LONG_PROMPT_BYTES),
    ];
    for (id, len) in bytes {
        if let Some(ns) = median_ns(id, since) {
            println!(
                "{id:<45} {:>10.3} us  {:>8.1} MiB/s of prompt",
                ns / 1e3,
                len as f64 / (ns / 1e9) / (1024.0 * 1024.0)
            );
        }
    }
    for id in [
        "score_record/8KiB_64pods",
        "score_record/8KiB_64pods_score_only",
        "score_record/8KiB_64pods_record_only",
        "score_record/8KiB_64pods_next_turn",
        "score_record/8KiB_64pods_hash_score_record",
        "record_throughput/1_thread",
        "record_throughput/2_threads",
        "record_throughput/2_threads_same_pod",
        "record_throughput/2_threads_separate_indexes",
        "memory_floor/independent",
        "memory_floor/dependent",
        "scrape/vllm_metrics_text",
        "scrape/vllm_metrics_text_whole",
    ] {
        if let Some(ns) = median_ns(id, since) {
            println!("{id:<45} {:>10.3} us  {:>8.0} /s", ns / 1e3, 1e9 / ns);
        }
    }
    if let (Some(read), Some(whole)) = (
        median_ns("scrape/vllm_metrics_text", since),
        median_ns("scrape/vllm_metrics_text_whole", since),
    ) {
        println!(
            "scrape/vllm_metrics_text ratio to _whole = {:.3} (families read only / every family \
             parsed)",
            read / whole
        );
    }
    let one = median_ns("record_throughput/1_thread", since);
    for two in [
        "2_threads",
        "2_threads_same_pod",
        "2_threads_separate_indexes",
    ] {
        match (one, median_ns(&format!("record_throughput/{two}"), since)) {
            (Some(one), Some(t)) => println!(
                "record_throughput ratio 1_thread/{two} = {:.2} (records per second with 2 threads \
                 / with 1 thread; 2.00 would be perfect scaling)",
                one / t
            ),
            _ => println!("record_throughput ratio 1_thread/{two}: not measured in this run"),
        }
    }
    for floor in ["independent", "dependent"] {
        if let (Some(work), Some(f)) = (
            median_ns("score_record/8KiB_64pods", since),
            median_ns(&format!("memory_floor/{floor}"), since),
        ) {
            println!(
                "score_record/8KiB_64pods ratio to memory_floor/{floor} = {:.2} ({FLOOR_LINES} \
                 random read-modify-writes over an index-sized array)",
                work / f
            );
        }
    }
}

// ---- callgrind ---------------------------------------------------------------------------------

/// Callgrind mode: builds the full `score_record` fixture, churns it with 2,000 score + record
/// rounds (its steady state), then runs `iterations` more inside [`callgrind_score_record`], the
/// only function counted with
/// `valgrind --tool=callgrind --toggle-collect='*callgrind_score_record*'`. Instruction counts
/// (and simulated cache misses) are repeatable where wall time on a shared machine is not.
fn callgrind_driver(iterations: usize) {
    let s = Scheduler::build(CAPACITY);
    let warm: Vec<Vec<BlockHash>> = (0..2_000).map(|_| s.fresh_hashes()).collect();
    for hashes in &warm {
        s.score_then_record(hashes);
    }
    let work: Vec<Vec<BlockHash>> = (0..iterations).map(|_| s.fresh_hashes()).collect();
    let inserted = callgrind_score_record(&s, &work);
    println!("callgrind: {iterations} score + record rounds, {inserted} entries inserted");
}

#[inline(never)]
fn callgrind_score_record(s: &Scheduler, work: &[Vec<BlockHash>]) -> usize {
    work.iter().map(|hashes| s.score_then_record(hashes)).sum()
}

fn main() {
    if let Ok(kind) = std::env::var(BPE_ENV) {
        bytes_per_entry_child(&kind);
        return;
    }
    if let Some(n) = std::env::var(CALLGRIND_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        callgrind_driver(n);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // Real measurements only under `cargo bench` (criterion's own test/list modes stay quick).
    let measuring = has("--bench") && !has("--test") && !has("--list");
    let since = SystemTime::now();

    // A filter argument (`cargo bench --bench core -- score_record`) runs only those benches.
    let filtered = args.iter().skip(1).any(|a| !a.starts_with('-'));
    let bpe = if measuring && !filtered {
        let lines = bytes_per_entry_report();
        for line in &lines {
            println!("{line}");
        }
        lines
    } else {
        Vec::new()
    };

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    // `PREFIX_PICKER_BENCH_LIST_LEN=1000` shrinks the fixture's lists (and their capacity) so the
    // index fits in the CPU caches: the same benches then measure compute without memory misses.
    let fill = match std::env::var("PREFIX_PICKER_BENCH_LIST_LEN") {
        Ok(len) => len
            .parse()
            .expect("PREFIX_PICKER_BENCH_LIST_LEN: a number of entries"),
        Err(_) if measuring => CAPACITY,
        Err(_) => 1_000,
    };
    let sched: OnceCell<Scheduler> = OnceCell::new();
    bench_hash(&mut c);
    bench_request_path(&mut c);
    bench_scrape(&mut c);
    bench_score_record(&mut c, &sched, fill);
    bench_record_throughput(&mut c, &sched, fill);
    bench_memory_floor(&mut c, &sched, fill);
    c.final_summary();

    if let Some(s) = sched.get() {
        let index = s.cache.index();
        println!(
            "\nbytes_per_entry fixture_after_benches heap={:.1} (entries={} distinct={} \
             heap_bytes={} prompts recorded since the start={})",
            index.heap_bytes() as f64 / index.entries() as f64,
            index.entries(),
            index.distinct_entries(),
            index.heap_bytes(),
            s.next_tag.load(Ordering::Relaxed),
        );
    }
    if measuring {
        print_summary(since);
        println!();
        for line in &bpe {
            println!("{line}");
        }
    }
}
