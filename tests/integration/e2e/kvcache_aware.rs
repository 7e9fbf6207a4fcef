//! kvcache-aware through Envoy: model-sims publish vLLM's KV events, a `kv-relay` beside each
//! (the relay's own code, in process) writes them to a real `redis-server` in Kthena's layout,
//! and the picker runs Kthena's configuration guide (kvcache-aware with least-request),
//! tokenizing on a sim's `/tokenize`. The pod that served a prompt scores 100 for it, an
//! eviction removes the score, and with Redis down, a tokenizer that fails, a wrong-typed Redis
//! key or a huge prompt, requests are still routed, counted, without the score.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::send;
use crate::harness::redis_server::RedisServer;
use crate::harness::*;
use model_sim::engine::EngineConfig;
use prefix_picker::Config;
use prefix_picker::kvcache::relay::{self, RelayIdentity};
use prefix_picker::kvcache::{KvStore, redis_env};
use prefix_picker::serve::Running;
use prefix_picker::sync::connection::LinkStatus;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const GUIDE: &str = include_str!("../fixtures/kthena-kvcache-aware-config.yaml");

/// Kthena's guide config, tokenizing at `tokenizer_port` on the pods' IP (127.0.0.1 here), the
/// sims as static endpoints, Redis at `redis`.
fn guide_config(endpoints: &str, tokenizer_port: u16, redis: &RedisServer) -> Config {
    let doc = GUIDE.replace(
        "      maxBlocksToMatch: 128\n",
        &format!("      maxBlocksToMatch: 128\n      vllmTokenizerPort: {tokenizer_port}\n"),
    );
    let mut config = Config::parse(&format!("{doc}endpoints:\n{endpoints}")).unwrap();
    config
        .env
        .insert("REDIS_HOST".into(), redis.socket().display().to_string());
    config
}

/// A `kv-relay` beside `sim` (the relay's code in process), until `stop`; it then releases
/// the pod's blocks, as at SIGTERM.
async fn relay_beside(
    sim: &Sim,
    redis: &RedisServer,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<relay::RelayCounts> {
    let endpoint = sim.engine.kv_events().expect("publishes events");
    let loopback = |bound: &str| bound.replace("0.0.0.0", "127.0.0.1");
    let events = prefix_picker::kv_events::SubscriberConfig {
        endpoint: loopback(endpoint.endpoint()),
        replay_endpoint: endpoint.replay_endpoint().map(loopback),
        topic: String::new(),
        topic_prefix: String::new(),
        limits: prefix_picker::kv_events::Limits::default(),
    };
    let id = RelayIdentity {
        pod: format!("{}.default", sim.name),
        model: "m".into(),
        engine: prefix_picker::tokenizer::EngineKind::Vllm,
    };
    // As `prefix-picker kv-relay`: the store's keeper outlives the events, for the release.
    let keeper = CancellationToken::new();
    let (store, tasks) = store_on(redis, &keeper).await;
    let stop = stop.clone();
    tokio::spawn(async move {
        let _tasks = tasks;
        let counts = relay::run(id, events, store, stop, std::time::Duration::from_secs(5)).await;
        keeper.cancel();
        counts
    })
}

/// A sim that publishes its KV events (with a replay socket), at 100x speed.
async fn publishing_sim() -> Sim {
    let engine = EngineConfig {
        time_scale: 100.0,
        ..EngineConfig::default()
    };
    Sim::start_with_events("sim-0", engine).await
}

/// `prompt` completed on the sim at `sim` directly (no router): the answer's status.
async fn complete_directly(sim: SocketAddr, prompt: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("http://{sim}/v1/completions"))
        .json(&json!({"model": "m", "prompt": prompt}))
        .send()
        .await
        .unwrap()
        .status()
}

