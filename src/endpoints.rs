//! The pod set: identities, addresses, in-flight counts and last engine metrics.
//!
//! Discovery arrives as data ([`Update::Reset`], [`Update::Add`], [`Update::Remove`]), so the
//! scheduler never sees files or Kubernetes. The current set is an immutable snapshot behind an
//! `ArcSwap`: readers (every request) load it without a lock; updates build a new snapshot under
//! a writer mutex and swap it in. A pod that leaves (or changes address, or restarts with a new
//! UID) has its prefix-index entries dropped at once (not counted as evictions) and its per-pod
//! metric series removed; a pod that comes back starts cold.
//!
//! Generation (a pod's incarnation, stamped on shared records so that replays skip an earlier
//! life's): the Kubernetes UID, or a static endpoint's `generation:`; for a static endpoint
//! without one, the engine scrape learns it from `process_start_time_seconds`
//! ([`Endpoints::engine_started`]). Learning it the first time keeps the pod's state; a later
//! change is an engine restart, and the pod starts cold as a Kubernetes pod with a new UID does.

mod pattern;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use prometheus::{IntCounter, IntGauge};

use crate::engine_view::EngineView;
use crate::metrics::RouterMetrics;
pub use crate::pod_id::PodId;
use crate::prefix_index::{PodHandle, PodSlot, PrefixIndex};
pub use crate::scheduler::EngineStats;
use crate::scheduler::affinity::{RecentPicks, rendezvous_key};
use crate::scheduler::latency::PodTiming;
use crate::scheduler::{Candidate, LoraAdapters, LoraState, PickError};
pub use pattern::AddressPattern;

/// `Endpoint::containers_started` when discovery knows no start.
const NOT_STARTED: i64 = i64::MIN;

/// The default bound of an engine view, in blocks (`picker.kvEvents.maxBlocksPerPod`).
pub const DEFAULT_MAX_ENGINE_BLOCKS: usize = 1 << 20;

/// What discovery knows of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    pub id: PodId,
    pub address: SocketAddr,
    /// Models served; empty = any model (when no endpoint lists models).
    pub models: Vec<String>,
    /// Changes when the pod restarts (Kubernetes UID, or a static endpoint's `generation:`); a
    /// new value starts the pod cold. Empty: unknown (the engine scrape may learn it).
    pub generation: String,
    /// The value of Kubernetes discovery's deprecated `roleLabel` (it labels a discovery
    /// metric only); `None` = no role.
    pub role: Option<String>,
    /// Pod labels (a static endpoint's `labels:`; of a Kubernetes pod, those `pdGroup` reads):
    /// `pdGroup` sorts pods into prefill and decode by them.
    pub labels: BTreeMap<String, String>,
    /// Where the pod's engine publishes its KV-cache events; `None`: it publishes none and is
    /// matched by the estimate.
    pub kv_events: Option<KvEventsAddress>,
    /// When the pod's containers last started (unix seconds; Kubernetes discovery), so that
    /// kvcache-aware drops ownership written before; `None`: unknown (static endpoints). A
    /// change alone keeps the endpoint, so on an endpoint this is the value it was created
    /// with: read the current one with `Candidate::containers_started`.
    pub containers_started: Option<i64>,
    /// When the pod's engine container last started (Kubernetes discovery): a change starts the
    /// pod cold, as its engine lost its cache. `None`: unknown.
    pub engine_started: Option<i64>,
}

impl EndpointSpec {
    /// The same pod in the same life, whatever its containers' start: a sidecar that restarted
    /// leaves the engine's cache (and the endpoint's state) as it was.
    fn same_life(&self, other: &EndpointSpec) -> bool {
        // Every field named: one added later must be decided on here.
        let EndpointSpec {
            id,
            address,
            models,
            generation,
            role,
            labels,
            kv_events,
            containers_started: _,
            engine_started,
        } = self;
        *id == other.id
            && *address == other.address
            && *models == other.models
            && *generation == other.generation
            && *role == other.role
            && *labels == other.labels
            && *kv_events == other.kv_events
            && *engine_started == other.engine_started
    }
}

/// A pod's KV-event publisher (vLLM's `--kv-events-config` `endpoint` and `replay_endpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsAddress {
    /// `tcp://host:port` of the PUB socket.
    pub endpoint: String,
    /// `tcp://host:port` of the replay ROUTER socket, if it has one.
    pub replay: Option<String>,
}

