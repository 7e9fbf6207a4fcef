//! [`ServeArgs::resolve`]: the form's defaults, the config loaded, the flags folded into it, as
//! steps: conflicting flags -> the config text -> engine-metric flags -> discovery flags -> an
//! endpoint source required -> TLS flags -> the listen addresses.

use std::path::Path;

use serde_yaml_ng::Value as Yaml;

use super::{Form, Host, POOL_GROUP, ServeArgs, ServePlan, pool_namespace, sha256_hex};
use crate::config::{Config, NO_ENDPOINTS};
use crate::discovery::target::{Target, parse_selector};
use crate::discovery::{KubernetesConfig, Source};
use crate::pod_metrics::names::MetricSource;
use crate::tls::{TlsConfig, TlsMode};

/// The config document as given: its text and where it came from (a path, `--config-text`, or
/// empty without one).
struct ConfigText {
    text: String,
    origin: String,
}

impl ServeArgs {
    /// Applies the form's defaults, loads the config and folds the flags into it. Errors are
    /// complete sentences naming the flags involved.
    pub fn resolve(self, form: Form, host: &Host<'_>) -> Result<ServePlan, Vec<String>> {
        let errors = self.conflicts();
        if !errors.is_empty() {
            return Err(errors);
        }
        let source = self.config_text(host)?;
        let mut config = Config::parse(&source.text).map_err(|e| {
            let e = e.in_file(&source.origin, &source.text);
            e.0.iter().map(ToString::to_string).collect::<Vec<_>>()
        })?;
        // The flags may add discovery; without it the error below says more than the warning.
        config.warnings.retain(|w| w != NO_ENDPOINTS);
        let mut warnings = Vec::new();
        self.engine_metric_flags(&mut config, &mut warnings)?;
        self.discovery_flags(&mut config, host, &mut warnings)?;
        require_endpoints(&config, &source.origin)?;
        let tls_in_config = has_picker_tls(&source.text);
        let secure = self
            .secure_serving
            .or((form == Form::Gie && !tls_in_config).then_some(true));
        let tls = std::mem::take(&mut config.picker.tls);
        config.picker.tls = tls_flags(
            secure,
            self.cert_path.as_deref(),
            tls_in_config,
            tls,
            &mut warnings,
        );
        if let Some(on) = self.debug_endpoints {
            config.picker.debug.enabled = on;
        }
        Ok(self.plan(form, config, source, warnings))
    }

