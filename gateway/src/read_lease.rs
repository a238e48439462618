//! Read leases: a GET that streams longer than `read_lease_after` keeps
//! the blobs it reads from being deleted until it ends
//! (`docs/design/durability.md` §4, `LeaseBlobsRequest` in
//! `proto/meta.proto`).
//!
//! An overwrite or delete releases the old object's blobs, and meta's
//! reclaimer deletes a released blob's shards once `delete_delay` has
//! passed on its monotonic clock. A GET that started before the release
//! is therefore safe for `delete_delay` without asking meta anything; one
//! still streaming after `read_lease_after` (which must be well below
//! `delete_delay`) leases every blob it reads with `LeaseBlobs`, under the
//! current write epoch, which it keeps renewed by holding an
//! [`EpochGuard`] until the GET ends. The end of the body (or its drop)
//! releases the lease with `ReleaseBlobs`; if that call is lost, the lease
//! ends when meta closes the epoch, after its last guard dropped.
//!
//! Bound: one task and one [`ReadLease`] per GET in flight whose object
//! has blobs (GETs in flight are bounded by `max_inflight_requests`), each
//! holding the blob ids of the parts it reads (at most
//! [`MAX_LEASE_BLOBS`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::LeaseBlobsRequest;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::epoch::{EpochGuard, WriteEpochs};
use crate::metrics;

/// Most blob ids one lease names (meta's limit: S3's most parts).
pub const MAX_LEASE_BLOBS: usize = 10_000;

/// Default `read_lease_after`: 1 min (meta's default `delete_delay` is 5).
pub const DEFAULT_READ_LEASE_AFTER: Duration = Duration::from_secs(60);

/// Pause between two failed `LeaseBlobs` attempts (each already retries
/// inside `MetaClient` up to its retry deadline).
pub const LEASE_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The meta calls read leases need, behind a trait for tests.
#[async_trait::async_trait]
pub trait LeaseService: Send + Sync + 'static {
    /// `LeaseBlobs`: the blob ids already claimed for deletion.
    async fn lease(&self, req: LeaseBlobsRequest) -> Result<Vec<String>, MetaError>;
    /// `ReleaseBlobs`.
    async fn release(&self, epoch: u64, lease_id: u64) -> Result<(), MetaError>;
}

#[async_trait::async_trait]
impl LeaseService for MetaClient {
    async fn lease(&self, req: LeaseBlobsRequest) -> Result<Vec<String>, MetaError> {
        self.lease_blobs(req).await
    }
    async fn release(&self, epoch: u64, lease_id: u64) -> Result<(), MetaError> {
        self.release_blobs(epoch, lease_id).await
    }
}

/// Takes read leases for the GETs of one gateway.
#[derive(Clone)]
pub struct ReadLeases {
    service: Arc<dyn LeaseService>,
    epochs: WriteEpochs,
    after: Duration,
    /// Lease ids: unique within an epoch, which only this process uses.
    next_id: Arc<AtomicU64>,
}

/// Held by a GET's body; dropping it ends the lease (or stops the timer).
pub struct ReadLease {
    _stop: DropGuard,
}

