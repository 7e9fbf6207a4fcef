//! Each llm-d formula on constructed pods against values computed by hand from the upstream
//! file named in the module header.

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-12, "{a:?} != {b:?}");
    }
}

#[test]
fn prefix_cache_scorer_is_the_match_ratio_by_default() {
    // 10-block prompt; pods matched 10, 5, 0 blocks: 1, 0.5, 0.
    close(
        &prefix_scores(&[10, 5, 0], 10, 16.0, 0.0, 8192),
        &[1.0, 0.5, 0.0],
    );
    close(&prefix_scores(&[3], 0, 16.0, 0.0, 8192), &[0.0]);
}

#[test]
fn prefix_cache_scorer_mixes_in_the_match_length() {
    // w = 0.5, S = 160 tokens, 16 tokens a block, 8-block prompt. Pod matched 4 blocks:
    // ratio 0.5; length min(1, 4*16/160) = 0.4, squared 0.16; 0.5*0.16 + 0.5*0.5 = 0.33.
    // Pod matched 8 blocks: ratio 1; length min(1, 128/160) = 0.8 -> 0.64; 0.32 + 0.5 = 0.82.
    close(&prefix_scores(&[4, 8], 8, 16.0, 0.5, 160), &[0.33, 0.82]);
    // A long match saturates the length term: 20 blocks * 16 / 160 = 2 -> 1; w = 1: 1.
    close(&prefix_scores(&[20], 40, 16.0, 1.0, 160), &[1.0]);
}

#[test]
fn queue_and_running_requests_scorers_normalise_between_min_and_max() {
    // waiting 0, 5, 10: (10-0)/10, (10-5)/10, 0.
    close(&min_max_scores(&[0.0, 5.0, 10.0]), &[1.0, 0.5, 0.0]);
    // waiting 2, 3, 6: 4/4, 3/4, 0.
    close(&min_max_scores(&[2.0, 3.0, 6.0]), &[1.0, 0.75, 0.0]);
    close(&min_max_scores(&[4.0, 4.0]), &[1.0, 1.0]);
}

#[test]
fn kv_cache_utilization_and_load_aware_scorers() {
    close(&kv_utilization_scores(&[0.0, 0.25, 1.0]), &[1.0, 0.75, 0.0]);
    // threshold 128: q 0 -> 0.5; q 64 -> 0.5 * 0.5 = 0.25; q 200 -> capped, 0.
    close(
        &load_aware_scores(&[0.0, 64.0, 200.0], 128.0),
        &[0.5, 0.25, 0.0],
    );
    // threshold 10: q 1 -> 0.5 * 0.9 = 0.45.
    close(&load_aware_scores(&[1.0], 10.0), &[0.45]);
    assert_eq!(clamp_score(1.5), 1.0);
    assert_eq!(clamp_score(-0.2), 0.0);
    assert_eq!(clamp_score(f64::NAN), 0.0);
}

#[test]
fn role_filters_follow_the_llm_d_role_label() {
    for (role, decode, prefill) in [
        (None, true, false),
        (Some("decode"), true, false),
        (Some("prefill"), false, true),
        (Some("prefill-decode"), true, true),
        (Some("both"), true, true),
        (Some("encode"), false, false),
        (Some("encode-prefill"), false, true),
        (Some("other"), false, false),
    ] {
        assert_eq!(EppFilter::Decode.keeps(role), decode, "{role:?}");
        assert_eq!(EppFilter::Prefill.keeps(role), prefill, "{role:?}");
    }
}

#[test]
fn max_score_picker_takes_the_highest_and_breaks_ties_at_random() {
    let totals = [1.0, 3.5, 3.5, 0.0];
    let mut firsts = std::collections::BTreeSet::new();
    for seed in 0..32 {
        let order = EppPicker::MaxScore.order(&totals, &mut SmallRng::seed_from_u64(seed));
        assert!(order[..2].contains(&1) && order[..2].contains(&2));
        assert_eq!(&order[2..], [0, 3]);
        firsts.insert(order[0]);
    }
    assert_eq!(firsts.len(), 2, "both tied pods lead sometimes");
}

