//! The leader's reclaimer: deletes the shards of released blobs once their
//! `delete_delay` passed (`docs/design/durability.md` §4).
//!
//! Every `reclaim_interval` each meta node samples its applied log index
//! on its monotonic clock. On the leader only, the reclaimer then pages
//! the pending deletions released at or below the index it sampled
//! `delete_delay` ago ([`sm::pending::due`], [`PAGE`] records per page, at
//! most [`MAX_PASS_RECORDS`] per pass), claims them (`ClaimPending`, at
//! most [`MAX_IDS_PER_CALL`] ids per entry: a blob a read lease names stays
//! unclaimed), groups the claimed blob ids by the nodes that have not
//! confirmed yet, and sends each node `DeleteBlobs` (at most
//! [`MAX_IDS_PER_CALL`] ids per call, at most `reclaim_concurrency` calls
//! in flight, `reclaim_call_timeout` per call). For every call a node
//! answered OK it proposes `CollectPending`; a node that failed (down,
//! timeout, unregistered) keeps its entries for the next pass.
//!
//! The deleter sits behind [`ShardDeleter`] ([`GrpcDeleter`] in production,
//! a fake in tests).
//!
//! # Metrics
//! `sluice_meta_pending_deletions` (gauge, records seen by the last pass:
//! approximate, a pass reads at most [`MAX_PASS_RECORDS`]),
//! `sluice_meta_reclaimed_blobs_total` (blob ids a datanode confirmed).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use sluice_proto::datanode::DeleteBlobsRequest;
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::raft::{self as rpb, meta_command::Command};
use sluice_util::worker::WorkerHandle;
use tonic::transport::Channel;

use crate::raft::MetaRaft;
use crate::sm::{self, SmError};
use crate::store::KvStore;
use crate::sweeper::{SessionClock, applied_index, is_leader, periodic};
use tokio::time::Instant;

/// Gauge: pending deletions seen by the reclaimer's last pass.
pub const PENDING_DELETIONS: &str = "sluice_meta_pending_deletions";

/// Counter: released blob ids whose shards a datanode confirmed deleted.
pub const RECLAIMED_BLOBS_TOTAL: &str = "sluice_meta_reclaimed_blobs_total";

/// Most blob ids in one DeleteBlobs call.
pub const MAX_IDS_PER_CALL: usize = 1000;

/// Pending deletions read per page.
pub const PAGE: usize = 1000;

/// Most pending deletions one pass reads; the next pass goes on from
/// where this one stopped (a cursor), so every record is read within
/// `ceil(records / MAX_PASS_RECORDS)` passes.
pub const MAX_PASS_RECORDS: usize = 10_000;

/// Most channels [`GrpcDeleter`] keeps (one per datanode address).
pub const MAX_CHANNELS: usize = 1024;

/// Why one DeleteBlobs call failed; the node keeps its entries.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// The datanode address is not a valid endpoint.
    #[error("bad datanode address {addr:?}: {message}")]
    Addr { addr: String, message: String },
    /// The call failed (connect, transport, or the datanode's status).
    #[error("DeleteBlobs: {0}")]
    Status(#[from] tonic::Status),
    /// No answer within the call timeout.
    #[error("DeleteBlobs timed out after {0:?}")]
    Timeout(Duration),
}

/// Deletes every shard of some blobs on one datanode.
pub trait ShardDeleter: Send + Sync + 'static {
    /// Deletes the shards of `blob_ids` on datanode `node_id` at `addr`;
    /// `Ok` once the datanode confirmed (a blob it never had counts).
    fn delete_blobs(
        &self,
        node_id: u64,
        addr: &str,
        blob_ids: Vec<String>,
    ) -> impl Future<Output = Result<(), DeleteError>> + Send;
}

/// [`ShardDeleter`] over the datanodes' gRPC `DeleteBlobs`, with one lazy
/// channel per address (at most [`MAX_CHANNELS`]).
pub struct GrpcDeleter {
    timeout: Duration,
    transport: sluice_net::Transport,
    channels: Mutex<HashMap<String, Channel>>,
}

