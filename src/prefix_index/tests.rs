//! The LRU facts of the semantics doc §3, a property test of the index against a simple,
//! obviously correct reference model, and a stress test of concurrent records, scores and pod
//! removals that checks the reverse map against the lists afterwards.

use std::collections::VecDeque;

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;

fn hashes(v: &[u64]) -> Vec<BlockHash> {
    v.iter().copied().map(BlockHash).collect()
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

const M: ModelKey = ModelKey(11);

#[test]
fn cap_two_add_three_evicts_deepest() {
    let index = PrefixIndex::new(2);
    let pod = index.add_pod();
    let out = index.record(&pod, M, &hashes(&[1, 2, 3]));
    assert_eq!(out.inserted, 3);
    assert_eq!(out.evicted, [(M, 1)]);
    let m = index.longest_matches(M, &hashes(&[1, 2, 3]), &[pod.slot()], 5, rng);
    assert_eq!(m, [2]);
}

#[test]
fn cap_three_add_five_evicts_five_then_four() {
    let index = PrefixIndex::new(3);
    let pod = index.add_pod();
    index.record(&pod, M, &hashes(&[1, 2, 3, 4, 5]));
    let keys: Vec<u64> = index
        .pod_keys_by_recency(pod.slot())
        .iter()
        .map(|k| k.hash.0)
        .collect();
    assert_eq!(keys, [1, 2, 3]);
    let m = index.longest_matches(M, &hashes(&[1, 2, 3, 4, 5]), &[pod.slot()], 5, rng);
    assert_eq!(m, [3]);
}

#[test]
fn evictions_are_counted_under_the_evicted_model() {
    let (m1, m2) = (ModelKey(1), ModelKey(2));
    let index = PrefixIndex::new(3);
    let pod = index.add_pod();
    index.record(&pod, m1, &hashes(&[1, 2]));
    index.record(&pod, m2, &hashes(&[3]));
    let out = index.record(&pod, m1, &hashes(&[5, 6]));
    assert_eq!(out.evicted, [(m1, 2)]);
    let keys: Vec<(u64, u64)> = index
        .pod_keys_by_recency(pod.slot())
        .iter()
        .map(|k| (k.model.0, k.hash.0))
        .collect();
    assert_eq!(keys, [(1, 5), (1, 6), (2, 3)]);
    // m1:2 went first, then m1:1: nobody holds them any more.
    assert!(index.pods_holding(m1, BlockHash(2)).is_empty());
    assert!(index.pods_holding(m1, BlockHash(1)).is_empty());
    let out = index.record(&pod, m1, &hashes(&[7]));
    assert_eq!(out.evicted, [(m2, 1)]);
}

#[test]
fn churn_is_what_a_pod_evicted_per_capacity_decaying_with_every_record() {
    let index = PrefixIndex::new(4);
    let (full, roomy) = (index.add_pod(), index.add_pod());
    // Filling a list evicts nothing: no churn.
    index.record(&full, M, &hashes(&[1, 2, 3, 4]));
    index.record(&roomy, M, &hashes(&[1]));
    assert_eq!(index.churn(&full), 0.0);
    // Two evictions out of a capacity of 4.
    index.record(&full, M, &hashes(&[5, 6]));
    let after = index.churn(&full);
    assert!((after - 0.5).abs() < 1e-6, "{after}");
    assert_eq!(index.churn(&roomy), 0.0);
    // Each record anywhere decays it (window: CHURN_WINDOW records per pod).
    index.record(&roomy, M, &hashes(&[2]));
    let keep = 1.0 - 1.0 / f64::from(CHURN_WINDOW * 2);
    assert!((index.churn(&full) - 0.5 * keep).abs() < 1e-6);
    // Refreshing held entries evicts nothing.
    index.record(&full, M, &hashes(&[5, 6]));
    assert!((index.churn(&full) - 0.5 * keep * keep).abs() < 1e-6);
}

#[test]
fn longest_match_per_pod() {
    let index = PrefixIndex::new(100);
    let p: Vec<PodHandle> = (0..3).map(|_| index.add_pod()).collect();
    index.record(&p[0], M, &hashes(&[1, 2, 3]));
    index.record(&p[1], M, &hashes(&[1, 2]));
    index.record(&p[2], M, &hashes(&[1, 4, 5]));
    let slots: Vec<PodSlot> = p.iter().map(|h| h.slot()).collect();
    let m = index.longest_matches(M, &hashes(&[1, 2, 3]), &slots, 5, rng);
    assert_eq!(m, [3, 2, 1]);
    // Only candidates count.
    let m = index.longest_matches(M, &hashes(&[1, 2, 3]), &slots[1..], 5, rng);
    assert_eq!(m, [2, 1]);
    // Other models never match.
    let m = index.longest_matches(ModelKey(99), &hashes(&[1, 2, 3]), &slots, 5, rng);
    assert_eq!(m, [0, 0, 0]);
}

#[test]
fn lookups_do_not_refresh_recency() {
    let index = PrefixIndex::new(2);
    let pod = index.add_pod();
    index.record(&pod, M, &hashes(&[1]));
    index.record(&pod, M, &hashes(&[2]));
    index.longest_matches(M, &hashes(&[1]), &[pod.slot()], 5, rng);
    index.record(&pod, M, &hashes(&[3]));
    // 1 was least recent despite the lookup, so it went.
    assert!(index.pods_holding(M, BlockHash(1)).is_empty());
}

#[test]
fn top_k_stops_early_and_breaks_ties_by_seed() {
    let index = PrefixIndex::new(100);
    let pods: Vec<PodHandle> = (0..8).map(|_| index.add_pod()).collect();
    for p in &pods {
        index.record(p, M, &hashes(&[1, 2]));
    }
    index.record(&pods[7], M, &hashes(&[1, 2, 3]));
    let slots: Vec<PodSlot> = pods.iter().map(|h| h.slot()).collect();
    let pick = |seed| {
        index.longest_matches(M, &hashes(&[1, 2, 3]), &slots, 3, || {
            SmallRng::seed_from_u64(seed)
        })
    };
    let m = pick(1);
    assert_eq!(m[7], 3, "the longest match is found first");
    assert_eq!(m.iter().filter(|&&x| x == 2).count(), 2);
    assert_eq!(m.iter().filter(|&&x| x == 0).count(), 5);
    assert_eq!(pick(1), m, "same seed, same winners");
    let winners: std::collections::HashSet<Vec<usize>> = (0..32).map(pick).collect();
    assert!(winners.len() > 1, "ties do not always favour the same pods");
}

#[test]
fn remove_pod_clears_sets_and_ignores_late_records() {
    let index = PrefixIndex::new(10);
    let a = index.add_pod();
    let b = index.add_pod();
    index.record(&a, M, &hashes(&[1, 2]));
    index.record(&b, M, &hashes(&[1]));
    assert_eq!(index.entries(), 3);
    assert_eq!(index.remove_pod(a.slot()), 2);
    assert_eq!(index.pods_holding(M, BlockHash(1)), [b.slot()]);
    assert!(index.pods_holding(M, BlockHash(2)).is_empty());
    assert_eq!(index.entries(), 1);
    assert_eq!(index.record(&a, M, &hashes(&[9])).inserted, 0);
    assert_eq!(index.entries(), 1);
    assert_eq!(index.remove_pod(a.slot()), 0);
}

#[test]
fn clear_pod_drops_one_pods_entries_and_keeps_it_recording() {
    let index = PrefixIndex::new(10);
    let a = index.add_pod();
    let b = index.add_pod();
    index.record(&a, M, &hashes(&[1, 2]));
    index.record(&b, M, &hashes(&[1]));
    assert_eq!(index.clear_pod(a.slot()), 2);
    assert_eq!(index.pods_holding(M, BlockHash(1)), [b.slot()]);
    assert!(index.pods_holding(M, BlockHash(2)).is_empty());
    assert_eq!(index.entries(), 1);
    // Still registered: a later record counts.
    assert_eq!(index.record(&a, M, &hashes(&[9])).inserted, 1);
    assert_eq!(index.pods_holding(M, BlockHash(9)), [a.slot()]);
    // A removed pod clears nothing.
    index.remove_pod(a.slot());
    assert_eq!(index.clear_pod(a.slot()), 0);
}

/// The obviously correct model: a recency list per pod, lookups by scanning it.
#[derive(Default)]
struct Reference {
    cap: usize,
    pods: Vec<Option<VecDeque<(u64, u64)>>>,
}

impl Reference {
    fn record(&mut self, pod: usize, model: u64, hs: &[u64]) -> u64 {
        let Some(list) = self.pods[pod].as_mut() else {
            return 0;
        };
        let mut evicted = 0;
        for &h in hs.iter().rev() {
            if let Some(pos) = list.iter().position(|&e| e == (model, h)) {
                list.remove(pos);
            } else if list.len() == self.cap {
                list.pop_back();
                evicted += 1;
            }
            list.push_front((model, h));
        }
        evicted
    }

    fn longest(&self, model: u64, hs: &[u64]) -> Vec<usize> {
        self.pods
            .iter()
            .map(|p| match p {
                None => 0,
                Some(list) => (0..hs.len())
                    .rev()
                    .find(|&i| list.contains(&(model, hs[i])))
                    .map_or(0, |i| i + 1),
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Record {
        pod: usize,
        model: u64,
        hs: Vec<u64>,
    },
    Remove {
        pod: usize,
    },
    Forget {
        pod: usize,
        model: u64,
        hs: Vec<u64>,
    },
    Query {
        model: u64,
        hs: Vec<u64>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let hs = prop::collection::vec(0u64..12, 0..24);
    prop_oneof![
        6 => (0usize..4, 0u64..2, hs.clone()).prop_map(|(pod, model, hs)| Op::Record { pod, model, hs }),
        1 => (0usize..4).prop_map(|pod| Op::Remove { pod }),
        2 => (0usize..4, 0u64..2, prop::collection::vec(0u64..12, 0..6)).prop_map(|(pod, model, hs)| Op::Forget { pod, model, hs }),
        3 => (0u64..2, hs).prop_map(|(model, hs)| Op::Query { model, hs }),
    ]
}

proptest! {
    #[test]
    fn agrees_with_reference(cap in 1usize..10, ops in prop::collection::vec(op(), 1..60)) {
        let index = PrefixIndex::new(cap);
        let handles: Vec<PodHandle> = (0..4).map(|_| index.add_pod()).collect();
        let slots: Vec<PodSlot> = handles.iter().map(|h| h.slot()).collect();
        let mut reference = Reference { cap, pods: vec![Some(VecDeque::new()); 4] };
        for op in ops {
            match op {
                Op::Record { pod, model, hs } => {
                    let out = index.record(&handles[pod], ModelKey(model), &hashes(&hs));
                    let evicted: u64 = out.evicted.iter().map(|e| e.1).sum();
                    prop_assert_eq!(evicted, reference.record(pod, model, &hs));
                }
                Op::Remove { pod } => {
                    index.remove_pod(slots[pod]);
                    reference.pods[pod] = None;
                    for h in 0..12 {
                        for m in 0..2 {
                            prop_assert!(!index.pods_holding(ModelKey(m), BlockHash(h)).contains(&slots[pod]));
                        }
                    }
                }
                Op::Forget { pod, model, hs } => {
                    let removed = index.forget(&handles[pod], ModelKey(model), &hashes(&hs));
                    let mut want = 0;
                    if let Some(list) = reference.pods[pod].as_mut() {
                        for h in &hs {
                            if let Some(pos) = list.iter().position(|&e| e == (model, *h)) {
                                list.remove(pos);
                                want += 1;
                            }
                        }
                    }
                    prop_assert_eq!(removed, want);
                }
                Op::Query { model, hs } => {
                    let got = index.longest_matches(ModelKey(model), &hashes(&hs), &slots, 4, rng);
                    prop_assert_eq!(got, reference.longest(model, &hs));
                }
            }
            for (i, p) in reference.pods.iter().enumerate() {
                let len = p.as_ref().map_or(0, |l| l.len());
                prop_assert!(len <= cap);
                prop_assert_eq!(index.pod_entries(slots[i]), len);
            }
            // The reverse map is exactly the union of the lists.
            for m in 0..2u64 {
                for h in 0..12u64 {
                    let want: Vec<PodSlot> = reference.pods.iter().enumerate()
                        .filter(|(_, p)| p.as_ref().is_some_and(|l| l.contains(&(m, h))))
                        .map(|(i, _)| slots[i]).collect();
                    prop_assert_eq!(index.pods_holding(ModelKey(m), BlockHash(h)), want);
                }
            }
        }
    }

    #[test]
    fn top_k_bounds_non_zero_matches(k in 1usize..4, seed in any::<u64>()) {
        let index = PrefixIndex::new(50);
        let handles: Vec<PodHandle> = (0..6).map(|_| index.add_pod()).collect();
        for (i, h) in handles.iter().enumerate() {
            index.record(h, M, &hashes(&(1..=(i as u64 % 3 + 1)).collect::<Vec<_>>()));
        }
        let slots: Vec<PodSlot> = handles.iter().map(|h| h.slot()).collect();
        let got = index.longest_matches(M, &hashes(&[1, 2, 3]), &slots, k, || SmallRng::seed_from_u64(seed));
        prop_assert_eq!(got.iter().filter(|&&m| m > 0).count(), k.min(6));
        // Longer matches are found first: no chosen match is shorter than an unchosen one.
        let min_chosen = got.iter().copied().filter(|&m| m > 0).min().unwrap();
        let full: Vec<usize> = (0..6).map(|i| i % 3 + 1).collect();
        for (i, &m) in got.iter().enumerate() {
            if m == 0 { prop_assert!(full[i] <= min_chosen); } else { prop_assert_eq!(m, full[i]); }
        }
    }
}

/// Several threads record, score, remove and add pods at once over a small key space (so pods
/// share entries and sets keep changing between one holder and several), with lists small
/// enough that most inserts evict. Whatever the interleaving, once they are done the reverse
/// map must be exactly the union of the live pods' lists, each list at most `CAP` long without
/// repeats, and removed pods nowhere; every score seen on the way must be well formed.
#[test]
fn concurrent_records_scores_and_removals_keep_the_reverse_map_exact() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex as StdMutex;

    const CAP: usize = 48;
    const PODS: usize = 6;
    const THREADS: u64 = 4;
    const ROUNDS: usize = 1_500;
    const KEYS: u64 = 160;
    const MODELS: [ModelKey; 2] = [ModelKey(11), ModelKey(12)];
    let index = PrefixIndex::new(CAP);
    let live = StdMutex::new((0..PODS).map(|_| index.add_pod()).collect::<Vec<_>>());
    let removed = StdMutex::new(Vec::new());

    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (index, live, removed) = (&index, &live, &removed);
            scope.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                for _ in 0..ROUNDS {
                    let model = MODELS[rng.random_range(0..MODELS.len())];
                    // A chain of a shared start and a random tail, as prompts look.
                    let start = rng.random_range(0..KEYS);
                    let len = rng.random_range(1..40);
                    let chain: Vec<BlockHash> = (0..len)
                        .map(|i| BlockHash((start + i * rng.random_range(1..3)) % KEYS))
                        .collect();
                    let handles = live.lock().unwrap().clone();
                    match rng.random_range(0..20) {
                        // Thread 0 now and then replaces a pod; the others may still be
                        // recording through the old handle, which must then record nothing.
                        0 if t == 0 => {
                            let mut pods = live.lock().unwrap();
                            let i = rng.random_range(0..pods.len());
                            let victim = pods.swap_remove(i);
                            index.remove_pod(victim.slot());
                            removed.lock().unwrap().push(victim.slot());
                            pods.push(index.add_pod());
                        }
                        0..=11 => {
                            let pod = &handles[rng.random_range(0..handles.len())];
                            let out = index.record(pod, model, &chain);
                            assert!(out.inserted <= chain.len());
                        }
                        _ => {
                            let slots: Vec<PodSlot> = handles.iter().map(PodHandle::slot).collect();
                            let top_k = rng.random_range(1..=PODS);
                            let got =
                                index.longest_matches(model, &chain, &slots, top_k, rng_for_ties);
                            assert_eq!(got.len(), slots.len());
                            assert!(got.iter().all(|&m| m <= chain.len()), "{got:?}");
                            assert!(got.iter().filter(|&&m| m > 0).count() <= top_k, "{got:?}");
                        }
                    }
                }
            });
        }
    });

    let live: Vec<PodSlot> = live
        .into_inner()
        .unwrap()
        .iter()
        .map(PodHandle::slot)
        .collect();
    let removed = removed.into_inner().unwrap();
    assert!(!removed.is_empty(), "the run removed pods");
    let mut holders: BTreeMap<(ModelKey, BlockHash), BTreeSet<PodSlot>> = BTreeMap::new();
    let mut total = 0;
    for &slot in &live {
        let keys = index.pod_keys_by_recency(slot);
        assert!(
            keys.len() <= CAP,
            "pod {slot:?} holds {} entries",
            keys.len()
        );
        assert_eq!(keys.len(), index.pod_entries(slot));
        total += keys.len();
        for k in keys {
            assert!(
                holders.entry((k.model, k.hash)).or_default().insert(slot),
                "pod {slot:?} lists {k:?} twice"
            );
        }
    }
    assert_eq!(index.entries(), total);
    assert_eq!(index.distinct_entries(), holders.len());
    for &model in &MODELS {
        for h in 0..KEYS {
            let want: Vec<PodSlot> = holders
                .get(&(model, BlockHash(h)))
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            assert_eq!(
                index.pods_holding(model, BlockHash(h)),
                want,
                "{model:?} {h}"
            );
        }
    }
    // `want` above holds live pods only: removed pods are in no set.
    assert!(removed.iter().all(|slot| !live.contains(slot)));
}

