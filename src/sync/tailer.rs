//! Tailing the stream: warm replay at start-up, then `XREAD BLOCK` from the last id seen.
//!
//! On the first connection the tailer starts at the beginning of the retained stream
//! (`replayOnStart`) or at its end, reads everything up to the stream's last id as it was then
//! (`XREAD COUNT 1000` without blocking), applies it, and only then reports the replay done, so
//! the picker turns ready with a warm index. Afterwards it blocks on
//! `XREAD COUNT 1000 BLOCK 1000 STREAMS <stream> <last id>`. After a lost connection it reconnects
//! with backoff and reads on from the last id it applied, which replays the gap; if `MAXLEN`
//! trimmed entries it never saw, it logs that records were missed and goes on from the oldest
//! retained entry.
//!
//! Lag: `lag_seconds` is the age (now minus the id's timestamp, Redis clock) of the newest
//! entry of each read, 0 when a blocking read returns nothing. `lag_entries` is
//! `entries-added` (from `XINFO STREAM`, polled at most once a second) minus the ordinal of the
//! last entry read; ordinals are anchored at each connection (first retained entry =
//! `entries-added - length + 1`) and advance by one per entry read.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::apply::Applier;
use super::connection::Link;
use super::metrics::SyncMetrics;
use super::record;

/// Entries per `XREAD`.
const READ_COUNT: usize = 1000;
/// How long one `XREAD` blocks waiting for new entries.
pub const BLOCK: Duration = Duration::from_secs(1);
/// How often `lag_entries` is refreshed.
const INFO_PERIOD: Duration = Duration::from_secs(1);

/// A stream entry id, `<ms>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EntryId {
    pub ms: u64,
    pub seq: u64,
}

