//! Pending deletions of released blobs (see `PendingDeletion` in
//! `proto/raft.proto` and `docs/design/durability.md` §4).
//!
//! Every placement a mutation releases gets a record in `Space::Pending`
//! (keyed by blob id) in the same batch ([`record_released`], called by
//! `apply_command`). The leader's reclaimer pages the records older than
//! `delete_delay` ([`due`]: a scan in blob id order, bounded per page; there
//! is no time index), deletes the shards and reports each node that
//! confirmed with `CollectPending`; a record goes once every node of its
//! placement confirmed.
//!
//! [`get`] is used by `sm::heal`
//! (Collectable) and must keep its signature.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

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
/// (released at leader time `now_ms`; every node of the placement, each
/// once, still has to confirm).
pub(crate) fn record_released(b: &mut Batch, released: &[pb::Placement], now_ms: i64) {
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
    /// Pending deletions released at least `delete_delay` ago, by blob id.
    pub due: Vec<rpb::PendingDeletion>,
    /// Records read on this page (due or not): an approximate count of
    /// pending deletions when summed over a full pass.
    pub scanned: usize,
    /// Blob id to pass as `after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Reads up to `limit` pending deletions after blob id `after` (exclusive)
/// and returns those released at least `delete_delay` before `now_ms`
/// (leader time, ms).
pub fn due<K: KvStore>(
    kv: &K,
    now_ms: i64,
    delete_delay: Duration,
    after: Option<&str>,
    limit: usize,
) -> Result<DuePage, SmError> {
    let delay_ms = i64::try_from(delete_delay.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(delay_ms);
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
        if record.released_ms <= cutoff {
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
