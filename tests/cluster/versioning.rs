//! S3 versioning end to end with aws-sdk-s3 (S3 user guide "Using
//! versioning in S3 buckets"): version ids on writes, reads and deletes by
//! id, delete markers, ListObjectVersions, copies from a version, suspended
//! buckets; a dropped PutObject/DeleteObject response retried adds one
//! version, not two; GC never collects a noncurrent version's shards and
//! releases them when the version is deleted; heal rebuilds noncurrent
//! versions' shards after a wiped disk.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketVersioningStatus, Delete, ObjectIdentifier, VersioningConfiguration,
};
use bytes::Bytes;
use sluice_meta_client::{CallFaults, FaultAction};

use super::fixtures::{CONVERGE_TIMEOUT, Setup, TestCluster, durable_setup, wait_until};
use super::{KIB, expect_error, get_all, put, random_bytes, test_seed};

const BUCKET: &str = "ver-b";

/// How long a heal may take in these tests.
const HEAL_TIMEOUT: Duration = Duration::from_secs(60);

/// Drops the response of the next call of the armed RPC once.
#[derive(Default)]
pub struct DropOnce {
    /// The RPC whose next response is dropped.
    pub armed: Mutex<Option<&'static str>>,
    /// Set when a response was dropped.
    pub dropped: AtomicBool,
}

impl CallFaults for DropOnce {
    fn on_response(&self, rpc: &'static str) -> FaultAction {
        let mut armed = self.armed.lock().expect("lock");
        if *armed == Some(rpc) {
            *armed = None;
            self.dropped.store(true, Ordering::SeqCst);
            return FaultAction::Drop;
        }
        FaultAction::Deliver
    }
}

async fn set_versioning(s3: &aws_sdk_s3::Client, status: BucketVersioningStatus) -> Result<()> {
    s3.put_bucket_versioning()
        .bucket(BUCKET)
        .versioning_configuration(VersioningConfiguration::builder().status(status).build())
        .send()
        .await?;
    Ok(())
}

async fn put_version(s3: &aws_sdk_s3::Client, key: &str, data: &Bytes) -> Result<String> {
    let out = s3
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(ByteStream::from(data.clone()))
        .send()
        .await?;
    out.version_id()
        .map(str::to_string)
        .context("PutObject in a versioned bucket without x-amz-version-id")
}

async fn get_version(s3: &aws_sdk_s3::Client, key: &str, version: &str) -> Result<Bytes> {
    let out = s3
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .version_id(version)
        .send()
        .await
        .with_context(|| format!("GET {key}?versionId={version}"))?;
    ensure!(
        out.version_id() == Some(version),
        "GET answered version {:?}",
        out.version_id()
    );
    Ok(out.body.collect().await?.into_bytes())
}

