//! Degraded blobs, heal intents, placement compare-and-set and the GC
//! question (Collectable). See the heal section of `proto/meta.proto`.
//!
//! Owner: the heal-metadata work. [`drop_intents_of_epoch`] is called by
//! `sm::epochs::close_epochs` and must keep its signature.

use sluice_proto::meta::{self as pb, ErrorCode};

use super::{Applied, SmError, refuse};
use crate::store::{Batch, KvStore};

type Outcome = Result<(Batch, Applied), SmError>;

/// Adds to `b` the removal of every heal intent recorded under `epoch`.
pub(crate) fn drop_intents_of_epoch<K: KvStore>(
    _kv: &K,
    _b: &mut Batch,
    _epoch: u64,
) -> Result<(), SmError> {
    Ok(())
}

pub(crate) fn report_missing<K: KvStore>(_kv: &K, _r: &pb::ReportMissingRequest) -> Outcome {
    refuse(ErrorCode::Internal, "ReportMissing is not built yet")
}

pub(crate) fn begin_heal<K: KvStore>(_kv: &K, _r: &pb::BeginHealRequest) -> Outcome {
    refuse(ErrorCode::Internal, "BeginHeal is not built yet")
}

pub(crate) fn update_placement<K: KvStore>(_kv: &K, _r: &pb::UpdatePlacementRequest) -> Outcome {
    refuse(ErrorCode::Internal, "UpdatePlacement is not built yet")
}
