//! Reads a streamed answer as it arrives: when its first token came, how many tokens it had,
//! whether the engine ended it, and the usage it reported.
//!
//! - OpenAI's SSE (chat, completions, Responses): one `data:` event per token, the usage chunk of
//!   `stream_options.include_usage` (`"choices":[]`), a chunk with a `finish_reason` (or the
//!   Responses API's `response.completed`) ending the answer, then `data: [DONE]`. The first
//!   token is the first chunk; usage is `prompt_tokens` and `cached_tokens`.
//! - Anthropic's (`/v1/messages`): `message_start` (the usage so far), `content_block_start`,
//!   one `content_block_delta` per token, `content_block_stop`, `message_delta` (stop reason and
//!   usage) ending the answer, then `message_stop`; an `error` event fails it. The first token is
//!   the first `content_block_delta`; the prompt is `input_tokens + cache_read_input_tokens +
//!   cache_creation_input_tokens` and the cached part `cache_read_input_tokens` (Anthropic's
//!   accounting), read from `message_delta`, else from `message_start`.
//!
//! Only the stream's first and last bytes are kept; patterns are found across chunk boundaries.

use prefix_picker::request::Api;

/// The event shapes a stream can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    /// The shape of the answers of a request sent to `path`.
    pub fn of(path: &str) -> Shape {
        match Api::from_path(path) {
            Some(Api::Messages) => Shape::Anthropic,
            _ => Shape::OpenAi,
        }
    }
}

/// Bytes of a stream's start and end kept for its usage.
const KEPT_BYTES: usize = 2048;

/// What a complete answer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Answer {
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// A stream being read.
#[derive(Debug)]
pub struct AnswerReader {
    shape: Shape,
    head: Vec<u8>,
    tail: Vec<u8>,
    /// `data:` events (OpenAI) or `content_block_delta` events (Anthropic).
    events: u64,
    /// OpenAI usage chunks (not tokens).
    usage_chunks: u64,
    first_token: bool,
    ended: bool,
    failed: bool,
}

/// The Anthropic events the reader counts or waits for.
const DELTA: &[u8] = b"event: content_block_delta";
const MESSAGE_DELTA: &[u8] = b"event: message_delta";
const MESSAGE_STOP: &[u8] = b"event: message_stop";
const ERROR: &[u8] = b"event: error";

impl AnswerReader {
    pub fn new(shape: Shape) -> AnswerReader {
        AnswerReader {
            shape,
            head: Vec::new(),
            tail: Vec::new(),
            events: 0,
            usage_chunks: 0,
            first_token: false,
            ended: false,
            failed: false,
        }
    }

    /// Reads the next bytes of the stream; true when they hold the answer's first token.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.head.len() < KEPT_BYTES {
            let room = KEPT_BYTES - self.head.len();
            self.head.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        // Patterns that end in the new bytes, including those that started in the previous ones.
        let before = self.tail.len();
        self.tail.extend_from_slice(chunk);
        let new = |pattern: &[u8]| ends_after(&self.tail, before, pattern);
        let was_started = self.first_token;
        match self.shape {
            Shape::OpenAi => {
                self.events += new(b"data: ");
                self.usage_chunks += new(b"\"choices\":[]");
                self.first_token = self.first_token || !chunk.is_empty();
                self.ended = self.ended
                    || new(b"\"finish_reason\":\"") > 0
                    || new(b"\"type\":\"response.completed\"") > 0;
            }
            Shape::Anthropic => {
                let deltas = new(DELTA);
                self.events += deltas;
                self.first_token = self.first_token || deltas > 0;
                self.ended = self.ended || new(MESSAGE_DELTA) > 0;
                self.failed = self.failed || new(ERROR) > 0;
            }
        }
        if self.tail.len() > KEPT_BYTES {
            self.tail.drain(..self.tail.len() - KEPT_BYTES);
        }
        self.first_token && !was_started
    }

    /// The answer, or `None` when a stream (`streamed`) was cut short or failed: it must end
    /// with `data: [DONE]` (OpenAI) or `message_stop` (Anthropic) after the event that ends the
    /// answer. A router can close a stream cleanly after its engine died mid-answer (smg ends
    /// it with `data: [DONE]`), so the end alone is not enough.
    pub fn finish(self, streamed: bool) -> Option<Answer> {
        let whole = match self.shape {
            Shape::OpenAi => self.ended && finished(&self.tail),
            Shape::Anthropic => self.ended && !self.failed && stopped(&self.tail),
        };
        if streamed && !whole {
            return None;
        }
        Some(match self.shape {
            Shape::OpenAi => Answer {
                output_tokens: self.events.saturating_sub(1 + self.usage_chunks),
                prompt_tokens: usage_count(&self.tail, b"\"prompt_tokens\":"),
                cached_tokens: usage_count(&self.tail, b"\"cached_tokens\":"),
            },
            Shape::Anthropic => {
                let field = |key: &[u8]| {
                    last_count(&self.tail, key)
                        .or_else(|| last_count(&self.head, key))
                        .unwrap_or(0)
                };
                let cached = field(b"\"cache_read_input_tokens\":");
                Answer {
                    output_tokens: self.events,
                    prompt_tokens: field(b"\"input_tokens\":")
                        + cached
                        + field(b"\"cache_creation_input_tokens\":"),
                    cached_tokens: cached,
                }
            }
        })
    }
}

/// Occurrences of `pattern` in `bytes` that end after its first `before` bytes.
fn ends_after(bytes: &[u8], before: usize, pattern: &[u8]) -> u64 {
    let from = before.saturating_sub(pattern.len() - 1);
    bytes[from..]
        .windows(pattern.len())
        .filter(|w| *w == pattern)
        .count() as u64
}

/// Whether an SSE stream's last bytes are its `data: [DONE]` event: a stream that ends without
/// it was cut short, whether the router reset the connection (Envoy) or ended the body cleanly.
fn finished(tail: &[u8]) -> bool {
    tail.trim_ascii_end().ends_with(b"data: [DONE]")
}

/// Whether an Anthropic stream's last event is `message_stop`.
fn stopped(tail: &[u8]) -> bool {
    let end = tail.trim_ascii_end();
    let last_event = end
        .windows(7)
        .rposition(|w| w == b"event: ")
        .map_or(&end[..0], |at| &end[at..]);
    last_event.starts_with(MESSAGE_STOP)
}

/// The number after the last `key` in `bytes` (0 when there is none).
fn usage_count(bytes: &[u8], key: &[u8]) -> u64 {
    last_count(bytes, key).unwrap_or(0)
}

/// The number after the last `key` in `bytes`, if there is one.
fn last_count(bytes: &[u8], key: &[u8]) -> Option<u64> {
    let at = bytes.windows(key.len()).rposition(|w| w == key)?;
    let digits: Vec<u8> = bytes[at + key.len()..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    (!digits.is_empty()).then(|| {
        digits.iter().fold(0u64, |n, &b| {
            n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
        })
    })
}

#[cfg(test)]
mod tests;
