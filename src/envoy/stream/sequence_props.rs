//! Property tests of the ext_proc stream state machine: random message sequences, as a buggy or
//! hostile gateway could send them, and random well-formed exchanges in every body mode Envoy
//! offers, each against a fresh [`Router`] with three static pods.
//!
//! - Any sequence: no panic; every reply answers the phase of the message it replies to; an
//!   immediate response is a well-formed OpenAI-style error and comes at most once; a pick has
//!   identical header and `envoy.lb` values naming known pods; an observability-mode stream never
//!   replies; once the stream is gone and unclaimed routes have expired, no in-flight count is
//!   left behind.
//! - A well-formed exchange (request trailers or not, response body or not): exactly one routing
//!   outcome (a pick or an immediate error); in FULL_DUPLEX_STREAMED every request and response
//!   byte comes back, in order, and the request body ends the stream only if it ended it; each
//!   response message gets exactly one reply; a completed 2xx response of a routable prompt is
//!   recorded once, for the pod Envoy names if it is one of ours (the primary pick if Envoy names
//!   none), and no other status ever records.
//! - Two to four well-formed exchanges on one router whose messages (and stream ends)
//!   interleave in a random order, some sharing one `x-request-id`: each stream gets exactly one
//!   routing outcome, its own FULL_DUPLEX bytes back and one reply per response message; no
//!   in-flight count goes negative or exceeds the streams routed; the completion outcomes add
//!   up to those of the same exchanges run one at a time (each completion counted once), the
//!   index holds prompts for exactly the pods that served a recorded completion, and nothing is
//!   left in flight at the end.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::config::PickerConfig;
use crate::envoy::wire::DESTINATION_HEADER;
use crate::testing::envoy::*;
use crate::testing::*;

/// `picker.maxBodyBytes` of the routers here, small enough for bodies to exceed it.
const LIMIT: usize = 2048;

const PATHS: [&str; 6] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/other",
    "",
];

const UPSTREAMS: [&str; 5] = [
    "127.0.0.1:18001",
    "127.0.0.1:18002",
    "127.0.0.1:18003",
    "10.9.9.9:80",
    "not an address",
];

fn fresh_router() -> Arc<Router> {
    router_with(
        PickerConfig {
            max_body_bytes: LIMIT,
            ..PickerConfig::default()
        },
        three(),
    )
}

/// A routable completion body of several blocks (distinct per `i`).
fn routable(i: u8) -> Vec<u8> {
    completion("m", &long_prompt(&format!("prompt {i}")))
}

/// Request bodies: routable ones of each API, and every kind of bad one.
fn request_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (0u8..4).prop_map(routable),
        1 => (0u8..4).prop_map(|i| serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": long_prompt(&format!("chat {i}"))}],
        })).unwrap()),
        1 => Just(br#"{"model":"m","input":[{"role":"user","content":"hi"}]}"#.to_vec()),
        1 => Just(b"{\"model\":\"m\",\"prompt\":\"bad \xff\xfe utf-8 \\ud800 lone\"}".to_vec()),
        1 => Just(br#"{"model": 7, "prompt": "x"}"#.to_vec()),
        1 => Just(br#"{"model": "m", "prompt": ["a", 1]}"#.to_vec()),
        1 => Just(b"[1, 2, 3]".to_vec()),
        1 => Just(Vec::new()),
        1 => Just(completion("m", &"x".repeat(LIMIT))),
        2 => prop::collection::vec(any::<u8>(), 0..300),
    ]
}

fn status() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => Just(200u32),
        1 => Just(204u32),
        1 => Just(429u32),
        1 => Just(500u32),
        1 => Just(503u32),
        1 => 0u32..1000,
    ]
}

fn body_mode() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(NONE),
        Just(STREAMED),
        Just(BUFFERED),
        Just(BUFFERED_PARTIAL),
        Just(FULL_DUPLEX),
        Just(9),
    ]
}

/// One message of an arbitrary sequence.
#[derive(Debug, Clone)]
enum Step {
    RequestHeaders {
        path: usize,
        eos: bool,
        id: bool,
    },
    RequestBody {
        chunk: Vec<u8>,
        eos: bool,
    },
    RequestTrailers,
    ResponseHeaders {
        status: u32,
        upstream: Option<usize>,
        eos: bool,
    },
    ResponseBody {
        chunk: Vec<u8>,
        eos: bool,
    },
    ResponseTrailers,
}

