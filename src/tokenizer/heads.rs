//! Engine tokens of prompt heads, for the affinity mode's match on engine truth, with no
//! tokenizer hop on the request path.
//!
//! A prompt's *heads* are its rendered text up to each message boundary (the end of each
//! `<|im_end|>\n` of the ChatML rendering; a completion prompt has one, its whole text). Each
//! head is keyed by an xxh3 digest of the model and its bytes. A request looks its heads up,
//! longest first, in a bounded in-process map ([`HeadTokens::find`]): found, the pods with live
//! engine views are matched by those tokens; not found, the request is matched by the estimate.
//! Either way one head longer than the one found is queued for the engine's tokenizer
//! ([`HeadTokens::run`], in the background): for a conversation's turn (a prompt that holds an
//! assistant reply) its whole prompt, which the next turn shares and the engine holds whole;
//! for any other request the head without its last message, which the tenant's next question
//! shares; and either when it was seen before. The engine renders the messages with its own
//! chat template (`tools` included); a head is asked with `add_generation_prompt: false`, the
//! whole prompt with `true`, as it is served.
//!
//! Only what matters to a match is tokenized: the engines hold full blocks of what they were
//! sent, a request's longest shareable part is a head another request sent before, and past a
//! head the engine holds whole the estimate speaks (the scheduler's `combine`). A head that
//! ends with a reply is not held whole (the engine stored the reply as it generated it, not as
//! the template renders it), so a turn's head before its last message would cut the engine's
//! match short of the previous turn's prompt: one call per turn, not two, and none per request
//! of a tenant whose shared head is known. A
//! request whose rendering does not split into one head per message (a content that contains
//! the ChatML end marker, skipped messages, a top-level `system`) is not queued. A Messages
//! request's heads are its chat form's messages ([`super::messages`]), asked as a chat request's.
//!
//! *Cut heads* carry the match inside the last message (a document, examples, a tool result
//! that later requests share up to somewhere in it): its text cut at each stable cut
//! ([`crate::prompt::stable_cut`], near every 512th byte), looked up like the heads. Unless the
//! whole prompt is queued, the longest cut seen before is: asked of vLLM with the text cut
//! there and `continue_final_message`, of either engine as text for a completion, and only
//! when the body's text is the rendered one (a digest of it travels with the fill).
//!
//! With `source: file` the same heads are tokenized in process instead, by a `tokenizer.json`
//! and its model's chat template ([`super::file::FileSource`], on blocking threads, a few at a
//! time): no call to any pod, and only the text past the longest prefix it tokenized before is
//! encoded ([`super::known_prefix`]). A completion whose cut is known is asked of an engine from
//! that cut on, without special tokens, and joined to the cut's tokens (one join in
//! `CHECK_JOIN_EVERY` (256) is asked whole too; a difference turns joins off). A chat asked of an
//! engine is asked whole: the engine renders it with its own template. `tokenized_tokens`
//! counts the tokens a tokenizer computed. The request path stays a lookup either way (a head tokenized
//! inline would cost a miss the whole prompt's tokenization: docs/benchmarks.md, "Tokenization
//! per request").
//!
//! Knobs (`picker.tokenizer`): `source` (`engine` | `file`), `engine` (`vllm` | `sglang`: the
//! body of the call), `port` (default: the pod's serving port), `timeoutMs` (50), `path` (the
//! `file` source's `tokenizer.json`; `tokenizer_config.json` or `chat_template.jinja` beside it
//! give the chat template), `cacheEntries` (heads kept, 65 536), `cacheTokens` (their tokens,
//! 16 Mi: 64 MiB), `queue` (heads waiting to be tokenized, 1024, holding at most
//! [`QUEUED_BYTES`] of request bodies; more are dropped, counted).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::messages::MessagesForm;
use super::{EngineKind, EngineTokenizer, Prompt, TokenizeInput, TokenizerConfig, Tokens};
use crate::metrics::engine_truth::{EngineTruthMetrics, HeadOutcome, TOKENIZE_OK};
use crate::prompt::stable_cut::{CUT_SPACING, is_stable_cut, stable_cuts};
use crate::request::Api;

/// The end of a ChatML message in the rendered prompt.
const MESSAGE_END: &[u8] = b"<|im_end|>\n";
/// Shards of the head map (and of the heads seen; at most 32: a request's cuts mark the shards
/// they fall in as bits of a `u32`).
const SHARDS: usize = 16;
const _: () = assert!(SHARDS <= 32);
/// Fills tokenized at once.
const FILLS_AT_ONCE: usize = 8;
/// One completion asked from a known head on in this many (the first included) is asked
/// whole as well, and a difference turns joins off.
const CHECK_JOIN_EVERY: u64 = 256;
/// Request bodies the queue may hold at once (each fill keeps its body until tokenized).
pub const QUEUED_BYTES: usize = 64 << 20;
/// Fills tokenized at once in process (`source: file`): CPU work on blocking threads, kept
/// off most of the cores that serve requests.
#[cfg(feature = "tokenizer-file")]
const FILE_FILLS_AT_ONCE: usize = 2;

