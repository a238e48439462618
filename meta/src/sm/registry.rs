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

use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};

use super::{Applied, SmError, get, keys, refuse};
use crate::store::{Batch, KvStore, Space};

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
        ..Default::default()
    };
    let Some(old) = recorded else {
        return (info, false);
    };
    info.disk_generation = old.disk_generation;
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
