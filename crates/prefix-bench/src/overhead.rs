//! The summary of `prefix-bench overhead --rounds N`: every setup measured N times in
//! alternation, each round's rows compared with the same round's baseline.
//!
//! On a small shared machine one run's latency drifts by tens of percent from minute to minute,
//! more than the differences being measured. So a round runs every setup once, one after
//! another, and the comparisons are taken within a round: a row's p50 minus the p50 of "Envoy
//! alone" in the same round and at the same concurrency, and for a prefix-picker row, its p50
//! minus the no-op processor's with the same Envoy bootstrap in the same round (what the picker
//! itself adds). The summary gives the median of each comparison over the rounds, with its
//! range, and the median of the per-request CPU columns. [`cpu_ratios`] compares the CPU per
//! request of the picker rows with the two floors of their bootstrap in the same round: the
//! no-op processor and the routing floor (the no-op plus the routing any prefix-cache router
//! must do, [`crate::routing_floor`]).

pub mod cpu_ratios;

use std::collections::BTreeMap;

/// What a row measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowKind {
    /// Envoy without an external processor (the baseline).
    Alone,
    /// Envoy with the bootstrap `file`, its processor the no-op one.
    Noop { file: String },
    /// Envoy with the bootstrap `file` and prefix-picker.
    Picker { file: String },
    /// Envoy with the bootstrap `file`, its processor the routing floor.
    Floor { file: String },
    /// Another router, without Envoy.
    Peer,
}

/// One row of one round.
#[derive(Debug, Clone)]
pub struct OverheadRow {
    pub setup: String,
    pub kind: RowKind,
    pub concurrency: usize,
    pub round: usize,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU of Envoy (or the peer router) per request.
    pub proxy_cpu_ms: f64,
    /// CPU of the external processor per request, when there is one.
    pub ext_proc_cpu_ms: Option<f64>,
}

/// The header of the per-round table ([`OverheadRow::markdown`]).
pub const ROUND_TABLE_HEADER: &str = "| setup | concurrency | round | req/s | p50 (ms) | p99 (ms) | p50 vs Envoy alone | proxy CPU ms/req (Envoy or peer) | ext_proc CPU ms/req (picker or no-op) |\n|---|---|---|---|---|---|---|---|---|\n";

impl OverheadRow {
    /// The row's line in the per-round table, compared with its round's baseline p50.
    pub fn markdown(&self, baseline_p50_ms: f64) -> String {
        format!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:+.2} ms ({:.2}x) | {:.3} | {} |\n",
            self.setup,
            self.concurrency,
            self.round,
            self.requests_per_s,
            self.p50_ms,
            self.p99_ms,
            self.p50_ms - baseline_p50_ms,
            self.p50_ms / baseline_p50_ms.max(1e-9),
            self.proxy_cpu_ms,
            self.ext_proc_cpu_ms
                .map_or("-".into(), |ms| format!("{ms:.3}")),
        )
    }
}

/// Median and range of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut values: Vec<f64>) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[n - 1],
        })
    }

    /// The median alone, with `decimals` decimals ("-" without values).
    fn median_of(spread: Option<Spread>, decimals: usize) -> String {
        spread.map_or("-".into(), |s| format!("{:.*}", decimals, s.median))
    }

    fn signed(self) -> String {
        format!(
            "{:+.2} ms ({:+.2} to {:+.2})",
            self.median, self.min, self.max
        )
    }
}