#[test]
fn weighted_random_picker_favours_high_totals_and_never_picks_a_zero_first() {
    let totals = [0.0, 1.0, 3.0];
    let mut first = [0usize; 3];
    for seed in 0..2000 {
        let order = EppPicker::WeightedRandom.order(&totals, &mut SmallRng::seed_from_u64(seed));
        first[order[0]] += 1;
    }
    assert_eq!(first[0], 0);
    // A-Res: P(pod 2 first) = 3 / (1 + 3) = 0.75.
    let share = first[2] as f64 / 2000.0;
    assert!((0.70..0.80).contains(&share), "{share}");
    // All zero: a uniform shuffle, every pod first sometimes.
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..64 {
        seen.insert(
            EppPicker::WeightedRandom.order(&[0.0; 3], &mut SmallRng::seed_from_u64(seed))[0],
        );
    }
    assert_eq!(seen.len(), 3);
}

#[test]
fn the_default_profile_is_llm_ds() {
    let p = EppProfile::llm_d_default();
    let weights: Vec<(&str, f64)> = p
        .scorers
        .iter()
        .map(|s| (s.kind.as_str(), s.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0)
        ]
    );
    assert_eq!(p.picker, EppPicker::MaxScore);
    assert!(p.scores_prefix());
}

#[test]
fn lora_affinity_scorer_prefers_a_running_adapter_then_room_then_a_queued_one() {
    use crate::scheduler::LoraAdapters;
    let pod = |running: &[&str], waiting: &[&str], max| LoraAdapters {
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: waiting.iter().map(|s| s.to_string()).collect(),
        max,
    };
    let score = |p: &LoraAdapters| lora_affinity_score(p.state("sql"));
    assert_eq!(score(&pod(&["sql"], &[], 1)), 1.0, "running here");
    assert_eq!(score(&pod(&["chat"], &[], 2)), 0.8, "room for one more");
    assert_eq!(
        score(&pod(&["chat"], &["sql"], 2)),
        0.6,
        "queued here, no room"
    );
    assert_eq!(score(&pod(&["chat"], &[], 1)), 0.0, "full");
    assert_eq!(
        score(&LoraAdapters::default()),
        0.0,
        "no metric: 0, as llm-d"
    );
}

#[test]
fn label_selector_filter_has_kubernetes_semantics() {
    let pod = |pairs: &[(&'static str, &'static str)]| {
        let pairs = pairs.to_vec();
        move |k: &str| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| *v)
    };
    let s = LabelSelector {
        match_labels: vec![("app".into(), "vllm".into())],
        match_expressions: vec![
            LabelRequirement::In("zone".into(), vec!["a".into(), "b".into()]),
            LabelRequirement::NotIn("tier".into(), vec!["canary".into()]),
            LabelRequirement::DoesNotExist("draining".into()),
        ],
    };
    assert!(s.matches(pod(&[("app", "vllm"), ("zone", "a")])));
    assert!(
        !s.matches(pod(&[("app", "vllm"), ("zone", "c")])),
        "zone not in"
    );
    assert!(!s.matches(pod(&[("app", "vllm")])), "In needs the label");
    assert!(!s.matches(pod(&[("app", "vllm"), ("zone", "b"), ("tier", "canary")])));
    assert!(!s.matches(pod(&[("app", "vllm"), ("zone", "b"), ("draining", "")])));
    assert!(!s.matches(pod(&[("app", "sglang"), ("zone", "a")])));
    let exists = LabelSelector {
        match_expressions: vec![LabelRequirement::Exists("gpu".into())],
        ..LabelSelector::default()
    };
    assert!(exists.matches(pod(&[("gpu", "")])) && !exists.matches(pod(&[])));
    assert!(
        LabelSelector::default().matches(pod(&[])),
        "empty selects all"
    );
    let f = EppFilter::Labels(exists);
    assert_eq!(f.as_str(), "label-selector-filter");
    assert!(f.keeps_pod(pod(&[("gpu", "h100")])));
}

/// no-hit-lru-scorer by hand: 4 pods, LRU (least recent first) [c, a]. Cold: never-used b, d
/// rank 0, 1; c rank 2 + 0 = 2, a rank 2 + 1 = 3; scores 1 - r/3: a 0, b 1, c 1/3, d 2/3.
#[test]
fn no_hit_lru_scorer_ranks_never_used_then_least_recent_pods_for_cold_requests() {
    let lru = NoHitLru::default();
    lru.touch("c", 8);
    lru.touch("a", 8);
    close(
        &lru.scores(&["a", "b", "c", "d"], true),
        &[0.0, 1.0, 1.0 / 3.0, 2.0 / 3.0],
    );
    close(&lru.scores(&["a", "b"], false), &[0.5, 0.5]);
    close(&lru.scores(&["a"], true), &[1.0]);
    // c taken again: now the most recent; the size bound drops the least recent.
    lru.touch("c", 2);
    lru.touch("e", 2);
    close(&lru.scores(&["a", "c", "e"], true), &[1.0, 0.5, 0.0]);
}

