use super::*;

#[test]
fn no_queue_seen_predicts_no_wait_whatever_the_count() {
    let t = PodTiming::default();
    assert_eq!(t.concurrency(), None);
    assert_eq!(
        t.wait(
            50,
            0.0,
            None,
            Pool {
                service: Some(0.2),
                concurrency: None,
                ..Pool::default()
            }
        ),
        0.0
    );
    assert!(t.has_slot(50, Pool::default()));
    assert_eq!(t.fill(50, Pool::default()), 0.0, "no slots known: no fill");
    // The pool's concurrency stands in: 50 in flight on 4 slots.
    let pool = Pool {
        service: Some(0.2),
        concurrency: Some(4.0),
        ..Pool::default()
    };
    assert!(!t.has_slot(50, pool));
    assert_eq!(t.fill(2, pool), 0.5);
    assert!((t.wait(50, 0.0, None, pool) - 47.0 * 0.05).abs() < 1e-9);
    // Running without a queue teaches nothing before a queue was seen.
    t.observe_engine(8.0, 0.0, 0.0);
    assert_eq!(t.concurrency(), None);
}

#[test]
fn learned_concurrency_converges_on_what_the_engine_runs_with_a_queue() {
    let t = PodTiming::default();
    // A sim that runs 4 at once: scrapes with a queue show 4 running (one stale 3 in between).
    for (running, waiting) in [(4.0, 2.0), (3.0, 1.0), (4.0, 5.0), (4.0, 1.0), (4.0, 3.0)] {
        t.observe_engine(running, waiting, 0.0);
    }
    let c = t.concurrency().unwrap();
    assert!((3.9..=4.0).contains(&c), "{c}");
    // More running without a queue: the engine runs at least that many.
    t.observe_engine(6.0, 0.0, 0.0);
    assert_eq!(t.concurrency(), Some(6.0));
    // Fewer running without a queue says nothing.
    t.observe_engine(1.0, 0.0, 0.0);
    assert_eq!(t.concurrency(), Some(6.0));
}

#[test]
fn the_wait_counts_the_completions_needed_before_a_slot_frees() {
    let t = PodTiming::default();
    t.observe_engine(2.0, 1.0, 0.0);
    t.observe_service(0.4);
    // Two slots, 0.4 s each: a slot frees every 0.2 s.
    assert_eq!(t.wait(0, 0.0, None, Pool::default()), 0.0);
    assert_eq!(t.wait(1, 0.0, None, Pool::default()), 0.0);
    assert!((t.wait(2, 0.0, None, Pool::default()) - 0.2).abs() < 1e-9);
    assert!((t.wait(5, 0.0, None, Pool::default()) - 0.8).abs() < 1e-9);
    assert!(!t.has_slot(2, Pool::default()) && t.has_slot(1, Pool::default()));
}

#[test]
fn the_engine_queue_counts_drained_by_its_age() {
    let t = PodTiming::default();
    t.observe_engine(2.0, 1.0, 0.0);
    t.observe_service(0.4);
    // Another replica's 3 queued requests, scraped just now: wait for 4 completions.
    let fresh = t.wait(0, 3.0, Some(Duration::ZERO), Pool::default());
    assert!((fresh - 0.8).abs() < 1e-9, "{fresh}");
    // 0.4 s later two of them have left (a slot frees every 0.2 s).
    let aged = t.wait(0, 3.0, Some(Duration::from_millis(400)), Pool::default());
    assert!((aged - 0.4).abs() < 1e-9, "{aged}");
    // A second later the queue is gone.
    assert_eq!(
        t.wait(0, 3.0, Some(Duration::from_secs(1)), Pool::default()),
        0.0
    );
}

#[test]
fn an_untimed_pod_borrows_the_pools_service_time() {
    let t = PodTiming::default();
    t.observe_engine(1.0, 1.0, 0.0);
    assert!(
        (t.wait(
            1,
            0.0,
            None,
            Pool {
                service: Some(0.3),
                concurrency: None,
                ..Pool::default()
            }
        ) - 0.3)
            .abs()
            < 1e-9
    );
    assert!((t.wait(1, 0.0, None, Pool::default()) - UNKNOWN_SERVICE_SECONDS).abs() < 1e-9);
}

