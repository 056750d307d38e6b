//! A group's writes, in the order they were made: what one journal frame holds (`journal.rs`),
//! and what sled applies, key by key or as one batch (`batch_of`).

use sled::IVec;

/// A group's writes, in the order they were made: a journal frame, then sled's (key by key,
/// or as one batch, `batch_of`).
#[derive(Debug, Default)]
pub(crate) struct Writes {
    ops: Vec<(IVec, Option<IVec>)>,
}

impl Writes {
    pub fn insert<K: Into<IVec>, V: Into<IVec>>(&mut self, key: K, value: V) {
        self.ops.push((key.into(), Some(value.into())));
    }

    pub fn remove<K: Into<IVec>>(&mut self, key: K) {
        self.ops.push((key.into(), None));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn into_ops(self) -> Vec<(IVec, Option<IVec>)> {
        self.ops
    }
}

/// Writes as one sled batch (a later write of a key wins, as when applied one by one).
pub(crate) fn batch_of<K: AsRef<[u8]>, V: AsRef<[u8]>>(ops: &[(K, Option<V>)]) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (key, value) in ops {
        match value {
            Some(value) => batch.insert(key.as_ref(), value.as_ref()),
            None => batch.remove(key.as_ref()),
        }
    }
    batch
}
