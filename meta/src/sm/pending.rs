//! Pending deletions of released blobs (see `PendingDeletion` in
//! `proto/raft.proto`).
//!
//! Owner: the exactly-once/epochs work. [`get`] is used by `sm::heal`
//! (Collectable) and must keep its signature.

use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;

use super::{Applied, SmError, keys, refuse};
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

pub(crate) fn collect_pending<K: KvStore>(_kv: &K, _r: &rpb::CollectPending) -> Outcome {
    refuse(ErrorCode::Internal, "CollectPending is not built yet")
}
