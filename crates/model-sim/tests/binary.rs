//! The `model-sim` binary as the scripts, the bench and the image start it: port 0, its address on
//! the first stdout line, `/health`, a completion served under its name, vLLM's metric names.

#[tokio::test]
async fn the_binary_prints_its_address_and_serves() {
    let sim = testkit::start_sim(
        std::path::Path::new(env!("CARGO_BIN_EXE_model-sim")),
        "sim-7",
        &["--time-scale".into(), "1000".into()],
    )
    .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://{}", sim.addr);
    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&serde_json::json!({"model": "m", "prompt": "hello there", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-served-by"], "sim-7");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("vllm:num_requests_running"), "{metrics}");
}
