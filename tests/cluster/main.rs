//! In-process cluster tests: meta voters, datanodes and a gateway started
//! on port-0 listeners inside the test process, driven by `aws-sdk-s3`.
//!
//! # Layout
//! * [`fixtures`] — `TestCluster`: start, stop and restart single processes
//!   on the same directory and address; condition waits with timeouts.
//! * `scenario` — the 3-voter failure and restart scenario (100 MiB
//!   multipart object, ranged reads, listing, abort, datanode and meta leader
//!   loss, full restart).
//! * `s3_errors` — S3 error codes and object semantics on a 1-voter cluster.
//! * `s3_listing` — listing pagination and order, ListMultipartUploads,
//!   UploadPartCopy and presigned URLs on a 1-voter cluster.
//! * `durability` — heal, wiped disks, exactly-once commits, readers and
//!   overwrites, write epochs fencing a paused gateway, full datanodes,
//!   scrub (`docs/design/durability.md`).
//! * `lifecycle` — bucket lifecycle rules run by the meta leader (a day of
//!   2 s): expiration, aborted uploads, the configuration's errors.
//! * `public_access` — canned ACLs, bucket policies, anonymous requests,
//!   bucket tagging and CORS (preflights over raw HTTP/1.1).
//! * `small_objects` — bodies up to `inline_max_bytes` stored inline in
//!   their metadata record: reads, copies, overwrites, faults.
//! * `versioning` — S3 versioning: version ids, delete markers,
//!   ListObjectVersions, copies from a version, suspended buckets; dropped
//!   responses retried, GC and heal of noncurrent versions.
//! * `access` — S3 over HTTPS with a test CA, access keys and per-bucket
//!   authorization, certificate reload on SIGHUP.
//! * `membership` — failure-domain placement (datanodes labelled on 3
//!   hosts), drain, remove and rebalance onto a new datanode, through the
//!   admin service.
//! * `meta_membership` — meta voters added, removed (the leader too) and
//!   replaced under a continuous write load; the refusals (last voter, no
//!   live quorum, change in progress, unknown id, not the leader).
//! * `tiny_budgets` — flow control on 4 MiB budgets: 32 concurrent
//!   multipart uploads complete within the gateway's buffer budget;
//!   `max_inflight_requests` and `stall_timeout` answer `503 SlowDown`.
//! * `admin_status` — `sluice.admin.Admin/Status` on a 3-voter cluster:
//!   voters, datanode states (one stopped), gateway epochs and memory.
//! * `listener` — S3 listener hardening (2,000 silent connections, a
//!   stalled body, an oversized signed aws-chunked chunk) and the health
//!   checks on the S3 port.
//! * this file — S3 helpers shared by the tests (data, ETags, uploads, reads,
//!   error assertions).
//!
//! Random data comes from a seed printed by each test; set
//! `SLUICE_TEST_SEED` to replay one.

mod access;
mod admin_status;
mod durability;
mod fixtures;
mod lifecycle;
mod listener;
mod membership;
mod meta_membership;
mod mtls;
mod public_access;
mod s3_errors;
mod s3_listing;
mod scenario;
mod small_objects;
mod tiny_budgets;
mod versioning;

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use md5::{Digest as _, Md5};
use rand::{RngCore, SeedableRng};
use sha2::Sha256;

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * 1024;

/// The seed for this run: `SLUICE_TEST_SEED` or a fixed default; printed so
/// a failing run can be replayed.
pub fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("SLUICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_C0DE);
    eprintln!("[{test}] SLUICE_TEST_SEED={seed}");
    seed
}

/// `len` deterministic pseudo-random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Bytes {
    let mut buf = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut buf);
    Bytes::from(buf)
}

pub fn md5_hex(data: &[u8]) -> String {
    hex::encode(Md5::digest(data))
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// S3's multipart ETag (without quotes): hex(MD5(concatenated binary part
/// MD5s)) + "-" + part count.
pub fn multipart_etag<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut concat = Vec::new();
    let mut n = 0;
    for p in parts {
        concat.extend_from_slice(&Md5::digest(p));
        n += 1;
    }
    format!("{}-{n}", hex::encode(Md5::digest(&concat)))
}

pub fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// Fails unless `got` equals `want`, naming the first differing offset.
pub fn assert_same_bytes(what: &str, got: &[u8], want: &[u8]) -> Result<()> {
    if got == want {
        return Ok(());
    }
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    bail!(
        "{what}: got {} bytes (sha256 {}), want {} bytes (sha256 {}); first differing offset {first_diff:?}",
        got.len(),
        sha256_hex(got),
        want.len(),
        sha256_hex(want)
    )
}

pub use sluice_tests::s3::get_all;

/// Reads a whole object and checks it against `want` (bytes and SHA-256).
pub async fn assert_object(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    want: &[u8],
) -> Result<()> {
    let got = get_all(s3, bucket, key).await?;
    ensure!(
        sha256_hex(&got) == sha256_hex(want),
        "GET {bucket}/{key}: SHA-256 differs"
    );
    assert_same_bytes(&format!("GET {bucket}/{key}"), &got, want)
}

/// GETs `range` (an HTTP Range header value) and checks the body against
/// `data[want]`, the status line's Content-Range and Content-Length.
pub async fn assert_range(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    data: &[u8],
    range: &str,
    want: std::ops::Range<usize>,
) -> Result<()> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .range(range)
        .send()
        .await
        .with_context(|| format!("GET {bucket}/{key} Range: {range}"))?;
    let expected_cr = format!("bytes {}-{}/{}", want.start, want.end - 1, data.len());
    ensure!(
        out.content_range() == Some(expected_cr.as_str()),
        "Range {range}: Content-Range {:?}, want {expected_cr}",
        out.content_range()
    );
    ensure!(
        out.content_length() == Some(want.len() as i64),
        "Range {range}: Content-Length {:?}, want {}",
        out.content_length(),
        want.len()
    );
    let body = out.body.collect().await?.into_bytes();
    assert_same_bytes(&format!("Range {range}"), &body, &data[want])
}

