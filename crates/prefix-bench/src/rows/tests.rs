//! The suite's rows: their order, the config each picker row runs with, which `--routers`
//! selects.

use super::*;

#[test]
fn the_engine_events_rows_follow_the_shipped_row_and_read_events() {
    let rows = RowConfig {
        path: "config.yaml".into(),
        scheduler: PREFIX_ONLY.to_string(),
        affinity: Some(serde_json::json!({"tentative": true})),
    };
    let routers = routers_from(PREFIX_ONLY.to_string(), &rows, false, true);
    let names: Vec<&str> = routers.iter().map(|(n, _)| n.as_str()).collect();
    let shipped = names.iter().position(|n| *n == report::SHIPPED).unwrap();
    assert_eq!(names[shipped + 1], report::SHIPPED_ENGINE_EVENTS);
    let (_, setup) = &routers[shipped + 1];
    assert!(setup.reads_engine_events());
    let (
        Setup::Envoy {
            affinity,
            scheduler,
            events: Some(events),
            ..
        },
        Setup::Envoy {
            affinity: a0,
            scheduler: s0,
            ..
        },
    ) = (setup, &routers[shipped].1)
    else {
        panic!("not picker rows");
    };
    // The shipped row's config, plus the events.
    assert_eq!((affinity, scheduler), (a0, s0));
    assert_eq!(
        affinity.as_ref(),
        Some(&serde_json::json!({"tentative": true}))
    );
    assert_eq!(events, &EngineEvents::engine_tokenize());
    assert_eq!(
        names[shipped + 2],
        format!("{}, file tokenizer", report::SHIPPED_ENGINE_EVENTS)
    );
    assert_eq!(
        routers
            .iter()
            .filter(|(_, s)| s.reads_engine_events())
            .count(),
        engine_event_rows().len() + EventFault::ALL.len()
    );
}

fn scheduler_of(routers: &[(String, Setup)], name: &str) -> Option<String> {
    routers.iter().find_map(|(n, s)| match s {
        Setup::Envoy { scheduler, .. } if n == name => scheduler.clone(),
        _ => None,
    })
}

#[test]
fn a_given_config_drives_the_shipped_rows_and_only_them() {
    let mine = RowConfig {
        path: "mine.yaml".into(),
        scheduler: "scheduler: {mine: true}\n".into(),
        affinity: None,
    };
    let routers = routers_from("scheduler: {kthena: true}\n".into(), &mine, true, true);
    assert_eq!(
        scheduler_of(&routers, report::SHIPPED).as_deref(),
        Some("scheduler: {mine: true}\n")
    );
    assert_eq!(
        scheduler_of(&routers, report::SHIPPED_ENGINE_EVENTS).as_deref(),
        Some("scheduler: {mine: true}\n")
    );
    assert_eq!(
        scheduler_of(&routers, "prefix-picker: Kthena default plugins").as_deref(),
        Some("scheduler: {kthena: true}\n")
    );
    // No affinity mapping: nothing for the ablation to switch off.
    assert!(!routers.iter().any(|(n, _)| n.starts_with(report::ABLATION)));
    // The shipped config without an affinity mapping has no shipped row at all.
    let plain = routers_from("scheduler: {}\n".into(), &mine, false, true);
    assert!(!plain.iter().any(|(n, _)| n.starts_with(report::SHIPPED)));
}

fn shipped_rows_of(affinity: serde_json::Value) -> Vec<(String, Setup)> {
    let rows = RowConfig {
        path: "config.yaml".into(),
        scheduler: PREFIX_ONLY.to_string(),
        affinity: Some(affinity),
    };
    routers_from(PREFIX_ONLY.to_string(), &rows, false, false)
}

#[test]
fn the_fault_rows_are_the_engine_events_row_with_its_stream_wrong() {
    let routers = shipped_rows_of(serde_json::json!({"tentative": true}));
    let names: Vec<&str> = routers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        fault_row_name(EventFault::TopicMismatch),
        "prefix-picker: shipped config + engine events (fault: topic mismatch)"
    );
    assert_eq!(
        fault_row_name(EventFault::SilentPublisher),
        "prefix-picker: shipped config + engine events (fault: silent publisher)"
    );
    let events_row = names
        .iter()
        .position(|n| *n == report::SHIPPED_ENGINE_EVENTS)
        .unwrap();
    let Setup::Envoy {
        scheduler: s0,
        affinity: a0,
        ..
    } = &routers[events_row].1
    else {
        panic!("not a picker row");
    };
    for fault in EventFault::ALL {
        let at = names
            .iter()
            .position(|n| *n == fault_row_name(fault))
            .unwrap();
        assert!(at > events_row, "after the engine-events rows");
        assert!(is_fault_row(names[at]));
        let Setup::Envoy {
            file,
            scheduler,
            affinity,
            events: Some(events),
            ..
        } = &routers[at].1
        else {
            panic!("{fault:?}: not an engine-events row");
        };
        // The shipped engine-events row (engine tokenizer, the same routing), plus the fault.
        assert_eq!(file, "envoy.yaml");
        assert_eq!((scheduler, affinity), (s0, a0));
        assert_eq!(events.tokenizer, EngineEvents::engine_tokenize().tokenizer);
        assert_eq!(events.fault, Some(fault));
    }
    for name in [
        report::SHIPPED,
        report::SHIPPED_ENGINE_EVENTS,
        "prefix-picker: shipped config + engine events, file tokenizer",
    ] {
        assert!(!is_fault_row(name), "{name}");
    }
}

