//! The suite's rows: the routers it compares, in report order (Envoy round robin;
//! prefix-picker with prefix-cache alone, Kthena's plugins, llm-d's default
//! `EndpointPickerConfig`, the shipped config, the shipped
//! config reading the engines' KV events, its fault rows (run only when `--routers` names them,
//! [`selected`]), the ablation rows; Kthena's kvcache-aware; the peers `bench/run` installed; the
//! oracles), each a name and a [`Setup`].

use anyhow::Context;
use testkit::bin_dir;

use super::cluster::{Setup, TOKENIZER_PORT};
use super::engines::SIMS;
use super::event_faults::EventFault;
use super::picker_config::{self, EngineEvents};
use super::project::shipped_config;
use super::report;
use super::row_config::RowConfig;

/// The row name of `suite --ext-proc-floor`.
pub const EXT_PROC_FLOOR: &str = "envoy + no-op ext_proc (round robin; the ext_proc floor)";

/// The load allowance of the capped oracle row: issue 23's limit on max/mean pod load.
pub const CAPPED_ORACLE_LOAD: f64 = 1.3;
/// Block lookups the capped oracle's offline search may spend per workload.
pub const CAPPED_ORACLE_BUDGET: usize = 400_000_000;

/// The engine-events rows: the shipped row plus every pod's KV events, one row per
/// `picker.tokenizer` source (name suffix, source).
pub fn engine_event_rows() -> Vec<(&'static str, EngineEvents)> {
    vec![
        ("", EngineEvents::engine_tokenize()),
        (", file tokenizer", EngineEvents::file_tokenizer()),
    ]
}

/// The fault rows' names: the engine-events row's, then `(fault: <what>)`.
pub fn fault_row_name(fault: EventFault) -> String {
    format!(
        "{} (fault: {})",
        report::SHIPPED_ENGINE_EVENTS,
        fault.as_str()
    )
}

/// Whether `name` is a fault row's ([`fault_row_name`]).
pub fn is_fault_row(name: &str) -> bool {
    name.starts_with(report::SHIPPED_ENGINE_EVENTS) && name.contains(" (fault: ")
}

/// Whether `--routers` `only` selects the row `name`. Every row when `only` is empty, else
/// every row whose name contains an entry; the ablation rows always (`--ablation` asks for
/// them). A fault row runs only when an entry names it ([`names_a_fault`]: `fault`, `topic
/// mismatch`, `silent publisher`), as the fault rows would add two rows to every workload of a
/// default run; such an entry selects no other row (`fault` is in `Kthena default plugins`).
/// An entry that starts with `=` selects the row of exactly that name (`--baseline-picker`'s
/// twin of a selected row runs with it).
pub fn selected(name: &str, only: &[String]) -> bool {
    let exact = |r: &String| r.strip_prefix('=').is_some_and(|n| n == name);
    if name.starts_with(report::ABLATION) {
        return true;
    }
    if is_fault_row(name) {
        return only
            .iter()
            .any(|r| exact(r) || (names_a_fault(r) && name.contains(r.as_str())));
    }
    only.is_empty()
        || only.iter().any(|r| {
            exact(r) || (!r.starts_with('=') && !names_a_fault(r) && name.contains(r.as_str()))
        })
}

/// Whether a `--routers` entry names a fault row: it is part of one's name and not of the
/// engine-events row's every fault row starts with.
fn names_a_fault(entry: &str) -> bool {
    !report::SHIPPED_ENGINE_EVENTS.contains(entry)
        && EventFault::ALL
            .iter()
            .any(|f| fault_row_name(*f).contains(entry))
}

/// The kvcache-aware row's name.
pub const KVCACHE_ROW: &str = report::KVCACHE_AWARE;

