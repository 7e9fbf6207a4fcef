//! One pod -> its endpoints.
//!
//! A pod counts only when its `Ready` condition is `True`, it has no `deletionTimestamp`
//! (terminating pods leave at once, before their containers stop) and it has a `status.podIP`.
//! A counted pod yields one endpoint per target port, at `podIP:port`. Endpoint names: the pod
//! name when there is one target port, `pod-name:port` when there are several (so each
//! `namespace/name` in logs and metrics stays unique). The generation is the pod UID, so a pod
//! recreated under the same name starts cold; so does a pod whose engine container restarted
//! (the running container that declares a target port; any container when none declares one),
//! but not one whose sidecar did. `modelLabel` names the pod label holding the
//! served model (absent: any model). With `pdGroup`, an endpoint carries the pod labels the group
//! reads (its `groupKey` and label keys; other labels are left out, so changing them does not
//! restart the pod cold), and its role for the endpoints metric is the group's sorting
//! (`prefill`, `decode`, or none); without it the deprecated `roleLabel` names that role.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;

use crate::endpoints::{EndpointSpec, KvEventsAddress, PodId};
use crate::scheduler::PdGroup;

/// Why a pod does or does not count; `as_str()` is the `state` label of
/// `prefix_picker_discovery_pods`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PodState {
    Ready,
    NotReady,
    Terminating,
    NoIp,
}

impl PodState {
    pub const ALL: [PodState; 4] = [
        PodState::Ready,
        PodState::NotReady,
        PodState::Terminating,
        PodState::NoIp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PodState::Ready => "ready",
            PodState::NotReady => "not_ready",
            PodState::Terminating => "terminating",
            PodState::NoIp => "no_ip",
        }
    }
}

/// Labels read from pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLabels {
    pub role: Option<String>,
    pub model: Option<String>,
    /// `pdGroup`: the labels it reads are kept on the endpoints.
    pub pd: Option<PdGroup>,
    /// Other label keys kept on the endpoints (an `EndpointPickerConfig`'s filters read them).
    pub keep: Vec<String>,
    /// Where each pod publishes KV events (`kvEventsPort`, `kvEventsReplayPort` on its IP).
    pub kv_events: Option<(u16, Option<u16>)>,
}

/// When the pod's running containers last started (unix seconds), as Kthena's
/// `podLastContainerStartUnix` reads it (readiness is not used: it also flips on a probe failure,
/// which leaves the engine's cache intact); `None` when none is running.
fn containers_started(pod: &Pod) -> Option<i64> {
    started(pod, |_| true)
}

/// When the pod's engine last started: the newest start among the running containers that
/// declare one of the target `ports` (the engine; a sidecar's restart leaves its cache), or
/// among all of them when none declares one.
fn engine_started(pod: &Pod, ports: &[u16]) -> Option<i64> {
    let serving: Vec<&str> =
        pod.spec
            .iter()
            .flat_map(|s| &s.containers)
            .filter(|c| {
                c.ports.iter().flatten().any(|p| {
                    u16::try_from(p.container_port).is_ok_and(|port| ports.contains(&port))
                })
            })
            .map(|c| c.name.as_str())
            .collect();
    if serving.is_empty() {
        return containers_started(pod);
    }
    started(pod, |name| serving.contains(&name))
}

/// The newest `startedAt` among the running containers whose name `which` accepts.
fn started(pod: &Pod, which: impl Fn(&str) -> bool) -> Option<i64> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .filter(|c| which(&c.name))
        .filter_map(|c| {
            Some(
                c.state
                    .as_ref()?
                    .running
                    .as_ref()?
                    .started_at
                    .as_ref()?
                    .0
                    .timestamp(),
            )
        })
        .filter(|&t| t > 0)
        .max()
}

/// A pod as discovery sees it: its state and, when ready, its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEndpoints {
    pub state: PodState,
    pub endpoints: Vec<EndpointSpec>,
}

impl PodEndpoints {
    /// The pod's state and, when it is ready with an IP, one endpoint per port (named
    /// `name:port` when there are several).
    pub fn of(pod: &Pod, namespace: &str, ports: &[u16], labels: &PodLabels) -> PodEndpoints {
        let ip = match serving_ip(pod) {
            Ok(ip) => ip,
            Err(state) => {
                return PodEndpoints {
                    state,
                    endpoints: Vec::new(),
                };
            }
        };
        let meta = &pod.metadata;
        let name = meta.name.clone().unwrap_or_default();
        let namespace = meta.namespace.clone().unwrap_or_else(|| namespace.into());
        let (role, kept) = role_and_labels(pod, labels);
        let models: Vec<String> = label(pod, &labels.model).into_iter().collect();
        let generation = meta.uid.clone().unwrap_or_default();
        let containers_started = containers_started(pod);
        let engine_started = engine_started(pod, ports);
        let kv_events = labels.kv_events.map(|(port, replay)| {
            let at = |p: u16| format!("tcp://{}", SocketAddr::new(ip, p));
            KvEventsAddress {
                endpoint: at(port),
                replay: replay.map(at),
            }
        });
        let endpoints = ports
            .iter()
            .map(|&port| EndpointSpec {
                id: PodId {
                    namespace: namespace.clone(),
                    name: if ports.len() == 1 {
                        name.clone()
                    } else {
                        format!("{name}:{port}")
                    },
                },
                address: SocketAddr::new(ip, port),
                models: models.clone(),
                generation: generation.clone(),
                role: role.clone(),
                labels: kept.clone(),
                kv_events: kv_events.clone(),
                containers_started,
                engine_started,
            })
            .collect();
        PodEndpoints {
            state: PodState::Ready,
            endpoints,
        }
    }
}

