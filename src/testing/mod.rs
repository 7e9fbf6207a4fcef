//! Fixtures shared by the crate's unit tests: a [`Router`] over static pods on 127.0.0.1, and
//! (in [`envoy`]) ext_proc messages as Envoy sends them and readers for the replies.

pub(crate) mod envoy;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{PickerConfig, SchedulerConfig};
use crate::endpoints::{Endpoint, EndpointSpec, PodId, Update};
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
use crate::routing::Router;

pub(crate) const PORTS: [u16; 3] = [18001, 18002, 18003];

pub(crate) fn spec(name: &str, port: u16, models: &[&str]) -> EndpointSpec {
    EndpointSpec {
        id: PodId {
            namespace: "default".into(),
            name: name.into(),
        },
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        models: models.iter().map(|m| m.to_string()).collect(),
        generation: String::new(),
        role: None,
        labels: Default::default(),
        kv_events: None,
        containers_started: None,
        engine_started: None,
    }
}

pub(crate) fn three() -> Vec<EndpointSpec> {
    PORTS
        .iter()
        .enumerate()
        .map(|(i, &p)| spec(&format!("pod-{i}"), p, &[]))
        .collect()
}

/// Assembled as `serve::start` does, with default scheduler config.
pub(crate) fn router_with(picker: PickerConfig, specs: Vec<EndpointSpec>) -> Arc<Router> {
    let router = Router::assemble(
        SchedulerConfig::default(),
        picker,
        PrefixCacheMetrics::unregistered(),
        RouterMetrics::register(&prometheus::Registry::new()),
    );
    router.endpoints.apply(Update::Reset(specs));
    Arc::new(router)
}

/// A router from a config document (its scheduler and picker sections) over `pods`, its metrics
/// in `registry`.
pub(crate) fn router_from_config(
    yaml: &str,
    pods: Vec<EndpointSpec>,
    registry: &prometheus::Registry,
) -> Router {
    let config = crate::config::Config::parse(yaml).expect("valid config");
    let router = Router::assemble(
        config.scheduler,
        config.picker,
        PrefixCacheMetrics::register(registry),
        RouterMetrics::register(registry),
    );
    router.endpoints.apply(Update::Reset(pods));
    router
}

pub(crate) fn router() -> Arc<Router> {
    router_with(PickerConfig::default(), three())
}

pub(crate) fn test_selection_router() -> Arc<Router> {
    router_with(
        PickerConfig {
            allow_test_endpoint_selection: true,
            ..PickerConfig::default()
        },
        three(),
    )
}

pub(crate) fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(crate) fn endpoint(router: &Router, a: SocketAddr) -> Arc<Endpoint> {
    router
        .endpoints
        .snapshot()
        .by_address(&a)
        .cloned()
        .expect("known endpoint")
}

pub(crate) fn entries(router: &Router, a: SocketAddr) -> usize {
    router
        .scheduler
        .prefix_cache()
        .index()
        .pod_entries(endpoint(router, a).index.slot())
}

pub(crate) fn total_entries(router: &Router) -> usize {
    router.scheduler.prefix_cache().index().entries()
}

pub(crate) fn inflight(router: &Router) -> Vec<i64> {
    PORTS
        .iter()
        .map(|&p| endpoint(router, addr(p)).inflight())
        .collect()
}

pub(crate) fn records(router: &Router, outcome: &str) -> u64 {
    router.metrics.records.with_label_values(&[outcome]).get()
}
