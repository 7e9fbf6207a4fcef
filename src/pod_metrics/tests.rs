use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::endpoints::Endpoints;
use crate::metrics::RouterMetrics;
use crate::prefix_index::PodSlot;

const VLLM: &str = r#"# HELP vllm:num_requests_running Requests running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc 0.25
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4
vllm:time_to_first_token_seconds_sum 0.8
vllm:time_to_first_token_seconds_count 4
"#;

#[test]
fn parses_vllm_names_last_series_wins_missing_is_reported() {
    let m = parse(VLLM).unwrap();
    assert_eq!(m.running, 3.0);
    assert_eq!(m.waiting, 2.0);
    assert_eq!(m.kv_usage, 0.25);
    assert_eq!(m.ttft, Totals { sum: 0.8, count: 4 });
    assert_eq!(m.tpot, Totals::default());
    assert_eq!(m.missing.iter().collect::<Vec<_>>(), [Signal::Tpot]);
}

/// A queue or a usage that is not a number is missing, not a value: the pick adds and compares
/// queues (a NaN queue on every pod left it no least-loaded pod).
#[test]
fn a_sample_that_is_not_a_number_is_missing() {
    let text = VLLM
        .replace(
            "vllm:num_requests_waiting 2",
            "vllm:num_requests_waiting NaN",
        )
        .replace(
            "vllm:kv_cache_usage_perc 0.25",
            "vllm:kv_cache_usage_perc +Inf",
        );
    let m = parse(&text).unwrap();
    assert_eq!((m.waiting, m.kv_usage, m.running), (0.0, 0.0, 3.0));
    assert_eq!(
        m.missing.iter().collect::<Vec<_>>(),
        [Signal::Waiting, Signal::KvCacheUsage, Signal::Tpot]
    );
}

/// SGLang's names (`--enable-metrics`), as its exposition spells them: every signal is read.
#[test]
fn parses_sglang_names() {
    let text = "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 7\n\
        # TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 3\n\
        # TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n\
        # TYPE sglang:time_to_first_token_seconds histogram\n\
        sglang:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n\
        sglang:time_to_first_token_seconds_sum{model_name=\"m\"} 0.4\n\
        sglang:time_to_first_token_seconds_count{model_name=\"m\"} 2\n\
        # TYPE sglang:inter_token_latency_seconds histogram\n\
        sglang:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 10\n\
        sglang:inter_token_latency_seconds_sum{model_name=\"m\"} 0.2\n\
        sglang:inter_token_latency_seconds_count{model_name=\"m\"} 10\n";
    let m = parse(text).unwrap();
    assert_eq!((m.waiting, m.running, m.kv_usage), (7.0, 3.0, 0.5));
    assert_eq!(m.ttft, Totals { sum: 0.4, count: 2 });
    assert_eq!(
        m.tpot,
        Totals {
            sum: 0.2,
            count: 10
        }
    );
    assert!(m.missing.is_empty());
    // Older SGLang named TPOT time_per_output_token_seconds.
    let old = text.replace("inter_token_latency", "time_per_output_token");
    assert_eq!(
        parse(&old).unwrap().tpot,
        Totals {
            sum: 0.2,
            count: 10
        }
    );
}

/// Triton's one family for several signals, told apart by a label (GIE's documented flags).
const TRITON: &str = "# TYPE nv_trt_llm_request_metrics gauge\n\
    nv_trt_llm_request_metrics{model=\"m\",request_type=\"waiting\"} 4\n\
    nv_trt_llm_request_metrics{model=\"m\",request_type=\"scheduled\"} 9\n\
    nv_trt_llm_request_metrics{model=\"m\",request_type=\"context\"} 1\n\
    # TYPE nv_trt_llm_kv_cache_block_metrics gauge\n\
    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"m\"} 0.75\n\
    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"m\"} 4096\n";

fn names(yaml: &str) -> SignalSpecs {
    serde_yaml_ng::from_str::<names::EngineMetricNames>(yaml)
        .unwrap()
        .resolve()
}

