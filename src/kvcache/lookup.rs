//! kvcache-aware's lookup before routing: the prompt's engine tokens and who holds its blocks.
//!
//! [`KvLookup::prepare`] reads what it needs of the request at once (model, chat messages or
//! text prompt, the candidates' addresses) and returns an owned future that the ext_proc stream
//! awaits before it routes:
//!
//! 1. tokenize on a candidate chosen round-robin (Kthena: at random), at
//!    `vllmTokenizerPort`/`sglangTokenizerPort` on the pod's IP, with Kthena's bodies: chat
//!    `messages` with `add_generation_prompt: true` and without special tokens, a text prompt
//!    with them ([`crate::tokenizer`]); answers are cached;
//! 2. cut into standardized block hashes ([`crate::scheduler::kvcache_aware::block_hashes`]);
//! 3. one pipelined `HGETALL` per block key on the shared connection ([`super::KvStore`]).
//!
//! The whole lookup has [`DEADLINE`]: Kthena allows 5 s for Redis (and 5 s plus a retry for the
//! tokenizer), but Envoy waits on this stream for the pick (the shipped examples'
//! `message_timeout` is 5 s, the fail-open one's 0.2 s), so a lookup that is not done in time is
//! abandoned and the request is routed without the plugin's score (counted `deadline`). Every
//! failure is counted ([`LookupResult`]) and routes the request without the score; none fails it.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::KvStore;
use crate::metrics::kvcache::{KvCacheMetrics, LookupResult};
use crate::request::Api;
use crate::scheduler::kvcache_aware::{
    KvBlockOwners, KvCacheAwareArgs, StdBlockHash, block_hashes, block_key,
};
use crate::tokenizer::{EngineKind, EngineTokenizer, TokenizeInput, Tokens};

/// The lookup's whole budget (tokenize + Redis), below the fail-open example's 0.2 s
/// `message_timeout`.
pub const DEADLINE: Duration = Duration::from_millis(150);
/// One tokenize call's timeout (within [`DEADLINE`]).
pub const TOKENIZE_TIMEOUT: Duration = Duration::from_millis(100);

/// The lookup's shared parts (one per router).
pub struct KvLookup {
    store: KvStore,
    tokenizer: EngineTokenizer,
    engine: EngineKind,
    metrics: KvCacheMetrics,
    next_pod: AtomicU64,
}

impl std::fmt::Debug for KvLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvLookup")
            .field("store", &self.store)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

/// What the stream awaits.
pub type Pending = std::pin::Pin<Box<dyn Future<Output = Option<KvBlockOwners>> + Send>>;

/// The prompt as Kthena's tokenizer manager sends it, owned by the lookup.
enum PromptText {
    /// Chat messages (and tools) as the client's raw JSON.
    Chat {
        messages: String,
        tools: Option<String>,
    },
    Text(String),
}

/// What the lookup reads of a request body.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

impl KvLookup {
    pub fn new(
        store: KvStore,
        tokenizer: EngineTokenizer,
        engine: EngineKind,
        metrics: KvCacheMetrics,
    ) -> KvLookup {
        KvLookup {
            store,
            tokenizer,
            engine,
            metrics,
            next_pod: AtomicU64::new(0),
        }
    }

    /// The lookup for a request to `path` with `body`; `pods` gives the addresses of a model's
    /// candidates. `None` when the request has nothing to look up (not an inference API, a body
    /// that does not parse, no model).
    pub fn prepare(
        self: &Arc<Self>,
        args: KvCacheAwareArgs,
        path: &str,
        body: &[u8],
        pods: impl FnOnce(&str) -> Vec<IpAddr>,
    ) -> Option<Pending> {
        let api = Api::from_path(path)?;
        let parsed: Body<'_> = serde_json::from_slice(body).ok()?;
        let model = parsed.model.filter(|m| !m.is_empty())?;
        let prompt = match (api, parsed.messages, parsed.prompt) {
            (Api::ChatCompletions, Some(m), _) if m.get().starts_with('[') => {
                Some(PromptText::Chat {
                    messages: m.get().to_string(),
                    tools: parsed.tools.map(|t| t.get().to_string()),
                })
            }
            (Api::Completions, _, Some(p)) => serde_json::from_str::<String>(p.get())
                .ok()
                .filter(|p| !p.is_empty())
                .map(PromptText::Text),
            _ => None,
        };
        let pods = pods(&model);
        let this = self.clone();
        Some(Box::pin(async move {
            this.metrics.touch_model(&model);
            let result = tokio::time::timeout(DEADLINE, this.run(args, &model, prompt, pods)).await;
            let result = result.unwrap_or(Err(LookupResult::Deadline));
            match result {
                Ok(owners) => {
                    this.metrics.count(&model, LookupResult::Ok);
                    Some(owners)
                }
                Err(why) => {
                    this.metrics.count(&model, why);
                    if why != LookupResult::NoPrompt {
                        tracing::warn!(
                            model,
                            result = why.as_str(),
                            "kvcache-aware: no score for this request"
                        );
                    }
                    None
                }
            }
        }))
    }

