//! `StreamState` driven message by message, as Envoy would, against a real [`Router`] with
//! static endpoints on 127.0.0.1.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::google::protobuf::ListValue;
use ep::{HttpTrailers, ProtocolConfiguration};
use serde_json::json;

use super::*;
use crate::config::{PickerConfig, SchedulerConfig};
use crate::endpoints::{Endpoint, EndpointSpec, PodId, Update};
use crate::metrics::{PrefixCacheMetrics, RouterMetrics};

// Envoy's BodySendMode values.
pub(crate) const NONE: i32 = 0;
pub(crate) const STREAMED: i32 = 1;
pub(crate) const BUFFERED: i32 = 2;
pub(crate) const BUFFERED_PARTIAL: i32 = 3;
pub(crate) const FULL_DUPLEX: i32 = 4;

pub(crate) const PORTS: [u16; 3] = [18001, 18002, 18003];

// ---------------------------------------------------------------------------------------------
// Router construction
// ---------------------------------------------------------------------------------------------

fn spec(name: &str, port: u16, models: &[&str]) -> EndpointSpec {
    EndpointSpec {
        id: PodId {
            namespace: "default".into(),
            name: name.into(),
        },
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        models: models.iter().map(|m| m.to_string()).collect(),
        generation: String::new(),
        role: None,
    }
}

pub(crate) fn three() -> Vec<EndpointSpec> {
    PORTS
        .iter()
        .enumerate()
        .map(|(i, &p)| spec(&format!("pod-{i}"), p, &[]))
        .collect()
}

/// Assembled as `serve::start` does, with default scheduler config.
pub(crate) fn router_with(picker: PickerConfig, specs: Vec<EndpointSpec>) -> Arc<Router> {
    let router = Router::assemble(
        SchedulerConfig::default(),
        picker,
        PrefixCacheMetrics::unregistered(),
        RouterMetrics::register(&prometheus::Registry::new()),
    );
    router.endpoints.apply(Update::Reset(specs));
    Arc::new(router)
}

pub(crate) fn router() -> Arc<Router> {
    router_with(PickerConfig::default(), three())
}

fn test_selection_router() -> Arc<Router> {
    router_with(
        PickerConfig {
            allow_test_endpoint_selection: true,
            ..PickerConfig::default()
        },
        three(),
    )
}

pub(crate) fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(crate) fn endpoint(router: &Router, a: SocketAddr) -> Arc<Endpoint> {
    router
        .endpoints
        .snapshot()
        .by_address(&a)
        .cloned()
        .expect("known endpoint")
}

pub(crate) fn entries(router: &Router, a: SocketAddr) -> usize {
    router
        .scheduler
        .prefix_cache()
        .index()
        .pod_entries(endpoint(router, a).index.slot())
}

pub(crate) fn total_entries(router: &Router) -> usize {
    router.scheduler.prefix_cache().index().entries()
}

pub(crate) fn inflight(router: &Router) -> Vec<i64> {
    PORTS
        .iter()
        .map(|&p| endpoint(router, addr(p)).inflight())
        .collect()
}

fn records(router: &Router, outcome: &str) -> u64 {
    router.metrics.records.with_label_values(&[outcome]).get()
}

// ---------------------------------------------------------------------------------------------
// Request builders
// ---------------------------------------------------------------------------------------------

fn hv(key: &str, value: &str) -> HeaderValue {
    // Envoy 1.40: bytes in `raw_value`, `value` empty.
    HeaderValue {
        key: key.to_string(),
        value: String::new(),
        raw_value: value.as_bytes().to_vec(),
    }
}

fn http_headers(list: Vec<HeaderValue>, eos: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap { headers: list }),
        end_of_stream: eos,
        ..HttpHeaders::default()
    }
}

/// Request headers for a POST to `path`, plus `extra` headers.
pub(crate) fn headers(path: &str, eos: bool, extra: &[(&str, &str)]) -> ProcessingRequest {
    let mut list = vec![
        hv(":method", if eos { "GET" } else { "POST" }),
        hv(":scheme", "http"),
        hv(":authority", "gateway.local"),
        hv(":path", path),
        hv("content-type", "application/json"),
    ];
    list.extend(extra.iter().map(|(k, v)| hv(k, v)));
    ProcessingRequest {
        request: Some(In::RequestHeaders(http_headers(list, eos))),
        ..ProcessingRequest::default()
    }
}

/// Sets `protocol_config` (as Envoy does on the first message of a stream).
pub(crate) fn modes(mut req: ProcessingRequest, request: i32, response: i32) -> ProcessingRequest {
    req.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: request,
        response_body_mode: response,
        ..ProtocolConfiguration::default()
    });
    req
}

pub(crate) fn body(bytes: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::RequestTrailers(HttpTrailers::default())),
        ..ProcessingRequest::default()
    }
}

/// Response headers with `:status`, and `upstream.address` in the ext_proc attributes.
fn response_headers(status: u32, upstream_address: Option<&str>) -> ProcessingRequest {
    response_headers_eos(status, upstream_address, false)
}

pub(crate) fn response_headers_eos(
    status: u32,
    upstream_address: Option<&str>,
    eos: bool,
) -> ProcessingRequest {
    let mut attributes = HashMap::new();
    if let Some(a) = upstream_address {
        attributes.insert(
            "envoy.filters.http.ext_proc".to_string(),
            Struct {
                fields: HashMap::from([
                    ("upstream.address".to_string(), string_value(a)),
                    (
                        "upstream.request_attempt_count".to_string(),
                        Value {
                            kind: Some(Kind::NumberValue(1.0)),
                        },
                    ),
                ]),
            },
        );
    }
    ProcessingRequest {
        request: Some(In::ResponseHeaders(http_headers(
            vec![
                hv(":status", &status.to_string()),
                hv("content-type", "text/event-stream"),
            ],
            eos,
        ))),
        attributes,
        ..ProcessingRequest::default()
    }
}

pub(crate) fn response_body(bytes: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn response_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(In::ResponseTrailers(HttpTrailers::default())),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn observed(mut req: ProcessingRequest) -> ProcessingRequest {
    req.observability_mode = true;
    req
}

pub(crate) fn list_value(items: &[&str]) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items.iter().map(|s| string_value(s)).collect(),
        })),
    }
}

/// `metadata_context.filter_metadata[namespace][key] = value`.
fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    Metadata {
        filter_metadata: HashMap::from([(
            namespace.to_string(),
            Struct {
                fields: HashMap::from([(key.to_string(), value)]),
            },
        )]),
        ..Metadata::default()
    }
}

pub(crate) fn with_metadata(mut req: ProcessingRequest, md: Metadata) -> ProcessingRequest {
    req.metadata_context = Some(md);
    req
}

pub(crate) fn subset_hint(value: Value) -> Metadata {
    metadata(SUBSET_NAMESPACE, SUBSET_KEY, value)
}

pub(crate) fn completion(model: &str, prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": model, "prompt": prompt, "stream": true})).unwrap()
}

pub(crate) fn long_prompt(tag: &str) -> String {
    format!("{tag}: ") + &"You are a helpful assistant. ".repeat(20)
}

