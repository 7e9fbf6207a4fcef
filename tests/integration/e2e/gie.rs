//! The bare `prefix-picker [FLAGS]` (the GIE form) as GIE's chart runs it: Go flag syntax, GIE's
//! flags (unused ones ignored with a warning), TLS by default, gRPC health on its own plaintext
//! port, and the errors that name the flags involved.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::Value;
use testkit::Process;
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::harness::poll;

/// Every service name a probe or a gateway may ask for.
const SERVICES: [&str; 5] = [
    "",
    "liveness",
    "readiness",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// One static endpoint (never dialled: scraping is off).
const CONFIG: &str =
    "endpoints: [{name: p, address: 127.0.0.1:9}]\npicker: {scrapeIntervalSeconds: 0}\n";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-picker"))
}

/// The picker's listeners as logged at start (`0.0.0.0:PORT` read as loopback).
pub(crate) struct Started {
    pub process: Process,
    pub log: String,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub health: SocketAddr,
}

/// A field of the "prefix-picker serving" line, console (`key=value`) or JSON.
fn logged(line: &str, key: &str) -> Option<SocketAddr> {
    let text = match serde_json::from_str::<Value>(line) {
        Ok(v) => v.get(key)?.as_str()?.to_string(),
        Err(_) => line
            .split(&format!("{key}="))
            .nth(1)?
            .split_whitespace()
            .next()?
            .to_string(),
    };
    let addr: SocketAddr = text.parse().ok()?;
    Some(SocketAddr::from(([127, 0, 0, 1], addr.port())))
}

pub(crate) async fn start(args: &[&str], dir: &Path) -> Started {
    start_with_env(args, &[], dir).await
}

/// [`start`] with variables added to the binary's environment.
pub(crate) async fn start_with_env(args: &[&str], env: &[(&str, &str)], dir: &Path) -> Started {
    let log_path = dir.join("picker.log");
    let child = bin()
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut process = Process::new(child, "127.0.0.1:0".parse().unwrap());
    let (grpc, admin, health) = poll("the picker to log its listeners", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Ok(Some(status)) = process.try_wait() {
            panic!("prefix-picker exited ({status}): {log}");
        }
        let line = log
            .lines()
            .find(|l| l.contains("prefix-picker serving"))
            .map(str::to_string);
        async move {
            let line = line?;
            Some((
                logged(&line, "grpc_addr")?,
                logged(&line, "admin_addr")?,
                logged(&line, "health_addr")?,
            ))
        }
    })
    .await;
    Started {
        log: std::fs::read_to_string(&log_path).unwrap(),
        process,
        grpc,
        admin,
        health,
    }
}

/// Each service's status over plaintext gRPC, or the connection error.
async fn health(addr: SocketAddr) -> Result<Vec<i32>, String> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = HealthClient::new(channel);
    let mut statuses = Vec::new();
    for service in SERVICES {
        let reply = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .map_err(|e| format!("{service:?}: {e}"))?;
        statuses.push(reply.into_inner().status);
    }
    Ok(statuses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gie_form_answers_health_on_its_port_and_metrics_without_auth() {
    let dir = tempfile::tempdir().unwrap();
    let picker = start(
        &[
            "--secure-serving=false",
            "-grpc-port",
            "0",
            "--grpc-health-port=0",
            "-metrics-port=0",
            "--config-text",
            CONFIG,
            "-v=2",
            "--zap-encoder",
            "console",
            "--pool-group",
            "inference.networking.k8s.io",
            "--kv-cache-usage-percentage-metric",
            "vllm:gpu_cache_usage_perc",
            "--lora-info-metric",
            "vllm:lora_requests_info",
            "--enable-pprof",
            "--refresh-metrics-interval=50ms",
            "--some-future-flag=1",
        ],
        dir.path(),
    )
    .await;
    let serving = vec![1; SERVICES.len()];
    assert_eq!(health(picker.health).await.unwrap(), serving, "health port");
    assert_eq!(health(picker.grpc).await.unwrap(), serving, "gRPC port");
    let metrics = reqwest::get(format!("http://{}/metrics", picker.admin))
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("# HELP"));
    for warning in [
        "flag --lora-info-metric=\"vllm:lora_requests_info\" ignored: a GIE flag",
        "flag --enable-pprof ignored: a GIE flag",
        "flag --refresh-metrics-interval=\"50ms\" ignored: a GIE flag",
        "flag --some-future-flag=\"1\" ignored: unknown flag",
    ] {
        assert!(
            picker
                .log
                .lines()
                .any(|l| l.contains(" WARN ") && l.contains(warning)),
            "{warning}\n{}",
            picker.log
        );
    }
    // The engine-metric flags are used, not ignored.
    assert!(
        !picker.log.contains("kv-cache-usage-percentage-metric"),
        "{}",
        picker.log
    );
    drop(picker.process);
}

