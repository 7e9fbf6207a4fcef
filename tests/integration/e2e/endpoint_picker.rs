//! An `EndpointPickerConfig` (llm-d's format) through Envoy: the prefix-cache, queue and
//! KV-cache-utilization scorers with llm-d's default weights keep a shared prefix on one pod and
//! spread prompts that share nothing; explain shows each scorer's float scores.

use std::collections::BTreeSet;

use model_sim::engine::EngineConfig;
use serde_json::json;

use super::{SYSTEM, chat, send};
use crate::harness::*;

/// llm-d's default profile, written out (`pkg/epp/config/loader/defaults.go`).
const EPC: &str = r#"
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
picker:
  scrapeIntervalSeconds: 0.05
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_queue_and_kv_scorers_keep_a_shared_prefix_and_spread_cold_prompts() {
    let fast = || EngineConfig {
        time_scale: 1000.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", fast()).await,
        Sim::start("sim-1", fast()).await,
        Sim::start("sim-2", fast()).await,
    ];
    let mut doc = EPC.to_string();
    doc.push_str(&testkit::endpoints_yaml(
        sims.iter().map(|s| (s.name.as_str(), s.addr)),
    ));
    let config = prefix_picker::config::Config::parse(&doc).unwrap();
    assert!(config.scheduler.epp.is_some());
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;

    // A shared system prompt: after the first request every other lands where it went.
    let system = SYSTEM.repeat(4);
    let system = system.as_str();
    let first = send(&envoy, "/v1/chat/completions", &chat(system, "question 0")).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    poll("the first completion recorded", || async {
        let e = explain(&picker, &chat(system, "question 1")).await;
        (e["reason"] == "prefix_hit").then_some(())
    })
    .await;
    for i in 1..10 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(system, &format!("question {i}")),
        )
        .await;
        assert_eq!(r.served_by, first.served_by, "request {i}");
    }
    let e = explain(&picker, &chat(system, "question 11")).await;
    assert_eq!(e["primary"], format!("default/{}", first.served_by), "{e}");
    let plugins: Vec<(&str, f64)> = e["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["instance"].as_str().unwrap(),
                p["weight"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        plugins,
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0)
        ]
    );
    for pod in e["pods"].as_array().unwrap() {
        let prefix = pod["scores"]["prefix-cache-scorer"].as_f64().unwrap();
        let held = pod["pod"] == format!("default/{}", first.served_by);
        assert_eq!(prefix > 0.7, held, "{pod}");
        assert!(held || prefix == 0.0, "{pod}");
        assert!((0.0..=1.0).contains(&pod["scores"]["queue-scorer"].as_f64().unwrap()));
    }

    // Prompts that share nothing: no prefix holds them, so load and KV use spread them.
    let mut cold = BTreeSet::new();
    for i in 0..12 {
        let body = json!({"model": "m", "prompt": format!("{i} unrelated topic number {i}: {}", "lorem ipsum ".repeat(i + 1))});
        let r = send(&envoy, "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        cold.insert(r.served_by);
    }
    assert!(cold.len() >= 2, "cold prompts spread: {cold:?}");
    picker.stop().await.unwrap();
}

/// llm-d's published example configs that prefix-picker implements (the fixtures of
/// `src/config/endpoint_picker/`, each citing its source), each loaded unchanged (only
/// `endpoints:` added) and run through Envoy: requests succeed and a repeated prompt stays on
/// its pod (each has a prefix-cache scorer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_ds_example_configs_route_through_envoy() {
    let fast = || EngineConfig {
        time_scale: 1000.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", fast()).await,
        Sim::start("sim-1", fast()).await,
    ];
    let endpoints = testkit::endpoints_yaml(sims.iter().map(|s| (s.name.as_str(), s.addr)));
    for (name, text) in [
        (
            "epp-config.yaml",
            include_str!("../../../src/config/endpoint_picker/testdata/epp-config.yaml"),
        ),
        (
            "epp-precise-prefix-cache-config.yaml",
            include_str!(
                "../../../src/config/endpoint_picker/testdata/epp-precise-prefix-cache-config.yaml"
            ),
        ),
        (
            "epp-estimate-prefix-cache-config.yaml",
            include_str!(
                "../../../src/config/endpoint_picker/testdata/epp-estimate-prefix-cache-config.yaml"
            ),
        ),
        (
            "sim-epp-config.yaml",
            include_str!("../../../src/config/endpoint_picker/testdata/sim-epp-config.yaml"),
        ),
        (
            "sim-epp-no-hit-lru.yaml",
            include_str!("../../../src/config/endpoint_picker/testdata/sim-epp-no-hit-lru.yaml"),
        ),
        (
            "sim-epp-kvcache-config.yaml",
            include_str!(
                "../../../src/config/endpoint_picker/testdata/sim-epp-kvcache-config.yaml"
            ),
        ),
    ] {
        let config = prefix_picker::config::Config::parse(&format!("{text}\n{endpoints}"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let picker = start_picker(config).await;
        let envoy = start_envoy_for_sims(&picker, &sims).await;
        let system = format!("{name}: {}", SYSTEM.repeat(3));
        let first = send(&envoy, "/v1/chat/completions", &chat(&system, "first")).await;
        assert_eq!(first.status, 200, "{name}: {:?}", first.body);
        poll("the first completion recorded", || async {
            let e = explain(&picker, &chat(&system, "again")).await;
            (e["reason"] == "prefix_hit").then_some(())
        })
        .await;
        for i in 0..4 {
            let r = send(
                &envoy,
                "/v1/chat/completions",
                &chat(&system, &format!("again {i}")),
            )
            .await;
            assert_eq!(r.status, 200, "{name}");
            assert_eq!(r.served_by, first.served_by, "{name}: request {i}");
        }
        drop(envoy);
        picker.stop().await.unwrap();
    }
}
