//! The integration tests: one binary, a module per concern, sharing one harness.
//!
//! - [`e2e`]: through a real Envoy (routing, recording, fallbacks, body modes, observers, TLS,
//!   metrics, logs, the CLI, GIE's shape, replica sync);
//! - [`deploy`]: `deploy/`, the gateway examples, monitoring and the images, without a cluster;
//! - [`kube_discovery`]: Kubernetes discovery against an in-process fake API server;
//! - [`kv_events`]: the engines' KV-event subscriber against a msgspec/pyzmq publisher;
//! - [`kv_events_shared`]: the shared KV-event socket, the same publisher connecting to it;
//! - [`kvcache_vectors`]: kvcache-aware's hashes and scores against Python's `hashlib`;
//! - [`tokenizer_file`]: the `file` tokenizer source's chat templates against Python's jinja2
//!   and its ids against model-sim's;
//! - [`docs`]: the documentation's relative links;
//! - [`docs_blocks`]: the documentation's config examples validated and its install commands
//!   run offline;
//! - [`soak`]: pod churn under load (a short smoke by default; the full run is ignored, see
//!   `scripts/soak`).

mod deploy;
mod docs;
mod docs_blocks;
mod e2e;
mod harness;
mod kube_discovery;
mod kv_events;
mod kv_events_shared;
mod kvcache_vectors;
mod soak;
mod tokenizer_file;
