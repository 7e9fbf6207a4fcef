//! Where kvcache-aware's Redis is: Kthena's `TryGetRedisClient` (volcano-sh/kthena 3cc0572,
//! `pkg/kthena-router/utils/redis.go`) reads `REDIS_HOST` (default `redis-server`),
//! `REDIS_PORT` (default `6379`) and `REDIS_PASSWORD` (default none), database 0. The same
//! here, through a lookup function so tests never touch the process environment. One addition:
//! a `REDIS_HOST` that starts with `/` is a unix socket path (the port is then not used).

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use thiserror::Error;

use crate::sync::config::Topology;

pub const DEFAULT_HOST: &str = "redis-server";
pub const DEFAULT_PORT: &str = "6379";

#[derive(Debug, Error)]
pub enum RedisEnvError {
    #[error("REDIS_PORT must be a port number, got {0:?}")]
    Port(String),
    #[error("REDIS_HOST {host:?} does not make a Redis address: {reason}")]
    Host { host: String, reason: String },
}

/// The Redis to connect to, and how to show it in logs (no password).
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub topology: Topology,
    pub shown: String,
}

/// Reads `REDIS_HOST`, `REDIS_PORT` and `REDIS_PASSWORD` through `env`; empty values are unset.
pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<RedisTarget, RedisEnvError> {
    let get = |name: &str, default: &str| {
        env(name)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    let host = get("REDIS_HOST", DEFAULT_HOST);
    let port = get("REDIS_PORT", DEFAULT_PORT);
    let password = env("REDIS_PASSWORD").filter(|p| !p.is_empty());
    let (info, shown) = if host.starts_with('/') {
        let info = ConnectionAddr::Unix(host.clone().into())
            .into_connection_info()
            .map_err(|e| RedisEnvError::Host {
                host: host.clone(),
                reason: e.to_string(),
            })?;
        (info, format!("unix:{host}"))
    } else {
        let port: u16 = port
            .parse()
            .map_err(|_| RedisEnvError::Port(port.clone()))?;
        let info = ConnectionAddr::Tcp(host.clone(), port)
            .into_connection_info()
            .map_err(|e| RedisEnvError::Host {
                host: host.clone(),
                reason: e.to_string(),
            })?;
        (info, format!("{host}:{port}"))
    };
    let info: ConnectionInfo = match password {
        None => info,
        Some(p) => {
            let settings = info.redis_settings().clone().set_password(p);
            info.set_redis_settings(settings)
        }
    };
    Ok(RedisTarget {
        topology: Topology::Node(Box::new(info)),
        shown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn kthena_defaults_and_overrides() {
        assert_eq!(from_env(&env(&[])).unwrap().shown, "redis-server:6379");
        let t = from_env(&env(&[
            ("REDIS_HOST", "10.0.0.9"),
            ("REDIS_PORT", "7000"),
            ("REDIS_PASSWORD", "s3"),
        ]))
        .unwrap();
        assert_eq!(t.shown, "10.0.0.9:7000");
        let Topology::Node(info) = t.topology else {
            panic!("a node")
        };
        assert_eq!(info.redis_settings().password(), Some("s3"));
        assert_eq!(
            from_env(&env(&[("REDIS_HOST", "/tmp/r.sock")]))
                .unwrap()
                .shown,
            "unix:/tmp/r.sock"
        );
        let e = from_env(&env(&[("REDIS_PORT", "http")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "REDIS_PORT must be a port number, got \"http\""
        );
    }
}
