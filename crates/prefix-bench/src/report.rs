//! Benchmark reports: JSON (every run) and a markdown table per workload, with each router's
//! hit rate also shown as a share of the workload's ceiling. When a row ran several times
//! (`--repeat`), the tables show the median of each column over its runs (and the hit rate's
//! range); rows named `ablation: ...` go to their own tables, beside the shipped config's row.

use std::fmt::Write;

use super::driver::{Percentiles, RunResult};

/// The prefix of ablation rows' router names.
pub const ABLATION: &str = "ablation: ";
/// The row ablation rows are compared with.
pub const SHIPPED: &str = "prefix-picker: shipped config";
/// The shipped config reading every engine's KV events (the engine-events rows' name prefix).
pub const SHIPPED_ENGINE_EVENTS: &str = "prefix-picker: shipped config + engine events";

/// Kthena's kvcache-aware row (the engines' KV events through `kv-relay` and Redis).
pub const KVCACHE_AWARE: &str = "prefix-picker: Kthena kvcache-aware (kv-relay + Redis)";

/// One table row: the medians of a router's runs on a workload.
#[derive(Debug, Clone)]
pub struct Row {
    pub median: RunResult,
    pub runs: usize,
    pub hit_min: f64,
    pub hit_max: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Rows in first-run order, each the column-wise median of its runs.
pub fn rows(results: &[RunResult]) -> Vec<Row> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in results {
        let k = (r.workload.as_str(), r.router.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(w, router)| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.workload == w && r.router == router)
                .collect();
            let m = |f: fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
            let hits: Vec<f64> = runs.iter().map(|r| r.hit_rate).collect();
            let first = runs[0];
            Row {
                median: RunResult {
                    router: router.to_string(),
                    workload: w.to_string(),
                    rep: 0,
                    requests: first.requests,
                    errors: m(|r| r.errors as f64).round() as usize,
                    duration_s: m(|r| r.duration_s),
                    requests_per_s: m(|r| r.requests_per_s),
                    output_tokens_per_s: m(|r| r.output_tokens_per_s),
                    ttft_ms: Percentiles {
                        p50: m(|r| r.ttft_ms.p50),
                        p90: m(|r| r.ttft_ms.p90),
                        p99: m(|r| r.ttft_ms.p99),
                    },
                    e2e_ms: Percentiles {
                        p50: m(|r| r.e2e_ms.p50),
                        p90: m(|r| r.e2e_ms.p90),
                        p99: m(|r| r.e2e_ms.p99),
                    },
                    hit_rate: m(|r| r.hit_rate),
                    ceiling_hit_rate: first.ceiling_hit_rate,
                    pod_share: first.pod_share.clone(),
                    max_over_mean: m(|r| r.max_over_mean),
                    pods_per_group: m(|r| r.pods_per_group),
                    samples: Vec::new(),
                },
                runs: runs.len(),
                hit_min: hits.iter().copied().fold(f64::INFINITY, f64::min),
                hit_max: hits.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect()
}

fn table(out: &mut String, title: &str, rows: &[&Row]) {
    let ceiling = rows.first().map_or(0.0, |r| r.median.ceiling_hit_rate);
    let runs = rows.iter().map(|r| r.runs).max().unwrap_or(1);
    let _ = writeln!(
        out,
        "\n**{title}** (ceiling hit rate {:.1}%{})\n",
        ceiling * 100.0,
        if runs > 1 {
            format!("; medians of {runs} runs, hit-rate range in brackets")
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "| router | hit rate | % of ceiling | TTFT p50 / p90 / p99 (ms) | e2e p50 / p99 (ms) | req/s | out tok/s | max/mean pod share | pods per group | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let r = &row.median;
        let of_ceiling = if r.ceiling_hit_rate > 0.0 {
            format!("{:.0}%", r.hit_rate / r.ceiling_hit_rate * 100.0)
        } else {
            "-".into()
        };
        let range = if row.runs > 1 {
            format!(" ({:.1}-{:.1})", row.hit_min * 100.0, row.hit_max * 100.0)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {} | {:.1}%{range} | {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.0} | {:.2} | {:.2} | {} |",
            r.router.strip_prefix(ABLATION).unwrap_or(&r.router),
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
            r.pods_per_group,
            r.errors
        );
    }
}

/// Markdown tables, one per workload, routers in run order; then the ablation tables.
pub fn markdown(results: &[RunResult]) -> String {
    let mut out = String::new();
    let rows = rows(results);
    let mut workloads: Vec<&str> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.median.workload.as_str()) {
            workloads.push(&r.median.workload);
        }
    }
    for w in &workloads {
        let main: Vec<&Row> = rows
            .iter()
            .filter(|r| r.median.workload == *w && !r.median.router.starts_with(ABLATION))
            .collect();
        table(&mut out, w, &main);
    }
    let mut header = false;
    for w in &workloads {
        let ablation: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                r.median.workload == *w
                    && (r.median.router == SHIPPED || r.median.router.starts_with(ABLATION))
            })
            .collect();
        if !ablation
            .iter()
            .any(|r| r.median.router.starts_with(ABLATION))
        {
            continue;
        }
        if !header {
            out.push_str(
                "\n### Ablation: the shipped config with one `picker.affinity` switch off\n",
            );
            header = true;
        }
        table(&mut out, &format!("ablation, {w}"), &ablation);
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
        assert!(!md.contains("Ablation"));
    }

    #[test]
    fn repeated_runs_show_medians_and_ablation_rows_their_own_table() {
        let r = |router: &str, rep, hit, p50| RunResult {
            router: router.into(),
            workload: "w".into(),
            rep,
            hit_rate: hit,
            ceiling_hit_rate: 0.8,
            ttft_ms: Percentiles {
                p50,
                p90: p50,
                p99: p50,
            },
            max_over_mean: hit * 2.0,
            ..RunResult::default()
        };
        let runs = [
            r("a", 1, 0.5, 10.0),
            r(SHIPPED, 1, 0.6, 30.0),
            r("ablation: tentative: false", 1, 0.4, 20.0),
            r("a", 2, 0.7, 30.0),
            r(SHIPPED, 2, 0.6, 30.0),
            r("ablation: tentative: false", 2, 0.4, 20.0),
            r("a", 3, 0.6, 20.0),
            r(SHIPPED, 3, 0.6, 30.0),
            r("ablation: tentative: false", 3, 0.4, 20.0),
        ];
        let rows = rows(&runs);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].runs, 3);
        assert!((rows[0].median.hit_rate - 0.6).abs() < 1e-9);
        assert_eq!(rows[0].median.ttft_ms.p50, 20.0);
        assert!((rows[0].median.max_over_mean - 1.2).abs() < 1e-9);
        let md = markdown(&runs);
        assert!(
            md.contains("| a | 60.0% (50.0-70.0) | 75% | 20 / 20 / 20 |"),
            "{md}"
        );
        let (main, ablation) = md.split_once("### Ablation").unwrap();
        assert!(!main.contains("tentative"));
        assert!(
            ablation.contains("| tentative: false | 40.0% (40.0-40.0) |"),
            "{md}"
        );
        assert!(ablation.contains(SHIPPED));
        assert_eq!(md.matches("| router |").count(), 2);
    }
}

