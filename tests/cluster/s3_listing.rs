//! Listing pagination (objects, uploads, buckets), UploadPartCopy,
//! presigned URLs and virtual-hosted-style addressing through `aws-sdk-s3`,
//! on a cluster with a single meta voter.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::operation::list_buckets::ListBucketsError;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::types::EncodingType;
use aws_smithy_runtime_api::client::dns::{DnsFuture, ResolveDns};
use bytes::Bytes;

use crate::fixtures::{Setup, TestCluster};
use crate::{
    MIB, Upload, assert_object, complete, create_upload, multipart_etag, put, quoted, random_bytes,
    test_seed, upload_parts,
};
use crate::{RawResponse, raw_request};

const B: &str = "listing";
/// A second bucket (ListBuckets pages, virtual-hosted requests).
const B2: &str = "listing-vh";
/// The gateway's root domain for virtual-hosted-style requests.
const ROOT_DOMAIN: &str = "s3.example.test";

/// Resolves every name to 127.0.0.1, so `<bucket>.s3.example.test` reaches
/// the test gateway.
#[derive(Debug, Clone)]
struct Loopback;

impl ResolveDns for Loopback {
    fn resolve_dns<'a>(&'a self, _name: &'a str) -> DnsFuture<'a> {
        DnsFuture::ready(Ok(vec![IpAddr::from([127, 0, 0, 1])]))
    }
}

/// An S3 client addressing buckets virtual-hosted style,
/// `http://<bucket>.s3.example.test:<port>/<key>`, resolved to the gateway.
fn virtual_hosted_client(c: &TestCluster) -> aws_sdk_s3::Client {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .pool_idle_timeout(crate::fixtures::S3_CLIENT_POOL_IDLE_TIMEOUT)
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .build_with_resolver(Loopback);
    let port = c.gateway.addr().port();
    let config = c
        .s3()
        .config()
        .to_builder()
        .http_client(http)
        .endpoint_url(format!("http://{ROOT_DOMAIN}:{port}"))
        .force_path_style(false)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// Keys in UTF-8 binary order: 'Z' (0x5A) < 'a' < 's' < 'z' (0x7A) < 'é' (0xC3 0xA9).
const KEYS: [&str; 6] = ["pg/Z", "pg/a", "pg/sub/1", "pg/sub/2", "pg/z", "pg/é"];

/// One ListObjectsV2 page: (keys, common prefixes, is_truncated).
type Page = (Vec<String>, Vec<String>, bool);

async fn list_v2_pages(
    s3: &aws_sdk_s3::Client,
    delimiter: Option<&str>,
    max_keys: i32,
) -> Result<Vec<Page>> {
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let out = s3
            .list_objects_v2()
            .bucket(B)
            .prefix("pg/")
            .set_delimiter(delimiter.map(str::to_string))
            .max_keys(max_keys)
            .set_continuation_token(token.clone())
            .send()
            .await?;
        let keys = out
            .contents()
            .iter()
            .filter_map(|o| o.key())
            .map(str::to_string)
            .collect();
        let prefixes = out
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix())
            .map(str::to_string)
            .collect();
        let truncated = out.is_truncated() == Some(true);
        pages.push((keys, prefixes, truncated));
        if !truncated {
            return Ok(pages);
        }
        token = Some(
            out.next_continuation_token()
                .context("truncated page without NextContinuationToken")?
                .to_string(),
        );
        ensure!(
            pages.len() <= KEYS.len(),
            "pagination does not end: {pages:?}"
        );
    }
}

fn page(keys: &[&str], prefixes: &[&str], truncated: bool) -> Page {
    (
        keys.iter().map(|s| s.to_string()).collect(),
        prefixes.iter().map(|s| s.to_string()).collect(),
        truncated,
    )
}

