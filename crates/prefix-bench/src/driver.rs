//! Sends a workload to one router and measures what clients and engines saw.
//!
//! Closed loop: `concurrency` workers; the turns of one conversation run in order on one worker.
//! Open loop: arrivals at the trace's timestamps, or Poisson at `rate` requests/s (seeded);
//! conversations still wait for their previous turn. Every request streams (SSE) so TTFT is the
//! time to the first token ([`answer`] reads OpenAI's events or Anthropic's, by the request's
//! path). Engine hit rate = token-weighted delta of the sims'
//! `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` over the run.
//! `base` may list several routers (comma-separated): requests go to them round-robin, as a
//! load balancer in front of gateway replicas would send them. A request pinned to an engine
//! (`pin_to`, the oracle's placement) goes straight to that engine.
//! [`MidRun`]: something done to the engines while the workload runs (the `engine-restarts`
//! workload restarts them); the engine counters are banked around it, so an engine whose
//! counters start again from 0 still counts what it served before.

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
use answer::{AnswerReader, Shape};

mod answer;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    Closed { concurrency: usize },
    Poisson { rate: f64, seed: u64 },
    Trace,
}

/// One request's measurements (seconds; `start` from the start of the run).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    pub ok: bool,
    pub start: f64,
    pub ttft: f64,
    pub e2e: f64,
    pub output_tokens: u64,
    pub served_by: String,
    pub group: Option<u32>,
    /// The engine's `usage.prompt_tokens` and `prompt_tokens_details.cached_tokens` (from the
    /// stream's usage chunk; 0 when the stream carried none), or Anthropic's usage read as
    /// [`answer`] says.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The request's tenant ([`super::workload::TENANT_HEADER`]), when it named one; else its
    /// objective ([`super::workload::OBJECTIVE_HEADER`]), when it named one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// What one tenant's requests saw in a run ([`super::workload::noisy_neighbour`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TenantResult {
    pub requests: usize,
    pub errors: usize,
    pub requests_per_s: f64,
    pub ttft_ms: Percentiles,
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
    /// What the engines' vLLM admission did (warm-up included), under an engine profile that
    /// has it (`suite --engine-profile kv-pressure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<super::probe::KvAdmission>,
    /// What the router's tokenizer calls cost the engines during the run (warm-up excluded;
    /// `None` where none was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize: Option<super::probe::TokenizeWork>,
    /// The engines' `usage.prompt_tokens` over the run's answers.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Per tenant, when the workload's requests name theirs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantResult>,
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
    sum(&engine_counters_each(client, sims).await)
}

/// Each engine's `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total` (0 for
/// an engine that does not answer).
async fn engine_counters_each(client: &reqwest::Client, sims: &[String]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(sims.len());
    for s in sims {
        let (mut hits, mut queries) = (0.0, 0.0);
        let text = match client.get(format!("{s}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        for line in text.lines() {
            let mut parts = line.rsplitn(2, ' ');
            let value: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            match parts.next() {
                Some("vllm:prefix_cache_hits_total") => hits += value,
                Some("vllm:prefix_cache_queries_total") => queries += value,
                _ => {}
            }
        }
        out.push((hits, queries));
    }
    out
}

fn sum(counters: &[(f64, f64)]) -> (f64, f64) {
    counters
        .iter()
        .fold((0.0, 0.0), |(h, q), (dh, dq)| (h + dh, q + dq))
}

/// Something done to the engines mid-run: once `after[i]` requests have finished (answered or
/// failed), the driver calls `act(i)`, blocking (a restart waits for the new process).
pub struct MidRun<'a> {
    pub after: Vec<usize>,
    pub act: Box<dyn FnMut(usize) -> anyhow::Result<()> + Send + 'a>,
}

/// The engine counters of a run with [`MidRun`] actions: what each engine counted up to an
/// action is banked, and the engine's counters read after it are its new baseline.
#[derive(Debug, Default)]
struct Banked {
    baseline: Vec<(f64, f64)>,
    banked: (f64, f64),
}

