//! What is tokenized: the engine kind, the request's prompt (chat messages or text) and the
//! flags, turned into the engine's `/tokenize` body and into the cache key.

use std::fmt;

use serde::de::IgnoredAny;
use xxhash_rust::xxh3::Xxh3;

/// The model server behind a pod: it decides the port and the body of the tokenize call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl EngineKind {
    /// Both engines serve tokenization at this path (vLLM and SGLang also at `/v1/tokenize`).
    pub const TOKENIZE_PATH: &'static str = "/tokenize";

    /// The engine's upstream default port (Kthena's `vllmTokenizerPort` / `sglangTokenizerPort`
    /// defaults); the caller passes the port it uses.
    pub const fn default_port(self) -> u16 {
        match self {
            EngineKind::Vllm => 8000,
            EngineKind::Sglang => 30000,
        }
    }

    /// The label used in logs and by the integrator's metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The prompt, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt<'a> {
    /// Chat: `messages` and `tools` as the raw JSON text the client sent (both arrays), so that
    /// the engine renders its chat template over exactly the client's bytes (key order included:
    /// templates print tools with `tojson`).
    Chat {
        messages: &'a str,
        tools: Option<&'a str>,
    },
    /// A completion prompt.
    Text(&'a str),
}

/// One tokenize question: the prompt and the flags sent with it.
///
/// Defaults follow Kthena: chat sends `add_special_tokens: false` (the chat template adds them)
/// and, to vLLM, `add_generation_prompt: true`; text sends `add_special_tokens: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizeInput<'a> {
    prompt: Prompt<'a>,
    add_special_tokens: bool,
    /// vLLM chat: `add_generation_prompt` (true; false for a conversation's head, which the
    /// next message continues).
    generation_prompt: bool,
    /// vLLM chat: `continue_final_message` (the last message left open, as a prompt cut inside
    /// it is: [`crate::prompt::stable_cut`]); implies no generation prompt.
    continue_final: bool,
}

impl<'a> TokenizeInput<'a> {
    /// Chat messages (raw JSON array text) and the request's `tools` if any.
    pub fn chat(messages: &'a str, tools: Option<&'a str>) -> Self {
        TokenizeInput {
            prompt: Prompt::Chat { messages, tools },
            add_special_tokens: false,
            generation_prompt: true,
            continue_final: false,
        }
    }

    /// A text (completion) prompt.
    pub fn text(prompt: &'a str) -> Self {
        TokenizeInput {
            prompt: Prompt::Text(prompt),
            add_special_tokens: true,
            generation_prompt: true,
            continue_final: false,
        }
    }

    /// Overrides `add_special_tokens`.
    pub fn with_add_special_tokens(mut self, add: bool) -> Self {
        self.add_special_tokens = add;
        self
    }

    /// Overrides vLLM chat's `add_generation_prompt` (a head of a conversation: false).
    pub fn with_generation_prompt(mut self, add: bool) -> Self {
        self.generation_prompt = add;
        self
    }

    /// Leaves the last chat message open (vLLM's `continue_final_message`): no generation
    /// prompt, and nothing the template would close the message with.
    pub fn continuing_final_message(mut self) -> Self {
        self.generation_prompt = false;
        self.continue_final = true;
        self
    }

