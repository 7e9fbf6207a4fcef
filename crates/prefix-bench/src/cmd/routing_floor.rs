//! `prefix-bench routing-floor` (hidden): the routing floor of the overhead table
//! (`prefix_bench::routing_floor`), which `overhead` runs as its own process.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use prefix_bench::routing_floor::{RoutingFloor, service};

/// Serves the floor for the picker config at `config` on `grpc_addr`, saying the bound address
/// on stderr.
pub async fn run(grpc_addr: &str, config: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let floor = Arc::new(RoutingFloor::from_config(&text)?);
    let listener = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("binding {grpc_addr}"))?;
    // `testkit::start_routing_floor` reads this line.
    eprintln!("routing-floor serving grpc_addr={}", listener.local_addr()?);
    service::serve(listener, floor).await
}
