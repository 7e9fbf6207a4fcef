//! A no-op Envoy external processor: the baseline row of `prefix-bench overhead`, so Envoy's own
//! ext_proc cost can be told apart from what prefix-picker adds.
//!
//! Every message is answered at once with the empty (CONTINUE, no mutation) response of its phase:
//! request/response headers -> `HeadersResponse`, bodies -> `BodyResponse`, trailers ->
//! `TrailersResponse`. A message without a phase gets no answer. In `FULL_DUPLEX_STREAMED` body
//! modes, where Envoy waits for the processor to send the body back, the request headers'
//! reply is held until the request body ends and then sent with the whole body as one
//! `streamed_response` (as the picker does, which needs the body to pick), and each response
//! body chunk is echoed at once. It mirrors the picker's protocol shape and nothing else:
//! streams in `observability_mode` (the observer filter of `envoy/envoy-observer.yaml`) are
//! never answered, since Envoy discards those replies, and a stream ends from this side once
//! the response has ended (body `end_of_stream` or response trailers), since Envoy would
//! otherwise hold an observer stream open for 5 s more. Without the picker's
//! `envoy.lb` metadata, the `override_host` policy falls back to round robin.
//!
//! It also serves Envoy's gRPC access-log service, reading and dropping every entry, so setups
//! that learn completions from the access log (`envoy/envoy.yaml`) have their baseline too.
//!
//! The stream is generic over [`Routing`]: the no-op's is `()`, which does nothing (and compiles
//! to nothing); the routing floor ([`crate::routing_floor`]) speaks this very protocol and adds
//! a pick per request and a record per completion through it.
//!
//! Runs as `prefix-bench noop-ext-proc --grpc-addr 127.0.0.1:0` (its own process, like the
//! picker) and logs `grpc_addr=<bound address>` to stderr once it accepts streams.

use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::{
    AccessLogService, AccessLogServiceServer,
};
use envoy_types::pb::envoy::service::accesslog::v3::{
    StreamAccessLogsMessage, StreamAccessLogsResponse,
};
use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::google::protobuf::Struct;
use ep::external_processor_server::ExternalProcessor;
use ep::processing_request::Request as In;
use ep::processing_response::Response as Out;
use ep::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ProcessingRequest,
    ProcessingResponse, TrailersResponse,
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

use prefix_picker::envoy::{
    ReplyStream, StreamHandler, drive_stream, ext_proc_server, reply, streamed_body,
};

/// The no-op ext_proc service.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopExtProc;

/// What one message calls for.
#[derive(Debug, PartialEq)]
struct Step {
    reply: Option<ProcessingResponse>,
    /// The response has ended: nothing more will come that needs an answer.
    last: bool,
}

/// The empty reply for `message`'s phase.
fn step(message: ProcessingRequest) -> Step {
    let (out, last) = match message.request {
        Some(In::RequestHeaders(_)) => (Out::RequestHeaders(HeadersResponse::default()), false),
        Some(In::RequestBody(_)) => (Out::RequestBody(BodyResponse::default()), false),
        Some(In::RequestTrailers(_)) => (Out::RequestTrailers(TrailersResponse::default()), false),
        Some(In::ResponseHeaders(h)) => (
            Out::ResponseHeaders(HeadersResponse::default()),
            h.end_of_stream,
        ),
        Some(In::ResponseBody(b)) => (Out::ResponseBody(BodyResponse::default()), b.end_of_stream),
        Some(In::ResponseTrailers(_)) => (Out::ResponseTrailers(TrailersResponse::default()), true),
        None => {
            return Step {
                reply: None,
                last: false,
            };
        }
    };
    let reply = (!message.observability_mode).then(|| ProcessingResponse {
        response: Some(out),
        ..ProcessingResponse::default()
    });
    Step { reply, last }
}

/// `ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED`.
pub const FULL_DUPLEX_STREAMED: i32 = 4;

/// What a processor built on this protocol does beyond answering each phase: nothing for the
/// no-op (`()`); a pick per request and a record per completion for the routing floor.
pub trait Routing: Send + 'static {
    /// Sees every message before it is answered (headers, attributes, protocol config).
    fn observe(&mut self, message: &ProcessingRequest);
    /// The request body is whole: the pick the reply that releases the request carries
    /// (`None`: that reply mutates nothing).
    fn pick(&mut self, body: &[u8]) -> Option<Pick>;
    /// The response has ended (its body's `end_of_stream`, or its trailers).
    fn response_ended(&mut self);
}

/// A pick as the releasing reply carries it: a header mutation and `envoy.lb` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub headers: HeaderMutation,
    pub metadata: Struct,
}

impl Routing for () {
    fn observe(&mut self, _: &ProcessingRequest) {}

