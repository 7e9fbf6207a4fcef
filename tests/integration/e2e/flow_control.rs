//! Flow control (`picker.flowControl`) through Envoy: a request held in the picker's queue
//! longer than Envoy's message timeout is still answered (each shipped bootstrap as shipped: the
//! picker's `override_message_timeout` within `max_message_timeout`, or no timer in
//! FULL_DUPLEX_STREAMED); a flood of one tenant does not starve a second; past the queue's
//! bounds, 429 with `retry-after` and the drop reason; an `EndpointPickerConfig`'s
//! `flowControl` (with llm-d's feature gate) bounds the same queue; in Kthena's mode, Kthena's
//! fairness settings (its router's environment) turn it on: a light user (a JWT's subject) is
//! served ahead of a flooding one, and `FAIRNESS_QUEUE_TIMEOUT` is the TTL.

use std::time::{Duration, Instant};

use super::*;
use model_sim::engine::EngineConfig;

/// One backend that takes one request at a time (`maxInFlightPerPod: 1`), the picker in the
/// affinity mode (flow control on by default), and Envoy with `file` edited by `edit`.
async fn one_slot(
    file: &str,
    extra: &str,
    edit: fn(String) -> String,
) -> (Backend, Running, Envoy) {
    let backend = Backend::start("pod-a").await;
    let picker = start_picker(picker_config(
        &[&backend],
        &format!("picker: {{affinity: {{}}, flowControl: {{enabled: true, maxInFlightPerPod: 1, {extra}}}}}\n"),
    ))
    .await;
    let envoy = start_envoy(render_envoy(
        file,
        picker.grpc_addr.port(),
        &[backend.addr],
        edit,
    ))
    .await;
    (backend, picker, envoy)
}

use prefix_picker::serve::Running;

