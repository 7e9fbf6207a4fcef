//! `InferenceObjective`s, watched for flow control's priorities
//! (`discovery.kubernetes.inferenceObjectives: true`): each object's name is an objective a
//! request names in `x-gateway-inference-objective`, its `spec.priority` (absent: 0) the band
//! it queues in ([`crate::flow_control`]). Two API groups are watched, in the discovery
//! namespace: llm-d's `llm-d.ai/v1alpha2` (where the type moved) and GIE's
//! `inference.networking.x-k8s.io/v1alpha2`; a name in both takes llm-d's. With an
//! `inferencePool` configured, only objectives whose `spec.poolRef.name` is that pool count. A
//! group whose CRD is not installed is warned about once and retried with the watcher's
//! backoff; the other still counts.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::flow_control::ObjectivePriorities;

/// The groups watched (version `v1alpha2`), the first winning a name both define.
pub const GROUPS: [&str; 2] = ["llm-d.ai", "inference.networking.x-k8s.io"];

/// The API coordinates of InferenceObjective in `group`.
pub fn api_resource(group: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1alpha2".into(),
        api_version: format!("{group}/v1alpha2"),
        kind: "InferenceObjective".into(),
        plural: "inferenceobjectives".into(),
    }
}

/// The priority of `object` when it applies to `pool` (any pool when `None`): its
/// `spec.priority` (absent: 0, as GIE's; out of range: clamped).
pub fn priority(object: &DynamicObject, pool: Option<&str>) -> Option<i32> {
    let spec = object.data.get("spec");
    if let Some(pool) = pool {
        let named = spec
            .and_then(|s| s.get("poolRef"))
            .and_then(|r| r.get("name"))
            .and_then(|n| n.as_str());
        if named != Some(pool) {
            return None;
        }
    }
    let p = spec
        .and_then(|s| s.get("priority"))
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    Some(p.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
}

/// What the watches know: each group's objectives, and the relist in progress per group.
#[derive(Debug, Default)]
pub struct Objectives {
    groups: [HashMap<String, i32>; 2],
    relist: [Option<HashMap<String, i32>>; 2],
}

impl Objectives {
    /// Applies one watch event of group `g`; `true` when the merged map may have changed.
    pub fn apply(&mut self, g: usize, event: Event<DynamicObject>, pool: Option<&str>) -> bool {
        match event {
            Event::Init => {
                self.relist[g] = Some(HashMap::new());
                false
            }
            Event::InitApply(o) => {
                if let (Some(list), Some(p)) = (self.relist[g].as_mut(), priority(&o, pool)) {
                    list.insert(o.name_any(), p);
                }
                false
            }
            Event::InitDone => {
                self.groups[g] = self.relist[g].take().unwrap_or_default();
                true
            }
            Event::Apply(o) => {
                match priority(&o, pool) {
                    Some(p) => self.groups[g].insert(o.name_any(), p),
                    None => self.groups[g].remove(&o.name_any()),
                };
                true
            }
            Event::Delete(o) => {
                self.groups[g].remove(&o.name_any());
                true
            }
        }
    }

    /// Every objective's priority, the first group's winning a name both define.
    pub fn merged(&self) -> HashMap<String, i32> {
        let mut out = HashMap::new();
        for group in &self.groups {
            for (name, p) in group {
                out.entry(name.clone()).or_insert(*p);
            }
        }
        out
    }
}

/// Watches both groups' objectives in `namespace` until `token` is cancelled, keeping
/// `priorities` current.
pub async fn watch(
    client: Client,
    namespace: String,
    pool: Option<String>,
    priorities: Arc<ObjectivePriorities>,
    token: CancellationToken,
) {
    let streams = GROUPS.iter().enumerate().map(|(g, group)| {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &api_resource(group));
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |e| (g, e))
            .boxed()
    });
    let mut events = futures_util::stream::select_all(streams);
    let mut state = Objectives::default();
    let mut warned = [false; 2];
    tracing::info!(namespace = %namespace, pool = pool.as_deref().unwrap_or(""), "watching InferenceObjectives");
    loop {
        let (g, event) = tokio::select! {
            _ = token.cancelled() => break,
            next = events.next() => match next {
                Some(e) => e,
                None => break,
            },
        };
        match event {
            Ok(e) => {
                warned[g] = false;
                if state.apply(g, e, pool.as_deref()) {
                    let merged = state.merged();
                    tracing::debug!(objectives = merged.len(), "InferenceObjective priorities");
                    priorities.replace(merged);
                }
            }
            Err(e) if !warned[g] => {
                warned[g] = true;
                tracing::warn!(group = GROUPS[g], error = %e, "InferenceObjective watch error (is the CRD installed, and may the picker list it?); retrying with backoff");
            }
            Err(e) => {
                tracing::debug!(group = GROUPS[g], error = %e, "InferenceObjective watch error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objective(name: &str, pool: &str, priority: Option<i64>) -> DynamicObject {
        let mut spec = serde_json::json!({"poolRef": {"name": pool}});
        if let Some(p) = priority {
            spec["priority"] = p.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": "llm"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn priority_is_the_spec_s_for_the_pool_zero_when_absent() {
        assert_eq!(
            priority(&objective("a", "p", Some(10)), Some("p")),
            Some(10)
        );
        assert_eq!(priority(&objective("a", "p", None), Some("p")), Some(0));
        assert_eq!(
            priority(&objective("a", "other", Some(10)), Some("p")),
            None
        );
        assert_eq!(priority(&objective("a", "other", Some(-3)), None), Some(-3));
        assert_eq!(
            priority(&objective("a", "p", Some(1 << 40)), None),
            Some(i32::MAX)
        );
    }

    #[test]
    fn watch_events_keep_the_map_and_llm_d_wins_a_name_both_define() {
        let mut s = Objectives::default();
        let pool = Some("p");
        assert!(!s.apply(1, Event::Init, pool));
        s.apply(1, Event::InitApply(objective("chat", "p", Some(5))), pool);
        s.apply(1, Event::InitApply(objective("batch", "p", Some(-1))), pool);
        s.apply(
            1,
            Event::InitApply(objective("elsewhere", "q", Some(9))),
            pool,
        );
        assert!(s.merged().is_empty(), "nothing before the list is done");
        assert!(s.apply(1, Event::InitDone, pool));
        assert_eq!(
            s.merged(),
            HashMap::from([("chat".into(), 5), ("batch".into(), -1)])
        );
        s.apply(0, Event::Apply(objective("chat", "p", Some(50))), pool);
        assert_eq!(s.merged()["chat"], 50, "llm-d.ai's");
        s.apply(0, Event::Delete(objective("chat", "p", Some(50))), pool);
        assert_eq!(s.merged()["chat"], 5);
        // Moved to another pool: gone.
        s.apply(1, Event::Apply(objective("batch", "q", Some(-1))), pool);
        assert!(!s.merged().contains_key("batch"));
        // A relist replaces the group's objects.
        s.apply(1, Event::Init, pool);
        s.apply(1, Event::InitDone, pool);
        assert!(s.merged().is_empty());
    }
}
