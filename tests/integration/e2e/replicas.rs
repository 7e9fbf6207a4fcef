//! Picker replicas without sync: two replicas behind one gateway record what they routed, once.
//! In every shipped shape the gateway's ext_proc stream carries the request and its response, so
//! the replica that routed a request also sees it end; one replica drained mid-run loses none,
//! one killed outright fails only the requests it held.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prefix_picker::routing::Router;
use serde_json::json;

use super::shapes::Shape;
use super::{SYSTEM, addrs, chat, send, three_backends};
use crate::harness::service::Service;
use crate::harness::*;

/// Two picker replicas behind one Envoy in the GIE shape (one FULL_DUPLEX_STREAMED ext_proc
/// filter, `override_host` on `envoy.lb` metadata), TLS on the gRPC port: Envoy spreads the
/// requests' streams over both, each stream sees its own response, so every completion is
/// recorded once, by the replica that routed it, and no in-flight count or pending route is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_in_the_gie_shape_record_every_completion_once() {
    let backends = three_backends().await;
    let refs: Vec<&Backend> = backends.iter().collect();
    let extra = "picker:\n  tls: {mode: selfSigned}\n  affinity: {}\n";
    let replicas = [
        start_picker(picker_config(&refs, extra)).await,
        start_picker(picker_config(&refs, extra)).await,
    ];
    let second = replicas[1].grpc_addr.port();
    let envoy = start_envoy(render_envoy(
        "envoy-full-duplex.yaml",
        replicas[0].grpc_addr.port(),
        &addrs(&backends),
        move |text| {
            let cluster = text.find("\n  - name: prefix-picker\n").expect("picker cluster");
            let (head, tail) = text.split_at(cluster);
            let tls = "    type: STATIC\n    transport_socket:\n      name: envoy.transport_sockets.tls\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n        sni: localhost\n        common_tls_context: {alpn_protocols: [\"h2\"]}\n";
            assert!(tail.contains("    type: STATIC\n"), "edit matched");
            let tail = tail.replacen("    type: STATIC\n", tls, 1);
            let endpoint = tail
                .lines()
                .find(|l| l.contains("- endpoint: {address: {socket_address: {address: 127.0.0.1"))
                .expect("picker endpoint")
                .to_string();
            let both = format!(
                "{endpoint}\n{}",
                endpoint.replacen(
                    &format!("port_value: {}", endpoint.rsplit("port_value: ").next().unwrap().trim_end_matches("}}}")),
                    &format!("port_value: {second}"),
                    1
                )
            );
            assert_ne!(both.lines().next(), both.lines().nth(1), "second endpoint differs");
            format!("{head}{}", tail.replacen(&endpoint, &both, 1))
        },
    ))
    .await;
    let requests = 24;
    for i in 0..requests {
        let body = chat(SYSTEM, &format!("replica question {}", i % 6));
        let r = send(&envoy, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{r:?}\n{}", envoy.log());
    }
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";
    poll("every completion recorded", || async {
        // A replica that has recorded nothing yet has no such series (checked to exist below).
        let mut total = 0.0;
        for r in &replicas {
            total += metric_opt(r, recorded).await.unwrap_or(0.0);
        }
        (total == f64::from(requests)).then_some(())
    })
    .await;
    for r in &replicas {
        assert!(metric(r, recorded).await > 0.0, "both replicas routed");
        wait_metric_eq(r, "prefix_picker_pod_inflight_requests", 0.0).await;
        assert_eq!(metric(r, "prefix_picker_pending_routes").await, 0.0);
        assert_eq!(
            metric(r, "prefix_picker_records_total{outcome=\"expired\"}").await,
            0.0
        );
        assert_eq!(
            metric(
                r,
                "prefix_picker_tentative_records_total{outcome=\"confirmed\"}"
            )
            .await,
            metric(r, recorded).await
        );
    }
}

/// A picker replica's completion counts, read from its router (a drained replica serves no
/// `/metrics` any more).
fn recorded(router: &Router, outcome: &str) -> u64 {
    router.metrics.records.with_label_values(&[outcome]).get()
}

