//! Index sharing through a real Redis: replicas (picker + own Envoy) over the same backends.

use prefix_picker::serve::Running;
use serde_json::Value;

use super::harness::redis_server::RedisServer;
use super::harness::*;
use super::{SYSTEM, addrs, chat, send, three_backends};

/// One gateway replica: a picker and the Envoy in front of it.
struct Replica {
    picker: Running,
    envoy: Envoy,
}

fn sync_section(redis: &RedisServer) -> String {
    format!(
        "sync:\n  redis:\n    url: \"{}\"\n    stream: \"pp:{{test}}\"\n    batchMaxRecords: 8\n",
        redis.url()
    )
}

async fn replica(backends: &[Backend], redis: &RedisServer) -> Replica {
    let picker = start_picker(picker_config(
        &backends.iter().collect::<Vec<_>>(),
        &sync_section(redis),
    ))
    .await;
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        picker.grpc_addr.port(),
        &addrs(backends),
        |s| s,
    ))
    .await;
    Replica { picker, envoy }
}

/// Sends `body` through `from`, then waits until every other replica scores the serving pod 100
/// and checks that each of them routes `body` to that pod.
async fn propagates(from: &Replica, others: &[&Replica], body: &Value) -> String {
    let first = send(&from.envoy, "/v1/chat/completions", body).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    for r in others {
        poll("the record to reach the other replica", || async {
            (prefix_score(&r.picker, body, &first.served_by).await == 100).then_some(())
        })
        .await;
        let again = send(&r.envoy, "/v1/chat/completions", body).await;
        assert_eq!(again.status, 200);
        assert_eq!(again.served_by, first.served_by, "same prefix, same pod");
    }
    first.served_by
}

async fn replicas_share_prefixes(n: usize) {
    let redis = RedisServer::start().await;
    let backends = three_backends().await;
    let mut rs = Vec::new();
    for _ in 0..n {
        rs.push(replica(&backends, &redis).await);
    }
    for (i, from) in rs.iter().enumerate() {
        let others: Vec<&Replica> = rs.iter().filter(|r| !std::ptr::eq(*r, from)).collect();
        propagates(
            from,
            &others,
            &chat(SYSTEM, &format!("question {i} via replica {i}")),
        )
        .await;
    }
    for r in &rs {
        // Every request was recorded and published (one per replica per round), and each replica
        // applied everyone else's.
        wait_metric_eq(&r.picker, "prefix_picker_sync_published_total", n as f64).await;
        wait_metric_eq(
            &r.picker,
            "prefix_picker_sync_applied_total",
            (n * (n - 1)) as f64,
        )
        .await;
        assert_eq!(
            metric(&r.picker, "prefix_picker_sync_dropped_total").await,
            0.0
        );
        assert_eq!(
            metric(&r.picker, "prefix_picker_sync_redis_connected").await,
            2.0
        );
    }
    for r in rs {
        r.picker.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_route_a_prefix_to_the_same_pod() {
    replicas_share_prefixes(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_route_a_prefix_to_the_same_pod() {
    replicas_share_prefixes(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_routes_warm_from_its_first_request() {
    let redis = RedisServer::start().await;
    let backends = three_backends().await;
    let a = replica(&backends, &redis).await;
    let prompts: Vec<Value> = (0..6)
        .map(|i| chat(SYSTEM, &format!("warm start question {i}")))
        .collect();
    let mut served = Vec::new();
    for p in &prompts {
        let r = send(&a.envoy, "/v1/chat/completions", p).await;
        assert_eq!(r.status, 200);
        served.push(r.served_by);
    }
    wait_metric(&a.picker, "prefix_picker_sync_published_total", 6.0).await;
    a.picker.stop().await.unwrap();
    drop(a.envoy);

    // A new process (new replica id): start() returns once the warm replay is applied.
    let b = replica(&backends, &redis).await;
    assert_eq!(
        metric(&b.picker, "prefix_picker_sync_replayed_total").await,
        6.0
    );
    assert_eq!(
        metric(&b.picker, "prefix_picker_sync_applied_total").await,
        6.0
    );
    assert!(metric(&b.picker, "prefix_picker_sync_replay_seconds").await > 0.0);
    let ready = reqwest::get(format!("http://{}/readyz", b.picker.admin_addr))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    for (p, pod) in prompts.iter().zip(&served) {
        let r = send(&b.envoy, "/v1/chat/completions", p).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            &r.served_by, pod,
            "first request after restart goes to the warm pod"
        );
    }
    b.picker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_fails_no_request_and_sync_resumes() {
    let mut redis = RedisServer::start().await;
    let backends = three_backends().await;
    let a = replica(&backends, &redis).await;
    let b = replica(&backends, &redis).await;
    propagates(&a, &[&b], &chat(SYSTEM, "before the outage")).await;

    redis.kill();
    for i in 0..20 {
        for r in [&a, &b] {
            let reply = send(
                &r.envoy,
                "/v1/chat/completions",
                &chat(SYSTEM, &format!("outage {i}")),
            )
            .await;
            assert_eq!(reply.status, 200, "routing goes on without Redis");
        }
    }
    for r in [&a, &b] {
        wait_metric(
            &r.picker,
            "prefix_picker_sync_dropped_total{reason=\"redis_error\"}",
            1.0,
        )
        .await;
        wait_metric_eq(&r.picker, "prefix_picker_sync_redis_connected", 0.0).await;
    }

    redis.restart().await;
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, "prefix_picker_sync_redis_connected", 2.0).await;
    }
    let pod = propagates(&a, &[&b], &chat(SYSTEM, "after the outage")).await;
    assert!(!pod.is_empty());
    propagates(&b, &[&a], &chat(SYSTEM, "after the outage, the other way")).await;
    a.picker.stop().await.unwrap();
    b.picker.stop().await.unwrap();
}
