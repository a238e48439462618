//! The datanode registry with disk identity (see `DatanodeInfo` and
//! `RegisterDatanodeRequest` in `proto/meta.proto`).
//!
//! A datanode registers with its id, address and the `disk_id` written into
//! its data dir when it was formatted. The first registration records the
//! disk id with `disk_generation` 0. A later registration of the same id
//! with another non-empty disk id means an empty or foreign data dir under
//! a known node id: the generation goes up by one and the new disk id is
//! recorded (`disk_replaced`), which makes the heal audit check every shard
//! placed on the node. A registration without a disk id (a datanode of a
//! release before disk identity) keeps the recorded one; a record without a
//! disk id (written by such a release) adopts the first one it is given
//! without a generation change (same disk, upgraded software).
//!
//! A registration also records the node's failure-domain labels (`zone`,
//! `host`) and keeps the `draining` mark an admin set.
//!
//! # Drain and remove (admin)
//! * [`drain_datanode`] sets (or clears) `draining`; placement and heal
//!   targets skip a draining node and the gateways' movers rebuild its
//!   shards elsewhere. Idempotent.
//! * [`remove_datanode`] deletes the record and removes the node from every
//!   pending deletion's `remaining_nodes` (dropping records left with none).
//!   The rule, chosen so that removal never loses the only copy of
//!   anything: refused (`DATANODE_IN_USE`) while any committed placement
//!   puts a shard index on the node that is not already marked missing.
//!   With `force` (a node gone for good), it is allowed when every such
//!   blob still has at least k non-missing shards on other nodes: those
//!   shards are then marked missing (heal rebuilds them); when any blob
//!   would keep fewer than k, it is refused all the same. Both scan the
//!   whole reference index: an admin operation, cost O(committed blobs).
//!   Whether the node is still heard from is checked by the caller (the
//!   leader's liveness), not here.

use std::ops::Bound;

use prost::Message;
use sluice_proto::admin as apb;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft as rpb;

use super::{Applied, SmError, decode, get, heal, keys, refs, refuse};
use crate::store::{Batch, KvStore, Space, as_ref_bound};

type Outcome = Result<(Batch, Applied), SmError>;

/// The registry outcome of registering `r` over the `recorded` entry:
/// the record to store and whether the disk was replaced.
pub(crate) fn next_record(
    recorded: Option<&pb::DatanodeInfo>,
    r: &pb::RegisterDatanodeRequest,
) -> (pb::DatanodeInfo, bool) {
    let mut info = pb::DatanodeInfo {
        id: r.id,
        addr: r.addr.clone(),
        disk_id: r.disk_id.clone(),
        zone: r.zone.clone(),
        host: r.host.clone(),
        ..Default::default()
    };
    let Some(old) = recorded else {
        return (info, false);
    };
    info.disk_generation = old.disk_generation;
    info.draining = old.draining;
    if r.disk_id.is_empty() {
        info.disk_id = old.disk_id.clone();
        return (info, false);
    }
    let replaced = !old.disk_id.is_empty() && old.disk_id != r.disk_id;
    if replaced {
        info.disk_generation = old.disk_generation.saturating_add(1);
    }
    (info, replaced)
}

/// RegisterDatanode: records (id, addr, disk id) and bumps the disk
/// generation when the disk id changed. Refuses an empty address.
pub(crate) fn register_datanode<K: KvStore>(kv: &K, r: &pb::RegisterDatanodeRequest) -> Outcome {
    if r.addr.is_empty() {
        return refuse(ErrorCode::InvalidArgument, "datanode address is empty");
    }
    let key = keys::datanode(r.id);
    let recorded: Option<pb::DatanodeInfo> = get(kv, Space::Datanodes, &key, "datanode")?;
    let (info, disk_replaced) = next_record(recorded.as_ref(), r);
    let response = pb::RegisterDatanodeResponse {
        disk_generation: info.disk_generation,
        disk_replaced,
    };
    let mut b = Batch::new();
    if recorded.as_ref() != Some(&info) {
        b.put(Space::Datanodes, key, info.encode_to_vec());
    }
    Ok((b, Applied::Registered(response)))
}

/// Rows read per store scan of the admin scans.
const SCAN_CHUNK: usize = 512;

/// Calls `f` with every committed blob's placement, in blob id order.
pub fn for_each_placement<K: KvStore>(
    kv: &K,
    mut f: impl FnMut(&pb::Placement) -> Result<(), SmError>,
) -> Result<(), SmError> {
    let mut from: Bound<Vec<u8>> = Bound::Unbounded;
    loop {
        let rows = kv.scan(
            Space::Refs,
            as_ref_bound(&from),
            Bound::Unbounded,
            SCAN_CHUNK,
        )?;
        let n = rows.len();
        for (k, _) in rows {
            let blob = std::str::from_utf8(&k).map_err(|_| SmError::BadKey(Space::Refs))?;
            if let Some((_, p)) = refs::current_placement(kv, blob)? {
                f(&p)?;
            }
            from = Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            return Ok(());
        }
    }
}

