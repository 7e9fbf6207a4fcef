//! The request parser's fast path: a strict JSON reader for the bodies clients actually send,
//! into the same [`Body`] as the `serde_json` path ([`super::body`]).
//!
//! It accepts a subset of what `serde_json` accepts and gives `None` for anything else: invalid
//! UTF-8, a control character in a string, an escape it does not know, any surrogate escape that
//! is not a high + low pair, a number with an exponent or over 64 bytes (the ones `serde_json`
//! may reject as out of range), nesting over [`MAX_DEPTH`], or any syntax error. The caller then
//! takes the `serde_json` path, which decides (Go's leniency, or the error to report). So where
//! this reader gives a body, `serde_json` gives the same one; `fast_path_equals_serde` checks it.
//!
//! Why it exists: the body's UTF-8 and control characters are checked once, in long vectorized
//! passes, and strings are found with `memchr`, where `serde_json` inspects 8 bytes per step for
//! quotes, backslashes and control characters and validates each string on its own; a string with
//! escapes is decoded once into its own `String` (`serde_json` decodes into a scratch buffer, then
//! the visitor copies it out). About 30 % off the 220 KB request path (`benches/RESULTS.md`).

use std::borrow::Cow;

use super::body::{Body, Fields, Json, Number};

/// Deepest nesting the fast path reads (`serde_json` allows 128).
const MAX_DEPTH: u32 = 64;

/// Numbers longer than this go to `serde_json` (no exponent and at most 64 digits cannot
/// overflow an `f64`).
const MAX_NUMBER_BYTES: usize = 64;

/// Reads `body` if it is plain strict JSON, else `None`.
pub fn parse(body: &[u8]) -> Option<Body<'_>> {
    // The whole body at once: long runs validate fastest, and a string's text between two
    // escapes (ASCII bytes, so character boundaries) is then a slice of it.
    let text = std::str::from_utf8(body).ok()?;
    let mut r = Reader {
        s: body,
        text,
        i: 0,
        depth: 0,
        controls: has_control(body),
    };
    r.ws();
    let parsed = if r.peek()? == b'{' {
        r.enter()?;
        let mut fields = Fields::default();
        r.members(|key, r| {
            match fields.slot_mut(&key) {
                Some(slot) => *slot = Some(r.value()?),
                None => drop(r.value()?),
            }
            Some(())
        })?;
        Body::Object(fields)
    } else {
        Body::Other(r.value()?.kind())
    };
    r.ws();
    (r.i == body.len()).then_some(parsed)
}

struct Reader<'a> {
    s: &'a [u8],
    /// `s` as text.
    text: &'a str,
    i: usize,
    depth: u32,
    /// Whether `s` has a control character anywhere (then each string is checked for one).
    controls: bool,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Steps over an opening `{` or `[`, one level deeper.
    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        self.i += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn value(&mut self) -> Option<Json<'a>> {
        self.ws();
        Some(match self.peek()? {
            b'"' => Json::String(self.string()?),
            b'{' => {
                self.enter()?;
                let mut fields = Vec::new();
                self.members(|key, r| {
                    fields.push((key, r.value()?));
                    Some(())
                })?;
                Json::Object(fields)
            }
            b'[' => {
                self.enter()?;
                let mut items = Vec::new();
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        items.push(self.value()?);
                        self.ws();
                        match self.next()? {
                            b',' => {}
                            b']' => break,
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                Json::Array(items)
            }
            b't' => self.literal(b"true", Json::Bool(true))?,
            b'f' => self.literal(b"false", Json::Bool(false))?,
            b'n' => self.literal(b"null", Json::Null)?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        })
    }

    /// The members of an object whose `{` was read, each passed to `each` with its key (the
    /// reader then at the value).
    fn members(
        &mut self,
        mut each: impl FnMut(Cow<'a, str>, &mut Self) -> Option<()>,
    ) -> Option<()> {
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.string()?;
            self.ws();
            if self.next()? != b':' {
                return None;
            }
            each(key, self)?;
            self.ws();
            match self.next()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn literal(&mut self, word: &[u8], value: Json<'a>) -> Option<Json<'a>> {
        let end = self.i + word.len();
        (self.s.get(self.i..end)? == word).then(|| {
            self.i = end;
            value
        })
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`, at most [`MAX_NUMBER_BYTES`] long.
    fn number(&mut self) -> Option<Json<'a>> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            let first = self.i;
            self.digits();
            if self.i == first {
                return None;
            }
        }
        match self.peek() {
            Some(b'e' | b'E' | b'0'..=b'9') => None,
            _ => (self.i - start <= MAX_NUMBER_BYTES)
                .then(|| Json::Number(Number::Text(&self.text[start..self.i]))),
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    /// A string whose opening quote is next: borrowed when it has no escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.i += 1;
        let mut owned: Option<String> = None;
        loop {
            let start = self.i;
            let n = memchr::memchr2(b'"', b'\\', &self.s[start..])?;
            let run = self.text.get(start..start + n)?;
            if self.controls && has_control(run.as_bytes()) {
                return None;
            }
            self.i += n + 1;
            if self.s[start + n] == b'"' {
                return Some(match owned {
                    None => Cow::Borrowed(run),
                    Some(mut text) => {
                        text.push_str(run);
                        Cow::Owned(text)
                    }
                });
            }
            let text = owned.get_or_insert_with(|| String::with_capacity(2 * n + 16));
            text.push_str(run);
            let c = match self.next()? {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => self.unicode_escape()?,
                _ => return None,
            };
            text.push(c);
        }
    }

    /// The character of a `\u` escape (its `\u` read): a non-surrogate, or a high surrogate
    /// followed by a low one.
    fn unicode_escape(&mut self) -> Option<char> {
        let unit = self.hex4()?;
        match unit {
            0xD800..=0xDBFF => {
                if self.next()? != b'\\' || self.next()? != b'u' {
                    return None;
                }
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                char::from_u32(
                    0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00),
                )
            }
            0xDC00..=0xDFFF => None,
            _ => char::from_u32(u32::from(unit)),
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.s.get(self.i..self.i + 4)?;
        let mut unit = 0u16;
        for &d in digits {
            let v = (d as char).to_digit(16)?;
            unit = unit << 4 | v as u16;
        }
        self.i += 4;
        Some(unit)
    }
}

/// Whether `bytes` has a control character (U+0000 to U+001F, which a JSON string must escape).
fn has_control(bytes: &[u8]) -> bool {
    // A fold over fixed chunks vectorizes (a short-circuiting `any` does not).
    bytes
        .chunks(256)
        .any(|chunk| chunk.iter().fold(false, |found, &b| found | (b < 0x20)))
}
