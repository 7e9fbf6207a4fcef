//! `prefix-bench` as a process: a quick suite end to end (model-sims, the picker and Envoy, every
//! router) and the overhead baseline's no-op processor. The suite starts `model-sim` and
//! `prefix-picker` from the binaries next to its own, which `cargo test --workspace` builds.

use std::process::Command;

#[test]
fn benchmark_quick_suite_writes_a_report_where_the_shipped_config_beats_round_robin() {
    // The suite starts these from the directory of its own binary; fail here, clearly, if they
    // were not built.
    testkit::workspace_bin("model-sim");
    testkit::workspace_bin("prefix-picker");
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_prefix-bench"))
        // Two workloads (an old and a new one) keep the test short; every router runs.
        .args([
            "suite",
            "--quick",
            "--workloads",
            "shared-prefix,agent",
            "--out",
        ])
        .arg(out.path())
        .env("PREFIX_PICKER_ROOT", testkit::workspace_root())
        .env("ENVOY_BIN", testkit::envoy_bin())
        .env_remove("SGLANG_ROUTER_PYTHON")
        .env_remove("VLLM_ROUTER_BIN")
        .env_remove("SMG_BIN")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let suite =
        prefix_bench::suite_results::SuiteResults::read(&out.path().join("suite-quick.json"))
            .unwrap();
    // Two workloads were asked for, and the trace is not among them: nothing skipped.
    assert!(suite.skipped.is_empty() && suite.config.is_none());
    let results = suite.runs;
    let routers: std::collections::BTreeSet<&str> =
        results.iter().map(|r| r.router.as_str()).collect();
    let workloads: std::collections::BTreeSet<&str> =
        results.iter().map(|r| r.workload.as_str()).collect();
    // Round robin, prefix-cache only, Kthena, llm-d's default EndpointPickerConfig, Kthena with
    // kvcache-aware (kv-relay + Redis), the shipped config, the oracle and the load-capped
    // oracle; one run each. Plus the engine-events rows (the `engine` and the `file` tokenizer).
    let events = prefix_bench::report::SHIPPED_ENGINE_EVENTS;
    assert_eq!(
        routers.iter().filter(|r| !r.starts_with(events)).count(),
        8,
        "{routers:?}"
    );
    assert!(routers.contains(prefix_bench::report::KVCACHE_AWARE));
    assert!(routers.contains(prefix_bench::rows::ENDPOINT_PICKER_ROW));
    assert_eq!(
        routers.iter().filter(|r| r.starts_with(events)).count(),
        2,
        "{routers:?}"
    );
    assert!(routers.contains(prefix_bench::report::SHIPPED));
    assert_eq!(
        routers.iter().filter(|r| r.starts_with("oracle")).count(),
        2,
        "{routers:?}"
    );
    for r in results
        .iter()
        .filter(|r| r.router.starts_with("oracle, max/mean"))
    {
        // The capped oracle keeps its load allowance (or the balanced placement's, if higher).
        assert!(
            r.max_over_mean <= 1.3 + 1e-9,
            "{}: {}",
            r.workload,
            r.max_over_mean
        );
        assert!(r.pods_per_group >= 1.0, "{}", r.workload);
    }
    assert_eq!(workloads.len(), 2, "{workloads:?}");
    assert_eq!(results.len(), routers.len() * workloads.len());
    for r in &results {
        assert_eq!(r.errors, 0, "{} / {}", r.workload, r.router);
        assert!(r.requests > 0 && r.requests_per_s > 0.0);
        assert!((0.0..=1.0).contains(&r.hit_rate) && (0.0..=1.0).contains(&r.ceiling_hit_rate));
        assert!(
            r.hit_rate <= r.ceiling_hit_rate + 1e-9,
            "{} / {}: above the ceiling",
            r.workload,
            r.router
        );
        assert_eq!(r.pod_share.values().sum::<usize>(), r.requests);
    }
    // What the suite is for: on shared prefixes the shipped config keeps each group on one pod
    // and beats round robin, which sends each group's first request to every pod. Measured on
    // this quick workload (three runs, debug build, 2026-12-05): shipped 81.3% (the ceiling) each
    // time, round robin 49.4-50.8%; the margin asked is half that gap.
    let hit_rate = |router: &str| {
        results
            .iter()
            .find(|r| r.workload.starts_with("shared-prefix ") && r.router == router)
            .unwrap_or_else(|| panic!("no shared-prefix row for {router}"))
            .hit_rate
    };
    let shipped = hit_rate(prefix_bench::report::SHIPPED);
    let round_robin = hit_rate("envoy round-robin");
    assert!(
        shipped >= round_robin + 0.15,
        "shared-prefix: shipped {shipped:.3} vs round robin {round_robin:.3}"
    );
    let md = std::fs::read_to_string(out.path().join("suite-quick.md")).unwrap();
    assert_eq!(md.matches("| router |").count(), workloads.len());
    // The summary: its header and one line per workload.
    let summary = std::fs::read_to_string(out.path().join("suite-quick-summary.md")).unwrap();
    let lines: Vec<&str> = summary.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(lines.len(), 1 + workloads.len(), "{summary}");
    assert!(
        lines.iter().any(|l| l.starts_with("| shared-prefix |")),
        "{summary}"
    );
}