#[test]
fn the_prefill_fit_finds_the_per_token_time_under_noise() {
    let rate = PrefillRate::default();
    assert_eq!(rate.seconds_per_token(), PRIOR_SECONDS_PER_TOKEN);
    // Duration = 0.1 s + 30 us per uncached token + 20 ms per request already running, +-10 ms
    // of decode noise; the long prompts (misses) run in fuller batches.
    for i in 0..400u32 {
        let uncached = f64::from((i * 37) % 1600);
        let running = (uncached / 400.0).floor() + f64::from(i % 2);
        let noise = (f64::from((i * 7919) % 21) - 10.0) * 1e-3;
        rate.observe(
            uncached,
            running,
            0.1 + 30e-6 * uncached + 0.02 * running + noise,
        );
    }
    let p = rate.seconds_per_token();
    assert!((p - 30e-6).abs() < 3e-6, "{p}");
    // The base is a request that prefills nothing in the mean batch (about 1.9 running).
    assert!((rate.base() - 0.138).abs() < 0.01, "{}", rate.base());
    // Fitted on the tokens alone, the fuller batches of misses would pass for prefill.
    let alone = PrefillRate::default();
    for i in 0..400u32 {
        let uncached = f64::from((i * 37) % 1600);
        let running = (uncached / 400.0).floor() + f64::from(i % 2);
        alone.observe(uncached, 0.0, 0.1 + 30e-6 * uncached + 0.02 * running);
    }
    assert!(
        alone.seconds_per_token() > 70e-6,
        "{}",
        alone.seconds_per_token()
    );
    assert!(rate.service().is_some());
}

#[test]
fn the_prefill_fit_keeps_the_prior_without_spread() {
    let rate = PrefillRate::default();
    for _ in 0..100 {
        rate.observe(500.0, 1.0, 0.2);
    }
    assert_eq!(rate.seconds_per_token(), PRIOR_SECONDS_PER_TOKEN);
    // Bad samples are ignored.
    rate.observe(f64::NAN, 0.0, 0.1);
    rate.observe(10.0, 0.0, -1.0);
    assert_eq!(rate.seconds_per_token(), PRIOR_SECONDS_PER_TOKEN);
}

#[test]
fn the_queue_pace_is_the_gap_between_completions_of_a_busy_pod() {
    let t = PodTiming::default();
    t.observe_engine(2.0, 1.0, 0.0);
    t.observe_service(10.0);
    let t0 = Instant::now();
    // Busy (3 in flight on 2 slots) at 0, 0.1 and 0.2 s: a slot frees every 0.1 s.
    for k in 0..3u32 {
        t.observe_completion(t0 + Duration::from_millis(100) * k, 3);
    }
    assert!((t.interval().unwrap() - 0.1).abs() < 1e-9);
    assert!((t.wait(2, 0.0, None, Pool::default()) - 0.1).abs() < 1e-9);
    // A completion that leaves a slot free ends the busy stretch: the next gap is not one.
    t.observe_completion(t0 + Duration::from_secs(1), 2);
    t.observe_completion(t0 + Duration::from_secs(5), 3);
    assert!((t.interval().unwrap() - 0.1).abs() < 1e-9);
}

#[test]
fn each_signal_can_be_left_out() {
    let t = PodTiming::default();
    t.observe_engine(2.0, 1.0, 0.0);
    t.observe_service(0.4);
    let t0 = Instant::now();
    for k in 0..3u32 {
        t.observe_completion(t0 + Duration::from_millis(100) * k, 3);
    }
    let without = |signal: LatencySignal| Pool {
        signals: Signals::of(LatencySignal::ALL.into_iter().filter(|s| *s != signal)),
        ..Pool::default()
    };
    let fresh = Some(Duration::ZERO);
    // All signals: 3 own in flight on 2 slots (2 completions), pace 0.1 s.
    assert!((t.wait(3, 0.0, fresh, Pool::default()) - 0.2).abs() < 1e-9);
    // Without the own count, only the engine's queue counts.
    assert_eq!(t.wait(3, 0.0, fresh, without(LatencySignal::Inflight)), 0.0);
    assert!((t.wait(0, 1.0, fresh, without(LatencySignal::Inflight)) - 0.2).abs() < 1e-9);
    // Without the engine's queue, only the own count.
    assert_eq!(
        t.wait(0, 5.0, fresh, without(LatencySignal::EngineQueue)),
        0.0
    );
    // Without the pace, the service time over the slots (0.2 s a slot).
    assert!((t.wait(3, 0.0, fresh, without(LatencySignal::Pace)) - 0.4).abs() < 1e-9);
    assert_eq!(
        LatencySignal::parse("engineQueue"),
        Some(LatencySignal::EngineQueue)
    );
    assert_eq!(LatencySignal::parse("queue"), None);
}