fn rng_for_ties() -> SmallRng {
    SmallRng::seed_from_u64(3)
}

/// Prompts as real chains (short strings over a tiny alphabet, 1-byte blocks, so they share
/// prefixes often), recorded whole, under per-pod budgets that change: the bisection lookup
/// agrees with the walk, and no pod holds more than its budget.
#[derive(Debug, Clone)]
enum ChainOp {
    Record { pod: usize, prompt: Vec<u8> },
    Budget { pod: usize, cap: usize },
    Query { prompt: Vec<u8> },
}

fn chain_op() -> impl Strategy<Value = ChainOp> {
    let prompt = prop::collection::vec(b'a'..b'd', 1..12);
    prop_oneof![
        6 => (0usize..4, prompt.clone()).prop_map(|(pod, prompt)| ChainOp::Record { pod, prompt }),
        1 => (0usize..4, 1usize..20).prop_map(|(pod, cap)| ChainOp::Budget { pod, cap }),
        3 => prompt.prop_map(|prompt| ChainOp::Query { prompt }),
    ]
}

proptest! {
    #[test]
    fn chain_matches_agree_with_the_walk_under_changing_budgets(ops in prop::collection::vec(chain_op(), 1..60)) {
        let chain = crate::hashing::BlockChain { block_size: 1, max_blocks: 64 };
        let index = PrefixIndex::new(16);
        let handles: Vec<PodHandle> = (0..4).map(|_| index.add_pod()).collect();
        let slots: Vec<PodSlot> = handles.iter().map(|h| h.slot()).collect();
        let mut caps = [16usize; 4];
        for op in ops {
            match op {
                ChainOp::Record { pod, prompt } => {
                    index.record(&handles[pod], M, &chain.hash("m", &prompt));
                }
                ChainOp::Budget { pod, cap } => {
                    let before = index.pod_entries(slots[pod]);
                    let evicted: u64 = index.set_pod_capacity(slots[pod], cap).iter().map(|e| e.1).sum();
                    prop_assert_eq!(evicted as usize, before.saturating_sub(cap));
                    prop_assert_eq!(index.pod_capacity(slots[pod]), cap);
                    caps[pod] = cap;
                }
                ChainOp::Query { prompt } => {
                    let hs = chain.hash("m", &prompt);
                    let walked = index.longest_matches(M, &hs, &slots, 4, rng);
                    prop_assert_eq!(index.chain_matches(M, &hs, &slots), walked);
                }
            }
            for (pod, &slot) in slots.iter().enumerate() {
                prop_assert!(index.pod_entries(slot) <= caps[pod]);
                // The reverse map lists exactly the pod's entries.
                for key in index.pod_keys_by_recency(slot) {
                    prop_assert!(index.pods_holding(key.model, key.hash).contains(&slot));
                }
            }
            let listed: usize = slots.iter().map(|&s| index.pod_entries(s)).sum();
            prop_assert_eq!(index.entries(), listed);
        }
    }
}

