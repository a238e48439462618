//! One `PutShard` call, framed by hand: what the write path puts into a
//! shard's channel ([`Frame`]), the request body that turns those frames
//! into gRPC messages on HTTP/2 data frames, debiting the datanode's credit
//! before each block ([`shard_requests`]), and the call itself
//! ([`put_shard`]). The write path's decisions (which shards are alive,
//! when the write is acknowledged) live in `write.rs`; the message layout
//! and the path live in [`sluice_proto::framing`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{PutShardRequest, PutShardResponse, ShardEnd, ShardHeader};
use sluice_proto::framing::{
    PUT_SHARD_PATH, PUT_SHARD_REQUEST_BLOCK_FIELD, block_message, grpc_message,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::codec::Codec as _;
use tonic::transport::Channel;

use crate::admission::{BufferPermit, held};
use crate::credit::{CreditError, NodeCredit};
use crate::datanodes::MAX_MESSAGE_BYTES;

/// What the write path puts into a shard's channel.
#[derive(Debug)]
pub(super) enum Frame {
    Header(ShardHeader),
    Block {
        data: Bytes,
        crc32c: u32,
        /// The stripe's buffer permit, shared by its k+m blocks.
        stripe: Arc<BufferPermit>,
    },
    /// The shard is complete: send `ShardEnd`, then end the stream.
    End,
}

/// Why a shard's request stream gave up (read by the RPC task).
#[derive(Debug, Default)]
pub(super) struct StreamFailure {
    reason: std::sync::Mutex<Option<CreditError>>,
    /// Whether the stream is waiting for credit right now.
    pub(super) awaiting_credit: std::sync::atomic::AtomicBool,
    /// Cancelled when `reason` is set.
    pub(super) token: CancellationToken,
}

impl StreamFailure {
    pub(super) fn set(&self, e: CreditError) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        self.token.cancel();
    }

    pub(super) fn get(&self) -> Option<CreditError> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The request body of one `PutShard` RPC, as HTTP/2 data frames.
///
/// Takes the channel's frames; before a block it debits the block's length
/// from the datanode's credit (waiting at most `first_stall` for the
/// first block's, `stall` for each later one's), then yields the block's gRPC message as
/// three frames (prefix, the block itself, [`held`] with its stripe's
/// permit, suffix). On
/// [`Frame::End`] it yields the `ShardEnd` message (the blocks and bytes it
/// yielded) and ends; never otherwise. If every sender is dropped without
/// `End`, or credit does not come within `stall`, it stays pending forever
/// instead of ending (the RPC is then reset when its task is aborted or
/// gives up), and the datanode discards the partial shard.
pub(super) fn shard_requests(
    rx: mpsc::Receiver<Frame>,
    credit: Option<Arc<NodeCredit>>,
    first_stall: Duration,
    stall: Duration,
    failure: Arc<StreamFailure>,
) -> impl Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> + Send + 'static {
    struct State {
        rx: mpsc::Receiver<Frame>,
        credit: Option<Arc<NodeCredit>>,
        /// How long the next debit may wait.
        wait: Duration,
        stall: Duration,
        failure: Arc<StreamFailure>,
        /// Frames of the current message not yet yielded (at most two).
        queued: VecDeque<Bytes>,
        /// Blocks and payload bytes yielded, for the end message.
        blocks: u64,
        bytes: u64,
        /// The end message was yielded: end the stream next.
        ended: bool,
    }
    let state = State {
        rx,
        credit,
        wait: first_stall,
        stall,
        failure,
        queued: VecDeque::with_capacity(2),
        blocks: 0,
        bytes: 0,
        ended: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if let Some(bytes) = s.queued.pop_front() {
            return Some((Ok(hyper::body::Frame::data(bytes)), s));
        }
        if s.ended {
            return None;
        }
        let first = match s.rx.recv().await {
            Some(Frame::Header(h)) => grpc_message(&PutShardRequest {
                msg: Some(Msg::Header(h)),
            }),
            Some(Frame::Block {
                data,
                crc32c,
                stripe,
            }) => {
                let debit = match &s.credit {
                    Some(credit) => {
                        s.failure.awaiting_credit.store(true, Ordering::Relaxed);
                        let debit = credit.debit(data.len() as u64, s.wait).await;
                        s.wait = s.stall;
                        s.failure.awaiting_credit.store(false, Ordering::Relaxed);
                        debit
                    }
                    None => Ok(()),
                };
                if let Err(e) = debit {
                    s.failure.set(e);
                    // Release this block, the blocks still queued and their
                    // permits now: HTTP/2 may keep this body until the
                    // stream is reset, which is not ours to time.
                    drop((data, stripe, s));
                    return std::future::pending().await;
                }
                s.blocks += 1;
                s.bytes += data.len() as u64;
                let (head, tail) = block_message(PUT_SHARD_REQUEST_BLOCK_FIELD, &data, crc32c);
                if !data.is_empty() {
                    s.queued.push_back(held(data, &stripe));
                }
                if !tail.is_empty() {
                    s.queued.push_back(tail);
                }
                head
            }
            Some(Frame::End) => {
                s.ended = true;
                grpc_message(&PutShardRequest {
                    msg: Some(Msg::End(ShardEnd {
                        blocks: s.blocks,
                        bytes: s.bytes,
                    })),
                })
            }
            // Abandoned: never signal a clean end of stream.
            None => {
                drop(s);
                return std::future::pending().await;
            }
        };
        Some((Ok(hyper::body::Frame::data(first)), s))
    })
}

