//! The heal worker (`docs/design/durability.md` §6): runs inside a gateway, finds
//! missing shards (the audit) and rebuilds them (the degraded poll), inside
//! the same credits and buffer budget as client writes.
//!
//! # Layout
//! * this file — [`HealMeta`] (the meta calls heal makes, behind a trait
//!   so tests can record them), [`HealConfig`], [`HealStatus`] and the
//!   worker loop ([`HealWorker`]).
//! * [`audit`] — the audit pass and [`audit::NodeWatch`] (when one is due).
//! * [`rebuild`] — target choice and the rebuild of one blob.
//! * [`rate`] — the bandwidth token bucket and the yield rule.
//! * [`mover`] — drain and rebalance: moves shards off draining nodes and
//!   toward the current placement, after each heal pass.
//!
//! # The loop
//! Every `heal_interval`: read the datanode set; run an audit pass when
//! one is due (at start, every `audit_interval`, when a node's
//! `disk_generation` changed, a node has been down longer than
//! `node_down_after`, or such a node is live again: its shards marked
//! missing are re-verified before this pass's heal would rebuild them);
//! then page the degraded blobs
//! (`ListPlacements(degraded_only)`) and rebuild them, `heal_concurrency`
//! at once. A blob that cannot be healed now stays degraded and is tried
//! again on the next pass. Then, when a node is draining or rebalancing is
//! on, a move pass ([`mover`]).

pub mod audit;
pub mod mover;
pub mod rate;
pub mod rebuild;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{
    BeginHealRequest, DatanodeInfo, ListPlacementsRequest, ListPlacementsResponse, ShardRef,
    UpdatePlacementRequest,
};
use sluice_util::worker::WorkerHandle;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::blob::BlobStore;
use crate::epoch::WriteEpochs;
use audit::NodeWatch;
use rate::HealGate;
use rebuild::{HealError, NodeView, RebuildContext};

/// Degraded blobs per `ListPlacements` page of the heal poll.
pub const DEGRADED_PAGE: u32 = 1000;

/// Metric names (`sluice_heal_*`).
pub mod names {
    /// Gauge, label `missing` (shard count): degraded blobs seen by the
    /// last pass over the degraded list.
    pub const DEGRADED_BLOBS: &str = "sluice_heal_degraded_blobs";
    /// Gauge: degraded blobs of the current pass not handled yet.
    pub const QUEUE_BLOBS: &str = "sluice_heal_queue_blobs";
    /// Counter: blobs healed (compare-and-set applied).
    pub const HEALED_BLOBS: &str = "sluice_heal_healed_blobs_total";
    /// Counter: shard bytes written by heal.
    pub const BYTES: &str = "sluice_heal_bytes_total";
    /// Counter, label `reason`: heals that ended without a new placement.
    pub const FAILED: &str = "sluice_heal_failed_total";
    /// Counter: shards the audit checked.
    pub const AUDIT_SHARDS_CHECKED: &str = "sluice_heal_audit_shards_checked_total";
    /// Counter: shards the audit reported missing.
    pub const AUDIT_MISSING: &str = "sluice_heal_audit_missing_total";
    /// Counter: audit passes completed.
    pub const AUDIT_PASSES: &str = "sluice_heal_audit_passes_total";
    /// Counter: missing shards the audit read through on their node.
    pub const AUDIT_VERIFIED: &str = "sluice_heal_audit_verified_total";
    /// Counter: missing shards the audit found sound and un-marked.
    pub const AUDIT_UNMARKED: &str = "sluice_heal_audit_unmarked_total";
}