/// Two replicas of the picker behind `shape`'s gateway; one is drained (SIGTERM: not ready,
/// then closed) while requests are in flight on both. No request fails, and every completion
/// is recorded exactly once, by the replica that routed it: the drained one finishes the
/// streams it had, the survivor takes the rest.
async fn drain_one_replica_mid_run(shape: Shape) {
    let backends = three_backends().await;
    let refs: Vec<&Backend> = backends.iter().collect();
    let extra = format!(
        "picker:\n  tls: {{mode: selfSigned}}\n  affinity: {{}}\n  maxEndpoints: {}\n  \
         shutdownDelaySeconds: 5\n  shutdownGraceSeconds: 60\n",
        shape.max_endpoints()
    );
    let victim = start_picker(picker_config(&refs, &extra)).await;
    let survivor = start_picker(picker_config(&refs, &extra)).await;
    let grpc = [victim.grpc_addr, survivor.grpc_addr];
    let service = Service::start(grpc.to_vec()).await;
    let envoy = start_envoy(shape.bootstrap(&backends, &grpc, service.addr)).await;
    let routers = [victim.router.clone(), survivor.router.clone()];
    let open = |r: &Arc<Router>| r.metrics.inflight_streams.get();

    let gated = hold_streams_on_both(&envoy, &routers, shape).await;
    let mut sent = gated.len() as u64;
    sent += ask(&envoy, "before", 6).await;
    assert!(
        open(&routers[0]) > 0,
        "the victim holds streams when it is drained"
    );

    // SIGTERM to the victim: not ready, then (after the delay) closed to new streams; its open
    // streams go on. Requests sent meanwhile must all succeed on the survivor.
    let (shutdown, victim_admin) = (victim.shutdown.clone(), victim.admin_addr);
    let drained = tokio::spawn(victim.drain());
    // Not ready: the endpoint leaves (kube-proxy's Service; Envoy's health check below).
    poll("the victim reports not ready", || async {
        let r = reqwest::get(format!("http://{victim_admin}/readyz"))
            .await
            .ok()?;
        (r.status().as_u16() == 503).then_some(())
    })
    .await;
    service.set_ready(0, false);
    poll("the victim stops accepting streams", || async {
        shutdown.is_cancelled().then_some(())
    })
    .await;
    if let Shape::IstioPool | Shape::IstioLegacy = shape {
        wait_health_check_failed(&envoy, grpc[0], "Envoy drops the not-ready replica").await;
    }
    sent += ask(&envoy, "during", 12).await;
    let stream = json!({"model": "m", "stream": true, "prompt": format!("{SYSTEM} streamed during the drain")});
    let r = send(&envoy, "/v1/completions", &stream).await;
    assert_eq!(r.status, 200, "{shape:?}: {r:?}");
    sent += 1;
    // Everything but the held streams is recorded, by the replica that routed it (the victim
    // may still have taken a stream on its connection before its GOAWAY arrived).
    let held = gated.len() as u64;
    poll("the completions so far are recorded", || async {
        let total: u64 = routers.iter().map(|r| recorded(r, "recorded")).sum();
        (total == sent - held).then_some(())
    })
    .await;

    // The held streams end: the victim records its own and exits.
    release(&backends, gated, shape).await;
    drained.await.unwrap().unwrap();
    let total: u64 = routers.iter().map(|r| recorded(r, "recorded")).sum();
    assert_eq!(total, sent, "{shape:?}: every completion recorded once");
    for (name, r) in ["victim", "survivor"].iter().zip(&routers) {
        assert!(
            recorded(r, "recorded") > 0,
            "{shape:?}: the {name} recorded"
        );
        assert_eq!(recorded(r, "expired"), 0, "{shape:?}: {name}");
        assert_eq!(r.pending.len(), 0, "{shape:?}: {name}: nothing waits");
        assert_eq!(open(r), 0, "{shape:?}: {name}: no stream left open");
    }
    assert!(
        service
            .connections
            .iter()
            .all(|c| c.load(Ordering::Relaxed) > 0)
            || matches!(shape, Shape::IstioPool | Shape::IstioLegacy),
        "{shape:?}: the Service spread connections over both replicas"
    );
    survivor.stop().await.unwrap();
}

/// Streamed requests held open at their backend (the response's end is gated) until both
/// replicas have some in flight; read in the background, as a BUFFERED response reaches the
/// client only once it has ended.
async fn hold_streams_on_both(
    envoy: &Envoy,
    routers: &[Arc<Router>; 2],
    shape: Shape,
) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    let open = |r: &Arc<Router>| r.metrics.inflight_streams.get();
    let mut gated = Vec::new();
    while open(&routers[0]) == 0 || open(&routers[1]) == 0 {
        assert!(gated.len() < 24, "{shape:?}: both replicas get streams");
        let body = json!({"model": "m", "stream": true,
            "prompt": format!("GATED {SYSTEM} replica stream {}", gated.len())});
        let url = envoy.url("/v1/completions");
        gated.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        }));
        let held = gated.len() as i64;
        poll("the new stream reaches a replica", || async {
            (open(&routers[0]) + open(&routers[1]) == held).then_some(())
        })
        .await;
    }
    gated
}

