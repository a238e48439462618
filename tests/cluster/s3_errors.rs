//! S3 error codes and object semantics through `aws-sdk-s3`, on a cluster
//! with a single meta voter.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::operation::abort_multipart_upload::AbortMultipartUploadError;
use aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadError;
use aws_sdk_s3::operation::copy_object::CopyObjectError;
use aws_sdk_s3::operation::create_bucket::CreateBucketError;
use aws_sdk_s3::operation::delete_bucket::DeleteBucketError;
use aws_sdk_s3::operation::get_bucket_versioning::GetBucketVersioningError;
use aws_sdk_s3::operation::get_object::GetObjectError;
use aws_sdk_s3::operation::get_object_attributes::GetObjectAttributesError;
use aws_sdk_s3::operation::head_bucket::HeadBucketError;
use aws_sdk_s3::operation::list_buckets::ListBucketsError;
use aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Error;
use aws_sdk_s3::operation::list_parts::ListPartsError;
use aws_sdk_s3::operation::put_object::PutObjectError;
use aws_sdk_s3::operation::put_object_tagging::PutObjectTaggingError;
use aws_sdk_s3::operation::upload_part::UploadPartError;
use aws_sdk_s3::primitives::{ByteStream, DateTime};
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, ChecksumType, CompletedPart, Delete, MetadataDirective,
    ObjectAttributes, ObjectIdentifier, ServerSideEncryption, StorageClass, Tag, Tagging,
    TaggingDirective,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use md5::{Digest as _, Md5};

use crate::fixtures::{ACCESS_KEY, TestCluster};
use crate::{
    MIB, Upload, assert_object, complete, create_upload, expect_error, get_all, md5_hex,
    multipart_etag, put, quoted, random_bytes, test_seed, upload_parts,
};

const B: &str = "errors";

fn completed(number: i32, etag: &str) -> CompletedPart {
    CompletedPart::builder()
        .part_number(number)
        .e_tag(etag)
        .build()
}

/// Creates a CRC32 FULL_OBJECT multipart upload of `data` at `key` and
/// uploads it in 5 MiB parts; returns the upload id and the parts.
async fn full_object_crc32_upload(
    s3: &aws_sdk_s3::Client,
    key: &str,
    data: &Bytes,
) -> Result<(String, Vec<CompletedPart>)> {
    let upload_id = s3
        .create_multipart_upload()
        .bucket(B)
        .key(key)
        .checksum_algorithm(ChecksumAlgorithm::Crc32)
        .checksum_type(ChecksumType::FullObject)
        .send()
        .await?
        .upload_id()
        .context("CreateMultipartUpload without UploadId")?
        .to_string();
    let upload = Upload {
        s3,
        bucket: B,
        key,
        upload_id: &upload_id,
    };
    let parts = upload_parts(&upload, data, 5 * MIB, 1, 2).await?;
    Ok((upload_id, parts))
}

/// base64 of the big-endian CRC32, as `x-amz-checksum-crc32` carries it.
fn crc32_b64(data: &[u8]) -> String {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, data) as u32;
    B64.encode(crc.to_be_bytes())
}

/// base64 of the big-endian CRC32C, as `x-amz-checksum-crc32c` carries it.
fn crc32c_b64(data: &[u8]) -> String {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    B64.encode(crc.to_be_bytes())
}

