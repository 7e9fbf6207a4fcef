//! What happens when a routed request ends ([`Router::complete`]): the prompt is recorded for
//! the pod that served it, on a 2xx completion only.
//!
//! Two sources report endings: an ext_proc stream that sees the response (its own routing
//! stream, or an observer filter's stream), and Envoy's gRPC access log
//! ([`crate::envoy::access_log`]). Both hand over the [`Ticket`] and the [`Ending`] (the
//! response status and [`Served`]); the outcome is counted in
//! `prefix_picker_records_total{outcome}`:
//! - `aborted`: the response did not complete (client gone, upstream reset, timeout), or a
//!   streamed Messages answer's body ended before `message_stop`;
//! - `failed`: completed with a non-2xx status (or none), or a streamed Messages answer whose
//!   body had an `error` event ([`crate::event_stream`]);
//! - `unscored`: 2xx, but the request had no prompt blocks to record;
//! - `unknown_pod`: 2xx, but Envoy named a serving address outside the endpoint set;
//! - `recorded`: 2xx, the blocks recorded for the serving pod (Envoy's report, else the
//!   primary pick) and, in PD mode, for the prefill pod named in `x-prefiller-host-port` (an
//!   ordinary record in its index). Dropping the route releases the in-flight counts.
//!
//! A tentative hold (affinity mode) is confirmed, moved or rolled back per pod: the decode
//! pod's by who served, the prefill pod's confirmed with the record or rolled back without it.
//! A hold that awaited its engine is counted by what ended it
//! (`prefix_picker_engine_holds_total{ended}`); one the engine confirmed before the request
//! ended is not counted again as a tentative record.
//!
//! A 2xx completion served by another pod than the pick moves the request's session there.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::endpoints::{Endpoint, InflightGuard, TokenLoadGuard};
use crate::event_stream::EventsEnd;
use crate::hashing::BlockHash;
pub use crate::metrics::outcomes::{RouteOutcome, TentativeOutcome};
use crate::metrics::{CachedTokens, RouterMetrics};
use crate::prefix_index::{ModelKey, PodSlot};
use crate::routing::pending::{Expired, HoldsEnded};
use crate::routing::{RecordOrigin, Router};
use crate::scheduler::latency::Prediction;
use crate::scheduler::{Decision, HoldEnd, TentativeHold};
use crate::sessions::SessionKey;

/// A routed request until it ends: what completion needs to record it. Holds the primary pod's
/// in-flight count (and, in the affinity mode, the tentative hold) until completed, or dropped
/// (aborted, expired).
#[derive(Debug)]
pub struct Ticket {
    pub model: String,
    pub hashes: Vec<BlockHash>,
    /// Keeps the primary pod's in-flight count until completion or abort.
    pub guard: InflightGuard,
    /// An `EndpointPickerConfig`: the primary's in-flight prompt tokens, released when the
    /// response's first body chunk arrives ([`Ticket::prefill_done`]) or with the ticket.
    pub prompt_tokens: Option<TokenLoadGuard>,
    /// The affinity mode's decision-time record, held until completion, rollback or expiry.
    pub tentative: Option<TentativeHold>,
    /// Affinity mode: blocks the primary pick held at the decision ([`Decision`]), checked
    /// against its engine's `cached_tokens` report.
    pub predicted_blocks: usize,
    /// Session affinity: the request's session, which follows the pod that serves it.
    pub session: Option<SessionKey>,
    /// PD mode: the prefill pod paired with the primary (named in `x-prefiller-host-port`).
    pub prefill: Option<PrefillTicket>,
    /// Affinity mode: the latency model's prediction for the primary, and when it was made;
    /// a completion by the primary teaches the model ([`crate::scheduler::latency`]).
    pub prediction: Option<(Prediction, Instant)>,
    /// A streamed Messages request: a source that sees the body completes it only at its
    /// `message_stop` ([`Ending::Completed`]'s `events`).
    pub event_stream: bool,
}

/// The prefill pod of a PD route: counted in flight until the route ends (the picker does not
/// see the prefill's own end), its tentative hold released then.
#[derive(Debug)]
pub struct PrefillTicket {
    pub guard: InflightGuard,
    /// An `EndpointPickerConfig`: the prefill pod's in-flight prompt tokens, released with the
    /// primary's ([`Ticket::prefill_done`]).
    pub prompt_tokens: Option<TokenLoadGuard>,
    pub tentative: Option<TentativeHold>,
}

