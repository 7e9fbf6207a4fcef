//! The routing seam, independent of Envoy: [`Router::route`] turns a request (path + body) into
//! a decision and a [`Ticket`]; [`Router::complete`] finishes the ticket with the request's
//! [`Ending`]; [`Router::explain`] shows the decision `route` would make, changing nothing.
//! A ticket whose ending another source reports waits in [`PendingRoutes`].
//!
//! Unknown API paths (e.g. `/v1/models`) are routed by load only, to any endpoint. Inference
//! APIs need a JSON body with a string `model` (else 400); a body without a renderable prompt is
//! routed by load only. Candidate pods can be narrowed by [`AddressPattern`]s (a subset hint or,
//! when enabled, the conformance header). With load shedding on, an inference request whose
//! candidates are all saturated is refused (429, `retry-after`) before the filters run: no
//! ticket, nothing held or recorded. Failures map to HTTP statuses with OpenAI-style JSON error
//! bodies. With `pdGroup` every request is scheduled as a prefill/decode pair
//! ([`crate::scheduler::pd`]): the decision's `pd` names the prefill pod the adapter sends on.

pub mod completion;
pub mod flow;
pub mod live;
pub mod pending;
mod replicas;
pub use crate::sessions;
pub use crate::sync::RecordSink;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;

use crate::config::{PickerConfig, SchedulerConfig};
use crate::endpoints::{AddressPattern, Endpoint, Endpoints, PodList};
use crate::hashing::BlockHash;
use crate::kvcache::KvLookup;
use crate::kvcache::lookup::Pending;
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
use crate::prefix_index::PodSlot;
use crate::prompt::Rendering;
use crate::request::{Api, InferenceRequest};
use crate::scheduler::kvcache_aware::KvBlockOwners;
use crate::scheduler::saturation::Shed;
use crate::scheduler::{
    Decision, DecisionReason, EngineTokens, Observation, PickError, RouteRequest, Scheduler,
    Unpaired, Unscored,
};
use crate::tokenizer::heads::{HeadFound, HeadTokens};
pub use completion::{Ending, PrefillTicket, Served, Ticket};
pub use live::{Generation, LiveScheduler};
pub use pending::PendingRoutes;
use sessions::{SessionDrop, SessionKey, SessionOutcome, Sessions};

/// A request the picker answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFailure {
    pub status: u16,
    /// OpenAI error `type`.
    pub kind: &'static str,
    pub message: String,
    /// Seconds for a `retry-after` header (a shed request).
    pub retry_after: Option<u32>,
    /// Why flow control refused it (the `x-llm-d-request-dropped-reason` header).
    pub dropped_reason: Option<&'static str>,
}

impl RouteFailure {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> RouteFailure {
        RouteFailure {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            dropped_reason: None,
        }
    }

    /// 429 for a request shed because every candidate is saturated, to be retried after
    /// `retry_after` seconds.
    pub fn shed(shed: &Shed, retry_after: u32) -> RouteFailure {
        RouteFailure {
            retry_after: Some(retry_after),
            ..RouteFailure::new(
                429,
                "rate_limit_exceeded",
                format!(
                    "system saturated, request shed: all {} endpoints are over a load limit \
                     (engine queue {}, KV cache {}, in flight {}); retry after {retry_after} s",
                    shed.candidates(),
                    shed.queue,
                    shed.kv_cache,
                    shed.in_flight
                ),
            )
        }
    }

    /// OpenAI-style JSON error body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.status,
        }}))
        .expect("serializable")
    }
}

impl From<PickError> for RouteFailure {
    fn from(e: PickError) -> Self {
        let status = match e {
            PickError::UnknownModel(_) => 404,
            _ => 503,
        };
        let kind = if status == 404 {
            "invalid_request_error"
        } else {
            "service_unavailable"
        };
        RouteFailure::new(status, kind, e.to_string())
    }
}

/// A routed request: the decision and the ticket that ends it. The decision's block hashes
/// moved into the ticket (`decision.hashes` is empty).
#[derive(Debug)]
pub struct Routed {
    pub decision: Decision<Arc<Endpoint>>,
    pub ticket: Ticket,
    /// Time it waited in flow control's queue before the pick (zero when it did not queue).
    pub queued: Duration,
}

