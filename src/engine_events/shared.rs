//! Engine truth fed by the shared socket: the picker binds one SUB socket
//! ([`crate::kv_events::shared`], `picker.kvEvents.bind`, llm-d's `kvEventsConfig.zmqEndpoint`),
//! every engine's publisher connects to it, and each message goes to the pod its topic names
//! ([`TopicPod`]: `kv@<pod>@<model>`), into that pod's engine view through the same consumer a
//! pod's own subscriber feeds ([`Consumer`]): the same events applied, the same metrics, live
//! on evidence (from the pod's first batch).
//!
//! - Which pod: the topic's pod identifier is matched against the pod set as llm-d's engines
//!   write it: `IP:port` (llm-d's guides: `kv@$(POD_IP):$(POD_PORT)@<model>`) is the pod with
//!   that address; an IP alone (llm-d's earlier guides) the one pod with that IP; anything else
//!   a pod name, `namespace/name` or `name` (one pod of that name). An identifier that names no
//!   pod, or several, drops the message, counted
//!   (`prefix_picker_kv_events_shared_total{outcome="unknown_pod"|"ambiguous_pod"}`) and logged
//!   once per identifier (the first [`MAX_WARNED`]). A pod with a publisher of its own
//!   (`kvEventsEndpoint`, `kvEventsPort`) is read there: the shared socket's messages for it
//!   are dropped (`own_publisher`), so one view never has two writers. Each topic's pod is
//!   resolved once per pod set (at most [`MAX_ROUTES`] topics remembered).
//! - Per pod, a stream: the publisher's sequence ([`Sequence`]); no replay (an engine that
//!   connects publishes no replay endpoint the picker could know, as llm-d's global socket),
//!   so a gap resets the view (`NoReplayEndpoint`) and a sequence that goes back is a
//!   restarted engine (its view and its estimate dropped). A message that does not decode does
//!   not advance the sequence. The pod's `connected` gauge is 1 from its first message: the
//!   socket cannot tell which publisher a lost connection was, so a view fed here stays as it
//!   is until its engine's sequence says otherwise or the pod leaves the set.
//! - Messages that are not `[topic, seq, payload]` or whose topic is outside the filter are
//!   counted (`malformed`, `wrong_topic`) and logged once each. Never fatal.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus::IntCounter;
use tokio_util::sync::CancellationToken;

use super::{Consumer, STATS_PERIOD};
use crate::endpoints::{Endpoint, EndpointSet, Endpoints};
use crate::kv_events::event::{Limits, decode_batch};
use crate::kv_events::sequence::{Sequence, Verdict};
use crate::kv_events::shared::{Message, Refusal, SharedSocket};
use crate::kv_events::subscriber::{ResetReason, SubscriberStats, Update};
use crate::kv_events::topic::TopicPod;
use crate::metrics::engine_truth::{EngineTruthMetrics, SharedOutcome};
use crate::prefix_index::PrefixIndex;

/// Topics whose pod is remembered (within one pod set); past it they are forgotten and resolved
/// again: a publisher that invents topics costs a lookup per message, not memory.
pub const MAX_ROUTES: usize = 4096;
/// Unknown pod identifiers logged (once each); past it they are only counted.
pub const MAX_WARNED: usize = 1024;

/// Reads the shared socket until `shutdown`, feeding the views of the pods its topics name.
pub async fn follow(
    mut socket: SharedSocket,
    endpoints: Arc<Endpoints>,
    metrics: EngineTruthMetrics,
    shutdown: CancellationToken,
) {
    tracing::info!(bound = %socket.bound(), "KV events: the shared socket is bound; engines connect to it and name their pod in their topic");
    let mut streams = Streams::new(endpoints, metrics, Limits::default());
    let mut tick = tokio::time::interval(STATS_PERIOD);
    let mut warned_recv = false;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => streams.tick(),
            received = socket.recv() => match received {
                Ok(Ok(message)) => streams.on_message(message),
                Ok(Err(refusal)) => streams.refused(&refusal),
                // One publisher's connection broke (the others are served still).
                Err(e) => {
                    if !std::mem::replace(&mut warned_recv, true) {
                        tracing::warn!(error = %e, "KV events: a connection to the shared socket failed (warned once)");
                    }
                }
            },
        }
    }
    streams.stop();
}

/// What a topic's messages become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The stream of the pod at this key (its endpoint's address in memory).
    Pod(usize),
    /// Dropped, counted as this.
    Dropped(SharedOutcome),
}

