//! Flow control's runtime (`picker.flowControl`, [`crate::flow_control`]): the router's gate
//! in front of the pick, the queue behind it and the dispatcher that empties it.
//!
//! - **The gate** ([`Router::route_flow`]): an inference request with flow control on goes to
//!   the pick as before while some candidate has room ([`Scheduler::has_room`]) and nothing is
//!   queued; else it joins the queue and the caller gets a [`Hold`] to await. The check that
//!   nothing is queued is one atomic load: while the queue is empty the request path takes no
//!   lock it did not take before.
//! - **Held for its pod** ([`Router::bind`]): a request that must queue and whose pick holds
//!   more of its prompt than some other candidate gets its pick at once, as without flow
//!   control: the pod the latency model weighs best (its wait against the prefill it saves),
//!   its in-flight count taken then (the next picks see the pod's backlog, as they see an
//!   engine queue). It is then held in the queue *for that pod* and leaves when that pod has
//!   room, not counting the requests held for it ([`Scheduler::with_room_held`]). Any other
//!   queued request takes whichever pod has room first. Without this, the dispatch made when a
//!   slot frees saw a pod with a free slot (no wait) against the request's own pod with a
//!   backlog, and spilled tenants onto the free pod's cache, where an engine queue had kept
//!   them on theirs (benches/RESULTS.md).
//! - **The dispatcher** ([`run_dispatcher`], one task): woken when a request queues, when a
//!   routed request completes (a slot may have freed), and every [`TICK`] while requests wait
//!   (the load may fall without a completion of ours: another replica's, a scrape). Each wake
//!   expires what outlived its TTL (429), then takes requests in the queue's order
//!   ([`FlowQueue::pop`]), per pod with room at that moment one request (one held for that
//!   pod, or one for any pod), and sends a held one on to its pod; routes any other itself:
//!   the affinity pick made then, on the load as it is then (its in-flight count taken at
//!   once). That pick may still go to a full pod whose cache saves more than the wait there,
//!   as the latency model weighs it; with `roomOnly` it is made among the pods with room only.
//!   The routed request (or its refusal) goes to the waiting [`Hold`].
//! - **Leaving**: a [`Hold`] dropped or cancelled before its dispatch leaves the queue at once
//!   (`cancelled`); one dispatched meanwhile hands its routed request back so the caller ends it.
//! - **Bounds**: `maxRequests` and `maxBytes` over all bands; a request past them first
//!   displaces the newest request of the heaviest flow of a negative band below its own
//!   priority, else is refused (429, `retry-after`, [`DROPPED_REASON_HEADER`]).
//! - **Shutdown**: the dispatcher sends every queued request on without waiting for room
//!   (`drain`) and the gate queues nothing more.
//!
//! [`DROPPED_REASON_HEADER`]: crate::flow_control::DROPPED_REASON_HEADER

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::{RouteFailure, Routed, Router};
use crate::endpoints::AddressPattern;
use crate::flow_control::queue::{Admission, FlowQueue};
use crate::flow_control::{DispatchReason, DropReason, FlowControlConfig};
use crate::metrics::FlowMetrics;
use crate::scheduler::kvcache_aware::KvBlockOwners;
use crate::scheduler::saturation::RoomLimits;

/// How often the dispatcher looks again while requests wait (besides its wake-ups).
pub const TICK: Duration = Duration::from_millis(50);
/// Idle flows whose service decayed under this many weighted tokens are forgotten...
const PRUNE_BELOW: f64 = 0.5;
/// ...this often.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// A request as the gate sees it: what routing needs (borrowed: copied only if it queues).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowRequest<'a> {
    pub path: &'a str,
    pub body: Option<&'a [u8]>,
    pub restrict: Option<&'a [AddressPattern]>,
    pub session: Option<&'a [u8]>,
    /// The request headers an `EndpointPickerConfig` reads ([`Router::epp_request_headers`]).
    pub headers: &'a [(String, String)],
    pub kv: Option<&'a KvBlockOwners>,
    /// The fairness header's value (`x-gateway-inference-fairness-id`).
    pub flow: Option<&'a str>,
    /// The `Authorization` header's value, when the flow reads it
    /// ([`FlowControlConfig::reads_authorization`]: Kthena's JWT user).
    pub authorization: Option<&'a str>,
    /// The objective header's value (`x-gateway-inference-objective`).
    pub objective: Option<&'a str>,
    /// The span a queued request's pick is written in (the request id).
    pub span: Option<&'a tracing::Span>,
}

