//! The scrape loop: every interval each pod's `/metrics` fetched (at most `concurrency` at a
//! time), parsed, merged with the pod's previous scrape (signals it lacks keep their values),
//! and stored as the pod's [`EngineStats`]; the index budget resized when the engine's KV
//! capacity changes; pods gone from the set forgotten. While the scheduler's lora-affinity
//! filter is on ([`Endpoints::fetches_served_models`]) each pod's `GET /v1/models` is fetched in
//! the same round (Kthena's `updatePodModels`, `pkg/kthena-router/datastore/store.go`): every
//! `data[].id` becomes the pod's served models; a failed fetch keeps the previous list and
//! logs Kthena's `failed to get models of pod <ns>/<name>: <error>` at debug level.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::names::{Signal, SignalSpecs, Signals};
use super::{
    EngineBudget, RawEngineMetrics, ScrapeConfig, ScrapeError, ScrapeMetrics, parse_with,
    period_mean, start_generation,
};
use crate::endpoints::{Endpoint, Endpoints, EngineStats};
use crate::metrics::{RouterMetrics, ScrapeResult, pod_label_values};
use crate::prefix_index::PodSlot;

async fn fetch(
    client: &reqwest::Client,
    e: &Endpoint,
    names: &SignalSpecs,
) -> Result<RawEngineMetrics, ScrapeError> {
    let text = client
        .get(format!("http://{}/metrics", e.host))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    parse_with(&text, names)
}

/// The ids a `GET /v1/models` answer lists (vLLM's and SGLang's OpenAI shape:
/// `{"data": [{"id": ...}, ...]}`).
pub(super) fn served_models(body: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Model {
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct ModelList {
        #[serde(default)]
        data: Vec<Model>,
    }
    let list: ModelList = serde_json::from_slice(body)?;
    Ok(list.data.into_iter().map(|m| m.id).collect())
}

/// A pod's `GET /v1/models`: the models it serves.
async fn fetch_models(client: &reqwest::Client, e: &Endpoint) -> Result<Vec<String>, String> {
    let response = client
        .get(format!("http://{}/v1/models", e.host))
        .send()
        .await
        .map_err(|err| err.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!(
            "failed to get models from pod {}: HTTP {}",
            e.host,
            status.as_u16()
        ));
    }
    let body = response.bytes().await.map_err(|err| err.to_string())?;
    served_models(&body).map_err(|err| err.to_string())
}

/// A pod's `GET /v1/models` result: its served models set, or Kthena's debug line (the last
/// list kept).
fn record_models(e: &Endpoint, listed: Result<Vec<String>, String>) {
    let changed = match listed {
        Ok(models) => e.set_served_models(models),
        Err(err) => {
            tracing::debug!("failed to get models of pod {}: {err}", e.label);
            false
        }
    };
    if changed {
        tracing::debug!(pod = %e.label, models = ?e.served_models(), "served models changed");
    }
}

/// The signals already warned about, per pod (one warning per pod and signal).
#[derive(Debug, Default)]
pub struct MissingWarnings(HashSet<(PodSlot, Signal)>);

impl MissingWarnings {
    /// The signals of `missing` not yet warned about for `slot` (now recorded as warned).
    pub fn first_seen(&mut self, slot: PodSlot, missing: Signals) -> Signals {
        let mut new = Signals::default();
        for s in missing.iter() {
            if self.0.insert((slot, s)) {
                new.insert(s);
            }
        }
        new
    }

    /// Forgets pods no longer scraped.
    pub fn retain(&mut self, live: impl Fn(PodSlot) -> bool) {
        self.0.retain(|(slot, _)| live(*slot));
    }
}

/// Scrapes every pod until cancelled; `first_round` turns true once every pod was scraped (or
/// failed) once.
pub async fn run(
    endpoints: Arc<Endpoints>,
    metrics: RouterMetrics,
    scrape_metrics: ScrapeMetrics,
    config: ScrapeConfig,
    first_round: watch::Sender<bool>,
    token: CancellationToken,
) {
    let Ok(client) = reqwest::Client::builder().timeout(config.timeout).build() else {
        tracing::error!("cannot build the scrape HTTP client; engine metrics disabled");
        return;
    };
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut scraper = Scraper {
        endpoints,
        metrics,
        scrape_metrics,
        config,
        client,
        previous: HashMap::new(),
        warned: MissingWarnings::default(),
    };
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        scraper.round().await;
        first_round.send_replace(true);
        scraper.forget_gone();
    }
}

/// The scrape loop's state between rounds.
struct Scraper {
    endpoints: Arc<Endpoints>,
    metrics: RouterMetrics,
    scrape_metrics: ScrapeMetrics,
    config: ScrapeConfig,
    client: reqwest::Client,
    /// Each pod's last scrape as read and the stats made of it (the means need both).
    previous: HashMap<PodSlot, (RawEngineMetrics, EngineStats)>,
    warned: MissingWarnings,
}

impl Scraper {
    /// One round: every pod fetched, each result recorded.
    async fn round(&mut self) {
        let set = self.endpoints.snapshot();
        let models = self.endpoints.fetches_served_models();
        let results: Vec<(Arc<Endpoint>, Result<RawEngineMetrics, ScrapeError>)> =
            futures_util::stream::iter(set.all().iter().cloned())
                .map(|e| {
                    let (client, names) = (self.client.clone(), &self.config.names);
                    async move {
                        let (r, listed) = tokio::join!(fetch(&client, &e, names), async {
                            match models {
                                true => Some(fetch_models(&client, &e).await),
                                false => None,
                            }
                        });
                        if let Some(listed) = listed {
                            record_models(&e, listed);
                        }
                        (e, r)
                    }
                })
                .buffer_unordered(self.config.concurrency.max(1))
                .collect()
                .await;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        for (e, result) in results {
            match result {
                Ok(raw) => self.record(e.clone(), raw, now),
                Err(err) => {
                    tracing::debug!(pod = %e.label, error = %err, "engine metrics scrape failed");
                    self.metrics.count_scrape(&e.spec.id, ScrapeResult::Error);
                }
            }
            // A pod that left while the round fetched: its series, just written, go again.
            self.endpoints.forget_if_departed(&e);
        }
    }

