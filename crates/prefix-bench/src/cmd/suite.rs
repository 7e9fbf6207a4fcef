//! `prefix-bench suite`: every selected workload on every selected row, `--repeat` times
//! interleaved, on fresh sims per run; writes `suite.json`, `suite.md`, `suite-summary.md` and
//! `suite.png` (`suite-quick*` with `--quick`), and with `--samples` every request's
//! measurements.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use prefix_bench::catalogue::{WorkloadSpec, default_trace, select, workloads};
use prefix_bench::cluster::{Cluster, Setup, start_cluster_on};
use prefix_bench::driver::{self, RunResult};
use prefix_bench::engines::{
    EnginePlan, EngineProfile, KV_PRESSURE_PROMPTS, SIMS, restarts_mid_run, sim_args,
};
use prefix_bench::rows::{
    self, CAPPED_ORACLE_BUDGET, CAPPED_ORACLE_LOAD, EXT_PROC_FLOOR, capped_oracle_row, routers,
    without_refused_rows,
};
use prefix_bench::suite_results::{Skipped, SkippedRow, SuiteResults};
use prefix_bench::workload::BenchRequest;
use prefix_bench::{oracle, placement_search, probe, profiles, report, summary, workload};

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
    /// ablation rows run whenever `--ablation` is given. The engine-events fault rows (`...
    /// engine events (fault: topic mismatch)`, `(fault: silent publisher)`) run only when an
    /// entry names them: `fault`, `topic mismatch` or `silent publisher`. An entry that starts
    /// with `=` selects the row of exactly that name (e.g. `=prefix-picker: shipped config +
    /// engine events`, without its `file tokenizer` row).
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
    /// The capped oracle's load allowance: no pod above this many times the mean request count
    /// (the goal's load guard; default 1.3, issue 23's).
    #[arg(long, value_name = "X", default_value_t = CAPPED_ORACLE_LOAD, value_parser = oracle_load)]
    oracle_load: f64,
    /// The engines, one or more profiles (e.g. `default,kv-pressure`), each a whole suite in
    /// turn: `default` (model-sim's defaults, every published result) or `kv-pressure` (an
    /// engine the router was not tuned on: vLLM's KV-capacity admission and preemption, Llama
    /// 3's chat template, ~3.2 bytes per token, a cache that holds a few of the workload's
    /// longest requests, `--kv-pressure-prompts`). A `kv-pressure` suite writes
    /// `suite-kv-pressure*` (`suite-quick-kv-pressure*` with `--quick`), beside the default's
    /// files; with several profiles, `suite-profiles.md` sets them side by side.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [EngineProfile::Default])]
    engine_profile: Vec<EngineProfile>,
    /// Also run every selected shipped-config row (the shipped config and its engine-events
    /// rows) with this prefix-picker binary (e.g. the previous commit's build), each right
    /// after its row and named `baseline binary: <row>`: a change of the default against the
    /// previous default, both rows in one run, on the same sims and requests.
    #[arg(long, value_name = "FILE")]
    baseline_picker: Option<PathBuf>,
    /// A `kv-pressure` engine's cache holds this many of the workload's longest requests.
    #[arg(long, value_name = "N", default_value_t = KV_PRESSURE_PROMPTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    kv_pressure_prompts: usize,
    /// The Mooncake trace the `trace` workload replays. Default:
    /// `../shared/data/mooncake/synthetic_trace.jsonl` under `PREFIX_PICKER_ROOT`; when it is
    /// missing the workload is skipped, said on stderr and listed in the reports.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// `--oracle-load`: a finite number of at least 1 (a pod may always take the mean).
fn oracle_load(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 1.0 => Ok(x),
        _ => Err(format!("expected a number >= 1, got {s:?}")),
    }
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

