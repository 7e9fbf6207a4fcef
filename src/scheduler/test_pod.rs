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
