//! The request parser's one pass over a body: the top-level fields rendering reads, with strings
//! borrowed from the body where they have no escapes; every other field is checked but not kept.
//!
//! Everything is deserialized through `deserialize_any`, exactly as `serde_json::Value` is, so a
//! body is accepted, or rejected with the same error at the same position, as by
//! `serde_json::from_slice::<Value>`: strings are UTF-8-checked and unescaped, numbers range-checked,
//! nesting depth limited. Objects keep their keys in order and [`JsonView::field`] takes the last
//! of duplicates, as `Value`'s map does. `InferenceRequest::parse_by_value` is the reference
//! this is tested against.

use std::borrow::Cow;
use std::fmt;
use std::io;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};

use crate::prompt::JsonView;

/// A JSON value whose strings borrow from the body where they have no escapes.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number<'a>),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

impl Json<'_> {
    /// The value's type, for error messages (as [`crate::request::json_kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

/// A number: its text as the fast path read it, or the value `serde_json` parsed. Read only
/// for a digest ([`JsonView::write_canonical`]), so the fast path never parses one.
#[derive(Debug, Clone)]
pub enum Number<'a> {
    Text(&'a str),
    Parsed(serde_json::Number),
}

impl Number<'_> {
    /// The value `serde_json` gives this number (its text parsed as it parses it in a body).
    fn value(&self) -> Option<serde_json::Number> {
        match self {
            Number::Text(text) => serde_json::from_str(text).ok(),
            Number::Parsed(n) => Some(n.clone()),
        }
    }
}

/// Equal when `serde_json` reads them as the same value (the fast path keeps `1.50`, the
/// `serde_json` path `1.5`).
impl PartialEq for Number<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
    }
}

impl JsonView for Json<'_> {
    fn as_text(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    fn as_list(&self) -> Option<&[Self]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }

    fn field(&self, key: &str) -> Option<&Self> {
        match self {
            Json::Object(fields) => fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn write_canonical(&self, out: &mut impl io::Write) -> io::Result<()> {
        match self {
            Json::Null => out.write_all(b"null"),
            Json::Bool(b) => out.write_all(if *b { b"true" } else { b"false" }),
            Json::Number(n) => match n.value() {
                Some(n) => Ok(serde_json::to_writer(out, &n)?),
                None => out.write_all(b"null"),
            },
            Json::String(s) => Ok(serde_json::to_writer(out, s.as_ref())?),
            Json::Array(items) => {
                out.write_all(b"[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",")?;
                    }
                    item.write_canonical(out)?;
                }
                out.write_all(b"]")
            }
            Json::Object(fields) => {
                // As `Value`'s map holds them: sorted by key, the last of duplicates (a stable
                // sort keeps duplicates in body order).
                let mut sorted: Vec<&(Cow<'_, str>, Json<'_>)> = fields.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                out.write_all(b"{")?;
                let mut first = true;
                for (i, (key, value)) in sorted.iter().map(|f| (&f.0, &f.1)).enumerate() {
                    if sorted.get(i + 1).is_some_and(|next| next.0 == *key) {
                        continue;
                    }
                    if !first {
                        out.write_all(b",")?;
                    }
                    first = false;
                    serde_json::to_writer(&mut *out, key.as_ref())?;
                    out.write_all(b":")?;
                    value.write_canonical(out)?;
                }
                out.write_all(b"}")
            }
        }
    }
}

/// A request body: the fields the router reads when it is an object, else the type it is.
#[derive(Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, on the stack, moved once"
)]
pub enum Body<'a> {
    Object(Fields<'a>),
    /// Not an object: the value's type.
    Other(&'static str),
}

/// The top-level fields of an object body the router reads (the last of duplicates).
#[derive(Debug, Default, PartialEq)]
pub struct Fields<'a> {
    pub model: Option<Json<'a>>,
    pub stream: Option<Json<'a>>,
    pub prompt: Option<Json<'a>>,
    pub messages: Option<Json<'a>>,
    pub system: Option<Json<'a>>,
    pub input: Option<Json<'a>>,
    pub instructions: Option<Json<'a>>,
    /// vLLM's per-tenant cache salt: namespaces the hash chain, never rendered.
    pub cache_salt: Option<Json<'a>>,
    /// Tool definitions: rendered by the affinity mode only ([`crate::prompt::Rendering`]).
    pub tools: Option<Json<'a>>,
}

