//! The routing floor behind Envoy: the no-op's ext_proc protocol and stream driver
//! ([`NoopStream`]) with the floor's [`Routing`] in it, and an access-log service that ends the
//! routes Envoy reports there.
//!
//! A stream learns the request's `:path` from its headers and routes at the body's end; the pick
//! goes in the reply that releases the request, as the picker's does: the
//! `x-gateway-destination-endpoint` header set (and `x-prefiller-host-port` removed),
//! `clear_route_cache`, and `envoy.lb` metadata naming the pick. When the stream sees the
//! response (a response body mode other than `NONE`), the response headers give the status and
//! `upstream.address`, and the response's end completes the route; otherwise (`envoy/envoy.yaml`)
//! the route waits under a key sent in `envoy.lb` metadata (`x-prefix-picker-route`), which
//! Envoy copies into its access-log entry: the entry's `response_code` and
//! `upstream_remote_address` complete it. Runs as `prefix-bench routing-floor --config FILE
//! --grpc-addr 127.0.0.1:0` and logs `grpc_addr=<bound address>` once it accepts streams.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{Address, address, socket_address};
use envoy_types::pb::envoy::data::accesslog::v3::HttpAccessLogEntry;
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::AccessLogService;
use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::LogEntries;
use envoy_types::pb::envoy::service::accesslog::v3::{
    StreamAccessLogsMessage, StreamAccessLogsResponse,
};
use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use ep::external_processor_server::ExternalProcessor;
use ep::processing_request::Request as In;
use ep::{HeaderMutation, HttpHeaders, ProcessingRequest};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

use super::{FloorTicket, RoutingFloor};
use crate::noop_ext_proc::{NoopStream, Pick, Routing, serve_processor};
use prefix_picker::envoy::wire::{
    DESTINATION_HEADER, LB_NAMESPACE, PREFILLER_HEADER, ROUTE_KEY, set_header,
};
use prefix_picker::envoy::{ReplyStream, drive_stream};

/// One stream's routing: what it read of the request and response, and its route.
#[derive(Debug)]
pub struct FloorStream {
    floor: Arc<RoutingFloor>,
    path: String,
    /// The stream sees the response (else the access log completes the route).
    sees_response: bool,
    status: Option<u32>,
    served: Option<SocketAddr>,
    ticket: Option<FloorTicket>,
}

impl FloorStream {
    pub fn new(floor: Arc<RoutingFloor>) -> FloorStream {
        FloorStream {
            floor,
            path: String::new(),
            sees_response: false,
            status: None,
            served: None,
            ticket: None,
        }
    }
}

impl Routing for FloorStream {
    fn observe(&mut self, message: &ProcessingRequest) {
        if let Some(pc) = &message.protocol_config {
            // `BodySendMode.NONE` is 0: the response is not sent to this stream.
            self.sees_response = pc.response_body_mode != 0;
        }
        match &message.request {
            Some(In::RequestHeaders(h)) => {
                if let Some(path) = header(h, ":path") {
                    self.path = path;
                }
            }
            Some(In::ResponseHeaders(h)) => {
                self.status = header(h, ":status").and_then(|s| s.parse().ok());
                self.served = upstream_address(&message.attributes);
            }
            _ => {}
        }
    }

    fn pick(&mut self, body: &[u8]) -> Option<Pick> {
        let route = self.floor.route(&self.path, body)?;
        let key = if self.sees_response {
            self.ticket = Some(route.ticket);
            None
        } else {
            Some(self.floor.park(route.ticket))
        };
        Some(Pick {
            headers: HeaderMutation {
                set_headers: vec![set_header(DESTINATION_HEADER, &route.destination)],
                remove_headers: vec![PREFILLER_HEADER.to_string()],
            },
            metadata: lb_metadata(&route.destination, key),
        })
    }

    fn response_ended(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.floor.complete(ticket, self.status, self.served);
        }
    }
}

/// The value of header `key`, if present.
fn header(h: &HttpHeaders, key: &str) -> Option<String> {
    let hv = h
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|hv| hv.key == key)?;
    Some(if hv.raw_value.is_empty() {
        hv.value.clone()
    } else {
        String::from_utf8_lossy(&hv.raw_value).into_owned()
    })
}

/// `upstream.address` among the response attributes.
fn upstream_address(attributes: &HashMap<String, Struct>) -> Option<SocketAddr> {
    attributes
        .values()
        .filter_map(|s| s.fields.get("upstream.address"))
        .find_map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => s.parse().ok(),
            _ => None,
        })
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": destination[, "x-prefix-picker-route":
/// key]}}`, as the picker sends it.
fn lb_metadata(destination: &str, key: Option<String>) -> Struct {
    let mut fields = HashMap::from([(
        DESTINATION_HEADER.to_string(),
        string_value(destination.to_string()),
    )]);
    if let Some(key) = key {
        fields.insert(ROUTE_KEY.to_string(), string_value(key));
    }
    Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields })),
            },
        )]),
    }
}

