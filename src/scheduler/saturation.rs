//! Load shedding (`picker.loadShedding`): refuse a request when every candidate is saturated,
//! before the filters run, as GIE's picker does (its saturation detector and admission check).
//!
//! A candidate is *saturated* when its engine queue exceeds `queueDepth` (default 5), its KV
//! cache usage exceeds `kvCacheUtilization` (default 0.8), or the router's own in-flight count
//! reaches `maxInFlightPerPod` (unset: no such limit). Queue and in-flight are compared as the
//! affinity mode compares them (`maxQueue`, `podCapacity`: a queue *over* the limit, in-flight
//! *at* it), the queue and KV usage as GIE's detector does (both strictly over). The engine's
//! signals count only while fresh: stats older than the staleness bound, or never scraped, are
//! ignored (the pod is then saturated only by its in-flight count). GIE counts stale pods as
//! saturated; it sheds only sheddable requests, we shed every request, so an engine scrape that
//! fails must not turn into refusing all traffic. No candidate at all is not a shed (the caller
//! answers 503 as before).

use std::time::Duration;

use super::latency::{PodTiming, Pool, Signals};
use super::{Candidate, Scheduler};

/// Flow control's measure of room (`picker.flowControl`): a pod can take a request now when its
/// requests in flight are under the concurrency the latency model learned for its engine (a pod
/// that learned none borrows the least its fellow candidates learned; none anywhere: room), its
/// predicted wait for a slot is at most `max_wait` seconds (an engine queue the last scrape
/// showed, drained at the pod's pace), and, when set, its in-flight count is under
/// `max_inflight`; when `max_inflight_total` is set, no candidate has room while the candidates'
/// in-flight counts together reach it (Kthena's per-model `FAIRNESS_MAX_CONCURRENT`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoomLimits {
    pub max_wait: f64,
    pub max_inflight: Option<u32>,
    pub max_inflight_total: Option<u32>,
}

impl RoomLimits {
    /// How many more requests the candidates may take together by `max_inflight_total` (their
    /// in-flight counts less `held(c)` each); `usize::MAX` without it.
    pub fn total_budget<C: Candidate>(&self, candidates: &[C], held: impl Fn(&C) -> i64) -> usize {
        let Some(max) = self.max_inflight_total else {
            return usize::MAX;
        };
        let inflight: i64 = candidates.iter().map(|c| c.inflight() - held(c)).sum();
        usize::try_from(i64::from(max) - inflight).unwrap_or(0)
    }
}

impl Scheduler {
    /// The candidates that have room by [`RoomLimits`] (their positions).
    pub fn with_room<C: Candidate>(&self, candidates: &[C], limits: RoomLimits) -> Vec<usize> {
        self.with_room_held(candidates, limits, |_| 0)
    }

    /// [`Scheduler::with_room`], not counting `held(c)` of each candidate's requests in flight
    /// (flow control's requests picked for the pod and still held in its queue: not sent yet).
    pub fn with_room_held<C: Candidate>(
        &self,
        candidates: &[C],
        limits: RoomLimits,
        held: impl Fn(&C) -> i64,
    ) -> Vec<usize> {
        if limits.total_budget(candidates, &held) == 0 {
            return Vec::new();
        }
        let mut pool = self.room_pool();
        pool.concurrency = candidates
            .iter()
            .filter_map(|c| c.timing().and_then(PodTiming::concurrency))
            .reduce(f64::min);
        candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let inflight = c.inflight() - held(c);
                let under = limits
                    .max_inflight
                    .is_none_or(|max| inflight < i64::from(max));
                under
                    && c.timing()
                        .is_none_or(|t| pod_room(*c, inflight, t, pool, limits.max_wait))
            })
            .map(|(i, _)| i)
            .collect()
    }

    fn room_pool(&self) -> Pool {
        let signals = self.affinity().map_or(Signals::ALL, |a| a.latency_signals);
        Pool {
            concurrency: None,
            service: self.counters.prefill.service(),
            signals,
        }
    }

    /// Whether some candidate has room by [`RoomLimits`] (none when there are no candidates);
    /// stops at the first that has. Lock-free: atomic reads of each pod's counts.
    pub fn has_room<C: Candidate>(&self, candidates: &[C], limits: RoomLimits) -> bool {
        if limits.total_budget(candidates, |_| 0) == 0 {
            return false;
        }
        let mut pool = self.room_pool();
        let under = |c: &C| {
            limits
                .max_inflight
                .is_none_or(|max| c.inflight() < i64::from(max))
        };
        let (mut learned, mut unlearned) = (None::<f64>, false);
        for c in candidates {
            let Some(t) = c.timing() else {
                if under(c) {
                    return true;
                }
                continue;
            };
            match t.concurrency() {
                Some(k) => {
                    learned = Some(learned.map_or(k, |l: f64| l.min(k)));
                    if under(c) && pod_room(c, c.inflight(), t, pool, limits.max_wait) {
                        return true;
                    }
                }
                None => unlearned = true,
            }
        }
        if !unlearned {
            return false;
        }
        pool.concurrency = learned;
        candidates.iter().any(|c| {
            c.timing().is_some_and(|t| {
                t.concurrency().is_none()
                    && under(c)
                    && pod_room(c, c.inflight(), t, pool, limits.max_wait)
            })
        })
    }
}