/// The IP of a pod that may serve: not terminating, ready, with an IP; else the state it is in.
fn serving_ip(pod: &Pod) -> Result<IpAddr, PodState> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(PodState::Terminating);
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Err(PodState::NotReady);
    }
    status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .ok_or(PodState::NoIp)
}

/// The pod's non-empty value of the label `key` names, if any.
fn label(pod: &Pod, key: &Option<String>) -> Option<String> {
    key.as_ref()
        .and_then(|k| pod.metadata.labels.as_ref()?.get(k))
        .filter(|v| !v.is_empty())
        .cloned()
}

/// The pod's role and the labels kept with its endpoints: with `pdGroup`, the group's labels
/// and the role they classify the pod into; else the role label's value, no labels.
fn role_and_labels(
    pod: &Pod,
    labels: &PodLabels,
) -> (Option<String>, std::collections::BTreeMap<String, String>) {
    let mut kept = std::collections::BTreeMap::new();
    let all = pod.metadata.labels.as_ref();
    for key in &labels.keep {
        if let Some(v) = all.and_then(|l| l.get(key)) {
            kept.insert(key.clone(), v.clone());
        }
    }
    let Some(group) = &labels.pd else {
        return (label(pod, &labels.role), kept);
    };
    for key in group.label_keys() {
        if let Some(v) = all.and_then(|l| l.get(key)) {
            kept.insert(key.to_string(), v.clone());
        }
    }
    let role = group
        .classify(|k| kept.get(k).map(String::as_str))
        .map(|(r, _)| r.as_str().to_string());
    (role, kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra_meta: serde_json::Value, status: serde_json::Value) -> Pod {
        let mut meta = json!({"name": "vllm-0", "namespace": "ns", "uid": "u1",
            "labels": {"app": "vllm", "role": "decode", "model": "llama"}});
        meta.as_object_mut()
            .unwrap()
            .extend(extra_meta.as_object().unwrap().clone());
        serde_json::from_value(json!({"metadata": meta, "status": status})).unwrap()
    }

    fn ready(ip: &str) -> serde_json::Value {
        json!({"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]})
    }

    const LABELS: PodLabels = PodLabels {
        role: None,
        model: None,
        pd: None,
        keep: Vec::new(),
        kv_events: None,
    };

    #[test]
    fn only_ready_live_pods_with_an_ip_count() {
        let of = |p: &Pod| PodEndpoints::of(p, "ns", &[8000], &LABELS).state;
        assert_eq!(of(&pod(json!({}), ready("10.0.0.1"))), PodState::Ready);
        let unready =
            json!({"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}]});
        assert_eq!(of(&pod(json!({}), unready)), PodState::NotReady);
        assert_eq!(of(&pod(json!({}), json!({}))), PodState::NotReady);
        let gone = json!({"deletionTimestamp": "2026-01-01T00:00:00Z"});
        assert_eq!(of(&pod(gone, ready("10.0.0.1"))), PodState::Terminating);
        let no_ip = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(of(&pod(json!({}), no_ip)), PodState::NoIp);
    }

    /// An EndpointPickerConfig's role filters read `llm-d.ai/role`: kept when asked, and
    /// nothing else.
    #[test]
    fn the_labels_asked_for_are_kept_on_the_endpoints() {
        let labels = PodLabels {
            keep: vec!["llm-d.ai/role".into(), "zone".into()],
            ..LABELS
        };
        let meta = json!({"labels": {"llm-d.ai/role": "prefill", "app": "vllm"}});
        let p = PodEndpoints::of(&pod(meta, ready("10.0.0.1")), "x", &[8000], &labels);
        let kept: Vec<(&str, &str)> = p.endpoints[0]
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(kept, [("llm-d.ai/role", "prefill")]);
        let none = PodEndpoints::of(&pod(json!({}), ready("10.0.0.1")), "x", &[8000], &LABELS);
        assert!(none.endpoints[0].labels.is_empty());
    }

    #[test]
    fn a_pod_publishes_kv_events_on_its_ip() {
        let labels = PodLabels {
            kv_events: Some((5557, Some(5558))),
            ..LABELS
        };
        let v6 = PodEndpoints::of(&pod(json!({}), ready("fd00::1")), "x", &[8000], &labels);
        let address = v6.endpoints[0].kv_events.clone().unwrap();
        assert_eq!(address.endpoint, "tcp://[fd00::1]:5557");
        assert_eq!(address.replay.as_deref(), Some("tcp://[fd00::1]:5558"));
        let none = PodEndpoints::of(&pod(json!({}), ready("10.0.0.1")), "x", &[8000], &LABELS);
        assert_eq!(none.endpoints[0].kv_events, None);
    }

    #[test]
    fn the_containers_last_start_is_the_newest_running_one() {
        let mut status = ready("10.0.0.1");
        status["containerStatuses"] = json!([
            {"name": "vllm", "ready": true, "restartCount": 1, "image": "v", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}},
            {"name": "kv-relay", "ready": true, "restartCount": 0, "image": "r", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:20Z"}}},
            {"name": "done", "ready": false, "restartCount": 0, "image": "d", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "startedAt": "2026-01-01T00:01:00Z"}}}
        ]);
        let p = PodEndpoints::of(&pod(json!({}), status), "x", &[8000], &LABELS);
        assert_eq!(p.endpoints[0].containers_started, Some(1_767_225_620));
        let none = PodEndpoints::of(&pod(json!({}), ready("10.0.0.1")), "x", &[8000], &LABELS);
        assert_eq!(none.endpoints[0].containers_started, None);
    }

    #[test]
    fn the_engines_start_is_the_container_that_serves_a_target_port() {
        let mut status = ready("10.0.0.1");
        status["containerStatuses"] = json!([
            {"name": "vllm", "ready": true, "restartCount": 0, "image": "v", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}},
            {"name": "kv-relay", "ready": true, "restartCount": 3, "image": "r", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:20Z"}}}
        ]);
        let with_ports = |ports: serde_json::Value| {
            let mut p = pod(json!({}), status.clone());
            p.spec = Some(
                serde_json::from_value(json!({"containers": [
                    {"name": "vllm", "ports": ports},
                    {"name": "kv-relay"}
                ]}))
                .unwrap(),
            );
            PodEndpoints::of(&p, "x", &[8000], &LABELS).endpoints[0].clone()
        };
        let e = with_ports(json!([{"containerPort": 8000}, {"containerPort": 5557}]));
        assert_eq!(
            e.engine_started,
            Some(1_767_225_610),
            "vllm's, not the relay's"
        );
        assert_eq!(
            e.containers_started,
            Some(1_767_225_620),
            "Kthena's: the newest"
        );
        // No container declares the target port: any container's start counts.
        let e = with_ports(json!([{"containerPort": 9000}]));
        assert_eq!(e.engine_started, Some(1_767_225_620));
        let e = with_ports(json!([]));
        assert_eq!(e.engine_started, Some(1_767_225_620));
    }

    #[test]
    fn one_endpoint_per_port_named_after_the_pod() {
        let labels = PodLabels {
            role: Some("role".into()),
            model: Some("model".into()),
            pd: None,
            keep: Vec::new(),
            kv_events: None,
        };
        let one = PodEndpoints::of(&pod(json!({}), ready("10.0.0.1")), "x", &[8000], &labels);
        let e = &one.endpoints[0];
        assert_eq!(e.id.to_string(), "ns/vllm-0");
        assert_eq!(e.address.to_string(), "10.0.0.1:8000");
        assert_eq!(e.generation, "u1");
        assert_eq!(e.role.as_deref(), Some("decode"));
        assert_eq!(e.models, ["llama"]);
        let two = PodEndpoints::of(
            &pod(json!({}), ready("fd00::1")),
            "x",
            &[8000, 8001],
            &LABELS,
        );
        let names: Vec<String> = two.endpoints.iter().map(|e| e.id.to_string()).collect();
        assert_eq!(names, ["ns/vllm-0:8000", "ns/vllm-0:8001"]);
        assert_eq!(two.endpoints[1].address.to_string(), "[fd00::1]:8001");
        assert!(two.endpoints[0].models.is_empty() && two.endpoints[0].role.is_none());
    }

    #[test]
    fn pd_group_keeps_the_labels_it_reads_and_names_the_role() {
        let group = PdGroup::try_new(
            "group".into(),
            [("role".to_string(), "prefill".to_string())].into(),
            [("role".to_string(), "decode".to_string())].into(),
        )
        .unwrap();
        let labels = PodLabels {
            role: Some("model".into()),
            model: None,
            pd: Some(group),
            keep: Vec::new(),
            kv_events: None,
        };
        let grouped = pod(
            json!({"labels": {"app": "vllm", "role": "decode", "group": "g1"}}),
            ready("10.0.0.1"),
        );
        let e = &PodEndpoints::of(&grouped, "x", &[8000], &labels).endpoints[0];
        let kept: Vec<_> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            kept,
            ["group=g1", "role=decode"],
            "app is not read by the group"
        );
        assert_eq!(e.role.as_deref(), Some("decode"), "pdGroup names the role");
        // No group value: no role, whatever roleLabel says.
        let e = &PodEndpoints::of(&pod(json!({}), ready("10.0.0.1")), "x", &[8000], &labels)
            .endpoints[0];
        assert!(e.role.is_none());
        assert_eq!(e.labels.len(), 1);
    }
}
