//! Read leases: GETs in progress that keep released blobs from being
//! deleted (see `LeaseBlobsRequest` in `proto/meta.proto` and
//! `docs/design/durability.md` §4).
//!
//! A lease is named by (write epoch, lease id) and lists blob ids. While a
//! lease names a blob, [`super::pending::claim_pending`] does not claim the
//! blob's pending deletion, and only claimed deletions are carried out (by
//! the reclaimer, or by datanode GC through Collectable). A lease ends when
//! its holder releases it or when its epoch closes
//! ([`drop_leases_of_epoch`], called by `sm::epochs::close_epochs`): the
//! gateway keeps the epoch renewed while a GET holds the lease, so a
//! gateway that dies or is cut off from meta loses its leases within
//! `epoch_lease`, measured on the leader's monotonic clock.
//!
//! [`Space::ReadLeases`] holds two key families per (lease, blob):
//! * by blob: `0x01 | blob id | 0x00 | epoch (u64 BE) | lease id (u64 BE)`
//!   -> empty ([`is_leased`]: a prefix scan of one row);
//! * by lease: `0x02 | epoch (u64 BE) | lease id (u64 BE) | blob id` ->
//!   empty (release, and dropping an epoch's leases).
//!
//! Bound: a lease names at most [`MAX_LEASE_BLOBS`] blobs; a gateway holds
//! at most one lease per GET in flight, so the space holds at most (GETs in
//! flight across gateways) × [`MAX_LEASE_BLOBS`] × 2 keys.

use std::ops::Bound;

use sluice_proto::meta::{self as pb, ErrorCode};

use super::{Applied, SmError, epochs, pending, refuse};
use crate::store::{Batch, KvStore, Space, prefix_end};

type Outcome = Result<(Batch, Applied), SmError>;

/// Most blob ids one lease names: S3's most parts per object.
pub const MAX_LEASE_BLOBS: usize = 10_000;

const BY_BLOB: u8 = 1;
const BY_LEASE: u8 = 2;

fn blob_prefix(blob_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + blob_id.len());
    k.push(BY_BLOB);
    k.extend_from_slice(blob_id.as_bytes());
    k.push(0);
    k
}

fn blob_key(blob_id: &str, epoch: u64, lease_id: u64) -> Vec<u8> {
    let mut k = blob_prefix(blob_id);
    k.extend_from_slice(&epoch.to_be_bytes());
    k.extend_from_slice(&lease_id.to_be_bytes());
    k
}

fn epoch_prefix(epoch: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(BY_LEASE);
    k.extend_from_slice(&epoch.to_be_bytes());
    k
}

fn lease_prefix(epoch: u64, lease_id: u64) -> Vec<u8> {
    let mut k = epoch_prefix(epoch);
    k.extend_from_slice(&lease_id.to_be_bytes());
    k
}

/// `true` while a read lease names `blob_id`.
pub fn is_leased<K: KvStore>(kv: &K, blob_id: &str) -> Result<bool, SmError> {
    Ok(!kv
        .scan_prefix(Space::ReadLeases, &blob_prefix(blob_id), 1)?
        .is_empty())
}

/// LeaseBlobs: adds `blob_ids` to lease (epoch, lease id), except those
/// whose pending deletion is already claimed: [`Applied::Leased`] names
/// them. Refuses `EpochClosed` for a closed epoch and `InvalidArgument`
/// for more than [`MAX_LEASE_BLOBS`] ids.
pub(crate) fn lease_blobs<K: KvStore>(kv: &K, r: &pb::LeaseBlobsRequest) -> Outcome {
    if r.blob_ids.len() > MAX_LEASE_BLOBS {
        return refuse(
            ErrorCode::InvalidArgument,
            format!(
                "{} blobs leased, at most {MAX_LEASE_BLOBS} per lease",
                r.blob_ids.len()
            ),
        );
    }
    if r.blob_ids.iter().any(|b| b.is_empty() || b.contains('\0')) {
        return refuse(
            ErrorCode::InvalidArgument,
            "a blob id is empty or holds NUL",
        );
    }
    if !epochs::is_open(kv, r.epoch)? {
        return refuse(
            ErrorCode::EpochClosed,
            format!("write epoch {} is closed", r.epoch),
        );
    }
    let mut b = Batch::new();
    let mut lost = Vec::new();
    for blob in &r.blob_ids {
        if pending::get(kv, blob)?.is_some_and(|d| d.claimed) {
            lost.push(blob.clone());
            continue;
        }
        b.put(
            Space::ReadLeases,
            blob_key(blob, r.epoch, r.lease_id),
            Vec::new(),
        );
        let mut by_lease = lease_prefix(r.epoch, r.lease_id);
        by_lease.extend_from_slice(blob.as_bytes());
        b.put(Space::ReadLeases, by_lease, Vec::new());
    }
    Ok((b, Applied::Leased(lost)))
}

/// ReleaseBlobs: ends lease (epoch, lease id).
pub(crate) fn release_blobs<K: KvStore>(kv: &K, r: &pb::ReleaseBlobsRequest) -> Outcome {
    let mut b = Batch::new();
    drop_prefix(kv, &mut b, &lease_prefix(r.epoch, r.lease_id))?;
    Ok((b, Applied::Done))
}

/// Adds to `b` the end of every lease held under `epoch`.
pub(crate) fn drop_leases_of_epoch<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    epoch: u64,
) -> Result<(), SmError> {
    drop_prefix(kv, b, &epoch_prefix(epoch))
}

/// Removes every by-lease key under `prefix` (an epoch's or one lease's)
/// and the by-blob key of each.
fn drop_prefix<K: KvStore>(kv: &K, b: &mut Batch, prefix: &[u8]) -> Result<(), SmError> {
    let end = prefix_end(prefix);
    let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
    for k in kv.keys_in(Space::ReadLeases, Bound::Included(prefix), end)? {
        // 0x02 | epoch | lease id | blob id
        let rest = k
            .get(1..)
            .filter(|r| r.len() >= 16)
            .ok_or(SmError::BadKey(Space::ReadLeases))?;
        let epoch = u64::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
        let lease_id = u64::from_be_bytes(rest[8..16].try_into().expect("8 bytes"));
        let blob =
            std::str::from_utf8(&rest[16..]).map_err(|_| SmError::BadKey(Space::ReadLeases))?;
        b.delete(Space::ReadLeases, blob_key(blob, epoch, lease_id));
        b.delete(Space::ReadLeases, k);
    }
    Ok(())
}
