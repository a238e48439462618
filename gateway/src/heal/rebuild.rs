//! Rebuilding one degraded blob (`docs/design/durability.md` §6, "Rebuild").
//!
//! 1. [`choose_targets`]: for every missing shard index `i`, the same node
//!    `P.nodes[i]` when it is live and writable (in-place repair of a
//!    wiped or corrupt shard), else a live writable node that is not
//!    draining and holds no shard of the blob, chosen by
//!    [`crate::placement::pick_one`]: weighted rendezvous order seeded by
//!    blob id and index, within the same host/zone caps as placement
//!    (best effort when the cluster is too small). [`choose_moves`] does
//!    the same for shards moved off a draining or misplaced node (drain,
//!    rebalance): those are still read as sources. The blob
//!    is skipped (retried on a later pass) when a missing shard has no
//!    target or fewer than k shards are healthy.
//! 2. `BeginHeal` for every (index, target) under the epoch of an
//!    [`EpochGuard`] held until `UpdatePlacement`.
//! 3. Stripe by stripe: a stripe permit from the client write budget
//!    ([`HealGate`]), k healthy shard blocks read with `GetShard`
//!    (CRC32C and length checked; a bad shard is failed for the rest of
//!    the blob, another is opened at the current stripe, and the bad one
//!    is reported missing afterwards), the missing blocks rebuilt with the
//!    codec and streamed with `PutShard` to the targets, each block
//!    debited from that datanode's credit and from the bandwidth bucket
//!    first. Each `PutShard` ends with `ShardEnd` and its answer is
//!    checked against the blocks and bytes sent.
//! 4. `UpdatePlacement` compare-and-set against the placement read.
//!    `PLACEMENT_CHANGED` / `EPOCH_CLOSED` is a lost race
//!    ([`HealError::Lost`]); the new shards are garbage for datanode GC.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use sluice_meta_client::MetaError;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    GetShardRequest, GetShardResponse, PutShardRequest, PutShardResponse, ShardBlock, ShardEnd,
    ShardHeader,
};
use sluice_proto::meta::{
    BeginHealRequest, ErrorCode, Placement, ShardRef, UpdatePlacementRequest,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::Streaming;

use super::HealMeta;
use super::rate::{GateError, HealGate, HealStripe};
use crate::blob::{BlobStore, SHARD_STALL_TIMEOUT};
use crate::epoch::WriteEpochs;
use crate::erasure::Codec;
use crate::layout::Layout;

/// Blocks queued per heal `PutShard` stream (the stream's channel bound).
pub const HEAL_SHARD_CHANNEL_DEPTH: usize = 2;

/// A datanode as the heal worker sees it (from `ListDatanodes`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    pub id: u64,
    /// Heartbeat seen within meta's liveness window.
    pub live: bool,
    /// Free space above its reserve and disk healthy.
    pub writable: bool,
    /// Failure-domain labels and free bytes (see [`crate::placement`]).
    pub zone: String,
    pub host: String,
    pub free_bytes: u64,
    /// Marked draining: a source, never a target.
    pub draining: bool,
}

impl NodeView {
    /// A target for new shards: live, writable, not draining.
    pub fn accepts_shards(&self) -> bool {
        self.live && self.writable && !self.draining
    }

    fn candidate(&self) -> crate::placement::Candidate<'_> {
        crate::placement::Candidate {
            id: self.id,
            zone: &self.zone,
            host: &self.host,
            free_bytes: self.free_bytes,
        }
    }
}

impl From<&sluice_proto::meta::DatanodeInfo> for NodeView {
    fn from(d: &sluice_proto::meta::DatanodeInfo) -> Self {
        NodeView {
            id: d.id,
            live: d.live,
            writable: d.writable,
            zone: d.zone.clone(),
            host: d.host.clone(),
            free_bytes: d.free_bytes,
            draining: d.draining,
        }
    }
}

