//! The admin listener: `/metrics`, `/healthz`, `/readyz` and `POST /debug/explain`.
//!
//! `/debug/explain?api=/v1/chat/completions` (or `api=chat|completions|responses|messages`;
//! inferred from the body when absent: `messages` -> chat, `input` -> responses, else
//! completions; an Anthropic Messages body needs `api=messages`) takes a request body and returns the decision the picker would make, with every plugin's score
//! per pod, without routing, recording or counting anything. The answer carries the request's
//! id (the call's `x-request-id`, generated when absent) and the decision as the decision
//! header and the access record would carry it (`decision`), and whether flow control would
//! hold it in its queue now (`would_queue`). The `/debug/*` routes are off
//! unless enabled, and then guarded ([`access`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router as Http;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::endpoints::Endpoint;
use crate::metrics::{PrefixCacheMetrics, encode};
use crate::routing::{Explained, Router};
use crate::scheduler::{Decision, Unscored};

pub use crate::debug_access as access;
pub use access::{DebugAccess, DebugConfig};

/// Shared state of the admin listener.
#[derive(Debug, Clone)]
pub struct Admin {
    pub router: Arc<Router>,
    pub registry: prometheus::Registry,
    pub prefix_metrics: PrefixCacheMetrics,
    pub ready: Arc<AtomicBool>,
    /// Who may call `/debug/*` ([`DebugAccess::Off`]: not served).
    pub debug: Arc<DebugAccess>,
}

/// The admin routes. Serve with `into_make_service_with_connect_info::<SocketAddr>()`: the
/// debug guard reads the peer address.
pub fn app(admin: Admin) -> Http {
    let mut app = Http::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if admin.debug.enabled() {
        let debug = Http::new()
            .route("/debug/explain", post(explain))
            .route_layer(middleware::from_fn_with_state(admin.debug.clone(), guard));
        app = app.merge(debug);
    }
    app.with_state(admin)
}

/// Lets a request through to a debug route only if [`DebugAccess::check`] does.
async fn guard(
    State(access): State<Arc<DebugAccess>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    match access.check(peer, request.headers()).await {
        Ok(()) => next.run(request).await,
        Err(refused) => refused,
    }
}

async fn metrics(State(a): State<Admin>) -> Response {
    let entries = a.router.scheduler.index().entries();
    a.prefix_metrics.entries.set(entries as i64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        encode(&a.registry),
    )
        .into_response()
}

