//! The documentation's examples run: every config block marked for it, on every Markdown page of
//! the repository (the README, CONTRIBUTING.md, every page of docs/, benches/RESULTS.md, the
//! chart's README, ...), is checked by the `prefix-picker validate` binary, and every command of
//! the install pages that can run without a cluster is run. CONTRIBUTING.md ("Docs that check
//! themselves") documents the markers:
//!
//! - ```` ```yaml prefix-picker ````: a whole config file; `validate` must accept it;
//! - ```` ```yaml prefix-picker error ````: `validate` must refuse it, and every line of the
//!   fenced block that follows (the documented error) must be in what it prints;
//! - ```` ```yaml gie-values ````: values for GIE's `inferencepool` chart; the config they embed
//!   (`inferenceExtension.pluginsCustomConfig[<pluginsConfigFile>]`) must validate;
//! - ```` ```yaml chart-values ````: values for this project's chart; Helm's SDK must render the
//!   chart with them (`deploy_check.py render-values`, with a local image name).
//!
//! A YAML block whose top-level keys are all config sections must carry a marker, so a new
//! example cannot escape the check (chart values whose only key is `picker:` look like one: they
//! are marked `chart-values`). Commands (` ```sh ` blocks of [`COMMAND_PAGES`]): a
//! `helm install|upgrade|template` of the local chart is rendered offline by Helm's SDK
//! (`deploy_check.py helm`, no cluster) and must succeed; a `prefix-picker validate` runs; the
//! rest is skipped with the reason, printed, and an unknown command fails the test until it is
//! classified here.

use std::path::PathBuf;
use std::process::Command;

use serde_yaml_ng::Value;

use crate::deploy::{deploy_check, show};
use crate::harness::root;

/// The Markdown files whose YAML blocks are checked: every one of the repository, outside hidden
/// directories (`.venv*`, `.git`) and build output (`target`).
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root(), &mut files);
    files.sort();
    files
}

/// The pages whose shell commands are run (or skipped with a reason).
const COMMAND_PAGES: [&str; 4] = [
    "README.md",
    "docs/gateways.md",
    "docs/deploy.md",
    "docs/kind.md",
];

/// A fenced block: its info string (after the backticks), its text and its first line.
#[derive(Debug, Clone)]
struct Block {
    info: String,
    text: String,
    line: usize,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match open.take() {
                Some(block) => out.push(block),
                None => {
                    open = Some(Block {
                        info: info.trim().to_string(),
                        text: String::new(),
                        line: i + 1,
                    })
                }
            }
            continue;
        }
        if let Some(block) = &mut open {
            block.text.push_str(line);
            block.text.push('\n');
        }
    }
    out
}

/// The top-level sections of a prefix-picker config.
const CONFIG_SECTIONS: [&str; 7] = [
    "scheduler",
    "auth",
    "endpoints",
    "discovery",
    "picker",
    "sync",
    "pdGroup",
];

/// Whether a YAML block looks like a prefix-picker config: a mapping whose keys are all
/// config sections.
fn looks_like_config(text: &str) -> bool {
    match serde_yaml_ng::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) if !m.is_empty() => m
            .keys()
            .all(|k| k.as_str().is_some_and(|k| CONFIG_SECTIONS.contains(&k))),
        _ => false,
    }
}

/// What the block's marker asks for.
#[derive(Debug, PartialEq)]
enum Check {
    Valid,
    /// Refused, with these lines (the next block) in the output.
    Error(String),
    GieValues,
    /// Values of this project's chart: the chart renders with them.
    ChartValues,
}

/// `prefix-picker validate --config <text>`: (exit success, stdout + stderr).
fn validate(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (out.status.success(), show(&out))
}