/// What [`Router::route`] would decide (nothing counted, held or committed).
#[derive(Debug)]
pub struct Explained {
    pub model: String,
    pub decision: Decision<Arc<Endpoint>>,
    /// Flow control would queue the request now (every candidate full, or others queued): the
    /// decision is the one a pod with room would get.
    pub would_queue: bool,
}

/// Where a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOrigin {
    /// A completion this replica saw (published to the record sink).
    Local,
    /// A record another replica made (never published again).
    Replica,
}

/// Everything routing needs, shared by all streams and the admin listener.
#[derive(Debug)]
pub struct Router {
    /// The scheduler, swapped whole by a config reload ([`crate::reload`]).
    pub scheduler: LiveScheduler,
    pub endpoints: Arc<Endpoints>,
    pub metrics: RouterMetrics,
    /// prefix-cache's metrics (Kthena's names), counted from what the scheduler returns.
    pub prefix_metrics: PrefixCacheMetrics,
    /// The picker section as started; the keys a reload may change are read from
    /// `scheduler.load().picker`, the others (refused by a reload) from here.
    pub config: PickerConfig,
    pub pending: PendingRoutes,
    /// Session affinity's map, when `picker.sessions` is enabled.
    pub sessions: Option<Sessions>,
    /// Engine tokens of prompt heads, when `picker.tokenizer` is set (the affinity mode's match
    /// on engine truth).
    pub heads: Option<Arc<HeadTokens>>,
    /// kvcache-aware's lookup, set at start-up when the config enables the plugin.
    pub kv_lookup: OnceLock<Arc<KvLookup>>,
    /// Flow control's gate and queue ([`flow`]).
    pub flow: flow::FlowGate,
    sink: OnceLock<Arc<dyn RecordSink>>,
}

impl Router {
    /// A router over an empty endpoint set: the scheduler from `scheduler`, the picker's
    /// knobs from `picker`, metrics into the given families.
    pub fn assemble(
        scheduler: SchedulerConfig,
        picker: PickerConfig,
        prefix_metrics: PrefixCacheMetrics,
        metrics: RouterMetrics,
    ) -> Router {
        let served_models = scheduler.needs_served_models();
        let scheduler = Scheduler::new(scheduler, picker.max_endpoints, picker.seed);
        let scheduler = LiveScheduler::new(scheduler, picker.clone());
        let endpoints = Arc::new(
            Endpoints::new(scheduler.index().clone(), metrics.clone())
                .with_max_engine_blocks(picker.kv_events.max_blocks_per_pod)
                .with_engine_views_for_every_pod(picker.kv_events.bind.is_some()),
        );
        endpoints.set_fetch_served_models(served_models);
        let heads = picker
            .tokenizer
            .clone()
            .map(|t| Arc::new(HeadTokens::new(t, metrics.engine.clone())));
        Router {
            flow: flow::FlowGate::new(picker.flow_control.half_life_seconds, metrics.flow.clone()),
            scheduler,
            endpoints,
            heads,
            metrics,
            prefix_metrics,
            pending: PendingRoutes::new(Duration::from_secs(picker.response_timeout_seconds)),
            sessions: picker
                .sessions
                .enabled
                .then(|| Sessions::new(&picker.sessions, picker.seed)),
            config: picker,
            kv_lookup: OnceLock::new(),
            sink: OnceLock::new(),
        }
    }

    /// Installs the record sink (once); `false` if one was already set.
    pub fn set_record_sink(&self, sink: Arc<dyn RecordSink>) -> bool {
        self.sink.set(sink).is_ok()
    }

    /// Records a served request's prompt for the pod that served it: the one record path, for
    /// this replica's completions ([`RecordOrigin::Local`], shared with the other replicas
    /// through the sink) and for theirs ([`RecordOrigin::Replica`], applied as they made them).
    /// Evictions are counted by the evicted entry's model.
    pub fn record(
        &self,
        model: &str,
        hashes: &[BlockHash],
        endpoint: &Endpoint,
        origin: RecordOrigin,
    ) -> usize {
        let live = self.scheduler.load();
        if !live.scheduler.prefix_enabled() {
            return 0;
        }
        if origin == RecordOrigin::Local
            && let Some(sink) = self.sink.get()
        {
            sink.recorded(model, hashes, endpoint);
        }
        let outcome = live.scheduler.record(model, hashes, &endpoint.index);
        if !hashes.is_empty() {
            self.prefix_metrics.count_record(model, &outcome);
        }
        outcome.inserted
    }

