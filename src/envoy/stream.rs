//! The Envoy adapter: one ext_proc stream per HTTP request, translated to [`Router`] calls.
//!
//! Request phase (protocol.md §2): with `BUFFERED` bodies the headers are answered CONTINUE and
//! the pick rides on the body reply (Envoy sends the whole body in one message; `end_of_stream`
//! is false only when request trailers follow); with `FULL_DUPLEX_STREAMED` the headers reply is
//! held until the body's end (`end_of_stream` or the request trailers), then sent with the pick
//! and `clear_route_cache`, followed by the body itself as `streamed_response` chunks of at most
//! 62,000 bytes (the last one ends the stream unless trailers do). A request without a body is
//! answered at once. `BUFFERED_PARTIAL` is `BUFFERED` until Envoy's buffer fills: a body cut
//! there arrives without `end_of_stream`, like a whole body that trailers follow, and is told
//! apart by not parsing whole (then 413). The pick goes in the `x-gateway-destination-endpoint`
//! header (overwriting any client-supplied one) and in `envoy.lb` dynamic metadata, with
//! identical values, the metadata also carrying the decision with the request id
//! ([`DECISION_HEADER`], for the access record); `x-request-id` is generated when missing. The
//! decision's score lines are written in a span carrying the request id. In PD mode the same
//! reply sets `x-prefiller-host-port` to the paired prefill pod; otherwise it removes any
//! client-supplied one, so the header reaching a pod is always the picker's. Failures are
//! immediate responses with OpenAI-style JSON errors (a shed request's 429 with `retry-after`).
//! A body that arrives without request headers (a filter with
//! `request_header_mode: SKIP`, whose requests Envoy forwards before any pick) is answered,
//! routed by load, counted as unscored `no_request_path`, and warned about once. A stream decides
//! once: after an immediate response it answers nothing more of the request, and after a pick
//! any further request message (Envoy sends none) gets a plain reply of its kind (FULL_DUPLEX
//! body bytes are still sent back).
//!
//! Response phase: the pod that served is `upstream.address` (response attribute), else the
//! `x-gateway-destination-endpoint-served` metadata key, else the primary pick. Completion is the
//! response body's `end_of_stream` or response trailers; with response body mode `NONE` it is the
//! response headers (so aborted streams are then recorded too). A 2xx completion records the
//! prompt for the serving pod; anything else, or a stream that ends first, records nothing.
//! With `picker.decisionHeader` the response headers reply sets [`DECISION_HEADER`]. The
//! response's last reply (its body's end, or its trailers) carries the token counts its body's
//! `usage` reported as `io.envoy.ai_gateway` metadata ([`cost_metadata`]).
//! `FULL_DUPLEX_STREAMED` response chunks are echoed back at once; streams in
//! `observability_mode` are never answered. Once the response has completed the picker ends the
//! stream itself (Envoy would hold an observability-mode stream open for 5 s more). When this
//! stream will not see the response (response body mode `NONE` or unknown), the routed state
//! waits in [`PendingRoutes`] under an issued, unguessable route key (sent as [`ROUTE_KEY`] in
//! `envoy.lb` metadata; never the client's `x-request-id`) for Envoy's access log
//! ([`crate::envoy::access_log`]) or an observer stream (a second ext_proc filter) to claim it;
//! [`crate::routing::completion`] decides what is recorded.
//!
//! [`PendingRoutes`]: crate::routing::PendingRoutes

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, value::Kind};
use ep::processing_request::Request as In;
use ep::processing_response::Response as Out;
use ep::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};

use super::access_log::warn_other_replica;
use super::handler::{Lookup, StreamHandler};
use super::wire::{
    BodyEnd, BodyMode, CONFORMANCE_SERVED_HEADER, DECISION_HEADER, TEST_SELECTION_HEADER,
    body_chunks, cost_metadata, decision_value, destination, header_value, lb_metadata,
    merge_metadata, pick_headers, read_subset_hint, reply, route_key_from_metadata,
    served_from_metadata, set_header, streamed_body,
};
use crate::cached_tokens::UsageScan;
use crate::endpoints::AddressPattern;
use crate::event_stream::EventScan;
use crate::flow_control::{DROPPED_REASON_HEADER, FAIRNESS_HEADERS, OBJECTIVE_HEADERS};
use crate::routing::flow::{Admitted, FlowRequest, Hold, Released};
use crate::routing::pending::Miss;
use crate::routing::{Ending, RouteFailure, Routed, Router, Served, Ticket};
use crate::scheduler::kvcache_aware::KvBlockOwners;

