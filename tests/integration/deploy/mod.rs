//! deploy/ and the gateway examples, checked without a cluster: the Helm chart rendered and linted
//! by Helm's own Go SDK (PyPI `helm-python-sdk`), every manifest validated against the Kubernetes
//! schemas and the CRD models (`deploy/tools/deploy_check.py`, tools in `.venv-deploy`, installed
//! by `scripts/test`), the committed plain manifests compared with the chart, every Envoy config
//! they carry validated by Envoy itself, the picker config they carry validated by the binary,
//! the Grafana dashboard and the alert rules checked against real expositions and by promtool
//! (`monitoring`), the CI workflows checked against the GitHub-workflow schema, the shared
//! KV-event socket's config key and ports (`kv_events_socket`), and the container images run as
//! the chart runs them (`image`).

mod debug_rbac;
mod image;
mod kv_events_socket;
mod monitoring;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::harness::*;
use serde_yaml_ng::Value;

/// The Python of `.venv-deploy` (`$DEPLOY_PYTHON` first). Missing tools are a failure, never a skip.
fn deploy_python() -> PathBuf {
    if let Ok(p) = std::env::var("DEPLOY_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = root().join(".venv-deploy/bin/python");
    assert!(
        venv.exists(),
        "{} missing: run scripts/test (it installs deploy/tools/requirements.txt)",
        venv.display()
    );
    venv
}

pub(crate) fn deploy_check(args: &[&str]) -> Output {
    Command::new(deploy_python())
        .arg(root().join("deploy/tools/deploy_check.py"))
        .args(args)
        .output()
        .unwrap()
}

pub(crate) fn show(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Renders every scenario of deploy_check.py into a temp dir: `(dir, [(scenario, yaml text)])`.
fn render_chart() -> (tempfile::TempDir, Vec<(String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let out = deploy_check(&["render", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "render failed:\n{}", show(&out));
    let mut rendered = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        rendered.push((name, std::fs::read_to_string(&path).unwrap()));
    }
    rendered.sort();
    assert_eq!(
        rendered.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [
            "full",
            "gateway-envoy-gateway",
            "gateway-gke",
            "gateway-istio",
            "gateway-kgateway",
            "sidecar",
            "standalone",
            "standalone-gie"
        ]
    );
    (dir, rendered)
}

fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// `data[key]` of every ConfigMap that has it.
fn config_map_values(docs: &[Value], key: &str) -> Vec<String> {
    docs.iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| d["data"][key].as_str().map(str::to_string))
        .collect()
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {dir}");
    files
}

fn envoy_validate(config: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    if let Err(output) = envoy_validate_file(&path) {
        panic!("{what}: envoy --mode validate failed:\n{output}\n{config}");
    }
}

// ---------------------------------------------------------------- chart and manifests

/// One validator run (its CRD models take seconds to import) over every manifest we ship or
/// render, which must pass, and a set of broken manifests, each of which must be rejected.
#[test]
fn every_manifest_passes_schema_validation_and_broken_ones_fail() {
    let (dir, _) = render_chart();
    let mut good: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    good.extend(yaml_files("deploy/manifests"));
    good.extend(yaml_files("deploy/kind"));
    good.extend(yaml_files("envoy/istio"));
    good.extend(yaml_files("envoy/envoy-gateway"));
    let bad_dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "probe port misspelled",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n    image: i\n    readinessProbe: {httpGet: {path: /readyz, prot: 9090}}\n",
        ),
        (
            "unknown Deployment field",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 1\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec: {containers: [{name: c, image: i}]}\n",
        ),
        (
            "ServiceMonitor field misspelled",
            "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  endpoints: [{port: metrics, intervall: 15s}]\n",
        ),
        (
            "PrometheusRule duration not a Prometheus duration",
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec:\n  groups: [{name: g, rules: [{alert: A, expr: up == 0, for: 5 minutes}]}]\n",
        ),
        (
            "PrometheusRule field misspelled",
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec:\n  groups: [{name: g, rules: [{alert: A, expr: up == 0, annotation: {summary: s}}]}]\n",
        ),
        (
            "EnvoyFilter applyTo unknown",
            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec:\n  configPatches: [{applyTo: HTTP_FILTERS, patch: {operation: MERGE, value: {}}}]\n",
        ),
        (
            "EnvoyExtensionPolicy body mode unknown",
            "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyExtensionPolicy\nmetadata: {name: x}\nspec:\n  extProc: [{backendRefs: [{name: p, port: 9002}], processingMode: {request: {body: Bufferd}}}]\n",
        ),
        (
            "EnvoyPatchPolicy without patches",
            "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyPatchPolicy\nmetadata: {name: x}\nspec:\n  targetRef: {group: gateway.networking.k8s.io, kind: Gateway, name: eg}\n  type: JSONPatch\n  jsonPatches: []\n",
        ),
        (
            "InferencePool failureMode unknown",
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  targetPorts: [{number: 8000}]\n  endpointPickerRef: {name: p, port: {number: 9002}, failureMode: Open}\n",
        ),
        (
            "InferencePool field misspelled (v1alpha2's extensionRef)",
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  targetPorts: [{number: 8000}]\n  extensionRef: {name: p, portNumber: 9002}\n",
        ),
        (
            "InferencePool without targetPorts",
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  targetPorts: []\n  endpointPickerRef: {name: p, port: {number: 9002}}\n",
        ),
        (
            "HTTPRoute backendRef field misspelled",
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec:\n  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, nmae: p}]}]\n",
        ),
        (
            "DestinationRule TLS mode unknown",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: x}\nspec:\n  host: p.default.svc.cluster.local\n  trafficPolicy: {tls: {mode: TLS, insecureSkipVerify: true}}\n",
        ),
        (
            "EnvoyProxy access-log sink type unknown",
            "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyProxy\nmetadata: {name: x}\nspec:\n  telemetry: {accessLog: {settings: [{sinks: [{type: GRPC}]}]}}\n",
        ),
        (
            "HealthCheckPolicy field misspelled",
            "apiVersion: networking.gke.io/v1\nkind: HealthCheckPolicy\nmetadata: {name: x}\nspec:\n  targetRef: {group: inference.networking.k8s.io, kind: InferencePool, name: p}\n  default: {config: {type: HTTP, httpHealthCheck: {requestPth: /health}}}\n",
        ),
        (
            "kind without a schema",
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
        ),
    ];
    let mut args = vec!["validate".to_string()];
    args.extend(good.iter().map(|p| p.display().to_string()));
    for (i, (_, doc)) in cases.iter().enumerate() {
        let path = bad_dir.path().join(format!("{i}.yaml"));
        std::fs::write(&path, doc).unwrap();
        args.push(path.display().to_string());
    }
    let out = deploy_check(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for path in &good {
        assert!(
            !stderr.contains(&format!("{} #", path.display())),
            "{} fails validation:\n{stderr}",
            path.display()
        );
    }
    for (i, (what, _)) in cases.iter().enumerate() {
        let file = format!("{}.yaml #", bad_dir.path().join(i.to_string()).display());
        assert!(stderr.contains(&file), "{what} was accepted:\n{stderr}");
    }
}