/// Why a blob is not healed on this pass (it stays degraded and is
/// retried on the next one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// Nothing is missing.
    #[error("no shard missing")]
    NothingMissing,
    /// The placement's shape is wrong (node count, k, m, block size).
    #[error("malformed placement: {0}")]
    Malformed(String),
    /// Fewer than k shards are on live nodes and not missing.
    #[error("{healthy} healthy shards, {needed} needed")]
    NotEnoughHealthy { healthy: usize, needed: usize },
    /// No live writable node can take shard `index`.
    #[error("no live writable node can take shard {index}")]
    NoTarget { index: u32 },
}

/// Why a rebuild ended without a new placement.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    #[error("skipped: {0}")]
    Skipped(#[from] Skip),
    /// The compare-and-set lost a race (`PLACEMENT_CHANGED`, `EPOCH_CLOSED`).
    #[error("lost the race: {0:?}")]
    Lost(ErrorCode),
    #[error("meta: {0}")]
    Meta(#[source] MetaError),
    /// Fewer than k shards of a stripe could be read and verified.
    #[error("stripe {stripe} unreadable: {reason}")]
    Unreadable { stripe: u64, reason: String },
    /// A rebuilt shard could not be written.
    #[error("writing shard {index} to node {node}: {reason}")]
    Write {
        index: u32,
        node: u64,
        reason: String,
    },
    /// No stripe buffer or bandwidth (the gateway is busy, or heal is off).
    #[error("{0}")]
    Gate(#[from] GateError),
    /// The codec refused the stripe.
    #[error("reconstructing stripe {stripe}: {reason}")]
    Codec { stripe: u64, reason: String },
}

impl HealError {
    /// The `reason` label of `sluice_heal_failed_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            HealError::Skipped(Skip::NotEnoughHealthy { .. }) => "not_enough_healthy",
            HealError::Skipped(Skip::NoTarget { .. }) => "no_target",
            HealError::Skipped(_) => "skipped",
            HealError::Lost(_) => "lost_race",
            HealError::Meta(_) => "meta",
            HealError::Unreadable { .. } => "unreadable",
            HealError::Write { .. } => "write",
            HealError::Gate(GateError::Disabled) => "disabled",
            HealError::Gate(_) => "busy",
            HealError::Codec { .. } => "codec",
        }
    }
}

fn meta_err(e: MetaError) -> HealError {
    match e.code() {
        Some(code @ (ErrorCode::PlacementChanged | ErrorCode::EpochClosed)) => {
            HealError::Lost(code)
        }
        _ => HealError::Meta(e),
    }
}

/// A finished heal: the new placement and what was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Healed {
    pub placement: Placement,
    /// (shard index, target node) rebuilt.
    pub targets: Vec<(u32, u64)>,
    /// Shard bytes written (all targets).
    pub bytes: u64,
    /// Source shards found bad while reading (reported missing).
    pub bad_sources: Vec<u32>,
}

/// The missing indices of `p`, deduplicated, in order, inside `0..n`.
fn missing_set(p: &Placement) -> BTreeSet<u32> {
    p.missing
        .iter()
        .copied()
        .filter(|&i| (i as usize) < p.nodes.len())
        .collect()
}

