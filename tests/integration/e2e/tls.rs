//! TLS on the gRPC port: a self-signed picker behind Envoy (and refused in plaintext),
//! certificate files served as given, and client certificates: optional for ext_proc, verified
//! against the client CAs, and required of the access log when configured.

use std::path::PathBuf;

use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::{SYSTEM, addrs, assert_sticky, chat, envoy_for, send, stack, three_backends};
use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_signed_tls_picker_routes_behind_envoy_and_refuses_plaintext() {
    let tls = "picker:\n  tls: {mode: selfSigned}\n";
    let (_backends, picker, envoy) = stack("envoy-tls.yaml", tls, |s| s).await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/chat/completions",
        &chat(SYSTEM, "Is the gRPC port encrypted?"),
    )
    .await;

    // The same picker behind a plaintext Envoy: the picker cannot be reached, and the
    // fail-closed filter answers with an error rather than routing blind.
    let backends = three_backends().await;
    let plain = envoy_for("envoy.yaml", picker.grpc_addr.port(), &backends).await;
    let reply = send(&plain, "/v1/chat/completions", &chat(SYSTEM, "plaintext?")).await;
    assert!(reply.status >= 500, "{reply:?}");
    assert!(reply.served_by.is_empty(), "{reply:?}");
    picker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_serve_the_given_certificate() {
    // A CA and a server certificate it signed, as cert-manager would mount them.
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();

    let backends = three_backends().await;
    let extra = format!(
        "picker:\n  tls: {{mode: files, certFile: {}, keyFile: {}}}\n",
        cert.display(),
        key.display()
    );
    let picker = start_picker(picker_config(&backends.iter().collect::<Vec<_>>(), &extra)).await;
    let url = format!("https://localhost:{}", picker.grpc_addr.port());

    let trusting = |ca_pem: String| {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca_pem))
            .domain_name("localhost")
    };
    let channel = Channel::from_shared(url.clone())
        .unwrap()
        .tls_config(trusting(ca.pem()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, 1, "SERVING");

    // A client trusting another CA refuses the picker's certificate.
    let other = prefix_picker::tls::self_signed().unwrap();
    let refused = Channel::from_shared(url)
        .unwrap()
        .tls_config(trusting(other.cert_pem))
        .unwrap()
        .connect()
        .await;
    assert!(refused.is_err(), "a certificate from an untrusted CA");
    picker.stop().await.unwrap();
}

/// A certificate and its key, PEM.
struct Pem {
    cert: String,
    key: String,
}

/// A CA issuing a server certificate for `localhost` and a client certificate, and a second,
/// untrusted CA issuing a client certificate too; all written to a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    server: Pem,
    client: Pem,
    stranger: Pem,
}

impl Pki {
    fn new() -> Pki {
        let ca = Self::ca();
        let other_ca = Self::ca();
        Pki {
            dir: tempfile::tempdir().unwrap(),
            ca: ca.pem(),
            server: Self::leaf(&ca, "localhost", rcgen::ExtendedKeyUsagePurpose::ServerAuth),
            client: Self::leaf(&ca, "gateway", rcgen::ExtendedKeyUsagePurpose::ClientAuth),
            stranger: Self::leaf(
                &other_ca,
                "gateway",
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ),
        }
    }

    fn ca() -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // rcgen's default subject for every certificate would make each leaf look self-signed
        // to Envoy (BoringSSL): subject equal to its issuer.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "prefix-picker test CA");
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
    }

    fn leaf(
        ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        name: &str,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Pem {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        Pem {
            cert: params.signed_by(&key, ca).unwrap().pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes `text` to `name` in the directory; its path.
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The `picker:` section serving the server certificate, trusting the CA for clients.
    fn picker_section(&self, more: &str) -> String {
        format!(
            "picker:\n  tls: {{mode: files, certFile: {}, keyFile: {}, clientCaFile: {}{more}}}\n",
            self.file("server.crt", &self.server.cert).display(),
            self.file("server.key", &self.server.key).display(),
            self.file("ca.crt", &self.ca).display(),
        )
    }
}

/// Checks the picker's `readiness` health over TLS, as a client trusting `pki`'s CA that
/// presents `identity` (or none): the status, or the error of the handshake or the call.
async fn health_over_tls(port: u16, pki: &Pki, identity: Option<&Pem>) -> Result<i32, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    // TLS 1.3: the client has finished its handshake before the server checks its certificate,
    // so a refused certificate may only show on the first call.
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| format!("call: {e:?}"))
}

