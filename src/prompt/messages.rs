//! Anthropic Messages requests in their chat form, as vLLM serves them. vLLM's `/v1/messages`
//! turns the request into a chat-completions request, then applies the chat template to that
//! (`_convert_anthropic_to_openai_request` and the `_convert_*` methods it calls, in
//! `vllm/entrypoints/anthropic/serving.py`, vllm-project/vllm at 0001948b), so the engine's prompt,
//! and what its KV cache holds, is that chat request's. The mapping, as read there:
//!
//! - `system` (a string, or text blocks) and the text of any `role: system` message join, with no
//!   separator, into one leading `system` message; a text block that starts with
//!   `x-anthropic-billing-header` is dropped (Claude Code's per-request attribution line).
//! - A message's string content is kept. Of its blocks, `text` (non-empty) and `image` (a `url`
//!   source's URL, else `data:{media_type};base64,{data}`, as an `image_url` part) are content
//!   parts, and one text part alone becomes the content string; `tool_use` becomes a tool call
//!   (`id`, `name`, the `input` as JSON text); `thinking` joins the message's `reasoning`;
//!   `redacted_thinking` and `tool_reference` are dropped. A `tool_result` in a user message
//!   becomes a `tool` message (`tool_call_id`, its text parts `\n`-joined) placed before that
//!   user message, then a user message of its images and a `tool` message of its tool references
//!   when it has any; in an assistant message it is the text part `Tool result: {content}`. A user
//!   message left with no content is dropped; an assistant message is kept.
//! - `tools` become functions: `name`, `description`, `parameters` (the `input_schema`).
//! - `tool_choice`, `metadata`, `cache_control`, `is_error` and the sampling fields do not reach
//!   the prompt.
//!
//! Where a router cannot do what the source does: a `tool_use` without an `id` gets `""` (vLLM:
//! `call_{unix time}`); an assistant's non-string `tool_result` content is its canonical JSON
//! (vLLM: Python's `str()` of the list); a `document` block, which vLLM's request model refuses
//! (400, so nothing is recorded), is kept as a content part so that documents differ; a message or
//! block that is not an object with the fields above is skipped (vLLM: 400). How the `input` is
//! written is the caller's: [`canonical_arguments`] for the affinity mode's hashing, Python's
//! `json.dumps` for engine truth (the engine's own text).

use serde_json::{Map, Value, json};

use super::JsonView;

pub(super) mod render;

/// The prefix of Claude Code's per-request attribution block, which vLLM drops from `system`.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The chat messages vLLM serves a Messages request as (see the module header). `arguments`
/// writes a `tool_use` block's `input` as the tool call's `arguments` text.
pub fn chat_form<J: JsonView>(
    system: Option<&J>,
    messages: &[J],
    arguments: impl Fn(&J) -> String,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    push_system(&mut out, system, messages);
    for message in messages {
        let Some(role) = role(message) else { continue };
        if role == "system" {
            continue;
        }
        let Some(content) = message.field("content") else {
            continue;
        };
        let mut chat = Map::new();
        chat.insert("role".into(), Value::from(role));
        if let Some(text) = content.as_text() {
            chat.insert("content".into(), Value::from(text));
        } else if let Some(blocks) = content.as_list() {
            convert_blocks(role, blocks, &mut chat, &mut out, &arguments);
        } else {
            continue;
        }
        // A user message left with no content (only tool results) is dropped.
        if role != "user" || chat.contains_key("content") {
            out.push(Value::Object(chat));
        }
    }
    out
}

/// The chat form of `tools`, when it is a list: one function per tool object.
pub fn chat_tools<J: JsonView>(tools: Option<&J>) -> Option<Value> {
    let tools = tools?.as_list()?;
    let converted = tools
        .iter()
        .filter_map(|tool| {
            let name = tool.field("name")?;
            let mut function = Map::new();
            function.insert("name".into(), to_value(name));
            if let Some(description) = tool.field("description") {
                function.insert("description".into(), to_value(description));
            }
            if let Some(schema) = tool.field("input_schema") {
                function.insert("parameters".into(), to_value(schema));
            }
            Some(json!({"type": "function", "function": Value::Object(function)}))
        })
        .collect();
    Some(Value::Array(converted))
}

/// A `tool_use` input as the affinity mode hashes it: its canonical JSON (keys sorted, compact),
/// equal through either request parser.
pub fn canonical_arguments<J: JsonView>(input: &J) -> String {
    let mut bytes = Vec::new();
    // Writing into a `Vec` cannot fail.
    let _ = input.write_canonical(&mut bytes);
    String::from_utf8(bytes).unwrap_or_default()
}

/// A message's role, as vLLM's request model reads it (`ctx` and `msg`, sent by recent Claude
/// Code versions, are `user`); `None` for a role it refuses.
fn role<J: JsonView>(message: &J) -> Option<&'static str> {
    match message.field("role")?.as_text()? {
        "user" | "ctx" | "msg" => Some("user"),
        "assistant" => Some("assistant"),
        "system" => Some("system"),
        _ => None,
    }
}

/// The leading system message: `system` and the `role: system` messages' text, joined.
fn push_system<J: JsonView>(out: &mut Vec<Value>, system: Option<&J>, messages: &[J]) {
    fn texts_of<'j, J: JsonView>(parts: &mut Vec<&'j str>, content: &'j J, top_level: bool) {
        if let Some(text) = content.as_text() {
            // `if anthropic_request.system:`: an empty top-level string adds nothing.
            if !(top_level && text.is_empty()) {
                parts.push(text);
            }
        } else if let Some(blocks) = content.as_list() {
            for block in blocks {
                if block_type(block) == Some("text")
                    && let Some(text) = block.field("text").and_then(JsonView::as_text)
                    && !text.is_empty()
                    && !text.starts_with(BILLING_HEADER)
                {
                    parts.push(text);
                }
            }
        }
    }
    let mut parts: Vec<&str> = Vec::new();
    if let Some(system) = system {
        texts_of(&mut parts, system, true);
    }
    for message in messages {
        if role(message) == Some("system")
            && let Some(content) = message.field("content")
        {
            texts_of(&mut parts, content, false);
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "system", "content": parts.concat()}));
    }
}

