//! Multipart uploads: CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
//! AbortMultipartUpload, ListParts (UploadPartCopy lives in `copy.rs`).
//!
//! S3's rules (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html>):
//! part numbers 1..=10000; every part but the last at least 5 MiB
//! (`EntityTooSmall`); unknown part or ETag mismatch `InvalidPart`; unsorted
//! list `InvalidPartOrder`; re-uploading a part number replaces it. The
//! list checks and the ETag (`hex(md5(part md5s))-N`) are the meta state
//! machine's; the gateway checks part numbers, looks the upload up before
//! reading a part body, and computes multipart checksums.

use sluice_util::clock::wall_clock_ms;
use std::collections::HashMap;

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_meta_client::MetaError;
use sluice_proto::meta as pb;

use super::checksum::{self, ChecksumAlgorithm, Expected};
use super::error::{internal, invalid_argument, invalid_request, meta_error};
use super::list::page_size;
use super::put::{
    ChecksumFields, StoredBody, check_write_conditions, discard_uncommitted, request_body,
    store_body,
};
use super::{Gateway, etag, http_meta, owner, part_placement_key, tagging, timestamp};

/// Smallest size of every part but the last.
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;

/// Highest part number S3 allows.
pub const MAX_PART_NUMBER: i32 = 10_000;

/// A new upload id that encodes its creation time (for the stale-upload
/// sweeper): 16 hex digits of `initiated_ms`, then 16 random hex digits.
pub fn new_upload_id(initiated_ms: i64) -> String {
    format!(
        "{:016x}{:016x}",
        initiated_ms.max(0) as u64,
        rand::random::<u64>()
    )
}

/// The creation time, in ms since the epoch, encoded in an upload id made by [`new_upload_id`].
pub fn upload_initiated_ms(upload_id: &str) -> Option<i64> {
    let head = upload_id.get(..16)?;
    if upload_id.len() != 32 || !upload_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(head, 16)
        .ok()
        .and_then(|v| i64::try_from(v).ok())
}

/// A part number from a request. Errors: `InvalidArgument` outside 1..=10000.
pub fn part_number(n: i32) -> S3Result<u32> {
    if (1..=MAX_PART_NUMBER).contains(&n) {
        Ok(n as u32)
    } else {
        Err(invalid_argument(
            "Part number must be an integer between 1 and 10000, inclusive",
        ))
    }
}

/// The checksum algorithm an upload was created with, if any.
fn upload_algorithm(upload: &pb::UploadRecord) -> Option<ChecksumAlgorithm> {
    upload
        .checksum_algorithm
        .as_deref()
        .and_then(ChecksumAlgorithm::parse)
}

/// Commits a stored part body in meta (meta releases the part it
/// replaced). The caller holds the epoch guard the part's blob was written
/// under until this returns.
pub async fn commit_part(
    gw: &Gateway,
    bucket: &str,
    key: &str,
    upload_id: &str,
    number: u32,
    stored: StoredBody,
) -> S3Result<pb::PartRecord> {
    // Parts are stored with `store_body`, never inline.
    let StoredBody {
        placement, digests, ..
    } = stored;
    let part = pb::PartRecord {
        upload_id: upload_id.to_string(),
        part_number: number,
        size: digests.size,
        md5: digests.md5.to_vec(),
        last_modified_ms: wall_clock_ms(),
        placement,
        checksums: Some(digests.checksums),
    };
    match gw.meta.put_part(bucket, key, part.clone()).await {
        Ok(released) => {
            gw.reclaimer.release(&released);
            Ok(part)
        }
        Err(err) => {
            discard_uncommitted(gw, &err, part.placement.clone()).await;
            Err(meta_error(err))
        }
    }
}

