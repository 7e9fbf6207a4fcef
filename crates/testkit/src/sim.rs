//! A `model-sim` that publishes vLLM KV-cache events and can be restarted on the same ports.
//!
//! First start: HTTP, the PUB socket and the replay ROUTER all on port 0; the sim logs the bound
//! event endpoints on stderr (read here before its stdout address line), so no port is guessed.
//! [`Sim::restart`] kills the process (an engine crash: in-flight requests fail) and starts it
//! again with the same arguments on the ports the first start bound: its cache is empty, its
//! counters and its event sequence start from 0, and a router keeps the same endpoint. The ports
//! are free again the moment the process is gone (the sim's listeners set `SO_REUSEADDR`); one
//! could be taken by another socket in between, which makes the restart fail, never hang. The
//! events' `topic` is vLLM's default (empty) unless started `..._on_topic`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::Process;

/// Where a sim publishes its KV events: `tcp://*:publish` (PUB) and `tcp://*:replay` (ROUTER).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventPorts {
    pub publish: u16,
    pub replay: u16,
}

impl KvEventPorts {
    /// The PUB endpoint as a subscriber on this host dials it.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.publish)
    }

    /// The replay ROUTER endpoint as a subscriber on this host dials it.
    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay)
    }
}

/// A running model-sim with KV events on, restartable on the same ports.
#[derive(Debug)]
pub struct Sim {
    /// `None` only while restarting.
    process: Option<Process>,
    addr: SocketAddr,
    bin: PathBuf,
    name: String,
    args: Vec<String>,
    kv_events: KvEventPorts,
    /// The `topic` of its KV events (vLLM's default: empty).
    topic: String,
}

/// The `--kv-events-config` JSON that binds the PUB and replay sockets on these ports (0: any).
pub fn kv_events_config(publish: u16, replay: u16) -> String {
    kv_events_config_on_topic(publish, replay, "")
}

/// [`kv_events_config`] with the events published on `topic` (vLLM's `topic` key).
pub fn kv_events_config_on_topic(publish: u16, replay: u16, topic: &str) -> String {
    format!(
        r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{publish}", "replay_endpoint": "tcp://*:{replay}", "topic": {}}}"#,
        serde_json::Value::from(topic)
    )
}

impl Sim {
    /// Starts `bin` as sim `name` with `args` (not `--port`, `--name` or `--kv-events-config`),
    /// everything on port 0.
    pub fn start(bin: &Path, name: &str, args: &[String]) -> anyhow::Result<Sim> {
        Sim::start_on_topic(bin, name, args, "")
    }

    /// [`Sim::start`], its KV events published on `topic`.
    pub fn start_on_topic(
        bin: &Path,
        name: &str,
        args: &[String],
        topic: &str,
    ) -> anyhow::Result<Sim> {
        let (process, kv_events) = spawn(bin, name, 0, (0, 0), topic, args)?;
        Ok(Sim {
            addr: process.addr,
            process: Some(process),
            bin: bin.to_path_buf(),
            name: name.to_string(),
            args: args.to_vec(),
            kv_events,
            topic: topic.to_string(),
        })
    }

    /// Starts `n` sims `sim-0..n` with `args`, each seeded with its number (as
    /// [`crate::start_sims`]), plus each sim's `extra` arguments (`extra(i)`).
    pub fn start_n(
        bin: &Path,
        n: usize,
        args: &[String],
        extra: impl Fn(usize) -> Vec<String>,
    ) -> anyhow::Result<Vec<Sim>> {
        Sim::start_n_on_topic(bin, n, args, extra, "")
    }