#[test]
fn configured_specs_select_series_by_label() {
    let n = names(
        "{totalQueuedRequests: 'nv_trt_llm_request_metrics{request_type=waiting}', \
         totalRunningRequests: 'nv_trt_llm_request_metrics{request_type=\"scheduled\"}', \
         kvCacheUsagePercentage: '\"nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}\"', \
         timeToFirstToken: '', timePerOutputToken: ''}",
    );
    let m = parse_with(TRITON, &n).unwrap();
    assert_eq!((m.waiting, m.running, m.kv_usage), (4.0, 9.0, 0.75));
    // Signals turned off are 0 and never missing.
    assert!(m.missing.is_empty(), "{:?}", m.missing);
    // By the built-in names, Triton exports none of the five.
    assert_eq!(parse(TRITON).unwrap().missing.iter().count(), 5);
    // A configured name replaces the built-in ones (no fallback to vLLM's).
    let n = names("{totalQueuedRequests: my_queue}");
    let m = parse_with(VLLM, &n).unwrap();
    assert_eq!(m.waiting, 0.0);
    assert_eq!(m.running, 3.0);
    assert_eq!(
        m.missing.iter().collect::<Vec<_>>(),
        [Signal::Waiting, Signal::Tpot]
    );
    assert_eq!(n.describe(Signal::Waiting), "my_queue");
    assert_eq!(
        n.describe(Signal::KvCacheUsage),
        "vllm:kv_cache_usage_perc, sglang:token_usage or vllm:gpu_cache_usage_perc"
    );
}

#[test]
fn metric_specs_follow_gie_syntax_and_errors_name_the_spec() {
    use names::{MetricSource, MetricSpec};
    let s = MetricSpec::parse(" a:b_c{ x = 1 , y=\"two\" } ").unwrap();
    assert_eq!(s.name, "a:b_c");
    assert_eq!(
        s.labels,
        [("x".into(), "1".into()), ("y".into(), "two".into())]
    );
    assert_eq!(s.to_string(), "a:b_c{x=1,y=two}");
    assert_eq!(MetricSource::parse("").unwrap(), MetricSource::Off);
    assert_eq!(MetricSource::parse("\"\"").unwrap(), MetricSource::Off);
    for (bad, why) in [
        ("a{x=1", "the label block must end the spec with '}'"),
        ("a}", "'}' without '{'"),
        ("a{}", "an empty label block"),
        ("a{x}", "labels are written label=value"),
        ("a{=1}", "labels are written label=value"),
        ("9a", "not a Prometheus metric name"),
        ("a b", "not a Prometheus metric name"),
    ] {
        let e = MetricSpec::parse(bad).unwrap_err();
        assert_eq!(e.to_string(), format!("metric spec {bad:?}: {why}"));
    }
    let e = serde_yaml_ng::from_str::<names::EngineMetricNames>("{totalQueuedRequests: 'a{'}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("metric spec \"a{\""), "{e}");
    let e = serde_yaml_ng::from_str::<names::EngineMetricNames>("{queued: a}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `queued`"), "{e}");
}

#[test]
fn a_missing_signal_keeps_its_last_value_and_is_warned_about_once_per_pod() {
    let first = parse(VLLM).unwrap();
    let without_kv = VLLM.replace("vllm:kv_cache_usage_perc", "something_else");
    let second = parse(&without_kv).unwrap().or_previous(&first);
    assert!(second.missing.contains(Signal::KvCacheUsage));
    assert_eq!(second.kv_usage, 0.25, "kept, not read as 0");
    assert_eq!(second.running, 3.0);
    let mut warned = MissingWarnings::default();
    let (a, b) = (PodSlot(0), PodSlot(1));
    let new: Vec<Signal> = warned.first_seen(a, second.missing).iter().collect();
    assert_eq!(new, [Signal::KvCacheUsage, Signal::Tpot]);
    assert!(warned.first_seen(a, second.missing).is_empty());
    assert_eq!(warned.first_seen(b, second.missing).iter().count(), 2);
    warned.retain(|slot| slot == b);
    assert_eq!(warned.first_seen(a, second.missing).iter().count(), 2);
}

