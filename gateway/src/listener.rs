//! S3 listener hardening: what a client connection may cost before and
//! while it sends requests.
//!
//! * **Pending connections.** An accepted connection first has to prove it
//!   is alive: the first byte of its first request must arrive within
//!   `header_read_timeout`, or it is closed. Until then it holds one of
//!   `max_pending_connections` cheap slots (a socket and a small task; no
//!   hyper state, no read buffer). When every pending slot is taken the
//!   gateway stops accepting until one frees (at most `header_read_timeout`
//!   later): silent sockets delay new clients by at most that, never lock
//!   them out.
//! * **Connection slots.** A connection that sent bytes takes one of
//!   `max_connections` slots (waiting for one, still holding its pending
//!   slot) and only then gets hyper's buffers. So at most
//!   `max_connections + max_pending_connections` sockets are open at once.
//! * **Header and idle timeouts** ([`ConnActivity`]). While no request is in
//!   progress on a connection, the head of the next request must arrive
//!   within `header_read_timeout` of its first byte, and the first byte
//!   within `idle_timeout` of the previous response (keep-alive); otherwise
//!   the connection is closed.
//! * **Body progress** ([`MinRateBody`]). While the gateway waits for a
//!   request body, at least `body_min_bytes` must arrive per
//!   `body_timeout` of waiting (time the gateway spends not reading — a
//!   request waiting for a buffer — does not count), like nginx's
//!   `client_body_timeout`. A body that makes less progress fails with
//!   [`BodyTimeout`]; the request ends with `400 RequestTimeout` and
//!   releases its buffers and its in-flight slot.
//! * **Signed `aws-chunked` chunks** ([`ChunkCap`]). s3s holds a signed
//!   chunk whole to check its signature; a chunk declared larger than
//!   `max_aws_chunk_bytes` fails the body with [`ChunkTooLarge`] before a
//!   byte of its data is passed on (`400 InvalidRequest`).
//! * **TCP keepalive** on accepted sockets (`tcp_keepalive`), so a peer
//!   that vanished without a FIN is noticed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use s3s::StdError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `header_read_timeout` when not configured.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `idle_timeout` when not configured.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `body_timeout` when not configured.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// `body_min_bytes` when not configured: 16 KiB per `body_timeout`.
pub const DEFAULT_BODY_MIN_BYTES: u64 = 16 * 1024;
/// `max_pending_connections` when not configured.
pub const DEFAULT_MAX_PENDING_CONNECTIONS: usize = 4096;
/// `max_connections` when not configured.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// `tcp_keepalive` when not configured: idle time before the first probe.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// `max_aws_chunk_bytes` when not configured: 16 MiB.
pub const DEFAULT_MAX_AWS_CHUNK_BYTES: u64 = 16 * 1024 * 1024;
/// Interval between TCP keepalive probes once they started.
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Longest chunk header line [`ChunkCap`] reads (s3s's limit is the same);
/// a longer one is left to s3s, which rejects it.
const MAX_CHUNK_META_BYTES: usize = 1024;

/// The limits of the S3 listener (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub max_pending_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// `None`: no TCP keepalive.
    pub tcp_keepalive: Option<Duration>,
    /// Serve HTTP/2 (h2c) as well as HTTP/1.1.
    pub http2: bool,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_pending_connections: DEFAULT_MAX_PENDING_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
            http2: false,
        }
    }
}

/// The limits on request bodies (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    pub body_timeout: Duration,
    pub body_min_bytes: u64,
    pub max_aws_chunk_bytes: u64,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            body_timeout: DEFAULT_BODY_TIMEOUT,
            body_min_bytes: DEFAULT_BODY_MIN_BYTES,
            max_aws_chunk_bytes: DEFAULT_MAX_AWS_CHUNK_BYTES,
        }
    }
}

/// Turns on TCP keepalive on `stream`: probes after `idle`, then every
/// [`TCP_KEEPALIVE_INTERVAL`].
pub fn set_tcp_keepalive(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Waits until the peer sent at least one byte (not consumed). `false` when
/// it closed the connection or the socket failed first.
pub async fn first_byte(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.peek(&mut byte).await, Ok(n) if n > 0)
}

/// "No time" in [`ConnActivity`]'s millisecond fields.
const NEVER: u64 = u64::MAX;

/// What a connection is doing, for its header and idle timeouts: requests
/// in progress, when it last became idle, and when the first byte of the
/// next request head arrived. Updated by [`WatchedIo`] (reads) and by the
/// connection's service (request start and end).
#[derive(Debug)]
pub struct ConnActivity {
    base: Instant,
    active: AtomicUsize,
    /// Milliseconds after `base` the connection last became idle.
    idle_since: AtomicU64,
    /// Milliseconds after `base` a byte arrived while idle; [`NEVER`] when
    /// none has since the connection became idle.
    head_started: AtomicU64,
}

