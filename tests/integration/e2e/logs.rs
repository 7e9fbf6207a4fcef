//! The sidecar's logs as the real binary writes them: with `--log-format json` (or GIE's
//! `--zap-encoder json`) every stderr line is one JSON object, start-up and usage errors
//! included; `--v 4` carries Kthena's score lines unchanged in `message` and no prompt text;
//! in the affinity mode a `Predicted TTFT` line per pod follows them; the start-up line names
//! the build and the config. (Panics: `src/logging.rs`'s tests.)

use std::process::Command;

use serde_json::{Value, json};

use super::gie;
use crate::harness::*;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
}

/// Every line of `log` as JSON (a line that does not parse fails the test).
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in:\n{log}")))
        .collect()
}

/// Words no log line may carry below `--v 5`.
const SECRET: &str = "ZEBRA-PAPAYA-7731 is the launch code";

/// `log` carries none of [`SECRET`].
fn assert_no_prompt_text(log: &str) {
    assert!(
        !log.contains("ZEBRA"),
        "prompt text logged below --v 5:\n{log}"
    );
}

/// The `message` of each of `log`'s score lines (target `scores`).
fn score_messages(log: &str) -> Vec<String> {
    json_lines(log)
        .iter()
        .filter(|l| l["target"] == "scores")
        .map(|l| l["message"].as_str().unwrap().to_string())
        .collect()
}

/// `picker`'s log in `dir` once `ready` holds of it (polled, as `what`), the picker then
/// stopped.
async fn log_when(
    dir: &std::path::Path,
    picker: gie::Started,
    what: &str,
    ready: impl Fn(&str) -> bool,
) -> String {
    let log_path = dir.join("picker.log");
    poll(what, || {
        let found = ready(&std::fs::read_to_string(&log_path).unwrap());
        async move { found.then_some(()) }
    })
    .await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    drop(picker.process);
    log
}

