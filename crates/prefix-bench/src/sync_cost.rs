//! `prefix-bench sync-apply`: what applying other replicas' records costs a picker.
//!
//! Starts a `redis-server` (unix socket, no persistence) and a release `prefix-picker` child with
//! `pods` static endpoints and `sync.redis` pointing at it, then plays a remote replica: every
//! 10 ms it pipelines `rate / 100` `XADD`s of encoded records (a random pod; `blocks` block
//! hashes, the first half drawn from 8 shared system prefixes, the rest fresh) for `seconds`.
//! Measured on the picker process: CPU seconds (`/proc/<pid>/stat`) over the publishing window
//! and until every record is applied, RSS before and after (`VmRSS`), index entries, the largest
//! `prefix_picker_sync_lag_seconds` seen (sampled every 200 ms, reported in ms), and, on the Redis side,
//! bytes per stream entry (`MEMORY USAGE`) and the payload size.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use prefix_picker::hashing::BlockHash;
use prefix_picker::sync::record::{self, HashParams};
use testkit::{endpoints_yaml, wait_for};

use crate::probe::cpu_seconds;

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SyncCost {
    pub rate: u64,
    pub seconds: f64,
    pub blocks: usize,
    pub pods: usize,
    pub published: u64,
    pub applied: u64,
    /// Picker CPU seconds per wall second while records arrived (1.0 = one core).
    pub cpu_cores: f64,
    /// Picker CPU microseconds per applied record.
    pub cpu_us_per_record: f64,
    pub idle_cpu_cores: f64,
    pub rss_before_mib: f64,
    pub rss_after_mib: f64,
    pub index_entries: f64,
    pub max_lag_ms: f64,
    /// Seconds from the last XADD until everything was applied.
    pub drain_seconds: f64,
    pub payload_bytes: usize,
    pub redis_bytes_per_entry: f64,
}

