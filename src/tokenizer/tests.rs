//! The tokenizer against a stub engine on a loopback port.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;

use super::*;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What the stub engine answers.
#[derive(Clone)]
enum Answer {
    Json(String),
    Status(StatusCode, String),
    /// Never answers.
    Hang,
}

struct Stub {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl Stub {
    /// A stub serving `answer` on `POST /tokenize`, bound before this returns (no readiness wait).
    async fn start(answer: Answer) -> Stub {
        let calls = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (c, b) = (calls.clone(), bodies.clone());
        let app = axum::Router::new().route(
            "/tokenize",
            axum::routing::post(move |body: String| {
                let (c, b, answer) = (c.clone(), b.clone(), answer.clone());
                async move {
                    c.fetch_add(1, Relaxed);
                    b.lock().push(body);
                    match answer {
                        Answer::Json(json) => json.into_response(),
                        Answer::Status(status, text) => (status, text).into_response(),
                        Answer::Hang => std::future::pending::<Response>().await,
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Stub {
            addr,
            calls,
            bodies,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Relaxed)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }
}

fn tokenizer(config: TokenizerConfig) -> EngineTokenizer {
    EngineTokenizer::new(config).unwrap()
}

fn ok(tokens: &[u32]) -> Answer {
    Answer::Json(format!(
        r#"{{"count":{},"max_model_len":4096,"tokens":{tokens:?}}}"#,
        tokens.len()
    ))
}

#[tokio::test]
async fn a_text_prompt_is_posted_to_vllm_and_its_tokens_read() {
    let stub = Stub::start(ok(&[1, 2, 3])).await;
    let t = tokenizer(TokenizerConfig::default());
    let input = TokenizeInput::text("Hello");
    let tokens = t
        .tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "m", &input)
        .await
        .unwrap();
    assert_eq!(tokens.as_slice(), &[1, 2, 3]);
    assert_eq!(
        *stub.bodies.lock(),
        [r#"{"model":"m","prompt":"Hello","add_special_tokens":true}"#]
    );
    let s = t.stats();
    assert_eq!(s.calls.load(Relaxed), 1);
    assert_eq!(
        s.latency_buckets
            .iter()
            .map(|b| b.load(Relaxed))
            .sum::<u64>(),
        1
    );
    assert_eq!(t.cached(), (1, 3));
}

#[tokio::test]
async fn a_chat_prompt_is_posted_to_sglang_with_its_tools() {
    let stub = Stub::start(ok(&[9])).await;
    let t = tokenizer(TokenizerConfig::default());
    let messages = r#"[{"role":"user","content":"hi"}]"#;
    let tools = r#"[{"type":"function","function":{"name":"f"}}]"#;
    let input = TokenizeInput::chat(messages, Some(tools));
    t.tokenize(LOCALHOST, stub.port(), EngineKind::Sglang, "m", &input)
        .await
        .unwrap();
    assert_eq!(
        *stub.bodies.lock(),
        [format!(
            r#"{{"model":"m","messages":{messages},"tools":{tools},"add_special_tokens":false}}"#
        )]
    );
}

#[tokio::test]
async fn repeated_identical_inputs_make_one_call() {
    let stub = Stub::start(ok(&[5, 6])).await;
    let t = tokenizer(TokenizerConfig::default());
    let input = TokenizeInput::text("same");
    for _ in 0..3 {
        let tokens = t
            .tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "m", &input)
            .await
            .unwrap();
        assert_eq!(&*tokens, &[5, 6]);
    }
    assert_eq!(stub.calls(), 1);
    assert_eq!(t.stats().cache_hits.load(Relaxed), 2);
    // Another model, kind or flag is another input.
    t.tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "n", &input)
        .await
        .unwrap();
    t.tokenize(LOCALHOST, stub.port(), EngineKind::Sglang, "m", &input)
        .await
        .unwrap();
    let no_bos = input.with_add_special_tokens(false);
    t.tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "m", &no_bos)
        .await
        .unwrap();
    assert_eq!(stub.calls(), 4);
}

#[tokio::test]
async fn concurrent_identical_inputs_share_one_call() {
    let stub = Stub::start(ok(&[4])).await;
    let t = tokenizer(TokenizerConfig::default());
    let input = TokenizeInput::text("burst");
    let askers = (0..8).map(|_| t.tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "m", &input));
    // `join_all` polls every future before the spawned call can run on this one-thread runtime.
    let results = futures_util::future::join_all(askers).await;
    for r in results {
        assert_eq!(&*r.unwrap(), &[4]);
    }
    assert_eq!(stub.calls(), 1);
    assert_eq!(t.stats().joined.load(Relaxed), 7);
    assert_eq!(t.stats().calls.load(Relaxed), 1);
}

#[tokio::test]
async fn a_hanging_engine_is_a_timeout() {
    let stub = Stub::start(Answer::Hang).await;
    let t = tokenizer(TokenizerConfig {
        timeout: Duration::from_millis(20),
        ..TokenizerConfig::default()
    });
    let err = t
        .tokenize(
            LOCALHOST,
            stub.port(),
            EngineKind::Vllm,
            "m",
            &TokenizeInput::text("x"),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        TokenizeError::Timeout {
            url: format!("http://{}/tokenize", stub.addr),
            timeout: Duration::from_millis(20),
        }
    );
    assert_eq!(t.stats().errors_of(ErrorKind::Timeout), 1);
}

#[tokio::test]
async fn an_error_status_names_the_status_and_is_not_cached() {
    let stub = Stub::start(Answer::Status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("boom {}", "x".repeat(1000)),
    ))
    .await;
    let t = tokenizer(TokenizerConfig::default());
    let input = TokenizeInput::text("x");
    for _ in 0..2 {
        let err = t
            .tokenize(LOCALHOST, stub.port(), EngineKind::Vllm, "m", &input)
            .await
            .unwrap_err();
        let TokenizeError::Status {
            status, snippet, ..
        } = err
        else {
            panic!("{err}")
        };
        assert_eq!(status, 500);
        assert!(
            snippet.starts_with("boom x") && snippet.len() < 300,
            "{snippet}"
        );
    }
    assert_eq!(stub.calls(), 2);
    assert_eq!(t.stats().errors_of(ErrorKind::Status), 2);
    assert_eq!(t.cached(), (0, 0));
}

#[tokio::test]
async fn garbage_and_oversized_answers_are_errors() {
    let cases = [
        (
            Answer::Json("<html>oops</html>".into()),
            ErrorKind::Malformed,
        ),
        (
            Answer::Json(r#"{"tokens":[1,-2]}"#.into()),
            ErrorKind::Malformed,
        ),
        (ok(&[1; 11]), ErrorKind::TooManyTokens),
        (
            Answer::Json(format!(r#"{{"tokens":[1],"pad":"{}"}}"#, "x".repeat(5000))),
            ErrorKind::BodyTooLarge,
        ),
    ];
    for (answer, kind) in cases {
        let stub = Stub::start(answer).await;
        let t = tokenizer(TokenizerConfig {
            max_tokens: 10,
            max_body_bytes: 1000,
            ..TokenizerConfig::default()
        });
        let err = t
            .tokenize(
                LOCALHOST,
                stub.port(),
                EngineKind::Vllm,
                "m",
                &TokenizeInput::text("x"),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert_eq!(t.stats().errors_of(kind), 1);
    }
}

#[tokio::test]
async fn a_closed_port_is_connection_refused() {
    // Bound then closed: nothing listens there (another process taking it meanwhile would
    // only fail this test, never pass it wrongly).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = tokenizer(TokenizerConfig {
        timeout: Duration::from_secs(5),
        ..TokenizerConfig::default()
    });
    let err = t
        .tokenize(
            LOCALHOST,
            port,
            EngineKind::Vllm,
            "m",
            &TokenizeInput::text("x"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

#[tokio::test]
async fn an_invalid_chat_input_makes_no_call() {
    let stub = Stub::start(ok(&[1])).await;
    let t = tokenizer(TokenizerConfig::default());
    let err = t
        .tokenize(
            LOCALHOST,
            stub.port(),
            EngineKind::Vllm,
            "m",
            &TokenizeInput::chat(r#"[], "x": 1"#, None),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(stub.calls(), 0);
}

#[tokio::test]
async fn the_cache_keeps_its_entry_budget() {
    let stub = Stub::start(ok(&[1, 2])).await;
    let t = tokenizer(TokenizerConfig {
        cache_entries: 1,
        ..TokenizerConfig::default()
    });
    for prompt in ["a", "b", "a"] {
        t.tokenize(
            LOCALHOST,
            stub.port(),
            EngineKind::Vllm,
            "m",
            &TokenizeInput::text(prompt),
        )
        .await
        .unwrap();
    }
    assert_eq!(stub.calls(), 3);
    assert_eq!(t.cached(), (1, 2));
    assert_eq!(t.stats().evictions.load(Relaxed), 2);
}

#[test]
fn a_config_that_cannot_work_is_refused() {
    let bad = |c: TokenizerConfig| EngineTokenizer::new(c).err().unwrap();
    let d = TokenizerConfig::default;
    assert_eq!(
        bad(TokenizerConfig {
            timeout: Duration::ZERO,
            ..d()
        }),
        InvalidTokenizerConfig::ZeroTimeout
    );
    assert_eq!(
        bad(TokenizerConfig {
            max_tokens: 0,
            ..d()
        }),
        InvalidTokenizerConfig::ZeroMaxTokens
    );
    assert_eq!(
        bad(TokenizerConfig {
            max_body_bytes: 3,
            ..d()
        }),
        InvalidTokenizerConfig::TinyBody(3)
    );
}

#[tokio::test]
async fn a_call_whose_task_ends_without_an_answer_is_abandoned_not_joined_for_good() {
    let t = tokenizer(TokenizerConfig::default());
    let never: SharedCall = futures_util::future::pending().boxed().shared();
    assert!(t.inner.cache.lead_or_join(42, || never.clone()).is_ok());
    assert!(matches!(t.inner.cache.lookup(42), Some(Found::Join(_))));
    // The task unwinds (a panic) with its slot armed: the key is free for the next call.
    drop(CallSlot {
        inner: Arc::clone(&t.inner),
        key: 42,
        armed: true,
    });
    assert!(t.inner.cache.lookup(42).is_none());
    // A completed call's slot, disarmed, leaves its answer cached.
    assert!(t.inner.cache.lead_or_join(43, || never.clone()).is_ok());
    t.inner.cache.complete(43, &Ok(Tokens::from(vec![1, 2])));
    drop(CallSlot {
        inner: Arc::clone(&t.inner),
        key: 43,
        armed: false,
    });
    assert!(matches!(t.inner.cache.lookup(43), Some(Found::Hit(_))));
}