/// Where engine tokens come from (`picker.tokenizer.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerSource {
    /// The pod's own `/tokenize`.
    Engine,
    /// A `tokenizer.json` in process (`path`).
    File,
}

/// `picker.tokenizer`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenizerSection {
    pub source: TokenizerSource,
    #[serde(default = "default_engine", deserialize_with = "engine_kind")]
    pub engine: EngineKind,
    /// The tokenizer's port on each pod; `None`: the pod's serving port.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_cache_entries")]
    pub cache_entries: usize,
    /// Tokens the heads kept may hold together.
    #[serde(default = "default_cache_tokens")]
    pub cache_tokens: usize,
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// The `file` source's `tokenizer.json`.
    #[serde(default)]
    pub path: Option<std::path::PathBuf>,
    /// The `file` source, loaded by [`TokenizerSection::load`].
    #[serde(skip)]
    pub file: Option<LoadedFile>,
}

/// A loaded `file` source; two are equal when their files are (a reload compares sections).
#[derive(Debug, Clone)]
pub struct LoadedFile(
    #[cfg(feature = "tokenizer-file")] pub Arc<super::file::FileSource>,
    #[cfg(not(feature = "tokenizer-file"))] std::convert::Infallible,
);

impl PartialEq for LoadedFile {
    fn eq(&self, other: &LoadedFile) -> bool {
        #[cfg(feature = "tokenizer-file")]
        return self.0.digest() == other.0.digest();
        #[cfg(not(feature = "tokenizer-file"))]
        match (self.0, other.0) {}
    }
}

impl Eq for LoadedFile {}

fn default_engine() -> EngineKind {
    EngineKind::Vllm
}
fn default_timeout_ms() -> u64 {
    50
}
fn default_cache_entries() -> usize {
    1 << 16
}
fn default_cache_tokens() -> usize {
    1 << 24
}
fn default_queue() -> usize {
    1024
}

fn engine_kind<'de, D: serde::Deserializer<'de>>(d: D) -> Result<EngineKind, D::Error> {
    match String::deserialize(d)?.as_str() {
        "vllm" => Ok(EngineKind::Vllm),
        "sglang" => Ok(EngineKind::Sglang),
        other => Err(serde::de::Error::custom(format!(
            "engine must be vllm or sglang, got {other:?}"
        ))),
    }
}

impl TokenizerSection {
    /// Loads the `file` source's files (nothing for `engine`); the error names the path. A
    /// chat template that is missing or does not parse is a warning (`Ok(Some)`): chat heads
    /// then fall back to the estimate, counted.
    pub fn load(&mut self) -> Result<Option<String>, String> {
        let (TokenizerSource::File, Some(path)) = (self.source, &self.path) else {
            return Ok(None);
        };
        #[cfg(feature = "tokenizer-file")]
        {
            let source =
                super::file::FileSource::load(path).map_err(|e| format!("tokenizer.path: {e}"))?;
            let warning = source.template_error().map(|e| {
                format!("tokenizer.path: {e}; chat requests are matched by the estimate (docs/tokenizer.md)")
            });
            self.file = Some(LoadedFile(Arc::new(source)));
            Ok(warning)
        }
        #[cfg(not(feature = "tokenizer-file"))]
        Err(format!(
            "tokenizer.source: file needs the tokenizer-file feature, which this build of prefix-picker lacks (tokenizer.path {})",
            path.display()
        ))
    }

    /// Where the tokens come from, for `validate` and the start-up log.
    pub fn describe(&self) -> String {
        match (self.source, &self.path) {
            (TokenizerSource::File, Some(path)) => format!("tokenizer.json {}", path.display()),
            _ => "the pod's /tokenize".to_string(),
        }
    }

    /// The section's errors, naming the key and the value.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        match (self.source, &self.path) {
            (TokenizerSource::File, None) => {
                errors.push(
                    "tokenizer.source: file needs tokenizer.path (a tokenizer.json)".to_string(),
                );
            }
            (TokenizerSource::Engine, Some(path)) => errors.push(format!(
                "tokenizer.path ({}) is read by source: file only, got source: engine",
                path.display()
            )),
            _ => {}
        }
        if self.timeout_ms == 0 {
            errors.push("tokenizer.timeoutMs must be > 0, got 0".to_string());
        }
        if self.cache_entries == 0 || self.cache_tokens == 0 || self.queue == 0 {
            errors.push(format!(
                "tokenizer.cacheEntries, tokenizer.cacheTokens and tokenizer.queue must be > 0, got {}, {} and {}",
                self.cache_entries, self.cache_tokens, self.queue
            ));
        }
        errors
    }
}

