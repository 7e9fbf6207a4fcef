//! End-to-end harness: the picker in-process (port 0), small HTTP backends that report who served,
//! and a real Envoy per test (dynamic base id, admin and listener on port 0, polled for
//! readiness). Nothing sleeps for a fixed time: every wait polls a condition with a deadline.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use prefix_picker::config::Config;
use prefix_picker::serve::{self, Running};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub mod fake_kube;
pub mod redis_server;
pub mod service;

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The project root (for `envoy/` and `.venv`).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Envoy binary: `$ENVOY_BIN`, else the project's `.venv/bin/envoy`, else `envoy` on PATH.
pub fn envoy_bin() -> PathBuf {
    testkit::envoy_bin()
}

/// Runs `envoy --mode validate` on a config file; `Err` carries Envoy's output.
pub fn envoy_validate_file(path: &std::path::Path) -> Result<(), String> {
    let out = std::process::Command::new(envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(path)
        .output()
        .unwrap();
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Polls `check` until it returns `Some`, or panics after [`DEADLINE`].
pub async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(5);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------- backends

/// A model-server stand-in: answers OpenAI-style requests with who served them.
/// - `"stream": true` -> SSE: one event, then (if the body contains `GATED`) waits for the gate,
///   then a final event and `[DONE]`;
/// - a body containing `FAIL-500` -> 500.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub served: Arc<AtomicUsize>,
    pub gate: Arc<Notify>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct BackendState {
    name: String,
    served: Arc<AtomicUsize>,
    gate: Arc<Notify>,
}

impl Backend {
    pub async fn start(name: &str) -> Backend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = BackendState {
            name: name.to_string(),
            served: Arc::default(),
            gate: Arc::new(Notify::new()),
        };
        let app = axum::Router::new()
            // The picker scrapes engine metrics; these backends have none to report.
            .route("/metrics", axum::routing::get(|| async { "" }))
            .fallback(handle)
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(state.clone());
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
                .unwrap();
        });
        Backend {
            name: name.to_string(),
            addr,
            served: state.served,
            gate: state.gate,
            stop,
        }
    }

    /// Stops accepting connections (the port then refuses them).
    pub fn kill(&self) {
        self.stop.cancel();
    }
}

async fn handle(State(s): State<BackendState>, headers: HeaderMap, body: Bytes) -> Response {
    let _ = headers;
    let text = String::from_utf8_lossy(&body);
    if text.contains("FAIL-500") {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("x-served-by", s.name.clone())],
            "{\"error\":\"injected\"}",
        )
            .into_response();
    }
    s.served.fetch_add(1, Ordering::Relaxed);
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream").and_then(|b| b.as_bool()))
        .unwrap_or(false);
    if stream {
        let gated = text.contains("GATED");
        let name = s.name.clone();
        let gate = s.gate.clone();
        let events = async_stream(name, gated, gate);
        return Response::builder()
            .header("content-type", "text/event-stream")
            .header("x-served-by", s.name.clone())
            .body(Body::from_stream(events))
            .unwrap();
    }
    let reply = serde_json::json!({"served_by": s.name, "body_len": body.len(), "object": "chat.completion",
        "usage": {"prompt_tokens": body.len() / 4, "completion_tokens": 1}});
    (
        [
            ("x-served-by", s.name.clone()),
            ("content-type", "application/json".to_string()),
        ],
        reply.to_string(),
    )
        .into_response()
}

fn async_stream(
    name: String,
    gated: bool,
    gate: Arc<Notify>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(0u8, move |step| {
        let (name, gate) = (name.clone(), gate.clone());
        async move {
            match step {
                0 => Some((
                    Ok(Bytes::from(format!(
                        "data: {{\"served_by\":\"{name}\",\"n\":1}}\n\n"
                    ))),
                    1,
                )),
                1 => {
                    if gated {
                        gate.notified().await;
                    }
                    Some((
                        Ok(Bytes::from(format!(
                            "data: {{\"served_by\":\"{name}\",\"n\":2}}\n\ndata: [DONE]\n\n"
                        ))),
                        2,
                    ))
                }
                _ => None,
            }
        }
    })
}

// ---------------------------------------------------------------- picker

/// The `endpoints:` section for some backends.
pub fn endpoints_yaml(backends: &[Backend]) -> String {
    testkit::endpoints_yaml(backends.iter().map(|b| (b.name.as_str(), b.addr)))
}

pub fn picker_config(backends: &[&Backend], extra: &str) -> Config {
    let mut doc = testkit::endpoints_yaml(backends.iter().map(|b| (b.name.as_str(), b.addr)));
    doc.push_str(extra);
    Config::parse(&doc).unwrap()
}

/// The `picker:` section of the shipped config (`deploy/local/config.yaml`): the affinity mode.
pub fn shipped_picker_section() -> &'static str {
    let local = include_str!("../../../deploy/local/config.yaml");
    &local[local
        .find("\npicker:")
        .expect("the shipped config has a picker section")
        + 1..]
}