/// Runs the suite: the selected workloads and rows, every row of a workload `--repeat` times
/// (interleaved), then the reports.
pub async fn run(opts: SuiteOpts) -> anyhow::Result<()> {
    let trace = opts.trace.clone().unwrap_or_else(default_trace);
    let (selected, skipped) = selected_workloads(opts.quick, opts.seed, &trace, &opts.workloads)?;
    let routers = selected_rows(opts.ablation, opts.config.as_deref(), &opts.routers)?;
    let routers = with_oracle_load(routers, opts.oracle_load);
    let routers = match &opts.baseline_picker {
        Some(bin) => {
            anyhow::ensure!(
                bin.is_file(),
                "--baseline-picker {}: no such file",
                bin.display()
            );
            prefix_bench::rows::with_baseline(routers, bin)
        }
        None => routers,
    };
    let mut profiles: Vec<EngineProfile> = Vec::new();
    for p in &opts.engine_profile {
        if !profiles.contains(p) {
            profiles.push(*p);
        }
    }
    let mut suites = Vec::new();
    for &profile in &profiles {
        let routers = rows_for(profile, &routers);
        let (runs, skipped_rows) = run_profile(&opts, &selected, &routers, profile).await?;
        let suite = SuiteResults {
            runs,
            skipped: skipped.clone(),
            skipped_rows,
            config: opts.config.clone(),
            engine_profile: profile,
            kv_pressure_prompts: (profile == EngineProfile::KvPressure)
                .then_some(opts.kv_pressure_prompts),
        };
        write_reports(&suite, &opts.out, opts.quick, opts.samples)?;
        suites.push(suite);
    }
    if suites.len() > 1 {
        let name = if opts.quick {
            "suite-quick-profiles.md"
        } else {
            "suite-profiles.md"
        };
        let md = profiles::markdown(&suites);
        println!("{md}");
        std::fs::create_dir_all(&opts.out)?;
        std::fs::write(opts.out.join(name), md)?;
    }
    Ok(())
}

/// The rows that run on `profile`'s engines: on engines other than the default, not the
/// file-tokenizer row (its `tokenizer.json` and template are the default engine's), said on
/// stderr.
fn rows_for(profile: EngineProfile, rows: &[(String, Setup)]) -> Vec<(String, Setup)> {
    rows.iter()
        .filter(|(name, setup)| {
            let file = matches!(setup, Setup::Envoy { events: Some(e), .. } if e.uses_tokenizer_json());
            if file && !profile.is_default() {
                eprintln!(
                    "skipping row {name} on the {} engines: model-sim's tokenizer.json describes the default engine",
                    profile.as_str()
                );
            }
            !file || profile.is_default()
        })
        .cloned()
        .collect()
}

/// The rows that can run workload `w` (a peer without a `/v1/messages` route cannot run a
/// Messages workload), and the others, each said on stderr.
fn rows_able(
    w: &WorkloadSpec,
    rows: &[(String, Setup)],
) -> (Vec<(String, Setup)>, Vec<SkippedRow>) {
    let mut skipped = Vec::new();
    let able = rows
        .iter()
        .filter(|(name, setup)| {
            let able = !w.speaks_messages() || setup.routes_messages();
            if !able {
                let reason = "this router has no `/v1/messages` route (Anthropic's Messages API)";
                eprintln!("no row {name} on {}: {reason}", w.key);
                skipped.push(SkippedRow {
                    workload: w.key.to_string(),
                    row: name.clone(),
                    reason: reason.to_string(),
                });
            }
            able
        })
        .cloned()
        .collect();
    (able, skipped)
}

/// Every selected workload on every row that can run it, `--repeat` times interleaved, on
/// `profile`'s engines; and the rows left out of a workload.
async fn run_profile(
    opts: &SuiteOpts,
    selected: &[WorkloadSpec],
    all_routers: &[(String, Setup)],
    profile: EngineProfile,
) -> anyhow::Result<(Vec<RunResult>, Vec<SkippedRow>)> {
    let repeat = opts.repeat.unwrap_or(if opts.quick { 1 } else { 3 }) as usize;
    let reads_events = all_routers.iter().any(|(_, s)| s.reads_engine_events());
    let mut results = Vec::new();
    let mut skipped_rows = Vec::new();
    let started = std::time::Instant::now();
    for w in selected {
        let (routers, skipped) = rows_able(w, all_routers);
        skipped_rows.extend(skipped);
        let routers = &routers[..];
        let plan = WorkloadPlan::new(w, routers, opts, profile);
        if !profile.is_default() {
            eprintln!(
                "{}: {} engines, {} KV blocks each",
                w.name,
                profile.as_str(),
                plan.kv_blocks
            );
        }
        for rep in 1..=repeat {
            // Round robin first, then the ext_proc floor (when asked for), then the others.
            for (router, setup) in routers
                .iter()
                .take(1)
                .chain(&plan.floor)
                .chain(routers.iter().skip(1))
            {
                eprintln!(
                    "[{:.0} s] {}{} | {router} | run {rep}/{repeat}",
                    started.elapsed().as_secs_f64(),
                    if profile.is_default() {
                        String::new()
                    } else {
                        format!("[{}] ", profile.as_str())
                    },
                    w.name
                );
                let mut r = run_row(&plan, router, setup, reads_events, profile).await?;
                r.rep = rep;
                results.push(r);
            }
        }
    }
    Ok((results, skipped_rows))
}

