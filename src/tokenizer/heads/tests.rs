use super::*;
use prometheus::Registry;

fn metrics() -> EngineTruthMetrics {
    EngineTruthMetrics::register(
        &Registry::new(),
        &["engine", "estimate"],
        &["engine", "request"],
        &["timeout"],
    )
}

fn section() -> TokenizerSection {
    serde_yaml_ng::from_str("source: engine").unwrap()
}

/// The next fill waiting in the queue (none run here).
fn next_queued(heads_map: &HeadTokens) -> Option<Fill> {
    heads_map.receiver.lock().as_mut()?.try_recv().ok()
}

/// A tenant's question (its system prompt, then "q1") looked up as a request for `pod` would.
fn tenant_question(heads_map: &HeadTokens, pod: SocketAddr) -> Option<HeadFound> {
    let prompt = chatml(&[("system", "tenant prompt"), ("user", "q1")]);
    let body = br#"{"messages":[{"role":"system","content":"tenant prompt"},{"role":"user","content":"q1"}]}"#;
    heads_map.find(
        "m",
        Some(Api::ChatCompletions),
        &prompt,
        Some(body),
        Some(pod),
    )
}

/// The xxh3 digest of the model and `bytes`, hashed from scratch.
fn digest_from_scratch(model: &str, bytes: &[u8]) -> u64 {
    let mut h = Xxh3::with_seed(xxh3_64(model.as_bytes()));
    h.update(bytes);
    h.digest()
}

/// A prompt's message heads, each hashed from scratch (the reference for [`hash_heads`]).
fn heads(model: &str, api: Api, prompt: &[u8]) -> Vec<Head> {
    let mut heads = message_heads(api, prompt);
    for h in &mut heads {
        h.digest = digest_from_scratch(model, &prompt[..h.bytes]);
    }
    heads
}

impl HeadTokens {
    /// A prompt's cut heads, each hashed from scratch (the reference for [`hash_heads`]).
    fn cuts(&self, model: &str, api: Api, prompt: &[u8], heads: &[Head]) -> Vec<Head> {
        let mut cuts = self.cut_heads(api, prompt, heads);
        for c in &mut cuts {
            c.digest = digest_from_scratch(model, &prompt[..c.bytes]);
        }
        cuts
    }
}

fn chatml(messages: &[(&str, &str)]) -> String {
    messages
        .iter()
        .map(|(role, content)| format!("<|im_start|>{role}\n{content}<|im_end|>\n"))
        .collect()
}

#[test]
fn a_chat_prompt_has_one_head_per_message_and_shares_them_with_its_continuation() {
    let first = chatml(&[("system", "be brief"), ("user", "hi")]);
    let next = chatml(&[
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "more"),
    ]);
    let a = heads("m", Api::ChatCompletions, first.as_bytes());
    let b = heads("m", Api::ChatCompletions, next.as_bytes());
    assert_eq!(a.iter().map(|h| h.messages).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(a[1].bytes, first.len());
    assert_eq!(a[..], b[..2], "the continuation starts with the same heads");
    assert_ne!(a[1].digest, b[3].digest);
    // Another model's tokenizer: other digests.
    assert_ne!(
        heads("n", Api::ChatCompletions, first.as_bytes())[0].digest,
        a[0].digest
    );
    // A completion prompt is one head; a rendering that does not end a message has none.
    assert_eq!(heads("m", Api::Completions, b"text").len(), 1);
    assert!(heads("m", Api::ChatCompletions, b"no marker").is_empty());
    assert!(heads("m", Api::Responses, first.as_bytes()).is_empty());
}

