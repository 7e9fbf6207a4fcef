//! `prefix-bench misses`: prints where each row's uncached prompt tokens went, a table per
//! workload, from the samples `suite --samples` wrote.

use std::path::Path;

use prefix_bench::misses;

pub fn run(samples: &Path) -> anyhow::Result<()> {
    let lines = misses::read(samples)?;
    anyhow::ensure!(!lines.is_empty(), "{} holds no samples", samples.display());
    print!("{}", misses::markdown(&lines));
    Ok(())
}
