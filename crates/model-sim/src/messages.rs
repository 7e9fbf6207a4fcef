//! Anthropic's Messages API (`POST /v1/messages`) as vLLM's Anthropic endpoint answers it: the
//! request is served as the chat request vLLM turns it into
//! ([`prefix_picker::prompt::messages`]), so it hits the same cached blocks as that chat request;
//! the answer is a `message` (JSON) or Anthropic's event stream (`message_start`,
//! `content_block_start`, `content_block_delta`s, `content_block_stop`, `message_delta` with the
//! usage, `message_stop`).
//!
//! With `tools` (and a `tool_choice` other than `none`) a request whose last message carries no
//! `tool_result` is answered with one `tool_use` block calling the first tool: its input is the
//! tool's first `input_schema` property (or `input`) set to the generated words, streamed as
//! `input_json_delta`s; `stop_reason: tool_use`. Anything else is answered with text, `stop_reason:
//! max_tokens` (the output is always `max_tokens` long). Usage follows Anthropic's accounting:
//! `input_tokens` are the prompt tokens not read from the cache, `cache_read_input_tokens` the
//! ones that were (the engine's prefix-cache hit), `cache_creation_input_tokens` 0.

use serde_json::{Value, json};

use prefix_picker::prompt::messages::{canonical_arguments, chat_form, chat_tools};

/// The chat request vLLM serves a Messages request `body` as (model, messages, tools, limits).
pub fn chat_body(body: &Value) -> Value {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(|m| chat_form(body.get("system"), m, canonical_arguments));
    let mut chat = json!({"messages": messages});
    for key in ["model", "max_tokens", "stream"] {
        if let Some(v) = body.get(key) {
            chat[key] = v.clone();
        }
    }
    if let Some(tools) = chat_tools(body.get("tools")) {
        chat["tools"] = tools;
    }
    chat
}

/// The tool call a request is answered with (see the module header), if any: the tool's name
/// and the input's key.
pub fn tool_call(body: &Value) -> Option<(String, String)> {
    if body.pointer("/tool_choice/type").and_then(Value::as_str) == Some("none") {
        return None;
    }
    let last = body.get("messages")?.as_array()?.last()?;
    let answered = last
        .get("content")
        .and_then(Value::as_array)
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
    if answered {
        return None;
    }
    let tool = body.get("tools")?.as_array()?.first()?;
    let name = tool.get("name")?.as_str()?.to_string();
    let key = tool
        .pointer("/input_schema/properties")
        .and_then(Value::as_object)
        .and_then(|p| p.keys().next().cloned())
        .unwrap_or_else(|| "input".into());
    Some((name, key))
}

/// Anthropic's usage: `prompt` tokens of which `cached` were read from the cache.
pub fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    })
}

/// What an answer is: text, or a call to a tool.
pub enum Answer {
    Text,
    /// The tool's name, the input's key and the call's id.
    ToolUse {
        name: String,
        key: String,
        id: String,
    },
}

impl Answer {
    pub fn stop_reason(&self) -> &'static str {
        match self {
            Answer::Text => "max_tokens",
            Answer::ToolUse { .. } => "tool_use",
        }
    }

    /// The content block, whole (`text`: the output).
    pub fn block(&self, text: &str) -> Value {
        match self {
            Answer::Text => json!({"type": "text", "text": text}),
            Answer::ToolUse { name, key, id } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": {key.as_str(): text}})
            }
        }
    }

    /// The content block as `content_block_start` opens it.
    fn opened(&self) -> Value {
        match self {
            Answer::Text => json!({"type": "text", "text": ""}),
            Answer::ToolUse { name, id, .. } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": {}})
            }
        }
    }

    /// The delta of output token `i` (of `n`) whose text is `piece`.
    fn delta(&self, piece: &str, i: usize, n: usize) -> Value {
        match self {
            Answer::Text => json!({"type": "text_delta", "text": piece}),
            Answer::ToolUse { key, .. } => {
                let mut json = String::new();
                if i == 0 {
                    json.push_str(&format!("{{{}: \"", Value::from(key.as_str())));
                }
                // The piece as a JSON string's inside.
                let quoted = Value::from(piece).to_string();
                json.push_str(&quoted[1..quoted.len() - 1]);
                if i + 1 == n {
                    json.push_str("\"}");
                }
                json!({"type": "input_json_delta", "partial_json": json})
            }
        }
    }
}

/// One server-sent event.
pub fn event(kind: &str, data: &Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

/// The events of output token `i` of `n` (`piece` its text): the message's and the block's
/// start before the first, its delta, the block's stop, the usage and the end after the last.
pub fn token_events(
    answer: &Answer,
    message: &Value,
    usage: &Value,
    piece: &str,
    i: usize,
    n: usize,
) -> String {
    let mut out = String::new();
    if i == 0 {
        out.push_str(&event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
        out.push_str(&event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                "content_block": answer.opened()}),
        ));
    }
    out.push_str(&event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0,
            "delta": answer.delta(piece, i, n)}),
    ));
    if i + 1 == n {
        out.push_str(&event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ));
        out.push_str(&event(
            "message_delta",
            &json!({"type": "message_delta",
                "delta": {"stop_reason": answer.stop_reason(), "stop_sequence": null},
                "usage": usage}),
        ));
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_with_tools_is_answered_with_a_call_until_the_result_comes_back() {
        let tools = json!([{"name": "get_weather", "input_schema": {"type": "object",
            "properties": {"city": {"type": "string"}}}}]);
        let ask = json!({"tools": tools, "messages": [{"role": "user", "content": "Paris?"}]});
        assert_eq!(tool_call(&ask), Some(("get_weather".into(), "city".into())));
        let answered = json!({"tools": tools, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": "sunny"}]}]});
        assert_eq!(tool_call(&answered), None);
        let mut none = ask.clone();
        none["tool_choice"] = json!({"type": "none"});
        assert_eq!(tool_call(&none), None);
        assert_eq!(tool_call(&json!({"messages": []})), None);
    }

    #[test]
    fn streamed_tool_input_is_the_whole_input() {
        let answer = Answer::ToolUse {
            name: "w".into(),
            key: "city".into(),
            id: "toolu_1".into(),
        };
        let pieces = ["the", " \"quoted\"", " end"];
        let json: String = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                answer.delta(p, i, pieces.len())["partial_json"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let input: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(input, json!({"city": "the \"quoted\" end"}));
        assert_eq!(answer.block("x")["input"], json!({"city": "x"}));
    }

    #[test]
    fn the_chat_body_is_what_vllm_serves() {
        let body = json!({"model": "m", "max_tokens": 3, "stream": true, "system": "s",
            "metadata": {"user_id": "u"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]});
        assert_eq!(
            chat_body(&body),
            json!({"model": "m", "max_tokens": 3, "stream": true, "messages": [
                {"role": "system", "content": "s"}, {"role": "user", "content": "q"}]})
        );
    }
}
