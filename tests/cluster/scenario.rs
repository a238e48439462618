//! The 3-voter scenario: one cluster, steps in order.

use std::time::Instant;

use anyhow::{Result, ensure};
use aws_sdk_s3::operation::list_parts::ListPartsError;
use bytes::Bytes;

use crate::fixtures::{CONVERGE_TIMEOUT, TestCluster, meta_status, wait_until};
use crate::{
    MIB, Upload, assert_object, assert_range, complete, create_upload, expect_error,
    multipart_etag, multipart_put, put, quoted, random_bytes, test_seed, upload_parts,
};

const BIG: usize = 100 * MIB;
const PART: usize = 8 * MIB;
/// k + m of the gateway's erasure layout: shards per blob.
const SHARDS_PER_BLOB: u64 = 6;

struct Clock(Instant);

impl Clock {
    fn step(&self, what: &str) {
        eprintln!("[scenario {:>6.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_six_datanodes_survive_failures_and_restarts() -> Result<()> {
    let seed = test_seed("scenario");
    let clock = Clock(Instant::now());
    let mut c = TestCluster::start(3, 6).await?;
    clock.step("cluster up: 3 meta voters, 6 datanodes, 1 gateway");
    let s3 = c.s3();
    // Blobs written so far; every blob is k + m shards once all are durable.
    let mut blobs: u64 = 0;

    // ---- 100 MiB by multipart: 8 MiB parts, 10 UploadPart in flight.
    s3.create_bucket().bucket("big").send().await?;
    let big = random_bytes(seed, BIG);
    let big_etag = multipart_put(&s3, "big", "obj/100mib", &big, PART, 10).await?;
    blobs += 13;
    ensure!(
        big_etag.ends_with("-13\""),
        "ETag {big_etag} does not end with -13"
    );
    clock.step("100 MiB multipart upload completed");

    let head = s3
        .head_object()
        .bucket("big")
        .key("obj/100mib")
        .send()
        .await?;
    ensure!(
        head.content_length() == Some(BIG as i64),
        "HEAD Content-Length {:?}",
        head.content_length()
    );
    ensure!(
        head.e_tag() == Some(big_etag.as_str()),
        "HEAD ETag {:?}, want {big_etag}",
        head.e_tag()
    );
    assert_object(&s3, "big", "obj/100mib", &big).await?;
    clock.step("100 MiB read back byte-identical");

    // Stripes are 1 MiB of payload, parts 8 MiB; the last part starts at 96 MiB.
    let ranges: [(&str, std::ops::Range<usize>); 8] = [
        ("bytes=8388000-8389000", 8_388_000..8_389_001), // part 1 -> part 2
        ("bytes=1048570-1048580", 1_048_570..1_048_581), // stripe 0 -> stripe 1
        ("bytes=-100", BIG - 100..BIG),                  // suffix
        ("bytes=104857000-", 104_857_000..BIG),          // open
        ("bytes=3000000-20000000", 3_000_000..20_000_001), // many stripes, two part boundaries
        ("bytes=0-0", 0..1),                             // first byte
        ("bytes=100663295-100663296", 100_663_295..100_663_297), // part 12 -> last part
        ("bytes=262143-262144", 262_143..262_145),       // shard block boundary inside a stripe
    ];
    for (range, want) in ranges.iter().cloned() {
        assert_range(&s3, "big", "obj/100mib", &big, range, want).await?;
    }
    clock.step("ranged reads across stripe and part boundaries match");

    // ---- ListObjectsV2 with a delimiter.
    s3.create_bucket().bucket("listing").send().await?;
    let listing_keys = ["a/1", "a/2", "b/1", "c"];
    let mut listing_data = Vec::new();
    for (i, key) in listing_keys.iter().enumerate() {
        // Small objects are stored inline in meta (inline_max_bytes,
        // 4 KiB): no blob, no shard.
        let data = random_bytes(seed + 1 + i as u64, 1000 + i);
        put(&s3, "listing", key, &data).await?;
        listing_data.push(data);
    }
    check_listing(&s3, &listing_keys, &listing_data).await?;
    clock.step("ListObjectsV2 with delimiter");

    // ---- Abort leaves no parts and no shards.
    let shards_before = wait_shards(&c, SHARDS_PER_BLOB * blobs).await?;
    let files_before = c.datanode_file_count().map_err(anyhow::Error::msg)?;
    let aborted_data = random_bytes(seed + 10, 6 * MIB);
    let aborted_id = create_upload(&s3, "big", "aborted").await?;
    upload_parts(
        &Upload {
            s3: &s3,
            bucket: "big",
            key: "aborted",
            upload_id: &aborted_id,
        },
        &aborted_data,
        5 * MIB,
        1,
        2,
    )
    .await?;
    wait_shards(&c, shards_before + 2 * SHARDS_PER_BLOB).await?;
    let files_during = c.datanode_file_count().map_err(anyhow::Error::msg)?;
    ensure!(
        files_during >= files_before + 2 * SHARDS_PER_BLOB,
        "2 parts stored: datanode dirs went from {files_before} to {files_during} files"
    );
    s3.abort_multipart_upload()
        .bucket("big")
        .key("aborted")
        .upload_id(&aborted_id)
        .send()
        .await?;
    expect_error::<_, ListPartsError>(
        "ListParts of the aborted upload",
        s3.list_parts()
            .bucket("big")
            .key("aborted")
            .upload_id(&aborted_id)
            .send()
            .await,
        404,
        Some("NoSuchUpload"),
    )?;
    let uploads = s3.list_multipart_uploads().bucket("big").send().await?;
    ensure!(
        uploads
            .uploads()
            .iter()
            .all(|u| u.upload_id() != Some(aborted_id.as_str())),
        "aborted upload still listed: {:?}",
        uploads.uploads()
    );
    wait_shards(&c, shards_before).await?;
    let cr = &c;
    wait_until(
        "datanode files back to the count before the upload",
        CONVERGE_TIMEOUT,
        || async move {
            let files = cr.datanode_file_count()?;
            if files == files_before {
                Ok(())
            } else {
                Err(format!("{files} files, want {files_before}"))
            }
        },
    )
    .await?;
    clock.step("abort removed parts and shards");

    // ---- Two datanodes down: GET is still byte-identical.
    for i in [0, 3] {
        c.datanodes[i].stop().await?;
    }
    assert_object(&s3, "big", "obj/100mib", &big).await?;
    assert_range(
        &s3,
        "big",
        "obj/100mib",
        &big,
        "bytes=8388000-8389000",
        8_388_000..8_389_001,
    )
    .await?;
    clock.step("GET with datanodes 1 and 4 stopped is byte-identical");
    c.wait_datanodes(&[2, 3, 5, 6], &[1, 4]).await?;
    for i in [0, 3] {
        c.datanodes[i].start().await?;
    }
    c.wait_datanodes_live().await?;
    // The gateway refreshes its live set periodically: wait until it writes again.
    let probe = random_bytes(seed + 11, 10_000);
    let (s3r, prober) = (&s3, &probe);
    wait_until(
        "the gateway to accept writes with all datanodes back",
        CONVERGE_TIMEOUT,
        || async move {
            put(s3r, "big", "probe", prober)
                .await
                .map_err(|e| format!("{e:#}"))
        },
    )
    .await?;
    assert_object(&s3, "big", "probe", &probe).await?;
    clock.step("datanodes 1 and 4 restarted");

    // ---- Meta leader stopped: a new leader is elected and uploads continue.
    let old = c.leader_index().await?;
    let old_term = meta_status(c.metas[old].addr())
        .await
        .map_err(anyhow::Error::msg)?
        .term;
    c.metas[old].stop().await?;
    let new_leader = c.wait_leader().await?;
    ensure!(
        new_leader != old as u64 + 1,
        "leader {new_leader} was stopped"
    );
    let new_term = meta_status(c.metas[new_leader as usize - 1].addr())
        .await
        .map_err(anyhow::Error::msg)?
        .term;
    ensure!(
        new_term > old_term,
        "new leader {new_leader} has term {new_term}, old term {old_term}"
    );
    clock.step(&format!(
        "meta-{} stopped, meta-{new_leader} elected in term {new_term}",
        old + 1
    ));
    let after_mp = random_bytes(seed + 12, 13 * MIB);
    multipart_put(
        &s3,
        "big",
        "after-leader-loss/multipart",
        &after_mp,
        5 * MIB,
        3,
    )
    .await?;
    let after_put = random_bytes(seed + 13, 300 * 1024);
    put(&s3, "big", "after-leader-loss/put", &after_put).await?;
    assert_object(&s3, "big", "after-leader-loss/multipart", &after_mp).await?;
    assert_object(&s3, "big", "after-leader-loss/put", &after_put).await?;
    clock.step("multipart upload and PutObject after leader loss");
    c.metas[old].start().await?;
    let leader = c.wait_leader().await?;
    let leader_applied = meta_status(c.metas[leader as usize - 1].addr())
        .await
        .map_err(anyhow::Error::msg)?
        .last_applied_index;
    let rejoined = c.metas[old].addr();
    wait_until(
        "the old leader to catch up",
        CONVERGE_TIMEOUT,
        || async move {
            let s = meta_status(rejoined).await?;
            if s.last_applied_index >= leader_applied {
                Ok(())
            } else {
                Err(format!(
                    "applied {} < leader's {leader_applied}",
                    s.last_applied_index
                ))
            }
        },
    )
    .await?;
    clock.step("old leader restarted and caught up");

    // ---- An upload open across a full restart.
    let pending = random_bytes(seed + 14, 11 * MIB);
    let pending_id = create_upload(&s3, "big", "pending").await?;
    let before_restart = upload_parts(
        &Upload {
            s3: &s3,
            bucket: "big",
            key: "pending",
            upload_id: &pending_id,
        },
        &pending.slice(..10 * MIB),
        5 * MIB,
        1,
        2,
    )
    .await?;

    // ---- Stop and restart every process on the same directories and ports.
    c.stop_all().await?;
    clock.step("every process stopped");
    c.start_all().await?;
    clock.step("every process restarted");
    let s3 = c.s3();

    assert_object(&s3, "big", "obj/100mib", &big).await?;
    assert_range(
        &s3,
        "big",
        "obj/100mib",
        &big,
        "bytes=1048570-1048580",
        1_048_570..1_048_581,
    )
    .await?;
    let head = s3
        .head_object()
        .bucket("big")
        .key("obj/100mib")
        .send()
        .await?;
    ensure!(
        head.e_tag() == Some(big_etag.as_str()),
        "ETag after restart {:?}, want {big_etag}",
        head.e_tag()
    );
    assert_object(&s3, "big", "after-leader-loss/multipart", &after_mp).await?;
    assert_object(&s3, "big", "after-leader-loss/put", &after_put).await?;
    assert_object(&s3, "big", "probe", &probe).await?;
    check_listing(&s3, &listing_keys, &listing_data).await?;
    clock.step("every object byte-identical after the restart");

    let parts = s3
        .list_parts()
        .bucket("big")
        .key("pending")
        .upload_id(&pending_id)
        .send()
        .await?;
    let listed: Vec<(Option<i32>, Option<i64>, Option<&str>)> = parts
        .parts()
        .iter()
        .map(|p| (p.part_number(), p.size(), p.e_tag()))
        .collect();
    let want: Vec<(Option<i32>, Option<i64>, Option<&str>)> = before_restart
        .iter()
        .map(|p| (p.part_number(), Some(5 * MIB as i64), p.e_tag()))
        .collect();
    ensure!(
        listed == want,
        "ListParts after restart: {listed:?}, want {want:?}"
    );
    let mut all_parts = before_restart;
    all_parts.extend(
        upload_parts(
            &Upload {
                s3: &s3,
                bucket: "big",
                key: "pending",
                upload_id: &pending_id,
            },
            &pending.slice(10 * MIB..),
            MIB,
            3,
            1,
        )
        .await?,
    );
    let etag = complete(&s3, "big", "pending", &pending_id, all_parts).await?;
    let want_etag = quoted(&multipart_etag([
        &pending[..5 * MIB],
        &pending[5 * MIB..10 * MIB],
        &pending[10 * MIB..],
    ]));
    ensure!(
        etag == want_etag,
        "ETag of the upload completed after restart: {etag}, want {want_etag}"
    );
    assert_object(&s3, "big", "pending", &pending).await?;
    let uploads = s3.list_multipart_uploads().bucket("big").send().await?;
    ensure!(
        uploads.uploads().is_empty(),
        "uploads still open: {:?}",
        uploads.uploads()
    );
    clock.step("upload opened before the restart completed after it");

    c.stop_all().await?;
    clock.step("clean shutdown");
    Ok(())
}

/// Waits until the datanodes together report `want` shards.
async fn wait_shards(c: &TestCluster, want: u64) -> Result<u64> {
    wait_until(
        &format!("{want} shards on the datanodes"),
        CONVERGE_TIMEOUT,
        || async move {
            let n = c.shard_count().await?;
            if n == want {
                Ok(n)
            } else {
                Err(format!("{n} shards"))
            }
        },
    )
    .await
}

async fn check_listing(s3: &aws_sdk_s3::Client, keys: &[&str], data: &[Bytes]) -> Result<()> {
    let out = s3
        .list_objects_v2()
        .bucket("listing")
        .delimiter("/")
        .send()
        .await?;
    let prefixes: Vec<&str> = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    let contents: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
    ensure!(prefixes == ["a/", "b/"], "CommonPrefixes {prefixes:?}");
    ensure!(contents == ["c"], "Contents {contents:?}");
    ensure!(out.key_count() == Some(3), "KeyCount {:?}", out.key_count());
    ensure!(
        out.is_truncated() == Some(false),
        "IsTruncated {:?}",
        out.is_truncated()
    );

    let out = s3
        .list_objects_v2()
        .bucket("listing")
        .prefix("a/")
        .delimiter("/")
        .send()
        .await?;
    let contents: Vec<(&str, i64)> = out
        .contents()
        .iter()
        .map(|o| (o.key().unwrap_or(""), o.size().unwrap_or(-1)))
        .collect();
    ensure!(
        contents == [("a/1", 1000), ("a/2", 1001)],
        "Contents under a/: {contents:?}"
    );
    ensure!(
        out.common_prefixes().is_empty(),
        "CommonPrefixes under a/: {:?}",
        out.common_prefixes()
    );

    let out = s3.list_objects_v2().bucket("listing").send().await?;
    let all: Vec<(&str, Option<&str>)> = out
        .contents()
        .iter()
        .map(|o| (o.key().unwrap_or(""), o.e_tag()))
        .collect();
    let etags: Vec<String> = data.iter().map(|d| quoted(&crate::md5_hex(d))).collect();
    let want: Vec<(&str, Option<&str>)> = keys
        .iter()
        .copied()
        .zip(etags.iter().map(|e| Some(e.as_str())))
        .collect();
    ensure!(
        all == want,
        "ListObjectsV2 without delimiter: {all:?}, want {want:?}"
    );
    Ok(())
}
