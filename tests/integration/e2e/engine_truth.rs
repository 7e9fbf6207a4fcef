//! Engine truth through Envoy: model-sims publish vLLM's KV events and serve `/tokenize`; the
//! shipped config with `picker.tokenizer` matches their pods by what the engines hold. An
//! evicted prefix stops attracting requests at once, a restarted engine loses its entries (its
//! view and its estimate), a hold on a pod matched by its engine ends with the engine's store
//! of the held prompt, a pod with prefix caching off is never preferred, and garbage on an
//! event socket leaves routing intact. With the `file` tokenizer source (the sims and the
//! picker on the sim's `tokenizer.json`) requests are matched by the engines with no call to
//! their `/tokenize`. A picker started beside a warm, idle engine holds what it cached, from the
//! engine's replay buffer. Engines that connect to the picker's shared socket instead, each
//! naming its pod in its topic, are matched the same way.

use super::{chat, send};
use crate::harness::*;
use model_sim::engine::EngineConfig;
use prefix_picker::Config;
use prefix_picker::routing::{Ending, Served};
use prefix_picker::serve::Running;
use serde_json::Value;

/// Static endpoints (with their event sockets) and the shipped picker section.
fn engine_truth_config(sims: &[Sim], extra_endpoints: &str) -> Config {
    use testkit::scheduler_section;
    let mut doc =
        scheduler_section(include_str!("../fixtures/kthena-router-config.yaml")).to_string();
    doc.push_str("endpoints:\n");
    for s in sims {
        doc.push_str(&s.endpoint_yaml());
    }
    doc.push_str(extra_endpoints);
    // The shipped picker section turns the engine tokenizer on.
    doc.push_str(shipped_picker_section());
    Config::parse(&doc).unwrap()
}

fn engine() -> EngineConfig {
    EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    }
}

/// The explanation's entry for `pod`.
pub(super) fn pod<'a>(e: &'a Value, pod: &str) -> &'a Value {
    e["pods"]
        .as_array()
        .unwrap_or_else(|| panic!("no pods: {e}"))
        .iter()
        .find(|p| p["pod"] == format!("default/{pod}"))
        .unwrap_or_else(|| panic!("{pod} not explained: {e}"))
}

/// Waits until the picker is connected to each of `sims`' event publishers (a view is live
/// from the first batch after that).
pub(super) async fn wait_connected(picker: &Running, sims: &[&str]) {
    for s in sims {
        let series = format!(
            "prefix_picker_kv_events_connected{{model_server_namespace=\"default\",model_server_pod=\"{s}\"}}"
        );
        wait_metric_eq(picker, &series, 1.0).await;
    }
}

