//! Degraded blobs, heal intents, placement compare-and-set and the GC
//! question (Collectable). See the heal section of `proto/meta.proto` and
//! `docs/design/durability.md` §5 and §6.
//!
//! # Heal intents
//! [`Space::HealIntents`] holds two key families per intent, so that both
//! lookups are point reads or prefix scans:
//! * by shard: `0x01 | node (u64 BE) | shard index (u32 BE) | blob id` ->
//!   the epoch (u64 BE) the intent was recorded under (Collectable,
//!   UpdatePlacement);
//! * by epoch: `0x02 | epoch (u64 BE) | node (u64 BE) | shard index (u32
//!   BE) | blob id` -> empty ([`drop_intents_of_epoch`] when the epoch
//!   closes).
//!
//! One (node, blob, index) has at most one intent: a BeginHeal under another
//! epoch moves it to that epoch.
//!
//! [`drop_intents_of_epoch`] is called by `sm::epochs::close_epochs` and
//! must keep its signature.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use sluice_proto::blob_id;
use sluice_proto::meta::{self as pb, ErrorCode};

use super::refs::{self, PlacementRecords, mark_degraded};
use super::{Applied, SmError, epochs, pending, refuse};
use crate::store::{Batch, KvStore, Space, as_ref_bound, prefix_end};

type Outcome = Result<(Batch, Applied), SmError>;

/// Most shards one [`collectable`], ReportMissing or ReportPresent call
/// accepts.
pub const MAX_SHARDS_PER_CALL: usize = 1000;

const BY_SHARD: u8 = 1;
const BY_EPOCH: u8 = 2;

/// Intent keys removed per scan while dropping the intents of an epoch.
const DROP_CHUNK: usize = 1024;

/// Key of the by-shard family.
fn intent_key(node: u64, blob_id: &str, index: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(13 + blob_id.len());
    k.push(BY_SHARD);
    k.extend_from_slice(&node.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k.extend_from_slice(blob_id.as_bytes());
    k
}

/// The prefix of every by-epoch key of `epoch`.
fn epoch_prefix(epoch: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(BY_EPOCH);
    k.extend_from_slice(&epoch.to_be_bytes());
    k
}

/// Key of the by-epoch family.
fn epoch_key(epoch: u64, node: u64, blob_id: &str, index: u32) -> Vec<u8> {
    let mut k = epoch_prefix(epoch);
    k.extend_from_slice(&node.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k.extend_from_slice(blob_id.as_bytes());
    k
}

/// The epoch of the heal intent for (node, blob, index), if there is one.
pub fn intent_epoch<K: KvStore>(
    kv: &K,
    node: u64,
    blob_id: &str,
    index: u32,
) -> Result<Option<u64>, SmError> {
    match kv.get(Space::HealIntents, &intent_key(node, blob_id, index))? {
        None => Ok(None),
        Some(v) => {
            let bytes: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| SmError::BadKey(Space::HealIntents))?;
            Ok(Some(u64::from_be_bytes(bytes)))
        }
    }
}

fn put_intent(b: &mut Batch, node: u64, blob_id: &str, index: u32, epoch: u64) {
    b.put(
        Space::HealIntents,
        intent_key(node, blob_id, index),
        epoch.to_be_bytes().to_vec(),
    );
    b.put(
        Space::HealIntents,
        epoch_key(epoch, node, blob_id, index),
        Vec::new(),
    );
}

fn delete_intent(b: &mut Batch, node: u64, blob_id: &str, index: u32, epoch: u64) {
    b.delete(Space::HealIntents, intent_key(node, blob_id, index));
    b.delete(Space::HealIntents, epoch_key(epoch, node, blob_id, index));
}

/// Adds to `b` the removal of every heal intent recorded under `epoch`.
pub(crate) fn drop_intents_of_epoch<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    epoch: u64,
) -> Result<(), SmError> {
    let prefix = epoch_prefix(epoch);
    let end = prefix_end(&prefix);
    let end = match &end {
        Some(e) => Bound::Excluded(e.as_slice()),
        None => Bound::Unbounded,
    };
    let mut from: Bound<Vec<u8>> = Bound::Included(prefix.clone());
    loop {
        let rows = kv.scan(Space::HealIntents, as_ref_bound(&from), end, DROP_CHUNK)?;
        let n = rows.len();
        for (k, _) in rows {
            let rest = k
                .get(prefix.len()..)
                .filter(|r| r.len() >= 12)
                .ok_or(SmError::BadKey(Space::HealIntents))?;
            let node = u64::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
            let index = u32::from_be_bytes(rest[8..12].try_into().expect("4 bytes"));
            let blob = std::str::from_utf8(&rest[12..])
                .map_err(|_| SmError::BadKey(Space::HealIntents))?;
            // The by-shard key names this epoch unless a later BeginHeal
            // moved the intent (then that move removed this key already).
            if intent_epoch(kv, node, blob, index)? == Some(epoch) {
                b.delete(Space::HealIntents, intent_key(node, blob, index));
            }
            b.delete(Space::HealIntents, k.clone());
            from = Bound::Excluded(k);
        }
        if n < DROP_CHUNK {
            return Ok(());
        }
    }
}

