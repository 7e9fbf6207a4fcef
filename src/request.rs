//! OpenAI-style request bodies -> [`InferenceRequest`] (model, rendered prompt, stream flag, API).
//!
//! A body must be a JSON object with a non-empty string `model`; anything else is a
//! [`RequestError`] that names what is wrong (the sidecar answers it with a 400). A well-formed
//! body without a renderable prompt is not an error: its prompt is `Err(NoPrompt)` and the request
//! is routed by the load-aware plugins only. JSON is decoded with Go's leniency (see
//! [`crate::lenient_json`]); on duplicate keys the last one wins.
//!
//! `cache_salt` (vLLM's per-tenant cache isolation, any of the three OpenAI APIs) becomes the
//! request's [`CacheSalt`] when it is a non-empty string. Any other value (a number, `null`, `""`) is
//! ignored, as a malformed `stream` is: the request is hashed unsalted, never rejected. An
//! engine that takes the field refuses such a body (vLLM: 400), so nothing is recorded for it;
//! one that ignores the field shares its cache unsalted, which is what the hash then says.
//!
//! Anthropic's Messages API ([`Api::Messages`], [`InferenceRequest::parse_for`]) reads the same
//! top-level fields; its prompt is rendered as [`prompt::render_messages`] says, and it is never
//! salted: vLLM's `/v1/messages` has no `cache_salt` (its request model drops the field and the
//! chat request it builds has none), so its cache is shared whatever the body says.

use serde_json::Value;
use thiserror::Error;

use crate::hashing::CacheSalt;
use crate::lenient_json;
use crate::prompt::{self, NoPrompt, Rendering};
use body::Body;
pub use body::Json;

mod body;
mod fast;
mod json_text;

/// The inference APIs prefix-picker understands: OpenAI's three and Anthropic's Messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    Completions,
    ChatCompletions,
    Responses,
    /// Anthropic's Messages API (`/v1/messages`), as vLLM serves it.
    Messages,
}

impl Api {
    /// Maps a request path (query string and a trailing `/` ignored) to its API, if it is one
    /// of ours: `/v1/completions`, `/v1/chat/completions`, `/v1/responses`, `/v1/messages`, also
    /// under a prefix (`/openai/v1/chat/completions`), since gateways often publish the API
    /// under one and rewrite it after the picker has seen the path. `/v1/messages/count_tokens`
    /// is not one: it generates nothing, so it passes through as any other path does.
    pub fn from_path(path: &str) -> Option<Api> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let path = path.trim_end_matches('/');
        [
            ("/v1/completions", Api::Completions),
            ("/v1/chat/completions", Api::ChatCompletions),
            ("/v1/responses", Api::Responses),
            ("/v1/messages", Api::Messages),
        ]
        .into_iter()
        .find_map(|(suffix, api)| path.ends_with(suffix).then_some(api))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::ChatCompletions => "chat_completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }
}

/// A request body that is not usable at all (answered with 400).
#[derive(Debug, Error)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("request body must be a JSON object, got {0}")]
    NotObject(&'static str),
    #[error("request body has no `model` field")]
    MissingModel,
    #[error("`model` must be a string, got {0}")]
    ModelNotString(&'static str),
    #[error("`model` must not be empty")]
    EmptyModel,
}

/// What the router needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest {
    pub model: String,
    pub prompt: Result<String, NoPrompt>,
    pub stream: bool,
    /// `cache_salt`, when it is a non-empty string (its `Debug` hides it).
    pub salt: Option<CacheSalt>,
}