#[test]
fn parses_older_vllm_names_and_prefers_the_current_ones() {
    let old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.4\n\
        # TYPE vllm:time_per_output_token_seconds histogram\n\
        vllm:time_per_output_token_seconds_bucket{le=\"+Inf\"} 5\n\
        vllm:time_per_output_token_seconds_sum 0.1\n\
        vllm:time_per_output_token_seconds_count 5\n";
    let m = parse(old).unwrap();
    assert_eq!(m.kv_usage, 0.4);
    assert_eq!(m.tpot, Totals { sum: 0.1, count: 5 });
    let both =
        format!("{old}# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.7\n");
    assert_eq!(parse(&both).unwrap().kv_usage, 0.7);
}

#[test]
fn reads_the_engine_start_time() {
    assert_eq!(parse(VLLM).unwrap().start_time, None);
    let text = format!(
        "{VLLM}# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.71234567825e+09\n"
    );
    let m = parse(&text).unwrap();
    assert_eq!(m.start_time, Some(1_712_345_678.25));
    assert_eq!(start_generation(1_712_345_678.25), "started-1712345678.25");
}

/// A vLLM engine's whole `/metrics`, written in the shape of vLLM 0.10's exposition (its
/// families, label sets and bucket bounds, Python's process and GC collectors, the HTTP
/// instrumentator's; not captured from a running engine): the signals read from it are the
/// whole text's, and the families nobody reads are skipped, not parsed.
#[test]
fn a_whole_vllm_exposition_reads_the_same_with_unread_families_skipped() {
    let text = include_str!("testdata/vllm-metrics.txt");
    let builtin = SignalSpecs::default();
    let whole = parse_whole_with(text, &builtin).unwrap();
    assert_eq!(parse_with(text, &builtin).unwrap(), whole);
    assert_eq!(
        (whole.waiting, whole.running, whole.kv_usage),
        (3.0, 12.0, 0.4125)
    );
    assert_eq!(whole.kv_capacity_tokens, Some(27_145 * 16));
    assert_eq!(whole.prefix_caching, Some(true));
    let off = text.replace(
        "enable_prefix_caching=\"True\"",
        "enable_prefix_caching=\"False\"",
    );
    assert_eq!(
        parse_with(&off, &builtin).unwrap().prefix_caching,
        Some(false)
    );
    assert_eq!(whole.start_time, Some(1.76498112e9));
    assert!(whole.missing.is_empty());
    assert!(whole.ttft.count > 0 && whole.tpot.count > 0, "{whole:?}");
    let kept = wanted(&builtin).keep(text);
    assert!(
        kept.len() * 4 < text.len(),
        "{} of {}",
        kept.len(),
        text.len()
    );
    for unread in [
        "vllm:e2e_request_latency_seconds",
        "vllm:request_prompt_tokens",
        "vllm:prompt_tokens_total",
        "http_request_duration_highr_seconds",
        "python_gc_objects_collected_total",
    ] {
        assert!(!kept.contains(unread), "{unread} was kept");
    }
    for family in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:num_requests_waiting",
        "vllm:cache_config_info",
    ] {
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(family)).collect();
        assert!(lines.len() > 2, "{family}");
        assert!(
            lines.iter().all(|l| kept.lines().any(|k| k == *l)),
            "{family}"
        );
    }
    // A text of unread families only reads as the whole text does: every signal missing.
    assert_eq!(
        parse_with(TRITON, &builtin).unwrap(),
        parse_whole_with(TRITON, &builtin).unwrap()
    );
    assert!(parse("").is_err() && parse_whole_with("", &builtin).is_err());
    // Configured names: the filter keeps the configured family instead.
    let configured = names("{totalQueuedRequests: process_open_fds}");
    let read = parse_with(text, &configured).unwrap();
    assert_eq!(read, parse_whole_with(text, &configured).unwrap());
    assert_eq!(read.waiting, 211.0);
}

#[test]
fn garbage_is_an_error() {
    assert!(parse("this is { not metrics").is_err());
}