/// Registers the descriptions of the heal metrics.
pub fn describe() {
    use metrics::Unit;
    metrics::describe_gauge!(
        names::DEGRADED_BLOBS,
        "Degraded blobs by missing shard count (last pass)"
    );
    metrics::describe_gauge!(
        names::QUEUE_BLOBS,
        "Degraded blobs of the current heal pass not handled yet"
    );
    metrics::describe_counter!(names::HEALED_BLOBS, "Blobs healed");
    metrics::describe_counter!(names::BYTES, Unit::Bytes, "Shard bytes written by heal");
    metrics::describe_counter!(
        names::FAILED,
        "Heals that ended without a new placement, by reason"
    );
    metrics::describe_counter!(names::AUDIT_SHARDS_CHECKED, "Shards checked by the audit");
    metrics::describe_counter!(names::AUDIT_MISSING, "Shards the audit reported missing");
    metrics::describe_counter!(names::AUDIT_PASSES, "Audit passes completed");
    metrics::describe_counter!(
        names::AUDIT_VERIFIED,
        "Missing shards the audit read through on their node"
    );
    metrics::describe_counter!(
        names::AUDIT_UNMARKED,
        "Missing shards the audit found sound on their node and un-marked"
    );
}

/// The meta calls of the heal worker. [`MetaClient`] implements it; tests
/// use a recording fake.
#[async_trait]
pub trait HealMeta: Send + Sync {
    /// One page of committed (or only degraded) blobs.
    async fn list_placements(
        &self,
        req: ListPlacementsRequest,
    ) -> Result<ListPlacementsResponse, MetaError>;
    /// Marks `shards` of `node_id` missing; returns how many were marked.
    async fn report_missing(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError>;
    /// Un-marks `shards` of `node_id` (found sound there); returns how many
    /// left `missing`.
    async fn report_present(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError>;
    /// Records a heal intent.
    async fn begin_heal(&self, req: BeginHealRequest) -> Result<(), MetaError>;
    /// Compare-and-set of a healed placement.
    async fn update_placement(&self, req: UpdatePlacementRequest) -> Result<(), MetaError>;
    /// The registered datanodes.
    async fn list_datanodes(&self) -> Result<Vec<DatanodeInfo>, MetaError>;
}

#[async_trait]
impl HealMeta for MetaClient {
    async fn list_placements(
        &self,
        req: ListPlacementsRequest,
    ) -> Result<ListPlacementsResponse, MetaError> {
        MetaClient::list_placements(self, req).await
    }
    async fn report_missing(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError> {
        MetaClient::report_missing(self, node_id, shards).await
    }
    async fn report_present(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError> {
        MetaClient::report_present(self, node_id, shards).await
    }
    async fn begin_heal(&self, req: BeginHealRequest) -> Result<(), MetaError> {
        MetaClient::begin_heal(self, req).await
    }
    async fn update_placement(&self, req: UpdatePlacementRequest) -> Result<(), MetaError> {
        MetaClient::update_placement(self, req).await
    }
    async fn list_datanodes(&self) -> Result<Vec<DatanodeInfo>, MetaError> {
        MetaClient::list_datanodes(self).await
    }
}

/// Heal worker settings (from the gateway [`crate::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealConfig {
    /// Shard bytes per second heal may write; 0 disables heal.
    pub bandwidth_bytes_per_sec: u64,
    /// How often the degraded list is polled.
    pub heal_interval: Duration,
    /// How often a full audit pass runs.
    pub audit_interval: Duration,
    /// A node down this long has its shards reported missing.
    pub node_down_after: Duration,
    /// Longest wait for one `VerifyShards` answer of the audit.
    pub audit_verify_timeout: Duration,
    /// Blobs healed at once, and stripes of budget heal holds at once (>= 1).
    pub concurrency: usize,
    /// Longest wait for a stripe buffer or a datanode's credit.
    pub stall_timeout: Duration,
    /// Shard bytes per second rebalancing may write; 0 disables it.
    pub rebalance_bandwidth_bytes_per_sec: u64,
}

impl HealConfig {
    /// The heal settings of a gateway config.
    pub fn from_config(c: &crate::Config) -> Self {
        HealConfig {
            bandwidth_bytes_per_sec: c.heal_bandwidth_bytes_per_sec.as_u64(),
            heal_interval: c.heal_interval,
            audit_interval: c.audit_interval,
            node_down_after: c.node_down_after,
            audit_verify_timeout: c.audit_verify_timeout,
            concurrency: c.heal_concurrency.max(1),
            stall_timeout: c.stall_timeout,
            rebalance_bandwidth_bytes_per_sec: c.rebalance_bandwidth_bytes_per_sec.as_u64(),
        }
    }
}

/// What the worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealState {
    #[default]
    Idle,
    Auditing,
    Healing,
    /// Heal is disabled (bandwidth 0) or stopped.
    Paused,
}

/// Progress counters of a [`HealWorker`] (also published as metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealStatus {
    pub state: HealState,
    /// Degraded blobs seen by the last pass, by missing shard count.
    pub degraded_by_missing: BTreeMap<usize, u64>,
    /// Degraded blobs of the current pass not handled yet.
    pub queue_blobs: u64,
    pub healed_blobs: u64,
    /// Shard bytes written.
    pub heal_bytes: u64,
    /// Heals that ended without a new placement, by reason.
    pub failed: BTreeMap<&'static str, u64>,
    pub audit_passes: u64,
    pub audit_shards_checked: u64,
    pub audit_missing: u64,
    /// Missing shards the audit read through on their node.
    pub audit_verified: u64,
    /// Missing shards the audit found sound and un-marked.
    pub audit_unmarked: u64,
    /// Shards moved off draining nodes.
    pub drained_shards: u64,
    /// Shards moved by rebalance.
    pub rebalanced_shards: u64,
}

/// The running heal worker of a gateway (garage's `Worker` shape: a name,
/// a state, progress counters).
pub struct HealWorker {
    stop: CancellationToken,
    /// Resolves (or errs) when the loop has ended.
    done: oneshot::Receiver<()>,
    status: Arc<Mutex<HealStatus>>,
}

struct Shared {
    store: BlobStore,
    meta: Arc<dyn HealMeta>,
    epochs: WriteEpochs,
    config: HealConfig,
    gate: HealGate,
    /// Rate and stripe slot (one) of rebalance moves; `None` when off.
    rebalance_gate: Option<HealGate>,
    status: Arc<Mutex<HealStatus>>,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut HealStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

impl HealWorker {
    /// The worker's name (logs, status pages).
    pub const NAME: &'static str = "heal";