    fn pick(&mut self, _: &[u8]) -> Option<Pick> {
        None
    }

    fn response_ended(&mut self) {}
}

/// The request headers' reply that releases a FULL_DUPLEX request: empty, or with the pick
/// (the picker's shape: header mutation, `clear_route_cache`, dynamic metadata).
fn released_headers(pick: Option<Pick>) -> ProcessingResponse {
    let Some(pick) = pick else {
        return reply(Out::RequestHeaders(HeadersResponse::default()));
    };
    ProcessingResponse {
        response: Some(Out::RequestHeaders(HeadersResponse {
            response: Some(picked(pick.headers)),
        })),
        dynamic_metadata: Some(pick.metadata),
        ..ProcessingResponse::default()
    }
}

fn picked(headers: HeaderMutation) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(headers),
        clear_route_cache: true,
        ..CommonResponse::default()
    }
}

/// One stream of the no-op processor (or of a processor built on it, `R`): answers each phase,
/// done once the response has ended.
#[derive(Debug, Default)]
pub struct NoopStream<R = ()> {
    ended: bool,
    request_full_duplex: bool,
    response_full_duplex: bool,
    /// FULL_DUPLEX request: the headers are not answered yet; the body so far.
    held_body: Option<Vec<u8>>,
    routing: R,
}

impl<R: Routing> NoopStream<R> {
    /// A stream that does what `routing` does beyond the protocol.
    pub fn new(routing: R) -> NoopStream<R> {
        NoopStream {
            ended: false,
            request_full_duplex: false,
            response_full_duplex: false,
            held_body: None,
            routing,
        }
    }

    /// The FULL_DUPLEX exchanges; `None` for messages answered as in the other modes.
    fn full_duplex(&mut self, message: &mut ProcessingRequest) -> Option<Vec<ProcessingResponse>> {
        match message.request.as_mut()? {
            In::RequestHeaders(h) if self.request_full_duplex && !h.end_of_stream => {
                self.held_body = Some(Vec::new());
                Some(vec![])
            }
            In::RequestBody(b) if self.held_body.is_some() => {
                let held = self.held_body.as_mut()?;
                held.append(&mut b.body);
                if !b.end_of_stream {
                    return Some(vec![]);
                }
                let body = self.held_body.take().unwrap_or_default();
                Some(vec![
                    released_headers(self.routing.pick(&body)),
                    reply(Out::RequestBody(streamed_body(body, true))),
                ])
            }
            In::RequestTrailers(_) if self.held_body.is_some() => {
                // The body ended with trailers instead of `end_of_stream`.
                let body = self.held_body.take().unwrap_or_default();
                Some(vec![
                    released_headers(self.routing.pick(&body)),
                    reply(Out::RequestBody(streamed_body(body, false))),
                    reply(Out::RequestTrailers(TrailersResponse::default())),
                ])
            }
            In::ResponseBody(b) if self.response_full_duplex => {
                self.ended |= b.end_of_stream;
                let body = std::mem::take(&mut b.body);
                Some(vec![reply(Out::ResponseBody(streamed_body(
                    body,
                    b.end_of_stream,
                )))])
            }
            _ => None,
        }
    }

    /// The replies to `message`, by the protocol alone (the pick included).
    fn answer(&mut self, mut message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if !message.observability_mode
            && let Some(replies) = self.full_duplex(&mut message)
        {
            return replies;
        }
        // A whole body in another mode (BUFFERED): its reply carries the pick.
        let pick = match &message.request {
            Some(In::RequestBody(b)) if !message.observability_mode && b.end_of_stream => {
                self.routing.pick(&b.body)
            }
            _ => None,
        };
        let Step { mut reply, last } = step(message);
        self.ended |= last;
        if let (Some(pick), Some(r)) = (pick, reply.as_mut())
            && let Some(Out::RequestBody(b)) = r.response.as_mut()
        {
            b.response = Some(picked(pick.headers));
            r.dynamic_metadata = Some(pick.metadata);
        }
        reply.into_iter().collect()
    }
}

impl<R: Routing> StreamHandler for NoopStream<R> {
    fn replies(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(pc) = &message.protocol_config {
            self.request_full_duplex = pc.request_body_mode == FULL_DUPLEX_STREAMED;
            self.response_full_duplex = pc.response_body_mode == FULL_DUPLEX_STREAMED;
        }
        self.routing.observe(&message);
        let was_ended = self.ended;
        let replies = self.answer(message);
        if self.ended && !was_ended {
            self.routing.response_ended();
        }
        replies
    }

    fn done(&self) -> bool {
        self.ended
    }
}

