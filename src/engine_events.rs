//! Engine truth, fed: one KV-event subscriber per pod that publishes (`kvEventsEndpoint` on a
//! static endpoint, `discovery.kubernetes.kvEventsPort` for discovered pods), applying what its
//! engine reports to the pod's [`EngineView`].
//!
//! [`follow`] watches the pod set: a pod that appears (or a new incarnation of one) gets a
//! subscriber ([`crate::kv_events::subscriber`]) and a consumer; a pod that leaves has both
//! cancelled; a pair that stopped on its own (a panic) is started again with the view dropped (the
//! events in between are lost). The consumer applies each batch in order (`BlockStored` adds,
//! `BlockRemoved` removes, `AllBlocksCleared` clears) and keeps the view's `live` flag: on from
//! the first batch of a connection (evidence, not the connection: a publisher on another topic,
//! one that never sends or one whose frames do not decode connects too, and a pod it was picked
//! for is warned about once per connection and counted, `no_batch`), off while disconnected
//! (the view is kept: a reconnect that continues the sequence resumes it, from the first batch
//! after it). A `Reset` (a gap replay could not fill, a restarted
//! publisher) drops the view, which then holds only what the engine stores from then on. When the
//! engine itself lost its cache (`AllBlocksCleared`, or a publisher that restarted) the pod's
//! estimate in the prefix index is dropped too, so requests matched by the estimate stop counting
//! on it at once, not at the next scrape that sees the restart. A pod whose view is not live is
//! matched by the estimate. Events on another medium than the GPU (CPU offload tiers) are not
//! applied. A picker that starts after its engines first catches up from what each engine still
//! buffers for replay (the subscriber's catch-up); what an engine stored before that it sees
//! only as it is stored again (engines announce a block when they store it, not when they reuse
//! it).
//!
//! Pods without a publisher of their own can be fed by the shared socket instead ([`shared`]:
//! one socket the picker binds, the engines connect to, each naming its pod in its topic).
//!
//! Knobs (`picker.kvEvents`): `topic` (vLLM's `topic`, default empty), `maxBlocksPerPod`
//! (each view's bound, default 2^20 blocks), `bind` (the shared socket, default none).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use prometheus::{Gauge, IntCounter, IntGauge};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::endpoints::{DEFAULT_MAX_ENGINE_BLOCKS, Endpoint, Endpoints};
use crate::engine_view::EngineView;
use crate::kv_events::event::{KvEvent, Limits};
use crate::kv_events::shared::BindEndpoint;
use crate::kv_events::subscriber::{
    ResetReason, Subscriber, SubscriberConfig, SubscriberStats, Update,
};
use crate::metrics::engine_truth::{EngineTruthMetrics, KvEventKind, StreamEvent};
use crate::metrics::pod_label_values;
use crate::prefix_index::PrefixIndex;

/// `picker.kvEvents`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct KvEventsSection {
    /// The engines' `topic` (vLLM's `--kv-events-config` `topic`).
    pub topic: String,
    /// Each pod's view holds at most this many blocks (stores beyond are skipped, counted).
    pub max_blocks_per_pod: usize,
    /// Where the shared socket binds (`tcp://*:5557`), which the engines connect to, naming
    /// their pod in their topic (an `EndpointPickerConfig`'s `kvEventsConfig.zmqEndpoint`);
    /// none: only pods' own publishers are read.
    pub bind: Option<BindEndpoint>,
    /// With no `topic`, a prefix the publisher's topic must start with (an
    /// `EndpointPickerConfig`'s `kvEventsConfig.topicFilter`, ZeroMQ's subscription filter;
    /// not a key of its own).
    #[serde(skip)]
    pub topic_prefix: String,
}

impl Default for KvEventsSection {
    fn default() -> Self {
        KvEventsSection {
            topic: String::new(),
            max_blocks_per_pod: DEFAULT_MAX_ENGINE_BLOCKS,
            bind: None,
            topic_prefix: String::new(),
        }
    }
}

pub mod shared;

/// How often a consumer copies its subscriber's counters into the metrics when no update
/// arrives.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// How long a connection may go without a batch, once its pod was picked, before the consumer
/// says so (once per connection, `no_batch`): an engine that served a request stores blocks
/// and publishes within a step.
pub const NO_BATCH_AFTER: Duration = Duration::from_secs(30);

