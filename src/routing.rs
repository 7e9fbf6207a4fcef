//! From a request (path + body) to a routing decision, independent of Envoy.
//!
//! Unknown API paths (e.g. `/v1/models`) are routed by load only, to any endpoint. Inference
//! APIs need a JSON body with a string `model` (else 400); a body without a renderable prompt is
//! routed by load only. Candidate pods can be narrowed by a subset hint or, when enabled, by the
//! conformance header. Failures map to HTTP statuses with OpenAI-style JSON error bodies.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;

use crate::config::{PickerConfig, SchedulerConfig};
use crate::endpoints::{Endpoint, Endpoints};
use crate::hashing::BlockHash;
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
use crate::pending::PendingRoutes;
use crate::request::{Api, InferenceRequest};
use crate::scheduler::{
    Decision, Observation, PickError, RouteRequest, Scheduler, TentativeHold, Unscored,
};

/// A request the picker answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFailure {
    pub status: u16,
    /// OpenAI error `type`.
    pub kind: &'static str,
    pub message: String,
}

impl RouteFailure {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> RouteFailure {
        RouteFailure {
            status,
            kind,
            message: message.into(),
        }
    }

    /// OpenAI-style JSON error body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.status,
        }}))
        .expect("serializable")
    }
}

impl From<PickError> for RouteFailure {
    fn from(e: PickError) -> Self {
        let status = match e {
            PickError::UnknownModel(_) => 404,
            _ => 503,
        };
        let kind = if status == 404 {
            "invalid_request_error"
        } else {
            "service_unavailable"
        };
        RouteFailure::new(status, kind, e.to_string())
    }
}

/// A routed request.
#[derive(Debug)]
pub struct Routed {
    pub model: String,
    pub api: Option<Api>,
    pub decision: Decision<Arc<Endpoint>>,
    /// The affinity mode's decision-time record for the primary pick (never for explain).
    pub tentative: Option<TentativeHold>,
}

/// Where a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOrigin {
    /// A completion this replica saw (published to the record sink).
    Local,
    /// A record another replica made (never published again).
    Replica,
}

/// Receives every local record (after a served request), e.g. to share it with other replicas.
/// Called on the routing path: it must not block.
pub trait RecordSink: Send + Sync + std::fmt::Debug {
    fn recorded(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint);
}

/// Everything routing needs, shared by all streams and the admin listener.
#[derive(Debug)]
pub struct Router {
    pub scheduler: Arc<Scheduler>,
    pub endpoints: Arc<Endpoints>,
    pub metrics: RouterMetrics,
    /// prefix-cache's metrics (Kthena's names), counted from what the scheduler returns.
    pub prefix_metrics: PrefixCacheMetrics,
    pub config: PickerConfig,
    pub pending: PendingRoutes,
    sink: OnceLock<Arc<dyn RecordSink>>,
}

impl Router {
    /// A router over an empty endpoint set: the scheduler from `scheduler`, the picker's
    /// knobs from `picker`, metrics into the given families.
    pub fn assemble(
        scheduler: SchedulerConfig,
        picker: PickerConfig,
        prefix_metrics: PrefixCacheMetrics,
        metrics: RouterMetrics,
    ) -> Router {
        let scheduler = Arc::new(Scheduler::new(scheduler, picker.max_endpoints, picker.seed));
        let endpoints = Arc::new(Endpoints::new(
            scheduler.prefix_cache().index().clone(),
            metrics.clone(),
        ));
        Router {
            scheduler,
            endpoints,
            metrics,
            prefix_metrics,
            pending: PendingRoutes::new(Duration::from_secs(picker.response_timeout_seconds)),
            config: picker,
            sink: OnceLock::new(),
        }
    }

    /// Installs the record sink (once); `false` if one was already set.
    pub fn set_record_sink(&self, sink: Arc<dyn RecordSink>) -> bool {
        self.sink.set(sink).is_ok()
    }

