//! The engine-truth families: KV-cache events per pod, each pod's engine view, where decisions'
//! matches came from, what ended the holds that awaited an engine, and the engine tokens of
//! prompts. Labels are plain strings and the enums
//! below; nothing here knows the subscriber, the view or the scheduler.

use prometheus::{GaugeVec, Histogram, IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::family::Label::{Enum, Free, Given};
use super::family::{Family, Label};
use super::{LATENCY_BUCKETS, POD_LABELS};

/// The kinds of [`TokenizeError`](crate::tokenizer::TokenizeError), for counting; `as_str()` is the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizeErrorKind {
    Timeout,
    ConnectionRefused,
    Transport,
    Status,
    BodyTooLarge,
    TooManyTokens,
    Malformed,
    InvalidInput,
    /// The `file` source: the chat template is missing or failed.
    Template,
    /// The `file` source: the `tokenizer.json` could not encode the text.
    Encode,
}

impl TokenizeErrorKind {
    pub const ALL: [TokenizeErrorKind; 10] = [
        TokenizeErrorKind::Timeout,
        TokenizeErrorKind::ConnectionRefused,
        TokenizeErrorKind::Transport,
        TokenizeErrorKind::Status,
        TokenizeErrorKind::BodyTooLarge,
        TokenizeErrorKind::TooManyTokens,
        TokenizeErrorKind::Malformed,
        TokenizeErrorKind::InvalidInput,
        TokenizeErrorKind::Template,
        TokenizeErrorKind::Encode,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            TokenizeErrorKind::Timeout => "timeout",
            TokenizeErrorKind::ConnectionRefused => "connection_refused",
            TokenizeErrorKind::Transport => "transport",
            TokenizeErrorKind::Status => "status",
            TokenizeErrorKind::BodyTooLarge => "body_too_large",
            TokenizeErrorKind::TooManyTokens => "too_many_tokens",
            TokenizeErrorKind::Malformed => "malformed",
            TokenizeErrorKind::InvalidInput => "invalid_input",
            TokenizeErrorKind::Template => "template",
            TokenizeErrorKind::Encode => "encode",
        }
    }
}

/// What a KV event did to a view (`event` of `prefix_picker_kv_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEventKind {
    /// Blocks stored.
    Stored,
    /// Stored blocks skipped (unknown parent, too few token ids, the view full).
    Skipped,
    /// Blocks removed.
    Removed,
    /// `AllBlocksCleared`.
    Cleared,
}

impl KvEventKind {
    pub const ALL: [KvEventKind; 4] = [
        KvEventKind::Stored,
        KvEventKind::Skipped,
        KvEventKind::Removed,
        KvEventKind::Cleared,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KvEventKind::Stored => "stored",
            KvEventKind::Skipped => "skipped",
            KvEventKind::Removed => "removed",
            KvEventKind::Cleared => "cleared",
        }
    }
}

/// What happened on a pod's event stream (`kind` of `prefix_picker_kv_event_stream_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEvent {
    /// A message received (any topic, any shape).
    Received,
    /// A batch decoded and applied.
    Applied,
    /// A message refused: wrong frames, undecodable, over the limits.
    DecodeError,
    /// A message on another topic.
    WrongTopic,
    /// An event with an unknown tag, skipped.
    UnknownEvent,
    /// A gap in the sequence.
    Gap,
    /// A replay asked for.
    Replay,
    /// The view dropped (a gap replay could not fill, the publisher restarted).
    Reset,
    /// A connection re-established.
    Reconnect,
    /// The pod's subscriber stopped on its own (a bug) and was started again.
    Restart,
    /// Connected, the pod picked since, and no batch applied within
    /// [`NO_BATCH_AFTER`](crate::engine_events::NO_BATCH_AFTER): a publisher on another topic,
    /// one that never sends, or frames that do not decode. Once per connection.
    NoBatch,
}

impl StreamEvent {
    pub const ALL: [StreamEvent; 11] = [
        StreamEvent::Received,
        StreamEvent::Applied,
        StreamEvent::DecodeError,
        StreamEvent::WrongTopic,
        StreamEvent::UnknownEvent,
        StreamEvent::Gap,
        StreamEvent::Replay,
        StreamEvent::Reset,
        StreamEvent::Reconnect,
        StreamEvent::Restart,
        StreamEvent::NoBatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StreamEvent::Received => "received",
            StreamEvent::Applied => "applied",
            StreamEvent::DecodeError => "decode_error",
            StreamEvent::WrongTopic => "wrong_topic",
            StreamEvent::UnknownEvent => "unknown_event",
            StreamEvent::Gap => "gap",
            StreamEvent::Replay => "replay",
            StreamEvent::Reset => "reset",
            StreamEvent::Reconnect => "reconnect",
            StreamEvent::Restart => "restart",
            StreamEvent::NoBatch => "no_batch",
        }
    }
}

