//! The engine-truth families: KV-cache events per pod, each pod's engine view, where decisions'
//! matches came from, what ended the holds that awaited an engine, and the engine tokens of
//! prompts. Labels are plain strings and the enums
//! below; nothing here knows the subscriber, the view or the scheduler.

use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{LATENCY_BUCKETS, listing, register};

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
}

impl StreamEvent {
    pub const ALL: [StreamEvent; 9] = [
        StreamEvent::Received,
        StreamEvent::Applied,
        StreamEvent::DecodeError,
        StreamEvent::WrongTopic,
        StreamEvent::UnknownEvent,
        StreamEvent::Gap,
        StreamEvent::Replay,
        StreamEvent::Reset,
        StreamEvent::Reconnect,
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
        }
    }
}

/// How a request's engine tokens were found (`outcome` of `prefix_picker_engine_tokens_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOutcome {
    /// Its head was tokenized before: matched in engine tokens.
    Hit,
    /// Not yet: matched by the estimate, the head queued for tokenizing.
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

/// The engine-truth families.
#[derive(Debug, Clone)]
pub struct EngineTruthMetrics {
    pub kv_events: IntCounterVec,
    pub stream: IntCounterVec,
    pub lag: GaugeVec,
    pub view_blocks: IntGaugeVec,
    pub view_live: IntGaugeVec,
    pub match_source: IntCounterVec,
    pub holds: IntCounterVec,
    pub engine_tokens: IntCounterVec,
    pub tokenize_calls: IntCounterVec,
    pub tokenize_duration: Histogram,
}

/// The `result` of a tokenize call: `ok` or the error kind.
pub const TOKENIZE_OK: &str = "ok";

impl EngineTruthMetrics {
    /// `sources`: the match sources; `hold_ends`: what ends a hold that awaited its engine;
    /// `errors`: the tokenize error kinds (the label values, from the types that own them).
    pub fn register(
        registry: &Registry,
        sources: &[&str],
        hold_ends: &[&str],
        errors: &[&str],
    ) -> EngineTruthMetrics {
        let pod = super::POD_LABELS;
        let m = EngineTruthMetrics {
            kv_events: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_kv_events_total",
                    listing(
                        "KV-cache block events applied to a pod's engine view, by event",
                        &[("event", &KvEventKind::ALL.map(KvEventKind::as_str))],
                    ),
                ),
                &[super::POD_LABELS[0], super::POD_LABELS[1], "event"],
            )
            .expect("valid metric"),
            stream: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_kv_event_stream_total",
                    listing(
                        "What happened on a pod's KV-event stream, by kind",
                        &[("kind", &StreamEvent::ALL.map(StreamEvent::as_str))],
                    ),
                ),
                &[super::POD_LABELS[0], super::POD_LABELS[1], "kind"],
            )
            .expect("valid metric"),
            lag: GaugeVec::new(
                Opts::new(
                    "prefix_picker_kv_event_lag_seconds",
                    "Receipt time minus the engine's timestamp of a pod's last event batch",
                ),
                &pod,
            )
            .expect("valid metric"),
            view_blocks: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_engine_view_blocks",
                    "KV-cache blocks a pod's engine holds, by its events",
                ),
                &pod,
            )
            .expect("valid metric"),
            view_live: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_engine_view_live",
                    "1 while a pod is matched by its engine's events, 0 while by the estimate",
                ),
                &pod,
            )
            .expect("valid metric"),
            match_source: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_match_source_total",
                    listing(
                        "Affinity-mode decisions, by where the picked pod's match came from",
                        &[("source", sources)],
                    ),
                ),
                &["source"],
            )
            .expect("valid metric"),
            holds: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_engine_holds_total",
                    listing(
                        "Affinity-mode holds on pods matched by their engine, by what ended them: the engine's store of the held head, or the request's end before it",
                        &[("ended", hold_ends)],
                    ),
                ),
                &["ended"],
            )
            .expect("valid metric"),
            engine_tokens: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_engine_tokens_total",
                    listing(
                        "Requests to pods with engine views, by how their engine tokens were found",
                        &[("outcome", &HeadOutcome::ALL.map(HeadOutcome::as_str))],
                    ),
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            tokenize_calls: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_tokenize_calls_total",
                    listing(
                        "Prompt heads tokenized (a call to an engine's /tokenize, or the file source in process), by result",
                        &[("result", &[&[TOKENIZE_OK], errors].concat())],
                    ),
                ),
                &["result"],
            )
            .expect("valid metric"),
            tokenize_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "prefix_picker_tokenize_duration_seconds",
                    "Time of one head's tokenization (off the request path)",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
        };
        for s in sources {
            m.match_source.with_label_values(&[s]);
        }
        for e in hold_ends {
            m.holds.with_label_values(&[e]);
        }
        for o in HeadOutcome::ALL {
            m.engine_tokens.with_label_values(&[o.as_str()]);
        }
        for result in std::iter::once(&TOKENIZE_OK).chain(errors) {
            m.tokenize_calls.with_label_values(&[result]);
        }
        register(registry, m.kv_events.clone());
        register(registry, m.stream.clone());
        register(registry, m.lag.clone());
        register(registry, m.view_blocks.clone());
        register(registry, m.view_live.clone());
        register(registry, m.match_source.clone());
        register(registry, m.holds.clone());
        register(registry, m.engine_tokens.clone());
        register(registry, m.tokenize_calls.clone());
        register(registry, m.tokenize_duration.clone());
        m
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
    }
}
