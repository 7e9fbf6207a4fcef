//! Config reload in the real binary: SIGHUP, and a config file that changes the way a mounted
//! ConfigMap does (its `..data` symlink swapped to a new directory). A changed weight takes
//! effect on the next request while the prefix index keeps its entries; an invalid config or a
//! start-up key is refused, logged and counted, and the old config keeps working.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{SYSTEM, chat, envoy_for, send, three_backends};
use crate::harness::*;

/// Kthena's scheduler with prefix-cache at `weight`, explain on.
fn config(endpoints: &str, weight: i64, picker: &str) -> String {
    format!(
        "{endpoints}scheduler:
  plugins:
    Score:
      enabled:
      - {{name: prefix-cache, weight: {weight}}}
      - {{name: least-request, weight: 1}}
picker:
  debug: {{enabled: true}}
{picker}"
    )
}

/// Publishes `text` as kubelet updates a ConfigMap volume: a new `..<version>` directory,
/// then the `..data` symlink swapped to it by a rename (the file path itself is a symlink
/// through `..data`).
fn publish(dir: &Path, version: &str, text: &str) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).unwrap();
    std::fs::write(versioned.join("picker.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

async fn get(url: String) -> Option<String> {
    reqwest::get(url).await.ok()?.text().await.ok()
}

fn prefix_weight(explained: &Value) -> i64 {
    explained["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "prefix-cache")
        .unwrap_or_else(|| panic!("no prefix-cache plugin: {explained}"))["weight"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_weight_reloads_keeping_the_index_and_invalid_configs_are_refused() {
    let backends = three_backends().await;
    let dir = tempfile::tempdir().unwrap();
    let endpoints = endpoints_yaml(&backends);
    let v1 = config(&endpoints, 1, "");
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_prefix-picker"));
    let (picker, admin) = testkit::start_picker(&bin, dir.path(), &v1, 2).unwrap();
    let envoy = envoy_for("envoy.yaml", picker.addr.port(), &backends).await;
    let log = || std::fs::read_to_string(dir.path().join("picker.log")).unwrap_or_default();
    let metrics = || get(format!("http://{admin}/metrics"));
    let wait = |series: String, value: f64| async move {
        poll(&format!("{series} == {value}"), || async {
            let text = metrics().await?;
            (sample(&text, &series) == Some(value)).then_some(())
        })
        .await
    };
    let info = |text: &str| {
        format!(
            "prefix_picker_config_info{{sha256=\"{}\"}}",
            sha256_hex(text)
        )
    };
    let reloads =
        |result: &str| format!("prefix_picker_config_reloads_total{{result=\"{result}\"}}");
    wait(info(&v1), 1.0).await;
    wait(reloads("success"), 0.0).await;

    // A request recorded: the index has entries.
    let body = chat(SYSTEM, "reload");
    let r = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    wait(
        "prefix_picker_records_total{outcome=\"recorded\"}".into(),
        1.0,
    )
    .await;
    let entries = "kthena_router_prefix_cache_entries";
    let held = sample(&metrics().await.unwrap(), entries).unwrap();
    assert!(held > 0.0);
    let before = explain_at(admin, &body).await;
    assert_eq!(prefix_weight(&before), 1);
    assert_eq!(before["reason"], "prefix_hit");

    // SIGHUP with the file as it was: handled (the process lives), nothing to change.
    let pid = picker.pid().to_string();
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    wait(reloads("unchanged"), 1.0).await;

    // The file becomes a ConfigMap-style symlink (same text: no reload), then is swapped.
    let path = dir.path().join("picker.yaml");
    publish(dir.path(), "v1", &v1);
    std::os::unix::fs::symlink("..data/picker.yaml", dir.path().join("picker.tmp")).unwrap();
    std::fs::rename(dir.path().join("picker.tmp"), &path).unwrap();
    let v2 = config(&endpoints, 10, "");
    publish(dir.path(), "v2", &v2);
    wait(reloads("success"), 1.0).await;
    wait(info(&v2), 1.0).await;
    assert_eq!(sample(&metrics().await.unwrap(), &info(&v1)), None);
    let after = explain_at(admin, &body).await;
    assert_eq!(
        prefix_weight(&after),
        10,
        "the next decision uses the new weight"
    );
    assert_eq!(after["reason"], "prefix_hit", "the index kept the prompt");
    assert_eq!(sample(&metrics().await.unwrap(), entries), Some(held));
    let primary = after["primary"].as_str().unwrap().to_string();
    let total = |e: &Value| {
        e["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pod"] == primary.as_str())
            .unwrap()["total"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(
        total(&after) - total(&before),
        9 * 100,
        "prefix-cache 100 x (10 - 1)"
    );
    assert!(log().contains("config reloaded"), "{}", log());

    // Invalid: refused, logged, counted; the old config keeps routing.
    publish(dir.path(), "v3", &config(&endpoints, 0, ""));
    wait(reloads("failure"), 1.0).await;
    poll("the refusal in the log", || {
        let text = log();
        async move {
            (text.contains("config reload refused")
                && text.contains("must set a weight greater than 0"))
            .then_some(())
        }
    })
    .await;
    // A start-up key: refused by name.
    publish(
        dir.path(),
        "v4",
        &config(&endpoints, 10, "  tls: {mode: selfSigned}\n"),
    );
    wait(reloads("failure"), 2.0).await;
    poll("the key in the log", || {
        let text = log();
        async move {
            text.contains("picker.tls changed (restart to apply)")
                .then_some(())
        }
    })
    .await;
    let text = metrics().await.unwrap();
    assert_eq!(
        sample(&text, &info(&v2)),
        Some(1.0),
        "the live config is still v2"
    );
    assert_eq!(sample(&text, &reloads("success")), Some(1.0));
    assert_eq!(prefix_weight(&explain_at(admin, &body).await), 10);
    let r = send(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(format!("default/{}", r.served_by), primary);
}

/// `--config-text` cannot reload: SIGHUP says so and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_config_text_is_logged_and_ignored() {
    let backends = three_backends().await;
    let dir = tempfile::tempdir().unwrap();
    let text = config(&endpoints_yaml(&backends), 1, "");
    let log_path = dir.path().join("picker.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
        .args(testkit::SERVE_ON_ANY_PORT)
        .args(["--config-text", &text])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    poll("serving", || {
        let l = log();
        async move { l.contains("prefix-picker serving").then_some(()) }
    })
    .await;
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    poll("the SIGHUP line", || {
        let l = log();
        async move { l.contains("cannot reload").then_some(()) }
    })
    .await;
    assert_eq!(
        child.try_wait().unwrap(),
        None,
        "SIGHUP did not stop the picker"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