/// Which pods a topic's pod identifier names.
#[derive(Debug)]
enum Found<'s> {
    One(&'s Arc<Endpoint>),
    None,
    Several,
}

/// The pod `id` names in `set`: an `IP:port` the pod with that address, an IP the one pod
/// with that IP, else `namespace/name` or `name`.
fn find_pod<'s>(set: &'s EndpointSet, id: &str) -> Found<'s> {
    if let Ok(address) = id.parse::<SocketAddr>() {
        return set.by_address(&address).map_or(Found::None, Found::One);
    }
    let bare = id.strip_prefix('[').and_then(|v6| v6.strip_suffix(']'));
    if let Ok(ip) = bare.unwrap_or(id).parse::<IpAddr>() {
        return one(set.all().iter().filter(|e| e.spec.address.ip() == ip));
    }
    if let Some((namespace, name)) = id.split_once('/') {
        return one(set
            .all()
            .iter()
            .filter(|e| e.spec.id.namespace == namespace && e.spec.id.name == name));
    }
    one(set.all().iter().filter(|e| e.spec.id.name == id))
}

fn one<'s>(mut pods: impl Iterator<Item = &'s Arc<Endpoint>>) -> Found<'s> {
    match (pods.next(), pods.next()) {
        (Some(e), None) => Found::One(e),
        (None, _) => Found::None,
        (Some(_), Some(_)) => Found::Several,
    }
}

/// One pod's stream on the shared socket.
struct Lane {
    consumer: Consumer,
    seq: Sequence,
    stats: Arc<SubscriberStats>,
    warned_decode: bool,
    warned_unknown: bool,
}

impl Lane {
    fn new(endpoint: Arc<Endpoint>, index: Arc<PrefixIndex>, metrics: &EngineTruthMetrics) -> Lane {
        let stats = Arc::new(SubscriberStats::default());
        let mut consumer = Consumer::new(endpoint, index, metrics, stats.clone());
        // Its publisher is connected: it sent this message.
        consumer.apply(Update::Connected);
        Lane {
            consumer,
            seq: Sequence::default(),
            stats,
            warned_decode: false,
            warned_unknown: false,
        }
    }

    fn on_message(&mut self, seq: u64, payload: &[u8], limits: &Limits) {
        let stats = &self.stats;
        stats.received.fetch_add(1, Relaxed);
        let pod = &self.consumer.endpoint.label;
        let batch = match decode_batch(payload, limits) {
            Ok(batch) => batch,
            Err(e) => {
                stats.decode_errors.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned_decode, true) {
                    tracing::warn!(pod = %pod, seq, error = %e,
                        "KV events (shared socket): batch refused (warned once per pod; counted)");
                }
                self.consumer.sync_stats();
                return;
            }
        };
        if batch.unknown_events > 0 {
            stats
                .unknown_events
                .fetch_add(u64::from(batch.unknown_events), Relaxed);
            if !std::mem::replace(&mut self.warned_unknown, true) {
                tracing::warn!(pod = %pod, seq, count = batch.unknown_events,
                    "KV events (shared socket): events with an unknown tag skipped (warned once per pod)");
            }
        }
        match self.seq.check(seq) {
            Verdict::First | Verdict::Next => {}
            Verdict::Duplicate => return,
            Verdict::Gap { expected } => {
                stats.gaps.fetch_add(1, Relaxed);
                self.reset(ResetReason::NoReplayEndpoint {
                    expected,
                    received: seq,
                });
            }
            Verdict::Reset(reason) => self.reset(reason),
        }
        self.seq.delivered(seq);
        self.stats.delivered(batch.ts);
        self.consumer.apply(Update::Batch { seq, batch });
    }

    fn reset(&mut self, reason: ResetReason) {
        self.stats.resets.fetch_add(1, Relaxed);
        self.consumer.apply(Update::Reset { reason });
    }
}

/// The pods' streams, and where each topic goes.
struct Streams {
    endpoints: Arc<Endpoints>,
    metrics: EngineTruthMetrics,
    outcomes: [IntCounter; SharedOutcome::ALL.len()],
    limits: Limits,
    /// The pod set the routes were resolved on.
    set: Arc<EndpointSet>,
    routes: HashMap<Vec<u8>, Route>,
    lanes: HashMap<usize, Lane>,
    /// Pod identifiers logged as naming no pod (or several).
    warned: HashSet<String>,
    warned_malformed: bool,
    warned_topic: bool,
}

