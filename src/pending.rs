//! Routed requests waiting for their completion to be reported by another source.
//!
//! When the routing ext_proc stream ends after the request phase, the response is seen by
//! another source: Envoy's access log (the recommended `envoy/envoy.yaml`) or a second filter in
//! `observability_mode` (`envoy/envoy-observer.yaml`), neither delaying it. They find the route
//! by the request's `x-request-id`: the routing stream deposits its [`PendingRoute`] here and
//! the other source claims it when the response ends (or drops it on abort). Unclaimed entries
//! expire after `picker.responseTimeoutSeconds`, which releases their in-flight count without
//! recording anything. Sharded by request id; no lock spans all shards.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::endpoints::InflightGuard;
use crate::hashing::BlockHash;

const SHARDS: usize = 16;

/// What completion needs to record a routed request.
#[derive(Debug)]
pub struct PendingRoute {
    pub model: String,
    pub hashes: Vec<BlockHash>,
    /// Keeps the primary pod's in-flight count until completion or abort.
    pub guard: InflightGuard,
}

#[derive(Debug)]
pub struct PendingRoutes {
    shards: Vec<Mutex<HashMap<String, (Instant, PendingRoute)>>>,
    hasher: RandomState,
    ttl: Duration,
}

impl PendingRoutes {
    pub fn new(ttl: Duration) -> PendingRoutes {
        PendingRoutes {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            ttl,
        }
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, (Instant, PendingRoute)>> {
        &self.shards[self.hasher.hash_one(id) as usize % SHARDS]
    }

    pub fn insert(&self, request_id: String, route: PendingRoute) {
        let deadline = Instant::now() + self.ttl;
        self.shard(&request_id)
            .lock()
            .insert(request_id, (deadline, route));
    }

    pub fn take(&self, request_id: &str) -> Option<PendingRoute> {
        self.shard(request_id)
            .lock()
            .remove(request_id)
            .map(|(_, r)| r)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired entries; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut n = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|_, (deadline, _)| *deadline > now);
            n += before - shard.len();
        }
        n
    }
}