#[test]
fn shrinking_a_budget_keeps_the_most_recent_entries_in_order() {
    let index = PrefixIndex::new(10);
    let pod = index.add_pod();
    index.record(&pod, M, &hashes(&[1, 2, 3]));
    index.record(&pod, M, &hashes(&[4, 5]));
    let evicted = index.set_pod_capacity(pod.slot(), 3);
    assert_eq!(evicted, vec![(M, 2)]);
    let keys: Vec<u64> = index
        .pod_keys_by_recency(pod.slot())
        .iter()
        .map(|k| k.hash.0)
        .collect();
    assert_eq!(keys, [4, 5, 1]);
    assert!(index.pods_holding(M, BlockHash(3)).is_empty());
    // Growing keeps everything; the next record fills up to the new budget.
    assert!(index.set_pod_capacity(pod.slot(), 5).is_empty());
    index.record(&pod, M, &hashes(&[6, 7]));
    assert_eq!(index.pod_entries(pod.slot()), 5);
}

/// What happens to one of many pods before `chain_matches` is asked: a record, a new budget, or
/// one block forgotten out of order (breaking the prefix property).
#[derive(Debug, Clone)]
enum ManyOp {
    Record {
        pod: usize,
        prompt: Vec<u8>,
    },
    Budget {
        pod: usize,
        cap: usize,
    },
    Forget {
        pod: usize,
        prompt: Vec<u8>,
        block: usize,
    },
}