/// A head to tokenize: the request body and which of its heads are wanted.
#[derive(Debug)]
struct Fill {
    model: String,
    pod: SocketAddr,
    api: Api,
    body: Vec<u8>,
    /// Messages in the whole prompt (the body must have as many).
    messages: usize,
    heads: Vec<Head>,
    /// A cut head's check: the xxh3 digest of the last message's text up to the cut, as the
    /// router rendered it (the body's text must be the same bytes).
    cut_check: u64,
    /// A completion's longest head known when it was queued (a cut: its tokens end at a stable
    /// cut of this prompt's text): the engine is asked only for the text after it.
    known: Option<HeadFound>,
}

/// The heads a request queues: the head before its last message, its whole prompt, a cut head;
/// and the rendered prompt they are of.
struct Wanted<'a> {
    heads: [Option<Head>; 3],
    prompt: &'a [u8],
    /// A completion's longest head known ([`Fill::known`]).
    known: Option<&'a HeadFound>,
}

impl Wanted<'_> {
    /// The check ([`Fill::cut_check`]) of the cut head among `queued`, 0 when none is: hashed
    /// only for a fill queued, not for a cut that is already pending.
    fn cut_check(&self, queued: &[Head]) -> u64 {
        queued
            .iter()
            .find_map(|h| {
                h.cut
                    .map(|kept| xxh3_64(&self.prompt[h.bytes - kept..h.bytes]))
            })
            .unwrap_or(0)
    }
}

/// A prefix of a rendered prompt whose engine tokens can be asked for: up to a message's end
/// (a *message head*), or cut inside the last message's text at a stable cut
/// ([`crate::prompt::stable_cut`]: a *cut head*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    /// Messages in the head, the cut one included; a completion prompt: 0.
    messages: usize,
    /// xxh3 of the model and the head's rendered bytes.
    digest: u64,
    /// Rendered bytes of the prompt the head covers.
    bytes: usize,
    /// A cut head: bytes of the last message's text kept (of the prompt, for a completion).
    cut: Option<usize>,
}

/// A fill taken from the queue: dropped, its body leaves the queue's bytes and its heads the
/// pending set, whether its tokenization finished or panicked (a panic would otherwise keep
/// its heads from being queued again and its bytes counted for good).
struct Taken {
    heads: Arc<HeadTokens>,
    fill: Fill,
}

impl Taken {
    fn new(heads: &Arc<HeadTokens>, fill: Fill) -> Taken {
        Taken {
            heads: Arc::clone(heads),
            fill,
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.heads.done(&self.fill);
    }
}

/// One shard of the head map: the heads and their tokens together.
#[derive(Debug, Default)]
struct HeadShard {
    heads: HashMap<u64, HeadFound>,
    tokens: usize,
}

/// A request's engine tokens, found.
#[derive(Debug, Clone)]
pub struct HeadFound {
    pub tokens: Tokens,
    /// Bytes of the rendered prompt the tokens cover.
    pub prompt_bytes: usize,
    /// The first of `tokens` that end at a message boundary: all of them for a message head;
    /// for a cut head, those of the longest message head known before its message (0: none).
    pub head_tokens: usize,
}

/// The head map and the queue to the background tokenizer.
#[derive(Debug)]
pub struct HeadTokens {
    section: TokenizerSection,
    shards: Vec<RwLock<HeadShard>>,
    /// Heads queued or being tokenized (not queued twice).
    pending: Mutex<HashSet<u64>>,
    /// Heads seen, by digest, per shard (a repeat is tokenized).
    seen: Vec<Mutex<HashSet<u64>>>,
    /// Bytes of request bodies queued or being tokenized (at most [`QUEUED_BYTES`]).
    queued_bytes: AtomicUsize,
    queue: mpsc::Sender<Fill>,
    receiver: Mutex<Option<mpsc::Receiver<Fill>>>,
    metrics: EngineTruthMetrics,
    /// Completions asked of an engine from a known head on (every [`CHECK_JOIN_EVERY`]th,
    /// the first included, is asked whole too and compared).
    joined: AtomicU64,
    /// A compared join differed: ask every head whole.
    joins_off: AtomicBool,
}

impl HeadTokens {
    pub fn new(section: TokenizerSection, metrics: EngineTruthMetrics) -> HeadTokens {
        let (queue, receiver) = mpsc::channel(section.queue.max(1));
        HeadTokens {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            pending: Mutex::default(),
            seen: (0..SHARDS).map(|_| Mutex::default()).collect(),
            queued_bytes: AtomicUsize::new(0),
            queue,
            receiver: Mutex::new(Some(receiver)),
            metrics,
            joined: AtomicU64::new(0),
            joins_off: AtomicBool::new(false),
            section,
        }
    }