#[test]
fn a_miss_queues_its_heads_once_and_a_known_head_is_found() {
    let heads_map = HeadTokens::new(section(), metrics());
    let find = || tenant_question(&heads_map, "127.0.0.1:8000".parse().unwrap());
    assert!(find().is_none());
    let queued = next_queued(&heads_map).expect("queued");
    assert_eq!(
        queued.heads.iter().map(|h| h.messages).collect::<Vec<_>>(),
        [1],
        "the head before the last message; the whole prompt is this request's own"
    );
    assert!(find().is_none());
    let repeat = next_queued(&heads_map).expect("a repeat queues its whole prompt");
    assert_eq!(
        repeat.heads.iter().map(|h| h.messages).collect::<Vec<_>>(),
        [2],
        "queued once: the pending head is not queued again"
    );
    assert!(find().is_none());
    assert!(next_queued(&heads_map).is_none(), "both pending");
    // The tenant's head (its system message) tokenized: another question of that tenant finds it.
    let head = queued.heads[0];
    heads_map.insert(
        head.digest,
        HeadFound {
            tokens: Tokens::from(vec![1, 2, 3]),
            prompt_bytes: head.bytes,
            head_tokens: 0,
        },
    );
    let other = chatml(&[("system", "tenant prompt"), ("user", "q2")]);
    let found = heads_map
        .lookup("m", Api::ChatCompletions, &other)
        .expect("the head is known");
    assert_eq!(found.tokens.as_slice(), [1, 2, 3]);
    assert_eq!(
        found.prompt_bytes,
        chatml(&[("system", "tenant prompt")]).len()
    );
    let hits = heads_map
        .metrics
        .engine_tokens
        .with_label_values(&["miss"])
        .get();
    assert_eq!(hits, 3);
}

/// One call per turn: a conversation's turn queues its whole prompt (the next turn's head,
/// which the engine holds whole), not the head before its last message (which ends with a
/// reply); a tenant's question queues the head before its last message, and nothing once that
/// head is known; a head seen before is queued either way.
#[test]
fn a_request_queues_only_the_head_its_successor_shares() {
    let heads_map = HeadTokens::new(section(), metrics());
    let pod: SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let turn = |messages: &[(&str, &str)]| {
        let body = serde_json::json!({
            "messages": messages
                .iter()
                .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
                .collect::<Vec<_>>(),
        })
        .to_string();
        heads_map.find(
            "m",
            Some(Api::ChatCompletions),
            &chatml(messages),
            Some(body.as_bytes()),
            Some(pod),
        );
        next_queued(&heads_map).map(|fill| {
            heads_map.done(&fill);
            fill.heads.iter().map(|h| h.messages).collect::<Vec<_>>()
        })
    };
    let first = [("system", "s"), ("user", "u1")];
    assert_eq!(turn(&first), Some(vec![1]), "the tenant's head");
    let second = [
        ("system", "s"),
        ("user", "u1"),
        ("assistant", "a1"),
        ("user", "u2"),
    ];
    assert_eq!(turn(&second), Some(vec![4]), "a turn: its whole prompt");
    let other = [
        ("system", "s"),
        ("user", "u1"),
        ("assistant", "a1"),
        ("user", "v2"),
    ];
    assert_eq!(
        turn(&other),
        Some(vec![3, 4]),
        "another turn after the same reply: the head seen before too"
    );
    // The system head tokenized: a new question of the tenant finds it and queues nothing.
    let head = heads("m", Api::ChatCompletions, chatml(&first).as_bytes())[0];
    heads_map.insert(
        head.digest,
        HeadFound {
            tokens: Tokens::from(vec![1, 2]),
            prompt_bytes: head.bytes,
            head_tokens: 0,
        },
    );
    assert_eq!(turn(&[("system", "s"), ("user", "u9")]), None);
    // A one-message prompt has no shared head: nothing, until it repeats.
    assert_eq!(turn(&[("user", "alone")]), None);
    assert_eq!(turn(&[("user", "alone")]), Some(vec![1]));
}

#[test]
fn a_reply_is_found_at_a_message_start_only() {
    let with = chatml(&[("user", "u"), ("assistant", "a"), ("user", "v")]);
    let quoted = chatml(&[("user", "say <|im_start|>assistant\n please")]);
    for (prompt, reply) in [(with, true), (quoted, false)] {
        let h = heads("m", Api::ChatCompletions, prompt.as_bytes());
        assert_eq!(holds_reply(prompt.as_bytes(), &h), reply, "{prompt}");
    }
}

