//! Kubernetes discovery against an in-process fake API server (no cluster exists on these
//! machines): the endpoint set and the prefix-index cleanup after every kind of watch event, a
//! watch broken mid-stream, a 410 Gone that forces a relist, an InferencePool whose selector
//! changes, and `prefix-picker serve` (and the GIE form with `--pool-name`) reporting ready only
//! after the first list.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::fake_kube::{self, Cluster, FakeKube, Kind};
use prefix_picker::discovery::{DiscoveryConfig, DiscoveryMetrics, KubernetesDiscovery};
use prefix_picker::endpoints::{EndpointSpec, Endpoints, PodId};
use prefix_picker::hashing::BlockHash;
use prefix_picker::metrics::RouterMetrics;
use prefix_picker::prefix_index::{ModelKey, PrefixIndex};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NS: &str = "llm";

fn pod(name: &str, uid: &str, ip: &str, ready: bool, labels: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    })
}

fn pool(name: &str, labels: Value, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("pool-{name}")},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": ports,
                 "endpointPickerRef": {"name": "prefix-picker", "port": {"number": 9002}}},
    })
}

/// Polls until `check` holds (every 10 ms; gives up after 30 s so a bug fails instead of hanging).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    eventually_async(what, async || check()).await
}

/// [`eventually`] for a check that awaits.
async fn eventually_async(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A kubeconfig for `fake` in `dir`.
fn write_kubeconfig(dir: &std::path::Path, fake: &FakeKube) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake_kube::kubeconfig(&fake.url())).unwrap();
    kubeconfig
}

