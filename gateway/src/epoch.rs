//! The gateway's write epochs (see `docs/design/durability.md` §3 and
//! `OpenEpochRequest` in `proto/meta.proto`).
//!
//! The heal worker uses [`WriteEpochs::begin_write`]
//! and [`EpochGuard::epoch`]; keep those signatures.
//!
//! # Life of an epoch
//! [`WriteEpochs::start`] opens the first epoch (`OpenEpoch`, retried until
//! it succeeds or the start deadline passes) and spawns the renewal task.
//! Every `lease / 3` (the lease is the one `OpenEpochResponse.lease_ms`
//! names) the task renews every *live* epoch: the current one, and each
//! older one that an [`EpochGuard`] still holds. Every `epoch_rotation` it
//! opens a new current epoch; an older epoch leaves the live set when its
//! last guard drops (or at once if it has none), is no longer renewed, and
//! meta closes it when its lease runs out.
//!
//! A renewal refused with `EPOCH_CLOSED` means this process lost the epoch
//! (it was paused or cut off from meta past its lease): the epoch leaves
//! the live set, `sluice_gateway_epochs_lost_total` counts it and, if it was
//! the current one, a new current epoch is opened at once. Writes still
//! holding guards on the lost epoch fail at commit (meta refuses them with
//! `EPOCH_CLOSED`, the S3 layer answers `503`).
//!
//! # Bound
//! The live set holds the current epoch plus the older epochs that guards
//! still hold, so its size is about `1 + longest write / epoch_rotation`
//! (one or two with the default 10 min rotation). It is capped at
//! [`MAX_LIVE_EPOCHS`]: while that many are live, rotation waits (new
//! writes keep using the current epoch) until an older one drains.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{ErrorCode, OpenEpochResponse};
use sluice_util::worker::{WorkerHandle, Workers};
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// Most epochs renewed at once (current + older ones held by writes).
pub const MAX_LIVE_EPOCHS: usize = 8;
/// Rotation period when `epoch_rotation` is not configured: 10 min.
pub const DEFAULT_EPOCH_ROTATION: Duration = Duration::from_secs(600);
/// Lease assumed when meta answers `lease_ms = 0`: 30 s (meta's default).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Shortest renewal period, whatever the lease (guards against a tiny lease
/// turning the renewal task into a busy loop).
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(10);
/// Pause between two failed `OpenEpoch` attempts (each attempt already
/// retries inside `MetaClient` up to its retry deadline).
pub const OPEN_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The meta calls write epochs need, behind a trait so the epoch logic can
/// be tested against a fake.
#[async_trait::async_trait]
pub trait EpochService: Send + Sync + 'static {
    /// Opens a new write epoch (`OpenEpoch`).
    async fn open(&self) -> Result<OpenEpochResponse, MetaError>;
    /// Renews `epoch` (`RenewEpoch`); `Refused { EpochClosed }` once closed.
    async fn renew(&self, epoch: u64) -> Result<(), MetaError>;
}

/// [`EpochService`] over a [`MetaClient`] for gateway `gateway_id`.
pub struct MetaEpochService {
    meta: MetaClient,
    gateway_id: String,
    /// Sum of this gateway's memory budgets, reported with each renewal
    /// together with the process's RSS (`sluice admin status`).
    memory_budget: u64,
    /// This gateway's workers, whose states each renewal reports.
    workers: Option<Workers>,
}

impl MetaEpochService {
    /// Epochs of gateway `gateway_id` (its credit-stream id) through `meta`.
    pub fn new(meta: MetaClient, gateway_id: impl Into<String>) -> Self {
        MetaEpochService {
            meta,
            gateway_id: gateway_id.into(),
            memory_budget: 0,
            workers: None,
        }
    }

    /// Reports `workers`' states with each renewal.
    pub fn with_workers(mut self, workers: Workers) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Reports `budget` (bytes) and the process's RSS with each renewal.
    pub fn with_memory_budget(mut self, budget: u64) -> Self {
        self.memory_budget = budget;
        self
    }
}

#[async_trait::async_trait]
impl EpochService for MetaEpochService {
    async fn open(&self) -> Result<OpenEpochResponse, MetaError> {
        self.meta.open_epoch(&self.gateway_id).await
    }