    /// The engine tokens of `prompt`'s longest known head, or `None` (counted, and its heads
    /// queued for tokenizing through `pod`'s engine). `body` is the request body, copied only
    /// when something is queued.
    pub fn find(
        &self,
        model: &str,
        api: Option<Api>,
        prompt: &str,
        body: Option<&[u8]>,
        pod: Option<SocketAddr>,
    ) -> Option<HeadFound> {
        let count = |o: HeadOutcome| {
            self.metrics
                .engine_tokens
                .with_label_values(&[o.as_str()])
                .inc();
        };
        let (Some(api), Some(body), Some(pod)) = (api, body, pod) else {
            count(HeadOutcome::Unsupported);
            return None;
        };
        let (heads, cuts) = self.heads_and_cuts(model, api, prompt.as_bytes());
        let Some(&Head { messages, .. }) = heads.last() else {
            count(HeadOutcome::Unsupported);
            return None;
        };
        let found = self.known_of(&heads, &cuts);
        let found_bytes = found.as_ref().map_or(0, |f| f.prompt_bytes);
        let reply = matches!(api, Api::ChatCompletions | Api::Messages)
            && holds_reply(prompt.as_bytes(), &heads);
        let [head, whole] = self.wanted(&heads, found_bytes, reply);
        // The whole prompt queued covers every cut.
        let cut = whole
            .is_none()
            .then(|| self.wanted_cut(&cuts, found_bytes.max(head.map_or(0, |h| h.bytes))))
            .flatten();
        let wanted = Wanted {
            heads: [head, whole, cut],
            prompt: prompt.as_bytes(),
            known: found.as_ref().filter(|_| api == Api::Completions),
        };
        let queued = self.queue_fill(model, pod, api, body, messages, &wanted);
        match found {
            Some(found) => {
                count(HeadOutcome::Hit);
                Some(found)
            }
            None => {
                count(if queued {
                    HeadOutcome::Miss
                } else {
                    HeadOutcome::Dropped
                });
                None
            }
        }
    }

    /// The heads to tokenize for a request whose longest known head is `found` (a position in
    /// `heads`), of those longer than it: a conversation's turn (`reply`: its prompt holds an
    /// assistant reply) its whole prompt, the head the next turn shares and the engine holds
    /// whole (a head that ends with a reply is not held whole: the engine stored the reply as
    /// it generated it, not as the template renders it); another request the head before its
    /// last message, what the tenant's next question shares. And either, seen before.
    fn wanted(&self, heads: &[Head], found_bytes: usize, reply: bool) -> [Option<Head>; 2] {
        let Some((&whole, before)) = heads.split_last() else {
            return [None, None];
        };
        let head = before
            .last()
            .copied()
            .filter(|h| h.bytes > found_bytes && (!reply || !self.first_sighting(h.digest)));
        let whole = Some(whole)
            .filter(|w| w.bytes > found_bytes && (reply || !self.first_sighting(w.digest)));
        [head, whole]
    }

    /// The cut head to tokenize, of those longer than `covered` bytes: the longest seen before
    /// (a document, examples or a tool result another request sent up to there). Each is
    /// remembered as seen, a shard's cuts in their order under one lock of the shard.
    fn wanted_cut(&self, cuts: &[Head], covered: usize) -> Option<Head> {
        // Cuts are shortest first.
        let cuts = &cuts[cuts.partition_point(|c| c.bytes <= covered)..];
        let shard_of = |c: &Head| (c.digest as usize) % SHARDS;
        let mut shards = cuts.iter().fold(0u32, |mask, c| mask | 1 << shard_of(c));
        let mut longest = None;
        while shards != 0 {
            let shard = shards.trailing_zeros() as usize;
            shards &= shards - 1;
            let mut seen = self.seen[shard].lock();
            for (i, cut) in cuts.iter().enumerate() {
                if shard_of(cut) == shard && !self.sighted(&mut seen, cut.digest) {
                    longest = longest.max(Some(i));
                }
            }
        }
        longest.map(|i| cuts[i])
    }

    /// `prompt`'s message heads and cut heads, shortest first each, hashed in one pass over the
    /// prompt: the digest of a head continues the hash of the heads before it.
    fn heads_and_cuts(&self, model: &str, api: Api, prompt: &[u8]) -> (Vec<Head>, Vec<Head>) {
        let mut heads = message_heads(api, prompt);
        let mut cuts = self.cut_heads(api, prompt, &heads);
        hash_heads(model, prompt, &mut heads, &mut cuts);
        (heads, cuts)
    }

