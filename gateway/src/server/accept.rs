//! The S3 listener's accept loop and connections: connection limits, TLS,
//! HTTP/1 and h2c, head and idle timeouts, graceful shutdown.

use super::*;

/// Serves one accepted S3 connection (plain or TLS, wrapped in a
/// [`WatchedIo`] that reports reads to `activity`) until it ends, its head
/// or idle timeout passes, or `stop` asks for a graceful shutdown.
pub(super) async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    io: WatchedIo<S>,
    service: SluiceService,
    activity: Arc<ConnActivity>,
    mut stop: watch::Receiver<bool>,
    peer: std::net::SocketAddr,
    limits: ListenerLimits,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let conn = builder.serve_connection(
        io,
        ConnService {
            inner: service,
            activity: Arc::clone(&activity),
        },
    );
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let deadline = activity
            .deadline(limits.header_read_timeout, limits.idle_timeout)
            .unwrap_or_else(|| {
                Instant::now() + limits.header_read_timeout.min(limits.idle_timeout)
            });
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
            () = tokio::time::sleep_until(deadline.into()) => {
                let expired = activity
                    .deadline(limits.header_read_timeout, limits.idle_timeout)
                    .is_some_and(|d| d <= Instant::now());
                if expired {
                    tracing::debug!(%peer, "S3 connection idle or its request head too slow; closed");
                    break;
                }
            }
        }
    }
}

/// The service of one client connection: [`SluiceService`], counting
/// requests in progress for the connection's header and idle timeouts.
#[derive(Clone)]
pub(super) struct ConnService {
    inner: SluiceService,
    activity: Arc<ConnActivity>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = BoxFuture<'static, Result<HttpResponse, HttpError>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let service = self.inner.clone();
        let active = self.activity.request_started();
        Box::pin(async move {
            let mut resp = service.call(req.map(s3s::Body::from)).await?;
            let body = std::mem::take(resp.body_mut());
            *resp.body_mut() = s3s::Body::http_body(GuardedBody {
                inner: body,
                _guard: active,
            });
            Ok(resp)
        })
    }
}

/// Accepts connections until `shutdown` within `limits` (see
/// [`crate::listener`]), then shuts every connection down gracefully,
/// aborting those still open after `grace`.
///
/// Over TLS when `tls` is set: the handshake runs in the connection's task
/// once the connection has sent its first byte and holds a slot, within
/// [`crate::tls::HANDSHAKE_TIMEOUT`].
///
/// Bounds: at most `max_pending_connections` connections wait for their
/// first byte and at most `max_connections` are served; the task set holds
/// one task per open connection, so at most the sum of both.
pub(super) async fn serve(
    listener: TcpListener,
    service: SluiceService,
    tls: Option<Arc<S3TlsAcceptor>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ListenerLimits,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Head and idle timeouts are the connection task's (hyper's header
        // timer would also cut idle keep-alive connections).
        .header_read_timeout(None)
        .max_buf_size(HTTP1_MAX_BUF_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW_BYTES);
    let builder = Arc::new(if limits.http2 {
        builder
    } else {
        builder.http1_only()
    });
    let pending = Arc::new(Semaphore::new(limits.max_pending_connections.max(1)));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections: JoinSet<()> = JoinSet::new();
    tokio::pin!(shutdown);

    loop {
        while connections.try_join_next().is_some() {}
        let waiting = tokio::select! {
            () = &mut shutdown => break,
            permit = pending.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
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
        if let Some(idle) = limits.tcp_keepalive
            && let Err(e) = listener::set_tcp_keepalive(&stream, idle)
        {
            tracing::debug!(error = %e, "setting TCP keepalive");
        }
        let mut stop = stop_rx.clone();
        let (builder, slots, service) = (Arc::clone(&builder), Arc::clone(&slots), service.clone());
        let tls = tls.clone();
        connections.spawn(async move {
            // Pending: the first byte must come within the header timeout.
            let alive = tokio::select! {
                alive = tokio::time::timeout(limits.header_read_timeout, listener::first_byte(&stream)) => alive,
                _ = stop.wait_for(|s| *s) => return,
            };
            match alive {
                Ok(true) => {}
                Ok(false) => return,
                Err(_) => {
                    metrics::count_silent_connection();
                    tracing::debug!(%peer, "S3 connection sent nothing within the header timeout; closed");
                    return;
                }
            }
            let _slot = tokio::select! {
                slot = slots.acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            drop(waiting);
            let activity = ConnActivity::new_with_head();
            match tls {
                None => {
                    let io = WatchedIo::new(stream, Arc::clone(&activity));
                    serve_connection(&builder, io, service, activity, stop, peer, limits).await;
                }
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        let io = WatchedIo::new(stream, Arc::clone(&activity));
                        serve_connection(&builder, io, service, activity, stop, peer, limits).await;
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "S3 TLS handshake failed"),
                },
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
