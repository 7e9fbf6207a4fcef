//! `prefix-bench pd`: prefill/decode disaggregation, prefix-picker's `pdGroup` pairs against
//! round-robin pairs on model-sims in PD roles (`prefix_bench::pd`).

use std::path::PathBuf;

use clap::Args;
use prefix_bench::engines::sim_args;
use prefix_bench::project::{default_scheduler, envoy_bin, root};
use prefix_bench::workload;
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

/// `prefix-bench pd` (see `prefix_bench::pd`).
pub async fn run(opts: PdOpts) -> anyhow::Result<()> {
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
