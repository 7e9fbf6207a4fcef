//! kvcache-aware's hourly GC (Kthena's `gcStaleFields`): every [`INTERVAL`], one `SCAN` step
//! (`MATCH matrix:kv:block:* COUNT 100`, the cursor kept between runs, as Kthena), each key
//! found read with `HGETALL`, and the owner fields written more than [`FRESH`] ago removed with
//! one pipelined `HDEL` per key. Fields whose value does not parse are left alone (Kthena too).
//! Redis errors are logged at debug level and the next run tries again.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;
use tokio_util::sync::CancellationToken;

use super::KvStore;
use crate::scheduler::kvcache_aware::KEY_PREFIX;

/// How often a GC step runs.
pub const INTERVAL: Duration = Duration::from_secs(3600);
/// Fields older than this are removed (the writer's mapping keys expire alike).
pub const FRESH: Duration = Duration::from_secs(24 * 3600);
/// `SCAN`'s `COUNT`.
pub const SCAN_COUNT: u64 = 100;

/// Runs a GC step every [`INTERVAL`] until `shutdown`.
pub async fn run(store: KvStore, removed: IntCounter, shutdown: CancellationToken) {
    let mut cursor = 0u64;
    let mut tick = tokio::time::interval(INTERVAL);
    tick.tick().await; // the first tick is immediate: Kthena's first run is after an hour
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match step(&store, cursor, now_unix()).await {
            Ok((next, n)) => {
                cursor = next;
                removed.inc_by(n);
            }
            Err(e) => tracing::debug!(error = %e, "KVCacheAware.gcStaleFields: failed"),
        }
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One GC step from `cursor` at time `now`: the next cursor and the fields removed.
pub async fn step(store: &KvStore, cursor: u64, now: i64) -> redis::RedisResult<(u64, u64)> {
    let Some(mut conn) = store.connection() else {
        return Ok((cursor, 0));
    };
    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(format!("{KEY_PREFIX}*"))
        .arg("COUNT")
        .arg(SCAN_COUNT)
        .query_async(&mut conn)
        .await?;
    let mut stale: Vec<(String, Vec<String>)> = Vec::new();
    for key in keys {
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        let old: Vec<String> = fields
            .into_iter()
            .filter(|(_, v)| {
                v.parse::<i64>()
                    .is_ok_and(|w| now.saturating_sub(w) > FRESH.as_secs() as i64)
            })
            .map(|(f, _)| f)
            .collect();
        if !old.is_empty() {
            stale.push((key, old));
        }
    }
    if stale.is_empty() {
        return Ok((next, 0));
    }
    let mut pipe = redis::pipe();
    let mut n = 0;
    for (key, fields) in &stale {
        pipe.cmd("HDEL").arg(key).arg(fields).ignore();
        n += fields.len() as u64;
    }
    pipe.query_async::<()>(&mut conn).await?;
    Ok((next, n))
}
