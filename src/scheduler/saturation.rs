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

use super::Candidate;

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
