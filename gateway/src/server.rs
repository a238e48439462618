//! Serving S3 over HTTP: [`run`] starts the data path, builds the s3s
//! service ([`s3_service`]) and serves it with hyper (HTTP/1.1 and h2c)
//! until `shutdown` resolves.
//!
//! Every response carries `x-amz-request-id`; every S3 error body gets the
//! `Resource` and `RequestId` elements s3s does not write, so errors raised
//! by s3s itself (authentication, routing) look like ours.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use s3s::auth::SimpleAuth;
use s3s::config::{S3Config, StaticConfigProvider};
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{HttpError, HttpResponse, S3ErrorCode};
use sluice_meta::MetaClient;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::blob::{BlobError, BlobStore, BlobStoreConfig};
use crate::config::{Config, ConfigError};
use crate::s3::Gateway;
use crate::s3::bucket::BucketNameRules;
use crate::s3::error::standard_message;

/// Largest XML request body s3s buffers (CompleteMultipartUpload of 10000
/// parts, DeleteObjects of 1000 keys), in bytes.
const XML_MAX_BODY: usize = 4 * 1024 * 1024;

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid gateway configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("starting the data path: {0}")]
    BlobStore(#[source] BlobError),
}

/// The id of one S3 request, as sent in `x-amz-request-id` and error
/// bodies; also put in the request's extensions for handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

impl RequestId {
    fn new() -> Self {
        RequestId(format!("{:016X}", rand::random::<u64>()))
    }
}

/// The gateway's HTTP service: the s3s service plus request ids and
/// complete error bodies. Cheap to clone.
#[derive(Clone)]
pub struct SluiceService {
    inner: S3Service,
}

/// Builds the S3 service for `gateway`: SigV4 (header, presigned and
/// aws-chunked) with the configured key pair, Sluice's bucket-name rules.
pub fn s3_service(gateway: Gateway, access_key: &str, secret_key: &str) -> SluiceService {
    let mut builder = S3ServiceBuilder::new(gateway);
    builder.set_auth(SimpleAuth::from_single(access_key, secret_key));
    builder.set_validation(BucketNameRules);
    let mut s3_config = S3Config::default();
    s3_config.xml_max_body_size = XML_MAX_BODY;
    // PostObject is not served; s3s would buffer the whole file first.
    s3_config.post_object_max_file_size = 0;
    builder.set_config(Arc::new(StaticConfigProvider::new(Arc::new(s3_config))));
    SluiceService {
        inner: builder.build(),
    }
}

impl SluiceService {
    /// Serves one request (any body type s3s accepts).
    pub async fn call(&self, req: Request<s3s::Body>) -> Result<HttpResponse, HttpError> {
        let request_id = RequestId::new();
        let resource = req.uri().path().to_string();
        let span = tracing::info_span!("s3", request_id = %request_id.0, method = %req.method(), path = %resource);
        let mut req = req;
        req.extensions_mut().insert(request_id.clone());
        let mut resp = self.inner.call(req).instrument(span.clone()).await?;
        finish_response(&mut resp, &request_id.0, &resource);
        let status = resp.status();
        if status.is_server_error() {
            span.in_scope(|| tracing::warn!(%status, "request failed"));
        }
        Ok(resp)
    }
}

impl hyper::service::Service<Request<Incoming>> for SluiceService {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = BoxFuture<'static, Result<HttpResponse, HttpError>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move { service.call(req.map(s3s::Body::from)).await })
    }
}

/// Adds `x-amz-request-id`, completes error bodies with `Resource` and
/// `RequestId`, and strips the body of a 304.
fn finish_response(resp: &mut HttpResponse, request_id: &str, resource: &str) {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-amz-request-id", v);
    }
    let status = resp.status();
    if status == StatusCode::NOT_MODIFIED {
        *resp.body_mut() = s3s::Body::empty();
        resp.headers_mut().remove(http::header::CONTENT_TYPE);
        return;
    }
    if !(status.is_client_error() || status.is_server_error()) {
        return;
    }
    let Some(body) = resp.body_mut().take_bytes() else {
        return;
    };
    let body = complete_error_body(&body, request_id, resource).unwrap_or(body);
    *resp.body_mut() = s3s::Body::from(body);
}

