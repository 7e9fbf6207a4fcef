use std::time::Duration;

use super::*;
use crate::scheduler::prefix_cache::PrefixCacheArgs;
use crate::scheduler::saturation::SaturationLimits;

/// The routerConfiguration of Kthena's Helm chart (ConfigMap `kthena-router-config`).
pub const KTHENA_HELM_DEFAULT: &str = r#"
scheduler:
  pluginConfig:
  - name: least-request
    args:
      maxWaitingRequests: 10
  - name: least-latency
    args:
      TTFTTPOTWeightFactor: 0.5
  - name: prefix-cache
    args:
      blockSizeToHash: 64
      maxBlocksToMatch: 128
      maxHashCacheSize: 50000
      topKMatches: 5
  plugins:
    Filter:
      enabled:
        - least-request
      disabled:
        - lora-affinity
    Score:
      enabled:
        - name: least-request
          weight: 1
        - name: gpu-usage
          weight: 1
        - name: least-latency
          weight: 1
        - name: prefix-cache
          weight: 1
auth:
  issuer: https://example.com
"#;

#[test]
fn kthena_helm_default_loads_unchanged() {
    let c = Config::parse(KTHENA_HELM_DEFAULT).unwrap();
    assert_eq!(c.scheduler, SchedulerConfig::default());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("auth: ignored") && w.contains("NOT authenticated"))
    );
    assert!(c.warnings.iter().any(|w| w.contains("Filter.disabled")));
}

#[test]
fn zero_or_missing_weight_stops_start_up_with_kthena_message() {
    let doc = |w: &str| {
        format!(
            "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - name: prefix-cache\n{w}"
        )
    };
    let err = Config::parse(&doc("        weight: 0\n")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed to Load Scheduler: failed to Unmarshal Plugins: score plugin \"prefix-cache\" must set a weight greater than 0, got 0"
    );
    let err = Config::parse(&doc("")).unwrap_err();
    assert!(err.to_string().ends_with("got 0"));
    let err = Config::parse(&doc("        weight: -2\n")).unwrap_err();
    assert!(err.to_string().ends_with("got -2"));
}

#[test]
fn every_problem_is_listed() {
    let doc = r#"
scheduler:
  pluginConfig:
  - name: least-latency
    args: {TTFTTPOTWeightFactor: 1.5}
  plugins:
    Score:
      enabled:
      - {name: prefix-cache, weight: 0}
      - {name: gpu-usage}
endpoints:
- {name: a, address: 127.0.0.1:1}
- {name: a, address: 127.0.0.1:1}
picker: {maxEndpoints: 9}
"#;
    let err = Config::parse(doc).unwrap_err();
    assert_eq!(err.0.len(), 6, "{err}");
}

#[test]
fn unknown_plugins_and_keys_are_warnings() {
    let doc = r#"
scheduler:
  plugins:
    Filter: {enabled: [least-request, made-up-filter, lora-affinity]}
    Score:
      enabled:
      - {name: pd-group, weight: 1}
      - {name: lora-affinity, weight: 1}
      - {name: prefix-cache, weight: 2}
      - {name: random, weight: 1}
      - {name: made-up, weight: 1}
extra: 1
"#;
    let c = Config::parse(doc).unwrap();
    assert_eq!(c.scheduler.scorers, [(ScorerKind::PrefixCache, 2)]);
    assert_eq!(
        c.scheduler.filters,
        [FilterKind::LeastRequest, FilterKind::LoraAffinity]
    );
    for needle in [
        "Failed to get plugin made-up-filter.",
        "Failed to get plugin lora-affinity. (a filter plugin: list it under plugins.Filter)",
        "Failed to get plugin pd-group. (not implemented by prefix-picker; skipped)",
        "Failed to get plugin made-up.",
        "random score plugin removed",
        "unknown top-level key extra",
    ] {
        assert!(
            c.warnings.iter().any(|w| w.contains(needle)),
            "{needle}: {:?}",
            c.warnings
        );
    }
}