/// Picks a target node for every missing shard of `p` (see the module
/// doc). Returns (index, node) in index order. No node ends up holding two
/// shards of the blob.
pub fn choose_targets(p: &Placement, nodes: &[NodeView]) -> Result<Vec<(u32, u64)>, Skip> {
    let (k, m) = (p.data_shards as usize, p.parity_shards as usize);
    if k == 0 || m == 0 || p.block_size == 0 || p.nodes.len() != k + m {
        return Err(Skip::Malformed(format!(
            "{k}+{m} shards, block size {}, {} nodes",
            p.block_size,
            p.nodes.len()
        )));
    }
    let missing = missing_set(p);
    if missing.is_empty() {
        return Err(Skip::NothingMissing);
    }
    let view = |id: u64| nodes.iter().find(|n| n.id == id);
    let usable = |id: u64| view(id).is_some_and(NodeView::accepts_shards);
    let healthy = (0..p.nodes.len() as u32)
        .filter(|i| !missing.contains(i))
        .filter(|&i| view(p.nodes[i as usize]).is_some_and(|n| n.live))
        .count();
    if healthy < k {
        return Err(Skip::NotEnoughHealthy { healthy, needed: k });
    }
    // Nodes that keep a shard of the blob (the non-missing indices).
    let keeping: BTreeSet<u64> = (0..p.nodes.len())
        .filter(|i| !missing.contains(&(*i as u32)))
        .map(|i| p.nodes[i])
        .collect();
    let mut taken: BTreeSet<u64> = BTreeSet::new();
    let mut chosen: Vec<(u32, Option<u64>)> = Vec::with_capacity(missing.len());
    for &i in &missing {
        let node = p.nodes[i as usize];
        let in_place = usable(node) && !keeping.contains(&node) && !taken.contains(&node);
        if in_place {
            taken.insert(node);
        }
        chosen.push((i, in_place.then_some(node)));
    }
    let every: BTreeSet<u64> = p.nodes.iter().copied().collect();
    let mut out = Vec::with_capacity(chosen.len());
    for (i, target) in chosen {
        let target = match target {
            Some(t) => t,
            None => {
                let t = pick_target(p, i, &missing, &every, &taken, nodes)
                    .ok_or(Skip::NoTarget { index: i })?;
                taken.insert(t);
                t
            }
        };
        out.push((i, target));
    }
    Ok(out)
}

/// A new node for shard `i` of `p` by [`crate::placement::pick_one`]: not
/// in `every` (the blob's nodes) nor `taken`, accepting shards, the
/// domains counted over the shards that stay (indices not in `leaving`,
/// plus those already `taken`).
fn pick_target(
    p: &Placement,
    i: u32,
    leaving: &BTreeSet<u32>,
    every: &BTreeSet<u64>,
    taken: &BTreeSet<u64>,
    nodes: &[NodeView],
) -> Option<u64> {
    let view = |id: u64| nodes.iter().find(|n| n.id == id);
    let unknown: Vec<NodeView> = p
        .nodes
        .iter()
        .chain(taken.iter())
        .filter(|id| view(**id).is_none())
        .map(|&id| NodeView {
            id,
            ..NodeView::default()
        })
        .collect();
    let label = |id: u64| {
        view(id)
            .or_else(|| unknown.iter().find(|n| n.id == id))
            .map(NodeView::candidate)
    };
    let keeping: Vec<crate::placement::Candidate<'_>> = (0..p.nodes.len())
        .filter(|j| !leaving.contains(&(*j as u32)))
        .map(|j| p.nodes[j])
        .chain(taken.iter().copied())
        .filter_map(label)
        .collect();
    let eligible: Vec<crate::placement::Candidate<'_>> = nodes
        .iter()
        .filter(|n| n.accepts_shards() && !every.contains(&n.id) && !taken.contains(&n.id))
        .map(NodeView::candidate)
        .collect();
    let key = format!("{}/{i}", p.blob_id);
    crate::placement::pick_one(
        &key,
        &eligible,
        &keeping,
        p.data_shards as usize,
        p.parity_shards as usize,
    )
}

