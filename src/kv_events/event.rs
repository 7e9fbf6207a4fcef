//! The events and their decoding from one message's payload (see the module header for the wire
//! format and the encodings accepted).

use thiserror::Error;

use super::msgpack::{Head, Malformed, Reader};

/// A block hash as the engine reports it (vLLM's `ExternalBlockHash = bytes | int`): an integer
/// hash as is (a negative one as its two's-complement bits), a bytes hash folded to 64 bits with
/// xxh3. The engine's own hash, not the picker's [`crate::hashing::BlockHash`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineBlockHash(pub u64);

impl EngineBlockHash {
    /// A bytes hash (vLLM's `sha256`/`sha256_cbor` hashes), folded to 64 bits.
    pub fn from_bytes(bytes: &[u8]) -> EngineBlockHash {
        EngineBlockHash(xxhash_rust::xxh3::xxh3_64(bytes))
    }
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks now held, in chain order: `parent` is the block before the first one (`None`: the
    /// chain starts at the prompt's first block); `token_ids` covers all of them.
    BlockStored {
        block_hashes: Vec<EngineBlockHash>,
        parent: Option<EngineBlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        /// Where the blocks are (`"GPU"`, `"CPU"`, ...); `None` from engines before vLLM 0.9.2.
        medium: Option<String>,
    },
    /// Blocks evicted.
    BlockRemoved {
        block_hashes: Vec<EngineBlockHash>,
        medium: Option<String>,
    },
    /// The engine dropped its whole cache (e.g. a reset of the prefix cache).
    AllBlocksCleared,
}

/// One published batch: the events of one engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// When the engine published it, seconds since the Unix epoch (the engine's clock).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The publishing data-parallel rank (`None` from engines that do not send it).
    pub data_parallel_rank: Option<u32>,
    /// Events with a tag this decoder does not know, skipped.
    pub unknown_events: u32,
}

/// What a payload may hold. Both bound the work and the memory of decoding one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Larger payloads are refused before decoding.
    pub max_payload_bytes: usize,
    /// Batches with more events are refused.
    pub max_events: usize,
    /// A replay (a gap, a catch-up) that brings more payload bytes than this is abandoned.
    pub max_replay_bytes: usize,
}

impl Limits {
    /// 16 MiB: a 128k-token prompt's `BlockStored` is under 1 MiB.
    pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 << 20;
    /// One engine step stores or evicts far fewer (one event per request, or per eviction run).
    pub const DEFAULT_MAX_EVENTS: usize = 65_536;
    /// 256 MiB: vLLM's 10,000 buffered batches are a few KiB each.
    pub const DEFAULT_MAX_REPLAY_BYTES: usize = 256 << 20;
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_payload_bytes: Limits::DEFAULT_MAX_PAYLOAD_BYTES,
            max_events: Limits::DEFAULT_MAX_EVENTS,
            max_replay_bytes: Limits::DEFAULT_MAX_REPLAY_BYTES,
        }
    }
}

/// Why a payload was refused. Each names the bad value.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DecodeError {
    #[error("payload of {len} bytes exceeds the limit of {limit}")]
    PayloadTooLarge { len: usize, limit: usize },
    #[error("batch of {count} events exceeds the limit of {limit}")]
    TooManyEvents { count: usize, limit: usize },
    #[error("not MessagePack: truncated at byte {at}")]
    Truncated { at: usize },
    #[error("not MessagePack: reserved byte 0xc1 at byte {at}")]
    ReservedByte { at: usize },
    #[error("{extra} bytes after the batch")]
    TrailingBytes { extra: usize },
    #[error("{what}: expected {expected}, found {found}")]
    Unexpected {
        /// Where: `batch`, `batch.ts`, `BlockStored.token_ids[3]`, ...
        what: String,
        expected: &'static str,
        found: String,
    },
    #[error("{what}: missing field `{field}`")]
    Missing {
        what: &'static str,
        field: &'static str,
    },
}

impl From<Malformed> for DecodeError {
    fn from(m: Malformed) -> DecodeError {
        match m {
            Malformed::Truncated { at } => DecodeError::Truncated { at },
            Malformed::ReservedByte { at } => DecodeError::ReservedByte { at },
        }
    }
}