    /// Counts a routed decision (reason, why unscored, duration, plugin times, match ratios)
    /// and writes Kthena's score lines.
    /// The request's engine tokens, in the affinity mode (or an `EndpointPickerConfig` with a
    /// precise-prefix-cache-producer) with `picker.tokenizer`, when some
    /// candidate publishes KV events: its longest head tokenized before ([`HeadTokens::find`],
    /// which counts and queues the heads of a prompt it does not know; without `body`, a dry
    /// run: [`HeadTokens::lookup`]).
    fn engine_tokens(
        &self,
        path: &str,
        body: Option<&[u8]>,
        request: &RouteRequest<'_>,
        candidates: &[Arc<Endpoint>],
        live: &Generation,
    ) -> Option<HeadFound> {
        let heads = self.heads.as_ref()?;
        if !live.scheduler.matches_engine_truth() {
            return None;
        }
        let prompt = request.prompt.ok()?;
        // The tokenizer asked is the least busy engine's: always the first would put every
        // call on one pod's API server, which is serving requests too.
        let pod = candidates
            .iter()
            .filter(|e| e.engine.is_some())
            .min_by_key(|e| e.inflight())?;
        let Some(body) = body else {
            return heads.lookup(request.model, Api::from_path(path)?, prompt);
        };
        heads.find(
            request.model,
            Api::from_path(path),
            prompt,
            Some(body),
            Some(pod.spec.address),
        )
    }

    fn observe(&self, model: &str, decision: &Decision<Arc<Endpoint>>) {
        self.count(model, &decision.observations);
        if !decision.engine.is_empty() || self.heads.is_some() && decision.reason.is_affinity() {
            self.metrics
                .engine
                .match_source
                .with_label_values(&[decision.primary_source().as_str()])
                .inc();
        }
        self.metrics
            .decisions
            .with_label_values(&[decision.reason.as_str()])
            .inc();
        if let Some(u) = decision.unscored {
            self.metrics.unscored.with_label_values(&[u.as_str()]).inc();
        }
        self.metrics
            .decision_duration
            .observe(decision.duration.as_secs_f64());
        decision.log_scores();
    }

    /// Counts plugin times and match ratios.
    fn count(&self, model: &str, observations: &[Observation]) {
        let model = self.metrics.models.label(model);
        for o in observations {
            match *o {
                Observation::PluginTime {
                    plugin,
                    kind,
                    elapsed,
                } => self
                    .metrics
                    .plugin_duration
                    .with_label_values(&[model, plugin, kind.as_str()])
                    .observe(elapsed.as_secs_f64()),
                Observation::MatchRatio(ratio) => self
                    .prefix_metrics
                    .match_ratio
                    .with_label_values(&[model])
                    .observe(ratio),
                Observation::KvCacheMatchRatio(ratio) => self
                    .metrics
                    .kvcache
                    .match_ratio
                    .with_label_values(&[model])
                    .observe(ratio),
            }
        }
    }

    /// Routes one request: decides, counts the decision, commits it (the affinity mode's
    /// tentative hold) and returns the ticket, which holds the primary pod's in-flight count
    /// until [`Router::complete`] (or until dropped). `body` is `None` for a request without a
    /// body; `restrict` narrows the candidates.
    pub fn route(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[AddressPattern]>,
    ) -> Result<Routed, RouteFailure> {
        self.route_in_session(path, body, restrict, None)
    }

    /// kvcache-aware's lookup for this request, to await before routing it with
    /// [`Router::route_looked_up`]; `None` (nothing to await, nothing spent) unless the live
    /// scheduler enables kvcache-aware and the request has a body.
    pub fn kv_lookup(
        &self,
        path: &str,
        body: &[u8],
        restrict: Option<&[AddressPattern]>,
    ) -> Option<Pending> {
        let args = *self.scheduler.load().scheduler.config().kvcache_aware()?;
        let lookup = match self.kv_lookup.get() {
            Some(l) => l,
            None => {
                warn_no_kv_store();
                return None;
            }
        };
        let endpoints = self.endpoints.snapshot();
        lookup.prepare(args, path, body, |model| {
            endpoints
                .candidates(Some(model), restrict)
                .map(|c| c.iter().map(|e| e.spec.address.ip()).collect())
                .unwrap_or_default()
        })
    }