/// The workloads `only` selects (all when empty), and the skipped ones among them, each said
/// on stderr. Fails when nothing is left to run.
fn selected_workloads(
    quick: bool,
    seed: u64,
    trace: &std::path::Path,
    only: &[String],
) -> anyhow::Result<(Vec<WorkloadSpec>, Vec<Skipped>)> {
    let (all, skipped) = workloads(quick, seed, trace)?;
    let skipped: Vec<Skipped> = skipped
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|f| s.workload.starts_with(f.as_str())))
        .collect();
    for s in &skipped {
        eprintln!("skipping workload {}: {}", s.workload, s.reason);
    }
    let keys: Vec<&str> = all.iter().map(|w| w.key).collect();
    let selected = select(all, only);
    anyhow::ensure!(
        !selected.is_empty(),
        "{}",
        if skipped.is_empty() {
            format!("no workload matches {only:?} (keys: {})", keys.join(", "))
        } else {
            "every selected workload was skipped (see above)".to_string()
        }
    );
    Ok((selected, skipped))
}

/// The rows `only` selects (all when empty; the ablation rows whenever `ablation`), without
/// those this prefix-picker refuses. Fails when none is left.
fn selected_rows(
    ablation: bool,
    config: Option<&std::path::Path>,
    only: &[String],
) -> anyhow::Result<Vec<(String, Setup)>> {
    let rows: Vec<(String, Setup)> = routers(ablation, config)?
        .into_iter()
        .filter(|(name, _)| rows::selected(name, only))
        .collect();
    anyhow::ensure!(!rows.is_empty(), "no router matches {only:?}");
    let rows = without_refused_rows(rows)?;
    anyhow::ensure!(!rows.is_empty(), "every selected row was skipped");
    Ok(rows)
}

/// `rows` with the capped oracle's row (when selected) searched under `load`.
fn with_oracle_load(rows: Vec<(String, Setup)>, load: f64) -> Vec<(String, Setup)> {
    rows.into_iter()
        .map(|row| match row.1 {
            Setup::OracleCapped { .. } => capped_oracle_row(load),
            _ => row,
        })
        .collect()
}

/// What every row of a workload shares: its hit-rate ceiling, the oracles' pinned requests,
/// and its ext_proc floor row (`--ext-proc-floor`).
struct WorkloadPlan<'a> {
    w: &'a WorkloadSpec,
    ceiling: f64,
    /// The requests pinned by [`oracle::pin`].
    pinned: Vec<BenchRequest>,
    /// The requests pinned by the capped oracle's searched placement (empty without its row).
    capped: Vec<BenchRequest>,
    floor: Option<(String, Setup)>,
    /// The sims' cache size under the profile.
    kv_blocks: usize,
}

impl WorkloadPlan<'_> {
    fn new<'a>(
        w: &'a WorkloadSpec,
        routers: &[(String, Setup)],
        opts: &SuiteOpts,
        profile: EngineProfile,
    ) -> WorkloadPlan<'a> {
        let ext_proc_floor = &opts.ext_proc_floor;
        let capped = routers
            .iter()
            .find_map(|(_, s)| match s {
                Setup::OracleCapped { load } => Some(capped_placement(w, *load)),
                _ => None,
            })
            .unwrap_or_default();
        let floor = ext_proc_floor.iter().any(|k| k == w.key).then(|| {
            (
                EXT_PROC_FLOOR.to_string(),
                Setup::NoopExtProc {
                    file: "envoy.yaml".into(),
                },
            )
        });
        WorkloadPlan {
            w,
            ceiling: workload::ceiling_hit_rate(&w.requests, 16),
            pinned: oracle::pin(&w.requests, SIMS),
            capped,
            floor,
            kv_blocks: profile.kv_blocks(w.kv_blocks, &w.requests, 16, opts.kv_pressure_prompts),
        }
    }

    /// The requests a row sends: pinned for the oracles, else the workload's.
    fn requests(&self, setup: &Setup) -> &[BenchRequest] {
        match setup {
            Setup::Oracle => &self.pinned,
            Setup::OracleCapped { .. } => &self.capped,
            _ => &self.w.requests,
        }
    }
}

