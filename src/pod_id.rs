//! A pod's identity, `namespace/name`: what discovery names a pod by, the metrics label it with
//! and the pod set keys it by. Its own module, below all three.

use std::fmt;

/// A pod's identity: `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