impl Banked {
    fn new(baseline: Vec<(f64, f64)>) -> Banked {
        Banked {
            baseline,
            banked: (0.0, 0.0),
        }
    }

    /// Banks what every engine counted since its baseline (`now`: the counters just before an
    /// action); `after`: the counters just after it, the new baseline.
    fn bank(&mut self, now: &[(f64, f64)], after: Vec<(f64, f64)>) {
        let (h, q) = self.delta(now);
        self.banked = (self.banked.0 + h, self.banked.1 + q);
        self.baseline = after;
    }

    /// Hits and queries since the start (`now`: the counters at the end).
    fn total(&self, now: &[(f64, f64)]) -> (f64, f64) {
        let (h, q) = self.delta(now);
        (self.banked.0 + h, self.banked.1 + q)
    }

    /// Counted since the baseline; an engine whose counters went back (it restarted since)
    /// counts from 0.
    fn delta(&self, now: &[(f64, f64)]) -> (f64, f64) {
        let mut out = (0.0, 0.0);
        for (i, &(h, q)) in now.iter().enumerate() {
            let (h0, q0) = self.baseline.get(i).copied().unwrap_or((0.0, 0.0));
            let (h0, q0) = if q < q0 { (0.0, 0.0) } else { (h0, q0) };
            out = (out.0 + (h - h0).max(0.0), out.1 + (q - q0).max(0.0));
        }
        out
    }
}

/// Runs `mid_run`'s actions as the run's finished requests (`done`) pass their thresholds,
/// until `stop`; returns the banked engine counters.
async fn mid_run_actions(
    client: &reqwest::Client,
    sims: &[String],
    mut mid_run: MidRun<'_>,
    done: impl Fn() -> usize,
    stop: &tokio::sync::Notify,
    mut banked: Banked,
) -> Banked {
    let mut next = 0;
    while next < mid_run.after.len() {
        if done() < mid_run.after[next] {
            tokio::select! {
                _ = stop.notified() => break,
                _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
            }
        }
        let now = engine_counters_each(client, sims).await;
        let act = &mut mid_run.act;
        let result = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => act(next),
            _ => tokio::task::block_in_place(|| act(next)),
        };
        if let Err(e) = result {
            eprintln!("\n  mid-run action {next} failed: {e:#}");
        }
        banked.bank(&now, engine_counters_each(client, sims).await);
        next += 1;
    }
    banked
}

async fn one(client: &reqwest::Client, base: &str, r: &BenchRequest, t0: Instant) -> Sample {
    let mut s = one_request(client, base, r, t0).await;
    let named = |header: &str| {
        r.headers
            .iter()
            .find(|(name, _)| *name == header)
            .map(|(_, v)| v.clone())
    };
    s.tenant =
        named(super::workload::TENANT_HEADER).or_else(|| named(super::workload::OBJECTIVE_HEADER));
    s
}

async fn one_request(
    client: &reqwest::Client,
    base: &str,
    r: &BenchRequest,
    t0: Instant,
) -> Sample {
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
    let streamed = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let served_by = resp
        .headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let mut stream = resp.bytes_stream();
    let mut ttft = None;
    let mut reader = AnswerReader::new(Shape::of(r.path));
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Sample::default();
        };
        if reader.feed(&chunk) {
            ttft = Some(start.elapsed().as_secs_f64());
        }
    }
    // A stream cut short (its engine died mid-answer) is a failure, however cleanly the router
    // ended it ([`AnswerReader::finish`]).
    let Some(answer) = reader.finish(streamed) else {
        return Sample::default();
    };
    Sample {
        ok: true,
        ttft: ttft.unwrap_or_else(|| start.elapsed().as_secs_f64()),
        e2e: start.elapsed().as_secs_f64(),
        output_tokens: answer.output_tokens,
        served_by,
        group: r.group,
        start: start.duration_since(t0).as_secs_f64(),
        prompt_tokens: answer.prompt_tokens,
        cached_tokens: answer.cached_tokens,
        tenant: None,
    }
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
    /// `base`: the router URLs, comma-separated; `sims`: the engines' URLs.
    fn new(base: &str, sims: &[String]) -> Bases {
        Bases {
            urls: base.split(',').map(str::to_string).collect(),
            next: AtomicUsize::new(0),
            sims: sims.to_vec(),
            t0: Instant::now(),
        }
    }

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
    let base = Bases::new(base, sims);
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
    run_with(
        router, workload, base, sims, requests, arrival, ceiling, None,
    )
    .await
}

