//! The simulator's HTTP surface: OpenAI-style `POST /v1/completions`, `/v1/chat/completions`,
//! `/v1/responses` and Anthropic's `/v1/messages` ([`crate::messages`]) (JSON, or SSE with
//! `"stream": true`), `/v1/messages/count_tokens`, `GET /health`, `/v1/models`, `/metrics`,
//! `POST /tokenize` (vLLM's or SGLang's shape) and vLLM's `POST /reset_prefix_cache`.
//!
//! Prompts are rendered by the engine's chat template ([`crate::template`]; by default the
//! router's own renderer). Output length = `max_tokens`
//! (`max_completion_tokens`, `max_output_tokens`) or the default; output text is words drawn
//! from an RNG seeded by `--seed` and the request number. Every response carries
//! `x-served-by: <name>` and `usage.prompt_tokens_details.cached_tokens`; as in vLLM, a stream
//! carries usage only when the request asks `stream_options: {include_usage: true}`, in a last
//! chunk with no choices (the Responses API's `response.completed` event always has it).
//!
//! A decode sim (`--role decode`) given `x-prefiller-host-port` has the prompt prefilled by that
//! peer first ([`crate::pd`]); its answer then also carries `x-prefilled-by: <peer's name>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Router as Http;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::routing::get;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::engine::{Engine, EngineKind, Running};
use crate::messages::{self, Answer};
use crate::pd::{self, Outcome, Role};
use crate::template::ChatTemplate;
use prefix_picker::prompt::{NoPrompt, stable_cut};
use prefix_picker::request::{Api, InferenceRequest, RequestError};

const WORDS: [&str; 24] = [
    "the", "model", "cache", "prefix", "token", "router", "request", "answer", "quick", "brown",
    "system", "latency", "batch", "block", "engine", "serve", "kernel", "memory", "query", "reply",
    "stream", "vector", "layer", "result",
];

/// Simulator settings beyond the engine's.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub name: String,
    /// Served model name; `None` accepts any model.
    pub model: Option<String>,
    /// LoRA adapters loaded beside the base model: served under their own names and listed by
    /// `GET /v1/models` (what Kthena's lora-affinity filter reads); with any, requests for them
    /// are exported in `vllm:lora_requests_info` ([`crate::lora`]).
    pub lora_adapters: Vec<String>,
    /// vLLM's `--max-loras`: the `max_lora` label of `vllm:lora_requests_info`.
    pub max_loras: usize,
    pub default_max_tokens: usize,
    pub seed: u64,
}

#[derive(Debug, Clone)]
struct Sim {
    config: Arc<SimConfig>,
    engine: Arc<Engine>,
    requests: Arc<AtomicU64>,
    /// A decode sim's client for its prefill peers.
    prefill_client: Option<reqwest::Client>,
    /// `vllm:lora_requests_info`, when adapters are loaded.
    lora: Option<Arc<crate::lora::LoraInfo>>,
}

/// The simulator's routes; the PD role is the engine's (`EngineConfig::pd`).
pub fn app(config: SimConfig, engine: Arc<Engine>) -> Http {
    let pd = &engine.config().pd;
    let prefill_client = (pd.role == Some(Role::Decode)).then(|| {
        reqwest::Client::builder()
            .timeout(pd.prefill_timeout)
            .connect_timeout(pd.prefill_timeout)
            .tcp_nodelay(true)
            // Pods talk to each other directly, whatever the environment's proxy.
            .no_proxy()
            .build()
            .expect("a plain HTTP client builds")
    });
    let lora = (!config.lora_adapters.is_empty())
        .then(|| crate::lora::LoraInfo::register(&engine.registry, config.max_loras));
    let sim = Sim {
        lora,
        config: Arc::new(config),
        engine,
        requests: Arc::default(),
        prefill_client,
    };
    Http::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions/render", axum::routing::post(render))
        .route("/v1/completions/render", axum::routing::post(render))
        .route("/v1/responses/render", axum::routing::post(render))
        .route(
            "/v1/messages/count_tokens",
            axum::routing::post(count_tokens),
        )
        .route("/tokenize", axum::routing::post(tokenize))
        .route("/v1/tokenize", axum::routing::post(tokenize))
        .route(
            "/reset_prefix_cache",
            axum::routing::post(reset_prefix_cache),
        )
        .fallback(infer)
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(sim)
}

