use super::config::{PasswordSource, SyncConfig, SyncConfigError, Topology, hash_tag};
use super::record::{self, DecodeError, HashParams};
use super::tailer::{EntryId, parse_info, stream_entries};
use crate::config::Config;
use crate::hashing::BlockHash;
use redis::Value;

const PARAMS: HashParams = HashParams {
    block_size_to_hash: 64,
    max_blocks_to_match: 128,
    scheme: crate::hashing::ChainScheme::Kthena,
};

fn parse(yaml: &str) -> Result<SyncConfig, String> {
    SyncConfig::parse(&serde_yaml_ng::from_str(yaml).unwrap())
}

#[test]
fn defaults_and_full_section() {
    let c = parse("redis: {url: 'redis://127.0.0.1:6379/0'}")
        .unwrap()
        .redis;
    assert_eq!(c.stream, "prefix-picker:{default}");
    assert_eq!(c.max_len, 1_000_000);
    assert!(c.replay_on_start);
    assert_eq!(c.replay_timeout.as_secs(), 10);
    assert_eq!((c.batch_max_records, c.queue_capacity), (256, 10_000));
    assert_eq!(c.password, PasswordSource::Url);

    let c = parse(
        "redis: {url: 'rediss://h:6380', passwordEnv: PW, stream: 'pp:{pool}', maxLen: 5, \
         replayOnStart: false, replayTimeoutSeconds: 0.5, batchMaxRecords: 2, queueCapacity: 3}",
    )
    .unwrap()
    .redis;
    assert_eq!(c.password, PasswordSource::Env("PW".into()));
    assert_eq!(
        (c.max_len, c.batch_max_records, c.queue_capacity),
        (5, 2, 3)
    );
    assert!(!c.replay_on_start);
    assert_eq!(c.replay_timeout.as_millis(), 500);
    parse("redis: {url: 'redis+unix:///tmp/r.sock'}").unwrap();
}

#[test]
fn strict_errors_name_the_key_and_value() {
    let e = parse("redis: {url: 'redis://h', maxlen: 5}").unwrap_err();
    assert!(e.contains("unknown field `maxlen`"), "{e}");
    let e = parse("redis: {url: 'redis://h'}\nkafka: {}").unwrap_err();
    assert!(e.contains("unknown field `kafka`"), "{e}");
    let e = parse("redis: {url: 'http://h'}").unwrap_err();
    assert!(e.contains("sync.redis.url \"http://h\""), "{e}");
    let e = parse("redis: {url: 'redis://h', queueCapacity: 0}").unwrap_err();
    assert!(
        e.contains("queueCapacity must be greater than 0, got 0"),
        "{e}"
    );
    let e = parse("redis: {url: 'redis://h', replayTimeoutSeconds: -1}").unwrap_err();
    assert!(e.contains("replayTimeoutSeconds"), "{e}");
    // 0 would report ready before the replay (issue 26); without the replay it means nothing.
    let e = parse("redis: {url: 'redis://h', replayTimeoutSeconds: 0}").unwrap_err();
    assert!(e.contains("up to 86400, and > 0 with replayOnStart"), "{e}");
    assert!(
        e.contains("replayOnStart: false") && e.ends_with("got 0"),
        "{e}"
    );
    parse("redis: {url: 'redis://h', replayOnStart: false, replayTimeoutSeconds: 0}").unwrap();
    // Finite but past any timer: once a panic at start-up and in every reload that parsed it.
    let e = parse("redis: {url: 'redis://h', replayTimeoutSeconds: 1.0e20}").unwrap_err();
    assert!(e.ends_with("got 100000000000000000000"), "{e}");
    let e = parse("redis: {url: 'redis://h', passwordEnv: A, passwordFile: /b}").unwrap_err();
    assert!(e.contains("at most one of passwordEnv"), "{e}");
    // Through the whole config: one error line per problem, prefixed with the section.
    let e = Config::parse("sync: {redis: {url: 'redis://h', batchMaxRecords: 0}}").unwrap_err();
    assert!(e.to_string().starts_with("sync: "), "{e}");
    assert!(Config::parse("{}").unwrap().sync.is_none());
}

/// The single node of a non-cluster topology.
fn node(t: Topology) -> redis::ConnectionInfo {
    match t {
        Topology::Node(info) => *info,
        Topology::Cluster(_) => panic!("expected one node"),
    }
}

