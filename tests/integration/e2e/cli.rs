//! The binary: `validate`/`serve` with a bad config, `render` and `hash` (salted too), `-v 4` score
//! lines, `--v 5` never logging a cache salt, and SIGTERM (not ready first, open streams finish).

use std::process::Command;

use super::{
    SYSTEM, chat, envoy_for, finish_gated_stream, open_gated_stream, send, three_backends,
};
use crate::harness::*;
use serde_json::{Value, json};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
}

#[test]
fn bad_config_fails_with_kthena_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 0}\n").unwrap();
    let msg = "failed to Load Scheduler: failed to Unmarshal Plugins: score plugin \"prefix-cache\" must set a weight greater than 0, got 0";
    for args in [
        vec!["validate", "--config"],
        vec![
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--config",
        ],
    ] {
        let out = bin().args(&args).arg(&cfg).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(msg),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(&cfg, "endpoints: []\n").unwrap();
    let out = bin()
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = bin()
        .args(["validate", "--config"])
        .arg(root().join("deploy/local/config.yaml"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn render_and_hash_commands() {
    use std::io::Write;
    let run = |args: &[&str], input: &[u8]| {
        let mut child = bin()
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A command that rejects its arguments exits without reading: a closed pipe is fine.
        if let Err(e) = child.stdin.take().unwrap().write_all(input) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
        child.wait_with_output().unwrap()
    };
    let out = run(
        &["render"],
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"<|im_start|>user\nhi<|im_end|>\n");
    let out = run(&["render"], br#"{"model":"m","prompt":[1]}"#);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "prompt_not_string"
    );
    // An Anthropic Messages body: its `system` first, its text blocks.
    let messages = br#"{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}"#;
    let out = run(&["render", "--api", "/v1/messages"], messages);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    let out = run(&["render", "--api", "/v1/embeddings"], messages);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an inference API path"));
    let out = run(&["render"], b"[]");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be a JSON object"));
    let out = run(&["hash", "--model", "test-model"], b"Hello World");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1993528491812861608\n"
    );
    let prompt = "This is a longer prompt that should span multiple blocks based on the block size";
    let out = run(
        &[
            "hash",
            "--model",
            "test-model",
            "--block-size",
            "20",
            "--max-blocks",
            "128",
        ],
        prompt.as_bytes(),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "8626393537367828840\n16829149375953976751\n13000309909902416355\n4164474810863779859\n"
    );
    // A cache salt seeds the chain (docs/routing.md, "Cache salts").
    let out = run(
        &["hash", "--model", "test-model", "--salt", "tenant-a"],
        b"Hello World",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "6447818609939814824\n"
    );
    let out = run(&["hash", "--model", "m", "--salt", ""], b"x");
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_four_prints_kthena_score_lines() {
    let backends = three_backends().await;
    let dir = tempfile::tempdir().unwrap();
    let config = endpoints_yaml(&backends);
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    let (picker, _admin) = testkit::start_picker(&bin, dir.path(), &config, 4).unwrap();
    let grpc_port = picker.addr.port();
    let envoy = envoy_for("envoy.yaml", grpc_port, &backends).await;
    let r = send(&envoy, "/v1/chat/completions", &chat(SYSTEM, "verbose")).await;
    assert_eq!(r.status, 200);
    // Hand-computed for the first request on an idle cluster without engine metrics:
    // least-request 100 (nothing in flight), gpu-usage int((1 - 0) * 100) = 100, least-latency 50
    // (no TTFT/TPOT yet), prefix-cache 0 (nothing recorded); total 100 + 100 + 50 + 0 = 250.
    let mut want = Vec::new();
    for (plugin, score) in [
        ("least-request", 100),
        ("gpu-usage", 100),
        ("least-latency", 50),
        ("prefix-cache", 0),
    ] {
        want.push(format!("ScorePlugin: {plugin}"));
        for pod in ["pod-a", "pod-b", "pod-c"] {
            want.push(format!("Pod: default/{pod}, Score: {score}"));
        }
    }
    want.push("Final Pod Scores:".to_string());
    for pod in ["pod-a", "pod-b", "pod-c"] {
        want.push(format!("  Pod: default/{pod}, Final Score: 250"));
    }
    poll("score lines", || {
        let log = std::fs::read_to_string(dir.path().join("picker.log")).unwrap_or_default();
        let messages: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split_once(" scores: ").map(|(_, m)| m))
            .collect();
        let ok = messages.len() >= want.len() && messages[..want.len()] == want[..];
        async move { ok.then_some(()) }
    })
    .await;
}

/// `cache_salt` through Envoy and the binary at `--v 5` (everything at trace, the picker's
/// request lines included): a salted prompt is recorded and matched under its own salt only,
/// and the salt never reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_salt_isolates_prompts_and_is_never_logged() {
    const SALT: &str = "s4lt-never-logged-7f3a";
    let backends = three_backends().await;
    let dir = tempfile::tempdir().unwrap();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    // `/debug/explain` reads the decisions (loopback only).
    let config = format!(
        "{}picker:\n  debug: {{enabled: true}}\n",
        endpoints_yaml(&backends)
    );
    let (picker, admin) = testkit::start_picker(&bin, dir.path(), &config, 5).unwrap();
    let envoy = envoy_for("envoy.yaml", picker.addr.port(), &backends).await;
    let mut chat_body = chat(SYSTEM, "salted");
    chat_body["cache_salt"] = json!(SALT);
    let completion =
        json!({"model": "m", "prompt": format!("{SYSTEM} salted"), "cache_salt": SALT});
    let records = || async {
        let text = reqwest::get(format!("http://{admin}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        sample(&text, "prefix_picker_records_total{outcome=\"recorded\"}")
    };
    let explain = |body: Value| async move {
        let r: Value = reqwest::Client::new()
            .post(format!("http://{admin}/debug/explain"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            r["reason"].as_str().unwrap().to_string(),
            r["primary"].as_str().unwrap().to_string(),
        )
    };
    for (n, (path, body)) in [
        ("/v1/chat/completions", &chat_body),
        ("/v1/completions", &completion),
    ]
    .into_iter()
    .enumerate()
    {
        let r = send(&envoy, path, body).await;
        assert_eq!(r.status, 200);
        poll("the record", || async {
            records().await.filter(|&v| v >= (n + 1) as f64).map(|_| ())
        })
        .await;
        let (reason, primary) = explain(body.clone()).await;
        assert_eq!(reason, "prefix_hit", "{path}: the same salt matches");
        assert_eq!(format!("default/{}", r.served_by), primary);
        for other in [json!("another-tenant"), Value::Null] {
            let mut body = body.clone();
            body["cache_salt"] = other.clone();
            let (reason, _) = explain(body).await;
            assert_eq!(reason, "prefix_miss", "{path} with salt {other}");
        }
    }
    let log = std::fs::read_to_string(dir.path().join("picker.log")).unwrap();
    assert!(
        log.contains("picked") && log.contains("model=m") && log.contains("TRACE"),
        "--v 5 logs each request's details: {log}"
    );
    assert!(!log.contains(SALT), "the salt is in the log:\n{log}");
    assert!(!log.contains("s4lt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reports_not_ready_first_and_lets_open_streams_finish() {
    let backends = three_backends().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "picker: {{shutdownDelaySeconds: 1, shutdownGraceSeconds: 20}}\n{}",
        endpoints_yaml(&backends)
    );
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    let (mut picker, admin) = testkit::start_picker(&bin, dir.path(), &config, 2).unwrap();
    let envoy = envoy_for("envoy-full-duplex.yaml", picker.addr.port(), &backends).await;
    // An SSE stream that the backend holds open until its gate opens. With the FULL_DUPLEX
    // filter (failure_mode_allow: false) every response chunk passes through the picker, so the
    // stream only completes if the draining picker keeps its ext_proc stream open.
    let body = json!({"model": "m", "stream": true, "prompt": "GATED through a shutdown"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;

    let status = Command::new("kill")
        .args(["-TERM", &picker.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Not ready first, while still serving.
    poll("readyz to report 503", || async {
        let r = reqwest::get(format!("http://{admin}/readyz")).await.ok()?;
        (r.status().as_u16() == 503).then_some(())
    })
    .await;
    assert!(
        picker.try_wait().unwrap().is_none(),
        "still running while draining"
    );
    // The open stream finishes normally.
    finish_gated_stream(&backends, &served, chunks).await;
    let exit = poll("the picker to exit", || {
        let s = picker.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(exit.success(), "{exit:?}");
}