impl GrpcDeleter {
    /// A deleter whose calls (connect included) time out after `timeout`.
    pub fn new(timeout: Duration, transport: sluice_net::Transport) -> Self {
        GrpcDeleter {
            timeout,
            transport,
            channels: Mutex::new(HashMap::new()),
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, DeleteError> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = self
            .transport
            .endpoint(addr, sluice_net::Role::Datanode)
            .map_err(|e| DeleteError::Addr {
                addr: addr.to_string(),
                message: e.to_string(),
            })?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        let channel = self.transport.dial(endpoint);
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

impl ShardDeleter for GrpcDeleter {
    async fn delete_blobs(
        &self,
        _node_id: u64,
        addr: &str,
        blob_ids: Vec<String>,
    ) -> Result<(), DeleteError> {
        let mut client = DatanodeClient::new(self.channel(addr)?);
        let call = client.delete_blobs(DeleteBlobsRequest { blob_ids });
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(DeleteError::Status(status)),
            Err(_) => Err(DeleteError::Timeout(self.timeout)),
        }
    }
}

/// Why a pass stopped early. The next tick starts a new one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReclaimError {
    /// This node is no longer the leader.
    #[error("lost leadership")]
    NotLeader,
    /// Reading pending deletions or the registry failed.
    #[error("read the state machine: {0}")]
    Read(#[from] SmError),
    /// Raft refused or failed CollectPending.
    #[error("propose CollectPending: {0}")]
    Raft(String),
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PassStats {
    /// Pending deletions read.
    pub scanned: usize,
    /// Of those, past their delete delay (or claimed before).
    pub due: usize,
    /// Due but not claimed: a read lease names them.
    pub leased: usize,
    /// (node, blob) deletions confirmed and collected.
    pub confirmed: usize,
    /// DeleteBlobs calls that failed.
    pub failed_calls: usize,
}

/// The reclaimer of one meta node.
pub(crate) struct Reclaimer<K: KvStore, D: ShardDeleter> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub gate: Arc<crate::version::Gate>,
    pub deleter: Arc<D>,
    /// `reclaim_interval`.
    pub interval: Duration,
    /// `delete_delay`.
    pub delete_delay: Duration,
    /// `reclaim_concurrency`: most DeleteBlobs calls in flight.
    pub concurrency: usize,
    /// Blob id after which the next pass reads; `None` from the start.
    pub cursor: Mutex<Option<String>>,
    /// Samples of this node's applied index on its monotonic clock, taken
    /// on every tick, leader or not: an entry at or below an index sampled
    /// at `t` was committed by `t`.
    pub clock: Mutex<SessionClock>,
}

/// One due pending deletion as a pass reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DueRecord {
    pub blob_id: String,
    /// Nodes that have not confirmed yet.
    pub nodes: Vec<u64>,
    /// Claimed by an earlier pass.
    pub claimed: bool,
}

/// What one pass read: the due records, and where the next pass goes on.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Window {
    pub due: Vec<DueRecord>,
    pub scanned: usize,
    /// The cursor for the next pass: `None` when this one reached the end.
    pub next: Option<String>,
}

/// Reads the pending deletions after `cursor`, [`PAGE`] per page, until
/// the end or `max_records` read, and keeps those due: claimed, or
/// released at or below `released_before_index` (none of those when it is
/// `None`: this node has no sample old enough yet).
pub(crate) fn read_window<K: KvStore>(
    kv: &K,
    released_before_index: Option<u64>,
    cursor: Option<String>,
    max_records: usize,
    page_len: usize,
) -> Result<Window, SmError> {
    let mut w = Window::default();
    let mut wrap = cursor.is_some();
    let mut after = cursor;
    loop {
        let page = sm::pending::due(kv, released_before_index, after.as_deref(), page_len)?;
        // A cursor at the last record: start over in this pass rather than
        // spend one reading nothing.
        if wrap && page.scanned == 0 && w.scanned == 0 {
            wrap = false;
            after = None;
            continue;
        }
        wrap = false;
        w.scanned += page.scanned;
        for record in page.due {
            let Some(placement) = record.placement else {
                continue;
            };
            w.due.push(DueRecord {
                blob_id: placement.blob_id,
                nodes: record.remaining_nodes,
                claimed: record.claimed,
            });
        }
        match page.next {
            Some(next) if w.scanned < max_records => after = Some(next),
            next => {
                w.next = next;
                return Ok(w);
            }
        }
    }
}

