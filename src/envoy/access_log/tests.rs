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
/// route waits under `id` (or under `id~N` if a route with that id already waits). Returns the
/// primary pick and the route key.
fn route_keyed(router: &Arc<Router>, id: &str, body: &[u8]) -> (SocketAddr, String) {
    let routed = router
        .route("/v1/completions", Some(body), None)
        .expect("routed");
    let primary = routed.decision.primary().clone();
    let key = router.pending.insert(id, routed.ticket);
    (primary.spec.address, key)
}

/// [`route_keyed`], returning the primary pick.
fn route(router: &Arc<Router>, id: &str, body: &[u8]) -> SocketAddr {
    route_keyed(router, id, body).0
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

fn entry(
    request_id: &str,
    status: Option<u32>,
    upstream: Option<SocketAddr>,
    flags: ResponseFlags,
    metadata: Option<Metadata>,
) -> HttpAccessLogEntry {
    HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            upstream_remote_address: upstream.map(socket),
            response_flags: Some(flags),
            metadata,
            ..AccessLogCommon::default()
        }),
        request: Some(HttpRequestProperties {
            request_id: request_id.to_string(),
            ..HttpRequestProperties::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: status.map(|value| UInt32Value { value }),
            ..HttpResponseProperties::default()
        }),
        ..HttpAccessLogEntry::default()
    }
}

fn ok(request_id: &str, upstream: Option<SocketAddr>) -> HttpAccessLogEntry {
    entry(
        request_id,
        Some(200),
        upstream,
        ResponseFlags::default(),
        None,
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
    let primary = route(&router, "r-1", &prompt("a"));
    assert_eq!(inflight(&router), 1);
    // A retry moved the request to another pod: the log names it.
    let served = PORTS.map(addr).into_iter().find(|&a| a != primary).unwrap();
    sink.on_entry(ok("r-1", Some(served)));
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(count(&router, "records", "recorded"), 1);
    assert_eq!(count(&router, "entries", "claimed"), 1);
    assert_eq!(inflight(&router), 0);
    // The same prompt now goes where it was served.
    let again = route(&router, "r-2", &prompt("a"));
    assert_eq!(again, served);
}

#[test]
fn served_falls_back_to_the_metadata_then_the_primary() {
    let router = router();
    let sink = sink(&router);
    let primary = route(&router, "m-1", &prompt("b"));
    let other = PORTS.map(addr).into_iter().find(|&a| a != primary).unwrap();
    let md = lb(&[(SERVED_KEY, &other.to_string())]);
    sink.on_entry(entry(
        "m-1",
        Some(200),
        None,
        ResponseFlags::default(),
        Some(md),
    ));
    assert!(entries(&router, other) > 0);

    let primary = route(&router, "m-2", &prompt("c"));
    let before = entries(&router, primary);
    sink.on_entry(ok("m-2", None));
    assert!(entries(&router, primary) > before);
    assert_eq!(count(&router, "records", "recorded"), 2);
}

#[test]
fn two_requests_with_one_request_id_are_told_apart_by_their_route_keys() {
    let router = router();
    let sink = sink(&router);
    let (_, first) = route_keyed(&router, "dup", &prompt("e"));
    let (_, second) = route_keyed(&router, "dup", &prompt("f"));
    assert_eq!(first, "dup");
    assert_ne!(second, first);
    assert_eq!(inflight(&router), 2);
    // The second request ends first, served by pod 0; then the first, served by pod 1.
    let [pod0, pod1, _] = PORTS.map(addr);
    for (key, served) in [(&second, pod0), (&first, pod1)] {
        let md = lb(&[(ROUTE_KEY, key)]);
        sink.on_entry(entry(
            "dup",
            Some(200),
            Some(served),
            ResponseFlags::default(),
            Some(md),
        ));
    }
    assert!(router.pending.is_empty());
    assert_eq!(inflight(&router), 0);
    assert_eq!(count(&router, "records", "recorded"), 2);
    // Each prompt was recorded for the pod that served it.
    assert_eq!(route(&router, "next-f", &prompt("f")), pod0);
    assert_eq!(route(&router, "next-e", &prompt("e")), pod1);
}

#[test]
fn the_route_key_in_the_metadata_claims_when_the_request_id_is_missing() {
    let router = router();
    let sink = sink(&router);
    route(&router, "k-1", &prompt("d"));
    let md = lb(&[(ROUTE_KEY, "k-1")]);
    sink.on_entry(entry(
        "",
        Some(200),
        None,
        ResponseFlags::default(),
        Some(md),
    ));
    assert!(router.pending.is_empty());
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
        let id = format!("cut-{i}");
        let served = route(&router, &id, &prompt(&id));
        // The response began with 200 before the stream was cut.
        sink.on_entry(entry(&id, Some(200), Some(served), flags, None));
    }
    assert_eq!(count(&router, "records", "aborted"), 3);
    let served = route(&router, "f-1", &prompt("f"));
    sink.on_entry(entry(
        "f-1",
        Some(503),
        Some(served),
        ResponseFlags::default(),
        None,
    ));
    let served = route(&router, "f-2", &prompt("g"));
    sink.on_entry(entry(
        "f-2",
        None,
        Some(served),
        ResponseFlags::default(),
        None,
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
    route(&router, "u-1", &prompt("h"));
    sink.on_entry(ok("u-1", Some(addr(9))));
    assert_eq!(count(&router, "records", "unknown_pod"), 1);
    assert_eq!(total_entries(&router), 0);
}

#[test]
fn unclaimed_and_intermediate_entries_change_nothing() {
    let router = router();
    let sink = sink(&router);
    route(&router, "i-1", &prompt("i"));
    for kind in [
        AccessLogType::DownstreamStart,
        AccessLogType::DownstreamPeriodic,
    ] {
        let mut intermediate = ok("i-1", None);
        if let Some(c) = intermediate.common_properties.as_mut() {
            c.access_log_type = kind as i32;
        }
        sink.on_entry(intermediate);
    }
    sink.on_entry(ok("someone-else", None));
    sink.on_entry(HttpAccessLogEntry::default());
    assert_eq!(router.pending.len(), 1, "still waiting for its final entry");
    assert_eq!(count(&router, "entries", "intermediate"), 2);
    assert_eq!(count(&router, "entries", "unclaimed"), 2);
    assert_eq!(total_entries(&router), 0);
    let mut end = ok("i-1", None);
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

    route(&router, "s-1", &prompt("s1"));
    route(&router, "s-2", &prompt("s2"));
    tx.send(message(vec![ok("s-1", None)])).await.unwrap();
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
    // "s-2" still waits: the stream stays open for its entry.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "ended while a route was waiting");
    tx.send(message(vec![ok("s-2", None)])).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the stream ends once nothing waits")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(count(&router, "records", "recorded"), 2);
    drop(tx);
}
