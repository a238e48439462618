//! The write path: request body -> stripes -> k+m `PutShard` streams.
//!
//! Before each stripe is read from the body, a permit for it is taken from
//! the write buffer budget (see [`crate::admission`]): waiting for it is
//! what stops the request from reading its socket. The stripe is encoded
//! and block `i` is sent into shard `i`'s bounded channel, together with a
//! shared handle on the stripe's permit. Each channel feeds one
//! client-streaming `PutShard` RPC in its own task; before the RPC's request
//! body yields a block it debits that datanode's credit (see
//! [`crate::credit`]), waiting at most `stall_timeout`. A full channel
//! blocks the body reader, so a slow datanode slows the client instead of
//! growing memory.
//!
//! Blocks are `Bytes` slices of the stripe buffer all the way to the
//! socket (a full stripe's buffer holds its parity too and is reused, see
//! [`super::stripe_buffers`]; a short stripe's parity blocks have buffers
//! of their own): the request body hands each block
//! itself to HTTP/2 between a few bytes of gRPC and protobuf framing (see
//! [`super::put_shard`]), wrapped so that it carries its stripe's permit. The
//! permit goes back when HTTP/2 has written (or, on a reset, dropped) the
//! last block of the stripe, so a stripe's memory is exactly what its
//! permit counts, wherever its blocks are.
//!
//! A shard is complete only when [`Frame::End`](super::put_shard::Frame::End) is sent: the stream then
//! carries a `ShardEnd` message with its block and byte counts, and a
//! datanode commits only a stream that ends right after a matching one.
//! If the write is abandoned (body error, quorum lost, the caller dropped
//! the future) the shard tasks are aborted, which resets the HTTP/2
//! streams; tonic hands a cancelled request stream to the datanode as a
//! clean end of stream, so the end message, not the end of the stream, is
//! what keeps a datanode from committing a truncated shard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sluice_proto::datanode::{PutShardResponse, ShardHeader};
use sluice_proto::meta::Placement;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::put_shard::{Frame, StreamFailure, put_shard, shard_requests};
use super::shard_failure::ShardFailure;
use super::stripe_buffers::{StripeBuffer, StripeBuffers};
use super::{BlobError, BlobStore, SHARD_STALL_TIMEOUT};
use crate::admission::BufferPermit;
use crate::credit::CreditError;
use crate::datanodes::MAX_MESSAGE_BYTES;
use crate::epoch::EpochGuard;
use crate::erasure::Codec;
use crate::layout::Layout;

/// One shard's stream: its channel, its RPC task and whether it failed.
struct ShardWriter {
    index: usize,
    node: u64,
    /// `None` once the shard failed or was finished.
    tx: Option<mpsc::Sender<Frame>>,
    /// Cancelled when the RPC task ends, for whatever reason.
    rpc_done: CancellationToken,
    task: Option<JoinHandle<Result<PutShardResponse, tonic::Status>>>,
    /// Set when the request stream gave up waiting for credit.
    failure: Arc<StreamFailure>,
    /// How long a full channel may block a send.
    send_timeout: Duration,
    /// The datanode refused the shard with `RESOURCE_EXHAUSTED` (disk full
    /// or below its free-space reserve).
    full: bool,
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
    /// if the RPC ended or the channel stayed full past the send timeout.
    async fn send(&mut self, frame: Frame) -> Result<(), ShardFailure> {
        let Some(tx) = &self.tx else {
            return Err(ShardFailure::AlreadyFailed);
        };
        let stalled = tokio::select! {
            sent = tx.send(frame) => match sent {
                Ok(()) => return Ok(()),
                // The RPC dropped its request stream: it has ended.
                Err(_) => false,
            },
            () = self.rpc_done.cancelled() => false,
            () = tokio::time::sleep(self.send_timeout) => true,
        };
        if stalled {
            Err(ShardFailure::NoProgress(self.send_timeout))
        } else {
            Err(self.rpc_error().await)
        }
    }

    /// The error of an RPC that ended early (waits at most the stall
    /// timeout for the task to report it).
    async fn rpc_error(&mut self) -> ShardFailure {
        let Some(mut task) = self.task.take() else {
            return ShardFailure::TaskFinished;
        };
        match tokio::time::timeout(SHARD_STALL_TIMEOUT, &mut task).await {
            Err(_) => {
                task.abort();
                ShardFailure::StreamClosed
            }
            Ok(result) => match result {
                Ok(Ok(_)) => ShardFailure::EarlyAnswer,
                Ok(Err(status)) => self.status_error(&status),
                Err(e) => ShardFailure::Task(e),
            },
        }
    }