    /// Records a served request's prompt for the pod that served it: the one record path, for
    /// this replica's completions ([`RecordOrigin::Local`], shared with the other replicas
    /// through the sink) and for theirs ([`RecordOrigin::Replica`], applied as they made them).
    /// Evictions are counted by the evicted entry's model.
    pub fn record(
        &self,
        model: &str,
        hashes: &[BlockHash],
        endpoint: &Endpoint,
        origin: RecordOrigin,
    ) -> usize {
        if !self.scheduler.prefix_enabled() {
            return 0;
        }
        if origin == RecordOrigin::Local
            && let Some(sink) = self.sink.get()
        {
            sink.recorded(model, hashes, endpoint);
        }
        let outcome = self.scheduler.record(model, hashes, &endpoint.index);
        if !hashes.is_empty() {
            self.prefix_metrics.count_record(model, &outcome);
        }
        outcome.inserted
    }

    /// Counts a routed decision (reason, why unscored, duration, plugin times, match ratios)
    /// and writes Kthena's score lines.
    fn observe(&self, model: &str, decision: &Decision<Arc<Endpoint>>) {
        self.count(model, &decision.observations);
        self.metrics
            .decisions
            .with_label_values(&[decision.reason.as_str()])
            .inc();
        if let Some(u) = decision.unscored {
            self.metrics.unscored.with_label_values(&[u.as_str()]).inc();
        }
        self.metrics
            .decision_duration
            .observe(decision.duration.as_secs_f64());
        decision.log_scores();
    }

    /// Counts plugin times and match ratios.
    fn count(&self, model: &str, observations: &[Observation]) {
        for o in observations {
            match *o {
                Observation::PluginTime {
                    plugin,
                    kind,
                    elapsed,
                } => self
                    .metrics
                    .plugin_duration
                    .with_label_values(&[model, plugin, kind.as_str()])
                    .observe(elapsed.as_secs_f64()),
                Observation::MatchRatio(ratio) => self
                    .prefix_metrics
                    .match_ratio
                    .with_label_values(&[model])
                    .observe(ratio),
            }
        }
    }

    /// Routes one request. `body` is `None` for a request without a body. `observe` = false
    /// explains: the decision changes no state and is not counted (`/debug/explain`).
    pub fn route(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[SocketAddr]>,
        observe: bool,
    ) -> Result<Routed, RouteFailure> {
        let api = Api::from_path(path);
        let set = self.endpoints.snapshot();
        let parsed;
        let (model, prompt) = match (api, body) {
            // No path at all: the ext_proc filter skips request headers (see extproc).
            (None, _) if path.is_empty() => ("", Err(Unscored::NoRequestPath)),
            (None, _) => ("", Err(Unscored::UnknownApi)),
            (Some(_), None) => {
                return Err(RouteFailure::new(
                    400,
                    "invalid_request_error",
                    "request has no body",
                ));
            }
            (Some(_), Some(body)) => {
                parsed = InferenceRequest::parse(body)
                    .map_err(|e| RouteFailure::new(400, "invalid_request_error", e.to_string()))?;
                let prompt = match &parsed.prompt {
                    Ok(p) => Ok(p.as_str()),
                    Err(reason) => Err(Unscored::NoPrompt(*reason)),
                };
                (parsed.model.as_str(), prompt)
            }
        };
        let candidates = if api.is_none() {
            // Any pod: no model is known.
            let all = set.all().to_vec();
            if all.is_empty() {
                return Err(PickError::NoEndpoints.into());
            }
            match restrict {
                None => all,
                Some(r) => {
                    let kept: Vec<_> = all
                        .into_iter()
                        .filter(|e| r.iter().any(|a| matches_addr(a, &e.spec.address)))
                        .collect();
                    if kept.is_empty() {
                        return Err(PickError::SubsetUnavailable.into());
                    }
                    kept
                }
            }
        } else {
            set.candidates(model, restrict)?
        };
        let request = RouteRequest { model, prompt };
        let mut tentative = None;
        let decision = if observe {
            let decision = self
                .scheduler
                .schedule(request, candidates)
                .inspect_err(|f| self.count(model, &f.observations))
                .map_err(PickError::from)?;
            self.observe(model, &decision);
            self.metrics
                .pod_picks
                .with_label_values(&crate::metrics::pod_label_values(
                    &decision.primary().spec.id,
                ))
                .inc();
            tentative = self.scheduler.commit(model, &decision);
            decision
        } else {
            self.scheduler
                .explain(request, candidates)
                .map_err(PickError::from)?
        };
        Ok(Routed {
            model: model.to_string(),
            api,
            decision,
            tentative,
        })
    }
}