impl Streams {
    fn new(endpoints: Arc<Endpoints>, metrics: EngineTruthMetrics, limits: Limits) -> Streams {
        let outcomes = SharedOutcome::ALL.map(|o| metrics.shared.with_label_values(&[o.as_str()]));
        Streams {
            set: endpoints.snapshot(),
            endpoints,
            metrics,
            outcomes,
            limits,
            routes: HashMap::new(),
            lanes: HashMap::new(),
            warned: HashSet::new(),
            warned_malformed: false,
            warned_topic: false,
        }
    }

    fn count(&self, outcome: SharedOutcome) {
        let at = SharedOutcome::ALL.iter().position(|o| *o == outcome);
        if let Some(counter) = at.and_then(|at| self.outcomes.get(at)) {
            counter.inc();
        }
    }

    fn on_message(&mut self, message: Message) {
        self.follow_set();
        let route = match self.routes.get(&message.topic) {
            Some(route) => *route,
            None => {
                let route = self.resolve(&message.topic);
                if self.routes.len() >= MAX_ROUTES {
                    self.routes.clear();
                }
                self.routes.insert(message.topic, route);
                route
            }
        };
        match route {
            Route::Dropped(outcome) => self.count(outcome),
            Route::Pod(key) => {
                self.count(SharedOutcome::Routed);
                if let Some(lane) = self.lanes.get_mut(&key) {
                    lane.on_message(message.seq, &message.payload, &self.limits);
                }
            }
        }
    }

    fn refused(&mut self, refusal: &Refusal) {
        let (outcome, warned) = match refusal {
            Refusal::Topic(_) => (SharedOutcome::WrongTopic, &mut self.warned_topic),
            Refusal::Frames(_) | Refusal::SeqFrame(_) => {
                (SharedOutcome::Malformed, &mut self.warned_malformed)
            }
        };
        if !std::mem::replace(warned, true) {
            tracing::warn!(message = %refusal,
                "KV events (shared socket): message dropped (warned once; counted as {})", outcome.as_str());
        }
        self.count(outcome);
    }

    /// Where `topic`'s messages go in the current set; starts the pod's stream.
    fn resolve(&mut self, topic: &[u8]) -> Route {
        let topic = String::from_utf8_lossy(topic);
        let id = TopicPod::parse(&topic).pod;
        let (outcome, why) = match find_pod(&self.set, id) {
            Found::One(e) if e.spec.kv_events.is_some() => {
                return Route::Dropped(SharedOutcome::OwnPublisher);
            }
            Found::One(e) if e.engine.is_some() => {
                let key = Arc::as_ptr(e) as usize;
                if !self.lanes.contains_key(&key) {
                    tracing::info!(pod = %e.spec.id, topic = %topic, "KV events (shared socket): a pod's engine publishes");
                    let lane = Lane::new(e.clone(), self.endpoints.index().clone(), &self.metrics);
                    self.lanes.insert(key, lane);
                }
                return Route::Pod(key);
            }
            Found::One(_) | Found::None => (SharedOutcome::UnknownPod, "names no pod"),
            Found::Several => (SharedOutcome::AmbiguousPod, "names several pods"),
        };
        if self.warned.len() < MAX_WARNED && self.warned.insert(id.to_string()) {
            tracing::warn!(topic = %topic, pod = %id,
                "KV events (shared socket): the topic {why} (an IP:port, an IP or a pod name, kv@<pod>@<model>): its messages are dropped (logged once per pod identifier; counted as {})",
                outcome.as_str());
        }
        Route::Dropped(outcome)
    }

    /// Resolves topics again when the pod set changed; the streams of pods that left end.
    fn follow_set(&mut self) {
        let set = self.endpoints.snapshot();
        if Arc::ptr_eq(&set, &self.set) {
            return;
        }
        self.routes.clear();
        let current: HashSet<usize> = set.all().iter().map(|e| Arc::as_ptr(e) as usize).collect();
        self.lanes.retain(|key, lane| {
            let kept = current.contains(key);
            if !kept {
                self.endpoints.forget_if_departed(&lane.consumer.endpoint);
            }
            kept
        });
        self.set = set;
    }

    /// Every [`STATS_PERIOD`]: the pods' counters and gauges copied, pods that left forgotten.
    fn tick(&mut self) {
        self.follow_set();
        for lane in self.lanes.values_mut() {
            lane.consumer.sync_stats();
        }
    }

    /// The socket is closed: no view is fed from here on.
    fn stop(&mut self) {
        for lane in self.lanes.values_mut() {
            lane.consumer.apply(Update::Disconnected);
        }
    }
}

#[cfg(test)]
mod tests;