/// The values of `keys` (`key=value` fields) on the first line of `child`'s stderr that has
/// them all; the rest of its stderr is read and dropped from then on.
async fn announced<const N: usize>(
    child: &mut tokio::process::Child,
    keys: [&str; N],
) -> [String; N] {
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let field = |line: &str, key: &str| {
        let rest = line.split(key).nth(1)?;
        Some(rest.split_whitespace().next()?.to_string())
    };
    let values = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("prefix-picker exited early");
        let values = keys.map(|k| field(&line, k));
        if values.iter().all(Option::is_some) {
            break values.map(Option::unwrap);
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    values
}

/// A gRPC health client of the server at `addr` (`host:port`).
async fn health_client(addr: &str) -> HealthClient<tonic::transport::Channel> {
    HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

struct Stack {
    endpoints: Arc<Endpoints>,
    index: Arc<PrefixIndex>,
    metrics: DiscoveryMetrics,
    token: CancellationToken,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl Stack {
    /// Starts discovery for `section` (the `discovery:` YAML) against the fake server.
    /// `statics`: configured endpoints that stay next to the discovered ones.
    async fn start(fake: &FakeKube, section: &str, statics: Vec<EndpointSpec>) -> Stack {
        let config = DiscoveryConfig::parse(&serde_yaml_ng::from_str(section).unwrap())
            .unwrap()
            .kubernetes
            .unwrap();
        let client =
            kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
        let index = Arc::new(PrefixIndex::new(100));
        let registry = prometheus::Registry::new();
        let endpoints = Arc::new(Endpoints::new(
            index.clone(),
            RouterMetrics::register(&registry),
        ));
        let metrics = DiscoveryMetrics::register(&registry);
        let discovery = KubernetesDiscovery::new(
            client,
            NS.into(),
            config,
            statics,
            endpoints.clone(),
            metrics.clone(),
        );
        let mut synced = discovery.synced();
        let token = CancellationToken::new();
        tokio::spawn(discovery.run(token.clone()));
        tokio::time::timeout(Duration::from_secs(30), synced.wait_for(|s| *s))
            .await
            .expect("first list")
            .unwrap();
        Stack {
            endpoints,
            index,
            metrics,
            token,
        }
    }

    /// `name@address/generation`, sorted.
    fn set(&self) -> Vec<String> {
        let snapshot = self.endpoints.snapshot();
        snapshot
            .all()
            .iter()
            .map(|e| format!("{}@{}/{}", e.label, e.host, e.spec.generation))
            .collect()
    }

    async fn wait_set(&self, want: &[&str]) {
        eventually(&format!("endpoint set {want:?}"), || self.set() == want).await;
    }

    /// Records two blocks for a pod; returns the index's total entries.
    fn record(&self, label: &str) -> usize {
        let snapshot = self.endpoints.snapshot();
        let e = snapshot.all().iter().find(|e| e.label == label).unwrap();
        self.index
            .record(&e.index, ModelKey(1), &[BlockHash(1), BlockHash(2)]);
        self.index.entries()
    }

    fn count(&self, family: &prometheus::IntCounterVec, labels: &[&str]) -> u64 {
        family.with_label_values(labels).get()
    }
}

#[tokio::test]
async fn pods_follow_every_watch_event_and_leave_the_index_at_once() {
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("a", "a1", "10.0.0.1", true, json!({"app": "vllm"})),
        );
        c.put(
            Kind::Pod,
            pod("other", "o1", "10.0.0.9", true, json!({"app": "x"})),
        );
        c.put(
            Kind::Pod,
            pod("cold", "c1", "10.0.0.3", false, json!({"app": "vllm"})),
        );
    });
    let s = Stack::start(
        &fake,
        "kubernetes: {selector: app=vllm, targetPorts: [8000]}",
        vec![],
    )
    .await;
    assert_eq!(s.set(), ["llm/a@10.0.0.1:8000/a1"]);
    assert_eq!(s.metrics.pods.with_label_values(&["not_ready"]).get(), 1);
    assert_eq!(s.record("llm/a"), 2);

    // Add: a new ready pod joins.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("b", "b1", "10.0.0.2", true, json!({"app": "vllm"})),
        )
    });
    s.wait_set(&["llm/a@10.0.0.1:8000/a1", "llm/b@10.0.0.2:8000/b1"])
        .await;
    assert_eq!(s.record("llm/b"), 4);

    // Not ready: leaves at once, with its index entries (a's stay).
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("b", "b1", "10.0.0.2", false, json!({"app": "vllm"})),
        )
    });
    s.wait_set(&["llm/a@10.0.0.1:8000/a1"]).await;
    assert_eq!(s.index.entries(), 2);

    // Ready again, then terminating (deletionTimestamp): leaves before it is deleted.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("b", "b1", "10.0.0.2", true, json!({"app": "vllm"})),
        )
    });
    s.wait_set(&["llm/a@10.0.0.1:8000/a1", "llm/b@10.0.0.2:8000/b1"])
        .await;
    assert_eq!(s.record("llm/b"), 4);
    let mut terminating = pod("b", "b1", "10.0.0.2", true, json!({"app": "vllm"}));
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    fake.change(|c| c.put(Kind::Pod, terminating));
    s.wait_set(&["llm/a@10.0.0.1:8000/a1"]).await;
    assert_eq!(s.index.entries(), 2);
    assert_eq!(s.metrics.pods.with_label_values(&["terminating"]).get(), 1);
    fake.change(|c| c.delete(Kind::Pod, NS, "b"));
    eventually("b forgotten", || {
        s.metrics.pods.with_label_values(&["terminating"]).get() == 0
    })
    .await;

    // Delete of a counted pod.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("c", "c1", "10.0.0.4", true, json!({"app": "vllm"})),
        )
    });
    s.wait_set(&["llm/a@10.0.0.1:8000/a1", "llm/c@10.0.0.4:8000/c1"])
        .await;
    assert_eq!(s.record("llm/c"), 4);
    fake.change(|c| c.delete(Kind::Pod, NS, "c"));
    s.wait_set(&["llm/a@10.0.0.1:8000/a1"]).await;
    assert_eq!(s.index.entries(), 2);

    // Restart under the same name and IP with a new UID: starts cold.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("a", "a2", "10.0.0.1", true, json!({"app": "vllm"})),
        )
    });
    s.wait_set(&["llm/a@10.0.0.1:8000/a2"]).await;
    assert_eq!(s.index.entries(), 0);

    // A label change out of the selector arrives as DELETED.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("a", "a2", "10.0.0.1", true, json!({"app": "x"})),
        )
    });
    s.wait_set(&[]).await;
    assert_eq!(s.count(&s.metrics.watch_restarts, &["pod", "relist"]), 0);
    assert_eq!(s.count(&s.metrics.events, &["pod", "apply"]), 6);
    assert_eq!(s.count(&s.metrics.events, &["pod", "delete"]), 3);
}

