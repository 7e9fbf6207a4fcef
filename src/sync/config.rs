//! The `sync:` config section (strict: unknown keys are errors).
//!
//! ```yaml
//! sync:
//!   redis:
//!     url: "redis://host:6379/0"          # rediss:// for TLS; redis+unix:///path for a socket
//!     cluster: false                      # true: Redis Cluster, `url` is a seed node
//!     urls: []                            # cluster: several seed nodes (instead of url)
//!     passwordEnv: ""                     # env var holding the password (or)
//!     passwordFile: ""                    # file holding the password (trailing newline dropped)
//!     stream: "prefix-picker:{default}"   # cluster: must hold a {hash tag}, which picks the slot
//!     maxLen: 1000000                     # XADD MAXLEN ~ (entries = records)
//!     replayOnStart: true                 # replay the retained tail before reporting ready
//!     replayTimeoutSeconds: 10            # ... for at most this long (> 0 with the replay)
//!     batchMaxRecords: 256                # records per pipelined XADD batch
//!     queueCapacity: 10000                # records waiting to be published; more are dropped
//! ```
//! Exactly one of `url` and `urls` is set; `urls` needs `cluster: true`. With `cluster: true`
//! every seed is a TCP URL (`redis://` or `rediss://`, all alike) of database 0, the password
//! (`passwordEnv`/`passwordFile`, else the first seed's URL) is used for every node of the
//! cluster, and `stream` must contain a non-empty hash tag (`{...}`, Redis's rule: the text
//! between the first `{` and the next `}`): the tag alone picks the stream's hash slot, so the
//! shard that carries the sync traffic is chosen on purpose (`CLUSTER KEYSLOT <tag>`), and the
//! streams of several pools can be kept together or apart. A name without one is a config error.
//!
//! Parsed once into [`RedisSync`] (via `try_from`), which cannot hold an invalid value; the
//! password is resolved at start-up through a lookup function, so tests never touch the process
//! environment.

use std::path::PathBuf;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use serde::Deserialize;
use thiserror::Error;

/// A problem in the `sync:` section, naming the key and the value.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SyncConfigError {
    #[error("sync.redis.{key} {url:?} is not a Redis URL: {reason}")]
    Url {
        key: String,
        url: String,
        reason: String,
    },
    #[error("sync.redis: set url (one node, or a cluster seed) or urls (cluster seeds)")]
    NoUrl,
    #[error("sync.redis: set url ({url:?}) or urls, not both")]
    UrlAndUrls { url: String },
    #[error(
        "sync.redis.urls {0:?} lists cluster seed nodes and needs cluster: true (one node takes url)"
    )]
    UrlsWithoutCluster(Vec<String>),
    #[error(
        "sync.redis.{key} {url:?}: Redis Cluster is reached over TCP (redis:// or rediss://), not a unix socket"
    )]
    ClusterUnix { key: String, url: String },
    #[error("sync.redis.{key} {url:?} selects database {db}; Redis Cluster has only database 0")]
    ClusterDb { key: String, url: String, db: i64 },
    #[error("sync.redis.urls {0:?} mixes redis:// and rediss:// seeds")]
    ClusterMixedTls(Vec<String>),
    #[error("sync.redis.urls {urls:?}: {reason}")]
    ClusterSeeds { urls: Vec<String>, reason: String },
    #[error(
        "sync.redis.stream {0:?} has no hash tag: with cluster: true it must contain a non-empty {{tag}}, e.g. \"prefix-picker:{{my-pool}}\""
    )]
    NoHashTag(String),
    #[error("sync.redis.{key} must be greater than 0, got {value}")]
    Zero { key: &'static str, value: String },
    #[error(
        "sync.redis.replayTimeoutSeconds must be a number of seconds up to 86400, and > 0 with replayOnStart (0 would report ready before replaying anything; set replayOnStart: false to start cold), got {0}"
    )]
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

/// What the links connect to, with the password applied.
#[derive(Debug, Clone)]
pub enum Topology {
    /// One Redis server (or a proxy in front of several).
    Node(Box<ConnectionInfo>),
    /// A Redis Cluster, discovered from these seed nodes (at least one).
    Cluster(Vec<ConnectionInfo>),
}

/// Validated `sync.redis` settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRedis")]
pub struct RedisSync {
    /// The URLs as written: one node, or (with `cluster`) one or more seed nodes. They may hold a
    /// password: never log them, use [`RedisSync::shown_urls`].
    pub urls: Vec<String>,
    pub cluster: bool,
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
    #[serde(default)]
    url: String,
    #[serde(default)]
    urls: Vec<String>,
    #[serde(default)]
    cluster: bool,
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

/// The key a URL came from, for errors: `url` or `urls[i]`.
fn url_key(from_list: bool, i: usize) -> String {
    if from_list {
        format!("urls[{i}]")
    } else {
        "url".into()
    }
}

/// The `{hash tag}` of a key, by Redis's rule (first `{`, next `}`, non-empty in between).
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// Checks the seed URLs of a cluster (already parsed one by one).
fn check_cluster(
    urls: &[String],
    infos: &[ConnectionInfo],
    from_list: bool,
) -> Result<(), SyncConfigError> {
    for (i, (url, info)) in urls.iter().zip(infos).enumerate() {
        if matches!(info.addr(), ConnectionAddr::Unix(_)) {
            return Err(SyncConfigError::ClusterUnix {
                key: url_key(from_list, i),
                url: redact(url),
            });
        }
        if info.redis_settings().db() != 0 {
            return Err(SyncConfigError::ClusterDb {
                key: url_key(from_list, i),
                url: redact(url),
                db: info.redis_settings().db(),
            });
        }
    }
    let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if infos.iter().any(|i| tls(i) != tls(&infos[0])) {
        return Err(SyncConfigError::ClusterMixedTls(
            urls.iter().map(|u| redact(u)).collect(),
        ));
    }
    // The client's own checks (e.g. different passwords in the seeds' URLs); no connection yet.
    ClusterClient::new(infos.to_vec()).map_err(|e| SyncConfigError::ClusterSeeds {
        urls: urls.iter().map(|u| redact(u)).collect(),
        reason: e.to_string(),
    })?;
    Ok(())
}

impl TryFrom<RawRedis> for RedisSync {
    type Error = SyncConfigError;

