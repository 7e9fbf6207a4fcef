//! The `prefix_picker_sync_*` metrics, declared together and registered explicitly.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::metrics::listing;

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
        let m = SyncMetrics {
            published: IntCounter::new(
                "prefix_picker_sync_published_total",
                "Records this replica added to the Redis stream",
            )
            .expect("valid metric"),
            applied: IntCounter::new(
                "prefix_picker_sync_applied_total",
                "Records of other replicas (or of this replica's earlier runs) applied to the local index",
            )
            .expect("valid metric"),
            dropped: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_sync_dropped_total",
                    listing(
                        "Records not published or not applied, by reason",
                        &[("reason", &DropReason::ALL.map(DropReason::as_str))],
                    ),
                ),
                &["reason"],
            )
            .expect("valid metric"),
            replay_seconds: Gauge::new(
                "prefix_picker_sync_replay_seconds",
                "Duration of the warm replay at start-up (set when it finishes)",
            )
            .expect("valid metric"),
            replayed: IntCounter::new(
                "prefix_picker_sync_replayed_total",
                "Stream entries read by the warm replay at start-up",
            )
            .expect("valid metric"),
            lag_seconds: Gauge::new(
                "prefix_picker_sync_lag_seconds",
                "Age of the last stream entry read when it was read (0 when caught up)",
            )
            .expect("valid metric"),
            lag_entries: IntGauge::new(
                "prefix_picker_sync_lag_entries",
                "Stream entries added but not yet read by this replica",
            )
            .expect("valid metric"),
            connected: IntGaugeVec::new(
                Opts::new(
                    "prefix_picker_sync_redis_connected",
                    listing(
                        "1 while the connection to Redis is up, by role",
                        &[("role", &Role::ALL.map(Role::as_str))],
                    ),
                ),
                &["role"],
            )
            .expect("valid metric"),
            reconnects: IntCounterVec::new(
                Opts::new(
                    "prefix_picker_sync_redis_connects_total",
                    listing(
                        "Successful connections to Redis, by role",
                        &[("role", &Role::ALL.map(Role::as_str))],
                    ),
                ),
                &["role"],
            )
            .expect("valid metric"),
        };
        for c in [&m.published, &m.applied, &m.replayed] {
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
        }
        for c in [&m.dropped, &m.reconnects] {
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
        }
        registry
            .register(Box::new(m.replay_seconds.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(m.lag_seconds.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(m.lag_entries.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(m.connected.clone()))
            .expect("unique metric");
        for role in Role::ALL {
            m.connected.with_label_values(&[role.as_str()]).set(0);
            m.reconnects.with_label_values(&[role.as_str()]);
        }
        // Every reason exists at 0 from the start: "nothing dropped" is a value, not an absence.
        for reason in DropReason::ALL {
            m.dropped.with_label_values(&[reason.as_str()]);
        }
        m
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
