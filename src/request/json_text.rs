//! A borrowed JSON value ([`Json`]) written back as text in the body's key order: compact, to
//! send a client's value on unchanged ([`Json::write_compact`]), or as Python's `json.dumps`
//! writes what `json.loads` read ([`Json::write_python`]: how vLLM writes a Messages
//! `tool_use` input as its tool call's arguments, `json.dumps(block.input)`).
//!
//! Python's form: `", "` and `": "` separators, non-ASCII escaped as `\uXXXX` (surrogate pairs
//! past the BMP, lowercase hex), a duplicate key where it first appeared with its last value (a
//! dict's update), integers as written and other numbers as Python prints the float it parsed
//! (`1.50` -> `1.5`, `1e3` -> `1000.0`, `1e-7` -> `1e-07`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use super::body::{Json, Number};

impl Json<'_> {
    /// The value as compact JSON, keys in the body's order (duplicates kept; a number as it
    /// was read: the fast path's text, or the value `serde_json` parsed).
    pub fn write_compact(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => push_number_text(out, n),
            Json::String(s) => push_json_string(out, s),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_compact(out);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_json_string(out, key);
                    out.push(':');
                    value.write_compact(out);
                }
                out.push('}');
            }
        }
    }

    /// The value as Python's `json.dumps(json.loads(text))` writes it (see the module header).
    pub fn write_python(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => push_python_number(out, n),
            Json::String(s) => push_python_string(out, s),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_python(out);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                // A dict: each key at its first place, with its last value.
                let last: HashMap<&str, usize> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.as_ref(), i))
                    .collect();
                let mut written: HashSet<&str> = HashSet::with_capacity(last.len());
                out.push('{');
                for (key, _) in fields {
                    if !written.insert(key.as_ref()) {
                        continue;
                    }
                    if written.len() > 1 {
                        out.push_str(", ");
                    }
                    push_python_string(out, key);
                    out.push_str(": ");
                    fields[last[key.as_ref()]].1.write_python(out);
                }
                out.push('}');
            }
        }
    }
}

fn push_number_text(out: &mut String, n: &Number<'_>) {
    match n {
        Number::Text(text) => out.push_str(text),
        Number::Parsed(n) => out.push_str(&n.to_string()),
    }
}

fn push_json_string(out: &mut String, s: &str) {
    // Writing a string into a `String` cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

fn push_python_number(out: &mut String, n: &Number<'_>) {
    let text = match n {
        Number::Text(text) => (*text).to_string(),
        Number::Parsed(n) => n.to_string(),
    };
    if !text.contains(['.', 'e', 'E']) {
        out.push_str(&text);
        return;
    }
    let Ok(f) = text.parse::<f64>() else {
        out.push_str(&text);
        return;
    };
    push_python_float(out, f);
}

/// Python's `repr(float)`: the shortest round trip, exponent form below 1e-4 and from 1e16.
fn push_python_float(out: &mut String, f: f64) {
    if !f.is_finite() {
        out.push_str(if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        });
        return;
    }
    let magnitude = f.abs();
    if magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        // `{:e}` is the shortest round trip too: `1e-7`, `1.5e20`.
        let text = format!("{f:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    } else {
        // `{:?}` keeps a `.0` on integral values, as Python does.
        let _ = write!(out, "{f:?}");
    }
}

fn push_python_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python(text: &str) -> String {
        let value: Json<'_> = serde_json::from_str(text).unwrap();
        let mut out = String::new();
        value.write_python(&mut out);
        out
    }

    fn compact(text: &str) -> String {
        let value: Json<'_> = serde_json::from_str(text).unwrap();
        let mut out = String::new();
        value.write_compact(&mut out);
        out
    }

    /// Each expected text is what CPython 3's `json.dumps(json.loads(input))` prints.
    #[test]
    fn writes_what_python_json_dumps_writes() {
        for (input, expected) in [
            (
                r#"{"city":"Paris","unit":"c"}"#,
                r#"{"city": "Paris", "unit": "c"}"#,
            ),
            (
                r#"{"b":1,"a":[1,2,{"c":null}]}"#,
                r#"{"b": 1, "a": [1, 2, {"c": null}]}"#,
            ),
            (r#"{"a":1,"b":2,"a":3}"#, r#"{"a": 3, "b": 2}"#),
            (r#"{}"#, "{}"),
            (r#"[]"#, "[]"),
            (
                r#"{"t":"é😀\u0001\"\\/\n"}"#,
                r#"{"t": "\u00e9\ud83d\ude00\u0001\"\\/\n"}"#,
            ),
            (
                r#"[1.50, 1e3, -0.0, 1e-7, 1.5e20, 0.0001, 12345678901234567890]"#,
                "[1.5, 1000.0, -0.0, 1e-07, 1.5e+20, 0.0001, 12345678901234567890]",
            ),
            (r#"[true,false,null]"#, "[true, false, null]"),
        ] {
            assert_eq!(python(input), expected, "{input}");
        }
    }

    #[test]
    fn compact_keeps_the_order_and_the_duplicates() {
        assert_eq!(
            compact(
                r#"{ "type" : "object", "properties": {"z": {}, "a": [1, 2.50]}, "a":1, "a":2 }"#
            ),
            r#"{"type":"object","properties":{"z":{},"a":[1,2.5]},"a":1,"a":2}"#
        );
    }
}
