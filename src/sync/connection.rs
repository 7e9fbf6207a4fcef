//! Connecting to Redis: one multiplexed connection per role, re-established with capped
//! exponential backoff (100 ms doubling to 5 s, reset after a success).
//!
//! The publisher and the tailer each own a connection, because the tailer's `XREAD BLOCK` would
//! hold up the publisher's batches on a shared one. Connect and disconnect are logged once per
//! transition and mirrored in `prefix_picker_sync_redis_connected{role}`.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionInfo};
use tokio_util::sync::CancellationToken;

use super::metrics::{Role, SyncMetrics};

/// Capped exponential backoff.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// The delay before the next attempt (then doubles, up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// One role's connection to Redis.
pub struct Link {
    client: Client,
    config: AsyncConnectionConfig,
    role: Role,
    shown: String,
    metrics: SyncMetrics,
    conn: Option<MultiplexedConnection>,
    backoff: Backoff,
    failures: u64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("role", &self.role)
            .field("url", &self.shown)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// `response_timeout` bounds every command (it must exceed any `BLOCK` the role uses).
    pub fn new(
        info: ConnectionInfo,
        shown: String,
        role: Role,
        response_timeout: Duration,
        metrics: SyncMetrics,
    ) -> redis::RedisResult<Link> {
        Ok(Link {
            client: Client::open(info)?,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(response_timeout)),
            role,
            shown,
            metrics,
            conn: None,
            backoff: Backoff::new(),
            failures: 0,
        })
    }

    /// The live connection, if any.
    pub fn get(&mut self) -> Option<&mut MultiplexedConnection> {
        self.conn.as_mut()
    }

    /// Connects once (no waiting); `true` when connected.
    pub async fn try_connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        match self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
        {
            Ok(c) => {
                tracing::info!(role = self.role.as_str(), url = %self.shown, "sync: connected to Redis");
                self.conn = Some(c);
                self.backoff.reset();
                self.failures = 0;
                self.metrics.set_connected(self.role, true);
                true
            }
            Err(e) => {
                if self.failures == 0 {
                    tracing::warn!(role = self.role.as_str(), url = %self.shown, error = %e, "sync: cannot connect to Redis; retrying");
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

    /// Drops the connection after a failed command.
    pub fn lost(&mut self, error: &redis::RedisError) {
        if self.conn.take().is_some() {
            tracing::warn!(role = self.role.as_str(), url = %self.shown, %error, "sync: lost the Redis connection; reconnecting");
            self.metrics.set_connected(self.role, false);
        }
    }
}
