//! Serving S3 over HTTP: [`run`] starts the data path, builds the s3s
//! service ([`s3_service`]) and serves it with hyper (HTTP/1.1 and h2c)
//! until `shutdown` resolves.
//!
//! Every response carries `x-amz-request-id`; every S3 error body gets the
//! `Resource` and `RequestId` elements s3s does not write, so errors raised
//! by s3s itself (authentication, routing) look like ours.
//!
//! Admission happens here, before s3s sees the request: a request past
//! `max_inflight_requests` is answered `503 SlowDown` with `Retry-After: 1`
//! and a complete S3 error body, without a byte of its body being read
//! (see [`crate::admission`]). An admitted request holds its slot until its
//! response body has been sent; its duration is then recorded under its S3
//! operation name (`sluice_gateway_request_duration_seconds{op}`), which an
//! s3s access hook reports back to this layer.
//!
//! # Layout
//!
//! * `server.rs`: [`run`] and the per-request service ([`SluiceService`]:
//!   request ids, precheck, admission, the s3s call, response finishing).
//! * `accept.rs`: the accept loop and connection handling.
//! * `precheck.rs`: requests refused from their head alone ([`precheck`]).
//! * `error_body.rs`: the error bodies written or completed here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use s3s::config::{S3Config, StaticConfigProvider};
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{HttpError, HttpResponse, StdError};
use sluice_meta_client::MetaClient;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::access::{AccessKeys, BucketCache, KeyAccess, KeyAuth, OpName};
use crate::admission::{GatewayStats, InflightGuard, InflightLimiter};
use crate::aws_chunked::{self, Rechunked};
use crate::blob::{BlobError, BlobStore};
use crate::config::{Config, ConfigError, DEFAULT_MAX_INFLIGHT_REQUESTS};
use crate::health::{self, GatewayHealth};
use crate::listener::{
    self, BodyLimits, ChunkCap, ConnActivity, ListenerLimits, MinRateBody, WatchedIo,
};
use crate::metrics::{self, SlowDownReason};
use crate::s3::Gateway;
use crate::s3::bucket::BucketNameRules;
use crate::s3::cors;
use crate::s3::host::RootDomains;
use crate::tls::{S3TlsAcceptor, TlsError};

mod accept;
mod error_body;
mod precheck;

use accept::serve;
use error_body::{error_response, finish_response, inflight_slow_down};
use precheck::has_body;
pub use precheck::{MAX_PRESIGNED_EXPIRES_SECS, precheck};