#[test]
fn a_queue_for_kv_space_is_no_slot_count_and_only_requests_whose_blocks_do_not_fit_wait() {
    let t = PodTiming::default();
    t.observe_service(0.4);
    // Three requests of one tenant in flight: the first pinned its 52 blocks, the two after it
    // 4 each of their own (the head shared), 60 blocks of a cache 60% full: 100 blocks.
    for blocks in [52, 4, 4] {
        t.kv().pins().pin(blocks);
    }
    t.observe_engine(3.0, 0.0, 0.6);
    assert_eq!(t.kv().capacity(), Some(100.0));
    // Until the engine has shown a wait for KV space, none is predicted.
    let pool = Pool::default();
    assert_eq!(t.queue(3, 0.0, None, pool, 52.0), (0.0, 0.0));
    // A request of another tenant (52 blocks) joins; the engine queues it with three running:
    // a wait for KV space, which teaches no concurrency (before: 3 slots, and the tenant's
    // next request, which fits, was predicted to wait too).
    t.kv().pins().pin(52);
    t.observe_engine(3.0, 1.0, 0.6);
    assert_eq!(t.concurrency(), None);
    t.kv().pins().unpin(52);
    // No slot count known: a request of the first tenant (4 new blocks) fits and waits for
    // nothing; one of another tenant waits until 12 blocks free, one completion (20 blocks
    // each on average), three running at 0.4 s each.
    assert_eq!(t.queue(3, 0.0, None, pool, 4.0), (0.0, 0.0));
    let (wait, backlog) = t.queue(3, 0.0, None, pool, 52.0);
    assert!((wait - 0.4 / 3.0).abs() < 1e-9, "{wait}");
    assert!((backlog - 1.0 / 3.0).abs() < 1e-9, "{backlog}");
    // Without the in-flight signal the KV room is not read.
    let no_inflight = Pool {
        signals: Signals::of([LatencySignal::EngineQueue, LatencySignal::Pace]),
        ..pool
    };
    assert_eq!(t.queue(3, 0.0, None, no_inflight, 52.0), (0.0, 0.0));
    // A queue while one more request of the mean size would fit waits for a slot: learned.
    t.observe_engine(3.0, 1.0, 0.6);
    assert_eq!(t.concurrency(), Some(3.0));
}

#[test]
fn a_concurrency_learned_before_the_kv_room_could_tell_is_forgotten_at_the_first_wait_for_kv() {
    // A queue before any KV capacity is learned, with room by the engine's usage, teaches two
    // slots, as it always did.
    let t = PodTiming::default();
    t.kv().pins().pin(100);
    t.observe_engine(2.0, 1.0, 0.3);
    assert_eq!(t.concurrency(), Some(2.0));
    // Then the capacity (50 blocks), and a queue while 100 are in flight: a wait for KV space.
    t.kv().pins().unpin(75);
    t.observe_engine(2.0, 0.0, 0.5);
    t.kv().pins().pin(75);
    t.observe_engine(2.0, 1.0, 0.4);
    assert_eq!(t.concurrency(), None, "forgotten");
    // A queue whose head would not fit by the engine's own usage (two running hold 90%) is a
    // wait for KV space too, capacity learned or not.
    let t = PodTiming::default();
    t.observe_engine(2.0, 1.0, 0.9);
    assert_eq!(t.concurrency(), None);
    // One confirmed by a queue with room to spare (100 blocks, 25 in flight) is kept.
    let t = PodTiming::default();
    t.kv().pins().pin(25);
    t.observe_engine(2.0, 0.0, 0.25);
    t.observe_engine(4.0, 1.0, 0.3);
    assert_eq!(t.concurrency(), Some(4.0));
    t.kv().pins().pin(75);
    t.observe_engine(2.0, 1.0, 0.9);
    assert_eq!(t.concurrency(), Some(4.0));
}
