//! How completions come back (the access log or the observer filter) and what they record: observer
//! streams closed by the picker, failed responses, reused request ids, client aborts, a pod leaving
//! with a request in flight, and routes expiring after `responseTimeoutSeconds`.

use super::{
    SYSTEM, chat, finish_gated_stream, open_gated_stream, open_gated_stream_with, send, stack,
};
use crate::harness::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// The picker ends each stream once the response is complete, so Envoy does not hold the
/// observability-mode stream open for `deferred_close_timeout` (5 s): with the picker cluster
/// limited to 5 concurrent streams, 12 requests in a row (2 streams each) all succeed and are all
/// recorded. Before the fix the held streams overflowed the breaker within a few requests: the
/// (fail-open) observer streams were refused, so completions went unrecorded, and under more load
/// the routing streams too (500s, seen in the soak test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_streams_are_closed_by_the_picker() {
    let (_backends, picker, envoy) = stack("envoy-observer.yaml", "", |s| {
        // The example lifts the breaker; the test lowers it again.
        replaced(&s, "max_requests: 40000", "max_requests: 5")
    })
    .await;
    for i in 0..12 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(SYSTEM, &format!("question {i}")),
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {:?}\n{}", r.body, envoy.log());
    }
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        12.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_response_records_nothing() {
    let (_backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    let body = json!({"model": "m", "prompt": "FAIL-500 please"});
    let r = send(&envoy, "/v1/completions", &body).await;
    assert_eq!(r.status, 500);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"failed\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "kthena_router_prefix_cache_entries").await,
        0.0
    );
    assert_eq!(prefix_score(&picker, &body, &r.served_by).await, 0);
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
}