/// A text prompt whose sim tokens fill whole 16-token blocks (what the engine caches).
async fn whole_blocks_prompt(sim: SocketAddr, base: &str) -> String {
    let client = reqwest::Client::new();
    let mut prompt = base.to_string();
    loop {
        let r: Value = client
            .post(format!("http://{sim}/tokenize"))
            .json(&json!({"model": "m", "prompt": prompt}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if r["tokens"].as_array().unwrap().len() % 16 == 0 {
            return prompt;
        }
        prompt.push_str(" x");
    }
}

/// kvcache-aware's score of `pod` in the explanation of `body`.
async fn kv_score(picker: &Running, body: &Value, pod: &str) -> Option<u64> {
    let e = explain(picker, body).await;
    e["pods"]
        .as_array()?
        .iter()
        .find(|p| p["pod"] == format!("default/{pod}"))?["scores"]["kvcache-aware"]
        .as_u64()
}

#[test]
fn kthenas_guide_config_loads_without_a_skipped_plugin() {
    let c = Config::parse(GUIDE).unwrap();
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.contains("Failed to get plugin")),
        "{:?}",
        c.warnings
    );
    assert!(c.scheduler.kvcache_aware().is_some());
    assert!(
        c.scheduler
            .mode_summary()
            .contains("kvcache-aware on (blocks of 16 tokens, up to 128 blocks")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_that_served_a_prompt_scores_100_until_its_engine_evicts_it() {
    // 16 blocks of 16 tokens: a second long prompt evicts the first.
    let engine = EngineConfig {
        time_scale: 100.0,
        kv_blocks: 16,
        ..EngineConfig::default()
    };
    let sims = [
        Sim::start_with_events("sim-0", engine.clone()).await,
        Sim::start_with_events("sim-1", engine).await,
    ];
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    for s in &sims {
        relay_beside(s, &redis, &stop).await;
    }
    let endpoints: String = sims.iter().map(Sim::endpoint_yaml).collect();
    let picker = start_picker(guide_config(&endpoints, sims[0].addr.port(), &redis)).await;
    wait_metric_eq(&picker, "prefix_picker_kvcache_redis_connected", 1.0).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;

    let prompt = whole_blocks_prompt(
        sims[0].addr,
        &"Tenant nine's long instructions, repeated block after block. ".repeat(12),
    )
    .await;
    let body = json!({"model": "m", "prompt": prompt});
    let first = send(&envoy, "/v1/completions", &body).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let holder = first.served_by.clone();
    let other = sims.iter().find(|s| s.name != holder).unwrap().name.clone();
    // The engine's events reach Redis through the relay: the holder scores 100, the other 0.
    poll("the holder to score 100", || async {
        (kv_score(&picker, &body, &holder).await == Some(100)).then_some(())
    })
    .await;
    assert_eq!(kv_score(&picker, &body, &other).await, Some(0));
    let second = send(&envoy, "/v1/completions", &body).await;
    assert_eq!(second.served_by, holder);
    wait_metric(
        &picker,
        "prefix_picker_kvcache_lookups_total{result=\"ok\"}",
        2.0,
    )
    .await;
    wait_metric(
        &picker,
        "kthena_router_kvcache_aware_match_ratio_bucket{model=\"m\",le=\"1\"}",
        1.0,
    )
    .await;

    // The engine evicts the prompt's blocks (a full cache, another prompt sent to it directly):
    // the relay removes exactly those fields and the score drops.
    let holder_sim = sims.iter().find(|s| s.name == holder).unwrap();
    let other_prompt = whole_blocks_prompt(
        holder_sim.addr,
        &"Another tenant entirely, with its own long instructions. ".repeat(14),
    )
    .await;
    assert_eq!(complete_directly(holder_sim.addr, &other_prompt).await, 200);
    poll("the evicted prompt's score to drop", || async {
        kv_score(&picker, &body, &holder)
            .await
            .is_some_and(|s| s < 100)
            .then_some(())
    })
    .await;
    // The engine drops its whole cache: the relay clears the pod's fields, the score is 0.
    assert!(holder_sim.engine.reset_prefix_cache());
    poll("the holder's score to go", || async {
        (kv_score(&picker, &body, &holder).await == Some(0)).then_some(())
    })
    .await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_routes_every_request_without_the_score() {
    let sims = [
        Sim::start("sim-0", fast()).await,
        Sim::start("sim-1", fast()).await,
    ];
    let mut redis = RedisServer::start().await;
    let endpoints: String = sims.iter().map(Sim::endpoint_yaml).collect();
    let picker = start_picker(guide_config(&endpoints, sims[0].addr.port(), &redis)).await;
    wait_metric_eq(&picker, "prefix_picker_kvcache_redis_connected", 1.0).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let body = json!({"model": "m", "prompt": "a prompt routed while Redis is away"});
    redis.kill();
    for _ in 0..6 {
        let r = send(&envoy, "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let failed = not_ok(&picker).await;
    assert!(failed >= 6.0, "{failed}");
    wait_metric(
        &picker,
        "kthena_router_kvcache_aware_errors_total{model=\"m\",stage=\"redis\"}",
        6.0,
    )
    .await;
    // Redis returns: lookups succeed again.
    redis.restart().await;
    wait_metric_eq(&picker, "prefix_picker_kvcache_redis_connected", 1.0).await;
    let r = send(&envoy, "/v1/completions", &body).await;
    assert_eq!(r.status, 200);
    wait_metric(
        &picker,
        "prefix_picker_kvcache_lookups_total{result=\"ok\"}",
        1.0,
    )
    .await;
}

/// A sim whose delays are a thousandth (a 2 MB prompt is served at once).
fn fast() -> EngineConfig {
    EngineConfig {
        time_scale: 1000.0,
        ..EngineConfig::default()
    }
}

/// Lookups that ended without owners.
async fn not_ok(picker: &Running) -> f64 {
    let mut n = 0.0;
    for r in [
        "tokenize_error",
        "deadline",
        "redis_error",
        "redis_unavailable",
    ] {
        n += metric(
            picker,
            &format!("prefix_picker_kvcache_lookups_total{{result=\"{r}\"}}"),
        )
        .await;
    }
    n
}

/// A `/tokenize` that answers by the prompt: garbage, never, 300,000 tokens for a huge prompt,
/// else 32 fixed tokens.
async fn fake_tokenizer() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/tokenize",
        axum::routing::post(|body: String| async move {
            if body.contains("garbage") {
                return "{\"tokens\": \"not a list\"".to_string();
            }
            if body.contains("hang") {
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            }
            let n = if body.len() > 1_000_000 { 300_000 } else { 32 };
            json!({"tokens": (1..=n).collect::<Vec<u32>>(), "count": n}).to_string()
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokenizers_values_and_prompts_cost_the_score_only() {
    let sims = [
        Sim::start("sim-0", fast()).await,
        Sim::start("sim-1", fast()).await,
    ];
    let redis = RedisServer::start().await;
    let tokenizer = fake_tokenizer().await;
    let endpoints: String = sims.iter().map(Sim::endpoint_yaml).collect();
    let picker = start_picker(guide_config(&endpoints, tokenizer.port(), &redis)).await;
    wait_metric_eq(&picker, "prefix_picker_kvcache_redis_connected", 1.0).await;
    let envoy = start_envoy_for_sims(&picker, &sims).await;
    let ok = |p: &str| json!({"model": "m", "prompt": p});

    // A well-formed lookup first: scored (all 0: nothing in Redis).
    assert_eq!(
        send(&envoy, "/v1/completions", &ok("fine")).await.status,
        200
    );
    wait_metric(
        &picker,
        "prefix_picker_kvcache_lookups_total{result=\"ok\"}",
        1.0,
    )
    .await;

    // Garbage from the tokenizer.
    assert_eq!(
        send(&envoy, "/v1/completions", &ok("garbage please"))
            .await
            .status,
        200
    );
    wait_metric(
        &picker,
        "prefix_picker_kvcache_lookups_total{result=\"tokenize_error\"}",
        1.0,
    )
    .await;
    wait_metric(
        &picker,
        "kthena_router_kvcache_aware_errors_total{model=\"m\",stage=\"tokenize\"}",
        1.0,
    )
    .await;
    // One that never answers (its timeout or the lookup's deadline, whichever comes first), and
    // a huge prompt, whose 300,000 tokens are over the tokenizer client's bound.
    let huge = "word ".repeat(400_000);
    for p in ["hang please", huge.as_str()] {
        let before = not_ok(&picker).await;
        assert_eq!(send(&envoy, "/v1/completions", &ok(p)).await.status, 200);
        poll("the lookup counted as failed", || async {
            (not_ok(&picker).await > before).then_some(())
        })
        .await;
    }

    // A block key that is not a hash: the pipelined read fails, the request is routed.
    let first_block =
        prefix_picker::scheduler::kvcache_aware::standardized_hash(&(1..=16).collect::<Vec<u32>>());
    let key = prefix_picker::scheduler::kvcache_aware::block_key("m", first_block);
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        send(&envoy, "/v1/completions", &ok("wrong type"))
            .await
            .status,
        200
    );
    wait_metric(
        &picker,
        "prefix_picker_kvcache_lookups_total{result=\"redis_error\"}",
        1.0,
    )
    .await;
    // A malformed owner value (not a number) is kept, as Kthena keeps it: the pod scores.
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("sim-1.default")
        .arg("soon")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = explain(&picker, &ok("kept")).await;
    let sim1 = e["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == "default/sim-1")
        .unwrap();
    assert_eq!(sim1["scores"]["kvcache-aware"], 50, "{e}");
}

/// A kvcache store on `redis` (its keeper lives in the returned set).
async fn store_on(
    redis: &RedisServer,
    stop: &CancellationToken,
) -> (KvStore, tokio::task::JoinSet<anyhow::Result<()>>) {
    let socket = redis.socket().display().to_string();
    let target =
        redis_env::from_env(&|name| (name == "REDIS_HOST").then(|| socket.clone())).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    let status = LinkStatus {
        context: "test",
        role: "test",
        connected: prometheus::IntGauge::new("test_connected", "test").unwrap(),
        reconnects: None,
    };
    let store = KvStore::start(
        target,
        std::time::Duration::from_secs(5),
        status,
        stop,
        &mut tasks,
    )
    .unwrap();
    poll("the store to connect", || async {
        store.connection().map(|_| ())
    })
    .await;
    (store, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_owner_fields_older_than_a_day() {
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    let (store, _tasks) = store_on(&redis, &stop).await;
    let mut conn = store.connection().unwrap();
    let now = 2_000_000_000i64;
    let day = 24 * 3600;
    let key = "matrix:kv:block:m@1";
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("old.ns")
        .arg(now - day - 1)
        .arg("fresh.ns")
        .arg(now - day)
        .arg("odd.ns")
        .arg("not-a-number")
        .query_async(&mut conn)
        .await
        .unwrap();
    // One SCAN step may see nothing yet (COUNT is a hint): step until the cursor wraps.
    let (mut cursor, mut removed) = (0, 0);
    loop {
        let (next, n) = prefix_picker::kvcache::gc::step(&store, cursor, now)
            .await
            .unwrap();
        removed += n;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(removed, 1);
    let mut left: Vec<String> = redis::cmd("HKEYS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    left.sort();
    assert_eq!(
        left,
        ["fresh.ns", "odd.ns"],
        "unparsable values are left, as Kthena"
    );
    stop.cancel();
}

/// The keys of the Redis at `url` that match `pattern` (`None` while it cannot be asked).
async fn keys_matching(url: String, pattern: &str) -> Option<Vec<String>> {
    let mut c = redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut c)
        .await
        .ok()
}

/// Lets the relay beside `sim` subscribe first: warm-up requests until one's blocks reach Redis.
async fn warm_until_written(sim: SocketAddr, redis: &RedisServer) {
    let mut warm_ups = 0;
    poll("a warm-up's blocks in Redis", || {
        warm_ups += 1;
        let n = warm_ups;
        let url = redis.url();
        async move {
            let warm =
                whole_blocks_prompt(sim, &format!("warm-up prompt {n}, one block or two")).await;
            let status = reqwest::Client::new()
                .post(format!("http://{sim}/v1/completions"))
                .json(&json!({"model": "m", "prompt": warm}))
                .send()
                .await
                .ok()?
                .status();
            assert_eq!(status, 200);
            let keys = keys_matching(url, "matrix:kv:block:m@*").await?;
            (!keys.is_empty()).then_some(())
        }
    })
    .await;
}

/// A relay started (or restarted) beside a warm engine that then idles writes what the engine
/// cached before, from the engine's replay buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_beside_a_warm_engine_writes_what_it_cached() {
    let sim = publishing_sim().await;
    let prompt = whole_blocks_prompt(sim.addr, &"a warm prompt, before any relay ".repeat(4)).await;
    assert_eq!(complete_directly(sim.addr, &prompt).await, 200);
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    let relay = relay_beside(&sim, &redis, &stop).await;
    let url = redis.url();
    poll("the warm prompt's blocks in Redis", || {
        let url = url.clone();
        async move {
            let keys = keys_matching(url, "vllm:kv:block:sim-0.default@*").await?;
            (keys.len() >= 2).then_some(())
        }
    })
    .await;
    stop.cancel();
    relay.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_the_relay_releases_its_pods_blocks_and_leaves_the_others() {
    let sim = publishing_sim().await;
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    let relay = relay_beside(&sim, &redis, &stop).await;
    warm_until_written(sim.addr, &redis).await;
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let conn = c.clone();
    let keys = |pattern: &'static str| {
        let mut c = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query_async(&mut c)
                .await
                .unwrap();
            keys
        }
    };
    let blocks = keys("matrix:kv:block:m@*").await;
    assert!(!keys("vllm:kv:block:sim-0.default@*").await.is_empty());
    // Another pod holds the first block too.
    let _: () = redis::cmd("HSET")
        .arg(&blocks[0])
        .arg("sim-1.default")
        .arg(1)
        .query_async(&mut c)
        .await
        .unwrap();

    stop.cancel();
    let counts = relay.await.unwrap();
    assert!(counts.released_blocks >= blocks.len() as u64, "{counts:?}");
    for key in &blocks {
        let owners: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(!owners.contains_key("sim-0.default"), "{key}: {owners:?}");
    }
    let first: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&blocks[0])
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(first.keys().collect::<Vec<_>>(), ["sim-1.default"]);
    assert_eq!(
        keys("vllm:kv:block:sim-0.default@*").await,
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_at_shutdown_waits_out_a_redis_restart() {
    use prefix_picker::kv_events::{EngineBlockHash, KvEvent};
    let mut redis = RedisServer::start().await;
    let keeper = CancellationToken::new();
    let (store, _tasks) = store_on(&redis, &keeper).await;
    let mut writer = relay::Writer::new(RelayIdentity {
        pod: "sim-0.default".into(),
        model: "m".into(),
        engine: prefix_picker::tokenizer::EngineKind::Vllm,
    });
    let stored = KvEvent::BlockStored {
        block_hashes: vec![EngineBlockHash(1), EngineBlockHash(2)],
        parent: None,
        token_ids: (0..32).collect(),
        block_size: 16,
        lora_id: None,
        medium: None,
    };
    writer.apply(&store, &stored, &keeper).await;
    assert_eq!(writer.counts.stored_blocks, 2);
    // Redis goes away as the relay shuts down: the release retries until it is back.
    redis.kill();
    let release = tokio::spawn(async move {
        let released = writer.release(&store).await;
        (released, writer.counts.released_blocks)
    });
    redis.restart().await;
    let released = tokio::time::timeout(std::time::Duration::from_secs(60), release)
        .await
        .expect("the release completes once Redis is back")
        .unwrap();
    assert_eq!(released, (2, 2));
    keeper.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_survives_a_redis_restart_and_writes_what_it_missed() {
    let sim = publishing_sim().await;
    let mut redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    relay_beside(&sim, &redis, &stop).await;
    let prompt = whole_blocks_prompt(sim.addr, &"Written while Redis was away. ".repeat(8)).await;
    let tokens: Vec<u32> = {
        let r: Value = reqwest::Client::new()
            .post(format!("http://{}/tokenize", sim.addr))
            .json(&json!({"model": "m", "prompt": prompt}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        serde_json::from_value(r["tokens"].clone()).unwrap()
    };
    let first = prefix_picker::scheduler::kvcache_aware::block_key(
        "m",
        prefix_picker::scheduler::kvcache_aware::standardized_hash(&tokens[..16]),
    );
    warm_until_written(sim.addr, &redis).await;
    redis.kill();
    assert_eq!(complete_directly(sim.addr, &prompt).await, 200);
    redis.restart().await;
    // The relay retried the write: the block is there, owned by the pod.
    poll("the missed write to land", || async {
        let mut c = redis::Client::open(redis.url())
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        let owner: Option<String> = redis::cmd("HGET")
            .arg(&first)
            .arg("sim-0.default")
            .query_async(&mut c)
            .await
            .ok()?;
        owner.map(|_| ())
    })
    .await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_redis_refuses_skips_its_event_and_the_next_lands() {
    use prefix_picker::kv_events::{EngineBlockHash, KvEvent};
    use prefix_picker::scheduler::kvcache_aware::{block_key, standardized_hash};
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    let (store, _tasks) = store_on(&redis, &stop).await;
    let mut conn = store.connection().unwrap();
    let stored = |hash: u64, first_token: u32| KvEvent::BlockStored {
        block_hashes: vec![EngineBlockHash(hash)],
        parent: None,
        token_ids: (first_token..first_token + 16).collect(),
        block_size: 16,
        lora_id: None,
        medium: None,
    };
    let key = |first_token: u32| {
        block_key(
            "m",
            standardized_hash(&(first_token..first_token + 16).collect::<Vec<_>>()),
        )
    };
    // A string where the block's hash belongs: every HSET on it answers WRONGTYPE, which no
    // retry mends (the relay once retried it forever, and every later event waited).
    let _: () = redis::cmd("SET")
        .arg(key(0))
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut writer = relay::Writer::new(RelayIdentity {
        pod: "sim-0.default".into(),
        model: "m".into(),
        engine: prefix_picker::tokenizer::EngineKind::Vllm,
    });
    // Bounded only so a regression fails instead of hanging the suite.
    let first = stored(1, 0);
    let refused = writer.apply(&store, &first, &stop);
    tokio::time::timeout(std::time::Duration::from_secs(60), refused)
        .await
        .expect("a refused write is skipped, not retried forever");
    writer.apply(&store, &stored(2, 100), &stop).await;
    assert_eq!(writer.counts.refused_events, 1);
    assert_eq!(writer.counts.stored_blocks, 1);
    let owner: Option<String> = redis::cmd("HGET")
        .arg(key(100))
        .arg("sim-0.default")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        owner.is_some(),
        "the event after the refused one is written"
    );
    stop.cancel();
}
