//! Reads: point lookups and S3-style listings over the state machine.

use std::ops::Bound;

use sluice_proto::meta::{self as pb, ErrorCode};

use super::{SmError, decode, get, keys, page_size, refuse, require_bucket};
use crate::store::{KvStore, Space, as_ref_bound, prefix_end};

/// Rows read per store scan while listing.
const SCAN_CHUNK: usize = 256;

pub fn get_bucket<K: KvStore>(kv: &K, name: &str) -> Result<pb::Bucket, SmError> {
    require_bucket(kv, name)
}

/// Every bucket, sorted by name.
pub fn list_buckets<K: KvStore>(kv: &K) -> Result<Vec<pb::Bucket>, SmError> {
    scan_all(kv, Space::Buckets, "bucket")
}

/// Every registered datanode by id (`live` and `last_heartbeat_ms` are
/// left for the caller, which holds liveness).
pub fn list_datanodes<K: KvStore>(kv: &K) -> Result<Vec<pb::DatanodeInfo>, SmError> {
    scan_all(kv, Space::Datanodes, "datanode")
}

/// The registered datanode `id`, if any.
pub fn get_datanode<K: KvStore>(kv: &K, id: u64) -> Result<Option<pb::DatanodeInfo>, SmError> {
    get(kv, Space::Datanodes, &keys::datanode(id), "datanode")
}

/// Every record of `space`, decoded, read in chunks of [`SCAN_CHUNK`] rows.
pub(super) fn scan_all<K: KvStore, M: prost::Message + Default>(
    kv: &K,
    space: Space,
    what: &'static str,
) -> Result<Vec<M>, SmError> {
    let mut out = Vec::new();
    let mut from: Bound<Vec<u8>> = Bound::Unbounded;
    loop {
        let rows = kv.scan(space, as_ref_bound(&from), Bound::Unbounded, SCAN_CHUNK)?;
        let n = rows.len();
        for (k, v) in rows {
            out.push(decode(what, &v)?);
            from = Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            return Ok(out);
        }
    }
}

/// NoSuchBucket when the bucket is missing, NoSuchKey when the key is.
pub fn get_object<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
) -> Result<pb::ObjectRecord, SmError> {
    require_bucket(kv, bucket)?;
    match get(kv, Space::Objects, &keys::object(bucket, key), "object")? {
        Some(o) => Ok(o),
        None => refuse(ErrorCode::NoSuchKey, format!("no such key: {key}")),
    }
}

/// NoSuchUpload unless the upload exists for this bucket and key.
pub fn get_upload<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    upload_id: &str,
) -> Result<pb::UploadRecord, SmError> {
    match get(
        kv,
        Space::Uploads,
        &keys::upload(bucket, key, upload_id),
        "upload",
    )? {
        Some(u) => Ok(u),
        None => refuse(
            ErrorCode::NoSuchUpload,
            format!("no such upload: {upload_id}"),
        ),
    }
}

/// The later (greater) of two start bounds on the same key line.
fn later_start(a: Bound<Vec<u8>>, b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    fn key(b: &Bound<Vec<u8>>) -> Option<&[u8]> {
        match b {
            Bound::Included(k) | Bound::Excluded(k) => Some(k),
            Bound::Unbounded => None,
        }
    }
    match (key(&a), key(&b)) {
        (None, _) => b,
        (_, None) => a,
        (Some(x), Some(y)) if x > y => a,
        (Some(x), Some(y)) if y > x => b,
        // Same key: the exclusive bound is the later one.
        _ => match a {
            Bound::Excluded(_) => a,
            _ => b,
        },
    }
}

fn end_bound(end: &Option<Vec<u8>>) -> Bound<&[u8]> {
    match end {
        Some(e) => Bound::Excluded(e.as_slice()),
        None => Bound::Unbounded,
    }
}

fn key_str(space: Space, bytes: &[u8]) -> Result<&str, SmError> {
    std::str::from_utf8(bytes).map_err(|_| SmError::BadKey(space))
}

