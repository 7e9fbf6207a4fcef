//! `picker:`, prefix-picker's own knobs (strict: unknown keys are errors), and the checks of
//! its numbers; `picker.loadShedding`, validated into [`SaturationLimits`].

use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;

use super::ConfigError;
use super::affinity::AffinitySection;
use crate::debug_access::DebugConfig;
use crate::pod_metrics::names::EngineMetricNames;
use crate::scheduler::saturation::SaturationLimits;
use crate::sessions::SessionsConfig;
use crate::tls::TlsConfig;

/// prefix-picker's own knobs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerConfig {
    pub seed: u64,
    pub max_endpoints: usize,
    pub allow_test_endpoint_selection: bool,
    /// Sets `x-prefix-picker-decision` on the response (pod, reason, tokens, time queued,
    /// request id) where the picker sees the response headers; off by default.
    pub decision_header: bool,
    pub max_body_bytes: usize,
    pub response_timeout_seconds: u64,
    /// Engine metrics scrape period (0 disables scraping).
    pub scrape_interval_seconds: f64,
    pub scrape_timeout_seconds: f64,
    pub scrape_concurrency: usize,
    /// Engine metric names per signal (GIE's metric specs); unset: the built-in names.
    pub engine_metrics: EngineMetricNames,
    /// On SIGTERM: seconds reported not-ready before streams stop being accepted.
    pub shutdown_delay_seconds: f64,
    /// On SIGTERM: seconds open streams get to finish.
    pub shutdown_grace_seconds: f64,
    /// TLS on the gRPC port.
    pub tls: TlsConfig,
    /// The admin listener's `/debug/*` routes: off unless enabled (see [`crate::debug_access`]).
    pub debug: DebugConfig,
    /// The affinity mode (`picker.affinity`); absent: Kthena's scheduler, exactly.
    pub affinity: Option<AffinitySection>,
    /// Session affinity (`picker.sessions`, see [`crate::sessions`]); off by default.
    pub sessions: SessionsConfig,
    /// Load shedding (`picker.loadShedding`); absent: never shed.
    #[serde(deserialize_with = "load_shedding")]
    pub load_shedding: Option<LoadSheddingSection>,
    /// KV-cache events (`picker.kvEvents`, [`crate::engine_events`]).
    pub kv_events: crate::engine_events::KvEventsSection,
    /// Engine tokens of prompts (`picker.tokenizer`, [`crate::tokenizer::heads`]); absent:
    /// pods with events are matched by the estimate.
    pub tokenizer: Option<crate::tokenizer::heads::TokenizerSection>,
    /// Flow control (`picker.flowControl`, [`crate::flow_control`]): on with the affinity mode unless `enabled: false`.
    pub flow_control: crate::flow_control::FlowControlConfig,
}

/// `picker.loadShedding`, its errors naming the key (`loadShedding.queueDepth: invalid type`).
fn load_shedding<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<LoadSheddingSection>, D::Error> {
    use serde::de::Error;
    let value = Yaml::deserialize(d)?;
    if value.is_null() {
        return Ok(None);
    }
    serde_path_to_error::deserialize(value)
        .map(Some)
        .map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                D::Error::custom(format!("loadShedding: {inner}"))
            } else {
                D::Error::custom(format!("loadShedding.{path}: {inner}"))
            }
        })
}

/// `picker.loadShedding`, as written (see [`SaturationLimits`] and docs/routing.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LoadSheddingSection {
    pub enabled: bool,
    pub queue_depth: u32,
    pub kv_cache_utilization: f64,
    pub max_in_flight_per_pod: Option<u32>,
    /// Unset: three scrape intervals.
    pub metrics_staleness_seconds: Option<f64>,
    pub retry_after_seconds: u32,
}

impl Default for LoadSheddingSection {
    fn default() -> Self {
        let d = SaturationLimits::default();
        LoadSheddingSection {
            enabled: true,
            queue_depth: d.queue_depth,
            kv_cache_utilization: d.kv_cache_utilization,
            max_in_flight_per_pod: d.max_inflight,
            metrics_staleness_seconds: None,
            retry_after_seconds: 1,
        }
    }
}