    /// [`Router::route`] for a request that may belong to a session: `session` is the value of
    /// the session header (`picker.sessions.header`), ignored unless session affinity is on.
    /// The session's pod is the pick while it has headroom; the pick becomes the session's pod.
    pub fn route_in_session(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[AddressPattern]>,
        session: Option<&[u8]>,
    ) -> Result<Routed, RouteFailure> {
        self.route_looked_up(path, body, restrict, session, None)
    }

    /// [`Router::route_in_session`] with kvcache-aware's looked-up block owners
    /// ([`Router::kv_lookup`]); `None`: the plugin scores nothing.
    pub fn route_looked_up(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[AddressPattern]>,
        session: Option<&[u8]>,
        kv_blocks: Option<&KvBlockOwners>,
    ) -> Result<Routed, RouteFailure> {
        let request = flow::FlowRequest {
            path,
            body,
            restrict,
            session,
            kv: kv_blocks,
            ..flow::FlowRequest::default()
        };
        let routed = self.route_inner(&request, |_, _, _, _| flow::Gate::Pass);
        Ok(routed?.expect("no gate"))
    }

    /// [`Router::route_looked_up`] behind a gate: `gate(generation, model, prompt bytes,
    /// candidates)` is asked for an inference request that load shedding let through, before
    /// the pick; [`flow::Gate::Hold`] stops there (`Ok(None)`: nothing decided, counted or
    /// held), [`flow::Gate::Only`] narrows the candidates.
    fn route_inner(
        &self,
        r: &flow::FlowRequest<'_>,
        gate: impl FnOnce(&Generation, &str, usize, &[Arc<Endpoint>]) -> flow::Gate,
    ) -> Result<Option<Routed>, RouteFailure> {
        let (path, body, restrict) = (r.path, r.body, r.restrict);
        let live = self.scheduler.load();
        let parsed = Parsed::new(path, body, live.scheduler.config().rendering())?;
        let (mut request, mut candidates) = self.prepare(&parsed, restrict)?;
        if let Some(refused) = Router::shed(&live, &parsed, &candidates) {
            self.metrics.shed.inc();
            return Err(refused);
        }
        if parsed.request.is_some() {
            let prompt_bytes = request.prompt.map_or(0, str::len);
            match gate(&live, request.model, prompt_bytes, &candidates) {
                flow::Gate::Pass => {}
                flow::Gate::Hold => return Ok(None),
                flow::Gate::Only(pods) => candidates = pods,
            }
        }
        request.kv_blocks = r.kv;
        request.headers = r.headers;
        let session = self.session_pod(r.session, &candidates);
        if let Some((_, SessionPod::Candidate(slot))) = session {
            request.session_pod = Some(slot);
        }
        let model = request.model;
        let head = self.engine_tokens(path, body, &request, &candidates, &live);
        request.engine_tokens = head.as_ref().map(|h| EngineTokens {
            tokens: h.tokens.as_slice(),
            prompt_bytes: h.prompt_bytes,
            head_tokens: h.head_tokens,
        });
        let mut decision = Router::decide(&live.scheduler, request, candidates, true)
            .inspect_err(|f| self.count(model, &f.observations))
            .map_err(PickError::from)?;
        self.observe(model, &decision);
        decision.primary().count_pick(&self.metrics);
        let tentative = live.scheduler.commit(model, &decision);
        let prefill_tentative = live.scheduler.commit_prefill(model, &decision);
        let mut ticket = Ticket::new(
            model,
            &mut decision,
            tentative,
            prefill_tentative,
            &self.metrics,
        );
        if let Some((key, pod)) = session {
            self.settle_session(key, pod, &decision);
            ticket.session = Some(key);
        }
        ticket.event_stream =
            parsed.api == Some(Api::Messages) && parsed.request.as_ref().is_some_and(|r| r.stream);
        Ok(Some(Routed {
            decision,
            ticket,
            queued: Duration::ZERO,
        }))
    }

    /// Counts where a request of a session went and makes the pick the session's pod.
    fn settle_session(&self, key: SessionKey, pod: SessionPod, decision: &Decision<Arc<Endpoint>>) {
        let outcome = SessionPod::outcome(pod, decision.reason);
        self.metrics
            .session_requests
            .with_label_values(&[outcome.as_str()])
            .inc();
        tracing::trace!(session = %key, outcome = outcome.as_str(), "session");
        self.remember_session(key, decision.primary().spec.address);
    }