/// (key, version id, is latest, delete marker) of every version, paging
/// through ListObjectVersions `page` at a time, sorted.
async fn versions(s3: &aws_sdk_s3::Client, page: i32) -> Result<Vec<(String, String, bool, bool)>> {
    let mut all = Vec::new();
    let (mut km, mut vm): (Option<String>, Option<String>) = (None, None);
    loop {
        let out = s3
            .list_object_versions()
            .bucket(BUCKET)
            .max_keys(page)
            .set_key_marker(km.clone())
            .set_version_id_marker(vm.clone())
            .send()
            .await?;
        // The SDK splits a page's interleaved versions and markers into two
        // lists; the result is compared sorted.
        let mut rows: Vec<(String, String, bool, bool)> = out
            .versions()
            .iter()
            .map(|v| {
                let (k, id) = (
                    v.key().unwrap_or_default(),
                    v.version_id().unwrap_or_default(),
                );
                (
                    k.to_string(),
                    id.to_string(),
                    v.is_latest().unwrap_or(false),
                    false,
                )
            })
            .chain(out.delete_markers().iter().map(|m| {
                let (k, id) = (
                    m.key().unwrap_or_default(),
                    m.version_id().unwrap_or_default(),
                );
                (
                    k.to_string(),
                    id.to_string(),
                    m.is_latest().unwrap_or(false),
                    true,
                )
            }))
            .collect();
        all.append(&mut rows);
        if !out.is_truncated().unwrap_or(false) {
            all.sort();
            return Ok(all);
        }
        km = out.next_key_marker().map(str::to_string);
        vm = out.next_version_id_marker().map(str::to_string);
    }
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn versions_markers_copies_and_listings() -> Result<()> {
    let seed = test_seed("versions_markers_copies_and_listings");
    let c = TestCluster::start(1, 6).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket(BUCKET).send().await?;
    let status = s3.get_bucket_versioning().bucket(BUCKET).send().await?;
    ensure!(status.status().is_none(), "new bucket: {status:?}");
    // Written before versioning: the null version, no version header.
    let old = random_bytes(seed, 3 * KIB);
    put(&s3, BUCKET, "k", &old).await?;
    let head = s3.head_object().bucket(BUCKET).key("k").send().await?;
    ensure!(
        head.version_id().is_none(),
        "unversioned HEAD: {:?}",
        head.version_id()
    );

    set_versioning(&s3, BucketVersioningStatus::Enabled).await?;
    let status = s3.get_bucket_versioning().bucket(BUCKET).send().await?;
    ensure!(
        status.status() == Some(&BucketVersioningStatus::Enabled),
        "{status:?}"
    );
    let a = random_bytes(seed + 1, 5 * KIB);
    let b = random_bytes(seed + 2, 7 * KIB);
    let va = put_version(&s3, "k", &a).await?;
    let vb = put_version(&s3, "k", &b).await?;
    ensure!(va != vb && va != "null", "{va} {vb}");
    ensure!(get_all(&s3, BUCKET, "k").await? == b, "latest is b");
    ensure!(get_version(&s3, "k", &va).await? == a, "version a");
    ensure!(get_version(&s3, "k", "null").await? == old, "null version");
    let head = s3
        .head_object()
        .bucket(BUCKET)
        .key("k")
        .version_id(&va)
        .send()
        .await?;
    ensure!(head.content_length() == Some(a.len() as i64), "{head:?}");
    let r = s3
        .get_object()
        .bucket(BUCKET)
        .key("k")
        .version_id("0000000000abcdef")
        .send()
        .await;
    expect_error("missing version", r, 404, Some("NoSuchVersion"))?;
    let r = s3
        .get_object()
        .bucket(BUCKET)
        .key("k")
        .version_id("bogus")
        .send()
        .await;
    expect_error("malformed version id", r, 400, Some("InvalidArgument"))?;

    // A plain delete adds a marker: GET is 404 with the marker headers,
    // the versions stay readable, ListObjectsV2 no longer shows the key.
    let del = s3.delete_object().bucket(BUCKET).key("k").send().await?;
    ensure!(del.delete_marker() == Some(true), "{del:?}");
    let marker = del.version_id().context("marker version id")?.to_string();
    let r = s3.get_object().bucket(BUCKET).key("k").send().await;
    let err = expect_error("GET of a deleted key", r, 404, Some("NoSuchKey"))?;
    let headers = err.raw_response().context("raw response")?.headers();
    ensure!(
        headers.get("x-amz-delete-marker") == Some("true"),
        "no delete marker header"
    );
    ensure!(
        headers.get("x-amz-version-id") == Some(marker.as_str()),
        "marker id header"
    );
    let r = s3
        .head_object()
        .bucket(BUCKET)
        .key("k")
        .version_id(&marker)
        .send()
        .await;
    expect_error("HEAD of a marker by id", r, 405, None)?;
    ensure!(
        get_version(&s3, "k", &vb).await? == b,
        "version b after the marker"
    );
    let listed = s3.list_objects_v2().bucket(BUCKET).send().await?;
    ensure!(listed.contents().is_empty(), "{listed:?}");
    let r = s3.delete_bucket().bucket(BUCKET).send().await;
    expect_error("DeleteBucket with versions", r, 409, Some("BucketNotEmpty"))?;
    ensure!(
        versions(&s3, 2).await?
            == sorted(vec![
                ("k".to_string(), marker.clone(), true, true),
                ("k".to_string(), vb.clone(), false, false),
                ("k".to_string(), va.clone(), false, false),
                ("k".to_string(), "null".to_string(), false, false),
            ]),
        "versions after the marker: {:?}",
        versions(&s3, 1000).await?
    );

    // Restore a by copying the version onto the key.
    let copy = s3
        .copy_object()
        .bucket(BUCKET)
        .key("k")
        .copy_source(format!("{BUCKET}/k?versionId={va}"))
        .send()
        .await?;
    ensure!(
        copy.copy_source_version_id() == Some(va.as_str()),
        "{copy:?}"
    );
    let vc = copy.version_id().context("copy version id")?.to_string();
    ensure!(get_all(&s3, BUCKET, "k").await? == a, "restored a");

    // DeleteObjects by id: the marker and b go; c stays the latest.
    let delete = Delete::builder()
        .objects(
            ObjectIdentifier::builder()
                .key("k")
                .version_id(&marker)
                .build()?,
        )
        .objects(
            ObjectIdentifier::builder()
                .key("k")
                .version_id(&vb)
                .build()?,
        )
        .build()?;
    let out = s3
        .delete_objects()
        .bucket(BUCKET)
        .delete(delete)
        .send()
        .await?;
    ensure!(
        out.deleted().len() == 2 && out.errors().is_empty(),
        "{out:?}"
    );
    ensure!(
        out.deleted()
            .iter()
            .any(|d| d.version_id() == Some(marker.as_str()) && d.delete_marker() == Some(true)),
        "{out:?}"
    );
    // Deleting the latest version by id makes the next one current.
    s3.delete_object()
        .bucket(BUCKET)
        .key("k")
        .version_id(&vc)
        .send()
        .await?;
    ensure!(get_all(&s3, BUCKET, "k").await? == a, "a is current again");

    // Suspended: writes replace the null version.
    set_versioning(&s3, BucketVersioningStatus::Suspended).await?;
    let n1 = random_bytes(seed + 3, KIB);
    let out = s3
        .put_object()
        .bucket(BUCKET)
        .key("k")
        .body(ByteStream::from(n1.clone()))
        .send()
        .await?;
    ensure!(out.version_id() == Some("null"), "{out:?}");
    ensure!(
        get_version(&s3, "k", "null").await? == n1,
        "the null version was replaced"
    );
    ensure!(
        versions(&s3, 1000).await?
            == sorted(vec![
                ("k".to_string(), "null".to_string(), true, false),
                ("k".to_string(), va.clone(), false, false),
            ]),
        "suspended versions: {:?}",
        versions(&s3, 1000).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_versioned_writes_add_one_version_and_gc_keeps_old_ones() -> Result<()> {
    let seed = test_seed("retried_versioned_writes_add_one_version_and_gc_keeps_old_ones");
    let faults = Arc::new(DropOnce::default());
    let setup = Setup {
        gateway_meta_faults: Some(faults.clone()),
        ..durable_setup()
    };
    let c = TestCluster::start_setup(1, 6, setup).await?;
    let s3 = c.s3_without_retries();
    s3.create_bucket().bucket(BUCKET).send().await?;
    set_versioning(&s3, BucketVersioningStatus::Enabled).await?;
    let v1 = random_bytes(seed, 40 * KIB);
    let v2 = random_bytes(seed + 1, 40 * KIB);
    let id1 = put_version(&s3, "k", &v1).await?;

    // The gateway's PutObject response is lost; its retry (same op id)
    // gets the first outcome: one new version, with its id.
    *faults.armed.lock().expect("lock") = Some("PutObject");
    let id2 = put_version(&s3, "k", &v2).await?;
    ensure!(
        faults.dropped.swap(false, Ordering::SeqCst),
        "PutObject response not dropped"
    );
    // The same for a delete: one marker.
    *faults.armed.lock().expect("lock") = Some("DeleteObject");
    let del = s3.delete_object().bucket(BUCKET).key("k").send().await?;
    ensure!(
        faults.dropped.swap(false, Ordering::SeqCst),
        "DeleteObject response not dropped"
    );
    let marker = del.version_id().context("marker id")?.to_string();
    let listed = versions(&s3, 1000).await?;
    ensure!(
        listed
            == sorted(vec![
                ("k".to_string(), marker.clone(), true, true),
                ("k".to_string(), id2.clone(), false, false),
                ("k".to_string(), id1.clone(), false, false),
            ]),
        "{listed:?}"
    );

    // GC runs: an object of another key is deleted and its shards
    // collected (past delete_delay); the noncurrent versions keep theirs.
    let shards_before = c.shard_count().await.map_err(anyhow::Error::msg)?;
    put(&s3, BUCKET, "gone", &random_bytes(seed + 2, KIB)).await?;
    let gone = s3
        .list_object_versions()
        .bucket(BUCKET)
        .prefix("gone")
        .send()
        .await?;
    let gone_id = gone.versions()[0].version_id().context("id")?.to_string();
    s3.delete_object()
        .bucket(BUCKET)
        .key("gone")
        .version_id(&gone_id)
        .send()
        .await?;
    wait_until(
        "the deleted version's shards to be collected",
        CONVERGE_TIMEOUT,
        || async {
            let n = c.shard_count().await?;
            if n == shards_before {
                Ok(())
            } else {
                Err(format!("{n} shards, want {shards_before}"))
            }
        },
    )
    .await?;
    ensure!(
        shards_before == 12,
        "two versions of 4+2 shards: {shards_before}"
    );
    ensure!(
        get_version(&s3, "k", &id1).await? == v1,
        "noncurrent v1 after GC"
    );
    ensure!(
        get_version(&s3, "k", &id2).await? == v2,
        "noncurrent v2 after GC"
    );

    // Deleting a version by id releases its shards.
    s3.delete_object()
        .bucket(BUCKET)
        .key("k")
        .version_id(&id1)
        .send()
        .await?;
    wait_until("v1's shards to be collected", CONVERGE_TIMEOUT, || async {
        let n = c.shard_count().await?;
        if n == 6 {
            Ok(())
        } else {
            Err(format!("{n} shards, want 6"))
        }
    })
    .await?;
    ensure!(
        get_version(&s3, "k", &id2).await? == v2,
        "v2 after v1 was deleted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn noncurrent_versions_are_healed_after_a_wiped_disk() -> Result<()> {
    let seed = test_seed("noncurrent_versions_are_healed_after_a_wiped_disk");
    let mut c = TestCluster::start_setup(1, 6, durable_setup()).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket(BUCKET).send().await?;
    set_versioning(&s3, BucketVersioningStatus::Enabled).await?;
    // Three versions, then a marker: every version is noncurrent.
    let mut written = Vec::new();
    for i in 0..3 {
        let data = random_bytes(seed + i, 30 * KIB);
        written.push((put_version(&s3, "k", &data).await?, data));
    }
    s3.delete_object().bucket(BUCKET).key("k").send().await?;
    c.wait_healed("after the writes", HEAL_TIMEOUT).await?;
    let before = c.shard_files(0).map_err(anyhow::Error::msg)?.len();
    ensure!(
        before > 0,
        "datanode 1 holds no shard: the test would prove nothing"
    );

    c.datanodes[0].stop().await?;
    c.wipe_datanode_dir(0)?;
    c.datanodes[0].start().await?;
    c.wait_datanodes_live().await?;
    c.wait_healed("datanode 1 wiped", HEAL_TIMEOUT).await?;
    let after = c.shard_files(0).map_err(anyhow::Error::msg)?.len();
    ensure!(
        after == before,
        "datanode 1 holds {after} shard files after heal, had {before}"
    );

    // Redundancy is back for every version: with two other nodes down,
    // reads need the rebuilt shards.
    c.datanodes[3].stop().await?;
    c.datanodes[4].stop().await?;
    c.wait_datanodes(&[1, 2, 3, 6], &[4, 5]).await?;
    for (id, data) in &written {
        ensure!(
            get_version(&s3, "k", id).await? == *data,
            "version {id} after heal"
        );
    }
    c.stop_all().await
}
