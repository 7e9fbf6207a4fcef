//! A suite row as processes: [`Setup`] says how a router is deployed (Envoy with or without
//! prefix-picker or the no-op processor, a peer router, no router for the oracles), and
//! [`start_cluster_on`] starts it on fresh sims, returning the [`Cluster`] the driver sends its
//! requests to.

use std::path::PathBuf;

use anyhow::Context;
use testkit::{Process, bin_dir, render_envoy};

use super::engines::{EnginePlan, Sims};
use super::peer::start_peer;
use super::picker_config::{self, EngineEvents};
use super::project::{envoy_bin, root};

/// How one router of the suite is deployed.
#[derive(Debug, Clone)]
pub enum Setup {
    /// Envoy with one of the `envoy/` examples; with prefix-picker when a scheduler is given
    /// (and its `picker.affinity` mapping, when given; reading the engines' KV events, when
    /// `events` is given).
    Envoy {
        file: String,
        scheduler: Option<String>,
        affinity: Option<serde_json::Value>,
        events: Option<EngineEvents>,
    },
    /// Envoy (`envoy/envoy.yaml`) and prefix-picker with `scheduler`, Kthena's kvcache-aware
    /// among its plugins: every sim publishes KV events, a `prefix-picker kv-relay` beside each
    /// writes them to a `redis-server`, which the picker reads (`REDIS_HOST`).
    KvCacheAware { scheduler: String },
    /// Envoy with one of the `envoy/` examples, its ext_proc cluster pointing at the no-op
    /// processor (`prefix-bench noop-ext-proc`) instead of the picker.
    NoopExtProc { file: String },
    /// sglang-router (`python -m sglang_router.launch_router`, from its own virtualenv).
    Sglang(PathBuf),
    /// vllm-router (the `vllm-router` console script, from its own virtualenv).
    Vllm(PathBuf),
    /// SMG (`smg launch`, from its own virtualenv); its sims serve `--model model`.
    Smg(PathBuf),
    /// No router: every request pinned to an engine by [`oracle`](super::oracle).
    Oracle,
    /// No router: every request pinned to an engine by
    /// [`placement_search`](super::placement_search) (pods up to
    /// [`CAPPED_ORACLE_LOAD`](super::rows::CAPPED_ORACLE_LOAD) x the mean load).
    OracleCapped,
}

impl Setup {
    pub fn envoy(file: &str, scheduler: Option<String>) -> Setup {
        Setup::Envoy {
            file: file.into(),
            scheduler,
            affinity: None,
            events: None,
        }
    }

    /// Whether the row's picker reads the engines' KV events (itself, or through Redis).
    pub fn reads_engine_events(&self) -> bool {
        matches!(
            self,
            Setup::Envoy {
                events: Some(_),
                ..
            } | Setup::KvCacheAware { .. }
        )
    }
}

/// Stands for the port of the sim the kvcache-aware row tokenizes on (set per cluster).
pub const TOKENIZER_PORT: &str = "65535";

/// A row's processes, running: its sims and its router (stopped on drop).
pub struct Cluster {
    pub sims: Sims,
    /// The process behind Envoy's ext_proc cluster: prefix-picker or the no-op processor.
    pub ext_proc: Option<Process>,
    pub envoy: Option<testkit::EnvoyProcess>,
    pub peer: Option<Process>,
    pub url: String,
    pub sim_urls: Vec<String>,
    /// prefix-picker's admin address (its `/metrics`), when the row runs it.
    pub picker_admin: Option<std::net::SocketAddr>,
    /// The kvcache-aware row's redis-server and relays (killed on drop).
    _kvcache: Option<(super::sync_cost::RedisChild, Vec<Process>)>,
    _dir: tempfile::TempDir,
}

pub async fn start_cluster(setup: &Setup, sim_args: &[String]) -> anyhow::Result<Cluster> {
    start_cluster_on(setup, EnginePlan::plain(sim_args)).await
}

