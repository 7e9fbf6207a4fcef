//! `prefix-bench replicas`: 1 replica vs 3 without sync vs 3 with Redis sync, each a
//! prefix-picker + Envoy over the same sims, requests round-robin over the replicas.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use prefix_bench::driver::{self, Arrival};
use prefix_bench::engines::{SIMS, sim_args};
use prefix_bench::project::{default_scheduler, envoy_bin, root};
use prefix_bench::report::{self, write_results};
use prefix_bench::rows::PREFIX_ONLY;
use prefix_bench::{probe, workload};
use testkit::{bin_dir, render_envoy};

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

/// Runs the three setups and writes `replicas.json` and `replicas.md`.
pub async fn run(opts: ReplicasOpts) -> anyhow::Result<()> {
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
