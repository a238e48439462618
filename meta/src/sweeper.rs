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
//! every `epoch_sweep_interval` it closes write epochs it has not seen
//! renewed for their lease (`CloseEpochs`; the lease OpenEpoch granted,
//! recorded in the epoch, from the replicated cluster settings, which this
//! sweep seeds from the node's `epoch_lease` while none are stored), and every
//! `session_sweep_interval` it expires session entries applied more than
//! `session_expiry` ago (`ExpireSessions`); while the table holds more
//! than its high-water mark (`session_high_water` ×
//! `session_table_max_entries`), it also removes the oldest entries
//! applied more than `session_min_age` ago, down to the mark. It is the
//! only remover of session entries: apply never evicts, and the leader
//! refuses new operations while the table is full (`crate::api`), so an
//! entry younger than `session_min_age` is never removed, whatever the
//! load.
//!
//! These durations are measured on this leader's *monotonic* clock, from
//! what it observed itself while leading ([`EpochWatch`],
//! [`SessionClock`]); no wall-clock stamp written by another node (or by
//! this one before a restart) is compared with its clock. A new leader
//! starts with no observations: it gives every open epoch a full lease and
//! removes no session entry for its first `session_min_age` (none by
//! expiry for its first `session_expiry`) (the rule of leases after a
//! leader change: Gray and Cheriton 1989; Ongaro's dissertation §6.4).
//! Wall-clock stamps would be wrong: a leader whose clock ran behind,
//! restarted on the true clock and re-elected, would see every epoch and
//! session entry it had stamped as old and close a live gateway's epoch
//! and expire its sessions at once.
//!
//! # Metrics
//! `sluice_meta_stale_uploads_aborted_total`: uploads the sweeper aborted.
//! `sluice_meta_epochs_closed_total`: write epochs closed for an expired
//! lease. `sluice_meta_sessions`: session table entries (gauge).
//! `sluice_meta_sessions_pruned_total`: entries removed past
//! `session_min_age` above the high-water mark.

use sluice_util::clock::wall_clock_ms;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ServerState};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft::{self as rpb, meta_command::Command};
use sluice_util::worker::WorkerHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use crate::raft::MetaRaft;
use crate::sm::{self, Applied, SmError};
use crate::store::KvStore;
use crate::version::{Gate, GateError};

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
    /// The cluster version does not admit the command.
    #[error(transparent)]
    Gate(#[from] GateError),
}

/// The sweeper of one meta node.
pub(crate) struct Sweeper<K: KvStore> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub gate: Arc<Gate>,
    /// `stale_upload_check_interval`.
    pub interval: Duration,
    /// `stale_upload_expiry`.
    pub expiry: Duration,
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

/// Counter: session entries removed before their expiry because the table
/// was above its high-water mark (all older than `session_min_age`).
pub const SESSIONS_PRUNED_TOTAL: &str = "sluice_meta_sessions_pruned_total";

/// The entry count above which the session sweep removes entries older
/// than `session_min_age`: `fraction` of `max`, at least 1.
pub(crate) fn high_water_entries(max: u64, fraction: f64) -> u64 {
    ((max as f64 * fraction).floor() as u64).clamp(1, max.max(1))
}

/// Session entries one ExpireSessions entry removes.
const EXPIRE_BATCH: u32 = 1000;

/// Most ExpireSessions entries one session sweep proposes.
const EXPIRE_ROUNDS: usize = 64;

/// Proposes `command` (stamped with this leader's clock), if the cluster
/// version admits it ([`Gate::command`]).
pub(crate) async fn propose<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    command: Command,
) -> Result<Applied, SweepError> {
    let cmd = gate.command(kv, command)?;
    match raft.client_write(cmd).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
            Err(SweepError::NotLeader)
        }
        Err(e) => Err(SweepError::Raft(e)),
    }
}

/// A ticker for a leader's periodic pass: the first tick one `interval`
/// after now, then every `interval`; a pass that overruns delays the next
/// tick instead of bunching them.
pub(crate) fn periodic(interval: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker
}

/// Whether this node is the Raft leader now.
pub(crate) fn is_leader(raft: &MetaRaft) -> bool {
    raft.metrics().borrow().state == ServerState::Leader
}

