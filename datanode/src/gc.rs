//! Shard garbage collection: deletes the shards meta says are collectable.
//!
//! Shards become garbage when meta drops their blob (an aborted upload, an
//! overwritten or deleted object once its `delete_delay` has passed, a blob
//! whose commit failed or never happened) or when heal rebuilt a shard
//! elsewhere and this copy is stale. Every `gc_interval` the datanode runs
//! one pass ([`collect`]): it pages through its store ([`ShardStore::list`],
//! [`GC_PAGE_BLOBS`] blobs per page), skips shards younger than `gc_grace`,
//! asks a [`ReferenceOracle`] which of the others are collectable (meta's
//! `Collectable(node, [(blob, index)])`, at most [`GC_CALL_SHARDS`] per
//! call) and deletes exactly those shards, one path each (not whole blobs:
//! this node may hold a stale copy of one index of a live blob).
//!
//! # Safety
//! Safety does not depend on `gc_grace` or on any clock
//! (`docs/design/durability.md` §3, §5). Meta answers "collectable" only when the
//! blob's write epoch is closed (a commit naming it is refused from then
//! on) or its pending deletion's `delete_delay` has passed, no heal intent
//! names the shard, and no committed placement puts that index of the blob
//! on this node. Each condition, once true, stays true. The one way to
//! invalidate the answer is a heal writing the same shard path after the
//! read: GC holds the [`BlobLocks`] lock of every blob it asks about from
//! the call to the deletes, and PutShard's commit (the rename into place)
//! takes the same lock, so the new file is never deleted.
//!
//! `gc_grace` (default 10 min) is only an efficiency knob: shards that
//! young are most likely being committed, so meta is not asked about them.
//!
//! # Cost and pace
//! A pass is one listing walk (each fan-out directory read about once,
//! each shard stat'ed once: O(shards), see [`ShardStore::list`]), one
//! oracle call per [`GC_CALL_SHARDS`] old shards and one unlink per
//! collectable shard. It is paced by a token bucket of `gc_max_ops_per_sec`
//! ([`GcPass::max_ops_per_sec`]): every shard listed costs one operation
//! and every shard deleted one more, with a burst of one second's worth,
//! so GC's share of the disk (and of meta's `Collectable` load) stays
//! bounded whatever the store holds. A pass over `n` shards takes at
//! least `n / gc_max_ops_per_sec` seconds (10 M shards at the default
//! 2000/s: about 83 min); the next pass starts `gc_interval` after this
//! one's start, or at once when the pass took longer.
//!
//! GC never deletes on doubt: when the oracle fails (meta unreachable, an
//! error answer, `UNIMPLEMENTED` from an older meta) the pass stops without
//! deleting anything more, and the next pass asks again. Shards the oracle
//! returns that were not asked are ignored.
//!
//! # Metrics
//! `sluice_datanode_gc_deleted_shards_total` (label `node`): shards deleted
//! by GC.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::ShardRef;
use sluice_util::worker::WorkerHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::DEFAULT_GC_MAX_OPS_PER_SEC;
use crate::locks::BlobLocks;
use crate::scrub::TokenBucket;
use crate::store::{ShardKey, ShardStore, StoreError};

/// Counter, label `node`: shards deleted by GC.
pub const GC_DELETED_SHARDS_TOTAL: &str = "sluice_datanode_gc_deleted_shards_total";

/// Blobs per store page of a GC pass.
pub const GC_PAGE_BLOBS: usize = 1000;
/// Most shards per oracle call (meta's Collectable accepts at most 1000).
pub const GC_CALL_SHARDS: usize = 1000;

/// Registers the GC metric's description with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        GC_DELETED_SHARDS_TOTAL,
        metrics::Unit::Count,
        "Shards deleted by garbage collection"
    );
}

/// Answers which shards stored on a node are collectable: the only thing
/// GC needs from meta.
///
/// To ensure correctness an implementation must answer from state that
/// includes every commit applied before the call (meta's linearizable
/// read), and fail rather than guess: an `Err` makes GC delete nothing.
pub trait ReferenceOracle: Send + Sync + 'static {
    /// Why the answer is unknown.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The shards of `shards` (stored on `node_id`, at most
    /// [`GC_CALL_SHARDS`]) that are collectable.
    fn collectable(
        &self,
        node_id: u64,
        shards: Vec<ShardKey>,
    ) -> impl Future<Output = Result<Vec<ShardKey>, Self::Error>> + Send;
}

