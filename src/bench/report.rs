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
            include_bytes!("../../bench/fonts/DejaVuSans.ttf"),
        );
    });
}

/// A PNG with two panels: engine hit rate per workload and router (black tick = ceiling), and
/// TTFT p50 with a p99 whisker.
pub fn plot(results: &[RunResult], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_font();
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
            ttft_ms: crate::bench::driver::Percentiles {
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
