//! The results file of `prefix-bench suite` (`suite.json`): every run, the workloads the suite
//! skipped and why, and the config file the shipped-config rows ran with when it was not the
//! shipped one (`suite --config`).
//!
//! Files written before the skipped workloads were recorded hold the runs alone, as a JSON
//! array; [`SuiteResults::read`] takes both.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::driver::RunResult;
use super::engines::EngineProfile;
use super::report;

/// A workload the suite did not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Its `--workloads` key.
    pub workload: String,
    /// Why, and how to get what it needs.
    pub reason: String,
}

/// A row the suite did not run on a workload (a peer that cannot route its API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedRow {
    /// The workload's `--workloads` key.
    pub workload: String,
    pub row: String,
    pub reason: String,
}

/// What one `suite` wrote.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SuiteResults {
    pub runs: Vec<RunResult>,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Rows left out of a workload they cannot run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_rows: Vec<SkippedRow>,
    /// The shipped-config rows' picker config, when `--config` replaced the shipped one.
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// How the engines scheduled (`--engine-profile`; absent: the default).
    #[serde(default, skip_serializing_if = "EngineProfile::is_default")]
    pub engine_profile: EngineProfile,
    /// How many of a workload's longest requests a `kv-pressure` engine's cache holds
    /// (`--kv-pressure-prompts`; absent: the default profile, or a file from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_pressure_prompts: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OnDisk {
    Suite(SuiteResults),
    Runs(Vec<RunResult>),
}

impl SuiteResults {
    /// Reads a results file: a suite's, or a plain array of runs.
    pub fn read(path: &Path) -> anyhow::Result<SuiteResults> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let on_disk: OnDisk = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a results file", path.display()))?;
        Ok(match on_disk {
            OnDisk::Suite(s) => s,
            OnDisk::Runs(runs) => SuiteResults {
                runs,
                ..SuiteResults::default()
            },
        })
    }

    /// What the tables do not show: the shipped rows' config if not the shipped one, and the
    /// workloads skipped (a markdown list, empty when there is nothing to say).
    pub fn notes(&self) -> String {
        let mut out = String::new();
        if self.engine_profile == EngineProfile::KvPressure {
            let prompts = self
                .kv_pressure_prompts
                .map_or_else(|| "a few".to_string(), |n| n.to_string());
            out.push_str(&format!(
                "- Engines: the `kv-pressure` profile (`model-sim --kv-admission vllm \
                 --chat-template llama3 --tokenizer dense`, a cache of {prompts} of the \
                 workload's longest requests: a request waits until its KV blocks fit, a running \
                 one that needs a block none has free preempts the last started; Llama 3's \
                 template, ~3.2 bytes per token; no file-tokenizer row).\n"
            ));
        }
        if let Some(c) = &self.config {
            out.push_str(&format!(
                "- The shipped-config rows ran with `{}` (`--config`).\n",
                c.display()
            ));
        }
        for s in &self.skipped {
            out.push_str(&format!("- Skipped `{}`: {}\n", s.workload, s.reason));
        }
        for s in &self.skipped_rows {
            out.push_str(&format!(
                "- No `{}` row on `{}`: {}\n",
                s.row, s.workload, s.reason
            ));
        }
        out
    }

    /// The notes, then a table per workload ([`report::markdown`]).
    pub fn markdown(&self) -> String {
        let notes = self.notes();
        let tables = report::markdown(&self.runs);
        if notes.is_empty() {
            tables
        } else {
            format!("{notes}{tables}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(router: &str) -> RunResult {
        RunResult {
            router: router.into(),
            workload: "w".into(),
            hit_rate: 0.5,
            ..RunResult::default()
        }
    }

    #[test]
    fn a_suite_file_round_trips_and_a_plain_array_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let suite = SuiteResults {
            runs: vec![run("a")],
            skipped: vec![Skipped {
                workload: "trace".into(),
                reason: "no file".into(),
            }],
            skipped_rows: vec![SkippedRow {
                workload: "agent-messages".into(),
                row: "vllm-router".into(),
                reason: "no /v1/messages route".into(),
            }],
            config: Some("mine.yaml".into()),
            engine_profile: EngineProfile::Default,
            kv_pressure_prompts: None,
        };
        let path = dir.path().join("suite.json");
        std::fs::write(&path, serde_json::to_string(&suite).unwrap()).unwrap();
        let back = SuiteResults::read(&path).unwrap();
        assert_eq!(back.runs.len(), 1);
        assert_eq!(back.skipped, suite.skipped);
        assert_eq!(back.skipped_rows, suite.skipped_rows);
        assert_eq!(back.config, suite.config);
        let md = back.markdown();
        assert!(
            md.starts_with("- The shipped-config rows ran with `mine.yaml`"),
            "{md}"
        );
        assert!(md.contains("\n- Skipped `trace`: no file\n"), "{md}");
        assert!(
            md.contains("\n- No `vllm-router` row on `agent-messages`: no /v1/messages route\n"),
            "{md}"
        );
        assert!(md.contains("| a | 50.0% |"), "{md}");

        std::fs::write(&path, serde_json::to_string(&vec![run("b")]).unwrap()).unwrap();
        let old = SuiteResults::read(&path).unwrap();
        assert_eq!(old.runs[0].router, "b");
        assert!(old.skipped.is_empty() && old.skipped_rows.is_empty() && old.config.is_none());
        assert!(old.markdown().starts_with("\n**w**"));
    }

    #[test]
    fn a_kv_pressure_suite_says_so_and_a_default_one_writes_no_profile() {
        let suite = SuiteResults {
            runs: vec![run("a")],
            engine_profile: EngineProfile::KvPressure,
            kv_pressure_prompts: Some(2),
            ..SuiteResults::default()
        };
        let json = serde_json::to_string(&suite).unwrap();
        assert!(json.contains(r#""engine_profile":"kv-pressure""#), "{json}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite.json");
        std::fs::write(&path, json).unwrap();
        let back = SuiteResults::read(&path).unwrap();
        assert_eq!(back.engine_profile, EngineProfile::KvPressure);
        assert!(
            back.markdown()
                .starts_with("- Engines: the `kv-pressure` profile")
        );
        assert!(back.markdown().contains("a cache of 2 of the"));
        let default = serde_json::to_string(&SuiteResults::default()).unwrap();
        assert!(!default.contains("engine_profile"), "{default}");
    }

    #[test]
    fn a_file_that_is_not_results_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, "{\"hello\": 1}").unwrap();
        let err = format!("{:#}", SuiteResults::read(&path).unwrap_err());
        assert!(err.contains("x.json"), "{err}");
    }
}
