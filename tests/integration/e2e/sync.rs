//! Index sharing through a real Redis: replicas (picker + own Envoy) over the same backends, with
//! one `redis-server`, or a Redis Cluster of three primaries whose stream lives on a shard other
//! than the seed node and then moves to another one.

use std::net::SocketAddr;
use std::sync::Arc;

use prefix_picker::config::Config;
use prefix_picker::serve::Running;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{SYSTEM, addrs, chat, send, three_backends};
use crate::harness::redis_server::{RedisCluster, RedisServer};
use crate::harness::*;

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

async fn replica(backends: &[Backend], sync: &str) -> Replica {
    let picker = start_picker(picker_config(&backends.iter().collect::<Vec<_>>(), sync)).await;
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
        rs.push(replica(&backends, &sync_section(&redis)).await);
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
    let a = replica(&backends, &sync_section(&redis)).await;
    let prompts: Vec<Value> = (0..6)
        .map(|i| chat(SYSTEM, &format!("warm start question {i}")))
        .collect();
    let mut served = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let r = send(&a.envoy, "/v1/chat/completions", p).await;
        assert_eq!(r.status, 200);
        served.push(r.served_by);
        // The prompts share their blocks: each routes by the records (and in-flight counts) of
        // those before it, which land just after the client has its response (the access log
        // follows the stream's end).
        wait_metric(
            &a.picker,
            "prefix_picker_records_total{outcome=\"recorded\"}",
            i as f64 + 1.0,
        )
        .await;
    }
    wait_metric(&a.picker, "prefix_picker_sync_published_total", 6.0).await;
    a.picker.stop().await.unwrap();
    drop(a.envoy);

    // A new process (new replica id): start() returns once the warm replay is applied. Its
    // tie-break seed differs from the first replica's, so a cold start would not repeat the
    // first replica's picks: only the replayed records can send these prompts to the same pods.
    let b = replica(
        &backends,
        &format!("{}picker: {{seed: 7}}\n", sync_section(&redis)),
    )
    .await;
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
    // Before any request through it, the new replica holds every prompt for the pod that
    // served it, from the replay alone.
    for (p, pod) in prompts.iter().zip(&served) {
        assert_eq!(prefix_score(&b.picker, p, pod).await, 100, "replayed: {p}");
    }
    for (i, (p, pod)) in prompts.iter().zip(&served).enumerate() {
        let r = send(&b.envoy, "/v1/chat/completions", p).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            &r.served_by, pod,
            "first request after restart goes to the warm pod"
        );
        // Its completion releases the pod's in-flight count (least-request) before the next.
        wait_metric(
            &b.picker,
            "prefix_picker_records_total{outcome=\"recorded\"}",
            i as f64 + 1.0,
        )
        .await;
    }
    b.picker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_fails_no_request_and_sync_resumes() {
    let mut redis = RedisServer::start().await;
    let backends = three_backends().await;
    let a = replica(&backends, &sync_section(&redis)).await;
    let b = replica(&backends, &sync_section(&redis)).await;
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

/// Waits until `r` has published `n` records in all or dropped one as `redis_error`, then
/// asserts that it dropped none.
async fn published_without_loss(r: &Replica, n: f64) {
    let dropped = "prefix_picker_sync_dropped_total{reason=\"redis_error\"}";
    poll(
        &format!("{n} records published, or one dropped"),
        || async {
            (metric(&r.picker, "prefix_picker_sync_published_total").await >= n
                || metric(&r.picker, dropped).await > 0.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(metric(&r.picker, dropped).await, 0.0, "a record was lost");
    assert_eq!(
        metric(&r.picker, "prefix_picker_sync_published_total").await,
        n
    );
}

/// Redis restarts while the publishers are idle (issue 26). A record sent right after a
/// restart the publisher has not noticed yet is resent on a fresh connection, not dropped; and
/// over a longer outage an idle publisher notices the dead connection by itself (its gauge falls
/// to 0), reconnects once Redis is back, before any record, and again loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_publisher_loses_no_record_across_a_redis_restart() {
    let mut redis = RedisServer::start().await;
    let backends = three_backends().await;
    let a = replica(&backends, &sync_section(&redis)).await;
    let b = replica(&backends, &sync_section(&redis)).await;
    let publisher_up = "prefix_picker_sync_redis_connected{role=\"publisher\"}";
    let publisher_connects = "prefix_picker_sync_redis_connects_total{role=\"publisher\"}";
    propagates(&a, &[&b], &chat(SYSTEM, "before the restart")).await;
    for r in [&a, &b] {
        published_without_loss(r, 1.0).await;
    }

    // Killed and back at once (a restart takes milliseconds here; the publishers sat idle).
    redis.kill();
    redis.restart().await;
    let first = send(
        &a.envoy,
        "/v1/chat/completions",
        &chat(SYSTEM, "right after the restart"),
    )
    .await;
    assert_eq!(first.status, 200);
    published_without_loss(&a, 2.0).await;
    assert_eq!(metric(&a.picker, publisher_connects).await, 2.0);
    // The record reached the stream of the restarted Redis, hence the other replica.
    poll("the record to reach the other replica", || async {
        (prefix_score(
            &b.picker,
            &chat(SYSTEM, "right after the restart"),
            &first.served_by,
        )
        .await
            == 100)
            .then_some(())
    })
    .await;

    // A longer outage: nothing is routed, yet each publisher's gauge tells the truth.
    redis.kill();
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, publisher_up, 0.0).await;
    }
    redis.restart().await;
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, publisher_up, 1.0).await;
    }
    propagates(&b, &[&a], &chat(SYSTEM, "after the idle outage")).await;
    published_without_loss(&a, 3.0).await;
    published_without_loss(&b, 2.0).await;
    a.picker.stop().await.unwrap();
    b.picker.stop().await.unwrap();
}

