//! `prefix-picker kv-relay`: Kthena's Runtime writer (volcano-sh/kthena 3cc0572,
//! `python/kthena/runtime/kv_cache_manager.py`), as a sidecar beside one engine.
//!
//! It subscribes to the engine's KV events ([`crate::kv_events::Subscriber`]: reconnects, fills
//! gaps through the replay socket, resets when it cannot) and writes what the engine holds to
//! kvcache-aware's layout:
//!
//! - `BlockStored`: the block size is `len(token_ids) / len(block_hashes)` (not a whole number:
//!   the event is skipped and counted, as the Runtime refuses it); each block's standardized
//!   hash ([`standardized_hash`]) gets `HSET matrix:kv:block:{model}@{std} {pod} {unix now}`,
//!   and the engine's hash is mapped to it: `SET {engine}:kv:block:{pod}@{engine hash} {std}`
//!   with a 24 h `EXPIRE` (`vllm:` or `sglang:`), also kept in memory;
//! - `BlockRemoved`: each engine hash's standardized hash (memory, else the mapping key) gets
//!   `HDEL` of the pod's field and the mapping key is deleted; an unknown hash is skipped;
//! - `AllBlocksCleared`, and a subscriber `Reset` (the events in between are lost, so what the
//!   pod holds is unknown): the pod's field is removed from every `matrix:kv:block:{model}@*`
//!   key and its mapping keys are deleted (`SCAN ... COUNT 100`).
//!
//! On shutdown (SIGTERM) the relay releases what it wrote: `HDEL` of the pod's field from each
//! block it knows the engine holds and `DEL` of their mapping keys, in pipelines, within
//! `--release-seconds` (default 5; 0: keep them). Without it a departed pod's fields stay until
//! the router's GC, which visits 100 keys an hour; blocks stored before the relay itself
//! restarted are not known to it and stay.
//!
//! One pipeline per event. Redis errors never end the relay: the event is retried with backoff
//! (100 ms doubling to 5 s) on the shared connection ([`KvStore`]), which reconnects on its
//! own, unless Redis refused the writes themselves (`WRONGTYPE`, `NOPERM`, `OOM`: the event is
//! skipped, warned and counted); meanwhile newer events wait in the subscriber's channel (when it is full the
//! subscriber's own gap handling applies). Engine hashes are written as unsigned decimals (the
//! Runtime writes Python's int); only the relay reads them back.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::KvStore;
use crate::backoff::Backoff;
use crate::kv_events::{EngineBlockHash, KvEvent, Subscriber, SubscriberConfig, Update};
use crate::scheduler::kvcache_aware::{KEY_PREFIX, StdBlockHash, block_key, standardized_hash};
use crate::tokenizer::EngineKind;

/// The mapping keys' expiry (the Runtime's `MAPPING_KEY_TTL_SECONDS`).
pub const MAPPING_TTL_SECONDS: u64 = 86_400;

/// What the relay writes as.
#[derive(Debug, Clone)]
pub struct RelayIdentity {
    /// The owner field: `podName.namespace`.
    pub pod: String,
    /// The model name in the block keys (the served model name requests carry).
    pub model: String,
    /// Which mapping prefix (`vllm:` or `sglang:`).
    pub engine: EngineKind,
}

/// What the relay did (logged every minute and at exit).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayCounts {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub unknown_removed: u64,
    pub skipped_events: u64,
    pub clears: u64,
    pub resets: u64,
    pub disconnects: u64,
    pub redis_retries: u64,
    /// Events whose writes Redis refused for good (`WRONGTYPE`, `NOPERM`, `OOM`): skipped.
    pub refused_events: u64,
    /// Blocks whose fields the relay removed at shutdown.
    pub released_blocks: u64,
}

