//! A userspace TCP proxy that degrades a link: latency, jitter, a
//! bandwidth limit, and "down" (refuse and reset). The kernel the harness
//! runs on has no `netem` qdisc, so this takes its place, in the model of
//! Shopify's toxiproxy: the proxy is always in the path, and "toxics" are
//! added and removed while it runs. Packet loss is not done here (the
//! harness uses iptables for that).
//!
//! Each datanode listens on `127.0.0.1:<inner port>` inside its network
//! namespace, and `sluice-chaos proxy --listen <ns ip>:<port> --upstream
//! 127.0.0.1:<inner port> --control <file>` ([`run`]), started there with
//! `ip netns exec`, forwards to it. The orchestrator sets the toxics by
//! atomically rewriting the control file ([`write_control`]: a temporary
//! file, then a rename); the proxy polls it every [`CONTROL_POLL`] (100 ms)
//! and re-reads it only when it changed (inode, length or mtime). The file
//! is the JSON of [`Toxics`]; fields left out are their defaults, so
//! `{}` is a clean link and `{"down":true}` a dead one. A missing or
//! unparsable file keeps the previous toxics (with one warning).
//!
//! # What a connection sees
//!
//! Every accepted connection gets its own upstream connection (both with
//! `TCP_NODELAY`) and two independent directions, client → upstream and
//! upstream → client. In each direction a reader reads chunks of at most
//! [`CHUNK_BYTES`] (16 KiB) and stamps each with its delivery time,
//! `max(previous chunk's delivery time, arrival + latency ± jitter)`, so
//! order is kept however the jitter falls; a writer sleeps until that time,
//! then takes the chunk's bytes from a token bucket (the bandwidth limit,
//! burst one chunk) and writes it. Toxics apply to data that arrives after
//! they change: latency and jitter are read when a chunk arrives, the
//! bandwidth when it is written.
//!
//! - Latency and jitter are per direction: a request and its response
//!   through one proxy take at least 2 × `latency_ms`. Jitter is uniform in
//!   `[-jitter_ms, +jitter_ms]`; a delay that would be negative is zero.
//! - The bandwidth limit is per direction per connection, in bytes per
//!   second. `Some(0)` stalls the direction until the limit changes.
//! - `down`: every open connection is reset (`SO_LINGER` 0, so the peers
//!   see RST, not FIN) on both sides, and new connections are accepted and
//!   reset at once, until `down` is false again.
//! - A half-close passes through: when one side shuts down its write half,
//!   the other side's write half is shut down after the chunks before the
//!   FIN have been delivered, the FIN itself delayed like a chunk. A reset read from one side is likewise
//!   delivered in order, as a reset of both sides once the data before it
//!   has been written. A failed write leaves the other direction to finish
//!   (its data in flight is still delivered); both sides are reset when
//!   both directions have ended.
//!
//! # Bounds
//!
//! - Between a direction's reader and writer is a channel of
//!   [`QUEUE_CHUNKS`] (64) chunks, so at most 64 × 16 KiB = 1 MiB per
//!   direction per connection is held (plus the one chunk being read and
//!   the one being written). When it is full the reader stops reading, the
//!   kernel buffers fill and the sender's writes block: backpressure, as on
//!   a real link. It is also the window: with latency L a direction carries
//!   at most 64 chunks (≤ 1 MiB) per L.
//! - At most `max_connections` ([`ProxyArgs::max_connections`], default
//!   1024) connections are proxied at once; beyond that new connections
//!   wait in the listen backlog until one closes.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Largest chunk a direction reads (and delays, and writes) at once, bytes.
pub const CHUNK_BYTES: usize = 16 * 1024;

/// Chunks queued per direction per connection between the reader and the
/// delayed writer: at most `QUEUE_CHUNKS × CHUNK_BYTES` = 1 MiB buffered.
pub const QUEUE_CHUNKS: usize = 64;

/// How often the control file is checked for a change.
pub const CONTROL_POLL: Duration = Duration::from_millis(100);

/// The degradations applied to a link, both directions alike. The default
/// is a clean link. Serialized as JSON in the control file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Toxics {
    /// Added to every chunk in each direction, milliseconds.
    pub latency_ms: u64,
    /// A uniform random ±`jitter_ms` on top of the latency, milliseconds
    /// (the total never below zero; chunk order is kept regardless).
    pub jitter_ms: u64,
    /// Limit per direction per connection, bytes per second; `None` is
    /// unlimited, `Some(0)` stalls.
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// When true: refuse new connections (accept, then reset) and reset
    /// existing ones. A "down" toxic.
    pub down: bool,
}