/// A static pod whose engine can restart: a fixed address forwarding TCP to the current
/// model-sim. A restart starts a new sim (a new `process_start_time_seconds`, an empty KV cache)
/// and cuts the connections to the old one, as a process restart would.
struct RestartablePod {
    name: String,
    addr: SocketAddr,
    current: Arc<parking_lot::Mutex<(SocketAddr, CancellationToken)>>,
}

fn fast_engine() -> model_sim::engine::EngineConfig {
    model_sim::engine::EngineConfig {
        time_scale: 100.0,
        ..Default::default()
    }
}

impl RestartablePod {
    async fn start(name: &str) -> RestartablePod {
        let sim = Sim::start(name, fast_engine()).await;
        let current = Arc::new(parking_lot::Mutex::new((
            sim.addr,
            CancellationToken::new(),
        )));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let route = current.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (to, cut) = route.lock().clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = cut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        RestartablePod {
            name: name.to_string(),
            addr,
            current,
        }
    }

    async fn restart(&self) {
        let sim = Sim::start(&self.name, fast_engine()).await;
        let (_, cut) = std::mem::replace(
            &mut *self.current.lock(),
            (sim.addr, CancellationToken::new()),
        );
        cut.cancel();
    }
}

/// Sends `body` through `envoy` to the pod at `pod` (the test selection header).
async fn send_to(envoy: &Envoy, pod: SocketAddr, body: &Value) -> String {
    let r = reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .header("test-epp-endpoint-selection", pod.to_string())
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.headers()["x-served-by"].to_str().unwrap().to_string()
}

