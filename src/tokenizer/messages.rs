//! Engine truth for Anthropic Messages requests: the chat request vLLM serves one as
//! ([`crate::prompt::messages`]), written as the JSON text a head is tokenized with, so that the
//! engine's `/tokenize` (or the `file` source's template) renders exactly what the engine
//! rendered when it served the request.
//!
//! The text is the engine's own where it matters to the template: a tool call's `arguments` are
//! the `tool_use` input as vLLM writes it (Python's `json.dumps`, keys in the client's order:
//! [`Json::write_python`]), and each tool is `{"type": "function", "function": {"name",
//! "description", "parameters"}}` with the client's `input_schema` text (templates print tools
//! with `tojson`, key order included). Messages themselves are objects the template reads by key.

use serde_json::Value;

use crate::prompt::JsonView;
use crate::prompt::messages::chat_form;
use crate::request::Json;

/// A Messages body's chat form as JSON text: each chat message, and the tools.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesForm {
    pub messages: Vec<String>,
    /// The `tools` list in chat form (`None` without a `tools` list).
    pub tools: Option<String>,
}

impl MessagesForm {
    /// The chat form of a Messages request body; `None` when it is not JSON or has no
    /// `messages` list.
    pub fn of(body: &[u8]) -> Option<MessagesForm> {
        let body: Json<'_> = serde_json::from_slice(body).ok()?;
        let messages = body.field("messages")?.as_list()?;
        let messages = chat_form(body.field("system"), messages, |input: &Json<'_>| {
            let mut text = String::new();
            input.write_python(&mut text);
            text
        })
        .iter()
        .map(Value::to_string)
        .collect();
        Some(MessagesForm {
            messages,
            tools: body.field("tools").and_then(tools),
        })
    }
}

/// The chat form of a `tools` list (its tools without a `name` dropped, as the rendering does).
fn tools(tools: &Json<'_>) -> Option<String> {
    let mut out = String::from("[");
    for tool in tools.as_list()? {
        let Some(name) = tool.field("name") else {
            continue;
        };
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(r#"{"type":"function","function":{"name":"#);
        name.write_compact(&mut out);
        for (key, field) in [
            ("description", "description"),
            ("parameters", "input_schema"),
        ] {
            if let Some(value) = tool.field(field) {
                out.push_str(&format!(",\"{key}\":"));
                value.write_compact(&mut out);
            }
        }
        out.push_str("}}");
    }
    out.push(']');
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_chat_form_keeps_the_clients_text_where_templates_print_it() {
        let body = br#"{"model":"m","system":"be brief","tools":[{"name":"get_weather",
            "description":"Weather","input_schema":{"type":"object","properties":{"unit":{},
            "city":{}}},"cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"Paris?"},{"role":"assistant","content":[
            {"type":"tool_use","id":"t1","name":"get_weather","input":{"unit":"c","city":"Paris \u00e9"}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}]}"#;
        let form = MessagesForm::of(body).unwrap();
        assert_eq!(
            form.tools.as_deref(),
            Some(
                r#"[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"unit":{},"city":{}}}}}]"#
            )
        );
        assert_eq!(form.messages.len(), 4);
        let call: Value = serde_json::from_str(&form.messages[2]).unwrap();
        assert_eq!(
            call["tool_calls"][0]["function"]["arguments"],
            json!(r#"{"unit": "c", "city": "Paris \u00e9"}"#)
        );
        let head: Value =
            serde_json::from_str(&format!("[{},{}]", form.messages[0], form.messages[1])).unwrap();
        assert_eq!(
            head,
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "Paris?"}])
        );
        assert_eq!(MessagesForm::of(b"{\"messages\":3}"), None);
        assert_eq!(MessagesForm::of(b"not json"), None);
    }
}