#[tonic::async_trait]
impl ExternalProcessor for NoopExtProc {
    type ProcessStream = ReplyStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        // The picker's own stream driver: the same per-stream cost.
        Ok(Response::new(drive_stream(
            request.into_inner(),
            NoopStream::<()>::default(),
        )))
    }
}

/// The access-log service of the baseline: reads every message, keeps nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopAccessLog;

#[tonic::async_trait]
impl AccessLogService for NoopAccessLog {
    async fn stream_access_logs(
        &self,
        request: Request<Streaming<StreamAccessLogsMessage>>,
    ) -> Result<Response<StreamAccessLogsResponse>, Status> {
        let mut stream = request.into_inner();
        while stream.message().await?.is_some() {}
        Ok(Response::new(StreamAccessLogsResponse {}))
    }
}

/// Serves the no-op processor on `listener` until the process ends.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    serve_processor(listener, NoopExtProc, NoopAccessLog).await
}

/// Serves an ext_proc processor and its access-log sink on `listener` until the process ends,
/// as the picker serves its own (the message limits of [`ext_proc_server`], no Nagle).
pub async fn serve_processor<P: ExternalProcessor, L: AccessLogService>(
    listener: TcpListener,
    processor: P,
    access_log: L,
) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .add_service(ext_proc_server(processor))
        .add_service(AccessLogServiceServer::new(access_log))
        // Envoy waits on every reply: never let Nagle + delayed ACK add 40 ms.
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ep::{BodyMutation, HttpBody, HttpHeaders, HttpTrailers, body_mutation};

    fn request(r: In, observability_mode: bool) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(r),
            observability_mode,
            ..ProcessingRequest::default()
        }
    }

    #[test]
    fn each_phase_gets_its_own_empty_reply() {
        let eos_body = HttpBody {
            end_of_stream: true,
            ..HttpBody::default()
        };
        let cases = [
            (
                In::RequestHeaders(HttpHeaders::default()),
                Out::RequestHeaders(HeadersResponse::default()),
                false,
            ),
            (
                In::RequestBody(HttpBody::default()),
                Out::RequestBody(BodyResponse::default()),
                false,
            ),
            (
                In::RequestTrailers(HttpTrailers::default()),
                Out::RequestTrailers(TrailersResponse::default()),
                false,
            ),
            (
                In::ResponseHeaders(HttpHeaders::default()),
                Out::ResponseHeaders(HeadersResponse::default()),
                false,
            ),
            (
                In::ResponseBody(HttpBody::default()),
                Out::ResponseBody(BodyResponse::default()),
                false,
            ),
            (
                In::ResponseBody(eos_body),
                Out::ResponseBody(BodyResponse::default()),
                true,
            ),
            (
                In::ResponseTrailers(HttpTrailers::default()),
                Out::ResponseTrailers(TrailersResponse::default()),
                true,
            ),
        ];
        for (phase, out, last) in cases {
            let s = step(request(phase.clone(), false));
            assert_eq!(
                s,
                Step {
                    reply: Some(ProcessingResponse {
                        response: Some(out.clone()),
                        ..ProcessingResponse::default()
                    }),
                    last,
                },
                "{phase:?}"
            );
            // The observer is never answered, but its stream still ends with the response.
            let s = step(request(phase, true));
            assert_eq!((s.reply, s.last), (None, last));
        }
    }

    fn full_duplex(mut r: ProcessingRequest) -> ProcessingRequest {
        r.protocol_config = Some(ep::ProtocolConfiguration {
            request_body_mode: FULL_DUPLEX_STREAMED,
            response_body_mode: FULL_DUPLEX_STREAMED,
            ..ep::ProtocolConfiguration::default()
        });
        r
    }

    fn body(bytes: &[u8], end_of_stream: bool) -> HttpBody {
        HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        }
    }

    fn streamed_of(r: &ProcessingResponse) -> (&[u8], bool) {
        let (Some(Out::RequestBody(b)) | Some(Out::ResponseBody(b))) = &r.response else {
            panic!("not a body reply: {r:?}");
        };
        match b.response.as_ref().and_then(|c| c.body_mutation.as_ref()) {
            Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(s)),
            }) => (&s.body, s.end_of_stream),
            other => panic!("not a streamed response: {other:?}"),
        }
    }

    #[test]
    fn full_duplex_request_is_answered_at_its_end_with_the_body_sent_back() {
        let mut s = NoopStream::<()>::default();
        let headers = In::RequestHeaders(HttpHeaders::default());
        assert!(s.replies(full_duplex(request(headers, false))).is_empty());
        assert!(
            s.replies(request(In::RequestBody(body(b"abc", false)), false))
                .is_empty()
        );
        let r = s.replies(request(In::RequestBody(body(b"def", true)), false));
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].response,
            Some(Out::RequestHeaders(HeadersResponse::default()))
        );
        assert_eq!(streamed_of(&r[1]), (&b"abcdef"[..], true));
        // Response chunks are echoed at once; the last one ends the stream.
        let r = s.replies(request(
            In::ResponseBody(body(b"data: x\n\n", false)),
            false,
        ));
        assert_eq!(streamed_of(&r[0]), (&b"data: x\n\n"[..], false));
        assert!(!s.done());
        let r = s.replies(request(In::ResponseBody(body(b"", true)), false));
        assert_eq!(streamed_of(&r[0]), (&b""[..], true));
        assert!(s.done());
    }

    #[test]
    fn full_duplex_request_ended_by_trailers() {
        let mut s = NoopStream::<()>::default();
        s.replies(full_duplex(request(
            In::RequestHeaders(HttpHeaders::default()),
            false,
        )));
        s.replies(request(In::RequestBody(body(b"abc", false)), false));
        let r = s.replies(request(In::RequestTrailers(HttpTrailers::default()), false));
        assert_eq!(r.len(), 3);
        assert_eq!(streamed_of(&r[1]), (&b"abc"[..], false));
        assert_eq!(
            r[2].response,
            Some(Out::RequestTrailers(TrailersResponse::default()))
        );
    }

    #[test]
    fn full_duplex_header_only_request_is_answered_at_once() {
        let mut s = NoopStream::<()>::default();
        let headers = In::RequestHeaders(HttpHeaders {
            end_of_stream: true,
            ..HttpHeaders::default()
        });
        let r = s.replies(full_duplex(request(headers, false)));
        assert_eq!(
            r[0].response,
            Some(Out::RequestHeaders(HeadersResponse::default()))
        );
    }

    /// A routing that picks "pod" for every body and counts the responses ended.
    #[derive(Debug, Default)]
    struct Fixed {
        bodies: Vec<Vec<u8>>,
        ended: usize,
    }

    impl Routing for Fixed {
        fn observe(&mut self, _: &ProcessingRequest) {}

        fn pick(&mut self, body: &[u8]) -> Option<Pick> {
            self.bodies.push(body.to_vec());
            Some(Pick {
                headers: HeaderMutation {
                    remove_headers: vec!["pod".into()],
                    ..HeaderMutation::default()
                },
                metadata: Struct::default(),
            })
        }

        fn response_ended(&mut self) {
            self.ended += 1;
        }
    }

    fn carries_the_pick(r: &ProcessingResponse) -> bool {
        let common = match &r.response {
            Some(Out::RequestHeaders(h)) => h.response.as_ref(),
            Some(Out::RequestBody(b)) => b.response.as_ref(),
            _ => None,
        };
        common.is_some_and(|c| {
            c.clear_route_cache && c.header_mutation.as_ref().unwrap().remove_headers == ["pod"]
        }) && r.dynamic_metadata.is_some()
    }

    #[test]
    fn the_reply_that_releases_the_request_carries_the_pick_in_every_mode() {
        // FULL_DUPLEX: the held headers' reply, once the body is whole.
        let mut s = NoopStream::new(Fixed::default());
        let headers = In::RequestHeaders(HttpHeaders::default());
        s.replies(full_duplex(request(headers, false)));
        s.replies(request(In::RequestBody(body(b"ab", false)), false));
        let r = s.replies(request(In::RequestBody(body(b"c", true)), false));
        assert!(carries_the_pick(&r[0]) && !carries_the_pick(&r[1]), "{r:?}");
        assert_eq!(s.routing.bodies, [b"abc".to_vec()]);
        s.replies(request(In::ResponseBody(body(b"x", true)), false));
        s.replies(request(In::ResponseBody(body(b"", true)), false));
        assert_eq!(s.routing.ended, 1);
        // BUFFERED: the body's reply; an observer's body is neither picked nor answered.
        let mut s = NoopStream::new(Fixed::default());
        let r = s.replies(request(In::RequestHeaders(HttpHeaders::default()), false));
        assert!(!carries_the_pick(&r[0]));
        let r = s.replies(request(In::RequestBody(body(b"abc", true)), false));
        assert!(carries_the_pick(&r[0]), "{r:?}");
        assert!(
            s.replies(request(In::RequestBody(body(b"d", true)), true))
                .is_empty()
        );
        assert_eq!(s.routing.bodies, [b"abc".to_vec()]);
        s.replies(request(
            In::ResponseTrailers(HttpTrailers::default()),
            false,
        ));
        assert_eq!(s.routing.ended, 1);
    }

    #[test]
    fn a_message_without_a_phase_gets_no_reply() {
        assert_eq!(
            step(ProcessingRequest::default()),
            Step {
                reply: None,
                last: false
            }
        );
    }
}