#[test]
fn kvcache_aware_is_a_score_plugin_with_kthena_args() {
    let doc = r#"
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args: {blockSizeToHash: 32, MAXBLOCKSTOMATCH: 0, vllmTokenizerPort: 70000, sglangTokenizerPort: 31000, other: 1}
  plugins:
    Score:
      enabled:
      - {name: kvcache-aware, weight: 3}
      - {name: least-request, weight: 1}
"#;
    let c = Config::parse(doc).unwrap();
    assert_eq!(
        c.scheduler.scorers,
        [(ScorerKind::KvCacheAware, 3), (ScorerKind::LeastRequest, 1)]
    );
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.contains("Failed to get plugin")),
        "{:?}",
        c.warnings
    );
    let a = c.scheduler.kvcache_aware().expect("enabled");
    assert_eq!(
        (a.block_size_to_hash, a.max_blocks_to_match),
        (32, 128),
        "0 is the default, as Kthena"
    );
    assert_eq!(
        (a.vllm_tokenizer_port, a.sglang_tokenizer_port),
        (8000, 31000)
    );
    for needle in [
        "KVCacheAware: invalid vllm tokenizer port 70000, using default 8000",
        "kvcache-aware: unknown argument \"other\" ignored",
    ] {
        assert!(
            c.warnings.iter().any(|w| w.contains(needle)),
            "{needle}: {:?}",
            c.warnings
        );
    }
    // Kthena decodes the whole block or nothing: a string value gives every default.
    let doc = "scheduler:\n  pluginConfig:\n  - name: kvcache-aware\n    args: {blockSizeToHash: 8, maxBlocksToMatch: \"64\"}\n";
    let c = Config::parse(doc).unwrap();
    assert_eq!(c.scheduler.kvcache_aware, Default::default());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with(UNPARSABLE_KVCACHE_ARGS))
    );
    // Not enabled: no lookup.
    assert!(c.scheduler.kvcache_aware().is_none());
}

#[test]
fn unparsable_prefix_args_log_kthena_line() {
    let doc = "scheduler:\n  pluginConfig:\n  - name: prefix-cache\n    args: {blockSizeToHash: \"64\"}\n";
    let c = Config::parse(doc).unwrap();
    assert_eq!(c.scheduler.prefix_cache, PrefixCacheArgs::default());
    assert!(c.warnings.iter().any(|w| w == UNPARSABLE_ARGS));
}

#[test]
fn endpoints_and_picker_are_strict() {
    let c = Config::parse(
        "endpoints:\n- {name: a, address: 127.0.0.1:8001, models: [m]}\npicker: {seed: 7, maxEndpoints: 1}\n",
    )
    .unwrap();
    assert_eq!(c.endpoints[0].namespace, "default");
    assert_eq!(c.endpoints[0].models, ["m"]);
    assert_eq!(c.picker.seed, 7);
    assert_eq!(c.picker.max_endpoints, 1);
    assert!(Config::parse("endpoints:\n- {name: a, address: nothost}\n").is_err());
    assert!(Config::parse("picker: {sede: 1}\n").is_err());
}

#[test]
fn a_static_endpoints_generation_is_a_string_or_number_or_unset() {
    let c = Config::parse(
        "endpoints:\n- {name: a, address: 127.0.0.1:8001, generation: v2}\n\
         - {name: b, address: 127.0.0.1:8002, generation: 17}\n\
         - {name: c, address: 127.0.0.1:8003}\n",
    )
    .unwrap();
    let generations: Vec<_> = c
        .endpoints
        .iter()
        .map(|e| e.generation.as_deref())
        .collect();
    assert_eq!(generations, [Some("v2"), Some("17"), None]);
    let specs = crate::serve::static_endpoints(&c);
    assert_eq!(specs[0].generation, "v2");
    assert_eq!(specs[2].generation, "", "unset: learned from the engine");
    let e = Config::parse("endpoints:\n- {name: a, address: 127.0.0.1:8001, generation: ''}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("endpoint default/a: generation must not be empty"),
        "{e}"
    );
    let e = Config::parse("endpoints:\n- {name: a, address: 127.0.0.1:8001, generation: [1]}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("generation must be a string or a number"), "{e}");
}

#[test]
fn discovery_section_is_parsed_strictly_and_replaces_the_no_endpoints_warning() {
    let c = Config::parse("discovery: {kubernetes: {selector: app=vllm, targetPorts: [8000]}}")
        .unwrap();
    assert!(c.discovery.kubernetes.is_some());
    assert!(!c.warnings.iter().any(|w| w.contains("no endpoints")));
    assert!(
        Config::parse("")
            .unwrap()
            .warnings
            .iter()
            .any(|w| w.contains("no endpoints"))
    );
    let err = Config::parse("discovery: {kubernetes: {inferencePool: p, targetPort: [1]}}")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("discovery: ") && err.contains("targetPort"),
        "{err}"
    );
}

#[test]
fn gie_endpoint_picker_config_is_read_as_one() {
    let doc = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefix-cache-scorer\n";
    let c = Config::parse(doc).unwrap();
    let profile = c.scheduler.epp.expect("an EndpointPickerConfig profile");
    assert_eq!(profile.scorers.len(), 1);
}

