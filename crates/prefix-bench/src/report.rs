//! Benchmark reports: JSON (every run) and a markdown table per workload, with each router's
//! hit rate also shown as a share of the workload's ceiling. When a row ran several times
//! (`--repeat`), the tables show the median of each column over its runs (and the hit rate's
//! range); rows named `ablation: ...` go to their own tables, beside the shipped config's row.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::driver::{Percentiles, RunResult, TenantResult};
use super::probe::TokenizeWork;

/// The prefix of ablation rows' router names.
pub const ABLATION: &str = "ablation: ";
/// The row ablation rows are compared with.
pub const SHIPPED: &str = "prefix-picker: shipped config";
/// The shipped config reading every engine's KV events (the engine-events rows' name prefix).
/// The prefix of a row run with `suite --baseline-picker`'s binary.
pub const BASELINE: &str = "baseline binary: ";
pub const SHIPPED_ENGINE_EVENTS: &str = "prefix-picker: shipped config + engine events";

/// Envoy alone, routing round robin.
pub const ROUND_ROBIN: &str = "envoy round-robin";
/// The name prefix of the oracle row with a load allowance (placement searched offline).
pub const CAPPED_ORACLE: &str = "oracle, max/mean load <= ";

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
                    engines: None,
                    tokenize: first.tokenize.map(|_| TokenizeWork {
                        calls: m(|r| r.tokenize.unwrap_or_default().calls),
                        tokens: m(|r| r.tokenize.unwrap_or_default().tokens),
                    }),
                    prompt_tokens: m(|r| r.prompt_tokens as f64).round() as u64,
                    tenants: median_tenants(&runs),
                    samples: Vec::new(),
                },
                runs: runs.len(),
                hit_min: hits.iter().copied().fold(f64::INFINITY, f64::min),
                hit_max: hits.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect()
}

/// Each tenant's results, the median over `runs` of each column.
fn median_tenants(runs: &[&RunResult]) -> BTreeMap<String, TenantResult> {
    let names: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.tenants.keys()).collect();
    names
        .into_iter()
        .map(|t| {
            let of: Vec<&TenantResult> = runs.iter().filter_map(|r| r.tenants.get(t)).collect();
            let m = |f: fn(&TenantResult) -> f64| median(of.iter().map(|r| f(r)).collect());
            let result = TenantResult {
                requests: of[0].requests,
                errors: m(|r| r.errors as f64).round() as usize,
                requests_per_s: m(|r| r.requests_per_s),
                ttft_ms: Percentiles {
                    p50: m(|r| r.ttft_ms.p50),
                    p90: m(|r| r.ttft_ms.p90),
                    p99: m(|r| r.ttft_ms.p99),
                },
            };
            (t.clone(), result)
        })
        .collect()
}

