//! Write epochs: fencing of late commits (see `OpenEpochRequest` in
//! `proto/meta.proto`).
//!
//! Owner: the exactly-once/epochs work. [`is_open`] is used by
//! `sm::heal` (Collectable, UpdatePlacement) and must keep its signature.

use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft as rpb;

use super::{Applied, SmError, keys, refuse};
use crate::store::{Batch, KvStore, Space};

type Outcome = Result<(Batch, Applied), SmError>;

/// `true` while write epoch `epoch` is open (it has a record in
/// [`Space::Epochs`]). Epoch 0 (legacy blob ids) is never open.
pub fn is_open<K: KvStore>(kv: &K, epoch: u64) -> Result<bool, SmError> {
    Ok(kv.get(Space::Epochs, &keys::epoch(epoch))?.is_some())
}

/// The record of open epoch `epoch`.
pub fn get_epoch<K: KvStore>(kv: &K, epoch: u64) -> Result<Option<rpb::EpochRecord>, SmError> {
    super::get(kv, Space::Epochs, &keys::epoch(epoch), "epoch")
}

pub(crate) fn open_epoch<K: KvStore>(_kv: &K, _r: &pb::OpenEpochRequest, _now_ms: i64) -> Outcome {
    refuse(ErrorCode::Internal, "OpenEpoch is not built yet")
}

pub(crate) fn renew_epoch<K: KvStore>(
    _kv: &K,
    _r: &pb::RenewEpochRequest,
    _now_ms: i64,
) -> Outcome {
    refuse(ErrorCode::Internal, "RenewEpoch is not built yet")
}

pub(crate) fn close_epochs<K: KvStore>(_kv: &K, _r: &rpb::CloseEpochs, _now_ms: i64) -> Outcome {
    // Must also drop the epochs' heal intents.
    let mut b = Batch::new();
    for e in &_r.epochs {
        super::heal::drop_intents_of_epoch(_kv, &mut b, *e)?;
    }
    let _ = rpb::EpochRecord::default().encode_to_vec();
    refuse(ErrorCode::Internal, "CloseEpochs is not built yet")
}
