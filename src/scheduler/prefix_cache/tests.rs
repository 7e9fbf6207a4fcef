use proptest::prelude::*;

use super::*;

#[test]
fn score_formula_truncates_like_go() {
    assert_eq!(percent(29, 100), 28);
    assert_eq!(percent(29, 50), 57);
    assert_eq!(percent(57, 100), 56);
    assert_eq!(percent(58, 100), 57);
    assert_eq!(percent(24, 32), 75);
    assert_eq!(percent(3, 3), 100);
    assert_eq!(percent(0, 3), 0);
}

fn plugin(args: PrefixCacheArgs) -> PrefixCache {
    PrefixCache::new(args, 42)
}

#[test]
fn empty_prompt_gives_no_scores_and_no_match_ratio() {
    let p = plugin(PrefixCacheArgs::default());
    let pod = p.index().add_pod();
    assert_eq!(p.score("m", &p.hash("m", b""), &[pod.slot()], 0), None);
    assert_eq!(p.record("m", &[], &pod), RecordOutcome::default());
}

#[test]
fn repeated_prompt_matches_fully_on_the_recorded_pod() {
    let p = plugin(PrefixCacheArgs::default());
    let pods: Vec<_> = (0..3).map(|_| p.index().add_pod()).collect();
    let slots: Vec<_> = pods.iter().map(|h| h.slot()).collect();
    let prompt = "x".repeat(2000);
    let hashes = p.hash("m", prompt.as_bytes());
    assert_eq!(hashes.len(), 32);
    let first = p.score("m", &hashes, &slots, 0).unwrap();
    assert_eq!(first.scores, [0, 0, 0]);
    assert_eq!(first.match_ratio(), 0.0);
    p.record("m", &hashes[..24], &pods[1]);
    let second = p.score("m", &hashes, &slots, 1).unwrap();
    assert_eq!(second.scores, [0, 75, 0]);
    assert!((second.match_ratio() - 0.75).abs() < 1e-9);
}

#[test]
fn evictions_are_returned_per_model() {
    let p = plugin(PrefixCacheArgs {
        max_hash_cache_size: 3,
        block_size_to_hash: 1,
        ..PrefixCacheArgs::default()
    });
    let pod = p.index().add_pod();
    let (a, b) = (ModelKey::of("a"), ModelKey::of("b"));
    assert!(p.record("a", &p.hash("a", b"xy"), &pod).evicted.is_empty());
    assert!(p.record("b", &p.hash("b", b"z"), &pod).evicted.is_empty());
    assert_eq!(p.record("a", &p.hash("a", b"uv"), &pod).evicted, [(a, 2)]);
    assert_eq!(p.record("a", &p.hash("a", b"w"), &pod).evicted, [(b, 1)]);
}

proptest! {
    #[test]
    fn common_full_blocks_share_exactly_their_hashes(
        common in "[a-z ]{0,200}", a in "[a-z]{0,100}", b in "[A-Z]{1,100}", bs in 1usize..40,
    ) {
        let chain = BlockChain { block_size: bs, max_blocks: 1000 };
        let pa = format!("{common}{a}");
        let pb = format!("{common}0{b}");
        let ha = chain.hash("m", pa.as_bytes());
        let hb = chain.hash("m", pb.as_bytes());
        let full_common = common.len() / bs;
        prop_assert_eq!(&ha[..full_common.min(ha.len())], &hb[..full_common.min(hb.len())]);
        // The block that holds the first difference, and every later one, differ.
        for i in full_common..ha.len().min(hb.len()) {
            prop_assert_ne!(ha[i], hb[i]);
        }
    }

    #[test]
    fn scores_stay_in_range(matched in 0usize..200, total in 1usize..200) {
        let s = percent(matched.min(total), total);
        prop_assert!(s <= 100);
    }

    #[test]
    fn never_more_than_capacity_entries(cap in 1usize..50, prompts in prop::collection::vec("[a-c]{0,40}", 1..20)) {
        let p = plugin(PrefixCacheArgs { max_hash_cache_size: cap, block_size_to_hash: 4, ..PrefixCacheArgs::default() });
        let pod = p.index().add_pod();
        for prompt in prompts {
            p.record("m", &p.hash("m", prompt.as_bytes()), &pod);
            prop_assert!(p.index().pod_entries(pod.slot()) <= cap);
        }
    }
}

#[test]
fn a_candidate_that_reuses_nothing_matches_nothing() {
    let mut s = PrefixScores {
        scores: vec![100, 50, 25],
        matched_blocks: vec![4, 2, 1],
        total_blocks: 4,
        held_blocks: vec![4, 1, 0],
        head_inflight: vec![1, 2, 3],
        pinned_blocks: vec![3, 2, 1],
    };
    s.forget(|i| i == 0);
    assert_eq!(
        (s.scores, s.matched_blocks, s.held_blocks, s.head_inflight),
        (vec![0, 50, 25], vec![0, 2, 1], vec![0, 1, 0], vec![1, 2, 3])
    );
    assert_eq!(s.pinned_blocks, [0, 2, 1]);
}
