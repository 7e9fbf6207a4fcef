//! Prefill/decode disaggregation through Envoy: model-sims in prefill and decode roles, two PD
//! groups. The picker sends the request to a decode sim and names the prefill sim of its group
//! in `x-prefiller-host-port`; the decode sim has that sim prefill. Both are recorded, and a
//! client-sent header never reaches a sim.

use super::*;
use model_sim::engine::EngineConfig;
use model_sim::pd::{PdConfig, Role};

async fn sim(name: &str, role: Role) -> Sim {
    let config = EngineConfig {
        time_scale: 1e6,
        pd: PdConfig {
            role: Some(role),
            ..PdConfig::default()
        },
        ..EngineConfig::default()
    };
    Sim::start(name, config).await
}

/// Two groups (`g0`, `g1`), each a prefill and a decode sim.
async fn pd_sims() -> Vec<(Sim, &'static str, &'static str)> {
    vec![
        (sim("prefill-0", Role::Prefill).await, "prefill", "g0"),
        (sim("decode-0", Role::Decode).await, "decode", "g0"),
        (sim("prefill-1", Role::Prefill).await, "prefill", "g1"),
        (sim("decode-1", Role::Decode).await, "decode", "g1"),
    ]
}

/// The sims as `endpoints:` with their labels, then `extra`.
fn config(sims: &[(Sim, &str, &str)], extra: &str) -> prefix_picker::config::Config {
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str("endpoints:\n");
    for (s, role, group) in sims {
        doc.push_str(&format!(
            "- {{name: {}, address: \"{}\", labels: {{role: {role}, group: {group}}}}}\n",
            s.name, s.addr
        ));
    }
    doc.push_str(extra);
    prefix_picker::config::Config::parse(&doc).unwrap()
}

const PD_GROUP: &str =
    "pdGroup: {groupKey: group, prefillLabels: {role: prefill}, decodeLabels: {role: decode}}\n";

/// Sends `body` with a forged prefiller header; returns (status, served by, prefilled by).
/// Envoy (the shipped `envoy.yaml`) in front of the PD sims.
async fn envoy_for(picker: &prefix_picker::Running, sims: &[(Sim, &str, &str)]) -> Envoy {
    let addrs: Vec<std::net::SocketAddr> = sims.iter().map(|(s, ..)| s.addr).collect();
    start_envoy_for_addrs(picker, &addrs).await
}

async fn send_forged(envoy: &Envoy, body: &Value) -> (u16, String, String) {
    let r = reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .header("x-prefiller-host-port", "127.0.0.1:1")
        .json(body)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        r.headers()
            .get(name)
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

/// How many blocks the fixture's prefix-cache args (64-byte blocks, at most 128) hash `body`'s
/// prompt into, rendered as Kthena renders it (the fixture has no affinity mode).
fn prompt_blocks(body: &Value) -> usize {
    use prefix_picker::hashing::BlockChain;
    use prefix_picker::prompt::Rendering;
    use prefix_picker::request::InferenceRequest;
    let bytes = serde_json::to_vec(body).unwrap();
    let request = InferenceRequest::parse_as(&bytes, Rendering::Kthena).unwrap();
    let prompt = request.prompt.unwrap();
    let chain = BlockChain {
        block_size: 64,
        max_blocks: 128,
    };
    chain.hash(&request.model, prompt.as_bytes()).len()
}

fn counter(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

async fn sim_metrics(s: &Sim) -> String {
    reqwest::get(format!("http://{}/metrics", s.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_sim_serves_and_its_groups_prefill_sim_prefills_both_recorded() {
    let sims = pd_sims().await;
    let picker = start_picker(config(&sims, PD_GROUP)).await;
    let envoy = envoy_for(&picker, &sims).await;
    let system = "You are a careful assistant. Answer from the manual. ".repeat(30);
    let body = chat(&system, "first question");

    // The forged header would make a decode sim fail its prefill (502): it never arrives.
    let (status, decoded, prefilled) = send_forged(&envoy, &body).await;
    assert_eq!(status, 200, "{}", envoy.log());
    assert!(decoded.starts_with("decode-"), "{decoded}");
    let group = &decoded["decode-".len()..];
    assert_eq!(
        prefilled,
        format!("prefill-{group}"),
        "the decode pod's group"
    );

    // Recorded for both pods (one route, one outcome): the index holds the prompt's blocks
    // once for the decode pod and once for the prefill pod, and nothing else.
    wait_metric_eq(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        1.0,
    )
    .await;
    let blocks = prompt_blocks(&body);
    assert!(blocks > 20, "{blocks}");
    assert_eq!(
        metric(&picker, "kthena_router_prefix_cache_entries").await,
        2.0 * blocks as f64
    );

    // /debug/explain names the pair the next request gets.
    let e = explain(&picker, &body).await;
    assert_eq!(e["primary"], format!("default/{decoded}"), "{e}");
    assert_eq!(e["prefill"]["pod"], format!("default/{prefilled}"), "{e}");
    // The same prefix again: the same pair, and both sims' caches hit.
    let again = chat(&system, "second question");
    let (status, decoded2, prefilled2) = send_forged(&envoy, &again).await;
    assert_eq!(status, 200);
    assert_eq!((&decoded2, &prefilled2), (&decoded, &prefilled));
    let prefill = &sims.iter().find(|(s, ..)| s.name == prefilled).unwrap().0;
    let p = sim_metrics(prefill).await;
    assert_eq!(counter(&p, "vllm:time_to_first_token_seconds_count"), 2.0);
    assert!(counter(&p, "vllm:prefix_cache_hits_total") > 0.0, "{p}");
    // The decode sim kept the prompt it received: its own cache hits too.
    let decode = &sims.iter().find(|(s, ..)| s.name == decoded).unwrap().0;
    let d = sim_metrics(decode).await;
    assert!(counter(&d, "vllm:prefix_cache_hits_total") > 0.0, "{d}");
    // The other group's sims saw nothing.
    let other = if group == "0" { "1" } else { "0" };
    for name in [format!("prefill-{other}"), format!("decode-{other}")] {
        let s = &sims.iter().find(|(s, ..)| s.name == name).unwrap().0;
        let text = sim_metrics(s).await;
        assert_eq!(
            counter(&text, "vllm:time_to_first_token_seconds_count"),
            0.0,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pd_group_a_client_prefiller_header_is_stripped() {
    // Decode sims routed as ordinary pods: a prefiller header reaching one would fail it.
    let sims = vec![
        (sim("decode-0", Role::Decode).await, "decode", "g0"),
        (sim("decode-1", Role::Decode).await, "decode", "g0"),
    ];
    let picker = start_picker(config(&sims, "")).await;
    let envoy = envoy_for(&picker, &sims).await;
    let (status, decoded, prefilled) = send_forged(&envoy, &chat("system", "hi")).await;
    assert_eq!(status, 200, "{}", envoy.log());
    assert!(decoded.starts_with("decode-"));
    assert_eq!(prefilled, "", "prefilled locally");
}
