//! Publishing local records: a bounded queue on the routing side, batched `XADD` on the other.
//!
//! The routing path only encodes the record and `try_send`s it into a queue of
//! `queueCapacity` records; a full queue drops the record (`dropped{reason="queue_full"}`), so a
//! slow or absent Redis never delays a request. The publisher task takes up to
//! `batchMaxRecords` queued records at a time and sends them as one pipeline of
//! `XADD <stream> MAXLEN ~ <maxLen> * r <payload>` (one round trip per batch).
//!
//! A batch that fails is resent once on a fresh connection made at once (a Redis that restarted
//! since the last batch: the old connection is dead but the server is back). A batch that fails
//! again, or finds no Redis to connect to, is dropped and counted (`reason="redis_error"`); the
//! connection is then re-established with backoff (100 ms doubling to 5 s) without waiting for
//! the next record, and batches arriving meanwhile are dropped the same way. While idle, the
//! task probes its connection every second ([`Link::probe`], `EXISTS <stream>`, 500 ms
//! timeout), so a dead connection is noticed, the gauge reads 0, and it is re-established
//! before the next record rather than by it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connection::Link;
use super::index::RecordSink;
use super::metrics::{DropReason, SyncMetrics};
use super::record::{self, HashParams};
use crate::endpoints::Endpoint;
use crate::hashing::BlockHash;

/// The routing side: encodes records and queues them without waiting.
#[derive(Debug)]
pub struct Publisher {
    tx: mpsc::Sender<Vec<u8>>,
    replica: u64,
    params: HashParams,
    metrics: SyncMetrics,
}

impl Publisher {
    /// A publisher and the receiving end its task drains.
    pub fn new(
        capacity: usize,
        replica: u64,
        params: HashParams,
        metrics: SyncMetrics,
    ) -> (Arc<Publisher>, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            Arc::new(Publisher {
                tx,
                replica,
                params,
                metrics,
            }),
            rx,
        )
    }
}

impl RecordSink for Publisher {
    fn recorded(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint) {
        let payload = record::encode(
            self.replica,
            self.params,
            model,
            &endpoint.label,
            &endpoint.generation(),
            hashes,
        );
        if self.tx.try_send(payload).is_err() {
            self.metrics.drop(DropReason::QueueFull, 1);
        }
    }
}

/// Stream settings the publisher task needs.
#[derive(Debug, Clone)]
pub struct Target {
    pub stream: String,
    pub max_len: u64,
    pub batch_max_records: usize,
}

/// Drains the queue into the stream until cancelled.
pub async fn run(
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut link: Link,
    target: Target,
    metrics: SyncMetrics,
    token: CancellationToken,
) {
    let mut batch = Vec::with_capacity(target.batch_max_records);
    loop {
        let n = match wait(&mut rx, &mut batch, &mut link, &target, &token).await {
            Waited::Records(0) | Waited::Stop => return,
            Waited::Again => continue,
            Waited::Records(n) => n,
        };
        let pipe = xadd_batch(&batch, &target);
        let sent = tokio::select! {
            _ = token.cancelled() => return,
            s = send(&mut link, &pipe) => s,
        };
        match sent {
            Sent::Published => metrics.published.inc_by(n as u64),
            Sent::Failed => metrics.drop(DropReason::RedisError, n as u64),
            Sent::Unreachable => {
                metrics.drop(DropReason::RedisError, n as u64);
                batch.clear();
                if !link.pause(&token).await {
                    return;
                }
                continue;
            }
        }
        batch.clear();
    }
}

/// What waiting for records brought.
enum Waited {
    /// This many records were added to the batch (0: the queue is closed).
    Records(usize),
    /// The connection was probed or re-established: wait again.
    Again,
    /// Cancelled, or the reconnection gave up.
    Stop,
}

/// Waits for records; meanwhile probes an idle connection or re-establishes a lost one.
async fn wait(
    rx: &mut mpsc::Receiver<Vec<u8>>,
    batch: &mut Vec<Vec<u8>>,
    link: &mut Link,
    target: &Target,
    token: &CancellationToken,
) -> Waited {
    if link.get().is_some() {
        tokio::select! {
            _ = token.cancelled() => Waited::Stop,
            n = rx.recv_many(batch, target.batch_max_records) => Waited::Records(n),
            // Idle: a connection whose server died shows only when used (the gauge would
            // read 1 and the next batch would fail), so use it.
            _ = tokio::time::sleep(IDLE_PROBE) => {
                tokio::select! {
                    _ = token.cancelled() => Waited::Stop,
                    _ = link.probe(&target.stream, PROBE_TIMEOUT) => Waited::Again,
                }
            }
        }
    } else {
        // Disconnected: reconnect (with backoff) without waiting for traffic, so the
        // connection gauge tells the truth while idle; records arriving meanwhile go the
        // usual way.
        tokio::select! {
            _ = token.cancelled() => Waited::Stop,
            n = rx.recv_many(batch, target.batch_max_records) => Waited::Records(n),
            connected = link.connect(token) => {
                if connected { Waited::Again } else { Waited::Stop }
            }
        }
    }
}

/// One pipelined `XADD ... MAXLEN ~ <maxLen> * <field> <record>` per record of the batch.
fn xadd_batch(batch: &[Vec<u8>], target: &Target) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for payload in batch {
        pipe.cmd("XADD")
            .arg(&target.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(target.max_len)
            .arg("*")
            .arg(record::FIELD)
            .arg(payload.as_slice())
            .ignore();
    }
    pipe
}

/// How long the publisher stays idle before it probes its connection.
const IDLE_PROBE: Duration = Duration::from_secs(1);
/// A probe not answered within this counts as a dead connection (a live Redis answers `EXISTS`
/// in well under a millisecond).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What became of one batch.
enum Sent {
    Published,
    /// Sent and failed twice (the second time on a fresh connection).
    Failed,
    /// No connection could be made (Redis down): back off before the next attempt.
    Unreachable,
}

/// Sends `pipe`; if that fails on a connection that died since its last use (a Redis restart
/// the idle probe has not seen yet), reconnects once at once and resends it. A resend may
/// repeat entries of a batch that partly landed: applying a record twice only refreshes it.
async fn send(link: &mut Link, pipe: &redis::Pipeline) -> Sent {
    for attempt in 0..2 {
        if !link.try_connect().await {
            return Sent::Unreachable;
        }
        let conn = link.get().expect("connected");
        match pipe.query_async::<()>(conn).await {
            Ok(()) => {
                if attempt > 0 {
                    tracing::info!("sync: resent a batch after reconnecting to Redis");
                }
                return Sent::Published;
            }
            Err(e) => link.lost(&e),
        }
    }
    Sent::Failed
}