/// The single document of `kind` (and `name`, when given) in `docs`.
fn one<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .collect();
    assert_eq!(found.len(), 1, "{kind} {name:?}");
    found[0]
}

/// Every gateway example wires the objects together as GIE's gateways read them: the pool's
/// endpointPickerRef is the picker's Service and its gRPC port (appProtocol http2: the picker
/// serves TLS), the HTTPRoute's backend is the pool and its parent the Gateway, the RBAC reads
/// InferencePools, and each provider's own objects point at the right things.
#[test]
fn gateway_examples_wire_the_pool_the_route_and_the_picker() {
    let (_dir, rendered) = render_chart();
    let gateways: Vec<_> = rendered
        .iter()
        .filter(|(n, _)| n.starts_with("gateway-"))
        .collect();
    assert_eq!(gateways.len(), 4);
    for (scenario, text) in gateways {
        let docs = documents(text);
        let service = one(&docs, "Service", Some("prefix-picker"));
        let grpc = service["spec"]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "grpc-ext-proc")
            .unwrap();
        assert_eq!(grpc["appProtocol"], "http2", "{scenario}");
        let pool = one(&docs, "InferencePool", Some("prefix-picker"));
        let epp = &pool["spec"]["endpointPickerRef"];
        assert_eq!(epp["name"], service["metadata"]["name"], "{scenario}");
        assert_eq!(epp["port"]["number"], grpc["port"], "{scenario}");
        assert_eq!(epp["failureMode"], "FailClose", "{scenario}");
        assert_eq!(pool["spec"]["selector"]["matchLabels"]["app"], "vllm");
        assert_eq!(
            pool["spec"]["targetPorts"][0]["number"].as_u64(),
            Some(8000)
        );
        let route = one(&docs, "HTTPRoute", None);
        let backend = &route["spec"]["rules"][0]["backendRefs"][0];
        assert_eq!(backend["group"], "inference.networking.k8s.io");
        assert_eq!(backend["kind"], "InferencePool");
        assert_eq!(backend["name"], pool["metadata"]["name"]);
        let gateway = one(&docs, "Gateway", None);
        assert_eq!(
            route["spec"]["parentRefs"][0]["name"],
            gateway["metadata"]["name"]
        );
        let role = one(&docs, "Role", None);
        assert!(
            role["rules"].as_sequence().unwrap().iter().any(|r| {
                r["apiGroups"][0] == "inference.networking.k8s.io"
                    && r["resources"][0] == "inferencepools"
            }),
            "{scenario}: the picker cannot read InferencePools"
        );
        let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        // Every shape runs two replicas, kept through node drains by a PodDisruptionBudget.
        let deployment = one(&docs, "Deployment", None);
        assert_eq!(
            deployment["spec"]["replicas"].as_u64(),
            Some(2),
            "{scenario}"
        );
        let pdb = one(&docs, "PodDisruptionBudget", None);
        assert_eq!(pdb["spec"]["minAvailable"].as_u64(), Some(1), "{scenario}");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
            "{scenario}"
        );
        match scenario.as_str() {
            "gateway-istio" => {
                let rule = one(&docs, "DestinationRule", None);
                assert_eq!(
                    rule["spec"]["host"],
                    "prefix-picker.default.svc.cluster.local"
                );
                assert_eq!(rule["spec"]["trafficPolicy"]["tls"]["mode"], "SIMPLE");
                assert_eq!(
                    rule["spec"]["trafficPolicy"]["tls"]["insecureSkipVerify"],
                    true
                );
                assert!(!kinds.contains("Telemetry"), "{scenario}: no access log");
                assert_eq!(gateway["spec"]["gatewayClassName"], "istio");
            }
            "gateway-envoy-gateway" => {
                for kind in ["EnvoyProxy", "Backend"] {
                    assert!(!kinds.contains(kind), "{scenario}: no access log: {kind}");
                }
                assert!(gateway["spec"].get("infrastructure").is_none());
                assert_eq!(gateway["spec"]["gatewayClassName"], "eg");
            }
            "gateway-gke" => {
                for kind in ["HealthCheckPolicy", "GCPBackendPolicy"] {
                    let policy = one(&docs, kind, None);
                    assert_eq!(policy["spec"]["targetRef"]["kind"], "InferencePool");
                    assert_eq!(
                        policy["spec"]["targetRef"]["name"],
                        pool["metadata"]["name"]
                    );
                }
                assert!(route["spec"]["rules"][0].get("timeouts").is_none());
            }
            "gateway-kgateway" => {
                assert_eq!(gateway["spec"]["gatewayClassName"], "agentgateway");
                for kind in ["DestinationRule", "EnvoyProxy", "HealthCheckPolicy"] {
                    assert!(!kinds.contains(kind), "{scenario}: {kind}");
                }
            }
            other => panic!("unexpected scenario {other}"),
        }
    }
}

