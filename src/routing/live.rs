//! The live scheduler: what a config reload swaps. Each request loads the current
//! [`Generation`] once (lock-free, `ArcSwap`) and decides with it from start to end; a reload
//! stores a new generation built by [`Scheduler::reconfigured`], which shares the prefix index,
//! the tentative entries and the sequences with the old one, so no pod loses what it holds.

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::config::PickerConfig;
use crate::prefix_index::{PrefixIndex, TentativeEntries};
use crate::scheduler::Scheduler;
use crate::scheduler::prefix_cache::PrefixCache;

/// One configuration of the scheduler and the picker knobs a reload may change.
#[derive(Debug)]
pub struct Generation {
    pub scheduler: Scheduler,
    /// The picker section this generation was built from (its reloadable keys are live:
    /// `seed`, `maxEndpoints`, `affinity`, `loadShedding`).
    pub picker: PickerConfig,
}

/// The current [`Generation`], and the state every generation shares.
#[derive(Debug)]
pub struct LiveScheduler {
    current: ArcSwap<Generation>,
    /// The start-up generation's prefix-cache plugin: the owner of the index every generation
    /// shares. Its hashing arguments are the start-up ones; the live ones are `load()`'s.
    index_owner: PrefixCache,
    tentative: Arc<TentativeEntries>,
}

impl LiveScheduler {
    pub fn new(scheduler: Scheduler, picker: PickerConfig) -> LiveScheduler {
        let index_owner = scheduler
            .prefix_cache()
            .sharing(scheduler.prefix_cache().args(), picker.seed)
            .with_scheme(scheduler.prefix_cache().scheme());
        let tentative = scheduler.tentative().clone();
        LiveScheduler {
            current: ArcSwap::from_pointee(Generation { scheduler, picker }),
            index_owner,
            tentative,
        }
    }

    /// The current generation (lock-free); load it once per request.
    pub fn load(&self) -> Guard<Arc<Generation>> {
        self.current.load()
    }

    /// Makes `next` the current generation; requests already deciding finish with the old one.
    pub fn store(&self, next: Generation) {
        self.current.store(Arc::new(next));
    }

    /// The prefix index, the same for every generation.
    pub fn index(&self) -> &Arc<PrefixIndex> {
        self.index_owner.index()
    }

    /// The plugin owning the shared index (`prefix_cache().index()`); for the live hashing
    /// arguments read `load().scheduler.prefix_cache()`.
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.index_owner
    }

    /// The tentative entries, the same for every generation.
    pub fn tentative(&self) -> &Arc<TentativeEntries> {
        &self.tentative
    }
}
