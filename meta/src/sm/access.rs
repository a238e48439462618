//! Access keys (S3 users), Garage's model: a key is an id, a name and a
//! secret, plus grants per bucket (read, write, owner), all in one
//! `meta.AccessKey` record in [`Space::AccessKeys`] keyed by the id.
//!
//! * CreateAccessKey stores a key the leader generated (id and secret are
//!   in the command, so replicas agree). An existing id is refused
//!   `INVALID_ARGUMENT`; at most [`MAX_ACCESS_KEYS`] keys exist.
//! * DeleteAccessKey removes the record (`NO_SUCH_ACCESS_KEY` when absent).
//! * SetKeyGrant allows (sets) or denies (clears) permissions of one key on
//!   one bucket. Allow needs the bucket to exist; a grant with no
//!   permission left is removed.
//! * Bucket ownership lives in the grants: CreateBucket with an
//!   `owner_key_id` naming a stored key gives that key {read, write, owner}
//!   on the new bucket ([`grant_owner`], same entry). DeleteBucket drops
//!   every key's grant on the bucket ([`drop_bucket_grants`]), so a later
//!   bucket of the same name starts with no grants.
//!
//! The gateway's root key (its config `access_key`) is not stored here: it
//! is an owner of everything by configuration.

use std::ops::Bound;

use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft as rpb;

use super::{Applied, SmError, get, keys, refuse, require_bucket};
use crate::store::{Batch, KvStore, Space};

/// Most access keys the cluster stores (CreateAccessKey beyond it is
/// refused). DeleteBucket rewrites grants by scanning every key, so this
/// also bounds the work of that entry.
pub const MAX_ACCESS_KEYS: usize = 10_000;

/// Most grants one key holds (an allow beyond it is refused).
pub const MAX_GRANTS_PER_KEY: usize = 10_000;

/// Longest key name (bytes).
pub const MAX_KEY_NAME: usize = 256;

type Outcome = Result<(Batch, Applied), SmError>;

/// The stored key `id`, if any.
pub fn get_access_key<K: KvStore>(kv: &K, id: &str) -> Result<Option<pb::AccessKey>, SmError> {
    get(kv, Space::AccessKeys, &keys::access_key(id), "access key")
}

/// The stored key `id`, or `NO_SUCH_ACCESS_KEY`.
pub fn require_access_key<K: KvStore>(kv: &K, id: &str) -> Result<pb::AccessKey, SmError> {
    match get_access_key(kv, id)? {
        Some(k) => Ok(k),
        None => refuse(
            ErrorCode::NoSuchAccessKey,
            format!("no such access key: {id}"),
        ),
    }
}

/// Every stored key, by id (at most [`MAX_ACCESS_KEYS`]).
pub fn list_access_keys<K: KvStore>(kv: &K) -> Result<Vec<pb::AccessKey>, SmError> {
    super::read::scan_all(kv, Space::AccessKeys, "access key")
}

pub(crate) fn create_access_key<K: KvStore>(
    kv: &K,
    r: &rpb::CreateAccessKey,
    now_ms: i64,
) -> Outcome {
    if r.id.is_empty() || r.id.contains('\0') || r.secret.is_empty() {
        return refuse(
            ErrorCode::InvalidArgument,
            "access key without id or secret",
        );
    }
    if r.name.len() > MAX_KEY_NAME {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("key name longer than {MAX_KEY_NAME} bytes"),
        );
    }
    if get_access_key(kv, &r.id)?.is_some() {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("access key {} exists", r.id),
        );
    }
    let count = kv
        .scan(
            Space::AccessKeys,
            Bound::Unbounded,
            Bound::Unbounded,
            MAX_ACCESS_KEYS,
        )?
        .len();
    if count >= MAX_ACCESS_KEYS {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("the cluster holds {MAX_ACCESS_KEYS} access keys, the most it stores"),
        );
    }
    let key = pb::AccessKey {
        id: r.id.clone(),
        name: r.name.clone(),
        secret: r.secret.clone(),
        created_ms: now_ms,
        grants: Vec::new(),
    };
    let mut b = Batch::new();
    b.put(
        Space::AccessKeys,
        keys::access_key(&r.id),
        key.encode_to_vec(),
    );
    Ok((b, Applied::KeyCreated(r.id.clone())))
}

