//! The precise producer's parameters as llm-d reads them, and what they set in the picker's
//! sections.

use crate::config::Config;
use crate::tokenizer::EngineKind;
use crate::tokenizer::heads::TokenizerSource;

/// The precise pipeline (`deploy/config/epp-precise-prefix-cache-config.yaml`'s plugins) with
/// `extra` producer parameters and `own` prefix-picker sections.
fn doc(parameters: &str, own: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{modelName: m, vllm: {{url: 'http://localhost:8000'}}}}
- type: precise-prefix-cache-producer
  parameters: {parameters}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-scorer, weight: 2}}
{own}"
    )
}

const ENDPOINTS: &str = "endpoints:
- {name: a, address: 10.0.0.1:8000}
- {name: b, address: 10.0.0.2:8000, kvEventsEndpoint: 'tcp://10.0.0.2:6000'}
";

#[test]
fn the_producer_feeds_the_engine_views_and_asks_the_pods_for_tokens() {
    // llm-d's defaults: topic filter kv@, each pod's publisher on 5557 (no replay).
    let c = Config::parse(&doc("{}", ENDPOINTS)).unwrap();
    let p = c.scheduler.epp.as_ref().unwrap();
    assert!(p.precise);
    assert_eq!(c.picker.kv_events.topic_prefix, "kv@");
    assert_eq!(c.picker.kv_events.topic, "");
    let events: Vec<_> = c
        .endpoints
        .iter()
        .map(|e| {
            (
                e.kv_events_endpoint.as_deref(),
                e.kv_events_replay_endpoint.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            (Some("tcp://10.0.0.1:5557"), None),
            (Some("tcp://10.0.0.2:6000"), None),
        ],
        "a pod's own kvEventsEndpoint wins"
    );
    let t = c.picker.tokenizer.as_ref().expect("the engine tokenizer");
    assert_eq!(
        (t.source, t.engine),
        (TokenizerSource::Engine, EngineKind::Vllm)
    );
    assert!(
        c.warnings.iter().any(|w| w.contains("vllm.url")),
        "{:?}",
        c.warnings
    );

    // Its own parameters: another topic filter and ports with a replay socket.
    let c = Config::parse(&doc(
        "{kvEventsConfig: {topicFilter: 'kv@pool', podDiscoveryConfig: {socketPort: 7000, replaySocketPort: 7001}}, tokenProcessorConfig: {blockSize: 64}, indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}",
        ENDPOINTS,
    ))
    .unwrap();
    assert_eq!(c.picker.kv_events.topic_prefix, "kv@pool");
    assert_eq!(
        c.endpoints[0].kv_events_endpoint.as_deref(),
        Some("tcp://10.0.0.1:7000")
    );
    assert_eq!(
        c.endpoints[0].kv_events_replay_endpoint.as_deref(),
        Some("tcp://10.0.0.1:7001")
    );

    // discoverPods: false: only the pods' own publishers; a picker.tokenizer given stays.
    let c = Config::parse(&doc(
        "{kvEventsConfig: {discoverPods: false}}",
        &format!("{ENDPOINTS}picker:\n  tokenizer: {{source: engine, engine: sglang}}\n"),
    ))
    .unwrap();
    assert_eq!(c.endpoints[0].kv_events_endpoint, None);
    assert_eq!(
        c.picker.tokenizer.as_ref().unwrap().engine,
        EngineKind::Sglang
    );

    // Discovered pods: the ports become kvEventsPort / kvEventsReplayPort.
    let c = Config::parse(&doc(
        "{kvEventsConfig: {podDiscoveryConfig: {socketPort: 5557, replaySocketPort: 5558}}}",
        "discovery:\n  kubernetes: {namespace: llm, inferencePool: pool}\n",
    ))
    .unwrap();
    let k = c.discovery.kubernetes.as_ref().unwrap();
    assert_eq!(
        (k.kv_events_port, k.kv_events_replay_port),
        (Some(5557), Some(5558))
    );
}

#[test]
fn without_a_consumer_naming_it_the_match_stays_the_estimate() {
    let text = doc("{}", ENDPOINTS).replace(
        "  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}\n",
        "",
    );
    let c = Config::parse(&text).unwrap();
    assert!(!c.scheduler.epp.as_ref().unwrap().precise);
    assert_eq!(c.picker.kv_events.topic_prefix, "");
    assert_eq!(c.endpoints[0].kv_events_endpoint, None);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("no plugin names this precise-prefix-cache-producer")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn what_does_not_map_is_refused_naming_it() {
    for (parameters, says) in [
        (
            "{indexerConfig: {tokenizersPoolConfig: {}}}",
            "tokenizersPoolConfig is not supported",
        ),
        (
            "{indexerConfig: {kvBlockIndexConfig: {redisConfig: {address: 'redis:6379'}}}}",
            "redisConfig",
        ),
        ("{kvEventsConfig: {engineType: trtllm}}", "engineType"),
        (
            "{kvEventsConfig: {topicFilters: kv}}",
            "unknown field `topicFilters`",
        ),
        (
            "{kvEventsConfig: {podDiscoveryConfig: {socketPort: 70000}}}",
            "socketPort must be a port",
        ),
        (
            "{tokenProcessorConfig: {hashAlgorithm: md5}}",
            "hashAlgorithm",
        ),
    ] {
        let e = Config::parse(&doc(parameters, ENDPOINTS))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{parameters}: {e}");
        assert!(e.contains("precise-prefix-cache-producer"), "{e}");
    }
    // zmqEndpoint (llm-d's sim configs' global socket) is the shared socket, without a
    // warning; pods' own publishers are then not derived unless discoverPods says so.
    let c = Config::parse(&doc(
        "{kvEventsConfig: {zmqEndpoint: 'tcp://*:5557'}}",
        ENDPOINTS,
    ))
    .unwrap();
    assert!(
        !c.warnings.iter().any(|w| w.contains("zmqEndpoint")),
        "{:?}",
        c.warnings
    );
    let bind = c.picker.kv_events.bind.as_ref().expect("bound");
    assert_eq!(bind.to_string(), "tcp://*:5557");
    assert_eq!(bind.address(), "0.0.0.0:5557".parse().unwrap());
    assert_eq!(c.picker.kv_events.topic_prefix, "kv@");
    assert_eq!(c.endpoints[0].kv_events_endpoint, None, "a engine connects");
    let both = Config::parse(&doc(
        "{kvEventsConfig: {zmqEndpoint: 'tcp://*:5557', discoverPods: true}}",
        ENDPOINTS,
    ))
    .unwrap();
    assert!(both.picker.kv_events.bind.is_some());
    assert!(
        both.endpoints
            .iter()
            .all(|e| e.kv_events_endpoint.is_some())
    );
    // The picker section binds the same, or refuses another.
    let zmq = "{kvEventsConfig: {zmqEndpoint: 'tcp://*:5557'}}";
    let own = |at: &str| format!("{ENDPOINTS}picker: {{kvEvents: {{bind: '{at}'}}}}\n");
    assert!(Config::parse(&doc(zmq, &own("tcp://*:5557"))).is_ok());
    let e = Config::parse(&doc(zmq, &own("tcp://*:6000")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kvEvents.bind tcp://*:6000"), "{e}");
    assert!(e.contains("binds tcp://*:5557"), "{e}");
    // An empty one is unset, as llm-d reads it.
    let c = Config::parse(&doc("{kvEventsConfig: {zmqEndpoint: ''}}", ENDPOINTS)).unwrap();
    assert!(c.picker.kv_events.bind.is_none());
    // A bad one is refused, naming it.
    let e = Config::parse(&doc(
        "{kvEventsConfig: {zmqEndpoint: 'tcp://epp:5557'}}",
        ENDPOINTS,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("kvEventsConfig.zmqEndpoint"), "{e}");
    assert!(e.contains("\"tcp://epp:5557\""), "{e}");

    // A consumer naming a plugin that is not a producer, or none; consumers naming both kinds.
    let e = Config::parse(&doc("{}", ENDPOINTS).replace(
        "prefixMatchInfoProducerName: precise-prefix-cache-producer",
        "prefixMatchInfoProducerName: max-score-picker",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("is a max-score-picker, not a prefix-cache producer"),
        "{e}"
    );
    let e = Config::parse(&doc("{}", ENDPOINTS).replace(
        "prefixMatchInfoProducerName: precise-prefix-cache-producer",
        "prefixMatchInfoProducerName: nowhere",
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"nowhere\" names no plugin"), "{e}");
    let both = doc("{}", ENDPOINTS).replace(
        "- type: max-score-picker\n",
        "- type: max-score-picker\n- type: approx-prefix-cache-producer\n- type: no-hit-lru-scorer\n  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}\n",
    );
    let e = Config::parse(&both).unwrap_err().to_string();
    assert!(e.contains("name one producer"), "{e}");
}

/// The deprecated `precise-prefix-cache-scorer` (llm-d's wrapper): a prefix-cache-scorer over
/// its own precise producer, whose `tokenizersPoolConfig` tokenizes prompts; beside a
/// configured producer it reads that one and its own parameters are ignored.
#[test]
fn the_deprecated_precise_scorer_is_its_producer_and_a_prefix_cache_scorer() {
    use crate::scheduler::epp::PREFIX_DEFAULT;
    let wrapper = "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {blockSize: 64, hashSeed: '42'}
    kvEventsConfig: {topicFilter: kv, podDiscoveryConfig: {socketPort: 5557}}
    indexerConfig:
      kvBlockIndexConfig: {enableMetrics: true, metricsLoggingInterval: 60000000000}
      tokenizersPoolConfig: {modelName: m}
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: precise-prefix-cache-scorer, weight: 3}
  - {pluginRef: queue-scorer, weight: 1}
";
    let c = Config::parse(&format!("{wrapper}{ENDPOINTS}")).unwrap();
    let p = c.scheduler.epp.as_ref().unwrap();
    assert!(p.precise);
    assert_eq!(
        (
            p.scorers[0].name.as_str(),
            &p.scorers[0].kind,
            p.scorers[0].weight
        ),
        ("precise-prefix-cache-scorer", &PREFIX_DEFAULT, 3.0)
    );
    assert_eq!(c.picker.kv_events.topic_prefix, "kv");
    assert_eq!(
        c.endpoints[0].kv_events_endpoint.as_deref(),
        Some("tcp://10.0.0.1:5557")
    );
    assert!(
        c.picker.tokenizer.is_some(),
        "its tokenizer pool: real tokens"
    );
    assert!(
        c.warnings.iter().any(|w| w.contains("DEPRECATION")),
        "{:?}",
        c.warnings
    );

    // Beside a producer: the producer's settings, the wrapper's ignored (warned).
    let both = wrapper.replace(
        "- type: queue-scorer\n",
        "- type: queue-scorer\n- type: precise-prefix-cache-producer\n  parameters: {kvEventsConfig: {topicFilter: 'kv@x'}}\n",
    );
    let c = Config::parse(&format!("{both}{ENDPOINTS}")).unwrap();
    assert_eq!(c.picker.kv_events.topic_prefix, "kv@x");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("its own parameters are ignored")),
        "{:?}",
        c.warnings
    );
}