#[tokio::test]
async fn a_broken_watch_resumes_and_410_gone_forces_a_relist() {
    let fake = FakeKube::start().await;
    let labels = json!({"app": "vllm", "role": "decode"});
    fake.change(|c| {
        c.put(Kind::Pod, pod("a", "a1", "10.0.0.1", true, labels.clone()));
        c.put(Kind::Pod, pod("b", "b1", "10.0.0.2", true, labels.clone()));
    });
    let s = Stack::start(
        &fake,
        "kubernetes: {selector: app==vllm, targetPorts: [8000, 8001], roleLabel: role}",
        vec![],
    )
    .await;
    let all = [
        "llm/a:8000@10.0.0.1:8000/a1",
        "llm/a:8001@10.0.0.1:8001/a1",
        "llm/b:8000@10.0.0.2:8000/b1",
        "llm/b:8001@10.0.0.2:8001/b1",
    ];
    assert_eq!(s.set(), all);
    assert_eq!(s.metrics.endpoints.with_label_values(&["decode"]).get(), 4);
    assert_eq!(
        s.endpoints.snapshot().all()[0].spec.role.as_deref(),
        Some("decode")
    );
    s.record("llm/a:8000");
    s.record("llm/b:8000");
    assert_eq!(s.index.entries(), 4);
    let (lists, watches) = fake.requests();

    // Broken mid-stream; a change made meanwhile is replayed when the watch resumes.
    fake.disconnected(|c| c.put(Kind::Pod, pod("a", "a1", "10.0.0.1", false, labels.clone())));
    s.wait_set(&all[2..]).await;
    assert_eq!(s.index.entries(), 2);
    // kube-runtime watches again from the last resourceVersion it saw: no relist.
    assert_eq!(
        fake.requests(),
        (lists, watches + 1),
        "resumed without a relist"
    );
    assert_eq!(s.count(&s.metrics.watch_restarts, &["pod", "relist"]), 0);

    // Broken again, with history compacted: the resumed watch gets 410 and relists; b, deleted
    // meanwhile, is gone after the relist (and its entries with it); a is back, cold.
    fake.disconnected(|c: &mut Cluster| {
        c.delete(Kind::Pod, NS, "b");
        c.put(Kind::Pod, pod("a", "a1", "10.0.0.1", true, labels.clone()));
        c.compact();
    });
    s.wait_set(&all[..2]).await;
    assert_eq!(s.index.entries(), 0);
    eventually("relist counted", || {
        s.count(&s.metrics.watch_restarts, &["pod", "relist"]) == 1
    })
    .await;
    assert_eq!(fake.requests().0, lists + 1);
    // The 410 (and possibly a reset read as an error) was counted.
    assert!(s.count(&s.metrics.watch_errors, &["pod"]) >= 1);
    assert_eq!(s.count(&s.metrics.events, &["pod", "resync"]), 2);
}