/// The floor's ext_proc service.
#[derive(Debug, Clone)]
pub struct FloorExtProc(pub Arc<RoutingFloor>);

#[tonic::async_trait]
impl ExternalProcessor for FloorExtProc {
    type ProcessStream = ReplyStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let stream = NoopStream::new(FloorStream::new(self.0.clone()));
        Ok(Response::new(drive_stream(request.into_inner(), stream)))
    }
}

/// The floor's access-log service: each entry naming a parked route completes it.
#[derive(Debug, Clone)]
pub struct FloorAccessLog(pub Arc<RoutingFloor>);

impl FloorAccessLog {
    /// Completes the route `entry` names, if one waits under its key.
    pub fn on_entry(&self, entry: HttpAccessLogEntry) {
        let common = entry.common_properties.unwrap_or_default();
        let key = common
            .metadata
            .as_ref()
            .and_then(|m| m.filter_metadata.get(LB_NAMESPACE))
            .and_then(|s| s.fields.get(ROUTE_KEY))
            .and_then(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.as_str()),
                _ => None,
            });
        let Some(ticket) = key.and_then(|k| self.0.claim(k)) else {
            return;
        };
        let status = entry
            .response
            .and_then(|r| r.response_code)
            .map(|c| c.value);
        let served = common
            .upstream_remote_address
            .as_ref()
            .and_then(socket_addr);
        self.0.complete(ticket, status, served);
    }
}