/// Targets for moving shards `moving` of `p` off their nodes (a draining
/// node, or a node the current placement would not choose): one new node
/// per index, as for a missing shard, in index order. Unlike
/// [`choose_targets`] the moved shards stay readable sources and nothing
/// else may be missing or down: a blob that needs heal is left to heal.
pub fn choose_moves(
    p: &Placement,
    moving: &[u32],
    nodes: &[NodeView],
) -> Result<Vec<(u32, u64)>, Skip> {
    let (k, m) = (p.data_shards as usize, p.parity_shards as usize);
    if k == 0 || m == 0 || p.block_size == 0 || p.nodes.len() != k + m {
        return Err(Skip::Malformed(format!(
            "{k}+{m} shards, block size {}, {} nodes",
            p.block_size,
            p.nodes.len()
        )));
    }
    let leaving: BTreeSet<u32> = moving
        .iter()
        .copied()
        .filter(|&i| (i as usize) < p.nodes.len())
        .collect();
    if leaving.is_empty() {
        return Err(Skip::NothingMissing);
    }
    let live = |id: u64| nodes.iter().any(|n| n.id == id && n.live);
    let healthy = (0..p.nodes.len())
        .filter(|&i| !p.missing.contains(&(i as u32)) && live(p.nodes[i]))
        .count();
    if healthy < k {
        return Err(Skip::NotEnoughHealthy { healthy, needed: k });
    }
    let every: BTreeSet<u64> = p.nodes.iter().copied().collect();
    let mut taken: BTreeSet<u64> = BTreeSet::new();
    let mut out = Vec::with_capacity(leaving.len());
    for &i in &leaving {
        let t = pick_target(p, i, &leaving, &every, &taken, nodes)
            .ok_or(Skip::NoTarget { index: i })?;
        taken.insert(t);
        out.push((i, t));
    }
    Ok(out)
}

/// `p` with every (index, node) of `targets` placed and removed from
/// `missing`: the placement `UpdatePlacement` installs.
pub fn healed_placement(p: &Placement, targets: &[(u32, u64)]) -> Placement {
    let mut next = p.clone();
    for &(i, node) in targets {
        next.nodes[i as usize] = node;
    }
    next.missing
        .retain(|i| !targets.iter().any(|(t, _)| t == i));
    next
}

/// State of one source shard during a rebuild.
enum Source {
    Idle,
    Open(Box<Streaming<GetShardResponse>>),
    Failed,
}

/// One target's `PutShard` stream.
struct Target {
    index: u32,
    node: u64,
    tx: Option<mpsc::Sender<(PutShardRequest, Option<Arc<HealStripe>>)>>,
    task: Option<JoinHandle<Result<PutShardResponse, tonic::Status>>>,
    credit: Arc<crate::credit::NodeCredit>,
    blocks: u64,
    bytes: u64,
}

impl Drop for Target {
    fn drop(&mut self) {
        // An unfinished stream is reset; the datanode discards it.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Target {
    fn write_err(&self, reason: impl Into<String>) -> HealError {
        HealError::Write {
            index: self.index,
            node: self.node,
            reason: reason.into(),
        }
    }

    async fn send(&mut self, msg: Msg, stripe: Option<Arc<HealStripe>>) -> Result<(), HealError> {
        let Some(tx) = &self.tx else {
            return Err(self.write_err("stream already ended"));
        };
        let req = PutShardRequest { msg: Some(msg) };
        match tokio::time::timeout(SHARD_STALL_TIMEOUT, tx.send((req, stripe))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.write_err("PutShard ended early")),
            Err(_) => Err(self.write_err(format!("no progress for {SHARD_STALL_TIMEOUT:?}"))),
        }
    }
}

/// Everything a rebuild reads and writes through.
pub struct RebuildContext<'a> {
    pub store: &'a BlobStore,
    pub meta: &'a dyn HealMeta,
    pub gate: &'a HealGate,
    pub epochs: &'a WriteEpochs,
    /// Longest wait for one datanode's credit.
    pub credit_stall: Duration,
}

/// Rebuilds the missing shards of `p` (see the module doc) and installs
/// the healed placement. `nodes` is the datanode set to choose targets
/// from. Errors: [`HealError`]; on any error before the compare-and-set
/// the new shards' streams are reset or left for GC.
pub async fn rebuild_blob(
    cx: &RebuildContext<'_>,
    p: &Placement,
    nodes: &[NodeView],
) -> Result<Healed, HealError> {
    let targets = choose_targets(p, nodes)?;
    rebuild_onto(cx, p, targets, nodes).await
}

