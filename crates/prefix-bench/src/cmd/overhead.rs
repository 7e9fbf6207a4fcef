//! `prefix-bench overhead`: instant backends, fixed concurrency; requests/s, p50/p99 latency
//! and CPU per request of Envoy alone, Envoy + the no-op ext_proc, Envoy + the routing floor
//! (the no-op plus the routing any prefix-cache router must do, with the shipped config's
//! scheduler) and Envoy + prefix-picker (each Envoy bootstrap: Kthena's plugins, the shipped
//! config, and the shipped config reading the engines' KV events and asking their
//! `/tokenize`, as `deploy/local` runs it), and the installed peers,
//! `rounds` times in alternation (`prefix_bench::overhead`); then the CPU ratios to the no-op
//! and to the floor (`prefix_bench::overhead::cpu_ratios`).

use std::path::PathBuf;
use std::time::Duration;

use prefix_bench::cluster::{Setup, start_cluster_on};
use prefix_bench::driver::{self, Arrival, RunResult};
use prefix_bench::engines::EnginePlan;
use prefix_bench::overhead::{self, OverheadRow, RowKind};
use prefix_bench::picker_config::EngineEvents;
use prefix_bench::probe::cpu_seconds;
use prefix_bench::project::shipped_config;
use prefix_bench::report::write_results;
use prefix_bench::rows::routers;
use prefix_bench::workload::{self, BenchRequest};
use testkit::Process;

/// One setup of the comparison: its row name, its kind (what its line is compared with), and
/// how it is deployed.
type OverheadSetup = (String, RowKind, Setup);

/// Measures every setup at every concurrency level and writes `overhead-<n>tok.json` and
/// `.md`.
pub async fn run(
    requests: usize,
    concurrency: &str,
    output_tokens: usize,
    envoy_files: &[String],
    out: PathBuf,
    rounds: usize,
    kind: Prompts,
) -> anyhow::Result<()> {
    let levels: Vec<usize> = concurrency
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let setups = setups(envoy_files)?;
    let baseline = (
        "Envoy alone (round robin)".to_string(),
        RowKind::Alone,
        Setup::envoy("envoy-round-robin.yaml", None),
    );
    let prompts = kind.requests(requests, output_tokens);
    let mut measured = Measured {
        md: format!(
            "{}, {output_tokens} output token(s) per streamed response, {requests} requests per row\n\n",
            kind.describe()
        ),
        runs: Vec::new(),
        rows: Vec::new(),
    };
    measured.md.push_str(overhead::ROUND_TABLE_HEADER);
    for &c in &levels {
        for round in 1..=rounds {
            // The baseline first (the live lines compare with it); the others in turn reversed
            // every other round, so no setup always runs right after the baseline.
            let mut order: Vec<&OverheadSetup> = setups.iter().collect();
            if round % 2 == 0 {
                order.reverse();
            }
            order.insert(0, &baseline);
            measured.round(&order, c, round, &prompts).await?;
        }
    }
    let Measured { mut md, runs, rows } = measured;
    if rounds > 1 {
        md.push('\n');
        md.push_str(&overhead::summary_markdown(&rows));
    }
    let ratios = overhead::cpu_ratios::cpu_ratio_markdown(&rows);
    if !ratios.is_empty() {
        md.push('\n');
        md.push_str(&ratios);
    }
    println!("{md}");
    write_results(&out, &format!("overhead-{output_tokens}tok"), &runs, &md)
}

/// The setups compared with Envoy alone: per Envoy bootstrap the no-op processor, the routing
/// floor and the picker with the shipped config (both when it has a `picker.affinity`
/// mapping), the picker with Kthena's plugins; then the peers `bench/run` installed.
fn setups(envoy_files: &[String]) -> anyhow::Result<Vec<OverheadSetup>> {
    let shipped = shipped_config()?;
    let (scheduler, affinity) = (shipped.scheduler, shipped.affinity);
    let mut setups: Vec<OverheadSetup> = Vec::new();
    for file in envoy_files {
        setups.push((
            format!("Envoy + no-op ext_proc ({file})"),
            RowKind::Noop { file: file.clone() },
            Setup::NoopExtProc { file: file.clone() },
        ));
        setups.push((
            format!("Envoy + prefix-picker, Kthena default plugins ({file})"),
            RowKind::Picker { file: file.clone() },
            Setup::envoy(file, Some(scheduler.clone())),
        ));
        // The shipped config (affinity mode), what the demo and the chart run, and its floor:
        // the same scheduler over the same pods, without the picker's platform.
        if let Some(affinity) = &affinity {
            setups.push((
                format!("Envoy + no-op + routing core (floor), shipped config ({file})"),
                RowKind::Floor { file: file.clone() },
                Setup::RoutingFloor {
                    file: file.clone(),
                    scheduler: scheduler.clone(),
                    affinity: Some(affinity.clone()),
                },
            ));
            setups.push((
                format!("Envoy + prefix-picker, shipped config ({file})"),
                RowKind::Picker { file: file.clone() },
                Setup::Envoy {
                    file: file.clone(),
                    scheduler: Some(scheduler.clone()),
                    affinity: Some(affinity.clone()),
                    events: None,
                    picker_bin: None,
                },
            ));
            setups.push((
                format!("Envoy + prefix-picker, shipped config + engine events ({file})"),
                RowKind::Picker { file: file.clone() },
                Setup::Envoy {
                    file: file.clone(),
                    scheduler: Some(scheduler.clone()),
                    affinity: Some(affinity.clone()),
                    events: Some(EngineEvents::engine_tokenize()),
                    picker_bin: None,
                },
            ));
        }
    }
    for (name, setup) in routers(false, None)? {
        if matches!(setup, Setup::Sglang(_) | Setup::Vllm(_) | Setup::Smg(_)) {
            setups.push((name, RowKind::Peer, setup));
        }
    }
    Ok(setups)
}

