//! `prefix-bench run`: one workload of the catalogue against a running router; prints the
//! run's result as JSON.

use anyhow::Context;
use prefix_bench::catalogue::{default_trace, workloads};
use prefix_bench::driver::{self, Arrival};
use prefix_bench::workload;

/// Sends workload `name` to `url` (`sims`: the engines' URLs, comma-separated, for the hit
/// rate); `rate` replaces the closed loop of `concurrency` clients with Poisson arrivals.
pub async fn run(
    url: String,
    sims: String,
    name: String,
    concurrency: usize,
    rate: Option<f64>,
    seed: u64,
) -> anyhow::Result<()> {
    let w = workloads(false, seed, &default_trace())?
        .0
        .into_iter()
        .find(|w| w.selected(std::slice::from_ref(&name)))
        .with_context(|| format!("unknown workload {name:?}"))?;
    if w.restarts || !w.caching_off.is_empty() {
        eprintln!(
            "note: `run` neither starts nor restarts the engines: {} sends its requests with no engine disturbed",
            w.key
        );
    }
    // A workload with its own arrival times (trace, ramp) keeps them.
    let arrival = match (rate, w.arrival) {
        (Some(rate), _) => Arrival::Poisson { rate, seed },
        (None, Arrival::Trace) => Arrival::Trace,
        (None, _) => Arrival::Closed { concurrency },
    };
    let sims: Vec<String> = sims
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let ceiling = workload::ceiling_hit_rate(&w.requests, 16);
    let r = driver::run(&url, w.name, &url, &sims, &w.requests, arrival, ceiling).await;
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(())
}
