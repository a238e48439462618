//! The reference index: which blobs the committed metadata references, and
//! where each one's placement is stored.
//!
//! [`Space::Refs`] holds one key per blob id that a part record or an
//! object record references; the value is the encoded
//! [`pb::BlobLocator`] of that record (object: bucket, key, part number and
//! an empty upload id; part of an open upload: bucket, key, upload id, part
//! number). [`Space::Degraded`] holds one key (empty value) per referenced
//! blob whose placement has `missing` shards. Every mutation updates both in
//! the same atomic batch as the records it writes ([`update_index`]), so the
//! index is always exactly the set of blobs of all part and object records.
//! The datanodes' GC (`Collectable`), `ListPlacements` and heal find a
//! blob's record from its id with [`locate`] and [`current_placement`].
//!
//! To ensure correctness the index relies on the invariant the whole data
//! path already keeps: a blob is referenced by at most one record at a time.
//! Every shard write creates a fresh blob id; a retried commit of the same
//! record references the same blob and releases nothing; Complete moves a
//! part's blob from its part record to the object record (its locator is
//! rewritten). Under it, a blob leaves the index exactly when a mutation
//! releases it ([`Applied::Released`](super::Applied::Released),
//! `CompleteUploadResponse.released`).
//!
//! The index is a keyspace like the others, so snapshots carry it; its
//! format is part of the store's (`store::format`).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};

#[cfg(test)]
use super::decode;
use super::{SmError, get, keys, records, refuse};
#[cfg(test)]
use crate::store::as_ref_bound;
use crate::store::{Batch, KvStore, Space};

/// Most blob ids one [`filter_unreferenced`] call accepts.
pub const MAX_FILTER_IDS: usize = 1000;

/// Records read (or keys removed) per scan while rebuilding the index.
#[cfg(test)]
const REBUILD_CHUNK: usize = 1024;

/// The locator of part `part_number` of object (bucket, key).
pub fn object_locator(bucket: &str, key: &str, part_number: u32) -> pb::BlobLocator {
    pb::BlobLocator {
        bucket: bucket.to_string(),
        key: key.to_string(),
        upload_id: String::new(),
        part_number,
        version_seq: 0,
    }
}

/// The locator of part record (upload_id, part_number) of the open upload
/// of (bucket, key).
pub fn part_locator(bucket: &str, key: &str, upload_id: &str, part_number: u32) -> pb::BlobLocator {
    pb::BlobLocator {
        bucket: bucket.to_string(),
        key: key.to_string(),
        upload_id: upload_id.to_string(),
        part_number,
        version_seq: 0,
    }
}

/// Every placement of an object record (current or noncurrent version)
/// with its locator.
pub fn object_refs(object: &pb::ObjectRecord) -> Vec<(&pb::Placement, pb::BlobLocator)> {
    object
        .parts
        .iter()
        .filter_map(|p| {
            p.placement.as_ref().map(|pl| {
                let mut locator = object_locator(&object.bucket, &object.key, p.part_number);
                locator.version_seq = object.seq;
                (pl, locator)
            })
        })
        .collect()
}

/// The placement of a part record of the upload of (bucket, key) with its
/// locator.
pub fn part_refs<'a>(
    bucket: &str,
    key: &str,
    part: &'a pb::PartRecord,
) -> Option<(&'a pb::Placement, pb::BlobLocator)> {
    part.placement.as_ref().map(|pl| {
        (
            pl,
            part_locator(bucket, key, &part.upload_id, part.part_number),
        )
    })
}

/// Adds to `b` the degraded-index write for `placement`: the blob is in
/// [`Space::Degraded`] exactly when its `missing` is not empty.
pub(crate) fn mark_degraded(b: &mut Batch, placement: &pb::Placement) {
    if placement.blob_id.is_empty() {
        return;
    }
    let key = keys::reference(&placement.blob_id);
    if placement.missing.is_empty() {
        b.delete(Space::Degraded, key);
    } else {
        b.put(Space::Degraded, key, Vec::new());
    }
}

/// Adds the reference- and degraded-index writes of one mutation to `b`:
/// blobs of `released` placements leave both indexes; blobs of `referenced`
/// placements (those of the records the mutation writes, with the locator
/// of their record) are in the reference index with that locator
/// afterwards, and in the degraded index when they have missing shards. A
/// blob in both lists stays; placements with an empty blob id are ignored.
pub(crate) fn update_index<'a>(
    b: &mut Batch,
    released: &[pb::Placement],
    referenced: impl IntoIterator<Item = (&'a pb::Placement, pb::BlobLocator)>,
) {
    let kept: HashMap<&str, (&pb::Placement, pb::BlobLocator)> = referenced
        .into_iter()
        .filter(|(p, _)| !p.blob_id.is_empty())
        .map(|(p, l)| (p.blob_id.as_str(), (p, l)))
        .collect();
    for p in released {
        if !p.blob_id.is_empty() && !kept.contains_key(p.blob_id.as_str()) {
            b.delete(Space::Refs, keys::reference(&p.blob_id));
            b.delete(Space::Degraded, keys::reference(&p.blob_id));
        }
    }
    for (id, (placement, locator)) in kept {
        b.put(Space::Refs, keys::reference(id), locator.encode_to_vec());
        mark_degraded(b, placement);
    }
}

