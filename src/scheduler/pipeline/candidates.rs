//! Step 1, candidates: the pods a decision chooses from are the caller's (the pods serving the
//! request's model, narrowed by a subset hint; in PD mode the decode pods, then each kept decode
//! pod's prefill pods, [`crate::scheduler::pd`]), in the caller's order: positions in it are how
//! every later step names a pod. What the scheduler looks up among them itself: where the
//! session's pod is.

use crate::prefix_index::PodSlot;
use crate::scheduler::Candidate;

/// Where the session's pod is among `candidates`, if it is one (the filters may have removed
/// it, or it may serve the model no more).
pub(super) fn session_position<C: Candidate>(
    candidates: &[C],
    pod: Option<PodSlot>,
) -> Option<usize> {
    let pod = pod?;
    candidates.iter().position(|c| c.slot() == pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::test_pod::Pod;
    use crate::scheduler::{EngineStats, Scheduler};

    #[test]
    fn the_session_pod_is_found_by_its_slot_among_the_candidates() {
        let s = Scheduler::new(Default::default(), 5, 1);
        let pods: Vec<Pod> = (0..3)
            .map(|i| Pod {
                handle: s.prefix_cache().index().add_pod(),
                label: format!("default/pod-{i}"),
                labels: Default::default(),
                stats: EngineStats::default(),
                recent: RecentPicks::default(),
                rendezvous: i,
                engine: None,
            })
            .collect();
        assert_eq!(session_position(&pods, Some(pods[2].slot())), Some(2));
        assert_eq!(session_position(&pods, None), None);
        let gone = s.prefix_cache().index().add_pod();
        assert_eq!(session_position(&pods, Some(gone.slot())), None);
    }
}
