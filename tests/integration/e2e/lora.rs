//! Kthena's lora-affinity filter through Envoy: each pod's `GET /v1/models` (base model and
//! loaded LoRA adapters) is fetched by the engine scrape, and a request for an adapter goes only
//! to the pods that list it; a model no pod lists is refused, naming the filter.

use std::collections::BTreeSet;

use model_sim::engine::EngineConfig;
use serde_json::json;

use super::send;
use crate::harness::*;

const SCHEDULER: &str = r#"
scheduler:
  plugins:
    Filter:
      enabled:
        - least-request
        - lora-affinity
    Score:
      enabled:
        - name: least-request
          weight: 1
        - name: prefix-cache
          weight: 1
picker:
  scrapeIntervalSeconds: 0.05
"#;

/// The pods that served `n` distinct prompts of `model`.
async fn served(envoy: &Envoy, model: &str, n: usize) -> BTreeSet<String> {
    let mut pods = BTreeSet::new();
    for i in 0..n {
        let body = json!({"model": model, "prompt": format!("request {i} of {model}: tell me something new")});
        let r = send(envoy, "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{model}: {:?}", r.body);
        pods.insert(r.served_by);
    }
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_affinity_keeps_an_adapter_on_the_pods_that_have_it_loaded() {
    let fast = || EngineConfig {
        time_scale: 1000.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start_with_adapters("sim-0", fast(), "base", &["sql-lora"]).await,
        Sim::start_with_adapters("sim-1", fast(), "base", &["sql-lora", "chat-lora"]).await,
        Sim::start_with_adapters("sim-2", fast(), "base", &[]).await,
    ];
    let mut doc = SCHEDULER.to_string();
    doc.push_str(&testkit::endpoints_yaml(
        sims.iter().map(|s| (s.name.as_str(), s.addr)),
    ));
    let config = prefix_picker::config::Config::parse(&doc).unwrap();
    assert!(
        config.warnings.iter().all(|w| !w.contains("lora-affinity")),
        "{:?}",
        config.warnings
    );
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;

    // Until the first scrape lists them, no pod serves anything (Kthena's empty model set).
    poll("every pod's models fetched", || async {
        let body = json!({"model": "base", "prompt": "warm up"});
        let explained = explain(&picker, &body).await;
        let pods = explained["pods"].as_array().map_or(0, Vec::len);
        (pods == 3).then_some(())
    })
    .await;

    assert_eq!(
        served(&envoy, "sql-lora", 12).await,
        BTreeSet::from(["sim-0".to_string(), "sim-1".to_string()]),
        "sql-lora only where it is loaded, on both"
    );
    let explained = explain(&picker, &json!({"model": "chat-lora", "prompt": "x"})).await;
    assert_eq!(explained["pods"][0]["pod"], "default/sim-1", "{explained}");
    assert_eq!(
        explained["pods"][0]["served_models"],
        json!(["base", "sql-lora", "chat-lora"]),
        "explain shows what lora-affinity read"
    );
    assert_eq!(
        served(&envoy, "chat-lora", 6).await,
        BTreeSet::from(["sim-1".to_string()])
    );
    assert!(
        served(&envoy, "base", 12).await.contains("sim-2"),
        "the base model goes anywhere, the pod without adapters too"
    );

    let r = send(
        &envoy,
        "/v1/completions",
        &json!({"model": "missing-lora", "prompt": "x"}),
    )
    .await;
    assert_ne!(r.status, 200, "{:?}", r.body);
    assert!(
        r.body.to_string().contains("lora-affinity"),
        "the refusal names the filter: {:?}",
        r.body
    );
    picker.stop().await.unwrap();
}
