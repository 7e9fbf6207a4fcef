//! The engine's answer: `{"count", "max_model_len", "tokens", "token_strs"?}` (vLLM's
//! `TokenizeResponse`; SGLang's has the same fields but `token_strs`). Only `tokens` is read;
//! `count`, when present, must equal their number.

use std::sync::Arc;

use serde::Deserialize;

use super::Tokens;

/// Why a body is not a usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BadAnswer {
    Malformed(String),
    TooManyTokens(usize),
}

#[derive(Deserialize)]
struct Answer {
    tokens: Vec<u32>,
    #[serde(default)]
    count: Option<u64>,
}

/// Parses a 2xx body. Memory is bounded by the body (read under a size limit before this): a
/// token id takes at least two bytes of JSON (`1,`) and four in the vector.
pub(super) fn parse(body: &[u8], max_tokens: usize) -> Result<Tokens, BadAnswer> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| BadAnswer::Malformed(e.to_string()))?;
    if answer.tokens.len() > max_tokens {
        return Err(BadAnswer::TooManyTokens(answer.tokens.len()));
    }
    match answer.count {
        Some(count) if count != answer.tokens.len() as u64 => {
            return Err(BadAnswer::Malformed(format!(
                "count {count} but {} tokens",
                answer.tokens.len()
            )));
        }
        _ => {}
    }
    Ok(Tokens(Arc::from(answer.tokens)))
}

/// At most `max` bytes of `body` as text, cut at a character boundary (for error messages).
pub(super) fn snippet(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(max)]);
    let mut text = text.into_owned();
    if body.len() > max {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vllm_answer() {
        let t = parse(
            br#"{"count":3,"max_model_len":4096,"tokens":[1,15043,4294967295],"token_strs":null}"#,
            10,
        )
        .unwrap();
        assert_eq!(&*t, &[1, 15043, u32::MAX]);
    }

    #[test]
    fn an_sglang_answer_and_one_without_count() {
        assert_eq!(
            &*parse(br#"{"tokens":[7],"count":1,"max_model_len":-1}"#, 10).unwrap(),
            &[7]
        );
        assert_eq!(&*parse(br#"{"tokens":[]}"#, 10).unwrap(), &[] as &[u32]);
    }

    #[test]
    fn garbage_is_malformed_never_a_panic() {
        for body in [
            &b""[..],
            b"not json",
            b"<html>502</html>",
            b"{\"tokens\":[1,2",
            b"{\"tokens\":[-1]}",
            b"{\"tokens\":[4294967296]}",
            b"{\"tokens\":[1.5]}",
            b"{\"tokens\":\"1 2\"}",
            b"{\"tokens\":[[1,2]],\"count\":[2]}",
            b"{\"count\":1}",
            b"[1,2,3]",
            b"{\"tokens\":[1,2],\"count\":3}",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(parse(body, 10), Err(BadAnswer::Malformed(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn too_many_tokens() {
        let body = format!("{{\"tokens\":[{}]}}", ["1"; 11].join(","));
        assert_eq!(
            parse(body.as_bytes(), 10),
            Err(BadAnswer::TooManyTokens(11))
        );
        let body = format!("{{\"tokens\":[{}]}}", ["1"; 10].join(","));
        assert_eq!(parse(body.as_bytes(), 10).unwrap().len(), 10);
    }

    #[test]
    fn snippets_are_cut_at_a_character() {
        assert_eq!(snippet(b"short", 10), "short");
        assert_eq!(snippet("ééé".as_bytes(), 3), "é\u{FFFD}…");
        assert_eq!(snippet(b"0123456789", 4), "0123…");
    }
}
