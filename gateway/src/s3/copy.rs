//! CopyObject and UploadPartCopy: the source is streamed through the data
//! path's read into a new blob (never buffered), verified on the way
//! against the source's stored full-object checksums.
//!
//! * `x-amz-metadata-directive`: `COPY` (default) keeps the source's HTTP
//!   metadata, `REPLACE` takes the request's. Copying an object onto itself
//!   without `REPLACE` is `InvalidRequest`, as in S3.
//! * `x-amz-copy-source-if-*` conditions answer 412 when they fail.
//! * `x-amz-copy-source-range: bytes=first-last` (UploadPartCopy) selects
//!   an inclusive byte range of the source.

use sluice_util::clock::wall_clock_ms;
use std::io;

use futures::TryStreamExt;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;

use super::checksum::{self, ChecksumAlgorithm, Expected};
use super::error::{invalid_argument, invalid_request, meta_error, version_header};
use super::get::{Conditions, Precondition, object_stream};
use super::multipart::{commit_part, part_number};
use super::put::{
    ChecksumFields, commit_object, single_part_record, store_body, store_object_body,
};
use super::tagging;
use super::{Gateway, etag, http_meta, object_placement_key, part_placement_key, timestamp};
use crate::access::HideMissingSource;

/// Largest source S3 copies in one request (5 GiB).
pub const MAX_COPY_SIZE: u64 = 5 * 1024 * 1024 * 1024;

/// Bucket, key and version id (`?versionId=`) of a copy source. Errors:
/// `NotImplemented` for access-point and outpost sources.
pub fn source_of(source: &CopySource) -> S3Result<(String, String, Option<String>)> {
    match source {
        CopySource::Bucket {
            bucket,
            key,
            version_id,
        } => Ok((
            bucket.to_string(),
            key.to_string(),
            version_id.as_deref().map(str::to_string),
        )),
        _ => Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "Only bucket/key copy sources are supported.",
        )),
    }
}

/// Parses `x-amz-copy-source-range` (`bytes=first-last`, inclusive) against a
/// source of `size` bytes into an end-exclusive range. Errors:
/// `InvalidArgument` for a malformed value, `InvalidRange` (416) for one past the source.
pub fn copy_source_range(value: &str, size: u64) -> S3Result<std::ops::Range<u64>> {
    let malformed = || {
        invalid_argument(
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy",
        )
    };
    let (first, last) = value
        .trim()
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(malformed)?;
    let first: u64 = first.parse().map_err(|_| malformed())?;
    let last: u64 = last.parse().map_err(|_| malformed())?;
    if first > last {
        return Err(malformed());
    }
    if last >= size {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRange,
            "The requested range is not satisfiable",
        ));
    }
    Ok(first..last + 1)
}

/// Whether `x-amz-metadata-directive` asks for `REPLACE`. Errors: `InvalidArgument` for another value.
pub fn replaces_metadata(directive: Option<&MetadataDirective>) -> S3Result<bool> {
    match directive.map(MetadataDirective::as_str) {
        None => Ok(false),
        Some(d) if d.eq_ignore_ascii_case(MetadataDirective::COPY) => Ok(false),
        Some(d) if d.eq_ignore_ascii_case(MetadataDirective::REPLACE) => Ok(true),
        Some(_) => Err(invalid_argument("Unknown metadata directive.")),
    }
}

/// Whether `x-amz-tagging-directive` replaces the source's tags
/// (`REPLACE`) or copies them (`COPY`, the default).
pub fn replaces_tags(directive: Option<&TaggingDirective>) -> S3Result<bool> {
    match directive.map(TaggingDirective::as_str) {
        None => Ok(false),
        Some(d) if d.eq_ignore_ascii_case(TaggingDirective::COPY) => Ok(false),
        Some(d) if d.eq_ignore_ascii_case(TaggingDirective::REPLACE) => Ok(true),
        Some(_) => Err(invalid_argument("Unknown tagging directive.")),
    }
}

/// Checks `x-amz-copy-source-if-*`; any failure is 412.
fn check_source_conditions(conditions: &Conditions<'_>, src: &pb::ObjectRecord) -> S3Result<()> {
    match conditions.evaluate(&src.etag, src.last_modified_ms) {
        Precondition::Pass => Ok(()),
        Precondition::Failed | Precondition::NotModified => Err(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )),
    }
}

/// The copy's expected digests: the source's full-object checksums (a
/// composite `-N` value cannot be recomputed from the bytes) are recomputed
/// and must match, plus any algorithm the request asks for.
fn expected_from_source(
    src: &pb::ObjectRecord,
    range_is_whole: bool,
    extra: Option<ChecksumAlgorithm>,
) -> Expected {
    let mut expected = Expected::default();
    if range_is_whole && let Some(sums) = &src.checksums {
        for algorithm in checksum::present(sums) {
            if let Some(v) = checksum::get(sums, algorithm).filter(|v| !v.contains('-')) {
                expected.values.push((algorithm, v.to_string()));
            }
        }
    }
    if let Some(a) = extra {
        expected.also_compute(a);
    }
    expected
}