    /// Where `prompt`'s cut heads end, shortest first, their digests not computed yet
    /// ([`hash_heads`]): stable cuts inside its last message's text (its whole text, for a
    /// completion), longer than every message head before it. None for a chat prompt asked of
    /// SGLang, whose `/tokenize` cannot leave a message open.
    fn cut_heads(&self, api: Api, prompt: &[u8], heads: &[Head]) -> Vec<Head> {
        let chat = matches!(api, Api::ChatCompletions | Api::Messages);
        if chat
            && self.section.source == TokenizerSource::Engine
            && self.section.engine != EngineKind::Vllm
        {
            return Vec::new();
        }
        let (start, end, messages) = match (api, heads) {
            (Api::Completions, [whole]) => (0, whole.bytes, 0),
            (_, [.., before, last]) if chat => {
                let Some(text) = memchr::memchr(b'\n', &prompt[before.bytes..last.bytes]) else {
                    return Vec::new();
                };
                (
                    before.bytes + text + 1,
                    last.bytes - MESSAGE_END.len(),
                    last.messages,
                )
            }
            (_, [last]) if chat => {
                let Some(text) = memchr::memchr(b'\n', &prompt[..last.bytes]) else {
                    return Vec::new();
                };
                (text + 1, last.bytes - MESSAGE_END.len(), last.messages)
            }
            _ => return Vec::new(),
        };
        if end <= start + CUT_SPACING {
            return Vec::new();
        }
        stable_cuts(prompt, start, end)
            .map(|q| Head {
                messages,
                digest: 0,
                bytes: q,
                cut: Some(q - start),
            })
            .collect()
    }

    /// Remembers a head's digest; `true` the first time it is seen (a shard that is full
    /// forgets what it saw).
    fn first_sighting(&self, digest: u64) -> bool {
        self.sighted(&mut self.seen[(digest as usize) % SHARDS].lock(), digest)
    }

    /// [`HeadTokens::first_sighting`] in the locked shard `seen` (`digest`'s).
    fn sighted(&self, seen: &mut HashSet<u64>, digest: u64) -> bool {
        if seen.len() >= self.section.cache_entries.div_ceil(SHARDS).max(1) {
            seen.clear();
        }
        seen.insert(digest)
    }

    /// Queues those of `heads` that are not queued yet; `false` when the queue was full.
    fn queue_fill(
        &self,
        model: &str,
        pod: SocketAddr,
        api: Api,
        body: &[u8],
        messages: usize,
        wanted: &Wanted<'_>,
    ) -> bool {
        if wanted.heads.iter().all(Option::is_none) {
            return true;
        }
        let heads: Vec<Head> = {
            let mut pending = self.pending.lock();
            wanted
                .heads
                .iter()
                .flatten()
                .filter(|h| pending.insert(h.digest))
                .copied()
                .collect()
        };
        if heads.is_empty() {
            return true;
        }
        let queued = self.queued_bytes.fetch_add(body.len(), Ordering::Relaxed);
        if queued + body.len() > QUEUED_BYTES {
            self.queued_bytes.fetch_sub(body.len(), Ordering::Relaxed);
            self.forget_pending(&heads);
            return false;
        }
        let fill = Fill {
            model: model.to_string(),
            pod,
            api,
            body: body.to_vec(),
            messages,
            cut_check: wanted.cut_check(&heads),
            heads,
            known: wanted.known.cloned(),
        };
        match self.queue.try_send(fill) {
            Ok(()) => true,
            Err(e) => {
                let fill = match e {
                    mpsc::error::TrySendError::Full(f) | mpsc::error::TrySendError::Closed(f) => f,
                };
                self.done(&fill);
                false
            }
        }
    }

    /// [`HeadTokens::find`] without counting or queueing (explain).
    pub fn lookup(&self, model: &str, api: Api, prompt: &str) -> Option<HeadFound> {
        let (heads, cuts) = self.heads_and_cuts(model, api, prompt.as_bytes());
        self.known_of(&heads, &cuts)
    }

    /// The longest known of `heads` and `cuts` (every cut is longer than the message heads but
    /// the last, and shorter than the last).
    fn known_of(&self, heads: &[Head], cuts: &[Head]) -> Option<HeadFound> {
        let (whole, before) = heads.split_last()?;
        let known = |h: &Head| self.shard(h.digest).read().heads.get(&h.digest).cloned();
        let message_head = || before.iter().rev().find_map(known);
        if let Some(found) = known(whole) {
            return Some(found);
        }
        match cuts.iter().rev().find_map(known) {
            Some(mut cut) => {
                cut.head_tokens =
                    message_head().map_or(0, |h| h.tokens.len().min(cut.tokens.len()));
                Some(cut)
            }
            None => message_head(),
        }
    }

    /// The port to ask on a pod serving at `address`.
    pub fn tokenizer_address(&self, address: SocketAddr) -> SocketAddr {
        SocketAddr::new(address.ip(), self.section.port.unwrap_or(address.port()))
    }

    /// Heads known.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().heads.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, digest: u64) -> &RwLock<HeadShard> {
        &self.shards[(digest as usize) % SHARDS]
    }

    /// Keeps `found` within the shard's share of `cacheEntries` and `cacheTokens`, dropping
    /// arbitrary heads (hash order is effectively random); a head larger than the share alone
    /// is not kept.
    fn insert(&self, digest: u64, found: HeadFound) {
        let entries = self.section.cache_entries.div_ceil(SHARDS).max(1);
        let tokens = self.section.cache_tokens.div_ceil(SHARDS).max(1);
        if found.tokens.len() > tokens {
            return;
        }
        let mut shard = self.shard(digest).write();
        let HeadShard {
            heads,
            tokens: held,
        } = &mut *shard;
        if let Some(old) = heads.remove(&digest) {
            *held -= old.tokens.len();
        }
        while heads.len() >= entries || *held + found.tokens.len() > tokens {
            let Some(&old) = heads.keys().next() else {
                break;
            };
            if let Some(old) = heads.remove(&old) {
                *held -= old.tokens.len();
            }
        }
        *held += found.tokens.len();
        heads.insert(digest, found);
    }

