//! `prefix-picker`: the sidecar (`serve`, or the bare `prefix-picker [FLAGS]` with GIE's
//! defaults), config checking (`validate`) and inspection commands (`render`, `hash`). Process
//! wiring only; the flags are [`prefix_picker::cli`], everything else lives in the library.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use prefix_picker::cli::{self, Form, Host, ServeArgs};
use prefix_picker::config::Config;
use prefix_picker::hashing::{BlockChain, CacheSalt, ChainScheme};
use prefix_picker::logging;
use prefix_picker::prompt::Rendering;
use prefix_picker::reload::{self, Reloader};
use prefix_picker::request::InferenceRequest;

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
    runtime.block_on(async move {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shutdown = tokio_util::sync::CancellationToken::new();
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
            &shutdown,
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
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
        prefix_picker::kvcache::relay::run(id, events, store, shutdown.clone()).await;
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        ExitCode::SUCCESS
    })
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

/// Commands that are not the sidecar; their arguments go to clap as given.
const TOOLS: [&str; 5] = ["validate", "render", "hash", "kv-relay", "help"];

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The sidecar's flags in Go syntax too, GIE's unused ones dropped (logged below).
    let mut ignored = Vec::new();
    let first = argv.get(1).map(String::as_str);
    let sidecar = !first.is_some_and(|c| TOOLS.contains(&c));
    if sidecar {
        let start = if first == Some("serve") { 2 } else { 1 };
        let (flags, dropped) = cli::normalize(&argv[start..], &cli::serve_flags());
        argv.truncate(start);
        argv.extend(flags);
        ignored = dropped;
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let format = logging::requested_format(&argv);
            let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
            if !sidecar || shown || format == cli::LogFormat::Text {
                e.exit();
            }
            // The sidecar asked for JSON logs: the usage error is one of them.
            logging::init(2, format);
            tracing::error!("{}", e.to_string().trim_end());
            return ExitCode::from(2);
        }
    };
    let command = match cli.command {
        None => return serve(Form::Gie, cli.serve, &ignored),
        Some(Command::Serve(args)) => return serve(Form::Serve, *args, &ignored),
        Some(command) => command,
    };
    match command {
        Command::KvRelay(args) => kv_relay(*args),
        Command::Render { config, file } => {
            let rendering = match config.map(|path| Config::load(&path)) {
                None => Rendering::Kthena,
                Some(Ok(c)) => c.scheduler.rendering(),
                Some(Err(errors)) => {
                    for e in &errors.0 {
                        eprintln!("error: {e}");
                    }
                    return ExitCode::from(2);
                }
            };
            let body = match read_input(file.as_ref()) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            match InferenceRequest::parse_as(&body, rendering) {
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
        Command::Hash {
            model,
            mut block_size,
            mut max_blocks,
            salt,
            config,
            file,
        } => {
            let salt = match salt.map(CacheSalt::new) {
                None => None,
                Some(Some(salt)) => Some(salt),
                Some(None) => {
                    eprintln!("error: --salt must not be empty");
                    return ExitCode::from(2);
                }
            };
            let mut scheme = ChainScheme::Kthena;
            if let Some(path) = config {
                match Config::load(&path) {
                    Ok(c) => {
                        block_size = c.scheduler.prefix_cache.block_size_to_hash;
                        max_blocks = c.scheduler.prefix_cache.max_blocks_to_match;
                        scheme = c.scheduler.chain_scheme();
                    }
                    Err(errors) => {
                        for e in &errors.0 {
                            eprintln!("error: {e}");
                        }
                        return ExitCode::from(2);
                    }
                }
            }
            if block_size == 0 || max_blocks == 0 {
                eprintln!("error: --block-size and --max-blocks must be greater than 0");
                return ExitCode::from(2);
            }
            let prompt = match read_input(file.as_ref()) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let chain = BlockChain {
                block_size,
                max_blocks,
            };
            let mut out = std::io::stdout().lock();
            let mut hashes = Vec::new();
            chain.hash_salted(scheme, &model, salt.as_ref(), &prompt, &mut hashes);
            for h in hashes {
                if writeln!(out, "{}", h.0).is_err() {
                    return ExitCode::from(1);
                }
            }
            ExitCode::SUCCESS
        }
        Command::Validate { config } => match Config::load(&config) {
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
        },
        Command::Serve(_) => unreachable!("handled above"),
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
    let config_file = args.config.clone().or_else(|| args.config_file.clone());
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
    let result = runtime.block_on(async move {
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
        let load = move || {
            reload_args
                .clone()
                .resolve(form, &Host::process())
                .map(|plan| {
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
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal(format, &format!("{e:#}"));
            ExitCode::from(1)
        }
    }
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
