//! Flow control (`picker.flowControl`): when no candidate pod can take a request, the picker
//! holds it in a bounded queue and dispatches it, with the pick made then, as soon as a pod
//! can; across tenants fairly and by priority. docs/flow-control.md is the user's guide.
//!
//! ```yaml
//! picker:
//!   flowControl:
//!     enabled: true            # default: on with the affinity mode (not with pdGroup)
//!     maxRequests: 5000        # requests queued, all bands together
//!     maxBytes: 268435456      # their bodies' bytes
//!     requestTtlSeconds: 30    # a request queued this long is refused (429)
//!     retryAfterSeconds: 1     # the refusals' retry-after
//!     halfLifeSeconds: 60      # a flow's service decays by half in this long (start-up only)
//!     outputWeight: 2          # an output token weighs this many input tokens
//!     expectedOutputTokens: 256  # charged at dispatch for a request without max_tokens
//!     maxWaitSeconds: 1        # a pod with a free slot has room while its predicted wait is under this
//!     maxInFlightPerPod: null  # a static slot count (else the latency model's learned concurrency)
//!     roomOnly: false          # dispatch among the pods with room only (else the affinity pick,
//!                              # which may prefer a full pod holding the prefix)
//!     messageTimeoutSeconds: 35  # override_message_timeout sent to Envoy when a request queues
//!     defaultPriority: 0
//!     priorities: {interactive: 10, batch: -1}   # x-gateway-inference-objective -> priority
//! ```
//! An objective's priority is its watched InferenceObjective's
//! (`discovery.kubernetes.inferenceObjectives`, [`crate::discovery::inference_objective`]) when
//! there is one, else its `priorities` entry, else `defaultPriority`.
//!
//! The queue itself ([`queue::FlowQueue`]) is pure; the router holds it
//! (`crate::routing::flow`). A pod *has room* when its requests in flight are under the
//! concurrency its engine runs ([`crate::scheduler::Scheduler::has_room`]); a request queues
//! only when no candidate has room, or when others already queue (arrival order is kept). A
//! queued request whose pick holds more of its prompt than some other candidate waits for that
//! pod (picked when it queues); the others take the first pod with room.
//!
//! In Kthena's mode, Kthena's own fairness settings (`ENABLE_FAIRNESS_SCHEDULING`, `FAIRNESS_*`
//! in the environment) turn the queue on and set its keys ([`kthena`]): flows by Kthena's user
//! per model, Kthena's weights as the charge, a per-model bound on requests in flight.

pub mod go_duration;
pub mod kthena;
pub mod queue;

use std::collections::BTreeMap;

use serde::Deserialize;

pub use crate::metrics::outcomes::{DEFAULT_FLOW, DispatchReason, DropReason};

/// GIE's fairness header, and llm-d's spelling of it: the request's flow.
pub const FAIRNESS_HEADERS: [&str; 2] = [
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-fairness-id",
];
/// GIE's objective header, and llm-d's spelling of it: its priority comes from the watched
/// InferenceObjectives ([`ObjectivePriorities`]), else `priorities`.
pub const OBJECTIVE_HEADERS: [&str; 2] = [
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
];
/// The header naming why the picker refused a request (GIE/llm-d's name).
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
/// Longest fairness id kept (longer ones are cut).
pub const MAX_FLOW_ID_BYTES: usize = 128;

/// `picker.flowControl`, as written (see the module header).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FlowControlConfig {
    /// Unset: on with the affinity mode, without `pdGroup` ([`FlowControlConfig::resolve`]).
    pub enabled: Option<bool>,
    pub max_requests: usize,
    pub max_bytes: usize,
    pub request_ttl_seconds: f64,
    pub retry_after_seconds: u32,
    pub half_life_seconds: f64,
    pub output_weight: f64,
    pub expected_output_tokens: u32,
    pub max_wait_seconds: f64,
    pub max_in_flight_per_pod: Option<u32>,
    /// A dispatched request is picked among the pods with room only (else by the affinity
    /// mode among all candidates, which may prefer a full pod holding its prefix).
    pub room_only: bool,
    pub message_timeout_seconds: f64,
    pub default_priority: i32,
    pub priorities: BTreeMap<String, i32>,
    /// Whether flow control is on, once resolved against the mode (not a key).
    #[serde(skip)]
    pub active: bool,
    /// Set when Kthena's fairness settings turned the queue on (not a key: its environment,
    /// [`kthena`]): flows by Kthena's user per model, its charge, its per-model bound.
    #[serde(skip)]
    pub kthena: Option<kthena::KthenaFlows>,
}

impl Default for FlowControlConfig {
    fn default() -> Self {
        FlowControlConfig {
            enabled: None,
            max_requests: 5000,
            max_bytes: 256 << 20,
            request_ttl_seconds: 30.0,
            retry_after_seconds: 1,
            half_life_seconds: 60.0,
            output_weight: 2.0,
            expected_output_tokens: 256,
            max_wait_seconds: 1.0,
            max_in_flight_per_pod: None,
            room_only: false,
            message_timeout_seconds: 35.0,
            default_priority: 0,
            priorities: BTreeMap::new(),
            active: false,
            kthena: None,
        }
    }
}

