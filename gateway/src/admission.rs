//! Admission control and the gateway's buffer budgets (pure accounting, RAII
//! guards; no I/O).
//!
//! * [`InflightLimiter`] counts admitted requests against
//!   `max_inflight_requests`. It is checked at the hyper service layer,
//!   before s3s sees the request or a byte of its body is read; past the
//!   limit the request is answered `503 SlowDown` at once (see
//!   `crate::server`). The [`InflightGuard`] lives until the response body
//!   has been sent.
//! * [`BufferBudget`] is one gateway-wide byte budget on a FIFO-fair
//!   `tokio::sync::Semaphore`: the write path takes a [`BufferPermit`] for a
//!   stripe *before* it reads that stripe from the request body, so a
//!   request waiting for buffer space does not read its socket (TCP pushes
//!   back on the client) and holds no user-space bytes beyond the body chunk
//!   it had already received. A wait longer than `stall_timeout` fails with
//!   [`BufferError::Stalled`] (`503 SlowDown`, reason `stall`). The read path
//!   draws from a second budget the same way.
//!
//! # Memory formula (bytes)
//!
//! With `S = (k + m) * block_size` (one stripe: k data blocks plus the m
//! parity blocks encoded from them):
//!
//! * **write buffers ≤ `buffer_budget_bytes`**: every stripe of every upload
//!   holds a permit of `(k + m) * block_len` bytes (`S` for a full stripe;
//!   less for a short stripe of a body of known length) from before its
//!   payload is read until HTTP/2 has written the last of its `k + m` blocks
//!   to a datanode's socket (or dropped it: shard failed, stream reset).
//!   That covers the stripe buffer, its parity blocks, the blocks queued in
//!   the shard channels, those waiting for datanode credit and those queued
//!   in HTTP/2: blocks are never copied on their way (see
//!   `crate::blob::write`), so a permit's bytes are exactly the bytes it
//!   keeps alive. Full-stripe buffers kept for reuse between stripes are
//!   kept only inside the budget's unused bytes (`crate::blob` trims them
//!   after every new write permit), so they add nothing to this bound.
//! * **read buffers ≤ `read_budget_bytes`**: a stripe being fetched holds
//!   `(k + m) * block_len` (room to reconstruct from parity); once decoded it
//!   keeps `k * block_len` until every chunk cut from it has been written to
//!   the client and dropped by hyper.
//! * **outside the budgets, each bounded by a constant**:
//!   - per client connection: hyper's first read buffer and response-head
//!     buffer (`CONNECTION_STATE_BYTES`, 16 KiB, however little it sends);
//!     its HTTP/1 read buffer grows to at most
//!     `HTTP1_MAX_BUF_BYTES` (64 KiB), and while it uploads the body chunk
//!     being cut into stripes (a slice of an earlier read buffer, at most as
//!     large); HTTP/2 client connections: their receive windows
//!     (`HTTP2_CONNECTION_WINDOW_BYTES`, 1 MiB). See `crate::server`.
//!     Connections served at once ≤ `max_connections` (default 1024);
//!     HTTP/2 is off unless `http2 = true`. Connections that have not sent
//!     their first byte yet ≤ `max_pending_connections` (default 4096),
//!     each a socket and a small task without buffers (see
//!     `crate::listener`).
//!   - per request with a signed `aws-chunked` body: one chunk, which s3s
//!     holds whole to check its signature (clients that sign chunks send
//!     64-128 KiB); a larger chunk than `max_aws_chunk_bytes` (default
//!     16 MiB) is refused before its data is read. Unsigned chunks are re-framed to at most 64 KiB
//!     (`crate::aws_chunked`).
//!   - per open `GetShard` stream: unread read-ahead, at most
//!     `STREAM_WINDOW_BYTES` (256 KiB + 64 B, one default block's
//!     message; see `crate::datanodes`).
//!   - per block piece a GET holds: the h2 read buffer the piece was cut
//!     from, which it keeps alive (h2 reads a connection's frames, at most
//!     `MAX_FRAME_BYTES` each, into one buffer of 8 KiB doubling to at
//!     most 256 KiB); beyond the piece's own bytes, up to 256 KiB.
//!   - per request: its task, HTTP/2 stream state and digests (a few KiB).
//!
//! So:
//!
//! ```text
//! gateway RSS ≤ base + buffer_budget_bytes + read_budget_bytes
//!             + 16 KiB × connections served (≤ max_connections)
//!             + 2 × 64 KiB × uploading connections (≤ max_inflight_requests)
//!             + (256 KiB + 64 B) × open GetShard streams
//!             + 256 KiB × block pieces held by GETs + allocator overhead
//! ```
//!
//! Under the soak's overload shape, with glibc tuned as
//! `sluice/src/malloc.rs` says, the gateway's peak above `base + budgets`
//! stays inside the connection terms above (figures in bench/RESULTS.md).
//!
//! # Deadlock freedom
//!
//! A request that waits — for a buffer or for datanode credit — holds at
//! most the stripes it has already read (each with its permit), never a
//! partial claim on the next one: a stripe's permit is taken whole, and
//! only after the previous stripe was handed to the shard channels. Credit
//! waits are bounded by `stall_timeout` too. Datanode credit is re-granted
//! when the datanode fsyncs received bytes, which does not depend on any
//! request completing or on any gateway buffer, so blocks waiting for credit
//! always move eventually; their permits then come back and the FIFO budget
//! serves the next waiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics;