/// The term this node leads in, `None` when it is not the leader.
fn leading_term(raft: &MetaRaft) -> Option<u64> {
    let m = raft.metrics();
    let m = m.borrow();
    (m.state == ServerState::Leader).then_some(m.current_term)
}

/// This node's applied log index.
pub(crate) fn applied_index(raft: &MetaRaft) -> u64 {
    raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
}

/// When this leader last saw each open epoch's renewal count change, by
/// its monotonic clock. Bound: one entry per open epoch (entries of epochs
/// no longer open are dropped at the end of every full sweep).
#[derive(Debug, Default)]
pub(crate) struct EpochWatch {
    seen: HashMap<u64, (u64, Instant)>,
}

impl EpochWatch {
    /// Notes that open epoch `epoch` has `renewals` renewals at `now`;
    /// `true` when its count has not changed for `lease` (an epoch seen for
    /// the first time gets a full lease from `now`).
    pub(crate) fn expired(
        &mut self,
        epoch: u64,
        renewals: u64,
        now: Instant,
        lease: Duration,
    ) -> bool {
        let entry = self.seen.entry(epoch).or_insert((renewals, now));
        if entry.0 != renewals {
            *entry = (renewals, now);
        }
        now.duration_since(entry.1) >= lease
    }

    /// Drops every epoch not in `open` (closed since).
    pub(crate) fn retain(&mut self, open: &HashSet<u64>) {
        self.seen.retain(|e, _| open.contains(e));
    }

    /// Epochs watched.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

/// Most samples a [`SessionClock`] keeps beyond the one it expires by.
const SESSION_SAMPLES: u32 = 64;

/// Samples of this leader's applied log index by its monotonic clock: an
/// entry applied at or below a sample's index was applied by the sample's
/// time. Kept for one age (`session_expiry`, or `session_min_age`). Bound:
/// about [`SESSION_SAMPLES`] + 2 samples (a new one is taken only when the
/// newest is `age / SESSION_SAMPLES` old), so an entry is removed at most
/// `age / 64` plus one sweep interval later than `age` after its apply,
/// never earlier.
#[derive(Debug, Default)]
pub(crate) struct SessionClock {
    samples: VecDeque<(Instant, u64)>,
}

impl SessionClock {
    /// Takes a sample of `applied` at `now`, unless the newest sample is
    /// younger than `expiry / SESSION_SAMPLES`.
    pub(crate) fn sample(&mut self, now: Instant, applied: u64, expiry: Duration) {
        let spacing = expiry / SESSION_SAMPLES;
        match self.samples.back() {
            Some((at, _)) if now.duration_since(*at) < spacing => {}
            _ => self.samples.push_back((now, applied)),
        }
    }

    /// The `before_index` of an ExpireSessions at `now`: one past the index
    /// of the newest sample at least `expiry` old; `None` while there is
    /// none. Drops the samples older than that one.
    pub(crate) fn expire_before(&mut self, now: Instant, expiry: Duration) -> Option<u64> {
        let old_enough = |s: &(Instant, u64)| now.duration_since(s.0) >= expiry;
        while self.samples.len() >= 2 && old_enough(&self.samples[1]) {
            self.samples.pop_front();
        }
        self.samples
            .front()
            .filter(|s| old_enough(s))
            .map(|s| s.1.saturating_add(1))
    }

    /// Samples held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }
}

/// The leader's sweeps of write epoch leases and session entries.
pub(crate) struct LeaseSweeper<K: KvStore> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub gate: Arc<Gate>,
    /// `epoch_sweep_interval`.
    pub epoch_interval: Duration,
    /// The cluster settings proposed while none are stored (`epoch_lease`).
    pub initial_settings: rpb::ClusterSettings,
    /// `session_sweep_interval`.
    pub session_interval: Duration,
    /// `session_expiry`.
    pub session_expiry: Duration,
    /// `session_min_age`.
    pub session_min_age: Duration,
    /// [`high_water_entries`] of `session_table_max_entries` and
    /// `session_high_water`.
    pub session_high_water_entries: u64,
}

