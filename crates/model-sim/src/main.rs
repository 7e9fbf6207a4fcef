//! `model-sim`: one simulated vLLM/SGLang pod (see the library, `model_sim`).

use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use clap::Parser;
use model_sim::engine::{Engine, EngineConfig, EngineKind};
use model_sim::kv_events::KvEventsConfig;
use model_sim::pd::{self, PdConfig, Role};
use model_sim::scheduler::KvAdmission;
use model_sim::server::{SimConfig, app};
use model_sim::template::ChatTemplate;

#[derive(Debug, Parser)]
#[command(
    name = "model-sim",
    version,
    about = "GPU-free simulated LLM engine with a prefix KV cache"
)]
struct Args {
    /// Port to listen on (0 = any; the bound address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Pod name, sent back in `x-served-by`.
    #[arg(long, default_value = "model-sim")]
    name: String,
    /// Served model name (default: accept any model).
    #[arg(long)]
    model: Option<String>,
    /// A LoRA adapter loaded beside `--model` (repeatable): served under its name and listed by
    /// `GET /v1/models`.
    #[arg(long = "lora-adapter", requires = "model")]
    lora_adapters: Vec<String>,
    /// vLLM's `--max-loras` (the `max_lora` label of `vllm:lora_requests_info`).
    #[arg(long, default_value_t = 1)]
    max_loras: usize,
    #[arg(long, value_enum, default_value_t = EngineKind::Vllm)]
    engine: EngineKind,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV cache capacity in blocks.
    #[arg(long, default_value_t = 32_768)]
    kv_blocks: usize,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Fixed per-request overhead before the first token, ms.
    #[arg(long, default_value_t = 30.0)]
    overhead_ms: f64,
    /// Prefill time per uncached prompt token, ms.
    #[arg(long, default_value_t = 0.2)]
    prefill_ms_per_token: f64,
    /// Inter-token latency, ms.
    #[arg(long, default_value_t = 12.0)]
    itl_ms: f64,
    /// Divides every delay (1000 = a thousand times faster).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Output tokens when the request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// PD role (omitted: none). A decode sim given `x-prefiller-host-port: host:port` has that
    /// peer prefill the prompt first; a prefill sim serves as any sim.
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// KV transfer time per prompt token a decode sim receives (its cache lacked), µs.
    #[arg(long, default_value_t = pd::DEFAULT_KV_TRANSFER_PER_TOKEN.as_micros() as f64)]
    kv_transfer_us_per_token: f64,
    /// The longest a decode sim waits for its prefill peer (wall clock, not scaled), ms.
    #[arg(long, default_value_t = pd::DEFAULT_PREFILL_TIMEOUT.as_millis() as u64)]
    prefill_timeout_ms: u64,
    /// vLLM's KVEventsConfig as JSON, e.g. `{"enable_kv_cache_events": true, "publisher":
    /// "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}`.
    #[arg(long, value_parser = parse_kv_events)]
    kv_events_config: Option<KvEventsConfig>,
    /// Prefix caching on (the default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    enable_prefix_caching: bool,
    /// vLLM's switch: never reuse the cache (cached_tokens always 0, no BlockStored events).
    #[arg(long, overrides_with = "enable_prefix_caching")]
    no_enable_prefix_caching: bool,
    /// A Hugging Face `tokenizer.json` to tokenize with (its ids in `/tokenize`, the KV cache
    /// and the KV events) instead of the built-in tokenizer.
    #[arg(long, value_name = "PATH", conflicts_with = "tokenizer")]
    tokenizer_json: Option<std::path::PathBuf>,
    /// The built-in tokenizer: `default` (tokens of at most 6 bytes, ~4.1 bytes per token on
    /// the benchmark's prompts) or `dense` (at most 4 bytes, special tokens whole, ~3.2); for
    /// the KV cache, `/tokenize` and the usage counts. No `tokenizer.json` describes either.
    #[arg(long, value_enum)]
    tokenizer: Option<model_sim::tokenizer::Builtin>,
    /// How chat and Responses requests render into the prompt the engine caches and
    /// `/tokenize` answers: `chatml` (the router's own rendering) or `llama3` (Llama 3's
    /// template, which the router does not render).
    #[arg(long, value_enum, default_value_t = ChatTemplate::ChatMl)]
    chat_template: ChatTemplate,
    /// How requests are admitted to the KV cache: `slots` (only `--max-num-seqs` limits them;
    /// a prompt's blocks that do not fit are not cached) or `vllm` (vLLM's scheduler: a request
    /// waits until its blocks fit, a running one that needs a block none has free preempts the
    /// last started, which recomputes later).
    #[arg(long, value_enum, default_value_t = KvAdmission::Slots)]
    kv_admission: KvAdmission,
    /// Writes the default `tokenizer.json` and a `tokenizer_config.json` with the sim's chat
    /// template into DIR, then exits (run the sims with `--tokenizer-json DIR/tokenizer.json`
    /// and point the picker's `file` tokenizer source at it). They describe the default
    /// template only: not with `--chat-template llama3`.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["tokenizer", "chat_template"])]
    write_tokenizer: Option<std::path::PathBuf>,
}

