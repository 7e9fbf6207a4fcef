//! What operators watch: the Grafana dashboard (`deploy/grafana/prefix-picker.json`) and the alert
//! rules (the chart's `files/prometheus-rules.yaml`, its PrometheusRule when
//! `prometheusRule.enabled`).
//!
//! - promtool (Debian's `prometheus` package, installed by `scripts/test`; missing is a failure)
//!   checks the rules and runs their unit tests (`deploy/tools/prometheus-rules.test.yaml`), which
//!   must cover every alert and fail when a threshold is loosened;
//! - the chart's PrometheusRule carries the rule file unchanged but for the scrape job;
//! - every series the dashboard and the rules query is found in real expositions after traffic
//!   that creates it: metric names, the labels their matchers name and the literal values they
//!   match. The expositions: a picker routing through Envoy with Redis sync (every decision kind,
//!   an eviction, a 400 it answers itself, a route that expires), a second picker discovering a
//!   pod from the fake Kubernetes API (its watch broken and compacted: errors and a relist) that
//!   scrapes an SGLang engine and a failing one, and a vLLM and an SGLang model-sim.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_yaml_ng::Value;

use super::{deploy_check, documents, show};
use crate::harness::fake_kube::{self, FakeKube, Kind};
use crate::harness::redis_server::RedisServer;
use crate::harness::*;

const DASHBOARD: &str = "deploy/grafana/prefix-picker.json";
const RULES: &str = "deploy/helm/prefix-picker/files/prometheus-rules.yaml";
const RULE_TESTS: &str = "deploy/tools/prometheus-rules.test.yaml";

/// Series Prometheus itself writes for every target.
const PROMETHEUS_SERIES: &[&str] = &["up"];
/// Labels Prometheus' Kubernetes discovery puts on every target's series.
const TARGET_LABELS: &[&str] = &["job", "instance", "namespace"];
/// Exported families no panel needs: the address-space limit (unlimited: -1 or 2^64).
/// The latency model's per-pod gauges are exported only once learned (a queue seen, a
/// completion timed), so no panel can rely on them; docs/metrics.md lists them.
const NOT_ON_PANELS: &[&str] = &[
    "process_virtual_memory_max_bytes",
    "prefix_picker_pod_concurrency",
    "prefix_picker_pod_service_seconds",
];
/// Labels whose values are not an enum: names, numbers, build strings. Every other label's
/// values are listed in its family's help string.
const FREE_FORM_LABELS: &[&str] = &[
    "model",
    "plugin",
    "type",
    "status",
    "version",
    "revision",
    "sha256",
    "le",
    "model_server_pod",
    "model_server_namespace",
    // Flow control's priority bands (the config's numbers) and flows (tenants' fairness ids).
    "priority",
    "flow",
];

// ---------------------------------------------------------------- PromQL

const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// Metric names in a PromQL expression: identifiers outside strings, label matchers, ranges and
/// `by (...)` lists that are not functions (followed by `(`) or keywords, and the literal names
/// of `{__name__=~"a|b"}` selectors. `label_values(selector, label)` (a Grafana variable query)
/// yields the selector's.
fn promql_metric_names(expr: &str) -> Vec<String> {
    if let Some(rest) = expr.trim().strip_prefix("label_values(") {
        let selector = &rest[..rest.rfind(',').unwrap_or(rest.len())];
        return promql_metric_names(selector);
    }
    // Blank out strings, {...} matchers, [...] ranges and by/without (...) label lists.
    let mut clean = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_string = false;
    for c in expr.chars() {
        match c {
            '"' if depth_brace == 0 => in_string = !in_string,
            _ if in_string => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            _ => {
                clean.push(c);
                continue;
            }
        }
        clean.push(' ');
    }
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let words = |from: usize| -> (String, usize) {
        let chars: Vec<char> = clean[from..].chars().collect();
        let n = chars
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == ':' || **c == '.')
            .count();
        (chars[..n].iter().collect(), n)
    };
    let mut names = Vec::new();
    let mut i = 0;
    let mut in_label_list = false;
    while i < clean.len() {
        let c = clean.as_bytes()[i] as char;
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            let (word, n) = words(i);
            i += n;
            let rest = clean[i..].trim_start();
            let next_word = words(clean.len() - rest.len()).0;
            let is_number = c.is_ascii_digit();
            let is_call = rest.starts_with('(') || next_word == "by" || next_word == "without";
            if LABEL_LISTS.contains(&word.as_str()) {
                in_label_list = rest.starts_with('(');
            } else if !(is_number
                || is_call
                || in_label_list
                || PROMQL_WORDS.contains(&word.to_lowercase().as_str()))
            {
                names.push(word);
            }
        } else {
            if c == ')' {
                in_label_list = false;
            }
            i += 1;
        }
    }
    for s in selectors(expr) {
        for m in s.matchers.iter().filter(|m| m.label == "__name__") {
            names.extend(m.literal_values().unwrap_or_default());
        }
    }
    names
}