    async fn renew(&self, epoch: u64) -> Result<(), MetaError> {
        let (requests_total, slowdowns_total) = crate::metrics::request_totals();
        let report = sluice_meta_client::GatewayReport {
            rss_bytes: sluice_meta_client::process_rss(),
            memory_budget_bytes: self.memory_budget,
            requests_total,
            slowdowns_total,
            workers: self
                .workers
                .as_ref()
                .map(|w| sluice_meta_client::worker_states(&w.snapshot()))
                .unwrap_or_default(),
        };
        self.meta.renew_epoch_reporting(epoch, report).await
    }
}

/// Tuning of [`WriteEpochs::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochConfig {
    /// How often a new current epoch is opened (> 0).
    pub rotation: Duration,
    /// How long [`WriteEpochs::start`] keeps trying to open the first epoch.
    pub start_deadline: Duration,
}

impl Default for EpochConfig {
    fn default() -> Self {
        EpochConfig {
            rotation: DEFAULT_EPOCH_ROTATION,
            start_deadline: crate::blob::START_DEADLINE,
        }
    }
}

/// The write epochs of one gateway process: the current one new blobs are
/// written under, and older ones still renewed while writes begun under
/// them are in flight. Cheap to clone.
#[derive(Clone)]
pub struct WriteEpochs {
    inner: Arc<Inner>,
}

impl Default for WriteEpochs {
    /// A fixed epoch 0 (never opened by meta, whose numbering starts at
    /// 1): for stores without meta that never commit.
    fn default() -> Self {
        WriteEpochs::fixed(0)
    }
}

struct Inner {
    state: Mutex<State>,
    rotation: Duration,
    /// Stops the renewal task.
    stop: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct State {
    /// The epoch new writes are begun under.
    current: u64,
    /// When `current` was opened (rotation is measured from it).
    current_opened: Instant,
    /// Lease of the epochs, from the last `OpenEpoch`.
    lease: Duration,
    /// Live epochs (renewed) -> guards held on them. Holds `current`
    /// except while a lost current epoch is being replaced; at most
    /// [`MAX_LIVE_EPOCHS`] entries.
    live: BTreeMap<u64, usize>,
    /// Epochs lost (renewal refused with `EPOCH_CLOSED`) since start.
    lost: u64,
}

/// Keeps its epoch renewed while alive: hold one for every write (client
/// or heal) from its first shard to its commit.
pub struct EpochGuard {
    epoch: u64,
    owner: Weak<Inner>,
}

impl EpochGuard {
    /// The epoch to name in blob ids, BeginHeal and UpdatePlacement.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl std::fmt::Debug for EpochGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochGuard")
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Drop for EpochGuard {
    fn drop(&mut self) {
        let Some(inner) = self.owner.upgrade() else {
            return;
        };
        let mut state = inner.lock();
        let current = state.current;
        if let Some(guards) = state.live.get_mut(&self.epoch) {
            *guards = guards.saturating_sub(1);
            if *guards == 0 && self.epoch != current {
                // The last write of a rotated-out epoch: stop renewing it.
                state.live.remove(&self.epoch);
                tracing::debug!(epoch = self.epoch, "write epoch drained; no longer renewed");
            }
        }
    }
}

impl WriteEpochs {
    /// A fixed epoch `epoch`, never renewed nor rotated (stores without
    /// meta, tests).
    pub fn fixed(epoch: u64) -> WriteEpochs {
        WriteEpochs::from_parts(epoch, DEFAULT_LEASE, DEFAULT_EPOCH_ROTATION)
    }