/// Refuses `InvalidArgument` for more than [`MAX_SHARDS_PER_CALL`] shards
/// `what` (asked, reported) in one call.
fn per_call_limit(n: usize, what: &str) -> Result<(), SmError> {
    if n > MAX_SHARDS_PER_CALL {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("{n} shards {what}, at most {MAX_SHARDS_PER_CALL} per call"),
        );
    }
    Ok(())
}

/// `true` when the committed placement puts shard `index` of its blob on
/// `node` and does not list it missing.
fn places(placement: &pb::Placement, node: u64, index: u32) -> bool {
    assigns(placement, node, index) && !placement.missing.contains(&index)
}

/// `true` when the committed placement assigns shard index `index` to
/// `node`, listed missing or not. A shard marked missing may still be on
/// its node (which was only down, or partitioned from the auditor), so it
/// is kept until heal assigns the index elsewhere.
fn assigns(placement: &pb::Placement, node: u64, index: u32) -> bool {
    placement.nodes.get(index as usize) == Some(&node)
}

/// Shards a placement still counts on: assigned and not listed missing.
fn present(placement: &pb::Placement) -> usize {
    (0..placement.nodes.len() as u32)
        .filter(|i| !placement.missing.contains(i))
        .count()
}

/// Collectable: which of `shards`, stored on datanode `node`, are garbage
/// (`docs/design/durability.md` §5), in request order. A shard is collectable when
/// no heal intent names (node, blob, index), no committed record assigns
/// that shard index of the blob to `node` (even one listed missing: only a
/// heal that moves the index elsewhere releases it), and — when the blob has a
/// pending deletion — the reclaimer claimed it (`delete_delay` passed on
/// the leader's monotonic clock and no read lease names the blob), else the
/// blob's write epoch is closed (or its id names no epoch). No clock is
/// read here. Refuses
/// `InvalidArgument` for more than [`MAX_SHARDS_PER_CALL`] shards.
pub fn collectable<K: KvStore>(
    kv: &K,
    node: u64,
    shards: &[pb::ShardRef],
) -> Result<Vec<pb::ShardRef>, SmError> {
    per_call_limit(shards.len(), "asked")?;
    let mut placements: BTreeMap<&str, Option<pb::Placement>> = BTreeMap::new();
    let mut out = Vec::new();
    for s in shards {
        if intent_epoch(kv, node, &s.blob_id, s.shard_index)?.is_some() {
            continue;
        }
        let placement = match placements.get(s.blob_id.as_str()) {
            Some(p) => p.clone(),
            None => {
                let p = refs::current_placement(kv, &s.blob_id)?.map(|(_, p)| p);
                placements.insert(&s.blob_id, p.clone());
                p
            }
        };
        if placement
            .as_ref()
            .is_some_and(|p| assigns(p, node, s.shard_index))
        {
            continue;
        }
        let settled = match pending::get(kv, &s.blob_id)? {
            Some(d) => d.claimed,
            // An id that names no epoch was never committable (the
            // fence refuses it), so nothing can come to reference it.
            None => match blob_id::epoch_of(&s.blob_id) {
                Ok(epoch) => !epochs::is_open(kv, epoch)?,
                Err(_) => true,
            },
        };
        if settled {
            out.push(s.clone());
        }
    }
    Ok(out)
}

/// ReportMissing: adds each reported shard index to its placement's
/// `missing` when the committed placement still puts that index on the
/// reporting node, it is not missing already, and the placement keeps
/// more than k shards present (otherwise the report is ignored); the
/// blobs become degraded. Returns [`Applied::Marked`] with the
/// number of shards newly marked.
pub(crate) fn report_missing<K: KvStore>(kv: &K, r: &pb::ReportMissingRequest) -> Outcome {
    per_call_limit(r.shards.len(), "reported")?;
    let (b, marked) = mark_missing(kv, r.node_id, &r.shards)?;
    Ok((b, Applied::Marked(marked)))
}