#[test]
fn passwords_come_from_env_or_file_and_urls_are_redacted() {
    let c = parse("redis: {url: 'redis://user:s3cret@h:1/2', passwordEnv: PW}")
        .unwrap()
        .redis;
    assert_eq!(c.shown_urls(), "redis://user:***@h:1/2");
    let info = node(
        c.topology(&|k| (k == "PW").then(|| "from-env".into()))
            .unwrap(),
    );
    assert_eq!(info.redis_settings().password(), Some("from-env"));
    assert_eq!(
        c.topology(&|_| None).unwrap_err(),
        SyncConfigError::PasswordEnvUnset("PW".into())
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "from-file\n").unwrap();
    let c = parse(&format!(
        "redis: {{url: 'redis://h', passwordFile: '{}'}}",
        file.display()
    ))
    .unwrap()
    .redis;
    let info = node(c.topology(&|_| None).unwrap());
    assert_eq!(info.redis_settings().password(), Some("from-file"));
}

#[test]
fn hash_tags_follow_the_redis_rule() {
    assert_eq!(hash_tag("prefix-picker:{pool}"), Some("pool"));
    assert_eq!(hash_tag("{a}{b}"), Some("a"));
    assert_eq!(hash_tag("x{a}b}"), Some("a"));
    // Empty or unclosed: Redis hashes the whole key.
    assert_eq!(hash_tag("x{}y{z}"), None);
    assert_eq!(hash_tag("x{abc"), None);
    assert_eq!(hash_tag("x}a{"), None);
    assert_eq!(hash_tag("plain"), None);
}

#[test]
fn cluster_mode_takes_seed_urls_and_applies_the_password_to_each() {
    let c = parse("redis: {url: 'redis://seed:7000', cluster: true}")
        .unwrap()
        .redis;
    assert!(c.cluster);
    assert_eq!(c.urls, ["redis://seed:7000"]);
    assert!(matches!(c.topology(&|_| None).unwrap(), Topology::Cluster(s) if s.len() == 1));

    let c = parse(
        "redis: {urls: ['rediss://:old@a:7000', 'rediss://:old@b:7001'], cluster: true, \
         passwordEnv: PW, stream: 'pp:{pool}'}",
    )
    .unwrap()
    .redis;
    assert_eq!(c.shown_urls(), "rediss://:***@a:7000,rediss://:***@b:7001");
    let Topology::Cluster(seeds) = c.topology(&|_| Some("new".into())).unwrap() else {
        panic!("expected a cluster");
    };
    assert_eq!(seeds.len(), 2);
    for s in &seeds {
        assert_eq!(s.redis_settings().password(), Some("new"));
        assert!(matches!(s.addr(), redis::ConnectionAddr::TcpTls { .. }));
    }
    // Without cluster: true a single url is one node, whatever the stream is called.
    let c = parse("redis: {url: 'redis://h', stream: 'no-tag'}")
        .unwrap()
        .redis;
    assert!(!c.cluster);
    node(c.topology(&|_| None).unwrap());
}

#[test]
fn cluster_errors_name_the_key_and_value() {
    let err = |yaml: &str| parse(yaml).unwrap_err();
    let e = err("redis: {url: 'redis://h', cluster: true, stream: 'prefix-picker:pool'}");
    assert!(
        e.contains("sync.redis.stream \"prefix-picker:pool\" has no hash tag"),
        "{e}"
    );
    let e = err("redis: {url: 'redis://h', cluster: true, stream: 'pp:{}'}");
    assert!(e.contains("\"pp:{}\" has no hash tag"), "{e}");
    let e = err("redis: {url: 'redis+unix:///tmp/r.sock', cluster: true}");
    assert!(
        e.contains(
            "sync.redis.url \"redis+unix:///tmp/r.sock\": Redis Cluster is reached over TCP"
        ),
        "{e}"
    );
    let e = err("redis: {urls: ['redis://a', 'redis://b:1/3'], cluster: true}");
    assert!(
        e.contains("sync.redis.urls[1] \"redis://b:1/3\" selects database 3"),
        "{e}"
    );
    let e = err("redis: {urls: ['redis://a', 'rediss://b'], cluster: true}");
    assert!(e.contains("mixes redis:// and rediss://"), "{e}");
    let e = err("redis: {urls: ['redis://:x@a', 'redis://:y@b'], cluster: true}");
    assert!(
        e.contains("sync.redis.urls [\"redis://:***@a\", \"redis://:***@b\"]: ")
            && e.contains("different password"),
        "{e}"
    );
    let e = err("redis: {urls: ['redis://a', 'http://b'], cluster: true}");
    assert!(
        e.contains("sync.redis.urls[1] \"http://b\" is not a Redis URL"),
        "{e}"
    );
    let e = err("redis: {urls: ['redis://a', 'redis://b']}");
    assert!(e.contains("needs cluster: true"), "{e}");
    let e = err("redis: {url: 'redis://:pw@a', urls: ['redis://b'], cluster: true}");
    assert!(
        e.contains("set url (\"redis://:***@a\") or urls, not both"),
        "{e}"
    );
    let e = err("redis: {cluster: true}");
    assert!(
        e.contains("set url (one node, or a cluster seed) or urls"),
        "{e}"
    );
}

