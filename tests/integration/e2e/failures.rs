//! Failures: bad and hostile request bodies get defined answers and leak nothing; a picker that is
//! down or frozen fails open or closed as the Envoy example says.

use std::time::Duration;

use super::{SYSTEM, assert_sticky, chat, envoy_for, send, stack, three_backends};
use crate::harness::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_from_the_picker() {
    let (backends, picker, envoy) = stack("envoy.yaml", "", |s| s).await;
    let client = reqwest::Client::new();
    let r = client
        .post(envoy.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{v}"
    );
    let r = send(&envoy, "/v1/completions", &json!({"prompt": "no model"})).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error"]["message"],
        "request body has no `model` field"
    );
    // A prompt prefix-cache cannot read is routed, not rejected.
    let r = send(
        &envoy,
        "/v1/completions",
        &json!({"model": "m", "prompt": [1, 2, 3]}),
    )
    .await;
    assert_eq!(r.status, 200);
    wait_metric(
        &picker,
        "prefix_picker_unscored_requests_total{reason=\"prompt_not_string\"}",
        1.0,
    )
    .await;
    // Unknown APIs go to some pod by load.
    let r = client.get(envoy.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Only the two routable requests reached a backend: the picker answered the bad ones.
    let served: Vec<usize> = backends
        .iter()
        .map(|b| b.served.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert_eq!(served.iter().sum::<usize>(), 2, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_defined_outcomes_and_leak_nothing() {
    let (_backends, picker, envoy) =
        stack("envoy.yaml", "picker: {maxBodyBytes: 12582912}\n", |s| s).await;
    let client = reqwest::Client::new();
    let deep = |n: usize| {
        format!(
            "{{\"model\":\"m\",\"prompt\":\"x\",\"extra\":{}1{}}}",
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let big = |bytes: usize| {
        format!("{{\"model\":\"m\",\"prompt\":\"{}\"}}", "a".repeat(bytes)).into_bytes()
    };
    let cases: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        ("not JSON", "/v1/completions", b"{not json".to_vec(), 400),
        ("truncated JSON", "/v1/completions", br#"{"model":"m","prompt":"abc"#.to_vec(), 400),
        ("array body", "/v1/chat/completions", b"[]".to_vec(), 400),
        ("string body", "/v1/chat/completions", br#""hello""#.to_vec(), 400),
        ("number model", "/v1/completions", br#"{"model":7,"prompt":"x"}"#.to_vec(), 400),
        ("empty body", "/v1/completions", Vec::new(), 400),
        ("raw NUL in a string", "/v1/completions", b"{\"model\":\"m\",\"prompt\":\"a\0b\"}".to_vec(), 400),
        ("number out of range", "/v1/completions", br#"{"model":"m","prompt":"x","max_tokens":1e400}"#.to_vec(), 400),
        ("200-level nesting", "/v1/completions", deep(200).into_bytes(), 400),
        ("50-level nesting", "/v1/completions", deep(50).into_bytes(), 200),
        ("prompt of the wrong type", "/v1/completions", br#"{"model":"m","prompt":{"a":1}}"#.to_vec(), 200),
        ("messages of the wrong type", "/v1/chat/completions", br#"{"model":"m","messages":{"role":"user"}}"#.to_vec(), 200),
        ("messages with bad items", "/v1/chat/completions", br#"{"model":"m","messages":[5,null,{"role":1},{"role":"user","content":[{"type":"image_url"}]}]}"#.to_vec(), 200),
        ("input of the wrong type", "/v1/responses", br#"{"model":"m","input":42}"#.to_vec(), 200),
        ("invalid UTF-8", "/v1/completions", b"{\"model\":\"m\",\"prompt\":\"\xff\xfe\xe2\x82A\"}".to_vec(), 200),
        ("lone surrogate escapes", "/v1/completions", br#"{"model":"m","prompt":"\ud800\udc00\udfff x"}"#.to_vec(), 200),
        ("escaped NUL", "/v1/completions", br#"{"model":"m","prompt":"a\u0000b"}"#.to_vec(), 200),
        ("duplicate keys", "/v1/completions", br#"{"model":"x","model":"m","prompt":"a","prompt":"b"}"#.to_vec(), 200),
        ("messages: array body", "/v1/messages", b"[]".to_vec(), 400),
        ("messages: no model", "/v1/messages", br#"{"max_tokens":1,"messages":[]}"#.to_vec(), 400),
        ("messages: wrong types", "/v1/messages", br#"{"model":"m","system":7,"tools":{"a":1},"messages":[5,null,{"role":1},{"role":"user","content":[{"type":"tool_use","input":"x"},{"type":"image","source":3},{"type":"tool_result","content":{"a":[1]}}]}]}"#.to_vec(), 200),
        ("messages: not a list", "/v1/messages", br#"{"model":"m","messages":{"role":"user"}}"#.to_vec(), 200),
        ("messages: deep nesting", "/v1/messages", format!("{{\"model\":\"m\",\"messages\":[{{\"role\":\"assistant\",\"content\":[{{\"type\":\"tool_use\",\"name\":\"t\",\"input\":{{\"a\":{}1{}}}}}]}}]}}", "[".repeat(100), "]".repeat(100)).into_bytes(), 200),
        ("messages: huge tool input", "/v1/messages", format!("{{\"model\":\"m\",\"messages\":[{{\"role\":\"assistant\",\"content\":[{{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"w\",\"input\":{{\"data\":\"{}\"}}}}]}}]}}", "z".repeat(4 << 20)).into_bytes(), 200),
        ("messages: invalid UTF-8 in text", "/v1/messages", b"{\"model\":\"m\",\"system\":[{\"type\":\"text\",\"text\":\"\xff\"}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\xfe\xe2\x82A\"}]}]}".to_vec(), 200),
        ("messages: count_tokens passes through", "/v1/messages/count_tokens", br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#.to_vec(), 200),
        ("unknown API path", "/v1/embeddings", br#"{"model":"m","input":"x"}"#.to_vec(), 200),
        ("10 MB prompt", "/v1/completions", big(10 << 20), 200),
        ("13 MB prompt (over maxBodyBytes)", "/v1/completions", big(13 << 20), 413),
    ];
    for (name, path, body, want) in cases {
        let r = client
            .post(envoy.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, want, "{name}: {text}");
        if status >= 400 {
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|_| panic!("{name}: not JSON: {text}"));
            assert!(v["error"]["message"].is_string(), "{name}: {v}");
        }
    }
    // Wrong content type, GET without a body, a chunked upload.
    let r = client
        .post(envoy.url("/v1/completions"))
        .header("content-type", "text/plain")
        .body(r#"{"model":"m","prompt":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client
        .get(envoy.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let chunks = futures::stream::iter(
        [r#"{"model":"m","#, r#""prompt":"chunked "#, r#"upload"}"#]
            .map(|s| Ok::<_, std::io::Error>(s.to_string())),
    );
    let r = client
        .post(envoy.url("/v1/completions"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // A client that disconnects mid-body.
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", envoy.port))
            .await
            .unwrap();
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":\"m\",\"prompt\":\"abc").await.unwrap();
        drop(s);
    }
    // Nothing leaked, and the picker still routes.
    wait_metric_eq(&picker, "prefix_picker_inflight_streams", 0.0).await;
    wait_metric_eq(&picker, "prefix_picker_pod_inflight_requests", 0.0).await;
    assert_sticky(
        &envoy,
        &picker,
        "/v1/chat/completions",
        &chat(SYSTEM, "still alive"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picker_down_fails_open_or_closed_as_configured() {
    let backends = three_backends().await;
    // A port nobody listens on (bound, then released): the picker is down.
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let body = chat(SYSTEM, "is the picker there?");
    let open = envoy_for("envoy-fail-open.yaml", dead_port, &backends).await;
    let r = send(&open, "/v1/chat/completions", &body).await;
    assert_eq!(
        r.status,
        200,
        "fail-open still reaches a pod: {}",
        open.log()
    );
    assert!(!r.served_by.is_empty());
    let closed = envoy_for("envoy.yaml", dead_port, &backends).await;
    let r = send(&closed, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 500, "fail-closed answers 500 without the picker");

    // A frozen picker: connections are accepted, nothing is ever answered. Envoy applies no
    // message_timeout while the FULL_DUPLEX body is with the processor; envoy.yaml's HTTP/2
    // keepalive cuts the connection off and the request fails closed instead of hanging.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let frozen_port = frozen.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            held.push(socket);
        }
    });
    let stuck = envoy_for("envoy.yaml", frozen_port, &backends).await;
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        send(&stuck, "/v1/chat/completions", &body),
    )
    .await
    .expect("a frozen picker must not hold the request for a minute");
    assert_eq!(r.status, 500, "fail-closed answers 500 for a frozen picker");
    holder.abort();
}
