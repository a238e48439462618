//! Flow control end to end on tiny budgets.
//!
//! * 1 meta, 6 datanodes with 4 MiB write budgets, a gateway with 4 MiB
//!   write and read buffer budgets: 32 concurrent multipart uploads all
//!   complete (backpressure, not failure: the SDK may not retry) and read
//!   back byte-identical, and the gateway's buffer bytes in use never
//!   exceed its budget.
//! * `max_inflight_requests = 1`: while one slow PUT is in flight, another
//!   request gets `503 SlowDown` with `Retry-After: 1` at once.
//! * A one-stripe buffer budget held by a slow PUT: another PUT waits
//!   `stall_timeout` for a buffer, then gets `503 SlowDown`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use futures::{StreamExt, TryStreamExt};
use sluice_util::byte_size::ByteSize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fixtures::{Overrides, TestCluster, wait_until};
use crate::{
    KIB, MIB, Upload, assert_object, complete, create_upload, expect_error, md5_hex,
    multipart_etag, quoted, random_bytes, test_seed, upload_parts,
};

const BUDGET: u64 = 4 * MIB as u64;
const UPLOADS: usize = 32;
const PART: usize = 5 * MIB;
/// Two full parts and a small last one.
const OBJECT: usize = 2 * PART + 300 * KIB + 7;

