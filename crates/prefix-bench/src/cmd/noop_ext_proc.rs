//! `prefix-bench noop-ext-proc` (hidden): the no-op external processor of the overhead baseline
//! (`prefix_bench::noop_ext_proc`), which `overhead` runs as its own process.

use anyhow::Context;

/// Serves on `grpc_addr`, saying the bound address on stderr.
pub async fn run(grpc_addr: &str) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("binding {grpc_addr}"))?;
    // `testkit::start_noop_ext_proc` reads this line.
    eprintln!("noop-ext-proc serving grpc_addr={}", listener.local_addr()?);
    prefix_bench::noop_ext_proc::serve(listener).await
}
