//! The network cluster gRPC runs on: TCP, or an in-process memory network
//! for tests ([`MemNet`]) on which the real meta, datanode and gateway code
//! talk without sockets.
//!
//! A node listens on a [`Listener`] and dials with a [`crate::Transport`];
//! a node listening on a [`MemNet`] dials on the same net
//! ([`crate::Transport::Memory`]). A connection on a memory net is a
//! [`tokio::io::duplex`] pipe carrying the same HTTP/2 that TCP carries,
//! so tonic's client and server, flow control included, run unchanged;
//! what differs is the absence of TLS (a memory net behaves like
//! `insecure_cluster = true`) and of peer socket addresses.
//!
//! Faults: every server a node builds on a memory net runs
//! [`crate::faults::FaultLayer`] with the net's [`MemNet::faults`], so a
//! test can fail, delay or swallow the answer of chosen RPCs on chosen
//! nodes (see [`crate::faults`]).
//!
//! Bounds: each listener queues at most [`ACCEPT_BACKLOG`] connections
//! not yet accepted (a dial past it waits, as TCP's backlog makes it);
//! each connection buffers at most [`PIPE_BYTES`] per direction.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::faults::Faults;

/// Connections a [`MemListener`] holds before its server accepts them.
pub const ACCEPT_BACKLOG: usize = 64;

/// Bytes a memory connection buffers in each direction before the writer
/// waits for the reader (the role of a socket's buffers; HTTP/2 flow
/// control bounds what is in flight above it).
pub const PIPE_BYTES: usize = 256 * 1024;

/// An in-process network: addresses (`host:port`, any text) bound by
/// [`MemNet::listen`] and dialed by [`crate::Transport::Memory`].
/// Cloning shares the net.
#[derive(Clone, Default)]
pub struct MemNet {
    inner: Arc<NetInner>,
}

#[derive(Default)]
struct NetInner {
    /// Bound address -> its listener's accept queue; one entry per
    /// listener, removed when a listener with the same address replaces a
    /// dropped one.
    listeners: Mutex<HashMap<String, mpsc::Sender<DuplexStream>>>,
    faults: Arc<Faults>,
}

impl std::fmt::Debug for MemNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound: Vec<String> = self
            .inner
            .listeners
            .lock()
            .expect("mem net lock")
            .keys()
            .cloned()
            .collect();
        f.debug_struct("MemNet").field("bound", &bound).finish()
    }
}

/// `addr` without its scheme and path: the key a listener is bound under
/// (`http://meta-1:7001/` and `meta-1:7001` name the same listener).
fn authority(addr: &str) -> &str {
    let rest = addr
        .strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr);
    rest.split('/').next().unwrap_or(rest)
}

impl MemNet {
    /// An empty net.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `addr`. Errors with `AddrInUse` while another listener of
    /// this net holds it (a dropped listener frees its address).
    pub fn listen(&self, addr: &str) -> io::Result<MemListener> {
        let key = authority(addr).to_string();
        let mut listeners = self.inner.listeners.lock().expect("mem net lock");
        if listeners.get(&key).is_some_and(|tx| !tx.is_closed()) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{key} is bound on this memory net"),
            ));
        }
        let (tx, rx) = mpsc::channel(ACCEPT_BACKLOG);
        listeners.insert(key.clone(), tx);
        Ok(MemListener {
            addr: key,
            net: self.clone(),
            accept: rx,
        })
    }

    /// The faults every server on this net applies.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.inner.faults
    }

    /// Opens a connection to the listener bound at `addr`: `ConnectionRefused`
    /// when none is (or it was dropped).
    pub async fn dial(&self, addr: &str) -> io::Result<DuplexStream> {
        let key = authority(addr);
        let tx = self
            .inner
            .listeners
            .lock()
            .expect("mem net lock")
            .get(key)
            .cloned();
        let refused = || {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nothing listens on {key} on this memory net"),
            )
        };
        let tx = tx.ok_or_else(refused)?;
        let (client, server) = tokio::io::duplex(PIPE_BYTES);
        tx.send(server).await.map_err(|_| refused())?;
        Ok(client)
    }

    /// The connector tonic's endpoints dial this net with.
    pub fn connector(&self) -> MemConnector {
        MemConnector { net: self.clone() }
    }
}