/// vLLM's listing: the base model, then each adapter (`root`: its path, `parent`: the base).
async fn models(State(s): State<Sim>) -> Response {
    let id = s.config.model.clone().unwrap_or_else(|| "any".into());
    let base =
        json!({"id": id, "object": "model", "owned_by": "model-sim", "root": id, "parent": null});
    let adapters = s.config.lora_adapters.iter().map(|a| {
        json!({"id": a, "object": "model", "owned_by": "model-sim", "root": format!("/adapters/{a}"), "parent": id})
    });
    let data: Vec<Value> = std::iter::once(base).chain(adapters).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

impl SimConfig {
    /// Whether a request for `model` is served: any model without `--model`, else the base
    /// model or a loaded adapter.
    fn serves(&self, model: &str) -> bool {
        match &self.model {
            None => true,
            Some(m) => m == model || self.lora_adapters.iter().any(|a| a == model),
        }
    }
}

async fn metrics(State(s): State<Sim>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        encode(&s.engine.registry),
    )
        .into_response()
}

/// The Prometheus text exposition of the engine's registry.
fn encode(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("text format is UTF-8")
}

/// vLLM's render endpoints (used by vllm-router's cache-aware policy): `{"token_ids": [...]}`.
async fn render(State(s): State<Sim>, body: Bytes) -> Response {
    let ids = |prompt: &str| s.engine.tokenizer().ids(prompt.as_bytes());
    match prompt_of(&s, &body) {
        Ok((_, prompt)) => {
            axum::Json(json!({"token_ids": ids(prompt.as_deref().unwrap_or(""))})).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// vLLM's `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the tokens of the chat request
/// the Messages request is served as.
async fn count_tokens(State(s): State<Sim>, body: Bytes) -> Response {
    let value = prefix_picker::lenient_json::parse_value(&body).unwrap_or(Value::Null);
    let chat = serde_json::to_vec(&messages::chat_body(&value)).expect("a JSON value serializes");
    match prompt_of(&s, &chat) {
        Ok((_, prompt)) => {
            let n = s
                .engine
                .tokenizer()
                .ids(prompt.as_deref().unwrap_or("").as_bytes())
                .len();
            axum::Json(json!({"input_tokens": n})).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// A request body parsed, and its prompt as the engine's chat template renders it.
fn prompt_of(
    s: &Sim,
    body: &[u8],
) -> Result<(InferenceRequest, Result<String, NoPrompt>), RequestError> {
    let request = InferenceRequest::parse(body)?;
    let template = s.engine.config().chat_template;
    let prompt = if template == ChatTemplate::ChatMl {
        request.prompt.clone()
    } else {
        let value = prefix_picker::lenient_json::parse_value(body).unwrap_or(Value::Null);
        template.prompt(&value, request.prompt.clone())
    };
    Ok((request, prompt))
}

#[cfg(test)]
mod tests;

/// The context length `/tokenize` reports (`max_model_len`).
pub const MAX_MODEL_LEN: usize = 131_072;

/// vLLM's `POST /tokenize` (`TokenizeCompletionRequest` `{model?, prompt, add_special_tokens?,
/// return_token_strs?}` or `TokenizeChatRequest` `{model?, messages, add_generation_prompt?,
/// tools?, ...}`) -> `{"count", "max_model_len", "tokens", "token_strs"}`; SGLang's (`--engine
/// sglang`, also `/v1/tokenize`: `prompt` a string or a list of them) -> `{"tokens", "count",
/// "max_model_len"}`. Messages render as for a chat completion, so the tokens are exactly those
/// the cache hashes for it; the sim's template adds no generation prompt and its tokenizer no
/// special tokens, so those flags change nothing. `continue_final_message` cuts the rendering
/// after the final message's text, as vLLM (Hugging Face's `apply_chat_template`) does.
async fn tokenize(State(s): State<Sim>, body: Bytes) -> Response {
    s.engine.count_tokenize();
    let Ok(Value::Object(mut fields)) = prefix_picker::lenient_json::parse_value(&body) else {
        return error(StatusCode::BAD_REQUEST, "body must be a JSON object".into());
    };
    match (fields.get("model"), &s.config.model) {
        (Some(Value::String(m)), Some(_)) if !s.config.serves(m) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("The model `{m}` does not exist."),
            );
        }
        (None | Some(Value::Null), served) => {
            let model = served.clone().unwrap_or_else(|| "any".into());
            fields.insert("model".into(), Value::String(model));
        }
        _ => {}
    }
    let sglang = s.engine.config().kind == EngineKind::Sglang;
    let ids = |text: &str| s.engine.tokenizer().ids(text.as_bytes());
    if sglang && let Some(Value::Array(prompts)) = fields.get("prompt") {
        let Some(prompts) = prompts
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<_>>>()
        else {
            return error(StatusCode::BAD_REQUEST, "`prompt` must be strings".into());
        };
        let tokens: Vec<Vec<u32>> = prompts.into_iter().map(ids).collect();
        let count: Vec<usize> = tokens.iter().map(Vec::len).collect();
        s.engine.count_tokenized(count.iter().sum());
        return axum::Json(
            json!({"tokens": tokens, "count": count, "max_model_len": MAX_MODEL_LEN}),
        )
        .into_response();
    }
    if !matches!(fields.get("prompt"), Some(Value::String(_))) && !fields.contains_key("messages") {
        return error(
            StatusCode::BAD_REQUEST,
            "a string `prompt` or a list of `messages` is required".into(),
        );
    }
    let want_strs = fields.get("return_token_strs") == Some(&Value::Bool(true));
    let body = serde_json::to_vec(&fields).expect("a JSON map serializes");
    let prompt = match prompt_of(&s, &body) {
        Ok((_, Ok(p))) => p,
        Ok((_, Err(e))) => return error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let continuing = fields.get("continue_final_message") == Some(&Value::Bool(true));
    let prompt = match (continuing, fields.get("messages")) {
        (true, Some(Value::Array(messages))) => {
            let text = match messages.last().map(|m| &m["content"]) {
                Some(Value::String(text)) => text.as_str(),
                Some(Value::Array(blocks)) => blocks
                    .iter()
                    .rev()
                    .find_map(|b| b["text"].as_str())
                    .unwrap_or_default(),
                _ => "",
            };
            match stable_cut::continue_final_message(&prompt, text) {
                Some(cut) if !text.trim().is_empty() => cut.to_owned(),
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "continue_final_message is set but the final message does not appear in the chat after applying the chat template".into(),
                    );
                }
            }
        }
        _ => prompt,
    };
    let tokens = ids(&prompt);
    s.engine.count_tokenized(tokens.len());
    if sglang {
        return axum::Json(
            json!({"tokens": tokens, "count": tokens.len(), "max_model_len": MAX_MODEL_LEN}),
        )
        .into_response();
    }
    let strs = want_strs.then(|| s.engine.tokenizer().strs(prompt.as_bytes()));
    axum::Json(json!({"count": tokens.len(), "max_model_len": MAX_MODEL_LEN, "tokens": tokens, "token_strs": strs}))
        .into_response()
}

/// vLLM's `POST /reset_prefix_cache` (a dev-mode endpoint there): drops every cached block and
/// publishes `AllBlocksCleared`. While a request runs nothing changes and it answers 409 (vLLM
/// logs the failure and answers 200).
async fn reset_prefix_cache(State(s): State<Sim>) -> Response {
    if s.engine.reset_prefix_cache() {
        StatusCode::OK.into_response()
    } else {
        error(
            StatusCode::CONFLICT,
            "prefix cache not reset: some blocks are still in use by running requests".into(),
        )
    }
}

fn error(status: StatusCode, message: String) -> Response {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    (
        status,
        axum::Json(json!({"error": {"message": message, "type": kind, "code": status.as_u16()}})),
    )
        .into_response()
}

fn max_tokens(body: &Value, default: usize) -> usize {
    ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .map_or(default, |n| n as usize)
        .clamp(1, 1 << 20)
}

/// A decode sim's remote prefill, when the request names a peer: `Ok(None)` when there is none
/// (prefill locally), `Ok(Some(_))` once the peer has prefilled, or the error answer.
async fn prefill_remotely(
    s: &Sim,
    api: Api,
    path: &str,
    headers: &HeaderMap,
    request: &Value,
) -> Result<Option<pd::Prefilled>, Response> {
    let (Some(client), Some(metrics)) = (&s.prefill_client, s.engine.pd_metrics()) else {
        return Ok(None);
    };
    let Some(peer) = pd::peer(headers) else {
        return Ok(None);
    };
    let result = match peer {
        Ok(peer) => pd::remote_prefill(client, &peer, path, &pd::prefill_body(api, request)).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(prefilled) => {
            metrics.count(Outcome::Ok);
            Ok(Some(prefilled))
        }
        Err(e) => {
            metrics.count(e.outcome);
            let status = if e.outcome == Outcome::BadHeader {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::BAD_GATEWAY
            };
            Err(error(status, e.message))
        }
    }
}

async fn infer(State(s): State<Sim>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let Some(api) = Api::from_path(uri.path()) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no route for {}", uri.path()),
        );
    };
    let value: Value = prefix_picker::lenient_json::parse_value(&body).unwrap_or(Value::Null);
    // A Messages request is served as the chat request vLLM turns it into.
    let served = match api {
        Api::Messages => {
            Bytes::from(serde_json::to_vec(&messages::chat_body(&value)).expect("JSON serializes"))
        }
        _ => body.clone(),
    };
    let (request, prompt) = match prompt_of(&s, &served) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if !s.config.serves(&request.model) {
        return error(
            StatusCode::NOT_FOUND,
            format!("The model `{}` does not exist.", request.model),
        );
    }
    let n_out = max_tokens(&value, s.config.default_max_tokens);
    let include_usage = value
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let n = s.requests.fetch_add(1, Ordering::Relaxed);
    let answer = (api == Api::Messages).then(|| match messages::tool_call(&value) {
        Some((name, key)) => Answer::ToolUse {
            name,
            key,
            id: format!("toolu_sim_{}_{n}", s.config.name),
        },
        None => Answer::Text,
    });
    let prompt = prompt.as_deref().unwrap_or("");
    let prefilled = match prefill_remotely(&s, api, uri.path(), &headers, &value).await {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let mut rng = SmallRng::seed_from_u64(s.config.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let words = (0..n_out)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect();
    // A decode engine's clock starts when the request reaches it, after the remote prefill.
    let started = Instant::now();
    let running = match s
        .engine
        .request(&request.model, prompt.as_bytes(), prefilled.is_some())
        .await
    {
        Ok(running) => running,
        // vLLM answers a prompt longer than it can hold with a 400 too.
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let adapter = s.config.lora_adapters.contains(&request.model);
    let generation = Generation {
        _lora: s
            .lora
            .as_ref()
            .filter(|_| adapter)
            .map(|l| l.start(&request.model)),
        api,
        model: request.model.clone(),
        id: format!("sim-{}-{n}", s.config.name),
        running,
        prompt: prompt.to_string(),
        template: s.engine.config().chat_template,
        words,
        n_out,
        include_usage,
        started,
        answer,
    };
    let mut served_by = vec![("x-served-by", s.config.name.clone())];
    if let Some(peer) = prefilled.and_then(|p| p.served_by) {
        served_by.push(("x-prefilled-by", peer));
    }
    let served_by = AppendHeaders(served_by);
    if request.stream {
        let body = Body::from_stream(generation.sse());
        return (
            served_by,
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response();
    }
    let reply = generation.complete().await;
    (served_by, axum::Json(reply)).into_response()
}

struct Generation {
    /// An adapter request counts in `vllm:lora_requests_info` until the answer is done.
    _lora: Option<crate::lora::LoraGuard>,
    api: Api,
    model: String,
    id: String,
    running: Running,
    /// The rendered prompt, which the output's cached blocks continue.
    prompt: String,
    /// The engine's chat template (how an answer continues a chat prompt).
    template: ChatTemplate,
    /// The output, one word per output token.
    words: Vec<&'static str>,
    n_out: usize,
    include_usage: bool,
    started: Instant,
    /// A Messages request's answer (text or a tool call).
    answer: Option<Answer>,
}

impl Generation {
    fn text(&self) -> String {
        self.words.join(" ")
    }

    /// Once the first token is out, the output's blocks are taken, held until the request
    /// ends and then left cached, as an engine does while it decodes (here all at once): a
    /// follow-up that re-sends the answer can hit them, and long answers churn the cache. A
    /// chat or Responses answer continues the prompt as its next turn renders it (the rendered
    /// prompt has no generation prompt: the assistant header is part of the continuation); a
    /// completion, with the text alone.
    fn hold_output(&mut self) {
        let text = self.text();
        let continuation = match self.api {
            Api::Completions => text,
            Api::ChatCompletions | Api::Responses | Api::Messages => {
                self.template.assistant_turn(&text)
            }
        };
        self.running
            .hold_output(&self.model, &self.prompt, &continuation, self.n_out);
    }

    fn usage(&self) -> Value {
        let a = self.running.admission();
        let cached = self.running.cached_tokens();
        json!({
            "prompt_tokens": a.prompt_tokens,
            "completion_tokens": self.n_out,
            "total_tokens": a.prompt_tokens + self.n_out,
            "prompt_tokens_details": {"cached_tokens": cached},
            "input_tokens": a.prompt_tokens,
            "output_tokens": self.n_out,
            "input_tokens_details": {"cached_tokens": cached},
        })
    }

    /// A Messages answer's usage, as Anthropic accounts it.
    fn messages_usage(&self) -> Value {
        let prompt = self.running.admission().prompt_tokens;
        messages::usage(prompt, self.running.cached_tokens(), self.n_out)
    }

    /// A Messages answer: the `message`, its content empty while it streams.
    fn message(&self, content: Vec<Value>, stop_reason: Option<&str>) -> Value {
        json!({"id": format!("msg_{}", self.id), "type": "message", "role": "assistant",
            "model": self.model, "content": content, "stop_reason": stop_reason,
            "stop_sequence": null, "usage": self.messages_usage()})
    }

    async fn complete(mut self) -> Value {
        self.running.prefill().await;
        self.running.observe_ttft(self.started.elapsed());
        self.hold_output();
        let itl = self.running.inter_token();
        self.running.decode(self.n_out - 1).await;
        for _ in 1..self.n_out {
            self.running.observe_itl(itl);
        }
        let text = self.text();
        let usage = self.usage();
        let (id, model) = (&self.id, &self.model);
        if let Some(answer) = &self.answer {
            return self.message(vec![answer.block(&text)], Some(answer.stop_reason()));
        }
        match self.api {
            Api::Completions => json!({"id": id, "object": "text_completion", "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}),
            Api::ChatCompletions => json!({"id": id, "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage}),
            Api::Responses | Api::Messages => {
                json!({"id": id, "object": "response", "model": model, "status": "completed",
                "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
                "usage": usage})
            }
        }
    }

    fn chunk(&self, text: &str, last: bool) -> Value {
        let (id, model) = (&self.id, &self.model);
        let finish = if last { json!("length") } else { Value::Null };
        let mut v = match self.api {
            Api::Completions => json!({"id": id, "object": "text_completion", "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}]}),
            Api::ChatCompletions => {
                json!({"id": id, "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
            }
            Api::Responses | Api::Messages => {
                json!({"type": "response.output_text.delta", "delta": text})
            }
        };
        if last && self.api == Api::Responses {
            v = json!({"type": "response.completed", "response": {"id": id, "model": model, "usage": self.usage()}});
        }
        v
    }

    /// vLLM's last chunk of a stream with `include_usage`: no choices, the usage.
    fn usage_chunk(&self) -> Value {
        let object = match self.api {
            Api::ChatCompletions => "chat.completion.chunk",
            _ => "text_completion",
        };
        json!({"id": self.id, "object": object, "model": self.model, "choices": [], "usage": self.usage()})
    }

    /// SSE events: the first token after TTFT, then one per inter-token latency, the usage chunk
    /// if asked for, then `[DONE]`.
    fn sse(self) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        futures_util::stream::unfold((self, 0usize), |(mut g, i)| async move {
            if i > g.n_out + 1 || (g.answer.is_some() && i >= g.n_out) {
                return None;
            }
            if i == g.n_out {
                // The usage chunk, when asked for (never for the Responses API, whose last
                // event already carries it).
                if g.include_usage && g.api != Api::Responses {
                    let event = format!("data: {}\n\n", g.usage_chunk());
                    return Some((Ok(Bytes::from(event)), (g, i + 1)));
                }
            }
            if i >= g.n_out {
                let done = g.n_out + 2;
                return Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (g, done)));
            }
            if i == 0 {
                g.running.prefill().await;
                g.running.observe_ttft(g.started.elapsed());
                g.hold_output();
            } else {
                let itl = g.running.inter_token();
                g.running.decode(1).await;
                g.running.observe_itl(itl);
            }
            let word = g.words[i];
            let text = if i == 0 {
                word.to_string()
            } else {
                format!(" {word}")
            };
            if let Some(answer) = &g.answer {
                let (message, usage) = (g.message(vec![], None), g.messages_usage());
                let events = messages::token_events(answer, &message, &usage, &text, i, g.n_out);
                return Some((Ok(Bytes::from(events)), (g, i + 1)));
            }
            let event = g.chunk(&text, i + 1 == g.n_out);
            let bytes = Bytes::from(format!("data: {event}\n\n"));
            Some((Ok(bytes), (g, i + 1)))
        })
    }
}
