//! `prefix-bench`: the benchmark driver.
//!
//! - `suite [--quick]`: for each workload and router (Envoy round robin; Envoy + prefix-picker
//!   with prefix-cache only, with Kthena's default plugins, with llm-d's default
//!   `EndpointPickerConfig`, with the shipped config, with the shipped config reading the
//!   engines' KV events; the peer routers `bench/run` installed; the
//!   oracle), starts fresh model-sims, the picker and Envoy as processes, runs the workload
//!   `--repeat` times (interleaved) and writes `suite.json` (every run, the skipped workloads),
//!   `suite.md` (medians) and `suite-summary.md` (a line per workload, `prefix_bench::summary`).
//!   When a selected row reads KV events, or the workload restarts engines, every row of that
//!   workload runs on sims that publish them (the same engines for every row). `--config`
//!   gives the shipped-config rows another picker config (`prefix_bench::row_config`).
//! - `overhead`: instant backends, fixed concurrency: requests/s, p50/p99 latency and CPU per
//!   request of Envoy alone vs Envoy + a no-op ext_proc vs Envoy + the routing floor (the no-op
//!   plus the routing any prefix-cache router must do) vs Envoy + prefix-picker (each Envoy
//!   setup), in one run, with the CPU ratios to both floors.
//! - `run`: one workload against an existing router URL.
//! - `report`: rewrite the markdown, summary and PNG of a results file (`--summary`: print it).
//! - `pd`: prefill/decode disaggregation, prefix-picker's `pdGroup` pairs against round-robin
//!   pairs on model-sims in PD roles; the headline is the prefill hit rate (`prefix_bench::pd`).
//! - `noop-ext-proc` (hidden): the no-op external processor of the overhead baseline, run as its
//!   own process by `overhead`.
//! - `routing-floor` (hidden): the no-op's protocol plus the routing any prefix-cache router must
//!   do, with prefix-picker's core alone; `overhead`'s floor row (`prefix_bench::routing_floor`).
//!
//! This file is the command line and the dispatch; each subcommand is a module of `cmd/`, and
//! what they share (the workload catalogue, the rows, a row's processes) is the library's.

mod cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use cmd::pd::PdOpts;
use cmd::replicas::ReplicasOpts;
use cmd::suite::SuiteOpts;

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
    /// Proxy overhead: Envoy alone vs Envoy + a no-op ext_proc vs Envoy + the routing floor vs
    /// Envoy + prefix-picker, instant backends.
    Overhead {
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        #[arg(long, default_value = "1,16")]
        concurrency: String,
        /// Output tokens per response (SSE events); >1 measures the per-chunk cost.
        #[arg(long, default_value_t = 1)]
        output_tokens: usize,
        /// Envoy bootstraps under `envoy/` to compare: each gets a no-op ext_proc row, a
        /// routing-floor row and the prefix-picker rows.
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
        /// The requests: distinct 8 KiB completions, or 2 KiB chats (a 1 KiB system prompt of
        /// one of eight tenants, a distinct 1 KiB question), whose heads the engine-events row
        /// looks up and tokenizes as a tenant's requests do.
        #[arg(long, value_enum, default_value_t = cmd::overhead::Prompts::Completion)]
        prompts: cmd::overhead::Prompts,
    },
    /// Rewrite the markdown, the summary and the PNG of a results JSON file (next to it).
    Report {
        /// A results file: `suite.json` (or an earlier array of runs).
        results: PathBuf,
        /// Print the summary (one line per workload, as `suite-summary.md`) and write nothing.
        #[arg(long)]
        summary: bool,
    },
    /// Where each row's uncached prompt tokens went, from `suite --samples`'s
    /// `suite-samples.jsonl`: a table per workload, losses by cause (a group's first request, in
    /// flight, evicted, moved to a new pod, the request's own tokens; `prefix_bench::misses`).
    Misses {
        /// The samples file `suite --samples` wrote.
        samples: PathBuf,
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
    /// Serve the routing floor (`prefix_bench::routing_floor`); `overhead` runs it.
    #[command(hide = true)]
    RoutingFloor {
        #[arg(long, default_value = "127.0.0.1:0")]
        grpc_addr: String,
        /// A picker config file: its scheduler, `picker.affinity` and static endpoints.
        #[arg(long)]
        config: PathBuf,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Suite(opts) => cmd::suite::run(opts).await,
        Cmd::Overhead {
            requests,
            concurrency,
            output_tokens,
            envoy_files,
            out,
            rounds,
            prompts,
        } => {
            cmd::overhead::run(
                requests,
                &concurrency,
                output_tokens,
                &envoy_files,
                out,
                rounds as usize,
                prompts,
            )
            .await
        }
        Cmd::Replicas(opts) => cmd::replicas::run(opts).await,
        Cmd::Pd(opts) => cmd::pd::run(opts).await,
        Cmd::TokenizeCost {
            calls,
            tokenizer_json,
        } => cmd::tokenize_cost::run(calls, tokenizer_json.as_deref()).await,
        Cmd::NoopExtProc { grpc_addr } => cmd::noop_ext_proc::run(&grpc_addr).await,
        Cmd::RoutingFloor { grpc_addr, config } => {
            cmd::routing_floor::run(&grpc_addr, &config).await
        }
        Cmd::SyncApply {
            rate,
            seconds,
            blocks,
            pods,
        } => cmd::sync_apply::run(rate, seconds, blocks, pods).await,
        Cmd::Report {
            results,
            summary: only_summary,
        } => cmd::report::run(&results, only_summary),
        Cmd::Misses { samples } => cmd::misses::run(&samples),
        Cmd::Run {
            url,
            sims,
            workload,
            concurrency,
            rate,
            seed,
        } => cmd::run::run(url, sims, workload, concurrency, rate, seed).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