impl PrefillTicket {
    pub fn pod(&self) -> &Arc<Endpoint> {
        self.guard.endpoint()
    }
}

impl Ticket {
    /// The ticket of `decision` (its hashes move into the ticket).
    pub(super) fn new(
        model: &str,
        decision: &mut Decision<Arc<Endpoint>>,
        tentative: Option<TentativeHold>,
        prefill_tentative: Option<TentativeHold>,
        metrics: &RouterMetrics,
    ) -> Ticket {
        Ticket {
            model: model.to_string(),
            hashes: std::mem::take(&mut decision.hashes),
            guard: InflightGuard::new(decision.primary().clone(), metrics),
            prompt_tokens: (decision.epp.inflight_tokens > 0).then(|| {
                TokenLoadGuard::new(decision.primary().clone(), decision.epp.inflight_tokens)
            }),
            tentative,
            predicted_blocks: decision.predicted_blocks,
            prediction: decision.primary_prediction().map(|p| (p, Instant::now())),
            session: None,
            event_stream: false,
            prefill: decision.pd.as_ref().map(|pd| PrefillTicket {
                guard: InflightGuard::new(pd.prefill.clone(), metrics),
                prompt_tokens: (decision.epp.prefill_tokens > 0)
                    .then(|| TokenLoadGuard::new(pd.prefill.clone(), decision.epp.prefill_tokens)),
                tentative: prefill_tentative,
            }),
        }
    }

    /// Ends the route's tentative holds (decode and prefill pods), for a route that ends
    /// without a completion (expired).
    pub fn end_holds(&mut self) -> HoldsEnded {
        let mut out = HoldsEnded::default();
        let prefill = self.prefill.as_mut().and_then(|p| p.tentative.take());
        for hold in [self.tentative.take(), prefill].into_iter().flatten() {
            out.add(hold.end());
        }
        out
    }

    /// The response's first body chunk arrived: the prefill is done, its prompt tokens leave
    /// the pod's in-flight token load.
    pub fn prefill_done(&mut self) {
        self.prompt_tokens = None;
        if let Some(p) = &mut self.prefill {
            p.prompt_tokens = None;
        }
    }

    /// The primary pick.
    pub fn primary(&self) -> &Arc<Endpoint> {
        self.guard.endpoint()
    }
}

/// Who served the response, as far as Envoy told.
#[derive(Debug, Clone)]
pub enum Served {
    /// Envoy did not say (no attribute, no metadata): the primary pick is assumed.
    NotReported,
    Pod(Arc<Endpoint>),
    /// Envoy named an address outside the endpoint set: nothing is recorded.
    Unknown,
}

impl Served {
    /// The serving pod's label for a log line: `""` when not reported, `unknown` outside the
    /// endpoint set.
    pub fn label(&self) -> &str {
        match self {
            Served::NotReported => "",
            Served::Pod(e) => &e.label,
            Served::Unknown => "unknown",
        }
    }

    /// The endpoint at `address` (None: not reported).
    pub fn at(router: &Router, address: Option<SocketAddr>) -> Served {
        match address {
            None => Served::NotReported,
            Some(address) => match router.endpoints.snapshot().by_address(&address) {
                Some(e) => Served::Pod(e.clone()),
                None => Served::Unknown,
            },
        }
    }
}

/// How a routed request ended.
#[derive(Debug, Clone)]
pub enum Ending {
    /// The response ended normally with this status (None: no status seen), and the
    /// `cached_tokens` the engine reported in it, when the source saw the response body.
    Completed {
        status: Option<u32>,
        served: Served,
        cached_tokens: Option<u64>,
        /// When the first response body bytes reached the source (a stream's first token),
        /// when it saw the body.
        first_byte: Option<Instant>,
        /// How the body ended as an Anthropic event stream, when the source saw the body
        /// (read for a streamed Messages request only: [`Ticket::event_stream`]).
        events: Option<EventsEnd>,
    },
    /// It did not complete.
    Aborted,
}