/// `label op "value"` inside a selector's braces.
#[derive(Debug, PartialEq)]
struct Matcher {
    label: String,
    op: &'static str,
    value: String,
}

impl Matcher {
    /// The values an `=` or `=~` matcher names literally (`=~"a|b|0.5"`), `None` for a real regex
    /// (a `.` not followed by a digit, or any other regex character), a negative matcher or a
    /// Grafana variable.
    fn literal_values(&self) -> Option<Vec<String>> {
        let literal = |v: &str| {
            let b = v.as_bytes();
            !v.is_empty()
                && b.iter().enumerate().all(|(i, c)| {
                    c.is_ascii_alphanumeric()
                        || b"_:/-+".contains(c)
                        || *c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)
                })
        };
        match self.op {
            "=" if !self.value.contains('$') => Some(vec![self.value.clone()]),
            "=~" if self.value.split('|').all(literal) => {
                Some(self.value.split('|').map(str::to_string).collect())
            }
            _ => None,
        }
    }
}

/// `metric{matchers}` of an expression; `metric` is empty for `{__name__=...}`.
#[derive(Debug, PartialEq)]
struct Selector {
    metric: String,
    matchers: Vec<Matcher>,
}

fn selectors(expr: &str) -> Vec<Selector> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(open) = rest.find('{') {
        let metric: String = rest[..open]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let close = open + rest[open..].find('}').unwrap();
        let matchers = rest[open + 1..close]
            .split(',')
            .filter(|m| !m.trim().is_empty())
            .map(|m| {
                let m = m.trim();
                let at = m.find(['=', '!']).unwrap_or_else(|| panic!("matcher {m}"));
                let op = ["=~", "!~", "!=", "="]
                    .into_iter()
                    .find(|op| m[at..].starts_with(op))
                    .unwrap();
                Matcher {
                    label: m[..at].trim().to_string(),
                    op,
                    value: m[at + op.len()..].trim().trim_matches('"').to_string(),
                }
            })
            .collect();
        out.push(Selector { metric, matchers });
        rest = &rest[close + 1..];
    }
    out
}

/// Every PromQL expression of a Grafana dashboard (panel targets and variable queries).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// `(alert name, expression)` of every rule of a Prometheus rule file (`groups:`).
fn rules(groups: &Value) -> Vec<(String, String)> {
    groups["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .map(|r| {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap();
            (name.to_string(), r["expr"].as_str().unwrap().to_string())
        })
        .collect()
}

fn rule_file() -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(root().join(RULES)).unwrap()).unwrap()
}

// ---------------------------------------------------------------- expositions

/// A Prometheus text exposition: series name -> label -> values.
#[derive(Default)]
struct Exposed(BTreeMap<String, BTreeMap<String, BTreeSet<String>>>);

impl Exposed {
    fn parse(text: &str) -> Exposed {
        let mut out = Exposed::default();
        out.add(text);
        out
    }

