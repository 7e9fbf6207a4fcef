//! Access-log entries claiming routed requests of a real [`Router`] (the ext_proc tests' three
//! static endpoints on 127.0.0.1), as Envoy's `http_grpc` logger would send them.

use envoy_types::pb::envoy::config::core::v3::{Metadata, SocketAddress};
use envoy_types::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpRequestProperties, HttpResponseProperties,
};
use envoy_types::pb::google::protobuf::{UInt32Value, Value, value::Kind};

use super::*;
use crate::envoy::wire::{LB_NAMESPACE, ROUTE_KEY, SERVED_KEY};
use crate::testing::{PORTS, addr, entries, router, total_entries};
use tokio_util::sync::CancellationToken;

fn sink(router: &Arc<Router>) -> AccessLogSink {
    AccessLogSink::new(
        router.clone(),
        CancellationToken::new(),
        Duration::from_secs(30),
    )
}

fn prompt(tag: &str) -> Vec<u8> {
    let text = format!("{tag} ").repeat(200);
    serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": text})).unwrap()
}

/// Routes `body` as the routing ext_proc stream would with response body mode NONE: the
/// route waits under the key it is issued. Returns the primary pick and the route key.
fn route(router: &Arc<Router>, body: &[u8]) -> (SocketAddr, String) {
    let routed = router
        .route("/v1/completions", Some(body), None)
        .expect("routed");
    let primary = routed.decision.primary().clone();
    let key = router.pending.insert(routed.ticket);
    (primary.spec.address, key)
}

fn socket(a: SocketAddr) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: a.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                a.port(),
            ))),
            ..SocketAddress::default()
        })),
    }
}

fn lb(fields: &[(&str, &str)]) -> Metadata {
    let inner = Struct {
        fields: fields
            .iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue(v.to_string())),
                };
                (k.to_string(), value)
            })
            .collect(),
    };
    Metadata {
        filter_metadata: HashMap::from([(LB_NAMESPACE.to_string(), inner)]),
        ..Metadata::default()
    }
}

/// A final entry carrying `route_key` (none if empty) and `more` in its `envoy.lb` metadata; its
/// request id is a constant (the client's, which claims nothing).
fn entry(
    route_key: &str,
    status: Option<u32>,
    upstream: Option<SocketAddr>,
    flags: ResponseFlags,
    more: &[(&str, &str)],
) -> HttpAccessLogEntry {
    let mut fields = more.to_vec();
    if !route_key.is_empty() {
        fields.push((ROUTE_KEY, route_key));
    }
    HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            upstream_remote_address: upstream.map(socket),
            response_flags: Some(flags),
            metadata: (!fields.is_empty()).then(|| lb(&fields)),
            ..AccessLogCommon::default()
        }),
        request: Some(HttpRequestProperties {
            request_id: "client-request-id".to_string(),
            ..HttpRequestProperties::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: status.map(|value| UInt32Value { value }),
            ..HttpResponseProperties::default()
        }),
        ..HttpAccessLogEntry::default()
    }
}

fn ok(route_key: &str, upstream: Option<SocketAddr>) -> HttpAccessLogEntry {
    entry(
        route_key,
        Some(200),
        upstream,
        ResponseFlags::default(),
        &[],
    )
}

fn count(router: &Router, family: &str, label: &str) -> u64 {
    match family {
        "records" => router.metrics.records.with_label_values(&[label]).get(),
        _ => router
            .metrics
            .access_log_entries
            .with_label_values(&[label])
            .get(),
    }
}

/// In-flight requests over all pods.
fn inflight(router: &Router) -> i64 {
    crate::testing::inflight(router).iter().sum()
}

#[test]
fn a_2xx_entry_records_for_the_upstream_that_served() {
    let router = router();
    let sink = sink(&router);
    let (primary, key) = route(&router, &prompt("a"));
    assert_eq!(inflight(&router), 1);
    // A retry moved the request to another pod: the log names it.
    let served = PORTS.map(addr).into_iter().find(|&a| a != primary).unwrap();
    sink.on_entry(ok(&key, Some(served)));
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(count(&router, "records", "recorded"), 1);
    assert_eq!(count(&router, "entries", "claimed"), 1);
    assert_eq!(inflight(&router), 0);
    // The same prompt now goes where it was served.
    let (again, _) = route(&router, &prompt("a"));
    assert_eq!(again, served);
}

#[test]
fn served_falls_back_to_the_metadata_then_the_primary() {
    let router = router();
    let sink = sink(&router);
    let (primary, key) = route(&router, &prompt("b"));
    let other = PORTS.map(addr).into_iter().find(|&a| a != primary).unwrap();
    let other_text = other.to_string();
    sink.on_entry(entry(
        &key,
        Some(200),
        None,
        ResponseFlags::default(),
        &[(SERVED_KEY, &other_text)],
    ));
    assert!(entries(&router, other) > 0);

    let (primary, key) = route(&router, &prompt("c"));
    let before = entries(&router, primary);
    sink.on_entry(ok(&key, None));
    assert!(entries(&router, primary) > before);
    assert_eq!(count(&router, "records", "recorded"), 2);
}