/// [`run`], with `mid_run`'s actions on the engines while it runs.
#[expect(
    clippy::too_many_arguments,
    reason = "run's arguments and the mid-run actions"
)]
pub async fn run_with(
    router: &str,
    workload: &str,
    base: &str,
    sims: &[String],
    requests: &[BenchRequest],
    arrival: Arrival,
    ceiling: f64,
    mid_run: Option<MidRun<'_>>,
) -> RunResult {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(600))
        .build()
        .expect("client");
    let base = Arc::new(Bases::new(base, sims));
    let banked = Banked::new(engine_counters_each(&client, sims).await);
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let started = Instant::now();
    let progress = progress(samples.clone(), requests.len());
    let stop = tokio::sync::Notify::new();
    let workload_done = async {
        match arrival {
            Arrival::Closed { concurrency } => {
                closed_loop(requests, concurrency, &client, &base, &samples).await;
            }
            Arrival::Poisson { .. } | Arrival::Trace => {
                open_loop(requests, arrival, started, &client, &base, &samples).await;
            }
        }
        // `notify_one` keeps the permit if the actions are not waiting at this moment.
        stop.notify_one();
    };
    let actions = async {
        match mid_run {
            Some(m) => {
                let done = || samples.lock().len();
                mid_run_actions(&client, sims, m, done, &stop, banked).await
            }
            None => banked,
        }
    };
    let ((), banked) = tokio::join!(workload_done, actions);
    let duration = started.elapsed().as_secs_f64();
    progress.abort();
    eprintln!();
    let (hits, queries) = banked.total(&engine_counters_each(&client, sims).await);
    let samples = std::mem::take(&mut *samples.lock());
    let mut r = RunResult::of(samples, sims.len(), duration);
    r.router = router.to_string();
    r.workload = workload.to_string();
    r.hit_rate = if queries > 0.0 { hits / queries } else { 0.0 };
    r.ceiling_hit_rate = ceiling;
    r
}

/// Says on stderr, every 2 s, how many of `total` requests have finished.
fn progress(samples: Arc<Mutex<Vec<Sample>>>, total: usize) -> tokio::task::JoinHandle<()> {
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
}

