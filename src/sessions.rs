//! Session affinity (`picker.sessions`, opt-in): requests that carry the same session header
//! go to the pod that served the session's last request, while that pod has headroom.
//!
//! ```yaml
//! picker:
//!   sessions:
//!     enabled: false        # opt-in
//!     header: x-session-id  # the request header naming the session (lowercase)
//!     ttlSeconds: 10800     # a session unused this long is forgotten (3 h)
//!     maxSessions: 100000   # per replica; a full map forgets its least recently used session
//! ```
//! The scheduler decides whether the session's pod still has headroom: with the affinity mode,
//! its saturation gate (`podCapacity`, `maxQueue`); without it, Kthena's filters. A session whose
//! pod is saturated, filtered out or gone is routed as any request and follows its new pod from
//! then on. Sticky requests are recorded like any other. The map is local to each replica (with
//! several replicas, a session's requests stick per replica) and keyed by a seeded hash of the
//! session id, which is also what logs show: the id itself is never kept or logged.
//!
//! The map is sharded (no global lock on the request path); each shard holds
//! `maxSessions / SHARDS` sessions and, when full, drops its expired sessions, then its least
//! recently used one (a scan of that shard, only when it is full of live sessions).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::Deserialize;
use thiserror::Error;

pub use crate::metrics::outcomes::{SessionDrop, SessionOutcome};

const SHARDS: usize = 64;

/// The `picker.sessions` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SessionsConfig {
    pub enabled: bool,
    pub header: String,
    pub ttl_seconds: u64,
    pub max_sessions: usize,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            enabled: false,
            header: "x-session-id".into(),
            ttl_seconds: 3 * 3600,
            max_sessions: 100_000,
        }
    }
}

/// A `picker.sessions` value that cannot work.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SessionsError {
    #[error(
        "sessions.header must be a lowercase HTTP header name (letters, digits, '-', '_'), got {0:?}"
    )]
    Header(String),
    #[error("sessions.ttlSeconds must be > 0, got 0")]
    Ttl,
    #[error("sessions.maxSessions must be > 0, got 0")]
    MaxSessions,
}

impl SessionsConfig {
    /// Every problem with the section (none when disabled).
    pub fn validate(&self) -> Vec<SessionsError> {
        if !self.enabled {
            return Vec::new();
        }
        let mut errors = Vec::new();
        let header_ok = !self.header.is_empty()
            && !self.header.starts_with(':')
            && self
                .header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !header_ok {
            errors.push(SessionsError::Header(self.header.clone()));
        }
        if self.ttl_seconds == 0 {
            errors.push(SessionsError::Ttl);
        }
        if self.max_sessions == 0 {
            errors.push(SessionsError::MaxSessions);
        }
        errors
    }
}

/// A session id as the picker keeps it: a seeded hash (ids are never stored or logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionKey(pub u64);

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    pod: SocketAddr,
    /// Seconds since the map was made.
    used: u32,
}

/// The sessions of this replica: session key -> the pod that served its last request.
#[derive(Debug)]
pub struct Sessions {
    shards: Box<[Mutex<HashMap<SessionKey, Entry>>]>,
    per_shard: usize,
    ttl: u32,
    seed: u64,
    started: Instant,
    live: AtomicUsize,
}

impl Sessions {
    /// An empty map for `config` (which [`SessionsConfig::validate`] accepted); `seed` salts
    /// the session keys.
    pub fn new(config: &SessionsConfig, seed: u64) -> Sessions {
        Sessions {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: config.max_sessions.div_ceil(SHARDS).max(1),
            ttl: u32::try_from(config.ttl_seconds).unwrap_or(u32::MAX),
            seed: seed ^ 0x7365_7373_696f_6e73,
            started: Instant::now(),
            live: AtomicUsize::new(0),
        }
    }

    /// The key of a session id.
    pub fn key(&self, id: &[u8]) -> SessionKey {
        SessionKey(xxhash_rust::xxh64::xxh64(id, self.seed))
    }

