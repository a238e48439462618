//! ListObjects (v1), ListObjectsV2 and ListMultipartUploads, all answered
//! from meta's listings (keys in UTF-8 binary order).
//!
//! * `max-keys` / `max-uploads` default to and are capped at 1000.
//! * The V2 continuation token is opaque to clients: base64 of meta's
//!   `next_marker` (the last key or common prefix returned).
//! * V1 returns `NextMarker` only when a delimiter was given, as S3 does;
//!   without one clients continue from the last key.
//! * `encoding-type=url` percent-encodes every key, prefix, delimiter and
//!   marker in the response ([`url_encode`]), except ListObjects (v1)'s
//!   top-level `Prefix`, which S3 returns as sent.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as TOKEN;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};
use sluice_meta_client::version_id::shown_id;
use sluice_proto::meta as pb;

use super::checksum::{self, ChecksumAlgorithm};
use super::error::{invalid_argument, meta_error};
use super::{Gateway, etag, owner, timestamp};

/// Most entries one listing page returns.
pub const MAX_PAGE: u32 = 1000;

/// Percent-encodes `s` as S3 does for `encoding-type=url`: every byte but
/// the unreserved characters (`A-Z a-z 0-9 - _ . ~`) and `/` becomes `%XX`.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `encoding-type=url` was asked for. Errors: `InvalidArgument` for another value.
pub fn wants_url_encoding(encoding: Option<&EncodingType>) -> S3Result<bool> {
    match encoding.map(EncodingType::as_str) {
        None => Ok(false),
        Some(e) if e.eq_ignore_ascii_case(EncodingType::URL) => Ok(true),
        Some(_) => Err(invalid_argument(
            "Invalid Encoding Method specified in Request",
        )),
    }
}

/// A page size from `max-keys`-like parameters: default and cap 1000.
/// Errors: `InvalidArgument` for a negative value.
pub fn page_size(requested: Option<i32>, what: &str) -> S3Result<u32> {
    match requested {
        None => Ok(MAX_PAGE),
        Some(n) if n < 0 => Err(invalid_argument(format!(
            "{what} must be a non-negative integer"
        ))),
        Some(n) => Ok((n as u32).min(MAX_PAGE)),
    }
}

/// The opaque V2 continuation token for a meta marker.
pub fn encode_token(marker: &str) -> String {
    TOKEN.encode(marker.as_bytes())
}

/// The meta marker inside a V2 continuation token. Errors: `InvalidArgument`.
pub fn decode_token(token: &str) -> S3Result<String> {
    TOKEN
        .decode(token.as_bytes())
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .ok_or_else(|| invalid_argument("The continuation token provided is incorrect"))
}

/// Applies [`url_encode`] when `on`.
fn enc(on: bool, s: String) -> String {
    if on { url_encode(&s) } else { s }
}

/// One page of a bucket listing.
async fn list_page(
    gw: &Gateway,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: &str,
    max_keys: u32,
) -> S3Result<pb::ListObjectsResponse> {
    if max_keys == 0 {
        // Nothing to list, but the bucket must exist.
        gw.meta.get_bucket(bucket).await.map_err(meta_error)?;
        return Ok(pb::ListObjectsResponse::default());
    }
    let req = pb::ListObjectsRequest {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        delimiter: delimiter.map(str::to_string),
        start_after: start_after.to_string(),
        max_keys,
    };
    gw.meta.list_objects(req).await.map_err(meta_error)
}

fn object_entry(o: pb::ObjectRecord, url: bool, with_owner: bool) -> Object {
    let sums = o.checksums.unwrap_or_default();
    let algorithms: Vec<ChecksumAlgorithm> = checksum::present(&sums).collect();
    Object {
        key: Some(enc(url, o.key)),
        last_modified: Some(timestamp(o.last_modified_ms)),
        e_tag: Some(etag(&o.etag)),
        size: Some(i64::try_from(o.size).unwrap_or(i64::MAX)),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        owner: with_owner.then(owner),
        checksum_algorithm: (!algorithms.is_empty()).then(|| {
            algorithms
                .iter()
                .map(|a| ChecksumAlgorithm_::from(a.name().to_string()))
                .collect()
        }),
        ..Default::default()
    }
}