/// Live counters of the gateway's admission and budgets, shared with
/// whoever holds a clone (tests read the high-water marks). Cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct GatewayStats {
    inner: Arc<StatsInner>,
}

#[derive(Default, Debug)]
struct StatsInner {
    write: Usage,
    read: Usage,
    inflight: AtomicU64,
    inflight_high_water: AtomicU64,
    inflight_rejected: AtomicU64,
}

/// Byte usage of one budget.
#[derive(Default, Debug)]
struct Usage {
    in_use: AtomicU64,
    high_water: AtomicU64,
    waiting: AtomicU64,
}

impl GatewayStats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn usage(&self, kind: BudgetKind) -> &Usage {
        match kind {
            BudgetKind::Write => &self.inner.write,
            BudgetKind::Read => &self.inner.read,
        }
    }

    /// Write-path buffer bytes held right now.
    pub fn buffer_in_use(&self) -> u64 {
        self.inner.write.in_use.load(Ordering::Acquire)
    }

    /// Most write-path buffer bytes ever held at once.
    pub fn buffer_high_water(&self) -> u64 {
        self.inner.write.high_water.load(Ordering::Acquire)
    }

    /// Requests waiting for a write buffer right now.
    pub fn buffer_waiting(&self) -> u64 {
        self.inner.write.waiting.load(Ordering::Acquire)
    }

    /// Read-path buffer bytes held right now.
    pub fn read_in_use(&self) -> u64 {
        self.inner.read.in_use.load(Ordering::Acquire)
    }

    /// Most read-path buffer bytes ever held at once.
    pub fn read_high_water(&self) -> u64 {
        self.inner.read.high_water.load(Ordering::Acquire)
    }

    /// Requests admitted and not finished right now.
    pub fn inflight(&self) -> u64 {
        self.inner.inflight.load(Ordering::Acquire)
    }

    /// Most requests ever admitted at once.
    pub fn inflight_high_water(&self) -> u64 {
        self.inner.inflight_high_water.load(Ordering::Acquire)
    }

    /// Requests refused because `max_inflight_requests` were in flight.
    pub fn inflight_rejected(&self) -> u64 {
        self.inner.inflight_rejected.load(Ordering::Acquire)
    }
}

/// Counts admitted requests against a maximum.
#[derive(Debug)]
pub struct InflightLimiter {
    max: u64,
    stats: GatewayStats,
}

impl InflightLimiter {
    /// A limiter admitting at most `max` requests at once (at least 1).
    pub fn new(max: usize, stats: GatewayStats) -> Arc<Self> {
        Arc::new(InflightLimiter {
            max: (max as u64).max(1),
            stats,
        })
    }

    /// The configured maximum.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Admits one request, or `None` (counted as rejected) when `max` are
    /// already in flight. Never waits.
    pub fn try_acquire(self: &Arc<Self>) -> Option<InflightGuard> {
        let counter = &self.stats.inner.inflight;
        let admitted = counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok();
        match admitted {
            Some(before) => {
                self.stats
                    .inner
                    .inflight_high_water
                    .fetch_max(before + 1, Ordering::AcqRel);
                ::metrics::gauge!(metrics::INFLIGHT_REQUESTS).increment(1.0);
                Some(InflightGuard {
                    limiter: Arc::clone(self),
                })
            }
            None => {
                self.stats
                    .inner
                    .inflight_rejected
                    .fetch_add(1, Ordering::AcqRel);
                None
            }
        }
    }
}

