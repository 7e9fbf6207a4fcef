use super::*;
use crate::config::{Config, ConfigError};
use crate::scheduler::epp::{EppFilter, EppPicker, EppScorerKind, LabelRequirement, LabelSelector};

/// llm-d's published example configs (`testdata/`, each citing its source), as loaded: the
/// profile's filters, scorers with weights and picker, or the error naming what is missing.
#[test]
fn llm_ds_example_configs_load_unchanged() {
    let load = |text: &str| Config::parse(text).map(|c| c.scheduler.epp.unwrap());
    let p = load(include_str!("testdata/epp-config.yaml")).unwrap();
    assert_eq!(p.filters, [EppFilter::Decode]);
    assert_eq!(p.picker, EppPicker::MaxScore);
    assert_eq!(p.scorers.len(), 1);
    assert_eq!(
        (p.scorers[0].kind.as_str(), p.scorers[0].weight),
        ("prefix-cache-scorer", 2.0)
    );

    let p = load(include_str!(
        "testdata/epp-precise-prefix-cache-config.yaml"
    ))
    .unwrap();
    let weights: Vec<(&str, f64)> = p
        .scorers
        .iter()
        .map(|s| (s.kind.as_str(), s.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("prefix-cache-scorer", 2.0),
            ("kv-cache-utilization-scorer", 1.0),
            ("queue-scorer", 1.0)
        ]
    );

    let p = load(include_str!(
        "testdata/epp-estimate-prefix-cache-config.yaml"
    ))
    .unwrap();
    assert_eq!(
        p.scorers[1].kind,
        EppScorerKind::LoadAware { threshold: 128.0 }
    );

    for f in [
        include_str!("testdata/sim-epp-config.yaml"),
        include_str!("testdata/sim-epp-kvcache-config.yaml"),
    ] {
        let p = load(f).unwrap();
        assert_eq!(p.filters, [EppFilter::Decode]);
        assert_eq!(p.scorers.len(), 1);
    }

    let p = load(include_str!("testdata/sim-epp-no-hit-lru.yaml")).unwrap();
    let kinds: Vec<(EppScorerKind, f64)> = p
        .scorers
        .iter()
        .map(|s| (s.kind.clone(), s.weight))
        .collect();
    assert_eq!(
        kinds,
        [
            (crate::scheduler::epp::PREFIX_DEFAULT, 2.0),
            (EppScorerKind::NoHitLru { lru_size: 2048 }, 1.0)
        ]
    );

    // P/D: the decode profile with the prefill stage behind prefix-based-pd-decider.
    let p = load(include_str!("testdata/pd-epp-config.yaml")).unwrap();
    let weights = |p: &EppProfile| -> Vec<(&str, f64)> {
        p.scorers
            .iter()
            .map(|s| (s.kind.as_str(), s.weight))
            .collect()
    };
    assert_eq!(
        (p.name.as_str(), p.filters.as_slice()),
        ("decode", &[EppFilter::Decode][..])
    );
    assert_eq!(
        weights(&p),
        [("prefix-cache-scorer", 2.0), ("queue-scorer", 1.0)]
    );
    let stage = p.prefill.as_ref().expect("a prefill stage");
    assert_eq!(
        stage.decider,
        crate::scheduler::epp::PdDecider::PrefixBased {
            non_cached_tokens: 16,
            prompt_tokens: 0
        }
    );
    assert_eq!(stage.profile.name, "prefill");
    assert_eq!(stage.profile.filters, [EppFilter::Prefill]);
    assert_eq!(
        weights(&stage.profile),
        [("prefix-cache-scorer", 2.0), ("queue-scorer", 1.0)]
    );
}