/// Largest read buffer of an HTTP/1 client connection (bytes). A request
/// body arrives in chunks of at most this size, and a chunk handed to the
/// write path keeps its buffer alive until it has been copied into stripes,
/// so an uploading connection holds at most about twice this outside the
/// buffer budget. (hyper's default, ~400 KiB, held far more over many uploads.)
pub const HTTP1_MAX_BUF_BYTES: usize = 64 * 1024;
/// Memory of each client connection being served outside any budget
/// (bytes): hyper's first read buffer and its response-head buffer, 8 KiB
/// each (hyper 1.x `INIT_BUFFER_SIZE`), allocated for every connection
/// however little it sends. Its task and protocol state are a few KiB more,
/// but pages of those buffers stay untouched: under the soak's overload
/// shape each extra client connection cost the gateway less than this
/// (figures in bench/RESULTS.md). An uploading
/// connection's larger buffer is counted apart (twice
/// [`HTTP1_MAX_BUF_BYTES`]).
pub const CONNECTION_STATE_BYTES: usize = 16 * 1024;
/// HTTP/2 receive window of each client stream (bytes): body bytes a client
/// may send before the gateway reads them.
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// HTTP/2 receive window of each client connection (bytes).
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;
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
    #[error("loading the S3 TLS certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("cluster TLS: {0}")]
    Auth(#[from] sluice_net::AuthError),
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

/// The gateway's HTTP service: admission, the s3s service, request ids and
/// complete error bodies. Cheap to clone.
#[derive(Clone)]
pub struct SluiceService {
    inner: S3Service,
    limiter: Arc<InflightLimiter>,
    body_limits: BodyLimits,
    /// Answers unsigned `GET /health/live|ready` (see [`crate::health`]);
    /// `None`: those paths are ordinary S3 requests.
    health: Option<Arc<GatewayHealth>>,
    /// Bucket settings, for CORS (preflights and response headers).
    buckets: Arc<BucketCache>,
    /// Virtual-hosted-style root domains (none: path style only).
    root_domains: RootDomains,
}

/// Builds the S3 service for `gateway`: SigV4 (header, presigned and
/// aws-chunked) with the configured root key pair plus the access keys
/// stored in meta, per-bucket authorization ([`crate::access`]), Sluice's
/// bucket-name rules, and admission of at most
/// [`DEFAULT_MAX_INFLIGHT_REQUESTS`] requests.
pub fn s3_service(gateway: Gateway, access_key: &str, secret_key: &str) -> SluiceService {
    let keys = AccessKeys::new(access_key, secret_key, Some(gateway.meta.clone()));
    s3_service_with_limiter(
        gateway,
        keys,
        InflightLimiter::new(DEFAULT_MAX_INFLIGHT_REQUESTS, GatewayStats::new()),
    )
}

/// [`s3_service`] authenticating with `keys` and admitting requests
/// through `limiter`.
pub fn s3_service_with_limiter(
    gateway: Gateway,
    keys: Arc<AccessKeys>,
    limiter: Arc<InflightLimiter>,
) -> SluiceService {
    s3_service_with_hosts(gateway, keys, limiter, &[])
}

/// [`s3_service_with_limiter`] also answering virtual-hosted-style requests
/// under `root_domains` ([`RootDomains`]; none: path style only).
pub fn s3_service_with_hosts(
    gateway: Gateway,
    keys: Arc<AccessKeys>,
    limiter: Arc<InflightLimiter>,
    root_domains: &[String],
) -> SluiceService {
    let gateway = gateway.with_root_key_id(keys.root_id());
    let buckets = gateway.bucket_cache();
    let mut builder = S3ServiceBuilder::new(gateway);
    builder.set_auth(KeyAuth(Arc::clone(&keys)));
    builder.set_access(KeyAccess {
        keys,
        buckets: Arc::clone(&buckets),
    });
    builder.set_validation(BucketNameRules);
    let domains = RootDomains::new(root_domains);
    if !root_domains.is_empty() {
        builder.set_host(domains.clone());
    }
    let mut s3_config = S3Config::default();
    s3_config.xml_max_body_size = XML_MAX_BODY;
    // PostObject is not served; s3s would buffer the whole file first.
    s3_config.post_object_max_file_size = 0;
    builder.set_config(Arc::new(StaticConfigProvider::new(Arc::new(s3_config))));
    SluiceService {
        inner: builder.build(),
        limiter,
        body_limits: BodyLimits::default(),
        health: None,
        buckets,
        root_domains: domains,
    }
}

impl SluiceService {
    /// This service with request bodies held to `limits`.
    pub fn with_body_limits(mut self, limits: BodyLimits) -> Self {
        self.body_limits = limits;
        self
    }

    /// This service answering health checks from `health`.
    pub fn with_health(mut self, health: Arc<GatewayHealth>) -> Self {
        self.health = Some(health);
        self
    }

    /// The answer to an unsigned `GET`/`HEAD` of a health path, if `req` is one.
    async fn health_check<B>(&self, req: &Request<B>) -> Option<HttpResponse> {
        let health = self.health.as_ref()?;
        if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) || is_signed(req) {
            return None;
        }
        let answer = match req.uri().path() {
            health::LIVE_PATH => health.live(),
            health::READY_PATH => health.ready().await,
            _ => return None,
        };
        let mut resp = HttpResponse::new(if *req.method() == http::Method::HEAD {
            s3s::Body::empty()
        } else {
            s3s::Body::from(format!("{}\n", answer.reason))
        });
        *resp.status_mut() = answer.status();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Some(resp)
    }

    /// Serves one request (any body type s3s accepts). Past
    /// `max_inflight_requests` it answers `503 SlowDown` at once, without
    /// touching the body.
    pub async fn call(&self, req: Request<s3s::Body>) -> Result<HttpResponse, HttpError> {
        if let Some(resp) = self.health_check(&req).await {
            return Ok(resp);
        }
        let started = Instant::now();
        let request_id = RequestId::new();
        let resource = req.uri().path().to_string();
        if let Some((status, code, message)) = precheck(&req) {
            return Ok(error_response(
                &req,
                status,
                code,
                message,
                &request_id.0,
                &resource,
            ));
        }
        let origin = req
            .headers()
            .get(http::header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .map(str::to_string);
        let bucket = origin
            .as_ref()
            .and_then(|_| request_bucket(&req, &self.root_domains));
        let method = req.method().clone();
        let signed = origin.is_some() && is_signed(&req);
        let Some(admitted) = self.limiter.try_acquire() else {
            metrics::count_slowdown(SlowDownReason::Inflight);
            tracing::debug!(request_id = %request_id.0, method = %req.method(), path = %resource,
                max = self.limiter.max(), "too many requests in flight; answering SlowDown");
            return Ok(inflight_slow_down(&req, &request_id.0, &resource));
        };
        if method == http::Method::OPTIONS {
            // Admitted like any request: a preflight may read meta.
            let resp = self
                .preflight(&req, origin.as_deref(), bucket.as_deref(), &request_id.0)
                .await;
            drop(admitted);
            return Ok(resp);
        }
        let span = tracing::info_span!("s3", request_id = %request_id.0, method = %req.method(), path = %resource);
        let op = OpName::default();
        // A body must keep arriving (`body_timeout`). Unsigned aws-chunked
        // bodies are re-framed into small chunks, or s3s would hold each
        // client-sized chunk (a whole part, for some SDKs) before the write
        // budget is asked for it; signed chunks, which s3s must hold whole,
        // are refused past `max_aws_chunk_bytes`.
        let mut req = if has_body(&req) {
            let limits = self.body_limits;
            let unsigned = aws_chunked::is_unsigned_chunked(req.headers());
            let signed = listener::is_signed_chunked(req.headers());
            req.map(|body| {
                let body = MinRateBody::new(body, limits.body_timeout, limits.body_min_bytes);
                if unsigned {
                    s3s::Body::http_body(Rechunked::new(body))
                } else if signed {
                    s3s::Body::http_body(ChunkCap::new(body, limits.max_aws_chunk_bytes))
                } else {
                    s3s::Body::http_body(body)
                }
            })
        } else {
            req
        };
        req.extensions_mut().insert(request_id.clone());
        req.extensions_mut().insert(op.clone());
        let mut resp = self.inner.call(req).instrument(span.clone()).await?;
        finish_response(&mut resp, &request_id.0, &resource);
        if let (Some(origin), Some(bucket)) = (&origin, &bucket) {
            // Signed requests never see the anonymous missing-bucket cache.
            self.cors_headers(&mut resp, bucket, origin, &method, !signed)
                .await;
        }
        let status = resp.status();
        if status.is_server_error() {
            let op = op.0.get().map_or("Unknown", String::as_str);
            span.in_scope(|| tracing::warn!(%status, op, "request failed"));
        }
        let done = Finished {
            _admitted: admitted,
            op,
            started,
        };
        // A streamed body keeps the request in flight until it is sent.
        if resp.body().bytes().is_none() {
            let body = std::mem::take(resp.body_mut());
            *resp.body_mut() = s3s::Body::http_body(GuardedBody {
                inner: body,
                _guard: done,
            });
        }
        Ok(resp)
    }
}

impl SluiceService {
    /// The answer to a CORS preflight (`OPTIONS` with `Origin`, S3
    /// "OPTIONS object"): 200 with the `Access-Control-*` headers of the
    /// bucket's first matching CORS rule ([`cors::preflight`]); 400
    /// `BadRequest` without `Access-Control-Request-Method`; 403
    /// `AccessDenied` when the bucket has no CORS configuration or no rule
    /// matches; 404 `NoSuchBucket`.
    async fn preflight<B>(
        &self,
        req: &Request<B>,
        origin: Option<&str>,
        bucket: Option<&str>,
        request_id: &str,
    ) -> HttpResponse {
        let resource = req.uri().path();
        let refuse = |status, code, message: &str| {
            error_response(req, status, code, message, request_id, resource)
        };
        let (Some(origin), Some(bucket)) = (origin, bucket) else {
            return refuse(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                "CORSResponse: CORS is not enabled for this bucket.",
            );
        };
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
        };
        let method = header("access-control-request-method");
        if method.is_empty() {
            return refuse(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "Invalid Access-Control-Request-Method: null",
            );
        }
        let view = match self.buckets.get_as(bucket, true).await {
            Ok(Some(view)) => view,
            Ok(None) => {
                return refuse(
                    StatusCode::NOT_FOUND,
                    "NoSuchBucket",
                    "The specified bucket does not exist",
                );
            }
            Err(_) => {
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "The bucket's settings could not be read; please retry.",
                );
            }
        };
        if view.cors.is_empty() {
            return refuse(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                "CORSResponse: CORS is not enabled for this bucket.",
            );
        }
        let requested = header("access-control-request-headers");
        let Some(allowed) = cors::preflight(&view.cors, origin, method, requested) else {
            return refuse(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                cors::PREFLIGHT_DENIED,
            );
        };
        let mut resp = HttpResponse::new(s3s::Body::empty());
        for (name, value) in allowed.headers() {
            resp.headers_mut().insert(name, value);
        }
        if let Ok(id) = HeaderValue::from_str(request_id) {
            resp.headers_mut().insert("x-amz-request-id", id);
        }
        resp
    }

    /// Adds the `Access-Control-*` headers of `bucket`'s first CORS rule
    /// matching `origin` and `method` to the response of an actual
    /// cross-origin request ([`cors::actual`]); nothing when none matches
    /// or the settings cannot be read (the browser then blocks the answer).
    async fn cors_headers(
        &self,
        resp: &mut HttpResponse,
        bucket: &str,
        origin: &str,
        method: &http::Method,
        anonymous: bool,
    ) {
        let Ok(Some(view)) = self.buckets.get_as(bucket, anonymous).await else {
            return;
        };
        if let Some(allowed) = cors::actual(&view.cors, origin, method.as_str()) {
            for (name, value) in allowed.headers() {
                resp.headers_mut().insert(name, value);
            }
        }
    }
}

