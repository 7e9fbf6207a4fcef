//! What goes on the wire: the names prefix-picker and Envoy agree on (headers, metadata keys),
//! Envoy's body modes, the reply builders and the metadata readers the ext_proc stream and the
//! access log share.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use ep::processing_response::Response as Out;
use ep::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, ProcessingResponse,
    StreamedBodyResponse, body_mutation,
};

use crate::cached_tokens::Usage;
use crate::endpoints::AddressPattern;
use crate::endpoints::Endpoint;
use crate::scheduler::PickSummary;

pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// `envoy.lb` metadata key naming a routed request waiting in [`PendingRoutes`] (an issued,
/// unguessable key): an observer filter or an access-log entry claims its request by it.
///
/// [`PendingRoutes`]: crate::routing::PendingRoutes
pub const ROUTE_KEY: &str = "x-prefix-picker-route";
pub const LB_NAMESPACE: &str = "envoy.lb";
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// PD mode: the prefill pod paired with the decode pick, `host:port` (llm-d's decode-side
/// sidecar reads it); a client-supplied value never reaches a pod.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
pub const TEST_SELECTION_HEADER: &str = "test-epp-endpoint-selection";
pub const CONFORMANCE_SERVED_HEADER: &str = "x-conformance-test-served-endpoint";
/// The decision header (`picker.decisionHeader`, on the response) and the `envoy.lb` metadata
/// key (always, for the access record) carrying [`decision_value`].
pub const DECISION_HEADER: &str = "x-prefix-picker-decision";
/// The namespace of the request's token counts at completion: Envoy AI Gateway's
/// (`AIGatewayFilterMetadataNamespace`), so a rate limit or access log written for it reads the
/// picker's counts unchanged.
pub const COST_NAMESPACE: &str = "io.envoy.ai_gateway";
/// Prompt tokens (cached ones included), as AI Gateway's `InputToken` cost.
pub const INPUT_TOKEN_KEY: &str = "llm_input_token";
/// Prompt tokens the engine served from its prefix cache, as AI Gateway's `CachedInputToken`.
pub const CACHED_INPUT_TOKEN_KEY: &str = "llm_cached_input_token";
/// Completion tokens, as AI Gateway's `OutputToken` cost.
pub const OUTPUT_TOKEN_KEY: &str = "llm_output_token";
/// Prompt plus completion tokens, as AI Gateway's `TotalToken` cost.
pub const TOTAL_TOKEN_KEY: &str = "llm_total_token";
/// Largest body chunk sent back in FULL_DUPLEX_STREAMED mode (as the GIE reference picker).
pub const BODY_CHUNK: usize = 62_000;

/// Envoy's `ProcessingMode.BodySendMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyMode {
    None,
    Streamed,
    Buffered,
    BufferedPartial,
    FullDuplex,
}

impl BodyMode {
    pub(crate) fn from_i32(v: i32) -> BodyMode {
        match v {
            1 => BodyMode::Streamed,
            2 => BodyMode::Buffered,
            3 => BodyMode::BufferedPartial,
            4 => BodyMode::FullDuplex,
            _ => BodyMode::None,
        }
    }
}

/// How the request body ended: with `end_of_stream` on its last message, or with request
/// trailers after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    EndOfStream,
    Trailers,
}

/// A body reply that sends `body` on (FULL_DUPLEX_STREAMED mode: Envoy forwards what the
/// processor sends back).
pub fn streamed_body(body: Vec<u8>, end_of_stream: bool) -> BodyResponse {
    BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    }
}

/// A reply carrying `response` and nothing else.
pub fn reply(response: Out) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

pub(crate) fn header_value(h: &HeaderValue) -> std::borrow::Cow<'_, str> {
    if h.raw_value.is_empty() {
        std::borrow::Cow::Borrowed(h.value.as_str())
    } else {
        String::from_utf8_lossy(&h.raw_value)
    }
}

