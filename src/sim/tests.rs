//! The simulator over real HTTP (in-process server on port 0).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::engine::{Engine, EngineConfig};
use super::server::{SimConfig, app};

async fn start(engine: EngineConfig) -> (String, Arc<Engine>) {
    let engine = Arc::new(Engine::new(engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(
        SimConfig {
            name: "sim-0".into(),
            model: Some("m".into()),
            default_max_tokens: 4,
            seed: 1,
        },
        engine.clone(),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), engine)
}

fn fast() -> EngineConfig {
    EngineConfig {
        time_scale: 1e9,
        ..EngineConfig::default()
    }
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
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
    // The engine's counters say the same, in a format the picker's scraper reads.
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(&format!("vllm:prefix_cache_hits_total {cached}")),
        "{text}"
    );
    let parsed = crate::pod_metrics::parse(&text).unwrap();
    assert_eq!(parsed.ttft.count, 2);
    assert_eq!(parsed.running, 0.0);
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

#[tokio::test]
async fn sse_is_well_formed_for_every_api() {
    let (base, _) = start(fast()).await;
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "hi", "stream": true, "max_tokens": 5}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "hi", "stream": true, "max_output_tokens": 2}),
        ),
    ] {
        let r = post(&format!("{base}{path}"), &body).await;
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let text = r.text().await.unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(*events.last().unwrap(), "data: [DONE]", "{path}");
        for e in &events[..events.len() - 1] {
            let payload = e.strip_prefix("data: ").expect("data line");
            let v: Value = serde_json::from_str(payload).unwrap();
            assert!(v.is_object());
        }
        let last: Value =
            serde_json::from_str(events[events.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
        let usage = if path == "/v1/responses" {
            &last["response"]["usage"]
        } else {
            &last["usage"]
        };
        assert!(
            usage["prompt_tokens"].as_u64().unwrap() > 0,
            "{path}: {last}"
        );
    }
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
    let url = format!("{base}/v1/completions");
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                post(
                    &url,
                    &json!({"model": "m", "prompt": format!("p{i}"), "max_tokens": 50}),
                )
                .await
                .status()
            })
        })
        .collect();
    // Poll the engine until one runs and two queue.
    let start = tokio::time::Instant::now();
    while !(engine.running() == 1 && engine.waiting() == 2) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never saw 1 running + 2 waiting"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let m = crate::pod_metrics::parse(&text).unwrap();
    assert_eq!((m.running, m.waiting), (1.0, 2.0));
    for t in tasks {
        assert!(t.await.unwrap().is_success());
    }
    assert_eq!((engine.running(), engine.waiting()), (0, 0));
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
    // "<|im_start|>user\nhello world<|im_end|>\n" is 39 bytes: 10 tokens of 4 bytes.
    assert_eq!(ids.len(), 10);
    let longer = json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}, {"role": "user", "content": "more"}]});
    let v2: Value = post(&format!("{base}/v1/chat/completions/render"), &longer)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        &v2["token_ids"].as_array().unwrap()[..9],
        &ids[..9],
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
    assert_eq!(t["count"], 2);
    assert_eq!(t["tokens"].as_array().unwrap().len(), 2);
}