    /// Tokenizes queued heads until `shutdown` (call once; later calls return at once).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(mut receiver) = self.receiver.lock().take() else {
            return;
        };
        #[cfg(feature = "tokenizer-file")]
        if let Some(LoadedFile(source)) = self.section.file.clone() {
            return self.run_file(source, receiver, shutdown).await;
        }
        if self.section.source == TokenizerSource::File {
            // Not loaded (`TokenizerSection::load` was not called): never ask the pods instead.
            tracing::error!("the file tokenizer is not loaded; matching by the estimate");
            return;
        }
        let config = TokenizerConfig {
            timeout: Duration::from_millis(self.section.timeout_ms),
            ..TokenizerConfig::default()
        };
        let tokenizer = match EngineTokenizer::new(config) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "engine tokenizer unavailable; matching by the estimate");
                return;
            }
        };
        // Fills run concurrently, a few at a time (each is one or two calls to a pod).
        let permits = Arc::new(tokio::sync::Semaphore::new(FILLS_AT_ONCE));
        while let Some((fill, permit)) = next_fill(&mut receiver, &permits, &shutdown).await {
            let (heads, tokenizer) = (self.clone(), tokenizer.clone());
            tokio::spawn(async move {
                let taken = Taken::new(&heads, fill);
                heads.tokenize(&tokenizer, &taken.fill).await;
                drop((taken, permit));
            });
        }
    }

    /// [`HeadTokens::run`] for the `file` source: each fill on a blocking thread, at most
    /// [`FILE_FILLS_AT_ONCE`] at a time.
    #[cfg(feature = "tokenizer-file")]
    async fn run_file(
        self: Arc<Self>,
        source: Arc<super::file::FileSource>,
        mut receiver: mpsc::Receiver<Fill>,
        shutdown: CancellationToken,
    ) {
        let permits = Arc::new(tokio::sync::Semaphore::new(FILE_FILLS_AT_ONCE));
        while let Some((fill, permit)) = next_fill(&mut receiver, &permits, &shutdown).await {
            let (heads, source) = (self.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                let taken = Taken::new(&heads, fill);
                heads.tokenize_file(&source, &taken.fill);
                drop((taken, permit));
            });
        }
    }

    /// Tokenizes `fill`'s heads with the `file` source.
    #[cfg(feature = "tokenizer-file")]
    fn tokenize_file(&self, source: &super::file::FileSource, fill: &Fill) {
        let parsed: Result<RequestPrompt<'_>, _> = serde_json::from_slice(&fill.body);
        let Ok(parsed) = parsed else { return };
        let form = fill.messages_form();
        for head in &fill.heads {
            let mut joined = String::new();
            let Some(input) = fill.input(&parsed, form.as_ref(), head, &mut joined) else {
                continue;
            };
            let started = Instant::now();
            let result = source
                .tokenize_known(&input)
                .map(|t| (t.tokens, t.computed));
            if !self.tokenized(result, started, head) {
                return;
            }
        }
    }

    /// Forgets `fill`'s heads as pending, and its body as queued ([`Taken`] does, once the fill
    /// is over).
    fn done(&self, fill: &Fill) {
        self.queued_bytes
            .fetch_sub(fill.body.len(), Ordering::Relaxed);
        self.forget_pending(&fill.heads);
    }

    fn forget_pending(&self, heads: &[Head]) {
        let mut pending = self.pending.lock();
        for h in heads {
            pending.remove(&h.digest);
        }
    }

    /// Counts a tokenization (its tokens, and those the tokenizer computed: fewer when a
    /// known prefix's were reused) and keeps its tokens; `false` on an error (the fill's other
    /// heads are not tried: they would fail alike).
    fn tokenized(
        &self,
        result: Result<(Tokens, usize), super::TokenizeError>,
        started: Instant,
        head: &Head,
    ) -> bool {
        self.metrics
            .tokenize_duration
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok((tokens, computed)) => {
                self.metrics
                    .tokenize_calls
                    .with_label_values(&[TOKENIZE_OK])
                    .inc();
                self.metrics.tokenized_tokens.inc_by(computed as u64);
                let head_tokens = tokens.len();
                self.insert(
                    head.digest,
                    HeadFound {
                        tokens,
                        prompt_bytes: head.bytes,
                        head_tokens,
                    },
                );
                true
            }
            Err(e) => {
                self.metrics
                    .tokenize_calls
                    .with_label_values(&[e.kind().as_str()])
                    .inc();
                tracing::debug!(error = %e, "tokenize failed");
                false
            }
        }
    }

    async fn tokenize(&self, tokenizer: &EngineTokenizer, fill: &Fill) {
        let target = self.tokenizer_address(fill.pod);
        let parsed: Result<RequestPrompt<'_>, _> = serde_json::from_slice(&fill.body);
        let Ok(parsed) = parsed else { return };
        let form = fill.messages_form();
        let ask = Ask {
            tokenizer,
            target,
            engine: self.section.engine,
            model: &fill.model,
        };
        for head in &fill.heads {
            let mut joined = String::new();
            let Some(input) = fill.input(&parsed, form.as_ref(), head, &mut joined) else {
                continue;
            };
            let started = Instant::now();
            let result = match self.after_known(fill, &input) {
                Some((known, rest)) => self.joined_tokens(&ask, known, rest, &input).await,
                None => ask.tokens(&input).await.map(|t| {
                    let computed = t.len();
                    (t, computed)
                }),
            };
            if !self.tokenized(result, started, head) {
                tracing::debug!(pod = %target, "tokenize failed");
                return;
            }
        }
    }

    /// A completion's known head and the text after it, when the engine may be asked for that
    /// text alone: the known head ends at a stable cut inside `input`'s text (a cut's tokens
    /// join the tokens of the text after it: [`crate::prompt::stable_cut`]), and joins are on.
    fn after_known<'a>(
        &self,
        fill: &'a Fill,
        input: &TokenizeInput<'a>,
    ) -> Option<(&'a HeadFound, &'a str)> {
        let (Some(known), Prompt::Text(text)) = (&fill.known, input.prompt()) else {
            return None;
        };
        let rest = text.get(known.prompt_bytes..).filter(|r| !r.is_empty())?;
        (input.add_special_tokens()
            && !self.joins_off.load(Ordering::Relaxed)
            && is_stable_cut(text.as_bytes(), known.prompt_bytes))
        .then_some((known, rest))
    }

    /// `known`'s tokens and the engine's tokens of `rest` (asked without special tokens: the
    /// known tokens hold them), and the tokens the engine computed; checked against `whole`
    /// asked whole on one join in [`CHECK_JOIN_EVERY`].
    async fn joined_tokens(
        &self,
        ask: &Ask<'_>,
        known: &HeadFound,
        rest: &str,
        whole: &TokenizeInput<'_>,
    ) -> Result<(Tokens, usize), super::TokenizeError> {
        let suffix = ask
            .tokens(&TokenizeInput::text(rest).with_add_special_tokens(false))
            .await?;
        let joined = Tokens::from([&known.tokens[..], &suffix[..]].concat());
        let mut computed = suffix.len();
        if self.joined.fetch_add(1, Ordering::Relaxed) % CHECK_JOIN_EVERY == 0 {
            let whole = ask.tokens(whole).await?;
            computed += whole.len();
            if whole != joined {
                self.joins_off.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "an engine's tokens of a completion asked from a known head on differed from its tokens whole: asking every head whole from now on"
                );
                return Ok((whole, computed));
            }
        }
        Ok((joined, computed))
    }
}