/// What one leadership has observed (see the module docs); dropped when
/// the node stops leading or the term changes.
#[derive(Debug, Default)]
pub(crate) struct LeaseObservations {
    term: Option<u64>,
    pub(crate) epochs: EpochWatch,
    pub(crate) sessions: SessionClocks,
}

/// The two clocks of the session sweep: one for `session_expiry`, one for
/// `session_min_age` (each with its own sample spacing and bound).
#[derive(Debug, Default)]
pub(crate) struct SessionClocks {
    pub(crate) expiry: SessionClock,
    pub(crate) min_age: SessionClock,
}

impl LeaseObservations {
    /// `false` (and everything forgotten) unless this node leads; a new
    /// term starts from nothing.
    fn lead(&mut self, term: Option<u64>) -> bool {
        if term.is_none() || term != self.term {
            *self = LeaseObservations {
                term,
                ..Default::default()
            };
        }
        term.is_some()
    }
}

impl<K: KvStore> LeaseSweeper<K> {
    /// Sweeps epochs and sessions on their intervals while this node is
    /// the leader, reporting to `worker`. Runs until dropped.
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let mut epochs = tokio::time::interval(self.epoch_interval);
        epochs.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sessions = tokio::time::interval(self.session_interval);
        sessions.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut seen = LeaseObservations::default();
        loop {
            tokio::select! {
                _ = epochs.tick() => {
                    if !seen.lead(leading_term(&self.raft)) {
                        worker.idle();
                        continue;
                    }
                    match self.close_expired_epochs(&mut seen.epochs).await {
                        Ok(0) => worker.ran(),
                        Ok(closed) => {
                            tracing::info!(closed, "closed expired write epochs");
                            worker.ran();
                        }
                        Err(SweepError::NotLeader) => worker.idle(),
                        Err(e) => worker.report_error(format_args!("epoch sweep stopped: {e}")),
                    }
                }
                _ = sessions.tick() => {
                    if !seen.lead(leading_term(&self.raft)) {
                        worker.idle();
                        continue;
                    }
                    match self.expire_sessions(&mut seen.sessions).await {
                        Ok(()) => worker.ran(),
                        Err(SweepError::NotLeader) => worker.idle(),
                        Err(e) => worker.report_error(format_args!("session sweep stopped: {e}")),
                    }
                }
            }
        }
    }

    /// Closes every open epoch `watch` has not seen renewed for its lease
    /// (by this leader's monotonic clock); returns how many. An epoch's
    /// lease is the one OpenEpoch granted it (a settings change never
    /// shortens a lease already granted), or the current setting for an
    /// epoch that recorded none.
    pub(crate) async fn close_expired_epochs(
        &self,
        watch: &mut EpochWatch,
    ) -> Result<u64, SweepError> {
        if crate::admin::settings::should_seed(
            self.kv.as_ref(),
            &self.gate,
            &self.initial_settings,
        )? {
            propose(
                &self.raft,
                self.kv.as_ref(),
                &self.gate,
                crate::admin::settings::initial_command(&self.initial_settings),
            )
            .await?;
        }
        let current = Duration::from_millis(sm::settings::epoch_lease_ms(self.kv.as_ref())?);
        let now = Instant::now();
        let mut open = HashSet::new();
        let mut closed = 0u64;
        let mut after = None;
        loop {
            if !is_leader(&self.raft) {
                return Err(SweepError::NotLeader);
            }
            let page = sm::epochs::list_open(self.kv.as_ref(), after, EPOCH_PAGE)?;
            let full = page.len() == EPOCH_PAGE;
            after = page.last().map(|(e, _)| *e);
            let mut expired = Vec::new();
            for (epoch, record) in page {
                let lease = match record.lease_ms {
                    0 => current,
                    ms => Duration::from_millis(ms),
                };
                if watch.expired(epoch, record.renewals, now, lease) {
                    expired.push(epoch);
                } else {
                    open.insert(epoch);
                }
            }
            if !expired.is_empty() {
                let n = expired.len() as u64;
                tracing::debug!(epochs = ?expired, "closing write epochs");
                propose(
                    &self.raft,
                    self.kv.as_ref(),
                    &self.gate,
                    Command::CloseEpochs(rpb::CloseEpochs { epochs: expired }),
                )
                .await?;
                closed += n;
                metrics::counter!(EPOCHS_CLOSED_TOTAL).increment(n);
            }
            if !full {
                watch.retain(&open);
                return Ok(closed);
            }
        }
    }

    /// Expires the session entries applied more than `session_expiry` ago
    /// by `clocks`; then, while the table is above its high-water mark,
    /// removes the oldest entries applied more than `session_min_age` ago,
    /// down to the mark. At most [`EXPIRE_ROUNDS`] entries are sent for
    /// each.
    pub(crate) async fn expire_sessions(
        &self,
        clocks: &mut SessionClocks,
    ) -> Result<(), SweepError> {
        let now = Instant::now();
        let applied = applied_index(&self.raft);
        clocks.expiry.sample(now, applied, self.session_expiry);
        clocks.min_age.sample(now, applied, self.session_min_age);
        if let Some(before_index) = clocks.expiry.expire_before(now, self.session_expiry) {
            self.remove_sessions(before_index, u64::MAX).await?;
        }
        let n = sm::sessions::count(self.kv.as_ref())?;
        if n > self.session_high_water_entries
            && let Some(before_index) = clocks.min_age.expire_before(now, self.session_min_age)
        {
            let pruned = self
                .remove_sessions(before_index, n - self.session_high_water_entries)
                .await?;
            if pruned > 0 {
                metrics::counter!(SESSIONS_PRUNED_TOTAL).increment(pruned);
                tracing::debug!(
                    pruned,
                    min_age = ?self.session_min_age,
                    "session table above its high-water mark: removed entries past the minimum age"
                );
            }
        }
        let n = sm::sessions::count(self.kv.as_ref())?;
        metrics::gauge!(SESSIONS).set(n as f64);
        Ok(())
    }

    /// Removes up to `most` session entries applied below `before_index`,
    /// oldest first, in entries of at most [`EXPIRE_BATCH`] and at most
    /// [`EXPIRE_ROUNDS`] entries; returns how many went.
    async fn remove_sessions(&self, before_index: u64, most: u64) -> Result<u64, SweepError> {
        let mut removed = 0u64;
        for _ in 0..EXPIRE_ROUNDS {
            if removed >= most {
                break;
            }
            let limit = u32::try_from(most - removed)
                .unwrap_or(u32::MAX)
                .min(EXPIRE_BATCH);
            // Entries below `before_index` were applied before a sample
            // was taken; new ones land above it, and only this sweep
            // removes, so the apply removes exactly these.
            let due = sm::sessions::count_before(self.kv.as_ref(), before_index, limit)?;
            if due == 0 {
                break;
            }
            propose(
                &self.raft,
                self.kv.as_ref(),
                &self.gate,
                Command::ExpireSessions(rpb::ExpireSessions {
                    before_index,
                    limit,
                }),
            )
            .await?;
            removed += due;
        }
        Ok(removed)
    }
}

