//! What the benchmark reads from the processes it runs: the picker's decisions by reason, and CPU
//! time. Starting them is [`testkit`]'s.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// `prefix_picker_decisions_total` by reason, summed over pickers' admin endpoints (a picker
/// that does not answer counts nothing).
pub async fn decision_reasons(admins: &[SocketAddr]) -> BTreeMap<String, f64> {
    let client = reqwest::Client::new();
    let mut sums = BTreeMap::new();
    for admin in admins {
        let Ok(r) = client.get(format!("http://{admin}/metrics")).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        for (reason, n) in parse_decision_reasons(&text) {
            *sums.entry(reason).or_insert(0.0) += n;
        }
    }
    sums
}

/// The `prefix_picker_decisions_total{reason}` samples of a Prometheus text exposition.
pub fn parse_decision_reasons(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("prefix_picker_decisions_total{reason=\"")?;
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// `utime + stime` of a process, in seconds (Linux `/proc/<pid>/stat`, 100 ticks/s).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_reasons_are_read_from_the_exposition() {
        let text = "# HELP prefix_picker_decisions_total Routing decisions\n\
            # TYPE prefix_picker_decisions_total counter\n\
            prefix_picker_decisions_total{reason=\"prefix_hit\"} 12\n\
            prefix_picker_decisions_total{reason=\"prefix_overruled\"} 3\n\
            prefix_picker_decision_duration_seconds_count 15\n";
        assert_eq!(
            parse_decision_reasons(text),
            [
                ("prefix_hit".to_string(), 12.0),
                ("prefix_overruled".to_string(), 3.0)
            ]
        );
    }
}