impl LoadSheddingSection {
    /// The validated limits, `None` when `enabled: false`; errors name the key and value.
    /// `scrape_interval` (seconds, 0 = off) sizes the default staleness bound.
    pub fn validate(&self, scrape_interval: f64) -> Result<Option<SaturationLimits>, ConfigError> {
        let bad = |key: &str, value: String, want: &str| {
            Err(ConfigError::Picker(format!(
                "loadShedding.{key} must be {want}, got {value}"
            )))
        };
        if !self.enabled {
            return Ok(None);
        }
        if !(0.0..=1.0).contains(&self.kv_cache_utilization) {
            return bad(
                "kvCacheUtilization",
                self.kv_cache_utilization.to_string(),
                "in 0..=1",
            );
        }
        if self.max_in_flight_per_pod == Some(0) {
            return bad("maxInFlightPerPod", "0".into(), "> 0 (or unset)");
        }
        if !(1..=3600).contains(&self.retry_after_seconds) {
            return bad(
                "retryAfterSeconds",
                self.retry_after_seconds.to_string(),
                "in 1..=3600",
            );
        }
        let staleness = match self.metrics_staleness_seconds {
            Some(s) if !(s.is_finite() && s > 0.0 && s <= 86_400.0) => {
                return bad(
                    "metricsStalenessSeconds",
                    s.to_string(),
                    "a number of seconds in (0, 86400]",
                );
            }
            Some(s) if s < scrape_interval => {
                return bad(
                    "metricsStalenessSeconds",
                    s.to_string(),
                    &format!(
                        "at least scrapeIntervalSeconds ({scrape_interval}), or every pod's engine metrics go stale between scrapes"
                    ),
                );
            }
            Some(s) => s,
            None if scrape_interval > 0.0 => 3.0 * scrape_interval,
            None => 3.0,
        };
        Ok(Some(SaturationLimits {
            queue_depth: self.queue_depth,
            kv_cache_utilization: self.kv_cache_utilization,
            max_inflight: self.max_in_flight_per_pod,
            staleness: Duration::try_from_secs_f64(staleness).unwrap_or(Duration::MAX),
        }))
    }
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            seed: 0,
            max_endpoints: 5,
            allow_test_endpoint_selection: false,
            decision_header: false,
            max_body_bytes: 16 << 20,
            response_timeout_seconds: 600,
            scrape_interval_seconds: 1.0,
            scrape_timeout_seconds: 0.5,
            scrape_concurrency: 16,
            engine_metrics: EngineMetricNames::default(),
            shutdown_delay_seconds: 0.0,
            shutdown_grace_seconds: 30.0,
            tls: TlsConfig::default(),
            debug: DebugConfig::default(),
            affinity: None,
            sessions: SessionsConfig::default(),
            load_shedding: None,
            kv_events: crate::engine_events::KvEventsSection::default(),
            tokenizer: None,
            flow_control: crate::flow_control::FlowControlConfig::default(),
        }
    }
}

/// The warning for load shedding that can never shed.
pub const NOTHING_TO_SHED: &str = "picker.loadShedding never sheds: engine scraping is off (scrapeIntervalSeconds: 0) and maxInFlightPerPod is unset";

/// The longest duration any `...Seconds` key of the picker takes: a day.
pub const MAX_SECONDS: f64 = 86_400.0;
/// The shortest scrape interval other than 0 (off).
const MIN_SCRAPE_INTERVAL: f64 = 0.001;

