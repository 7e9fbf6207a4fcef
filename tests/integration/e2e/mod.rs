//! End to end through a real Envoy 1.40, a module per concern; this file holds their shared set-up
//! (the stack of backends, picker and Envoy, senders, gated streams). The harness is in
//! `crate::harness`.

mod affinity;
mod body_modes;
mod cli;
mod completions;
mod endpoint_picker;
mod engine_truth;
mod engine_truth_faults;
mod failures;
mod flow_control;
mod gie;
mod health;
mod kvcache_aware;
mod load_shedding;
mod logs;
mod lora;
mod messages;
mod pd;
mod reload;
mod replicas;
mod routing;
mod security;
mod sessions;
mod shapes;
mod sync;
mod tls;

use crate::harness::*;
use futures::StreamExt;
use serde_json::{Value, json};

#[derive(Debug)]
struct Reply {
    status: u16,
    served_by: String,
    body: Value,
}

async fn send(envoy: &Envoy, path: &str, body: &Value) -> Reply {
    let r = reqwest::Client::new()
        .post(envoy.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let served_by = r
        .headers()
        .get("x-served-by")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply {
        status,
        served_by,
        body,
    }
}

fn chat(system: &str, user: &str) -> Value {
    json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user}]})
}

async fn three_backends() -> Vec<Backend> {
    vec![
        Backend::start("pod-a").await,
        Backend::start("pod-b").await,
        Backend::start("pod-c").await,
    ]
}

/// Three backends, the picker in-process (with `extra` config) and Envoy with an `envoy/` example.
async fn stack(
    file: &str,
    extra: &str,
    edit: fn(String) -> String,
) -> (Vec<Backend>, serve_alias::Running, Envoy) {
    let backends = three_backends().await;
    let picker = start_picker(picker_config(&backends.iter().collect::<Vec<_>>(), extra)).await;
    let envoy = start_envoy(render_envoy(
        file,
        picker.grpc_addr.port(),
        &addrs(&backends),
        edit,
    ))
    .await;
    (backends, picker, envoy)
}

/// Envoy with `file` from `envoy/` as shipped, routing to `backends` through the picker on
/// `picker_port`.
async fn envoy_for(file: &str, picker_port: u16, backends: &[Backend]) -> Envoy {
    start_envoy(render_envoy(file, picker_port, &addrs(backends), |s| s)).await
}

/// Sends a streamed completion whose backend holds the stream open after its first event (the
/// prompt must contain `GATED`); returns the serving pod and the rest of the stream, once the
/// first event has reached the client.
async fn open_gated_stream(
    envoy: &Envoy,
    body: &Value,
) -> (
    String,
    impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin + use<>,
) {
    open_gated_stream_with(envoy, body, &[]).await
}

/// [`open_gated_stream`] with extra request headers.
async fn open_gated_stream_with(
    envoy: &Envoy,
    body: &Value,
    headers: &[(&str, &str)],
) -> (
    String,
    impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin + use<>,
) {
    let mut request = reqwest::Client::new()
        .post(envoy.url("/v1/completions"))
        .json(body);
    for &(name, value) in headers {
        request = request.header(name, value);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let served = r.headers()["x-served-by"].to_str().unwrap().to_string();
    let mut chunks = r.bytes_stream();
    let first = chunks.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"n\":1"));
    (served, chunks)
}

/// Opens the gate of the backend that holds a GATED stream and reads the stream to `[DONE]`.
async fn finish_gated_stream(
    backends: &[Backend],
    served: &str,
    mut chunks: impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
) {
    backends
        .iter()
        .find(|b| b.name == served)
        .unwrap()
        .gate
        .notify_one();
    let mut rest = Vec::new();
    while let Some(c) = chunks.next().await {
        rest.extend_from_slice(&c.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
}

fn addrs(b: &[Backend]) -> Vec<std::net::SocketAddr> {
    b.iter().map(|b| b.addr).collect()
}

const SYSTEM: &str = "You are a support assistant for Kthena. Answer briefly and include a link to the documentation when possible.";

/// Sends `body` twice through `envoy`: the second lands where the first was served and recorded.
async fn assert_sticky(envoy: &Envoy, picker: &serve_alias::Running, path: &str, body: &Value) {
    // 0 (or absent) before the first completion.
    let recorded = metric_opt(picker, "prefix_picker_records_total")
        .await
        .unwrap_or(0.0);
    let first = send(envoy, path, body).await;
    assert_eq!(first.status, 200, "{:?}\n{}", first.body, envoy.log());
    wait_metric(picker, "prefix_picker_records_total", recorded + 1.0).await;
    assert_eq!(prefix_score(picker, body, &first.served_by).await, 100);
    let second = send(envoy, path, body).await;
    assert_eq!(second.status, 200);
    assert_eq!(
        second.served_by, first.served_by,
        "{path}: same prefix, same pod"
    );
    // The second completion's record too, or it would count as the next call's first.
    wait_metric(picker, "prefix_picker_records_total", recorded + 2.0).await;
}

mod serve_alias {
    pub use prefix_picker::serve::Running;
}