fn matches_addr(allowed: &SocketAddr, addr: &SocketAddr) -> bool {
    allowed == addr || (allowed.port() == 0 && allowed.ip() == addr.ip())
}

/// Parses `ip:port` or a bare `ip` (any port, encoded as port 0); IPv6 may be bracketed.
pub fn parse_endpoint(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let bare = s.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0))
}

/// Parses a comma-separated endpoint list; entries that do not parse are skipped.
pub fn parse_endpoint_list(s: &str) -> Vec<SocketAddr> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .filter_map(parse_endpoint)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_lists() {
        assert_eq!(
            parse_endpoint_list("10.0.0.1:80, 10.0.0.2 ,[::1]:9,::2"),
            [
                "10.0.0.1:80".parse().unwrap(),
                "10.0.0.2:0".parse().unwrap(),
                "[::1]:9".parse().unwrap(),
                "[::2]:0".parse().unwrap()
            ]
        );
        assert!(parse_endpoint_list("").is_empty());
    }

    /// A router in the affinity mode over three static pods, its metrics in `registry`.
    fn affinity_router(registry: &prometheus::Registry) -> Router {
        let config = crate::config::Config::parse(
            "picker: {affinity: {}}\nendpoints:\n- {name: a, address: 127.0.0.1:1}\n- {name: b, address: 127.0.0.1:2}\n- {name: c, address: 127.0.0.1:3}\n",
        )
        .unwrap();
        let router = Router::assemble(
            config.scheduler,
            config.picker,
            PrefixCacheMetrics::register(registry),
            RouterMetrics::register(registry),
        );
        let specs = config
            .endpoints
            .iter()
            .map(|e| crate::endpoints::EndpointSpec {
                id: crate::endpoints::PodId {
                    namespace: e.namespace.clone(),
                    name: e.name.clone(),
                },
                address: e.address,
                models: vec![],
                generation: String::new(),
                role: None,
            })
            .collect();
        router
            .endpoints
            .apply(crate::endpoints::Update::Reset(specs));
        router
    }

    use prometheus::proto::MetricType;

    /// Samples of every series in `registry` (counts for histograms), by family name.
    fn samples(registry: &prometheus::Registry) -> Vec<(String, f64)> {
        registry
            .gather()
            .iter()
            .flat_map(|f| {
                f.get_metric().iter().map(|m| {
                    let v = match f.get_field_type() {
                        MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                        MetricType::COUNTER => m.get_counter().get_value(),
                        _ => m.get_gauge().get_value(),
                    };
                    (f.name().to_string(), v)
                })
            })
            .filter(|(_, v)| *v != 0.0)
            .collect()
    }

    #[test]
    fn explain_changes_no_state_and_counts_nothing() {
        let registry = prometheus::Registry::new();
        let router = affinity_router(&registry);
        let body = br#"{"model": "m", "prompt": "an explained prompt, long enough for a block or two of hashes"}"#;
        let before = samples(&registry);
        let explained = router
            .route("/v1/completions", Some(body), None, false)
            .unwrap();
        assert!(explained.tentative.is_none());
        assert_eq!(samples(&registry), before, "explain counts nothing");
        assert_eq!(router.scheduler.tentative().holds(), 0);
        let routed = router
            .route("/v1/completions", Some(body), None, true)
            .unwrap();
        assert_eq!(
            routed.decision.primary().label,
            explained.decision.primary().label,
            "explain shows the next decision"
        );
        assert_eq!(router.scheduler.tentative().holds(), 1);
        let counted: Vec<String> = samples(&registry).into_iter().map(|(n, _)| n).collect();
        for family in [
            "kthena_router_scheduler_plugin_duration_seconds",
            "kthena_router_prefix_cache_match_ratio",
            "prefix_picker_decisions_total",
            "prefix_picker_decision_duration_seconds",
            "prefix_picker_pod_picks_total",
        ] {
            assert!(
                counted.iter().any(|n| n == family),
                "{family} in {counted:?}"
            );
        }
    }

    #[test]
    fn failure_body_is_openai_shaped() {
        let f = RouteFailure::new(400, "invalid_request_error", "bad");
        let v: serde_json::Value = serde_json::from_slice(&f.body()).unwrap();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["code"], 400);
    }
}
