use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::discovery::DiscoveryMetrics;
use crate::pod_metrics::ScrapeMetrics;
use crate::sync::metrics::SyncMetrics;

#[test]
fn records_count_evictions_by_the_evicted_model() {
    let m = PrefixCacheMetrics::unregistered();
    let (a, b) = (ModelKey::of("a"), ModelKey::of("b"));
    let outcome = |evicted| RecordOutcome {
        inserted: 1,
        evicted,
    };
    m.count_record("b", &outcome(vec![]));
    m.count_record("a", &outcome(vec![(a, 2)]));
    assert_eq!(m.evictions.with_label_values(&["a"]).get(), 2);
    m.count_record("a", &outcome(vec![(b, 1), (ModelKey(7), 3)]));
    assert_eq!(m.evictions.with_label_values(&["b"]).get(), 1);
    assert_eq!(
        m.evictions.with_label_values(&["0000000000000007"]).get(),
        3
    );
}

#[test]
fn match_ratio_buckets_are_kthenas() {
    let m = PrefixCacheMetrics::unregistered();
    let h = m.match_ratio.with_label_values(&["m"]);
    h.observe(0.0);
    h.observe(0.75);
    let registry = Registry::new();
    registry.register(Box::new(m.match_ratio.clone())).unwrap();
    let text = encode(&registry);
    assert!(text.contains("kthena_router_prefix_cache_match_ratio_bucket{model=\"m\",le=\"0\"} 1"));
    assert!(text.contains("kthena_router_prefix_cache_match_ratio_sum{model=\"m\"} 0.75"));
}

#[test]
fn build_info_names_this_build() {
    let registry = Registry::new();
    RouterMetrics::register(&registry);
    let text = encode(&registry);
    let line = format!(
        "prefix_picker_build_info{{revision=\"{REVISION}\",version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&line), "{line} not in:\n{text}");
    assert!(!REVISION.is_empty());
}

/// Labels whose values are not an enum, so their help lists none.
const FREE_FORM: &[&str] = &[
    "model",
    "plugin",
    "type",
    "status",
    "version",
    "revision",
    "le",
    // Flow control's bands (the config's priorities) and flows (tenants' fairness ids).
    "priority",
    "flow",
    POD_LABELS[0],
    POD_LABELS[1],
];

#[test]
fn listing_reads_back() {
    let help = listing(
        "Things, by kind (a note)",
        &[("kind", &["a", "b_c"]), ("x", &["y"])],
    );
    assert_eq!(help, "Things, by kind (a note) (kind: a, b_c; x: y)");
    let lists = listed(&help);
    assert_eq!(lists.len(), 2);
    assert_eq!(lists["kind"], BTreeSet::from(["a".into(), "b_c".into()]));
    assert!(listed("Requests picked for a pod (primary) and not yet completed").is_empty());
}

/// Every metric of the picker in one registry, with one pod's per-pod series created through
/// the same calls the picker makes.
fn every_metric() -> Registry {
    let registry = Registry::new();
    PrefixCacheMetrics::register(&registry);
    let router = RouterMetrics::register(&registry);
    SyncMetrics::register(&registry);
    DiscoveryMetrics::register(&registry);
    ScrapeMetrics::register(&registry);
    let pod = PodId {
        namespace: "ns".into(),
        name: "vllm-0".into(),
    };
    router.count_scrape(&pod, ScrapeResult::Ok);
    router.count_scrape(&pod, ScrapeResult::Error);
    registry
}

/// The help strings list exactly the values exported for each enum-valued label (all exist
/// from the start), and every label is either enum-valued and listed or free-form.
#[test]
fn help_strings_list_exactly_the_emitted_label_values() {
    let mut checked = 0;
    for family in every_metric().gather() {
        let name = family.name();
        if name.starts_with("kthena_router_") || name.starts_with("process_") {
            continue; // Kthena's help strings; the crate's process collector
        }
        let lists = listed(family.help());
        let mut emitted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for metric in family.get_metric() {
            for pair in metric.get_label() {
                emitted
                    .entry(pair.name().to_string())
                    .or_default()
                    .insert(pair.value().to_string());
            }
        }
        for (label, values) in &emitted {
            if FREE_FORM.contains(&label.as_str())
                || name == "prefix_picker_discovery_endpoints" && label == "role"
            {
                assert!(!lists.contains_key(label), "{name}: {label} is free-form");
                continue;
            }
            let listed = lists.get(label).unwrap_or_else(|| {
                panic!("{name}: help lists no {label} values: {}", family.help())
            });
            assert_eq!(values, listed, "{name}{{{label}}}: emitted vs help");
            checked += 1;
        }
        for label in lists.keys() {
            assert!(
                emitted.contains_key(label),
                "{name}: help lists {label}, not a label"
            );
        }
    }
    assert!(checked >= 15, "{checked} labels checked");
}

/// Process metrics, in seconds and bytes.
#[cfg(target_os = "linux")]
#[test]
fn process_metrics_are_exported() {
    let text = encode(&every_metric());
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            text.contains(&format!("\n{name} ")),
            "{name} missing:\n{text}"
        );
    }
}

/// Every duration is in seconds: no exported name says another unit.
#[test]
fn durations_are_in_seconds() {
    for family in every_metric().gather() {
        for unit in [
            "_milliseconds",
            "_ms",
            "_microseconds",
            "_us",
            "_minutes",
            "_hours",
        ] {
            assert!(!family.name().contains(unit), "{}", family.name());
        }
    }
}
