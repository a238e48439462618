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
//! The same module holds the leader's lease sweeps ([`LeaseSweeper`]):
//! every `epoch_sweep_interval` it closes write epochs whose last renewal
//! (leader time) is older than `epoch_lease` (`CloseEpochs`), and every
//! `session_sweep_interval` it expires session entries older than
//! `session_expiry` (`ExpireSessions`). All times are this leader's clock
//! ([`sm::wall_clock_ms`]), the same clock that stamps its entries.
//!
//! # Metrics
//! `sluice_meta_stale_uploads_aborted_total`: uploads the sweeper aborted.
//! `sluice_meta_epochs_closed_total`: write epochs closed for an expired
//! lease. `sluice_meta_sessions`: session table entries (gauge).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft::{self as rpb, MetaCommand, meta_command::Command};
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
    /// Reading the state machine failed.
    #[error("scan the state machine: {0}")]
    Scan(#[from] SmError),
    /// Raft refused or failed the entry (stopped, membership change).
    #[error("propose through raft: {0}")]
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
    sm::wall_clock_ms()
}

fn ms_of(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Counter: write epochs closed by the leader for an expired lease.
pub const EPOCHS_CLOSED_TOTAL: &str = "sluice_meta_epochs_closed_total";

/// Gauge: entries of the session table (read by the leader's sweep).
pub const SESSIONS: &str = "sluice_meta_sessions";

/// Epochs read per page of an epoch sweep, and most closed per entry.
const EPOCH_PAGE: usize = 256;

/// Session entries one ExpireSessions entry removes.
const EXPIRE_BATCH: u32 = 1000;

/// Most ExpireSessions entries one session sweep proposes.
const EXPIRE_ROUNDS: usize = 64;

/// Proposes `command` (stamped with this leader's clock).
async fn propose(raft: &MetaRaft, command: Command) -> Result<Applied, SweepError> {
    let cmd = MetaCommand {
        leader_now_ms: now_ms(),
        command: Some(command),
    };
    match raft.client_write(cmd).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
            Err(SweepError::NotLeader)
        }
        Err(e) => Err(SweepError::Raft(e)),
    }
}

fn is_leader(raft: &MetaRaft) -> bool {
    raft.metrics().borrow().state == ServerState::Leader
}

/// The leader's sweeps of write epoch leases and session entries.
pub(crate) struct LeaseSweeper<K: KvStore> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    /// `epoch_sweep_interval`.
    pub epoch_interval: Duration,
    /// `epoch_lease`.
    pub lease: Duration,
    /// `session_sweep_interval`.
    pub session_interval: Duration,
    /// `session_expiry`.
    pub session_expiry: Duration,
}

impl<K: KvStore> LeaseSweeper<K> {
    /// Sweeps epochs and sessions on their intervals while this node is
    /// the leader. Runs until the task is aborted.
    pub(crate) async fn run(self) {
        let mut epochs = tokio::time::interval(self.epoch_interval);
        epochs.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sessions = tokio::time::interval(self.session_interval);
        sessions.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = epochs.tick() => {
                    if !is_leader(&self.raft) {
                        continue;
                    }
                    match self.close_expired_epochs().await {
                        Ok(0) => {}
                        Ok(closed) => tracing::info!(closed, lease = ?self.lease, "closed expired write epochs"),
                        Err(SweepError::NotLeader) => {}
                        Err(e) => tracing::warn!(error = %e, "epoch sweep stopped"),
                    }
                }
                _ = sessions.tick() => {
                    if !is_leader(&self.raft) {
                        continue;
                    }
                    match self.expire_sessions().await {
                        Ok(()) | Err(SweepError::NotLeader) => {}
                        Err(e) => tracing::warn!(error = %e, "session sweep stopped"),
                    }
                }
            }
        }
    }

    /// Closes every open epoch whose lease ran out (by this leader's
    /// clock); returns how many.
    pub(crate) async fn close_expired_epochs(&self) -> Result<u64, SweepError> {
        let cutoff = now_ms().saturating_sub(ms_of(self.lease));
        let mut closed = 0u64;
        let mut after = None;
        loop {
            if !is_leader(&self.raft) {
                return Err(SweepError::NotLeader);
            }
            let page = sm::epochs::list_open(self.kv.as_ref(), after, EPOCH_PAGE)?;
            let full = page.len() == EPOCH_PAGE;
            after = page.last().map(|(e, _)| *e);
            let expired: Vec<u64> = page
                .into_iter()
                .filter(|(_, r)| r.renewed_ms < cutoff)
                .map(|(e, _)| e)
                .collect();
            if !expired.is_empty() {
                let n = expired.len() as u64;
                tracing::debug!(epochs = ?expired, "closing write epochs");
                propose(
                    &self.raft,
                    Command::CloseEpochs(rpb::CloseEpochs { epochs: expired }),
                )
                .await?;
                closed += n;
                metrics::counter!(EPOCHS_CLOSED_TOTAL).increment(n);
            }
            if !full {
                return Ok(closed);
            }
        }
    }

    /// Expires session entries older than `session_expiry`, in bounded
    /// entries, until none is left or [`EXPIRE_ROUNDS`] entries were sent.
    pub(crate) async fn expire_sessions(&self) -> Result<(), SweepError> {
        let before_ms = now_ms().saturating_sub(ms_of(self.session_expiry));
        for _ in 0..EXPIRE_ROUNDS {
            match sm::sessions::oldest_ms(self.kv.as_ref())? {
                Some(oldest) if oldest < before_ms => {}
                _ => break,
            }
            propose(
                &self.raft,
                Command::ExpireSessions(rpb::ExpireSessions {
                    before_ms,
                    limit: EXPIRE_BATCH,
                }),
            )
            .await?;
        }
        let n = sm::sessions::count(self.kv.as_ref())?;
        metrics::gauge!(SESSIONS).set(n as f64);
        Ok(())
    }
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
