//! The `sluice.datanode.Datanode` gRPC service over a [`ShardStore`].
//!
//! PutShard: the first message is a [`ShardHeader`], then blocks. Each
//! block's CRC32C is verified as it arrives and the block goes through a
//! channel of `shard_channel_depth` blocks to the shard writer, so the
//! network and the disk overlap while memory stays bounded. The response
//! is sent only after the shard is durable (see [`ShardWriter::commit`]).
//! Any error or a client reset drops the writer, which discards the shard.
//!
//! With a credit account (the caller's certificate id under mutual TLS, else
//! `ShardHeader.gateway_id` when set), each received block is debited from
//! that gateway's credit ([`crate::credit`]) — a block beyond it refuses
//! the shard — and the writer fsyncs
//! incrementally — after every `credit_fsync_bytes`, or when no block came
//! for `credit_fsync_idle` — releasing the synced bytes so they can be
//! granted again; the rest is released at commit, or when the stream fails.
//! Without it, PutShard behaves as before credits existed.
//!
//! Credits: one forwarding task per open stream moves the gateway's
//! coalesced grants into a channel of [`CREDIT_GRANT_CHANNEL_DEPTH`]; it
//! ends (and the gateway's credit returns to the pool) when the client goes
//! away, a newer stream of the same gateway replaces it, or the node starts
//! shutting down. ReportCredits updates demand and takes back idle credit.
//!
//! Capacity: a PutShard stream is refused with `RESOURCE_EXHAUSTED`
//! before any byte is written while the data dir is below
//! `reserved_free_bytes` (see [`crate::space`], checked at most every
//! second). A write or fsync error (`ENOSPC` included) fails only that
//! stream: the writer is dropped (its temp file removed), the held credit
//! is released, and the stream answers `RESOURCE_EXHAUSTED` for a full disk,
//! `INTERNAL` otherwise.
//!
//! The commit (the rename into place) holds the blob's [`BlobLocks`] lock,
//! shared with GC, so a shard rewritten by heal while GC decides about the
//! same blob is never deleted (see [`crate::gc`]).
//!
//! HasShards: whether each requested shard is stored with a valid header
//! (no block is read), at most [`MAX_HAS_SHARDS`] per call.
//!
//! VerifyShards: each requested shard read through and judged (see
//! [`crate::verify`]), one call at a time, paced by
//! `verify_bandwidth_bytes_per_sec`.
//!
//! GetShard: a task reads the range block by block into a channel of
//! [`GET_SHARD_CHANNEL_DEPTH`] blocks; the first bad block ends the stream
//! with `DATA_LOSS`.

use std::sync::Arc;
use std::time::Duration;

use sluice_proto::datanode::datanode_server::{Datanode, DatanodeServer};
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    CreditGrant, CreditReport, CreditReportResponse, CreditStreamRequest, DeleteBlobsRequest,
    DeleteBlobsResponse, GetShardRequest, GetShardResponse, ListShardsRequest, ListShardsResponse,
    NodeStatusRequest, NodeStatusResponse, PutShardRequest, PutShardResponse, ShardBlock,
    ShardInfo,
};
use sluice_proto::shard::MAX_MESSAGE_BYTES;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::block_crc32c;
use crate::credit::validate_gateway_id;
use crate::grants::{CREDIT_GRANT_CHANNEL_DEPTH, CreditHub, Mailbox, SessionGuard, StreamCredit};
use crate::locks::BlobLocks;
use crate::metrics;
use crate::scrub::TokenBucket;
use crate::space::DiskSpace;
use crate::status::RequestError;
use crate::store::{Block, ShardKey, ShardReader, ShardStore, ShardWriter, StoreError};

/// Blocks read ahead of a GetShard client.
pub const GET_SHARD_CHANNEL_DEPTH: usize = 2;

/// ListShards page size when the request says 0 (blobs per page).
pub const DEFAULT_LIST_LIMIT: u32 = 1000;
/// Largest ListShards page (blobs per page).
pub const MAX_LIST_LIMIT: u32 = 10_000;
/// Most shards one HasShards call may ask about.
pub const MAX_HAS_SHARDS: usize = 1000;

