//! Erasure-coded blob I/O: the gateway's data path.
//!
//! A blob is one single-PUT body or one multipart part. It is cut into
//! stripes of `k * block_size` bytes; each stripe is encoded into k data and
//! m parity shard blocks, streamed to k+m distinct datanodes chosen by
//! rendezvous hashing (see [`crate::placement`]); shard `i` of every stripe
//! goes to `placement.nodes[i]`, block index = stripe index
//! (see [`crate::layout`]).
//!
//! # Layout
//! * this file — [`BlobStore`], its configuration, errors, start/stop and
//!   delete.
//! * `blob/write.rs` — the write path: body -> stripes -> one client-streaming
//!   `PutShard` per shard through bounded channels.
//! * `blob/read.rs` — the read path: one server-streaming `GetShard` per
//!   shard in use, checksum verification, parity fallback and reconstruction.
//!
//! # Memory
//! Every stripe buffer of the write path and every decoded stripe of the
//! read path holds a permit of a gateway-wide byte budget
//! (`buffer_budget_bytes`, `read_budget_bytes`; see [`crate::admission`] for
//! the accounting and the full memory formula). A write waits for its next
//! stripe's permit before reading the stripe from the body (at most
//! `stall_timeout`, then [`BlobError::BufferStall`]); every shard block
//! waits for its datanode's credit before it goes on the wire (see
//! [`crate::credit`]; at most `stall_timeout`, a shard lost that way is
//! counted towards [`BlobError::DatanodesBusy`]). Read-ahead of GetShard
//! streams beyond the stripe being fetched is bounded by the HTTP/2 windows
//! (see [`crate::datanodes`]).

mod get_shard;
mod grpc;
mod heal_access;
mod put_shard;
mod read;
mod shard_failure;
mod stripe_buffers;
mod write;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::datanode::DeleteBlobsRequest;
use sluice_proto::meta::Placement;
use sluice_util::worker::{WorkerHandle, Workers};
use tokio_util::sync::CancellationToken;

use crate::admission::{BudgetKind, BufferBudget, BufferError, BufferPermit, GatewayStats};
use crate::credit::{CreditClient, CreditConfig, NodeCreditStats, new_gateway_id};
use crate::datanodes::{DatanodeDirectory, DatanodeEntry, Datanodes};
use crate::epoch::{EpochConfig, EpochGuard, MetaEpochService, WriteEpochs};
use crate::erasure::Codec;
use crate::layout::Layout;

/// How long a shard stream may make no progress (a block not accepted into
/// its channel, a block not arriving, the final acknowledgement not coming)
/// before that shard is treated as failed.
pub const SHARD_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one DeleteBlobs call.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(10);
/// Datanodes a [`BlobStore::delete`] talks to at once.
pub const DELETE_CONCURRENCY: usize = 8;
/// Blob ids per DeleteBlobs request.
pub const DELETE_BATCH: usize = 1000;
/// How long [`BlobStore::start`] keeps asking meta for the datanode set.
pub const START_DEADLINE: Duration = Duration::from_secs(60);
/// Minimum time between two on-demand refreshes of the datanode set (made
/// when a write finds too few live writable datanodes, or a datanode
/// refused a shard with `RESOURCE_EXHAUSTED`).
pub const MIN_ON_DEMAND_REFRESH: Duration = Duration::from_millis(500);
/// Most unused full-stripe buffers the write path keeps for reuse (48 MiB
/// with 4+2 and 256 KiB blocks); fewer when the write budget's unused bytes
/// hold fewer. Twice the 16 clients of the 1 MiB PutObject benchmark, each
/// with a stripe being filled and one being sent. See
/// `blob/stripe_buffers.rs`.
pub(crate) const MAX_IDLE_STRIPE_BUFFERS: usize = 32;
pub use crate::config::{BlobStoreConfig, MAX_BLOCK_SIZE};

