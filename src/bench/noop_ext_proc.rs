//! A no-op Envoy external processor: the baseline row of `prefix-bench overhead`, so Envoy's own
//! ext_proc cost can be told apart from what prefix-picker adds.
//!
//! Every message is answered at once with the empty (CONTINUE, no mutation) response of its phase:
//! request/response headers -> `HeadersResponse`, bodies -> `BodyResponse`, trailers ->
//! `TrailersResponse`. A message without a phase gets no answer. It mirrors the picker's protocol
//! shape and nothing else: streams in `observability_mode` (the observer filter of
//! `envoy/envoy.yaml`) are never answered, since Envoy discards those replies, and a stream ends
//! from this side once the response has ended (body `end_of_stream` or response trailers), since
//! Envoy would otherwise hold an observer stream open for 5 s more. Without the picker's
//! `envoy.lb` metadata, the `override_host` policy falls back to round robin.
//!
//! Runs as `prefix-bench noop-ext-proc --grpc-addr 127.0.0.1:0` (its own process, like the
//! picker) and logs `grpc_addr=<bound address>` to stderr once it accepts streams.

use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use ep::external_processor_server::ExternalProcessor;
use ep::processing_request::Request as In;
use ep::processing_response::Response as Out;
use ep::{BodyResponse, HeadersResponse, ProcessingRequest, ProcessingResponse, TrailersResponse};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

use crate::extproc::{ReplyStream, StreamHandler, drive_stream, ext_proc_server};

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

/// One stream of the no-op processor: answers each phase, done once the response has ended.
#[derive(Debug, Default)]
struct NoopStream {
    ended: bool,
}

impl StreamHandler for NoopStream {
    fn replies(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        let Step { reply, last } = step(message);
        self.ended |= last;
        reply.into_iter().collect()
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
        // The picker's own stream driver: the same task and channel per stream.
        Ok(Response::new(drive_stream(
            request.into_inner(),
            NoopStream::default(),
        )))
    }
}

/// Serves the no-op processor on `listener` until the process ends.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .add_service(ext_proc_server(NoopExtProc))
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
    use ep::{HttpBody, HttpHeaders, HttpTrailers};

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
