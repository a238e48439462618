//! Write epochs: fencing of late commits (see `OpenEpochRequest` in
//! `proto/meta.proto` and `docs/design/durability.md` §3).
//!
//! `Space::Epochs` holds one [`rpb::EpochRecord`] per open epoch under its
//! number (u64 BE); a closed epoch has no record and never reopens. The
//! next epoch number (starting at 1) is kept in the same space under the
//! empty key, so it travels with the records in snapshots (`SmMeta` is not
//! part of a snapshot).
//!
//! [`is_open`] is used by
//! `sm::heal` (Collectable, UpdatePlacement) and must keep its signature.

use std::ops::Bound;

use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft as rpb;

use super::{Applied, SmError, keys, refuse};
use crate::store::{Batch, KvStore, Space};

type Outcome = Result<(Batch, Applied), SmError>;

pub use super::settings::DEFAULT_LEASE_MS;

/// The cluster version from which OpenEpoch records the granted lease in
/// the epoch (`EpochRecord.lease_ms`).
const RECORDED_LEASE_FORMAT: u32 = 2;

/// `Space::Epochs` key of the next epoch number (u64 BE).
const NEXT_KEY: &[u8] = b"";

/// `true` while write epoch `epoch` is open (it has a record in
/// [`Space::Epochs`]). Epoch 0 is never open (numbering starts at 1).
pub fn is_open<K: KvStore>(kv: &K, epoch: u64) -> Result<bool, SmError> {
    Ok(kv.get(Space::Epochs, &keys::epoch(epoch))?.is_some())
}

/// The record of open epoch `epoch`.
pub fn get_epoch<K: KvStore>(kv: &K, epoch: u64) -> Result<Option<rpb::EpochRecord>, SmError> {
    super::get(kv, Space::Epochs, &keys::epoch(epoch), "epoch")
}

/// One page of open epochs: (epoch, record) in epoch order after `after`
/// (exclusive), at most `limit`.
pub fn list_open<K: KvStore>(
    kv: &K,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<(u64, rpb::EpochRecord)>, SmError> {
    let from = after.map(keys::epoch);
    let start = match &from {
        Some(k) => Bound::Excluded(k.as_slice()),
        // Skips the empty key (the next-epoch counter).
        None => Bound::Excluded(NEXT_KEY),
    };
    let rows = kv.scan(Space::Epochs, start, Bound::Unbounded, limit)?;
    rows.into_iter()
        .map(|(k, v)| {
            let n: [u8; 8] = k
                .as_slice()
                .try_into()
                .map_err(|_| SmError::BadKey(Space::Epochs))?;
            Ok((u64::from_be_bytes(n), super::decode("epoch", &v)?))
        })
        .collect()
}

fn next_epoch<K: KvStore>(kv: &K) -> Result<u64, SmError> {
    match kv.get(Space::Epochs, NEXT_KEY)? {
        Some(v) => {
            let n: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| SmError::BadKey(Space::Epochs))?;
            Ok(u64::from_be_bytes(n).max(1))
        }
        None => Ok(1),
    }
}

/// Opens the next epoch with the lease of the replicated cluster settings
/// (`sm::settings`), which it answers and, from cluster version 2 on,
/// records in the epoch (before that a voter of the previous release,
/// which knows no such field, must write the same record).
pub(crate) fn open_epoch<K: KvStore>(kv: &K, r: &pb::OpenEpochRequest, now_ms: i64) -> Outcome {
    let epoch = next_epoch(kv)?;
    let lease_ms = super::settings::epoch_lease_ms(kv)?;
    let recorded_lease_ms = if super::cluster_version::get(kv)? >= RECORDED_LEASE_FORMAT {
        lease_ms
    } else {
        0
    };
    let Some(after) = epoch.checked_add(1) else {
        return refuse(ErrorCode::Internal, "write epoch numbers are exhausted");
    };
    let record = rpb::EpochRecord {
        gateway_id: r.gateway_id.clone(),
        opened_ms: now_ms,
        renewed_ms: now_ms,
        renewals: 0,
        lease_ms: recorded_lease_ms,
    };
    let mut b = Batch::new();
    b.put(Space::Epochs, keys::epoch(epoch), record.encode_to_vec());
    b.put(Space::Epochs, NEXT_KEY, after.to_be_bytes().to_vec());
    Ok((b, Applied::Epoch(pb::OpenEpochResponse { epoch, lease_ms })))
}

pub(crate) fn renew_epoch<K: KvStore>(kv: &K, r: &pb::RenewEpochRequest, now_ms: i64) -> Outcome {
    let Some(mut record) = get_epoch(kv, r.epoch)? else {
        return refuse(
            ErrorCode::EpochClosed,
            format!("write epoch {} is closed", r.epoch),
        );
    };
    // Leader time may step back across a leader change: never shorten.
    // The sweep compares only `renewals` (see crate::sweeper).
    record.renewed_ms = record.renewed_ms.max(now_ms);
    record.renewals = record.renewals.saturating_add(1);
    let mut b = Batch::new();
    b.put(Space::Epochs, keys::epoch(r.epoch), record.encode_to_vec());
    Ok((b, Applied::Done))
}

pub(crate) fn close_epochs<K: KvStore>(kv: &K, r: &rpb::CloseEpochs, _now_ms: i64) -> Outcome {
    let mut b = Batch::new();
    for e in &r.epochs {
        if !is_open(kv, *e)? {
            continue;
        }
        b.delete(Space::Epochs, keys::epoch(*e));
        super::heal::drop_intents_of_epoch(kv, &mut b, *e)?;
        super::leases::drop_leases_of_epoch(kv, &mut b, *e)?;
    }
    Ok((b, Applied::Done))
}