/// The requests every row is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Prompts {
    /// Distinct 8 KiB streamed completions.
    Completion,
    /// 2 KiB streamed chats: one of eight tenants' 1 KiB system prompts, a distinct 1 KiB
    /// question.
    Chat,
}

/// Tenants of [`Prompts::Chat`].
const CHAT_TENANTS: u64 = 8;

impl Prompts {
    fn describe(self) -> &'static str {
        match self {
            Prompts::Completion => "8 KiB completion prompts",
            Prompts::Chat => {
                "2 KiB chats (one of 8 tenants' 1 KiB system prompts, a 1 KiB question)"
            }
        }
    }

    /// `requests` requests of `output_tokens` tokens each.
    fn requests(self, requests: usize, output_tokens: usize) -> Vec<BenchRequest> {
        let max_tokens = output_tokens.max(1);
        (0..requests as u64)
            .map(|i| match self {
                Prompts::Completion => BenchRequest::new(
                    "/v1/completions",
                    serde_json::json!({"model": "model", "prompt": workload::text(i + 11, 8192), "max_tokens": max_tokens, "stream": true}),
                    None,
                ),
                Prompts::Chat => BenchRequest::new(
                    "/v1/chat/completions",
                    serde_json::json!({"model": "model", "messages": [
                        {"role": "system", "content": workload::text(i % CHAT_TENANTS + 1, 1024)},
                        {"role": "user", "content": workload::text(i + 1_000, 1024)},
                    ], "max_tokens": max_tokens, "stream": true}),
                    None,
                ),
            })
            .collect()
    }
}

/// What the rounds measured: the table so far, every run, every row.
struct Measured {
    md: String,
    runs: Vec<RunResult>,
    rows: Vec<OverheadRow>,
}

impl Measured {
    /// Measures the setups of one round at concurrency `c`, in `order` (the baseline first);
    /// each line is printed as it comes and compared with the baseline's p50.
    async fn round(
        &mut self,
        order: &[&OverheadSetup],
        c: usize,
        round: usize,
        prompts: &[BenchRequest],
    ) -> anyhow::Result<()> {
        let mut baseline_p50 = None;
        for (name, kind, setup) in order {
            let (result, proxy_cpu_ms, ext_proc_cpu_ms) =
                measure_overhead(name, setup, c, prompts).await?;
            let row = OverheadRow {
                setup: name.clone(),
                kind: kind.clone(),
                concurrency: c,
                round,
                requests_per_s: result.requests_per_s,
                p50_ms: result.e2e_ms.p50,
                p99_ms: result.e2e_ms.p99,
                proxy_cpu_ms,
                ext_proc_cpu_ms,
            };
            let line = row.markdown(*baseline_p50.get_or_insert(row.p50_ms));
            eprint!("{line}");
            self.md.push_str(&line);
            self.rows.push(row);
            self.runs.push(result);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Instant backends: model-sims that answer at once, one token unless asked for more.
fn instant() -> Vec<String> {
    ["--time-scale", "1000000000", "--default-max-tokens", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Starts `setup`, warms it up, runs `prompts` through it at concurrency `c` and stops it.
/// Returns the run and the CPU per request of the proxy and of the external processor (if any).
async fn measure_overhead(
    name: &str,
    setup: &Setup,
    c: usize,
    prompts: &[BenchRequest],
) -> anyhow::Result<(RunResult, f64, Option<f64>)> {
    let mut engines = EnginePlan::plain(&instant());
    engines.kv_events = setup.reads_engine_events();
    let cluster = start_cluster_on(setup, engines).await?;
    let base = cluster.url.clone();
    // The proxy's CPU: Envoy's, or the peer router's own process.
    let envoy_pid = cluster
        .envoy
        .as_ref()
        .map(|e| e.pid)
        .or_else(|| cluster.peer.as_ref().map(Process::pid));
    // Warm up connections and caches.
    let _ = driver::run(
        name,
        "warm-up",
        &base,
        &[],
        &prompts[..50.min(prompts.len())],
        Arrival::Closed { concurrency: c },
        0.0,
    )
    .await;
    let cpu = |p: Option<u32>| p.and_then(cpu_seconds).unwrap_or(0.0);
    let ext_proc_pid = cluster.ext_proc.as_ref().map(Process::pid);
    let (e0, p0) = (cpu(envoy_pid), cpu(ext_proc_pid));
    let result = driver::run(
        name,
        "overhead",
        &base,
        &cluster.sim_urls,
        prompts,
        Arrival::Closed { concurrency: c },
        0.0,
    )
    .await;
    let (e1, p1) = (cpu(envoy_pid), cpu(ext_proc_pid));
    let n = (result.requests - result.errors).max(1) as f64;
    Ok((
        result,
        (e1 - e0) * 1000.0 / n,
        ext_proc_pid.map(|_| (p1 - p0) * 1000.0 / n),
    ))
}
