//! Engine truth's costs: decoding a batch of KV events, applying KV events to a pod's engine view (block events per second on
//! one core, at a steady size; also with 64 holds in flight awaiting blocks from it), matching a request against it, hashing a prompt's tokens, the
//! request path's head lookup, the `file` tokenizer source's cold cost (chat template rendered
//! and encoded; the template alone; the bare `tokenizers` encode of the rendered text, the
//! crate's floor; of that, the byte-level pre-tokenizer alone and its GPT-2 regex alone) at
//! 2 KB, 8 KiB and 220 KB, and the view's memory per block.
//!
//! `cargo bench --bench engine_truth`; the memory line is printed after the criterion groups.
//! Under `cargo test --benches` the fixtures are small.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use prefix_picker::engine_view::{EngineView, token_chain};
use prefix_picker::kv_events::{Limits, decode_batch};
use prefix_picker::metrics::engine_truth::EngineTruthMetrics;
use prefix_picker::request::Api;
use prefix_picker::tokenizer::TokenizeInput;
use prefix_picker::tokenizer::chat_template::ChatTemplate;
use prefix_picker::tokenizer::file::FileSource;
use prefix_picker::tokenizer::heads::{HeadTokens, TokenizerSection};

const BLOCK: usize = 16;
/// Blocks per `BlockStored` (vLLM stores a prefill's new full blocks in one event).
const BATCH: usize = 16;

/// A view holding `blocks` blocks (chains of 64), and the engine hash to continue from.
fn filled(blocks: usize) -> (EngineView, u64) {
    let view = EngineView::new(blocks * 2);
    let mut next = 1u64;
    let tokens: Vec<u32> = (0..(64 * BLOCK) as u32).collect();
    while view.blocks() < blocks {
        let hashes: Vec<u64> = (next..next + 64).collect();
        // A distinct first token per chain, so chains do not share blocks.
        let mut t = tokens.clone();
        t[0] = next as u32;
        view.store(None, &hashes, &t, BLOCK);
        next += 64;
    }
    (view, next)
}

fn bench_ingest(c: &mut Criterion, size: usize, waits: usize) {
    let mut g = c.benchmark_group("engine_view");
    let (view, mut next) = filled(size);
    // Holds in flight awaiting blocks this run never stores (a store looks each block up).
    let waiting: Vec<_> = (0..waits as u64).map(|i| view.await_block(!i)).collect();
    let mut oldest = 1u64;
    let tokens: Vec<u32> = (0..(BATCH * BLOCK) as u32).collect();
    // One store of BATCH blocks and one removal of BATCH blocks: 2 x BATCH block events.
    g.throughput(Throughput::Elements((2 * BATCH) as u64));
    let name = match waits {
        0 => format!("ingest_{size}blocks"),
        n => format!("ingest_{size}blocks_{n}waits"),
    };
    g.bench_function(name, |b| {
        b.iter(|| {
            let hashes: Vec<u64> = (next..next + BATCH as u64).collect();
            let mut t = tokens.clone();
            t[0] = next as u32;
            black_box(view.store(None, &hashes, &t, BLOCK));
            let old: Vec<u64> = (oldest..oldest + BATCH as u64).collect();
            black_box(view.remove(&old));
            next += BATCH as u64;
            oldest += BATCH as u64;
        })
    });
    assert!(waiting.iter().all(|w| !w.is_stored()));
    g.finish();
}