/// Errors of the blob data path.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// Reading the request body failed (client went away, bad chunk signature).
    #[error("reading request body: {0}")]
    Body(#[source] std::io::Error),
    /// Fewer than `write_quorum` datanodes are live or accepted the shards.
    #[error("write quorum not reached: {durable} of {needed} shards durable")]
    QuorumNotReached { durable: usize, needed: usize },
    /// The placement is malformed, or a stripe could not be decoded.
    #[error("blob {blob_id} unreadable: {reason}")]
    Unreadable { blob_id: String, reason: String },
    /// Fewer than k shards of a stripe answered, even after the shards
    /// marked missing were tried: the nodes holding the rest may be down
    /// for now, so the client is told to retry.
    #[error("blob {blob_id}: too few shards readable: {reason}")]
    TooFewShards { blob_id: String, reason: String },
    /// Not enough live datanodes for the erasure layout.
    #[error("not enough live datanodes: {live} live, {needed} needed")]
    NotEnoughDatanodes { live: usize, needed: usize },
    /// Enough datanodes are live, but fewer than `write_quorum` of them are
    /// writable (full, or below their free-space reserve): `503`.
    #[error(
        "not enough writable datanodes: {writable} writable, {needed} needed (datanodes full or below their free-space reserve)"
    )]
    NotEnoughWritable { writable: usize, needed: usize },
    /// [`BlobStore::start`] could not read the datanode set from meta.
    #[error("reading the datanode set from meta: {0}")]
    Meta(#[source] MetaError),
    /// A [`BlobStoreConfig`] field is out of range.
    #[error("invalid blob store config: {0}")]
    InvalidConfig(String),
    /// No buffer from the budget within `stall_timeout` (the gateway is
    /// saturated): `503 SlowDown`.
    #[error("no buffer within {waited:?}")]
    BufferStall { waited: std::time::Duration },
    /// Too many shards went without datanode credit for `stall_timeout`
    /// (the datanodes are saturated): `503 SlowDown`.
    #[error("datanodes granted no credit within {waited:?}")]
    DatanodesBusy { waited: std::time::Duration },
}

impl BlobStoreConfig {
    /// Checks every field ([`BlobStoreConfig::check`]); the error names the
    /// first bad one, as [`BlobError::InvalidConfig`].
    pub fn validate(&self) -> Result<(), BlobError> {
        self.check()
            .map_err(|e| BlobError::InvalidConfig(e.to_string()))
    }

    /// Budget bytes a stripe of `payload` bytes costs: `(k + m) * block_len`.
    pub fn charge_for(&self, payload: usize) -> u64 {
        ((self.data_shards + self.parity_shards) as u64)
            * Layout::block_len_for(payload, self.data_shards) as u64
    }
}

/// Handle on the datanodes for writing, reading and deleting blobs. Cheap to clone.
#[derive(Clone)]
pub struct BlobStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: BlobStoreConfig,
    codec: Codec,
    pool: Datanodes,
    /// Where the datanode set is read from: meta, or a fixed set.
    directory: Arc<dyn DatanodeDirectory>,
    /// When the datanode set was last read; also serializes
    /// on-demand refreshes.
    last_refresh: tokio::sync::Mutex<Instant>,
    /// Stops the refresh task; cancelled by [`BlobStore::stop`] and on drop.
    stop: CancellationToken,
    /// The gateway's background workers (datanode refresh, epoch renewal,
    /// heal), reported to meta with each epoch renewal.
    workers: Workers,
    /// Write-path stripe buffers.
    write_budget: Arc<BufferBudget>,
    /// Reused buffers of full stripes with their parity, idle ones only
    /// inside `write_budget`'s unused bytes (see [`stripe_buffers`]).
    stripe_buffers: stripe_buffers::StripeBuffers,
    /// Read-path stripe buffers.
    read_budget: Arc<BufferBudget>,
    /// Credit streams to the datanodes.
    credits: CreditClient,
    /// The write epochs every new blob id names.
    epochs: WriteEpochs,
    stats: GatewayStats,
}

