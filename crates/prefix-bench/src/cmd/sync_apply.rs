//! `prefix-bench sync-apply`: what applying another replica's records from Redis costs a
//! picker (`prefix_bench::sync_cost`), printed as JSON.

use testkit::bin_dir;

/// Publishes `rate` records/s of `blocks` hashes over `pods` pods for `seconds`.
pub async fn run(rate: u64, seconds: f64, blocks: usize, pods: usize) -> anyhow::Result<()> {
    let bin = bin_dir().join("prefix-picker");
    let cost = prefix_bench::sync_cost::run(&bin, rate, seconds, blocks, pods).await?;
    println!("{}", serde_json::to_string_pretty(&cost)?);
    Ok(())
}
