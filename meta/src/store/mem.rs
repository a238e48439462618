//! [`MemStore`]: the in-memory [`KvStore`] (a `BTreeMap` behind a lock).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

use super::{Batch, KvError, KvStore, Op, Pair, Space, range_is_empty, space_bounds, space_key};

/// An in-memory store; nothing survives the process. Batches are atomic
/// (one write lock), `flush` is a no-op.
#[derive(Debug, Default)]
pub struct MemStore {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // Writers never panic half way through a batch (no fallible steps),
        // so the map behind a poisoned lock is still consistent.
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl KvStore for MemStore {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.read().get(&space_key(space, key)).cloned())
    }

    fn scan(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        let (start, end) = space_bounds(space, start, end);
        if range_is_empty(&start, &end) || limit == 0 {
            return Ok(Vec::new());
        }
        let map = self.read();
        Ok(map
            .range((start, end))
            .take(limit)
            .map(|(k, v)| (k[1..].to_vec(), v.clone()))
            .collect())
    }

    fn last(&self, space: Space) -> Result<Option<Pair>, KvError> {
        let (start, end) = space_bounds(space, Bound::Unbounded, Bound::Unbounded);
        let map = self.read();
        Ok(map
            .range((start, end))
            .next_back()
            .map(|(k, v)| (k[1..].to_vec(), v.clone())))
    }

    fn apply(&self, batch: Batch) -> Result<(), KvError> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        for op in batch.ops {
            match op {
                Op::Put(space, k, v) => {
                    map.insert(space_key(space, &k), v);
                }
                Op::Delete(space, k) => {
                    map.remove(&space_key(space, &k));
                }
            }
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), KvError> {
        Ok(())
    }
}
