//! The shared socket's routing by topic, without a socket: messages handed to [`Streams`]
//! directly, payloads from msgspec (tests/wire/golden.txt).

use std::net::SocketAddr;

use prometheus::Registry;

use super::*;
use crate::endpoints::{KvEventsAddress, Update as PodUpdate};
use crate::metrics::RouterMetrics;

const GOLDEN: &str = include_str!("../../../tests/wire/golden.txt");

/// Two GPU blocks stored (`map_stored`).
fn stored() -> Vec<u8> {
    let hex = GOLDEN
        .lines()
        .find_map(|l| l.strip_prefix("map_stored "))
        .expect("map_stored in golden.txt");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn spec(namespace: &str, name: &str, address: &str) -> crate::endpoints::EndpointSpec {
    let mut s = crate::testing::spec(name, 1, &[]);
    s.id.namespace = namespace.into();
    s.address = address.parse::<SocketAddr>().unwrap();
    s
}

/// Pods `a` (10.0.0.1:8000), `b` and `c` (both on 10.0.0.2), `own` (its own publisher) and `a`
/// again in namespace `other` (10.0.0.3:8000), every one with a view.
fn pods() -> (Arc<Endpoints>, RouterMetrics) {
    let metrics = RouterMetrics::register(&Registry::new());
    let endpoints = Arc::new(
        Endpoints::new(Arc::new(PrefixIndex::new(10)), metrics.clone())
            .with_engine_views_for_every_pod(true),
    );
    let mut own = spec("default", "own", "10.0.0.4:8000");
    own.kv_events = Some(KvEventsAddress {
        endpoint: "tcp://10.0.0.4:5557".into(),
        replay: None,
    });
    endpoints.apply(PodUpdate::Reset(vec![
        spec("default", "a", "10.0.0.1:8000"),
        spec("default", "b", "10.0.0.2:8000"),
        spec("default", "c", "10.0.0.2:8001"),
        spec("other", "a", "10.0.0.3:8000"),
        own,
    ]));
    (endpoints, metrics)
}

fn named(set: &EndpointSet, id: &str) -> Result<String, &'static str> {
    match find_pod(set, id) {
        Found::One(e) => Ok(e.spec.id.to_string()),
        Found::None => Err("none"),
        Found::Several => Err("several"),
    }
}

#[test]
fn a_topic_names_a_pod_by_address_ip_or_name() {
    let (endpoints, _) = pods();
    let set = endpoints.snapshot();
    assert_eq!(named(&set, "10.0.0.1:8000"), Ok("default/a".into()));
    assert_eq!(named(&set, "10.0.0.2:8001"), Ok("default/c".into()));
    assert_eq!(named(&set, "10.0.0.2:9999"), Err("none"));
    assert_eq!(named(&set, "10.0.0.1"), Ok("default/a".into()));
    assert_eq!(named(&set, "10.0.0.2"), Err("several"), "b and c");
    assert_eq!(named(&set, "10.9.9.9"), Err("none"));
    assert_eq!(named(&set, "b"), Ok("default/b".into()));
    assert_eq!(named(&set, "a"), Err("several"), "in two namespaces");
    assert_eq!(named(&set, "other/a"), Ok("other/a".into()));
    assert_eq!(named(&set, "default/a"), Ok("default/a".into()));
    assert_eq!(named(&set, "nobody"), Err("none"));
    assert_eq!(named(&set, ""), Err("none"));
}

fn message(topic: &str, seq: u64, payload: Vec<u8>) -> Message {
    Message {
        topic: topic.as_bytes().to_vec(),
        seq,
        payload,
    }
}

fn outcome(metrics: &RouterMetrics, o: SharedOutcome) -> u64 {
    metrics.engine.shared.with_label_values(&[o.as_str()]).get()
}

fn view(endpoints: &Endpoints, namespace: &str, name: &str) -> (usize, bool) {
    let set = endpoints.snapshot();
    let e = set
        .all()
        .iter()
        .find(|e| e.spec.id.namespace == namespace && e.spec.id.name == name)
        .unwrap();
    let v = e.engine.as_ref().expect("every pod has a view");
    (v.blocks(), v.is_live())
}

fn stream(metrics: &RouterMetrics, pod: &str, kind: &str) -> u64 {
    metrics
        .engine
        .stream
        .with_label_values(&[pod, "default", kind])
        .get()
}