/// Marks `shards` of `node_id` missing where their placement still puts
/// that index on that node and keeps at least k shards present: the batch
/// and how many were marked.
pub(crate) fn mark_missing<K: KvStore>(
    kv: &K,
    node_id: u64,
    shards: &[pb::ShardRef],
) -> Result<(Batch, u32), SmError> {
    edit_missing(kv, shards, |placement, indices| {
        let mut marked = 0;
        for i in indices {
            // Never below k shards believed present: a mark past that
            // cannot help heal (it needs k sources) and would hide shards
            // that may only be on a node that is down for now.
            if places(placement, node_id, i) && present(placement) > placement.data_shards as usize
            {
                placement.missing.push(i);
                marked += 1;
            }
        }
        if marked > 0 {
            placement.missing.sort_unstable();
        }
        marked
    })
}

/// Applies `edit` to the committed placement of every blob `shards` name,
/// with the indices named for it, and writes the placements it changed
/// (`edit` returns how many indices it changed) with their degraded-index
/// entries: the batch and the total changed. Unknown blobs are skipped.
fn edit_missing<K: KvStore>(
    kv: &K,
    shards: &[pb::ShardRef],
    mut edit: impl FnMut(&mut pb::Placement, BTreeSet<u32>) -> u32,
) -> Result<(Batch, u32), SmError> {
    let mut by_blob: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for s in shards {
        by_blob.entry(&s.blob_id).or_default().insert(s.shard_index);
    }
    let mut records = PlacementRecords::default();
    let mut changed: Vec<pb::Placement> = Vec::new();
    let mut total = 0u32;
    for (blob, indices) in by_blob {
        let Some(locator) = refs::locate(kv, blob)? else {
            continue;
        };
        let Some(placement) = records.placement(kv, &locator, blob)? else {
            continue;
        };
        let n = edit(placement, indices);
        if n > 0 {
            total += n;
            changed.push(placement.clone());
        }
    }
    let mut b = Batch::new();
    if total > 0 {
        records.write(&mut b);
        for p in &changed {
            mark_degraded(&mut b, p);
        }
    }
    Ok((b, total))
}

/// ReportPresent: removes each reported shard index from its placement's
/// `missing` when the committed placement still assigns that index to the
/// reporting node and lists it missing; anything else (another node's
/// index, an index heal moved elsewhere, one not missing, an unknown blob)
/// is ignored. A blob left with no missing shard leaves the degraded
/// index. Returns [`Applied::Unmarked`] with the number of shards
/// un-marked.
///
/// Against a concurrent heal this is a compare-and-set on the placement:
/// a heal that read the placement with the index missing then fails its
/// UpdatePlacement (`PlacementChanged`, the missing set differs), and the
/// intent it leaves only keeps GC off (node, blob, index) until its epoch
/// closes; the shard is assigned to that node anyway.
pub(crate) fn report_present<K: KvStore>(kv: &K, r: &pb::ReportPresentRequest) -> Outcome {
    per_call_limit(r.shards.len(), "reported")?;
    let (b, unmarked) = edit_missing(kv, &r.shards, |placement, indices| {
        let present: BTreeSet<u32> = indices
            .into_iter()
            .filter(|i| assigns(placement, r.node_id, *i) && placement.missing.contains(i))
            .collect();
        placement.missing.retain(|i| !present.contains(i));
        present.len() as u32
    })?;
    Ok((b, Applied::Unmarked(unmarked)))
}

/// BeginHeal: records the intent of writing shard `shard_index` of
/// `blob_id` onto `node_id` under write epoch `epoch`. Refuses
/// `PlacementChanged` when no record references the blob, `EpochClosed`
/// when the epoch is not open and `InvalidArgument` for an index outside
/// the placement. A repeated BeginHeal is idempotent.
pub(crate) fn begin_heal<K: KvStore>(kv: &K, r: &pb::BeginHealRequest) -> Outcome {
    let Some((_, placement)) = refs::current_placement(kv, &r.blob_id)? else {
        return refuse(
            ErrorCode::PlacementChanged,
            format!("blob {} is not referenced", r.blob_id),
        );
    };
    if r.shard_index as usize >= placement.nodes.len() {
        return refuse(
            ErrorCode::InvalidArgument,
            format!(
                "shard index {} of a placement with {} shards",
                r.shard_index,
                placement.nodes.len()
            ),
        );
    }
    if !epochs::is_open(kv, r.epoch)? {
        return refuse(
            ErrorCode::EpochClosed,
            format!("write epoch {} is closed", r.epoch),
        );
    }
    let mut b = Batch::new();
    match intent_epoch(kv, r.node_id, &r.blob_id, r.shard_index)? {
        Some(e) if e == r.epoch => {}
        Some(e) => {
            delete_intent(&mut b, r.node_id, &r.blob_id, r.shard_index, e);
            put_intent(&mut b, r.node_id, &r.blob_id, r.shard_index, r.epoch);
        }
        None => put_intent(&mut b, r.node_id, &r.blob_id, r.shard_index, r.epoch),
    }
    Ok((b, Applied::Done))
}