/// One routable pod.
#[derive(Debug)]
pub struct Endpoint {
    pub spec: EndpointSpec,
    /// `namespace/name`, precomputed for logs and metric labels.
    pub label: String,
    /// `podName.namespace`, kvcache-aware's owner identity (a multi-port pod's endpoints,
    /// named `pod:port`, share their pod's).
    pub cache_owner: String,
    /// `ip:port` (IPv6 bracketed), as Envoy expects it in the pick.
    pub host: String,
    pub index: PodHandle,
    /// `index.slot()`, kept beside the fields the pick reads: the handle is another
    /// allocation, and the slot is read for every candidate of every decision.
    slot: PodSlot,
    inflight: AtomicI64,
    /// Prompt tokens of requests picked for this pod whose prefill is not done (an
    /// `EndpointPickerConfig`'s in-flight token load, [`TokenLoadGuard`]).
    inflight_tokens: AtomicU64,
    /// The engine's last stats and when they were set (`None`: never scraped).
    stats: RwLock<(EngineStats, Option<Instant>)>,
    /// `stats.waiting` (f64 bits), read without the lock: the affinity mode reads it for every
    /// candidate, where the lock's two atomic writes cost a fifth of the request path at 1,024
    /// pods (benches/RESULTS.md, "Cost growth with the pool").
    waiting: AtomicU64,
    /// Whether the engine reuses its KV cache across requests: false once its metrics say it
    /// runs with prefix caching off (true until they say).
    reuses_cache: AtomicBool,
    /// The models the engine's `GET /v1/models` listed at the last successful fetch (base
    /// model and LoRA adapters; lora-affinity's set); `None`: never fetched.
    served_models: RwLock<Option<Box<[String]>>>,
    /// The engine's LoRA adapters at the last scrape that exported them (lora-affinity-scorer).
    lora: RwLock<LoraAdapters>,
    /// Share of recent picks (the affinity mode's balance signal).
    pub recent: RecentPicks,
    /// What the latency model learned of the pod (concurrency from scrapes, service time from
    /// completions).
    pub timing: PodTiming,
    /// The pod's rendezvous identity, the same on every replica (the affinity mode's ties).
    pub rendezvous: u64,
    /// `spec.generation`, or the one the engine scrape learned when that is empty.
    generation: RwLock<Arc<str>>,
    /// `spec.containers_started` as discovery last saw it ([`NOT_STARTED`]: `None`).
    containers_started: AtomicI64,
    /// What the engine holds, by its KV-cache events (pods with `spec.kv_events`, and every pod
    /// when the shared socket is bound).
    pub engine: Option<EngineView>,
    /// The pod's `prefix_picker_pod_inflight_requests` and `prefix_picker_pod_picks_total`
    /// series, looked up when first counted and kept: a request looks no label set up.
    inflight_series: OnceLock<IntGauge>,
    picks_series: OnceLock<IntCounter>,
    /// Set when the pod left the set (not when a new incarnation replaced it), before its
    /// series are removed: a writer that raced the removal removes them again
    /// ([`Endpoints::forget_if_departed`]).
    departed: AtomicBool,
}

impl Endpoint {
    /// Requests picked for this pod and not yet completed (the router's own count).
    pub fn inflight(&self) -> i64 {
        self.inflight.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.read().0
    }

    /// How long ago the stats were set (by the engine scrape); `None`: never.
    pub fn stats_age(&self) -> Option<Duration> {
        self.stats.read().1.map(|at| at.elapsed())
    }

    pub fn set_stats(&self, stats: EngineStats) {
        self.timing
            .observe_engine(stats.running, stats.waiting, stats.kv_usage);
        let mut slot = self.stats.write();
        *slot = (stats, Some(Instant::now()));
        self.waiting
            .store(stats.waiting.to_bits(), Ordering::Relaxed);
    }

    /// Records whether the engine reuses its KV cache (its metrics' `enable_prefix_caching`);
    /// returns what was known before.
    pub fn set_reuses_cache(&self, reuses: bool) -> bool {
        self.reuses_cache.swap(reuses, Ordering::Relaxed)
    }

    /// Records what the engine's `GET /v1/models` listed; returns whether it changed.
    pub fn set_served_models(&self, models: Vec<String>) -> bool {
        let mut slot = self.served_models.write();
        let changed = slot.as_deref() != Some(models.as_slice());
        *slot = Some(models.into());
        changed
    }

    /// Records the engine's LoRA adapters (`vllm:lora_requests_info`).
    pub fn set_lora(&self, lora: LoraAdapters) {
        *self.lora.write() = lora;
    }

    /// What the engine's `GET /v1/models` last listed; `None`: never fetched.
    pub fn served_models(&self) -> Option<Vec<String>> {
        self.served_models.read().as_deref().map(<[String]>::to_vec)
    }

    /// The pod's incarnation (see the module doc); empty while unknown, which matches any.
    pub fn generation(&self) -> Arc<str> {
        self.generation.read().clone()
    }

    pub fn serves(&self, model: &str) -> bool {
        self.spec.models.is_empty() || self.spec.models.iter().any(|m| m == model)
    }

    /// Counts a pick of this pod as primary (`prefix_picker_pod_picks_total`).
    pub fn count_pick(&self, metrics: &RouterMetrics) {
        self.picks_series
            .get_or_init(|| {
                metrics
                    .pod_picks
                    .with_label_values(&crate::metrics::pod_label_values(&self.spec.id))
            })
            .inc();
    }

    /// Picks of this pod as primary so far (what [`Endpoint::count_pick`] counted).
    pub fn picks(&self) -> u64 {
        self.picks_series.get().map_or(0, IntCounter::get)
    }

    /// The pod's `prefix_picker_pod_inflight_requests` series.
    fn inflight_series(&self, metrics: &RouterMetrics) -> &IntGauge {
        self.inflight_series.get_or_init(|| {
            metrics
                .pod_inflight
                .with_label_values(&crate::metrics::pod_label_values(&self.spec.id))
        })
    }
}

impl Candidate for Endpoint {
    fn slot(&self) -> PodSlot {
        self.slot
    }

    fn index_pod(&self) -> Option<&PodHandle> {
        Some(&self.index)
    }

    fn inflight(&self) -> i64 {
        Endpoint::inflight(self)
    }

