//! The `prefix_picker_sync_*` metrics, declared together as data and registered explicitly.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::metrics::family::Family;
use crate::metrics::family::Label::Enum;

/// Why a record was not published or not applied (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Publish: the bounded queue was full (Redis slow or down).
    QueueFull,
    /// Publish: Redis could not be reached or refused the batch.
    RedisError,
    /// Apply: the entry names a pod this replica does not know.
    UnknownPod,
    /// Apply: the entry was recorded for an earlier incarnation of the pod.
    StaleGeneration,
    /// Apply: the publishing replica hashes with other blockSizeToHash/maxBlocksToMatch.
    ParamsMismatch,
    /// Apply: the entry could not be decoded (another version, or not ours).
    Malformed,
}

impl DropReason {
    pub const ALL: [DropReason; 6] = [
        DropReason::QueueFull,
        DropReason::RedisError,
        DropReason::UnknownPod,
        DropReason::StaleGeneration,
        DropReason::ParamsMismatch,
        DropReason::Malformed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::RedisError => "redis_error",
            DropReason::UnknownPod => "unknown_pod",
            DropReason::StaleGeneration => "stale_generation",
            DropReason::ParamsMismatch => "params_mismatch",
            DropReason::Malformed => "malformed",
        }
    }
}

/// Which of the two Redis connections (the `role` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Publisher,
    Tailer,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Publisher, Role::Tailer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Publisher => "publisher",
            Role::Tailer => "tailer",
        }
    }
}

const PUBLISHED: Family = Family::counter(
    "prefix_picker_sync_published_total",
    "Records this replica added to the Redis stream",
    &[],
);
const APPLIED: Family = Family::counter(
    "prefix_picker_sync_applied_total",
    "Records of other replicas (or of this replica's earlier runs) applied to the local index",
    &[],
);
/// Every reason exists at 0 from the start: "nothing dropped" is a value, not an absence.
const DROPPED: Family = Family::counter(
    "prefix_picker_sync_dropped_total",
    "Records not published or not applied, by reason",
    &[Enum("reason", || {
        DropReason::ALL.map(DropReason::as_str).to_vec()
    })],
);
const REPLAY_SECONDS: Family = Family::float_gauge(
    "prefix_picker_sync_replay_seconds",
    "Duration of the warm replay at start-up (set when it finishes)",
    &[],
);
const REPLAYED: Family = Family::counter(
    "prefix_picker_sync_replayed_total",
    "Stream entries read by the warm replay at start-up",
    &[],
);
const LAG_SECONDS: Family = Family::float_gauge(
    "prefix_picker_sync_lag_seconds",
    "Age of the last stream entry read when it was read (0 when caught up)",
    &[],
);
const LAG_ENTRIES: Family = Family::gauge(
    "prefix_picker_sync_lag_entries",
    "Stream entries added but not yet read by this replica",
    &[],
);
const CONNECTED: Family = Family::gauge(
    "prefix_picker_sync_redis_connected",
    "1 while the connection to Redis is up, by role",
    &[Enum("role", || Role::ALL.map(Role::as_str).to_vec())],
);
const RECONNECTS: Family = Family::counter(
    "prefix_picker_sync_redis_connects_total",
    "Successful connections to Redis, by role",
    &[Enum("role", || Role::ALL.map(Role::as_str).to_vec())],
);

#[derive(Debug, Clone)]
pub struct SyncMetrics {
    pub published: IntCounter,
    pub applied: IntCounter,
    pub dropped: IntCounterVec,
    pub replay_seconds: Gauge,
    pub replayed: IntCounter,
    pub lag_seconds: Gauge,
    pub lag_entries: IntGauge,
    pub connected: IntGaugeVec,
    pub reconnects: IntCounterVec,
}

impl SyncMetrics {
    pub fn register(registry: &Registry) -> SyncMetrics {
        SyncMetrics {
            published: PUBLISHED.register(registry),
            applied: APPLIED.register(registry),
            dropped: DROPPED.register(registry),
            replay_seconds: REPLAY_SECONDS.register(registry),
            replayed: REPLAYED.register(registry),
            lag_seconds: LAG_SECONDS.register(registry),
            lag_entries: LAG_ENTRIES.register(registry),
            connected: CONNECTED.register(registry),
            reconnects: RECONNECTS.register(registry),
        }
    }

    pub fn drop(&self, reason: DropReason, n: u64) {
        self.dropped.with_label_values(&[reason.as_str()]).inc_by(n);
    }

    /// What role `role`'s [`Link`](super::connection::Link) reports into.
    pub fn link_status(&self, role: Role) -> super::connection::LinkStatus {
        super::connection::LinkStatus {
            context: "sync",
            role: role.as_str(),
            connected: self.connected.with_label_values(&[role.as_str()]),
            reconnects: Some(self.reconnects.with_label_values(&[role.as_str()])),
        }
    }

    pub fn set_connected(&self, role: Role, up: bool) {
        self.connected
            .with_label_values(&[role.as_str()])
            .set(i64::from(up));
        if up {
            self.reconnects.with_label_values(&[role.as_str()]).inc();
        }
    }
}
