//! The routing floor of `prefix-bench overhead`: the work any prefix-cache router must do per
//! request, done with prefix-picker's pure core and nothing else, so the overhead table can tell
//! the picker's platform apart from routing itself.
//!
//! Per request: the body parsed and its prompt rendered ([`InferenceRequest::parse_for`], the
//! scheduler's rendering), the prompt hashed and the pick decided by a [`Scheduler`] built from
//! the same config file as the picker row's (the shipped affinity mode over the same pods), the
//! decision committed (the affinity pick's share, the tentative hold), the primary's in-flight
//! count held until the request ends; at a 2xx completion the prompt recorded for the pod that
//! served (Envoy's report, else the primary), the hold released. Not done, because it is the
//! picker's platform and not routing: Prometheus metrics, logging, the endpoint store and
//! discovery, engine scrapes (every pod's stats stay at zero, and the index keeps its configured
//! capacity where `engineBudget` would size it from the engine), the admin listener, config
//! reloads, sessions, the subset hint, generating `x-request-id`, unguessable route keys and the
//! expiry of routes never completed.
//!
//! [`crate::routing_floor::service`] puts it behind the no-op's ext_proc protocol.

pub mod service;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use anyhow::Context;
use parking_lot::Mutex;
use prefix_picker::config::Config;
use prefix_picker::hashing::BlockHash;
use prefix_picker::prefix_index::{PodHandle, PodSlot};
use prefix_picker::prompt::Rendering;
use prefix_picker::request::{Api, InferenceRequest};
use prefix_picker::scheduler::affinity::{RecentPicks, rendezvous_key};
use prefix_picker::scheduler::{
    Candidate, EngineStats, RouteRequest, Scheduler, TentativeHold, Unscored,
};

/// A pod as the floor's scheduler sees it: its index handle, address and in-flight count.
#[derive(Debug)]
pub struct FloorPod {
    handle: PodHandle,
    pub address: SocketAddr,
    /// `ip:port`, as the pick names it.
    host: String,
    label: String,
    inflight: AtomicI64,
    recent: RecentPicks,
    rendezvous: u64,
}

impl Candidate for FloorPod {
    fn slot(&self) -> PodSlot {
        self.handle.slot()
    }

    fn index_pod(&self) -> Option<&PodHandle> {
        Some(&self.handle)
    }

    fn inflight(&self) -> i64 {
        self.inflight.load(Ordering::Relaxed)
    }

    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }

    fn recent(&self) -> &RecentPicks {
        &self.recent
    }

    fn rendezvous(&self) -> u64 {
        self.rendezvous
    }

    fn label(&self) -> &str {
        &self.label
    }
}

/// A routed request until it ends: what its completion records. Dropping it (an abort)
/// releases the primary's in-flight count and the tentative hold, recording nothing.
#[derive(Debug)]
pub struct FloorTicket {
    model: String,
    hashes: Vec<BlockHash>,
    primary: Arc<FloorPod>,
    _hold: Option<TentativeHold>,
}

