//! KV-cache events on vLLM's wire: `--kv-events-config '<JSON>'` and a ZMQ publisher.
//!
//! Followed: vLLM `vllm/distributed/kv_events.py` (`ZmqEventPublisher`, the version whose
//! replay reply carries the topic and whose `BlockStored` has `event_version`, `locality`,
//! `ownership`; the earlier upstream revision 0181ea3173e5 differs only in the replay frames) and
//! `vllm/config/kv_events.py` (`KVEventsConfig`).
//!
//! - PUB socket at `endpoint`, bound when it contains `*` or `::` or is `ipc://` (else
//!   connected), as vLLM decides; `tcp://*:P` binds `0.0.0.0:P`. A connecting socket connects in
//!   the background, retrying until something listens, as libzmq does: the engine serves
//!   meanwhile, and its batches are numbered and kept for replay but reach no one. Each batch is one multipart
//!   message `[topic, seq, payload]`: `seq` 8 bytes big-endian, from 0 per process.
//! - `payload` is msgpack of `KVEventBatch`, an array `[ts: float64, events, data_parallel_rank:
//!   0]`; each event a map led by its tag `"type"` (msgspec `tag=True` on a map struct) then its
//!   fields in declaration order, `omit_defaults` leaving out optional fields at their default:
//!   `{type: "BlockStored", block_hashes: [uint], parent_block_hash: uint|nil, token_ids: [uint],
//!   block_size, lora_id: nil, medium: "GPU", lora_name: nil, group_idx: 0, kv_cache_spec_kind:
//!   "full_attention"}`, `{type: "BlockRemoved", block_hashes: [uint], medium: "GPU", group_idx:
//!   0}`, `{type: "AllBlocksCleared"}`. Block hashes are the cache's chain hashes as unsigned
//!   64-bit integers (vLLM's default `ExternalBlockHash` form).
//! - Replay (when `replay_endpoint` is set): a ROUTER socket; a request `[identity, "", start]`
//!   (`start` 8 bytes big-endian; a DEALER sends `["", start]`, a REQ `[start]`) is answered with
//!   `[identity, "", topic, seq, payload]` for each buffered batch with `seq >= start` (the last
//!   `buffer_steps`), then `[identity, "", "", -1 as 8 bytes, ""]`. Other frame counts are ignored.
//!
//! The engine hands batches over a queue of `max_queue_size` and never waits: a full queue drops
//! the batch (counted, logged). `hwm` is accepted and not applied (the `zeromq` crate fixes its
//! own queue). Unknown keys are refused: a misspelt `enable_kv_cache_events` must not leave
//! events silently off (vLLM validates the flag with pydantic; whether it refuses extra keys
//! depends on its version's config decorator, not confirmed here).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::kv_cache::KvEvent;

/// vLLM's `KVEventsConfig`, as `--kv-events-config` takes it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// `zmq` or `null`; unset: `zmq` when events are enabled.
    pub publisher: Option<Publisher>,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    pub hwm: usize,
    pub max_queue_size: usize,
    pub topic: String,
}

/// `KVEventsConfig.publisher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Publisher {
    Zmq,
    Null,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses the flag's JSON.
    pub fn from_json(json: &str) -> Result<KvEventsConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// Whether a ZMQ publisher runs (vLLM's `EventPublisherFactory.create`).
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher != Some(Publisher::Null)
    }
}

/// vLLM's end-of-replay sequence number.
const END_SEQ: i64 = -1;

/// A step's events, stamped when taken from the cache.
#[derive(Debug)]
struct Batch {
    ts: f64,
    events: Vec<KvEvent>,
}

