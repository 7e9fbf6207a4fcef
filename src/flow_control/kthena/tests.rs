use std::collections::HashMap;

use base64::Engine as _;

use super::*;

/// Reads from `vars` only (never the process environment).
fn read(
    vars: &[(&str, &str)],
    jwt_user: bool,
) -> Result<Option<KthenaFairness>, KthenaFairnessError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    from_env(&|name| map.get(name).cloned(), jwt_user)
}

fn on(vars: &[(&str, &str)]) -> KthenaFairness {
    let mut all = vec![(ENABLE, "true")];
    all.extend_from_slice(vars);
    read(&all, false).unwrap().expect("fairness on")
}

/// A JWT whose payload is `claims` (unsigned: the picker decodes, the gateway verifies).
fn jwt(claims: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!("{}.{}.c2lnbmF0dXJl", b64(r#"{"alg":"RS256"}"#), b64(claims))
}

#[test]
fn unset_or_false_reads_nothing_else() {
    assert_eq!(read(&[], false), Ok(None));
    for off in ["false", "0", "f", "F", "FALSE", "False"] {
        // An invalid FAIRNESS_* value is not even read while fairness is off.
        assert_eq!(
            read(&[(ENABLE, off), (WINDOW, "forever")], false),
            Ok(None),
            "{off}"
        );
    }
    for yes in ["true", "1", "t", "T", "TRUE", "True"] {
        assert!(read(&[(ENABLE, yes)], false).unwrap().is_some(), "{yes}");
    }
}

#[test]
fn kthenas_defaults_when_only_enabled() {
    let f = on(&[]);
    assert_eq!(f.ttl_seconds, 60.0);
    assert!((f.half_life_seconds - 300.0 * std::f64::consts::LN_2).abs() < 1e-9);
    assert_eq!(f.output_weight, 2.0);
    assert_eq!(
        f.flows,
        KthenaFlows {
            jwt_user: false,
            input_weight: 1.0,
            request_weight: 0.0,
            max_in_flight_per_model: None,
        }
    );
    // What does not map exactly is said, naming the variable.
    let warnings = f.warnings.join("\n");
    for var in [WINDOW, QUEUE_TIMEOUT, MAX_QPS] {
        assert!(warnings.contains(var), "{var}: {warnings}");
    }
}

#[test]
fn the_helm_charts_settings() {
    // kthenaRouter.fairness: windowSize 1h, inputTokenWeight 1.0, outputTokenWeight 2.0,
    // maxConcurrent 16.
    let f = on(&[
        (WINDOW, "1h"),
        (INPUT_WEIGHT, "1.0"),
        (OUTPUT_WEIGHT, "2.0"),
        (MAX_CONCURRENT, "16"),
    ]);
    assert!((f.half_life_seconds - 3600.0 * std::f64::consts::LN_2).abs() < 1e-9);
    assert_eq!(f.flows.max_in_flight_per_model, Some(16));
    // A per-model bound: no rate to warn about.
    assert!(
        !f.warnings.iter().any(|w| w.contains(MAX_QPS)),
        "{:?}",
        f.warnings
    );
}

#[test]
fn the_weights_make_the_charge() {
    let f = on(&[
        (TOKEN_WEIGHT, "2"),
        (INPUT_WEIGHT, "0.5"),
        (OUTPUT_WEIGHT, "3"),
        (REQUEST_WEIGHT, "10"),
        (QUEUE_TIMEOUT, "1m30s"),
    ]);
    assert_eq!(f.ttl_seconds, 90.0);
    let mut fc = FlowControlConfig {
        expected_output_tokens: 100,
        ..FlowControlConfig::default()
    };
    let warnings = f.apply(&mut fc);
    assert!(
        warnings.iter().any(|w| w.starts_with(WINDOW)),
        "{warnings:?}"
    );
    // 2 x (0.5 x 40 + 3 x 100) + 10.
    assert_eq!(fc.charge(40.0), 650.0);
    assert_eq!(fc.request_ttl_seconds, 90.0);
    // Without Kthena's settings: prompt tokens + outputWeight x expected output.
    let plain = FlowControlConfig {
        expected_output_tokens: 100,
        ..FlowControlConfig::default()
    };
    assert_eq!(plain.charge(40.0), 240.0);
}

#[test]
fn no_token_weight_and_no_request_weight_charge_nothing() {
    // Kthena's priority is then 0 for everyone: arrival order (every flow stays at 0 here).
    let f = on(&[(TOKEN_WEIGHT, "0")]);
    let mut fc = FlowControlConfig::default();
    f.apply(&mut fc);
    assert_eq!(fc.charge(1000.0), 0.0);
}

#[test]
fn an_invalid_value_names_the_variable_and_the_value() {
    let cases = [
        (ENABLE, "yes"),
        (WINDOW, "5"),
        (WINDOW, "30s"),
        (WINDOW, "2h"),
        (WINDOW, "0"),
        (INPUT_WEIGHT, "-1"),
        (OUTPUT_WEIGHT, "NaN"),
        (TOKEN_WEIGHT, "inf"),
        (REQUEST_WEIGHT, "lots"),
        (QUEUE_TIMEOUT, "60"),
        (QUEUE_TIMEOUT, "0s"),
        (QUEUE_TIMEOUT, "-1s"),
        (MAX_CONCURRENT, "-1"),
        (MAX_CONCURRENT, "1.5"),
        (MAX_QPS, "0"),
        (REFRESH_RETRIES, "-2"),
        (REBUILD_THRESHOLD, "0"),
    ];
    for (var, value) in cases {
        let mut vars = vec![(ENABLE, "true"), (var, value)];
        if var == ENABLE {
            vars.remove(0);
        }
        let e = read(&vars, false).unwrap_err();
        assert!(
            matches!(&e, KthenaFairnessError::Invalid { var: v, value: got, .. } if *v == var && got == value),
            "{var}={value}: {e:?}"
        );
        let text = e.to_string();
        assert!(text.contains(var) && text.contains(value), "{text}");
    }
}

#[test]
fn fairness_and_session_boost_exclude_each_other() {
    assert_eq!(
        read(&[(ENABLE, "true"), (SESSION_BOOST, "true")], false),
        Err(KthenaFairnessError::BothQueues)
    );
    // Kthena reads an invalid session-boost switch as false.
    assert!(
        read(&[(ENABLE, "true"), (SESSION_BOOST, "maybe")], false)
            .unwrap()
            .is_some()
    );
}

#[test]
fn variables_not_read_are_warned_about() {
    let f = on(&[
        (REFRESH_RETRIES, "2"),
        (REBUILD_THRESHOLD, "64"),
        (MODE, "vtc"),
    ]);
    let warnings = f.warnings.join("\n");
    for said in [REFRESH_RETRIES, REBUILD_THRESHOLD, "FAIRNESS_MODE=\"vtc\""] {
        assert!(warnings.contains(said), "{said}: {warnings}");
    }
    let window = on(&[(MODE, "window")]);
    assert!(!window.warnings.join("\n").contains(MODE));
}

#[test]
fn apply_turns_the_queue_on_unless_the_file_turns_it_off() {
    let mut fc = FlowControlConfig::default();
    on(&[]).apply(&mut fc);
    fc.resolve(true);
    assert!(fc.active);
    assert!(fc.kthena.is_some());
    let mut off = FlowControlConfig {
        enabled: Some(false),
        ..FlowControlConfig::default()
    };
    let warnings = on(&[]).apply(&mut off).join("\n");
    assert!(warnings.contains("enabled: false"), "{warnings}");
}

#[test]
fn the_jwt_subject_as_kthena_extracts_the_token() {
    let token = jwt(r#"{"sub":"alice","aud":"kthena"}"#);
    assert_eq!(
        jwt_subject(&format!("Bearer {token}")).as_deref(),
        Some("alice")
    );
    assert_eq!(
        jwt_subject(&format!("bearer   {token}")).as_deref(),
        Some("alice")
    );
    // Padding some encoders add is tolerated.
    let padded = {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE.encode(s);
        format!("{}.{}.sig", b64("{}"), b64(r#"{"sub":"bob"}"#))
    };
    assert_eq!(
        jwt_subject(&format!("Bearer {padded}")).as_deref(),
        Some("bob")
    );
    for bad in [
        token.clone(),
        format!("Basic {token}"),
        format!("Bearer {token} extra"),
        "Bearer not-a-jwt".to_string(),
        "Bearer a.!!!.c".to_string(),
        format!("Bearer {}", jwt(r#"{"name":"no subject"}"#)),
        format!("Bearer {}", jwt(r#"{"sub":42}"#)),
        String::new(),
    ] {
        assert_eq!(jwt_subject(&bad), None, "{bad:?}");
    }
}

#[test]
fn the_flow_is_the_user_per_model() {
    let token = format!("Bearer {}", jwt(r#"{"sub":"alice"}"#));
    let flows = KthenaFlows {
        jwt_user: true,
        input_weight: 1.0,
        request_weight: 0.0,
        max_in_flight_per_model: None,
    };
    assert_eq!(flows.flow(Some(&token), Some("tenant"), "m"), "alice@m");
    assert_eq!(flows.flow(Some(&token), None, "other"), "alice@other");
    // No user: the fairness header, else the default flow (Kthena's anonymous requests).
    assert_eq!(flows.flow(None, Some("tenant"), "m"), "tenant@m");
    assert_eq!(flows.flow(Some("Bearer x"), None, "m"), "default@m");
    let empty_sub = format!("Bearer {}", jwt(r#"{"sub":" "}"#));
    assert_eq!(
        flows.flow(Some(&empty_sub), Some("tenant"), "m"),
        "tenant@m"
    );
    // Without auth.jwksUri Kthena knows no user: the token is not read.
    let anonymous = KthenaFlows {
        jwt_user: false,
        ..flows
    };
    assert_eq!(anonymous.flow(Some(&token), None, "m"), "default@m");
}

#[test]
fn switches_this_mode_does_not_read_are_warned_about() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let fairness = env(&[(ENABLE, "true")]);
    assert!(unread_switches(&fairness, true).is_empty());
    let w = unread_switches(&fairness, false).join("\n");
    assert!(w.contains(ENABLE), "{w}");
    let boost = env(&[(SESSION_BOOST, "1")]);
    assert!(
        unread_switches(&boost, true)
            .join("\n")
            .contains(SESSION_BOOST)
    );
    assert!(unread_switches(&env(&[]), true).is_empty());
    assert!(unread_switches(&env(&[(ENABLE, "nonsense")]), false).is_empty());
}
