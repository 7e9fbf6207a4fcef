//! prefix-picker: a prefix-cache-aware endpoint picker for LLM inference.
//!
//! Three parts: a pure core that knows nothing of Envoy, configuration files or Prometheus; the
//! routing seam ([`routing`]: route a request to a ticket, complete the ticket), with the pod set,
//! discovery, metrics and replica sync around it; and the Envoy adapter ([`envoy`]), the only
//! part that speaks Envoy's protocols. [`serve`] wires them into a process.
//!
//! The modules stand in layers; a module imports only from the layers its row lists, and no
//! file imports another in a circle (`layers.rs` checks both against this table, file by file):
//!
//! | layer | modules | may import |
//! | --- | --- | --- |
//! | core | `cached_tokens`, `decaying_sum`, `engine_view`, `event_stream`, `hashing`, `invariants`, `lenient_json`, `prefix_index`, `prompt`, `request`, `scheduler` | core |
//! | leaves | `backoff`, `metrics`, `pod_id`, `tls` | core, leaves |
//! | platform | `debug_access`, `discovery`, `endpoints`, `engine_events`, `flow_control`, `kv_events`, `kvcache`, `pod_metrics`, `sessions`, `sync`, `tokenizer` | core, leaves, platform |
//! | config | `config` | core, leaves, platform |
//! | routing | `routing` | core, leaves, platform, config, routing |
//! | adapters | `admin`, `envoy` | core, leaves, platform, config, routing, adapters |
//! | process | `cli`, `logging`, `reload`, `serve`, `main` | core, leaves, platform, config, routing, adapters, process |
//!
//! Config sections are defined by the module that owns them (`sync::SyncConfig`,
//! `sessions::SessionsConfig`, `debug_access::DebugConfig`, ...); `config` assembles them and
//! none of them imports it back. Metric label enums live with their metric ([`metrics`]).

// The core: plain Rust.
pub mod cached_tokens; // the engine's usage (prompt, completion, cached tokens) in a response body
pub mod decaying_sum; // a lock-free sum that decays per step of a clock
pub mod engine_view; // what one engine holds, from its KV-cache events
pub mod event_stream; // how an Anthropic Messages event stream ended (message_stop, error)
pub mod hashing; // the prompt's block-hash chain
pub mod invariants; // what must hold for any request body (the fuzz target's property)
pub mod lenient_json; // Go-compatible JSON decoding of request bodies
pub mod prefix_index; // which pods hold which blocks
pub mod prompt; // the prompt rendered from a request, as Kthena renders it
pub mod request; // request parsing: model, prompt, stream
pub mod scheduler; // filters, scores and the pick: a `Decision`

// Routing and the platform around it.
#[cfg(feature = "sidecar")]
pub mod backoff; // capped exponential backoff between reconnection attempts
#[cfg(feature = "sidecar")]
pub mod config; // the config file, parsed into types that cannot be invalid
#[cfg(feature = "sidecar")]
pub mod debug_access; // who may read the admin listener's /debug routes (`picker.debug`)
#[cfg(feature = "sidecar")]
pub mod discovery; // Kubernetes discovery: pods as `endpoints::Update`s
#[cfg(feature = "sidecar")]
pub mod endpoints; // the pod set: identities, addresses, in-flight counts, engine stats
#[cfg(feature = "sidecar")]
pub mod engine_events; // KV-event subscribers feeding each pod's engine view
#[cfg(feature = "sidecar")]
pub mod flow_control; // flow control's config and its queue: bands, flows, fair dispatch order
#[cfg(feature = "sidecar")]
pub mod kv_events; // the engines' KV-cache events: decoding, and one pod's subscriber
#[cfg(feature = "sidecar")]
pub mod kvcache; // kvcache-aware's lookup, its Redis connection and GC, and the kv-relay writer
#[cfg(feature = "sidecar")]
pub mod metrics; // the Prometheus families, declared together
#[cfg(feature = "sidecar")]
pub mod pod_id; // a pod's identity, `namespace/name`
#[cfg(feature = "sidecar")]
pub mod pod_metrics; // engine-metrics scraping
#[cfg(feature = "sidecar")]
pub mod routing; // route -> ticket, pending tickets, complete(ticket, ending)
#[cfg(feature = "sidecar")]
pub mod sessions; // session affinity's map: session key -> the pod that served it last
#[cfg(feature = "sidecar")]
pub mod sync; // prefix-index sharing between replicas over Redis
#[cfg(feature = "sidecar")]
pub mod tokenizer; // the engine's own tokenizer, asked over HTTP, with a cache

// The Envoy adapter.
#[cfg(feature = "sidecar")]
pub mod envoy; // ext_proc service, stream state machine, wire, access-log service

// The process.
#[cfg(feature = "sidecar")]
pub mod admin; // the admin listener: /metrics, probes, /debug/explain
#[cfg(feature = "sidecar")]
pub mod cli; // the command line
#[cfg(feature = "sidecar")]
pub mod logging; // text or JSON log lines, panics included
#[cfg(feature = "sidecar")]
pub mod reload; // config reload: SIGHUP or a changed config file
#[cfg(feature = "sidecar")]
pub mod serve; // start-up, listeners, background tasks and shutdown
#[cfg(feature = "sidecar")]
pub mod tls; // TLS on the gRPC port

#[cfg(all(test, feature = "sidecar"))]
pub(crate) mod testing; // fixtures shared by the unit tests

#[cfg(test)]
mod layers; // the layer table above, checked against src/'s imports

#[cfg(feature = "sidecar")]
pub use config::Config;
#[cfg(feature = "sidecar")]
pub use routing::Router;
#[cfg(feature = "sidecar")]
pub use serve::Running;