/// The production [`ReferenceOracle`]: meta's `Collectable` through a
/// leader-following [`MetaClient`].
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

    async fn collectable(
        &self,
        node_id: u64,
        shards: Vec<ShardKey>,
    ) -> Result<Vec<ShardKey>, MetaError> {
        let refs = shards
            .iter()
            .map(|k| ShardRef {
                blob_id: k.blob_id().to_string(),
                shard_index: k.shard_index(),
            })
            .collect();
        let answer = self.client.collectable(node_id, refs).await?;
        // An id the store could not hold was not asked about: drop it.
        Ok(answer
            .into_iter()
            .filter_map(|r| ShardKey::new(r.blob_id, r.shard_index).ok())
            .collect())
    }
}

/// Why a GC pass stopped. Nothing is deleted after the failure.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// Listing the store failed.
    #[error("list shards")]
    List(#[source] StoreError),
    /// The oracle could not say which shards are collectable.
    #[error("ask meta which shards are collectable")]
    Oracle(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Deleting a collectable shard failed (earlier ones are deleted).
    #[error("delete garbage shards")]
    Delete(#[source] StoreError),
}

/// What one GC pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Shards listed.
    pub scanned_shards: u64,
    /// Shards older than the grace period (asked about).
    pub old_shards: u64,
    /// Of those, shards the oracle said are collectable.
    pub collectable_shards: u64,
    /// Shards deleted.
    pub deleted_shards: u64,
}

/// Settings of [`collect`].
#[derive(Debug, Clone)]
pub struct GcPass {
    /// This datanode's id: the node meta is asked about.
    pub node_id: u64,
    /// Shards modified less than this long before `now` are not asked
    /// about (efficiency only, see the module docs).
    pub grace: Duration,
    /// The pass's notion of the current time (tests pass a fixed one).
    pub now: SystemTime,
    /// Blobs per store page (1..=[`GC_PAGE_BLOBS`]).
    pub page_blobs: usize,
    /// Most shards per oracle call (1..=[`GC_CALL_SHARDS`]).
    pub call_shards: usize,
    /// Pace of the pass: shards listed plus shards deleted per second
    /// (`gc_max_ops_per_sec`; 0 is taken as 1). See the module docs.
    pub max_ops_per_sec: u64,
    /// Value of the `node` metric label.
    pub node_label: String,
}

impl GcPass {
    /// A pass of node `node_id` at `now` with the default page sizes and
    /// pace ([`DEFAULT_GC_MAX_OPS_PER_SEC`]).
    pub fn new(node_id: u64, grace: Duration, now: SystemTime) -> Self {
        GcPass {
            node_id,
            grace,
            now,
            page_blobs: GC_PAGE_BLOBS,
            call_shards: GC_CALL_SHARDS,
            max_ops_per_sec: DEFAULT_GC_MAX_OPS_PER_SEC,
            node_label: node_id.to_string(),
        }
    }
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One GC pass over `store`: see the module docs. Memory is one page of
/// listing (`page_blobs` blobs) at a time, plus what the store keeps for
/// the walk. `locks` is shared with the PutShard service. Paced at
/// `pass.max_ops_per_sec` (the bucket starts full: one second's burst).
///
/// Errors: [`GcError::List`], [`GcError::Oracle`] (nothing deleted for
/// that call or after it), [`GcError::Delete`]. Calls before the failure
/// stay collected.
pub async fn collect<S: ShardStore, O: ReferenceOracle>(
    store: &S,
    oracle: &O,
    locks: &BlobLocks,
    pass: &GcPass,
) -> Result<GcReport, GcError> {
    let grace_ms = i64::try_from(pass.grace.as_millis()).unwrap_or(i64::MAX);
    let cutoff_ms = millis(pass.now).saturating_sub(grace_ms);
    let page_blobs = pass.page_blobs.clamp(1, GC_PAGE_BLOBS);
    let call_shards = pass.call_shards.clamp(1, GC_CALL_SHARDS);
    let mut bucket = TokenBucket::new(pass.max_ops_per_sec.max(1), Instant::now());
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
        pace(&mut bucket, page.shards.len() as u64).await;

        let old: Vec<ShardKey> = page
            .shards
            .into_iter()
            .filter(|s| s.modified_ms < cutoff_ms)
            .map(|s| s.key)
            .collect();
        report.old_shards += old.len() as u64;
        for chunk in old.chunks(call_shards) {
            let deleted = collect_call(store, oracle, locks, pass, chunk, &mut report).await?;
            // Outside the blob locks: a commit never waits on the pace.
            pace(&mut bucket, deleted).await;
            if deleted > 0 {
                metrics::counter!(GC_DELETED_SHARDS_TOTAL, "node" => pass.node_label.clone())
                    .increment(deleted);
                crate::metrics::set_shards_stored(&pass.node_label, store.stats().shards);
                tracing::debug!(node = %pass.node_label, deleted, "deleted collectable shards");
            }
        }
        if !page.is_truncated {
            return Ok(report);
        }
    }
}

/// Takes `ops` from `bucket` and sleeps off any debt.
async fn pace(bucket: &mut TokenBucket, ops: u64) {
    let wait = bucket.take(ops, Instant::now());
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// One oracle call and its deletes, under the locks of the asked blobs.
async fn collect_call<S: ShardStore, O: ReferenceOracle>(
    store: &S,
    oracle: &O,
    locks: &BlobLocks,
    pass: &GcPass,
    asked: &[ShardKey],
    report: &mut GcReport,
) -> Result<u64, GcError> {
    let _guard = locks
        .lock_all(asked.iter().map(|k| k.blob_id().to_string()).collect())
        .await;
    let answer = oracle
        .collectable(pass.node_id, asked.to_vec())
        .await
        .map_err(|e| GcError::Oracle(Box::new(e)))?;
    let asked: HashSet<&ShardKey> = asked.iter().collect();
    let mut garbage: Vec<ShardKey> = answer.into_iter().filter(|k| asked.contains(k)).collect();
    garbage.sort();
    garbage.dedup();
    report.collectable_shards += garbage.len() as u64;
    let mut deleted = 0;
    for key in &garbage {
        match store.delete_shard(key).await {
            Ok(true) => deleted += 1,
            Ok(false) => {}
            Err(e) => {
                report.deleted_shards += deleted;
                return Err(GcError::Delete(e));
            }
        }
    }
    report.deleted_shards += deleted;
    Ok(deleted)
}

/// The GC background task of a datanode.
pub(crate) struct Collector<S, O> {
    pub store: S,
    pub oracle: O,
    /// Shared with the PutShard service.
    pub locks: BlobLocks,
    pub node_id: u64,
    /// `gc_interval`: time between passes (the first one interval after start).
    pub interval: Duration,
    /// `gc_grace`.
    pub grace: Duration,
    /// `gc_max_ops_per_sec`.
    pub max_ops_per_sec: u64,
}

impl<S: ShardStore, O: ReferenceOracle> Collector<S, O> {
    /// Runs a pass every interval until `cancel` fires (a pass in progress
    /// is dropped then; what it deleted stays deleted).
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let cancel = worker.token().clone();
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
                node_label: node_label.clone(),
                max_ops_per_sec: self.max_ops_per_sec,
                ..GcPass::new(self.node_id, self.grace, SystemTime::now())
            };
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = collect(&self.store, &self.oracle, &self.locks, &pass) => r,
            };
            match result {
                Ok(r) => {
                    if r.deleted_shards > 0 {
                        tracing::info!(
                            node = self.node_id,
                            scanned = r.scanned_shards,
                            collectable = r.collectable_shards,
                            deleted = r.deleted_shards,
                            "garbage-collected shards"
                        );
                    } else {
                        tracing::debug!(
                            node = self.node_id,
                            scanned = r.scanned_shards,
                            old_shards = r.old_shards,
                            "shard GC found no garbage"
                        );
                    }
                    worker.ran();
                }
                Err(e) => worker.report_error(format_args!(
                    "shard GC pass stopped; retrying next interval: {}",
                    error_chain(&e)
                )),
            }
        }
    }
}

/// `error: cause: cause ...`, for one log line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
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
