//! A model's chat template rendered as Hugging Face `transformers` renders it (what vLLM's and
//! SGLang's `/tokenize` and chat endpoints do), for the `file` tokenizer source.
//!
//! Where the template comes from, as `transformers` loads it: `chat_template.jinja` beside the
//! `tokenizer.json`, else `tokenizer_config.json`'s `chat_template` (a string, or a list of named
//! templates: `tool_use` when the request has `tools` and the list has one, else `default`).
//!
//! The messages are prepared as vLLM prepares them (SGLang alike): an assistant's tool-call
//! `arguments` (a JSON string in OpenAI's API) parsed into the object templates expect, and,
//! for a template that does not loop over a message's content (vLLM's "string" content
//! format), a list content replaced by its text parts joined by `\n`.
//!
//! How it renders: MiniJinja with `transformers`' settings (`trim_blocks`, `lstrip_blocks`, no
//! trailing newline kept, loop controls); the context is `messages` and `tools` as the client
//! sent them (key order kept), `add_generation_prompt`, and the special tokens of
//! `tokenizer_config.json` (`bos_token`, `eos_token`, ...: a string or an added token's
//! `content`); `raise_exception(msg)` fails the render, `strftime_now(fmt)` is the UTC time
//! now, and `tojson` is `transformers`' (Python's `json.dumps` with `ensure_ascii=False`:
//! `", "` and `": "` separators, `indent`, `separators` and `sort_keys` arguments). Python
//! string and dict methods (`.strip()`, `.split()`, `.startswith()`, `.items()`, `.get()`, ...)
//! come from `minijinja-contrib`'s pycompat. What does not render exactly: see
//! docs/tokenizer.md ("Chat templates").

use std::fmt::Write as _;
use std::path::Path;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;
use thiserror::Error;

/// The special-token keys of `tokenizer_config.json` passed to the template.
const SPECIAL_TOKENS: [&str; 8] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
];

/// A chat template that cannot be loaded or rendered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    #[error("cannot read the chat template {path}: {message}")]
    Load { path: String, message: String },
    #[error("the chat template of {path} does not parse: {message}")]
    Syntax { path: String, message: String },
    #[error("{path} has no chat template")]
    Missing { path: String },
    #[error("{0}")]
    Render(String),
}

/// A model's chat template(s), ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether a `tool_use` template exists beside `default`.
    tool_use: bool,
    /// Whether a `default` template exists.
    default: bool,
    /// Whether the templates loop over a message's content (vLLM's "openai" content format:
    /// list contents are passed as sent); otherwise list contents are joined into a string.
    loops_over_content: bool,
    specials: Vec<(String, Value)>,
    /// The templates' text, together ([`ChatTemplate::writes`]).
    texts: String,
    /// Where it came from (errors name it).
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("tool_use", &self.tool_use)
            .finish()
    }
}

impl ChatTemplate {
    /// The template of the model directory `dir`; `Ok(None)` when it has neither
    /// `chat_template.jinja` nor a `tokenizer_config.json` with a `chat_template`.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, TemplateError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| TemplateError::Load {
                path: config_path.display().to_string(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Json::Null,
            Err(e) => {
                return Err(TemplateError::Load {
                    path: config_path.display().to_string(),
                    message: e.to_string(),
                });
            }
        };
        let jinja_path = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja_path) {
            Ok(source) => {
                let templates = vec![("default".to_owned(), source)];
                ChatTemplate::new(templates, &config, jinja_path.display().to_string()).map(Some)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                ChatTemplate::from_config(&config, &config_path.display().to_string())
            }
            Err(e) => Err(TemplateError::Load {
                path: jinja_path.display().to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// The template of a parsed `tokenizer_config.json` (`source` names it in errors).
    pub fn from_config(config: &Json, source: &str) -> Result<Option<ChatTemplate>, TemplateError> {
        let templates = match config.get("chat_template") {
            Some(Json::String(t)) => vec![("default".to_owned(), t.clone())],
            Some(Json::Array(named)) => named
                .iter()
                .filter_map(|t| {
                    Some((
                        t.get("name")?.as_str()?.to_owned(),
                        t.get("template")?.as_str()?.to_owned(),
                    ))
                })
                .collect(),
            _ => return Ok(None),
        };
        ChatTemplate::new(templates, config, source.to_owned()).map(Some)
    }

    fn new(
        templates: Vec<(String, String)>,
        config: &Json,
        source: String,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = environment();
        let (mut default, mut tool_use) = (false, false);
        let loops_over_content = templates.iter().any(|(_, t)| loops_over_content(t));
        let texts = templates.iter().map(|(_, t)| t.as_str()).collect();
        for (name, text) in templates {
            default |= name == "default";
            tool_use |= name == "tool_use";
            env.add_template_owned(name, text)
                .map_err(|e| TemplateError::Syntax {
                    path: source.clone(),
                    message: e.to_string(),
                })?;
        }
        Ok(ChatTemplate {
            env,
            tool_use,
            default,
            loops_over_content,
            specials: special_tokens(config),
            texts,
            source,
        })
    }

    /// Whether a template writes `literal` (an added token such as `<|im_start|>`) as text.
    pub fn writes(&self, literal: &str) -> bool {
        self.texts.contains(literal)
    }

    /// Renders `messages` (a JSON array's text) with `tools` (a JSON value's text, if the request
    /// has them) and `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &str,
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let json = |text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| TemplateError::Render(format!("the request's JSON: {e}")))
        };
        let tools = tools.map(json).transpose()?.filter(|t| !t.is_none());
        let name = if tools.is_some() && self.tool_use {
            "tool_use"
        } else if self.default {
            "default"
        } else {
            return Err(TemplateError::Missing {
                path: self.source.clone(),
            });
        };
        let template = self.env.get_template(name).map_err(render_error)?;
        let mut context: Vec<(String, Value)> = vec![
            (
                "messages".to_owned(),
                prepare(json(messages)?, !self.loops_over_content),
            ),
            ("tools".to_owned(), tools.unwrap_or(Value::from(()))),
            ("documents".to_owned(), Value::from(())),
            (
                "add_generation_prompt".to_owned(),
                Value::from(add_generation_prompt),
            ),
        ];
        context.extend(self.specials.iter().cloned());
        template
            .render(Value::from_pairs(context))
            .map_err(render_error)
    }
}