    /// The reason of a failed RPC; notes a datanode's `RESOURCE_EXHAUSTED`
    /// (not our own credit wait giving up, which fails the task with the
    /// same code but sets `failure`).
    fn status_error(&mut self, status: &tonic::Status) -> ShardFailure {
        let failure = ShardFailure::from(status);
        if failure.is_resource_exhausted() && self.failure.get().is_none() {
            self.full = true;
        }
        failure
    }

    /// Marks the shard failed: aborts its RPC (resetting the stream).
    fn fail(&mut self, reason: &ShardFailure, blob_id: &str) {
        tracing::warn!(
            blob_id,
            shard = self.index,
            node = self.node,
            error = %reason,
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

    /// Whether this shard failed for want of datanode credit.
    fn starved(&self) -> bool {
        !self.is_alive() && matches!(self.failure.get(), Some(CreditError::Stalled { .. }))
    }
}

/// The write-quorum decision, apart from the shard streams: a write
/// goes on while at least `needed` shards are alive, and is acknowledged
/// only with `needed` shards durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quorum {
    /// Shards that must be durable (`write_quorum`, k..=k+m).
    needed: usize,
    /// How long a shard waited for credit before it was given up.
    stall_timeout: Duration,
}

impl Quorum {
    /// `Ok` while `alive` shards can still make the quorum. Otherwise why
    /// not: `DatanodesBusy` (503 SlowDown) when a shard was lost for want of
    /// datanode credit (`starved`: the datanodes are saturated, a retry
    /// later succeeds), else `QuorumNotReached` (503: too few datanodes
    /// took the shards).
    fn check(&self, alive: usize, starved: bool) -> Result<(), BlobError> {
        if alive >= self.needed {
            Ok(())
        } else if starved {
            Err(BlobError::DatanodesBusy {
                waited: self.stall_timeout,
            })
        } else {
            Err(BlobError::QuorumNotReached {
                durable: alive,
                needed: self.needed,
            })
        }
    }
}

/// Everything one write holds.
struct BlobWriter<'a> {
    store: &'a BlobStore,
    blob_id: String,
    nodes: Vec<u64>,
    shards: Vec<ShardWriter>,
    quorum: Quorum,
}