pub(super) async fn create_multipart_upload(
    gw: &Gateway,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let mut input = req.input;
    let algorithm = match input.checksum_algorithm.as_ref() {
        None => None,
        Some(a) => Some(
            ChecksumAlgorithm::parse(a.as_str())
                .ok_or_else(|| invalid_request("Checksum algorithm is invalid"))?,
        ),
    };
    let checksum_type = resolve_checksum_type(algorithm, input.checksum_type.as_ref())?;
    let tags = tagging::from_optional_header(input.tagging.as_deref())?;
    let acl = super::acl::object_acl(input.acl.as_ref(), &super::acl::grant_headers!(input))?;
    gw.meta
        .get_bucket(&input.bucket)
        .await
        .map_err(meta_error)?;
    let now = wall_clock_ms();
    let upload_id = new_upload_id(now);
    let http = http_meta(
        input.content_type.take(),
        input.content_encoding.take(),
        input.cache_control.take(),
        input.content_disposition.take(),
        input.content_language.take(),
        input.expires.as_ref(),
        input.metadata.take(),
    );
    let upload = pb::UploadRecord {
        bucket: input.bucket.clone(),
        key: input.key.clone(),
        upload_id: upload_id.clone(),
        initiated_ms: now,
        http: Some(http),
        checksum_algorithm: algorithm.map(|a| a.name().to_string()),
        checksum_type: checksum_type.as_ref().map(|t| t.as_str().to_string()),
        tags,
        acl: acl.into(),
    };
    gw.meta.create_upload(upload).await.map_err(meta_error)?;
    tracing::debug!(bucket = %input.bucket, key = %input.key, %upload_id, "create multipart upload");
    Ok(S3Response::new(CreateMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(upload_id),
        checksum_algorithm: algorithm
            .map(|a| s3s::dto::ChecksumAlgorithm::from(a.name().to_string())),
        checksum_type,
        ..Default::default()
    }))
}

/// The checksum type of a multipart upload: the one asked for, else
/// `FULL_OBJECT` for CRC64NVME and `COMPOSITE` for the others. Errors:
/// `InvalidRequest` for a type the algorithm cannot have (full-object SHA,
/// composite CRC64NVME) or a type without an algorithm.
fn resolve_checksum_type(
    algorithm: Option<ChecksumAlgorithm>,
    asked: Option<&ChecksumType>,
) -> S3Result<Option<ChecksumType>> {
    let Some(algorithm) = algorithm else {
        return match asked {
            None => Ok(None),
            Some(_) => Err(invalid_request(
                "The x-amz-checksum-type header requires x-amz-checksum-algorithm",
            )),
        };
    };
    let full = match asked.map(ChecksumType::as_str) {
        None => algorithm.full_object_by_default(),
        Some(t) if t.eq_ignore_ascii_case(ChecksumType::FULL_OBJECT) => true,
        Some(t) if t.eq_ignore_ascii_case(ChecksumType::COMPOSITE) => false,
        Some(_) => return Err(invalid_request("Checksum type is invalid")),
    };
    let allowed = if full {
        matches!(
            algorithm,
            ChecksumAlgorithm::Crc32 | ChecksumAlgorithm::Crc32c | ChecksumAlgorithm::Crc64Nvme
        )
    } else {
        algorithm != ChecksumAlgorithm::Crc64Nvme
    };
    if !allowed {
        return Err(invalid_request(format!(
            "The {} checksum type is not supported for {}",
            if full { "FULL_OBJECT" } else { "COMPOSITE" },
            algorithm.name()
        )));
    }
    Ok(Some(ChecksumType::from_static(if full {
        ChecksumType::FULL_OBJECT
    } else {
        ChecksumType::COMPOSITE
    })))
}