/// Whether `req` carries a signature: an `Authorization` header or a
/// presigned query (SigV4 `X-Amz-Signature`, SigV2 `Signature`).
fn is_signed<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(http::header::AUTHORIZATION)
        || req
            .uri()
            .query()
            .is_some_and(|q| q.contains("X-Amz-Signature") || q.contains("Signature="))
}

/// The bucket a request addresses: `<bucket>.<root domain>` in `Host`
/// (virtual-hosted style), else the first path segment (path style).
fn request_bucket<B>(req: &Request<B>, domains: &RootDomains) -> Option<String> {
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host());
    if let Some(bucket) = host.and_then(|h| domains.bucket(h)) {
        return Some(bucket.to_ascii_lowercase());
    }
    let first = req.uri().path().trim_start_matches('/').split('/').next()?;
    (!first.is_empty()).then(|| first.to_string())
}

/// Ends an admitted request: frees its slot and records its duration.
struct Finished {
    _admitted: InflightGuard,
    op: OpName,
    started: Instant,
}

impl Drop for Finished {
    fn drop(&mut self) {
        let op = self.op.0.get().map_or("Unknown", String::as_str);
        metrics::record_request(op, self.started.elapsed().as_secs_f64());
    }
}

/// A response body that holds a guard until hyper drops it (sent, or the
/// client went away): the request's [`Finished`] (in flight until a streamed
/// body is sent) or the connection's `ActiveRequest` (a request in
/// progress, for the head and idle timeouts).
struct GuardedBody<G> {
    inner: s3s::Body,
    _guard: G,
}

