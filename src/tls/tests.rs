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