/// s3s's `ChecksumAlgorithm` DTO (ours has the same name).
type ChecksumAlgorithm_ = s3s::dto::ChecksumAlgorithm;

fn common_prefixes(prefixes: Vec<String>, url: bool) -> Option<Vec<CommonPrefix>> {
    (!prefixes.is_empty()).then(|| {
        prefixes
            .into_iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc(url, p)),
            })
            .collect()
    })
}

pub(super) async fn list_objects_v2(
    gw: &Gateway,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let input = req.input;
    let url = wants_url_encoding(input.encoding_type.as_ref())?;
    let max_keys = page_size(input.max_keys, "max-keys")?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let start_after = match &input.continuation_token {
        Some(token) => decode_token(token)?,
        None => input.start_after.clone().unwrap_or_default(),
    };
    let page = list_page(
        gw,
        &input.bucket,
        &prefix,
        delimiter.as_deref(),
        &start_after,
        max_keys,
    )
    .await?;
    let key_count = page.objects.len() + page.common_prefixes.len();
    let with_owner = input.fetch_owner.unwrap_or(false);
    let contents: Vec<Object> = page
        .objects
        .into_iter()
        .map(|o| object_entry(o, url, with_owner))
        .collect();
    Ok(S3Response::new(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        max_keys: Some(max_keys as i32),
        key_count: Some(i32::try_from(key_count).unwrap_or(i32::MAX)),
        continuation_token: input.continuation_token,
        is_truncated: Some(page.is_truncated),
        next_continuation_token: page.is_truncated.then(|| encode_token(&page.next_marker)),
        contents: (!contents.is_empty()).then_some(contents),
        common_prefixes: common_prefixes(page.common_prefixes, url),
        delimiter: delimiter.map(|d| enc(url, d)),
        encoding_type: input.encoding_type,
        start_after: input.start_after.map(|s| enc(url, s)),
        request_charged: None,
    }))
}

pub(super) async fn list_objects(
    gw: &Gateway,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let input = req.input;
    let url = wants_url_encoding(input.encoding_type.as_ref())?;
    let max_keys = page_size(input.max_keys, "max-keys")?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let marker = input.marker.unwrap_or_default();
    let page = list_page(
        gw,
        &input.bucket,
        &prefix,
        delimiter.as_deref(),
        &marker,
        max_keys,
    )
    .await?;
    // S3 returns NextMarker only when a delimiter was given.
    let next_marker =
        (page.is_truncated && delimiter.is_some()).then(|| enc(url, page.next_marker.clone()));
    let contents: Vec<Object> = page
        .objects
        .into_iter()
        .map(|o| object_entry(o, url, true))
        .collect();
    Ok(S3Response::new(ListObjectsOutput {
        name: Some(input.bucket),
        // S3 leaves v1's top-level Prefix unencoded (not V2's).
        prefix: Some(prefix),
        marker: Some(enc(url, marker)),
        max_keys: Some(max_keys as i32),
        is_truncated: Some(page.is_truncated),
        contents: (!contents.is_empty()).then_some(contents),
        common_prefixes: common_prefixes(page.common_prefixes, url),
        delimiter: delimiter.map(|d| enc(url, d)),
        next_marker,
        encoding_type: input.encoding_type,
        request_charged: None,
    }))
}