/// Inserts `<Resource>` and `<RequestId>` before `</Error>` of an S3 error
/// body that lacks them, and S3's standard `<Message>` after `</Code>` when
/// there is none; `None` when `body` is not such a body.
fn complete_error_body(body: &[u8], request_id: &str, resource: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    let mut at = text.rfind("</Error>")?;
    if !text.contains("<Error>") {
        return None;
    }
    let mut text = text.to_string();
    if !text.contains("<Message>")
        && let (Some(start), Some(end)) = (text.find("<Code>"), text.find("</Code>"))
        && let Some(code) = text.get(start + "<Code>".len()..end)
        && let Some(message) = standard_message(
            &code
                .parse::<S3ErrorCode>()
                .unwrap_or(S3ErrorCode::InternalError),
        )
    {
        let element = format!("<Message>{}</Message>", xml_escape(message));
        text.insert_str(end + "</Code>".len(), &element);
        at += element.len();
    }
    let mut extra = String::new();
    if !text.contains("<Resource>") {
        extra.push_str(&format!("<Resource>{}</Resource>", xml_escape(resource)));
    }
    if !text.contains("<RequestId>") {
        extra.push_str(&format!(
            "<RequestId>{}</RequestId>",
            xml_escape(request_id)
        ));
    }
    let mut out = String::with_capacity(text.len() + extra.len());
    out.push_str(&text[..at]);
    out.push_str(&extra);
    out.push_str(&text[at..]);
    Some(Bytes::from(out))
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Runs a gateway on `listener` until `shutdown` resolves: connects to meta,
/// starts the data path, serves S3, then stops accepting, lets open
/// requests finish (up to `shutdown_grace`), waits for background blob
/// deletions and stops the data path.
///
/// Errors: an invalid `config`, or a data path that cannot start.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let meta = MetaClient::new(config.meta_endpoints.clone());
    let blob_config = BlobStoreConfig {
        data_shards: config.data_shards as usize,
        parity_shards: config.parity_shards as usize,
        block_size: config.block_size as usize,
        write_quorum: config.effective_write_quorum() as usize,
        datanode_refresh_interval: config.datanode_refresh_interval,
        shard_channel_depth: config.shard_channel_depth,
    };
    let blobs = BlobStore::start(blob_config, meta.clone())
        .await
        .map_err(Error::BlobStore)?;
    let gateway = Gateway::new(
        meta,
        blobs.clone(),
        config.region.clone(),
        config.max_background_deletes,
    );
    let service = s3_service(gateway.clone(), &config.access_key, &config.secret_key);
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, region = %config.region, "S3 gateway listening"),
        Err(e) => tracing::warn!(error = %e, "S3 gateway listening on an unknown address"),
    }
    serve(
        listener,
        service,
        shutdown,
        config.max_connections,
        config.shutdown_grace,
    )
    .await;
    gateway.drain().await;
    blobs.stop();
    tracing::info!("S3 gateway stopped");
    Ok(())
}

/// Accepts connections until `shutdown`, at most `max_connections` at once,
/// then shuts every connection down gracefully, aborting those still open
/// after `grace`.
async fn serve(
    listener: TcpListener,
    service: SluiceService,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_connections: usize,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections: JoinSet<()> = JoinSet::new();
    tokio::pin!(shutdown);

    loop {
        while connections.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an S3 connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "setting TCP_NODELAY");
        }
        let conn = builder
            .serve_connection(TokioIo::new(stream), service.clone())
            .into_owned();
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            let _slot = slot;
            tokio::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "S3 connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }

    drop(listener);
    let _ = stop_tx.send(true);
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, "waiting for S3 connections to finish");
    }
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "aborting S3 connections still open after the grace period"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_get_resource_and_request_id() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>m</Message></Error>"#;
        let out = complete_error_body(body, "ABCDEF0123456789", "/bucket/a&b").expect("error body");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>m</Message><Resource>/bucket/a&amp;b</Resource><RequestId>ABCDEF0123456789</RequestId></Error>"#
        );
        assert!(complete_error_body(b"not xml", "id", "/").is_none());
        let bare = br#"<Error><Code>InvalidBucketName</Code></Error>"#;
        let out = complete_error_body(bare, "id", "/ab").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<Error><Code>InvalidBucketName</Code><Message>The specified bucket is not valid.</Message><Resource>/ab</Resource><RequestId>id</RequestId></Error>"
        );
        let with_id = br#"<Error><Code>X</Code><RequestId>mine</RequestId></Error>"#;
        let out = complete_error_body(with_id, "id", "/r").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<Error><Code>X</Code><RequestId>mine</RequestId><Resource>/r</Resource></Error>"
        );
    }

    #[test]
    fn responses_carry_request_ids_and_304s_have_no_body() {
        let mut resp = HttpResponse::new(s3s::Body::from(Bytes::from_static(
            b"<Error><Code>NotModified</Code></Error>",
        )));
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        finish_response(&mut resp, "RID", "/b/k");
        assert_eq!(resp.headers().get("x-amz-request-id").unwrap(), "RID");
        assert_eq!(resp.body().bytes(), Some(Bytes::new()));

        let mut resp = HttpResponse::new(s3s::Body::from(Bytes::from_static(
            b"<Error><Code>NoSuchBucket</Code></Error>",
        )));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        finish_response(&mut resp, "RID", "/b");
        let body = resp.body().bytes().unwrap();
        assert!(
            std::str::from_utf8(&body)
                .unwrap()
                .contains("<Resource>/b</Resource><RequestId>RID</RequestId>")
        );
    }

    #[tokio::test]
    async fn anonymous_requests_are_denied_with_a_complete_error_body() {
        // Authentication fails before meta or the data path is touched.
        let meta = MetaClient::new(vec!["http://127.0.0.1:1".into()]);
        let blobs = BlobStore::with_static_datanodes(BlobStoreConfig::default(), Vec::new());
        let service = s3_service(Gateway::new(meta, blobs, "us-east-1".into(), 4), "AK", "SK");
        let req = Request::builder()
            .uri("/bucket/some%20key")
            .header("host", "127.0.0.1:9000")
            .body(s3s::Body::empty())
            .unwrap();
        let resp = service.call(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let id = resp
            .headers()
            .get("x-amz-request-id")
            .expect("request id")
            .to_str()
            .unwrap()
            .to_string();
        let body = resp.body().bytes().expect("buffered error body");
        let body = std::str::from_utf8(&body).unwrap();
        assert!(body.contains("<Code>AccessDenied</Code>"), "{body}");
        assert!(
            body.contains("<Resource>/bucket/some%20key</Resource>"),
            "{body}"
        );
        assert!(
            body.contains(&format!("<RequestId>{id}</RequestId>")),
            "{body}"
        );
    }

    #[test]
    fn request_ids_are_16_hex_digits() {
        let id = RequestId::new().0;
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