impl StreamHandler for StreamState {
    fn replies(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        self.handle(message)
    }

    fn done(&self) -> bool {
        self.completed
    }

    fn finish(&mut self) {
        StreamState::finish(self);
    }

    fn lookup(&mut self, message: &ProcessingRequest) -> Option<Lookup> {
        StreamState::lookup(self, message)
    }

    fn looked_up(&mut self, owners: Option<KvBlockOwners>) {
        if let Some((_, slot)) = &mut self.kv_lookup {
            *slot = owners;
        }
    }

    fn take_hold(&mut self) -> Option<Hold> {
        self.hold.take()
    }

    fn released(&mut self, released: Released) -> Vec<ProcessingResponse> {
        StreamState::released(self, released)
    }

    fn abandoned(&mut self, released: Released) {
        self.held = None;
        if let Released::Routed(routed) = released {
            self.router.complete(routed.ticket, Ending::Aborted);
        }
    }
}

/// What a request held by flow control is answered with once released.
#[derive(Debug, Default)]
struct HeldReply {
    /// It had a body (the pick then rides on the body reply, unless the headers were held).
    has_body: bool,
    /// FULL_DUPLEX: the body, sent back after the pick, and how it ended.
    full_duplex: Option<(Vec<u8>, BodyEnd)>,
    /// FULL_DUPLEX ended by request trailers: their reply follows the body.
    trailers: bool,
}

/// Per-stream state.
pub(super) struct StreamState {
    router: Arc<Router>,
    _open: OpenStream,
    observer: bool,
    request_mode: Option<BodyMode>,
    response_mode: Option<BodyMode>,
    path: String,
    request_id: Option<String>,
    set_request_id: bool,
    test_selection: Option<Vec<AddressPattern>>,
    /// The session header's value (session affinity on).
    session: Option<String>,
    /// The request headers an `EndpointPickerConfig` reads (its session-affinity scorers').
    epp_headers: Vec<(String, String)>,
    /// The response headers it sets for the pick (`encoded_endpoint_header` tokens).
    epp_reply: Vec<(String, String)>,
    metadata: HashMap<String, Struct>,
    body: Vec<u8>,
    holding_headers: bool,
    /// The request was refused with an immediate response: Envoy ends the stream, so later
    /// messages of the request are not answered.
    rejected: bool,
    /// The request was routed: later request messages (which Envoy does not send) get a plain
    /// reply of their kind and never a second pick.
    routed: bool,
    /// Routed state when this stream observes the completion itself.
    route: Option<Ticket>,
    /// The key this stream's route waits under in [`PendingRoutes`] when another source will
    /// see the response.
    ///
    /// [`PendingRoutes`]: crate::routing::PendingRoutes
    route_key: Option<String>,
    status: Option<u32>,
    served: Served,
    completed: bool,
    /// The usage the response body reports (when this stream sees it): its token counts go to
    /// Envoy as metadata at the end, and with the affinity mode's `engineBudget` its
    /// `cached_tokens` to completion.
    usage: UsageScan,
    /// How the response body ends as an Anthropic event stream ([`crate::event_stream`]).
    events: EventScan,
    /// Whether this stream saw the response body (so `events` says how it ended).
    saw_body: bool,
    /// The affinity mode with `engineBudget`: completion checks `cached_tokens`.
    engine_budget: bool,
    /// The decision header's value (`picker.decisionHeader`), set on the response headers.
    decision_header: Option<String>,
    /// When the first response body bytes arrived (the first token of a stream).
    first_body: Option<Instant>,
    /// kvcache-aware: the body length a lookup was made for, and its result.
    kv_lookup: Option<(usize, Option<KvBlockOwners>)>,
    /// Flow control: the fairness header's value and the objective header's.
    fairness_id: Option<String>,
    objective: Option<String>,
    /// The `Authorization` header, kept only when the flow reads it (Kthena's JWT user).
    authorization: Option<String>,
    /// Flow control queued the request: the hold for the driver to await, and what its reply
    /// needs.
    hold: Option<Hold>,
    held: Option<HeldReply>,
}

