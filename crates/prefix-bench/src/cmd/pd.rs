//! `prefix-bench pd`: prefill/decode disaggregation, prefix-picker's `pdGroup` pairs against
//! round-robin pairs on model-sims in PD roles (`prefix_bench::pd`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use prefix_bench::engines::sim_args;
use prefix_bench::pd::{self, PdRow};
use prefix_bench::project::{default_scheduler, envoy_bin, root};
use prefix_bench::workload::{self, BenchRequest};
use testkit::{Process, bin_dir, render_envoy};

// Options of `prefix-bench pd` (help text: the `Cmd::Pd` doc comment).
#[derive(Debug, Args)]
pub struct PdOpts {
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

/// The routers compared (row name, whether prefix-picker chooses the pairs).
const ROUTERS: [(&str, bool); 2] = [
    ("round-robin pairs", false),
    ("prefix-picker pdGroup (Kthena default plugins)", true),
];

/// `prefix-bench pd` (see `prefix_bench::pd`): each router on fresh sims; writes `pd.json` and
/// `pd.md`.
pub async fn run(opts: PdOpts) -> anyhow::Result<()> {
    let name = title(&opts);
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
    let mut rows = Vec::new();
    for (router, picks) in ROUTERS {
        eprintln!("{name} | {router}");
        let picker = picks.then_some((scheduler.as_str(), envoy_yaml.as_str()));
        let row = run_router(&opts, router, &requests, picker).await?;
        eprintln!(
            "  prefill hit rate {:.1}%, {} errors",
            100.0 * row.prefill_hit_rate,
            row.errors
        );
        rows.push(row);
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

/// The table's title: the sims, the workload and the load.
fn title(opts: &PdOpts) -> String {
    format!(
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
    )
}

/// One router's row on fresh prefill and decode sims: round-robin pairs chosen by the driver
/// (`picker` none), or prefix-picker (`picker`: its `scheduler:` section and the Envoy
/// bootstrap) choosing the pairs behind Envoy.
async fn run_router(
    opts: &PdOpts,
    router: &str,
    requests: &[BenchRequest],
    picker: Option<(&str, &str)>,
) -> anyhow::Result<PdRow> {
    let dir = tempfile::tempdir()?;
    let prefill = start_sims("prefill", opts.prefill, opts.kv_blocks)?;
    let decode = start_sims("decode", opts.decode, opts.kv_blocks)?;
    let prefill_addrs: Vec<_> = prefill.iter().map(|s| s.addr).collect();
    let decode_addrs: Vec<_> = decode.iter().map(|s| s.addr).collect();
    let url = |a: &SocketAddr| format!("http://{a}");
    let prefill_urls: Vec<String> = prefill_addrs.iter().map(url).collect();
    let decode_urls: Vec<String> = decode_addrs.iter().map(url).collect();
    let mut processes = Vec::new();
    let (base, requests) = match picker {
        None => (
            decode_urls[0].clone(),
            pd::round_robin_pairs(requests, &prefill_addrs, decode_urls.len()),
        ),
        Some((scheduler, envoy_yaml)) => {
            let config = pd::picker_config(scheduler, &prefill_addrs, &decode_addrs);
            let (picker, _admin) =
                testkit::start_picker(&bin_dir().join("prefix-picker"), dir.path(), &config, 2)?;
            let mut all = prefill_addrs.clone();
            all.extend(&decode_addrs);
            let envoy = testkit::start_envoy(
                &envoy_bin()?,
                dir.path(),
                &render_envoy(envoy_yaml, picker.addr.port(), &all),
            )
            .await?;
            let base = format!("http://127.0.0.1:{}", envoy.port);
            processes.push((picker, envoy));
            (base, requests.to_vec())
        }
    };
    Ok(pd::run_row(
        router,
        &base,
        &prefill_urls,
        &decode_urls,
        &requests,
        opts.concurrency,
    )
    .await)
}

/// `n` model-sims in `role` (`prefill` or `decode`), `kv_blocks` each, named and seeded by
/// their number.
fn start_sims(role: &str, n: usize, kv_blocks: usize) -> anyhow::Result<Vec<Process>> {
    let mut args = sim_args(kv_blocks, 64);
    args.extend(["--role".to_string(), role.to_string()]);
    (0..n)
        .map(|i| {
            let mut args = args.clone();
            args.extend(["--seed".to_string(), i.to_string()]);
            testkit::start_sim(&bin_dir().join("model-sim"), &format!("{role}-{i}"), &args)
        })
        .collect()
}