    fn inflight_tokens(&self) -> u64 {
        self.inflight_tokens.load(Ordering::Relaxed)
    }

    fn stats(&self) -> EngineStats {
        Endpoint::stats(self)
    }

    fn waiting(&self) -> f64 {
        f64::from_bits(self.waiting.load(Ordering::Relaxed))
    }

    fn stats_age(&self) -> Option<Duration> {
        Endpoint::stats_age(self)
    }

    fn recent(&self) -> &RecentPicks {
        &self.recent
    }

    fn timing(&self) -> Option<&PodTiming> {
        Some(&self.timing)
    }

    fn engine_view(&self) -> Option<&EngineView> {
        self.engine.as_ref()
    }

    fn reuses_cache(&self) -> bool {
        self.reuses_cache.load(Ordering::Relaxed)
    }

    fn lora_state(&self, adapter: &str) -> LoraState {
        self.lora.read().state(adapter)
    }

    fn serves_model(&self, model: &str) -> bool {
        let listed = self.served_models.read();
        listed
            .as_deref()
            .is_some_and(|m| m.iter().any(|s| s == model))
    }

    fn rendezvous(&self) -> u64 {
        self.rendezvous
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn cache_owner(&self) -> Option<&str> {
        Some(&self.cache_owner)
    }

    fn containers_started(&self) -> Option<i64> {
        Some(self.containers_started.load(Ordering::Relaxed)).filter(|&t| t != NOT_STARTED)
    }

    fn pod_label(&self, key: &str) -> Option<&str> {
        self.spec.labels.get(key).map(String::as_str)
    }
}

/// A list of pods shared by the snapshot and the decisions made over it (cloned by one
/// reference count).
pub type PodList = Arc<[Arc<Endpoint>]>;

/// Counts one request in flight on a pod until dropped (so aborts never leak a count).
#[derive(Debug)]
pub struct InflightGuard {
    endpoint: Arc<Endpoint>,
    /// The pod's `prefix_picker_pod_inflight_requests` series, decremented on drop without a
    /// lookup: a request that ends after its pod left must not recreate the removed series.
    gauge: IntGauge,
}

impl InflightGuard {
    pub fn new(endpoint: Arc<Endpoint>, metrics: &RouterMetrics) -> InflightGuard {
        endpoint.inflight.fetch_add(1, Ordering::Relaxed);
        let gauge = endpoint.inflight_series(metrics).clone();
        gauge.inc();
        InflightGuard { endpoint, gauge }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.endpoint.inflight.fetch_sub(1, Ordering::Relaxed);
        self.gauge.dec();
    }
}

/// Counts a request's uncached prompt tokens on its pod until dropped: when the response's
/// first body chunk arrives (prefill done), or when the request ends, whichever is first
/// (llm-d's inflight-load-producer without output tokens).
#[derive(Debug)]
pub struct TokenLoadGuard {
    endpoint: Arc<Endpoint>,
    tokens: u64,
}

impl TokenLoadGuard {
    pub fn new(endpoint: Arc<Endpoint>, tokens: u64) -> TokenLoadGuard {
        endpoint
            .inflight_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        TokenLoadGuard { endpoint, tokens }
    }
}

impl Drop for TokenLoadGuard {
    fn drop(&mut self) {
        let tokens = self.tokens;
        // Never below 0, whatever the order of drops.
        let _ =
            self.endpoint
                .inflight_tokens
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some(t.saturating_sub(tokens))
                });
    }
}

/// A discovery event.
#[derive(Debug, Clone)]
pub enum Update {
    /// The complete set (pods not listed are gone).
    Reset(Vec<EndpointSpec>),
    /// A pod added or changed ([`Update::add`]).
    Add(Box<EndpointSpec>),
    Remove(PodId),
}

impl Update {
    pub fn add(spec: EndpointSpec) -> Update {
        Update::Add(Box::new(spec))
    }
}

/// An immutable snapshot of the pod set.
#[derive(Debug, Default)]
pub struct EndpointSet {
    all: PodList,
    by_host: HashMap<SocketAddr, Arc<Endpoint>>,
    /// Whether any endpoint lists the models it serves.
    lists_models: bool,
    /// Per listed model, the pods serving it (in `all` order): built with the snapshot, so a
    /// request's candidates cost its model's pods, not a scan of the pool. Each list is shared
    /// with the decisions made over it: a request's candidates cost one reference count, not
    /// one per pod (cloning and dropping a pod's `Arc` per candidate was 14% of the request
    /// path at 1,024 pods: benches/RESULTS.md, "Cost growth with the pool").
    by_model: HashMap<String, PodList>,
    /// The pods that list no model (they serve any): the candidates of a model no pod lists.
    any_model: PodList,
}

impl EndpointSet {
    /// The snapshot of `all` (sorted), with its look-ups.
    fn new(all: Vec<Arc<Endpoint>>) -> EndpointSet {
        let by_host = all.iter().map(|e| (e.spec.address, e.clone())).collect();
        let lists_models = all.iter().any(|e| !e.spec.models.is_empty());
        let mut by_model: HashMap<String, PodList> = HashMap::new();
        for model in all.iter().flat_map(|e| &e.spec.models) {
            if !by_model.contains_key(model) {
                let pods = all.iter().filter(|e| e.serves(model)).cloned().collect();
                by_model.insert(model.clone(), pods);
            }
        }
        let any_model = all
            .iter()
            .filter(|e| e.spec.models.is_empty())
            .cloned()
            .collect();
        EndpointSet {
            all: all.into(),
            by_host,
            lists_models,
            by_model,
            any_model,
        }
    }

