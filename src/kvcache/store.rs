//! One shared Redis connection for kvcache-aware (the router's lookups and GC) or for
//! `kv-relay`, kept by a task around sync's [`Link`]: it connects with sync's backoff
//! (100 ms doubling to 5 s), publishes a handle that every caller clones (the connection
//! multiplexes), probes it every [`PROBE_EVERY`] and whenever a caller reports a failed command,
//! and reconnects when the probe fails. A caller never waits for a connection: without one it
//! gets `None` at once (the request is routed without the plugin's score).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::redis_env::RedisTarget;
use crate::sync::connection::{Connection, Link, LinkStatus};

/// An idle connection is checked this often, so a dead server is found before a request needs it.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The key probed (`EXISTS`; it need not exist).
const PROBE_KEY: &str = "matrix:kv:block:probe";

/// The shared connection (cheap to clone).
#[derive(Clone)]
pub struct KvStore {
    conn: Arc<RwLock<Option<Connection>>>,
    failed: Arc<Notify>,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("connected", &self.conn.read().is_some())
            .finish()
    }
}

impl KvStore {
    /// Starts the keeper task in `tasks`; `response_timeout` bounds each command.
    pub fn start(
        target: RedisTarget,
        response_timeout: Duration,
        status: LinkStatus,
        shutdown: &CancellationToken,
        tasks: &mut JoinSet<anyhow::Result<()>>,
    ) -> anyhow::Result<KvStore> {
        let mut link = Link::new(
            target.topology,
            target.shown.clone(),
            response_timeout,
            status,
        )
        .map_err(|e| anyhow::anyhow!("Redis {}: {e}", target.shown))?;
        let store = KvStore {
            conn: Arc::default(),
            failed: Arc::new(Notify::new()),
        };
        let (keeper, token) = (store.clone(), shutdown.clone());
        tasks.spawn(async move {
            loop {
                if !link.connect(&token).await {
                    return Ok(());
                }
                *keeper.conn.write() = link.shared();
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return Ok(()),
                        _ = keeper.failed.notified() => {}
                        _ = tokio::time::sleep(PROBE_EVERY) => {}
                    }
                    if !link.probe(PROBE_KEY, PROBE_TIMEOUT).await {
                        keeper.conn.write().take();
                        break;
                    }
                }
            }
        });
        Ok(store)
    }

    /// The live connection, if any (never waits).
    pub fn connection(&self) -> Option<Connection> {
        self.conn.read().clone()
    }

    /// A command on the connection failed: have it checked now.
    pub fn failed(&self) {
        self.failed.notify_one();
    }
}