    /// The session's key and where its pod is (`None` without a session header or with
    /// session affinity off).
    fn session_pod(
        &self,
        id: Option<&[u8]>,
        candidates: &[Arc<Endpoint>],
    ) -> Option<(SessionKey, SessionPod)> {
        let (sessions, id) = (self.sessions.as_ref()?, id?);
        let key = sessions.key(id);
        let mut dropped = Vec::new();
        let address = sessions.lookup(key, &mut dropped);
        self.count_dropped(&dropped);
        let pod = match address {
            None => SessionPod::New,
            Some(a) => candidates
                .iter()
                .find(|e| e.spec.address == a)
                .map_or(SessionPod::NotCandidate, |e| {
                    SessionPod::Candidate(e.index.slot())
                }),
        };
        Some((key, pod))
    }

    /// The session's last request went to `pod` (at the pick, then the pod that served).
    pub(crate) fn remember_session(&self, key: SessionKey, pod: std::net::SocketAddr) {
        let Some(sessions) = &self.sessions else {
            return;
        };
        let mut dropped = Vec::new();
        sessions.remember(key, pod, &mut dropped);
        self.count_dropped(&dropped);
    }

    fn count_dropped(&self, dropped: &[SessionDrop]) {
        for d in dropped {
            self.metrics
                .sessions_dropped
                .with_label_values(&[d.as_str()])
                .inc();
        }
        if let Some(sessions) = &self.sessions {
            self.metrics.sessions.set(sessions.len() as i64);
        }
    }

    /// The request headers the live `EndpointPickerConfig` reads (its session-affinity
    /// scorers'; lowercase); empty in other modes.
    pub fn epp_request_headers(&self) -> Vec<String> {
        let live = self.scheduler.load();
        live.scheduler
            .config()
            .epp
            .as_ref()
            .map_or_else(Vec::new, |p| {
                p.request_headers()
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            })
    }

    /// The response headers the live `EndpointPickerConfig` sets for a pick of `pod`
    /// (`namespace/name`): its `encoded_endpoint_header` session scorers' tokens.
    pub fn epp_response_headers(&self, pod: &str) -> Vec<(String, String)> {
        let live = self.scheduler.load();
        live.scheduler
            .config()
            .epp
            .as_ref()
            .map_or_else(Vec::new, |p| p.response_headers(pod))
    }

    /// The decision [`Router::route`] would make for this request, without counting it or
    /// changing any state (`/debug/explain`).
    pub fn explain(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[AddressPattern]>,
    ) -> Result<Explained, RouteFailure> {
        self.explain_looked_up(path, body, restrict, None, &[])
    }

    /// [`Router::explain`] with kvcache-aware's looked-up block owners and the request headers
    /// an `EndpointPickerConfig` reads ([`Router::epp_request_headers`]).
    pub fn explain_looked_up(
        &self,
        path: &str,
        body: Option<&[u8]>,
        restrict: Option<&[AddressPattern]>,
        kv_blocks: Option<&KvBlockOwners>,
        headers: &[(String, String)],
    ) -> Result<Explained, RouteFailure> {
        let live = self.scheduler.load();
        let parsed = Parsed::new(path, body, live.scheduler.config().rendering())?;
        let (mut request, candidates) = self.prepare(&parsed, restrict)?;
        if let Some(refused) = Router::shed(&live, &parsed, &candidates) {
            return Err(refused);
        }
        let would_queue = parsed.request.is_some() && self.would_queue(&live, &candidates);
        request.kv_blocks = kv_blocks;
        request.headers = headers;
        let model = request.model.to_string();
        let head = self.engine_tokens(path, None, &request, &candidates, &live);
        request.engine_tokens = head.as_ref().map(|h| EngineTokens {
            tokens: h.tokens.as_slice(),
            prompt_bytes: h.prompt_bytes,
            head_tokens: h.head_tokens,
        });
        let decision =
            Router::decide(&live.scheduler, request, candidates, false).map_err(PickError::from)?;
        Ok(Explained {
            model,
            decision,
            would_queue,
        })
    }

