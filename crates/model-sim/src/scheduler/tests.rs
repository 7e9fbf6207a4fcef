//! The scheduler alone (made-up blocks), then vLLM admission through the simulator's HTTP
//! surface.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::engine::EngineConfig;
use crate::kv_cache::KvBlock;
use crate::tests::{post, sample, start_named};

/// A prompt of `tokens` tokens whose full blocks (4 tokens each) hash to `first..`.
fn prompt(first: u64, tokens: usize) -> PromptBlocks {
    PromptBlocks {
        hashes: (first..first + (tokens / 4) as u64).map(KvBlock).collect(),
        tokens,
        token_ids: Vec::new(),
    }
}

fn started(pass: &Pass) -> Vec<ReqId> {
    pass.started.iter().map(|s| s.id).collect()
}

#[test]
fn a_request_waits_until_its_blocks_fit_and_blocks_the_queue_behind_it() {
    let mut kv = KvCache::new(4, 10);
    let mut s = Scheduler::new(8);
    let (a, _, pass) = s.submit(&mut kv, prompt(0, 24)).unwrap();
    assert_eq!(started(&pass), [a]);
    assert_eq!(kv.free_blocks(), 4);
    // Five blocks, four free: it waits, and so does the one-block prompt behind it (FIFO).
    let (b, b_shared, pass) = s.submit(&mut kv, prompt(100, 18)).unwrap();
    assert!(pass.started.is_empty());
    assert_eq!(pass.waits, [0, 1]);
    let (c, _, pass) = s.submit(&mut kv, prompt(200, 3)).unwrap();
    assert!(pass.started.is_empty());
    assert_eq!((s.waiting(), s.blocked()), (2, Some(WaitCause::KvCache)));
    assert!(!b_shared.running());
    // A ends: its six blocks stay cached but evictable, so both fit now, in order.
    let pass = s.finish(&mut kv, a);
    assert_eq!(started(&pass), [b, c]);
    assert!(b_shared.running());
    assert_eq!((s.running(), s.waiting(), s.blocked()), (2, 0, None));
    assert_eq!(kv.free_blocks(), 4);
}

#[test]
fn blocks_a_running_request_holds_are_not_counted_again() {
    let mut kv = KvCache::new(4, 10);
    let mut s = Scheduler::new(8);
    let (_, _, _) = s.submit(&mut kv, prompt(0, 24)).unwrap();
    // Eight blocks, six shared with the running prompt: two to allocate, four free.
    let (b, shared, pass) = s.submit(&mut kv, prompt(0, 32)).unwrap();
    assert_eq!(started(&pass), [b]);
    assert_eq!(pass.started[0].cached_tokens, 24);
    assert_eq!(shared.cached_tokens(), 24);
    assert_eq!(kv.free_blocks(), 2);
}

#[test]
fn a_full_slot_list_is_the_other_cause() {
    let mut kv = KvCache::new(4, 100);
    let mut s = Scheduler::new(1);
    let (a, _, _) = s.submit(&mut kv, prompt(0, 8)).unwrap();
    let (b, _, pass) = s.submit(&mut kv, prompt(10, 8)).unwrap();
    assert_eq!(pass.waits, [1, 0]);
    assert_eq!(s.blocked(), Some(WaitCause::MaxNumSeqs));
    assert_eq!(started(&s.finish(&mut kv, a)), [b]);
}

#[test]
fn growing_past_the_free_blocks_preempts_the_last_started_which_resumes_from_the_cache() {
    let mut kv = KvCache::new(4, 10);
    let mut s = Scheduler::new(8);
    let (a, _, _) = s.submit(&mut kv, prompt(0, 16)).unwrap();
    let (b, b_shared, _) = s.submit(&mut kv, prompt(100, 16)).unwrap();
    assert_eq!((s.running(), kv.free_blocks()), (2, 2));
    // A's answer: one block fits; two more do not, so B (started last) is preempted.
    let (grown, pass) = s.grow(&mut kv, a, 20);
    assert!(grown && pass.preempted == 0);
    let (grown, pass) = s.grow(&mut kv, a, 28);
    assert!(grown);
    assert_eq!(pass.preempted, 1);
    assert!(!b_shared.running());
    assert_eq!(b_shared.preemptions(), 1);
    assert_eq!((s.running(), s.waiting()), (1, 1));
    // A ends; B resumes first in the queue. Its blocks were freed last first, so A's second
    // block evicted B's last: three of its four are still cached.
    let pass = s.finish(&mut kv, a);
    assert_eq!(
        pass.started,
        [Started {
            id: b,
            cached_tokens: 12,
            resumed: true,
        }]
    );
    assert!(b_shared.running());
}