/// Writes `toxics` to the control file at `path` atomically: to a
/// temporary file in the same directory, then renamed over `path`, so the
/// proxy never reads a partial file.
pub fn write_control(path: &Path, toxics: &Toxics) -> anyhow::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .with_context(|| format!("control path {} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let json = serde_json::to_vec(toxics)?;
    std::fs::write(&tmp, &json).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming {} to {}", tmp.display(), path.display())
    })?;
    Ok(())
}

/// `sluice-chaos proxy`: the command-line arguments of [`run`].
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Address to accept connections on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address every connection is forwarded to.
    #[arg(long)]
    pub upstream: SocketAddr,
    /// JSON file of the toxics (see `Toxics`), polled every 100 ms; missing
    /// is a clean link.
    #[arg(long)]
    pub control: PathBuf,
    /// Most connections proxied at once; more wait in the listen backlog.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
}

/// Runs the proxy until SIGTERM or SIGINT.
pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let toxics = watch_control(args.control.clone());
    info!(
        listen = %args.listen,
        upstream = %args.upstream,
        control = %args.control.display(),
        toxics = ?*toxics.borrow(),
        "proxy listening"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = serve(listener, args.upstream, toxics, args.max_connections) => r,
        _ = term.recv() => {
            info!("SIGTERM, proxy stopping");
            Ok(())
        }
        r = tokio::signal::ctrl_c() => {
            r.context("waiting for SIGINT")?;
            info!("SIGINT, proxy stopping");
            Ok(())
        }
    }
}

/// Polls the control file at `path` every [`CONTROL_POLL`] and publishes
/// its toxics; the first value is read before returning (a clean link if
/// the file is missing or unparsable). The polling task ends when every
/// receiver is dropped. Needs a Tokio runtime.
pub fn watch_control(path: PathBuf) -> watch::Receiver<Toxics> {
    let mut state = ControlFile {
        path,
        seen: None,
        warned: false,
    };
    let initial = state.poll().unwrap_or_default();
    let (tx, rx) = watch::channel(initial);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CONTROL_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.is_closed() {
                return;
            }
            if let Some(t) = state.poll() {
                tx.send_if_modified(|cur| {
                    if *cur == t {
                        return false;
                    }
                    info!(control = %state.path.display(), toxics = ?t, "toxics changed");
                    *cur = t;
                    true
                });
            }
        }
    });
    rx
}

/// What identifies one version of the control file: a rename gives a new
/// inode, so two writes within one mtime tick are still told apart.
type Stamp = (u64, u64, u64, Option<SystemTime>);

struct ControlFile {
    path: PathBuf,
    seen: Option<Stamp>,
    warned: bool,
}

impl ControlFile {
    /// The toxics if the file changed since the last call and parses;
    /// `None` if it is unchanged, missing or unparsable.
    fn poll(&mut self) -> Option<Toxics> {
        // Stat and read through one descriptor, so the stamp is the
        // version read even if a rename lands in between.
        let opened = std::fs::File::open(&self.path).and_then(|f| {
            let meta = f.metadata()?;
            Ok((f, meta))
        });
        let (mut file, meta) = match opened {
            Ok(o) => o,
            Err(e) => {
                self.seen = None;
                self.warn(format_args!("cannot be opened: {e}"));
                return None;
            }
        };
        let stamp = (meta.dev(), meta.ino(), meta.len(), meta.modified().ok());
        if self.seen == Some(stamp) {
            return None;
        }
        self.seen = Some(stamp);
        let mut bytes = Vec::new();
        let parsed = io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(anyhow::Error::from)
            .and_then(|_| serde_json::from_slice::<Toxics>(&bytes).map_err(anyhow::Error::from));
        match parsed {
            Ok(t) => {
                self.warned = false;
                Some(t)
            }
            Err(e) => {
                self.warn(format_args!("cannot be read: {e:#}"));
                None
            }
        }
    }

    fn warn(&mut self, what: std::fmt::Arguments<'_>) {
        if !self.warned {
            self.warned = true;
            warn!(control = %self.path.display(), "control file {what}; keeping the previous toxics");
        }
    }
}

