//! Soak under pod churn: sustained load through a real Envoy while discovery removes a pod and
//! brings another back (restarted: new generation, cold) every few seconds.
//!
//! - `churn_smoke` (default test run, a few seconds): the same loop, short.
//! - `soak` (ignored; `scripts/soak [SECONDS]`, default 600 s, release build): the full run, which
//!   also checks that RSS stays flat after warm-up.
//!
//! Checked throughout: every request gets a 200 (the picker causes no errors), index entries never
//! exceed pods x `maxHashCacheSize`, and the index holds entries only for pods in the set; at the
//! end no stream or in-flight count is left and no picker task panicked. Memory after warm-up
//! (the first 30%): live heap bytes (counted by an instrumented global allocator, so a leak of a
//! few bytes per request shows) and RSS, sampled every 200 ms; the full run asserts both flat.

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::harness::*;
use model_sim::engine::EngineConfig;
use prefix_picker::endpoints::Update;
use prefix_picker::serve::static_endpoints;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

const PODS: usize = 6;
const CLIENTS: usize = 8;
const CACHE: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_smoke() {
    run(Duration::from_secs(5), Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10 minutes; run with scripts/soak"]
async fn soak() {
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    run(Duration::from_secs(seconds), Duration::from_secs(3)).await;
}

#[global_allocator]
static HEAP: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes currently allocated on the heap by this process.
fn live_heap_bytes() -> u64 {
    // stats_alloc books a realloc's growth or shrink into these two as well.
    let s = HEAP.stats();
    (s.bytes_allocated - s.bytes_deallocated) as u64
}

/// Resident set size of this process (picker, sims and clients), bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Memory samples; a line every 10% of the run on stderr.
#[derive(Default)]
struct MemoryTrace {
    /// (seconds since start, live heap bytes, RSS bytes)
    samples: Vec<(f64, u64, u64)>,
    printed: u32,
}

impl MemoryTrace {
    fn sample(&mut self, elapsed: Duration, duration: Duration) {
        let (t, heap, rss) = (elapsed.as_secs_f64(), live_heap_bytes(), rss_bytes());
        self.samples.push((t, heap, rss));
        let tenth = (t / duration.as_secs_f64() * 10.0) as u32;
        if tenth > self.printed {
            self.printed = tenth;
            eprintln!("soak: t={t:.0}s heap={heap} rss={rss}");
        }
    }

    /// Max (heap, rss) over the two halves of the time after warm-up (30% of the run).
    fn windows(&self, duration: Duration) -> ((u64, u64), (u64, u64)) {
        let d = duration.as_secs_f64();
        let (warm, mid) = (0.3 * d, 0.65 * d);
        let max = |from: f64, to: f64, pick: fn(&(f64, u64, u64)) -> u64| {
            self.samples
                .iter()
                .filter(|s| s.0 >= from && s.0 < to)
                .map(pick)
                .max()
                .unwrap_or(0)
        };
        (
            (max(warm, mid, |s| s.1), max(mid, f64::MAX, |s| s.1)),
            (max(warm, mid, |s| s.2), max(mid, f64::MAX, |s| s.2)),
        )
    }
}

struct Load {
    ok: AtomicU64,
    failed: AtomicU64,
    first_failure: parking_lot::Mutex<Option<String>>,
}

async fn client(id: usize, url: String, load: Arc<Load>, until: Instant) {
    let http = reqwest::Client::new();
    let mut rng = SmallRng::seed_from_u64(id as u64);
    // 24 shared system prompts of 1-6 KiB, so prefixes repeat, spread and get evicted.
    while Instant::now() < until {
        let group = rng.random_range(0..24usize);
        let system = format!("group {group}: ").repeat(90 * (1 + group % 6));
        let user = format!("question {}", rng.random::<u32>());
        let body = json!({"model": "m", "max_tokens": 2, "stream": rng.random_bool(0.3),
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]});
        let reply = http.post(&url).json(&body).send().await;
        let outcome = match reply {
            Ok(r) if r.status() == 200 => r.bytes().await.map(|_| ()).map_err(|e| e.to_string()),
            Ok(r) => Err(format!(
                "{}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(()) => load.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                load.first_failure.lock().get_or_insert(e);
                load.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

async fn run(duration: Duration, churn_every: Duration) {
    // A KV cache small enough to fill during warm-up (each request adds a few blocks), so the
    // simulators' memory is flat afterwards and what grows would be the picker's.
    let engine = EngineConfig {
        time_scale: 50.0,
        kv_blocks: 4_096,
        ..EngineConfig::default()
    };
    let mut sims = Vec::new();
    for i in 0..PODS {
        sims.push(Sim::start(&format!("sim-{i}"), engine.clone()).await);
    }
    let mut config = sims_config(&sims, "picker: {scrapeIntervalSeconds: 0.2}\n");
    config.scheduler.prefix_cache.max_hash_cache_size = CACHE;
    let all_specs = static_endpoints(&config);
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;

    let start = Instant::now();
    let until = start + duration;
    let load = Arc::new(Load {
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_failure: parking_lot::Mutex::new(None),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(client(
                i,
                envoy.url("/v1/chat/completions"),
                load.clone(),
                until,
            ))
        })
        .collect();

    // Churn: remove one pod, bring back one removed earlier with a new generation (restart).
    let router = picker.router.clone();
    let index = router.scheduler.prefix_cache().index().clone();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut removed: Vec<usize> = Vec::new();
    let mut restarts = 0u32;
    let mut memory = MemoryTrace::default();
    let mut churns = 0;
    let mut next_churn = Instant::now() + churn_every;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let set = router.endpoints.snapshot();
        let bound = set.all().len() * CACHE;
        // Records land while we count: retry until a count is not straddled by one. Entries
        // left for a removed pod would make every attempt disagree.
        let mut counts = (0, 0);
        for _ in 0..200 {
            let before = index.entries();
            let held: usize = set
                .all()
                .iter()
                .map(|e| index.pod_entries(e.index.slot()))
                .sum();
            counts = (held, index.entries());
            if counts == (before, before) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (held, entries) = counts;
        assert!(entries <= bound, "{entries} entries > {bound}");
        assert_eq!(held, entries, "entries held for pods outside the set");

        let now = Instant::now();
        memory.sample(now - start, duration);
        if now >= next_churn {
            next_churn = now + churn_every;
            churns += 1;
            if let Some(i) = (removed.len() >= 2).then(|| removed.remove(0)) {
                restarts += 1;
                let mut spec = all_specs[i].clone();
                spec.generation = format!("restart-{restarts}");
                router.endpoints.apply(Update::add(spec));
            }
            let present: Vec<usize> = (0..PODS).filter(|i| !removed.contains(i)).collect();
            let victim = present[rng.random_range(0..present.len())];
            router
                .endpoints
                .apply(Update::Remove(all_specs[victim].id.clone()));
            removed.push(victim);
        }
    }
    for c in clients {
        c.await.unwrap();
    }

    let (ok, failed) = (
        load.ok.load(Ordering::Relaxed),
        load.failed.load(Ordering::Relaxed),
    );
    eprintln!(
        "soak: {:?}, {ok} ok, {failed} failed, {churns} churns, {restarts} restarts, entries {}",
        duration,
        index.entries(),
    );
    let (heap, rss) = memory.windows(duration);
    eprintln!(
        "soak: max after warm-up, first half / second half: heap {} / {} bytes, rss {} / {} bytes",
        heap.0, heap.1, rss.0, rss.1
    );
    assert_eq!(
        failed,
        0,
        "first failure: {:?}\n{}",
        load.first_failure.lock(),
        envoy.log()
    );
    assert!(ok > 0 && churns >= 2, "{ok} requests, {churns} churns");
    wait_metric_eq(&picker, "prefix_picker_inflight_streams", 0.0).await;
    for e in picker.router.endpoints.snapshot().all() {
        assert_eq!(e.inflight(), 0, "{} in flight", e.label);
    }
    if duration >= Duration::from_secs(300) {
        // Flat: the bounded index and caches fluctuate, a leak makes the later window higher.
        // Judged from 300 s on: the churned index is still filling towards its bound for the
        // first ~180 s on a 2-vCPU machine, so a 120 s run's later window is higher without a
        // leak (measured: +6.9 % heap at 120 s; +1.4 % at 300 s, flat from 180 s).
        // Live heap is exact (5% slack); RSS also carries the allocator's arenas (10%).
        assert!(
            heap.1 as f64 <= heap.0 as f64 * 1.05,
            "live heap grew after warm-up: {heap:?}"
        );
        assert!(
            rss.1 as f64 <= rss.0 as f64 * 1.10,
            "RSS grew after warm-up: {rss:?}"
        );
    }
    picker.stop().await.unwrap();
}
