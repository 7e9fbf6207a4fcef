//! Sends a workload to one router and measures what clients and engines saw.
//!
//! Closed loop: `concurrency` workers; the turns of one conversation run in order on one worker.
//! Open loop: arrivals at the trace's timestamps, or Poisson at `rate` requests/s (seeded);
//! conversations still wait for their previous turn. Every request streams (SSE) so TTFT is the
//! time to the first `data:` event. Engine hit rate = token-weighted delta of the sims'
//! `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` over the run.
//! `base` may list several routers (comma-separated): requests go to them round-robin, as a
//! load balancer in front of gateway replicas would send them. A request pinned to an engine
//! (`pin_to`, the oracle's placement) goes straight to that engine.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::workload::BenchRequest;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    Closed { concurrency: usize },
    Poisson { rate: f64, seed: u64 },
    Trace,
}

/// One request's measurements (seconds; `start` from the start of the run).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    pub ok: bool,
    pub start: f64,
    pub ttft: f64,
    pub e2e: f64,
    pub output_tokens: u64,
    pub served_by: String,
    pub group: Option<u32>,
    /// The engine's `usage.prompt_tokens` and `prompt_tokens_details.cached_tokens` (from the
    /// stream's usage chunk; 0 when the stream carried none).
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(mut v: Vec<f64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize] * 1000.0;
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// The result of one run, as written to JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    pub router: String,
    pub workload: String,
    /// Repetition number (1-based) when the suite runs every row several times.
    #[serde(default)]
    pub rep: usize,
    pub requests: usize,
    pub errors: usize,
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub hit_rate: f64,
    pub ceiling_hit_rate: f64,
    /// Requests per pod (`x-served-by`).
    pub pod_share: BTreeMap<String, usize>,
    /// Busiest pod's share over the mean share (1.0 = perfectly even).
    pub max_over_mean: f64,
    /// Pods that served a request's group (shared prefix, tenant, session), averaged over the
    /// requests that have one (1.0 = every group on one pod; 0 when none has a group).
    #[serde(default)]
    pub pods_per_group: f64,
    /// Every request's measurements, in completion order (`suite --samples` writes them).
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

/// [`RunResult::pods_per_group`] of served `(group, pod)` pairs.
fn pods_per_group<'a>(served: impl Iterator<Item = (u32, &'a str)>) -> f64 {
    let mut pods: BTreeMap<u32, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let mut requests: BTreeMap<u32, usize> = BTreeMap::new();
    for (g, pod) in served {
        pods.entry(g).or_default().insert(pod);
        *requests.entry(g).or_default() += 1;
    }
    let total: usize = requests.values().sum();
    if total == 0 {
        return 0.0;
    }
    requests
        .iter()
        .map(|(g, &n)| (pods[g].len() * n) as f64)
        .sum::<f64>()
        / total as f64
}

/// The engines' `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total`, summed.
pub async fn engine_counters(client: &reqwest::Client, sims: &[String]) -> (f64, f64) {
    let mut hits = 0.0;
    let mut queries = 0.0;
    for s in sims {
        let Ok(r) = client.get(format!("{s}/metrics")).send().await else {
            continue;
        };
        let Ok(text) = r.text().await else { continue };
        for line in text.lines() {
            let mut parts = line.rsplitn(2, ' ');
            let value: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            match parts.next() {
                Some("vllm:prefix_cache_hits_total") => hits += value,
                Some("vllm:prefix_cache_queries_total") => queries += value,
                _ => {}
            }
        }
    }
    (hits, queries)
}

async fn one(client: &reqwest::Client, base: &str, r: &BenchRequest, t0: Instant) -> Sample {
    let start = Instant::now();
    let mut request = client.post(format!("{base}{}", r.path)).json(&r.body);
    for (name, value) in &r.headers {
        request = request.header(*name, value);
    }
    let sent = request.send().await;
    let Ok(resp) = sent else {
        return Sample::default();
    };
    if !resp.status().is_success() {
        return Sample::default();
    }
    let served_by = resp
        .headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let mut stream = resp.bytes_stream();
    let mut ttft = None;
    let mut events = 0u64;
    let mut usage_chunks = 0u64;
    // The stream's last bytes, where the usage chunk is.
    let mut tail: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Sample::default();
        };
        if ttft.is_none() {
            ttft = Some(start.elapsed().as_secs_f64());
        }
        events += chunk.windows(6).filter(|w| w == b"data: ").count() as u64;
        // Not a token: the usage chunk of `stream_options.include_usage` (no choices).
        usage_chunks += chunk.windows(14).filter(|w| w == b"\"choices\":[]").count() as u64;
        tail.extend_from_slice(&chunk);
        if tail.len() > USAGE_TAIL_BYTES {
            tail.drain(..tail.len() - USAGE_TAIL_BYTES);
        }
    }
    Sample {
        ok: true,
        ttft: ttft.unwrap_or_else(|| start.elapsed().as_secs_f64()),
        e2e: start.elapsed().as_secs_f64(),
        output_tokens: events.saturating_sub(1 + usage_chunks),
        served_by,
        group: r.group,
        start: start.duration_since(t0).as_secs_f64(),
        prompt_tokens: usage_count(&tail, b"\"prompt_tokens\":"),
        cached_tokens: usage_count(&tail, b"\"cached_tokens\":"),
    }
}