impl<K: KvStore> Sweeper<K> {
    /// Sweeps every interval (the first one interval after the start) while
    /// this node is the leader, reporting to `worker`. Runs until dropped.
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let mut ticker = periodic(self.interval);
        loop {
            ticker.tick().await;
            if !is_leader(&self.raft) {
                worker.idle();
                continue;
            }
            match self.sweep().await {
                Ok(0) => {
                    tracing::debug!("no stale multipart uploads");
                    worker.ran();
                }
                Ok(aborted) => {
                    tracing::info!(aborted, expiry = ?self.expiry, "aborted stale multipart uploads");
                    worker.ran();
                }
                Err(SweepError::NotLeader) => {
                    tracing::info!("lost leadership during the stale upload sweep");
                    worker.idle();
                }
                Err(e) => worker.report_error(format_args!("stale upload sweep stopped: {e}")),
            }
        }
    }

    /// One sweep over every upload; returns how many were aborted.
    pub(crate) async fn sweep(&self) -> Result<u64, SweepError> {
        let cutoff_ms = wall_clock_ms().saturating_sub(ms_of(self.expiry));
        let mut aborted = 0u64;
        let mut after: Option<Vec<u8>> = None;
        loop {
            if !is_leader(&self.raft) {
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
        let cmd = self
            .gate
            .command(self.kv.as_ref(), Command::AbortUpload(upload))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn an_epoch_gets_a_full_lease_from_when_this_leader_first_sees_it() {
        let t0 = Instant::now();
        let mut watch = EpochWatch::default();
        // Whatever its wall-clock stamps say (a record renewed by a leader
        // 36 minutes behind looks 36 minutes stale), a first sighting is a
        // renewal now.
        assert!(!watch.expired(3, 17, t0, LEASE));
        assert!(!watch.expired(3, 17, t0 + LEASE - Duration::from_millis(1), LEASE));
        assert!(watch.expired(3, 17, t0 + LEASE, LEASE));
    }

    #[test]
    fn a_renewal_restarts_the_lease_and_closed_epochs_are_forgotten() {
        let t0 = Instant::now();
        let mut watch = EpochWatch::default();
        assert!(!watch.expired(1, 0, t0, LEASE));
        assert!(!watch.expired(2, 5, t0, LEASE));
        let t1 = t0 + Duration::from_secs(20);
        assert!(!watch.expired(1, 1, t1, LEASE), "renewed at t1");
        assert!(!watch.expired(2, 5, t1, LEASE));
        let t2 = t0 + Duration::from_secs(31);
        assert!(!watch.expired(1, 1, t2, LEASE), "11 s since its renewal");
        assert!(watch.expired(2, 5, t2, LEASE), "31 s without a renewal");
        assert!(watch.expired(1, 1, t1 + LEASE, LEASE));
        watch.retain(&HashSet::from([1]));
        assert_eq!(watch.len(), 1);
        // Epoch numbers never come back, but were one seen again it would
        // start a new lease.
        assert!(!watch.expired(2, 5, t2, LEASE));
    }

    #[test]
    fn sessions_expire_by_the_applied_index_sampled_an_expiry_ago() {
        let expiry = Duration::from_secs(600);
        let t0 = Instant::now();
        let mut clock = SessionClock::default();
        clock.sample(t0, 100, expiry);
        assert_eq!(
            clock.expire_before(t0, expiry),
            None,
            "a new leader expires nothing"
        );
        let t1 = t0 + Duration::from_secs(300);
        clock.sample(t1, 5_000, expiry);
        assert_eq!(clock.expire_before(t1, expiry), None);
        // 600 s after the first sample: entries up to index 100 were
        // applied at least 600 s ago.
        let t2 = t0 + expiry;
        clock.sample(t2, 9_000, expiry);
        assert_eq!(clock.expire_before(t2, expiry), Some(101));
        let t3 = t1 + expiry;
        assert_eq!(clock.expire_before(t3, expiry), Some(5_001));
        assert_eq!(clock.len(), 2, "the t0 sample is dropped");
    }

    #[test]
    fn the_high_water_mark_is_a_fraction_of_the_bound_and_at_least_one() {
        assert_eq!(high_water_entries(100_000, 0.9), 90_000);
        assert_eq!(high_water_entries(8, 0.5), 4);
        assert_eq!(high_water_entries(4, 0.25), 1);
        assert_eq!(high_water_entries(2, 0.1), 1);
        assert_eq!(high_water_entries(8, 1.0), 8);
    }

    #[test]
    fn session_samples_stay_bounded() {
        let expiry = Duration::from_secs(64);
        let t0 = Instant::now();
        let mut clock = SessionClock::default();
        for i in 0..10_000u64 {
            let now = t0 + Duration::from_millis(100 * i);
            clock.sample(now, i, expiry);
            clock.expire_before(now, expiry);
        }
        assert!(
            clock.len() <= SESSION_SAMPLES as usize + 2,
            "{}",
            clock.len()
        );
        let now = t0 + Duration::from_millis(100 * 9_999);
        let before = clock.expire_before(now, expiry).unwrap();
        // The index sampled between 64 s and 65 s before `now`.
        assert!((9_349..=9_360).contains(&before), "{before}");
    }
}