/// Names a JSON value's type for error messages.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl InferenceRequest {
    /// Parses and renders a request body.
    ///
    /// One pass over the body, whose strings borrow from it where they have no escapes: first
    /// the strict reader of plain JSON ([`fast`]); a body it leaves goes to `serde_json`
    /// ([`body`]), as it is if it accepts it (it then needs none of Go's leniency: it is valid
    /// UTF-8 and every surrogate escape in it is paired, so sanitizing would not change it),
    /// else sanitized ([`lenient_json::sanitize`]), which also gives a rejected body its error.
    /// Equal to [`InferenceRequest::parse_by_value`]. Kthena's rendering.
    pub fn parse(body: &[u8]) -> Result<InferenceRequest, RequestError> {
        Self::parse_as(body, Rendering::Kthena)
    }

    /// [`InferenceRequest::parse`] with the prompt rendered as `rendering` says.
    pub fn parse_as(body: &[u8], rendering: Rendering) -> Result<InferenceRequest, RequestError> {
        Self::parse_for(Api::ChatCompletions, body, rendering)
    }

    /// [`InferenceRequest::parse_as`] of a body sent to `api`'s path: the three OpenAI APIs
    /// parse alike (Kthena's precedence of `prompt`, `messages`, `input`); a Messages body is
    /// rendered as [`prompt::render_messages`] says, and never salted.
    pub fn parse_for(
        api: Api,
        body: &[u8],
        rendering: Rendering,
    ) -> Result<InferenceRequest, RequestError> {
        if let Some(parsed) = fast::parse(body) {
            return Self::from_body(api, parsed, rendering);
        }
        if let Ok(parsed) = serde_json::from_slice::<Body>(body) {
            return Self::from_body(api, parsed, rendering);
        }
        let text = lenient_json::sanitize(body);
        let parsed = serde_json::from_slice::<Body>(&text).map_err(RequestError::NotJson)?;
        Self::from_body(api, parsed, rendering)
    }

    fn from_body(
        api: Api,
        body: Body<'_>,
        rendering: Rendering,
    ) -> Result<InferenceRequest, RequestError> {
        let mut fields = match body {
            Body::Object(fields) => fields,
            Body::Other(kind) => return Err(RequestError::NotObject(kind)),
        };
        let model = match &fields.model {
            None => return Err(RequestError::MissingModel),
            Some(Json::String(m)) if m.is_empty() => return Err(RequestError::EmptyModel),
            Some(Json::String(m)) => m.to_string(),
            Some(other) => return Err(RequestError::ModelNotString(other.kind())),
        };
        let stream = matches!(fields.stream, Some(Json::Bool(true)));
        if api == Api::Messages {
            let prompt = prompt::render_messages(rendering, |key| fields.get(key));
            return Ok(InferenceRequest {
                model,
                prompt,
                stream,
                salt: None,
            });
        }
        let salt = match fields.cache_salt.take() {
            Some(Json::String(s)) => CacheSalt::new(s.into_owned()),
            _ => None,
        };
        let prompt = match &mut fields.prompt {
            Some(Json::String(p)) => Ok(std::mem::take(p).into_owned()),
            _ => prompt::render_fields(rendering, |key| fields.get(key)),
        };
        Ok(InferenceRequest {
            model,
            prompt,
            stream,
            salt,
        })
    }

    /// The reference [`InferenceRequest::parse`] is tested against: the body parsed into a
    /// `serde_json::Value` ([`lenient_json::parse_value`]), then rendered. Kthena's rendering.
    pub fn parse_by_value(body: &[u8]) -> Result<InferenceRequest, RequestError> {
        Self::parse_by_value_as(body, Rendering::Kthena)
    }

    /// [`InferenceRequest::parse_by_value`] with the prompt rendered as `rendering` says.
    pub fn parse_by_value_as(
        body: &[u8],
        rendering: Rendering,
    ) -> Result<InferenceRequest, RequestError> {
        Self::parse_by_value_for(Api::ChatCompletions, body, rendering)
    }

    /// [`InferenceRequest::parse_by_value_as`] of a body sent to `api`'s path (the reference
    /// [`InferenceRequest::parse_for`] is tested against).
    pub fn parse_by_value_for(
        api: Api,
        body: &[u8],
        rendering: Rendering,
    ) -> Result<InferenceRequest, RequestError> {
        let value = lenient_json::parse_value(body).map_err(RequestError::NotJson)?;
        let Value::Object(map) = value else {
            return Err(RequestError::NotObject(json_kind(&value)));
        };
        let model = match map.get("model") {
            None => return Err(RequestError::MissingModel),
            Some(Value::String(m)) if m.is_empty() => return Err(RequestError::EmptyModel),
            Some(Value::String(m)) => m.clone(),
            Some(other) => return Err(RequestError::ModelNotString(json_kind(other))),
        };
        let stream = matches!(map.get("stream"), Some(Value::Bool(true)));
        if api == Api::Messages {
            let prompt = prompt::render_messages(rendering, |key| map.get(key));
            return Ok(InferenceRequest {
                model,
                prompt,
                stream,
                salt: None,
            });
        }
        let salt = match map.get("cache_salt") {
            Some(Value::String(s)) => CacheSalt::new(s.as_str()),
            _ => None,
        };
        let prompt = prompt::render_owned(map, rendering);
        Ok(InferenceRequest {
            model,
            prompt,
            stream,
            salt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_from_path() {
        assert_eq!(Api::from_path("/v1/completions"), Some(Api::Completions));
        assert_eq!(
            Api::from_path("/v1/chat/completions?x=1"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(Api::from_path("/v1/responses/"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(
            Api::from_path("/anthropic/v1/messages?beta=true"),
            Some(Api::Messages)
        );
        // Counting tokens generates nothing: passed through as any other path.
        assert_eq!(Api::from_path("/v1/messages/count_tokens"), None);
        assert_eq!(Api::from_path("/v1/messages/batches"), None);
        assert_eq!(Api::from_path("/v1/embeddings"), None);
        // Under a prefix a gateway rewrites away later.
        assert_eq!(
            Api::from_path("/openai/v1/chat/completions"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(
            Api::from_path("/llm/team-a/v1/completions?stream=1"),
            Some(Api::Completions)
        );
        // Not the inference calls themselves.
        assert_eq!(Api::from_path("/v1/responses/resp_123"), None);
        assert_eq!(Api::from_path("/v1/chat/completions/chatcmpl-1"), None);
        assert_eq!(Api::from_path("/xv1/completions"), None);
        assert_eq!(Api::from_path("/v2/completions"), None);
        assert_eq!(Api::from_path(""), None);
    }

    #[test]
    fn typed_errors_name_the_problem() {
        let err = |b: &[u8]| InferenceRequest::parse(b).unwrap_err().to_string();
        assert!(err(b"{").starts_with("request body is not valid JSON"));
        assert_eq!(
            err(b"[1]"),
            "request body must be a JSON object, got an array"
        );
        assert_eq!(err(b"{}"), "request body has no `model` field");
        assert_eq!(
            err(br#"{"model":3}"#),
            "`model` must be a string, got a number"
        );
        assert_eq!(
            err(br#"{"model":null}"#),
            "`model` must be a string, got null"
        );
        assert_eq!(err(br#"{"model":""}"#), "`model` must not be empty");
    }

    #[test]
    fn parses_model_prompt_and_stream() {
        let r = InferenceRequest::parse(br#"{"model":"m","prompt":"hi","stream":true}"#).unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(r.prompt, Ok("hi".to_string()));
        assert!(r.stream);
        let r = InferenceRequest::parse(br#"{"model":"a","model":"b","prompt":[1,2]}"#).unwrap();
        assert_eq!(r.model, "b");
        assert_eq!(r.prompt, Err(NoPrompt::PromptNotString));
        assert!(!r.stream);
    }

    #[test]
    fn cache_salt_is_read_in_every_api() {
        for body in [
            &br#"{"model":"m","prompt":"hi","cache_salt":"tenant-a"}"#[..],
            br#"{"cache_salt":"tenant-a","model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            br#"{"model":"m","input":"hi","cache_salt":"tenant-a"}"#,
            // Escaped (the serde path's owned string) and duplicated (the last wins).
            br#"{"model":"m","prompt":"hi","cache_salt":"x","cache_salt":"tenant\u002da"}"#,
        ] {
            for r in [
                InferenceRequest::parse(body).unwrap(),
                InferenceRequest::parse_by_value(body).unwrap(),
            ] {
                assert_eq!(r.salt.as_ref().map(CacheSalt::expose), Some("tenant-a"));
                assert!(r.prompt.is_ok());
            }
        }
        // The salt is not part of the prompt.
        let salted = InferenceRequest::parse(br#"{"model":"m","prompt":"hi","cache_salt":"s"}"#);
        assert_eq!(salted.unwrap().prompt, Ok("hi".to_string()));
    }

    /// A malformed `cache_salt` is ignored as a malformed `stream` is: no salt, never a 400
    /// (Kthena routes such a body; vLLM answers it 400 itself, so nothing is recorded).
    #[test]
    fn a_malformed_cache_salt_is_no_salt() {
        for salt in ["null", "42", "true", "[\"a\"]", "{\"a\":1}", "\"\""] {
            let body = format!(r#"{{"model":"m","prompt":"hi","cache_salt":{salt}}}"#);
            for r in [
                InferenceRequest::parse(body.as_bytes()),
                InferenceRequest::parse_by_value(body.as_bytes()),
            ] {
                let r = r.unwrap();
                assert_eq!(r.salt, None, "{body}");
                assert_eq!(r.prompt, Ok("hi".to_string()));
            }
        }
        // Lenient JSON (Go's decoding) applies to the salt as to every string.
        let r = InferenceRequest::parse(
            b"{\"model\":\"m\",\"prompt\":\"hi\",\"cache_salt\":\"a\xffb\"}",
        )
        .unwrap();
        assert_eq!(r.salt.as_ref().map(CacheSalt::expose), Some("a\u{fffd}b"));
    }

    #[test]
    fn the_parsed_request_never_shows_its_salt() {
        let r =
            InferenceRequest::parse(br#"{"model":"m","prompt":"hi","cache_salt":"s3cr3t-salt"}"#)
                .unwrap();
        assert!(!format!("{r:?}").contains("s3cr3t"));
        assert!(!format!("{r:#?}").contains("s3cr3t"));
    }
}
