//! Datanode byte credits, the gateway's side of the protocol specified in
//! [`sluice_proto::credit`] (read its module docs for the contract).
//!
//! * One [`NodeCredit`] per datanode written to, created on first use, with
//!   one long-lived task that keeps a `Credits` stream open (reconnecting
//!   with backoff), adds every grant to the local [`Balance`], reports
//!   demand and returns idle credit through `ReportCredits` — at most one
//!   report in flight per datanode.
//! * Before a shard block goes on the wire to a datanode, the shard stream
//!   calls [`NodeCredit::debit`] for the block's length: it returns at once
//!   if the balance covers it and nobody waits before it, else it queues
//!   (FIFO), which registers demand; the wait is bounded by `stall_timeout`.
//!   Waiting is the backpressure: the shard channel fills, the upload stops
//!   reading its body, TCP pushes back on the client.
//! * Demand reported is `bytes awaited - balance + prefetch` (prefetch = a
//!   couple of blocks, so a stream does not stop at every block); it is
//!   re-reported only when it grows past what the datanode still has on
//!   record. Credit unused for `credit_idle_timeout` goes back with
//!   `returned_bytes`, together with `wanted_bytes = 0`.
//! * A broken stream forfeits the whole balance (the datanode has taken it
//!   back already); queued debits keep waiting for the next stream. A
//!   failed report that carried returned bytes resets the stream, so the
//!   datanode reclaims everything rather than leaking what we gave up.
//!
//! [`Balance`] is the pure accounting (no I/O, no clock of its own) and is
//! unit-tested; [`NodeCredit`] wraps it in a mutex with one-shot wake-ups.
//!
//! Credits recycle when datanodes fsync, independently of any request
//! completing, so a request waiting for credit always gets it eventually or
//! fails after `stall_timeout` (see `crate::admission` on deadlock freedom).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::{CreditGrant, CreditReport, CreditStreamRequest};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::metrics;

/// First pause before reconnecting a broken credit stream; doubles per
/// failure up to [`RECONNECT_MAX`].
pub const RECONNECT_MIN: Duration = Duration::from_millis(50);
/// Longest pause between credit stream connection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// Timeout of opening a credit stream and of one `ReportCredits` call.
pub const CREDIT_RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before re-sending a demand report that failed.
pub const REPORT_RETRY: Duration = Duration::from_millis(100);

/// Why a debit did not get credit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    /// No grant covered the block within the stall timeout.
    #[error("no credit from datanode {node} within {waited:?}")]
    Stalled { node: u64, waited: Duration },
    /// The credit client stopped (gateway shutdown, datanode removed).
    #[error("credit client for datanode {0} stopped")]
    Stopped(u64),
}

/// A `ReportCredits` to send, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub wanted: u64,
    pub returned: u64,
}

struct Waiter<W> {
    id: u64,
    bytes: u64,
    token: W,
}

/// One datanode's credit as the gateway sees it, in bytes: the balance
/// granted and not spent, and the FIFO queue of debits waiting for it.
///
/// Invariants: when the queue is not empty its head needs more than the
/// balance (so nobody is served out of order); `waiting()` is the sum of
/// the queued debits; nothing is granted, spent, returned or forfeited
/// without passing through the balance.
pub struct Balance<W> {
    available: u64,
    waiters: VecDeque<Waiter<W>>,
    waiting: u64,
    next_id: u64,
    /// Demand the datanode still has on record: the last report's
    /// `wanted`, minus what it granted since.
    remote_wanted: u64,
    connected: bool,
    last_used: Instant,
}

impl<W> Balance<W> {
    /// An empty, disconnected balance.
    pub fn new(now: Instant) -> Self {
        Balance {
            available: 0,
            waiters: VecDeque::new(),
            waiting: 0,
            next_id: 0,
            remote_wanted: 0,
            connected: false,
            last_used: now,
        }
    }

    /// Credit held and not spent.
    pub fn available(&self) -> u64 {
        self.available
    }

    /// Bytes of the queued debits.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// Number of queued debits.
    pub fn waiters(&self) -> usize {
        self.waiters.len()
    }