    fn from_parts(epoch: u64, lease: Duration, rotation: Duration) -> WriteEpochs {
        WriteEpochs {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    current: epoch,
                    current_opened: Instant::now(),
                    lease,
                    live: BTreeMap::from([(epoch, 0)]),
                    lost: 0,
                }),
                rotation,
                stop: CancellationToken::new(),
            }),
        }
    }

    /// Opens the first epoch through `service` (retrying until it succeeds
    /// or `config.start_deadline` passes) and spawns the renewal and
    /// rotation task. Errors: the last `OpenEpoch` error.
    pub async fn start(
        service: Arc<dyn EpochService>,
        config: EpochConfig,
    ) -> Result<WriteEpochs, MetaError> {
        Self::start_in(service, config, &Workers::default()).await
    }

    /// [`WriteEpochs::start`], running the renewal as worker
    /// `epoch-renewal` of `workers`.
    pub async fn start_in(
        service: Arc<dyn EpochService>,
        config: EpochConfig,
        workers: &Workers,
    ) -> Result<WriteEpochs, MetaError> {
        let started = Instant::now();
        let opened = loop {
            match service.open().await {
                Ok(opened) => break opened,
                Err(e) if started.elapsed() >= config.start_deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "opening a write epoch, retrying");
                    tokio::time::sleep(OPEN_RETRY_PAUSE).await;
                }
            }
        };
        let lease = lease_of(&opened);
        let rotation = if config.rotation.is_zero() {
            DEFAULT_EPOCH_ROTATION
        } else {
            config.rotation
        };
        let epochs = WriteEpochs::from_parts(opened.epoch, lease, rotation);
        tracing::info!(
            epoch = opened.epoch,
            ?lease,
            ?rotation,
            "opened write epoch"
        );
        metrics::set_write_epoch(opened.epoch);
        let (weak, stop) = (Arc::downgrade(&epochs.inner), epochs.inner.stop.clone());
        workers.spawn("epoch-renewal", move |w| renew_loop(weak, service, stop, w));
        Ok(epochs)
    }

    /// A guard on the current epoch.
    pub fn begin_write(&self) -> EpochGuard {
        let mut state = self.inner.lock();
        let epoch = state.current;
        // A lost current epoch (being replaced) is not renewed again; its
        // writes fail at commit.
        if let Some(guards) = state.live.get_mut(&epoch) {
            *guards += 1;
        }
        EpochGuard {
            epoch,
            owner: Arc::downgrade(&self.inner),
        }
    }

    /// The epoch new writes are begun under.
    pub fn current(&self) -> u64 {
        self.inner.lock().current
    }

    /// The epochs renewed now (ascending), with the guards held on each.
    pub fn live(&self) -> Vec<(u64, usize)> {
        self.inner
            .lock()
            .live
            .iter()
            .map(|(e, g)| (*e, *g))
            .collect()
    }

    /// Epochs lost (a renewal refused with `EPOCH_CLOSED`) since start.
    pub fn lost(&self) -> u64 {
        self.inner.lock().lost
    }

    /// Stops renewing (the epochs then expire on meta). Also happens when
    /// the last handle drops.
    pub fn stop(&self) {
        self.inner.stop.cancel();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The lease an `OpenEpoch` answer grants.
fn lease_of(opened: &OpenEpochResponse) -> Duration {
    if opened.lease_ms == 0 {
        DEFAULT_LEASE
    } else {
        Duration::from_millis(opened.lease_ms)
    }
}

fn renew_interval(lease: Duration) -> Duration {
    (lease / 3).max(MIN_RENEW_INTERVAL)
}

/// Renews the live epochs every `lease / 3`, rotates every `rotation`,
/// replaces a lost current epoch at once; ends when `stop` is cancelled or
/// every [`WriteEpochs`] handle and guard is gone.
async fn renew_loop(
    inner: Weak<Inner>,
    service: Arc<dyn EpochService>,
    stop: CancellationToken,
    worker: WorkerHandle,
) {
    // Set when the current epoch was lost or rotation is due and the new
    // epoch could not be opened yet: retried on the next round.
    let mut need_new = false;
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else { break };
            let state = inner.lock();
            let renew = renew_interval(state.lease);
            let rotate_in = inner
                .rotation
                .saturating_sub(state.current_opened.elapsed());
            if need_new {
                renew.min(OPEN_RETRY_PAUSE)
            } else {
                renew.min(rotate_in.max(MIN_RENEW_INTERVAL))
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
        let Some(strong) = inner.upgrade() else { break };
        let (epochs, current, rotate) = {
            let state = strong.lock();
            let rotate = state.current_opened.elapsed() >= strong.rotation
                && state.live.len() < MAX_LIVE_EPOCHS;
            (
                state.live.keys().copied().collect::<Vec<u64>>(),
                state.current,
                rotate,
            )
        };
        drop(strong);
        // Renew every live epoch (at most MAX_LIVE_EPOCHS calls at once).
        let renewals = futures::future::join_all(epochs.iter().map(|&epoch| {
            let service = Arc::clone(&service);
            async move { (epoch, service.renew(epoch).await) }
        }));
        let results = tokio::select! {
            () = stop.cancelled() => break,
            r = renewals => r,
        };
        let Some(strong) = inner.upgrade() else { break };
        let mut failed = false;
        for (epoch, result) in results {
            match result {
                Ok(()) => tracing::trace!(epoch, "renewed write epoch"),
                Err(MetaError::Refused {
                    code: ErrorCode::EpochClosed,
                    ..
                }) => {
                    let mut state = strong.lock();
                    if state.live.remove(&epoch).is_some() {
                        state.lost += 1;
                        metrics::count_epoch_lost();
                        tracing::warn!(
                            epoch,
                            "write epoch lost (closed on meta: paused or cut off past its lease); writes under it will be refused"
                        );
                    }
                    if epoch == current {
                        need_new = true;
                    }
                }
                Err(e) => {
                    failed = true;
                    worker.report_error(format_args!("renewing write epoch {epoch}: {e}"));
                }
            }
        }
        if !failed {
            worker.ran();
        }
        if !(need_new || rotate) {
            continue;
        }
        drop(strong);
        let opened = tokio::select! {
            () = stop.cancelled() => break,
            r = service.open() => r,
        };
        let Some(strong) = inner.upgrade() else { break };
        match opened {
            Ok(opened) => {
                let mut state = strong.lock();
                let old = state.current;
                state.current = opened.epoch;
                state.current_opened = Instant::now();
                state.lease = lease_of(&opened);
                state.live.entry(opened.epoch).or_insert(0);
                // A rotated-out epoch without writes is not renewed again.
                if old != opened.epoch && state.live.get(&old) == Some(&0) {
                    state.live.remove(&old);
                }
                need_new = false;
                metrics::set_write_epoch(opened.epoch);
                tracing::info!(
                    epoch = opened.epoch,
                    previous = old,
                    live = state.live.len(),
                    "opened write epoch"
                );
            }
            Err(e) => {
                worker.report_error(format_args!("opening a new write epoch, retrying: {e}"));
                need_new = true;
            }
        }
    }
    tracing::debug!("write epoch renewal stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn fixed_epoch_counts_guards() {
        let epochs = WriteEpochs::fixed(7);
        assert_eq!(epochs.current(), 7);
        let a = epochs.begin_write();
        let b = epochs.begin_write();
        assert_eq!((a.epoch(), b.epoch()), (7, 7));
        assert_eq!(epochs.live(), vec![(7, 2)]);
        drop(a);
        drop(b);
        assert_eq!(epochs.live(), vec![(7, 0)], "the current epoch stays live");
    }

    /// An [`EpochService`] opening epochs 1, 2, 3, ... and refusing renewals
    /// of the epochs in `closed`.
    #[derive(Default)]
    struct Counting {
        next: AtomicU64,
        closed: Mutex<Vec<u64>>,
    }

    #[async_trait::async_trait]
    impl EpochService for Counting {
        async fn open(&self) -> Result<OpenEpochResponse, MetaError> {
            Ok(OpenEpochResponse {
                epoch: self.next.fetch_add(1, Ordering::SeqCst) + 1,
                lease_ms: 60,
            })
        }
        async fn renew(&self, epoch: u64) -> Result<(), MetaError> {
            if self.closed.lock().unwrap().contains(&epoch) {
                return Err(MetaError::Refused {
                    code: ErrorCode::EpochClosed,
                    message: format!("epoch {epoch} is closed"),
                });
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn rotation_without_writes_keeps_one_epoch() {
        let service = Arc::new(Counting::default());
        let epochs = WriteEpochs::start(
            service.clone(),
            EpochConfig {
                rotation: Duration::from_millis(50),
                start_deadline: Duration::from_secs(1),
            },
        )
        .await
        .expect("start");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(epochs.current() >= 3, "rotated: {}", epochs.current());
        assert_eq!(epochs.live().len(), 1, "{:?}", epochs.live());
        epochs.stop();
    }
}
