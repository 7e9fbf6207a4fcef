//! The simulator over real HTTP (in-process server on port 0).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::engine::{Engine, EngineConfig};
use crate::server::{SimConfig, app};

async fn start(engine: EngineConfig) -> (String, Arc<Engine>) {
    start_named("sim-0", engine).await
}

/// A sim serving model `m` on port 0, named `name`; its base URL and engine.
pub(crate) async fn start_named(name: &str, engine: EngineConfig) -> (String, Arc<Engine>) {
    serve(name, Engine::new(engine)).await
}

/// Serves `engine` as sim `name` (model `m`) on port 0; its base URL and engine.
pub(crate) async fn serve(name: &str, engine: Engine) -> (String, Arc<Engine>) {
    serve_adapters(name, engine, &[]).await
}

/// As [`serve`], with LoRA adapters loaded beside `m`.
async fn serve_adapters(name: &str, engine: Engine, adapters: &[&str]) -> (String, Arc<Engine>) {
    let engine = Arc::new(engine);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(
        SimConfig {
            name: name.into(),
            model: Some("m".into()),
            lora_adapters: adapters.iter().map(|a| a.to_string()).collect(),
            max_loras: 1,
            default_max_tokens: 4,
            seed: 1,
        },
        engine.clone(),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), engine)
}

/// The value of an unlabelled sample in a Prometheus text exposition.
pub(crate) fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in {text}"))
}

pub(crate) fn fast() -> EngineConfig {
    EngineConfig {
        time_scale: 1e9,
        ..EngineConfig::default()
    }
}

pub(crate) async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The sim's `/metrics` at `base`.
async fn exposition(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Three completions of `max_tokens` posted to `engine`, served at `base` with one slot
/// (`max_num_seqs: 1`), once one runs and two wait (polled); their tasks.
async fn one_running_two_waiting(
    base: &str,
    engine: &Engine,
    max_tokens: u64,
) -> Vec<tokio::task::JoinHandle<reqwest::Response>> {
    let url = format!("{base}/v1/completions");
    let tasks = (0..3)
        .map(|i| {
            let body = json!({"model": "m", "prompt": format!("p{i}"), "max_tokens": max_tokens});
            let url = url.clone();
            tokio::spawn(async move { post(&url, &body).await })
        })
        .collect();
    let start = tokio::time::Instant::now();
    while !(engine.running() == 1 && engine.waiting() == 2) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never saw 1 running + 2 waiting"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tasks
}

#[tokio::test]
async fn same_prompt_twice_reports_cached_tokens() {
    let (base, _) = start(fast()).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello ".repeat(100)}], "max_tokens": 3});
    let url = format!("{base}/v1/chat/completions");
    let first: Value = post(&url, &body).await.json().await.unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(first["usage"]["completion_tokens"], 3);
    let r = post(&url, &body).await;
    assert_eq!(r.headers()["x-served-by"], "sim-0");
    let second: Value = r.json().await.unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached <= prompt && prompt - cached < 16,
        "{second}"
    );
    assert_eq!(second["object"], "chat.completion");
    // The engine's counters say the same (the picker's scraper reading them is the workspace's
    // e2e tests' concern: `pod_metrics` is not in the core this crate builds against).
    let text = exposition(&base).await;
    assert!(
        text.contains(&format!("vllm:prefix_cache_hits_total {cached}")),
        "{text}"
    );
    assert_eq!(sample(&text, "vllm:time_to_first_token_seconds_count"), 2.0);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    // The engine's start time, which a router takes as a static pod's generation.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = sample(&text, "process_start_time_seconds");
    assert!(started <= now && started > now - 600.0, "{started}");
}

