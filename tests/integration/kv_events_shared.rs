//! The shared KV-event socket (`picker.kvEvents.bind`, an `EndpointPickerConfig`'s
//! `kvEventsConfig.zmqEndpoint`) against an independent publisher: `tests/wire/kv_events_wire.py
//! connect` (msgspec encoding as vLLM declares its structs, pyzmq/libzmq) connects to the
//! picker's bound socket, as a vLLM started with `"endpoint": "tcp://picker:5557"` does, and
//! publishes for several pods, each naming its pod in its topic (`kv@<pod>@<model>`). The
//! picker binds port 0 and reports the port it got (`Running::kv_events_bound`).

use prefix_picker::Config;
use prefix_picker::serve::Running;

use crate::harness::*;
use crate::kv_events::Publisher;

fn pod_series(family: &str, pod: &str) -> String {
    format!("{family}{{model_server_namespace=\"default\",model_server_pod=\"{pod}\"}}")
}

async fn wait_view(picker: &Running, pod: &str, blocks: f64) {
    wait_metric_eq(
        picker,
        &pod_series("prefix_picker_engine_view_blocks", pod),
        blocks,
    )
    .await;
}

fn shared(outcome: &str) -> String {
    format!("prefix_picker_kv_events_shared_total{{outcome=\"{outcome}\"}}")
}

/// Two pods on distinct IPs (no engine behind them: their views are all this test reads).
const ENDPOINTS: &str = "endpoints:
- {name: pod-a, namespace: default, address: \"127.0.0.1:18001\"}
- {name: pod-b, namespace: default, address: \"127.0.0.2:18002\"}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_connected_to_the_shared_socket_feed_the_pods_their_topics_name() {
    let mut doc =
        testkit::scheduler_section(include_str!("fixtures/kthena-router-config.yaml")).to_string();
    doc.push_str(ENDPOINTS);
    doc.push_str("picker: {scrapeIntervalSeconds: 0, kvEvents: {bind: \"tcp://127.0.0.1:0\"}}\n");
    let picker = start_picker(Config::parse(&doc).unwrap()).await;
    let bound = picker.kv_events_bound.clone().expect("the shared socket");
    assert!(!bound.ends_with(":0"), "the port bound: {bound}");
    let mut engine = Publisher::connect(&bound).await;

    // Pod A by its IP:port (llm-d's guides), three batches chained: its view holds them, live.
    for seq in 0..3 {
        engine.publish("kv@127.0.0.1:18001@m", seq).await;
    }
    wait_view(&picker, "pod-a", 3.0).await;
    let live = pod_series("prefix_picker_engine_view_live", "pod-a");
    assert_eq!(metric(&picker, &live).await, 1.0);
    let b_live = pod_series("prefix_picker_engine_view_live", "pod-b");
    assert_eq!(
        metric_opt(&picker, &b_live).await.unwrap_or(0.0),
        0.0,
        "b has sent nothing: matched by the estimate (its series come with its first message)"
    );

    // Pod B by its name, and an IP:port no pod has: dropped, counted, A and B untouched.
    engine.publish("kv@pod-b@m", 0).await;
    engine.publish("kv@10.9.9.9:8000@m", 0).await;
    wait_view(&picker, "pod-b", 1.0).await;
    wait_metric_eq(&picker, &shared("unknown_pod"), 1.0).await;
    assert_eq!(metric(&picker, &shared("routed")).await, 4.0);
    assert_eq!(
        metric(
            &picker,
            &pod_series("prefix_picker_engine_view_blocks", "pod-a")
        )
        .await,
        3.0
    );

    // A's engine restarts (its numbering starts over): its view holds only what it stores
    // from then on. Garbage frames are dropped, counted.
    engine.publish("kv@127.0.0.1:18001@m", 0).await;
    wait_view(&picker, "pod-a", 1.0).await;
    let stream = |kind: &str| {
        format!(
            "prefix_picker_kv_event_stream_total{{kind=\"{kind}\",model_server_namespace=\"default\",model_server_pod=\"pod-a\"}}"
        )
    };
    wait_metric_eq(&picker, &stream("reset"), 1.0).await;
    engine.run("raw 6b7640 00").await;
    wait_metric_eq(&picker, &shared("malformed"), 1.0).await;
    assert_eq!(metric(&picker, &live).await, 1.0);
    picker.stop().await.unwrap();
}

/// llm-d's own sim config (`zmqEndpoint: tcp://0.0.0.0:5557`, here on port 0), its engines
/// naming their pod by IP (`kv@<pod-ip>@<model>`, llm-d's sim style).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_picker_configs_zmq_endpoint_is_the_shared_socket() {
    let llm_d =
        include_str!("../../src/config/endpoint_picker/testdata/sim-epp-kvcache-config.yaml");
    let doc = llm_d.replace("tcp://0.0.0.0:5557", "tcp://127.0.0.1:0")
        + ENDPOINTS
        + "picker: {scrapeIntervalSeconds: 0}\n";
    let config = Config::parse(&doc).unwrap();
    assert!(
        !config.warnings.iter().any(|w| w.contains("zmqEndpoint")),
        "{:?}",
        config.warnings
    );
    let picker = start_picker(config).await;
    let bound = picker.kv_events_bound.clone().expect("the shared socket");
    let mut engine = Publisher::connect(&bound).await;
    for seq in 0..2 {
        engine
            .publish("kv@127.0.0.2@TinyLlama/TinyLlama-1.1B-Chat-v1.0", seq)
            .await;
    }
    wait_view(&picker, "pod-b", 2.0).await;
    // The default topic filter (kv@) keeps other topics out.
    engine.publish("other@pod-a@m", 0).await;
    engine.publish("kv@pod-a@m", 0).await;
    wait_view(&picker, "pod-a", 1.0).await;
    assert_eq!(metric(&picker, &shared("routed")).await, 3.0);
    picker.stop().await.unwrap();
}
