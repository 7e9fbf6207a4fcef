//! A routed request's tentative hold ([`Scheduler::hold_tentative`](super::Scheduler)): its
//! prompt held for the picked pod from the decision until the request ends (completion,
//! failure, abort, expiry), so the next request with that prefix sees it at once.
//!
//! On a pod whose engine view is live, for a request whose head is known in engine tokens,
//! the hold also awaits the engine's store of the head's last full block ([`Awaited`]): when the
//! pod's view applies that `BlockStored` the hold stops claiming its blocks (the view holds
//! them now), and its request's end only removes it. [`TentativeHold::end`] says which came
//! first ([`HoldEnd`]); a hold that awaited nothing ends with its request, as it always did.
//!
//! Whatever ends its claim, a hold counts in its pod's blocks in flight until its request ends
//! (the engine keeps a running request's blocks): it adds the blocks no other hold of the pod
//! pinned, and frees those no other pins when dropped ([`super::kv_room`]).

use std::sync::Arc;

use super::kv_room::PinnedBlocks;
use crate::engine_view::Awaited;
use crate::prefix_index::{HoldId, PodSlot, TentativeEntries};

/// What ended a hold that awaited its engine (the `ended` label of
/// `prefix_picker_engine_holds_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// The engine stored the held head before the request ended (or held it at the decision).
    Engine,
    /// The request ended first (completed, failed, aborted, expired): the engine has not
    /// stored it (prefix caching off, or its event not applied yet).
    Request,
}

impl HoldEnd {
    pub const ALL: [HoldEnd; 2] = [HoldEnd::Engine, HoldEnd::Request];

    pub fn as_str(self) -> &'static str {
        match self {
            HoldEnd::Engine => "engine",
            HoldEnd::Request => "request",
        }
    }
}

/// A prompt held tentatively for a pod, released when dropped: the request's ticket drops it
/// at completion (after recording), rollback or expiry.
#[derive(Debug)]
pub struct TentativeHold {
    pub(super) entries: Arc<TentativeEntries>,
    pub(super) id: HoldId,
    pub(super) pod: PodSlot,
    /// The engine's store this hold awaits (a pod whose view was live).
    pub(super) engine: Option<Arc<Awaited>>,
    /// The pod's count of blocks its requests in flight pin ([`super::kv_room`]), which this
    /// hold added to and frees from when it ends.
    pub(super) pins: Option<PinnedBlocks>,
}

impl TentativeHold {
    /// The pod the prompt is held for.
    pub fn pod(&self) -> PodSlot {
        self.pod
    }

    /// Ends the hold, as dropping it does; says what ended it when it awaited its engine
    /// (`None`: it awaited nothing, the request's end ends it).
    pub fn end(self) -> Option<HoldEnd> {
        let engine = self.engine.as_ref()?;
        Some(if engine.end() {
            HoldEnd::Engine
        } else {
            HoldEnd::Request
        })
    }

    /// Whether the engine stored the held head (the hold no longer claims its blocks).
    pub fn stored_by_engine(&self) -> bool {
        self.engine.as_ref().is_some_and(|a| a.is_stored())
    }
}

impl Drop for TentativeHold {
    fn drop(&mut self) {
        if let Some(engine) = &self.engine {
            // Stops the wait (the view drops it at its next sweep) unless the engine won.
            engine.end();
        }
        let freed = self.entries.remove(self.id);
        if let Some(pins) = &self.pins {
            pins.unpin(freed);
        }
    }
}

#[cfg(test)]
mod tests;
