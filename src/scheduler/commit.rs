//! What a routed decision changes once it is committed: an affinity pick joins its pod's
//! recent share (the balance signal of later picks), and with `tentative` the prompt is held
//! for the pod until the request completes ([`TentativeHold`]), so requests right behind it see
//! the match. An explained decision is never committed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Candidate, Decision, DecisionReason, Scheduler, affinity};
use crate::hashing::BlockHash;
use crate::prefix_index::{HoldId, ModelKey, PodSlot, TentativeEntries};

impl Scheduler {
    /// Makes a routed decision's pick count: an affinity pick joins its pod's recent share, and
    /// (with `tentative`) the prompt is held for the pod until the request completes. Explained
    /// decisions are never committed.
    pub fn commit<C: Candidate>(
        &self,
        model: &str,
        decision: &Decision<C>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        let affinity_pick = matches!(
            decision.reason,
            DecisionReason::AffinityHit
                | DecisionReason::AffinityMiss
                | DecisionReason::AffinitySpill
                | DecisionReason::AffinitySaturated
                | DecisionReason::Session
        );
        if affinity_pick {
            let keep = affinity::keep_factor(config.share_window, decision.candidates.len());
            let now = self.counters.picks.fetch_add(1, Ordering::Relaxed) as u32;
            decision.primary().recent().add(now, keep);
        }
        self.hold_tentative(model, &decision.hashes, decision.primary().slot())
    }

    /// [`commit`](Scheduler::commit) for a PD decision's prefill pod: an affinity pick joins its
    /// recent share, and (with `tentative`) the prompt is held for it too. `None` outside PD
    /// mode or with nothing to hold.
    pub fn commit_prefill<C: Candidate>(
        &self,
        model: &str,
        decision: &Decision<C>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        let pd = decision.pd.as_ref()?;
        let affinity_pick = matches!(
            pd.prefill_reason,
            DecisionReason::AffinityHit
                | DecisionReason::AffinityMiss
                | DecisionReason::AffinitySpill
                | DecisionReason::AffinitySaturated
        );
        if affinity_pick {
            let keep = affinity::keep_factor(config.share_window, pd.prefill_candidates);
            let now = self.counters.picks.fetch_add(1, Ordering::Relaxed) as u32;
            pd.prefill.recent().add(now, keep);
        }
        self.hold_tentative(model, &decision.hashes, pd.prefill.slot())
    }

    /// Holds `hashes` tentatively for the pod in `slot` until the request completes (affinity
    /// mode with `tentative`); `None` when there is nothing to hold.
    pub fn hold_tentative(
        &self,
        model: &str,
        hashes: &[BlockHash],
        pod: PodSlot,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        if !config.tentative || hashes.is_empty() {
            return None;
        }
        let id = self
            .tentative
            .add(ModelKey::of(model), hashes.into(), pod)?;
        Some(TentativeHold {
            entries: self.tentative.clone(),
            id,
            pod,
        })
    }
}

/// A prompt held tentatively for a pod ([`Scheduler::hold_tentative`]), released when dropped:
/// the request's ticket drops it at completion (after recording), rollback or expiry.
#[derive(Debug)]
pub struct TentativeHold {
    entries: Arc<TentativeEntries>,
    id: HoldId,
    pod: PodSlot,
}

impl TentativeHold {
    /// The pod the prompt is held for.
    pub fn pod(&self) -> PodSlot {
        self.pod
    }
}

impl Drop for TentativeHold {
    fn drop(&mut self) {
        self.entries.remove(self.id);
    }
}
