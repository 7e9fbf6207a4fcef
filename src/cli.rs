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

use serde_yaml_ng::Value as Yaml;

use crate::config::{Config, NO_ENDPOINTS};
use crate::discovery::config::SERVICE_ACCOUNT_NAMESPACE;
use crate::discovery::target::{Target, parse_selector};
use crate::discovery::{KubernetesConfig, Source};
use crate::pod_metrics::names::MetricSource;
use crate::tls::{TlsConfig, TlsMode};

pub use crate::discovery::inference_pool::GROUP as POOL_GROUP;

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

/// GIE flags prefix-picker accepts and ignores, and whether each is a boolean (no separate value):
/// every flag of GIE v1.5.0's endpoint picker (`pkg/epp/server/options.go`, the last release with
/// the `inferencepool` chart) that prefix-picker has no use for, plus a few of earlier releases.
const GIE_IGNORED: &[(&str, bool)] = &[
    ("cache-info-metric", false),
    ("disable-endpoint-subset-filter", true),
    ("enable-cert-reload", true),
    ("enable-latency-predictor", true),
    ("enable-pprof", true),
    ("ha-enable-leader-election", true),
    ("health-checking", true),
    ("kubeconfig", false),
    ("log-level", false),
    ("lora-info-metric", false),
    ("metrics-endpoint-auth", true),
    ("metrics-staleness-threshold", false),
    ("model-server-metrics-https-insecure-skip-verify", true),
    ("model-server-metrics-path", false),
    ("model-server-metrics-port", false),
    ("model-server-metrics-scheme", false),
    ("refresh-metrics-interval", false),
    ("refresh-prometheus-metrics-interval", false),
    ("tracing", true),
    ("zap-devel", true),
    ("zap-log-level", false),
    ("zap-stacktrace-level", false),
    ("zap-time-encoding", false),
];

/// Flags clap parses itself anywhere.
const BUILT_IN: [&str; 4] = ["h", "help", "V", "version"];

/// A flag of [`ServeArgs`]: its long name and whether it needs a value.
#[derive(Debug, Clone)]
pub struct KnownFlag {
    pub name: String,
    pub takes_value: bool,
}

/// The flags of [`ServeArgs`], read from clap so a flag added there is known here.
pub fn serve_flags() -> Vec<KnownFlag> {
    use clap::Args;
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    command
        .get_arguments()
        .filter_map(|a| {
            let name = a.get_long()?.to_string();
            // A value after `=` only (`--secure-serving=false`): a boolean, as Go's. Unset
            // `num_args` (before clap builds the command) means one value.
            let takes_value = a.get_action().takes_values()
                && a.get_num_args().is_none_or(|n| n.min_values() > 0);
            Some(KnownFlag { name, takes_value })
        })
        .collect()
}

/// Rewrites Go-style flags (`-name`, `-name=value`) as clap's `--name[=value]` and drops the
/// flags prefix-picker does not know, returning the kept arguments and one warning per drop.
pub fn normalize(args: &[String], known: &[KnownFlag]) -> (Vec<String>, Vec<String>) {
    let (mut out, mut warnings) = (Vec::with_capacity(args.len()), Vec::new());
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            out.extend(args[i - 1..].iter().cloned());
            break;
        }
        let Some(body) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty())
        else {
            out.push(arg.clone());
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        if BUILT_IN.contains(&name) && inline.is_none() {
            out.push(arg.clone());
            continue;
        }
        if let Some(flag) = known.iter().find(|f| f.name == name) {
            // Go takes the next argument as the value whatever it looks like; joined with `=`
            // so clap does too (`--config-text -x`). A boolean takes a separate `true`/`false`
            // too: charts render `--secure-serving false`, and no positional argument exists.
            let value = match inline {
                Some(v) if !flag.takes_value => Some(go_bool(v).unwrap_or(v)),
                Some(v) => Some(v),
                None if flag.takes_value && i < args.len() => {
                    i += 1;
                    Some(args[i - 1].as_str())
                }
                None => match args.get(i).and_then(|next| go_bool(next)) {
                    Some(b) => {
                        i += 1;
                        Some(b)
                    }
                    None => None,
                },
            };
            out.push(match value {
                Some(v) => format!("--{name}={v}"),
                None => format!("--{name}"),
            });
            continue;
        }
        let gie = GIE_IGNORED.iter().find(|(n, _)| *n == name);
        let value = match (inline, gie) {
            (Some(v), _) => Some(v.to_string()),
            (None, Some((_, true))) => match args.get(i).and_then(|next| go_bool(next)) {
                Some(b) => {
                    i += 1;
                    Some(b.to_string())
                }
                None => None,
            },
            (None, Some((_, false))) if i < args.len() => {
                i += 1;
                Some(args[i - 1].clone())
            }
            (None, None) if i < args.len() && !args[i].starts_with('-') => {
                i += 1;
                Some(args[i - 1].clone())
            }
            _ => None,
        };
        let shown = match &value {
            Some(v) => format!("--{name}={v:?}"),
            None => format!("--{name}"),
        };
        warnings.push(match gie {
            Some(_) => format!("flag {shown} ignored: a GIE flag prefix-picker has no use for"),
            None => format!("flag {shown} ignored: unknown flag"),
        });
    }
    (out, warnings)
}

