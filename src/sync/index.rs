//! The seam between sync and the router, from below: what sync needs of the local index
//! ([`LocalIndex`], implemented by `routing::Router`) and what receives this replica's own
//! records ([`RecordSink`], implemented by the [`publisher`](super::publisher)). Sync knows no
//! routing type.

use std::sync::Arc;

use super::record::HashParams;
use crate::endpoints::{Endpoint, Endpoints};
use crate::hashing::BlockHash;

/// Receives every local record (after a served request), e.g. to share it with other replicas.
/// Called on the routing path: it must not block.
pub trait RecordSink: Send + Sync + std::fmt::Debug {
    fn recorded(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint);
}

/// The local prefix index as sync uses it.
pub trait LocalIndex: Send + Sync + std::fmt::Debug + 'static {
    /// The hashing parameters of this replica (records hashed otherwise are not applied).
    fn hash_params(&self) -> HashParams;
    /// The pod set, in which a record's pod is looked up.
    fn endpoints(&self) -> &Endpoints;
    /// Records another replica's record as it made it (never published again).
    fn record_replica(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint);
    /// Installs the sink of this replica's own records (once); `false` if one was already set.
    fn set_record_sink(&self, sink: Arc<dyn RecordSink>) -> bool;
}
