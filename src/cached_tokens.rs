//! Reads the engine's usage report from a response body as it streams past: the `usage` of an
//! OpenAI-style response, in a JSON body or in the last SSE event of a stream (vLLM puts usage in
//! a stream only when the request asks `stream_options.include_usage`):
//! - prompt tokens: `prompt_tokens` (chat, completions) or `input_tokens` (Responses);
//! - completion tokens: `completion_tokens` or `output_tokens`;
//! - cached tokens: `prompt_tokens_details.cached_tokens` (vLLM, SGLang with its cache report)
//!   or `input_tokens_details.cached_tokens`.
//!
//! Anthropic's Messages usage (in the JSON body, and in a stream's `message_start` and
//! `message_delta` events) counts its input as Anthropic does when it has cache fields:
//! `input_tokens` are the tokens not read from or written to the cache, so the prompt is
//! `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`, and the cached tokens
//! are `cache_read_input_tokens` (the same engine feedback as OpenAI's `cached_tokens`). Without
//! them (vLLM's `/v1/messages`, which reports `input_tokens` = the prompt), it reads as above.
//!
//! Chunks are scanned as they come for `_tokens"` (one pass), the word before it deciding the
//! field; the last 64 bytes of each chunk are kept so a key or number cut between two chunks is
//! still read. The last value of each field in the body wins. No allocation per chunk beyond
//! that carry.

use memchr::memmem;

const SUFFIX: &[u8] = b"_tokens\"";
const CARRY: usize = 64;

/// The fields of a usage report, by the word before `_tokens`.
const FIELDS: [(&[u8], Field); 7] = [
    (b"\"prompt", Field::Prompt),
    (b"\"input", Field::Prompt),
    (b"\"completion", Field::Completion),
    (b"\"output", Field::Completion),
    (b"\"cached", Field::Cached),
    (b"\"cache_read_input", Field::CacheRead),
    (b"\"cache_creation_input", Field::CacheCreation),
];

#[derive(Debug, Clone, Copy)]
enum Field {
    Prompt,
    Completion,
    Cached,
    /// Anthropic's `cache_read_input_tokens`.
    CacheRead,
    /// Anthropic's `cache_creation_input_tokens`.
    CacheCreation,
}

/// The usage a response body reported (each `None` until seen).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// Whether the body reported any of the three.
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}

/// The scan of one response body.
#[derive(Debug, Default)]
pub struct UsageScan {
    carry: Vec<u8>,
    last: Usage,
    /// Anthropic's cache fields, when seen.
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
}