/// Writes shard `i` of `p` onto `node` for every `(i, node)` of `targets`
/// (missing shards rebuilt, moved ones copied or rebuilt from any k
/// readable shards) and installs the new placement with the
/// compare-and-set against `p`. [`rebuild_blob`] and the mover use it.
pub async fn rebuild_onto(
    cx: &RebuildContext<'_>,
    p: &Placement,
    targets: Vec<(u32, u64)>,
    nodes: &[NodeView],
) -> Result<Healed, HealError> {
    let codec = cx.store.heal_codec();
    let (k, m) = (p.data_shards as usize, p.parity_shards as usize);
    let codec = if (codec.data_shards(), codec.parity_shards()) == (k, m) {
        codec.clone()
    } else {
        Codec::new(k, m).map_err(|e| Skip::Malformed(e.to_string()))?
    };
    let n = k + m;
    let guard = cx.epochs.begin_write();
    let epoch = guard.epoch();
    for &(i, node) in &targets {
        cx.meta
            .begin_heal(BeginHealRequest {
                blob_id: p.blob_id.clone(),
                shard_index: i,
                node_id: node,
                epoch,
                op_id: String::new(),
            })
            .await
            .map_err(meta_err)?;
    }

    let layout = Layout::new(p.size, k, p.block_size as usize);
    let stripes = layout.stripe_count();
    let mut outs = Vec::with_capacity(targets.len());
    for &(index, node) in &targets {
        outs.push(open_target(cx.store, p, index, node)?);
    }
    for t in &mut outs {
        let header = ShardHeader {
            blob_id: p.blob_id.clone(),
            shard_index: t.index,
            block_size: p.block_size,
            gateway_id: cx.store.gateway_id().to_string(),
        };
        t.send(Msg::Header(header), None).await?;
    }

    let missing = missing_set(p);
    let live = |id: u64| nodes.iter().any(|v| v.id == id && v.live);
    // Data shards first: then most stripes need no decoding at all.
    let preference: Vec<usize> = (0..n)
        .filter(|i| !missing.contains(&(*i as u32)) && live(p.nodes[*i]))
        .collect();
    let mut sources: Vec<Source> = (0..n).map(|_| Source::Idle).collect();
    let mut bad: Vec<u32> = Vec::new();
    let rebuild_parity = targets.iter().any(|(i, _)| *i as usize >= k);

    for s in 0..stripes {
        let block_len = layout.block_len(s);
        let stripe = Arc::new(
            cx.gate
                .stripe_permit(cx.store, (n * block_len) as u64)
                .await?,
        );
        let mut got: Vec<Option<Vec<u8>>> = vec![None; n];
        loop {
            let have = got.iter().filter(|b| b.is_some()).count();
            if have >= k {
                break;
            }
            let want: Vec<usize> = preference
                .iter()
                .copied()
                .filter(|&i| got[i].is_none() && !matches!(sources[i], Source::Failed))
                .take(k - have)
                .collect();
            if want.len() < k - have {
                return Err(HealError::Unreadable {
                    stripe: s,
                    reason: format!("{} of {k} shards readable", have + want.len()),
                });
            }
            let fetches = sources
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| want.contains(i))
                .map(|(i, slot)| {
                    let (store, blob_id, node) = (cx.store, p.blob_id.as_str(), p.nodes[i]);
                    async move {
                        let r =
                            next_block(store, blob_id, node, i, s, stripes, block_len, slot).await;
                        (i, r)
                    }
                });
            for (i, result) in futures::future::join_all(fetches).await {
                match result {
                    Ok(block) => got[i] = Some(block.to_vec()),
                    Err(reason) => {
                        tracing::debug!(blob_id = %p.blob_id, shard = i, node = p.nodes[i], stripe = s,
                            error = %reason, "heal: source shard unreadable, using another");
                        sources[i] = Source::Failed;
                        bad.push(i as u32);
                    }
                }
            }
        }
        let blocks = rebuild_stripe(&codec, got, rebuild_parity)
            .map_err(|reason| HealError::Codec { stripe: s, reason })?;
        for t in &mut outs {
            let data = blocks[t.index as usize].clone();
            cx.gate.throttle(data.len() as u64).await?;
            t.credit
                .debit(data.len() as u64, cx.credit_stall)
                .await
                .map_err(|e| t.write_err(e.to_string()))?;
            let crc32c = sluice_proto::shard::block_crc32c(&data);
            t.blocks += 1;
            t.bytes += data.len() as u64;
            t.send(
                Msg::Block(ShardBlock { data, crc32c }),
                Some(Arc::clone(&stripe)),
            )
            .await?;
        }
    }
    drop(sources);

    for t in &mut outs {
        let end = ShardEnd {
            blocks: t.blocks,
            bytes: t.bytes,
        };
        t.send(Msg::End(end), None).await?;
        t.tx = None;
    }
    let (blocks, bytes) = (layout.stripe_count(), layout.shard_bytes());
    let mut written = 0u64;
    for t in &mut outs {
        let Some(mut task) = t.task.take() else {
            return Err(t.write_err("no PutShard task"));
        };
        match tokio::time::timeout(SHARD_STALL_TIMEOUT, &mut task).await {
            Ok(Ok(Ok(r))) if r.blocks == blocks && r.bytes_written == bytes => {
                written += r.bytes_written;
            }
            Ok(Ok(Ok(r))) => {
                return Err(t.write_err(format!(
                    "datanode stored {} blocks / {} bytes, expected {blocks} / {bytes}",
                    r.blocks, r.bytes_written
                )));
            }
            Ok(Ok(Err(status))) => {
                return Err(t.write_err(format!("{}: {}", status.code(), status.message())));
            }
            Ok(Err(e)) => return Err(t.write_err(format!("PutShard task: {e}"))),
            Err(_) => {
                task.abort();
                return Err(t.write_err("no acknowledgement"));
            }
        }
    }

    let next = healed_placement(p, &targets);
    cx.meta
        .update_placement(UpdatePlacementRequest {
            blob_id: p.blob_id.clone(),
            expected: Some(p.clone()),
            placement: Some(next.clone()),
            epoch,
            op_id: String::new(),
        })
        .await
        .map_err(meta_err)?;
    // `guard` (the epoch) stays held until this function returns, past the CAS.

    bad.sort_unstable();
    bad.dedup();
    for &i in &bad {
        let node = next.nodes[i as usize];
        let shard = ShardRef {
            blob_id: p.blob_id.clone(),
            shard_index: i,
        };
        if let Err(e) = cx.meta.report_missing(node, vec![shard]).await {
            tracing::warn!(blob_id = %p.blob_id, shard = i, node, error = %e, "heal: reporting a bad source shard");
        }
    }
    Ok(Healed {
        placement: next,
        targets,
        bytes: written,
        bad_sources: bad,
    })
}