/// A header mutation that sets `key` to `value`, replacing any value it had.
pub fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// The pick's header mutation: [`DESTINATION_HEADER`] set to `destination`; in PD mode
/// [`PREFILLER_HEADER`] set to the prefill pod (every value of the header replaced), else
/// removed, so the header reaching a pod is always the picker's; `x-request-id` set when the
/// picker generated one.
pub(crate) fn pick_headers(
    destination: &str,
    prefill: Option<&str>,
    request_id: Option<&str>,
) -> HeaderMutation {
    let mut set_headers = vec![set_header(DESTINATION_HEADER, destination)];
    let mut remove_headers = vec![];
    match prefill {
        Some(host) => set_headers.push(set_header(PREFILLER_HEADER, host)),
        None => remove_headers.push(PREFILLER_HEADER.to_string()),
    }
    if let Some(id) = request_id {
        set_headers.push(set_header("x-request-id", id));
    }
    HeaderMutation {
        set_headers,
        remove_headers,
    }
}

pub(crate) fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// `ip:port[,ip:port...]`, primary first: the pick as Envoy reads it (header and metadata).
pub fn destination(ranked: &[Arc<Endpoint>]) -> String {
    ranked
        .iter()
        .map(|e| e.host.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": destination, "x-prefix-picker-decision":
/// decision}}`, plus the [`ROUTE_KEY`] of a route left for an observer stream or the access log.
pub(crate) fn lb_metadata(destination: &str, route_key: Option<&str>, decision: String) -> Struct {
    let mut fields = HashMap::from([
        (DESTINATION_HEADER.to_string(), string_value(destination)),
        (
            DECISION_HEADER.to_string(),
            Value {
                kind: Some(Kind::StringValue(decision)),
            },
        ),
    ]);
    if let Some(id) = route_key {
        fields.insert(ROUTE_KEY.to_string(), string_value(id));
    }
    namespace(LB_NAMESPACE, fields)
}

/// `{namespace: {fields}}`, as `dynamic_metadata` carries it.
fn namespace(namespace: &str, fields: HashMap<String, Value>) -> Struct {
    Struct {
        fields: HashMap::from([(
            namespace.to_string(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields })),
            },
        )]),
    }
}

/// The decision as one line: `pod=<namespace/name>; reason=<label>; matched_tokens=<n>;
/// uncached_tokens=<n>; queued_ms=<n>; request_id=<id>`. The token fields are the affinity
/// mode's estimates (absent in Kthena mode); `queued_ms` is the time in flow control's queue (0 when it did not queue);
/// `request_id` comes last and runs to the end of the value (it is the client's, when it sent
/// one).
pub fn decision_value(pick: &PickSummary, request_id: &str) -> String {
    use std::fmt::Write;
    let mut v = format!("pod={}; reason={}", pick.pod, pick.reason.as_str());
    if let Some(n) = pick.matched_tokens {
        let _ = write!(v, "; matched_tokens={n}");
    }
    if let Some(n) = pick.uncached_tokens {
        let _ = write!(v, "; uncached_tokens={n}");
    }
    let _ = write!(
        v,
        "; queued_ms={}; request_id={request_id}",
        pick.queued.as_millis()
    );
    v
}

/// The request's token counts at completion under [`COST_NAMESPACE`], as numbers (as AI
/// Gateway writes them): each count the response reported, the total when both prompt and
/// completion were; `None` when it reported none.
pub(crate) fn cost_metadata(usage: &Usage) -> Option<Struct> {
    if usage.is_empty() {
        return None;
    }
    let number = |n: u64| Value {
        kind: Some(Kind::NumberValue(n as f64)),
    };
    let total = usage
        .prompt_tokens
        .zip(usage.completion_tokens)
        .map(|(p, c)| p + c);
    let fields = [
        (INPUT_TOKEN_KEY, usage.prompt_tokens),
        (CACHED_INPUT_TOKEN_KEY, usage.cached_tokens),
        (OUTPUT_TOKEN_KEY, usage.completion_tokens),
        (TOTAL_TOKEN_KEY, total),
    ]
    .into_iter()
    .filter_map(|(key, n)| Some((key.to_string(), number(n?))))
    .collect();
    Some(namespace(COST_NAMESPACE, fields))
}