    fn add(&mut self, text: &str) {
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = self.0.entry(line[..name_end].to_string()).or_default();
            let Some(body) = line[name_end..].strip_prefix('{') else {
                continue;
            };
            // label="value" pairs; values may hold escaped quotes.
            let mut chars = body.chars();
            loop {
                let label: String = chars.by_ref().take_while(|c| *c != '=').collect();
                let label = label.trim_start_matches(',').trim();
                if label.is_empty() || label.starts_with('}') {
                    break;
                }
                assert_eq!(chars.next(), Some('"'), "{line}");
                let mut value = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
                labels.entry(label.to_string()).or_default().insert(value);
            }
        }
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }
}

/// What a query asks for that the exposition lacks: metric names, labels its matchers name on a
/// metric, and literal values they match (`le` matches if any alternative is emitted: Prometheus
/// 3 writes `0.0` where the crate writes `0`).
fn query_problems(expr: &str, exposed: &Exposed) -> Vec<String> {
    let mut problems = Vec::new();
    for name in promql_metric_names(expr) {
        if !exposed.0.contains_key(&name) && !PROMETHEUS_SERIES.contains(&name.as_str()) {
            problems.push(format!("{name} is not exported (in {expr})"));
        }
    }
    for s in selectors(expr) {
        let Some(labels) = exposed.0.get(&s.metric) else {
            continue;
        };
        for m in &s.matchers {
            if TARGET_LABELS.contains(&m.label.as_str()) || m.label == "__name__" {
                continue;
            }
            let Some(values) = labels.get(&m.label) else {
                problems.push(format!("{} has no label {} (in {expr})", s.metric, m.label));
                continue;
            };
            let Some(wanted) = m.literal_values() else {
                continue;
            };
            let missing: Vec<&String> = wanted.iter().filter(|v| !values.contains(*v)).collect();
            let bad = if m.label == "le" {
                missing.len() == wanted.len()
            } else {
                !missing.is_empty()
            };
            if bad {
                problems.push(format!(
                    "{}: no series with {}={missing:?} (emitted: {values:?}; in {expr})",
                    s.metric, m.label
                ));
            }
        }
    }
    problems
}

/// Label values a picker exposition carries that its help strings do not list (see
/// `prefix_picker::metrics::listing`), and enum-valued labels whose help lists nothing.
fn help_problems(text: &str) -> Vec<String> {
    let helps: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP ")?.split_once(' '))
        .collect();
    let mut problems = Vec::new();
    for (series, labels) in &Exposed::parse(text).0 {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| series.strip_suffix(s))
            .find(|f| helps.contains_key(f))
            .unwrap_or(series);
        // Kthena's help strings are Kthena's; the process collector's labels none.
        if family.starts_with("kthena_router_") || family.starts_with("process_") {
            continue;
        }
        let listed = prefix_picker::metrics::listed(helps[family]);
        for (label, values) in labels {
            let free = FREE_FORM_LABELS.contains(&label.as_str())
                || family == "prefix_picker_discovery_endpoints" && label == "role";
            match listed.get(label) {
                None if free => {}
                Some(_) if free => problems.push(format!("{family}: free-form {label} listed")),
                None => problems.push(format!("{family}: help lists no {label} values")),
                Some(listed) => problems.extend(
                    values
                        .difference(listed)
                        .map(|v| format!("{family}{{{label}={v:?}}} emitted, not in its help")),
                ),
            }
        }
    }
    problems
}

// ---------------------------------------------------------------- promtool

/// Debian's promtool (`$PROMTOOL` first). Missing is a failure, never a skip.
fn promtool() -> PathBuf {
    if let Ok(p) = std::env::var("PROMTOOL") {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("promtool"))
                .find(|p| p.is_file())
        })
        .expect("promtool missing: run scripts/test (it installs Debian's prometheus package)")
}

