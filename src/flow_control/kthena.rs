//! Kthena's fairness settings onto flow control. Kthena's router reads them from its
//! environment (its Helm chart sets them on the router Deployment, `kthenaRouter.fairness`);
//! in Kthena's mode (a routerConfiguration without `picker.affinity`) the picker reads the same
//! variables, and `ENABLE_FAIRNESS_SCHEDULING=true` turns `picker.flowControl` on, mapped:
//!
//! | Kthena | flow control |
//! |---|---|
//! | the user (`sub` of the `Authorization: Bearer` JWT, when `auth.jwksUri` is set), per model | the flow `<user>@<model>`; without a user, `x-gateway-inference-fairness-id`, else `default` |
//! | `FAIRNESS_INPUT_TOKEN_WEIGHT` (1), `FAIRNESS_OUTPUT_TOKEN_WEIGHT` (2), `FAIRNESS_PRIORITY_TOKEN_WEIGHT` (1), `FAIRNESS_PRIORITY_REQUEST_NUM_WEIGHT` (0) | a dispatch's charge: token weight x (input weight x prompt tokens + output weight x `expectedOutputTokens`) + request weight |
//! | `FAIRNESS_WINDOW_SIZE` (5m; 1m to 1h) | `halfLifeSeconds` = window x ln 2 (a steady user's decayed sum equals its windowed sum) |
//! | `FAIRNESS_QUEUE_TIMEOUT` (60s) | `requestTtlSeconds` (answered 429, where Kthena answers 504) |
//! | `FAIRNESS_MAX_CONCURRENT` (0) | when > 0, a model has room while this picker's requests in flight on its pods are under it |
//! | `FAIRNESS_MAX_QPS` (100, while `FAIRNESS_MAX_CONCURRENT` is 0) | not honoured (warned): requests queue only while no pod has room |
//!
//! Unset variables take Kthena's defaults (in brackets); an invalid value is an error naming the
//! variable (Kthena warns and takes the default). The environment is a function, so that tests
//! never touch the process's. docs/kthena.md says what is exact and what is not.

use base64::Engine as _;
use thiserror::Error;

use super::{FlowControlConfig, flow_id};

/// Turns Kthena's fairness queue on (Go's `strconv.ParseBool`).
pub const ENABLE: &str = "ENABLE_FAIRNESS_SCHEDULING";
/// Kthena's session-boost queue: exclusive with fairness; not implemented here.
pub const SESSION_BOOST: &str = "ENABLE_SESSION_BOOST";
const WINDOW: &str = "FAIRNESS_WINDOW_SIZE";
const INPUT_WEIGHT: &str = "FAIRNESS_INPUT_TOKEN_WEIGHT";
const OUTPUT_WEIGHT: &str = "FAIRNESS_OUTPUT_TOKEN_WEIGHT";
const TOKEN_WEIGHT: &str = "FAIRNESS_PRIORITY_TOKEN_WEIGHT";
const REQUEST_WEIGHT: &str = "FAIRNESS_PRIORITY_REQUEST_NUM_WEIGHT";
const QUEUE_TIMEOUT: &str = "FAIRNESS_QUEUE_TIMEOUT";
const MAX_CONCURRENT: &str = "FAIRNESS_MAX_CONCURRENT";
const MAX_QPS: &str = "FAIRNESS_MAX_QPS";
const REFRESH_RETRIES: &str = "FAIRNESS_PRIORITY_REFRESH_RETRIES";
const REBUILD_THRESHOLD: &str = "FAIRNESS_REBUILD_THRESHOLD";
/// Kthena's open PR #1399 (`window` or `vtc`); its release reads no such variable.
const MODE: &str = "FAIRNESS_MODE";

/// A Kthena fairness variable that cannot be read.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum KthenaFairnessError {
    #[error("{var}={value:?}: {expected}")]
    Invalid {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "{ENABLE} and {SESSION_BOOST} are both true: they are exclusive, Kthena's router refuses to start with both"
    )]
    BothQueues,
}

/// What flow control does differently when Kthena's fairness settings turned it on (carried by
/// [`FlowControlConfig::kthena`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KthenaFlows {
    /// The user is the `sub` claim of the request's `Authorization: Bearer` JWT (Kthena's
    /// identity while its `auth.jwksUri` is set).
    pub jwt_user: bool,
    /// A prompt token's charge (the output's is `outputWeight`).
    pub input_weight: f64,
    /// Every dispatch's charge besides its tokens.
    pub request_weight: f64,
    /// A model has room while the requests in flight on its pods are under this.
    pub max_in_flight_per_model: Option<u32>,
}

