//! `picker.affinity` as written: the keys a deployment sets, the switches the ablation measured,
//! and everything else under `experimental:` (docs/routing.md "What to tune").
//!
//! User-facing keys are the ones a deployment must size for its engines and traffic
//! (`podCapacity`, `maxQueue`, `maxPromptBytes`, `bytesPerToken`, `engineTokens`) and the
//! switches whose removal moved a result beyond the run-to-run noise in the ablation
//! (benches/RESULTS.md, 2026-12-05): `tentative` (bursts and tenants together), `loadGate`
//! (agent sessions spread), `longPrompts` (9 points on agent sessions), `latencyModel` (the busy
//! workloads) and `shareHeadroom` (the share gate: p99 on busy-tenants and ramp). The rest were
//! sweep settings whose defaults no run has improved on: they sit under `experimental:`, and
//! their old top-level spellings still load, with a warning, for one release.

use serde::Deserialize;

use super::ConfigError;
use crate::scheduler::affinity::AffinityConfig;
use crate::scheduler::latency::{LatencySignal, Signals};

/// `picker.affinity`, as written (see [`AffinityConfig`] and docs/routing.md for each key).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AffinitySection {
    pub enabled: bool,
    pub tentative: bool,
    pub load_gate: bool,
    pub latency_model: bool,
    pub long_prompts: bool,
    pub share_headroom: f64,
    pub pod_capacity: u32,
    pub max_queue: u32,
    pub max_prompt_bytes: usize,
    pub bytes_per_token: u32,
    pub engine_tokens: u64,
    pub experimental: ExperimentalAffinity,
    // The experimental keys' old top-level spellings (deprecated, loaded for one release).
    consolidate_ties: Option<bool>,
    balance_new: Option<bool>,
    place_by_churn: Option<bool>,
    churn_slack: Option<f64>,
    spill_hot_only: Option<bool>,
    spill_loss: Option<f64>,
    share_window: Option<u32>,
    tie_load_slack: Option<u32>,
    tentative_min_ratio: Option<f64>,
    block_bytes: Option<usize>,
    engine_budget: Option<bool>,
    latency_signals: Option<Vec<String>>,
}

/// `picker.affinity.experimental`: settings the sweeps tried and the defaults won; kept
/// reachable for experiments (the suite's ablation rows), not for tuning a deployment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ExperimentalAffinity {
    pub consolidate_ties: bool,
    pub balance_new: bool,
    pub place_by_churn: bool,
    pub churn_slack: f64,
    pub spill_hot_only: bool,
    pub share_busy: f64,
    pub share_pressure: f64,
    pub spill_loss: f64,
    pub share_window: u32,
    pub tie_load_slack: u32,
    pub tentative_min_ratio: f64,
    pub block_bytes: usize,
    pub engine_budget: bool,
    pub latency_signals: Vec<String>,
}

impl Default for ExperimentalAffinity {
    fn default() -> Self {
        let d = AffinityConfig::DEFAULT;
        ExperimentalAffinity {
            consolidate_ties: d.consolidate_ties,
            balance_new: d.balance_new,
            place_by_churn: d.place_by_churn,
            churn_slack: d.churn_slack,
            spill_hot_only: d.spill_hot_only,
            share_busy: d.share_busy,
            share_pressure: d.share_pressure,
            spill_loss: d.spill_loss,
            share_window: d.share_window,
            tie_load_slack: d.tie_load_slack,
            tentative_min_ratio: d.tentative_min_ratio,
            block_bytes: d.block_bytes,
            engine_budget: d.engine_budget,
            latency_signals: LatencySignal::ALL
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
        }
    }
}

impl Default for AffinitySection {
    fn default() -> Self {
        let d = AffinityConfig::DEFAULT;
        AffinitySection {
            enabled: true,
            tentative: d.tentative,
            load_gate: d.load_gate,
            latency_model: d.latency_model,
            long_prompts: d.long_prompts,
            share_headroom: d.share_headroom,
            pod_capacity: d.pod_capacity,
            max_queue: d.max_queue,
            max_prompt_bytes: d.max_prompt_bytes,
            bytes_per_token: d.bytes_per_token,
            engine_tokens: d.engine_tokens,
            experimental: ExperimentalAffinity::default(),
            consolidate_ties: None,
            balance_new: None,
            place_by_churn: None,
            churn_slack: None,
            spill_hot_only: None,
            spill_loss: None,
            share_window: None,
            tie_load_slack: None,
            tentative_min_ratio: None,
            block_bytes: None,
            engine_budget: None,
            latency_signals: None,
        }
    }
}

/// The validated section: the mode (`None` when `enabled: false`) and a warning per deprecated
/// key it used.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidAffinity {
    pub mode: Option<AffinityConfig>,
    pub warnings: Vec<String>,
}

