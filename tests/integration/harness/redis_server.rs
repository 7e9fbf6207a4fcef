//! Real `redis-server`s (Debian's, installed by `scripts/test`), no persistence, each polled with
//! PING until it answers; every process is killed when its owner is dropped.
//! - [`RedisServer`]: one server per test on a unix socket in a tempdir (no TCP port). It can be
//!   killed and started again on the same socket (an outage).
//! - [`RedisCluster`]: a Redis Cluster of several primaries on 127.0.0.1 (cluster mode needs TCP),
//!   optionally with `requirepass`. Each node's client and bus ports come from binding port 0;
//!   since another process may take a port between that probe and the server's own bind, a node
//!   whose server exits before answering is started again on fresh ports. The nodes are joined
//!   with `CLUSTER MEET`, the 16384 slots split into contiguous ranges (`CLUSTER ADDSLOTSRANGE`),
//!   and every node is polled until `CLUSTER INFO` says `cluster_state:ok` with all of them known.
//!   A replica can be added to a primary, and a node killed (a failover, with the node timeout
//!   lowered to 2 s so it completes within a test's deadline).

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::poll;

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

/// Starts `redis-server` with its data and log in `dir`, no persistence, plus `args`.
fn spawn(dir: &Path, args: &[OsString]) -> Child {
    Command::new(redis_bin())
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start redis-server")
}

/// `Some(())` once `url` answers PING.
async fn pings(url: &str) -> Option<()> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let pong: String = redis::cmd("PING").query_async(&mut c).await.ok()?;
    (pong == "PONG").then_some(())
}

fn stop(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub struct RedisServer {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
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
        let args: Vec<OsString> = vec![
            "--port".into(),
            "0".into(),
            "--unixsocket".into(),
            self.socket().into(),
            "--unixsocketperm".into(),
            "700".into(),
        ];
        self.child = Some(spawn(self.dir.path(), &args));
        let url = self.url();
        poll("redis-server to answer PING", || pings(&url)).await;
    }

    /// SIGKILL (an outage, not a shutdown).
    pub fn kill(&mut self) {
        stop(&mut self.child);
    }

    /// A connection for inspecting the stream.
    #[expect(
        dead_code,
        reason = "for diagnosing a failing sync test; no test reads it today"
    )]
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    #[expect(
        dead_code,
        reason = "for diagnosing a failing sync test; no test reads it today"
    )]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two distinct ports free right now on 127.0.0.1 (client port below 55536 for redis-server).
fn free_ports() -> (u16, u16) {
    loop {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = TcpListener::bind("127.0.0.1:0").unwrap();
        let (pa, pb) = (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        );
        if pa < 55536 {
            return (pa, pb);
        }
    }
}

/// One primary of a [`RedisCluster`].
pub struct ClusterNode {
    pub dir: PathBuf,
    pub port: u16,
    pub bus_port: u16,
    /// The first and last hash slot assigned to this node at start (see [`RedisCluster::move_slot`]).
    pub slots: (u16, u16),
    child: Option<Child>,
}

pub struct RedisCluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<ClusterNode>,
    password: Option<String>,
}