#[tokio::test]
async fn an_inference_pool_selector_change_retargets_the_pods() {
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("one-0", "u1", "10.0.1.1", true, json!({"pool": "one"})),
        );
        c.put(
            Kind::Pod,
            pod("two-0", "u2", "10.0.2.1", true, json!({"pool": "two"})),
        );
        c.put(
            Kind::InferencePool,
            pool("other", json!({"pool": "two"}), &[9000]),
        );
    });
    // No pool yet: listed, known empty, ready.
    let fixed = EndpointSpec {
        id: PodId {
            namespace: NS.into(),
            name: "fixed".into(),
        },
        address: "10.9.9.9:8000".parse().unwrap(),
        models: vec![],
        generation: String::new(),
        role: None,
        labels: Default::default(),
        kv_events: None,
        containers_started: None,
        engine_started: None,
    };
    let s = Stack::start(&fake, "kubernetes: {inferencePool: llama}", vec![fixed]).await;
    const FIXED: &str = "llm/fixed@10.9.9.9:8000/";
    assert_eq!(s.set(), [FIXED]);

    fake.change(|c| {
        c.put(
            Kind::InferencePool,
            pool("llama", json!({"pool": "one"}), &[8000]),
        )
    });
    s.wait_set(&[FIXED, "llm/one-0@10.0.1.1:8000/u1"]).await;
    assert_eq!(s.record("llm/one-0"), 2);

    // The pool's selector and ports change: the pod watch restarts on the new selector.
    fake.change(|c| {
        c.put(
            Kind::InferencePool,
            pool("llama", json!({"pool": "two"}), &[8000, 8001]),
        )
    });
    s.wait_set(&[
        FIXED,
        "llm/two-0:8000@10.0.2.1:8000/u2",
        "llm/two-0:8001@10.0.2.1:8001/u2",
    ])
    .await;
    assert_eq!(s.index.entries(), 0);
    assert_eq!(s.count(&s.metrics.watch_restarts, &["pod", "target"]), 1);

    // Pods of the new selector are followed.
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("two-1", "u3", "10.0.2.2", true, json!({"pool": "two"})),
        )
    });
    eventually("two-1 joins", || s.set().len() == 5).await;

    // The pool is deleted: no pod is selected; the static endpoint stays.
    fake.change(|c| c.delete(Kind::InferencePool, NS, "llama"));
    s.wait_set(&[FIXED]).await;
}

const BIN: &str = env!("CARGO_BIN_EXE_prefix-picker");

#[tokio::test]
async fn serve_is_ready_only_after_the_first_pod_list() {
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("a", "a1", "127.0.0.1", true, json!({"app": "vllm"})),
        )
    });
    fake.hold_lists(true);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &fake);
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "discovery:\n  kubernetes: {{namespace: {NS}, selector: app=vllm, targetPorts: [8000]}}\n\
             picker: {{scrapeIntervalSeconds: 0}}\n"
        ),
    )
    .unwrap();

    let validate = std::process::Command::new(BIN)
        .args(["validate", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&validate.stdout);
    assert!(validate.status.success(), "{out}");
    assert!(
        out.contains(
            r#"kubernetes discovery in namespace "llm": selector "app=vllm", ports [8000]"#
        ),
        "{out}"
    );
    assert!(!String::from_utf8_lossy(&validate.stderr).contains("no endpoints"));

    let mut child = tokio::process::Command::new(BIN)
        .args(testkit::SERVE_ON_ANY_PORT)
        .arg("--config")
        .arg(&config)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("POD_NAMESPACE")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let [grpc, admin] = announced(&mut child, ["grpc_addr=", "admin_addr="]).await;
    let mut health = health_client(&grpc).await;
    let mut readiness = async || {
        let request = HealthCheckRequest {
            service: "readiness".into(),
        };
        health.check(request).await.unwrap().into_inner().status
    };
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let request = http.get(format!("http://{admin}{path}"));
        async move { request.send().await.unwrap() }
    };
    assert_eq!(get("/healthz").await.status(), 200);
    // The list is held: the picker has asked and is not ready.
    eventually("the pod list is requested", || fake.requests().0 == 1).await;
    assert_eq!(get("/readyz").await.status(), 503);
    assert_eq!(readiness().await, ServingStatus::NotServing as i32);
    fake.hold_lists(false);
    eventually_async("ready after the list", async || {
        get("/readyz").await.status() == 200
    })
    .await;
    assert_eq!(readiness().await, ServingStatus::Serving as i32);
    let metrics = get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("prefix_picker_discovery_endpoints{role=\"none\"} 1"),
        "{metrics}"
    );
    child.kill().await.unwrap();
}

