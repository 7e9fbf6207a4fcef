//! Prefill/decode (PD) disaggregation, as Kthena's `scheduler_impl.go` schedules a model server
//! with a `workloadSelector.pdGroup` (volcano-sh/kthena 3cc0572).
//!
//! A [`PdGroup`] (`groupKey`, `prefillLabels`, `decodeLabels`) sorts pods: a pod whose
//! `groupKey` label is absent or empty belongs to no group; otherwise it is a decode pod when it
//! carries every decode label, else a prefill pod when it carries every prefill label (an absent
//! label reads as `""`, an empty label set matches nothing), else neither (it gets no inference
//! traffic). Scheduling, one request:
//! 1. no decode pod: `no decode pod found`;
//! 2. the decode pods pass the filters (none left: the filter's error) and are scored; the best
//!    five (Kthena's `topN`) are kept, in order;
//! 3. for each of them, the prefill pods of its group (same `groupKey` value) pass the filters
//!    and are scored, and the best one is its pair; a decode pod whose group has no prefill pod,
//!    or whose prefill pods are all filtered out, has none;
//! 4. no pair at all: `no valid prefill-decode pod pairs found`.
//!
//! Each pass is the mode's ordinary decision over its pods (Kthena's weighted scores, or the
//! affinity pick), so the match-ratio histogram observes once per pass. The pick is the first
//! decode pod with a pair; its fallbacks are the later kept decode pods of the same group (their
//! pair would be drawn from the same prefill pods), and the primary's pair is the prefill pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

use super::{
    Candidate, Decision, DecisionReason, Filtered, Observation, PickError, RouteRequest, Scheduler,
};

/// Kthena's `topN`: decode pods kept after scoring, each tried for a pair.
pub const TOP_DECODE: usize = 5;

/// A pod's part in PD serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PdRole {
    Prefill,
    Decode,
}

impl PdRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        }
    }
}

/// A `pdGroup` that cannot sort pods.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum PdGroupError {
    #[error("pdGroup.groupKey must be a non-empty label key, got {0:?}")]
    GroupKey(String),
    #[error("pdGroup.{0} must list at least one label (an empty set matches no pod)")]
    NoLabels(&'static str),
    #[error(
        "pdGroup: prefillLabels and decodeLabels are the same ({0}): every pod would be a decode pod"
    )]
    SameLabels(String),
}

/// Kthena's `workloadSelector.pdGroup`: how pods are sorted into roles and groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdGroup {
    group_key: String,
    prefill_labels: BTreeMap<String, String>,
    decode_labels: BTreeMap<String, String>,
}

impl PdGroup {
    pub fn try_new(
        group_key: String,
        prefill_labels: BTreeMap<String, String>,
        decode_labels: BTreeMap<String, String>,
    ) -> Result<PdGroup, PdGroupError> {
        if group_key.trim().is_empty() {
            return Err(PdGroupError::GroupKey(group_key));
        }
        if prefill_labels.is_empty() {
            return Err(PdGroupError::NoLabels("prefillLabels"));
        }
        if decode_labels.is_empty() {
            return Err(PdGroupError::NoLabels("decodeLabels"));
        }
        if prefill_labels == decode_labels {
            let shown: Vec<String> = decode_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            return Err(PdGroupError::SameLabels(shown.join(",")));
        }
        Ok(PdGroup {
            group_key,
            prefill_labels,
            decode_labels,
        })
    }

    pub fn group_key(&self) -> &str {
        &self.group_key
    }

    pub fn prefill_labels(&self) -> &BTreeMap<String, String> {
        &self.prefill_labels
    }

    pub fn decode_labels(&self) -> &BTreeMap<String, String> {
        &self.decode_labels
    }

    /// Every label key the group reads (discovery keeps these of a pod's labels).
    pub fn label_keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.group_key.as_str())
            .chain(self.prefill_labels.keys().map(String::as_str))
            .chain(self.decode_labels.keys().map(String::as_str))
    }

    /// The pod's role and group value (Kthena's `categorizePodForPDGroup`): `None` for a pod
    /// without a group value or matching neither label set. `label` reads one pod label.
    pub fn classify<'a>(
        &self,
        label: impl Fn(&str) -> Option<&'a str>,
    ) -> Option<(PdRole, &'a str)> {
        let group = label(&self.group_key).filter(|g| !g.is_empty())?;
        let matches = |required: &BTreeMap<String, String>| {
            required
                .iter()
                .all(|(k, v)| label(k).unwrap_or_default() == v.as_str())
        };
        if matches(&self.decode_labels) {
            Some((PdRole::Decode, group))
        } else if matches(&self.prefill_labels) {
            Some((PdRole::Prefill, group))
        } else {
            None
        }
    }

    /// [`PdGroup::classify`] of a candidate.
    pub fn role_of<'a, C: Candidate>(&self, pod: &'a C) -> Option<(PdRole, &'a str)> {
        self.classify(|k| pod.pod_label(k))
    }
}