impl<G: Unpin> hyper::body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, StdError>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
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
    run_with_stats(config, listener, shutdown, GatewayStats::new()).await
}

/// [`run`], counting admission and buffer use in `stats` (tests read its
/// high-water marks; the same numbers go to the Prometheus gauges).
pub async fn run_with_stats(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stats: GatewayStats,
) -> Result<(), Error> {
    config.validate()?;
    let meta = MetaClient::new(config.meta_endpoints.clone());
    run_with_meta(config, listener, shutdown, stats, meta).await
}

/// [`run_with_stats`] with the given `meta` client, used for every meta
/// call (commits, write epochs, heal): tests and chaos runs pass one built
/// with [`sluice_meta_client::client::CallFaults`] to drop or stall responses.
pub async fn run_with_meta(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stats: GatewayStats,
    meta: MetaClient,
) -> Result<(), Error> {
    config.validate()?;
    // The certificate loads before anything starts: a bad file is a
    // startup error, not a gateway that refuses every handshake.
    let tls = match &config.s3_tls {
        Some(t) => Some(S3TlsAcceptor::load(
            &t.cert_file,
            &t.key_file,
            config.http2,
        )?),
        None => {
            tracing::warn!(
                "s3_plaintext = true: S3 is served over plain HTTP; credentials and data cross the network unencrypted"
            );
            None
        }
    };
    let transport = sluice_net::Transport::from_config(
        config.cluster_tls.as_ref(),
        config.insecure_cluster,
        sluice_net::Role::Gateway,
    )?;
    transport.warn_if_insecure("gateway");
    // Meta and the datanodes are dialed with this transport.
    let meta = meta.with_transport(transport);
    metrics::describe();
    let blob_config = config.blob_store_config();
    tracing::info!(
        max_inflight_requests = config.max_inflight_requests,
        buffer_budget_bytes = config.buffer_budget(),
        read_budget_bytes = config.read_budget(),
        stripe_charge_bytes = config.stripe_charge(),
        stall_timeout = ?config.stall_timeout,
        credit_idle_timeout = ?config.credit_idle_timeout,
        "gateway flow control"
    );
    let blobs = BlobStore::start_with_stats(blob_config, meta.clone(), stats.clone())
        .await
        .map_err(Error::BlobStore)?;
    // Heal worker (docs/design/durability.md §6): it writes under the same write
    // epochs as client writes.
    let heal = config.heal_enabled.then(|| {
        crate::heal::describe();
        crate::heal::HealWorker::start(
            crate::heal::HealConfig::from_config(&config),
            blobs.clone(),
            std::sync::Arc::new(meta.clone()),
            blobs.epochs().clone(),
        )
    });
    let meta_for_health = meta.clone();
    let gateway = Gateway::new(
        meta,
        blobs.clone(),
        config.region.clone(),
        config.max_background_deletes,
    )
    .with_inline_max(config.inline_max_bytes.as_u64())
    .with_read_lease_after(config.read_lease_after);
    let limiter = InflightLimiter::new(config.max_inflight_requests, stats);
    let health = Arc::new(GatewayHealth::new(
        meta_for_health,
        config.effective_write_quorum() as usize,
    ));
    let keys = AccessKeys::new(
        &config.access_key,
        config.secret_key.as_str(),
        Some(gateway.meta.clone()),
    );
    let service = s3_service_with_hosts(gateway.clone(), keys, limiter, &config.root_domains)
        .with_body_limits(config.body_limits())
        .with_health(health);
    let scheme = if tls.is_some() { "https" } else { "http" };
    match listener.local_addr() {
        Ok(addr) => {
            tracing::info!(%addr, scheme, region = %config.region, "S3 gateway listening");
        }
        Err(e) => tracing::warn!(error = %e, "S3 gateway listening on an unknown address"),
    }
    let limits = config.listener_limits();
    tracing::info!(
        max_connections = limits.max_connections,
        max_pending_connections = limits.max_pending_connections,
        header_read_timeout = ?limits.header_read_timeout,
        idle_timeout = ?limits.idle_timeout,
        body_timeout = ?config.body_timeout,
        body_min_bytes = config.body_min_bytes.as_u64(),
        max_aws_chunk_bytes = config.max_aws_chunk_bytes.as_u64(),
        http2 = limits.http2,
        "S3 listener limits"
    );
    let sighup = match &tls {
        Some(t) => match t.reload_on_sighup() {
            Ok(task) => Some(task),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; the S3 certificate will not reload");
                None
            }
        },
        None => None,
    };
    serve(
        listener,
        service,
        tls,
        shutdown,
        limits,
        config.shutdown_grace,
    )
    .await;
    if let Some(task) = sighup {
        task.abort();
    }
    gateway.drain().await;
    if let Some(heal) = heal {
        heal.stop().await;
    }
    blobs.shutdown().await;
    tracing::info!("S3 gateway stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::error_body::*;
    use super::precheck::*;
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
    fn completed_error_bodies_keep_what_s3s_wrote() {
        // Escaped text, elements we do not know and their order stay as
        // written; only the missing elements are added.
        let body = br#"<Error><Code>InvalidArgument</Code><Message>a &amp; b &lt;c&gt;</Message><ArgumentName>x-amz-acl</ArgumentName></Error>"#;
        let out = complete_error_body(body, "id", "/b").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<Error><Code>InvalidArgument</Code><Message>a &amp; b &lt;c&gt;</Message><ArgumentName>x-amz-acl</ArgumentName><Resource>/b</Resource><RequestId>id</RequestId></Error>"
        );
        // Not an S3 error document: left alone.
        assert!(complete_error_body(b"<ListBucketResult/>", "id", "/").is_none());
        assert!(complete_error_body(b"<Error><Code>X</Code>", "id", "/").is_none());
        assert!(complete_error_body(b"<Other><Error/></Other>", "id", "/").is_none());
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

    /// A data path with no datanodes: these tests end before it is used.
    async fn no_datanodes() -> BlobStore {
        BlobStore::start_with_directory(
            crate::blob::BlobStoreConfig::default(),
            Arc::new(crate::datanodes::FixedDatanodes::new(
                Vec::new(),
                sluice_net::Transport::Insecure,
            )),
            crate::epoch::WriteEpochs::fixed(1),
        )
        .await
        .expect("empty fixed set")
    }

    #[tokio::test]
    async fn anonymous_requests_are_denied_with_a_complete_error_body() {
        // ListBuckets is never anonymous: refused before meta or the data
        // path is touched (anonymous bucket requests are decided by the
        // bucket's ACL and policy: tests/cluster/s3_access.rs).
        let meta = MetaClient::new(vec!["http://127.0.0.1:1".into()]);
        let blobs = no_datanodes().await;
        let service = s3_service(Gateway::new(meta, blobs, "us-east-1".into(), 4), "AK", "SK");
        let req = Request::builder()
            .uri("/?max-buckets=5")
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
        assert!(body.contains("<Resource>/</Resource>"), "{body}");
        assert!(
            body.contains(&format!("<RequestId>{id}</RequestId>")),
            "{body}"
        );
    }

    /// A request body that records whether anyone polled it.
    struct Untouched(Arc<std::sync::atomic::AtomicBool>);

    impl futures::Stream for Untouched {
        type Item = Result<Bytes, StdError>;
        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            Poll::Ready(None)
        }
    }

    impl s3s::stream::ByteStream for Untouched {}

    #[tokio::test]
    async fn requests_past_max_inflight_get_slow_down_without_reading_the_body() {
        let meta = MetaClient::new(vec!["http://127.0.0.1:1".into()]);
        let blobs = no_datanodes().await;
        let stats = GatewayStats::new();
        let limiter = InflightLimiter::new(1, stats.clone());
        let service = s3_service_with_limiter(
            Gateway::new(meta, blobs, "us-east-1".into(), 4),
            AccessKeys::new("AK", "SK", None),
            Arc::clone(&limiter),
        );
        let held = limiter.try_acquire().expect("the one slot");
        let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let body: s3s::stream::DynByteStream = Box::pin(Untouched(Arc::clone(&polled)));
        let req = Request::builder()
            .method("PUT")
            .uri("/bucket/a%26b")
            .header("host", "127.0.0.1:9000")
            .header("content-length", "1048576")
            .body(s3s::Body::from(body))
            .unwrap();
        let resp = service.call(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !polled.load(std::sync::atomic::Ordering::SeqCst),
            "the body was read"
        );
        let headers = resp.headers();
        assert_eq!(headers.get("retry-after").unwrap(), "1");
        assert_eq!(headers.get("connection").unwrap(), "close");
        assert_eq!(headers.get("content-type").unwrap(), "application/xml");
        let id = headers.get("x-amz-request-id").unwrap().to_str().unwrap();
        let body = resp.body().bytes().expect("buffered error body");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><Resource>/bucket/a%26b</Resource><RequestId>{id}</RequestId></Error>"
            )
        );
        assert_eq!(stats.inflight_rejected(), 1);

        // With the slot free the request is admitted (and denied: an
        // anonymous ListBuckets), and its slot is released with the response.
        drop(held);
        let req = Request::builder()
            .uri("/")
            .header("host", "127.0.0.1:9000")
            .body(s3s::Body::empty())
            .unwrap();
        let resp = service.call(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(stats.inflight(), 0);
        assert_eq!(stats.inflight_high_water(), 1);
        assert_eq!(stats.inflight_rejected(), 1);
    }

    #[test]
    fn prechecks_presigned_expiry_preflight_and_encryption() {
        let get = |uri: &str| Request::builder().uri(uri).body(()).unwrap();
        let presigned = |expires: &str| {
            get(&format!(
                "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host"
            ))
        };
        assert_eq!(precheck(&presigned("604800")), None);
        assert_eq!(precheck(&presigned("0")), None);
        let over = precheck(&presigned("609901")).expect("over 7 days");
        assert_eq!((over.0, over.1), (StatusCode::FORBIDDEN, "AccessDenied"));
        let negative = precheck(&presigned("-7")).expect("negative");
        assert_eq!(
            (negative.0, negative.1),
            (StatusCode::FORBIDDEN, "AccessDenied")
        );
        // Not a number: s3s answers it.
        assert_eq!(precheck(&presigned("soon")), None);
        // SigV2: an expiry time.
        let v2 = |at: i64| get(&format!("/b/k?AWSAccessKeyId=AK&Signature=x&Expires={at}"));
        let now = now_unix_secs();
        assert_eq!(precheck(&v2(now + 3600)), None);
        assert_eq!(precheck(&v2(now - 7)), None, "expired: s3s answers it");
        let far = precheck(&v2(now + 609_901)).expect("over 7 days ahead");
        assert_eq!((far.0, far.1), (StatusCode::FORBIDDEN, "AccessDenied"));
        assert_eq!(precheck(&get("/b/k?x-id=GetObject")), None);
        assert_eq!(precheck(&get("/b/k")), None);

        for header in [
            "x-amz-server-side-encryption",
            "x-amz-server-side-encryption-customer-algorithm",
            "x-amz-copy-source-server-side-encryption-customer-key",
        ] {
            let sse = Request::builder()
                .method(http::Method::PUT)
                .uri("/b/k")
                .header(header, "AES256")
                .body(())
                .unwrap();
            let refused = precheck(&sse).expect(header);
            assert_eq!(
                (refused.0, refused.1),
                (StatusCode::NOT_IMPLEMENTED, "NotImplemented"),
                "{header}"
            );
        }

        let options = |origin: Option<&str>| {
            let mut b = Request::builder()
                .method(http::Method::OPTIONS)
                .uri("/b/k?X-Amz-Expires=60");
            if let Some(o) = origin {
                b = b.header("origin", o);
            }
            b.body(()).unwrap()
        };
        let no_origin = precheck(&options(None)).expect("preflight without Origin");
        assert_eq!(
            (no_origin.0, no_origin.1),
            (StatusCode::BAD_REQUEST, "BadRequest")
        );
        assert_eq!(
            precheck(&options(Some("https://example.com"))),
            None,
            "a preflight with Origin is the bucket's CORS rules' to answer"
        );
    }

    #[test]
    fn request_ids_are_16_hex_digits() {
        let id = RequestId::new().0;
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
