//! An `EndpointPickerConfig` (llm-d's format) through Envoy: the prefix-cache, queue and
//! KV-cache-utilization scorers with llm-d's default weights keep a shared prefix on one pod and
//! spread prompts that share nothing; explain shows each scorer's float scores.

use std::collections::BTreeSet;

use model_sim::engine::EngineConfig;
use serde_json::json;

use super::{SYSTEM, chat, send};
use crate::harness::*;

/// Each scorer instance `/debug/explain` shows, with its weight.
fn instances(e: &serde_json::Value) -> Vec<(&str, f64)> {
    e["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["instance"].as_str().unwrap(),
                p["weight"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// `n` model-sims, `sim-0` on, at 1000x speed.
async fn fast_sims(n: usize) -> Vec<Sim> {
    let mut sims = Vec::with_capacity(n);
    for i in 0..n {
        let fast = EngineConfig {
            time_scale: 1000.0,
            ..EngineConfig::default()
        };
        sims.push(Sim::start(&format!("sim-{i}"), fast).await);
    }
    sims
}

/// The config `text` with `sims` as its `endpoints:`.
fn with_endpoints(text: &str, sims: &[Sim]) -> prefix_picker::config::Config {
    let endpoints = testkit::endpoints_yaml(sims.iter().map(|s| (s.name.as_str(), s.addr)));
    prefix_picker::config::Config::parse(&format!("{text}\n{endpoints}"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Requests that share `system` stay on the pod the first went to: once it is recorded there
/// (explain finds the hit), `again` more, each served 200 by it. The pod's name.
async fn a_shared_prefix_stays(
    envoy: &Envoy,
    picker: &prefix_picker::serve::Running,
    system: &str,
    again: usize,
) -> String {
    let first = send(envoy, "/v1/chat/completions", &chat(system, "question 0")).await;
    assert_eq!(first.status, 200, "{system:.40}: {:?}", first.body);
    poll("the first completion recorded", || async {
        let e = explain(picker, &chat(system, "question 1")).await;
        (e["reason"] == "prefix_hit").then_some(())
    })
    .await;
    for i in 1..=again {
        let r = send(
            envoy,
            "/v1/chat/completions",
            &chat(system, &format!("question {i}")),
        )
        .await;
        assert_eq!(r.status, 200, "{system:.40}: {:?}", r.body);
        assert_eq!(r.served_by, first.served_by, "{system:.40}: request {i}");
    }
    first.served_by
}

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
    let sims = fast_sims(3).await;
    let config = with_endpoints(EPC, &sims);
    assert!(config.scheduler.epp.is_some());
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;

    // A shared system prompt: after the first request every other lands where it went.
    let system = SYSTEM.repeat(4);
    let held = a_shared_prefix_stays(&envoy, &picker, &system, 9).await;
    let e = explain(&picker, &chat(&system, "question 11")).await;
    assert_eq!(e["primary"], format!("default/{held}"), "{e}");
    let plugins = instances(&e);
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
        let held = pod["pod"] == format!("default/{held}");
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
    let sims = fast_sims(2).await;
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
        let picker = start_picker(with_endpoints(text, &sims)).await;
        let envoy = start_envoy_for_sims(&picker, &sims).await;
        // The system prompt starts with the config's name (the messages say which failed).
        let system = format!("{name}: {}", SYSTEM.repeat(3));
        a_shared_prefix_stays(&envoy, &picker, &system, 4).await;
        drop(envoy);
        picker.stop().await.unwrap();
    }
}

/// peers-late-2026.md section 5.2's drop-in config (prefix-cache-affinity-filter with its TTFT
/// gate, prefix-cache 3, token-load 2, queue 2, KV utilization 2) plus session-affinity-scorer
/// x 10, through Envoy with response headers and bodies sent to the picker
/// (`envoy-full-duplex.yaml`): a shared prefix stays on its pod; the response's
/// `x-session-token` names the pod that served it, and requests that send it back stay there
/// though they share nothing; explain shows every scorer, the finished requests' prompt tokens
/// no longer in flight (token-load-scorer near 1 on every pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_filter_token_load_and_session_affinity_through_envoy() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    const DROP_IN: &str = r#"
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: prefix-cache-affinity-filter
    parameters: {affinityThreshold: 0.8, maxTTFTPenaltyMs: 5000, ttftSource: prefillThroughput}
  - type: prefix-cache-scorer
    parameters: {matchLengthWeight: 0.0}
  - type: token-load-scorer
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: session-affinity-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: prefix-cache-affinity-filter
      - pluginRef: prefix-cache-scorer
        weight: 3
      - pluginRef: token-load-scorer
        weight: 2
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv-cache-utilization-scorer
        weight: 2
      - pluginRef: session-affinity-scorer
        weight: 10
picker:
  scrapeIntervalSeconds: 0.05
"#;
    let sims = fast_sims(3).await;
    let picker = start_picker(with_endpoints(DROP_IN, &sims)).await;
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let envoy = start_envoy(render_envoy(
        "envoy-full-duplex.yaml",
        picker.grpc_addr.port(),
        &addrs,
        |s| s,
    ))
    .await;

    let system = SYSTEM.repeat(4);
    let held = a_shared_prefix_stays(&envoy, &picker, &system, 5).await;

    // The session token: the response names its pod; sent back, it pins cold prompts there.
    let post = |prompt: String, token: Option<String>| {
        let mut r = reqwest::Client::new()
            .post(envoy.url("/v1/completions"))
            .json(&json!({"model": "m", "prompt": prompt}));
        if let Some(t) = token {
            r = r.header("x-session-token", t);
        }
        async move {
            let r = r.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let header = |k: &str| r.headers().get(k).map(|v| v.to_str().unwrap().to_string());
            (header("x-served-by").unwrap(), header("x-session-token"))
        }
    };
    let (pinned, token) = post("a session's first turn".into(), None).await;
    let token = token.expect("x-session-token on the response");
    assert_eq!(
        STANDARD.decode(&token).unwrap(),
        format!("default/{pinned}").as_bytes()
    );
    for i in 0..8 {
        let prompt = format!("{i} unrelated turn {i}: {}", "lorem ipsum ".repeat(i + 1));
        let (served, echoed) = post(prompt, Some(token.clone())).await;
        assert_eq!(served, pinned, "turn {i}");
        assert_eq!(echoed.as_deref(), Some(token.as_str()));
    }

    let e = explain(&picker, &chat(&system, "question 9")).await;
    let plugins = instances(&e);
    assert_eq!(
        plugins,
        [
            ("prefix-cache-scorer", 3.0),
            ("token-load-scorer", 2.0),
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("session-affinity-scorer", 10.0)
        ]
    );
    assert_eq!(e["primary"], format!("default/{held}"), "{e}");
    for pod in e["pods"].as_array().unwrap() {
        let load = pod["scores"]["token-load-scorer"].as_f64().unwrap();
        assert!(load > 0.99, "nothing left in flight: {pod}");
        assert_eq!(pod["scores"]["session-affinity-scorer"].as_f64(), Some(0.0));
    }
    picker.stop().await.unwrap();
}

/// llm-d's P/D guide config (`pd-epp-config.yaml`, unchanged; only `endpoints:` added, the
/// sims labelled `llm-d.ai/role`) through Envoy with model-sims in prefill and decode roles: a
/// new prompt goes to a decode sim that has a prefill sim prefill it (`x-prefiller-host-port`,
/// prefix-based-pd-decider: all 16+ tokens uncached); once the decode sim holds the prompt
/// (recorded at completion), the same prompt is decode only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_ds_pd_guide_config_disaggregates_through_envoy() {
    use model_sim::pd::{PdConfig, Role};
    let sim = |name: &'static str, role: Role| async move {
        let config = EngineConfig {
            time_scale: 1e6,
            pd: PdConfig {
                role: Some(role),
                ..PdConfig::default()
            },
            ..EngineConfig::default()
        };
        (Sim::start(name, config).await, role.as_str())
    };
    let sims = [
        sim("prefill-0", Role::Prefill).await,
        sim("decode-0", Role::Decode).await,
        sim("decode-1", Role::Decode).await,
    ];
    let mut doc =
        include_str!("../../../src/config/endpoint_picker/testdata/pd-epp-config.yaml").to_string();
    doc.push_str("endpoints:\n");
    for (s, role) in &sims {
        doc.push_str(&format!(
            "- {{name: {}, address: \"{}\", labels: {{llm-d.ai/role: {role}}}}}\n",
            s.name, s.addr
        ));
    }
    let config = prefix_picker::config::Config::parse(&doc).unwrap();
    assert!(config.scheduler.epp.as_ref().unwrap().prefill.is_some());
    let picker = start_picker(config).await;
    let addrs: Vec<_> = sims.iter().map(|(s, _)| s.addr).collect();
    let envoy = start_envoy_for_addrs(&picker, &addrs).await;
    let post = |body: serde_json::Value| {
        let r = reqwest::Client::new()
            .post(envoy.url("/v1/chat/completions"))
            .json(&body);
        async move {
            let r = r.send().await.unwrap();
            let header = |k: &str| {
                r.headers()
                    .get(k)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            };
            let out = (
                r.status().as_u16(),
                header("x-served-by"),
                header("x-prefilled-by"),
            );
            let _ = r.text().await;
            out
        }
    };
    let system = "You are a careful assistant. Answer from the manual. ".repeat(30);
    let body = chat(&system, "first question");
    let (status, decoded, prefilled) = post(body.clone()).await;
    assert_eq!(status, 200, "{}", envoy.log());
    assert!(decoded.starts_with("decode-"), "{decoded}");
    assert_eq!(prefilled, "prefill-0", "disaggregated: nothing cached");
    poll("the decode pod holds the prompt", || async {
        let e = explain(&picker, &body).await;
        (e["reason"] == "prefix_hit" && e["prefill"].is_null()).then_some(())
    })
    .await;
    let (status, again, prefilled) = post(body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(again, decoded, "the prefix stays on its decode pod");
    assert_eq!(prefilled, "", "decode only: under 16 tokens uncached");
    picker.stop().await.unwrap();
}

/// llm-d's precise pipeline (token-producer with a vLLM backend, precise-prefix-cache-producer
/// at its defaults: topic filter `kv@`, prefix-cache-scorer naming it), written as
/// `deploy/config/epp-precise-prefix-cache-config.yaml` writes it.
const PRECISE: &str = r#"
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: m
    vllm: {url: "http://localhost:8000"}
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 2.0}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1.0}
  - {pluginRef: queue-scorer, weight: 1.0}
  - {pluginRef: max-score-picker}
