//! Routed requests waiting for their completion to be reported by another source.
//!
//! When the routing ext_proc stream ends after the request phase, the response is seen by
//! another source: Envoy's access log (the recommended `envoy/envoy.yaml`) or a second filter in
//! `observability_mode` (`envoy/envoy-observer.yaml`), neither delaying it. The routing stream
//! deposits its [`Ticket`] here and puts the route key it gets back in the request's `envoy.lb`
//! metadata; the other source claims the route by that key when the response ends, or drops it
//! on abort. Anyone who reaches the gRPC port can send access-log entries, so a key is issued,
//! not guessable: `REPLICA-N.SECRET`, REPLICA this set's random 64-bit id (16 hex digits), N a
//! counter (the map key) and SECRET 128 random bits from a CSPRNG (`rand`'s thread RNG),
//! compared in constant time. The client-settable `x-request-id` claims nothing. A key with the
//! right N and a wrong secret is [`Miss::Forged`] and leaves the route waiting. A well-formed key
//! of another replica is [`Miss::OtherReplica`]: the completion source (an access log or an
//! observer filter sent to a Service in front of several pickers) reached a replica that did
//! not route the request, a deployment error named as such instead of a forgery; the owner's
//! route then expires. Unclaimed entries expire after `picker.responseTimeoutSeconds`, which
//! releases their in-flight count without recording anything. Sharded by N; no lock spans all
//! shards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::Rng;
use subtle::ConstantTimeEq;

use super::Ticket;
use crate::scheduler::HoldEnd;

const SHARDS: usize = 16;

/// Bytes of a route key's secret.
const SECRET_BYTES: usize = 16;

/// What [`PendingRoutes::expire`] dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub routes: usize,
    /// Of them, tentative holds released (a PD route holds one per pod; a hold its engine
    /// confirmed earlier is not released here).
    pub tentative: usize,
}

/// What ending some routes' tentative holds did, for counting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HoldsEnded {
    /// Holds the routes' end released (`prefix_picker_tentative_records_total`): all but
    /// those their engine confirmed first.
    pub tentative: usize,
    /// Holds that awaited their engine, by what ended them (in [`HoldEnd::ALL`] order).
    pub engine: [usize; HoldEnd::ALL.len()],
}

impl HoldsEnded {
    /// Counts one hold's end ([`TentativeHold::end`](crate::scheduler::TentativeHold::end)).
    pub(super) fn add(&mut self, end: Option<HoldEnd>) {
        if end != Some(HoldEnd::Engine) {
            self.tentative += 1;
        }
        if let Some(end) = end {
            self.engine[end as usize] += 1;
        }
    }

    /// Whether the route's end released a hold (it is a tentative record).
    pub(super) fn released(&self) -> bool {
        self.tentative > 0
    }

    fn merge(&mut self, other: HoldsEnded) {
        self.tentative += other.tentative;
        for (total, n) in self.engine.iter_mut().zip(other.engine) {
            *total += n;
        }
    }
}

/// Why [`PendingRoutes::take`] claimed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// A well-formed key naming no waiting route: claimed already, expired, or never issued.
    Unknown,
    /// Not a key this replica could have issued, or a waiting route's number with a wrong secret.
    Forged,
    /// A well-formed key issued by another replica (another `PendingRoutes`).
    OtherReplica,
}

struct Waiting {
    deadline: Instant,
    secret: [u8; SECRET_BYTES],
    route: Ticket,
}

#[derive(Debug)]
pub struct PendingRoutes {
    shards: Vec<Mutex<HashMap<u64, Waiting>>>,
    ttl: Duration,
    next: AtomicU64,
    /// This replica's id, the first part of every key it issues.
    replica: u64,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl PendingRoutes {
    pub fn new(ttl: Duration) -> PendingRoutes {
        PendingRoutes {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            ttl,
            next: AtomicU64::new(0),
            replica: rand::rng().random(),
        }
    }

    fn shard(&self, n: u64) -> &Mutex<HashMap<u64, Waiting>> {
        &self.shards[(n % SHARDS as u64) as usize]
    }

    /// Keeps `route` until claimed or expired; returns the key it is claimed by
    /// (`REPLICA-N.SECRET`).
    pub fn insert(&self, route: Ticket) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut secret = [0u8; SECRET_BYTES];
        rand::rng().fill(&mut secret);
        let waiting = Waiting {
            deadline: Instant::now() + self.ttl,
            secret,
            route,
        };
        self.shard(n).lock().insert(n, waiting);
        route_key(self.replica, n, &secret)
    }

