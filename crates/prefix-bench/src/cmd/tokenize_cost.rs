//! `prefix-bench tokenize-cost`: what engine tokens cost per request
//! (`prefix_bench::tokenize_cost`), printed as a table.

use std::path::Path;

use prefix_bench::tokenize_cost;
use testkit::bin_dir;

/// Measures `calls` calls per line (`tokenizer_json`: the `file` source's tokenizer).
pub async fn run(calls: usize, tokenizer_json: Option<&Path>) -> anyhow::Result<()> {
    let sim = bin_dir().join("model-sim");
    let lines = tokenize_cost::run(&sim, calls, tokenizer_json).await?;
    print!("{}", tokenize_cost::table(&lines));
    Ok(())
}
