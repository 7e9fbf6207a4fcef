//! The debug endpoints' access rules over real sockets, TokenReview against the fake API server,
//! and forged access-log entries over the real gRPC port.

use std::net::{IpAddr, SocketAddr, UdpSocket};

use axum::http::{HeaderMap, header};
use prefix_picker::admin::DebugAccess;
use prefix_picker::config::Config;
use prefix_picker::serve::{self, Running};

use crate::harness::fake_kube::FakeKube;
use crate::harness::*;

const CONFIG: &str = "endpoints: [{name: p, address: 127.0.0.1:1}]\n";

async fn start(picker_section: &str, admin: &str) -> Running {
    let config = Config::parse(&format!("{CONFIG}{picker_section}")).unwrap();
    serve::start(config, "127.0.0.1:0", admin).await.unwrap()
}

/// POSTs an explain request to `url`'s `/debug/explain`; the status.
async fn explain_status(admin: SocketAddr, token: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(format!("http://{admin}/debug/explain"))
        .json(&serde_json::json!({"model": "m", "prompt": "hello"}));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    request.send().await.unwrap().status().as_u16()
}

/// This host's address on its default route (not loopback).
fn non_loopback_ip() -> IpAddr {
    let probe = UdpSocket::bind("0.0.0.0:0").unwrap();
    probe.connect("192.0.2.1:9").expect("a default route");
    let ip = probe.local_addr().unwrap().ip();
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ip
}

#[tokio::test]
async fn explain_is_off_by_default() {
    let picker = start("", "127.0.0.1:0").await;
    assert_eq!(explain_status(picker.admin_addr, None).await, 404);
    // The rest of the admin listener is unchanged.
    let metrics = reqwest::get(format!("http://{}/metrics", picker.admin_addr))
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    picker.stop().await.unwrap();
}

#[tokio::test]
async fn when_on_explain_answers_loopback_peers_only() {
    let picker = start("picker: {debug: {enabled: true}}", "0.0.0.0:0").await;
    let port = picker.admin_addr.port();
    let loopback = SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(explain_status(loopback, None).await, 200);
    let outside = SocketAddr::new(non_loopback_ip(), port);
    assert_eq!(explain_status(outside, None).await, 403);
    assert_eq!(explain_status(outside, Some("anything")).await, 403);
    picker.stop().await.unwrap();
}

#[tokio::test]
async fn with_a_bearer_token_only_the_right_token_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "right-token\n").unwrap();
    let section = format!(
        "picker: {{debug: {{enabled: true, bearerTokenFile: {}}}}}",
        file.display()
    );
    let picker = start(&section, "0.0.0.0:0").await;
    let outside = SocketAddr::new(non_loopback_ip(), picker.admin_addr.port());
    assert_eq!(explain_status(outside, Some("right-token")).await, 200);
    assert_eq!(explain_status(outside, Some("wrong-token")).await, 401);
    assert_eq!(explain_status(outside, None).await, 401);
    // Loopback needs it too once a credential is configured.
    assert_eq!(explain_status(picker.admin_addr, None).await, 401);
    picker.stop().await.unwrap();
}

#[tokio::test]
async fn token_review_against_the_api_server() {
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.authenticate("sa-token", "system:serviceaccount:ops:debugger");
        c.authenticate("other-token", "system:serviceaccount:llm:someone");
    });
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let peer = SocketAddr::from(([10, 0, 0, 7], 40000));
    let bearer = |t: &str| {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {t}").parse().unwrap(),
        );
        h
    };
    let status = |access: DebugAccess, headers: HeaderMap| async move {
        match access.check(peer, &headers).await {
            Ok(()) => 200,
            Err(r) => r.status().as_u16(),
        }
    };
    let any = DebugAccess::token_review(client.clone(), vec![]);
    assert_eq!(status(any.clone(), bearer("sa-token")).await, 200);
    assert_eq!(status(any.clone(), bearer("other-token")).await, 200);
    assert_eq!(status(any.clone(), bearer("not-a-token")).await, 401);
    assert_eq!(status(any, HeaderMap::new()).await, 401);
    let listed =
        DebugAccess::token_review(client, vec!["system:serviceaccount:ops:debugger".into()]);
    assert_eq!(status(listed.clone(), bearer("sa-token")).await, 200);
    assert_eq!(status(listed, bearer("other-token")).await, 403);
}

/// Entries sent to the real gRPC port without an issued route key record nothing and are
/// counted; the request id of a request the picker routed does not claim it.
#[tokio::test]
async fn forged_access_log_entries_record_nothing() {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::envoy::data::accesslog::v3::{
        AccessLogCommon, HttpAccessLogEntry, HttpRequestProperties, HttpResponseProperties,
    };
    use envoy_types::pb::envoy::service::accesslog::v3::StreamAccessLogsMessage;
    use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;
    use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::{
        HttpAccessLogEntries, LogEntries,
    };
    use envoy_types::pb::google::protobuf::{Struct, UInt32Value, Value, value::Kind};

    let picker = start("", "127.0.0.1:0").await;
    let entry = |route_key: Option<&str>| HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            metadata: route_key.map(|k| Metadata {
                filter_metadata: [(
                    "envoy.lb".to_string(),
                    Struct {
                        fields: [(
                            "x-prefix-picker-route".to_string(),
                            Value {
                                kind: Some(Kind::StringValue(k.to_string())),
                            },
                        )]
                        .into(),
                    },
                )]
                .into(),
                ..Metadata::default()
            }),
            ..AccessLogCommon::default()
        }),
        request: Some(HttpRequestProperties {
            request_id: "req-1".into(),
            ..HttpRequestProperties::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: Some(UInt32Value { value: 200 }),
            ..HttpResponseProperties::default()
        }),
        ..HttpAccessLogEntry::default()
    };
    let message = StreamAccessLogsMessage {
        log_entries: Some(LogEntries::HttpLogs(HttpAccessLogEntries {
            log_entry: vec![
                entry(None),
                entry(Some("req-1")),
                // The key format before replica ids: not one this picker could issue.
                entry(Some("0.00000000000000000000000000000000")),
                // Well-formed, of another replica (a 2^-64 chance of naming this one).
                entry(Some("0123456789abcdef-0.00000000000000000000000000000000")),
            ],
        })),
        ..StreamAccessLogsMessage::default()
    };
    let mut client = AccessLogServiceClient::connect(format!("http://{}", picker.grpc_addr))
        .await
        .unwrap();
    client
        .stream_access_logs(futures::stream::iter([message]))
        .await
        .unwrap();
    let series = |r: &str| format!("prefix_picker_access_log_entries_total{{result=\"{r}\"}}");
    wait_metric_eq(&picker, &series("no_route_key"), 1.0).await;
    wait_metric_eq(&picker, &series("forged"), 2.0).await;
    wait_metric_eq(&picker, &series("other_replica"), 1.0).await;
    assert_eq!(
        metric_opt(&picker, &series("claimed")).await.unwrap_or(0.0),
        0.0
    );
    picker.stop().await.unwrap();
}
