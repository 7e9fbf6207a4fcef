//! The router as replica sync's local index ([`LocalIndex`]): sync applies other replicas'
//! records through it and hooks its publisher in as the record sink.

use std::sync::Arc;

use super::{RecordOrigin, Router};
use crate::endpoints::{Endpoint, Endpoints};
use crate::hashing::BlockHash;
use crate::sync::record::HashParams;
use crate::sync::{LocalIndex, RecordSink};

impl LocalIndex for Router {
    fn hash_params(&self) -> HashParams {
        let live = self.scheduler.load();
        let prefix = live.scheduler.prefix_cache();
        let args = prefix.args();
        HashParams {
            block_size_to_hash: args.block_size_to_hash as u32,
            max_blocks_to_match: args.max_blocks_to_match as u32,
            scheme: prefix.scheme(),
        }
    }

    fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    fn record_replica(&self, model: &str, hashes: &[BlockHash], endpoint: &Endpoint) {
        self.record(model, hashes, endpoint, RecordOrigin::Replica);
    }

    fn set_record_sink(&self, sink: Arc<dyn RecordSink>) -> bool {
        Router::set_record_sink(self, sink)
    }
}
