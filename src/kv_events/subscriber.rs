//! One pod's event stream: a ZeroMQ SUB socket on the engine's publisher, the sequence tracked,
//! gaps filled through the replay endpoint, the result as [`Update`]s on a channel.
//!
//! - Connect: `tcp://host:port` (each attempt bounded by [`CONNECT_TIMEOUT`]), subscribe to every
//!   topic and read the configured one: a message whose topic frame is not exactly it is
//!   dropped, counted and warned about once, naming both topics. With no topic
//!   configured (vLLM's default), the first non-empty topic the publisher sends on is taken as
//!   its topic, with a warning: a publisher has one. Failed attempts and lost connections are retried with capped
//!   exponential backoff (100 ms doubling to 5 s, reset once connected). [`Update::Connected`]
//!   and [`Update::Disconnected`] mark each connection.
//! - Sequence: every message carries the publisher's counter. The first one is the baseline. The
//!   next expected is last + 1; a larger one is a gap (messages the PUB socket dropped at its
//!   high-water mark, or lost in transit): the missing batches are asked from the replay endpoint
//!   and delivered, in order, before the one that revealed the gap. A smaller one means the
//!   publisher restarted. A message that cannot be decoded does not advance the sequence, so the
//!   next one shows a gap and replay gets a second chance at it.
//! - Across a reconnect a gap is never replayed: a new connection may be a new publisher process
//!   whose counter restarted and ran past ours, and its replay buffer would hold another life's
//!   batches. Only `last + 1` continues; anything else resets.
//! - Catch-up, so that a subscriber started beside a warm engine sees the blocks the engine
//!   stored in the batches it still buffers, not only what it stores from then on. At its first
//!   connection the subscriber asks the replay endpoint for every batch the publisher holds (at
//!   most the newest [`MAX_REPLAY`]) and delivers them when they run unbroken; the newest is the
//!   baseline, and live messages up to it (sent while the replay ran) are dropped as duplicates.
//!   A first batch with nothing before it to continue (none held at connect, or the first after
//!   a reset for a restarted publisher, a reconnect or a gap too large) asks for what is held
//!   before it, delivered when it runs unbroken up to it. Otherwise nothing is delivered first.
//! - Replay (vLLM's ROUTER handler): a DEALER sends `["", start_seq as 8-byte big-endian]`; the
//!   publisher answers with `["", seq, payload]` for every buffered batch with `seq >= start`,
//!   then `["", -1 as 8 bytes, ""]` (current vLLM puts the topic before `seq`: `["", topic,
//!   seq, payload]`, and an empty one before the end marker; both forms are read). The
//!   subscriber stops reading once it has what it asked for (a gap, or a catch-up's run), at
//!   the end marker, or at [`REPLAY_TIMEOUT`]. Gaps over [`MAX_REPLAY`] batches are not asked
//!   for.
//! - [`Update::Reset`] when a gap cannot be filled (no replay endpoint, replay incomplete, too
//!   large, across a reconnect) or the sequence went back: the consumer drops everything it knows
//!   of the pod; the batches that follow describe only what the engine does from then on.
//!
//! Bad input (wrong topic, wrong frames, garbage, a batch over the [`Limits`]) is counted in
//! [`SubscriberStats`] and warned about once per cause, never fatal.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use super::event::{EventBatch, Limits, decode_batch};
pub use super::sequence::{MAX_REPLAY, ResetReason};
use super::sequence::{Sequence, Verdict};
use crate::backoff::Backoff;

/// How long one connection attempt (TCP and the ZeroMQ handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a replay may take, from connecting to the last batch of the gap.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// vLLM's end-of-replay marker: -1 as 8 big-endian bytes.
const END_SEQ: [u8; 8] = [0xff; 8];

/// Where one pod publishes (vLLM's `KVEventsConfig`, as seen from the router).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriberConfig {
    /// The PUB socket, `tcp://host:port`.
    pub endpoint: String,
    /// The replay ROUTER socket, `tcp://host:port`; `None`: gaps always reset.
    pub replay_endpoint: Option<String>,
    /// The engine's `topic` (vLLM's default: empty).
    pub topic: String,
    /// With no `topic`: a prefix the publisher's topic must start with, taken as its topic
    /// silently (llm-d's `topicFilter`, ZeroMQ's subscription filter); empty: any.
    pub topic_prefix: String,
    pub limits: Limits,
}