/// Counts an open stream in `prefix_picker_inflight_streams` until dropped.
struct OpenStream(prometheus::IntGauge);

impl OpenStream {
    fn new(g: &prometheus::IntGauge) -> OpenStream {
        g.inc();
        OpenStream(g.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl StreamState {
    pub(super) fn new(router: Arc<Router>) -> StreamState {
        let engine_budget = router
            .scheduler
            .load()
            .scheduler
            .affinity()
            .is_some_and(|a| a.engine_budget);
        StreamState {
            _open: OpenStream::new(&router.metrics.inflight_streams),
            router,
            observer: false,
            request_mode: None,
            response_mode: None,
            path: String::new(),
            request_id: None,
            set_request_id: false,
            test_selection: None,
            session: None,
            epp_headers: Vec::new(),
            epp_reply: Vec::new(),
            metadata: HashMap::new(),
            body: Vec::new(),
            holding_headers: false,
            rejected: false,
            routed: false,
            route: None,
            route_key: None,
            status: None,
            served: Served::NotReported,
            completed: false,
            usage: UsageScan::default(),
            events: EventScan::default(),
            saw_body: false,
            engine_budget,
            decision_header: None,
            first_body: None,
            kv_lookup: None,
            fairness_id: None,
            objective: None,
            authorization: None,
            hold: None,
            held: None,
        }
    }

    fn handle(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if message.observability_mode {
            self.observer = true;
        }
        if let Some(pc) = &message.protocol_config {
            self.request_mode = Some(BodyMode::from_i32(pc.request_body_mode));
            self.response_mode = Some(BodyMode::from_i32(pc.response_body_mode));
        }
        if let Some(md) = message.metadata_context {
            merge_metadata(&mut self.metadata, md);
        }
        let replies = match message.request {
            Some(In::RequestHeaders(h)) => self.on_request_headers(h),
            Some(In::RequestBody(b)) => self.on_request_body(b),
            Some(In::RequestTrailers(_)) => self.on_request_trailers(),
            Some(In::ResponseHeaders(h)) => self.on_response_headers(h, &message.attributes),
            Some(In::ResponseBody(b)) => self.on_response_body(b),
            Some(In::ResponseTrailers(_)) => {
                self.complete();
                vec![self.with_cost(reply(Out::ResponseTrailers(TrailersResponse::default())))]
            }
            None => vec![],
        };
        if self.observer { vec![] } else { replies }
    }

    fn on_request_headers(&mut self, h: HttpHeaders) -> Vec<ProcessingResponse> {
        let epp_wanted = self.router.epp_request_headers();
        let authorization_wanted = self.router.flow_reads_authorization();
        for header in h.headers.iter().flat_map(|m| &m.headers) {
            let value = header_value(header);
            if epp_wanted.contains(&header.key) {
                self.epp_headers
                    .push((header.key.clone(), value.clone().into_owned()));
            }
            match header.key.as_str() {
                ":path" => self.path = value.into_owned(),
                "x-request-id" if !value.is_empty() => self.request_id = Some(value.into_owned()),
                TEST_SELECTION_HEADER if self.router.config.allow_test_endpoint_selection => {
                    self.test_selection = Some(AddressPattern::parse_list(&value));
                }
                key if self.router.sessions.is_some()
                    && key == self.router.config.sessions.header
                    && !value.is_empty() =>
                {
                    self.session = Some(value.into_owned());
                }
                "authorization" if authorization_wanted => {
                    self.authorization = Some(value.into_owned());
                }
                // GIE's spelling wins over llm-d's when both are sent.
                key if FAIRNESS_HEADERS.contains(&key)
                    && (self.fairness_id.is_none() || key == FAIRNESS_HEADERS[0]) =>
                {
                    self.fairness_id = Some(value.into_owned());
                }
                key if OBJECTIVE_HEADERS.contains(&key)
                    && (self.objective.is_none() || key == OBJECTIVE_HEADERS[0]) =>
                {
                    self.objective = Some(value.into_owned());
                }
                _ => {}
            }
        }
        if self.observer || self.rejected {
            return vec![];
        }
        if self.routed {
            return vec![reply(Out::RequestHeaders(HeadersResponse::default()))];
        }
        if self.request_id.is_none() {
            self.request_id = Some(uuid::Uuid::new_v4().to_string());
            self.set_request_id = true;
        }
        if h.end_of_stream {
            return self.route_now(None);
        }
        match self.request_mode {
            Some(BodyMode::FullDuplex) => {
                self.holding_headers = true;
                vec![]
            }
            Some(BodyMode::None) => self.route_now(None),
            _ => vec![reply(Out::RequestHeaders(HeadersResponse::default()))],
        }
    }

    fn on_request_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        if self.observer || self.rejected {
            return vec![];
        }
        if self.routed {
            return match self.request_mode {
                Some(BodyMode::FullDuplex) => vec![reply(Out::RequestBody(streamed_body(
                    b.body,
                    b.end_of_stream,
                )))],
                _ => vec![reply(Out::RequestBody(BodyResponse::default()))],
            };
        }
        if self.path.is_empty() && self.body.is_empty() {
            warn_request_headers_skipped();
        }
        if self.body.len() + b.body.len() > self.router.config.max_body_bytes {
            return vec![self.immediate(&RouteFailure::new(
                413,
                "invalid_request_error",
                format!(
                    "request body exceeds the limit of {} bytes",
                    self.router.config.max_body_bytes
                ),
            ))];
        }
        // BUFFERED: Envoy sends the whole body in one message, with `end_of_stream` false only
        // when request trailers follow it (its ext_proc filter sends the buffered body when the
        // trailers arrive, headers still held), so that message is the body's end too.
        // The usual case is one message with the whole body: kept without a copy.
        if self.body.is_empty() {
            self.body = b.body;
        } else {
            self.body.extend_from_slice(&b.body);
        }
        if b.end_of_stream || self.request_mode == Some(BodyMode::Buffered) {
            let end = if b.end_of_stream {
                BodyEnd::EndOfStream
            } else {
                BodyEnd::Trailers
            };
            return self.route_body(end);
        }
        self.body_continues()
    }

    /// A body message that is not the body's last (as far as its mode tells): FULL_DUPLEX
    /// waits for more, BUFFERED_PARTIAL routes a body that parses whole (trailers follow) and
    /// refuses one cut at Envoy's buffer limit, STREAMED continues.
    fn body_continues(&mut self) -> Vec<ProcessingResponse> {
        match self.request_mode {
            Some(BodyMode::FullDuplex) => vec![],
            Some(BodyMode::BufferedPartial) => {
                // Envoy sends `end_of_stream` false both for a body cut at its buffer limit and
                // for a whole body that request trailers follow: one that parses whole is the
                // latter.
                if crate::lenient_json::parse_value(&self.body).is_ok() {
                    return self.route_body(BodyEnd::Trailers);
                }
                vec![self.immediate(&RouteFailure::new(
                    413,
                    "invalid_request_error",
                    "request body exceeds Envoy's buffer limit",
                ))]
            }
            _ => vec![reply(Out::RequestBody(BodyResponse::default()))],
        }
    }

    fn on_request_trailers(&mut self) -> Vec<ProcessingResponse> {
        if self.rejected {
            return vec![];
        }
        if self.holding_headers {
            // FULL_DUPLEX body ended with trailers instead of end_of_stream.
            let mut replies = self.route_body(BodyEnd::Trailers);
            if let Some(held) = &mut self.held {
                held.trailers = true;
                return replies;
            }
            if !self.rejected {
                replies.push(reply(Out::RequestTrailers(TrailersResponse::default())));
            }
            return replies;
        }
        vec![reply(Out::RequestTrailers(TrailersResponse::default()))]
    }

    /// kvcache-aware's lookup when `message` may route the request (a body's last message, any
    /// `BUFFERED_PARTIAL` body message, the request trailers), over the body it would route;
    /// `None` when the plugin is off or nothing is to be looked up.
    fn lookup(&mut self, message: &ProcessingRequest) -> Option<Lookup> {
        if self.observer || message.observability_mode || self.rejected || self.routed {
            return None;
        }
        self.router
            .scheduler
            .load()
            .scheduler
            .config()
            .kvcache_aware()?;
        let joined;
        let body: &[u8] = match &message.request {
            Some(In::RequestBody(b))
                if b.end_of_stream || self.request_mode == Some(BodyMode::BufferedPartial) =>
            {
                if self.body.is_empty() {
                    &b.body
                } else {
                    joined = [self.body.as_slice(), &b.body].concat();
                    &joined
                }
            }
            Some(In::RequestTrailers(_)) if !self.body.is_empty() => &self.body,
            _ => return None,
        };
        if body.len() > self.router.config.max_body_bytes {
            return None;
        }
        let restrict = self.restriction().ok()?;
        let pending = self
            .router
            .kv_lookup(&self.path, body, restrict.as_deref())?;
        self.kv_lookup = Some((body.len(), None));
        // Its `KVCacheAware.Score:` lines carry the request id too.
        Some(Box::pin(tracing::Instrument::instrument(
            pending,
            self.decision_span(),
        )))
    }

    /// Routes on the whole body gathered so far ([`StreamState::route_now`]); a
    /// FULL_DUPLEX_STREAMED body then goes back to Envoy after the pick (moved, not copied: the
    /// stream needs it no more).
    fn route_body(&mut self, end: BodyEnd) -> Vec<ProcessingResponse> {
        let body = std::mem::take(&mut self.body);
        let full_duplex = self.holding_headers;
        let mut replies = self.route_now(Some(&body));
        if let Some(held) = &mut self.held {
            if full_duplex {
                held.full_duplex = Some((body, end));
            }
            return replies;
        }
        if full_duplex && self.routed {
            replies.extend(body_chunks(body, end));
        }
        replies
    }

    /// A held request's release: its pick (then, FULL_DUPLEX, its body back and the trailers'
    /// reply), or its refusal.
    fn released(&mut self, released: Released) -> Vec<ProcessingResponse> {
        let held = self.held.take().unwrap_or_default();
        match released {
            Released::Routed(routed) => {
                let mut replies = self.pick_reply(routed, held.has_body);
                if let Some((body, end)) = held.full_duplex {
                    replies.extend(body_chunks(body, end));
                }
                if held.trailers {
                    replies.push(reply(Out::RequestTrailers(TrailersResponse::default())));
                }
                replies
            }
            Released::Refused(f) => vec![self.immediate(&f)],
        }
    }

    /// Routes and builds the reply that carries the pick (or the immediate error): the headers
    /// reply when they were held (FULL_DUPLEX) or the request has no body, else the body reply.
    fn route_now(&mut self, body: Option<&[u8]>) -> Vec<ProcessingResponse> {
        let routed = match self.route(body) {
            Ok(Admitted::Routed(r)) => r,
            Ok(Admitted::Held(hold)) => return self.hold(hold, body.is_some()),
            Err(f) => return vec![self.immediate(&f)],
        };
        self.pick_reply(routed, body.is_some())
    }

    /// Flow control queued the request: the driver awaits `hold`. Envoy's timer for the
    /// message being answered (`message_timeout`; FULL_DUPLEX_STREAMED has none) is replaced by
    /// `override_message_timeout`, so that the hold does not end in Envoy's 504.
    fn hold(&mut self, hold: Hold, has_body: bool) -> Vec<ProcessingResponse> {
        let seconds = hold.message_timeout;
        self.hold = Some(hold);
        self.held = Some(HeldReply {
            has_body,
            ..HeldReply::default()
        });
        if seconds <= 0.0 || self.request_mode == Some(BodyMode::FullDuplex) {
            return vec![];
        }
        vec![ProcessingResponse {
            override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: seconds.trunc() as i64,
                nanos: (seconds.fract() * 1e9) as i32,
            }),
            ..ProcessingResponse::default()
        }]
    }