    /// Whether a credit stream is open.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Spends `bytes` now if nobody is queued and the balance covers them.
    pub fn try_debit(&mut self, bytes: u64, now: Instant) -> bool {
        self.last_used = now;
        if self.waiters.is_empty() && self.available >= bytes {
            self.available -= bytes;
            true
        } else {
            false
        }
    }

    /// Queues a debit of `bytes` behind the others; `token` comes back from
    /// [`grant`](Self::grant) when it is served. Returns its id.
    pub fn enqueue(&mut self, bytes: u64, token: W, now: Instant) -> u64 {
        self.last_used = now;
        let id = self.next_id;
        self.next_id += 1;
        self.waiters.push_back(Waiter { id, bytes, token });
        self.waiting += bytes;
        id
    }

    /// A grant of `bytes` arrived: adds it and serves queued debits in
    /// order; returns `(bytes, token)` of each served one.
    pub fn grant(&mut self, bytes: u64, now: Instant) -> Vec<(u64, W)> {
        self.remote_wanted = self.remote_wanted.saturating_sub(bytes);
        self.refund(bytes, now)
    }

    /// Gives back `bytes` that were spent but not used (a served debit
    /// whose caller had gone), serving queued debits as [`grant`] does.
    ///
    /// [`grant`]: Self::grant
    pub fn refund(&mut self, bytes: u64, now: Instant) -> Vec<(u64, W)> {
        self.available += bytes;
        self.pump(now)
    }

    fn pump(&mut self, now: Instant) -> Vec<(u64, W)> {
        let mut served = Vec::new();
        while let Some(head) = self.waiters.front() {
            if head.bytes > self.available {
                break;
            }
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            self.available -= w.bytes;
            self.waiting -= w.bytes;
            self.last_used = now;
            served.push((w.bytes, w.token));
        }
        served
    }

    /// Removes queued debit `id` (it gave up). Returns whether it was still
    /// queued, and the debits served because it no longer blocks them.
    pub fn cancel(&mut self, id: u64, now: Instant) -> (bool, Vec<(u64, W)>) {
        let Some(pos) = self.waiters.iter().position(|w| w.id == id) else {
            return (false, Vec::new());
        };
        if let Some(w) = self.waiters.remove(pos) {
            self.waiting -= w.bytes;
        }
        (true, self.pump(now))
    }

    /// A credit stream opened: the datanode knows no demand of ours yet.
    pub fn connected(&mut self) {
        self.connected = true;
        self.remote_wanted = 0;
    }

    /// The credit stream broke: the balance is lost (the datanode took it
    /// back). Returns the bytes forfeited. Queued debits stay queued.
    pub fn forget(&mut self) -> u64 {
        self.connected = false;
        self.remote_wanted = 0;
        std::mem::take(&mut self.available)
    }

    /// Takes every queued debit (the client stops); their tokens are
    /// dropped by the caller, which fails the waits.
    pub fn drain_waiters(&mut self) -> Vec<W> {
        self.waiting = 0;
        self.waiters.drain(..).map(|w| w.token).collect()
    }

    /// The report to send now, if any, recorded as sent:
    /// * with debits queued: `wanted = waiting - available + prefetch`,
    ///   when that exceeds what the datanode still has on record;
    /// * with nothing queued and nothing spent for `idle`: the whole
    ///   balance returned and `wanted = 0` (if there is either to undo).
    pub fn plan(&mut self, now: Instant, idle: Duration, prefetch: u64) -> Option<Report> {
        if !self.connected {
            return None;
        }
        if self.waiting > 0 {
            let wanted = self
                .waiting
                .saturating_sub(self.available)
                .saturating_add(prefetch);
            if wanted > self.remote_wanted {
                self.remote_wanted = wanted;
                return Some(Report {
                    wanted,
                    returned: 0,
                });
            }
            return None;
        }
        let idle_for = now.saturating_duration_since(self.last_used);
        if idle_for >= idle && (self.available > 0 || self.remote_wanted > 0) {
            self.remote_wanted = 0;
            return Some(Report {
                wanted: 0,
                returned: std::mem::take(&mut self.available),
            });
        }
        None
    }