/// A boolean as Go's `strconv.ParseBool` reads it, spelled the way clap reads it.
fn go_bool(text: &str) -> Option<&'static str> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some("true"),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some("false"),
        _ => None,
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

    /// Applies the form's defaults, loads the config and folds the flags into it. Errors are
    /// complete sentences naming the flags involved.
    pub fn resolve(self, form: Form, host: &Host<'_>) -> Result<ServePlan, Vec<String>> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let pair = |errors: &mut Vec<String>, a: &str, b: &str, both: bool| {
            if both {
                errors.push(format!(
                    "--{a} and --{b} name the same setting: give only one"
                ));
            }
        };
        pair(
            &mut errors,
            "config",
            "config-file",
            self.config.is_some() && self.config_file.is_some(),
        );
        pair(
            &mut errors,
            "grpc-addr",
            "grpc-port",
            self.grpc_addr.is_some() && self.grpc_port.is_some(),
        );
        pair(
            &mut errors,
            "admin-addr",
            "metrics-port",
            self.admin_addr.is_some() && self.metrics_port.is_some(),
        );
        pair(
            &mut errors,
            "log-format",
            "zap-encoder",
            self.log_format.is_some() && self.zap_encoder.is_some(),
        );
        let file = self.config.as_ref().or(self.config_file.as_ref());
        if file.is_some() && self.config_text.is_some() {
            errors.push(
                "--config-text and a config file (--config/--config-file): give only one".into(),
            );
        }
        if self.pool_name.is_some() && self.endpoint_selector.is_some() {
            errors.push(
                "--pool-name and --endpoint-selector both say where pods come from: give only one"
                    .into(),
            );
        }
        if let Some(group) = &self.pool_group
            && group != POOL_GROUP
        {
            errors.push(format!(
                "--pool-group {group:?}: prefix-picker watches InferencePool {POOL_GROUP}/v1 only"
            ));
        }
        if self.endpoint_selector.is_some() != self.endpoint_target_ports.is_some() {
            errors.push(
                "--endpoint-selector and --endpoint-target-ports go together: give both".into(),
            );
        }
        if !errors.is_empty() {
            return Err(errors);
        }

        let (text, origin) = match (file, &self.config_text) {
            (Some(path), _) => match (host.read)(path) {
                Ok(t) => (t, path.display().to_string()),
                Err(e) => return Err(vec![format!("cannot read {}: {e}", path.display())]),
            },
            (None, Some(text)) => (text.clone(), "--config-text".to_string()),
            (None, None) => (String::new(), String::new()),
        };
        let mut config = Config::parse(&text)
            .map_err(|e| e.0.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        // The flags may add discovery; without it the error below says more than the warning.
        config.warnings.retain(|w| w != NO_ENDPOINTS);
        self.engine_metric_flags(&mut config, &mut warnings)?;

        if let Some(name) = &self.pool_name {
            let namespace = pool_namespace(self.pool_namespace.as_deref(), host);
            config.discovery.kubernetes = Some(self.discovery(
                &config,
                Source::InferencePool(name.clone()),
                namespace,
                &mut warnings,
            ));
        } else if let (Some(selector), Some(ports)) =
            (&self.endpoint_selector, &self.endpoint_target_ports)
        {
            let target = parse_ports(ports).and_then(|ports| {
                let selector =
                    parse_selector(selector).map_err(|e| format!("--endpoint-selector: {e}"))?;
                Target::new(selector, &ports).map_err(|e| format!("--endpoint-target-ports: {e}"))
            });
            let target = target.map_err(|e| vec![e])?;
            let namespace = pool_namespace(self.pool_namespace.as_deref(), host);
            config.discovery.kubernetes =
                Some(self.discovery(&config, Source::Static(target), namespace, &mut warnings));
        } else if self.pool_namespace.is_some() {
            warnings.push("--pool-namespace ignored: no --pool-name or --endpoint-selector".into());
        }
        if config.endpoints.is_empty() && config.discovery.kubernetes.is_none() {
            let what = if origin.is_empty() {
                "no config given".to_string()
            } else {
                format!("{origin} has no endpoints: and no discovery:")
            };
            return Err(vec![format!(
                "{what}: give --pool-name (or --endpoint-selector with --endpoint-target-ports), or a config with endpoints"
            )]);
        }

        let tls_in_config = has_picker_tls(&text);
        let secure = self
            .secure_serving
            .or((form == Form::Gie && !tls_in_config).then_some(true));
        match secure {
            Some(false) => {
                if tls_in_config {
                    warnings.push("--secure-serving=false overrides picker.tls".into());
                }
                if self.cert_path.is_some() {
                    warnings.push("--cert-path ignored: --secure-serving=false".into());
                }
                config.picker.tls = TlsConfig::default();
            }
            // The flags choose the server certificate; the config's client-certificate keys
            // (clientCaFile, clientAuth, requireClientCertFor) still apply.
            Some(true) => {
                if tls_in_config {
                    warnings.push(
                        "--secure-serving overrides picker.tls mode, certFile and keyFile".into(),
                    );
                }
                let client = std::mem::take(&mut config.picker.tls);
                config.picker.tls = match &self.cert_path {
                    Some(dir) => TlsConfig {
                        mode: TlsMode::Files,
                        cert_file: Some(dir.join("tls.crt")),
                        key_file: Some(dir.join("tls.key")),
                        ..client
                    },
                    None => TlsConfig {
                        mode: TlsMode::SelfSigned,
                        cert_file: None,
                        key_file: None,
                        ..client
                    },
                };
            }
            None if self.cert_path.is_some() => {
                let client = std::mem::take(&mut config.picker.tls);
                config.picker.tls = TlsConfig {
                    mode: TlsMode::Files,
                    cert_file: self.cert_path.as_ref().map(|d| d.join("tls.crt")),
                    key_file: self.cert_path.as_ref().map(|d| d.join("tls.key")),
                    ..client
                };
            }
            None => {}
        }

        if let Some(on) = self.debug_endpoints {
            config.picker.debug.enabled = on;
        }

        let any = |port: u16| format!("0.0.0.0:{port}");
        let health_port = match form {
            Form::Gie => Some(self.grpc_health_port.unwrap_or(9003)),
            Form::Serve => self.grpc_health_port,
        };
        Ok(ServePlan {
            config,
            grpc_addr: self
                .grpc_addr
                .or(self.grpc_port.map(any))
                .unwrap_or_else(|| any(9002)),
            admin_addr: self
                .admin_addr
                .or(self.metrics_port.map(any))
                .unwrap_or_else(|| any(9090)),
            health_addr: health_port.map(any),
            v: self.v.unwrap_or(2),
            log_format: self.log_format.or(self.zap_encoder).unwrap_or_default(),
            config_sha256: if origin.is_empty() {
                String::new()
            } else {
                sha256_hex(text.as_bytes())
            },
            config_origin: if origin.is_empty() {
                "none".into()
            } else {
                origin
            },
            warnings,
        })
    }

    /// GIE's `--*-metric` flags into `picker.engineMetrics` (a flag wins over the config).
    fn engine_metric_flags(
        &self,
        config: &mut Config,
        warnings: &mut Vec<String>,
    ) -> Result<(), Vec<String>> {
        let names = &mut config.picker.engine_metrics;
        let flags = [
            (
                "total-queued-requests-metric",
                "totalQueuedRequests",
                &self.total_queued_requests_metric,
                &mut names.total_queued_requests,
            ),
            (
                "total-running-requests-metric",
                "totalRunningRequests",
                &self.total_running_requests_metric,
                &mut names.total_running_requests,
            ),
            (
                "kv-cache-usage-percentage-metric",
                "kvCacheUsagePercentage",
                &self.kv_cache_usage_percentage_metric,
                &mut names.kv_cache_usage_percentage,
            ),
        ];
        let mut errors = Vec::new();
        for (flag, key, value, slot) in flags {
            let Some(value) = value else { continue };
            match MetricSource::parse(value) {
                Ok(source) => {
                    if slot.as_ref().is_some_and(|old| *old != source) {
                        warnings.push(format!("--{flag} overrides picker.engineMetrics.{key}"));
                    }
                    *slot = Some(source);
                }
                Err(e) => errors.push(format!("--{flag}: {e}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// `discovery.kubernetes` from the flags, keeping the config's labels.
    fn discovery(
        &self,
        config: &Config,
        source: Source,
        namespace: String,
        warnings: &mut Vec<String>,
    ) -> KubernetesConfig {
        let old = config.discovery.kubernetes.as_ref();
        if let Some(old) = old {
            warnings.push(format!(
                "the discovery flags replace the config's discovery.kubernetes source ({})",
                old.describe(old.namespace.as_deref().unwrap_or("<default>"))
            ));
        }
        KubernetesConfig {
            namespace: Some(namespace),
            source,
            role_label: old.and_then(|k| k.role_label.clone()),
            model_label: old.and_then(|k| k.model_label.clone()),
            kv_events_port: old.and_then(|k| k.kv_events_port),
            kv_events_replay_port: old.and_then(|k| k.kv_events_replay_port),
        }
    }
}

/// `8000,8001` (GIE's list syntax).
fn parse_ports(text: &str) -> Result<Vec<i64>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<i64>()
                .map_err(|_| format!("--endpoint-target-ports: {p:?} is not a port number"))
        })
        .collect()
}

/// Whether the config document sets `picker.tls` (then the GIE form keeps it).
fn has_picker_tls(text: &str) -> bool {
    serde_yaml_ng::from_str::<Yaml>(text)
        .ok()
        .and_then(|doc| doc.get("picker")?.get("tls").cloned())
        .is_some()
}

pub mod kv_relay;

#[cfg(test)]
mod tests;
