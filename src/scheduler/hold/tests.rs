//! Holds on pods whose engine publishes: ended by the engine's store of the held head, or by
//! the request, and exact either way.

use std::sync::Arc;

use super::super::affinity::AffinityConfig;
use super::super::config::SchedulerConfig;
use super::super::test_pod::{Pod, engine_pods, req};
use super::super::{Candidate, Decision, EngineTokens, RouteRequest, Scheduler};
use super::*;
use crate::engine_view::EngineView;
use crate::hashing::BlockHash;
use crate::prefix_index::ModelKey;

const BLOCK: usize = 16;

/// The affinity mode (holds on) and pods with engine views: live unless listed in `estimated`.
/// Each live view has stored an unrelated sequence (it knows its block size).
fn setup(pods: usize, estimated: &[usize]) -> (Scheduler, Vec<Arc<Pod>>) {
    let mut config = SchedulerConfig::default();
    config.apply_affinity(Some(AffinityConfig::default()));
    let s = Scheduler::new(config, 5, 1);
    let pods = engine_pods(&s, pods, |i| !estimated.contains(&i));
    for p in &pods {
        let view = p.engine.as_ref().expect("a view");
        view.store(None, &[1_000_000], &other_tokens(BLOCK), BLOCK);
    }
    (s, pods)
}

fn other_tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|t| 50_000 + t).collect()
}

/// The prompt and its head in engine tokens (256 tokens: 16 blocks).
fn prompt() -> (String, Vec<u32>) {
    (
        "You are a helpful assistant. ".repeat(40),
        (0..256).collect(),
    )
}

fn with_tokens<'a>(prompt: &'a str, tokens: &'a [u32]) -> RouteRequest<'a> {
    let mut r = req(prompt);
    r.engine_tokens = Some(EngineTokens::message_head(tokens, prompt.len()));
    r
}

/// Routes `request` to `pod` (its only candidate) and commits the decision: its hold.
fn held_on(
    s: &Scheduler,
    pod: &Arc<Pod>,
    request: RouteRequest<'_>,
) -> (Decision<Arc<Pod>>, TentativeHold) {
    let d = s.schedule(request, vec![pod.clone()]).unwrap();
    let hold = s.commit("m", &d).expect("held");
    (d, hold)
}

/// What the tentative table claims for `pods` (blocks of `hashes`), and the requests it counts
/// in flight on their head.
fn claims(s: &Scheduler, hashes: &[BlockHash], pods: &[Arc<Pod>]) -> (Vec<usize>, Vec<u32>) {
    let slots: Vec<_> = pods.iter().map(|p| p.slot()).collect();
    let mut matched = vec![0; pods.len()];
    let mut heads = vec![0; pods.len()];
    s.tentative().extend_matches(
        ModelKey::of("m"),
        hashes,
        &slots,
        &mut matched,
        &mut heads,
        &mut vec![0; pods.len()],
    );
    (matched, heads)
}

/// The engine stores `tokens` as one sequence, in events of `per_event` blocks.
fn engine_stores(pod: &Pod, tokens: &[u32], per_event: usize, base: u64) {
    let view = pod.engine.as_ref().unwrap();
    let blocks = tokens.len() / BLOCK;
    let mut parent = None;
    for first in (0..blocks).step_by(per_event) {
        let last = (first + per_event).min(blocks);
        let hashes: Vec<u64> = (first..last).map(|i| base + i as u64).collect();
        let out = view.store(parent, &hashes, &tokens[first * BLOCK..last * BLOCK], BLOCK);
        assert_eq!(out.skipped, 0);
        parent = hashes.last().copied();
    }
}

#[test]
fn a_hold_on_a_live_pod_ends_when_its_engine_stores_the_head() {
    let (s, pods) = setup(1, &[]);
    let (prompt, tokens) = prompt();
    let (d, hold) = held_on(&s, &pods[0], with_tokens(&prompt, &tokens));
    let all = d.hashes.len();
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![all], vec![1]));
    // The engine prefills it: the first half of its blocks stored, then the rest.
    engine_stores(&pods[0], &tokens[..128], 8, 100);
    assert!(!hold.stored_by_engine(), "not the head's last block yet");
    assert_eq!(claims(&s, &d.hashes, &pods).0, [all]);
    let view = pods[0].engine.as_ref().unwrap();
    let hashes: Vec<u64> = (108..116).collect();
    view.store(Some(107), &hashes, &tokens[128..], BLOCK);
    assert!(hold.stored_by_engine());
    // The view holds it now; the hold no longer claims it, but its request is still in flight.
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0], vec![1]));
    assert_eq!(hold.end(), Some(HoldEnd::Engine));
    assert_eq!(s.tentative().holds(), 0);
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0], vec![0]));
}

