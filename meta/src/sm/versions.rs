//! Object versions (S3 "Using versioning in S3 buckets"; the layout is in
//! docs/design/versioning.md).
//!
//! `Objects[bucket, key]` stays the key's *current* version when it is not
//! a delete marker, so every read of the current object (GET, HEAD,
//! ListObjects, conditional writes, lifecycle expiration) is unchanged.
//! [`Space::Versions`] holds every other version of a versioned bucket —
//! noncurrent versions and delete markers, the latest one included when it
//! is a marker — under `bucket 0x00 key 0x00 (u64::MAX - seq)`, newest
//! first. Each record is in exactly one of the two places, and moving it
//! between them keeps its `seq`, so the reference index's locators (which
//! carry `seq`) stay valid without a rewrite.
//!
//! Invariants: the current record, when present, is newer than every row
//! of its key; a key has at most one `null` version; an unversioned bucket
//! has no rows (its records keep `seq` 0 and `version_id` "", exactly as
//! written before versions existed, and become the `null` version when
//! versioning is enabled).

pub use sluice_meta_client::version_id::{is_version_id, shown_id};
use sluice_proto::meta::{self as pb, ErrorCode, Versioning};

use super::refs::{object_refs, update_index};
use super::{SmError, decode, keys, records, refuse};
use crate::store::{Batch, KvStore, Space};

/// Rows read per scan while looking for a key's `null` version.
const SCAN_CHUNK: usize = 256;

/// Which version a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// No version id: the current version.
    Current,
    /// `versionId=null`.
    Null,
    /// A version id: the version written at this log index.
    Seq(u64),
}

/// The version id of the version written at log index `seq`.
pub fn version_id(seq: u64) -> String {
    format!("{seq:016x}")
}

/// Parses a request's version id ("" = current, "null", or 16 hex digits);
/// anything else is refused `INVALID_ARGUMENT` (S3: "Invalid version id
/// specified").
pub(crate) fn parse(version: &str) -> Result<Want, SmError> {
    match version {
        "" => Ok(Want::Current),
        "null" => Ok(Want::Null),
        v if is_version_id(v) => Ok(Want::Seq(
            u64::from_str_radix(v, 16).expect("16 hex digits"),
        )),
        v => refuse(
            ErrorCode::InvalidArgument,
            format!("invalid version id {v:?}"),
        ),
    }
}

fn matches(record: &pb::ObjectRecord, want: Want) -> bool {
    match want {
        Want::Current => true,
        Want::Null => record.version_id.is_empty(),
        Want::Seq(s) => !record.version_id.is_empty() && record.seq == s,
    }
}

/// The version id a response reports for `record` written to a bucket in
/// state `versioning`: "" for a bucket that was never versioned, "null"
/// for the null version, else its id.
pub(crate) fn reported(versioning: Versioning, record: &pb::ObjectRecord) -> String {
    if versioning == Versioning::Unversioned {
        String::new()
    } else {
        shown_id(record).to_string()
    }
}

/// A stored version: where it is and what it says.
#[derive(Debug)]
pub(crate) struct Found {
    pub space: Space,
    pub key: Vec<u8>,
    pub record: pb::ObjectRecord,
}

/// The newest row of (bucket, key) in `Versions` other than `skip`.
pub(crate) fn latest_row<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    skip: Option<&[u8]>,
) -> Result<Option<(Vec<u8>, pb::ObjectRecord)>, SmError> {
    let rows = kv.scan_prefix(Space::Versions, &keys::versions_of(bucket, key), 2)?;
    for (k, v) in rows {
        if Some(k.as_slice()) != skip {
            let head = decode("object version", &v)?;
            return Ok(records::complete(kv, Space::Versions, &k, head)?.map(|r| (k, r)));
        }
    }
    Ok(None)
}

/// The `null` version of (bucket, key) among its `Versions` rows.
fn null_row<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
) -> Result<Option<(Vec<u8>, pb::ObjectRecord)>, SmError> {
    let prefix = keys::versions_of(bucket, key);
    let end = crate::store::prefix_end(&prefix);
    let end = match &end {
        Some(e) => std::ops::Bound::Excluded(e.as_slice()),
        None => std::ops::Bound::Unbounded,
    };
    let mut from = std::ops::Bound::Included(prefix.clone());
    loop {
        let rows = kv.scan(
            Space::Versions,
            crate::store::as_ref_bound(&from),
            end,
            SCAN_CHUNK,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let head: pb::ObjectRecord = decode("object version", &v)?;
            if head.version_id.is_empty() {
                return Ok(records::complete(kv, Space::Versions, &k, head)?.map(|r| (k, r)));
            }
            from = std::ops::Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            return Ok(None);
        }
    }
}

