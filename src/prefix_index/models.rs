//! Model interning: each model the index has recorded gets a dense `u32` id, so an entry stores
//! 4 bytes of model instead of the 8-byte [`ModelKey`].
//!
//! Ids are handed out in order of first record and never freed (a model costs about 30 bytes
//! here, once). Scoring a model that was never recorded finds nothing without interning it.

use std::collections::HashMap;

use parking_lot::RwLock;

use super::ModelKey;

/// A model's dense id inside one index (`u32::MAX` is reserved for empty table slots).
pub type ModelId = u32;

#[derive(Debug, Default)]
pub struct ModelIds {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    ids: HashMap<ModelKey, ModelId>,
    keys: Vec<ModelKey>,
}

impl ModelIds {
    /// The id of a recorded model.
    pub fn get(&self, key: ModelKey) -> Option<ModelId> {
        self.inner.read().ids.get(&key).copied()
    }

    /// The id of `key`, assigning the next one on first sight.
    pub fn intern(&self, key: ModelKey) -> ModelId {
        if let Some(id) = self.get(key) {
            return id;
        }
        let mut inner = self.inner.write();
        if let Some(&id) = inner.ids.get(&key) {
            return id;
        }
        let id = ModelId::try_from(inner.keys.len())
            .ok()
            .filter(|&id| id < ModelId::MAX)
            .expect("fewer than u32::MAX distinct models");
        inner.ids.insert(key, id);
        inner.keys.push(key);
        id
    }

    /// Maps ids handed out by [`ModelIds::intern`] to models, under one read lock.
    pub fn keys<T>(&self, f: impl FnOnce(&dyn Fn(ModelId) -> ModelKey) -> T) -> T {
        let inner = self.inner.read();
        f(&|id| inner.keys[id as usize])
    }

    /// Heap bytes allocated (capacity-based).
    pub fn heap_bytes(&self) -> usize {
        let inner = self.inner.read();
        inner.keys.capacity() * size_of::<ModelKey>()
            + inner.ids.capacity() * (size_of::<(ModelKey, ModelId)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_stable() {
        let ids = ModelIds::default();
        assert_eq!(ids.get(ModelKey(7)), None);
        assert_eq!(ids.intern(ModelKey(7)), 0);
        assert_eq!(ids.intern(ModelKey(3)), 1);
        assert_eq!(ids.intern(ModelKey(7)), 0);
        assert_eq!(ids.get(ModelKey(3)), Some(1));
        assert_eq!(ids.keys(|key| key(1)), ModelKey(3));
    }
}
