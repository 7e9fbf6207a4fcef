//! The engine profiles side by side (`suite-profiles.md`, written by `suite --engine-profile
//! default,kv-pressure`): per workload, a line per row with each profile's median hit rate (the
//! runs' range when there are several), TTFT p99, max/mean pod load and, on engines with vLLM
//! admission, the median run's preemptions and requests that waited for KV space. A row a
//! profile did not run shows `-`.

use std::fmt::Write;

use super::report::{self, Row};
use super::suite_results::SuiteResults;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One profile's cells of a row.
fn cells(suite: &SuiteResults, rows: &[Row], workload: &str, router: &str) -> String {
    let Some(row) = rows
        .iter()
        .find(|r| r.median.workload == workload && r.median.router == router)
    else {
        return "- | - | - | -".to_string();
    };
    let m = &row.median;
    let hit = if row.runs > 1 {
        format!(
            "{:.1}% ({:.1}-{:.1})",
            m.hit_rate * 100.0,
            row.hit_min * 100.0,
            row.hit_max * 100.0
        )
    } else {
        format!("{:.1}%", m.hit_rate * 100.0)
    };
    let engines: Vec<_> = suite
        .runs
        .iter()
        .filter(|r| r.workload == workload && r.router == router)
        .filter_map(|r| r.engines)
        .collect();
    let kv = if engines.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.0} / {:.0}",
            median(engines.iter().map(|e| e.preemptions).collect()),
            median(engines.iter().map(|e| e.kv_waits).collect())
        )
    };
    format!(
        "{hit} | {:.0} | {:.2} | {kv}",
        m.ttft_ms.p99, m.max_over_mean
    )
}

/// The side-by-side table of `suites` (one per profile, in the order run).
pub fn markdown(suites: &[SuiteResults]) -> String {
    let rows: Vec<Vec<Row>> = suites.iter().map(|s| report::rows(&s.runs)).collect();
    // Workloads and rows in first-run order over every profile.
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in suites.iter().flat_map(|s| &s.runs) {
        let k = (r.workload.as_str(), r.router.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out = String::new();
    let _ = write!(out, "| workload | row |");
    for s in suites {
        let p = s.engine_profile.as_str();
        let _ = write!(
            out,
            " {p}: hit rate | {p}: TTFT p99 (ms) | {p}: max/mean load | {p}: preemptions / KV waits |"
        );
    }
    let _ = writeln!(
        out,
        "\n|---|---|{}",
        "---|---|---|---|".repeat(suites.len())
    );
    for (w, router) in keys {
        let _ = write!(out, "| {} | {router} |", report::short(w));
        for (s, rows) in suites.iter().zip(&rows) {
            let _ = write!(out, " {} |", cells(s, rows, w, router));
        }
        out.push('\n');
    }
    let runs = rows.iter().flatten().map(|r| r.runs).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "\nMedians of {runs} run{} per row (hit rate: the engines'; preemptions and KV waits: summed \
         over the 4 engines, warm-up included, the runs' median).",
        if runs == 1 { "" } else { "s" }
    );
    for s in suites {
        let notes = s.notes();
        if !notes.is_empty() {
            let _ = write!(out, "\n{}:\n{notes}", s.engine_profile.as_str());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::RunResult;
    use crate::engines::EngineProfile;
    use crate::probe::KvAdmission;

    fn run(router: &str, rep: usize, hit: f64, engines: Option<f64>) -> RunResult {
        RunResult {
            router: router.into(),
            workload: "multi-tenant (16 tenants)".into(),
            rep,
            hit_rate: hit,
            engines: engines.map(|n| KvAdmission {
                preemptions: n,
                kv_waits: 2.0 * n,
                slot_waits: 0.0,
            }),
            ..RunResult::default()
        }
    }

    #[test]
    fn each_profile_has_its_columns_and_a_missing_row_shows_a_dash() {
        let default = SuiteResults {
            runs: vec![run("rr", 1, 0.4, None), run("oracle", 1, 0.8, None)],
            ..SuiteResults::default()
        };
        let pressure = SuiteResults {
            runs: vec![
                run("rr", 1, 0.3, Some(4.0)),
                run("rr", 2, 0.5, Some(6.0)),
                run("rr", 3, 0.35, Some(5.0)),
            ],
            engine_profile: EngineProfile::KvPressure,
            ..SuiteResults::default()
        };
        let md = markdown(&[default, pressure]);
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].starts_with(
            "| workload | row | default: hit rate | default: TTFT p99 (ms) | default: max/mean load | default: preemptions / KV waits | kv-pressure: hit rate |"
        ));
        assert_eq!(
            lines[2],
            "| multi-tenant | rr | 40.0% | 0 | 0.00 | - | 35.0% (30.0-50.0) | 0 | 0.00 | 5 / 10 |"
        );
        assert_eq!(
            lines[3],
            "| multi-tenant | oracle | 80.0% | 0 | 0.00 | - | - | - | - | - |"
        );
        assert!(md.contains("kv-pressure:\n- Engines: the `kv-pressure` profile"));
    }
}