fn unexpected(what: impl Into<String>, expected: &'static str, found: Head) -> DecodeError {
    DecodeError::Unexpected {
        what: what.into(),
        expected,
        found: found.to_string(),
    }
}

/// Decodes one message's payload: a batch as vLLM and SGLang encode it (array or map, events
/// as tagged arrays or tagged maps; see the module header).
pub fn decode_batch(payload: &[u8], limits: &Limits) -> Result<EventBatch, DecodeError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(DecodeError::PayloadTooLarge {
            len: payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    let mut r = Reader::new(payload);
    let batch = match r.head()? {
        Head::Array(n) => batch_from_array(&mut r, n, limits)?,
        Head::Map(n) => batch_from_map(&mut r, n, limits)?,
        other => return Err(unexpected("batch", "an array or a map", other)),
    };
    if r.remaining() > 0 {
        return Err(DecodeError::TrailingBytes {
            extra: r.remaining(),
        });
    }
    Ok(batch)
}

/// `[ts, events, data_parallel_rank?, ...]`: positional, trailing fields optional, extra ones
/// skipped.
fn batch_from_array(r: &mut Reader, n: usize, limits: &Limits) -> Result<EventBatch, DecodeError> {
    if n < 2 {
        return Err(DecodeError::Missing {
            what: "batch",
            field: if n == 0 { "ts" } else { "events" },
        });
    }
    let ts = read_ts(r)?;
    let (events, unknown_events) = read_events(r, limits)?;
    let data_parallel_rank = if n >= 3 { read_dp_rank(r)? } else { None };
    for _ in 3..n {
        r.skip()?;
    }
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank,
        unknown_events,
    })
}

/// `{"ts": .., "events": [..], "data_parallel_rank": ..}` in any order, unknown keys skipped.
fn batch_from_map(r: &mut Reader, n: usize, limits: &Limits) -> Result<EventBatch, DecodeError> {
    let (mut ts, mut events, mut dp) = (None, None, None);
    for _ in 0..n {
        match read_key(r)? {
            Some(b"ts") => ts = Some(read_ts(r)?),
            Some(b"events") => events = Some(read_events(r, limits)?),
            Some(b"data_parallel_rank") => dp = read_dp_rank(r)?,
            _ => r.skip()?,
        }
    }
    let ts = ts.ok_or(DecodeError::Missing {
        what: "batch",
        field: "ts",
    })?;
    let (events, unknown_events) = events.ok_or(DecodeError::Missing {
        what: "batch",
        field: "events",
    })?;
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank: dp,
        unknown_events,
    })
}

fn read_ts(r: &mut Reader) -> Result<f64, DecodeError> {
    match r.head()? {
        Head::Float(x) => Ok(x),
        Head::Uint(u) => Ok(u as f64),
        Head::Int(i) => Ok(i as f64),
        other => Err(unexpected("batch.ts", "a number", other)),
    }
}

fn read_dp_rank(r: &mut Reader) -> Result<Option<u32>, DecodeError> {
    match r.head()? {
        Head::Nil => Ok(None),
        Head::Uint(u) if u <= u64::from(u32::MAX) => Ok(Some(u as u32)),
        other => Err(unexpected(
            "batch.data_parallel_rank",
            "nil or a rank",
            other,
        )),
    }
}

fn read_events(r: &mut Reader, limits: &Limits) -> Result<(Vec<KvEvent>, u32), DecodeError> {
    let n = match r.head()? {
        Head::Array(n) => n,
        other => return Err(unexpected("batch.events", "an array", other)),
    };
    if n > limits.max_events {
        return Err(DecodeError::TooManyEvents {
            count: n,
            limit: limits.max_events,
        });
    }
    // Every event takes at least one byte: never reserve more than the payload could hold.
    let mut events = Vec::with_capacity(n.min(r.remaining()));
    let mut unknown = 0u32;
    for _ in 0..n {
        match read_event(r)? {
            Some(e) => events.push(e),
            None => unknown += 1,
        }
    }
    Ok((events, unknown))
}

/// The event kinds this decoder knows, by their tag (the struct's class name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

impl Kind {
    fn from_tag(tag: &[u8]) -> Option<Kind> {
        match tag {
            b"BlockStored" => Some(Kind::Stored),
            b"BlockRemoved" => Some(Kind::Removed),
            b"AllBlocksCleared" => Some(Kind::Cleared),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Stored => "BlockStored",
            Kind::Removed => "BlockRemoved",
            Kind::Cleared => "AllBlocksCleared",
        }
    }