#[test]
fn the_growing_request_preempts_itself_when_it_is_the_last() {
    let mut kv = KvCache::new(4, 10);
    let mut s = Scheduler::new(8);
    let (a, a_shared, _) = s.submit(&mut kv, prompt(0, 16)).unwrap();
    let (b, b_shared, _) = s.submit(&mut kv, prompt(100, 16)).unwrap();
    let (grown, pass) = s.grow(&mut kv, b, 28);
    assert!(!grown);
    assert_eq!(pass.preempted, 1);
    assert!(a_shared.running() && !b_shared.running());
    // Seven blocks, six free (A holds four): it waits for A.
    assert_eq!((s.waiting(), s.blocked()), (1, Some(WaitCause::KvCache)));
    assert_eq!(started(&s.finish(&mut kv, a)), [b]);
}

#[test]
fn a_prompt_larger_than_the_cache_is_refused_and_one_alone_always_fits() {
    let mut kv = KvCache::new(4, 10);
    let mut s = Scheduler::new(8);
    assert_eq!(
        s.submit(&mut kv, prompt(0, 41)).unwrap_err(),
        TooLarge {
            blocks: 11,
            capacity: 10
        }
    );
    let (a, _, _) = s.submit(&mut kv, prompt(0, 40)).unwrap();
    // Its answer cannot grow past the cache: it keeps running, capped.
    let (grown, pass) = s.grow(&mut kv, a, 60);
    assert!(grown);
    assert_eq!((pass.preempted, kv.free_blocks()), (0, 0));
}

fn vllm(kv_blocks: usize, block_tokens: usize) -> EngineConfig {
    EngineConfig {
        kv_admission: KvAdmission::Vllm,
        kv_blocks,
        block_tokens,
        overhead: Duration::ZERO,
        prefill_per_token: Duration::ZERO,
        inter_token_latency: Duration::from_millis(1),
        ..EngineConfig::default()
    }
}

async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn preempted_requests_complete_with_their_full_answers_and_are_counted() {
    // Two-token blocks, 40 of them: every prompt fits at once, but not every answer.
    let (base, engine) = start_named("sim-0", vllm(40, 2)).await;
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let url = format!("{base}/v1/completions");
            tokio::spawn(async move {
                let stream = i % 2 == 1;
                let body = json!({"model": "m", "prompt": format!("request {i}"), "max_tokens": 24,
                    "stream": stream, "stream_options": {"include_usage": true}});
                let r = post(&url, &body).await;
                assert!(r.status().is_success());
                let text = r.text().await.unwrap();
                if !stream {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(v["usage"]["completion_tokens"], 24);
                    return v["choices"][0]["text"].as_str().unwrap().to_string();
                }
                let chunks: Vec<Value> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| *d != "[DONE]")
                    .map(|d| serde_json::from_str(d).unwrap())
                    .collect();
                assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 24);
                chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["text"].as_str())
                    .collect()
            })
        })
        .collect();
    for t in tasks {
        let answer = t.await.unwrap();
        assert_eq!(answer.split(' ').count(), 24, "{answer}");
    }
    let text = metrics(&base).await;
    let preemptions = sample(&text, "vllm:num_preemptions_total");
    assert!(preemptions >= 1.0, "{text}");
    assert_eq!(preemptions, engine.preemptions() as f64);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(sample(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.0);
    // Every prompt was looked up once, however often it was recomputed.
    assert_eq!(sample(&text, "vllm:time_to_first_token_seconds_count"), 6.0);
}

