//! `prefix-bench`: the benchmark driver.
//!
//! - `suite [--quick]`: for each workload and router (Envoy round robin; Envoy + prefix-picker
//!   with prefix-cache only, with Kthena's default plugins, with the shipped config, with the
//!   shipped config reading the engines' KV events; the peer routers `bench/run` installed; the
//!   oracle), starts fresh model-sims, the picker and Envoy as processes, runs the workload
//!   `--repeat` times (interleaved) and writes `suite.json` (every run, the skipped workloads),
//!   `suite.md` (medians) and `suite-summary.md` (a line per workload, `prefix_bench::summary`).
//!   When a selected row reads KV events, or the workload restarts engines, every row of that
//!   workload runs on sims that publish them (the same engines for every row). `--config`
//!   gives the shipped-config rows another picker config (`prefix_bench::row_config`).
//! - `overhead`: instant backends, fixed concurrency: requests/s, p50/p99 latency and CPU per
//!   request of Envoy alone vs Envoy + a no-op ext_proc vs Envoy + prefix-picker (both Envoy
//!   setups), in one run.
//! - `run`: one workload against an existing router URL.
//! - `report`: rewrite the markdown, summary and PNG of a results file (`--summary`: print it).
//! - `pd`: prefill/decode disaggregation, prefix-picker's `pdGroup` pairs against round-robin
//!   pairs on model-sims in PD roles; the headline is the prefill hit rate (`prefix_bench::pd`).
//! - `noop-ext-proc` (hidden): the no-op external processor of the overhead baseline, run as its
//!   own process by `overhead`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use prefix_bench::driver::{self, Arrival, RunResult};
use prefix_bench::overhead::{self, OverheadRow, RowKind};
use prefix_bench::picker_config::{self, EngineEvents};
use prefix_bench::probe::{self, cpu_seconds};
use prefix_bench::row_config::RowConfig;
use prefix_bench::suite_results::{Skipped, SuiteResults};
use prefix_bench::workload::{self, BenchRequest};
use prefix_bench::{oracle, placement_search, report, summary};
use testkit::{Process, bin_dir, render_envoy};

#[derive(Debug, Parser)]
#[command(
    name = "prefix-bench",
    version,
    about = "Routing quality and overhead benchmarks for prefix-picker"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The standard suite (or `--quick`), comparing routers on the same sims and workloads.
    Suite(SuiteOpts),
    /// Proxy overhead: Envoy alone vs Envoy + a no-op ext_proc vs Envoy + prefix-picker, instant
    /// backends.
    Overhead {
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        #[arg(long, default_value = "1,16")]
        concurrency: String,
        /// Output tokens per response (SSE events); >1 measures the per-chunk cost.
        #[arg(long, default_value_t = 1)]
        output_tokens: usize,
        /// Envoy bootstraps under `envoy/` to compare: each gets a no-op ext_proc row and a
        /// prefix-picker row.
        #[arg(
            long,
            default_value = "envoy.yaml,envoy-observer.yaml,envoy-full-duplex.yaml",
            value_delimiter = ','
        )]
        envoy_files: Vec<String>,
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Run every setup this many times, in alternation, and add a summary of medians of
        /// the in-round comparisons (`prefix_bench::overhead`).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
    },
    /// Rewrite the markdown, the summary and the PNG of a results JSON file (next to it).
    Report {
        /// A results file: `suite.json` (or an earlier array of runs).
        results: PathBuf,
        /// Print the summary (one line per workload, as `suite-summary.md`) and write nothing.
        #[arg(long)]
        summary: bool,
    },
    /// One workload against a running router.
    Run {
        #[arg(long)]
        url: String,
        /// Comma-separated model-sim base URLs (for the engine hit rate).
        #[arg(long, default_value = "")]
        sims: String,
        #[arg(long, default_value = "shared-prefix")]
        workload: String,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Poisson arrivals at this rate (requests/s) instead of a closed loop.
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// 1 replica vs 3 replicas without sync vs 3 with Redis sync, requests round-robin over
    /// the replicas (each a prefix-picker + Envoy over the same sims), shared-prefix workload.
    Replicas(ReplicasOpts),
    /// Prefill/decode disaggregation: prefix-picker's `pdGroup` pairs vs round-robin pairs, on
    /// prefill and decode model-sims (`prefix_bench::pd`); the prefill hit rate is the headline.
    Pd(PdOpts),
    /// What engine tokens cost per request (`prefix_bench::tokenize_cost`): the `/tokenize` hop
    /// to a model-sim, cold and cached, and the request path's head lookup, at 2 KB, 8 KiB and
    /// 220 KB chat prompts.
    TokenizeCost {
        /// Calls per line (a quarter of them at 220 KB).
        #[arg(long, default_value_t = 400)]
        calls: usize,
        /// The `file` source's tokenizer.json (default: model-sim's, with its chat template).
        #[arg(long)]
        tokenizer_json: Option<PathBuf>,
    },
    /// Serve the no-op ext_proc (`prefix_bench::noop_ext_proc`); `overhead` runs it.
    #[command(hide = true)]
    NoopExtProc {
        #[arg(long, default_value = "127.0.0.1:0")]
        grpc_addr: String,
    },
    /// The cost for a picker of applying another replica's records from Redis (sync).
    SyncApply {
        /// Records per second published by the simulated remote replica.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Block hashes per record.
        #[arg(long, default_value_t = 64)]
        blocks: usize,
        #[arg(long, default_value_t = 64)]
        pods: usize,
    },
}

// Options of `prefix-bench suite` (help text: the `Cmd::Suite` doc comment).
#[derive(Debug, Args)]
struct SuiteOpts {
    /// Small workloads, one run per row (about two minutes): a developer's check, not a result.
    #[arg(long)]
    quick: bool,
    /// Directory for `suite.json` (every run), `suite.md` (a table per workload),
    /// `suite-summary.md` (a line per workload) and `suite.png` (`suite-quick*` with `--quick`).
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Seed of the workloads' generated prompts and arrivals (same seed, same requests).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs of every row, interleaved (run 1 of every router, then run 2, ...); the tables show
    /// medians. Default: 3, or 1 with `--quick`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: Option<u32>,
    /// Only these workloads (keys such as `multi-tenant,agent,hot-prefix`, or name prefixes).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Only the routers whose row name contains one of these (e.g. `round-robin,oracle`); the
    /// ablation rows run whenever `--ablation` is given.
    #[arg(long, value_delimiter = ',')]
    routers: Vec<String>,
    /// Add the ablation rows: the shipped config with one `picker.affinity` switch off each.
    #[arg(long)]
    ablation: bool,
    /// On these workloads (keys), add the ext_proc floor row: Envoy with `envoy.yaml` and the
    /// no-op processor (`noop-ext-proc`) in the picker's place, routing round robin. Its TTFT
    /// is what any ext_proc endpoint picker pays before it routes.
    #[arg(long, value_delimiter = ',')]
    ext_proc_floor: Vec<String>,
    /// Also write every request's measurements (start, TTFT, end-to-end, serving pod, group)
    /// to `<out>/suite-samples.jsonl`, one line per request, tagged with router, workload, run.
    #[arg(long)]
    samples: bool,
    /// Run the shipped-config rows (and their engine-events and ablation rows) with this picker
    /// config instead of `deploy/local/config.yaml`: its `scheduler:` section and its
    /// `picker.affinity` mapping (the suite writes the endpoints). Validated first, as
    /// `prefix-picker validate` does.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The Mooncake trace the `trace` workload replays. Default:
    /// `../shared/data/mooncake/synthetic_trace.jsonl` under `PREFIX_PICKER_ROOT`; when it is
    /// missing the workload is skipped, said on stderr and listed in the reports.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Project root: `$PREFIX_PICKER_ROOT`, else the current directory.
fn root() -> PathBuf {
    std::env::var_os("PREFIX_PICKER_ROOT").map_or_else(|| PathBuf::from("."), PathBuf::from)
}

fn envoy_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(p.into());
    }
    let venv = root().join(".venv/bin/envoy");
    anyhow::ensure!(
        venv.exists(),
        "Envoy not found: set ENVOY_BIN or run scripts/test once"
    );
    Ok(venv)
}

struct WorkloadSpec {
    /// Short name for `--workloads`.
    key: &'static str,
    name: &'static str,
    requests: Vec<BenchRequest>,
    arrival: Arrival,
    /// KV cache blocks per sim (the shared-prefix workloads use a small cache for pressure).
    kv_blocks: usize,
    /// Running requests per sim before requests queue.
    max_num_seqs: usize,
    /// Sims (by index) that run with `--no-enable-prefix-caching`.
    caching_off: Vec<usize>,
    /// Every engine restarts once mid-run ([`workload::restarts`]).
    restarts: bool,
}

impl WorkloadSpec {
    fn new(
        key: &'static str,
        name: &'static str,
        requests: Vec<BenchRequest>,
        arrival: Arrival,
        kv_blocks: usize,
    ) -> WorkloadSpec {
        WorkloadSpec {
            key,
            name,
            requests,
            arrival,
            kv_blocks,
            max_num_seqs: 64,
            caching_off: Vec::new(),
            restarts: false,
        }
    }

    fn max_num_seqs(mut self, n: usize) -> WorkloadSpec {
        self.max_num_seqs = n;
        self
    }

    /// Sim `pod` runs with `--no-enable-prefix-caching`.
    fn caching_off(mut self, pod: usize) -> WorkloadSpec {
        self.caching_off.push(pod);
        self
    }