impl ConnActivity {
    /// A connection whose first request's first byte has already arrived.
    pub fn new_with_head() -> Arc<Self> {
        Arc::new(ConnActivity {
            base: Instant::now(),
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(NEVER - 1)
    }

    fn read_some(&self) {
        if self.active.load(Ordering::Acquire) == 0 {
            let now = self.now_ms();
            let _ =
                self.head_started
                    .compare_exchange(NEVER, now, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// A request started; it counts as active until the guard is dropped
    /// (after its response body was sent or dropped).
    pub fn request_started(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(NEVER, Ordering::Release);
        ActiveRequest(Arc::clone(self))
    }

    /// When the connection times out if nothing changes, or `None` while a
    /// request is in progress.
    pub fn deadline(
        &self,
        header_read_timeout: Duration,
        idle_timeout: Duration,
    ) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_started.load(Ordering::Acquire);
        Some(if head != NEVER {
            self.base + Duration::from_millis(head) + header_read_timeout
        } else {
            self.base
                + Duration::from_millis(self.idle_since.load(Ordering::Acquire))
                + idle_timeout
        })
    }
}

/// A request in progress on a connection (see [`ConnActivity`]).
#[derive(Debug)]
pub struct ActiveRequest(Arc<ConnActivity>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let now = self.0.now_ms();
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_since.store(now, Ordering::Release);
            self.0.head_started.store(NEVER, Ordering::Release);
        }
    }
}

/// A socket that reports reads to its [`ConnActivity`].
pub struct WatchedIo<S = TcpStream> {
    inner: S,
    activity: Arc<ConnActivity>,
}

impl<S> WatchedIo<S> {
    pub fn new(inner: S, activity: Arc<ConnActivity>) -> Self {
        WatchedIo { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_some();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request body that made too little progress (see [`MinRateBody`]).
/// The `RequestBodyTimeout:` prefix is how the S3 error mapping recognises
/// it after s3s wrapped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("RequestBodyTimeout: fewer than {min_bytes} request body bytes arrived in {timeout:?}")]
pub struct BodyTimeout {
    pub timeout: Duration,
    pub min_bytes: u64,
}

/// A signed `aws-chunked` chunk over the cap (see [`ChunkCap`]). The
/// `ChunkTooLarge:` prefix is how the S3 error mapping recognises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "ChunkTooLarge: an aws-chunked chunk of {size} bytes exceeds the gateway limit of {max} bytes (max_aws_chunk_bytes); send smaller chunks"
)]
pub struct ChunkTooLarge {
    pub size: u64,
    pub max: u64,
}

/// A request body that must deliver `min_bytes` per `timeout` spent
/// waiting for it. Only time between a poll that found nothing and the
/// next frame counts: while the consumer does not poll (the request waits
/// for a buffer), the clock stops. Once failed it ends.
pub struct MinRateBody<B> {
    inner: B,
    timeout: Duration,
    min_bytes: u64,
    /// Bytes received since the window began.
    window_bytes: u64,
    /// Waiting time spent in this window before the current wait.
    waited: Duration,
    /// When the current wait began.
    waiting_since: Option<Instant>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: bool,
}

impl<B> MinRateBody<B> {
    pub fn new(inner: B, timeout: Duration, min_bytes: u64) -> Self {
        MinRateBody {
            inner,
            timeout,
            min_bytes: min_bytes.max(1),
            window_bytes: 0,
            waited: Duration::ZERO,
            waiting_since: None,
            sleep: None,
            failed: false,
        }
    }
}

impl<B> Body for MinRateBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(since) = this.waiting_since.take() {
                    this.waited += since.elapsed();
                }
                this.sleep = None;
                if let Some(data) = frame.data_ref() {
                    this.window_bytes += data.len() as u64;
                }
                if this.window_bytes >= this.min_bytes {
                    this.window_bytes = 0;
                    this.waited = Duration::ZERO;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(Instant::now);
                let deadline = since + this.timeout.saturating_sub(this.waited);
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
                if sleep.as_mut().poll(cx).is_ready() {
                    this.failed = true;
                    this.sleep = None;
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout {
                        timeout: this.timeout,
                        min_bytes: this.min_bytes,
                    }))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading a chunk header line.
    Meta,
    /// Inside a chunk's data: bytes still to come.
    Data(u64),
    /// The `\r\n` after a chunk's data: bytes still to come.
    DataEnd(u8),
    /// After the last chunk (trailers), or a line left to s3s to judge.
    Done,
}

/// Whether `headers` announce an `aws-chunked` body of signed chunks
/// (`x-amz-content-sha256: STREAMING-AWS4-...`), which s3s holds chunk by
/// chunk.
pub fn is_signed_chunked(headers: &http::HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-AWS4-"))
}

/// An `aws-chunked` body passed on unchanged, except that a chunk header
/// declaring more than `max` bytes fails the body with [`ChunkTooLarge`]
/// (the frame holding that header is not passed on). Malformed framing is
/// left to s3s.
pub struct ChunkCap<B> {
    inner: B,
    max: u64,
    state: ChunkState,
    meta: Vec<u8>,
    failed: bool,
}

impl<B> ChunkCap<B> {
    pub fn new(inner: B, max: u64) -> Self {
        ChunkCap {
            inner,
            max,
            state: ChunkState::Meta,
            meta: Vec::new(),
            failed: false,
        }
    }

    /// Follows the framing through `buf`.
    fn scan(&mut self, buf: &[u8]) -> Result<(), ChunkTooLarge> {
        let mut i = 0;
        while i < buf.len() {
            match self.state {
                ChunkState::Done => return Ok(()),
                ChunkState::Meta => match buf[i..].iter().position(|&b| b == b'\n') {
                    Some(p) => {
                        if self.meta.len() + p + 1 > MAX_CHUNK_META_BYTES {
                            self.state = ChunkState::Done;
                            return Ok(());
                        }
                        self.meta.extend_from_slice(&buf[i..=i + p]);
                        i += p + 1;
                        self.state = match declared_size(&self.meta) {
                            Some(n) if n > self.max => {
                                return Err(ChunkTooLarge {
                                    size: n,
                                    max: self.max,
                                });
                            }
                            Some(0) | None => ChunkState::Done,
                            Some(n) => ChunkState::Data(n),
                        };
                        self.meta.clear();
                    }
                    None => {
                        if self.meta.len() + buf.len() - i > MAX_CHUNK_META_BYTES {
                            self.state = ChunkState::Done;
                            return Ok(());
                        }
                        self.meta.extend_from_slice(&buf[i..]);
                        return Ok(());
                    }
                },
                ChunkState::Data(remaining) => {
                    let n =
                        usize::try_from(remaining).map_or(buf.len() - i, |r| r.min(buf.len() - i));
                    i += n;
                    let left = remaining - n as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd(2)
                    } else {
                        ChunkState::Data(left)
                    };
                }
                ChunkState::DataEnd(left) => {
                    i += 1;
                    self.state = if left == 1 {
                        ChunkState::Meta
                    } else {
                        ChunkState::DataEnd(left - 1)
                    };
                }
            }
        }
        Ok(())
    }
}

/// The size a chunk header line (`<hex>[;chunk-signature=...]\r\n`)
/// declares; `None` when it does not parse.
fn declared_size(line: &[u8]) -> Option<u64> {
    let end = line
        .iter()
        .position(|&b| b == b';' || b == b'\r')
        .unwrap_or(line.len());
    let digits = &line[..end];
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

impl<B> Body for ChunkCap<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(e) = this.scan(data)
                {
                    this.failed = true;
                    tracing::info!(
                        size = e.size,
                        max = e.max,
                        "refusing an oversized aws-chunked chunk"
                    );
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body_of(parts: Vec<&'static [u8]>) -> impl Body<Data = Bytes, Error = StdError> + Unpin {
        StreamBody::new(futures::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, StdError>(Frame::data(Bytes::from_static(p)))),
        ))
    }