/// Kthena's Helm plugin set (`scheduler`) with kvcache-aware in place of gpu-usage: its args
/// Kthena's defaults (blocks of 16 tokens, 128 of them, the sims' block size) and the port of
/// the sim that tokenizes ([`TOKENIZER_PORT`], replaced per cluster).
fn kvcache_scheduler(scheduler: &str) -> anyhow::Result<String> {
    use serde_yaml_ng::Value;
    let mut doc: Value = serde_yaml_ng::from_str(scheduler)?;
    let s = doc.get_mut("scheduler").context("no scheduler section")?;
    let enabled = s
        .get_mut("plugins")
        .and_then(|p| p.get_mut("Score"))
        .and_then(|p| p.get_mut("enabled"))
        .and_then(Value::as_sequence_mut)
        .context("no plugins.Score.enabled list")?;
    let gpu = enabled
        .iter_mut()
        .find(|e| e.get("name").and_then(Value::as_str) == Some("gpu-usage"))
        .context("no gpu-usage score plugin to replace")?;
    gpu["name"] = "kvcache-aware".into();
    let args: Value = serde_yaml_ng::from_str(&format!(
        "{{name: kvcache-aware, args: {{blockSizeToHash: 16, maxBlocksToMatch: 128, vllmTokenizerPort: {TOKENIZER_PORT}}}}}"
    ))?;
    s.get_mut("pluginConfig")
        .and_then(Value::as_sequence_mut)
        .context("no pluginConfig list")?
        .push(args);
    Ok(serde_yaml_ng::to_string(&doc)?)
}

/// The `picker.affinity` switches the ablation turns off, one at a time.
pub const ABLATION_SWITCHES: [&str; 7] = [
    "tentative",
    "experimental.consolidateTies",
    "loadGate",
    "latencyModel",
    "experimental.placeByChurn",
    "longPrompts",
    "experimental.engineBudget",
];

/// The latency model's signals (`latencySignals`), each left out alone by the ablation.
const LATENCY_SIGNALS: [&str; 4] = ["inflight", "engineQueue", "pace", "prefillFit"];

/// The scheduler section of the "prefix-cache only" rows.
pub const PREFIX_ONLY: &str = "scheduler:\n  plugins:\n    Filter: {enabled: []}\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 1}\n";

/// The `EndpointPickerConfig` row's name.
pub const ENDPOINT_PICKER_ROW: &str = "prefix-picker: EndpointPickerConfig (llm-d defaults)";

/// The `EndpointPickerConfig` row's document: llm-d's default profile, what llm-d runs when
/// given no config (`pkg/epp/config/loader/defaults.go`: queue 2, KV-cache utilization 2,
/// prefix cache 3 with its default parameters, max-score picker), written out. It stands where
/// the other rows' `scheduler:` section does; the suite adds the endpoints and `picker:`.
pub const ENDPOINT_PICKER_DEFAULTS: &str = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
";