fn missing_set(p: &pb::Placement) -> BTreeSet<u32> {
    p.missing.iter().copied().collect()
}

/// UpdatePlacement: the compare-and-set of a healed placement. Applied only
/// when the blob's committed placement equals `expected` (nodes, and
/// missing as a set), `epoch` is open, and every shard index that is not
/// missing in the new placement but whose node changed or that leaves
/// `missing` has a heal intent for (new node, blob, index) under `epoch`.
/// Writes the new placement into its record, consumes those intents and
/// updates the degraded index. Refuses `PlacementChanged` when the blob is
/// unreferenced, the placement differs or an intent is absent,
/// `EpochClosed` for a closed epoch, and `InvalidArgument` when the new
/// placement changes blob id, size, k, m or block size, or its node count.
pub(crate) fn update_placement<K: KvStore>(kv: &K, r: &pb::UpdatePlacementRequest) -> Outcome {
    let (Some(expected), Some(new)) = (&r.expected, &r.placement) else {
        return refuse(
            ErrorCode::InvalidArgument,
            "UpdatePlacement needs expected and placement",
        );
    };
    let shards = (new.data_shards as usize).saturating_add(new.parity_shards as usize);
    if new.blob_id != r.blob_id
        || new.nodes.len() != shards
        || new.missing.iter().any(|i| *i as usize >= shards)
    {
        return refuse(
            ErrorCode::InvalidArgument,
            "the new placement must name the blob and have k+m nodes",
        );
    }
    let Some(locator) = refs::locate(kv, &r.blob_id)? else {
        return refuse(
            ErrorCode::PlacementChanged,
            format!("blob {} is no longer referenced", r.blob_id),
        );
    };
    let mut records = PlacementRecords::default();
    let Some(current) = records.placement(kv, &locator, &r.blob_id)? else {
        return refuse(
            ErrorCode::PlacementChanged,
            format!("blob {} is no longer referenced", r.blob_id),
        );
    };
    if current.nodes != expected.nodes || missing_set(current) != missing_set(expected) {
        return refuse(
            ErrorCode::PlacementChanged,
            format!("the placement of blob {} changed", r.blob_id),
        );
    }
    if current.size != new.size
        || current.data_shards != new.data_shards
        || current.parity_shards != new.parity_shards
        || current.block_size != new.block_size
    {
        return refuse(
            ErrorCode::InvalidArgument,
            "the new placement must keep size, k, m and block size",
        );
    }
    if !epochs::is_open(kv, r.epoch)? {
        return refuse(
            ErrorCode::EpochClosed,
            format!("write epoch {} is closed", r.epoch),
        );
    }
    let was_missing = missing_set(current);
    let now_missing = missing_set(new);
    let mut b = Batch::new();
    for (i, node) in new.nodes.iter().enumerate() {
        let index = i as u32;
        if now_missing.contains(&index) {
            continue;
        }
        let moved = current.nodes.get(i) != Some(node);
        if !moved && !was_missing.contains(&index) {
            continue;
        }
        if intent_epoch(kv, *node, &r.blob_id, index)? != Some(r.epoch) {
            return refuse(
                ErrorCode::PlacementChanged,
                format!(
                    "no heal intent of epoch {} for shard {index} of blob {} on node {node}",
                    r.epoch, r.blob_id
                ),
            );
        }
        delete_intent(&mut b, *node, &r.blob_id, index, r.epoch);
    }
    *current = pb::Placement {
        missing: now_missing.into_iter().collect(),
        ..new.clone()
    };
    let written = current.clone();
    records.write(&mut b);
    mark_degraded(&mut b, &written);
    Ok((b, Applied::Done))
}