impl FlowControlConfig {
    /// Every problem with the section, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut positive = |key: &str, v: f64| {
            if !(v.is_finite() && v > 0.0) {
                errors.push(format!("flowControl.{key} must be a number > 0, got {v}"));
            }
        };
        positive("requestTtlSeconds", self.request_ttl_seconds);
        positive("halfLifeSeconds", self.half_life_seconds);
        if !(self.output_weight.is_finite() && self.output_weight >= 0.0) {
            errors.push(format!(
                "flowControl.outputWeight must be a number >= 0, got {}",
                self.output_weight
            ));
        }
        if !(self.max_wait_seconds.is_finite() && self.max_wait_seconds >= 0.0) {
            errors.push(format!(
                "flowControl.maxWaitSeconds must be a number >= 0, got {}",
                self.max_wait_seconds
            ));
        }
        if !(self.message_timeout_seconds.is_finite() && self.message_timeout_seconds >= 0.0) {
            errors.push(format!(
                "flowControl.messageTimeoutSeconds must be a number >= 0 (0: none sent), got {}",
                self.message_timeout_seconds
            ));
        }
        if self.max_requests == 0 {
            errors.push("flowControl.maxRequests must be > 0, got 0".into());
        }
        if self.max_bytes == 0 {
            errors.push("flowControl.maxBytes must be > 0, got 0".into());
        }
        if self.max_in_flight_per_pod == Some(0) {
            errors.push("flowControl.maxInFlightPerPod must be > 0 (or null), got 0".into());
        }
        errors
    }

    /// A warning when the Envoy override outlives nothing the TTL needs, i.e. when a request
    /// may stay queued longer than Envoy is told to wait for it.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.active
            && self.message_timeout_seconds > 0.0
            && self.message_timeout_seconds < self.request_ttl_seconds
        {
            w.push(format!(
                "flowControl.messageTimeoutSeconds ({}) is under requestTtlSeconds ({}): with a BUFFERED body mode, Envoy answers 504 to a request queued longer than the former",
                self.message_timeout_seconds, self.request_ttl_seconds
            ));
        }
        w
    }

    /// Resolves `enabled`: unset, `default` (on with the affinity mode, without `pdGroup`).
    pub fn resolve(&mut self, default: bool) {
        self.active = self.enabled.unwrap_or(default);
    }

    /// The service a request of `prompt_tokens` charges its flow when it leaves the queue:
    /// its tokens weighted (the output as `expectedOutputTokens`), and with Kthena's settings
    /// their input weight and per-request weight.
    pub fn charge(&self, prompt_tokens: f64) -> f64 {
        let (input, per_request) = self
            .kthena
            .as_ref()
            .map_or((1.0, 0.0), |k| (k.input_weight, k.request_weight));
        input * prompt_tokens
            + self.output_weight * f64::from(self.expected_output_tokens)
            + per_request
    }

    /// The flow of a request for `model` ([`flow_id`] of its fairness header; with Kthena's
    /// settings, [`kthena::KthenaFlows::flow`]).
    pub fn flow(&self, authorization: Option<&str>, header: Option<&str>, model: &str) -> String {
        match &self.kthena {
            None => flow_id(header).to_string(),
            Some(k) => k.flow(authorization, header, model),
        }
    }

    /// Whether the flow reads the request's `Authorization` header (Kthena's JWT user).
    pub fn reads_authorization(&self) -> bool {
        self.active && self.kthena.as_ref().is_some_and(|k| k.jwt_user)
    }

    /// The priority of an objective (`x-gateway-inference-objective`): the watched
    /// InferenceObjective's, else its entry in `priorities`, else `defaultPriority`.
    pub fn priority(&self, objective: Option<&str>, watched: &ObjectivePriorities) -> i32 {
        objective
            .and_then(|o| watched.get(o).or_else(|| self.priorities.get(o).copied()))
            .unwrap_or(self.default_priority)
    }
}

/// The priorities of the InferenceObjectives discovery watches
/// (`discovery.kubernetes.inferenceObjectives`), by objective name; replaced whole on a change,
/// read without a lock.
#[derive(Debug, Default)]
pub struct ObjectivePriorities(arc_swap::ArcSwap<std::collections::HashMap<String, i32>>);

impl ObjectivePriorities {
    pub fn get(&self, objective: &str) -> Option<i32> {
        self.0.load().get(objective).copied()
    }

    pub fn replace(&self, priorities: std::collections::HashMap<String, i32>) {
        self.0.store(std::sync::Arc::new(priorities));
    }
}

/// The flow of a request: its fairness header's value (cut to [`MAX_FLOW_ID_BYTES`] at a
/// character boundary), else [`DEFAULT_FLOW`].
pub fn flow_id(header: Option<&str>) -> &str {
    match header.map(str::trim).filter(|h| !h.is_empty()) {
        None => DEFAULT_FLOW,
        Some(h) if h.len() <= MAX_FLOW_ID_BYTES => h,
        Some(h) => {
            let mut end = MAX_FLOW_ID_BYTES;
            while !h.is_char_boundary(end) {
                end -= 1;
            }
            &h[..end]
        }
    }
}

#[cfg(test)]
mod tests;
