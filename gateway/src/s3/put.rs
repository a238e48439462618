//! PutObject, and the two steps every body-storing operation shares:
//! [`store_body`] (stream a verified body into a new blob of a write epoch)
//! and [`commit_object`] (commit the record in meta, which releases what it
//! replaced). The caller takes an [`EpochGuard`] before [`store_body`] and
//! holds it until the commit returns: a commit of a blob whose epoch meta
//! closed meanwhile is refused with `EPOCH_CLOSED` (`503`, retried).

use sluice_util::clock::wall_clock_ms;
use std::io;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_meta_client::MetaError;
use sluice_proto::meta as pb;

use super::checksum::{self, BodyDigests, DigestingBody, Expected};
use super::error::{blob_error, body_error, internal, meta_error};
use super::{Gateway, etag, http_meta, object_placement_key, tagging};
use crate::epoch::EpochGuard;

/// A request body stored as a blob (or kept to be stored inline in the
/// object's record) and verified against what the client claimed.
pub struct StoredBody {
    /// Where the blob lives; `None` for an empty or inline body (no blob
    /// is written).
    pub placement: Option<pb::Placement>,
    /// Size, MD5 and checksums of the body.
    pub digests: BodyDigests,
    /// The whole body of a small object, stored in its record
    /// ([`store_object_body`]).
    pub inline: Option<Bytes>,
}

/// A request body as the data path takes it.
pub type BodyStream = BoxStream<'static, Result<Bytes, io::Error>>;

/// The body of an s3s request as a [`BodyStream`] (an absent body is empty).
pub fn request_body(body: Option<StreamingBlob>) -> BodyStream {
    match body {
        Some(blob) => blob.map_err(io::Error::other).boxed(),
        None => futures::stream::empty().boxed(),
    }
}

/// The body of an object (PutObject, CopyObject): kept whole to be stored
/// inline in the object's record when its declared length is at most the
/// gateway's `inline_max_bytes` (one Raft commit, no shard writes: what
/// makes small PUTs cheap), else [`store_body`]. An inline body is
/// digested and checked like any other; it is held in memory once, at most
/// `inline_max_bytes` per request. Errors: those of [`store_body`], and
/// `IncompleteBody` for a body shorter or longer than its length.
pub async fn store_object_body<S>(
    gw: &Gateway,
    epoch: &EpochGuard,
    placement_key: &str,
    body: S,
    expected: Expected,
    len: Option<u64>,
) -> S3Result<StoredBody>
where
    S: Stream<Item = Result<Bytes, io::Error>> + Send + Unpin,
{
    let Some(len) = len.filter(|l| *l > 0 && *l <= gw.inline_max) else {
        return store_body(gw, epoch, placement_key, body, expected, len).await;
    };
    let wrong_length = |longer: bool| {
        S3Error::with_message(
            S3ErrorCode::IncompleteBody,
            if longer {
                "The request body is longer than its Content-Length."
            } else {
                "You did not provide the number of bytes specified by the Content-Length HTTP header."
            },
        )
    };
    let (mut digesting, slot) = DigestingBody::new(body, expected);
    // `len` <= inline_max_bytes (at most 1 MiB): bounded by configuration.
    let mut buf = bytes::BytesMut::with_capacity(len as usize);
    while let Some(chunk) = digesting.next().await {
        let chunk = chunk.map_err(|e| body_error(&e))?;
        if (buf.len() + chunk.len()) as u64 > len {
            return Err(wrong_length(true));
        }
        buf.extend_from_slice(&chunk);
    }
    if (buf.len() as u64) < len {
        return Err(wrong_length(false));
    }
    let digests = checksum::take(&slot)
        .ok_or_else(|| internal("the request body ended without its digests"))?;
    Ok(StoredBody {
        placement: None,
        digests,
        inline: Some(buf.freeze()),
    })
}