/// disagg-profile-handler's parameters and what it refuses by name: the encode stage,
/// prefill-first, a decider that is no decider, a missing decode profile.
#[test]
fn disagg_profile_handler_reads_llm_ds_parameters_and_names_what_it_refuses() {
    let doc = |handler: &str, profiles: &str| {
        format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: prefill-filter\n- type: decode-filter\n- type: always-disagg-pd-decider\n- {handler}\nschedulingProfiles:\n{profiles}"
        )
    };
    let two = "- name: decode\n  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]\n- name: prefill\n  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]\n";
    let c = Config::parse(&doc(
        "{type: disagg-profile-handler, parameters: {deciders: {prefill: always-disagg-pd-decider}}}",
        two,
    ))
    .unwrap();
    let p = c.scheduler.epp.unwrap();
    assert_eq!(
        p.prefill.as_ref().map(|s| s.decider),
        Some(crate::scheduler::epp::PdDecider::Always)
    );
    // The flat (deprecated) format, read with a warning.
    let c = Config::parse(&doc(
        "{type: disagg-profile-handler, parameters: {deciderPluginName: always-disagg-pd-decider}}",
        two,
    ))
    .unwrap();
    assert!(c.scheduler.epp.unwrap().prefill.is_some());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("flat parameter format is deprecated")),
        "{:?}",
        c.warnings
    );
    // No decider: decode only, warned.
    let c = Config::parse(&doc("{type: disagg-profile-handler}", two)).unwrap();
    assert!(c.scheduler.epp.unwrap().prefill.is_none());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("P/D disaggregation off"))
    );
    for (handler, profiles, want) in [
        (
            "{type: disagg-profile-handler, parameters: {deciders: {encode: always-disagg-pd-decider}}}",
            two,
            "deciders.encode \"always-disagg-pd-decider\": the encode stage (E/P/D) is not implemented",
        ),
        (
            "{type: disagg-profile-handler, parameters: {stageOrder: prefill-first}}",
            two,
            "stageOrder \"prefill-first\" is llm-d's but not implemented",
        ),
        (
            "{type: disagg-profile-handler, parameters: {deciders: {prefill: queue-scorer}}}",
            two,
            "deciders.prefill \"queue-scorer\" is a queue-scorer, not a decider",
        ),
        (
            "{type: disagg-profile-handler, parameters: {profiles: {decode: dec}}}",
            two,
            "the decode profile \"dec\" names no schedulingProfile",
        ),
        (
            "{type: disagg-profile-handler, parameters: {profile: {decode: dec}}}",
            two,
            "unknown field `profile`",
        ),
        (
            "{type: single-profile-handler}",
            two,
            "need a multi-profile handler (disagg-profile-handler)",
        ),
    ] {
        let e = Config::parse(&doc(handler, profiles))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{handler}: {e}");
    }
    let e = Config::parse("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: -1}}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nonCachedTokens cannot be negative, got -1"),
        "{e}"
    );
}

#[test]
fn no_plugins_is_llm_ds_default_profile_and_the_old_api_version_is_deprecated() {
    let c = Config::parse("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n").unwrap();
    assert_eq!(c.scheduler.epp, Some(EppProfile::llm_d_default()));
    assert!(c.scheduler.filters.is_empty() && c.scheduler.scorers.is_empty());
    // GIE's default, under the old apiVersion (docs/gateways.md): weights 1, max-score picker.
    let gie = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: prefix-cache-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: kv-cache-utilization-scorer\n  - pluginRef: prefix-cache-scorer\n";
    let c = Config::parse(gie).unwrap();
    let p = c.scheduler.epp.unwrap();
    assert!(p.scorers.iter().all(|s| s.weight == 1.0));
    assert!(
        c.warnings.iter().any(
            |w| w.starts_with("DEPRECATION: apiVersion inference.networking.x-k8s.io/v1alpha1")
        )
    );
    // No profile: one `default` profile of every filter, scorer and picker.
    let c = Config::parse("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: random-picker\n").unwrap();
    let p = c.scheduler.epp.unwrap();
    assert_eq!(
        (p.name.as_str(), p.picker, p.scorers.len()),
        ("default", EppPicker::Random, 1)
    );
}

/// Strict: an unknown field, plugin type or parameter, a bad weight, a dangling reference are
/// errors naming the field, the value and the line, listing what is accepted.
#[test]
fn strict_errors_name_the_field_and_the_line() {
    let head = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
    let err = |body: &str| {
        let e = Config::load_text_for_test(&format!("{head}{body}"));
        e.unwrap_err().to_string()
    };
    let e = err("plugns: []\n");
    assert!(
        e.starts_with("EndpointPickerConfig epp.yaml: unknown field `plugns`"),
        "{e}"
    );
    assert!(
        e.contains("line 3") && e.contains("expected one of") && e.contains("endpoints"),
        "{e}"
    );

    let e = err("plugins:\n- type: made-up-scorer\n");
    assert!(e.contains("plugins[made-up-scorer] (line 4): unknown plugin type \"made-up-scorer\"; supported: prefix-cache-scorer, queue-scorer"), "{e}");

    let e = err("plugins:\n- type: prefix-cache-scorer\n  parameters: {matchLenghtWeight: 0.5}\n");
    assert!(
        e.contains("unknown field `matchLenghtWeight`") && e.contains("prefix-cache-scorer"),
        "{e}"
    );

    let e = err("plugins:\n- type: prefix-cache-scorer\n  parameters: {matchLengthWeight: 1.5}\n");
    assert!(
        e.contains("matchLengthWeight must be between 0.0 and 1.0, got 1.5"),
        "{e}"
    );

    let e = err(
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
    );
    assert!(
        e.contains("weight of \"queue-scorer\" (line 8) must be a finite number >= 0, got -1"),
        "{e}"
    );

    let e = err(
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queu-scorer\n",
    );
    assert!(
        e.contains("pluginRef \"queu-scorer\" (line 8) names no plugin; plugins: queue-scorer"),
        "{e}"
    );

    let e = err("plugins:\n- type: queue-scorer\n  weight: 2\n");
    assert!(e.contains("unknown field `weight`"), "{e}");
}