pub(super) async fn upload_part(
    gw: &Gateway,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    let S3Request {
        mut input,
        headers,
        trailing_headers,
        ..
    } = req;
    let number = part_number(input.part_number)?;
    // NoSuchUpload before a byte of the body is read.
    let upload = gw
        .meta
        .get_upload(&input.bucket, &input.key, &input.upload_id)
        .await
        .map_err(meta_error)?;
    let mut expected = Expected::from_headers(&headers, trailing_headers)?;
    if let Some(a) = upload_algorithm(&upload) {
        expected.also_compute(a);
    }
    let placement_key = part_placement_key(&input.bucket, &input.key, &input.upload_id, number);
    let len = input.content_length.and_then(|l| u64::try_from(l).ok());
    // From before the first shard until the commit returns.
    let epoch = gw.blobs.epochs().begin_write();
    let stored = store_body(
        gw,
        &epoch,
        &placement_key,
        request_body(input.body.take()),
        expected,
        len,
    )
    .await?;
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
    tracing::debug!(bucket = %input.bucket, key = %input.key, upload_id = %input.upload_id, number, size = part.size, "upload part");
    let sums = ChecksumFields::from(part.checksums.as_ref());
    Ok(S3Response::new(UploadPartOutput {
        e_tag: Some(etag(&checksum::etag_hex(&part.md5))),
        checksum_crc32: sums.crc32,
        checksum_crc32c: sums.crc32c,
        checksum_crc64nvme: sums.crc64nvme,
        checksum_sha1: sums.sha1,
        checksum_sha256: sums.sha256,
        ..Default::default()
    }))
}

/// The completed-part list of a CompleteMultipartUpload body. Errors:
/// `MalformedXML` for an empty list, `InvalidPart` for a part without a
/// number (or out of range) or an ETag.
pub fn completed_parts(parts: &[CompletedPart]) -> S3Result<Vec<pb::CompletedPart>> {
    if parts.is_empty() {
        return Err(S3Error::with_message(
            S3ErrorCode::MalformedXML,
            "The XML you provided was not well-formed or did not validate against our published schema",
        ));
    }
    parts
        .iter()
        .map(|p| {
            let number = p
                .part_number
                .filter(|n| (1..=MAX_PART_NUMBER).contains(n))
                .ok_or_else(|| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidPart,
                        "A part number is missing or invalid.",
                    )
                })?;
            let etag = p
                .e_tag
                .as_ref()
                .map(|e| e.value().trim_matches('"').to_ascii_lowercase())
                .ok_or_else(|| {
                    S3Error::with_message(S3ErrorCode::InvalidPart, "A part ETag is missing.")
                })?;
            Ok(pb::CompletedPart {
                part_number: number as u32,
                etag,
            })
        })
        .collect()
}

/// What a stored part contributes to a multipart checksum.
struct PartSum {
    etag: String,
    size: u64,
    value: Option<String>,
}

/// Every part of an upload, by number (at most 10000, read a page at a time).
async fn stored_part_sums(
    gw: &Gateway,
    upload: &pb::UploadRecord,
    algorithm: ChecksumAlgorithm,
) -> S3Result<HashMap<u32, PartSum>> {
    let mut sums = HashMap::new();
    let mut marker = 0u32;
    loop {
        let page = gw
            .meta
            .list_parts(pb::ListPartsRequest {
                bucket: upload.bucket.clone(),
                key: upload.key.clone(),
                upload_id: upload.upload_id.clone(),
                part_number_marker: marker,
                max_parts: 1000,
            })
            .await
            .map_err(meta_error)?;
        for p in &page.parts {
            let value = p
                .checksums
                .as_ref()
                .and_then(|c| checksum::get(c, algorithm))
                .map(str::to_string);
            sums.insert(
                p.part_number,
                PartSum {
                    etag: checksum::etag_hex(&p.md5),
                    size: p.size,
                    value,
                },
            );
        }
        if !page.is_truncated
            || page.next_part_number_marker <= marker
            || sums.len() > MAX_PART_NUMBER as usize
        {
            return Ok(sums);
        }
        marker = page.next_part_number_marker;
    }
}