fn tiny_budgets() -> Overrides {
    Overrides {
        datanode: Some(|c| c.write_budget_bytes = Some(ByteSize(BUDGET))),
        gateway: Some(|c| {
            c.buffer_budget_bytes = Some(ByteSize(BUDGET));
            c.read_budget_bytes = Some(ByteSize(BUDGET));
            // ~96 requests take turns at ~2.7 stripes of buffer: on a
            // loaded CI machine a turn can take longer than the default
            // 30 s. This test is about backpressure; the stall SlowDown is
            // tested below.
            c.stall_timeout = Duration::from_secs(120);
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_uploads_through_four_mib_budgets() -> Result<()> {
    let seed = test_seed("tiny_budgets");
    let started = Instant::now();
    let mut c = TestCluster::start_with(1, 6, tiny_budgets()).await?;
    let s3 = c.s3_without_retries();
    s3.create_bucket().bucket("tiny").send().await?;

    // Every upload sends its three parts at once: up to 96 UploadParts in
    // flight against ~2.7 stripes of gateway buffer.
    let uploads = (0..UPLOADS).map(|i| {
        let s3 = &s3;
        async move {
            let key = format!("obj/{i:02}");
            let data = random_bytes(seed + i as u64, OBJECT);
            let upload_id = create_upload(s3, "tiny", &key).await?;
            let upload = Upload {
                s3,
                bucket: "tiny",
                key: &key,
                upload_id: &upload_id,
            };
            let parts = upload_parts(&upload, &data, PART, 1, 3).await?;
            let etag = complete(s3, "tiny", &key, &upload_id, parts).await?;
            let want = quoted(&multipart_etag(data.chunks(PART)));
            ensure!(etag == want, "{key}: ETag {etag}, want {want}");
            Ok::<_, anyhow::Error>(())
        }
    });
    futures::stream::iter(uploads)
        .buffer_unordered(UPLOADS)
        .try_collect::<Vec<()>>()
        .await?;
    let uploaded = started.elapsed();
    let stats = c.gateway_stats().clone();
    eprintln!(
        "[tiny_budgets] {UPLOADS} uploads of {OBJECT} bytes in {uploaded:?}; gateway buffer high water {} of {BUDGET}",
        stats.buffer_high_water()
    );

    // Read back, 8 at a time, through the 4 MiB read budget.
    let reads = (0..UPLOADS).map(|i| {
        let s3 = &s3;
        async move {
            let data = random_bytes(seed + i as u64, OBJECT);
            assert_object(s3, "tiny", &format!("obj/{i:02}"), &data).await
        }
    });
    futures::stream::iter(reads)
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "[tiny_budgets] read back in {:?}; read buffer high water {} of {BUDGET}",
        started.elapsed() - uploaded,
        stats.read_high_water()
    );

    ensure!(
        stats.buffer_high_water() <= BUDGET,
        "gateway write buffers peaked at {} > budget {BUDGET}",
        stats.buffer_high_water()
    );
    ensure!(
        stats.buffer_high_water() >= 2 * 1536 * KIB as u64,
        "the budget was never under pressure: peak {}",
        stats.buffer_high_water()
    );
    ensure!(
        stats.read_high_water() <= BUDGET,
        "gateway read buffers peaked at {} > budget {BUDGET}",
        stats.read_high_water()
    );
    ensure!(stats.inflight_rejected() == 0, "requests were refused");
    wait_until("every buffer released", Duration::from_secs(10), || {
        let stats = stats.clone();
        async move {
            if stats.buffer_in_use() == 0 && stats.read_in_use() == 0 && stats.inflight() == 0 {
                Ok(())
            } else {
                Err(format!(
                    "write {} read {} in flight {}",
                    stats.buffer_in_use(),
                    stats.read_in_use(),
                    stats.inflight()
                ))
            }
        }
    })
    .await?;
    c.stop_all().await
}

/// An HTTP/1.1 request written by hand, its body sent when the test says.
struct RawPut {
    stream: TcpStream,
}

impl RawPut {
    /// Connects and sends the head of a presigned PUT of `len` bytes.
    async fn start(uri: &str, headers: &[(String, String)], len: usize) -> Result<RawPut> {
        let rest = uri
            .strip_prefix("http://")
            .context("presigned URL is not http://")?;
        let (authority, path) = rest.split_at(rest.find('/').context("URL without a path")?);
        let mut stream = TcpStream::connect(authority).await?;
        let mut head = format!(
            "PUT {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {len}\r\nConnection: close\r\n"
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        Ok(RawPut { stream })
    }

    async fn send(&mut self, body: &[u8]) -> Result<()> {
        self.stream.write_all(body).await?;
        Ok(())
    }

    /// Reads the whole response: status, lower-cased head, body.
    async fn response(mut self) -> Result<(u16, String, String)> {
        let mut resp = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), self.stream.read_to_end(&mut resp))
            .await
            .context("no response within 30 s")??;
        let head_end = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("no end of headers")?;
        let head = String::from_utf8_lossy(&resp[..head_end]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line in {head:?}"))?;
        let body = String::from_utf8_lossy(&resp[head_end + 4..]).into_owned();
        Ok((status, head, body))
    }
}

async fn presigned_put(
    s3: &aws_sdk_s3::Client,
    key: &str,
) -> Result<(String, Vec<(String, String)>)> {
    let p = s3
        .put_object()
        .bucket("slow")
        .key(key)
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300))?)
        .await?;
    let headers = p
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok((p.uri().to_string(), headers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_max_inflight_requests_a_put_gets_slow_down() -> Result<()> {
    let seed = test_seed("max_inflight");
    let mut c = TestCluster::start_with(
        1,
        6,
        Overrides {
            gateway: Some(|c| c.max_inflight_requests = 1),
            ..Overrides::default()
        },
    )
    .await?;
    let s3 = c.s3_without_retries();
    s3.create_bucket().bucket("slow").send().await?;
    let stats = c.gateway_stats().clone();
    let settled = |want: u64| {
        let stats = stats.clone();
        move || {
            let stats = stats.clone();
            async move {
                let now = stats.inflight();
                if now == want {
                    Ok(())
                } else {
                    Err(format!("{now} requests in flight"))
                }
            }
        }
    };
    wait_until("no request in flight", Duration::from_secs(10), settled(0)).await?;

    // PUT 1 sends its head and half its body, then stalls.
    let data = random_bytes(seed, 2 * MIB);
    let (uri, headers) = presigned_put(&s3, "first").await?;
    let mut first = RawPut::start(&uri, &headers, data.len()).await?;
    first.send(&data[..MIB]).await?;
    wait_until(
        "the slow PUT to be admitted",
        Duration::from_secs(10),
        settled(1),
    )
    .await?;

    // PUT 2, just as slow: refused at once, before its body.
    let (uri, headers) = presigned_put(&s3, "second").await?;
    let second = RawPut::start(&uri, &headers, data.len()).await?;
    let (status, head, body) = second.response().await?;
    ensure!(status == 503, "second PUT: {status} {head} {body}");
    ensure!(
        head.contains("\r\nretry-after: 1"),
        "no Retry-After: {head}"
    );
    for element in [
        "<Code>SlowDown</Code>",
        "<Message>Please reduce your request rate.</Message>",
        "<Resource>/slow/second</Resource>",
        "<RequestId>",
    ] {
        ensure!(body.contains(element), "{element} missing from {body}");
    }

    // The SDK sees the same (retries disabled for this client).
    let res = s3
        .put_object()
        .bucket("slow")
        .key("third")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    let err = expect_error("PutObject past the limit", res, 503, Some("SlowDown"))?;
    let retry_after = err
        .raw_response()
        .and_then(|r| r.headers().get("retry-after"))
        .map(str::to_string);
    ensure!(
        retry_after.as_deref() == Some("1"),
        "Retry-After {retry_after:?}"
    );
    ensure!(
        stats.inflight_rejected() >= 2,
        "{} rejected",
        stats.inflight_rejected()
    );

    // PUT 1 finishes and succeeds; the slot frees and writes go through.
    first.send(&data[MIB..]).await?;
    let (status, head, body) = first.response().await?;
    ensure!(status == 200, "first PUT: {status} {head} {body}");
    let etag = quoted(&md5_hex(&data));
    ensure!(
        head.contains(&format!("\r\netag: {}", etag.to_ascii_lowercase())),
        "first PUT ETag: {head}"
    );
    wait_until("the slot to free", Duration::from_secs(10), settled(0)).await?;
    assert_object(&s3, "slow", "first", &data).await?;
    let res = s3.get_object().bucket("slow").key("second").send().await;
    expect_error("GET of the refused PUT", res, 404, Some("NoSuchKey"))?;
    if stats.inflight_high_water() != 1 {
        bail!(
            "{} requests were in flight at once",
            stats.inflight_high_water()
        );
    }
    c.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_without_a_buffer_within_stall_timeout_gets_slow_down() -> Result<()> {
    const STALL: Duration = Duration::from_secs(1);
    let seed = test_seed("stall_timeout");
    let mut c = TestCluster::start_with(
        1,
        6,
        Overrides {
            gateway: Some(|c| {
                // Exactly one stripe of (4 + 2) * 256 KiB.
                c.buffer_budget_bytes = Some(ByteSize(6 * 256 * KIB as u64));
                c.stall_timeout = STALL;
            }),
            ..Overrides::default()
        },
    )
    .await?;
    let s3 = c.s3_without_retries();
    s3.create_bucket().bucket("slow").send().await?;
    // Warm up: the credit streams to the datanodes are open.
    let warm = random_bytes(seed + 1, 3 * MIB);
    crate::put(&s3, "slow", "warm", &warm).await?;
    let stats = c.gateway_stats().clone();

    // PUT 1 takes the only stripe buffer, then its client pauses.
    let data = random_bytes(seed, 2 * MIB);
    let (uri, headers) = presigned_put(&s3, "first").await?;
    let mut first = RawPut::start(&uri, &headers, data.len()).await?;
    first.send(&data[..64 * KIB]).await?;
    wait_until("PUT 1 to hold the buffer", Duration::from_secs(10), || {
        let stats = stats.clone();
        async move {
            let held = stats.buffer_in_use();
            if held == 6 * 256 * KIB as u64 {
                Ok(())
            } else {
                Err(format!("{held} bytes held"))
            }
        }
    })
    .await?;

    // PUT 2 waits `stall_timeout` for a buffer, then gets SlowDown.
    let started = Instant::now();
    let (uri, headers) = presigned_put(&s3, "second").await?;
    let second = RawPut::start(&uri, &headers, MIB).await?;
    let (status, head, body) = second.response().await?;
    let waited = started.elapsed();
    ensure!(status == 503, "second PUT: {status} {head} {body}");
    ensure!(
        head.contains("\r\nretry-after: 1"),
        "no Retry-After: {head}"
    );
    ensure!(body.contains("<Code>SlowDown</Code>"), "{body}");
    ensure!(body.contains("<Resource>/slow/second</Resource>"), "{body}");
    ensure!(
        waited >= STALL,
        "answered after {waited:?}, before the stall timeout"
    );
    ensure!(
        stats.inflight_rejected() == 0,
        "refused by admission, not by the budget"
    );

    // PUT 1 goes on and succeeds.
    first.send(&data[64 * KIB..]).await?;
    let (status, head, body) = first.response().await?;
    ensure!(status == 200, "first PUT: {status} {head} {body}");
    assert_object(&s3, "slow", "first", &data).await?;
    ensure!(stats.buffer_high_water() <= 6 * 256 * KIB as u64);
    c.stop_all().await
}