    /// The reply that carries the pick: on the headers when they were held (FULL_DUPLEX) or
    /// the request has no body, else on the body.
    fn pick_reply(&mut self, routed: Routed, has_body: bool) -> Vec<ProcessingResponse> {
        let destination = destination(&routed.decision.ranked);
        let prefill = routed
            .decision
            .pd
            .as_ref()
            .map(|pd| pd.prefill.host.as_str());
        let mut pick = routed.decision.pick_summary();
        pick.queued = routed.queued;
        self.log_pick(&routed, &destination, prefill, &pick);
        let decision = decision_value(&pick, self.request_id.as_deref().unwrap_or_default());
        if self.router.config.decision_header {
            self.decision_header = Some(decision.clone());
        }
        self.routed = true;
        self.epp_reply = self
            .router
            .epp_response_headers(&routed.decision.primary().label);
        self.route_key = self.keep_route(routed.ticket);
        let request_id = self
            .set_request_id
            .then_some(self.request_id.as_deref().unwrap_or_default());
        let common = CommonResponse {
            header_mutation: Some(pick_headers(&destination, prefill, request_id)),
            clear_route_cache: true,
            ..CommonResponse::default()
        };
        let response = if !has_body || self.holding_headers {
            self.holding_headers = false;
            Out::RequestHeaders(HeadersResponse {
                response: Some(common),
            })
        } else {
            Out::RequestBody(BodyResponse {
                response: Some(common),
            })
        };
        vec![ProcessingResponse {
            response: Some(response),
            dynamic_metadata: Some(lb_metadata(
                &destination,
                self.route_key.as_deref(),
                decision,
            )),
            ..ProcessingResponse::default()
        }]
    }

