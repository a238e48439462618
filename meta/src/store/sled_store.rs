//! [`SledStore`]: the on-disk [`KvStore`] on sled 0.34.
//!
//! Layout: one sled tree (`sluice`), every key prefixed with its
//! [`Space`] byte, so one `apply_batch` is atomic across spaces.

use std::ops::Bound;
use std::path::Path;

use super::{Batch, KvError, KvStore, Op, Pair, Space, range_is_empty, space_bounds, space_key};

/// A sled database in a directory. Dropping the last handle (and the
/// handles openraft holds) closes the database and releases its lock.
#[derive(Debug)]
pub struct SledStore {
    db: sled::Db,
    tree: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) the database in `dir` with a page cache of
    /// `cache_bytes` bytes.
    ///
    /// Errors: [`KvError::Sled`] when the directory cannot be opened, is
    /// corrupt or is locked by another open instance.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, KvError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()?;
        let tree = db.open_tree("sluice")?;
        Ok(SledStore { db, tree })
    }
}

fn strip(k: &[u8]) -> Result<Vec<u8>, KvError> {
    k.get(1..).map(<[u8]>::to_vec).ok_or(KvError::BadKey)
}

impl KvStore for SledStore {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.tree.get(space_key(space, key))?.map(|v| v.to_vec()))
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
        let mut out = Vec::new();
        for item in self.tree.range::<Vec<u8>, _>((start, end)).take(limit) {
            let (k, v) = item?;
            out.push((strip(&k)?, v.to_vec()));
        }
        Ok(out)
    }

    fn last(&self, space: Space) -> Result<Option<Pair>, KvError> {
        let (start, end) = space_bounds(space, Bound::Unbounded, Bound::Unbounded);
        match self.tree.range::<Vec<u8>, _>((start, end)).next_back() {
            Some(item) => {
                let (k, v) = item?;
                Ok(Some((strip(&k)?, v.to_vec())))
            }
            None => Ok(None),
        }
    }

    fn apply(&self, batch: Batch) -> Result<(), KvError> {
        let mut b = sled::Batch::default();
        for op in batch.ops {
            match op {
                Op::Put(space, k, v) => b.insert(space_key(space, &k), v),
                Op::Delete(space, k) => b.remove(space_key(space, &k)),
            }
        }
        self.tree.apply_batch(b)?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), KvError> {
        self.db.flush_async().await?;
        Ok(())
    }
}