/// The version of (bucket, key) that `want` names, current or not, whole.
pub(crate) fn find<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    want: Want,
) -> Result<Option<Found>, SmError> {
    find_as(kv, bucket, key, want, true)
}

/// [`find`], reading only the head of a record (no part list) unless
/// `whole`.
fn find_as<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    want: Want,
    whole: bool,
) -> Result<Option<Found>, SmError> {
    let read = |space, k: &[u8]| {
        if whole {
            records::get(kv, space, k)
        } else {
            records::get_head(kv, space, k)
        }
    };
    let object_key = keys::object(bucket, key);
    if let Some(current) = read(Space::Objects, &object_key)?
        && matches(&current, want)
    {
        return Ok(Some(Found {
            space: Space::Objects,
            key: object_key,
            record: current,
        }));
    }
    let row = match want {
        Want::Current => None,
        Want::Null => null_row(kv, bucket, key)?,
        Want::Seq(s) => {
            let k = keys::version(bucket, key, s);
            read(Space::Versions, &k)?
                .filter(|r| matches(r, want))
                .map(|r| (k, r))
        }
    };
    Ok(row.map(|(key, record)| Found {
        space: Space::Versions,
        key,
        record,
    }))
}

/// The version a read names (GetObject): NoSuchKey when the key has no
/// current version (NoSuchVersion for a version id it does not have). A
/// delete marker is answered only `with_marker` — the latest version when
/// no id is given, or the one named — and otherwise refused NoSuchKey
/// (latest) or METHOD_NOT_ALLOWED (named), as S3 answers 404 and 405.
pub fn get_version<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    version: &str,
    with_marker: bool,
) -> Result<pb::ObjectRecord, SmError> {
    get_version_as(kv, bucket, key, version, with_marker, true)
}

/// [`get_version`]; unless `whole`, the answer is the record's head
/// (`records::as_head`: no parts, no inline body, `part_count` set) and no
/// part list is read.
pub fn get_version_as<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    version: &str,
    with_marker: bool,
    whole: bool,
) -> Result<pb::ObjectRecord, SmError> {
    super::require_bucket(kv, bucket)?;
    let want = parse(version)?;
    match find_as(kv, bucket, key, want, whole)? {
        Some(found) if found.record.delete_marker && !with_marker => refuse(
            ErrorCode::MethodNotAllowed,
            format!("version {version} of {key} is a delete marker"),
        ),
        Some(found) if whole => Ok(found.record),
        Some(found) => Ok(records::as_head(found.record)),
        None if want == Want::Current => {
            if with_marker
                && let Some((_, latest)) = latest_row(kv, bucket, key, None)?
                && latest.delete_marker
            {
                return Ok(latest);
            }
            refuse(ErrorCode::NoSuchKey, format!("no such key: {key}"))
        }
        None => refuse(
            ErrorCode::NoSuchVersion,
            format!("no version {version} of {key}"),
        ),
    }
}

/// The placements of an object record's parts.
pub(crate) fn placements(record: &pb::ObjectRecord) -> impl Iterator<Item = &pb::Placement> {
    record.parts.iter().filter_map(|p| p.placement.as_ref())
}

/// Keeps `record`, until now current, as a noncurrent version.
fn stash(b: &mut Batch, record: &pb::ObjectRecord) {
    records::put(
        b,
        Space::Versions,
        keys::version(&record.bucket, &record.key, record.seq),
        record,
    );
}

/// Removes the key's `null` version from `Versions`, if it has one there;
/// its placements.
fn drop_null_row<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    bucket: &str,
    key: &str,
) -> Result<Vec<pb::Placement>, SmError> {
    let Some((k, record)) = null_row(kv, bucket, key)? else {
        return Ok(Vec::new());
    };
    records::delete(b, Space::Versions, k);
    Ok(placements(&record).cloned().collect())
}

/// Adds to `b` the write of `new` as the current version of its key in a
/// bucket in state `versioning`, written by the entry at log index
/// `index`, replacing the current record `old`; the reference index is
/// updated. Sets `new.seq` and `new.version_id`. Returns the placements no
/// longer referenced:
/// * unversioned: `old`'s (as before versions existed; `new` keeps seq 0);
/// * enabled: none (`old` stays as a noncurrent version);
/// * suspended: the previous `null` version's (`new` is the null version).
pub(crate) fn write_current<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    versioning: Versioning,
    new: &mut pb::ObjectRecord,
    old: Option<&pb::ObjectRecord>,
    index: u64,
) -> Result<Vec<pb::Placement>, SmError> {
    new.delete_marker = false;
    let released = if versioning == Versioning::Enabled {
        new.seq = index;
        new.version_id = version_id(index);
        if let Some(old) = old {
            stash(b, old);
        }
        Vec::new()
    } else if versioning == Versioning::Suspended {
        new.seq = index;
        new.version_id = String::new();
        match old {
            Some(old) if old.version_id.is_empty() => released_by(old, new),
            Some(old) => {
                stash(b, old);
                drop_null_row(kv, b, &new.bucket, &new.key)?
            }
            None => drop_null_row(kv, b, &new.bucket, &new.key)?,
        }
    } else {
        new.seq = 0;
        new.version_id = String::new();
        old.map(|old| released_by(old, new)).unwrap_or_default()
    };
    records::put(b, Space::Objects, keys::object(&new.bucket, &new.key), new);
    update_index(b, &released, object_refs(new));
    Ok(released)
}

