//! A real `redis-server` per test (Debian's, installed by `scripts/test`): a unix socket in a
//! tempdir, no TCP port, no persistence; polled with PING until it answers. It can be killed and
//! started again on the same socket (an outage), and is killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::poll;

pub struct RedisServer {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

/// `$REDIS_SERVER_BIN`, else `redis-server` on PATH. Missing Redis is a failure, never a skip.
fn redis_bin() -> PathBuf {
    if let Ok(p) = std::env::var("REDIS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("redis-server"))
                .find(|p| p.exists())
        })
        .expect("redis-server not found: run scripts/test (it installs Debian's redis-server) or set REDIS_SERVER_BIN")
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        let mut r = RedisServer {
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        r.restart().await;
        r
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The URL pickers use.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// Starts the server (again) on the same socket and waits until it answers PING.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server is already running");
        let child = Command::new(redis_bin())
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        poll("redis-server to answer PING", || {
            let client = client.clone();
            async move {
                let mut c = client.get_multiplexed_async_connection().await.ok()?;
                let pong: String = redis::cmd("PING").query_async(&mut c).await.ok()?;
                (pong == "PONG").then_some(())
            }
        })
        .await;
    }

    /// SIGKILL (an outage, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A connection for inspecting the stream.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