// ---------------------------------------------------------------------------------------------
// Reply inspection
// ---------------------------------------------------------------------------------------------

pub(crate) fn common(r: &ProcessingResponse) -> Option<&CommonResponse> {
    match r.response.as_ref()? {
        Out::RequestHeaders(h) | Out::ResponseHeaders(h) => h.response.as_ref(),
        Out::RequestBody(b) | Out::ResponseBody(b) => b.response.as_ref(),
        _ => None,
    }
}

/// A header set by the reply's mutation: (value, append_action). Asserts `value` is empty.
pub(crate) fn set_header_of(r: &ProcessingResponse, key: &str) -> Option<(String, i32)> {
    let mutation = common(r)?.header_mutation.as_ref()?;
    let found: Vec<_> = mutation
        .set_headers
        .iter()
        .filter(|o| o.header.as_ref().is_some_and(|h| h.key == key))
        .collect();
    assert!(found.len() <= 1, "{key} set twice");
    let o = found.first()?;
    let h = o.header.as_ref().unwrap();
    assert!(h.value.is_empty(), "{key}: use raw_value, not value");
    Some((
        String::from_utf8(h.raw_value.clone()).unwrap(),
        o.append_action,
    ))
}

/// `dynamic_metadata["envoy.lb"][key]`, a string.
fn lb_string(r: &ProcessingResponse, key: &str) -> Option<String> {
    let md = r.dynamic_metadata.as_ref()?;
    let Some(Kind::StructValue(lb)) = md.fields.get(LB_NAMESPACE)?.kind.as_ref() else {
        panic!("envoy.lb is not a struct");
    };
    match lb.fields.get(key)?.kind.as_ref() {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        other => panic!("envoy.lb {key} is not a string: {other:?}"),
    }
}

/// `dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]`.
pub(crate) fn lb_value(r: &ProcessingResponse) -> Option<String> {
    lb_string(r, DESTINATION_HEADER)
}

/// The pick of a reply: checks header and metadata agree, the header overwrites, and the list
/// is well-formed (1..=5 distinct `ip:port`); returns it, primary first.
pub(crate) fn pick_of(r: &ProcessingResponse) -> Vec<SocketAddr> {
    let (header, action) = set_header_of(r, DESTINATION_HEADER).expect("destination header set");
    assert_eq!(
        action,
        HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        "destination header must overwrite a client-supplied one"
    );
    let md = lb_value(r).expect("envoy.lb metadata set");
    assert_eq!(header, md, "header and metadata must be identical");
    let list: Vec<SocketAddr> = header
        .split(',')
        .map(|p| {
            assert_eq!(p, p.trim(), "no spaces in the pick");
            p.parse().expect("ip:port")
        })
        .collect();
    assert!((1..=5).contains(&list.len()), "pick {header:?}");
    let distinct: HashSet<_> = list.iter().collect();
    assert_eq!(distinct.len(), list.len(), "duplicates in {header:?}");
    list
}

fn is_request_headers(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Out::RequestHeaders(_)))
}

fn is_request_body(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Out::RequestBody(_)))
}

/// A plain CONTINUE headers reply (no mutation, no metadata).
fn assert_continue_headers(r: &ProcessingResponse) {
    match &r.response {
        Some(Out::RequestHeaders(h)) => {
            let c = h.response.clone().unwrap_or_default();
            assert_eq!(c.status, 0, "CONTINUE");
            assert!(c.header_mutation.is_none_or(|m| m.set_headers.is_empty()));
            assert!(c.body_mutation.is_none());
        }
        other => panic!("expected a RequestHeaders reply, got {other:?}"),
    }
    assert!(r.dynamic_metadata.is_none());
}

/// `streamed_response` chunk of a body reply: (bytes, end_of_stream).
pub(crate) fn streamed(r: &ProcessingResponse) -> Option<(&[u8], bool)> {
    match common(r)?.body_mutation.as_ref()?.mutation.as_ref()? {
        body_mutation::Mutation::StreamedResponse(s) => Some((&s.body, s.end_of_stream)),
        _ => None,
    }
}

/// An immediate response: (status, JSON body, headers set).
pub(crate) fn immediate_of(
    r: &ProcessingResponse,
) -> (i32, serde_json::Value, HashMap<String, String>) {
    let Some(Out::ImmediateResponse(i)) = &r.response else {
        panic!("expected an ImmediateResponse, got {:?}", r.response);
    };
    let status = i.status.as_ref().expect("status").code;
    let json: serde_json::Value = serde_json::from_slice(&i.body).expect("JSON error body");
    let headers = i
        .headers
        .iter()
        .flat_map(|m| &m.set_headers)
        .filter_map(|o| o.header.as_ref())
        .map(|h| {
            (
                h.key.clone(),
                String::from_utf8(h.raw_value.clone()).unwrap(),
            )
        })
        .collect();
    (status, json, headers)
}

/// Asserts a single OpenAI-style immediate error; returns its message.
fn assert_error(replies: &[ProcessingResponse], status: i32) -> String {
    assert_eq!(replies.len(), 1, "{replies:?}");
    let (code, json, headers) = immediate_of(&replies[0]);
    assert_eq!(code, status, "{json}");
    assert_eq!(json["error"]["code"], status);
    assert!(json["error"]["type"].is_string());
    assert!(json["error"].get("param").is_some());
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.contains_key("x-request-id"));
    json["error"]["message"].as_str().unwrap().to_string()
}

/// Routes `body` through a BUFFERED stream; returns the stream and the pick.
fn route_buffered(
    router: &Arc<Router>,
    request_id: &str,
    body_bytes: &[u8],
    response_mode: i32,
) -> (StreamState, Vec<SocketAddr>) {
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", request_id)]),
        BUFFERED,
        response_mode,
    ));
    assert_eq!(r.len(), 1);
    assert_continue_headers(&r[0]);
    let r = s.handle(body(body_bytes, true));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]));
    let pick = pick_of(&r[0]);
    (s, pick)
}

// ---------------------------------------------------------------------------------------------
// 1. BUFFERED
// ---------------------------------------------------------------------------------------------

#[test]
fn chunks_are_bounded_and_last_ends_stream() {
    let body = vec![b'x'; BODY_CHUNK * 2 + 5];
    let chunks = body_chunks(&body, BodyEnd::EndOfStream);
    assert_eq!(chunks.len(), 3);
    assert_eq!(body_chunks(&[], BodyEnd::EndOfStream).len(), 1);
    assert_eq!(
        streamed(&body_chunks(&[], BodyEnd::EndOfStream).remove(0)),
        Some((&b""[..], true))
    );
}