impl UsageScan {
    /// Scans the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        if !self.carry.is_empty() {
            // Across the boundary: the carry plus the chunk's start.
            let mut joint = std::mem::take(&mut self.carry);
            joint.extend_from_slice(&chunk[..chunk.len().min(CARRY)]);
            self.scan(&joint);
            joint.clear();
            self.carry = joint;
        }
        self.scan(chunk);
        let tail = &chunk[chunk.len().saturating_sub(CARRY)..];
        self.carry.extend_from_slice(tail);
    }

    /// What the body reported so far (the last value of each field; with Anthropic's cache
    /// fields, its accounting: see the module header).
    pub fn usage(&self) -> Usage {
        if self.cache_read.is_none() && self.cache_creation.is_none() {
            return self.last;
        }
        let (read, creation) = (
            self.cache_read.unwrap_or(0),
            self.cache_creation.unwrap_or(0),
        );
        Usage {
            prompt_tokens: self
                .last
                .prompt_tokens
                .map(|input| input.saturating_add(read).saturating_add(creation)),
            completion_tokens: self.last.completion_tokens,
            cached_tokens: self.last.cached_tokens.or(self.cache_read),
        }
    }

    /// The cached tokens reported (`cached_tokens`, else Anthropic's cache reads).
    pub fn cached_tokens(&self) -> Option<u64> {
        self.usage().cached_tokens
    }

    fn scan(&mut self, bytes: &[u8]) {
        for at in memmem::find_iter(bytes, SUFFIX) {
            let before = &bytes[..at];
            let Some(&(_, field)) = FIELDS.iter().find(|(word, _)| before.ends_with(word)) else {
                continue;
            };
            let rest = trim(&bytes[at + SUFFIX.len()..]);
            let Some(rest) = rest.strip_prefix(b":") else {
                continue;
            };
            let rest = trim(rest);
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            // A number that runs to the end of the bytes may go on in the next chunk: the scan
            // across the boundary reads it whole.
            if digits == 0 || digits == rest.len() {
                continue;
            }
            let Some(n) = std::str::from_utf8(&rest[..digits])
                .ok()
                .and_then(|d| d.parse().ok())
            else {
                continue;
            };
            let slot = match field {
                Field::Prompt => &mut self.last.prompt_tokens,
                Field::Completion => &mut self.last.completion_tokens,
                Field::Cached => &mut self.last.cached_tokens,
                Field::CacheRead => &mut self.cache_read,
                Field::CacheCreation => &mut self.cache_creation,
            };
            *slot = Some(n);
        }
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&str]) -> Usage {
        let mut s = UsageScan::default();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.usage()
    }

    fn usage(prompt: u64, completion: u64, cached: Option<u64>) -> Usage {
        Usage {
            prompt_tokens: Some(prompt),
            completion_tokens: Some(completion),
            cached_tokens: cached,
        }
    }

    #[test]
    fn reads_json_and_sse_usage() {
        let json = r#"{"id":"x","usage":{"prompt_tokens":900,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":768}}}"#;
        assert_eq!(scan(&[json]), usage(900, 5, Some(768)));
        let sse = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\": {\"cached_tokens\" : 32}}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(&[sse]), usage(40, 2, Some(32)));
        assert!(scan(&["data: {\"choices\":[]}\n\n"]).is_empty());
        assert!(scan(&[r#"{"cached_tokens":null}"#]).is_empty());
    }

    #[test]
    fn reads_the_responses_apis_names() {
        let body = r#"{"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":127}}"#;
        assert_eq!(scan(&[body]), usage(120, 7, Some(64)));
    }

    #[test]
    fn reads_anthropics_usage_with_its_cache_accounting() {
        let body = r#"{"type":"message","usage":{"input_tokens":30,"cache_creation_input_tokens":4,"cache_read_input_tokens":96,"output_tokens":8}}"#;
        assert_eq!(scan(&[body]), usage(130, 8, Some(96)));
        // A stream: `message_start` has the input, `message_delta` the output (cut anywhere).
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":64,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":12}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for cut in 1..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(scan(&[a, b]), usage(84, 12, Some(64)), "cut at {cut}");
        }
        // vLLM's `/v1/messages`: no cache fields, `input_tokens` is the prompt.
        let vllm = r#"{"usage":{"input_tokens":50,"output_tokens":3}}"#;
        assert_eq!(scan(&[vllm]), usage(50, 3, None));
    }

    #[test]
    fn other_words_and_escaped_keys_are_not_fields() {
        // `reasoning_tokens`, `total_tokens`, `uncached_tokens`; and a key inside generated text
        // (escaped quotes) is text, not usage.
        let body = r#"{"text":"say \"prompt_tokens\": 5","usage":{"total_tokens":9,"reasoning_tokens":2,"uncached_tokens":4}}"#;
        assert!(scan(&[body]).is_empty(), "{:?}", scan(&[body]));
    }

    #[test]
    fn the_last_report_wins() {
        let a = r#"data: {"usage":{"prompt_tokens":10,"completion_tokens":1}}"#;
        let b = "\n\ndata: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4}}\n\n";
        assert_eq!(scan(&[a, b]), usage(10, 4, None));
    }

    #[test]
    fn a_key_or_number_cut_between_chunks_is_read_whole() {
        let body = r#"{"usage":{"prompt_tokens":4321,"completion_tokens":98,"prompt_tokens_details":{"cached_tokens":12345}}}"#;
        for cut in 1..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(scan(&[a, b]), usage(4321, 98, Some(12345)), "cut at {cut}");
        }
    }
}
