//! Completion from Envoy's gRPC access log: the cheapest way to learn that a response ended.
//!
//! Envoy's `envoy.access_loggers.http_grpc` logger writes one entry per HTTP stream when the
//! stream is done (after the last byte went to the client, or the stream was cut), buffers
//! entries per worker thread and sends them on one long-lived `StreamAccessLogs` gRPC stream
//! (`buffer_size_bytes` / `buffer_flush_interval` bound the delay). Nothing on the data path
//! waits for it, and a request costs the picker one log entry instead of an observer stream's
//! three or more messages. prefix-picker serves the `AccessLogService` on its gRPC port.
//!
//! Each final HTTP entry (`DownstreamEnd`; start and periodic entries are skipped) claims the routed
//! request waiting in [`PendingRoutes`] by the [`ROUTE_KEY`] of the `envoy.lb` metadata: a key
//! this replica issued, unguessable, so anyone who reaches the gRPC port cannot forge
//! completions (the client-settable `request.request_id` claims nothing). Envoy copies the
//! metadata into the entry by itself, so Istio's `envoyHttpAls` and Envoy Gateway's ALS sink
//! work unchanged. Its ending ([`completion`]):
//! - aborted when a response flag says the stream was cut (downstream or upstream reset or
//!   termination, local reset, idle, request or duration timeout, protocol errors, overload);
//! - otherwise completed with `response.response_code`, served by
//!   `common_properties.upstream_remote_address` (the last attempt's host, after retries),
//!   else the `-served` key of the `envoy.lb` metadata, else the primary pick.
//!
//! Envoy never ends an access-log stream itself: when the picker shuts down, each stream ends
//! once no routed request waits for its completion (or the grace period is over), so draining
//! still records the responses in flight.
//!
//! With `picker.tls.requireClientCertFor: [accessLog]` ([`crate::tls`]) a stream counts only
//! when its peer presented a client certificate, which the TLS handshake verified against
//! `clientCaFile`; every entry of another stream is refused unread (`no_client_cert`).
//!
//! Entries that claim nothing are counted and dropped: `prefix_picker_access_log_entries_total
//! {result}` is `claimed`, `unclaimed` (a well-formed key no route waits under: expired, claimed
//! already), `no_route_key` (a request the picker did not route, or a forgery), `forged` (a key
//! this replica could not have issued, or a guessed secret: the route keeps waiting),
//! `other_replica` (a well-formed key of another picker replica: the log goes to a Service in
//! front of several pickers, so this completion is lost; warned once), `no_client_cert`
//! (refused: no client certificate, when one is required) or `intermediate` (not a final entry).
//!
//! [`PendingRoutes`]: crate::routing::PendingRoutes
//! [`ROUTE_KEY`]: crate::envoy::wire::ROUTE_KEY
//! [`completion`]: crate::routing::completion

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{Address, address, socket_address};
use envoy_types::pb::envoy::data::accesslog::v3::{
    AccessLogType, HttpAccessLogEntry, ResponseFlags,
};
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::{
    AccessLogService, AccessLogServiceServer,
};
use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::LogEntries;
use envoy_types::pb::envoy::service::accesslog::v3::{
    StreamAccessLogsMessage, StreamAccessLogsResponse,
};
use envoy_types::pb::google::protobuf::Struct;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::wire::{route_key_from_metadata, served_from_metadata};
pub use crate::metrics::outcomes::Claim;
use crate::routing::Router;
use crate::routing::pending::Miss;
use crate::routing::{Ending, Served};

/// How often a draining access-log stream checks whether routes are still waiting.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// The access-log gRPC service.
#[derive(Debug, Clone)]
pub struct AccessLogSink {
    router: Arc<Router>,
    shutdown: CancellationToken,
    linger: Duration,
    require_client_cert: bool,
}

impl AccessLogSink {
    /// Entries end `router`'s pending routes. Envoy keeps an access-log stream open for good,
    /// so once `shutdown` is cancelled each stream ends itself as soon as no route waits for
    /// its completion any more, or after `linger` (the drain's grace period) at the latest.
    pub fn new(
        router: Arc<Router>,
        shutdown: CancellationToken,
        linger: Duration,
    ) -> AccessLogSink {
        AccessLogSink {
            router,
            shutdown,
            linger,
            require_client_cert: false,
        }
    }

    /// With `required`, entries count only from a peer that presented a verified client
    /// certificate; the others are refused as [`Claim::NoClientCert`].
    pub fn require_client_cert(self, required: bool) -> AccessLogSink {
        AccessLogSink {
            require_client_cert: required,
            ..self
        }
    }

    pub fn into_server(self) -> AccessLogServiceServer<AccessLogSink> {
        AccessLogServiceServer::new(self)
    }

    /// Ends the routed request `entry` reports, if the picker routed it and still waits.
    pub fn on_entry(&self, entry: HttpAccessLogEntry) {
        self.count(claim(&self.router, entry), 1);
    }

    fn count(&self, result: Claim, entries: usize) {
        self.router
            .metrics
            .access_log_entries
            .with_label_values(&[result.as_str()])
            .inc_by(entries as u64);
    }
}

/// Whether the stream's peer presented a client certificate. The TLS acceptor verified any
/// chain it accepted against `clientCaFile` (optional client auth lets a client send none,
/// never an unverified one), so a chain here is a verified one; plaintext streams have none.
fn has_client_cert<T>(request: &Request<T>) -> bool {
    request.peer_certs().is_some_and(|chain| !chain.is_empty())
}