impl Drop for FloorTicket {
    fn drop(&mut self) {
        self.primary.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A routed request: the pick as Envoy reads it (`ip:port[,ip:port...]`, primary first) and
/// the ticket that ends it.
#[derive(Debug)]
pub struct FloorRoute {
    pub destination: String,
    pub ticket: FloorTicket,
}

/// The floor's state, shared by every stream: the scheduler (its prefix index), the pods, and
/// the routes waiting for an access-log entry.
#[derive(Debug)]
pub struct RoutingFloor {
    scheduler: Scheduler,
    rendering: Rendering,
    pods: Vec<Arc<FloorPod>>,
    pending: Mutex<HashMap<u64, FloorTicket>>,
    next_key: AtomicU64,
    /// Requests routed, and completions recorded: every 1,000th route logs both (stderr), so a
    /// run's log shows that completions arrive.
    routed: AtomicU64,
    recorded: AtomicU64,
}

impl RoutingFloor {
    /// The floor for a picker config file's text: its scheduler (and `picker.affinity`), its
    /// static endpoints; every other key is ignored.
    pub fn from_config(text: &str) -> anyhow::Result<RoutingFloor> {
        let config = Config::parse(text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("the routing floor's config")?;
        anyhow::ensure!(
            !config.endpoints.is_empty(),
            "the routing floor's config lists no endpoints"
        );
        let scheduler = Scheduler::new(
            config.scheduler,
            config.picker.max_endpoints,
            config.picker.seed,
        );
        let index = scheduler.prefix_cache().index().clone();
        let pods = config
            .endpoints
            .iter()
            .map(|e| {
                Arc::new(FloorPod {
                    handle: index.add_pod(),
                    address: e.address,
                    host: e.address.to_string(),
                    label: format!("{}/{}", e.namespace, e.name),
                    inflight: AtomicI64::new(0),
                    recent: RecentPicks::default(),
                    rendezvous: rendezvous_key(&e.address),
                })
            })
            .collect();
        Ok(RoutingFloor {
            rendering: scheduler.config().rendering(),
            scheduler,
            pods,
            pending: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            routed: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        })
    }

    /// Routes a request of `path` with `body`: parsed, rendered, hashed, decided over every
    /// pod, committed. `None` for what the floor does not route (not an inference API, a body
    /// that does not parse, no pod passing the filters): its reply carries no pick.
    pub fn route(&self, path: &str, body: &[u8]) -> Option<FloorRoute> {
        let api = Api::from_path(path)?;
        let parsed = InferenceRequest::parse_for(api, body, self.rendering).ok()?;
        let request = RouteRequest {
            model: &parsed.model,
            prompt: match &parsed.prompt {
                Ok(p) => Ok(p.as_str()),
                Err(reason) => Err(Unscored::NoPrompt(*reason)),
            },
            salt: parsed.salt.as_ref(),
            session_pod: None,
            hashes: None,
            engine_tokens: None,
            kv_blocks: None,
            headers: &[],
        };
        let mut decision = self.scheduler.schedule(request, self.pods.clone()).ok()?;
        let hold = self.scheduler.commit(&parsed.model, &decision);
        let primary = decision.primary().clone();
        primary.inflight.fetch_add(1, Ordering::Relaxed);
        let routed = self.routed.fetch_add(1, Ordering::Relaxed) + 1;
        if routed % 1000 == 0 {
            let recorded = self.recorded.load(Ordering::Relaxed);
            eprintln!("routing-floor: routed={routed} recorded={recorded}");
        }
        let destination = decision
            .ranked
            .iter()
            .map(|p| p.host.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Some(FloorRoute {
            destination,
            ticket: FloorTicket {
                model: parsed.model,
                hashes: std::mem::take(&mut decision.hashes),
                primary,
                _hold: hold,
            },
        })
    }

    /// Ends a routed request: a 2xx records its prompt for the pod that served (`served`, else
    /// the primary; an address outside the pods records nothing). Returns the entries added.
    pub fn complete(
        &self,
        ticket: FloorTicket,
        status: Option<u32>,
        served: Option<SocketAddr>,
    ) -> usize {
        if !status.is_some_and(|s| (200..300).contains(&s)) || ticket.hashes.is_empty() {
            return 0;
        }
        let pod = match served {
            None => &ticket.primary,
            Some(a) => match self.pods.iter().find(|p| p.address == a) {
                Some(p) => p,
                None => return 0,
            },
        };
        self.recorded.fetch_add(1, Ordering::Relaxed);
        self.scheduler
            .record(&ticket.model, &ticket.hashes, &pod.handle)
            .inserted
    }

    /// Leaves `ticket` for an access-log entry to claim; returns the route key it waits under.
    pub fn park(&self, ticket: FloorTicket) -> String {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(key, ticket);
        key.to_string()
    }

    /// The ticket waiting under `key`, taken.
    pub fn claim(&self, key: &str) -> Option<FloorTicket> {
        self.pending.lock().remove(&key.parse().ok()?)
    }

    /// Requests routed and not yet ended, per pod address.
    pub fn inflight(&self) -> Vec<(SocketAddr, i64)> {
        self.pods
            .iter()
            .map(|p| (p.address, p.inflight()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config of the affinity mode over three pods.
    fn floor() -> RoutingFloor {
        RoutingFloor::from_config(
            "endpoints:\n\
             - {name: a, address: \"127.0.0.1:8001\"}\n\
             - {name: b, address: \"127.0.0.1:8002\"}\n\
             - {name: c, address: \"127.0.0.1:8003\"}\n\
             picker: {affinity: {}}\n",
        )
        .unwrap()
    }

    fn chat(i: usize) -> Vec<u8> {
        let system = "You are a careful assistant. ".repeat(40);
        serde_json::to_vec(&serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {i}")},
        ]}))
        .unwrap()
    }

    fn primary(destination: &str) -> SocketAddr {
        destination.split(',').next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_recorded_prompt_goes_back_to_the_pod_that_served_it() {
        let floor = floor();
        let first = floor.route("/v1/chat/completions", &chat(1)).unwrap();
        assert!(!first.ticket.hashes.is_empty());
        let picked = primary(&first.destination);
        assert_eq!(
            floor.inflight().iter().find(|(a, _)| *a == picked),
            Some(&(picked, 1))
        );
        // Envoy fell back to another pod, which served: the prompt is recorded for that one.
        let served: SocketAddr = if picked.port() == 8003 {
            "127.0.0.1:8001"
        } else {
            "127.0.0.1:8003"
        }
        .parse()
        .unwrap();
        assert!(floor.complete(first.ticket, Some(200), Some(served)) > 0);
        assert!(floor.inflight().iter().all(|(_, n)| *n == 0));
        let next = floor.route("/v1/chat/completions", &chat(2)).unwrap();
        assert_eq!(primary(&next.destination), served);
    }

    #[test]
    fn failures_and_aborts_record_nothing_and_release_the_pod() {
        let floor = floor();
        let route = floor.route("/v1/chat/completions", &chat(1)).unwrap();
        assert_eq!(floor.complete(route.ticket, Some(503), None), 0);
        let route = floor.route("/v1/chat/completions", &chat(1)).unwrap();
        let key = floor.park(route.ticket);
        assert!(floor.claim("not-a-key").is_none());
        drop(floor.claim(&key).unwrap());
        assert!(floor.claim(&key).is_none());
        assert!(floor.inflight().iter().all(|(_, n)| *n == 0));
        // Nothing was recorded: the same prompt is no hit anywhere.
        let again = floor.route("/v1/chat/completions", &chat(1)).unwrap();
        let unknown = "127.0.0.1:9".parse().ok();
        assert_eq!(floor.complete(again.ticket, Some(200), unknown), 0);
    }

    #[test]
    fn what_is_not_an_inference_request_is_not_routed() {
        let floor = floor();
        assert!(floor.route("/v1/models", b"").is_none());
        assert!(floor.route("/v1/completions", b"{not json").is_none());
        assert!(RoutingFloor::from_config("picker: {}\n").is_err());
    }
}