#[test]
fn prefix_pickers_own_sections_are_read_beside_it() {
    let doc = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nendpoints:\n- {name: a, address: 127.0.0.1:1}\npicker: {seed: 7}\n";
    let c = Config::parse(doc).unwrap();
    assert_eq!(c.endpoints.len(), 1);
    assert_eq!(c.picker.seed, 7);
    assert!(
        c.scheduler
            .mode_summary()
            .contains("endpoint-picker-config (profile \"default\"")
    );
    let both = Config::parse(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\npicker: {affinity: {}}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(both.contains("remove picker.affinity"), "{both}");
    let bad = Config::parse(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\npicker: {sede: 7}\n",
    )
    .unwrap_err();
    assert!(matches!(bad.0[0], ConfigError::Picker(_)), "{bad}");
}

#[test]
fn label_selector_filter_reads_a_kubernetes_selector_strictly() {
    let doc = |params: &str| {
        format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: label-selector-filter\n  parameters: {params}\n- type: queue-scorer\n"
        )
    };
    let c = Config::parse(&doc(
        "{matchLabels: {app: vllm}, matchExpressions: [{key: zone, operator: In, values: [a]}]}",
    ))
    .unwrap();
    let p = c.scheduler.epp.unwrap();
    assert_eq!(
        p.filters,
        [EppFilter::Labels(LabelSelector {
            match_labels: vec![("app".into(), "vllm".into())],
            match_expressions: vec![LabelRequirement::In("zone".into(), vec!["a".into()])],
        })]
    );
    for (params, want) in [
        (
            "{matchExpressions: [{key: zone, operator: In}]}",
            "operator In needs values",
        ),
        (
            "{matchExpressions: [{key: zone, operator: Exists, values: [a]}]}",
            "operator Exists takes no values",
        ),
        (
            "{matchExpressions: [{key: zone, operator: Near, values: [a]}]}",
            "\"Near\" is not one of In, NotIn, Exists, DoesNotExist",
        ),
        ("{matchLabel: {app: vllm}}", "unknown field `matchLabel`"),
    ] {
        let e = Config::parse(&doc(params)).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("plugins[label-selector-filter] (line 4)"),
            "{params}: {e}"
        );
    }
}