impl Step {
    fn is_request_phase(&self) -> bool {
        matches!(
            self,
            Step::RequestHeaders { .. } | Step::RequestBody { .. } | Step::RequestTrailers
        )
    }

    fn message(&self) -> ProcessingRequest {
        match self {
            Step::RequestHeaders { path, eos, id } => {
                let extra: &[(&str, &str)] = if *id {
                    &[("x-request-id", "req-1")]
                } else {
                    &[]
                };
                headers(PATHS[*path], *eos, extra)
            }
            Step::RequestBody { chunk, eos } => body(chunk, *eos),
            Step::RequestTrailers => request_trailers(),
            Step::ResponseHeaders {
                status,
                upstream,
                eos,
            } => response_headers_eos(*status, upstream.map(|u| UPSTREAMS[u]), *eos),
            Step::ResponseBody { chunk, eos } => response_body(chunk, *eos),
            Step::ResponseTrailers => response_trailers(),
        }
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..PATHS.len(), any::<bool>(), any::<bool>())
            .prop_map(|(path, eos, id)| Step::RequestHeaders { path, eos, id }),
        4 => (request_body(), any::<bool>()).prop_map(|(chunk, eos)| Step::RequestBody { chunk, eos }),
        1 => Just(Step::RequestTrailers),
        2 => (status(), prop::option::of(0..UPSTREAMS.len()), any::<bool>())
            .prop_map(|(status, upstream, eos)| Step::ResponseHeaders { status, upstream, eos }),
        2 => (prop::collection::vec(any::<u8>(), 0..64), any::<bool>())
            .prop_map(|(chunk, eos)| Step::ResponseBody { chunk, eos }),
        1 => Just(Step::ResponseTrailers),
    ]
}

/// An arbitrary stream: optional modes and subset hint on the first message, an optional point
/// from which messages come in observability mode, and the messages.
#[derive(Debug, Clone)]
struct Sequence {
    modes: Option<(i32, i32)>,
    hint: Option<Vec<usize>>,
    observer_from: Option<usize>,
    steps: Vec<Step>,
}

fn sequence() -> impl Strategy<Value = Sequence> {
    (
        prop::option::of((body_mode(), body_mode())),
        prop::option::weighted(0.2, prop::collection::vec(0..UPSTREAMS.len(), 0..3)),
        prop::option::weighted(0.15, 0usize..8),
        prop::collection::vec(step(), 0..10),
    )
        .prop_map(|(modes, hint, observer_from, steps)| Sequence {
            modes,
            hint,
            observer_from,
            steps,
        })
}

/// Checks an immediate response is an OpenAI-style error with a 4xx/5xx status.
fn check_immediate(r: &ProcessingResponse) -> Result<(), TestCaseError> {
    let (code, json, headers) = immediate_of(r);
    prop_assert!((400..600).contains(&code), "status {code}");
    prop_assert_eq!(&json["error"]["code"], &serde_json::json!(code));
    prop_assert!(json["error"]["message"].is_string(), "{json}");
    prop_assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    Ok(())
}

/// The pick a reply carries, if any (checked: header and metadata identical, 1-5 distinct
/// addresses, all of them known pods).
fn pick_in(r: &ProcessingResponse) -> Result<Option<Vec<SocketAddr>>, TestCaseError> {
    if set_header_of(r, DESTINATION_HEADER).is_none() {
        prop_assert!(lb_value(r).is_none(), "metadata without the header: {r:?}");
        return Ok(None);
    }
    let pick = pick_of(r);
    for a in &pick {
        prop_assert!(PORTS.iter().any(|&p| addr(p) == *a), "unknown pod {a}");
    }
    Ok(Some(pick))
}

/// After the stream is gone and unclaimed routes expired, nothing is still counted in flight.
fn check_released(router: &Router) -> Result<(), TestCaseError> {
    router
        .pending
        .expire(Instant::now() + Duration::from_secs(3600));
    prop_assert_eq!(router.metrics.inflight_streams.get(), 0);
    prop_assert_eq!(inflight(router), vec![0, 0, 0]);
    Ok(())
}