fn source_too_large() -> S3Error {
    invalid_request(format!(
        "The specified copy source is larger than the maximum allowable size for a copy source: {MAX_COPY_SIZE}"
    ))
}

/// The copy source's record (the version `version` names, else the
/// current one); a missing one is `403 AccessDenied` when the access check
/// asked to hide it ([`HideMissingSource`]). A delete marker named as the
/// source is `400 InvalidRequest`, as S3 answers.
async fn source_object(
    gw: &Gateway,
    bucket: &str,
    key: &str,
    version: Option<&str>,
    hide_missing: bool,
) -> S3Result<pb::ObjectRecord> {
    let found = gw
        .meta
        .get_version(bucket, key, version.unwrap_or(""), false)
        .await
        .map_err(meta_error);
    match found {
        Err(e) if e.code() == &S3ErrorCode::MethodNotAllowed => Err(invalid_request(
            "The source of a copy request may not specifically refer to a delete marker by version id.",
        )),
        Err(e) if hide_missing && e.code() == &S3ErrorCode::NoSuchKey => Err(
            S3Error::with_message(S3ErrorCode::AccessDenied, "Access Denied"),
        ),
        other => other,
    }
}

pub(super) async fn copy_object(
    gw: &Gateway,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let hide_missing = req.extensions.get::<HideMissingSource>().is_some();
    let mut input = req.input;
    let (src_bucket, src_key, src_version) = source_of(&input.copy_source)?;
    let replace = replaces_metadata(input.metadata_directive.as_ref())?;
    let replace_tags = replaces_tags(input.tagging_directive.as_ref())?;
    let new_tags = tagging::from_optional_header(input.tagging.as_deref())?;
    // The copy gets the ACL the request names (private by default), as
    // S3 does: the source's ACL is not copied.
    let acl = super::acl::object_acl(input.acl.as_ref(), &super::acl::grant_headers!(input))?;
    // A storage class names a change S3 accepts (tiering tools such as
    // `rclone settier` copy an object onto itself to change it); Sluice has
    // one class, so the copy rewrites the object as STANDARD.
    if src_bucket == input.bucket
        && src_key == input.key
        && src_version.is_none()
        && !replace
        && input.storage_class.is_none()
    {
        return Err(invalid_request(
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    let extra = match input.checksum_algorithm.as_ref() {
        None => None,
        Some(a) => Some(
            ChecksumAlgorithm::parse(a.as_str())
                .ok_or_else(|| invalid_request("Checksum algorithm is invalid"))?,
        ),
    };
    let src = source_object(
        gw,
        &src_bucket,
        &src_key,
        src_version.as_deref(),
        hide_missing,
    )
    .await?;
    let conditions = Conditions {
        if_match: input.copy_source_if_match.as_ref(),
        if_none_match: input.copy_source_if_none_match.as_ref(),
        if_modified_since: input.copy_source_if_modified_since.as_ref(),
        if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
    };
    check_source_conditions(&conditions, &src)?;
    if src.size > MAX_COPY_SIZE {
        return Err(source_too_large());
    }
    gw.meta
        .get_bucket(&input.bucket)
        .await
        .map_err(meta_error)?;

    let http = if replace {
        http_meta(
            input.content_type.take(),
            input.content_encoding.take(),
            input.cache_control.take(),
            input.content_disposition.take(),
            input.content_language.take(),
            input.expires.as_ref(),
            input.metadata.take(),
        )
    } else {
        src.http.clone().unwrap_or_default()
    };
    let tags = if replace_tags {
        new_tags
    } else {
        src.tags.clone()
    };
    let expected = expected_from_source(&src, true, extra);
    let body = object_stream(&gw.blobs, &src, 0..src.size)?.map_err(io::Error::other);
    let placement_key = object_placement_key(&input.bucket, &input.key);
    // From before the first shard until the commit returns.
    let epoch = gw.blobs.epochs().begin_write();
    let stored =
        store_object_body(gw, &epoch, &placement_key, body, expected, Some(src.size)).await?;
    let new_blob = stored.placement.clone();
    let record = pb::ObjectRecord {
        acl: acl.into(),
        ..single_part_record(input.bucket, input.key, stored, http, tags, wall_clock_ms())
    };
    let (etag_value, last_modified_ms) = (record.etag.clone(), record.last_modified_ms);
    let sums = ChecksumFields::from(record.checksums.as_ref());
    tracing::debug!(from = %format!("{src_bucket}/{src_key}"), bucket = %record.bucket, key = %record.key, size = record.size, "copy object");
    let version_id = commit_object(gw, record, new_blob, None).await?;
    drop(epoch);
    Ok(S3Response::new(CopyObjectOutput {
        version_id,
        copy_source_version_id: version_header(&src),
        copy_object_result: Some(CopyObjectResult {
            e_tag: Some(etag(&etag_value)),
            last_modified: Some(timestamp(last_modified_ms)),
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            checksum_type: sums.checksum_type,
        }),
        ..Default::default()
    }))
}

pub(super) async fn upload_part_copy(
    gw: &Gateway,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let hide_missing = req.extensions.get::<HideMissingSource>().is_some();
    let input = req.input;
    let number = part_number(input.part_number)?;
    let upload = gw
        .meta
        .get_upload(&input.bucket, &input.key, &input.upload_id)
        .await
        .map_err(meta_error)?;
    let (src_bucket, src_key, src_version) = source_of(&input.copy_source)?;
    let src = source_object(
        gw,
        &src_bucket,
        &src_key,
        src_version.as_deref(),
        hide_missing,
    )
    .await?;
    let conditions = Conditions {
        if_match: input.copy_source_if_match.as_ref(),
        if_none_match: input.copy_source_if_none_match.as_ref(),
        if_modified_since: input.copy_source_if_modified_since.as_ref(),
        if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
    };
    check_source_conditions(&conditions, &src)?;
    let range = match input.copy_source_range.as_deref() {
        Some(r) => copy_source_range(r, src.size)?,
        None => 0..src.size,
    };
    if range.end - range.start > MAX_COPY_SIZE {
        return Err(source_too_large());
    }
    let whole = range == (0..src.size);
    let algorithm = upload
        .checksum_algorithm
        .as_deref()
        .and_then(ChecksumAlgorithm::parse);
    let expected = expected_from_source(&src, whole, algorithm);
    let len = range.end - range.start;
    let body = object_stream(&gw.blobs, &src, range)?.map_err(io::Error::other);
    let placement_key = part_placement_key(&input.bucket, &input.key, &input.upload_id, number);
    // From before the first shard until the commit returns.
    let epoch = gw.blobs.epochs().begin_write();
    let stored = store_body(gw, &epoch, &placement_key, body, expected, Some(len)).await?;
    let part = commit_part(
        gw,
        &input.bucket,
        &input.key,
        &input.upload_id,
        number,
        stored,
    )
    .await?;
    drop(epoch);
    tracing::debug!(from = %format!("{src_bucket}/{src_key}"), upload_id = %input.upload_id, number, size = part.size, "upload part copy");
    let sums = ChecksumFields::from(part.checksums.as_ref());
    Ok(S3Response::new(UploadPartCopyOutput {
        copy_source_version_id: version_header(&src),
        copy_part_result: Some(CopyPartResult {
            e_tag: Some(etag(&checksum::etag_hex(&part.md5))),
            last_modified: Some(timestamp(part.last_modified_ms)),
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
        }),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_source_ranges() {
        assert_eq!(copy_source_range("bytes=0-9", 100).unwrap(), 0..10);
        assert_eq!(copy_source_range("bytes=99-99", 100).unwrap(), 99..100);
        assert_eq!(
            copy_source_range("bytes=10-100", 100).unwrap_err().code(),
            &S3ErrorCode::InvalidRange
        );
        for bad in ["bytes=5-1", "bytes=-5", "bytes=5-", "0-9", "bytes=a-b"] {
            assert_eq!(
                copy_source_range(bad, 100).unwrap_err().code(),
                &S3ErrorCode::InvalidArgument,
                "{bad}"
            );
        }
    }

    #[test]
    fn metadata_directives() {
        assert!(!replaces_metadata(None).unwrap());
        assert!(
            !replaces_metadata(Some(&MetadataDirective::from_static(
                MetadataDirective::COPY
            )))
            .unwrap()
        );
        assert!(
            replaces_metadata(Some(&MetadataDirective::from_static(
                MetadataDirective::REPLACE
            )))
            .unwrap()
        );
        assert!(replaces_metadata(Some(&MetadataDirective::from("MOVE".to_string()))).is_err());
    }

    #[test]
    fn copy_sources() {
        let src = CopySource::Bucket {
            bucket: "b".into(),
            key: "k/x".into(),
            version_id: None,
        };
        assert_eq!(
            source_of(&src).unwrap(),
            ("b".to_string(), "k/x".to_string(), None)
        );
        let versioned = CopySource::Bucket {
            bucket: "b".into(),
            key: "k".into(),
            version_id: Some("000000000000002a".into()),
        };
        assert_eq!(
            source_of(&versioned).unwrap(),
            (
                "b".to_string(),
                "k".to_string(),
                Some("000000000000002a".to_string())
            )
        );
    }

    #[test]
    fn copies_verify_full_object_checksums_only() {
        let src = pb::ObjectRecord {
            checksums: Some(pb::Checksums {
                crc32: Some("y/Q5Jg==".into()),
                sha256: Some("abc=-2".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = expected_from_source(&src, true, Some(ChecksumAlgorithm::Crc32c));
        assert_eq!(
            e.values,
            vec![(ChecksumAlgorithm::Crc32, "y/Q5Jg==".to_string())]
        );
        assert_eq!(e.compute, vec![ChecksumAlgorithm::Crc32c]);
        assert!(expected_from_source(&src, false, None).values.is_empty());
    }
}