impl<'a> Fields<'a> {
    /// The field `key`, if the router reads it and the body has it.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        self.slot(key).and_then(Option::as_ref)
    }

    fn slot(&self, key: &str) -> Option<&Option<Json<'a>>> {
        Some(match key {
            "model" => &self.model,
            "stream" => &self.stream,
            "prompt" => &self.prompt,
            "messages" => &self.messages,
            "system" => &self.system,
            "input" => &self.input,
            "instructions" => &self.instructions,
            "cache_salt" => &self.cache_salt,
            "tools" => &self.tools,
            _ => return None,
        })
    }

    pub(super) fn slot_mut(&mut self, key: &str) -> Option<&mut Option<Json<'a>>> {
        Some(match key {
            "model" => &mut self.model,
            "stream" => &mut self.stream,
            "prompt" => &mut self.prompt,
            "messages" => &mut self.messages,
            "system" => &mut self.system,
            "input" => &mut self.input,
            "instructions" => &mut self.instructions,
            "cache_salt" => &mut self.cache_salt,
            "tools" => &mut self.tools,
            _ => return None,
        })
    }
}

/// A string (an object key, or a value) borrowed from the body where it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        // `Value` reads its keys through `deserialize_str` too.
        deserializer.deserialize_str(TextVisitor)
    }
}

/// A value that is checked as `Value` checks it (every string, number and level) and dropped.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CheckedVisitor;
        impl<'de> Visitor<'de> for CheckedVisitor {
            type Value = Checked;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i128<E>(self, _: i128) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u128<E>(self, _: u128) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_none<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Checked, D::Error> {
                Checked::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
                while map.next_key::<CheckedKey>()?.is_some() {
                    map.next_value::<Checked>()?;
                }
                Ok(Checked)
            }
        }
        deserializer.deserialize_any(CheckedVisitor)
    }
}

/// An object key that is checked and dropped.
struct CheckedKey;

impl<'de> Deserialize<'de> for CheckedKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = CheckedKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, _: &str) -> Result<CheckedKey, E> {
                Ok(CheckedKey)
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Visits any JSON value into a [`Json`].
struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Number::Parsed(n.into())))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Number::Parsed(n.into())))
    }
    // `serde_json` calls neither 128-bit visitor without `arbitrary_precision`; as `Value`.
    fn visit_i128<E>(self, n: i128) -> Result<Json<'de>, E> {
        Ok(
            serde_json::Number::from_i128(n)
                .map_or(Json::Null, |n| Json::Number(Number::Parsed(n))),
        )
    }
    fn visit_u128<E>(self, n: u128) -> Result<Json<'de>, E> {
        Ok(
            serde_json::Number::from_u128(n)
                .map_or(Json::Null, |n| Json::Number(Number::Parsed(n))),
        )
    }
    fn visit_f64<E>(self, n: f64) -> Result<Json<'de>, E> {
        // As `Value`: a float that is not finite is null (`serde_json` never parses one).
        Ok(serde_json::Number::from_f64(n).map_or(Json::Null, |n| Json::Number(Number::Parsed(n))))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s)))
    }
    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        Json::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let mut fields = Vec::new();
        while let Some(Text(key)) = map.next_key()? {
            fields.push((key, map.next_value()?));
        }
        Ok(Json::Object(fields))
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