/// Request body chunks: `body` cut at the given fractions (sorted, deduplicated).
fn chunks(body: &[u8], cuts: &[f64]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| (c * body.len() as f64) as usize)
        .filter(|&i| 0 < i && i < body.len())
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for i in at.into_iter().chain([body.len()]) {
        out.push(body[start..i].to_vec());
        start = i;
    }
    out
}

/// A well-formed exchange as Envoy runs it in one of its body modes.
#[derive(Debug, Clone)]
struct Exchange {
    request_mode: i32,
    response_mode: i32,
    path: usize,
    body: Vec<u8>,
    cuts: Vec<f64>,
    request_trailers: bool,
    status: u32,
    upstream: Option<usize>,
    response: Vec<Vec<u8>>,
    response_trailers: bool,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        prop_oneof![
            Just(BUFFERED),
            Just(BUFFERED_PARTIAL),
            Just(STREAMED),
            Just(FULL_DUPLEX)
        ],
        prop_oneof![Just(NONE), Just(STREAMED), Just(FULL_DUPLEX)],
        prop_oneof![4 => Just(0usize), 1 => 0..PATHS.len()],
        request_body(),
        prop::collection::vec(0.0f64..1.0, 0..4),
        any::<bool>(),
        status(),
        prop::option::of(0..UPSTREAMS.len()),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..4),
        any::<bool>(),
    )
        .prop_map(
            |(
                request_mode,
                response_mode,
                path,
                body,
                cuts,
                request_trailers,
                status,
                upstream,
                response,
                response_trailers,
            )| Exchange {
                // A STREAMED body ended by trailers is not routed: Envoy has forwarded the
                // request at its headers, and a trailers reply cannot carry a pick.
                request_trailers: request_trailers && request_mode != STREAMED,
                request_mode,
                response_mode,
                path,
                body,
                cuts,
                status,
                upstream,
                response,
                response_trailers,
            },
        )
}

/// What Envoy sends for the request phase of `x` (`extra`: more request headers).
fn request_messages(x: &Exchange, extra: &[(&str, &str)]) -> Vec<ProcessingRequest> {
    let no_body = x.body.is_empty() && !x.request_trailers;
    let mut out = vec![modes(
        headers(PATHS[x.path], no_body, extra),
        x.request_mode,
        x.response_mode,
    )];
    if no_body {
        return out;
    }
    let parts = if x.request_mode == BUFFERED || x.request_mode == BUFFERED_PARTIAL {
        // Envoy buffers the whole body (it fits Envoy's buffer) and sends it in one message.
        vec![x.body.clone()]
    } else {
        chunks(&x.body, &x.cuts)
    };
    let last = parts.len() - 1;
    for (i, part) in parts.into_iter().enumerate() {
        out.push(body(&part, i == last && !x.request_trailers));
    }
    if x.request_trailers {
        out.push(request_trailers());
    }
    out
}