/// Short workload label for plots: the text before the parameters.
fn short(workload: &str) -> &str {
    workload.split(" (").next().unwrap_or(workload)
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            include_bytes!("../fonts/DejaVuSans.ttf"),
        );
    });
}

/// A PNG with two panels: engine hit rate per workload and router (black tick = ceiling), and
/// TTFT p50 with a p99 whisker.
pub fn plot(results: &[RunResult], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_font();
    let medians: Vec<RunResult> = rows(results)
        .into_iter()
        .map(|r| r.median)
        .filter(|r| !r.router.starts_with(ABLATION))
        .collect();
    let results = medians.as_slice();
    let mut workloads: Vec<&str> = Vec::new();
    let mut routers: Vec<&str> = Vec::new();
    for r in results {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
        if !routers.contains(&r.router.as_str()) {
            routers.push(&r.router);
        }
    }
    let find = |w: &str, r: &str| results.iter().find(|x| x.workload == w && x.router == r);
    let n = workloads.len().max(1) as f64;
    let width = 0.8 / routers.len().max(1) as f64;
    let colors = [
        RGBColor(120, 120, 120),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    let root = BitMapBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(450);
    let labels = |x: &f64| {
        let i = x.floor();
        if (x - i - 0.5).abs() < 1e-6 && (i as usize) < workloads.len() {
            short(workloads[i as usize]).to_string()
        } else {
            String::new()
        }
    };
    // Scale to the p50s (whiskers are clipped), so one slow workload does not flatten the rest.
    let max_ttft = results.iter().map(|r| r.ttft_ms.p50).fold(1.0, f64::max) * 3.0;
    for (area, title, y_max, is_hit) in [
        (
            &top,
            "Engine prefix-cache hit rate (%) — black tick: ceiling",
            100.0,
            true,
        ),
        (
            &bottom,
            "TTFT p50 (bar) and p99 (whisker, clipped at the top), ms",
            max_ttft,
            false,
        ),
    ] {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n, 0f64..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * workloads.len() + 1)
            .x_label_formatter(&labels)
            .label_style(("sans-serif", 15))
            .draw()?;
        for (j, router) in routers.iter().enumerate() {
            let color = colors[j % colors.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = workloads
                .iter()
                .enumerate()
                .filter_map(|(i, w)| {
                    let r = find(w, router)?;
                    let x0 = i as f64 + 0.1 + j as f64 * width;
                    let v = if is_hit {
                        r.hit_rate * 100.0
                    } else {
                        r.ttft_ms.p50
                    };
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + width * 0.9, v)],
                        color.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)?
                .label(*router)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
            if !is_hit {
                for (i, w) in workloads.iter().enumerate() {
                    if let Some(r) = find(w, router) {
                        let x = i as f64 + 0.1 + (j as f64 + 0.45) * width;
                        let top = r.ttft_ms.p99.min(max_ttft);
                        chart.draw_series(LineSeries::new(
                            [(x, r.ttft_ms.p50), (x, top)],
                            BLACK.stroke_width(1),
                        ))?;
                    }
                }
            }
        }
        if is_hit {
            for (i, w) in workloads.iter().enumerate() {
                if let Some(r) = results.iter().find(|x| x.workload == *w) {
                    let c = r.ceiling_hit_rate * 100.0;
                    chart.draw_series(LineSeries::new(
                        [(i as f64 + 0.05, c), (i as f64 + 0.95, c)],
                        BLACK.stroke_width(3),
                    ))?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 15))
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod plot_tests {
    use super::*;

    #[test]
    fn plot_writes_a_png() {
        let r = |router: &str, workload: &str, hit| RunResult {
            router: router.into(),
            workload: workload.into(),
            hit_rate: hit,
            ceiling_hit_rate: 0.8,
            ttft_ms: crate::driver::Percentiles {
                p50: 10.0,
                p90: 20.0,
                p99: 30.0,
            },
            ..RunResult::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        plot(
            &[
                r("a", "w1 (x)", 0.5),
                r("b", "w1 (x)", 0.7),
                r("a", "w2 (y)", 0.2),
            ],
            &path,
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5_000);
    }
}
