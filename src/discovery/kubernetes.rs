//! Kubernetes discovery: watch pods (and optionally an InferencePool) and feed the pod set.
//!
//! Algorithm. One task runs kube-runtime watchers (list, then watch from the list's
//! resourceVersion; every stream error is counted, logged and retried with the default
//! exponential backoff, 0.8 s .. 30 s with jitter) and handles their whole event stream:
//! - `Init` starts a full (re)list into a side buffer; `InitApply` fills it; `InitDone` swaps it
//!   in and applies [`Update::Reset`]: pods not re-listed are gone. Until `InitDone` the previous
//!   set keeps serving. A `410 Gone` (or any failed list) goes through this path.
//! - `Apply(pod)` recomputes the pod's endpoints ([`PodEndpoints`]: ready, not terminating, with
//!   an IP) and applies the difference as [`Update::Remove`] / [`Update::Add`]; `Delete(pod)`
//!   removes them. [`crate::endpoints::Endpoints`] drops a leaving or restarted (new UID) pod's
//!   prefix-index entries at once (not evictions) and its per-pod metric series.
//! - With `inferencePool`, a second watcher follows the named pool (field selector
//!   `metadata.name=<pool>`); when its selector or ports change, the pod watcher is restarted with
//!   the new selector, and its first `InitDone` re-targets the set. A missing or deleted pool
//!   selects nothing.
//!
//! Own state rather than a reflector store: the per-pod view is needed anyway to turn each event
//! into Add/Remove updates, and the relist buffer gives the Reset its exact contents.
//!
//! Static `endpoints:` from the config stay in the set next to discovered pods. Readiness: the
//! `synced` flag turns true at the first complete pod list (or, with a pool, once the pool is
//! known to be absent) and stays true across relists.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::{KubernetesConfig, Source};
use super::inference_pool::{self, InferencePool};
use super::metrics::{DiscoveryMetrics, Resource, RestartReason, WatchEvent};
use super::pod::{PodEndpoints, PodLabels, PodState};
use super::target::Target;
use crate::endpoints::{EndpointSpec, Endpoints, Update};
use crate::scheduler::PdGroup;

type Events<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// Builds a client the usual way: `KUBECONFIG` / `~/.kube/config`, else the in-cluster service
/// account.
pub async fn infer_client() -> Result<Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Client::try_from(config)
}

/// A configured discovery task (not yet running).
pub struct KubernetesDiscovery {
    client: Client,
    namespace: String,
    config: KubernetesConfig,
    labels: PodLabels,
    statics: Vec<EndpointSpec>,
    endpoints: Arc<Endpoints>,
    metrics: DiscoveryMetrics,
    synced: watch::Sender<bool>,
}

impl std::fmt::Debug for KubernetesDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesDiscovery")
            .field("namespace", &self.namespace)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Pods seen by the current pod watch, by name, and the relist in progress.
#[derive(Default)]
struct PodSet {
    pods: BTreeMap<String, PodEndpoints>,
    relist: Option<BTreeMap<String, PodEndpoints>>,
    lists: u64,
}

impl KubernetesDiscovery {
    /// `statics`: configured endpoints kept next to the discovered ones.
    pub fn new(
        client: Client,
        namespace: String,
        config: KubernetesConfig,
        statics: Vec<EndpointSpec>,
        endpoints: Arc<Endpoints>,
        metrics: DiscoveryMetrics,
    ) -> KubernetesDiscovery {
        let labels = PodLabels {
            role: config.role_label.clone(),
            model: config.model_label.clone(),
            pd: None,
            keep: Vec::new(),
            kv_events: config
                .kv_events_port
                .map(|p| (p, config.kv_events_replay_port)),
        };
        KubernetesDiscovery {
            client,
            namespace,
            config,
            labels,
            statics,
            endpoints,
            metrics,
            synced: watch::Sender::new(false),
        }
    }

    /// Sorts pods by `pdGroup`: endpoints carry the labels it reads, and a pod it sorts into
    /// neither role is warned about (it gets no inference traffic).
    pub fn with_pd_group(mut self, group: Option<PdGroup>) -> KubernetesDiscovery {
        self.labels.pd = group;
        self
    }

    /// Keeps these pod labels on the endpoints (an `EndpointPickerConfig`'s filters read them).
    pub fn keeping_labels(mut self, keys: Vec<String>) -> KubernetesDiscovery {
        self.labels.keep = keys;
        self
    }