/// Per tenant, when the rows' workload names tenants: each router's TTFT and throughput per
/// tenant.
fn tenant_table(out: &mut String, rows: &[&Row]) {
    if rows.iter().all(|r| r.median.tenants.is_empty()) {
        return;
    }
    let _ = writeln!(
        out,
        "\n| router | tenant | TTFT p50 / p90 / p99 (ms) | req/s | requests | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for row in rows {
        for (t, r) in &row.median.tenants {
            let _ = writeln!(
                out,
                "| {} | {t} | {:.0} / {:.0} / {:.0} | {:.2} | {} | {} |",
                row.median
                    .router
                    .strip_prefix(ABLATION)
                    .unwrap_or(&row.median.router),
                r.ttft_ms.p50,
                r.ttft_ms.p90,
                r.ttft_ms.p99,
                r.requests_per_s,
                r.requests,
                r.errors
            );
        }
    }
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
        tenant_table(&mut out, &main);
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

/// Writes `<name>.json` (`results`) and `<name>.md` (`md`) into `out`.
pub fn write_results(
    out: &std::path::Path,
    name: &str,
    results: &impl serde::Serialize,
    md: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(out.join(format!("{name}.md")), md)?;
    Ok(())
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
    fn tenants_get_a_table_of_medians_per_router() {
        let r = |router: &str, p50: f64| RunResult {
            router: router.into(),
            workload: "w".into(),
            tenants: BTreeMap::from([(
                "light".to_string(),
                TenantResult {
                    requests: 4,
                    errors: 0,
                    requests_per_s: 2.0,
                    ttft_ms: Percentiles {
                        p50,
                        p90: p50,
                        p99: p50,
                    },
                },
            )]),
            ..RunResult::default()
        };
        let md = markdown(&[r("a", 10.0), r("a", 30.0), r("a", 20.0)]);
        assert!(md.contains("| router | tenant |"), "{md}");
        assert!(
            md.contains("| a | light | 20 / 20 / 20 | 2.00 | 4 | 0 |"),
            "{md}"
        );
        assert_eq!(
            markdown(&[RunResult::default()])
                .matches("| tenant |")
                .count(),
            0
        );
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

/// Short workload label for plots and the summary: the text before the parameters.
pub fn short(workload: &str) -> &str {
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

/// Greedy word wrap of `text` into lines at most `max_px` wide as `measure` sees them (a word
/// wider than that gets a line of its own).
fn wrap(text: &str, max_px: u32, measure: impl Fn(&str) -> u32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if measure(&format!("{line} {word}")) <= max_px => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// A PNG with two panels stacked vertically, sharing one x layout (a bar group per workload, one
/// bar per router): engine hit rate (black tick = ceiling), and TTFT p50 with a p99 whisker on a
/// log axis. Workload names are wrapped under their group; the legend is a strip below the panels.
pub fn plot(results: &[RunResult], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
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
    let bar_x = |i: usize, j: usize| i as f64 + 0.1 + j as f64 * width;
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
        RGBColor(188, 189, 34),
        RGBColor(0, 0, 128),
        RGBColor(255, 187, 120),
        RGBColor(0, 0, 0),
    ];
    let color = |j: usize| colors[j % colors.len()];

    // Layout: two panels of PANEL px, then the legend strip, in as many columns as fit.
    const W: u32 = 1600;
    const PANEL: u32 = 470;
    const ROW: u32 = 24;
    const X_LABEL_AREA: u32 = 66;
    let label_font = ("sans-serif", 15).into_font();
    let legend_font = ("sans-serif", 16).into_font();
    let measure =
        |text: &str, font: &FontDesc| -> u32 { font.box_size(text).map(|(w, _)| w).unwrap_or(0) };
    let ceiling_label = "hit-rate ceiling (black tick)";
    let mut entries: Vec<(Option<RGBColor>, &str)> = routers
        .iter()
        .enumerate()
        .map(|(j, r)| (Some(color(j)), *r))
        .collect();
    entries.push((None, ceiling_label));
    let entry_w = entries
        .iter()
        .map(|(_, t)| measure(t, &legend_font) + 40)
        .max()
        .unwrap_or(0)
        .max(1);
    let columns = ((W - 40) / entry_w).clamp(1, entries.len().max(1) as u32) as usize;
    let legend_rows = entries.len().div_ceil(columns);
    let legend_h = legend_rows as u32 * ROW + 24;

    let root = BitMapBackend::new(path, (W, 2 * PANEL + legend_h)).into_drawing_area();
    root.fill(&WHITE)?;
    let (panels, legend) = root.split_vertically(2 * PANEL);
    let (top, bottom) = panels.split_vertically(PANEL);

    // Pixel positions of the x axis of a panel: left and right ends (x = 0 and x = n) and its y.
    let mut axes: Vec<(i32, i32, i32)> = Vec::new();

    // Hit rate.
    {
        let mut chart = ChartBuilder::on(&top)
            .caption(
                "Engine prefix-cache hit rate (%) — black tick: ceiling",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(X_LABEL_AREA)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n, 0f64..100f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("hit rate %")
            .y_label_formatter(&|v: &f64| format!("{v:.0}"))
            .label_style(("sans-serif", 15))
            .draw()?;
        for i in 1..workloads.len() {
            let x = i as f64;
            chart.draw_series(LineSeries::new(
                [(x, 0.0), (x, 100.0)],
                RGBColor(200, 200, 200),
            ))?;
        }
        for (j, router) in routers.iter().enumerate() {
            let c = color(j);
            chart.draw_series(workloads.iter().enumerate().filter_map(|(i, w)| {
                let r = find(w, router)?;
                let x0 = bar_x(i, j);
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, r.hit_rate * 100.0)],
                    c.filled(),
                ))
            }))?;
        }
        for (i, w) in workloads.iter().enumerate() {
            if let Some(r) = results.iter().find(|x| x.workload == *w) {
                let c = r.ceiling_hit_rate * 100.0;
                chart.draw_series(LineSeries::new(
                    [(i as f64 + 0.05, c), (i as f64 + 0.95, c)],
                    BLACK.stroke_width(3),
                ))?;
            }
        }
        let (x0, y) = chart.backend_coord(&(0.0, 0.0));
        let (x1, _) = chart.backend_coord(&(n, 0.0));
        axes.push((x0, x1, y));
    }

    // TTFT on a log axis: p50 bars from the axis floor, p99 whiskers; nothing is clipped.
    {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let lo = results
            .iter()
            .map(|r| r.ttft_ms.p50)
            .filter(|v| positive(*v))
            .fold(f64::INFINITY, f64::min);
        let hi = results
            .iter()
            .map(|r| r.ttft_ms.p99.max(r.ttft_ms.p50))
            .filter(|v| positive(*v))
            .fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > 0.0 {
            (
                10f64.powf((lo * 0.9).log10().floor()),
                10f64.powf((hi * 1.1).log10().ceil()),
            )
        } else {
            (1.0, 10.0)
        };
        let mut chart = ChartBuilder::on(&bottom)
            .caption(
                "TTFT p50 (bar) and p99 (whisker), ms — log scale",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(X_LABEL_AREA)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n, (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("ms")
            .y_label_formatter(&|v: &f64| format!("{v}"))
            .label_style(("sans-serif", 15))
            .draw()?;
        for i in 1..workloads.len() {
            let x = i as f64;
            chart.draw_series(LineSeries::new([(x, lo), (x, hi)], RGBColor(200, 200, 200)))?;
        }
        for (j, router) in routers.iter().enumerate() {
            let c = color(j);
            for (i, w) in workloads.iter().enumerate() {
                let Some(r) = find(w, router) else { continue };
                if !positive(r.ttft_ms.p50) {
                    continue;
                }
                let x0 = bar_x(i, j);
                chart.draw_series([Rectangle::new(
                    [(x0, lo), (x0 + width * 0.9, r.ttft_ms.p50)],
                    c.filled(),
                )])?;
                if r.ttft_ms.p99 > r.ttft_ms.p50 {
                    let x = x0 + width * 0.45;
                    chart.draw_series(LineSeries::new(
                        [(x, r.ttft_ms.p50), (x, r.ttft_ms.p99)],
                        BLACK.stroke_width(1),
                    ))?;
                    chart.draw_series(LineSeries::new(
                        [
                            (x - width * 0.3, r.ttft_ms.p99),
                            (x + width * 0.3, r.ttft_ms.p99),
                        ],
                        BLACK.stroke_width(1),
                    ))?;
                }
            }
        }
        let (x0, y) = chart.backend_coord(&(0.0, lo));
        let (x1, _) = chart.backend_coord(&(n, lo));
        axes.push((x0, x1, y));
    }

    // Workload names under each group, the short name wrapped to the group's width.
    let label_style = TextStyle::from(label_font.clone())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (x0, x1, y) in axes {
        let group = (x1 - x0) as f64 / n;
        let max_px = (group * 0.95).max(1.0) as u32;
        for (i, w) in workloads.iter().enumerate() {
            let cx = x0 + (group * (i as f64 + 0.5)).round() as i32;
            for (k, line) in wrap(short(w), max_px, |t| measure(t, &label_font))
                .iter()
                .enumerate()
            {
                root.draw(&Text::new(
                    line.clone(),
                    (cx, y + 6 + k as i32 * 18),
                    label_style.clone(),
                ))?;
            }
        }
    }

    // Legend strip, filled column by column.
    legend.draw(&PathElement::new(
        [(12, 4), (W as i32 - 12, 4)],
        RGBColor(200, 200, 200),
    ))?;
    let legend_style = TextStyle::from(legend_font.clone())
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (k, (c, text)) in entries.iter().enumerate() {
        let col = (k / legend_rows) as i32;
        let row = (k % legend_rows) as i32;
        let x = 24 + col * entry_w as i32;
        let y = 16 + row * ROW as i32 + ROW as i32 / 2;
        match c {
            Some(c) => legend.draw(&Rectangle::new([(x, y - 7), (x + 22, y + 7)], c.filled()))?,
            None => legend.draw(&PathElement::new(
                [(x, y), (x + 22, y)],
                BLACK.stroke_width(3),
            ))?,
        }
        legend.draw(&Text::new(
            text.to_string(),
            (x + 30, y),
            legend_style.clone(),
        ))?;
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
        // 1600 px wide: two panels of 470 px, then the legend strip (3 entries in one row).
        let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), (1600, 2 * 470 + 24 + 24));
    }

    #[test]
    fn plot_survives_many_routers_and_missing_ttft() {
        let r = |router: String, workload: &str, p50| RunResult {
            router,
            workload: workload.into(),
            hit_rate: 0.5,
            ceiling_hit_rate: 0.8,
            ttft_ms: crate::driver::Percentiles {
                p50,
                p90: p50,
                p99: p50 * 3.0,
            },
            ..RunResult::default()
        };
        let mut runs = Vec::new();
        for j in 0..14 {
            for w in [
                "shared-prefix Kthena long system (x)",
                "trace (y)",
                "ramp (z)",
            ] {
                runs.push(r(format!("router number {j}"), w, j as f64));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, runs) in [("many.png", &runs[..]), ("empty.png", &[][..])] {
            let path = dir.path().join(name);
            plot(runs, &path).unwrap();
            assert_eq!(&std::fs::read(&path).unwrap()[1..4], b"PNG");
        }
    }

    #[test]
    fn wrap_breaks_at_spaces_within_the_width() {
        let chars = |t: &str| t.len() as u32;
        assert_eq!(
            wrap("shared-prefix Kthena short system", 13, chars),
            ["shared-prefix", "Kthena short", "system"]
        );
        assert_eq!(
            wrap("a-very-long-word b", 4, chars),
            ["a-very-long-word", "b"]
        );
        assert!(wrap("", 10, chars).is_empty());
    }
}