impl AffinitySection {
    /// `experimental`, with the deprecated top-level spellings moved in (one warning each; a key
    /// set in both places is an error naming it).
    fn experimental(&self) -> Result<(ExperimentalAffinity, Vec<String>), ConfigError> {
        let mut e = self.experimental.clone();
        let defaults = ExperimentalAffinity::default();
        let mut warnings = Vec::new();
        macro_rules! moved {
            ($($field:ident: $key:literal),* $(,)?) => {$(
                if let Some(v) = &self.$field {
                    if e.$field != defaults.$field {
                        return Err(ConfigError::Picker(format!(
                            "affinity.{} is set both at the top level (deprecated) and under experimental; keep affinity.experimental.{}",
                            $key, $key
                        )));
                    }
                    e.$field = v.clone();
                    warnings.push(format!(
                        "picker.affinity.{} is deprecated and will stop loading in the next release: it moved to picker.affinity.experimental.{} (docs/routing.md, what to tune)",
                        $key, $key
                    ));
                }
            )*};
        }
        moved!(
            consolidate_ties: "consolidateTies",
            balance_new: "balanceNew",
            place_by_churn: "placeByChurn",
            churn_slack: "churnSlack",
            spill_hot_only: "spillHotOnly",
            spill_loss: "spillLoss",
            share_window: "shareWindow",
            tie_load_slack: "tieLoadSlack",
            tentative_min_ratio: "tentativeMinRatio",
            block_bytes: "blockBytes",
            engine_budget: "engineBudget",
            latency_signals: "latencySignals",
        );
        Ok((e, warnings))
    }

    /// The validated mode and its warnings; errors name the key and value.
    pub fn validate(&self) -> Result<ValidAffinity, ConfigError> {
        let (x, warnings) = self.experimental()?;
        if !self.enabled {
            return Ok(ValidAffinity {
                mode: None,
                warnings,
            });
        }
        self.check_ranges(&x)?;
        let signals = latency_signals(&x.latency_signals)?;
        Ok(ValidAffinity {
            mode: Some(self.mode(&x, signals)),
            warnings,
        })
    }

    /// The numbers' ranges, the first one out of its range the error. A table, because each
    /// check is a key, a test, the value shown and what it must be, in the order reported.
    fn check_ranges(&self, x: &ExperimentalAffinity) -> Result<(), ConfigError> {
        let negative = |v: f64| !(v.is_finite() && v >= 0.0);
        // At most 65536 blocks; a zero blockBytes fails its own row first.
        let too_many_blocks = self
            .max_prompt_bytes
            .checked_div(x.block_bytes)
            .is_none_or(|blocks| blocks > 1 << 16);
        #[rustfmt::skip]
        let rows = [
            ("podCapacity", self.pod_capacity == 0, "0".to_string(), "> 0"),
            ("shareHeadroom", negative(self.share_headroom), self.share_headroom.to_string(), "a number >= 0"),
            ("experimental.spillLoss", negative(x.spill_loss), x.spill_loss.to_string(), "a number >= 0"),
            ("experimental.shareBusy", !(0.0..=1.0).contains(&x.share_busy), x.share_busy.to_string(), "in 0..=1"),
            ("experimental.sharePressure", negative(x.share_pressure), x.share_pressure.to_string(), "a number >= 0"),
            ("experimental.tentativeMinRatio", !(0.0..=1.0).contains(&x.tentative_min_ratio), x.tentative_min_ratio.to_string(), "in 0..=1"),
            ("experimental.shareWindow", x.share_window == 0, "0".to_string(), "> 0"),
            ("experimental.blockBytes", !(16..=1 << 20).contains(&x.block_bytes), x.block_bytes.to_string(), "in 16..=1048576"),
            ("maxPromptBytes", self.max_prompt_bytes < x.block_bytes || too_many_blocks, self.max_prompt_bytes.to_string(), "at least experimental.blockBytes and at most 65536 blocks"),
            ("bytesPerToken", self.bytes_per_token == 0, "0".to_string(), "> 0"),
            ("experimental.churnSlack", negative(x.churn_slack), x.churn_slack.to_string(), "a number >= 0"),
        ];
        match rows.into_iter().find(|(_, bad, _, _)| *bad) {
            Some((key, _, value, want)) => Err(ConfigError::Picker(format!(
                "affinity.{key} must be {want}, got {value}"
            ))),
            None => Ok(()),
        }
    }