#[test]
fn the_head_map_is_bounded() {
    let mut s = section();
    s.cache_entries = SHARDS; // one per shard
    let heads_map = HeadTokens::new(s, metrics());
    for d in 0..1000u64 {
        heads_map.insert(
            d,
            HeadFound {
                tokens: Tokens::from(vec![1]),
                prompt_bytes: 1,
                head_tokens: 0,
            },
        );
    }
    assert!(heads_map.len() <= SHARDS);
}

#[test]
fn the_head_map_holds_at_most_its_tokens() {
    // Long prompts once kept every head's tokens up to `cacheEntries` (65,536 of 55,000 tokens
    // each for 220 KB prompts: 14 GB).
    let mut s = section();
    s.cache_tokens = SHARDS * 100; // 100 tokens a shard
    let heads_map = HeadTokens::new(s, metrics());
    let found = |n: usize| HeadFound {
        tokens: Tokens::from(vec![7; n]),
        prompt_bytes: n,
        head_tokens: 0,
    };
    for d in 0..1000u64 {
        heads_map.insert(d, found(30));
    }
    let held: usize = heads_map.shards.iter().map(|s| s.read().tokens).sum();
    let counted: usize = heads_map
        .shards
        .iter()
        .flat_map(|s| {
            s.read()
                .heads
                .values()
                .map(|f| f.tokens.len())
                .collect::<Vec<_>>()
        })
        .sum();
    assert_eq!(held, counted, "the shards count what they hold");
    assert!(held <= SHARDS * 100 && heads_map.len() == SHARDS * 3);
    // A head larger than a shard's share is not kept; one replaced keeps the count exact.
    heads_map.insert(5000, found(101));
    assert!(!heads_map.shard(5000).read().heads.contains_key(&5000));
    let kept = *heads_map.shard(0).read().heads.keys().next().unwrap();
    heads_map.insert(kept, found(10));
    let held: usize = heads_map.shards.iter().map(|s| s.read().tokens).sum();
    assert_eq!(held, SHARDS * 3 * 30 - 20);
}

#[test]
fn the_queue_holds_at_most_its_bytes_of_bodies() {
    let heads_map = HeadTokens::new(section(), metrics());
    let pod: SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let body = vec![b' '; QUEUED_BYTES / 2 + 1];
    let prompt = |i: usize| chatml(&[("system", &format!("tenant {i}")), ("user", "q")]);
    let find = |i: usize| {
        heads_map.find(
            "m",
            Some(Api::ChatCompletions),
            &prompt(i),
            Some(&body),
            Some(pod),
        );
        heads_map
            .metrics
            .engine_tokens
            .with_label_values(&["dropped"])
            .get()
    };
    assert_eq!(find(0), 0, "one body fits");
    assert_eq!(find(1), 1, "two do not: dropped, counted");
    // The first fill done, its bytes are free again.
    heads_map.done(&next_queued(&heads_map).expect("queued"));
    assert_eq!(find(2), 1);
}

