use std::collections::HashMap;
use std::path::Path;

use super::*;
use crate::discovery::Source;
use crate::pod_metrics::names::MetricSource;
use crate::tls::{ClientCertFor, TlsMode};

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn norm(args: &[&str]) -> (Vec<String>, Vec<String>) {
    normalize(&strings(args), &serve_flags())
}

/// A host with these variables and files, nothing else.
fn with_host<T>(env: &[(&str, &str)], files: &[(&str, &str)], f: impl FnOnce(&Host<'_>) -> T) -> T {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let files: HashMap<String, String> = files
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env_fn = |name: &str| env.get(name).cloned();
    let read_fn = |path: &Path| {
        files
            .get(path.to_str().unwrap())
            .cloned()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    };
    f(&Host {
        env: &env_fn,
        read: &read_fn,
    })
}

fn parse(args: &[&str]) -> ServeArgs {
    use clap::{Args, FromArgMatches};
    let (args, warnings) = norm(args);
    assert!(warnings.is_empty(), "{warnings:?}");
    let command = ServeArgs::augment_args(clap::Command::new("t").args_override_self(true));
    let matches = command
        .try_get_matches_from(std::iter::once("t".to_string()).chain(args))
        .unwrap();
    ServeArgs::from_arg_matches(&matches).unwrap()
}

fn resolve(args: &[&str], form: Form) -> Result<ServePlan, Vec<String>> {
    with_host(&[("NAMESPACE", "llm")], &[], |host| {
        parse(args).resolve(form, host)
    })
}

const ONE_ENDPOINT: &str = "endpoints: [{name: p, address: 127.0.0.1:8000}]";

#[test]
fn go_flag_syntax_becomes_clap_syntax() {
    let (args, warnings) = norm(&[
        "-pool-name",
        "x",
        "-v=4",
        "--secure-serving=false",
        "-grpc-port",
        "9",
        "--zap-encoder",
        "json",
        "-secure-serving",
        "-h",
    ]);
    assert_eq!(
        args,
        [
            "--pool-name=x",
            "--v=4",
            "--secure-serving=false",
            "--grpc-port=9",
            "--zap-encoder=json",
            "--secure-serving",
            "-h"
        ]
    );
    assert!(warnings.is_empty());
    // Booleans: Go's spellings, and a separate true/false as charts render them.
    let (args, warnings) = norm(&[
        "--secure-serving",
        "false",
        "-secure-serving=0",
        "--tracing",
        "False",
        "--pool-name",
        "p",
    ]);
    assert_eq!(
        args,
        [
            "--secure-serving=false",
            "--secure-serving=false",
            "--pool-name=p"
        ]
    );
    assert_eq!(
        warnings,
        ["flag --tracing=\"false\" ignored: a GIE flag prefix-picker has no use for"]
    );
    // Go takes the next argument as a value even when it starts with '-'.
    assert_eq!(norm(&["-config-text", "-x"]).0, ["--config-text=-x"]);
}

#[test]
fn ignored_and_unknown_flags_are_dropped_with_their_values() {
    let (args, warnings) = norm(&[
        "--cache-info-metric",
        "vllm:kv",
        "--lora-info-metric",
        "",
        "--enable-pprof",
        "--tracing=false",
        "--log-level",
        "error",
        "--mystery",
        "value",
        "--lonely",
        "--other=1",
        "--pool-name",
        "p",
    ]);
    assert_eq!(args, ["--pool-name=p"]);
    assert_eq!(
        warnings,
        [
            "flag --cache-info-metric=\"vllm:kv\" ignored: a GIE flag prefix-picker has no use for",
            "flag --lora-info-metric=\"\" ignored: a GIE flag prefix-picker has no use for",
            "flag --enable-pprof ignored: a GIE flag prefix-picker has no use for",
            "flag --tracing=\"false\" ignored: a GIE flag prefix-picker has no use for",
            "flag --log-level=\"error\" ignored: a GIE flag prefix-picker has no use for",
            "flag --mystery=\"value\" ignored: unknown flag",
            "flag --lonely ignored: unknown flag",
            "flag --other=\"1\" ignored: unknown flag",
        ]
    );
}

#[test]
fn pool_namespace_falls_back_in_gie_order() {
    const SA: &str = SERVICE_ACCOUNT_NAMESPACE;
    let ns = |flag: Option<&str>, env: &[(&str, &str)], files: &[(&str, &str)]| {
        with_host(env, files, |h| pool_namespace(flag, h))
    };
    let all_env = [
        ("NAMESPACE", "from-namespace"),
        ("POD_NAMESPACE", "from-pod"),
    ];
    let sa = [(SA, "from-sa\n")];
    assert_eq!(ns(Some("flag"), &all_env, &sa), "flag");
    assert_eq!(ns(None, &all_env, &sa), "from-namespace");
    assert_eq!(
        ns(
            None,
            &[("NAMESPACE", " "), ("POD_NAMESPACE", "from-pod")],
            &sa
        ),
        "from-pod"
    );
    assert_eq!(ns(None, &[], &sa), "from-sa");
    assert_eq!(ns(None, &[], &[]), "default");
    assert_eq!(ns(Some(""), &[], &[]), "default");
}

#[test]
fn alias_pairs_and_discovery_conflicts_are_errors_naming_both() {
    let errors = resolve(
        &[
            "--config",
            "a",
            "--config-file",
            "b",
            "--grpc-addr",
            "x:1",
            "--grpc-port",
            "1",
            "--admin-addr",
            "x:2",
            "--metrics-port",
            "2",
        ],
        Form::Gie,
    )
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "--config and --config-file name the same setting: give only one",
            "--grpc-addr and --grpc-port name the same setting: give only one",
            "--admin-addr and --metrics-port name the same setting: give only one",
        ]
    );
    let errors = resolve(
        &[
            "--pool-name",
            "p",
            "--endpoint-selector",
            "app=x",
            "--endpoint-target-ports",
            "80",
        ],
        Form::Gie,
    )
    .unwrap_err();
    assert_eq!(
        errors,
        ["--pool-name and --endpoint-selector both say where pods come from: give only one"]
    );
    let errors = resolve(
        &[
            "--pool-name",
            "p",
            "--pool-group",
            "inference.networking.x-k8s.io",
        ],
        Form::Gie,
    )
    .unwrap_err();
    assert!(
        errors[0].contains("inference.networking.k8s.io/v1 only"),
        "{errors:?}"
    );
    let errors = resolve(&[], Form::Serve).unwrap_err();
    assert!(
        errors[0].starts_with("no config given: give --pool-name"),
        "{errors:?}"
    );
}

