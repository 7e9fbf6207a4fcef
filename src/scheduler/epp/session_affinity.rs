//! llm-d's `session-affinity-scorer`: 1 for the pod that served the session before, 0 for the
//! rest (all 0 without a session, or when its pod is not a candidate).
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `pkg/epp/framework/plugins/scheduling/scorer/sessionaffinity/session_affinity.go`,
//! `encoded_endpoint_header.go`, `session_id_header.go`, and the shared
//! `pkg/epp/framework/plugins/scheduling/util/sessionaffinity/{header,session_id}.go`. Two
//! strategies (`strategy`):
//! - `encoded_endpoint_header` (the default; stateless): the request header
//!   (`encodedEndpointHeaderConfig.header`, default `x-session-token`, lowercased) carries the
//!   standard base64 of the pod's `namespace/name`; the pod so named scores 1. The response
//!   carries the same header naming the pod picked, for the client to send back. A missing or
//!   undecodable token scores 0 everywhere.
//! - `session_id` (stateful): the session id is the first non-empty, trimmed value of
//!   `sessionIdConfig.sources[].header` (default one source, `x-session-id`); the id is bound
//!   to the pod its first request was routed to; the bound pod scores 1 while it is a
//!   candidate. A routed request refreshes its binding; a session whose bound pod was not a
//!   candidate moves to the pod it was routed to; a binding unused for
//!   `evictionTtlSeconds` (300) is dropped, swept every `evictionSweepSeconds` (10). Sources
//!   of kind `attribute` (other llm-d plugins' request attributes) are refused by the config.
//!
//! Each instance keeps its own bindings (keyed by its name). The map is this replica's only.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use parking_lot::Mutex;

/// `encodedEndpointHeaderConfig.header`'s default.
pub const DEFAULT_TOKEN_HEADER: &str = "x-session-token";
/// `sessionIdConfig.sources`' default header.
pub const DEFAULT_SESSION_ID_HEADER: &str = "x-session-id";

/// A session-affinity-scorer's strategy and its knobs.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionStrategy {
    /// `encoded_endpoint_header`: the header carrying base64 `namespace/name`.
    EncodedEndpointHeader { header: String },
    /// `session_id`: the headers read in order, and the bindings' TTL and sweep period.
    SessionId {
        headers: Vec<String>,
        ttl: Duration,
        sweep: Duration,
    },
}

impl SessionStrategy {
    pub fn as_str(&self) -> &'static str {
        match self {
            SessionStrategy::EncodedEndpointHeader { .. } => "encoded_endpoint_header",
            SessionStrategy::SessionId { .. } => "session_id",
        }
    }

    /// The request headers it reads.
    pub fn headers(&self) -> Vec<&str> {
        match self {
            SessionStrategy::EncodedEndpointHeader { header } => vec![header.as_str()],
            SessionStrategy::SessionId { headers, .. } => {
                headers.iter().map(String::as_str).collect()
            }
        }
    }

    /// The session id a request carries (`session_id`: the first non-empty source;
    /// `encoded_endpoint_header`: the decoded pod name), from its `headers` (lowercase names).
    pub fn session(&self, headers: &[(String, String)]) -> Option<String> {
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.trim())
                .filter(|v| !v.is_empty())
        };
        match self {
            SessionStrategy::EncodedEndpointHeader { header } => decode_pod(get(header)?),
            SessionStrategy::SessionId { headers: names, .. } => {
                names.iter().find_map(|n| get(n)).map(str::to_string)
            }
        }
    }
}

/// The pod name in an `encoded_endpoint_header` token (`None`: not standard base64 of UTF-8).
pub fn decode_pod(token: &str) -> Option<String> {
    let bytes = STANDARD.decode(token).ok()?;
    String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
}

/// The token naming `pod` (`namespace/name`).
pub fn encode_pod(pod: &str) -> String {
    STANDARD.encode(pod)
}

/// The scores of `pods` (labels) when the session's pod is `target`.
pub fn session_scores(pods: &[&str], target: Option<&str>) -> Vec<f64> {
    pods.iter()
        .map(|p| if Some(*p) == target { 1.0 } else { 0.0 })
        .collect()
}

/// `session_id`'s bindings, for every instance: `(instance, session id)` to the pod bound and
/// when last used.
#[derive(Debug, Default)]
pub struct SessionBindings(Mutex<Bindings>);

#[derive(Debug, Default)]
struct Bindings {
    map: HashMap<(String, String), (String, Instant)>,
    last_sweep: Option<Instant>,
}