/// ListObjectVersions (S3 API reference): every version and delete marker,
/// keys in binary order and each key's versions newest first, from meta's
/// ListVersions. A bucket that was never versioned lists each object once,
/// `VersionId` `null`, the latest. `version-id-marker` needs a
/// `key-marker` and must be `null` or an id Sluice issued (`400
/// InvalidArgument` otherwise).
pub(super) async fn list_object_versions(
    gw: &Gateway,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let input = req.input;
    let url = wants_url_encoding(input.encoding_type.as_ref())?;
    let max_keys = page_size(input.max_keys, "max-keys")?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let key_marker = input.key_marker.unwrap_or_default();
    let version_id_marker = input.version_id_marker.filter(|v| !v.is_empty());
    if let Some(v) = &version_id_marker {
        if v != "null" && !sluice_meta_client::version_id::is_version_id(v) {
            return Err(invalid_argument("Invalid version id specified"));
        }
        if key_marker.is_empty() {
            return Err(invalid_argument(
                "A version-id marker cannot be specified without a key marker.",
            ));
        }
    }
    let page = if max_keys == 0 {
        gw.meta
            .get_bucket(&input.bucket)
            .await
            .map_err(meta_error)?;
        pb::ListVersionsResponse::default()
    } else {
        gw.meta
            .list_versions(pb::ListVersionsRequest {
                bucket: input.bucket.clone(),
                prefix: prefix.clone(),
                delimiter: delimiter.clone(),
                key_marker: key_marker.clone(),
                version_id_marker: version_id_marker.clone().unwrap_or_default(),
                max_keys,
            })
            .await
            .map_err(meta_error)?
    };
    let mut versions = Vec::new();
    let mut markers = Vec::new();
    for entry in page.versions {
        let Some(o) = entry.object else { continue };
        let version_id = Some(shown_id(&o).to_string());
        if o.delete_marker {
            markers.push(DeleteMarkerEntry {
                is_latest: Some(entry.is_latest),
                key: Some(enc(url, o.key)),
                last_modified: Some(timestamp(o.last_modified_ms)),
                owner: Some(owner()),
                version_id,
            });
            continue;
        }
        let object = object_entry(o, url, true);
        versions.push(ObjectVersion {
            checksum_algorithm: object.checksum_algorithm,
            e_tag: object.e_tag,
            is_latest: Some(entry.is_latest),
            key: object.key,
            last_modified: object.last_modified,
            owner: object.owner,
            size: object.size,
            storage_class: Some(ObjectVersionStorageClass::from_static(
                ObjectVersionStorageClass::STANDARD,
            )),
            version_id,
            ..Default::default()
        });
    }
    let truncated = page.is_truncated;
    Ok(S3Response::new(ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        key_marker: Some(enc(url, key_marker)),
        version_id_marker,
        max_keys: Some(max_keys as i32),
        is_truncated: Some(truncated),
        next_key_marker: truncated.then(|| enc(url, page.next_key_marker.clone())),
        next_version_id_marker: (truncated && !page.next_version_id_marker.is_empty())
            .then(|| page.next_version_id_marker.clone()),
        versions: (!versions.is_empty()).then_some(versions),
        delete_markers: (!markers.is_empty()).then_some(markers),
        common_prefixes: common_prefixes(page.common_prefixes, url),
        delimiter: delimiter.map(|d| enc(url, d)),
        encoding_type: input.encoding_type,
        ..Default::default()
    }))
}

