//! The engine's own tokenizer, asked over HTTP: a prompt -> the token ids a model-server pod
//! would compute for it (so that prompts can be matched against the engine's KV-cache events in
//! the engine's tokens).
//!
//! [`EngineTokenizer::tokenize`] posts the prompt to `http://<pod>:<port>/tokenize` (vLLM and
//! SGLang both serve it; [`TokenizeInput::body`] states the bodies, which follow Kthena's
//! router) and reads `tokens` from the answer. The caller picks the pod and passes its engine
//! kind and port ([`EngineKind::default_port`]: vLLM 8000, SGLang 30000).
//!
//! Knobs ([`TokenizerConfig`]):
//! - `timeout` (default 50 ms): the whole call, connect to last body byte. Routing waits on it,
//!   so a slow engine costs a prefix match, never a request's latency beyond this.
//! - `max_tokens` (default 256 Ki) and `max_body_bytes` (default 4 MiB): an answer over either
//!   is an error; the body is read under the limit, so memory stays bounded whatever the engine
//!   sends. Garbage is an error, never a panic.
//! - `cache_entries` (default 4096) and `cache_tokens` (default 4 Mi, 16 MiB of ids): the answer
//!   cache, keyed by an xxh3-64 digest of (engine kind, model, the input's exact bytes, flags);
//!   not of the pod, since every pod of a model tokenizes alike. A digest collision (odds 2^-64
//!   per pair) would only cost match quality. CLOCK eviction over 1 to 16 shards, no global
//!   lock on the hit path; concurrent calls for one key share one HTTP call (single-flight),
//!   made by a spawned task so that a cancelled caller does not cancel the others.
//!
//! Errors are not cached: a retry asks the engine again. A dead engine answers fast (connection
//! refused) or within the timeout, and in-flight sharing bounds concurrent calls per input to
//! one; backing off from a failing pod is the caller's choice (it sees [`ErrorKind`]).
//! [`TokenizerStats`] counts calls, hits, errors by kind and call latencies, for the integrator
//! to export.
//!
//! The `file` source computes the same ids in process instead ([`file::FileSource`]: a
//! `tokenizer.json` and the model's chat template, [`chat_template`]); [`heads`] runs either
//! source off the request path.

mod cache;
#[cfg(feature = "tokenizer-file")]
pub mod chat_template;
#[cfg(feature = "tokenizer-file")]
pub mod file;
pub mod heads;
mod input;
pub mod known_prefix;
pub mod messages;
mod response;
mod stats;

#[cfg(test)]
mod tests;

use std::error::Error as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use thiserror::Error;

use cache::{Cache, Found, SharedCall};
use response::BadAnswer;

pub use crate::metrics::engine_truth::TokenizeErrorKind as ErrorKind;
pub use input::{EngineKind, InvalidInput, Prompt, TokenizeInput};
pub use stats::{LATENCY_BUCKETS, TokenizerStats};

/// Bytes of an error body kept in [`TokenizeError::Status`].
const SNIPPET_BYTES: usize = 256;

/// Token ids, cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens(Arc<[u32]>);

impl Tokens {
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }
}

impl Deref for Tokens {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.0
    }
}

impl From<Vec<u32>> for Tokens {
    fn from(ids: Vec<u32>) -> Tokens {
        Tokens(Arc::from(ids))
    }
}

/// Why a prompt could not be tokenized; each names the call and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TokenizeError {
    #[error("tokenize call to {url} timed out after {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("tokenize call to {url}: connection refused")]
    ConnectionRefused { url: String },
    #[error("tokenize call to {url} failed: {message}")]
    Transport { url: String, message: String },
    #[error("tokenize call to {url} answered HTTP {status}: {snippet:?}")]
    Status {
        url: String,
        status: u16,
        snippet: String,
    },
    #[error("tokenize call to {url} answered a body over the limit of {limit} bytes")]
    BodyTooLarge { url: String, limit: usize },
    #[error("tokenize call to {url} answered {count} tokens, over the limit of {limit}")]
    TooManyTokens {
        url: String,
        count: usize,
        limit: usize,
    },
    #[error("tokenize call to {url} answered malformed JSON ({message}): {snippet:?}")]
    Malformed {
        url: String,
        message: String,
        snippet: String,
    },
    #[error("cannot tokenize this request: {0}")]
    InvalidInput(#[from] InvalidInput),
    #[error("the tokenizer {path} cannot render this chat: {message}")]
    Template { path: String, message: String },
    #[error("the tokenizer {path} cannot encode this prompt: {message}")]
    Encode { path: String, message: String },
}

