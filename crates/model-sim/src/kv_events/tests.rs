//! The publisher over real ZMQ sockets: a SUB decodes what requests, evictions and resets
//! publish; a DEALER replays the buffer; the layout is checked field by field.

use std::time::Duration;

use bytes::Bytes;
use rmpv::Value as Mp;
use serde_json::{Value, json};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::*;
use crate::engine::{Engine, EngineConfig};
use crate::tests::{fast, post, serve};

/// Long enough for a slow CI machine; only ever reached when the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// A decoded event (the fields the sim varies; the constant ones are checked in [`decode`]).
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        token_ids: Vec<u64>,
        block_size: u64,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn uints(v: &Mp) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an unsigned integer"))
        .collect()
}

/// Decodes a payload, asserting vLLM's layout: `[ts: float64, [events], 0]`, each event a map
/// whose keys are the tag then the fields, in declaration order.
fn decode(payload: &[u8]) -> Vec<Ev> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let batch = batch.as_array().expect("KVEventBatch is array-like");
    assert_eq!(batch.len(), 3, "{batch:?}");
    assert!(
        matches!(batch[0], Mp::F64(ts) if ts > 1.7e9),
        "{:?}",
        batch[0]
    );
    assert_eq!(batch[2].as_u64(), Some(0), "data_parallel_rank");
    let events = batch[1].as_array().expect("events");
    events
        .iter()
        .map(|e| {
            let map = e.as_map().expect("an event is a map");
            let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str().expect("key")).collect();
            let get = |k: &str| {
                &map.iter()
                    .find(|(key, _)| key.as_str() == Some(k))
                    .unwrap()
                    .1
            };
            match get("type").as_str().expect("tag") {
                "BlockStored" => {
                    assert_eq!(
                        keys,
                        [
                            "type",
                            "block_hashes",
                            "parent_block_hash",
                            "token_ids",
                            "block_size",
                            "lora_id",
                            "medium",
                            "lora_name",
                            "group_idx",
                            "kv_cache_spec_kind"
                        ]
                    );
                    assert!(get("lora_id").is_nil() && get("lora_name").is_nil());
                    assert_eq!(get("medium").as_str(), Some("GPU"));
                    assert_eq!(get("group_idx").as_u64(), Some(0));
                    assert_eq!(get("kv_cache_spec_kind").as_str(), Some("full_attention"));
                    let parent = get("parent_block_hash");
                    Ev::Stored {
                        hashes: uints(get("block_hashes")),
                        parent: (!parent.is_nil()).then(|| parent.as_u64().expect("uint")),
                        token_ids: uints(get("token_ids")),
                        block_size: get("block_size").as_u64().expect("uint"),
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(keys, ["type", "block_hashes", "medium", "group_idx"]);
                    assert_eq!(get("medium").as_str(), Some("GPU"));
                    Ev::Removed(uints(get("block_hashes")))
                }
                "AllBlocksCleared" => {
                    assert_eq!(keys, ["type"]);
                    Ev::Cleared
                }
                other => panic!("unknown event {other}"),
            }
        })
        .collect()
}

/// `tcp://0.0.0.0:P` (a wildcard bind) as a client reaches it.
fn local(endpoint: &str) -> String {
    endpoint.replace("0.0.0.0", "127.0.0.1")
}

fn be_i64(frame: &Bytes) -> i64 {
    i64::from_be_bytes(frame.as_ref().try_into().expect("8 bytes"))
}

/// A sim publishing on wildcard port 0 with topic `kv`.
async fn sim(config: EngineConfig, replay: bool) -> (String, std::sync::Arc<Engine>) {
    let config = EngineConfig {
        kv_events: KvEventsConfig {
            enable_kv_cache_events: true,
            endpoint: "tcp://*:0".into(),
            replay_endpoint: replay.then(|| "tcp://*:0".into()),
            buffer_steps: 2,
            topic: "kv".into(),
            ..KvEventsConfig::default()
        },
        ..config
    };
    serve("sim-0", Engine::start(config).await.unwrap()).await
}