/// Opens the `PutShard` stream of one target (its task starts at once;
/// the header is sent by the caller).
fn open_target(
    store: &BlobStore,
    p: &Placement,
    index: u32,
    node: u64,
) -> Result<Target, HealError> {
    let err = |reason: String| HealError::Write {
        index,
        node,
        reason,
    };
    let credit = store.heal_credit(node).map_err(|e| err(e.to_string()))?;
    let mut client = store.heal_client(node).map_err(|e| err(e.to_string()))?;
    let (tx, rx) =
        mpsc::channel::<(PutShardRequest, Option<Arc<HealStripe>>)>(HEAL_SHARD_CHANNEL_DEPTH);
    // The stripe permit travels with its block until tonic takes it.
    let requests = tokio_stream::wrappers::ReceiverStream::new(rx).map(|(req, _stripe)| req);
    let blob_id = p.blob_id.clone();
    let task = tokio::spawn(async move {
        let r = client.put_shard(requests).await.map(|r| r.into_inner());
        if let Err(status) = &r {
            tracing::debug!(%blob_id, index, node, error = %status, "heal: PutShard failed");
        }
        r
    });
    Ok(Target {
        index,
        node,
        tx: Some(tx),
        task: Some(task),
        credit,
        blocks: 0,
        bytes: 0,
    })
}