/// Posts `body` to `path` through `envoy`; the reply must be 200.
async fn post_ok(envoy: &Envoy, path: &str, body: &Value) -> reqwest::Response {
    let r = reqwest::Client::new()
        .post(envoy.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", envoy.log());
    r
}

/// The picker binary on `config`, logging JSON at `-v=4`, every port chosen by the system.
async fn start_json_v4(config: &str, env: &[(&str, &str)], dir: &std::path::Path) -> gie::Started {
    let args = [
        "--secure-serving=false",
        "--grpc-port=0",
        "--grpc-health-port=0",
        "--metrics-port=0",
        "--config-text",
        config,
        "--log-format",
        "json",
        "-v=4",
    ];
    gie::start_with_env(&args, env, dir).await
}

/// Two sims behind Envoy (`envoy/envoy.yaml`) and the real binary, GIE form, with `--log-format
/// json -v=4` and the Kthena fixture plus `picker` as its config; its log in `dir/picker.log`.
async fn v4_json_stack(picker: &str) -> ([Sim; 2], String, tempfile::TempDir, gie::Started, Envoy) {
    let sims = [
        Sim::start("sim-a", Default::default()).await,
        Sim::start("sim-b", Default::default()).await,
    ];
    let config = format!(
        "{}{}picker: {picker}\n",
        testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml")),
        testkit::endpoints_yaml(sims.iter().map(|s| (s.name.as_str(), s.addr))),
    );
    let dir = tempfile::tempdir().unwrap();
    let started = start_json_v4(&config, &[], dir.path()).await;
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        started.grpc.port(),
        &addrs,
        |s| s,
    ))
    .await;
    (sims, config, dir, started, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_at_v4_parse_carry_kthena_score_lines_and_no_prompt() {
    let (_sims, config, dir, picker, envoy) = v4_json_stack("{scrapeIntervalSeconds: 0}").await;
    let body = json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": format!("{SECRET}. {}", "Be brief. ".repeat(40))},
        {"role": "user", "content": SECRET},
    ]});
    for _ in 0..2 {
        post_ok(&envoy, "/v1/chat/completions", &body).await;
    }
    // Each request's score lines are written before its reply; its completion when Envoy's
    // access log reports it.
    let log = log_when(
        dir.path(),
        picker,
        "the score and completion lines",
        |log| {
            log.matches("Final Pod Scores:").count() >= 2
                && log.matches("completed (access log)").count() >= 2
        },
    )
    .await;
    let lines = json_lines(&log);

    // Kthena's klog.V(4) lines, the text unchanged in `message`.
    let messages: Vec<&str> = lines
        .iter()
        .filter(|l| l["target"] == "scores")
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.contains(&"ScorePlugin: prefix-cache"),
        "{messages:?}"
    );
    assert!(messages.contains(&"Final Pod Scores:"), "{messages:?}");
    for pod in ["sim-a", "sim-b"] {
        for prefix in [
            format!("Pod: default/{pod}, Score: "),
            format!("  Pod: default/{pod}, Final Score: "),
        ] {
            assert!(
                messages.iter().any(|m| m
                    .strip_prefix(&prefix)
                    .is_some_and(|n| n.parse::<u64>().is_ok())),
                "{prefix:?} in {messages:?}"
            );
        }
    }
    // Each request's `picked` line and its access-log completion carry its id.
    let picked: Vec<&str> = lines
        .iter()
        .filter(|l| l["message"] == "picked")
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        picked.len(),
        2,
        "prefix-picker's own debug lines are on at --v 4"
    );
    assert_ne!(picked[0], picked[1]);
    let completed: Vec<&str> = lines
        .iter()
        .filter(|l| l["message"] == "completed (access log)")
        .inspect(|l| assert_eq!(l["status"], 200, "{l}"))
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        completed.iter().collect::<std::collections::BTreeSet<_>>(),
        picked.iter().collect(),
        "{log}"
    );
    assert_no_prompt_text(&log);

    // The start-up line: build, config, listeners.
    let started = lines
        .iter()
        .find(|l| l["message"] == "prefix-picker serving")
        .unwrap();
    assert_eq!(started["version"], env!("CARGO_PKG_VERSION"));
    assert!(started["revision"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(started["config"], "--config-text");
    assert_eq!(started["config_sha256"], sha256_hex(&config));
    assert_eq!(started["level"], "INFO");
}

/// kvcache-aware at `--v 4` (the real binary, Redis from `REDIS_HOST`): Kthena's
/// `KVCacheAware.*` lines, then the plugin's score lines, with no prompt text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvcache_aware_at_v4_logs_kthenas_lines() {
    use prefix_picker::scheduler::kvcache_aware::{block_hashes, block_key};
    let sims = [
        Sim::start("sim-a", Default::default()).await,
        Sim::start("sim-b", Default::default()).await,
    ];
    let redis = crate::harness::redis_server::RedisServer::start().await;
    let guide = include_str!("../fixtures/kthena-kvcache-aware-config.yaml").replace(
        "      maxBlocksToMatch: 128\n",
        &format!(
            "      maxBlocksToMatch: 128\n      vllmTokenizerPort: {}\n",
            sims[0].addr.port()
        ),
    );
    let config = format!(
        "{guide}{}picker: {{scrapeIntervalSeconds: 0}}\n",
        testkit::endpoints_yaml(sims.iter().map(|s| (s.name.as_str(), s.addr))),
    );
    // sim-a holds every block of the prompt, as a writer beside it would have said.
    let prompt = format!("{SECRET}. {}", "Answer in one word. ".repeat(30));
    let tokens: Value = reqwest::Client::new()
        .post(format!("http://{}/tokenize", sims[0].addr))
        .json(&json!({"model": "m", "prompt": prompt}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tokens: Vec<u32> = serde_json::from_value(tokens["tokens"].clone()).unwrap();
    let hashes = block_hashes(&tokens, 16, 128);
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for h in &hashes {
        let _: () = redis::cmd("HSET")
            .arg(block_key("m", *h))
            .arg("sim-a.default")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = redis.socket().display().to_string();
    let picker = start_json_v4(&config, &[("REDIS_HOST", &socket)], dir.path()).await;
    let connected = format!("http://{}/metrics", picker.admin);
    poll("the picker's Redis connection", || {
        let url = connected.clone();
        async move {
            let text = reqwest::get(url).await.ok()?.text().await.ok()?;
            text.contains("prefix_picker_kvcache_redis_connected 1")
                .then_some(())
        }
    })
    .await;
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let envoy = start_envoy(render_envoy(
        "envoy.yaml",
        picker.grpc.port(),
        &addrs,
        |s| s,
    ))
    .await;
    let body = json!({"model": "m", "max_tokens": 1, "prompt": prompt});
    post_ok(&envoy, "/v1/completions", &body).await;
    let n = hashes.len();
    let wanted = format!(
        "KVCacheAware.calculateScores: pod=sim-a.default matched={n}/{n} blocks, score=100"
    );
    let log = log_when(dir.path(), picker, "the kvcache-aware score lines", |log| {
        log.contains(&wanted) && log.contains("Final Pod Scores:")
    })
    .await;
    let messages = score_messages(&log);
    for prefix in [
        "KVCacheAware.Score: tokenization took ".to_string(),
        format!(
            "KVCacheAware.Score: generated {n} block hashes from {} tokens (blockSize=16)",
            tokens.len()
        ),
        "KVCacheAware.Score: Redis query took ".to_string(),
        wanted.clone(),
        "ScorePlugin: kvcache-aware".to_string(),
    ] {
        assert!(
            messages.iter().any(|m| m.starts_with(&prefix)),
            "{prefix:?} in {messages:?}"
        );
    }
    assert!(
        messages
            .iter()
            .any(|m| m.ends_with(&format!("blocksWithHits={n}/{n}"))),
        "{messages:?}"
    );
    // Every one of them, the lookup's before the decision included, carries the request id.
    let ids: std::collections::BTreeSet<String> = json_lines(&log)
        .iter()
        .filter(|l| l["target"] == "scores")
        .map(|l| {
            l["span"]["request_id"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1, "one request, one id: {ids:?}");
    assert!(ids.iter().all(|id| !id.is_empty()), "{ids:?}");
    // The plugin's score line for the holder follows its ScorePlugin line.
    let at = messages
        .iter()
        .position(|m| m == "ScorePlugin: kvcache-aware")
        .unwrap();
    assert!(
        messages[at..]
            .iter()
            .any(|m| m == "Pod: default/sim-a, Score: 100"),
        "{messages:?}"
    );
    assert_no_prompt_text(&log);
}

/// The affinity mode at `--v 4`: after prefix-cache's score lines, one `Predicted TTFT` line per
/// pod (the latency model's wait and prefill), with no prompt text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_logs_at_v4_carry_each_pods_predicted_ttft() {
    let (_sims, _config, dir, picker, envoy) =
        v4_json_stack("{scrapeIntervalSeconds: 0, affinity: {}}").await;
    let body = json!({"model": "m", "max_tokens": 1, "prompt": format!("{SECRET}. {}", "Be brief. ".repeat(40))});
    post_ok(&envoy, "/v1/completions", &body).await;
    let log = log_when(dir.path(), picker, "the predicted TTFT lines", |log| {
        log.matches("Predicted TTFT: ").count() >= 2
    })
    .await;
    let messages = score_messages(&log);
    assert!(
        messages.iter().any(|m| m == "Predicted TTFT:"),
        "{messages:?}"
    );
    for pod in ["sim-a", "sim-b"] {
        let prefix = format!("  Pod: default/{pod}, Predicted TTFT: ");
        let line = messages
            .iter()
            .find(|m| m.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{prefix:?} in {messages:?}"));
        // Nothing queues and no pod holds the prompt: no wait, the whole prompt to prefill.
        assert!(line.contains("(wait 0.0 ms, prefill "), "{line}");
        assert!(line.ends_with(" tokens)"), "{line}");
    }
    assert_no_prompt_text(&log);
}

#[test]
fn start_up_errors_in_json_are_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "endpoints: [{name: p, address: 127.0.0.1:9}]\npicker: {scrapeIntervalSeconds: 0}\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let cases: [(&[&str], &str); 5] = [
        // Flags that contradict each other (the plan fails).
        (
            &[
                "--zap-encoder=json",
                "--config",
                config,
                "--config-file",
                config,
            ],
            "--config and --config-file name the same setting: give only one",
        ),
        // A config that is not valid.
        (
            &[
                "serve",
                "--log-format=json",
                "--config-text",
                "scheduler: [",
            ],
            "config is not valid YAML",
        ),
        // A listener that cannot bind (the runtime's error).
        (
            &[
                "serve",
                "--log-format",
                "json",
                "--config",
                config,
                "--grpc-addr",
                &taken,
                "--admin-addr=127.0.0.1:0",
            ],
            "cannot listen on",
        ),
        // A value clap refuses, GIE's flag spelling.
        (
            &["-zap-encoder", "json", "--v", "many", "--config", config],
            "invalid value 'many' for '--v <N>'",
        ),
        // A usage error, serve form.
        (
            &["serve", "--log-format=json", "--grpc-port"],
            "a value is required for '--grpc-port <PORT>'",
        ),
    ];
    for (args, message) in cases {
        let out = bin().args(args).env_remove("RUST_LOG").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        let lines = json_lines(&stderr);
        let error = lines
            .iter()
            .find(|l| l["level"] == "ERROR")
            .unwrap_or_else(|| panic!("{args:?}: no error line: {stderr}"));
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "{args:?}: {stderr}"
        );
    }
    // The same error in text: the log line and the `error:` line a terminal user reads.
    let out = bin()
        .args(["serve", "--config-text", "scheduler: ["])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: --config-text:2: document: config is not valid YAML"),
        "{stderr}"
    );
    // Both format flags at once: one setting.
    let out = bin()
        .args([
            "--log-format=text",
            "--zap-encoder=json",
            "--config",
            config,
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--log-format and --zap-encoder name the same setting"),
        "{stderr}"
    );
}

/// "Why did this request go there?" through Envoy in the GIE shape (`envoy-full-duplex.yaml`,
/// which sends the picker the response) with `picker.decisionHeader` on: the response carries
/// the decision header; the `picked` line, every score and prediction line and Envoy's access
/// record carry the same request id; and at completion the response's token counts reach
/// Envoy as `io.envoy.ai_gateway` dynamic metadata, read back from Envoy's own access log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_is_traceable_by_its_request_id_and_its_cost_reaches_envoy() {
    let sims = [
        Sim::start("sim-a", Default::default()).await,
        Sim::start("sim-b", Default::default()).await,
    ];
    let config = format!(
        "{}{}picker: {{scrapeIntervalSeconds: 0, decisionHeader: true, affinity: {{}}}}\n",
        testkit::scheduler_section(include_str!("../fixtures/kthena-router-config.yaml")),
        testkit::endpoints_yaml(sims.iter().map(|s| (s.name.as_str(), s.addr))),
    );
    let dir = tempfile::tempdir().unwrap();
    let picker = start_json_v4(&config, &[], dir.path()).await;
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let access_log = dir.path().join("access.log");
    let access = format!(
        "stat_prefix: ingress
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {}
              log_format:
                json_format:
                  request_id: \"%REQ(X-REQUEST-ID)%\"
                  decision: \"%DYNAMIC_METADATA(envoy.lb:x-prefix-picker-decision)%\"
                  input: \"%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_input_token)%\"
                  cached: \"%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_cached_input_token)%\"
                  output: \"%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_output_token)%\"
                  total: \"%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_total_token)%\"",
        access_log.display()
    );
    let envoy = start_envoy(render_envoy(
        "envoy-full-duplex.yaml",
        picker.grpc.port(),
        &addrs,
        // The shipped file receives `io.envoy.ai_gateway`; the test adds an access log.
        |s| replaced(&s, "stat_prefix: ingress", &access),
    ))
    .await;
    let body = json!({"model": "m", "max_tokens": 1, "prompt": format!("{SECRET}. {}", "Be brief. ".repeat(40))});
    let r = post_ok(&envoy, "/v1/completions", &body).await;
    let header = r
        .headers()
        .get("x-prefix-picker-decision")
        .unwrap_or_else(|| panic!("no decision header: {:?}", r.headers()))
        .to_str()
        .unwrap()
        .to_string();
    let usage: Value = r.json::<Value>().await.unwrap()["usage"].clone();

    // The header: pod, reason, tokens, time queued, request id, in that order.
    let fields: Vec<(&str, &str)> = header
        .splitn(6, "; ")
        .map(|f| f.split_once('=').unwrap())
        .collect();
    let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        [
            "pod",
            "reason",
            "matched_tokens",
            "uncached_tokens",
            "queued_ms",
            "request_id"
        ],
        "{header}"
    );
    let field = |k: &str| fields.iter().find(|(n, _)| *n == k).unwrap().1;
    assert!(
        ["default/sim-a", "default/sim-b"].contains(&field("pod")),
        "{header}"
    );
    assert_eq!(
        field("reason"),
        "affinity_miss",
        "nothing cached yet: {header}"
    );
    assert_eq!(field("matched_tokens"), "0", "{header}");
    assert!(
        field("uncached_tokens").parse::<u64>().unwrap() > 0,
        "{header}"
    );
    assert_eq!(field("queued_ms"), "0", "no flow control: nothing queues");
    let request_id = field("request_id").to_string();
    assert!(!request_id.is_empty(), "{header}");

    // Envoy's access record: the same request id and decision, and the token counts the
    // response reported.
    let record: Value = poll("the access record", || {
        let text = std::fs::read_to_string(&access_log).unwrap_or_default();
        async move {
            text.lines()
                .next()
                .map(|l| serde_json::from_str(l).unwrap())
        }
    })
    .await;
    assert_eq!(record["request_id"], request_id.as_str(), "{record}");
    assert_eq!(record["decision"], header.as_str(), "{record}");
    let number = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("not a number: {v} in {record}"))
    };
    let prompt = usage["prompt_tokens"].as_f64().unwrap();
    let completion = usage["completion_tokens"].as_f64().unwrap();
    assert!(prompt > 0.0 && completion > 0.0, "{usage}");
    assert_eq!(number(&record["input"]), prompt, "{record}");
    assert_eq!(
        number(&record["cached"]),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap(),
        "{record}"
    );
    assert_eq!(number(&record["output"]), completion, "{record}");
    assert_eq!(number(&record["total"]), prompt + completion, "{record}");

    // A stream: the usage in its last event (asked with `include_usage`), the same prompt now
    // partly cached on the pod that served it.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let text = reqwest::Client::new()
        .post(envoy.url("/v1/completions"))
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let usage: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|e| e.get("usage").filter(|u| !u.is_null()).cloned())
        .unwrap_or_else(|| panic!("no usage in the stream: {text}"));
    let record: Value = poll("the stream's access record", || {
        let text = std::fs::read_to_string(&access_log).unwrap_or_default();
        async move {
            text.lines()
                .nth(1)
                .map(|l| serde_json::from_str(l).unwrap())
        }
    })
    .await;
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .unwrap();
    assert!(cached > 0.0, "the second request hits the cache: {usage}");
    assert_eq!(number(&record["cached"]), cached, "{record}");
    assert_eq!(
        number(&record["input"]),
        usage["prompt_tokens"].as_f64().unwrap(),
        "{record}"
    );
    assert_eq!(
        number(&record["output"]),
        usage["completion_tokens"].as_f64().unwrap(),
        "{record}"
    );

    // The picker's log: the `picked` line's fields, and the request id on every score and
    // prediction line (the `decision` span).
    let log = log_when(dir.path(), picker, "the picked line", |log| {
        log.contains("\"picked\"")
    })
    .await;
    let lines = json_lines(&log);
    let picks: Vec<&Value> = lines.iter().filter(|l| l["message"] == "picked").collect();
    assert_eq!(picks.len(), 2, "{picks:?}");
    let picked = picks[0];
    assert_eq!(picked["request_id"], request_id.as_str(), "{picked}");
    assert_eq!(picked["pod"], field("pod"), "{picked}");
    assert_eq!(picked["reason"], "affinity_miss", "{picked}");
    assert_eq!(picked["model"], "m", "{picked}");
    assert_eq!(picked["matched_tokens"], 0, "{picked}");
    assert_eq!(
        picked["uncached_tokens"].as_u64().map(|n| n.to_string()),
        Some(field("uncached_tokens").to_string()),
        "{picked}"
    );
    assert_eq!(picked["queued_ms"], 0, "{picked}");
    // Its completion, on the stream that saw the response: the same id, the tokens reported.
    let completed = lines
        .iter()
        .find(|l| l["message"] == "completed" && l["request_id"] == request_id.as_str())
        .unwrap_or_else(|| panic!("no completed line for {request_id}:\n{log}"));
    assert_eq!(completed["status"], 200, "{completed}");
    assert_eq!(completed["served"], field("pod"), "{completed}");
    assert_eq!(
        completed["prompt_tokens"].as_f64(),
        Some(prompt),
        "{completed}"
    );
    assert_eq!(
        completed["completion_tokens"].as_f64(),
        Some(completion),
        "{completed}"
    );
    let dest = picked["destination"].as_str().unwrap();
    assert!(
        addrs.iter().any(|a| dest.starts_with(&a.to_string())),
        "{picked}"
    );
    let scores: Vec<&Value> = lines.iter().filter(|l| l["target"] == "scores").collect();
    assert!(
        scores
            .iter()
            .any(|l| l["message"].as_str().unwrap().contains("Predicted TTFT: ")),
        "{scores:?}"
    );
    // Each score line in its request's span: the first request's id, then the stream's.
    let ids: Vec<&str> = scores
        .iter()
        .map(|l| l["span"]["request_id"].as_str().unwrap_or_default())
        .collect();
    let first = ids.iter().take_while(|id| **id == request_id).count();
    assert!(first > 0, "{ids:?}");
    let second = picks[1]["request_id"].as_str().unwrap();
    assert_ne!(second, request_id);
    assert!(
        ids[first..].iter().all(|id| *id == second) && first < ids.len(),
        "{ids:?}"
    );
    assert_no_prompt_text(&log);
}