impl ReadLeases {
    /// Leases for GETs still streaming after `after`, under `epochs`.
    pub fn new(service: Arc<dyn LeaseService>, epochs: WriteEpochs, after: Duration) -> Self {
        ReadLeases {
            service,
            epochs,
            after,
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Starts the lease of a GET that reads `blob_ids` (at most
    /// [`MAX_LEASE_BLOBS`] are leased); `None` when it reads no blob.
    pub fn start(&self, mut blob_ids: Vec<String>) -> Option<ReadLease> {
        if blob_ids.is_empty() {
            return None;
        }
        blob_ids.truncate(MAX_LEASE_BLOBS);
        let stop = CancellationToken::new();
        let task = LeaseTask {
            service: Arc::clone(&self.service),
            epochs: self.epochs.clone(),
            after: self.after,
            lease_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            blob_ids,
            stop: stop.clone(),
        };
        tokio::spawn(task.run());
        Some(ReadLease {
            _stop: stop.drop_guard(),
        })
    }
}

struct LeaseTask {
    service: Arc<dyn LeaseService>,
    epochs: WriteEpochs,
    after: Duration,
    lease_id: u64,
    blob_ids: Vec<String>,
    stop: CancellationToken,
}

impl LeaseTask {
    async fn run(self) {
        tokio::select! {
            _ = self.stop.cancelled() => return,
            _ = tokio::time::sleep(self.after) => {}
        }
        // Renewed while held: the lease lives as long as the epoch.
        let guard: EpochGuard = self.epochs.begin_write();
        let epoch = guard.epoch();
        let req = LeaseBlobsRequest {
            epoch,
            lease_id: self.lease_id,
            blob_ids: self.blob_ids,
        };
        loop {
            let attempt = tokio::select! {
                _ = self.stop.cancelled() => break,
                r = self.service.lease(req.clone()) => r,
            };
            match attempt {
                Ok(lost) => {
                    metrics::read_lease_taken();
                    if !lost.is_empty() {
                        metrics::read_lease_lost(lost.len());
                        tracing::warn!(
                            epoch,
                            blobs = lost.len(),
                            "a GET outlived the deletion delay of blobs it reads"
                        );
                    }
                    self.stop.cancelled().await;
                    break;
                }
                Err(e) => {
                    metrics::read_lease_failed();
                    tracing::warn!(epoch, error = %e, "LeaseBlobs failed; retrying");
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(LEASE_RETRY_PAUSE) => {}
                    }
                }
            }
        }
        // Also after a cancelled attempt, which may have been applied.
        if let Err(e) = self.service.release(epoch, self.lease_id).await {
            tracing::debug!(epoch, error = %e, "ReleaseBlobs failed; the lease ends with its epoch");
        }
        drop(guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<String>>,
        fail_leases: AtomicU64,
    }

    #[async_trait::async_trait]
    impl LeaseService for Fake {
        async fn lease(&self, req: LeaseBlobsRequest) -> Result<Vec<String>, MetaError> {
            if self.fail_leases.load(Ordering::Relaxed) > 0 {
                self.fail_leases.fetch_sub(1, Ordering::Relaxed);
                self.calls.lock().unwrap().push("lease failed".into());
                return Err(MetaError::Unavailable("down".into()));
            }
            self.calls.lock().unwrap().push(format!(
                "lease {} {} {}",
                req.epoch,
                req.lease_id,
                req.blob_ids.join(",")
            ));
            Ok(Vec::new())
        }
        async fn release(&self, epoch: u64, lease_id: u64) -> Result<(), MetaError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("release {epoch} {lease_id}"));
            Ok(())
        }
    }

    fn calls(f: &Fake) -> Vec<String> {
        f.calls.lock().unwrap().clone()
    }

    /// `read_lease_after` of these tests (real time).
    const AFTER: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn a_short_get_asks_meta_nothing() {
        let fake = Arc::new(Fake::default());
        let leases = ReadLeases::new(fake.clone(), WriteEpochs::fixed(7), AFTER);
        let lease = leases.start(vec!["b1".into()]);
        tokio::time::sleep(AFTER / 2).await;
        drop(lease);
        tokio::time::sleep(AFTER * 2).await;
        assert!(calls(&fake).is_empty(), "{:?}", calls(&fake));
        assert!(leases.start(Vec::new()).is_none(), "no blob, no lease");
    }

    #[tokio::test]
    async fn a_long_get_is_leased_until_it_ends_and_retries_meta() {
        let fake = Arc::new(Fake::default());
        fake.fail_leases.store(2, Ordering::Relaxed);
        let leases = ReadLeases::new(fake.clone(), WriteEpochs::fixed(7), AFTER);
        let lease = leases.start(vec!["b1".into(), "b2".into()]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while calls(&fake).len() < 3 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            calls(&fake),
            ["lease failed", "lease failed", "lease 7 1 b1,b2"],
            "two failures, then leased under the current epoch"
        );
        tokio::time::sleep(AFTER * 3).await;
        assert_eq!(
            calls(&fake).len(),
            3,
            "held, not released, while the GET runs"
        );
        drop(lease);
        while calls(&fake).len() < 4 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(calls(&fake).last().map(String::as_str), Some("release 7 1"));
    }
}