/// Bytes of a stream's end kept for its usage chunk.
const USAGE_TAIL_BYTES: usize = 1024;

/// The number after the last `key` in `bytes` (0 when there is none).
fn usage_count(bytes: &[u8], key: &[u8]) -> u64 {
    let Some(at) = bytes.windows(key.len()).rposition(|w| w == key) else {
        return 0;
    };
    bytes[at + key.len()..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, &b| {
            n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
        })
}

/// A unit of work: one request, a conversation (in order) or a burst (all at once).
#[derive(Debug, Clone)]
struct Unit {
    requests: Vec<BenchRequest>,
    together: bool,
}

fn units(requests: &[BenchRequest]) -> VecDeque<Unit> {
    let mut by_key: HashMap<(bool, u32), usize> = HashMap::new();
    let mut out: Vec<Unit> = Vec::new();
    for r in requests {
        let key = match (r.conversation, r.burst) {
            (Some(c), _) => Some((false, c)),
            (None, Some(b)) => Some((true, b)),
            (None, None) => None,
        };
        match key.and_then(|k| by_key.get(&k).copied()) {
            Some(i) => out[i].requests.push(r.clone()),
            None => {
                if let Some(k) = key {
                    by_key.insert(k, out.len());
                }
                out.push(Unit {
                    requests: vec![r.clone()],
                    together: key.is_some_and(|k| k.0),
                });
            }
        }
    }
    out.into()
}

/// Router URLs, taken round-robin per request; the engines' URLs for pinned requests.
#[derive(Debug)]
struct Bases {
    urls: Vec<String>,
    next: AtomicUsize,
    sims: Vec<String>,
    t0: Instant,
}

impl Bases {
    fn pick(&self, r: &BenchRequest) -> &str {
        match r.pin_to.and_then(|i| self.sims.get(i)) {
            Some(sim) => sim,
            None => &self.urls[self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len()],
        }
    }
}

async fn run_unit(
    client: &reqwest::Client,
    base: &Bases,
    unit: Unit,
    samples: &Mutex<Vec<Sample>>,
) {
    if unit.together {
        let all = unit
            .requests
            .iter()
            .map(|r| one(client, base.pick(r), r, base.t0));
        let results = futures_util::future::join_all(all).await;
        samples.lock().extend(results);
    } else {
        for r in &unit.requests {
            let s = one(client, base.pick(r), r, base.t0).await;
            samples.lock().push(s);
        }
    }
}

/// Requests [`warm_up`] sends before a row is measured.
pub const WARM_UP_REQUESTS: usize = 32;

/// Opens the connections a run will use before it is measured (as SGLang's `bench_serving`
/// sends a test request first), so TTFT percentiles measure routing, not process start-up:
/// [`WARM_UP_REQUESTS`] one-sentence prompts, distinct and unrelated to any workload (each
/// holds a block or two in an engine's cache, the first an LRU evicts), all at once, through
/// the router or, when `pinned`, to each engine in turn. Engine counters are read after it.
pub async fn warm_up(base: &str, sims: &[String], pinned: bool, model: &str) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let base = Bases {
        urls: base.split(',').map(str::to_string).collect(),
        next: AtomicUsize::new(0),
        sims: sims.to_vec(),
        t0: Instant::now(),
    };
    let requests: Vec<BenchRequest> = (0..WARM_UP_REQUESTS)
        .map(|i| {
            let mut r = BenchRequest::new(
                "/v1/chat/completions",
                serde_json::json!({"model": model, "max_tokens": 1, "stream": true,
                    "messages": [{"role": "user", "content": format!("warm-up request {i}: say hi")}]}),
                None,
            );
            r.pin_to = pinned.then(|| i % sims.len().max(1));
            r
        })
        .collect();
    let all = requests
        .iter()
        .map(|r| one(&client, base.pick(r), r, base.t0));
    futures_util::future::join_all(all).await;
}

