//! The affinity mode's rendering of a Messages body, straight from the body: the bytes
//! [`super::chat_form`] then the chat renderer give (the reference it is tested against), without
//! building the chat form as a `Value` tree (a 64 KiB agent body spent half its request path
//! there). Each chat message of the form is written where the form would put it: a user
//! message's tool results first, as `tool` messages, then the message itself; a part other than
//! text is its `<|part:{type}:{digest}|>` marker, the digest taken over the canonical JSON the
//! form's part would have, written here directly.

use std::fmt::Write as _;

use xxhash_rust::xxh3::xxh3_64;

use super::{BILLING_HEADER, block_type, canonical_arguments, role, truthy};
use crate::prompt::JsonView;

/// The prompt of a Messages body's `tools`, `system` and `messages` in the affinity mode.
pub fn render<J: JsonView>(tools: Option<&J>, system: Option<&J>, messages: &[J]) -> String {
    let mut out = String::with_capacity(super::super::chat_len_bound(system, messages) + 32);
    push_tools(&mut out, tools);
    push_system(&mut out, system, messages);
    for message in messages {
        let Some(role) = role(message) else { continue };
        if role == "system" {
            continue;
        }
        let Some(content) = message.field("content") else {
            continue;
        };
        if let Some(text) = content.as_text() {
            push_text_message(&mut out, role, text);
        } else if let Some(blocks) = content.as_list() {
            if role == "user" {
                for block in blocks {
                    if block_type(block) == Some("tool_result") {
                        push_tool_result(&mut out, block);
                    }
                }
            }
            push_blocks(&mut out, role, blocks);
        }
    }
    out
}

fn push_text_message(out: &mut String, role: &str, text: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(text);
    out.push_str("<|im_end|>\n");
}