/// Accepts any server certificate (GIE's gateways skip verification of the self-signed one)
/// but checks the handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS handshake offering ALPN h2: the server's certificate chain and the protocol chosen.
fn tls_handshake(addr: SocketAddr) -> (usize, Option<Vec<u8>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).unwrap();
    }
    (
        conn.peer_certificates().map_or(0, <[_]>::len),
        conn.alpn_protocol().map(<[u8]>::to_vec),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gie_form_serves_tls_by_default_and_logs_json() {
    let dir = tempfile::tempdir().unwrap();
    let picker = start(
        &[
            "--grpc-port=0",
            "--grpc-health-port=0",
            "--metrics-port=0",
            "--config-text",
            CONFIG,
            "--zap-encoder=json",
        ],
        dir.path(),
    )
    .await;
    let grpc = picker.grpc;
    let (certificates, alpn) = tokio::task::spawn_blocking(move || tls_handshake(grpc))
        .await
        .unwrap();
    assert_eq!(
        (certificates, alpn.as_deref()),
        (1, Some(&b"h2"[..])),
        "one self-signed certificate, ALPN h2"
    );
    assert!(
        health(picker.grpc).await.is_err(),
        "plaintext gRPC on the TLS port"
    );
    // Probes stay plaintext on the health port.
    assert_eq!(
        health(picker.health).await.unwrap(),
        vec![1; SERVICES.len()]
    );
    for line in picker.log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }
    assert!(
        picker.log.contains("\"tls\":\"selfSigned\""),
        "{}",
        picker.log
    );
    drop(picker.process);
}

/// Runs the binary to completion; (exit code, stderr).
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = bin().args(args).env_remove("RUST_LOG").output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn gie_form_errors_name_the_flags_involved() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.to_str().unwrap();
    for (args, message) in [
        (
            vec!["--config", config, "-config-file", config],
            "--config and --config-file name the same setting: give only one",
        ),
        (
            vec![
                "--config",
                config,
                "--grpc-addr",
                "127.0.0.1:0",
                "--grpc-port=0",
            ],
            "--grpc-addr and --grpc-port name the same setting: give only one",
        ),
        (
            vec![
                "serve",
                "--config",
                config,
                "--admin-addr=127.0.0.1:0",
                "--metrics-port",
                "0",
            ],
            "--admin-addr and --metrics-port name the same setting: give only one",
        ),
        (
            vec![
                "--pool-name",
                "pool",
                "--endpoint-selector",
                "app=vllm",
                "--endpoint-target-ports",
                "8000",
            ],
            "--pool-name and --endpoint-selector both say where pods come from: give only one",
        ),
        (
            vec!["--secure-serving=false"],
            "no config given: give --pool-name",
        ),
    ] {
        let (code, stderr) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }

    // What GIE's chart mounts for its own picker is read as llm-d reads it; strictly: an
    // unknown plugin type stops start-up naming the file, the line and the type.
    let epc = dir.path().join("default-plugins.yaml");
    std::fs::write(
        &epc,
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n",
    )
    .unwrap();
    let epc = epc.to_str().unwrap();
    let (code, stderr) = run(&["validate", "--config", epc]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("DEPRECATION: apiVersion"), "{stderr}");
    let bad = dir.path().join("bad-plugins.yaml");
    std::fs::write(
        &bad,
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: made-up-scorer\n",
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let want = format!(
        "EndpointPickerConfig {bad}: plugins[made-up-scorer] (line 4): unknown plugin type \"made-up-scorer\"; supported: prefix-cache-scorer"
    );
    for args in [
        vec!["--pool-name", "pool", "--config-file", bad],
        vec!["validate", "--config", bad],
    ] {
        let (code, stderr) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&want), "{args:?}: {stderr}");
    }
}