    /// The fields read by position in the array encoding, after the tag. Later positions (vLLM's
    /// `lora_name`, `extra_keys`, `group_idx`...; SGLang's own extensions) are skipped.
    fn positional(self) -> &'static [Field] {
        match self {
            Kind::Stored => &[
                Field::BlockHashes,
                Field::Parent,
                Field::TokenIds,
                Field::BlockSize,
                Field::LoraId,
                Field::Medium,
            ],
            Kind::Removed => &[Field::BlockHashes, Field::Medium],
            Kind::Cleared => &[],
        }
    }

    fn field(self, key: &[u8]) -> Option<Field> {
        let f = match key {
            b"block_hashes" => Field::BlockHashes,
            b"parent_block_hash" => Field::Parent,
            b"token_ids" => Field::TokenIds,
            b"block_size" => Field::BlockSize,
            b"lora_id" => Field::LoraId,
            b"medium" => Field::Medium,
            _ => return None,
        };
        self.positional().contains(&f).then_some(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
}

#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<EngineBlockHash>>,
    parent: Option<EngineBlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
}

/// A map key: a string's bytes, or `None` for any other key (skipped whole).
fn read_key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
    let start = r.position();
    match r.head()? {
        Head::Str(key) => Ok(Some(key)),
        _ => {
            r.seek(start);
            r.skip()?;
            Ok(None)
        }
    }
}

/// One event; `None` for an unknown tag (skipped whole).
fn read_event(r: &mut Reader) -> Result<Option<KvEvent>, DecodeError> {
    let start = r.position();
    match r.head()? {
        Head::Array(0) => Err(DecodeError::Missing {
            what: "event",
            field: "tag",
        }),
        Head::Array(n) => read_array_event(r, start, n),
        Head::Map(n) => read_map_event(r, start, n),
        other => Err(unexpected("event", "a tagged array or map", other)),
    }
}

/// An event in the array encoding, after its head: the tag, then the fields by position.
fn read_array_event(
    r: &mut Reader,
    start: usize,
    n: usize,
) -> Result<Option<KvEvent>, DecodeError> {
    let tag = match r.head()? {
        Head::Str(t) => t,
        other => return Err(unexpected("event tag", "a string", other)),
    };
    let Some(kind) = Kind::from_tag(tag) else {
        r.seek(start);
        r.skip()?;
        return Ok(None);
    };
    let mut fields = Fields::default();
    let positional = kind.positional();
    for i in 1..n {
        match positional.get(i - 1) {
            Some(&f) => read_field(r, kind, f, &mut fields)?,
            None => r.skip()?,
        }
    }
    build(kind, fields).map(Some)
}

/// An event in the map encoding, after its head: the tag (`"type"`) first, wherever it is;
/// then, read again from the start, the fields by name.
fn read_map_event(r: &mut Reader, start: usize, n: usize) -> Result<Option<KvEvent>, DecodeError> {
    let kind = match map_tag(r, n)? {
        None => {
            return Err(DecodeError::Missing {
                what: "event",
                field: "type",
            });
        }
        Some(None) => {
            r.seek(start);
            r.skip()?;
            return Ok(None);
        }
        Some(Some(kind)) => kind,
    };
    r.seek(start);
    r.head()?;
    let mut fields = Fields::default();
    for _ in 0..n {
        let field = read_key(r)?.and_then(|key| kind.field(key));
        match field {
            Some(f) => read_field(r, kind, f, &mut fields)?,
            None => r.skip()?,
        }
    }
    build(kind, fields).map(Some)
}

/// The `"type"` entry of a map of `n` entries: `None` without one, `Some(None)` for a tag this
/// decoder does not know.
fn map_tag(r: &mut Reader, n: usize) -> Result<Option<Option<Kind>>, DecodeError> {
    for _ in 0..n {
        if read_key(r)? == Some(b"type") {
            return match r.head()? {
                Head::Str(t) => Ok(Some(Kind::from_tag(t))),
                other => Err(unexpected("event tag", "a string", other)),
            };
        }
        r.skip()?;
    }
    Ok(None)
}