#[test]
fn plain_manifests_match_the_chart() {
    let out = deploy_check(&["manifests", "--check"]);
    assert!(out.status.success(), "{}", show(&out));
}

#[test]
fn chart_envoy_bootstraps_pass_envoy_validate() {
    let (_dir, rendered) = render_chart();
    let mut n = 0;
    for (scenario, text) in &rendered {
        let docs = documents(text);
        let bootstraps = config_map_values(&docs, "envoy.yaml");
        assert_eq!(
            bootstraps.len(),
            usize::from(matches!(scenario.as_str(), "sidecar" | "full")),
            "{scenario}: Envoy bootstrap ConfigMaps"
        );
        for config in bootstraps {
            let parsed: Value = serde_yaml_ng::from_str(&config).unwrap();
            let fail_open = parsed["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
                [0]["typed_config"]["http_filters"][0]["typed_config"]["failure_mode_allow"]
                .as_bool();
            assert_eq!(fail_open, Some(scenario == "full"), "{scenario}");
            envoy_validate(&config, scenario);
            n += 1;
        }
    }
    assert_eq!(n, 2);
}

#[test]
fn chart_router_configuration_is_a_valid_config_with_the_contract_keys() {
    let (_dir, rendered) = render_chart();
    let local: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root().join("deploy/local/config.yaml")).unwrap(),
    )
    .unwrap();
    let contract: BTreeSet<&str> = [
        "namespace",
        "selector",
        "targetPorts",
        "inferencePool",
        "roleLabel",
        "modelLabel",
    ]
    .into();
    for (scenario, text) in &rendered {
        let docs = documents(text);
        // Named after the release by default; "full" keeps Kthena's name through configMapName.
        let name = match scenario.as_str() {
            "full" => "kthena-router-config",
            _ => "prefix-picker-config",
        };
        let maps: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
            .collect();
        assert_eq!(maps.len(), 1, "{scenario}");
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let volumes = deployment["spec"]["template"]["spec"]["volumes"]
            .as_sequence()
            .unwrap();
        let config_volume = volumes.iter().find(|v| v["name"] == "config").unwrap();
        assert_eq!(config_volume["configMap"]["name"], name, "{scenario}");
        let config_text = maps[0]["data"]["routerConfiguration"].as_str().unwrap();
        let config: Value = serde_yaml_ng::from_str(config_text).unwrap();
        // Kthena's Helm defaults, exactly as the source document (and deploy/local) has them.
        assert_eq!(config["scheduler"], local["scheduler"], "{scenario}");
        let kube = config["discovery"]["kubernetes"].as_mapping().unwrap();
        for key in kube.keys() {
            assert!(
                contract.contains(key.as_str().unwrap()),
                "{scenario}: discovery.kubernetes.{key:?} is not in the config contract"
            );
        }
        match scenario.as_str() {
            "full" => {
                assert_eq!(kube["namespace"], "models");
                assert_eq!(kube["inferencePool"], "llama-pool");
                assert!(kube.get("selector").is_none());
            }
            // The chart's own pool; the picker serves TLS as GIE's gateways expect.
            s if s.starts_with("gateway-") => {
                assert_eq!(kube["namespace"], "default");
                assert_eq!(kube["inferencePool"], "prefix-picker");
                assert!(kube.get("selector").is_none());
                assert_eq!(config["picker"]["tls"]["mode"], "selfSigned", "{scenario}");
            }
            _ => {
                assert_eq!(kube["namespace"], "default");
                assert_eq!(kube["selector"], "app=vllm");
                assert_eq!(kube["targetPorts"][0].as_u64(), Some(8000));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routerConfiguration");
        std::fs::write(&path, config_text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
            .args(["validate", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{scenario}: {}", show(&out));
    }
}

/// The chart's Envoy bootstrap, as rendered, in front of the picker and three backends: the
/// headless-Service name is the only edit (it becomes `localhost`, resolved by STRICT_DNS like the
/// Service), the ports are the test's. Repeats of a prompt stick to one pod through the
/// override_host cluster, the health listener answers the readiness probe's path, and the
/// picker's records show the observer filter completed the requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_envoy_bootstrap_routes_through_the_picker() {
    let backends = [
        Backend::start("pod-a").await,
        Backend::start("pod-b").await,
        Backend::start("pod-c").await,
    ];
    let ports: Vec<u16> = backends.iter().map(|b| b.addr.port()).collect();
    let values = serde_json::json!({"discovery": {"kubernetes": {"targetPorts": ports}}});
    let out = deploy_check(&["render-values", &values.to_string()]);
    assert!(out.status.success(), "{}", show(&out));
    let docs = documents(&String::from_utf8(out.stdout).unwrap());
    let bootstrap = config_map_values(&docs, "envoy.yaml").pop().unwrap();
    let host = "prefix-picker-models.default.svc.cluster.local";
    assert_eq!(bootstrap.matches(host).count(), 3);
    let picker = start_picker(picker_config(&backends.iter().collect::<Vec<_>>(), "")).await;
    let config = replaced(
        &testkit::render_envoy(
            &replaced(&bootstrap, host, "localhost"),
            picker.grpc_addr.port(),
            &[],
        ),
        "port_value: 10001",
        "port_value: 0",
    );
    let envoy = start_envoy(config).await;
    let client = reqwest::Client::new();
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": "A system prompt long enough for a few blocks. ".repeat(8)},
        {"role": "user", "content": "chart"}]});
    let mut served = BTreeSet::new();
    for i in 0..4 {
        let r = client
            .post(envoy.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        served.insert(r.headers()["x-served-by"].to_str().unwrap().to_string());
        wait_metric(&picker, "prefix_picker_records_total", f64::from(i + 1)).await;
    }
    assert_eq!(
        served.len(),
        1,
        "a repeated prompt moved between pods: {served:?}"
    );
    assert!(
        metric(
            &picker,
            "prefix_picker_decisions_total{reason=\"prefix_hit\"}"
        )
        .await
            >= 3.0
    );
    let listeners: serde_json::Value = client
        .get(format!(
            "http://{}/listeners?format=json",
            envoy.process.admin
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let health = listeners["listener_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "health")
        .unwrap()["local_address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap();
    let ready = reqwest::get(format!("http://127.0.0.1:{health}/ready"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

/// `.github/workflows/*.yml` against the GitHub-workflow schema (check-jsonschema's vendored copy
/// of SchemaStore's, from `.venv-deploy`: no network); a misspelled key must fail it.
#[test]
fn workflows_pass_the_github_workflow_schema() {
    let mut workflows: Vec<PathBuf> = std::fs::read_dir(root().join(".github/workflows"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    workflows.sort();
    assert!(!workflows.is_empty());
    let check = |files: &[PathBuf]| {
        Command::new(deploy_python())
            .args([
                "-m",
                "check_jsonschema",
                "--builtin-schema",
                "vendor.github-workflows",
            ])
            .args(files)
            .output()
            .unwrap()
    };
    let out = check(&workflows);
    assert!(out.status.success(), "{}", show(&out));
    let bad = tempfile::tempdir().unwrap();
    let path = bad.path().join("bad.yml");
    std::fs::write(
        &path,
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    step:\n      - run: echo\n",
    )
    .unwrap();
    let out = check(&[path]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        show(&out).contains("'step' was unexpected"),
        "{}",
        show(&out)
    );
}

// ---------------------------------------------------------------- gateway examples

/// A bootstrap around xDS fragments taken from a gateway example: `filters` in an HTTP
/// connection manager, `models` merged into a STATIC cluster named like the gateway's.
fn fragment_bootstrap(filters: &[Value], grpc_cluster: &str, models: &Value) -> String {
    let router: Value = serde_yaml_ng::from_str(
        "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}",
    )
    .unwrap();
    let mut chain = filters.to_vec();
    chain.push(router);
    let mut bootstrap: Value = serde_yaml_ng::from_str(&format!(
        r#"
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - {{name: models, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: models}}}}]}}
          http_filters: []
  clusters:
  - name: models
    connect_timeout: 1s
    type: STATIC
    lb_policy: LEAST_REQUEST
    load_assignment: {{cluster_name: models, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 8000}}}}}}}}]}}]}}
  - name: "{grpc_cluster}"
    connect_timeout: 1s
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment: {{cluster_name: picker, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 9002}}}}}}}}]}}]}}
"#
    ))
    .unwrap();
    bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"] = Value::Sequence(chain);
    let cluster = bootstrap["static_resources"]["clusters"][0]
        .as_mapping_mut()
        .unwrap();
    for (k, v) in models.as_mapping().unwrap() {
        cluster.insert(k.clone(), v.clone());
    }
    serde_yaml_ng::to_string(&bootstrap).unwrap()
}

