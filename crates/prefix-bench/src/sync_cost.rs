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
    let mut config = endpoints_yaml(names.iter().enumerate().map(|(i, n)| {
        (
            n.as_str(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16)),
        )
    }));
    config.push_str("picker: {scrapeIntervalSeconds: 0}\n");
    config.push_str(&format!(
        "sync:\n  redis:\n    url: \"{url}\"\n    stream: \"bench:{{sync}}\"\n"
    ));
    let (picker, admin) = testkit::start_picker(picker_bin, dir.path(), &config, 2)?;
    let admin = admin.to_string();
    let pid = picker.pid();
    let http = reqwest::Client::new();
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    // Idle cost (the tailer blocks in XREAD).
    let idle = Duration::from_secs(2);
    let c0 = cpu_seconds(pid).context("picker cpu")?;
    tokio::time::sleep(idle).await;
    let idle_cpu = (cpu_seconds(pid).context("picker cpu")? - c0) / idle.as_secs_f64();
    let rss_before = rss_mib(pid);

    let params = HashParams {
        block_size_to_hash: 64,
        max_blocks_to_match: 128,
        scheme: prefix_picker::hashing::ChainScheme::Kthena,
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let systems: Vec<Vec<BlockHash>> = (0..8)
        .map(|_| (0..blocks / 2).map(|_| BlockHash(rng.random())).collect())
        .collect();
    let per_tick = (rate / 100).max(1);
    let ticks = (seconds * 100.0) as u64;
    let mut payload_bytes = 0;
    let mut max_lag: f64 = 0.0;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let c1 = cpu_seconds(pid).context("picker cpu")?;
    let mut next_sample = Instant::now();
    for _ in 0..ticks {
        tick.tick().await;
        let mut pipe = redis::pipe();
        for _ in 0..per_tick {
            let mut hashes = systems[rng.random_range(0..systems.len())].clone();
            hashes.extend((hashes.len()..blocks).map(|_| BlockHash(rng.random())));
            let pod = format!("default/{}", names[rng.random_range(0..pods)]);
            let payload = record::encode(1, params, "m", &pod, "", &hashes);
            payload_bytes = payload.len();
            pipe.cmd("XADD")
                .arg("bench:{sync}")
                .arg("MAXLEN")
                .arg("~")
                .arg(1_000_000)
                .arg("*")
                .arg(record::FIELD)
                .arg(payload)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
        if Instant::now() >= next_sample {
            let lag = metric(&http, &admin, "prefix_picker_sync_lag_seconds").await;
            max_lag = max_lag.max(lag * 1000.0);
            next_sample = Instant::now() + Duration::from_millis(200);
        }
    }
    let published = per_tick * ticks;
    let last_add = Instant::now();
    let applied = loop {
        let applied = metric(&http, &admin, "prefix_picker_sync_applied_total").await;
        if applied as u64 >= published {
            break applied as u64;
        }
        if last_add.elapsed() > Duration::from_secs(60) {
            bail!("only {applied} of {published} records applied after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drain = last_add.elapsed();
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid).context("picker cpu")? - c1;
    let entries = metric(&http, &admin, "kthena_router_prefix_cache_entries").await;
    let len: u64 = redis::cmd("XLEN")
        .arg("bench:{sync}")
        .query_async(&mut conn)
        .await?;
    let mem: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("bench:{sync}")
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut conn)
        .await?;
    Ok(SyncCost {
        rate,
        seconds,
        blocks,
        pods,
        published,
        applied,
        cpu_cores: cpu / wall,
        cpu_us_per_record: cpu / applied as f64 * 1e6,
        idle_cpu_cores: idle_cpu,
        rss_before_mib: rss_before,
        rss_after_mib: rss_mib(pid),
        index_entries: entries,
        max_lag_ms: max_lag,
        drain_seconds: drain.as_secs_f64(),
        payload_bytes,
        redis_bytes_per_entry: mem as f64 / len.max(1) as f64,
    })
}
