//! How routes, decision-time records, sessions and access-log entries ended: the label enums of
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