    pub fn all(&self) -> &[Arc<Endpoint>] {
        &self.all
    }

    pub fn by_address(&self, address: &SocketAddr) -> Option<&Arc<Endpoint>> {
        self.by_host.get(address)
    }

    /// Whether any endpoint lists the models it serves.
    pub fn lists_models(&self) -> bool {
        self.lists_models
    }

    /// Pods that may serve `model` (`None`: any pod, no model being known), narrowed to
    /// `restrict` when given.
    pub fn candidates(
        &self,
        model: Option<&str>,
        restrict: Option<&[AddressPattern]>,
    ) -> Result<PodList, PickError> {
        if self.all.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let pods = match model {
            Some(model) if self.lists_models => {
                let pods = self.by_model.get(model).unwrap_or(&self.any_model);
                if pods.is_empty() {
                    return Err(PickError::UnknownModel(model.to_string()));
                }
                pods
            }
            _ => &self.all,
        };
        let Some(allowed) = restrict else {
            return Ok(pods.clone());
        };
        let out: PodList = pods
            .iter()
            .filter(|e| allowed.iter().any(|a| a.matches(&e.spec.address)))
            .cloned()
            .collect();
        if out.is_empty() {
            return Err(PickError::SubsetUnavailable);
        }
        Ok(out)
    }
}

/// The live pod set.
#[derive(Debug)]
pub struct Endpoints {
    current: ArcSwap<EndpointSet>,
    writer: Mutex<()>,
    index: Arc<PrefixIndex>,
    metrics: RouterMetrics,
    /// The bound of each engine view (`picker.kvEvents.maxBlocksPerPod`).
    max_engine_blocks: usize,
    /// Every pod gets an engine view, not only those with a publisher of their own: the shared
    /// socket (`picker.kvEvents.bind`) may feed any.
    views_for_every_pod: bool,
    /// Signalled after every change of the set (the KV-event subscribers follow it).
    changed: tokio::sync::Notify,
    /// Whether the engine scrape also fetches each pod's `GET /v1/models` (the scheduler's
    /// lora-affinity filter reads it); set at start and by each reload.
    fetch_served_models: AtomicBool,
}

impl Endpoints {
    pub fn new(index: Arc<PrefixIndex>, metrics: RouterMetrics) -> Endpoints {
        Endpoints {
            current: ArcSwap::from_pointee(EndpointSet::default()),
            writer: Mutex::new(()),
            index,
            metrics,
            max_engine_blocks: DEFAULT_MAX_ENGINE_BLOCKS,
            views_for_every_pod: false,
            changed: tokio::sync::Notify::new(),
            fetch_served_models: AtomicBool::new(false),
        }
    }

    /// Whether the engine scrape fetches each pod's served models (`GET /v1/models`).
    pub fn fetches_served_models(&self) -> bool {
        self.fetch_served_models.load(Ordering::Relaxed)
    }

    /// Turns the served-models fetch on or off (the scheduler's lora-affinity needs it).
    pub fn set_fetch_served_models(&self, on: bool) {
        self.fetch_served_models.store(on, Ordering::Relaxed);
    }

    /// Bounds each pod's engine view at `blocks` (before any pod is added).
    pub fn with_max_engine_blocks(mut self, blocks: usize) -> Endpoints {
        self.max_engine_blocks = blocks;
        self
    }

    /// Gives every pod an engine view (before any pod is added): the shared KV-event socket
    /// feeds pods that have no publisher of their own.
    pub fn with_engine_views_for_every_pod(mut self, every: bool) -> Endpoints {
        self.views_for_every_pod = every;
        self
    }

    /// Resolves after the next change of the set.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The prefix index the pods are registered in.
    pub fn index(&self) -> &Arc<PrefixIndex> {
        &self.index
    }

    /// The current snapshot (lock-free).
    pub fn snapshot(&self) -> Arc<EndpointSet> {
        self.current.load_full()
    }