impl EntryId {
    pub fn parse(s: &str) -> Option<EntryId> {
        let (ms, seq) = s.split_once('-')?;
        Some(EntryId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What `XINFO STREAM` says (all zero for a stream that does not exist yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamInfo {
    pub length: u64,
    /// Entries ever added (Redis >= 7; the length on older servers).
    pub added: u64,
    pub first: Option<EntryId>,
    pub last_generated: EntryId,
}

/// The tailer task's state.
#[derive(Debug)]
pub struct Tailer {
    pub link: Link,
    pub stream: String,
    pub applier: Applier,
    pub metrics: SyncMetrics,
    pub replay_on_start: bool,
    /// Sent once the start-up replay is complete.
    pub replayed: Option<oneshot::Sender<()>>,
    pub started: Instant,
    last: Option<EntryId>,
    ordinal: u64,
}

impl Tailer {
    pub fn new(
        link: Link,
        stream: String,
        applier: Applier,
        metrics: SyncMetrics,
        replay_on_start: bool,
        replayed: oneshot::Sender<()>,
    ) -> Tailer {
        Tailer {
            link,
            stream,
            applier,
            metrics,
            replay_on_start,
            replayed: Some(replayed),
            started: Instant::now(),
            last: None,
            ordinal: 0,
        }
    }

    /// Runs until cancelled.
    pub async fn run(mut self, token: CancellationToken) {
        loop {
            if !self.link.connect(&token).await {
                return;
            }
            match self.session(&token).await {
                Ok(()) => return,
                Err(e) => {
                    self.link.lost(&e);
                    if !self.link.pause(&token).await {
                        return;
                    }
                }
            }
        }
    }

    /// One connection's life; `Ok` only when cancelled.
    async fn session(&mut self, token: &CancellationToken) -> redis::RedisResult<()> {
        let info = self.info().await?;
        let before_first = info.added.saturating_sub(info.length);
        match self.last {
            None if self.replay_on_start => {
                self.last = Some(EntryId::default());
                self.ordinal = before_first;
            }
            None => {
                self.last = Some(info.last_generated);
                self.ordinal = info.added;
            }
            Some(last) => {
                if info.first.is_some_and(|first| last < first) && last != EntryId::default() {
                    tracing::warn!(
                        last = %last,
                        "sync: entries were trimmed from the stream while disconnected; their records are missed"
                    );
                    self.ordinal = before_first;
                }
            }
        }
        if self.replayed.is_some() {
            let mut n = 0;
            while self.last.is_some_and(|l| l < info.last_generated) {
                let read = tokio::select! {
                    _ = token.cancelled() => return Ok(()),
                    r = self.read(None) => r?,
                };
                if read == 0 {
                    break;
                }
                n += read;
            }
            let took = self.started.elapsed();
            self.metrics.replay_seconds.set(took.as_secs_f64());
            self.metrics.replayed.inc_by(n as u64);
            tracing::info!(entries = n, ?took, "sync: warm replay done");
            if let Some(tx) = self.replayed.take() {
                let _ = tx.send(());
            }
        }
        let mut info_at = Instant::now();
        loop {
            tokio::select! {
                _ = token.cancelled() => return Ok(()),
                r = self.read(Some(BLOCK)) => { r?; }
            }
            if info_at.elapsed() >= INFO_PERIOD {
                let info = self.info().await?;
                self.metrics
                    .lag_entries
                    .set(info.added.saturating_sub(self.ordinal) as i64);
                info_at = Instant::now();
            }
        }
    }

    async fn info(&mut self) -> redis::RedisResult<StreamInfo> {
        let conn = self.link.get().expect("connected");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&self.stream)
            .query_async(conn)
            .await?;
        if !exists {
            return Ok(StreamInfo::default());
        }
        let reply: Value = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&self.stream)
            .query_async(conn)
            .await?;
        Ok(parse_info(reply))
    }

    /// Reads and applies one batch after the last id; returns the number of entries read.
    async fn read(&mut self, block: Option<Duration>) -> redis::RedisResult<usize> {
        let last = self.last.unwrap_or_default();
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(READ_COUNT);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b.as_millis() as u64);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(last.to_string());
        let conn = self.link.get().expect("connected");
        let reply: Value = cmd.query_async(conn).await?;
        let entries = stream_entries(reply);
        if entries.is_empty() {
            if block.is_some() {
                self.metrics.lag_seconds.set(0.0);
                self.metrics.lag_entries.set(0);
            }
            return Ok(0);
        }
        let n = entries.len();
        for (id, payload) in entries {
            match payload {
                Some(p) => {
                    self.applier.apply(&p);
                }
                None => self.metrics.drop(super::metrics::DropReason::Malformed, 1),
            }
            self.last = Some(id);
            self.ordinal += 1;
        }
        if let Some(last) = self.last {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            self.metrics
                .lag_seconds
                .set(now.saturating_sub(last.ms) as f64 / 1000.0);
        }
        Ok(n)
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn entry_id(v: &Value) -> Option<EntryId> {
    EntryId::parse(std::str::from_utf8(bytes(v)?).ok()?)
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// `XINFO STREAM` (a flat key/value array in RESP2, a map in RESP3).
pub fn parse_info(reply: Value) -> StreamInfo {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Array(items) => {
            let mut it = items.into_iter();
            let mut out = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(m) => m,
        _ => Vec::new(),
    };
    let mut info = StreamInfo::default();
    let mut added = None;
    for (k, v) in &pairs {
        match bytes(k) {
            Some(b"length") => info.length = int(v).unwrap_or(0),
            Some(b"entries-added") => added = int(v),
            Some(b"last-generated-id") => info.last_generated = entry_id(v).unwrap_or_default(),
            Some(b"first-entry") => {
                if let Value::Array(e) = v {
                    info.first = e.first().and_then(entry_id);
                }
            }
            _ => {}
        }
    }
    info.added = added.unwrap_or(info.length);
    info
}

/// The entries of an `XREAD` reply for one stream: id and the `r` field (None if absent).
pub fn stream_entries(reply: Value) -> Vec<(EntryId, Option<Vec<u8>>)> {
    let streams: Vec<Value> = match reply {
        Value::Array(s) => s
            .into_iter()
            .filter_map(|kv| match kv {
                Value::Array(mut kv) if kv.len() == 2 => kv.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m.into_iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else {
            continue;
        };
        for e in entries {
            let Value::Array(mut e) = e else { continue };
            if e.len() != 2 {
                continue;
            }
            let fields = e.pop().expect("2 items");
            let Some(id) = entry_id(&e[0]) else { continue };
            let payload = match fields {
                Value::Array(f) => {
                    let mut it = f.into_iter();
                    let mut found = None;
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        if bytes(&k) == Some(record::FIELD.as_bytes())
                            && let Value::BulkString(b) = v
                        {
                            found = Some(b);
                        }
                    }
                    found
                }
                Value::Map(m) => m.into_iter().find_map(|(k, v)| match v {
                    Value::BulkString(b) if bytes(&k) == Some(record::FIELD.as_bytes()) => Some(b),
                    _ => None,
                }),
                _ => None,
            };
            out.push((id, payload));
        }
    }
    out
}