/// Holds a request for `hold` behind a gated stream that fills the only slot; returns its reply
/// and how long it took.
async fn held_request(
    backend: &Backend,
    picker: &Running,
    envoy: &Envoy,
    hold: Duration,
) -> (Reply, Duration) {
    let gated = json!({"model": "m", "prompt": "GATED fills the slot", "stream": true});
    let (served, rest) = open_gated_stream(envoy, &gated).await;
    assert_eq!(served, "pod-a");
    let start = Instant::now();
    let url = envoy.url("/v1/completions");
    let waiting = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .json(&json!({"model": "m", "prompt": "held until the slot frees"}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let served_by = r
            .headers()
            .get("x-served-by")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = r.json::<Value>().await.unwrap_or(Value::Null);
        (
            Reply {
                status,
                served_by,
                body,
            },
            start.elapsed(),
        )
    });
    wait_metric_eq(
        picker,
        "prefix_picker_flow_queue_requests{priority=\"0\"}",
        1.0,
    )
    .await;
    tokio::time::sleep(hold).await;
    assert!(!waiting.is_finished(), "answered while its slot was taken");
    finish_gated_stream(std::slice::from_ref(backend), &served, rest).await;
    waiting.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_longer_than_the_message_timeout_succeeds_in_each_bootstrap() {
    // As shipped: the recommended envoy.yaml and the GIE shape (FULL_DUPLEX_STREAMED: Envoy
    // keeps no timer), the observer shape (BUFFERED, message_timeout 5 s) held past its 5 s, and
    // the fail-open one (0.2 s): the held request is answered by the pod, after the hold.
    let cases = [
        ("envoy.yaml", Duration::from_millis(1500)),
        ("envoy-full-duplex.yaml", Duration::from_millis(1500)),
        ("envoy-observer.yaml", Duration::from_millis(5500)),
        ("envoy-fail-open.yaml", Duration::from_millis(1500)),
    ];
    for (file, hold) in cases {
        let (backend, picker, envoy) = one_slot(file, "", |s| s).await;
        let (reply, took) = held_request(&backend, &picker, &envoy, hold).await;
        assert_eq!(
            reply.status,
            200,
            "{file}: {:?}\n{}",
            reply.body,
            envoy.log()
        );
        assert_eq!(reply.served_by, "pod-a", "{file}");
        assert!(took >= hold, "{file}: answered after {took:?}");
        wait_metric_eq(
            &picker,
            "prefix_picker_flow_dispatches_total{reason=\"room\"}",
            1.0,
        )
        .await;
        assert_eq!(
            metric(&picker, "prefix_picker_flow_queued_seconds_count").await,
            1.0,
            "{file}"
        );
        assert!(
            metric(&picker, "prefix_picker_flow_queued_seconds_sum").await >= hold.as_secs_f64()
        );
        assert_eq!(
            metric(&picker, "prefix_picker_flow_queue_requests{priority=\"0\"}").await,
            0.0
        );
        // Both requests completed, nothing left in flight.
        wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
    }
}

/// With the one slot held by a gated stream and a queue bound of one request: one request
/// waits (the bound), the next is refused at once, 429 with `retry-after: 7` and the drop
/// reason. Returns the gated stream, the waiting request's status and the refusal.
async fn one_queued_then_refused(
    picker: &Running,
    envoy: &Envoy,
) -> (
    String,
    impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin + use<>,
    tokio::task::JoinHandle<u16>,
    reqwest::Response,
) {
    let gated = json!({"model": "m", "prompt": "GATED fills the slot", "stream": true});
    let (served, rest) = open_gated_stream(envoy, &gated).await;
    let url = envoy.url("/v1/completions");
    let waiting = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({"model": "m", "prompt": "queued"}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    wait_metric_eq(
        picker,
        "prefix_picker_flow_queue_requests{priority=\"0\"}",
        1.0,
    )
    .await;
    let r = reqwest::Client::new()
        .post(envoy.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": "one too many"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    assert_eq!(r.headers()["x-llm-d-request-dropped-reason"], "queue_full");
    (served, rest, waiting, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_429_with_retry_after_and_the_reason() {
    let (backend, picker, envoy) =
        one_slot("envoy.yaml", "maxRequests: 1, retryAfterSeconds: 7", |s| s).await;
    let (served, rest, waiting, r) = one_queued_then_refused(&picker, &envoy).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_flow_drops_total{reason=\"queue_full\"}"
        )
        .await,
        1.0
    );
    finish_gated_stream(std::slice::from_ref(&backend), &served, rest).await;
    assert_eq!(waiting.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_queued_leaves_the_queue() {
    let (backend, picker, envoy) = one_slot("envoy.yaml", "", |s| s).await;
    let gated = json!({"model": "m", "prompt": "GATED fills the slot", "stream": true});
    let (served, rest) = open_gated_stream(&envoy, &gated).await;
    let url = envoy.url("/v1/completions");
    let client = tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .json(&json!({"model": "m", "prompt": "gives up"}))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
    });
    wait_metric_eq(
        &picker,
        "prefix_picker_flow_queue_requests{priority=\"0\"}",
        1.0,
    )
    .await;
    client.await.unwrap();
    wait_metric_eq(
        &picker,
        "prefix_picker_flow_drops_total{reason=\"cancelled\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "prefix_picker_flow_queue_requests{priority=\"0\"}").await,
        0.0
    );
    finish_gated_stream(std::slice::from_ref(&backend), &served, rest).await;
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_flow_dispatches_total{reason=\"room\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_tenant_does_not_starve_another() {
    // Two engines running one request at a time; a heavy tenant's 10 clients send long prompts
    // back to back, a light tenant's one client short ones: the light tenant's requests wait
    // for about one free slot, the heavy tenant's for their turn.
    let engine = EngineConfig {
        max_num_seqs: 1,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", engine.clone()).await,
        Sim::start("sim-1", engine).await,
    ];
    let picker = start_picker(sims_config(
        &sims,
        "picker: {affinity: {}, flowControl: {enabled: true, maxInFlightPerPod: 1}}\n",
    ))
    .await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let send_as = |tenant: &'static str, prompt: String| {
        let url = envoy.url("/v1/completions");
        async move {
            let start = Instant::now();
            let r = reqwest::Client::new()
                .post(url)
                .header("x-gateway-inference-fairness-id", tenant)
                .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            (status, start.elapsed())
        }
    };
    let long = "a long shared document for the heavy tenant. ".repeat(40);
    let mut heavy = Vec::new();
    for c in 0..10 {
        let (url, long) = (envoy.url("/v1/completions"), long.clone());
        heavy.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..4 {
                let start = Instant::now();
                let r = reqwest::Client::new()
                    .post(&url)
                    .header("x-gateway-inference-fairness-id", "heavy")
                    .json(&json!({"model": "m", "prompt": format!("{long} client {c} request {i}"), "max_tokens": 4}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                out.push((status, start.elapsed()));
            }
            out
        }));
    }
    // The flood is queued before the light tenant starts.
    poll("the heavy tenant queues", || async {
        (metric_opt(&picker, "prefix_picker_flow_queue_requests{priority=\"0\"}")
            .await
            .unwrap_or(0.0)
            >= 4.0)
            .then_some(())
    })
    .await;
    let mut light = Vec::new();
    for i in 0..3 {
        light.push(send_as("light", format!("a short question {i}")).await);
    }
    let mut heavy_times = Vec::new();
    for h in heavy {
        heavy_times.extend(h.await.unwrap());
    }
    assert!(
        heavy_times.iter().all(|(s, _)| *s == 200),
        "{heavy_times:?}"
    );
    assert!(light.iter().all(|(s, _)| *s == 200), "{light:?}");
    let mut heavy_ms: Vec<u128> = heavy_times.iter().map(|(_, t)| t.as_millis()).collect();
    heavy_ms.sort_unstable();
    let heavy_median = heavy_ms[heavy_ms.len() / 2];
    let light_max = light.iter().map(|(_, t)| t.as_millis()).max().unwrap();
    assert!(
        light_max < heavy_median,
        "light tenant's slowest {light_max} ms, heavy tenant's median {heavy_median} ms"
    );
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_flow_drops_total{reason=\"ttl_expired\"}"
        )
        .await,
        0.0
    );
    assert!(
        metric(
            &picker,
            "prefix_picker_flow_served_tokens_total{flow=\"light\"}"
        )
        .await
            > 0.0
    );
}

/// Sends `n` requests through Envoy, each on its own task: their status and serving pod.
fn spawn_requests(
    envoy: &Envoy,
    tag: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    (0..n)
        .map(|i| {
            let (url, prompt) = (envoy.url("/v1/completions"), format!("{tag} {i}"));
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .json(&json!({"model": "m", "prompt": prompt}))
                    .send()
                    .await
                    .unwrap();
                let served_by = r
                    .headers()
                    .get("x-served-by")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                (r.status().as_u16(), served_by)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picker_restart_while_requests_are_queued_loses_none() {
    // The picker as a process. A stream fills the only slot and three requests queue; SIGTERM
    // (a rollout): the picker sends every queued request on at once (`drain`) and each is
    // answered 200 by the pod. A picker started again on the same port routes what comes next
    // (Envoy reconnects). One killed outright (SIGKILL) with two requests queued: their ext_proc
    // streams break and Envoy answers them 5xx at once (fail-closed), none left hanging; a
    // client (or an Envoy retry policy on 5xx) sends them again.
    let backend = Backend::start("pod-a").await;
    let config = format!(
        "{}picker: {{affinity: {{}}, shutdownDelaySeconds: 0, shutdownGraceSeconds: 5, flowControl: {{maxInFlightPerPod: 1}}}}\n",
        endpoints_yaml(std::slice::from_ref(&backend))
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    let (picker, admin) = testkit::start_picker(&bin, dir.path(), &config, 2).unwrap();
    let grpc = picker.addr;
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        grpc.port(),
        &[backend.addr],
        |s| s,
    ))
    .await;
    let queue = "prefix_picker_flow_queue_requests{priority=\"0\"}";
    let gated = json!({"model": "m", "prompt": "GATED fills the slot", "stream": true});
    let (served, rest) = open_gated_stream(&envoy, &gated).await;
    let queued = spawn_requests(&envoy, "queued before the restart", 3);
    poll("three requests queue", || async {
        (metric_at(admin, queue).await == 3.0).then_some(())
    })
    .await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &picker.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    for q in queued {
        assert_eq!(
            q.await.unwrap(),
            (200, "pod-a".to_string()),
            "{}",
            envoy.log()
        );
    }
    finish_gated_stream(std::slice::from_ref(&backend), &served, rest).await;
    let picker = tokio::task::spawn_blocking(move || {
        let (mut picker, started) = (picker, Instant::now());
        while picker.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the drained picker exits"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        picker
    })
    .await
    .unwrap();
    drop(picker);

    // Started again where Envoy looks for it.
    let (picker, admin) = testkit::restart_picker_on(&bin, dir.path(), &config, 2, grpc).unwrap();
    poll("a picker started again routes", || async {
        let r = send(
            &envoy,
            "/v1/completions",
            &json!({"model": "m", "prompt": "after"}),
        )
        .await;
        (r.status == 200 && r.served_by == "pod-a").then_some(())
    })
    .await;

    // Killed with requests queued: answered 5xx, not held.
    let (served, rest) = open_gated_stream(&envoy, &gated).await;
    let queued = spawn_requests(&envoy, "queued when the picker dies", 2);
    poll("two requests queue", || async {
        (metric_at(admin, queue).await == 2.0).then_some(())
    })
    .await;
    drop(picker); // SIGKILL
    for q in queued {
        let (status, _) = q.await.unwrap();
        assert!(status >= 500, "{status}\n{}", envoy.log());
    }
    finish_gated_stream(std::slice::from_ref(&backend), &served, rest).await;
}

/// An `EndpointPickerConfig` with llm-d's `flowControl` feature gate (llm-d's default profile,
/// no affinity mode): its `flowControl` bound and TTL are the queue's, so with the one slot
/// taken one request waits and the next is refused 429 past `maxRequests: 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_picker_configs_flow_control_queues_and_bounds_requests() {
    let backend = Backend::start("pod-a").await;
    let config = picker_config(
        &[&backend],
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
flowControl: {maxRequests: 1, defaultRequestTTL: 30s}
picker: {flowControl: {maxInFlightPerPod: 1, retryAfterSeconds: 7}}
",
    );
    assert!(config.scheduler.epp.is_some() && config.picker.flow_control.active);
    assert_eq!(config.picker.flow_control.request_ttl_seconds, 30.0);
    let picker = start_picker(config).await;
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        picker.grpc_addr.port(),
        &[backend.addr],
        |s| s,
    ))
    .await;
    let (served, rest, waiting, _) = one_queued_then_refused(&picker, &envoy).await;
    finish_gated_stream(std::slice::from_ref(&backend), &served, rest).await;
    assert_eq!(
        waiting.await.unwrap(),
        200,
        "dispatched when the slot freed"
    );
}

/// One backend, a bare Kthena routerConfiguration (its `auth:` with a JWKS: Kthena's users are
/// the JWTs' subjects), and Kthena's fairness settings as its router's environment: `vars` on
/// top of `ENABLE_FAIRNESS_SCHEDULING=true` and `FAIRNESS_MAX_CONCURRENT=1` (one request in
/// flight for the model).
async fn kthena_fairness(vars: &[(&str, &str)]) -> (Backend, Running, Envoy) {
    let backend = Backend::start("pod-a").await;
    let mut env: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("ENABLE_FAIRNESS_SCHEDULING".into(), "true".into());
    env.insert("FAIRNESS_MAX_CONCURRENT".into(), "1".into());
    let doc = format!(
        "{}auth: {{issuer: https://issuer.example, jwksUri: https://issuer.example/jwks}}\n",
        endpoints_yaml(std::slice::from_ref(&backend))
    );
    let config =
        prefix_picker::config::Config::parse_with_env(&doc, &|name| env.get(name).cloned())
            .unwrap();
    assert!(config.picker.affinity.is_none(), "Kthena's mode");
    assert!(config.picker.flow_control.active);
    let picker = start_picker(config).await;
    let envoy = envoy_for(
        "envoy.yaml",
        picker.grpc_addr.port(),
        std::slice::from_ref(&backend),
    )
    .await;
    (backend, picker, envoy)
}

/// The model's one slot taken by a gated stream of `user`'s: its serving pod and the rest.
async fn first_gated_as(
    envoy: &Envoy,
    user: &str,
) -> (
    String,
    impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin + use<>,
) {
    open_gated_stream_with(
        envoy,
        &json!({"model": "m", "prompt": "GATED first", "stream": true}),
        &[("authorization", &bearer(user))],
    )
    .await
}

/// `Authorization: Bearer <JWT>` of `user` (unsigned: the gateway verifies tokens, the picker
/// reads the subject).
fn bearer(user: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "Bearer {}.{}.c2ln",
        b64(r#"{"alg":"RS256","typ":"JWT"}"#),
        b64(&format!(
            r#"{{"sub":"{user}","iss":"https://issuer.example"}}"#
        ))
    )
}

/// A gated stream sent as `user` on its own task: `started` is set when its response begins
/// (it was dispatched to the pod); the task ends with its status once the gate lets it finish.
fn gated_as(
    envoy: &Envoy,
    user: &str,
    tag: &str,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<u16>,
) {
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (url, auth, flag) = (envoy.url("/v1/completions"), bearer(user), started.clone());
    let body = json!({"model": "m", "prompt": format!("GATED {tag}"), "stream": true});
    let task = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .header("authorization", auth)
            .json(&body)
            .send()
            .await
            .unwrap();
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        status
    });
    (started, task)
}

