//! Applying stream entries to the local index, with the same LRU semantics as a local record.
//!
//! An entry is skipped when it is this replica's own (same replica id), and dropped (counted by
//! reason) when it cannot be decoded, was hashed with other `blockSizeToHash`/`maxBlocksToMatch`,
//! names a pod this replica's discovery does not know (pod removals stay local: every replica
//! watches discovery itself), or was recorded for another incarnation of the pod (both
//! generations known and different: the Kubernetes UID, a static endpoint's `generation:`, else
//! its engine's start time, see [`crate::endpoints`]). Pods are found by their `namespace/name` label in a map
//! rebuilt only when the endpoint snapshot changes.

use std::collections::HashMap;
use std::sync::Arc;

use super::index::LocalIndex;
use super::metrics::{DropReason, SyncMetrics};
use super::record::{self, HashParams};
use crate::endpoints::{Endpoint, EndpointSet};
use crate::hashing::BlockHash;

/// What happened to one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Recorded for a known pod.
    Recorded,
    /// This replica's own entry.
    Own,
    Dropped(DropReason),
}

/// Applies entries; owned by the tailer task (not shared).
#[derive(Debug)]
pub struct Applier {
    router: Arc<dyn LocalIndex>,
    replica: u64,
    params: HashParams,
    metrics: SyncMetrics,
    pods: (Arc<EndpointSet>, HashMap<String, Arc<Endpoint>>),
    hashes: Vec<BlockHash>,
}

impl Applier {
    pub fn new(
        router: Arc<dyn LocalIndex>,
        replica: u64,
        params: HashParams,
        metrics: SyncMetrics,
    ) -> Applier {
        Applier {
            router,
            replica,
            params,
            metrics,
            pods: (Arc::default(), HashMap::new()),
            hashes: Vec::new(),
        }
    }

    /// Applies one entry's payload and counts the outcome.
    pub fn apply(&mut self, payload: &[u8]) -> Applied {
        let outcome = self.outcome(payload);
        match outcome {
            Applied::Recorded => self.metrics.applied.inc(),
            Applied::Own => {}
            Applied::Dropped(reason) => self.metrics.drop(reason, 1),
        }
        outcome
    }

    fn outcome(&mut self, payload: &[u8]) -> Applied {
        let Ok(r) = record::decode(payload, &mut self.hashes) else {
            return Applied::Dropped(DropReason::Malformed);
        };
        if r.replica == self.replica {
            return Applied::Own;
        }
        if r.params != self.params {
            return Applied::Dropped(DropReason::ParamsMismatch);
        }
        let snapshot = self.router.endpoints().snapshot();
        if !Arc::ptr_eq(&snapshot, &self.pods.0) {
            let map = snapshot
                .all()
                .iter()
                .map(|e| (e.label.clone(), e.clone()))
                .collect();
            self.pods = (snapshot, map);
        }
        let Some(endpoint) = self.pods.1.get(r.pod) else {
            return Applied::Dropped(DropReason::UnknownPod);
        };
        let ours = endpoint.generation();
        if !ours.is_empty() && !r.generation.is_empty() && *ours != *r.generation {
            return Applied::Dropped(DropReason::StaleGeneration);
        }
        if !self.hashes.is_empty() {
            self.router.record_replica(r.model, &self.hashes, endpoint);
        }
        Applied::Recorded
    }
}