/// One pod's room with `inflight` requests in flight: a free slot and a predicted wait of at
/// most `max_wait`.
fn pod_room<C: Candidate>(c: &C, inflight: i64, t: &PodTiming, pool: Pool, max_wait: f64) -> bool {
    if !t.has_slot(inflight, pool) {
        return false;
    }
    let waiting = c.waiting();
    let age = if waiting > 0.0 { c.stats_age() } else { None };
    t.wait(inflight, waiting, age, pool) <= max_wait
}

/// When a pod counts as saturated (validated: every number in range).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SaturationLimits {
    /// Saturated when the engine queue is over this.
    pub queue_depth: u32,
    /// Saturated when the engine's KV cache usage (0..1) is over this.
    pub kv_cache_utilization: f64,
    /// Saturated when the router's in-flight count reaches this.
    pub max_inflight: Option<u32>,
    /// Engine stats older than this (or never scraped) are ignored.
    pub staleness: Duration,
}

impl Default for SaturationLimits {
    fn default() -> Self {
        SaturationLimits {
            queue_depth: 5,
            kv_cache_utilization: 0.8,
            max_inflight: None,
            staleness: Duration::from_secs(3),
        }
    }
}

/// Which limit a saturated pod is over (the first found, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saturation {
    InFlight,
    Queue,
    KvCache,
}

/// Every candidate was saturated: how many, and over which limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shed {
    pub in_flight: usize,
    pub queue: usize,
    pub kv_cache: usize,
}

impl Shed {
    /// The candidates that were saturated (all of them).
    pub fn candidates(&self) -> usize {
        self.in_flight + self.queue + self.kv_cache
    }
}

impl SaturationLimits {
    /// Which limit `pod` is over, if any.
    pub fn saturation<C: Candidate>(&self, pod: &C) -> Option<Saturation> {
        if self
            .max_inflight
            .is_some_and(|max| pod.inflight() >= i64::from(max))
        {
            return Some(Saturation::InFlight);
        }
        // Stale or never scraped: the engine's signals say nothing (see the module header).
        if pod.stats_age().is_none_or(|age| age > self.staleness) {
            return None;
        }
        let stats = pod.stats();
        if stats.waiting > f64::from(self.queue_depth) {
            Some(Saturation::Queue)
        } else if stats.kv_usage > self.kv_cache_utilization {
            Some(Saturation::KvCache)
        } else {
            None
        }
    }