pub(crate) fn delete_access_key<K: KvStore>(kv: &K, r: &rpb::DeleteAccessKey) -> Outcome {
    require_access_key(kv, &r.id)?;
    let mut b = Batch::new();
    b.delete(Space::AccessKeys, keys::access_key(&r.id));
    Ok((b, Applied::Done))
}

pub(crate) fn set_key_grant<K: KvStore>(kv: &K, r: &rpb::SetKeyGrant) -> Outcome {
    let mut key = require_access_key(kv, &r.id)?;
    let named = r.read || r.write || r.owner;
    if r.allow {
        if !named {
            return refuse(
                ErrorCode::InvalidArgument,
                "allow names no permission (read, write, owner)",
            );
        }
        require_bucket(kv, &r.bucket)?;
    }
    let at = key
        .grants
        .binary_search_by(|g| g.bucket.as_str().cmp(&r.bucket));
    match (at, r.allow) {
        (Ok(i), true) => {
            let g = &mut key.grants[i];
            g.read |= r.read;
            g.write |= r.write;
            g.owner |= r.owner;
        }
        (Err(i), true) => {
            if key.grants.len() >= MAX_GRANTS_PER_KEY {
                return refuse(
                    ErrorCode::InvalidArgument,
                    format!("key {} holds {MAX_GRANTS_PER_KEY} grants", r.id),
                );
            }
            key.grants.insert(
                i,
                pb::BucketGrant {
                    bucket: r.bucket.clone(),
                    read: r.read,
                    write: r.write,
                    owner: r.owner,
                },
            );
        }
        (Ok(i), false) => {
            let g = &mut key.grants[i];
            if named {
                g.read &= !r.read;
                g.write &= !r.write;
                g.owner &= !r.owner;
            } else {
                *g = pb::BucketGrant {
                    bucket: g.bucket.clone(),
                    ..Default::default()
                };
            }
            if !(g.read || g.write || g.owner) {
                key.grants.remove(i);
            }
        }
        (Err(_), false) => return Ok((Batch::new(), Applied::Done)),
    }
    let mut b = Batch::new();
    b.put(
        Space::AccessKeys,
        keys::access_key(&r.id),
        key.encode_to_vec(),
    );
    Ok((b, Applied::Done))
}

/// Adds to `b` an owner grant (read, write, owner) of key `owner_key_id`
/// on the new `bucket`; nothing when the id is empty or names no key (a
/// key deleted while its CreateBucket was in flight).
pub(crate) fn grant_owner<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    owner_key_id: &str,
    bucket: &str,
) -> Result<(), SmError> {
    if owner_key_id.is_empty() {
        return Ok(());
    }
    let Some(mut key) = get_access_key(kv, owner_key_id)? else {
        return Ok(());
    };
    let grant = pb::BucketGrant {
        bucket: bucket.to_string(),
        read: true,
        write: true,
        owner: true,
    };
    match key
        .grants
        .binary_search_by(|g| g.bucket.as_str().cmp(bucket))
    {
        Ok(i) => key.grants[i] = grant,
        Err(i) => key.grants.insert(i, grant),
    }
    b.put(
        Space::AccessKeys,
        keys::access_key(owner_key_id),
        key.encode_to_vec(),
    );
    Ok(())
}

/// Adds to `b` the removal of every key's grant on `bucket` (scans all
/// keys: at most [`MAX_ACCESS_KEYS`]).
pub(crate) fn drop_bucket_grants<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    bucket: &str,
) -> Result<(), SmError> {
    for mut key in list_access_keys(kv)? {
        if let Ok(i) = key
            .grants
            .binary_search_by(|g| g.bucket.as_str().cmp(bucket))
        {
            key.grants.remove(i);
            b.put(
                Space::AccessKeys,
                keys::access_key(&key.id),
                key.encode_to_vec(),
            );
        }
    }
    Ok(())
}