/// What the subscriber tells its consumer, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Connected (again): batches follow.
    Connected,
    /// One batch, in sequence: a replayed one fills a gap before the batch that revealed it.
    Batch { seq: u64, batch: EventBatch },
    /// The view of this pod is lost: drop it; what follows starts from nothing.
    Reset { reason: ResetReason },
    /// The connection is lost; the view stays valid until a `Reset` says otherwise.
    Disconnected,
}

/// Counters of one subscriber, plain atomics for the integrator to export.
#[derive(Debug, Default)]
pub struct SubscriberStats {
    /// Messages received on the SUB socket (any topic, any shape).
    pub received: AtomicU64,
    /// Batches decoded and delivered (live and replayed).
    pub decoded: AtomicU64,
    /// Messages refused: wrong frames or a payload that did not decode (limits included).
    pub decode_errors: AtomicU64,
    /// Messages whose topic frame was not the configured topic.
    pub wrong_topic: AtomicU64,
    /// No topic was configured and the publisher's was taken ([`State::accepts_topic`]).
    pub adopted_topic: AtomicBool,
    /// Events skipped for an unknown tag.
    pub unknown_events: AtomicU64,
    /// Gaps in the sequence seen.
    pub gaps: AtomicU64,
    /// Replay requests sent.
    pub replays: AtomicU64,
    /// Batches delivered from replay.
    pub replayed_batches: AtomicU64,
    /// `Reset`s sent.
    pub resets: AtomicU64,
    /// Connections established after the first.
    pub reconnects: AtomicU64,
    /// Now minus the last decoded batch's `ts`, in milliseconds (0 if the engine's clock is ahead).
    pub last_lag_ms: AtomicU64,
}

