//! `prefix-bench tokenize-cost`: what engine tokens cost per request, for chat prompts of
//! 2 KB, 8 KiB and 220 KB, against a real model-sim's `/tokenize`:
//! - the hop, cold (a prompt the engine tokenizer has never seen: one HTTP call, JSON both
//!   ways; the sim's tokenizer itself is cheap, a real engine's adds its own time);
//! - the hop, cached (the same prompt again: the client's cache answers);
//! - the request path with engine truth on ([`HeadTokens::find`]): the heads known (a digest
//!   lookup per head, what a request pays once its conversation's heads were tokenized in the
//!   background) and unknown (the lookup plus queueing the heads for the background).
//!
//! - the `file` source, cold: the chat template rendered and the prompt encoded in process
//!   (`FileSource::tokenize`, what the background worker does per head, and what a request
//!   would pay if it tokenized inline), with model-sim's `tokenizer.json` and template unless
//!   `--tokenizer-json` names another (its directory's `tokenizer_config.json` or
//!   `chat_template.jinja` give the template);
//! - the request path with the `file` source, heads known and unknown (as for `engine`).
//!
//! Each line is the median and 99th percentile of `--calls` calls (a quarter of them at
//! 220 KB).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prefix_picker::metrics::engine_truth::EngineTruthMetrics;
use prefix_picker::prompt::Rendering;
use prefix_picker::request::{Api, InferenceRequest};
use prefix_picker::tokenizer::file::FileSource;
use prefix_picker::tokenizer::heads::{HeadFound, HeadTokens, TokenizerSection};
use prefix_picker::tokenizer::{EngineKind, EngineTokenizer, TokenizeInput, TokenizerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Prompt sizes measured (label, bytes of the system message).
const SIZES: [(&str, usize); 3] = [("2 KB", 2_000), ("8 KiB", 8_192), ("220 KB", 220_000)];

/// One measured line.
#[derive(Debug, Clone)]
pub struct CostLine {
    pub what: &'static str,
    pub size: &'static str,
    pub calls: usize,
    pub p50: Duration,
    pub p99: Duration,
}

/// A chat body of about `bytes` bytes whose every byte is new when `nonce` is.
fn chat_body(bytes: usize, nonce: u64) -> Vec<u8> {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut system = format!("Tenant {nonce}. ");
    let mut i = nonce as usize;
    while system.len() < bytes {
        system.push_str(words[i % words.len()]);
        system.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    serde_json::to_vec(&json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What does the tenant say first?"},
        ],
    }))
    .expect("serializable")
}

/// The `messages` array of a chat body, as the engine tokenizer sends it.
fn messages_of(body: &[u8]) -> anyhow::Result<String> {
    let value: serde_json::Value = serde_json::from_slice(body)?;
    Ok(value["messages"].to_string())
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// Runs every measurement against a model-sim started from `sim_bin`; the `file` source runs
/// `tokenizer_json` (`None`: model-sim's, written to a temporary directory).
pub async fn run(
    sim_bin: &Path,
    calls: usize,
    tokenizer_json: Option<&Path>,
) -> anyhow::Result<Vec<CostLine>> {
    anyhow::ensure!(calls >= 4, "--calls must be at least 4, got {calls}");
    let sim = testkit::Sim::start(sim_bin, "sim-0", &[]).context("starting model-sim")?;
    let pod = sim.addr();
    let tokenizer = EngineTokenizer::new(TokenizerConfig {
        timeout: Duration::from_secs(5),
        ..TokenizerConfig::default()
    })?;
    let dir = tempfile::tempdir()?;
    let path = match tokenizer_json {
        Some(p) => p.to_path_buf(),
        None => {
            model_sim::tokenizer_json::write(dir.path())?;
            dir.path().join("tokenizer.json")
        }
    };
    let file = FileSource::load(&path)?;
    if let Some(e) = file.template_error() {
        anyhow::bail!("{e}");
    }
    let file_section = format!("source: file\npath: {:?}", path.display().to_string());
    let mut lines = Vec::new();
    for (size, bytes) in SIZES {
        let n = if bytes > 100_000 { calls / 4 } else { calls };
        lines.push(hop(&tokenizer, pod, size, bytes, n, false).await?);
        lines.push(hop(&tokenizer, pod, size, bytes, n, true).await?);
        lines.extend(
            request_path("source: engine\ntimeoutMs: 5000", "", pod, size, bytes, n).await?,
        );
        lines.push(file_cold(&file, size, bytes, n)?);
        lines.extend(request_path(&file_section, "file: ", pod, size, bytes, n).await?);
    }
    Ok(lines)
}

/// The `file` source on a new prompt each call: the template rendered, the text encoded.
fn file_cold(
    file: &FileSource,
    size: &'static str,
    bytes: usize,
    calls: usize,
) -> anyhow::Result<CostLine> {
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let messages = messages_of(&chat_body(bytes, (1 << 43) + i as u64))?;
        let input = TokenizeInput::chat(&messages, None);
        let started = Instant::now();
        let tokens = file.tokenize(&input)?;
        samples.push(started.elapsed());
        anyhow::ensure!(!tokens.as_slice().is_empty(), "no tokens for {size}");
    }
    let (p50, p99) = percentiles(samples);
    Ok(CostLine {
        what: "file tokenizer.json, cold (render + encode in process)",
        size,
        calls,
        p50,
        p99,
    })
}

