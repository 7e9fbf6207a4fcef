//! The Envoy adapter: the only part of the picker that speaks Envoy's protocols (ext_proc and
//! the gRPC access log) and imports `envoy-types`. It translates messages into [`Router`] calls
//! and decisions back into messages; routing itself knows nothing of Envoy.
//!
//! [`Router`]: crate::routing::Router

pub mod access_log;
pub(crate) mod stream;

pub use stream::*;