/// What Envoy sends for the response phase of `x`.
fn response_messages(x: &Exchange) -> Vec<ProcessingRequest> {
    let no_body = x.response_mode == NONE || (x.response.is_empty() && !x.response_trailers);
    let mut out = vec![response_headers_eos(
        x.status,
        x.upstream.map(|u| UPSTREAMS[u]),
        no_body && x.response_mode != NONE,
    )];
    if no_body {
        return out;
    }
    let last = x.response.len().saturating_sub(1);
    for (i, part) in x.response.iter().enumerate() {
        out.push(response_body(part, i == last && !x.response_trailers));
    }
    if x.response_trailers {
        out.push(response_trailers());
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_message_sequence_is_answered_within_the_protocol(seq in sequence()) {
        let router = fresh_router();
        let mut stream = StreamState::new(router.clone());
        let (mut immediates, mut picks) = (0, 0);
        for (i, step) in seq.steps.iter().enumerate() {
            let mut message = step.message();
            if i == 0 {
                if let Some((request, response)) = seq.modes {
                    message = modes(message, request, response);
                }
                if let Some(hint) = &seq.hint {
                    let hint: Vec<&str> = hint.iter().map(|&u| UPSTREAMS[u]).collect();
                    message = with_metadata(message, subset_hint(list_value(&hint)));
                }
            }
            let observing = seq.observer_from.is_some_and(|from| i >= from);
            if observing {
                message = observed(message);
            }
            let replies = stream.handle(message);
            if observing {
                prop_assert!(replies.is_empty(), "an observer answered: {replies:?}");
            }
            for r in &replies {
                let Some(out) = r.response.as_ref() else {
                    return Err(TestCaseError::fail(format!("empty reply to {step:?}")));
                };
                let request_reply = matches!(
                    out,
                    Out::RequestHeaders(_)
                        | Out::RequestBody(_)
                        | Out::RequestTrailers(_)
                        | Out::ImmediateResponse(_)
                );
                prop_assert_eq!(request_reply, step.is_request_phase(), "{:?} answered {:?}", step, out);
                if matches!(out, Out::ImmediateResponse(_)) {
                    check_immediate(r)?;
                    immediates += 1;
                    prop_assert!(picks == 0, "an error after a pick");
                }
                if pick_in(r)?.is_some() {
                    picks += 1;
                    prop_assert!(immediates == 0, "a pick after an error");
                }
            }
        }
        prop_assert!(immediates <= 1, "{immediates} immediate responses");
        drop(stream);
        check_released(&router)?;
    }

    #[test]
    fn well_formed_exchanges_route_once_and_lose_no_bytes(x in exchange()) {
        let router = fresh_router();
        let mut stream = StreamState::new(router.clone());
        let mut replies = Vec::new();
        for message in request_messages(&x, &[]) {
            replies.extend(stream.handle(message));
        }
        let immediate = replies
            .iter()
            .filter(|r| matches!(r.response, Some(Out::ImmediateResponse(_))))
            .count();
        let mut picks = Vec::new();
        for r in &replies {
            if let Some(p) = pick_in(r)? {
                picks.push(p);
            }
        }
        prop_assert_eq!(immediate + picks.len(), 1, "replies: {:?}", replies);
        if immediate == 1 {
            let last = replies.last().unwrap();
            prop_assert!(matches!(last.response, Some(Out::ImmediateResponse(_))), "{:?}", replies);
            check_immediate(last)?;
            drop(stream);
            prop_assert_eq!(router.metrics.records.with_label_values(&["recorded"]).get(), 0);
            return check_released(&router);
        }
        if x.request_mode == FULL_DUPLEX {
            let chunks: Vec<(&[u8], bool)> = replies
                .iter()
                .filter(|r| matches!(r.response, Some(Out::RequestBody(_))))
                .filter_map(streamed)
                .collect();
            let echoed: Vec<u8> = chunks.iter().flat_map(|(bytes, _)| bytes.to_vec()).collect();
            prop_assert!(echoed == x.body, "{} bytes back of {}", echoed.len(), x.body.len());
            // Only a body that ended the stream ends it again; trailers end it otherwise.
            let ends: Vec<bool> = chunks.iter().map(|&(_, eos)| eos).collect();
            let body_ended = !x.request_trailers && !x.body.is_empty();
            let expected: Vec<bool> = (0..ends.len()).map(|i| body_ended && i + 1 == ends.len()).collect();
            prop_assert_eq!(ends, expected);
        }

        let mut echoed = Vec::new();
        for message in response_messages(&x) {
            let r = stream.handle(message);
            prop_assert_eq!(r.len(), 1, "{:?}", r);
            if matches!(r[0].response, Some(Out::ResponseBody(_))) && x.response_mode == FULL_DUPLEX {
                let (bytes, _) = streamed(&r[0]).expect("a FULL_DUPLEX chunk is echoed");
                echoed.extend_from_slice(bytes);
            }
        }
        if x.response_mode == FULL_DUPLEX {
            prop_assert_eq!(echoed, x.response.concat());
        }
        drop(stream);

        let recorded = router.metrics.records.with_label_values(&["recorded"]).get();
        let success = (200..300).contains(&x.status);
        if !success {
            prop_assert_eq!(recorded, 0);
        } else if x.path == 0 && (0..4).any(|i| x.body == routable(i)) {
            // A routable completion is recorded once: for the pod Envoy names when it is one of
            // ours, for the primary pick when Envoy names none (or nothing parsable), for nobody
            // when Envoy names an address that is not a pod.
            let named: Option<SocketAddr> = x.upstream.and_then(|u| UPSTREAMS[u].parse().ok());
            let served = match named {
                None => Some(picks[0][0]),
                Some(a) => PORTS.iter().any(|&p| addr(p) == a).then_some(a),
            };
            prop_assert_eq!(recorded, u64::from(served.is_some()));
            if let Some(pod) = served {
                prop_assert!(entries(&router, pod) > 0);
            }
        }
        check_released(&router)?;
    }
}

/// `prefix_picker_records_total`'s outcomes, in a fixed order.
const OUTCOMES: [&str; 6] = [
    "recorded",
    "failed",
    "aborted",
    "unknown_pod",
    "unscored",
    "expired",
];

fn outcome_counts(router: &Router) -> Vec<u64> {
    OUTCOMES
        .iter()
        .map(|o| router.metrics.records.with_label_values(&[o]).get())
        .collect()
}

/// Several exchanges at once, some sending one shared request id, and the order in which
/// their messages (and stream ends) are sent: each index picks one of the streams still open.
#[derive(Debug, Clone)]
struct Interleaving {
    streams: Vec<(Exchange, bool)>,
    order: Vec<prop::sample::Index>,
}

fn interleaving() -> impl Strategy<Value = Interleaving> {
    (
        prop::collection::vec((exchange(), any::<bool>()), 2..=4),
        prop::collection::vec(any::<prop::sample::Index>(), 0..64),
    )
        .prop_map(|(streams, order)| Interleaving { streams, order })
}

const SHARED_ID: [(&str, &str); 1] = [("x-request-id", "shared-id")];

/// One stream of an [`Interleaving`] in progress.
struct Live {
    x: Exchange,
    stream: Option<StreamState>,
    /// Messages still to send; the response's are queued once the request phase routed.
    queue: VecDeque<ProcessingRequest>,
    request_left: usize,
    request_replies: Vec<ProcessingResponse>,
    response_echo: Vec<u8>,
    /// The pick, once routed.
    pick: Option<Vec<SocketAddr>>,
    immediate: bool,
}

impl Live {
    fn new(router: &Arc<Router>, x: &Exchange, shared_id: bool) -> Live {
        let extra: &[(&str, &str)] = if shared_id { &SHARED_ID } else { &[] };
        let queue: VecDeque<_> = request_messages(x, extra).into();
        Live {
            x: x.clone(),
            stream: Some(StreamState::new(router.clone())),
            request_left: queue.len(),
            queue,
            request_replies: Vec::new(),
            response_echo: Vec::new(),
            pick: None,
            immediate: false,
        }
    }

    /// Sends the next message, or ends the stream when none is left.
    fn step(&mut self) -> Result<(), TestCaseError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let Some(message) = self.queue.pop_front() else {
            self.stream = None;
            return Ok(());
        };
        let replies = stream.handle(message);
        if self.request_left == 0 {
            prop_assert_eq!(replies.len(), 1, "{:?}", replies);
            if matches!(replies[0].response, Some(Out::ResponseBody(_)))
                && self.x.response_mode == FULL_DUPLEX
            {
                let (bytes, _) = streamed(&replies[0]).expect("a FULL_DUPLEX chunk is echoed");
                self.response_echo.extend_from_slice(bytes);
            }
            return Ok(());
        }
        self.request_left -= 1;
        for r in &replies {
            if matches!(r.response, Some(Out::ImmediateResponse(_))) {
                check_immediate(r)?;
                prop_assert!(self.pick.is_none() && !self.immediate, "a second outcome");
                self.immediate = true;
            }
            if let Some(p) = pick_in(r)? {
                prop_assert!(self.pick.is_none() && !self.immediate, "a second outcome");
                self.pick = Some(p);
            }
        }
        self.request_replies.extend(replies);
        if self.immediate {
            // Envoy ends the stream after an immediate response.
            self.queue.clear();
        } else if self.request_left == 0 {
            prop_assert!(
                self.pick.is_some(),
                "no routing outcome: {:?}",
                self.request_replies
            );
            self.queue.extend(response_messages(&self.x));
        }
        Ok(())
    }

    /// The FULL_DUPLEX bytes sent back match what was sent.
    fn check_echoes(&self) -> Result<(), TestCaseError> {
        if self.immediate {
            return Ok(());
        }
        if self.x.request_mode == FULL_DUPLEX {
            let echoed: Vec<u8> = self
                .request_replies
                .iter()
                .filter(|r| matches!(r.response, Some(Out::RequestBody(_))))
                .filter_map(streamed)
                .flat_map(|(bytes, _)| bytes.to_vec())
                .collect();
            prop_assert!(
                echoed == self.x.body,
                "{} bytes back of {}",
                echoed.len(),
                self.x.body.len()
            );
        }
        if self.x.response_mode == FULL_DUPLEX {
            prop_assert_eq!(&self.response_echo, &self.x.response.concat());
        }
        Ok(())
    }

    /// The pod a recorded completion of this stream is recorded for.
    fn recorded_for(&self) -> Option<SocketAddr> {
        let pick = self.pick.as_ref()?;
        if !(200..300).contains(&self.x.status) {
            return None;
        }
        match self.x.upstream.and_then(|u| UPSTREAMS[u].parse().ok()) {
            None => Some(pick[0]),
            Some(a) => PORTS.iter().any(|&p| addr(p) == a).then_some(a),
        }
    }
}