/// Streams `body` through a [`DigestingBody`] into a new blob of write
/// epoch `epoch` placed under `placement_key`, never holding more than the
/// data path's stripes in memory.
///
/// `len` is the declared (decoded) body length when known; `Some(0)` skips
/// the data path: the body is still read (an aws-chunked body may carry a
/// checksum trailer) but no blob is written. Errors: `BadDigest` when a
/// digest does not match, the data-path errors of [`blob_error`] (among
/// them `503 SlowDown` when no buffer or no datanode credit comes within
/// `stall_timeout`).
pub async fn store_body<S>(
    gw: &Gateway,
    epoch: &EpochGuard,
    placement_key: &str,
    body: S,
    expected: Expected,
    len: Option<u64>,
) -> S3Result<StoredBody>
where
    S: Stream<Item = Result<Bytes, io::Error>> + Send + Unpin,
{
    let (mut digesting, slot) = DigestingBody::new(body, expected);
    let placement = if len == Some(0) {
        while let Some(chunk) = digesting.next().await {
            if !chunk.map_err(|e| body_error(&e))?.is_empty() {
                return Err(S3Error::with_message(
                    S3ErrorCode::IncompleteBody,
                    "The request body is longer than its Content-Length.",
                ));
            }
        }
        None
    } else {
        Some(
            gw.blobs
                .write_under(epoch, placement_key, digesting, len)
                .await
                .map_err(blob_error)?,
        )
    };
    let Some(digests) = checksum::take(&slot) else {
        if let Some(p) = placement {
            gw.reclaimer.discard(vec![p]).await;
        }
        return Err(internal(
            "the data path returned before the request body ended",
        ));
    };
    if let Some(p) = &placement
        && p.size != digests.size
    {
        let size = p.size;
        gw.reclaimer.discard(vec![p.clone()]).await;
        tracing::error!(
            placement_size = size,
            body_size = digests.size,
            "blob size differs from body size"
        );
        return Err(internal("blob size differs from body size"));
    }
    Ok(StoredBody {
        placement,
        digests,
        inline: None,
    })
}

/// Commits `record` in meta if `condition` (a conditional write's
/// `If-Match`/`If-None-Match`) holds when the commit is applied (meta
/// releases the blobs it replaced and
/// deletes them after `delete_delay`). When the commit fails, `new_blob`
/// (the blob written for this record) is deleted if meta definitely
/// refused the record (`EPOCH_CLOSED` among the refusals: `503`); when
/// meta was unreachable the commit may still have happened, so the blob is
/// left to datanode GC. The caller holds the blob's epoch guard until this
/// returns. Returns the `x-amz-version-id` of the version written.
pub async fn commit_object(
    gw: &Gateway,
    record: pb::ObjectRecord,
    new_blob: Option<pb::Placement>,
    condition: Option<pb::WriteCondition>,
) -> S3Result<Option<String>> {
    match gw.meta.put_object_if(record, condition).await {
        Ok(r) => {
            gw.reclaimer.release(&r.released);
            Ok(super::error::reported_version(r.version_id))
        }
        Err(err) => {
            discard_uncommitted(gw, &err, new_blob).await;
            Err(meta_error(err))
        }
    }
}

/// Deletes a blob whose commit failed, unless the commit may have happened (see [`commit_object`]).
///
/// `SLOW_DOWN` is not a refusal of the commit: meta did not propose that
/// attempt, but an earlier attempt of the same operation (whose answer was
/// lost) may still be applied, so the blob is left to datanode GC.
pub async fn discard_uncommitted(gw: &Gateway, err: &MetaError, new_blob: Option<pb::Placement>) {
    match (err, new_blob) {
        (
            MetaError::Refused {
                code: pb::ErrorCode::SlowDown,
                ..
            },
            Some(p),
        ) => {
            tracing::info!(blob_id = %p.blob_id, "commit shed by meta; leaving blob to datanode GC");
        }
        (MetaError::Refused { code, .. }, Some(p)) => {
            tracing::debug!(blob_id = %p.blob_id, ?code, "commit refused; deleting the blob");
            gw.reclaimer.discard(vec![p]).await;
        }
        (MetaError::Unavailable(_) | MetaError::Denied(_), Some(p)) => {
            tracing::warn!(blob_id = %p.blob_id, "commit outcome unknown; leaving blob to datanode GC");
        }
        (_, None) => {}
    }
}