    #[tokio::test]
    async fn chunk_cap_passes_small_chunks_and_refuses_large_ones() {
        let sig =
            ";chunk-signature=0000000000000000000000000000000000000000000000000000000000000000";
        let ok: &'static [u8] = Box::leak(
            format!("4{sig}\r\nabcd\r\n3{sig}\r\nxyz\r\n0{sig}\r\n\r\n")
                .into_bytes()
                .into_boxed_slice(),
        );
        let collected = ChunkCap::new(body_of(vec![&ok[..10], &ok[10..]]), 4)
            .collect()
            .await
            .expect("small chunks pass")
            .to_bytes();
        assert_eq!(&collected[..], ok);

        let big: &'static [u8] = Box::leak(
            format!("4{sig}\r\nabcd\r\n5{sig}\r\nhello\r\n")
                .into_bytes()
                .into_boxed_slice(),
        );
        let err = ChunkCap::new(body_of(vec![&big[..30], &big[30..]]), 4)
            .collect()
            .await
            .expect_err("a 5-byte chunk over a 4-byte cap");
        let too_large = err.downcast_ref::<ChunkTooLarge>().expect("ChunkTooLarge");
        assert_eq!(*too_large, ChunkTooLarge { size: 5, max: 4 });
    }

    #[test]
    fn declared_sizes() {
        assert_eq!(declared_size(b"10\r\n"), Some(16));
        assert_eq!(
            declared_size(b"1000000;chunk-signature=ab\r\n"),
            Some(16 << 20)
        );
        assert_eq!(declared_size(b"zz\r\n"), None);
    }

    #[tokio::test]
    async fn a_stalled_body_fails_after_the_timeout_but_a_paused_consumer_does_not_count() {
        let timeout = Duration::from_millis(300);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, StdError>>(4);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut body = MinRateBody::new(StreamBody::new(stream), timeout, 4);
        tx.send(Ok(Frame::data(Bytes::from_static(b"ab"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        // The consumer does not poll for a while: not the client's fault.
        tokio::time::sleep(timeout * 3).await;
        tx.send(Ok(Frame::data(Bytes::from_static(b"c"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        // Now the client stalls while the consumer waits.
        let started = Instant::now();
        let err = body.frame().await.unwrap().expect_err("stalled body");
        assert!(err.downcast_ref::<BodyTimeout>().is_some(), "{err}");
        let waited = started.elapsed();
        assert!(
            waited >= timeout && waited < timeout * 3,
            "failed after {waited:?}"
        );
        assert!(body.frame().await.is_none());
        drop(tx);
    }
}
