//! PD roles over real HTTP: decode and prefill sims in process on port 0.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::engine::{Engine, EngineConfig};
use crate::tests::start_named;

fn sim(role: Option<Role>) -> EngineConfig {
    EngineConfig {
        time_scale: 1e9,
        pd: PdConfig {
            role,
            ..PdConfig::default()
        },
        ..EngineConfig::default()
    }
}

/// `host:port` of a sim's base URL.
fn host_port(base: &str) -> &str {
    base.strip_prefix("http://").unwrap()
}

/// A chat request for `prompt` with `max_tokens`, naming `peer` in the PD header if given.
async fn chat(base: &str, prompt: &str, peer: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": "m", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 5}),
        );
    if let Some(peer) = peer {
        request = request.header(PREFILLER_HEADER, peer);
    }
    request.send().await.unwrap()
}

async fn exposition(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of one series (`name` or `name{labels}`) in an exposition, `None` if absent.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Requests that reached the engine (each observes one TTFT).
fn served(text: &str) -> f64 {
    value(text, "vllm:time_to_first_token_seconds_count")
}

fn remote(text: &str, outcome: Outcome) -> f64 {
    value(
        text,
        &format!(
            "model_sim_remote_prefills_total{{outcome=\"{}\"}}",
            outcome.as_str()
        ),
    )
}

fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_decode_sim_has_the_named_peer_prefill_and_a_repeat_hits_both_caches() {
    let (prefill, _) = start_named("prefill-0", sim(Some(Role::Prefill))).await;
    let (bystander, _) = start_named("prefill-1", sim(Some(Role::Prefill))).await;
    let (decode, _) = start_named("decode-0", sim(Some(Role::Decode))).await;
    let prompt = "a long shared system prompt ".repeat(40);

    let r = chat(&decode, &prompt, Some(host_port(&prefill))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-served-by"], "decode-0");
    assert_eq!(r.headers()["x-prefilled-by"], "prefill-0");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"], 5,
        "the decode side decodes in full"
    );
    let (tokens, cached) = usage(&v);
    assert!(tokens > 100, "{v}");
    assert_eq!(cached, tokens, "nothing was prefilled on the decode side");
    let t = tokens as f64;

    // Exactly one prefill, on the named peer, of one output token, counted there as usual.
    let p = exposition(&prefill).await;
    assert_eq!(served(&p), 1.0);
    assert_eq!(value(&p, "vllm:inter_token_latency_seconds_count"), 0.0);
    assert_eq!(value(&p, "vllm:prefix_cache_queries_total"), t);
    assert_eq!(value(&p, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(value(&p, "model_sim_role{role=\"prefill\"}"), 1.0);
    assert_eq!(served(&exposition(&bystander).await), 0.0);
    // The decode side received the whole prompt: no local query, no miss.
    let d = exposition(&decode).await;
    assert_eq!(value(&d, "model_sim_role{role=\"decode\"}"), 1.0);
    assert_eq!(remote(&d, Outcome::Ok), 1.0);
    assert_eq!(value(&d, "vllm:external_prefix_cache_queries_total"), t);
    assert_eq!(value(&d, "vllm:external_prefix_cache_hits_total"), t);
    assert_eq!(value(&d, "vllm:prefix_cache_queries_total"), 0.0);
    assert_eq!(value(&d, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(value(&d, "vllm:inter_token_latency_seconds_count"), 4.0);

    // The same request again: the peer prefills from its cache; the decode side finds the
    // prompt's blocks in its own cache (admitted on the first request) and receives the tail.
    let r = chat(&decode, &prompt, Some(host_port(&prefill))).await;
    assert_eq!(r.status(), 200);
    let (_, cached) = usage(&r.json().await.unwrap());
    assert_eq!(cached, tokens);
    let p = exposition(&prefill).await;
    assert_eq!(served(&p), 2.0);
    let prefill_hits = value(&p, "vllm:prefix_cache_hits_total");
    assert!(prefill_hits > 0.0 && t - prefill_hits < 16.0, "{p}");
    assert_eq!(value(&p, "vllm:prefix_cache_queries_total"), 2.0 * t);
    let d = exposition(&decode).await;
    assert_eq!(remote(&d, Outcome::Ok), 2.0);
    let local_hits = value(&d, "vllm:prefix_cache_hits_total");
    assert!(local_hits > 0.0 && t - local_hits < 16.0, "{d}");
    assert_eq!(value(&d, "vllm:prefix_cache_queries_total"), local_hits);
    assert_eq!(
        value(&d, "vllm:external_prefix_cache_hits_total"),
        t + (t - local_hits)
    );
}

#[tokio::test]
async fn a_streamed_decode_prefills_remotely_first() {
    let (prefill, _) = start_named("prefill-0", sim(Some(Role::Prefill))).await;
    let (decode, _) = start_named("decode-0", sim(Some(Role::Decode))).await;
    let r = reqwest::Client::new()
        .post(format!("{decode}/v1/completions"))
        .header(PREFILLER_HEADER, host_port(&prefill))
        .json(
            &json!({"model": "m", "prompt": "hello world ".repeat(30), "max_tokens": 3,
            "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-prefilled-by"], "prefill-0");
    let text = r.text().await.unwrap();
    // 3 tokens, the usage chunk, [DONE].
    assert_eq!(text.matches("data: ").count(), 5, "{text}");
    let p = exposition(&prefill).await;
    assert_eq!(served(&p), 1.0);
    assert_eq!(value(&p, "vllm:inter_token_latency_seconds_count"), 0.0);
}

#[tokio::test]
async fn without_the_header_or_a_decode_role_a_sim_prefills_locally() {
    let (prefill, _) = start_named("prefill-0", sim(Some(Role::Prefill))).await;
    let (decode, _) = start_named("decode-0", sim(Some(Role::Decode))).await;
    let (plain, _) = start_named("plain", sim(None)).await;
    let prompt = "something to prefill here ".repeat(20);

    // A decode sim without the header.
    let r = chat(&decode, &prompt, None).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-prefilled-by").is_none());
    let (tokens, cached) = usage(&r.json().await.unwrap());
    assert_eq!(cached, 0);
    let d = exposition(&decode).await;
    assert_eq!(value(&d, "vllm:prefix_cache_queries_total"), tokens as f64);
    assert_eq!(value(&d, "vllm:external_prefix_cache_queries_total"), 0.0);
    for o in Outcome::ALL {
        assert_eq!(remote(&d, o), 0.0, "{}", o.as_str());
    }

    // A sim without a role, and a prefill sim, ignore the header.
    let peer = Some(host_port(&decode));
    for base in [&plain, &prefill] {
        let r = chat(base, &prompt, peer).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-prefilled-by").is_none());
        let text = exposition(base).await;
        assert_eq!(
            value(&text, "vllm:prefix_cache_queries_total"),
            tokens as f64
        );
    }
    assert_eq!(served(&exposition(&decode).await), 1.0, "never asked");
    // A sim without a role exports no PD series.
    let text = exposition(&plain).await;
    assert!(
        !text.contains("model_sim_role")
            && !text.contains("model_sim_remote")
            && !text.contains("external"),
        "{text}"
    );
}

#[tokio::test]
async fn a_failing_or_unreachable_peer_is_a_502_within_the_timeout() {
    let timeout = Duration::from_millis(300);
    let (decode, engine) = start_named(
        "decode-0",
        EngineConfig {
            pd: PdConfig {
                role: Some(Role::Decode),
                prefill_timeout: timeout,
                ..PdConfig::default()
            },
            ..sim(None)
        },
    )
    .await;
    // Nothing listens: connection refused.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    // Accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    // Answers 500.
    let broken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broken_addr = broken.local_addr().unwrap().to_string();
    let app = axum::Router::new()
        .fallback(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "out of KV") });
    tokio::spawn(async move { axum::serve(broken, app).await.unwrap() });

    for (peer, status, says) in [
        (closed.as_str(), 502, "unreachable"),
        (silent_addr.as_str(), 502, "did not answer in time"),
        (
            broken_addr.as_str(),
            502,
            "answered 500 Internal Server Error: out of KV",
        ),
        ("no-port", 400, "must be host:port"),
    ] {
        let sent = Instant::now();
        let r = chat(&decode, "hello", Some(peer)).await;
        let took = sent.elapsed();
        assert_eq!(r.status().as_u16(), status, "{peer}");
        assert!(took < timeout * 10, "{peer}: {took:?}");
        let v: Value = r.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{peer}: {message}");
        if status == 502 {
            assert!(message.contains(peer), "{message}");
            assert_eq!(v["error"]["type"], "server_error");
        }
    }
    let d = exposition(&decode).await;
    for o in [
        Outcome::Unreachable,
        Outcome::Timeout,
        Outcome::Failed,
        Outcome::BadHeader,
    ] {
        assert_eq!(remote(&d, o), 1.0, "{}", o.as_str());
    }
    assert_eq!(remote(&d, Outcome::Ok), 0.0);
    // Nothing reached the engine.
    assert_eq!(served(&d), 0.0);
    assert_eq!((engine.running(), engine.waiting()), (0, 0));
}

#[test]
fn the_peer_header_must_be_host_port() {
    let parse = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(PREFILLER_HEADER, v.parse().unwrap());
        peer(&h).unwrap().map_err(|e| e.outcome)
    };
    assert_eq!(parse("10.0.0.7:8000"), Ok("10.0.0.7:8000".into()));
    assert_eq!(parse("prefill-0.svc:80"), Ok("prefill-0.svc:80".into()));
    assert_eq!(parse("[::1]:8000"), Ok("[::1]:8000".into()));
    for bad in [
        "10.0.0.7",
        ":80",
        "h:0",
        "h:99999",
        "h/x:80",
        "user@h:80",
        "h:80/path",
    ] {
        assert_eq!(parse(bad), Err(Outcome::BadHeader), "{bad}");
    }
    assert!(peer(&HeaderMap::new()).is_none());
}

#[test]
fn the_prefill_body_asks_one_token_not_streamed() {
    let chat = json!({"model": "m", "messages": [], "max_completion_tokens": 50, "stream": true,
        "stream_options": {"include_usage": true}, "temperature": 0.2});
    assert_eq!(
        prefill_body(Api::ChatCompletions, &chat),
        json!({"model": "m", "messages": [], "max_tokens": 1, "max_completion_tokens": 1,
            "stream": false, "temperature": 0.2,
            "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}})
    );
    let completion = json!({"model": "m", "prompt": "p", "max_tokens": 9});
    let body = prefill_body(Api::Completions, &completion);
    assert_eq!(
        (body["max_tokens"].clone(), body["stream"].clone()),
        (json!(1), json!(false))
    );
    let responses = json!({"model": "m", "input": "p", "max_output_tokens": 9});
    let body = prefill_body(Api::Responses, &responses);
    assert_eq!(body["max_output_tokens"], 1);
    assert!(body.get("max_tokens").is_none());
}

/// The KV transfer costs `kv_transfer_per_token` per received token, instead of the prefill.
#[tokio::test]
async fn received_tokens_cost_the_transfer_not_the_prefill() {
    let per_token = Duration::from_micros(10);
    let engine = Arc::new(Engine::new(EngineConfig {
        overhead: Duration::ZERO,
        prefill_per_token: Duration::from_millis(1),
        time_scale: 2.0,
        pd: PdConfig {
            role: Some(Role::Decode),
            kv_transfer_per_token: per_token,
            ..PdConfig::default()
        },
        ..EngineConfig::default()
    }));
    let prompt = "x".repeat(266); // 45 tokens: 2 full 16-token blocks and 13 more
    let first = engine.admit_received("m", prompt.as_bytes()).await;
    assert_eq!(first.received_tokens(), 45);
    assert_eq!(first.cached_tokens(), 45);
    assert_eq!(first.ttft(), per_token * 45 / 2);
    drop(first);
    let again = engine.admit_received("m", prompt.as_bytes()).await;
    assert_eq!(again.admission().cached_tokens, 32);
    assert_eq!(again.received_tokens(), 13);
    assert_eq!(again.ttft(), per_token * 13 / 2);
    drop(again);
    // Without a role, nothing is received: the prompt is prefilled.
    let plain = Arc::new(Engine::new(EngineConfig {
        pd: PdConfig::default(),
        ..EngineConfig::default()
    }));
    let local = plain.admit_received("m", prompt.as_bytes()).await;
    assert_eq!((local.received_tokens(), local.cached_tokens()), (0, 0));
}