/// Static endpoints have no `generation:` here: each replica takes the engine's
/// `process_start_time_seconds` (issue 26). Replica A records on pods P and Q; P's engine
/// restarts; a replica B started afterwards replays the stream and drops P's records of the
/// earlier life (stale generation) while applying Q's, then applies what P serves in its new
/// life. A, live, starts P cold on seeing the new start time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_static_pod_gets_no_record_of_its_earlier_life() {
    let redis = RedisServer::start().await;
    let (p, q) = (
        RestartablePod::start("pod-p").await,
        RestartablePod::start("pod-q").await,
    );
    let config = || {
        let mut doc =
            testkit::endpoints_yaml([(p.name.as_str(), p.addr), (q.name.as_str(), q.addr)]);
        doc.push_str(&sync_section(&redis));
        doc.push_str("picker: {allowTestEndpointSelection: true, scrapeIntervalSeconds: 0.1}\n");
        Config::parse(&doc).unwrap()
    };
    let a = start_picker(config()).await;
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        a.grpc_addr.port(),
        &[p.addr, q.addr],
        |s| s,
    ))
    .await;
    let on_p: Vec<Value> = (0..2)
        .map(|i| chat(SYSTEM, &format!("earlier life of P {i}")))
        .collect();
    let on_q: Vec<Value> = (0..2)
        .map(|i| chat(SYSTEM, &format!("only life of Q {i}")))
        .collect();
    for body in &on_p {
        assert_eq!(send_to(&envoy, p.addr, body).await, "pod-p");
    }
    for body in &on_q {
        assert_eq!(send_to(&envoy, q.addr, body).await, "pod-q");
    }
    wait_metric_eq(&a, "prefix_picker_sync_published_total", 4.0).await;

    p.restart().await;
    // B, started after the restart, replays the stream once it has scraped both engines
    // (start() returns when ready).
    let b = start_picker(config()).await;
    assert_eq!(metric(&b, "prefix_picker_sync_replayed_total").await, 4.0);
    assert_eq!(
        metric(
            &b,
            "prefix_picker_sync_dropped_total{reason=\"stale_generation\"}"
        )
        .await,
        2.0
    );
    assert_eq!(metric(&b, "prefix_picker_sync_applied_total").await, 2.0);
    for body in &on_p {
        assert_eq!(prefix_score(&b, body, "pod-p").await, 0, "earlier life");
    }
    for body in &on_q {
        assert_eq!(prefix_score(&b, body, "pod-q").await, 100);
    }

    // A sees the new start time at its next scrape (0.1 s) and forgets what P held.
    for body in &on_p {
        poll("A to start the restarted pod cold", || async {
            (prefix_score(&a, body, "pod-p").await == 0).then_some(())
        })
        .await;
    }
    assert_eq!(prefix_score(&a, &on_q[0], "pod-q").await, 100);

    // P's new life is shared as usual.
    let new_life = chat(SYSTEM, "new life of P");
    assert_eq!(send_to(&envoy, p.addr, &new_life).await, "pod-p");
    poll("P's new record to reach B", || async {
        (prefix_score(&b, &new_life, "pod-p").await == 100).then_some(())
    })
    .await;
    assert_eq!(
        metric(
            &b,
            "prefix_picker_sync_dropped_total{reason=\"stale_generation\"}"
        )
        .await,
        2.0
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Records published through A reach B through a Redis Cluster (password required, one seed):
/// the stream's slot is served by another node than the seed, then moves to a third node, and the
/// replicas go on sharing without a dropped record (MOVED/ASK followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_prefixes_through_a_redis_cluster() {
    let cluster = RedisCluster::start(3, Some("cluster-secret")).await;
    let mut stream = String::new();
    let mut slot = 0;
    for i in 0.. {
        stream = format!("pp:{{cluster-{i}}}");
        slot = cluster.key_slot(&stream).await;
        if cluster.owner(slot) != 0 {
            break;
        }
    }
    let owner = cluster.owner(slot);
    let password = cluster.dir.path().join("password");
    std::fs::write(&password, "cluster-secret\n").unwrap();
    let sync = format!(
        "sync:\n  redis:\n    url: \"{}\"\n    cluster: true\n    passwordFile: \"{}\"\n    \
         stream: \"{stream}\"\n    batchMaxRecords: 8\n",
        cluster.url(0),
        password.display()
    );
    let backends = three_backends().await;
    let a = replica(&backends, &sync).await;
    let b = replica(&backends, &sync).await;
    propagates(&a, &[&b], &chat(SYSTEM, "cluster question via A")).await;
    propagates(&b, &[&a], &chat(SYSTEM, "cluster question via B")).await;

    // The stream is one key on the shard owning its tag's slot; the seed holds nothing.
    let xlen = |node: usize| {
        let (cluster, stream) = (&cluster, &stream);
        async move {
            let n: u64 = redis::cmd("XLEN")
                .arg(stream)
                .query_async(&mut cluster.connection(node).await)
                .await
                .unwrap();
            n
        }
    };
    let dbsize = |node: usize| {
        let cluster = &cluster;
        async move {
            let n: u64 = redis::cmd("DBSIZE")
                .query_async(&mut cluster.connection(node).await)
                .await
                .unwrap();
            n
        }
    };
    // Each round publishes two records (the request through one replica, then the same request
    // through the other, which checks the routing).
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, "prefix_picker_sync_published_total", 2.0).await;
    }
    assert_eq!(xlen(owner).await, 4);
    assert_eq!(dbsize(0).await, 0, "the seed node holds no key");

    // Reshard: the pickers' slot maps are now stale, so their next commands are redirected.
    let to = if owner == 1 { 2 } else { 1 };
    cluster.move_slot(slot, owner, to).await;
    assert_eq!(dbsize(owner).await, 0);
    propagates(&a, &[&b], &chat(SYSTEM, "after the reshard via A")).await;
    propagates(&b, &[&a], &chat(SYSTEM, "after the reshard via B")).await;
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, "prefix_picker_sync_published_total", 4.0).await;
    }
    assert_eq!(xlen(to).await, 8, "new records landed on the new owner");
    assert_eq!(dbsize(owner).await, 0);
    assert_eq!(dbsize(0).await, 0);
    // The old owner redirected the pickers (its error stats count the MOVED replies it sent), and
    // they followed within their connections: one connect per role, none lost.
    let errorstats: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(&mut cluster.connection(owner).await)
        .await
        .unwrap();
    assert!(
        errorstats.contains("errorstat_MOVED:count="),
        "{errorstats}"
    );

    for r in [&a, &b] {
        wait_metric_eq(&r.picker, "prefix_picker_sync_applied_total", 4.0).await;
        assert_eq!(
            metric(&r.picker, "prefix_picker_sync_dropped_total").await,
            0.0
        );
        wait_metric_eq(&r.picker, "prefix_picker_sync_redis_connected", 2.0).await;
        assert_eq!(
            metric(&r.picker, "prefix_picker_sync_redis_connects_total").await,
            2.0
        );
    }
    a.picker.stop().await.unwrap();
    b.picker.stop().await.unwrap();
}