/// Two requests in flight with the same client-supplied `x-request-id`: each completion is
/// recorded for its own prompt and pod (the picker tells them apart by the route key it puts in
/// the `envoy.lb` metadata, which Envoy logs and forwards to the observer filter).
async fn reused_request_ids(file: &str) {
    let (backends, picker, envoy) = stack(file, "", |s| s).await;
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";
    let id = [("x-request-id", "client-reuses-this-id")];
    let first =
        json!({"model": "m", "stream": true, "prompt": "GATED first request with a reused id"});
    let (first_pod, chunks) = open_gated_stream_with(&envoy, &first, &id).await;
    let second =
        json!({"model": "m", "prompt": "second request with the same id, and its own prompt"});
    let r = reqwest::Client::new()
        .post(envoy.url("/v1/completions"))
        .header(id[0].0, id[0].1)
        .json(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let second_pod = r.headers()["x-served-by"].to_str().unwrap().to_string();
    wait_metric(&picker, recorded, 1.0).await;
    assert_eq!(prefix_score(&picker, &second, &second_pod).await, 100);
    assert_eq!(
        prefix_score(&picker, &first, &first_pod).await,
        0,
        "still streaming"
    );
    finish_gated_stream(&backends, &first_pod, chunks).await;
    wait_metric(&picker, recorded, 2.0).await;
    assert_eq!(prefix_score(&picker, &first, &first_pod).await, 100);
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_request_ids_are_told_apart_in_the_access_log() {
    reused_request_ids("envoy.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_request_ids_are_told_apart_by_the_observer() {
    reused_request_ids("envoy-observer.yaml").await;
}

/// A client that goes away mid-stream: the completion source (access log or observer filter)
/// reports an abort, nothing is recorded and the pod's in-flight count is released.
async fn client_abort_records_nothing(file: &str) {
    let (backends, picker, envoy) = stack(file, "", |s| s).await;
    let body = json!({"model": "m", "stream": true, "prompt": "GATED and then the client leaves"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;
    drop(chunks);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"aborted\"}",
        1.0,
    )
    .await;
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        0.0
    );
    assert_eq!(prefix_score(&picker, &body, &served).await, 0);
    // Let the backend finish its side.
    backends
        .iter()
        .find(|b| b.name == served)
        .unwrap()
        .gate
        .notify_one();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abort_seen_in_the_access_log_records_nothing() {
    client_abort_records_nothing("envoy.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abort_seen_by_the_observer_records_nothing() {
    client_abort_records_nothing("envoy-observer.yaml").await;
}

/// A pod that leaves the endpoint set while a request to it is in flight (discovery's `Remove`,
/// as Kubernetes discovery sends for a deleted pod): its per-pod series go at once and do not
/// come back when the request ends (Envoy then names an address outside the set: `unknown_pod`,
/// nothing recorded); the pod coming back starts anew and is routed to again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_leaving_with_a_request_in_flight_takes_its_series_along() {
    use prefix_picker::endpoints::{PodId, Update};
    let (backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    let body = json!({"model": "m", "stream": true, "prompt": "GATED while its pod leaves"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;
    let inflight = format!(
        "prefix_picker_pod_inflight_requests{{model_server_namespace=\"default\",model_server_pod=\"{served}\"}}"
    );
    let picks = format!(
        "prefix_picker_pod_picks_total{{model_server_namespace=\"default\",model_server_pod=\"{served}\"}}"
    );
    assert_eq!(metric(&picker, &inflight).await, 1.0);
    assert_eq!(metric(&picker, &picks).await, 1.0);
    let id = PodId {
        namespace: "default".into(),
        name: served.clone(),
    };
    let spec = picker
        .router
        .endpoints
        .snapshot()
        .all()
        .iter()
        .find(|e| e.spec.id == id)
        .unwrap()
        .spec
        .clone();
    let left = picker.router.endpoints.apply(Update::Remove(id.clone()));
    assert_eq!(left, [id]);
    // (Shown to exist just above, so absence is not a renamed metric.)
    assert_eq!(metric_opt(&picker, &inflight).await, None);
    assert_eq!(metric_opt(&picker, &picks).await, None);
    finish_gated_stream(&backends, &served, chunks).await;
    wait_metric_eq(
        &picker,
        "prefix_picker_records_total{outcome=\"unknown_pod\"}",
        1.0,
    )
    .await;
    assert_eq!(metric_opt(&picker, &inflight).await, None, "not recreated");
    assert_eq!(metric_opt(&picker, &picks).await, None, "not recreated");
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        0.0
    );
    // Back (a new incarnation): its series start anew with its first pick.
    picker.router.endpoints.apply(Update::add(spec));
    let mut n = 0;
    poll("the returning pod to be picked", || {
        n += 1;
        let body = chat(SYSTEM, &format!("after the return {n}"));
        let (envoy, served) = (&envoy, &served);
        async move {
            let r = send(envoy, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200);
            (r.served_by == *served).then_some(())
        }
    })
    .await;
    wait_metric_eq(&picker, &picks, 1.0).await;
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
}

/// A response that never completes in time (the backend holds its stream open): when its
/// pending route expires, `records_total{outcome="expired"}` counts it and the pod's in-flight
/// count is returned while the stream is still open; the access-log entry that comes when the
/// stream ends claims nothing and records nothing. In the affinity mode the request's
/// decision-time record is released as `expired`. The route is expired by the picker's own
/// expiry step (what its ticker runs every second) called with a clock past
/// `responseTimeoutSeconds` (600 s, the default: nothing expires while the test looks at the
/// waiting route, however slow the machine). The ticker itself: the next test.
async fn an_unfinished_response_expires(picker_section: &str, affinity: bool) {
    use prefix_picker::routing::pending::Expired;
    let (backends, picker, envoy) = stack("envoy.yaml", picker_section, |s| s).await;
    let body = json!({"model": "m", "stream": true, "prompt": "GATED and held past the timeout"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;
    let pod_inflight = format!(
        "prefix_picker_pod_inflight_requests{{model_server_namespace=\"default\",model_server_pod=\"{served}\"}}"
    );
    // The route waits for the access log (the routing stream ended with the request), holding
    // the prompt in the affinity mode (both gauges sampled together, every second).
    poll("the route waiting", || async {
        let text = exposition(&picker).await;
        let holds = sample(&text, "prefix_picker_tentative_holds");
        (sample(&text, "prefix_picker_pending_routes") == Some(1.0)
            && holds == Some(if affinity { 1.0 } else { 0.0 }))
        .then_some(())
    })
    .await;
    assert_eq!(metric(&picker, &pod_inflight).await, 1.0);
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"expired\"}").await,
        0.0
    );
    let timeout = Duration::from_secs(picker.router.config.response_timeout_seconds);
    let expired = picker.router.expire_pending(Instant::now() + timeout);
    assert_eq!(
        expired,
        Expired {
            routes: 1,
            tentative: usize::from(affinity)
        }
    );
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"expired\"}").await,
        1.0
    );
    assert_eq!(metric(&picker, &pod_inflight).await, 0.0);
    wait_metric_eq(&picker, "prefix_picker_pending_routes", 0.0).await;
    if affinity {
        // The decision-time record is released as expired: nothing is held or recorded.
        assert_eq!(
            metric(
                &picker,
                "prefix_picker_tentative_records_total{outcome=\"expired\"}"
            )
            .await,
            1.0
        );
        wait_metric_eq(&picker, "prefix_picker_tentative_holds", 0.0).await;
        assert_eq!(
            metric(&picker, "kthena_router_prefix_cache_entries").await,
            0.0
        );
    }
    finish_gated_stream(&backends, &served, chunks).await;
    wait_metric_eq(
        &picker,
        "prefix_picker_access_log_entries_total{result=\"unclaimed\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        0.0
    );
    assert_eq!(prefix_score(&picker, &body, &served).await, 0);
    assert_eq!(metric(&picker, &pod_inflight).await, 0.0, "released once");
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"expired\"}").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_response_expires_after_the_response_timeout() {
    an_unfinished_response_expires("", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_releases_the_hold_of_an_expired_route() {
    an_unfinished_response_expires(shipped_picker_section(), true).await;
}

/// The ticker expires a route on the clock: with `responseTimeoutSeconds: 1` the route of a
/// stream held open expires by itself, releasing the pod's in-flight count before the stream
/// ends (waited for with the harness's deadline; the state before expiry is the test above's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ticker_expires_routes_after_the_response_timeout() {
    let (backends, picker, envoy) =
        stack("envoy.yaml", "picker: {responseTimeoutSeconds: 1}\n", |s| s).await;
    let body = json!({"model": "m", "stream": true, "prompt": "GATED and held past the timeout"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;
    let pod_inflight = format!(
        "prefix_picker_pod_inflight_requests{{model_server_namespace=\"default\",model_server_pod=\"{served}\"}}"
    );
    wait_metric_eq(
        &picker,
        "prefix_picker_records_total{outcome=\"expired\"}",
        1.0,
    )
    .await;
    assert_eq!(metric(&picker, &pod_inflight).await, 0.0);
    wait_metric_eq(&picker, "prefix_picker_pending_routes", 0.0).await;
    finish_gated_stream(&backends, &served, chunks).await;
    wait_metric_eq(
        &picker,
        "prefix_picker_access_log_entries_total{result=\"unclaimed\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        0.0
    );
    assert_eq!(metric(&picker, &pod_inflight).await, 0.0, "released once");
}