fn read_field(r: &mut Reader, kind: Kind, f: Field, out: &mut Fields) -> Result<(), DecodeError> {
    let name = kind.name();
    match f {
        Field::BlockHashes => {
            out.block_hashes = Some(read_list(r, name, "block_hashes", read_hash)?);
        }
        Field::Parent => {
            out.parent = match r.head()? {
                Head::Nil => None,
                h => Some(hash(h, || format!("{name}.parent_block_hash"))?),
            }
        }
        Field::TokenIds => out.token_ids = Some(read_tokens(r, name)?),
        Field::BlockSize => {
            out.block_size = Some(match r.head()? {
                Head::Uint(u) if u <= u64::from(u32::MAX) => u as u32,
                other => {
                    return Err(unexpected(
                        format!("{name}.block_size"),
                        "a block size",
                        other,
                    ));
                }
            })
        }
        Field::LoraId => {
            out.lora_id = match r.head()? {
                Head::Nil => None,
                Head::Uint(u) if u <= i64::MAX as u64 => Some(u as i64),
                Head::Int(i) => Some(i),
                other => {
                    return Err(unexpected(
                        format!("{name}.lora_id"),
                        "nil or an integer",
                        other,
                    ));
                }
            }
        }
        Field::Medium => {
            out.medium = match r.head()? {
                Head::Nil => None,
                Head::Str(s) => Some(String::from_utf8_lossy(s).into_owned()),
                other => {
                    return Err(unexpected(
                        format!("{name}.medium"),
                        "nil or a string",
                        other,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// An array of `n` elements, each read by `item` (told its index for the error).
fn read_list<T>(
    r: &mut Reader,
    event: &'static str,
    field: &'static str,
    item: fn(&mut Reader, &dyn Fn() -> String) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let n = match r.head()? {
        Head::Array(n) => n,
        other => return Err(unexpected(format!("{event}.{field}"), "an array", other)),
    };
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for i in 0..n {
        out.push(item(r, &|| format!("{event}.{field}[{i}]"))?);
    }
    Ok(out)
}

fn read_hash(r: &mut Reader, what: &dyn Fn() -> String) -> Result<EngineBlockHash, DecodeError> {
    let h = r.head()?;
    hash(h, what)
}

fn hash(h: Head, what: impl FnOnce() -> String) -> Result<EngineBlockHash, DecodeError> {
    match h {
        Head::Uint(u) => Ok(EngineBlockHash(u)),
        Head::Int(i) => Ok(EngineBlockHash(i as u64)),
        Head::Bin(b) => Ok(EngineBlockHash::from_bytes(b)),
        other => Err(unexpected(what(), "an integer or bytes hash", other)),
    }
}

/// `token_ids`: an array of unsigned integers that fit `u32` ([`Reader::small_uint`]'s fast
/// path; a `u64` encoding of a small id is read too).
fn read_tokens(r: &mut Reader, event: &'static str) -> Result<Vec<u32>, DecodeError> {
    let n = match r.head()? {
        Head::Array(n) => n,
        other => return Err(unexpected(format!("{event}.token_ids"), "an array", other)),
    };
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for i in 0..n {
        let id = match r.small_uint()? {
            Ok(id) => id,
            Err(Head::Uint(u)) if u <= u64::from(u32::MAX) => u as u32,
            Err(other) => {
                return Err(unexpected(
                    format!("{event}.token_ids[{i}]"),
                    "a token id",
                    other,
                ));
            }
        };
        out.push(id);
    }
    Ok(out)
}

fn build(kind: Kind, f: Fields) -> Result<KvEvent, DecodeError> {
    let what = kind.name();
    let missing = |field| DecodeError::Missing { what, field };
    Ok(match kind {
        Kind::Stored => KvEvent::BlockStored {
            block_hashes: f.block_hashes.ok_or(missing("block_hashes"))?,
            parent: f.parent,
            token_ids: f.token_ids.ok_or(missing("token_ids"))?,
            block_size: f.block_size.ok_or(missing("block_size"))?,
            lora_id: f.lora_id,
            medium: f.medium,
        },
        Kind::Removed => KvEvent::BlockRemoved {
            block_hashes: f.block_hashes.ok_or(missing("block_hashes"))?,
            medium: f.medium,
        },
        Kind::Cleared => KvEvent::AllBlocksCleared,
    })
}