/// Runs a workload against `base` (the router's URL, or several, comma-separated, taken
/// round-robin); `sims` are the engines' URLs.
pub async fn run(
    router: &str,
    workload: &str,
    base: &str,
    sims: &[String],
    requests: &[BenchRequest],
    arrival: Arrival,
    ceiling: f64,
) -> RunResult {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(600))
        .build()
        .expect("client");
    let base = Arc::new(Bases {
        urls: base.split(',').map(str::to_string).collect(),
        next: AtomicUsize::new(0),
        sims: sims.to_vec(),
        t0: Instant::now(),
    });
    let (h0, q0) = engine_counters(&client, sims).await;
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let total = requests.len();
    let started = Instant::now();
    let progress = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let n = samples.lock().len();
                eprint!("\r  {n}/{total} requests");
                if n >= total {
                    break;
                }
            }
        })
    };
    match arrival {
        Arrival::Closed { concurrency } => {
            let queue = Arc::new(Mutex::new(units(requests)));
            let mut workers = Vec::new();
            for _ in 0..concurrency.max(1) {
                let (queue, samples, client, base) =
                    (queue.clone(), samples.clone(), client.clone(), base.clone());
                workers.push(tokio::spawn(async move {
                    loop {
                        let Some(unit) = queue.lock().pop_front() else {
                            break;
                        };
                        run_unit(&client, &base, unit, &samples).await;
                    }
                }));
            }
            for w in workers {
                let _ = w.await;
            }
        }
        Arrival::Poisson { .. } | Arrival::Trace => {
            let mut rng = match arrival {
                Arrival::Poisson { seed, .. } => SmallRng::seed_from_u64(seed),
                _ => SmallRng::seed_from_u64(0),
            };
            let mut at = 0.0f64;
            let mut tasks = Vec::new();
            for unit in units(requests) {
                let offset = match (arrival, unit.requests[0].at_ms) {
                    (Arrival::Trace, Some(ms)) => ms / 1000.0,
                    (Arrival::Poisson { rate, .. }, _) => {
                        at += -(1.0 - rng.random::<f64>()).ln() / rate.max(1e-9);
                        at
                    }
                    _ => 0.0,
                };
                let (samples, client, base) = (samples.clone(), client.clone(), base.clone());
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(
                        tokio::time::Instant::from_std(started) + Duration::from_secs_f64(offset),
                    )
                    .await;
                    run_unit(&client, &base, unit, &samples).await;
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }
    let duration = started.elapsed().as_secs_f64();
    progress.abort();
    eprintln!();
    let (h1, q1) = engine_counters(&client, sims).await;
    let samples = std::mem::take(&mut *samples.lock());
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let mut pod_share = BTreeMap::new();
    for s in &ok {
        *pod_share.entry(s.served_by.clone()).or_insert(0) += 1;
    }
    let mean = ok.len() as f64 / sims.len().max(1) as f64;
    let max = pod_share.values().copied().max().unwrap_or(0) as f64;
    RunResult {
        router: router.to_string(),
        workload: workload.to_string(),
        rep: 1,
        requests: samples.len(),
        errors: samples.len() - ok.len(),
        duration_s: duration,
        requests_per_s: ok.len() as f64 / duration,
        output_tokens_per_s: ok.iter().map(|s| s.output_tokens).sum::<u64>() as f64 / duration,
        ttft_ms: Percentiles::of(ok.iter().map(|s| s.ttft).collect()),
        e2e_ms: Percentiles::of(ok.iter().map(|s| s.e2e).collect()),
        hit_rate: if q1 > q0 { (h1 - h0) / (q1 - q0) } else { 0.0 },
        ceiling_hit_rate: ceiling,
        pod_share,
        max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
        pods_per_group: pods_per_group(
            ok.iter()
                .filter_map(|s| Some((s.group?, s.served_by.as_str()))),
        ),
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_per_group_weighs_groups_by_their_requests() {
        // Group 1: 3 requests on one pod; group 2: 1 request on each of two pods.
        let served = [(1, "a"), (1, "a"), (1, "a"), (2, "a"), (2, "b")];
        assert!((pods_per_group(served.into_iter()) - (3.0 + 2.0 * 2.0) / 5.0).abs() < 1e-9);
        assert_eq!(pods_per_group(std::iter::empty()), 0.0);
    }

    #[test]
    fn usage_counts_come_from_the_last_usage_chunk() {
        let tail = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 1712,\"prompt_tokens_details\":{\"cached_tokens\":1536}}}\n\ndata: [DONE]";
        assert_eq!(usage_count(tail, b"\"prompt_tokens\":"), 1712);
        assert_eq!(usage_count(tail, b"\"cached_tokens\":"), 1536);
        assert_eq!(usage_count(b"data: [DONE]", b"\"cached_tokens\":"), 0);
    }
}