/// One admitted request; dropping it frees the slot.
#[derive(Debug)]
pub struct InflightGuard {
    limiter: Arc<InflightLimiter>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.limiter
            .stats
            .inner
            .inflight
            .fetch_sub(1, Ordering::AcqRel);
        ::metrics::gauge!(metrics::INFLIGHT_REQUESTS).decrement(1.0);
    }
}

/// Which budget a [`BufferBudget`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetKind {
    /// Upload stripes and shard blocks (`buffer_budget_bytes`).
    Write,
    /// Decoded stripes of reads (`read_budget_bytes`).
    Read,
}

impl BudgetKind {
    fn in_use_metric(self) -> &'static str {
        match self {
            BudgetKind::Write => metrics::BUFFER_BYTES_IN_USE,
            BudgetKind::Read => metrics::READ_BUFFER_BYTES_IN_USE,
        }
    }

    fn waiting_metric(self) -> &'static str {
        match self {
            BudgetKind::Write => metrics::BUFFER_WAITING_REQUESTS,
            BudgetKind::Read => metrics::READ_BUFFER_WAITING_REQUESTS,
        }
    }

    fn budget_metric(self) -> &'static str {
        match self {
            BudgetKind::Write => metrics::BUFFER_BUDGET_BYTES,
            BudgetKind::Read => metrics::READ_BUFFER_BUDGET_BYTES,
        }
    }
}

/// Why no buffer was obtained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    /// Waited `stall_timeout` without the budget freeing enough bytes.
    #[error("no buffer space within {0:?}")]
    Stalled(Duration),
    /// More bytes than the whole budget (a configuration error; `validate`
    /// rejects budgets smaller than a stripe).
    #[error("{bytes} bytes requested from a budget of {budget}")]
    TooLarge { bytes: u64, budget: u64 },
}

/// A gateway-wide byte budget with FIFO waiters (see the module docs).
#[derive(Debug)]
pub struct BufferBudget {
    kind: BudgetKind,
    budget: u64,
    sem: Arc<Semaphore>,
    stats: GatewayStats,
}

impl BufferBudget {
    /// A budget of `budget` bytes (at most [`crate::config::MAX_BUDGET_BYTES`]).
    pub fn new(kind: BudgetKind, budget: u64, stats: GatewayStats) -> Arc<Self> {
        let permits = usize::try_from(budget)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        ::metrics::gauge!(kind.budget_metric()).set(budget as f64);
        Arc::new(BufferBudget {
            kind,
            budget: permits as u64,
            sem: Arc::new(Semaphore::new(permits)),
            stats,
        })
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes not held by any permit.
    pub fn available(&self) -> u64 {
        self.sem.available_permits() as u64
    }

    fn check(&self, bytes: u64) -> Result<u32, BufferError> {
        u32::try_from(bytes)
            .ok()
            .filter(|_| bytes <= self.budget)
            .ok_or(BufferError::TooLarge {
                bytes,
                budget: self.budget,
            })
    }

    /// Takes `bytes` without waiting, or `None` when they are not free or
    /// someone is already waiting (FIFO: no overtaking).
    pub fn try_acquire(self: &Arc<Self>, bytes: u64) -> Option<BufferPermit> {
        let n = self.check(bytes).ok()?;
        let permit = Arc::clone(&self.sem).try_acquire_many_owned(n).ok()?;
        Some(self.held(permit, bytes))
    }

    /// Takes `bytes`, waiting in FIFO order behind earlier callers for at
    /// most `stall`. Errors: [`BufferError::Stalled`] after `stall`,
    /// [`BufferError::TooLarge`] when `bytes` exceeds the budget.
    pub async fn acquire(
        self: &Arc<Self>,
        bytes: u64,
        stall: Duration,
    ) -> Result<BufferPermit, BufferError> {
        let n = self.check(bytes)?;
        if let Ok(permit) = Arc::clone(&self.sem).try_acquire_many_owned(n) {
            return Ok(self.held(permit, bytes));
        }
        let _waiting = Waiting::new(self);
        match tokio::time::timeout(stall, Arc::clone(&self.sem).acquire_many_owned(n)).await {
            Ok(Ok(permit)) => Ok(self.held(permit, bytes)),
            // The semaphore is never closed; treat it as a stall.
            Ok(Err(_)) | Err(_) => Err(BufferError::Stalled(stall)),
        }
    }

    fn held(self: &Arc<Self>, permit: OwnedSemaphorePermit, bytes: u64) -> BufferPermit {
        let usage = self.stats.usage(self.kind);
        let now = usage.in_use.fetch_add(bytes, Ordering::AcqRel) + bytes;
        usage.high_water.fetch_max(now, Ordering::AcqRel);
        ::metrics::gauge!(self.kind.in_use_metric()).increment(bytes as f64);
        BufferPermit {
            budget: Arc::clone(self),
            permit: Some(permit),
            bytes,
        }
    }
}

/// Counts one request waiting for a budget while it lives.
struct Waiting<'a> {
    budget: &'a BufferBudget,
}

