//! Reads: point lookups and S3-style listings over the state machine.

use std::ops::Bound;

use sluice_proto::meta::{self as pb, ErrorCode};

use super::{SmError, decode, get, keys, page_size, refuse, require_bucket};
use crate::store::{KvStore, Pair, Space, as_ref_bound, prefix_end};

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
    match super::records::get(kv, Space::Objects, &keys::object(bucket, key))? {
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
    // After a common prefix is skipped the next row may start another
    // one: read a single row past it, and grow the reads again (to
    // SCAN_CHUNK; the first read is one row with a delimiter, else the
    // page size) while rows come back, so a page costs O(keys returned +
    // common prefixes returned) rows, not a chunk per prefix.
    let mut chunk = if delimiter.is_some() {
        1
    } else {
        (max + 1).min(SCAN_CHUNK)
    };
    'scan: loop {
        let rows = kv.scan(Space::Objects, as_ref_bound(&from), end_bound(&end), chunk)?;
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
                chunk = 1;
                continue 'scan;
            }
            if count == max {
                resp.is_truncated = true;
                break 'scan;
            }
            let object = super::records::as_head(super::records::decode_head(Space::Objects, &v)?);
            resp.next_marker = key.to_string();
            resp.objects.push(object);
            count += 1;
            from = Bound::Excluded(k);
        }
        if n < chunk {
            break;
        }
        chunk = (chunk * 2).min(SCAN_CHUNK);
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
    // After a common prefix is skipped the next row may start another
    // one: read a single row past it, and grow the reads again (to
    // SCAN_CHUNK; the first read is one row with a delimiter, else the
    // page size) while rows come back, so a page costs O(keys returned +
    // common prefixes returned) rows, not a chunk per prefix.
    let mut chunk = if delimiter.is_some() {
        1
    } else {
        (max + 1).min(SCAN_CHUNK)
    };
    'scan: loop {
        let rows = kv.scan(Space::Uploads, as_ref_bound(&from), end_bound(&end), chunk)?;
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
                chunk = 1;
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
        if n < chunk {
            break;
        }
        chunk = (chunk * 2).min(SCAN_CHUNK);
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

/// One ordered walk over a key range of one keyspace, read in chunks of
/// [`SCAN_CHUNK`] rows; [`Cursor::seek`] skips forward.
struct Cursor {
    space: Space,
    from: Bound<Vec<u8>>,
    end: Option<Vec<u8>>,
    rows: std::collections::VecDeque<Pair>,
    done: bool,
}

impl Cursor {
    fn new(space: Space, from: Bound<Vec<u8>>, end: Option<Vec<u8>>) -> Self {
        Cursor {
            space,
            from,
            end,
            rows: Default::default(),
            done: false,
        }
    }

    fn peek<K: KvStore>(&mut self, kv: &K) -> Result<Option<&Pair>, SmError> {
        if self.rows.is_empty() && !self.done {
            let rows = kv.scan(
                self.space,
                as_ref_bound(&self.from),
                end_bound(&self.end),
                SCAN_CHUNK,
            )?;
            self.done = rows.len() < SCAN_CHUNK;
            if let Some((k, _)) = rows.last() {
                self.from = Bound::Excluded(k.clone());
            }
            self.rows.extend(rows);
        }
        Ok(self.rows.front())
    }

    fn next(&mut self) -> Option<Pair> {
        self.rows.pop_front()
    }

    /// Moves to the first row at or after `to` (never backwards).
    fn seek(&mut self, to: Vec<u8>) {
        while self.rows.front().is_some_and(|(k, _)| *k < to) {
            self.rows.pop_front();
        }
        if self.rows.is_empty() {
            self.from = later_start(
                std::mem::replace(&mut self.from, Bound::Unbounded),
                Bound::Included(to),
            );
        }
    }
}