/// Whether a template iterates over a message's content (`for x in message.content`,
/// `message['content']`): vLLM's detection of the "openai" content format, simplified.
fn loops_over_content(template: &str) -> bool {
    let mut rest = template;
    while let Some(at) = rest.find(" in ") {
        let after = rest[at + 4..].trim_start();
        let var_end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let access = &after[var_end..];
        if matches!(&after[..var_end], "message" | "m" | "msg")
            && (access.starts_with(".content")
                || access.starts_with("['content']")
                || access.starts_with("[\"content\"]"))
        {
            return true;
        }
        rest = &rest[at + 4..];
    }
    false
}

/// The parts of a content list that are text (Kthena's and vLLM's text part types).
const TEXT_PARTS: [&str; 3] = ["text", "input_text", "output_text"];

/// `messages` as vLLM hands them to the template (see the module header).
fn prepare(messages: Value, join_contents: bool) -> Value {
    let Ok(list) = messages.try_iter() else {
        return messages;
    };
    list.map(|m| {
        if m.kind() != ValueKind::Map {
            return m;
        }
        let assistant =
            m.get_attr("role").ok().as_ref().and_then(Value::as_str) == Some("assistant");
        let pairs: Vec<(Value, Value)> = m
            .try_iter()
            .into_iter()
            .flatten()
            .map(|key| {
                let value = m.get_item(&key).unwrap_or_default();
                let value = match key.as_str() {
                    Some("tool_calls") if assistant && value.kind() == ValueKind::Seq => value
                        .try_iter()
                        .into_iter()
                        .flatten()
                        .map(parse_arguments)
                        .collect(),
                    Some("content") if join_contents && value.kind() == ValueKind::Seq => {
                        join_text_parts(&value)
                    }
                    _ => value,
                };
                (key, value)
            })
            .collect();
        Value::from_pairs(pairs)
    })
    .collect()
}

/// A tool call whose `function.arguments` is a JSON string, with it parsed.
fn parse_arguments(call: Value) -> Value {
    let Ok(function) = call.get_attr("function") else {
        return call;
    };
    let Some(parsed) = function
        .get_attr("arguments")
        .ok()
        .as_ref()
        .and_then(Value::as_str)
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
    else {
        return call;
    };
    let replace = |map: &Value, key: &str, new: Value| -> Value {
        let mut new = Some(new);
        Value::from_pairs(map.try_iter().into_iter().flatten().map(|k| {
            let v = if k.as_str() == Some(key) {
                new.take().unwrap_or_default()
            } else {
                map.get_item(&k).unwrap_or_default()
            };
            (k, v)
        }))
    };
    let function = replace(&function, "arguments", parsed);
    replace(&call, "function", function)
}

/// The text parts of a content list joined by `\n` (a part of another type is dropped).
fn join_text_parts(parts: &Value) -> Value {
    let texts: Vec<String> = parts
        .try_iter()
        .into_iter()
        .flatten()
        .filter(|p| p.kind() == ValueKind::Map)
        .filter(|p| {
            let kind = p.get_attr("type").unwrap_or_default();
            kind.is_undefined() || kind.as_str().is_some_and(|t| TEXT_PARTS.contains(&t))
        })
        .filter_map(|p| p.get_attr("text").ok()?.as_str().map(str::to_owned))
        .collect();
    Value::from(texts.join("\n"))
}

