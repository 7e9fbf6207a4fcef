//! `prefix-bench pd`: prefill/decode disaggregation, prefix-picker's `pdGroup` pairs against
//! round-robin pairs, on model-sims in PD roles (`--role prefill|decode`).
//!
//! Each row starts fresh sims: `prefill` prefill sims and `decode` decode sims. The baseline
//! sends request `i` straight to decode sim `i mod decode` naming prefill sim `i mod prefill` in
//! `x-prefiller-host-port` (the pairs a round-robin PD proxy makes). The picker row goes through
//! Envoy (`envoy/envoy.yaml`) and prefix-picker with Kthena's default plugins and a `pdGroup`
//! putting every sim in one group, so the picker pairs freely. The headline is the prefill hit
//! rate: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` over the prefill sims
//! during the run (a decode sim receives the prompt's KV from its peer and computes nothing).

use std::net::SocketAddr;

use serde::Serialize;

use crate::driver::{self, Arrival, Percentiles};
use crate::workload::BenchRequest;

/// What one row measured.
#[derive(Debug, Clone, Serialize)]
pub struct PdRow {
    pub router: String,
    pub requests: usize,
    pub errors: usize,
    /// Over the prefill sims during the run (the headline).
    pub prefill_hit_rate: f64,
    /// Requests each prefill sim prefilled (its TTFT count).
    pub prefill_share: Vec<u64>,
    pub requests_per_s: f64,
    pub ttft_ms: Percentiles,
    pub e2e_ms: Percentiles,
}

/// The config of the picker row: Kthena's default plugins (`scheduler`), the sims labelled by
/// role in one group, `pdGroup`.
pub fn picker_config(scheduler: &str, prefill: &[SocketAddr], decode: &[SocketAddr]) -> String {
    let mut doc = scheduler.to_string();
    doc.push_str("endpoints:\n");
    for (role, addrs) in [("prefill", prefill), ("decode", decode)] {
        for (i, a) in addrs.iter().enumerate() {
            doc.push_str(&format!(
                "- {{name: {role}-{i}, address: \"{a}\", labels: {{role: {role}, group: g0}}}}\n"
            ));
        }
    }
    doc.push_str(
        "pdGroup: {groupKey: group, prefillLabels: {role: prefill}, decodeLabels: {role: decode}}\n\
         picker: {scrapeIntervalSeconds: 0.1}\n",
    );
    doc
}

/// The baseline's requests: each pinned to decode sim `i mod decode` (an index into the decode
/// sims) with prefill sim `i mod prefill` named in the header.
pub fn round_robin_pairs(
    requests: &[BenchRequest],
    prefill: &[SocketAddr],
    decode: usize,
) -> Vec<BenchRequest> {
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut r = r.clone();
            r.pin_to = Some(i % decode.max(1));
            if !prefill.is_empty() {
                r.headers.push((
                    "x-prefiller-host-port",
                    prefill[i % prefill.len()].to_string(),
                ));
            }
            r
        })
        .collect()
}

/// Prefills each prefill sim served so far (`vllm:time_to_first_token_seconds_count`).
async fn served(client: &reqwest::Client, sims: &[String]) -> Vec<u64> {
    let mut out = Vec::with_capacity(sims.len());
    for s in sims {
        let text = match client.get(format!("{s}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let n = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("vllm:time_to_first_token_seconds_count ")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0);
        out.push(n as u64);
    }
    out
}

/// Runs `requests` through `base` (decode sims `decode` for pinned requests), measuring the
/// prefill sims `prefill`.
pub async fn run_row(
    router: &str,
    base: &str,
    prefill: &[String],
    decode: &[String],
    requests: &[BenchRequest],
    concurrency: usize,
) -> PdRow {
    let client = reqwest::Client::new();
    let (h0, q0) = driver::engine_counters(&client, prefill).await;
    let before = served(&client, prefill).await;
    let r = driver::run(
        router,
        "pd",
        base,
        decode,
        requests,
        Arrival::Closed { concurrency },
        0.0,
    )
    .await;
    let (h1, q1) = driver::engine_counters(&client, prefill).await;
    let after = served(&client, prefill).await;
    PdRow {
        router: router.to_string(),
        requests: r.requests,
        errors: r.errors,
        prefill_hit_rate: if q1 > q0 { (h1 - h0) / (q1 - q0) } else { 0.0 },
        prefill_share: after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect(),
        requests_per_s: r.requests_per_s,
        ttft_ms: r.ttft_ms,
        e2e_ms: r.e2e_ms,
    }
}

/// The rows as a markdown table.
pub fn markdown(title: &str, rows: &[PdRow]) -> String {
    let mut md = format!(
        "### {title}\n\n| router | requests (errors) | prefill hit rate | prefills per prefill sim | req/s | TTFT p50 / p99 ms | e2e p50 ms |\n|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let share: Vec<String> = r.prefill_share.iter().map(u64::to_string).collect();
        md.push_str(&format!(
            "| {} | {} ({}) | **{:.1}%** | {} | {:.1} | {:.0} / {:.0} | {:.0} |\n",
            r.router,
            r.requests,
            r.errors,
            100.0 * r.prefill_hit_rate,
            share.join(" / "),
            r.requests_per_s,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.e2e_ms.p50,
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_pairs_alternate_and_name_the_prefill_sim() {
        let prefill: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let requests: Vec<BenchRequest> = (0..4)
            .map(|i| BenchRequest::new("/v1/completions", serde_json::json!({"i": i}), None))
            .collect();
        let pinned = round_robin_pairs(&requests, &prefill, 2);
        let pairs: Vec<(usize, &str)> = pinned
            .iter()
            .map(|r| (r.pin_to.unwrap(), r.headers[0].1.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (0, "127.0.0.1:1"),
                (1, "127.0.0.1:2"),
                (0, "127.0.0.1:1"),
                (1, "127.0.0.1:2")
            ]
        );
        let config = picker_config("", &prefill, &prefill[..1]);
        let parsed: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config).unwrap();
        assert_eq!(parsed["endpoints"].as_sequence().unwrap().len(), 3);
        assert_eq!(parsed["pdGroup"]["groupKey"], "group");
    }
}