async fn readyz(State(a): State<Admin>) -> Response {
    if a.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

#[derive(Debug, Deserialize)]
struct ExplainQuery {
    api: Option<String>,
}

fn api_path(api: Option<&str>, body: &[u8]) -> String {
    match api {
        Some("chat") => "/v1/chat/completions".into(),
        Some("completions") => "/v1/completions".into(),
        Some("responses") => "/v1/responses".into(),
        Some("messages") => "/v1/messages".into(),
        Some(path) => path.into(),
        None => {
            let v: Value = crate::lenient_json::parse_value(body).unwrap_or(Value::Null);
            if v.get("messages").is_some() {
                "/v1/chat/completions".into()
            } else if v.get("input").is_some() {
                "/v1/responses".into()
            } else {
                "/v1/completions".into()
            }
        }
    }
}

async fn explain(
    State(a): State<Admin>,
    Query(q): Query<ExplainQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = api_path(q.api.as_deref(), &body);
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
    // kvcache-aware: the same lookup a routed request awaits (tokenize + Redis; counted).
    let kv = match a.router.kv_lookup(&path, &body, None) {
        Some(lookup) => lookup.await,
        None => None,
    };
    // An EndpointPickerConfig's session-affinity scorers read their headers here too.
    let epp_headers: Vec<(String, String)> = a
        .router
        .epp_request_headers()
        .into_iter()
        .filter_map(|name| {
            let value = headers.get(name.as_str())?.to_str().ok()?.to_string();
            Some((name, value))
        })
        .collect();
    match a
        .router
        .explain_looked_up(&path, Some(&body), None, kv.as_ref(), &epp_headers)
    {
        Err(f) => (
            StatusCode::from_u16(f.status).unwrap_or(StatusCode::BAD_REQUEST),
            [(header::CONTENT_TYPE, "application/json")],
            f.body(),
        )
            .into_response(),
        Ok(explained) => axum::Json(explained_json(&path, &explained, &request_id)).into_response(),
    }
}

/// `/debug/explain`'s answer: the request as the scheduler saw it, each pod's scores, the pick.
fn explained_json(path: &str, explained: &Explained, request_id: &str) -> Value {
    let d = &explained.decision;
    let pick = d.pick_summary();
    let pods: Vec<Value> = (0..d.candidates.len()).map(|i| pod_json(d, i)).collect();
    let plugins: Vec<Value> = d
        .plugins
        .iter()
        .map(|p| match &p.fractional {
            // An EndpointPickerConfig scorer: its type, instance name and float weight.
            Some(f) => {
                json!({"name": p.plugin, "instance": f.name, "weight": f.weight, "scored": true})
            }
            None => json!({"name": p.plugin, "weight": p.weight, "scored": p.scores.is_some()}),
        })
        .collect();
    json!({
        "request_id": request_id,
        "api": path,
        "model": explained.model,
        "prompt_bytes": d.prompt_bytes,
        "blocks": d.hashes.len(),
        "unscored": d.unscored.map(Unscored::as_str),
        "plugins": plugins,
        "pods": pods,
        "primary": d.primary().label,
        "fallbacks": d.ranked[1..].iter().map(|e| e.label.clone()).collect::<Vec<_>>(),
        "destination": crate::envoy::wire::destination(&d.ranked),
        "reason": d.reason.as_str(),
        // What the decision header and the `envoy.lb` metadata would carry.
        "decision": crate::envoy::wire::decision_value(&pick, request_id),
        // PD mode: the prefill pod sent in x-prefiller-host-port (`pods` are the
        // decode pass's).
        "prefill": d.pd.as_ref().map(|pd| json!({"pod": pd.prefill.label, "address": pd.prefill.host})),
        // Flow control would hold the request now (every candidate full, or others waiting):
        // the pick above is what it would get once a pod has room.
        "would_queue": explained.would_queue,
    })
}

/// Candidate `i` of the decision: its scores per plugin, its total, and in the affinity mode
/// the latency model's prediction and where its match came from; whether its engine reuses its
/// cache.
fn pod_json(d: &Decision<Arc<Endpoint>>, i: usize) -> Value {
    let e = &d.candidates[i];
    let scores: serde_json::Map<String, Value> = d
        .plugins
        .iter()
        .map(|p| match &p.fractional {
            Some(f) => (f.name.clone(), json!(f.scores[i])),
            None => {
                let s = p
                    .scores
                    .as_ref()
                    .map(|s| json!(s[i]))
                    .unwrap_or(Value::Null);
                (p.plugin.to_string(), s)
            }
        })
        .collect();
    // An EndpointPickerConfig profile's total is llm-d's float sum.
    let total = match d.plugins.iter().any(|p| p.fractional.is_some()) {
        true => json!(crate::scheduler::epp::epp_total(d.totals[i])),
        false => json!(d.totals[i]),
    };
    // Affinity mode: the latency model's predicted TTFT, in milliseconds.
    let prediction = d.predictions.get(i).map(|p| {
        json!({"ttft_ms": p.ttft() * 1e3, "wait_ms": p.wait * 1e3,
            "prefill_ms": p.prefill * 1e3, "uncached_tokens": p.uncached_tokens})
    });
    // Affinity mode, or an EndpointPickerConfig's precise producer: where the match came from,
    // in engine tokens if there, and the prompt blocks the estimate added past the engine's
    // head (source "engine+estimate").
    let matched = (d.predictions.get(i).is_some() || !d.engine.is_empty()).then(|| {
        let engine = d.engine.get(i).copied().flatten();
        json!({"source": d.match_source(i).as_str(),
            "engine_tokens": engine.map(|m| m.tokens),
            "estimate_blocks_beyond": engine.map(|m| m.estimate_beyond)})
    });
    // Whether its engine reuses its KV cache (false: it said prefix caching is off).
    let reuses = crate::scheduler::Candidate::reuses_cache(e.as_ref());
    // What its engine's GET /v1/models listed (lora-affinity's input; null: not fetched).
    json!({"pod": e.label, "address": e.host, "scores": scores, "total": total,
        "prediction": prediction, "match": matched, "reuses_cache": reuses,
        "served_models": e.served_models()})
}
