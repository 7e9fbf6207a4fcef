//! The affinity mode (the shipped config) through Envoy: a burst of a new prefix stays on one pod,
//! a failed request is rolled back, evictions the engine reports are forgotten, a hot prefix
//! spreads under load and comes back, a tenant stays on the pod that runs it while engines wait
//! for KV space (issue 60), and a pod whose engine says it runs with prefix caching off gets no
//! new work while another pod is free. (The expiry of a held route is in `completions`.)

use super::{chat, send, stack};
use crate::harness::*;
use futures::StreamExt;
use serde_json::{Value, json};

/// The affinity mode scraping `sims` every 20 ms, and Envoy routing to them through it.
async fn scraping_stack(sims: &[Sim]) -> (prefix_picker::serve::Running, Envoy) {
    let picker = start_picker(sims_config(
        sims,
        "picker: {scrapeIntervalSeconds: 0.02, affinity: {}}\n",
    ))
    .await;
    let envoy = start_envoy_for_sims(&picker, sims).await;
    (picker, envoy)
}

/// The start of `sim`'s `prefix_picker_engine_scrapes_total` series (any result).
fn scrapes_of(sim: &str) -> String {
    format!(
        "prefix_picker_engine_scrapes_total{{model_server_namespace=\"default\",model_server_pod=\"{sim}\""
    )
}

/// The shipped config's routing mode through Envoy: sixteen concurrent requests of a new prefix
/// land on one pod (each sees an earlier one's decision-time record, or ties with it), every
/// record confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_keeps_a_burst_of_a_new_prefix_on_one_pod() {
    let (_backends, picker, envoy) = stack("envoy.yaml", shipped_picker_section(), |s| s).await;
    let system = "A new shared document, never seen before. ".repeat(40);
    let bodies: Vec<Value> = (0..16)
        .map(|q| chat(&system, &format!("question {q}")))
        .collect();
    let replies = futures::future::join_all(
        bodies
            .iter()
            .map(|b| send(&envoy, "/v1/chat/completions", b)),
    )
    .await;
    assert!(replies.iter().all(|r| r.status == 200));
    let pods: std::collections::BTreeSet<&str> =
        replies.iter().map(|r| r.served_by.as_str()).collect();
    assert_eq!(pods.len(), 1, "{pods:?}");
    wait_metric(
        &picker,
        "prefix_picker_tentative_records_total{outcome=\"confirmed\"}",
        16.0,
    )
    .await;
    // A decision and its hold are two steps with no lock between them (the request path takes
    // none), so a request decided on another worker thread before the first one's hold landed
    // is a second miss, placed on the same pod by the tie rule: at most one per worker thread
    // (tokio's default, one per core), every other request a hit.
    let text = exposition(&picker).await;
    let reason = |r: &str| {
        sample(
            &text,
            &format!("prefix_picker_decisions_total{{reason=\"{r}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (hits, misses) = (reason("affinity_hit"), reason("affinity_miss"));
    assert_eq!(hits + misses, 16.0, "{text}");
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!((1.0..=workers).contains(&misses), "{misses} misses");
    wait_metric_eq(&picker, "prefix_picker_tentative_holds", 0.0).await;
}

/// A failed request's decision-time record is rolled back: nothing is left in the index or
/// held, and the next request with that prompt is a miss again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_rolls_back_a_failed_request() {
    let (_backends, picker, envoy) = stack("envoy.yaml", shipped_picker_section(), |s| s).await;
    let body = json!({"model": "m", "prompt": "FAIL-500 please, a prompt no pod has seen"});
    let r = send(&envoy, "/v1/completions", &body).await;
    assert_eq!(r.status, 500);
    wait_metric(
        &picker,
        "prefix_picker_tentative_records_total{outcome=\"rolled_back\"}",
        1.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "kthena_router_prefix_cache_entries").await,
        0.0
    );
    wait_metric_eq(&picker, "prefix_picker_tentative_holds", 0.0).await;
    assert_eq!(prefix_score(&picker, &body, &r.served_by).await, 0);
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
}