/// The shard indices of `p` on `node` that are not marked missing.
fn held_on(p: &pb::Placement, node: u64) -> impl Iterator<Item = u32> + '_ {
    p.nodes
        .iter()
        .enumerate()
        .filter(move |(i, n)| **n == node && !p.missing.contains(&(*i as u32)))
        .map(|(i, _)| i as u32)
}

/// How many shards committed placements put on each datanode (indices
/// marked missing excluded), for the ids in `nodes`.
pub fn placed_shards<K: KvStore>(
    kv: &K,
    nodes: &[u64],
) -> Result<std::collections::BTreeMap<u64, u64>, SmError> {
    let mut counts: std::collections::BTreeMap<u64, u64> = nodes.iter().map(|&n| (n, 0)).collect();
    for_each_placement(kv, |p| {
        for (i, n) in p.nodes.iter().enumerate() {
            if p.missing.contains(&(i as u32)) {
                continue;
            }
            if let Some(c) = counts.get_mut(n) {
                *c += 1;
            }
        }
        Ok(())
    })?;
    Ok(counts)
}

/// DrainDatanode: sets (or with `undrain` clears) the node's `draining`
/// mark. `NO_SUCH_DATANODE` for an unknown id.
pub(crate) fn drain_datanode<K: KvStore>(kv: &K, r: &apb::DrainDatanodeRequest) -> Outcome {
    let key = keys::datanode(r.id);
    let Some(mut info): Option<pb::DatanodeInfo> = get(kv, Space::Datanodes, &key, "datanode")?
    else {
        return refuse(ErrorCode::NoSuchDatanode, format!("no datanode {}", r.id));
    };
    let mut b = Batch::new();
    if info.draining == r.undrain {
        info.draining = !r.undrain;
        b.put(Space::Datanodes, key, info.encode_to_vec());
    }
    Ok((b, Applied::Done))
}

/// RemoveDatanode: see the module doc for the rule. Answers
/// [`Applied::Marked`] with the shards a forced removal marked missing.
pub(crate) fn remove_datanode<K: KvStore>(kv: &K, r: &apb::RemoveDatanodeRequest) -> Outcome {
    let key = keys::datanode(r.id);
    if get::<pb::DatanodeInfo, _>(kv, Space::Datanodes, &key, "datanode")?.is_none() {
        return refuse(ErrorCode::NoSuchDatanode, format!("no datanode {}", r.id));
    }
    let mut shards: Vec<pb::ShardRef> = Vec::new();
    let mut blobs = 0u64;
    let mut unreadable: Option<String> = None;
    for_each_placement(kv, |p| {
        let held: Vec<u32> = held_on(p, r.id).collect();
        if held.is_empty() {
            return Ok(());
        }
        blobs += 1;
        let k = p.data_shards as usize;
        let elsewhere = (0..p.nodes.len())
            .filter(|&i| p.nodes[i] != r.id && !p.missing.contains(&(i as u32)))
            .count();
        if elsewhere < k && unreadable.is_none() {
            unreadable = Some(p.blob_id.clone());
        }
        shards.extend(held.into_iter().map(|i| pb::ShardRef {
            blob_id: p.blob_id.clone(),
            shard_index: i,
        }));
        Ok(())
    })?;
    if blobs > 0 && !r.force {
        return refuse(
            ErrorCode::DatanodeInUse,
            format!(
                "datanode {} still holds {} shards of {blobs} blobs: drain it first \
                 (or --force if it is gone for good)",
                r.id,
                shards.len()
            ),
        );
    }
    if let Some(blob) = unreadable {
        return refuse(
            ErrorCode::DatanodeInUse,
            format!(
                "datanode {} holds one of the last k shards of blob {blob}: \
                 removing it would lose data, even with --force",
                r.id
            ),
        );
    }
    let (mut b, marked) = heal::mark_missing(kv, r.id, &shards)?;
    b.delete(Space::Datanodes, key);
    drop_from_pending(kv, &mut b, r.id)?;
    Ok((b, Applied::Marked(marked)))
}

/// Adds to `b` the removal of `node` from every pending deletion's
/// `remaining_nodes`, deleting the records left with none.
fn drop_from_pending<K: KvStore>(kv: &K, b: &mut Batch, node: u64) -> Result<(), SmError> {
    let mut from: Bound<Vec<u8>> = Bound::Unbounded;
    loop {
        let rows = kv.scan(
            Space::Pending,
            as_ref_bound(&from),
            Bound::Unbounded,
            SCAN_CHUNK,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let mut record: rpb::PendingDeletion = decode("pending deletion", &v)?;
            if record.remaining_nodes.contains(&node) {
                record.remaining_nodes.retain(|x| *x != node);
                if record.remaining_nodes.is_empty() {
                    b.delete(Space::Pending, k.clone());
                } else {
                    b.put(Space::Pending, k.clone(), record.encode_to_vec());
                }
            }
            from = Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            return Ok(());
        }
    }
}