/// ListVersions with S3 ListObjectVersions semantics (see
/// `ListVersionsRequest` in meta.proto): the current records (`Objects`)
/// merged with the noncurrent versions and delete markers (`Versions`), a
/// key's current version first; both are in the same key order, so this
/// is one ordered walk of two cursors. A common prefix is skipped with one
/// seek of each.
pub fn list_versions<K: KvStore>(
    kv: &K,
    req: &pb::ListVersionsRequest,
) -> Result<pb::ListVersionsResponse, SmError> {
    use super::versions::{Want, find, parse};
    require_bucket(kv, &req.bucket)?;
    let max = page_size(req.max_keys);
    let delimiter = req.delimiter.as_deref().filter(|d| !d.is_empty());
    let base = keys::bucket_base(&req.bucket);
    let full_prefix = keys::object(&req.bucket, &req.prefix);
    let end = prefix_end(&full_prefix);
    let mut objects_from = Bound::Included(full_prefix.clone());
    let mut versions_from = Bound::Included(full_prefix);
    if !req.key_marker.is_empty() {
        let km = &req.key_marker;
        let after_key = prefix_end(&keys::versions_of(&req.bucket, km))
            .expect("ends with 0x00 and so has an end");
        let (o, v) = match (
            req.version_id_marker.as_str(),
            parse(&req.version_id_marker),
        ) {
            ("", _) | (_, Err(_)) => (
                Bound::Excluded(keys::object(&req.bucket, km)),
                Bound::Included(after_key),
            ),
            (_, Ok(want)) => {
                let versions_after = match find(kv, &req.bucket, km, want)? {
                    Some(f) if f.space == Space::Objects => {
                        Bound::Included(keys::versions_of(&req.bucket, km))
                    }
                    Some(f) => Bound::Excluded(f.key),
                    None => match want {
                        Want::Seq(s) => Bound::Excluded(keys::version(&req.bucket, km, s)),
                        _ => Bound::Included(after_key),
                    },
                };
                (
                    Bound::Excluded(keys::object(&req.bucket, km)),
                    versions_after,
                )
            }
        };
        objects_from = later_start(objects_from, o);
        versions_from = later_start(versions_from, v);
    }
    let mut objects = Cursor::new(Space::Objects, objects_from, end.clone());
    let mut versions = Cursor::new(Space::Versions, versions_from, end);

    let mut resp = pb::ListVersionsResponse::default();
    let mut count = 0usize;
    // The key of the last version returned and whether its latest version
    // was among those returned.
    let mut last_key: Option<String> = None;
    loop {
        let o_key = match objects.peek(kv)? {
            Some((k, _)) => Some(
                key_str(
                    Space::Objects,
                    k.get(base.len()..).ok_or(SmError::BadKey(Space::Objects))?,
                )?
                .to_string(),
            ),
            None => None,
        };
        let v_key = match versions.peek(kv)? {
            Some((k, _)) => {
                let rest = k
                    .get(base.len()..k.len().saturating_sub(9))
                    .filter(|_| k.len() >= base.len() + 9)
                    .ok_or(SmError::BadKey(Space::Versions))?;
                Some(key_str(Space::Versions, rest)?.to_string())
            }
            None => None,
        };
        let (key, from_objects) = match (o_key, v_key) {
            (None, None) => break,
            (Some(o), None) => (o, true),
            (None, Some(v)) => (v, false),
            (Some(o), Some(v)) => {
                if o <= v {
                    (o, true)
                } else {
                    (v, false)
                }
            }
        };
        if let Some(cp) = common_prefix(&key, &req.prefix, delimiter) {
            let cp = cp.to_string();
            if cp.as_str() > req.key_marker.as_str() {
                if count == max {
                    resp.is_truncated = true;
                    break;
                }
                resp.common_prefixes.push(cp.clone());
                resp.next_key_marker = cp.clone();
                resp.next_version_id_marker.clear();
                count += 1;
            }
            match prefix_end(&keys::object(&req.bucket, &cp)) {
                Some(s) => {
                    objects.seek(s.clone());
                    versions.seek(s);
                }
                None => break,
            }
            continue;
        }
        if count == max {
            resp.is_truncated = true;
            break;
        }
        let (row_key, value) = if from_objects {
            objects.next()
        } else {
            versions.next()
        }
        .expect("peeked above");
        let space = if from_objects {
            Space::Objects
        } else {
            Space::Versions
        };
        let object = super::records::as_head(super::records::decode_head(space, &value)?);
        let is_latest = if from_objects {
            true
        } else if last_key.as_deref() == Some(key.as_str()) {
            false
        } else {
            // The first row of this key on this page: the latest when the
            // key has no current record and no newer row.
            kv.get(Space::Objects, &keys::object(&req.bucket, &key))?
                .is_none()
                && kv
                    .scan_prefix(Space::Versions, &keys::versions_of(&req.bucket, &key), 1)?
                    .first()
                    .is_some_and(|(k, _)| *k == row_key)
        };
        resp.next_key_marker = key.clone();
        resp.next_version_id_marker = super::versions::shown_id(&object).to_string();
        last_key = Some(key);
        resp.versions.push(pb::VersionEntry {
            object: Some(object),
            is_latest,
        });
        count += 1;
    }
    if !resp.is_truncated {
        resp.next_key_marker.clear();
        resp.next_version_id_marker.clear();
    }
    Ok(resp)
}
