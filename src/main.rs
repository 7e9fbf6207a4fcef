//! `prefix-picker`: the sidecar (`serve`, or the bare `prefix-picker [FLAGS]` with GIE's
//! defaults), config checking (`validate`) and inspection commands (`render`, `hash`). Process
//! wiring only; the flags are [`prefix_picker::cli`], everything else lives in the library.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use prefix_picker::cli::{self, Form, Host, ServeArgs, ServePlan};
use prefix_picker::config::Config;
use prefix_picker::hashing::{BlockChain, CacheSalt, ChainScheme};
use prefix_picker::logging;
use prefix_picker::prompt::Rendering;
use prefix_picker::reload::{self, Reloader};
use prefix_picker::request::{Api, InferenceRequest};

#[derive(Debug, Parser)]
#[command(
    name = "prefix-picker",
    version,
    about = "Prefix-cache-aware endpoint picker for LLM inference (Envoy ext_proc)",
    long_about = "Prefix-cache-aware endpoint picker for LLM inference (Envoy ext_proc).\n\nWithout a command it runs the sidecar like `serve`, with the Gateway API Inference Extension picker's defaults (TLS, gRPC health on 9003), so GIE's chart can run this image; GIE's other flags are accepted and ignored. See docs/cli.md.",
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the ext_proc sidecar (plaintext, no health port unless asked).
    #[command(args_override_self = true)]
    Serve(Box<ServeArgs>),
    /// Check a config; exits 0 when valid, 1 with every problem listed.
    Validate {
        #[arg(long)]
        config: PathBuf,
    },
    /// Render a request body (FILE or stdin) into the prompt bytes that are hashed.
    Render {
        /// Render as this config's mode does (the affinity mode renders tools, tool calls and
        /// non-text parts too); without it, Kthena's rendering.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The request's path: `/v1/messages` renders an Anthropic Messages body (an OpenAI
        /// path, the default, renders by the `prompt`, `messages`, `input` precedence).
        #[arg(long, default_value = "/v1/chat/completions")]
        api: String,
        file: Option<PathBuf>,
    },
    /// Print the block hashes of raw prompt bytes (FILE or stdin), one per line.
    Hash {
        #[arg(long)]
        model: String,
        #[arg(long, default_value_t = 64)]
        block_size: usize,
        #[arg(long, default_value_t = 128)]
        max_blocks: usize,
        /// The request's `cache_salt`: the chain is seeded by `model ++ 0x00 ++ salt`.
        #[arg(long)]
        salt: Option<String>,
        /// Take the block layout from this config (the Kthena plugin args, or the affinity
        /// mode's `blockBytes`/`maxPromptBytes` when it is on) instead of the two flags.
        #[arg(long, conflicts_with_all = ["block_size", "max_blocks"])]
        config: Option<PathBuf>,
        file: Option<PathBuf>,
    },
    /// Beside one engine: write its KV-cache events to Redis in Kthena's kvcache-aware layout
    /// (what Kthena's Runtime does). Redis from REDIS_HOST, REDIS_PORT, REDIS_PASSWORD.
    KvRelay(Box<cli::kv_relay::KvRelayArgs>),
}

/// `prefix-picker kv-relay`: runs until SIGTERM or Ctrl-C; Redis errors never end it.
fn kv_relay(args: cli::kv_relay::KvRelayArgs) -> ExitCode {
    logging::init(args.v, args.log_format);
    let env = |name: &str| std::env::var(name).ok();
    let (id, events) = match args.resolve(&env) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let target = match prefix_picker::kvcache::redis_env::from_env(&env) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("kv-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("kv-relay: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let release = std::time::Duration::from_secs(args.release_seconds);
    runtime.block_on(relay(id, events, target, release))
}

/// The relay itself: Redis connected in the background, events written until a signal.
async fn relay(
    id: prefix_picker::kvcache::relay::RelayIdentity,
    events: prefix_picker::kv_events::SubscriberConfig,
    target: prefix_picker::kvcache::redis_env::RedisTarget,
    release: std::time::Duration,
) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let shutdown = tokio_util::sync::CancellationToken::new();
    // The Redis connection outlives the events: the relay releases its pod's blocks after them.
    let redis_shutdown = tokio_util::sync::CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let status = prefix_picker::sync::connection::LinkStatus {
        context: "kv-relay",
        role: "writer",
        connected: prometheus::IntGauge::new("kv_relay_redis_connected", "unused").expect("valid"),
        reconnects: None,
    };
    tracing::info!(pod = %id.pod, model = %id.model, events = %events.endpoint, redis = %target.shown, "kv-relay: starting");
    let store = match prefix_picker::kvcache::KvStore::start(
        target,
        std::time::Duration::from_secs(5),
        status,
        &redis_shutdown,
        &mut tasks,
    ) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("kv-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let stop = shutdown.clone();
    tokio::spawn(async move {
        terminated().await;
        stop.cancel();
    });
    prefix_picker::kvcache::relay::run(id, events, store, shutdown.clone(), release).await;
    shutdown.cancel();
    redis_shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM; Ctrl-C only when SIGTERM cannot be watched.
async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

fn read_input(file: Option<&PathBuf>) -> std::io::Result<Vec<u8>> {
    match file {
        Some(path) => std::fs::read(path),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf)?;
            Ok(buf)
        }
    }
}