fn yaml(s: &str) -> Yaml {
    serde_yaml_ng::from_str(s).unwrap()
}

fn parse(s: &str) -> ParsedArgs {
    parse_prefix_cache_args(Some(&yaml(s)))
}

#[test]
fn args_defaults_and_leniency() {
    let d = PrefixCacheArgs::default();
    assert_eq!(parse_prefix_cache_args(None).args, d);
    let p =
        parse("{blockSizeToHash: 32, maxBlocksToMatch: 0, maxHashCacheSize: -5, topKMatches: 3}");
    assert_eq!(
        p.args,
        PrefixCacheArgs {
            block_size_to_hash: 32,
            top_k_matches: 3,
            ..d
        }
    );
    assert!(p.warnings.is_empty());
    // Keys match case-insensitively; integral floats are accepted.
    let p = parse("{blocksizetohash: 16.0, TOPKMATCHES: 2}");
    assert_eq!(p.args.block_size_to_hash, 16);
    assert_eq!(p.args.top_k_matches, 2);
    // Misspelled names are ignored with a warning.
    let p = parse("{blockSize: 16, topKMatches: 9}");
    assert_eq!(p.args.block_size_to_hash, 64);
    assert_eq!(p.args.top_k_matches, 9);
    assert_eq!(p.warnings.len(), 1);
    assert!(p.warnings[0].contains("\"blockSize\""));
}

#[test]
fn unparsable_args_fall_back_to_all_defaults() {
    for bad in [
        "{blockSizeToHash: \"64\", topKMatches: 2}",
        "{blockSizeToHash: 64.5, topKMatches: 2}",
        "{blockSizeToHash: [1], topKMatches: 2}",
        "{blockSizeToHash: true}",
        "[1, 2]",
        "seven",
        "{blockSizeToHash: 1.0e30}",
    ] {
        let p = parse(bad);
        assert_eq!(p.args, PrefixCacheArgs::default(), "{bad}");
        assert_eq!(p.warnings, [UNPARSABLE_ARGS], "{bad}");
    }
}

#[test]
fn engine_metric_names_are_parsed_once_and_a_bad_spec_names_the_key() {
    use crate::pod_metrics::names::{MetricSource, Signal};
    let c = Config::parse(
        "picker: {engineMetrics: {totalQueuedRequests: 'q{type=waiting}', timeToFirstToken: ''}}",
    )
    .unwrap();
    let names = c.picker.engine_metrics.resolve();
    assert_eq!(names.describe(Signal::Waiting), "q{type=waiting}");
    assert!(names.get(Signal::Ttft).is_empty(), "off");
    assert_eq!(names.get(Signal::Running).len(), 2, "built in");
    assert_eq!(
        c.picker.engine_metrics.time_to_first_token,
        Some(MetricSource::Off)
    );
    let e = Config::parse("picker: {engineMetrics: {totalQueuedRequests: 'q{type}'}}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("picker")
            && e.contains("metric spec \"q{type}\": labels are written label=value"),
        "{e}"
    );
}

#[test]
fn client_certificate_keys_are_checked_with_the_rest_of_the_picker_section() {
    let errors: Vec<String> = Config::parse(
        "picker: {tls: {clientCaFile: ca.pem, clientAuth: none, requireClientCertFor: [accessLog]}}",
    )
    .unwrap_err()
    .0
    .iter()
    .map(|e| e.to_string())
    .collect();
    assert_eq!(
        errors,
        [
            "picker: tls: clientCaFile needs mode selfSigned or files, got mode plaintext",
            "picker: tls: clientCaFile is unused with clientAuth none",
            "picker: tls: requireClientCertFor accessLog needs client certificates: set clientCaFile, with clientAuth optional or required",
        ]
    );
    let c = Config::parse("picker: {tls: {mode: selfSigned, clientCaFile: ca.pem}}").unwrap();
    assert_eq!(c.picker.tls.client_auth(), crate::tls::ClientAuth::Optional);
}

