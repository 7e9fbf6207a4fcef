use proptest::prelude::*;

use super::*;
use crate::metrics::{PrefixCacheMetrics, encode};

fn yaml(s: &str) -> Yaml {
    serde_yaml_ng::from_str(s).unwrap()
}

fn parse(s: &str) -> ParsedArgs {
    PrefixCacheArgs::parse(Some(&yaml(s)))
}

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

#[test]
fn args_defaults_and_leniency() {
    let d = PrefixCacheArgs::default();
    assert_eq!(PrefixCacheArgs::parse(None).args, d);
    let p =
        parse("{blockSizeToHash: 32, maxBlocksToMatch: 0, maxHashCacheSize: -5, topKMatches: 3}");
    assert_eq!(
        p.args,
        PrefixCacheArgs {
            block_size_to_hash: 32,
            top_k_matches: 3,
            ..d
        }
    );
    assert!(p.warnings.is_empty());
    // Keys match case-insensitively; integral floats are accepted.
    let p = parse("{blocksizetohash: 16.0, TOPKMATCHES: 2}");
    assert_eq!(p.args.block_size_to_hash, 16);
    assert_eq!(p.args.top_k_matches, 2);
    // Misspelled names are ignored with a warning.
    let p = parse("{blockSize: 16, topKMatches: 9}");
    assert_eq!(p.args.block_size_to_hash, 64);
    assert_eq!(p.args.top_k_matches, 9);
    assert_eq!(p.warnings.len(), 1);
    assert!(p.warnings[0].contains("\"blockSize\""));
}

#[test]
fn unparsable_args_fall_back_to_all_defaults() {
    for bad in [
        "{blockSizeToHash: \"64\", topKMatches: 2}",
        "{blockSizeToHash: 64.5, topKMatches: 2}",
        "{blockSizeToHash: [1], topKMatches: 2}",
        "{blockSizeToHash: true}",
        "[1, 2]",
        "seven",
        "{blockSizeToHash: 1.0e30}",
    ] {
        let p = parse(bad);
        assert_eq!(p.args, PrefixCacheArgs::default(), "{bad}");
        assert_eq!(p.warnings, [UNPARSABLE_ARGS], "{bad}");
    }
}

fn plugin(args: PrefixCacheArgs) -> (PrefixCache, PrefixCacheMetrics) {
    let metrics = PrefixCacheMetrics::unregistered();
    (PrefixCache::new(args, 42, metrics.clone()), metrics)
}

#[test]
fn empty_prompt_gives_no_scores_and_no_observation() {
    let (p, m) = plugin(PrefixCacheArgs::default());
    let pod = p.index().add_pod();
    assert_eq!(p.score("m", &p.hash("m", b""), &[pod.slot()], true), None);
    assert_eq!(
        m.match_ratio.with_label_values(&["m"]).get_sample_count(),
        0
    );
}

#[test]
fn repeated_prompt_matches_fully_on_the_recorded_pod() {
    let (p, m) = plugin(PrefixCacheArgs::default());
    let pods: Vec<_> = (0..3).map(|_| p.index().add_pod()).collect();
    let slots: Vec<_> = pods.iter().map(|h| h.slot()).collect();
    let prompt = "x".repeat(2000);
    let hashes = p.hash("m", prompt.as_bytes());
    assert_eq!(hashes.len(), 32);
    let first = p.score("m", &hashes, &slots, true).unwrap();
    assert_eq!(first.scores, [0, 0, 0]);
    p.record("m", &hashes[..24], &pods[1]);
    let second = p.score("m", &hashes, &slots, true).unwrap();
    assert_eq!(second.scores, [0, 75, 0]);
    let h = m.match_ratio.with_label_values(&["m"]);
    assert_eq!(h.get_sample_count(), 2);
    assert!((h.get_sample_sum() - 0.75).abs() < 1e-9);
    assert!(encode_contains(
        &m,
        "kthena_router_prefix_cache_match_ratio_bucket{model=\"m\",le=\"0\"} 1"
    ));
}

fn encode_contains(m: &PrefixCacheMetrics, needle: &str) -> bool {
    let registry = prometheus::Registry::new();
    registry.register(Box::new(m.match_ratio.clone())).unwrap();
    let text = encode(&registry);
    text.contains(needle)
}

#[test]
fn evictions_are_counted_per_model() {
    let (p, m) = plugin(PrefixCacheArgs {
        max_hash_cache_size: 3,
        block_size_to_hash: 1,
        ..PrefixCacheArgs::default()
    });
    let pod = p.index().add_pod();
    p.record("a", &p.hash("a", b"xy"), &pod);
    p.record("b", &p.hash("b", b"z"), &pod);
    p.record("a", &p.hash("a", b"uv"), &pod);
    assert_eq!(m.evictions.with_label_values(&["a"]).get(), 2);
    p.record("a", &p.hash("a", b"w"), &pod);
    assert_eq!(m.evictions.with_label_values(&["b"]).get(), 1);
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
        let (p, _) = plugin(PrefixCacheArgs { max_hash_cache_size: cap, block_size_to_hash: 4, ..PrefixCacheArgs::default() });
        let pod = p.index().add_pod();
        for prompt in prompts {
            p.record("m", &p.hash("m", prompt.as_bytes()), &pod);
            prop_assert!(p.index().pod_entries(pod.slot()) <= cap);
        }
    }
}