/// [`read_input`], its error printed (exit code 2).
fn input(file: Option<&PathBuf>) -> Result<Vec<u8>, ExitCode> {
    read_input(file).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

/// The config at `path`, every problem printed on failure (exit code 2).
fn load_config(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("error: {e}");
        }
        ExitCode::from(2)
    })
}

/// Commands that are not the sidecar; their arguments go to clap as given.
const TOOLS: [&str; 5] = ["validate", "render", "hash", "kv-relay", "help"];

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let first = argv.get(1).map(String::as_str);
    let sidecar = !first.is_some_and(|c| TOOLS.contains(&c));
    let (argv, ignored) = if sidecar {
        sidecar_argv(argv)
    } else {
        (argv, Vec::new())
    };
    let cli = match parse(&argv, sidecar) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        None => serve(Form::Gie, cli.serve, &ignored),
        Some(Command::Serve(args)) => serve(Form::Serve, *args, &ignored),
        Some(Command::KvRelay(args)) => kv_relay(*args),
        Some(Command::Render { config, api, file }) => render(config, &api, file),
        Some(Command::Hash {
            model,
            block_size,
            max_blocks,
            salt,
            config,
            file,
        }) => hash(&model, (block_size, max_blocks), salt, config, file),
        Some(Command::Validate { config }) => validate(&config),
    }
}

/// The sidecar's flags in Go syntax too, GIE's unused ones dropped: the arguments for clap and
/// one warning per dropped flag (logged once logging is up).
fn sidecar_argv(mut argv: Vec<String>) -> (Vec<String>, Vec<String>) {
    let start = if argv.get(1).map(String::as_str) == Some("serve") {
        2
    } else {
        1
    };
    let (flags, dropped) = cli::normalize(&argv[start..], &cli::serve_flags());
    argv.truncate(start);
    argv.extend(flags);
    (argv, dropped)
}