/// The common prefix `key` rolls up into: `key` up to and including the
/// first `delimiter` after `prefix`.
fn common_prefix<'a>(key: &'a str, prefix: &str, delimiter: Option<&str>) -> Option<&'a str> {
    let d = delimiter?;
    let rest = key.get(prefix.len()..)?;
    rest.find(d).map(|pos| &key[..prefix.len() + pos + d.len()])
}

/// ListObjects with S3 semantics (see `ListObjectsRequest` in meta.proto):
/// keys with `prefix` strictly after `start_after`, in UTF-8 binary order;
/// with a delimiter, keys sharing a prefix up to the first delimiter after
/// `prefix` collapse into one common prefix that counts once toward
/// `max_keys` (0 = 1000; capped at 1000) and whose keys are skipped in one
/// seek. `next_marker` is the last key or common prefix returned.
pub fn list_objects<K: KvStore>(
    kv: &K,
    req: &pb::ListObjectsRequest,
) -> Result<pb::ListObjectsResponse, SmError> {
    require_bucket(kv, &req.bucket)?;
    let max = page_size(req.max_keys);
    let delimiter = req.delimiter.as_deref().filter(|d| !d.is_empty());
    let base = keys::bucket_base(&req.bucket);
    let full_prefix = keys::object(&req.bucket, &req.prefix);
    let end = prefix_end(&full_prefix);
    let mut from = Bound::Included(full_prefix);
    if !req.start_after.is_empty() {
        from = later_start(
            from,
            Bound::Excluded(keys::object(&req.bucket, &req.start_after)),
        );
    }

    let mut resp = pb::ListObjectsResponse::default();
    let mut count = 0usize;
    'scan: loop {
        let rows = kv.scan(
            Space::Objects,
            as_ref_bound(&from),
            end_bound(&end),
            SCAN_CHUNK,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let key = key_str(
                Space::Objects,
                k.get(base.len()..).ok_or(SmError::BadKey(Space::Objects))?,
            )?;
            if let Some(cp) = common_prefix(key, &req.prefix, delimiter) {
                let skip_to = prefix_end(&keys::object(&req.bucket, cp));
                if cp > req.start_after.as_str() {
                    if count == max {
                        resp.is_truncated = true;
                        break 'scan;
                    }
                    resp.common_prefixes.push(cp.to_string());
                    resp.next_marker = cp.to_string();
                    count += 1;
                }
                match skip_to {
                    Some(s) => from = Bound::Included(s),
                    None => break 'scan,
                }
                continue 'scan;
            }
            if count == max {
                resp.is_truncated = true;
                break 'scan;
            }
            let mut object: pb::ObjectRecord = decode("object", &v)?;
            object.parts.clear();
            resp.next_marker = key.to_string();
            resp.objects.push(object);
            count += 1;
            from = Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            break;
        }
    }
    Ok(resp)
}

/// ListParts: parts of an upload with numbers after `part_number_marker`,
/// up to `max_parts` (0 = 1000; capped at 1000). NoSuchUpload when the
/// upload does not exist.
pub fn list_parts<K: KvStore>(
    kv: &K,
    req: &pb::ListPartsRequest,
) -> Result<pb::ListPartsResponse, SmError> {
    let upload = get_upload(kv, &req.bucket, &req.key, &req.upload_id)?;
    let max = page_size(req.max_parts);
    let prefix = keys::parts_prefix(&req.upload_id);
    let start = keys::part(&req.upload_id, req.part_number_marker);
    let end = prefix_end(&prefix);
    let rows = kv.scan(
        Space::Parts,
        Bound::Excluded(&start),
        end_bound(&end),
        max + 1,
    )?;
    let mut resp = pb::ListPartsResponse {
        upload: Some(upload),
        is_truncated: rows.len() > max,
        ..Default::default()
    };
    for (_, v) in rows.into_iter().take(max) {
        let part: pb::PartRecord = decode("part", &v)?;
        resp.next_part_number_marker = part.part_number;
        resp.parts.push(part);
    }
    Ok(resp)
}