impl TokenizeError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            TokenizeError::Timeout { .. } => ErrorKind::Timeout,
            TokenizeError::ConnectionRefused { .. } => ErrorKind::ConnectionRefused,
            TokenizeError::Transport { .. } => ErrorKind::Transport,
            TokenizeError::Status { .. } => ErrorKind::Status,
            TokenizeError::BodyTooLarge { .. } => ErrorKind::BodyTooLarge,
            TokenizeError::TooManyTokens { .. } => ErrorKind::TooManyTokens,
            TokenizeError::Malformed { .. } => ErrorKind::Malformed,
            TokenizeError::InvalidInput(_) => ErrorKind::InvalidInput,
            TokenizeError::Template { .. } => ErrorKind::Template,
            TokenizeError::Encode { .. } => ErrorKind::Encode,
        }
    }
}

/// The tokenizer's settings (see the module header for each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerConfig {
    pub timeout: Duration,
    pub max_tokens: usize,
    pub max_body_bytes: usize,
    pub cache_entries: usize,
    pub cache_tokens: usize,
}

impl Default for TokenizerConfig {
    fn default() -> TokenizerConfig {
        TokenizerConfig {
            timeout: Duration::from_millis(50),
            max_tokens: 256 * 1024,
            max_body_bytes: 4 * 1024 * 1024,
            cache_entries: 4096,
            cache_tokens: 4 * 1024 * 1024,
        }
    }
}

/// A [`TokenizerConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidTokenizerConfig {
    #[error("tokenizer timeout must be more than zero")]
    ZeroTimeout,
    #[error("tokenizer max_tokens must be more than zero")]
    ZeroMaxTokens,
    #[error("tokenizer max_body_bytes {0} is too small for any answer (minimum 16)")]
    TinyBody(usize),
    #[error("cannot build the tokenizer's HTTP client: {0}")]
    Client(String),
}

/// Asks engines to tokenize prompts, with a cache; cheap to clone (one pool, cache and stats).
#[derive(Clone)]
pub struct EngineTokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    config: TokenizerConfig,
    cache: Cache,
    stats: TokenizerStats,
}

impl EngineTokenizer {
    pub fn new(config: TokenizerConfig) -> Result<EngineTokenizer, InvalidTokenizerConfig> {
        if config.timeout.is_zero() {
            return Err(InvalidTokenizerConfig::ZeroTimeout);
        }
        if config.max_tokens == 0 {
            return Err(InvalidTokenizerConfig::ZeroMaxTokens);
        }
        if config.max_body_bytes < 16 {
            return Err(InvalidTokenizerConfig::TinyBody(config.max_body_bytes));
        }
        let client = reqwest::Client::builder()
            // Pod IPs are reached directly, never through a proxy from the environment.
            .no_proxy()
            // A small request on a kept-alive connection: never let Nagle + delayed ACK add 40 ms.
            .tcp_nodelay(true)
            .build()
            .map_err(|e| InvalidTokenizerConfig::Client(e.to_string()))?;
        Ok(EngineTokenizer {
            inner: Arc::new(Inner {
                client,
                cache: Cache::new(config.cache_entries, config.cache_tokens),
                config,
                stats: TokenizerStats::default(),
            }),
        })
    }

    pub fn config(&self) -> &TokenizerConfig {
        &self.inner.config
    }

    pub fn stats(&self) -> &TokenizerStats {
        &self.inner.stats
    }

    /// Answers cached now and the tokens they hold.
    pub fn cached(&self) -> (usize, usize) {
        self.inner.cache.size()
    }

    /// The token ids of `input` as the `kind` engine at `pod:port` serving `model` computes
    /// them: from the cache, from a call in flight for the same input, or from a new call.
    pub async fn tokenize(
        &self,
        pod: IpAddr,
        port: u16,
        kind: EngineKind,
        model: &str,
        input: &TokenizeInput<'_>,
    ) -> Result<Tokens, TokenizeError> {
        let stats = &self.inner.stats;
        stats.requests.fetch_add(1, Relaxed);
        let key = input.cache_key(kind, model);
        let found = match self.inner.cache.lookup(key) {
            Some(found) => found,
            None => {
                let body = input.body(kind, model).inspect_err(|_| {
                    stats.error(ErrorKind::InvalidInput);
                })?;
                let url = format!(
                    "http://{}{}",
                    SocketAddr::new(pod, port),
                    EngineKind::TOKENIZE_PATH
                );
                match self
                    .inner
                    .cache
                    .lead_or_join(key, || self.start(key, url, body))
                {
                    Ok(call) => return call.await,
                    Err(found) => found,
                }
            }
        };
        match found {
            Found::Hit(tokens) => {
                stats.cache_hits.fetch_add(1, Relaxed);
                Ok(tokens)
            }
            Found::Join(call) => {
                stats.joined.fetch_add(1, Relaxed);
                call.await
            }
        }
    }