/// Through the observer shape (it sees response bodies): an engine that reports far fewer
/// cached tokens than predicted loses, in the picker's index, the prompt it missed and every
/// older one, so an evicted prefix stops attracting requests; each response's first bytes
/// count the latency model's TTFT error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_forgets_what_the_engine_reports_evicted() {
    use model_sim::engine::EngineConfig;
    let sim = Sim::start(
        "sim-0",
        EngineConfig {
            time_scale: 100.0,
            kv_blocks: 64,
            ..EngineConfig::default()
        },
    )
    .await;
    let sims = [sim];
    let picker = start_picker(sims_config(
        &sims,
        "picker: {scrapeIntervalSeconds: 0.05, affinity: {}}\n",
    ))
    .await;
    let envoy = start_envoy(render_envoy(
        "envoy-observer.yaml",
        picker.grpc_addr.port(),
        &[sims[0].addr],
        |s| s,
    ))
    .await;
    let prompt =
        |tag: &str| json!({"model": "m", "prompt": format!("{tag} ").repeat(200), "max_tokens": 1});
    let (old, recent) = (prompt("older document"), prompt("recent document"));
    for body in [&old, &recent] {
        assert_eq!(send(&envoy, "/v1/completions", body).await.status, 200);
    }
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        2.0,
    )
    .await;
    assert!(prefix_score(&picker, &old, "sim-0").await > 0);
    // The engine's cache turns over behind the picker's back (requests sent to it directly).
    let client = reqwest::Client::new();
    for i in 0..4 {
        let r = client
            .post(format!("http://{}/v1/completions", sims[0].addr))
            .json(&prompt(&format!("filler {i}")))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    // The recent document again: predicted cached, reported nothing.
    assert_eq!(send(&envoy, "/v1/completions", &recent).await.status, 200);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        3.0,
    )
    .await;
    assert!(metric(&picker, "prefix_picker_estimate_dropped_entries_total").await > 0.0);
    // The observer saw each response's first bytes: the latency model's TTFT error is counted.
    assert_eq!(
        metric(&picker, "prefix_picker_ttft_prediction_error_seconds_count").await,
        3.0
    );
    assert_eq!(
        prefix_score(&picker, &old, "sim-0").await,
        0,
        "the evicted older document no longer attracts requests"
    );
    assert!(
        prefix_score(&picker, &recent, "sim-0").await > 0,
        "recomputed, held again"
    );
}

/// Under load a hot prefix spreads to a second pod (its engine queues: saturated), and returns
/// to one pod when the load is gone (the tie rule sends every request to one of the two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_spreads_a_hot_prefix_under_load_and_returns_to_one_pod() {
    use model_sim::engine::EngineConfig;
    let engine = EngineConfig {
        max_num_seqs: 1,
        time_scale: 4.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", engine.clone()).await,
        Sim::start("sim-1", engine).await,
    ];
    let (picker, envoy) = scraping_stack(&sims).await;
    let hot = "The hot shared system prompt of this test. ".repeat(30);
    let body =
        |q: usize| json!({"model": "m", "prompt": format!("{hot} question {q}"), "max_tokens": 8});
    // Load: requests keep arriving while the first pod's engine queues.
    let bodies: Vec<Value> = (0..24).map(body).collect();
    let mut pending = futures::stream::FuturesUnordered::new();
    let mut served = std::collections::BTreeSet::new();
    for (i, b) in bodies.iter().enumerate() {
        pending.push(send(&envoy, "/v1/completions", b));
        if i >= 3 {
            // Each new request waits for one to finish: the queue stays non-empty.
            let r = pending.next().await.unwrap();
            assert_eq!(r.status, 200);
            served.insert(r.served_by);
        }
    }
    while let Some(r) = pending.next().await {
        assert_eq!(r.status, 200);
        served.insert(r.served_by);
    }
    assert_eq!(
        served.len(),
        2,
        "the hot prefix spread under load: {served:?}"
    );
    assert!(
        metric(
            &picker,
            "prefix_picker_decisions_total{reason=\"affinity_spill\"}"
        )
        .await
            > 0.0
    );
    // Load gone (both engines idle, scraped as such): every request goes to one pod.
    poll("engines idle", || async {
        sims.iter()
            .all(|s| s.engine.waiting() == 0 && s.engine.running() == 0)
            .then_some(())
    })
    .await;
    // Two scrapes of each sim after both went idle: the picker reads every pod's load as idle.
    for s in &sims {
        let scrapes = scrapes_of(&s.name);
        let before = metric(&picker, &scrapes).await;
        wait_metric(&picker, &scrapes, before + 2.0).await;
    }
    let mut after = std::collections::BTreeSet::new();
    for q in 100..106 {
        // One at a time: the previous completion has reached the picker (no pod is busier).
        wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
        let r = send(&envoy, "/v1/completions", &body(q)).await;
        assert_eq!(r.status, 200);
        after.insert(r.served_by);
    }
    assert_eq!(after.len(), 1, "back on one pod: {after:?}");
}