/// Runs `streams` on `router` in the order `order` gives (then round-robin); returns them.
fn run_interleaved(
    router: &Arc<Router>,
    streams: &[(Exchange, bool)],
    order: &[prop::sample::Index],
) -> Result<Vec<Live>, TestCaseError> {
    let mut live: Vec<Live> = streams
        .iter()
        .map(|(x, shared)| Live::new(router, x, *shared))
        .collect();
    let mut order = order.iter();
    loop {
        let open: Vec<usize> = (0..live.len())
            .filter(|&i| live[i].stream.is_some())
            .collect();
        if open.is_empty() {
            break;
        }
        let i = match order.next() {
            Some(at) => open[at.index(open.len())],
            None => open[0],
        };
        live[i].step()?;
        let counts = inflight(router);
        let routed = live.iter().filter(|l| l.pick.is_some()).count() as i64;
        prop_assert!(
            counts.iter().all(|&c| c >= 0),
            "negative in-flight count: {:?}",
            counts
        );
        prop_assert!(
            counts.iter().sum::<i64>() <= routed,
            "{:?} in flight, {} routed",
            counts,
            routed
        );
    }
    Ok(live)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn interleaved_streams_each_route_once_and_complete_once(il in interleaving()) {
        // The reference: each exchange alone, on a router of its own.
        let mut expected = vec![0u64; OUTCOMES.len()];
        let mut records_alone = Vec::new();
        for (x, shared) in &il.streams {
            let alone = fresh_router();
            run_interleaved(&alone, &[(x.clone(), *shared)], &[])?;
            check_released(&alone)?;
            let counts = outcome_counts(&alone);
            records_alone.push(counts[0] == 1);
            for (e, n) in expected.iter_mut().zip(counts) {
                *e += n;
            }
        }

        let router = fresh_router();
        let live = run_interleaved(&router, &il.streams, &il.order)?;
        for l in &live {
            l.check_echoes()?;
        }
        prop_assert_eq!(outcome_counts(&router), expected.clone(), "outcomes {:?}", OUTCOMES);
        let routed = live.iter().filter(|l| l.pick.is_some()).count() as u64;
        prop_assert_eq!(expected.iter().sum::<u64>(), routed, "one outcome per routed stream");
        // Recorded completions went to the pods that served them (the pod Envoy names, else
        // the stream's own primary pick), and nowhere else.
        let recorded: Vec<SocketAddr> = live
            .iter()
            .zip(&records_alone)
            .filter(|(_, records)| **records)
            .map(|(l, _)| l.recorded_for().expect("a recorded completion names a pod"))
            .collect();
        for &p in &PORTS {
            let pod = addr(p);
            prop_assert_eq!(
                entries(&router, pod) > 0,
                recorded.contains(&pod),
                "entries on {} (recorded for {:?})", pod, recorded
            );
        }
        check_released(&router)?;
    }
}
