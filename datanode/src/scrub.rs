//! Scrub: a background worker that reads every block of every shard,
//! verifies its CRC32C, and quarantines and reports the damaged shards
//! (`docs/design/durability.md` §7).
//!
//! One pass ([`scrub_pass`]) pages through the store ([`ShardStore::list`],
//! [`SCRUB_PAGE_BLOBS`] blobs per page) and reads each shard block by
//! block, paced by a [`TokenBucket`] of `scrub_bandwidth_bytes_per_sec`.
//! A shard whose header is bad, or a block of which fails its checksum or
//! length check, is moved out of the shard namespace
//! ([`ShardStore::quarantine`]) and reported to meta through a
//! [`DamageReporter`] (`ReportMissing`), so heal rebuilds it in place. Only
//! such evidence counts: an I/O error (EIO, EMFILE, ENOMEM) may be a
//! passing storage hiccup, so the shard is left as it is, counted, and read
//! again on the next pass.
//! Reports meta did not take stay pending (at most [`MAX_PENDING_REPORTS`])
//! and are sent again after the next pass.
//!
//! The worker ([`Scrubber`]) runs one pass per `scrub_interval`: the next
//! pass starts that long after the previous one started (at once if the
//! pass took longer). A bandwidth of 0 disables scrub.
//!
//! # Metrics (label `node`)
//! * `sluice_datanode_scrub_bytes_total`: stored bytes read by scrub.
//! * `sluice_datanode_scrub_shards_total`: shards scrubbed.
//! * `sluice_datanode_scrub_corrupt_shards_total`: shards found corrupt
//!   (quarantined, or left in place when the quarantine is full).
//! * `sluice_datanode_scrub_read_errors_total`: shards scrub could not read
//!   (I/O errors); retried on the next pass.
//! * `sluice_datanode_scrub_pass_seconds`: duration of the last pass.
//! * `sluice_datanode_scrub_progress_ratio`: shards done / shards stored in
//!   the current pass (1 when idle after a pass).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::ShardRef;
use sluice_util::worker::WorkerHandle;
use tokio::time::Instant;

use crate::store::{HEADER_LEN, Quarantine, ShardKey, ShardReader, ShardStore, StoreError};

/// Counter: stored bytes read by scrub.
pub const SCRUB_BYTES_TOTAL: &str = "sluice_datanode_scrub_bytes_total";
/// Counter: shards scrubbed.
pub const SCRUB_SHARDS_TOTAL: &str = "sluice_datanode_scrub_shards_total";
/// Counter: shards found corrupt (bad header, a block's checksum or length).
pub const SCRUB_CORRUPT_SHARDS_TOTAL: &str = "sluice_datanode_scrub_corrupt_shards_total";
/// Counter: shards scrub could not read for an I/O error (left in place).
pub const SCRUB_READ_ERRORS_TOTAL: &str = "sluice_datanode_scrub_read_errors_total";
/// Gauge: seconds the last complete pass took.
pub const SCRUB_PASS_SECONDS: &str = "sluice_datanode_scrub_pass_seconds";
/// Gauge: fraction (0..=1) of the stored shards the current pass has done.
pub const SCRUB_PROGRESS_RATIO: &str = "sluice_datanode_scrub_progress_ratio";

/// Blobs per store page of a scrub pass.
pub const SCRUB_PAGE_BLOBS: usize = 1000;
/// Most shards per `ReportMissing` call.
pub const REPORT_CALL_SHARDS: usize = 1000;
/// Most quarantined shards waiting to be reported to meta; beyond it a
/// shard is quarantined but not queued (heal's audit still finds it).
pub const MAX_PENDING_REPORTS: usize = 10_000;

/// Registers the scrub metrics' descriptions with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        SCRUB_BYTES_TOTAL,
        metrics::Unit::Bytes,
        "Stored bytes read by scrub"
    );
    metrics::describe_counter!(SCRUB_SHARDS_TOTAL, metrics::Unit::Count, "Shards scrubbed");
    metrics::describe_counter!(
        SCRUB_CORRUPT_SHARDS_TOTAL,
        metrics::Unit::Count,
        "Shards scrub found corrupt and quarantined"
    );
    metrics::describe_counter!(
        SCRUB_READ_ERRORS_TOTAL,
        metrics::Unit::Count,
        "Shards scrub could not read (I/O errors), left in place and retried next pass"
    );
    metrics::describe_gauge!(
        SCRUB_PASS_SECONDS,
        metrics::Unit::Seconds,
        "Duration of the last scrub pass"
    );
    metrics::describe_gauge!(
        SCRUB_PROGRESS_RATIO,
        metrics::Unit::Count,
        "Fraction of stored shards the current scrub pass has read"
    );
}