#[test]
fn fault_rows_run_only_when_routers_names_them() {
    let only =
        |entries: &[&str]| -> Vec<String> { entries.iter().map(|e| e.to_string()).collect() };
    let topic = fault_row_name(EventFault::TopicMismatch);
    let silent = fault_row_name(EventFault::SilentPublisher);
    let picked = |entries: &[&str]| {
        let only = only(entries);
        (
            selected(report::SHIPPED_ENGINE_EVENTS, &only),
            selected(&topic, &only),
            selected(&silent, &only),
        )
    };
    // Not in a default run, nor selected by a name every engine-events row contains.
    assert_eq!(picked(&[]), (true, false, false));
    assert_eq!(picked(&["shipped config"]), (true, false, false));
    assert_eq!(picked(&["engine events"]), (true, false, false));
    // Named: all faults, or one.
    assert_eq!(picked(&["fault"]), (false, true, true));
    assert_eq!(picked(&["topic mismatch"]), (false, true, false));
    assert_eq!(
        picked(&["shipped config", "silent publisher"]),
        (true, false, true)
    );
    assert_eq!(picked(&["engine events (fault"]), (false, true, true));
    // The other rows as before; the ablation rows whenever they exist.
    assert!(selected(report::ROUND_ROBIN, &only(&[])));
    assert!(selected(report::ROUND_ROBIN, &only(&["round-robin"])));
    assert!(!selected(report::ROUND_ROBIN, &only(&["fault"])));
    // An entry naming the faults selects no other row, though "fault" is in "default".
    let kthena = "prefix-picker: Kthena default plugins";
    assert!(!selected(kthena, &only(&["round-robin", "fault"])));
    assert!(selected(kthena, &only(&["default"])));
    assert!(selected(kthena, &only(&["prefix-picker"])));
    assert!(selected("ablation: loadGate: false", &only(&["fault"])));
}

/// Sims as a publishing row's static endpoints.
fn sim_pods() -> Vec<picker_config::Pod> {
    (0..2)
        .map(|i| picker_config::Pod {
            name: format!("sim-{i}"),
            addr: format!("127.0.0.1:{}", 8000 + i).parse().unwrap(),
            kv_events: Some(testkit::KvEventPorts {
                publish: 5557 + 2 * i,
                replay: 5558 + 2 * i,
            }),
        })
        .collect()
}

#[tokio::test]
async fn the_fault_rows_picker_configs_leave_the_topic_empty_or_name_silent_sockets() {
    let affinity = serde_json::json!({"tentative": true});
    let events = |fault| EngineEvents::engine_tokenize().with_fault(fault);
    let parse = |config: &str| -> serde_yaml_ng::Value { serde_yaml_ng::from_str(config).unwrap() };
    let pods = sim_pods();
    // Topic mismatch: the picker reads the sims' own sockets, `picker.kvEvents.topic` unset
    // (its default, ""), while the sims publish on "kv-events".
    let topic = parse(
        &picker_config::render(
            PREFIX_ONLY,
            &pods,
            Some(&affinity),
            Some(&events(EventFault::TopicMismatch)),
        )
        .unwrap(),
    );
    assert!(topic["picker"].get("kvEvents").is_none(), "{topic:?}");
    assert_eq!(
        topic["picker"]["tokenizer"]["source"].as_str(),
        Some("engine")
    );
    for (e, pod) in topic["endpoints"].as_sequence().unwrap().iter().zip(&pods) {
        let ports = pod.kv_events.unwrap();
        assert_eq!(
            e["kvEventsEndpoint"].as_str(),
            Some(ports.endpoint().as_str())
        );
        assert_eq!(
            e["kvEventsReplayEndpoint"].as_str(),
            Some(ports.replay_endpoint().as_str())
        );
    }
    assert_eq!(EventFault::TopicMismatch.engine_topic(), "kv-events");
    // Silent publisher: every pod's sockets are a silent publisher's, its address the sim's.
    let (silent_pods, publishers) = crate::event_faults::silent_pods(&pods).await.unwrap();
    let silent = parse(
        &picker_config::render(
            PREFIX_ONLY,
            &silent_pods,
            Some(&affinity),
            Some(&events(EventFault::SilentPublisher)),
        )
        .unwrap(),
    );
    assert!(silent["picker"].get("kvEvents").is_none());
    let endpoints = silent["endpoints"].as_sequence().unwrap();
    for ((e, pod), publisher) in endpoints.iter().zip(&pods).zip(&publishers) {
        assert_eq!(e["address"].as_str(), Some(pod.addr.to_string().as_str()));
        assert_eq!(
            e["kvEventsEndpoint"].as_str(),
            Some(publisher.ports().endpoint().as_str())
        );
        assert_eq!(
            e["kvEventsReplayEndpoint"].as_str(),
            Some(publisher.ports().replay_endpoint().as_str())
        );
        assert_ne!(pod.kv_events, Some(publisher.ports()));
    }
    assert_eq!(EventFault::SilentPublisher.engine_topic(), "");
}