/// The latency model (issue 34) through Envoy, on engines that run two requests at once: once
/// the picker has seen an engine queue, twelve concurrent requests of a new prefix spread as
/// far as their queue needs (no engine queues more than a few: all on one pod would queue ten),
/// and the prefix returns to one pod once the load drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_model_spreads_a_burst_by_its_queue_and_returns_to_one_pod() {
    use model_sim::engine::EngineConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let engine = EngineConfig {
        max_num_seqs: 2,
        time_scale: 4.0,
        ..EngineConfig::default()
    };
    let sims = std::sync::Arc::new([
        Sim::start("sim-0", engine.clone()).await,
        Sim::start("sim-1", engine.clone()).await,
        Sim::start("sim-2", engine).await,
    ]);
    let (picker, envoy) = scraping_stack(&sims[..]).await;
    let body = |prefix: &str, q: usize| json!({"model": "m", "prompt": format!("{prefix} question {q}"), "max_tokens": 8});
    // Warm-up: a burst of one prefix queues on its pod, and a scrape shows it (concurrency 2).
    let warm = "A warm-up prompt that teaches the picker the engines' concurrency. ".repeat(20);
    poll("an engine queue seen (concurrency learned)", || async {
        let burst = (0..6).map(|q| body(&warm, q)).collect::<Vec<_>>();
        let replies =
            futures::future::join_all(burst.iter().map(|b| send(&envoy, "/v1/completions", b)))
                .await;
        assert!(replies.iter().all(|r| r.status == 200));
        let text = exposition(&picker).await;
        text.lines()
            .any(|l| l.starts_with("prefix_picker_pod_concurrency{") && l.ends_with(" 2"))
            .then_some(())
    })
    .await;
    // Explain shows each pod's prediction: the pod that holds the warm-up prompt prefills less.
    let explained = explain(&picker, &body(&warm, 99)).await;
    let pods = explained["pods"].as_array().unwrap();
    let prefill = |p: &Value| p["prediction"]["prefill_ms"].as_f64().unwrap();
    let holder = pods
        .iter()
        .find(|p| p["scores"]["prefix-cache"].as_u64() > Some(0))
        .expect("a pod holds the warm-up prompt");
    assert!(
        pods.iter()
            .all(|p| p["prediction"]["ttft_ms"].as_f64() >= Some(0.0))
    );
    assert!(
        pods.iter()
            .filter(|p| p["scores"]["prefix-cache"].as_u64() == Some(0))
            .all(|p| prefill(p) > prefill(holder)),
        "{explained}"
    );
    // The burst, with every engine's queue sampled while it runs.
    let deepest = std::sync::Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (sims, deepest, stop) = (sims.clone(), deepest.clone(), stop.clone());
        async move {
            while !stop.is_cancelled() {
                for s in sims.iter() {
                    deepest.fetch_max(s.engine.waiting(), Ordering::Relaxed);
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    });
    let hot = "A new hot document that every request of the burst shares. ".repeat(20);
    let burst: Vec<Value> = (0..12).map(|q| body(&hot, q)).collect();
    let replies =
        futures::future::join_all(burst.iter().map(|b| send(&envoy, "/v1/completions", b))).await;
    stop.cancel();
    sampler.await.unwrap();
    assert!(replies.iter().all(|r| r.status == 200));
    let pods: std::collections::BTreeSet<&str> =
        replies.iter().map(|r| r.served_by.as_str()).collect();
    let deepest = deepest.load(Ordering::Relaxed);
    assert!(pods.len() >= 2, "the burst spread by its queue: {pods:?}");
    assert!(deepest <= 4, "an engine queued {deepest} (pods {pods:?})");
    // Load gone: one request at a time, every one on one pod.
    let mut after = std::collections::BTreeSet::new();
    for q in 100..106 {
        wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
        poll("engines idle", || async {
            sims.iter()
                .all(|s| s.engine.waiting() == 0 && s.engine.running() == 0)
                .then_some(())
        })
        .await;
        let r = send(&envoy, "/v1/completions", &body(&hot, q)).await;
        assert_eq!(r.status, 200);
        after.insert(r.served_by);
    }
    assert_eq!(after.len(), 1, "back on one pod: {after:?}");
}