    /// Applies a discovery event; returns the pods that left.
    pub fn apply(&self, update: Update) -> Vec<PodId> {
        let _writer = self.writer.lock();
        let old = self.current.load_full();
        let mut specs: Vec<EndpointSpec> = old
            .all
            .iter()
            .map(|e| EndpointSpec {
                containers_started: e.containers_started(),
                ..e.spec.clone()
            })
            .collect();
        match update {
            Update::Reset(new) => specs = new,
            Update::Add(spec) => {
                specs.retain(|s| s.id != spec.id);
                specs.push(*spec);
            }
            Update::Remove(id) => specs.retain(|s| s.id != id),
        }
        // One endpoint per id, the last spec winning (a static endpoint named like a discovered
        // pod): two would share one id, and the one not kept would never be removed.
        let mut seen = HashSet::with_capacity(specs.len());
        let listed = specs.len();
        specs.reverse();
        specs.retain(|s| seen.insert(s.id.clone()));
        specs.reverse();
        if specs.len() < listed {
            tracing::warn!(
                duplicates = listed - specs.len(),
                "pods listed twice under one namespace/name (e.g. a static endpoint named like a discovered pod): the last kept"
            );
        }
        let mut kept: HashMap<&PodId, &Arc<Endpoint>> =
            old.all.iter().map(|e| (&e.spec.id, e)).collect();
        let mut all = Vec::with_capacity(specs.len());
        for spec in specs {
            let endpoint = match kept.get(&spec.id) {
                Some(e) if e.spec.same_life(&spec) => {
                    let e = kept.remove(&spec.id).expect("present").clone();
                    e.containers_started.store(
                        spec.containers_started.unwrap_or(NOT_STARTED),
                        Ordering::Relaxed,
                    );
                    e
                }
                _ => {
                    let generation = spec.generation.as_str().into();
                    self.fresh(spec, generation)
                }
            };
            all.push(endpoint);
        }
        all.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        // Anything left in `kept` is gone (or replaced by a new incarnation).
        let gone: Vec<Arc<Endpoint>> = kept.into_values().cloned().collect();
        self.current.store(Arc::new(EndpointSet::new(all)));
        self.changed.notify_waiters();
        let mut left = Vec::new();
        for e in gone {
            self.index.remove_pod(e.index.slot());
            // Requests in flight may keep the endpoint alive (up to `responseTimeoutSeconds`):
            // its view's blocks are not.
            if let Some(view) = &e.engine {
                view.clear();
            }
            if !self.lists(&e.spec.id) {
                e.departed.store(true, Ordering::SeqCst);
                self.metrics.forget_pod(&e.spec.id);
                left.push(e.spec.id.clone());
            }
        }
        left
    }

    /// Removes `e`'s per-pod series again if it left the set: for writers that read the set
    /// before the pod left and wrote its series after (the engine scrape, the KV-event
    /// consumer). Call after writing.
    pub fn forget_if_departed(&self, e: &Endpoint) {
        if e.departed.load(Ordering::SeqCst) && !self.lists(&e.spec.id) {
            self.metrics.forget_pod(&e.spec.id);
        }
    }

    /// Whether the current set has a pod named `id` (a new incarnation counts).
    fn lists(&self, id: &PodId) -> bool {
        self.current.load().all.iter().any(|n| &n.spec.id == id)
    }

    /// A new pod (or a new life of one): cold, with its own index slot.
    fn fresh(&self, spec: EndpointSpec, generation: Arc<str>) -> Arc<Endpoint> {
        // Kubernetes discovery names a multi-port pod's endpoints `pod:port`.
        let pod_name = spec
            .id
            .name
            .rsplit_once(':')
            .filter(|(_, port)| port.parse::<u16>().is_ok())
            .map_or(spec.id.name.as_str(), |(name, _)| name);
        let index = self.index.add_pod();
        Arc::new(Endpoint {
            slot: index.slot(),
            cache_owner: crate::scheduler::kvcache_aware::owner_id(pod_name, &spec.id.namespace),
            label: spec.id.to_string(),
            host: spec.address.to_string(),
            index,
            inflight: AtomicI64::new(0),
            inflight_tokens: AtomicU64::new(0),
            stats: RwLock::new((EngineStats::default(), None)),
            waiting: AtomicU64::new(EngineStats::default().waiting.to_bits()),
            reuses_cache: AtomicBool::new(true),
            served_models: RwLock::new(None),
            lora: RwLock::new(LoraAdapters::default()),
            recent: RecentPicks::default(),
            timing: PodTiming::default(),
            rendezvous: rendezvous_key(&spec.address),
            generation: RwLock::new(generation),
            containers_started: AtomicI64::new(spec.containers_started.unwrap_or(NOT_STARTED)),
            engine: (spec.kv_events.is_some() || self.views_for_every_pod)
                .then(|| EngineView::new(self.max_engine_blocks)),
            spec,
            inflight_series: OnceLock::new(),
            picks_series: OnceLock::new(),
            departed: AtomicBool::new(false),
        })
    }

    /// The engine scrape read `generation` (from its start time) for `e`. A pod whose spec has
    /// no generation takes it: the first time in place; when it differs from one learned
    /// before (the engine restarted), the pod is replaced by a cold one carrying it, which is
    /// returned. No effect on a pod with a spec generation, or no longer in the set.
    pub fn engine_started(&self, e: &Arc<Endpoint>, generation: &str) -> Option<Arc<Endpoint>> {
        let current = e.generation();
        if !e.spec.generation.is_empty() || *current == *generation {
            return None;
        }
        if current.is_empty() {
            *e.generation.write() = generation.into();
            return None;
        }
        let _writer = self.writer.lock();
        let old = self.current.load_full();
        let position = old.all.iter().position(|x| Arc::ptr_eq(x, e))?;
        let spec = EndpointSpec {
            containers_started: e.containers_started(),
            ..e.spec.clone()
        };
        let fresh = self.fresh(spec, generation.into());
        let mut all = old.all.to_vec();
        all[position] = fresh.clone();
        self.current.store(Arc::new(EndpointSet::new(all)));
        self.changed.notify_waiters();
        self.index.remove_pod(e.index.slot());
        Some(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::BlockHash;
    use crate::prefix_index::ModelKey;

    fn spec(name: &str, port: u16, generation: &str) -> EndpointSpec {
        EndpointSpec {
            id: PodId {
                namespace: "default".into(),
                name: name.into(),
            },
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            models: vec![],
            generation: generation.into(),
            role: None,
            labels: BTreeMap::new(),
            kv_events: None,
            containers_started: None,
            engine_started: None,
        }
    }

    #[test]
    fn reset_add_remove_and_cold_restart() {
        let index = Arc::new(PrefixIndex::new(10));
        let metrics = RouterMetrics::register(&prometheus::Registry::new());
        let eps = Endpoints::new(index.clone(), metrics.clone());
        eps.apply(Update::Reset(vec![spec("a", 1, "1"), spec("b", 2, "1")]));
        let a = eps.snapshot().all()[0].clone();
        index.record(&a.index, ModelKey(1), &[BlockHash(5)]);
        assert_eq!(index.entries(), 1);
        // Unchanged pods keep their state across a reset.
        eps.apply(Update::Reset(vec![spec("a", 1, "1"), spec("b", 2, "1")]));
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a));
        assert_eq!(index.entries(), 1);
        // A restart (new generation) starts cold.
        let left = eps.apply(Update::add(spec("a", 1, "2")));
        assert!(left.is_empty());
        assert_eq!(index.entries(), 0);
        let a2 = eps.snapshot().all()[0].clone();
        assert!(!Arc::ptr_eq(&a2, &a));
        index.record(&a2.index, ModelKey(1), &[BlockHash(5)]);
        let left = eps.apply(Update::Remove(a2.spec.id.clone()));
        assert_eq!(left, std::slice::from_ref(&a2.spec.id));
        assert_eq!(index.entries(), 0);
        assert_eq!(eps.snapshot().all().len(), 1);
        assert!(
            eps.snapshot()
                .by_address(&"127.0.0.1:2".parse().unwrap())
                .is_some()
        );
    }