impl Inner {
    /// Reads the datanode set from the directory into the pool; credit
    /// streams of datanodes no longer listed end. Returns how many
    /// datanodes are live. The one refresh behind the periodic, on-demand
    /// and explicit ones.
    async fn refresh(&self) -> Result<usize, MetaError> {
        let live = self.pool.refresh(&*self.directory).await?;
        let known: Vec<u64> = self.pool.entries().iter().map(|e| e.id).collect();
        self.credits.retain(|id| known.contains(&id));
        Ok(live)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl BlobStore {
    /// Builds the store over `pool` (already filled from `directory`) and
    /// spawns the refresh task.
    fn assemble(
        config: BlobStoreConfig,
        directory: Arc<dyn DatanodeDirectory>,
        pool: Datanodes,
        stats: GatewayStats,
        gateway_id: String,
        epochs: WriteEpochs,
        workers: Workers,
    ) -> Result<BlobStore, BlobError> {
        config.validate()?;
        let codec = Codec::new(config.data_shards, config.parity_shards)
            .map_err(|e| BlobError::InvalidConfig(e.to_string()))?;
        let credits = CreditClient::new(CreditConfig {
            gateway_id,
            idle_timeout: config.credit_idle_timeout,
            prefetch_bytes: 2 * config.block_size as u64,
        });
        let write_budget =
            BufferBudget::new(BudgetKind::Write, config.buffer_budget, stats.clone());
        let stripe_buffers = stripe_buffers::StripeBuffers::new(
            (config.data_shards + config.parity_shards) * config.block_size,
            MAX_IDLE_STRIPE_BUFFERS,
            Arc::clone(&write_budget),
        );
        let store = BlobStore {
            inner: Arc::new(Inner {
                stripe_buffers,
                write_budget,
                read_budget: BufferBudget::new(BudgetKind::Read, config.read_budget, stats.clone()),
                config,
                codec,
                pool,
                directory,
                last_refresh: tokio::sync::Mutex::new(Instant::now()),
                stop: CancellationToken::new(),
                workers,
                credits,
                epochs,
                stats,
            }),
        };
        let (weak, stop, interval) = (
            Arc::downgrade(&store.inner),
            store.inner.stop.clone(),
            store.inner.config.datanode_refresh_interval,
        );
        store.inner.workers.spawn("datanode-refresh", move |w| {
            refresh_loop(weak, stop, interval, w)
        });
        Ok(store)
    }

    /// Fetches the datanode set once (retrying until meta answers or
    /// [`START_DEADLINE`] passes), opens the first write epoch (retrying
    /// likewise; see [`WriteEpochs::start`]), spawns the refresh task.
    ///
    /// Errors: [`BlobError::InvalidConfig`], [`BlobError::Meta`].
    pub async fn start(config: BlobStoreConfig, meta: MetaClient) -> Result<BlobStore, BlobError> {
        Self::start_with_stats(config, meta, GatewayStats::new()).await
    }

    /// [`BlobStore::start`], counting buffer use in `stats`.
    pub async fn start_with_stats(
        config: BlobStoreConfig,
        meta: MetaClient,
        stats: GatewayStats,
    ) -> Result<BlobStore, BlobError> {
        config.validate()?;
        let gateway_id = new_gateway_id();
        let started = Instant::now();
        let pool = Datanodes::with_transport(meta.transport().clone());
        first_refresh(&pool, &meta, started).await?;
        let workers = Workers::default();
        let epochs = WriteEpochs::start_in(
            Arc::new(
                MetaEpochService::new(meta.clone(), gateway_id.clone())
                    .with_memory_budget(config.buffer_budget.saturating_add(config.read_budget))
                    .with_workers(workers.clone()),
            ),
            EpochConfig {
                rotation: config.epoch_rotation,
                start_deadline: START_DEADLINE.saturating_sub(started.elapsed()),
            },
            &workers,
        )
        .await
        .map_err(BlobError::Meta)?;
        Self::assemble(
            config,
            Arc::new(meta),
            pool,
            stats,
            gateway_id,
            epochs,
            workers,
        )
    }

    /// A store that reads the datanode set from `directory` (once now,
    /// retrying as [`BlobStore::start`] does, then every
    /// `datanode_refresh_interval`) and names `epochs` in its blob ids
    /// (e.g. [`WriteEpochs::fixed`]): datanodes without meta, as tests run
    /// them with [`crate::datanodes::FixedDatanodes`].
    ///
    /// Errors: [`BlobError::InvalidConfig`], [`BlobError::Meta`].
    pub async fn start_with_directory(
        config: BlobStoreConfig,
        directory: Arc<dyn DatanodeDirectory>,
        epochs: WriteEpochs,
    ) -> Result<BlobStore, BlobError> {
        config.validate()?;
        let pool = Datanodes::with_transport(directory.transport().clone());
        first_refresh(&pool, &*directory, Instant::now()).await?;
        Self::assemble(
            config,
            directory,
            pool,
            GatewayStats::new(),
            new_gateway_id(),
            epochs,
            Workers::default(),
        )
    }

    /// Re-reads the datanode set from its directory now (not rate-limited:
    /// for an operator's or a test's explicit request). Returns how many
    /// datanodes are live.
    ///
    /// Errors: [`BlobError::Meta`] when the directory cannot be read; the
    /// set last read stays in use.
    pub async fn refresh_datanodes(&self) -> Result<usize, BlobError> {
        let mut last = self.inner.last_refresh.lock().await;
        let live = self.inner.refresh().await.map_err(BlobError::Meta)?;
        *last = Instant::now();
        Ok(live)
    }

    /// The gateway's background workers (`sluice admin status` lists them).
    pub fn workers(&self) -> &Workers {
        &self.inner.workers
    }

    /// Stops the refresh task and the credit streams (also stops when the
    /// last handle drops).
    pub fn stop(&self) {
        self.inner.stop.cancel();
        self.inner.credits.stop();
        self.inner.epochs.stop();
    }

    /// The write epochs this store's blob ids name. Hold a
    /// [`WriteEpochs::begin_write`] guard from before a write's first shard
    /// until its commit returns.
    pub fn epochs(&self) -> &WriteEpochs {
        &self.inner.epochs
    }

    /// [`stop`](Self::stop), then waits until every credit stream task has
    /// ended (their credit is back with the datanodes).
    pub async fn shutdown(&self) {
        self.stop();
        self.inner.credits.stopped().await;
    }

    /// Buffer and admission counters of this store.
    pub fn stats(&self) -> &GatewayStats {
        &self.inner.stats
    }

    /// The id this store uses on datanode credit streams.
    pub fn gateway_id(&self) -> &str {
        self.inner.credits.gateway_id()
    }

    /// The credit held from / awaited of datanode `node`, if it has a stream.
    pub fn credit_stats(&self, node: u64) -> Option<NodeCreditStats> {
        self.inner.credits.stats(node)
    }

    /// A write buffer permit for a stripe of `payload` bytes, waiting at most
    /// `stall_timeout`; idle stripe buffers beyond the budget's unused bytes
    /// are freed before it returns. Errors: [`BlobError::BufferStall`].
    pub(crate) async fn stripe_permit(&self, payload: usize) -> Result<BufferPermit, BlobError> {
        let permit = self
            .permit(
                &self.inner.write_budget,
                self.inner.config.charge_for(payload),
            )
            .await?;
        self.inner.stripe_buffers.trim();
        Ok(permit)
    }

    /// A read buffer permit of `bytes`, waiting at most `stall_timeout`.
    /// Errors: [`BlobError::BufferStall`].
    pub(crate) async fn read_permit(&self, bytes: u64) -> Result<BufferPermit, BlobError> {
        self.permit(&self.inner.read_budget, bytes).await
    }

    async fn permit(
        &self,
        budget: &Arc<BufferBudget>,
        bytes: u64,
    ) -> Result<BufferPermit, BlobError> {
        budget
            .acquire(bytes, self.inner.config.stall_timeout)
            .await
            .map_err(|e| match e {
                BufferError::Stalled(waited) => BlobError::BufferStall { waited },
                BufferError::TooLarge { bytes, budget } => BlobError::InvalidConfig(format!(
                    "a stripe of {bytes} bytes exceeds the budget of {budget}"
                )),
            })
    }

    /// The configuration this store runs with.
    pub fn config(&self) -> &BlobStoreConfig {
        &self.inner.config
    }

    /// The datanode set as last read from meta, sorted by id.
    pub fn datanodes(&self) -> Vec<DatanodeEntry> {
        self.inner.pool.entries()
    }

    /// [`write_under`](Self::write_under) a guard on the current epoch that
    /// ends with the write: for callers that do not commit the blob (tests,
    /// benchmarks). A caller that commits holds its own guard until the
    /// commit returns.
    pub async fn write<S>(
        &self,
        placement_key: &str,
        body: S,
        len: Option<u64>,
    ) -> Result<Placement, BlobError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
    {
        let epoch = self.inner.epochs.begin_write();
        self.write_under(&epoch, placement_key, body, len).await
    }

    /// Streams `body` as a new blob of write epoch `epoch.epoch()` (its id
    /// is `e<epoch>.<random>`) to k+m datanodes chosen by rendezvous
    /// hashing of `placement_key` (e.g. "bucket/key/upload_id/part_number")
    /// over the live writable datanodes, stripe by stripe, each stripe under a write buffer permit
    /// taken before it is read. `len` is the declared (decoded) body length
    /// if known: a short body is then charged only what it needs, and a
    /// body longer than `len` fails. Returns once at least `write_quorum`
    /// shards are durable; `missing` in the returned placement lists the
    /// shards that are not.
    ///
    /// Errors: [`BlobError::NotEnoughDatanodes`] (fewer than k+m registered
    /// or fewer than `write_quorum` live), [`BlobError::NotEnoughWritable`]
    /// (enough live, fewer than `write_quorum` writable),
    /// [`BlobError::QuorumNotReached`], [`BlobError::BufferStall`],
    /// [`BlobError::DatanodesBusy`], [`BlobError::Body`] (the shard
    /// streams are then reset, so datanodes discard them).
    pub async fn write_under<S>(
        &self,
        epoch: &EpochGuard,
        placement_key: &str,
        body: S,
        len: Option<u64>,
    ) -> Result<Placement, BlobError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
    {
        let stripe_bytes = self.inner.config.data_shards * self.inner.config.block_size;
        // The first stripe's buffer before any datanode is involved.
        let first = self
            .stripe_permit(write::stripe_capacity(len, 0, stripe_bytes))
            .await?;
        let nodes = self.place(placement_key).await?;
        write::write_blob(self, epoch, nodes, body, len, first).await
    }

    /// Streams the payload bytes `range` (end exclusive, `range.end <= placement.size`)
    /// of a blob, fetching only the stripes that overlap the range, verifying
    /// every block checksum and reconstructing from parity where a shard is
    /// missing, unreachable or corrupt.
    ///
    /// An empty range gives an empty stream. Errors (as the stream's last
    /// item): [`BlobError::Unreadable`].
    pub fn read(
        &self,
        placement: &Placement,
        range: Range<u64>,
    ) -> BoxStream<'static, Result<Bytes, BlobError>> {
        read::read_blob(self, placement, range)
    }

    /// Deletes the shards of `placements` on their datanodes, best effort
    /// (failures are logged; datanode GC collects what is left). One
    /// DeleteBlobs call per datanode and batch of [`DELETE_BATCH`] ids, at
    /// most [`DELETE_CONCURRENCY`] at once.
    pub async fn delete(&self, placements: &[Placement]) {
        let mut by_node: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for p in placements {
            let mut nodes = p.nodes.clone();
            nodes.sort_unstable();
            nodes.dedup();
            for n in nodes {
                by_node.entry(n).or_default().push(p.blob_id.clone());
            }
        }
        self.delete_on(by_node).await;
    }

    /// Deletes blob ids per datanode, best effort.
    async fn delete_on(&self, by_node: BTreeMap<u64, Vec<String>>) {
        let calls = by_node.into_iter().flat_map(|(node, ids)| {
            ids.chunks(DELETE_BATCH)
                .map(|c| (node, c.to_vec()))
                .collect::<Vec<_>>()
        });
        futures::stream::iter(calls)
            .for_each_concurrent(DELETE_CONCURRENCY, |(node, blob_ids)| async move {
                let count = blob_ids.len();
                let mut client = match self.inner.pool.client(node) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(node, blobs = count, error = %e, "deleting blobs: datanode unreachable");
                        return;
                    }
                };
                let call = client.delete_blobs(DeleteBlobsRequest { blob_ids });
                match tokio::time::timeout(DELETE_TIMEOUT, call).await {
                    Ok(Ok(r)) => {
                        tracing::debug!(node, blobs = count, shards = r.into_inner().shards_deleted, "deleted blobs")
                    }
                    Ok(Err(status)) => {
                        tracing::warn!(node, blobs = count, error = %status, "deleting blobs failed")
                    }
                    Err(_) => tracing::warn!(node, blobs = count, "deleting blobs timed out"),
                }
            })
            .await;
    }

    /// Re-reads the datanode set now, unless another refresh
    /// was attempted within [`MIN_ON_DEMAND_REFRESH`] (attempts, not
    /// successes, are rate-limited: while meta is down, concurrent writers
    /// must not queue up behind one timeout each).
    pub(crate) async fn refresh_on_demand(&self) {
        let mut last = self.inner.last_refresh.lock().await;
        if last.elapsed() >= MIN_ON_DEMAND_REFRESH {
            if let Err(e) = self.inner.refresh().await {
                tracing::warn!(error = %e, "refreshing datanode set");
            }
            *last = Instant::now();
        }
    }

    /// A datanode refused a shard with `RESOURCE_EXHAUSTED` (its disk is
    /// full): no new shards go to it until the datanode set is re-read,
    /// which happens now in the background (rate-limited).
    pub(crate) fn datanode_full(&self, node: u64) {
        self.inner.pool.mark_unwritable(node);
        let store = self.clone();
        tokio::spawn(async move { store.refresh_on_demand().await });
    }

    /// Picks k+m distinct datanodes for `key`: the ones accepting shards
    /// (live, writable, not draining) by [`crate::placement::place`]
    /// (weighted rendezvous across failure domains), re-reading the
    /// datanode set from meta once if too few are.
    async fn place(&self, key: &str) -> Result<Vec<u64>, BlobError> {
        let (k, m) = (
            self.inner.config.data_shards,
            self.inner.config.parity_shards,
        );
        let needed = k + m;
        let placed = |entries: &[DatanodeEntry]| {
            let candidates: Vec<crate::placement::Candidate<'_>> = entries
                .iter()
                .filter(|e| e.accepts_shards())
                .map(crate::placement::Candidate::from)
                .collect();
            crate::placement::place(key, &candidates, k, m)
        };
        if let Some(nodes) = placed(&self.inner.pool.entries()) {
            return Ok(nodes);
        }
        self.refresh_on_demand().await;
        let entries = self.inner.pool.entries();
        if let Some(nodes) = placed(&entries) {
            return Ok(nodes);
        }
        let (writable, others): (Vec<&DatanodeEntry>, Vec<&DatanodeEntry>) =
            entries.iter().partition(|e| e.accepts_shards());
        let writable: Vec<u64> = writable.iter().map(|e| e.id).collect();
        let count = writable.len();
        // Fewer than k+m live writable: while the write quorum can still be
        // met, the writable nodes take the first shards (data first) and the
        // others (down, or live but full) the rest; their shards fail fast
        // (unreachable, or refused with RESOURCE_EXHAUSTED) and are
        // recorded as missing, to heal: with up to m datanodes down, writes
        // still succeed while the write quorum is reachable.
        let quorum = self.inner.config.write_quorum;
        let live = entries.iter().filter(|e| e.live).count();
        if count + others.len() < needed {
            return Err(BlobError::NotEnoughDatanodes {
                live: count,
                needed,
            });
        }
        if count < quorum {
            if live < quorum {
                return Err(BlobError::NotEnoughDatanodes {
                    live,
                    needed: quorum,
                });
            }
            return Err(BlobError::NotEnoughWritable {
                writable: count,
                needed: quorum,
            });
        }
        // Live full nodes before down ones: both fail their shard, a live
        // one faster.
        let (full, down): (Vec<&DatanodeEntry>, Vec<&DatanodeEntry>) =
            others.iter().partition(|e| e.live);
        let mut nodes = crate::placement::pick(key, writable, count).unwrap_or_default();
        let rest = needed - count;
        let full_ids: Vec<u64> = full.iter().map(|e| e.id).collect();
        let take_full = full_ids.len().min(rest);
        nodes.extend(crate::placement::pick(key, full_ids, take_full).unwrap_or_default());
        nodes.extend(
            crate::placement::pick(key, down.iter().map(|e| e.id), rest - take_full)
                .unwrap_or_default(),
        );
        Ok(nodes)
    }
}