fn block_type<J: JsonView>(block: &J) -> Option<&str> {
    block.field("type")?.as_text()
}

/// A message's blocks into `chat` (content, tool calls, reasoning); a user message's tool
/// results go to `out` before it.
fn convert_blocks<J: JsonView>(
    role: &str,
    blocks: &[J],
    chat: &mut Map<String, Value>,
    out: &mut Vec<Value>,
    arguments: &impl Fn(&J) -> String,
) {
    let mut parts: Vec<Value> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut reasoning = String::new();
    let mut has_reasoning = false;
    for block in blocks {
        match block_type(block) {
            Some("text") => {
                if let Some(text) = block.field("text").and_then(JsonView::as_text)
                    && !text.is_empty()
                {
                    parts.push(json!({"type": "text", "text": text}));
                }
            }
            Some("image") => {
                if let Some(source) = block.field("source") {
                    parts.push(image_part(source));
                }
            }
            Some("document") => parts.push(to_value(block)),
            Some("thinking") => {
                if let Some(text) = block.field("thinking").and_then(JsonView::as_text) {
                    reasoning.push_str(text);
                    has_reasoning = true;
                }
            }
            Some("tool_use") => calls.push(tool_call(block, arguments)),
            Some("tool_result") if role == "user" => push_tool_result(block, out),
            Some("tool_result") => {
                let text = match block.field("content") {
                    Some(c) if c.as_text().is_some() => c.as_text().unwrap_or_default().into(),
                    Some(c) if truthy(c) => canonical_arguments(c),
                    _ => String::new(),
                };
                parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
            }
            // `redacted_thinking`, `tool_reference`; anything else vLLM refuses.
            _ => {}
        }
    }
    if has_reasoning {
        chat.insert("reasoning".into(), Value::from(reasoning));
    }
    if !calls.is_empty() {
        chat.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_slice() {
        [] => {}
        [one] if one["type"] == "text" => {
            chat.insert("content".into(), one["text"].clone());
        }
        _ => {
            chat.insert("content".into(), Value::Array(parts));
        }
    }
}

/// Python's truth of a JSON value (`if block.content`): not null, `""`, `[]` or `{}`.
fn truthy<J: JsonView>(value: &J) -> bool {
    match (value.as_text(), value.as_list()) {
        (Some(text), _) => !text.is_empty(),
        (_, Some(list)) => !list.is_empty(),
        _ => !matches!(canonical_arguments(value).as_str(), "null" | "{}" | "false"),
    }
}

/// An image source as an `image_url` part.
fn image_part<J: JsonView>(source: &J) -> Value {
    json!({"type": "image_url", "image_url": {"url": image_url(source)}})
}

fn image_url<J: JsonView>(source: &J) -> String {
    let text = |key: &str| source.field(key).and_then(JsonView::as_text);
    if text("type") == Some("url") {
        return text("url").unwrap_or_default().to_string();
    }
    let media_type = text("media_type").unwrap_or("image/jpeg");
    let data = text("data").unwrap_or_default();
    format!("data:{media_type};base64,{data}")
}

fn tool_call<J: JsonView>(block: &J, arguments: &impl Fn(&J) -> String) -> Value {
    let text = |key: &str| block.field(key).and_then(JsonView::as_text).unwrap_or("");
    let arguments = match block.field("input") {
        Some(input) if truthy(input) => arguments(input),
        _ => "{}".to_string(),
    };
    json!({
        "id": text("id"),
        "type": "function",
        "function": {"name": text("name"), "arguments": arguments},
    })
}

/// A user's `tool_result`: its `tool` message, then its images and tool references.
fn push_tool_result<J: JsonView>(block: &J, out: &mut Vec<Value>) {
    let mut texts: Vec<&str> = Vec::new();
    let mut images: Vec<Value> = Vec::new();
    let mut references: Vec<Value> = Vec::new();
    let content = block.field("content");
    let tool_text = match content.and_then(JsonView::as_text) {
        Some(text) => text.to_string(),
        None => {
            for item in content.and_then(JsonView::as_list).unwrap_or_default() {
                match block_type(item) {
                    Some("text") => {
                        texts.push(item.field("text").and_then(JsonView::as_text).unwrap_or(""));
                    }
                    Some("image") => {
                        if let Some(source) = item.field("source") {
                            images.push(image_part(source));
                        }
                    }
                    Some("tool_reference") => {
                        let name = ["tool_name", "name"]
                            .iter()
                            .find_map(|k| item.field(k).and_then(JsonView::as_text))
                            .filter(|n| !n.is_empty());
                        if let Some(name) = name {
                            references.push(json!({"type": "tool_reference", "name": name}));
                        }
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
    };
    let id = block
        .field("tool_use_id")
        .and_then(JsonView::as_text)
        .unwrap_or("");
    out.push(json!({"role": "tool", "tool_call_id": id, "content": tool_text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    if !references.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": references}));
    }
}

/// `value` as a `serde_json::Value` (through its canonical JSON).
fn to_value<J: JsonView>(value: &J) -> Value {
    serde_json::from_str(&canonical_arguments(value)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests;
