//! The affinity mode's rendering ([`super::Rendering::Engine`]): Kthena's ChatML of the text
//! content, plus what the engine also keys its KV cache on, each in the place the engine puts it,
//! so requests that differ there hash differently from that point on, and requests that agree
//! up to it share their head.
//!
//! - `tools` (a non-empty list, chat or Responses): one line before the first message,
//!   `<|tools:{digest}|>\n`. Chat templates render tool definitions in the system preamble, so
//!   different tools change every block the engine holds. A rendered line, not a chain seed:
//!   everything downstream (block hashing, the index, replica sync, PD, `/debug/explain`,
//!   `prefix-picker render`) already works on the rendered prompt, unchanged; and tools of a few
//!   KB cost 25 bytes of prompt, so the block layout barely moves.
//! - A message: `<|im_start|>{role}\n`, then `<|tool_call_id:{id}|>` (a `tool` message's
//!   `tool_call_id`), then its content, then each of its `tool_calls` as
//!   `<|tool_call:{name}|>{arguments}` (the function's name and its arguments as sent; a call
//!   without a `function` object as `<|tool_call:#{digest}|>`), then `<|im_end|>\n`. A message
//!   with none of these is skipped, as Kthena skips one whose content does not parse; an
//!   assistant turn with `content: null` and tool calls is rendered. Arguments are rendered, not
//!   digested: the engine prefills them, and a follow-up resends them unchanged.
//! - Content: a string as is; a list renders its parts in order, `\n`-joined: text parts as
//!   Kthena keeps them, any other object part with a string `type` (`image_url`, `input_audio`,
//!   `file`, `input_image`, ...) as `<|part:{type}:{digest}|>`. Engines key multimodal inputs by
//!   their content; the digest does the same for the part as sent (the same image sent by URL
//!   and inline differs here, as it may on the engine).
//! - Responses `input` items that are not messages (`function_call`, `function_call_output`,
//!   `reasoning`, ...): `<|item:{type}:{digest}|>\n` in place.
//!
//! A digest is the xxh3-64 of the value's canonical JSON ([`JsonView::write_canonical`]: keys
//! sorted, the last of duplicates, compact) in 16 hex digits: key order and whitespace do not
//! matter, any other change does. A request with none of the above (text-only chat) renders
//! exactly as in Kthena's mode. The markers are not the engine's own tokens: what matters is that
//! equal inputs render equal and different ones differ in place.

use xxhash_rust::xxh3::xxh3_64;

use super::{JsonView, NoPrompt, chat_len_bound, push_chatml, text_of_part};

/// Bytes of the tools line.
const TOOLS_LINE: usize = "<|tools:0123456789abcdef|>\n".len();

pub(super) fn render_chat<J: JsonView>(
    tools: Option<&J>,
    system: Option<&J>,
    messages: &[J],
) -> String {
    let mut out = String::with_capacity(chat_len_bound(system, messages) + TOOLS_LINE);
    push_tools(&mut out, tools);
    if let Some(system) = system {
        push_message(&mut out, "system", Some(system), None);
    }
    for message in messages {
        // Not an object, or a role that is not a string: skipped.
        let Some(role) = message.field("role").and_then(JsonView::as_text) else {
            continue;
        };
        push_message(&mut out, role, message.field("content"), Some(message));
    }
    out
}

pub(super) fn render_responses<J: JsonView>(
    tools: Option<&J>,
    instructions: Option<&J>,
    input: &J,
) -> Result<String, NoPrompt> {
    let mut out = String::new();
    let developer = instructions
        .and_then(JsonView::as_text)
        .filter(|s| !s.is_empty());
    if let Some(text) = input.as_text() {
        push_tools(&mut out, tools);
        if let Some(d) = developer {
            push_chatml(&mut out, "developer", d);
        }
        push_chatml(&mut out, "user", text);
    } else if let Some(items) = input.as_list() {
        push_tools(&mut out, tools);
        if let Some(d) = developer {
            push_chatml(&mut out, "developer", d);
        }
        for item in items {
            // A `type` that is not a string counts as absent, as in Kthena's mode.
            let kind = item.field("type").and_then(JsonView::as_text);
            let is_message = matches!(kind, None | Some("" | "message"));
            match item.field("role").and_then(JsonView::as_text) {
                Some(role) if is_message && !role.is_empty() => {
                    push_message(&mut out, role, item.field("content"), None);
                }
                // Kthena skips it: the engine sees it (a tool call or its output, reasoning).
                _ if !is_message => {
                    if let Some(kind) = kind {
                        push_marker(&mut out, "<|item:", kind, item);
                        out.push('\n');
                    }
                }
                _ => {}
            }
        }
    } else {
        return Err(NoPrompt::InputNotStringOrList);
    }
    Ok(out)
}