/// The marked blocks of `markdown`, as (line, check, config text); a marker without what it
/// needs (an error block, the embedded config) is an error message instead.
fn marked(markdown: &str) -> Vec<Result<(usize, Check, String), String>> {
    let all = blocks(markdown);
    let mut out = Vec::new();
    for (i, block) in all.iter().enumerate() {
        let words: Vec<&str> = block.info.split_whitespace().collect();
        let check = match words.as_slice() {
            ["yaml", "prefix-picker"] => Check::Valid,
            ["yaml", "prefix-picker", "error"] => match all.get(i + 1) {
                Some(next) if next.info.is_empty() => Check::Error(next.text.clone()),
                _ => {
                    out.push(Err(format!(
                        "{}: an error example must be followed by a plain ``` block \
                         holding the documented error",
                        block.line
                    )));
                    continue;
                }
            },
            ["yaml", "gie-values"] => Check::GieValues,
            ["yaml", "chart-values"] => Check::ChartValues,
            ["yaml", "prefix-picker", ..] => {
                out.push(Err(format!(
                    "{}: unknown marker `{}`",
                    block.line, block.info
                )));
                continue;
            }
            ["yaml"] if looks_like_config(&block.text) => {
                out.push(Err(format!(
                    "{}: a prefix-picker config without a marker (```yaml prefix-picker, \
                     CONTRIBUTING.md)",
                    block.line
                )));
                continue;
            }
            _ => continue,
        };
        let text = if check == Check::GieValues {
            match gie_embedded_config(&block.text) {
                Ok(text) => text,
                Err(e) => {
                    out.push(Err(format!("{}: {e}", block.line)));
                    continue;
                }
            }
        } else {
            block.text.clone()
        };
        out.push(Ok((block.line, check, text)));
    }
    out
}

/// The routerConfiguration inside GIE `inferencepool` chart values.
fn gie_embedded_config(values: &str) -> Result<String, String> {
    let values: Value = serde_yaml_ng::from_str(values).map_err(|e| e.to_string())?;
    let ext = &values["inferenceExtension"];
    let file = ext["pluginsConfigFile"]
        .as_str()
        .ok_or("no inferenceExtension.pluginsConfigFile")?;
    ext["pluginsCustomConfig"][file]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no inferenceExtension.pluginsCustomConfig.{file}"))
}

/// `deploy_check.py render-values` of chart values written as YAML: (rendered, its output).
fn render_chart_values(text: &str) -> (bool, String) {
    let values: serde_json::Value = match serde_yaml_ng::from_str(text) {
        Ok(v) => v,
        Err(e) => return (false, format!("not YAML: {e}")),
    };
    let out = deploy_check(&["render-values", &values.to_string()]);
    (out.status.success(), show(&out))
}

