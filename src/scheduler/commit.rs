//! What a routed decision changes once it is committed: an affinity pick joins its pod's
//! recent share (the balance signal of later picks), and with `tentative` the prompt is held
//! for the pod until the request completes, or until its engine stores it ([`TentativeHold`]),
//! so requests right behind it see the match. An explained decision is never committed.

use std::sync::atomic::Ordering;

use super::kv_room::PinnedBlocks;
use super::{Candidate, Decision, DecisionReason, Scheduler, TentativeHold, affinity};
use crate::engine_view::EngineView;
use crate::hashing::BlockHash;
use crate::prefix_index::{ModelKey, PodSlot};

impl Scheduler {
    /// Makes a routed decision's pick count: an affinity pick joins its pod's recent share, and
    /// (with `tentative`) the prompt is held for the pod until the request completes. Explained
    /// decisions are never committed.
    pub fn commit<C: Candidate>(
        &self,
        model: &str,
        decision: &Decision<C>,
    ) -> Option<TentativeHold> {
        self.commit_epp(decision);
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
            let uncached = decision
                .primary_prediction()
                .map_or(0.0, |p| p.uncached_tokens);
            self.count_pick(
                config,
                decision.primary(),
                decision.candidates.len(),
                uncached,
            );
        }
        let primary = decision.primary();
        let engine = primary.engine_view().zip(decision.primary_last_block());
        let pins = primary.timing().map(|t| t.kv().pins());
        self.hold_pinning(model, &decision.hashes, primary.slot(), engine, pins)
    }

    /// An `EndpointPickerConfig`'s state: its session bindings; for no-hit-lru-scorer, a cold
    /// request's pod becomes the most recent (cold: no pod held any of the prompt, or nothing
    /// was matched).
    fn commit_epp<C: Candidate>(&self, decision: &Decision<C>) {
        let Some(profile) = &self.config.epp else {
            return;
        };
        self.commit_sessions(profile, decision);
        let Some(size) = profile.scorers.iter().find_map(|s| match s.kind {
            super::epp::EppScorerKind::NoHitLru { lru_size } => Some(lru_size),
            _ => None,
        }) else {
            return;
        };
        if matches!(
            decision.reason,
            DecisionReason::PrefixMiss | DecisionReason::Unscored
        ) {
            self.counters.no_hit.touch(decision.primary().label(), size);
        }
    }

    /// session-affinity-scorer's `session_id` instances: the request's session is bound to the
    /// pick (or refreshed, or moved when its pod was not a candidate).
    fn commit_sessions<C: Candidate>(
        &self,
        profile: &super::epp::EppProfile,
        decision: &Decision<C>,
    ) {
        if decision.epp.sessions.is_empty() {
            return;
        }
        let candidates: Vec<&str> = decision.candidates.iter().map(|c| c.label()).collect();
        let now = std::time::Instant::now();
        for (instance, session) in &decision.epp.sessions {
            let Some(super::epp::SessionStrategy::SessionId { ttl, sweep, .. }) =
                profile.scorers.iter().find_map(|s| match &s.kind {
                    super::epp::EppScorerKind::SessionAffinity(st) if &s.name == instance => {
                        Some(st)
                    }
                    _ => None,
                })
            else {
                continue;
            };
            self.counters.sessions.commit(
                (instance, session),
                decision.primary().label(),
                &candidates,
                *ttl,
                *sweep,
                now,
            );
        }
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
            self.count_pick(
                config,
                &pd.prefill,
                pd.prefill_candidates,
                pd.prefill_uncached,
            );
        }
        let pins = pd.prefill.timing().map(|t| t.kv().pins());
        self.hold_pinning(model, &decision.hashes, pd.prefill.slot(), None, pins)
    }

    /// Counts an affinity pick of `pod` among `candidates` in its recent share, with the
    /// `uncached` prompt tokens it wrote.
    fn count_pick<C: Candidate>(
        &self,
        config: &affinity::AffinityConfig,
        pod: &C,
        candidates: usize,
        uncached: f64,
    ) {
        let keep = affinity::keep_factor(config.share_window, candidates);
        let now = self.counters.picks.fetch_add(1, Ordering::Relaxed) as u32;
        pod.recent().add(now, keep, uncached);
    }

    /// Holds `hashes` tentatively for the pod in `pod` until the request ends (affinity mode
    /// with `tentative`); `None` when there is nothing to hold. `engine`: the pod's live view and
    /// the token-chain hash of the request's head's last full block: the hold claims its blocks
    /// until that view stores it.
    pub fn hold_tentative(
        &self,
        model: &str,
        hashes: &[BlockHash],
        pod: PodSlot,
        engine: Option<(&EngineView, u64)>,
    ) -> Option<TentativeHold> {
        self.hold_pinning(model, hashes, pod, engine, None)
    }

    /// [`hold_tentative`](Scheduler::hold_tentative), the hold counted in `pins`, the pod's
    /// blocks in flight ([`super::kv_room`]), until it ends.
    fn hold_pinning(
        &self,
        model: &str,
        hashes: &[BlockHash],
        pod: PodSlot,
        engine: Option<(&EngineView, u64)>,
        pins: Option<PinnedBlocks>,
    ) -> Option<TentativeHold> {
        let config = self.config.affinity.as_ref()?;
        if !config.tentative || hashes.is_empty() {
            return None;
        }
        let engine = engine.map(|(view, block)| view.await_block(block));
        let (id, pinned) =
            self.tentative
                .add_awaiting(ModelKey::of(model), hashes.into(), pod, engine.clone())?;
        if let Some(pins) = &pins {
            pins.pin(pinned);
        }
        Some(TentativeHold {
            entries: self.tentative.clone(),
            id,
            pod,
            engine,
            pins,
        })
    }
}