    /// A pod's scrape: its generation checked, its stats set, its index budget sized.
    fn record(&mut self, e: Arc<Endpoint>, raw: RawEngineMetrics, now: f64) {
        let e = self.restarted(e, &raw);
        let slot = e.index.slot();
        let prev = self.previous.get(&slot).cloned();
        let prev = prev.as_ref();
        let raw = match prev {
            Some(p) => raw.or_previous(&p.0),
            None => raw,
        };
        if let Some(lora) = &raw.lora {
            e.set_lora(lora.clone());
        }
        self.count_missing(&e, &raw);
        let stats = EngineStats {
            waiting: raw.waiting,
            running: raw.running,
            kv_usage: raw.kv_usage,
            ttft: period_mean(
                prev.map(|p| p.0.ttft),
                raw.ttft,
                prev.map_or(0.0, |p| p.1.ttft),
            ),
            tpot: period_mean(
                prev.map(|p| p.0.tpot),
                raw.tpot,
                prev.map_or(0.0, |p| p.1.tpot),
            ),
        };
        e.set_stats(stats);
        if let Some(on) = raw.prefix_caching {
            // The flag first: once the gauge says so, routing already does.
            let changed = e.set_reuses_cache(on) != on;
            self.metrics
                .engine_prefix_caching
                .with_label_values(&pod_label_values(&e.spec.id))
                .set(i64::from(on));
            if changed && on {
                tracing::info!(pod = %e.label, "engine reports prefix caching on: matched again");
            } else if changed {
                tracing::warn!(pod = %e.label, "engine reports prefix caching off (enable_prefix_caching=\"False\"): the affinity mode matches nothing there and places new work on it only when no pod that reuses its cache is available");
            }
        }
        if let (Some(budget), Some(tokens)) = (self.config.budget, raw.kv_capacity_tokens)
            && prev.is_none_or(|p| p.0.kv_capacity_tokens != Some(tokens))
        {
            apply_budget(&self.endpoints, &self.metrics, &e, budget, tokens);
        }
        self.previous.insert(slot, (raw, stats));
        self.metrics.count_scrape(&e.spec.id, ScrapeResult::Ok);
        self.metrics
            .engine_scrape_timestamp
            .with_label_values(&pod_label_values(&e.spec.id))
            .set(now);
    }

    /// The pod as it now is: a new incarnation when its engine's start time changed.
    fn restarted(&self, e: Arc<Endpoint>, raw: &RawEngineMetrics) -> Arc<Endpoint> {
        let fresh = raw
            .start_time
            .and_then(|t| self.endpoints.engine_started(&e, &start_generation(t)));
        match fresh {
            Some(fresh) => {
                tracing::info!(pod = %fresh.label, generation = %fresh.generation(), "engine restarted (new process_start_time_seconds); the pod starts cold");
                fresh
            }
            None => e,
        }
    }

    /// Counts the signals the scrape lacked; warns of each once per pod.
    fn count_missing(&mut self, e: &Endpoint, raw: &RawEngineMetrics) {
        for s in raw.missing.iter() {
            self.scrape_metrics
                .missing
                .with_label_values(&[s.as_str()])
                .inc();
        }
        for s in self.warned.first_seen(e.index.slot(), raw.missing).iter() {
            tracing::warn!(
                pod = %e.label,
                signal = s.as_str(),
                tried = %self.config.names.describe(s),
                "engine metrics: no series for this signal; it keeps its last value (0 if never read). Set picker.engineMetrics (or GIE's --*-metric flags) to the engine's name"
            );
        }
    }

    /// Forgets pods no longer in the set.
    fn forget_gone(&mut self) {
        let set = self.endpoints.snapshot();
        let live = |slot: PodSlot| set.all().iter().any(|e| e.index.slot() == slot);
        self.previous.retain(|slot, _| live(*slot));
        self.warned.retain(live);
    }
}

/// The most index entries an engine's report sizes a pod's budget to: 2^21 (about 90 MB of
/// index at 42 B an entry; 67 M tokens of KV cache at 4 bytes a token in 128-byte blocks). The
/// report is the engine's word: a larger one is clamped, so no engine can unbound the index.
pub const MAX_ENGINE_BUDGET_ENTRIES: usize = 1 << 21;

/// Sizes `e`'s index budget from its engine's `tokens` of KV cache.
pub(super) fn apply_budget(
    endpoints: &Endpoints,
    metrics: &RouterMetrics,
    e: &Endpoint,
    budget: EngineBudget,
    tokens: u64,
) {
    let reported = budget.affinity.budget_entries(tokens, budget.block_bytes);
    let entries = reported.min(MAX_ENGINE_BUDGET_ENTRIES);
    if entries < reported {
        tracing::warn!(pod = %e.label, engine_tokens = tokens, reported, entries, "the engine reports more KV cache than the index follows; budget clamped");
    }
    let dropped: u64 = endpoints
        .index()
        .set_pod_capacity(e.index.slot(), entries)
        .iter()
        .map(|(_, n)| n)
        .sum();
    metrics
        .pod_budget
        .with_label_values(&pod_label_values(&e.spec.id))
        .set(i64::try_from(entries).unwrap_or(i64::MAX));
    tracing::info!(pod = %e.label, engine_tokens = tokens, entries, dropped, "index budget sized from the engine");
}
