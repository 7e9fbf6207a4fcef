//! TLS on the gRPC (ext_proc) port. The admin port (`/metrics`, probes) stays plaintext.
//!
//! ```yaml
//! picker:
//!   tls:
//!     mode: plaintext     # plaintext (default) | selfSigned | files
//!     certFile: ""        # files: PEM certificate chain
//!     keyFile: ""         # files: PEM private key
//! ```
//! - `plaintext`: for the sidecar pair, where Envoy reaches the picker over loopback.
//! - `selfSigned`: a fresh certificate (ECDSA P-256, SANs `localhost`, `127.0.0.1`, `::1` and the
//!   pod's hostname) is generated at start, as the Gateway API Inference Extension's endpoint
//!   picker does; gateways then connect with TLS and skip verification (Envoy: an
//!   `UpstreamTlsContext` without a `validation_context`, see `envoy/envoy-tls.yaml`).
//! - `files`: a certificate and key from disk (e.g. a cert-manager Secret), read once at start;
//!   rotate by restarting (a rolling update).
//!
//! Either TLS mode offers ALPN `h2` (tonic), which Envoy's gRPC client requires.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// How the gRPC port is served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TlsMode {
    #[default]
    Plaintext,
    SelfSigned,
    Files,
}

/// The `picker.tls` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TlsConfig {
    pub mode: TlsMode,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// A server certificate chain and key, PEM encoded.
#[derive(Clone)]
pub struct ServerIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity").finish_non_exhaustive()
    }
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("tls: mode {mode} needs {key}")]
    Missing {
        mode: &'static str,
        key: &'static str,
    },
    #[error("tls: {key} is only used with mode files, got mode {mode}")]
    Unused {
        mode: &'static str,
        key: &'static str,
    },
    #[error("tls: cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("tls: {path} holds no PEM {what}")]
    NotPem { path: PathBuf, what: &'static str },
    #[error("tls: cannot generate a self-signed certificate: {0}")]
    Generate(String),
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Plaintext => "plaintext",
            TlsMode::SelfSigned => "selfSigned",
            TlsMode::Files => "files",
        }
    }
}

impl TlsConfig {
    /// Problems a config check can report without touching the files' contents.
    pub fn validate(&self) -> Vec<TlsError> {
        let mode = self.mode.as_str();
        let mut errors = Vec::new();
        match self.mode {
            TlsMode::Files => {
                if self.cert_file.is_none() {
                    errors.push(TlsError::Missing {
                        mode,
                        key: "certFile",
                    });
                }
                if self.key_file.is_none() {
                    errors.push(TlsError::Missing {
                        mode,
                        key: "keyFile",
                    });
                }
            }
            TlsMode::Plaintext | TlsMode::SelfSigned => {
                if self.cert_file.is_some() {
                    errors.push(TlsError::Unused {
                        mode,
                        key: "certFile",
                    });
                }
                if self.key_file.is_some() {
                    errors.push(TlsError::Unused {
                        mode,
                        key: "keyFile",
                    });
                }
            }
        }
        errors
    }

    /// The identity to serve with, or `None` for plaintext. Reads or generates it now.
    pub fn identity(&self) -> Result<Option<ServerIdentity>, TlsError> {
        if let Some(e) = self.validate().into_iter().next() {
            return Err(e);
        }
        match self.mode {
            TlsMode::Plaintext => Ok(None),
            TlsMode::SelfSigned => self_signed().map(Some),
            TlsMode::Files => {
                let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) else {
                    unreachable!("validate() checked both files are set");
                };
                Ok(Some(ServerIdentity {
                    cert_pem: read_pem(cert, "CERTIFICATE")?,
                    key_pem: read_pem(key, "PRIVATE KEY")?,
                }))
            }
        }
    }
}

/// A certificate for the names a local or in-cluster client uses.
pub fn self_signed() -> Result<ServerIdentity, TlsError> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
        && !names.contains(&host)
    {
        names.push(host);
    }
    let generated =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    Ok(ServerIdentity {
        cert_pem: generated.cert.pem(),
        key_pem: generated.signing_key.serialize_pem(),
    })
}

/// Reads a PEM file and checks it holds a block whose label contains `what`.
fn read_pem(path: &Path, what: &'static str) -> Result<String, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|e| TlsError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let has_block = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.contains(what));
    if !has_block {
        return Err(TlsError::NotPem {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