/// A queued request's [`FlowRequest`], owned (it outlives the message that brought it).
#[derive(Debug)]
struct Owned {
    path: String,
    body: Option<Vec<u8>>,
    restrict: Option<Vec<AddressPattern>>,
    session: Option<Vec<u8>>,
    headers: Vec<(String, String)>,
    kv: Option<KvBlockOwners>,
    span: Option<tracing::Span>,
}

impl Owned {
    fn of(r: &FlowRequest<'_>) -> Owned {
        Owned {
            path: r.path.to_string(),
            body: r.body.map(<[u8]>::to_vec),
            restrict: r.restrict.map(<[AddressPattern]>::to_vec),
            session: r.session.map(<[u8]>::to_vec),
            headers: r.headers.to_vec(),
            kv: r.kv.cloned(),
            span: r.span.cloned(),
        }
    }

    fn view(&self) -> FlowRequest<'_> {
        FlowRequest {
            path: &self.path,
            body: self.body.as_deref(),
            restrict: self.restrict.as_deref(),
            session: self.session.as_deref(),
            headers: &self.headers,
            kv: self.kv.as_ref(),
            flow: None,
            authorization: None,
            objective: None,
            span: self.span.as_ref(),
        }
    }
}

/// What the gate did with a request.
// Unboxed: the routed request is the hot path, returned by value as before flow control.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Admitted {
    /// Routed now.
    Routed(Routed),
    /// Queued: await the [`Hold`].
    Held(Hold),
}

/// How a queued request left the queue.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Released {
    /// Routed after `Routed::queued` in the queue.
    Routed(Routed),
    /// Refused (TTL, displaced) or failed at its dispatch (no endpoint any more).
    Refused(RouteFailure),
}

/// What the gate in front of the pick says ([`Router::route_inner`]).
#[derive(Debug)]
pub(super) enum Gate {
    /// Pick among the candidates.
    Pass,
    /// Queue the request: no pick.
    Hold,
    /// Pick among these (a dispatch from the queue: the candidates with room).
    Only(crate::endpoints::PodList),
}

/// How the gate is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// A request arriving (`queue`: it may queue).
    Arrival { queue: bool },
    /// A queued request leaving: picked among the pods with room (all while draining).
    Dispatch { drain: bool },
    /// A request that must queue, picked now to be held for its pod.
    Bind,
}

/// A queued request, in the queue.
struct Waiter {
    tx: oneshot::Sender<Released>,
    request: Owned,
    since: Instant,
    /// Its pick, made when it queued, when it is held for that pod ([`Router::bind`]).
    routed: Option<Routed>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("since", &self.since)
            .finish()
    }
}

/// What the gate, the holds and the dispatcher share.
#[derive(Debug)]
struct Shared {
    /// Requests in the queue (the hot path's one read).
    queued: AtomicUsize,
    draining: AtomicBool,
    queue: Mutex<FlowQueue<Waiter>>,
    /// Wakes the dispatcher.
    wake: Notify,
    metrics: FlowMetrics,
}

impl Shared {
    /// After the queue changed: its size for the hot path and the gauges (under the lock).
    fn publish(&self, q: &FlowQueue<Waiter>, touched: &[i32]) {
        self.queued.store(q.len(), Ordering::SeqCst);
        self.metrics
            .queued_bytes
            .set(i64::try_from(q.bytes()).unwrap_or(i64::MAX));
        let depths = q.depths();
        for p in touched {
            let n = depths.iter().find(|(b, _)| b == p).map_or(0, |(_, n)| *n);
            self.metrics
                .queued
                .with_label_values(&[&p.to_string()])
                .set(n as i64);
        }
    }

    fn dropped(&self, reason: DropReason) {
        self.metrics
            .drops
            .with_label_values(&[reason.as_str()])
            .inc();
    }
}

/// The router's flow-control gate and queue.
#[derive(Debug)]
pub struct FlowGate {
    shared: Arc<Shared>,
    /// The watched InferenceObjectives' priorities (empty unless discovery watches them).
    pub objectives: Arc<crate::flow_control::ObjectivePriorities>,
}