#[test]
fn pd_group_mirrors_kthenas_workload_selector_and_labels_static_endpoints() {
    let c = Config::parse(
        r#"
pdGroup:
  groupKey: kthena.io/group
  prefillLabels: {kthena.io/role: prefill}
  decodeLabels: {kthena.io/role: decode, tier: gpu}
endpoints:
- {name: d0, address: 127.0.0.1:8001, labels: {kthena.io/role: decode, tier: gpu, kthena.io/group: g0}}
- {name: p0, address: 127.0.0.1:8002, labels: {kthena.io/role: prefill, kthena.io/group: g0}}
- {name: stray, address: 127.0.0.1:8003, labels: {kthena.io/role: decode}}
"#,
    )
    .unwrap();
    let g = c.scheduler.pd.as_ref().expect("pdGroup");
    assert_eq!(g.group_key(), "kthena.io/group");
    assert_eq!(g.decode_labels().len(), 2);
    assert_eq!(c.endpoints[1].labels["kthena.io/role"], "prefill");
    // The scheduler block is Kthena's default, untouched by the section.
    assert_eq!(
        SchedulerConfig {
            pd: None,
            ..c.scheduler.clone()
        },
        SchedulerConfig::default()
    );
    // `stray` has no group value: warned, it gets no inference traffic.
    let stray: Vec<_> = c
        .warnings
        .iter()
        .filter(|w| w.contains("no inference traffic"))
        .collect();
    assert_eq!(stray.len(), 1, "{:?}", c.warnings);
    assert!(stray[0].starts_with("endpoint default/stray "), "{stray:?}");
    assert!(c.scheduler.mode_summary().contains("kthena.io/group"));
    // Without the section, labels are kept and nothing is paired.
    let c =
        Config::parse("endpoints:\n- {name: a, address: 127.0.0.1:1, labels: {x: y}}\n").unwrap();
    assert!(c.scheduler.pd.is_none());
    assert_eq!(c.endpoints[0].labels["x"], "y");
}

#[test]
fn a_bad_pd_group_is_refused_naming_the_key() {
    let err = |doc: &str| Config::parse(doc).unwrap_err().to_string();
    assert_eq!(
        err("pdGroup: {groupKey: '', prefillLabels: {r: p}, decodeLabels: {r: d}}"),
        "pdGroup.groupKey must be a non-empty label key, got \"\""
    );
    assert_eq!(
        err("pdGroup: {groupKey: g, prefillLabels: {}, decodeLabels: {r: d}}"),
        "pdGroup.prefillLabels must list at least one label (an empty set matches no pod)"
    );
    let e = err("pdGroup: {groupKey: g, prefillLabels: {r: p}}");
    assert!(
        e.starts_with("pdGroup: missing field `decodeLabels`"),
        "{e}"
    );
    let e = err("pdGroup: {groupKey: g, prefillLabels: {r: p}, decodeLabels: {r: d}, role: x}");
    assert!(e.starts_with("pdGroup: unknown field `role`"), "{e}");
    let e = err("endpoints:\n- {name: a, address: 127.0.0.1:1, labels: [x]}\n");
    assert!(e.starts_with("endpoints: "), "{e}");
}

#[test]
fn role_label_is_a_deprecated_alias_warned_about() {
    let c = Config::parse(
        "discovery: {kubernetes: {selector: app=vllm, targetPorts: [8000], roleLabel: role}}",
    )
    .unwrap();
    assert!(c.warnings.iter().any(|w| w == ROLE_LABEL_DEPRECATED));
    let c = Config::parse("discovery: {kubernetes: {selector: app=vllm, targetPorts: [8000]}}")
        .unwrap();
    assert!(!c.warnings.iter().any(|w| w == ROLE_LABEL_DEPRECATED));
}

#[test]
fn load_shedding_is_off_unless_configured() {
    let limits = |doc: &str| Config::parse(doc).unwrap().scheduler.load_shedding;
    assert_eq!(limits(""), None);
    assert_eq!(limits(KTHENA_HELM_DEFAULT), None);
    assert_eq!(limits("picker: {loadShedding: {enabled: false}}\n"), None);
    // The section alone turns it on with GIE's thresholds; staleness is three scrape periods.
    assert_eq!(
        limits("picker: {loadShedding: {}}\n"),
        Some(SaturationLimits {
            queue_depth: 5,
            kv_cache_utilization: 0.8,
            max_inflight: None,
            staleness: Duration::from_secs(3),
        })
    );
    let c = Config::parse(
        "picker:\n  scrapeIntervalSeconds: 0.5\n  loadShedding: {queueDepth: 0, kvCacheUtilization: 1, maxInFlightPerPod: 32, retryAfterSeconds: 7}\n",
    )
    .unwrap();
    assert_eq!(
        c.scheduler.load_shedding,
        Some(SaturationLimits {
            queue_depth: 0,
            kv_cache_utilization: 1.0,
            max_inflight: Some(32),
            staleness: Duration::from_millis(1500),
        })
    );
    assert_eq!(
        c.picker.load_shedding.map(|s| s.retry_after_seconds),
        Some(7)
    );
    assert!(c.scheduler.mode_summary().contains(
        "load shedding on (queueDepth 0, kvCacheUtilization 1, maxInFlightPerPod 32, metrics stale after 1.5 s)"
    ));
    assert!(
        !Config::parse("")
            .unwrap()
            .scheduler
            .mode_summary()
            .contains("shedding")
    );
}

