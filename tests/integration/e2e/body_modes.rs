//! Body modes: BUFFERED (observer filter), FULL_DUPLEX_STREAMED (access log or the GIE-shaped
//! filter), BUFFERED_PARTIAL, streamed responses; HTTP/2 clients, trailers, `expect: 100-continue`
//! and a filter that skips request headers.

use std::time::Duration;

use super::{SYSTEM, assert_sticky, chat, finish_gated_stream, open_gated_stream, send, stack};
use crate::harness::*;
use serde_json::{Value, json};

async fn body_modes(file: &str, edit: fn(String) -> String) {
    let (backends, picker, envoy) = stack(file, "", edit).await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/chat/completions",
        &chat(SYSTEM, "modes"),
    )
    .await;
    // A 2 MB prompt goes through whole.
    let big = json!({"model": "m", "prompt": "lorem ipsum dolor sit amet ".repeat(80_000)});
    let sent = serde_json::to_vec(&big).unwrap().len();
    let r = send(&envoy, "/v1/completions", &big).await;
    assert_eq!(r.status, 200, "{}", envoy.log());
    assert_eq!(r.body["body_len"].as_u64().unwrap() as usize, sent);
    // Both sticky requests and the 2 MB one are recorded (completions may land just after the
    // client has its response: the access log is sent when Envoy finishes the stream).
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        3.0,
    )
    .await;
    // SSE: the first event reaches the client while the backend still holds the stream open.
    let recorded = metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await;
    let body = json!({"model": "m", "stream": true, "prompt": "GATED stream please"});
    let (served, chunks) = open_gated_stream(&envoy, &body).await;
    // Not recorded yet: the stream has not ended. Unless the routing filter sees the response
    // itself (the GIE shape), its route waits for the access log or the observer filter.
    assert_eq!(
        metric(&picker, "prefix_picker_records_total{outcome=\"recorded\"}").await,
        recorded
    );
    let waits = if file == "envoy-full-duplex.yaml" {
        0.0
    } else {
        1.0
    };
    wait_metric_eq(&picker, "prefix_picker_pending_routes", waits).await;
    finish_gated_stream(&backends, &served, chunks).await;
    wait_metric_eq(&picker, "prefix_picker_pending_routes", 0.0).await;
    wait_metric(
        &picker,
        "prefix_picker_records_total{outcome=\"recorded\"}",
        recorded + 1.0,
    )
    .await;
    assert_eq!(prefix_score(&picker, &body, &served).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_request_body_with_observer_filter() {
    body_modes("envoy-observer.yaml", |s| s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_request_body_with_access_log_completions() {
    body_modes("envoy.yaml", |s| s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_request_and_response_bodies() {
    body_modes("envoy-full-duplex.yaml", |s| s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_request_with_streamed_response_on_one_filter() {
    body_modes("envoy-full-duplex.yaml", |s| {
        let s = replaced(
            &s,
            "response_body_mode: FULL_DUPLEX_STREAMED",
            "response_body_mode: STREAMED",
        );
        replaced(
            &s,
            "response_trailer_mode: SEND",
            "response_trailer_mode: SKIP",
        )
    })
    .await;
}

/// One HTTP/1.1 exchange written by hand on a fresh connection (`connection: close` in `head`):
/// sends `head`; then, if `after_continue` is given, waits for Envoy's `100 Continue` before
/// sending it. Returns the final status and `x-served-by`.
async fn send_raw(envoy: &Envoy, head: &[u8], after_continue: Option<&[u8]>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Far above any healthy answer; a stuck request would otherwise wait for Envoy's 300 s
    // stream_idle_timeout.
    let limit = Duration::from_secs(30);
    let stuck = || panic!("no response within 30 s: {}", envoy.log());
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", envoy.port))
        .await
        .unwrap();
    socket.write_all(head).await.unwrap();
    if let Some(body) = after_continue {
        let mut interim = Vec::new();
        while !interim.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            tokio::time::timeout(limit, socket.read_exact(&mut byte))
                .await
                .unwrap_or_else(|_| stuck())
                .unwrap();
            interim.push(byte[0]);
        }
        let interim = String::from_utf8_lossy(&interim);
        assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
        socket.write_all(body).await.unwrap();
    }
    let mut response = Vec::new();
    tokio::time::timeout(limit, socket.read_to_end(&mut response))
        .await
        .unwrap_or_else(|_| stuck())
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let served_by = text
        .lines()
        .find_map(|l| l.strip_prefix("x-served-by: "))
        .unwrap_or_default()
        .to_string();
    (status, served_by)
}

/// Sends `body` as a chunked upload that ends with a trailer.
async fn send_with_trailer(envoy: &Envoy, path: &str, body: &Value) -> (u16, String) {
    let body = serde_json::to_vec(body).unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: gateway.local\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\ntrailer: x-client-checksum\r\nconnection: close\r\n\r\n\
         {:x}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    request.extend_from_slice(b"\r\n0\r\nx-client-checksum: 1234\r\n\r\n");
    send_raw(envoy, &request, None).await
}

/// Sends `body` the way curl uploads more than 1 KiB: `expect: 100-continue`, and the body only
/// after the interim response.
async fn send_expecting_continue(envoy: &Envoy, path: &str, body: &Value) -> (u16, String) {
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: gateway.local\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        body.len()
    );
    send_raw(envoy, head.as_bytes(), Some(&body)).await
}

/// Sends `body` over HTTP/2 without TLS (prior knowledge), in `pieces` DATA frames, ending the
/// stream with a trailers frame or with an empty DATA frame; returns the status and
/// `x-served-by` after reading the whole response.
async fn send_h2(
    envoy: &Envoy,
    path: &str,
    body: &Value,
    pieces: usize,
    trailers: bool,
) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", envoy.port))
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://gateway.local{path}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut upload) = client.send_request(request, false).unwrap();
    let body = serde_json::to_vec(body).unwrap();
    for piece in body.chunks(body.len().div_ceil(pieces)) {
        upload
            .send_data(bytes::Bytes::copy_from_slice(piece), false)
            .unwrap();
    }
    if trailers {
        let mut map = http::HeaderMap::new();
        map.insert("x-client-checksum", http::HeaderValue::from_static("1234"));
        upload.send_trailers(map).unwrap();
    } else {
        upload.send_data(bytes::Bytes::new(), true).unwrap();
    }
    let response = tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .unwrap_or_else(|_| panic!("no response within 30 s: {}", envoy.log()))
        .unwrap();
    let status = response.status().as_u16();
    let served_by = response
        .headers()
        .get("x-served-by")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let mut reply = response.into_body();
    while let Some(data) = reply.data().await {
        let data = data.unwrap();
        let _ = reply.flow_control().release_capacity(data.len());
    }
    (status, served_by)
}

/// HTTP/2 clients (several DATA frames, the end on an empty frame or on trailers) are routed
/// and recorded like HTTP/1.1 ones.
async fn http2_clients(file: &str, edit: fn(String) -> String) {
    let (_backends, picker, envoy) = stack(file, "", edit).await;
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";
    let body = chat(SYSTEM, &"an HTTP/2 upload in several frames. ".repeat(40));
    let (status, first) = send_h2(&envoy, "/v1/chat/completions", &body, 3, false).await;
    assert_eq!(status, 200, "{}", envoy.log());
    wait_metric(&picker, recorded, 1.0).await;
    assert_eq!(prefix_score(&picker, &body, &first).await, 100);
    // Each completion (and the release of its pod's in-flight count) is awaited before the next
    // request: the access log lands just after the client has its answer.
    for (n, (pieces, trailers)) in [(1, true), (4, true), (2, false)].into_iter().enumerate() {
        let again = send_h2(&envoy, "/v1/chat/completions", &body, pieces, trailers).await;
        assert_eq!(
            again,
            (200, first.clone()),
            "{pieces} frames, trailers {trailers}"
        );
        wait_metric(&picker, recorded, 2.0 + n as f64).await;
    }
    // A bad body is refused by the picker over HTTP/2 too.
    let (status, _) = send_h2(&envoy, "/v1/completions", &json!({"model": 7}), 1, true).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_routed_with_a_full_duplex_body() {
    http2_clients("envoy.yaml", |s| s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_routed_with_a_buffered_body() {
    http2_clients("envoy-observer.yaml", |s| s).await;
}

/// BUFFERED_PARTIAL: a whole body that trailers follow arrives without `end_of_stream`, like a
/// body cut at Envoy's buffer limit; the picker routes the one that parses whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_routed_with_a_buffered_partial_body() {
    http2_clients("envoy-observer.yaml", |s| {
        replaced(
            &s,
            "request_body_mode: BUFFERED\n",
            "request_body_mode: BUFFERED_PARTIAL\n",
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_routed_by_the_gie_shaped_filter() {
    http2_clients("envoy-full-duplex.yaml", |s| s).await;
}

/// A request that ends with trailers is routed and recorded like any other: with a BUFFERED
/// body (Envoy then sends the whole body with `end_of_stream` false, trailers skipped) and with
/// FULL_DUPLEX_STREAMED (the body ends at the trailers message).
async fn request_trailers(file: &str) {
    let (_backends, picker, envoy) = stack(file, "", |s| {
        replaced(
            &s,
            "          stat_prefix: ingress\n",
            "          stat_prefix: ingress\n          http_protocol_options: {enable_trailers: true}\n",
        )
    })
    .await;
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";
    let body = chat(SYSTEM, "a request with trailers");
    let (status, first) = send_with_trailer(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{}", envoy.log());
    wait_metric(&picker, recorded, 1.0).await;
    assert_eq!(prefix_score(&picker, &body, &first).await, 100);
    // Each completion (and the release of its pod's in-flight count) is awaited before the next
    // request: the access log lands just after the client has its answer.
    for n in 2..=4 {
        let (status, again) = send_with_trailer(&envoy, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200);
        assert_eq!(again, first, "same prefix, same pod");
        wait_metric(&picker, recorded, f64::from(n)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_request_with_trailers_is_routed() {
    request_trailers("envoy-observer.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_request_with_trailers_is_routed() {
    request_trailers("envoy.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gie_shaped_filter_routes_a_request_with_trailers() {
    request_trailers("envoy-full-duplex.yaml").await;
}

/// curl sends `expect: 100-continue` before a body over 1 KiB and waits for the interim
/// response: Envoy answers it itself, and the request is routed and recorded as usual.
async fn expect_continue(file: &str) {
    let (_backends, picker, envoy) = stack(file, "", |s| s).await;
    let recorded = "prefix_picker_records_total{outcome=\"recorded\"}";
    let body = chat(
        SYSTEM,
        &"an upload that waits for 100 Continue. ".repeat(64),
    );
    let (status, first) = send_expecting_continue(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{}", envoy.log());
    wait_metric(&picker, recorded, 1.0).await;
    assert_eq!(prefix_score(&picker, &body, &first).await, 100);
    let (status, again) = send_expecting_continue(&envoy, "/v1/chat/completions", &body).await;
    assert_eq!((status, again), (200, first), "same prefix, same pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_upload_is_routed_with_a_full_duplex_body() {
    expect_continue("envoy.yaml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_upload_is_routed_with_a_buffered_body() {
    expect_continue("envoy-observer.yaml").await;
}

/// A routing filter that skips request headers (a misconfiguration): Envoy forwards the request
/// before the picker has seen the body, so the pick cannot steer it. The request still goes
/// through (the picker answers the body at once) and the picker says why it could not score.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_request_headers_are_answered_and_counted() {
    fn skip_headers(config: String) -> String {
        replaced(
            &config,
            "request_header_mode: SEND\n                request_body_mode: FULL_DUPLEX_STREAMED\n                request_trailer_mode: SEND",
            "request_header_mode: SKIP\n                request_body_mode: BUFFERED\n                request_trailer_mode: SKIP",
        )
    }
    let (_backends, picker, envoy) = stack("envoy.yaml", "", skip_headers).await;
    let r = send(&envoy, "/v1/chat/completions", &chat(SYSTEM, "headless")).await;
    assert_eq!(r.status, 200, "{}", envoy.log());
    assert_eq!(
        metric(
            &picker,
            "prefix_picker_unscored_requests_total{reason=\"no_request_path\"}"
        )
        .await,
        1.0
    );
}