    /// [`Sim::start_n`], every sim's KV events published on `topic`.
    pub fn start_n_on_topic(
        bin: &Path,
        n: usize,
        args: &[String],
        extra: impl Fn(usize) -> Vec<String>,
        topic: &str,
    ) -> anyhow::Result<Vec<Sim>> {
        (0..n)
            .map(|i| {
                let mut args = args.to_vec();
                args.extend(["--seed".to_string(), i.to_string()]);
                args.extend(extra(i));
                Sim::start_on_topic(bin, &format!("sim-{i}"), &args, topic)
            })
            .collect()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The HTTP address (the same across restarts).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The KV-event ports (the same across restarts).
    pub fn kv_events(&self) -> KvEventPorts {
        self.kv_events
    }

    /// Kills the sim and starts it again on the same ports, with an empty cache.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let port = self.addr.port();
        let ports = (self.kv_events.publish, self.kv_events.replay);
        // Killed and reaped before the new process binds (Process's drop does both).
        self.process = None;
        let (process, kv_events) =
            spawn(&self.bin, &self.name, port, ports, &self.topic, &self.args)
                .with_context(|| format!("restarting {}", self.name))?;
        anyhow::ensure!(
            process.addr.port() == port && kv_events == self.kv_events,
            "{} came back on other ports: {} {kv_events:?}",
            self.name,
            process.addr
        );
        self.process = Some(process);
        Ok(())
    }
}

/// Spawns a sim on `port` with events on `ports`; reads the bound event endpoints (stderr) and
/// the HTTP address (stdout). The rest of its stderr is drained by a thread until it exits.
fn spawn(
    bin: &Path,
    name: &str,
    port: u16,
    ports: (u16, u16),
    topic: &str,
    args: &[String],
) -> anyhow::Result<(Process, KvEventPorts)> {
    let config = kv_events_config_on_topic(ports.0, ports.1, topic);
    let mut child = Command::new(bin)
        .args(["--port", &port.to_string(), "--name", name])
        .args(["--kv-events-config", &config])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut stderr = BufReader::new(child.stderr.take().context("stderr")?);
    let mut events_line = String::new();
    stderr.read_line(&mut events_line)?;
    // Never let a full pipe block the sim's later warnings.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let Some(kv_events) = parse_events_line(&events_line) else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("model-sim {name} printed {events_line:?} on stderr, not its KV-event endpoints");
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let addr = line.rsplit(' ').next().and_then(|a| a.trim().parse().ok());
    let Some(addr) = addr else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("model-sim {name} printed {line:?}");
    };
    Ok((Process::new(child, addr), kv_events))
}

/// The ports of `model-sim NAME publishing KV events on tcp://0.0.0.0:P (replay: tcp://0.0.0.0:Q)`.
fn parse_events_line(line: &str) -> Option<KvEventPorts> {
    let rest = line.split(" publishing KV events on ").nth(1)?;
    let (publish, replay) = rest.split_once(" (replay: ")?;
    let port = |endpoint: &str| endpoint.trim().rsplit(':').next()?.parse().ok();
    Some(KvEventPorts {
        publish: port(publish)?,
        replay: port(replay.trim().trim_end_matches(')'))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_event_ports_are_read_from_the_sims_line() {
        let line = "model-sim sim-0 publishing KV events on tcp://0.0.0.0:41235 (replay: tcp://0.0.0.0:41237)\n";
        assert_eq!(
            parse_events_line(line),
            Some(KvEventPorts {
                publish: 41235,
                replay: 41237
            })
        );
        assert_eq!(
            parse_events_line(
                "model-sim sim-0 publishing KV events on tcp://0.0.0.0:1 (replay: none)"
            ),
            None
        );
        assert_eq!(parse_events_line("model-sim: KV event queue full"), None);
    }

    #[test]
    fn the_config_binds_both_sockets_on_every_interface() {
        let c: serde_json::Value = serde_json::from_str(&kv_events_config(5557, 0)).unwrap();
        assert_eq!(c["endpoint"], "tcp://*:5557");
        assert_eq!(c["replay_endpoint"], "tcp://*:0");
        assert_eq!(c["enable_kv_cache_events"], true);
        assert_eq!(c["topic"], "");
        let c: serde_json::Value =
            serde_json::from_str(&kv_events_config_on_topic(1, 2, "kv-events")).unwrap();
        assert_eq!(
            (c["topic"].as_str(), c["endpoint"].as_str()),
            (Some("kv-events"), Some("tcp://*:1"))
        );
    }
}
