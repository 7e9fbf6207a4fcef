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

/// `--role` and the PD flags as the bench and the e2e tests pass them: a decode binary has the
/// prefill binary named in `x-prefiller-host-port` prefill, and both export their role.
#[tokio::test]
async fn pd_roles_from_the_command_line() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_model-sim"));
    let args = |role: &str| {
        [
            "--time-scale",
            "1000",
            "--role",
            role,
            "--kv-transfer-us-per-token",
            "2",
        ]
        .map(String::from)
        .to_vec()
    };
    let prefill = testkit::start_sim(bin, "prefill-0", &args("prefill")).unwrap();
    let mut decode_args = args("decode");
    decode_args.extend(["--prefill-timeout-ms".into(), "5000".into()]);
    let decode = testkit::start_sim(bin, "decode-0", &decode_args).unwrap();
    let client = reqwest::Client::new();
    let r = client
        .post(format!("http://{}/v1/completions", decode.addr))
        .header("x-prefiller-host-port", prefill.addr.to_string())
        .json(&serde_json::json!({"model": "m", "prompt": "hello there", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-served-by"], "decode-0");
    assert_eq!(r.headers()["x-prefilled-by"], "prefill-0");
    for (sim, role) in [(&prefill, "prefill"), (&decode, "decode")] {
        let metrics = client
            .get(format!("http://{}/metrics", sim.addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let line = format!("model_sim_role{{role=\"{role}\"}} 1");
        assert!(metrics.contains(&line), "{metrics}");
    }
}

/// vLLM's flags: `--no-enable-prefix-caching` never reuses the cache; `--kv-events-config` takes
/// vLLM's JSON and refuses keys it does not know, as vLLM does.
#[tokio::test]
async fn vllm_cache_flags_from_the_command_line() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_model-sim"));
    let events = r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": "kv"}"#;
    let args = [
        "--time-scale",
        "1000",
        "--no-enable-prefix-caching",
        "--kv-events-config",
        events,
    ]
    .map(String::from);
    let sim = testkit::start_sim(bin, "sim-0", &args).unwrap();
    let client = reqwest::Client::new();
    let body = serde_json::json!({"model": "m", "prompt": "hello ".repeat(200), "max_tokens": 1});
    for _ in 0..2 {
        let r: serde_json::Value = client
            .post(format!("http://{}/v1/completions", sim.addr))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let bad = std::process::Command::new(bin)
        .args([
            "--port",
            "0",
            "--kv-events-config",
            r#"{"enable_kv_cache_event": true}"#,
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("unknown field"), "{stderr}");
}

/// `--kv-admission vllm` from the command line: a prompt the cache could never hold is refused,
/// one that fits is answered, and the preemption series is exported.
#[tokio::test]
async fn vllm_kv_admission_from_the_command_line() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_model-sim"));
    let args = [
        "--time-scale",
        "1000",
        "--kv-blocks",
        "8",
        "--kv-admission",
        "vllm",
    ]
    .map(String::from);
    let sim = testkit::start_sim(bin, "sim-0", &args).unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/completions", sim.addr);
    let send = |prompt: String| {
        client
            .post(&url)
            .json(&serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
            .send()
    };
    // 8 blocks of 16 tokens; a word is cut into tokens of at most 6 bytes.
    assert_eq!(send("x".repeat(6 * 16 * 9)).await.unwrap().status(), 400);
    assert!(send("hello".into()).await.unwrap().status().is_success());
    let metrics = reqwest::get(format!("http://{}/metrics", sim.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("vllm:num_preemptions_total 0"),
        "{metrics}"
    );
}

/// `testkit::Sim` as the bench's `engine-restarts` workload uses it: KV events on ports the sim
/// bound itself, then a restart on the same HTTP and event ports with an empty cache and an
/// event sequence from 0 again.
#[tokio::test]
async fn a_restarted_sim_is_back_on_the_same_ports_with_an_empty_cache() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_model-sim"));
    let mut sim =
        testkit::Sim::start(bin, "sim-0", &["--time-scale".into(), "1000".into()]).unwrap();
    let (addr, ports) = (sim.addr(), sim.kv_events());
    let body = serde_json::json!({"model": "m", "prompt": "hello ".repeat(200), "max_tokens": 1});
    // A client per request: a pooled connection to the killed process would fail.
    let cached = || async {
        let r: serde_json::Value = reqwest::Client::new()
            .post(format!("http://{addr}/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached().await, 0);
    assert!(cached().await > 0);
    assert_eq!(first_replayed_seq(&ports.replay_endpoint()).await, 0);

    sim.restart().unwrap();
    assert_eq!((sim.addr(), sim.kv_events()), (addr, ports));
    assert_eq!(cached().await, 0, "the cache is empty after a restart");
    assert_eq!(first_replayed_seq(&ports.replay_endpoint()).await, 0);
    // The PUB socket is bound again too.
    std::net::TcpStream::connect(("127.0.0.1", ports.publish)).unwrap();
}

/// The seq of the oldest batch the sim's replay socket holds (polled until it holds one).
async fn first_replayed_seq(endpoint: &str) -> i64 {
    use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    loop {
        assert!(std::time::Instant::now() < deadline, "no batch replayed");
        let request = ZmqMessage::try_from(vec![
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&0i64.to_be_bytes()),
        ])
        .unwrap();
        dealer.send(request).await.unwrap();
        // [delimiter, topic, seq, payload] per batch, then [delimiter, "", -1, ""].
        let m = tokio::time::timeout(std::time::Duration::from_secs(20), dealer.recv())
            .await
            .expect("a reply")
            .unwrap()
            .into_vec();
        let seq = i64::from_be_bytes(m[2].as_ref().try_into().unwrap());
        if seq != -1 {
            return seq;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