impl SessionBindings {
    /// The pod bound to `session` for `instance`; none once unused for `ttl` (llm-d's sweeper
    /// would have dropped it by then, give or take its period).
    pub fn bound(&self, instance: &str, session: &str, ttl: Duration) -> Option<String> {
        let b = self.0.lock();
        b.map
            .get(&(instance.to_string(), session.to_string()))
            .filter(|(_, seen)| seen.elapsed() <= ttl)
            .map(|(pod, _)| pod.clone())
    }

    /// A request of `(instance, session)` was routed to `picked` among `candidates`: binds an
    /// unbound session, refreshes a binding to `picked`, moves a session whose pod was not a
    /// candidate; sweeps bindings unused for `ttl` every `sweep`.
    pub fn commit(
        &self,
        (instance, session): (&str, &str),
        picked: &str,
        candidates: &[&str],
        ttl: Duration,
        sweep: Duration,
        now: Instant,
    ) {
        let mut b = self.0.lock();
        if b.last_sweep.is_none_or(|t| now.duration_since(t) >= sweep) {
            b.map
                .retain(|_, (_, seen)| now.duration_since(*seen) <= ttl);
            b.last_sweep = Some(now);
        }
        let key = (instance.to_string(), session.to_string());
        match b.map.get_mut(&key) {
            None => {
                b.map.insert(key, (picked.to_string(), now));
            }
            Some((pod, seen)) if pod == picked => *seen = now,
            Some((pod, seen)) if !candidates.contains(&pod.as_str()) => {
                *pod = picked.to_string();
                *seen = now;
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// "default/pod-1" in standard base64 is "ZGVmYXVsdC9wb2QtMQ==" (by hand: RFC 4648).
    #[test]
    fn the_encoded_header_names_the_pod_that_scores_one() {
        assert_eq!(encode_pod("default/pod-1"), "ZGVmYXVsdC9wb2QtMQ==");
        let s = SessionStrategy::EncodedEndpointHeader {
            header: DEFAULT_TOKEN_HEADER.into(),
        };
        let h = headers(&[("x-session-token", "ZGVmYXVsdC9wb2QtMQ==")]);
        let target = s.session(&h);
        assert_eq!(target.as_deref(), Some("default/pod-1"));
        let pods = ["default/pod-0", "default/pod-1", "default/pod-2"];
        assert_eq!(session_scores(&pods, target.as_deref()), [0.0, 1.0, 0.0]);
        // Absent, empty or not base64: no session, every pod 0.
        for bad in [
            headers(&[]),
            headers(&[("x-session-token", " ")]),
            headers(&[("x-session-token", "%%%")]),
        ] {
            let t = s.session(&bad);
            assert_eq!(t, None);
            assert_eq!(session_scores(&pods, t.as_deref()), [0.0, 0.0, 0.0]);
        }
    }

    #[test]
    fn session_id_reads_the_first_non_empty_source() {
        let s = SessionStrategy::SessionId {
            headers: vec!["x-a".into(), "x-b".into()],
            ttl: Duration::from_secs(300),
            sweep: Duration::from_secs(10),
        };
        assert_eq!(
            s.session(&headers(&[("x-a", ""), ("x-b", " s1 ")]))
                .as_deref(),
            Some("s1")
        );
        assert_eq!(
            s.session(&headers(&[("x-a", "s0"), ("x-b", "s1")]))
                .as_deref(),
            Some("s0")
        );
        assert_eq!(s.session(&headers(&[])), None);
    }

    /// Bind on first route; keep while the pod is a candidate even when another was picked;
    /// move when the pod was not a candidate; dropped after the TTL at the next sweep.
    #[test]
    fn bindings_follow_llm_ds_migration_and_expiry() {
        let b = SessionBindings::default();
        let (ttl, sweep) = (Duration::from_secs(300), Duration::from_secs(10));
        let t0 = Instant::now();
        b.commit(("s", "id"), "p0", &["p0", "p1"], ttl, sweep, t0);
        assert_eq!(b.bound("s", "id", ttl).as_deref(), Some("p0"));
        assert_eq!(b.bound("other", "id", ttl), None, "per instance");
        b.commit(("s", "id"), "p1", &["p0", "p1"], ttl, sweep, t0);
        assert_eq!(
            b.bound("s", "id", ttl).as_deref(),
            Some("p0"),
            "p0 was there: kept"
        );
        b.commit(("s", "id"), "p1", &["p1"], ttl, sweep, t0);
        assert_eq!(
            b.bound("s", "id", ttl).as_deref(),
            Some("p1"),
            "p0 gone: moved"
        );
        let later = t0 + Duration::from_secs(301);
        b.commit(("s", "other"), "p0", &["p0"], ttl, sweep, later);
        assert_eq!(b.bound("s", "id", ttl), None, "unused for 301 s: swept");
    }
}
