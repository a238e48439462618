//! One `GetShard` call, its response decoded by hand: each block's data is
//! handed on as the slices of the HTTP/2 data frames that carried it
//! ([`BlockDecoder`]), where tonic's decoder would copy every frame into a
//! per-stream buffer and allocate a block-sized one for each message. The
//! request is the one message tonic would send; statuses come from the
//! trailers (or a trailers-only answer's headers) as tonic reads them.
//! Protocol: <https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>.

use http_body_util::BodyExt as _;
use sluice_proto::datanode::GetShardRequest;
use sluice_proto::framing::{
    BlockChunks, BlockDecoder, GET_SHARD_PATH, GET_SHARD_RESPONSE_BLOCK_FIELD, grpc_message,
};
use sluice_proto::shard::MAX_MESSAGE_BYTES;
use tonic::Status;
use tonic::transport::Channel;
use tower::Service as _;
use tower::ServiceExt as _;

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
    mut channel: Channel,
    req: &GetShardRequest,
) -> Result<ShardStream, Status> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(GET_SHARD_PATH)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            grpc_message(req),
        )))
        .map_err(|e| Status::internal(format!("GetShard request: {e}")))?;
    let response = channel
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("datanode channel not ready: {e}")))?
        .call(request)
        .await
        .map_err(|e| Status::unavailable(format!("GetShard: {e}")))?;
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != tonic::Code::Ok
    {
        return Err(status);
    }
    if response.status() != http::StatusCode::OK {
        return Err(Status::internal(format!(
            "GetShard answered HTTP {}",
            response.status()
        )));
    }
    Ok(ShardStream {
        body: response.into_body(),
        decoder: BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, MAX_MESSAGE_BYTES),
        ended: false,
    })
}

impl ShardStream {
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