impl PickerConfig {
    /// The numbers no mode may have: out of range or not finite; one error each.
    pub(super) fn check_numbers(&self, errors: &mut Vec<ConfigError>) {
        if !(1..=5).contains(&self.max_endpoints) {
            errors.push(ConfigError::Picker(format!(
                "maxEndpoints must be between 1 and 5, got {}",
                self.max_endpoints
            )));
        }
        // Up to a day, so every duration fits a timer; a scrape interval of 0 is off, under a
        // millisecond it would be a zero-length period.
        let within = |v: f64, min: f64| v.is_finite() && (min..=MAX_SECONDS).contains(&v);
        let interval_ok = self.scrape_interval_seconds == 0.0
            || within(self.scrape_interval_seconds, MIN_SCRAPE_INTERVAL);
        let timeout_ok =
            self.scrape_timeout_seconds > 0.0 && within(self.scrape_timeout_seconds, 0.0);
        let shutdown_ok = [self.shutdown_delay_seconds, self.shutdown_grace_seconds]
            .iter()
            .all(|v| within(*v, 0.0));
        if !shutdown_ok {
            errors.push(ConfigError::Picker(format!(
                "shutdownDelaySeconds and shutdownGraceSeconds must be between 0 and {MAX_SECONDS}, got {} and {}",
                self.shutdown_delay_seconds, self.shutdown_grace_seconds
            )));
        }
        if !interval_ok || !timeout_ok {
            errors.push(ConfigError::Picker(format!(
                "scrapeIntervalSeconds must be 0 (off) or between {MIN_SCRAPE_INTERVAL} and {MAX_SECONDS}, and scrapeTimeoutSeconds > 0 and at most {MAX_SECONDS}, got {} and {}",
                self.scrape_interval_seconds, self.scrape_timeout_seconds
            )));
        }
        if self.response_timeout_seconds > MAX_SECONDS as u64 {
            errors.push(ConfigError::Picker(format!(
                "responseTimeoutSeconds must be at most {MAX_SECONDS}, got {}",
                self.response_timeout_seconds
            )));
        }
        if self.max_body_bytes == 0 {
            errors.push(ConfigError::Picker("maxBodyBytes must be > 0".into()));
        }
    }

    /// The TLS, debug and sessions sections' problems, one error each.
    pub(super) fn check_sections(&self, errors: &mut Vec<ConfigError>) {
        let tls = self.tls.validate().into_iter().map(|e| e.to_string());
        let debug = self.debug.validate().into_iter().map(|e| e.to_string());
        let sessions = self.sessions.validate().into_iter().map(|e| e.to_string());
        errors.extend(tls.chain(debug).chain(sessions).map(ConfigError::Picker));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(picker: &PickerConfig) -> Vec<String> {
        let mut errors = Vec::new();
        picker.check_numbers(&mut errors);
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_defaults_pass_and_each_bad_number_is_named_with_its_value() {
        assert!(problems(&PickerConfig::default()).is_empty());
        let bad = PickerConfig {
            max_endpoints: 6,
            scrape_timeout_seconds: 0.0,
            shutdown_grace_seconds: f64::NAN,
            max_body_bytes: 0,
            ..PickerConfig::default()
        };
        assert_eq!(
            problems(&bad),
            [
                "picker: maxEndpoints must be between 1 and 5, got 6",
                "picker: shutdownDelaySeconds and shutdownGraceSeconds must be between 0 and 86400, got 0 and NaN",
                "picker: scrapeIntervalSeconds must be 0 (off) or between 0.001 and 86400, and scrapeTimeoutSeconds > 0 and at most 86400, got 1 and 0",
                "picker: maxBodyBytes must be > 0",
            ]
        );
    }

    #[test]
    fn durations_past_a_timer_or_under_a_tick_are_refused_not_panicked_on() {
        // Each once passed and then panicked: `Duration::from_secs_f64(1e20)` at start-up, a
        // zero-length scrape period in tokio's `interval`, `Instant::now() + ttl` per request.
        let bad = PickerConfig {
            shutdown_delay_seconds: 1e20,
            scrape_interval_seconds: 1e-10,
            response_timeout_seconds: u64::MAX,
            ..PickerConfig::default()
        };
        assert_eq!(
            problems(&bad),
            [
                "picker: shutdownDelaySeconds and shutdownGraceSeconds must be between 0 and 86400, got 100000000000000000000 and 30",
                "picker: scrapeIntervalSeconds must be 0 (off) or between 0.001 and 86400, and scrapeTimeoutSeconds > 0 and at most 86400, got 0.0000000001 and 0.5",
                "picker: responseTimeoutSeconds must be at most 86400, got 18446744073709551615",
            ]
        );
        let off = PickerConfig {
            scrape_interval_seconds: 0.0,
            shutdown_grace_seconds: MAX_SECONDS,
            response_timeout_seconds: MAX_SECONDS as u64,
            ..PickerConfig::default()
        };
        assert!(problems(&off).is_empty());
    }
}