/// The command line parsed; on a usage error, help or version, what to exit with.
fn parse(argv: &[String], sidecar: bool) -> Result<Cli, ExitCode> {
    let e = match Cli::try_parse_from(argv) {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    use clap::error::ErrorKind;
    let format = logging::requested_format(argv);
    let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if !sidecar || shown || format == cli::LogFormat::Text {
        e.exit();
    }
    // The sidecar asked for JSON logs: the usage error is one of them.
    logging::init(2, format);
    tracing::error!("{}", e.to_string().trim_end());
    Err(ExitCode::from(2))
}

/// `prefix-picker render`: the prompt bytes a request body hashes, on stdout.
fn render(config: Option<PathBuf>, api: &str, file: Option<PathBuf>) -> ExitCode {
    let Some(api) = Api::from_path(api) else {
        eprintln!(
            "error: --api {api:?} is not an inference API path (/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages)"
        );
        return ExitCode::from(2);
    };
    let rendering = match config.as_deref().map(load_config) {
        None => Rendering::Kthena,
        Some(Ok(c)) => c.scheduler.rendering(),
        Some(Err(code)) => return code,
    };
    let body = match input(file.as_ref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    match InferenceRequest::parse_for(api, &body, rendering) {
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Ok(r) => match r.prompt {
            Ok(prompt) => {
                let mut out = std::io::stdout().lock();
                if out
                    .write_all(prompt.as_bytes())
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    return ExitCode::from(1);
                }
                ExitCode::SUCCESS
            }
            Err(reason) => {
                eprintln!("{}", reason.as_str());
                ExitCode::from(3)
            }
        },
    }
}

/// `prefix-picker hash`: the block hashes of raw prompt bytes, one per line; `layout` is the
/// flags' (block size, max blocks), replaced by the config's when one is given.
fn hash(
    model: &str,
    layout: (usize, usize),
    salt: Option<String>,
    config: Option<PathBuf>,
    file: Option<PathBuf>,
) -> ExitCode {
    let salt = match salt.map(CacheSalt::new) {
        None => None,
        Some(Some(salt)) => Some(salt),
        Some(None) => {
            eprintln!("error: --salt must not be empty");
            return ExitCode::from(2);
        }
    };
    let ((block_size, max_blocks), scheme) = match config.as_deref().map(load_config) {
        None => (layout, ChainScheme::Kthena),
        Some(Ok(c)) => {
            let cache = &c.scheduler.prefix_cache;
            let layout = (cache.block_size_to_hash, cache.max_blocks_to_match);
            (layout, c.scheduler.chain_scheme())
        }
        Some(Err(code)) => return code,
    };
    if block_size == 0 || max_blocks == 0 {
        eprintln!("error: --block-size and --max-blocks must be greater than 0");
        return ExitCode::from(2);
    }
    let prompt = match input(file.as_ref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let chain = BlockChain {
        block_size,
        max_blocks,
    };
    let mut out = std::io::stdout().lock();
    let mut hashes = Vec::new();
    chain.hash_salted(scheme, model, salt.as_ref(), &prompt, &mut hashes);
    for h in hashes {
        if writeln!(out, "{}", h.0).is_err() {
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

/// `prefix-picker validate`: exit 0 with the config's summary, or 1 with every problem.
fn validate(config: &Path) -> ExitCode {
    match Config::load(config) {
        Ok(c) => {
            for w in &c.warnings {
                eprintln!("warning: {w}");
            }
            println!("{}: ok ({} endpoints)", config.display(), c.endpoints.len());
            println!("{}", c.scheduler.mode_summary());
            for line in c.match_sources() {
                println!("{line}");
            }
            if let Some(k) = &c.discovery.kubernetes {
                println!("{}", k.describe(&k.process_namespace()));
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            ExitCode::from(1)
        }
    }
}

/// Runs the sidecar until SIGTERM/SIGINT (then drains) or until a listener fails.
fn serve(form: Form, args: ServeArgs, ignored: &[String]) -> ExitCode {
    let (v, format) = args.logging();
    logging::init(v, format);
    for w in ignored {
        tracing::warn!("{w}");
    }
    // Kept to resolve the config again on a reload, flags included.
    let reload_args = args.clone();
    let plan = match args.resolve(form, &Host::process()) {
        Ok(plan) => plan,
        Err(errors) => {
            for e in &errors {
                logging::fatal(format, e);
            }
            return ExitCode::from(1);
        }
    };
    for w in plan.warnings.iter().chain(&plan.config.warnings) {
        tracing::warn!("{w}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            logging::fatal(format, &format!("cannot start the runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(plan, form, reload_args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal(format, &format!("{e:#}"));
            ExitCode::from(1)
        }
    }
}

/// Starts the sidecar and its config reloads, logs the start-up line, and waits for a signal
/// (then drains) or a listener's failure.
async fn run(plan: ServePlan, form: Form, reload_args: ServeArgs) -> anyhow::Result<()> {
    let listen = prefix_picker::serve::Listeners {
        grpc: &plan.grpc_addr,
        admin: &plan.admin_addr,
        health: plan.health_addr.as_deref(),
    };
    let (tls, endpoints) = (plan.config.picker.tls.mode, plan.config.endpoints.len());
    let mode = plan.config.scheduler.mode_summary();
    let started = plan.config.clone();
    let mut running = prefix_picker::serve::start_with(plan.config, listen).await?;
    let reloader = Arc::new(Reloader::new(
        running.router.clone(),
        started,
        plan.config_sha256.clone(),
    ));
    watch_reloads(reloader, form, reload_args, &running);
    let health_shown = running
        .health_addr
        .map_or_else(|| "none".to_string(), |a| a.to_string());
    // The start-up line: which build runs which config, and where it listens.
    tracing::info!(
        version = prefix_picker::metrics::VERSION,
        revision = prefix_picker::metrics::REVISION,
        config = %plan.config_origin,
        config_sha256 = %plan.config_sha256,
        grpc_addr = %running.grpc_addr,
        admin_addr = %running.admin_addr,
        health_addr = %health_shown,
        tls = tls.as_str(),
        debug_endpoints = running.debug_endpoints,
        endpoints,
        %mode,
        "prefix-picker serving"
    );
    let signalled = tokio::select! {
        _ = shutdown_signal() => true,
        r = running.wait() => { r?; false }
    };
    if !signalled {
        return Ok(());
    }
    tracing::info!("shutting down");
    running.drain().await
}

/// Reloads the config on SIGHUP or a changed file, resolving the same flags again.
fn watch_reloads(
    reloader: Arc<Reloader>,
    form: Form,
    args: ServeArgs,
    running: &prefix_picker::serve::Running,
) {
    let config_file = args.config.clone().or_else(|| args.config_file.clone());
    let load = move || {
        args.clone().resolve(form, &Host::process()).map(|plan| {
            for w in &plan.warnings {
                tracing::warn!("{w}");
            }
            (plan.config, plan.config_sha256)
        })
    };
    tokio::spawn(reload::watch(
        reloader,
        config_file,
        reload::POLL_INTERVAL,
        load,
        running.shutdown.clone(),
    ));
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