impl<'a> Waiting<'a> {
    fn new(budget: &'a BufferBudget) -> Self {
        budget
            .stats
            .usage(budget.kind)
            .waiting
            .fetch_add(1, Ordering::AcqRel);
        ::metrics::gauge!(budget.kind.waiting_metric()).increment(1.0);
        Waiting { budget }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let kind = self.budget.kind;
        self.budget
            .stats
            .usage(kind)
            .waiting
            .fetch_sub(1, Ordering::AcqRel);
        ::metrics::gauge!(kind.waiting_metric()).decrement(1.0);
    }
}

/// `data` as a `Bytes` that keeps `permit` (the budget bytes that account
/// for it) alive until the last slice of it is dropped — by hyper or HTTP/2
/// once written to the socket, or with a reset stream. The one way the
/// gateway ties a buffer's lifetime to its budget: a block sent to a
/// datanode (the stripe's write permit) and a chunk sent to a client (the
/// stripe's read permit) are never copied and never outlive their permit.
pub fn held(data: Bytes, permit: &Arc<BufferPermit>) -> Bytes {
    Bytes::from_owner(Held {
        data,
        _permit: Arc::clone(permit),
    })
}

/// See [`held`].
struct Held {
    data: Bytes,
    _permit: Arc<BufferPermit>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Bytes held from a [`BufferBudget`]; dropping the permit gives them back.
#[derive(Debug)]
pub struct BufferPermit {
    budget: Arc<BufferBudget>,
    /// `None` only inside `drop`.
    permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
}

impl BufferPermit {
    /// Bytes this permit holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves `bytes` of this permit into a new one (to give part back
    /// early); `None` if it holds fewer.
    pub fn split(&mut self, bytes: u64) -> Option<BufferPermit> {
        if bytes > self.bytes {
            return None;
        }
        let n = usize::try_from(bytes).ok()?;
        let part = self.permit.as_mut()?.split(n)?;
        self.bytes -= bytes;
        Some(BufferPermit {
            budget: Arc::clone(&self.budget),
            permit: Some(part),
            bytes,
        })
    }
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        // Uncount first, then release: `in_use` never exceeds the budget,
        // even transiently.
        let kind = self.budget.kind;
        self.budget
            .stats
            .usage(kind)
            .in_use
            .fetch_sub(self.bytes, Ordering::AcqRel);
        ::metrics::gauge!(kind.in_use_metric()).decrement(self.bytes as f64);
        drop(self.permit.take());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::sync::mpsc;

    use super::*;

    #[test]
    fn inflight_limit_rejects_past_max_and_guards_release_on_drop() {
        let stats = GatewayStats::new();
        let limiter = InflightLimiter::new(2, stats.clone());
        let a = limiter.try_acquire().expect("first");
        let b = limiter.try_acquire().expect("second");
        assert_eq!(stats.inflight(), 2);
        assert!(limiter.try_acquire().is_none(), "third is past the max");
        assert_eq!(stats.inflight_rejected(), 1);
        drop(a);
        assert_eq!(stats.inflight(), 1);
        let c = limiter.try_acquire().expect("a slot is free again");
        drop((b, c));
        assert_eq!(stats.inflight(), 0);
        assert_eq!(stats.inflight_high_water(), 2);
        assert_eq!(stats.inflight_rejected(), 1);
    }