/// A FULL_DUPLEX_STREAMED request body sent back as `streamed_response` chunks. Only a body that
/// ended the stream is sent with `end_of_stream` on its last chunk (an empty one if need be);
/// when trailers follow, Envoy ends the stream with them (a body ending with `end_of_stream`
/// before the trailers left Envoy waiting for the request until `stream_idle_timeout`).
/// A body of one chunk (the usual case) is moved into its reply, not copied.
pub(crate) fn body_chunks(body: Vec<u8>, end: BodyEnd) -> Vec<ProcessingResponse> {
    let ends_stream = end == BodyEnd::EndOfStream;
    if body.len() <= BODY_CHUNK && (ends_stream || !body.is_empty()) {
        return vec![reply(Out::RequestBody(streamed_body(body, ends_stream)))];
    }
    let mut chunks: Vec<&[u8]> = body.chunks(BODY_CHUNK).collect();
    if chunks.is_empty() && end == BodyEnd::EndOfStream {
        chunks.push(&[]);
    }
    let last = chunks.len().saturating_sub(1);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let ends_stream = i == last && end == BodyEnd::EndOfStream;
            reply(Out::RequestBody(streamed_body(chunk.to_vec(), ends_stream)))
        })
        .collect()
}

/// The string at `key` in the `envoy.lb` namespace of `metadata`.
pub(crate) fn lb_string<'a>(metadata: &'a HashMap<String, Struct>, key: &str) -> Option<&'a str> {
    match metadata.get(LB_NAMESPACE)?.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

/// The `-served` key Envoy's `override_host` policy writes in `envoy.lb` metadata.
pub fn served_from_metadata(metadata: &HashMap<String, Struct>) -> Option<SocketAddr> {
    lb_string(metadata, SERVED_KEY)
        .and_then(AddressPattern::parse)
        .map(|p| p.addr())
}

/// The [`ROUTE_KEY`] in `envoy.lb` metadata.
pub fn route_key_from_metadata(metadata: &HashMap<String, Struct>) -> Option<&str> {
    lb_string(metadata, ROUTE_KEY)
}

/// The subset hint (`envoy.lb.subset_hint`: a list, or a comma-separated string) when the
/// metadata carries one; entries that do not parse are skipped (the list may end up empty).
pub(crate) fn read_subset_hint(metadata: &HashMap<String, Struct>) -> Option<Vec<AddressPattern>> {
    let value = metadata.get(SUBSET_NAMESPACE)?.fields.get(SUBSET_KEY)?;
    Some(match &value.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => AddressPattern::parse(s),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => AddressPattern::parse_list(s),
        _ => vec![],
    })
}

