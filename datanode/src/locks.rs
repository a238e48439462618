//! [`BlobLocks`]: the per-blob lock that fences GC against a shard rewrite.
//!
//! GC holds the lock of every blob it asks meta about, from the
//! `Collectable` call to the deletes; PutShard's commit (the rename into
//! place) takes the lock of its blob. So a heal that rewrites a shard path
//! after meta's answer either commits before GC asks (and meta sees its
//! heal intent or placement) or waits until GC has deleted the stale copy,
//! and its new file is never deleted (`docs/design/durability.md` §5).
//!
//! The lock is a bounded set of locked blob ids ([`MAX_LOCKED_BLOBS`]) and a
//! [`Notify`]: a taker waits until none of its ids is held and there is
//! room, then inserts them all at once (no lock order, so no deadlock).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Most blob ids locked at once (GC's page of at most
/// [`crate::gc::GC_PAGE_BLOBS`] blobs plus concurrent PutShard commits);
/// a taker waits for room beyond it.
pub const MAX_LOCKED_BLOBS: usize = 4096;

/// Locks on blob ids; clones share the set.
#[derive(Clone, Default)]
pub struct BlobLocks {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    held: Mutex<HashSet<String>>,
    released: Notify,
}

impl BlobLocks {
    /// An empty set of locks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks `blob_id`, waiting while another holder has it.
    pub async fn lock(&self, blob_id: &str) -> BlobGuard {
        self.lock_all(vec![blob_id.to_string()]).await
    }

    /// Locks every id of `blob_ids` at once (duplicates are fine; at most
    /// [`MAX_LOCKED_BLOBS`] distinct ids, more are truncated away — callers
    /// pass a GC page), waiting while any of them is held by someone else.
    pub async fn lock_all(&self, mut blob_ids: Vec<String>) -> BlobGuard {
        blob_ids.sort();
        blob_ids.dedup();
        blob_ids.truncate(MAX_LOCKED_BLOBS);
        loop {
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self
                    .inner
                    .held
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let free = blob_ids.iter().all(|id| !held.contains(id));
                if free && held.len() + blob_ids.len() <= MAX_LOCKED_BLOBS {
                    held.extend(blob_ids.iter().cloned());
                    return BlobGuard {
                        locks: self.clone(),
                        ids: blob_ids,
                    };
                }
            }
            released.await;
        }
    }

    /// Whether `blob_id` is locked now (tests, diagnostics).
    pub fn is_locked(&self, blob_id: &str) -> bool {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(blob_id)
    }
}

/// Holds the locks of some blob ids; dropping it releases them.
pub struct BlobGuard {
    locks: BlobLocks,
    ids: Vec<String>,
}

impl Drop for BlobGuard {
    fn drop(&mut self) {
        {
            let mut held = self
                .locks
                .inner
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for id in &self.ids {
                held.remove(id);
            }
        }
        self.locks.inner.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_locked_blob_waits_and_others_do_not() {
        let locks = BlobLocks::new();
        let gc = locks
            .lock_all(vec!["a".into(), "b".into(), "a".into()])
            .await;
        assert!(locks.is_locked("a") && locks.is_locked("b"));
        // Another blob is not held up.
        drop(locks.lock("c").await);
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _g = locks.lock("b").await;
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "b is held by the GC guard");
        drop(gc);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("released")
            .unwrap();
        assert!(!locks.is_locked("a") && !locks.is_locked("b"));
    }
}