/// With a client CA (optional client auth by default), a client without a certificate still
/// gets in, one with a certificate from the CA too, and one from another CA fails the
/// handshake; with `clientAuth: required` the client without one is refused as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_auth_lets_clients_without_a_certificate_in() {
    let pki = Pki::new();
    let backends = three_backends().await;
    let backend_refs = backends.iter().collect::<Vec<_>>();
    let picker = start_picker(picker_config(&backend_refs, &pki.picker_section(""))).await;
    let port = picker.grpc_addr.port();
    assert_eq!(
        health_over_tls(port, &pki, None).await,
        Ok(1),
        "no certificate"
    );
    assert_eq!(
        health_over_tls(port, &pki, Some(&pki.client)).await,
        Ok(1),
        "a certificate from the client CA"
    );
    let stranger = health_over_tls(port, &pki, Some(&pki.stranger)).await;
    assert!(
        stranger.is_err(),
        "a certificate from another CA: {stranger:?}"
    );
    picker.stop().await.unwrap();

    let required = pki.picker_section(", clientAuth: required");
    let picker = start_picker(picker_config(&backend_refs, &required)).await;
    let port = picker.grpc_addr.port();
    let anonymous = health_over_tls(port, &pki, None).await;
    assert!(
        anonymous.is_err(),
        "required, no certificate: {anonymous:?}"
    );
    assert_eq!(health_over_tls(port, &pki, Some(&pki.client)).await, Ok(1));
    picker.stop().await.unwrap();
}

/// `envoy.yaml` speaking TLS to the picker (verifying it against the CA, presenting no client
/// certificate), with the access log on a cluster of its own that presents `client` (or none):
/// the setup docs/envoy.md describes for `requireClientCertFor: [accessLog]`.
fn envoy_with_access_log_certificate(
    pki: &Pki,
    picker_port: u16,
    backends: &[Backend],
    client: Option<&Pem>,
) -> String {
    let ca = pki.file("ca.crt", &pki.ca);
    let tls = |certificate: &str| {
        format!(
            r#"    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: ["h2"]
          validation_context: {{trusted_ca: {{filename: {ca}}}}}
{certificate}"#,
            ca = ca.display()
        )
    };
    let certificate = match client {
        Some(id) => format!(
            "          tls_certificates:\n          - {{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}\n",
            pki.file("client.crt", &id.cert).display(),
            pki.file("client.key", &id.key).display(),
        ),
        None => String::new(),
    };
    let als_cluster = format!(
        r#"  - name: prefix-picker-als
    connect_timeout: 1s
    type: STATIC
{tls}    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: prefix-picker-als
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {picker_port}}}}}}}
"#,
        tls = tls(&certificate)
    );
    render_envoy("envoy.yaml", picker_port, &addrs(backends), |s| {
        let s = replaced(
            &s,
            "grpc_service: {envoy_grpc: {cluster_name: prefix-picker}}\n                buffer_size_bytes",
            "grpc_service: {envoy_grpc: {cluster_name: prefix-picker-als}}\n                buffer_size_bytes",
        );
        let s = replaced(
            &s,
            "    type: STATIC\n    typed_extension_protocol_options:",
            &format!(
                "    type: STATIC\n{}    typed_extension_protocol_options:",
                tls("")
            ),
        );
        format!("{s}{als_cluster}")
    })
}

/// With `requireClientCertFor: [accessLog]`: through a real Envoy whose ext_proc cluster presents
/// no client certificate, requests are routed either way; the access-log entry of an Envoy whose
/// access-log cluster presents none is refused (counted, nothing recorded, the route still
/// waiting), and that of an Envoy whose access-log cluster presents the CA's client certificate
/// is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_counts_only_with_a_client_certificate_when_required() {
    let pki = Pki::new();
    let backends = three_backends().await;
    let section = pki.picker_section(", requireClientCertFor: [accessLog]");
    let picker = start_picker(picker_config(
        &backends.iter().collect::<Vec<_>>(),
        &section,
    ))
    .await;
    let port = picker.grpc_addr.port();
    let refused = "prefix_picker_access_log_entries_total{result=\"no_client_cert\"}";
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";

    let anonymous = start_envoy(envoy_with_access_log_certificate(
        &pki, port, &backends, None,
    ))
    .await;
    let body = json!({"model": "m", "prompt": "logged without a client certificate"});
    let r = send(&anonymous, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{:?}\n{}", r.body, anonymous.log());
    wait_metric(&picker, refused, 1.0).await;
    assert_eq!(metric_opt(&picker, recorded).await.unwrap_or(0.0), 0.0);
    // The route still waits for its completion (the gauge is refreshed every second).
    wait_metric_eq(&picker, "prefix_picker_pending_routes", 1.0).await;
    assert_eq!(prefix_score(&picker, &body, &r.served_by).await, 0);

    let certified = start_envoy(envoy_with_access_log_certificate(
        &pki,
        port,
        &backends,
        Some(&pki.client),
    ))
    .await;
    let body = json!({"model": "m", "prompt": "logged with the gateway's client certificate"});
    let r = send(&certified, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{:?}\n{}", r.body, certified.log());
    wait_metric(&picker, recorded, 1.0).await;
    assert_eq!(prefix_score(&picker, &body, &r.served_by).await, 100);
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_access_log_entries_total{result=\"claimed\"}"
        )
        .await,
        1.0
    );
    // The refused entry's route still waits: end the access-log streams before stopping, or
    // the drain would hold them open for it.
    drop((anonymous, certified));
    picker.stop().await.unwrap();
}