impl RedisCluster {
    /// `primaries` nodes (at least 1) sharing the 16384 slots in contiguous ranges, node 0 first;
    /// with `password`, every node requires it (`requirepass`, `masterauth`).
    pub async fn start(primaries: usize, password: Option<&str>) -> RedisCluster {
        assert!(primaries >= 1);
        let mut cluster = RedisCluster {
            dir: tempfile::tempdir().unwrap(),
            nodes: Vec::new(),
            password: password.map(str::to_string),
        };
        for i in 0..primaries {
            let first = (16384 * i / primaries) as u16;
            let last = (16384 * (i + 1) / primaries - 1) as u16;
            let node = cluster.start_node(i, (first, last)).await;
            cluster.nodes.push(node);
        }
        let mut first = cluster.connection(0).await;
        for n in &cluster.nodes[1..] {
            let () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(n.port)
                .arg(n.bus_port)
                .query_async(&mut first)
                .await
                .unwrap();
        }
        for i in 0..primaries {
            let (from, to) = cluster.nodes[i].slots;
            let () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(from)
                .arg(to)
                .query_async(&mut cluster.connection(i).await)
                .await
                .unwrap();
        }
        cluster.wait_ok(primaries).await;
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` and knows `known` nodes.
    async fn wait_ok(&self, known: usize) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            let url = self.url_with_password(i);
            poll("the Redis Cluster to be ok on every node", || {
                let url = url.clone();
                async move {
                    let client = redis::Client::open(url).ok()?;
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    let known = format!("cluster_known_nodes:{known}");
                    (info.contains("cluster_state:ok") && info.contains(&known)).then_some(())
                }
            })
            .await;
        }
    }

    /// Starts a replica of node `of` and waits until it is in sync; returns its index.
    pub async fn add_replica(&mut self, of: usize) -> usize {
        let i = self.nodes.len();
        let node = self.start_node(i, self.nodes[of].slots).await;
        let (port, bus_port) = (node.port, node.bus_port);
        self.nodes.push(node);
        let () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(port)
            .arg(bus_port)
            .query_async(&mut self.connection(0).await)
            .await
            .unwrap();
        let master: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut self.connection(of).await)
            .await
            .unwrap();
        // REPLICATE needs the primary to be known to the new node first.
        let url = self.url_with_password(i);
        poll(
            "the new node to learn its primary, then replicate it",
            || {
                let (url, master) = (url.clone(), master.clone());
                async move {
                    let client = redis::Client::open(url).ok()?;
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    redis::cmd("CLUSTER")
                        .arg("REPLICATE")
                        .arg(&master)
                        .query_async::<()>(&mut c)
                        .await
                        .ok()
                }
            },
        )
        .await;
        poll("the replica to be in sync", || {
            let url = url.clone();
            async move {
                let client = redis::Client::open(url).ok()?;
                let mut c = client.get_multiplexed_async_connection().await.ok()?;
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
                    .ok()?;
                info.contains("master_link_status:up").then_some(())
            }
        })
        .await;
        self.wait_ok(self.nodes.len()).await;
        i
    }

    /// SIGKILL node `i` (its replica, if any, takes over after the node timeout).
    pub fn kill(&mut self, i: usize) {
        stop(&mut self.nodes[i].child);
    }

    /// Waits until node `i` is a primary serving `slot` (after a failover), as the first other
    /// running node sees it.
    pub async fn wait_serves(&self, i: usize, slot: u16) {
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut self.connection(i).await)
            .await
            .unwrap();
        let witness = (0..self.nodes.len())
            .find(|&n| n != i && self.nodes[n].child.is_some())
            .expect("another running node");
        let url = self.url_with_password(witness);
        poll("the replica to be promoted", || {
            let (url, id) = (url.clone(), id.clone());
            async move {
                let client = redis::Client::open(url).ok()?;
                let mut c = client.get_multiplexed_async_connection().await.ok()?;
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c)
                    .await
                    .ok()?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut c)
                    .await
                    .ok()?;
                // <id> <addr> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges...>
                let line = nodes.lines().find(|l| l.starts_with(&id))?;
                let fields: Vec<&str> = line.split(' ').collect();
                let serves = fields.get(2)?.contains("master")
                    && fields.get(8..).unwrap_or(&[]).iter().any(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                    });
                (serves && info.contains("cluster_state:ok")).then_some(())
            }
        })
        .await;
    }

    /// Starts node `i` on fresh ports, again on others if the server exits before answering.
    async fn start_node(&self, i: usize, slots: (u16, u16)) -> ClusterNode {
        let dir = self.dir.path().join(format!("node{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        for _attempt in 0..5 {
            let (port, bus_port) = free_ports();
            let _ = std::fs::remove_file(dir.join("nodes.conf"));
            let mut args: Vec<OsString> = vec![
                "--bind".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string().into(),
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-port".into(),
                bus_port.to_string().into(),
                "--cluster-config-file".into(),
                dir.join("nodes.conf").into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
            ];
            if let Some(pw) = &self.password {
                args.extend(["--requirepass".into(), pw.into()]);
                args.extend(["--masterauth".into(), pw.into()]);
            }
            let mut node = ClusterNode {
                child: Some(spawn(&dir, &args)),
                dir: dir.clone(),
                port,
                bus_port,
                slots,
            };
            let url = self.url_for(port, true);
            let up = poll("a cluster node to answer PING or exit", || {
                let url = url.clone();
                let exited = node
                    .child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_some());
                async move {
                    if exited {
                        return Some(false);
                    }
                    pings(&url).await.map(|()| true)
                }
            })
            .await;
            if up {
                return node;
            }
            node.child = None;
        }
        panic!(
            "cluster node {i} did not start; log: {}",
            std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
        );
    }

    fn url_for(&self, port: u16, with_password: bool) -> String {
        match (&self.password, with_password) {
            (Some(pw), true) => format!("redis://:{pw}@127.0.0.1:{port}"),
            _ => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// Node `i`'s URL without the password (what a picker config names as a seed).
    pub fn url(&self, i: usize) -> String {
        self.url_for(self.nodes[i].port, false)
    }

    fn url_with_password(&self, i: usize) -> String {
        self.url_for(self.nodes[i].port, true)
    }

    /// A plain (non-cluster) connection to node `i`, for inspecting what that node holds.
    pub async fn connection(&self, i: usize) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url_with_password(i))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The hash slot of `key` (asked of node 0).
    pub async fn key_slot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut self.connection(0).await)
            .await
            .unwrap()
    }

    /// The index of the node `slot` was assigned to at start.
    pub fn owner(&self, slot: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| (n.slots.0..=n.slots.1).contains(&slot))
            .expect("all slots assigned")
    }

    /// Moves `slot` and its keys from node `from` to node `to`, the way `redis-cli --cluster
    /// reshard` does (IMPORTING/MIGRATING, `MIGRATE`, then `SETSLOT NODE` on every node), so
    /// clients holding the old slot map get `MOVED` (or `ASK` mid-way).
    pub async fn move_slot(&self, slot: u16, from: usize, to: usize) {
        let mut src = self.connection(from).await;
        let mut dst = self.connection(to).await;
        let id = |mut c: redis::aio::MultiplexedConnection| async move {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async::<String>(&mut c)
                .await
                .unwrap()
        };
        let (src_id, dst_id) = (id(src.clone()).await, id(dst.clone()).await);
        let setslot = |state: &str, node: &str| {
            let mut c = redis::cmd("CLUSTER");
            c.arg("SETSLOT").arg(slot).arg(state).arg(node);
            c
        };
        let () = setslot("IMPORTING", &src_id)
            .query_async(&mut dst)
            .await
            .unwrap();
        let () = setslot("MIGRATING", &dst_id)
            .query_async(&mut src)
            .await
            .unwrap();
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query_async(&mut src)
                .await
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5000);
            if let Some(pw) = &self.password {
                migrate.arg("AUTH").arg(pw);
            }
            let () = migrate
                .arg("KEYS")
                .arg(&keys)
                .query_async(&mut src)
                .await
                .unwrap();
        }
        for i in 0..self.nodes.len() {
            let () = setslot("NODE", &dst_id)
                .query_async(&mut self.connection(i).await)
                .await
                .unwrap();
        }
    }

    #[expect(
        dead_code,
        reason = "for diagnosing a failing sync test; no test reads it today"
    )]
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.nodes[i].dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