/// What became of a message on the shared KV-event socket (`outcome` of
/// `prefix_picker_kv_events_shared_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedOutcome {
    /// Handed to the stream of the pod its topic names (counted there from then on).
    Routed,
    /// Its topic names no pod in the set.
    UnknownPod,
    /// Its topic names an IP (or a pod name) that several pods share.
    AmbiguousPod,
    /// Its pod has a publisher of its own (`kvEventsEndpoint`), read there.
    OwnPublisher,
    /// A topic outside the filter.
    WrongTopic,
    /// Not `[topic, seq, payload]` with an 8-byte sequence.
    Malformed,
}

impl SharedOutcome {
    pub const ALL: [SharedOutcome; 6] = [
        SharedOutcome::Routed,
        SharedOutcome::UnknownPod,
        SharedOutcome::AmbiguousPod,
        SharedOutcome::OwnPublisher,
        SharedOutcome::WrongTopic,
        SharedOutcome::Malformed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SharedOutcome::Routed => "routed",
            SharedOutcome::UnknownPod => "unknown_pod",
            SharedOutcome::AmbiguousPod => "ambiguous_pod",
            SharedOutcome::OwnPublisher => "own_publisher",
            SharedOutcome::WrongTopic => "wrong_topic",
            SharedOutcome::Malformed => "malformed",
        }
    }
}

/// How a request's engine tokens were found (`outcome` of `prefix_picker_engine_tokens_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOutcome {
    /// Its head was tokenized before: matched in engine tokens.
    Hit,
    /// Not yet: matched by the estimate (the head the next request shares queued, if any).
    Miss,
    /// Not yet, and the queue was full: matched by the estimate.
    Dropped,
    /// A prompt the engine tokenizer cannot be asked for (no messages or prompt text).
    Unsupported,
}

impl HeadOutcome {
    pub const ALL: [HeadOutcome; 4] = [
        HeadOutcome::Hit,
        HeadOutcome::Miss,
        HeadOutcome::Dropped,
        HeadOutcome::Unsupported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeadOutcome::Hit => "hit",
            HeadOutcome::Miss => "miss",
            HeadOutcome::Dropped => "dropped",
            HeadOutcome::Unsupported => "unsupported",
        }
    }
}

const KV_EVENTS: Family = Family::counter(
    "prefix_picker_kv_events_total",
    "KV-cache block events applied to a pod's engine view, by event",
    &[
        Free(POD_LABELS[0]),
        Free(POD_LABELS[1]),
        Enum("event", || {
            KvEventKind::ALL.map(KvEventKind::as_str).to_vec()
        }),
    ],
);
const STREAM: Family = Family::counter(
    "prefix_picker_kv_event_stream_total",
    "What happened on a pod's KV-event stream, by kind",
    &[
        Free(POD_LABELS[0]),
        Free(POD_LABELS[1]),
        Enum("kind", || {
            StreamEvent::ALL.map(StreamEvent::as_str).to_vec()
        }),
    ],
);
const POD: [Label; 2] = [Free(POD_LABELS[0]), Free(POD_LABELS[1])];
const LAG: Family = Family::float_gauge(
    "prefix_picker_kv_event_lag_seconds",
    "Receipt time minus the engine's timestamp of a pod's last event batch",
    &POD,
);
const VIEW_BLOCKS: Family = Family::gauge(
    "prefix_picker_engine_view_blocks",
    "KV-cache blocks a pod's engine holds, by its events",
    &POD,
);
const VIEW_LIVE: Family = Family::gauge(
    "prefix_picker_engine_view_live",
    "1 while a pod is matched by its engine's events, 0 while by the estimate",
    &POD,
);
const CONNECTED: Family = Family::gauge(
    "prefix_picker_kv_events_connected",
    "1 while the picker holds a connection to a pod's KV-event publisher (live or not: a view is live from its first batch)",
    &POD,
);
const SHARED: Family = Family::counter(
    "prefix_picker_kv_events_shared_total",
    "Messages on the shared KV-event socket the engines connect to (picker.kvEvents.bind), by outcome: routed to the pod its topic names, or dropped",
    &[Enum("outcome", || {
        SharedOutcome::ALL.map(SharedOutcome::as_str).to_vec()
    })],
);
/// Its sources are given at registration.
const MATCH_SOURCE: Family = Family::counter(
    "prefix_picker_match_source_total",
    "Affinity-mode decisions, by where the picked pod's match came from",
    &[Given("source")],
);
/// What ends a hold (the engine, the request) is given at registration.
const HOLDS: Family = Family::counter(
    "prefix_picker_engine_holds_total",
    "Affinity-mode holds on pods matched by their engine, by what ended them: the engine's store of the held head, or the request's end before it",
    &[Given("ended")],
);
const ENGINE_TOKENS: Family = Family::counter(
    "prefix_picker_engine_tokens_total",
    "Requests to pods with engine views, by how their engine tokens were found",
    &[Enum("outcome", || {
        HeadOutcome::ALL.map(HeadOutcome::as_str).to_vec()
    })],
);
/// Its results ([`TOKENIZE_OK`] and the error kinds) are given at registration.
const TOKENIZE_CALLS: Family = Family::counter(
    "prefix_picker_tokenize_calls_total",
    "Prompt heads tokenized (a call to an engine's /tokenize, or the file source in process), by result",
    &[Given("result")],
);
const TOKENIZED_TOKENS: Family = Family::counter(
    "prefix_picker_tokenized_tokens_total",
    "Tokens a tokenizer computed for prompt heads: an engine's /tokenize answers whole; the file source only past the longest prefix it tokenized before",
    &[],
);
const TOKENIZE_DURATION: Family = Family::histogram(
    "prefix_picker_tokenize_duration_seconds",
    "Time of one head's tokenization (off the request path)",
    &[],
    &LATENCY_BUCKETS,
);

