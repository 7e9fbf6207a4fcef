//! Discovery: where the pod set comes from.
//!
//! Static `endpoints:` are read by [`crate::config`]; the `discovery:` section adds Kubernetes
//! ([`kubernetes`]): pods selected by a label selector or by an InferencePool, one endpoint per
//! pod IP x target port. Either way discovery only produces data
//! ([`crate::endpoints::Update`]); the scheduler never sees Kubernetes. With
//! `inferenceObjectives: true` it also watches InferenceObjectives for flow control's
//! priorities ([`inference_objective`]).

pub mod config;
pub mod inference_objective;
pub mod inference_pool;
pub mod kubernetes;
pub mod metrics;
pub mod pod;
pub mod target;

pub use config::{DiscoveryConfig, DiscoveryError, KubernetesConfig, Source};
pub use kubernetes::KubernetesDiscovery;
pub use metrics::DiscoveryMetrics;