/// The `/tokenize` hop: every call a new prompt (`cached` false) or the same one again.
async fn hop(
    tokenizer: &EngineTokenizer,
    pod: SocketAddr,
    size: &'static str,
    bytes: usize,
    calls: usize,
    cached: bool,
) -> anyhow::Result<CostLine> {
    let mut samples = Vec::with_capacity(calls);
    let first = messages_of(&chat_body(bytes, 1 << 40))?;
    // Warm the connection (and, for the cached line, the answer).
    let input = TokenizeInput::chat(&first, None);
    tokenizer
        .tokenize(pod.ip(), pod.port(), EngineKind::Vllm, "m", &input)
        .await?;
    for i in 0..calls {
        let messages = if cached {
            first.clone()
        } else {
            messages_of(&chat_body(bytes, i as u64))?
        };
        let input = TokenizeInput::chat(&messages, None);
        let started = Instant::now();
        let tokens = tokenizer
            .tokenize(pod.ip(), pod.port(), EngineKind::Vllm, "m", &input)
            .await?;
        samples.push(started.elapsed());
        anyhow::ensure!(!tokens.as_slice().is_empty(), "no tokens for {size}");
    }
    let (p50, p99) = percentiles(samples);
    Ok(CostLine {
        what: if cached {
            "engine /tokenize, cached"
        } else {
            "engine /tokenize, cold (one hop)"
        },
        size,
        calls,
        p50,
        p99,
    })
}

/// What the request path pays with engine truth on (`section`: the `picker.tokenizer` YAML;
/// `label` prefixes the lines): `find` with the heads known, and with every request a new
/// conversation (heads unknown: looked up and queued).
async fn request_path(
    section: &str,
    label: &'static str,
    pod: SocketAddr,
    size: &'static str,
    bytes: usize,
    calls: usize,
) -> anyhow::Result<Vec<CostLine>> {
    let mut section: TokenizerSection = serde_yaml_ng::from_str(section)?;
    if let Some(warning) = section.load().map_err(anyhow::Error::msg)? {
        anyhow::bail!("{warning}");
    }
    let registry = prometheus::Registry::new();
    let metrics = EngineTruthMetrics::register(
        &registry,
        &["engine", "estimate"],
        &["engine", "request"],
        &["timeout"],
    );
    let path = RequestPath {
        heads: Arc::new(HeadTokens::new(section, metrics)),
        pod,
    };
    let shutdown = CancellationToken::new();
    let filler = tokio::spawn(Arc::clone(&path.heads).run(shutdown.clone()));
    let known = path.known(size, bytes, calls).await?;
    let unknown = path.unknown(bytes, calls)?;
    shutdown.cancel();
    filler.await?;
    let (p50, p99) = percentiles(known);
    let (u50, u99) = percentiles(unknown);
    let (known, unknown) = if label.is_empty() {
        (
            "request path, heads known (lookup)",
            "request path, heads unknown (lookup + queue)",
        )
    } else {
        (
            "file: request path, heads known (lookup)",
            "file: request path, heads unknown (lookup + queue)",
        )
    };
    Ok(vec![
        CostLine {
            what: known,
            size,
            calls,
            p50,
            p99,
        },
        CostLine {
            what: unknown,
            size,
            calls,
            p50: u50,
            p99: u99,
        },
    ])
}

/// The request path's head lookup ([`HeadTokens::find`]) for chat prompts to `pod`.
struct RequestPath {
    heads: Arc<HeadTokens>,
    pod: SocketAddr,
}

impl RequestPath {
    /// A chat body's prompt, rendered as the engine renders it.
    fn render(body: &[u8]) -> anyhow::Result<String> {
        Ok(InferenceRequest::parse_as(body, Rendering::Engine)?.prompt?)
    }

    fn find(&self, prompt: &str, body: &[u8]) -> Option<HeadFound> {
        self.heads.find(
            "m",
            Some(Api::ChatCompletions),
            prompt,
            Some(body),
            Some(self.pod),
        )
    }

    /// `calls` lookups of one prompt whose heads are known: one request queues them; polled
    /// (with a 30 s deadline) until the background has tokenized them.
    async fn known(&self, size: &str, bytes: usize, calls: usize) -> anyhow::Result<Vec<Duration>> {
        let body = chat_body(bytes, 1 << 41);
        let prompt = Self::render(&body)?;
        self.find(&prompt, &body);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .heads
            .lookup("m", Api::ChatCompletions, &prompt)
            .is_none()
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the {size} prompt's heads were not tokenized within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut known = Vec::with_capacity(calls);
        for _ in 0..calls {
            let started = Instant::now();
            let found = self.find(&prompt, &body);
            known.push(started.elapsed());
            anyhow::ensure!(found.is_some(), "a known {size} head was not found");
        }
        Ok(known)
    }

    /// `calls` lookups of a new conversation each (each is queued; the queue may drop some,
    /// counted).
    fn unknown(&self, bytes: usize, calls: usize) -> anyhow::Result<Vec<Duration>> {
        let mut unknown = Vec::with_capacity(calls);
        for i in 0..calls {
            let body = chat_body(bytes, (1 << 42) + i as u64);
            let prompt = Self::render(&body)?;
            let started = Instant::now();
            std::hint::black_box(self.find(&prompt, &body));
            unknown.push(started.elapsed());
        }
        Ok(unknown)
    }
}

/// The lines as a markdown table.
pub fn table(lines: &[CostLine]) -> String {
    let mut out = String::from("| what | prompt | calls | p50 | p99 |\n|---|---|---|---|---|\n");
    for l in lines {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} us | {:.1} us |\n",
            l.what,
            l.size,
            l.calls,
            l.p50.as_secs_f64() * 1e6,
            l.p99.as_secs_f64() * 1e6
        ));
    }
    out
}