#[test]
fn other_blocks_stored_leave_the_hold_claiming() {
    let (s, pods) = setup(1, &[]);
    let (prompt, tokens) = prompt();
    let (d, hold) = held_on(&s, &pods[0], with_tokens(&prompt, &tokens));
    // Another prompt; the same tokens under another parent; the head but one token.
    engine_stores(&pods[0], &other_tokens(256), 16, 100);
    let view = pods[0].engine.as_ref().unwrap();
    view.store(Some(100), &[200], &tokens[240..], BLOCK);
    let mut changed = tokens.clone();
    changed[3] += 1;
    engine_stores(&pods[0], &changed, 16, 300);
    assert!(!hold.stored_by_engine());
    assert_eq!(claims(&s, &d.hashes, &pods).0, [d.hashes.len()]);
    // Its request ends first (the engine never stored it: caching off, or it failed).
    assert_eq!(hold.end(), Some(HoldEnd::Request));
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0], vec![0]));
    // A store after the end changes nothing.
    engine_stores(&pods[0], &tokens, 16, 400);
    assert_eq!(s.tentative().holds(), 0);
}

#[test]
fn a_hold_on_an_estimated_pod_awaits_nothing() {
    // Pod 0's view is not live; pod 1 has none; pod 2 is live but the request has no tokens.
    let (s, mut pods) = setup(3, &[0]);
    Arc::get_mut(&mut pods[1]).unwrap().engine = None;
    let (prompt, tokens) = prompt();
    let holds = [
        held_on(&s, &pods[0], with_tokens(&prompt, &tokens)),
        held_on(&s, &pods[1], with_tokens(&prompt, &tokens)),
        held_on(&s, &pods[2], req(&prompt)),
    ];
    assert!(holds.iter().all(|(d, _)| d.primary_last_block().is_none()));
    engine_stores(&pods[0], &tokens, 16, 100);
    engine_stores(&pods[2], &tokens, 16, 100);
    let hashes = holds[0].0.hashes.clone();
    let all = hashes.len();
    assert_eq!(claims(&s, &hashes, &pods), (vec![all; 3], vec![1; 3]));
    for (_, hold) in holds {
        assert!(!hold.stored_by_engine());
        assert_eq!(hold.end(), None, "ended by its request, as before");
    }
    assert_eq!(claims(&s, &hashes, &pods).0, [0, 0, 0]);
}

#[test]
fn a_head_the_engine_holds_at_the_decision_is_confirmed_at_once() {
    let (s, pods) = setup(1, &[]);
    let (prompt, tokens) = prompt();
    engine_stores(&pods[0], &tokens, 16, 100);
    let (d, hold) = held_on(&s, &pods[0], with_tokens(&prompt, &tokens));
    assert!(hold.stored_by_engine());
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0], vec![1]));
    assert_eq!(hold.end(), Some(HoldEnd::Engine));
}

#[test]
fn rollback_stays_exact_beside_holds_the_engine_confirmed() {
    let (s, pods) = setup(2, &[]);
    let (prompt, tokens) = prompt();
    // Pod 0: two holds awaiting its engine and one without tokens; pod 1: one awaiting.
    let (d, a) = held_on(&s, &pods[0], with_tokens(&prompt, &tokens));
    let (_, b) = held_on(&s, &pods[0], with_tokens(&prompt, &tokens));
    let (_, c) = held_on(&s, &pods[0], req(&prompt));
    let (_, other) = held_on(&s, &pods[1], with_tokens(&prompt, &tokens));
    let all = d.hashes.len();
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![all, all], vec![3, 1]));
    // Pod 0's engine stores the head: both its waits end, not pod 1's, and the hold without
    // tokens still claims.
    engine_stores(&pods[0], &tokens, 16, 100);
    assert!(a.stored_by_engine() && b.stored_by_engine());
    assert!(!c.stored_by_engine() && !other.stored_by_engine());
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![all, all], vec![3, 1]));
    // Rolling the unconfirmed hold back takes away its claim and nothing else.
    assert_eq!(c.end(), None);
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0, all], vec![2, 1]));
    drop(a);
    assert_eq!(claims(&s, &d.hashes, &pods), (vec![0, all], vec![1, 1]));
    assert_eq!(other.end(), Some(HoldEnd::Request));
    assert_eq!(b.end(), Some(HoldEnd::Engine));
    assert_eq!((s.tentative().holds(), s.tentative().blocks()), (0, 0));
}

#[test]
fn a_pod_that_stored_nothing_yet_awaits_at_the_pools_block_size() {
    use super::super::engine_match::matches;
    let (s, mut pods) = setup(2, &[]);
    let fresh = EngineView::new(1 << 16);
    fresh.set_live(true);
    Arc::get_mut(&mut pods[1]).unwrap().engine = Some(fresh);
    let (prompt, tokens) = prompt();
    let head = Some(EngineTokens::message_head(&tokens, prompt.len()));
    let alone = matches(&pods[1..], head, prompt.len(), 10);
    assert_eq!(
        alone[0].unwrap().last_block,
        None,
        "alone, its block size is unknown"
    );
    let pool = matches(&pods, head, prompt.len(), 10);
    let last = pool[1].unwrap().last_block.expect("the pool's block size");
    assert_eq!(Some(last), pool[0].unwrap().last_block);
    // Its first store confirms a hold awaiting that block.
    let hashes = s.schedule(req(&prompt), pods.clone()).unwrap().hashes;
    let view = pods[1].engine.as_ref().unwrap();
    let hold = s
        .hold_tentative("m", &hashes, pods[1].slot(), Some((view, last)))
        .unwrap();
    engine_stores(&pods[1], &tokens, 16, 100);
    assert_eq!(hold.end(), Some(HoldEnd::Engine));
}