#[test]
fn istio_envoy_filter_patches_pass_envoy_validate() {
    let text = std::fs::read_to_string(root().join("envoy/istio/envoyfilter.yaml")).unwrap();
    let docs = documents(&text);
    assert_eq!(docs.len(), 1);
    let patches = docs[0]["spec"]["configPatches"].as_sequence().unwrap();
    let filters: Vec<Value> = patches
        .iter()
        .filter(|p| p["applyTo"] == "HTTP_FILTER")
        .map(|p| p["patch"]["value"].clone())
        .collect();
    // One routing filter that also sees the response (no observer filter, whose stream could
    // reach another picker replica than the one that routed): several replicas complete once.
    assert_eq!(filters.len(), 1);
    let mode = &filters[0]["typed_config"]["processing_mode"];
    assert_eq!(mode["response_header_mode"], "SEND");
    assert_eq!(mode["response_body_mode"], "FULL_DUPLEX_STREAMED");
    let grpc_cluster = filters[0]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        grpc_cluster,
        "outbound|9002||prefix-picker.default.svc.cluster.local"
    );
    let cluster_patch = patches
        .iter()
        .find(|p| p["applyTo"] == "CLUSTER")
        .map(|p| p["patch"]["value"].clone())
        .unwrap();
    envoy_validate(
        &fragment_bootstrap(&filters, &grpc_cluster, &cluster_patch),
        "istio",
    );
}