/// Starts a picker with `/debug/explain` on (tests read decisions through it; loopback only).
pub async fn start_picker(mut config: Config) -> Running {
    config.picker.debug.enabled = true;
    serve::start(config, "127.0.0.1:0", "127.0.0.1:0")
        .await
        .unwrap()
}

/// The picker's `/metrics` exposition.
pub async fn exposition(picker: &Running) -> String {
    exposition_at(picker.admin_addr).await
}

/// The `/metrics` exposition of the picker whose admin listener is `admin` (a picker run as a
/// process).
pub async fn exposition_at(admin: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `series` on the `/metrics` of the picker whose admin listener is `admin` (0 when absent).
pub async fn metric_at(admin: std::net::SocketAddr, series: &str) -> f64 {
    sample(&exposition_at(admin).await, series).unwrap_or(0.0)
}

/// The sum over the series matching `series` (a name, or a name with leading labels such as
/// `name{outcome="recorded"}`) in `text`; `None` when no series matches.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(series) && l[series.len()..].starts_with([' ', '{', ','])
                || l.split(' ').next() == Some(series)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Reads one sample of the picker's `/metrics` (sum over matching series), or `None` when no
/// series matches (not created yet, removed, or renamed).
pub async fn metric_opt(picker: &Running, series: &str) -> Option<f64> {
    sample(&exposition(picker).await, series)
}

/// Reads one sample of the picker's `/metrics` (sum over matching series). A missing series
/// is an error, never 0: a renamed metric must fail the test that reads it.
pub async fn metric(picker: &Running, series: &str) -> f64 {
    let text = exposition(picker).await;
    sample(&text, series).unwrap_or_else(|| {
        panic!("no series {series} in /metrics (renamed, or never created?):\n{text}")
    })
}

/// Waits until `series` exists and equals `value`.
pub async fn wait_metric_eq(picker: &Running, series: &str, value: f64) {
    poll(&format!("{series} == {value}"), || async {
        (metric_opt(picker, series).await == Some(value)).then_some(())
    })
    .await
}

/// Waits until `series` exists and reaches at least `value`.
pub async fn wait_metric(picker: &Running, series: &str, value: f64) {
    poll(&format!("{series} >= {value}"), || async {
        metric_opt(picker, series)
            .await
            .is_some_and(|v| v >= value)
            .then_some(())
    })
    .await
}

pub async fn explain(picker: &Running, body: &serde_json::Value) -> serde_json::Value {
    explain_at(picker.admin_addr, body).await
}

/// `/debug/explain` of the picker whose admin listener is `admin`.
pub async fn explain_at(admin: SocketAddr, body: &serde_json::Value) -> serde_json::Value {
    reqwest::Client::new()
        .post(format!("http://{admin}/debug/explain"))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The prefix-cache score of `pod` for `body`, per `/debug/explain` (a pod or score missing
/// from the explanation is an error, never 0).
pub async fn prefix_score(picker: &Running, body: &serde_json::Value, pod: &str) -> u64 {
    let e = explain(picker, body).await;
    e["pods"]
        .as_array()
        .unwrap_or_else(|| panic!("no pods in the explanation: {e}"))
        .iter()
        .find(|p| p["pod"] == format!("default/{pod}"))
        .unwrap_or_else(|| panic!("{pod} not in the explanation: {e}"))["scores"]["prefix-cache"]
        .as_u64()
        .unwrap_or_else(|| panic!("no prefix-cache score for {pod}: {e}"))
}

// ---------------------------------------------------------------- envoy

pub struct Envoy {
    pub process: testkit::EnvoyProcess,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Envoy {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

/// A shipped Envoy example rendered for this test's ports (checked: no fixed listener or admin
/// port left, every backend listed); `edit` may change anything else (see [`replaced`]).
pub fn render_envoy(
    file: &str,
    picker_port: u16,
    backends: &[SocketAddr],
    edit: impl Fn(String) -> String,
) -> String {
    let text = std::fs::read_to_string(root().join("envoy").join(file)).unwrap();
    let rendered = testkit::render_envoy(&text, picker_port, backends);
    for fixed in ["port_value: 10000", "port_value: 9901"] {
        assert!(!rendered.contains(fixed), "{file}: {fixed} not rendered");
    }
    if text.contains("port_value: 800") {
        for b in backends {
            let endpoint = format!("address: {}, port_value: {}}}", b.ip(), b.port());
            assert!(
                rendered.contains(&endpoint),
                "{file}: backend {b} not rendered"
            );
        }
    }
    edit(rendered)
}

/// `text` with every `from` replaced by `to`; panics when `from` does not occur, so an edit of
/// a shipped file that no longer matches fails instead of testing the unedited file.
pub fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "edit did not match: {from:?} is not in the text"
    );
    text.replace(from, to)
}

pub async fn start_envoy(config: String) -> Envoy {
    let dir = tempfile::tempdir().unwrap();
    let process = testkit::start_envoy(&envoy_bin(), dir.path(), &config)
        .await
        .unwrap();
    Envoy {
        port: process.port,
        process,
        dir,
    }
}

// ---------------------------------------------------------------- simulators

/// A model-sim pod in-process (the same code as the `model-sim` binary).
pub struct Sim {
    pub name: String,
    pub addr: SocketAddr,
    pub engine: Arc<model_sim::engine::Engine>,
}

impl Sim {
    pub async fn start(name: &str, config: model_sim::engine::EngineConfig) -> Sim {
        Sim::serve(name, model_sim::engine::Engine::new(config)).await
    }

    /// A sim publishing vLLM's KV events on loopback ports the system chose (and serving
    /// `/tokenize`).
    pub async fn start_with_events(name: &str, config: model_sim::engine::EngineConfig) -> Sim {
        Sim::start_with_events_on(name, config, "").await
    }

    /// [`Sim::start_with_events`] publishing on `topic`.
    pub async fn start_with_events_on(
        name: &str,
        config: model_sim::engine::EngineConfig,
        topic: &str,
    ) -> Sim {
        use model_sim::{engine::Engine, kv_events::KvEventsConfig};
        let config = model_sim::engine::EngineConfig {
            kv_events: KvEventsConfig {
                enable_kv_cache_events: true,
                // vLLM's rule: an address with `*` is bound (the port the system chose).
                endpoint: "tcp://*:0".into(),
                replay_endpoint: Some("tcp://*:0".into()),
                topic: topic.into(),
                ..KvEventsConfig::default()
            },
            ..config
        };
        Sim::serve(name, Engine::start(config).await.unwrap()).await
    }

    /// Serves `engine` over HTTP on a loopback port the system chose.
    async fn serve(name: &str, engine: model_sim::engine::Engine) -> Sim {
        Sim::serve_models(name, engine, None, &[]).await
    }

    /// A sim serving base model `model` and the LoRA `adapters` (listed by `GET /v1/models`).
    pub async fn start_with_adapters(
        name: &str,
        config: model_sim::engine::EngineConfig,
        model: &str,
        adapters: &[&str],
    ) -> Sim {
        let engine = model_sim::engine::Engine::new(config);
        Sim::serve_models(name, engine, Some(model), adapters).await
    }

    async fn serve_models(
        name: &str,
        engine: model_sim::engine::Engine,
        model: Option<&str>,
        adapters: &[&str],
    ) -> Sim {
        use model_sim::server;
        let engine = Arc::new(engine);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = server::app(
            server::SimConfig {
                name: name.to_string(),
                model: model.map(str::to_string),
                lora_adapters: adapters.iter().map(|a| a.to_string()).collect(),
                max_loras: 1,
                default_max_tokens: 1,
                seed: 0,
            },
            engine.clone(),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Sim {
            name: name.to_string(),
            addr,
            engine,
        }
    }

    /// This sim as a static endpoint, with its event sockets when it publishes.
    pub fn endpoint_yaml(&self) -> String {
        let mut line = format!(
            "- {{name: {}, namespace: default, address: \"{}\"",
            self.name, self.addr
        );
        let loopback = |bound: &str| bound.replace("0.0.0.0", "127.0.0.1");
        if let Some(p) = self.engine.kv_events() {
            let e = loopback(p.endpoint());
            line.push_str(&format!(", kvEventsEndpoint: \"{e}\""));
            if let Some(r) = p.replay_endpoint() {
                let r = loopback(r);
                line.push_str(&format!(", kvEventsReplayEndpoint: \"{r}\""));
            }
        }
        line.push_str("}\n");
        line
    }
}

pub fn sims_config(sims: &[Sim], extra: &str) -> Config {
    use testkit::{endpoints_yaml, scheduler_section};
    let mut doc =
        scheduler_section(include_str!("../fixtures/kthena-router-config.yaml")).to_string();
    doc.push_str(&endpoints_yaml(
        sims.iter().map(|s| (s.name.as_str(), s.addr)),
    ));
    doc.push_str(extra);
    Config::parse(&doc).unwrap()
}

/// Envoy with the recommended `envoy/envoy.yaml` (routing filter + access log), routing to `sims`
/// through `picker`.
pub async fn start_envoy_for_sims(picker: &Running, sims: &[Sim]) -> Envoy {
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.addr).collect();
    start_envoy_for_addrs(picker, &addrs).await
}

/// [`start_envoy_for_sims`] for backends given by address.
pub async fn start_envoy_for_addrs(picker: &Running, addrs: &[SocketAddr]) -> Envoy {
    start_envoy(render_envoy(
        "envoy.yaml",
        picker.grpc_addr.port(),
        addrs,
        |s| s,
    ))
    .await
}

/// Lower-case hex SHA-256 of `text` (the `config_sha256` the picker logs and exports).
pub fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