#[test]
fn pool_name_becomes_inference_pool_discovery() {
    let plan = resolve(
        &[
            "--pool-name",
            "pool",
            "--config-text",
            "discovery: {kubernetes: {selector: a=b, targetPorts: [1], modelLabel: m}}",
        ],
        Form::Gie,
    )
    .unwrap();
    let k = plan.config.discovery.kubernetes.unwrap();
    assert_eq!(k.source, Source::InferencePool("pool".into()));
    assert_eq!(k.namespace.as_deref(), Some("llm"));
    assert_eq!(k.model_label.as_deref(), Some("m"));
    assert!(
        plan.warnings[0].contains("replace the config's discovery"),
        "{:?}",
        plan.warnings
    );

    let plan = resolve(
        &[
            "--endpoint-selector",
            "app=vllm",
            "--endpoint-target-ports",
            "8000,8001",
            "--pool-namespace",
            "ns",
        ],
        Form::Serve,
    )
    .unwrap();
    let k = plan.config.discovery.kubernetes.unwrap();
    let Source::Static(t) = k.source else {
        panic!()
    };
    assert_eq!(t.ports, [8000, 8001]);
    assert_eq!(k.namespace.as_deref(), Some("ns"));
}

#[test]
fn the_forms_differ_in_tls_and_health_defaults() {
    let gie = resolve(&["--config-text", ONE_ENDPOINT], Form::Gie).unwrap();
    assert_eq!(gie.config.picker.tls.mode, TlsMode::SelfSigned);
    assert_eq!(
        (
            gie.grpc_addr.as_str(),
            gie.admin_addr.as_str(),
            gie.health_addr.as_deref()
        ),
        ("0.0.0.0:9002", "0.0.0.0:9090", Some("0.0.0.0:9003"))
    );
    let serve = resolve(&["--config-text", ONE_ENDPOINT], Form::Serve).unwrap();
    assert_eq!(serve.config.picker.tls.mode, TlsMode::Plaintext);
    assert_eq!(serve.health_addr, None);

    let plain = resolve(
        &[
            "--config-text",
            ONE_ENDPOINT,
            "--secure-serving=false",
            "--grpc-port",
            "7",
        ],
        Form::Gie,
    )
    .unwrap();
    assert_eq!(plain.config.picker.tls.mode, TlsMode::Plaintext);
    assert_eq!(plain.grpc_addr, "0.0.0.0:7");
    let files = resolve(
        &["--config-text", ONE_ENDPOINT, "--cert-path", "/certs"],
        Form::Gie,
    )
    .unwrap();
    assert_eq!(
        files.config.picker.tls.cert_file.as_deref(),
        Some(Path::new("/certs/tls.crt"))
    );
    assert_eq!(
        files.config.picker.tls.key_file.as_deref(),
        Some(Path::new("/certs/tls.key"))
    );
    // The config's picker.tls stands in the GIE form unless the flag is given.
    let text = format!("{ONE_ENDPOINT}\npicker: {{tls: {{mode: plaintext}}}}");
    let kept = resolve(&["--config-text", &text], Form::Gie).unwrap();
    assert_eq!(kept.config.picker.tls.mode, TlsMode::Plaintext);
    // The flags choose the server certificate; the config's client-certificate keys stay.
    let text = format!(
        "{ONE_ENDPOINT}\npicker: {{tls: {{mode: selfSigned, clientCaFile: /ca.pem, requireClientCertFor: [accessLog]}}}}"
    );
    for flags in [&["--secure-serving"][..], &["--cert-path", "/certs"]] {
        let args: Vec<&str> = ["--config-text", text.as_str()]
            .into_iter()
            .chain(flags.iter().copied())
            .collect();
        let tls = resolve(&args, Form::Gie).unwrap().config.picker.tls;
        assert_eq!(
            tls.client_ca_file.as_deref(),
            Some(Path::new("/ca.pem")),
            "{flags:?}"
        );
        assert!(
            tls.requires_client_cert(ClientCertFor::AccessLog),
            "{flags:?}"
        );
    }
    let json = resolve(
        &[
            "--config-text",
            ONE_ENDPOINT,
            "--zap-encoder=json",
            "-v",
            "4",
        ],
        Form::Gie,
    )
    .unwrap();
    assert_eq!((json.log_format, json.v), (LogFormat::Json, 4));
}