/// The object checksum of a multipart upload created with a checksum
/// algorithm: composite (`<b64>-N`) or full-object (combined CRC), as the
/// type fixed at CreateMultipartUpload says, over the listed parts; checked
/// against the whole-object value the client sends with Complete, if any.
/// `None` when the upload has no algorithm or a listed part is unknown or
/// lacks a value (meta then judges the list).
///
/// Errors (per S3's "Checking object integrity"): `InvalidPart` when the
/// client lists a part checksum that differs from the stored one;
/// `InvalidRequest` for a checksum type other than the upload's, a
/// whole-object value of another algorithm than the upload's (or of an
/// upload created without one), or a malformed value; `BadDigest` for a
/// well-formed value that is not the object's.
async fn multipart_checksum(
    gw: &Gateway,
    upload: &pb::UploadRecord,
    listed: &[CompletedPart],
    numbers: &[pb::CompletedPart],
    input: &CompleteMultipartUploadInput,
) -> S3Result<Option<pb::Checksums>> {
    let claimed = claimed_object_checksum(input)?;
    let Some(algorithm) = upload_algorithm(upload) else {
        if let Some((other, _)) = claimed {
            return Err(invalid_request(format!(
                "The upload was created without a checksum algorithm; the complete request carries a {} checksum",
                other.name()
            )));
        }
        return Ok(None);
    };
    if let Some((other, _)) = claimed
        && other != algorithm
    {
        return Err(invalid_request(format!(
            "The upload was created using the {} checksum algorithm; the complete request carries a {} checksum",
            algorithm.name(),
            other.name()
        )));
    }
    let full = match upload.checksum_type.as_deref() {
        Some(fixed) => {
            if let Some(asked) = input.checksum_type.as_ref()
                && !asked.as_str().eq_ignore_ascii_case(fixed)
            {
                return Err(invalid_request(format!(
                    "The upload was created using the {fixed} checksum mode. The complete request must use the same checksum mode."
                )));
            }
            fixed == ChecksumType::FULL_OBJECT
        }
        // Uploads created before the type was recorded.
        None => resolve_checksum_type(Some(algorithm), input.checksum_type.as_ref())?
            .is_some_and(|t| t.as_str() == ChecksumType::FULL_OBJECT),
    };
    let stored = stored_part_sums(gw, upload, algorithm).await?;
    let mut values: Vec<(&str, u64)> = Vec::with_capacity(numbers.len());
    for (client, wanted) in listed.iter().zip(numbers) {
        let Some(PartSum {
            etag,
            size,
            value: Some(value),
        }) = stored.get(&wanted.part_number)
        else {
            return Ok(None);
        };
        if *etag != wanted.etag {
            return Ok(None);
        }
        let claimed = match algorithm {
            ChecksumAlgorithm::Crc32 => client.checksum_crc32.as_deref(),
            ChecksumAlgorithm::Crc32c => client.checksum_crc32c.as_deref(),
            ChecksumAlgorithm::Crc64Nvme => client.checksum_crc64nvme.as_deref(),
            ChecksumAlgorithm::Sha1 => client.checksum_sha1.as_deref(),
            ChecksumAlgorithm::Sha256 => client.checksum_sha256.as_deref(),
        };
        if claimed.is_some_and(|c| c != value) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidPart,
                format!(
                    "The {} of part {} does not match the uploaded part.",
                    algorithm.name(),
                    wanted.part_number
                ),
            ));
        }
        values.push((value.as_str(), *size));
    }
    let value = if full {
        checksum::full_object_crc(algorithm, values)
    } else {
        checksum::composite_checksum(algorithm, values.into_iter().map(|(v, _)| v))
    };
    if let (Some((_, claimed)), Some(value)) = (claimed, value.as_deref())
        && !object_checksum_matches(claimed, value)
    {
        return Err(S3Error::with_message(
            S3ErrorCode::BadDigest,
            format!(
                "The {} you specified did not match the calculated checksum.",
                algorithm.name()
            ),
        ));
    }
    Ok(value.map(|v| {
        let mut sums = pb::Checksums::default();
        checksum::set(&mut sums, algorithm, v);
        sums
    }))
}