/// Tells meta which shards this node lost (quarantined): the only thing
/// scrub needs from meta.
pub trait DamageReporter: Send + Sync + 'static {
    /// Why the report was not taken.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Reports `shards` (at most [`REPORT_CALL_SHARDS`]) of node `node_id`
    /// as missing. `Ok` means meta recorded them (idempotent).
    fn report_missing(
        &self,
        node_id: u64,
        shards: Vec<ShardKey>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// The production [`DamageReporter`]: meta's `ReportMissing`.
#[derive(Clone)]
pub struct MetaReporter {
    client: MetaClient,
}

impl MetaReporter {
    /// A reporter over `client`.
    pub fn new(client: MetaClient) -> Self {
        MetaReporter { client }
    }
}

impl DamageReporter for MetaReporter {
    type Error = MetaError;

    async fn report_missing(&self, node_id: u64, shards: Vec<ShardKey>) -> Result<(), MetaError> {
        let refs = shards
            .iter()
            .map(|k| ShardRef {
                blob_id: k.blob_id().to_string(),
                shard_index: k.shard_index(),
            })
            .collect();
        self.client.report_missing(node_id, refs).await.map(drop)
    }
}

/// Paces reads to `rate` bytes per second with a burst of one second's
/// worth (at least one largest block). Pure: the caller passes the time.
/// GC uses it with shard operations for bytes ([`crate::gc`]).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Bytes per second (> 0).
    rate: u64,
    /// Most tokens (bytes) saved up.
    capacity: f64,
    /// Bytes that may be read now; negative = debt to wait out.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of `rate` bytes per second (`rate` >= 1) at `now`.
    pub fn new(rate: u64, now: Instant) -> Self {
        let rate = rate.max(1);
        let capacity = rate as f64;
        TokenBucket {
            rate,
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes `bytes` at `now` and returns how long to wait before reading
    /// on (zero while within the burst). A take larger than the bucket
    /// goes into debt, so the long-run rate holds for any read size.
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.capacity);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate as f64)
        }
    }
}

/// Why a scrub pass stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    /// Listing the store failed.
    #[error("list shards")]
    List(#[source] StoreError),
    /// Moving a corrupt shard out of the way failed.
    #[error("quarantine shard")]
    Quarantine(#[source] StoreError),
    /// The store is shutting down.
    #[error("store is shutting down")]
    ShuttingDown,
}

/// What one scrub pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Shards read to the end or found corrupt.
    pub scrubbed_shards: u64,
    /// Stored bytes read (headers, data and checksums).
    pub scrubbed_bytes: u64,
    /// Shards found corrupt (quarantined, or left in place when the
    /// quarantine is full), and reported.
    pub corrupt_shards: u64,
    /// Shards that could not be read (I/O errors), left as they are.
    pub read_errors: u64,
    /// Shards meta took a report of (this pass's and earlier ones').
    pub reported_shards: u64,
    /// Shards still waiting to be reported.
    pub pending_reports: u64,
}

/// State of a [`Scrubber`], for [`ScrubProgress::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubState {
    /// Waiting for the next pass (or disabled).
    Idle = 0,
    /// A pass is reading shards.
    Running = 1,
}

/// Progress counters of a scrub worker, shared with whoever watches it.
#[derive(Debug, Default)]
pub struct ScrubProgress {
    state: AtomicU8,
    /// Complete passes.
    pub passes: AtomicU64,
    /// Shards done in the current (or last) pass.
    pub shards_done: AtomicU64,
    /// Shards stored when the current (or last) pass started.
    pub shards_total: AtomicU64,
}

impl ScrubProgress {
    /// Idle or running.
    pub fn state(&self) -> ScrubState {
        match self.state.load(Ordering::Relaxed) {
            1 => ScrubState::Running,
            _ => ScrubState::Idle,
        }
    }

    fn set_state(&self, s: ScrubState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
}

/// Settings and carried-over state of scrub passes.
pub struct ScrubPass<'a> {
    /// This datanode's id (reported to meta).
    pub node_id: u64,
    /// Value of the `node` metric label.
    pub node_label: String,
    /// Blobs per store page (1..=[`SCRUB_PAGE_BLOBS`]).
    pub page_blobs: usize,
    /// Paces the reads.
    pub bucket: &'a mut TokenBucket,
    /// Quarantined shards not yet reported, carried from pass to pass
    /// (at most [`MAX_PENDING_REPORTS`]).
    pub pending: &'a mut BTreeSet<ShardKey>,
    /// Updated as the pass goes.
    pub progress: &'a ScrubProgress,
}

