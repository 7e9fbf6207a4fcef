//! From a request (path + body) to a routing decision, independent of Envoy.
//!
//! Unknown API paths (e.g. `/v1/models`) are routed by load only, to any endpoint. Inference
//! APIs need a JSON body with a string `model` (else 400); a body without a renderable prompt is
//! routed by load only. Candidate pods can be narrowed by a subset hint or, when enabled, by the
//! conformance header. Failures map to HTTP statuses with OpenAI-style JSON error bodies.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::config::{PickerConfig, SchedulerConfig};
use crate::endpoints::Endpoints;
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
use crate::pending::PendingRoutes;
use crate::request::{Api, InferenceRequest};
use crate::scheduler::{Decision, PickError, RouteRequest, Scheduler, TentativeHold};

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
    pub decision: Decision,
    /// The affinity mode's decision-time record for the primary pick (never for explain).
    pub tentative: Option<TentativeHold>,
}

/// Everything routing needs, shared by all streams and the admin listener.
#[derive(Debug)]
pub struct Router {
    pub scheduler: Arc<Scheduler>,
    pub endpoints: Arc<Endpoints>,
    pub metrics: RouterMetrics,
    pub config: PickerConfig,
    pub pending: PendingRoutes,
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
        let scheduler = Arc::new(Scheduler::new(
            scheduler,
            picker.max_endpoints,
            picker.seed,
            prefix_metrics,
            metrics.clone(),
        ));
        let endpoints = Arc::new(Endpoints::new(
            scheduler.prefix_cache().index().clone(),
            metrics.clone(),
        ));
        Router {
            scheduler,
            endpoints,
            metrics,
            pending: PendingRoutes::new(Duration::from_secs(picker.response_timeout_seconds)),
            config: picker,
        }
    }

    /// Routes one request. `body` is `None` for a request without a body.
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
            (None, _) if path.is_empty() => ("", Err("no_request_path")),
            (None, _) => ("", Err("unknown_api")),
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
                    Err(reason) => Err(reason.as_str()),
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
            self.scheduler.candidates(&set, model, restrict)?
        };
        let decision =
            self.scheduler
                .schedule(RouteRequest { model, prompt }, candidates, observe)?;
        let mut tentative = None;
        if observe {
            self.metrics
                .pod_picks
                .with_label_values(&[&decision.primary().label])
                .inc();
            tentative = self
                .scheduler
                .hold_tentative(model, &decision.hashes, decision.primary());
        }
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

    #[test]
    fn failure_body_is_openai_shaped() {
        let f = RouteFailure::new(400, "invalid_request_error", "bad");
        let v: serde_json::Value = serde_json::from_slice(&f.body()).unwrap();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["code"], 400);
    }
}