/// token-load-scorer, session-affinity-scorer and prefix-cache-affinity-filter with llm-d's
/// defaults, their parameters, and what is refused by name (the latency predictor, request
/// attributes, another profile's pod).
#[test]
fn token_load_session_affinity_and_the_affinity_filter_read_llm_ds_parameters() {
    use crate::scheduler::epp::{PrefixAffinity, SessionStrategy};
    use std::time::Duration;
    // peers-late-2026.md section 5.2's drop-in example, as written there.
    let drop_in = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n  - type: prefix-cache-affinity-filter\n    parameters: {affinityThreshold: 0.8, maxTTFTPenaltyMs: 5000, ttftSource: prefillThroughput}\n  - type: prefix-cache-scorer\n    parameters: {matchLengthWeight: 0.0}\n  - type: token-load-scorer\n  - type: queue-scorer\n  - type: kv-cache-utilization-scorer\n  - type: max-score-picker\nschedulingProfiles:\n  - name: default\n    plugins:\n      - pluginRef: prefix-cache-affinity-filter\n      - pluginRef: prefix-cache-scorer\n        weight: 3\n      - pluginRef: token-load-scorer\n        weight: 2\n      - pluginRef: queue-scorer\n        weight: 2\n      - pluginRef: kv-cache-utilization-scorer\n        weight: 2\n";
    let p = Config::parse(drop_in).unwrap().scheduler.epp.unwrap();
    assert_eq!(
        p.filters,
        [EppFilter::PrefixAffinity(PrefixAffinity {
            affinity_threshold: 0.8,
            exploration_probability: 0.0,
            max_ttft_penalty_ms: 5000.0,
            peak_prefill_throughput: 15928.0,
        })]
    );
    assert_eq!(
        (p.scorers[1].kind.clone(), p.scorers[1].weight),
        (
            EppScorerKind::TokenLoad {
                queue_threshold_tokens: 4_194_304.0
            },
            2.0
        )
    );
    assert!(p.scores_prefix());

    let one = |plugin: &str| {
        let doc = format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- {plugin}\n"
        );
        Config::parse(&doc).map(|c| c.scheduler.epp.unwrap())
    };
    let kind = |plugin: &str| one(plugin).unwrap().scorers[0].kind.clone();
    assert_eq!(
        kind("{type: token-load-scorer, parameters: {queueThresholdTokens: 1000}}"),
        EppScorerKind::TokenLoad {
            queue_threshold_tokens: 1000.0
        }
    );
    // llm-d: a threshold <= 0 is the default.
    assert_eq!(
        kind("{type: token-load-scorer, parameters: {queueThresholdTokens: 0}}"),
        EppScorerKind::TokenLoad {
            queue_threshold_tokens: 4_194_304.0
        }
    );
    assert_eq!(
        kind("{type: session-affinity-scorer}"),
        EppScorerKind::SessionAffinity(SessionStrategy::EncodedEndpointHeader {
            header: "x-session-token".into()
        })
    );
    assert_eq!(
        kind(
            "{type: session-affinity-scorer, parameters: {encodedEndpointHeaderConfig: {header: X-Pin}}}"
        ),
        EppScorerKind::SessionAffinity(SessionStrategy::EncodedEndpointHeader {
            header: "x-pin".into()
        })
    );
    assert_eq!(
        kind(
            "{type: session-affinity-scorer, parameters: {strategy: session_id, sessionIdConfig: {sources: [{header: x-conv}], evictionTtlSeconds: 60}}}"
        ),
        EppScorerKind::SessionAffinity(SessionStrategy::SessionId {
            headers: vec!["x-conv".into()],
            ttl: Duration::from_secs(60),
            sweep: Duration::from_secs(10),
        })
    );
    let p = one("{type: prefix-cache-affinity-filter, parameters: {affinityThreshold: 0, maxTTFTPenaltyMs: 0}}")
        .unwrap();
    assert_eq!(
        p.filters,
        [EppFilter::PrefixAffinity(PrefixAffinity {
            affinity_threshold: 0.0,
            max_ttft_penalty_ms: 0.0,
            ..PrefixAffinity::default()
        })],
        "an explicit 0 is a 0, as llm-d decodes over its defaults"
    );

    for (plugin, want) in [
        (
            "{type: prefix-cache-affinity-filter, parameters: {ttftSource: latencyPredictor}}",
            "ttftSource \"latencyPredictor\" is llm-d's but not implemented",
        ),
        (
            "{type: prefix-cache-affinity-filter, parameters: {affinityThreshold: 1.5}}",
            "affinityThreshold must be <= 1.0, got 1.5",
        ),
        (
            "{type: prefix-cache-affinity-filter, parameters: {explorationProbability: 2}}",
            "explorationProbability must be in [0, 1], got 2",
        ),
        (
            "{type: prefix-cache-affinity-filter, parameters: {peakPrefillThroughput: 0}}",
            "peakPrefillThroughput must be > 0 when maxTTFTPenaltyMs is > 0",
        ),
        (
            "{type: prefix-cache-affinity-filter, parameters: {afinityThreshold: 0.9}}",
            "unknown field `afinityThreshold`",
        ),
        (
            "{type: session-affinity-scorer, parameters: {strategy: cookie}}",
            "strategy must be \"encoded_endpoint_header\" or \"session_id\", got \"cookie\"",
        ),
        (
            "{type: session-affinity-scorer, parameters: {strategy: session_id, sessionIdConfig: {sources: [{attribute: agent-identity}]}}}",
            "sources[0]: attribute \"agent-identity\"",
        ),
        (
            "{type: session-affinity-scorer, parameters: {profileName: prefill}}",
            "profileName \"prefill\"",
        ),
        (
            "{type: session-affinity-scorer, parameters: {strategy: session_id, sessionIdConfig: {evictionTtlSeconds: -1}}}",
            "evictionTtlSeconds must be > 0, got -1",
        ),
        (
            "{type: token-load-scorer, parameters: {queueThreshold: 5}}",
            "unknown field `queueThreshold`",
        ),
    ] {
        let e = one(plugin).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("(line 4)"), "{plugin}: {e}");
    }
}
