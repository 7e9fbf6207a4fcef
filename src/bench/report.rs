//! Benchmark reports: JSON (every field) and a markdown table per workload, with each router's
//! hit rate also shown as a share of the workload's ceiling.

use std::fmt::Write;

use super::driver::RunResult;

/// Markdown tables, one per workload, routers in run order.
pub fn markdown(results: &[RunResult]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in results {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        let rows: Vec<&RunResult> = results.iter().filter(|r| r.workload == w).collect();
        let ceiling = rows.first().map_or(0.0, |r| r.ceiling_hit_rate);
        let _ = writeln!(
            out,
            "\n**{w}** (ceiling hit rate {:.1}%)\n",
            ceiling * 100.0
        );
        let _ = writeln!(
            out,
            "| router | hit rate | % of ceiling | TTFT p50 / p90 / p99 (ms) | e2e p50 / p99 (ms) | req/s | out tok/s | max/mean pod share | errors |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            let of_ceiling = if r.ceiling_hit_rate > 0.0 {
                format!("{:.0}%", r.hit_rate / r.ceiling_hit_rate * 100.0)
            } else {
                "-".into()
            };
            let _ = writeln!(
                out,
                "| {} | {:.1}% | {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.0} | {:.2} | {} |",
                r.router,
                r.hit_rate * 100.0,
                of_ceiling,
                r.ttft_ms.p50,
                r.ttft_ms.p90,
                r.ttft_ms.p99,
                r.e2e_ms.p50,
                r.e2e_ms.p99,
                r.requests_per_s,
                r.output_tokens_per_s,
                r.max_over_mean,
                r.errors
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_per_workload() {
        let r = |router: &str, workload: &str| RunResult {
            router: router.into(),
            workload: workload.into(),
            hit_rate: 0.5,
            ceiling_hit_rate: 0.8,
            ..RunResult::default()
        };
        let md = markdown(&[r("a", "w1"), r("b", "w1"), r("a", "w2")]);
        assert_eq!(md.matches("| router |").count(), 2);
        assert!(md.contains("| a | 50.0% | 62% |"));
    }
}