/// The capped oracle's requests: pinned to the placement [`placement_search::search`] finds
/// offline with no pod above `load` x the mean, knowing which sims run with caching off; the
/// search and which groups each pod serves are said on stderr.
fn capped_placement(w: &WorkloadSpec, load: f64) -> Vec<BenchRequest> {
    let t = std::time::Instant::now();
    let s = placement_search::search(
        &w.requests,
        placement_search::Pods {
            count: SIMS,
            kv_blocks: w.kv_blocks,
            block_tokens: 16,
            caching_off: &w.caching_off,
        },
        load,
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
    let mut per_pod: Vec<std::collections::BTreeMap<u32, usize>> = vec![Default::default(); SIMS];
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
}

/// One run of a row on a workload: fresh sims and the row's router, the warm-up, the run (with
/// the workload's engine restarts), and its headline numbers on stderr.
async fn run_row(
    plan: &WorkloadPlan<'_>,
    router: &str,
    setup: &Setup,
    reads_events: bool,
    profile: EngineProfile,
) -> anyhow::Result<RunResult> {
    let w = plan.w;
    let mut args = sim_args(plan.kv_blocks, w.max_num_seqs);
    args.extend(profile.sim_args());
    let engines = EnginePlan {
        args,
        caching_off: w.caching_off.clone(),
        kv_events: reads_events || w.restarts,
        topic: String::new(),
        model: workload::model(&w.requests).to_string(),
        flow_control: w.flow_control.map(str::to_string),
    };
    let mut c = start_cluster_on(setup, engines).await?;
    driver::warm_up(
        &c.url,
        &c.sim_urls,
        matches!(setup, Setup::Oracle | Setup::OracleCapped { .. }),
        workload::model(&w.requests),
    )
    .await;
    let warm_up = match c.picker_admin {
        Some(admin) => picker_counts(admin).await,
        None => Default::default(),
    };
    let (url, sim_urls) = (c.url.clone(), c.sim_urls.clone());
    let tokenized_before = probe::TokenizeWork::read(&sim_urls).await;
    let picker_tokenized_before = match c.picker_admin {
        Some(admin) => probe::TokenizeWork::read_picker(admin).await,
        None => Default::default(),
    };
    let mid_run = match w.picker_restart_after() {
        Some(after) => Some(picker_restart_mid_run(&mut c, after)),
        None => restarts_mid_run(&mut c.sims, w.restart_schedule()),
    };
    let r = driver::run_with(
        router,
        w.name,
        &url,
        &sim_urls,
        plan.requests(setup),
        w.arrival,
        plan.ceiling,
        mid_run,
    )
    .await;
    if let Some(admin) = c.picker_admin {
        log_picker(admin, &warm_up).await;
    }
    let mut r = r;
    let mut tokenized = probe::TokenizeWork::read(&sim_urls)
        .await
        .since(tokenized_before);
    let mut by = "the engines' /tokenize";
    if let (0.0, Some(admin)) = (tokenized.calls, c.picker_admin) {
        // No engine was asked: the `file` source tokenized in the picker's process.
        tokenized = probe::TokenizeWork::read_picker(admin)
            .await
            .since(picker_tokenized_before);
        by = "the picker's file source";
    }
    if tokenized.calls > 0.0 {
        // The text no earlier request shared: what the ceiling leaves uncached.
        let new_tokens = (1.0 - plan.ceiling) * r.prompt_tokens as f64;
        eprintln!(
            "  tokenizer ({by}): {:.2} calls per request, {:.2} tokens per prompt token, {:.2} per token of new text",
            tokenized.calls / r.requests.max(1) as f64,
            tokenized.tokens / r.prompt_tokens.max(1) as f64,
            tokenized.tokens / new_tokens.max(1.0),
        );
        r.tokenize = Some(tokenized);
    }
    if !profile.is_default() {
        let kv = probe::KvAdmission::read(&sim_urls).await;
        eprintln!("  engines (warm-up included): {kv}");
        r.engines = Some(kv);
    }
    eprintln!(
        "  hit rate {:.1}% (ceiling {:.1}%), TTFT p50 {:.0} ms, max/mean pod share {:.2}, pods per group {:.2}, errors {}",
        r.hit_rate * 100.0,
        plan.ceiling * 100.0,
        r.ttft_ms.p50,
        r.max_over_mean,
        r.pods_per_group,
        r.errors
    );
    Ok(r)
}

/// The driver's mid-run action for the `picker-restart` workload: after `after` requests, the
/// picker behind Envoy is stopped and started again on its address (rows without one: nothing).
fn picker_restart_mid_run(c: &mut Cluster, after: usize) -> driver::MidRun<'_> {
    driver::MidRun {
        after: vec![after],
        act: Box::new(move |_| {
            let t = std::time::Instant::now();
            if c.restart_picker()? {
                eprint!(" [picker restarted in {} ms] ", t.elapsed().as_millis());
            }
            Ok(())
        }),
    }
}

