//! The reload decision ([`check`]) and its application ([`Reloader`]): what reloads, what is
//! refused by key, what happens to the prefix index.

use super::*;
use crate::hashing::ChainScheme;
use crate::prompt::Rendering;
use crate::routing::RecordOrigin;
use crate::serve::static_endpoints;

const MODEL: &str = "m";
const PROMPT: &str =
    "a prompt long enough to fill a few blocks of sixty-four bytes each, and then some more text";

fn config(doc: &str) -> Config {
    Config::parse(doc).expect("valid config")
}

/// Two static pods and the Kthena scheduler with the given prefix-cache weight and args.
fn doc(weight: u32, args: &str, extra: &str) -> String {
    format!(
        "scheduler:
  pluginConfig: [{{name: prefix-cache, args: {{{args}}}}}]
  plugins:
    Score: {{enabled: [{{name: prefix-cache, weight: {weight}}}, {{name: least-request, weight: 1}}]}}
endpoints:
- {{name: a, address: 127.0.0.1:18001}}
- {{name: b, address: 127.0.0.1:18002}}
{extra}"
    )
}

fn refused_keys(old: &str, new: &str) -> Vec<String> {
    match check(&config(old), &config(new)) {
        Err(Refused::Restart(keys)) => keys,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn weights_endpoints_and_pd_group_reload() {
    let base = doc(1, "", "");
    let plan = check(&config(&base), &config(&doc(7, "", ""))).unwrap();
    assert_eq!(
        plan,
        Some(Plan {
            layout: None,
            endpoints: false
        })
    );
    let fewer = base.replace("- {name: b, address: 127.0.0.1:18002}\n", "");
    let plan = check(&config(&base), &config(&fewer)).unwrap().unwrap();
    assert!(plan.endpoints);
    let pd = format!(
        "{base}pdGroup: {{groupKey: g, prefillLabels: {{r: p}}, decodeLabels: {{r: d}}}}\n"
    );
    assert!(check(&config(&base), &config(&pd)).unwrap().is_some());
    for picker in [
        "picker: {seed: 9}",
        "picker: {maxEndpoints: 1}",
        "picker: {affinity: {experimental: {engineBudget: false}}}",
        "picker: {loadShedding: {}}",
    ] {
        let next = format!("{base}{picker}\n");
        assert!(
            check(&config(&base), &config(&next)).unwrap().is_some(),
            "{picker}"
        );
    }
}

#[test]
fn an_unchanged_config_is_nothing_to_do() {
    let base = doc(1, "", "");
    let commented = format!("# a comment\n{base}unknownKey: 1\n");
    assert_eq!(check(&config(&base), &config(&commented)), Ok(None));
}

#[test]
fn start_up_keys_are_refused_by_name() {
    let base = doc(1, "", "");
    let cases = [
        ("picker: {tls: {mode: selfSigned}}", "picker.tls"),
        ("picker: {debug: {enabled: true}}", "picker.debug"),
        ("picker: {sessions: {enabled: true}}", "picker.sessions"),
        ("picker: {maxBodyBytes: 10}", "picker.maxBodyBytes"),
        (
            "picker: {responseTimeoutSeconds: 5}",
            "picker.responseTimeoutSeconds",
        ),
        (
            "picker: {scrapeIntervalSeconds: 5}",
            "picker.scrapeIntervalSeconds",
        ),
        ("sync: {redis: {url: 'redis://127.0.0.1:6379'}}", "sync"),
        (
            "discovery: {kubernetes: {namespace: ns, selector: app=vllm, targetPorts: [8000]}}",
            "discovery",
        ),
    ];
    for (extra, key) in cases {
        let next = format!("{base}{extra}\n");
        assert_eq!(refused_keys(&base, &next), [key], "{extra}");
    }
    let cache = doc(1, "maxHashCacheSize: 10", "");
    assert_eq!(
        refused_keys(&base, &cache),
        ["scheduler.pluginConfig prefix-cache maxHashCacheSize"]
    );
    // The engine scrape sizes the pods' budgets at start-up (affinity's default engineBudget).
    let budget = format!("{base}picker: {{affinity: {{}}}}\n");
    assert!(refused_keys(&base, &budget)[0].starts_with("picker.affinity"));
    let both = format!("{base}picker: {{tls: {{mode: selfSigned}}, maxBodyBytes: 10}}\n");
    let message = check(&config(&base), &config(&both))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "picker.tls, picker.maxBodyBytes changed (restart to apply)"
    );
}

#[test]
fn a_block_layout_change_is_planned_and_refused_under_sync() {
    let base = doc(1, "", "");
    let plan = check(&config(&base), &config(&doc(1, "blockSizeToHash: 32", "")))
        .unwrap()
        .unwrap();
    let (old, new) = plan.layout.expect("layout changed");
    assert_eq!((old.block_size, new.block_size), (64, 32));
    let long = format!(
        "{base}picker: {{affinity: {{longPrompts: true, experimental: {{engineBudget: false}}}}}}\n"
    );
    let plan = check(&config(&base), &config(&long)).unwrap().unwrap();
    assert!(plan.layout.is_some(), "the seeded scheme hashes otherwise");
    let affinity = format!(
        "{base}picker: {{affinity: {{longPrompts: false, experimental: {{engineBudget: false}}}}}}\n"
    );
    let plan = check(&config(&base), &config(&affinity)).unwrap().unwrap();
    let (old, new) = plan.layout.expect("the affinity mode renders tools too");
    assert_eq!(
        (old.scheme, new.scheme),
        (ChainScheme::Kthena, ChainScheme::Kthena)
    );
    assert_eq!(
        (old.rendering, new.rendering),
        (Rendering::Kthena, Rendering::Engine)
    );
    // More blocks matched: the first blocks hash alike, the index is kept.
    let plan = check(&config(&base), &config(&doc(1, "maxBlocksToMatch: 4", "")))
        .unwrap()
        .unwrap();
    assert_eq!(plan.layout, None);

    let sync = "sync: {redis: {url: 'redis://127.0.0.1:6379'}}\n";
    let keys = refused_keys(&doc(1, "", sync), &doc(1, "blockSizeToHash: 32", sync));
    assert_eq!(keys.len(), 1);
    assert!(keys[0].starts_with("the block hashes"), "{keys:?}");
}

/// A router as `serve` builds it from `doc`, with the prompt recorded for pod `a`.
fn reloader(doc: &str) -> (Arc<Router>, Reloader) {
    let registry = prometheus::Registry::new();
    let start = config(doc);
    let router = Arc::new(crate::testing::router_from_config(
        doc,
        static_endpoints(&start),
        &registry,
    ));
    let hashes = router
        .scheduler
        .load()
        .scheduler
        .prefix_cache()
        .hash(MODEL, PROMPT.as_bytes());
    let a = router.endpoints.snapshot().all()[0].clone();
    router.record(MODEL, &hashes, &a, RecordOrigin::Local);
    let reloader = Reloader::new(router.clone(), start, "old".into());
    (router, reloader)
}

fn entries(router: &Router) -> usize {
    router.scheduler.index().entries()
}

/// The prefix-cache weight and score of pod `a` that the next decision uses.
fn prefix_score(router: &Router) -> (u32, u32) {
    let body = serde_json::json!({"model": MODEL, "prompt": PROMPT}).to_string();
    let explained = router
        .explain("/v1/completions", Some(body.as_bytes()), None)
        .unwrap();
    let d = &explained.decision;
    let plugin = d
        .plugins
        .iter()
        .find(|p| p.plugin == "prefix-cache")
        .unwrap();
    let a = d
        .candidates
        .iter()
        .position(|c| c.spec.id.name == "a")
        .unwrap();
    (plugin.weight, plugin.scores.as_ref().unwrap()[a])
}

fn counted(router: &Router, result: ReloadResult) -> u64 {
    router
        .metrics
        .config_reloads
        .with_label_values(&[result.as_str()])
        .get()
}

fn info(router: &Router, sha256: &str) -> i64 {
    router
        .metrics
        .config_info
        .with_label_values(&[sha256])
        .get()
}

#[test]
fn a_changed_weight_takes_effect_and_the_index_is_kept() {
    let (router, reloader) = reloader(&doc(1, "", ""));
    let held = entries(&router);
    assert!(held > 0);
    assert_eq!(prefix_score(&router), (1, 100));
    let result = reloader.reload(Ok((config(&doc(5, "", "")), "new".into())));
    assert_eq!(result, ReloadResult::Success);
    assert_eq!(prefix_score(&router), (5, 100), "new weight, same match");
    assert_eq!(entries(&router), held);
    assert_eq!(counted(&router, ReloadResult::Success), 1);
    assert_eq!(reloader.sha256(), "new");
    assert_eq!((info(&router, "new"), info(&router, "old")), (1, 0));
}

#[test]
fn an_invalid_or_refused_config_keeps_the_old_one() {
    let (router, reloader) = reloader(&doc(3, "", ""));
    let held = entries(&router);
    let result = reloader.reload(Err(vec!["config is not valid YAML: oops".into()]));
    assert_eq!(result, ReloadResult::Failure);
    let tls = format!("{}picker: {{tls: {{mode: selfSigned}}}}\n", doc(9, "", ""));
    let result = reloader.reload(Ok((config(&tls), "tls".into())));
    assert_eq!(result, ReloadResult::Failure);
    assert_eq!(prefix_score(&router), (3, 100), "the old weight");
    assert_eq!(entries(&router), held);
    assert_eq!(counted(&router, ReloadResult::Failure), 2);
    assert_eq!(counted(&router, ReloadResult::Success), 0);
    assert_eq!(reloader.sha256(), "old");
    assert_eq!(info(&router, "old"), 1);
}

#[test]
fn a_block_size_change_clears_the_index() {
    let (router, reloader) = reloader(&doc(1, "", ""));
    assert!(entries(&router) > 0);
    let next = config(&doc(1, "blockSizeToHash: 16", ""));
    assert_eq!(
        reloader.reload(Ok((next, "new".into()))),
        ReloadResult::Success
    );
    assert_eq!(entries(&router), 0);
    assert_eq!(prefix_score(&router), (1, 0));
    // The pods still record, under the new layout.
    let live = router.scheduler.load();
    let hashes = live.scheduler.prefix_cache().hash(MODEL, PROMPT.as_bytes());
    assert_eq!(live.scheduler.prefix_cache().args().block_size_to_hash, 16);
    let a = router.endpoints.snapshot().all()[0].clone();
    router.record(MODEL, &hashes, &a, RecordOrigin::Local);
    assert_eq!(entries(&router), hashes.len());
    assert_eq!(prefix_score(&router), (1, 100));
}

#[test]
fn a_removed_endpoint_loses_its_entries_and_the_others_keep_theirs() {
    let base = doc(1, "", "");
    let (router, reloader) = reloader(&base);
    let held = entries(&router);
    let b = router.endpoints.snapshot().all()[1].clone();
    let hashes = router.scheduler.load().scheduler.prefix_cache().hash(
        MODEL,
        b"another prompt, for pod b only, long enough for one block of hashing at least",
    );
    router.record(MODEL, &hashes, &b, RecordOrigin::Local);
    let without_b = base.replace("- {name: b, address: 127.0.0.1:18002}\n", "");
    assert_eq!(
        reloader.reload(Ok((config(&without_b), "new".into()))),
        ReloadResult::Success
    );
    let pods = router.endpoints.snapshot();
    assert_eq!(pods.all().len(), 1);
    assert_eq!(pods.all()[0].spec.id.name, "a");
    assert_eq!(entries(&router), held, "a keeps its entries, b's are gone");
}

#[test]
fn the_same_config_again_counts_unchanged() {
    let base = doc(1, "", "");
    let (router, reloader) = reloader(&base);
    assert_eq!(
        reloader.reload(Ok((config(&base), "old".into()))),
        ReloadResult::Unchanged
    );
    assert_eq!(counted(&router, ReloadResult::Unchanged), 1);
    assert_eq!(counted(&router, ReloadResult::Success), 0);
}

/// A routerConfiguration reloaded as an `EndpointPickerConfig` (and the lora-affinity filter
/// added): the new profile scores against the same index, and the served-models fetch follows
/// the scheduler.
#[test]
fn an_endpoint_picker_config_reloads_over_the_same_index() {
    let (router, reloader) = reloader(&doc(1, "", ""));
    let held = entries(&router);
    assert!(!router.endpoints.fetches_served_models());
    let epc = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: queue-scorer, weight: 2}
endpoints:
- {name: a, address: 127.0.0.1:18001}
- {name: b, address: 127.0.0.1:18002}
";
    let result = reloader.reload(Ok((config(epc), "epc".into())));
    assert_eq!(result, ReloadResult::Success);
    assert_eq!(entries(&router), held, "the index is kept");
    let body = serde_json::json!({"model": MODEL, "prompt": PROMPT}).to_string();
    let explained = router
        .explain("/v1/completions", Some(body.as_bytes()), None)
        .unwrap();
    let d = &explained.decision;
    let prefix = d
        .plugins
        .iter()
        .find_map(|p| {
            p.fractional
                .as_ref()
                .filter(|f| f.name == "prefix-cache-scorer")
        })
        .unwrap();
    let a = d
        .candidates
        .iter()
        .position(|c| c.spec.id.name == "a")
        .unwrap();
    assert_eq!(prefix.scores[a], 1.0, "pod a holds the whole prompt");
    assert_eq!(d.primary().spec.id.name, "a");

    let lora = doc(1, "", "").replace(
        "  plugins:\n",
        "  plugins:\n    Filter: {enabled: [lora-affinity]}\n",
    );
    assert_eq!(
        reloader.reload(Ok((config(&lora), "lora".into()))),
        ReloadResult::Success
    );
    assert!(router.endpoints.fetches_served_models());
}