    pub fn prompt(&self) -> Prompt<'a> {
        self.prompt
    }

    pub fn add_special_tokens(&self) -> bool {
        self.add_special_tokens
    }

    /// Chat's `add_generation_prompt`.
    pub fn generation_prompt(&self) -> bool {
        self.generation_prompt
    }

    /// Chat's `continue_final_message`.
    pub fn continue_final(&self) -> bool {
        self.continue_final
    }

    /// The cache key: xxh3-64 of (kind, model, the prompt's exact bytes, the flags), each field
    /// length-prefixed so that no two inputs share a byte stream. The pod is not part of it:
    /// every pod of a model tokenizes alike.
    pub fn cache_key(&self, kind: EngineKind, model: &str) -> u64 {
        let mut h = Xxh3::new();
        let mut field = |tag: u8, bytes: &[u8]| {
            h.update(&[tag]);
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(b'k', kind.as_str().as_bytes());
        field(b'M', model.as_bytes());
        match self.prompt {
            Prompt::Chat { messages, tools } => {
                field(b'c', messages.as_bytes());
                if let Some(tools) = tools {
                    field(b't', tools.as_bytes());
                }
            }
            Prompt::Text(text) => field(b'p', text.as_bytes()),
        }
        field(b's', &[u8::from(self.add_special_tokens)]);
        field(b'g', &[u8::from(self.generation_prompt)]);
        if self.continue_final {
            field(b'f', &[1]);
        }
        h.digest()
    }

    /// The JSON body of the `/tokenize` call to `kind`. Raw chat JSON is checked to be a JSON
    /// array first: it is spliced into the body, and must not smuggle in other fields.
    ///
    /// - vLLM, text: `{"model", "prompt", "add_special_tokens"}` (`TokenizeCompletionRequest`).
    /// - vLLM, chat: `{"model", "messages", "tools"?, "add_special_tokens",
    ///   "add_generation_prompt", "continue_final_message"?}` (`TokenizeChatRequest`;
    ///   generation true unless a head asks otherwise; continuing only for a cut message).
    /// - SGLang, text: `{"model", "prompt", "add_special_tokens"}`.
    /// - SGLang, chat: `{"model", "messages", "tools"?, "add_special_tokens"}`: SGLang's chat
    ///   rendering always appends the generation prompt, and has no such field (Kthena sends none).
    ///
    /// `model` is left out when empty, as Kthena does (the engine then uses its served model).
    pub fn body(&self, kind: EngineKind, model: &str) -> Result<Vec<u8>, InvalidInput> {
        let extra = match self.prompt {
            Prompt::Chat { messages, tools } => messages.len() + tools.map_or(0, str::len),
            Prompt::Text(text) => text.len() + text.len() / 8,
        };
        let mut out = Vec::with_capacity(model.len() + extra + 128);
        out.push(b'{');
        if !model.is_empty() {
            out.extend_from_slice(b"\"model\":");
            json_string(&mut out, model);
            out.push(b',');
        }
        match self.prompt {
            Prompt::Chat { messages, tools } => {
                out.extend_from_slice(b"\"messages\":");
                out.extend_from_slice(json_array("messages", messages)?.as_bytes());
                if let Some(tools) = tools {
                    out.extend_from_slice(b",\"tools\":");
                    out.extend_from_slice(json_array("tools", tools)?.as_bytes());
                }
            }
            Prompt::Text(text) => {
                out.extend_from_slice(b"\"prompt\":");
                json_string(&mut out, text);
            }
        }
        out.extend_from_slice(b",\"add_special_tokens\":");
        out.extend_from_slice(if self.add_special_tokens {
            b"true"
        } else {
            b"false"
        });
        if kind == EngineKind::Vllm && matches!(self.prompt, Prompt::Chat { .. }) {
            out.extend_from_slice(if self.generation_prompt {
                b",\"add_generation_prompt\":true"
            } else {
                b",\"add_generation_prompt\":false"
            });
            if self.continue_final {
                out.extend_from_slice(b",\"continue_final_message\":true");
            }
        }
        out.push(b'}');
        Ok(out)
    }
}

/// Raw chat JSON that is not one JSON array.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` is not a JSON array: {reason}")]
pub struct InvalidInput {
    pub field: &'static str,
    pub reason: String,
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a `str` into a `Vec` cannot fail.
    serde_json::to_writer(&mut *out, s).expect("a string serializes");
}