/// The counters [`log_picker`] shows: decisions by reason, match sources, engine-token
/// outcomes.
const LOGGED_COUNTERS: [(&str, probe::Counter); 3] = [
    ("decisions", probe::DECISIONS),
    ("match source", probe::MATCH_SOURCES),
    ("engine tokens", probe::ENGINE_TOKENS),
];

async fn picker_counts(admin: std::net::SocketAddr) -> Vec<BTreeMap<String, f64>> {
    let mut counts = Vec::with_capacity(LOGGED_COUNTERS.len());
    for (_, counter) in LOGGED_COUNTERS {
        counts.push(probe::labelled_counts(&[admin], counter).await);
    }
    counts
}

/// Says on stderr what the picker at `admin` decided during the run (its decisions by reason,
/// where the picked pods' matches came from and how engine tokens were found, less those of
/// the warm-up `before`) and what its latency model learned.
async fn log_picker(admin: std::net::SocketAddr, before: &[BTreeMap<String, f64>]) {
    let after = picker_counts(admin).await;
    for (i, (what, _)) in LOGGED_COUNTERS.iter().enumerate() {
        let shown: Vec<String> = after[i]
            .iter()
            .map(|(value, n)| {
                let earlier = before.get(i).and_then(|b| b.get(value)).unwrap_or(&0.0);
                (value, n - earlier)
            })
            .filter(|(_, n)| *n > 0.0)
            .map(|(value, n)| format!("{value} {n}"))
            .collect();
        if !shown.is_empty() {
            eprintln!("  {what}: {}", shown.join(", "));
        }
    }
    let learned = probe::latency_model(admin).await;
    if !learned.is_empty() {
        eprintln!("  latency model: {learned}");
    }
}

/// Prints the tables and writes `<name>.json`, `.md`, `-summary.md`, `.png` and, with
/// `samples`, `-samples.jsonl` (`name`: `suite`, or `suite-quick` with `quick`; then
/// `-kv-pressure` under that engine profile).
fn write_reports(
    suite: &SuiteResults,
    out: &std::path::Path,
    quick: bool,
    samples: bool,
) -> anyhow::Result<()> {
    let md = suite.markdown();
    println!("{md}");
    let name = match (quick, suite.engine_profile) {
        (false, EngineProfile::Default) => "suite".to_string(),
        (true, EngineProfile::Default) => "suite-quick".to_string(),
        (false, p) => format!("suite-{}", p.as_str()),
        (true, p) => format!("suite-quick-{}", p.as_str()),
    };
    report::write_results(out, &name, suite, &md)?;
    let json = out.join(format!("{name}.json"));
    std::fs::write(summary::path_beside(&json), summary::markdown(suite))?;
    if samples {
        write_samples(&out.join(format!("{name}-samples.jsonl")), &suite.runs)?;
    }
    report::plot(&suite.runs, &out.join(format!("{name}.png")))
}
