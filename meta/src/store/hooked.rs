//! [`Hooked`]: a [`MemStore`] that calls a test's hook around every read,
//! so a test can land a concurrent write exactly between two reads.

use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Batch, KvError, KvStore, MemStore, Pair, Space};

/// The read a [`Hooked`] store is about to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Before a `get` of the space.
    Get(Space),
    /// After a `get` of the space returned its value.
    Got(Space),
    /// Before a `scan` of the space.
    Scan(Space),
}

type Hook = Box<dyn FnMut(Access, &MemStore) + Send>;

/// A store whose reads first call the hook (with the underlying store,
/// which the hook may write). The hook is taken out while it runs, so the
/// reads it makes itself do not call it again.
#[derive(Default)]
pub(crate) struct Hooked {
    pub(crate) inner: MemStore,
    hook: Mutex<Option<Hook>>,
    /// Rows returned by `scan` so far (what a read costs).
    pub(crate) rows_read: AtomicU64,
}

impl Hooked {
    pub(crate) fn new(inner: MemStore) -> Self {
        Hooked {
            inner,
            hook: Mutex::new(None),
            rows_read: AtomicU64::new(0),
        }
    }

    pub(crate) fn set_hook(&self, hook: impl FnMut(Access, &MemStore) + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    pub(crate) fn clear_hook(&self) {
        self.hook.lock().unwrap().take();
    }

    fn run(&self, access: Access) {
        let hook = self.hook.lock().unwrap().take();
        if let Some(mut hook) = hook {
            hook(access, &self.inner);
            *self.hook.lock().unwrap() = Some(hook);
        }
    }
}

impl KvStore for Hooked {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.run(Access::Get(space));
        let value = self.inner.get(space, key)?;
        self.run(Access::Got(space));
        Ok(value)
    }
    fn scan(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError> {
        self.run(Access::Scan(space));
        let rows = self.inner.scan(space, start, end, limit)?;
        self.rows_read
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(rows)
    }
    fn last(&self, space: Space) -> Result<Option<Pair>, KvError> {
        self.inner.last(space)
    }
    fn apply(&self, batch: Batch) -> Result<(), KvError> {
        self.inner.apply(batch)
    }
    async fn flush(&self) -> Result<(), KvError> {
        Ok(())
    }
}
