//! One `GetShard` call, its response decoded by hand: each block's data is
//! handed on as the slices of the HTTP/2 data frames that carried it
//! ([`BlockDecoder`]), where tonic's decoder would copy every frame into a
//! per-stream buffer and allocate a block-sized one for each message. The
//! request is the one message tonic would send ([`grpc::call`]); statuses
//! come from the trailers (or a trailers-only answer's headers) as tonic
//! reads them.

use http_body_util::BodyExt as _;
use sluice_proto::datanode::GetShardRequest;
use sluice_proto::framing::{
    BlockChunks, BlockDecoder, GET_SHARD_PATH, GET_SHARD_RESPONSE_BLOCK_FIELD, grpc_message,
};
use sluice_proto::shard::MAX_MESSAGE_BYTES;
use tonic::Status;
use tonic::transport::Channel;

use super::grpc;

/// The blocks of one `GetShard` response, in order.
pub(super) struct ShardStream {
    body: tonic::body::Body,
    decoder: BlockDecoder,
    /// The trailers were read (or the body ended).
    ended: bool,
}

/// Opens a `GetShard` call over `channel`; errors are the call's status
/// (a trailers-only answer: `NOT_FOUND`, busy, …) or the transport's.
pub(super) async fn get_shard(
    channel: Channel,
    req: &GetShardRequest,
) -> Result<ShardStream, Status> {
    let body = tonic::body::Body::new(http_body_util::Full::new(grpc_message(req)));
    let response = grpc::call(channel, GET_SHARD_PATH, body, "GetShard").await?;
    // A trailers-only answer (its status OK: grpc::call returned the
    // others) has no blocks.
    let trailers_only = response.headers().contains_key("grpc-status");
    if response.status() != http::StatusCode::OK {
        return Err(Status::unavailable(format!(
            "GetShard answered HTTP {} without a gRPC status",
            response.status()
        )));
    }
    let mut stream = ShardStream::new(response.into_body());
    stream.ended = trailers_only;
    Ok(stream)
}

impl ShardStream {
    /// The blocks of a response `body` (status OK, not trailers-only).
    fn new(body: tonic::body::Body) -> Self {
        ShardStream {
            body,
            decoder: BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, MAX_MESSAGE_BYTES),
            ended: false,
        }
    }

    /// The next block, `None` after the last one (the stream ended with
    /// status OK); the status the datanode ended the stream with, or what
    /// went wrong with the body, as an error.
    pub(super) async fn message(&mut self) -> Result<Option<BlockChunks>, Status> {
        loop {
            if let Some(block) = self
                .decoder
                .next_block()
                .map_err(|e| Status::internal(format!("GetShard response: {e}")))?
            {
                return Ok(Some(block));
            }
            if self.ended {
                return Ok(None);
            }
            let frame = match self.body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(status)) => return Err(status),
                None => {
                    self.ended = true;
                    return Err(Status::internal("GetShard response ended without trailers"));
                }
            };
            let trailers = match frame.into_data() {
                Ok(data) => {
                    self.decoder.push(data);
                    continue;
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => trailers,
                    Err(_) => continue,
                },
            };
            self.ended = true;
            match Status::from_header_map(&trailers) {
                Some(status) if status.code() != tonic::Code::Ok => return Err(status),
                Some(_) => {}
                None => return Err(Status::internal("GetShard trailers without grpc-status")),
            }
            if self.decoder.buffered() > 0 {
                return Err(Status::internal(format!(
                    "GetShard response ended inside a message ({} bytes of it)",
                    self.decoder.buffered()
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hyper::body::Frame;
    use sluice_proto::datanode::{GetShardResponse, ShardBlock};
    use tonic::Code;

    fn message(data: &'static [u8], crc32c: u32) -> Bytes {
        grpc_message(&GetShardResponse {
            block: Some(ShardBlock {
                data: Bytes::from_static(data),
                crc32c,
            }),
        })
    }

    fn trailers(status: Option<Status>) -> Frame<Bytes> {
        let mut map = http::HeaderMap::new();
        if let Some(status) = status {
            status.add_header(&mut map).unwrap();
        }
        Frame::trailers(map)
    }

    /// A stream over a body of `frames`.
    fn stream(frames: Vec<Frame<Bytes>>) -> ShardStream {
        let body = http_body_util::StreamBody::new(futures::stream::iter(
            frames.into_iter().map(Ok::<_, Status>),
        ));
        ShardStream::new(tonic::body::Body::new(body))
    }

    #[tokio::test]
    async fn blocks_then_the_end_the_trailers_name() {
        let two = [message(b"first", 1), message(b"second", 2)].concat();
        let (a, b) = two.split_at(7);
        let mut s = stream(vec![
            Frame::data(Bytes::copy_from_slice(a)),
            Frame::data(Bytes::copy_from_slice(b)),
            trailers(Some(Status::ok(""))),
        ]);
        let first = s.message().await.unwrap().unwrap();
        assert_eq!((first.data.concat(), first.crc32c), (b"first".to_vec(), 1));
        let second = s.message().await.unwrap().unwrap();
        assert_eq!(
            (second.data.concat(), second.crc32c),
            (b"second".to_vec(), 2)
        );
        assert!(s.message().await.unwrap().is_none());
        assert!(s.message().await.unwrap().is_none(), "stays ended");
    }

    #[tokio::test]
    async fn error_trailers_and_broken_bodies_are_errors() {
        // The datanode's bitrot answer after one good block.
        let mut s = stream(vec![
            Frame::data(message(b"ok", 3)),
            trailers(Some(Status::data_loss("block 1: checksum mismatch"))),
        ]);
        assert!(s.message().await.unwrap().is_some());
        let err = s.message().await.unwrap_err();
        assert_eq!(err.code(), Code::DataLoss);
        assert_eq!(err.message(), "block 1: checksum mismatch");

        // OK trailers after part of a message: the stream ended early.
        let whole = message(b"cut short", 4);
        let mut s = stream(vec![
            Frame::data(whole.slice(..whole.len() - 2)),
            trailers(Some(Status::ok(""))),
        ]);
        let err = s.message().await.unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(
            err.message().contains("inside a message"),
            "{}",
            err.message()
        );

        // Trailers without grpc-status, and no trailers at all.
        let mut s = stream(vec![Frame::data(message(b"x", 5)), trailers(None)]);
        assert!(s.message().await.unwrap().is_some());
        assert_eq!(s.message().await.unwrap_err().code(), Code::Internal);
        let mut s = stream(vec![Frame::data(message(b"x", 5))]);
        assert!(s.message().await.unwrap().is_some());
        let err = s.message().await.unwrap_err();
        assert!(
            err.message().contains("without trailers"),
            "{}",
            err.message()
        );

        // A compressed message is refused, not misread.
        let mut compressed = message(b"z", 6).to_vec();
        compressed[0] = 1;
        let mut s = stream(vec![
            Frame::data(compressed.into()),
            trailers(Some(Status::ok(""))),
        ]);
        assert_eq!(s.message().await.unwrap_err().code(), Code::Internal);
    }
}