/// Every problem of the marked blocks of one page.
fn check_page(name: &str, markdown: &str) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for entry in marked(markdown) {
        let (line, check, text) = match entry {
            Ok(e) => e,
            Err(e) => {
                problems.push(format!("{name}:{e}"));
                continue;
            }
        };
        checked += 1;
        let (ok, output) = match check {
            Check::ChartValues => render_chart_values(&text),
            _ => validate(&text),
        };
        match check {
            Check::ChartValues if !ok => problems.push(format!(
                "{name}:{line}: the chart does not render with these values:\n{output}"
            )),
            Check::Valid | Check::GieValues if !ok => {
                problems.push(format!("{name}:{line}: validate refused it:\n{output}"))
            }
            Check::Error(expected) => {
                if ok {
                    problems.push(format!(
                        "{name}:{line}: an error example that validates:\n{output}"
                    ));
                }
                for want in expected.lines().filter(|l| !l.trim().is_empty()) {
                    if !output.contains(want.trim()) {
                        problems.push(format!(
                            "{name}:{line}: the documented error `{want}` is not in:\n{output}"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    (checked, problems)
}

#[test]
fn every_marked_config_in_the_docs_validates() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let (n, p) = check_page(&name, &text);
        checked += n;
        problems.extend(p);
    }
    assert!(
        checked >= 10,
        "only {checked} marked blocks: is the parser broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The checker fails on what it must: an invalid config, an error example that validates or
/// prints another error, an unmarked config, an unknown marker, GIE values without a config.
#[test]
fn the_docs_config_checker_catches_broken_blocks() {
    let page = "\
```yaml prefix-picker
picker: {seed: 0}
endpoints: [{name: a, address: 127.0.0.1:8001}]
```
```yaml prefix-picker
picker: {nosuchkey: 1}
```
```yaml prefix-picker error
picker: {maxEndpoints: 2}
endpoints: [{name: a, address: 127.0.0.1:8001}]
```
```
error: something
```
```yaml prefix-picker error
scheduler: {plugins: {Score: {enabled: [{name: prefix-cache, weight: 0}]}}}
```
```
must set a weight greater than 0, got 0
```
```yaml
endpoints: []
```
```yaml prefix-picker maybe
picker: {}
```
```yaml gie-values
inferenceExtension: {pluginsConfigFile: x.yaml}
```
```yaml
apiVersion: v1
kind: ConfigMap
```
";
    let (checked, problems) = check_page("example.md", page);
    assert_eq!(checked, 4, "{problems:#?}");
    let expect = [
        "example.md:5: validate refused it",
        "example.md:8: an error example that validates",
        "example.md:8: the documented error `error: something`",
        "example.md:21: a prefix-picker config without a marker",
        "example.md:24: unknown marker",
        "example.md:27: no inferenceExtension.pluginsCustomConfig.x.yaml",
    ];
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
    for (problem, want) in problems.iter().zip(expect) {
        assert!(problem.starts_with(want), "`{want}`: {problems:#?}");
    }
}

/// Chart values are rendered, not validated as a config: values the chart refuses fail, and a
/// block of chart values whose only key is `picker:` needs its marker.
#[test]
fn chart_values_blocks_render_with_the_chart() {
    let page = "\
```yaml chart-values
picker:
  settings:
    seed: 7
```
```yaml chart-values
mode: gateway
```
```yaml
picker:
  settings: {seed: 7}
```
";
    let (checked, problems) = check_page("chart.md", page);
    assert_eq!(checked, 2, "{problems:#?}");
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].starts_with("chart.md:6: the chart does not render with these values"),
        "{problems:#?}"
    );
    assert!(
        problems[1].starts_with("chart.md:9: a prefix-picker config without a marker"),
        "{problems:#?}"
    );
}

// ---------------------------------------------------------------- commands

/// The shell commands of a Markdown text's ` ```sh ` blocks: continuation lines joined,
/// comments dropped, a `for ... done` loop kept as one command.
fn commands(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for block in blocks(markdown).iter().filter(|b| b.info == "sh") {
        let mut current = String::new();
        let mut start = block.line;
        let mut in_loop = false;
        for (i, raw) in block.text.lines().enumerate() {
            let line = strip_comment(raw);
            let line = line.trim();
            if current.is_empty() {
                start = block.line + 1 + i;
                if line.is_empty() {
                    continue;
                }
                in_loop = line.starts_with("for ") || line.starts_with("while ");
            }
            if let Some(head) = line.strip_suffix('\\') {
                current.push_str(head.trim_end());
                current.push(' ');
                continue;
            }
            current.push_str(line);
            if in_loop && line != "done" {
                current.push_str("; ");
                continue;
            }
            out.push((start, std::mem::take(&mut current)));
        }
    }
    out
}

/// `line` without a `# comment` (a `#` at the start or after a space, outside quotes).
fn strip_comment(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    line.to_string()
}

/// Why a command is not run here, or `None` for one the test runs.
fn skip_reason(command: &str) -> Option<Result<&'static str, String>> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let reason = match words.as_slice() {
        ["helm", "install" | "upgrade" | "template", ..]
            if words.iter().any(|w| w.starts_with("oci://")) =>
        {
            "installs a chart from a registry into a cluster"
        }
        ["helm", "install" | "upgrade" | "template", ..] => return None,
        ["prefix-picker", "validate", ..] => return None,
        ["prefix-picker", "serve", ..] => "a long-running server (the e2e tests serve)",
        ["kubectl" | "istioctl", ..] => "needs a cluster",
        ["kind", ..] => "creates or changes a kind cluster",
        ["curl", ..] | ["for" | "while", ..] => "requests to a running deployment",
        ["scripts/demo", ..] => "the demo: builds and serves until interrupted",
        ["scripts/test", ..] => "the whole suite, which includes this test",
        ["scripts/image", ..] => {
            "a release build; tests/integration/deploy/image.rs runs scripts/image --binary"
        }
        ["skopeo", ..] => "needs the archive scripts/image builds",
        _ => return Some(Err(format!("unclassified command: {command}"))),
    };
    Some(Ok(reason))
}

/// Every version a command names (`v1.6.1`, `--version v2.1.0`): dotted triples of numbers.
fn versions_in(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in command.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.')) {
        let token = token.trim_matches('.');
        let bare = token.strip_prefix('v').unwrap_or(token);
        let parts: Vec<&str> = bare.split('.').collect();
        if parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            out.push(bare.to_string());
        }
    }
    out
}

#[test]
fn the_install_pages_commands_run_offline_or_say_why_not() {
    let versions = std::fs::read_to_string(root().join("docs/versions.md")).unwrap();
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    let mut problems = Vec::new();
    for page in COMMAND_PAGES {
        let text = std::fs::read_to_string(root().join(page)).unwrap();
        for (line, command) in commands(&text) {
            let at = format!("{page}:{line}");
            for v in versions_in(&command) {
                if !versions.contains(&v) {
                    problems.push(format!(
                        "{at}: version {v} is not in docs/versions.md: {command}"
                    ));
                }
            }
            match skip_reason(&command) {
                None => run.push((at, command)),
                Some(Ok(reason)) => skipped.push(format!("{at}: {reason}: {command}")),
                Some(Err(e)) => problems.push(format!("{at}: {e}")),
            }
        }
    }
    eprintln!(
        "skipped {} commands (not runnable offline):\n  {}",
        skipped.len(),
        skipped.join("\n  ")
    );
    let helm: Vec<&str> = run
        .iter()
        .filter(|(_, c)| c.starts_with("helm "))
        .map(|(_, c)| c.as_str())
        .collect();
    assert!(helm.len() >= 6, "only {} helm commands found", helm.len());
    let mut args = vec!["helm"];
    args.extend(helm.iter().copied());
    let out = deploy_check(&args);
    assert!(out.status.success(), "deploy_check helm:\n{}", show(&out));
    let results: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), helm.len(), "{}", show(&out));
    for ((at, command), result) in run
        .iter()
        .filter(|(_, c)| c.starts_with("helm "))
        .zip(&results)
    {
        assert_eq!(result["command"], command.as_str());
        if result["ok"] != true {
            problems.push(format!("{at}: {command}\n  {}", result["error"]));
        }
    }
    for (at, command) in run.iter().filter(|(_, c)| c.starts_with("prefix-picker ")) {
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
            .args(&args)
            .current_dir(root())
            .output()
            .unwrap();
        if !out.status.success() {
            problems.push(format!("{at}: {command}\n{}", show(&out)));
        }
    }
    eprintln!("ran {} commands", run.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The chart's own defaults do not install: the README's bare command, rendered the same way,
/// stops with the message that says how to get an image.
#[test]
fn the_chart_without_an_image_says_how_to_get_one() {
    let out = deploy_check(&[
        "helm",
        "helm install prefix-picker deploy/helm/prefix-picker -n llm",
    ]);
    assert!(out.status.success(), "{}", show(&out));
    let result: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(result["ok"], false, "{result}");
    let error = result["error"].as_str().unwrap();
    for want in [
        "image.repository is not set",
        "no prefix-picker release has been published",
        "scripts/image",
        "docker build",
        "docs/deploy.md#images",
    ] {
        assert!(error.contains(want), "`{want}` not in: {error}");
    }
}

#[test]
fn commands_are_joined_and_classified() {
    let page = "\
```sh
helm install a deploy/helm/prefix-picker -n llm \\
  --set image.repository=r/p   # a comment
kubectl get pods
for i in 1 2; do
  curl -s 'localhost:8080/#x' \\
    | grep y
done
```
";
    let cmds = commands(page);
    assert_eq!(
        cmds,
        [
            (
                2,
                "helm install a deploy/helm/prefix-picker -n llm --set image.repository=r/p"
                    .to_string()
            ),
            (4, "kubectl get pods".to_string()),
            (
                5,
                "for i in 1 2; do; curl -s 'localhost:8080/#x' | grep y; done".to_string()
            ),
        ]
    );
    assert!(skip_reason(&cmds[0].1).is_none());
    assert!(matches!(skip_reason(&cmds[1].1), Some(Ok(_))));
    assert!(matches!(skip_reason("rm -rf /"), Some(Err(_))));
    assert_eq!(
        versions_in("kubectl apply -f https://x/download/v1.6.1/a.yaml --version v2.1.0 1.2"),
        ["1.6.1", "2.1.0"]
    );
}
