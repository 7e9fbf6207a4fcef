//! Load shedding (`picker.loadShedding`) through Envoy: with every engine's queue over
//! `queueDepth` a client gets 429 with `retry-after` and an OpenAI error, nothing is recorded or
//! held; once the queues drain, 200 again.

use std::time::Duration;

use super::*;
use model_sim::engine::EngineConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_saturated_gets_429_with_retry_after_until_the_load_drops() {
    let engine = EngineConfig {
        max_num_seqs: 1,
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start("sim-0", engine.clone()).await,
        Sim::start("sim-1", engine).await,
    ];
    // A generous staleness bound: a slow scrape on a busy machine must not hide the queues.
    let picker = start_picker(sims_config(
        &sims,
        "picker: {scrapeIntervalSeconds: 0.05, loadShedding: {queueDepth: 1, metricsStalenessSeconds: 5, retryAfterSeconds: 2}}\n",
    ))
    .await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let probe = chat(SYSTEM, "is the pool saturated?");
    let first = send(&envoy, "/v1/chat/completions", &probe).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        1.0,
    )
    .await;

    // Saturate both engines, bypassing the picker: 1 running + 3 queued each (queueDepth 1).
    let mut hogs = Vec::new();
    for sim in &sims {
        for i in 0..4 {
            let url = format!("http://{}/v1/completions", sim.addr);
            hogs.push(tokio::spawn(async move {
                let _ = reqwest::Client::new()
                    .post(url)
                    .json(
                        &json!({"model": "m", "prompt": format!("hog {i}"), "max_tokens": 100_000}),
                    )
                    .timeout(Duration::from_secs(120))
                    .send()
                    .await;
            }));
        }
    }
    poll("every engine queued and scraped as saturated", || async {
        let e = explain(&picker, &probe).await;
        (e["error"]["code"] == 429).then_some(())
    })
    .await;

    let r = reqwest::Client::new()
        .post(envoy.url("/v1/chat/completions"))
        .json(&probe)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429, "{}", envoy.log());
    assert_eq!(r.headers()["retry-after"], "2");
    assert_eq!(r.headers()["content-type"], "application/json");
    assert!(r.headers().get("x-served-by").is_none(), "no pod answered");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["code"], 429);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("system saturated, request shed: all 2 endpoints"),
        "{message}"
    );
    wait_metric_eq(&picker, "prefix_picker_shed_requests_total", 1.0).await;
    wait_metric_eq(
        &picker,
        "prefix_picker_immediate_responses_total{status=\"429\"}",
        1.0,
    )
    .await;
    // Envoy's access-log entry for the 429 arrived and ended nothing: nothing recorded or held.
    wait_metric_eq(
        &picker,
        "prefix_picker_access_log_entries_total{result=\"no_route_key\"}",
        1.0,
    )
    .await;
    assert_eq!(metric(&picker, "prefix_picker_records_total").await, 1.0);
    assert_eq!(
        metric(&picker, "prefix_picker_pod_inflight_requests").await,
        0.0
    );
    assert_eq!(metric(&picker, "prefix_picker_pod_picks_total").await, 1.0);

    // The load drops: the queues drain, a fresh scrape shows it, and requests are served again.
    for h in hogs {
        h.abort();
    }
    poll("engines idle and no longer saturated", || async {
        let idle = sims.iter().all(|s| s.engine.waiting() == 0);
        let e = explain(&picker, &probe).await;
        (idle && e.get("primary").is_some()).then_some(())
    })
    .await;
    let again = send(&envoy, "/v1/chat/completions", &probe).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        2.0,
    )
    .await;
    assert_eq!(
        metric(&picker, "prefix_picker_shed_requests_total").await,
        1.0
    );
}