/// Normalizes and resolves `args` in the GIE form, with `/config/router.yaml` holding `config`
/// and `$NAMESPACE=llm`; returns the plan and the ignored-flag warnings.
fn resolve_gie_chart_args(args: &[String], config: &str) -> (ServePlan, Vec<String>) {
    use clap::{Args, FromArgMatches};
    let (kept, warnings) = normalize(args, &serve_flags());
    let command = ServeArgs::augment_args(clap::Command::new("t").args_override_self(true));
    let matches = command
        .try_get_matches_from(std::iter::once("t".to_string()).chain(kept))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let parsed = ServeArgs::from_arg_matches(&matches).unwrap();
    let plan = with_host(
        &[("NAMESPACE", "llm")],
        &[("/config/router.yaml", config)],
        |host| parsed.resolve(Form::Gie, host),
    )
    .unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
    (plan, warnings)
}

/// The `epp` container's args as GIE v1.5.0's `inferencepool` chart renders them
/// (`config/charts/epplib/templates/_deployment.yaml`), one variant per branch of the template:
/// every one is accepted, the flags prefix-picker has no use for are ignored by name (never as
/// unknown), and the ones it uses take effect.
#[test]
fn every_flag_gie_v1_5_0_inferencepool_chart_passes_is_accepted() {
    let pool = [
        "--pool-name",
        "vllm-llama3",
        "--pool-namespace",
        "llm",
        "--pool-group",
        "inference.networking.k8s.io",
    ];
    let config = [
        "--zap-encoder",
        "json",
        "--config-file",
        "/config/router.yaml",
    ];
    let sglang = [
        "--total-queued-requests-metric=\"sglang:num_queue_reqs\"",
        "--total-running-requests-metric=\"sglang:num_running_reqs\"",
        "--kv-cache-usage-percentage-metric=\"sglang:token_usage\"",
        "--cache-info-metric=\"sglang:cache_config_info\"",
    ];
    let triton = [
        "--total-queued-requests-metric",
        "nv_trt_llm_request_metrics{request_type=waiting}",
        "--total-running-requests-metric",
        "nv_trt_llm_request_metrics{request_type=scheduled}",
        "--kv-cache-usage-percentage-metric",
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        "--lora-info-metric",
        "",
    ];
    let trtllm = [
        "--total-queued-requests-metric=\"trtllm_num_requests_waiting\"",
        "--total-running-requests-metric=\"trtllm_num_requests_running\"",
        "--kv-cache-usage-percentage-metric=\"trtllm_kv_cache_utilization\"",
        "--cache-info-metric=\"trtllm_cache_config_info\"",
        "--model-server-metrics-path=\"/prometheus/metrics\"",
        "--lora-info-metric",
        "",
    ];
    let cat = |parts: &[&[&str]]| -> Vec<String> {
        parts
            .iter()
            .flat_map(|p| p.iter().map(|s| s.to_string()))
            .collect()
    };
    let router = "scheduler: {plugins: {Score: {enabled: [{name: prefix-cache, weight: 1}]}}}";
    let variants: Vec<(&str, Vec<String>)> = vec![
        // vllm (the default), one replica, tracing off, metrics auth on; `flags: {v: 1}`.
        (
            "vllm",
            cat(&[&pool, &config, &["--v", "1", "--tracing=false"]]),
        ),
        // sglang, two replicas (leader election, a bare boolean), tracing on, auth off.
        (
            "sglang",
            cat(&[
                &pool,
                &sglang,
                &config,
                &[
                    "--ha-enable-leader-election",
                    "--v",
                    "1",
                    "--tracing=true",
                    "--metrics-endpoint-auth=false",
                ],
            ]),
        ),
        (
            "triton-tensorrt-llm",
            cat(&[&pool, &triton, &config, &["--v", "1", "--tracing=false"]]),
        ),
        (
            "trtllm-serve",
            cat(&[&pool, &trtllm, &config, &["--v", "1", "--tracing=false"]]),
        ),
        // endpointsServer without a pool: a selector and ports instead of --pool-*.
        (
            "endpoints-server",
            cat(&[
                &[
                    "--endpoint-selector",
                    "app=vllm",
                    "--endpoint-target-ports",
                    "8000",
                ],
                &config,
                &["--v", "1", "--tracing=false"],
            ]),
        ),
        // `inferenceExtension.flags` renders `--KEY` then `"VALUE"`: prefix-picker's own flags too.
        (
            "flags",
            cat(&[
                &pool,
                &config,
                &[
                    "--v",
                    "4",
                    "--secure-serving",
                    "false",
                    "--grpc-port",
                    "9102",
                    "--metrics-port",
                    "9190",
                    "--grpc-health-port",
                    "9103",
                    "--tracing=false",
                ],
            ]),
        ),
    ];
    for (name, args) in variants {
        let (plan, warnings) = resolve_gie_chart_args(&args, router);
        assert!(
            warnings
                .iter()
                .all(|w| w.ends_with("a GIE flag prefix-picker has no use for")),
            "{name}: {warnings:?}"
        );
        assert_eq!(plan.log_format, LogFormat::Json, "{name}");
        let k = plan.config.discovery.kubernetes.as_ref().unwrap();
        match name {
            "endpoints-server" => assert!(
                matches!(&k.source, Source::Static(t) if t.ports == [8000]),
                "{name}"
            ),
            _ => {
                assert_eq!(
                    k.source,
                    Source::InferencePool("vllm-llama3".into()),
                    "{name}"
                );
                assert_eq!(k.namespace.as_deref(), Some("llm"), "{name}");
            }
        }
        let m = &plan.config.picker.engine_metrics;
        let spec = |s: &Option<MetricSource>| match s {
            Some(MetricSource::Spec(spec)) => Some(spec.to_string()),
            Some(MetricSource::Off) => Some(String::new()),
            None => None,
        };
        let specs = [
            spec(&m.total_queued_requests),
            spec(&m.total_running_requests),
            spec(&m.kv_cache_usage_percentage),
        ];
        let expected: [Option<&str>; 3] = match name {
            // The chart's quotes are not part of the name.
            "sglang" => [
                Some("sglang:num_queue_reqs"),
                Some("sglang:num_running_reqs"),
                Some("sglang:token_usage"),
            ],
            "triton-tensorrt-llm" => [
                Some("nv_trt_llm_request_metrics{request_type=waiting}"),
                Some("nv_trt_llm_request_metrics{request_type=scheduled}"),
                Some("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),
            ],
            "trtllm-serve" => [
                Some("trtllm_num_requests_waiting"),
                Some("trtllm_num_requests_running"),
                Some("trtllm_kv_cache_utilization"),
            ],
            _ => [None; 3],
        };
        assert_eq!(specs, expected.map(|s| s.map(String::from)), "{name}");
        if name == "flags" {
            assert_eq!(plan.v, 4);
            assert_eq!(plan.config.picker.tls.mode, TlsMode::Plaintext);
            assert_eq!(
                (
                    plan.grpc_addr.as_str(),
                    plan.admin_addr.as_str(),
                    plan.health_addr.as_deref()
                ),
                ("0.0.0.0:9102", "0.0.0.0:9190", Some("0.0.0.0:9103"))
            );
        } else {
            assert_eq!(plan.v, 1, "{name}");
            // The chart passes no port flags: the GIE form's defaults are its container ports.
            assert_eq!(plan.config.picker.tls.mode, TlsMode::SelfSigned, "{name}");
            assert_eq!(
                (
                    plan.grpc_addr.as_str(),
                    plan.admin_addr.as_str(),
                    plan.health_addr.as_deref()
                ),
                ("0.0.0.0:9002", "0.0.0.0:9090", Some("0.0.0.0:9003")),
                "{name}"
            );
        }
    }
}

#[test]
fn every_gie_v1_5_0_picker_flag_is_known() {
    // pkg/epp/server/options.go and its logging options at GIE v1.5.0 (pflag names).
    const GIE_V1_5_0: &[&str] = &[
        "grpc-port",
        "ha-enable-leader-election",
        "pool-group",
        "pool-namespace",
        "pool-name",
        "endpoint-selector",
        "endpoint-target-ports",
        "disable-endpoint-subset-filter",
        "model-server-metrics-scheme",
        "model-server-metrics-path",
        "model-server-metrics-port",
        "model-server-metrics-https-insecure-skip-verify",
        "refresh-metrics-interval",
        "refresh-prometheus-metrics-interval",
        "metrics-staleness-threshold",
        "total-queued-requests-metric",
        "total-running-requests-metric",
        "kv-cache-usage-percentage-metric",
        "lora-info-metric",
        "cache-info-metric",
        "v",
        "zap-devel",
        "zap-encoder",
        "zap-log-level",
        "zap-stacktrace-level",
        "zap-time-encoding",
        "tracing",
        "health-checking",
        "metrics-port",
        "grpc-health-port",
        "enable-pprof",
        "cert-path",
        "enable-cert-reload",
        "secure-serving",
        "metrics-endpoint-auth",
        "config-file",
        "config-text",
    ];
    let known = serve_flags();
    for flag in GIE_V1_5_0 {
        let (_, warnings) = normalize(&[format!("--{flag}=1")], &known);
        assert!(
            warnings.iter().all(|w| !w.contains("unknown flag")),
            "--{flag}: {warnings:?}"
        );
    }
}

#[test]
fn engine_metric_flags_set_the_config_and_name_themselves_in_errors() {
    let config = "endpoints: [{name: p, address: 127.0.0.1:8000}]\n\
        picker: {engineMetrics: {totalQueuedRequests: a, totalRunningRequests: b}}";
    let plan = with_host(&[], &[("/c.yaml", config)], |host| {
        parse(&[
            "--config=/c.yaml",
            "--total-queued-requests-metric",
            "waiting{queue=main}",
            "--kv-cache-usage-percentage-metric=",
        ])
        .resolve(Form::Serve, host)
    })
    .unwrap();
    let m = &plan.config.picker.engine_metrics;
    assert_eq!(
        m.total_queued_requests,
        Some(MetricSource::parse("waiting{queue=main}").unwrap())
    );
    assert_eq!(
        m.total_running_requests,
        Some(MetricSource::parse("b").unwrap())
    );
    assert_eq!(m.kv_cache_usage_percentage, Some(MetricSource::Off));
    assert!(
        plan.warnings.contains(
            &"--total-queued-requests-metric overrides picker.engineMetrics.totalQueuedRequests"
                .to_string()
        ),
        "{:?}",
        plan.warnings
    );
    let e = resolve(
        &[
            "--config-text",
            ONE_ENDPOINT,
            "--total-running-requests-metric",
            "running{oops}",
        ],
        Form::Serve,
    )
    .unwrap_err();
    assert_eq!(
        e,
        [
            "--total-running-requests-metric: metric spec \"running{oops}\": labels are written label=value"
        ]
    );
}

#[test]
fn debug_endpoints_are_off_unless_the_flag_or_the_config_turns_them_on() {
    for form in [Form::Serve, Form::Gie] {
        let off = resolve(&["--config-text", ONE_ENDPOINT], form).unwrap();
        assert!(!off.config.picker.debug.enabled, "{form:?}");
        let on = resolve(&["--config-text", ONE_ENDPOINT, "--debug-endpoints"], form).unwrap();
        assert!(on.config.picker.debug.enabled, "{form:?}");
        let go = resolve(
            &["--config-text", ONE_ENDPOINT, "-debug-endpoints=true"],
            form,
        )
        .unwrap();
        assert!(go.config.picker.debug.enabled, "{form:?}");
    }
    let config = format!("{ONE_ENDPOINT}\npicker: {{debug: {{enabled: true}}}}");
    let from_config = resolve(&["--config-text", &config], Form::Serve).unwrap();
    assert!(from_config.config.picker.debug.enabled);
    let overridden = resolve(
        &["--config-text", &config, "--debug-endpoints=false"],
        Form::Serve,
    )
    .unwrap();
    assert!(!overridden.config.picker.debug.enabled);
}
