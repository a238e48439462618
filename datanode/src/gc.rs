//! Shard garbage collection: deletes the shards of blobs that no committed
//! part or object references, once they are older than a grace period.
//!
//! Shards become garbage when meta drops their blob: an upload aborted by
//! a client or by meta's stale-upload sweeper, an overwritten or deleted
//! object whose release the gateway could not deliver, a blob whose commit
//! failed or never happened (gateway crash). Every `gc_interval` the
//! datanode runs one pass ([`collect`]): it pages through its store
//! ([`ShardStore::list`], [`GC_PAGE_BLOBS`] blobs per page), keeps the
//! blobs whose every shard here is older than `gc_grace` (by the shard
//! file's modification time), asks a [`ReferenceOracle`] which of them no
//! part or object references, and deletes those.
//!
//! # The invariant
//! A shard is written before the record that references it is committed
//! in meta, so for a while every new shard is legitimately unreferenced.
//! GC is safe only while
//!
//! > **write-to-commit time < `gc_grace`**: a part or object record that
//! > references a blob is committed in meta (if ever) less than `gc_grace`
//! > after the first write of any shard of that blob.
//!
//! The gateway writes all shards of a blob, then commits right after the
//! last stripe is durable and gives up after its meta retry deadline
//! (seconds), so the default grace of one hour leaves a wide margin; never
//! set `gc_grace` below the longest possible write-to-commit time. A
//! shard's mtime (its last write) is never earlier than the blob's first
//! write, so "every shard of the blob here is older than `gc_grace`" implies
//! the blob's commit window has closed: if meta, after a linearizable read,
//! says it is unreferenced, it can never become referenced again and all
//! of its shards are garbage. A forward jump of the datanode's wall clock
//! counts as elapsed time, so keep clocks slewed, not stepped, or the
//! grace generous.
//!
//! GC never deletes on doubt: when the oracle fails (meta unreachable, an
//! error answer) the pass stops without deleting anything more, and the
//! next pass asks again. Ids the oracle returns that were not asked are
//! ignored.
//!
//! # Metrics
//! `sluice_datanode_gc_deleted_shards_total` (label `node`): shards deleted
//! by GC.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_meta::{MetaClient, MetaError};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::store::{ShardStore, StoreError};

/// Counter, label `node`: shards deleted by GC.
pub const GC_DELETED_SHARDS_TOTAL: &str = "sluice_datanode_gc_deleted_shards_total";

/// Blobs per store page, and so most blob ids per oracle call (meta's
/// FilterUnreferenced accepts at most 1000).
pub const GC_PAGE_BLOBS: usize = 1000;

/// Registers the GC metric's description with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        GC_DELETED_SHARDS_TOTAL,
        metrics::Unit::Count,
        "Shards deleted by garbage collection"
    );
}

/// Answers which blobs no committed part or object references: the only
/// thing GC needs from meta.
///
/// To ensure correctness an implementation must answer from state that
/// includes every commit applied before the call (meta's linearizable
/// read), and fail rather than guess: an `Err` makes GC delete nothing.
pub trait ReferenceOracle: Send + Sync + 'static {
    /// Why the answer is unknown.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The ids of `blob_ids` (at most [`GC_PAGE_BLOBS`]) that nothing
    /// references.
    fn unreferenced(
        &self,
        blob_ids: Vec<String>,
    ) -> impl Future<Output = Result<Vec<String>, Self::Error>> + Send;
}

/// The production [`ReferenceOracle`]: meta's `FilterUnreferenced`
/// through a leader-following [`MetaClient`].
#[derive(Clone)]
pub struct MetaOracle {
    client: MetaClient,
}

impl MetaOracle {
    /// An oracle over `client`.
    pub fn new(client: MetaClient) -> Self {
        MetaOracle { client }
    }
}

impl ReferenceOracle for MetaOracle {
    type Error = MetaError;

    async fn unreferenced(&self, blob_ids: Vec<String>) -> Result<Vec<String>, MetaError> {
        self.client.filter_unreferenced(blob_ids).await
    }
}