    #[tokio::test]
    async fn permits_count_bytes_and_release_on_drop() {
        let stats = GatewayStats::new();
        let budget = BufferBudget::new(BudgetKind::Write, 100, stats.clone());
        let a = budget
            .acquire(60, Duration::from_secs(1))
            .await
            .expect("60 of 100");
        let mut b = budget.try_acquire(40).expect("40 of the 40 left");
        assert_eq!((stats.buffer_in_use(), budget.available()), (100, 0));
        assert!(budget.try_acquire(1).is_none());
        let part = b.split(30).expect("split 30 of 40");
        assert_eq!((b.bytes(), part.bytes()), (10, 30));
        assert!(b.split(11).is_none());
        drop(part);
        assert_eq!((stats.buffer_in_use(), budget.available()), (70, 30));
        drop((a, b));
        assert_eq!((stats.buffer_in_use(), budget.available()), (0, 100));
        assert_eq!(stats.buffer_high_water(), 100);
        assert_eq!(stats.read_in_use(), 0, "the read budget is separate");
        assert_eq!(
            budget.acquire(101, Duration::from_secs(1)).await.err(),
            Some(BufferError::TooLarge {
                bytes: 101,
                budget: 100
            })
        );
    }

    #[tokio::test]
    async fn stall_timeout_fails_the_wait() {
        let stats = GatewayStats::new();
        let budget = BufferBudget::new(BudgetKind::Read, 10, stats.clone());
        let held = budget.try_acquire(10).expect("all of it");
        let stall = Duration::from_millis(50);
        let started = Instant::now();
        let err = budget
            .acquire(1, stall)
            .await
            .expect_err("nothing frees up");
        assert_eq!(err, BufferError::Stalled(stall));
        assert!(started.elapsed() >= stall, "{:?}", started.elapsed());
        assert_eq!(stats.read_in_use(), 10);
        drop(held);
        assert_eq!(stats.read_in_use(), 0);
        assert_eq!(budget.available(), 10, "the stalled wait took nothing");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_are_served_in_fifo_order() {
        let stats = GatewayStats::new();
        let budget = BufferBudget::new(BudgetKind::Write, 4, stats.clone());
        let mut held: Vec<BufferPermit> = (0..4)
            .map(|_| budget.try_acquire(1).expect("1 byte"))
            .collect();
        let (done_tx, mut done_rx) = mpsc::channel(8);
        let mut tasks = Vec::new();
        // Waiter 0 wants 2 bytes, waiters 1 and 2 one byte each.
        for (i, bytes) in [(0u32, 2u64), (1, 1), (2, 1)] {
            let budget = Arc::clone(&budget);
            let done = done_tx.clone();
            tasks.push(tokio::spawn(async move {
                let permit = budget
                    .acquire(bytes, Duration::from_secs(10))
                    .await
                    .expect("served");
                done.send(i).await.expect("report");
                permit
            }));
            // Each waiter is queued before the next one starts.
            let want = u64::from(i) + 1;
            let deadline = Instant::now() + Duration::from_secs(10);
            while stats.buffer_waiting() < want {
                assert!(Instant::now() < deadline, "waiter {i} never queued");
                tokio::task::yield_now().await;
            }
        }
        async fn next(rx: &mut mpsc::Receiver<u32>) -> u32 {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a waiter is served in time")
                .expect("senders alive")
        }
        // One byte back: waiter 1 could use it, but waiter 0 is first.
        held.pop();
        // The second byte completes waiter 0, and only then 1 and 2 go.
        held.pop();
        assert_eq!(next(&mut done_rx).await, 0, "waiter 0 first");
        assert!(done_rx.try_recv().is_err(), "nobody overtook waiter 0");
        held.pop();
        assert_eq!(next(&mut done_rx).await, 1);
        held.pop();
        assert_eq!(next(&mut done_rx).await, 2);
        let mut permits = Vec::new();
        for t in tasks {
            permits.push(t.await.expect("task"));
        }
        assert_eq!(stats.buffer_in_use(), 4);
        assert_eq!(stats.buffer_waiting(), 0);
        drop(permits);
        assert_eq!(stats.buffer_in_use(), 0);
        assert_eq!(stats.buffer_high_water(), 4);
    }
}
