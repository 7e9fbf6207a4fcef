//! The ext_proc gRPC service: one stream state machine (`stream.rs`) per stream, driven inside
//! the stream of its replies ([`drive_stream`], `handler.rs`).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use ep::ProcessingRequest;
use ep::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use tonic::{Request, Response, Status, Streaming};

pub use super::handler::{Lookup, ReplyStream, StreamHandler, drive_stream};
use super::stream::StreamState;
use crate::routing::Router;

/// The ext_proc gRPC service.
#[derive(Debug, Clone)]
pub struct ExtProc {
    router: Arc<Router>,
}

impl ExtProc {
    pub fn new(router: Arc<Router>) -> ExtProc {
        ExtProc { router }
    }

    pub fn into_server(self) -> ExternalProcessorServer<ExtProc> {
        ext_proc_server(self)
    }
}

/// An ext_proc service with the message limits Envoy's bodies need (64 MiB each way).
pub fn ext_proc_server<T: ExternalProcessor>(service: T) -> ExternalProcessorServer<T> {
    ExternalProcessorServer::new(service)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = ReplyStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let stream = StreamState::new(self.router.clone());
        Ok(Response::new(drive_stream(request.into_inner(), stream)))
    }
}
