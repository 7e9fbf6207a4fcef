//! ext_proc messages as Envoy sends them, and readers for the picker's replies.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use ep::processing_request::Request as In;
use ep::processing_response::Response as Out;
use ep::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration, body_mutation,
};
use serde_json::json;

use crate::envoy::wire::{
    DESTINATION_HEADER, LB_NAMESPACE, SUBSET_KEY, SUBSET_NAMESPACE, string_value,
};

// Envoy's BodySendMode values.
pub(crate) const NONE: i32 = 0;
pub(crate) const STREAMED: i32 = 1;
pub(crate) const BUFFERED: i32 = 2;
pub(crate) const BUFFERED_PARTIAL: i32 = 3;
pub(crate) const FULL_DUPLEX: i32 = 4;

// ---------------------------------------------------------------------------------------------
// Request builders
// ---------------------------------------------------------------------------------------------

pub(crate) fn hv(key: &str, value: &str) -> HeaderValue {
    // Envoy 1.40: bytes in `raw_value`, `value` empty.
    HeaderValue {
        key: key.to_string(),
        value: String::new(),
        raw_value: value.as_bytes().to_vec(),
    }
}

pub(crate) fn http_headers(list: Vec<HeaderValue>, eos: bool) -> HttpHeaders {
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
pub(crate) fn response_headers(status: u32, upstream_address: Option<&str>) -> ProcessingRequest {
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
pub(crate) fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
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
pub(crate) fn reply_lb_string(r: &ProcessingResponse, key: &str) -> Option<String> {
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
    reply_lb_string(r, DESTINATION_HEADER)
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

pub(crate) fn is_request_headers(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Out::RequestHeaders(_)))
}

pub(crate) fn is_request_body(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Out::RequestBody(_)))
}

/// A plain CONTINUE headers reply (no mutation, no metadata).
pub(crate) fn assert_continue_headers(r: &ProcessingResponse) {
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
pub(crate) fn assert_error(replies: &[ProcessingResponse], status: i32) -> String {
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
