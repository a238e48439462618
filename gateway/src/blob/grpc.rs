//! A gRPC call to a datanode with a request body built by hand (the shard
//! paths, whose messages are framed around the blocks instead of copied by
//! tonic's encoder): the request tonic would send, and the answer's
//! trailers-only status checked. Protocol:
//! <https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>.

use tonic::Status;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::Service as _;
use tower::ServiceExt as _;

/// POSTs `body` to `path` over `channel` and returns the response, unless
/// it is a trailers-only answer with an error status, which is returned as
/// the error (as are transport failures). `rpc` names the call in errors.
pub(super) async fn call(
    mut channel: Channel,
    path: &'static str,
    body: Body,
    rpc: &str,
) -> Result<http::Response<Body>, Status> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(body)
        .map_err(|e| Status::internal(format!("{rpc} request: {e}")))?;
    let response = channel
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("datanode channel not ready: {e}")))?
        .call(request)
        .await
        .map_err(|e| Status::unavailable(format!("{rpc}: {e}")))?;
    // A trailers-only answer carries its status in the headers.
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != tonic::Code::Ok
    {
        return Err(status);
    }
    Ok(response)
}