/// `prefix-bench suite` with `args`, from the workspace root; its exit status and stderr.
fn suite_fails(args: &[&str]) -> String {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_prefix-bench"))
        .arg("suite")
        .args(args)
        .arg("--out")
        .arg(out.path())
        .env("PREFIX_PICKER_ROOT", testkit::workspace_root())
        .output()
        .unwrap();
    assert!(!run.status.success(), "{args:?} ran");
    // It stopped before it wrote anything.
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    String::from_utf8(run.stderr).unwrap()
}

#[test]
fn suite_says_which_workload_it_skips_and_how_to_get_its_file() {
    let stderr = suite_fails(&[
        "--quick",
        "--workloads",
        "trace",
        "--trace",
        "/nonexistent/synthetic_trace.jsonl",
    ]);
    assert!(
        stderr.contains(
            "skipping workload trace: the trace file /nonexistent/synthetic_trace.jsonl is missing"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("kvcache-ai/Mooncake"), "{stderr}");
    assert!(
        stderr.contains("every selected workload was skipped"),
        "{stderr}"
    );
}

#[test]
fn suite_refuses_a_config_that_does_not_validate_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("my-picker.yaml");
    std::fs::write(&bad, "picker:\n  affinity: {tentativ: true}\n").unwrap();
    let stderr = suite_fails(&[
        "--quick",
        "--workloads",
        "shared-prefix",
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains(&format!(
            "the picker config {} does not validate",
            bad.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("tentativ"), "{stderr}");
}

/// The overhead baseline's processor, as `prefix-bench overhead` starts it: each phase gets its
/// own empty reply, in order, on one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noop_ext_proc_answers_each_phase_with_an_empty_reply() {
    use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
    use ep::processing_request::Request as In;
    use ep::processing_response::Response as Out;

    let dir = tempfile::tempdir().unwrap();
    let noop = testkit::start_noop_ext_proc(
        std::path::Path::new(env!("CARGO_BIN_EXE_prefix-bench")),
        dir.path(),
    )
    .unwrap();
    let mut client = ep::external_processor_client::ExternalProcessorClient::connect(format!(
        "http://{}",
        noop.addr
    ))
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let message = |r: In| ep::ProcessingRequest {
        request: Some(r),
        ..ep::ProcessingRequest::default()
    };
    tx.send(message(In::RequestHeaders(ep::HttpHeaders::default())))
        .await
        .unwrap();
    let reply = replies.message().await.unwrap().unwrap();
    assert_eq!(
        reply.response,
        Some(Out::RequestHeaders(ep::HeadersResponse::default()))
    );
    tx.send(message(In::RequestBody(ep::HttpBody {
        body: b"{\"model\":\"m\",\"prompt\":\"x\"}".to_vec(),
        end_of_stream: true,
        ..ep::HttpBody::default()
    })))
    .await
    .unwrap();
    let reply = replies.message().await.unwrap().unwrap();
    assert_eq!(
        reply.response,
        Some(Out::RequestBody(ep::BodyResponse::default()))
    );
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
}

/// The overhead table's routing floor, as `prefix-bench overhead` starts it: the reply that
/// releases a request carries the pick (header and `envoy.lb` metadata, with a route key when
/// the stream will not see the response), and an access-log entry naming that key records the
/// prompt for the pod that served, where the same prompt then goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_floor_routes_a_request_and_records_its_completion() {
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::data::accesslog::v3 as data;
    use envoy_types::pb::envoy::data::accesslog::v3::AccessLogCommon;
    use envoy_types::pb::envoy::service::accesslog::v3 as als;
    use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

    let dir = tempfile::tempdir().unwrap();
    let config = "endpoints:\n\
        - {name: a, address: \"127.0.0.1:8001\"}\n\
        - {name: b, address: \"127.0.0.1:8002\"}\n\
        picker: {affinity: {}}\n";
    let floor = testkit::start_routing_floor(
        std::path::Path::new(env!("CARGO_BIN_EXE_prefix-bench")),
        dir.path(),
        config,
    )
    .unwrap();
    let url = format!("http://{}", floor.addr);
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "m", "prompt": prefix_bench::workload::text(7, 4096), "max_tokens": 1,
    }))
    .unwrap();
    // One request: its pick (`ip:port[,...]`) and its route key.
    let route = || async {
        let mut client =
            ep::external_processor_client::ExternalProcessorClient::connect(url.clone())
                .await
                .unwrap();
        let headers = ep::HttpHeaders {
            headers: Some(core::HeaderMap {
                headers: vec![core::HeaderValue {
                    key: ":path".into(),
                    raw_value: b"/v1/completions".to_vec(),
                    ..core::HeaderValue::default()
                }],
            }),
            ..ep::HttpHeaders::default()
        };
        let messages = vec![
            ep::ProcessingRequest {
                request: Some(ep::processing_request::Request::RequestHeaders(headers)),
                protocol_config: Some(ep::ProtocolConfiguration {
                    request_body_mode: 4,
                    ..ep::ProtocolConfiguration::default()
                }),
                ..ep::ProcessingRequest::default()
            },
            ep::ProcessingRequest {
                request: Some(ep::processing_request::Request::RequestBody(ep::HttpBody {
                    body: body.clone(),
                    end_of_stream: true,
                    ..ep::HttpBody::default()
                })),
                ..ep::ProcessingRequest::default()
            },
        ];
        let mut replies = client
            .process(tokio_stream::iter(messages))
            .await
            .unwrap()
            .into_inner();
        let reply = replies.message().await.unwrap().unwrap();
        let Some(ep::processing_response::Response::RequestHeaders(h)) = reply.response else {
            panic!("not the headers reply: {reply:?}");
        };
        let set = &h.response.unwrap().header_mutation.unwrap().set_headers[0];
        let set = set.header.as_ref().unwrap();
        assert_eq!(set.key, "x-gateway-destination-endpoint");
        let destination = String::from_utf8(set.raw_value.clone()).unwrap();
        let lb = &reply.dynamic_metadata.unwrap().fields["envoy.lb"];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("envoy.lb is not a struct");
        };
        let text = |key: &str| match &lb.fields[key].kind {
            Some(Kind::StringValue(s)) => s.clone(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(text("x-gateway-destination-endpoint"), destination);
        (destination, text("x-prefix-picker-route"))
    };
    let (destination, key) = route().await;
    let primary = destination.split(',').next().unwrap();
    assert!(
        ["127.0.0.1:8001", "127.0.0.1:8002"].contains(&primary),
        "{destination}"
    );
    // Envoy reports another pod served it (a fallback).
    let served: u32 = if primary.ends_with("8001") {
        8002
    } else {
        8001
    };
    let entry = data::HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            metadata: Some(core::Metadata {
                filter_metadata: std::collections::HashMap::from([(
                    "envoy.lb".to_string(),
                    Struct {
                        fields: std::collections::HashMap::from([(
                            "x-prefix-picker-route".to_string(),
                            Value {
                                kind: Some(Kind::StringValue(key)),
                            },
                        )]),
                    },
                )]),
                ..core::Metadata::default()
            }),
            upstream_remote_address: Some(core::Address {
                address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(core::socket_address::PortSpecifier::PortValue(served)),
                    ..core::SocketAddress::default()
                })),
            }),
            ..AccessLogCommon::default()
        }),
        response: Some(data::HttpResponseProperties {
            response_code: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 200 }),
            ..data::HttpResponseProperties::default()
        }),
        ..data::HttpAccessLogEntry::default()
    };
    let message = als::StreamAccessLogsMessage {
        log_entries: Some(als::stream_access_logs_message::LogEntries::HttpLogs(
            als::stream_access_logs_message::HttpAccessLogEntries {
                log_entry: vec![entry],
            },
        )),
        ..als::StreamAccessLogsMessage::default()
    };
    let mut log = als::access_log_service_client::AccessLogServiceClient::connect(url.clone())
        .await
        .unwrap();
    // The service answers once it has read (and applied) every entry of the stream.
    log.stream_access_logs(tokio_stream::iter(vec![message]))
        .await
        .unwrap();
    let (again, _) = route().await;
    assert!(
        again.starts_with(&format!("127.0.0.1:{served}")),
        "{again} (served by {served})"
    );
}
