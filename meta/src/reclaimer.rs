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

/// Most pending deletions one pass reads; the rest wait for the next pass.
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
        let now = wall_clock_ms();
        let mut stats = PassStats::default();
        // node -> blob ids still to delete there.
        let mut by_node: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = sm::pending::due(
                self.kv.as_ref(),
                now,
                self.delete_delay,
                after.as_deref(),
                PAGE,
            )?;
            stats.scanned += page.scanned;
            stats.due += page.due.len();
            for record in page.due {
                let Some(placement) = record.placement else {
                    continue;
                };
                for node in record.remaining_nodes {
                    by_node
                        .entry(node)
                        .or_default()
                        .push(placement.blob_id.clone());
                }
            }
            match page.next {
                Some(next) if stats.scanned < MAX_PASS_RECORDS => after = Some(next),
                _ => break,
            }
        }
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