/// Opens the gates until every held stream has ended, each with a 200 and `[DONE]`.
async fn release(
    backends: &[Backend],
    gated: Vec<tokio::task::JoinHandle<(u16, String)>>,
    shape: Shape,
) {
    poll("the held streams end", || async {
        // Wakes the streams waiting at their gate now; later ones at the next poll.
        for b in backends {
            b.gate.notify_waiters();
        }
        gated.iter().all(|r| r.is_finished()).then_some(())
    })
    .await;
    for r in gated {
        let (status, text) = r.await.unwrap();
        assert_eq!(status, 200, "{shape:?}: {text}");
        assert!(
            text.contains("[DONE]"),
            "{shape:?}: a held stream ended: {text}"
        );
    }
}

/// A Service endpoint that flaps: the first replica leaves the Service and comes back twice
/// while both hold streams. New connections follow the endpoint list, open streams stay where
/// they started, and every completion is recorded once, by the replica that routed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_service_endpoint_loses_no_completion() {
    let shape = Shape::AiGatewayPool { buffered: false };
    let backends = three_backends().await;
    let refs: Vec<&Backend> = backends.iter().collect();
    let extra = "picker:\n  tls: {mode: selfSigned}\n  affinity: {}\n  maxEndpoints: 1\n";
    let replicas = [
        start_picker(picker_config(&refs, extra)).await,
        start_picker(picker_config(&refs, extra)).await,
    ];
    let grpc = [replicas[0].grpc_addr, replicas[1].grpc_addr];
    let service = Service::start(grpc.to_vec()).await;
    let envoy = start_envoy(shape.bootstrap(&backends, &grpc, service.addr)).await;
    let routers = [replicas[0].router.clone(), replicas[1].router.clone()];
    let gated = hold_streams_on_both(&envoy, &routers, shape).await;
    let mut sent = gated.len() as u64;
    for ready in [false, true, false, true] {
        service.set_ready(0, ready);
        sent += ask(&envoy, &format!("flap {ready}"), 6).await;
    }
    release(&backends, gated, shape).await;
    poll("every completion recorded", || async {
        let total: u64 = routers.iter().map(|r| recorded(r, "recorded")).sum();
        (total == sent).then_some(())
    })
    .await;
    for (i, r) in routers.iter().enumerate() {
        assert!(recorded(r, "recorded") > 0, "replica {i} recorded");
        assert_eq!(recorded(r, "expired"), 0, "replica {i}");
        assert_eq!(r.pending.len(), 0, "replica {i}");
        wait_metric_eq(&replicas[i], "prefix_picker_inflight_streams", 0.0).await;
    }
    assert!(
        service
            .connections
            .iter()
            .all(|c| c.load(Ordering::Relaxed) > 0)
    );
    for r in replicas {
        r.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_pool_shape_loses_no_completion_when_a_replica_drains() {
    drain_one_replica_mid_run(Shape::IstioPool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_gateway_pool_shape_loses_no_completion_when_a_replica_drains() {
    drain_one_replica_mid_run(Shape::AiGatewayPool { buffered: false }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_gateway_buffered_pool_loses_no_completion_when_a_replica_drains() {
    drain_one_replica_mid_run(Shape::AiGatewayPool { buffered: true }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_legacy_policy_loses_no_completion_when_a_replica_drains() {
    drain_one_replica_mid_run(Shape::EnvoyGatewayLegacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_legacy_filter_loses_no_completion_when_a_replica_drains() {
    drain_one_replica_mid_run(Shape::IstioLegacy).await;
}

/// Polls `envoy`'s admin until its active health check marks the picker replica at `host`
/// failed (the shapes whose gateway health-checks the picker, not only the Service).
async fn wait_health_check_failed(envoy: &Envoy, host: SocketAddr, what: &str) {
    let admin = envoy.process.admin;
    let flags = format!("prefix-picker::{host}::health_flags::");
    poll(what, || async {
        let clusters = reqwest::get(format!("http://{admin}/clusters"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        clusters
            .lines()
            .any(|l| l.starts_with(&flags) && l.contains("failed_active_hc"))
            .then_some(())
    })
    .await;
}

/// Sends `n` chat questions (`{label} {i}`) through `envoy`, each answered 200; how many.
async fn ask(envoy: &Envoy, label: &str, n: u64) -> u64 {
    for i in 0..n {
        let body = chat(SYSTEM, &format!("{label} {i}"));
        let r = send(envoy, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{label} {i}: {r:?}\n{}", envoy.log());
    }
    n
}

/// The remaining limit, measured: a replica killed outright (SIGKILL: a crash, an OOM kill, a
/// lost node) mid-request. The requests whose stream it held fail (the shapes fail closed);
/// the other replica's requests, held across the kill, and every request after it succeed, and
/// the survivor records each of its completions once.
async fn kill_one_replica_mid_run(shape: Shape) {
    let backends = three_backends().await;
    let refs: Vec<&Backend> = backends.iter().collect();
    let extra = format!(
        "picker:\n  tls: {{mode: selfSigned}}\n  affinity: {{}}\n  maxEndpoints: {}\n",
        shape.max_endpoints()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}{extra}", endpoints_yaml(&backends));
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    let (victim, victim_admin) = testkit::start_picker(&bin, dir.path(), &config, 2).unwrap();
    let survivor = start_picker(picker_config(&refs, &extra)).await;
    let grpc = [victim.addr, survivor.grpc_addr];
    let service = Service::start(grpc.to_vec()).await;
    let envoy = start_envoy(shape.bootstrap(&backends, &grpc, service.addr)).await;
    let streams = "prefix_picker_inflight_streams";
    let recorded_series = "prefix_picker_records_total{outcome=\"recorded\"}";

    ask(&envoy, "before", 6).await;
    let mut gated = Vec::new();
    let (mut victim_held, mut survivor_held) = (0.0, 0.0);
    while victim_held == 0.0 || survivor_held == 0.0 {
        assert!(gated.len() < 24, "{shape:?}: both replicas get streams");
        let body = json!({"model": "m", "stream": true,
            "prompt": format!("GATED {SYSTEM} killed stream {}", gated.len())});
        let url = envoy.url("/v1/completions");
        gated.push(tokio::spawn(async move {
            let r = reqwest::Client::new().post(url).json(&body).send().await;
            match r {
                Ok(r) if r.status().is_success() => {
                    r.text().await.is_ok_and(|t| t.contains("[DONE]"))
                }
                _ => false,
            }
        }));
        let held = gated.len() as f64;
        (victim_held, survivor_held) = poll("the new stream reaches a replica", || async {
            let v = metric_at(victim_admin, streams).await;
            let s = metric(&survivor, streams).await;
            (v + s == held).then_some((v, s))
        })
        .await;
    }
    let survivor_before = metric_opt(&survivor, recorded_series).await.unwrap_or(0.0);
    let victim_before = metric_at(victim_admin, recorded_series).await;
    assert_eq!(survivor_before + victim_before, 6.0, "{shape:?}");

    drop(victim); // SIGKILL
    service.set_ready(0, false); // its endpoint leaves once its probes fail
    if let Shape::IstioPool | Shape::IstioLegacy = shape {
        wait_health_check_failed(&envoy, grpc[0], "Envoy drops the killed replica").await;
    }
    ask(&envoy, "after", 8).await;
    poll("the held streams end", || async {
        for b in &backends {
            b.gate.notify_waiters();
        }
        gated.iter().all(|r| r.is_finished()).then_some(())
    })
    .await;
    let mut succeeded = 0.0;
    for r in gated {
        if r.await.unwrap() {
            succeeded += 1.0;
        }
    }
    assert_eq!(
        succeeded, survivor_held,
        "{shape:?}: the survivor's held streams succeed, the killed replica's fail"
    );
    wait_metric_eq(
        &survivor,
        recorded_series,
        survivor_before + survivor_held + 8.0,
    )
    .await;
    wait_metric_eq(&survivor, streams, 0.0).await;
    assert_eq!(metric(&survivor, "prefix_picker_pending_routes").await, 0.0);
    survivor.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_fails_only_the_requests_it_held_behind_a_service() {
    kill_one_replica_mid_run(Shape::AiGatewayPool { buffered: false }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_fails_only_the_requests_it_held_behind_istio() {
    kill_one_replica_mid_run(Shape::IstioPool).await;
}