    /// The mode the checked section and its experimental settings describe.
    fn mode(&self, x: &ExperimentalAffinity, signals: Vec<LatencySignal>) -> AffinityConfig {
        AffinityConfig {
            tentative: self.tentative,
            consolidate_ties: x.consolidate_ties,
            load_gate: self.load_gate,
            pod_capacity: self.pod_capacity,
            max_queue: self.max_queue,
            share_headroom: self.share_headroom,
            share_window: x.share_window,
            tie_load_slack: x.tie_load_slack,
            spill_loss: x.spill_loss,
            tentative_min_ratio: x.tentative_min_ratio,
            long_prompts: self.long_prompts,
            block_bytes: x.block_bytes,
            max_prompt_bytes: self.max_prompt_bytes,
            engine_budget: x.engine_budget,
            bytes_per_token: self.bytes_per_token,
            engine_tokens: self.engine_tokens,
            balance_new: x.balance_new,
            spill_hot_only: x.spill_hot_only,
            share_busy: x.share_busy,
            share_pressure: x.share_pressure,
            place_by_churn: x.place_by_churn,
            churn_slack: x.churn_slack,
            latency_model: self.latency_model,
            latency_signals: Signals::of(signals),
        }
    }
}

/// `experimental.latencySignals` by name; the first unknown name is the error.
fn latency_signals(names: &[String]) -> Result<Vec<LatencySignal>, ConfigError> {
    names
        .iter()
        .map(|name| {
            LatencySignal::parse(name).ok_or_else(|| {
                ConfigError::Picker(format!(
                    "affinity.experimental.latencySignals must be a list of inflight, engineQueue, pace, prefillFit, got {name:?}"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(yaml: &str) -> AffinitySection {
        serde_yaml_ng::from_str(yaml).expect("parses")
    }

    #[test]
    fn an_empty_section_is_the_default_mode() {
        let valid = section("{}").validate().expect("valid");
        assert_eq!(valid.mode, Some(AffinityConfig::DEFAULT));
        assert!(valid.warnings.is_empty());
    }

    #[test]
    fn an_experimental_key_loads_under_experimental() {
        let valid = section("{experimental: {consolidateTies: false, shareWindow: 8}}")
            .validate()
            .expect("valid");
        let mode = valid.mode.expect("on");
        assert!(!mode.consolidate_ties);
        assert_eq!(mode.share_window, 8);
        assert!(valid.warnings.is_empty());
    }

    #[test]
    fn a_deprecated_top_level_key_still_loads_with_a_warning_naming_its_new_place() {
        let valid = section("{placeByChurn: false, blockBytes: 64}")
            .validate()
            .expect("valid");
        let mode = valid.mode.expect("on");
        assert!(!mode.place_by_churn);
        assert_eq!(mode.block_bytes, 64);
        assert_eq!(valid.warnings.len(), 2);
        assert!(
            valid.warnings[0].contains("picker.affinity.experimental.placeByChurn"),
            "{:?}",
            valid.warnings
        );
    }

    #[test]
    fn a_key_set_in_both_places_is_an_error_naming_it() {
        let err = section("{spillLoss: 0.5, experimental: {spillLoss: 0.1}}")
            .validate()
            .expect_err("ambiguous");
        assert!(err.to_string().contains("spillLoss"), "{err}");
    }

    #[test]
    fn a_bad_experimental_value_is_named_with_its_path() {
        let err = section("{experimental: {tentativeMinRatio: 2}}")
            .validate()
            .expect_err("out of range");
        assert!(
            err.to_string().contains("experimental.tentativeMinRatio"),
            "{err}"
        );
    }

    #[test]
    fn the_first_check_out_of_range_is_the_error() {
        let err = |yaml: &str| section(yaml).validate().expect_err("invalid").to_string();
        assert_eq!(
            err("{podCapacity: 0, bytesPerToken: 0}"),
            "picker: affinity.podCapacity must be > 0, got 0"
        );
        // A zero blockBytes is reported as such, not divided by.
        assert_eq!(
            err("{experimental: {blockBytes: 0}}"),
            "picker: affinity.experimental.blockBytes must be in 16..=1048576, got 0"
        );
        assert_eq!(
            err("{maxPromptBytes: 8000000, experimental: {blockBytes: 64}}"),
            "picker: affinity.maxPromptBytes must be at least experimental.blockBytes and at most 65536 blocks, got 8000000"
        );
        assert_eq!(
            err("{experimental: {latencySignals: [pace, nope, other]}}"),
            "picker: affinity.experimental.latencySignals must be a list of inflight, engineQueue, pace, prefillFit, got \"nope\""
        );
    }

    #[test]
    fn an_unknown_key_is_refused() {
        assert!(serde_yaml_ng::from_str::<AffinitySection>("{experimental: {nope: 1}}").is_err());
        assert!(serde_yaml_ng::from_str::<AffinitySection>("{nope: 1}").is_err());
    }
}
