//! Discovery metrics (`prefix_picker_discovery_*`), registered explicitly.
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

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::discovery::pod::PodState;
use crate::metrics::listing;

/// The `resource` label: what a watch is on.
pub const RESOURCES: [&str; 2] = ["pod", "inferencepool"];
/// The `event` label of `prefix_picker_discovery_events_total`.
pub const EVENTS: [&str; 3] = ["apply", "delete", "resync"];
/// The `reason` label of `prefix_picker_discovery_watch_restarts_total`.
pub const RESTART_REASONS: [&str; 2] = ["relist", "target"];

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
        let gauge = |name: &str, help: String, label: &str| {
            IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric")
        };
        let counter = |name: &str, help: String, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let m = DiscoveryMetrics {
            pods: gauge(
                "prefix_picker_discovery_pods",
                listing(
                    "Pods seen by the Kubernetes watch, by state",
                    &[("state", &PodState::ALL.map(PodState::as_str))],
                ),
                "state",
            ),
            endpoints: gauge(
                "prefix_picker_discovery_endpoints",
                "Endpoints discovered from Kubernetes (pod IP x target port), by role label (none \
                 without one)"
                    .into(),
                "role",
            ),
            events: counter(
                "prefix_picker_discovery_events_total",
                listing(
                    "Kubernetes watch events applied, by resource and event",
                    &[("resource", &RESOURCES), ("event", &EVENTS)],
                ),
                &["resource", "event"],
            ),
            watch_restarts: counter(
                "prefix_picker_discovery_watch_restarts_total",
                listing(
                    "Kubernetes watches restarted with a full list, by resource and reason",
                    &[("resource", &RESOURCES), ("reason", &RESTART_REASONS)],
                ),
                &["resource", "reason"],
            ),
            watch_errors: counter(
                "prefix_picker_discovery_watch_errors_total",
                listing(
                    "Errors from a Kubernetes watch (retried with backoff), by resource",
                    &[("resource", &RESOURCES)],
                ),
                &["resource"],
            ),
        };
        for c in [&m.pods, &m.endpoints] {
            registry.register(Box::new(c.clone())).expect("unique");
        }
        for c in [&m.events, &m.watch_restarts, &m.watch_errors] {
            registry.register(Box::new(c.clone())).expect("unique");
        }
        // Every listed value exists at 0 from the start, as the help string says.
        for state in PodState::ALL {
            m.pods.with_label_values(&[state.as_str()]);
        }
        for resource in RESOURCES {
            for event in EVENTS {
                m.events.with_label_values(&[resource, event]);
            }
            for reason in RESTART_REASONS {
                m.watch_restarts.with_label_values(&[resource, reason]);
            }
            m.watch_errors.with_label_values(&[resource]);
        }
        m
    }
}
