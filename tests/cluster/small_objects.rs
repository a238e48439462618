//! Small objects stored inline in their metadata record
//! (`inline_max_bytes`, 4 KiB by default): no datanode holds anything of
//! them, reads (whole, ranged, by part number, with checksums) and copies
//! come from the record, overwrites between inline and erasure-coded
//! bodies release what they replace, a bad digest stores nothing, a
//! dropped commit response retried commits once, and they stay readable
//! with every datanode down.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use md5::{Digest as _, Md5};

use super::fixtures::{CONVERGE_TIMEOUT, Setup, TestCluster, durable_setup, wait_until};
use super::versioning::DropOnce;
use super::{KIB, assert_object, expect_error, get_all, put, random_bytes, test_seed};

const B: &str = "small";

/// Waits until the datanodes hold `want` shards in all.
async fn wait_shards(c: &TestCluster, what: &str, want: u64) -> Result<()> {
    wait_until(what, CONVERGE_TIMEOUT, || async {
        let n = c.shard_count().await?;
        if n == want {
            Ok(())
        } else {
            Err(format!("{n} shards, want {want}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_objects_live_in_their_record() -> Result<()> {
    let seed = test_seed("small_objects_live_in_their_record");
    let faults = Arc::new(DropOnce::default());
    let setup = Setup {
        gateway_meta_faults: Some(faults.clone()),
        ..durable_setup()
    };
    let mut c = TestCluster::start_setup(1, 6, setup).await?;
    let s3 = c.s3_without_retries();
    s3.create_bucket().bucket(B).send().await?;

    // 4 KiB: inline, no shard anywhere; 4 KiB + 1: erasure coded (6 shards).
    let small = random_bytes(seed, 4 * KIB);
    let large = random_bytes(seed + 1, 4 * KIB + 1);
    put(&s3, B, "small", &small).await?;
    ensure!(
        c.shard_count().await.map_err(anyhow::Error::msg)? == 0,
        "an inline object wrote shards"
    );
    put(&s3, B, "large", &large).await?;
    ensure!(
        c.shard_count().await.map_err(anyhow::Error::msg)? == 6,
        "4 KiB + 1 is not erasure coded"
    );

    // Reads from the record: whole, a range, part 1, checksums.
    assert_object(&s3, B, "small", &small).await?;
    let r = s3
        .get_object()
        .bucket(B)
        .key("small")
        .range("bytes=100-199")
        .send()
        .await?;
    ensure!(
        r.body.collect().await?.into_bytes() == small.slice(100..200),
        "range of an inline body"
    );
    let r = s3
        .get_object()
        .bucket(B)
        .key("small")
        .part_number(1)
        .send()
        .await?;
    ensure!(
        r.content_length() == Some(small.len() as i64),
        "part 1: {:?}",
        r.content_length()
    );
    let crc = s3
        .put_object()
        .bucket(B)
        .key("crc")
        .checksum_algorithm(ChecksumAlgorithm::Crc32)
        .body(ByteStream::from(small.slice(..1000)))
        .send()
        .await?
        .checksum_crc32()
        .map(str::to_string)
        .context("PutObject answered no CRC32")?;
    let head = s3
        .head_object()
        .bucket(B)
        .key("crc")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await?;
    ensure!(
        head.checksum_crc32() == Some(crc.as_str()),
        "stored CRC32 {:?}",
        head.checksum_crc32()
    );

    // A wrong Content-MD5 stores nothing.
    let r = s3
        .put_object()
        .bucket(B)
        .key("bad")
        .content_md5(B64.encode(Md5::digest(b"other")))
        .body(ByteStream::from(small.clone()))
        .send()
        .await;
    expect_error(
        "inline PUT with a wrong Content-MD5",
        r,
        400,
        Some("BadDigest"),
    )?;
    let r = s3.get_object().bucket(B).key("bad").send().await;
    expect_error("GET after a BadDigest", r, 404, Some("NoSuchKey"))?;

    // Copies of an inline source are inline too.
    s3.copy_object()
        .bucket(B)
        .key("copy")
        .copy_source(format!("{B}/small"))
        .send()
        .await?;
    assert_object(&s3, B, "copy", &small).await?;
    ensure!(
        c.shard_count().await.map_err(anyhow::Error::msg)? == 6,
        "a copy of an inline object wrote shards"
    );

    // The commit's response is lost and retried: one commit, readable.
    *faults.armed.lock().expect("lock") = Some("PutObject");
    let retried = random_bytes(seed + 2, KIB);
    put(&s3, B, "retried", &retried).await?;
    ensure!(
        faults.dropped.swap(false, Ordering::SeqCst),
        "PutObject response not dropped"
    );
    assert_object(&s3, B, "retried", &retried).await?;

    // Overwrites both ways release what they replace.
    put(&s3, B, "large", &small).await?;
    wait_shards(&c, "the replaced large body's shards to go", 0).await?;
    put(&s3, B, "small", &large).await?;
    ensure!(get_all(&s3, B, "large").await? == small, "large now inline");
    ensure!(
        get_all(&s3, B, "small").await? == large,
        "small now erasure coded"
    );

    // Every datanode down: inline objects still read; an erasure-coded
    // one cannot (503 ServiceUnavailable, retryable: the data path's answer
    // to a blob with fewer than k readable shards, whose nodes may be back).
    for d in c.datanodes.iter_mut() {
        d.stop().await?;
    }
    assert_object(&s3, B, "large", &small).await?;
    assert_object(&s3, B, "copy", &small).await?;
    let r = s3.get_object().bucket(B).key("small").send().await;
    expect_error(
        "GET of a coded object with no datanode",
        r,
        503,
        Some("ServiceUnavailable"),
    )?;
    c.stop_all().await
}