/// The tools line, when `tools` is a non-empty list (`[]` is the engine's "no tools").
fn push_tools<J: JsonView>(out: &mut String, tools: Option<&J>) {
    if let Some(tools) = tools.filter(|t| t.as_list().is_some_and(|l| !l.is_empty())) {
        out.push_str("<|tools:");
        push_hex(out, digest(tools));
        out.push_str("|>\n");
    }
}

/// One message (see the module header); `message` is where its tool fields are read (chat).
fn push_message<J: JsonView>(
    out: &mut String,
    role: &str,
    content: Option<&J>,
    message: Option<&J>,
) {
    let start = out.len();
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    let mut rendered = false;
    if let Some(id) = message
        .and_then(|m| m.field("tool_call_id"))
        .and_then(JsonView::as_text)
    {
        out.push_str("<|tool_call_id:");
        out.push_str(id);
        out.push_str("|>");
        rendered = true;
    }
    if let Some(content) = content {
        rendered |= push_content(out, content);
    }
    if let Some(calls) = message
        .and_then(|m| m.field("tool_calls"))
        .and_then(JsonView::as_list)
    {
        for call in calls {
            push_tool_call(out, call);
            rendered = true;
        }
    }
    if rendered {
        out.push_str("<|im_end|>\n");
    } else {
        out.truncate(start);
    }
}

/// A message's content; false when there is nothing to render (Kthena: it does not parse).
fn push_content<J: JsonView>(out: &mut String, content: &J) -> bool {
    if let Some(text) = content.as_text() {
        out.push_str(text);
        return true;
    }
    let Some(parts) = content.as_list() else {
        return false;
    };
    let mut kept = false;
    for part in parts {
        let start = out.len();
        if kept {
            out.push('\n');
        }
        if let Some(text) = text_of_part(part) {
            out.push_str(text);
        } else if let Some(kind) = part.field("type").and_then(JsonView::as_text)
            && !matches!(kind, "text" | "input_text" | "output_text")
        {
            push_marker(out, "<|part:", kind, part);
        } else {
            // Not an object, or a text part without a string `text`: dropped, as by Kthena.
            out.truncate(start);
            continue;
        }
        kept = true;
    }
    kept
}

/// One entry of `tool_calls`.
fn push_tool_call<J: JsonView>(out: &mut String, call: &J) {
    let Some(function) = call.field("function") else {
        out.push_str("<|tool_call:#");
        push_hex(out, digest(call));
        out.push_str("|>");
        return;
    };
    out.push_str("<|tool_call:");
    if let Some(name) = function.field("name").and_then(JsonView::as_text) {
        out.push_str(name);
    }
    out.push_str("|>");
    if let Some(args) = function.field("arguments") {
        match args.as_text() {
            Some(text) => out.push_str(text),
            // Some clients send the arguments as an object: its canonical JSON.
            None => {
                let mut bytes = Vec::new();
                if args.write_canonical(&mut bytes).is_ok() {
                    out.push_str(&String::from_utf8_lossy(&bytes));
                }
            }
        }
    }
}

/// `{open}{kind}:{digest of value}|>`.
fn push_marker<J: JsonView>(out: &mut String, open: &str, kind: &str, value: &J) {
    out.push_str(open);
    out.push_str(kind);
    out.push(':');
    push_hex(out, digest(value));
    out.push_str("|>");
}

/// The xxh3-64 of `value`'s canonical JSON.
pub(crate) fn digest<J: JsonView>(value: &J) -> u64 {
    // Written out whole, then hashed in one pass: the canonical writer makes many small writes
    // (a key, a quote, a comma), each a fixed cost for a streaming hasher.
    let mut bytes = Vec::new();
    // Writing into a `Vec` cannot fail.
    let _ = value.write_canonical(&mut bytes);
    xxh3_64(&bytes)
}

fn push_hex(out: &mut String, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(char::from(HEX[(n >> (shift * 4)) as usize & 0xf]));
    }
}

#[cfg(test)]
mod tests;