/// The whole-object checksum a Complete request carries
/// (`x-amz-checksum-<algorithm>`), if any: base64 of the digest, for a
/// composite checksum optionally followed by `-<part count>`. Errors:
/// `InvalidRequest` for more than one, or a malformed value.
fn claimed_object_checksum(
    input: &CompleteMultipartUploadInput,
) -> S3Result<Option<(ChecksumAlgorithm, &str)>> {
    let sent: Vec<(ChecksumAlgorithm, &str)> = [
        (ChecksumAlgorithm::Crc32, input.checksum_crc32.as_deref()),
        (ChecksumAlgorithm::Crc32c, input.checksum_crc32c.as_deref()),
        (
            ChecksumAlgorithm::Crc64Nvme,
            input.checksum_crc64nvme.as_deref(),
        ),
        (ChecksumAlgorithm::Sha1, input.checksum_sha1.as_deref()),
        (ChecksumAlgorithm::Sha256, input.checksum_sha256.as_deref()),
    ]
    .into_iter()
    .filter_map(|(a, v)| v.map(|v| (a, v.trim())))
    .collect();
    match sent.as_slice() {
        [] => Ok(None),
        [(algorithm, value)] => {
            let digest = value.split_once('-').map_or(*value, |(d, count)| {
                if count.parse::<u32>().is_ok() {
                    d
                } else {
                    value
                }
            });
            if !checksum::is_value_shape(*algorithm, digest) {
                return Err(invalid_request(format!(
                    "Value for {} header is invalid.",
                    algorithm.header()
                )));
            }
            Ok(Some((*algorithm, value)))
        }
        _ => Err(invalid_request(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
        )),
    }
}

/// Whether a client's whole-object checksum names the computed `value`:
/// equal, or equal but for the `-<part count>` suffix the client may leave
/// off a composite value.
fn object_checksum_matches(claimed: &str, value: &str) -> bool {
    claimed == value
        || (!claimed.contains('-') && value.split_once('-').is_some_and(|(d, _)| d == claimed))
}

pub(super) async fn complete_multipart_upload(
    gw: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let mut input = req.input;
    let listed = input
        .multipart_upload
        .take()
        .and_then(|m| m.parts)
        .unwrap_or_default();
    let parts = completed_parts(&listed)?;
    let checksums = match gw
        .meta
        .get_upload(&input.bucket, &input.key, &input.upload_id)
        .await
    {
        Ok(upload) => {
            // A retry of a Complete that succeeded finds no upload and is
            // answered by meta with the object, conditions or not.
            check_write_conditions(
                gw,
                &input.bucket,
                &input.key,
                input.if_match.as_ref(),
                input.if_none_match.as_ref(),
            )
            .await?;
            multipart_checksum(gw, &upload, &listed, &parts, &input).await?
        }
        // Already completed (meta answers a repeat with the object) or never existed.
        Err(MetaError::Refused {
            code: pb::ErrorCode::NoSuchUpload,
            ..
        }) => None,
        Err(e) => return Err(meta_error(e)),
    };
    let count = parts.len();
    let resp = gw
        .meta
        .complete_upload(pb::CompleteUploadRequest {
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            upload_id: input.upload_id.clone(),
            parts,
            now_ms: wall_clock_ms(),
            min_part_size: MIN_PART_SIZE,
            checksums,
            condition: super::put::write_condition(
                input.if_match.as_ref(),
                input.if_none_match.as_ref(),
            ),
            op_id: String::new(),
        })
        .await
        .map_err(meta_error)?;
    gw.reclaimer.release(&resp.released);
    let obj = resp
        .object
        .ok_or_else(|| internal("CompleteUpload answered without an object"))?;
    tracing::debug!(bucket = %obj.bucket, key = %obj.key, upload_id = %input.upload_id, count, etag = %obj.etag, "complete multipart upload");
    let sums = ChecksumFields::from(obj.checksums.as_ref());
    Ok(S3Response::new(CompleteMultipartUploadOutput {
        location: Some(format!("/{}/{}", obj.bucket, obj.key)),
        bucket: Some(obj.bucket),
        key: Some(obj.key),
        e_tag: Some(etag(&obj.etag)),
        checksum_crc32: sums.crc32,
        checksum_crc32c: sums.crc32c,
        checksum_crc64nvme: sums.crc64nvme,
        checksum_sha1: sums.sha1,
        checksum_sha256: sums.sha256,
        checksum_type: sums.checksum_type,
        version_id: super::error::reported_version(resp.version_id),
        ..Default::default()
    }))
}

