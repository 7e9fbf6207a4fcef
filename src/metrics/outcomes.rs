//! How routes, decision-time records, sessions, access-log entries and flow control's queued
//! requests ended: the label enums of
//! the router's outcome families (`as_str()` is the label). They live with the metrics, which know
//! no routing or Envoy type, and are re-exported where the outcome is decided
//! (`routing::completion`, `sessions`, `envoy::access_log`).

/// How a routed request ended (the `outcome` label of `prefix_picker_records_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOutcome {
    Recorded,
    Failed,
    Aborted,
    Unscored,
    UnknownPod,
    /// No completion arrived within `responseTimeoutSeconds`.
    Expired,
}

impl RouteOutcome {
    pub const ALL: [RouteOutcome; 6] = [
        RouteOutcome::Recorded,
        RouteOutcome::Failed,
        RouteOutcome::Aborted,
        RouteOutcome::Unscored,
        RouteOutcome::UnknownPod,
        RouteOutcome::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RouteOutcome::Recorded => "recorded",
            RouteOutcome::Failed => "failed",
            RouteOutcome::Aborted => "aborted",
            RouteOutcome::Unscored => "unscored",
            RouteOutcome::UnknownPod => "unknown_pod",
            RouteOutcome::Expired => "expired",
        }
    }
}

/// How a decision-time record ended (`prefix_picker_tentative_records_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TentativeOutcome {
    /// Recorded for the pod it was held for.
    Confirmed,
    /// Recorded for another pod (Envoy fell back), the hold dropped.
    Moved,
    /// The request failed, was cut or served from an unknown address: the hold dropped.
    RolledBack,
    /// No completion arrived within `responseTimeoutSeconds`.
    Expired,
}

impl TentativeOutcome {
    pub const ALL: [TentativeOutcome; 4] = [
        TentativeOutcome::Confirmed,
        TentativeOutcome::Moved,
        TentativeOutcome::RolledBack,
        TentativeOutcome::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TentativeOutcome::Confirmed => "confirmed",
            TentativeOutcome::Moved => "moved",
            TentativeOutcome::RolledBack => "rolled_back",
            TentativeOutcome::Expired => "expired",
        }
    }
}

/// Where a session's request went (the `outcome` label of `prefix_picker_session_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOutcome {
    /// The session's pod, as before.
    Kept,
    /// The session's pod was saturated, filtered out or gone: routed as any request.
    Moved,
    /// The first request of the session (or of one forgotten).
    New,
}

impl SessionOutcome {
    pub const ALL: [SessionOutcome; 3] = [
        SessionOutcome::Kept,
        SessionOutcome::Moved,
        SessionOutcome::New,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionOutcome::Kept => "kept",
            SessionOutcome::Moved => "moved",
            SessionOutcome::New => "new",
        }
    }
}

/// Why a session was forgotten (the `reason` label of `prefix_picker_sessions_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionDrop {
    /// Unused for `ttlSeconds`.
    Expired,
    /// The map was full: its least recently used session made room.
    Capacity,
}

impl SessionDrop {
    pub const ALL: [SessionDrop; 2] = [SessionDrop::Expired, SessionDrop::Capacity];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionDrop::Expired => "expired",
            SessionDrop::Capacity => "capacity",
        }
    }
}

/// What one entry did (the `result` label of `prefix_picker_access_log_entries_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Not a stream's last entry: ignored.
    Intermediate,
    /// No route waits under its route key.
    Unclaimed,
    /// No route key: a request the picker did not route, or a forgery.
    NoRouteKey,
    /// A route key this replica could not have issued (or a wrong secret).
    Forged,
    /// A route key another picker replica issued: the completion reached the wrong replica.
    OtherReplica,
    /// Refused unread: the peer presented no client certificate, and the access log requires one.
    NoClientCert,
    /// It ended a waiting route.
    Claimed,
}

impl Claim {
    pub const ALL: [Claim; 7] = [
        Claim::Claimed,
        Claim::Unclaimed,
        Claim::NoRouteKey,
        Claim::Forged,
        Claim::OtherReplica,
        Claim::NoClientCert,
        Claim::Intermediate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Claim::Intermediate => "intermediate",
            Claim::Unclaimed => "unclaimed",
            Claim::NoRouteKey => "no_route_key",
            Claim::Forged => "forged",
            Claim::OtherReplica => "other_replica",
            Claim::NoClientCert => "no_client_cert",
            Claim::Claimed => "claimed",
        }
    }
}

/// Why a request left the queue without a dispatch (the reason header's value and the
/// `reason` label of the drop counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue was at `maxRequests`.
    QueueFull,
    /// The queue was at `maxBytes` (or the request alone is over it).
    BytesFull,
    /// Queued for `requestTtlSeconds`.
    Ttl,
    /// Removed for a request of a higher priority (negative priorities only).
    Displaced,
    /// The client went away (Envoy closed the stream).
    Cancelled,
}

impl DropReason {
    pub const ALL: [DropReason; 5] = [
        DropReason::QueueFull,
        DropReason::BytesFull,
        DropReason::Ttl,
        DropReason::Displaced,
        DropReason::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::BytesFull => "bytes_full",
            DropReason::Ttl => "ttl_expired",
            DropReason::Displaced => "displaced",
            DropReason::Cancelled => "cancelled",
        }
    }
}

/// How a queued request left for a pod (the `reason` label of the dispatch counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchReason {
    /// A pod had room (a completion freed a slot, or the load fell).
    Room,
    /// The picker is shutting down: sent on without waiting for room (the engines queue it).
    Drain,
}

impl DispatchReason {
    pub const ALL: [DispatchReason; 2] = [DispatchReason::Room, DispatchReason::Drain];

    pub fn as_str(self) -> &'static str {
        match self {
            DispatchReason::Room => "room",
            DispatchReason::Drain => "drain",
        }
    }
}

/// The flow of requests without a fairness header (the `flow` label of flow control's served
/// tokens).
pub const DEFAULT_FLOW: &str = "default";