    /// The checks in the order their errors are reported: the URLs, each parsed, the cluster's
    /// seeds, the sizes and the stream, the password source.
    fn try_from(mut raw: RawRedis) -> Result<Self, Self::Error> {
        let from_list = !raw.urls.is_empty();
        let urls = seed_urls(
            std::mem::take(&mut raw.url),
            std::mem::take(&mut raw.urls),
            raw.cluster,
        )?;
        let infos = connection_infos(&urls, from_list)?;
        if raw.cluster {
            check_cluster(&urls, &infos, from_list)?;
        }
        raw.check_limits()?;
        let password = password(raw.password_env, raw.password_file)?;
        Ok(RedisSync {
            urls,
            cluster: raw.cluster,
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

/// The longest replay wait: a day.
const MAX_REPLAY_TIMEOUT_SECONDS: f64 = 86_400.0;

/// The URLs to connect to: `url`, or (with `cluster: true`) the seeds of `urls`.
fn seed_urls(
    url: String,
    urls: Vec<String>,
    cluster: bool,
) -> Result<Vec<String>, SyncConfigError> {
    match (url.is_empty(), !urls.is_empty()) {
        (true, false) => Err(SyncConfigError::NoUrl),
        (false, true) => Err(SyncConfigError::UrlAndUrls { url: redact(&url) }),
        (false, false) => Ok(vec![url]),
        (true, true) if !cluster => Err(SyncConfigError::UrlsWithoutCluster(
            urls.iter().map(|u| redact(u)).collect(),
        )),
        (true, true) => Ok(urls),
    }
}

/// Each URL parsed; the first that does not parse is the error, naming its key.
fn connection_infos(
    urls: &[String],
    from_list: bool,
) -> Result<Vec<ConnectionInfo>, SyncConfigError> {
    urls.iter()
        .enumerate()
        .map(|(i, url)| {
            url.as_str()
                .into_connection_info()
                .map_err(|e| SyncConfigError::Url {
                    key: url_key(from_list, i),
                    url: redact(url),
                    reason: e.to_string(),
                })
        })
        .collect()
}

impl RawRedis {
    /// The sizes (> 0), the replay timeout, and the stream's name (a hash tag for a cluster).
    fn check_limits(&self) -> Result<(), SyncConfigError> {
        for (key, value) in [
            ("maxLen", self.max_len as usize),
            ("batchMaxRecords", self.batch_max_records),
            ("queueCapacity", self.queue_capacity),
        ] {
            if value == 0 {
                return Err(SyncConfigError::Zero {
                    key,
                    value: value.to_string(),
                });
            }
        }
        let t = self.replay_timeout_seconds;
        if !(0.0..=MAX_REPLAY_TIMEOUT_SECONDS).contains(&t) || (self.replay_on_start && t == 0.0) {
            return Err(SyncConfigError::Timeout(t.to_string()));
        }
        if self.stream.is_empty() {
            return Err(SyncConfigError::EmptyStream);
        }
        if self.cluster && hash_tag(&self.stream).is_none() {
            return Err(SyncConfigError::NoHashTag(self.stream.clone()));
        }
        Ok(())
    }
}

/// Where the password comes from: at most one of `passwordEnv` and `passwordFile`.
fn password(env: String, file: String) -> Result<PasswordSource, SyncConfigError> {
    match (env.is_empty(), file.is_empty()) {
        (true, true) => Ok(PasswordSource::Url),
        (false, true) => Ok(PasswordSource::Env(env)),
        (true, false) => Ok(PasswordSource::File(file.into())),
        (false, false) => Err(SyncConfigError::TwoPasswords { env, file }),
    }
}

impl RedisSync {
    /// The URLs with any password replaced by `***`, comma-separated (for logs and errors).
    pub fn shown_urls(&self) -> String {
        self.urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes to connect to, with the password from `passwordEnv`/`passwordFile` applied to
    /// each. `env` looks up an environment variable.
    pub fn topology(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Topology, SyncConfigError> {
        let password = match &self.password {
            PasswordSource::Url => None,
            PasswordSource::Env(name) => {
                Some(env(name).ok_or_else(|| SyncConfigError::PasswordEnvUnset(name.clone()))?)
            }
            PasswordSource::File(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| SyncConfigError::PasswordFile {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
        };
        let mut infos = Vec::with_capacity(self.urls.len());
        for (i, url) in self.urls.iter().enumerate() {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| SyncConfigError::Url {
                    key: url_key(self.urls.len() > 1, i),
                    url: redact(url),
                    reason: e.to_string(),
                })?;
            infos.push(match &password {
                None => info,
                Some(p) => {
                    let settings = info.redis_settings().clone().set_password(p);
                    info.set_redis_settings(settings)
                }
            });
        }
        Ok(if self.cluster {
            Topology::Cluster(infos)
        } else {
            Topology::Node(Box::new(infos.swap_remove(0)))
        })
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
