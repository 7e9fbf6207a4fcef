//! `prefix-bench report`: rewrites the markdown, the summary and the PNG beside a results file,
//! or with `--summary` prints the summary and writes nothing.

use std::path::Path;

use prefix_bench::suite_results::SuiteResults;
use prefix_bench::{report, summary};

/// Reads `results` and rewrites what is derived from it (`only_summary`: prints the summary).
pub fn run(results: &Path, only_summary: bool) -> anyhow::Result<()> {
    let suite = SuiteResults::read(results)?;
    if only_summary {
        print!("{}", summary::markdown(&suite));
        return Ok(());
    }
    std::fs::write(results.with_extension("md"), suite.markdown())?;
    std::fs::write(summary::path_beside(results), summary::markdown(&suite))?;
    report::plot(&suite.runs, &results.with_extension("png"))
}
