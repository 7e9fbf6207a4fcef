//! prefix-picker: a prefix-cache-aware endpoint picker for LLM inference.
//!
//! The pure core (request parsing, prompt rendering, block hashing, the prefix index and the
//! scheduler) knows nothing of Envoy; the ext_proc adapter ([`extproc`]) translates.

pub mod access_log;
pub mod admin;
pub mod cached_tokens;
pub mod cli;
pub mod completion;
pub mod config;
pub mod discovery;
pub mod endpoints;
pub mod extproc;
pub mod hashing;
pub mod invariants;
pub mod lenient_json;
pub mod logging;
pub mod metrics;
pub mod pending;
pub mod pod_metrics;
pub mod prefix_index;
pub mod prompt;
pub mod request;
pub mod routing;
pub mod scheduler;
pub mod serve;
pub mod sync;
pub mod tls;