    /// When [`plan`](Self::plan) will want to return idle credit, if
    /// nothing happens before.
    pub fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        (self.connected && self.waiting == 0 && (self.available > 0 || self.remote_wanted > 0))
            .then(|| self.last_used + idle)
    }

    /// A demand report failed: the datanode's record is unknown, so the
    /// next [`plan`](Self::plan) reports again.
    pub fn report_failed(&mut self) {
        self.remote_wanted = 0;
    }
}

/// What the credit client keeps per gateway process.
#[derive(Debug, Clone)]
pub struct CreditConfig {
    /// This process's id on every credit stream and shard header.
    pub gateway_id: String,
    /// Unused credit is returned after this long.
    pub idle_timeout: Duration,
    /// Extra demand reported on top of the bytes awaited (bytes).
    pub prefetch_bytes: u64,
}

/// A fresh gateway id: `sluice-gw-<uuid>` (the datanode accepts 1..=128
/// printable ASCII bytes).
pub fn new_gateway_id() -> String {
    format!("sluice-gw-{}", uuid::Uuid::new_v4().simple())
}

type Token = oneshot::Sender<()>;

/// One datanode's credit: the balance, its waiters and the stream task.
pub struct NodeCredit {
    node: u64,
    label: String,
    addr: String,
    state: Mutex<Balance<Token>>,
    /// Wakes the stream task to plan a report.
    wake: Notify,
    /// Wakes [`NodeCredit::stream_open`] waiters when a stream opens or
    /// the datanode turns out unreachable.
    opened: Notify,
    /// The last attempt to open the stream could not connect to the
    /// datanode (nothing listens there): nothing to wait for. (Still
    /// connected, for the moment between the datanode ending the stream
    /// and [`serve`] reading that end, is a window this does not close.)
    unreachable: AtomicBool,
    stop: CancellationToken,
}

/// The numbers of a [`NodeCredit`], in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCreditStats {
    pub available: u64,
    pub waiting: u64,
    pub connected: bool,
}

impl NodeCredit {
    fn lock(&self) -> MutexGuard<'_, Balance<Token>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current numbers.
    pub fn stats(&self) -> NodeCreditStats {
        let st = self.lock();
        NodeCreditStats {
            available: st.available(),
            waiting: st.waiting(),
            connected: st.is_connected(),
        }
    }

