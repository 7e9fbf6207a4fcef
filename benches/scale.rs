//! How the router's cost grows with the pool: the request path, route + complete, explain and
//! the `/metrics` exposition at 4, 64, 256 and 1,024 pods, with one model and with 16 (64 pods
//! each), every pod's index list at its configured budget; and the request path on 1 and 2 OS
//! threads over one shared router (contention).
//!
//! Run: `cargo bench --bench scale` (results: benches/RESULTS.md, "Cost growth with the pool").
//!
//! - `request_path/8KiB_{N}pods`: the shipped config's router (affinity mode) from an 8 KiB chat
//!   body's bytes to the pick, over N static pods; `8KiB_1024pods_16models`: 1,024 pods serving
//!   16 models, 64 each (the request's model has 64 candidates among 1,024 pods).
//! - `complete/8KiB_{N}pods`: route, then complete with a 2xx (the prompt recorded for the pod,
//!   the hold released, the outcome counted): a request's whole cost in the picker's core.
//! - `floor/read_{N}pods`: one pass over the N pods reading what the request path reads of
//!   each candidate's load (in flight, engine queue, share, concurrency), keeping the least:
//!   the floor of any pick that weighs every candidate.
//! - `explain/8KiB_1024pods`: the decision `/debug/explain` serialises (nothing committed).
//! - `metrics/1024pods`: encoding the registry with a series per pod in every per-pod family.
//! - `threads/8KiB_1024pods_{1,2}`: wall time per routed request with 1 or 2 OS threads routing
//!   distinct bodies through one router (`iter_custom`).
//! - bytes per index entry at 1,024 pods (printed, not timed).
//!
//! `PREFIX_PICKER_BENCH_PODS=N` builds only the pool of N pods (one model): e.g. to profile it;
//! `PREFIX_PICKER_BENCH_BUDGET=N` fills each list to N entries instead (e.g. under callgrind).
//!
//! The index is filled through the router's own `record` with chains that share the bodies'
//! system prompt (its real block hashes) and end in random blocks, up to `maxHashCacheSize`
//! entries per pod (50,000 in the shipped config; 500 under `cargo test --benches`). Before
//! measuring, each pool checks that a recorded body goes back to its pod, held whole, and that
//! a request of model `m` is placed on a pod serving `m`.

#[path = "support/text.rs"]
mod text;

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use prefix_picker::config::Config;
use prefix_picker::endpoints::{Endpoint, EndpointSpec, PodId, Update};
use prefix_picker::hashing::BlockHash;
use prefix_picker::metrics::{self, PrefixCacheMetrics, RouterMetrics};
use prefix_picker::routing::{Ending, RecordOrigin, Router, Served};
use prefix_picker::scheduler::Candidate;
use prefix_picker::scheduler::affinity;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PROMPT_BYTES: usize = 8 * 1024;
/// Blocks of an 8 KiB chat in the shipped config (128-byte blocks), about.
const PROMPT_BLOCKS: usize = 64;
const SIZES: [usize; 4] = [4, 64, 256, 1024];
const MODELS: usize = 16;
/// `maxHashCacheSize` under `cargo test --benches`.
const TEST_BUDGET: usize = 500;

fn model_name(m: usize) -> String {
    format!("model-{m}")
}

/// A router over `pods` static pods, each list filled to `budget` entries. With `models > 1`
/// pod `i` serves model `i % models`; with 1, every pod serves any model.
struct Pool {
    router: Router,
    registry: prometheus::Registry,
    pods: usize,
    models: usize,
}