/// Decoding a vLLM-shaped batch as model-sim publishes it: a `BlockStored` of [`BATCH`]
/// blocks (token ids spread over a 128 K vocabulary, as a real model's are) and a
/// `BlockRemoved` for each.
fn bench_decode(c: &mut Criterion) {
    use model_sim::kv_cache::{KvBlock, KvEvent};
    use model_sim::kv_events::encode_batch;
    let mut g = c.benchmark_group("kv_events");
    let token_ids: Vec<u32> = (0..(BATCH * BLOCK) as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 128_000)
        .collect();
    let blocks: Vec<KvBlock> = (0..BATCH as u64)
        .map(|i| KvBlock(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    let mut events = vec![KvEvent::Stored {
        blocks: blocks.clone(),
        parent: Some(KvBlock(7)),
        token_ids,
    }];
    events.extend(blocks.into_iter().map(KvEvent::Removed));
    let payload = encode_batch(1.0, &events, BLOCK, 0);
    let limits = Limits::default();
    g.throughput(Throughput::Elements((2 * BATCH) as u64));
    g.bench_function("decode_stored_and_removed", |b| {
        b.iter(|| black_box(decode_batch(black_box(&payload), &limits)).is_ok())
    });
    g.finish();
}

fn bench_match(c: &mut Criterion, size: usize) {
    let mut g = c.benchmark_group("engine_view");
    let (view, next) = filled(size);
    // The request: 2,048 tokens (8 KiB of English), its first 64 blocks held.
    let mut tokens: Vec<u32> = (0..2048).collect();
    tokens[0] = (next - 64) as u32;
    let held: Vec<u32> = tokens[..64 * BLOCK].to_vec();
    view.store(None, &(next..next + 64).collect::<Vec<_>>(), &held, BLOCK);
    let chain = token_chain(&tokens, BLOCK);
    assert_eq!(view.longest_match(&chain), 64);
    g.bench_function("match_2048tokens", |b| {
        b.iter(|| black_box(view.longest_match(black_box(&chain))))
    });
    g.throughput(Throughput::Elements(2048));
    g.bench_function("token_chain_2048tokens", |b| {
        b.iter(|| black_box(token_chain(black_box(&tokens), BLOCK)))
    });
    g.finish();
}

fn bench_heads(c: &mut Criterion) {
    let mut g = c.benchmark_group("heads");
    let registry = prometheus::Registry::new();
    let metrics = EngineTruthMetrics::register(
        &registry,
        &["engine", "estimate"],
        &["engine", "request"],
        &["timeout"],
    );
    let section: TokenizerSection = serde_yaml_ng::from_str("source: engine").unwrap();
    let heads = HeadTokens::new(section, metrics);
    // An 8 KiB conversation of 9 messages, none of its heads known: the lookup misses (the
    // queue fills once, then every lookup finds its heads already pending).
    let prompt: String = (0..9)
        .map(|i| format!("<|im_start|>user\n{}<|im_end|>\n", "word ".repeat(180 + i)))
        .collect();
    let body = br#"{"messages":[]}"#;
    let pod = "127.0.0.1:8000".parse().unwrap();
    g.bench_function("find_8KiB_chat_miss", |b| {
        b.iter_batched(
            || (),
            |_| {
                black_box(heads.find(
                    "m",
                    Some(Api::ChatCompletions),
                    black_box(&prompt),
                    Some(body),
                    Some(pod),
                ))
            },
            BatchSize::SmallInput,
        )
    });
    // A document of 8 KiB in the last message, after a system message: 16 cut heads looked up
    // and remembered as seen, none known.
    let document = format!(
        "<|im_start|>system\nAnswer from the document.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n",
        "word ".repeat(1640)
    );
    g.bench_function("find_8KiB_document_miss", |b| {
        b.iter(|| {
            black_box(heads.find(
                "m",
                Some(Api::ChatCompletions),
                black_box(&document),
                Some(body),
                Some(pod),
            ))
        })
    });
    g.finish();
}

/// The `messages` of a chat prompt of about `bytes` bytes whose text is new for each `nonce`
/// (prefix-bench's `tokenize-cost` prompts: a system message of benchmark words, a question).
fn chat_messages(bytes: usize, nonce: u64) -> String {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut system = format!("Tenant {nonce}. ");
    let mut i = nonce as usize;
    while system.len() < bytes {
        system.push_str(words[i % words.len()]);
        system.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "What does the tenant say first?"},
    ])
    .to_string()
}

