//! Anthropic's Messages API end to end, with a real client: the official `anthropic` Python SDK
//! (`tests/anthropic/requirements.txt`, in `.venv-anthropic`) talks to Envoy, which routes
//! through the picker (the shipped config: the affinity mode with the engine tokenizer) to
//! model-sims that publish KV events. A conversation's first request (`create`, with tools) is
//! answered with a `tool_use`; its second (`stream`, the `tool_result` sent back) lands on the
//! first one's pod, is matched by that engine's own tokens, and reports the cached input tokens;
//! `count_tokens` passes through. An `error` event or a stream cut before `message_stop` records
//! nothing (seen by the observer filter of `envoy/envoy-observer.yaml`).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::harness::*;
use model_sim::engine::EngineConfig;
use prefix_picker::Config;

/// The Python of `.venv-anthropic` (`$ANTHROPIC_PYTHON` first).
fn anthropic_python() -> PathBuf {
    let python = std::env::var_os("ANTHROPIC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-anthropic/bin/python"));
    assert!(
        python.exists(),
        "{} missing: run scripts/test (it installs tests/anthropic/requirements.txt into \
         .venv-anthropic and sets ANTHROPIC_PYTHON)",
        python.display()
    );
    python
}

/// One SDK call (`op`: create, stream or count_tokens) through `envoy`; its output.
async fn sdk(envoy: &Envoy, op: &str, params: &Value) -> Value {
    let request = json!({"base_url": envoy.url(""), "op": op, "params": params}).to_string();
    let output = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(anthropic_python())
            .arg(root().join("tests/anthropic/messages_client.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{op}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Static endpoints with their event sockets, and the shipped picker section (the affinity mode,
/// the engine tokenizer).
fn config(sims: &[Sim]) -> Config {
    use testkit::scheduler_section;
    let mut doc =
        scheduler_section(include_str!("../fixtures/kthena-router-config.yaml")).to_string();
    doc.push_str("endpoints:\n");
    for s in sims {
        doc.push_str(&s.endpoint_yaml());
    }
    doc.push_str(shipped_picker_section());
    Config::parse(&doc).unwrap()
}

fn engine() -> EngineConfig {
    EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    }
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city today",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]}})
}

async fn recorded(picker: &prefix_picker::serve::Running, n: f64) {
    wait_metric_eq(
        picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        n,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_keeps_a_conversation_on_its_pod() {
    let sims = [
        Sim::start_with_events("sim-0", engine()).await,
        Sim::start_with_events("sim-1", engine()).await,
        Sim::start_with_events("sim-2", engine()).await,
    ];
    let picker = start_picker(config(&sims)).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    for s in &sims {
        let series = format!(
            "prefix_picker_kv_events_connected{{model_server_namespace=\"default\",model_server_pod=\"{}\"}}",
            s.name
        );
        wait_metric_eq(&picker, &series, 1.0).await;
    }
    let system =
        "You are the weather agent of tenant nine. Call the tool, then answer. ".repeat(20);
    let question = json!({"role": "user", "content": "What is the weather in Paris today?"});
    let first = sdk(
        &envoy,
        "create",
        &json!({"model": "m", "max_tokens": 6, "system": system, "tools": [weather_tool()],
            "messages": [question]}),
    )
    .await;
    let message = &first["message"];
    assert_eq!(message["stop_reason"], "tool_use", "{first}");
    let call = &message["content"][0];
    assert_eq!(call["type"], "tool_use", "{first}");
    assert_eq!(call["name"], "get_weather", "{first}");
    assert!(call["input"]["city"].is_string(), "{first}");
    let pod = first["served_by"].as_str().unwrap().to_string();
    recorded(&picker, 1.0).await;
    // The engine tokenized the head the next turn shares (the system message).
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;

    // The tool's result goes back, streamed: the same pod, matched by its engine's tokens.
    let round_trip = json!({"model": "m", "max_tokens": 6, "system": system,
        "tools": [weather_tool()],
        "messages": [question, {"role": "assistant", "content": message["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                "content": [{"type": "text", "text": "Sunny, 21 degrees."}]}]}]});
    let explained = reqwest::Client::new()
        .post(format!(
            "http://{}/debug/explain?api=messages",
            picker.admin_addr
        ))
        .json(&round_trip)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(explained["api"], "/v1/messages", "{explained}");
    assert_eq!(
        explained["primary"],
        format!("default/{pod}"),
        "{explained}"
    );
    let second = sdk(&envoy, "stream", &round_trip).await;
    assert_eq!(second["served_by"], pod.as_str(), "{second}");
    let events: Vec<&str> = second["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{second}");
    assert_eq!(events.last(), Some(&"message_stop"), "{second}");
    let message = &second["message"];
    assert_eq!(message["content"][0]["type"], "text", "{second}");
    assert_eq!(message["stop_reason"], "max_tokens", "{second}");
    let usage = &message["usage"];
    let cached = usage["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached >= 64, "the system prompt is cached: {usage}");
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{usage}");
    recorded(&picker, 2.0).await;
    assert!(
        metric(
            &picker,
            "prefix_picker_engine_tokens_total{outcome=\"hit\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            &picker,
            "prefix_picker_match_source_total{source=\"engine\"}"
        )
        .await
            >= 1.0
    );

    // Counting tokens passes through: answered by a pod, routed by load, nothing recorded.
    let counted = sdk(
        &envoy,
        "count_tokens",
        &json!({"model": "m", "system": system, "messages": [question]}),
    )
    .await;
    assert!(
        counted["count"]["input_tokens"].as_u64().unwrap() > 64,
        "{counted}"
    );
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        2.0
    );
}

/// A backend that answers a streamed Messages request with 200 and an event stream that ends
/// with `error`, or stops before `message_stop`: the picker records nothing for either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_or_a_cut_stream_records_nothing() {
    use axum::response::IntoResponse;
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n";
    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n";
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let app = axum::Router::new().fallback(move |body: String| async move {
        let tail = if body.contains("error please") {
            error
        } else if body.contains("cut please") {
            ""
        } else {
            stop
        };
        (
            [("content-type", "text/event-stream")],
            format!("{start}{tail}"),
        )
            .into_response()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str(&format!(
        "endpoints:\n- {{name: pod-0, namespace: default, address: \"{addr}\"}}\n"
    ));
    doc.push_str(shipped_picker_section());
    let picker = start_picker(Config::parse(&doc).unwrap()).await;
    // The observer filter sees the response body (the access log alone would not).
    let envoy = start_envoy(render_envoy(
        "envoy-observer.yaml",
        picker.grpc_addr.port(),
        &[addr],
        |s| s,
    ))
    .await;
    let send = |text: &str| {
        let body = json!({"model": "m", "max_tokens": 4, "stream": true,
            "system": "A long enough system prompt to hash. ".repeat(8),
            "messages": [{"role": "user", "content": text}]});
        let url = envoy.url("/v1/messages");
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    assert!(send("error please").await.contains("overloaded_error"));
    wait_metric_eq(
        &picker,
        "prefix_picker_records_total{outcome=\"failed\"}",
        1.0,
    )
    .await;
    assert!(!send("cut please").await.contains("message_stop"));
    wait_metric_eq(
        &picker,
        "prefix_picker_records_total{outcome=\"aborted\"}",
        1.0,
    )
    .await;
    assert!(send("whole").await.contains("message_stop"));
    recorded(&picker, 1.0).await;
    assert_eq!(
        metric_opt(&picker, "prefix_picker_records_total{outcome=\"failed\"}").await,
        Some(1.0)
    );
}