/// The writer: the layout and the engine -> standardized hash map.
#[derive(Debug)]
pub struct Writer {
    id: RelayIdentity,
    mapping: HashMap<EngineBlockHash, StdBlockHash>,
    pub counts: RelayCounts,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Writer {
    pub fn new(id: RelayIdentity) -> Writer {
        Writer {
            id,
            mapping: HashMap::new(),
            counts: RelayCounts::default(),
        }
    }

    fn mapping_key(&self, engine_hash: EngineBlockHash) -> String {
        format!(
            "{}:kv:block:{}@{}",
            self.id.engine.as_str(),
            self.id.pod,
            engine_hash.0
        )
    }

    /// Applies one event, retrying Redis errors with backoff until done or `shutdown`; an
    /// error that no retry can mend (Redis answered with a refusal) skips the event.
    pub async fn apply(&mut self, store: &KvStore, event: &KvEvent, shutdown: &CancellationToken) {
        let mut backoff = Backoff::new();
        loop {
            let result = match store.connection() {
                None => Err(None),
                Some(mut conn) => self.try_apply(&mut conn, event).await.map_err(Some),
            };
            match result {
                Ok(()) => return,
                Err(Some(e)) if matches!(e.retry_method(), redis::RetryMethod::NoRetry) => {
                    tracing::warn!(error = %e, "kv-relay: Redis refused the event's writes; event skipped");
                    self.counts.refused_events += 1;
                    return;
                }
                Err(e) => {
                    if let Some(e) = e {
                        tracing::warn!(error = %e, "kv-relay: Redis write failed; retrying");
                        store.failed();
                    }
                    self.counts.redis_retries += 1;
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }

    async fn try_apply(
        &mut self,
        conn: &mut crate::sync::connection::Connection,
        event: &KvEvent,
    ) -> redis::RedisResult<()> {
        match event {
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                ..
            } => self.stored(conn, block_hashes, token_ids).await,
            KvEvent::BlockRemoved { block_hashes, .. } => self.removed(conn, block_hashes).await,
            KvEvent::AllBlocksCleared => {
                self.counts.clears += 1;
                self.clear(conn).await
            }
        }
    }

    async fn stored(
        &mut self,
        conn: &mut crate::sync::connection::Connection,
        hashes: &[EngineBlockHash],
        tokens: &[u32],
    ) -> redis::RedisResult<()> {
        if hashes.is_empty() || tokens.is_empty() {
            return Ok(());
        }
        if tokens.len() % hashes.len() != 0 {
            tracing::warn!(
                tokens = tokens.len(),
                blocks = hashes.len(),
                "kv-relay: token count does not divide into the blocks; event skipped"
            );
            self.counts.skipped_events += 1;
            return Ok(());
        }
        let size = tokens.len() / hashes.len();
        let now = now_unix();
        let mut pipe = redis::pipe();
        let mut stored = Vec::with_capacity(hashes.len());
        for (&engine, block) in hashes.iter().zip(tokens.chunks(size)) {
            let std = standardized_hash(block);
            let mapping = self.mapping_key(engine);
            pipe.cmd("SET").arg(&mapping).arg(std.0).ignore();
            pipe.cmd("EXPIRE")
                .arg(&mapping)
                .arg(MAPPING_TTL_SECONDS)
                .ignore();
            pipe.cmd("HSET")
                .arg(block_key(&self.id.model, std))
                .arg(&self.id.pod)
                .arg(now)
                .ignore();
            stored.push((engine, std));
        }
        pipe.query_async::<()>(conn).await?;
        self.counts.stored_blocks += stored.len() as u64;
        self.mapping.extend(stored);
        Ok(())
    }

    async fn removed(
        &mut self,
        conn: &mut crate::sync::connection::Connection,
        hashes: &[EngineBlockHash],
    ) -> redis::RedisResult<()> {
        let mut pipe = redis::pipe();
        let mut removed = Vec::new();
        for &engine in hashes {
            let mapping = self.mapping_key(engine);
            let std = match self.mapping.get(&engine) {
                Some(&s) => Some(s),
                None => redis::cmd("GET")
                    .arg(&mapping)
                    .query_async::<Option<String>>(conn)
                    .await?
                    .and_then(|s| s.parse().ok())
                    .map(StdBlockHash),
            };
            let Some(std) = std else {
                self.counts.unknown_removed += 1;
                continue;
            };
            pipe.cmd("HDEL")
                .arg(block_key(&self.id.model, std))
                .arg(&self.id.pod)
                .ignore();
            pipe.cmd("DEL").arg(&mapping).ignore();
            removed.push(engine);
        }
        if removed.is_empty() {
            return Ok(());
        }
        pipe.query_async::<()>(conn).await?;
        self.counts.removed_blocks += removed.len() as u64;
        for e in removed {
            self.mapping.remove(&e);
        }
        Ok(())
    }

    /// Removes the pod's field from every block key of the model and its mapping keys.
    pub async fn clear(
        &mut self,
        conn: &mut crate::sync::connection::Connection,
    ) -> redis::RedisResult<()> {
        let blocks = format!("{KEY_PREFIX}{}@*", glob_escape(&self.id.model));
        let mappings = format!(
            "{}:kv:block:{}@*",
            self.id.engine.as_str(),
            glob_escape(&self.id.pod)
        );
        for (pattern, mapping) in [(blocks, false), (mappings, true)] {
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(100)
                    .query_async(conn)
                    .await?;
                if !keys.is_empty() {
                    let mut pipe = redis::pipe();
                    for k in &keys {
                        if mapping {
                            pipe.cmd("DEL").arg(k).ignore();
                        } else {
                            pipe.cmd("HDEL").arg(k).arg(&self.id.pod).ignore();
                        }
                    }
                    pipe.query_async::<()>(conn).await?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        self.mapping.clear();
        Ok(())
    }

    /// Clears the pod's fields, retrying like [`Writer::apply`].
    async fn clear_retrying(&mut self, store: &KvStore, shutdown: &CancellationToken) {
        self.apply(store, &KvEvent::AllBlocksCleared, shutdown)
            .await;
    }

    /// Removes the pod's field from every block it knows the engine holds, and their mapping
    /// keys, [`RELEASE_BATCH`] blocks per pipeline; a batch that fails (Redis down or not yet
    /// reconnected) is retried with backoff. Returns how many blocks were released; the caller
    /// bounds it in time, and what is left stays until the router's GC.
    pub async fn release(&mut self, store: &KvStore) -> usize {
        let mut released = 0;
        let blocks: Vec<(EngineBlockHash, StdBlockHash)> =
            self.mapping.iter().map(|(&e, &s)| (e, s)).collect();
        for batch in blocks.chunks(RELEASE_BATCH) {
            let mut pipe = redis::pipe();
            for &(engine, std) in batch {
                pipe.cmd("HDEL")
                    .arg(block_key(&self.id.model, std))
                    .arg(&self.id.pod)
                    .ignore();
                pipe.cmd("DEL").arg(self.mapping_key(engine)).ignore();
            }
            let mut backoff = Backoff::new();
            loop {
                let Some(mut conn) = store.connection() else {
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                };
                match pipe.query_async::<()>(&mut conn).await {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "kv-relay: releasing the pod's blocks failed; retrying");
                        store.failed();
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
            }
            for (engine, _) in batch {
                self.mapping.remove(engine);
            }
            released += batch.len();
            self.counts.released_blocks = released as u64;
        }
        released
    }
}

/// Blocks per pipeline when the relay releases its pod's blocks at shutdown.
const RELEASE_BATCH: usize = 512;

/// `*`, `?`, `[`, `]` and `\` escaped for a `SCAN MATCH` pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Runs the relay until `shutdown`: the subscriber in a task, the writer here; then releases
/// the pod's blocks within `release` (zero: keeps them).
pub async fn run(
    id: RelayIdentity,
    events: SubscriberConfig,
    store: KvStore,
    shutdown: CancellationToken,
    release: Duration,
) -> RelayCounts {
    let (tx, mut rx) = mpsc::channel(1024);
    let subscriber = Subscriber::new(events);
    let stats = subscriber.stats();
    let sub = tokio::spawn(subscriber.run(tx, shutdown.clone()));
    let mut writer = Writer::new(id);
    let mut report = tokio::time::interval(Duration::from_secs(60));
    report.tick().await;
    loop {
        let update = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = report.tick() => {
                log_counts(&writer.counts, &stats);
                continue;
            }
            u = rx.recv() => match u {
                Some(u) => u,
                None => break,
            },
        };
        match update {
            Update::Connected => tracing::info!("kv-relay: subscribed to the engine's KV events"),
            Update::Disconnected => {
                writer.counts.disconnects += 1;
                tracing::warn!("kv-relay: lost the engine's KV events; reconnecting");
            }
            Update::Reset { reason } => {
                writer.counts.resets += 1;
                tracing::warn!(
                    reason = reason.as_str(),
                    "kv-relay: events lost; clearing the pod's blocks"
                );
                writer.clear_retrying(&store, &shutdown).await;
            }
            Update::Batch { batch, .. } => {
                for event in &batch.events {
                    writer.apply(&store, event, &shutdown).await;
                }
            }
        }
    }
    let _ = sub.await;
    if !release.is_zero() {
        let known = writer.mapping.len();
        match tokio::time::timeout(release, writer.release(&store)).await {
            Ok(n) => tracing::info!(blocks = n, "kv-relay: released the pod's blocks"),
            Err(_) => tracing::warn!(
                left = writer.mapping.len(),
                known,
                seconds = release.as_secs_f64(),
                "kv-relay: releasing the pod's blocks took too long; the rest stay until the router's GC"
            ),
        }
    }
    log_counts(&writer.counts, &stats);
    writer.counts
}

fn log_counts(c: &RelayCounts, stats: &crate::kv_events::SubscriberStats) {
    use std::sync::atomic::Ordering::Relaxed;
    tracing::info!(
        stored_blocks = c.stored_blocks,
        removed_blocks = c.removed_blocks,
        unknown_removed = c.unknown_removed,
        skipped_events = c.skipped_events,
        clears = c.clears,
        resets = c.resets,
        disconnects = c.disconnects,
        redis_retries = c.redis_retries,
        refused_events = c.refused_events,
        released_blocks = c.released_blocks,
        received = stats.received.load(Relaxed),
        decode_errors = stats.decode_errors.load(Relaxed),
        gaps = stats.gaps.load(Relaxed),
        replays = stats.replays.load(Relaxed),
        reconnects = stats.reconnects.load(Relaxed),
        "kv-relay: counts"
    );
}