/// The `file` source on model-sim's `tokenizer.json` and chat template, a new prompt each call:
/// render + encode (`tokenize`), the render alone, and the bare `tokenizers` encode of the
/// rendered text (what the crate costs with nothing of ours around it).
fn bench_file_tokenizer(c: &mut Criterion, sizes: &[(&str, usize)]) {
    let mut g = c.benchmark_group("tokenize_file");
    let dir = tempfile::tempdir().unwrap();
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let path = dir.path().join("tokenizer.json");
    let source = FileSource::load(&path).unwrap();
    let template = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    let bare = tokenizers::Tokenizer::from_file(&path).unwrap();
    // `tokenizers`' ByteLevel split (GPT-2's pattern), as the crate compiles it.
    let gpt2 = tokenizers::utils::SysRegex::new(
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    )
    .unwrap();
    // Checked before measuring: the three agree on what they compute.
    let messages = chat_messages(2_000, 1);
    let rendered = template.render(&messages, None, true).unwrap();
    let ids = source
        .tokenize(&TokenizeInput::chat(&messages, None))
        .unwrap();
    let bare_ids = bare.encode_fast(rendered.as_str(), false).unwrap();
    assert_eq!(ids.as_slice(), bare_ids.get_ids());
    // One new prompt per iteration, its result dropped before the next (as the background
    // worker does): a batch of live results would grow the heap and slow every allocation.
    let mut nonce = 1u64 << 43;
    let mut next = |bytes: usize| {
        nonce += 1;
        chat_messages(bytes, nonce)
    };
    for &(label, bytes) in sizes {
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(format!("cold_{label}"), |b| {
            b.iter_batched(
                || next(bytes),
                |m| black_box(source.tokenize(&TokenizeInput::chat(&m, None)).unwrap()),
                BatchSize::PerIteration,
            )
        });
        g.bench_function(format!("render_{label}"), |b| {
            b.iter_batched(
                || next(bytes),
                |m| black_box(template.render(&m, None, true).unwrap()),
                BatchSize::PerIteration,
            )
        });
        g.bench_function(format!("bare_encode_fast_{label}"), |b| {
            b.iter_batched(
                || template.render(&next(bytes), None, true).unwrap(),
                |text| black_box(bare.encode_fast(text.as_str(), false).unwrap()),
                BatchSize::PerIteration,
            )
        });
        // Inside encode_fast: the ByteLevel pre-tokenizer (regex split, bytes to symbols, the
        // crate's alignment bookkeeping) on the whole text, and its regex alone.
        let pre = bare.get_pre_tokenizer().unwrap();
        g.bench_function(format!("bare_pre_tokenize_{label}"), |b| {
            b.iter_batched(
                || template.render(&next(bytes), None, true).unwrap(),
                |text| {
                    let mut split = tokenizers::PreTokenizedString::from(text.as_str());
                    tokenizers::PreTokenizer::pre_tokenize(pre, &mut split).unwrap();
                    black_box(split)
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function(format!("gpt2_regex_{label}"), |b| {
            b.iter_batched(
                || template.render(&next(bytes), None, true).unwrap(),
                |text| black_box(gpt2.find_iter(&text).count()),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let size = if measuring { 1 << 20 } else { 1 << 10 };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    let sizes: &[(&str, usize)] = if measuring {
        &[("2KB", 2_000), ("8KiB", 8_192), ("220KB", 220_000)]
    } else {
        &[("2KB", 2_000)]
    };
    // First, before the views' fixtures below build and free a million-block view: placed after
    // them, the tokenizer's many small allocations measured about twice as slow.
    bench_file_tokenizer(&mut c, sizes);
    bench_decode(&mut c);
    bench_ingest(&mut c, size, 0);
    bench_ingest(&mut c, size, 64);
    bench_match(&mut c, size);
    bench_heads(&mut c);
    c.final_summary();
    // Just under a power of two (tables 7/8 full) and at one (just grown: half full).
    for blocks in [size / 16, size * 7 / 8, size] {
        let (view, _) = filled(blocks);
        println!(
            "engine_view memory: {:.1} bytes per block at {} blocks (heap {} bytes)",
            view.heap_bytes() as f64 / view.blocks() as f64,
            view.blocks(),
            view.heap_bytes()
        );
    }
}