impl KthenaFlows {
    /// The flow of a request for `model`: Kthena's user of it (the JWT's subject, else the
    /// fairness header, else `default`), per model as Kthena keeps usage.
    pub fn flow(&self, authorization: Option<&str>, header: Option<&str>, model: &str) -> String {
        let subject = authorization
            .filter(|_| self.jwt_user)
            .and_then(jwt_subject)
            .filter(|s| !s.trim().is_empty());
        let user = flow_id(subject.as_deref().or(header));
        format!("{user}@{model}")
    }
}

/// Kthena's fairness settings, read ([`from_env`]); [`KthenaFairness::apply`] sets them.
#[derive(Debug, Clone, PartialEq)]
pub struct KthenaFairness {
    pub flows: KthenaFlows,
    pub output_weight: f64,
    pub half_life_seconds: f64,
    pub ttl_seconds: f64,
    /// What does not map exactly, each naming its variable.
    pub warnings: Vec<String>,
}

impl KthenaFairness {
    /// Sets `fc`'s mapped keys; `enabled` unset turns the queue on.
    pub fn apply(self, fc: &mut FlowControlConfig) -> Vec<String> {
        fc.request_ttl_seconds = self.ttl_seconds;
        fc.half_life_seconds = self.half_life_seconds;
        fc.output_weight = self.output_weight;
        fc.kthena = Some(self.flows);
        let mut warnings = self.warnings;
        if fc.enabled == Some(false) {
            warnings.push(format!(
                "{ENABLE}=true: picker.flowControl.enabled: false keeps the queue off"
            ));
        }
        warnings
    }
}