/// Reads the datanode set from `directory` into `pool`, retrying until it
/// answers or [`START_DEADLINE`] (counted from `started`) passes.
async fn first_refresh(
    pool: &Datanodes,
    directory: &dyn DatanodeDirectory,
    started: Instant,
) -> Result<(), BlobError> {
    loop {
        match pool.refresh(directory).await {
            Ok(live) => {
                tracing::info!(live, known = pool.entries().len(), "read datanode set");
                return Ok(());
            }
            Err(e @ MetaError::Refused { .. }) => return Err(BlobError::Meta(e)),
            Err(e) if started.elapsed() >= START_DEADLINE => return Err(BlobError::Meta(e)),
            Err(e) => tracing::warn!(error = %e, "reading datanode set, retrying"),
        }
    }
}

/// Re-reads the datanode set every `interval` until `stop` is cancelled or
/// the store is dropped.
async fn refresh_loop(
    store: Weak<Inner>,
    stop: CancellationToken,
    interval: Duration,
    worker: WorkerHandle,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let Some(inner) = store.upgrade() else { break };
        let refreshed = tokio::select! {
            () = stop.cancelled() => break,
            r = inner.refresh() => r,
        };
        match refreshed {
            Ok(live) => {
                *inner.last_refresh.lock().await = Instant::now();
                tracing::trace!(live, "refreshed datanode set");
                worker.ran();
            }
            Err(e) => worker.report_error(format_args!("refreshing datanode set: {e}")),
        }
    }
    tracing::debug!("datanode refresh task stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datanodes::FixedDatanodes;

    /// A store over a fixed datanode set, writing under epoch 1.
    async fn fixed_store(entries: Vec<DatanodeEntry>) -> (BlobStore, Arc<FixedDatanodes>) {
        let directory = Arc::new(FixedDatanodes::new(
            entries,
            sluice_net::Transport::Insecure,
        ));
        let store = BlobStore::start_with_directory(
            BlobStoreConfig::default(),
            directory.clone(),
            WriteEpochs::fixed(1),
        )
        .await
        .expect("valid config, fixed set");
        (store, directory)
    }

    #[test]
    fn config_validation() {
        BlobStoreConfig::default()
            .validate()
            .expect("default is valid");
        let bad = [
            BlobStoreConfig {
                data_shards: 0,
                ..Default::default()
            },
            BlobStoreConfig {
                parity_shards: 0,
                ..Default::default()
            },
            BlobStoreConfig {
                data_shards: 200,
                parity_shards: 100,
                write_quorum: 200,
                ..Default::default()
            },
            BlobStoreConfig {
                block_size: 0,
                ..Default::default()
            },
            BlobStoreConfig {
                block_size: MAX_BLOCK_SIZE + 1,
                ..Default::default()
            },
            BlobStoreConfig {
                write_quorum: 3,
                ..Default::default()
            },
            BlobStoreConfig {
                write_quorum: 7,
                ..Default::default()
            },
            BlobStoreConfig {
                datanode_refresh_interval: Duration::ZERO,
                ..Default::default()
            },
            BlobStoreConfig {
                shard_channel_depth: 0,
                ..Default::default()
            },
            BlobStoreConfig {
                buffer_budget: 6 * 256 * 1024 - 1,
                ..Default::default()
            },
            BlobStoreConfig {
                read_budget: 0,
                ..Default::default()
            },
            BlobStoreConfig {
                stall_timeout: Duration::ZERO,
                ..Default::default()
            },
            BlobStoreConfig {
                epoch_rotation: Duration::ZERO,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(
                matches!(c.validate(), Err(BlobError::InvalidConfig(_))),
                "{c:?}"
            );
        }
    }

    #[tokio::test]
    async fn places_on_down_nodes_only_while_the_write_quorum_is_live() {
        let (store, directory) = fixed_store(Vec::new()).await;
        let set = async |live: &[u64]| {
            directory.set(
                (1..=6)
                    .map(|id| DatanodeEntry {
                        id,
                        addr: format!("http://127.0.0.1:{}", 1000 + id),
                        live: live.contains(&id),
                        writable: true,
                        free_bytes: 1 << 30,
                        ..DatanodeEntry::up(id, "")
                    })
                    .collect(),
            );
            store.refresh_datanodes().await.expect("fixed set");
        };
        set(&[1, 2, 3, 4, 5]).await;
        let nodes = store.place("b/k").await.expect("5 live >= quorum 5");
        assert_eq!(nodes.len(), 6);
        assert_eq!(nodes[5], 6, "the down node takes the last (parity) shard");
        let distinct: std::collections::BTreeSet<u64> = nodes.iter().copied().collect();
        assert_eq!(distinct.len(), 6);

        set(&[1, 2, 3, 4]).await;
        let err = store.place("b/k").await.expect_err("4 live < quorum 5");
        assert!(
            matches!(err, BlobError::NotEnoughDatanodes { live: 4, needed: 5 }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn full_nodes_take_no_shards_while_enough_are_writable() {
        let (store, directory) = fixed_store(Vec::new()).await;
        let set = async |n: u64, full: &[u64], down: &[u64]| {
            directory.set(
                (1..=n)
                    .map(|id| DatanodeEntry {
                        id,
                        addr: format!("http://127.0.0.1:{}", 1000 + id),
                        live: !down.contains(&id),
                        writable: !full.contains(&id),
                        free_bytes: if full.contains(&id) { 0 } else { 1 << 30 },
                        ..DatanodeEntry::up(id, "")
                    })
                    .collect(),
            );
            store.refresh_datanodes().await.expect("fixed set");
        };
        // 7 nodes, one full: the 6 writable ones hold every shard.
        set(7, &[3], &[]).await;
        for i in 0..50 {
            let nodes = store.place(&format!("b/k{i}")).await.expect("6 writable");
            assert_eq!(nodes.len(), 6);
            assert!(!nodes.contains(&3), "{nodes:?}");
        }
        // 6 nodes, one full: it takes the last shard (which fails and is
        // recorded missing), the write quorum of 5 is writable.
        set(6, &[4], &[]).await;
        let nodes = store.place("b/k").await.expect("5 writable >= quorum");
        assert_eq!(nodes[5], 4, "the full node takes the last shard");
        // A full node goes before a down one.
        set(8, &[4], &[7, 8]).await;
        let nodes = store.place("b/k").await.expect("5 writable >= quorum");
        assert_eq!(nodes[5], 4);
        // Two full: 4 writable < quorum 5, although 6 are live.
        set(6, &[2, 4], &[]).await;
        let err = store.place("b/k").await.expect_err("4 writable < quorum 5");
        assert!(
            matches!(
                err,
                BlobError::NotEnoughWritable {
                    writable: 4,
                    needed: 5
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "not enough writable datanodes: 4 writable, 5 needed (datanodes full or below their free-space reserve)"
        );
        // A node that refused a shard as full is skipped until the next refresh.
        set(7, &[], &[]).await;
        let before = store.place("b/x").await.expect("7 writable");
        store.datanode_full(before[0]);
        let after = store.place("b/x").await.expect("6 writable");
        assert!(!after.contains(&before[0]), "{before:?} -> {after:?}");
    }

    #[tokio::test]
    async fn too_few_live_datanodes() {
        let (store, _) = fixed_store(
            (1..=5)
                .map(|i| DatanodeEntry::up(i, format!("http://127.0.0.1:{}", 1000 + i)))
                .collect(),
        )
        .await;
        let body = futures::stream::iter(vec![Ok(Bytes::from_static(b"x"))]);
        let err = store
            .write("b/k", body, None)
            .await
            .expect_err("5 of 6 nodes");
        assert!(
            matches!(err, BlobError::NotEnoughDatanodes { live: 5, needed: 6 }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn new_write_permits_free_idle_stripe_buffers_beyond_the_unused_budget() {
        let (store, _) = fixed_store(vec![]).await;
        let config = store.config().clone();
        let full = config.data_shards * config.block_size;
        let stripe = config.charge_for(full);
        let buffers = &store.inner.stripe_buffers;
        drop((0..4).map(|_| buffers.take()).collect::<Vec<_>>());
        assert_eq!(buffers.idle(), 4);
        // After each new permit, only as many idle buffers stay as the
        // budget's unused bytes hold.
        let budget = config.buffer_budget;
        let filler = store
            .inner
            .write_budget
            .try_acquire(budget - 3 * stripe - stripe / 2)
            .expect("all but 3.5 stripes");
        assert_eq!(buffers.idle(), 4, "a bare budget permit does not trim");
        let client = store
            .stripe_permit(full)
            .await
            .expect("one of the 3.5 stripes left");
        assert_eq!(buffers.idle(), 2, "2.5 stripes of unused budget hold 2");
        drop(filler);
        let heal = store
            .heal_try_write_permit(budget - client.bytes() - stripe / 2)
            .expect("all but half a stripe");
        assert_eq!(buffers.idle(), 0, "heal's permit trims too");
        drop((heal, client));
    }

    #[tokio::test]
    async fn write_and_read_futures_are_send() {
        fn is_send<T: Send>(_: &T) {}
        let (store, _) = fixed_store(vec![]).await;
        let write = store.write(
            "k",
            futures::stream::empty::<Result<Bytes, std::io::Error>>(),
            None,
        );
        is_send(&write);
        let delete = store.delete(&[]);
        is_send(&delete);
    }

    #[tokio::test]
    async fn empty_range_reads_nothing() {
        let (store, _) = fixed_store(vec![]).await;
        let placement = Placement {
            blob_id: "x".into(),
            size: 10,
            ..Default::default()
        };
        let items: Vec<_> = store.read(&placement, 5..5).collect().await;
        assert!(items.is_empty());
    }

    #[tokio::test]
    async fn malformed_placement_is_unreadable() {
        let (store, _) = fixed_store(vec![]).await;
        let placement = Placement {
            blob_id: "x".into(),
            size: 10,
            data_shards: 4,
            parity_shards: 2,
            block_size: 4,
            nodes: vec![1, 2, 3],
            missing: vec![],
        };
        let items: Vec<_> = store.read(&placement, 0..10).collect().await;
        assert_eq!(items.len(), 1);
        assert!(matches!(items[0], Err(BlobError::Unreadable { .. })));
        let placement = Placement {
            nodes: vec![1, 2, 3, 4, 5, 6],
            ..placement
        };
        let items: Vec<_> = store.read(&placement, 0..11).collect().await;
        assert!(matches!(items[..], [Err(BlobError::Unreadable { .. })]));
    }
}