    /// Tokenize, cut into block hashes, ask Redis who holds each block.
    async fn run(
        &self,
        args: KvCacheAwareArgs,
        model: &str,
        prompt: Option<PromptText>,
        pods: Vec<IpAddr>,
    ) -> Result<KvBlockOwners, LookupResult> {
        let tokens = self.tokenize(&args, model, prompt, pods).await?;
        let hashes = block_hashes(
            tokens.as_slice(),
            args.block_size_to_hash,
            args.max_blocks_to_match,
        );
        tracing::debug!(target: "scores", "KVCacheAware.Score: generated {} block hashes from {} tokens (blockSize={})",
            hashes.len(), tokens.as_slice().len(), args.block_size_to_hash);
        if hashes.is_empty() {
            return Err(LookupResult::NoPrompt);
        }
        let owners = self.owners(model, &hashes).await?;
        Ok(KvBlockOwners { hashes, owners })
    }

    /// The prompt's engine tokens, asked of the next candidate in turn.
    async fn tokenize(
        &self,
        args: &KvCacheAwareArgs,
        model: &str,
        prompt: Option<PromptText>,
        pods: Vec<IpAddr>,
    ) -> Result<Tokens, LookupResult> {
        let prompt = prompt.ok_or(LookupResult::NoPrompt)?;
        if pods.is_empty() {
            return Err(LookupResult::NoTokenizer);
        }
        let pod = pods[self.next_pod.fetch_add(1, Ordering::Relaxed) as usize % pods.len()];
        let port = match self.engine {
            EngineKind::Vllm => args.vllm_tokenizer_port,
            EngineKind::Sglang => args.sglang_tokenizer_port,
        };
        let input = match &prompt {
            PromptText::Chat { messages, tools } => {
                TokenizeInput::chat(messages, tools.as_deref()).with_generation_prompt(true)
            }
            PromptText::Text(text) => TokenizeInput::text(text),
        };
        let started = Instant::now();
        let tokens = self
            .tokenizer
            .tokenize(pod, port, self.engine, model, &input)
            .await;
        let took = started.elapsed();
        tracing::debug!(target: "scores", "KVCacheAware.Score: tokenization took {:?}, tokens={}, err={:?}",
            took, tokens.as_ref().map_or(0, |t| t.as_slice().len()), tokens.as_ref().err().map(ToString::to_string));
        let tokens = tokens.map_err(|_| LookupResult::TokenizeError)?;
        self.metrics
            .tokenize_duration
            .with_label_values(&[self.metrics.models.label(model)])
            .observe(took.as_secs_f64());
        Ok(tokens)
    }

    /// Each block's holders (pod -> timestamp), one pipelined `HGETALL` per block key.
    async fn owners(
        &self,
        model: &str,
        hashes: &[StdBlockHash],
    ) -> Result<Vec<Vec<(String, String)>>, LookupResult> {
        let mut conn = self
            .store
            .connection()
            .ok_or(LookupResult::RedisUnavailable)?;
        let mut pipe = redis::pipe();
        for h in hashes {
            pipe.cmd("HGETALL").arg(block_key(model, *h));
        }
        let started = Instant::now();
        let replies: Result<Vec<Vec<(String, String)>>, redis::RedisError> =
            pipe.query_async(&mut conn).await;
        let took = started.elapsed();
        let owners = match replies {
            Ok(o) if o.len() == hashes.len() => o,
            Ok(o) => {
                tracing::warn!(
                    "KVCacheAware.Score: Redis query failed after {took:?}: {} replies to {} commands",
                    o.len(),
                    hashes.len()
                );
                return Err(LookupResult::RedisError);
            }
            Err(e) => {
                tracing::warn!("KVCacheAware.Score: Redis query failed after {took:?}: {e}");
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.store.failed();
                }
                return Err(LookupResult::RedisError);
            }
        };
        self.metrics
            .redis_duration
            .with_label_values(&[self.metrics.models.label(model)])
            .observe(took.as_secs_f64());
        tracing::debug!(target: "scores", "KVCacheAware.Score: Redis query took {:?}, blocksWithHits={}/{}",
            took, owners.iter().filter(|o| !o.is_empty()).count(), hashes.len());
        Ok(owners)
    }
}