/// Keeps one subscriber per publishing pod until `shutdown`.
pub async fn follow(
    endpoints: Arc<Endpoints>,
    section: KvEventsSection,
    metrics: EngineTruthMetrics,
    shutdown: CancellationToken,
) {
    let spawn = {
        let endpoints = endpoints.clone();
        let metrics = metrics.clone();
        move |e: Arc<Endpoint>, cancel: CancellationToken| {
            tokio::spawn(subscribe(
                e,
                endpoints.clone(),
                section.clone(),
                metrics.clone(),
                cancel,
            ))
        }
    };
    supervise(&endpoints, &metrics, &shutdown, spawn).await;
}

/// A pod's running subscriber task.
struct Running {
    endpoint: Arc<Endpoint>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

/// Runs `spawn`'s task for every publishing pod while it is in the set, cancelling it when the
/// pod leaves. A task that ends on its own (only a bug ends one: a panic) is started again at
/// the next pass (at most one a second), its view dropped as after a `Reset` (the events in
/// between are lost: the view holds what the engine stores from then on), logged and counted
/// (`kind="restart"`), so a pod's engine truth never freezes.
async fn supervise(
    endpoints: &Endpoints,
    metrics: &EngineTruthMetrics,
    shutdown: &CancellationToken,
    spawn: impl Fn(Arc<Endpoint>, CancellationToken) -> JoinHandle<()>,
) {
    // Keyed by the endpoint's address in memory: a new incarnation is a new endpoint.
    let mut running: HashMap<usize, Running> = HashMap::new();
    loop {
        let set = endpoints.snapshot();
        let mut wanted: HashMap<usize, &Arc<Endpoint>> = HashMap::new();
        for e in set.all() {
            if e.spec.kv_events.is_some() && e.engine.is_some() {
                wanted.insert(Arc::as_ptr(e) as usize, e);
            }
        }
        running.retain(|key, r| {
            if !wanted.contains_key(key) {
                r.cancel.cancel();
                return false;
            }
            if !r.task.is_finished() {
                return true;
            }
            if r.cancel.is_cancelled() {
                // Ended by the shutdown.
                return false;
            }
            // The subscriber of a consumer that panicked is still connected.
            r.cancel.cancel();
            if let Some(view) = &r.endpoint.engine {
                view.clear();
                view.set_live(false);
            }
            let [name, namespace] = pod_label_values(&r.endpoint.spec.id);
            metrics
                .stream
                .with_label_values(&[name, namespace, StreamEvent::Restart.as_str()])
                .inc();
            endpoints.forget_if_departed(&r.endpoint);
            tracing::error!(pod = %r.endpoint.spec.id,
                "the KV-event subscriber stopped on its own (a bug: please report it); started again, the pod matched by the estimate meanwhile");
            false
        });
        for (key, e) in wanted {
            if running.contains_key(&key) {
                continue;
            }
            let cancel = shutdown.child_token();
            let task = spawn(e.clone(), cancel.clone());
            running.insert(
                key,
                Running {
                    endpoint: e.clone(),
                    cancel,
                    task,
                },
            );
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = endpoints.changed() => {}
            // A change signalled while this loop was not waiting is seen here.
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    for r in running.into_values() {
        r.cancel.cancel();
    }
}

/// One pod: its subscriber and the consumer applying its updates.
async fn subscribe(
    endpoint: Arc<Endpoint>,
    endpoints: Arc<Endpoints>,
    section: KvEventsSection,
    metrics: EngineTruthMetrics,
    cancel: CancellationToken,
) {
    let (Some(address), Some(view)) = (&endpoint.spec.kv_events, &endpoint.engine) else {
        return;
    };
    let subscriber = Subscriber::new(SubscriberConfig {
        endpoint: address.endpoint.clone(),
        replay_endpoint: address.replay.clone(),
        topic: section.topic.clone(),
        topic_prefix: section.topic_prefix.clone(),
        limits: Limits::default(),
    });
    let stats = subscriber.stats();
    let (tx, mut rx) = mpsc::channel(256);
    let task = tokio::spawn(subscriber.run(tx, cancel.clone()));
    let mut consumer = Consumer::new(endpoint.clone(), endpoints.index().clone(), &metrics, stats);
    tracing::info!(pod = %endpoint.spec.id, endpoint = %address.endpoint, "subscribing to KV events");
    let mut tick = tokio::time::interval(STATS_PERIOD);
    loop {
        tokio::select! {
            update = rx.recv() => match update {
                Some(u) => consumer.apply(u),
                None => break,
            },
            _ = tick.tick() => consumer.sync_stats(),
            _ = cancel.cancelled() => break,
        }
    }
    cancel.cancel();
    let _ = task.await;
    view.set_live(false);
    // Cancelled because the pod left: the series this consumer wrote after it left go too.
    endpoints.forget_if_departed(&endpoint);
}

/// One pod's series, resolved once.
struct PodSeries {
    kv_events: [IntCounter; KvEventKind::ALL.len()],
    stream: [IntCounter; StreamEvent::ALL.len()],
    lag: Gauge,
    blocks: IntGauge,
    live: IntGauge,
    connected: IntGauge,
}

impl PodSeries {
    fn new(metrics: &EngineTruthMetrics, endpoint: &Endpoint) -> PodSeries {
        let [name, namespace] = pod_label_values(&endpoint.spec.id);
        let labels = [name, namespace];
        PodSeries {
            kv_events: KvEventKind::ALL.map(|e| {
                metrics
                    .kv_events
                    .with_label_values(&[name, namespace, e.as_str()])
            }),
            stream: StreamEvent::ALL.map(|e| {
                metrics
                    .stream
                    .with_label_values(&[name, namespace, e.as_str()])
            }),
            lag: metrics.lag.with_label_values(&labels),
            blocks: metrics.view_blocks.with_label_values(&labels),
            live: metrics.view_live.with_label_values(&labels),
            connected: metrics.connected.with_label_values(&labels),
        }
    }

    /// The pod's counter of `event`.
    fn stream(&self, event: StreamEvent) -> &IntCounter {
        let at = StreamEvent::ALL.iter().position(|e| *e == event);
        &self.stream[at.expect("every event is in ALL")]
    }
}

/// Applies one pod's updates to its view (none: nothing to apply) and counts them.
struct Consumer {
    endpoint: Arc<Endpoint>,
    /// The estimate, dropped for this pod when its engine lost its cache.
    index: Arc<PrefixIndex>,
    series: PodSeries,
    stats: Arc<SubscriberStats>,
    /// The subscriber's counters at the last sync, per [`StreamEvent`].
    synced: [u64; StreamEvent::ALL.len()],
    /// The connection waiting for its first batch: since when, and the pod's picks then.
    waiting: Option<(Instant, u64)>,
    /// [`NO_BATCH_AFTER`] (shorter in tests).
    no_batch_after: Duration,
}

impl Consumer {
    fn new(
        endpoint: Arc<Endpoint>,
        index: Arc<PrefixIndex>,
        metrics: &EngineTruthMetrics,
        stats: Arc<SubscriberStats>,
    ) -> Consumer {
        let series = PodSeries::new(metrics, &endpoint);
        series.live.set(0);
        series.connected.set(0);
        Consumer {
            endpoint,
            index,
            series,
            stats,
            synced: [0; StreamEvent::ALL.len()],
            waiting: None,
            no_batch_after: NO_BATCH_AFTER,
        }
    }

    /// The pod's view (every consumer's pod has one: it is what it subscribes for).
    fn view(&self) -> Option<&EngineView> {
        self.endpoint.engine.as_ref()
    }

    fn apply(&mut self, update: Update) {
        let endpoint = self.endpoint.clone();
        let Some(view) = endpoint.engine.as_ref() else {
            return;
        };
        match update {
            // Live on evidence, not on a connection: a connection alone says nothing of what
            // the engine holds (a publisher on another topic, one that never sends, frames
            // that do not decode all connect). Until a batch arrives the pod is matched by the
            // estimate; a view that holds blocks also waits for the first batch to show
            // whether the engine's sequence continued (a restarted engine's starts over: a
            // Reset comes first).
            Update::Connected => {
                self.waiting = Some((Instant::now(), self.endpoint.picks()));
                self.series.connected.set(1);
                view.set_live(false);
            }
            Update::Batch { batch, .. } => {
                let mut counts = [0u64; KvEventKind::ALL.len()];
                for event in &batch.events {
                    self.apply_event(view, event, &mut counts);
                }
                view.set_live(true);
                self.waiting = None;
                for (counter, n) in self.series.kv_events.iter().zip(counts) {
                    counter.inc_by(n);
                }
            }
            Update::Reset { reason } => {
                let dropped = view.clear();
                tracing::warn!(
                    pod = %self.endpoint.spec.id,
                    reason = %reason,
                    dropped,
                    "KV-event view dropped; it holds only what the engine stores from now on"
                );
                if matches!(reason, ResetReason::PublisherRestarted { .. }) {
                    self.engine_lost_its_cache("the engine restarted");
                }
            }
            Update::Disconnected => {
                self.waiting = None;
                self.series.connected.set(0);
                view.set_live(false);
            }
        }
        self.sync_stats();
    }

    /// Says, once per connection, that a pod picked since it connected has sent no batch for
    /// [`NO_BATCH_AFTER`], with what did arrive: its requests are matched by the estimate.
    fn check_no_batch(&mut self) {
        let Some((since, picks)) = self.waiting else {
            return;
        };
        if since.elapsed() < self.no_batch_after || self.endpoint.picks() == picks {
            return;
        }
        self.waiting = None;
        self.series.stream(StreamEvent::NoBatch).inc();
        let s = &self.stats;
        tracing::warn!(
            pod = %self.endpoint.spec.id,
            received = s.received.load(Relaxed),
            wrong_topic = s.wrong_topic.load(Relaxed),
            undecodable = s.decode_errors.load(Relaxed),
            "KV events: connected {} s and picked since, no batch applied (counted as no_batch): \
             the pod is matched by the estimate until one is (a publisher on another topic, \
             one that never sends, or frames that do not decode)",
            self.no_batch_after.as_secs()
        );
    }

    fn apply_event(
        &self,
        view: &EngineView,
        event: &KvEvent,
        counts: &mut [u64; KvEventKind::ALL.len()],
    ) {
        match event {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium,
                ..
            } if on_gpu(medium.as_deref()) => {
                let hashes: Vec<u64> = block_hashes.iter().map(|h| h.0).collect();
                let stored = view.store(
                    parent.map(|p| p.0),
                    &hashes,
                    token_ids,
                    *block_size as usize,
                );
                counts[0] += stored.added as u64;
                counts[1] += stored.skipped as u64;
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } if on_gpu(medium.as_deref()) => {
                let hashes: Vec<u64> = block_hashes.iter().map(|h| h.0).collect();
                counts[2] += view.remove(&hashes) as u64;
            }
            KvEvent::AllBlocksCleared => {
                view.clear();
                self.engine_lost_its_cache("the engine cleared its cache");
                counts[3] += 1;
            }
            _ => {}
        }
    }

    /// Drops the pod's estimate: its engine holds nothing now.
    fn engine_lost_its_cache(&self, why: &str) {
        let dropped = self.index.clear_pod(self.endpoint.index.slot());
        tracing::info!(pod = %self.endpoint.spec.id, dropped, "{why}: the pod's estimate is dropped");
    }

    /// Copies the subscriber's counters (what never reaches the consumer: refused messages,
    /// wrong topics) and the view's gauges into the metrics.
    fn sync_stats(&mut self) {
        self.check_no_batch();
        let s = &self.stats;
        for (kind, (counter, synced)) in StreamEvent::ALL
            .into_iter()
            .zip(self.series.stream.iter().zip(&mut self.synced))
        {
            let now = match kind {
                StreamEvent::Received => &s.received,
                StreamEvent::Applied => &s.decoded,
                StreamEvent::DecodeError => &s.decode_errors,
                StreamEvent::WrongTopic => &s.wrong_topic,
                StreamEvent::UnknownEvent => &s.unknown_events,
                StreamEvent::Gap => &s.gaps,
                StreamEvent::Replay => &s.replays,
                StreamEvent::Reset => &s.resets,
                StreamEvent::Reconnect => &s.reconnects,
                // Counted by the supervisor and the consumer, not the subscriber.
                StreamEvent::Restart | StreamEvent::NoBatch => continue,
            }
            .load(Relaxed);
            counter.inc_by(now.saturating_sub(*synced));
            *synced = now;
        }
        self.series
            .lag
            .set(s.last_lag_ms.load(Relaxed) as f64 / 1e3);
        if let Some(view) = self.view() {
            self.series.blocks.set(view.blocks() as i64);
            self.series.live.set(i64::from(view.is_live()));
        }
    }
}

/// Whether an event's `medium` is the GPU (absent: engines before vLLM added the field).
fn on_gpu(medium: Option<&str>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use prometheus::Registry;

    use super::*;
    use crate::endpoints::{KvEventsAddress, Update};
    use crate::metrics::RouterMetrics;

    #[tokio::test]
    async fn a_subscriber_that_stops_on_its_own_is_started_again_its_view_not_live_meanwhile() {
        let metrics = RouterMetrics::register(&Registry::new());
        let endpoints = Arc::new(Endpoints::new(
            Arc::new(PrefixIndex::new(10)),
            metrics.clone(),
        ));
        let mut spec = crate::testing::spec("engine", 18001, &[]);
        spec.kv_events = Some(KvEventsAddress {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: None,
        });
        endpoints.apply(Update::Reset(vec![spec]));
        let e = endpoints.snapshot().all()[0].clone();
        let view = e.engine.as_ref().expect("a view");
        view.store(None, &[1], &(0..16).collect::<Vec<u32>>(), 16);
        view.set_live(true);

        // The first task panics as a bug would; the second runs until cancelled.
        let (started, mut starts) = mpsc::unbounded_channel();
        let cancelled = Arc::new(AtomicUsize::new(0));
        let spawn = {
            let cancelled = cancelled.clone();
            let n = AtomicUsize::new(0);
            move |_: Arc<Endpoint>, cancel: CancellationToken| {
                let n = n.fetch_add(1, Relaxed);
                started.send(n).unwrap();
                let cancelled = cancelled.clone();
                tokio::spawn(async move {
                    assert!(n > 0, "a bug in the subscriber");
                    cancel.cancelled().await;
                    cancelled.fetch_add(1, Relaxed);
                })
            }
        };
        let shutdown = CancellationToken::new();
        let supervisor = tokio::spawn({
            let (endpoints, engine, shutdown) =
                (endpoints.clone(), metrics.engine.clone(), shutdown.clone());
            async move { supervise(&endpoints, &engine, &shutdown, spawn).await }
        });
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), starts.recv())
                .await
                .ok()
                .flatten()
        };
        assert_eq!(next().await, Some(0));
        assert_eq!(next().await, Some(1), "started again");
        // The events in between are lost: what the view held is unknown.
        assert!(!view.is_live());
        assert_eq!(view.blocks(), 0);
        let restarts = metrics
            .engine
            .stream
            .with_label_values(&["engine", "default", "restart"])
            .get();
        assert_eq!(restarts, 1);

