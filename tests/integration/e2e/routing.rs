//! Routing through Envoy: a prefix sticks to its pod for every API (also under a path prefix and
//! with an ORIGINAL_DST cluster), unrelated prefixes spread, a dead primary is skipped, the default
//! plugins concentrate a prefix and filter an overloaded pod; every Envoy example validates.

use std::time::Duration;

use super::{SYSTEM, assert_sticky, chat, send, stack};
use crate::harness::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_lands_on_the_same_pod_for_every_api() {
    let (_backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;

    assert_sticky(
        &envoy,
        &picker,
        "/v1/chat/completions",
        &chat(SYSTEM, "How do I enable the prefix-cache plugin?"),
    )
    .await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/completions",
        &json!({"model": "m", "prompt": "Once upon a time ".repeat(20)}),
    )
    .await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/responses",
        &json!({"model": "m", "instructions": "Be brief.", "input": "Summarise the plot of Hamlet."}),
    )
    .await;

    // The source document's check: match ratio 0 then 1 for a repeated request; entries grew.
    let ratio_count = metric(&picker, "kthena_router_prefix_cache_match_ratio_count").await;
    let ratio_sum = metric(&picker, "kthena_router_prefix_cache_match_ratio_sum").await;
    assert_eq!(ratio_count, 6.0);
    assert!(
        (ratio_sum - 3.0).abs() < 1e-9,
        "three misses (0) and three full matches (1): {ratio_sum}"
    );
    assert!(metric(&picker, "kthena_router_prefix_cache_entries").await >= 3.0);
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_decisions_total{reason=\"prefix_hit\"}"
        )
        .await,
        3.0
    );
    wait_metric_eq(&picker, "prefix_picker_inflight_streams", 0.0).await;
    picker.stop().await.unwrap();
}

/// Gateways often publish the API under a prefix and rewrite it after the filters have run:
/// the picker still recognises the API and scores the prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_published_under_a_path_prefix_is_scored() {
    let (_backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    assert_sticky(
        &envoy,
        &picker,
        "/openai/v1/chat/completions",
        &chat(SYSTEM, "Published under a prefix."),
    )
    .await;
    // A completion the picker cannot score, under the prefix too: it is counted as such (so the
    // unscored family is exported), never as an unknown API.
    let r = send(
        &envoy,
        "/openai/v1/completions",
        &json!({"model": "m", "prompt": [1, 2, 3]}),
    )
    .await;
    assert_eq!(r.status, 200);
    wait_metric_eq(
        &picker,
        "prefix_picker_unscored_requests_total{reason=\"prompt_not_string\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_unscored_requests_total{reason=\"unknown_api\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_prefixes_spread_over_pods() {
    let (_backends, _picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    let mut pods = std::collections::HashSet::new();
    for i in 0..12 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&format!("Tenant {i} system prompt: {SYSTEM}"), "hi"),
        )
        .await;
        assert_eq!(r.status, 200);
        pods.insert(r.served_by);
    }
    assert!(
        pods.len() >= 2,
        "12 unrelated prefixes all went to {pods:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_primary_is_skipped_and_the_real_server_is_recorded() {
    let (backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    let body = chat(SYSTEM, "Which pod holds my cache?");
    let first = send(&envoy, "/v1/chat/completions", &body).await;
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        1.0,
    )
    .await;
    let dead = backends.iter().find(|b| b.name == first.served_by).unwrap();
    dead.kill();
    // The picker still prefers the dead pod (it holds the prefix) ...
    let e = explain(&picker, &body).await;
    assert_eq!(e["primary"], format!("default/{}", dead.name));
    // ... Envoy walks the fallback list, and the pod that really served is recorded.
    let second = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(second.status, 200, "{}", envoy.log());
    assert_ne!(second.served_by, dead.name);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        2.0,
    )
    .await;
    assert_eq!(prefix_score(&picker, &body, &second.served_by).await, 100);
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_dst_cluster_with_one_endpoint_picks() {
    let (_backends, picker, envoy) = stack(
        "envoy-original-dst.yaml",
        "picker: {maxEndpoints: 1}\n",
        |s| s,
    )
    .await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/chat/completions",
        &chat(SYSTEM, "original dst"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_plugins_concentrate_a_prefix_and_filter_an_overloaded_pod() {
    use model_sim::engine::EngineConfig;
    let engine = EngineConfig {
        max_num_seqs: 1,
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    let mut sims = Vec::new();
    for i in 0..4 {
        sims.push(Sim::start(&format!("sim-{i}"), engine.clone()).await);
    }
    let picker = start_picker(sims_config(
        &sims,
        "picker: {scrapeIntervalSeconds: 0.05}\n",
    ))
    .await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let system = format!("{SYSTEM} {}", "Here are the product docs. ".repeat(40));
    let mut served = std::collections::HashMap::<String, usize>::new();
    for i in 0..8 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("question {i}")),
        )
        .await;
        assert_eq!(r.status, 200);
        *served.entry(r.served_by.clone()).or_default() += 1;
        wait_metric(
            &picker,
            "prefix_picker_records_total{outcome=\"recorded\"}",
            (i + 1) as f64,
        )
        .await;
    }
    let (holder, n) = served
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, v)| (k.clone(), *v))
        .unwrap();
    assert!(
        n >= 7,
        "one shared prefix should concentrate on one pod: {served:?}"
    );

    // The explain endpoint's totals are the weighted sums of the plugin scores.
    let probe = chat(&system, "question 99");
    let e = explain(&picker, &probe).await;
    for pod in e["pods"].as_array().unwrap() {
        let sum: u64 = [
            "least-request",
            "gpu-usage",
            "least-latency",
            "prefix-cache",
        ]
        .iter()
        .map(|p| pod["scores"][p].as_u64().unwrap())
        .sum();
        assert_eq!(pod["total"].as_u64().unwrap(), sum, "{pod}");
        let expect_prefix = if pod["pod"] == format!("default/{holder}") {
            1
        } else {
            0
        };
        assert_eq!(
            (pod["scores"]["prefix-cache"].as_u64().unwrap() > 0) as i32,
            expect_prefix
        );
    }
    assert_eq!(e["primary"], format!("default/{holder}"));

    // Overload the holder: 1 running + 10 waiting >= maxWaitingRequests (10).
    let holder_sim = sims.iter().find(|s| s.name == holder).unwrap();
    let mut hogs = Vec::new();
    for i in 0..11 {
        let url = format!("http://{}/v1/completions", holder_sim.addr);
        hogs.push(tokio::spawn(async move {
            let _ = reqwest::Client::new()
                .post(url)
                .json(&json!({"model": "m", "prompt": format!("hog {i}"), "max_tokens": 100_000}))
                .timeout(Duration::from_secs(120))
                .send()
                .await;
        }));
    }
    poll("the overloaded pod to be filtered out", || async {
        let e = explain(&picker, &probe).await;
        let filtered = e["pods"]
            .as_array()?
            .iter()
            .all(|p| p["pod"] != format!("default/{holder}"));
        filtered.then_some(())
    })
    .await;
    for i in 0..4 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("while overloaded {i}")),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_ne!(r.served_by, holder, "an overloaded pod must not be picked");
    }
    for h in hogs {
        h.abort();
    }
}

#[test]
fn every_envoy_example_validates() {
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("envoy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            if let Err(output) = envoy_validate_file(&path) {
                panic!("{}: {output}", path.display());
            }
            n += 1;
        }
    }
    assert!(n >= 3);
}