fn render_error(e: Error) -> TemplateError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    TemplateError::Render(message)
}

/// `transformers`' `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `transformers`' `strftime_now(format)`: the time now (UTC) formatted by `format` (`%d %m %Y
/// %y %b %B %a %A %H %M %S %j %%`; another directive fails the render).
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `secs` (since the Unix epoch, UTC) formatted as Python's `strftime` does for the directives
/// [`strftime_now`] lists.
fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    let days = (secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let weekday = WEEKDAYS[((days + 4).rem_euclid(7)) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year % 100),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('B') => write!(out, "{month_name}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('H') => write!(out, "{h:02}"),
            Some('M') => write!(out, "{m:02}"),
            Some('S') => write!(out, "{s:02}"),
            Some('j') => write!(out, "{day_of_year:03}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ));
            }
        };
    }
    Ok(out)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01: (year, month 1-12, day 1-31).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `transformers`' `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_owned()),
        Some(v) => Some(" ".repeat(usize::try_from(v)?)),
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let dumps = Dumps {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    dumps.value(value, 0, &mut out)?;
    Ok(out)
}

/// Python's `json.dumps` settings.
struct Dumps {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Dumps {
    fn value(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => {
                let _ = write!(out, "{v}");
            }
            ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or(""), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(('[', ']'), items.len(), depth, out, |i, depth, out| {
                    self.value(&items[i], depth, out)
                })?;
            }
            ValueKind::Map => {
                let mut pairs: Vec<(String, Value)> = v
                    .try_iter()?
                    .map(|k| {
                        let value = v.get_item(&k).unwrap_or_default();
                        let key = k.as_str().map_or_else(|| k.to_string(), str::to_owned);
                        (key, value)
                    })
                    .collect();
                if self.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(('{', '}'), pairs.len(), depth, out, |i, depth, out| {
                    self.string(&pairs[i].0, out);
                    out.push_str(&self.key);
                    self.value(&pairs[i].1, depth, out)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    fn container(
        &self,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        out: &mut String,
        mut each: impl FnMut(usize, usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            each(i, depth + 1, out)?;
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = serde_json::to_string(s).expect("a string serializes");
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
}

/// A value as Python's `str` prints it inside a template's output: containers as their
/// `repr` (`{'a': 1}`, `[1, 'x']`), `None`, `True`, floats as `repr`.
fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    repr_into(v, &mut out, false);
    out
}

fn repr_into(v: &Value, out: &mut String, quoted: bool) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
        ValueKind::String if quoted => py_str_repr(v.as_str().unwrap_or(""), out),
        ValueKind::String => out.push_str(v.as_str().unwrap_or("")),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&item, out, true);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&key, out, true);
                out.push_str(": ");
                repr_into(&v.get_item(&key).unwrap_or_default(), out, true);
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

/// Python's `repr` of a string: single quotes unless it holds one and no double quote.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A float as Python's `repr` writes it (`1.0`, `0.5`, `1e-05`, `1.5e+20`).
fn py_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".to_owned()
        } else if f > 0.0 {
            "Infinity".to_owned()
        } else {
            "-Infinity".to_owned()
        };
    }
    if f.fract() == 0.0 && f.abs() < 1e16 {
        return format!("{f:.1}");
    }
    let exponent = f.abs().log10().floor();
    if (-4.0..16.0).contains(&exponent) {
        return format!("{f}");
    }
    let debug = format!("{f:e}");
    let (mantissa, exp) = debug.split_once('e').unwrap_or((&debug, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// A MiniJinja environment that renders as Hugging Face's jinja2 sandbox does: blocks trimmed,
/// Python's string methods, `tojson`, jinja2's `sequence`/`iterable` tests, Python's
/// formatting of values, and `raise_exception`/`strftime_now`.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    // jinja2's tests where MiniJinja's differ: strings and mappings are sequences.
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Undefined
        )
    });
    env.add_test("iterable", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
                | ValueKind::Undefined
        )
    });
    // `{{ value }}` as Python prints it (`None`, `True`, `{'a': 1}`, `1e-05`).
    env.set_formatter(|out, _state, value| {
        match value.kind() {
            ValueKind::String => out.write_str(value.as_str().unwrap_or(""))?,
            ValueKind::Undefined => {}
            _ => out.write_str(&py_repr(value))?,
        }
        Ok(())
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// The tokenizer config's special tokens (`bos_token`, ...), as strings, or an added token's
/// `content`, or lists.
fn special_tokens(config: &Json) -> Vec<(String, Value)> {
    SPECIAL_TOKENS
        .iter()
        .filter_map(|&key| {
            let value = match config.get(key)? {
                Json::String(s) => Value::from(s.as_str()),
                Json::Object(added) => Value::from(added.get("content")?.as_str()?),
                Json::Array(list) => serde_json::from_value(Json::Array(list.clone())).ok()?,
                _ => return None,
            };
            Some((key.to_owned(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests;
