//! lora-affinity (Kthena's filter): keep the pods that serve the request's model.
//!
//! Kthena's `LoraAffinity.Filter` (`pkg/kthena-router/scheduler/plugins/lora_affinity.go`,
//! volcano-sh/kthena 3cc05728) keeps a pod iff its model set contains the request's `model`,
//! by exact string. The set is what the engine's `GET /v1/models` listed at the last scrape
//! (`pkg/kthena-router/backend/vllm/models.go`: every `data[].id`, the base model and each
//! loaded LoRA adapter); a pod never listed holds no model and is filtered out; a failed
//! fetch keeps the previous list (`datastore/store.go`, `updatePodModels`). No arguments, no
//! log line of its own: when it leaves no pod the decision ends, naming it
//! ([`crate::scheduler::Filtered`], Kthena's `pods have all been filtered out by
//! "lora-affinity"`).
//!
//! It is a hard constraint, not a load signal: unlike least-request it also runs under the
//! affinity mode's latency model ([`super::pipeline`], step 2).

use std::sync::Arc;

use super::Candidate;

/// Keeps the candidates whose engine serves `model`; the shared list is copied only when the
/// filter removes a pod.
pub fn filter<C: Candidate + Clone>(candidates: &mut Arc<[C]>, model: &str) {
    if candidates.iter().all(|e| e.serves_model(model)) {
        return;
    }
    *candidates = candidates
        .iter()
        .filter(|e| e.serves_model(model))
        .cloned()
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Scheduler;
    use crate::scheduler::test_pod::Pod;

    /// A test pod with a `/v1/models` listing (`None`: never listed).
    struct Listed(Pod, Option<Vec<String>>);

    impl Candidate for Listed {
        fn slot(&self) -> crate::prefix_index::PodSlot {
            self.0.slot()
        }
        fn inflight(&self) -> i64 {
            0
        }
        fn stats(&self) -> crate::scheduler::EngineStats {
            self.0.stats
        }
        fn recent(&self) -> &crate::scheduler::affinity::RecentPicks {
            &self.0.recent
        }
        fn rendezvous(&self) -> u64 {
            0
        }
        fn label(&self) -> &str {
            &self.0.label
        }
        fn serves_model(&self, model: &str) -> bool {
            self.1
                .as_ref()
                .is_some_and(|m| m.iter().any(|s| s == model))
        }
    }

    fn pods(models: &[Option<&[&str]>]) -> Arc<[Arc<Listed>]> {
        let s = Scheduler::new(Default::default(), 5, 1);
        models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let pod = Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: format!("default/pod-{i}"),
                    labels: Default::default(),
                    stats: Default::default(),
                    recent: Default::default(),
                    rendezvous: 0,
                    engine: None,
                };
                Arc::new(Listed(
                    pod,
                    m.map(|m| m.iter().map(|s| s.to_string()).collect()),
                ))
            })
            .collect()
    }

    fn kept(candidates: &Arc<[Arc<Listed>]>) -> Vec<&str> {
        candidates.iter().map(|p| p.0.label.as_str()).collect()
    }

    /// Kthena's `TestLoraAffinityFilter` cases (`lora_affinity_test.go`).
    #[test]
    fn keeps_the_pods_listing_the_model_as_kthena_does() {
        let listing: [Option<&[&str]>; 3] = [
            Some(&["base-model", "adapter-a"]),
            Some(&["base-model", "adapter-b"]),
            Some(&[""]),
        ];
        let mut c = pods(&listing[..0]);
        filter(&mut c, "adapter-a");
        assert!(c.is_empty(), "empty pod list");
        let mut c = pods(&listing);
        filter(&mut c, "adapter-a");
        assert_eq!(kept(&c), ["default/pod-0"]);
        let mut c = pods(&listing);
        filter(&mut c, "missing-adapter");
        assert!(c.is_empty());
        let mut c = pods(&listing);
        filter(&mut c, "");
        assert_eq!(
            kept(&c),
            ["default/pod-2"],
            "an empty model matches only \"\""
        );
        let mut c = pods(&listing);
        filter(&mut c, "base-model");
        assert_eq!(kept(&c), ["default/pod-0", "default/pod-1"]);
    }

    #[test]
    fn a_pod_never_listed_serves_nothing_and_the_list_is_shared_when_all_stay() {
        let mut c = pods(&[None, Some(&["m"])]);
        filter(&mut c, "m");
        assert_eq!(kept(&c), ["default/pod-1"]);
        let before = Arc::as_ptr(&c);
        filter(&mut c, "m");
        assert_eq!(Arc::as_ptr(&c), before, "nothing removed: not copied");
    }
}