/// The blocks of one GetShard, as [`DatanodeService::shard_blocks`] queues
/// them: a stream that ends after the last block or with the error that
/// ended the read.
pub(crate) struct ShardBlocks {
    rx: mpsc::Receiver<Result<Block, Status>>,
    /// The shard-stream permit, when no reader task holds it.
    _permit: Option<OwnedSemaphorePermit>,
}

impl ShardBlocks {
    /// Blocks from `rx`, holding `permit` (if any) until dropped.
    pub(crate) fn new(
        rx: mpsc::Receiver<Result<Block, Status>>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        ShardBlocks {
            rx,
            _permit: permit,
        }
    }
}

impl tokio_stream::Stream for ShardBlocks {
    type Item = Result<Block, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The service's settings (from [`crate::Config`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServiceOptions {
    pub(crate) node_id: u64,
    /// Blocks between a PutShard stream and its writer.
    pub(crate) shard_channel_depth: usize,
    /// Bytes shared among gateways as credit.
    pub(crate) write_budget: u64,
    /// Incremental fsync of credited streams: every this many bytes…
    pub(crate) credit_fsync_bytes: u64,
    /// …or after this long without a block.
    pub(crate) credit_fsync_idle: Duration,
    /// Most PutShard and GetShard streams open at once, all connections
    /// together; one more is refused with `RESOURCE_EXHAUSTED`.
    pub(crate) max_shard_streams: usize,
    /// VerifyShards read rate (bytes per second); 0 refuses VerifyShards.
    pub(crate) verify_bandwidth: u64,
}

/// Serves one datanode's shards.
#[derive(Clone)]
pub(crate) struct DatanodeService<S> {
    store: S,
    options: ServiceOptions,
    node_label: String,
    credits: Arc<CreditHub>,
    /// Cancelled when shutdown starts: long-lived Credits streams end.
    drain: CancellationToken,
    /// Cancelled when in-flight requests must stop (shutdown past its grace).
    cancel: CancellationToken,
    /// GetShard reader and Credits forwarding tasks, awaited at shutdown.
    tasks: TaskTracker,
    /// Per-blob locks shared with GC; the commit holds its blob's.
    locks: BlobLocks,
    /// Free space against `reserved_free_bytes`.
    space: Arc<DiskSpace>,
    /// One permit per open PutShard or GetShard stream
    /// (`max_shard_streams` in all).
    shard_streams: Arc<Semaphore>,
    /// The pace of VerifyShards reads; holding it is the one call at a time
    /// (tokio's mutex queues waiters FIFO).
    verifier: Arc<tokio::sync::Mutex<TokenBucket>>,
}

impl<S: ShardStore> DatanodeService<S> {
    pub(crate) fn new(
        store: S,
        options: ServiceOptions,
        drain: CancellationToken,
        cancel: CancellationToken,
        tasks: TaskTracker,
        locks: BlobLocks,
        space: Arc<DiskSpace>,
    ) -> Self {
        let node_label = options.node_id.to_string();
        let service = DatanodeService {
            store,
            options,
            credits: CreditHub::new(options.write_budget, node_label.clone()),
            node_label,
            drain,
            cancel,
            tasks,
            locks,
            space,
            shard_streams: Arc::new(Semaphore::new(options.max_shard_streams.max(1))),
            verifier: Arc::new(tokio::sync::Mutex::new(TokenBucket::new(
                options.verify_bandwidth,
                tokio::time::Instant::now(),
            ))),
        };
        service.publish_stats();
        service
    }

    /// The gRPC server of this service, with GetShard answered by
    /// hand-framed responses ([`crate::framed`]).
    pub(crate) fn into_server(self) -> crate::framed::DatanodeRoutes<S> {
        let grpc = DatanodeServer::new(self.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        crate::framed::DatanodeRoutes::new(grpc, self)
    }

    /// A permit for one more shard stream, or `RESOURCE_EXHAUSTED` when
    /// `max_shard_streams` are open (the gateway treats it like any failed
    /// shard stream of a busy node: it writes or reads the other shards).
    fn shard_stream_permit(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.shard_streams)
            .try_acquire_owned()
            .map_err(|_| {
                metrics::count_busy_refusal(&self.node_label);
                Status::resource_exhausted(format!(
                    "datanode {} busy: {} shard streams open (max_shard_streams)",
                    self.options.node_id, self.options.max_shard_streams
                ))
            })
    }

