//! A suite row as processes: [`Setup`] says how a router is deployed (Envoy with or without
//! prefix-picker or the no-op processor, a peer router, no router for the oracles), and
//! [`start_cluster_on`] starts it on fresh sims, returning the [`Cluster`] the driver sends its
//! requests to.

use std::path::PathBuf;

use anyhow::Context;
use testkit::{Process, bin_dir, render_envoy};

use super::engines::{EnginePlan, Sims};
use super::event_faults::{EventFault, SilentPublisher, silent_pods};
use super::peer::start_peer;
use super::picker_config::{self, EngineEvents, Pod};
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
        /// Another prefix-picker binary than the suite's own (`suite --baseline-picker`).
        picker_bin: Option<PathBuf>,
    },
    /// Envoy (`envoy/envoy.yaml`) and prefix-picker with `scheduler`, Kthena's kvcache-aware
    /// among its plugins: every sim publishes KV events, a `prefix-picker kv-relay` beside each
    /// writes them to a `redis-server`, which the picker reads (`REDIS_HOST`).
    KvCacheAware { scheduler: String },
    /// Envoy with one of the `envoy/` examples, its ext_proc cluster pointing at the no-op
    /// processor (`prefix-bench noop-ext-proc`) instead of the picker.
    NoopExtProc { file: String },
    /// Envoy with one of the `envoy/` examples, its ext_proc cluster pointing at the routing
    /// floor (`prefix-bench routing-floor`, [`routing_floor`](super::routing_floor)) with
    /// `scheduler` and `picker.affinity` over the row's pods.
    RoutingFloor {
        file: String,
        scheduler: String,
        affinity: Option<serde_json::Value>,
    },
    /// sglang-router (`python -m sglang_router.launch_router`, from its own virtualenv).
    Sglang(PathBuf),
    /// vllm-router (the `vllm-router` console script, from its own virtualenv).
    Vllm(PathBuf),
    /// SMG (`smg launch`, from its own virtualenv); its sims serve `--model model`.
    Smg(PathBuf),
    /// No router: every request pinned to an engine by [`oracle`](super::oracle).
    Oracle,
    /// No router: every request pinned to an engine by
    /// [`placement_search`](super::placement_search), no pod above `load` x the mean request
    /// count ([`CAPPED_ORACLE_LOAD`](super::rows::CAPPED_ORACLE_LOAD) unless `suite
    /// --oracle-load` says otherwise).
    OracleCapped { load: f64 },
}

impl Setup {
    pub fn envoy(file: &str, scheduler: Option<String>) -> Setup {
        Setup::Envoy {
            file: file.into(),
            scheduler,
            affinity: None,
            events: None,
            picker_bin: None,
        }
    }