        // The pod leaves: its task is cancelled, and not started again.
        endpoints.apply(Update::Reset(Vec::new()));
        while cancelled.load(Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        supervisor.await.unwrap();
        assert!(starts.try_recv().is_err(), "no start for a pod that left");
    }

    /// A connection that brings no batch is counted once, and only once its pod was picked; a
    /// batch makes the view live.
    #[test]
    fn a_picked_pod_whose_connection_brings_no_batch_is_counted_once() {
        use crate::kv_events::event::EventBatch;
        let metrics = RouterMetrics::register(&Registry::new());
        let endpoints = Endpoints::new(Arc::new(PrefixIndex::new(10)), metrics.clone());
        let mut spec = crate::testing::spec("engine", 18001, &[]);
        spec.kv_events = Some(KvEventsAddress {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: None,
        });
        endpoints.apply(Update::Reset(vec![spec]));
        let e = endpoints.snapshot().all()[0].clone();
        let view = e.engine.as_ref().expect("a view");
        let stats = Arc::new(SubscriberStats::default());
        let mut consumer =
            Consumer::new(e.clone(), endpoints.index().clone(), &metrics.engine, stats);
        consumer.no_batch_after = Duration::ZERO;
        let series = |kind: &str| {
            metrics
                .engine
                .stream
                .with_label_values(&["engine", "default", kind])
                .get()
        };
        let connected = || {
            metrics
                .engine
                .connected
                .with_label_values(&["engine", "default"])
                .get()
        };
        consumer.apply(crate::kv_events::subscriber::Update::Connected);
        assert!(!view.is_live(), "a connection is no evidence");
        assert_eq!(connected(), 1);
        consumer.sync_stats();
        assert_eq!(
            series("no_batch"),
            0,
            "not picked: an idle engine sends nothing"
        );
        e.count_pick(&metrics);
        consumer.sync_stats();
        consumer.sync_stats();
        assert_eq!(series("no_batch"), 1, "once per connection");
        consumer.apply(crate::kv_events::subscriber::Update::Batch {
            seq: 0,
            batch: EventBatch {
                ts: 0.0,
                events: Vec::new(),
                data_parallel_rank: None,
                unknown_events: 0,
            },
        });
        assert!(view.is_live());
        consumer.apply(crate::kv_events::subscriber::Update::Disconnected);
        assert!(!view.is_live());
        assert_eq!(connected(), 0);
    }
}
