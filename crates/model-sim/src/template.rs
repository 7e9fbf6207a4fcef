//! The engine's chat template: how a chat or Responses request becomes the prompt the sim caches,
//! answers `/tokenize` (chat form) and `/render` with, and how an answer continues it.
//!
//! - [`ChatTemplate::ChatMl`] (the default): the router's own rendering (Kthena's,
//!   `prefix_picker::prompt`): `<|im_start|>{role}\n{content}<|im_end|>\n` per message, no
//!   generation prompt. Every published benchmark ran on it.
//! - [`ChatTemplate::Llama3`]: Llama 3's template, which the router does not render:
//!   `<|begin_of_text|>` before the first message, then
//!   `<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>` per message, no
//!   generation prompt. The router's ChatML bytes and these differ in every message's framing and
//!   in trimmed whitespace, so the router's 64-byte hash blocks and the engine's token blocks
//!   never line up the same way.
//!
//! Which messages count, and what their content is, follows the router's rules for both (a
//! top-level `system` first; a Responses request's `instructions` as a `developer` message; a
//! content string, or the text parts of a list joined by `\n`; messages without a string role
//! or usable content skipped), so only the framing differs. A string `prompt` (completions) is
//! used as is by either.

use prefix_picker::prompt::NoPrompt;
use serde_json::Value;

/// `--chat-template`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ChatTemplate {
    /// The router's ChatML rendering.
    #[default]
    #[value(name = "chatml")]
    ChatMl,
    /// Llama 3's template (`<|begin_of_text|><|start_header_id|>...`).
    #[value(name = "llama3")]
    Llama3,
}

const BOS: &str = "<|begin_of_text|>";

impl ChatTemplate {
    /// The prompt of a request `body` as this engine renders it; `router` is the router's
    /// rendering of the same body (what [`ChatTemplate::ChatMl`] answers).
    pub fn prompt(
        self,
        body: &Value,
        router: Result<String, NoPrompt>,
    ) -> Result<String, NoPrompt> {
        match self {
            ChatTemplate::ChatMl => router,
            ChatTemplate::Llama3 => match body.get("prompt") {
                // Completions: the text as is, as the router takes it.
                Some(_) => router,
                None => llama3(body).ok_or(router.err().unwrap_or(NoPrompt::NoPromptField)),
            },
        }
    }

    /// The text an answer adds to its chat prompt, as the next turn renders it (the prompt has no
    /// generation prompt: the assistant header is part of it).
    pub fn assistant_turn(self, text: &str) -> String {
        match self {
            ChatTemplate::ChatMl => format!("<|im_start|>assistant\n{text}<|im_end|>"),
            ChatTemplate::Llama3 => {
                format!(
                    "<|start_header_id|>assistant<|end_header_id|>\n\n{}<|eot_id|>",
                    text.trim()
                )
            }
        }
    }
}

/// Llama 3's rendering of a chat (`messages`) or Responses (`input`) body; `None` when the body
/// has neither, or not in a shape the router renders (the router's error is then answered).
fn llama3(body: &Value) -> Option<String> {
    let mut turns: Vec<(&str, String)> = Vec::new();
    if let Some(messages) = body.get("messages") {
        let messages = messages.as_array()?;
        if let Some(system) = body.get("system").and_then(content) {
            turns.push(("system", system));
        }
        for m in messages {
            if let (Some(role), Some(text)) = (
                m.get("role").and_then(Value::as_str),
                m.get("content").and_then(content),
            ) {
                turns.push((role, text));
            }
        }
    } else {
        let input = body.get("input")?;
        if let Some(d) = body
            .get("instructions")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            turns.push(("developer", d.to_owned()));
        }
        if let Some(text) = input.as_str() {
            turns.push(("user", text.to_owned()));
        } else {
            for item in input.as_array()? {
                let is_message = match item.get("type") {
                    None => true,
                    Some(t) => t.as_str().is_some_and(|t| t.is_empty() || t == "message"),
                };
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty());
                if let (true, Some(role), Some(text)) =
                    (is_message, role, item.get("content").and_then(content))
                {
                    turns.push((role, text));
                }
            }
        }
    }
    let mut out = String::new();
    for (i, (role, text)) in turns.iter().enumerate() {
        if i == 0 {
            out.push_str(BOS);
        }
        out.push_str("<|start_header_id|>");
        out.push_str(role);
        out.push_str("<|end_header_id|>\n\n");
        // Llama 3's template trims each message (`message['content'] | trim`).
        out.push_str(text.trim());
        out.push_str("<|eot_id|>");
    }
    Some(out)
}

/// A message's content by the router's rules: a string, or the `\n`-joined text of a list's
/// text parts (none: no content).
fn content(v: &Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        return Some(s.to_owned());
    }
    let texts: Vec<&str> = v
        .as_array()?
        .iter()
        .filter(|p| match p.get("type") {
            None => true,
            Some(t) => t
                .as_str()
                .is_some_and(|t| matches!(t, "text" | "input_text" | "output_text")),
        })
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_picker::request::InferenceRequest;
    use serde_json::json;

    fn render(t: ChatTemplate, body: Value) -> Result<String, NoPrompt> {
        let router = InferenceRequest::parse(body.to_string().as_bytes())
            .unwrap()
            .prompt;
        t.prompt(&body, router)
    }

    #[test]
    fn llama3_frames_each_message_and_trims_it() {
        let body = json!({"model": "m", "system": "be brief ",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]},
                         {"role": 7, "content": "skipped"},
                         {"role": "assistant", "content": " ok\n"}]});
        assert_eq!(
            render(ChatTemplate::Llama3, body.clone()).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\na\nb<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>"
        );
        // The default is the router's ChatML, exactly.
        assert_eq!(
            render(ChatTemplate::ChatMl, body.clone()).unwrap(),
            InferenceRequest::parse(body.to_string().as_bytes())
                .unwrap()
                .prompt
                .unwrap()
        );
    }

    #[test]
    fn llama3_renders_responses_and_keeps_completions_and_errors() {
        let body = json!({"model": "m", "instructions": "d", "input": [
            {"role": "user", "content": "q"}, {"type": "function_call", "role": "user", "content": "x"}]});
        assert_eq!(
            render(ChatTemplate::Llama3, body).unwrap(),
            "<|begin_of_text|><|start_header_id|>developer<|end_header_id|>\n\nd<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
        );
        let text = json!({"model": "m", "prompt": " as is "});
        assert_eq!(render(ChatTemplate::Llama3, text).unwrap(), " as is ");
        let bad = json!({"model": "m", "messages": "no"});
        assert_eq!(
            render(ChatTemplate::Llama3, bad),
            Err(NoPrompt::MessagesNotList)
        );
        assert_eq!(
            render(ChatTemplate::Llama3, json!({"model": "m"})),
            Err(NoPrompt::NoPromptField)
        );
    }

    #[test]
    fn a_next_turn_continues_the_prompt_and_its_answer() {
        for t in [ChatTemplate::ChatMl, ChatTemplate::Llama3] {
            let first = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            let next = json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yes"}, {"role": "user", "content": "more"}]});
            let (first, next) = (render(t, first).unwrap(), render(t, next).unwrap());
            let answered = first + &t.assistant_turn("yes");
            assert!(
                next.starts_with(&answered),
                "{t:?}: {next:?} after {answered:?}"
            );
        }
    }
}
