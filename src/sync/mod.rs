//! Sharing the prefix index across replicas through a Redis Stream, and warm start.
//!
//! Each replica keeps routing from its local index; Redis is never called on the decision path.
//! - [`publisher`]: every local record (model, pod, block hashes) is encoded ([`record`]) and
//!   queued without waiting; a task sends batches with `XADD ... MAXLEN ~`. Full queue or Redis
//!   down: records are dropped and counted, routing goes on.
//! - [`tailer`]: a task tails the stream (`XREAD BLOCK` from the last id seen) and applies other
//!   replicas' records ([`apply`]) with the same LRU semantics as a local record.
//! - Warm start: at start-up the tailer replays the retained stream (this replica's earlier
//!   incarnation included, since the replica id is new per process) before the picker reports
//!   ready, for at most `replayTimeoutSeconds`; after a reconnect it reads on from the last id.
//!
//! - Redis Cluster (`cluster: true`): the stream is one key, so it lives on the shard owning its
//!   hash tag's slot; the cluster client ([`connection`]) follows redirections and failovers, and
//!   the publisher and tailer run unchanged over it.
//!
//! Knobs: the `sync.redis` section ([`config`]). Metrics: `prefix_picker_sync_*` ([`metrics`]).
//! Sync sits below the routing seam: it reaches the router only as a [`LocalIndex`] and feeds
//! it a [`RecordSink`] ([`index`]).

pub mod apply;
pub mod config;
pub mod connection;
pub mod index;
pub mod metrics;
pub mod publisher;
pub mod record;
pub mod tailer;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use apply::Applier;
use config::{RedisSync, SyncConfigError};
use connection::Link;
use metrics::{Role, SyncMetrics};
use publisher::{Publisher, Target};
use tailer::Tailer;

pub use config::SyncConfig;
pub use index::{LocalIndex, RecordSink};

/// Why sync could not start.
#[derive(Debug, Error)]
pub enum SyncError {
    #[error(transparent)]
    Config(#[from] SyncConfigError),
    #[error("sync.redis {url}: {source}")]
    Client {
        url: String,
        source: redis::RedisError,
    },
}

/// A started sync; await [`Sync::warm`] before reporting ready.
#[derive(Debug)]
pub struct Sync {
    pub replica: u64,
    /// `None` when `replayOnStart` is off.
    replayed: Option<oneshot::Receiver<()>>,
    timeout: Duration,
}

impl Sync {
    /// Waits for the start-up replay, at most `replayTimeoutSeconds`; `true` if it finished.
    pub async fn warm(self) -> bool {
        let Some(replayed) = self.replayed else {
            return true;
        };
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, replayed).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                tracing::warn!(
                    waited = ?started.elapsed(),
                    "sync: warm replay did not finish in time; serving with a partial index"
                );
                false
            }
        }
    }
}

/// Starts the publisher and tailer tasks and hooks the publisher into the scheduler.
/// `env` looks up environment variables (for `passwordEnv`). The tailer starts once every one of
/// `gates` reads true: records name pods and their generations, so a replay before the pods are
/// listed (Kubernetes discovery) would drop them all, and one before the first engine scrape
/// (static pods without `generation:`) could not tell an earlier life's records.
pub fn start<I: LocalIndex>(
    config: &RedisSync,
    router: &Arc<I>,
    registry: &prometheus::Registry,
    env: &dyn Fn(&str) -> Option<String>,
    gates: Vec<watch::Receiver<bool>>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> Result<Sync, SyncError> {
    // rustls needs one process-wide crypto provider for rediss://; ring is the one linked in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics = SyncMetrics::register(registry);
    let (publish_link, tail_link) = links(config, env, &metrics)?;
    let shown = config.shown_urls();

    let replica: u64 = rand::random();
    let params = router.hash_params();
    let (publisher, rx) = Publisher::new(config.queue_capacity, replica, params, metrics.clone());
    router.set_record_sink(publisher);
    let target = Target {
        stream: config.stream.clone(),
        max_len: config.max_len,
        batch_max_records: config.batch_max_records,
    };
    {
        let (metrics, token) = (metrics.clone(), shutdown.clone());
        tasks.spawn(async move {
            publisher::run(rx, publish_link, target, metrics, token).await;
            Ok(())
        });
    }
    let (tx, replayed) = oneshot::channel();
    let applier = Applier::new(router.clone(), replica, params, metrics.clone());
    let tailer = Tailer::new(
        tail_link,
        config.stream.clone(),
        applier,
        metrics,
        config.replay_on_start,
        tx,
    );
    spawn_tailer(tailer, gates, shutdown.clone(), tasks);
    tracing::info!(
        url = %shown,
        cluster = config.cluster,
        stream = %config.stream,
        replica = format!("{replica:016x}"),
        "sync: sharing the prefix index through Redis"
    );
    Ok(Sync {
        replica,
        replayed: config.replay_on_start.then_some(replayed),
        timeout: config.replay_timeout,
    })
}

/// The publisher's and the tailer's connections. Separate: the tailer's XREAD BLOCK never holds
/// up a publish, and its response timeout (per command, for a cluster including redirections)
/// leaves room for the BLOCK.
fn links(
    config: &RedisSync,
    env: &dyn Fn(&str) -> Option<String>,
    metrics: &SyncMetrics,
) -> Result<(Link, Link), SyncError> {
    let topology = config.topology(env)?;
    let shown = config.shown_urls();
    let link = |role, timeout| {
        Link::new(
            topology.clone(),
            shown.clone(),
            timeout,
            metrics.link_status(role),
        )
        .map_err(|source| SyncError::Client {
            url: shown.clone(),
            source,
        })
    };
    let publish_link = link(Role::Publisher, Duration::from_secs(2))?;
    let tail_link = link(Role::Tailer, tailer::BLOCK + Duration::from_secs(4))?;
    Ok((publish_link, tail_link))
}

/// Runs the tailer once every gate reads true (never, if shut down first).
fn spawn_tailer(
    tailer: Tailer,
    gates: Vec<watch::Receiver<bool>>,
    token: CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    tasks.spawn(async move {
        for mut gate in gates {
            let open = tokio::select! {
                _ = token.cancelled() => false,
                r = gate.wait_for(|open| *open) => r.is_ok(),
            };
            if !open {
                return Ok(());
            }
        }
        tailer.run(token).await;
        Ok(())
    });
}