impl Pool {
    fn new(pods: usize, models: usize, budget: usize) -> Pool {
        let started = Instant::now();
        let local = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/local/config.yaml"),
        )
        .expect("the shipped config");
        let scheduler = &local[..local.find("endpoints:").expect("endpoints")];
        let picker = &local[local.find("\npicker:").expect("picker section")..];
        // The pods here publish no events: the tokenizer would have nobody to ask.
        let picker = picker.replace("  tokenizer: {source: engine}\n", "");
        let doc = format!(
            "{}endpoints:\n- {{name: pod-0, address: 10.0.0.1:8000}}\n{picker}",
            scheduler.replace(
                "maxHashCacheSize: 50000",
                &format!("maxHashCacheSize: {budget}")
            )
        );
        let config = Config::parse(&doc).expect("valid");
        let registry = prometheus::Registry::new();
        let router = Router::assemble(
            config.scheduler,
            config.picker,
            PrefixCacheMetrics::register(&registry),
            RouterMetrics::register(&registry),
        );
        let specs = (0..pods)
            .map(|i| EndpointSpec {
                id: PodId {
                    namespace: "default".into(),
                    name: format!("pod-{i}"),
                },
                address: format!("10.1.{}.{}:8000", i / 256, i % 256)
                    .parse()
                    .expect("an address"),
                models: if models > 1 {
                    vec![model_name(i % models)]
                } else {
                    vec![]
                },
                generation: String::new(),
                role: None,
                labels: Default::default(),
                kv_events: None,
                containers_started: None,
                engine_started: None,
            })
            .collect();
        router.endpoints.apply(Update::Reset(specs));
        let pool = Pool {
            router,
            registry,
            pods,
            models,
        };
        pool.fill(budget);
        let index = pool.router.scheduler.index();
        eprintln!(
            "pool: {pods} pods, {models} model(s), {} entries, heap {:.1} B/entry, filled in {:.1?}",
            index.entries(),
            index.heap_bytes() as f64 / index.entries().max(1) as f64,
            started.elapsed()
        );
        pool.check();
        pool
    }

    fn model(&self, seed: u64) -> String {
        model_name(seed as usize % self.models)
    }

    fn body(&self, seed: u64) -> Vec<u8> {
        text::chat_body(&self.model(seed), seed, PROMPT_BYTES)
    }

    /// The block hashes of the shared system prompt, for `model`.
    fn system_blocks(&self, model: &str) -> Vec<BlockHash> {
        let body = text::chat_body(model, 1, PROMPT_BYTES);
        let a = self.explain_hashes(&body);
        let b = self.explain_hashes(&text::chat_body(model, 2, PROMPT_BYTES));
        a.iter()
            .zip(&b)
            .take_while(|(x, y)| x == y)
            .map(|(x, _)| *x)
            .collect()
    }

    fn explain_hashes(&self, body: &[u8]) -> Vec<BlockHash> {
        let explained = self
            .router
            .explain("/v1/chat/completions", Some(body), None);
        explained.expect("routed").decision.hashes
    }

    /// Every pod's list to `budget` entries: the model's system blocks, then random ones.
    fn fill(&self, budget: usize) {
        let mut rng = SmallRng::seed_from_u64(5);
        let systems: Vec<Vec<BlockHash>> = (0..self.models)
            .map(|m| self.system_blocks(&model_name(m)))
            .collect();
        let set = self.router.endpoints.snapshot();
        let index = self.router.scheduler.index();
        let mut chain = Vec::with_capacity(PROMPT_BLOCKS);
        for (i, pod) in set.all().iter().enumerate() {
            let model = model_name(i % self.models);
            while index.pod_entries(pod.index.slot()) < budget {
                chain.clear();
                chain.extend_from_slice(&systems[i % self.models]);
                while chain.len() < PROMPT_BLOCKS {
                    chain.push(BlockHash(rng.random()));
                }
                self.router.record(&model, &chain, pod, RecordOrigin::Local);
            }
        }
    }

    /// A recorded body goes back to its pod, predicted held whole; the pod serves the model.
    fn check(&self) {
        for seed in [90_001, 90_002] {
            let body = self.body(seed);
            let route = || {
                self.router
                    .explain("/v1/chat/completions", Some(&body), None)
                    .expect("routed")
                    .decision
            };
            let first = route();
            let model = self.model(seed);
            let pod: &Arc<Endpoint> = first.primary();
            assert!(
                pod.serves(&model),
                "{} pods: a {model} request went to {}",
                self.pods,
                pod.spec.id.name
            );
            assert!(
                first.predicted_blocks < first.hashes.len(),
                "a new body is not held whole"
            );
            self.router
                .record(&model, &first.hashes, pod, RecordOrigin::Local);
            let again = route();
            assert_eq!(
                (
                    again.primary().spec.id.name.as_str(),
                    again.predicted_blocks
                ),
                (pod.spec.id.name.as_str(), first.hashes.len()),
                "{} pods: a recorded body goes back to its pod, held whole",
                self.pods
            );
        }
    }

    fn route_and_complete(&self, body: &[u8]) {
        let routed = self
            .router
            .route("/v1/chat/completions", Some(body), None)
            .expect("routed");
        self.router.complete(
            routed.ticket,
            Ending::Completed {
                status: Some(200),
                served: Served::NotReported,
                cached_tokens: None,
                first_byte: None,
                events: None,
            },
        );
    }

    /// A series per pod in every per-pod family the request path and the scrape touch.
    fn touch_every_pod(&self) {
        let set = self.router.endpoints.snapshot();
        for pod in set.all() {
            self.router
                .metrics
                .count_scrape(&pod.spec.id, metrics::ScrapeResult::Ok);
            let labels = metrics::pod_label_values(&pod.spec.id);
            self.router
                .metrics
                .pod_picks
                .with_label_values(&labels)
                .inc();
            self.router
                .metrics
                .pod_inflight
                .with_label_values(&labels)
                .set(0);
        }
    }
}

