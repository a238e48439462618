//! The write path: request body -> stripes -> k+m `PutShard` streams.
//!
//! Each shard gets a bounded channel of [`Frame`]s feeding one
//! client-streaming `PutShard` RPC that runs in its own task. The body is
//! read until one stripe is buffered, the stripe is encoded, and block `i`
//! is sent into shard `i`'s channel; a full channel blocks the body reader,
//! so a slow datanode slows the client instead of growing memory.
//!
//! A shard stream ends cleanly only when [`Frame::End`] is sent. If the
//! write is abandoned (body error, quorum lost, the caller dropped the
//! future) the shard tasks are aborted, which resets the HTTP/2 streams;
//! the request stream never ends cleanly on its own (see
//! [`ShardRequestStream`]), so a datanode can never commit a truncated shard.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{PutShardRequest, PutShardResponse, ShardBlock, ShardHeader};
use sluice_proto::meta::Placement;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{BlobError, BlobStore, SHARD_STALL_TIMEOUT};
use crate::layout::Layout;

/// What the write path puts into a shard's channel.
#[derive(Debug)]
enum Frame {
    Msg(PutShardRequest),
    /// The shard is complete: end the request stream cleanly.
    End,
}

/// The request stream of one `PutShard` RPC.
///
/// Yields the messages of the channel and ends only after [`Frame::End`].
/// If every sender is dropped without `End`, the stream stays pending
/// forever instead of ending: the RPC is then reset when its task is
/// aborted, and the datanode discards the partial shard.
struct ShardRequestStream {
    rx: mpsc::Receiver<Frame>,
    ended: bool,
}