/// One `PutShard` call over `channel` with `body` (from [`shard_requests`])
/// as its request body. The request is built here rather than by tonic's
/// client because tonic copies every message into a per-stream encode
/// buffer that keeps a block-sized allocation for the life of the stream
/// (a large share of the gateway's RSS with many streams open); this
/// body hands the blocks themselves to HTTP/2. The response is decoded by
/// tonic as usual.
pub(super) async fn put_shard<S>(
    channel: Channel,
    body: S,
) -> Result<PutShardResponse, tonic::Status>
where
    S: Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> + Send + 'static,
{
    let body = tonic::body::Body::new(http_body_util::StreamBody::new(body));
    let response = super::grpc::call(channel, PUT_SHARD_PATH, body, "PutShard").await?;
    let status_code = response.status();
    let decoder = tonic_prost::ProstCodec::<PutShardRequest, PutShardResponse>::default().decoder();
    let mut messages = tonic::codec::Streaming::new_response(
        decoder,
        response.into_body(),
        status_code,
        None,
        Some(MAX_MESSAGE_BYTES),
    );
    let message = messages
        .message()
        .await?
        .ok_or_else(|| tonic::Status::internal("Missing response message."))?;
    messages.trailers().await?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use sluice_proto::datanode::ShardBlock;

    #[tokio::test]
    async fn a_blocks_permit_lives_until_the_transport_drops_the_block() {
        use futures::StreamExt as _;
        let stats = crate::admission::GatewayStats::new();
        let budget = crate::admission::BufferBudget::new(
            crate::admission::BudgetKind::Write,
            1024,
            stats.clone(),
        );
        let permit = Arc::new(budget.try_acquire(600).expect("permit"));
        let (tx, rx) = mpsc::channel(4);
        let data = Bytes::from(vec![7u8; 500]);
        tx.send(Frame::Block {
            data: data.slice(..250),
            crc32c: 5,
            stripe: Arc::clone(&permit),
        })
        .await
        .unwrap();
        tx.send(Frame::End).await.unwrap();
        drop(permit);
        let failure = Arc::new(StreamFailure::default());
        let frames: Vec<Bytes> = shard_requests(
            rx,
            None,
            Duration::from_secs(1),
            Duration::from_secs(1),
            failure,
        )
        .map(|f| f.unwrap().into_data().expect("data frame"))
        .collect()
        .await;
        assert_eq!(frames.len(), 4, "prefix, block, suffix, end message");
        assert_eq!(
            PutShardRequest::decode(&frames[3][5..]).expect("end message"),
            PutShardRequest {
                msg: Some(Msg::End(ShardEnd {
                    blocks: 1,
                    bytes: 250
                }))
            }
        );
        assert_eq!(frames[1], data.slice(..250));
        assert_eq!(
            budget.available(),
            1024 - 600,
            "held while the block is queued"
        );
        let wire: Vec<u8> = frames[..3].iter().flat_map(|b| b.to_vec()).collect();
        let decoded = PutShardRequest::decode(&wire[5..]).expect("decode");
        assert!(matches!(
            decoded.msg,
            Some(Msg::Block(ShardBlock { crc32c: 5, .. }))
        ));
        drop(frames);
        assert_eq!(
            budget.available(),
            1024,
            "released when the block is dropped"
        );
    }
}
