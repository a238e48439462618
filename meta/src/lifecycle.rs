//! The leader's lifecycle sweeper: every `lifecycle_check_interval`, for
//! every bucket with enabled lifecycle rules, it walks the bucket's
//! objects and multipart uploads one page ([`PAGE`] records) at a time
//! ([`sm::lifecycle`]) and proposes, through Raft, an `ExpireObjects`
//! entry for the page's expired objects and an `ExpireUploads` entry for
//! its uploads to abort; each is applied only to what the rules, read again
//! when the entry is applied, still select (an object also only if
//! unchanged since the page was read). Released blobs go through the
//! pending-deletion path like any DeleteObject's.
//!
//! Bounds: one page of records in memory; one Raft entry of at most
//! [`PAGE`] objects at a time. A follower does nothing; a leader that loses
//! leadership stops at its next proposal. It replaces nothing of the stale
//! upload sweeper, which still aborts every upload past
//! `stale_upload_expiry` whatever the rules say.
//!
//! # Metrics
//! `sluice_meta_lifecycle_expired_total`: objects proposed for expiry (an
//! object changed since the page was read is skipped when the entry is
//! applied, and still counted);
//! `sluice_meta_lifecycle_aborted_total`: uploads proposed for abort
//! (counted the same way).

use sluice_util::clock::wall_clock_ms;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::meta as pb;
use sluice_proto::raft::{self as rpb, meta_command::Command};

use sluice_util::worker::WorkerHandle;

use crate::raft::MetaRaft;
use crate::sm::{self, Applied, lifecycle};
use crate::store::{KvStore, Space};
use crate::sweeper::{SweepError, is_leader, periodic, propose};

/// Counter: objects expired by lifecycle rules.
pub const LIFECYCLE_EXPIRED_TOTAL: &str = "sluice_meta_lifecycle_expired_total";
/// Counter: multipart uploads aborted by lifecycle rules.
pub const LIFECYCLE_ABORTED_TOTAL: &str = "sluice_meta_lifecycle_aborted_total";

/// Records read per page, and most objects in one ExpireObjects entry.
pub const PAGE: usize = 256;

/// The lifecycle sweeper of one meta node.
pub(crate) struct LifecycleSweeper<K: KvStore> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub gate: Arc<crate::version::Gate>,
    /// `lifecycle_check_interval`.
    pub interval: Duration,
    /// `lifecycle_day`.
    pub day: Duration,
}

/// What one run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LifecycleRun {
    pub expired: u64,
    pub aborted: u64,
}

impl<K: KvStore> LifecycleSweeper<K> {
    /// Runs every interval while this node is the leader, reporting to
    /// `worker`, until dropped.
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let mut ticker = periodic(self.interval);
        loop {
            ticker.tick().await;
            if !is_leader(&self.raft) {
                worker.idle();
                continue;
            }
            match self.sweep().await {
                Ok(run) if run == LifecycleRun::default() => {
                    tracing::debug!("lifecycle rules: nothing to do");
                    worker.ran();
                }
                Ok(run) => {
                    tracing::info!(
                        expired = run.expired,
                        aborted = run.aborted,
                        "lifecycle rules applied"
                    );
                    worker.ran();
                }
                Err(SweepError::NotLeader) => {
                    tracing::info!("lost leadership during the lifecycle sweep");
                    worker.idle();
                }
                Err(e) => worker.report_error(format_args!("lifecycle sweep stopped: {e}")),
            }
        }
    }

    fn day_ms(&self) -> i64 {
        i64::try_from(self.day.as_millis()).unwrap_or(i64::MAX)
    }

    /// One pass over every bucket with lifecycle rules.
    pub(crate) async fn sweep(&self) -> Result<LifecycleRun, SweepError> {
        let mut run = LifecycleRun::default();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let start = match &after {
                Some(k) => Bound::Excluded(k.as_slice()),
                None => Bound::Unbounded,
            };
            let rows = self
                .kv
                .scan(Space::Buckets, start, Bound::Unbounded, PAGE)
                .map_err(sm::SmError::from)?;
            let full = rows.len() == PAGE;
            for (k, v) in &rows {
                let bucket: pb::Bucket = sm::decode("bucket", v)?;
                if bucket.lifecycle.iter().any(|r| r.enabled) {
                    self.sweep_bucket(&bucket, &mut run).await?;
                }
                after = Some(k.clone());
            }
            if !full {
                return Ok(run);
            }
        }
    }

    async fn sweep_bucket(
        &self,
        bucket: &pb::Bucket,
        run: &mut LifecycleRun,
    ) -> Result<(), SweepError> {
        let day_ms = self.day_ms();
        run.expired += self
            .sweep_pages(
                |kv, after, now| lifecycle::expired_objects(kv, bucket, after, now, day_ms, PAGE),
                |objects| Command::ExpireObjects(rpb::ExpireObjects { objects, day_ms }),
                LIFECYCLE_EXPIRED_TOTAL,
            )
            .await?;
        run.expired += self
            .sweep_pages(
                |kv, after, now| lifecycle::expired_versions(kv, bucket, after, now, day_ms, PAGE),
                |objects| Command::ExpireObjects(rpb::ExpireObjects { objects, day_ms }),
                LIFECYCLE_EXPIRED_TOTAL,
            )
            .await?;
        run.aborted += self
            .sweep_pages(
                |kv, after, now| lifecycle::expired_uploads(kv, bucket, after, now, day_ms, PAGE),
                |uploads| Command::ExpireUploads(rpb::ExpireUploads { uploads, day_ms }),
                LIFECYCLE_ABORTED_TOTAL,
            )
            .await?;
        Ok(())
    }

    /// Walks one bucket's keyspace a page at a time (`scan` from the key
    /// after the last page, at the leader's clock), proposing `command` of
    /// each page's findings; the number proposed, also added to `counter`.
    async fn sweep_pages<T>(
        &self,
        scan: impl Fn(&K, Option<&[u8]>, i64) -> Result<lifecycle::LifecyclePage<T>, sm::SmError>,
        command: impl Fn(Vec<T>) -> Command,
        counter: &'static str,
    ) -> Result<u64, SweepError> {
        let mut proposed = 0;
        let mut after: Option<Vec<u8>> = None;
        loop {
            if !is_leader(&self.raft) {
                return Err(SweepError::NotLeader);
            }
            let page = scan(self.kv.as_ref(), after.as_deref(), wall_clock_ms())?;
            if !page.found.is_empty() {
                let n = page.found.len() as u64;
                if let Applied::Released(_) = propose(
                    &self.raft,
                    self.kv.as_ref(),
                    &self.gate,
                    command(page.found),
                )
                .await?
                {
                    proposed += n;
                    metrics::counter!(counter).increment(n);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(proposed),
            }
        }
    }
}