/// Makes each of `sims`' views live: a request of its own sent to each sim directly (not
/// through the picker), whose stored blocks are the view's first batch.
pub(super) async fn make_live(picker: &Running, sims: &[Sim]) {
    for s in sims {
        let warm = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", s.addr))
            .json(&chat(&format!("{} warms up. ", s.name).repeat(30), "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(warm.status(), 200);
        wait_metric_eq(picker, &view_series("live", &s.name), 1.0).await;
    }
}

/// `prefix_picker_engine_view_{what}` of `sim`.
fn view_series(what: &str, sim: &str) -> String {
    format!(
        "prefix_picker_engine_view_{what}{{model_server_namespace=\"default\",model_server_pod=\"{sim}\"}}"
    )
}

/// Waits until `sim`'s engine view holds at least `blocks` blocks (or, with 0, none).
pub(super) async fn wait_view(picker: &Running, sim: &str, blocks: f64) {
    let series = view_series("blocks", sim);
    if blocks == 0.0 {
        wait_metric_eq(picker, &series, 0.0).await;
    } else {
        wait_metric(picker, &series, blocks).await;
    }
}

/// Sends a tenant's first request and waits until its engine's view shows the stored blocks and
/// its shared head (the system message) is tokenized; the pod that served it.
async fn first_request_held(picker: &Running, envoy: &Envoy, body: &Value) -> String {
    let first = send(envoy, "/v1/chat/completions", body).await;
    assert_eq!(first.status, 200);
    wait_view(picker, &first.served_by, 4.0).await;
    wait_metric(
        picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;
    first.served_by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_prefix_stops_attracting_requests_at_once() {
    let sims = [
        Sim::start_with_events("sim-0", engine()).await,
        Sim::start_with_events("sim-1", engine()).await,
    ];
    let picker = start_picker(engine_truth_config(&sims, "")).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    make_live(&picker, &sims).await;
    let system = "You are the support agent of tenant seven. Answer briefly. ".repeat(20);
    // The engine announced what it stored, and the tenant's head was tokenized by it.
    let first = chat(&system, "first question");
    let holder = first_request_held(&picker, &envoy, &first).await;
    let next = chat(&system, "second question");
    let e = explain(&picker, &next).await;
    assert_eq!(e["primary"], format!("default/{holder}"), "{e}");
    let held = &pod(&e, &holder)["match"];
    assert_eq!(held["source"], "engine", "{e}");
    assert!(held["engine_tokens"].as_u64().unwrap() >= 64, "{e}");
    let r = send(&envoy, "/v1/chat/completions", &next).await;
    assert_eq!(r.served_by, holder);
    assert!(
        metric(
            &picker,
            "prefix_picker_match_source_total{source=\"engine\"}"
        )
        .await
            >= 1.0
    );
    // The first request again: a repeat, so its whole prompt is tokenized too. (Its hold,
    // whose head is shorter than its prompt, as the second's, ends with its request: the
    // engine's store of the head says nothing of the rest.)
    let r = send(&envoy, "/v1/chat/completions", &first).await;
    assert_eq!(r.served_by, holder);
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        2.0,
    )
    .await;
    // And again: its whole prompt is in the engine's tokens, so its hold awaits the engine's
    // store of it, which the engine holds already: confirmed at once.
    let r = send(&envoy, "/v1/chat/completions", &first).await;
    assert_eq!(r.served_by, holder);
    // The requests completed (their decision-time holds are gone: what follows is the
    // engine's view alone).
    wait_metric(
        &picker,
        "prefix_picker_tentative_records_total{outcome=\"confirmed\"}",
        1.0,
    )
    .await;
    wait_metric(&picker, ENGINE_CONFIRMED, 1.0).await;
    // The engine drops its cache: the prefix no longer attracts requests, with no completion
    // or scrape in between.
    let holder_sim = sims.iter().find(|s| s.name == holder).unwrap();
    assert!(holder_sim.engine.reset_prefix_cache());
    wait_view(&picker, &holder, 0.0).await;
    let third = chat(&system, "third question");
    let e = explain(&picker, &third).await;
    assert_eq!(pod(&e, &holder)["match"]["engine_tokens"], 0, "{e}");
    assert_eq!(pod(&e, &holder)["scores"]["prefix-cache"], 0, "{e}");

    // The first request, routed now, is held until its engine stores the prompt again: the
    // engine's event ends the hold, before the request completes. (Routed in process and sent
    // to its sim directly, so the completion comes after the event, whatever the timing.)
    let third = first;
    let body = serde_json::to_vec(&third).unwrap();
    let routed = picker
        .router
        .route("/v1/chat/completions", Some(&body), None)
        .unwrap();
    let ticket = routed.ticket;
    let hold = ticket.tentative.as_ref().expect("held");
    assert!(!hold.stored_by_engine());
    let served = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/chat/completions",
            ticket.primary().spec.address
        ))
        .json(&third)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    poll("the engine's store ends the hold", || async {
        hold.stored_by_engine().then_some(())
    })
    .await;
    picker.router.complete(
        ticket,
        Ending::Completed {
            status: Some(200),
            served: Served::NotReported,
            cached_tokens: None,
            first_byte: None,
            events: None,
        },
    );
    assert_eq!(metric(&picker, ENGINE_CONFIRMED).await, 2.0);
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_engine_holds_total{ended=\"request\"}"
        )
        .await,
        0.0
    );
}

