//! The values of the `model` label: a request's `model` is the client's string, and each
//! distinct one starts series that live as long as the process. The first [`MAX_MODELS`]
//! distinct models keep their names; later ones share [`OTHER_MODEL`], so a client that sends
//! a new model name with every request cannot grow `/metrics` (or the picker's memory)
//! without bound. A pool serves far fewer models: below the bound, labels are Kthena's.
//!
//! Read on every decision without a lock: the names seen are an immutable set swapped whole
//! when one is added (at most [`MAX_MODELS`] times).

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Distinct models labelled by name.
pub const MAX_MODELS: usize = 256;
/// The label of every model past [`MAX_MODELS`].
pub const OTHER_MODEL: &str = "__other__";

/// The models labelled by name so far (clones share them).
#[derive(Debug, Clone, Default)]
pub struct ModelLabels {
    named: Arc<ArcSwap<HashSet<Box<str>>>>,
}

impl ModelLabels {
    /// `model`'s label: its name while fewer than [`MAX_MODELS`] others were named first, else
    /// [`OTHER_MODEL`].
    pub fn label<'a>(&self, model: &'a str) -> &'a str {
        if self.named.load().contains(model) {
            return model;
        }
        let mut named = false;
        self.named.rcu(|seen| {
            named = seen.contains(model) || seen.len() < MAX_MODELS;
            if named && !seen.contains(model) {
                let mut more = HashSet::clone(seen);
                more.insert(model.into());
                Arc::new(more)
            } else {
                Arc::clone(seen)
            }
        });
        if named { model } else { OTHER_MODEL }
    }

    /// Whether `model` is labelled by its name.
    pub fn is_named(&self, model: &str) -> bool {
        self.label(model) == model
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_models_keep_their_names_and_later_ones_share_one_label() {
        let labels = ModelLabels::default();
        let names: Vec<String> = (0..MAX_MODELS + 3).map(|i| format!("model-{i}")).collect();
        for name in &names[..MAX_MODELS] {
            assert_eq!(labels.label(name), name);
        }
        for name in &names[MAX_MODELS..] {
            assert_eq!(labels.label(name), OTHER_MODEL);
        }
        // A named model stays named; clones share what was named.
        let clone = labels.clone();
        assert_eq!(clone.label("model-0"), "model-0");
        assert!(!clone.is_named("model-300"));
    }
}