    /// The router's decision for this request: its candidates narrowed by the subset hint (and
    /// the conformance header), its session, and kvcache-aware's owners when the lookup was made
    /// for this very body.
    fn route(&mut self, body: Option<&[u8]>) -> Result<Admitted, RouteFailure> {
        let span = self.decision_span();
        let _decision = span.enter();
        let restrict = self.restriction()?;
        let kv = self
            .kv_lookup
            .take()
            .filter(|(len, _)| Some(*len) == body.map(<[u8]>::len))
            .and_then(|(_, owners)| owners);
        self.router.route_flow(FlowRequest {
            path: &self.path,
            body,
            restrict: restrict.as_deref(),
            session: self.session.as_deref().map(str::as_bytes),
            headers: &self.epp_headers,
            kv: kv.as_ref(),
            flow: self.fairness_id.as_deref(),
            authorization: self.authorization.as_deref(),
            objective: self.objective.as_deref(),
            span: Some(&span),
        })
    }

    /// The span every `--v 4` score and prediction line of this request's decision is written
    /// in: it carries the request id (on the lines' own target, so on exactly when they are).
    fn decision_span(&self) -> tracing::Span {
        tracing::debug_span!(
            target: "scores",
            "decision",
            request_id = self.request_id.as_deref().unwrap_or_default()
        )
    }