/// A subscriber, and the seq its stream is to be read from.
struct Sub {
    socket: zeromq::SubSocket,
    /// Batches with a lower seq were readiness probes.
    from: i64,
    /// The last seq read.
    last: Option<i64>,
}

impl Sub {
    /// Subscribes and polls until the subscription is live: each probe is a reset (one
    /// `AllBlocksCleared` batch); the first one received proves it.
    async fn ready(base: &str, engine: &Engine) -> Sub {
        let mut socket = zeromq::SubSocket::new();
        let endpoint = local(engine.kv_events().unwrap().endpoint());
        socket.connect(&endpoint).await.unwrap();
        socket.subscribe("kv").await.unwrap();
        let client = reqwest::Client::new();
        let started = std::time::Instant::now();
        let mut probes = 0;
        loop {
            assert!(
                started.elapsed() < DEADLINE,
                "the subscription never went live"
            );
            let r = client
                .post(format!("{base}/reset_prefix_cache"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            probes += 1;
            if tokio::time::timeout(Duration::from_millis(100), socket.recv())
                .await
                .is_ok()
            {
                return Sub {
                    socket,
                    from: probes,
                    last: None,
                };
            }
        }
    }

    /// The next batch at or after `from`: `(seq, events)`; checks the topic and that seqs
    /// follow each other.
    async fn next(&mut self) -> (i64, Vec<Ev>) {
        loop {
            let m = tokio::time::timeout(DEADLINE, self.socket.recv())
                .await
                .expect("a batch")
                .unwrap()
                .into_vec();
            assert_eq!(m.len(), 3, "[topic, seq, payload]");
            assert_eq!(m[0].as_ref(), b"kv");
            let seq = be_i64(&m[1]);
            if seq < self.from {
                continue;
            }
            if let Some(last) = self.last {
                assert_eq!(seq, last + 1, "no batch lost or reordered");
            }
            self.last = Some(seq);
            return (seq, decode(&m[2]));
        }
    }
}

async fn tokenize(base: &str, body: Value) -> Vec<u64> {
    let r: Value = post(&format!("{base}/tokenize"), &body)
        .await
        .json()
        .await
        .unwrap();
    let tokens: Vec<u64> = serde_json::from_value(r["tokens"].clone()).unwrap();
    assert_eq!(r["count"], tokens.len());
    tokens
}

/// `(prompt_tokens, cached_tokens, answer)` of a chat completion of `max_tokens` tokens.
async fn chat_n(base: &str, messages: &Value, max_tokens: u32) -> (u64, u64, String) {
    let body = json!({"model": "m", "messages": messages, "max_tokens": max_tokens});
    let r: Value = post(&format!("{base}/v1/chat/completions"), &body)
        .await
        .json()
        .await
        .unwrap();
    let usage = &r["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

/// `(prompt_tokens, cached_tokens)` of a one-token chat completion.
async fn chat(base: &str, messages: &Value) -> (u64, u64) {
    let (prompt, cached, _) = chat_n(base, messages, 1).await;
    (prompt, cached)
}

/// The number of leading equal blocks of two token sequences.
fn shared_blocks(a: &[u64], b: &[u64], bt: usize) -> usize {
    a.chunks_exact(bt)
        .zip(b.chunks_exact(bt))
        .take_while(|(x, y)| x == y)
        .count()
}

/// A conversation turn as the cache holds it: the tokens of its prompt then of its answer, and
/// the hashes of their full blocks.
struct Turn {
    tokens: Vec<u64>,
    hashes: Vec<u64>,
}

#[tokio::test]
async fn requests_answers_evictions_and_resets_are_published_in_vllm_layout() {
    let bt = 4;
    let (base, engine) = sim(
        EngineConfig {
            block_tokens: bt,
            kv_blocks: 24,
            ..fast()
        },
        false,
    )
    .await;
    let mut sub = Sub::ready(&base, &engine).await;
    let mut stored = 0;

    // A first conversation: its full blocks, no parent, the tokens /tokenize gives; then the
    // blocks its answer fills, chained after them.
    let first = json!([{"role": "user", "content": "alpha beta gamma"}]);
    let t1 = tokenize(&base, json!({"model": "m", "messages": first, "add_generation_prompt": true, "add_special_tokens": false})).await;
    let (prompt, cached, answer) = chat_n(&base, &first, 6).await;
    assert_eq!((prompt, cached), (t1.len() as u64, 0));
    let n1 = t1.len() / bt;
    let (_, events) = sub.next().await;
    let [
        Ev::Stored {
            hashes: h1,
            parent: None,
            token_ids,
            block_size,
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!((h1.len(), *block_size), (n1, bt as u64));
    assert_eq!(token_ids, &t1[..n1 * bt]);
    let continuation = format!("<|im_start|>assistant\n{answer}<|im_end|>");
    let out = tokenize(&base, json!({"model": "m", "prompt": continuation})).await;
    let all: Vec<u64> = t1.iter().chain(&out).copied().collect();
    let full = all.len() / bt;
    assert!(full > n1, "six words fill a block");
    let (_, events) = sub.next().await;
    let [
        Ev::Stored {
            hashes: ho,
            parent: Some(parent),
            token_ids,
            ..
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!((*parent, ho.len()), (h1[n1 - 1], full - n1));
    assert_eq!(token_ids, &all[n1 * bt..full * bt]);
    let turn1 = Turn {
        tokens: all,
        hashes: h1.iter().chain(ho).copied().collect(),
    };
    stored += turn1.hashes.len();

    // Its continuation re-sends the answer: it hits the answer's blocks too, and stores only
    // what follows, chained to the last shared block.
    let second = json!([
        {"role": "user", "content": "alpha beta gamma"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "epsilon"}
    ]);
    let t2 = tokenize(&base, json!({"model": "m", "messages": second})).await;
    let shared = shared_blocks(&turn1.tokens, &t2, bt);
    assert!(shared > n1, "the answer's blocks are hit");
    let (prompt, cached) = chat(&base, &second).await;
    assert_eq!((prompt, cached), (t2.len() as u64, (shared * bt) as u64));
    let n2 = t2.len() / bt;
    let (_, events) = sub.next().await;
    let [
        Ev::Stored {
            hashes: h2,
            parent: Some(parent),
            token_ids,
            ..
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!(*parent, turn1.hashes[shared - 1]);
    assert_eq!(h2.len(), n2 - shared);
    assert_eq!(token_ids, &t2[shared * bt..n2 * bt]);
    stored += h2.len();

    // An unrelated prompt that needs more blocks than are free evicts the block freed first.
    let long = "one two three four five six seven eight nine ten ".repeat(7);
    let n3 = tokenize(&base, json!({"model": "m", "prompt": long}))
        .await
        .len()
        / bt;
    let body = json!({"model": "m", "prompt": long, "max_tokens": 1});
    assert_eq!(
        post(&format!("{base}/v1/completions"), &body)
            .await
            .status(),
        200
    );
    let mut batch = sub.next().await.1;
    if let [
        Ev::Stored {
            parent: Some(p),
            hashes,
            ..
        },
    ] = batch.as_slice()
        && h2.last() == Some(p)
    {
        // The blocks the second answer filled.
        stored += hashes.len();
        batch = sub.next().await.1;
    }
    assert!(n3 <= 24 && stored + n3 > 24, "stored {stored}, n3 {n3}");
    let (removed, rest) = batch.split_at(stored + n3 - 24);
    let ours: Vec<u64> = turn1.hashes.iter().chain(h2).copied().collect();
    for e in removed {
        let Ev::Removed(h) = e else {
            panic!("{batch:?}")
        };
        assert!(h.len() == 1 && ours.contains(&h[0]), "{batch:?}");
    }
    let oldest = turn1.hashes[if shared < turn1.hashes.len() {
        shared
    } else {
        0
    }];
    assert_eq!(removed[0], Ev::Removed(vec![oldest]));
    assert!(matches!(rest, [Ev::Stored { hashes, parent: None, .. }] if hashes.len() == n3));

    let r = reqwest::Client::new()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // After what the long answer may have stored, the reset.
    loop {
        let (_, events) = sub.next().await;
        if events == [Ev::Cleared] {
            break;
        }
        assert!(
            events.iter().all(|e| !matches!(e, Ev::Cleared)),
            "{events:?}"
        );
    }
    // Nothing is cached any more.
    assert_eq!(chat(&base, &first).await.1, 0);
}

#[tokio::test]
async fn replay_sends_the_buffer_from_a_sequence_then_the_end_marker() {
    let (base, engine) = sim(fast(), true).await;
    // Four batches: seq 0-2 stored, 3 cleared; the buffer keeps the last two.
    for word in ["red", "green", "blue"] {
        let body = json!({"model": "m", "prompt": format!("{word} ").repeat(40), "max_tokens": 1});
        assert_eq!(
            post(&format!("{base}/v1/completions"), &body)
                .await
                .status(),
            200
        );
    }
    let r = reqwest::Client::new()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let mut dealer = zeromq::DealerSocket::new();
    dealer
        .connect(&local(
            engine.kv_events().unwrap().replay_endpoint().unwrap(),
        ))
        .await
        .unwrap();
    // The publisher takes batches off its queue in the background: ask until all four are in.
    let started = std::time::Instant::now();
    let replies = loop {
        assert!(
            started.elapsed() < DEADLINE,
            "the buffer never held seq 2 and 3"
        );
        let replies = replay(&mut dealer, 0).await;
        if replies.iter().map(|(s, _)| *s).collect::<Vec<_>>() == [2, 3] {
            break replies;
        }
    };
    assert!(matches!(
        decode(&replies[0].1).as_slice(),
        [Ev::Stored { .. }]
    ));
    assert_eq!(decode(&replies[1].1), [Ev::Cleared]);
    let from_3 = replay(&mut dealer, 3).await;
    assert_eq!(from_3.len(), 1);
    assert_eq!(from_3[0], replies[1]);
    assert!(replay(&mut dealer, 4).await.is_empty());
}

/// One replay request from `start`: the `(seq, payload)` replies before the end marker.
async fn replay(dealer: &mut zeromq::DealerSocket, start: i64) -> Vec<(i64, Bytes)> {
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .unwrap();
    dealer.send(request).await.unwrap();
    let mut replies = Vec::new();
    loop {
        let m = tokio::time::timeout(DEADLINE, dealer.recv())
            .await
            .expect("a reply")
            .unwrap()
            .into_vec();
        // [delimiter, topic, seq, payload]; the end: [delimiter, "", -1, ""].
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(m[0].is_empty());
        let seq = be_i64(&m[2]);
        if seq == -1 {
            assert!(m[1].is_empty() && m[3].is_empty());
            return replies;
        }
        assert_eq!(m[1].as_ref(), b"kv");
        replies.push((seq, m[3].clone()));
    }
}

#[tokio::test]
async fn without_prefix_caching_nothing_is_reused_or_stored() {
    let (base, engine) = sim(
        EngineConfig {
            prefix_caching: false,
            ..fast()
        },
        false,
    )
    .await;
    let mut sub = Sub::ready(&base, &engine).await;
    let messages = json!([{"role": "user", "content": "hello ".repeat(100)}]);
    for _ in 0..2 {
        assert_eq!(chat(&base, &messages).await.1, 0);
    }
    let r = reqwest::Client::new()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The reset is the very next batch: the requests published none.
    assert_eq!(sub.next().await, (sub.from, vec![Ev::Cleared]));
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("enable_prefix_caching=\"False\""),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_connecting_publisher_serves_at_once_and_publishes_once_a_subscriber_binds() {
    // An endpoint without `*`: connected, as vLLM decides. Nothing listens there yet (the port
    // is held by a socket that never listens: connections are refused).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let endpoint = format!("tcp://{}", held.local_addr().unwrap());
    let config = EngineConfig {
        kv_events: KvEventsConfig {
            enable_kv_cache_events: true,
            endpoint: endpoint.clone(),
            topic: "kv".into(),
            ..KvEventsConfig::default()
        },
        ..fast()
    };
    let engine = tokio::time::timeout(Duration::from_secs(5), Engine::start(config))
        .await
        .expect("the engine starts with no listener at its endpoint")
        .unwrap();
    assert_eq!(engine.kv_events().unwrap().endpoint(), endpoint);
    let (base, engine) = serve("sim-0", engine).await;
    // It serves: a first request is answered (its batch, seq 0, reaches no one).
    let messages = json!([{"role": "user", "content": "hello ".repeat(40)}]);
    let (prompt, cached) = chat(&base, &messages).await;
    assert!(prompt > 0 && cached == 0);

    // A SUB binds there: the publisher connects and what it publishes next arrives.
    drop(held);
    let mut sub = zeromq::SubSocket::new();
    sub.bind(&endpoint).await.unwrap();
    sub.subscribe("kv").await.unwrap();
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let m = loop {
        assert!(
            started.elapsed() < DEADLINE,
            "nothing published after the SUB bound"
        );
        let r = client
            .post(format!("{base}/reset_prefix_cache"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            break m.unwrap().into_vec();
        }
    };
    assert_eq!(m.len(), 3);
    assert_eq!(m[0].as_ref(), b"kv");
    assert!(be_i64(&m[1]) >= 1, "the first request's batch was numbered");
    assert_eq!(decode(&m[2]), [Ev::Cleared]);
    assert_eq!(engine.kv_events().unwrap().dropped(), 0);
}

#[test]
fn the_config_is_vllms() {
    let c = KvEventsConfig::from_json("{}").unwrap();
    assert_eq!(c, KvEventsConfig::default());
    assert_eq!(
        (c.endpoint.as_str(), c.buffer_steps, c.topic.as_str()),
        ("tcp://*:5557", 10_000, "")
    );
    assert!(!c.publishes());
    // The publisher defaults to zmq once events are on; "null" turns it off.
    assert!(
        KvEventsConfig::from_json(r#"{"enable_kv_cache_events": true}"#)
            .unwrap()
            .publishes()
    );
    let null = r#"{"enable_kv_cache_events": true, "publisher": "null"}"#;
    assert!(!KvEventsConfig::from_json(null).unwrap().publishes());
    let full = r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000",
        "replay_endpoint": "tcp://*:6001", "buffer_steps": 5, "hwm": 10, "max_queue_size": 7,
        "topic": "kv-events"}"#;
    let c = KvEventsConfig::from_json(full).unwrap();
    assert_eq!(
        (c.replay_endpoint.as_deref(), c.max_queue_size),
        (Some("tcp://*:6001"), 7)
    );
    // Unknown keys and publishers are refused.
    let e = KvEventsConfig::from_json(r#"{"enable_kv_cache_event": true}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    assert!(KvEventsConfig::from_json(r#"{"publisher": "kafka"}"#).is_err());
}

#[test]
fn endpoints_bind_or_connect_as_vllm_decides() {
    assert!(binds("tcp://*:5557") && binds("tcp://[::]:5557") && binds("ipc:///tmp/kv"));
    assert!(!binds("tcp://router:5557") && !binds("tcp://127.0.0.1:5557"));
    assert_eq!(zmq_endpoint("tcp://*:5557"), "tcp://0.0.0.0:5557");
}