impl FlowGate {
    /// An empty gate; `half_life`: the seconds a flow's service halves in (start-up only).
    pub fn new(half_life: f64, metrics: FlowMetrics) -> FlowGate {
        FlowGate {
            shared: Arc::new(Shared {
                queued: AtomicUsize::new(0),
                draining: AtomicBool::new(false),
                queue: Mutex::new(FlowQueue::new(half_life, Instant::now())),
                wake: Notify::new(),
                metrics,
            }),
            objectives: Arc::default(),
        }
    }

    /// Requests queued now (one atomic load).
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    /// Requests queued per band, highest priority first.
    pub fn depths(&self) -> Vec<(i32, usize)> {
        self.shared.queue.lock().depths()
    }

    /// Wakes the dispatcher when something waits (a completion may have freed a slot).
    pub fn slot_freed(&self) {
        if self.queued() > 0 {
            self.shared.wake.notify_one();
        }
    }

    fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::Relaxed)
    }
}

/// A queued request's ticket out: await [`Hold::wait`]; dropped, it leaves the queue.
#[derive(Debug)]
pub struct Hold {
    id: u64,
    rx: Option<oneshot::Receiver<Released>>,
    shared: Arc<Shared>,
    /// The Envoy message timeout to ask for while held (seconds; 0: none).
    pub message_timeout: f64,
}

impl Hold {
    /// The request's release: routed, or refused. Cancel-safe.
    pub async fn wait(&mut self) -> Released {
        let Some(rx) = self.rx.as_mut() else {
            return Released::Refused(gone());
        };
        let r = rx.await.unwrap_or_else(|_| Released::Refused(gone()));
        self.rx = None;
        r
    }

    /// Leaves the queue now (the client went away): `None` when it was still queued (counted
    /// `cancelled`), else what its dispatch sent, for the caller to end.
    pub fn cancel(mut self) -> Option<Released> {
        self.leave()
    }

    fn leave(&mut self) -> Option<Released> {
        let mut rx = self.rx.take()?;
        let removed = {
            let mut q = self.shared.queue.lock();
            let removed = q.remove(self.id);
            if let Some((_, a)) = &removed {
                self.shared.publish(&q, &[a.priority]);
            }
            removed
        };
        if removed.is_some() {
            self.shared.dropped(DropReason::Cancelled);
            return None;
        }
        rx.try_recv().ok()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(Released::Routed(r)) = self.leave() {
            // Nobody ends it: its in-flight count and holds go with it.
            drop(r);
        }
    }
}

/// The failure of a hold whose queue went away (the picker stopping).
fn gone() -> RouteFailure {
    RouteFailure::new(503, "service_unavailable", "the picker is shutting down")
}

/// A 429 from the queue, naming why.
fn refusal(reason: DropReason, fc: &FlowControlConfig, detail: &str) -> RouteFailure {
    RouteFailure {
        retry_after: Some(fc.retry_after_seconds),
        dropped_reason: Some(reason.as_str()),
        ..RouteFailure::new(
            429,
            "rate_limit_exceeded",
            format!(
                "system saturated, request not queued or dropped from the queue ({}): {detail}; \
                 retry after {} s",
                reason.as_str(),
                fc.retry_after_seconds
            ),
        )
    }
}

impl Router {
    /// Routes a request through flow control: the pick now while a candidate has room and
    /// nothing waits, else a place in the queue ([`Admitted::Held`]) or a refusal (429).
    pub fn route_flow(&self, request: FlowRequest<'_>) -> Result<Admitted, RouteFailure> {
        let queue = !self.flow.draining();
        match self.route_gated(&request, Asked::Arrival { queue })? {
            Ok(routed) => Ok(Admitted::Routed(routed)),
            Err((model, prompt_bytes, fc)) => {
                let held = self.bind(&request)?;
                self.enqueue(request, &model, prompt_bytes, &fc, held)
                    .map(Admitted::Held)
            }
        }
    }

    /// The pick of a request that must queue, when its pick's cache binds it there: some other
    /// candidate holds less of its prompt (the latency model chose the pod weighing its wait
    /// against that prefill; when every candidate holds as much, the cache chose nothing). The
    /// pick is then made now, as it would be without flow control, and counted in the pod's
    /// requests in flight at once; the request waits in the queue for that pod. `None`: any pod
    /// will do (the pick made at dispatch), and always outside the affinity mode and with
    /// `pdGroup`.
    fn bind(&self, r: &FlowRequest<'_>) -> Result<Option<Routed>, RouteFailure> {
        {
            let live = self.scheduler.load();
            if live.scheduler.affinity().is_none() || live.scheduler.config().pd.is_some() {
                return Ok(None);
            }
        }
        let Ok(explained) = self.explain_looked_up(r.path, r.body, r.restrict, r.kv, r.headers)
        else {
            return Ok(None);
        };
        let d = &explained.decision;
        let bound = d
            .primary_position()
            .and_then(|i| d.predictions.lead(i))
            .is_some_and(|lead| lead > 0.0);
        if !bound {
            return Ok(None);
        }
        Ok(self.route_gated(r, Asked::Bind)?.ok())
    }