#[test]
fn envoy_gateway_patch_policy_value_passes_envoy_validate() {
    let text =
        std::fs::read_to_string(root().join("envoy/envoy-gateway/prefix-picker.yaml")).unwrap();
    let docs = documents(&text);
    let patch = docs
        .iter()
        .find(|d| d["kind"] == "EnvoyPatchPolicy")
        .unwrap();
    // The routing stream sees the response (Streamed body): each replica completes its own.
    let ext_proc = &docs
        .iter()
        .find(|d| d["kind"] == "EnvoyExtensionPolicy")
        .unwrap()["spec"]["extProc"];
    assert_eq!(ext_proc.as_sequence().unwrap().len(), 1);
    assert_eq!(
        ext_proc[0]["processingMode"]["response"]["body"],
        "Streamed"
    );
    let ops = patch["spec"]["jsonPatches"].as_sequence().unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["operation"]["op"], "add");
    assert_eq!(ops[0]["operation"]["path"], "/load_balancing_policy");
    let mut merged = serde_yaml_ng::Mapping::new();
    merged.insert(
        "load_balancing_policy".into(),
        ops[0]["operation"]["value"].clone(),
    );
    // Envoy Gateway's own ext_proc filter comes from the EnvoyExtensionPolicy (schema-checked).
    envoy_validate(
        &fragment_bootstrap(&[], "picker", &Value::Mapping(merged)),
        "envoy-gateway",
    );
}
