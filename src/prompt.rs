//! Prompt rendering: an OpenAI-style request body -> the one string the prefix-cache plugin hashes.
//!
//! Exactly Kthena's rules (semantics doc §1). Precedence: `prompt`, else `messages`, else `input`.
//! - `prompt` (completions): a string is used as is; any other value (null, array, token ids) is
//!   "no prompt" (prefix-picker routes it without prefix scoring instead of rejecting it).
//! - `messages` (chat): a list; a top-level `system` becomes the first `{role: system}` message.
//!   Elements that are not objects, whose `role` is not a string, or whose content does not parse,
//!   are skipped.
//! - `input` (Responses): a non-empty string `instructions` becomes a `developer` message first; a
//!   string input is one `user` message; a list keeps object items whose `type` is absent, `""` or
//!   `"message"`, with a non-empty string `role` and parseable content.
//! - Content: a string as is; a list keeps object parts whose `type` is absent or one of `text`,
//!   `input_text`, `output_text` and whose `text` is a string, joined with `\n`; no kept part = fail.
//! - A `type` that is present but not a string (`null`, a number, a list, an object) counts as
//!   absent, for content parts and Responses items alike: Kthena decodes the body into
//!   `map[string]interface{}` and reads `type` with a Go type assertion, `m["type"].(string)`,
//!   whose `ok` is false for any other value (`pkg/kthena-router/utils/utils.go` at 3cc0572:
//!   lines 124 and 162; the body decoding: `router/router.go` lines 268 and 707-710).
//! - Messages render as ChatML, `<|im_start|>{role}\n{content}<|im_end|>\n`, with no trailing
//!   assistant header.
//!
//! That is [`Rendering::Kthena`], Kthena's mode. The affinity mode renders [`Rendering::Engine`]:
//! the same text, plus what the engine's chat template and KV cache also key on (tool
//! definitions, tool calls, non-text parts), as [`engine`] describes.
//!
//! An Anthropic Messages body ([`render_messages`]) renders by Kthena's rules in Kthena's mode
//! (Kthena's router serves every `/v1/` path alike: its `system` and `messages` are read as a
//! chat body's), and in the affinity mode as the chat body vLLM turns it into ([`messages`]).

use std::io;

use serde_json::{Map, Value};
use thiserror::Error;

mod engine;
pub mod messages;
pub mod stable_cut;

/// Which rendering a request's prompt gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rendering {
    /// Kthena's, exactly: the messages' text content only (Kthena's mode; the golden vectors).
    #[default]
    Kthena,
    /// The affinity mode's: Kthena's, plus tools, tool calls and non-text parts ([`engine`]).
    Engine,
}

impl Rendering {
    pub fn as_str(self) -> &'static str {
        match self {
            Rendering::Kthena => "kthena",
            Rendering::Engine => "engine",
        }
    }
}

/// Why a well-formed request has no prompt to score (the `reason` label of unscored requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum NoPrompt {
    #[error("`prompt` is not a string")]
    PromptNotString,
    #[error("`messages` is not a list")]
    MessagesNotList,
    #[error("`input` is neither a string nor a list")]
    InputNotStringOrList,
    #[error("no `prompt`, `messages` or `input` field")]
    NoPromptField,
}

impl NoPrompt {
    /// Stable snake_case name, used as a metric label and on the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            NoPrompt::PromptNotString => "prompt_not_string",
            NoPrompt::MessagesNotList => "messages_not_list",
            NoPrompt::InputNotStringOrList => "input_not_string_or_list",
            NoPrompt::NoPromptField => "no_prompt_field",
        }
    }
}

/// What rendering reads of a JSON value: implemented by `serde_json::Value` and by the borrowed
/// values of the request parser, so both render by the one set of rules below.
pub trait JsonView: Sized {
    /// The string, if the value is one.
    fn as_text(&self) -> Option<&str>;
    /// The elements, if the value is an array.
    fn as_list(&self) -> Option<&[Self]>;
    /// The value of `key` (the last one on duplicates), if the value is an object that has it.
    fn field(&self, key: &str) -> Option<&Self>;
    /// Writes the value as `serde_json` writes its `Value`: compact, object keys sorted, the
    /// last of duplicate keys (what a digest of a value hashes).
    fn write_canonical(&self, out: &mut impl io::Write) -> io::Result<()>;
}

impl JsonView for Value {
    fn as_text(&self) -> Option<&str> {
        self.as_str()
    }

    fn as_list(&self) -> Option<&[Value]> {
        self.as_array().map(Vec::as_slice)
    }

    fn field(&self, key: &str) -> Option<&Value> {
        self.as_object()?.get(key)
    }

    fn write_canonical(&self, out: &mut impl io::Write) -> io::Result<()> {
        Ok(serde_json::to_writer(out, self)?)
    }
}

/// Renders the prompt of a request body (a JSON object) following Kthena's precedence.
pub fn render(body: &Map<String, Value>, rendering: Rendering) -> Result<String, NoPrompt> {
    render_fields(rendering, |key| body.get(key))
}

/// [`render`] of a body the caller no longer needs: a string `prompt` is moved out, not copied.
pub fn render_owned(
    mut body: Map<String, Value>,
    rendering: Rendering,
) -> Result<String, NoPrompt> {
    if let Some(Value::String(prompt)) = body.get_mut("prompt") {
        return Ok(std::mem::take(prompt));
    }
    render(&body, rendering)
}