/// The engine's side of a running publisher: hands batches to its task, never waits.
#[derive(Debug)]
pub struct KvEventPublisher {
    queue: mpsc::Sender<Batch>,
    endpoint: String,
    replay_endpoint: Option<String>,
    dropped: Arc<AtomicU64>,
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets and spawns the publishing task, which ends once this
    /// publisher is dropped and the queue is drained.
    pub async fn start(config: &KvEventsConfig, block_size: usize) -> anyhow::Result<Self> {
        let (publish, endpoint, connect) = if binds(&config.endpoint) {
            let mut publish = zeromq::PubSocket::new();
            let bound = publish.bind(&zmq_endpoint(&config.endpoint)).await?;
            (publish, bound.to_string(), None)
        } else {
            let mut options = zeromq::SocketOptions::default();
            options.connect_timeout(CONNECT_ATTEMPT);
            let publish = zeromq::PubSocket::with_options(options);
            (
                publish,
                config.endpoint.clone(),
                Some(config.endpoint.clone()),
            )
        };
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            Some(e) => {
                let mut router = zeromq::RouterSocket::new();
                let bound = router.bind(&zmq_endpoint(e)).await?.to_string();
                (Some(router), Some(bound))
            }
            None => (None, None),
        };
        let (queue, rx) = mpsc::channel(config.max_queue_size.max(1));
        let task = Task {
            rx,
            publish,
            replay,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            block_size,
            buffer: VecDeque::new(),
            buffer_steps: config.buffer_steps,
            next_seq: 0,
        };
        tokio::spawn(task.run(connect));
        Ok(KvEventPublisher {
            queue,
            endpoint,
            replay_endpoint,
            dropped: Arc::default(),
        })
    }

    /// The PUB socket's endpoint (bound: with the port the system chose).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Queues one batch (nothing if `events` is empty); call in the cache's order.
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        if self.queue.try_send(Batch { ts, events }).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                eprintln!("model-sim: KV event queue full, {n} batches dropped");
            }
        }
    }
}

/// vLLM binds when the endpoint has a wildcard or is local, else connects.
fn binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// How long one connect attempt of a connecting PUB socket may take before it starts over
/// (the `zeromq` crate retries a refused connection with a growing backoff inside an attempt;
/// starting over keeps the wait after a listener appears under about a second, as libzmq's
/// 100 ms reconnect interval does).
const CONNECT_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(1);

/// libzmq's `*` host (every interface) in the form the `zeromq` crate parses.
fn zmq_endpoint(endpoint: &str) -> String {
    endpoint.replacen("://*:", "://0.0.0.0:", 1)
}

/// The publishing task: owns the sockets and the replay buffer.
struct Task {
    rx: mpsc::Receiver<Batch>,
    publish: zeromq::PubSocket,
    replay: Option<zeromq::RouterSocket>,
    topic: Bytes,
    block_size: usize,
    buffer: VecDeque<(i64, Bytes)>,
    buffer_steps: usize,
    next_seq: i64,
}

impl Task {
    /// Connects first when `connect` names an endpoint (in the background of the engine, which
    /// serves meanwhile), then publishes until the engine's side is dropped.
    async fn run(mut self, connect: Option<String>) {
        if let Some(endpoint) = connect
            && !self.connect(&endpoint).await
        {
            return;
        }
        loop {
            let request = async {
                match &mut self.replay {
                    Some(r) => r.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                batch = self.rx.recv() => match batch {
                    Some(batch) => self.send(batch).await,
                    None => break,
                },
                Ok(request) = request => self.serve_replay(request).await,
            }
        }
    }

    /// Connects the PUB socket to `endpoint`, starting over until something listens there (as
    /// libzmq's connect does, in the background). Batches meanwhile are numbered and kept for
    /// replay but sent to no one, as a PUB socket without peers drops them; replay requests are
    /// served. Returns false when the engine's side is dropped first.
    async fn connect(&mut self, endpoint: &str) -> bool {
        let mut logged = false;
        loop {
            // What arrives while this attempt runs is handled once it ends (it holds the socket).
            let (outcome, pending) = {
                let Task {
                    publish,
                    rx,
                    replay,
                    ..
                } = &mut *self;
                let attempt = publish.connect(endpoint);
                tokio::pin!(attempt);
                let mut pending = Vec::new();
                let outcome = loop {
                    let request = async {
                        match replay {
                            Some(r) => r.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        done = &mut attempt => break Some(done),
                        batch = rx.recv() => match batch {
                            Some(batch) => pending.push(Ok(batch)),
                            None => break None,
                        },
                        Ok(request) = request => pending.push(Err(request)),
                    }
                };
                (outcome, pending)
            };
            for item in pending {
                match item {
                    Ok(batch) => {
                        self.record(batch);
                    }
                    Err(request) => self.serve_replay(request).await,
                }
            }
            match outcome {
                None => return false,
                Some(Ok(())) => return true,
                Some(Err(e)) => {
                    if !logged {
                        eprintln!("model-sim: KV events: connecting to {endpoint}: {e}; retrying");
                        logged = true;
                    }
                }
            }
        }
    }

    /// Numbers `batch` and keeps it for replay; returns its frames' seq and payload.
    fn record(&mut self, batch: Batch) -> (i64, Bytes) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(batch.ts, &batch.events, self.block_size, 0));
        if self.buffer_steps > 0 {
            if self.buffer.len() == self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload.clone()));
        }
        (seq, payload)
    }

    async fn send(&mut self, batch: Batch) {
        let (seq, payload) = self.record(batch);
        let message = frames(vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ]);
        if let Err(e) = self.publish.send(message).await {
            eprintln!("model-sim: publishing KV events: {e}");
        }
    }

    /// vLLM's `_service_replay`.
    async fn serve_replay(&mut self, request: ZmqMessage) {
        let frames_in = request.into_vec();
        let [client, _, start] = frames_in.as_slice() else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            return;
        };
        let start = i64::from_be_bytes(start);
        let Some(router) = &mut self.replay else {
            return;
        };
        for (seq, payload) in self.buffer.iter().filter(|(seq, _)| *seq >= start) {
            let reply = frames(vec![
                client.clone(),
                Bytes::new(),
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ]);
            if router.send(reply).await.is_err() {
                return;
            }
        }
        let end = frames(vec![
            client.clone(),
            Bytes::new(),
            Bytes::new(),
            Bytes::copy_from_slice(&END_SEQ.to_be_bytes()),
            Bytes::new(),
        ]);
        let _ = router.send(end).await;
    }
}

