//! Which engine metric feeds which signal: the built-in names, or one configured spec per signal
//! in GIE's syntax.
//!
//! Built in, tried in order (the first family with a matching series wins): vLLM's current names,
//! SGLang's, then vLLM's previous ones (`gpu_cache_usage_perc`, `time_per_output_token_seconds`).
//! `picker.engineMetrics` (GIE's flags `--total-queued-requests-metric`,
//! `--total-running-requests-metric` and `--kv-cache-usage-percentage-metric` set the first three)
//! replaces a signal's list with one spec: `name` or `name{label=value,...}` (values may be
//! quoted; the whole spec too, as charts render it), matching the series of family `name` that
//! carry every listed label with that value. An empty spec turns the signal off: read as 0 and
//! never reported missing.

use std::fmt;

use serde::Deserialize;
use thiserror::Error;

/// One engine signal a plugin reads (the `signal` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Requests queued (least-request filter and score).
    Waiting,
    /// Requests running (least-request score).
    Running,
    /// KV-cache usage, 0..1 (gpu-usage).
    KvCacheUsage,
    /// Time-to-first-token histogram (least-latency).
    Ttft,
    /// Time-per-output-token histogram (least-latency).
    Tpot,
}

impl Signal {
    pub const ALL: [Signal; 5] = [
        Signal::Waiting,
        Signal::Running,
        Signal::KvCacheUsage,
        Signal::Ttft,
        Signal::Tpot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Waiting => "waiting",
            Signal::Running => "running",
            Signal::KvCacheUsage => "kv_cache_usage",
            Signal::Ttft => "ttft",
            Signal::Tpot => "tpot",
        }
    }

    /// The names tried when none is configured.
    pub fn builtin(self) -> &'static [&'static str] {
        match self {
            Signal::Waiting => &["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
            Signal::Running => &["vllm:num_requests_running", "sglang:num_running_reqs"],
            Signal::KvCacheUsage => &[
                "vllm:kv_cache_usage_perc",
                "sglang:token_usage",
                "vllm:gpu_cache_usage_perc",
            ],
            Signal::Ttft => &[
                "vllm:time_to_first_token_seconds",
                "sglang:time_to_first_token_seconds",
            ],
            Signal::Tpot => &[
                "vllm:inter_token_latency_seconds",
                "sglang:inter_token_latency_seconds",
                "vllm:time_per_output_token_seconds",
                "sglang:time_per_output_token_seconds",
            ],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A set of signals (the ones a scrape did not find).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals(u8);

impl Signals {
    pub fn insert(&mut self, s: Signal) {
        self.0 |= 1 << s.index();
    }

    pub fn contains(self, s: Signal) -> bool {
        self.0 & (1 << s.index()) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Signal> {
        Signal::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// `name` or `name{label=value,...}`: the series of one family carrying some labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSpec {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("metric spec {spec:?}: {reason}")]
pub struct InvalidMetricSpec {
    pub spec: String,
    pub reason: &'static str,
}

/// Strips one pair of surrounding double quotes.
fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

impl MetricSpec {
    /// Parses a non-empty spec.
    pub fn parse(text: &str) -> Result<MetricSpec, InvalidMetricSpec> {
        let error = |reason| InvalidMetricSpec {
            spec: text.to_string(),
            reason,
        };
        let spec = unquote(text.trim()).trim();
        let (name, labels) = match spec.split_once('{') {
            None if spec.contains('}') => return Err(error("'}' without '{'")),
            None => (spec, Vec::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or(error("the label block must end the spec with '}'"))?;
                let labels = body
                    .split(',')
                    .map(str::trim)
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (k, v) = pair
                            .split_once('=')
                            .ok_or(error("labels are written label=value"))?;
                        let (k, v) = (k.trim(), unquote(v.trim()));
                        if k.is_empty() || v.contains(['{', '}', '=']) {
                            return Err(error("labels are written label=value"));
                        }
                        Ok((k.to_string(), v.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if labels.is_empty() {
                    return Err(error("an empty label block"));
                }
                (name.trim(), labels)
            }
        };
        let valid_name = name.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphabetic() || matches!(c, '_' | ':') || i > 0 && c.is_ascii_digit()
        });
        if name.is_empty() || !valid_name {
            return Err(error("not a Prometheus metric name"));
        }
        Ok(MetricSpec {
            name: name.to_string(),
            labels,
        })
    }
}

impl fmt::Display for MetricSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.labels.is_empty() {
            let labels: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            write!(f, "{{{}}}", labels.join(","))?;
        }
        Ok(())
    }
}

/// A configured source for one signal: a spec, or off (an empty string).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum MetricSource {
    Off,
    Spec(MetricSpec),
}

impl MetricSource {
    pub fn parse(text: &str) -> Result<MetricSource, InvalidMetricSpec> {
        if unquote(text.trim()).trim().is_empty() {
            Ok(MetricSource::Off)
        } else {
            MetricSpec::parse(text).map(MetricSource::Spec)
        }
    }
}

impl TryFrom<String> for MetricSource {
    type Error = InvalidMetricSpec;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        MetricSource::parse(&text)
    }
}

/// `picker.engineMetrics`: one source per signal (unset: the built-in names). The first three
/// keys are GIE's flags in camelCase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EngineMetricNames {
    pub total_queued_requests: Option<MetricSource>,
    pub total_running_requests: Option<MetricSource>,
    pub kv_cache_usage_percentage: Option<MetricSource>,
    pub time_to_first_token: Option<MetricSource>,
    pub time_per_output_token: Option<MetricSource>,
}

impl EngineMetricNames {
    fn source(&self, s: Signal) -> Option<&MetricSource> {
        match s {
            Signal::Waiting => self.total_queued_requests.as_ref(),
            Signal::Running => self.total_running_requests.as_ref(),
            Signal::KvCacheUsage => self.kv_cache_usage_percentage.as_ref(),
            Signal::Ttft => self.time_to_first_token.as_ref(),
            Signal::Tpot => self.time_per_output_token.as_ref(),
        }
    }

    /// The specs tried for each signal, in order (none: the signal is off).
    pub fn resolve(&self) -> SignalSpecs {
        SignalSpecs(Signal::ALL.map(|s| {
            match self.source(s) {
                None => s
                    .builtin()
                    .iter()
                    .map(|name| MetricSpec {
                        name: name.to_string(),
                        labels: Vec::new(),
                    })
                    .collect(),
                Some(MetricSource::Off) => Vec::new(),
                Some(MetricSource::Spec(spec)) => vec![spec.clone()],
            }
        }))
    }
}

/// The specs tried for each signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSpecs([Vec<MetricSpec>; 5]);

impl SignalSpecs {
    pub fn get(&self, s: Signal) -> &[MetricSpec] {
        &self.0[s.index()]
    }

    /// How the specs of `s` read in a message: `a, b or c`.
    pub fn describe(&self, s: Signal) -> String {
        let names: Vec<String> = self.get(s).iter().map(ToString::to_string).collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        }
    }
}

impl Default for SignalSpecs {
    fn default() -> Self {
        EngineMetricNames::default().resolve()
    }
}