#[test]
fn buffered_pick_rides_on_the_body_reply() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers(
            "/v1/chat/completions",
            false,
            &[
                ("x-request-id", "req-1"),
                // A client-supplied pick must be overwritten.
                (DESTINATION_HEADER, "6.6.6.6:6666"),
            ],
        ),
        BUFFERED,
        STREAMED,
    ));
    assert_eq!(r.len(), 1);
    assert_continue_headers(&r[0]);
    assert_eq!(inflight(&router), [0, 0, 0]);

    let chat =
        json!({"model": "m", "messages": [{"role": "user", "content": long_prompt("chat")}]});
    let r = s.handle(body(&serde_json::to_vec(&chat).unwrap(), true));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]), "{r:?}");
    let pick = pick_of(&r[0]);
    assert_eq!(pick.len(), 3, "all three pods, primary first");
    let all: HashSet<_> = PORTS.iter().map(|&p| addr(p)).collect();
    assert_eq!(pick.iter().copied().collect::<HashSet<_>>(), all);
    assert!(common(&r[0]).unwrap().clear_route_cache);
    assert!(common(&r[0]).unwrap().body_mutation.is_none());
    // x-request-id was present: not touched.
    assert_eq!(set_header_of(&r[0], "x-request-id"), None);
    // The primary (only) counts one request in flight.
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    assert_eq!(inflight(&router).iter().sum::<i64>(), 1);
    assert_eq!(
        router
            .metrics
            .pod_picks
            .with_label_values(&crate::metrics::pod_label_values(
                &endpoint(&router, pick[0]).spec.id
            ))
            .get(),
        1
    );
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn pick_is_capped_at_five_and_honours_max_endpoints() {
    let seven: Vec<_> = (0..7)
        .map(|i| spec(&format!("p{i}"), 19000 + i, &[]))
        .collect();
    let router = router_with(PickerConfig::default(), seven.clone());
    let (_s, pick) = route_buffered(&router, "a", &completion("m", "hello"), STREAMED);
    assert_eq!(pick.len(), 5);

    let one = router_with(
        PickerConfig {
            max_endpoints: 1,
            ..PickerConfig::default()
        },
        seven,
    );
    let (_s, pick) = route_buffered(&one, "b", &completion("m", "hello"), STREAMED);
    assert_eq!(pick.len(), 1);
}

#[test]
fn ipv6_endpoints_are_bracketed() {
    let v6 = EndpointSpec {
        address: "[::1]:8000".parse().unwrap(),
        ..spec("v6", 0, &[])
    };
    let router = router_with(PickerConfig::default(), vec![v6]);
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(body(&completion("m", "hi"), true));
    assert_eq!(lb_value(&r[0]).as_deref(), Some("[::1]:8000"));
    assert_eq!(
        pick_of(&r[0]),
        ["[::1]:8000".parse::<SocketAddr>().unwrap()]
    );
}

#[test]
fn streamed_request_body_is_continued_until_the_end() {
    // Request body mode STREAMED: non-final chunks are answered with a plain body reply.
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[]),
        STREAMED,
        STREAMED,
    ));
    assert_continue_headers(&r[0]);
    let b = completion("m", &long_prompt("streamed"));
    let (a, z) = b.split_at(b.len() / 2);
    let r = s.handle(body(a, false));
    assert_eq!(r.len(), 1);
    assert!(is_request_body(&r[0]));
    assert!(common(&r[0]).is_none());
    let r = s.handle(body(z, true));
    assert_eq!(r.len(), 1);
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
}

#[test]
fn buffered_partial_body_that_did_not_fit_is_413() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED_PARTIAL,
        STREAMED,
    ));
    let r = s.handle(body(b"{\"model\":\"m\",\"prompt\":\"par", false));
    let msg = assert_error(&r, 413);
    assert!(msg.contains("buffer limit"), "{msg}");
    // Nothing more is answered for this request.
    assert!(s.handle(body(b"tial\"}", true)).is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn buffered_partial_whole_body_before_trailers_is_routed() {
    // Envoy sends a BUFFERED_PARTIAL body that request trailers follow with end_of_stream false,
    // as it does a body cut at its buffer limit: a body that parses whole is routed.
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED_PARTIAL,
        STREAMED,
    ));
    let r = s.handle(body(&completion("m", &long_prompt("partial")), false));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
    assert!(matches!(
        s.handle(request_trailers())[..],
        [ProcessingResponse {
            response: Some(Out::RequestTrailers(_)),
            ..
        }]
    ));
}

/// A filter that skips request headers: Envoy sends the body first and has already forwarded
/// the request. The body is still answered (never a stuck stream), routed by load and counted.
#[test]
fn body_without_request_headers_is_routed_by_load_and_counted() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        body(&completion("m", &long_prompt("headless")), true),
        BUFFERED,
        NONE,
    ));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]), "{r:?}");
    assert_eq!(pick_of(&r[0]).len(), 3);
    let unscored = |reason: &str| router.metrics.unscored.with_label_values(&[reason]).get();
    assert_eq!(unscored("no_request_path"), 1);
    assert_eq!(unscored("unknown_api"), 0);
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn missing_protocol_config_behaves_as_buffered() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(headers("/v1/completions", false, &[("x-request-id", "np")]));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&completion("m", "hello"), true));
    assert!(is_request_body(&r[0]));
    assert_eq!(pick_of(&r[0]).len(), 3);
}

// ---------------------------------------------------------------------------------------------
// 2. FULL_DUPLEX_STREAMED
// ---------------------------------------------------------------------------------------------

/// Checks the FULL_DUPLEX answer to the body's end: headers reply with the pick, then the body,
/// with `end_of_stream` on its last chunk unless the body ended with trailers.
fn assert_full_duplex_answer(
    r: &[ProcessingResponse],
    original: &[u8],
    end: BodyEnd,
) -> Vec<SocketAddr> {
    assert!(r.len() >= 2, "{r:?}");
    assert!(is_request_headers(&r[0]), "{:?}", r[0]);
    let c = common(&r[0]).unwrap();
    assert!(c.clear_route_cache);
    assert!(c.body_mutation.is_none());
    let pick = pick_of(&r[0]);
    let chunks = &r[1..];
    let ends_stream = end == BodyEnd::EndOfStream;
    let min_chunks = usize::from(ends_stream);
    assert_eq!(
        chunks.len(),
        original.len().div_ceil(BODY_CHUNK).max(min_chunks)
    );
    let mut resent = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        assert!(is_request_body(chunk), "{chunk:?}");
        assert!(chunk.dynamic_metadata.is_none());
        let c = common(chunk).unwrap();
        assert!(c.header_mutation.is_none());
        let (bytes, eos) = streamed(chunk).expect("streamed_response");
        assert!(bytes.len() <= BODY_CHUNK);
        assert_eq!(
            eos,
            ends_stream && i == chunks.len() - 1,
            "end_of_stream only on the last chunk, and only if the body ended the stream"
        );
        resent.extend_from_slice(bytes);
    }
    assert_eq!(resent, original, "the body is sent back unchanged");
    pick
}