/// One pod's engine tokenizer, for one model.
struct Ask<'a> {
    tokenizer: &'a EngineTokenizer,
    target: SocketAddr,
    engine: EngineKind,
    model: &'a str,
}

impl Ask<'_> {
    async fn tokens(&self, input: &TokenizeInput<'_>) -> Result<Tokens, super::TokenizeError> {
        self.tokenizer
            .tokenize(
                self.target.ip(),
                self.target.port(),
                self.engine,
                self.model,
                input,
            )
            .await
    }
}

impl Fill {
    /// A Messages request's chat form (`None` for another API, or a body without one).
    fn messages_form(&self) -> Option<MessagesForm> {
        (self.api == Api::Messages)
            .then(|| MessagesForm::of(&self.body))
            .flatten()
    }

    /// What to tokenize for `head` (`joined` holds the chat head's messages; `form` is a
    /// Messages request's chat form); `None` when the body does not have the shape queued, or
    /// a cut head's text is not the one the router rendered.
    fn input<'a>(
        &self,
        parsed: &'a RequestPrompt<'a>,
        form: Option<&'a MessagesForm>,
        head: &Head,
        joined: &'a mut String,
    ) -> Option<TokenizeInput<'a>> {
        let messages = head.messages;
        let chat = |all: &[&str], tools: Option<&'a str>, joined: &'a mut String| {
            if messages > all.len() || all.len() != self.messages || messages == 0 {
                return None;
            }
            *joined = match head.cut {
                None => join(&all[..messages]),
                Some(kept) => {
                    let last = cut_message(all[messages - 1], kept, self.cut_check)?;
                    let mut head: Vec<&str> = all[..messages - 1].to_vec();
                    head.push(&last);
                    join(&head)
                }
            };
            let joined: &'a String = joined;
            let input = TokenizeInput::chat(joined, tools);
            Some(match head.cut {
                Some(_) => input.continuing_final_message(),
                None => input.with_generation_prompt(messages == all.len()),
            })
        };
        if self.api == Api::Messages {
            let form = form?;
            let all: Vec<&str> = form.messages.iter().map(String::as_str).collect();
            return chat(&all, form.tools.as_deref(), joined);
        }
        match (self.api, parsed) {
            (
                Api::ChatCompletions,
                RequestPrompt {
                    messages: Some(all),
                    tools,
                    system: None,
                    ..
                },
            ) => {
                let all: Vec<&str> = all.iter().map(|m| m.get()).collect();
                chat(&all, tools.map(RawValue::get), joined)
            }
            (
                Api::Completions,
                RequestPrompt {
                    prompt: Some(p), ..
                },
            ) => match head.cut {
                None => Some(TokenizeInput::text(p)),
                Some(kept) => {
                    let text = p
                        .get(..kept)
                        .filter(|t| xxh3_64(t.as_bytes()) == self.cut_check)?;
                    Some(TokenizeInput::text(text))
                }
            },
            _ => None,
        }
    }
}

