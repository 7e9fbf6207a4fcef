//! prefix-picker: a prefix-cache-aware endpoint picker for LLM inference.
//!
//! The pure core (request parsing, prompt rendering, block hashing, the prefix index and the
//! scheduler) knows nothing of Envoy; the ext_proc adapter ([`envoy`]) translates.

pub mod admin;
pub mod cached_tokens;
pub mod cli;
pub mod config;
pub mod discovery;
pub mod endpoints;
pub mod envoy;
pub mod hashing;
pub mod invariants;
pub mod lenient_json;
pub mod metrics;
pub mod pod_metrics;
pub mod prefix_index;
pub mod prompt;
pub mod request;
pub mod routing;
pub mod scheduler;
pub mod serve;
pub mod sync;
#[cfg(test)]
pub(crate) mod testing;
pub mod tls;