    /// Waits at most `within` for this datanode's credit stream to be open
    /// (answered by the datanode), or for an attempt to open it to fail
    /// while connecting (nothing listening at the datanode's address, a
    /// connect timeout, a TLS handshake refused). A `PutShard` opened
    /// while the stream is down would go out on the connection that broke
    /// it (a datanode that is shutting down ends its credit streams at
    /// once, but a connection with requests in flight stays open, refusing
    /// new streams, for its shutdown grace) and fail there; opened after
    /// this, it goes out on the connection the stream reopened on, or
    /// fails to connect as fast as it would have. Errors:
    /// [`CreditError::Stalled`], [`CreditError::Stopped`].
    pub async fn stream_open(&self, within: Duration) -> Result<(), CreditError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.lock().is_connected() || self.unreachable.load(Ordering::Acquire) {
                return Ok(());
            }
            tokio::select! {
                () = self.stop.cancelled() => return Err(CreditError::Stopped(self.node)),
                r = tokio::time::timeout_at(deadline, opened) => if r.is_err() {
                    return Err(CreditError::Stalled { node: self.node, waited: within });
                },
            }
        }
    }

    fn publish(&self, available: u64, waiting: u64) {
        ::metrics::gauge!(metrics::CREDIT_AVAILABLE_BYTES, "datanode" => self.label.clone())
            .set(available as f64);
        ::metrics::gauge!(metrics::CREDIT_WAITING_BYTES, "datanode" => self.label.clone())
            .set(waiting as f64);
    }

    /// The numbers to publish, read under the lock.
    fn publish_locked(&self, st: &Balance<Token>) -> (u64, u64) {
        (st.available(), st.waiting())
    }

    /// Wakes served debits; a debit whose caller has gone gives its bytes
    /// back (which may serve others in turn).
    fn deliver(&self, st: &mut Balance<Token>, mut served: Vec<(u64, Token)>) {
        loop {
            let mut unused = 0;
            for (bytes, token) in served {
                if token.send(()).is_err() {
                    unused += bytes;
                }
            }
            if unused == 0 {
                return;
            }
            served = st.refund(unused, Instant::now());
        }
    }

    /// Spends `bytes` of this datanode's credit, waiting (FIFO) for grants
    /// at most `stall`. Errors: [`CreditError::Stalled`],
    /// [`CreditError::Stopped`].
    pub async fn debit(&self, bytes: u64, stall: Duration) -> Result<(), CreditError> {
        let (id, rx, numbers) = {
            let mut st = self.lock();
            if st.try_debit(bytes, Instant::now()) {
                let numbers = self.publish_locked(&st);
                drop(st);
                self.publish(numbers.0, numbers.1);
                return Ok(());
            }
            if self.stop.is_cancelled() {
                return Err(CreditError::Stopped(self.node));
            }
            let (tx, rx) = oneshot::channel();
            let id = st.enqueue(bytes, tx, Instant::now());
            (id, rx, self.publish_locked(&st))
        };
        self.publish(numbers.0, numbers.1);
        self.wake.notify_one();
        let mut pending = PendingDebit {
            node: self,
            id,
            bytes,
            rx,
            settled: false,
        };
        match tokio::time::timeout(stall, &mut pending.rx).await {
            Ok(Ok(())) => {
                pending.settled = true;
                Ok(())
            }
            Ok(Err(_)) => {
                pending.settled = true;
                Err(CreditError::Stopped(self.node))
            }
            Err(_) => Err(CreditError::Stalled {
                node: self.node,
                waited: stall,
            }),
        }
    }

    /// Applies a grant from the stream.
    fn granted(&self, bytes: u64) {
        ::metrics::counter!(metrics::CREDIT_GRANTED_BYTES_TOTAL, "datanode" => self.label.clone())
            .increment(bytes);
        let mut st = self.lock();
        let served = st.grant(bytes, Instant::now());
        self.deliver(&mut st, served);
        let numbers = self.publish_locked(&st);
        drop(st);
        self.publish(numbers.0, numbers.1);
    }

    /// The stream broke: forfeit the balance.
    fn broken(&self) {
        let mut st = self.lock();
        let lost = st.forget();
        let numbers = self.publish_locked(&st);
        drop(st);
        if lost > 0 {
            ::metrics::counter!(metrics::CREDIT_FORFEITED_BYTES_TOTAL, "datanode" => self.label.clone())
                .increment(lost);
        }
        self.publish(numbers.0, numbers.1);
    }
}

/// A queued debit; dropping it before it is served (timeout, cancelled
/// request) takes it out of the queue, or gives back credit that was
/// granted to it in the meantime.
struct PendingDebit<'a> {
    node: &'a NodeCredit,
    id: u64,
    bytes: u64,
    rx: oneshot::Receiver<()>,
    settled: bool,
}

impl Drop for PendingDebit<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = self.node.lock();
        let now = Instant::now();
        let (was_queued, mut served) = st.cancel(self.id, now);
        // Grants are sent under the lock, so a debit that left the queue
        // without us has its grant waiting in `rx`: give it back.
        if !was_queued && self.rx.try_recv().is_ok() {
            served = st.refund(self.bytes, now);
        }
        self.node.deliver(&mut st, served);
        let numbers = self.node.publish_locked(&st);
        drop(st);
        self.node.publish(numbers.0, numbers.1);
    }
}

/// Why a credit stream stopped being served.
enum Ended {
    /// The client is stopping.
    Stopped,
    /// The stream ended or failed; reconnect.
    Broken(String),
}

type ReportFuture = Pin<Box<dyn Future<Output = (Report, Result<(), Status>)> + Send>>;