impl<K: KvStore, D: ShardDeleter> Reclaimer<K, D> {
    /// Runs a pass every interval while this node is the leader,
    /// reporting to `worker`. Runs until dropped.
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let mut ticker = periodic(self.interval);
        loop {
            ticker.tick().await;
            self.sample();
            if !is_leader(&self.raft) {
                worker.idle();
                continue;
            }
            match self.pass().await {
                Ok(stats) => {
                    if stats.due > 0 {
                        tracing::info!(?stats, "reclaimed released blobs");
                    }
                    worker.ran();
                }
                Err(ReclaimError::NotLeader) => {
                    tracing::info!("lost leadership during the reclaim pass");
                    worker.idle();
                }
                Err(e) => worker.report_error(format_args!("reclaim pass stopped: {e}")),
            }
        }
    }

    fn sample(&self) {
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        clock.sample(Instant::now(), applied_index(&self.raft), self.delete_delay);
    }

    /// The highest log index whose releases are `delete_delay` old by this
    /// node's monotonic clock; `None` before it has such a sample.
    fn released_before_index(&self) -> Option<u64> {
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        // One past the sample's index: the sample's index is the cutoff.
        clock
            .expire_before(Instant::now(), self.delete_delay)
            .map(|i| i.saturating_sub(1))
    }

    /// One pass: claim what is due, delete what is claimed and collect
    /// what was confirmed.
    pub(crate) async fn pass(&self) -> Result<PassStats, ReclaimError> {
        let cursor = self
            .cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let window = read_window(
            self.kv.as_ref(),
            self.released_before_index(),
            cursor,
            MAX_PASS_RECORDS,
            PAGE,
        )?;
        *self.cursor.lock().unwrap_or_else(PoisonError::into_inner) = window.next;
        let mut stats = PassStats {
            scanned: window.scanned,
            due: window.due.len(),
            ..PassStats::default()
        };
        metrics::gauge!(PENDING_DELETIONS).set(stats.scanned as f64);

        // Claim first: a record a read lease names stays unclaimed, and
        // nothing unclaimed is deleted.
        let unclaimed: Vec<String> = window
            .due
            .iter()
            .filter(|r| !r.claimed)
            .map(|r| r.blob_id.clone())
            .collect();
        let mut claimed: HashSet<String> = HashSet::new();
        for chunk in unclaimed.chunks(MAX_IDS_PER_CALL) {
            claimed.extend(self.claim(chunk.to_vec()).await?);
        }
        stats.leased = unclaimed.len() - claimed.len();
        let mut by_node: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for r in window.due {
            if !r.claimed && !claimed.contains(&r.blob_id) {
                continue;
            }
            for node in r.nodes {
                by_node.entry(node).or_default().push(r.blob_id.clone());
            }
        }

        let mut calls = Vec::new();
        for (node, blobs) in by_node {
            let addr = match sm::get_datanode(self.kv.as_ref(), node)? {
                Some(info) if !info.addr.is_empty() => info.addr,
                _ => {
                    tracing::warn!(
                        node,
                        blobs = blobs.len(),
                        "pending deletions name an unregistered datanode"
                    );
                    continue;
                }
            };
            for chunk in blobs.chunks(MAX_IDS_PER_CALL) {
                calls.push((node, addr.clone(), chunk.to_vec()));
            }
        }
        let deleter = &self.deleter;
        let mut results = futures::stream::iter(calls)
            .map(|(node, addr, ids)| async move {
                let r = deleter.delete_blobs(node, &addr, ids.clone()).await;
                (node, addr, ids, r)
            })
            .buffer_unordered(self.concurrency.max(1));
        while let Some((node, addr, ids, result)) = results.next().await {
            match result {
                Ok(()) => {
                    let n = ids.len();
                    self.collect(node, ids).await?;
                    stats.confirmed += n;
                    metrics::counter!(RECLAIMED_BLOBS_TOTAL).increment(n as u64);
                }
                Err(e) => {
                    stats.failed_calls += 1;
                    tracing::warn!(node, %addr, blobs = ids.len(), error = %e, "DeleteBlobs failed; retried next pass");
                }
            }
        }
        Ok(stats)
    }

    /// Proposes ClaimPending for `blob_ids`: those claimed.
    async fn claim(&self, blob_ids: Vec<String>) -> Result<Vec<String>, ReclaimError> {
        if !is_leader(&self.raft) {
            return Err(ReclaimError::NotLeader);
        }
        let Some(released_before_index) = self.released_before_index() else {
            return Ok(Vec::new());
        };
        let cmd = self
            .gate
            .command(
                self.kv.as_ref(),
                Command::ClaimPending(rpb::ClaimPending {
                    blob_ids,
                    released_before_index,
                }),
            )
            .map_err(|e| ReclaimError::Raft(e.to_string()))?;
        match self.raft.client_write(cmd).await {
            Ok(resp) => match resp.data {
                sm::Applied::Claimed(ids) => Ok(ids),
                other => Err(ReclaimError::Raft(format!(
                    "ClaimPending applied as {other:?}"
                ))),
            },
            Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            )) => Err(ReclaimError::NotLeader),
            Err(e) => Err(ReclaimError::Raft(e.to_string())),
        }
    }

    async fn collect(&self, node_id: u64, blob_ids: Vec<String>) -> Result<(), ReclaimError> {
        if !is_leader(&self.raft) {
            return Err(ReclaimError::NotLeader);
        }
        let cmd = self
            .gate
            .command(
                self.kv.as_ref(),
                Command::CollectPending(rpb::CollectPending {
                    done: vec![rpb::CollectedShards { node_id, blob_ids }],
                }),
            )
            .map_err(|e| ReclaimError::Raft(e.to_string()))?;
        match self.raft.client_write(cmd).await {
            Ok(_) => Ok(()),
            Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            )) => Err(ReclaimError::NotLeader),
            Err(e) => Err(ReclaimError::Raft(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Batch, MemStore};
    use sluice_proto::meta as pb;

    /// Releases blobs `b000`.. by the entry at log index `index`, one
    /// node each.
    fn release(kv: &MemStore, names: impl Iterator<Item = usize>, index: u64) {
        let mut b = Batch::new();
        let placements: Vec<pb::Placement> = names
            .map(|i| pb::Placement {
                blob_id: format!("b{i:03}"),
                nodes: vec![1],
                ..Default::default()
            })
            .collect();
        sm::pending::record_released(&mut b, &placements, index, 0);
        kv.apply(b).unwrap();
    }

    fn ids(w: &Window) -> Vec<String> {
        w.due.iter().map(|r| r.blob_id.clone()).collect()
    }

    #[test]
    fn passes_go_on_from_where_the_last_stopped() {
        // 30 records released at index 1000 come first in key order; the
        // 10 after them, released at index 5, are due. Each pass reads at
        // most 20 records.
        let kv = MemStore::new();
        release(&kv, 0..30, 1000);
        release(&kv, 30..40, 5);
        let pass = |cursor| read_window(&kv, Some(999), cursor, 20, 5).unwrap();

        let first = pass(None);
        assert_eq!((first.scanned, first.due.len()), (20, 0));
        assert_eq!(first.next.as_deref(), Some("b019"));
        // Restarting from the first record every pass (no cursor) would
        // read these 20 again forever; the cursor reaches the due ones.
        let second = pass(first.next);
        assert_eq!((second.scanned, second.due.len()), (20, 10));
        assert_eq!(
            ids(&second),
            (30..40).map(|i| format!("b{i:03}")).collect::<Vec<_>>()
        );
        assert!(second.due.iter().all(|r| r.nodes == [1] && !r.claimed));
        // The page ended full at the last record: the next pass finds
        // nothing after it and starts over at the first.
        let third = pass(second.next);
        assert_eq!((third.scanned, third.due.len()), (20, 0));
        assert_eq!(third.next.as_deref(), Some("b019"));
    }

    #[test]
    fn without_a_sample_delete_delay_old_only_claimed_records_are_due() {
        let kv = MemStore::new();
        release(&kv, 0..3, 1);
        // A wall clock far ahead changes nothing: no index cutoff yet.
        assert!(
            read_window(&kv, None, None, 100, 10)
                .unwrap()
                .due
                .is_empty()
        );
        let claim = rpb::ClaimPending {
            blob_ids: vec!["b001".into()],
            released_before_index: 1,
        };
        let (b, applied) = sm::pending::claim_pending(&kv, &claim).unwrap();
        assert_eq!(applied, sm::Applied::Claimed(vec!["b001".into()]));
        kv.apply(b).unwrap();
        let w = read_window(&kv, None, None, 100, 10).unwrap();
        assert_eq!(ids(&w), ["b001"]);
        assert!(w.due[0].claimed);
        // Released at index 1: due once the cutoff reaches 1.
        assert_eq!(
            read_window(&kv, Some(0), None, 100, 10).unwrap().due.len(),
            1
        );
        assert_eq!(
            read_window(&kv, Some(1), None, 100, 10).unwrap().due.len(),
            3
        );
    }
}