#[test]
fn load_shedding_values_are_refused_naming_the_key_and_value() {
    let cases = [
        (
            "kvCacheUtilization: 1.5",
            "loadShedding.kvCacheUtilization must be in 0..=1, got 1.5",
        ),
        (
            "kvCacheUtilization: -0.1",
            "loadShedding.kvCacheUtilization must be in 0..=1, got -0.1",
        ),
        (
            "kvCacheUtilization: .nan",
            "loadShedding.kvCacheUtilization must be in 0..=1, got NaN",
        ),
        (
            "maxInFlightPerPod: 0",
            "loadShedding.maxInFlightPerPod must be > 0 (or unset), got 0",
        ),
        (
            "retryAfterSeconds: 0",
            "loadShedding.retryAfterSeconds must be in 1..=3600, got 0",
        ),
        (
            "retryAfterSeconds: 3601",
            "loadShedding.retryAfterSeconds must be in 1..=3600, got 3601",
        ),
        (
            "metricsStalenessSeconds: 0",
            "loadShedding.metricsStalenessSeconds must be a number of seconds in (0, 86400], got 0",
        ),
        (
            "metricsStalenessSeconds: .inf",
            "loadShedding.metricsStalenessSeconds must be a number of seconds in (0, 86400], got inf",
        ),
        (
            "metricsStalenessSeconds: 0.5",
            "loadShedding.metricsStalenessSeconds must be at least scrapeIntervalSeconds (1), or every pod's engine metrics go stale between scrapes, got 0.5",
        ),
    ];
    for (value, expected) in cases {
        let doc = format!("picker: {{loadShedding: {{{value}}}}}\n");
        let err = Config::parse(&doc).unwrap_err();
        assert_eq!(err.0, [ConfigError::Picker(expected.into())], "{value}");
        assert_eq!(err.to_string(), format!("picker: {expected}"));
    }
    // Wrong types and unknown keys: serde's message, naming the key.
    for (value, key) in [
        ("retryAfterSeconds: 1.5", "retryAfterSeconds"),
        ("queueDepth: -1", "queueDepth"),
        ("queueDepth: lots", "queueDepth"),
        ("maxInflight: 3", "maxInflight"),
    ] {
        let doc = format!("picker: {{loadShedding: {{{value}}}}}\n");
        let err = Config::parse(&doc).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("picker: loadShedding.{key}: ")),
            "{value}: {err}"
        );
    }
    // A disabled section is not checked further (as `affinity: {enabled: false}`).
    assert!(
        Config::parse("picker: {loadShedding: {enabled: false, retryAfterSeconds: 0}}\n").is_ok()
    );
}

#[test]
fn load_shedding_that_can_never_shed_is_warned_about() {
    let c = Config::parse("picker: {scrapeIntervalSeconds: 0, loadShedding: {}}\n").unwrap();
    assert!(
        c.warnings.iter().any(|w| w == NOTHING_TO_SHED),
        "{:?}",
        c.warnings
    );
    for doc in [
        "picker: {scrapeIntervalSeconds: 0, loadShedding: {maxInFlightPerPod: 8}}\n",
        "picker: {loadShedding: {}}\n",
        "picker: {scrapeIntervalSeconds: 0, loadShedding: {enabled: false}}\n",
    ] {
        let c = Config::parse(doc).unwrap();
        assert!(!c.warnings.iter().any(|w| w == NOTHING_TO_SHED), "{doc}");
    }
}