/// prefix-cache-scorer over a precise-prefix-cache-producer's match, by hand. A 640-byte
/// prompt is 10 blocks of 64 bytes; its engine tokens are 160 (the whole prompt, 16 per engine
/// block, so one engine block is one prompt block). The estimate: pod 0 was sent all 10 blocks,
/// pod 2 three. The engines: pod 0's view is live and holds nothing (evicted), pod 1's holds
/// the first 96 tokens (6 blocks), pod 2 publishes nothing (no live view).
/// Precise: pod 0 = 0 / 10 (its engine's match stands: it lacks the head's first block),
/// pod 1 = 6 / 10 = 0.6 (the engine's), pod 2 = 3 / 10 = 0.3 (the estimate). The estimate alone
/// (llm-d's approximate producer's role): 1, 0, 0.3.
#[test]
fn the_precise_producer_scores_pods_by_their_engines_and_the_rest_by_the_estimate() {
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::test_pod::{engine_pods, req};
    use crate::scheduler::{EngineTokens, MatchSource, Scheduler};

    let profile = |precise| EppProfile {
        scorers: vec![EppScorer {
            name: "prefix-cache-scorer".into(),
            kind: PREFIX_DEFAULT,
            weight: 1.0,
        }],
        precise,
        ..EppProfile::llm_d_default()
    };
    let scheduler = |precise| {
        Scheduler::new(
            SchedulerConfig {
                filters: Vec::new(),
                scorers: Vec::new(),
                epp: Some(profile(precise)),
                ..SchedulerConfig::default()
            },
            5,
            1,
        )
    };
    let prompt = "0123456789".repeat(64);
    let tokens: Vec<u32> = (0..160).collect();
    let scores = |d: &crate::scheduler::Decision<
        std::sync::Arc<crate::scheduler::test_pod::Pod>,
    >| { d.plugins[0].fractional.as_ref().unwrap().scores.clone() };
    for precise in [true, false] {
        let s = scheduler(precise);
        let pods = engine_pods(&s, 3, |i| i != 2);
        let hashes = s.prefix_cache().hash("m", prompt.as_bytes());
        assert_eq!(hashes.len(), 10);
        s.record("m", &hashes, &pods[0].handle);
        s.record("m", &hashes[..3], &pods[2].handle);
        let engine_hashes: Vec<u64> = (1..=6).collect();
        let view = pods[1].engine.as_ref().unwrap();
        view.store(None, &engine_hashes, &tokens[..96], 16);
        let mut r = req(&prompt);
        r.engine_tokens = Some(EngineTokens::message_head(&tokens, prompt.len()));
        let d = s.schedule(r, pods.clone()).unwrap();
        if precise {
            close(&scores(&d), &[0.0, 0.6, 0.3]);
            assert_eq!(d.primary().label, "default/pod-1");
            let sources: Vec<MatchSource> = (0..3).map(|i| d.match_source(i)).collect();
            assert_eq!(
                sources,
                [
                    MatchSource::Engine,
                    MatchSource::Engine,
                    MatchSource::Estimate
                ]
            );
            assert_eq!(d.engine[1].map(|m| m.tokens), Some(96));
            // --v 4: the match sources follow the score lines.
            let lines = crate::scheduler::test_pod::Lines::default();
            tracing::subscriber::with_default(lines.clone(), || d.log_scores());
            let got = lines.0.lock().unwrap().clone();
            let at = got
                .iter()
                .position(|l| l == "Match sources:")
                .expect("logged");
            assert_eq!(
                got[at + 1..],
                [
                    "  Pod: default/pod-0, Source: engine, Matched: 0 tokens, then 0 blocks by the estimate",
                    "  Pod: default/pod-1, Source: engine, Matched: 96 tokens, then 0 blocks by the estimate",
                    "  Pod: default/pod-2, Source: estimate",
                ]
            );
        } else {
            close(&scores(&d), &[1.0, 0.0, 0.3]);
            assert_eq!(d.primary().label, "default/pod-0");
            assert!(d.engine.is_empty());
        }
        // No engine tokens for the request (its head not tokenized yet): the estimate for all.
        let d = s.schedule(req(&prompt), pods.clone()).unwrap();
        close(&scores(&d), &[1.0, 0.0, 0.3]);
        assert!(d.engine.is_empty());
    }
}