/// Holds on pods matched by their engine that the engine confirmed.
const ENGINE_CONFIRMED: &str = "prefix_picker_engine_holds_total{ended=\"engine\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_loses_its_entries() {
    // model-sim processes, so one can be killed and started again on the same ports (its
    // event sequence starts over, as a restarted vLLM's does).
    let bin = testkit::workspace_bin("model-sim");
    let args = ["--time-scale".to_string(), "100".to_string()];
    let mut sims = testkit::Sim::start_n(&bin, 2, &args, |_| Vec::new()).unwrap();
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str("endpoints:\n");
    for s in &sims {
        let events = s.kv_events();
        doc.push_str(&format!(
            "- {{name: {}, namespace: default, address: \"{}\", kvEventsEndpoint: \"{}\", kvEventsReplayEndpoint: \"{}\"}}\n",
            s.name(),
            s.addr(),
            events.endpoint(),
            events.replay_endpoint()
        ));
    }
    doc.push_str(shipped_picker_section());
    let mut config = Config::parse(&doc).unwrap();
    // No scrape: the restart is learned from the events alone (a scrape would also see it, as
    // a new process start time, but only at its next round).
    config.picker.scrape_interval_seconds = 0.0;
    let picker = start_picker(config).await;
    let addrs: Vec<_> = sims.iter().map(|s| s.addr()).collect();
    let envoy = start_envoy_for_addrs(&picker, &addrs).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    let system = "You are the archivist of tenant nine. Quote the records exactly. ".repeat(20);
    let first = send(&envoy, "/v1/chat/completions", &chat(&system, "q1")).await;
    assert_eq!(first.status, 200);
    let holder = first.served_by.clone();
    wait_view(&picker, &holder, 4.0).await;
    // More of the tenant's requests (on the holder, by its engine's match), so the engine's
    // sequence is well past where the restarted one's starts again.
    for i in 2..10 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("q{i}")),
        )
        .await;
        assert_eq!(r.served_by, holder);
    }
    // The same text as a completion prompt: no engine tokens for it, so every pod is matched
    // by the estimate, where the first request's completion recorded it for the holder.
    let first_body = serde_json::to_vec(&chat(&system, "q1")).unwrap();
    let rendered = prefix_picker::request::InferenceRequest::parse_as(
        &first_body,
        prefix_picker::prompt::Rendering::Engine,
    )
    .unwrap()
    .prompt
    .unwrap();
    let as_text = serde_json::json!({"model": "m", "prompt": format!("{rendered} more")});
    wait_metric(&picker, "kthena_router_prefix_cache_entries", 1.0).await;
    let e = explain(&picker, &as_text).await;
    assert_eq!(pod(&e, &holder)["match"]["source"], "estimate", "{e}");
    assert!(
        pod(&e, &holder)["scores"]["prefix-cache"].as_u64().unwrap() > 0,
        "{e}"
    );

    let at = sims.iter().position(|s| s.name() == holder).unwrap();
    sims[at].restart().unwrap();
    // The new process's first batch (or its connection) tells the subscriber the sequence
    // started over: the view and the estimate are dropped, and the pod is live again.
    let resets = format!(
        "prefix_picker_kv_event_stream_total{{kind=\"reset\",model_server_namespace=\"default\",model_server_pod=\"{holder}\"}}"
    );
    // It is off (matched by the estimate) from the reconnect until a batch shows whether its
    // sequence continued: new prompts until the restarted engine publishes one the subscriber
    // receives (what it published before the subscriber reconnected is lost, as on any SUB).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for i in 0.. {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&format!("unrelated prompt {i} ").repeat(40), "w"),
        )
        .await;
        assert_eq!(r.status, 200);
        if metric(&picker, &resets).await >= 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reset seen after {i} requests"
        );
    }
    wait_metric_eq(&picker, &view_series("live", &holder), 1.0).await;
    let e = explain(&picker, &chat(&system, "q2")).await;
    let held = &pod(&e, &holder)["match"];
    assert_eq!(held["engine_tokens"], 0, "{e}");
    assert_eq!(pod(&e, &holder)["scores"]["prefix-cache"], 0, "{e}");
    // And its estimate went with it (no scrape here to see the restart).
    let e = explain(&picker, &as_text).await;
    assert_eq!(pod(&e, &holder)["scores"]["prefix-cache"], 0, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picker_started_beside_a_warm_engine_holds_what_it_cached() {
    let sims = [
        Sim::start_with_events("sim-0", engine()).await,
        Sim::start_with_events("sim-1", engine()).await,
    ];
    let system = "You are the lighthouse keeper of tenant three. Log every ship. ".repeat(20);
    // sim-1 serves the tenant before any picker runs, then idles: it publishes nothing more.
    let warm = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", sims[1].addr))
        .json(&chat(&system, "q1"))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), 200);
    let picker = start_picker(engine_truth_config(&sims, "")).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    // Its view holds the tenant's blocks, replayed at connect.
    wait_view(&picker, "sim-1", 4.0).await;
    assert_eq!(metric(&picker, &view_series("blocks", "sim-0")).await, 0.0);
    let replays = |pod: &str| {
        format!(
            "prefix_picker_kv_event_stream_total{{kind=\"replay\",model_server_namespace=\"default\",model_server_pod=\"{pod}\"}}"
        )
    };
    assert!(metric(&picker, &replays("sim-1")).await >= 1.0);
    // Once the tenant's head is in the engine's tokens, sim-1 is matched by what it cached
    // before the picker started (wherever this first request went).
    let r = send(&envoy, "/v1/chat/completions", &chat(&system, "q2")).await;
    assert_eq!(r.status, 200);
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;
    let e = explain(&picker, &chat(&system, "q3")).await;
    let held = &pod(&e, "sim-1")["match"];
    assert_eq!(held["source"], "engine", "{e}");
    assert!(held["engine_tokens"].as_u64().unwrap() >= 64, "{e}");
}