/// `true` when a part or object record references `blob_id`.
pub fn is_referenced<K: KvStore>(kv: &K, blob_id: &str) -> Result<bool, SmError> {
    Ok(kv.get(Space::Refs, &keys::reference(blob_id))?.is_some())
}

/// Where the placement of `blob_id` is stored; `None` when no record
/// references the blob.
pub fn locate<K: KvStore>(kv: &K, blob_id: &str) -> Result<Option<pb::BlobLocator>, SmError> {
    get(kv, Space::Refs, &keys::reference(blob_id), "blob locator")
}

/// The committed placement of `blob_id` and where it is stored; `None` when
/// no record references the blob.
pub fn current_placement<K: KvStore>(
    kv: &K,
    blob_id: &str,
) -> Result<Option<(pb::BlobLocator, pb::Placement)>, SmError> {
    let Some(locator) = locate(kv, blob_id)? else {
        return Ok(None);
    };
    let mut records = PlacementRecords::default();
    let placement = records.placement(kv, &locator, blob_id)?.cloned();
    Ok(placement.map(|p| (locator, p)))
}

/// The object and part records a mutation rewrites to change placements in
/// place (ReportMissing, UpdatePlacement). Each record is read once and
/// written once by [`PlacementRecords::write`], so several placements of
/// one multipart object can change in one batch.
#[derive(Debug, Default)]
pub(crate) struct PlacementRecords {
    /// Object records by (Objects or Versions, key).
    objects: BTreeMap<(Space, Vec<u8>), pb::ObjectRecord>,
    parts: BTreeMap<Vec<u8>, pb::PartRecord>,
}

impl PlacementRecords {
    /// The placement of `blob_id` in the record `locator` names, for
    /// changing; `None` when that record does not hold the blob.
    pub(crate) fn placement<K: KvStore>(
        &mut self,
        kv: &K,
        locator: &pb::BlobLocator,
        blob_id: &str,
    ) -> Result<Option<&mut pb::Placement>, SmError> {
        if locator.upload_id.is_empty() {
            let Some(key) = self.object_record(kv, locator)? else {
                return Ok(None);
            };
            let object = self.objects.get_mut(&key).expect("inserted above");
            Ok(object
                .parts
                .iter_mut()
                .filter(|p| p.part_number == locator.part_number)
                .filter_map(|p| p.placement.as_mut())
                .find(|p| p.blob_id == blob_id))
        } else {
            let key = keys::part(&locator.upload_id, locator.part_number);
            if !self.parts.contains_key(&key) {
                let Some(p) = get::<pb::PartRecord, _>(kv, Space::Parts, &key, "part")? else {
                    return Ok(None);
                };
                self.parts.insert(key.clone(), p);
            }
            let part = self.parts.get_mut(&key).expect("inserted above");
            Ok(part.placement.as_mut().filter(|p| p.blob_id == blob_id))
        }
    }

    /// Where the object record `locator` names is, read into the cache:
    /// the key's current record when its `seq` matches, else the
    /// noncurrent version with that `seq`; `None` when neither exists.
    /// Read RPCs (GC's `Collectable`, `ListPlacements`) run beside applies
    /// and the store has no snapshot reads, so a version promoted to
    /// current between the two reads is looked for in `Objects` once more
    /// (a promotion is one atomic batch): a live version is never reported
    /// missing.
    fn object_record<K: KvStore>(
        &mut self,
        kv: &K,
        locator: &pb::BlobLocator,
    ) -> Result<Option<(Space, Vec<u8>)>, SmError> {
        let matches = |o: &pb::ObjectRecord| o.seq == locator.version_seq;
        let current = (Space::Objects, keys::object(&locator.bucket, &locator.key));
        if !self.objects.contains_key(&current)
            && let Some(o) = records::get(kv, current.0, &current.1)?
        {
            self.objects.insert(current.clone(), o);
        }
        if self.objects.get(&current).is_some_and(matches) {
            return Ok(Some(current));
        }
        let version = (
            Space::Versions,
            keys::version(&locator.bucket, &locator.key, locator.version_seq),
        );
        if self.objects.contains_key(&version) {
            return Ok(Some(version));
        }
        if let Some(o) = records::get(kv, version.0, &version.1)? {
            self.objects.insert(version.clone(), o);
            return Ok(Some(version));
        }
        match records::get(kv, current.0, &current.1)? {
            Some(o) if matches(&o) => {
                self.objects.insert(current.clone(), o);
                Ok(Some(current))
            }
            _ => Ok(None),
        }
    }