    /// Spawns the call for `key`; it caches its own answer, so it completes even if every
    /// caller gave up.
    fn start(&self, key: u64, url: String, body: Vec<u8>) -> SharedCall {
        let inner = Arc::clone(&self.inner);
        let task_url = url.clone();
        let task = tokio::spawn(async move {
            let mut slot = CallSlot {
                inner: Arc::clone(&inner),
                key,
                armed: true,
            };
            let url = task_url;
            inner.stats.calls.fetch_add(1, Relaxed);
            let started = Instant::now();
            let timeout = inner.config.timeout;
            let result = match tokio::time::timeout(timeout, call(&inner, &url, body)).await {
                Ok(result) => result,
                Err(_elapsed) => Err(TokenizeError::Timeout { url, timeout }),
            };
            inner.stats.call_took(started.elapsed());
            if let Err(e) = &result {
                inner.stats.error(e.kind());
            }
            let evicted = inner.cache.complete(key, &result);
            slot.armed = false;
            inner.stats.evictions.fetch_add(evicted, Relaxed);
            result
        });
        async move {
            task.await.unwrap_or_else(|e| {
                Err(TokenizeError::Transport {
                    url,
                    message: format!("the tokenize task ended: {e}"),
                })
            })
        }
        .boxed()
        .shared()
    }
}

/// A call's pending slot in the cache while its task runs: a task that ends without completing
/// it (a panic) abandons it as it unwinds, so later requests for the key call again instead of
/// joining a call that never answers.
struct CallSlot {
    inner: Arc<Inner>,
    key: u64,
    armed: bool,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        if self.armed {
            self.inner.cache.abandon(self.key);
        }
    }
}

/// One HTTP call: post, check the status, read the body under its limit, parse.
async fn call(inner: &Inner, url: &str, body: Vec<u8>) -> Result<Tokens, TokenizeError> {
    let config = &inner.config;
    let mut response = inner
        .client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| transport(url, &e))?;
    let status = response.status();
    if !status.is_success() {
        // The head of the body says why; a failure to read it is not the error to report.
        let head = read_body(&mut response, SNIPPET_BYTES)
            .await
            .unwrap_or_else(|partial| partial);
        return Err(TokenizeError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
            snippet: response::snippet(&head, SNIPPET_BYTES),
        });
    }
    let too_large = || TokenizeError::BodyTooLarge {
        url: url.to_owned(),
        limit: config.max_body_bytes,
    };
    if response
        .content_length()
        .is_some_and(|n| n > config.max_body_bytes as u64)
    {
        return Err(too_large());
    }
    let bytes = match read_body(&mut response, config.max_body_bytes).await {
        Ok(bytes) if bytes.len() > config.max_body_bytes => return Err(too_large()),
        Ok(bytes) => bytes,
        Err(_) => {
            return Err(TokenizeError::Transport {
                url: url.to_owned(),
                message: "the answer's body broke off".to_owned(),
            });
        }
    };
    response::parse(&bytes, config.max_tokens).map_err(|bad| match bad {
        BadAnswer::TooManyTokens(count) => TokenizeError::TooManyTokens {
            url: url.to_owned(),
            count,
            limit: config.max_tokens,
        },
        BadAnswer::Malformed(message) => TokenizeError::Malformed {
            url: url.to_owned(),
            message,
            snippet: response::snippet(&bytes, SNIPPET_BYTES),
        },
    })
}

/// The body, stopping once more than `limit` bytes came (the result is then longer than
/// `limit`); `Err` holds what came before a transport error.
async fn read_body(response: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, Vec<u8>> {
    let mut bytes = Vec::new();
    while bytes.len() <= limit {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(_) => return Err(bytes),
        }
    }
    Ok(bytes)
}

/// A failed send, with connection refused told apart (the engine is not listening).
fn transport(url: &str, e: &reqwest::Error) -> TokenizeError {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return TokenizeError::ConnectionRefused {
                url: url.to_owned(),
            };
        }
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    TokenizeError::Transport {
        url: url.to_owned(),
        message,
    }
}