fn bench_pool(c: &mut Criterion, pool: &Pool, name: &str) {
    let bodies: Vec<Vec<u8>> = (0..64).map(|i| pool.body(10 + i)).collect();
    let mut next = 0usize;
    let mut g = c.benchmark_group("request_path");
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |b| {
        b.iter(|| {
            next = (next + 1) % bodies.len();
            pool.router
                .route("/v1/chat/completions", Some(black_box(&bodies[next])), None)
                .expect("routed")
        })
    });
    g.finish();
    // The floor of any pick that weighs every candidate's load: one pass reading each pod's
    // in-flight count, engine queue, share of recent picks and learned concurrency (what the
    // request path reads of a candidate), keeping the least loaded.
    let set = pool.router.endpoints.snapshot();
    let candidates = set.all();
    let ln_keep = affinity::keep_factor(4, candidates.len()).ln();
    let mut g = c.benchmark_group("floor");
    g.throughput(Throughput::Elements(1));
    g.bench_function(format!("read_{}pods", pool.pods), |b| {
        b.iter(|| {
            let mut least = (f64::INFINITY, 0usize);
            for (i, e) in black_box(candidates).iter().enumerate() {
                let (share, written) = e.recent().share_written_ln(1 << 16, ln_keep);
                let slots = e.timing().and_then(|t| t.concurrency()).unwrap_or(64.0);
                let load = (e.inflight() as f64 + e.waiting()) / slots + share + written;
                if load < least.0 {
                    least = (load, i);
                }
            }
            least
        })
    });
    g.finish();
    let mut g = c.benchmark_group("complete");
    g.throughput(Throughput::Elements(1));
    let mut seed = 1_000_000u64;
    g.bench_function(name, |b| {
        b.iter_batched(
            || {
                seed += 1;
                pool.body(seed)
            },
            |body| pool.route_and_complete(black_box(&body)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn bench_largest(c: &mut Criterion, pool: &Pool) {
    let body = pool.body(77);
    let mut g = c.benchmark_group("explain");
    g.bench_function("8KiB_1024pods", |b| {
        b.iter(|| {
            pool.router
                .explain("/v1/chat/completions", Some(black_box(&body)), None)
                .expect("routed")
        })
    });
    g.finish();
    pool.touch_every_pod();
    let text = metrics::encode(&pool.registry);
    assert!(
        text.contains("pod-1023"),
        "metrics/1024pods: every pod has its series"
    );
    let mut g = c.benchmark_group("metrics");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("1024pods", |b| b.iter(|| metrics::encode(&pool.registry)));
    g.finish();
    let bodies: Vec<Vec<u8>> = (0..256).map(|i| pool.body(500 + i)).collect();
    let mut g = c.benchmark_group("threads");
    g.throughput(Throughput::Elements(1));
    for threads in [1usize, 2] {
        g.bench_function(format!("8KiB_1024pods_{threads}"), |b| {
            b.iter_custom(|iters| routed_on(pool, &bodies, threads, iters))
        });
    }
    g.finish();
}

/// Wall time for `iters` routed requests spread over `threads` OS threads.
fn routed_on(pool: &Pool, bodies: &[Vec<u8>], threads: usize, iters: u64) -> Duration {
    let per = iters.div_ceil(threads as u64);
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for i in 0..per {
                    let body = &bodies[(t * 97 + i as usize) % bodies.len()];
                    black_box(
                        pool.router
                            .route("/v1/chat/completions", Some(body), None)
                            .expect("routed"),
                    );
                }
            });
        }
        start.wait();
        let began = Instant::now();
        // The scope joins the threads before it returns: its end is theirs.
        began
    })
    .elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let measuring = has("--bench") && !has("--test") && !has("--list");
    // `PREFIX_PICKER_BENCH_BUDGET=N` fills each list to N entries (e.g. under callgrind).
    let budget = match std::env::var("PREFIX_PICKER_BENCH_BUDGET") {
        Ok(v) => v
            .parse()
            .expect("PREFIX_PICKER_BENCH_BUDGET: entries per pod"),
        Err(_) if measuring => 50_000,
        Err(_) => TEST_BUDGET,
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    // `PREFIX_PICKER_BENCH_PODS=1024` builds that pool only (e.g. to profile it).
    let only: Option<usize> = std::env::var("PREFIX_PICKER_BENCH_PODS")
        .ok()
        .map(|v| v.parse().expect("PREFIX_PICKER_BENCH_PODS: a pool size"));
    for pods in SIZES.into_iter().filter(|p| only.is_none_or(|o| o == *p)) {
        let pool = Pool::new(pods, 1, budget);
        bench_pool(&mut c, &pool, &format!("8KiB_{pods}pods"));
        if pods == 1024 {
            bench_largest(&mut c, &pool);
            let index = pool.router.scheduler.index();
            println!(
                "bytes_per_entry 1024pods heap={:.1} (entries={} distinct={})",
                index.heap_bytes() as f64 / index.entries() as f64,
                index.entries(),
                index.distinct_entries()
            );
        }
    }
    if only.is_none() {
        let pool = Pool::new(1024, MODELS, budget);
        bench_pool(&mut c, &pool, "8KiB_1024pods_16models");
    }
    c.final_summary();
}