"#;

/// The precise producer through Envoy: model-sims publish vLLM's KV events on `kv@<pod>@m`
/// (read through llm-d's default topic filter) and serve `/tokenize` (the token-producer's
/// vLLM backend). A tenant's prefix that one engine reports holding is routed there, though
/// the estimate (a stale record, as another replica's) names the other pod, whose engine
/// holds none of it: the prefix-cache-scorer reads the engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_precise_producer_routes_a_shared_prefix_to_the_pod_whose_engine_holds_it() {
    use super::engine_truth::{make_live, pod, wait_connected, wait_view};
    use prefix_picker::routing::RecordOrigin;
    let engine = || EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start_with_events_on("sim-0", engine(), "kv@sim-0@m").await,
        Sim::start_with_events_on("sim-1", engine(), "kv@sim-1@m").await,
    ];
    let mut doc = format!("{PRECISE}endpoints:\n");
    for s in &sims {
        doc.push_str(&s.endpoint_yaml());
    }
    let config = prefix_picker::config::Config::parse(&doc).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.scheduler.epp.as_ref().unwrap().precise);
    assert!(config.picker.tokenizer.is_some(), "token-producer (vllm)");
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    make_live(&picker, &sims).await;

    // A tenant's first request: its head (the system prompt) is tokenized by a pod.
    let system = "You are the ledger clerk of tenant three. Be exact. ".repeat(20);
    let first = send(&envoy, "/v1/chat/completions", &chat(&system, "q1")).await;
    assert_eq!(first.status, 200);
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;
    // Its pod's engine drops its cache (and the pod's estimate with it); then the estimate
    // names that pod again (a stale record, as another replica's) while the other pod's engine
    // is sent the prefix directly, not through the picker.
    let stale = sims.iter().find(|s| s.name == first.served_by).unwrap();
    let holder = sims.iter().find(|s| s.name != first.served_by).unwrap();
    assert!(stale.engine.reset_prefix_cache());
    wait_view(&picker, &stale.name, 0.0).await;
    let explained = picker
        .router
        .explain(
            "/v1/chat/completions",
            Some(&serde_json::to_vec(&chat(&system, "q2")).unwrap()),
            None,
        )
        .unwrap();
    let set = picker.router.endpoints.snapshot();
    let stale_endpoint = set.by_address(&stale.addr).unwrap();
    picker.router.record(
        "m",
        &explained.decision.hashes,
        stale_endpoint,
        RecordOrigin::Replica,
    );
    let direct = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", holder.addr))
        .json(&chat(&system, "q0"))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    wait_view(&picker, &holder.name, 8.0).await;

    let next = chat(&system, "q3");
    let e = explain(&picker, &next).await;
    assert_eq!(e["primary"], format!("default/{}", holder.name), "{e}");
    let held = pod(&e, &holder.name);
    assert_eq!(held["match"]["source"], "engine", "{e}");
    assert!(
        held["match"]["engine_tokens"].as_u64().unwrap() >= 64,
        "{e}"
    );
    assert!(
        held["scores"]["prefix-cache-scorer"].as_f64().unwrap() > 0.3,
        "{e}"
    );
    let gone = pod(&e, &stale.name);
    assert_eq!(gone["match"]["source"], "engine", "{e}");
    assert_eq!(gone["match"]["engine_tokens"], 0, "{e}");
    assert_eq!(
        gone["scores"]["prefix-cache-scorer"].as_f64(),
        Some(0.0),
        "{e}"
    );
    for i in 3..6 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("q{i}")),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.served_by, holder.name, "request {i}");
    }
    assert!(
        metric(
            &picker,
            "prefix_picker_match_source_total{source=\"engine\"}"
        )
        .await
            >= 3.0
    );
    drop(envoy);
    picker.stop().await.unwrap();
}