    /// Sessions held now.
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now(&self) -> u32 {
        u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    fn shard(&self, key: SessionKey) -> &Mutex<HashMap<SessionKey, Entry>> {
        // The key is a hash already: its top bits pick the shard.
        &self.shards[(key.0 >> 58) as usize % SHARDS]
    }

    /// The pod that served the session's last request, unless the session expired (then it is
    /// forgotten and reported in `dropped`).
    pub fn lookup(&self, key: SessionKey, dropped: &mut Vec<SessionDrop>) -> Option<SocketAddr> {
        self.lookup_at(key, self.now(), dropped)
    }

    fn lookup_at(
        &self,
        key: SessionKey,
        now: u32,
        dropped: &mut Vec<SessionDrop>,
    ) -> Option<SocketAddr> {
        let mut shard = self.shard(key).lock();
        let entry = *shard.get(&key)?;
        if now.saturating_sub(entry.used) >= self.ttl {
            shard.remove(&key);
            self.live.fetch_sub(1, Ordering::Relaxed);
            dropped.push(SessionDrop::Expired);
            return None;
        }
        Some(entry.pod)
    }

    /// The session's last request went to `pod`. Sessions forgotten to make room are reported
    /// in `dropped`.
    pub fn remember(&self, key: SessionKey, pod: SocketAddr, dropped: &mut Vec<SessionDrop>) {
        self.remember_at(key, pod, self.now(), dropped);
    }

    fn remember_at(
        &self,
        key: SessionKey,
        pod: SocketAddr,
        now: u32,
        dropped: &mut Vec<SessionDrop>,
    ) {
        let mut shard = self.shard(key).lock();
        let entry = Entry { pod, used: now };
        if let Some(e) = shard.get_mut(&key) {
            *e = entry;
            return;
        }
        if shard.len() >= self.per_shard {
            let before = shard.len();
            shard.retain(|_, e| now.saturating_sub(e.used) < self.ttl);
            let expired = before - shard.len();
            self.live.fetch_sub(expired, Ordering::Relaxed);
            dropped.extend(std::iter::repeat_n(SessionDrop::Expired, expired));
            if shard.len() >= self.per_shard
                && let Some(oldest) = shard.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| *k)
            {
                shard.remove(&oldest);
                self.live.fetch_sub(1, Ordering::Relaxed);
                dropped.push(SessionDrop::Capacity);
            }
        }
        shard.insert(key, entry);
        self.live.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max: usize, ttl: u64) -> SessionsConfig {
        SessionsConfig {
            enabled: true,
            max_sessions: max,
            ttl_seconds: ttl,
            ..SessionsConfig::default()
        }
    }

    fn pod(n: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], n))
    }

    #[test]
    fn a_session_follows_its_last_pod_until_it_expires() {
        let s = Sessions::new(&config(100, 10), 1);
        let k = s.key(b"alice");
        let mut dropped = Vec::new();
        assert_eq!(s.lookup_at(k, 0, &mut dropped), None);
        s.remember_at(k, pod(1), 0, &mut dropped);
        assert_eq!(s.lookup_at(k, 9, &mut dropped), Some(pod(1)));
        s.remember_at(k, pod(2), 9, &mut dropped);
        assert_eq!(s.len(), 1);
        assert_eq!(s.lookup_at(k, 18, &mut dropped), Some(pod(2)), "use renews");
        assert!(dropped.is_empty());
        assert_eq!(s.lookup_at(k, 19, &mut dropped), None);
        assert_eq!(dropped, [SessionDrop::Expired]);
        assert!(s.is_empty());
    }

    #[test]
    fn a_full_map_drops_expired_then_least_recent_sessions() {
        // One session per shard: every key that lands in a shard replaces its occupant.
        let s = Sessions::new(&config(1, 100), 7);
        let keys: Vec<SessionKey> = (0..10_000u32).map(|i| s.key(&i.to_le_bytes())).collect();
        let shard = |k: SessionKey| (k.0 >> 58) as usize % SHARDS;
        let same: Vec<SessionKey> = keys
            .iter()
            .copied()
            .filter(|&k| shard(k) == shard(keys[0]))
            .take(3)
            .collect();
        let mut dropped = Vec::new();
        s.remember_at(same[0], pod(1), 0, &mut dropped);
        s.remember_at(same[1], pod(2), 5, &mut dropped);
        assert_eq!(dropped, [SessionDrop::Capacity]);
        assert_eq!(s.lookup_at(same[0], 5, &mut dropped), None);
        assert_eq!(s.lookup_at(same[1], 5, &mut dropped), Some(pod(2)));
        dropped.clear();
        s.remember_at(same[2], pod(3), 200, &mut dropped);
        assert_eq!(dropped, [SessionDrop::Expired]);
        assert_eq!(s.len(), 1);
    }

    /// docs/routing.md gives the memory per session from this size.
    #[test]
    fn a_session_entry_is_48_bytes() {
        assert_eq!(std::mem::size_of::<(SessionKey, Entry)>(), 48);
    }

    #[test]
    fn keys_are_seeded_and_shown_as_hex() {
        let a = Sessions::new(&config(10, 10), 1);
        let b = Sessions::new(&config(10, 10), 2);
        assert_ne!(a.key(b"x"), b.key(b"x"));
        assert_eq!(a.key(b"x"), a.key(b"x"));
        assert_eq!(a.key(b"x").to_string().len(), 16);
    }

    #[test]
    fn invalid_sections_name_the_key_and_value() {
        let mut c = config(0, 0);
        c.header = "X-Session".into();
        let errors: Vec<String> = c.validate().iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "sessions.header must be a lowercase HTTP header name (letters, digits, '-', '_'), got \"X-Session\"",
                "sessions.ttlSeconds must be > 0, got 0",
                "sessions.maxSessions must be > 0, got 0",
            ]
        );
        c.enabled = false;
        assert!(c.validate().is_empty(), "a disabled section is not checked");
        assert!(config(1, 1).validate().is_empty());
    }
}
