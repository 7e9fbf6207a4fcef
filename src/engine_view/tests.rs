use super::*;

fn tokens(n: u32, start: u32) -> Vec<u32> {
    (start..start + n).collect()
}

/// A store of blocks chained on the engine's own hashes (`base`, `base + 1`, ...).
fn store_chain(view: &EngineView, parent: Option<u64>, base: u64, toks: &[u32], bs: usize) {
    let hashes: Vec<u64> = (0..(toks.len() / bs) as u64).map(|i| base + i).collect();
    let out = view.store(parent, &hashes, toks, bs);
    assert_eq!(out.skipped, 0);
}

#[test]
fn a_stored_prompt_matches_its_full_blocks_and_a_longer_one_matches_its_head() {
    let view = EngineView::new(1024);
    let prompt = tokens(64, 0);
    store_chain(&view, None, 100, &prompt, 16);
    assert_eq!(view.blocks(), 4);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 4);
    let mut longer = prompt.clone();
    longer.extend(tokens(40, 1000));
    assert_eq!(view.longest_match(&token_chain(&longer, 16)), 4);
    let mut other = prompt.clone();
    other[20] = 7; // block 1 differs: only block 0 is shared
    assert_eq!(view.longest_match(&token_chain(&other, 16)), 1);
}

#[test]
fn stores_chain_across_events_by_the_engine_parent() {
    let view = EngineView::new(1024);
    let prompt = tokens(48, 0);
    store_chain(&view, None, 1, &prompt[..16], 16);
    store_chain(&view, Some(1), 2, &prompt[16..], 16);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 3);
}

#[test]
fn an_unknown_parent_skips_the_store() {
    let view = EngineView::new(1024);
    let out = view.store(Some(99), &[1, 2], &tokens(32, 0), 16);
    assert_eq!(
        out,
        Stored {
            added: 0,
            skipped: 2
        }
    );
    assert_eq!(view.blocks(), 0);
}

#[test]
fn too_few_token_ids_skip_the_blocks_they_lack() {
    let view = EngineView::new(1024);
    let out = view.store(None, &[1, 2, 3], &tokens(40, 0), 16);
    assert_eq!(
        out,
        Stored {
            added: 2,
            skipped: 1
        }
    );
}

#[test]
fn removal_and_clear_forget_blocks() {
    let view = EngineView::new(1024);
    let prompt = tokens(64, 0);
    store_chain(&view, None, 10, &prompt, 16);
    // The engine evicts the deepest two blocks.
    assert_eq!(view.remove(&[12, 13, 999]), 2);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 2);
    assert_eq!(view.clear(), 2);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 0);
    assert_eq!(view.blocks(), 0);
}

#[test]
fn two_engine_blocks_with_one_content_are_released_separately() {
    let view = EngineView::new(1024);
    let prompt = tokens(16, 0);
    store_chain(&view, None, 1, &prompt, 16);
    store_chain(&view, None, 2, &prompt, 16); // e.g. another LoRA id
    assert_eq!(view.blocks(), 1);
    view.remove(&[1]);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 1);
    view.remove(&[2]);
    assert_eq!(view.longest_match(&token_chain(&prompt, 16)), 0);
}

#[test]
fn the_view_is_bounded() {
    let view = EngineView::new(3);
    let out = view.store(None, &[1, 2, 3, 4, 5], &tokens(80, 0), 16);
    assert_eq!(
        out,
        Stored {
            added: 3,
            skipped: 2
        }
    );
    assert_eq!(view.blocks(), 3);
}

#[test]
fn the_bound_counts_engine_blocks_not_distinct_contents() {
    // One content under ever new engine hashes (a publisher's LoRA ids or cache salts): each
    // takes a table entry, so each counts toward the bound.
    let view = EngineView::new(3);
    let prompt = tokens(16, 0);
    for engine in 1..=3 {
        store_chain(&view, None, engine, &prompt, 16);
    }
    assert_eq!(view.store(None, &[4], &prompt, 16).skipped, 1);
    view.remove(&[1]);
    assert_eq!(view.store(None, &[4], &prompt, 16).added, 1);
}

#[test]
fn a_block_size_past_any_prompt_matches_nothing_and_reserves_nothing() {
    // The block size comes from the engine's events; a garbage `4294967295` once sized a
    // buffer of 16 GiB on every request matched against the view.
    let view = EngineView::new(1024);
    let huge = u32::MAX as usize;
    assert_eq!(view.store(None, &[1], &tokens(16, 0), huge).skipped, 1);
    assert_eq!(view.block_size(), huge);
    let chain = token_chain(&tokens(64, 0), huge);
    assert!(chain.is_empty());
    assert!(block_buffer(huge, 64).capacity() <= 64 * 4);
    assert_eq!(view.longest_match(&chain), 0);
}

#[test]
fn a_new_block_size_resets_the_view() {
    let view = EngineView::new(1024);
    store_chain(&view, None, 1, &tokens(64, 0), 16);
    store_chain(&view, None, 50, &tokens(64, 0), 32);
    assert_eq!(view.block_size(), 32);
    assert_eq!(view.blocks(), 2);
    assert_eq!(view.longest_match(&token_chain(&tokens(64, 0), 16)), 0);
    assert_eq!(view.longest_match(&token_chain(&tokens(64, 0), 32)), 2);
}

#[test]
fn the_chain_depends_on_every_earlier_block() {
    let a = token_chain(&tokens(48, 0), 16);
    let mut changed = tokens(48, 0);
    changed[0] = 99;
    let b = token_chain(&changed, 16);
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    assert_eq!(token_chain(&tokens(15, 0), 16), Vec::<u64>::new());
}

#[test]
fn a_block_costs_at_most_64_bytes_at_every_table_load() {
    // From 1,024 blocks up, over every load of the tables between two growths.
    let view = EngineView::new(usize::MAX);
    let mut n = 0u64;
    for target in (1_024..70_000u64).step_by(509) {
        while n < target {
            // One-block sequences: each store is a first block with its own tokens.
            view.store(None, &[n + 1], &[n as u32, (n >> 32) as u32], 2);
            n += 1;
        }
        let per_block = view.heap_bytes() as f64 / view.blocks() as f64;
        assert!(
            per_block <= 64.0,
            "{per_block:.1} bytes per block at {n} blocks"
        );
    }
}

proptest::proptest! {
    /// Bisection equals the walk from the first block whenever the engine keeps the prefix
    /// property (it evicts deepest blocks first).
    #[test]
    fn bisection_equals_the_walk(n in 0usize..40, keep in 0usize..40, probe_len in 0usize..50) {
        let view = EngineView::new(4096);
        let prompt = tokens((n * 4) as u32, 0);
        let hashes: Vec<u64> = (1..=n as u64).collect();
        view.store(None, &hashes, &prompt, 4);
        let keep = keep.min(n);
        view.remove(&hashes[keep..]);
        let probe = tokens((probe_len * 4) as u32, 0);
        let chain = token_chain(&probe, 4);
        let walk = chain.iter().take_while(|h| view.state.read().held.contains(**h)).count();
        proptest::prop_assert_eq!(view.longest_match(&chain), walk);
    }
}
