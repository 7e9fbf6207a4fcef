//! Connecting to Redis: one connection per role, re-established with capped exponential backoff
//! (100 ms doubling to 5 s, reset after a success).
//!
//! A [`Connection`] is either a multiplexed connection to one node or, with `cluster: true`, the
//! redis crate's async cluster connection. The cluster connection learns the slot map from the
//! seed nodes (`CLUSTER SLOTS`), keeps a multiplexed connection per primary, routes each command
//! by its key (`XADD`/`EXISTS`/`XINFO STREAM` by the key, `XREAD` by the key after `STREAMS`, a
//! pipeline by its first command), follows `MOVED` (refreshing the slot map) and `ASK`, and
//! retries within the response timeout while a failover settles. Both kinds implement
//! `redis::aio::ConnectionLike`, so the publisher and the tailer run one code path over either.
//!
//! The publisher and the tailer each own a connection (for a cluster: a cluster connection with
//! its own node connections), because the tailer's `XREAD BLOCK` would hold up the publisher's
//! batches on a shared one; each role's response timeout exceeds any `BLOCK` it uses. A command
//! that fails after the cluster connection's own retries drops the whole connection like a
//! node's: the next one is built from the seeds again, so a seed list that survives the loss of
//! any one node (several `urls`, or a name that resolves to live nodes) keeps reconnection
//! possible. A dead connection shows only when used: the tailer uses its own every second
//! (`XREAD BLOCK`), the publisher probes its own when idle ([`Link::probe`]). Connect and
//! disconnect are logged once per transition and mirrored in the role's gauge
//! (`prefix_picker_sync_redis_connected{role}` for sync). kvcache-aware's lookups and
//! `kv-relay` use the same [`Link`] (`crate::kvcache`), as roles of their own.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Value};
use tokio_util::sync::CancellationToken;

use prometheus::{IntCounter, IntGauge};

use super::config::Topology;
pub use crate::backoff::Backoff;

/// How long to wait for a TCP (and TLS) connection to one node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a link reports of itself: its role's name (logs), the log prefix, and the gauges.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// The log lines' prefix (`sync`, `kvcache`).
    pub context: &'static str,
    /// The role's name in logs.
    pub role: &'static str,
    /// 1 while connected.
    pub connected: IntGauge,
    /// Counts each connection made.
    pub reconnects: Option<IntCounter>,
}

impl LinkStatus {
    fn set(&self, up: bool) {
        self.connected.set(i64::from(up));
        if up && let Some(r) = &self.reconnects {
            r.inc();
        }
    }
}

/// A live connection to one node or to a cluster (cheap to clone: both kinds multiplex).
#[derive(Clone)]
pub enum Connection {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// Makes connections of one kind.
enum Connector {
    Node(Client, AsyncConnectionConfig),
    Cluster(ClusterClient),
}

impl Connector {
    async fn connect(&self) -> redis::RedisResult<Connection> {
        match self {
            Connector::Node(client, config) => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Connection::Node),
            Connector::Cluster(client) => {
                client.get_async_connection().await.map(Connection::Cluster)
            }
        }
    }
}

/// One role's connection to Redis.
pub struct Link {
    connector: Connector,
    shown: String,
    status: LinkStatus,
    conn: Option<Connection>,
    backoff: Backoff,
    failures: u64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("role", &self.status.role)
            .field("url", &self.shown)
            .field("cluster", &matches!(self.connector, Connector::Cluster(_)))
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// `response_timeout` bounds every command, for a cluster including its redirections and
    /// retries (it must exceed any `BLOCK` the role uses).
    pub fn new(
        topology: Topology,
        shown: String,
        response_timeout: Duration,
        status: LinkStatus,
    ) -> redis::RedisResult<Link> {
        let connector = match topology {
            Topology::Node(info) => Connector::Node(
                Client::open(*info)?,
                AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(response_timeout)),
            ),
            // Password, username and TLS come from the seeds' connection info (the password is
            // already applied to each) and are used for every node the cluster reports.
            Topology::Cluster(seeds) => Connector::Cluster(
                ClusterClient::builder(seeds)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(response_timeout)
                    .build()?,
            ),
        };
        Ok(Link {
            connector,
            shown,
            status,
            conn: None,
            backoff: Backoff::new(),
            failures: 0,
        })
    }

    /// The live connection, if any.
    pub fn get(&mut self) -> Option<&mut Connection> {
        self.conn.as_mut()
    }

    /// A handle on the live connection for another task (it multiplexes), if any.
    pub fn shared(&self) -> Option<Connection> {
        self.conn.clone()
    }

    /// Connects once (no waiting); `true` when connected.
    pub async fn try_connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        match self.connector.connect().await {
            Ok(c) => {
                tracing::info!(role = self.status.role, url = %self.shown, "{}: connected to Redis", self.status.context);
                self.conn = Some(c);
                self.backoff.reset();
                self.failures = 0;
                self.status.set(true);
                true
            }
            Err(e) => {
                if self.failures == 0 {
                    tracing::warn!(role = self.status.role, url = %self.shown, error = %e, "{}: cannot connect to Redis; retrying", self.status.context);
                }
                self.failures += 1;
                false
            }
        }
    }

    /// Connects, waiting with backoff between attempts; `false` if cancelled first.
    pub async fn connect(&mut self, token: &CancellationToken) -> bool {
        loop {
            if self.try_connect().await {
                return true;
            }
            if !self.pause(token).await {
                return false;
            }
        }
    }

    /// Waits the next backoff delay; `false` if cancelled first.
    pub async fn pause(&mut self, token: &CancellationToken) -> bool {
        let delay = self.backoff.next_delay();
        tokio::select! {
            _ = token.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Checks an idle connection with one keyed command (`EXISTS key`: on a cluster it goes to
    /// the shard owning `key`) and drops the connection if the command fails or takes longer
    /// than `timeout`. A connection whose server died is only found out when used, so an idle
    /// role calls this periodically: the reconnect then starts before the next real command
    /// and the connected gauge tells the truth meanwhile. `true` if still connected.
    pub async fn probe(&mut self, key: &str, timeout: Duration) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return false;
        };
        let mut exists = redis::cmd("EXISTS");
        exists.arg(key);
        let error = match tokio::time::timeout(timeout, exists.query_async::<i64>(conn)).await {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => e,
            Err(_) => redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply to EXISTS within {timeout:?}"),
            )),
        };
        self.lost(&error);
        false
    }

    /// Drops the connection after a failed command.
    pub fn lost(&mut self, error: &redis::RedisError) {
        if self.conn.take().is_some() {
            tracing::warn!(role = self.status.role, url = %self.shown, %error, "{}: lost the Redis connection; reconnecting", self.status.context);
            self.status.set(false);
        }
    }
}
