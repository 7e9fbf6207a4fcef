//! Who may call the admin listener's `/debug/*` routes.
//!
//! `/debug/explain` tells which pod holds a prompt's prefix: a cross-tenant oracle for the cache,
//! so the routes are off unless `--debug-endpoints` (or `picker.debug.enabled`) turns them on.
//!
//! ```yaml
//! picker:
//!   debug:
//!     enabled: false          # --debug-endpoints; off: /debug/* answers 404
//!     bearerTokenFile: ""     # callers send `Authorization: Bearer <the file's content>`
//!     tokenReview: false      # callers send a Kubernetes token, checked with a TokenReview
//!     allowedUsers: []        # tokenReview: usernames allowed (empty: any authenticated one)
//! ```
//! With neither `bearerTokenFile` nor `tokenReview`, only loopback peers are let in (the pod's
//! own containers, `kubectl port-forward`); any other peer gets 403. With either, every caller,
//! loopback included, needs the credential: none or a wrong one gets 401, a TokenReview user
//! outside `allowedUsers` 403. The bearer token is compared in constant time.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use thiserror::Error;

/// The `picker.debug` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DebugConfig {
    pub enabled: bool,
    pub bearer_token_file: Option<PathBuf>,
    pub token_review: bool,
    pub allowed_users: Vec<String>,
}

#[derive(Debug, Error)]
pub enum DebugConfigError {
    #[error("debug: bearerTokenFile and tokenReview exclude each other")]
    Exclusive,
    #[error("debug: allowedUsers needs tokenReview")]
    UsersWithoutReview,
    #[error("debug: cannot read bearerTokenFile {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("debug: bearerTokenFile {0} is empty")]
    Empty(PathBuf),
    #[error("debug: tokenReview needs a Kubernetes client: {0}")]
    Client(String),
}

impl DebugConfig {
    /// Problems a config check can report without reading the token file.
    pub fn validate(&self) -> Vec<DebugConfigError> {
        let mut errors = Vec::new();
        if self.bearer_token_file.is_some() && self.token_review {
            errors.push(DebugConfigError::Exclusive);
        }
        if !self.allowed_users.is_empty() && !self.token_review {
            errors.push(DebugConfigError::UsersWithoutReview);
        }
        errors
    }

    /// The access rule, reading the token file or building the Kubernetes client now.
    pub async fn access(&self) -> Result<DebugAccess, DebugConfigError> {
        if let Some(e) = self.validate().into_iter().next() {
            return Err(e);
        }
        if !self.enabled {
            return Ok(DebugAccess::Off);
        }
        if let Some(path) = &self.bearer_token_file {
            let text = std::fs::read_to_string(path).map_err(|e| DebugConfigError::Read {
                path: path.clone(),
                message: e.to_string(),
            })?;
            return DebugAccess::bearer(text.trim()).ok_or(DebugConfigError::Empty(path.clone()));
        }
        if self.token_review {
            let client = crate::discovery::kubernetes::infer_client()
                .await
                .map_err(|e| DebugConfigError::Client(e.to_string()))?;
            return Ok(DebugAccess::token_review(
                client,
                self.allowed_users.clone(),
            ));
        }
        Ok(DebugAccess::Loopback)
    }
}

/// Who may call `/debug/*`.
#[derive(Clone)]
pub enum DebugAccess {
    /// The routes are not served.
    Off,
    /// Loopback peers only.
    Loopback,
    /// `Authorization: Bearer <token>` with this token.
    Bearer(Vec<u8>),
    /// A bearer token the API server authenticates (and, if listed, one of these users).
    TokenReview {
        client: kube::Client,
        users: Vec<String>,
    },
}

impl std::fmt::Debug for DebugAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DebugAccess {
    /// A bearer-token rule; `None` for an empty token.
    pub fn bearer(token: &str) -> Option<DebugAccess> {
        (!token.is_empty()).then(|| DebugAccess::Bearer(token.as_bytes().to_vec()))
    }

    pub fn token_review(client: kube::Client, users: Vec<String>) -> DebugAccess {
        DebugAccess::TokenReview { client, users }
    }

