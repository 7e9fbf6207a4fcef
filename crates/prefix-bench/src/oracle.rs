//! The oracle row: placement with perfect knowledge of the workload, sent straight to the
//! engines (no router process), as a reference beside the ceiling.
//!
//! Every affinity group (a request's `group`: shared prefix, tenant or session; a request
//! without one is its own group) is pinned to one pod. Weights are the groups' known request
//! counts. A group heavier than a pod's fair share (`total / pods`) is split into
//! `ceil(weight / fair share)` shards on distinct pods (its conversations, or else its requests,
//! dealt to the shards in turn), since one pod cannot serve it alone. Shards are then placed
//! greedily, largest first, on the least-loaded pod (LPT scheduling: within 4/3 of the best
//! possible maximum). Deterministic: ties go to the lowest group id and pod index.

use std::collections::{BTreeMap, HashMap};

use super::workload::BenchRequest;

/// A request's group key: its `group`, or its own index when it has none.
fn key(r: &BenchRequest, i: usize) -> (bool, u64) {
    match r.group {
        Some(g) => (false, u64::from(g)),
        None => (true, i as u64),
    }
}

/// The pod (0..`pods`) of each request.
pub fn assign(requests: &[BenchRequest], pods: usize) -> Vec<usize> {
    let pods = pods.max(1);
    let mut weight: BTreeMap<(bool, u64), usize> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        *weight.entry(key(r, i)).or_default() += 1;
    }
    let fair = requests.len() as f64 / pods as f64;
    // (weight of one shard, group, shard index); heaviest first, then by group.
    let mut shards: Vec<(f64, (bool, u64), usize)> = Vec::new();
    let mut shard_count: HashMap<(bool, u64), usize> = HashMap::new();
    for (&group, &w) in &weight {
        let k = ((w as f64 / fair).ceil() as usize).clamp(1, pods);
        shard_count.insert(group, k);
        for s in 0..k {
            shards.push((w as f64 / k as f64, group, s));
        }
    }
    shards.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut load = vec![0.0f64; pods];
    let mut placed: HashMap<((bool, u64), usize), usize> = HashMap::new();
    for (w, group, s) in shards {
        let pod = (0..pods)
            .filter(|p| !(0..s).any(|other| placed.get(&(group, other)) == Some(p)))
            .min_by(|a, b| load[*a].total_cmp(&load[*b]).then(a.cmp(b)))
            .unwrap_or(0);
        load[pod] += w;
        placed.insert((group, s), pod);
    }
    // Deal each split group's conversations (or requests) to its shards in turn.
    let mut next: HashMap<(bool, u64), usize> = HashMap::new();
    let mut conversation_shard: HashMap<((bool, u64), u32), usize> = HashMap::new();
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let group = key(r, i);
            let k = shard_count[&group];
            let mut deal = || {
                let n = next.entry(group).or_default();
                *n += 1;
                (*n - 1) % k
            };
            let shard = match r.conversation {
                Some(c) => *conversation_shard.entry((group, c)).or_insert_with(deal),
                None => deal(),
            };
            placed[&(group, shard)]
        })
        .collect()
}

/// The requests, each pinned to its pod (`pin_to`).
pub fn pin(requests: &[BenchRequest], pods: usize) -> Vec<BenchRequest> {
    pin_to(requests, &assign(requests, pods))
}

/// The requests, each pinned to its pod in `assignment` (one pod per request).
pub fn pin_to(requests: &[BenchRequest], assignment: &[usize]) -> Vec<BenchRequest> {
    requests
        .iter()
        .zip(assignment)
        .map(|(r, &pod)| BenchRequest {
            pin_to: Some(pod),
            ..r.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload;

    /// Requests per pod, and whether every unsplit group stayed on one pod.
    fn loads(requests: &[BenchRequest], pods: usize) -> Vec<usize> {
        let mut load = vec![0; pods];
        for p in assign(requests, pods) {
            load[p] += 1;
        }
        load
    }

    fn max_over_mean(load: &[usize]) -> f64 {
        let mean = load.iter().sum::<usize>() as f64 / load.len() as f64;
        *load.iter().max().unwrap() as f64 / mean
    }

    #[test]
    fn equal_groups_are_pinned_and_balanced() {
        let w = workload::shared_prefix(16, 8, 64, 8, 4, 1, "m");
        let pods = assign(&w, 4);
        let mut of_group: HashMap<u32, usize> = HashMap::new();
        for (r, p) in w.iter().zip(&pods) {
            assert_eq!(*of_group.entry(r.group.unwrap()).or_insert(*p), *p);
        }
        assert_eq!(loads(&w, 4), [32, 32, 32, 32]);
    }

    #[test]
    fn a_hot_group_is_split_and_the_rest_balanced() {
        let w = workload::hot_prefix(16, 800, 0.5, 64, 8, 4, 1, "m");
        let pods = assign(&w, 4);
        let hot: std::collections::BTreeSet<usize> = w
            .iter()
            .zip(&pods)
            .filter(|(r, _)| r.group == Some(0))
            .map(|(_, p)| *p)
            .collect();
        assert_eq!(hot.len(), 2, "the hot half needs two pods");
        let m = max_over_mean(&loads(&w, 4));
        assert!(m < 1.1, "{m}");
        // The other groups stay whole.
        for g in 1..16 {
            let on: std::collections::BTreeSet<usize> = w
                .iter()
                .zip(&pods)
                .filter(|(r, _)| r.group == Some(g))
                .map(|(_, p)| *p)
                .collect();
            assert_eq!(on.len(), 1);
        }
    }

    #[test]
    fn sessions_stay_whole_and_zipf_tenants_balance() {
        let w = workload::multi_tenant(16, 300, 16, 8, 4, 1.0, 1, "m");
        let pods = assign(&w, 4);
        let mut of_session: HashMap<u32, usize> = HashMap::new();
        for (r, p) in w.iter().zip(&pods) {
            assert_eq!(*of_session.entry(r.conversation.unwrap()).or_insert(*p), *p);
        }
        let m = max_over_mean(&loads(&w, 4));
        assert!(m < 1.1, "{m}");
        let pinned = pin(&w, 4);
        assert!(pinned.iter().zip(&pods).all(|(r, p)| r.pin_to == Some(*p)));
        // Requests without a group are balanced one by one.
        let loose: Vec<BenchRequest> = w
            .iter()
            .map(|r| BenchRequest {
                group: None,
                conversation: None,
                ..r.clone()
            })
            .collect();
        assert!(max_over_mean(&loads(&loose, 4)) < 1.02);
    }
}