/// [`render`] of a body whose top-level fields are looked up by `get`.
pub fn render_fields<'a, J: JsonView + 'a>(
    rendering: Rendering,
    get: impl Fn(&str) -> Option<&'a J>,
) -> Result<String, NoPrompt> {
    if let Some(prompt) = get("prompt") {
        return match prompt.as_text() {
            Some(s) => Ok(s.to_owned()),
            None => Err(NoPrompt::PromptNotString),
        };
    }
    if let Some(messages) = get("messages") {
        let Some(messages) = messages.as_list() else {
            return Err(NoPrompt::MessagesNotList);
        };
        return Ok(match rendering {
            Rendering::Kthena => render_chat(get("system"), messages),
            Rendering::Engine => engine::render_chat(get("tools"), get("system"), messages),
        });
    }
    if let Some(input) = get("input") {
        return match rendering {
            Rendering::Kthena => render_responses(get("instructions"), input),
            Rendering::Engine => engine::render_responses(get("tools"), get("instructions"), input),
        };
    }
    Err(NoPrompt::NoPromptField)
}

/// The prompt of an Anthropic Messages body whose top-level fields are looked up by `get`:
/// Kthena's rendering of it ([`render_fields`]) in Kthena's mode; in the affinity mode, the chat
/// body vLLM serves it as ([`messages::chat_form`]), rendered as a chat body is (written straight
/// from the body: `messages::render`). `messages` must be a list.
pub fn render_messages<'a, J: JsonView + 'a>(
    rendering: Rendering,
    get: impl Fn(&str) -> Option<&'a J>,
) -> Result<String, NoPrompt> {
    match rendering {
        Rendering::Kthena => render_fields(rendering, get),
        Rendering::Engine => {
            let Some(messages) = get("messages") else {
                return Err(NoPrompt::NoPromptField);
            };
            let Some(messages) = messages.as_list() else {
                return Err(NoPrompt::MessagesNotList);
            };
            Ok(messages::render::render(
                get("tools"),
                get("system"),
                messages,
            ))
        }
    }
}

fn render_chat<J: JsonView>(system: Option<&J>, messages: &[J]) -> String {
    // One allocation: at most the content's bytes plus the ChatML framing of each message.
    let mut out = String::with_capacity(chat_len_bound(system, messages));
    if let Some(content) = system.and_then(parse_content) {
        push_chatml(&mut out, "system", &content);
    }
    for message in messages {
        // Not an object, or a role that is not a string: skipped.
        let Some(role) = message.field("role").and_then(JsonView::as_text) else {
            continue;
        };
        if let Some(content) = message.field("content").and_then(parse_content) {
            push_chatml(&mut out, role, &content);
        }
    }
    out
}

/// An upper bound of the bytes [`render_chat`] writes for string contents (list contents may
/// take more; the string then grows as usual).
fn chat_len_bound<J: JsonView>(system: Option<&J>, messages: &[J]) -> usize {
    const FRAME: usize = "<|im_start|>\n<|im_end|>\n".len();
    let text = |v: Option<&J>| v.and_then(JsonView::as_text).map_or(0, str::len);
    let role = |m: &J| text(m.field("role"));
    FRAME
        + "system".len()
        + text(system)
        + messages
            .iter()
            .map(|m| FRAME + role(m) + text(m.field("content")))
            .sum::<usize>()
}

fn render_responses<J: JsonView>(instructions: Option<&J>, input: &J) -> Result<String, NoPrompt> {
    let mut out = String::new();
    let developer = instructions
        .and_then(JsonView::as_text)
        .filter(|s| !s.is_empty());
    if let Some(text) = input.as_text() {
        if let Some(d) = developer {
            push_chatml(&mut out, "developer", d);
        }
        push_chatml(&mut out, "user", text);
    } else if let Some(items) = input.as_list() {
        if let Some(d) = developer {
            push_chatml(&mut out, "developer", d);
        }
        for item in items {
            // Not an object: no `role`, skipped. A `type` that is not a string counts as absent.
            let is_message = item
                .field("type")
                .and_then(JsonView::as_text)
                .is_none_or(|t| t.is_empty() || t == "message");
            let role = match item.field("role").and_then(JsonView::as_text) {
                Some(r) if !r.is_empty() => r,
                _ => continue,
            };
            if !is_message {
                continue;
            }
            if let Some(content) = item.field("content").and_then(parse_content) {
                push_chatml(&mut out, role, &content);
            }
        }
    } else {
        return Err(NoPrompt::InputNotStringOrList);
    }
    Ok(out)
}

/// Kthena's content parser: a string, or the `\n`-joined text of the kept parts of a list.
fn parse_content<J: JsonView>(content: &J) -> Option<std::borrow::Cow<'_, str>> {
    if let Some(s) = content.as_text() {
        return Some(std::borrow::Cow::Borrowed(s));
    }
    let parts = content.as_list()?;
    let mut kept = parts.iter().filter_map(text_of_part);
    let first = kept.next()?;
    let mut joined = String::from(first);
    for text in kept {
        joined.push('\n');
        joined.push_str(text);
    }
    Some(std::borrow::Cow::Owned(joined))
}

fn text_of_part<J: JsonView>(part: &J) -> Option<&str> {
    // Not an object: no `text`, dropped. A `type` that is not a string counts as absent.
    let textual = part
        .field("type")
        .and_then(JsonView::as_text)
        .is_none_or(|t| matches!(t, "text" | "input_text" | "output_text"));
    part.field("text")
        .and_then(JsonView::as_text)
        .filter(|_| textual)
}

fn push_chatml(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

#[cfg(test)]
mod tests;