fn socket_addr(a: &Address) -> Option<SocketAddr> {
    let Some(address::Address::SocketAddress(s)) = &a.address else {
        return None;
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = s.port_specifier else {
        return None;
    };
    Some(SocketAddr::new(
        s.address.parse().ok()?,
        u16::try_from(port).ok()?,
    ))
}

#[tonic::async_trait]
impl AccessLogService for FloorAccessLog {
    async fn stream_access_logs(
        &self,
        request: Request<Streaming<StreamAccessLogsMessage>>,
    ) -> Result<Response<StreamAccessLogsResponse>, Status> {
        let mut stream = request.into_inner();
        while let Some(message) = stream.message().await? {
            if let Some(LogEntries::HttpLogs(logs)) = message.log_entries {
                for entry in logs.log_entry {
                    self.on_entry(entry);
                }
            }
        }
        Ok(Response::new(StreamAccessLogsResponse {}))
    }
}

/// Serves the floor on `listener` until the process ends.
pub async fn serve(listener: TcpListener, floor: Arc<RoutingFloor>) -> anyhow::Result<()> {
    serve_processor(listener, FloorExtProc(floor.clone()), FloorAccessLog(floor)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noop_ext_proc::FULL_DUPLEX_STREAMED;
    use envoy_types::pb::envoy::config::core::v3::{
        HeaderMap, HeaderValue, Metadata, SocketAddress,
    };
    use envoy_types::pb::envoy::data::accesslog::v3::AccessLogCommon;
    use envoy_types::pb::envoy::data::accesslog::v3::HttpResponseProperties;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use ep::processing_response::Response as Out;
    use ep::{HttpBody, ProcessingResponse, ProtocolConfiguration};
    use prefix_picker::envoy::StreamHandler;

    fn floor() -> Arc<RoutingFloor> {
        Arc::new(
            RoutingFloor::from_config(
                "endpoints:\n\
                 - {name: a, address: \"127.0.0.1:8001\"}\n\
                 - {name: b, address: \"127.0.0.1:8002\"}\n\
                 picker: {affinity: {}}\n",
            )
            .unwrap(),
        )
    }

    const BODY: &[u8] = br#"{"model":"m","prompt":"a prompt long enough to fill a block or two of the chain, a prompt long enough to fill a block or two of the chain"}"#;

    fn headers(pairs: &[(&str, &str)]) -> HttpHeaders {
        HttpHeaders {
            headers: Some(HeaderMap {
                headers: pairs
                    .iter()
                    .map(|(k, v)| HeaderValue {
                        key: k.to_string(),
                        raw_value: v.as_bytes().to_vec(),
                        ..HeaderValue::default()
                    })
                    .collect(),
            }),
            ..HttpHeaders::default()
        }
    }

    fn message(r: In) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(r),
            ..ProcessingRequest::default()
        }
    }

    /// Request headers and body on a FULL_DUPLEX stream (response body mode `response_mode`);
    /// the reply that releases the request.
    fn route(stream: &mut NoopStream<FloorStream>, response_mode: i32) -> ProcessingResponse {
        let mut first = message(In::RequestHeaders(headers(&[(":path", "/v1/completions")])));
        first.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: FULL_DUPLEX_STREAMED,
            response_body_mode: response_mode,
            ..ProtocolConfiguration::default()
        });
        assert!(stream.replies(first).is_empty());
        let body = HttpBody {
            body: BODY.to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        };
        let mut replies = stream.replies(message(In::RequestBody(body)));
        assert_eq!(replies.len(), 2, "{replies:?}");
        replies.remove(0)
    }

    /// The pick's header value and its `envoy.lb` metadata fields.
    fn pick_of(reply: &ProcessingResponse) -> (String, HashMap<String, Value>) {
        let Some(Out::RequestHeaders(h)) = &reply.response else {
            panic!("not the headers reply: {reply:?}");
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let mutation = common.header_mutation.as_ref().unwrap();
        let set = mutation.set_headers[0].header.as_ref().unwrap();
        assert_eq!(set.key, DESTINATION_HEADER);
        assert_eq!(mutation.remove_headers, [PREFILLER_HEADER]);
        let lb = &reply.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(fields)) = &lb.kind else {
            panic!("envoy.lb is not a struct");
        };
        let value = String::from_utf8(set.raw_value.clone()).unwrap();
        (value, fields.fields.clone())
    }

    fn string(v: &Value) -> &str {
        match &v.kind {
            Some(Kind::StringValue(s)) => s,
            other => panic!("not a string: {other:?}"),
        }
    }

    #[test]
    fn a_stream_that_sees_the_response_records_for_the_pod_that_served() {
        let floor = floor();
        let mut stream = NoopStream::new(FloorStream::new(floor.clone()));
        let (destination, lb) = pick_of(&route(&mut stream, FULL_DUPLEX_STREAMED));
        assert_eq!(string(&lb[DESTINATION_HEADER]), destination);
        assert!(!lb.contains_key(ROUTE_KEY));
        let primary = destination.split(',').next().unwrap();
        let other = if primary.ends_with("8001") {
            "127.0.0.1:8002"
        } else {
            "127.0.0.1:8001"
        };
        let mut response = message(In::ResponseHeaders(headers(&[(":status", "200")])));
        response.attributes = HashMap::from([(
            "envoy.filters.http.ext_proc".to_string(),
            Struct {
                fields: HashMap::from([(
                    "upstream.address".to_string(),
                    string_value(other.to_string()),
                )]),
            },
        )]);
        stream.replies(response);
        assert!(!stream.done());
        stream.replies(message(In::ResponseBody(HttpBody {
            end_of_stream: true,
            ..HttpBody::default()
        })));
        assert!(stream.done());
        assert!(floor.inflight().iter().all(|(_, n)| *n == 0));
        // Recorded for the pod that served: the same prompt goes there next.
        let mut next = NoopStream::new(FloorStream::new(floor.clone()));
        let (destination, _) = pick_of(&route(&mut next, FULL_DUPLEX_STREAMED));
        assert!(destination.starts_with(other), "{destination}");
    }

    #[test]
    fn without_the_response_the_access_log_entry_completes_the_route() {
        let floor = floor();
        let mut stream = NoopStream::new(FloorStream::new(floor.clone()));
        let (destination, lb) = pick_of(&route(&mut stream, 0));
        let key = string(&lb[ROUTE_KEY]).to_string();
        drop(stream);
        assert_eq!(floor.inflight().iter().map(|(_, n)| n).sum::<i64>(), 1);
        let primary: SocketAddr = destination.split(',').next().unwrap().parse().unwrap();
        let entry = HttpAccessLogEntry {
            common_properties: Some(AccessLogCommon {
                metadata: Some(Metadata {
                    filter_metadata: HashMap::from([(
                        LB_NAMESPACE.to_string(),
                        Struct {
                            fields: HashMap::from([(ROUTE_KEY.to_string(), string_value(key))]),
                        },
                    )]),
                    ..Metadata::default()
                }),
                upstream_remote_address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: primary.ip().to_string(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            primary.port(),
                        ))),
                        ..SocketAddress::default()
                    })),
                }),
                ..AccessLogCommon::default()
            }),
            response: Some(HttpResponseProperties {
                response_code: Some(UInt32Value { value: 200 }),
                ..HttpResponseProperties::default()
            }),
            ..HttpAccessLogEntry::default()
        };
        FloorAccessLog(floor.clone()).on_entry(entry);
        assert!(floor.inflight().iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn an_unroutable_request_is_released_without_a_pick() {
        let mut stream = NoopStream::new(FloorStream::new(floor()));
        let mut first = message(In::RequestHeaders(headers(&[(":path", "/v1/models")])));
        first.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: FULL_DUPLEX_STREAMED,
            ..ProtocolConfiguration::default()
        });
        stream.replies(first);
        let replies = stream.replies(message(In::RequestBody(HttpBody {
            body: b"{}".to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        })));
        assert_eq!(
            replies[0].response,
            Some(Out::RequestHeaders(ep::HeadersResponse::default()))
        );
        assert_eq!(replies[0].dynamic_metadata, None);
    }
}