fn parse_kv_events(json: &str) -> Result<KvEventsConfig, String> {
    KvEventsConfig::from_json(json).map_err(|e| format!("invalid KVEventsConfig: {e}"))
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if let Some(dir) = &a.write_tokenizer {
        model_sim::tokenizer_json::write(dir)?;
        println!(
            "wrote {}/tokenizer.json and tokenizer_config.json",
            dir.display()
        );
        return Ok(());
    }
    let tokenizer = match &a.tokenizer_json {
        Some(path) => model_sim::tokenizer_json::load(path)?,
        None => a.tokenizer.unwrap_or_default().tokenizer(),
    };
    anyhow::ensure!(a.prefill_timeout_ms > 0, "--prefill-timeout-ms must be > 0");
    anyhow::ensure!(
        a.time_scale > 0.0,
        "--time-scale must be > 0, got {}",
        a.time_scale
    );
    let engine = Arc::new(
        Engine::start(EngineConfig {
            kind: a.engine,
            block_tokens: a.block_size.max(1),
            kv_blocks: a.kv_blocks,
            max_num_seqs: a.max_num_seqs.max(1),
            overhead: ms(a.overhead_ms),
            prefill_per_token: ms(a.prefill_ms_per_token),
            inter_token_latency: ms(a.itl_ms),
            time_scale: a.time_scale,
            pd: PdConfig {
                role: a.role,
                kv_transfer_per_token: ms(a.kv_transfer_us_per_token / 1000.0),
                prefill_timeout: Duration::from_millis(a.prefill_timeout_ms),
            },
            kv_events: a.kv_events_config.unwrap_or_default(),
            prefix_caching: !a.no_enable_prefix_caching,
            tokenizer,
            chat_template: a.chat_template,
            kv_admission: a.kv_admission,
        })
        .await?,
    );
    if let Some(p) = engine.kv_events() {
        // Not on stdout: its first line is the HTTP address, which scripts read.
        eprintln!(
            "model-sim {} publishing KV events on {} (replay: {})",
            a.name,
            p.endpoint(),
            p.replay_endpoint().unwrap_or("none")
        );
    }
    let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await?;
    println!(
        "model-sim {} listening on {}",
        a.name,
        listener.local_addr()?
    );
    let app = app(
        SimConfig {
            name: a.name,
            model: a.model,
            lora_adapters: a.lora_adapters,
            max_loras: a.max_loras,
            default_max_tokens: a.default_max_tokens.max(1),
            seed: a.seed,
        },
        engine,
    );
    // Small SSE events must not wait for delayed ACKs (Nagle would add ~40 ms to TTFT).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