/// The blocks of one stripe with every shard present: `got` has at least
/// k blocks of equal length. Missing data blocks are reconstructed; when
/// `parity` is set the stripe is re-encoded to get every parity block too
/// (the data blocks are moved into one stripe buffer one at a time, so
/// the peak stays within the stripe's `(k + m) * block_len` permit).
fn rebuild_stripe(
    codec: &Codec,
    mut got: Vec<Option<Vec<u8>>>,
    parity: bool,
) -> Result<Vec<Bytes>, String> {
    let k = codec.data_shards();
    if got[..k].iter().any(Option::is_none) {
        codec
            .reconstruct_data(&mut got)
            .map_err(|e| e.to_string())?;
    }
    if !parity {
        return got
            .into_iter()
            .map(|b| Ok(b.map(Bytes::from).unwrap_or_default()))
            .collect();
    }
    // Parity sources are not needed any more.
    got.truncate(k);
    let len = got.first().and_then(|b| b.as_ref()).map_or(0, Vec::len);
    let mut stripe = BytesMut::with_capacity(k * len);
    for b in &mut got {
        let block = b.take().ok_or("reconstruction left a data block empty")?;
        stripe.extend_from_slice(&block);
    }
    Ok(codec.encode(stripe.freeze()))
}

/// Reads block `stripe` of shard `shard` on `node`, opening its GetShard
/// stream (from that block to the end) on first use; checks length and
/// CRC32C. `Err` says why the shard must not be used any more.
#[allow(clippy::too_many_arguments)]
async fn next_block(
    store: &BlobStore,
    blob_id: &str,
    node: u64,
    shard: usize,
    stripe: u64,
    stripes: u64,
    block_len: usize,
    slot: &mut Source,
) -> Result<Bytes, String> {
    if matches!(slot, Source::Idle) {
        let mut client = store.heal_client(node).map_err(|e| e.to_string())?;
        let req = GetShardRequest {
            blob_id: blob_id.to_string(),
            shard_index: shard as u32,
            first_block: stripe,
            block_count: stripes - stripe,
        };
        let stream = match tokio::time::timeout(SHARD_STALL_TIMEOUT, client.get_shard(req)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => return Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => return Err(format!("no answer within {SHARD_STALL_TIMEOUT:?}")),
        };
        *slot = Source::Open(Box::new(stream));
    }
    let Source::Open(stream) = slot else {
        return Err("shard already failed".into());
    };
    let message = match tokio::time::timeout(SHARD_STALL_TIMEOUT, stream.message()).await {
        Ok(Ok(Some(m))) => m,
        Ok(Ok(None)) => return Err(format!("stream ended before block {stripe}")),
        Ok(Err(status)) => return Err(format!("{}: {}", status.code(), status.message())),
        Err(_) => return Err(format!("no block within {SHARD_STALL_TIMEOUT:?}")),
    };
    let block = message.block.ok_or("response without a block")?;
    if block.data.len() != block_len {
        return Err(format!(
            "block {stripe} has {} bytes, expected {block_len}",
            block.data.len()
        ));
    }
    let computed = sluice_proto::shard::block_crc32c(&block.data);
    if computed != block.crc32c {
        return Err(format!(
            "block {stripe} checksum mismatch: stored {:08x}, computed {computed:08x}",
            block.crc32c
        ));
    }
    Ok(block.data)
}