    /// `Some` when every candidate is saturated (and there is at least one); `None` as soon as
    /// one has headroom.
    pub fn shed<C: Candidate>(&self, candidates: &[C]) -> Option<Shed> {
        let mut shed = Shed::default();
        for pod in candidates {
            match self.saturation(pod)? {
                Saturation::InFlight => shed.in_flight += 1,
                Saturation::Queue => shed.queue += 1,
                Saturation::KvCache => shed.kv_cache += 1,
            }
        }
        (shed.candidates() > 0).then_some(shed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix_index::PodSlot;
    use crate::scheduler::EngineStats;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::latency::PodTiming;

    #[derive(Debug, Default)]
    struct Pod {
        inflight: i64,
        stats: EngineStats,
        age: Option<Duration>,
        recent: RecentPicks,
    }

    impl Candidate for Pod {
        fn slot(&self) -> PodSlot {
            PodSlot(0)
        }
        fn inflight(&self) -> i64 {
            self.inflight
        }
        fn stats(&self) -> EngineStats {
            self.stats
        }
        fn stats_age(&self) -> Option<Duration> {
            self.age
        }
        fn recent(&self) -> &RecentPicks {
            &self.recent
        }
        fn rendezvous(&self) -> u64 {
            0
        }
        fn label(&self) -> &str {
            "default/pod"
        }
    }

    const FRESH: Option<Duration> = Some(Duration::from_millis(100));

    fn pod(inflight: i64, waiting: f64, kv_usage: f64, age: Option<Duration>) -> Pod {
        Pod {
            inflight,
            stats: EngineStats {
                waiting,
                kv_usage,
                ..EngineStats::default()
            },
            age,
            ..Pod::default()
        }
    }

    fn limits(max_inflight: Option<u32>) -> SaturationLimits {
        SaturationLimits {
            max_inflight,
            ..SaturationLimits::default()
        }
    }

    #[test]
    fn all_saturated_is_shed_naming_the_limits() {
        let pods = [
            pod(0, 6.0, 0.0, FRESH),
            pod(0, 0.0, 0.81, FRESH),
            pod(4, 0.0, 0.0, None),
        ];
        assert_eq!(
            limits(Some(4)).shed(&pods),
            Some(Shed {
                in_flight: 1,
                queue: 1,
                kv_cache: 1
            })
        );
    }

    #[test]
    fn one_pod_with_headroom_is_not_shed() {
        // At the limits is not over them (queue 5, KV 0.8); in-flight one under its limit.
        let spare = [
            pod(0, 5.0, 0.8, FRESH),
            pod(3, 0.0, 0.0, FRESH),
            pod(0, 0.0, 1.0, FRESH),
        ];
        let l = limits(Some(4));
        assert_eq!(l.saturation(&spare[0]), None);
        assert_eq!(l.saturation(&spare[1]), None);
        assert_eq!(l.shed(&spare), None);
        let busy = [pod(0, 9.0, 0.0, FRESH), pod(0, 0.0, 0.0, FRESH)];
        assert_eq!(l.shed(&busy), None);
    }

    #[test]
    fn stale_or_unscraped_engine_stats_do_not_saturate_but_in_flight_does() {
        let l = SaturationLimits {
            staleness: Duration::from_secs(2),
            ..limits(Some(8))
        };
        let stale = Some(Duration::from_secs(3));
        assert_eq!(l.saturation(&pod(0, 50.0, 1.0, stale)), None);
        assert_eq!(l.saturation(&pod(0, 50.0, 1.0, None)), None);
        assert_eq!(
            l.saturation(&pod(0, 50.0, 1.0, Some(Duration::from_secs(2)))),
            Some(Saturation::Queue)
        );
        assert_eq!(
            l.saturation(&pod(8, 0.0, 0.0, None)),
            Some(Saturation::InFlight)
        );
        assert_eq!(l.shed(&[pod(0, 50.0, 1.0, stale)]), None);
    }

    #[test]
    fn no_in_flight_limit_unless_set_and_no_candidates_is_not_shed() {
        assert_eq!(
            limits(None).saturation(&pod(1 << 40, 0.0, 0.0, FRESH)),
            None
        );
        assert_eq!(limits(Some(1)).shed::<Pod>(&[]), None);
    }

    #[test]
    fn the_scheduler_sheds_only_when_configured() {
        use crate::scheduler::Scheduler;
        use crate::scheduler::config::SchedulerConfig;
        let saturated = [pod(9, 50.0, 1.0, FRESH), pod(9, 50.0, 1.0, FRESH)];
        let off = Scheduler::new(SchedulerConfig::default(), 5, 0);
        assert_eq!(off.shed(&saturated), None, "off by default");
        let on = Scheduler::new(
            SchedulerConfig {
                load_shedding: Some(SaturationLimits::default()),
                ..SchedulerConfig::default()
            },
            5,
            0,
        );
        assert_eq!(on.shed(&saturated).map(|s| s.candidates()), Some(2));
        assert_eq!(on.shed(&saturated[..1]).map(|s| s.queue), Some(1));
    }

    /// A pod with the latency model's timing, for flow control's room.
    #[derive(Default)]
    struct Timed {
        inflight: i64,
        waiting: f64,
        timing: PodTiming,
        recent: RecentPicks,
    }

    impl Candidate for Timed {
        fn slot(&self) -> PodSlot {
            PodSlot(0)
        }
        fn inflight(&self) -> i64 {
            self.inflight
        }
        fn stats(&self) -> EngineStats {
            EngineStats {
                waiting: self.waiting,
                ..EngineStats::default()
            }
        }
        fn stats_age(&self) -> Option<Duration> {
            Some(Duration::ZERO)
        }
        fn timing(&self) -> Option<&PodTiming> {
            Some(&self.timing)
        }
        fn recent(&self) -> &RecentPicks {
            &self.recent
        }
        fn rendezvous(&self) -> u64 {
            0
        }
        fn label(&self) -> &str {
            "default/timed"
        }
    }

    /// A pod with `inflight` requests whose engine showed `concurrency` running with a queue
    /// (None: never showed one).
    fn timed(inflight: i64, concurrency: Option<f64>) -> Timed {
        let t = Timed {
            inflight,
            ..Timed::default()
        };
        if let Some(c) = concurrency {
            t.timing.observe_engine(c, 1.0, 0.0);
        }
        t
    }

    #[test]
    fn room_is_in_flight_under_the_learned_concurrency() {
        use crate::scheduler::Scheduler;
        use crate::scheduler::config::SchedulerConfig;
        let s = Scheduler::new(SchedulerConfig::default(), 5, 0);
        let limits = RoomLimits {
            max_wait: 1.0,
            max_inflight: None,
            max_inflight_total: None,
        };
        // Nothing learned anywhere: room (nothing is known to be full).
        assert!(s.has_room(&[timed(50, None)], limits));
        // Two slots each, both full: none; one frees: room.
        let full = [timed(2, Some(2.0)), timed(2, Some(2.0))];
        assert!(!s.has_room(&full, limits));
        assert!(s.has_room(&[timed(2, Some(2.0)), timed(1, Some(2.0))], limits));
        // A pod that learned nothing borrows the least learned: full at 4 as well.
        assert!(!s.has_room(&[timed(4, Some(4.0)), timed(4, None)], limits));
        assert!(s.has_room(&[timed(4, Some(4.0)), timed(3, None)], limits));
        let mixed = [timed(3, Some(4.0)), timed(2, None), timed(1, Some(2.0))];
        assert_eq!(s.with_room(&mixed, limits), [0, 2]);
        // No candidates: no room.
        assert!(!s.has_room::<Timed>(&[], limits));
        // A static limit applies on top.
        let capped = RoomLimits {
            max_inflight: Some(1),
            ..limits
        };
        assert!(!s.has_room(&[timed(1, None)], capped));
        assert!(s.has_room(&[timed(0, None)], capped));
        // A bound on the candidates together: none once their counts reach it.
        let total = RoomLimits {
            max_inflight_total: Some(3),
            ..limits
        };
        let two_pods = [timed(1, None), timed(1, None)];
        assert!(s.has_room(&two_pods, total));
        assert_eq!(total.total_budget(&two_pods, |_| 0), 1);
        let three = [timed(2, None), timed(1, None)];
        assert!(!s.has_room(&three, total));
        assert!(s.with_room(&three, total).is_empty());
        assert_eq!(s.with_room_held(&three, total, |_| 1), [0, 1]);
        assert_eq!(limits.total_budget(&three, |_| 0), usize::MAX);
        // A free slot behind an engine queue (other clients') predicted over max_wait: none.
        let mut queued = timed(0, Some(2.0));
        queued.waiting = 10.0;
        assert!(!s.has_room(std::slice::from_ref(&queued), limits));
    }

    #[test]
    fn queue_depth_zero_saturates_on_any_queue() {
        let l = SaturationLimits {
            queue_depth: 0,
            ..SaturationLimits::default()
        };
        assert_eq!(l.saturation(&pod(0, 0.0, 0.0, FRESH)), None);
        assert_eq!(
            l.saturation(&pod(0, 1.0, 0.0, FRESH)),
            Some(Saturation::Queue)
        );
    }
}