#[test]
fn full_duplex_holds_headers_and_resends_a_200kb_body() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", "fd-1")]),
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    assert!(r.is_empty(), "headers are held: {r:?}");
    let original = completion("m", &"0123456789abcdef".repeat(12_500));
    assert!(original.len() > 200_000);
    let pieces: Vec<&[u8]> = original.chunks(45_000).collect();
    assert_eq!(pieces.len(), 5);
    let last = pieces.len() - 1;
    let mut answer = vec![];
    for (i, piece) in pieces.iter().enumerate() {
        let r = s.handle(body(piece, i == last));
        if i < last {
            assert!(r.is_empty(), "no reply to a non-final chunk: {r:?}");
        } else {
            answer = r;
        }
    }
    assert_eq!(answer.len(), 1 + original.len().div_ceil(BODY_CHUNK));
    let pick = assert_full_duplex_answer(&answer, &original, BodyEnd::EndOfStream);
    assert_eq!(pick.len(), 3);
    assert_eq!(set_header_of(&answer[0], "x-request-id"), None);
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn full_duplex_small_body_in_one_chunk() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    assert!(
        s.handle(modes(
            headers("/v1/completions", false, &[]),
            FULL_DUPLEX,
            FULL_DUPLEX
        ))
        .is_empty()
    );
    let original = completion("m", "hi");
    let r = s.handle(body(&original, true));
    assert_eq!(r.len(), 2);
    assert_full_duplex_answer(&r, &original, BodyEnd::EndOfStream);
    // The generated request id is part of the held headers' mutation.
    assert!(set_header_of(&r[0], "x-request-id").is_some());
}

#[test]
fn full_duplex_body_ended_by_trailers() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    assert!(
        s.handle(modes(
            headers("/v1/completions", false, &[]),
            FULL_DUPLEX,
            FULL_DUPLEX
        ))
        .is_empty()
    );
    let original = completion("m", &long_prompt("trailers"));
    let (a, z) = original.split_at(10);
    assert!(s.handle(body(a, false)).is_empty());
    assert!(s.handle(body(z, false)).is_empty());
    let r = s.handle(request_trailers());
    assert!(matches!(
        r.last().unwrap().response,
        Some(Out::RequestTrailers(_))
    ));
    assert_full_duplex_answer(&r[..r.len() - 1], &original, BodyEnd::Trailers);
}

#[test]
fn full_duplex_unknown_api_body_is_routed_by_load_and_resent() {
    // Not an inference API: the body is not parsed (may be anything) but still sent back.
    let router = router();
    let mut s = StreamState::new(router.clone());
    assert!(
        s.handle(modes(
            headers("/v1/embeddings", false, &[]),
            FULL_DUPLEX,
            FULL_DUPLEX
        ))
        .is_empty()
    );
    let original = b"\x00\x01 not json".to_vec();
    let r = s.handle(body(&original, true));
    assert_eq!(
        assert_full_duplex_answer(&r, &original, BodyEnd::EndOfStream).len(),
        3
    );
}

#[test]
fn full_duplex_bad_body_is_a_single_immediate_response() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    assert!(s.handle(body(b"{\"prompt\":", false)).is_empty());
    let r = s.handle(body(b"\"x\"}", true));
    let msg = assert_error(&r, 400);
    assert!(msg.contains("model"), "{msg}");
    assert_eq!(inflight(&router), [0, 0, 0]);
}

// ---------------------------------------------------------------------------------------------
// 3. Requests without a body
// ---------------------------------------------------------------------------------------------

#[test]
fn header_only_models_request_is_answered_at_once() {
    for mode in [BUFFERED, FULL_DUPLEX] {
        let router = router();
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers("/v1/models", true, &[("x-request-id", "m-1")]),
            mode,
            mode,
        ));
        assert_eq!(r.len(), 1, "mode {mode}: {r:?}");
        assert!(is_request_headers(&r[0]));
        assert!(common(&r[0]).unwrap().clear_route_cache);
        assert!(streamed(&r[0]).is_none());
        assert_eq!(pick_of(&r[0]).len(), 3);
        // No prompt: nothing to record later.
        let r = s.handle(response_headers(200, Some("127.0.0.1:18001")));
        assert_eq!(r.len(), 1);
        let r = s.handle(response_body(b"{}", true));
        assert_eq!(r.len(), 1);
        assert_eq!(total_entries(&router), 0);
        assert_eq!(records(&router, "unscored"), 1);
        assert_eq!(inflight(&router), [0, 0, 0]);
    }
}

#[test]
fn header_only_inference_request_is_400() {
    for mode in [BUFFERED, FULL_DUPLEX] {
        let router = router();
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers("/v1/chat/completions", true, &[("x-request-id", "c-1")]),
            mode,
            mode,
        ));
        let msg = assert_error(&r, 400);
        assert_eq!(msg, "request has no body");
        let (_, json, headers) = immediate_of(&r[0]);
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(headers["x-request-id"], "c-1");
        assert_eq!(inflight(&router), [0, 0, 0]);
        assert_eq!(
            router
                .metrics
                .immediate_responses
                .with_label_values(&["400"])
                .get(),
            1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Failures
// ---------------------------------------------------------------------------------------------

fn buffered_failure(router: &Arc<Router>, path: &str, b: &[u8]) -> Vec<ProcessingResponse> {
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(headers(path, false, &[]), BUFFERED, STREAMED));
    assert_continue_headers(&r[0]);
    s.handle(body(b, true))
}