    fn log_pick(
        &self,
        routed: &Routed,
        destination: &str,
        prefill: Option<&str>,
        pick: &crate::scheduler::PickSummary,
    ) {
        tracing::debug!(
            request_id = self.request_id.as_deref().unwrap_or(""),
            model = %routed.ticket.model,
            pod = %pick.pod,
            destination = %destination,
            prefill = prefill.unwrap_or(""),
            reason = pick.reason.as_str(),
            matched_tokens = pick.matched_tokens,
            uncached_tokens = pick.uncached_tokens,
            queued_ms = pick.queued.as_millis() as u64,
            session = %routed.ticket.session.map(|k| k.to_string()).unwrap_or_default(),
            "picked"
        );
    }

    /// Keeps the ticket for completion: on this stream, or (when this stream will not see the
    /// response) in [`PendingRoutes`], returning the issued route key it waits under.
    ///
    /// [`PendingRoutes`]: crate::routing::PendingRoutes
    fn keep_route(&mut self, route: Ticket) -> Option<String> {
        // A stream without request headers (no request id) keeps its route, as before keys
        // were issued: it ends with the stream.
        match (self.response_mode, &self.request_id) {
            (Some(BodyMode::None) | None, Some(_)) => Some(self.router.pending.insert(route)),
            _ => {
                self.route = Some(route);
                None
            }
        }
    }