    /// GetShard: opens the block range (a disk store reads its first block
    /// then too) and queues the blocks in a channel of
    /// [`GET_SHARD_CHANNEL_DEPTH`]; the first bad block is the last item
    /// (`DATA_LOSS` for bitrot). A block read by the open goes straight
    /// in; if blocks remain, a task reads them one by one. The shard-stream
    /// permit is held by that task until it ends, or else by the returned
    /// [`ShardBlocks`] until the response is done.
    pub(crate) async fn shard_blocks(&self, req: GetShardRequest) -> Result<ShardBlocks, Status> {
        let stream = self.shard_stream_permit()?;
        let key = ShardKey::new(req.blob_id, req.shard_index)?;
        let mut reader = self
            .store
            .open(&key, req.first_block, req.block_count)
            .await
            .map_err(|e| {
                let status = Status::from(e);
                self.log_failure("GetShard", &status);
                status
            })?;
        let (tx, rx) = mpsc::channel(GET_SHARD_CHANNEL_DEPTH);
        let (cancel, node_label, node_id) = (
            self.cancel.clone(),
            self.node_label.clone(),
            self.options.node_id,
        );
        let block_status = move |e: StoreError| {
            if let StoreError::Corrupt { block, .. } = &e {
                metrics::add_corrupt_block(&node_label);
                tracing::warn!(node = node_id, shard = %key, ?block, "bitrot: stored block failed its checksum");
            }
            Status::from(e)
        };
        if let Some(item) = reader.ready_block() {
            let item = item.map_err(&block_status);
            let last = item.is_err();
            // The channel is new and holds at least one item.
            let _ = tx.try_send(item);
            if last || reader.remaining() == 0 {
                return Ok(ShardBlocks::new(rx, Some(stream)));
            }
        }
        self.tasks.spawn(async move {
            let _stream = stream;
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => Some(Err(Status::from(RequestError::ShuttingDown))),
                    next = reader.next_block() => next.map(|r| r.map_err(&block_status)),
                };
                let Some(item) = next else { break };
                let last = item.is_err();
                tokio::select! {
                    () = cancel.cancelled() => break,
                    sent = tx.send(item) => if sent.is_err() { break },
                }
                if last {
                    break;
                }
            }
        });
        Ok(ShardBlocks::new(rx, None))
    }

    /// The credit hub (shared with the heartbeat, which reports its use).
    pub(crate) fn credit_hub(&self) -> Arc<CreditHub> {
        Arc::clone(&self.credits)
    }

    fn publish_stats(&self) {
        metrics::set_shards_stored(&self.node_label, self.store.stats().shards);
    }

    async fn put(
        &self,
        caller: Option<sluice_net::Identity>,
        mut stream: Streaming<PutShardRequest>,
    ) -> Result<PutShardResponse, Status> {
        let header = match stream.message().await? {
            Some(PutShardRequest {
                msg: Some(Msg::Header(h)),
            }) => h,
            _ => return Err(RequestError::MissingHeader.into()),
        };
        let key = ShardKey::new(header.blob_id, header.shard_index)?;
        // Declared before the writer: on failure the writer (and its temp
        // file) goes first, then the held credit is released.
        let account = credit_account(caller, header.gateway_id);
        let credit = match account {
            None => None,
            Some(id) => {
                validate_gateway_id(&id)?;
                Some(StreamCredit::new(Arc::clone(&self.credits), id))
            }
        };
        let credit = credit.as_ref();
        if self.space.below_reserve() {
            metrics::add_reserve_refusal(&self.node_label);
            return Err(Status::resource_exhausted(
                "datanode below its free-space reserve",
            ));
        }
        let mut writer = self.store.create(&key, header.block_size).await?;
        let (tx, mut rx) = mpsc::channel::<Block>(self.options.shard_channel_depth);

        let node_id = self.options.node_id;
        let receive = async move {
            let (mut index, mut bytes) = (0u64, 0u64);
            let mut end = None;
            while let Some(message) = stream.message().await? {
                let block = match message.msg {
                    _ if end.is_some() => return Err(RequestError::AfterEnd.into()),
                    Some(Msg::Block(b)) => b,
                    Some(Msg::End(e)) => {
                        end = Some(e);
                        continue;
                    }
                    Some(Msg::Header(_)) => return Err(RequestError::RepeatedHeader.into()),
                    None => return Err(RequestError::EmptyMessage.into()),
                };
                // The bytes are in memory now, whatever happens next.
                if let Some(credit) = credit {
                    let debit = credit.debit(block.data.len() as u64);
                    if debit.overdrawn > 0 {
                        // Refused, not stored: the writer is dropped (its
                        // temp file removed) and the held bytes released.
                        tracing::debug!(
                            node = node_id,
                            gateway = credit.gateway(),
                            block = index,
                            overdrawn = debit.overdrawn,
                            "shard bytes beyond credit; refusing the shard"
                        );
                        return Err(Status::from(RequestError::BeyondCredit {
                            gateway: credit.gateway().to_string(),
                            block: index,
                            overdrawn: debit.overdrawn,
                        }));
                    }
                }
                let computed = block_crc32c(&block.data);
                if computed != block.crc32c {
                    return Err(Status::from(RequestError::ChecksumMismatch {
                        block: index,
                        sent: block.crc32c,
                        computed,
                    }));
                }
                index += 1;
                bytes += block.data.len() as u64;
                let block = Block {
                    data: block.data,
                    crc32c: block.crc32c,
                };
                if tx.send(block).await.is_err() {
                    // The writer stopped; `write` returns its error.
                    break;
                }
            }
            Ok::<_, Status>((end, index, bytes))
        };
        let (fsync_bytes, fsync_idle) = (
            self.options.credit_fsync_bytes,
            self.options.credit_fsync_idle,
        );
        let write = async move {
            // Written but not yet fsynced (credited streams only).
            let mut unsynced = 0u64;
            loop {
                let next = match credit {
                    Some(credit) if unsynced > 0 => {
                        match tokio::time::timeout(fsync_idle, rx.recv()).await {
                            Ok(next) => next,
                            Err(_idle) => {
                                writer.sync().await?;
                                credit.persisted(std::mem::take(&mut unsynced));
                                continue;
                            }
                        }
                    }
                    _ => rx.recv().await,
                };
                let Some(block) = next else { break };
                let len = block.data.len() as u64;
                writer.write_block(block).await?;
                if let Some(credit) = credit {
                    unsynced += len;
                    if unsynced >= fsync_bytes {
                        writer.sync().await?;
                        credit.persisted(std::mem::take(&mut unsynced));
                    }
                }
            }
            Ok::<_, Status>(writer)
        };
        let ((end, blocks, bytes), writer) = tokio::try_join!(receive, write)?;
        // Only a stream that ended right after a matching end message is a
        // complete shard (see `ShardEnd` in datanode.proto); dropping the
        // writer discards the rest.
        match end {
            None => return Err(RequestError::Truncated { blocks }.into()),
            Some(e) if e.blocks != blocks || e.bytes != bytes => {
                return Err(RequestError::EndMismatch {
                    sent_blocks: e.blocks,
                    sent_bytes: e.bytes,
                    blocks,
                    bytes,
                }
                .into());
            }
            Some(_) => {}
        }
        let committed = {
            let _blob = self.locks.lock(key.blob_id()).await;
            writer.commit().await?
        };
        if let Some(credit) = credit {
            credit.persisted_all();
        }

        metrics::add_bytes_written(&self.node_label, committed.payload_bytes);
        self.publish_stats();
        tracing::debug!(node = self.options.node_id, shard = %key, bytes = committed.payload_bytes, blocks = committed.blocks, "stored shard");
        Ok(PutShardResponse {
            bytes_written: committed.payload_bytes,
            blocks: committed.blocks,
        })
    }

    /// Logs a failure where it is handled: store trouble loudly, client
    /// mistakes quietly.
    fn log_failure(&self, what: &'static str, status: &Status) {
        match status.code() {
            tonic::Code::Internal | tonic::Code::ResourceExhausted | tonic::Code::DataLoss => {
                tracing::warn!(node = self.options.node_id, error = %status.message(), "{what} failed");
            }
            _ => {
                tracing::debug!(node = self.options.node_id, code = ?status.code(), error = %status.message(), "{what} refused")
            }
        }
    }
}

