//! CPU per request against the two floors of a bootstrap, taken within each round: the
//! processor's own CPU (the picker's process, or the floor's) and Envoy's plus the processor's,
//! each divided by the same round's no-op row and routing-floor row with the same bootstrap
//! and concurrency. The table gives, per picker or floor row, the median of those ratios over
//! the rounds and their range: `picker / no-op` (what issue 39's goal bounds), `floor / no-op`
//! (what routing itself costs above the protocol) and `picker / floor` (what the picker's
//! platform costs above routing).

use std::collections::BTreeMap;

use super::{OverheadRow, RowKind, Spread};

/// The header of [`cpu_ratio_markdown`]'s table.
pub const CPU_RATIO_HEADER: &str = "| setup | concurrency | processor CPU / no-op's | processor CPU / floor's | Envoy + processor CPU / with no-op | Envoy + processor CPU / with floor |\n|---|---|---|---|---|---|\n";

/// A row's CPU per request: the processor's, and Envoy's plus the processor's.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    processor: f64,
    total: f64,
}

impl Cpu {
    fn of(r: &OverheadRow) -> Option<Cpu> {
        let processor = r.ext_proc_cpu_ms?;
        Some(Cpu {
            processor,
            total: processor + r.proxy_cpu_ms,
        })
    }
}

/// (concurrency, round, bootstrap) -> a floor row's CPU.
type Floors<'a> = BTreeMap<(usize, usize, &'a str), Cpu>;

/// The ratio table of every picker and floor row, in the order the rows first appear, grouped
/// by concurrency; empty when no row has a floor to compare with.
pub fn cpu_ratio_markdown(rows: &[OverheadRow]) -> String {
    let (mut noop, mut floor): (Floors, Floors) = (BTreeMap::new(), BTreeMap::new());
    for r in rows {
        let (map, file) = match &r.kind {
            RowKind::Noop { file } => (&mut noop, file),
            RowKind::Floor { file } => (&mut floor, file),
            _ => continue,
        };
        if let Some(cpu) = Cpu::of(r) {
            map.insert((r.concurrency, r.round, file.as_str()), cpu);
        }
    }
    let mut order: Vec<(usize, &str)> = Vec::new();
    for r in rows {
        let compared = matches!(r.kind, RowKind::Picker { .. } | RowKind::Floor { .. });
        if compared && !order.contains(&(r.concurrency, r.setup.as_str())) {
            order.push((r.concurrency, r.setup.as_str()));
        }
    }
    order.sort_by_key(|&(c, _)| c);
    let lines: Vec<String> = order
        .into_iter()
        .map(|(c, setup)| {
            let mine: Vec<&OverheadRow> = rows
                .iter()
                .filter(|r| r.concurrency == c && r.setup == setup)
                .collect();
            ratio_line(setup, c, &mine, &noop, &floor)
        })
        .collect();
    if lines.is_empty() || (noop.is_empty() && floor.is_empty()) {
        return String::new();
    }
    let mut md = String::from(
        "CPU per request against the floors of the same bootstrap, in-round ratios: medians \
         over the rounds (range in brackets).\n\n",
    );
    md.push_str(CPU_RATIO_HEADER);
    for line in lines {
        md.push_str(&line);
    }
    md
}

/// One row's line: its ratios to the no-op and to the floor, per round, as medians.
fn ratio_line(
    setup: &str,
    c: usize,
    mine: &[&OverheadRow],
    noop: &Floors,
    floor: &Floors,
) -> String {
    let ratio = |floors: &Floors, part: fn(Cpu) -> f64| {
        let values = mine
            .iter()
            .filter_map(|r| {
                let file = match &r.kind {
                    RowKind::Picker { file } | RowKind::Floor { file } => file.as_str(),
                    _ => return None,
                };
                let (own, base) = (Cpu::of(r)?, floors.get(&(r.concurrency, r.round, file))?);
                Some(part(own) / part(*base).max(1e-9))
            })
            .collect();
        Spread::of(values).map_or("-".into(), |s| {
            format!("{:.2}x ({:.2}-{:.2})", s.median, s.min, s.max)
        })
    };
    let is_floor = mine.iter().any(|r| matches!(r.kind, RowKind::Floor { .. }));
    let to_floor = |part: fn(Cpu) -> f64| {
        if is_floor {
            "floor".to_string()
        } else {
            ratio(floor, part)
        }
    };
    format!(
        "| {setup} | {c} | {} | {} | {} | {} |\n",
        ratio(noop, |x| x.processor),
        to_floor(|x| x.processor),
        ratio(noop, |x| x.total),
        to_floor(|x| x.total),
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{floor, noop, picker, row};
    use super::*;

    /// A row of `kind` in `round` whose processor took `processor` ms and Envoy 0.2 ms.
    fn cpu(kind: RowKind, round: usize, processor: f64) -> OverheadRow {
        let mut r = row(kind, round, 1.0);
        r.ext_proc_cpu_ms = Some(processor);
        r
    }

    #[test]
    fn each_round_is_divided_by_its_own_floors() {
        // Round 2 ran on a slower machine: every floor doubled, so the floor's ratios stayed.
        let rows = vec![
            row(RowKind::Alone, 1, 0.5),
            cpu(noop("a.yaml"), 1, 0.05),
            cpu(floor("a.yaml"), 1, 0.06),
            cpu(picker("a.yaml"), 1, 0.08),
            cpu(noop("a.yaml"), 2, 0.10),
            cpu(floor("a.yaml"), 2, 0.12),
            cpu(picker("a.yaml"), 2, 0.17),
        ];
        let md = cpu_ratio_markdown(&rows);
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 3, "{md}");
        assert_eq!(
            lines[1],
            "| floor (a.yaml) | 1 | 1.20x (1.20-1.20) | floor | 1.05x (1.04-1.07) | floor |"
        );
        assert_eq!(
            lines[2],
            "| picker (a.yaml) | 1 | 1.65x (1.60-1.70) | 1.38x (1.33-1.42) | 1.18x (1.12-1.23) | 1.12x (1.08-1.16) |"
        );
    }

    #[test]
    fn a_row_is_compared_with_the_floors_of_its_own_bootstrap_only() {
        let rows = vec![
            cpu(noop("a.yaml"), 1, 0.05),
            cpu(noop("b.yaml"), 1, 0.10),
            cpu(picker("b.yaml"), 1, 0.15),
        ];
        let md = cpu_ratio_markdown(&rows);
        assert!(
            md.contains("| picker (b.yaml) | 1 | 1.50x (1.50-1.50) | - |"),
            "{md}"
        );
        // Without any floor row there is nothing to compare.
        assert_eq!(cpu_ratio_markdown(&[cpu(picker("a.yaml"), 1, 0.1)]), "");
    }
}
