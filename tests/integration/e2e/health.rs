//! Envoy's active gRPC health checks of the picker cluster (every example under `envoy/`): a
//! ready picker passes them, and a replica that stops being ready (draining here; replaying its
//! index at start-up reports the same `readiness` status) is marked failed, so Envoy sends its
//! new streams to a ready replica when there is one.

use std::time::Duration;

use serde_json::json;

use super::{send, stack};
use crate::harness::*;

/// The health flags Envoy's admin `/clusters` shows for the picker cluster's host.
async fn picker_health(envoy: &Envoy) -> String {
    let text = reqwest::get(format!("http://{}/clusters", envoy.process.admin))
        .await
        .expect("envoy admin answers")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|l| l.starts_with("prefix-picker::") && l.contains("::health_flags::"))
        .map(|l| l.rsplit("::").next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_health_checks_the_picker_and_fails_a_replica_that_is_not_ready() {
    let (_backends, picker, envoy) =
        stack("envoy.yaml", "picker: {shutdownDelaySeconds: 30}\n", |s| s).await;
    let r = send(
        &envoy,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}\n{}", r.body, envoy.log());
    poll("envoy's health check passes on a ready picker", || async {
        (picker_health(&envoy).await == "healthy").then_some(())
    })
    .await;
    // Draining reports `readiness` NOT_SERVING for `shutdownDelaySeconds` before it stops.
    let draining = tokio::spawn(picker.drain());
    poll("envoy's health check fails a draining picker", || async {
        picker_health(&envoy)
            .await
            .contains("failed_active_hc")
            .then_some(())
    })
    .await;
    draining.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), draining).await;
}
