use super::*;

#[test]
fn recent_share_is_a_moving_average_over_picks() {
    let r = RecentPicks::default();
    let keep = keep_factor(4, 4); // 1 - 1/16
    for now in 0..16 {
        r.add(now, keep, 0.0);
    }
    let all = r.share(16, keep);
    assert!((all - (1.0 - keep.powi(16))).abs() < 1e-6, "{all}");
    // 16 picks of others later it has decayed by keep^16.
    assert!((r.share(32, keep) - all * keep.powi(16)).abs() < 1e-6);
    assert_eq!(RecentPicks::default().share(5, keep), 0.0);
}

#[test]
fn recent_writes_average_the_uncached_tokens_of_the_pods_picks() {
    let r = RecentPicks::default();
    let keep = keep_factor(4, 4);
    let ln_keep = keep.ln();
    r.add(0, keep, 1000.0);
    let after_one = r.share_written_ln(1, ln_keep).1;
    assert!(
        (after_one - (1.0 - keep) * 1000.0).abs() < 1e-3,
        "{after_one}"
    );
    // A pick that held its whole prompt writes nothing and only lets the average decay.
    r.add(1, keep, 0.0);
    assert!((r.share_written_ln(2, ln_keep).1 - after_one * keep).abs() < 1e-3);
    // Its share counts both picks alike.
    assert!((r.share_written_ln(2, ln_keep).0 - (1.0 - keep) * (1.0 + keep)).abs() < 1e-6);
    assert_eq!(RecentPicks::default().share_written_ln(5, ln_keep).1, 0.0);
}

#[test]
fn budgets_follow_engine_tokens() {
    let c = AffinityConfig::default();
    // 4096 blocks x 16 tokens x 4 bytes / 256-byte blocks.
    assert_eq!(c.budget_entries(65_536, 256), 1024);
    assert_eq!(c.budget_entries(0, 256), 1);
}