#[test]
fn records_round_trip() {
    let hashes: Vec<BlockHash> = [1u64, u64::MAX, 0x0102_0304_0506_0708]
        .into_iter()
        .map(BlockHash)
        .collect();
    let bytes = record::encode(42, PARAMS, "llama", "default/pod-a", "uid-1", &hashes);
    assert_eq!(bytes.len(), 17 + 2 + 5 + 2 + 13 + 2 + 5 + 24);
    // Hashes are little-endian u64s at the end.
    assert_eq!(&bytes[bytes.len() - 8..], &[8, 7, 6, 5, 4, 3, 2, 1]);
    let mut out = vec![BlockHash(9)];
    let r = record::decode(&bytes, &mut out).unwrap();
    assert_eq!(r.replica, 42);
    assert_eq!(r.params, PARAMS);
    assert_eq!(
        (r.model, r.pod, r.generation),
        ("llama", "default/pod-a", "uid-1")
    );
    assert_eq!(out, hashes);
}

#[test]
fn bad_payloads_are_errors_not_panics() {
    let good = record::encode(1, PARAMS, "m", "default/p", "", &[BlockHash(3)]);
    let mut buf = Vec::new();
    assert_eq!(
        record::decode(&[], &mut buf),
        Err(DecodeError::Truncated(0))
    );
    // Version 2 is the seeded block scheme; 3 is unknown.
    let mut v3 = good.clone();
    v3[0] = 3;
    assert_eq!(record::decode(&v3, &mut buf), Err(DecodeError::Version(3)));
    assert_eq!(
        record::decode(&good[..good.len() - 1], &mut buf),
        Err(DecodeError::Hashes(7))
    );
    for cut in 1..good.len() - 8 {
        assert!(
            record::decode(&good[..cut], &mut buf).is_err(),
            "cut at {cut}"
        );
    }
    let mut bad_utf8 = record::encode(1, PARAMS, "m", "default/p", "", &[]);
    bad_utf8[19] = 0xFF;
    assert_eq!(
        record::decode(&bad_utf8, &mut buf),
        Err(DecodeError::Utf8(19))
    );
}