#[test]
fn messages_feed_the_view_of_the_pod_their_topic_names() {
    let (endpoints, metrics) = pods();
    let mut streams = Streams::new(endpoints.clone(), metrics.engine.clone(), Limits::default());
    assert_eq!(view(&endpoints, "default", "a"), (0, false));

    streams.on_message(message("kv@10.0.0.1:8000@m", 0, stored()));
    assert_eq!(
        view(&endpoints, "default", "a"),
        (2, true),
        "live on its first batch"
    );
    assert_eq!(view(&endpoints, "default", "b"), (0, false));
    assert_eq!(outcome(&metrics, SharedOutcome::Routed), 1);
    let connected = metrics
        .engine
        .connected
        .with_label_values(&["a", "default"])
        .get();
    assert_eq!(connected, 1);

    // By name, and an IP one pod has.
    streams.on_message(message("kv@b@m", 0, stored()));
    assert_eq!(view(&endpoints, "default", "b"), (2, true));
    streams.on_message(message("kv@10.0.0.3@m", 0, stored()));
    assert_eq!(view(&endpoints, "other", "a"), (2, true));

    // Dropped and counted: no pod, several, one with its own publisher.
    for topic in ["kv@10.9.9.9@m", "kv@10.9.9.9@m", "kv@nobody@m"] {
        streams.on_message(message(topic, 0, stored()));
    }
    assert_eq!(outcome(&metrics, SharedOutcome::UnknownPod), 3);
    assert_eq!(streams.warned.len(), 2, "logged once per pod identifier");
    streams.on_message(message("kv@10.0.0.2@m", 0, stored()));
    assert_eq!(outcome(&metrics, SharedOutcome::AmbiguousPod), 1);
    assert_eq!(view(&endpoints, "default", "c"), (0, false));
    streams.on_message(message("kv@own@m", 0, stored()));
    assert_eq!(outcome(&metrics, SharedOutcome::OwnPublisher), 1);
    assert_eq!(view(&endpoints, "default", "own"), (0, false));

    // Garbage: counted on the pod's stream, the view kept.
    streams.on_message(message("kv@10.0.0.1:8000@m", 1, b"\xc1garbage".to_vec()));
    streams.tick();
    assert_eq!(stream(&metrics, "a", "decode_error"), 1);
    assert_eq!(view(&endpoints, "default", "a"), (2, true));

    streams.refused(&Refusal::Frames(2));
    streams.refused(&Refusal::Topic(b"x".to_vec()));
    assert_eq!(outcome(&metrics, SharedOutcome::Malformed), 1);
    assert_eq!(outcome(&metrics, SharedOutcome::WrongTopic), 1);
}

#[test]
fn each_pods_sequence_is_followed_without_replay() {
    let (endpoints, metrics) = pods();
    let mut streams = Streams::new(endpoints.clone(), metrics.engine.clone(), Limits::default());
    let a = "kv@10.0.0.1:8000@m";
    streams.on_message(message(a, 5, stored()));
    streams.on_message(message(a, 6, stored()));
    // b's numbers are its own.
    streams.on_message(message("kv@b@m", 0, stored()));
    streams.tick();
    assert_eq!(stream(&metrics, "a", "applied"), 2);
    assert_eq!(stream(&metrics, "a", "reset"), 0);

    // A gap: nothing to replay it from, the view starts over from the batch after it.
    streams.on_message(message(a, 9, stored()));
    streams.tick();
    assert_eq!(stream(&metrics, "a", "gap"), 1);
    assert_eq!(stream(&metrics, "a", "reset"), 1);
    assert_eq!(view(&endpoints, "default", "a"), (2, true));

    // The sequence goes back: a restarted engine.
    streams.on_message(message(a, 0, stored()));
    streams.tick();
    assert_eq!(stream(&metrics, "a", "reset"), 2);
    assert_eq!(stream(&metrics, "b", "reset"), 0);
}

#[test]
fn a_pod_that_leaves_ends_its_stream_and_one_that_comes_is_found() {
    let (endpoints, metrics) = pods();
    let mut streams = Streams::new(endpoints.clone(), metrics.engine.clone(), Limits::default());
    streams.on_message(message("kv@new@m", 0, stored()));
    assert_eq!(outcome(&metrics, SharedOutcome::UnknownPod), 1);
    streams.on_message(message("kv@b@m", 0, stored()));
    assert_eq!(streams.lanes.len(), 1);

    endpoints.apply(PodUpdate::Reset(vec![spec(
        "default",
        "new",
        "10.0.0.9:8000",
    )]));
    streams.tick();
    assert!(streams.lanes.is_empty(), "b left");
    streams.on_message(message("kv@new@m", 0, stored()));
    assert_eq!(outcome(&metrics, SharedOutcome::Routed), 2);
    assert_eq!(view(&endpoints, "default", "new"), (2, true));
}