    /// The key a pending route is claimed by: this stream's own route key if it routed; for an
    /// observer, the [`ROUTE_KEY`] the routing stream put in `envoy.lb` metadata (the client's
    /// `x-request-id` claims nothing: anyone can send it).
    fn pending_key(&self) -> Option<&str> {
        self.route_key
            .as_deref()
            .or_else(|| route_key_from_metadata(&self.metadata))
    }

    /// Claims the route waiting under [`StreamState::pending_key`], if this replica routed it
    /// (a key of another replica is warned about: an observer stream sent to another picker).
    fn take_pending(&self) -> Option<Ticket> {
        match self.router.pending.take(self.pending_key()?) {
            Ok(route) => Some(route),
            Err(Miss::OtherReplica) => {
                warn_other_replica();
                None
            }
            Err(_) => None,
        }
    }

    /// Candidate restriction from the subset hint and (when enabled) the conformance header.
    fn restriction(&self) -> Result<Option<Vec<AddressPattern>>, RouteFailure> {
        let hint = read_subset_hint(&self.metadata);
        if hint.as_ref().is_some_and(Vec::is_empty) {
            return Err(RouteFailure::new(
                503,
                "service_unavailable",
                "the subset hint lists no endpoint",
            ));
        }
        Ok(match (hint, &self.test_selection) {
            (hint, None) => hint,
            (None, Some(selection)) => Some(selection.clone()),
            (Some(hint), Some(selection)) => Some(AddressPattern::narrow(hint, selection)),
        })
    }