    /// The pick, or (`Err`) the model, prompt bytes and flow-control settings of a request
    /// that must queue.
    fn route_gated(
        &self,
        r: &FlowRequest<'_>,
        asked: Asked,
    ) -> Result<Result<Routed, (String, usize, FlowControlConfig)>, RouteFailure> {
        let mut must_queue = None;
        let routed = self.route_inner(r, |live, model, prompt_bytes, candidates| {
            let fc = &live.picker.flow_control;
            match asked {
                Asked::Arrival { queue } if queue && fc.active => {
                    let busy = self.flow.queued() > 0
                        || !live.scheduler.has_room(candidates, room_limits(fc));
                    if !busy {
                        return Gate::Pass;
                    }
                    must_queue = Some((model.to_string(), prompt_bytes, fc.clone()));
                    Gate::Hold
                }
                // `roomOnly`: the pick among the pods with room (PD pairs need both roles,
                // which narrowing could remove: never narrowed).
                Asked::Dispatch { drain: false }
                    if fc.room_only && live.scheduler.config().pd.is_none() =>
                {
                    let room = live.scheduler.with_room(candidates, room_limits(fc));
                    if room.is_empty() || room.len() == candidates.len() {
                        return Gate::Pass;
                    }
                    Gate::Only(room.into_iter().map(|i| candidates[i].clone()).collect())
                }
                _ => Gate::Pass,
            }
        })?;
        Ok(match (routed, must_queue) {
            (Some(r), _) => Ok(r),
            (None, Some(q)) => Err(q),
            (None, None) => unreachable!("route_inner returns None only when the gate says so"),
        })
    }

    /// Queues `request`; wakes the dispatcher.
    fn enqueue(
        &self,
        request: FlowRequest<'_>,
        model: &str,
        prompt_bytes: usize,
        fc: &FlowControlConfig,
        routed: Option<Routed>,
    ) -> Result<Hold, RouteFailure> {
        let now = Instant::now();
        let shared = &self.flow.shared;
        let bytes = request.body.map_or(0, <[u8]>::len) + request.path.len();
        let bytes_per_token = self
            .scheduler
            .load()
            .scheduler
            .affinity()
            .map_or(4, |a| a.bytes_per_token.max(1));
        let cost = fc.charge(prompt_bytes as f64 / f64::from(bytes_per_token));
        let admission = Admission {
            priority: fc.priority(request.objective, &self.flow.objectives),
            flow: Arc::from(fc.flow(request.authorization, request.flow, model)),
            pool: Arc::from(model),
            pod: routed.as_ref().map(|r| r.decision.primary().spec.address),
            bytes,
            cost,
            deadline: now + Duration::from_secs_f64(fc.request_ttl_seconds),
        };
        let (tx, rx) = oneshot::channel();
        // The copy of the body, outside the lock.
        let waiter = Waiter {
            tx,
            request: Owned::of(&request),
            since: now,
            routed,
        };
        let mut displaced = Vec::new();
        let id = {
            let mut q = shared.queue.lock();
            let mut touched = vec![admission.priority];
            let id = loop {
                let full = if q.len() >= fc.max_requests {
                    Some(DropReason::QueueFull)
                } else if q.bytes() + bytes > fc.max_bytes {
                    Some(DropReason::BytesFull)
                } else {
                    None
                };
                let Some(reason) = full else {
                    break Ok(q.push(admission, waiter));
                };
                if bytes > fc.max_bytes {
                    break Err(reason);
                }
                match q.displace(admission.priority) {
                    Some((_, w, a)) => {
                        touched.push(a.priority);
                        displaced.push(w);
                    }
                    None => break Err(reason),
                }
            };
            shared.publish(&q, &touched);
            id
        };
        for w in displaced {
            shared.dropped(DropReason::Displaced);
            let _ = w.tx.send(Released::Refused(refusal(
                DropReason::Displaced,
                fc,
                "a request of a higher priority needed its place",
            )));
        }
        let id = match id {
            Ok(id) => id,
            Err(reason) => {
                shared.dropped(reason);
                return Err(refusal(
                    reason,
                    fc,
                    &format!(
                        "the queue is full ({} requests, {} bytes at most)",
                        fc.max_requests, fc.max_bytes
                    ),
                ));
            }
        };
        shared.wake.notify_one();
        Ok(Hold {
            id,
            rx: Some(rx),
            shared: shared.clone(),
            message_timeout: fc.message_timeout_seconds,
        })
    }