    /// Flags that contradict each other, one sentence each.
    fn conflicts(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let pairs = [
            (
                "config",
                "config-file",
                self.config.is_some() && self.config_file.is_some(),
            ),
            (
                "grpc-addr",
                "grpc-port",
                self.grpc_addr.is_some() && self.grpc_port.is_some(),
            ),
            (
                "admin-addr",
                "metrics-port",
                self.admin_addr.is_some() && self.metrics_port.is_some(),
            ),
            (
                "log-format",
                "zap-encoder",
                self.log_format.is_some() && self.zap_encoder.is_some(),
            ),
        ];
        for (a, b, both) in pairs {
            if both {
                errors.push(format!(
                    "--{a} and --{b} name the same setting: give only one"
                ));
            }
        }
        if self.config_file().is_some() && self.config_text.is_some() {
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
        errors
    }

    /// `--config`, else `--config-file`.
    fn config_file(&self) -> Option<&Path> {
        self.config.as_deref().or(self.config_file.as_deref())
    }

    /// The config file's text, or `--config-text`'s, or none.
    fn config_text(&self, host: &Host<'_>) -> Result<ConfigText, Vec<String>> {
        Ok(match (self.config_file(), &self.config_text) {
            (Some(path), _) => match (host.read)(path) {
                Ok(text) => ConfigText {
                    text,
                    origin: path.display().to_string(),
                },
                Err(e) => return Err(vec![format!("cannot read {}: {e}", path.display())]),
            },
            (None, Some(text)) => ConfigText {
                text: text.clone(),
                origin: "--config-text".to_string(),
            },
            (None, None) => ConfigText {
                text: String::new(),
                origin: String::new(),
            },
        })
    }

    /// `--pool-name` or `--endpoint-selector` into `discovery.kubernetes`.
    fn discovery_flags(
        &self,
        config: &mut Config,
        host: &Host<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<(), Vec<String>> {
        let source = if let Some(name) = &self.pool_name {
            Source::InferencePool(name.clone())
        } else if let (Some(selector), Some(ports)) =
            (&self.endpoint_selector, &self.endpoint_target_ports)
        {
            Source::Static(static_target(selector, ports).map_err(|e| vec![e])?)
        } else {
            if self.pool_namespace.is_some() {
                warnings
                    .push("--pool-namespace ignored: no --pool-name or --endpoint-selector".into());
            }
            return Ok(());
        };
        let namespace = pool_namespace(self.pool_namespace.as_deref(), host);
        config.discovery.kubernetes = Some(self.discovery(config, source, namespace, warnings));
        Ok(())
    }

    /// The plan: the config and the listen addresses, the form's defaults filled in.
    fn plan(
        self,
        form: Form,
        config: Config,
        source: ConfigText,
        warnings: Vec<String>,
    ) -> ServePlan {
        let any = |port: u16| format!("0.0.0.0:{port}");
        let health_port = match form {
            Form::Gie => Some(self.grpc_health_port.unwrap_or(9003)),
            Form::Serve => self.grpc_health_port,
        };
        let (v, log_format) = self.logging();
        let given = !source.origin.is_empty();
        ServePlan {
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
            v,
            log_format,
            config_sha256: if given {
                sha256_hex(source.text.as_bytes())
            } else {
                String::new()
            },
            config_origin: if given { source.origin } else { "none".into() },
            warnings,
        }
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
            inference_objectives: old.is_some_and(|k| k.inference_objectives),
        }
    }
}

/// The pods `--endpoint-selector` and `--endpoint-target-ports` select.
fn static_target(selector: &str, ports: &str) -> Result<Target, String> {
    let ports = parse_ports(ports)?;
    let selector = parse_selector(selector).map_err(|e| format!("--endpoint-selector: {e}"))?;
    Target::new(selector, &ports).map_err(|e| format!("--endpoint-target-ports: {e}"))
}

/// Fails unless the config or the flags say where pods come from.
fn require_endpoints(config: &Config, origin: &str) -> Result<(), Vec<String>> {
    if !config.endpoints.is_empty() || config.discovery.kubernetes.is_some() {
        return Ok(());
    }
    let what = if origin.is_empty() {
        "no config given".to_string()
    } else {
        format!("{origin} has no endpoints: and no discovery:")
    };
    Err(vec![format!(
        "{what}: give --pool-name (or --endpoint-selector with --endpoint-target-ports), or a config with endpoints"
    )])
}

/// `picker.tls` after `--secure-serving` (`secure`, the form's default applied) and
/// `--cert-path`. The flags choose the server certificate; the config's client-certificate keys
/// (clientCaFile, clientAuth, requireClientCertFor) still apply.
fn tls_flags(
    secure: Option<bool>,
    cert_dir: Option<&Path>,
    tls_in_config: bool,
    config: TlsConfig,
    warnings: &mut Vec<String>,
) -> TlsConfig {
    let files = |dir: &Path| TlsConfig {
        mode: TlsMode::Files,
        cert_file: Some(dir.join("tls.crt")),
        key_file: Some(dir.join("tls.key")),
        ..config.clone()
    };
    match secure {
        Some(false) => {
            if tls_in_config {
                warnings.push("--secure-serving=false overrides picker.tls".into());
            }
            if cert_dir.is_some() {
                warnings.push("--cert-path ignored: --secure-serving=false".into());
            }
            TlsConfig::default()
        }
        Some(true) => {
            if tls_in_config {
                warnings.push(
                    "--secure-serving overrides picker.tls mode, certFile and keyFile".into(),
                );
            }
            match cert_dir {
                Some(dir) => files(dir),
                None => TlsConfig {
                    mode: TlsMode::SelfSigned,
                    cert_file: None,
                    key_file: None,
                    ..config
                },
            }
        }
        None => match cert_dir {
            Some(dir) => files(dir),
            None => config,
        },
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