    /// Adds to `b` the rewrite of every record read.
    pub(crate) fn write(self, b: &mut Batch) {
        for ((space, k), o) in self.objects {
            records::put(b, space, k, &o);
        }
        for (k, p) in self.parts {
            b.put(Space::Parts, k, p.encode_to_vec());
        }
    }
}

/// The ids of `blob_ids` that no part or object record references, in
/// request order (duplicates kept). Refuses `InvalidArgument` for more than
/// [`MAX_FILTER_IDS`] ids.
pub fn filter_unreferenced<K: KvStore>(
    kv: &K,
    blob_ids: &[String],
) -> Result<Vec<String>, SmError> {
    if blob_ids.len() > MAX_FILTER_IDS {
        return refuse(
            ErrorCode::InvalidArgument,
            format!(
                "{} blob ids asked, at most {MAX_FILTER_IDS} per call",
                blob_ids.len()
            ),
        );
    }
    let mut out = Vec::new();
    for id in blob_ids {
        if !is_referenced(kv, id)? {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// Rebuilds the reference and degraded indexes from the object, upload and
/// part records; returns how many references were written. Tests compare
/// it with the index mutations maintain.
#[cfg(test)]
pub fn rebuild_index<K: KvStore>(kv: &K) -> Result<u64, SmError> {
    for space in [Space::Refs, Space::Degraded] {
        loop {
            let rows = kv.scan(space, Bound::Unbounded, Bound::Unbounded, REBUILD_CHUNK)?;
            if rows.is_empty() {
                break;
            }
            let mut b = Batch::new();
            for (k, _) in rows {
                b.delete(space, k);
            }
            kv.apply(b)?;
        }
    }

    let mut indexed = 0u64;
    for space in [Space::Objects, Space::Versions] {
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let rows = kv.scan(space, as_ref_bound(&from), Bound::Unbounded, REBUILD_CHUNK)?;
            let n = rows.len();
            let mut b = Batch::new();
            for (k, v) in rows {
                let head: pb::ObjectRecord = decode("object", &v)?;
                if let Some(object) = records::complete(kv, space, &k, head)? {
                    let refs = object_refs(&object);
                    indexed += refs.len() as u64;
                    update_index(&mut b, &[], refs);
                }
                from = Bound::Excluded(k);
            }
            kv.apply(b)?;
            if n < REBUILD_CHUNK {
                break;
            }
        }
    }

    // Part records are keyed by upload id only: their bucket and key come
    // from the upload record.
    let mut from: Bound<Vec<u8>> = Bound::Unbounded;
    loop {
        let rows = kv.scan(
            Space::Uploads,
            as_ref_bound(&from),
            Bound::Unbounded,
            REBUILD_CHUNK,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let upload: pb::UploadRecord = decode("upload", &v)?;
            indexed += index_upload_parts(kv, &upload)?;
            from = Bound::Excluded(k);
        }
        if n < REBUILD_CHUNK {
            break;
        }
    }

    Ok(indexed)
}

/// Indexes the part records of one open upload; returns how many.
#[cfg(test)]
fn index_upload_parts<K: KvStore>(kv: &K, upload: &pb::UploadRecord) -> Result<u64, SmError> {
    let prefix = keys::parts_prefix(&upload.upload_id);
    let end = crate::store::prefix_end(&prefix);
    let end = match &end {
        Some(e) => Bound::Excluded(e.as_slice()),
        None => Bound::Unbounded,
    };
    let mut indexed = 0u64;
    let mut from: Bound<Vec<u8>> = Bound::Included(prefix.clone());
    loop {
        let rows = kv.scan(Space::Parts, as_ref_bound(&from), end, REBUILD_CHUNK)?;
        let n = rows.len();
        let mut b = Batch::new();
        for (k, v) in rows {
            let part: pb::PartRecord = decode("part", &v)?;
            if let Some(r) = part_refs(&upload.bucket, &upload.key, &part) {
                indexed += 1;
                update_index(&mut b, &[], [r]);
            }
            from = Bound::Excluded(k);
        }
        kv.apply(b)?;
        if n < REBUILD_CHUNK {
            return Ok(indexed);
        }
    }
}

/// Every blob id in the index, ascending (tests and tools; reads the whole
/// keyspace).
pub fn all_references<K: KvStore>(kv: &K) -> Result<Vec<String>, SmError> {
    kv.keys_in(Space::Refs, Bound::Unbounded, Bound::Unbounded)?
        .into_iter()
        .map(|k| String::from_utf8(k).map_err(|_| SmError::BadKey(Space::Refs)))
        .collect()
}

/// Every blob id in the degraded index, ascending (tests and tools).
pub fn all_degraded<K: KvStore>(kv: &K) -> Result<Vec<String>, SmError> {
    kv.keys_in(Space::Degraded, Bound::Unbounded, Bound::Unbounded)?
        .into_iter()
        .map(|k| String::from_utf8(k).map_err(|_| SmError::BadKey(Space::Degraded)))
        .collect()
}
