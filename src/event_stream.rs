//! How an Anthropic Messages event stream ended, read from the response body as it streams past.
//!
//! A streamed Messages answer is complete when its `message_stop` event arrives; an `error`
//! event (an overloaded or failing engine, after the 200 status went out) means it failed. So a
//! streamed Messages request is recorded only when its body had `message_stop` and no `error`
//! ([`EventsEnd::Stopped`]); a body that ends without `message_stop` ([`EventsEnd::Cut`]) or had
//! an `error` ([`EventsEnd::Error`]) records nothing, whatever the status.
//!
//! An event is named by its `event:` line, or by a `data:` line whose JSON starts with its
//! `"type"` (servers that send no `event:` lines). Lines are read as they come, split anywhere
//! between chunks; only the first [`LINE`] bytes of each are kept.

/// Bytes of a line kept (the event's name is at its start).
const LINE: usize = 64;

/// How an event stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsEnd {
    /// `message_stop` arrived, and no `error`.
    Stopped,
    /// An `error` event arrived.
    Error,
    /// The body ended before `message_stop`.
    Cut,
}

/// The scan of one response body.
#[derive(Debug, Default)]
pub struct EventScan {
    /// The current line's start.
    line: Vec<u8>,
    stopped: bool,
    error: bool,
}

/// What a line names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    Stop,
    Error,
    Other,
}

impl EventScan {
    /// Scans the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(at) = memchr::memchr(b'\n', rest) {
            self.keep(&rest[..at]);
            let line = std::mem::take(&mut self.line);
            match named(&line) {
                Named::Stop => self.stopped = true,
                Named::Error => self.error = true,
                Named::Other => {}
            }
            self.line = line;
            self.line.clear();
            rest = &rest[at + 1..];
        }
        self.keep(rest);
    }

    /// How the body read so far ends.
    pub fn end(&self) -> EventsEnd {
        // A last line without its newline counts too.
        let last = named(&self.line);
        if self.error || last == Named::Error {
            EventsEnd::Error
        } else if self.stopped || last == Named::Stop {
            EventsEnd::Stopped
        } else {
            EventsEnd::Cut
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = LINE.saturating_sub(self.line.len());
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// The event a line names: `event: {name}`, or `data: {"type": "{name}"...`.
fn named(line: &[u8]) -> Named {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let name = if let Some(name) = line.strip_prefix(b"event:") {
        name.trim_ascii()
    } else if let Some(data) = line.strip_prefix(b"data:") {
        let data = data.trim_ascii_start();
        let Some(rest) = data.strip_prefix(b"{\"type\"") else {
            return Named::Other;
        };
        let Some(rest) = rest.trim_ascii_start().strip_prefix(b":") else {
            return Named::Other;
        };
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b"\"") else {
            return Named::Other;
        };
        let end = memchr::memchr(b'"', rest).unwrap_or(rest.len());
        &rest[..end]
    } else {
        return Named::Other;
    };
    match name {
        b"message_stop" => Named::Stop,
        b"error" => Named::Error,
        _ => Named::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&str]) -> EventsEnd {
        let mut s = EventScan::default();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.end()
    }

    const STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"event: error\"}}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\"}\n\n\
        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn a_stream_ends_at_message_stop_whatever_the_cuts() {
        for cut in 0..STREAM.len() {
            let (a, b) = STREAM.split_at(cut);
            assert_eq!(scan(&[a, b]), EventsEnd::Stopped, "cut at {cut}");
        }
        // Without `event:` lines, and with CRLF.
        assert_eq!(
            scan(&["data: {\"type\": \"message_stop\"}\r\n\r\n"]),
            EventsEnd::Stopped
        );
    }

    #[test]
    fn an_error_or_a_missing_stop_is_not_a_completion() {
        let cut = &STREAM[..STREAM.find("event: message_stop").unwrap()];
        assert_eq!(scan(&[cut]), EventsEnd::Cut);
        assert_eq!(scan(&[""]), EventsEnd::Cut);
        let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
        assert_eq!(scan(&[cut, error]), EventsEnd::Error);
        assert_eq!(scan(&[STREAM, error]), EventsEnd::Error);
        assert_eq!(
            scan(&["data: {\"type\":\"error\",\"error\":{}}\n\n"]),
            EventsEnd::Error
        );
        // Text that mentions an event is not one.
        assert_eq!(
            scan(&["data: {\"text\":\"event: message_stop\"}\n"]),
            EventsEnd::Cut
        );
        // A long line is cut to its start, never read past.
        let long = format!(
            "data: {{\"type\":\"x{}\"}}\nevent: message_stop",
            "y".repeat(500)
        );
        assert_eq!(scan(&[&long]), EventsEnd::Stopped);
    }
}