/// A chat message (raw JSON) with its text cut to its first `kept` bytes, when its content is
/// a string whose first `kept` bytes have the xxh3 digest `check` (what the router rendered).
fn cut_message(raw: &str, kept: usize, check: u64) -> Option<String> {
    let mut message: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw).ok()?;
    let serde_json::Value::String(text) = message.get_mut("content")? else {
        return None;
    };
    let head = text
        .get(..kept)
        .filter(|t| xxh3_64(t.as_bytes()) == check)?;
    *text = head.to_owned();
    serde_json::to_string(&message).ok()
}

/// What the background tokenizer reads of a request body (raw JSON kept as the client sent
/// it: the engine's template prints tools with `tojson`).
#[derive(Deserialize)]
struct RequestPrompt<'a> {
    #[serde(borrow, default)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(default)]
    prompt: Option<String>,
}

/// Messages (raw JSON each) as one JSON array.
fn join(messages: &[&str]) -> String {
    let mut out = String::with_capacity(messages.iter().map(|m| m.len() + 1).sum::<usize>() + 2);
    out.push('[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(m);
    }
    out.push(']');
    out
}

/// Where a prompt's message heads end, shortest first, their digests not computed yet
/// ([`hash_heads`]). Chat: one per message end in the rendering, which must end with one;
/// completions: the whole prompt.
fn message_heads(api: Api, prompt: &[u8]) -> Vec<Head> {
    let head = |messages, bytes| Head {
        messages,
        digest: 0,
        bytes,
        cut: None,
    };
    match api {
        Api::Completions if !prompt.is_empty() => vec![head(0, prompt.len())],
        Api::ChatCompletions | Api::Messages if prompt.ends_with(MESSAGE_END) => {
            memchr::memmem::find_iter(prompt, MESSAGE_END)
                .enumerate()
                .map(|(i, end)| head(i + 1, end + MESSAGE_END.len()))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Sets the digests of a prompt's `heads` and `cuts` (from [`message_heads`] and
/// [`HeadTokens::cut_heads`]) in one pass over `prompt`: each the xxh3 digest of the model and
/// the bytes up to its end, the hash of a longer head continuing that of the shorter. Every cut
/// lies inside the last message, after every other head ends.
fn hash_heads(model: &str, prompt: &[u8], heads: &mut [Head], cuts: &mut [Head]) {
    let Some((last, before)) = heads.split_last_mut() else {
        return;
    };
    let mut h = Xxh3::with_seed(xxh3_64(model.as_bytes()));
    let mut at = 0;
    for head in before.iter_mut().chain(cuts).chain([last]) {
        debug_assert!(head.bytes >= at, "heads and cuts in prompt order");
        h.update(&prompt[at..head.bytes]);
        at = head.bytes;
        head.digest = h.digest();
    }
}

/// Whether a ChatML prompt split into `heads` holds an assistant reply (a message that starts
/// with the assistant role).
fn holds_reply(prompt: &[u8], heads: &[Head]) -> bool {
    const REPLY: &[u8] = b"<|im_start|>assistant\n";
    std::iter::once(0)
        .chain(heads.iter().map(|h| h.bytes))
        .any(|at| prompt.get(at..).is_some_and(|rest| rest.starts_with(REPLY)))
}

/// The next queued fill and a permit to run it, or `None` at shutdown or when the queue closed.
async fn next_fill(
    receiver: &mut mpsc::Receiver<Fill>,
    permits: &Arc<tokio::sync::Semaphore>,
    shutdown: &CancellationToken,
) -> Option<(Fill, tokio::sync::OwnedSemaphorePermit)> {
    let fill = tokio::select! {
        _ = shutdown.cancelled() => return None,
        fill = receiver.recv() => fill?,
    };
    let permit = permits.clone().acquire_owned().await.ok()?;
    Some((fill, permit))
}

#[cfg(test)]
mod tests;
