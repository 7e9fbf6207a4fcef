//! `picker.kvEventsBindPort`: the shared KV-event socket as the chart opens it. Set, it binds
//! `tcp://*:<port>` in the picker's config (beside the other `kvEvents` keys), names the
//! container port and a Service port (TCP) the engines connect to, and the rendering passes
//! schema validation and `prefix-picker validate`; unset (the default), none of it is rendered.
//! The values it refuses are in deploy_check.py's BAD_VALUES.

use std::process::Command;

use serde_yaml_ng::Value;

use super::{deploy_check, documents, one, show};

fn render(values: &serde_json::Value) -> String {
    let out = deploy_check(&["render-values", &values.to_string()]);
    assert!(out.status.success(), "render failed:\n{}", show(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The picker section of the rendered config.
fn picker_config(docs: &[Value]) -> Value {
    let map = one(docs, "ConfigMap", Some("prefix-picker-config"));
    let config: Value =
        serde_yaml_ng::from_str(map["data"]["routerConfiguration"].as_str().unwrap()).unwrap();
    config["picker"].clone()
}

/// The ports of the picker's container and of the picker's Service.
fn ports(docs: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let deployment = one(docs, "Deployment", None);
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "prefix-picker")
        .unwrap();
    let service = one(docs, "Service", Some("prefix-picker"));
    (
        container["ports"].as_sequence().unwrap().clone(),
        service["spec"]["ports"].as_sequence().unwrap().clone(),
    )
}

fn named<'a>(ports: &'a [Value], name: &str) -> Option<&'a Value> {
    ports.iter().find(|p| p["name"] == name)
}

#[test]
fn the_shared_socket_port_binds_the_config_and_opens_container_and_service_ports() {
    for mode in ["sidecar", "standalone"] {
        let text = render(&serde_json::json!({
            "mode": mode,
            "picker": {
                "kvEventsBindPort": 5557,
                "settings": {"tokenizer": {"source": "engine"}, "kvEvents": {"maxBlocksPerPod": 1000}},
            },
        }));
        let docs = documents(&text);
        let picker = picker_config(&docs);
        assert_eq!(picker["kvEvents"]["bind"], "tcp://*:5557", "{mode}");
        assert_eq!(
            picker["kvEvents"]["maxBlocksPerPod"].as_u64(),
            Some(1000),
            "{mode}: the other kvEvents keys are kept"
        );
        let (container, service) = ports(&docs);
        let port = named(&container, "tcp-kv-events")
            .unwrap_or_else(|| panic!("{mode}: no container port tcp-kv-events: {container:?}"));
        assert_eq!(port["containerPort"].as_u64(), Some(5557), "{mode}");
        assert_eq!(port["protocol"], "TCP", "{mode}");
        let port = named(&service, "tcp-kv-events")
            .unwrap_or_else(|| panic!("{mode}: no Service port tcp-kv-events: {service:?}"));
        assert_eq!(port["port"].as_u64(), Some(5557), "{mode}");
        assert_eq!(port["targetPort"], "tcp-kv-events", "{mode}");
        assert_eq!(port["protocol"], "TCP", "{mode}");

        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("kv-events.yaml");
        std::fs::write(&manifests, &text).unwrap();
        let out = deploy_check(&["validate", manifests.to_str().unwrap()]);
        assert!(out.status.success(), "{mode}: {}", show(&out));
        let map = one(&docs, "ConfigMap", Some("prefix-picker-config"));
        let config = dir.path().join("routerConfiguration");
        std::fs::write(
            &config,
            map["data"]["routerConfiguration"].as_str().unwrap(),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
            .args(["validate", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(out.status.success(), "{mode}: {}", show(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("warning"),
            "{mode}: {}",
            show(&out)
        );
    }
}

#[test]
fn without_the_port_nothing_of_the_shared_socket_is_rendered() {
    for values in [
        serde_json::json!({}),
        serde_json::json!({"mode": "standalone", "picker": {"kvEventsBindPort": 0}}),
    ] {
        let docs = documents(&render(&values));
        assert!(picker_config(&docs).get("kvEvents").is_none(), "{values}");
        let (container, service) = ports(&docs);
        assert!(named(&container, "tcp-kv-events").is_none(), "{values}");
        assert!(named(&service, "tcp-kv-events").is_none(), "{values}");
    }
}