pub(super) async fn list_multipart_uploads(
    gw: &Gateway,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let input = req.input;
    let url = wants_url_encoding(input.encoding_type.as_ref())?;
    let max_uploads = page_size(input.max_uploads, "max-uploads")?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let key_marker = input.key_marker.unwrap_or_default();
    // S3 ignores upload-id-marker without key-marker.
    let upload_id_marker = if key_marker.is_empty() {
        String::new()
    } else {
        input.upload_id_marker.unwrap_or_default()
    };
    let page = if max_uploads == 0 {
        gw.meta
            .get_bucket(&input.bucket)
            .await
            .map_err(meta_error)?;
        pb::ListUploadsResponse::default()
    } else {
        let req = pb::ListUploadsRequest {
            bucket: input.bucket.clone(),
            prefix: prefix.clone(),
            delimiter: delimiter.clone(),
            key_marker: key_marker.clone(),
            upload_id_marker: upload_id_marker.clone(),
            max_uploads,
        };
        gw.meta.list_uploads(req).await.map_err(meta_error)?
    };
    let uploads: Vec<MultipartUpload> = page
        .uploads
        .into_iter()
        .map(|u| MultipartUpload {
            checksum_algorithm: u.checksum_algorithm.map(ChecksumAlgorithm_::from),
            initiated: Some(timestamp(u.initiated_ms)),
            initiator: Some(Initiator {
                display_name: owner().display_name,
                id: owner().id,
            }),
            key: Some(enc(url, u.key)),
            owner: Some(owner()),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            upload_id: Some(u.upload_id),
            ..Default::default()
        })
        .collect();
    let truncated = page.is_truncated;
    Ok(S3Response::new(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        common_prefixes: common_prefixes(page.common_prefixes, url),
        delimiter: delimiter.map(|d| enc(url, d)),
        encoding_type: input.encoding_type,
        is_truncated: Some(truncated),
        key_marker: Some(enc(url, key_marker)),
        max_uploads: Some(max_uploads as i32),
        next_key_marker: truncated.then(|| enc(url, page.next_key_marker)),
        next_upload_id_marker: truncated.then_some(page.next_upload_id_marker),
        prefix: Some(enc(url, prefix)),
        request_charged: None,
        upload_id_marker: Some(upload_id_marker),
        uploads: (!uploads.is_empty()).then_some(uploads),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_unreserved_and_slash() {
        assert_eq!(url_encode("photos/2024/a.jpg"), "photos/2024/a.jpg");
        assert_eq!(url_encode("a b+c&d=e"), "a%20b%2Bc%26d%3De");
        assert_eq!(
            url_encode("tilde~under_score-dash"),
            "tilde~under_score-dash"
        );
        assert_eq!(url_encode("é"), "%C3%A9");
        assert_eq!(url_encode("\u{1}"), "%01");
        assert_eq!(enc(false, "a b".into()), "a b");
    }

    #[test]
    fn encoding_type_values() {
        assert!(!wants_url_encoding(None).unwrap());
        assert!(wants_url_encoding(Some(&EncodingType::from_static(EncodingType::URL))).unwrap());
        assert!(wants_url_encoding(Some(&EncodingType::from("base64".to_string()))).is_err());
    }

    #[test]
    fn page_sizes_default_and_cap_at_1000() {
        assert_eq!(page_size(None, "max-keys").unwrap(), 1000);
        assert_eq!(page_size(Some(5), "max-keys").unwrap(), 5);
        assert_eq!(page_size(Some(0), "max-keys").unwrap(), 0);
        assert_eq!(page_size(Some(5000), "max-keys").unwrap(), 1000);
        assert!(page_size(Some(-1), "max-keys").is_err());
    }

    #[test]
    fn continuation_tokens_round_trip() {
        for marker in ["", "a/b/c", "key with spaces", "ключ/é"] {
            assert_eq!(decode_token(&encode_token(marker)).unwrap(), marker);
        }
        assert!(decode_token("!!!").is_err());
    }

    #[test]
    fn object_entries_are_encoded_when_asked() {
        let o = pb::ObjectRecord {
            key: "a b".into(),
            etag: "abc".into(),
            size: 3,
            checksums: Some(pb::Checksums {
                crc32: Some("y/Q5Jg==".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = object_entry(o.clone(), true, false);
        assert_eq!(e.key.as_deref(), Some("a%20b"));
        assert_eq!(e.size, Some(3));
        assert!(e.owner.is_none());
        assert_eq!(e.checksum_algorithm.unwrap()[0].as_str(), "CRC32");
        assert_eq!(object_entry(o, false, true).key.as_deref(), Some("a b"));
    }
}