#[test]
fn a_baseline_binary_doubles_the_shipped_rows_only() {
    let rows = vec![
        (
            report::ROUND_ROBIN.to_string(),
            Setup::envoy("envoy-round-robin.yaml", None),
        ),
        (
            report::SHIPPED.to_string(),
            picker_row("scheduler: {}\n", None, None),
        ),
        (
            format!("{} (fault: x)", report::SHIPPED_ENGINE_EVENTS),
            picker_row("scheduler: {}\n", None, None),
        ),
    ];
    let bin = std::path::Path::new("/old/prefix-picker");
    let out = with_baseline(rows, bin);
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            report::ROUND_ROBIN.to_string(),
            report::SHIPPED.to_string(),
            format!("{}{}", report::BASELINE, report::SHIPPED),
            format!("{} (fault: x)", report::SHIPPED_ENGINE_EVENTS),
            format!(
                "{}{} (fault: x)",
                report::BASELINE,
                report::SHIPPED_ENGINE_EVENTS
            ),
        ]
    );
    for (name, setup) in &out {
        let Setup::Envoy { picker_bin, .. } = setup else {
            panic!("{name}");
        };
        assert_eq!(
            picker_bin.as_deref(),
            name.starts_with(report::BASELINE).then_some(bin),
            "{name}"
        );
    }
}

#[test]
fn the_endpoint_picker_row_runs_llm_ds_default_profile_as_the_picker_parses_it() {
    let rows = RowConfig {
        path: "config.yaml".into(),
        scheduler: PREFIX_ONLY.to_string(),
        affinity: Some(serde_json::json!({"tentative": true})),
    };
    let routers = routers_from("scheduler: {kthena: true}\n".into(), &rows, false, false);
    let names: Vec<&str> = routers.iter().map(|(n, _)| n.as_str()).collect();
    let at = names
        .iter()
        .position(|n| *n == ENDPOINT_PICKER_ROW)
        .unwrap();
    // Beside Kthena's defaults and before the shipped config.
    assert_eq!(names[at - 1], "prefix-picker: Kthena default plugins");
    assert_eq!(names[at + 1], report::SHIPPED);
    let Setup::Envoy {
        file,
        scheduler: Some(scheduler),
        affinity: None,
        events: None,
        picker_bin: None,
    } = &routers[at].1
    else {
        panic!("not a plain picker row: {:?}", routers[at].1);
    };
    assert_eq!(file, "envoy.yaml");
    // The config the suite writes for it, as `prefix-picker serve --config` parses it.
    let pods = sim_pods();
    let text = picker_config::render(scheduler, &pods, None, None).unwrap();
    let config = prefix_picker::config::Config::parse(&text).unwrap();
    assert_eq!(
        config.scheduler.epp,
        Some(prefix_picker::scheduler::epp::EppProfile::llm_d_default())
    );
    assert!(config.scheduler.filters.is_empty() && config.scheduler.scorers.is_empty());
    let endpoints: Vec<_> = config
        .endpoints
        .iter()
        .map(|e| (e.name.as_str(), e.address))
        .collect();
    let expected: Vec<_> = pods.iter().map(|p| (p.name.as_str(), p.addr)).collect();
    assert_eq!(endpoints, expected);
    assert_eq!(config.picker.scrape_interval_seconds, 0.1);
    assert!(config.picker.affinity.is_none());
    // Selected by its own name only.
    let only = |e: &str| vec![e.to_string()];
    assert!(selected(ENDPOINT_PICKER_ROW, &only("EndpointPickerConfig")));
    assert!(!selected(ENDPOINT_PICKER_ROW, &only("Kthena default")));
    assert!(!selected(ENDPOINT_PICKER_ROW, &only("shipped config")));
}

#[test]
fn an_entry_with_an_equals_sign_selects_the_row_of_exactly_that_name() {
    let only = |e: &str| vec![e.to_string()];
    let events = format!("={}", report::SHIPPED_ENGINE_EVENTS);
    let file = format!("{}, file tokenizer", report::SHIPPED_ENGINE_EVENTS);
    assert!(selected(report::SHIPPED_ENGINE_EVENTS, &only(&events)));
    assert!(!selected(&file, &only(&events)));
    assert!(!selected(report::SHIPPED, &only(&events)));
    // As a substring it would have selected both.
    assert!(selected(&file, &only(report::SHIPPED_ENGINE_EVENTS)));
    let topic = fault_row_name(EventFault::TopicMismatch);
    assert!(selected(&topic, &only(&format!("={topic}"))));
    assert!(!selected(&topic, &only(&events)));
}