#[tonic::async_trait]
impl<S: ShardStore> Datanode for DatanodeService<S> {
    async fn put_shard(
        &self,
        request: Request<Streaming<PutShardRequest>>,
    ) -> Result<Response<PutShardResponse>, Status> {
        let _stream = self.shard_stream_permit()?;
        let result = tokio::select! {
            () = self.cancel.cancelled() => Err(RequestError::ShuttingDown.into()),
            r = self.put(sluice_net::caller(&request).cloned(), request.into_inner()) => r,
        };
        if let Err(status) = &result {
            self.log_failure("PutShard", status);
        }
        result.map(Response::new)
    }

    type GetShardStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<GetShardResponse, Status>> + Send>,
    >;

    /// The generated route; the server answers GetShard by hand-framed
    /// responses instead ([`crate::framed`]), from the same [`Self::shard_blocks`].
    async fn get_shard(
        &self,
        request: Request<GetShardRequest>,
    ) -> Result<Response<Self::GetShardStream>, Status> {
        use tokio_stream::StreamExt as _;
        let blocks = self.shard_blocks(request.into_inner()).await?;
        Ok(Response::new(Box::pin(blocks.map(|r| {
            r.map(|b| GetShardResponse {
                block: Some(ShardBlock {
                    data: b.data,
                    crc32c: b.crc32c,
                }),
            })
        }))))
    }