/// Placements of `old` that `new` does not reference too (a retried write
/// references the same blobs and releases nothing).
fn released_by(old: &pb::ObjectRecord, new: &pb::ObjectRecord) -> Vec<pb::Placement> {
    let kept: std::collections::HashSet<&str> =
        placements(new).map(|p| p.blob_id.as_str()).collect();
    placements(old)
        .filter(|p| !kept.contains(p.blob_id.as_str()))
        .cloned()
        .collect()
}

/// What a delete did.
#[derive(Debug, Default)]
pub(crate) struct Deleted {
    pub released: Vec<pb::Placement>,
    /// As [`reported`]: the marker written, or the version removed.
    pub version_id: String,
    pub delete_marker: bool,
}

/// Adds to `b` a DeleteObject of (bucket, key) naming `want`, as the entry
/// at log index `index` with leader time `now_ms` (S3 "Deleting object
/// versions"); the reference index is updated.
/// * No version id, unversioned: the current record goes.
/// * No version id, enabled: a delete marker becomes the latest version;
///   the current record stays as a noncurrent version.
/// * No version id, suspended: the `null` version goes and a `null` delete
///   marker becomes the latest version.
/// * A version id: that version goes (a missing one is no error); when it
///   was the latest, the next newest becomes current unless it is a marker.
pub(crate) fn delete<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    bucket: &pb::Bucket,
    key: &str,
    want: Want,
    index: u64,
    now_ms: i64,
) -> Result<Deleted, SmError> {
    let object_key = keys::object(&bucket.name, key);
    let current = records::get(kv, Space::Objects, &object_key)?;
    let versioning = bucket.versioning();
    let mut out = Deleted::default();
    if want == Want::Current && versioning == Versioning::Unversioned {
        if let Some(c) = &current {
            records::delete(b, Space::Objects, object_key);
            out.released = placements(c).cloned().collect();
        }
    } else if want == Want::Current {
        let suspended = versioning == Versioning::Suspended;
        match &current {
            Some(c) => {
                records::delete(b, Space::Objects, object_key);
                if suspended && c.version_id.is_empty() {
                    out.released = placements(c).cloned().collect();
                } else {
                    stash(b, c);
                    if suspended {
                        out.released = drop_null_row(kv, b, &bucket.name, key)?;
                    }
                }
            }
            None if suspended => out.released = drop_null_row(kv, b, &bucket.name, key)?,
            None => {}
        }
        let marker = pb::ObjectRecord {
            bucket: bucket.name.clone(),
            key: key.to_string(),
            last_modified_ms: now_ms,
            delete_marker: true,
            seq: index,
            version_id: if suspended {
                String::new()
            } else {
                version_id(index)
            },
            ..Default::default()
        };
        stash(b, &marker);
        out.version_id = reported(versioning, &marker);
        out.delete_marker = true;
    } else if let Some(found) = find(kv, &bucket.name, key, want)? {
        let latest = found.space == Space::Objects
            || (current.is_none()
                && latest_row(kv, &bucket.name, key, None)?.is_some_and(|(k, _)| k == found.key));
        records::delete(b, found.space, found.key.clone());
        if latest
            && let Some((k, next)) = latest_row(kv, &bucket.name, key, Some(&found.key))?
            && !next.delete_marker
        {
            records::delete(b, Space::Versions, k);
            records::put(b, Space::Objects, object_key, &next);
        }
        out.released = placements(&found.record).cloned().collect();
        out.version_id = shown_id(&found.record).to_string();
        out.delete_marker = found.record.delete_marker;
    } else {
        out.version_id = match want {
            Want::Null => "null".to_string(),
            Want::Seq(s) => version_id(s),
            Want::Current => String::new(),
        };
    }
    update_index(b, &out.released, []);
    Ok(out)
}

/// `true` when the bucket has any noncurrent version or delete marker
/// (DeleteBucket refuses BucketNotEmpty, as S3 does).
pub(crate) fn bucket_has_versions<K: KvStore>(kv: &K, bucket: &str) -> Result<bool, SmError> {
    Ok(!kv
        .scan_prefix(Space::Versions, &keys::bucket_base(bucket), 1)?
        .is_empty())
}
