//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`), read
//! for the two fields discovery needs: `spec.selector.matchLabels` (which pods) and
//! `spec.targetPorts[].number` (which ports). Other fields (`endpointPickerRef`, status) are
//! ignored. A pool whose selector is empty or whose ports are invalid selects nothing (logged).

use std::collections::BTreeMap;

use kube::core::{ApiResource, NotUsed, Object};
use serde::{Deserialize, Serialize};

use super::target::{Target, TargetError};

/// `spec` of an InferencePool, the parts discovery reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    #[serde(default)]
    pub selector: PoolSelector,
    #[serde(default)]
    pub target_ports: Vec<PoolPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct PoolPort {
    pub number: i64,
}

/// An InferencePool object.
pub type InferencePool = Object<InferencePoolSpec, NotUsed>;

/// The only InferencePool API group watched (version `v1`).
pub const GROUP: &str = "inference.networking.k8s.io";

/// The API coordinates of InferencePool.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: "inference.networking.k8s.io/v1".into(),
        kind: "InferencePool".into(),
        plural: "inferencepools".into(),
    }
}

/// The pods and ports a pool selects.
pub fn target(pool: &InferencePool) -> Result<Target, TargetError> {
    let selector = Target::match_labels(&pool.spec.selector.match_labels)?;
    let ports: Vec<i64> = pool.spec.target_ports.iter().map(|p| p.number).collect();
    Target::new(selector, &ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pool_yields_its_selector_and_ports() {
        let pool: InferencePool = serde_json::from_value(json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                     "targetPorts": [{"number": 8000}, {"number": 8001}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}},
            "status": {"parents": []}
        }))
        .unwrap();
        let t = target(&pool).unwrap();
        assert_eq!(t.selector.to_string(), "app=vllm");
        assert_eq!(t.ports, [8000, 8001]);
        let mut empty = pool.clone();
        empty.spec.selector.match_labels.clear();
        assert_eq!(target(&empty), Err(TargetError::EmptySelector));
        let mut bad = pool;
        bad.spec.target_ports = vec![PoolPort { number: 0 }];
        assert_eq!(target(&bad), Err(TargetError::Port(0)));
    }
}