    /// Every engine restarts once, one at a time, mid-run.
    fn with_restarts(mut self) -> WorkloadSpec {
        self.restarts = true;
        self
    }

    /// The restarts of a run of this workload (none unless [`WorkloadSpec::with_restarts`]).
    fn restart_schedule(&self) -> Vec<workload::Restart> {
        if self.restarts {
            workload::restarts(self.requests.len(), SIMS)
        } else {
            Vec::new()
        }
    }

    /// Selected by `--workloads` (nothing given = all).
    fn selected(&self, filter: &[String]) -> bool {
        filter.is_empty()
            || filter
                .iter()
                .any(|f| f == self.key || self.name.starts_with(f.as_str()))
    }
}

/// Multi-tenant system prompts, tokens (~6 KB): the engines' caches hold about a quarter of the
/// 16 tenants' prompts (4 x 96 blocks of 16 tokens, plus 64 blocks for running requests).
const TENANT_SYSTEM_TOKENS: usize = 1536;
const TENANT_KV_BLOCKS: usize = 4 * TENANT_SYSTEM_TOKENS / 16 + 64;

/// The `trace` workload's file when `--trace` names none.
fn default_trace() -> PathBuf {
    root().join("../shared/data/mooncake/synthetic_trace.jsonl")
}

/// Why the `trace` workload cannot run, when its file is missing.
fn trace_missing(path: &std::path::Path) -> Skipped {
    Skipped {
        workload: "trace".into(),
        reason: format!(
            "the trace file {} is missing: get `synthetic_trace.jsonl` from Mooncake's \
             `FAST25-release/traces/` (https://github.com/kvcache-ai/Mooncake, Apache-2.0) and put \
             it there, or name it with `--trace FILE`",
            path.display()
        ),
    }
}