fn promtool_run(args: &[&str], file: &Path) -> Output {
    Command::new(promtool())
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

/// The unit tests, pointed at `rules` instead of the chart's file, in `dir`.
fn rule_tests_for(rules: &Path, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join(RULE_TESTS)).unwrap();
    let original = "- ../helm/prefix-picker/files/prometheus-rules.yaml\n";
    assert!(text.contains(original), "{RULE_TESTS} names {RULES}");
    let path = dir.join("rules.test.yaml");
    std::fs::write(
        &path,
        text.replace(original, &format!("- {}\n", rules.display())),
    )
    .unwrap();
    path
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let out = promtool_run(&["check", "rules"], &root().join(RULES));
    assert!(out.status.success(), "{}", show(&out));
    let out = promtool_run(&["test", "rules"], &root().join(RULE_TESTS));
    assert!(out.status.success(), "{}", show(&out));

    // Every alert has a test where it fires.
    let tests: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root().join(RULE_TESTS)).unwrap())
            .unwrap();
    let fired: BTreeSet<&str> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().unwrap())
        .filter(|a| a["exp_alerts"].as_sequence().is_some_and(|e| !e.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    let rules = rules(&rule_file());
    let alerts: BTreeSet<&str> = rules.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        fired, alerts,
        "alerts without a firing test, or tests of unknown alerts"
    );

    // Loosened thresholds fail the unit tests.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join(RULES)).unwrap();
    let loose = text.replace("> 0.05", "> 0.5").replace("> 5\n", "> 50\n");
    assert_ne!(loose, text);
    let loose_path = dir.path().join("loose.yaml");
    std::fs::write(&loose_path, loose).unwrap();
    let out = promtool_run(&["test", "rules"], &rule_tests_for(&loose_path, dir.path()));
    assert!(
        !out.status.success(),
        "loosened rules passed:\n{}",
        show(&out)
    );
}

fn prometheus_rule(values: &str) -> Option<Value> {
    let out = deploy_check(&["render-values", values]);
    assert!(out.status.success(), "{}", show(&out));
    documents(&String::from_utf8(out.stdout).unwrap())
        .into_iter()
        .find(|d| d["kind"] == "PrometheusRule")
}