/// How reading one shard ended.
enum Outcome {
    Sound,
    /// Deleted or replaced since it was listed.
    Gone,
    /// Evidence of corruption: a bad header, or a block's checksum or
    /// length.
    Corrupt(StoreError),
    /// Not read to the end for another reason (an I/O error): no evidence
    /// either way.
    Unread(StoreError),
}

/// Sorts a store error met while reading a shard.
fn outcome_of(e: StoreError) -> Result<Outcome, ScrubError> {
    match e {
        StoreError::NotFound(_) => Ok(Outcome::Gone),
        StoreError::ShuttingDown => Err(ScrubError::ShuttingDown),
        e @ StoreError::Corrupt { .. } => Ok(Outcome::Corrupt(e)),
        e => Ok(Outcome::Unread(e)),
    }
}

/// Reads every block of `key`, paced by the bucket; adds the bytes read.
async fn read_shard<S: ShardStore>(
    store: &S,
    key: &ShardKey,
    bucket: &mut TokenBucket,
    bytes: &mut u64,
) -> Result<Outcome, ScrubError> {
    let mut reader = match store.open(key, 0, 0).await {
        Ok(r) => r,
        Err(e) => return outcome_of(e),
    };
    *bytes += HEADER_LEN;
    pace(bucket, HEADER_LEN).await;
    while let Some(block) = reader.next_block().await {
        match block {
            Ok(b) => {
                let stored = b.data.len() as u64 + 4;
                *bytes += stored;
                pace(bucket, stored).await;
            }
            Err(e) => return outcome_of(e),
        }
    }
    Ok(Outcome::Sound)
}

/// Takes `bytes` from `bucket` and sleeps out any debt.
pub(crate) async fn pace(bucket: &mut TokenBucket, bytes: u64) {
    let wait = bucket.take(bytes, Instant::now());
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// One scrub pass over `store`, then the pending reports: see the module
/// docs. A failed report keeps the shards pending for the next pass.
///
/// Errors: [`ScrubError::List`], [`ScrubError::Quarantine`],
/// [`ScrubError::ShuttingDown`] (reports are not sent then; they stay
/// pending).
pub async fn scrub_pass<S: ShardStore, R: DamageReporter>(
    store: &S,
    reporter: &R,
    pass: &mut ScrubPass<'_>,
) -> Result<ScrubReport, ScrubError> {
    let label = pass.node_label.clone();
    let page_blobs = pass.page_blobs.clamp(1, SCRUB_PAGE_BLOBS);
    let total = store.stats().shards;
    pass.progress.shards_total.store(total, Ordering::Relaxed);
    pass.progress.shards_done.store(0, Ordering::Relaxed);
    let mut report = ScrubReport::default();
    let mut after = String::new();
    'pages: loop {
        let page = store
            .list(&after, page_blobs)
            .await
            .map_err(ScrubError::List)?;
        let Some(last) = page.shards.last() else {
            break 'pages;
        };
        after = last.key.blob_id().to_string();
        for entry in &page.shards {
            let mut bytes = 0;
            let outcome = read_shard(store, &entry.key, pass.bucket, &mut bytes).await?;
            report.scrubbed_bytes += bytes;
            metrics::counter!(SCRUB_BYTES_TOTAL, "node" => label.clone()).increment(bytes);
            match outcome {
                Outcome::Gone => continue,
                Outcome::Sound => {}
                Outcome::Unread(e) => {
                    tracing::warn!(node = pass.node_id, shard = %entry.key, error = %e, "scrub: could not read shard; leaving it and reading it again next pass");
                    report.read_errors += 1;
                    metrics::counter!(SCRUB_READ_ERRORS_TOTAL, "node" => label.clone())
                        .increment(1);
                }
                Outcome::Corrupt(e) => {
                    let done = store
                        .quarantine(&entry.key)
                        .await
                        .map_err(ScrubError::Quarantine)?;
                    if done == Quarantine::NotStored {
                        continue;
                    }
                    tracing::warn!(node = pass.node_id, shard = %entry.key, error = %e, quarantine = ?done, "scrub: corrupt shard; reporting it to meta");
                    report.corrupt_shards += 1;
                    metrics::counter!(SCRUB_CORRUPT_SHARDS_TOTAL, "node" => label.clone())
                        .increment(1);
                    crate::metrics::set_shards_stored(&label, store.stats().shards);
                    if pass.pending.len() < MAX_PENDING_REPORTS {
                        pass.pending.insert(entry.key.clone());
                    } else {
                        tracing::warn!(node = pass.node_id, shard = %entry.key, "scrub: too many unreported damaged shards; this one is not queued");
                    }
                }
            }
            report.scrubbed_shards += 1;
            metrics::counter!(SCRUB_SHARDS_TOTAL, "node" => label.clone()).increment(1);
            let done = pass.progress.shards_done.fetch_add(1, Ordering::Relaxed) + 1;
            let ratio = if total == 0 {
                1.0
            } else {
                (done as f64 / total as f64).min(1.0)
            };
            metrics::gauge!(SCRUB_PROGRESS_RATIO, "node" => label.clone()).set(ratio);
        }
        if !page.is_truncated {
            break 'pages;
        }
    }
    metrics::gauge!(SCRUB_PROGRESS_RATIO, "node" => label.clone()).set(1.0);
    report.reported_shards = send_reports(reporter, pass).await;
    report.pending_reports = pass.pending.len() as u64;
    Ok(report)
}