const QUEUED: &str = "prefix_picker_flow_queue_requests{priority=\"0\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kthenas_fairness_settings_serve_a_light_user_ahead_of_a_flooding_one() {
    let (backend, picker, envoy) = kthena_fairness(&[("FAIRNESS_QUEUE_TIMEOUT", "60s")]).await;
    // The flooding user fills the model's one slot, then queues three more; the light user
    // queues one after them.
    let (first, rest) = first_gated_as(&envoy, "flood").await;
    let mut flood = Vec::new();
    for i in 0..3 {
        flood.push(gated_as(&envoy, "flood", &format!("flood {i}")));
        wait_metric_eq(&picker, QUEUED, f64::from(i + 1)).await;
    }
    let light = gated_as(&envoy, "light", "light");
    wait_metric_eq(&picker, QUEUED, 4.0).await;
    // The slot frees: the flood's oldest goes (nobody has been charged yet).
    finish_gated_stream(std::slice::from_ref(&backend), &first, rest).await;
    poll("the flood's first queued request starts", || async {
        flood[0]
            .0
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;
    assert_eq!(metric(&picker, QUEUED).await, 3.0);
    // It frees: the light user goes next, ahead of the flood's two older requests.
    backend.gate.notify_one();
    poll("the light user's request starts", || async {
        light
            .0
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;
    assert_eq!(metric(&picker, QUEUED).await, 2.0);
    assert!(
        !flood[1].0.load(std::sync::atomic::Ordering::SeqCst)
            && !flood[2].0.load(std::sync::atomic::Ordering::SeqCst),
        "one request in flight for the model: the flood's others still queued"
    );
    assert!(
        metric(
            &picker,
            "prefix_picker_flow_served_tokens_total{flow=\"light@m\"}"
        )
        .await
            > 0.0
    );
    // The rest, one at a time.
    let mut tasks = vec![light.1];
    tasks.extend(flood.into_iter().map(|(_, t)| t));
    for done in 1..=tasks.len() {
        backend.gate.notify_one();
        poll("the next stream ends", || async {
            (tasks.iter().filter(|t| t.is_finished()).count() >= done).then_some(())
        })
        .await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_flow_dispatches_total{reason=\"room\"}"
        )
        .await,
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kthenas_queue_timeout_answers_429_with_the_reason() {
    let (backend, picker, envoy) = kthena_fairness(&[("FAIRNESS_QUEUE_TIMEOUT", "1s")]).await;
    let (first, rest) = first_gated_as(&envoy, "u").await;
    let r = reqwest::Client::new()
        .post(envoy.url("/v1/completions"))
        .header("authorization", bearer("v"))
        .json(&json!({"model": "m", "prompt": "waits past the timeout"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["x-llm-d-request-dropped-reason"], "ttl_expired");
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_flow_drops_total{reason=\"ttl_expired\"}"
        )
        .await,
        1.0
    );
    finish_gated_stream(std::slice::from_ref(&backend), &first, rest).await;
}