/// Takes the route `entry` ends, if one waits, and finishes it as the entry says.
fn claim(router: &Router, entry: HttpAccessLogEntry) -> Claim {
    let common = entry.common_properties.unwrap_or_default();
    if !is_final(common.access_log_type) {
        return Claim::Intermediate;
    }
    let metadata: HashMap<String, Struct> = common
        .metadata
        .map(|m| m.filter_metadata)
        .unwrap_or_default();
    let Some(key) = route_key_from_metadata(&metadata) else {
        return Claim::NoRouteKey;
    };
    let route = match router.pending.take(key) {
        Ok(route) => route,
        Err(Miss::Unknown) => return Claim::Unclaimed,
        Err(Miss::Forged) => return Claim::Forged,
        Err(Miss::OtherReplica) => {
            warn_other_replica();
            return Claim::OtherReplica;
        }
    };
    let request_id = entry.request.as_ref().map(|r| r.request_id.as_str());
    let aborted = common.response_flags.as_ref().is_some_and(was_cut);
    let status = entry.response.as_ref().and_then(|r| r.response_code);
    tracing::debug!(
        request_id = request_id.unwrap_or(""),
        status = status.map(|c| c.value),
        aborted,
        "completed (access log)"
    );
    let ending = if aborted {
        Ending::Aborted
    } else {
        let address = common
            .upstream_remote_address
            .as_ref()
            .and_then(socket_addr)
            .or_else(|| served_from_metadata(&metadata));
        Ending::Completed {
            status: status.map(|c| c.value),
            served: Served::at(router, address),
            // The access log carries no response body: no engine report.
            cached_tokens: None,
            first_byte: None,
            events: None,
        }
    };
    router.complete(route, ending);
    Claim::Claimed
}

/// A completion (an access-log entry, an observer stream) carried the route key of another
/// picker replica: the gateway sends completions to a Service in front of several pickers, a
/// shape that needs one picker per Envoy. Says so once per process.
pub(crate) fn warn_other_replica() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "a completion (access-log entry or observer stream) reached a picker replica that \
             did not route its request: the gateway sends completions to a Service in front of \
             several pickers, so they are lost (counted as access_log_entries_total\
             {{result=\"other_replica\"}}; the route expires on the replica that routed it). \
             Run one picker per Envoy (the chart's sidecar mode), or one ext_proc filter that \
             also sees the response (envoy/envoy-full-duplex.yaml, docs/replicas.md)"
        );
    }
}

/// A stream's last entry: `DownstreamEnd`, or no type (loggers without the field). Start,
/// periodic and upstream entries are not endings.
fn is_final(access_log_type: i32) -> bool {
    matches!(
        AccessLogType::try_from(access_log_type),
        Ok(AccessLogType::NotSet | AccessLogType::DownstreamEnd)
    )
}

/// The response flags that mean the stream did not run to its end.
fn was_cut(f: &ResponseFlags) -> bool {
    f.downstream_connection_termination
        || f.downstream_remote_reset
        || f.upstream_remote_reset
        || f.upstream_connection_termination
        || f.local_reset
        || f.stream_idle_timeout
        || f.upstream_request_timeout
        || f.duration_timeout
        || f.upstream_max_stream_duration_reached
        || f.upstream_protocol_error
        || f.downstream_protocol_error
        || f.overload_manager
}

/// An Envoy socket address as `ip:port` (None for pipes, names or named ports).
fn socket_addr(a: &Address) -> Option<SocketAddr> {
    let Some(address::Address::SocketAddress(s)) = &a.address else {
        return None;
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = s.port_specifier else {
        return None;
    };
    let ip = s.address.parse().ok()?;
    Some(SocketAddr::new(ip, u16::try_from(port).ok()?))
}

#[tonic::async_trait]
impl AccessLogService for AccessLogSink {
    async fn stream_access_logs(
        &self,
        request: Request<Streaming<StreamAccessLogsMessage>>,
    ) -> Result<Response<StreamAccessLogsResponse>, Status> {
        let refused = self.require_client_cert && !has_client_cert(&request);
        if refused {
            tracing::warn!(
                peer = ?request.remote_addr(),
                "access-log stream without a client certificate: its entries are refused \
                 (picker.tls.requireClientCertFor: [accessLog])"
            );
        }
        let mut stream = request.into_inner();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            if let Some(deadline) = drain_deadline
                && (self.router.pending.is_empty() || Instant::now() >= deadline)
            {
                break;
            }
            let message = tokio::select! {
                message = stream.message() => message?,
                _ = self.shutdown.cancelled(), if drain_deadline.is_none() => {
                    drain_deadline = Some(Instant::now() + self.linger);
                    continue;
                }
                _ = tokio::time::sleep(DRAIN_POLL), if drain_deadline.is_some() => continue,
            };
            let Some(message) = message else {
                break;
            };
            match message.log_entries {
                Some(LogEntries::HttpLogs(logs)) if refused => {
                    self.count(Claim::NoClientCert, logs.log_entry.len());
                }
                Some(LogEntries::HttpLogs(logs)) => {
                    for entry in logs.log_entry {
                        self.on_entry(entry);
                    }
                }
                _ => {}
            }
        }
        Ok(Response::new(StreamAccessLogsResponse {}))
    }
}

#[cfg(test)]
mod tests;