impl Stream for ShardRequestStream {
    type Item = PutShardRequest;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<PutShardRequest>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Frame::Msg(m))) => Poll::Ready(Some(m)),
            Poll::Ready(Some(Frame::End)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            // Abandoned: never signal a clean end of stream.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// One shard's stream: its channel, its RPC task and whether it failed.
struct ShardWriter {
    index: usize,
    node: u64,
    /// `None` once the shard failed or was finished.
    tx: Option<mpsc::Sender<Frame>>,
    /// Cancelled when the RPC task ends, for whatever reason.
    rpc_done: CancellationToken,
    task: Option<JoinHandle<Result<PutShardResponse, tonic::Status>>>,
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // Abandoned write: reset the stream so the datanode discards it.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl ShardWriter {
    /// Sends one frame, waiting for channel space; `Err` (with the reason)
    /// if the RPC ended or the channel stayed full past the stall timeout.
    async fn send(&mut self, frame: Frame) -> Result<(), String> {
        let Some(tx) = &self.tx else {
            return Err("shard already failed".into());
        };
        let stalled = tokio::select! {
            sent = tx.send(frame) => match sent {
                Ok(()) => return Ok(()),
                // The RPC dropped its request stream: it has ended.
                Err(_) => false,
            },
            () = self.rpc_done.cancelled() => false,
            () = tokio::time::sleep(SHARD_STALL_TIMEOUT) => true,
        };
        if stalled {
            Err(format!("no progress for {SHARD_STALL_TIMEOUT:?}"))
        } else {
            Err(self.rpc_error().await)
        }
    }

    /// The error of an RPC that ended early (waits at most the stall
    /// timeout for the task to report it).
    async fn rpc_error(&mut self) -> String {
        let Some(mut task) = self.task.take() else {
            return "shard task already finished".into();
        };
        match tokio::time::timeout(SHARD_STALL_TIMEOUT, &mut task).await {
            Err(_) => {
                task.abort();
                "shard stream closed".into()
            }
            Ok(result) => match result {
                Ok(Ok(_)) => "datanode answered before the shard was complete".into(),
                Ok(Err(status)) => format!("{}: {}", status.code(), status.message()),
                Err(e) => format!("shard task failed: {e}"),
            },
        }
    }

    /// Marks the shard failed: aborts its RPC (resetting the stream).
    fn fail(&mut self, reason: &str, blob_id: &str) {
        tracing::warn!(
            blob_id,
            shard = self.index,
            node = self.node,
            error = reason,
            "shard write failed"
        );
        self.tx = None;
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    fn is_alive(&self) -> bool {
        self.tx.is_some()
    }
}

/// Everything one write holds.
struct BlobWriter<'a> {
    store: &'a BlobStore,
    blob_id: String,
    nodes: Vec<u64>,
    shards: Vec<ShardWriter>,
    write_quorum: usize,
}

impl BlobWriter<'_> {
    fn alive(&self) -> usize {
        self.shards.iter().filter(|s| s.is_alive()).count()
    }

    /// Fails with `QuorumNotReached` once too few shards are left.
    fn check_quorum(&self) -> Result<(), BlobError> {
        let alive = self.alive();
        if alive < self.write_quorum {
            return Err(BlobError::QuorumNotReached {
                durable: alive,
                needed: self.write_quorum,
            });
        }
        Ok(())
    }

    /// Opens one `PutShard` RPC per shard and queues its header.
    async fn open(&mut self, block_size: u32, depth: usize) -> Result<(), BlobError> {
        for (index, &node) in self.nodes.iter().enumerate() {
            let (tx, rx) = mpsc::channel(depth);
            let rpc_done = CancellationToken::new();
            let mut shard = ShardWriter {
                index,
                node,
                tx: Some(tx),
                rpc_done: rpc_done.clone(),
                task: None,
            };
            match self.store.inner.pool.client(node) {
                Ok(mut client) => {
                    let stream = ShardRequestStream { rx, ended: false };
                    shard.task = Some(tokio::spawn(async move {
                        let _done = rpc_done.drop_guard();
                        client
                            .put_shard(stream)
                            .await
                            .map(tonic::Response::into_inner)
                    }));
                    let header = ShardHeader {
                        blob_id: self.blob_id.clone(),
                        shard_index: index as u32,
                        block_size,
                        // No byte credits yet (datanode credit protocol, issue 3).
                        gateway_id: String::new(),
                    };
                    if let Err(reason) = shard
                        .send(Frame::Msg(PutShardRequest {
                            msg: Some(Msg::Header(header)),
                        }))
                        .await
                    {
                        shard.fail(&reason, &self.blob_id);
                    }
                }
                Err(e) => shard.fail(&e.to_string(), &self.blob_id),
            }
            self.shards.push(shard);
        }
        self.check_quorum()
    }

    /// Encodes one stripe and sends block `i` to shard `i`.
    async fn send_stripe(&mut self, stripe: Bytes) -> Result<(), BlobError> {
        let blocks = self.store.inner.codec.encode(stripe);
        for (shard, block) in self.shards.iter_mut().zip(blocks) {
            if !shard.is_alive() {
                continue;
            }
            let crc32c = sluice_datanode::block_crc32c(&block);
            let msg = PutShardRequest {
                msg: Some(Msg::Block(ShardBlock {
                    data: block.into(),
                    crc32c,
                })),
            };
            if let Err(reason) = shard.send(Frame::Msg(msg)).await {
                shard.fail(&reason, &self.blob_id);
            }
        }
        self.check_quorum()
    }

    /// Ends every live shard stream and waits for the acknowledgements;
    /// returns the indices of shards that are not durable.
    async fn finish(&mut self, layout: &Layout) -> Vec<u32> {
        for shard in self.shards.iter_mut().filter(|s| s.is_alive()) {
            if let Err(reason) = shard.send(Frame::End).await {
                shard.fail(&reason, &self.blob_id);
            }
        }
        let (blocks, bytes) = (layout.stripe_count(), layout.shard_bytes());
        let blob_id = self.blob_id.as_str();
        let acks = self.shards.iter_mut().map(|shard| async move {
            let mut task = shard.task.take()?;
            let outcome = match tokio::time::timeout(SHARD_STALL_TIMEOUT, &mut task).await {
                Ok(Ok(Ok(r))) if r.blocks == blocks && r.bytes_written == bytes => {
                    return Some(shard.index);
                }
                Ok(Ok(Ok(r))) => format!(
                    "datanode stored {} blocks / {} bytes, expected {blocks} / {bytes}",
                    r.blocks, r.bytes_written
                ),
                Ok(Ok(Err(status))) => format!("{}: {}", status.code(), status.message()),
                Ok(Err(e)) => format!("shard task failed: {e}"),
                Err(_) => {
                    // Reset the stream: the shard must not turn up later.
                    task.abort();
                    format!("no acknowledgement within {SHARD_STALL_TIMEOUT:?}")
                }
            };
            shard.fail(&outcome, blob_id);
            None
        });
        let durable: Vec<usize> = futures::future::join_all(acks)
            .await
            .into_iter()
            .flatten()
            .collect();
        (0..self.shards.len())
            .filter(|i| !durable.contains(i))
            .map(|i| i as u32)
            .collect()
    }

    /// Best-effort removal of every shard of this blob (after a failed write).
    async fn discard(&mut self) {
        // Reset the streams first so no shard can still be committed.
        self.shards.clear();
        let by_node: BTreeMap<u64, Vec<String>> = self
            .nodes
            .iter()
            .map(|&n| (n, vec![self.blob_id.clone()]))
            .collect();
        self.store.delete_on(by_node).await;
    }
}