/// The single-part record of a body stored by PutObject or CopyObject.
pub fn single_part_record(
    bucket: String,
    key: String,
    stored: StoredBody,
    http: pb::HttpMeta,
    tags: Vec<pb::Tag>,
    last_modified_ms: i64,
) -> pb::ObjectRecord {
    let StoredBody {
        placement,
        digests,
        inline,
    } = stored;
    pb::ObjectRecord {
        bucket,
        key,
        size: digests.size,
        etag: checksum::etag_hex(&digests.md5),
        last_modified_ms,
        http: Some(http),
        checksums: Some(digests.checksums.clone()),
        parts: vec![pb::PartRecord {
            upload_id: String::new(),
            part_number: 1,
            size: digests.size,
            md5: digests.md5.to_vec(),
            last_modified_ms,
            placement,
            checksums: Some(digests.checksums),
        }],
        multipart: false,
        upload_id: String::new(),
        tags,
        // Meta sets the version fields when it commits the record.
        version_id: String::new(),
        delete_marker: false,
        seq: 0,
        acl: pb::CannedAcl::AclPrivate.into(),
        inline_data: inline.map(|b| b.to_vec()).unwrap_or_default(),
        // Meta's storage fields: it splits the record when it stores it.
        part_count: 0,
        manifest_crc64: 0,
    }
}

/// Best-effort S3 conditional write (`If-None-Match: *`, `If-Match`) of
/// PutObject and CompleteMultipartUpload, checked before the body is read
/// (or the parts are joined), so a write bound to fail does not store its
/// body first. Meta checks the same conditions again atomically with the
/// commit ([`write_condition`]): two writers racing past this check cannot
/// both commit.
///
/// Errors: `If-None-Match` matching the current object -> 412
/// `PreconditionFailed`; `If-Match` with no object -> 404 `NoSuchKey`, not
/// matching -> 412 (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html>).
pub(super) async fn check_write_conditions(
    gw: &Gateway,
    bucket: &str,
    key: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if if_match.is_none() && if_none_match.is_none() {
        return Ok(());
    }
    let current = match gw.meta.get_object(bucket, key).await {
        Ok(o) => Some(o),
        Err(MetaError::Refused {
            code: pb::ErrorCode::NoSuchKey,
            ..
        }) => None,
        Err(e) => return Err(meta_error(e)),
    };
    if let Some(cond) = if_none_match
        && let Some(obj) = &current
        && matches_etag(cond, &obj.etag)
    {
        return Err(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        ));
    }
    if let Some(cond) = if_match {
        match &current {
            None => {
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    "The specified key does not exist.",
                ));
            }
            Some(obj) if !matches_etag(cond, &obj.etag) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::PreconditionFailed,
                    "At least one of the pre-conditions you specified did not hold",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The `If-Match`/`If-None-Match` of a write as meta checks it at commit
/// (`None` when neither is given). The values are compared with the
/// stored ETag (unquoted hex), as [`matches_etag`] does.
pub fn write_condition(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> Option<pb::WriteCondition> {
    if if_match.is_none() && if_none_match.is_none() {
        return None;
    }
    let mut c = pb::WriteCondition::default();
    match if_match {
        Some(ETagCondition::Any) => c.if_match_any = true,
        Some(ETagCondition::ETag(e)) => c.if_match_etag = e.value().to_string(),
        None => {}
    }
    match if_none_match {
        Some(ETagCondition::Any) => c.if_none_match_any = true,
        Some(ETagCondition::ETag(e)) => c.if_none_match_etag = e.value().to_string(),
        None => {}
    }
    Some(c)
}

/// Whether an `If-Match`/`If-None-Match` value matches an existing object's ETag.
pub fn matches_etag(cond: &ETagCondition, object_etag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == object_etag,
    }
}

/// Checksum fields of an output, from the stored checksums.
pub struct ChecksumFields {
    pub crc32: Option<String>,
    pub crc32c: Option<String>,
    pub crc64nvme: Option<String>,
    pub sha1: Option<String>,
    pub sha256: Option<String>,
    pub checksum_type: Option<ChecksumType>,
}

impl ChecksumFields {
    /// Splits stored checksums into output fields; the type is `COMPOSITE`
    /// for a `-N` multipart value, else `FULL_OBJECT`.
    pub fn from(checksums: Option<&pb::Checksums>) -> Self {
        let c = checksums.cloned().unwrap_or_default();
        let any = checksum::present(&c).next();
        let checksum_type = any.and_then(|a| checksum::get(&c, a)).map(|v| {
            if v.contains('-') {
                ChecksumType::from_static(ChecksumType::COMPOSITE)
            } else {
                ChecksumType::from_static(ChecksumType::FULL_OBJECT)
            }
        });
        ChecksumFields {
            crc32: c.crc32,
            crc32c: c.crc32c,
            crc64nvme: c.crc64nvme,
            sha1: c.sha1,
            sha256: c.sha256,
            checksum_type,
        }
    }
}