/// Checks the engine's `cached_tokens` report against the blocks the pod was predicted to
/// hold (affinity mode with `engineBudget`): when it reports under half of the prediction, the
/// first block it missed and every entry older than it leave the pod's list, before the prompt
/// is recorded again (the engine holds it now, having computed it).
fn correct_estimate(router: &Router, route: &Ticket, pod: &Endpoint, reported: u64) {
    let live = router.scheduler.load();
    let Some(a) = live.scheduler.affinity().filter(|a| a.engine_budget) else {
        return;
    };
    let block = live.scheduler.prefix_cache().args().block_size_to_hash as u64;
    let per_token = u64::from(a.bytes_per_token);
    let predicted = route.predicted_blocks as u64 * block / per_token;
    let m = &router.metrics.cached_tokens;
    m.with_label_values(&[CachedTokens::Predicted.as_str()])
        .inc_by(predicted);
    m.with_label_values(&[CachedTokens::Reported.as_str()])
        .inc_by(reported);
    if reported.saturating_mul(2) >= predicted {
        return;
    }
    let held = usize::try_from(reported * per_token / block).unwrap_or(usize::MAX);
    let Some(&missing) = route.hashes.get(held) else {
        return;
    };
    let dropped =
        router
            .scheduler
            .index()
            .drop_older(&pod.index, ModelKey::of(&route.model), missing);
    router.metrics.estimate_dropped.inc_by(dropped as u64);
    tracing::debug!(pod = %pod.label, predicted, reported, dropped, "engine holds less than predicted");
}

/// Teaches the latency model a 2xx completion by the primary pick, picked `at`: requests
/// picked with a free slot time the pod's service and the prefill rate; every one counts the
/// model's error (observed over predicted time to completion, and observed minus predicted
/// TTFT when the source saw the `first_byte`).
fn learn_latency(
    router: &Router,
    pod: &Endpoint,
    prediction: Prediction,
    at: Instant,
    first_byte: Option<Instant>,
) {
    let now = Instant::now();
    let seconds = now.saturating_duration_since(at).as_secs_f64();
    let m = &router.metrics;
    if let Some(first) = first_byte {
        let observed = first.saturating_duration_since(at).as_secs_f64();
        m.ttft_prediction_error
            .observe(observed - prediction.ttft());
    }
    pod.timing.observe_completion(now, pod.inflight());
    let live = router.scheduler.load();
    let rate = live.scheduler.prefill_rate();
    if rate.is_fitted() {
        let predicted = prediction.wait + rate.base() + prediction.prefill;
        if predicted > 0.0 {
            m.latency_model_ratio.observe(seconds / predicted);
        }
    }
    if prediction.has_slot {
        pod.timing.observe_service(seconds);
        rate.observe(prediction.uncached_tokens, prediction.running, seconds);
    }
}

impl Router {
    /// Finishes `ticket` as `ending` says: records a 2xx completion for the pod that served and
    /// counts the outcome. A tentative hold is confirmed (the record lands before the hold goes,
    /// so the prefix never looks unheld), moved, or rolled back.
    pub fn complete(&self, ticket: Ticket, ending: Ending) {
        complete(self, ticket, ending);
        // Its in-flight count is released: a queued request may go now.
        self.flow.slot_freed();
    }

    /// Drops the pending routes whose deadline is not after `now` (their in-flight counts and
    /// tentative holds released, nothing recorded) and counts them as `expired`. The start-up's
    /// ticker calls it every second with the clock.
    pub fn expire_pending(&self, now: Instant) -> Expired {
        let (expired, holds) = self.pending.expire_holds(now);
        if expired.routes > 0 {
            self.metrics
                .records
                .with_label_values(&[RouteOutcome::Expired.as_str()])
                .inc_by(expired.routes as u64);
        }
        if expired.tentative > 0 {
            self.metrics
                .tentative
                .with_label_values(&[TentativeOutcome::Expired.as_str()])
                .inc_by(expired.tentative as u64);
        }
        count_engine_holds(self, &holds);
        if expired.routes > 0 {
            self.flow.slot_freed();
        }
        expired
    }
}

fn complete(router: &Router, mut route: Ticket, ending: Ending) {
    follow_session(router, &route, &ending);
    let (outcome, served_slot) = match recordable(&route, ending) {
        Ok(served) => {
            let slot = served.pod.index.slot();
            record(router, &route, served);
            (RouteOutcome::Recorded, Some(slot))
        }
        Err(outcome) => (outcome, None),
    };
    router
        .metrics
        .records
        .with_label_values(&[outcome.as_str()])
        .inc();
    release_holds(router, &mut route, served_slot);
}

/// A session follows the pod that served a 2xx (Envoy fell back: not the pick).
fn follow_session(router: &Router, route: &Ticket, ending: &Ending) {
    if let (
        Some(key),
        Ending::Completed {
            status: Some(status),
            served: Served::Pod(pod),
            ..
        },
    ) = (route.session, ending)
        && (200..300).contains(status)
        && !Arc::ptr_eq(pod, route.guard.endpoint())
    {
        router.remember_session(key, pod.spec.address);
    }
}