    /// One round of the dispatcher at `now`: expires, then dispatches while pods have room
    /// (every queued request, `drain`ing).
    pub fn dispatch(&self, now: Instant, drain: bool) {
        let shared = &self.flow.shared;
        let live = self.scheduler.load();
        let fc = live.picker.flow_control.clone();
        let expired = {
            let mut q = shared.queue.lock();
            let expired = q.expire(now);
            if !expired.is_empty() {
                let touched: Vec<i32> = expired.iter().map(|(_, _, a)| a.priority).collect();
                shared.publish(&q, &touched);
            }
            expired
        };
        for (_, w, _) in expired {
            shared.dropped(DropReason::Ttl);
            let _ = w.tx.send(Released::Refused(refusal(
                DropReason::Ttl,
                &fc,
                &format!("queued for {} s", fc.request_ttl_seconds),
            )));
        }
        let limits = room_limits(&fc);
        // Per model, the pods with room at the round's first look (not counting the requests
        // held for them): one dispatch each this round. A pick (of a request held for no pod)
        // may go to a full pod the affinity mode prefers (its cache saves more than the wait
        // there): it takes a free pod's turn all the same, so that one freed slot does not
        // release the whole queue; the next round (a completion, or the tick) looks again.
        let mut rooms: HashMap<Arc<str>, Room> = HashMap::new();
        if !drain {
            let snapshot = self.endpoints.snapshot();
            let q = shared.queue.lock();
            for model in q.pools() {
                let room = snapshot.candidates(Some(model), None).map_or_else(
                    |_| Room::default(),
                    |c| {
                        let held = |e: &Arc<crate::endpoints::Endpoint>| {
                            i64::try_from(q.pool_len(model, Some(e.spec.address)))
                                .unwrap_or(i64::MAX)
                        };
                        let budget = limits.total_budget(&c, held);
                        let free = live.scheduler.with_room_held(&c, limits, held);
                        Room {
                            pods: c.iter().map(|e| e.spec.address).collect(),
                            free: free.into_iter().map(|i| c[i].spec.address).collect(),
                            budget,
                        }
                    },
                );
                rooms.insert(model.clone(), room);
            }
        }
        loop {
            let popped = {
                let mut q = shared.queue.lock();
                let p = q.pop(now, |model, pod| {
                    drain || rooms.get(model).is_some_and(|r| r.can_take(pod))
                });
                if let Some(p) = &p {
                    shared.publish(&q, &[p.admission.priority]);
                }
                p
            };
            let Some(p) = popped else { break };
            let w = p.item;
            if w.tx.is_closed() {
                // Its client left between the pop and now: nothing to route (a pick made for
                // it goes with it).
                shared.dropped(DropReason::Cancelled);
                continue;
            }
            let reason = if drain {
                DispatchReason::Drain
            } else {
                DispatchReason::Room
            };
            let m = &shared.metrics;
            m.dispatches.with_label_values(&[reason.as_str()]).inc();
            let waited = now.saturating_duration_since(w.since);
            m.wait.observe(waited.as_secs_f64());
            m.served_tokens
                .with_label_values(&[m.flows.label(&p.admission.flow)])
                .inc_by(p.admission.cost.round() as u64);
            let _span = w.request.span.as_ref().map(tracing::Span::enter);
            let room = rooms.get_mut(&p.admission.pool);
            let released = match (w.routed, p.admission.pod) {
                // Held for its pod, still a candidate: sent there with the pick it queued with.
                (Some(mut routed), Some(pod))
                    if drain || room.as_ref().is_some_and(|r| r.pods.contains(&pod)) =>
                {
                    if let Some(r) = room {
                        r.took(pod);
                    }
                    routed.queued = waited;
                    Released::Routed(routed)
                }
                (held, _) => {
                    // Its pod gone: the pick made again, as for a request held for no pod.
                    drop(held);
                    match self.route_gated(&w.request.view(), Asked::Dispatch { drain }) {
                        Ok(Ok(mut routed)) => {
                            if let Some(r) = room {
                                r.took(routed.decision.primary().spec.address);
                            }
                            routed.queued = waited;
                            Released::Routed(routed)
                        }
                        Ok(Err(_)) => unreachable!("the gate is off at dispatch"),
                        Err(f) => Released::Refused(f),
                    }
                }
            };
            // A client gone meanwhile drops it: the route's in-flight count goes with it.
            if w.tx.send(released).is_err() {
                shared.dropped(DropReason::Cancelled);
            }
        }
    }