    #[test]
    fn a_sidecar_restart_keeps_the_pod_warm_an_engine_restart_does_not() {
        let index = Arc::new(PrefixIndex::new(10));
        let eps = Endpoints::new(
            index.clone(),
            RouterMetrics::register(&prometheus::Registry::new()),
        );
        let started = |containers: i64, engine: i64| EndpointSpec {
            containers_started: Some(containers),
            engine_started: Some(engine),
            ..spec("a", 1, "uid")
        };
        eps.apply(Update::Reset(vec![started(10, 10)]));
        let a = eps.snapshot().all()[0].clone();
        index.record(&a.index, ModelKey(1), &[BlockHash(5)]);
        a.inflight.store(3, Ordering::Relaxed);
        // A sidecar restarted: the same endpoint, its entries and requests in flight kept; its
        // containers' start (kvcache-aware's owner cut-off) moves on.
        eps.apply(Update::add(started(20, 10)));
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a));
        assert_eq!((index.entries(), a.inflight()), (1, 3));
        assert_eq!(a.containers_started(), Some(20));
        // Another pod's update neither replaces it nor moves its start back.
        eps.apply(Update::add(spec("b", 2, "uid")));
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a));
        assert_eq!(a.containers_started(), Some(20));
        // The engine restarted: cold.
        eps.apply(Update::add(started(30, 30)));
        assert!(!Arc::ptr_eq(&eps.snapshot().all()[0], &a));
        assert_eq!(index.entries(), 0);
        assert_eq!(eps.snapshot().all()[0].containers_started(), Some(30));
    }

    #[test]
    fn a_pod_listed_twice_is_one_endpoint_and_stays_one_across_updates() {
        // A static endpoint named like a discovered pod: the discovered one (listed last) is
        // kept; each later update once replaced the static copy with a fresh endpoint and a
        // new index slot, and never removed the old one.
        let index = Arc::new(PrefixIndex::new(10));
        let eps = Endpoints::new(
            index.clone(),
            RouterMetrics::register(&prometheus::Registry::new()),
        );
        let both = || vec![spec("a", 1, "static"), spec("a", 2, "discovered")];
        eps.apply(Update::Reset(both()));
        let a = eps.snapshot().all()[0].clone();
        assert_eq!(eps.snapshot().all().len(), 1);
        assert_eq!(a.spec.generation, "discovered");
        index.record(&a.index, ModelKey(1), &[BlockHash(5)]);
        eps.apply(Update::Reset(both()));
        assert!(
            Arc::ptr_eq(&eps.snapshot().all()[0], &a),
            "nothing replaced"
        );
        assert_eq!(index.entries(), 1);
    }

    #[test]
    fn a_pod_that_left_drops_its_engine_view_and_its_late_series() {
        let registry = prometheus::Registry::new();
        let metrics = RouterMetrics::register(&registry);
        let eps = Endpoints::new(Arc::new(PrefixIndex::new(10)), metrics.clone());
        let mut publishing = spec("a", 1, "1");
        publishing.kv_events = Some(KvEventsAddress {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: None,
        });
        eps.apply(Update::Reset(vec![publishing, spec("b", 2, "1")]));
        let [a, b] = [0, 1].map(|i| eps.snapshot().all()[i].clone());
        let view = a.engine.as_ref().expect("a view");
        view.store(None, &[1], &(0..16).collect::<Vec<u32>>(), 16);
        assert_eq!(view.blocks(), 1);
        let series = |pod: &str| {
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == "prefix_picker_engine_scrapes_total")
                .flat_map(|f| f.get_metric().iter())
                .filter(|m| m.get_label().iter().any(|l| l.value() == pod))
                .count()
        };
        eps.apply(Update::Remove(a.spec.id.clone()));
        // Held by a request in flight, the endpoint keeps no blocks.
        assert_eq!(view.blocks(), 0);
        // A scrape that read the set before the pod left writes its series after.
        metrics.count_scrape(&a.spec.id, crate::metrics::ScrapeResult::Ok);
        metrics.count_scrape(&b.spec.id, crate::metrics::ScrapeResult::Ok);
        assert!(series("a") > 0);
        eps.forget_if_departed(&a);
        eps.forget_if_departed(&b);
        assert_eq!(series("a"), 0, "the departed pod's series go again");
        assert!(series("b") > 0, "a pod still there keeps its series");
        // A new incarnation under the same id is no departure.
        eps.apply(Update::add(spec("b", 2, "2")));
        metrics.count_scrape(&b.spec.id, crate::metrics::ScrapeResult::Ok);
        eps.forget_if_departed(&b);
        assert!(series("b") > 0);
    }

    #[test]
    fn a_multi_port_pods_endpoints_share_its_cache_owner() {
        let eps = Endpoints::new(
            Arc::new(PrefixIndex::new(10)),
            RouterMetrics::register(&prometheus::Registry::new()),
        );
        let mut started = spec("vllm-0:8001", 2, "1");
        started.containers_started = Some(42);
        eps.apply(Update::Reset(vec![
            spec("vllm-0:8000", 1, "1"),
            started,
            spec("a:b", 3, "1"),
        ]));
        let snapshot = eps.snapshot();
        let owners: BTreeMap<&str, (Option<&str>, Option<i64>)> = snapshot
            .all()
            .iter()
            .map(|e| {
                let e = e.as_ref();
                (
                    e.spec.id.name.as_str(),
                    (e.cache_owner(), e.containers_started()),
                )
            })
            .collect();
        assert_eq!(owners["vllm-0:8000"], (Some("vllm-0.default"), None));
        assert_eq!(owners["vllm-0:8001"], (Some("vllm-0.default"), Some(42)));
        assert_eq!(
            owners["a:b"],
            (Some("a:b.default"), None),
            "not a port: kept"
        );
    }

    #[test]
    fn candidates_restrict_and_errors() {
        let index = Arc::new(PrefixIndex::new(10));
        let metrics = RouterMetrics::register(&prometheus::Registry::new());
        let eps = Endpoints::new(index, metrics);
        assert_eq!(
            eps.snapshot().candidates(Some("m"), None).unwrap_err(),
            PickError::NoEndpoints
        );
        eps.apply(Update::Reset(vec![
            spec("a", 1, ""),
            spec("b", 2, ""),
            EndpointSpec {
                address: SocketAddr::from(([127, 0, 0, 3], 8000)),
                ..spec("c", 0, "")
            },
        ]));
        let set = eps.snapshot();
        assert_eq!(set.candidates(Some("m"), None).unwrap().len(), 3);
        let only = AddressPattern::parse("127.0.0.1:2").unwrap();
        let c = set.candidates(Some("m"), Some(&[only])).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].label, "default/b");
        let ip_only = AddressPattern::parse("127.0.0.3").unwrap();
        assert_eq!(
            set.candidates(Some("m"), Some(&[ip_only])).unwrap().len(),
            1
        );
        assert_eq!(set.candidates(None, Some(&[ip_only])).unwrap().len(), 1);
        assert_eq!(
            set.candidates(Some("m"), Some(&[])).unwrap_err(),
            PickError::SubsetUnavailable
        );
        // Pods that list models serve those (a pod that lists none serves any).
        let serving = |name, port, model: &str| EndpointSpec {
            models: vec![model.into()],
            ..spec(name, port, "")
        };
        eps.apply(Update::Reset(vec![
            serving("a", 1, "m"),
            serving("b", 2, "x"),
            spec("c", 3, ""),
        ]));
        let set = eps.snapshot();
        assert_eq!(set.candidates(Some("m"), None).unwrap().len(), 2);
        eps.apply(Update::add(serving("c", 3, "x")));
        let set = eps.snapshot();
        assert_eq!(set.candidates(Some("m"), None).unwrap().len(), 1);
        assert_eq!(
            set.candidates(Some("n"), None).unwrap_err(),
            PickError::UnknownModel("n".into())
        );
    }

    /// The per-model lists built with the snapshot give what a scan of the pool gives, in the
    /// pool's order, for listed, unlisted and absent models, after every kind of update.
    #[test]
    fn candidates_per_model_equal_a_scan_of_the_pool() {
        let eps = Endpoints::new(
            Arc::new(PrefixIndex::new(10)),
            RouterMetrics::register(&prometheus::Registry::new()),
        );
        let serving = |name: &str, port, models: &[&str]| EndpointSpec {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..spec(name, port, "")
        };
        let scan = |set: &EndpointSet, model: &str| -> Vec<String> {
            let listed = set.all().iter().any(|e| !e.spec.models.is_empty());
            set.all()
                .iter()
                .filter(|e| !listed || e.serves(model))
                .map(|e| e.label.clone())
                .collect()
        };
        let labels = |set: &EndpointSet, model: &str| -> Vec<String> {
            set.candidates(Some(model), None)
                .map(|c| c.iter().map(|e| e.label.clone()).collect())
                .unwrap_or_default()
        };
        let updates = [
            Update::Reset(vec![spec("d", 4, ""), spec("a", 1, "")]),
            Update::Reset(vec![
                serving("e", 5, &["m", "x"]),
                serving("b", 2, &["x"]),
                spec("c", 3, ""),
                serving("a", 1, &["m"]),
            ]),
            Update::add(serving("c", 3, &["y", "m"])),
            Update::Remove(PodId {
                namespace: "default".into(),
                name: "a".into(),
            }),
            Update::add(spec("f", 6, "")),
        ];
        for update in updates {
            eps.apply(update);
            let set = eps.snapshot();
            for model in ["m", "x", "y", "absent"] {
                assert_eq!(labels(&set, model), scan(&set, model), "model {model}");
            }
        }
    }

    #[test]
    fn the_engine_start_is_learned_in_place_then_a_restart_starts_cold() {
        let index = Arc::new(PrefixIndex::new(10));
        let metrics = RouterMetrics::register(&prometheus::Registry::new());
        let eps = Endpoints::new(index.clone(), metrics);
        eps.apply(Update::Reset(vec![
            spec("a", 1, ""),
            spec("b", 2, "configured"),
        ]));
        let a = eps.snapshot().all()[0].clone();
        let b = eps.snapshot().all()[1].clone();
        index.record(&a.index, ModelKey(1), &[BlockHash(5)]);
        index.record(&b.index, ModelKey(1), &[BlockHash(5)]);
        assert_eq!(&*a.generation(), "");
        // First learned: same pod, same entries.
        assert!(eps.engine_started(&a, "100.5").is_none());
        assert_eq!(&*a.generation(), "100.5");
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a));
        assert!(eps.engine_started(&a, "100.5").is_none());
        assert_eq!(index.entries(), 2);
        // A configured generation is never overridden.
        assert!(eps.engine_started(&b, "7").is_none());
        assert_eq!(&*b.generation(), "configured");
        // Another start time: the engine restarted, the pod starts cold under the new one.
        let a2 = eps.engine_started(&a, "200.25").expect("restarted");
        assert_eq!(&*a2.generation(), "200.25");
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a2));
        assert!(Arc::ptr_eq(
            eps.snapshot().by_address(&a.spec.address).unwrap(),
            &a2
        ));
        assert_eq!(index.pod_entries(a2.index.slot()), 0);
        assert_eq!(index.entries(), 1, "b keeps its entry");
        // The old pod object is gone from the set: nothing more to replace.
        assert!(eps.engine_started(&a, "300").is_none());
        // A discovery reset with the same spec keeps the learned life.
        eps.apply(Update::Reset(vec![
            spec("a", 1, ""),
            spec("b", 2, "configured"),
        ]));
        assert!(Arc::ptr_eq(&eps.snapshot().all()[0], &a2));
    }

    #[test]
    fn inflight_guard_counts_until_dropped() {
        let index = Arc::new(PrefixIndex::new(10));
        let metrics = RouterMetrics::register(&prometheus::Registry::new());
        let eps = Endpoints::new(index, metrics.clone());
        eps.apply(Update::Reset(vec![spec("a", 1, "")]));
        let a = eps.snapshot().all()[0].clone();
        let g1 = InflightGuard::new(a.clone(), &metrics);
        let g2 = InflightGuard::new(a.clone(), &metrics);
        assert_eq!(a.inflight(), 2);
        drop(g1);
        drop(g2);
        assert_eq!(a.inflight(), 0);
        assert_eq!(
            metrics
                .pod_inflight
                .with_label_values(&["a", "default"])
                .get(),
            0
        );
    }

    /// The exported `prefix_picker_pod_inflight_requests` series, by `namespace/pod` (their
    /// labels `model_server_namespace`, `model_server_pod`, in that order once exported).
    fn inflight_series(registry: &prometheus::Registry) -> Vec<(String, i64)> {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "prefix_picker_pod_inflight_requests")
            .flat_map(|f| f.get_metric())
            .map(|m| {
                let labels: Vec<_> = m
                    .get_label()
                    .iter()
                    .map(|l| format!("{}={}", l.name(), l.value()))
                    .collect();
                (labels.join(","), m.get_gauge().get_value() as i64)
            })
            .collect()
    }

    const A_LABELS: &str = "model_server_namespace=default,model_server_pod=a";

    #[test]
    fn a_departed_pods_inflight_series_does_not_come_back() {
        let registry = prometheus::Registry::new();
        let metrics = RouterMetrics::register(&registry);
        let eps = Endpoints::new(Arc::new(PrefixIndex::new(10)), metrics.clone());
        eps.apply(Update::Reset(vec![spec("a", 1, ""), spec("b", 2, "")]));
        let a = eps.snapshot().all()[0].clone();
        let old = InflightGuard::new(a.clone(), &metrics);
        assert_eq!(inflight_series(&registry), [(A_LABELS.to_string(), 1)]);
        eps.apply(Update::Remove(a.spec.id.clone()));
        assert!(
            inflight_series(&registry).is_empty(),
            "removed with the pod"
        );
        // Back, with a request of its own, while the old request is still in flight.
        eps.apply(Update::add(spec("a", 1, "")));
        let a2 = eps.snapshot().all()[0].clone();
        let new = InflightGuard::new(a2, &metrics);
        drop(old);
        assert_eq!(inflight_series(&registry), [(A_LABELS.to_string(), 1)]);
        drop(new);
        assert_eq!(inflight_series(&registry), [(A_LABELS.to_string(), 0)]);
        eps.apply(Update::Remove(a.spec.id.clone()));
        assert!(inflight_series(&registry).is_empty());
    }
}