pub async fn start_cluster_on(setup: &Setup, mut engines: EnginePlan) -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let bins = bin_dir();
    if matches!(setup, Setup::Smg(_)) {
        // SMG sends a request only to workers that report its model (`/v1/models`).
        engines
            .args
            .extend(["--model".to_string(), "model".to_string()]);
    }
    // A row on model-sim's tokenizer.json: the sims run it, the picker's config names it.
    let events = match setup {
        Setup::Envoy {
            events: Some(e), ..
        } => {
            let (row, sim_args) = e.with_tokenizer_dir(dir.path())?;
            engines.args.extend(sim_args);
            Some(row)
        }
        _ => None,
    };
    let sims = engines.start()?;
    let pods = sims.pods();
    let backends: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let sim_urls: Vec<String> = backends.iter().map(|b| format!("http://{b}")).collect();
    let mut picker_admin = None;
    let mut kvcache = None;
    let (file, ext_proc) = match setup {
        Setup::KvCacheAware { scheduler } => {
            let (redis, url) = super::sync_cost::start_redis(dir.path())?;
            let socket = url.trim_start_matches("redis+unix://").to_string();
            let mut relays = Vec::new();
            for pod in &pods {
                let ports = pod
                    .kv_events
                    .context("the kvcache-aware row's sims publish KV events")?;
                let log =
                    std::fs::File::create(dir.path().join(format!("relay-{}.log", pod.name)))?;
                let child = std::process::Command::new(bins.join("prefix-picker"))
                    .args([
                        "kv-relay",
                        "--model",
                        &engines.model,
                        "--pod-name",
                        &pod.name,
                    ])
                    .args(["--events-endpoint", &ports.endpoint()])
                    .args(["--replay-endpoint", &ports.replay_endpoint()])
                    .env("REDIS_HOST", &socket)
                    .env_remove("RUST_LOG")
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
                    .context("starting prefix-picker kv-relay")?;
                relays.push(Process::new(child, pod.addr));
            }
            kvcache = Some((redis, relays));
            let scheduler = scheduler.replace(TOKENIZER_PORT, &pods[0].addr.port().to_string());
            let config = picker_config::render(&scheduler, &pods, None, None)?;
            let (p, admin) = testkit::start_picker_with_env(
                &bins.join("prefix-picker"),
                dir.path(),
                &config,
                2,
                &[("REDIS_HOST", &socket)],
            )?;
            picker_admin = Some(admin);
            ("envoy.yaml", Some(p))
        }
        Setup::Envoy {
            file,
            scheduler: None,
            ..
        } => (file.as_str(), None),
        Setup::Envoy {
            file,
            scheduler: Some(s),
            affinity,
            ..
        } => {
            let config = picker_config::render(s, &pods, affinity.as_ref(), events.as_ref())?;
            let (p, admin) =
                testkit::start_picker(&bins.join("prefix-picker"), dir.path(), &config, 2)?;
            picker_admin = Some(admin);
            (file.as_str(), Some(p))
        }
        Setup::NoopExtProc { file } => {
            let p = testkit::start_noop_ext_proc(&std::env::current_exe()?, dir.path())?;
            (file.as_str(), Some(p))
        }
        Setup::Oracle | Setup::OracleCapped => {
            // No router: the driver sends each (pinned) request straight to its engine.
            return Ok(Cluster {
                url: sim_urls[0].clone(),
                sims,
                ext_proc: None,
                envoy: None,
                peer: None,
                sim_urls,
                picker_admin: None,
                _kvcache: None,
                _dir: dir,
            });
        }
        peer => {
            let (process, url) = start_peer(peer, dir.path(), &sim_urls).await?;
            return Ok(Cluster {
                sims,
                ext_proc: None,
                envoy: None,
                peer: Some(process),
                url,
                sim_urls,
                picker_admin: None,
                _kvcache: None,
                _dir: dir,
            });
        }
    };
    // Without an ext_proc (round robin) the example's port 9002 is never dialled.
    let ext_proc_port = ext_proc.as_ref().map_or(9002, |p| p.addr.port());
    let text = std::fs::read_to_string(root().join("envoy").join(file))?;
    let envoy = testkit::start_envoy(
        &envoy_bin()?,
        dir.path(),
        &render_envoy(&text, ext_proc_port, &backends),
    )
    .await?;
    Ok(Cluster {
        url: format!("http://127.0.0.1:{}", envoy.port),
        sims,
        ext_proc,
        envoy: Some(envoy),
        peer: None,
        sim_urls,
        picker_admin,
        _kvcache: kvcache,
        _dir: dir,
    })
}