    fn on_response_headers(
        &mut self,
        h: HttpHeaders,
        attributes: &HashMap<String, Struct>,
    ) -> Vec<ProcessingResponse> {
        self.status = h
            .headers
            .iter()
            .flat_map(|m| &m.headers)
            .find(|hv| hv.key == ":status")
            .and_then(|hv| header_value(hv).parse().ok());
        self.served = self.served_endpoint(attributes);
        let mut set_headers = vec![];
        if self.router.config.allow_test_endpoint_selection
            && let Served::Pod(e) = &self.served
        {
            set_headers.push(set_header(CONFORMANCE_SERVED_HEADER, &e.host));
        }
        if let Some(decision) = self.decision_header.take() {
            set_headers.push(set_header(DECISION_HEADER, &decision));
        }
        for (name, value) in std::mem::take(&mut self.epp_reply) {
            set_headers.push(set_header(&name, &value));
        }
        let mut response = HeadersResponse::default();
        if !set_headers.is_empty() {
            response.response = Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: vec![],
                }),
                ..CommonResponse::default()
            });
        }
        // A response without a body: seen whole (and empty).
        self.saw_body = h.end_of_stream;
        if h.end_of_stream || (!self.observer && self.response_mode == Some(BodyMode::None)) {
            self.complete();
        }
        vec![reply(Out::ResponseHeaders(response))]
    }

    fn on_response_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        let eos = b.end_of_stream;
        if self.first_body.is_none() && !b.body.is_empty() {
            self.first_body = Some(Instant::now());
            if let Some(route) = self.route.as_mut() {
                route.prefill_done();
            }
        }
        self.usage.feed(&b.body);
        self.events.feed(&b.body);
        self.saw_body |= eos;
        let response = if self.response_mode == Some(BodyMode::FullDuplex) {
            reply(Out::ResponseBody(streamed_body(b.body, eos)))
        } else {
            reply(Out::ResponseBody(BodyResponse::default()))
        };
        if eos {
            self.complete();
            return vec![self.with_cost(response)];
        }
        vec![response]
    }

    /// The response's last reply with the token counts the body reported as Envoy dynamic
    /// metadata ([`cost_metadata`]), for a rate limiter, a billing pipeline, the access log.
    fn with_cost(&self, mut last: ProcessingResponse) -> ProcessingResponse {
        last.dynamic_metadata = cost_metadata(&self.usage.usage());
        last
    }

    /// The pod Envoy says served: `upstream.address`, else the `-served` metadata key.
    /// `Served::Unknown` when Envoy names an address that is not (or no longer) in the set.
    fn served_endpoint(&self, attributes: &HashMap<String, Struct>) -> Served {
        let from_attribute = attributes
            .values()
            .filter_map(|s| s.fields.get("upstream.address"))
            .find_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => AddressPattern::parse(s).map(|p| p.addr()),
                _ => None,
            });
        let address = from_attribute.or_else(|| served_from_metadata(&self.metadata));
        Served::at(&self.router, address)
    }

    /// The response ended: record a 2xx for the serving pod, release the in-flight count.
    fn complete(&mut self) {
        if self.completed {
            return;
        }
        self.completed = true;
        let route = self.route.take().or_else(|| self.take_pending());
        if let Some(route) = route {
            let usage = self.usage.usage();
            tracing::debug!(
                request_id = self.request_id.as_deref().unwrap_or(""),
                status = self.status,
                served = self.served.label(),
                prompt_tokens = usage.prompt_tokens,
                cached_tokens = usage.cached_tokens,
                completion_tokens = usage.completion_tokens,
                "completed"
            );
            let ending = Ending::Completed {
                status: self.status,
                served: std::mem::replace(&mut self.served, Served::NotReported),
                cached_tokens: self
                    .engine_budget
                    .then(|| self.usage.cached_tokens())
                    .flatten(),
                first_byte: self.first_body,
                events: self.saw_body.then(|| self.events.end()),
            };
            self.router.complete(route, ending);
        }
    }

    /// The stream ended (normally or not).
    fn finish(&mut self) {
        if self.completed {
            return;
        }
        if let Some(route) = self.route.take() {
            self.router.complete(route, Ending::Aborted);
        }
        if self.observer
            && let Some(route) = self.take_pending()
        {
            self.router.complete(route, Ending::Aborted);
        }
    }

    /// The immediate response refusing the request (the stream answers nothing more).
    fn immediate(&mut self, failure: &RouteFailure) -> ProcessingResponse {
        self.rejected = true;
        self.router
            .metrics
            .immediate_responses
            .with_label_values(&[&failure.status.to_string()])
            .inc();
        tracing::debug!(status = failure.status, message = %failure.message, "immediate response");
        let mut set_headers = vec![set_header("content-type", "application/json")];
        if let Some(id) = &self.request_id {
            set_headers.push(set_header("x-request-id", id));
        }
        if let Some(seconds) = failure.retry_after {
            set_headers.push(set_header("retry-after", &seconds.to_string()));
        }
        if let Some(reason) = failure.dropped_reason {
            set_headers.push(set_header(DROPPED_REASON_HEADER, reason));
        }
        reply(Out::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(failure.status),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: vec![],
            }),
            body: failure.body(),
            details: format!("prefix_picker_{}", failure.status),
            grpc_status: None,
        }))
    }
}

/// A routing stream whose first message is the request body: the filter skips request headers,
/// so Envoy has already sent the request on (to a host of its own choosing) and will ignore the
/// pick. Such requests are routed by load and counted as unscored (`no_request_path`); this
/// says why, once per process.
fn warn_request_headers_skipped() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "a request body arrived without its request headers: the ext_proc filter skips them \
             (request_header_mode: SKIP), so Envoy forwards each request before the pick and \
             ignores it; set processing_mode.request_header_mode: SEND"
        );
    }
}

#[cfg(test)]
mod sequence_props;
#[cfg(test)]
pub(crate) mod tests;