/// The engine-truth families.
#[derive(Debug, Clone)]
pub struct EngineTruthMetrics {
    pub kv_events: IntCounterVec,
    pub stream: IntCounterVec,
    pub lag: GaugeVec,
    pub view_blocks: IntGaugeVec,
    pub view_live: IntGaugeVec,
    pub connected: IntGaugeVec,
    pub shared: IntCounterVec,
    pub match_source: IntCounterVec,
    pub holds: IntCounterVec,
    pub engine_tokens: IntCounterVec,
    pub tokenize_calls: IntCounterVec,
    pub tokenized_tokens: IntCounter,
    pub tokenize_duration: Histogram,
}

/// The `result` of a tokenize call: `ok` or the error kind.
pub const TOKENIZE_OK: &str = "ok";

impl EngineTruthMetrics {
    /// The families, with the match `sources`, what ends a hold (`hold_ends`) and the tokenize
    /// `errors` their labels take (the label values, from the types that own them).
    pub fn register(
        registry: &Registry,
        sources: &[&str],
        hold_ends: &[&str],
        errors: &[&str],
    ) -> EngineTruthMetrics {
        let results = [&[TOKENIZE_OK], errors].concat();
        EngineTruthMetrics {
            kv_events: KV_EVENTS.register(registry),
            stream: STREAM.register(registry),
            lag: LAG.register(registry),
            view_blocks: VIEW_BLOCKS.register(registry),
            view_live: VIEW_LIVE.register(registry),
            connected: CONNECTED.register(registry),
            shared: SHARED.register(registry),
            match_source: MATCH_SOURCE.register_with(registry, &[sources]),
            holds: HOLDS.register_with(registry, &[hold_ends]),
            engine_tokens: ENGINE_TOKENS.register(registry),
            tokenize_calls: TOKENIZE_CALLS.register_with(registry, &[&results]),
            tokenized_tokens: TOKENIZED_TOKENS.register(registry),
            tokenize_duration: TOKENIZE_DURATION.register(registry),
        }
    }

    /// Removes a departed pod's series.
    pub fn forget_pod(&self, labels: [&str; 2]) {
        for e in KvEventKind::ALL {
            let _ = self
                .kv_events
                .remove_label_values(&[labels[0], labels[1], e.as_str()]);
        }
        for e in StreamEvent::ALL {
            let _ = self
                .stream
                .remove_label_values(&[labels[0], labels[1], e.as_str()]);
        }
        let _ = self.lag.remove_label_values(&labels);
        let _ = self.view_blocks.remove_label_values(&labels);
        let _ = self.view_live.remove_label_values(&labels);
        let _ = self.connected.remove_label_values(&labels);
    }
}