#[test]
fn affinity_errors_name_the_key_and_the_value() {
    let cases = [
        ("podCapacity: 0", "affinity.podCapacity must be > 0, got 0"),
        (
            "shareHeadroom: -0.1",
            "affinity.shareHeadroom must be a number >= 0, got -0.1",
        ),
        (
            "experimental: {shareWindow: 0}",
            "affinity.experimental.shareWindow must be > 0, got 0",
        ),
        (
            "experimental: {tentativeMinRatio: 1.5}",
            "affinity.experimental.tentativeMinRatio must be in 0..=1, got 1.5",
        ),
        (
            "experimental: {churnSlack: -1}",
            "affinity.experimental.churnSlack must be a number >= 0, got -1",
        ),
        (
            "experimental: {churnSlack: .nan}",
            "affinity.experimental.churnSlack must be a number >= 0, got NaN",
        ),
        (
            "bytesPerToken: 0",
            "affinity.bytesPerToken must be > 0, got 0",
        ),
        (
            "experimental: {shareBusy: 1.5}",
            "affinity.experimental.shareBusy must be in 0..=1, got 1.5",
        ),
        (
            "experimental: {sharePressure: -0.5}",
            "affinity.experimental.sharePressure must be a number >= 0, got -0.5",
        ),
        (
            "experimental: {latencySignals: [inflight, queue]}",
            "affinity.experimental.latencySignals must be a list of inflight, engineQueue, pace, prefillFit, got \"queue\"",
        ),
    ];
    for (value, expected) in cases {
        let doc = format!("picker: {{affinity: {{{value}}}}}\n");
        let err = Config::parse(&doc).unwrap_err();
        assert_eq!(err.to_string(), format!("picker: {expected}"), "{value}");
    }
    // The experimental keys reach the scheduler.
    let c = Config::parse(
        "picker: {affinity: {experimental: {placeByChurn: false, churnSlack: 0.1, shareBusy: 0, sharePressure: 1.5}}}\n",
    )
    .unwrap();
    let a = c.scheduler.affinity.expect("affinity mode");
    assert!(!a.place_by_churn);
    assert_eq!(a.churn_slack, 0.1);
    assert_eq!(a.share_busy, 0.0);
    assert_eq!(a.share_pressure, 1.5);
    assert_eq!(a.bytes_per_token, 4);
    // The latency model's signals: all by default, or those listed.
    use crate::scheduler::latency::{LatencySignal, Signals};
    assert!(a.latency_model);
    assert_eq!(a.latency_signals, Signals::ALL);
    let c =
        Config::parse("picker: {affinity: {experimental: {latencySignals: [inflight, pace]}}}\n")
            .unwrap();
    let a = c.scheduler.affinity.expect("affinity mode");
    assert_eq!(
        a.latency_signals,
        Signals::of([LatencySignal::Inflight, LatencySignal::Pace])
    );
}

#[test]
fn engine_truth_keys_are_checked_and_validate_says_each_pods_source() {
    let base = "endpoints:\n- {name: a, address: 127.0.0.1:8001, kvEventsEndpoint: tcp://127.0.0.1:5557, kvEventsReplayEndpoint: tcp://127.0.0.1:5558}\n- {name: b, address: 127.0.0.1:8002}\n";
    let c = Config::parse(&format!(
        "{base}picker: {{affinity: {{}}, tokenizer: {{source: engine}}}}\n"
    ))
    .unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(
        c.match_sources(),
        [
            "  default/a: matched by engine KV events (tcp://127.0.0.1:5557), tokens from the pod's /tokenize",
            "  default/b: matched by estimate"
        ]
    );
    // Without the tokenizer the events cannot be matched: a warning, and validate says why.
    let c = Config::parse(&format!("{base}picker: {{affinity: {{}}}}\n")).unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("picker.tokenizer")));
    assert!(c.match_sources()[0].contains("needs picker.tokenizer"));
    // Bad values name the endpoint, the key and the value.
    let bad =
        "endpoints:\n- {name: a, address: 127.0.0.1:8001, kvEventsEndpoint: \"127.0.0.1:5557\"}\n";
    let e = Config::parse(bad).unwrap_err().to_string();
    assert!(
        e.contains(
            "endpoint default/a: kvEventsEndpoint must be tcp://host:port, got \"127.0.0.1:5557\""
        ),
        "{e}"
    );
    let e = Config::parse(
        "endpoints:\n- {name: a, address: 127.0.0.1:8001, kvEventsReplayEndpoint: tcp://h:1}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("kvEventsReplayEndpoint needs kvEventsEndpoint"),
        "{e}"
    );
    let e = Config::parse("picker: {tokenizer: {source: engine, timeoutMs: 0}}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.timeoutMs must be > 0, got 0"), "{e}");
    let e = Config::parse("picker: {tokenizer: {source: remote}}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("remote"), "{e}");
    let e = Config::parse("picker: {kvEvents: {maxBlocksPerPod: 0}}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kvEvents.maxBlocksPerPod must be > 0, got 0"),
        "{e}"
    );
}