    /// Warns of endpoints `pdGroup` sorts into neither role.
    fn warn_unpaired<'a>(&self, added: impl Iterator<Item = &'a EndpointSpec>) {
        let Some(group) = &self.labels.pd else { return };
        for e in added {
            if group
                .classify(|k| e.labels.get(k).map(String::as_str))
                .is_none()
            {
                tracing::warn!(pod = %e.id, labels = ?e.labels, group_key = group.group_key(), "pod is neither a prefill nor a decode pod of pdGroup: it gets no inference traffic");
            }
        }
    }

    /// Turns true once the first complete list has been applied.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    /// Runs until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        tracing::info!("{}", self.config.describe(&self.namespace));
        let mut target = None;
        let mut pool_events = None;
        match &self.config.source {
            Source::Static(t) => target = Some(t.clone()),
            Source::InferencePool(name) => pool_events = Some(self.watch_pool(name)),
        }
        let mut pod_events = target.as_ref().map(|t| self.watch_pods(t));
        let mut set = PodSet::default();
        let mut pool_listing: Option<Option<InferencePool>> = None;
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                event = next(&mut pool_events) => {
                    let Some(pool) = self.on_pool_event(event, &mut pool_listing) else {
                        continue;
                    };
                    let new = pool.as_ref().and_then(|p| self.pool_target(p));
                    if new == target && (new.is_some() || *self.synced.borrow()) {
                        continue;
                    }
                    if pod_events.is_some() && new.is_some() {
                        self.metrics.restart(Resource::Pod, RestartReason::Target);
                    }
                    pod_events = new.as_ref().map(|t| self.watch_pods(t));
                    target = new;
                    set.relist = None;
                    set.lists = 0;
                    if target.is_none() {
                        set.pods.clear();
                        self.reset(&set);
                    }
                }
                event = next(&mut pod_events) => {
                    let ports = target.as_ref().map(|t| t.ports.as_slice()).unwrap_or_default();
                    self.on_pod_event(event, &mut set, ports);
                }
            }
        }
    }

    fn watch_pods(&self, target: &Target) -> Events<Pod> {
        tracing::info!(selector = %target.selector, ports = ?target.ports, "watching pods");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        watcher::watcher(
            api,
            watcher::Config::default().labels_from(&target.selector),
        )
        .default_backoff()
        .boxed()
    }

    fn watch_pool(&self, name: &str) -> Events<InferencePool> {
        let api: Api<InferencePool> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &inference_pool::api_resource(),
        );
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        watcher::watcher(api, config).default_backoff().boxed()
    }

    /// Returns the pool's new state when it is known to have changed (`Some(None)`: absent).
    fn on_pool_event(
        &self,
        event: Result<Event<InferencePool>, watcher::Error>,
        listing: &mut Option<Option<InferencePool>>,
    ) -> Option<Option<InferencePool>> {
        let count = |event| self.metrics.event(Resource::InferencePool, event);
        match event {
            Ok(Event::Init) => {
                if self
                    .metrics
                    .events_of(Resource::InferencePool, WatchEvent::Resync)
                    > 0
                {
                    self.metrics
                        .restart(Resource::InferencePool, RestartReason::Relist);
                }
                *listing = Some(None);
                None
            }
            Ok(Event::InitApply(pool)) => {
                if let Some(l) = listing.as_mut() {
                    *l = Some(pool);
                }
                None
            }
            Ok(Event::InitDone) => {
                count(WatchEvent::Resync);
                let pool = listing.take().flatten();
                if pool.is_none() {
                    tracing::warn!(namespace = %self.namespace, "InferencePool not found: no pods selected");
                }
                Some(pool)
            }
            Ok(Event::Apply(pool)) => {
                count(WatchEvent::Apply);
                Some(Some(pool))
            }
            Ok(Event::Delete(pool)) => {
                count(WatchEvent::Delete);
                tracing::warn!(pool = %pool.name_any(), "InferencePool deleted: no pods selected");
                Some(None)
            }
            Err(e) => {
                self.metrics.watch_error(Resource::InferencePool);
                tracing::warn!(error = %e, "InferencePool watch error; retrying with backoff");
                None
            }
        }
    }

    fn pool_target(&self, pool: &InferencePool) -> Option<Target> {
        match inference_pool::target(pool) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(pool = %pool.name_any(), error = %e, "InferencePool selects no pods");
                None
            }
        }
    }

    fn on_pod_event(
        &self,
        event: Result<Event<Pod>, watcher::Error>,
        set: &mut PodSet,
        ports: &[u16],
    ) {
        let count = |event| self.metrics.event(Resource::Pod, event);
        match event {
            Ok(Event::Init) => {
                if set.lists > 0 {
                    self.metrics.restart(Resource::Pod, RestartReason::Relist);
                    tracing::info!("pod watch restarted: relisting");
                }
                set.lists += 1;
                set.relist = Some(BTreeMap::new());
            }
            Ok(Event::InitApply(pod)) => {
                let view = PodEndpoints::of(&pod, &self.namespace, ports, &self.labels);
                if let Some(relist) = set.relist.as_mut() {
                    relist.insert(pod.name_any(), view);
                }
            }
            Ok(Event::InitDone) => {
                let Some(relist) = set.relist.take() else {
                    return;
                };
                count(WatchEvent::Resync);
                set.pods = relist;
                self.reset(set);
            }
            Ok(Event::Apply(pod)) => {
                count(WatchEvent::Apply);
                let name = pod.name_any();
                let view = PodEndpoints::of(&pod, &self.namespace, ports, &self.labels);
                let old = set.pods.insert(name.clone(), view.clone());
                let old = old.unwrap_or(PodEndpoints {
                    state: PodState::NotReady,
                    endpoints: Vec::new(),
                });
                if old != view {
                    tracing::info!(pod = %format!("{}/{name}", self.namespace), state = view.state.as_str(), endpoints = view.endpoints.len(), "pod changed");
                    self.apply_diff(&old.endpoints, &view.endpoints);
                }
                self.update_gauges(set);
            }
            Ok(Event::Delete(pod)) => {
                count(WatchEvent::Delete);
                let name = pod.name_any();
                if let Some(old) = set.pods.remove(&name) {
                    tracing::info!(pod = %format!("{}/{name}", self.namespace), "pod deleted");
                    self.apply_diff(&old.endpoints, &[]);
                }
                self.update_gauges(set);
            }
            Err(e) => {
                self.metrics.watch_error(Resource::Pod);
                tracing::warn!(error = %e, "pod watch error; retrying with backoff");
            }
        }
    }

    fn apply_diff(&self, old: &[EndpointSpec], new: &[EndpointSpec]) {
        for o in old {
            if !new.iter().any(|n| n.id == o.id) {
                self.endpoints.apply(Update::Remove(o.id.clone()));
            }
        }
        for n in new {
            if !old.contains(n) {
                self.endpoints.apply(Update::add(n.clone()));
            }
        }
        self.warn_unpaired(new.iter().filter(|n| !old.iter().any(|o| o.id == n.id)));
    }

    /// Replaces the whole set with the static endpoints plus every counted pod.
    fn reset(&self, set: &PodSet) {
        let mut all = self.statics.clone();
        all.extend(set.pods.values().flat_map(|p| p.endpoints.iter().cloned()));
        let before = self.endpoints.snapshot();
        self.warn_unpaired(
            set.pods
                .values()
                .flat_map(|p| &p.endpoints)
                .filter(|e| before.all().iter().all(|b| b.spec.id != e.id)),
        );
        let left = self.endpoints.apply(Update::Reset(all));
        for id in &left {
            tracing::info!(pod = %id, "pod gone after a full list");
        }
        self.update_gauges(set);
        tracing::info!(
            pods = set.pods.len(),
            endpoints = self.endpoints.snapshot().all().len(),
            "pod set synced with a full list"
        );
        self.synced.send_replace(true);
    }

    fn update_gauges(&self, set: &PodSet) {
        for state in PodState::ALL {
            let n = set.pods.values().filter(|p| p.state == state).count();
            self.metrics
                .pods
                .with_label_values(&[state.as_str()])
                .set(n as i64);
        }
        let mut roles: BTreeMap<&str, i64> = BTreeMap::new();
        for e in set.pods.values().flat_map(|p| &p.endpoints) {
            *roles
                .entry(e.role.as_deref().unwrap_or("none"))
                .or_default() += 1;
        }
        self.metrics.endpoints.reset();
        for (role, n) in roles {
            self.metrics.endpoints.with_label_values(&[role]).set(n);
        }
    }
}

/// The next item of an optional stream; pending forever when there is none.
async fn next<S: Stream + Unpin>(stream: &mut Option<S>) -> S::Item {
    match stream {
        Some(s) => match s.next().await {
            Some(item) => item,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