#[test]
fn bad_bodies_are_400_naming_the_problem() {
    let router = router();
    let cases: [(&[u8], &str); 6] = [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1,2]", "must be a JSON object"),
        (br#"{"prompt":"hi"}"#, "no `model` field"),
        (
            br#"{"model":42,"prompt":"hi"}"#,
            "`model` must be a string, got a number",
        ),
        (br#"{"model":"","prompt":"hi"}"#, "must not be empty"),
    ];
    for (b, expected) in cases {
        let r = buffered_failure(&router, "/v1/completions", b);
        let msg = assert_error(&r, 400);
        assert!(
            msg.contains(expected),
            "{msg:?} should contain {expected:?}"
        );
        let (_, json, _) = immediate_of(&r[0]);
        assert_eq!(json["error"]["type"], "invalid_request_error");
    }
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn body_over_the_limit_is_413() {
    let limit = 200;
    let router = router_with(
        PickerConfig {
            max_body_bytes: limit,
            ..PickerConfig::default()
        },
        three(),
    );
    // Exactly at the limit is accepted.
    let pad = limit - completion("m", "x").len();
    let ok = completion("m", &"x".repeat(1 + pad));
    assert_eq!(ok.len(), limit);
    let r = buffered_failure(&router, "/v1/completions", &ok);
    assert_eq!(pick_of(&r[0]).len(), 3);

    let over = completion("m", &"x".repeat(2 + pad));
    let r = buffered_failure(&router, "/v1/completions", &over);
    let msg = assert_error(&r, 413);
    assert!(msg.contains("200 bytes"), "{msg}");

    // FULL_DUPLEX: the chunk that crosses the limit is answered 413, later chunks not at all.
    let mut s = StreamState::new(router.clone());
    assert!(
        s.handle(modes(
            headers("/v1/completions", false, &[]),
            FULL_DUPLEX,
            FULL_DUPLEX
        ))
        .is_empty()
    );
    assert!(s.handle(body(&over[..150], false)).is_empty());
    assert_error(&s.handle(body(&over[150..], false)), 413);
    assert!(s.handle(body(b"", true)).is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn unknown_model_is_404_when_endpoints_list_models() {
    let router = router_with(
        PickerConfig::default(),
        vec![
            spec("a", PORTS[0], &["llama"]),
            spec("b", PORTS[1], &["llama", "qwen"]),
            spec("c", PORTS[2], &["qwen"]),
        ],
    );
    let r = buffered_failure(&router, "/v1/completions", &completion("mistral", "hi"));
    let msg = assert_error(&r, 404);
    assert!(msg.contains("mistral"), "{msg}");
    let (_, json, _) = immediate_of(&r[0]);
    assert_eq!(json["error"]["type"], "invalid_request_error");

    // A listed model goes only to the pods that serve it.
    let r = buffered_failure(&router, "/v1/completions", &completion("qwen", "hi"));
    let pick: HashSet<_> = pick_of(&r[0]).into_iter().collect();
    assert_eq!(pick, HashSet::from([addr(PORTS[1]), addr(PORTS[2])]));
}

#[test]
fn no_endpoints_is_503() {
    let router = router_with(PickerConfig::default(), vec![]);
    let r = buffered_failure(&router, "/v1/completions", &completion("m", "hi"));
    let msg = assert_error(&r, 503);
    assert!(msg.contains("no model server endpoints"), "{msg}");
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED));
    assert_error(&r, 503);
}

// ---------------------------------------------------------------------------------------------
// 5. x-request-id
// ---------------------------------------------------------------------------------------------

#[test]
fn request_id_is_generated_when_missing() {
    let router = router();
    for (extra, generated) in [
        (vec![], true),
        (vec![("x-request-id", "")], true),
        (vec![("x-request-id", "given-id")], false),
    ] {
        // BUFFERED: on the body reply.
        let mut s = StreamState::new(router.clone());
        s.handle(modes(
            headers("/v1/completions", false, &extra),
            BUFFERED,
            STREAMED,
        ));
        let r = s.handle(body(&completion("m", "hi"), true));
        let id = set_header_of(&r[0], "x-request-id");
        // FULL_DUPLEX: on the held headers reply. Header-only: on the immediate headers reply.
        let mut s2 = StreamState::new(router.clone());
        s2.handle(modes(
            headers("/v1/completions", false, &extra),
            FULL_DUPLEX,
            FULL_DUPLEX,
        ));
        let r2 = s2.handle(body(&completion("m", "hi"), true));
        let id2 = set_header_of(&r2[0], "x-request-id");
        let mut s3 = StreamState::new(router.clone());
        let r3 = s3.handle(modes(
            headers("/v1/models", true, &extra),
            BUFFERED,
            STREAMED,
        ));
        let id3 = set_header_of(&r3[0], "x-request-id");
        if generated {
            for id in [&id, &id2, &id3] {
                let (v, action) = id.clone().expect("x-request-id generated");
                assert!(uuid::Uuid::parse_str(&v).is_ok(), "{v}");
                assert_eq!(action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
            }
            assert_ne!(id.unwrap().0, id2.unwrap().0, "fresh per request");
        } else {
            assert_eq!((id, id2, id3), (None, None, None));
        }
        for st in [&mut s, &mut s2, &mut s3] {
            st.finish();
        }
    }
}

#[test]
fn immediate_response_carries_the_generated_request_id() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(body(b"nope", true));
    assert_error(&r, 400);
    let (_, _, headers) = immediate_of(&r[0]);
    assert!(uuid::Uuid::parse_str(&headers["x-request-id"]).is_ok());
}

// ---------------------------------------------------------------------------------------------
// 6. Subset hint and the conformance header
// ---------------------------------------------------------------------------------------------

fn route_with_hint(
    router: &Arc<Router>,
    hint: Option<Metadata>,
    extra: &[(&str, &str)],
) -> Vec<ProcessingResponse> {
    let mut req = modes(headers("/v1/completions", false, extra), BUFFERED, STREAMED);
    req.metadata_context = hint;
    let mut s = StreamState::new(router.clone());
    let r = s.handle(req);
    assert_continue_headers(&r[0]);
    s.handle(body(&completion("m", &long_prompt("hint")), true))
}

fn pick_set(r: &[ProcessingResponse]) -> HashSet<SocketAddr> {
    assert_eq!(r.len(), 1, "{r:?}");
    pick_of(&r[0]).into_iter().collect()
}

#[test]
fn subset_hint_as_a_list_restricts_the_pick() {
    let router = router();
    for _ in 0..10 {
        let r = route_with_hint(
            &router,
            Some(subset_hint(list_value(&[
                "127.0.0.1:18001",
                "127.0.0.1:18003",
            ]))),
            &[],
        );
        assert_eq!(pick_set(&r), HashSet::from([addr(18001), addr(18003)]));
    }
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&["127.0.0.1:18002"]))),
        &[],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
}

#[test]
fn subset_hint_as_a_comma_string_restricts_the_pick() {
    let router = router();
    let r = route_with_hint(
        &router,
        Some(subset_hint(string_value(
            "127.0.0.1:18002, 127.0.0.1:18003",
        ))),
        &[],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002), addr(18003)]));
    // A bare IP matches every port.
    let r = route_with_hint(&router, Some(subset_hint(string_value("127.0.0.1"))), &[]);
    assert_eq!(pick_set(&r).len(), 3);
}

#[test]
fn subset_hint_applies_to_unknown_apis_too() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    let r = s.handle(with_metadata(
        modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED),
        subset_hint(list_value(&["127.0.0.1:18003"])),
    ));
    assert_eq!(pick_set(&r), HashSet::from([addr(18003)]));
}

#[test]
fn empty_or_unusable_subset_hint_is_503() {
    let router = router();
    for hint in [
        list_value(&[]),
        string_value(""),
        list_value(&["not-an-address"]),
        Value {
            kind: Some(Kind::NumberValue(3.0)),
        },
    ] {
        let r = route_with_hint(&router, Some(subset_hint(hint.clone())), &[]);
        let msg = assert_error(&r, 503);
        assert!(msg.contains("subset"), "{hint:?}: {msg}");
    }
    // Listed but not one of ours: nothing eligible.
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&["10.9.9.9:80"]))),
        &[],
    );
    let msg = assert_error(&r, 503);
    assert!(msg.contains("subset"), "{msg}");
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn test_selection_header_is_ignored_unless_enabled() {
    let router = router();
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1:18002")]);
    assert_eq!(pick_set(&r).len(), 3);
    // No conformance echo either.
    let mut s = StreamState::new(router.clone());
    s.handle(modes(headers("/v1/models", true, &[]), BUFFERED, STREAMED));
    let r = s.handle(response_headers(200, Some("127.0.0.1:18002")));
    assert_eq!(set_header_of(&r[0], CONFORMANCE_SERVED_HEADER), None);
}