/// A 2xx completion with blocks to record, and the pod it is recorded for.
struct Recordable {
    /// Envoy's report, else the primary pick.
    pod: Arc<Endpoint>,
    cached_tokens: Option<u64>,
    first_byte: Option<Instant>,
}

/// What `ending` lets completion record, or the outcome that records nothing.
fn recordable(route: &Ticket, ending: Ending) -> Result<Recordable, RouteOutcome> {
    match ending {
        Ending::Aborted => Err(RouteOutcome::Aborted),
        Ending::Completed { status, .. } if !status.is_some_and(|s| (200..300).contains(&s)) => {
            Err(RouteOutcome::Failed)
        }
        Ending::Completed {
            events: Some(EventsEnd::Error),
            ..
        } if route.event_stream => Err(RouteOutcome::Failed),
        Ending::Completed {
            events: Some(EventsEnd::Cut),
            ..
        } if route.event_stream => Err(RouteOutcome::Aborted),
        Ending::Completed { .. } if route.hashes.is_empty() => Err(RouteOutcome::Unscored),
        Ending::Completed {
            served: Served::Unknown,
            ..
        } => Err(RouteOutcome::UnknownPod),
        Ending::Completed {
            served,
            cached_tokens,
            first_byte,
            ..
        } => Ok(Recordable {
            pod: match served {
                Served::Pod(e) => e,
                _ => route.guard.endpoint().clone(),
            },
            cached_tokens,
            first_byte,
        }),
    }
}

/// Records the prompt for the pod that served (and, in PD mode, the prefill pod); a completion
/// by the primary pick first checks the engine's `cached_tokens` report and teaches the latency
/// model.
fn record(router: &Router, route: &Ticket, served: Recordable) {
    let pod = &served.pod;
    if Arc::ptr_eq(pod, route.guard.endpoint()) {
        if let Some(reported) = served.cached_tokens {
            correct_estimate(router, route, pod, reported);
        }
        if let Some((prediction, at)) = route.prediction {
            learn_latency(router, pod, prediction, at, served.first_byte);
        }
    }
    router.record(&route.model, &route.hashes, pod, RecordOrigin::Local);
    if let Some(prefill) = &route.prefill {
        router.record(
            &route.model,
            &route.hashes,
            prefill.pod(),
            RecordOrigin::Local,
        );
    }
}

/// Ends the route's tentative holds, counting each: the decode pod's confirmed when it served,
/// moved when another pod did, rolled back without a record; the prefill pod's (named in the
/// header, whoever decoded) confirmed with the record, rolled back without. A hold its engine
/// confirmed first counts only in `prefix_picker_engine_holds_total`.
fn release_holds(router: &Router, route: &mut Ticket, served_slot: Option<PodSlot>) {
    let end = |hold: TentativeHold, outcome: TentativeOutcome| {
        let mut ended = HoldsEnded::default();
        ended.add(hold.end());
        if ended.released() {
            router
                .metrics
                .tentative
                .with_label_values(&[outcome.as_str()])
                .inc();
        }
        count_engine_holds(router, &ended);
    };
    if let Some(hold) = route.tentative.take() {
        let outcome = decode_hold_outcome(served_slot, hold.pod());
        end(hold, outcome);
    }
    if let Some(hold) = route.prefill.as_mut().and_then(|p| p.tentative.take()) {
        let outcome = match served_slot {
            Some(_) => TentativeOutcome::Confirmed,
            None => TentativeOutcome::RolledBack,
        };
        end(hold, outcome);
    }
}

/// Counts `prefix_picker_engine_holds_total`.
fn count_engine_holds(router: &Router, ended: &HoldsEnded) {
    for (end, n) in HoldEnd::ALL.iter().zip(ended.engine) {
        if n > 0 {
            router
                .metrics
                .engine
                .holds
                .with_label_values(&[end.as_str()])
                .inc_by(n as u64);
        }
    }
}

/// The end of the decode pod's tentative hold (held for `held`), given the slot the prompt was
/// recorded for (none: nothing recorded).
fn decode_hold_outcome(served_slot: Option<PodSlot>, held: PodSlot) -> TentativeOutcome {
    match served_slot {
        Some(slot) if slot == held => TentativeOutcome::Confirmed,
        Some(_) => TentativeOutcome::Moved,
        None => TentativeOutcome::RolledBack,
    }
}

#[cfg(test)]
mod tests;
