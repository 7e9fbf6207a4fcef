//! Where a run's prompt tokens went uncached (`prefix-bench misses`, from `suite --samples`):
//! each request that left most of its prompt uncached missed its group's shared prefix (a
//! tenant's system prompt, a session's history), and the cause is read from the requests of its
//! group before it in the same run:
//! - *first*: the group's first request of the run;
//! - *in flight*: the group's previous request had not finished when this one started;
//! - *evicted*: sent to a pod that served the group before, which no longer held it;
//! - *moved*: sent to a pod that had never served the group.
//!
//! Every other uncached token (the request's own question, a partial match, requests without a
//! group) is *own*. A router loses to another where its first, in-flight, evicted or moved
//! losses are larger; *own* is much the same for every router of a workload.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

use serde::Deserialize;

use crate::driver::Sample;

/// Why a request's uncached tokens were not cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    First,
    InFlight,
    Evicted,
    Moved,
    Own,
}

impl Cause {
    pub const ALL: [Cause; 5] = [
        Cause::First,
        Cause::InFlight,
        Cause::Evicted,
        Cause::Moved,
        Cause::Own,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::First => "first",
            Cause::InFlight => "in flight",
            Cause::Evicted => "evicted",
            Cause::Moved => "moved",
            Cause::Own => "own",
        }
    }
}

/// One line of `suite-samples.jsonl`.
#[derive(Debug, Clone, Deserialize)]
pub struct SampleLine {
    pub router: String,
    pub workload: String,
    pub rep: usize,
    pub sample: Sample,
}

/// One run's prompt tokens, those cached, and those lost by cause; the misses of a group's
/// prefix counted by cause.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLosses {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub lost: BTreeMap<Cause, u64>,
    pub misses: BTreeMap<Cause, u32>,
}

impl RunLosses {
    /// Tokens lost to `cause` as a percentage of the run's prompt tokens.
    pub fn lost_percent(&self, cause: Cause) -> f64 {
        let lost = self.lost.get(&cause).copied().unwrap_or(0);
        100.0 * lost as f64 / self.prompt_tokens.max(1) as f64
    }

    pub fn hit_percent(&self) -> f64 {
        100.0 * self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// The group's requests so far in a run.
#[derive(Default)]
struct GroupSeen {
    /// The latest request's start and end (seconds from the run's start).
    last: Option<(f64, f64)>,
    pods: HashSet<String>,
}

/// Classifies one run's answered requests (any order; they are taken by start time).
pub fn classify(samples: &[Sample]) -> RunLosses {
    let mut ordered: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    ordered.sort_by(|a, b| a.start.total_cmp(&b.start));
    let mut out = RunLosses::default();
    let mut groups: HashMap<u32, GroupSeen> = HashMap::new();
    for s in ordered {
        let uncached = s.prompt_tokens.saturating_sub(s.cached_tokens);
        out.prompt_tokens += s.prompt_tokens;
        out.cached_tokens += s.prompt_tokens - uncached;
        let cause = match s.group {
            Some(g) => {
                let seen = groups.entry(g).or_default();
                let cause = if uncached * 2 <= s.prompt_tokens {
                    Cause::Own
                } else {
                    match seen.last {
                        None => Cause::First,
                        Some((_, end)) if s.start < end => Cause::InFlight,
                        Some(_) if seen.pods.contains(&s.served_by) => Cause::Evicted,
                        Some(_) => Cause::Moved,
                    }
                };
                seen.last = Some((s.start, s.start + s.e2e));
                seen.pods.insert(s.served_by.clone());
                cause
            }
            None => Cause::Own,
        };
        *out.lost.entry(cause).or_default() += uncached;
        if cause != Cause::Own {
            *out.misses.entry(cause).or_default() += 1;
        }
    }
    out
}

/// One router's runs of a workload: each run's samples by its number.
type RunsByRep = BTreeMap<usize, Vec<Sample>>;

/// The entry of `key` in `list` (kept in the order keys are first seen), added when missing.
fn entry<'l, 'a, T: Default>(list: &'l mut Vec<(&'a str, T)>, key: &'a str) -> &'l mut T {
    let at = match list.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            list.push((key, T::default()));
            list.len() - 1
        }
    };
    &mut list[at].1
}

