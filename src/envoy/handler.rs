//! What one ext_proc stream does with its messages ([`StreamHandler`]), and how a handler is
//! driven over a stream ([`drive_stream`]: inside the stream of its replies, with no task or
//! channel of its own). The picker's stream state machine is one handler; the benchmark's no-op
//! processor another.

use std::collections::VecDeque;
use std::pin::Pin;

use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use ep::{ProcessingRequest, ProcessingResponse};
use tonic::{Status, Streaming};

use crate::routing::flow::{Hold, Released};
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
    /// A request flow control queued while handling the last message: the driver sends that
    /// message's replies, then awaits the hold (reading the stream meanwhile, so that a client
    /// gone leaves the queue at once) and sends what [`StreamHandler::released`] makes of it.
    fn take_hold(&mut self) -> Option<Hold> {
        None
    }
    /// The replies to a held request's release (its pick, or its refusal).
    fn released(&mut self, released: Released) -> Vec<ProcessingResponse> {
        let _ = released;
        Vec::new()
    }
    /// A held request dispatched as its stream ended: nobody will send it; end it.
    fn abandoned(&mut self, released: Released) {
        let _ = released;
    }
}

/// A lookup the stream awaits before routing.
pub type Lookup = crate::kvcache::lookup::Pending;

/// Serves one stream: each message's replies are sent in order until the handler is done,
/// Envoy ends the stream, or nobody reads the replies any more; then [`StreamHandler::finish`]
/// runs (also when the reply stream is dropped half-way, e.g. Envoy reset the stream).
///
/// The handler runs inside the reply stream, on the task that sends the replies (hyper's, one
/// per gRPC stream): no task of its own and no channel, so a message costs no wake-up of a
/// second task and no hand-over between them. Each message is read when hyper asks for the next
/// reply, which it does as long as Envoy grants the stream send window.
pub fn drive_stream<H: StreamHandler>(
    inbound: Streaming<ProcessingRequest>,
    handler: H,
) -> ReplyStream {
    let driver = Driver {
        inbound,
        handler: Finishing(handler),
        queued: VecDeque::new(),
        ended: false,
        hold: None,
        stashed: VecDeque::new(),
    };
    Box::pin(futures_util::stream::unfold(driver, |mut d| async move {
        let reply = d.next_reply().await?;
        Some((Ok(reply), d))
    }))
}

/// One stream's state between replies.
struct Driver<H: StreamHandler> {
    inbound: Streaming<ProcessingRequest>,
    handler: Finishing<H>,
    /// Replies of the last message not sent yet.
    queued: VecDeque<ProcessingResponse>,
    /// Nothing more to read: the handler is done, or Envoy ended the stream.
    ended: bool,
    /// A request held by flow control, awaited once `queued` is sent.
    hold: Option<Hold>,
    /// Messages that arrived while a request was held (Envoy sends none for a held request;
    /// kept for after the release, in order).
    stashed: VecDeque<ProcessingRequest>,
}

impl<H: StreamHandler> Driver<H> {
    /// The next reply to send, reading messages until one calls for a reply; `None` once the
    /// stream is over (the driver is then dropped, which finishes the handler).
    async fn next_reply(&mut self) -> Option<ProcessingResponse> {
        loop {
            if let Some(reply) = self.queued.pop_front() {
                return Some(reply);
            }
            if let Some(hold) = &mut self.hold {
                tokio::select! {
                    released = hold.wait() => {
                        self.hold = None;
                        let handler = &mut self.handler.0;
                        self.queued.extend(handler.released(released));
                        self.ended = handler.done();
                    }
                    message = self.inbound.message() => match message {
                        Ok(Some(m)) => self.stashed.push_back(m),
                        _ => {
                            // The client went away (Envoy closed the stream): out of the
                            // queue now; a request dispatched meanwhile is ended as aborted.
                            self.ended = true;
                            if let Some(released) = self.hold.take().and_then(Hold::cancel) {
                                self.handler.0.abandoned(released);
                            }
                            self.queued.clear();
                        }
                    },
                }
                continue;
            }
            if self.ended {
                return None;
            }
            let message = match self.stashed.pop_front() {
                Some(m) => m,
                None => {
                    let Ok(Some(message)) = self.inbound.message().await else {
                        self.ended = true;
                        continue;
                    };
                    message
                }
            };
            let handler = &mut self.handler.0;
            if let Some(lookup) = handler.lookup(&message) {
                let owners = lookup.await;
                handler.looked_up(owners);
            }
            self.queued.extend(handler.replies(message));
            self.hold = handler.take_hold();
            self.ended = handler.done();
        }
    }
}

/// Calls [`StreamHandler::finish`] when the stream's state goes, however the stream ended.
struct Finishing<H: StreamHandler>(H);

impl<H: StreamHandler> Drop for Finishing<H> {
    fn drop(&mut self) {
        self.0.finish();
    }
}