/// Multipart errors, conditional Complete, checksums, attributes.
async fn multipart_errors(s3: &aws_sdk_s3::Client, seed: u64) -> Result<()> {
    // ---- Multipart errors.
    let mp = random_bytes(seed + 1, 6 * MIB);
    let mp_id = create_upload(s3, B, "mp").await?;
    let parts = upload_parts(
        &Upload {
            s3,
            bucket: B,
            key: "mp",
            upload_id: &mp_id,
        },
        &mp,
        5 * MIB,
        1,
        2,
    )
    .await?;
    let (e1, e2) = (
        parts[0].e_tag().unwrap_or_default(),
        parts[1].e_tag().unwrap_or_default(),
    );
    expect_error::<_, UploadPartError>(
        "UploadPart to an unknown upload",
        s3.upload_part()
            .bucket(B)
            .key("mp")
            .upload_id("no-such-upload")
            .part_number(1)
            .body(ByteStream::from_static(b"x"))
            .send()
            .await,
        404,
        Some("NoSuchUpload"),
    )?;
    expect_error::<_, ListPartsError>(
        "ListParts of an unknown upload",
        s3.list_parts()
            .bucket(B)
            .key("mp")
            .upload_id("no-such-upload")
            .send()
            .await,
        404,
        Some("NoSuchUpload"),
    )?;
    expect_error::<_, AbortMultipartUploadError>(
        "Abort of an unknown upload",
        s3.abort_multipart_upload()
            .bucket(B)
            .key("mp")
            .upload_id("no-such-upload")
            .send()
            .await,
        404,
        Some("NoSuchUpload"),
    )?;
    let try_complete = |parts: Vec<CompletedPart>, upload_id: &str| {
        s3.complete_multipart_upload()
            .bucket(B)
            .key("mp")
            .upload_id(upload_id)
            .multipart_upload(
                aws_sdk_s3::types::CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
    };
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete of an unknown upload",
        try_complete(vec![completed(1, e1)], "no-such-upload").await,
        404,
        Some("NoSuchUpload"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with a wrong ETag",
        try_complete(
            vec![
                completed(1, "\"0123456789abcdef0123456789abcdef\""),
                completed(2, e2),
            ],
            &mp_id,
        )
        .await,
        400,
        Some("InvalidPart"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with a part never uploaded",
        try_complete(vec![completed(1, e1), completed(3, e2)], &mp_id).await,
        400,
        Some("InvalidPart"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with parts out of order",
        try_complete(vec![completed(2, e2), completed(1, e1)], &mp_id).await,
        400,
        Some("InvalidPartOrder"),
    )?;
    // If-Match on a key that does not exist yet: 404 NoSuchKey.
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with If-Match on a missing key",
        s3.complete_multipart_upload()
            .bucket(B)
            .key("mp")
            .upload_id(&mp_id)
            .multipart_upload(
                aws_sdk_s3::types::CompletedMultipartUpload::builder()
                    .set_parts(Some(parts.clone()))
                    .build(),
            )
            .if_match("\"0123456789abcdef0123456789abcdef\"")
            .send()
            .await,
        404,
        Some("NoSuchKey"),
    )?;
    let listed = s3
        .list_parts()
        .bucket(B)
        .key("mp")
        .upload_id(&mp_id)
        .send()
        .await?;
    ensure!(
        listed.parts().len() == 2,
        "failed completes changed the upload: {:?}",
        listed.parts()
    );

    let want_etag = quoted(&multipart_etag(mp.chunks(5 * MIB)));
    let etag = complete(s3, B, "mp", &mp_id, parts.clone()).await?;
    ensure!(etag == want_etag, "multipart ETag {etag}, want {want_etag}");
    let again = complete(s3, B, "mp", &mp_id, parts.clone())
        .await
        .context("re-completing with the same list")?;
    ensure!(
        again == want_etag,
        "re-complete ETag {again}, want {want_etag}"
    );
    assert_object(s3, B, "mp", &mp).await?;
    let part2 = s3
        .get_object()
        .bucket(B)
        .key("mp")
        .part_number(2)
        .send()
        .await?;
    ensure!(
        part2.parts_count() == Some(2),
        "PartsCount {:?}",
        part2.parts_count()
    );
    ensure!(
        part2.content_length() == Some(MIB as i64),
        "part 2 Content-Length {:?}",
        part2.content_length()
    );
    ensure!(
        part2.body.collect().await?.into_bytes() == mp.slice(5 * MIB..),
        "GET partNumber=2 body differs"
    );
    // HEAD reads the record's head alone (meta keeps the part list apart):
    // the whole object's length and ETag, no parts count; HEAD with a
    // part number reads the part list and answers that part.
    let head = s3.head_object().bucket(B).key("mp").send().await?;
    ensure!(
        (head.content_length(), head.e_tag(), head.parts_count())
            == (Some(mp.len() as i64), Some(want_etag.as_str()), None),
        "HEAD of the multipart object: {head:?}"
    );
    let head2 = s3
        .head_object()
        .bucket(B)
        .key("mp")
        .part_number(2)
        .send()
        .await?;
    ensure!(
        (head2.content_length(), head2.parts_count()) == (Some(MIB as i64), Some(2)),
        "HEAD partNumber=2: {head2:?}"
    );

    // Conditional Complete on the now existing key: If-None-Match: * and a
    // wrong If-Match are 412 and leave both the object and the upload as
    // they were; the right If-Match replaces the object.
    let next = random_bytes(seed + 4, 1000);
    let next_id = create_upload(s3, B, "mp").await?;
    let next_parts = upload_parts(
        &Upload {
            s3,
            bucket: B,
            key: "mp",
            upload_id: &next_id,
        },
        &next,
        MIB,
        1,
        1,
    )
    .await?;
    let conditional_complete = |if_match: Option<&str>, if_none_match: Option<&str>| {
        s3.complete_multipart_upload()
            .bucket(B)
            .key("mp")
            .upload_id(&next_id)
            .multipart_upload(
                aws_sdk_s3::types::CompletedMultipartUpload::builder()
                    .set_parts(Some(next_parts.clone()))
                    .build(),
            )
            .set_if_match(if_match.map(str::to_string))
            .set_if_none_match(if_none_match.map(str::to_string))
            .send()
    };
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with If-None-Match: * on an existing key",
        conditional_complete(None, Some("*")).await,
        412,
        Some("PreconditionFailed"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with a stale If-Match",
        conditional_complete(Some("\"0123456789abcdef0123456789abcdef\""), None).await,
        412,
        Some("PreconditionFailed"),
    )?;
    assert_object(s3, B, "mp", &mp).await?;
    conditional_complete(Some(want_etag.as_str()), None)
        .await
        .context("Complete with the current ETag as If-Match")?;
    assert_object(s3, B, "mp", &next).await?;

    // Sections boxed: the test's future is already large for a test
    // thread's stack in a debug build.
    let want_crc = Box::pin(multipart_checksums(s3, seed)).await?;

    // partNumber other than 1 of an object not uploaded in parts: 400 InvalidPart.
    put(s3, B, "single", &Bytes::from_static(b"one part")).await?;
    expect_error::<_, GetObjectError>(
        "GET partNumber=2 of a single-part object",
        s3.get_object()
            .bucket(B)
            .key("single")
            .part_number(2)
            .send()
            .await,
        400,
        Some("InvalidPart"),
    )?;
    let whole = s3
        .get_object()
        .bucket(B)
        .key("single")
        .part_number(1)
        .send()
        .await?;
    ensure!(
        whole.body.collect().await?.into_bytes() == Bytes::from_static(b"one part"),
        "GET partNumber=1 of a single-part object differs"
    );

    Box::pin(attributes_versioning_and_sse(s3, &want_crc)).await?;

    // EntityTooSmall: every part but the last must be >= 5 MiB.
    let small = random_bytes(seed + 2, 2 * MIB);
    let small_id = create_upload(s3, B, "small").await?;
    let small_parts = upload_parts(
        &Upload {
            s3,
            bucket: B,
            key: "small",
            upload_id: &small_id,
        },
        &small,
        MIB,
        1,
        2,
    )
    .await?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with two 1 MiB parts",
        s3.complete_multipart_upload()
            .bucket(B)
            .key("small")
            .upload_id(&small_id)
            .multipart_upload(
                aws_sdk_s3::types::CompletedMultipartUpload::builder()
                    .set_parts(Some(small_parts))
                    .build(),
            )
            .send()
            .await,
        400,
        Some("EntityTooSmall"),
    )?;
    // Re-uploading a part number replaces the part.
    let replacement = random_bytes(seed + 3, 1000);
    upload_parts(
        &Upload {
            s3,
            bucket: B,
            key: "small",
            upload_id: &small_id,
        },
        &replacement,
        MIB,
        1,
        1,
    )
    .await?;
    let listed = s3
        .list_parts()
        .bucket(B)
        .key("small")
        .upload_id(&small_id)
        .send()
        .await?;
    let got: Vec<(Option<i32>, Option<i64>, Option<&str>)> = listed
        .parts()
        .iter()
        .map(|p| (p.part_number(), p.size(), p.e_tag()))
        .collect();
    let (r_etag, p2_etag) = (
        quoted(&md5_hex(&replacement)),
        quoted(&md5_hex(&small[MIB..])),
    );
    let want = [
        (Some(1), Some(1000), Some(r_etag.as_str())),
        (Some(2), Some(MIB as i64), Some(p2_etag.as_str())),
    ];
    ensure!(
        got == want,
        "ListParts after replacing part 1: {got:?}, want {want:?}"
    );
    Ok(())
}

/// Metadata round trip, ranges and conditionals, integrity, CopyObject, DeleteObjects.
async fn object_semantics(s3: &aws_sdk_s3::Client, seed: u64) -> Result<()> {
    // ---- Metadata round trip. `aws-chunked` names how a body was sent,
    // not how it is stored: S3 keeps only the other codings.
    let text = Bytes::from_static(b"hello, sluice: metadata and content type round trip\n");
    let put_out = s3
        .put_object()
        .bucket(B)
        .key("meta.txt")
        .body(ByteStream::from(text.clone()))
        .content_type("text/plain; charset=utf-8")
        .content_encoding("gzip, aws-chunked")
        .cache_control("max-age=60")
        .content_disposition("attachment; filename=\"meta.txt\"")
        .metadata("color", "blue")
        .metadata("owner-id", "42")
        .send()
        .await?;
    let text_etag = quoted(&md5_hex(&text));
    ensure!(
        put_out.e_tag() == Some(text_etag.as_str()),
        "PutObject ETag {:?}",
        put_out.e_tag()
    );
    let want_meta: HashMap<String, String> = [("color", "blue"), ("owner-id", "42")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let got = s3.get_object().bucket(B).key("meta.txt").send().await?;
    ensure!(
        got.content_type() == Some("text/plain; charset=utf-8"),
        "Content-Type {:?}",
        got.content_type()
    );
    ensure!(
        got.content_encoding() == Some("gzip"),
        "Content-Encoding {:?}",
        got.content_encoding()
    );
    ensure!(
        got.cache_control() == Some("max-age=60"),
        "Cache-Control {:?}",
        got.cache_control()
    );
    ensure!(
        got.content_disposition() == Some("attachment; filename=\"meta.txt\""),
        "Content-Disposition {:?}",
        got.content_disposition()
    );
    ensure!(
        got.metadata() == Some(&want_meta),
        "user metadata {:?}",
        got.metadata()
    );
    ensure!(
        got.e_tag() == Some(text_etag.as_str()),
        "GET ETag {:?}",
        got.e_tag()
    );
    let last_modified = *got.last_modified().context("GET without Last-Modified")?;
    ensure!(
        got.body.collect().await?.into_bytes() == text,
        "GET body differs"
    );
    let head = s3.head_object().bucket(B).key("meta.txt").send().await?;
    ensure!(
        head.metadata() == Some(&want_meta),
        "HEAD user metadata {:?}",
        head.metadata()
    );
    ensure!(
        head.content_length() == Some(text.len() as i64),
        "HEAD Content-Length {:?}",
        head.content_length()
    );

    // ---- Ranges and conditionals.
    expect_error::<_, GetObjectError>(
        "Range past the end",
        s3.get_object()
            .bucket(B)
            .key("meta.txt")
            .range("bytes=1000-2000")
            .send()
            .await,
        416,
        Some("InvalidRange"),
    )?;
    expect_error::<_, GetObjectError>(
        "If-Match mismatch",
        s3.get_object()
            .bucket(B)
            .key("meta.txt")
            .if_match("\"0123456789abcdef0123456789abcdef\"")
            .send()
            .await,
        412,
        Some("PreconditionFailed"),
    )?;
    s3.get_object()
        .bucket(B)
        .key("meta.txt")
        .if_match(&text_etag)
        .send()
        .await
        .context("If-Match with the ETag")?;
    expect_error::<_, GetObjectError>(
        "If-None-Match with the ETag",
        s3.get_object()
            .bucket(B)
            .key("meta.txt")
            .if_none_match(&text_etag)
            .send()
            .await,
        304,
        None,
    )?;
    s3.get_object()
        .bucket(B)
        .key("meta.txt")
        .if_none_match("\"other\"")
        .send()
        .await
        .context("If-None-Match other")?;
    expect_error::<_, GetObjectError>(
        "If-Modified-Since after Last-Modified",
        s3.get_object()
            .bucket(B)
            .key("meta.txt")
            .if_modified_since(DateTime::from_secs(last_modified.secs() + 3600))
            .send()
            .await,
        304,
        None,
    )?;
    expect_error::<_, GetObjectError>(
        "If-Unmodified-Since before Last-Modified",
        s3.get_object()
            .bucket(B)
            .key("meta.txt")
            .if_unmodified_since(DateTime::from_secs(946_684_800))
            .send()
            .await,
        412,
        Some("PreconditionFailed"),
    )?;

    Box::pin(integrity(s3, seed)).await?;

    // ---- CopyObject: COPY keeps metadata, REPLACE replaces it.
    let copied = s3
        .copy_object()
        .bucket(B)
        .key("copy-keep")
        .copy_source(format!("{B}/meta.txt"))
        .send()
        .await?;
    let copied_etag = copied.copy_object_result().and_then(|r| r.e_tag());
    ensure!(
        copied_etag == Some(text_etag.as_str()),
        "CopyObject ETag {copied_etag:?}"
    );
    let got = s3.get_object().bucket(B).key("copy-keep").send().await?;
    ensure!(
        got.metadata() == Some(&want_meta),
        "COPY metadata {:?}",
        got.metadata()
    );
    ensure!(
        got.content_type() == Some("text/plain; charset=utf-8"),
        "COPY Content-Type {:?}",
        got.content_type()
    );
    ensure!(
        got.body.collect().await?.into_bytes() == text,
        "COPY body differs"
    );

    s3.copy_object()
        .bucket(B)
        .key("copy-replace")
        .copy_source(format!("{B}/meta.txt"))
        .metadata_directive(MetadataDirective::Replace)
        .content_type("application/json")
        .metadata("fresh", "yes")
        .send()
        .await?;
    let got = s3.get_object().bucket(B).key("copy-replace").send().await?;
    let fresh: HashMap<String, String> = [("fresh".to_string(), "yes".to_string())]
        .into_iter()
        .collect();
    ensure!(
        got.metadata() == Some(&fresh),
        "REPLACE metadata {:?}",
        got.metadata()
    );
    ensure!(
        got.content_type() == Some("application/json"),
        "REPLACE Content-Type {:?}",
        got.content_type()
    );
    ensure!(
        got.body.collect().await?.into_bytes() == text,
        "REPLACE body differs"
    );
    expect_error::<_, CopyObjectError>(
        "CopyObject onto itself without REPLACE",
        s3.copy_object()
            .bucket(B)
            .key("meta.txt")
            .copy_source(format!("{B}/meta.txt"))
            .send()
            .await,
        400,
        Some("InvalidRequest"),
    )?;

    // ---- DeleteObjects.
    for k in ["del/1", "del/2", "del/3"] {
        put(s3, B, k, &Bytes::from(k.as_bytes().to_vec())).await?;
    }
    let ids = ["del/1", "del/2", "del/never-existed"]
        .into_iter()
        .map(|k| ObjectIdentifier::builder().key(k).build())
        .collect::<Result<Vec<_>, _>>()?;
    let out = s3
        .delete_objects()
        .bucket(B)
        .delete(Delete::builder().set_objects(Some(ids)).build()?)
        .send()
        .await?;
    let mut deleted: Vec<&str> = out.deleted().iter().filter_map(|d| d.key()).collect();
    deleted.sort();
    ensure!(
        deleted == ["del/1", "del/2", "del/never-existed"],
        "DeleteObjects deleted {deleted:?}"
    );
    ensure!(
        out.errors().is_empty(),
        "DeleteObjects errors {:?}",
        out.errors()
    );
    let left = s3.list_objects_v2().bucket(B).prefix("del/").send().await?;
    let left: Vec<&str> = left.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(left == ["del/3"], "after DeleteObjects: {left:?}");
    Ok(())
}

/// The tags of an object, as (key, value) pairs in the order stored.
async fn tags_of(s3: &aws_sdk_s3::Client, key: &str) -> Result<Vec<(String, String)>> {
    let out = s3.get_object_tagging().bucket(B).key(key).send().await?;
    Ok(out
        .tag_set()
        .iter()
        .map(|t| (t.key().to_string(), t.value().to_string()))
        .collect())
}

fn tag_set(pairs: &[(&str, &str)]) -> Result<Tagging> {
    let tags = pairs
        .iter()
        .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tagging::builder().set_tag_set(Some(tags)).build()?)
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Object tagging: `x-amz-tagging` on PUT, Copy (COPY/REPLACE) and
/// multipart; Put/Get/DeleteObjectTagging; S3's limits refused without
/// touching the object.
async fn object_tagging(s3: &aws_sdk_s3::Client, seed: u64) -> Result<()> {
    let data = random_bytes(seed + 40, 1000);
    s3.put_object()
        .bucket(B)
        .key("tagged")
        .tagging("project=blue%20sky&team=")
        .body(ByteStream::from(data.clone()))
        .send()
        .await?;
    let want = owned(&[("project", "blue sky"), ("team", "")]);
    ensure!(tags_of(s3, "tagged").await? == want, "tags after PUT");
    let got = s3.get_object().bucket(B).key("tagged").send().await?;
    ensure!(
        got.tag_count() == Some(2),
        "x-amz-tagging-count {:?}",
        got.tag_count()
    );
    let before = s3.head_object().bucket(B).key("tagged").send().await?;

    // Replaced whole; the object's body, ETag and Last-Modified stay.
    s3.put_object_tagging()
        .bucket(B)
        .key("tagged")
        .tagging(tag_set(&[("stage", "prod")])?)
        .send()
        .await?;
    ensure!(
        tags_of(s3, "tagged").await? == owned(&[("stage", "prod")]),
        "tags after PutObjectTagging"
    );
    let after = s3.head_object().bucket(B).key("tagged").send().await?;
    ensure!(
        after.e_tag() == before.e_tag() && after.last_modified() == before.last_modified(),
        "PutObjectTagging changed the object: {before:?} -> {after:?}"
    );
    assert_object(s3, B, "tagged", &data).await?;

    // S3's limits: refused, nothing changed.
    let eleven: Vec<(String, String)> = (0..11).map(|i| (format!("k{i}"), "v".into())).collect();
    let eleven: Vec<(&str, &str)> = eleven
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (what, tags, code) in [
        ("11 tags", eleven, "BadRequest"),
        ("a key twice", vec![("a", "1"), ("a", "2")], "InvalidTag"),
        ("an aws: key", vec![("aws:x", "1")], "InvalidTag"),
    ] {
        expect_error::<_, PutObjectTaggingError>(
            &format!("PutObjectTagging with {what}"),
            s3.put_object_tagging()
                .bucket(B)
                .key("tagged")
                .tagging(tag_set(&tags)?)
                .send()
                .await,
            400,
            Some(code),
        )?;
    }
    expect_error::<_, PutObjectError>(
        "PutObject with a bad x-amz-tagging",
        s3.put_object()
            .bucket(B)
            .key("tagged")
            .tagging("a=1&a=2")
            .body(ByteStream::from_static(b"other"))
            .send()
            .await,
        400,
        Some("InvalidTag"),
    )?;
    ensure!(
        tags_of(s3, "tagged").await? == owned(&[("stage", "prod")]),
        "tags after refused requests"
    );
    assert_object(s3, B, "tagged", &data).await?;
    expect_error::<_, PutObjectTaggingError>(
        "PutObjectTagging of a missing key",
        s3.put_object_tagging()
            .bucket(B)
            .key("no-such-key")
            .tagging(tag_set(&[("a", "1")])?)
            .send()
            .await,
        404,
        Some("NoSuchKey"),
    )?;

    // CopyObject copies the tags by default, replaces them with REPLACE.
    s3.copy_object()
        .bucket(B)
        .key("tagged-copy")
        .copy_source(format!("{B}/tagged"))
        .tagging("ignored=yes")
        .send()
        .await?;
    ensure!(
        tags_of(s3, "tagged-copy").await? == owned(&[("stage", "prod")]),
        "tags of a COPY-directive copy"
    );
    s3.copy_object()
        .bucket(B)
        .key("tagged-copy")
        .copy_source(format!("{B}/tagged"))
        .tagging_directive(TaggingDirective::Replace)
        .tagging("copy=new")
        .send()
        .await?;
    ensure!(
        tags_of(s3, "tagged-copy").await? == owned(&[("copy", "new")]),
        "tags of a REPLACE-directive copy"
    );

    // Multipart: the tags given at create are the object's at Complete.
    let upload_id = s3
        .create_multipart_upload()
        .bucket(B)
        .key("tagged-mp")
        .tagging("via=multipart")
        .send()
        .await?
        .upload_id()
        .context("CreateMultipartUpload without UploadId")?
        .to_string();
    let upload = Upload {
        s3,
        bucket: B,
        key: "tagged-mp",
        upload_id: &upload_id,
    };
    let parts = upload_parts(&upload, &data, 5 * MIB, 1, 1).await?;
    complete(s3, B, "tagged-mp", &upload_id, parts).await?;
    ensure!(
        tags_of(s3, "tagged-mp").await? == owned(&[("via", "multipart")]),
        "tags of a completed multipart upload"
    );

    // DeleteObjectTagging: no tags, no x-amz-tagging-count.
    s3.delete_object_tagging()
        .bucket(B)
        .key("tagged")
        .send()
        .await?;
    ensure!(
        tags_of(s3, "tagged").await?.is_empty(),
        "tags after DeleteObjectTagging"
    );
    let got = s3.get_object().bucket(B).key("tagged").send().await?;
    ensure!(
        got.tag_count().is_none(),
        "x-amz-tagging-count {:?}",
        got.tag_count()
    );
    for key in ["tagged", "tagged-copy", "tagged-mp"] {
        s3.delete_object().bucket(B).key(key).send().await?;
    }
    Ok(())
}

/// Content-MD5 and `x-amz-checksum-*` on PutObject.
async fn integrity(s3: &aws_sdk_s3::Client, seed: u64) -> Result<()> {
    // ---- Integrity: Content-MD5 and x-amz-checksum-*.
    let body = random_bytes(seed, 64 * 1024);
    let wrong_md5 = B64.encode(Md5::digest(b"something else"));
    expect_error::<_, PutObjectError>(
        "PutObject with a wrong Content-MD5",
        s3.put_object()
            .bucket(B)
            .key("digest")
            .body(ByteStream::from(body.clone()))
            .content_md5(wrong_md5)
            .send()
            .await,
        400,
        Some("BadDigest"),
    )?;
    expect_error::<_, GetObjectError>(
        "GET after a BadDigest PUT",
        s3.get_object().bucket(B).key("digest").send().await,
        404,
        Some("NoSuchKey"),
    )?;
    s3.put_object()
        .bucket(B)
        .key("digest")
        .body(ByteStream::from(body.clone()))
        .content_md5(B64.encode(Md5::digest(&body)))
        .send()
        .await
        .context("PutObject with the right Content-MD5")?;
    assert_object(s3, B, "digest", &body).await?;

    let crc = crc32c_b64(&body);
    let out = s3
        .put_object()
        .bucket(B)
        .key("crc32c")
        .body(ByteStream::from(body.clone()))
        .checksum_algorithm(ChecksumAlgorithm::Crc32C)
        .send()
        .await?;
    ensure!(
        out.checksum_crc32_c() == Some(crc.as_str()),
        "PutObject CRC32C {:?}, want {crc}",
        out.checksum_crc32_c()
    );
    let got = s3
        .get_object()
        .bucket(B)
        .key("crc32c")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await?;
    ensure!(
        got.checksum_crc32_c() == Some(crc.as_str()),
        "GET CRC32C {:?}, want {crc}",
        got.checksum_crc32_c()
    );
    ensure!(
        got.body.collect().await?.into_bytes() == body,
        "GET body of crc32c differs"
    );
    let head = s3
        .head_object()
        .bucket(B)
        .key("crc32c")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await?;
    ensure!(
        head.checksum_crc32_c() == Some(crc.as_str()),
        "HEAD CRC32C {:?}, want {crc}",
        head.checksum_crc32_c()
    );
    expect_error::<_, PutObjectError>(
        "PutObject with a wrong x-amz-checksum-crc32c",
        s3.put_object()
            .bucket(B)
            .key("crc32c-wrong")
            .body(ByteStream::from(body.clone()))
            .checksum_crc32_c(crc32c_b64(b"other"))
            .send()
            .await,
        400,
        Some("BadDigest"),
    )?;
    // Not base64 of a 32-byte digest: it can match no body.
    expect_error::<_, PutObjectError>(
        "PutObject with x-amz-checksum-sha256: bad",
        s3.put_object()
            .bucket(B)
            .key("sha256-bad")
            .body(ByteStream::from(body.clone()))
            .checksum_sha256("bad")
            .send()
            .await,
        400,
        Some("BadDigest"),
    )?;
    Ok(())
}

/// Multipart checksums: FULL_OBJECT CRC32 uploads at `full-crc` and
/// `full-crc-2`; returns the whole object's CRC32 (base64).
async fn multipart_checksums(s3: &aws_sdk_s3::Client, seed: u64) -> Result<String> {
    // ---- Multipart checksums: the type is fixed at create. A FULL_OBJECT
    // CRC32 upload completed without naming the type gets the CRC32 of the
    // whole object; a wrong or malformed whole-object value, another
    // algorithm or another type is refused and changes nothing.
    let full = random_bytes(seed + 5, 5 * MIB + 1000);
    let (full_id, full_parts) = full_object_crc32_upload(s3, "full-crc", &full).await?;
    let want_crc = crc32_b64(&full);
    let complete_full =
        |crc32: Option<String>, sha256: Option<String>, checksum_type: Option<ChecksumType>| {
            s3.complete_multipart_upload()
                .bucket(B)
                .key("full-crc")
                .upload_id(&full_id)
                .multipart_upload(
                    aws_sdk_s3::types::CompletedMultipartUpload::builder()
                        .set_parts(Some(full_parts.clone()))
                        .build(),
                )
                .set_checksum_crc32(crc32)
                .set_checksum_sha256(sha256)
                .set_checksum_type(checksum_type)
                .send()
        };
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete FULL_OBJECT with a wrong CRC32",
        complete_full(Some(crc32_b64(b"other")), None, None).await,
        400,
        Some("BadDigest"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete with x-amz-checksum-sha256: bad",
        complete_full(None, Some("bad".into()), None).await,
        400,
        Some("InvalidRequest"),
    )?;
    expect_error::<_, CompleteMultipartUploadError>(
        "Complete naming COMPOSITE for a FULL_OBJECT upload",
        complete_full(None, None, Some(ChecksumType::Composite)).await,
        400,
        Some("InvalidRequest"),
    )?;
    let done = complete_full(Some(want_crc.clone()), None, None)
        .await
        .context("Complete FULL_OBJECT with the right CRC32")?;
    ensure!(
        done.checksum_crc32() == Some(want_crc.as_str())
            && done.checksum_type() == Some(&ChecksumType::FullObject),
        "Complete FULL_OBJECT: CRC32 {:?} type {:?}, want {want_crc} FULL_OBJECT",
        done.checksum_crc32(),
        done.checksum_type()
    );
    let head = s3
        .head_object()
        .bucket(B)
        .key("full-crc")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await?;
    ensure!(
        head.checksum_crc32() == Some(want_crc.as_str())
            && head.checksum_type() == Some(&ChecksumType::FullObject),
        "HEAD FULL_OBJECT: CRC32 {:?} type {:?}",
        head.checksum_crc32(),
        head.checksum_type()
    );
    assert_object(s3, B, "full-crc", &full).await?;
    // Without the type at Complete either (the upload's type is used).
    let (full2_id, parts2) = full_object_crc32_upload(s3, "full-crc-2", &full).await?;
    let done = complete(s3, B, "full-crc-2", &full2_id, parts2).await;
    done.context("Complete FULL_OBJECT without a checksum")?;
    let head = s3
        .head_object()
        .bucket(B)
        .key("full-crc-2")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await?;
    ensure!(
        head.checksum_crc32() == Some(want_crc.as_str()),
        "HEAD of a FULL_OBJECT upload completed without the type: CRC32 {:?}, want {want_crc}",
        head.checksum_crc32()
    );
    Ok(want_crc)
}

/// GetObjectAttributes of `single` (b"one part") and of `full-crc` (a
/// 2-part FULL_OBJECT CRC32 upload whose checksum is `want_crc`);
/// GetBucketVersioning; SSE refused.
async fn attributes_versioning_and_sse(s3: &aws_sdk_s3::Client, want_crc: &str) -> Result<()> {
    // ---- GetObjectAttributes and GetBucketVersioning.
    let attrs = |key: &'static str, names: &[&str]| {
        let mut r = s3.get_object_attributes().bucket(B).key(key);
        for n in names {
            r = r.object_attributes(ObjectAttributes::from(*n));
        }
        r
    };
    let single = attrs(
        "single",
        &["ETag", "ObjectSize", "StorageClass", "ObjectParts"],
    )
    .send()
    .await?;
    let want_etag = quoted(&md5_hex(b"one part"));
    ensure!(
        single.e_tag() == Some(want_etag.as_str())
            && single.object_size() == Some(8)
            && single.storage_class() == Some(&StorageClass::Standard)
            && single.object_parts().is_none()
            && single.checksum().is_none()
            && single.last_modified().is_some(),
        "GetObjectAttributes of a single-part object: {single:?}"
    );
    let multi = attrs("full-crc", &["Checksum", "ObjectParts"])
        .max_parts(1)
        .send()
        .await?;
    let parts = multi
        .object_parts()
        .context("ObjectParts of a multipart object")?;
    let listed: Vec<(Option<i32>, Option<i64>)> = parts
        .parts()
        .iter()
        .map(|p| (p.part_number(), p.size()))
        .collect();
    ensure!(
        multi.checksum().and_then(|c| c.checksum_crc32()) == Some(want_crc)
            && multi.checksum().and_then(|c| c.checksum_type()) == Some(&ChecksumType::FullObject)
            && multi.e_tag().is_none()
            && multi.object_size().is_none()
            && parts.total_parts_count() == Some(2)
            && parts.is_truncated() == Some(true)
            && parts.next_part_number_marker() == Some("1")
            && listed == [(Some(1), Some(5 * MIB as i64))],
        "GetObjectAttributes of a 2-part FULL_OBJECT upload, max-parts 1: {multi:?}"
    );
    let rest = attrs("full-crc", &["ObjectParts"])
        .part_number_marker("1")
        .send()
        .await?;
    let rest = rest.object_parts().context("second page of ObjectParts")?;
    let listed: Vec<Option<i32>> = rest.parts().iter().map(|p| p.part_number()).collect();
    ensure!(
        rest.is_truncated() == Some(false) && listed == [Some(2)],
        "GetObjectAttributes after part 1: {rest:?}"
    );
    expect_error::<_, GetObjectAttributesError>(
        "GetObjectAttributes with an unknown attribute",
        attrs("single", &["ETag", "Colour"]).send().await,
        400,
        Some("InvalidArgument"),
    )?;
    expect_error::<_, GetObjectAttributesError>(
        "GetObjectAttributes of a missing key",
        attrs("no-such-key", &["ETag"]).send().await,
        404,
        Some("NoSuchKey"),
    )?;
    let versioning = s3.get_bucket_versioning().bucket(B).send().await?;
    ensure!(
        versioning.status().is_none() && versioning.mfa_delete().is_none(),
        "GetBucketVersioning of a never-versioned bucket: {versioning:?}"
    );
    expect_error::<_, GetBucketVersioningError>(
        "GetBucketVersioning of a missing bucket",
        s3.get_bucket_versioning().bucket("missing").send().await,
        404,
        Some("NoSuchBucket"),
    )?;

    // ---- Server-side encryption is refused, not silently ignored.
    expect_error::<_, PutObjectError>(
        "PutObject asking for SSE-S3",
        s3.put_object()
            .bucket(B)
            .key("encrypted")
            .server_side_encryption(ServerSideEncryption::Aes256)
            .body(ByteStream::from_static(b"secret"))
            .send()
            .await,
        501,
        Some("NotImplemented"),
    )?;
    expect_error::<_, GetObjectError>(
        "GET of the refused SSE object",
        s3.get_object().bucket(B).key("encrypted").send().await,
        404,
        Some("NoSuchKey"),
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_voter_s3_errors_and_object_semantics() -> Result<()> {
    let seed = test_seed("s3_errors");
    let mut c = TestCluster::start(1, 6).await?;
    let s3 = c.s3();

    // ---- Buckets.
    s3.create_bucket().bucket(B).send().await?;
    s3.create_bucket()
        .bucket(B)
        .send()
        .await
        .context("re-creating an owned bucket must answer 200 (us-east-1)")?;
    for bad in ["Invalid_Bucket", "ab", "-leading-dash", "192.168.1.1"] {
        expect_error::<_, CreateBucketError>(
            &format!("CreateBucket {bad}"),
            s3.create_bucket().bucket(bad).send().await,
            400,
            Some("InvalidBucketName"),
        )?;
    }
    let buckets = s3.list_buckets().send().await?;
    let names: Vec<&str> = buckets.buckets().iter().filter_map(|b| b.name()).collect();
    ensure!(names == [B], "ListBuckets: {names:?}");
    s3.head_bucket().bucket(B).send().await?;
    s3.get_bucket_location().bucket(B).send().await?;
    expect_error::<_, HeadBucketError>(
        "HeadBucket missing",
        s3.head_bucket().bucket("missing").send().await,
        404,
        None,
    )?;
    expect_error::<_, ListObjectsV2Error>(
        "ListObjectsV2 on a missing bucket",
        s3.list_objects_v2().bucket("missing").send().await,
        404,
        Some("NoSuchBucket"),
    )?;
    expect_error::<_, PutObjectError>(
        "PutObject into a missing bucket",
        s3.put_object()
            .bucket("missing")
            .key("k")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await,
        404,
        Some("NoSuchBucket"),
    )?;

    // ---- NoSuchKey, with the XML error body S3 clients parse.
    let err = expect_error::<_, GetObjectError>(
        "GetObject of a missing key",
        s3.get_object().bucket(B).key("no/such/key").send().await,
        404,
        Some("NoSuchKey"),
    )?;
    let body = err
        .raw_response()
        .and_then(|r| r.body().bytes())
        .map(|b| String::from_utf8_lossy(b).into_owned());
    let body = body.context("NoSuchKey error without a body")?;
    for element in [
        "<Code>NoSuchKey</Code>",
        "<Message>",
        "<Resource>",
        "<RequestId>",
    ] {
        ensure!(
            body.contains(element),
            "NoSuchKey body lacks {element}: {body}"
        );
    }

    Box::pin(object_semantics(&s3, seed)).await?;

    Box::pin(multipart_errors(&s3, seed)).await?;

    Box::pin(object_tagging(&s3, seed)).await?;

    // ---- BucketNotEmpty while objects or uploads exist.
    expect_error::<_, DeleteBucketError>(
        "DeleteBucket with objects",
        s3.delete_bucket().bucket(B).send().await,
        409,
        Some("BucketNotEmpty"),
    )?;
    s3.create_bucket().bucket("uploads-only").send().await?;
    let open_id = create_upload(&s3, "uploads-only", "k").await?;
    expect_error::<_, DeleteBucketError>(
        "DeleteBucket with an open upload",
        s3.delete_bucket().bucket("uploads-only").send().await,
        409,
        Some("BucketNotEmpty"),
    )?;
    s3.abort_multipart_upload()
        .bucket("uploads-only")
        .key("k")
        .upload_id(&open_id)
        .send()
        .await?;
    s3.delete_bucket()
        .bucket("uploads-only")
        .send()
        .await
        .context("DeleteBucket once empty")?;
    expect_error::<_, HeadBucketError>(
        "HeadBucket after DeleteBucket",
        s3.head_bucket().bucket("uploads-only").send().await,
        404,
        None,
    )?;

    // ---- Authentication.
    expect_error::<_, ListBucketsError>(
        "ListBuckets with a wrong secret key",
        c.s3_with(ACCESS_KEY, "wrong-secret-key")
            .list_buckets()
            .send()
            .await,
        403,
        Some("SignatureDoesNotMatch"),
    )?;
    expect_error::<_, PutObjectError>(
        "PutObject with a wrong secret key",
        c.s3_with(ACCESS_KEY, "wrong-secret-key")
            .put_object()
            .bucket(B)
            .key("forged")
            .body(ByteStream::from_static(b"forged"))
            .send()
            .await,
        403,
        Some("SignatureDoesNotMatch"),
    )?;
    // An access key neither root nor stored in meta: 403 InvalidAccessKeyId, as AWS.
    expect_error::<_, ListBucketsError>(
        "ListBuckets with an unknown access key",
        c.s3_with("UNKNOWNACCESSKEY", "whatever")
            .list_buckets()
            .send()
            .await,
        403,
        Some("InvalidAccessKeyId"),
    )?;
    expect_error::<_, GetObjectError>(
        "GET of the forged PUT",
        s3.get_object().bucket(B).key("forged").send().await,
        404,
        Some("NoSuchKey"),
    )?;

    c.stop_all().await?;
    Ok(())
}

/// The indices of the requests that succeeded.
fn winners<T, E>(outcomes: &[std::result::Result<T, E>]) -> Vec<usize> {
    outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_ok())
        .map(|(i, _)| i)
        .collect()
}

/// Conditional writes racing each other: writers that all pass the
/// gateway's early check (no object yet, or the same current ETag) must
/// not all commit. Meta checks the condition in the commit's own log entry,
/// so exactly one wins each round and the object holds the winner's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_conditional_writes_commit_exactly_once() -> Result<()> {
    const WRITERS: usize = 6;
    let seed = test_seed("conditional_race");
    let c = TestCluster::start(1, 6).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("race-b").send().await?;
    for round in 0..3u64 {
        let key = format!("k{round}");
        // Round 0-2: If-None-Match: * on a missing key.
        let bodies: Vec<Bytes> = (0..WRITERS as u64)
            .map(|i| random_bytes(seed ^ (round * 100 + i), 512 * 1024))
            .collect();
        let outcomes = futures::future::join_all(bodies.iter().map(|body| {
            s3.put_object()
                .bucket("race-b")
                .key(&key)
                .if_none_match("*")
                .body(ByteStream::from(body.clone()))
                .send()
        }))
        .await;
        let won = winners(&outcomes);
        ensure!(
            won.len() == 1,
            "round {round}: {} writers committed: {won:?}",
            won.len()
        );
        for (i, o) in outcomes.into_iter().enumerate() {
            if i != won[0] {
                expect_error(&format!("loser {i}"), o, 412, Some("PreconditionFailed"))?;
            }
        }
        let stored = s3.get_object().bucket("race-b").key(&key).send().await?;
        let etag = stored.e_tag().unwrap_or_default().to_string();
        let got = stored.body.collect().await?.into_bytes();
        ensure!(
            got == bodies[won[0]],
            "round {round}: not the winner's bytes"
        );

        // Then If-Match on the winner's ETag: again exactly one.
        let outcomes = futures::future::join_all(bodies.iter().map(|body| {
            s3.put_object()
                .bucket("race-b")
                .key(&key)
                .if_match(&etag)
                .body(ByteStream::from(body.slice(1..)))
                .send()
        }))
        .await;
        let won = winners(&outcomes);
        ensure!(won.len() == 1, "round {round} If-Match: {won:?} committed");
        let got = get_all(&s3, "race-b", &key).await?;
        ensure!(
            got == bodies[won[0]].slice(1..),
            "round {round}: If-Match winner's bytes"
        );
    }
    Ok(())
}
