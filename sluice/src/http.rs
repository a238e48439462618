//! The binary's small read-only HTTP/1 endpoints (Prometheus `/metrics`,
//! health checks, the `sluice admin serve` status page): one accept loop
//! with a connection bound and a per-connection deadline, and a helper for
//! plain responses.
//!
//! Bounds: at most `max_connections` connections are served at once (more
//! wait in the listener's TCP backlog); each is closed after one request or
//! `timeout`, answered or not, so a stalled client holds one slot at most
//! that long.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Answers one request from its method and path.
pub type Handler =
    Arc<dyn Fn(Method, String) -> BoxFuture<'static, Response<Full<Bytes>>> + Send + Sync>;

/// Serves `handler` on `listener` (see the module docs for the bounds).
/// Runs until aborted; connection tasks end by themselves within `timeout`.
/// `what` names the endpoint in log lines.
pub async fn serve(
    listener: TcpListener,
    max_connections: usize,
    timeout: Duration,
    handler: Handler,
    what: &'static str,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "accepting a {what} connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = handler(req.method().clone(), req.uri().path().to_string());
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match tokio::time::timeout(timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "{what} connection"),
                Err(_) => tracing::debug!("{what} connection timed out"),
            }
            drop(permit);
        });
    }
}

/// A response with `status`, `content_type` and `body`.
pub fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// `text/plain` with `status` and `body`.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    respond(status, "text/plain; charset=utf-8", body)
}