#[test]
fn two_requests_are_told_apart_by_their_route_keys() {
    let router = router();
    let sink = sink(&router);
    let (_, first) = route(&router, &prompt("e"));
    let (_, second) = route(&router, &prompt("f"));
    assert_ne!(second, first);
    assert_eq!(inflight(&router), 2);
    // The second request ends first, served by pod 0; then the first, served by pod 1.
    let [pod0, pod1, _] = PORTS.map(addr);
    for (key, served) in [(&second, pod0), (&first, pod1)] {
        sink.on_entry(ok(key, Some(served)));
    }
    assert!(router.pending.is_empty());
    assert_eq!(inflight(&router), 0);
    assert_eq!(count(&router, "records", "recorded"), 2);
    // Each prompt was recorded for the pod that served it.
    assert_eq!(route(&router, &prompt("f")).0, pod0);
    assert_eq!(route(&router, &prompt("e")).0, pod1);
}

/// Anyone who reaches the gRPC port can send entries: only a route key this replica issued
/// claims, never the client-settable request id, a missing key or a guessed secret.
#[test]
fn forged_entries_record_nothing_and_are_counted() {
    let router = router();
    let sink = sink(&router);
    let (primary, key) = route(&router, &prompt("forged"));
    let (n, secret) = key.split_once('.').unwrap();
    let guessed = format!("{n}.{}", "0".repeat(secret.len()));
    let other_replica = format!("{n}.{}", "f".repeat(secret.len()));
    // No route key: the request id (even one a route was routed with) claims nothing.
    sink.on_entry(ok("", Some(primary)));
    for forged in [guessed.as_str(), &other_replica, "client-request-id", n] {
        assert_ne!(forged, key);
        sink.on_entry(ok(forged, Some(primary)));
    }
    assert_eq!(count(&router, "entries", "no_route_key"), 1);
    assert_eq!(count(&router, "entries", "forged"), 4);
    assert_eq!(count(&router, "entries", "claimed"), 0);
    assert_eq!(total_entries(&router), 0, "nothing recorded");
    assert_eq!(router.pending.len(), 1, "the genuine route still waits");
    assert_eq!(inflight(&router), 1);
    // The genuine entry still claims it.
    sink.on_entry(ok(&key, Some(primary)));
    assert_eq!(count(&router, "entries", "claimed"), 1);
    assert_eq!(count(&router, "records", "recorded"), 1);
}

#[test]
fn failures_and_cut_streams_record_nothing() {
    let router = router();
    let sink = sink(&router);
    let cut = [
        ResponseFlags {
            downstream_connection_termination: true,
            ..ResponseFlags::default()
        },
        ResponseFlags {
            upstream_remote_reset: true,
            ..ResponseFlags::default()
        },
        ResponseFlags {
            stream_idle_timeout: true,
            ..ResponseFlags::default()
        },
    ];
    for (i, flags) in cut.into_iter().enumerate() {
        let (served, key) = route(&router, &prompt(&format!("cut-{i}")));
        // The response began with 200 before the stream was cut.
        sink.on_entry(entry(&key, Some(200), Some(served), flags, &[]));
    }
    assert_eq!(count(&router, "records", "aborted"), 3);
    let (served, key) = route(&router, &prompt("f"));
    sink.on_entry(entry(
        &key,
        Some(503),
        Some(served),
        ResponseFlags::default(),
        &[],
    ));
    let (served, key) = route(&router, &prompt("g"));
    sink.on_entry(entry(
        &key,
        None,
        Some(served),
        ResponseFlags::default(),
        &[],
    ));
    assert_eq!(count(&router, "records", "failed"), 2);
    assert_eq!(total_entries(&router), 0);
    assert!(router.pending.is_empty());
    assert_eq!(inflight(&router), 0);
}

#[test]
fn an_address_outside_the_endpoint_set_records_nothing() {
    let router = router();
    let sink = sink(&router);
    let (_, key) = route(&router, &prompt("h"));
    sink.on_entry(ok(&key, Some(addr(9))));
    assert_eq!(count(&router, "records", "unknown_pod"), 1);
    assert_eq!(total_entries(&router), 0);
}

#[test]
fn unclaimed_and_intermediate_entries_change_nothing() {
    let router = router();
    let sink = sink(&router);
    let (_, key) = route(&router, &prompt("i"));
    for kind in [
        AccessLogType::DownstreamStart,
        AccessLogType::DownstreamPeriodic,
    ] {
        let mut intermediate = ok(&key, None);
        if let Some(c) = intermediate.common_properties.as_mut() {
            c.access_log_type = kind as i32;
        }
        sink.on_entry(intermediate);
    }
    let (replica, rest) = key.split_once('-').unwrap();
    let (n, secret) = rest.split_once('.').unwrap();
    let next = n.parse::<u64>().unwrap() + 1;
    sink.on_entry(ok(&format!("{replica}-{next}.{secret}"), None));
    sink.on_entry(HttpAccessLogEntry::default());
    assert_eq!(router.pending.len(), 1, "still waiting for its final entry");
    assert_eq!(count(&router, "entries", "intermediate"), 2);
    assert_eq!(count(&router, "entries", "unclaimed"), 1);
    assert_eq!(count(&router, "entries", "no_route_key"), 1);
    assert_eq!(total_entries(&router), 0);
    let mut end = ok(&key, None);
    if let Some(c) = end.common_properties.as_mut() {
        c.access_log_type = AccessLogType::DownstreamEnd as i32;
    }
    sink.on_entry(end);
    assert_eq!(count(&router, "entries", "claimed"), 1);
    assert_eq!(count(&router, "records", "recorded"), 1);
}