/// A redis-server child, killed on drop.
#[derive(Debug)]
pub struct RedisChild(Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_bin() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// Starts `redis-server` on a unix socket in `dir` (no persistence); returns it and its URL.
pub fn start_redis(dir: &Path) -> anyhow::Result<(RedisChild, String)> {
    let socket = dir.join("redis.sock");
    let child = Command::new(redis_bin())
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .args(["--save", "", "--appendonly", "no", "--logfile"])
        .arg(dir.join("redis.log"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting redis-server (apt-get install redis-server, or set REDIS_SERVER_BIN)")?;
    wait_for("redis-server socket", Duration::from_secs(10), || {
        socket.exists().then_some(())
    })?;
    Ok((
        RedisChild(child),
        format!("redis+unix://{}", socket.display()),
    ))
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The sum of metric `name`'s samples in the picker's `/metrics` at `admin` (0 when it does
/// not answer).
async fn metric(client: &reqwest::Client, admin: &str, name: &str) -> f64 {
    let Ok(r) = client.get(format!("http://{admin}/metrics")).send().await else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The stream the simulated remote replica publishes to and the picker tails.
const STREAM: &str = "bench:{sync}";

/// Runs the measurement.
pub async fn run(
    picker_bin: &Path,
    rate: u64,
    seconds: f64,
    blocks: usize,
    pods: usize,
) -> anyhow::Result<SyncCost> {
    let dir = tempfile::tempdir()?;
    let (_redis, url) = start_redis(dir.path())?;
    let names: Vec<String> = (0..pods).map(|i| format!("pod-{i}")).collect();
    let config = picker_config(&names, &url);
    let (picker, admin) = testkit::start_picker(picker_bin, dir.path(), &config, 2)?;
    let admin = admin.to_string();
    let pid = picker.pid();
    let http = reqwest::Client::new();
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let idle_cpu = idle_cpu(pid).await?;
    let rss_before = rss_mib(pid);
    let mut remote = Remote::new(names, blocks);
    let started = Instant::now();
    let c1 = cpu_seconds(pid).context("picker cpu")?;
    let published = remote
        .publish(&mut conn, rate, seconds, (&http, &admin))
        .await?;
    let last_add = Instant::now();
    let applied = wait_applied(&http, &admin, published.records, last_add).await?;
    let drain = last_add.elapsed();
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid).context("picker cpu")? - c1;
    let entries = metric(&http, &admin, "kthena_router_prefix_cache_entries").await;
    let (len, mem) = stream_size(&mut conn).await?;
    Ok(SyncCost {
        rate,
        seconds,
        blocks,
        pods,
        published: published.records,
        applied,
        cpu_cores: cpu / wall,
        cpu_us_per_record: cpu / applied as f64 * 1e6,
        idle_cpu_cores: idle_cpu,
        rss_before_mib: rss_before,
        rss_after_mib: rss_mib(pid),
        index_entries: entries,
        max_lag_ms: published.max_lag_ms,
        drain_seconds: drain.as_secs_f64(),
        payload_bytes: published.payload_bytes,
        redis_bytes_per_entry: mem as f64 / len.max(1) as f64,
    })
}

/// The picker's config: `names` as static endpoints (nothing listens there), no scraping, and
/// sync through the Redis at `url`.
fn picker_config(names: &[String], url: &str) -> String {
    let mut config = endpoints_yaml(names.iter().enumerate().map(|(i, n)| {
        (
            n.as_str(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16)),
        )
    }));
    config.push_str("picker: {scrapeIntervalSeconds: 0}\n");
    config.push_str(&format!(
        "sync:\n  redis:\n    url: \"{url}\"\n    stream: \"{STREAM}\"\n"
    ));
    config
}

/// The picker's CPU cores while idle for 2 s (its tailer blocked in XREAD).
async fn idle_cpu(pid: u32) -> anyhow::Result<f64> {
    let idle = Duration::from_secs(2);
    let c0 = cpu_seconds(pid).context("picker cpu")?;
    tokio::time::sleep(idle).await;
    Ok((cpu_seconds(pid).context("picker cpu")? - c0) / idle.as_secs_f64())
}

/// The simulated remote replica: its pods, and the records it makes (seeded).
struct Remote {
    names: Vec<String>,
    blocks: usize,
    params: HashParams,
    rng: SmallRng,
    /// 8 shared system prefixes, `blocks / 2` hashes each.
    systems: Vec<Vec<BlockHash>>,
}

/// What [`Remote::publish`] sent and saw.
struct Published {
    records: u64,
    payload_bytes: usize,
    /// The largest `prefix_picker_sync_lag_seconds` seen, in ms.
    max_lag_ms: f64,
}

impl Remote {
    fn new(names: Vec<String>, blocks: usize) -> Remote {
        let mut rng = SmallRng::seed_from_u64(7);
        let systems = (0..8)
            .map(|_| (0..blocks / 2).map(|_| BlockHash(rng.random())).collect())
            .collect();
        Remote {
            names,
            blocks,
            params: HashParams {
                block_size_to_hash: 64,
                max_blocks_to_match: 128,
                scheme: prefix_picker::hashing::ChainScheme::Kthena,
            },
            rng,
            systems,
        }
    }

    /// A record: a random pod's prompt, a shared system prefix then fresh hashes.
    fn record(&mut self) -> Vec<u8> {
        let rng = &mut self.rng;
        let mut hashes = self.systems[rng.random_range(0..self.systems.len())].clone();
        hashes.extend((hashes.len()..self.blocks).map(|_| BlockHash(rng.random())));
        let pod = format!(
            "default/{}",
            self.names[rng.random_range(0..self.names.len())]
        );
        record::encode(1, self.params, "m", &pod, "", &hashes)
    }

    /// Every 10 ms for `seconds`, pipelines `rate / 100` XADDs of records; samples the
    /// picker's sync lag (at `admin`) every 200 ms.
    async fn publish(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
        rate: u64,
        seconds: f64,
        (http, admin): (&reqwest::Client, &str),
    ) -> anyhow::Result<Published> {
        let per_tick = (rate / 100).max(1);
        let ticks = (seconds * 100.0) as u64;
        let mut out = Published {
            records: per_tick * ticks,
            payload_bytes: 0,
            max_lag_ms: 0.0,
        };
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut next_sample = Instant::now();
        for _ in 0..ticks {
            tick.tick().await;
            let mut pipe = redis::pipe();
            for _ in 0..per_tick {
                let payload = self.record();
                out.payload_bytes = payload.len();
                pipe.cmd("XADD")
                    .arg(STREAM)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(1_000_000)
                    .arg("*")
                    .arg(record::FIELD)
                    .arg(payload)
                    .ignore();
            }
            pipe.query_async::<()>(conn).await?;
            if Instant::now() >= next_sample {
                let lag = metric(http, admin, "prefix_picker_sync_lag_seconds").await;
                out.max_lag_ms = out.max_lag_ms.max(lag * 1000.0);
                next_sample = Instant::now() + Duration::from_millis(200);
            }
        }
        Ok(out)
    }
}

/// Polls the picker until it has applied `published` records; fails 60 s after `last_add`.
async fn wait_applied(
    http: &reqwest::Client,
    admin: &str,
    published: u64,
    last_add: Instant,
) -> anyhow::Result<u64> {
    loop {
        let applied = metric(http, admin, "prefix_picker_sync_applied_total").await;
        if applied as u64 >= published {
            return Ok(applied as u64);
        }
        if last_add.elapsed() > Duration::from_secs(60) {
            bail!("only {applied} of {published} records applied after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stream's entries (`XLEN`) and its bytes in Redis (`MEMORY USAGE`).
async fn stream_size(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(u64, u64)> {
    let len: u64 = redis::cmd("XLEN").arg(STREAM).query_async(conn).await?;
    let mem: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(STREAM)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await?;
    Ok((len, mem))
}