/// The routers of the suite, in report order. The peers run only when `bench/run` installed
/// them (`SGLANG_ROUTER_PYTHON`, `VLLM_ROUTER_BIN`, `SMG_BIN`). The shipped-config rows take
/// their routing from `config` (`suite --config`), else from the shipped config; the
/// shipped-config row (and after it the engine-events rows, and the ablation rows with
/// `ablation`) runs when that config has a `picker.affinity` section or was given: the shipped
/// config without one routes exactly as the Kthena row.
pub fn routers(
    ablation: bool,
    config: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(String, Setup)>> {
    let shipped = shipped_config()?;
    let rows = match config {
        Some(path) => RowConfig::load(path)?,
        None => shipped.clone(),
    };
    Ok(routers_from(
        shipped.scheduler,
        &rows,
        config.is_some(),
        ablation,
    ))
}

/// [`routers`], given the shipped config's `scheduler:` section (the Kthena rows') and the
/// config of the shipped-config rows (`given`: named by `--config`).
pub fn routers_from(
    scheduler: String,
    rows: &RowConfig,
    given: bool,
    ablation: bool,
) -> Vec<(String, Setup)> {
    let mut out = vec![
        (
            report::ROUND_ROBIN.to_string(),
            Setup::envoy("envoy-round-robin.yaml", None),
        ),
        (
            "prefix-picker: prefix-cache only".to_string(),
            Setup::envoy("envoy.yaml", Some(PREFIX_ONLY.to_string())),
        ),
        (
            "prefix-picker: Kthena default plugins".to_string(),
            Setup::envoy("envoy.yaml", Some(scheduler.clone())),
        ),
        (
            ENDPOINT_PICKER_ROW.to_string(),
            Setup::envoy("envoy.yaml", Some(ENDPOINT_PICKER_DEFAULTS.to_string())),
        ),
    ];
    if rows.affinity.is_some() || given {
        out.extend(shipped_rows(rows));
    }
    match &rows.affinity {
        Some(affinity) if ablation => out.extend(ablation_rows(&rows.scheduler, affinity)),
        Some(_) => {}
        None if given => {
            if ablation {
                eprintln!(
                    "{} has no picker.affinity section: no ablation rows",
                    rows.path.display()
                );
            }
        }
        None => eprintln!(
            "{} has no picker.affinity section: no shipped-config{} rows",
            rows.path.display(),
            if ablation { " or ablation" } else { "" }
        ),
    }
    match kvcache_scheduler(&scheduler) {
        Ok(s) => out.push((
            KVCACHE_ROW.to_string(),
            Setup::KvCacheAware { scheduler: s },
        )),
        Err(e) => eprintln!("no {KVCACHE_ROW:?} row: {e}"),
    }
    out.extend(peer_rows());
    out.extend(oracle_rows());
    out
}

/// A prefix-picker row behind `envoy.yaml`.
fn picker_row(
    scheduler: &str,
    affinity: Option<serde_json::Value>,
    events: Option<EngineEvents>,
) -> Setup {
    Setup::Envoy {
        file: "envoy.yaml".into(),
        scheduler: Some(scheduler.to_string()),
        affinity,
        events,
        picker_bin: None,
    }
}

/// `rows` with, after each shipped-config row (the shipped config and its engine-events
/// rows), the same row run with the prefix-picker binary `bin`, named [`report::BASELINE`]
/// and the row's name: a default change against the previous default, in one run.
pub fn with_baseline(rows: Vec<(String, Setup)>, bin: &std::path::Path) -> Vec<(String, Setup)> {
    let mut out = Vec::with_capacity(rows.len() * 2);
    for (name, setup) in rows {
        let baseline = match (&setup, name.starts_with(report::SHIPPED)) {
            (Setup::Envoy { .. }, true) => {
                let mut b = setup.clone();
                if let Setup::Envoy { picker_bin, .. } = &mut b {
                    *picker_bin = Some(bin.to_path_buf());
                }
                Some((format!("{}{name}", report::BASELINE), b))
            }
            _ => None,
        };
        out.push((name, setup));
        out.extend(baseline);
    }
    out
}

/// The shipped-config row and, after it, its engine-events rows and their fault rows (the
/// engine-tokenize row with each [`EventFault`]), all on `rows`' routing.
fn shipped_rows(rows: &RowConfig) -> Vec<(String, Setup)> {
    let mut out = vec![(
        report::SHIPPED.to_string(),
        picker_row(&rows.scheduler, rows.affinity.clone(), None),
    )];
    for (suffix, events) in engine_event_rows() {
        out.push((
            format!("{}{suffix}", report::SHIPPED_ENGINE_EVENTS),
            picker_row(&rows.scheduler, rows.affinity.clone(), Some(events)),
        ));
    }
    for fault in EventFault::ALL {
        out.push((
            fault_row_name(fault),
            picker_row(
                &rows.scheduler,
                rows.affinity.clone(),
                Some(EngineEvents::engine_tokenize().with_fault(fault)),
            ),
        ));
    }
    out
}

/// The ablation rows: the shipped config (`scheduler`, `affinity`) with one `picker.affinity`
/// key changed each: every [`ABLATION_SWITCHES`] off, the share gate off, each of the latency
/// model's signals left out.
fn ablation_rows(scheduler: &str, affinity: &serde_json::Value) -> Vec<(String, Setup)> {
    let mut changes: Vec<(String, &str, serde_json::Value)> = ABLATION_SWITCHES
        .into_iter()
        .map(|switch| {
            let name = switch.trim_start_matches("experimental.");
            (format!("{name}: false"), switch, false.into())
        })
        .collect();
    // The share gate alone off (the latency model still gates): is it redundant?
    changes.push((
        "share gate off (shareHeadroom 1e9)".into(),
        "shareHeadroom",
        1e9.into(),
    ));
    // The latency model's signals, each left out alone.
    for signal in LATENCY_SIGNALS {
        let rest: Vec<&str> = LATENCY_SIGNALS
            .into_iter()
            .filter(|s| *s != signal)
            .collect();
        changes.push((
            format!("latencySignals without {signal}"),
            "experimental.latencySignals",
            rest.into(),
        ));
    }
    changes
        .into_iter()
        .map(|(name, key, value)| {
            (
                format!("{}{name}", report::ABLATION),
                picker_row(scheduler, Some(with_key(affinity, key, value)), None),
            )
        })
        .collect()
}

/// `affinity` with `key` (a `picker.affinity` key, or `experimental.KEY`) set to `value`.
fn with_key(
    affinity: &serde_json::Value,
    key: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    let mut a = affinity.clone();
    let (map, key) = match key.strip_prefix("experimental.") {
        Some(key) => (
            a.as_object_mut().map(|m| {
                m.entry("experimental")
                    .or_insert_with(|| serde_json::json!({}))
            }),
            key,
        ),
        None => (Some(&mut a), key),
    };
    if let Some(map) = map.and_then(serde_json::Value::as_object_mut) {
        map.insert(key.into(), value);
    }
    a
}

/// The peer routers `bench/run` installed (`SGLANG_ROUTER_PYTHON`, `VLLM_ROUTER_BIN`,
/// `SMG_BIN`), each with its cache-aware policy.
fn peer_rows() -> Vec<(String, Setup)> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("SGLANG_ROUTER_PYTHON") {
        out.push((
            "sglang-router 0.3.2 cache_aware".into(),
            Setup::Sglang(p.into()),
        ));
    }
    if let Some(p) = std::env::var_os("VLLM_ROUTER_BIN") {
        out.push((
            "vllm-router 0.1.17 cache_aware".into(),
            Setup::Vllm(p.into()),
        ));
    }
    if let Some(p) = std::env::var_os("SMG_BIN") {
        out.push(("smg 1.13.0 cache_aware".into(), Setup::Smg(p.into())));
    }
    out
}

