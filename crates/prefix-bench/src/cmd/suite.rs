//! `prefix-bench suite`: every selected workload on every selected row, `--repeat` times
//! interleaved, on fresh sims per run; writes `suite.json`, `suite.md`, `suite-summary.md` and
//! `suite.png` (`suite-quick*` with `--quick`), and with `--samples` every request's
//! measurements.

use std::path::PathBuf;

use clap::Args;
use prefix_bench::catalogue::{WorkloadSpec, default_trace, workloads};
use prefix_bench::cluster::{Setup, start_cluster_on};
use prefix_bench::driver::{self, RunResult};
use prefix_bench::engines::{EnginePlan, SIMS, restarts_mid_run, sim_args};
use prefix_bench::rows::{
    CAPPED_ORACLE_BUDGET, CAPPED_ORACLE_LOAD, EXT_PROC_FLOOR, routers, without_refused_rows,
};
use prefix_bench::suite_results::{Skipped, SuiteResults};
use prefix_bench::{oracle, placement_search, probe, report, summary, workload};

// Options of `prefix-bench suite` (help text: the `Cmd::Suite` doc comment).
#[derive(Debug, Args)]
pub struct SuiteOpts {
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

/// Runs the suite.
pub async fn run(opts: SuiteOpts) -> anyhow::Result<()> {
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
    report::write_results(&out, name, &suite, &md)?;
    let json = out.join(format!("{name}.json"));
    std::fs::write(summary::path_beside(&json), summary::markdown(&suite))?;
    if samples {
        write_samples(&out.join(format!("{name}-samples.jsonl")), &suite.runs)?;
    }
    report::plot(&suite.runs, &out.join(format!("{name}.png")))
}
