//! `prefix-bench replicas`: 1 replica vs 3 without sync vs 3 with Redis sync, each a
//! prefix-picker + Envoy over the same sims, requests round-robin over the replicas.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use prefix_bench::driver::{self, Arrival, RunResult};
use prefix_bench::engines::{SIMS, sim_args};
use prefix_bench::probe;
use prefix_bench::project::{default_scheduler, envoy_bin, root};
use prefix_bench::report::{self, write_results};
use prefix_bench::rows::PREFIX_ONLY;
use prefix_bench::workload::{self, BenchRequest};
use testkit::{Process, bin_dir, render_envoy};

// Options of `prefix-bench replicas` (help text: the `Cmd::Replicas` doc comment).
#[derive(Debug, Args)]
pub struct ReplicasOpts {
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

/// The setups compared (label, replicas, Redis sync).
const SETUPS: [(&str, usize, bool); 3] = [
    ("1 replica", 1, false),
    ("3 replicas, no sync", 3, false),
    ("3 replicas, Redis sync", 3, true),
];

/// Runs the three setups and writes `replicas.json` and `replicas.md`.
pub async fn run(opts: ReplicasOpts) -> anyhow::Result<()> {
    let (name, requests, arrival) = shared_prefix(opts.quick, opts.seed);
    let bench = Bench {
        name,
        ceiling: workload::ceiling_hit_rate(&requests, 16),
        requests,
        arrival,
        scheduler: scheduler_of(opts.scheduler.as_deref(), opts.prefix_only)?,
        verbosity: if opts.logs.is_some() { 4 } else { 2 },
        envoy_yaml: std::fs::read_to_string(root().join("envoy/envoy.yaml"))?,
    };
    let mut results = Vec::new();
    for (label, n, sync) in SETUPS {
        eprintln!("{name} | {label}");
        results.push(
            bench
                .run_setup(label, n, sync, opts.logs.as_deref())
                .await?,
        );
    }
    let md = report::markdown(&results);
    println!("{md}");
    write_results(
        &opts.out,
        if opts.quick {
            "replicas-quick"
        } else {
            "replicas"
        },
        &results,
        &md,
    )
}

/// The workload: shared prefixes, small with `quick`.
fn shared_prefix(quick: bool, seed: u64) -> (&'static str, Vec<BenchRequest>, Arrival) {
    if quick {
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
    }
}

/// The pickers' `scheduler:` section: from the file `--scheduler` names, prefix-cache alone
/// (`--prefix-only`), or the shipped config's.
fn scheduler_of(path: Option<&Path>, prefix_only: bool) -> anyhow::Result<String> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            testkit::scheduler_section(&text).to_string()
        }
        None if prefix_only => PREFIX_ONLY.to_string(),
        None => default_scheduler()?,
    })
}

/// What every setup shares.
struct Bench {
    name: &'static str,
    requests: Vec<BenchRequest>,
    arrival: Arrival,
    ceiling: f64,
    scheduler: String,
    /// The pickers' `--v`.
    verbosity: u8,
    envoy_yaml: String,
}

/// One replica: a picker and its Envoy.
struct Replica {
    _picker: Process,
    envoy: testkit::EnvoyProcess,
    admin: SocketAddr,
}

impl Bench {
    /// `n` replicas (with Redis sync when `sync`) over fresh sims, the workload sent to them
    /// round robin; the pickers' logs copied into `logs` when given.
    async fn run_setup(
        &self,
        label: &str,
        n: usize,
        sync: bool,
        logs: Option<&Path>,
    ) -> anyhow::Result<RunResult> {
        let dir = tempfile::tempdir()?;
        let sims = testkit::start_sims(&bin_dir().join("model-sim"), SIMS, &sim_args(4096, 64))?;
        let backends: Vec<_> = sims.iter().map(|s| s.addr).collect();
        let sim_urls: Vec<String> = backends.iter().map(|b| format!("http://{b}")).collect();
        let redis = if sync {
            Some(prefix_bench::sync_cost::start_redis(dir.path())?)
        } else {
            None
        };
        let redis_url = redis.as_ref().map(|(_, url)| url.as_str());
        let mut replicas = Vec::new();
        for i in 0..n {
            let rdir = dir.path().join(format!("replica-{i}"));
            replicas.push(self.start_replica(&rdir, &backends, redis_url).await?);
        }
        let urls: Vec<String> = replicas
            .iter()
            .map(|r| format!("http://127.0.0.1:{}", r.envoy.port))
            .collect();
        let r = driver::run(
            label,
            self.name,
            &urls.join(","),
            &sim_urls,
            &self.requests,
            self.arrival,
            self.ceiling,
        )
        .await;
        let admins: Vec<SocketAddr> = replicas.iter().map(|r| r.admin).collect();
        eprintln!(
            "  hit rate {:.1}% (ceiling {:.1}%), TTFT p50 {:.0} ms, errors {}, decisions {:?}",
            r.hit_rate * 100.0,
            self.ceiling * 100.0,
            r.ttft_ms.p50,
            r.errors,
            probe::decision_reasons(&admins).await,
        );
        if let Some(logs) = logs {
            copy_logs(dir.path(), logs, label, n)?;
        }
        Ok(r)
    }

    /// A picker over `backends` (syncing through `redis_url` when given) and its Envoy, both
    /// in `dir`.
    async fn start_replica(
        &self,
        dir: &Path,
        backends: &[SocketAddr],
        redis_url: Option<&str>,
    ) -> anyhow::Result<Replica> {
        std::fs::create_dir_all(dir)?;
        let mut config = self.scheduler.clone();
        let names: Vec<String> = (0..SIMS).map(|i| format!("sim-{i}")).collect();
        config.push_str(&testkit::endpoints_yaml(
            names
                .iter()
                .map(String::as_str)
                .zip(backends.iter().copied()),
        ));
        config.push_str("picker: {scrapeIntervalSeconds: 0.1}\n");
        if let Some(url) = redis_url {
            config.push_str(&format!("sync:\n  redis:\n    url: \"{url}\"\n"));
        }
        let (picker, admin) = testkit::start_picker(
            &bin_dir().join("prefix-picker"),
            dir,
            &config,
            self.verbosity,
        )?;
        let envoy = testkit::start_envoy(
            &envoy_bin()?,
            dir,
            &render_envoy(&self.envoy_yaml, picker.addr.port(), backends),
        )
        .await?;
        Ok(Replica {
            _picker: picker,
            envoy,
            admin,
        })
    }
}

/// Copies the `n` replicas' picker logs from `dir` into `logs`, named by the setup's `label`.
fn copy_logs(dir: &Path, logs: &Path, label: &str, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let to = logs.join(format!(
            "{}-replica-{i}.log",
            label.replace([' ', ','], "_")
        ));
        std::fs::create_dir_all(logs)?;
        std::fs::copy(dir.join(format!("replica-{i}/picker.log")), to)?;
    }
    Ok(())
}
