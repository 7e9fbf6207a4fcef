//! Discovery metrics (`prefix_picker_discovery_*`), declared as data and registered explicitly.
//!
//! - `prefix_picker_discovery_pods{state}`: pods the watcher currently sees, by whether they
//!   count (`ready`) or why not (`not_ready`, `terminating`, `no_ip`).
//! - `prefix_picker_discovery_endpoints{role}`: discovered endpoints, by role label (`none`).
//! - `prefix_picker_discovery_events_total{resource,event}`: watch events applied
//!   (`apply`, `delete`, `resync` = a completed full list).
//! - `prefix_picker_discovery_watch_restarts_total{resource,reason}`: full relists after the first
//!   (`relist`: 410 Gone, failed list, ...) and pod-watch restarts for a new pool selector
//!   (`target`).
//! - `prefix_picker_discovery_watch_errors_total{resource}`: errors from the watch stream (each
//!   one retried with kube-runtime's default backoff).

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

use crate::discovery::pod::PodState;
use crate::metrics::family::Label::{Enum, Free};
use crate::metrics::family::{Family, Label};

/// The `resource` label: what a watch is on.
pub const RESOURCES: [&str; 2] = ["pod", "inferencepool"];
/// The `event` label of `prefix_picker_discovery_events_total`.
pub const EVENTS: [&str; 3] = ["apply", "delete", "resync"];
/// The `reason` label of `prefix_picker_discovery_watch_restarts_total`.
pub const RESTART_REASONS: [&str; 2] = ["relist", "target"];

// Every listed value exists at 0 from the start, as the help string says.
const PODS: Family = Family::gauge(
    "prefix_picker_discovery_pods",
    "Pods seen by the Kubernetes watch, by state",
    &[Enum("state", || {
        PodState::ALL.map(PodState::as_str).to_vec()
    })],
);
const ENDPOINTS: Family = Family::gauge(
    "prefix_picker_discovery_endpoints",
    "Endpoints discovered from Kubernetes (pod IP x target port), by role label (none \
     without one)",
    &[Free("role")],
);
const RESOURCE: Label = Enum("resource", || RESOURCES.to_vec());
const EVENTS_TOTAL: Family = Family::counter(
    "prefix_picker_discovery_events_total",
    "Kubernetes watch events applied, by resource and event",
    &[RESOURCE, Enum("event", || EVENTS.to_vec())],
);
const WATCH_RESTARTS: Family = Family::counter(
    "prefix_picker_discovery_watch_restarts_total",
    "Kubernetes watches restarted with a full list, by resource and reason",
    &[RESOURCE, Enum("reason", || RESTART_REASONS.to_vec())],
);
const WATCH_ERRORS: Family = Family::counter(
    "prefix_picker_discovery_watch_errors_total",
    "Errors from a Kubernetes watch (retried with backoff), by resource",
    &[RESOURCE],
);

#[derive(Debug, Clone)]
pub struct DiscoveryMetrics {
    pub pods: IntGaugeVec,
    pub endpoints: IntGaugeVec,
    pub events: IntCounterVec,
    pub watch_restarts: IntCounterVec,
    pub watch_errors: IntCounterVec,
}

impl DiscoveryMetrics {
    pub fn register(registry: &Registry) -> DiscoveryMetrics {
        DiscoveryMetrics {
            pods: PODS.register(registry),
            endpoints: ENDPOINTS.register(registry),
            events: EVENTS_TOTAL.register(registry),
            watch_restarts: WATCH_RESTARTS.register(registry),
            watch_errors: WATCH_ERRORS.register(registry),
        }
    }

    /// Counts a watch event applied.
    pub fn event(&self, resource: Resource, event: WatchEvent) {
        self.events
            .with_label_values(&[resource.as_str(), event.as_str()])
            .inc();
    }

    /// The number of `event`s of `resource` applied so far.
    pub fn events_of(&self, resource: Resource, event: WatchEvent) -> u64 {
        self.events
            .with_label_values(&[resource.as_str(), event.as_str()])
            .get()
    }

    /// Counts a watch restarted with a full list.
    pub fn restart(&self, resource: Resource, reason: RestartReason) {
        self.watch_restarts
            .with_label_values(&[resource.as_str(), reason.as_str()])
            .inc();
    }

    /// Counts an error from a watch stream.
    pub fn watch_error(&self, resource: Resource) {
        self.watch_errors
            .with_label_values(&[resource.as_str()])
            .inc();
    }
}

/// The watched resource (the `resource` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Pod,
    InferencePool,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Pod => "pod",
            Resource::InferencePool => "inferencepool",
        }
    }
}

/// A watch event applied (the `event` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    Apply,
    Delete,
    /// A completed full list.
    Resync,
}

impl WatchEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEvent::Apply => "apply",
            WatchEvent::Delete => "delete",
            WatchEvent::Resync => "resync",
        }
    }
}

/// Why a watch restarted with a full list (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// A relist after the first (410 Gone, a failed list, ...).
    Relist,
    /// The pod watch restarted for a new pool selector.
    Target,
}

impl RestartReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Relist => "relist",
            RestartReason::Target => "target",
        }
    }
}