    /// Forgets the idle flows whose service decayed to nothing (O(flows): every
    /// [`PRUNE_EVERY`], not per dispatch).
    fn prune_flows(&self, now: Instant) {
        self.flow.shared.queue.lock().prune(now, PRUNE_BELOW);
    }

    /// Whether the flow of a queued request reads its `Authorization` header (Kthena's JWT
    /// user): the adapter keeps the header only then.
    pub fn flow_reads_authorization(&self) -> bool {
        self.scheduler
            .load()
            .picker
            .flow_control
            .reads_authorization()
    }

    /// Whether a request for `candidates` would queue now (`/debug/explain`): flow control on,
    /// and something queued or no room.
    pub(super) fn would_queue(
        &self,
        live: &super::Generation,
        candidates: &[Arc<crate::endpoints::Endpoint>],
    ) -> bool {
        let fc = &live.picker.flow_control;
        fc.active
            && !self.flow.draining()
            && (self.flow.queued() > 0 || !live.scheduler.has_room(candidates, room_limits(fc)))
    }
}

/// A model's pods as a dispatch round sees them.
#[derive(Debug)]
struct Room {
    /// Its candidates.
    pods: Vec<SocketAddr>,
    /// Those that had room at the round's first look and have had no dispatch since.
    free: Vec<SocketAddr>,
    /// Dispatches the model may still take this round (Kthena's `FAIRNESS_MAX_CONCURRENT`).
    budget: usize,
}

impl Default for Room {
    /// No candidates: a request held for a pod may leave (to be picked again, and refused).
    fn default() -> Self {
        Room {
            pods: Vec::new(),
            free: Vec::new(),
            budget: usize::MAX,
        }
    }
}

impl Room {
    /// Whether a request held for `pod` (`None`: for any pod) may leave now: its pod is free,
    /// or gone from the candidates (it is then picked again); any pod: one is free.
    fn can_take(&self, pod: Option<SocketAddr>) -> bool {
        if self.budget == 0 {
            return false;
        }
        match pod {
            None => !self.free.is_empty(),
            Some(p) => self.free.contains(&p) || !self.pods.contains(&p),
        }
    }

    /// A dispatch to `pod` took its turn (a full pod's pick takes a free pod's).
    fn took(&mut self, pod: SocketAddr) {
        self.budget = self.budget.saturating_sub(1);
        match self.free.iter().position(|p| *p == pod) {
            Some(i) => {
                self.free.swap_remove(i);
            }
            None => {
                self.free.pop();
            }
        }
    }
}

fn room_limits(fc: &FlowControlConfig) -> RoomLimits {
    RoomLimits {
        max_wait: fc.max_wait_seconds,
        max_inflight: fc.max_in_flight_per_pod,
        max_inflight_total: fc.kthena.as_ref().and_then(|k| k.max_in_flight_per_model),
    }
}

/// The dispatcher task: a round whenever woken, every [`TICK`] while requests wait; on
/// `shutdown`, every queued request sent on and no more queued.
pub async fn run_dispatcher(router: Arc<Router>, shutdown: CancellationToken) {
    let shared = router.flow.shared.clone();
    let mut pruned = Instant::now();
    loop {
        let waiting = shared.queued.load(Ordering::SeqCst) > 0;
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(TICK), if waiting => {}
            _ = tokio::time::sleep(PRUNE_EVERY), if !waiting => {}
        }
        let now = Instant::now();
        router.dispatch(now, false);
        if now.saturating_duration_since(pruned) >= PRUNE_EVERY {
            router.prune_flows(now);
            pruned = now;
        }
    }
    shared.draining.store(true, Ordering::SeqCst);
    router.dispatch(Instant::now(), true);
}

#[cfg(test)]
mod tests;