/// A table per workload: each router's mean hit rate and mean losses by cause over its runs.
pub fn markdown(lines: &[SampleLine]) -> String {
    let mut runs: Vec<(&str, Vec<(&str, RunsByRep)>)> = Vec::new();
    for l in lines {
        let routers = entry(&mut runs, &l.workload);
        entry(routers, &l.router)
            .entry(l.rep)
            .or_default()
            .push(l.sample.clone());
    }
    let mut md = String::new();
    for (workload, routers) in runs {
        let _ = writeln!(md, "### {workload}\n");
        let _ = write!(md, "| router | runs | hit rate |");
        for c in Cause::ALL {
            let _ = write!(md, " {} |", c.as_str());
        }
        let _ = write!(
            md,
            " misses (first / in flight / evicted / moved, per run) |\n|---|---|---|"
        );
        md.push_str(&"---|".repeat(Cause::ALL.len() + 1));
        md.push('\n');
        for (router, reps) in routers {
            let losses: Vec<RunLosses> = reps.values().map(|s| classify(s)).collect();
            let n = losses.len() as f64;
            let mean = |f: &dyn Fn(&RunLosses) -> f64| losses.iter().map(f).sum::<f64>() / n;
            let _ = write!(
                md,
                "| {router} | {} | {:.1}% |",
                losses.len(),
                mean(&|l| l.hit_percent())
            );
            for c in Cause::ALL {
                let _ = write!(md, " {:.2} |", mean(&|l| l.lost_percent(c)));
            }
            let per_run = |c: Cause| mean(&|l| f64::from(l.misses.get(&c).copied().unwrap_or(0)));
            let _ = writeln!(
                md,
                " {:.1} / {:.1} / {:.1} / {:.1} |",
                per_run(Cause::First),
                per_run(Cause::InFlight),
                per_run(Cause::Evicted),
                per_run(Cause::Moved)
            );
        }
        md.push('\n');
    }
    md.push_str(
        "Lost tokens by cause, as a percentage of the run's prompt tokens (means over the runs).\n",
    );
    md
}

/// Reads `suite-samples.jsonl`, naming the line that does not parse.
pub fn read(path: &std::path::Path) -> anyhow::Result<Vec<SampleLine>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(start: f64, group: u32, pod: &str, prompt: u64, cached: u64) -> Sample {
        Sample {
            ok: true,
            start,
            e2e: 1.0,
            served_by: pod.into(),
            group: Some(group),
            prompt_tokens: prompt,
            cached_tokens: cached,
            ..Sample::default()
        }
    }

    #[test]
    fn each_miss_of_a_groups_prefix_is_classified_by_the_groups_requests_before_it() {
        let samples = [
            sample(0.0, 7, "a", 100, 0),  // first
            sample(0.5, 7, "b", 100, 10), // in flight: the first ends at 1.0
            sample(3.0, 7, "a", 100, 0),  // evicted: `a` served group 7 before
            sample(5.0, 7, "c", 100, 20), // moved: `c` never did
            sample(7.0, 7, "c", 100, 90), // a hit: its 10 uncached tokens are its own
            Sample {
                group: None,
                ..sample(8.0, 0, "a", 50, 0) // no group: own
            },
            Sample {
                ok: false,
                ..sample(9.0, 7, "d", 100, 0) // failed: not counted
            },
        ];
        // Taken by start time whatever the order they come in.
        let mut shuffled = samples.to_vec();
        shuffled.reverse();
        let l = classify(&shuffled);
        assert_eq!((l.prompt_tokens, l.cached_tokens), (550, 120));
        let lost: Vec<(Cause, u64)> = l.lost.iter().map(|(&c, &n)| (c, n)).collect();
        assert_eq!(
            lost,
            [
                (Cause::First, 100),
                (Cause::InFlight, 90),
                (Cause::Evicted, 100),
                (Cause::Moved, 80),
                (Cause::Own, 60),
            ]
        );
        assert_eq!(l.misses.values().sum::<u32>(), 4);
        assert!((l.lost_percent(Cause::Moved) - 100.0 * 80.0 / 550.0).abs() < 1e-9);
        assert!((l.hit_percent() - 100.0 * 120.0 / 550.0).abs() < 1e-9);
    }

    #[test]
    fn the_table_has_a_row_per_router_with_means_over_its_runs() {
        let line = |router: &str, rep, s| SampleLine {
            router: router.into(),
            workload: "multi-tenant".into(),
            rep,
            sample: s,
        };
        let lines = [
            line("x", 1, sample(0.0, 1, "a", 100, 0)),
            line("x", 1, sample(2.0, 1, "a", 100, 100)),
            line("x", 2, sample(0.0, 1, "a", 100, 50)),
            line("x", 2, sample(2.0, 1, "a", 100, 100)),
            line("y", 1, sample(0.0, 1, "a", 100, 100)),
        ];
        let md = markdown(&lines);
        assert!(md.contains("### multi-tenant"), "{md}");
        // x: run 1 50% hit, 50% lost to its first request; run 2 75% hit, 25% own.
        assert!(
            md.contains(
                "| x | 2 | 62.5% | 25.00 | 0.00 | 0.00 | 0.00 | 12.50 | 0.5 / 0.0 / 0.0 / 0.0 |"
            ),
            "{md}"
        );
        assert!(md.contains("| y | 1 | 100.0% |"), "{md}");
    }

    #[test]
    fn a_line_that_does_not_parse_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite-samples.jsonl");
        std::fs::write(&path, "{\"router\":\"x\"}\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
