//! The stale multipart upload sweeper.
//!
//! Load generators (warp) and crashed clients never abort their uploads, so
//! without a sweeper the upload and part records, and their shards, would
//! grow forever. On the leader only, every `stale_upload_check_interval`,
//! the sweeper walks the `Uploads` keyspace one bounded page at a time
//! ([`sm::stale_uploads`]) and aborts every upload initiated more than
//! `stale_upload_expiry` ago with the AbortUpload command through Raft, the
//! same log entry as AbortMultipartUpload. The abort deletes the part
//! records and takes their blobs out of the reference index; the shards are
//! then collected by the datanodes' shard GC after its grace period.
//!
//! A follower's sweeper does nothing; a leader that loses leadership stops
//! its sweep at the next abort (openraft refuses the write).
//!
//! # Metrics
//! `sluice_meta_stale_uploads_aborted_total`: uploads the sweeper aborted.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft::{MetaCommand, meta_command::Command};
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use crate::raft::MetaRaft;
use crate::sm::{self, Applied, SmError};
use crate::store::KvStore;

/// Counter: uploads aborted by the sweeper.
pub const STALE_UPLOADS_ABORTED_TOTAL: &str = "sluice_meta_stale_uploads_aborted_total";

/// Upload records read per page of a sweep.
const SWEEP_PAGE: usize = 256;

/// Why a sweep stopped early. The next tick starts a new one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SweepError {
    /// This node is no longer the leader.
    #[error("lost leadership")]
    NotLeader,
    /// Reading the uploads keyspace failed.
    #[error("scan uploads: {0}")]
    Scan(#[from] SmError),
    /// Raft refused or failed the abort (stopped, membership change).
    #[error("abort upload through raft: {0}")]
    Raft(#[source] RaftError<u64, ClientWriteError<u64, BasicNode>>),
}

/// The sweeper of one meta node.
pub(crate) struct Sweeper<K: KvStore> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    /// `stale_upload_check_interval`.
    pub interval: Duration,
    /// `stale_upload_expiry`.
    pub expiry: Duration,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl<K: KvStore> Sweeper<K> {
    fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Sweeps every interval (the first one interval after the start) while
    /// this node is the leader. Runs until the task is aborted.
    pub(crate) async fn run(self) {
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticker = tokio::time::interval_at(start, self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if !self.is_leader() {
                continue;
            }
            match self.sweep().await {
                Ok(0) => tracing::debug!("no stale multipart uploads"),
                Ok(aborted) => {
                    tracing::info!(aborted, expiry = ?self.expiry, "aborted stale multipart uploads");
                }
                Err(SweepError::NotLeader) => {
                    tracing::info!("lost leadership during the stale upload sweep");
                }
                Err(e) => tracing::warn!(error = %e, "stale upload sweep stopped"),
            }
        }
    }

    /// One sweep over every upload; returns how many were aborted.
    pub(crate) async fn sweep(&self) -> Result<u64, SweepError> {
        let expiry_ms = i64::try_from(self.expiry.as_millis()).unwrap_or(i64::MAX);
        let cutoff_ms = now_ms().saturating_sub(expiry_ms);
        let mut aborted = 0u64;
        let mut after: Option<Vec<u8>> = None;
        loop {
            if !self.is_leader() {
                return Err(SweepError::NotLeader);
            }
            let page =
                sm::stale_uploads(self.kv.as_ref(), after.as_deref(), cutoff_ms, SWEEP_PAGE)?;
            for upload in page.stale {
                if self.abort(upload).await? {
                    aborted += 1;
                    metrics::counter!(STALE_UPLOADS_ABORTED_TOTAL).increment(1);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(aborted),
            }
        }
    }

    /// Aborts one upload through Raft; `false` if it was already gone
    /// (completed or aborted since the page was read).
    async fn abort(&self, upload: pb::UploadKey) -> Result<bool, SweepError> {
        let span = tracing::debug_span!(
            "abort_stale_upload",
            bucket = %upload.bucket,
            key = %upload.key,
            upload_id = %upload.upload_id
        );
        let cmd = MetaCommand {
            leader_now_ms: crate::sm::wall_clock_ms(),
            command: Some(Command::AbortUpload(upload)),
        };
        let written = self.raft.client_write(cmd).instrument(span.clone()).await;
        let _enter = span.enter();
        match written {
            Ok(resp) => match resp.data {
                Applied::Released(released) => {
                    tracing::debug!(parts = released.len(), "aborted stale upload");
                    Ok(true)
                }
                Applied::Refused {
                    code: ErrorCode::NoSuchUpload,
                    ..
                } => Ok(false),
                other => {
                    tracing::warn!(applied = ?other, "abort of a stale upload not applied");
                    Ok(false)
                }
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(SweepError::NotLeader)
            }
            Err(e) => Err(SweepError::Raft(e)),
        }
    }
}
