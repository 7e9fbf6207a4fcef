use super::*;

#[test]
fn flow_ids_default_trim_and_cut() {
    assert_eq!(flow_id(None), DEFAULT_FLOW);
    assert_eq!(flow_id(Some("  ")), DEFAULT_FLOW);
    assert_eq!(flow_id(Some(" tenant-a ")), "tenant-a");
    let long = "é".repeat(100);
    let cut = flow_id(Some(&long));
    assert!(cut.len() <= MAX_FLOW_ID_BYTES && cut.len() >= MAX_FLOW_ID_BYTES - 1);
}

#[test]
fn enabled_follows_the_mode_unless_set() {
    let mut c = FlowControlConfig::default();
    c.resolve(true);
    assert!(c.active);
    c.resolve(false);
    assert!(!c.active);
    c.enabled = Some(false);
    c.resolve(true);
    assert!(!c.active);
    c.enabled = Some(true);
    c.resolve(false);
    assert!(c.active);
}

#[test]
fn priorities_come_from_the_objective_map() {
    let c: FlowControlConfig =
        serde_yaml_ng::from_str("{defaultPriority: 1, priorities: {chat: 10, batch: -2}}").unwrap();
    let watched = ObjectivePriorities::default();
    assert_eq!(c.priority(Some("chat"), &watched), 10);
    assert_eq!(c.priority(Some("batch"), &watched), -2);
    assert_eq!(c.priority(Some("other"), &watched), 1);
    assert_eq!(c.priority(None, &watched), 1);
    // A watched InferenceObjective comes first.
    watched.replace([("chat".to_string(), 3), ("other".to_string(), 7)].into());
    assert_eq!(c.priority(Some("chat"), &watched), 3);
    assert_eq!(c.priority(Some("other"), &watched), 7);
    assert_eq!(c.priority(Some("batch"), &watched), -2);
}

#[test]
fn invalid_numbers_name_their_key() {
    let c = FlowControlConfig {
        max_requests: 0,
        request_ttl_seconds: 0.0,
        output_weight: -1.0,
        max_in_flight_per_pod: Some(0),
        ..FlowControlConfig::default()
    };
    let errors = c.validate().join("\n");
    for key in [
        "maxRequests",
        "requestTtlSeconds",
        "outputWeight",
        "maxInFlightPerPod",
    ] {
        assert!(errors.contains(key), "{key}: {errors}");
    }
    assert!(FlowControlConfig::default().validate().is_empty());
}