/// Merges a message's metadata into the stream's (fields of later messages win).
pub(crate) fn merge_metadata(into: &mut HashMap<String, Struct>, md: Metadata) {
    for (namespace, fields) in md.filter_metadata {
        into.entry(namespace)
            .or_default()
            .fields
            .extend(fields.fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(m: &HeaderMutation) -> Vec<(&str, &[u8])> {
        m.set_headers
            .iter()
            .filter_map(|o| o.header.as_ref())
            .map(|h| (h.key.as_str(), h.raw_value.as_slice()))
            .collect()
    }

    #[test]
    fn the_pick_sets_the_destination_and_removes_a_client_prefiller() {
        let m = pick_headers("10.0.0.1:8000,10.0.0.2:8000", None, None);
        assert_eq!(
            set(&m),
            [(DESTINATION_HEADER, &b"10.0.0.1:8000,10.0.0.2:8000"[..])]
        );
        assert_eq!(m.remove_headers, [PREFILLER_HEADER]);
        let overwrite = HeaderAppendAction::OverwriteIfExistsOrAdd as i32;
        assert!(m.set_headers.iter().all(|o| o.append_action == overwrite));
    }

    fn summary(matched: Option<u64>, uncached: Option<u64>) -> PickSummary {
        PickSummary {
            pod: "default/sim-a".into(),
            reason: crate::scheduler::DecisionReason::AffinityHit,
            matched_tokens: matched,
            uncached_tokens: uncached,
            queued: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn the_decision_value_names_pod_reason_tokens_queue_and_request_id() {
        assert_eq!(
            decision_value(&summary(Some(64), Some(12)), "req-1"),
            "pod=default/sim-a; reason=affinity_hit; matched_tokens=64; uncached_tokens=12; \
             queued_ms=0; request_id=req-1"
        );
        // Kthena mode: no token estimates.
        let mut kthena = summary(None, None);
        kthena.reason = crate::scheduler::DecisionReason::PrefixHit;
        assert_eq!(
            decision_value(&kthena, "a; b=c"),
            "pod=default/sim-a; reason=prefix_hit; queued_ms=0; request_id=a; b=c"
        );
    }

    fn fields(s: &Struct, namespace: &str) -> HashMap<String, Kind> {
        match &s.fields[namespace].kind {
            Some(Kind::StructValue(inner)) => inner
                .fields
                .iter()
                .map(|(k, v)| (k.clone(), v.kind.clone().unwrap()))
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_cost_is_ai_gateways_keys_as_numbers() {
        let usage = Usage {
            prompt_tokens: Some(900),
            completion_tokens: Some(5),
            cached_tokens: Some(768),
        };
        let md = cost_metadata(&usage).unwrap();
        assert_eq!(md.fields.len(), 1);
        let want = [
            ("llm_input_token", 900.0),
            ("llm_cached_input_token", 768.0),
            ("llm_output_token", 5.0),
            ("llm_total_token", 905.0),
        ]
        .map(|(k, n)| (k.to_string(), Kind::NumberValue(n)));
        assert_eq!(fields(&md, "io.envoy.ai_gateway"), HashMap::from(want));
        // Only what the response reported; nothing at all without a report.
        let partial = Usage {
            completion_tokens: Some(3),
            ..Usage::default()
        };
        let md = cost_metadata(&partial).unwrap();
        assert_eq!(
            fields(&md, COST_NAMESPACE),
            HashMap::from([(OUTPUT_TOKEN_KEY.to_string(), Kind::NumberValue(3.0))])
        );
        assert_eq!(cost_metadata(&Usage::default()), None);
    }

    #[test]
    fn the_lb_metadata_carries_the_decision() {
        let md = lb_metadata("10.0.0.1:8000", Some("k"), "pod=p".into());
        let f = fields(&md, LB_NAMESPACE);
        assert_eq!(f[DECISION_HEADER], Kind::StringValue("pod=p".into()));
        assert_eq!(f[ROUTE_KEY], Kind::StringValue("k".into()));
        assert_eq!(
            f[DESTINATION_HEADER],
            Kind::StringValue("10.0.0.1:8000".into())
        );
    }

    #[test]
    fn in_pd_mode_the_prefiller_is_set_and_a_generated_request_id_too() {
        let m = pick_headers("10.0.0.1:8000", Some("10.0.0.9:8000"), Some("id-1"));
        assert_eq!(
            set(&m),
            [
                (DESTINATION_HEADER, &b"10.0.0.1:8000"[..]),
                (PREFILLER_HEADER, &b"10.0.0.9:8000"[..]),
                ("x-request-id", &b"id-1"[..]),
            ]
        );
        assert!(m.remove_headers.is_empty());
    }
}