/// One kept decode pod's search for a prefill pod, in the order run (Kthena's log order).
#[derive(Debug, Clone)]
pub enum PrefillPass<C> {
    /// The prefill pods of the decode pod's group were scored; the decision's primary is the
    /// best (its hashes are the request's, kept once in the outer decision).
    Scored {
        decode: C,
        decision: Box<Decision<C>>,
    },
    /// The decode pod's group has no prefill pod.
    NoPrefillPods { decode: C },
    /// The filters left none of the group's prefill pods.
    FilteredOut { decode: C, filter: &'static str },
}

/// A PD decision's pairing: the prefill pod named for the decode pick, and every prefill pass.
#[derive(Debug, Clone)]
pub struct PdPairing<C> {
    pub prefill: C,
    /// Why the prefill pass picked it (an affinity pick joins the pod's recent share).
    pub prefill_reason: DecisionReason,
    /// Pods the prefill pass chose from (the affinity mode's share window).
    pub prefill_candidates: usize,
    /// Prompt tokens the prefill pod did not hold, as its pass predicted (affinity mode; else 0).
    pub prefill_uncached: f64,
    pub passes: Vec<PrefillPass<C>>,
}

/// A PD request that could not be scheduled, and what was observed until then.
#[derive(Debug, Clone, PartialEq)]
pub struct Unpaired {
    pub error: PickError,
    pub observations: Vec<Observation>,
}

impl From<Filtered> for Unpaired {
    fn from(f: Filtered) -> Self {
        Unpaired {
            error: PickError::Filtered(f.filter),
            observations: f.observations,
        }
    }
}

impl From<Unpaired> for PickError {
    fn from(u: Unpaired) -> Self {
        u.error
    }
}

impl Scheduler {
    /// Schedules a request of a PD model server: a decode pod (primary + same-group
    /// fallbacks) and its prefill pair ([`Decision::pd`]). The decision returns what it
    /// observed; a routed request then commits it ([`Scheduler::commit`],
    /// [`Scheduler::commit_prefill`]).
    pub fn schedule_pd<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: impl Into<Arc<[C]>>,
        group: &PdGroup,
    ) -> Result<Decision<C>, Unpaired> {
        self.decide_pd(request, &candidates.into(), group, true)
    }

