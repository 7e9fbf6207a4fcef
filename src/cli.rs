//! The sidecar's flags, shared by `prefix-picker serve [FLAGS]` and the bare `prefix-picker
//! [FLAGS]`, the GIE form: it takes the Gateway API Inference Extension (GIE) endpoint picker's
//! flags, so GIE's `inferencepool` chart can run this image with its own arguments.
//!
//! - Go flag syntax is accepted ([`normalize`]): `-name value`, `-name=value`, `--name value`,
//!   `--name=value`; a boolean takes a value after `=` (`--secure-serving=false`, Go's spellings
//!   `1`, `t`, `FALSE`...) or, unlike Go, a following `true`/`false` (charts render that).
//! - GIE flags prefix-picker has no use for, and unknown flags, are dropped with a warning
//!   (a crash-looping picker is worse than an ignored flag); an unknown flag takes the next
//!   argument as its value unless that starts with `-` (the sidecar takes no positional arguments).
//! - The two forms differ only in two defaults: the GIE form serves TLS (`--secure-serving`,
//!   self-signed unless `--cert-path`) and gRPC health on port 9003 (`--grpc-health-port`).
//! - Flags win over the config file; each alias pair (`--config`/`--config-file`,
//!   `--grpc-addr`/`--grpc-port`, `--admin-addr`/`--metrics-port`,
//!   `--log-format`/`--zap-encoder`) takes one member.
//!
//! docs/cli.md lists every flag and its GIE meaning.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::discovery::config::SERVICE_ACCOUNT_NAMESPACE;

pub use crate::discovery::inference_pool::GROUP as POOL_GROUP;
pub use normalize::{KnownFlag, normalize, serve_flags};

mod normalize;
mod resolve;

/// Which command line the flags came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `prefix-picker serve [FLAGS]`.
    Serve,
    /// The bare `prefix-picker [FLAGS]`, GIE's defaults.
    Gie,
}

/// The log line format ([`crate::logging`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (zap's `console`).
    #[default]
    #[value(alias = "console")]
    Text,
    /// One JSON object per line.
    Json,
}

/// The sidecar's flags (every field optional: defaults depend on the [`Form`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Config file: Kthena's routerConfiguration plus prefix-picker's sections.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// GIE's name for --config.
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// The config document itself instead of a file.
    #[arg(long, value_name = "YAML")]
    pub config_text: Option<String>,
    /// ext_proc gRPC listen address [default: 0.0.0.0:9002].
    #[arg(long, value_name = "ADDR")]
    pub grpc_addr: Option<String>,
    /// GIE: the ext_proc gRPC port on every interface (0.0.0.0:PORT).
    #[arg(long, value_name = "PORT")]
    pub grpc_port: Option<u16>,
    /// Admin listener: /metrics, /healthz, /readyz, /debug/explain [default: 0.0.0.0:9090].
    #[arg(long, value_name = "ADDR")]
    pub admin_addr: Option<String>,
    /// GIE: the admin listener's port on every interface (0.0.0.0:PORT).
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// Plaintext gRPC health on 0.0.0.0:PORT [GIE form default: 9003; serve: none].
    #[arg(long, value_name = "PORT")]
    pub grpc_health_port: Option<u16>,
    /// TLS on the ext_proc port [GIE form default: true; serve: the config's picker.tls].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub secure_serving: Option<bool>,
    /// With TLS: serve DIR/tls.crt and DIR/tls.key instead of a self-signed certificate.
    #[arg(long, value_name = "DIR")]
    pub cert_path: Option<PathBuf>,
    /// Serve `/debug/*` on the admin listener (loopback peers only unless picker.debug names a
    /// credential) [default: the config's picker.debug.enabled, false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub debug_endpoints: Option<bool>,
    /// Discover pods through this InferencePool.
    #[arg(long, value_name = "NAME")]
    pub pool_name: Option<String>,
    /// The pool's namespace [default: $NAMESPACE, $POD_NAMESPACE, the service account's, default].
    #[arg(long, value_name = "NS")]
    pub pool_namespace: Option<String>,
    /// The pool's API group [default: inference.networking.k8s.io, the only one supported].
    #[arg(long, value_name = "GROUP")]
    pub pool_group: Option<String>,
    /// Discover pods by this label selector instead of a pool (needs --endpoint-target-ports).
    #[arg(long, value_name = "SELECTOR")]
    pub endpoint_selector: Option<String>,
    /// Ports of the selected pods, comma-separated.
    #[arg(long, value_name = "PORTS")]
    pub endpoint_target_ports: Option<String>,
    /// Verbosity like klog: 2 = info, 4 = per-pod score lines, 5 = trace [default: 2].
    #[arg(long, value_name = "N")]
    pub v: Option<u8>,
    /// Log format: text or json (one JSON object per line) [default: text].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// GIE's name for --log-format (console = text).
    #[arg(long, value_name = "FORMAT")]
    pub zap_encoder: Option<LogFormat>,
    /// Engine metric of queued requests: `name` or `name{label=value,...}`, "" = off
    /// (picker.engineMetrics.totalQueuedRequests) [default: vLLM's, SGLang's].
    #[arg(long, value_name = "SPEC")]
    pub total_queued_requests_metric: Option<String>,
    /// Engine metric of running requests (picker.engineMetrics.totalRunningRequests).
    #[arg(long, value_name = "SPEC")]
    pub total_running_requests_metric: Option<String>,
    /// Engine metric of KV-cache usage, 0..1 (picker.engineMetrics.kvCacheUsagePercentage).
    #[arg(long, value_name = "SPEC")]
    pub kv_cache_usage_percentage_metric: Option<String>,
}