/// Why a GC pass stopped. Nothing is deleted after the failure.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// Listing the store failed.
    #[error("list shards")]
    List(#[source] StoreError),
    /// The oracle could not say which blobs are unreferenced.
    #[error("ask meta which blobs are unreferenced")]
    Oracle(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Deleting garbage blobs failed (some may be deleted).
    #[error("delete garbage shards")]
    Delete(#[source] StoreError),
}

/// What one GC pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Shards listed.
    pub scanned_shards: u64,
    /// Blobs whose every shard here is older than the grace period (asked about).
    pub old_blobs: u64,
    /// Of those, blobs the oracle said are unreferenced.
    pub unreferenced_blobs: u64,
    /// Shards deleted.
    pub deleted_shards: u64,
}

/// Settings of [`collect`].
#[derive(Debug, Clone)]
pub struct GcPass {
    /// Shards modified less than this long before `now` are never collected.
    pub grace: Duration,
    /// The pass's notion of the current time (tests pass a fixed one).
    pub now: SystemTime,
    /// Blobs per store page and oracle call (1..=[`GC_PAGE_BLOBS`]).
    pub page_blobs: usize,
    /// Value of the `node` metric label.
    pub node_label: String,
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One GC pass over `store`: see the module docs. Memory is one page of
/// listing (`page_blobs` blobs) at a time.
///
/// Errors: [`GcError::List`], [`GcError::Oracle`] (nothing deleted for
/// that page or after it), [`GcError::Delete`]. Pages before the failure
/// stay collected.
pub async fn collect<S: ShardStore, O: ReferenceOracle>(
    store: &S,
    oracle: &O,
    pass: &GcPass,
) -> Result<GcReport, GcError> {
    let grace_ms = i64::try_from(pass.grace.as_millis()).unwrap_or(i64::MAX);
    let cutoff_ms = millis(pass.now).saturating_sub(grace_ms);
    let page_blobs = pass.page_blobs.clamp(1, GC_PAGE_BLOBS);
    let mut report = GcReport::default();
    let mut after = String::new();
    loop {
        let page = store
            .list(&after, page_blobs)
            .await
            .map_err(GcError::List)?;
        let Some(last) = page.shards.last() else {
            return Ok(report);
        };
        after = last.key.blob_id().to_string();
        report.scanned_shards += page.shards.len() as u64;

        // A blob is old when every shard of it here is (a page holds all
        // shards of its blobs).
        let mut blobs: BTreeMap<&str, bool> = BTreeMap::new();
        for shard in &page.shards {
            let old = shard.modified_ms < cutoff_ms;
            blobs
                .entry(shard.key.blob_id())
                .and_modify(|all_old| *all_old &= old)
                .or_insert(old);
        }
        let old: Vec<String> = blobs
            .into_iter()
            .filter(|(_, all_old)| *all_old)
            .map(|(id, _)| id.to_string())
            .collect();

        if !old.is_empty() {
            report.old_blobs += old.len() as u64;
            let asked: HashSet<String> = old.iter().cloned().collect();
            let answer = oracle
                .unreferenced(old)
                .await
                .map_err(|e| GcError::Oracle(Box::new(e)))?;
            let mut garbage: Vec<String> =
                answer.into_iter().filter(|id| asked.contains(id)).collect();
            garbage.sort();
            garbage.dedup();
            if !garbage.is_empty() {
                report.unreferenced_blobs += garbage.len() as u64;
                let deleted = store
                    .delete_blobs(&garbage)
                    .await
                    .map_err(GcError::Delete)?;
                report.deleted_shards += deleted;
                metrics::counter!(GC_DELETED_SHARDS_TOTAL, "node" => pass.node_label.clone())
                    .increment(deleted);
                crate::metrics::set_shards_stored(&pass.node_label, store.stats().shards);
                tracing::debug!(node = %pass.node_label, blobs = garbage.len(), deleted, "deleted unreferenced shards");
            }
        }
        if !page.is_truncated {
            return Ok(report);
        }
    }
}

/// The GC background task of a datanode.
pub(crate) struct Collector<S, O> {
    pub store: S,
    pub oracle: O,
    pub node_id: u64,
    /// `gc_interval`: time between passes (the first one interval after start).
    pub interval: Duration,
    /// `gc_grace`.
    pub grace: Duration,
}

impl<S: ShardStore, O: ReferenceOracle> Collector<S, O> {
    /// Runs a pass every interval until `cancel` fires (a pass in progress
    /// is dropped then; what it deleted stays deleted).
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticker = tokio::time::interval_at(start, self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let node_label = self.node_id.to_string();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let pass = GcPass {
                grace: self.grace,
                now: SystemTime::now(),
                page_blobs: GC_PAGE_BLOBS,
                node_label: node_label.clone(),
            };
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = collect(&self.store, &self.oracle, &pass) => r,
            };
            match result {
                Ok(r) if r.deleted_shards > 0 => tracing::info!(
                    node = self.node_id,
                    scanned = r.scanned_shards,
                    blobs = r.unreferenced_blobs,
                    deleted = r.deleted_shards,
                    "garbage-collected unreferenced shards"
                ),
                Ok(r) => tracing::debug!(
                    node = self.node_id,
                    scanned = r.scanned_shards,
                    old_blobs = r.old_blobs,
                    "shard GC found no garbage"
                ),
                Err(e) => tracing::warn!(
                    node = self.node_id,
                    error = %error_chain(&e),
                    "shard GC pass stopped; retrying next interval"
                ),
            }
        }
    }
}

/// `error: cause: cause ...`, for one log line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests;
