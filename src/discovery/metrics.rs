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
        let gauge = |name: &str, help: &str, label: &str| {
            IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric")
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let m = DiscoveryMetrics {
            pods: gauge(
                "prefix_picker_discovery_pods",
                "Pods seen by the Kubernetes watch, by state (ready, not_ready, terminating, no_ip)",
                "state",
            ),
            endpoints: gauge(
                "prefix_picker_discovery_endpoints",
                "Endpoints discovered from Kubernetes (pod IP x target port), by role label",
                "role",
            ),
            events: counter(
                "prefix_picker_discovery_events_total",
                "Kubernetes watch events applied, by resource and event (apply, delete, resync)",
                &["resource", "event"],
            ),
            watch_restarts: counter(
                "prefix_picker_discovery_watch_restarts_total",
                "Kubernetes watches restarted with a full list, by resource and reason (relist, target)",
                &["resource", "reason"],
            ),
            watch_errors: counter(
                "prefix_picker_discovery_watch_errors_total",
                "Errors from a Kubernetes watch (retried with backoff), by resource",
                &["resource"],
            ),
        };
        for c in [&m.pods, &m.endpoints] {
            registry.register(Box::new(c.clone())).expect("unique");
        }
        for c in [&m.events, &m.watch_restarts, &m.watch_errors] {
            registry.register(Box::new(c.clone())).expect("unique");
        }
        m
    }
}
