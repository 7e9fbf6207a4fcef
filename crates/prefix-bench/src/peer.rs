//! The peer routers (sglang-router, vllm-router, SMG) as processes, started from the
//! virtualenvs `bench/run` installed and polled until they route.

use std::time::Duration;

use anyhow::Context;
use testkit::Process;

use super::cluster::Setup;

/// A port that was free a moment ago. The peers cannot bind port 0 and report it, so this small
/// race is accepted in the benchmark (never in tests).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the peer router of `setup` on `sim_urls` (logs in `dir`); returns it and its URL
/// once it is ready (60 s at most).
pub async fn start_peer(
    setup: &Setup,
    dir: &std::path::Path,
    sim_urls: &[String],
) -> anyhow::Result<(Process, String)> {
    let (port, prometheus) = (free_port()?, free_port()?);
    let mut cmd = launcher(setup)?;
    cmd.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--policy",
        "cache_aware",
    ])
    .args([
        "--prometheus-port",
        &prometheus.to_string(),
        "--worker-urls",
    ])
    .args(sim_urls)
    .env("HF_HUB_OFFLINE", "1")
    .stdout(std::fs::File::create(dir.join("peer.log"))?)
    .stderr(std::fs::File::create(dir.join("peer.err"))?);
    let child = cmd.spawn().context("starting the peer router")?;
    let process = Process::new(child, format!("127.0.0.1:{port}").parse()?);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(setup, &url, sim_urls.len(), dir).await?;
    Ok((process, url))
}

/// The peer's launch command, before the options every peer takes.
fn launcher(setup: &Setup) -> anyhow::Result<std::process::Command> {
    Ok(match setup {
        Setup::Sglang(python) => {
            let mut c = std::process::Command::new(python);
            c.args([
                "-m",
                "sglang_router.launch_router",
                "--prometheus-host",
                "127.0.0.1",
            ]);
            c
        }
        Setup::Vllm(bin) => std::process::Command::new(bin),
        Setup::Smg(bin) => {
            let mut c = std::process::Command::new(bin);
            c.args([
                "launch",
                "--prometheus-host",
                "127.0.0.1",
                "--log-level",
                "warn",
            ]);
            c
        }
        Setup::Envoy { .. }
        | Setup::KvCacheAware { .. }
        | Setup::NoopExtProc { .. }
        | Setup::RoutingFloor { .. }
        | Setup::Oracle
        | Setup::OracleCapped { .. } => {
            anyhow::bail!("not a peer")
        }
    })
}

/// What one look at a peer's readiness endpoint saw.
enum Readiness {
    Ready,
    NotReady,
    /// Ready, but no request gets through yet (SMG registers its workers asynchronously).
    NotRouting,
}

/// Polls the peer at `url` until it is ready with its `workers` and routing; fails after 60 s
/// of not being both (logs in `dir`).
async fn wait_ready(
    setup: &Setup,
    url: &str,
    workers: usize,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let start = std::time::Instant::now();
    loop {
        let pause = match readiness(setup, &client, url, workers).await {
            Readiness::Ready => return Ok(()),
            Readiness::NotRouting => Duration::from_millis(100),
            Readiness::NotReady => Duration::from_millis(50),
        };
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "peer router did not become ready and routing in 60 s (see {})",
            dir.display()
        );
        tokio::time::sleep(pause).await;
    }
}

/// The peer's readiness: `/readiness` for sglang-router (which must also count every worker
/// healthy) and SMG (which must also answer a request), `/health` for vllm-router.
async fn readiness(
    setup: &Setup,
    client: &reqwest::Client,
    url: &str,
    workers: usize,
) -> Readiness {
    let ready_path = if matches!(setup, Setup::Sglang(_) | Setup::Smg(_)) {
        "/readiness"
    } else {
        "/health"
    };
    let Ok(r) = client.get(format!("{url}{ready_path}")).send().await else {
        return Readiness::NotReady;
    };
    if !r.status().is_success() {
        return Readiness::NotReady;
    }
    let text = r.text().await.unwrap_or_default();
    let ready = match setup {
        Setup::Sglang(_) => serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| {
            v["status"] == "ready" && v["healthy_workers"].as_u64() == Some(workers as u64)
        }),
        _ => true,
    };
    if !ready {
        Readiness::NotReady
    } else if matches!(setup, Setup::Smg(_)) && !answers(client, url).await {
        Readiness::NotRouting
    } else {
        Readiness::Ready
    }
}

/// Whether a router serves a one-token completion (its workers are registered).
async fn answers(client: &reqwest::Client, url: &str) -> bool {
    let probe = serde_json::json!({"model": "model", "prompt": "ready?", "max_tokens": 1});
    client
        .post(format!("{url}/v1/completions"))
        .json(&probe)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