/// Sends a plain HTTP/1.1 GET for `uri` with `headers`; returns status and body.
async fn raw_get(uri: &str, headers: &[(String, String)]) -> Result<(u16, Vec<u8>)> {
    let r = raw_request("GET", uri, headers).await?;
    Ok((r.status, r.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_voter_listing_part_copy_and_presigned_urls() -> Result<()> {
    let seed = test_seed("s3_listing");
    let setup = Setup {
        gateway: Some(|g: &mut sluice_gateway::Config| {
            g.root_domains = vec![ROOT_DOMAIN.to_string()];
        }),
        ..Setup::default()
    };
    let mut c = TestCluster::start_setup(1, 6, setup).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket(B).send().await?;
    // Inserted out of order on purpose.
    for key in KEYS.iter().rev() {
        put(&s3, B, key, &Bytes::from(key.as_bytes().to_vec())).await?;
    }

    // ---- ListObjectsV2: max-keys and continuation tokens, with and without a delimiter.
    let pages = list_v2_pages(&s3, None, 2).await?;
    let want = vec![
        page(&["pg/Z", "pg/a"], &[], true),
        page(&["pg/sub/1", "pg/sub/2"], &[], true),
        page(&["pg/z", "pg/é"], &[], false),
    ];
    ensure!(
        pages == want,
        "ListObjectsV2 max-keys=2 pages {pages:?}, want {want:?}"
    );
    let pages = list_v2_pages(&s3, Some("/"), 2).await?;
    let want = vec![
        page(&["pg/Z", "pg/a"], &[], true),
        page(&["pg/z"], &["pg/sub/"], true),
        page(&["pg/é"], &[], false),
    ];
    ensure!(
        pages == want,
        "ListObjectsV2 delimiter max-keys=2 pages {pages:?}, want {want:?}"
    );

    let out = s3
        .list_objects_v2()
        .bucket(B)
        .prefix("pg/")
        .start_after("pg/sub/2")
        .send()
        .await?;
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(keys == ["pg/z", "pg/é"], "start-after pg/sub/2: {keys:?}");

    // ---- ListObjects (v1): marker, and NextMarker with a delimiter.
    let out = s3
        .list_objects()
        .bucket(B)
        .prefix("pg/")
        .max_keys(3)
        .send()
        .await?;
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(
        keys == ["pg/Z", "pg/a", "pg/sub/1"],
        "ListObjects max-keys=3: {keys:?}"
    );
    ensure!(
        out.is_truncated() == Some(true),
        "ListObjects IsTruncated {:?}",
        out.is_truncated()
    );
    let out = s3
        .list_objects()
        .bucket(B)
        .prefix("pg/")
        .marker("pg/sub/1")
        .send()
        .await?;
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(
        keys == ["pg/sub/2", "pg/z", "pg/é"],
        "ListObjects marker=pg/sub/1: {keys:?}"
    );
    let out = s3
        .list_objects()
        .bucket(B)
        .prefix("pg/")
        .delimiter("/")
        .max_keys(3)
        .send()
        .await?;
    let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    ensure!(
        keys == ["pg/Z", "pg/a"] && prefixes == ["pg/sub/"],
        "ListObjects delimiter: {keys:?} {prefixes:?}"
    );
    ensure!(
        out.next_marker() == Some("pg/sub/"),
        "NextMarker {:?}",
        out.next_marker()
    );

    // ---- ListMultipartUploads with prefix and delimiter.
    let up_a = create_upload(&s3, B, "up/a").await?;
    let up_b = create_upload(&s3, B, "up/b/1").await?;
    let out = s3
        .list_multipart_uploads()
        .bucket(B)
        .prefix("up/")
        .delimiter("/")
        .send()
        .await?;
    let uploads: Vec<(Option<&str>, Option<&str>)> = out
        .uploads()
        .iter()
        .map(|u| (u.key(), u.upload_id()))
        .collect();
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    ensure!(
        uploads == [(Some("up/a"), Some(up_a.as_str()))] && prefixes == ["up/b/"],
        "ListMultipartUploads: {uploads:?} {prefixes:?}"
    );
    for (key, id) in [("up/a", &up_a), ("up/b/1", &up_b)] {
        s3.abort_multipart_upload()
            .bucket(B)
            .key(key)
            .upload_id(id)
            .send()
            .await?;
    }

    // ---- UploadPartCopy with a range, then a regular last part.
    let src = random_bytes(seed, 7 * MIB);
    put(&s3, B, "src", &src).await?;
    let dst_id = create_upload(&s3, B, "dst").await?;
    let copied = s3
        .upload_part_copy()
        .bucket(B)
        .key("dst")
        .upload_id(&dst_id)
        .part_number(1)
        .copy_source(format!("{B}/src"))
        .copy_source_range(format!("bytes={}-{}", MIB, 6 * MIB - 1))
        .send()
        .await?;
    let range = &src[MIB..6 * MIB];
    let want_etag = quoted(&crate::md5_hex(range));
    let got_etag = copied.copy_part_result().and_then(|r| r.e_tag());
    ensure!(
        got_etag == Some(want_etag.as_str()),
        "UploadPartCopy ETag {got_etag:?}"
    );
    let tail = random_bytes(seed + 1, 1000);
    let upload = Upload {
        s3: &s3,
        bucket: B,
        key: "dst",
        upload_id: &dst_id,
    };
    let mut parts = vec![
        aws_sdk_s3::types::CompletedPart::builder()
            .part_number(1)
            .e_tag(&want_etag)
            .build(),
    ];
    parts.extend(upload_parts(&upload, &tail, MIB, 2, 1).await?);
    let etag = complete(&s3, B, "dst", &dst_id, parts).await?;
    let want = quoted(&multipart_etag([range, &tail[..]]));
    ensure!(
        etag == want,
        "ETag of the copied upload {etag}, want {want}"
    );
    let mut whole = range.to_vec();
    whole.extend_from_slice(&tail);
    assert_object(&s3, B, "dst", &whole).await?;

    // ---- Presigned GET: valid URL answers 200 with the body; a tampered one 403.
    let presigned = s3
        .get_object()
        .bucket(B)
        .key("pg/é")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300))?)
        .await?;
    let headers: Vec<(String, String)> = presigned
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (status, body) = raw_get(presigned.uri(), &headers).await?;
    ensure!(
        status == 200 && body == "pg/é".as_bytes(),
        "presigned GET: {status} {:?}",
        String::from_utf8_lossy(&body)
    );
    let tampered = presigned
        .uri()
        .replace("X-Amz-Expires=300", "X-Amz-Expires=301");
    ensure!(
        tampered != presigned.uri(),
        "presigned URL lacks X-Amz-Expires=300: {}",
        presigned.uri()
    );
    let (status, body) = raw_get(&tampered, &headers).await?;
    let body = String::from_utf8_lossy(&body);
    ensure!(
        status == 403 && body.contains("<Code>SignatureDoesNotMatch</Code>"),
        "tampered presigned GET: {status} {body}"
    );
    // Validity past 7 days (604800 s) or negative: 403 AccessDenied, before
    // the signature is looked at (the SDK refuses to presign past 7 days,
    // so the URL's X-Amz-Expires is rewritten).
    for expires in ["609901", "-7"] {
        let url = presigned
            .uri()
            .replace("X-Amz-Expires=300", &format!("X-Amz-Expires={expires}"));
        let (status, body) = raw_get(&url, &headers).await?;
        let body = String::from_utf8_lossy(&body);
        ensure!(
            status == 403 && body.contains("<Code>AccessDenied</Code>"),
            "presigned GET with X-Amz-Expires={expires}: {status} {body}"
        );
    }
    // A CORS preflight without Origin: 400.
    let RawResponse { status, body, .. } = raw_request("OPTIONS", presigned.uri(), &[]).await?;
    ensure!(
        status == 400,
        "OPTIONS on a presigned URL: {status} {}",
        String::from_utf8_lossy(&body)
    );

    // ---- ListObjects (v1) with encoding-type=url: the top-level Prefix
    // comes back as sent (V2 encodes it).
    let out = s3
        .list_objects()
        .bucket(B)
        .prefix("\n")
        .encoding_type(EncodingType::Url)
        .send()
        .await?;
    ensure!(
        out.prefix() == Some("\n"),
        "ListObjects v1 Prefix with encoding-type=url: {:?}",
        out.prefix()
    );
    let out = s3
        .list_objects_v2()
        .bucket(B)
        .prefix("\n")
        .encoding_type(EncodingType::Url)
        .send()
        .await?;
    ensure!(
        out.prefix() == Some("%0A"),
        "ListObjectsV2 Prefix with encoding-type=url: {:?}",
        out.prefix()
    );

    // ---- ListBuckets: max-buckets pages with a continuation token; prefix.
    s3.create_bucket().bucket(B2).send().await?;
    let first = s3.list_buckets().max_buckets(1).send().await?;
    let names: Vec<&str> = first.buckets().iter().filter_map(|b| b.name()).collect();
    let token = first
        .continuation_token()
        .context("ListBuckets max-buckets=1 of 2: no ContinuationToken")?;
    ensure!(names == [B], "ListBuckets page 1: {names:?}");
    let second = s3
        .list_buckets()
        .max_buckets(1)
        .continuation_token(token)
        .send()
        .await?;
    let names: Vec<&str> = second.buckets().iter().filter_map(|b| b.name()).collect();
    ensure!(
        names == [B2] && second.continuation_token().is_none(),
        "ListBuckets page 2: {names:?} token {:?}",
        second.continuation_token()
    );
    let all = s3.list_buckets().send().await?;
    let names: Vec<&str> = all.buckets().iter().filter_map(|b| b.name()).collect();
    ensure!(
        names == [B, B2] && all.continuation_token().is_none(),
        "ListBuckets without max-buckets: {names:?}"
    );
    let prefixed = s3.list_buckets().prefix(B2).send().await?;
    let names: Vec<&str> = prefixed.buckets().iter().filter_map(|b| b.name()).collect();
    ensure!(
        names == [B2] && prefixed.prefix() == Some(B2),
        "ListBuckets prefix={B2}: {names:?} {:?}",
        prefixed.prefix()
    );
    crate::expect_error::<_, ListBucketsError>(
        "ListBuckets max-buckets=0",
        s3.list_buckets().max_buckets(0).send().await,
        400,
        Some("InvalidArgument"),
    )?;

    // ---- Virtual-hosted style under the configured root domain; path
    // style keeps working.
    let vhost = virtual_hosted_client(&c);
    let body = Bytes::from_static(b"virtual-hosted");
    vhost
        .put_object()
        .bucket(B2)
        .key("vh/k")
        .body(body.clone().into())
        .send()
        .await
        .context("virtual-hosted PUT")?;
    assert_object(&s3, B2, "vh/k", &body).await?;
    let got = vhost
        .get_object()
        .bucket(B2)
        .key("vh/k")
        .send()
        .await
        .context("virtual-hosted GET")?
        .body
        .collect()
        .await?
        .into_bytes();
    ensure!(got == body, "virtual-hosted GET returned {got:?}");
    let listed = vhost.list_objects_v2().bucket(B2).send().await?;
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(keys == ["vh/k"], "virtual-hosted ListObjectsV2: {keys:?}");
    s3.delete_object().bucket(B2).key("vh/k").send().await?;
    s3.delete_bucket().bucket(B2).send().await?;

    c.stop_all().await?;
    Ok(())
}

