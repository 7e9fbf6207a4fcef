//! TLS on the gRPC (ext_proc) port, optionally verifying client certificates. The admin port
//! (`/metrics`, probes) stays plaintext.
//!
//! ```yaml
//! picker:
//!   tls:
//!     mode: plaintext     # plaintext (default) | selfSigned | files
//!     certFile: ""        # files: PEM certificate chain
//!     keyFile: ""         # files: PEM private key
//!     clientCaFile: ""    # PEM bundle of the CAs trusted for client certificates
//!     clientAuth: none    # none | optional | required; default optional with clientCaFile
//!     requireClientCertFor: []   # [accessLog]: its entries count only from a certified peer
//! ```
//! - `plaintext`: for the sidecar pair, where Envoy reaches the picker over loopback.
//! - `selfSigned`: a fresh certificate (ECDSA P-256, SANs `localhost`, `127.0.0.1`, `::1` and the
//!   pod's hostname) is generated at start, as the Gateway API Inference Extension's endpoint
//!   picker does; gateways then connect with TLS and skip verification (Envoy: an
//!   `UpstreamTlsContext` without a `validation_context`, see `envoy/envoy-tls.yaml`).
//! - `files`: a certificate and key from disk (e.g. a cert-manager Secret), read once at start;
//!   rotate by restarting (a rolling update).
//!
//! Client certificates (either TLS mode): with `clientCaFile` (read once at start, like
//! `certFile`) the handshake asks for one and verifies it against those CAs. `optional` (the
//! default) lets a client without a certificate in, so ext_proc from a gateway that has none
//! keeps working, while a certificate that does not verify fails the handshake; `required`
//! refuses clients without one. `requireClientCertFor: [accessLog]` then makes the access-log
//! service refuse the entries of a peer that presented none (counted as `no_client_cert`,
//! [`crate::envoy::access_log`]); ext_proc is never restricted by it.
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

/// Whether the handshake asks for a client certificate (`picker.tls.clientAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    None,
    /// Asked for and verified when sent; a client without one still connects.
    Optional,
    /// A client without a verified certificate fails the handshake.
    Required,
}

/// A gRPC service that can be limited to peers with a verified client certificate
/// (`picker.tls.requireClientCertFor`). ext_proc is deliberately not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClientCertFor {
    /// The access-log service: entries from other peers are refused.
    AccessLog,
}

/// The `picker.tls` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TlsConfig {
    pub mode: TlsMode,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// PEM bundle of the CAs trusted for client certificates.
    pub client_ca_file: Option<PathBuf>,
    /// Unset: `optional` with `client_ca_file`, else `none` (see [`TlsConfig::client_auth`]).
    pub client_auth: Option<ClientAuth>,
    pub require_client_cert_for: Vec<ClientCertFor>,
}

/// A server certificate chain and key, PEM encoded.
#[derive(Clone)]
pub struct ServerIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What the gRPC port serves with when TLS is on: its identity and, optionally, the CAs that
/// client certificates are verified against.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub identity: ServerIdentity,
    /// PEM bundle of the trusted client CAs (each certificate checked to be usable as a trust
    /// anchor); `None` when no client certificate is asked for.
    pub client_ca_pem: Option<String>,
    /// `Optional` or `Required` whenever `client_ca_pem` is set.
    pub client_auth: ClientAuth,
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
    #[error("tls: clientCaFile needs mode selfSigned or files, got mode {mode}")]
    ClientCaWithoutTls { mode: &'static str },
    #[error("tls: clientAuth {client_auth} needs clientCaFile")]
    ClientAuthWithoutCa { client_auth: &'static str },
    #[error("tls: clientCaFile is unused with clientAuth none")]
    ClientCaUnused,
    #[error(
        "tls: requireClientCertFor {service} needs client certificates: set clientCaFile, with clientAuth optional or required"
    )]
    CertRequiredWithoutClientAuth { service: &'static str },
    #[error("tls: {path}: {bad} of {total} certificates cannot serve as a client CA")]
    BadClientCa {
        path: PathBuf,
        bad: usize,
        total: usize,
    },
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

impl ClientAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "required",
        }
    }
}

impl ClientCertFor {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientCertFor::AccessLog => "accessLog",
        }
    }
}

impl TlsConfig {
    /// `clientAuth` as set, else `optional` when `clientCaFile` is set, else `none`.
    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth
            .unwrap_or(if self.client_ca_file.is_some() {
                ClientAuth::Optional
            } else {
                ClientAuth::None
            })
    }

    /// Whether `service` serves only peers that presented a verified client certificate.
    pub fn requires_client_cert(&self, service: ClientCertFor) -> bool {
        self.require_client_cert_for.contains(&service)
    }

    /// Problems a config check can report without touching the files' contents.
    pub fn validate(&self) -> Vec<TlsError> {
        let mode = self.mode.as_str();
        let mut errors = Vec::new();
        self.validate_client_auth(&mut errors);
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

    /// The client-certificate keys: a CA needs TLS and a client-auth mode that uses it, and a
    /// service can require certificates only when some are asked for.
    fn validate_client_auth(&self, errors: &mut Vec<TlsError>) {
        if self.client_ca_file.is_some() && self.mode == TlsMode::Plaintext {
            errors.push(TlsError::ClientCaWithoutTls {
                mode: self.mode.as_str(),
            });
        }
        let client_auth = self.client_auth();
        match (client_auth, self.client_ca_file.is_some()) {
            (ClientAuth::Optional | ClientAuth::Required, false) => {
                errors.push(TlsError::ClientAuthWithoutCa {
                    client_auth: client_auth.as_str(),
                });
            }
            (ClientAuth::None, true) => errors.push(TlsError::ClientCaUnused),
            _ => {}
        }
        if client_auth == ClientAuth::None {
            for service in &self.require_client_cert_for {
                errors.push(TlsError::CertRequiredWithoutClientAuth {
                    service: service.as_str(),
                });
            }
        }
    }

    /// What to serve with, or `None` for plaintext. Reads (or generates) the certificate and
    /// reads the client CAs now.
    pub fn server(&self) -> Result<Option<ServerTls>, TlsError> {
        let Some(identity) = self.identity()? else {
            return Ok(None);
        };
        let client_ca_pem = match &self.client_ca_file {
            Some(path) => Some(read_client_cas(path)?),
            None => None,
        };
        Ok(Some(ServerTls {
            identity,
            client_ca_pem,
            client_auth: self.client_auth(),
        }))
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

/// Reads a PEM bundle of client CAs: at least one certificate, each usable as a trust anchor
/// (the TLS stack would otherwise skip the bad ones silently, or fail without naming the file).
fn read_client_cas(path: &Path) -> Result<String, TlsError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let text = read_pem(path, "CERTIFICATE")?;
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NotPem {
            path: path.to_path_buf(),
            what: "CERTIFICATE",
        });
    }
    let total = certs.len();
    let (_, bad) = rustls::RootCertStore::empty().add_parsable_certificates(certs);
    if bad > 0 {
        return Err(TlsError::BadClientCa {
            path: path.to_path_buf(),
            bad,
            total,
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