/// The tools line over the canonical JSON of the tools' chat form.
fn push_tools<J: JsonView>(out: &mut String, tools: Option<&J>) {
    let Some(tools) = tools.and_then(JsonView::as_list) else {
        return;
    };
    let mut bytes = b"[".to_vec();
    let mut any = false;
    for tool in tools {
        let Some(name) = tool.field("name") else {
            continue;
        };
        if any {
            bytes.push(b',');
        }
        any = true;
        bytes.extend_from_slice(br#"{"function":{"#);
        if let Some(description) = tool.field("description") {
            bytes.extend_from_slice(br#""description":"#);
            let _ = description.write_canonical(&mut bytes);
            bytes.push(b',');
        }
        bytes.extend_from_slice(br#""name":"#);
        let _ = name.write_canonical(&mut bytes);
        if let Some(schema) = tool.field("input_schema") {
            bytes.extend_from_slice(br#","parameters":"#);
            let _ = schema.write_canonical(&mut bytes);
        }
        bytes.extend_from_slice(br#"},"type":"function"}"#);
    }
    bytes.push(b']');
    if any {
        let _ = writeln!(out, "<|tools:{:016x}|>", xxh3_64(&bytes));
    }
}

fn push_system<J: JsonView>(out: &mut String, system: Option<&J>, messages: &[J]) {
    let start = out.len();
    out.push_str("<|im_start|>system\n");
    let header = out.len();
    let mut any = false;
    let mut texts_of = |out: &mut String, content: &J, top_level: bool| {
        if let Some(text) = content.as_text() {
            if !(top_level && text.is_empty()) {
                out.push_str(text);
                any = true;
            }
        } else if let Some(blocks) = content.as_list() {
            for block in blocks {
                if block_type(block) == Some("text")
                    && let Some(text) = block.field("text").and_then(JsonView::as_text)
                    && !text.is_empty()
                    && !text.starts_with(BILLING_HEADER)
                {
                    out.push_str(text);
                    any = true;
                }
            }
        }
    };
    if let Some(system) = system {
        texts_of(out, system, true);
    }
    for message in messages {
        if role(message) == Some("system")
            && let Some(content) = message.field("content")
        {
            texts_of(out, content, false);
        }
    }
    if any {
        out.push_str("<|im_end|>\n");
    } else {
        debug_assert_eq!(out.len(), header);
        out.truncate(start);
    }
}

/// A message's own blocks: its content parts, then its tool calls; nothing when it has neither
/// (a user message with no content is dropped by the form, an empty assistant one renders
/// nothing).
fn push_blocks<J: JsonView>(out: &mut String, role: &str, blocks: &[J]) {
    let start = out.len();
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    let mut parts = 0;
    let mut separate = |out: &mut String| {
        if parts > 0 {
            out.push('\n');
        }
        parts += 1;
    };
    for block in blocks {
        match block_type(block) {
            Some("text") => {
                if let Some(text) = block.field("text").and_then(JsonView::as_text)
                    && !text.is_empty()
                {
                    separate(out);
                    out.push_str(text);
                }
            }
            Some("image") => {
                if let Some(source) = block.field("source") {
                    separate(out);
                    push_image(out, source);
                }
            }
            Some("document") => {
                separate(out);
                let mut bytes = Vec::new();
                let _ = block.write_canonical(&mut bytes);
                let _ = write!(out, "<|part:document:{:016x}|>", xxh3_64(&bytes));
            }
            Some("tool_result") if role != "user" => {
                separate(out);
                out.push_str("Tool result: ");
                match block.field("content") {
                    Some(c) if c.as_text().is_some() => out.push_str(c.as_text().unwrap_or("")),
                    Some(c) if truthy(c) => out.push_str(&canonical_arguments(c)),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let mut calls = 0;
    for block in blocks {
        if block_type(block) == Some("tool_use") {
            let name = block
                .field("name")
                .and_then(JsonView::as_text)
                .unwrap_or("");
            out.push_str("<|tool_call:");
            out.push_str(name);
            out.push_str("|>");
            match block.field("input") {
                Some(input) if truthy(input) => out.push_str(&canonical_arguments(input)),
                _ => out.push_str("{}"),
            }
            calls += 1;
        }
    }
    let dropped = role == "user" && parts == 0;
    if dropped || parts + calls == 0 {
        out.truncate(start);
    } else {
        out.push_str("<|im_end|>\n");
    }
}

/// An image source's `image_url` part marker.
fn push_image<J: JsonView>(out: &mut String, source: &J) {
    let url = super::image_url(source);
    let mut bytes = br#"{"image_url":{"url":"#.to_vec();
    let _ = serde_json::to_writer(&mut bytes, &url);
    bytes.extend_from_slice(br#"},"type":"image_url"}"#);
    let _ = write!(out, "<|part:image_url:{:016x}|>", xxh3_64(&bytes));
}

/// A user's `tool_result`: its `tool` message, then its images and tool references.
fn push_tool_result<J: JsonView>(out: &mut String, block: &J) {
    let id = block
        .field("tool_use_id")
        .and_then(JsonView::as_text)
        .unwrap_or("");
    out.push_str("<|im_start|>tool\n<|tool_call_id:");
    out.push_str(id);
    out.push_str("|>");
    let content = block.field("content");
    let items = match content.and_then(JsonView::as_text) {
        Some(text) => {
            out.push_str(text);
            &[][..]
        }
        None => content.and_then(JsonView::as_list).unwrap_or_default(),
    };
    let mut first = true;
    for item in items {
        if block_type(item) == Some("text") {
            if !first {
                out.push('\n');
            }
            first = false;
            out.push_str(item.field("text").and_then(JsonView::as_text).unwrap_or(""));
        }
    }
    out.push_str("<|im_end|>\n");
    let images: Vec<&J> = items
        .iter()
        .filter(|i| block_type(*i) == Some("image"))
        .filter_map(|i| i.field("source"))
        .collect();
    if !images.is_empty() {
        out.push_str("<|im_start|>user\n");
        for (i, source) in images.into_iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            push_image(out, source);
        }
        out.push_str("<|im_end|>\n");
    }
    let references: Vec<&str> = items
        .iter()
        .filter(|i| block_type(*i) == Some("tool_reference"))
        .filter_map(|i| {
            ["tool_name", "name"]
                .iter()
                .find_map(|k| i.field(k).and_then(JsonView::as_text))
                .filter(|n| !n.is_empty())
        })
        .collect();
    if !references.is_empty() {
        out.push_str("<|im_start|>tool\n<|tool_call_id:");
        out.push_str(id);
        out.push_str("|>");
        for (i, name) in references.into_iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let mut bytes = br#"{"name":"#.to_vec();
            let _ = serde_json::to_writer(&mut bytes, name);
            bytes.extend_from_slice(br#","type":"tool_reference"}"#);
            let _ = write!(out, "<|part:tool_reference:{:016x}|>", xxh3_64(&bytes));
        }
        out.push_str("<|im_end|>\n");
    }
}
