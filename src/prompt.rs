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
//! - Messages render as ChatML, `<|im_start|>{role}\n{content}<|im_end|>\n`, with no trailing
//!   assistant header.

use serde_json::{Map, Value};
use thiserror::Error;

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

/// Renders the prompt of a request body (a JSON object) following Kthena's precedence.
pub fn render(body: &Map<String, Value>) -> Result<String, NoPrompt> {
    if let Some(prompt) = body.get("prompt") {
        return match prompt {
            Value::String(s) => Ok(s.clone()),
            _ => Err(NoPrompt::PromptNotString),
        };
    }
    if let Some(messages) = body.get("messages") {
        let Value::Array(messages) = messages else {
            return Err(NoPrompt::MessagesNotList);
        };
        return Ok(render_chat(body.get("system"), messages));
    }
    if let Some(input) = body.get("input") {
        return render_responses(body.get("instructions"), input);
    }
    Err(NoPrompt::NoPromptField)
}

/// [`render`] of a body the caller no longer needs: a string `prompt` is moved out, not copied.
pub fn render_owned(mut body: Map<String, Value>) -> Result<String, NoPrompt> {
    if let Some(Value::String(prompt)) = body.get_mut("prompt") {
        return Ok(std::mem::take(prompt));
    }
    render(&body)
}

fn render_chat(system: Option<&Value>, messages: &[Value]) -> String {
    let mut out = String::new();
    if let Some(content) = system.and_then(parse_content) {
        push_chatml(&mut out, "system", &content);
    }
    for message in messages {
        let Value::Object(message) = message else {
            continue;
        };
        let Some(Value::String(role)) = message.get("role") else {
            continue;
        };
        if let Some(content) = message.get("content").and_then(parse_content) {
            push_chatml(&mut out, role, &content);
        }
    }
    out
}

fn render_responses(instructions: Option<&Value>, input: &Value) -> Result<String, NoPrompt> {
    let mut out = String::new();
    let developer = match instructions {
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_str()),
        _ => None,
    };
    match input {
        Value::String(text) => {
            if let Some(d) = developer {
                push_chatml(&mut out, "developer", d);
            }
            push_chatml(&mut out, "user", text);
        }
        Value::Array(items) => {
            if let Some(d) = developer {
                push_chatml(&mut out, "developer", d);
            }
            for item in items {
                let Value::Object(item) = item else { continue };
                let is_message = match item.get("type") {
                    None => true,
                    Some(Value::String(t)) => t.is_empty() || t == "message",
                    Some(_) => false,
                };
                let role = match item.get("role") {
                    Some(Value::String(r)) if !r.is_empty() => r,
                    _ => continue,
                };
                if !is_message {
                    continue;
                }
                if let Some(content) = item.get("content").and_then(parse_content) {
                    push_chatml(&mut out, role, &content);
                }
            }
        }
        _ => return Err(NoPrompt::InputNotStringOrList),
    }
    Ok(out)
}

/// Kthena's content parser: a string, or the `\n`-joined text of the kept parts of a list.
fn parse_content(content: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match content {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Value::Array(parts) => {
            let mut kept = parts.iter().filter_map(text_of_part);
            let first = kept.next()?;
            let mut joined = String::from(first);
            for text in kept {
                joined.push('\n');
                joined.push_str(text);
            }
            Some(std::borrow::Cow::Owned(joined))
        }
        _ => None,
    }
}

fn text_of_part(part: &Value) -> Option<&str> {
    let Value::Object(part) = part else {
        return None;
    };
    let textual = match part.get("type") {
        None => true,
        Some(Value::String(t)) => matches!(t.as_str(), "text" | "input_text" | "output_text"),
        Some(_) => false,
    };
    match part.get("text") {
        Some(Value::String(text)) if textual => Some(text),
        _ => None,
    }
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