proptest::proptest! {
    #[test]
    fn any_record_round_trips(replica: u64, model in ".{0,40}", pod in ".{0,40}",
                              generation in ".{0,40}", hashes in proptest::collection::vec(proptest::num::u64::ANY, 0..200)) {
        let hashes: Vec<BlockHash> = hashes.into_iter().map(BlockHash).collect();
        let bytes = record::encode(replica, PARAMS, &model, &pod, &generation, &hashes);
        let mut out = Vec::new();
        let r = record::decode(&bytes, &mut out).unwrap();
        proptest::prop_assert_eq!((r.replica, r.model, r.pod, r.generation), (replica, model.as_str(), pod.as_str(), generation.as_str()));
        proptest::prop_assert_eq!(out, hashes);
    }
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn entry_ids_order_and_print() {
    let a = EntryId::parse("1700000000000-5").unwrap();
    assert!(a < EntryId::parse("1700000000000-6").unwrap());
    assert!(a < EntryId::parse("1700000000001-0").unwrap());
    assert_eq!(a.to_string(), "1700000000000-5");
    assert_eq!(EntryId::parse("x-1"), None);
}

#[test]
fn xinfo_and_xread_replies_parse() {
    let info = parse_info(Value::Array(vec![
        bulk("length"),
        Value::Int(3),
        bulk("last-generated-id"),
        bulk("10-2"),
        bulk("entries-added"),
        Value::Int(7),
        bulk("first-entry"),
        Value::Array(vec![bulk("10-0"), Value::Array(vec![])]),
    ]));
    assert_eq!((info.length, info.added), (3, 7));
    assert_eq!(info.first, EntryId::parse("10-0"));
    assert_eq!(info.last_generated, EntryId::parse("10-2").unwrap());

    let reply = Value::Array(vec![Value::Array(vec![
        bulk("s"),
        Value::Array(vec![
            Value::Array(vec![
                bulk("10-0"),
                Value::Array(vec![bulk("r"), bulk("xy")]),
            ]),
            Value::Array(vec![
                bulk("10-1"),
                Value::Array(vec![bulk("other"), bulk("z")]),
            ]),
        ]),
    ])]);
    let entries = stream_entries(reply);
    assert_eq!(
        entries,
        vec![
            (EntryId::parse("10-0").unwrap(), Some(b"xy".to_vec())),
            (EntryId::parse("10-1").unwrap(), None)
        ]
    );
    assert!(stream_entries(Value::Nil).is_empty());
}

mod applier {
    use std::sync::Arc;

    use super::PARAMS;
    use crate::config::{PickerConfig, SchedulerConfig};
    use crate::endpoints::{EndpointSpec, PodId, Update};
    use crate::hashing::BlockHash;
    use crate::metrics::{PrefixCacheMetrics, RouterMetrics};
    use crate::prefix_index::ModelKey;
    use crate::routing::Router;
    use crate::sync::apply::{Applied, Applier};
    use crate::sync::metrics::{DropReason, SyncMetrics};
    use crate::sync::record::{self, HashParams};

    const ME: u64 = 7;

    fn spec(name: &str, port: u16, generation: &str) -> EndpointSpec {
        EndpointSpec {
            id: PodId {
                namespace: "default".into(),
                name: name.into(),
            },
            address: ([127, 0, 0, 1], port).into(),
            models: vec![],
            generation: generation.into(),
            role: None,
            labels: Default::default(),
            kv_events: None,
            containers_started: None,
            engine_started: None,
        }
    }

    #[test]
    fn applies_known_pods_and_counts_the_rest() {
        let registry = prometheus::Registry::new();
        let router = Arc::new(Router::assemble(
            SchedulerConfig::default(),
            PickerConfig::default(),
            PrefixCacheMetrics::register(&registry),
            RouterMetrics::register(&registry),
        ));
        let index = router.scheduler.prefix_cache().index().clone();
        let endpoints = router.endpoints.clone();
        endpoints.apply(Update::Reset(vec![spec("a", 1, "uid-a"), spec("b", 2, "")]));
        let sync_metrics = SyncMetrics::register(&registry);
        let mut applier = Applier::new(router, ME, PARAMS, sync_metrics.clone());
        let h = [BlockHash(11), BlockHash(12)];
        let enc = |replica, params, pod: &str, generation: &str| {
            record::encode(replica, params, "m", pod, generation, &h)
        };

        assert_eq!(
            applier.apply(&enc(1, PARAMS, "default/a", "uid-a")),
            Applied::Recorded
        );
        let a = endpoints.snapshot().all()[0].index.slot();
        assert_eq!(index.pods_holding(ModelKey::of("m"), BlockHash(12)), [a]);
        // Static pods have no generation: any generation applies.
        assert_eq!(
            applier.apply(&enc(1, PARAMS, "default/b", "x")),
            Applied::Recorded
        );
        assert_eq!(
            applier.apply(&enc(ME, PARAMS, "default/a", "")),
            Applied::Own
        );
        let other = HashParams {
            block_size_to_hash: 32,
            ..PARAMS
        };
        let seeded = HashParams {
            scheme: crate::hashing::ChainScheme::Seeded,
            ..PARAMS
        };
        assert_eq!(
            applier.apply(&enc(1, seeded, "default/a", "")),
            Applied::Dropped(DropReason::ParamsMismatch),
            "a record of the other block scheme is not applied"
        );
        assert_eq!(
            applier.apply(&enc(1, other, "default/a", "")),
            Applied::Dropped(DropReason::ParamsMismatch)
        );
        assert_eq!(
            applier.apply(&enc(1, PARAMS, "default/zz", "")),
            Applied::Dropped(DropReason::UnknownPod)
        );
        assert_eq!(
            applier.apply(&enc(1, PARAMS, "default/a", "uid-old")),
            Applied::Dropped(DropReason::StaleGeneration)
        );
        assert_eq!(
            applier.apply(b"junk"),
            Applied::Dropped(DropReason::Malformed)
        );
        // A pod that appears later is found (the lookup map follows the snapshot).
        endpoints.apply(Update::add(spec("c", 3, "")));
        assert_eq!(
            applier.apply(&enc(1, PARAMS, "default/c", "")),
            Applied::Recorded
        );
        assert_eq!(sync_metrics.applied.get(), 3);
        for (reason, count) in [
            (DropReason::ParamsMismatch, 2),
            (DropReason::UnknownPod, 1),
            (DropReason::StaleGeneration, 1),
            (DropReason::Malformed, 1),
        ] {
            assert_eq!(
                sync_metrics
                    .dropped
                    .with_label_values(&[reason.as_str()])
                    .get(),
                count
            );
        }
    }
}