/// Issue 60: engines that admit a request only when its KV blocks fit (vLLM's scheduler) and
/// caches that hold a few long prompts. A queue for KV space is no slot count: a tenant whose
/// head the requests running on its pod pin adds a block there and starts at once, while the
/// other pod, running another tenant's long prompt, would have to wait for it to end before the
/// tenant's prompt fits, then prefill it cold. The picker keeps the tenant (before, the KV
/// queues of the warm-up taught it two slots a pod, and it spilled the tenant's fourth request
/// to the emptier pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_kv_pressure_a_tenant_stays_on_the_pod_that_runs_it() {
    use model_sim::engine::EngineConfig;
    use model_sim::scheduler::KvAdmission;
    // 100 blocks of 16 tokens: two ~37-block tenant prompts, not three; 50 ms a token, so a
    // request of 64 tokens runs for seconds (every 20 ms scrape sees it).
    let engine = EngineConfig {
        kv_blocks: 100,
        kv_admission: KvAdmission::Vllm,
        inter_token_latency: std::time::Duration::from_millis(50),
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", engine.clone()).await,
        Sim::start("sim-1", engine).await,
    ];
    let (picker, envoy) = scraping_stack(&sims).await;
    let tenant =
        |t: &str, n: usize| format!("Tenant {t} keeps its own long instructions here. ").repeat(n);
    let body = |t: &str, q: usize, tokens: u64| {
        let prompt = format!("{} question {q}", tenant(t, 48));
        json!({"model": "m", "prompt": prompt, "max_tokens": tokens})
    };
    // Warm-up: bursts of six new tenants, three a pod, until both pods have learned their KV
    // capacity (the blocks in flight over the engine's KV usage) and shown a queue for KV space.
    let capacity = |sim: &str| {
        format!(
            "prefix_picker_pod_kv_capacity_blocks{{model_server_namespace=\"default\",model_server_pod=\"{sim}\"}}"
        )
    };
    let mut round = 0;
    poll("both pods' KV capacity, and a wait for KV space", || {
        round += 1;
        let burst: Vec<Value> = (0..6)
            .map(|w| body(&format!("W{round}-{w}"), 0, 24))
            .collect();
        let (picker, envoy) = (&picker, &envoy);
        async move {
            let replies =
                futures::future::join_all(burst.iter().map(|b| send(envoy, "/v1/completions", b)))
                    .await;
            assert!(replies.iter().all(|r| r.status == 200));
            let text = exposition(picker).await;
            ["sim-0", "sim-1"]
                .iter()
                .all(|s| sample(&text, &capacity(s)).is_some())
                .then_some(())
        }
    })
    .await;
    // Tenant A on its pod; then three of its requests running there (its head pinned, shared)
    // and, on the other pod, tenant B's long prompt (new work goes to the less loaded pod).
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
    let home = send(&envoy, "/v1/completions", &body("A", 0, 1))
        .await
        .served_by;
    let other = if home == "sim-0" { "sim-1" } else { "sim-0" };
    let engine_of = |name: &str| sims.iter().find(|s| s.name == name).unwrap().engine.clone();
    // B's ~85 blocks leave no room for A's ~38 beside them.
    let long_b =
        json!({"model": "m", "prompt": format!("{} question", tenant("B", 110)), "max_tokens": 64});
    let envoy = &envoy;
    let background = async {
        let a = futures::future::join_all((1..4).map(|q| {
            let b = body("A", q, 64);
            async move { send(envoy, "/v1/completions", &b).await }
        }));
        let b = async {
            // After A's three run, all on its pod (before, its third spilled: two slots).
            let running = |name: &str| engine_of(name).running();
            poll("tenant A's three requests running", || async {
                (running(&home) + running(other) == 3).then_some(())
            })
            .await;
            assert_eq!(running(&home), 3, "tenant A spilled");
            send(envoy, "/v1/completions", &long_b).await
        };
        futures::future::join(a, b).await
    };
    let check = async {
        poll("tenant B running on the other pod", || async {
            (engine_of(other).running() == 1 && engine_of(&home).running() == 3).then_some(())
        })
        .await;
        // The model's view: on its pod the tenant adds a block and waits for nothing; on the
        // other pod its prompt does not fit beside B's: it would wait for KV space.
        let fourth = body("A", 4, 1);
        let e = explain(&picker, &fourth).await;
        let pod = |name: &str| {
            e["pods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pod"] == format!("default/{name}"))
                .cloned()
                .unwrap()
        };
        let wait = |name: &str| pod(name)["prediction"]["wait_ms"].as_f64().unwrap();
        assert_eq!(wait(&home), 0.0, "{e}");
        assert!(wait(other) > 0.0, "{e}");
        assert_eq!(e["primary"], format!("default/{home}"), "{e}");
        // End to end: it goes to its pod, which holds its head.
        let r = send(envoy, "/v1/completions", &fourth).await;
        assert_eq!(
            (r.status, r.served_by.as_str()),
            (200, home.as_str()),
            "{e}"
        );
        let cached = r.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached >= 16 * 30, "{cached} tokens cached");
    };
    let ((a, b), ()) = futures::future::join(background, check).await;
    assert!(
        a.iter().all(|r| r.status == 200 && r.served_by == home),
        "{a:?}"
    );
    assert_eq!((b.status, b.served_by.as_str()), (200, other));
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_decisions_total{reason=\"affinity_spill\"}"
        )
        .await,
        0.0,
        "no spill"
    );
}

