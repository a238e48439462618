//! Pending deletions of released blobs (see `PendingDeletion` in
//! `proto/raft.proto` and `docs/design/durability.md` §4).
//!
//! Every placement a mutation releases gets a record in `Space::Pending`
//! (keyed by blob id) in the same batch ([`record_released`], called by
//! `apply_command`), stamped with the log index of that entry. The leader's
//! reclaimer pages the records released at or below the applied index it
//! sampled `delete_delay` ago by its own monotonic clock ([`due`]: a scan
//! in blob id order, bounded per page; there is no index by release), claims
//! them ([`claim_pending`]: a record named by a read lease is skipped, see
//! `sm::leases`), deletes the claimed records' shards and reports each node
//! that confirmed with `CollectPending`; a record goes once every node of
//! its placement confirmed. No wall clock decides whether a blob is
//! deleted: a leader whose clock jumps, or a new leader, waits a full
//! `delete_delay` of its own time.
//!
//! [`get`] is used by `sm::heal` (Collectable) and `sm::leases`.

use std::collections::BTreeMap;
use std::ops::Bound;

use prost::Message;
use sluice_proto::meta as pb;
use sluice_proto::raft as rpb;

use super::{Applied, SmError, keys};
use crate::store::{Batch, KvStore, Space};

type Outcome = Result<(Batch, Applied), SmError>;

/// The pending deletion of `blob_id`, if it was released and its shards
/// are not yet confirmed deleted everywhere.
pub fn get<K: KvStore>(kv: &K, blob_id: &str) -> Result<Option<rpb::PendingDeletion>, SmError> {
    super::get(
        kv,
        Space::Pending,
        &keys::pending(blob_id),
        "pending deletion",
    )
}

/// Adds to `b` a pending deletion for every placement in `released`
/// (released by the entry at log index `index`, leader time `now_ms`;
/// every node of the placement, each once, still has to confirm).
pub(crate) fn record_released(b: &mut Batch, released: &[pb::Placement], index: u64, now_ms: i64) {
    for p in released {
        if p.blob_id.is_empty() {
            continue;
        }
        let mut nodes = Vec::with_capacity(p.nodes.len());
        for n in &p.nodes {
            if !nodes.contains(n) {
                nodes.push(*n);
            }
        }
        let record = rpb::PendingDeletion {
            placement: Some(p.clone()),
            released_ms: now_ms,
            remaining_nodes: nodes,
            released_index: index,
            claimed: false,
        };
        b.put(
            Space::Pending,
            keys::pending(&p.blob_id),
            record.encode_to_vec(),
        );
    }
}

/// One page of [`due`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DuePage {
    /// Pending deletions released at or below the cutoff index, by blob id.
    pub due: Vec<rpb::PendingDeletion>,
    /// Records read on this page (due or not): an approximate count of
    /// pending deletions when summed over a full pass.
    pub scanned: usize,
    /// Blob id to pass as `after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Reads up to `limit` pending deletions after blob id `after` (exclusive)
/// and returns those already claimed and those released by an entry at or
/// below log index `released_before_index` (the leader's applied index
/// sampled `delete_delay` ago; `None`: no sample that old yet).
pub fn due<K: KvStore>(
    kv: &K,
    released_before_index: Option<u64>,
    after: Option<&str>,
    limit: usize,
) -> Result<DuePage, SmError> {
    let from = after.map(keys::pending);
    let start = match &from {
        Some(k) => Bound::Excluded(k.as_slice()),
        None => Bound::Unbounded,
    };
    let limit = limit.max(1);
    let rows = kv.scan(Space::Pending, start, Bound::Unbounded, limit)?;
    let scanned = rows.len();
    let next = if scanned == limit {
        rows.last()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
    } else {
        None
    };
    let mut page = DuePage {
        due: Vec::new(),
        scanned,
        next,
    };
    for (_, v) in rows {
        let record: rpb::PendingDeletion = super::decode("pending deletion", &v)?;
        if record.claimed || released_before_index.is_some_and(|i| record.released_index <= i) {
            page.due.push(record);
        }
    }
    Ok(page)
}

/// Removes each confirming node from the records it names; drops records
/// left with no node. Unknown blob ids (already dropped) are ignored.
pub(crate) fn collect_pending<K: KvStore>(kv: &K, r: &rpb::CollectPending) -> Outcome {
    let mut touched: BTreeMap<&str, Option<rpb::PendingDeletion>> = BTreeMap::new();
    for done in &r.done {
        for blob in &done.blob_ids {
            if !touched.contains_key(blob.as_str()) {
                touched.insert(blob, get(kv, blob)?);
            }
            if let Some(Some(record)) = touched.get_mut(blob.as_str()) {
                record.remaining_nodes.retain(|n| *n != done.node_id);
            }
        }
    }
    let mut b = Batch::new();
    for (blob, record) in touched {
        match record {
            Some(r) if r.remaining_nodes.is_empty() => {
                b.delete(Space::Pending, keys::pending(blob))
            }
            Some(r) => b.put(Space::Pending, keys::pending(blob), r.encode_to_vec()),
            None => {}
        }
    }
    Ok((b, Applied::Done))
}

/// ClaimPending: claims the pending deletions of `blob_ids` released at or
/// below `released_before_index` that no read lease names; unknown blob ids
/// (already collected), later releases and leased blobs are left as they
/// are. [`Applied::Claimed`] lists the claimed blob ids (those claimed by
/// an earlier entry included), in request order.
pub(crate) fn claim_pending<K: KvStore>(kv: &K, r: &rpb::ClaimPending) -> Outcome {
    let mut b = Batch::new();
    let mut claimed = Vec::new();
    for blob in &r.blob_ids {
        let Some(mut record) = get(kv, blob)? else {
            continue;
        };
        if record.claimed {
            claimed.push(blob.clone());
            continue;
        }
        if record.released_index > r.released_before_index || super::leases::is_leased(kv, blob)? {
            continue;
        }
        record.claimed = true;
        b.put(Space::Pending, keys::pending(blob), record.encode_to_vec());
        claimed.push(blob.clone());
    }
    Ok((b, Applied::Claimed(claimed)))
}