impl BlobWriter<'_> {
    fn alive(&self) -> usize {
        self.shards.iter().filter(|s| s.is_alive()).count()
    }

    /// Fails once too few shards are left ([`Quorum::check`]).
    fn check_quorum(&self) -> Result<(), BlobError> {
        self.quorum.check(self.alive(), self.any_starved())
    }

    /// Whether a shard was lost for want of datanode credit.
    fn any_starved(&self) -> bool {
        self.shards.iter().any(ShardWriter::starved)
    }

    /// The buffer permit of the next stripe (of `payload` bytes).
    ///
    /// Blocks queued for a datanode that grants no credit hold their
    /// stripes' buffers until that shard's credit wait gives up (after
    /// `stall_timeout`, like this wait) and the shard is failed. The two
    /// waits end at nearly the same time when the budget is a few stripes,
    /// in either order; so a buffer stall first fails the shards whose
    /// credit wait gave up (waiting at most one more `stall_timeout` for a
    /// shard still waiting for credit to give up), then, if the quorum
    /// still holds, waits again: a starved datanode costs its shard, not
    /// the write. Every retry fails at least one shard, so this ends.
    /// Errors: `BufferStall` when no shard was starved; `DatanodesBusy`
    /// when starved shards broke the quorum.
    async fn stripe_permit(&mut self, payload: usize) -> Result<BufferPermit, BlobError> {
        loop {
            match self.store.stripe_permit(payload).await {
                Err(stall @ BlobError::BufferStall { .. }) => {
                    if self.fail_starved().await == 0 {
                        return Err(stall);
                    }
                    self.check_quorum()?;
                }
                result => return result,
            }
        }
    }

    /// Fails the live shards whose credit wait gave up; if none has, but
    /// some are still waiting for credit, first waits up to `stall_timeout`
    /// for one of those to give up. Returns how many shards it failed.
    async fn fail_starved(&mut self) -> usize {
        let gave_up = |s: &ShardWriter| s.is_alive() && s.failure.token.is_cancelled();
        if !self.shards.iter().any(gave_up) {
            let waits: Vec<_> = self
                .shards
                .iter()
                .filter(|s| s.is_alive() && s.failure.awaiting_credit.load(Ordering::Relaxed))
                .map(|s| Box::pin(s.failure.token.cancelled()))
                .collect();
            if waits.is_empty() {
                return 0;
            }
            let grace = self.store.inner.config.stall_timeout;
            let _ = tokio::time::timeout(grace, futures::future::select_all(waits)).await;
        }
        let mut failed = 0;
        for shard in self.shards.iter_mut().filter(|s| gave_up(s)) {
            let reason = shard
                .failure
                .get()
                .map_or(ShardFailure::NoCredit, ShardFailure::Credit);
            shard.fail(&reason, &self.blob_id);
            failed += 1;
        }
        failed
    }

    /// Opens one `PutShard` RPC per shard (and the datanode's credit
    /// stream, on first use) and queues its header.
    async fn open(&mut self, block_size: u32, depth: usize) -> Result<(), BlobError> {
        let inner = &self.store.inner;
        let stall = inner.config.stall_timeout;
        for (index, &node) in self.nodes.iter().enumerate() {
            let (tx, rx) = mpsc::channel(depth);
            let rpc_done = CancellationToken::new();
            let failure = Arc::new(StreamFailure::default());
            let mut shard = ShardWriter {
                index,
                node,
                tx: Some(tx),
                rpc_done: rpc_done.clone(),
                task: None,
                failure: Arc::clone(&failure),
                send_timeout: stall + SHARD_STALL_TIMEOUT,
                full: false,
            };
            match inner.pool.channel(node) {
                Ok(channel) => {
                    let addr = inner.pool.addr(node).unwrap_or_default();
                    let credit = inner.credits.node(node, &addr, || {
                        sluice_proto::datanode::datanode_client::DatanodeClient::new(
                            channel.clone(),
                        )
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES)
                    });
                    shard.task = Some(tokio::spawn(async move {
                        let _done = rpc_done.drop_guard();
                        // Not on a connection the credit stream saw break
                        // (see NodeCredit::stream_open); this wait is part
                        // of the first block's credit wait, which has
                        // `stall` in all.
                        let started = tokio::time::Instant::now();
                        failure.awaiting_credit.store(true, Ordering::Relaxed);
                        let open = credit.stream_open(stall).await;
                        failure.awaiting_credit.store(false, Ordering::Relaxed);
                        if let Err(e) = open {
                            let status = tonic::Status::resource_exhausted(e.to_string());
                            failure.set(e);
                            return Err(status);
                        }
                        let requests = shard_requests(
                            rx,
                            Some(credit),
                            stall.saturating_sub(started.elapsed()),
                            stall,
                            Arc::clone(&failure),
                        );
                        tokio::select! {
                            result = put_shard(channel, requests) => result,
                            // Dropping the call resets the stream.
                            () = failure.token.cancelled() => Err(tonic::Status::resource_exhausted(
                                failure.get().map_or_else(|| "no credit".to_string(), |e| e.to_string()),
                            )),
                        }
                    }));
                    let header = ShardHeader {
                        blob_id: self.blob_id.clone(),
                        shard_index: index as u32,
                        block_size,
                        gateway_id: inner.credits.gateway_id().to_string(),
                    };
                    if let Err(reason) = shard.send(Frame::Header(header)).await {
                        shard.fail(&reason, &self.blob_id);
                    }
                }
                Err(e) => shard.fail(&ShardFailure::from(e), &self.blob_id),
            }
            self.shards.push(shard);
        }
        self.check_quorum()
    }

    /// Sends block `i` of an encoded stripe to shard `i`; `permit` is
    /// released once every live shard stream has sent its block.
    async fn send_stripe(
        &mut self,
        blocks: Vec<Bytes>,
        permit: BufferPermit,
    ) -> Result<(), BlobError> {
        let permit = Arc::new(permit);
        for (shard, block) in self.shards.iter_mut().zip(blocks) {
            if !shard.is_alive() {
                continue;
            }
            let crc32c = sluice_proto::shard::block_crc32c(&block);
            let frame = Frame::Block {
                data: block,
                crc32c,
                stripe: Arc::clone(&permit),
            };
            if let Err(reason) = shard.send(frame).await {
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
                Ok(Ok(Ok(r))) => ShardFailure::WrongShape {
                    blocks: r.blocks,
                    bytes: r.bytes_written,
                    want_blocks: blocks,
                    want_bytes: bytes,
                },
                Ok(Ok(Err(status))) => shard.status_error(&status),
                Ok(Err(e)) => ShardFailure::Task(e),
                Err(_) => {
                    // Reset the stream: the shard must not turn up later.
                    task.abort();
                    ShardFailure::NoAck(SHARD_STALL_TIMEOUT)
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

    /// Reports the datanodes that refused their shard as full to the store.
    fn note_full(&self) {
        for shard in self.shards.iter().filter(|s| s.full) {
            self.store.datanode_full(shard.node);
        }
    }

    /// Best-effort removal of every shard of this blob (after a failed write).
    async fn discard(&mut self) {
        self.note_full();
        // Reset the streams first so no shard can still be committed.
        self.shards.clear();
        crate::metrics::count_discarded(1);
        let by_node: BTreeMap<u64, Vec<String>> = self
            .nodes
            .iter()
            .map(|&n| (n, vec![self.blob_id.clone()]))
            .collect();
        self.store.delete_on(by_node).await;
    }
}

/// Payload bytes the next stripe may hold: a full stripe, or less when the
/// declared body length `len` says fewer bytes remain after the `consumed`
/// ones already in stripes.
pub(super) fn stripe_capacity(len: Option<u64>, consumed: u64, stripe_bytes: usize) -> usize {
    match len {
        Some(len) => {
            let left = len.saturating_sub(consumed);
            usize::try_from(left).map_or(stripe_bytes, |l| l.min(stripe_bytes))
        }
        None => stripe_bytes,
    }
}

/// A stripe being copied out of the body's chunks: a full one into a
/// reused buffer with room for its parity (see [`super::stripe_buffers`]),
/// a short one (a body's last) into a buffer of its own.
struct Fill {
    buf: FillBuffer,
    /// Payload bytes copied in so far.
    len: usize,
}

enum FillBuffer {
    Full(StripeBuffer),
    Short(BytesMut),
}

impl Fill {
    /// Room for a stripe of `cap` payload bytes of `k` blocks of at most
    /// `block_size`; full stripes come from `buffers`.
    fn new(buffers: &StripeBuffers, k: usize, block_size: usize, cap: usize) -> Fill {
        let buf = if cap == k * block_size {
            FillBuffer::Full(buffers.take())
        } else {
            FillBuffer::Short(BytesMut::with_capacity(k * Layout::block_len_for(cap, k)))
        };
        Fill { buf, len: 0 }
    }

    /// Appends `bytes` (the caller keeps within the stripe's capacity).
    fn extend(&mut self, bytes: &[u8]) {
        match &mut self.buf {
            FillBuffer::Full(b) => {
                b.as_mut_slice()[self.len..self.len + bytes.len()].copy_from_slice(bytes)
            }
            FillBuffer::Short(b) => b.extend_from_slice(bytes),
        }
        self.len += bytes.len();
    }

    /// The stripe's k + m blocks (index = shard index).
    fn encode(self, codec: &Codec) -> Vec<Bytes> {
        let (k, shards) = (codec.data_shards(), codec.total_shards());
        match self.buf {
            FillBuffer::Full(mut b) => {
                // Shorter blocks when the body ended inside the stripe (its
                // length was not known, or it was shorter than declared):
                // the payload stays where it is, zero-padded to k blocks,
                // with the parity after it.
                let block = Layout::block_len_for(self.len, k);
                let buf = b.as_mut_slice();
                buf[self.len..k * block].fill(0);
                codec.encode_parity_in_place(&mut buf[..shards * block], block);
                let stripe = b.freeze();
                (0..shards)
                    .map(|i| stripe.slice(i * block..(i + 1) * block))
                    .collect()
            }
            FillBuffer::Short(b) => codec.encode(padded(b, k)),
        }
    }
}

/// Zero-pads a short stripe in place to `k` equal blocks (the capacity was
/// reserved for it, so nothing is reallocated).
fn padded(mut buf: BytesMut, k: usize) -> Bytes {
    let block = Layout::block_len_for(buf.len(), k);
    buf.resize(k * block, 0);
    buf.freeze()
}

/// The body was longer than its declared length.
fn too_long(len: u64) -> BlobError {
    BlobError::Body(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("request body is longer than its declared {len} bytes"),
    ))
}

/// Streams `body` to the shards on `nodes` (shard `i` on `nodes[i]`) as a
/// new blob of `epoch`. `first` is the buffer permit of the first stripe
/// (taken before the datanodes were chosen); `len` the declared body
/// length, if known. A datanode that refuses its shard with
/// `RESOURCE_EXHAUSTED` fails only that shard, and is reported full to the
/// store (see [`BlobStore::datanode_full`]).
pub(super) async fn write_blob<S>(
    store: &BlobStore,
    epoch: &EpochGuard,
    nodes: Vec<u64>,
    body: S,
    len: Option<u64>,
    first: BufferPermit,
) -> Result<Placement, BlobError>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
{
    let config = &store.inner.config;
    let mut writer = BlobWriter {
        store,
        blob_id: sluice_proto::blob_id::new_blob_id(epoch.epoch(), rand::random::<u128>()),
        nodes: nodes.clone(),
        shards: Vec::with_capacity(nodes.len()),
        quorum: Quorum {
            needed: config.write_quorum,
            stall_timeout: config.stall_timeout,
        },
    };
    let result = write_stripes(&mut writer, body, len, first).await;
    writer.note_full();
    result
}

/// The body of [`write_blob`]: open the shards, stream the stripes, finish.
async fn write_stripes<S>(
    writer: &mut BlobWriter<'_>,
    mut body: S,
    len: Option<u64>,
    first: BufferPermit,
) -> Result<Placement, BlobError>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
{
    let store = writer.store;
    let config = &store.inner.config;
    let (k, block_size) = (config.data_shards, config.block_size);
    let stripe_bytes = k * block_size;
    let (codec, buffers) = (&store.inner.codec, &store.inner.stripe_buffers);
    let nodes = writer.nodes.clone();
    // On any early return the shard writers drop (with the writer, after
    // the full datanodes were noted), which aborts their RPCs.
    writer
        .open(block_size as u32, config.shard_channel_depth)
        .await?;

    let mut size = 0u64;
    let mut pending: Option<Bytes> = None;
    let mut eof = false;
    let mut next = Some(first);
    loop {
        // Bytes read from the body and not yet in a stripe are in `pending`.
        let consumed = size - pending.as_ref().map_or(0, |c| c.len() as u64);
        let cap = stripe_capacity(len, consumed, stripe_bytes);
        // The buffer first, then the body: while this waits, the socket is not read.
        let permit = match next.take() {
            Some(p) => p,
            None => writer.stripe_permit(cap).await?,
        };
        let mut fill: Option<Fill> = None;
        let mut stripe = None;
        while stripe.is_none() {
            let mut chunk = match pending.take() {
                Some(c) => c,
                None => match body.next().await {
                    Some(c) => {
                        let c = c.map_err(BlobError::Body)?;
                        size += c.len() as u64;
                        if let Some(len) = len
                            && size > len
                        {
                            return Err(too_long(len));
                        }
                        c
                    }
                    None => {
                        eof = true;
                        break;
                    }
                },
            };
            if chunk.is_empty() {
                continue;
            }
            if fill.is_none() && cap == stripe_bytes && chunk.len() >= cap {
                // A whole stripe inside the chunk: no copy.
                stripe = Some(codec.encode(chunk.split_to(cap)));
            } else {
                let f = fill.get_or_insert_with(|| Fill::new(buffers, k, block_size, cap));
                let take = (cap - f.len).min(chunk.len());
                f.extend(&chunk.split_to(take));
                if f.len == cap {
                    stripe = fill.take().map(|f| f.encode(codec));
                }
            }
            if !chunk.is_empty() {
                pending = Some(chunk);
            }
        }
        if stripe.is_none() {
            stripe = fill.filter(|f| f.len > 0).map(|f| f.encode(codec));
        }
        match stripe {
            Some(s) => writer.send_stripe(s, permit).await?,
            None => drop(permit),
        }
        if eof && pending.is_none() {
            break;
        }
    }

    let layout = Layout::new(size, k, block_size);
    let missing = writer.finish(&layout).await;
    let durable = nodes.len() - missing.len();
    if let Err(err) = writer.quorum.check(durable, writer.any_starved()) {
        let needed = writer.quorum.needed;
        tracing::warn!(blob_id = %writer.blob_id, durable, needed, "write quorum not reached, discarding blob");
        writer.discard().await;
        return Err(err);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_names_why_a_write_failed() {
        let quorum = Quorum {
            needed: 5,
            stall_timeout: Duration::from_secs(30),
        };
        assert!(quorum.check(6, false).is_ok());
        assert!(
            quorum.check(5, true).is_ok(),
            "a starved shard beyond the quorum costs nothing"
        );
        assert!(matches!(
            quorum.check(4, false),
            Err(BlobError::QuorumNotReached {
                durable: 4,
                needed: 5
            })
        ));
        assert!(matches!(
            quorum.check(4, true),
            Err(BlobError::DatanodesBusy { waited }) if waited == Duration::from_secs(30)
        ));
    }

    #[test]
    fn stripe_capacity_follows_the_declared_length() {
        assert_eq!(stripe_capacity(None, 0, 1024), 1024);
        assert_eq!(stripe_capacity(Some(10), 0, 1024), 10);
        assert_eq!(stripe_capacity(Some(3000), 2048, 1024), 952);
        assert_eq!(stripe_capacity(Some(3000), 1024, 1024), 1024);
        assert_eq!(stripe_capacity(Some(3000), 3000, 1024), 0);
        assert_eq!(stripe_capacity(Some(3000), 4000, 1024), 0);
    }

    #[test]
    fn a_reused_stripe_buffer_encodes_as_a_fresh_one() {
        use crate::admission::{BudgetKind, BufferBudget, GatewayStats};
        let (k, block) = (4, 1000);
        let codec = Codec::new(k, 2).expect("codec");
        let budget = BufferBudget::new(BudgetKind::Write, 1 << 20, GatewayStats::new());
        let buffers = StripeBuffers::new(6 * block, 4, budget);
        // Leave stale bytes in the one idle buffer.
        let mut stale = buffers.take();
        stale.as_mut_slice().fill(0xEE);
        drop(stale);
        let payload: Vec<u8> = (0..k * block).map(|i| (i * 13 % 251) as u8).collect();
        let mut fill = Fill::new(&buffers, k, block, k * block);
        assert!(matches!(fill.buf, FillBuffer::Full(_)));
        assert_eq!(buffers.idle(), 0, "the stale buffer was taken");
        for piece in payload.chunks(777) {
            fill.extend(piece);
        }
        let blocks = fill.encode(&codec);
        assert_eq!(blocks, codec.encode(Bytes::from(payload.clone())));
        // While a block is alive the buffer is not handed out again.
        let kept = blocks[5].clone();
        drop(blocks);
        let other = buffers.take();
        assert_ne!(
            other.as_ref().as_ptr(),
            kept.as_ptr().wrapping_sub(5 * block)
        );
        drop(other);
        drop(kept);
        // A body of unknown length that ends inside a full-size stripe, in
        // a reused buffer full of stale bytes: blocks of ceil(2501 / 4),
        // the padding zeroed.
        let mut stale = buffers.take();
        stale.as_mut_slice().fill(0xEE);
        let stale_at = stale.as_ref().as_ptr();
        drop(stale);
        let mut fill = Fill::new(&buffers, k, block, k * block);
        match &fill.buf {
            FillBuffer::Full(b) => assert_eq!(b.as_ref().as_ptr(), stale_at, "the stale buffer"),
            FillBuffer::Short(_) => panic!("a full-size stripe gets a reused buffer"),
        }
        fill.extend(&payload[..2501]);
        let blocks = fill.encode(&codec);
        assert!(blocks.iter().all(|b| b.len() == 626));
        assert_eq!(blocks[3][625], 0, "padding");
        assert_eq!(
            blocks,
            codec.encode(Bytes::copy_from_slice(&payload[..2501]))
        );
    }

    #[test]
    fn short_stripes_are_padded_in_place() {
        let mut buf = BytesMut::with_capacity(4 * 3);
        buf.extend_from_slice(b"1234567");
        let ptr = buf.as_ptr();
        let s = padded(buf, 4);
        assert_eq!(&s[..], b"1234567\0");
        assert_eq!(s.as_ptr(), ptr, "no reallocation");
    }
}