/// Go's `strconv.ParseBool`.
fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Reads Kthena's fairness settings from `env`: `None` when `ENABLE_FAIRNESS_SCHEDULING` is
/// unset or false (nothing else is read then). `jwt_user`: the config's `auth.jwksUri` is set.
pub fn from_env(
    env: &dyn Fn(&str) -> Option<String>,
    jwt_user: bool,
) -> Result<Option<KthenaFairness>, KthenaFairnessError> {
    let Some(enable) = env(ENABLE) else {
        return Ok(None);
    };
    let invalid = |var, value: &str, expected| KthenaFairnessError::Invalid {
        var,
        value: value.to_string(),
        expected,
    };
    let enabled = go_bool(&enable).ok_or_else(|| {
        invalid(
            ENABLE,
            &enable,
            "not a boolean (Go's strconv.ParseBool: true, false, 1, 0, t, f)",
        )
    })?;
    if !enabled {
        return Ok(None);
    }
    // Kthena reads an invalid value as false.
    if env(SESSION_BOOST).and_then(|v| go_bool(&v)) == Some(true) {
        return Err(KthenaFairnessError::BothQueues);
    }
    let weight = |var: &'static str, default: f64| -> Result<f64, KthenaFairnessError> {
        env(var).map_or(Ok(default), |v| {
            v.parse::<f64>()
                .ok()
                .filter(|w| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| invalid(var, &v, "must be a finite number >= 0"))
        })
    };
    let input = weight(INPUT_WEIGHT, 1.0)?;
    let output = weight(OUTPUT_WEIGHT, 2.0)?;
    let token = weight(TOKEN_WEIGHT, 1.0)?;
    let per_request = weight(REQUEST_WEIGHT, 0.0)?;
    let window = match env(WINDOW) {
        None => 300.0,
        Some(v) => super::go_duration::seconds(&v)
            .filter(|s| (60.0..=3600.0).contains(s))
            .ok_or_else(|| {
                invalid(
                    WINDOW,
                    &v,
                    "must be a Go duration from 1m to 1h (as Kthena's)",
                )
            })?,
    };
    let ttl = match env(QUEUE_TIMEOUT) {
        None => 60.0,
        Some(v) => super::go_duration::seconds(&v)
            .filter(|s| *s > 0.0)
            .ok_or_else(|| invalid(QUEUE_TIMEOUT, &v, "must be a Go duration > 0, such as 60s"))?,
    };
    let int = |var: &'static str, min: u32, expected| -> Result<Option<u32>, KthenaFairnessError> {
        env(var)
            .map(|v| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| *n >= min)
                    .ok_or_else(|| invalid(var, &v, expected))
            })
            .transpose()
    };
    let max_concurrent = int(MAX_CONCURRENT, 0, "must be an integer >= 0")?.unwrap_or(0);
    let max_qps = int(MAX_QPS, 1, "must be an integer > 0")?.unwrap_or(100);
    let refresh = int(REFRESH_RETRIES, 0, "must be an integer >= 0")?;
    let rebuild = int(REBUILD_THRESHOLD, 1, "must be an integer > 0")?;

    let half_life = window * std::f64::consts::LN_2;
    let mut warnings = vec![
        format!(
            "{WINDOW} ({window} s): usage decays with flowControl.halfLifeSeconds {half_life:.0} (the window x ln 2), not over a sliding window; tokens are charged when a request leaves the queue, estimated (prompt bytes / 4, expectedOutputTokens for the output), not the response's usage at completion"
        ),
        format!(
            "{QUEUE_TIMEOUT} ({ttl} s): a request queued this long is answered 429 (ttl_expired, retry-after), where Kthena answers 504"
        ),
    ];
    if max_concurrent == 0 {
        warnings.push(format!(
            "{MAX_QPS} ({max_qps}, with {MAX_CONCURRENT} 0): not honoured: Kthena sends every request through its queue at that rate per model; here a request queues only while no pod has room, and leaves when one has (set {MAX_CONCURRENT} for a per-model bound)"
        ));
    }
    let unread: Vec<&str> = [
        (REFRESH_RETRIES, refresh.is_some()),
        (REBUILD_THRESHOLD, rebuild.is_some()),
    ]
    .into_iter()
    .filter_map(|(var, set)| set.then_some(var))
    .collect();
    if !unread.is_empty() {
        warnings.push(format!(
            "{}: not read: flows are ordered by their current service at every dispatch (as if every priority were refreshed)",
            unread.join(", ")
        ));
    }
    if let Some(mode) = env(MODE).filter(|m| m != "window") {
        warnings.push(format!(
            "{MODE}={mode:?}: not read: Kthena's release has only the window mode (vtc is its open PR #1399)"
        ));
    }
    Ok(Some(KthenaFairness {
        flows: KthenaFlows {
            jwt_user,
            input_weight: token * input,
            request_weight: per_request,
            max_in_flight_per_model: (max_concurrent > 0).then_some(max_concurrent),
        },
        output_weight: token * output,
        half_life_seconds: half_life,
        ttl_seconds: ttl,
        warnings,
    }))
}

/// The warning for a fairness or session-boost switch this mode does not read: `kthena_mode`
/// false (the affinity mode, an `EndpointPickerConfig`: `picker.flowControl` configures the
/// queue), or Kthena's session boost, which is not implemented.
pub fn unread_switches(env: &dyn Fn(&str) -> Option<String>, kthena_mode: bool) -> Vec<String> {
    let on = |var| env(var).and_then(|v| go_bool(&v)) == Some(true);
    let mut warnings = Vec::new();
    if !kthena_mode && on(ENABLE) {
        warnings.push(format!(
            "{ENABLE}=true: read in Kthena's mode only (a routerConfiguration without picker.affinity); here picker.flowControl configures the queue"
        ));
    }
    if on(SESSION_BOOST) && !(kthena_mode && on(ENABLE)) {
        warnings.push(format!(
            "{SESSION_BOOST}=true: ignored: Kthena's session-boost queue is not implemented"
        ));
    }
    warnings
}

/// The `sub` claim of an `Authorization: Bearer <JWT>` value, decoded, not verified (the
/// gateway verifies the token: `auth:` is not implemented, docs/kthena.md). Kthena's
/// extraction: exactly two fields, the scheme `Bearer` in any case.
pub fn jwt_subject(authorization: &str) -> Option<String> {
    let mut fields = authorization.split_ascii_whitespace();
    let (scheme, token) = (fields.next()?, fields.next()?);
    if fields.next().is_some() || !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    #[derive(serde::Deserialize)]
    struct Claims {
        sub: Option<String>,
    }
    serde_json::from_slice::<Claims>(&json).ok()?.sub
}

#[cfg(test)]
mod tests;