/// Accepts connections on `listener` and proxies each to `upstream` under
/// the current `toxics`, at most `max_connections` at once. Returns only on
/// a bad argument; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    toxics: watch::Receiver<Toxics>,
    max_connections: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(max_connections > 0, "max_connections must be at least 1");
    let permits = Arc::new(Semaphore::new(max_connections));
    loop {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .context("connection semaphore closed")?;
        let (client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: back off rather than spin.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if toxics.borrow().down {
            debug!(%peer, "down: refusing a connection");
            reset(&client);
            continue;
        }
        let toxics = toxics.clone();
        tokio::spawn(async move {
            connection(client, peer, upstream, toxics).await;
            drop(permit);
        });
    }
}

/// Closes with RST rather than FIN.
fn reset(stream: &TcpStream) {
    if let Err(e) = stream.set_zero_linger() {
        debug!(error = %e, "setting SO_LINGER 0");
    }
}

/// Resolves once `toxics` says down (never if the sender is gone: the last
/// value stands).
async fn down(toxics: &mut watch::Receiver<Toxics>) {
    loop {
        if toxics.borrow_and_update().down {
            return;
        }
        if toxics.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn connection(
    mut client: TcpStream,
    peer: SocketAddr,
    upstream: SocketAddr,
    toxics: watch::Receiver<Toxics>,
) {
    let mut down_rx = toxics.clone();
    if let Err(e) = client.set_nodelay(true) {
        debug!(%peer, error = %e, "TCP_NODELAY on the client side");
    }
    let mut server = tokio::select! {
        r = TcpStream::connect(upstream) => match r {
            Ok(s) => s,
            Err(e) => {
                debug!(%peer, %upstream, error = %e, "connecting upstream");
                reset(&client);
                return;
            }
        },
        () = down(&mut down_rx) => {
            debug!(%peer, "down while connecting upstream");
            reset(&client);
            return;
        }
    };
    if let Err(e) = server.set_nodelay(true) {
        debug!(%peer, error = %e, "TCP_NODELAY on the upstream side");
    }
    let clean = tokio::select! {
        r = pump(&mut client, &mut server, &toxics) => match r {
            Ok(clean) => clean,
            Err(e) => {
                debug!(%peer, error = %e, "connection reset");
                false
            }
        },
        () = down(&mut down_rx) => {
            debug!(%peer, "down: resetting a connection");
            false
        }
    };
    if !clean {
        reset(&client);
        reset(&server);
    }
}

/// Both directions of one connection. `Ok(true)`: both ended with a
/// clean half-close; `Ok(false)`: a write failed (reset both); `Err`: a
/// reset was delivered (reset both).
async fn pump(
    client: &mut TcpStream,
    server: &mut TcpStream,
    toxics: &watch::Receiver<Toxics>,
) -> io::Result<bool> {
    let (cr, cw) = client.split();
    let (sr, sw) = server.split();
    let (up_tx, up_rx) = mpsc::channel(QUEUE_CHUNKS);
    let (down_tx, down_rx) = mpsc::channel(QUEUE_CHUNKS);
    let (_, up_clean, _, down_clean) = tokio::try_join!(
        read_side(cr, up_tx, toxics.clone(), "client→upstream"),
        write_side(sw, up_rx, toxics.clone(), "client→upstream"),
        read_side(sr, down_tx, toxics.clone(), "upstream→client"),
        write_side(cw, down_rx, toxics.clone(), "upstream→client"),
    )?;
    Ok(up_clean && down_clean)
}

enum Chunk {
    Data {
        deliver: Instant,
        data: Bytes,
    },
    /// The source shut down its write half: shut down the destination's.
    Eof {
        deliver: Instant,
    },
    /// The source was reset; deliver as a reset after the data before it.
    Reset {
        deliver: Instant,
    },
}

fn delay(t: &Toxics, rng: &mut StdRng) -> Duration {
    let base = t.latency_ms.saturating_mul(1000);
    let jitter = t.jitter_ms.saturating_mul(1000);
    let us = if jitter == 0 {
        base
    } else {
        let j = rng.gen_range(0..=jitter.saturating_mul(2));
        // base + (j - jitter), floored at zero
        base.saturating_add(j).saturating_sub(jitter)
    };
    Duration::from_micros(us)
}

async fn read_side<R: AsyncRead + Unpin>(
    mut src: R,
    tx: mpsc::Sender<Chunk>,
    toxics: watch::Receiver<Toxics>,
    dir: &'static str,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut rng = StdRng::from_entropy();
    let mut prev = Instant::now();
    loop {
        let read = src.read(&mut buf).await;
        let arrival = Instant::now();
        let t = *toxics.borrow();
        let deliver = (arrival + delay(&t, &mut rng)).max(prev);
        prev = deliver;
        let chunk = match read {
            Ok(0) => {
                let _ = tx.send(Chunk::Eof { deliver }).await;
                return Ok(());
            }
            Ok(n) => Chunk::Data {
                deliver,
                data: Bytes::copy_from_slice(&buf[..n]),
            },
            Err(e) => {
                debug!(dir, error = %e, "read failed; passing on a reset");
                let _ = tx.send(Chunk::Reset { deliver }).await;
                return Ok(());
            }
        };
        if tx.send(chunk).await.is_err() {
            // The writer failed: stop reading; the connection is reset
            // once the other direction ends.
            return Ok(());
        }
    }
}

/// `Ok(true)`: everything delivered and the write half shut down;
/// `Ok(false)`: a write failed; `Err`: a reset is due now.
async fn write_side<W: AsyncWrite + Unpin>(
    mut dst: W,
    mut rx: mpsc::Receiver<Chunk>,
    toxics: watch::Receiver<Toxics>,
    dir: &'static str,
) -> io::Result<bool> {
    let mut bucket = TokenBucket::new();
    while let Some(chunk) = rx.recv().await {
        match chunk {
            Chunk::Data { deliver, data } => {
                tokio::time::sleep_until(deliver).await;
                bucket.take(data.len(), &toxics).await;
                if let Err(e) = dst.write_all(&data).await {
                    debug!(dir, error = %e, "write failed");
                    return Ok(false);
                }
            }
            Chunk::Eof { deliver } => {
                tokio::time::sleep_until(deliver).await;
                break;
            }
            Chunk::Reset { deliver } => {
                tokio::time::sleep_until(deliver).await;
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("{dir}: source reset"),
                ));
            }
        }
    }
    if let Err(e) = dst.shutdown().await {
        debug!(dir, error = %e, "shutdown failed");
        return Ok(false);
    }
    Ok(true)
}