/// Engines that connect to the picker's shared socket (`picker.kvEvents.bind`, llm-d's
/// `zmqEndpoint`), each naming its pod in its topic (`kv@<IP:port>@<model>`, llm-d's guides),
/// are matched by what they hold, like pods with publishers of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_on_the_shared_socket_are_matched_by_what_they_hold() {
    use model_sim::engine::{Engine, EngineConfig};
    use model_sim::kv_events::KvEventsConfig;
    use model_sim::server::{SimConfig, app};
    // The pods' addresses first (the picker lists them), their engines once it listens.
    let mut listeners = Vec::new();
    for _ in 0..2 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str("endpoints:\n");
    for (i, a) in addrs.iter().enumerate() {
        doc.push_str(&format!(
            "- {{name: sim-{i}, namespace: default, address: \"{a}\"}}\n"
        ));
    }
    doc.push_str(shipped_picker_section());
    let mut config = Config::parse(&doc).unwrap();
    config.picker.kv_events.bind = Some("tcp://127.0.0.1:0".to_string().try_into().unwrap());
    let picker = start_picker(config).await;
    let bound = picker.kv_events_bound.clone().expect("the shared socket");
    let mut sims = Vec::new();
    for (i, (listener, addr)) in listeners.into_iter().zip(&addrs).enumerate() {
        let name = format!("sim-{i}");
        let events = KvEventsConfig {
            enable_kv_cache_events: true,
            // No `*`: the engine connects, as vLLM does.
            endpoint: bound.clone(),
            topic: format!("kv@{addr}@m"),
            ..KvEventsConfig::default()
        };
        let config = EngineConfig {
            kv_events: events,
            ..engine()
        };
        let engine = std::sync::Arc::new(Engine::start(config).await.unwrap());
        let sim = SimConfig {
            name: name.clone(),
            model: None,
            lora_adapters: Vec::new(),
            max_loras: 1,
            default_max_tokens: 1,
            seed: 0,
        };
        let router = app(sim, engine.clone());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        sims.push(Sim {
            name,
            addr: *addr,
            engine,
        });
    }
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    // Each engine's first batch after its connection reached the socket makes its view live (a
    // batch published before is lost, as on any PUB socket): warm each until it is.
    for s in &sims {
        let live = view_series("live", &s.name);
        let mut n = 0;
        poll(&format!("{} live", s.name), || {
            n += 1;
            let (addr, name, live, picker) = (s.addr, s.name.clone(), live.clone(), &picker);
            async move {
                let warm = reqwest::Client::new()
                    .post(format!("http://{addr}/v1/chat/completions"))
                    .json(&chat(&format!("{name} warms up {n}. ").repeat(30), "hi"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(warm.status(), 200);
                (metric_opt(picker, &live).await == Some(1.0)).then_some(())
            }
        })
        .await;
    }
    let routed = "prefix_picker_kv_events_shared_total{outcome=\"routed\"}";
    assert!(metric(&picker, routed).await >= 2.0);
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_kv_events_shared_total{outcome=\"unknown_pod\"}"
        )
        .await,
        0.0
    );
    // A tenant's first request: its engine stores the head, the picker tokenizes it; then the
    // pod that served it is matched by its engine.
    let system = "You are the harbour master of tenant nine. Log every tide. ".repeat(20);
    let served = first_request_held(&picker, &envoy, &chat(&system, "q1")).await;
    let e = explain(&picker, &chat(&system, "q2")).await;
    let held = &pod(&e, &served)["match"];
    assert_eq!(held["source"], "engine", "{e}");
    assert!(held["engine_tokens"].as_u64().unwrap() >= 64, "{e}");
    let r = send(&envoy, "/v1/chat/completions", &chat(&system, "q3")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.served_by, served, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_prefix_caching_off_is_never_preferred() {
    let off = EngineConfig {
        prefix_caching: false,
        ..engine()
    };
    let sims = [
        Sim::start_with_events("sim-0", off).await,
        Sim::start_with_events("sim-1", engine()).await,
    ];
    let picker = start_picker(engine_truth_config(&sims, "")).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    let system = "A long shared instruction block that every request carries. ".repeat(20);
    // Send until the caching pod holds the prefix (the first requests may land anywhere).
    let mut served = Vec::new();
    for i in 0..12 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("q{i}")),
        )
        .await;
        assert_eq!(r.status, 200);
        served.push(r.served_by);
    }
    wait_view(&picker, "sim-1", 4.0).await;
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;
    // From now on every request of the prefix goes to the pod that can reuse it.
    for i in 12..20 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat(&system, &format!("q{i}")),
        )
        .await;
        assert_eq!(r.served_by, "sim-1", "request {i}: {served:?}");
    }
    assert_eq!(
        metric(&picker, &view_series("blocks", "sim-0")).await,
        0.0,
        "caching off: nothing announced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_an_event_socket_leaves_routing_intact() {
    // A "publisher" that answers every connection with garbage bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64)).await;
        }
    });
    let plain = Sim::start("sim-0", engine()).await;
    let extra = format!(
        "- {{name: sim-0, namespace: default, address: \"{}\", kvEventsEndpoint: \"tcp://{garbage}\"}}\n",
        plain.addr
    );
    let sims = [Sim::start_with_events("sim-1", engine()).await];
    let picker = start_picker(engine_truth_config(&sims, &extra)).await;
    let envoy = start_envoy_for_addrs(&picker, &[plain.addr, sims[0].addr]).await;
    wait_connected(&picker, &["sim-1"]).await;
    for i in 0..8 {
        let r = send(
            &envoy,
            "/v1/chat/completions",
            &chat("garbage test", &format!("q{i}")),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        metric(&picker, &view_series("live", "sim-0")).await,
        0.0,
        "never connected: matched by the estimate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_tokenizer_matches_by_the_engine_without_asking_the_pods() {
    let dir = tempfile::tempdir().unwrap();
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let sim_engine = || EngineConfig {
        tokenizer: model_sim::tokenizer_json::default_tokenizer(),
        ..engine()
    };
    let sims = [
        Sim::start_with_events("sim-0", sim_engine()).await,
        Sim::start_with_events("sim-1", sim_engine()).await,
    ];
    let file = format!(
        "tokenizer: {{source: file, path: \"{}\"}}",
        dir.path().join("tokenizer.json").display()
    );
    let shipped = shipped_picker_section();
    assert!(shipped.contains("tokenizer: {source: engine}"));
    let mut doc = testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml"))
        .to_string();
    doc.push_str("endpoints:\n");
    for s in &sims {
        doc.push_str(&s.endpoint_yaml());
    }
    doc.push_str(&shipped.replace("tokenizer: {source: engine}", &file));
    let config = Config::parse(&doc).unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let picker = start_picker(config).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    wait_connected(&picker, &["sim-0", "sim-1"]).await;
    let system =
        "You are the cartographer of tenant four. Name every ridge and valley. ".repeat(20);
    // The tenant's shared head (its system message) tokenized in process.
    let holder = first_request_held(&picker, &envoy, &chat(&system, "q1")).await;
    for i in 2..6 {
        let next = chat(&system, &format!("q{i}"));
        let e = explain(&picker, &next).await;
        let held = &pod(&e, &holder)["match"];
        assert_eq!(held["source"], "engine", "{e}");
        // The engine holds the tenant's prompt in the tokens the picker computed.
        assert!(held["engine_tokens"].as_u64().unwrap() >= 64, "{e}");
        assert_eq!(e["primary"], format!("default/{holder}"), "{e}");
        let r = send(&envoy, "/v1/chat/completions", &next).await;
        assert_eq!(r.served_by, holder);
    }
    assert!(
        metric(
            &picker,
            "prefix_picker_match_source_total{source=\"engine\"}"
        )
        .await
            >= 4.0
    );
    for s in &sims {
        assert_eq!(s.engine.tokenize_requests(), 0, "{} was asked", s.name);
    }
    // One tokenization for five requests: each later question found the tenant's head and
    // queued nothing (its whole prompt is its own).
    assert_eq!(
        metric(&picker, "prefix_picker_tokenize_calls_total{result=\"ok\"}").await,
        1.0
    );
    let head = model_sim::tokenizer_json::default_tokenizer()
        .ids(format!("<|im_start|>system\n{system}<|im_end|>\n").as_bytes())
        .len();
    assert_eq!(
        metric(&picker, "prefix_picker_tokenized_tokens_total").await,
        head as f64
    );
}