#[cfg(test)]
mod tests;

fn frames(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("never empty")
}

/// msgpack of vLLM's `KVEventBatch` (see the module header for the layout).
pub fn encode_batch(ts: f64, events: &[KvEvent], block_size: usize, dp_rank: u32) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_f64, write_uint};
    let mut out = Vec::with_capacity(64);
    // Writing to a Vec cannot fail.
    write_array_len(&mut out, 3).expect("vec");
    write_f64(&mut out, ts).expect("vec");
    write_array_len(&mut out, events.len() as u32).expect("vec");
    for e in events {
        encode_event(&mut out, e, block_size);
    }
    write_uint(&mut out, u64::from(dp_rank)).expect("vec");
    out
}

fn encode_event(out: &mut Vec<u8>, event: &KvEvent, block_size: usize) {
    use rmp::encode::{write_array_len, write_map_len, write_nil, write_str, write_uint};
    let uints = |out: &mut Vec<u8>, values: &mut dyn ExactSizeIterator<Item = u64>| {
        write_array_len(out, values.len() as u32).expect("vec");
        for v in values {
            write_uint(out, v).expect("vec");
        }
    };
    match event {
        KvEvent::Stored {
            blocks,
            parent,
            token_ids,
        } => {
            write_map_len(out, 10).expect("vec");
            write_str(out, "type").expect("vec");
            write_str(out, "BlockStored").expect("vec");
            write_str(out, "block_hashes").expect("vec");
            uints(out, &mut blocks.iter().map(|b| b.0));
            write_str(out, "parent_block_hash").expect("vec");
            match parent {
                Some(p) => write_uint(out, p.0).map(drop).expect("vec"),
                None => write_nil(out).expect("vec"),
            }
            write_str(out, "token_ids").expect("vec");
            uints(out, &mut token_ids.iter().map(|&t| u64::from(t)));
            write_str(out, "block_size").expect("vec");
            write_uint(out, block_size as u64).expect("vec");
            write_str(out, "lora_id").expect("vec");
            write_nil(out).expect("vec");
            write_str(out, "medium").expect("vec");
            write_str(out, "GPU").expect("vec");
            write_str(out, "lora_name").expect("vec");
            write_nil(out).expect("vec");
            write_str(out, "group_idx").expect("vec");
            write_uint(out, 0).expect("vec");
            write_str(out, "kv_cache_spec_kind").expect("vec");
            write_str(out, "full_attention").expect("vec");
        }
        KvEvent::Removed(block) => {
            write_map_len(out, 4).expect("vec");
            write_str(out, "type").expect("vec");
            write_str(out, "BlockRemoved").expect("vec");
            write_str(out, "block_hashes").expect("vec");
            uints(out, &mut std::iter::once(block.0));
            write_str(out, "medium").expect("vec");
            write_str(out, "GPU").expect("vec");
            write_str(out, "group_idx").expect("vec");
            write_uint(out, 0).expect("vec");
        }
        KvEvent::Cleared => {
            write_map_len(out, 1).expect("vec");
            write_str(out, "type").expect("vec");
            write_str(out, "AllBlocksCleared").expect("vec");
        }
    }
}
