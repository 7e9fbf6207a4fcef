//! Publishing local records: a bounded queue on the routing side, batched `XADD` on the other.
//!
//! The routing path only encodes the record and `try_send`s it into a queue of
//! `queueCapacity` records; a full queue drops the record (`dropped{reason="queue_full"}`), so a
//! slow or absent Redis never delays a request. The publisher task takes up to
//! `batchMaxRecords` queued records at a time and sends them as one pipeline of
//! `XADD <stream> MAXLEN ~ <maxLen> * r <payload>` (one round trip per batch). A batch that fails
//! (Redis down, timeout) is dropped and counted (`reason="redis_error"`), the connection is
//! re-established with backoff (at once, not on the next record), and batches arriving
//! meanwhile are dropped the same way.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connection::Link;
use super::metrics::{DropReason, SyncMetrics};
use super::record::{self, HashParams};
use crate::endpoints::Endpoint;
use crate::hashing::BlockHash;
use crate::routing::RecordSink;

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
            &endpoint.spec.generation,
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
        let n = if link.get().is_some() {
            tokio::select! {
                _ = token.cancelled() => return,
                n = rx.recv_many(&mut batch, target.batch_max_records) => n,
            }
        } else {
            // Disconnected: reconnect (with backoff) without waiting for traffic, so the
            // connection gauge tells the truth while idle; records arriving meanwhile go the
            // usual way below.
            tokio::select! {
                _ = token.cancelled() => return,
                n = rx.recv_many(&mut batch, target.batch_max_records) => n,
                connected = link.connect(&token) => {
                    if !connected {
                        return;
                    }
                    continue;
                }
            }
        };
        if n == 0 {
            return;
        }
        let connected = tokio::select! {
            _ = token.cancelled() => return,
            c = link.try_connect() => c,
        };
        if !connected {
            metrics.drop(DropReason::RedisError, n as u64);
            batch.clear();
            if !link.pause(&token).await {
                return;
            }
            continue;
        }
        let mut pipe = redis::pipe();
        for payload in &batch {
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
        let conn = link.get().expect("connected");
        let sent = tokio::select! {
            _ = token.cancelled() => return,
            r = pipe.query_async::<()>(conn) => r,
        };
        match sent {
            Ok(()) => metrics.published.inc_by(n as u64),
            Err(e) => {
                metrics.drop(DropReason::RedisError, n as u64);
                link.lost(&e);
            }
        }
        batch.clear();
    }
}
