//! Go-compatible lenient JSON decoding of request bodies.
//!
//! Kthena parses bodies with Go's `encoding/json`, which never rejects a string for its content:
//! every byte that is not part of valid UTF-8 becomes one U+FFFD, and a `\uXXXX` surrogate escape
//! that does not form a valid high+low pair becomes one U+FFFD. `serde_json` rejects both, so this
//! module rewrites the body first and then hands it to `serde_json`:
//!
//! 1. invalid UTF-8: each byte of every invalid sequence is replaced by `EF BF BD` (U+FFFD). Rust's
//!    `from_utf8` reports maximal invalid subparts; Go's decoder consumes them one byte at a time, so
//!    a subpart of `n` bytes gives `n` replacement characters (`E2 82 41` -> `U+FFFD U+FFFD A`).
//! 2. lone surrogate escapes inside strings: a `\uD800`-`\uDFFF` escape that is not a high surrogate
//!    immediately followed by a low-surrogate escape is rewritten in place to `\ufffd` (same length).
//!
//! The fast path (valid UTF-8 and no `\ud`/`\uD` escape anywhere) borrows the body unchanged.

use std::borrow::Cow;

const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Parses `body` as JSON with Go's leniency for invalid UTF-8 and lone surrogate escapes.
pub fn parse_value(body: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    // The common case, valid UTF-8 without a surrogate escape, parses as a `str`: serde_json then
    // does not validate every string's UTF-8 a second time.
    if let Ok(text) = std::str::from_utf8(body)
        && !has_surrogate_escape(body)
    {
        return serde_json::from_str(text);
    }
    let text = sanitize(body);
    serde_json::from_slice(&text)
}

/// Returns the body rewritten so that `serde_json` decodes it the way Go's `encoding/json` does.
pub fn sanitize(body: &[u8]) -> Cow<'_, [u8]> {
    let utf8 = replace_invalid_utf8(body);
    if !has_surrogate_escape(&utf8) {
        return utf8;
    }
    let mut owned = utf8.into_owned();
    rewrite_lone_surrogates(&mut owned);
    Cow::Owned(owned)
}

fn replace_invalid_utf8(body: &[u8]) -> Cow<'_, [u8]> {
    let mut rest = body;
    let mut out: Option<Vec<u8>> = None;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => match out {
                None => return Cow::Borrowed(body),
                Some(mut v) => {
                    v.extend_from_slice(rest);
                    return Cow::Owned(v);
                }
            },
            Err(e) => {
                let v = out.get_or_insert_with(|| Vec::with_capacity(body.len() + 16));
                let valid = e.valid_up_to();
                v.extend_from_slice(&rest[..valid]);
                let bad = e.error_len().unwrap_or(rest.len() - valid);
                for _ in 0..bad {
                    v.extend_from_slice(REPLACEMENT);
                }
                rest = &rest[valid + bad..];
            }
        }
    }
}

fn has_surrogate_escape(text: &[u8]) -> bool {
    // `\u` cannot overlap itself, so the non-overlapping matches are all of them.
    memchr::memmem::find_iter(text, b"\\u")
        .any(|i| text.get(i + 2).is_some_and(|&c| (c | 0x20) == b'd'))
}

fn hex4(bytes: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(bytes.get(..4)?).ok()?;
    u16::from_str_radix(s, 16).ok()
}

fn escape_at(text: &[u8], i: usize) -> Option<u16> {
    if text.get(i) == Some(&b'\\') && text.get(i + 1) == Some(&b'u') {
        hex4(&text[i + 2..])
    } else {
        None
    }
}

/// Rewrites every surrogate escape that is not part of a valid pair to `\ufffd`, inside strings only.
fn rewrite_lone_surrogates(text: &mut [u8]) {
    let mut in_string = false;
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        if !in_string {
            in_string = c == b'"';
            i += 1;
            continue;
        }
        match c {
            b'"' => {
                in_string = false;
                i += 1;
            }
            b'\\' if text.get(i + 1) == Some(&b'u') => {
                let Some(unit) = escape_at(text, i) else {
                    i += 2;
                    continue;
                };
                if !(0xD800..=0xDFFF).contains(&unit) {
                    i += 6;
                    continue;
                }
                let pairs = (0xD800..=0xDBFF).contains(&unit)
                    && escape_at(text, i + 6).is_some_and(|lo| (0xDC00..=0xDFFF).contains(&lo));
                if pairs {
                    i += 12;
                } else {
                    text[i + 2..i + 6].copy_from_slice(b"fffd");
                    i += 6;
                }
            }
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &[u8]) -> String {
        match parse_value(body).unwrap() {
            serde_json::Value::String(s) => s,
            other => panic!("not a string: {other}"),
        }
    }

    #[test]
    fn valid_input_is_borrowed() {
        assert!(matches!(sanitize(br#"{"a":"b\u00e9"}"#), Cow::Borrowed(_)));
    }

    #[test]
    fn one_replacement_per_invalid_byte_like_go() {
        assert_eq!(decode(b"\"\xE2\x82A\""), "\u{FFFD}\u{FFFD}A");
        assert_eq!(decode(b"\"a\xFFb\""), "a\u{FFFD}b");
        // UTF-8 encoded surrogate: three invalid bytes.
        assert_eq!(decode(b"\"\xED\xA0\x80\""), "\u{FFFD}\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn lone_surrogates_become_one_replacement() {
        assert_eq!(decode(br#""\ud800""#), "\u{FFFD}");
        assert_eq!(decode(br#""\udc00x""#), "\u{FFFD}x");
        assert_eq!(decode(br#""\ud800\u0041""#), "\u{FFFD}A");
        assert_eq!(decode(br#""\ud800\ud800\udc00""#), "\u{FFFD}\u{10000}");
        assert_eq!(decode(br#""\ud83d\ude00""#), "\u{1F600}");
        assert_eq!(decode(br#""\\ud800""#), "\\ud800");
    }

    #[test]
    fn surrogate_escape_search_matches_a_byte_scan() {
        let reference = |t: &[u8]| {
            t.windows(3)
                .any(|w| w[0] == b'\\' && w[1] == b'u' && (w[2] | 0x20) == b'd')
        };
        for t in [
            &br"\u"[..],
            br"\ud",
            br"x\uD8",
            br"\\ud800",
            br"\u00e9\n\uDc00",
            br"\u\ud",
            br"\uu\u0d",
            b"",
        ] {
            assert_eq!(has_surrogate_escape(t), reference(t), "{t:?}");
        }
    }

    #[test]
    fn surrogate_text_outside_strings_is_untouched() {
        // Not inside a string: the parse error is serde_json's own.
        assert!(parse_value(br#"{"a": \ud800}"#).is_err());
    }
}
