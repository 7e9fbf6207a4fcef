//! Config checks and certificate loading.

use super::*;

#[test]
fn plaintext_is_the_default_and_has_no_identity() {
    let tls = TlsConfig::default();
    assert_eq!(tls.mode, TlsMode::Plaintext);
    assert!(tls.identity().unwrap().is_none());
}

#[test]
fn files_mode_needs_both_files() {
    let tls = TlsConfig {
        mode: TlsMode::Files,
        ..TlsConfig::default()
    };
    let errors: Vec<String> = tls.validate().iter().map(|e| e.to_string()).collect();
    assert_eq!(
        errors,
        [
            "tls: mode files needs certFile",
            "tls: mode files needs keyFile"
        ]
    );
}

#[test]
fn files_outside_files_mode_are_errors() {
    let tls = TlsConfig {
        mode: TlsMode::SelfSigned,
        cert_file: Some("c.pem".into()),
        ..TlsConfig::default()
    };
    assert_eq!(
        tls.validate()[0].to_string(),
        "tls: certFile is only used with mode files, got mode selfSigned"
    );
}

#[test]
fn self_signed_identity_is_pem() {
    let id = TlsConfig {
        mode: TlsMode::SelfSigned,
        ..TlsConfig::default()
    }
    .identity()
    .unwrap()
    .unwrap();
    assert!(id.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(id.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
}

#[test]
fn files_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let generated = self_signed().unwrap();
    let (cert, key, junk) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("junk"),
    );
    std::fs::write(&cert, &generated.cert_pem).unwrap();
    std::fs::write(&key, &generated.key_pem).unwrap();
    std::fs::write(&junk, "not pem").unwrap();
    let files = |c: &Path, k: &Path| TlsConfig {
        mode: TlsMode::Files,
        cert_file: Some(c.to_path_buf()),
        key_file: Some(k.to_path_buf()),
        ..TlsConfig::default()
    };
    let id = files(&cert, &key).identity().unwrap().unwrap();
    assert_eq!(id.cert_pem, generated.cert_pem);
    let err = files(&junk, &key).identity().unwrap_err().to_string();
    assert_eq!(
        err,
        format!("tls: {} holds no PEM CERTIFICATE", junk.display())
    );
    let missing = dir.path().join("missing.crt");
    let err = files(&missing, &key).identity().unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("tls: cannot read {}: ", missing.display())),
        "{err}"
    );
}

/// A fresh CA certificate, PEM.
fn ca_pem() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

fn client_tls(yaml: &str) -> Result<TlsConfig, String> {
    let tls: TlsConfig = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
    match tls.validate().first() {
        Some(e) => Err(e.to_string()),
        None => Ok(tls),
    }
}

#[test]
fn client_auth_defaults_to_optional_with_a_client_ca_and_none_without() {
    let with_ca = client_tls("{mode: selfSigned, clientCaFile: ca.pem}").unwrap();
    assert_eq!(with_ca.client_auth(), ClientAuth::Optional);
    assert!(!with_ca.requires_client_cert(ClientCertFor::AccessLog));
    let required = client_tls("{mode: selfSigned, clientCaFile: ca.pem, clientAuth: required}");
    assert_eq!(required.unwrap().client_auth(), ClientAuth::Required);
    assert_eq!(TlsConfig::default().client_auth(), ClientAuth::None);
    let gated =
        client_tls("{mode: files, certFile: c, keyFile: k, clientCaFile: ca.pem, requireClientCertFor: [accessLog]}")
            .unwrap();
    assert!(gated.requires_client_cert(ClientCertFor::AccessLog));
}

#[test]
fn client_certificate_keys_that_cannot_apply_are_errors_naming_the_key() {
    let cases = [
        (
            "{clientCaFile: ca.pem}",
            "tls: clientCaFile needs mode selfSigned or files, got mode plaintext",
        ),
        (
            "{mode: selfSigned, clientAuth: optional}",
            "tls: clientAuth optional needs clientCaFile",
        ),
        (
            "{mode: selfSigned, clientAuth: required}",
            "tls: clientAuth required needs clientCaFile",
        ),
        (
            "{mode: selfSigned, clientCaFile: ca.pem, clientAuth: none}",
            "tls: clientCaFile is unused with clientAuth none",
        ),
        (
            "{mode: selfSigned, requireClientCertFor: [accessLog]}",
            "tls: requireClientCertFor accessLog needs client certificates: set clientCaFile, with clientAuth optional or required",
        ),
    ];
    for (yaml, error) in cases {
        assert_eq!(client_tls(yaml).unwrap_err(), error, "{yaml}");
    }
    // ext_proc cannot be restricted, and modes are spelled exactly.
    let e = client_tls("{mode: selfSigned, clientCaFile: ca.pem, requireClientCertFor: [extProc]}")
        .unwrap_err();
    assert!(
        e.contains("unknown variant `extProc`, expected `accessLog`"),
        "{e}"
    );
    let e =
        client_tls("{mode: selfSigned, clientCaFile: ca.pem, clientAuth: Optional}").unwrap_err();
    assert!(e.contains("unknown variant `Optional`"), "{e}");
}

#[test]
fn the_client_ca_file_is_read_and_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, other_pem) = (ca_pem(), ca_pem());
    let path = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let with_ca = |p: &Path| TlsConfig {
        mode: TlsMode::SelfSigned,
        client_ca_file: Some(p.to_path_buf()),
        ..TlsConfig::default()
    };
    let bundle = path("bundle.pem", &format!("{ca_pem}{other_pem}"));
    let tls = with_ca(&bundle).server().unwrap().unwrap();
    assert_eq!(
        tls.client_ca_pem.as_deref(),
        Some(&*format!("{ca_pem}{other_pem}"))
    );
    assert_eq!(tls.client_auth, ClientAuth::Optional);

    let junk = path("junk.pem", "not pem");
    assert_eq!(
        with_ca(&junk).server().unwrap_err().to_string(),
        format!("tls: {} holds no PEM CERTIFICATE", junk.display())
    );
    // A PEM block that is not a certificate the TLS stack can trust.
    let broken = path(
        "broken.pem",
        &format!("{ca_pem}-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
    );
    assert_eq!(
        with_ca(&broken).server().unwrap_err().to_string(),
        format!(
            "tls: {}: 1 of 2 certificates cannot serve as a client CA",
            broken.display()
        )
    );
    let missing = dir.path().join("missing.pem");
    let e = with_ca(&missing).server().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("tls: cannot read {}: ", missing.display())),
        "{e}"
    );
    // Without a client CA nothing is asked of clients.
    let plain = TlsConfig {
        mode: TlsMode::SelfSigned,
        ..TlsConfig::default()
    };
    let tls = plain.server().unwrap().unwrap();
    assert_eq!(
        (tls.client_ca_pem, tls.client_auth),
        (None, ClientAuth::None)
    );
    assert!(TlsConfig::default().server().unwrap().is_none());
}