/// The closed loop: `concurrency` workers, each taking the next unit when its last is done.
async fn closed_loop(
    requests: &[BenchRequest],
    concurrency: usize,
    client: &reqwest::Client,
    base: &Arc<Bases>,
    samples: &Arc<Mutex<Vec<Sample>>>,
) {
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

/// The open loop: each unit starts at its trace time (`Trace`) or its Poisson arrival
/// (`Poisson`, seeded) after `started`, whatever is still running.
async fn open_loop(
    requests: &[BenchRequest],
    arrival: Arrival,
    started: Instant,
    client: &reqwest::Client,
    base: &Arc<Bases>,
    samples: &Arc<Mutex<Vec<Sample>>>,
) {
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

impl RunResult {
    /// What clients saw of a run of `duration` seconds on `pods` engines (router, workload and
    /// hit rates left for the caller).
    fn of(samples: Vec<Sample>, pods: usize, duration: f64) -> RunResult {
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
        let mut pod_share = BTreeMap::new();
        for s in &ok {
            *pod_share.entry(s.served_by.clone()).or_insert(0) += 1;
        }
        let mean = ok.len() as f64 / pods.max(1) as f64;
        let max = pod_share.values().copied().max().unwrap_or(0) as f64;
        RunResult {
            rep: 1,
            requests: samples.len(),
            errors: samples.len() - ok.len(),
            duration_s: duration,
            requests_per_s: ok.len() as f64 / duration,
            output_tokens_per_s: ok.iter().map(|s| s.output_tokens).sum::<u64>() as f64 / duration,
            ttft_ms: Percentiles::of(ok.iter().map(|s| s.ttft).collect()),
            e2e_ms: Percentiles::of(ok.iter().map(|s| s.e2e).collect()),
            pod_share,
            max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
            pods_per_group: pods_per_group(
                ok.iter()
                    .filter_map(|s| Some((s.group?, s.served_by.as_str()))),
            ),
            prompt_tokens: ok.iter().map(|s| s.prompt_tokens).sum(),
            tenants: tenants(&samples, duration),
            samples,
            ..RunResult::default()
        }
    }
}

/// [`RunResult::tenants`] of a run's samples.
fn tenants(samples: &[Sample], duration: f64) -> BTreeMap<String, TenantResult> {
    let mut by: BTreeMap<String, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        if let Some(t) = &s.tenant {
            by.entry(t.clone()).or_default().push(s);
        }
    }
    by.into_iter()
        .map(|(t, all)| {
            let ok: Vec<f64> = all.iter().filter(|s| s.ok).map(|s| s.ttft).collect();
            let result = TenantResult {
                requests: all.len(),
                errors: all.len() - ok.len(),
                requests_per_s: ok.len() as f64 / duration.max(1e-9),
                ttft_ms: Percentiles::of(ok),
            };
            (t, result)
        })
        .collect()
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
    fn banked_counters_survive_an_engine_whose_counters_restart() {
        // Two engines; engine 1 restarts mid-run (its counters from 0 again).
        let mut b = Banked::new(vec![(10.0, 20.0), (5.0, 5.0)]);
        // Just before the restart: engine 0 counted 30/40 more, engine 1 60/100 more.
        b.bank(
            &[(40.0, 60.0), (65.0, 105.0)],
            vec![(40.0, 60.0), (0.0, 0.0)],
        );
        // At the end: engine 0 another 10/10, the restarted engine 1 has 3/30.
        let (h, q) = b.total(&[(50.0, 70.0), (3.0, 30.0)]);
        assert_eq!(
            (h, q),
            (30.0 + 60.0 + 10.0 + 3.0, 40.0 + 100.0 + 10.0 + 30.0)
        );
        // An engine that restarted outside an action counts from 0, never negative.
        let b = Banked::new(vec![(50.0, 100.0)]);
        assert_eq!(b.total(&[(2.0, 8.0)]), (2.0, 8.0));
    }

    #[tokio::test]
    async fn mid_run_actions_run_once_each_as_requests_pass_their_thresholds() {
        let done = std::sync::atomic::AtomicUsize::new(0);
        let stop = tokio::sync::Notify::new();
        let calls = std::sync::Mutex::new(Vec::new());
        let mid_run = MidRun {
            after: vec![2, 5],
            act: Box::new(|i| {
                calls.lock().unwrap().push((i, done.load(Ordering::SeqCst)));
                Ok(())
            }),
        };
        let client = reqwest::Client::new();
        let actions = mid_run_actions(
            &client,
            &[],
            mid_run,
            || done.load(Ordering::SeqCst),
            &stop,
            Banked::default(),
        );
        let requests = async {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                done.fetch_add(1, Ordering::SeqCst);
            }
            stop.notify_one();
        };
        let (_, ()) = tokio::join!(actions, requests);
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(calls[0].1 >= 2 && calls[1].1 >= 5, "{calls:?}");
    }
}