fn many_op() -> impl Strategy<Value = ManyOp> {
    // A shared head of 0-8 'a's, then a short tail: most prompts share their first blocks.
    let prompt = (0usize..8, prop::collection::vec(b'a'..b'c', 0..6)).prop_map(|(head, tail)| {
        let mut p = vec![b'a'; head];
        p.extend(tail);
        p.push(b'z');
        p
    });
    prop_oneof![
        8 => (0usize..24, prompt.clone()).prop_map(|(pod, prompt)| ManyOp::Record { pod, prompt }),
        1 => (0usize..24, 2usize..30).prop_map(|(pod, cap)| ManyOp::Budget { pod, cap }),
        1 => (0usize..24, prompt, 0usize..14)
            .prop_map(|(pod, prompt, block)| ManyOp::Forget { pod, prompt, block }),
    ]
}

/// Candidate `slot`'s binary search for the last block it holds, given that it holds block 0.
fn searched(index: &PrefixIndex, hs: &[BlockHash], slot: PodSlot) -> usize {
    let holds = |i: usize| index.pods_holding(M, hs[i]).contains(&slot);
    if !holds(0) {
        return 0;
    }
    let (mut lo, mut hi) = (0, hs.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo + 1
}

proptest! {
    /// Many pods sharing long prefixes (so a block's pods often equal the first block's, in
    /// order, and the bisection moves whole groups), some made to forget blocks out of order,
    /// asked about by a shuffled subset of candidates that may list a pod twice: each
    /// candidate's match is its own binary search over the blocks (the group bisection only
    /// batches those), a pod listed twice counted at its first place only.
    #[test]
    fn chain_matches_of_many_pods_are_each_candidates_own_search(
        ops in prop::collection::vec(many_op(), 1..80),
        query in prop::collection::vec(b'a'..b'c', 1..14),
        picks in prop::collection::vec(0usize..24, 0..30),
    ) {
        let chain = crate::hashing::BlockChain { block_size: 1, max_blocks: 64 };
        let index = PrefixIndex::new(30);
        let handles: Vec<PodHandle> = (0..24).map(|_| index.add_pod()).collect();
        for op in ops {
            match op {
                ManyOp::Record { pod, prompt } => {
                    index.record(&handles[pod], M, &chain.hash("m", &prompt));
                }
                ManyOp::Budget { pod, cap } => {
                    index.set_pod_capacity(handles[pod].slot(), cap);
                }
                ManyOp::Forget { pod, prompt, block } => {
                    let hs = chain.hash("m", &prompt);
                    if let Some(h) = hs.get(block) {
                        index.forget(&handles[pod], M, &[*h]);
                    }
                }
            }
        }
        let hs = chain.hash("m", &query);
        let candidates: Vec<PodSlot> = picks.iter().map(|&p| handles[p].slot()).collect();
        let expected: Vec<usize> = candidates
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                if candidates[..i].contains(&slot) { 0 } else { searched(&index, &hs, slot) }
            })
            .collect();
        prop_assert_eq!(index.chain_matches(M, &hs, &candidates), expected);
    }
}

#[test]
fn a_block_held_by_as_many_other_pods_is_not_taken_for_the_same_holders() {
    // Pod a holds the chain but forgot its first block; pod b holds only the first block. Both
    // blocks 0 and 1 have one holder each: b's match stops at 1 all the same.
    let index = PrefixIndex::new(8);
    let (a, b) = (index.add_pod(), index.add_pod());
    let chain = hashes(&[1, 2, 3]);
    index.record(&a, M, &chain);
    index.record(&b, M, &chain[..1]);
    index.forget(&a, M, &chain[..1]);
    assert_eq!(
        index.chain_matches(M, &chain, &[a.slot(), b.slot()]),
        [0, 1]
    );
}
