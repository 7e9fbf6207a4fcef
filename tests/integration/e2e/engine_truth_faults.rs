//! Every fault of an engine-truth setup degrades to the estimate, never below it: the same
//! requests (tenants' system prompts, and documents inside the user message, where the engines'
//! tokens cover only the head) go through Envoy to two fresh model-sims, once with no event
//! endpoints (the estimate) and once per fault, and each fault's hit rate (the sims' cached
//! tokens over the prompts' tokens) is at least the estimate's. Each fault is also named where
//! an operator looks: a metric says what went wrong. The same stack with events that work
//! matches documents past the head by the estimate, shown as `engine+estimate`.

use super::{chat, send};
use crate::harness::*;
use model_sim::engine::EngineConfig;
use prefix_picker::Config;
use prefix_picker::serve::Running;
use serde_json::{Value, json};

fn engine() -> EngineConfig {
    EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    }
}

/// A document inside the user message, before the question.
fn document(d: usize, question: usize) -> Value {
    let text = format!("Line of document {d}, quoted as it stands. ").repeat(40);
    json!({"model": "m", "messages": [
        {"role": "system", "content": "Answer from the document in the message."},
        {"role": "user", "content": format!("{text}\n\nQuestion {question}: what does it say?")}]})
}

/// Three tenants and two documents, four rounds, interleaved.
fn requests() -> Vec<Value> {
    let mut out = Vec::new();
    for round in 0..4 {
        for t in 0..3 {
            let system =
                format!("You are the assistant of tenant {t}. Keep the rules. ").repeat(20);
            out.push(chat(&system, &format!("question {round}")));
        }
        for d in 0..2 {
            out.push(document(d, round));
        }
    }
    out
}

