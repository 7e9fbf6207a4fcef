//! Picker replicas without sync: two replicas behind one Envoy in the GIE shape each record what
//! they routed, once.

use super::{SYSTEM, addrs, chat, send, three_backends};
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