/// The workloads (`--quick`: the small ones), and those skipped for a missing input.
fn workloads(
    quick: bool,
    seed: u64,
    trace_path: &std::path::Path,
) -> anyhow::Result<(Vec<WorkloadSpec>, Vec<Skipped>)> {
    let m = "model";
    let mut skipped = Vec::new();
    let mut w = if quick {
        vec![
            WorkloadSpec::new(
                "shared-prefix",
                "shared-prefix (16 groups x 8, system 1024 tok, question 64, out 32)",
                workload::shared_prefix(16, 8, 1024, 64, 32, seed, m),
                Arrival::Closed { concurrency: 8 },
                4096,
            ),
            WorkloadSpec::new(
                "multi-turn",
                "multi-turn (16 conversations x 4 turns, user 128 tok, out 64)",
                workload::multi_turn(16, 4, 256, 128, 64, seed, m),
                Arrival::Closed { concurrency: 8 },
                4096,
            ),
            WorkloadSpec::new(
                "burst",
                "burst (8 new prefixes x 8 at once, 1024 tok)",
                workload::burst(8, 8, 1024, 16, seed, m),
                Arrival::Closed { concurrency: 1 },
                4096,
            ),
            WorkloadSpec::new(
                "multi-tenant",
                "multi-tenant (16 tenants x 6 KB system, Zipf 1, 48 sessions of 1-3 turns, out 16; caches hold ~4 tenants)",
                workload::multi_tenant(16, 48, TENANT_SYSTEM_TOKENS, 64, 16, 1.0, seed, m),
                Arrival::Closed { concurrency: 8 },
                TENANT_KV_BLOCKS,
            ),
            WorkloadSpec::new(
                "agent",
                "agent (8 sessions x 4 turns, shared 10 KB tool preamble, steps ~128 tok, out 16)",
                workload::agent_sessions(8, 4, 10 * 1024, 64, 128, 16, seed, m),
                Arrival::Closed { concurrency: 4 },
                2048,
            ),
            WorkloadSpec::new(
                "busy-tenants",
                "busy-tenants (12 tenants x 6 KB system, Zipf 1, 64 sessions of 1-3 turns, out 32; max-num-seqs 4, 24 clients for 16 slots)",
                workload::multi_tenant(12, 64, TENANT_SYSTEM_TOKENS, 64, 32, 1.0, seed, m),
                Arrival::Closed { concurrency: 24 },
                BUSY_KV_BLOCKS,
            )
            .max_num_seqs(4),
            WorkloadSpec::new(
                "hot-prefix",
                "hot-prefix (8 prefixes, 50% on one, 96 requests, system 512 tok, out 16; max-num-seqs 8)",
                workload::hot_prefix(8, 96, 0.5, 512, 64, 16, seed, m),
                Arrival::Closed { concurrency: 12 },
                4096,
            )
            .max_num_seqs(8),
        ]
    } else {
        vec![
            WorkloadSpec::new(
                "sglang-defaults",
                "shared-prefix SGLang defaults (64 groups x 16, system 2048 tok, question 128, out 256)",
                workload::shared_prefix(64, 16, 2048, 128, 256, seed, m),
                Arrival::Closed { concurrency: 32 },
                4096,
            ),
            WorkloadSpec::new(
                "kthena-long",
                "shared-prefix Kthena long system (48 groups x 8, system 4096 tok, question 256, out 128)",
                workload::shared_prefix(48, 8, 4096, 256, 128, seed, m),
                Arrival::Poisson { rate: 40.0, seed },
                // Scaled with the groups (64 groups on 4,096 blocks before), for the same pressure.
                3072,
            ),
            WorkloadSpec::new(
                "kthena-short",
                "shared-prefix Kthena short system (48 groups x 8, system 256 tok, question 4096, out 128)",
                workload::shared_prefix(48, 8, 256, 4096, 128, seed, m),
                Arrival::Poisson { rate: 40.0, seed },
                3072,
            ),
            WorkloadSpec::new(
                "multi-turn",
                "multi-turn (64 conversations x 6 turns, system 512, user 256 tok, out 128)",
                workload::multi_turn(64, 6, 512, 256, 128, seed, m),
                Arrival::Closed { concurrency: 32 },
                4096,
            ),
            WorkloadSpec::new(
                "burst",
                "burst (32 new prefixes x 16 at once, 2048 tok)",
                workload::burst(32, 16, 2048, 32, seed, m),
                Arrival::Closed { concurrency: 2 },
                4096,
            ),
            WorkloadSpec::new(
                "multi-tenant",
                "multi-tenant (16 tenants x 6 KB system, Zipf 1, 192 sessions of 1-3 turns, question 128 tok, out 64; caches hold ~4 tenants)",
                workload::multi_tenant(16, 192, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
                Arrival::Closed { concurrency: 12 },
                TENANT_KV_BLOCKS,
            ),
            WorkloadSpec::new(
                "agent",
                "agent (32 sessions x 8 turns, shared 10 KB tool preamble, steps ~512 tok, out 48)",
                workload::agent_sessions(32, 8, 10 * 1024, 128, 512, 48, seed, m),
                Arrival::Closed { concurrency: 16 },
                2048,
            ),
            WorkloadSpec::new(
                "busy-tenants",
                "busy-tenants (12 tenants x 6 KB system, Zipf 1, 256 sessions of 1-3 turns, question 128 tok, out 64; max-num-seqs 4, 24 clients for 16 slots)",
                workload::multi_tenant(12, 256, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
                Arrival::Closed { concurrency: 24 },
                BUSY_KV_BLOCKS,
            )
            .max_num_seqs(4),
            WorkloadSpec::new(
                "ramp",
                "ramp (12 tenants x 6 KB system, Zipf 1, 640 single questions, out 64; open loop 10 -> 130 -> 10 requests/s, ~1.5x the capacity of 4 pods x max-num-seqs 4 at the peak)",
                ramp_requests(640, seed, m),
                Arrival::Trace,
                BUSY_KV_BLOCKS,
            )
            .max_num_seqs(4),
            WorkloadSpec::new(
                "hot-prefix",
                "hot-prefix (16 prefixes, 50% on one, 512 requests, system 1024 tok, question 128, out 64; max-num-seqs 8)",
                workload::hot_prefix(16, 512, 0.5, 1024, 128, 64, seed, m),
                Arrival::Closed { concurrency: 24 },
                4096,
            )
            .max_num_seqs(8),
            // Engine truth: what an estimate cannot know. Both the full multi-tenant workload.
            WorkloadSpec::new(
                "engine-restarts",
                "engine-restarts (multi-tenant as above; each of the 4 engines restarts once, one at a time, after 1/5, 2/5, 3/5, 4/5 of the requests: killed and started again on the same ports, cache empty)",
                workload::multi_tenant(16, 192, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
                Arrival::Closed { concurrency: 12 },
                TENANT_KV_BLOCKS,
            )
            .with_restarts(),
            WorkloadSpec::new(
                "caching-off",
                "caching-off (multi-tenant as above; sim-0 runs with --no-enable-prefix-caching: it never reuses its cache)",
                workload::multi_tenant(16, 192, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
                Arrival::Closed { concurrency: 12 },
                TENANT_KV_BLOCKS,
            )
            .caching_off(CACHING_OFF_POD),
        ]
    };
    if trace_path.exists() {
        let limit = if quick { 200 } else { 600 };
        w.push(WorkloadSpec::new(
            "trace",
            if quick {
                "trace (Mooncake synthetic, first 200 requests, 20x speed-up)"
            } else {
                "trace (Mooncake synthetic, first 600 requests, 20x speed-up)"
            },
            workload::trace(trace_path, limit, 20.0, 64, m)
                .with_context(|| format!("reading {}", trace_path.display()))?,
            Arrival::Trace,
            // Long reuse distances: a full H100-sized cache (32,768 blocks = 524k tokens).
            32_768,
        ));
    } else {
        skipped.push(trace_missing(trace_path));
    }
    Ok((w, skipped))
}

/// The pod of `caching-off` that never reuses its cache: the first, where routers that break
/// ties by endpoint order land.
const CACHING_OFF_POD: usize = 0;

/// KV blocks per sim of the busy workloads: room for every tenant's prompt on every pod (the
/// pressure there is the queue, not the cache).
const BUSY_KV_BLOCKS: usize = 4096;

/// The `ramp` workload: single questions to 12 Zipf tenants, arriving 10 -> 130 -> 10 per second.
fn ramp_requests(n: usize, seed: u64, model: &str) -> Vec<BenchRequest> {
    let mut requests: Vec<BenchRequest> =
        workload::multi_tenant(12, n * 2, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, model)
            .into_iter()
            .filter(|r| r.body["messages"].as_array().is_some_and(|m| m.len() == 2))
            .take(n)
            .map(|mut r| {
                r.conversation = None;
                r
            })
            .collect();
    workload::ramp(&mut requests, 10.0, 130.0);
    requests
}

const SIMS: usize = 4;
/// Simulated engines: 7-8B on one H100, `kv_blocks` of cache, 10x faster.
fn sim_args(kv_blocks: usize, max_num_seqs: usize) -> Vec<String> {
    let (kv, seqs) = (kv_blocks.to_string(), max_num_seqs.to_string());
    [
        "--time-scale",
        "10",
        "--kv-blocks",
        kv.as_str(),
        "--max-num-seqs",
        seqs.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// How one router of the suite is deployed.
#[derive(Clone)]
enum Setup {
    /// Envoy with one of the `envoy/` examples; with prefix-picker when a scheduler is given
    /// (and its `picker.affinity` mapping, when given; reading the engines' KV events, when
    /// `events` is given).
    Envoy {
        file: String,
        scheduler: Option<String>,
        affinity: Option<serde_json::Value>,
        events: Option<EngineEvents>,
    },
    /// Envoy (`envoy/envoy.yaml`) and prefix-picker with `scheduler`, Kthena's kvcache-aware
    /// among its plugins: every sim publishes KV events, a `prefix-picker kv-relay` beside each
    /// writes them to a `redis-server`, which the picker reads (`REDIS_HOST`).
    KvCacheAware { scheduler: String },
    /// Envoy with one of the `envoy/` examples, its ext_proc cluster pointing at the no-op
    /// processor (`prefix-bench noop-ext-proc`) instead of the picker.
    NoopExtProc { file: String },
    /// sglang-router (`python -m sglang_router.launch_router`, from its own virtualenv).
    Sglang(PathBuf),
    /// vllm-router (the `vllm-router` console script, from its own virtualenv).
    Vllm(PathBuf),
    /// SMG (`smg launch`, from its own virtualenv); its sims serve `--model model`.
    Smg(PathBuf),
    /// No router: every request pinned to an engine by [`oracle`].
    Oracle,
    /// No router: every request pinned to an engine by [`placement_search`] (pods up to
    /// [`CAPPED_ORACLE_LOAD`] x the mean load).
    OracleCapped,
}

/// The row name of `suite --ext-proc-floor`.
const EXT_PROC_FLOOR: &str = "envoy + no-op ext_proc (round robin; the ext_proc floor)";

/// The load allowance of the capped oracle row: issue 23's limit on max/mean pod load.
const CAPPED_ORACLE_LOAD: f64 = 1.3;
/// Block lookups the capped oracle's offline search may spend per workload.
const CAPPED_ORACLE_BUDGET: usize = 400_000_000;

impl Setup {
    fn envoy(file: &str, scheduler: Option<String>) -> Setup {
        Setup::Envoy {
            file: file.into(),
            scheduler,
            affinity: None,
            events: None,
        }
    }

    /// Whether the row's picker reads the engines' KV events (itself, or through Redis).
    fn reads_engine_events(&self) -> bool {
        matches!(
            self,
            Setup::Envoy {
                events: Some(_),
                ..
            } | Setup::KvCacheAware { .. }
        )
    }
}

/// The engine-events rows: the shipped row plus every pod's KV events, one row per
/// `picker.tokenizer` source (name suffix, source).
fn engine_event_rows() -> Vec<(&'static str, EngineEvents)> {
    vec![
        ("", EngineEvents::engine_tokenize()),
        (", file tokenizer", EngineEvents::file_tokenizer()),
    ]
}

/// The shipped default config (`deploy/local/config.yaml`), validated.
fn shipped_config() -> anyhow::Result<RowConfig> {
    Ok(RowConfig::load(&root().join("deploy/local/config.yaml"))?)
}

/// The `scheduler:` section of the shipped default config (Kthena's Helm
/// `routerConfiguration`), alone.
fn default_scheduler() -> anyhow::Result<String> {
    Ok(shipped_config()?.scheduler)
}

/// The kvcache-aware row's name.
const KVCACHE_ROW: &str = report::KVCACHE_AWARE;
/// Stands for the port of the sim the kvcache-aware row tokenizes on (set per cluster).
const TOKENIZER_PORT: &str = "65535";

/// Kthena's Helm plugin set (`scheduler`) with kvcache-aware in place of gpu-usage: its args
/// Kthena's defaults (blocks of 16 tokens, 128 of them, the sims' block size) and the port of
/// the sim that tokenizes ([`TOKENIZER_PORT`], replaced per cluster).
fn kvcache_scheduler(scheduler: &str) -> anyhow::Result<String> {
    use serde_yaml_ng::Value;
    let mut doc: Value = serde_yaml_ng::from_str(scheduler)?;
    let s = doc.get_mut("scheduler").context("no scheduler section")?;
    let enabled = s
        .get_mut("plugins")
        .and_then(|p| p.get_mut("Score"))
        .and_then(|p| p.get_mut("enabled"))
        .and_then(Value::as_sequence_mut)
        .context("no plugins.Score.enabled list")?;
    let gpu = enabled
        .iter_mut()
        .find(|e| e.get("name").and_then(Value::as_str) == Some("gpu-usage"))
        .context("no gpu-usage score plugin to replace")?;
    gpu["name"] = "kvcache-aware".into();
    let args: Value = serde_yaml_ng::from_str(&format!(
        "{{name: kvcache-aware, args: {{blockSizeToHash: 16, maxBlocksToMatch: 128, vllmTokenizerPort: {TOKENIZER_PORT}}}}}"
    ))?;
    s.get_mut("pluginConfig")
        .and_then(Value::as_sequence_mut)
        .context("no pluginConfig list")?
        .push(args);
    Ok(serde_yaml_ng::to_string(&doc)?)
}

/// The `picker.affinity` switches the ablation turns off, one at a time.
const ABLATION_SWITCHES: [&str; 7] = [
    "tentative",
    "experimental.consolidateTies",
    "loadGate",
    "latencyModel",
    "experimental.placeByChurn",
    "longPrompts",
    "experimental.engineBudget",
];

/// The latency model's signals (`latencySignals`), each left out alone by the ablation.
const LATENCY_SIGNALS: [&str; 4] = ["inflight", "engineQueue", "pace", "prefillFit"];

/// The scheduler section of the "prefix-cache only" rows.
const PREFIX_ONLY: &str = "scheduler:\n  plugins:\n    Filter: {enabled: []}\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 1}\n";

/// The routers of the suite, in report order. The peers run only when `bench/run` installed
/// them (`SGLANG_ROUTER_PYTHON`, `VLLM_ROUTER_BIN`, `SMG_BIN`). The shipped-config rows take
/// their routing from `config` (`suite --config`), else from the shipped config; the
/// shipped-config row (and after it the engine-events rows, and the ablation rows with
/// `ablation`) runs when that config has a `picker.affinity` section or was given: the shipped
/// config without one routes exactly as the Kthena row.
fn routers(
    ablation: bool,
    config: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(String, Setup)>> {
    let shipped = shipped_config()?;
    let rows = match config {
        Some(path) => RowConfig::load(path)?,
        None => shipped.clone(),
    };
    Ok(routers_from(
        shipped.scheduler,
        &rows,
        config.is_some(),
        ablation,
    ))
}

/// [`routers`], given the shipped config's `scheduler:` section (the Kthena rows') and the
/// config of the shipped-config rows (`given`: named by `--config`).
fn routers_from(
    scheduler: String,
    rows: &RowConfig,
    given: bool,
    ablation: bool,
) -> Vec<(String, Setup)> {
    let mut out = vec![
        (
            report::ROUND_ROBIN.to_string(),
            Setup::envoy("envoy-round-robin.yaml", None),
        ),
        (
            "prefix-picker: prefix-cache only".to_string(),
            Setup::envoy("envoy.yaml", Some(PREFIX_ONLY.to_string())),
        ),
        (
            "prefix-picker: Kthena default plugins".to_string(),
            Setup::envoy("envoy.yaml", Some(scheduler.clone())),
        ),
    ];
    let shipped_scheduler = &rows.scheduler;
    if rows.affinity.is_some() || given {
        out.push((
            report::SHIPPED.to_string(),
            Setup::Envoy {
                file: "envoy.yaml".into(),
                scheduler: Some(shipped_scheduler.clone()),
                affinity: rows.affinity.clone(),
                events: None,
            },
        ));
        for (suffix, events) in engine_event_rows() {
            out.push((
                format!("{}{suffix}", report::SHIPPED_ENGINE_EVENTS),
                Setup::Envoy {
                    file: "envoy.yaml".into(),
                    scheduler: Some(shipped_scheduler.clone()),
                    affinity: rows.affinity.clone(),
                    events: Some(events),
                },
            ));
        }
    }
    match &rows.affinity {
        Some(affinity) => {
            if ablation {
                // The shipped config with one `picker.affinity` key changed.
                // `key` is a `picker.affinity` key, or `experimental.KEY`.
                let mut row = |name: String, key: &str, value: serde_json::Value| {
                    let mut a = affinity.clone();
                    let (map, key) = match key.strip_prefix("experimental.") {
                        Some(key) => (
                            a.as_object_mut().map(|m| {
                                m.entry("experimental")
                                    .or_insert_with(|| serde_json::json!({}))
                            }),
                            key,
                        ),
                        None => (Some(&mut a), key),
                    };
                    if let Some(map) = map.and_then(serde_json::Value::as_object_mut) {
                        map.insert(key.into(), value);
                    }
                    out.push((
                        format!("{}{name}", report::ABLATION),
                        Setup::Envoy {
                            file: "envoy.yaml".into(),
                            scheduler: Some(shipped_scheduler.clone()),
                            affinity: Some(a),
                            events: None,
                        },
                    ));
                };
                for switch in ABLATION_SWITCHES {
                    let name = switch.trim_start_matches("experimental.");
                    row(format!("{name}: false"), switch, false.into());
                }
                // The share gate alone off (the latency model still gates): is it redundant?
                row(
                    "share gate off (shareHeadroom 1e9)".into(),
                    "shareHeadroom",
                    1e9.into(),
                );
                // The latency model's signals, each left out alone.
                for signal in LATENCY_SIGNALS {
                    let rest: Vec<&str> = LATENCY_SIGNALS
                        .into_iter()
                        .filter(|s| *s != signal)
                        .collect();
                    row(
                        format!("latencySignals without {signal}"),
                        "experimental.latencySignals",
                        rest.into(),
                    );
                }
            }
        }
        None if given => {
            if ablation {
                eprintln!(
                    "{} has no picker.affinity section: no ablation rows",
                    rows.path.display()
                );
            }
        }
        None => eprintln!(
            "{} has no picker.affinity section: no shipped-config{} rows",
            rows.path.display(),
            if ablation { " or ablation" } else { "" }
        ),
    }
    match kvcache_scheduler(&scheduler) {
        Ok(s) => out.push((
            KVCACHE_ROW.to_string(),
            Setup::KvCacheAware { scheduler: s },
        )),
        Err(e) => eprintln!("no {KVCACHE_ROW:?} row: {e}"),
    }
    if let Some(p) = std::env::var_os("SGLANG_ROUTER_PYTHON") {
        out.push((
            "sglang-router 0.3.2 cache_aware".into(),
            Setup::Sglang(p.into()),
        ));
    }
    if let Some(p) = std::env::var_os("VLLM_ROUTER_BIN") {
        out.push((
            "vllm-router 0.1.17 cache_aware".into(),
            Setup::Vllm(p.into()),
        ));
    }
    if let Some(p) = std::env::var_os("SMG_BIN") {
        out.push(("smg 1.13.0 cache_aware".into(), Setup::Smg(p.into())));
    }
    out.push((
        "oracle (groups pinned to pods, balanced, no router)".into(),
        Setup::Oracle,
    ));
    out.push((
        format!(
            "{}{CAPPED_ORACLE_LOAD} (placement searched offline, no router)",
            report::CAPPED_ORACLE
        ),
        Setup::OracleCapped,
    ));
    out
}

/// The engines of a row.
struct EnginePlan {
    /// Every sim's arguments ([`sim_args`]).
    args: Vec<String>,
    /// Sims (by index) that run with `--no-enable-prefix-caching`.
    caching_off: Vec<usize>,
    /// Sims that publish KV events and can be restarted ([`testkit::Sim`]).
    kv_events: bool,
    /// The model the workload's requests name (the kvcache-aware row's relays write it).
    model: String,
}

impl EnginePlan {
    /// `SIMS` sims with `args`, no events.
    fn plain(args: &[String]) -> EnginePlan {
        EnginePlan {
            args: args.to_vec(),
            caching_off: Vec::new(),
            kv_events: false,
            model: "model".into(),
        }
    }

    /// Sim `i`'s own arguments (after the common ones).
    fn extra(&self, i: usize) -> Vec<String> {
        if self.caching_off.contains(&i) {
            vec!["--no-enable-prefix-caching".to_string()]
        } else {
            Vec::new()
        }
    }

    /// Starts the sims `sim-0..SIMS`, each seeded with its number.
    fn start(&self) -> anyhow::Result<Sims> {
        let bin = bin_dir().join("model-sim");
        if self.kv_events {
            return Ok(Sims::Publishing(testkit::Sim::start_n(
                &bin,
                SIMS,
                &self.args,
                |i| self.extra(i),
            )?));
        }
        let sims = (0..SIMS)
            .map(|i| {
                let mut args = self.args.clone();
                args.extend(["--seed".to_string(), i.to_string()]);
                args.extend(self.extra(i));
                testkit::start_sim(&bin, &format!("sim-{i}"), &args)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Sims::Plain(sims))
    }
}

/// A row's running sims.
enum Sims {
    Plain(Vec<Process>),
    /// Publishing KV events, restartable.
    Publishing(Vec<testkit::Sim>),
}

impl Sims {
    /// The static endpoints `sim-0..` of a picker config.
    fn pods(&self) -> Vec<picker_config::Pod> {
        match self {
            Sims::Plain(sims) => sims
                .iter()
                .enumerate()
                .map(|(i, s)| picker_config::Pod {
                    name: format!("sim-{i}"),
                    addr: s.addr,
                    kv_events: None,
                })
                .collect(),
            Sims::Publishing(sims) => sims
                .iter()
                .map(|s| picker_config::Pod {
                    name: s.name().to_string(),
                    addr: s.addr(),
                    kv_events: Some(s.kv_events()),
                })
                .collect(),
        }
    }
}

struct Cluster {
    sims: Sims,
    /// The process behind Envoy's ext_proc cluster: prefix-picker or the no-op processor.
    ext_proc: Option<Process>,
    envoy: Option<testkit::EnvoyProcess>,
    peer: Option<Process>,
    url: String,
    sim_urls: Vec<String>,
    /// prefix-picker's admin address (its `/metrics`), when the row runs it.
    picker_admin: Option<std::net::SocketAddr>,
    /// The kvcache-aware row's redis-server and relays (killed on drop).
    _kvcache: Option<(prefix_bench::sync_cost::RedisChild, Vec<Process>)>,
    _dir: tempfile::TempDir,
}

/// A port that was free a moment ago. The peers cannot bind port 0 and report it, so this small
/// race is accepted in the benchmark (never in tests).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start_peer(
    setup: &Setup,
    dir: &std::path::Path,
    sim_urls: &[String],
) -> anyhow::Result<(Process, String)> {
    let (port, prometheus) = (free_port()?, free_port()?);
    let mut cmd = match setup {
        Setup::Sglang(python) => {
            let mut c = std::process::Command::new(python);
            c.args([
                "-m",
                "sglang_router.launch_router",
                "--prometheus-host",
                "127.0.0.1",
            ]);
            c
        }
        Setup::Vllm(bin) => std::process::Command::new(bin),
        Setup::Smg(bin) => {
            let mut c = std::process::Command::new(bin);
            c.args([
                "launch",
                "--prometheus-host",
                "127.0.0.1",
                "--log-level",
                "warn",
            ]);
            c
        }
        Setup::Envoy { .. }
        | Setup::KvCacheAware { .. }
        | Setup::NoopExtProc { .. }
        | Setup::Oracle
        | Setup::OracleCapped => {
            anyhow::bail!("not a peer")
        }
    };
    cmd.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--policy",
        "cache_aware",
    ])
    .args([
        "--prometheus-port",
        &prometheus.to_string(),
        "--worker-urls",
    ])
    .args(sim_urls)
    .env("HF_HUB_OFFLINE", "1")
    .stdout(std::fs::File::create(dir.join("peer.log"))?)
    .stderr(std::fs::File::create(dir.join("peer.err"))?);
    let child = cmd.spawn().context("starting the peer router")?;
    let process = Process::new(child, format!("127.0.0.1:{port}").parse()?);
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let ready_path = if matches!(setup, Setup::Sglang(_) | Setup::Smg(_)) {
        "/readiness"
    } else {
        "/health"
    };
    let start = std::time::Instant::now();
    loop {
        if let Ok(r) = client.get(format!("{url}{ready_path}")).send().await
            && r.status().is_success()
        {
            let text = r.text().await.unwrap_or_default();
            let ready = match setup {
                Setup::Sglang(_) => {
                    serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| {
                        v["status"] == "ready"
                            && v["healthy_workers"].as_u64() == Some(sim_urls.len() as u64)
                    })
                }
                _ => true,
            };
            // SMG registers workers asynchronously: wait until a request gets through.
            if ready && matches!(setup, Setup::Smg(_)) && !answers(&client, &url).await {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            if ready {
                return Ok((process, url));
            }
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "peer router did not become ready (see {})",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a router serves a one-token completion (its workers are registered).
async fn answers(client: &reqwest::Client, url: &str) -> bool {
    let probe = serde_json::json!({"model": "model", "prompt": "ready?", "max_tokens": 1});
    client
        .post(format!("{url}/v1/completions"))
        .json(&probe)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn start_cluster(setup: &Setup, sim_args: &[String]) -> anyhow::Result<Cluster> {
    start_cluster_on(setup, EnginePlan::plain(sim_args)).await
}

async fn start_cluster_on(setup: &Setup, mut engines: EnginePlan) -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let bins = bin_dir();
    if matches!(setup, Setup::Smg(_)) {
        // SMG sends a request only to workers that report its model (`/v1/models`).
        engines
            .args
            .extend(["--model".to_string(), "model".to_string()]);
    }
    // A row on model-sim's tokenizer.json: the sims run it, the picker's config names it.
    let events = match setup {
        Setup::Envoy {
            events: Some(e), ..
        } => {
            let (row, sim_args) = e.with_tokenizer_dir(dir.path())?;
            engines.args.extend(sim_args);
            Some(row)
        }
        _ => None,
    };
    let sims = engines.start()?;
    let pods = sims.pods();
    let backends: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let sim_urls: Vec<String> = backends.iter().map(|b| format!("http://{b}")).collect();
    let mut picker_admin = None;
    let mut kvcache = None;
    let (file, ext_proc) = match setup {
        Setup::KvCacheAware { scheduler } => {
            let (redis, url) = prefix_bench::sync_cost::start_redis(dir.path())?;
            let socket = url.trim_start_matches("redis+unix://").to_string();
            let mut relays = Vec::new();
            for pod in &pods {
                let ports = pod
                    .kv_events
                    .context("the kvcache-aware row's sims publish KV events")?;
                let log =
                    std::fs::File::create(dir.path().join(format!("relay-{}.log", pod.name)))?;
                let child = std::process::Command::new(bins.join("prefix-picker"))
                    .args([
                        "kv-relay",
                        "--model",
                        &engines.model,
                        "--pod-name",
                        &pod.name,
                    ])
                    .args(["--events-endpoint", &ports.endpoint()])
                    .args(["--replay-endpoint", &ports.replay_endpoint()])
                    .env("REDIS_HOST", &socket)
                    .env_remove("RUST_LOG")
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
                    .context("starting prefix-picker kv-relay")?;
                relays.push(Process::new(child, pod.addr));
            }
            kvcache = Some((redis, relays));
            let scheduler = scheduler.replace(TOKENIZER_PORT, &pods[0].addr.port().to_string());
            let config = picker_config::render(&scheduler, &pods, None, None)?;
            let (p, admin) = testkit::start_picker_with_env(
                &bins.join("prefix-picker"),
                dir.path(),
                &config,
                2,
                &[("REDIS_HOST", &socket)],
            )?;
            picker_admin = Some(admin);
            ("envoy.yaml", Some(p))
        }
        Setup::Envoy {
            file,
            scheduler: None,
            ..
        } => (file.as_str(), None),
        Setup::Envoy {
            file,
            scheduler: Some(s),
            affinity,
            ..
        } => {
            let config = picker_config::render(s, &pods, affinity.as_ref(), events.as_ref())?;
            let (p, admin) =
                testkit::start_picker(&bins.join("prefix-picker"), dir.path(), &config, 2)?;
            picker_admin = Some(admin);
            (file.as_str(), Some(p))
        }
        Setup::NoopExtProc { file } => {
            let p = testkit::start_noop_ext_proc(&std::env::current_exe()?, dir.path())?;
            (file.as_str(), Some(p))
        }
        Setup::Oracle | Setup::OracleCapped => {
            // No router: the driver sends each (pinned) request straight to its engine.
            return Ok(Cluster {
                url: sim_urls[0].clone(),
                sims,
                ext_proc: None,
                envoy: None,
                peer: None,
                sim_urls,
                picker_admin: None,
                _kvcache: None,
                _dir: dir,
            });
        }
        peer => {
            let (process, url) = start_peer(peer, dir.path(), &sim_urls).await?;
            return Ok(Cluster {
                sims,
                ext_proc: None,
                envoy: None,
                peer: Some(process),
                url,
                sim_urls,
                picker_admin: None,
                _kvcache: None,
                _dir: dir,
            });
        }
    };
    // Without an ext_proc (round robin) the example's port 9002 is never dialled.
    let ext_proc_port = ext_proc.as_ref().map_or(9002, |p| p.addr.port());
    let text = std::fs::read_to_string(root().join("envoy").join(file))?;
    let envoy = testkit::start_envoy(
        &envoy_bin()?,
        dir.path(),
        &render_envoy(&text, ext_proc_port, &backends),
    )
    .await?;
    Ok(Cluster {
        url: format!("http://127.0.0.1:{}", envoy.port),
        sims,
        ext_proc,
        envoy: Some(envoy),
        peer: None,
        sim_urls,
        picker_admin,
        _kvcache: kvcache,
        _dir: dir,
    })
}

fn write_results(
    out: &PathBuf,
    name: &str,
    results: &impl serde::Serialize,
    md: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(out.join(format!("{name}.md")), md)?;
    Ok(())
}

/// `suite --samples`: one JSON line per request of every run.
fn write_samples(path: &std::path::Path, results: &[RunResult]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in results {
        for s in &r.samples {
            let line = serde_json::json!({"router": r.router, "workload": r.workload, "rep": r.rep, "sample": s});
            writeln!(f, "{line}")?;
        }
    }
    f.flush()?;
    Ok(())
}

/// The rows without the engine-events rows this build of prefix-picker refuses (`prefix-picker
/// validate` on their config, with placeholder pods): a picker that predates the engine-events
/// keys would stop the whole suite at its first such row. Each dropped row is reported.
fn without_refused_rows(routers: Vec<(String, Setup)>) -> anyhow::Result<Vec<(String, Setup)>> {
    let pods: Vec<picker_config::Pod> = (0..SIMS)
        .map(|i| picker_config::Pod {
            name: format!("sim-{i}"),
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 8000 + i as u16)),
            kv_events: Some(testkit::KvEventPorts {
                publish: 5557 + 2 * i as u16,
                replay: 5558 + 2 * i as u16,
            }),
        })
        .collect();
    let dir = tempfile::tempdir()?;
    let mut out = Vec::new();
    for (name, setup) in routers {
        if let Setup::Envoy {
            scheduler: Some(s),
            affinity,
            events: Some(events),
            ..
        } = &setup
        {
            let path = dir.path().join("picker.yaml");
            let (events, _) = events.with_tokenizer_dir(dir.path())?;
            std::fs::write(
                &path,
                picker_config::render(s, &pods, affinity.as_ref(), Some(&events))?,
            )?;
            let check = std::process::Command::new(bin_dir().join("prefix-picker"))
                .arg("validate")
                .arg("--config")
                .arg(&path)
                .output()
                .context("running prefix-picker validate")?;
            if !check.status.success() {
                eprintln!(
                    "row {name:?} skipped: this prefix-picker refuses its config:\n{}",
                    String::from_utf8_lossy(&check.stderr).trim()
                );
                continue;
            }
        }
        out.push((name, setup));
    }
    Ok(out)
}

/// The driver's mid-run actions for `schedule`: restart sim `engine` after `after` requests
/// (none when the schedule is empty). Restarting needs sims that publish KV events
/// ([`testkit::Sim`]).
fn restarts_mid_run(
    sims: &mut Sims,
    schedule: Vec<workload::Restart>,
) -> Option<driver::MidRun<'_>> {
    if schedule.is_empty() {
        return None;
    }
    let Sims::Publishing(sims) = sims else {
        eprintln!("  restarts need restartable sims: none done");
        return None;
    };
    let after = schedule.iter().map(|r| r.after).collect();
    Some(driver::MidRun {
        after,
        act: Box::new(move |i| {
            let Some(sim) = schedule.get(i).and_then(|r| sims.get_mut(r.engine)) else {
                return Ok(());
            };
            let t = std::time::Instant::now();
            sim.restart()?;
            eprint!(
                " [{} restarted in {} ms] ",
                sim.name(),
                t.elapsed().as_millis()
            );
            Ok(())
        }),
    })
}

async fn suite(opts: SuiteOpts) -> anyhow::Result<()> {
    let SuiteOpts {
        quick,
        out,
        seed,
        repeat,
        workloads: only,
        routers: only_routers,
        ablation,
        ext_proc_floor,
        samples,
        config,
        trace,
    } = opts;
    let repeat = repeat.unwrap_or(if quick { 1 } else { 3 }) as usize;
    let (all, skipped) = workloads(quick, seed, &trace.unwrap_or_else(default_trace))?;
    let skipped: Vec<Skipped> = skipped
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|f| s.workload.starts_with(f.as_str())))
        .collect();
    for s in &skipped {
        eprintln!("skipping workload {}: {}", s.workload, s.reason);
    }
    let keys: Vec<&str> = all.iter().map(|w| w.key).collect();
    let selected: Vec<WorkloadSpec> = all.into_iter().filter(|w| w.selected(&only)).collect();
    anyhow::ensure!(
        !selected.is_empty(),
        "{}",
        if skipped.is_empty() {
            format!("no workload matches {only:?} (keys: {})", keys.join(", "))
        } else {
            "every selected workload was skipped (see above)".to_string()
        }
    );
    let routers: Vec<(String, Setup)> = routers(ablation, config.as_deref())?
        .into_iter()
        .filter(|(name, _)| {
            // `--ablation` asks for its rows whatever `--routers` selects.
            only_routers.is_empty()
                || name.starts_with(report::ABLATION)
                || only_routers.iter().any(|r| name.contains(r.as_str()))
        })
        .collect();
    anyhow::ensure!(!routers.is_empty(), "no router matches {only_routers:?}");
    let routers = without_refused_rows(routers)?;
    anyhow::ensure!(!routers.is_empty(), "every selected row was skipped");
    let reads_events = routers.iter().any(|(_, s)| s.reads_engine_events());
    let mut results = Vec::new();
    let started = std::time::Instant::now();
    for w in &selected {
        let ceiling = workload::ceiling_hit_rate(&w.requests, 16);
        let pinned = oracle::pin(&w.requests, SIMS);
        let capped = if routers
            .iter()
            .any(|(_, s)| matches!(s, Setup::OracleCapped))
        {
            let t = std::time::Instant::now();
            let s = placement_search::search(
                &w.requests,
                SIMS,
                w.kv_blocks,
                16,
                CAPPED_ORACLE_LOAD,
                CAPPED_ORACLE_BUDGET,
            );
            eprintln!(
                "{}: capped oracle placement searched in {:.1} s ({} placements): offline hit rate {:.1}% (balanced start {:.1}%)",
                w.name,
                t.elapsed().as_secs_f64(),
                s.evaluations,
                s.offline_hit_rate * 100.0,
                s.start_hit_rate * 100.0
            );
            // Which groups each pod serves (request counts), for small group counts.
            let mut per_pod: Vec<std::collections::BTreeMap<u32, usize>> =
                vec![Default::default(); SIMS];
            for (r, &pod) in w.requests.iter().zip(&s.assignment) {
                if let Some(g) = r.group {
                    *per_pod[pod].entry(g).or_default() += 1;
                }
            }
            if per_pod.iter().map(|m| m.len()).sum::<usize>() <= 64 {
                for (pod, groups) in per_pod.iter().enumerate() {
                    eprintln!("  pod {pod}: groups (requests) {groups:?}");
                }
            }
            oracle::pin_to(&w.requests, &s.assignment)
        } else {
            Vec::new()
        };
        let floor = ext_proc_floor.iter().any(|k| k == w.key).then(|| {
            (
                EXT_PROC_FLOOR.to_string(),
                Setup::NoopExtProc {
                    file: "envoy.yaml".into(),
                },
            )
        });
        for rep in 1..=repeat {
            for (router, setup) in routers
                .iter()
                .take(1)
                .chain(&floor)
                .chain(routers.iter().skip(1))
            {
                eprintln!(
                    "[{:.0} s] {} | {router} | run {rep}/{repeat}",
                    started.elapsed().as_secs_f64(),
                    w.name
                );
                let engines = EnginePlan {
                    args: sim_args(w.kv_blocks, w.max_num_seqs),
                    caching_off: w.caching_off.clone(),
                    kv_events: reads_events || w.restarts,
                    model: workload::model(&w.requests).to_string(),
                };
                let mut c = start_cluster_on(setup, engines).await?;
                let requests = match setup {
                    Setup::Oracle => &pinned,
                    Setup::OracleCapped => &capped,
                    _ => &w.requests,
                };
                driver::warm_up(
                    &c.url,
                    &c.sim_urls,
                    matches!(setup, Setup::Oracle | Setup::OracleCapped),
                    workload::model(&w.requests),
                )
                .await;
                let warm_up_reasons = match c.picker_admin {
                    Some(admin) => probe::decision_reasons(&[admin]).await,
                    None => Default::default(),
                };
                let mid_run = restarts_mid_run(&mut c.sims, w.restart_schedule());
                let mut r = driver::run_with(
                    router,
                    w.name,
                    &c.url,
                    &c.sim_urls,
                    requests,
                    w.arrival,
                    ceiling,
                    mid_run,
                )
                .await;
                r.rep = rep;
                if let Some(admin) = c.picker_admin {
                    let reasons = probe::decision_reasons(&[admin]).await;
                    let shown: Vec<String> = reasons
                        .iter()
                        .map(|(reason, n)| {
                            (reason, n - warm_up_reasons.get(reason).unwrap_or(&0.0))
                        })
                        .filter(|(_, n)| *n > 0.0)
                        .map(|(reason, n)| format!("{reason} {n}"))
                        .collect();
                    eprintln!("  decisions: {}", shown.join(", "));
                    let learned = probe::latency_model(admin).await;
                    if !learned.is_empty() {
                        eprintln!("  latency model: {learned}");
                    }
                }
                eprintln!(
                    "  hit rate {:.1}% (ceiling {:.1}%), TTFT p50 {:.0} ms, max/mean pod share {:.2}, pods per group {:.2}, errors {}",
                    r.hit_rate * 100.0,
                    ceiling * 100.0,
                    r.ttft_ms.p50,
                    r.max_over_mean,
                    r.pods_per_group,
                    r.errors
                );
                results.push(r);
            }
        }
    }
    let suite = SuiteResults {
        runs: results,
        skipped,
        config,
    };
    let md = suite.markdown();
    println!("{md}");
    let name = if quick { "suite-quick" } else { "suite" };
    write_results(&out, name, &suite, &md)?;
    let json = out.join(format!("{name}.json"));
    std::fs::write(summary_path(&json), summary::markdown(&suite))?;
    if samples {
        write_samples(&out.join(format!("{name}-samples.jsonl")), &suite.runs)?;
    }
    report::plot(&suite.runs, &out.join(format!("{name}.png")))
}

/// The summary beside a results file: `suite.json` -> `suite-summary.md`.
fn summary_path(results: &std::path::Path) -> PathBuf {
    let stem = results
        .file_stem()
        .map_or_else(|| "suite".into(), |s| s.to_string_lossy());
    results.with_file_name(format!("{stem}-summary.md"))
}

// Options of `prefix-bench pd` (help text: the `Cmd::Pd` doc comment).
#[derive(Debug, Args)]
struct PdOpts {
    #[arg(long, default_value_t = 2)]
    prefill: usize,
    #[arg(long, default_value_t = 2)]
    decode: usize,
    /// Shared prefixes (system prompts), each asked `per_group` questions.
    #[arg(long, default_value_t = 24)]
    groups: usize,
    #[arg(long, default_value_t = 8)]
    per_group: usize,
    #[arg(long, default_value_t = 2048)]
    system_tokens: usize,
    #[arg(long, default_value_t = 64)]
    question_tokens: usize,
    #[arg(long, default_value_t = 32)]
    output_tokens: usize,
    /// KV cache blocks (16 tokens) per sim: the default holds about half the prefixes.
    #[arg(long, default_value_t = 1536)]
    kv_blocks: usize,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

/// `prefix-bench pd` (see `prefix_bench::pd`).
async fn pd(opts: PdOpts) -> anyhow::Result<()> {
    use prefix_bench::pd;
    let name = format!(
        "PD shared-prefix ({} prefill + {} decode sims; {} groups x {}, system {} tok, question {}, out {}; {} KV blocks per sim; concurrency {})",
        opts.prefill,
        opts.decode,
        opts.groups,
        opts.per_group,
        opts.system_tokens,
        opts.question_tokens,
        opts.output_tokens,
        opts.kv_blocks,
        opts.concurrency
    );
    let requests = workload::shared_prefix(
        opts.groups,
        opts.per_group,
        opts.system_tokens,
        opts.question_tokens,
        opts.output_tokens,
        opts.seed,
        "model",
    );
    let scheduler = default_scheduler()?;
    let envoy_yaml = std::fs::read_to_string(root().join("envoy/envoy.yaml"))?;
    let bins = bin_dir();
    let mut rows = Vec::new();
    for router in [
        "round-robin pairs",
        "prefix-picker pdGroup (Kthena default plugins)",
    ] {
        eprintln!("{name} | {router}");
        let dir = tempfile::tempdir()?;
        let start = |role: &str, n: usize| -> anyhow::Result<Vec<Process>> {
            let mut args = sim_args(opts.kv_blocks, 64);
            args.extend(["--role".to_string(), role.to_string()]);
            (0..n)
                .map(|i| {
                    let mut args = args.clone();
                    args.extend(["--seed".to_string(), i.to_string()]);
                    testkit::start_sim(&bins.join("model-sim"), &format!("{role}-{i}"), &args)
                })
                .collect()
        };
        let prefill = start("prefill", opts.prefill)?;
        let decode = start("decode", opts.decode)?;
        let prefill_addrs: Vec<_> = prefill.iter().map(|s| s.addr).collect();
        let decode_addrs: Vec<_> = decode.iter().map(|s| s.addr).collect();
        let url = |a: &std::net::SocketAddr| format!("http://{a}");
        let prefill_urls: Vec<String> = prefill_addrs.iter().map(url).collect();
        let decode_urls: Vec<String> = decode_addrs.iter().map(url).collect();
        let mut processes = Vec::new();
        let (base, requests) = if router.starts_with("round-robin") {
            (
                decode_urls[0].clone(),
                pd::round_robin_pairs(&requests, &prefill_addrs, decode_urls.len()),
            )
        } else {
            let config = pd::picker_config(&scheduler, &prefill_addrs, &decode_addrs);
            let (picker, _admin) =
                testkit::start_picker(&bins.join("prefix-picker"), dir.path(), &config, 2)?;
            let mut all = prefill_addrs.clone();
            all.extend(&decode_addrs);
            let envoy = testkit::start_envoy(
                &envoy_bin()?,
                dir.path(),
                &render_envoy(&envoy_yaml, picker.addr.port(), &all),
            )
            .await?;
            let base = format!("http://127.0.0.1:{}", envoy.port);
            processes.push((picker, envoy));
            (base, requests.clone())
        };
        let row = pd::run_row(
            router,
            &base,
            &prefill_urls,
            &decode_urls,
            &requests,
            opts.concurrency,
        )
        .await;
        eprintln!(
            "  prefill hit rate {:.1}%, {} errors",
            100.0 * row.prefill_hit_rate,
            row.errors
        );
        rows.push(row);
        drop(processes);
        drop((prefill, decode));
    }
    let md = pd::markdown(&name, &rows);
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(
        opts.out.join("pd.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(opts.out.join("pd.md"), &md)?;
    println!("{md}");
    Ok(())
}

// Options of `prefix-bench replicas` (help text: the `Cmd::Replicas` doc comment).
#[derive(Debug, Args)]
struct ReplicasOpts {
    #[arg(long)]
    quick: bool,
    /// Score with prefix-cache alone (no load-aware plugins), like the suite's row.
    #[arg(long)]
    prefix_only: bool,
    /// Use the `scheduler:` section of this config file instead (to compare plugin sets).
    #[arg(long, conflicts_with = "prefix_only")]
    scheduler: Option<PathBuf>,
    /// Run the pickers with `--v 4` (score lines) and copy their logs into this directory.
    #[arg(long)]
    logs: Option<PathBuf>,
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

async fn replicas(opts: ReplicasOpts) -> anyhow::Result<()> {
    let ReplicasOpts {
        quick,
        prefix_only,
        scheduler,
        logs,
        out,
        seed,
    } = opts;
    let (name, requests, arrival) = if quick {
        (
            "shared-prefix (16 groups x 8, system 1024 tok, question 64, out 32)",
            workload::shared_prefix(16, 8, 1024, 64, 32, seed, "model"),
            Arrival::Closed { concurrency: 8 },
        )
    } else {
        (
            "shared-prefix (64 groups x 16, system 2048 tok, question 128, out 64)",
            workload::shared_prefix(64, 16, 2048, 128, 64, seed, "model"),
            Arrival::Closed { concurrency: 32 },
        )
    };
    let ceiling = workload::ceiling_hit_rate(&requests, 16);
    let scheduler = match scheduler {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            testkit::scheduler_section(&text).to_string()
        }
        None if prefix_only => PREFIX_ONLY.to_string(),
        None => default_scheduler()?,
    };
    let verbosity = if logs.is_some() { 4 } else { 2 };
    let envoy_yaml = std::fs::read_to_string(root().join("envoy/envoy.yaml"))?;
    let bins = bin_dir();
    let mut results = Vec::new();
    for (label, n, sync) in [
        ("1 replica", 1, false),
        ("3 replicas, no sync", 3, false),
        ("3 replicas, Redis sync", 3, true),
    ] {
        eprintln!("{name} | {label}");
        let dir = tempfile::tempdir()?;
        let sims = testkit::start_sims(&bins.join("model-sim"), SIMS, &sim_args(4096, 64))?;
        let backends: Vec<_> = sims.iter().map(|s| s.addr).collect();
        let sim_urls: Vec<String> = backends.iter().map(|b| format!("http://{b}")).collect();
        let redis = if sync {
            Some(prefix_bench::sync_cost::start_redis(dir.path())?)
        } else {
            None
        };
        let mut replicas = Vec::new();
        let mut urls = Vec::new();
        let mut admins = Vec::new();
        for i in 0..n {
            let rdir = dir.path().join(format!("replica-{i}"));
            std::fs::create_dir_all(&rdir)?;
            let mut config = scheduler.clone();
            let names: Vec<String> = (0..SIMS).map(|i| format!("sim-{i}")).collect();
            config.push_str(&testkit::endpoints_yaml(
                names
                    .iter()
                    .map(String::as_str)
                    .zip(backends.iter().copied()),
            ));
            config.push_str("picker: {scrapeIntervalSeconds: 0.1}\n");
            if let Some((_, url)) = &redis {
                config.push_str(&format!("sync:\n  redis:\n    url: \"{url}\"\n"));
            }
            let (picker, admin) =
                testkit::start_picker(&bins.join("prefix-picker"), &rdir, &config, verbosity)?;
            admins.push(admin);
            let envoy = testkit::start_envoy(
                &envoy_bin()?,
                &rdir,
                &render_envoy(&envoy_yaml, picker.addr.port(), &backends),
            )
            .await?;
            urls.push(format!("http://127.0.0.1:{}", envoy.port));
            replicas.push((picker, envoy));
        }
        let r = driver::run(
            label,
            name,
            &urls.join(","),
            &sim_urls,
            &requests,
            arrival,
            ceiling,
        )
        .await;
        eprintln!(
            "  hit rate {:.1}% (ceiling {:.1}%), TTFT p50 {:.0} ms, errors {}, decisions {:?}",
            r.hit_rate * 100.0,
            ceiling * 100.0,
            r.ttft_ms.p50,
            r.errors,
            probe::decision_reasons(&admins).await,
        );
        if let Some(logs) = &logs {
            for i in 0..n {
                let to = logs.join(format!(
                    "{}-replica-{i}.log",
                    label.replace([' ', ','], "_")
                ));
                std::fs::create_dir_all(logs)?;
                std::fs::copy(dir.path().join(format!("replica-{i}/picker.log")), to)?;
            }
        }
        results.push(r);
    }
    let md = report::markdown(&results);
    println!("{md}");
    write_results(
        &out,
        if quick { "replicas-quick" } else { "replicas" },
        &results,
        &md,
    )
}

async fn overhead(
    requests: usize,
    concurrency: &str,
    output_tokens: usize,
    envoy_files: &[String],
    out: PathBuf,
    rounds: usize,
) -> anyhow::Result<()> {
    let levels: Vec<usize> = concurrency
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let instant: Vec<String> = ["--time-scale", "1000000000", "--default-max-tokens", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let shipped = shipped_config()?;
    let (scheduler, affinity) = (shipped.scheduler, shipped.affinity);
    let mut setups: Vec<(String, RowKind, Setup)> = Vec::new();
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
        // The shipped config (affinity mode), what the demo and the chart run.
        if let Some(affinity) = &affinity {
            setups.push((
                format!("Envoy + prefix-picker, shipped config ({file})"),
                RowKind::Picker { file: file.clone() },
                Setup::Envoy {
                    file: file.clone(),
                    scheduler: Some(scheduler.clone()),
                    affinity: Some(affinity.clone()),
                    events: None,
                },
            ));
        }
    }
    for (name, setup) in routers(false, None)? {
        if matches!(setup, Setup::Sglang(_) | Setup::Vllm(_) | Setup::Smg(_)) {
            setups.push((name, RowKind::Peer, setup));
        }
    }
    let baseline = (
        "Envoy alone (round robin)".to_string(),
        RowKind::Alone,
        Setup::envoy("envoy-round-robin.yaml", None),
    );
    let prompts: Vec<BenchRequest> = (0..requests)
        .map(|i| {
            BenchRequest::new(
                "/v1/completions",
                serde_json::json!({"model": "model", "prompt": workload::text(i as u64 + 11, 8192), "max_tokens": output_tokens.max(1), "stream": true}),
                None,
            )
        })
        .collect();
    let mut md = format!(
        "8 KiB prompts, {output_tokens} output token(s) per streamed response, {requests} requests per row\n\n"
    );
    md.push_str(overhead::ROUND_TABLE_HEADER);
    let mut rows = Vec::new();
    let mut summary_rows = Vec::new();
    for &c in &levels {
        for round in 1..=rounds {
            // The baseline first (the live lines compare with it); the others in turn reversed
            // every other round, so no setup always runs right after the baseline.
            let mut order: Vec<&(String, RowKind, Setup)> = setups.iter().collect();
            if round % 2 == 0 {
                order.reverse();
            }
            order.insert(0, &baseline);
            let mut baseline_p50 = None;
            for (name, kind, setup) in order {
                let (result, proxy_cpu_ms, ext_proc_cpu_ms) =
                    measure_overhead(name, setup, c, &prompts, &instant).await?;
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
                md.push_str(&line);
                summary_rows.push(row);
                rows.push(result);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    if rounds > 1 {
        md.push('\n');
        md.push_str(&overhead::summary_markdown(&summary_rows));
    }
    println!("{md}");
    write_results(&out, &format!("overhead-{output_tokens}tok"), &rows, &md)
}

/// Starts `setup`, warms it up, runs `prompts` through it at concurrency `c` and stops it.
/// Returns the run and the CPU per request of the proxy and of the external processor (if any).
async fn measure_overhead(
    name: &str,
    setup: &Setup,
    c: usize,
    prompts: &[BenchRequest],
    instant: &[String],
) -> anyhow::Result<(RunResult, f64, Option<f64>)> {
    let cluster = start_cluster(setup, instant).await?;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Suite(opts) => suite(opts).await,
        Cmd::Overhead {
            requests,
            concurrency,
            output_tokens,
            envoy_files,
            out,
            rounds,
        } => {
            overhead(
                requests,
                &concurrency,
                output_tokens,
                &envoy_files,
                out,
                rounds as usize,
            )
            .await
        }
        Cmd::Replicas(opts) => replicas(opts).await,
        Cmd::Pd(opts) => pd(opts).await,
        Cmd::TokenizeCost {
            calls,
            tokenizer_json,
        } => {
            let sim = bin_dir().join("model-sim");
            let lines =
                prefix_bench::tokenize_cost::run(&sim, calls, tokenizer_json.as_deref()).await?;
            print!("{}", prefix_bench::tokenize_cost::table(&lines));
            Ok(())
        }
        Cmd::NoopExtProc { grpc_addr } => {
            let listener = tokio::net::TcpListener::bind(&grpc_addr)
                .await
                .with_context(|| format!("binding {grpc_addr}"))?;
            // `testkit::start_noop_ext_proc` reads this line.
            eprintln!("noop-ext-proc serving grpc_addr={}", listener.local_addr()?);
            prefix_bench::noop_ext_proc::serve(listener).await
        }
        Cmd::SyncApply {
            rate,
            seconds,
            blocks,
            pods,
        } => {
            let bin = bin_dir().join("prefix-picker");
            let cost = prefix_bench::sync_cost::run(&bin, rate, seconds, blocks, pods).await?;
            println!("{}", serde_json::to_string_pretty(&cost)?);
            Ok(())
        }
        Cmd::Report {
            results,
            summary: only_summary,
        } => {
            let suite = SuiteResults::read(&results)?;
            if only_summary {
                print!("{}", summary::markdown(&suite));
                return Ok(());
            }
            std::fs::write(results.with_extension("md"), suite.markdown())?;
            std::fs::write(summary_path(&results), summary::markdown(&suite))?;
            report::plot(&suite.runs, &results.with_extension("png"))
        }
        Cmd::Run {
            url,
            sims,
            workload: name,
            concurrency,
            rate,
            seed,
        } => {
            let w = workloads(false, seed, &default_trace())?
                .0
                .into_iter()
                .find(|w| w.selected(std::slice::from_ref(&name)))
                .with_context(|| format!("unknown workload {name:?}"))?;
            if w.restarts || !w.caching_off.is_empty() {
                eprintln!(
                    "note: `run` neither starts nor restarts the engines: {} sends its requests with no engine disturbed",
                    w.key
                );
            }
            // A workload with its own arrival times (trace, ramp) keeps them.
            let arrival = match (rate, w.arrival) {
                (Some(rate), _) => Arrival::Poisson { rate, seed },
                (None, Arrival::Trace) => Arrival::Trace,
                (None, _) => Arrival::Closed { concurrency },
            };
            let sims: Vec<String> = sims
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let ceiling = workload::ceiling_hit_rate(&w.requests, 16);
            let r = driver::run(&url, w.name, &url, &sims, &w.requests, arrival, ceiling).await;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(w: &'a [WorkloadSpec], key: &str) -> Option<&'a WorkloadSpec> {
        w.iter().find(|w| w.key == key)
    }

    #[test]
    fn the_engine_truth_workloads_are_the_full_multi_tenant_one_disturbed() {
        let all = workloads(false, 1, &default_trace()).unwrap().0;
        let tenants = find(&all, "multi-tenant").unwrap();
        let restarts = find(&all, "engine-restarts").unwrap();
        let off = find(&all, "caching-off").unwrap();
        for w in [restarts, off] {
            assert_eq!(w.requests.len(), tenants.requests.len(), "{}", w.key);
            assert_eq!(w.requests[7].body, tenants.requests[7].body, "{}", w.key);
            assert_eq!(w.arrival, tenants.arrival);
            assert_eq!(
                (w.kv_blocks, w.max_num_seqs),
                (tenants.kv_blocks, tenants.max_num_seqs)
            );
        }
        // Every engine restarts once, one at a time, inside the run; no pod without caching.
        let schedule = restarts.restart_schedule();
        assert_eq!(
            schedule.iter().map(|r| r.engine).collect::<Vec<_>>(),
            (0..SIMS).collect::<Vec<_>>()
        );
        assert!(schedule.last().unwrap().after < restarts.requests.len());
        assert!(restarts.caching_off.is_empty());
        // One pod never reuses its cache; nothing restarts.
        assert_eq!(off.caching_off, vec![CACHING_OFF_POD]);
        assert!(off.restart_schedule().is_empty());
        // The other workloads are undisturbed, and `--quick` has neither new one.
        for w in all
            .iter()
            .filter(|w| !["engine-restarts", "caching-off"].contains(&w.key))
        {
            assert!(w.caching_off.is_empty() && !w.restarts, "{}", w.key);
        }
        let quick = workloads(true, 1, &default_trace()).unwrap().0;
        assert!(find(&quick, "engine-restarts").is_none() && find(&quick, "caching-off").is_none());
    }

    #[test]
    fn only_the_caching_off_pod_gets_the_flag() {
        let plan = EnginePlan {
            args: sim_args(1024, 8),
            caching_off: vec![CACHING_OFF_POD],
            kv_events: false,
            model: "model".into(),
        };
        for i in 0..SIMS {
            assert_eq!(
                plan.extra(i),
                if i == CACHING_OFF_POD {
                    vec!["--no-enable-prefix-caching".to_string()]
                } else {
                    Vec::new()
                }
            );
        }
    }

    #[test]
    fn the_engine_events_rows_follow_the_shipped_row_and_read_events() {
        let rows = RowConfig {
            path: "config.yaml".into(),
            scheduler: PREFIX_ONLY.to_string(),
            affinity: Some(serde_json::json!({"tentative": true})),
        };
        let routers = routers_from(PREFIX_ONLY.to_string(), &rows, false, true);
        let names: Vec<&str> = routers.iter().map(|(n, _)| n.as_str()).collect();
        let shipped = names.iter().position(|n| *n == report::SHIPPED).unwrap();
        assert_eq!(names[shipped + 1], report::SHIPPED_ENGINE_EVENTS);
        let (_, setup) = &routers[shipped + 1];
        assert!(setup.reads_engine_events());
        let (
            Setup::Envoy {
                affinity,
                scheduler,
                events: Some(events),
                ..
            },
            Setup::Envoy {
                affinity: a0,
                scheduler: s0,
                ..
            },
        ) = (setup, &routers[shipped].1)
        else {
            panic!("not picker rows");
        };
        // The shipped row's config, plus the events.
        assert_eq!((affinity, scheduler), (a0, s0));
        assert_eq!(
            affinity.as_ref(),
            Some(&serde_json::json!({"tentative": true}))
        );
        assert_eq!(events, &EngineEvents::engine_tokenize());
        assert_eq!(
            names[shipped + 2],
            format!("{}, file tokenizer", report::SHIPPED_ENGINE_EVENTS)
        );
        assert_eq!(
            routers
                .iter()
                .filter(|(_, s)| s.reads_engine_events())
                .count(),
            engine_event_rows().len()
        );
    }

    fn scheduler_of(routers: &[(String, Setup)], name: &str) -> Option<String> {
        routers.iter().find_map(|(n, s)| match s {
            Setup::Envoy { scheduler, .. } if n == name => scheduler.clone(),
            _ => None,
        })
    }

    #[test]
    fn a_given_config_drives_the_shipped_rows_and_only_them() {
        let mine = RowConfig {
            path: "mine.yaml".into(),
            scheduler: "scheduler: {mine: true}\n".into(),
            affinity: None,
        };
        let routers = routers_from("scheduler: {kthena: true}\n".into(), &mine, true, true);
        assert_eq!(
            scheduler_of(&routers, report::SHIPPED).as_deref(),
            Some("scheduler: {mine: true}\n")
        );
        assert_eq!(
            scheduler_of(&routers, report::SHIPPED_ENGINE_EVENTS).as_deref(),
            Some("scheduler: {mine: true}\n")
        );
        assert_eq!(
            scheduler_of(&routers, "prefix-picker: Kthena default plugins").as_deref(),
            Some("scheduler: {kthena: true}\n")
        );
        // No affinity mapping: nothing for the ablation to switch off.
        assert!(!routers.iter().any(|(n, _)| n.starts_with(report::ABLATION)));
        // The shipped config without an affinity mapping has no shipped row at all.
        let plain = routers_from("scheduler: {}\n".into(), &mine, false, true);
        assert!(!plain.iter().any(|(n, _)| n.starts_with(report::SHIPPED)));
    }

    #[test]
    fn a_missing_trace_is_skipped_naming_the_file_and_where_to_get_it() {
        let missing = std::path::Path::new("/nonexistent/synthetic_trace.jsonl");
        for quick in [false, true] {
            let (w, skipped) = workloads(quick, 1, missing).unwrap();
            assert!(find(&w, "trace").is_none());
            assert_eq!(skipped.len(), 1);
            assert_eq!(skipped[0].workload, "trace");
            let reason = &skipped[0].reason;
            assert!(
                reason.contains("/nonexistent/synthetic_trace.jsonl"),
                "{reason}"
            );
            assert!(reason.contains("kvcache-ai/Mooncake") && reason.contains("--trace"));
        }
    }

    #[test]
    fn every_suite_flag_has_help() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let suite = cli.find_subcommand("suite").unwrap();
        for arg in suite.get_arguments() {
            if ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{} has no help", arg.get_id());
        }
    }
}