    /// Whether the row routes Anthropic's `/v1/messages`: every Envoy row (any path) and the
    /// oracles (no router) do; of the peers smg 1.13.0 and vllm-router 0.1.17 do, sglang-router
    /// 0.3.2 does not (no such route: 404; checked 2026-12-07 against model-sim).
    pub fn routes_messages(&self) -> bool {
        !matches!(self, Setup::Sglang(_))
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
    /// The process behind Envoy's ext_proc cluster: prefix-picker, the no-op processor or the
    /// routing floor.
    pub ext_proc: Option<Process>,
    pub envoy: Option<testkit::EnvoyProcess>,
    pub peer: Option<Process>,
    pub url: String,
    pub sim_urls: Vec<String>,
    /// prefix-picker's admin address (its `/metrics`), when the row runs it.
    pub picker_admin: Option<std::net::SocketAddr>,
    /// The config of the prefix-picker behind Envoy (the affinity and Kthena rows), to start it
    /// again mid-run ([`Cluster::restart_picker`]).
    picker_config: Option<String>,
    /// Its binary.
    picker_bin: PathBuf,
    /// The kvcache-aware row's redis-server and relays (killed on drop).
    _kvcache: Option<(super::sync_cost::RedisChild, Vec<Process>)>,
    /// The silent-publisher fault row's publishers, one per pod (stopped on drop).
    _silent: Vec<SilentPublisher>,
    /// The row's logs and config files (removed on drop).
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Stops the prefix-picker behind Envoy and starts it again with the same config on the
    /// same gRPC address (a rollout of the picker: its index and engine views start empty, the
    /// engines stay warm); returns whether there was one to restart.
    pub fn restart_picker(&mut self) -> anyhow::Result<bool> {
        let (Some(config), Some(old)) = (&self.picker_config, self.ext_proc.take()) else {
            return Ok(false);
        };
        let grpc = old.addr;
        drop(old);
        let (p, admin) =
            testkit::restart_picker_on(&self.picker_bin, self.dir.path(), config, 2, grpc)?;
        self.ext_proc = Some(p);
        self.picker_admin = Some(admin);
        Ok(true)
    }
}

/// Starts `setup` on [`SIMS`](super::engines::SIMS) plain sims with `sim_args`.
pub async fn start_cluster(setup: &Setup, sim_args: &[String]) -> anyhow::Result<Cluster> {
    start_cluster_on(setup, EnginePlan::plain(sim_args)).await
}

/// Starts the sims of `engines` and, in front of them, the router of `setup`: Envoy (with
/// prefix-picker, the kvcache-aware picker and its relays, or the no-op processor), a peer
/// router, or nothing for the oracles (the driver sends each pinned request to its engine).
pub async fn start_cluster_on(setup: &Setup, mut engines: EnginePlan) -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let events = engines_for(setup, &mut engines, dir.path())?;
    let sims = engines.start()?;
    let pods = sims.pods();
    let sim_urls: Vec<String> = pods.iter().map(|p| format!("http://{}", p.addr)).collect();
    let picker = match setup {
        Setup::Envoy {
            picker_bin: Some(bin),
            ..
        } => bin.clone(),
        _ => bin_dir().join("prefix-picker"),
    };
    let mut cluster = Cluster {
        url: sim_urls[0].clone(),
        sims,
        ext_proc: None,
        envoy: None,
        peer: None,
        sim_urls,
        picker_admin: None,
        picker_config: None,
        picker_bin: picker.clone(),
        _kvcache: None,
        _silent: Vec::new(),
        dir,
    };
    let (file, ext_proc) = match setup {
        Setup::Oracle | Setup::OracleCapped { .. } => return Ok(cluster),
        Setup::Sglang(_) | Setup::Vllm(_) | Setup::Smg(_) => {
            let (process, url) = start_peer(setup, cluster.dir.path(), &cluster.sim_urls).await?;
            cluster.peer = Some(process);
            cluster.url = url;
            return Ok(cluster);
        }
        Setup::KvCacheAware { scheduler } => {
            let p = start_kvcache_aware(&mut cluster, &picker, scheduler, &pods, &engines.model)?;
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
            // The silent-publisher fault: the picker subscribes to publishers that never send.
            let pods = match events.as_ref().and_then(|e| e.fault) {
                Some(EventFault::SilentPublisher) => {
                    let (pods, silent) = silent_pods(&pods).await?;
                    cluster._silent = silent;
                    pods
                }
                _ => pods.clone(),
            };
            let config = picker_config::render_with(
                s,
                &pods,
                affinity.as_ref(),
                events.as_ref(),
                engines.flow_control.as_deref(),
            )?;
            let (p, admin) = testkit::start_picker(&picker, cluster.dir.path(), &config, 2)?;
            cluster.picker_admin = Some(admin);
            cluster.picker_config = Some(config);
            (file.as_str(), Some(p))
        }
        Setup::NoopExtProc { file } => {
            let p = testkit::start_noop_ext_proc(&std::env::current_exe()?, cluster.dir.path())?;
            (file.as_str(), Some(p))
        }
        Setup::RoutingFloor {
            file,
            scheduler,
            affinity,
        } => {
            let config = picker_config::render(scheduler, &pods, affinity.as_ref(), None)?;
            let bench = std::env::current_exe()?;
            let p = testkit::start_routing_floor(&bench, cluster.dir.path(), &config)?;
            (file.as_str(), Some(p))
        }
    };
    start_envoy(&mut cluster, file, ext_proc, &pods).await?;
    Ok(cluster)
}

/// What `setup` asks of the sims beyond `engines`: SMG's model name; for a row on model-sim's
/// tokenizer.json, the file (written into `dir`), which the sims run and the picker's config
/// names; for a fault row, the topic its sims publish on. Returns the row's engine events with
/// that path.
fn engines_for(
    setup: &Setup,
    engines: &mut EnginePlan,
    dir: &std::path::Path,
) -> anyhow::Result<Option<EngineEvents>> {
    if matches!(setup, Setup::Smg(_)) {
        // SMG sends a request only to workers that report its model (`/v1/models`).
        engines
            .args
            .extend(["--model".to_string(), "model".to_string()]);
    }
    match setup {
        Setup::Envoy {
            events: Some(e), ..
        } => {
            let (row, sim_args) = e.with_tokenizer_dir(dir)?;
            engines.args.extend(sim_args);
            engines.topic = e.fault.map_or("", EventFault::engine_topic).to_string();
            Ok(Some(row))
        }
        _ => Ok(None),
    }
}