    /// Starts the worker loop on the current runtime.
    pub fn start(
        config: HealConfig,
        store: BlobStore,
        meta: Arc<dyn HealMeta>,
        epochs: WriteEpochs,
    ) -> HealWorker {
        let status = Arc::new(Mutex::new(HealStatus::default()));
        let stop = CancellationToken::new();
        let gate = HealGate::new(
            config.bandwidth_bytes_per_sec,
            config.concurrency,
            store.stats().clone(),
            config.stall_timeout,
        );
        let rebalance_gate = (config.rebalance_bandwidth_bytes_per_sec > 0).then(|| {
            HealGate::new(
                config.rebalance_bandwidth_bytes_per_sec,
                1,
                store.stats().clone(),
                config.stall_timeout,
            )
        });
        let shared = Arc::new(Shared {
            store,
            meta,
            epochs,
            config,
            gate,
            rebalance_gate,
            status: Arc::clone(&status),
        });
        let (done_tx, done) = oneshot::channel();
        let workers = shared.store.workers().clone();
        let loop_stop = stop.clone();
        workers.spawn(Self::NAME, move |w| async move {
            run(shared, loop_stop, w).await;
            let _ = done_tx.send(());
        });
        HealWorker { stop, done, status }
    }

    /// A snapshot of the worker's status.
    pub fn status(&self) -> HealStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the loop (an unfinished heal is abandoned: its streams are
    /// reset and its intents expire with the epoch) and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.done.await;
    }
}

async fn run(shared: Arc<Shared>, stop: CancellationToken, worker: WorkerHandle) {
    if shared.config.bandwidth_bytes_per_sec == 0 {
        shared.update(|s| s.state = HealState::Paused);
        tracing::info!("heal disabled: heal_bandwidth_bytes_per_sec = 0");
        worker.idle();
        stop.cancelled().await;
        return;
    }
    let mut watch = NodeWatch::default();
    let mut movers = mover::MoveTrigger::default();
    let mut last_audit: Option<Instant> = None;
    let mut ticker = tokio::time::interval(shared.config.heal_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let pass = async {
            let infos = match shared.meta.list_datanodes().await {
                Ok(i) => i,
                Err(e) => {
                    worker.report_error(format_args!("heal: reading the datanode set: {e}"));
                    return;
                }
            };
            let obs = watch.observe(&infos, Instant::now(), shared.config.node_down_after);
            let due = last_audit.is_none_or(|t| t.elapsed() >= shared.config.audit_interval);
            if due || obs.generation_changed || obs.newly_lost || obs.returned {
                audit_once(&shared, &watch, &infos).await;
                last_audit = Some(Instant::now());
            }
            heal_pass(&shared, &infos).await;
            let nodes: Vec<NodeView> = infos.iter().map(NodeView::from).collect();
            if movers.due(&nodes, shared.rebalance_gate.is_some()) {
                let busy = move_once(&shared, &nodes).await;
                movers.done(busy);
            }
            worker.ran();
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = pass => {}
        }
    }
    shared.update(|s| s.state = HealState::Paused);
    tracing::debug!("heal worker stopped");
}

async fn audit_once(shared: &Shared, watch: &NodeWatch, infos: &[DatanodeInfo]) {
    shared.update(|s| s.state = HealState::Auditing);
    let live: BTreeSet<u64> = infos.iter().filter(|d| d.live).map(|d| d.id).collect();
    let pass = audit::audit_pass(
        &shared.store,
        shared.meta.as_ref(),
        watch,
        &live,
        shared.config.audit_verify_timeout,
    );
    match pass.await {
        Ok(r) => {
            metrics::counter!(names::AUDIT_PASSES).increment(1);
            metrics::counter!(names::AUDIT_SHARDS_CHECKED).increment(r.shards_checked);
            metrics::counter!(names::AUDIT_MISSING).increment(r.missing_reported);
            metrics::counter!(names::AUDIT_VERIFIED).increment(r.verified);
            metrics::counter!(names::AUDIT_UNMARKED).increment(r.present_reported);
            shared.update(|s| {
                s.audit_passes += 1;
                s.audit_shards_checked += r.shards_checked;
                s.audit_missing += r.missing_reported;
                s.audit_verified += r.verified;
                s.audit_unmarked += r.present_reported;
            });
            tracing::info!(
                blobs = r.blobs,
                checked = r.shards_checked,
                missing = r.missing_reported,
                unchecked = r.unchecked,
                verified = r.verified,
                unmarked = r.present_reported,
                "audit pass done"
            );
        }
        Err(e) => tracing::warn!(error = %e, "audit pass failed"),
    }
    shared.update(|s| s.state = HealState::Idle);
}

/// One move pass (drain, rebalance); `true` when it moved or failed to
/// move anything (another pass is due).
async fn move_once(shared: &Shared, nodes: &[NodeView]) -> bool {
    let cx = |gate| RebuildContext {
        store: &shared.store,
        meta: shared.meta.as_ref(),
        gate,
        epochs: &shared.epochs,
        credit_stall: shared.config.stall_timeout,
    };
    let drain = cx(&shared.gate);
    let rebalance = shared.rebalance_gate.as_ref().map(cx);
    match mover::move_pass(shared.meta.as_ref(), &drain, rebalance.as_ref(), nodes).await {
        Ok(r) => {
            let busy = r.drained_shards + r.rebalanced_shards + r.failed > 0;
            shared.update(|s| {
                s.drained_shards += r.drained_shards;
                s.rebalanced_shards += r.rebalanced_shards;
            });
            if r.drained_shards + r.rebalanced_shards + r.failed > 0 {
                tracing::info!(
                    drained = r.drained_shards,
                    rebalanced = r.rebalanced_shards,
                    failed = r.failed,
                    bytes = r.bytes,
                    "move pass done"
                );
            }
            busy
        }
        Err(e) => {
            tracing::warn!(error = %e, "move pass failed");
            true
        }
    }
}

/// One pass over the degraded list.
async fn heal_pass(shared: &Shared, infos: &[DatanodeInfo]) {
    let nodes: Vec<NodeView> = infos.iter().map(NodeView::from).collect();
    let cx = RebuildContext {
        store: &shared.store,
        meta: shared.meta.as_ref(),
        gate: &shared.gate,
        epochs: &shared.epochs,
        credit_stall: shared.config.stall_timeout,
    };
    let mut by_missing: BTreeMap<usize, u64> = BTreeMap::new();
    let (mut healed, mut failed, mut bytes) = (0u64, 0u64, 0u64);
    let mut after = String::new();
    shared.update(|s| s.state = HealState::Healing);
    loop {
        let page = match shared
            .meta
            .list_placements(ListPlacementsRequest {
                after_blob_id: after.clone(),
                limit: DEGRADED_PAGE,
                degraded_only: true,
            })
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "heal: listing degraded blobs");
                break;
            }
        };
        let placements: Vec<_> = page
            .blobs
            .iter()
            .filter_map(|b| b.placement.clone())
            .collect();
        for p in &placements {
            *by_missing.entry(p.missing.len()).or_default() += 1;
        }
        shared.update(|s| s.queue_blobs += placements.len() as u64);
        metrics::gauge!(names::QUEUE_BLOBS).increment(placements.len() as f64);
        // At most `concurrency` rebuilds in flight.
        let mut inflight = futures::stream::FuturesUnordered::new();
        let mut queued = placements.iter();
        loop {
            while inflight.len() < shared.config.concurrency {
                let Some(p) = queued.next() else { break };
                inflight.push(rebuild_one(&cx, p, &nodes));
            }
            let Some((p, outcome)) = inflight.next().await else {
                break;
            };
            metrics::gauge!(names::QUEUE_BLOBS).decrement(1.0);
            match outcome {
                Ok(h) => {
                    healed += 1;
                    bytes += h.bytes;
                    metrics::counter!(names::HEALED_BLOBS).increment(1);
                    metrics::counter!(names::BYTES).increment(h.bytes);
                    tracing::debug!(blob_id = %p.blob_id, targets = ?h.targets, bytes = h.bytes, "healed blob");
                    shared.update(|s| {
                        s.queue_blobs = s.queue_blobs.saturating_sub(1);
                        s.healed_blobs += 1;
                        s.heal_bytes += h.bytes;
                    });
                }
                Err(e) => {
                    failed += 1;
                    record_failure(shared, &p.blob_id, &e);
                }
            }
        }
        match page.blobs.last().and_then(|b| b.placement.as_ref()) {
            Some(p) if page.is_truncated => after = p.blob_id.clone(),
            _ => break,
        }
    }
    for missing in 1..=nodes
        .len()
        .max(by_missing.keys().copied().max().unwrap_or(0))
    {
        let count = by_missing.get(&missing).copied().unwrap_or(0);
        metrics::gauge!(names::DEGRADED_BLOBS, "missing" => missing.to_string()).set(count as f64);
    }
    let degraded: u64 = by_missing.values().sum();
    shared.update(|s| {
        s.degraded_by_missing = by_missing;
        s.queue_blobs = 0;
        s.state = HealState::Idle;
    });
    metrics::gauge!(names::QUEUE_BLOBS).set(0.0);
    if degraded > 0 {
        tracing::info!(degraded, healed, failed, bytes, "heal pass done");
    }
}

async fn rebuild_one<'a>(
    cx: &RebuildContext<'_>,
    p: &'a sluice_proto::meta::Placement,
    nodes: &[NodeView],
) -> (
    &'a sluice_proto::meta::Placement,
    Result<rebuild::Healed, HealError>,
) {
    (p, rebuild::rebuild_blob(cx, p, nodes).await)
}

fn record_failure(shared: &Shared, blob_id: &str, e: &HealError) {
    let reason = e.reason();
    metrics::counter!(names::FAILED, "reason" => reason).increment(1);
    shared.update(|s| {
        s.queue_blobs = s.queue_blobs.saturating_sub(1);
        *s.failed.entry(reason).or_default() += 1;
    });
    match e {
        HealError::Lost(code) => {
            tracing::debug!(
                blob_id,
                ?code,
                "heal lost the race; the new shards are garbage for GC"
            )
        }
        HealError::Skipped(skip) => tracing::debug!(blob_id, %skip, "heal skipped, retried later"),
        other => tracing::warn!(blob_id, error = %other, "heal failed, retried later"),
    }
}