#[test]
fn socket_addresses_are_read_exactly() {
    assert_eq!(socket_addr(&socket(addr(8001))), Some(addr(8001)));
    let v6: SocketAddr = "[::1]:80".parse().unwrap();
    assert_eq!(socket_addr(&socket(v6)), Some(v6));
    let named = Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: "pod.example".into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(80)),
            ..SocketAddress::default()
        })),
    };
    assert_eq!(socket_addr(&named), None);
    assert_eq!(socket_addr(&Address::default()), None);
}

fn message(entries: Vec<HttpAccessLogEntry>) -> StreamAccessLogsMessage {
    StreamAccessLogsMessage {
        log_entries: Some(LogEntries::HttpLogs(
            envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::HttpAccessLogEntries {
                log_entry: entries,
            },
        )),
        ..StreamAccessLogsMessage::default()
    }
}

/// Over a real gRPC stream: entries are applied as they arrive, and at shutdown the stream
/// stays open while a route still waits for its entry, then ends by itself.
#[tokio::test]
async fn a_stream_drains_then_ends_itself_at_shutdown() {
    use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;

    let router = router();
    let shutdown = CancellationToken::new();
    let service = AccessLogSink::new(router.clone(), shutdown.clone(), Duration::from_secs(60));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut client = AccessLogServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let call = tokio::spawn(async move {
        client
            .stream_access_logs(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });

    let (_, s1) = route(&router, &prompt("s1"));
    let (_, s2) = route(&router, &prompt("s2"));
    tx.send(message(vec![ok(&s1, None)])).await.unwrap();
    let poll = || async {
        for _ in 0..200 {
            if router.pending.len() <= 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the entry was not applied");
    };
    poll().await;
    assert_eq!(count(&router, "records", "recorded"), 1);

    shutdown.cancel();
    // s2 still waits: the stream stays open for its entry.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "ended while a route was waiting");
    tx.send(message(vec![ok(&s2, None)])).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the stream ends once nothing waits")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(count(&router, "records", "recorded"), 2);
    drop(tx);
}

/// When the access log requires a client certificate, a stream without one (plaintext here)
/// has every entry refused and counted, even one with a route key the picker issued, and the
/// route keeps waiting; without the requirement the same entry is claimed.
#[tokio::test]
async fn without_a_client_certificate_entries_are_refused_when_one_is_required() {
    use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;

    let router = router();
    let (_, key) = route(&router, &prompt("uncertified"));
    for required in [true, false] {
        let service = sink(&router).require_client_cert(required);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service.into_server())
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let mut client = AccessLogServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let entries = vec![ok(&key, None), HttpAccessLogEntry::default()];
        // The call returns once the service has read the whole stream.
        client
            .stream_access_logs(futures::stream::iter([message(entries)]))
            .await
            .unwrap();
        if required {
            assert_eq!(count(&router, "entries", "no_client_cert"), 2);
            assert_eq!(count(&router, "entries", "claimed"), 0);
            assert_eq!(router.pending.len(), 1, "the route keeps waiting");
        } else {
            assert_eq!(count(&router, "entries", "claimed"), 1);
            assert_eq!(count(&router, "records", "recorded"), 1);
        }
    }
}

/// An access log sent to a Service in front of several pickers: an entry for a route another
/// replica issued is counted as `other_replica` (not as a forgery), claims nothing here and
/// leaves both replicas' routes waiting for their own entries.
#[test]
fn an_entry_for_another_replicas_route_is_counted_as_such() {
    let (here, there) = (router(), router());
    let sink_here = sink(&here);
    let (primary_here, key_here) = route(&here, &prompt("routed here"));
    let (primary_there, key_there) = route(&there, &prompt("routed there"));
    sink_here.on_entry(ok(&key_there, Some(primary_there)));
    assert_eq!(count(&here, "entries", "other_replica"), 1);
    assert_eq!(count(&here, "entries", "forged"), 0);
    assert_eq!(count(&here, "entries", "claimed"), 0);
    assert_eq!(total_entries(&here), 0, "nothing recorded here");
    assert_eq!((here.pending.len(), there.pending.len()), (1, 1));
    // Each replica's own entry still claims its route.
    sink_here.on_entry(ok(&key_here, Some(primary_here)));
    sink(&there).on_entry(ok(&key_there, Some(primary_there)));
    assert_eq!(count(&here, "entries", "claimed"), 1);
    assert_eq!(count(&there, "entries", "claimed"), 1);
    assert!(here.pending.is_empty() && there.pending.is_empty());
}
