//! The suite's compact summary (`suite-summary.md`, `prefix-bench report FILE --summary`): one
//! line per workload, the medians of [`report::rows`] read as a user compares routers.
//!
//! Per workload: the shipped config's hit rate, TTFT p50 / p99 and max/mean pod load; the best
//! peer's hit rate (each peer within the shown precision of it, with its load); the lowest peer
//! TTFT p99 (which peer); round robin's hit rate; the capped oracle's hit rate. A peer is a row
//! that is none of ours: not prefix-picker, not Envoy alone or with the no-op processor, not an
//! oracle, not an ablation row. A row missing from the file shows as `-`.

use std::fmt::Write;

use super::report::{self, ABLATION, CAPPED_ORACLE, ROUND_ROBIN, Row, SHIPPED};
use super::rows::CAPPED_ORACLE_LOAD;
use super::suite_results::SuiteResults;

/// Whether a row is another router (sglang-router, vllm-router, smg, ...), not one of ours.
fn is_peer(router: &str) -> bool {
    !["prefix-picker", "envoy", "oracle", ABLATION]
        .iter()
        .any(|ours| router.starts_with(ours))
}

/// A peer's short name: the first word of its row (`smg 1.13.0 cache_aware` -> `smg`).
fn peer_name(router: &str) -> &str {
    router.split_whitespace().next().unwrap_or(router)
}

/// The rows whose `key`, rounded as shown (`key x scale` to an integer), is the highest (the
/// lowest with `lowest`), in row order.
fn best<'a>(rows: &[&'a Row], key: impl Fn(&Row) -> f64, scale: f64, lowest: bool) -> Vec<&'a Row> {
    let shown = |r: &Row| (key(r) * scale).round() as i64;
    let values = rows.iter().map(|r| shown(r));
    let pick = if lowest { values.min() } else { values.max() };
    let Some(target) = pick else {
        return Vec::new();
    };
    rows.iter()
        .copied()
        .filter(|r| shown(r) == target)
        .collect()
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// The summary table of a suite's results, with its notes ([`SuiteResults::notes`]).
pub fn markdown(results: &SuiteResults) -> String {
    let rows = report::rows(&results.runs);
    let mut workloads: Vec<&str> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.median.workload.as_str()) {
            workloads.push(&r.median.workload);
        }
    }
    let runs = rows.iter().map(|r| r.runs).max().unwrap_or(0);
    let mut out = String::new();
    // The capped oracle's allowance, as its row names it (`suite --oracle-load`).
    let cap = rows
        .iter()
        .find_map(|r| r.median.router.strip_prefix(CAPPED_ORACLE))
        .and_then(|rest| rest.split_whitespace().next())
        .map_or_else(|| CAPPED_ORACLE_LOAD.to_string(), str::to_string);
    let _ = writeln!(
        out,
        "| workload | shipped config: hit rate, TTFT p50 / p99 (ms) | its max/mean load | best peer: hit rate (load) | lowest peer TTFT p99 (ms) | round robin: hit rate | oracle, load <= {cap}: hit rate |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for w in &workloads {
        let of: Vec<&Row> = rows.iter().filter(|r| r.median.workload == *w).collect();
        let _ = writeln!(out, "{}", line(w, &of));
    }
    let _ = writeln!(
        out,
        "\nMedians of {runs} run{} per row.",
        if runs == 1 { "" } else { "s" }
    );
    let notes = results.notes();
    if !notes.is_empty() {
        let _ = write!(out, "\n{notes}");
    }
    out
}

/// The table line of workload `w`, whose rows are `of`.
fn line(w: &str, of: &[&Row]) -> String {
    let find = |pred: &dyn Fn(&str) -> bool| of.iter().find(|r| pred(&r.median.router));
    let hit = |r: Option<&&Row>| r.map_or("-".into(), |r| pct(r.median.hit_rate));
    let shipped = find(&|n| n == SHIPPED);
    let peers: Vec<&Row> = of
        .iter()
        .copied()
        .filter(|r| is_peer(&r.median.router))
        .collect();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} |",
        report::short(w),
        shipped.map_or("-".into(), |r| format!(
            "{}, {:.0} / {:.0}",
            pct(r.median.hit_rate),
            r.median.ttft_ms.p50,
            r.median.ttft_ms.p99
        )),
        shipped.map_or("-".into(), |r| format!("{:.2}", r.median.max_over_mean)),
        best_peer_hit(&peers),
        lowest_peer_p99(&peers),
        hit(find(&|n| n == ROUND_ROBIN)),
        hit(find(&|n| n.starts_with(CAPPED_ORACLE))),
    )
}