/// ListObjectVersions of a bucket without versioning (each object is its
/// only version, `null`), paged by key and version-id markers; a self-copy
/// that only changes the storage class; request payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unversioned_object_versions_storage_class_copy_and_payer() -> Result<()> {
    use aws_sdk_s3::types::{Payer, RequestPaymentConfiguration, StorageClass};
    let c = TestCluster::start(1, 6).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("versions-b").send().await?;
    let data = Bytes::from_static(b"v");
    for key in ["a", "b/1", "b/2", "c"] {
        crate::put(&s3, "versions-b", key, &data).await?;
    }
    let page = s3
        .list_object_versions()
        .bucket("versions-b")
        .max_keys(2)
        .send()
        .await?;
    let keys: Vec<(&str, &str, bool)> = page
        .versions()
        .iter()
        .map(|v| {
            (
                v.key().unwrap_or_default(),
                v.version_id().unwrap_or_default(),
                v.is_latest().unwrap_or(false),
            )
        })
        .collect();
    ensure!(
        keys == [("a", "null", true), ("b/1", "null", true)],
        "{keys:?}"
    );
    ensure!(
        page.is_truncated() == Some(true)
            && page.next_key_marker() == Some("b/1")
            && page.next_version_id_marker() == Some("null"),
        "{page:?}"
    );
    let rest = s3
        .list_object_versions()
        .bucket("versions-b")
        .key_marker("b/1")
        .version_id_marker("null")
        .send()
        .await?;
    let keys: Vec<&str> = rest.versions().iter().filter_map(|v| v.key()).collect();
    ensure!(
        keys == ["b/2", "c"] && rest.is_truncated() == Some(false),
        "{rest:?}"
    );
    let grouped = s3
        .list_object_versions()
        .bucket("versions-b")
        .delimiter("/")
        .send()
        .await?;
    let prefixes: Vec<&str> = grouped
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    ensure!(
        prefixes == ["b/"] && grouped.versions().len() == 2,
        "{grouped:?}"
    );
    crate::expect_error(
        "a version id that cannot exist",
        s3.list_object_versions()
            .bucket("versions-b")
            .key_marker("a")
            .version_id_marker("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
            .send()
            .await,
        400,
        Some("InvalidArgument"),
    )?;

    // `rclone settier`: a self-copy changing only the storage class.
    s3.copy_object()
        .bucket("versions-b")
        .key("a")
        .copy_source("versions-b/a")
        .storage_class(StorageClass::StandardIa)
        .send()
        .await?;
    ensure!(crate::get_all(&s3, "versions-b", "a").await? == data);

    s3.put_bucket_request_payment()
        .bucket("versions-b")
        .request_payment_configuration(
            RequestPaymentConfiguration::builder()
                .payer(Payer::BucketOwner)
                .build()?,
        )
        .send()
        .await?;
    crate::expect_error(
        "Requester Pays",
        s3.put_bucket_request_payment()
            .bucket("versions-b")
            .request_payment_configuration(
                RequestPaymentConfiguration::builder()
                    .payer(Payer::Requester)
                    .build()?,
            )
            .send()
            .await,
        501,
        Some("NotImplemented"),
    )?;
    Ok(())
}