impl<'de> Deserialize<'de> for Body<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BodyVisitor;
        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = Body<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Body<'de>, E> {
                Ok(Body::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Body<'de>, E> {
                Ok(Body::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Body<'de>, E> {
                Ok(Body::Other("a number"))
            }
            fn visit_i128<E>(self, _: i128) -> Result<Body<'de>, E> {
                Ok(Body::Other("a number"))
            }
            fn visit_u128<E>(self, _: u128) -> Result<Body<'de>, E> {
                Ok(Body::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Body<'de>, E> {
                Ok(Body::Other("a number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Body<'de>, E> {
                Ok(Body::Other("a string"))
            }
            fn visit_unit<E>(self) -> Result<Body<'de>, E> {
                Ok(Body::Other("null"))
            }
            fn visit_none<E>(self) -> Result<Body<'de>, E> {
                Ok(Body::Other("null"))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Body<'de>, D::Error> {
                Body::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Body<'de>, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Body::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body<'de>, A::Error> {
                let mut fields = Fields::default();
                while let Some(Text(key)) = map.next_key()? {
                    match fields.slot_mut(&key) {
                        Some(slot) => *slot = Some(map.next_value()?),
                        None => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(Body::Object(fields))
            }
        }
        deserializer.deserialize_any(BodyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::prompt::Rendering;
    use crate::request::InferenceRequest;

    /// Pieces of a JSON string's text: plain, escaped, paired and lone surrogate escapes,
    /// multi-byte UTF-8, invalid UTF-8, and a few things JSON rejects.
    fn string_piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            12 => valid_string_piece(),
            1 => Just(br"\ud800".to_vec()),
            1 => Just(br"\uDC00x".to_vec()),
            1 => Just(br"\ud800\u0041".to_vec()),
            1 => Just(b"\xFF".to_vec()),
            1 => Just(b"\xE2\x82A".to_vec()),
            1 => Just(b"\xED\xA0\x80".to_vec()),
            1 => Just(b"\x01".to_vec()),
            1 => Just(br"\x".to_vec()),
            1 => Just(br"\u12".to_vec()),
        ]
    }

    /// Pieces of a valid JSON string's text.
    fn valid_string_piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => "[a-z <|>]{0,8}".prop_map(String::into_bytes),
            1 => prop::sample::select(vec![
                r#"\""#, r"\\", r"\/", r"\b", r"\f", r"\n", r"\r", r"\t", r"\u00e9", r"\u00E9",
                r"\u0000", r"\ud83d\ude00", r"\uD83D\uDE00", r"\\ud800", "é日", "\u{7f}", "😀",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
        ]
    }

    fn string() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(string_piece(), 0..4).prop_map(|pieces| {
            let mut s = vec![b'"'];
            s.extend(pieces.concat());
            s.push(b'"');
            s
        })
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => prop::sample::select(vec![
                "model", "prompt", "messages", "system", "input", "instructions", "stream",
                "role", "content", "type", "text", "message", "user", "input_text", "cache_salt",
            ])
            .prop_map(|k| format!("\"{k}\"").into_bytes()),
            1 => Just(br#""mod\u0065l""#.to_vec()),
            1 => string(),
        ]
    }

    fn scalar() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => string(),
            1 => prop::sample::select(vec![
                "true", "false", "null", "0", "-1", "1.5e3", "1e400", "-1e400",
                "18446744073709551616", "-9223372036854775809", "01", "tru", "1.", "-",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
        ]
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        scalar().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(|items| {
                    let mut s = vec![b'['];
                    s.extend(items.join(&b","[..]));
                    s.push(b']');
                    s
                }),
                prop::collection::vec((key(), inner), 0..6).prop_map(|fields| {
                    let fields: Vec<Vec<u8>> = fields
                        .into_iter()
                        .map(|(k, v)| [k, b" : ".to_vec(), v].concat())
                        .collect();
                    let mut s = vec![b'{'];
                    s.extend(fields.join(&b","[..]));
                    s.push(b'}');
                    s
                }),
            ]
        })
    }

    /// An object from a few of the keys rendering reads, duplicates likely.
    fn small_object(value: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        let key = prop::sample::select(vec![
            "role",
            "content",
            "type",
            "text",
            "tool_calls",
            "tool_call_id",
            "function",
            "name",
            "arguments",
            "image_url",
        ]);
        prop::collection::vec((key, value), 0..5).prop_map(|fields| {
            let fields: Vec<Vec<u8>> = fields
                .into_iter()
                .map(|(k, v)| [format!("\"{k}\":").into_bytes(), v].concat())
                .collect();
            [b"{".to_vec(), fields.join(&b","[..]), b"}".to_vec()].concat()
        })
    }

    fn list(item: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(item, 0..4)
            .prop_map(|items| [b"[".to_vec(), items.join(&b","[..]), b"]".to_vec()].concat())
    }

    /// A chat or Responses field: a list of messages whose content is a string or a list of
    /// parts, the shape rendering walks.
    fn chat_field() -> impl Strategy<Value = Vec<u8>> {
        let word = prop_oneof![
            prop::sample::select(vec![
                r#""user""#,
                r#""text""#,
                r#""message""#,
                r#""""#,
                "3",
                "1.50",
                "-0",
                "1e2",
                r#""image_url""#,
                r#""function_call""#,
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            string(),
        ];
        let part = small_object(word.clone());
        let content = prop_oneof![word.clone(), list(part)];
        let message = small_object(prop_oneof![word, content]);
        (
            prop::sample::select(vec![
                "messages",
                "input",
                "system",
                "instructions",
                "prompt",
                "tools",
            ]),
            prop_oneof![list(message), string()],
        )
            .prop_map(|(k, v)| [format!("\"{k}\":").into_bytes(), v].concat())
    }

    /// A body: mostly an object with a model and a prompt-ish field, sometimes cut short or
    /// followed by junk.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![
            (key(), value()).prop_map(|(k, v)| [k, b":".to_vec(), v].concat()),
            chat_field(),
        ];
        let object = (
            prop::collection::vec(field, 0..6),
            prop_oneof![Just(br#""m""#.to_vec()), scalar()],
        )
            .prop_map(|(fields, model)| {
                let mut parts = vec![[b"\"model\":".to_vec(), model].concat()];
                parts.extend(fields);
                let mut s = vec![b'{'];
                s.extend(parts.join(&b", "[..]));
                s.push(b'}');
                s
            });
        (
            prop_oneof![4 => object, 1 => value()],
            prop_oneof![8 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)],
            prop_oneof![8 => Just(&b""[..]), 1 => Just(&b" \n"[..]), 1 => Just(&b"x"[..])],
        )
            .prop_map(|(mut body, cut, tail)| {
                if let Some(cut) = cut {
                    body.truncate(cut.index(body.len() + 1));
                }
                body.extend_from_slice(tail);
                body
            })
    }

    /// A body that is valid JSON (numbers aside), mostly an object.
    fn valid_body() -> impl Strategy<Value = Vec<u8>> {
        fn string() -> impl Strategy<Value = Vec<u8>> {
            prop::collection::vec(valid_string_piece(), 0..4)
                .prop_map(|pieces| [b"\"".to_vec(), pieces.concat(), b"\"".to_vec()].concat())
        }
        let scalar = prop_oneof![
            3 => string(),
            1 => prop::sample::select(vec![
                "true", "false", "null", "0", "-0", "-1", "1.5", "0.25", "1.5e3", "1E-2",
                "18446744073709551616", "123456789012345678901234567890",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
        ];
        let value = scalar
            .prop_recursive(4, 48, 6, move |inner| {
                let key = prop_oneof![
                    3 => prop::sample::select(vec![
                        "model", "prompt", "messages", "system", "input", "role", "content", "type",
                        "text", "stream", "cache_salt", "tools", "tool_calls", "function",
                    ])
                    .prop_map(|k| format!("\"{k}\"").into_bytes()),
                    1 => string(),
                ];
                prop_oneof![
                    list(inner.clone()),
                    prop::collection::vec((key, inner), 0..6).prop_map(|fields| {
                        let fields: Vec<Vec<u8>> = fields
                            .into_iter()
                            .map(|(k, v)| [k, b" :\n".to_vec(), v].concat())
                            .collect();
                        [b"{ ".to_vec(), fields.join(&b",\t"[..]), b"}\r\n".to_vec()].concat()
                    }),
                ]
            })
            .boxed();
        prop_oneof![
            4 => (value.clone(), chat_field()).prop_map(|(v, chat)| {
                [br#"{"model":"m","x":"#.to_vec(), v, b",".to_vec(), chat, b"}".to_vec()].concat()
            }),
            1 => value,
        ]
    }

    /// The parse's result as text, the salt included (its `Debug` hides it).
    fn outcome(parsed: Result<InferenceRequest, crate::request::RequestError>) -> String {
        let salt = parsed
            .as_ref()
            .ok()
            .and_then(|r| r.salt.as_ref().map(|s| s.expose().to_string()));
        format!("{:?} salt {salt:?}", parsed.map_err(|e| e.to_string()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn borrowed_parse_equals_the_value_parse(body in body()) {
            for rendering in [Rendering::Kthena, Rendering::Engine] {
                prop_assert_eq!(
                    outcome(InferenceRequest::parse_as(&body, rendering)),
                    outcome(InferenceRequest::parse_by_value_as(&body, rendering)),
                    "{:?} body {:?}", rendering, String::from_utf8_lossy(&body)
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn fast_path_equals_serde(body in prop_oneof![valid_body(), body()]) {
            if let Some(fast) = crate::request::fast::parse(&body) {
                let serde = serde_json::from_slice::<super::Body>(&body);
                prop_assert!(serde.is_ok(), "serde_json rejects {:?}", String::from_utf8_lossy(&body));
                prop_assert_eq!(fast, serde.unwrap());
            }
        }

        #[test]
        fn valid_bodies_parse_like_the_value_parse(body in valid_body()) {
            for rendering in [Rendering::Kthena, Rendering::Engine] {
                prop_assert_eq!(
                    outcome(InferenceRequest::parse_as(&body, rendering)),
                    outcome(InferenceRequest::parse_by_value_as(&body, rendering)),
                    "{:?} body {:?}", rendering, String::from_utf8_lossy(&body)
                );
            }
        }
    }

    #[test]
    fn common_bodies_take_the_fast_path() {
        for body in [
            &br#"{"model":"m","prompt":"hi"}"#[..],
            br#"{"model": "m", "messages": [{"role": "system", "content": "a\nb\u00e9 \"q\""},
                {"role": "user", "content": [{"type": "text", "text": "x"}]}],
                "temperature": 0.7, "max_tokens": 128, "stream": true, "tools": [], "n": null}"#,
            br#" {"model":"m","input":[{"role":"user","content":"\ud83d\ude00"}]} "#,
        ] {
            assert!(crate::request::fast::parse(body).is_some(), "{body:?}");
        }
        for body in [
            &br#"{"model":"m","x":1e3}"#[..],
            br#"{"model":"m","x":"\ud800"}"#,
            b"{\"model\":\"\xff\"}",
            br#"{"model":"m",}"#,
            br#"{"model":"m"} x"#,
        ] {
            assert!(crate::request::fast::parse(body).is_none(), "{body:?}");
        }
    }

    #[test]
    fn chat_is_rendered_from_borrowed_strings() {
        let body = br#"{"model":"m","system":"s","messages":[{"role":"user","content":"a\u00e9"},
            {"role":"assistant","content":[{"type":"text","text":"b"},{"text":"c"}]}]}"#;
        let parsed = InferenceRequest::parse(body).unwrap();
        assert_eq!(
            parsed.prompt.as_deref(),
            Ok(
                "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\naé<|im_end|>\n\
                <|im_start|>assistant\nb\nc<|im_end|>\n"
            )
        );
        assert_eq!(parsed, InferenceRequest::parse_by_value(body).unwrap());
    }
}