/// Off by default; when on, the rule file as is (and passing its unit tests as rendered), with
/// the job selector the release's own or `prometheusRule.job`. (Schema: the `full` scenario,
/// validated against the prometheus-operator CRD.)
#[test]
fn chart_prometheus_rule_carries_the_rule_file_with_the_scrape_job() {
    assert!(prometheus_rule("{}").is_none(), "on by default");
    let file = rule_file();
    let rendered = prometheus_rule(r#"{"prometheusRule": {"enabled": true}}"#).unwrap();
    assert_eq!(rendered["spec"]["groups"], file["groups"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rendered.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&rendered["spec"]).unwrap()).unwrap();
    let out = promtool_run(&["test", "rules"], &rule_tests_for(&path, dir.path()));
    assert!(out.status.success(), "{}", show(&out));

    let jobs = |groups: &Value| -> Vec<String> {
        rules(groups)
            .iter()
            .flat_map(|(_, expr)| selectors(expr))
            .flat_map(|s| s.matchers)
            .filter(|m| m.label == "job")
            .map(|m| format!("{}{}", m.op, m.value))
            .collect()
    };
    let defaults = jobs(&file);
    assert!(defaults.len() >= rules(&file).len());
    assert!(
        defaults.iter().all(|j| j == "=prefix-picker"),
        "{defaults:?}"
    );
    let other = prometheus_rule(
        r#"{"prometheusRule": {"enabled": true, "job": "llm-picker"}, "fullnameOverride": "x"}"#,
    )
    .unwrap();
    assert_eq!(
        jobs(&other["spec"]),
        vec!["=llm-picker".to_string(); defaults.len()]
    );
    let named =
        prometheus_rule(r#"{"prometheusRule": {"enabled": true}, "fullnameOverride": "edge"}"#)
            .unwrap();
    assert_eq!(
        jobs(&named["spec"]),
        vec!["=edge".to_string(); defaults.len()]
    );
}

// ---------------------------------------------------------------- against real expositions

#[test]
fn promql_names_and_matchers_are_extracted() {
    let e = r#"1 - sum by (model, le) (rate(kthena_router_prefix_cache_match_ratio_bucket{job=~"$job",le=~"0|0.0"}[$__rate_interval])) / sum without (pod) (vllm:num_requests_waiting offset 5m) + on (pod) group_left time() - x_total{result!="ok"} > bool 2"#;
    assert_eq!(
        promql_metric_names(e),
        [
            "kthena_router_prefix_cache_match_ratio_bucket",
            "vllm:num_requests_waiting",
            "x_total"
        ]
    );
    let s = selectors(e);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].metric, "kthena_router_prefix_cache_match_ratio_bucket");
    assert_eq!(s[0].matchers[0].literal_values(), None);
    assert_eq!(
        s[0].matchers[1].literal_values(),
        Some(vec!["0".to_string(), "0.0".to_string()])
    );
    assert_eq!(s[1].matchers[0].op, "!=");
    assert_eq!(s[1].matchers[0].literal_values(), None);
    assert_eq!(
        promql_metric_names("label_values(prefix_picker_decisions_total, job)"),
        ["prefix_picker_decisions_total"]
    );
    assert_eq!(
        promql_metric_names(r#"label_values({__name__=~"vllm:a|sglang:b"}, job)"#),
        ["vllm:a", "sglang:b"]
    );
    assert_eq!(
        promql_metric_names(r#"absent(up{job="p"}) or rate(a[5m] offset 1h) > 1.5 * b"#),
        ["up", "a", "b"]
    );
}

#[test]
fn query_check_fails_on_unknown_names_labels_values_and_le_formats() {
    let exposed = Exposed::parse(
        "# TYPE a histogram\na_bucket{le=\"0\"} 1\na_bucket{le=\"+Inf\"} 1\na_count 1\n\
         b_total{result=\"ok\",pod=\"x/\\\"y\\\"\"} 2\n",
    );
    assert_eq!(
        exposed.0["b_total"]["pod"],
        BTreeSet::from(["x/\"y\"".to_string()])
    );
    let good = r#"sum(rate(a_bucket{le=~"0|0.0"}[5m])) / sum(rate(a_count{job="j"}[5m])) + up + b_total{result=~"ok",result!="error"} + b_total{result=~"e.*"}"#;
    assert_eq!(query_problems(good, &exposed), Vec::<String>::new());
    for bad in [
        "rate(b_totals[5m])",
        r#"a_bucket{le="0.0"}"#,
        r#"b_total{outcome="x"}"#,
        r#"b_total{result="error"}"#,
        r#"b_total{result=~"ok|error"}"#,
    ] {
        assert_eq!(query_problems(bad, &exposed).len(), 1, "{bad}");
    }
}

async fn text_of(url: String) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// A second picker (the `serve` binary: discovery reads `KUBECONFIG`), discovering one pod from
/// `fake` with two target ports; returns the process and its admin address.
async fn discovering_picker(
    fake: &FakeKube,
    dir: &Path,
    ports: [u16; 2],
    sync: &str,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake_kube::kubeconfig(&fake.url())).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "discovery:\n  kubernetes: {{namespace: llm, selector: app=vllm, targetPorts: [{}, {}]}}\n\
             picker: {{scrapeIntervalSeconds: 0.05, affinity: {{}}}}\n{sync}",
            ports[0], ports[1]
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
        .args(testkit::SERVE_ON_ANY_PORT)
        .arg("--config")
        .arg(&config)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("POD_NAMESPACE")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let admin = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("serve exited early");
        if let Some(rest) = line.split("admin_addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, admin)
}

fn model_pod(name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "llm", "uid": uid, "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "engine", "image": "engine"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// The issue's "alerts and panels query only exported series" (see the module header for the
/// traffic); also: every family the two pickers export is on a panel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_panels_query_only_exported_series() {
    use model_sim::engine::{EngineConfig, EngineKind};
    let fast = EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    let sglang = EngineConfig {
        kind: EngineKind::Sglang,
        ..fast.clone()
    };
    // sim-0 publishes KV events: the engine-truth families.
    let sims = [
        Sim::start_with_events("sim-0", fast.clone()).await,
        Sim::start("sim-1", fast).await,
        Sim::start("sim-sglang", sglang).await,
    ];
    let redis = RedisServer::start().await;
    let sync = format!(
        "sync:\n  redis:\n    url: \"{}\"\n    stream: \"pp:{{monitoring}}\"\n",
        redis.url()
    );

    // The routing picker: the affinity mode (engine budgets off: the tiny `maxHashCacheSize`
    // makes the eviction series), completions expire after 1 s, Redis sync.
    let local = std::fs::read_to_string(root().join("deploy/local/config.yaml")).unwrap();
    let mut doc = replaced(
        testkit::scheduler_section(&local),
        "maxHashCacheSize: 50000",
        "maxHashCacheSize: 2",
    );
    doc.push_str("endpoints:\n");
    for s in &sims {
        doc.push_str(&s.endpoint_yaml());
    }
    doc.push_str(
        "picker: {scrapeIntervalSeconds: 0.05, responseTimeoutSeconds: 1, affinity: {experimental: {engineBudget: false}}, tokenizer: {source: engine}}\n",
    );
    doc.push_str(&sync);
    let picker = start_picker(prefix_picker::config::Config::parse(&doc).unwrap()).await;
    // Connected (a view is live from its first batch, once requests are served).
    wait_metric(
        &picker,
        "prefix_picker_kv_events_connected{model_server_namespace=\"default\",model_server_pod=\"sim-0\"}",
        1.0,
    )
    .await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let client = reqwest::Client::new();
    // Outlives responseTimeoutSeconds (20,000 tokens at 0.12 ms): its route expires.
    let slow = tokio::spawn(
        client
            .post(envoy.url("/v1/completions"))
            .json(&serde_json::json!({"model": "m", "prompt": "held past the response timeout", "max_tokens": 20000}))
            .send(),
    );
    let long = "The same long system prompt, block after block. ".repeat(10);
    for body in [
        serde_json::json!({"model": "m", "messages": [{"role": "system", "content": long}, {"role": "user", "content": "one"}]}),
        serde_json::json!({"model": "m", "messages": [{"role": "system", "content": long}, {"role": "user", "content": "two"}]}),
        serde_json::json!({"model": "m", "prompt": [1, 2, 3]}),
    ] {
        let path = if body.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = client
            .post(envoy.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let r = client
        .post(envoy.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // The discovering picker: the SGLang sim's port and one whose /metrics fails.
    let failing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let failing_port = failing.local_addr().unwrap().port();
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        );
        axum::serve(failing, app).await.unwrap()
    });
    let fake = FakeKube::start().await;
    fake.change(|c| c.put(Kind::Pod, model_pod("a", "a1")));
    let dir = tempfile::tempdir().unwrap();
    let (_child, admin) = discovering_picker(
        &fake,
        dir.path(),
        [sims[2].addr.port(), failing_port],
        &sync,
    )
    .await;
    let discovering = format!("http://{admin}/metrics");
    // Waits until the discovering picker exports each (metric, label, value) ("" = any).
    let has_all = |wanted: &'static [(&'static str, &'static str, &'static str)]| {
        let url = discovering.clone();
        move || {
            let url = url.clone();
            async move {
                let exposed = Exposed::parse(&text_of(url).await);
                wanted
                    .iter()
                    .all(|(metric, label, value)| {
                        exposed.0.get(*metric).is_some_and(|labels| {
                            label.is_empty()
                                || labels.get(*label).is_some_and(|v| v.contains(*value))
                        })
                    })
                    .then_some(())
            }
        }
    };
    poll(
        "discovery, engine scrapes (ok and error) and the SGLang engine's budget",
        has_all(&[
            ("prefix_picker_discovery_pods", "state", "ready"),
            ("prefix_picker_engine_scrapes_total", "result", "ok"),
            ("prefix_picker_engine_scrapes_total", "result", "error"),
            ("prefix_picker_pod_index_budget_entries", "", ""),
        ]),
    )
    .await;
    // The watch broken with history compacted: an error and a relist.
    fake.disconnected(|c| {
        c.put(Kind::Pod, model_pod("b", "b1"));
        c.compact();
    });
    poll(
        "a watch error and a relist",
        has_all(&[
            ("prefix_picker_discovery_watch_errors_total", "", ""),
            (
                "prefix_picker_discovery_watch_restarts_total",
                "reason",
                "relist",
            ),
        ]),
    )
    .await;

    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"expired\"}",
        1.0,
    )
    .await;
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    wait_metric(&picker, "prefix_picker_records_total", 4.0).await;
    wait_metric(&picker, "kthena_router_prefix_cache_evictions_total", 1.0).await;
    wait_metric(&picker, "prefix_picker_engine_scrapes_total", 2.0).await;
    wait_metric(&picker, "prefix_picker_sync_published_total", 1.0).await;
    wait_metric(
        &picker,
        "prefix_picker_tokenize_calls_total{result=\"ok\"}",
        1.0,
    )
    .await;

    // A kvcache-aware picker (Kthena's configuration guide, Redis above, sim-1's /tokenize):
    // one explained request makes Kthena's kvcache families.
    let guide = std::fs::read_to_string(
        root().join("tests/integration/fixtures/kthena-kvcache-aware-config.yaml"),
    )
    .unwrap()
    .replace(
        "      maxBlocksToMatch: 128\n",
        &format!(
            "      maxBlocksToMatch: 128\n      vllmTokenizerPort: {}\n",
            sims[1].addr.port()
        ),
    );
    let mut kv_config = prefix_picker::config::Config::parse(&format!(
        "{guide}endpoints:\n{}",
        sims[1].endpoint_yaml()
    ))
    .unwrap();
    kv_config
        .env
        .insert("REDIS_HOST".into(), redis.socket().display().to_string());
    let kv_picker = start_picker(kv_config).await;
    wait_metric_eq(&kv_picker, "prefix_picker_kvcache_redis_connected", 1.0).await;
    // Routed as the ext_proc stream routes it: the lookup awaited, then the decision.
    let body = br#"{"model": "m", "prompt": "a prompt for kvcache-aware"}"#;
    let router = &kv_picker.router;
    let looked_up = router
        .kv_lookup("/v1/completions", body, None)
        .expect("kvcache-aware looks requests up")
        .await;
    router
        .route_looked_up(
            "/v1/completions",
            Some(body),
            None,
            None,
            looked_up.as_ref(),
        )
        .unwrap();
    wait_metric(
        &kv_picker,
        "prefix_picker_kvcache_lookups_total{result=\"ok\"}",
        1.0,
    )
    .await;

    let pickers = [
        exposition(&picker).await,
        text_of(discovering).await,
        exposition(&kv_picker).await,
    ];
    let engines = [
        text_of(format!("http://{}/metrics", sims[0].addr)).await,
        text_of(format!("http://{}/metrics", sims[2].addr)).await,
    ];
    let mut exposed = Exposed::default();
    pickers.iter().chain(&engines).for_each(|t| exposed.add(t));

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join(DASHBOARD)).unwrap()).unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 40, "{} queries", queries.len());
    let rules = rules(&rule_file());
    assert!(rules.len() >= 10, "{} rules", rules.len());
    let problems: Vec<String> = queries
        .iter()
        .chain(rules.iter().map(|(_, expr)| expr))
        .flat_map(|q| query_problems(q, &exposed))
        .collect();
    assert!(
        problems.is_empty(),
        "{}\n--- pickers' expositions:\n{}\n---\n{}",
        problems.join("\n"),
        pickers[0],
        pickers[1]
    );

    // Every picker metric family is on the dashboard somewhere.
    let used: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| promql_metric_names(q))
        .collect();
    let mut families = Exposed::default();
    pickers.iter().for_each(|t| families.add(t));
    for family in families.names() {
        if NOT_ON_PANELS.contains(&family.as_str()) {
            continue;
        }
        let base = family
            .trim_end_matches("_bucket")
            .trim_end_matches("_count")
            .trim_end_matches("_sum");
        assert!(
            used.iter().any(|u| u.starts_with(base)),
            "{family} is exported but on no panel"
        );
    }

    // Help strings list the values of enum-valued labels; traffic emitted no other.
    let problems: Vec<String> = pickers.iter().flat_map(|t| help_problems(t)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    drop(redis);
}
