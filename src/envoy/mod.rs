//! The Envoy adapter: the only part of the picker that speaks Envoy's protocols and imports
//! `envoy-types`. It translates messages into [`Router`] calls and decisions back into
//! messages; routing itself knows nothing of Envoy.
//!
//! - [`ext_proc`]: the ext_proc gRPC service, a state machine per stream;
//! - `handler`: what a stream does with its messages, and how it is driven (no task of its own);
//! - `stream`: one stream's state machine (request phase, pick, response phase, completion);
//! - [`wire`]: the header and metadata names, Envoy's body modes, reply builders and metadata
//!   readers;
//! - [`access_log`]: the gRPC access-log service, a completion source.
//!
//! [`Router`]: crate::routing::Router

pub mod access_log;
pub mod ext_proc;
mod handler;
mod stream;
pub mod wire;

pub use access_log::AccessLogSink;
pub use ext_proc::{ExtProc, ReplyStream, StreamHandler, drive_stream, ext_proc_server};
pub use wire::{reply, streamed_body};