/// The best peer hit rate, and each peer that reaches it as shown, with its load.
fn best_peer_hit(peers: &[&Row]) -> String {
    let best_hit = best(peers, |r| r.median.hit_rate, 1000.0, false);
    match best_hit.first() {
        None => "-".to_string(),
        Some(top) => format!(
            "{} {}",
            pct(top.median.hit_rate),
            best_hit
                .iter()
                .map(|r| format!(
                    "{} ({:.2})",
                    peer_name(&r.median.router),
                    r.median.max_over_mean
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The lowest peer TTFT p99, and each peer that reaches it as shown.
fn lowest_peer_p99(peers: &[&Row]) -> String {
    let low_p99 = best(peers, |r| r.median.ttft_ms.p99, 1.0, true);
    match low_p99.first() {
        None => "-".to_string(),
        Some(top) => format!(
            "{:.0} {}",
            top.median.ttft_ms.p99,
            low_p99
                .iter()
                .map(|r| peer_name(&r.median.router))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The summary beside a results file: `suite.json` -> `suite-summary.md`.
pub fn path_beside(results: &std::path::Path) -> std::path::PathBuf {
    let stem = results
        .file_stem()
        .map_or_else(|| "suite".into(), |s| s.to_string_lossy());
    results.with_file_name(format!("{stem}-summary.md"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Percentiles, RunResult};
    use crate::suite_results::Skipped;

    fn run(router: &str, workload: &str, rep: usize, hit: f64, p99: f64, load: f64) -> RunResult {
        RunResult {
            router: router.into(),
            workload: workload.into(),
            rep,
            hit_rate: hit,
            ceiling_hit_rate: 0.9,
            ttft_ms: Percentiles {
                p50: p99 / 4.0,
                p90: p99 / 2.0,
                p99,
            },
            max_over_mean: load,
            ..RunResult::default()
        }
    }

    const SGLANG: &str = "sglang-router 0.3.2 cache_aware";
    const VLLM: &str = "vllm-router 0.1.17 cache_aware";
    const SMG: &str = "smg 1.13.0 cache_aware";
    const ORACLE: &str = "oracle (groups pinned to pods, balanced, no router)";
    const CAPPED: &str = "oracle, max/mean load <= 1.3 (placement searched offline, no router)";

    /// A suite of two workloads, three interleaved runs: `busy (x)` has every row; `lean (y)`
    /// has no peer, no capped oracle and no round robin.
    fn suite() -> SuiteResults {
        let mut runs = Vec::new();
        for rep in 1..=3 {
            let d = rep as f64 * 0.001; // the runs differ; the middle one is the median
            let w = "busy (x)";
            runs.push(run(ROUND_ROBIN, w, rep, 0.70 + d, 300.0, 1.0));
            runs.push(run(SHIPPED, w, rep, 0.85 + d, 300.0 + rep as f64, 1.1));
            runs.push(run(
                &format!("{ABLATION}tentative: false"),
                w,
                rep,
                0.99,
                1.0,
                1.0,
            ));
            runs.push(run(
                "prefix-picker: Kthena default plugins",
                w,
                rep,
                0.95,
                2.0,
                1.0,
            ));
            // sglang and vllm tie on hit rate as shown (87.7%), vllm and smg on p99.
            runs.push(run(SGLANG, w, rep, 0.8771 + d / 10.0, 900.0, 1.43));
            runs.push(run(VLLM, w, rep, 0.8768, 460.2, 1.5));
            runs.push(run(SMG, w, rep, 0.86, 459.9, 1.08));
            runs.push(run(ORACLE, w, rep, 0.97, 700.0, 1.0));
            runs.push(run(CAPPED, w, rep, 0.875, 680.0, 1.0));
            runs.push(run(SHIPPED, "lean (y)", rep, 0.5, 40.0, 1.2));
        }
        SuiteResults {
            runs,
            ..SuiteResults::default()
        }
    }

    #[test]
    fn one_line_per_workload_with_medians_and_the_best_peers() {
        let md = markdown(&suite());
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 3, "{md}");
        assert_eq!(
            lines[1],
            "| busy | 85.2%, 76 / 302 | 1.10 | 87.7% sglang-router (1.43), vllm-router (1.50) | 460 vllm-router, smg | 70.2% | 87.5% |",
            "{md}"
        );
        assert!(md.contains("\nMedians of 3 runs per row.\n"), "{md}");
    }

    #[test]
    fn the_capped_oracle_column_names_its_allowance() {
        let header = |s: &SuiteResults| markdown(s).lines().next().unwrap().to_string();
        let mut s = suite();
        assert!(header(&s).ends_with("| oracle, load <= 1.3: hit rate |"));
        let looser = CAPPED.replace("1.3", "1.5");
        for r in &mut s.runs {
            if r.router == CAPPED {
                r.router = looser.clone();
            }
        }
        assert!(header(&s).ends_with("| oracle, load <= 1.5: hit rate |"));
        assert!(
            markdown(&s).contains("| 70.2% | 87.5% |"),
            "the row is still found"
        );
    }

    #[test]
    fn missing_rows_show_as_a_dash() {
        let md = markdown(&suite());
        let lean = md.lines().find(|l| l.starts_with("| lean |")).unwrap();
        assert_eq!(lean, "| lean | 50.0%, 10 / 40 | 1.20 | - | - | - | - |");
        let mut no_shipped = suite();
        no_shipped.runs.retain(|r| r.router != SHIPPED);
        let md = markdown(&no_shipped);
        assert!(md.contains("| busy | - | - | 87.7% "), "{md}");
        assert!(!md.contains("| lean |"), "{md}");
    }

    #[test]
    fn the_notes_follow_the_table() {
        let mut s = suite();
        s.skipped.push(Skipped {
            workload: "trace".into(),
            reason: "missing".into(),
        });
        let md = markdown(&s);
        assert!(md.ends_with("\n\n- Skipped `trace`: missing\n"), "{md}");
        let empty = markdown(&SuiteResults::default());
        assert_eq!(empty.lines().filter(|l| l.starts_with("| ")).count(), 1);
    }

    #[test]
    fn peers_are_the_rows_that_are_not_ours() {
        for ours in [
            ROUND_ROBIN,
            SHIPPED,
            ORACLE,
            CAPPED,
            "envoy + no-op ext_proc (round robin; the ext_proc floor)",
            report::SHIPPED_ENGINE_EVENTS,
            "ablation: loadGate: false",
        ] {
            assert!(!is_peer(ours), "{ours}");
        }
        for peer in [SGLANG, VLLM, SMG] {
            assert!(is_peer(peer), "{peer}");
        }
        assert_eq!(peer_name(SMG), "smg");
    }
}