/// A pod whose engine runs with prefix caching off (vLLM's `cache_config_info` label
/// `enable_prefix_caching="False"`, scraped; no KV events) keeps nothing of what it serves: the
/// estimate matches nothing there and new prefixes go to the pod that reuses its cache while it
/// is free. Before, new work alternated by share and every prefix placed on it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_engine_says_caching_is_off_gets_no_new_work_while_another_is_free() {
    use model_sim::engine::EngineConfig;
    let engine = EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    let off = EngineConfig {
        prefix_caching: false,
        ..engine.clone()
    };
    let sims = [
        Sim::start("sim-0", off).await,
        Sim::start("sim-1", engine).await,
    ];
    let (picker, envoy) = scraping_stack(&sims).await;
    // Both engines scraped: the picker has read sim-0's caching off, and says so per pod.
    let caching = |sim: &str| {
        format!(
            "prefix_picker_pod_engine_prefix_caching{{model_server_namespace=\"default\",model_server_pod=\"{sim}\"}}"
        )
    };
    wait_metric_eq(&picker, &caching("sim-0"), 0.0).await;
    wait_metric_eq(&picker, &caching("sim-1"), 1.0).await;
    // Eight new prefixes, one at a time, each sent twice: all on the pod that reuses.
    for t in 0..8 {
        let system = format!("Tenant {t}'s own long instructions. ").repeat(20);
        for q in 0..2 {
            let r = send(
                &envoy,
                "/v1/chat/completions",
                &chat(&system, &format!("q{q}")),
            )
            .await;
            assert_eq!(r.status, 200);
            assert_eq!(r.served_by, "sim-1", "tenant {t}, request {q}");
            // Its completion has reached the picker before the next request (nothing in flight).
            wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
        }
    }
    // `/debug/explain` says which engine reuses its cache.
    let e = explain(&picker, &chat("any", "q")).await;
    let reuses = |pod: &str| {
        e["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pod"] == format!("default/{pod}"))
            .map(|p| p["reuses_cache"].clone())
    };
    assert_eq!(
        (reuses("sim-0"), reuses("sim-1")),
        (Some(json!(false)), Some(json!(true))),
        "{e}"
    );
}

/// `/debug/explain` answers with the call's `x-request-id` (one generated when absent) and the
/// decision as the decision header and the access record carry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_carries_the_request_id_and_the_decision_line() {
    let sims = [
        Sim::start("sim-a", Default::default()).await,
        Sim::start("sim-b", Default::default()).await,
    ];
    let picker = start_picker(sims_config(
        &sims,
        "picker: {scrapeIntervalSeconds: 0, affinity: {}}\n",
    ))
    .await;
    let body = json!({"model": "m", "prompt": "explain me ".repeat(40)});
    let url = format!("http://{}/debug/explain", picker.admin_addr);
    let explained: Value = reqwest::Client::new()
        .post(&url)
        .header("x-request-id", "why-7")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(explained["request_id"], "why-7", "{explained}");
    let decision = explained["decision"].as_str().unwrap();
    let primary = explained["primary"].as_str().unwrap();
    assert!(
        decision.starts_with(&format!(
            "pod={primary}; reason=affinity_miss; matched_tokens=0; "
        )),
        "{decision}"
    );
    assert!(
        decision.ends_with("; queued_ms=0; request_id=why-7"),
        "{decision}"
    );
    // Without the header: a generated id, different each call.
    let ids: Vec<String> = futures::future::join_all((0..2).map(|_| async {
        let e = explain(&picker, &body).await;
        e["request_id"].as_str().unwrap().to_string()
    }))
    .await;
    assert!(ids.iter().all(|id| id.len() == 36), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
}