    async fn delete_blobs(
        &self,
        request: Request<DeleteBlobsRequest>,
    ) -> Result<Response<DeleteBlobsResponse>, Status> {
        let blob_ids = request.into_inner().blob_ids;
        let deleted = self.store.delete_blobs(&blob_ids).await.map_err(|e| {
            let status = Status::from(e);
            self.log_failure("DeleteBlobs", &status);
            status
        })?;
        self.publish_stats();
        tracing::debug!(
            node = self.options.node_id,
            blobs = blob_ids.len(),
            deleted,
            "deleted blobs"
        );
        Ok(Response::new(DeleteBlobsResponse {
            shards_deleted: deleted,
        }))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        let req = request.into_inner();
        let limit = match req.limit {
            0 => DEFAULT_LIST_LIMIT,
            n => n.min(MAX_LIST_LIMIT),
        };
        let page = self.store.list(&req.after_blob_id, limit as usize).await?;
        let shards = page
            .shards
            .into_iter()
            .map(|e| ShardInfo {
                blob_id: e.key.blob_id().to_string(),
                shard_index: e.key.shard_index(),
                size: e.stored_bytes,
                modified_ms: e.modified_ms,
            })
            .collect();
        Ok(Response::new(ListShardsResponse {
            shards,
            is_truncated: page.is_truncated,
        }))
    }

    type CreditsStream = ReceiverStream<Result<CreditGrant, Status>>;