/// ListMultipartUploads with S3 semantics: uploads sorted by key, then
/// upload id; with `key_marker` only, uploads of keys after it; with both
/// markers, uploads of `key_marker` with an id after `upload_id_marker`
/// and uploads of later keys. Delimiter and `max_uploads` as in
/// [`list_objects`].
pub fn list_uploads<K: KvStore>(
    kv: &K,
    req: &pb::ListUploadsRequest,
) -> Result<pb::ListUploadsResponse, SmError> {
    require_bucket(kv, &req.bucket)?;
    let max = page_size(req.max_uploads);
    let delimiter = req.delimiter.as_deref().filter(|d| !d.is_empty());
    let base = keys::bucket_base(&req.bucket);
    let full_prefix = keys::object(&req.bucket, &req.prefix);
    let end = prefix_end(&full_prefix);
    let mut from = Bound::Included(full_prefix);
    if !req.key_marker.is_empty() {
        let marker = if req.upload_id_marker.is_empty() {
            // After every upload of key_marker: key_marker 0x00 * < key_marker 0x01.
            let mut k = keys::object(&req.bucket, &req.key_marker);
            k.push(1);
            Bound::Included(k)
        } else {
            Bound::Excluded(keys::upload(
                &req.bucket,
                &req.key_marker,
                &req.upload_id_marker,
            ))
        };
        from = later_start(from, marker);
    }

    let mut resp = pb::ListUploadsResponse::default();
    let mut count = 0usize;
    'scan: loop {
        let rows = kv.scan(
            Space::Uploads,
            as_ref_bound(&from),
            end_bound(&end),
            SCAN_CHUNK,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let rest = k.get(base.len()..).ok_or(SmError::BadKey(Space::Uploads))?;
            let sep = rest
                .iter()
                .position(|b| *b == 0)
                .ok_or(SmError::BadKey(Space::Uploads))?;
            let key = key_str(Space::Uploads, &rest[..sep])?;
            if let Some(cp) = common_prefix(key, &req.prefix, delimiter) {
                let skip_to = prefix_end(&keys::object(&req.bucket, cp));
                if cp > req.key_marker.as_str() {
                    if count == max {
                        resp.is_truncated = true;
                        break 'scan;
                    }
                    resp.common_prefixes.push(cp.to_string());
                    resp.next_key_marker = cp.to_string();
                    resp.next_upload_id_marker.clear();
                    count += 1;
                }
                match skip_to {
                    Some(s) => from = Bound::Included(s),
                    None => break 'scan,
                }
                continue 'scan;
            }
            if count == max {
                resp.is_truncated = true;
                break 'scan;
            }
            let upload: pb::UploadRecord = decode("upload", &v)?;
            resp.next_key_marker = upload.key.clone();
            resp.next_upload_id_marker = upload.upload_id.clone();
            resp.uploads.push(upload);
            count += 1;
            from = Bound::Excluded(k);
        }
        if n < SCAN_CHUNK {
            break;
        }
    }
    Ok(resp)
}

/// ListPlacements: committed blobs in blob id order strictly after
/// `after_blob_id`, from the reference index (or, with `degraded_only`, the
/// degraded index), at most `limit` (0 = 1000; capped at 1000), each with
/// its locator and current placement. `is_truncated` says more follow.
pub fn list_placements<K: KvStore>(
    kv: &K,
    req: &pb::ListPlacementsRequest,
) -> Result<pb::ListPlacementsResponse, SmError> {
    let max = page_size(req.limit);
    let space = if req.degraded_only {
        Space::Degraded
    } else {
        Space::Refs
    };
    let after = keys::reference(&req.after_blob_id);
    let start = if req.after_blob_id.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(after.as_slice())
    };
    let rows = kv.scan(space, start, Bound::Unbounded, max + 1)?;
    let mut resp = pb::ListPlacementsResponse {
        is_truncated: rows.len() > max,
        ..Default::default()
    };
    for (k, _) in rows.into_iter().take(max) {
        let blob = key_str(space, &k)?;
        match super::refs::current_placement(kv, blob)? {
            Some((locator, placement)) => resp.blobs.push(pb::PlacedBlob {
                locator: Some(locator),
                placement: Some(placement),
            }),
            None => {
                // The indexes and the records change in one batch, so this
                // is corruption; skip the entry rather than stop the audit.
                tracing::warn!(blob, ?space, "indexed blob has no record holding it");
            }
        }
    }
    Ok(resp)
}