/// Sends `requests()` in order; the hit rate the sims report.
async fn hit_rate(envoy: &Envoy) -> f64 {
    let (mut cached, mut prompt) = (0.0, 0.0);
    for body in requests() {
        let r = send(envoy, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let usage = &r.body["usage"];
        cached += usage["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap();
        prompt += usage["prompt_tokens"].as_f64().unwrap();
    }
    cached / prompt
}

/// The shipped picker section over `endpoints` (YAML list lines), with `tokenizer` in place of
/// the shipped one and `extra` picker keys.
fn config(endpoints: &str, tokenizer: &str, extra: &str) -> Config {
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str("endpoints:\n");
    doc.push_str(endpoints);
    let shipped = shipped_picker_section();
    assert!(shipped.contains("tokenizer: {source: engine}"));
    doc.push_str(&shipped.replace("tokenizer: {source: engine}", tokenizer));
    doc.push_str(extra);
    Config::parse(&doc).unwrap()
}

const ENGINE_TOKENIZER: &str = "tokenizer: {source: engine}";

/// Endpoint lines for `sims`, each with `events` (its event keys, from the sim).
fn endpoints(sims: &[Sim], events: impl Fn(&Sim) -> String) -> String {
    sims.iter()
        .map(|s| {
            format!(
                "- {{name: {}, namespace: default, address: \"{}\"{}}}\n",
                s.name,
                s.addr,
                events(s)
            )
        })
        .collect()
}

/// The sim's own event sockets, as `endpoint_yaml` writes them.
fn own_events(s: &Sim) -> String {
    let line = s.endpoint_yaml();
    let at = line.find(", kvEventsEndpoint").expect("the sim publishes");
    line[at..line.rfind('}').unwrap()].to_string()
}

/// Two fresh sims (publishing on `topic`), a picker on `make(sims)` and Envoy: the hit rate of
/// `requests()` and the picker, to read its metrics.
async fn run(topic: &str, make: impl Fn(&[Sim]) -> Config) -> (f64, Running) {
    let sims = [
        Sim::start_with_events_on("sim-0", engine(), topic).await,
        Sim::start_with_events_on("sim-1", engine(), topic).await,
    ];
    let picker = start_picker(make(&sims)).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    (hit_rate(&envoy).await, picker)
}

fn pod_series(family: &str, labels: &str, sim: &str) -> String {
    format!("{family}{{{labels}model_server_namespace=\"default\",model_server_pod=\"{sim}\"}}")
}

/// The estimate's hit rate on `requests()`: the shipped config with no event endpoints.
async fn estimate() -> f64 {
    run("", |sims| {
        config(&endpoints(sims, |_| String::new()), ENGINE_TOKENIZER, "")
    })
    .await
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_faults_keep_the_estimates_hit_rate() {
    let baseline = estimate().await;
    assert!(baseline > 0.5, "the estimate reuses: {baseline}");

    // The engines publish on a topic the picker was not told of.
    let (hit, picker) = run("kv-events", |sims| {
        config(
            &endpoints(sims, own_events),
            ENGINE_TOKENIZER,
            "  kvEvents: {topic: kv}\n",
        )
    })
    .await;
    assert!(hit >= baseline - 0.01, "wrong topic: {hit} < {baseline}");
    for sim in ["sim-0", "sim-1"] {
        let wrong = pod_series(
            "prefix_picker_kv_event_stream_total",
            "kind=\"wrong_topic\",",
            sim,
        );
        wait_metric(&picker, &wrong, 1.0).await;
        assert_eq!(
            metric(
                &picker,
                &pod_series("prefix_picker_engine_view_live", "", sim)
            )
            .await,
            0.0
        );
    }

    // A publisher that accepts the connection and never sends.
    let mut silent = zeromq::PubSocket::new();
    use zeromq::Socket;
    let silent_at = silent.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let (hit, picker) = run("", |sims| {
        config(
            &endpoints(sims, |_| format!(", kvEventsEndpoint: \"{silent_at}\"")),
            ENGINE_TOKENIZER,
            "",
        )
    })
    .await;
    assert!(
        hit >= baseline - 0.01,
        "silent publisher: {hit} < {baseline}"
    );
    for sim in ["sim-0", "sim-1"] {
        let connected = pod_series("prefix_picker_kv_events_connected", "", sim);
        wait_metric_eq(&picker, &connected, 1.0).await;
        assert_eq!(
            metric(
                &picker,
                &pod_series("prefix_picker_engine_view_live", "", sim)
            )
            .await,
            0.0
        );
    }
    drop(silent);

    // Nothing listens where the events should be.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_at = dead.local_addr().unwrap();
    drop(dead);
    let (hit, picker) = run("", |sims| {
        config(
            &endpoints(sims, |_| format!(", kvEventsEndpoint: \"tcp://{dead_at}\"")),
            ENGINE_TOKENIZER,
            "",
        )
    })
    .await;
    assert!(hit >= baseline - 0.01, "dead endpoint: {hit} < {baseline}");
    let connected = pod_series("prefix_picker_kv_events_connected", "", "sim-0");
    assert_eq!(metric(&picker, &connected).await, 0.0);
}

/// A tokenizer that answers `status` to everything, or never answers (`None`).
async fn bad_tokenizer(status: Option<u16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(move || async move {
        match status {
            Some(s) => axum::http::StatusCode::from_u16(s).unwrap(),
            None => std::future::pending().await,
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_faults_keep_the_estimates_hit_rate() {
    let baseline = estimate().await;
    for (fault, status, result) in [
        ("404", Some(404), "status"),
        ("500", Some(500), "status"),
        ("no answer", None, "timeout"),
    ] {
        let port = bad_tokenizer(status).await;
        let (hit, picker) = run("", |sims| {
            config(
                &endpoints(sims, own_events),
                &format!("tokenizer: {{source: engine, port: {port}}}"),
                "",
            )
        })
        .await;
        assert!(
            hit >= baseline - 0.01,
            "tokenizer {fault}: {hit} < {baseline}"
        );
        let calls = format!("prefix_picker_tokenize_calls_total{{result=\"{result}\"}}");
        wait_metric(&picker, &calls, 1.0).await;
    }
    // A tokenizer of the wrong kind: SGLang's body sent to vLLM engines (no
    // `add_generation_prompt`, which vLLM then defaults to true).
    let (hit, _) = run("", |sims| {
        config(
            &endpoints(sims, own_events),
            "tokenizer: {source: engine, engine: sglang}",
            "",
        )
    })
    .await;
    assert!(
        hit >= baseline - 0.01,
        "tokenizer engine: sglang against vLLM: {hit} < {baseline}"
    );
}

/// With events that work, a document inside the user message (past the only head another
/// request shares: the system message) attracts its next question to the pod that read it:
/// the engine confirms the head, the estimate the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_inside_the_message_is_matched_by_its_engine_tokens() {
    let baseline = estimate().await;
    let (hit, picker) = run("", |sims| {
        config(&endpoints(sims, own_events), ENGINE_TOKENIZER, "")
    })
    .await;
    assert!(hit >= baseline - 0.01, "events: {hit} < {baseline}");
    let e = explain(&picker, &document(1, 9)).await;
    let primary = e["primary"].as_str().unwrap().to_string();
    let picked = e["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == primary)
        .unwrap();
    assert_eq!(picked["match"]["source"], "engine+estimate", "{e}");
    assert!(
        picked["match"]["estimate_blocks_beyond"].as_u64().unwrap() > 0,
        "{e}"
    );
    // The engine speaks past the system message: the document was cut and tokenized once a
    // second request sent it (its head alone is under 20 tokens; the cut about 400).
    assert!(
        picked["match"]["engine_tokens"].as_u64().unwrap() > 200,
        "{e}"
    );
}