    /// The decision [`schedule_pd`](Scheduler::schedule_pd) would make now, changing no state.
    pub fn explain_pd<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: impl Into<Arc<[C]>>,
        group: &PdGroup,
    ) -> Result<Decision<C>, Unpaired> {
        self.decide_pd(request, &candidates.into(), group, false)
    }

    fn decide_pd<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        candidates: &[C],
        group: &PdGroup,
        take: bool,
    ) -> Result<Decision<C>, Unpaired> {
        let started = Instant::now();
        let roles: Vec<Option<(PdRole, &str)>> =
            candidates.iter().map(|c| group.role_of(c)).collect();
        // 1. no decode pod: Kthena's error.
        let decode = of_role(candidates, &roles, |r| matches!(r, (PdRole::Decode, _)));
        if decode.is_empty() {
            return Err(Unpaired {
                error: PickError::NoDecodePod,
                observations: Vec::new(),
            });
        }
        // 2. the decode pass: the best five decode pods.
        let mut decision = self.decide(request, decode, take, TOP_DECODE)?;
        let mut observations = std::mem::take(&mut decision.observations);
        // 3. a prefill pass per kept decode pod; the prompt hashed once, by the decode pass.
        let prefill_request = RouteRequest {
            hashes: Some(&decision.hashes),
            ..request
        };
        let mut passes = Vec::with_capacity(decision.ranked.len());
        let mut paired = None;
        for (i, d) in decision.ranked.iter().enumerate() {
            let own = group.role_of(d).map(|(_, g)| g);
            let prefill = of_role(
                candidates,
                &roles,
                |r| matches!(r, (PdRole::Prefill, g) if Some(*g) == own),
            );
            let pass = self.prefill_pass(prefill_request, d, prefill, take, &mut observations);
            if let (None, PrefillPass::Scored { decision: p, .. }) = (&paired, &pass) {
                paired = Some((i, PdPairing::of(p)));
            }
            passes.push(pass);
        }
        // 4. no pair at all: Kthena's error; else the first decode pod with a pair.
        let Some((primary, pairing)) = paired else {
            return Err(Unpaired {
                error: PickError::NoPdPair,
                observations,
            });
        };
        self.keep_paired(&mut decision, primary, group);
        decision.pd = Some(PdPairing { passes, ..pairing });
        decision.observations = observations;
        decision.duration = started.elapsed();
        Ok(decision)
    }

    /// One kept decode pod's prefill pass over its group's prefill pods.
    fn prefill_pass<C: Candidate + Clone>(
        &self,
        request: RouteRequest<'_>,
        decode: &C,
        prefill: Arc<[C]>,
        take: bool,
        observations: &mut Vec<Observation>,
    ) -> PrefillPass<C> {
        let decode = decode.clone();
        if prefill.is_empty() {
            return PrefillPass::NoPrefillPods { decode };
        }
        match self.decide(request, prefill, take, 1) {
            Err(f) => {
                observations.extend(f.observations);
                PrefillPass::FilteredOut {
                    decode,
                    filter: f.filter,
                }
            }
            Ok(mut p) => {
                observations.append(&mut p.observations);
                p.hashes = Vec::new();
                PrefillPass::Scored {
                    decode,
                    decision: Box::new(p),
                }
            }
        }
    }

    /// The decode pick becomes the first kept decode pod with a pair (`primary`); its fallbacks,
    /// the later kept decode pods of its group.
    fn keep_paired<C: Candidate + Clone>(
        &self,
        decision: &mut Decision<C>,
        primary: usize,
        group: &PdGroup,
    ) {
        if primary > 0 {
            // The best decode pods had no pair: the pick's reason and prediction are its own.
            decision.reason = reason_for(decision, &decision.ranked[primary]);
            decision.predicted_blocks = 0;
        }
        let own = group.role_of(&decision.ranked[primary]).map(|(_, g)| g);
        let ranked: Vec<C> = decision.ranked[primary..]
            .iter()
            .filter(|d| group.role_of(*d).map(|(_, g)| g) == own)
            .take(self.max_endpoints)
            .cloned()
            .collect();
        decision.ranked = ranked;
    }
}

impl<C: Candidate + Clone> PdPairing<C> {
    /// The pairing a scored prefill pass names (its passes are added once all have run).
    fn of(pass: &Decision<C>) -> PdPairing<C> {
        PdPairing {
            prefill: pass.primary().clone(),
            prefill_reason: pass.reason,
            prefill_candidates: pass.candidates.len(),
            prefill_uncached: pass.primary_prediction().map_or(0.0, |p| p.uncached_tokens),
            passes: Vec::new(),
        }
    }
}

/// The candidates whose role (and group) `keep` accepts, in order.
fn of_role<C: Clone>(
    candidates: &[C],
    roles: &[Option<(PdRole, &str)>],
    keep: impl Fn(&(PdRole, &str)) -> bool,
) -> Arc<[C]> {
    candidates
        .iter()
        .zip(roles)
        .filter(|(_, r)| r.as_ref().is_some_and(&keep))
        .map(|(c, _)| c.clone())
        .collect()
}

/// The reason of a weighted decision had `pick` been its first: a prefix hit when `pick` holds
/// a prefix. Affinity reasons are the mode's own and kept.
fn reason_for<C: Candidate>(decision: &Decision<C>, pick: &C) -> DecisionReason {
    let prefix = decision
        .plugins
        .iter()
        .find(|p| p.plugin == super::ScorerKind::PrefixCache.as_str())
        .and_then(|p| p.scores.as_ref());
    let at = decision
        .candidates
        .iter()
        .position(|c| c.slot() == pick.slot());
    match (decision.reason, prefix, at) {
        (
            DecisionReason::PrefixHit
            | DecisionReason::PrefixOverruled
            | DecisionReason::PrefixMiss,
            Some(s),
            Some(at),
        ) => {
            if s[at] > 0 {
                DecisionReason::PrefixHit
            } else if s.iter().any(|&x| x > 0) {
                DecisionReason::PrefixOverruled
            } else {
                DecisionReason::PrefixMiss
            }
        }
        (reason, ..) => reason,
    }
}

#[cfg(test)]
mod tests;