#[test]
fn test_selection_header_restricts_when_enabled() {
    let router = test_selection_router();
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1:18002")]);
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
    let r = route_with_hint(
        &router,
        None,
        &[(TEST_SELECTION_HEADER, "127.0.0.1:18001,127.0.0.1:18003")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18001), addr(18003)]));
    // Bare IP = any port.
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "127.0.0.1")]);
    assert_eq!(pick_set(&r).len(), 3);
    // Intersected with the subset hint.
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&[
            "127.0.0.1:18001",
            "127.0.0.1:18002",
        ]))),
        &[(TEST_SELECTION_HEADER, "127.0.0.1:18002,127.0.0.1:18003")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
    // Nothing eligible.
    let r = route_with_hint(&router, None, &[(TEST_SELECTION_HEADER, "10.1.1.1:80")]);
    assert_error(&r, 503);
}

#[test]
fn conformance_echoes_the_served_endpoint_when_enabled() {
    let router = test_selection_router();
    let (mut s, _) = route_buffered(&router, "echo", &completion("m", "hi"), STREAMED);
    let r = s.handle(response_headers(200, Some("127.0.0.1:18003")));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    let (v, action) = set_header_of(&r[0], CONFORMANCE_SERVED_HEADER).unwrap();
    assert_eq!(v, "127.0.0.1:18003");
    assert_eq!(action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
}

// ---------------------------------------------------------------------------------------------
// 7. Recording the serving pod
// ---------------------------------------------------------------------------------------------

#[test]
fn success_records_for_the_pod_that_served() {
    let router = router();
    let prompt_body = completion("m", &long_prompt("record"));
    let (mut s, pick) = route_buffered(&router, "rec-1", &prompt_body, STREAMED);
    let (primary, served) = (pick[0], pick[1]);
    assert_eq!(endpoint(&router, primary).inflight(), 1);

    let r = s.handle(response_headers(200, Some(&served.to_string())));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    assert_eq!(
        total_entries(&router),
        0,
        "not before the end of the response"
    );
    for chunk in [&b"data: {}\n\n"[..], b"data: [DONE]\n\n"] {
        let r = s.handle(response_body(chunk, false));
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0].response, Some(Out::ResponseBody(_))));
        assert!(streamed(&r[0]).is_none(), "STREAMED: plain continue");
    }
    assert_eq!(total_entries(&router), 0);
    let r = s.handle(response_body(b"", true));
    assert_eq!(r.len(), 1);

    assert!(
        entries(&router, served) > 0,
        "recorded for the pod that served"
    );
    assert_eq!(entries(&router, primary), 0, "not for the primary");
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(
        inflight(&router),
        [0, 0, 0],
        "primary's in-flight count released"
    );
    assert_eq!(records(&router, "recorded"), 1);
    s.finish();
    assert_eq!(records(&router, "aborted"), 0);

    // The same prompt now goes to the pod that served it.
    let (_s2, pick2) = route_buffered(&router, "rec-2", &prompt_body, STREAMED);
    assert_eq!(pick2[0], served);
}

#[test]
fn response_trailers_or_header_eos_also_complete() {
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "t-1",
        &completion("m", &long_prompt("t")),
        STREAMED,
    );
    s.handle(response_headers(200, Some(&pick[2].to_string())));
    s.handle(response_body(b"partial", false));
    let r = s.handle(response_trailers());
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseTrailers(_))));
    assert!(entries(&router, pick[2]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);

    let router = router_with(PickerConfig::default(), three());
    let (mut s, pick) = route_buffered(
        &router,
        "t-2",
        &completion("m", &long_prompt("h")),
        STREAMED,
    );
    s.handle(response_headers_eos(204, Some(&pick[1].to_string()), true));
    assert!(entries(&router, pick[1]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn served_pod_falls_back_to_metadata_then_primary() {
    // No attribute: the override_host `...-served` metadata key names the served pod.
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "md",
        &completion("m", &long_prompt("md")),
        STREAMED,
    );
    let served = pick[2];
    s.handle(with_metadata(
        response_headers(200, None),
        metadata(LB_NAMESPACE, SERVED_KEY, string_value(&served.to_string())),
    ));
    s.handle(response_body(b"", true));
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));

    // Neither: the primary pick.
    let router = router_with(PickerConfig::default(), three());
    let (mut s, pick) = route_buffered(
        &router,
        "pr",
        &completion("m", &long_prompt("pr")),
        STREAMED,
    );
    s.handle(response_headers(200, None));
    s.handle(response_body(b"", true));
    assert!(entries(&router, pick[0]) > 0);
    assert_eq!(total_entries(&router), entries(&router, pick[0]));
}

#[test]

fn unknown_served_address_is_not_credited_to_the_primary() {
    // Envoy reports that a pod outside the endpoint set served (e.g. the fallback LB policy):
    // the primary did not serve this prompt and must not be credited with its prefix.
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "unk",
        &completion("m", &long_prompt("u")),
        STREAMED,
    );
    s.handle(response_headers(200, Some("10.20.30.40:8000")));
    s.handle(response_body(b"", true));
    assert_eq!(
        entries(&router, pick[0]),
        0,
        "primary credited with a prompt it never saw"
    );
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn failed_response_records_nothing() {
    let router = router();
    let (mut s, pick) = route_buffered(
        &router,
        "f-1",
        &completion("m", &long_prompt("f")),
        STREAMED,
    );
    s.handle(response_headers(500, Some(&pick[0].to_string())));
    s.handle(response_body(b"{\"error\":{}}", true));
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "failed"), 1);
    assert_eq!(records(&router, "recorded"), 0);
    s.finish();
    assert_eq!(records(&router, "aborted"), 0);
}

#[test]
fn stream_ending_before_the_response_end_records_nothing() {
    let router = router();
    // Ends after the response headers.
    let (mut s, pick) = route_buffered(
        &router,
        "ab-1",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    s.handle(response_headers(200, Some(&pick[0].to_string())));
    s.handle(response_body(b"data: {}\n\n", false));
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    s.finish();
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 1);
    // Ends right after routing.
    let (mut s, _) = route_buffered(
        &router,
        "ab-2",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    s.finish();
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 2);
    assert!(router.pending.is_empty());
    // Dropping the stream without finish() also releases the count.
    let (s, _) = route_buffered(
        &router,
        "ab-3",
        &completion("m", &long_prompt("a")),
        STREAMED,
    );
    drop(s);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(total_entries(&router), 0);
}

#[test]
fn full_duplex_response_chunks_are_echoed() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    let r = s.handle(body(&completion("m", &long_prompt("fdr")), true));
    let pick = pick_of(&r[0]);
    let r = s.handle(response_headers(200, Some(&pick[1].to_string())));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0].response, Some(Out::ResponseHeaders(_))));
    let chunks: [(&[u8], bool); 3] = [
        (b"data: {\"a\":1}\n\n", false),
        (b"data: [DONE]\n\n", false),
        (b"", true),
    ];
    for (bytes, eos) in chunks {
        let r = s.handle(response_body(bytes, eos));
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0].response, Some(Out::ResponseBody(_))));
        assert_eq!(streamed(&r[0]), Some((bytes, eos)));
    }
    assert!(entries(&router, pick[1]) > 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
}