    /// Claims the route `key` names, if it waits and the secret matches.
    pub fn take(&self, key: &str) -> Result<Ticket, Miss> {
        let (replica, n, secret) = parse_key(key).ok_or(Miss::Forged)?;
        if replica != self.replica {
            return Err(Miss::OtherReplica);
        }
        let mut shard = self.shard(n).lock();
        let waiting = shard.get(&n).ok_or(Miss::Unknown)?;
        if !bool::from(waiting.secret.ct_eq(&secret)) {
            return Err(Miss::Forged);
        }
        Ok(shard.remove(&n).expect("checked above").route)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired entries (releasing their in-flight counts and tentative holds); returns
    /// how many, and how many tentative holds they released.
    pub fn expire(&self, now: Instant) -> Expired {
        self.expire_holds(now).0
    }

    /// [`PendingRoutes::expire`], and what ending the expired routes' holds did.
    pub(super) fn expire_holds(&self, now: Instant) -> (Expired, HoldsEnded) {
        let mut out = Expired::default();
        let mut holds = HoldsEnded::default();
        for shard in &self.shards {
            let mut shard = shard.lock();
            shard.retain(|_, w| {
                let keep = w.deadline > now;
                if !keep {
                    out.routes += 1;
                    holds.merge(w.route.end_holds());
                }
                keep
            });
        }
        out.tentative = holds.tentative;
        (out, holds)
    }
}

/// `REPLICA-N.SECRET` written into one allocation (a route is keyed on every request).
fn route_key(replica: u64, n: u64, secret: &[u8; SECRET_BYTES]) -> String {
    use std::fmt::Write;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut key = String::with_capacity(16 + 1 + 20 + 1 + 2 * SECRET_BYTES);
    write!(key, "{replica:016x}-{n}.").expect("writing to a String cannot fail");
    for b in secret {
        key.push(char::from(HEX[usize::from(b >> 4)]));
        key.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    key
}

/// `REPLICA-N.SECRET` (REPLICA: 16 lowercase hex digits, SECRET: 32) as its parts.
fn parse_key(key: &str) -> Option<(u64, u64, [u8; SECRET_BYTES])> {
    let (replica, rest) = key.split_once('-')?;
    let (n, hex) = rest.split_once('.')?;
    if replica.len() != 16
        || hex.len() != 2 * SECRET_BYTES
        || n.is_empty()
        || !n.bytes().all(|b| b.is_ascii_digit())
        || !replica
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let replica = u64::from_str_radix(replica, 16).ok()?;
    let n = n.parse().ok()?;
    let mut secret = [0u8; SECRET_BYTES];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((replica, n, secret))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::InflightGuard;
    use crate::hashing::BlockHash;
    use crate::testing::{PORTS, addr, endpoint, router};

    fn route(
        router: &crate::routing::Router,
        pod: &std::sync::Arc<crate::endpoints::Endpoint>,
        tag: u64,
    ) -> Ticket {
        Ticket {
            model: "m".to_string(),
            hashes: vec![BlockHash(tag)],
            guard: InflightGuard::new(pod.clone(), &router.metrics),
            prompt_tokens: None,
            tentative: None,
            predicted_blocks: 0,
            prediction: None,
            session: None,
            prefill: None,
            event_stream: false,
        }
    }

    #[test]
    fn keys_are_unique_and_claim_their_own_route_once() {
        let router = router();
        let pod = endpoint(&router, addr(PORTS[0]));
        let pending = PendingRoutes::new(Duration::from_secs(60));
        let keys: Vec<String> = (1..=3)
            .map(|t| pending.insert(route(&router, &pod, t)))
            .collect();
        assert_ne!(keys[0], keys[1]);
        assert_eq!(pod.inflight(), 3);
        assert_eq!(pending.take(&keys[2]).unwrap().hashes, [BlockHash(3)]);
        assert_eq!(pending.take(&keys[2]).unwrap_err(), Miss::Unknown);
        assert_eq!(pending.take(&keys[0]).unwrap().hashes, [BlockHash(1)]);
        assert_eq!(pending.take(&keys[1]).unwrap().hashes, [BlockHash(2)]);
        assert!(pending.is_empty());
        assert_eq!(pod.inflight(), 0);
    }

    #[test]
    fn route_keys_are_replica_dash_number_dot_secret_in_lowercase_hex() {
        let secret: [u8; SECRET_BYTES] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5);
        let key = route_key(0x00c0_ffee_0000_00ab, 1234, &secret);
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(key, format!("00c0ffee000000ab-1234.{hex}"));
        assert_eq!(parse_key(&key), Some((0x00c0_ffee_0000_00ab, 1234, secret)));
    }

    #[test]
    fn a_guessed_secret_claims_nothing_and_leaves_the_route_waiting() {
        let router = router();
        let pod = endpoint(&router, addr(PORTS[0]));
        let pending = PendingRoutes::new(Duration::from_secs(60));
        let key = pending.insert(route(&router, &pod, 1));
        let (n, secret) = key.split_once('.').unwrap();
        assert_eq!(secret.len(), 32);
        let flipped = format!(
            "{n}.{}{}",
            if secret.starts_with('0') { '1' } else { '0' },
            &secret[1..]
        );
        for forged in [
            flipped.as_str(),
            n,
            "",
            "x-request-id",
            "0.zz",
            &format!("{n}.{secret}0"),
        ] {
            assert_eq!(
                pending.take(forged).unwrap_err(),
                Miss::Forged,
                "{forged:?}"
            );
        }
        let (replica, n) = n.split_once('-').unwrap();
        assert_eq!(
            pending
                .take(&format!(
                    "{replica}-{}.{secret}",
                    n.parse::<u64>().unwrap() + 1
                ))
                .unwrap_err(),
            Miss::Unknown
        );
        assert_eq!(pending.len(), 1, "the genuine route still waits");
        assert!(pending.take(&key).is_ok());
    }

    #[test]
    fn a_key_of_another_replica_is_told_apart_from_a_forgery() {
        let router = router();
        let pod = endpoint(&router, addr(PORTS[0]));
        let (a, b) = (
            PendingRoutes::new(Duration::from_secs(60)),
            PendingRoutes::new(Duration::from_secs(60)),
        );
        let (ka, kb) = (
            a.insert(route(&router, &pod, 1)),
            b.insert(route(&router, &pod, 2)),
        );
        let number = |k: &str| {
            k.split_once('-')
                .unwrap()
                .1
                .split_once('.')
                .unwrap()
                .0
                .to_string()
        };
        assert_eq!(number(&ka), number(&kb), "same N");
        assert_ne!(ka.split_once('-').unwrap().0, kb.split_once('-').unwrap().0);
        assert_eq!(a.take(&kb).unwrap_err(), Miss::OtherReplica);
        assert_eq!(b.take(&ka).unwrap_err(), Miss::OtherReplica);
        // Not well-formed: a forgery, whichever replica it names.
        let (replica, rest) = kb.split_once('-').unwrap();
        for bad in [
            format!("{}-{rest}", &replica[1..]),
            format!("g{}-{rest}", &replica[1..]),
            format!("{replica}{rest}"),
            format!("{replica}-{rest}0"),
        ] {
            assert_eq!(a.take(&bad).unwrap_err(), Miss::Forged, "{bad}");
        }
        assert_eq!(a.len(), 1, "nothing claimed");
        assert!(a.take(&ka).is_ok());
        assert!(b.take(&kb).is_ok());
    }
}