/// The primary holding the stream dies: no request fails, every record made meanwhile is
/// published (resent after a reconnect) or dropped and counted, and once its replica is
/// promoted both replicas publish and apply again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_follows_a_redis_cluster_failover() {
    let mut cluster = RedisCluster::start(3, None).await;
    let stream = "pp:{failover}";
    let slot = cluster.key_slot(stream).await;
    let owner = cluster.owner(slot);
    let replica_node = cluster.add_replica(owner).await;
    // Seeds: every primary but the one that will die (a list that survives losing any one node).
    let seeds: Vec<String> = (0..3)
        .filter(|&i| i != owner)
        .map(|i| format!("\"{}\"", cluster.url(i)))
        .collect();
    let sync = format!(
        "sync:\n  redis:\n    urls: [{}]\n    cluster: true\n    stream: \"{stream}\"\n    \
         batchMaxRecords: 8\n",
        seeds.join(", ")
    );
    let backends = three_backends().await;
    let a = replica(&backends, &sync).await;
    let b = replica(&backends, &sync).await;
    propagates(&a, &[&b], &chat(SYSTEM, "before the failover")).await;

    cluster.kill(owner);
    for i in 0..10 {
        for r in [&a, &b] {
            let reply = send(
                &r.envoy,
                "/v1/chat/completions",
                &chat(SYSTEM, &format!("during the failover {i}")),
            )
            .await;
            assert_eq!(reply.status, 200, "routing goes on during the failover");
        }
    }
    cluster.wait_serves(replica_node, slot).await;
    // Every record made during the failover is accounted for: published (a failed batch is
    // resent once on a fresh connection, which may find the promoted replica) or dropped and
    // counted; none vanishes.
    for r in [&a, &b] {
        poll("every record published or counted as dropped", || async {
            let text = exposition(&r.picker).await;
            let get = |series: &str| sample(&text, series).unwrap_or(0.0);
            let recorded = get("prefix_picker_records_total{outcome=\"recorded\"}");
            let accounted = get("prefix_picker_sync_published_total")
                + get("prefix_picker_sync_dropped_total{reason=\"redis_error\"}")
                + get("prefix_picker_sync_dropped_total{reason=\"queue_full\"}");
            (recorded >= 11.0 && accounted == recorded).then_some(())
        })
        .await;
    }
    // Publishing resumes on the promoted replica: keep sending until a record gets through.
    for r in [&a, &b] {
        let before = metric(&r.picker, "prefix_picker_sync_published_total").await;
        let mut i = 0;
        poll("records to be published again after the failover", || {
            i += 1;
            let body = chat(SYSTEM, &format!("after the failover {i}"));
            async move {
                let reply = send(&r.envoy, "/v1/chat/completions", &body).await;
                assert_eq!(reply.status, 200);
                (metric(&r.picker, "prefix_picker_sync_published_total").await > before)
                    .then_some(())
            }
        })
        .await;
    }
    for r in [&a, &b] {
        wait_metric_eq(&r.picker, "prefix_picker_sync_redis_connected", 2.0).await;
    }
    propagates(&a, &[&b], &chat(SYSTEM, "after the failover via A")).await;
    propagates(&b, &[&a], &chat(SYSTEM, "after the failover via B")).await;
    a.picker.stop().await.unwrap();
    b.picker.stop().await.unwrap();
}