#[tokio::test]
async fn bad_requests_and_unknown_models() {
    let (base, _) = start(fast()).await;
    let r = post(&format!("{base}/v1/completions"), &json!({"prompt": "x"})).await;
    assert_eq!(r.status().as_u16(), 400);
    let r = post(
        &format!("{base}/v1/completions"),
        &json!({"model": "other", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status().as_u16(), 404);
    let r = reqwest::get(format!("{base}/v1/models")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// LoRA adapters are served under their names and listed after the base model, as vLLM lists
/// them (what Kthena's lora-affinity reads).
#[tokio::test]
async fn lora_adapters_are_served_and_listed() {
    let (base, _) = serve_adapters("sim-0", Engine::new(fast()), &["sql-lora", "chat-lora"]).await;
    let listed: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m", "sql-lora", "chat-lora"]);
    assert_eq!(listed["data"][1]["parent"], "m");
    assert!(
        !exposition(&base).await.contains("vllm:lora_requests_info{"),
        "nothing before an adapter is used, as vLLM"
    );
    for (model, status) in [("sql-lora", 200), ("m", 200), ("other-lora", 404)] {
        let r = post(
            &format!("{base}/v1/completions"),
            &json!({"model": model, "prompt": "x"}),
        )
        .await;
        assert_eq!(r.status().as_u16(), status, "{model}");
    }
    let text = exposition(&base).await;
    for series in [
        r#"vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql-lora",waiting_lora_adapters=""}"#,
        r#"vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""}"#,
    ] {
        assert!(text.contains(series), "{series}: {text}");
    }
}

/// The `data:` payloads of an SSE body, `[DONE]` last.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data line"))
        .collect()
}

#[tokio::test]
async fn sse_is_well_formed_for_every_api() {
    let (base, _) = start(fast()).await;
    for (path, body, tokens) in [
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "hi", "stream": true, "max_tokens": 5}),
            5,
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}),
            4,
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "hi", "stream": true, "max_output_tokens": 2}),
            2,
        ),
    ] {
        let r = post(&format!("{base}{path}"), &body).await;
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let text = r.text().await.unwrap();
        let events = events(&text);
        assert_eq!(*events.last().unwrap(), "[DONE]", "{path}");
        assert_eq!(events.len(), tokens + 1, "{path}: {text}");
        for e in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(e).unwrap();
            assert!(v.is_object());
            // Without stream_options.include_usage, vLLM streams no usage.
            assert!(v.get("usage").is_none(), "{path}: {v}");
        }
        if path == "/v1/responses" {
            // The Responses API's completed event always carries usage.
            let last: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
            assert!(last["response"]["usage"]["input_tokens"].as_u64().unwrap() > 0);
        }
    }
}

#[tokio::test]
async fn stream_usage_comes_last_when_asked_for() {
    let (base, _) = start(fast()).await;
    let prompt = "hello world ".repeat(40);
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "m", "prompt": prompt, "stream": true, "max_tokens": 3,
                "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": true,
                "max_tokens": 3, "stream_options": {"include_usage": true}}),
        ),
    ] {
        for round in 0..2 {
            let text = post(&format!("{base}{path}"), &body)
                .await
                .text()
                .await
                .unwrap();
            let events = events(&text);
            // 3 tokens, the usage chunk, [DONE].
            assert_eq!(events.len(), 5, "{path}: {text}");
            for e in &events[..3] {
                let v: Value = serde_json::from_str(e).unwrap();
                assert!(v.get("usage").is_none());
            }
            let usage_chunk: Value = serde_json::from_str(events[3]).unwrap();
            assert_eq!(usage_chunk["choices"], json!([]));
            let usage = &usage_chunk["usage"];
            assert_eq!(usage["completion_tokens"], 3);
            let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
            let cached = usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert!(prompt_tokens > 50, "{usage}");
            if round == 0 && path == "/v1/completions" {
                assert_eq!(cached, 0);
            }
            if round == 1 {
                assert!(cached > 0 && prompt_tokens - cached < 16, "{usage}");
            }
        }
    }
}

#[tokio::test]
async fn cache_config_is_exported_for_both_engines() {
    let (base, _) = start(EngineConfig {
        kv_blocks: 1000,
        ..fast()
    })
    .await;
    let text = exposition(&base).await;
    let info = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(info.contains("block_size=\"16\""), "{info}");
    assert!(info.contains("num_gpu_blocks=\"1000\""), "{info}");
    assert!(info.ends_with("} 1"), "{info}");
    assert!(!text.contains("sglang:max_total_num_tokens"));
    let (base, _) = start(EngineConfig {
        kind: crate::engine::EngineKind::Sglang,
        kv_blocks: 1000,
        ..fast()
    })
    .await;
    let text = exposition(&base).await;
    assert!(
        text.contains("\nsglang:max_total_num_tokens 16000\n"),
        "{text}"
    );
    assert!(text.contains("sglang:num_running_reqs 0"), "{text}");
}

