//! GetShard answered with hand-framed gRPC responses: each block read from
//! disk goes to HTTP/2 as three data frames (the message's prefix and
//! protobuf keys, the block's own bytes, its CRC field; see
//! [`sluice_proto::framing`]) instead of being copied into tonic's encode
//! buffer. The bytes on the wire are the ones tonic would send, so
//! gateways decode them with the generated client.
//!
//! Under a GetObject load tonic's encode path was a large share of the
//! datanode's CPU, most of it growing its buffer (realloc copies and page
//! faults of fresh mappings) and the copy itself (see bench/RESULTS.md).
//!
//! [`DatanodeRoutes`] sits where the generated `DatanodeServer` did, behind
//! the same layers (mutual-TLS authorization, connection limits); every
//! other method goes to the generated server. The request is the usual
//! single gRPC message (at most [`MAX_GET_SHARD_REQUEST_BYTES`]); errors
//! before the first block are a trailers-only response, errors after it
//! (bitrot, shutdown) the stream's trailers, as tonic sends them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use http_body::Frame;
use http_body_util::{BodyExt as _, Limited, StreamBody};
use prost::Message as _;
use sluice_proto::datanode::GetShardRequest;
use sluice_proto::datanode::datanode_server::DatanodeServer;
use sluice_proto::framing::{GET_SHARD_PATH, GET_SHARD_RESPONSE_BLOCK_FIELD, block_message};
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, StdError};
use tonic::server::NamedService;

use crate::service::{DatanodeService, ShardBlocks};
use crate::store::ShardStore;

/// Largest GetShard request body accepted (a blob id, an index and two
/// counts take well under 1 KiB).
pub const MAX_GET_SHARD_REQUEST_BYTES: usize = 64 * 1024;

/// The datanode's gRPC routes: GetShard framed by hand, the rest by the
/// generated server.
#[derive(Clone)]
pub(crate) struct DatanodeRoutes<S> {
    grpc: DatanodeServer<DatanodeService<S>>,
    service: DatanodeService<S>,
}

impl<S: ShardStore> DatanodeRoutes<S> {
    pub(crate) fn new(
        grpc: DatanodeServer<DatanodeService<S>>,
        service: DatanodeService<S>,
    ) -> Self {
        DatanodeRoutes { grpc, service }
    }
}

impl<S: ShardStore> NamedService for DatanodeRoutes<S> {
    const NAME: &'static str = <DatanodeServer<DatanodeService<S>> as NamedService>::NAME;
}