/// The markdown summary table of rows from one or more rounds, in the order setups first
/// appear, grouped by concurrency.
pub fn summary_markdown(rows: &[OverheadRow]) -> String {
    let rounds = rows.iter().map(|r| r.round).max().unwrap_or(0);
    let mut md = format!(
        "Medians over {rounds} round(s); in brackets the range over the rounds. \"vs Envoy alone\" \
         and \"vs no-op\" compare each row with the baseline row of the same round.\n\n"
    );
    md.push_str(
        "| setup | concurrency | p50 (ms) | p50 vs Envoy alone | its own (vs no-op, same bootstrap) | p99 (ms) | req/s | proxy CPU ms/req | ext_proc CPU ms/req |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut order: Vec<(usize, &str)> = Vec::new();
    for r in rows {
        if !order.contains(&(r.concurrency, r.setup.as_str())) {
            order.push((r.concurrency, r.setup.as_str()));
        }
    }
    order.sort_by_key(|&(c, _)| c);
    let baselines = Baselines::of(rows);
    for (c, setup) in order {
        let mine: Vec<&OverheadRow> = rows
            .iter()
            .filter(|r| r.concurrency == c && r.setup == setup)
            .collect();
        md.push_str(&baselines.summary_line(setup, c, &mine));
    }
    md
}

/// What the summary compares each round's rows with: the round's Envoy-alone p50, and its
/// no-op p50 per bootstrap.
struct Baselines<'a> {
    /// (concurrency, round) -> p50.
    alone: BTreeMap<(usize, usize), f64>,
    /// (concurrency, round, bootstrap) -> p50.
    noop: BTreeMap<(usize, usize, &'a str), f64>,
}

impl<'a> Baselines<'a> {
    fn of(rows: &'a [OverheadRow]) -> Baselines<'a> {
        let mut b = Baselines {
            alone: BTreeMap::new(),
            noop: BTreeMap::new(),
        };
        for r in rows {
            match &r.kind {
                RowKind::Alone => {
                    b.alone.insert((r.concurrency, r.round), r.p50_ms);
                }
                RowKind::Noop { file } => {
                    b.noop
                        .insert((r.concurrency, r.round, file.as_str()), r.p50_ms);
                }
                _ => {}
            }
        }
        b
    }

    /// The summary line of `setup` at concurrency `c`, from its rows of every round (`mine`).
    fn summary_line(&self, setup: &str, c: usize, mine: &[&OverheadRow]) -> String {
        let column = |f: &dyn Fn(&OverheadRow) -> Option<f64>| {
            Spread::of(mine.iter().filter_map(|r| f(r)).collect())
        };
        let p50 = column(&|r| Some(r.p50_ms));
        let vs_alone = column(&|r| Some(r.p50_ms - self.alone.get(&(r.concurrency, r.round))?));
        let own = column(&|r| match &r.kind {
            RowKind::Picker { file } | RowKind::Floor { file } => {
                Some(r.p50_ms - self.noop.get(&(r.concurrency, r.round, file.as_str()))?)
            }
            _ => None,
        });
        let is_alone = mine.iter().any(|r| r.kind == RowKind::Alone);
        format!(
            "| {setup} | {c} | {} | {} | {} | {} | {} | {} | {} |\n",
            p50.map_or("-".into(), |s| format!(
                "{:.2} ({:.2}-{:.2})",
                s.median, s.min, s.max
            )),
            match vs_alone {
                Some(_) if is_alone => "baseline".into(),
                Some(s) => s.signed(),
                None => "-".into(),
            },
            own.map_or("-".into(), Spread::signed),
            Spread::median_of(column(&|r| Some(r.p99_ms)), 2),
            Spread::median_of(column(&|r| Some(r.requests_per_s)), 0),
            Spread::median_of(column(&|r| Some(r.proxy_cpu_ms)), 3),
            Spread::median_of(column(&|r| r.ext_proc_cpu_ms), 3),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(super) fn row(kind: RowKind, round: usize, p50: f64) -> OverheadRow {
        let setup = match &kind {
            RowKind::Alone => "Envoy alone".to_string(),
            RowKind::Noop { file } => format!("no-op ({file})"),
            RowKind::Picker { file } => format!("picker ({file})"),
            RowKind::Floor { file } => format!("floor ({file})"),
            RowKind::Peer => "peer".to_string(),
        };
        let ext_proc_cpu_ms = match kind {
            RowKind::Noop { .. } | RowKind::Picker { .. } | RowKind::Floor { .. } => {
                Some(0.1 * round as f64)
            }
            _ => None,
        };
        OverheadRow {
            setup,
            kind,
            concurrency: 1,
            round,
            requests_per_s: 1000.0 / p50,
            p50_ms: p50,
            p99_ms: 2.0 * p50,
            proxy_cpu_ms: 0.2,
            ext_proc_cpu_ms,
        }
    }

    pub(super) fn noop(file: &str) -> RowKind {
        RowKind::Noop { file: file.into() }
    }

    pub(super) fn picker(file: &str) -> RowKind {
        RowKind::Picker { file: file.into() }
    }

    pub(super) fn floor(file: &str) -> RowKind {
        RowKind::Floor { file: file.into() }
    }

    #[test]
    fn comparisons_are_taken_within_each_round() {
        // The machine got slower in round 2 and faster in round 3: every row moved with it,
        // so the in-round differences stay put while the raw p50s spread.
        let rows = vec![
            row(RowKind::Alone, 1, 0.50),
            row(noop("a.yaml"), 1, 1.00),
            row(picker("a.yaml"), 1, 1.10),
            row(RowKind::Alone, 2, 1.50),
            row(noop("a.yaml"), 2, 2.00),
            row(picker("a.yaml"), 2, 2.10),
            row(RowKind::Alone, 3, 0.40),
            row(noop("a.yaml"), 3, 1.00),
            row(picker("a.yaml"), 3, 1.20),
        ];
        let md = summary_markdown(&rows);
        assert!(md.starts_with("Medians over 3 round(s)"), "{md}");
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 4, "{md}");
        assert_eq!(
            lines[1],
            "| Envoy alone | 1 | 0.50 (0.40-1.50) | baseline | - | 1.00 | 2000 | 0.200 | - |"
        );
        assert_eq!(
            lines[2],
            "| no-op (a.yaml) | 1 | 1.00 (1.00-2.00) | +0.50 ms (+0.50 to +0.60) | - | 2.00 | 1000 | 0.200 | 0.200 |"
        );
        assert_eq!(
            lines[3],
            "| picker (a.yaml) | 1 | 1.20 (1.10-2.10) | +0.60 ms (+0.60 to +0.80) | +0.10 ms (+0.10 to +0.20) | 2.40 | 833 | 0.200 | 0.200 |"
        );
    }

    #[test]
    fn a_round_line_compares_with_its_baseline() {
        assert_eq!(
            row(picker("a.yaml"), 2, 1.5).markdown(0.5),
            "| picker (a.yaml) | 1 | 2 | 667 | 1.50 | 3.00 | +1.00 ms (3.00x) | 0.200 | 0.200 |\n"
        );
        assert!(ROUND_TABLE_HEADER.starts_with("| setup | concurrency | round |"));
    }

    #[test]
    fn a_picker_is_compared_with_the_no_op_of_its_own_bootstrap() {
        let rows = vec![
            row(RowKind::Alone, 1, 0.5),
            row(noop("a.yaml"), 1, 1.0),
            row(noop("b.yaml"), 1, 2.0),
            row(picker("b.yaml"), 1, 2.25),
            row(RowKind::Peer, 1, 0.75),
        ];
        let md = summary_markdown(&rows);
        assert!(
            md.contains("| picker (b.yaml) | 1 | 2.25 (2.25-2.25) | +1.75 ms (+1.75 to +1.75) | +0.25 ms (+0.25 to +0.25) |"),
            "{md}"
        );
        assert!(
            md.contains("| peer | 1 | 0.75 (0.75-0.75) | +0.25 ms (+0.25 to +0.25) | - |"),
            "{md}"
        );
    }

    #[test]
    fn concurrency_levels_are_grouped_and_a_missing_baseline_gives_no_comparison() {
        let mut high = row(picker("a.yaml"), 1, 3.0);
        high.concurrency = 16;
        let rows = vec![high, row(picker("a.yaml"), 1, 1.0)];
        let md = summary_markdown(&rows);
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| picker")).collect();
        assert_eq!(
            lines,
            [
                "| picker (a.yaml) | 1 | 1.00 (1.00-1.00) | - | - | 2.00 | 1000 | 0.200 | 0.100 |",
                "| picker (a.yaml) | 16 | 3.00 (3.00-3.00) | - | - | 6.00 | 333 | 0.200 | 0.100 |",
            ]
        );
        assert_eq!(Spread::of(Vec::new()), None);
    }
}