impl SubscriberStats {
    /// One batch decoded and about to be delivered: counted, and its lag (now minus the batch's
    /// `ts`, the engine's clock) kept.
    pub fn delivered(&self, batch_ts: f64) {
        self.decoded.fetch_add(1, Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let lag_ms = ((now - batch_ts) * 1000.0).max(0.0) as u64;
        self.last_lag_ms.store(lag_ms, Relaxed);
    }
}

/// One pod's subscriber. Run it in the caller's join set; [`Subscriber::stats`] before that.
#[derive(Debug)]
pub struct Subscriber {
    config: SubscriberConfig,
    stats: Arc<SubscriberStats>,
}

/// Why the receive loop of one connection ended.
enum End {
    /// Cancelled, or the consumer dropped its receiver.
    Stop,
    /// The connection broke.
    Lost,
}

impl Subscriber {
    pub fn new(config: SubscriberConfig) -> Subscriber {
        Subscriber {
            config,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<SubscriberStats> {
        Arc::clone(&self.stats)
    }

    /// Subscribes until `cancel` (or until `updates` is closed), reconnecting with backoff.
    pub async fn run(self, updates: mpsc::Sender<Update>, cancel: CancellationToken) {
        let mut state = State {
            config: &self.config,
            topic: self.config.topic.clone().into_bytes(),
            stats: &self.stats,
            updates: &updates,
            cancel: &cancel,
            seq: Sequence::default(),
            warned: Warned::default(),
        };
        let mut backoff = Backoff::new();
        let mut connected_before = false;
        loop {
            let connected = tokio::select! {
                _ = cancel.cancelled() => return,
                c = connect(&self.config) => c,
            };
            match connected {
                Ok((socket, monitor)) => {
                    if connected_before {
                        self.stats.reconnects.fetch_add(1, Relaxed);
                    }
                    connected_before = true;
                    backoff.reset();
                    state.warned.connect = false;
                    tracing::info!(endpoint = %self.config.endpoint, "KV events: connected");
                    state.seq.reconnected();
                    if !state.send(Update::Connected).await {
                        return;
                    }
                    if state.seq.last.is_none() {
                        let caught_up = tokio::select! {
                            _ = cancel.cancelled() => return,
                            ok = state.catch_up(Span::All) => ok,
                        };
                        if !caught_up {
                            return;
                        }
                    }
                    match state.receive(socket, monitor).await {
                        End::Stop => return,
                        End::Lost => {
                            tracing::info!(endpoint = %self.config.endpoint, "KV events: connection lost");
                            if !state.send(Update::Disconnected).await {
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut state.warned.connect, true) {
                        tracing::warn!(endpoint = %self.config.endpoint, error = %e,
                            "KV events: cannot connect; retrying with backoff");
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// A connected, subscribed socket and its event stream (to see the connection drop).
async fn connect(
    config: &SubscriberConfig,
) -> Result<(SubSocket, impl Stream<Item = SocketEvent> + Unpin), String> {
    let mut options = SocketOptions::default();
    options.connect_timeout(CONNECT_TIMEOUT);
    let mut socket = SubSocket::with_options(options);
    let monitor = socket.monitor();
    // Every topic, filtered here: a publisher on another topic is then seen, and named in the
    // warning, instead of filtered out silently by the publisher (vLLM publishes on one).
    socket.subscribe("").await.map_err(|e| e.to_string())?;
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(&config.endpoint)).await {
        Ok(Ok(())) => Ok((socket, monitor)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no connection within {CONNECT_TIMEOUT:?}")),
    }
}

/// Causes already warned about (once each per subscriber).
#[derive(Debug, Default)]
struct Warned {
    connect: bool,
    topic: bool,
    frames: bool,
    decode: bool,
    unknown: bool,
    replay: bool,
}

struct State<'a> {
    config: &'a SubscriberConfig,
    /// The topic read: the configured one, or, when that is empty, the one topic the publisher
    /// sends on once seen ([`State::accepts_topic`]).
    topic: Vec<u8>,
    stats: &'a SubscriberStats,
    updates: &'a mpsc::Sender<Update>,
    cancel: &'a CancellationToken,
    seq: Sequence,
    warned: Warned,
}

/// A message's sequence number and payload, or why it is not one.
fn split_message(message: &ZmqMessage, topic: &[u8]) -> Result<(u64, Vec<u8>), Refused> {
    if message.len() != 3 {
        return Err(Refused::Frames(message.len()));
    }
    let frame = |i| message.get(i).expect("three frames");
    if frame(0).as_ref() != topic {
        return Err(Refused::Topic);
    }
    let seq: [u8; 8] = frame(1)
        .as_ref()
        .try_into()
        .map_err(|_| Refused::SeqFrame(frame(1).len()))?;
    Ok((u64::from_be_bytes(seq), frame(2).to_vec()))
}

enum Refused {
    Frames(usize),
    Topic,
    SeqFrame(usize),
}

impl<'a> State<'a> {
    /// `false` when the consumer is gone or the subscriber is cancelled (a consumer that stops
    /// reading never holds up shutdown).
    async fn send(&self, update: Update) -> bool {
        if let Update::Reset { reason } = &update {
            self.stats.resets.fetch_add(1, Relaxed);
            tracing::warn!(endpoint = %self.config.endpoint, reason = %reason,
                "KV events: the pod's view is reset");
        }
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            sent = self.updates.send(update) => sent.is_ok(),
        }
    }

    async fn receive(
        &mut self,
        mut socket: SubSocket,
        mut monitor: impl Stream<Item = SocketEvent> + Unpin,
    ) -> End {
        let cancel = self.cancel;
        loop {
            let message = tokio::select! {
                biased;
                _ = cancel.cancelled() => return End::Stop,
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | None => return End::Lost,
                    Some(_) => continue,
                },
                m = socket.recv() => match m {
                    Ok(m) => m,
                    Err(_) => return End::Lost,
                },
            };
            self.stats.received.fetch_add(1, Relaxed);
            // A replay takes up to REPLAY_TIMEOUT: cancellation must not wait for it.
            let handled = tokio::select! {
                _ = cancel.cancelled() => false,
                handled = self.on_message(&message) => handled,
            };
            if !handled {
                return End::Stop;
            }
        }
    }

    /// Whether a message on `topic` is read. With no topic configured, the first non-empty
    /// topic seen is taken as the publisher's (vLLM publishes on one; a deployment that sets
    /// one and leaves the picker's at its default would otherwise see nothing), said once.
    fn accepts_topic(&mut self, topic: &[u8]) -> bool {
        (topic == self.topic.as_slice() && !self.awaits_prefixed_topic()) || self.adopt_topic(topic)
    }

    /// A topic prefix is set and no topic was taken yet: an empty topic is not it.
    fn awaits_prefixed_topic(&self) -> bool {
        self.topic.is_empty() && !self.config.topic_prefix.is_empty()
    }

    /// Takes `topic` as the publisher's when none is configured or taken yet.
    fn adopt_topic(&mut self, topic: &[u8]) -> bool {
        let prefix = self.config.topic_prefix.as_bytes();
        if self.config.topic.is_empty()
            && self.topic.is_empty()
            && !topic.is_empty()
            && topic.starts_with(prefix)
        {
            self.topic = topic.to_vec();
            if !prefix.is_empty() {
                // The filter said which topics to read: nothing to warn about.
                return true;
            }
            self.stats.adopted_topic.store(true, Relaxed);
            tracing::warn!(endpoint = %self.config.endpoint, topic = %String::from_utf8_lossy(topic),
                "KV events: picker.kvEvents.topic is empty and the publisher sends on this topic: reading it (set picker.kvEvents.topic to say so)");
            return true;
        }
        false
    }

    /// Handles one live message; `false` when the consumer is gone.
    async fn on_message(&mut self, message: &ZmqMessage) -> bool {
        let split = match split_message(message, &self.topic) {
            // No topic is taken while a prefix awaits one: an empty topic is not it.
            Ok(_) if self.awaits_prefixed_topic() => Err(Refused::Topic),
            // Only a message on another topic can be the publisher's first, when none is set.
            Err(Refused::Topic) if message.get(0).is_some_and(|t| self.adopt_topic(t)) => {
                split_message(message, &self.topic)
            }
            split => split,
        };
        let (seq, payload) = match split {
            Ok(m) => m,
            Err(Refused::Topic) => {
                self.stats.wrong_topic.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned.topic, true) {
                    let got = message
                        .get(0)
                        .map(|t| String::from_utf8_lossy(t).into_owned())
                        .unwrap_or_default();
                    tracing::warn!(endpoint = %self.config.endpoint,
                        "KV events: receiving topic {got:?}; picker.kvEvents.topic is {:?}: its messages are dropped and the pod is matched by the estimate (warned once; counted as wrong_topic)",
                        self.config.topic);
                }
                return true;
            }
            Err(refused) => {
                self.stats.decode_errors.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned.frames, true) {
                    let what = match refused {
                        Refused::Frames(n) => format!("{n} frames, expected 3"),
                        Refused::SeqFrame(n) => format!("a {n}-byte sequence frame, expected 8"),
                        Refused::Topic => unreachable!(),
                    };
                    tracing::warn!(endpoint = %self.config.endpoint, message = %what,
                        "KV events: malformed message dropped (warned once)");
                }
                return true;
            }
        };
        let Some(batch) = self.decode(seq, &payload) else {
            return true;
        };
        match self.seq.check(seq) {
            Verdict::Next => {}
            Verdict::Duplicate => return true,
            Verdict::First => {
                if !self.catch_up(Span::Before { until: seq }).await {
                    return false;
                }
            }
            Verdict::Gap { expected } => {
                self.stats.gaps.fetch_add(1, Relaxed);
                match self.replay(expected, seq).await {
                    Ok(batches) => {
                        for (s, b) in batches {
                            self.stats.replayed_batches.fetch_add(1, Relaxed);
                            if !self.deliver(s, b).await {
                                return false;
                            }
                        }
                    }
                    Err(reason) => {
                        if !self.send(Update::Reset { reason }).await {
                            return false;
                        }
                    }
                }
            }
            Verdict::Reset(reason) => {
                if !self.send(Update::Reset { reason }).await {
                    return false;
                }
                if reason.may_catch_up() && !self.catch_up(Span::Before { until: seq }).await {
                    return false;
                }
            }
        }
        self.deliver(seq, batch).await
    }

    /// Delivers what the publisher still buffers of `span` (everything, or what comes before
    /// the batch that starts the sequence), when it runs unbroken; `false` when the consumer is
    /// gone.
    async fn catch_up(&mut self, span: Span) -> bool {
        let Some(endpoint) = self.config.replay_endpoint.clone() else {
            return true;
        };
        if span == (Span::Before { until: 0 }) {
            return true;
        }
        let (got, failed) = self.replay_span(&endpoint, span).await;
        if let Some(why) = failed {
            if !std::mem::replace(&mut self.warned.replay, true) {
                tracing::warn!(endpoint = %endpoint, why = %why,
                    "KV events: catch-up replay failed; the view starts at the next batch (warned once)");
            }
            return true;
        }
        let Some(&(newest, _)) = got.back() else {
            return true;
        };
        tracing::info!(endpoint = %endpoint, batches = got.len(), newest,
            "KV events: caught up from the replay buffer");
        if span == Span::All {
            self.seq.caught_up(newest);
        }
        for (s, b) in got {
            self.stats.replayed_batches.fetch_add(1, Relaxed);
            if !self.deliver(s, b).await {
                return false;
            }
        }
        true
    }

    fn decode(&mut self, seq: u64, payload: &[u8]) -> Option<EventBatch> {
        match decode_batch(payload, &self.config.limits) {
            Ok(batch) => {
                if batch.unknown_events > 0 {
                    self.stats
                        .unknown_events
                        .fetch_add(u64::from(batch.unknown_events), Relaxed);
                    if !std::mem::replace(&mut self.warned.unknown, true) {
                        tracing::warn!(endpoint = %self.config.endpoint, seq,
                            count = batch.unknown_events,
                            "KV events: events with an unknown tag skipped (warned once)");
                    }
                }
                Some(batch)
            }
            Err(e) => {
                self.stats.decode_errors.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned.decode, true) {
                    tracing::warn!(endpoint = %self.config.endpoint, seq, error = %e,
                        "KV events: batch refused (warned once; counted)");
                }
                None
            }
        }
    }

    async fn deliver(&mut self, seq: u64, batch: EventBatch) -> bool {
        self.seq.delivered(seq);
        self.stats.delivered(batch.ts);
        self.send(Update::Batch { seq, batch }).await
    }

    /// The batches `expected..received` from the replay endpoint, decoded, or why not.
    async fn replay(
        &mut self,
        expected: u64,
        received: u64,
    ) -> Result<Vec<(u64, EventBatch)>, ResetReason> {
        let Some(endpoint) = self.config.replay_endpoint.clone() else {
            return Err(ResetReason::NoReplayEndpoint { expected, received });
        };
        if received - expected > MAX_REPLAY {
            return Err(ResetReason::GapTooLarge { expected, received });
        }
        let span = Span::Gap {
            from: expected,
            until: received,
        };
        let (got, failed) = self.replay_span(&endpoint, span).await;
        let incomplete = ResetReason::ReplayIncomplete {
            expected,
            received,
            replayed: got.len() as u64,
        };
        let why = match failed {
            None if got.len() as u64 == received - expected => return Ok(got.into()),
            None => "the publisher no longer holds them".to_string(),
            Some(e) => e,
        };
        if !std::mem::replace(&mut self.warned.replay, true) {
            tracing::warn!(endpoint = %endpoint, expected, received, why = %why,
                "KV events: replay failed (warned once)");
        }
        Err(incomplete)
    }

    /// One replay of `span` within [`REPLAY_TIMEOUT`], counted: the batches read and, if it
    /// failed, why.
    async fn replay_span(
        &mut self,
        endpoint: &str,
        span: Span,
    ) -> (VecDeque<(u64, EventBatch)>, Option<String>) {
        self.stats.replays.fetch_add(1, Relaxed);
        let mut got = VecDeque::new();
        let outcome =
            tokio::time::timeout(REPLAY_TIMEOUT, self.fetch(endpoint, span, &mut got)).await;
        let failed = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no complete answer within {REPLAY_TIMEOUT:?}")),
        };
        (got, failed)
    }

    /// Asks the replay endpoint for `span` and reads its batches into `got`, in order. A batch
    /// out of order (after the first) or undecodable is an error; see [`Span`] for where each
    /// kind starts and ends.
    async fn fetch(
        &mut self,
        endpoint: &str,
        span: Span,
        got: &mut VecDeque<(u64, EventBatch)>,
    ) -> Result<(), String> {
        let (from, until) = match span {
            Span::Gap { from, until } => (from, until),
            Span::Before { until } => (until.saturating_sub(MAX_REPLAY), until),
            Span::All => (0, u64::MAX),
        };
        let mut options = SocketOptions::default();
        options.connect_timeout(CONNECT_TIMEOUT);
        let mut socket = DealerSocket::with_options(options);
        socket.connect(endpoint).await.map_err(|e| e.to_string())?;
        let mut request = ZmqMessage::from(Vec::<u8>::new());
        request.push_back(from.to_be_bytes().to_vec().into());
        socket.send(request).await.map_err(|e| e.to_string())?;
        let mut next = from;
        let mut bytes = 0usize;
        while next < until {
            let reply = socket.recv().await.map_err(|e| e.to_string())?;
            let frames: Vec<&[u8]> = reply.iter().map(|f| f.as_ref()).collect();
            let (topic, seq, payload) = replayed(&frames)?;
            if let Some(topic) = topic.filter(|_| seq != END_SEQ) {
                if !self.accepts_topic(topic) {
                    return Err(format!(
                        "a replayed batch on topic {:?}, expected {:?}",
                        String::from_utf8_lossy(topic),
                        String::from_utf8_lossy(&self.topic)
                    ));
                }
            }
            if seq == END_SEQ {
                if matches!(span, Span::Before { .. }) {
                    got.clear();
                }
                return Ok(());
            }
            let Ok(seq) = <[u8; 8]>::try_from(seq).map(u64::from_be_bytes) else {
                return Err(format!("a {}-byte sequence frame", seq.len()));
            };
            if seq < next {
                continue;
            }
            if seq > next {
                if matches!(span, Span::Gap { .. }) || !got.is_empty() {
                    return Err(format!("replay skipped from {next} to {seq}"));
                }
                if seq >= until {
                    // The publisher holds nothing before `until`.
                    return Ok(());
                }
                next = seq;
            }
            bytes = bytes.saturating_add(payload.len());
            if bytes > self.config.limits.max_replay_bytes {
                return Err(format!(
                    "more than {} bytes replayed",
                    self.config.limits.max_replay_bytes
                ));
            }
            match self.decode(seq, payload) {
                Some(batch) => got.push_back((seq, batch)),
                None => return Err(format!("replayed batch {seq} did not decode")),
            }
            if got.len() as u64 > MAX_REPLAY {
                // A publisher that holds more than vLLM's default: the newest are kept.
                got.pop_front();
            }
            next += 1;
        }
        Ok(())
    }
}

/// A replay reply's topic (where it has one), sequence frame and payload. The ROUTER sends
/// `[identity, "", seq, payload]` (SGLang, vLLM before the topic was added) or `[identity, "",
/// topic, seq, payload]` (vLLM since; its end marker has an empty topic); the identity is
/// consumed on the way.
type Replayed<'f> = (Option<&'f [u8]>, &'f [u8], &'f [u8]);

fn replayed<'f>(frames: &[&'f [u8]]) -> Result<Replayed<'f>, String> {
    match *frames {
        [b"", seq, payload] => Ok((None, seq, payload)),
        [b"", _, seq, _] if seq == END_SEQ => Ok((None, seq, &[])),
        [b"", t, seq, payload] => Ok((Some(t), seq, payload)),
        _ => Err(format!(
            "a reply of {} frames, expected 3 or 4 (with the topic)",
            frames.len()
        )),
    }
}

/// Which batches a replay asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    /// Exactly `from..until` (a gap); the end marker before `until` leaves a shortfall for the
    /// caller to see.
    Gap { from: u64, until: u64 },
    /// The run from the oldest batch held up to the one before `until` (at most [`MAX_REPLAY`]);
    /// none when the run does not reach it (a first batch with nothing to continue).
    Before { until: u64 },
    /// Everything held, up to the end marker; the newest [`MAX_REPLAY`] at most (at connect).
    All,
}
