//! What the scheduler sees of a candidate pod: its prefix-index slot, its load and its engine's
//! last scraped stats and their age. The sidecar's endpoint store implements [`Candidate`] for
//! its pods; the core's tests implement it for plain structs.

use std::sync::Arc;
use std::time::Duration;

use super::affinity::RecentPicks;
use super::latency::PodTiming;
use crate::engine_view::EngineView;
use crate::prefix_index::{PodHandle, PodSlot};

/// Engine metrics last scraped from a pod (missing values are 0).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    pub waiting: f64,
    pub running: f64,
    /// KV-cache usage, 0..1.
    pub kv_usage: f64,
    /// Mean time to first token over the last scrape period, seconds (0 = unknown).
    pub ttft: f64,
    /// Mean time per output token over the last scrape period, seconds (0 = unknown).
    pub tpot: f64,
}

/// An engine's LoRA adapters, from vLLM's `vllm:lora_requests_info` (the latest series):
/// `running_lora_adapters`, `waiting_lora_adapters` (comma-separated) and `max_lora`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraAdapters {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub max: usize,
}

impl LoraAdapters {
    /// What lora-affinity-scorer reads of it for `adapter`.
    pub fn state(&self, adapter: &str) -> LoraState {
        LoraState {
            active: self.running.iter().any(|a| a == adapter),
            waiting: self.waiting.iter().any(|a| a == adapter),
            loaded: self.running.len() + self.waiting.len(),
            max: self.max,
        }
    }
}

/// An engine's LoRA state for one adapter (all false and 0 when the engine exports none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoraState {
    pub active: bool,
    pub waiting: bool,
    /// Adapters running or waiting.
    pub loaded: usize,
    pub max: usize,
}

/// A core view of a candidate pod.
pub trait Candidate {
    /// The pod's slot in the prefix index.
    fn slot(&self) -> PodSlot;
    /// The pod's handle in the prefix index (the affinity mode reads its churn); `None`: the
    /// pod's churn counts as 0.
    fn index_pod(&self) -> Option<&PodHandle> {
        None
    }
    /// Requests picked for this pod and not yet completed (the router's own count).
    fn inflight(&self) -> i64;
    /// Prompt tokens picked for this pod whose prefill is not done yet (llm-d's in-flight
    /// token load: token-load-scorer, prefix-cache-affinity-filter); 0 when not counted.
    fn inflight_tokens(&self) -> u64 {
        0
    }
    /// The engine's last scraped stats.
    fn stats(&self) -> EngineStats;
    /// The engine's last scraped queue (`stats().waiting`), which the affinity mode reads for
    /// every candidate: an implementation may keep it where it reads without a lock.
    fn waiting(&self) -> f64 {
        self.stats().waiting
    }
    /// How long ago those stats were scraped; `None`: never (or unknown).
    fn stats_age(&self) -> Option<Duration> {
        None
    }
    /// The pod's share of recent picks (the affinity mode's balance signal).
    fn recent(&self) -> &RecentPicks;
    /// What the latency model learned of the pod; `None`: nothing (no wait predicted).
    fn timing(&self) -> Option<&PodTiming> {
        None
    }
    /// What the engine holds by its own KV-cache events; `None`: the pod publishes none (the
    /// affinity mode matches it by the estimate, as it does while the view is not live).
    fn engine_view(&self) -> Option<&EngineView> {
        None
    }
    /// Whether the pod's engine reuses its KV cache across requests; `false` when it says it
    /// runs with prefix caching off (the affinity mode then matches nothing there and places
    /// new work on it only when no pod that reuses is available).
    fn reuses_cache(&self) -> bool {
        true
    }
    /// Whether the pod's engine serves `model` (lora-affinity): its `GET /v1/models` listing
    /// at the last fetch names it, by exact string; `false` when it was never listed.
    fn serves_model(&self, model: &str) -> bool {
        let _ = model;
        false
    }
    /// The engine's LoRA state for `adapter` (vLLM's `vllm:lora_requests_info`); the default
    /// when it exports none.
    fn lora_state(&self, adapter: &str) -> LoraState {
        let _ = adapter;
        LoraState::default()
    }
    /// The pod's rendezvous identity, the same on every replica (the affinity mode's ties).
    fn rendezvous(&self) -> u64;
    /// `namespace/name`, as Kthena's score lines name pods.
    fn label(&self) -> &str;
    /// The pod label `key` (PD mode sorts pods by them); `None` when absent.
    fn pod_label(&self, key: &str) -> Option<&str> {
        let _ = key;
        None
    }
    /// The pod's name in the kvcache-aware store, `podName.namespace`; `None`: it owns nothing
    /// there.
    fn cache_owner(&self) -> Option<&str> {
        None
    }
    /// When the pod's containers last started (unix seconds); `None`: unknown (a static
    /// endpoint), and every ownership it has in the kvcache-aware store counts.
    fn containers_started(&self) -> Option<i64> {
        None
    }
}

impl<C: Candidate + ?Sized> Candidate for Arc<C> {
    fn slot(&self) -> PodSlot {
        (**self).slot()
    }

    fn index_pod(&self) -> Option<&PodHandle> {
        (**self).index_pod()
    }

    fn inflight(&self) -> i64 {
        (**self).inflight()
    }

    fn inflight_tokens(&self) -> u64 {
        (**self).inflight_tokens()
    }

    fn stats(&self) -> EngineStats {
        (**self).stats()
    }

    fn waiting(&self) -> f64 {
        (**self).waiting()
    }

    fn stats_age(&self) -> Option<Duration> {
        (**self).stats_age()
    }

    fn recent(&self) -> &RecentPicks {
        (**self).recent()
    }

    fn timing(&self) -> Option<&PodTiming> {
        (**self).timing()
    }

    fn engine_view(&self) -> Option<&EngineView> {
        (**self).engine_view()
    }

    fn reuses_cache(&self) -> bool {
        (**self).reuses_cache()
    }

    fn serves_model(&self, model: &str) -> bool {
        (**self).serves_model(model)
    }

    fn lora_state(&self, adapter: &str) -> LoraState {
        (**self).lora_state(adapter)
    }

    fn rendezvous(&self) -> u64 {
        (**self).rendezvous()
    }

    fn label(&self) -> &str {
        (**self).label()
    }

    fn pod_label(&self, key: &str) -> Option<&str> {
        (**self).pod_label(key)
    }

    fn cache_owner(&self) -> Option<&str> {
        (**self).cache_owner()
    }

    fn containers_started(&self) -> Option<i64> {
        (**self).containers_started()
    }
}