    async fn credits(
        &self,
        request: Request<CreditStreamRequest>,
    ) -> Result<Response<Self::CreditsStream>, Status> {
        let caller = sluice_net::caller(&request).cloned();
        let gateway = credit_account(caller, request.into_inner().gateway_id).unwrap_or_default();
        let (session, mailbox) = self.credits.connect(&gateway).map_err(|e| {
            let status = Status::from(e);
            self.log_failure("Credits", &status);
            status
        })?;
        tracing::debug!(node = self.options.node_id, gateway = %gateway, "credit stream opened");
        let (tx, rx) = mpsc::channel(CREDIT_GRANT_CHANNEL_DEPTH);
        let guard = SessionGuard {
            hub: Arc::clone(&self.credits),
            gateway,
            session,
        };
        self.tasks
            .spawn(forward_grants(guard, mailbox, tx, self.drain.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn report_credits(
        &self,
        request: Request<CreditReport>,
    ) -> Result<Response<CreditReportResponse>, Status> {
        let caller = sluice_net::caller(&request).cloned();
        let r = request.into_inner();
        let gateway = credit_account(caller, r.gateway_id).unwrap_or_default();
        self.credits
            .report(&gateway, r.wanted_bytes, r.returned_bytes)
            .map_err(|e| {
                let status = Status::from(e);
                self.log_failure("ReportCredits", &status);
                status
            })?;
        Ok(Response::new(CreditReportResponse {}))
    }

    async fn node_status(
        &self,
        _request: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusResponse>, Status> {
        let stats = self.store.stats();
        Ok(Response::new(NodeStatusResponse {
            node_id: self.options.node_id,
            shards: stats.shards,
            bytes_stored: stats.stored_bytes,
        }))
    }

    async fn has_shards(
        &self,
        request: Request<sluice_proto::datanode::HasShardsRequest>,
    ) -> Result<Response<sluice_proto::datanode::HasShardsResponse>, Status> {
        let shards = request.into_inner().shards;
        if shards.len() > MAX_HAS_SHARDS {
            return Err(Status::invalid_argument(format!(
                "HasShards asks about {} shards; at most {MAX_HAS_SHARDS} per call",
                shards.len()
            )));
        }
        let mut present = Vec::with_capacity(shards.len());
        for s in shards {
            // A blob id the store cannot hold is not stored here.
            let Ok(key) = ShardKey::new(s.blob_id, s.shard_index) else {
                present.push(false);
                continue;
            };
            let has = self.store.has_shard(&key).await.map_err(|e| {
                let status = Status::from(e);
                self.log_failure("HasShards", &status);
                status
            })?;
            present.push(has);
        }
        Ok(Response::new(sluice_proto::datanode::HasShardsResponse {
            present,
        }))
    }

    async fn verify_shards(
        &self,
        request: Request<sluice_proto::datanode::VerifyShardsRequest>,
    ) -> Result<Response<sluice_proto::datanode::VerifyShardsResponse>, Status> {
        let shards = request.into_inner().shards;
        if self.options.verify_bandwidth == 0 {
            return Err(Status::failed_precondition(
                "VerifyShards is off on this datanode (verify_bandwidth_bytes_per_sec = 0)",
            ));
        }
        crate::verify::check_request(&shards).map_err(Status::invalid_argument)?;
        let mut bucket = self.verifier.lock().await;
        let mut verdicts = Vec::with_capacity(shards.len());
        for s in &shards {
            let verdict = tokio::select! {
                () = self.cancel.cancelled() => None,
                v = crate::verify::verify_shard(&self.store, s, &mut bucket) => v.ok(),
            };
            let Some(verdict) = verdict else {
                return Err(Status::from(RequestError::ShuttingDown));
            };
            verdicts.push(verdict as i32);
        }
        Ok(Response::new(
            sluice_proto::datanode::VerifyShardsResponse { verdicts },
        ))
    }
}

/// Moves a gateway's grants from its mailbox onto its `Credits` stream
/// until the client goes away, a newer stream replaces this one, or the
/// node drains. The session ends (credit back to the pool) before the
/// gateway can see the stream end.
async fn forward_grants(
    session: SessionGuard,
    mailbox: Arc<Mailbox>,
    tx: mpsc::Sender<Result<CreditGrant, Status>>,
    drain: CancellationToken,
) {
    let replaced = || Status::aborted("replaced by a newer Credits stream of this gateway");
    let end = loop {
        tokio::select! {
            biased;
            () = drain.cancelled() => break Some(Status::from(RequestError::ShuttingDown)),
            () = mailbox.replaced.cancelled() => break Some(replaced()),
            () = tx.closed() => break None,
            () = mailbox.notified() => {}
        }
        let bytes = mailbox.take();
        if bytes == 0 {
            continue;
        }
        // While this waits for room, newer grants coalesce in the mailbox.
        tokio::select! {
            biased;
            () = drain.cancelled() => break Some(Status::from(RequestError::ShuttingDown)),
            () = mailbox.replaced.cancelled() => break Some(replaced()),
            sent = tx.send(Ok(CreditGrant { bytes })) => if sent.is_err() { break None },
        }
    };
    drop(session);
    if let Some(status) = end {
        // Best effort: the stream ends either way when `tx` drops.
        let _ = tx.try_send(Err(status));
    }
}

#[cfg(test)]
mod tests;

/// The credit account a call speaks for. Under mutual TLS it is the
/// caller's certificate id (the policy lets only gateways call the credit
/// RPCs and PutShard), whatever the request's `gateway_id` says; in
/// insecure mode it is the request's `gateway_id` (`None` when empty: a
/// PutShard without credit).
fn credit_account(caller: Option<sluice_net::Identity>, requested: String) -> Option<String> {
    match caller {
        Some(identity) => Some(identity.id),
        None => (!requested.is_empty()).then_some(requested),
    }
}