/// The GIE form as GIE's chart runs it: `--pool-name` watches that InferencePool in the
/// namespace from `$NAMESPACE` (before `$POD_NAMESPACE`), and the probes' `inference-extension`
/// health service on the health port turns SERVING only after the first pod list.
#[tokio::test]
async fn gie_form_watches_the_named_pool_and_reports_ready_on_the_health_port() {
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.put(
            Kind::Pod,
            pod("a", "a1", "127.0.0.1", true, json!({"app": "vllm"})),
        );
        c.put(
            Kind::InferencePool,
            pool("llama", json!({"app": "vllm"}), &[8000]),
        );
    });
    fake.hold_lists(true);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &fake);
    let mut child = tokio::process::Command::new(BIN)
        .args([
            "--pool-name",
            "llama",
            "--secure-serving=false",
            "-grpc-port=0",
            "-grpc-health-port=0",
            "-metrics-port=0",
            "--config-text",
            "picker: {scrapeIntervalSeconds: 0}",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("NAMESPACE", NS)
        .env("POD_NAMESPACE", "not-this-one")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let [health_addr, admin_addr] = announced(&mut child, ["health_addr=", "admin_addr="]).await;
    let port = |addr: &str| addr.parse::<std::net::SocketAddr>().unwrap().port();
    let admin_port = port(&admin_addr);
    let mut health = health_client(&format!("127.0.0.1:{}", port(&health_addr))).await;
    let mut status = async |service: &str| {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        health.check(request).await.unwrap().into_inner().status
    };
    eventually("the pod list is requested", || fake.requests().0 >= 1).await;
    assert_eq!(
        status("inference-extension").await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(status("liveness").await, ServingStatus::Serving as i32);
    fake.hold_lists(false);
    eventually_async("ready after the list", async || {
        status("inference-extension").await == ServingStatus::Serving as i32
    })
    .await;
    let metrics = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("prefix_picker_discovery_endpoints{role=\"none\"} 1"),
        "{metrics}"
    );
    child.kill().await.unwrap();
}

#[tokio::test]
async fn inference_objectives_of_the_pool_give_their_priorities() {
    use prefix_picker::discovery::inference_objective;
    use prefix_picker::flow_control::ObjectivePriorities;
    let fake = FakeKube::start().await;
    let objective = |name: &str, pool: &str, priority: i64| {
        json!({"metadata": {"name": name, "namespace": NS},
            "spec": {"priority": priority, "poolRef": {"name": pool}}})
    };
    fake.change(|c| {
        c.put(Kind::GieObjective, objective("chat", "my-pool", 10));
        c.put(Kind::GieObjective, objective("other-pool", "another", 99));
        c.put(Kind::LlmdObjective, objective("batch", "my-pool", -1));
    });
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let priorities = Arc::new(ObjectivePriorities::default());
    let token = CancellationToken::new();
    tokio::spawn(inference_objective::watch(
        client,
        NS.into(),
        Some("my-pool".into()),
        priorities.clone(),
        token.clone(),
    ));
    eventually("both groups listed", || {
        priorities.get("chat") == Some(10) && priorities.get("batch") == Some(-1)
    })
    .await;
    assert_eq!(priorities.get("other-pool"), None, "another pool's");
    // Watched: a change, a name llm-d's group also defines (it wins), a deletion.
    fake.change(|c| {
        c.put(Kind::GieObjective, objective("chat", "my-pool", 20));
        c.put(Kind::LlmdObjective, objective("chat", "my-pool", 30));
        c.delete(Kind::LlmdObjective, NS, "batch");
    });
    eventually("changes followed", || {
        priorities.get("chat") == Some(30) && priorities.get("batch").is_none()
    })
    .await;
    token.cancel();
}