/// Uploads `data` cut into `part_size` parts, numbered from `first_part`,
/// with at most `in_flight` UploadPart requests at once. Checks each part's
/// ETag (MD5 of the part) and returns the parts sorted by number.
/// An open multipart upload.
pub struct Upload<'a> {
    pub s3: &'a aws_sdk_s3::Client,
    pub bucket: &'a str,
    pub key: &'a str,
    pub upload_id: &'a str,
}

pub async fn upload_parts(
    upload: &Upload<'_>,
    data: &Bytes,
    part_size: usize,
    first_part: i32,
    in_flight: usize,
) -> Result<Vec<CompletedPart>> {
    let Upload {
        s3,
        bucket,
        key,
        upload_id,
    } = *upload;
    let chunks: Vec<(i32, Bytes)> = (0..data.len().div_ceil(part_size))
        .map(|i| {
            let start = i * part_size;
            let end = (start + part_size).min(data.len());
            (first_part + i as i32, data.slice(start..end))
        })
        .collect();
    let mut parts: Vec<CompletedPart> = futures::stream::iter(chunks)
        .map(|(number, chunk)| async move {
            let want = quoted(&md5_hex(&chunk));
            let out = s3
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(number)
                .body(ByteStream::from(chunk))
                .send()
                .await
                .with_context(|| format!("UploadPart {number} of {bucket}/{key}"))?;
            ensure!(
                out.e_tag() == Some(want.as_str()),
                "part {number}: ETag {:?}, want {want}",
                out.e_tag()
            );
            Ok::<_, anyhow::Error>(
                CompletedPart::builder()
                    .part_number(number)
                    .e_tag(want)
                    .build(),
            )
        })
        .buffer_unordered(in_flight)
        .try_collect()
        .await?;
    parts.sort_by_key(|p| p.part_number());
    Ok(parts)
}

pub async fn create_upload(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<String> {
    let out = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .with_context(|| format!("CreateMultipartUpload {bucket}/{key}"))?;
    out.upload_id()
        .map(str::to_string)
        .context("CreateMultipartUpload answered without an upload id")
}

/// Completes an upload; returns the ETag (with quotes).
pub async fn complete(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    upload_id: &str,
    parts: Vec<CompletedPart>,
) -> Result<String> {
    let out = s3
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .with_context(|| format!("CompleteMultipartUpload {bucket}/{key}"))?;
    out.e_tag()
        .map(str::to_string)
        .context("CompleteMultipartUpload answered without an ETag")
}

/// Uploads `data` by multipart (`part_size` parts, `in_flight` at once),
/// completes it and checks the ETag. Returns the ETag (with quotes).
pub async fn multipart_put(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    data: &Bytes,
    part_size: usize,
    in_flight: usize,
) -> Result<String> {
    let started = Instant::now();
    let upload_id = create_upload(s3, bucket, key).await?;
    let upload = Upload {
        s3,
        bucket,
        key,
        upload_id: &upload_id,
    };
    let parts = upload_parts(&upload, data, part_size, 1, in_flight).await?;
    let etag = complete(s3, bucket, key, &upload_id, parts).await?;
    let want = quoted(&multipart_etag(data.chunks(part_size)));
    ensure!(
        etag == want,
        "multipart ETag of {bucket}/{key}: {etag}, want {want}"
    );
    eprintln!(
        "multipart PUT {bucket}/{key} ({} bytes) took {:?}",
        data.len(),
        started.elapsed()
    );
    Ok(etag)
}

/// Single PutObject; checks and returns the ETag (with quotes).
pub async fn put(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, data: &Bytes) -> Result<String> {
    let out = s3
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(data.clone()))
        .send()
        .await
        .with_context(|| format!("PutObject {bucket}/{key}"))?;
    let want = quoted(&md5_hex(data));
    ensure!(
        out.e_tag() == Some(want.as_str()),
        "PutObject {bucket}/{key}: ETag {:?}, want {want}",
        out.e_tag()
    );
    Ok(want)
}

pub use sluice_tests::s3::expect_error;

/// The answer to [`raw_request`]: header names lowercase.
pub struct RawResponse {
    pub status: u16,
    pub headers: std::collections::HashMap<String, String>,
    pub body: Vec<u8>,
}

/// Sends a plain HTTP/1.1 `method` request for `uri` (`http://` only) with
/// `headers` and no body, as a browser or curl would, unsigned unless the
/// URL is presigned.
pub async fn raw_request(
    method: &str,
    uri: &str,
    headers: &[(String, String)],
) -> Result<RawResponse> {
    raw_request_with_body(method, uri, headers, &[]).await
}

/// [`raw_request`] with `body` (sent with its Content-Length when not
/// empty).
pub async fn raw_request_with_body(
    method: &str,
    uri: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<RawResponse> {
    let rest = uri
        .strip_prefix("http://")
        .context("presigned URL is not http://")?;
    let (authority, path) = rest.split_at(rest.find('/').context("URL without a path")?);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(authority).await?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut resp = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut resp),
    )
    .await??;
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = String::from_utf8_lossy(&resp[..head_end]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        bail!("chunked response; this helper expects Content-Length: {head}");
    }
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(RawResponse {
        status,
        headers,
        body: resp[head_end + 4..].to_vec(),
    })
}
