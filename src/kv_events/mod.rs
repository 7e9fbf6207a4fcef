//! KV-cache events from the engines: what each model server really holds, as it publishes it.
//!
//! Source: vLLM's `vllm/distributed/kv_events.py` (publisher, `EventBatch`, `KVCacheEvent` and
//! its subclasses, the replay ROUTER) and `vllm/config/kv_events.py` (`KVEventsConfig`), read at
//! vllm-project/vllm commits `0181ea3173e53eea8cf04a86891488e3dc89bb34` (current: map-encoded
//! events) and `b4e69e0af33f4698e157a262cc787fe61983cd3d` (the first release with events:
//! array-encoded, no `medium`, no `data_parallel_rank`); later vLLM adds the topic to each
//! replay reply ([`subscriber`] reads both). SGLang's
//! `python/sglang/srt/disaggregation/kv_events.py` (sgl-project/sglang commit
//! `006d053f182f9b488d2bd841afa06d5f9120a258`) is a copy of the latter: same framing, same replay;
//! its later releases encode events as maps too, with their own extra fields.
//!
//! # Wire
//! A ZeroMQ PUB socket (`--kv-events-config '{"enable_kv_cache_events": true, "endpoint":
//! "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ...}'`; with data parallelism rank
//! r publishes on both ports + r). Every message has three frames: `[topic, seq, payload]`, `seq`
//! an 8-byte big-endian counter from 0 per publisher process, `payload` the msgspec MessagePack
//! encoding of a batch `{ts, events, data_parallel_rank}` (one per engine step).
//!
//! # Encodings ([`event`])
//! msgspec encodes a `Struct` as a map of its fields, or with `array_like=True` as an array in
//! declaration order; `omit_defaults=True` leaves out fields at their default (in an array, only
//! trailing ones). vLLM encoded everything as arrays until vllm-project/vllm#42892, which switched
//! the events (and at the commit above the batch too) to maps; a tagged struct carries its tag,
//! the class name, as the array's first element or as the map's `"type"` key. So the decoder
//! accepts a batch as `[ts, events, dp_rank?, ...]` or as a map, and each event as
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id?, medium?, ...]`
//!   or `{"type": "BlockStored", "block_hashes": .., ...}`;
//! - `["BlockRemoved", block_hashes, medium?, ...]` or the map;
//! - `["AllBlocksCleared", ...]` or `{"type": "AllBlocksCleared"}`.
//!
//! Fields newer engines append (`lora_name`, `extra_keys`, `group_idx`, `kv_cache_spec_*`;
//! SGLang's extensions) and unknown map keys are skipped; trailing fields older engines omit are
//! `None`. Block hashes are `bytes | int` ([`EngineBlockHash`]). An event with an unknown tag is
//! skipped and counted; a known event with a bad field refuses the whole batch, naming the value.
//!
//! # Limits
//! A payload over [`Limits::max_payload_bytes`] (default 16 MiB) or a batch with more than
//! [`Limits::max_events`] (default 65 536) events is refused; a replay that brings more than
//! [`Limits::max_replay_bytes`] (default 256 MiB) is abandoned. Decoding never allocates beyond
//! the decoded events (no generic value tree, no preallocation from a declared length) and never
//! recurses on nesting it skips, so garbage costs at most one pass over its bytes.
//!
//! # Subscribing ([`subscriber`])
//! One task per pod: a SUB socket, the sequence tracked, gaps filled through the replay endpoint,
//! a [`Reset`](subscriber::Update::Reset) when they cannot be; see its header. The numbering
//! itself: [`sequence`].
//!
//! # The shared socket ([`shared`], [`topic`])
//! One SUB socket the picker binds and the engines connect to (llm-d's `zmqEndpoint`), each
//! engine naming its pod in its topic, `kv@<pod>@<model>`; no replay.

pub mod event;
mod msgpack;
pub(crate) mod sequence;
pub mod shared;
pub mod subscriber;
pub mod topic;

#[cfg(test)]
mod tests;

pub use event::{DecodeError, EngineBlockHash, EventBatch, KvEvent, Limits, decode_batch};
pub use shared::{BindEndpoint, BindEndpointError, SharedSocket};
pub use subscriber::{ResetReason, Subscriber, SubscriberConfig, SubscriberStats, Update};
pub use topic::TopicPod;
