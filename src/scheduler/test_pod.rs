//! The candidate pod of the scheduler's unit tests (a plain struct, no endpoint store) and
//! their plain request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::affinity::{RecentPicks, rendezvous_key};
use super::{Candidate, EngineStats, RouteRequest, Scheduler};
use crate::engine_view::EngineView;
use crate::prefix_index::{PodHandle, PodSlot};

/// A candidate pod as the core sees it (nothing in flight).
#[derive(Debug)]
pub(crate) struct Pod {
    pub handle: PodHandle,
    pub label: String,
    /// Pod labels (PD mode sorts pods by them).
    pub labels: BTreeMap<String, String>,
    pub stats: EngineStats,
    pub recent: RecentPicks,
    pub rendezvous: u64,
    /// Its engine's KV-cache view, when the test gives it one.
    pub engine: Option<EngineView>,
}

impl Candidate for Pod {
    fn slot(&self) -> PodSlot {
        self.handle.slot()
    }

    fn index_pod(&self) -> Option<&PodHandle> {
        Some(&self.handle)
    }

    fn inflight(&self) -> i64 {
        0
    }

    fn stats(&self) -> EngineStats {
        self.stats
    }

    fn recent(&self) -> &RecentPicks {
        &self.recent
    }

    fn engine_view(&self) -> Option<&EngineView> {
        self.engine.as_ref()
    }

    fn rendezvous(&self) -> u64 {
        self.rendezvous
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn pod_label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// A request of model `m` for `prompt`: no salt, no session, hashed by the scheduler.
pub(crate) fn req(prompt: &str) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        prompt: Ok(prompt),
        salt: None,
        session_pod: None,
        hashes: None,
        engine_tokens: None,
        kv_blocks: None,
        headers: &[],
    }
}

/// `n` pods of `s`'s index at 10.0.0.1.., each with an engine view, live where `live(i)`.
pub(crate) fn engine_pods(s: &Scheduler, n: usize, live: impl Fn(usize) -> bool) -> Vec<Arc<Pod>> {
    (0..n)
        .map(|i| {
            let address = SocketAddr::from(([10, 0, 0, i as u8 + 1], 8000));
            let view = EngineView::new(1 << 16);
            view.set_live(live(i));
            Arc::new(Pod {
                handle: s.prefix_cache().index().add_pod(),
                label: format!("default/pod-{i}"),
                labels: Default::default(),
                stats: EngineStats::default(),
                recent: RecentPicks::default(),
                rendezvous: rendezvous_key(&address),
                engine: Some(view),
            })
        })
        .collect()
}

/// Messages of the events written on the `scores` target.
#[derive(Default, Clone)]
pub(crate) struct Lines(pub Arc<std::sync::Mutex<Vec<String>>>);

impl tracing::Subscriber for Lines {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        if event.metadata().target() == "scores" {
            let mut m = String::new();
            event.record(&mut Message(&mut m));
            self.0.lock().unwrap().push(m);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