/// A bound address on a [`MemNet`]; dropping it refuses further dials.
pub struct MemListener {
    addr: String,
    net: MemNet,
    accept: mpsc::Receiver<DuplexStream>,
}

impl MemListener {
    /// The address this listener is bound at (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The net it listens on.
    pub fn net(&self) -> &MemNet {
        &self.net
    }
}

/// [`tower::Service`] over URIs that dials a [`MemNet`] (for tonic's
/// `Endpoint::connect_with_connector`).
#[derive(Clone)]
pub struct MemConnector {
    net: MemNet,
}

impl tower::Service<Uri> for MemConnector {
    type Response = TokioIo<DuplexStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let net = self.net.clone();
        Box::pin(async move {
            let authority = uri.authority().map(|a| a.as_str().to_string());
            let addr = authority.ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} has no host"))
            })?;
            net.dial(&addr).await.map(TokioIo::new)
        })
    }
}

/// Where a node's gRPC server accepts connections.
pub enum Listener {
    /// A bound TCP socket (deployments, and tests that need real sockets).
    Tcp(TcpListener),
    /// An address on an in-process [`MemNet`].
    Memory(MemListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

impl From<MemListener> for Listener {
    fn from(l: MemListener) -> Self {
        Listener::Memory(l)
    }
}

impl Listener {
    /// The bound address, for logs.
    pub fn local_addr(&self) -> Option<String> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok().map(|a| a.to_string()),
            Listener::Memory(l) => Some(format!("mem://{}", l.addr)),
        }
    }

    /// The memory net this listener is on, if any.
    pub fn mem_net(&self) -> Option<&MemNet> {
        match self {
            Listener::Tcp(_) => None,
            Listener::Memory(l) => Some(&l.net),
        }
    }

    /// The accepted connections, for tonic's `serve_with_incoming`. TCP
    /// connections get `TCP_NODELAY` (tonic sets it only on listeners it
    /// binds itself: without it a response of more than one segment waits
    /// for the peer's delayed ACK, ~40 ms).
    pub fn incoming(self) -> Incoming {
        Incoming(self)
    }
}

/// The stream of a [`Listener`]'s connections.
pub struct Incoming(Listener);

impl Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match &mut self.get_mut().0 {
            Listener::Tcp(l) => match l.poll_accept(cx) {
                Poll::Ready(Ok((stream, _))) => {
                    let _ = stream.set_nodelay(true);
                    Poll::Ready(Some(Ok(Conn::Tcp(stream))))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
                Poll::Pending => Poll::Pending,
            },
            Listener::Memory(l) => l
                .accept
                .poll_recv(cx)
                .map(|c| c.map(|c| Ok(Conn::Memory(c)))),
        }
    }
}

/// One accepted connection.
pub enum Conn {
    /// A TCP connection.
    Tcp(TcpStream),
    /// The server end of a memory-net pipe.
    Memory(DuplexStream),
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    /// The socket addresses of a TCP connection; none for a memory pipe.
    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Tcp(s) => s.connect_info(),
            Conn::Memory(_) => TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tcp(s) => s.is_write_vectored(),
            Conn::Memory(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_dial_reaches_the_listener_bound_at_its_address() {
        let net = MemNet::new();
        let listener = net.listen("http://meta-1:7001").unwrap();
        assert_eq!(listener.addr(), "meta-1:7001");
        assert_eq!(
            net.listen("meta-1:7001").err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        let mut incoming = Listener::from(listener).incoming();
        let mut client = net.dial("meta-1:7001/ignored").await.unwrap();
        let Some(Ok(Conn::Memory(mut server))) = incoming.next().await else {
            panic!("no memory connection accepted");
        };
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        assert_eq!(
            net.dial("meta-2:7001").await.err().map(|e| e.kind()),
            Some(io::ErrorKind::ConnectionRefused)
        );
        drop(incoming);
        assert_eq!(
            net.dial("meta-1:7001").await.err().map(|e| e.kind()),
            Some(io::ErrorKind::ConnectionRefused)
        );
        // A dropped listener's address can be bound again.
        net.listen("meta-1:7001").unwrap();
    }
}