pub(super) async fn abort_multipart_upload(
    gw: &Gateway,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let input = req.input;
    let released = gw
        .meta
        .abort_upload(&input.bucket, &input.key, &input.upload_id)
        .await
        .map_err(meta_error)?;
    // Meta deletes the parts' blobs after `delete_delay` (a GET of a part
    // in flight reads to the end); nothing is deleted here.
    let parts = released.len();
    gw.reclaimer.release(&released);
    tracing::debug!(bucket = %input.bucket, key = %input.key, upload_id = %input.upload_id, parts, "abort multipart upload");
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

/// A part-number marker (`what` names it in the error): parts after it are
/// listed; absent is 0. Errors: `InvalidArgument` when negative.
pub(super) fn part_number_marker(marker: Option<i32>, what: &str) -> S3Result<u32> {
    match marker {
        None => Ok(0),
        Some(n) => u32::try_from(n)
            .map_err(|_| invalid_argument(format!("{what} must be a non-negative integer"))),
    }
}

pub(super) async fn list_parts(
    gw: &Gateway,
    req: S3Request<ListPartsInput>,
) -> S3Result<S3Response<ListPartsOutput>> {
    let input = req.input;
    let max_parts = page_size(input.max_parts, "max-parts")?;
    let marker = part_number_marker(input.part_number_marker, "part-number-marker")?;
    let page = if max_parts == 0 {
        let upload = gw
            .meta
            .get_upload(&input.bucket, &input.key, &input.upload_id)
            .await
            .map_err(meta_error)?;
        pb::ListPartsResponse {
            upload: Some(upload),
            ..Default::default()
        }
    } else {
        gw.meta
            .list_parts(pb::ListPartsRequest {
                bucket: input.bucket.clone(),
                key: input.key.clone(),
                upload_id: input.upload_id.clone(),
                part_number_marker: marker,
                max_parts,
            })
            .await
            .map_err(meta_error)?
    };
    let algorithm = page.upload.as_ref().and_then(upload_algorithm);
    let parts: Vec<Part> = page
        .parts
        .into_iter()
        .map(|p| {
            let sums = ChecksumFields::from(p.checksums.as_ref());
            Part {
                e_tag: Some(etag(&checksum::etag_hex(&p.md5))),
                last_modified: Some(timestamp(p.last_modified_ms)),
                part_number: Some(p.part_number as i32),
                size: Some(i64::try_from(p.size).unwrap_or(i64::MAX)),
                checksum_crc32: sums.crc32,
                checksum_crc32c: sums.crc32c,
                checksum_crc64nvme: sums.crc64nvme,
                checksum_sha1: sums.sha1,
                checksum_sha256: sums.sha256,
            }
        })
        .collect();
    Ok(S3Response::new(ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        part_number_marker: Some(marker as i32),
        next_part_number_marker: page
            .is_truncated
            .then_some(page.next_part_number_marker as i32),
        max_parts: Some(max_parts as i32),
        is_truncated: Some(page.is_truncated),
        parts: (!parts.is_empty()).then_some(parts),
        initiator: Some(Initiator {
            display_name: owner().display_name,
            id: owner().id,
        }),
        owner: Some(owner()),
        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        checksum_algorithm: algorithm
            .map(|a| s3s::dto::ChecksumAlgorithm::from(a.name().to_string())),
        checksum_type: resolve_checksum_type(algorithm, None).unwrap_or(None),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete_input(crc32: Option<&str>, sha256: Option<&str>) -> CompleteMultipartUploadInput {
        CompleteMultipartUploadInput::builder()
            .bucket("b".into())
            .key("k".into())
            .upload_id("u".into())
            .checksum_crc32(crc32.map(str::to_string))
            .checksum_sha256(sha256.map(str::to_string))
            .build()
            .unwrap()
    }

    #[test]
    fn whole_object_checksums_of_a_complete() {
        assert_eq!(
            claimed_object_checksum(&complete_input(None, None)).unwrap(),
            None
        );
        assert_eq!(
            claimed_object_checksum(&complete_input(Some("AAAAAA=="), None)).unwrap(),
            Some((ChecksumAlgorithm::Crc32, "AAAAAA=="))
        );
        assert_eq!(
            claimed_object_checksum(&complete_input(Some("AAAAAA==-3"), None)).unwrap(),
            Some((ChecksumAlgorithm::Crc32, "AAAAAA==-3"))
        );
        for bad in [
            complete_input(None, Some("bad")),
            complete_input(Some("AAAAAA==-x"), None),
        ] {
            assert_eq!(
                claimed_object_checksum(&bad).unwrap_err().code(),
                &S3ErrorCode::InvalidRequest
            );
        }
        assert_eq!(
            claimed_object_checksum(&complete_input(Some("AAAAAA=="), Some("bad")))
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidRequest
        );
        assert!(object_checksum_matches("AAAAAA==-3", "AAAAAA==-3"));
        assert!(object_checksum_matches("AAAAAA==", "AAAAAA==-3"));
        assert!(object_checksum_matches("AAAAAA==", "AAAAAA=="));
        assert!(!object_checksum_matches("AAAAAA==-2", "AAAAAA==-3"));
        assert!(!object_checksum_matches("AAAAAB==", "AAAAAA=="));
    }

    #[test]
    fn upload_ids_encode_their_creation_time() {
        let id = new_upload_id(1_700_000_000_123);
        assert_eq!(id.len(), 32);
        assert!(id.starts_with("0000018bcfe5687b"));
        assert_eq!(upload_initiated_ms(&id), Some(1_700_000_000_123));
        assert_ne!(new_upload_id(5), new_upload_id(5));
        assert_eq!(upload_initiated_ms("short"), None);
        assert_eq!(
            upload_initiated_ms("zz00018bcfe5687baaaaaaaaaaaaaaaa"),
            None
        );
    }

    #[test]
    fn part_numbers_are_1_to_10000() {
        assert_eq!(part_number(1).unwrap(), 1);
        assert_eq!(part_number(10_000).unwrap(), 10_000);
        for bad in [0, -1, 10_001] {
            let e = part_number(bad).unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::InvalidArgument);
        }
    }

    #[test]
    fn completed_part_lists() {
        assert_eq!(
            completed_parts(&[]).unwrap_err().code(),
            &S3ErrorCode::MalformedXML
        );
        let part = |n: Option<i32>, e: Option<&str>| CompletedPart {
            part_number: n,
            e_tag: e.map(|e| ETag::Strong(e.to_string())),
            ..Default::default()
        };
        let parts =
            completed_parts(&[part(Some(1), Some("ABC")), part(Some(2), Some("def"))]).unwrap();
        assert_eq!(parts[0].part_number, 1);
        assert_eq!(parts[0].etag, "abc");
        assert_eq!(parts[1].etag, "def");
        assert_eq!(
            completed_parts(&[part(None, Some("a"))])
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidPart
        );
        assert_eq!(
            completed_parts(&[part(Some(1), None)]).unwrap_err().code(),
            &S3ErrorCode::InvalidPart
        );
        assert_eq!(
            completed_parts(&[part(Some(10_001), Some("a"))])
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidPart
        );
    }

    #[test]
    fn checksum_types() {
        let t = |a, asked: Option<&str>| {
            resolve_checksum_type(a, asked.map(|s| ChecksumType::from(s.to_string())).as_ref())
                .map(|t| t.map(|t| t.as_str().to_string()))
        };
        assert_eq!(t(None, None).unwrap(), None);
        assert!(t(None, Some("COMPOSITE")).is_err());
        assert_eq!(
            t(Some(ChecksumAlgorithm::Crc32), None).unwrap().as_deref(),
            Some("COMPOSITE")
        );
        assert_eq!(
            t(Some(ChecksumAlgorithm::Crc64Nvme), None)
                .unwrap()
                .as_deref(),
            Some("FULL_OBJECT")
        );
        assert_eq!(
            t(Some(ChecksumAlgorithm::Crc32c), Some("FULL_OBJECT"))
                .unwrap()
                .as_deref(),
            Some("FULL_OBJECT")
        );
        assert!(t(Some(ChecksumAlgorithm::Sha256), Some("FULL_OBJECT")).is_err());
        assert!(t(Some(ChecksumAlgorithm::Crc64Nvme), Some("COMPOSITE")).is_err());
    }
}