    /// For the start-up line.
    pub fn as_str(&self) -> &'static str {
        match self {
            DebugAccess::Off => "off",
            DebugAccess::Loopback => "loopback",
            DebugAccess::Bearer(_) => "bearerToken",
            DebugAccess::TokenReview { .. } => "tokenReview",
        }
    }

    pub fn enabled(&self) -> bool {
        !matches!(self, DebugAccess::Off)
    }

    /// `Ok` when `peer`, sending `headers`, may call a debug route; else the refusal.
    pub async fn check(&self, peer: SocketAddr, headers: &HeaderMap) -> Result<(), Response> {
        match self {
            DebugAccess::Off => Err(StatusCode::NOT_FOUND.into_response()),
            DebugAccess::Loopback if peer.ip().is_loopback() => Ok(()),
            DebugAccess::Loopback => Err(refuse(
                StatusCode::FORBIDDEN,
                "debug endpoints answer loopback peers only",
            )),
            DebugAccess::Bearer(expected) => match bearer_token(headers) {
                Some(got) if bool::from(got.as_bytes().ct_eq(expected)) => Ok(()),
                _ => Err(unauthorized()),
            },
            DebugAccess::TokenReview { client, users } => {
                let Some(token) = bearer_token(headers) else {
                    return Err(unauthorized());
                };
                match review(client, token).await {
                    Ok(Some(user)) if users.is_empty() || users.contains(&user) => Ok(()),
                    Ok(Some(user)) => {
                        tracing::debug!(%user, "debug endpoint: user not in allowedUsers");
                        Err(refuse(StatusCode::FORBIDDEN, "user not allowed"))
                    }
                    Ok(None) => Err(unauthorized()),
                    Err(e) => {
                        tracing::warn!(error = %e, "debug endpoint: TokenReview failed");
                        Err(refuse(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "cannot review the token",
                        ))
                    }
                }
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The authenticated username of `token`, or `None` if the API server does not authenticate it.
async fn review(client: &kube::Client, token: &str) -> Result<Option<String>, kube::Error> {
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let reviewed = api
        .create(&kube::api::PostParams::default(), &request)
        .await?;
    let status = reviewed.status.unwrap_or_default();
    Ok(status
        .authenticated
        .unwrap_or(false)
        .then(|| status.user.and_then(|u| u.username).unwrap_or_default()))
}

fn refuse(status: StatusCode, message: &'static str) -> Response {
    (status, format!("{message}\n")).into_response()
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a valid bearer token is required\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 40000)
    }

    fn with_auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    async fn status(access: &DebugAccess, ip: &str, headers: &HeaderMap) -> StatusCode {
        match access.check(peer(ip), headers).await {
            Ok(()) => StatusCode::OK,
            Err(r) => r.status(),
        }
    }

    #[tokio::test]
    async fn loopback_only_without_credentials() {
        let none = HeaderMap::new();
        assert_eq!(status(&DebugAccess::Off, "127.0.0.1", &none).await, 404);
        let l = DebugAccess::Loopback;
        assert_eq!(status(&l, "127.0.0.1", &none).await, 200);
        assert_eq!(status(&l, "::1", &none).await, 200);
        assert_eq!(status(&l, "10.0.0.7", &none).await, 403);
    }

    #[tokio::test]
    async fn a_bearer_token_is_needed_from_everyone() {
        let b = DebugAccess::bearer("s3cret").unwrap();
        assert_eq!(
            status(&b, "10.0.0.7", &with_auth("Bearer s3cret")).await,
            200
        );
        assert_eq!(
            status(&b, "127.0.0.1", &with_auth("bearer s3cret")).await,
            200
        );
        assert_eq!(status(&b, "127.0.0.1", &HeaderMap::new()).await, 401);
        assert_eq!(
            status(&b, "10.0.0.7", &with_auth("Bearer s3cre")).await,
            401
        );
        assert_eq!(
            status(&b, "10.0.0.7", &with_auth("Basic s3cret")).await,
            401
        );
        assert!(DebugAccess::bearer("").is_none());
    }

    #[test]
    fn exclusive_and_dangling_keys_are_errors() {
        let both = DebugConfig {
            bearer_token_file: Some("t".into()),
            token_review: true,
            ..DebugConfig::default()
        };
        assert_eq!(
            both.validate()[0].to_string(),
            "debug: bearerTokenFile and tokenReview exclude each other"
        );
        let users = DebugConfig {
            allowed_users: vec!["u".into()],
            ..DebugConfig::default()
        };
        assert_eq!(
            users.validate()[0].to_string(),
            "debug: allowedUsers needs tokenReview"
        );
    }

    #[tokio::test]
    async fn off_unless_enabled_and_the_token_file_is_read() {
        assert!(!DebugConfig::default().access().await.unwrap().enabled());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "tok\n").unwrap();
        let config = DebugConfig {
            enabled: true,
            bearer_token_file: Some(file.clone()),
            ..DebugConfig::default()
        };
        let access = config.access().await.unwrap();
        assert_eq!(
            status(&access, "10.0.0.7", &with_auth("Bearer tok")).await,
            200
        );
        std::fs::write(&file, " \n").unwrap();
        assert_eq!(
            config.access().await.unwrap_err().to_string(),
            format!("debug: bearerTokenFile {} is empty", file.display())
        );
    }
}