#[test]
fn response_mode_none_completes_at_the_response_headers() {
    // The routing stream itself sees the response headers (header SEND, body NONE): the 2xx
    // headers are the completion.
    let router = router();
    let (mut s, pick) =
        route_buffered(&router, "none-1", &completion("m", &long_prompt("n")), NONE);
    assert_eq!(router.pending.len(), 1);
    let r = s.handle(response_headers(200, Some(&pick[1].to_string())));
    assert_eq!(r.len(), 1);
    assert!(entries(&router, pick[1]) > 0);
    assert!(router.pending.is_empty());
    assert_eq!(inflight(&router), [0, 0, 0]);
    s.finish();
    assert_eq!(records(&router, "recorded"), 1);
}

#[test]
fn open_streams_are_counted() {
    let router = router();
    let a = StreamState::new(router.clone());
    let b = StreamState::new(router.clone());
    assert_eq!(router.metrics.inflight_streams.get(), 2);
    drop(a);
    drop(b);
    assert_eq!(router.metrics.inflight_streams.get(), 0);
}

// ---------------------------------------------------------------------------------------------
// 8. Split setup: routing stream + observer stream
// ---------------------------------------------------------------------------------------------

fn observer_headers(request_id: &str) -> ProcessingRequest {
    observed(modes(
        headers("/v1/completions", false, &[("x-request-id", request_id)]),
        NONE,
        STREAMED,
    ))
}

#[test]
fn observer_stream_claims_the_pending_route_and_records() {
    let router = router();
    let prompt_body = completion("m", &long_prompt("split"));
    let (mut routing, pick) = route_buffered(&router, "split-1", &prompt_body, NONE);
    assert_eq!(router.pending.len(), 1, "deposited under the request id");
    routing.finish();
    drop(routing);
    assert_eq!(router.pending.len(), 1, "still waiting for the observer");
    assert_eq!(endpoint(&router, pick[0]).inflight(), 1);
    assert_eq!(records(&router, "aborted"), 0);

    let served = pick[2];
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers("split-1")).is_empty());
    assert!(
        obs.handle(observed(response_headers(200, Some(&served.to_string()))))
            .is_empty()
    );
    assert_eq!(total_entries(&router), 0);
    assert!(
        obs.handle(observed(response_body(b"data: {}\n\n", false)))
            .is_empty()
    );
    assert!(obs.handle(observed(response_body(b"", true))).is_empty());
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(total_entries(&router), entries(&router, served));
    assert_eq!(inflight(&router), [0, 0, 0]);
    obs.finish();
    assert_eq!(records(&router, "recorded"), 1);
    assert_eq!(records(&router, "aborted"), 0);

    let (_s, pick2) = route_buffered(&router, "split-2", &prompt_body, NONE);
    assert_eq!(pick2[0], served);
}

#[test]
fn observer_never_answers_even_trailers_or_bodies() {
    let router = router();
    let (_routing, _) = route_buffered(&router, "split-q", &completion("m", "hi"), NONE);
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers("split-q")).is_empty());
    assert!(obs.handle(observed(body(b"{}", true))).is_empty());
    assert!(obs.handle(observed(request_trailers())).is_empty());
    assert!(obs.handle(observed(response_headers(200, None))).is_empty());
    assert!(obs.handle(observed(response_trailers())).is_empty());
    assert!(router.pending.is_empty());
}

#[test]
fn observer_ending_early_records_nothing_and_drops_the_pending_route() {
    let router = router();
    let (routing, pick) = route_buffered(
        &router,
        "split-3",
        &completion("m", &long_prompt("s3")),
        NONE,
    );
    drop(routing);
    let mut obs = StreamState::new(router.clone());
    assert!(obs.handle(observer_headers("split-3")).is_empty());
    assert!(
        obs.handle(observed(response_headers(200, Some(&pick[0].to_string()))))
            .is_empty()
    );
    assert!(
        obs.handle(observed(response_body(b"data: {}\n\n", false)))
            .is_empty()
    );
    assert_eq!(router.pending.len(), 1);
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "aborted"), 1);
}

#[test]
fn observer_of_a_failed_response_records_nothing() {
    let router = router();
    let (routing, pick) = route_buffered(
        &router,
        "split-4",
        &completion("m", &long_prompt("s4")),
        NONE,
    );
    drop(routing);
    let mut obs = StreamState::new(router.clone());
    obs.handle(observer_headers("split-4"));
    obs.handle(observed(response_headers(503, Some(&pick[0].to_string()))));
    obs.handle(observed(response_body(b"", true)));
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router), [0, 0, 0]);
    assert_eq!(records(&router, "failed"), 1);
}

#[test]
fn observer_for_another_request_id_does_not_claim() {
    let router = router();
    let (_routing, _) = route_buffered(
        &router,
        "split-5",
        &completion("m", &long_prompt("s5")),
        NONE,
    );
    let mut obs = StreamState::new(router.clone());
    obs.handle(observer_headers("someone-else"));
    obs.handle(observed(response_headers(200, None)));
    obs.handle(observed(response_body(b"", true)));
    obs.finish();
    assert_eq!(router.pending.len(), 1);
    assert_eq!(total_entries(&router), 0);
    assert_eq!(inflight(&router).iter().sum::<i64>(), 1);
}

/// `dynamic_metadata["envoy.lb"]["x-prefix-picker-route"]`.
fn route_key_of(r: &ProcessingResponse) -> Option<String> {
    lb_string(r, ROUTE_KEY)
}

#[test]
fn route_key_is_in_the_metadata_only_when_an_observer_must_claim_the_route() {
    let router = router();
    let prompt = completion("m", &long_prompt("rk"));
    for (response_mode, expected) in [(NONE, Some("rk-1")), (STREAMED, None)] {
        let mut s = StreamState::new(router.clone());
        s.handle(modes(
            headers("/v1/completions", false, &[("x-request-id", "rk-1")]),
            BUFFERED,
            response_mode,
        ));
        let r = s.handle(body(&prompt, true));
        assert_eq!(route_key_of(&r[0]).as_deref(), expected, "{response_mode}");
        router.pending.take("rk-1");
    }
    // A generated request id is the key too.
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        NONE,
    ));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&prompt, true));
    let (generated, _) = set_header_of(&r[0], "x-request-id").expect("request id generated");
    assert_eq!(route_key_of(&r[0]), Some(generated.clone()));
    assert!(router.pending.take(&generated).is_some());
}