#[tokio::test]
async fn requests_beyond_max_num_seqs_wait() {
    let (base, engine) = start(EngineConfig {
        max_num_seqs: 1,
        inter_token_latency: Duration::from_millis(20),
        overhead: Duration::ZERO,
        prefill_per_token: Duration::ZERO,
        ..EngineConfig::default()
    })
    .await;
    let tasks = one_running_two_waiting(&base, &engine, 50).await;
    let text = exposition(&base).await;
    let m = |name| sample(&text, name);
    assert_eq!(
        (
            m("vllm:num_requests_running"),
            m("vllm:num_requests_waiting")
        ),
        (1.0, 2.0)
    );
    for t in tasks {
        assert!(t.await.unwrap().status().is_success());
    }
    assert_eq!((engine.running(), engine.waiting()), (0, 0));
}

/// Clients that hang up while running or queued leave no count behind (a load test that aborts
/// its requests sees the engine idle again).
#[tokio::test]
async fn disconnected_requests_leave_the_queue() {
    let (base, engine) = start(EngineConfig {
        max_num_seqs: 1,
        inter_token_latency: Duration::from_millis(20),
        ..EngineConfig::default()
    })
    .await;
    let tasks = one_running_two_waiting(&base, &engine, 100_000).await;
    let start = tokio::time::Instant::now();
    for t in tasks {
        t.abort();
    }
    while (engine.running(), engine.waiting()) != (0, 0) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "left {} running, {} waiting",
            engine.running(),
            engine.waiting()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn render_and_tokenize_return_token_ids_for_peer_routers() {
    let (base, _) = start(fast()).await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}]});
    let v: Value = post(&format!("{base}/v1/chat/completions/render"), &chat)
        .await
        .json()
        .await
        .unwrap();
    let ids = v["token_ids"].as_array().unwrap();
    // "<|im_start|>user\nhello world<|im_end|>\n": <| im _ start |> user \n hello " world" <| im
    // _ end |> \n
    assert_eq!(ids.len(), 15, "{v}");
    let longer = json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}, {"role": "user", "content": "more"}]});
    let v2: Value = post(&format!("{base}/v1/chat/completions/render"), &longer)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        &v2["token_ids"].as_array().unwrap()[..14],
        &ids[..14],
        "a shared prefix gives shared ids"
    );
    let t: Value = post(
        &format!("{base}/tokenize"),
        &json!({"model": "m", "prompt": "abcdefgh"}),
    )
    .await
    .json()
    .await
    .unwrap();
    // One 8-byte word: two tokens of at most 6 bytes.
    assert_eq!(t["count"], 2);
    assert_eq!(t["tokens"].as_array().unwrap().len(), 2);
}

/// The simulator takes request parsing and rendering from the router (it must render exactly as
/// the router does) and nothing else: its KV blocks are hashed by its own chain, so a bug in the
/// router's hashing, index or scheduler is not mirrored by the engines the router is measured on.
/// (Its tests also read its `/metrics` with the router's parser.)
#[test]
fn only_parsing_and_rendering_come_from_the_router() {
    let sources = [
        ("engine.rs", include_str!("engine.rs")),
        ("kv_cache.rs", include_str!("kv_cache.rs")),
        ("lib.rs", include_str!("lib.rs")),
        ("main.rs", include_str!("main.rs")),
        ("pd.rs", include_str!("pd.rs")),
        ("pd/tests.rs", include_str!("pd/tests.rs")),
        ("server.rs", include_str!("server.rs")),
        ("tokenizer.rs", include_str!("tokenizer.rs")),
        ("tests.rs", include_str!("tests.rs")),
    ];
    let allowed = ["request::", "prompt::", "lenient_json::", "pod_metrics::"];
    // Split so that this test's own source does not match.
    let needle = concat!("prefix", "_picker::");
    for (file, text) in sources {
        for (at, _) in text.match_indices(needle) {
            let rest = &text[at + needle.len()..];
            assert!(
                allowed.iter().any(|m| rest.starts_with(m)),
                "{file} uses the router's {}",
                rest.lines().next().unwrap_or_default()
            );
        }
    }
}