#[test]
fn messages_are_joined_as_sent() {
    let body =
        r#"{"messages":[{"role":"user","content":"a", "z":1},{"content":"b","role":"user"}]}"#;
    let parsed: RequestPrompt<'_> = serde_json::from_str(body).unwrap();
    let all: Vec<&str> = parsed.messages.unwrap().iter().map(|m| m.get()).collect();
    assert_eq!(join(&all[..1]), r#"[{"role":"user","content":"a", "z":1}]"#);
    assert_eq!(
        join(&all),
        r#"[{"role":"user","content":"a", "z":1},{"content":"b","role":"user"}]"#
    );
}

/// `source: file`: a miss queues the heads, the worker tokenizes them in process (no pod is
/// listening at the pod address), and the next request finds the model's ids for its head.
#[cfg(feature = "tokenizer-file")]
#[tokio::test]
async fn the_file_source_tokenizes_heads_in_process() {
    let dir = tempfile::tempdir().unwrap();
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let path = dir.path().join("tokenizer.json");
    let mut s: TokenizerSection = serde_yaml_ng::from_str(&format!(
        "source: file\npath: {:?}",
        path.display().to_string()
    ))
    .unwrap();
    assert_eq!(s.load(), Ok(None));
    let heads_map = Arc::new(HeadTokens::new(s, metrics()));
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(heads_map.clone().run(shutdown.clone()));
    let prompt = chatml(&[("system", "tenant prompt"), ("user", "q1")]);
    let head = chatml(&[("system", "tenant prompt")]);
    // Port 9 (discard): nothing answers there, and nothing must be asked.
    let find = || tenant_question(&heads_map, "127.0.0.1:9".parse().unwrap());
    assert!(find().is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        if let Some(found) = heads_map.lookup("m", Api::ChatCompletions, &prompt) {
            break found;
        }
        assert!(Instant::now() < deadline, "the heads were not tokenized");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let sim = model_sim::tokenizer_json::default_tokenizer();
    assert_eq!(found.tokens.to_vec(), sim.ids(head.as_bytes()));
    assert_eq!(found.prompt_bytes, head.len());
    shutdown.cancel();
    worker.await.unwrap();
}

#[test]
fn a_fill_that_panics_frees_its_bytes_and_its_heads_queue_again() {
    let heads_map = Arc::new(HeadTokens::new(section(), metrics()));
    let find = || tenant_question(&heads_map, "127.0.0.1:8000".parse().unwrap());
    find();
    let fill = next_queued(&heads_map).expect("queued");
    assert_eq!(
        heads_map.queued_bytes.load(Ordering::Relaxed),
        fill.body.len()
    );
    // As a fill task runs it, and a bug panics in the tokenization.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let taken = Taken::new(&heads_map, fill);
        let _tokenizing = &taken.fill;
        panic!("a bug in the tokenization");
    }));
    assert!(panicked.is_err());
    assert_eq!(heads_map.queued_bytes.load(Ordering::Relaxed), 0);
    find();
    assert!(
        next_queued(&heads_map).is_some(),
        "its heads are no longer pending: the next miss queues them"
    );
}