#[cfg(feature = "tokenizer-file")]
#[test]
fn the_file_tokenizer_is_loaded_at_parse_and_its_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let config = |path: &std::path::Path| {
        format!(
            "endpoints:\n- {{name: a, address: 127.0.0.1:8001, kvEventsEndpoint: tcp://127.0.0.1:5557}}\npicker: {{affinity: {{}}, tokenizer: {{source: file, path: {}}}}}\n",
            path.display()
        )
    };
    // Missing.
    let e = Config::parse(&config(&path)).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.path") && e.contains(&path.display().to_string()),
        "{e}"
    );
    // Not a tokenizer.json.
    std::fs::write(&path, "{\"model\": 3").unwrap();
    let e = Config::parse(&config(&path)).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    // A tokenizer without a chat template: loaded, with a warning that chat falls back.
    std::fs::write(&path, model_sim::tokenizer_json::default_tokenizer_json()).unwrap();
    let c = Config::parse(&config(&path)).unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("has no chat template")),
        "{:?}",
        c.warnings
    );
    assert_eq!(
        c.match_sources()[0],
        format!(
            "  default/a: matched by engine KV events (tcp://127.0.0.1:5557), tokens from tokenizer.json {}",
            path.display()
        )
    );
    // With the sim's tokenizer_config.json beside it: no warning; equal files compare equal
    // (a reload keeps the section), changed files do not.
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let c = Config::parse(&config(&path)).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let again = Config::parse(&config(&path)).unwrap();
    assert_eq!(c.picker.tokenizer, again.picker.tokenizer);
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages }}").unwrap();
    let changed = Config::parse(&config(&path)).unwrap();
    assert_ne!(c.picker.tokenizer, changed.picker.tokenizer);
    // The keys that go together.
    let e = Config::parse("picker: {tokenizer: {source: file}}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.source: file needs tokenizer.path"),
        "{e}"
    );
    let e = Config::parse("picker: {tokenizer: {source: engine, path: /x/tokenizer.json}}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.path (/x/tokenizer.json) is read by source: file only"),
        "{e}"
    );
}

#[test]
fn lora_affinity_is_a_filter_that_needs_the_engine_scrape() {
    let doc = |interval: &str| {
        format!(
            "scheduler:\n  plugins:\n    Filter: {{enabled: [lora-affinity, least-request]}}\npicker: {{scrapeIntervalSeconds: {interval}}}\nendpoints:\n- {{name: a, address: 127.0.0.1:1}}\n"
        )
    };
    let c = Config::parse(&doc("1")).unwrap();
    assert_eq!(
        c.scheduler.filters,
        [FilterKind::LoraAffinity, FilterKind::LeastRequest]
    );
    assert!(c.scheduler.needs_served_models());
    assert!(!SchedulerConfig::default().needs_served_models());
    let err = Config::parse(&doc("0")).unwrap_err().to_string();
    assert!(
        err.contains("lora-affinity") && err.contains("picker.scrapeIntervalSeconds must not be 0"),
        "{err}"
    );
}

#[test]
fn flow_control_is_on_with_the_affinity_mode_unless_set() {
    let active = |yaml: &str| Config::parse(yaml).unwrap().picker.flow_control.active;
    assert!(active("picker: {affinity: {}}\n"), "on by default");
    assert!(active(
        "picker: {affinity: {}, flowControl: {enabled: true}}\n"
    ));
    assert!(!active("picker: {}\n"), "Kthena's mode");
    assert!(!active(
        "picker: {affinity: {}}\npdGroup: {groupKey: g, prefillLabels: {r: p}, decodeLabels: {r: d}}\n"
    ));
    assert!(!active(
        "picker: {affinity: {}, flowControl: {enabled: false}}\n"
    ));
    assert!(active("picker: {flowControl: {enabled: true}}\n"));
    let e = Config::parse("picker: {affinity: {}, flowControl: {requestTtlSeconds: -1}}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("flowControl.requestTtlSeconds"), "{e}");
    let warned = Config::parse(
        "picker: {affinity: {}, flowControl: {enabled: true, requestTtlSeconds: 60, messageTimeoutSeconds: 35}}\n",
    )
    .unwrap()
    .warnings
    .join("\n");
    assert!(warned.contains("messageTimeoutSeconds"), "{warned}");
}

/// [`Config::parse_with_env`] with `vars` as the whole environment.
fn parse_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let map: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::parse_with_env(text, &|name| map.get(name).cloned())
}