/// Sends the pending reports in calls of [`REPORT_CALL_SHARDS`]; stops at
/// the first failure. Returns how many meta took.
async fn send_reports<R: DamageReporter>(reporter: &R, pass: &mut ScrubPass<'_>) -> u64 {
    let mut sent = 0;
    while !pass.pending.is_empty() {
        let chunk: Vec<ShardKey> = pass
            .pending
            .iter()
            .take(REPORT_CALL_SHARDS)
            .cloned()
            .collect();
        match reporter.report_missing(pass.node_id, chunk.clone()).await {
            Ok(()) => {
                for k in &chunk {
                    pass.pending.remove(k);
                }
                sent += chunk.len() as u64;
            }
            Err(e) => {
                tracing::warn!(node = pass.node_id, pending = pass.pending.len(), error = %e, "scrub: meta did not take the damaged-shard report; retrying after the next pass");
                break;
            }
        }
    }
    sent
}

/// The scrub background task of a datanode.
pub(crate) struct Scrubber<S, R> {
    pub store: S,
    pub reporter: R,
    pub node_id: u64,
    /// `scrub_interval`: from the start of one pass to the start of the next.
    pub interval: Duration,
    /// `scrub_bandwidth_bytes_per_sec`; 0 disables scrub.
    pub bandwidth: u64,
    /// Shared progress counters.
    pub progress: Arc<ScrubProgress>,
}

impl<S: ShardStore, R: DamageReporter> Scrubber<S, R> {
    /// Runs passes until `cancel` fires (a pass in progress is dropped;
    /// what it quarantined stays quarantined, unsent reports are lost and
    /// meta's audit finds those shards missing).
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let cancel = worker.token().clone();
        if self.bandwidth == 0 {
            tracing::info!(
                node = self.node_id,
                "scrub disabled (scrub_bandwidth_bytes_per_sec = 0)"
            );
            worker.idle();
            cancel.cancelled().await;
            return;
        }
        let label = self.node_id.to_string();
        let mut bucket = TokenBucket::new(self.bandwidth, Instant::now());
        let mut pending = BTreeSet::new();
        loop {
            let started = Instant::now();
            self.progress.set_state(ScrubState::Running);
            let mut pass = ScrubPass {
                node_id: self.node_id,
                node_label: label.clone(),
                page_blobs: SCRUB_PAGE_BLOBS,
                bucket: &mut bucket,
                pending: &mut pending,
                progress: &self.progress,
            };
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = scrub_pass(&self.store, &self.reporter, &mut pass) => r,
            };
            self.progress.set_state(ScrubState::Idle);
            let elapsed = started.elapsed();
            match result {
                Ok(r) => {
                    self.progress.passes.fetch_add(1, Ordering::Relaxed);
                    metrics::gauge!(SCRUB_PASS_SECONDS, "node" => label.clone())
                        .set(elapsed.as_secs_f64());
                    tracing::info!(
                        node = self.node_id,
                        shards = r.scrubbed_shards,
                        bytes = r.scrubbed_bytes,
                        corrupt = r.corrupt_shards,
                        reported = r.reported_shards,
                        pending_reports = r.pending_reports,
                        seconds = elapsed.as_secs_f64(),
                        "scrub pass done"
                    );
                    worker.ran();
                }
                Err(ScrubError::ShuttingDown) => return,
                Err(e) => worker.report_error(format_args!(
                    "scrub pass stopped; retrying next interval: {}",
                    crate::gc::error_chain(&e)
                )),
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(started + self.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