/// `source: file` for a Messages request: its heads are tokenized as the chat request vLLM
/// serves it as (a conversation's turn, as a chat one: its whole prompt, the next turn's head),
/// so the tokens found are those of that chat request's messages (the tool call's arguments as
/// vLLM writes them, the tools in chat form).
#[cfg(feature = "tokenizer-file")]
#[tokio::test]
async fn a_messages_request_is_tokenized_as_its_chat_form() {
    let dir = tempfile::tempdir().unwrap();
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let path = dir.path().join("tokenizer.json");
    let mut s: TokenizerSection = serde_yaml_ng::from_str(&format!(
        "source: file\npath: {:?}",
        path.display().to_string()
    ))
    .unwrap();
    assert_eq!(s.load(), Ok(None));
    let Some(LoadedFile(source)) = s.file.clone() else {
        panic!("loaded")
    };
    let heads_map = Arc::new(HeadTokens::new(s, metrics()));
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(heads_map.clone().run(shutdown.clone()));
    let body = br#"{"model":"m","max_tokens":8,"system":[{"type":"text","text":"agent"}],
        "tools":[{"name":"w","input_schema":{"type":"object","properties":{"b":{},"a":{}}}}],
        "messages":[{"role":"user","content":"q"},{"role":"assistant","content":[
        {"type":"tool_use","id":"t","name":"w","input":{"b":1,"a":"x"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}"#;
    let prompt = crate::request::InferenceRequest::parse_for(
        Api::Messages,
        body,
        crate::prompt::Rendering::Engine,
    )
    .unwrap()
    .prompt
    .unwrap();
    let pod = "127.0.0.1:9".parse().unwrap();
    assert!(
        heads_map
            .find("m", Some(Api::Messages), &prompt, Some(body), Some(pod))
            .is_none()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        if let Some(found) = heads_map.lookup("m", Api::Messages, &prompt) {
            break found;
        }
        assert!(Instant::now() < deadline, "the heads were not tokenized");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(found.prompt_bytes, prompt.len(), "the whole prompt");
    // The chat request a client would send for the same conversation, tokenized directly.
    let chat = r#"[{"role":"system","content":"agent"},{"role":"user","content":"q"},
        {"role":"assistant","tool_calls":[{"id":"t","type":"function",
        "function":{"name":"w","arguments":"{\"b\": 1, \"a\": \"x\"}"}}]},
        {"role":"tool","tool_call_id":"t","content":"r"}]"#;
    let tools = r#"[{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"b":{},"a":{}}}}}]"#;
    let expected = source
        .tokenize(&TokenizeInput::chat(chat, Some(tools)))
        .unwrap();
    assert_eq!(found.tokens.to_vec(), expected.to_vec());
    shutdown.cancel();
    worker.await.unwrap();
}

/// A request's ChatML prompt and its body, for `messages`.
fn chat_request(messages: &[(&str, &str)]) -> (String, Vec<u8>) {
    let body = serde_json::json!({"messages": messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect::<Vec<_>>()});
    (chatml(messages), serde_json::to_vec(&body).unwrap())
}

/// A document of `words` words, the same for the same `seed`.
fn document(seed: usize, words: usize) -> String {
    (0..words)
        .map(|i| format!("w{}x{}", seed, i % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

fn find_chat(heads_map: &HeadTokens, messages: &[(&str, &str)]) -> Option<HeadFound> {
    let (prompt, body) = chat_request(messages);
    heads_map.find(
        "m",
        Some(Api::ChatCompletions),
        &prompt,
        Some(&body),
        Some("127.0.0.1:8000".parse().unwrap()),
    )
}

#[test]
fn a_document_inside_the_last_message_is_cut_and_asked_once_seen_twice() {
    let heads_map = HeadTokens::new(section(), metrics());
    let doc = document(1, 400);
    let ask = |question: &str| format!("{doc}\n\nQuestion: {question}");
    let first = ask("what is one?");
    let second = ask("and two?");
    // First sighting: the head before the last message only (a tenant's next question).
    assert!(find_chat(&heads_map, &[("system", "read"), ("user", &first)]).is_none());
    let fill = next_queued(&heads_map).expect("the system head");
    assert!(fill.heads.iter().all(|h| h.cut.is_none()));
    heads_map.done(&fill);
    // Second: the document's cuts were seen: the longest is asked, cut inside the message.
    assert!(find_chat(&heads_map, &[("system", "read"), ("user", &second)]).is_none());
    let fill = next_queued(&heads_map).expect("a cut head");
    let cut = *fill.heads.iter().find(|h| h.cut.is_some()).expect("a cut");
    let (prompt, _) = chat_request(&[("system", "read"), ("user", &second)]);
    let text_start = prompt.find("w1x0").unwrap();
    assert_eq!(cut.cut, Some(cut.bytes - text_start));
    assert!(cut.bytes <= text_start + doc.len(), "inside the document");
    assert!(cut.bytes + CUT_SPACING > text_start + doc.len());
    // What is asked: the messages with the last one's text cut there, left open.
    let parsed: RequestPrompt<'_> = serde_json::from_slice(&fill.body).unwrap();
    let mut joined = String::new();
    let input = fill.input(&parsed, None, &cut, &mut joined).unwrap();
    assert!(input.continue_final() && !input.generation_prompt());
    let asked: serde_json::Value = serde_json::from_str(&joined).unwrap();
    assert_eq!(asked[0]["content"], "read");
    let kept = asked[1]["content"].as_str().unwrap();
    assert_eq!(kept, &second[..cut.cut.unwrap()]);
    assert!(kept.ends_with(|c: char| c.is_ascii_alphanumeric()));
    // Its tokens found: a third question on the document is matched up to the cut.
    heads_map.insert(
        cut.digest,
        HeadFound {
            tokens: Tokens::from(vec![7; 10]),
            prompt_bytes: cut.bytes,
            head_tokens: 0,
        },
    );
    heads_map.done(&fill);
    let third = find_chat(&heads_map, &[("system", "read"), ("user", &ask("three?"))]);
    assert_eq!(third.map(|f| f.prompt_bytes), Some(cut.bytes));
    // Another document shares nothing past the system prompt.
    let other = format!("{}\n\nQuestion: what is one?", document(2, 400));
    assert!(find_chat(&heads_map, &[("system", "read"), ("user", &other)]).is_none());
}

#[test]
fn a_cut_head_is_asked_only_for_the_text_the_router_rendered() {
    let message = r#"{"role":"user","content":"alpha beta gamma"}"#;
    let check = xxh3_64(b"alpha beta");
    let cut = cut_message(message, 10, check).unwrap();
    let cut: serde_json::Value = serde_json::from_str(&cut).unwrap();
    assert_eq!(
        cut,
        serde_json::json!({"role": "user", "content": "alpha beta"})
    );
    // Other text (the body is not what was rendered), a list content, a cut inside a
    // character or past the end: nothing asked.
    assert_eq!(cut_message(message, 10, check ^ 1), None);
    let parts = r#"{"role":"user","content":[{"type":"text","text":"alpha beta gamma"}]}"#;
    assert_eq!(cut_message(parts, 10, check), None);
    let accent = r#"{"role":"user","content":"é"}"#;
    assert_eq!(cut_message(accent, 1, xxh3_64(&[0xc3])), None);
    assert_eq!(cut_message(message, 99, check), None);
}

#[test]
fn completions_are_cut_for_either_engine_and_chat_only_for_vllm() {
    let doc = document(3, 400);
    let mut sglang = section();
    sglang.engine = EngineKind::Sglang;
    for (section, chat_cuts) in [(section(), true), (sglang, false)] {
        let heads_map = HeadTokens::new(section, metrics());
        let prompt = format!("{doc} end");
        let found = heads("m", Api::Completions, prompt.as_bytes());
        let cuts = heads_map.cuts("m", Api::Completions, prompt.as_bytes(), &found);
        assert_eq!(cuts.len(), (prompt.len() - 1) / CUT_SPACING);
        assert!(
            cuts.iter()
                .all(|c| c.cut == Some(c.bytes) && c.messages == 0)
        );
        let (chat, _) = chat_request(&[("user", &doc)]);
        let found = heads("m", Api::ChatCompletions, chat.as_bytes());
        let cuts = heads_map.cuts("m", Api::ChatCompletions, chat.as_bytes(), &found);
        assert_eq!(!cuts.is_empty(), chat_cuts);
    }
}

/// An engine's `/tokenize` for completions: model-sim's tokenizer, with a BOS (7) first when
/// `add_special_tokens` (as vLLM's Llama 3 answers); every prompt asked is recorded.
async fn engine_stub() -> (SocketAddr, Arc<Mutex<Vec<(String, bool)>>>) {
    let asked: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let log = asked.clone();
    let app = axum::Router::new().route(
        "/tokenize",
        axum::routing::post(move |body: axum::Json<serde_json::Value>| {
            let log = log.clone();
            async move {
                let prompt = body["prompt"].as_str().unwrap_or_default().to_owned();
                let special = body["add_special_tokens"].as_bool().unwrap_or(true);
                let mut tokens = if special { vec![7] } else { Vec::new() };
                tokens
                    .extend(model_sim::tokenizer_json::default_tokenizer().ids(prompt.as_bytes()));
                log.lock().push((prompt, special));
                axum::Json(serde_json::json!({"tokens": tokens, "count": tokens.len()}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, asked)
}

/// A completion's head of `bytes` known, polled (10 s at most) until the background tokenized it.
async fn tokenized(heads_map: &HeadTokens, prompt: &str, bytes: usize) -> HeadFound {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match heads_map.lookup("m", Api::Completions, prompt) {
            Some(found) if found.prompt_bytes == bytes => return found,
            _ => assert!(Instant::now() < deadline, "not tokenized"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `source: engine`: once a document's cut is known, a completion on it is asked of the engine
/// from the cut on (without special tokens), and its tokens are the engine's tokens whole.
#[tokio::test]
async fn a_completion_past_a_known_cut_asks_the_engine_for_the_rest_only() {
    let (pod, asked) = engine_stub().await;
    let mut s = section();
    s.timeout_ms = 5_000;
    let heads_map = Arc::new(HeadTokens::new(s, metrics()));
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(heads_map.clone().run(shutdown.clone()));
    let doc = document(2, 400);
    let question = |n: usize| format!("{doc} and question {n}?");
    let find = |prompt: &str| {
        let body = serde_json::to_vec(&serde_json::json!({"prompt": prompt})).unwrap();
        heads_map.find("m", Some(Api::Completions), prompt, Some(&body), Some(pod))
    };
    let sim = model_sim::tokenizer_json::default_tokenizer();
    // Two questions on the document: its longest cut is asked, whole.
    find(&question(1));
    find(&question(2));
    let cuts: Vec<usize> = stable_cuts(doc.as_bytes(), 0, doc.len()).collect();
    let cut = *cuts.last().unwrap();
    let known = tokenized(&heads_map, &question(3), cut).await;
    assert_eq!(asked.lock().last(), Some(&(doc[..cut].to_owned(), true)));
    // A third question, seen twice: its whole prompt is asked from the cut on.
    let third = question(3);
    assert_eq!(find(&third).map(|f| f.prompt_bytes), Some(cut));
    find(&third);
    let found = tokenized(&heads_map, &third, third.len()).await;
    let mut whole = vec![7];
    whole.extend(sim.ids(third.as_bytes()));
    assert_eq!(found.tokens.to_vec(), whole);
    assert_eq!(&found.tokens[..known.tokens.len()], &known.tokens[..]);
    let asked = asked.lock().clone();
    assert!(
        asked.contains(&(third[cut..].to_owned(), false)),
        "the rest asked without special tokens: {asked:?}"
    );
    // The first join is checked against the whole prompt, asked too; it matched.
    assert!(asked.contains(&(third.clone(), true)));
    assert!(!heads_map.joins_off.load(Ordering::Relaxed));
    shutdown.cancel();
    worker.await.unwrap();
}

mod one_pass {
    use super::*;
    use proptest::prelude::*;

    /// Text of words and punctuation, long enough to hold stable cuts.
    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-zA-Z0-9]{0,9}[ ,.\n]", 0..400).prop_map(|w| w.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Heads and cuts hashed in one pass over the prompt have the digests that hashing
        /// each from scratch gives.
        #[test]
        fn heads_and_cuts_hashed_in_one_pass_are_those_hashed_from_scratch(
            model in "[a-z]{0,8}",
            contents in prop::collection::vec(text(), 1..4),
            completion in any::<bool>(),
        ) {
            let heads_map = HeadTokens::new(section(), metrics());
            let (api, prompt) = if completion {
                (Api::Completions, contents.concat())
            } else {
                let roles = ["system", "user", "assistant"];
                let messages: Vec<(&str, &str)> = contents
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (roles[i % 3], c.as_str()))
                    .collect();
                (Api::ChatCompletions, chatml(&messages))
            };
            let prompt = prompt.as_bytes();
            let from_scratch = heads(&model, api, prompt);
            let cuts_from_scratch = heads_map.cuts(&model, api, prompt, &from_scratch);
            let (one_pass, cuts) = heads_map.heads_and_cuts(&model, api, prompt);
            prop_assert_eq!(one_pass, from_scratch);
            prop_assert_eq!(cuts, cuts_from_scratch);
        }

        /// Cuts sighted a shard at a time give what sighting them one by one gives: the same
        /// longest cut seen before, request after request, with shards small enough to forget.
        #[test]
        fn cuts_sighted_a_shard_at_a_time_are_those_sighted_one_by_one(
            requests in prop::collection::vec(
                (prop::collection::vec(0u64..96, 0..24), 0usize..6),
                1..24,
            ),
        ) {
            let small: TokenizerSection =
                serde_yaml_ng::from_str("{source: engine, cacheEntries: 48}").unwrap();
            let batched = HeadTokens::new(small.clone(), metrics());
            let one_by_one = HeadTokens::new(small, metrics());
            for (digests, covered) in requests {
                let cuts: Vec<Head> = digests
                    .iter()
                    .enumerate()
                    .map(|(i, &digest)| Head {
                        messages: 1,
                        digest,
                        bytes: (i + 1) * 10,
                        cut: Some((i + 1) * 10),
                    })
                    .collect();
                let covered = covered * 10;
                let mut wanted = None;
                for cut in cuts.iter().filter(|c| c.bytes > covered) {
                    if !one_by_one.first_sighting(cut.digest) {
                        wanted = Some(*cut);
                    }
                }
                prop_assert_eq!(batched.wanted_cut(&cuts, covered), wanted);
            }
        }
    }
}
