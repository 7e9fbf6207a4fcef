//! Reads the engine's `cached_tokens` report from a response body as it streams past: the
//! `usage.prompt_tokens_details.cached_tokens` of vLLM (and of SGLang with its cache report),
//! in a JSON body or in the last SSE event of a stream (vLLM puts usage in a stream only when
//! the request asks `stream_options.include_usage`).
//!
//! Chunks are scanned as they come; the last 64 bytes of each are kept so a key or number cut
//! between two chunks is still read. The last value in the body wins. No allocation per chunk
//! beyond that carry.

use memchr::memmem;

const KEY: &[u8] = b"\"cached_tokens\"";
const CARRY: usize = 64;

/// The scan of one response body.
#[derive(Debug, Default)]
pub struct CachedTokensScan {
    carry: Vec<u8>,
    last: Option<u64>,
}

impl CachedTokensScan {
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

    /// The last `cached_tokens` value seen.
    pub fn value(&self) -> Option<u64> {
        self.last
    }

    fn scan(&mut self, bytes: &[u8]) {
        for at in memmem::find_iter(bytes, KEY) {
            let rest = &bytes[at + KEY.len()..];
            let rest = trim(rest);
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
            if let Some(n) = std::str::from_utf8(&rest[..digits])
                .ok()
                .and_then(|d| d.parse().ok())
            {
                self.last = Some(n);
            }
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

    fn scan(chunks: &[&str]) -> Option<u64> {
        let mut s = CachedTokensScan::default();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.value()
    }

    #[test]
    fn reads_json_and_sse_usage() {
        let json = r#"{"id":"x","usage":{"prompt_tokens":900,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":768}}}"#;
        assert_eq!(scan(&[json]), Some(768));
        let sse = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens_details\": {\"cached_tokens\" : 32}}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(&[sse]), Some(32));
        assert_eq!(scan(&["data: {\"choices\":[]}\n\n"]), None);
        assert_eq!(scan(&[r#"{"cached_tokens":null}"#]), None);
    }

    #[test]
    fn a_key_or_number_cut_between_chunks_is_read_whole() {
        let body = r#"{"usage":{"prompt_tokens_details":{"cached_tokens":12345}}}"#;
        for cut in 1..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(scan(&[a, b]), Some(12345), "cut at {cut}");
        }
    }
}
