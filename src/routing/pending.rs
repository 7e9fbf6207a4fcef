//! Routed requests waiting for their completion to be reported by another source.
//!
//! When the routing ext_proc stream ends after the request phase, the response is seen by
//! another source: Envoy's access log (the recommended `envoy/envoy.yaml`) or a second filter in
//! `observability_mode` (`envoy/envoy-observer.yaml`), neither delaying it. The routing stream
//! deposits its [`Ticket`] here under a route key, which it also puts in the request's
//! `envoy.lb` metadata; the other source claims the route by that key (else by the request's
//! `x-request-id`) when the response ends, or drops it on abort. The key is the request id,
//! unless a route already waits under that id (a client that reuses its ids): then it is the id
//! with `~N` appended, N from a process-wide counter, so two requests with one id are still told
//! apart by their metadata. Unclaimed entries expire after `picker.responseTimeoutSeconds`,
//! which releases their in-flight count without recording anything. Sharded by key; no lock
//! spans all shards.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Ticket;

const SHARDS: usize = 16;

/// What [`PendingRoutes::expire`] dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub routes: usize,
    /// Of them, routes holding a tentative record (rolled back).
    pub tentative: usize,
}

#[derive(Debug)]
pub struct PendingRoutes {
    shards: Vec<Mutex<HashMap<String, (Instant, Ticket)>>>,
    hasher: RandomState,
    ttl: Duration,
    /// Numbers the keys of routes whose request id was already waiting.
    repeats: AtomicU64,
}

impl PendingRoutes {
    pub fn new(ttl: Duration) -> PendingRoutes {
        PendingRoutes {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            ttl,
            repeats: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, (Instant, Ticket)>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// Keeps `route` until claimed or expired; returns its key: `request_id`, or, when a route
    /// already waits under it, `request_id~N` (never replacing a waiting route).
    pub fn insert(&self, request_id: &str, route: Ticket) -> String {
        let deadline = Instant::now() + self.ttl;
        let mut key = request_id.to_string();
        loop {
            let mut shard = self.shard(&key).lock();
            if !shard.contains_key(&key) {
                shard.insert(key.clone(), (deadline, route));
                return key;
            }
            drop(shard);
            let n = self.repeats.fetch_add(1, Ordering::Relaxed);
            key = format!("{request_id}~{n}");
        }
    }

    /// Claims the route waiting under `key` (a route key, or a request id, which is the key of
    /// the first route with that id).
    pub fn take(&self, key: &str) -> Option<Ticket> {
        self.shard(key).lock().remove(key).map(|(_, r)| r)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired entries (releasing their in-flight counts and tentative holds); returns
    /// how many, and how many of them held a tentative record.
    pub fn expire(&self, now: Instant) -> Expired {
        let mut out = Expired::default();
        for shard in &self.shards {
            let mut shard = shard.lock();
            shard.retain(|_, (deadline, route)| {
                let keep = *deadline > now;
                if !keep {
                    out.routes += 1;
                    out.tentative += usize::from(route.tentative.is_some());
                }
                keep
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::InflightGuard;
    use crate::hashing::BlockHash;
    use crate::testing::{PORTS, addr, endpoint, router};

    #[test]
    fn a_reused_request_id_gets_its_own_key_and_replaces_nothing() {
        let router = router();
        let pod = endpoint(&router, addr(PORTS[0]));
        let route = |tag: u64| Ticket {
            model: "m".to_string(),
            hashes: vec![BlockHash(tag)],
            guard: InflightGuard::new(pod.clone(), &router.metrics),
            tentative: None,
            predicted_blocks: 0,
        };
        let pending = PendingRoutes::new(Duration::from_secs(60));
        assert_eq!(pending.insert("req", route(1)), "req");
        let second = pending.insert("req", route(2));
        let third = pending.insert("req", route(3));
        assert!(second.starts_with("req~") && third.starts_with("req~"));
        assert_ne!(second, third);
        assert_eq!(pending.len(), 3);
        assert_eq!(pod.inflight(), 3, "no waiting route was dropped");
        assert_eq!(pending.take(&third).unwrap().hashes, [BlockHash(3)]);
        assert_eq!(pending.take("req").unwrap().hashes, [BlockHash(1)]);
        assert_eq!(pending.take(&second).unwrap().hashes, [BlockHash(2)]);
        assert!(pending.is_empty());
        assert_eq!(pod.inflight(), 0);
    }
}
