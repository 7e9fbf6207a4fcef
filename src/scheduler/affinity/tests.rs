use super::*;

#[test]
fn recent_share_is_a_moving_average_over_picks() {
    let r = RecentPicks::default();
    let keep = keep_factor(4, 4); // 1 - 1/16
    for now in 0..16 {
        r.add(now, keep);
    }
    let all = r.share(16, keep);
    assert!((all - (1.0 - keep.powi(16))).abs() < 1e-6, "{all}");
    // 16 picks of others later it has decayed by keep^16.
    assert!((r.share(32, keep) - all * keep.powi(16)).abs() < 1e-6);
    assert_eq!(RecentPicks::default().share(5, keep), 0.0);
}

#[test]
fn budgets_follow_engine_tokens() {
    let c = AffinityConfig::default();
    // 4096 blocks x 16 tokens x 4 bytes / 256-byte blocks.
    assert_eq!(c.budget_entries(65_536, 256), 1024);
    assert_eq!(c.budget_entries(0, 256), 1);
}