impl<S, B> Service<http::Request<B>> for DatanodeRoutes<S>
where
    S: ShardStore,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != GET_SHARD_PATH {
            return self.grpc.call(req);
        }
        let service = self.service.clone();
        Box::pin(async move {
            Ok(match get_shard(&service, req).await {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// One GetShard call: decode the request, open the blocks, answer with the
/// framed stream.
async fn get_shard<S: ShardStore, B>(
    service: &DatanodeService<S>,
    req: http::Request<B>,
) -> Result<http::Response<tonic::body::Body>, Status>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError>,
{
    let body = Limited::new(req.into_body(), MAX_GET_SHARD_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|e| Status::invalid_argument(format!("GetShard request body: {e}")))?
        .to_bytes();
    let request = decode_request(&body)?;
    let blocks = service.shard_blocks(request).await?;
    let body = StreamBody::new(frames(blocks));
    http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(tonic::body::Body::new(body))
        .map_err(|e| Status::internal(format!("GetShard response: {e}")))
}

/// The one length-prefixed, uncompressed `GetShardRequest` of a request body.
fn decode_request(body: &[u8]) -> Result<GetShardRequest, Status> {
    let Some((prefix, message)) = body.split_first_chunk::<5>() else {
        return Err(Status::invalid_argument(
            "GetShard request shorter than a gRPC message prefix",
        ));
    };
    if prefix[0] != 0 {
        return Err(Status::unimplemented(
            "compressed GetShard requests are not accepted",
        ));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len != message.len() {
        return Err(Status::invalid_argument(format!(
            "GetShard request body holds {} bytes after its prefix, which names {len}",
            message.len()
        )));
    }
    GetShardRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("GetShard request: {e}")))
}

/// The response body: each block as its framed message, then the trailers
/// (`grpc-status` 0 at the end, or the error that ended the stream).
fn frames(
    blocks: ShardBlocks,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
    struct State {
        blocks: ShardBlocks,
        /// Frames of the current message not yet yielded (at most two).
        queued: VecDeque<Bytes>,
        /// The trailers were yielded: end the body next.
        ended: bool,
    }
    let state = State {
        blocks,
        queued: VecDeque::with_capacity(2),
        ended: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        if let Some(bytes) = state.queued.pop_front() {
            return Some((Ok(Frame::data(bytes)), state));
        }
        if state.ended {
            return None;
        }
        let frame = match state.blocks.next().await {
            Some(Ok(block)) => {
                let (head, tail) =
                    block_message(GET_SHARD_RESPONSE_BLOCK_FIELD, &block.data, block.crc32c);
                state
                    .queued
                    .extend([block.data, tail].into_iter().filter(|b| !b.is_empty()));
                Frame::data(head)
            }
            Some(Err(status)) => {
                state.ended = true;
                Frame::trailers(trailers(&status))
            }
            None => {
                state.ended = true;
                Frame::trailers(trailers(&Status::ok("")))
            }
        };
        Some((Ok(frame), state))
    })
}

/// `grpc-status` and `grpc-message` of `status`, as trailers.
fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // A message that cannot be a header value: the code alone.
        map.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Block;
    use sluice_proto::framing::grpc_message;
    use tokio::sync::mpsc;

    #[test]
    fn a_request_is_one_uncompressed_message() {
        let req = GetShardRequest {
            blob_id: "b".into(),
            shard_index: 3,
            first_block: 2,
            block_count: 7,
        };
        let framed = grpc_message(&req);
        assert_eq!(decode_request(&framed).unwrap(), req);
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(
            decode_request(&compressed).unwrap_err().code(),
            tonic::Code::Unimplemented
        );
        let mut longer = framed.to_vec();
        longer.push(0);
        assert_eq!(
            decode_request(&longer).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            decode_request(&framed[..4]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn blocks_then_the_status_as_trailers() {
        let (tx, rx) = mpsc::channel(4);
        let data = Bytes::from_static(b"0123456789");
        tx.send(Ok(Block {
            data: data.clone(),
            crc32c: 5,
        }))
        .await
        .unwrap();
        tx.send(Err(Status::data_loss("bitrot"))).await.unwrap();
        drop(tx);
        let got: Vec<Frame<Bytes>> = frames(ShardBlocks::new(rx, None))
            .map(|f| f.unwrap())
            .collect()
            .await;
        assert_eq!(got.len(), 4, "prefix, data, crc, trailers");
        let mut wire = Vec::new();
        for f in &got[..3] {
            wire.extend_from_slice(f.data_ref().unwrap());
        }
        let expected = grpc_message(&sluice_proto::datanode::GetShardResponse {
            block: Some(sluice_proto::datanode::ShardBlock { data, crc32c: 5 }),
        });
        assert_eq!(wire, expected.to_vec());
        let t = got[3].trailers_ref().unwrap();
        assert_eq!(t["grpc-status"], "15");
        assert_eq!(t["grpc-message"], "bitrot");
    }

    #[tokio::test]
    async fn a_stream_that_ends_sends_status_ok() {
        let (tx, rx) = mpsc::channel::<Result<Block, Status>>(1);
        drop(tx);
        let got: Vec<Frame<Bytes>> = frames(ShardBlocks::new(rx, None))
            .map(|f| f.unwrap())
            .collect()
            .await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].trailers_ref().unwrap()["grpc-status"], "0");
    }
}