    /// The scheduler's decision, as a PD pair when `pdGroup` is set; `routed` = false: a dry
    /// run (explain).
    fn decide(
        s: &Scheduler,
        request: RouteRequest<'_>,
        candidates: PodList,
        routed: bool,
    ) -> Result<Decision<Arc<Endpoint>>, Unpaired> {
        match (&s.config().pd, routed) {
            (Some(group), true) => s.schedule_pd(request, candidates, group),
            (Some(group), false) => s.explain_pd(request, candidates, group),
            (None, true) => s.schedule(request, candidates).map_err(Unpaired::from),
            (None, false) => s.explain(request, candidates).map_err(Unpaired::from),
        }
    }

    /// Load shedding, before the filters: the 429 for an inference request when every candidate
    /// is saturated (other paths, e.g. `/v1/models`, put no load on the engines: never shed).
    fn shed(
        live: &Generation,
        parsed: &Parsed,
        candidates: &[Arc<Endpoint>],
    ) -> Option<RouteFailure> {
        parsed.request.as_ref()?;
        let shed = live.scheduler.shed(candidates)?;
        let retry_after = live
            .picker
            .load_shedding
            .as_ref()
            .map_or(1, |s| s.retry_after_seconds);
        Some(RouteFailure::shed(&shed, retry_after))
    }

    /// The scheduler's request and the candidate pods: any pod for an unknown API (no model is
    /// known), else the pods serving the model; narrowed to `restrict`.
    fn prepare<'a>(
        &self,
        parsed: &'a Parsed,
        restrict: Option<&[AddressPattern]>,
    ) -> Result<(RouteRequest<'a>, PodList), PickError> {
        let model = parsed.request.as_ref().map(|r| r.model.as_str());
        let candidates = self.endpoints.snapshot().candidates(model, restrict)?;
        let prompt = match &parsed.request {
            // No path at all: the ext_proc filter skips request headers (see envoy).
            None if parsed.no_path => Err(Unscored::NoRequestPath),
            None => Err(Unscored::UnknownApi),
            Some(r) => match &r.prompt {
                Ok(p) => Ok(p.as_str()),
                Err(reason) => Err(Unscored::NoPrompt(*reason)),
            },
        };
        let request = RouteRequest {
            model: model.unwrap_or(""),
            prompt,
            salt: parsed.request.as_ref().and_then(|r| r.salt.as_ref()),
            session_pod: None,
            hashes: None,
            engine_tokens: None,
            kv_blocks: None,
            headers: &[],
        };
        Ok((request, candidates))
    }
}

/// kvcache-aware enabled by a reload without the Redis connection made at start-up: warned once.
fn warn_no_kv_store() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "kvcache-aware is enabled but was not at start-up: it scores nothing until the \
             picker restarts (its Redis connection is made at start-up)"
        );
    });
}

/// Where a session's pod is, for one request.
#[derive(Clone, Copy)]
enum SessionPod {
    /// No pod yet: a new session, or one forgotten.
    New,
    /// Its pod is not a candidate (gone, or outside the subset hint).
    NotCandidate,
    /// A candidate, in this prefix-index slot.
    Candidate(PodSlot),
}

impl SessionPod {
    /// Where the session's request went: kept on its pod when the decision's reason is the
    /// session, moved otherwise, new without a pod.
    fn outcome(pod: SessionPod, reason: DecisionReason) -> SessionOutcome {
        match pod {
            SessionPod::New => SessionOutcome::New,
            SessionPod::Candidate(_) if reason == DecisionReason::Session => SessionOutcome::Kept,
            _ => SessionOutcome::Moved,
        }
    }
}

/// A request as routing reads it: the inference request for a known API, none for another path.
struct Parsed {
    /// The path's API (`None`: another path).
    api: Option<Api>,
    request: Option<InferenceRequest>,
    /// The path was empty (Envoy sent no request headers).
    no_path: bool,
}

impl Parsed {
    /// `rendering`: the scheduler's (`SchedulerConfig::rendering`).
    fn new(path: &str, body: Option<&[u8]>, rendering: Rendering) -> Result<Parsed, RouteFailure> {
        let api = Api::from_path(path);
        let request = match (api, body) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(RouteFailure::new(
                    400,
                    "invalid_request_error",
                    "request has no body",
                ));
            }
            (Some(api), Some(body)) => Some(
                InferenceRequest::parse_for(api, body, rendering)
                    .map_err(|e| RouteFailure::new(400, "invalid_request_error", e.to_string()))?,
            ),
        };
        Ok(Parsed {
            api,
            request,
            no_path: path.is_empty(),
        })
    }
}

#[cfg(test)]
mod tests;
