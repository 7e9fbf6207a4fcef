//! The `sync:` config section (strict: unknown keys are errors).
//!
//! ```yaml
//! sync:
//!   redis:
//!     url: "redis://host:6379/0"          # rediss:// for TLS; redis+unix:///path for a socket
//!     passwordEnv: ""                     # env var holding the password (or)
//!     passwordFile: ""                    # file holding the password (trailing newline dropped)
//!     stream: "prefix-picker:{default}"   # {..} hash tag keeps it on one Redis Cluster shard
//!     maxLen: 1000000                     # XADD MAXLEN ~ (entries = records)
//!     replayOnStart: true                 # replay the retained tail before reporting ready
//!     replayTimeoutSeconds: 10            # ... for at most this long
//!     batchMaxRecords: 256                # records per pipelined XADD batch
//!     queueCapacity: 10000                # records waiting to be published; more are dropped
//! ```
//! Parsed once into [`RedisSync`] (via `try_from`), which cannot hold an invalid value; the
//! password is resolved at start-up through a lookup function, so tests never touch the process
//! environment.

use std::path::PathBuf;
use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo};
use serde::Deserialize;
use thiserror::Error;

/// A problem in the `sync:` section, naming the key and the value.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SyncConfigError {
    #[error("sync.redis.url {url:?} is not a Redis URL: {reason}")]
    Url { url: String, reason: String },
    #[error("sync.redis.{key} must be greater than 0, got {value}")]
    Zero { key: &'static str, value: String },
    #[error("sync.redis.replayTimeoutSeconds must be a finite number >= 0, got {0}")]
    Timeout(String),
    #[error("sync.redis.stream must not be empty")]
    EmptyStream,
    #[error("sync.redis: set at most one of passwordEnv ({env:?}) and passwordFile ({file:?})")]
    TwoPasswords { env: String, file: String },
    #[error("sync.redis.passwordEnv: environment variable {0:?} is not set")]
    PasswordEnvUnset(String),
    #[error("sync.redis.passwordFile: cannot read {path}: {message}")]
    PasswordFile { path: String, message: String },
}

/// The validated `sync:` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncConfig {
    pub redis: RedisSync,
}

impl SyncConfig {
    /// Parses the value of the top-level `sync` key.
    pub fn parse(value: &serde_yaml_ng::Value) -> Result<SyncConfig, String> {
        serde_yaml_ng::from_value(value.clone()).map_err(|e| e.to_string())
    }
}

/// Where the password comes from (never from the config file itself, except inside the URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// Only the URL's userinfo, if any.
    Url,
    Env(String),
    File(PathBuf),
}

/// Validated `sync.redis` settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRedis")]
pub struct RedisSync {
    /// The URL as written (may hold a password: never log it, use [`RedisSync::shown_url`]).
    pub url: String,
    pub password: PasswordSource,
    pub stream: String,
    pub max_len: u64,
    pub replay_on_start: bool,
    pub replay_timeout: Duration,
    pub batch_max_records: usize,
    pub queue_capacity: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRedis {
    url: String,
    #[serde(default)]
    password_env: String,
    #[serde(default)]
    password_file: String,
    #[serde(default = "default_stream")]
    stream: String,
    #[serde(default = "default_max_len")]
    max_len: u64,
    #[serde(default = "default_true")]
    replay_on_start: bool,
    #[serde(default = "default_replay_timeout")]
    replay_timeout_seconds: f64,
    #[serde(default = "default_batch")]
    batch_max_records: usize,
    #[serde(default = "default_queue")]
    queue_capacity: usize,
}

fn default_stream() -> String {
    "prefix-picker:{default}".into()
}
fn default_max_len() -> u64 {
    1_000_000
}
fn default_true() -> bool {
    true
}
fn default_replay_timeout() -> f64 {
    10.0
}
fn default_batch() -> usize {
    256
}
fn default_queue() -> usize {
    10_000
}

impl TryFrom<RawRedis> for RedisSync {
    type Error = SyncConfigError;

    fn try_from(raw: RawRedis) -> Result<Self, Self::Error> {
        if let Err(e) = raw.url.as_str().into_connection_info() {
            return Err(SyncConfigError::Url {
                url: redact(&raw.url),
                reason: e.to_string(),
            });
        }
        for (key, value) in [
            ("maxLen", raw.max_len as usize),
            ("batchMaxRecords", raw.batch_max_records),
            ("queueCapacity", raw.queue_capacity),
        ] {
            if value == 0 {
                return Err(SyncConfigError::Zero {
                    key,
                    value: value.to_string(),
                });
            }
        }
        if !raw.replay_timeout_seconds.is_finite() || raw.replay_timeout_seconds < 0.0 {
            return Err(SyncConfigError::Timeout(
                raw.replay_timeout_seconds.to_string(),
            ));
        }
        if raw.stream.is_empty() {
            return Err(SyncConfigError::EmptyStream);
        }
        let password = match (raw.password_env.is_empty(), raw.password_file.is_empty()) {
            (true, true) => PasswordSource::Url,
            (false, true) => PasswordSource::Env(raw.password_env),
            (true, false) => PasswordSource::File(raw.password_file.into()),
            (false, false) => {
                return Err(SyncConfigError::TwoPasswords {
                    env: raw.password_env,
                    file: raw.password_file,
                });
            }
        };
        Ok(RedisSync {
            url: raw.url,
            password,
            stream: raw.stream,
            max_len: raw.max_len,
            replay_on_start: raw.replay_on_start,
            replay_timeout: Duration::from_secs_f64(raw.replay_timeout_seconds),
            batch_max_records: raw.batch_max_records,
            queue_capacity: raw.queue_capacity,
        })
    }
}

impl RedisSync {
    /// The URL with any password replaced by `***` (for logs and errors).
    pub fn shown_url(&self) -> String {
        redact(&self.url)
    }

    /// The connection parameters, with the password from `passwordEnv`/`passwordFile` applied.
    /// `env` looks up an environment variable.
    pub fn connection_info(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ConnectionInfo, SyncConfigError> {
        let info = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| SyncConfigError::Url {
                url: self.shown_url(),
                reason: e.to_string(),
            })?;
        let password = match &self.password {
            PasswordSource::Url => return Ok(info),
            PasswordSource::Env(name) => {
                env(name).ok_or_else(|| SyncConfigError::PasswordEnvUnset(name.clone()))?
            }
            PasswordSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| SyncConfigError::PasswordFile {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        };
        let settings = info.redis_settings().clone().set_password(password);
        Ok(info.set_redis_settings(settings))
    }
}

/// `scheme://user:secret@host` -> `scheme://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_string(),
    }
}