pub(super) async fn put_object(
    gw: &Gateway,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let S3Request {
        mut input,
        headers,
        trailing_headers,
        ..
    } = req;
    // Fail before reading the body: no bucket, bad claims, failed conditions.
    gw.meta
        .get_bucket(&input.bucket)
        .await
        .map_err(meta_error)?;
    let expected = Expected::from_headers(&headers, trailing_headers)?;
    let tags = tagging::from_optional_header(input.tagging.as_deref())?;
    let acl = super::acl::object_acl(input.acl.as_ref(), &super::acl::grant_headers!(input))?;
    check_write_conditions(
        gw,
        &input.bucket,
        &input.key,
        input.if_match.as_ref(),
        input.if_none_match.as_ref(),
    )
    .await?;
    let condition = write_condition(input.if_match.as_ref(), input.if_none_match.as_ref());

    let http = http_meta(
        input.content_type.take(),
        input.content_encoding.take(),
        input.cache_control.take(),
        input.content_disposition.take(),
        input.content_language.take(),
        input.expires.as_ref(),
        input.metadata.take(),
    );
    let len = input.content_length.and_then(|l| u64::try_from(l).ok());
    let placement_key = object_placement_key(&input.bucket, &input.key);
    // From before the first shard until the commit returns.
    let epoch = gw.blobs.epochs().begin_write();
    let stored = store_object_body(
        gw,
        &epoch,
        &placement_key,
        request_body(input.body.take()),
        expected,
        len,
    )
    .await?;
    let new_blob = stored.placement.clone();
    let record = pb::ObjectRecord {
        acl: acl.into(),
        ..single_part_record(input.bucket, input.key, stored, http, tags, wall_clock_ms())
    };
    let etag_value = record.etag.clone();
    let size = i64::try_from(record.size).unwrap_or(i64::MAX);
    let sums = ChecksumFields::from(record.checksums.as_ref());
    tracing::debug!(bucket = %record.bucket, key = %record.key, size, etag = %etag_value, "put object");
    let version_id = commit_object(gw, record, new_blob, condition).await?;
    drop(epoch);

    Ok(S3Response::new(PutObjectOutput {
        version_id,
        e_tag: Some(etag(&etag_value)),
        size: Some(size),
        checksum_crc32: sums.crc32,
        checksum_crc32c: sums.crc32c,
        checksum_crc64nvme: sums.crc64nvme,
        checksum_sha1: sums.sha1,
        checksum_sha256: sums.sha256,
        checksum_type: sums.checksum_type,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_conditions() {
        assert!(matches_etag(&ETagCondition::Any, "abc"));
        assert!(matches_etag(
            &ETagCondition::ETag(ETag::Strong("abc".into())),
            "abc"
        ));
        assert!(matches_etag(
            &ETagCondition::ETag(ETag::Weak("abc".into())),
            "abc"
        ));
        assert!(!matches_etag(
            &ETagCondition::ETag(ETag::Strong("abd".into())),
            "abc"
        ));
    }

    #[test]
    fn checksum_fields_name_the_type() {
        let full = pb::Checksums {
            crc32: Some("y/Q5Jg==".into()),
            ..Default::default()
        };
        let f = ChecksumFields::from(Some(&full));
        assert_eq!(f.crc32.as_deref(), Some("y/Q5Jg=="));
        assert_eq!(
            f.checksum_type.as_ref().map(|t| t.as_str()),
            Some("FULL_OBJECT")
        );
        let composite = pb::Checksums {
            sha256: Some("abc=-3".into()),
            ..Default::default()
        };
        let f = ChecksumFields::from(Some(&composite));
        assert_eq!(
            f.checksum_type.as_ref().map(|t| t.as_str()),
            Some("COMPOSITE")
        );
        assert!(ChecksumFields::from(None).checksum_type.is_none());
    }

    #[test]
    fn single_part_record_holds_one_part() {
        let stored = StoredBody {
            placement: None,
            digests: BodyDigests {
                size: 0,
                md5: [
                    0xd4, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04, 0xe9, 0x80, 0x09, 0x98, 0xec,
                    0xf8, 0x42, 0x7e,
                ],
                checksums: pb::Checksums::default(),
            },
            inline: None,
        };
        let r = single_part_record(
            "b".into(),
            "k".into(),
            stored,
            pb::HttpMeta::default(),
            vec![],
            5,
        );
        assert_eq!(r.etag, "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(r.parts.len(), 1);
        assert_eq!(r.parts[0].part_number, 1);
        assert!(!r.multipart);
    }
}