#[test]
fn period_means() {
    let t = |sum, count| Totals { sum, count };
    assert_eq!(period_mean(None, t(0.8, 4), 0.0), 0.2);
    assert_eq!(period_mean(Some(t(0.8, 4)), t(1.8, 6), 0.2), 0.5);
    assert_eq!(period_mean(Some(t(0.8, 4)), t(0.8, 4), 0.2), 0.2);
    assert_eq!(period_mean(Some(t(0.8, 4)), t(0.3, 1), 0.2), 0.3);
    assert_eq!(period_mean(None, t(0.0, 0), 0.0), 0.0);
}

/// The scrape loop against an engine that stops exporting KV usage: the signal is counted at
/// every scrape and keeps its value.
#[tokio::test]
async fn the_scrape_counts_a_missing_signal_and_keeps_its_value() {
    use crate::endpoints::Update;
    use crate::prefix_index::PrefixIndex;

    let text = Arc::new(parking_lot::Mutex::new(VLLM.to_string()));
    let served = text.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = served.lock().clone();
            async move { body }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let registry = Registry::new();
    let metrics = RouterMetrics::register(&registry);
    let endpoints = Arc::new(Endpoints::new(
        Arc::new(PrefixIndex::new(10)),
        metrics.clone(),
    ));
    endpoints.apply(Update::Reset(vec![crate::testing::spec(
        "engine",
        address.port(),
        &[],
    )]));
    let scrape_metrics = ScrapeMetrics::register(&registry);
    let missing = |s: Signal| {
        scrape_metrics
            .missing
            .with_label_values(&[s.as_str()])
            .get()
    };
    let config = ScrapeConfig {
        interval: Duration::from_millis(10),
        timeout: Duration::from_secs(2),
        concurrency: 1,
        budget: None,
        names: SignalSpecs::default(),
    };
    let (first_round, mut scraped) = watch::channel(false);
    let token = CancellationToken::new();
    tokio::spawn(run(
        endpoints.clone(),
        metrics,
        scrape_metrics.clone(),
        config,
        first_round,
        token.clone(),
    ));
    scraped.wait_for(|done| *done).await.unwrap();
    let pod = endpoints.snapshot().all()[0].clone();
    assert_eq!((pod.stats().kv_usage, pod.stats().running), (0.25, 3.0));
    assert_eq!(missing(Signal::KvCacheUsage), 0);
    assert!(missing(Signal::Tpot) >= 1, "VLLM has no TPOT histogram");

    *text.lock() = VLLM
        .replace("vllm:kv_cache_usage_perc", "something_else")
        .replace(
            "vllm:num_requests_running{model_name=\"b\"} 3",
            "vllm:num_requests_running{model_name=\"b\"} 5",
        );
    tokio::time::timeout(Duration::from_secs(10), async {
        while missing(Signal::KvCacheUsage) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the missing signal counted at every scrape");
    assert_eq!(pod.stats().running, 5.0, "the other signals are read");
    assert_eq!(pod.stats().kv_usage, 0.25, "kept, not read as 0");
    token.cancel();
}

/// An engine that reports more KV cache than any pod has sizes its budget to the ceiling, not
/// to its word: the index's memory stays bounded whatever an engine exports.
#[test]
fn an_engine_budget_is_clamped_to_the_ceiling() {
    use crate::endpoints::Update;
    use crate::prefix_index::PrefixIndex;
    use crate::scheduler::affinity::AffinityConfig;
    use scraper::{MAX_ENGINE_BUDGET_ENTRIES, apply_budget};

    let registry = Registry::new();
    let metrics = RouterMetrics::register(&registry);
    let endpoints = Endpoints::new(Arc::new(PrefixIndex::new(10)), metrics.clone());
    endpoints.apply(Update::Reset(vec![crate::testing::spec(
        "engine",
        8000,
        &[],
    )]));
    let pod = endpoints.snapshot().all()[0].clone();
    let budget = EngineBudget {
        affinity: AffinityConfig::default(),
        block_bytes: 128,
    };
    let budget_of = || {
        metrics
            .pod_budget
            .with_label_values(&["engine", "default"])
            .get()
    };
    // `num_gpu_blocks="1000000000000"` x 16 tokens.
    apply_budget(&endpoints, &metrics, &pod, budget, 16_000_000_000_000);
    assert_eq!(budget_of(), MAX_ENGINE_BUDGET_ENTRIES as i64);
    assert_eq!(
        endpoints.index().pod_capacity(pod.index.slot()),
        MAX_ENGINE_BUDGET_ENTRIES
    );
    // An engine's real size is followed.
    apply_budget(&endpoints, &metrics, &pod, budget, 65_536);
    let expected = AffinityConfig::default().budget_entries(65_536, 128);
    assert_eq!(budget_of(), expected as i64);
}

#[test]
fn served_models_are_the_ids_of_v1_models() {
    let body = br#"{"object":"list","data":[{"id":"llama","object":"model"},{"id":"sql-lora","root":"x"}]}"#;
    assert_eq!(scraper::served_models(body).unwrap(), ["llama", "sql-lora"]);
    assert_eq!(
        scraper::served_models(br#"{"object":"list"}"#).unwrap(),
        [] as [String; 0]
    );
    assert!(scraper::served_models(b"not json").is_err());
}

/// lora-affinity's input: each pod's `GET /v1/models`, fetched by the scrape only while the
/// filter is on; a failed fetch keeps the previous list (Kthena's `updatePodModels`).
#[tokio::test]
async fn the_scrape_fetches_served_models_while_asked_and_keeps_them_on_failure() {
    use crate::endpoints::Update;
    use crate::prefix_index::PrefixIndex;
    use crate::scheduler::Candidate;

    // None: /v1/models answers 500.
    let listing = Arc::new(parking_lot::Mutex::new(Some(
        r#"{"data":[{"id":"base"},{"id":"sql-lora"}]}"#,
    )));
    let served = listing.clone();
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(|| async { VLLM }))
        .route(
            "/v1/models",
            axum::routing::get(move || {
                let body = *served.lock();
                async move {
                    match body {
                        Some(b) => (axum::http::StatusCode::OK, b),
                        None => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, ""),
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let registry = Registry::new();
    let metrics = RouterMetrics::register(&registry);
    let endpoints = Arc::new(Endpoints::new(
        Arc::new(PrefixIndex::new(10)),
        metrics.clone(),
    ));
    endpoints.apply(Update::Reset(vec![crate::testing::spec(
        "engine",
        address.port(),
        &[],
    )]));
    let config = ScrapeConfig {
        interval: Duration::from_millis(10),
        timeout: Duration::from_secs(2),
        concurrency: 1,
        budget: None,
        names: SignalSpecs::default(),
    };
    let (first_round, mut scraped) = watch::channel(false);
    let token = CancellationToken::new();
    tokio::spawn(run(
        endpoints.clone(),
        metrics,
        ScrapeMetrics::register(&registry),
        config,
        first_round,
        token.clone(),
    ));
    scraped.wait_for(|done| *done).await.unwrap();
    let pod = endpoints.snapshot().all()[0].clone();
    assert_eq!(pod.served_models(), None, "not fetched unless asked");
    assert!(!pod.serves_model("base"));

    endpoints.set_fetch_served_models(true);
    let listed = || async {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !pod.serves_model("sql-lora") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    };
    listed().await.expect("the listing is fetched once asked");
    assert!(pod.serves_model("base") && !pod.serves_model("other"));

    // A failing /v1/models keeps the list: wait for a later scrape round to have run.
    *listing.lock() = None;
    let failing_since = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), async {
        while pod.stats_age().unwrap() >= failing_since.elapsed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("another round scraped");
    assert_eq!(
        pod.served_models().unwrap(),
        ["base", "sql-lora"],
        "kept on failure"
    );
    token.cancel();
}

/// lora-affinity-scorer's input: the latest `vllm:lora_requests_info` series (its value is its
/// creation time), as llm-d reads it.
#[test]
fn lora_requests_info_is_read_from_the_latest_series() {
    let text = r#"# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql, chat",waiting_lora_adapters="x"} 1.8e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 0
"#;
    let m = parse(text).unwrap();
    let lora = m.lora.unwrap();
    assert_eq!(lora.running, ["sql", "chat"]);
    assert_eq!(lora.waiting, ["x"]);
    assert_eq!(lora.max, 2);
    assert_eq!(parse(VLLM).unwrap().lora, None, "not exported: none");
}