/// Streams `body` to the shards on `nodes` (shard `i` on `nodes[i]`).
pub(super) async fn write_blob<S>(
    store: &BlobStore,
    nodes: Vec<u64>,
    mut body: S,
) -> Result<Placement, BlobError>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
{
    let config = &store.inner.config;
    let (k, block_size) = (config.data_shards, config.block_size);
    let stripe_bytes = k * block_size;
    let mut writer = BlobWriter {
        store,
        blob_id: uuid::Uuid::new_v4().simple().to_string(),
        nodes: nodes.clone(),
        shards: Vec::with_capacity(nodes.len()),
        write_quorum: config.write_quorum,
    };
    // On any early return the shard writers drop, which aborts their RPCs.
    writer
        .open(block_size as u32, config.shard_channel_depth)
        .await?;

    let mut size = 0u64;
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(BlobError::Body)?;
        size += chunk.len() as u64;
        while !chunk.is_empty() {
            if buf.is_empty() && chunk.len() >= stripe_bytes {
                // A whole stripe inside the chunk: no copy.
                writer.send_stripe(chunk.split_to(stripe_bytes)).await?;
                continue;
            }
            if buf.capacity() < stripe_bytes {
                buf.reserve(stripe_bytes - buf.len());
            }
            let take = (stripe_bytes - buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk.split_to(take));
            if buf.len() == stripe_bytes {
                writer.send_stripe(buf.split().freeze()).await?;
            }
        }
    }
    if !buf.is_empty() {
        writer.send_stripe(buf.split().freeze()).await?;
    }
    drop(buf);

    let layout = Layout::new(size, k, block_size);
    let missing = writer.finish(&layout).await;
    let durable = nodes.len() - missing.len();
    if durable < writer.write_quorum {
        let needed = writer.write_quorum;
        tracing::warn!(blob_id = %writer.blob_id, durable, needed, "write quorum not reached, discarding blob");
        writer.discard().await;
        return Err(BlobError::QuorumNotReached { durable, needed });
    }
    if !missing.is_empty() {
        tracing::warn!(blob_id = %writer.blob_id, ?missing, "blob written without some shards (to heal)");
    }
    Ok(Placement {
        blob_id: writer.blob_id.clone(),
        size,
        data_shards: k as u32,
        parity_shards: config.parity_shards as u32,
        block_size: block_size as u32,
        nodes,
        missing,
    })
}
