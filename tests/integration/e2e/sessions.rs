//! Session affinity through Envoy: a session's turns stay on one pod while it has headroom,
//! and move when it is saturated.

use super::{finish_gated_stream, open_gated_stream_with, stack};
use crate::harness::*;
use serde_json::json;

const SESSIONS: &str =
    "picker:\n  affinity: {podCapacity: 2, latencyModel: false}\n  sessions: {enabled: true}\n";

/// Ten turns with unrelated prompts (the affinity mode alone spreads new prompts by share) stay
/// on the session's pod; with that pod at `podCapacity` (two streams held open), the next turn
/// goes elsewhere and the session follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_on_one_pod_until_it_is_saturated() {
    let (backends, picker, envoy) = stack("envoy.yaml", SESSIONS, |s| s).await;
    let client = reqwest::Client::new();
    let turn = |n: usize, session: &'static str| {
        let request = client
            .post(envoy.url("/v1/completions"))
            .header("x-session-id", session)
            .json(&json!({"model": "m", "prompt": format!("turn {n}: {}", "fresh words ".repeat(n + 8))}));
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.headers()["x-served-by"].to_str().unwrap().to_string()
        }
    };
    let mut served = Vec::new();
    for n in 0..10 {
        served.push(turn(n, "conversation-1").await);
    }
    assert!(served.iter().all(|s| *s == served[0]), "{served:?}");
    // A second session is placed by affinity (least share): another pod.
    assert_ne!(turn(10, "conversation-2").await, served[0]);
    wait_metric(
        &picker,
        "prefix_picker_session_requests_total{outcome=\"kept\"}",
        9.0,
    )
    .await;
    // Saturate the session's pod: two streams of the session held open on it.
    let header = [("x-session-id", "conversation-1")];
    let mut open = Vec::new();
    for n in 0..2 {
        let body = json!({"model": "m", "stream": true,
            "prompt": format!("GATED turn {}: {}", 20 + n, "held words ".repeat(n + 3))});
        let (pod, chunks) = open_gated_stream_with(&envoy, &body, &header).await;
        assert_eq!(pod, served[0]);
        open.push((pod, chunks));
    }
    let moved = turn(30, "conversation-1").await;
    assert_ne!(moved, served[0]);
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_session_requests_total{outcome=\"moved\"}"
        )
        .await,
        1.0
    );
    for (pod, chunks) in open {
        finish_gated_stream(&backends, &pod, chunks).await;
    }
    // The session now lives on the pod that took it.
    assert_eq!(turn(31, "conversation-1").await, moved);
    assert_eq!(metric(&picker, "prefix_picker_sessions").await, 2.0);
    // Every turn is recorded like any request.
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        15.0,
    )
    .await;
}
