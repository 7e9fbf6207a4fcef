//! What one ext_proc stream does with its messages ([`StreamHandler`]), and the task that drives a
//! handler over a stream ([`drive_stream`]). The picker's stream state machine is one handler;
//! the benchmark's no-op processor another.

use std::pin::Pin;

use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use ep::{ProcessingRequest, ProcessingResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::scheduler::kvcache_aware::KvBlockOwners;

pub type ReplyStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

/// What one ext_proc stream does with its messages (see [`drive_stream`]).
pub trait StreamHandler: Send + 'static {
    /// The replies to one message, in order.
    fn replies(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse>;
    /// Nothing more to learn: end our side of the stream now. Envoy keeps an
    /// observability-mode stream open for `deferred_close_timeout` (5 s) after the request
    /// unless the server closes it, and every open stream counts against the processor
    /// cluster's `max_requests` circuit breaker.
    fn done(&self) -> bool;
    /// The stream ended (normally or not).
    fn finish(&mut self) {}
    /// Work to await before [`StreamHandler::replies`] for this message (kvcache-aware's
    /// lookup, when this message may route the request); its result goes to
    /// [`StreamHandler::looked_up`].
    fn lookup(&mut self, message: &ProcessingRequest) -> Option<Lookup> {
        let _ = message;
        None
    }
    /// The result of [`StreamHandler::lookup`]'s work.
    fn looked_up(&mut self, owners: Option<KvBlockOwners>) {
        let _ = owners;
    }
}

/// A lookup the stream awaits before routing.
pub type Lookup = crate::kvcache::lookup::Pending;

/// Serves one stream on its own task: each message's replies are sent in order until the
/// handler is done, Envoy ends the stream, or nobody reads the replies any more.
pub fn drive_stream<H: StreamHandler>(
    mut inbound: Streaming<ProcessingRequest>,
    mut handler: H,
) -> ReplyStream {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        'stream: while let Ok(Some(message)) = inbound.message().await {
            if let Some(lookup) = handler.lookup(&message) {
                let owners = lookup.await;
                handler.looked_up(owners);
            }
            for reply in handler.replies(message) {
                if tx.send(Ok(reply)).await.is_err() {
                    break 'stream;
                }
            }
            if handler.done() {
                break;
            }
        }
        handler.finish();
    });
    Box::pin(ReceiverStream::new(rx))
}