/// The kvcache-aware row's processes: a `redis-server`, a `prefix-picker kv-relay` per pod
/// writing its KV events there, and the picker (`scheduler`, reading Redis), which it returns.
fn start_kvcache_aware(
    cluster: &mut Cluster,
    picker: &std::path::Path,
    scheduler: &str,
    pods: &[Pod],
    model: &str,
) -> anyhow::Result<Process> {
    let dir = cluster.dir.path();
    let (redis, url) = super::sync_cost::start_redis(dir)?;
    let socket = url.trim_start_matches("redis+unix://").to_string();
    let relays = pods
        .iter()
        .map(|pod| start_relay(picker, dir, pod, model, &socket))
        .collect::<anyhow::Result<Vec<_>>>()?;
    cluster._kvcache = Some((redis, relays));
    let scheduler = scheduler.replace(TOKENIZER_PORT, &pods[0].addr.port().to_string());
    let config = picker_config::render(&scheduler, pods, None, None)?;
    let (p, admin) =
        testkit::start_picker_with_env(picker, dir, &config, 2, &[("REDIS_HOST", &socket)])?;
    cluster.picker_admin = Some(admin);
    Ok(p)
}

/// `prefix-picker kv-relay` for `pod`: its KV events into the Redis at `socket` (log in `dir`).
fn start_relay(
    picker: &std::path::Path,
    dir: &std::path::Path,
    pod: &Pod,
    model: &str,
    socket: &str,
) -> anyhow::Result<Process> {
    let ports = pod
        .kv_events
        .context("the kvcache-aware row's sims publish KV events")?;
    let log = std::fs::File::create(dir.join(format!("relay-{}.log", pod.name)))?;
    let child = std::process::Command::new(picker)
        .args(["kv-relay", "--model", model, "--pod-name", &pod.name])
        .args(["--events-endpoint", &ports.endpoint()])
        .args(["--replay-endpoint", &ports.replay_endpoint()])
        .env("REDIS_HOST", socket)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting prefix-picker kv-relay")?;
    Ok(Process::new(child, pod.addr))
}

/// Envoy with `envoy/<file>` in front of `pods`, its ext_proc cluster on `ext_proc` (the
/// cluster's URL from now on).
async fn start_envoy(
    cluster: &mut Cluster,
    file: &str,
    ext_proc: Option<Process>,
    pods: &[Pod],
) -> anyhow::Result<()> {
    let backends: Vec<_> = pods.iter().map(|p| p.addr).collect();
    // Without an ext_proc (round robin) the example's port 9002 is never dialled.
    let ext_proc_port = ext_proc.as_ref().map_or(9002, |p| p.addr.port());
    cluster.ext_proc = ext_proc;
    let text = std::fs::read_to_string(root().join("envoy").join(file))?;
    let envoy = testkit::start_envoy(
        &envoy_bin()?,
        cluster.dir.path(),
        &render_envoy(&text, ext_proc_port, &backends),
    )
    .await?;
    cluster.url = format!("http://127.0.0.1:{}", envoy.port);
    cluster.envoy = Some(envoy);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::sim_args;

    fn row(events: Option<EngineEvents>) -> Setup {
        Setup::Envoy {
            file: "envoy.yaml".into(),
            scheduler: Some("scheduler: {}\n".into()),
            affinity: None,
            events,
            picker_bin: None,
        }
    }

    #[test]
    fn only_the_topic_mismatch_rows_sims_publish_on_another_topic() {
        let dir = tempfile::tempdir().unwrap();
        let topic = |setup: &Setup| {
            let mut plan = EnginePlan::plain(&sim_args(64, 4));
            plan.kv_events = true;
            engines_for(setup, &mut plan, dir.path()).unwrap();
            plan.topic
        };
        let events = EngineEvents::engine_tokenize;
        assert_eq!(topic(&row(None)), "");
        assert_eq!(topic(&row(Some(events()))), "");
        assert_eq!(
            topic(&row(Some(events().with_fault(EventFault::TopicMismatch)))),
            "kv-events"
        );
        assert_eq!(
            topic(&row(Some(events().with_fault(EventFault::SilentPublisher)))),
            ""
        );
    }
}
