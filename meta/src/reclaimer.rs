//! The leader's reclaimer: deletes the shards of released blobs once their
//! `delete_delay` passed (`docs/design/durability.md` §4).
//!
//! On the leader only, every `reclaim_interval`, the reclaimer pages the
//! pending deletions ([`sm::pending::due`], [`PAGE`] records per page, at
//! most [`MAX_PASS_RECORDS`] per pass), groups their blob ids by the nodes
//! that have not confirmed yet, and sends each node `DeleteBlobs` (at most
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

use sluice_util::clock::wall_clock_ms;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use sluice_proto::datanode::DeleteBlobsRequest;
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::raft::{self as rpb, MetaCommand, meta_command::Command};
use sluice_util::worker::WorkerHandle;
use tonic::transport::Channel;

use crate::raft::MetaRaft;
use crate::sm::{self, SmError};
use crate::store::KvStore;
use crate::sweeper::{is_leader, periodic};

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
    /// Of those, past their delete delay.
    pub due: usize,
    /// (node, blob) deletions confirmed and collected.
    pub confirmed: usize,
    /// DeleteBlobs calls that failed.
    pub failed_calls: usize,
}

/// The reclaimer of one meta node.
pub(crate) struct Reclaimer<K: KvStore, D: ShardDeleter> {
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub deleter: Arc<D>,
    /// `reclaim_interval`.
    pub interval: Duration,
    /// `delete_delay`.
    pub delete_delay: Duration,
    /// `reclaim_concurrency`: most DeleteBlobs calls in flight.
    pub concurrency: usize,
    /// Blob id after which the next pass reads; `None` from the start.
    pub cursor: Mutex<Option<String>>,
}

/// What one pass read: the blob ids due per node that has not confirmed,
/// and where the next pass goes on.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Window {
    pub by_node: BTreeMap<u64, Vec<String>>,
    pub scanned: usize,
    pub due: usize,
    /// The cursor for the next pass: `None` when this one reached the end.
    pub next: Option<String>,
}

/// Reads the pending deletions after `cursor`, [`PAGE`] per page, until
/// the end or `max_records` read, and groups those due by node.
pub(crate) fn read_window<K: KvStore>(
    kv: &K,
    now_ms: i64,
    delete_delay: Duration,
    cursor: Option<String>,
    max_records: usize,
    page_len: usize,
) -> Result<Window, SmError> {
    let mut w = Window::default();
    let mut wrap = cursor.is_some();
    let mut after = cursor;
    loop {
        let page = sm::pending::due(kv, now_ms, delete_delay, after.as_deref(), page_len)?;
        // A cursor at the last record: start over in this pass rather than
        // spend one reading nothing.
        if wrap && page.scanned == 0 && w.scanned == 0 {
            wrap = false;
            after = None;
            continue;
        }
        wrap = false;
        w.scanned += page.scanned;
        w.due += page.due.len();
        for record in page.due {
            let Some(placement) = record.placement else {
                continue;
            };
            for node in record.remaining_nodes {
                w.by_node
                    .entry(node)
                    .or_default()
                    .push(placement.blob_id.clone());
            }
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

    /// One pass: delete what is due and collect what was confirmed.
    pub(crate) async fn pass(&self) -> Result<PassStats, ReclaimError> {
        let cursor = self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let window = read_window(
            self.kv.as_ref(),
            wall_clock_ms(),
            self.delete_delay,
            cursor,
            MAX_PASS_RECORDS,
            PAGE,
        )?;
        *self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = window.next;
        let mut stats = PassStats {
            scanned: window.scanned,
            due: window.due,
            ..PassStats::default()
        };
        let by_node = window.by_node;
        metrics::gauge!(PENDING_DELETIONS).set(stats.scanned as f64);

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

    async fn collect(&self, node_id: u64, blob_ids: Vec<String>) -> Result<(), ReclaimError> {
        if !is_leader(&self.raft) {
            return Err(ReclaimError::NotLeader);
        }
        let cmd = MetaCommand {
            leader_now_ms: wall_clock_ms(),
            command: Some(Command::CollectPending(rpb::CollectPending {
                done: vec![rpb::CollectedShards { node_id, blob_ids }],
            })),
        };
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

    /// Releases blobs `b000`.. at leader time `at_ms`, one node each.
    fn release(kv: &MemStore, names: impl Iterator<Item = usize>, at_ms: i64) {
        let mut b = Batch::new();
        let placements: Vec<pb::Placement> = names
            .map(|i| pb::Placement {
                blob_id: format!("b{i:03}"),
                nodes: vec![1],
                ..Default::default()
            })
            .collect();
        sm::pending::record_released(&mut b, &placements, at_ms);
        kv.apply(b).unwrap();
    }

    #[test]
    fn passes_go_on_from_where_the_last_stopped() {
        // 30 records released just now come first in key order; the 10
        // after them are due. Each pass reads at most 20 records.
        let kv = MemStore::new();
        let delay = Duration::from_secs(60);
        release(&kv, 0..30, 1_000_000);
        release(&kv, 30..40, 1);
        let now = 1_000_001;
        let pass = |cursor| read_window(&kv, now, delay, cursor, 20, 5).unwrap();

        let first = pass(None);
        assert_eq!((first.scanned, first.due), (20, 0));
        assert_eq!(first.next.as_deref(), Some("b019"));
        // Restarting from the first record every pass (no cursor) would
        // read these 20 again forever; the cursor reaches the due ones.
        let second = pass(first.next);
        assert_eq!((second.scanned, second.due), (20, 10));
        assert_eq!(
            second.by_node[&1],
            (30..40).map(|i| format!("b{i:03}")).collect::<Vec<_>>()
        );
        // The page ended full at the last record: the next pass finds
        // nothing after it and starts over at the first.
        let third = pass(second.next);
        assert_eq!((third.scanned, third.due), (20, 0));
        assert_eq!(third.next.as_deref(), Some("b019"));
    }
}