#[test]
fn kthenas_fairness_settings_turn_flow_control_on_in_kthenas_mode_only() {
    let with_jwks = format!("{KTHENA_HELM_DEFAULT}  jwksUri: https://example.com/jwks\n");
    let fairness = [
        ("ENABLE_FAIRNESS_SCHEDULING", "true"),
        ("FAIRNESS_WINDOW_SIZE", "1h"),
        ("FAIRNESS_QUEUE_TIMEOUT", "45s"),
        ("FAIRNESS_MAX_CONCURRENT", "16"),
    ];
    let c = parse_env(&with_jwks, &fairness).unwrap();
    let fc = &c.picker.flow_control;
    assert!(fc.active);
    assert_eq!(fc.request_ttl_seconds, 45.0);
    let k = fc.kthena.as_ref().unwrap();
    assert!(
        k.jwt_user,
        "auth.jwksUri set: Kthena's user is the JWT's sub"
    );
    assert_eq!(k.max_in_flight_per_model, Some(16));
    assert!(fc.reads_authorization());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("FAIRNESS_WINDOW_SIZE"))
    );
    // The Helm chart's default config names an issuer, no JWKS: Kthena authenticates nobody.
    let anonymous = parse_env(KTHENA_HELM_DEFAULT, &fairness).unwrap();
    assert!(!anonymous.picker.flow_control.kthena.unwrap().jwt_user);

    // Unset or false: exactly the config without them.
    let plain = Config::parse(KTHENA_HELM_DEFAULT).unwrap();
    assert!(!plain.picker.flow_control.active);
    for off in [
        &[][..],
        &[
            ("ENABLE_FAIRNESS_SCHEDULING", "false"),
            ("FAIRNESS_WINDOW_SIZE", "bad"),
        ][..],
    ] {
        assert_eq!(
            parse_env(KTHENA_HELM_DEFAULT, off).unwrap(),
            plain,
            "{off:?}"
        );
    }

    // The affinity mode: not read, said.
    let affinity = parse_env("picker: {affinity: {}}\n", &fairness).unwrap();
    assert!(affinity.picker.flow_control.kthena.is_none());
    assert_eq!(
        affinity.picker.flow_control,
        Config::parse("picker: {affinity: {}}\n")
            .unwrap()
            .picker
            .flow_control
    );
    assert!(
        affinity
            .warnings
            .iter()
            .any(|w| w.starts_with("ENABLE_FAIRNESS_SCHEDULING=true: read in Kthena's mode only"))
    );

    // An invalid value stops the start, naming the variable and the value.
    let e = parse_env(
        KTHENA_HELM_DEFAULT,
        &[
            ("ENABLE_FAIRNESS_SCHEDULING", "true"),
            ("FAIRNESS_QUEUE_TIMEOUT", "60"),
        ],
    )
    .unwrap_err()
    .in_file("router.yaml", KTHENA_HELM_DEFAULT)
    .to_string();
    assert!(
        e.contains("FAIRNESS_QUEUE_TIMEOUT=\"60\"") && e.contains("Go duration"),
        "{e}"
    );
}

/// A routerConfiguration read from a file: each error names the file, the line and the field
/// before its message (Kthena's own messages verbatim after that).
#[test]
fn kthena_config_errors_name_the_file_the_line_and_the_field() {
    let load = |text: &str| {
        Config::parse(text)
            .map_err(|e| e.in_file("router.yaml", text))
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    let weight = "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - name: least-request\n        weight: 1\n      - name: prefix-cache\n        weight: 0\n";
    assert_eq!(
        load(weight),
        [
            "router.yaml:7: scheduler.plugins.Score.enabled[prefix-cache].weight: failed to Load Scheduler: failed to Unmarshal Plugins: score plugin \"prefix-cache\" must set a weight greater than 0, got 0"
        ]
    );
    let picker =
        "endpoints:\n- {name: a, address: \"127.0.0.1:1\"}\npicker:\n  seed: 7\n  sede: 8\n";
    let e = load(picker);
    assert!(
        e[0].starts_with("router.yaml:5: picker.sede: picker: unknown field `sede`"),
        "{e:?}"
    );
    let endpoint =
        "endpoints:\n- {name: a, address: \"127.0.0.1:1\"}\n- name: b\n  adress: \"127.0.0.1:2\"\n";
    let e = load(endpoint);
    assert!(
        e[0].starts_with("router.yaml:4: endpoints[1].adress: endpoints: "),
        "{e:?}"
    );
    let group = "endpoints: []\npdGroup:\n  groupKey: g\n  prefillLabels: {role: p}\n";
    let e = load(group);
    assert_eq!(
        e,
        ["router.yaml:3: pdGroup.decodeLabels: pdGroup: missing field `decodeLabels`"]
    );
    let yaml = "endpoints: [\n";
    let e = load(yaml);
    assert!(
        e[0].starts_with("router.yaml:2: document: config is not valid YAML"),
        "{e:?}"
    );
}