#[test]
fn a_reused_request_id_gets_its_own_route_key_and_the_observer_claims_by_it() {
    let router = router();
    let (a, b) = (
        completion("m", &long_prompt("reuse a")),
        completion("m", &long_prompt("reuse b")),
    );
    let (_routing_a, _) = route_buffered(&router, "same-id", &a, NONE);
    let mut routing_b = StreamState::new(router.clone());
    routing_b.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", "same-id")]),
        BUFFERED,
        NONE,
    ));
    let r = routing_b.handle(body(&b, true));
    let key_b = route_key_of(&r[0]).expect("route key");
    assert_ne!(key_b, "same-id");
    assert_eq!(router.pending.len(), 2, "the first route still waits");
    // B's observer sees the request id and B's route key: it claims B's route, not A's.
    let mut observer = StreamState::new(router.clone());
    observer.handle(observed(with_metadata(
        observer_headers("same-id"),
        metadata(LB_NAMESPACE, ROUTE_KEY, string_value(&key_b)),
    )));
    let served = pick_of(&r[0])[0];
    observer.handle(observed(response_headers(200, Some(&served.to_string()))));
    observer.handle(observed(response_body(b"data: [DONE]\n\n", true)));
    assert_eq!(records(&router, "recorded"), 1);
    assert!(
        router.pending.take(&key_b).is_none(),
        "B's route was claimed"
    );
    assert!(
        router.pending.take("same-id").is_some(),
        "A's route still waits"
    );
}

#[test]
fn observer_without_request_headers_claims_by_the_route_key() {
    let router = router();
    let prompt = completion("m", &long_prompt("skip"));
    let (routing, pick) = route_buffered(&router, "skip-1", &prompt, NONE);
    drop(routing);
    let served = pick[1];
    let key = metadata(LB_NAMESPACE, ROUTE_KEY, string_value("skip-1"));
    let mut obs = StreamState::new(router.clone());
    let first = with_metadata(
        response_headers(200, Some(&served.to_string())),
        key.clone(),
    );
    assert!(
        obs.handle(observed(modes(first, NONE, STREAMED)))
            .is_empty()
    );
    assert!(
        obs.handle(observed(with_metadata(response_body(b"", true), key)))
            .is_empty()
    );
    assert!(router.pending.is_empty());
    assert!(entries(&router, served) > 0);
    assert_eq!(records(&router, "recorded"), 1);
    assert_eq!(inflight(&router), [0, 0, 0]);

    // Aborted before the end: the route is dropped, nothing recorded.
    let (routing, pick) = route_buffered(&router, "skip-2", &prompt, NONE);
    drop(routing);
    let key = metadata(LB_NAMESPACE, ROUTE_KEY, string_value("skip-2"));
    let mut obs = StreamState::new(router.clone());
    let first = with_metadata(response_headers(200, Some(&pick[0].to_string())), key);
    obs.handle(observed(modes(first, NONE, STREAMED)));
    obs.finish();
    assert!(router.pending.is_empty());
    assert_eq!(records(&router, "aborted"), 1);
    assert_eq!(records(&router, "recorded"), 1);
}

// ---------------------------------------------------------------------------------------------
// 9. Metadata merging across messages
// ---------------------------------------------------------------------------------------------

#[test]
fn metadata_is_merged_across_messages() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    // Headers: the subset hint, plus an unrelated key of the same namespace.
    let mut hint = subset_hint(list_value(&["127.0.0.1:18002", "127.0.0.1:18003"]));
    hint.filter_metadata
        .get_mut(SUBSET_NAMESPACE)
        .unwrap()
        .fields
        .insert("other".into(), string_value("1"));
    let r = s.handle(with_metadata(
        modes(
            headers("/v1/completions", false, &[("x-request-id", "mm")]),
            BUFFERED,
            STREAMED,
        ),
        hint,
    ));
    assert_continue_headers(&r[0]);
    // Body: another key of the same namespace and another namespace.
    let mut more = metadata(SUBSET_NAMESPACE, "later", string_value("2"));
    more.filter_metadata.insert(
        "com.example".into(),
        Struct {
            fields: HashMap::from([("k".to_string(), string_value("v"))]),
        },
    );
    let r = s.handle(with_metadata(
        body(&completion("m", &long_prompt("mm")), true),
        more,
    ));
    // The hint from the headers message still restricts the pick.
    assert_eq!(pick_set(&r), HashSet::from([addr(18002), addr(18003)]));
    let ns = &s.metadata[SUBSET_NAMESPACE].fields;
    assert!(ns.contains_key(SUBSET_KEY) && ns.contains_key("other") && ns.contains_key("later"));
    assert!(s.metadata.contains_key("com.example"));

    // Response phase: the served key arrives in a third message; later values win.
    s.handle(with_metadata(
        response_headers(200, None),
        metadata(LB_NAMESPACE, SERVED_KEY, string_value("127.0.0.1:18003")),
    ));
    assert_eq!(
        s.metadata[SUBSET_NAMESPACE].fields["other"],
        string_value("1")
    );
    s.handle(with_metadata(
        response_body(b"", true),
        metadata(SUBSET_NAMESPACE, "other", string_value("3")),
    ));
    assert_eq!(
        s.metadata[SUBSET_NAMESPACE].fields["other"],
        string_value("3")
    );
    assert!(s.metadata[SUBSET_NAMESPACE].fields.contains_key(SUBSET_KEY));
    assert!(entries(&router, addr(18003)) > 0);
    assert_eq!(total_entries(&router), entries(&router, addr(18003)));
}

#[test]
fn subset_hint_arriving_on_the_body_message_is_honoured() {
    let router = router();
    let mut s = StreamState::new(router.clone());
    s.handle(modes(
        headers("/v1/completions", false, &[]),
        BUFFERED,
        STREAMED,
    ));
    let r = s.handle(with_metadata(
        body(&completion("m", "hi"), true),
        subset_hint(list_value(&["127.0.0.1:18001"])),
    ));
    assert_eq!(pick_set(&r), HashSet::from([addr(18001)]));
}

#[test]
fn test_selection_bare_ip_intersects_a_port_specific_hint() {
    let router = test_selection_router();
    let r = route_with_hint(
        &router,
        Some(subset_hint(list_value(&[
            "127.0.0.1:18001",
            "127.0.0.1:18002",
        ]))),
        &[(TEST_SELECTION_HEADER, "127.0.0.1")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18001), addr(18002)]));
}

#[test]

fn bare_ip_subset_hint_intersects_a_port_specific_test_selection() {
    // The subset hint accepts a bare IP as "any port" (it alone routes to all three pods), and
    // the header alone restricts to 18002; together they must leave 18002, not nothing.
    let router = test_selection_router();
    let r = route_with_hint(
        &router,
        Some(subset_hint(string_value("127.0.0.1"))),
        &[(TEST_SELECTION_HEADER, "127.0.0.1:18002")],
    );
    assert_eq!(pick_set(&r), HashSet::from([addr(18002)]));
}

#[test]
fn destination_lists_primary_then_fallbacks() {
    let router = router();
    let ranked: Vec<_> = PORTS
        .iter()
        .rev()
        .map(|&p| endpoint(&router, addr(p)))
        .collect();
    assert_eq!(
        destination(&ranked),
        "127.0.0.1:18003,127.0.0.1:18002,127.0.0.1:18001"
    );
    let routed = router
        .route(
            "/v1/completions",
            Some(br#"{"model":"m","prompt":"x"}"#),
            None,
            false,
        )
        .unwrap();
    let d = destination(&routed.decision.ranked);
    assert_eq!(d.split(',').count(), 3);
    assert!(d.starts_with(&routed.decision.primary().host));
}
