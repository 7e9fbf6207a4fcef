//! TLS on the gRPC port: a self-signed picker behind Envoy (and refused in plaintext), and
//! certificate files served as given.

use super::{SYSTEM, assert_sticky, chat, envoy_for, send, stack, three_backends};
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
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

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