/// What `serve` runs with, once the flags and the config are resolved.
#[derive(Debug)]
pub struct ServePlan {
    pub config: Config,
    pub grpc_addr: String,
    pub admin_addr: String,
    pub health_addr: Option<String>,
    pub v: u8,
    pub log_format: LogFormat,
    /// Where the config came from: its path, `--config-text`, or `none`.
    pub config_origin: String,
    /// SHA-256 of the config text as given, hex (what `sha256sum FILE` prints); empty without one.
    pub config_sha256: String,
    /// Flags overriding the config, ignored flags: log them once logging is up.
    pub warnings: Vec<String>,
}

/// The process environment and files, injectable so tests never touch the real ones.
pub struct Host<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub read: &'a dyn Fn(&Path) -> std::io::Result<String>,
}

impl Host<'static> {
    /// This process's environment and filesystem.
    pub fn process() -> Host<'static> {
        Host {
            env: &|name| std::env::var(name).ok(),
            read: &|path| std::fs::read_to_string(path),
        }
    }
}

/// The pool namespace: the flag, else `$NAMESPACE` (GIE's chart), else `$POD_NAMESPACE`, else
/// the service-account namespace file, else `default`.
pub fn pool_namespace(flag: Option<&str>, host: &Host<'_>) -> String {
    let non_empty = |s: String| {
        let s = s.trim().to_string();
        (!s.is_empty()).then_some(s)
    };
    flag.map(str::to_string)
        .and_then(non_empty)
        .or_else(|| (host.env)("NAMESPACE").and_then(non_empty))
        .or_else(|| (host.env)("POD_NAMESPACE").and_then(non_empty))
        .or_else(|| {
            (host.read)(Path::new(SERVICE_ACCOUNT_NAMESPACE))
                .ok()
                .and_then(non_empty)
        })
        .unwrap_or_else(|| "default".to_string())
}

/// SHA-256 of `bytes`, hex (what `sha256sum` prints): the config hash of the logs and metrics.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl ServeArgs {
    /// The verbosity and log format asked for (set up logging before [`ServeArgs::resolve`]).
    pub fn logging(&self) -> (u8, LogFormat) {
        (
            self.v.unwrap_or(2),
            self.log_format.or(self.zap_encoder).unwrap_or_default(),
        )
    }
}

pub mod kv_relay;

#[cfg(test)]
mod tests;