/// The two oracles: groups pinned to pods, balanced; and the placement searched offline under
/// [`CAPPED_ORACLE_LOAD`].
fn oracle_rows() -> [(String, Setup); 2] {
    [
        (
            "oracle (groups pinned to pods, balanced, no router)".into(),
            Setup::Oracle,
        ),
        capped_oracle_row(CAPPED_ORACLE_LOAD),
    ]
}

/// The capped oracle's row: the placement searched offline with no pod above `load` x the mean
/// request count.
pub fn capped_oracle_row(load: f64) -> (String, Setup) {
    (
        format!(
            "{}{load} (placement searched offline, no router)",
            report::CAPPED_ORACLE
        ),
        Setup::OracleCapped { load },
    )
}

/// The rows without the engine-events rows this build of prefix-picker refuses (`prefix-picker
/// validate` on their config, with placeholder pods): a picker that predates the engine-events
/// keys would stop the whole suite at its first such row. Each dropped row is reported.
pub fn without_refused_rows(routers: Vec<(String, Setup)>) -> anyhow::Result<Vec<(String, Setup)>> {
    let pods: Vec<picker_config::Pod> = (0..SIMS)
        .map(|i| picker_config::Pod {
            name: format!("sim-{i}"),
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 8000 + i as u16)),
            kv_events: Some(testkit::KvEventPorts {
                publish: 5557 + 2 * i as u16,
                replay: 5558 + 2 * i as u16,
            }),
        })
        .collect();
    let dir = tempfile::tempdir()?;
    let mut out = Vec::new();
    for (name, setup) in routers {
        if let Setup::Envoy {
            scheduler: Some(s),
            affinity,
            events: Some(events),
            ..
        } = &setup
        {
            let path = dir.path().join("picker.yaml");
            let (events, _) = events.with_tokenizer_dir(dir.path())?;
            std::fs::write(
                &path,
                picker_config::render(s, &pods, affinity.as_ref(), Some(&events))?,
            )?;
            let check = std::process::Command::new(bin_dir().join("prefix-picker"))
                .arg("validate")
                .arg("--config")
                .arg(&path)
                .output()
                .context("running prefix-picker validate")?;
            if !check.status.success() {
                eprintln!(
                    "row {name:?} skipped: this prefix-picker refuses its config:\n{}",
                    String::from_utf8_lossy(&check.stderr).trim()
                );
                continue;
            }
        }
        out.push((name, setup));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