#[tokio::test]
async fn metrics_tell_a_wait_for_kv_space_from_a_wait_for_a_slot() {
    let (base, engine) = start_named(
        "sim-0",
        EngineConfig {
            inter_token_latency: Duration::from_millis(10),
            max_num_seqs: 2,
            ..vllm(64, 4)
        },
    )
    .await;
    let url = format!("{base}/v1/completions");
    let send = |prompt: String, max_tokens: u32| {
        let url = url.clone();
        tokio::spawn(async move {
            let body = json!({"model": "m", "prompt": prompt, "max_tokens": max_tokens});
            post(&url, &body).await.status()
        })
    };
    // A long answer runs; a prompt of 40 blocks does not fit beside it (64 - 30 free).
    let long = send("x".repeat(6 * 4 * 29), 100);
    wait_for(|| engine.running() == 1).await;
    let big = send("y".repeat(6 * 4 * 40), 1);
    wait_for(|| engine.waiting() == 1).await;
    let text = metrics(&base).await;
    let m = |name: &str| sample(&text, name);
    assert_eq!(m("vllm:num_requests_waiting"), 1.0);
    assert_eq!(
        m("vllm:num_requests_waiting_by_reason{reason=\"capacity\"}"),
        1.0
    );
    assert_eq!(
        m("vllm:num_requests_waiting_by_reason{reason=\"deferred\"}"),
        0.0
    );
    assert_eq!(m("model_sim_requests_waiting{cause=\"kv_cache\"}"), 1.0);
    assert_eq!(m("model_sim_requests_waiting{cause=\"max_num_seqs\"}"), 0.0);
    assert_eq!(
        m("model_sim_admission_waits_total{cause=\"kv_cache\"}"),
        1.0
    );
    assert!(long.await.unwrap().is_success());
    assert!(big.await.unwrap().is_success());
    // Two slots: a third request waits for one.
    let a = send("a".into(), 30);
    let b = send("b".into(), 30);
    wait_for(|| engine.running() == 2).await;
    let c = send("c".into(), 1);
    wait_for(|| engine.waiting() == 1).await;
    let text = metrics(&base).await;
    assert_eq!(
        sample(&text, "model_sim_requests_waiting{cause=\"max_num_seqs\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "model_sim_admission_waits_total{cause=\"max_num_seqs\"}"
        ),
        1.0
    );
    for t in [a, b, c] {
        assert!(t.await.unwrap().is_success());
    }
    assert_eq!((engine.running(), engine.waiting()), (0, 0));
    // A prompt the cache could never hold is refused.
    let r = post(
        &url,
        &json!({"model": "m", "prompt": "z".repeat(6 * 4 * 65), "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status().as_u16(), 400);
}

/// Polls until `ready` (at most 10 s).
async fn wait_for(ready: impl Fn() -> bool) {
    let start = tokio::time::Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn the_default_admission_exports_no_preemption_series() {
    let (base, _) = start_named("sim-0", EngineConfig::default()).await;
    assert!(!metrics(&base).await.contains("preemptions"));
}

#[derive(Debug, Clone)]
enum Op {
    /// A prompt of this many tokens, its blocks from one of four shared chains.
    Submit { chain: u64, tokens: usize },
    /// The n-th running request's KV grows by this many tokens.
    Grow { nth: usize, tokens: usize },
    /// The n-th request still known ends.
    Finish { nth: usize },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0..4u64, 1..48usize).prop_map(|(chain, tokens)| Op::Submit { chain, tokens }),
        (0..8usize, 1..12usize).prop_map(|(nth, tokens)| Op::Grow { nth, tokens }),
        (0..8usize).prop_map(|nth| Op::Finish { nth }),
    ]
}

proptest::proptest! {
    /// Whatever arrives, grows and ends: the cache never holds more than its capacity and pins
    /// exactly what running requests hold, a running request holds the blocks of its tokens
    /// (capped at the capacity), a waiting one none, the running list respects max_num_seqs,
    /// and the queue never waits on an idle engine.
    #[test]
    fn admission_and_preemption_keep_their_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let (capacity, block) = (12, 4);
        let mut kv = KvCache::new(block, capacity);
        let mut s = Scheduler::new(3);
        for op in ops {
            match op {
                Op::Submit { chain, tokens } => {
                    let _ = s.submit(&mut kv, prompt(chain * 1000, tokens));
                }
                Op::Grow { nth, tokens } => {
                    if let Some(&id) = s.running.get(nth % s.running.len().max(1)) {
                        let now = s.reqs[&id].tokens;
                        s.grow(&mut kv, id, now + tokens);
                    }
                }
                Op::Finish { nth } => {
                    let ids: Vec<ReqId> = s.reqs.keys().copied().collect();
                    if !ids.is_empty() {
                        s.finish(&mut kv, ids[nth % ids.len()]);
                    }
                }
            }
            proptest::prop_assert!(kv.usage() <= 1.0);
            // The cache's pinned blocks are exactly the running requests' (shared ones once).
            let hashed: std::collections::HashSet<KvBlock> =
                s.reqs.values().flat_map(|r| r.held.pinned.iter().copied()).collect();
            let tails: usize = s.reqs.values().map(|r| r.held.tail).sum();
            let pinned = (kv.usage() * capacity as f64).round() as usize;
            proptest::prop_assert_eq!(pinned, hashed.len() + tails);
            proptest::prop_assert!(s.running.len() <= 3);
            proptest::prop_assert!(!s.running.is_empty() || s.waiting.is_empty());
            for (id, req) in &s.reqs {
                let held = req.held.pinned.len() + req.held.tail;
                if s.running.contains(id) {
                    proptest::prop_assert!(req.shared.running());
                    proptest::prop_assert_eq!(held, req.tokens.div_ceil(block).min(capacity));
                } else {
                    proptest::prop_assert!(!req.shared.running());
                    proptest::prop_assert_eq!(held, 0);
                    proptest::prop_assert!(s.waiting.contains(id));
                }
            }
        }
    }
}