/// Bytes per second with a burst of one chunk; the rate is re-read while
/// waiting so a change (or `Some(0)`, a stall) takes effect at once.
struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    const BURST: f64 = CHUNK_BYTES as f64;

    fn new() -> Self {
        TokenBucket {
            tokens: Self::BURST,
            last: Instant::now(),
        }
    }

    async fn take(&mut self, n: usize, toxics: &watch::Receiver<Toxics>) {
        let need = (n as f64).min(Self::BURST);
        loop {
            let now = Instant::now();
            let limit = toxics.borrow().bandwidth_bytes_per_sec;
            let Some(rate) = limit else {
                self.tokens = Self::BURST;
                self.last = now;
                return;
            };
            let rate = rate as f64;
            self.tokens =
                (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(Self::BURST);
            self.last = now;
            if self.tokens >= need {
                self.tokens -= need;
                return;
            }
            let wait = if rate > 0.0 {
                Duration::from_secs_f64((need - self.tokens) / rate).min(CONTROL_POLL)
            } else {
                CONTROL_POLL
            };
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::RngCore;
    use std::time::Instant as StdInstant;

    const LOCAL: &str = "127.0.0.1:0";

    /// An upstream that echoes every connection until EOF, then shuts down.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind(LOCAL).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        addr
    }

    /// An upstream that reads to EOF, then answers the byte count (u64 BE).
    async fn sink_server() -> SocketAddr {
        let l = TcpListener::bind(LOCAL).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut n = 0u64;
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k as u64,
                        }
                    }
                    let _ = s.write_all(&n.to_be_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        addr
    }

    /// A proxy in front of `upstream`, its toxics set through the sender.
    async fn proxy(upstream: SocketAddr, toxics: Toxics) -> (SocketAddr, watch::Sender<Toxics>) {
        let l = TcpListener::bind(LOCAL).await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = watch::channel(toxics);
        tokio::spawn(serve(l, upstream, rx, 16));
        (addr, tx)
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }

    #[tokio::test]
    async fn proxy_passes_bytes_intact_both_ways_with_half_close() {
        let (addr, _tx) = proxy(echo_server().await, Toxics::default()).await;
        let mut data = vec![0u8; 1 << 20];
        rand::thread_rng().fill_bytes(&mut data);
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        // Ends only if the client's FIN went through and the echo's came back.
        tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut back))
            .await
            .expect("echo did not finish")
            .unwrap();
        writer.await.unwrap();
        assert_eq!(back.len(), data.len());
        assert!(back == data, "bytes differ");
    }

    #[tokio::test]
    async fn proxy_latency_delays_each_direction_and_keeps_order_under_jitter() {
        let toxics = Toxics {
            latency_ms: 200,
            ..Toxics::default()
        };
        let (addr, tx) = proxy(echo_server().await, toxics).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let start = StdInstant::now();
        round_trip(&mut s, b"ping").await;
        let rtt = start.elapsed();
        // 200 ms each way.
        assert!(rtt >= Duration::from_millis(400), "round trip took {rtt:?}");

        tx.send_replace(Toxics {
            latency_ms: 20,
            jitter_ms: 20,
            ..Toxics::default()
        });
        let (mut r, mut w) = s.into_split();
        let writer = tokio::spawn(async move {
            let mut all = Vec::new();
            for i in 0u32..200 {
                let msg = format!("{i:05};");
                w.write_all(msg.as_bytes()).await.unwrap();
                all.extend_from_slice(msg.as_bytes());
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            w.shutdown().await.unwrap();
            all
        });
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut back))
            .await
            .expect("echo did not finish")
            .unwrap();
        let sent = writer.await.unwrap();
        assert_eq!(
            String::from_utf8(back).unwrap(),
            String::from_utf8(sent).unwrap()
        );
    }

    #[tokio::test]
    async fn proxy_bandwidth_limits_each_direction() {
        let toxics = Toxics {
            bandwidth_bytes_per_sec: Some(256 * 1024),
            ..Toxics::default()
        };
        let (addr, _tx) = proxy(sink_server().await, toxics).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let data = vec![7u8; 256 * 1024];
        let start = StdInstant::now();
        s.write_all(&data).await.unwrap();
        s.shutdown().await.unwrap();
        let mut count = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut count))
            .await
            .expect("sink did not answer")
            .unwrap();
        let took = start.elapsed();
        assert_eq!(count, (data.len() as u64).to_be_bytes());
        // 16 KiB burst, then 240 KiB at 256 KiB/s: ~0.94 s.
        assert!(took >= Duration::from_millis(750), "took {took:?}");
    }

    async fn assert_reset(s: &mut TcpStream) {
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("not reset");
        match r {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("read {n} bytes, expected a reset"),
        }
    }

    #[tokio::test]
    async fn proxy_down_resets_and_refuses_until_up() {
        let (addr, tx) = proxy(echo_server().await, Toxics::default()).await;
        let mut open = TcpStream::connect(addr).await.unwrap();
        round_trip(&mut open, b"hello").await;

        tx.send_replace(Toxics {
            down: true,
            ..Toxics::default()
        });
        assert_reset(&mut open).await;

        // The kernel completes the handshake; the proxy then resets it.
        let mut refused = TcpStream::connect(addr).await.unwrap();
        assert_reset(&mut refused).await;

        tx.send_replace(Toxics::default());
        let mut again = TcpStream::connect(addr).await.unwrap();
        round_trip(&mut again, b"back").await;
    }

    #[tokio::test]
    async fn proxy_control_file_changes_reach_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toxics.json");
        // Missing file: a clean link.
        let mut rx = watch_control(path.clone());
        assert_eq!(*rx.borrow_and_update(), Toxics::default());

        let slow = Toxics {
            latency_ms: 150,
            jitter_ms: 10,
            bandwidth_bytes_per_sec: Some(1 << 20),
            down: false,
        };
        write_control(&path, &slow).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("change not seen")
            .unwrap();
        assert_eq!(*rx.borrow_and_update(), slow);

        // Two rewrites in quick succession, the same length: the last wins.
        let a = Toxics {
            latency_ms: 111,
            ..slow
        };
        let b = Toxics {
            latency_ms: 222,
            ..slow
        };
        write_control(&path, &a).unwrap();
        write_control(&path, &b).unwrap();
        let deadline = StdInstant::now() + Duration::from_secs(5);
        while *rx.borrow_and_update() != b {
            assert!(StdInstant::now() < deadline, "last write not seen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Garbage, then a missing file: the previous value stands.
        std::fs::write(&path, b"{not json").unwrap();
        tokio::time::sleep(CONTROL_POLL * 3).await;
        assert_eq!(*rx.borrow(), b);
        std::fs::remove_file(&path).unwrap();
        tokio::time::sleep(CONTROL_POLL * 3).await;
        assert_eq!(*rx.borrow(), b);

        // Partial JSON: the rest defaults.
        std::fs::write(&path, br#"{"down":true}"#).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("change not seen")
            .unwrap();
        assert_eq!(
            *rx.borrow(),
            Toxics {
                down: true,
                ..Toxics::default()
            }
        );
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