/// `raw` trimmed, when it is exactly one JSON array.
fn json_array<'s>(field: &'static str, raw: &'s str) -> Result<&'s str, InvalidInput> {
    let raw = raw.trim_matches([' ', '\t', '\n', '\r']);
    if !raw.starts_with('[') {
        return Err(InvalidInput {
            field,
            reason: format!("starts with {:?}", raw.chars().next().unwrap_or(' ')),
        });
    }
    serde_json::from_str::<IgnoredAny>(raw).map_err(|e| InvalidInput {
        field,
        reason: e.to_string(),
    })?;
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(kind: EngineKind, model: &str, input: TokenizeInput<'_>) -> String {
        String::from_utf8(input.body(kind, model).unwrap()).unwrap()
    }

    const MESSAGES: &str =
        r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi \"there\""}]"#;
    const TOOLS: &str =
        r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]"#;

    #[test]
    fn vllm_text_body() {
        assert_eq!(
            body(
                EngineKind::Vllm,
                "llama",
                TokenizeInput::text("Hello\n\"world\"")
            ),
            r#"{"model":"llama","prompt":"Hello\n\"world\"","add_special_tokens":true}"#
        );
    }

    #[test]
    fn vllm_chat_body_keeps_the_client_bytes() {
        assert_eq!(
            body(
                EngineKind::Vllm,
                "llama",
                TokenizeInput::chat(MESSAGES, None)
            ),
            format!(
                r#"{{"model":"llama","messages":{MESSAGES},"add_special_tokens":false,"add_generation_prompt":true}}"#
            )
        );
        assert_eq!(
            body(
                EngineKind::Vllm,
                "llama",
                TokenizeInput::chat(MESSAGES, Some(TOOLS))
            ),
            format!(
                r#"{{"model":"llama","messages":{MESSAGES},"tools":{TOOLS},"add_special_tokens":false,"add_generation_prompt":true}}"#
            )
        );
    }

    #[test]
    fn sglang_bodies() {
        assert_eq!(
            body(EngineKind::Sglang, "qwen", TokenizeInput::text("Hi")),
            r#"{"model":"qwen","prompt":"Hi","add_special_tokens":true}"#
        );
        assert_eq!(
            body(
                EngineKind::Sglang,
                "qwen",
                TokenizeInput::chat(MESSAGES, Some(TOOLS))
            ),
            format!(
                r#"{{"model":"qwen","messages":{MESSAGES},"tools":{TOOLS},"add_special_tokens":false}}"#
            )
        );
    }

    #[test]
    fn an_empty_model_is_left_out_and_the_flag_can_be_overridden() {
        assert_eq!(
            body(
                EngineKind::Vllm,
                "",
                TokenizeInput::text("x").with_add_special_tokens(false)
            ),
            r#"{"prompt":"x","add_special_tokens":false}"#
        );
        assert_eq!(
            body(
                EngineKind::Sglang,
                "",
                TokenizeInput::chat(" [] \n", None).with_add_special_tokens(true)
            ),
            r#"{"messages":[],"add_special_tokens":true}"#
        );
    }

    #[test]
    fn every_body_is_json_with_the_client_values() {
        for kind in [EngineKind::Vllm, EngineKind::Sglang] {
            let v: serde_json::Value =
                serde_json::from_str(&body(kind, "m", TokenizeInput::chat(MESSAGES, Some(TOOLS))))
                    .unwrap();
            assert_eq!(
                v["messages"],
                serde_json::from_str::<serde_json::Value>(MESSAGES).unwrap()
            );
            assert_eq!(v["tools"][0]["function"]["name"], "f");
            let v: serde_json::Value =
                serde_json::from_str(&body(kind, "m", TokenizeInput::text("a\u{0}é"))).unwrap();
            assert_eq!(v["prompt"], "a\u{0}é");
        }
    }

    #[test]
    fn raw_chat_json_must_be_one_array() {
        for bad in [
            r#"{"role":"user"}"#,
            r#"[], "add_special_tokens": true"#,
            r#"[{"role":"user","content":"x"}"#,
            "",
            "null",
        ] {
            let err = TokenizeInput::chat(bad, None)
                .body(EngineKind::Vllm, "m")
                .unwrap_err();
            assert_eq!(err.field, "messages", "{bad}");
        }
        let err = TokenizeInput::chat("[]", Some("{}"))
            .body(EngineKind::Vllm, "m")
            .unwrap_err();
        assert_eq!(err.field, "tools");
    }

    #[test]
    fn the_cache_key_separates_every_field() {
        let k = |kind, model, input: TokenizeInput<'_>| input.cache_key(kind, model);
        let base = k(EngineKind::Vllm, "m", TokenizeInput::text("ab"));
        assert_eq!(base, k(EngineKind::Vllm, "m", TokenizeInput::text("ab")));
        let others = [
            k(EngineKind::Sglang, "m", TokenizeInput::text("ab")),
            k(EngineKind::Vllm, "n", TokenizeInput::text("ab")),
            k(EngineKind::Vllm, "m", TokenizeInput::text("ab ")),
            k(EngineKind::Vllm, "ma", TokenizeInput::text("b")),
            k(
                EngineKind::Vllm,
                "m",
                TokenizeInput::text("ab").with_add_special_tokens(false),
            ),
            k(EngineKind::Vllm, "m", TokenizeInput::chat("ab", None)),
            k(EngineKind::Vllm, "m", TokenizeInput::chat("[]", Some("[]"))),
            k(EngineKind::Vllm, "m", TokenizeInput::chat("[]", None)),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(base, *o, "{i}");
        }
        assert_ne!(others[6], others[7]);
    }
}