/// Keeps datanode `node`'s credit stream open until `node.stop`.
async fn run_node(node: Arc<NodeCredit>, client: DatanodeClient<Channel>, cfg: Arc<CreditConfig>) {
    let mut backoff = RECONNECT_MIN;
    let mut failures = 0u32;
    loop {
        let request = CreditStreamRequest {
            gateway_id: cfg.gateway_id.clone(),
        };
        let mut rpc = client.clone();
        let opened = tokio::select! {
            () = node.stop.cancelled() => break,
            r = tokio::time::timeout(CREDIT_RPC_TIMEOUT, rpc.credits(request)) => r,
        };
        let reason = match opened {
            Ok(Ok(response)) => {
                if failures > 0 {
                    tracing::info!(node = node.node, "credit stream open again");
                }
                failures = 0;
                backoff = RECONNECT_MIN;
                node.lock().connected();
                node.unreachable.store(false, Ordering::Release);
                node.wake.notify_one();
                node.opened.notify_waiters();
                let mut stream = response.into_inner();
                match serve(&node, &mut stream, &client, &cfg).await {
                    Ended::Stopped => break,
                    Ended::Broken(reason) => reason,
                }
            }
            Ok(Err(status)) => {
                // What this attempt found, not a past one's: a node that
                // refused a connection and is now draining one holds
                // PutShards back again.
                let unreachable = could_not_connect(&status);
                node.unreachable.store(unreachable, Ordering::Release);
                if unreachable {
                    node.opened.notify_waiters();
                }
                format!("{}: {}", status.code(), status.message())
            }
            // No answer (a connection that takes requests and answers
            // none): not a sign that nothing listens, which the connect
            // timeout tells; the waiting PutShards keep to their stall.
            Err(_) => {
                node.unreachable.store(false, Ordering::Release);
                format!("no answer within {CREDIT_RPC_TIMEOUT:?}")
            }
        };
        node.broken();
        failures += 1;
        if failures == 1 {
            tracing::warn!(node = node.node, addr = %node.addr, error = %reason, "credit stream broken, reconnecting");
        } else {
            tracing::debug!(node = node.node, failures, error = %reason, "credit stream still down");
        }
        tokio::select! {
            () = node.stop.cancelled() => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
    // Stopping: the stream (if any) is dropped, so the datanode takes its
    // credit back; queued debits fail.
    node.broken();
    let tokens = node.lock().drain_waiters();
    drop(tokens);
    node.publish(0, 0);
    tracing::debug!(node = node.node, "credit client stopped");
}

/// Whether `status` failed while connecting (a [`tonic::ConnectError`]:
/// refused, unreachable, timed out, TLS handshake) or on an I/O error, so
/// no draining connection is left for a `PutShard` to meet. An attempt
/// held by a draining connection ends, when it closes, with a cancelled
/// request and neither.
fn could_not_connect(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Serves one open stream: grants in, reports out (at most one in flight).
async fn serve(
    node: &NodeCredit,
    stream: &mut Streaming<CreditGrant>,
    client: &DatanodeClient<Channel>,
    cfg: &CreditConfig,
) -> Ended {
    let mut report: Option<ReportFuture> = None;
    let mut retry_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if retry_at.is_some_and(|t| now >= t) {
            retry_at = None;
        }
        let deadline = {
            let mut st = node.lock();
            if report.is_none()
                && retry_at.is_none()
                && let Some(r) = st.plan(now, cfg.idle_timeout, cfg.prefetch_bytes)
            {
                if r.returned > 0 {
                    ::metrics::counter!(metrics::CREDIT_RETURNED_BYTES_TOTAL, "datanode" => node.label.clone())
                        .increment(r.returned);
                }
                report = Some(send_report(client.clone(), cfg.gateway_id.clone(), r));
            }
            let numbers = node.publish_locked(&st);
            let idle = st.idle_deadline(cfg.idle_timeout);
            drop(st);
            node.publish(numbers.0, numbers.1);
            match (idle, retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        tokio::select! {
            biased;
            () = node.stop.cancelled() => return Ended::Stopped,
            message = stream.message() => match message {
                Ok(Some(grant)) => node.granted(grant.bytes),
                Ok(None) => return Ended::Broken("credit stream ended".into()),
                Err(status) => return Ended::Broken(format!("{}: {}", status.code(), status.message())),
            },
            (sent, result) = in_flight(&mut report), if report.is_some() => {
                report = None;
                if let Err(status) = result {
                    if sent.returned > 0 {
                        // The datanode may still count what we gave up:
                        // reset the stream so it takes everything back.
                        return Ended::Broken(format!("returning {} bytes failed: {status}", sent.returned));
                    }
                    if status.code() == Code::FailedPrecondition {
                        return Ended::Broken(format!("datanode lost our stream: {}", status.message()));
                    }
                    tracing::debug!(node = node.node, error = %status, "credit demand report failed, retrying");
                    node.lock().report_failed();
                    retry_at = Some(Instant::now() + REPORT_RETRY);
                }
            },
            () = node.wake.notified() => {}
            () = sleep_until_opt(deadline) => {}
        }
    }
}

/// The report in flight, or never.
async fn in_flight(report: &mut Option<ReportFuture>) -> (Report, Result<(), Status>) {
    match report {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn send_report(mut client: DatanodeClient<Channel>, gateway_id: String, r: Report) -> ReportFuture {
    Box::pin(async move {
        let call = client.report_credits(CreditReport {
            gateway_id,
            wanted_bytes: r.wanted,
            returned_bytes: r.returned,
        });
        let result = match tokio::time::timeout(CREDIT_RPC_TIMEOUT, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::deadline_exceeded("ReportCredits timed out")),
        };
        (r, result)
    })
}

/// The credit streams of this gateway process, one per datanode written to.
pub struct CreditClient {
    cfg: Arc<CreditConfig>,
    nodes: Mutex<HashMap<u64, Arc<NodeCredit>>>,
    tasks: TaskTracker,
}

impl CreditClient {
    /// A client with no streams yet.
    pub fn new(cfg: CreditConfig) -> Self {
        CreditClient {
            cfg: Arc::new(cfg),
            nodes: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        }
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<u64, Arc<NodeCredit>>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gateway id sent on streams and shard headers.
    pub fn gateway_id(&self) -> &str {
        &self.cfg.gateway_id
    }

    /// The credit of datanode `node` at `addr`, opening its stream (with
    /// `client`) on first use or when the address changed. Must be called
    /// inside a tokio runtime.
    pub fn node(
        &self,
        node: u64,
        addr: &str,
        client: impl FnOnce() -> DatanodeClient<Channel>,
    ) -> Arc<NodeCredit> {
        let mut nodes = self.nodes();
        if let Some(existing) = nodes.get(&node)
            && existing.addr == addr
            && !existing.stop.is_cancelled()
        {
            return Arc::clone(existing);
        }
        let credit = Arc::new(NodeCredit {
            node,
            label: node.to_string(),
            addr: addr.to_string(),
            state: Mutex::new(Balance::new(Instant::now())),
            wake: Notify::new(),
            opened: Notify::new(),
            unreachable: AtomicBool::new(false),
            stop: CancellationToken::new(),
        });
        if let Some(old) = nodes.insert(node, Arc::clone(&credit)) {
            old.stop.cancel();
        }
        self.tasks.spawn(run_node(
            Arc::clone(&credit),
            client(),
            Arc::clone(&self.cfg),
        ));
        credit
    }

    /// The numbers of datanode `node`'s credit, if it has a stream.
    pub fn stats(&self, node: u64) -> Option<NodeCreditStats> {
        self.nodes().get(&node).map(|n| n.stats())
    }

    /// Stops the streams of datanodes for which `keep` is false (removed
    /// from the cluster); their queued debits fail.
    pub fn retain(&self, keep: impl Fn(u64) -> bool) {
        self.nodes().retain(|id, n| {
            let kept = keep(*id);
            if !kept {
                n.stop.cancel();
            }
            kept
        });
    }

    /// Stops every stream (credit goes back to the datanodes).
    pub fn stop(&self) {
        for n in self.nodes().drain().map(|(_, n)| n) {
            n.stop.cancel();
        }
        self.tasks.close();
    }

    /// Waits until every stream task has ended (after [`stop`](Self::stop)).
    pub async fn stopped(&self) {
        self.tasks.wait().await;
    }
}

impl Drop for CreditClient {
    fn drop(&mut self) {
        for n in self.nodes().values() {
            n.stop.cancel();
        }
    }
}

#[cfg(test)]
mod tests;
