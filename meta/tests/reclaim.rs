//! Space reclamation on an in-process single-voter meta node, driven
//! through MetaClient: the blob reference index behind FilterUnreferenced
//! (the datanodes' shard GC asks it), and the stale multipart upload
//! sweeper.

use sluice_util::clock::wall_clock_ms;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{self as pb, ErrorCode};
use tokio::net::TcpListener;

mod common;
use common::{Node, wait_for};

/// The blob id of test blob `name` in write epoch 1 (each test opens it
/// first): the name's bytes in hex as the suffix.
fn blob_id(name: &str) -> String {
    format!("e1.{}", hex::encode(name))
}

/// Opens the tests' write epoch (the first of a fresh node: 1).
async fn open_epoch(client: &MetaClient) -> Result<()> {
    let e = client.open_epoch("test-gateway").await?;
    anyhow::ensure!(e.epoch == 1, "first epoch is {}", e.epoch);
    Ok(())
}

fn placement(blob: &str) -> pb::Placement {
    pb::Placement {
        blob_id: blob_id(blob),
        size: 6 << 20,
        data_shards: 4,
        parity_shards: 2,
        block_size: 262_144,
        nodes: vec![1, 2, 3, 4, 5, 6],
        missing: vec![],
    }
}

fn object(key: &str, blob: &str) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: 6 << 20,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        last_modified_ms: 1,
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 6 << 20,
            placement: Some(placement(blob)),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn create_upload(client: &MetaClient, key: &str, id: &str, initiated_ms: i64) -> Result<()> {
    client
        .create_upload(pb::UploadRecord {
            bucket: "b".into(),
            key: key.into(),
            upload_id: id.into(),
            initiated_ms,
            ..Default::default()
        })
        .await?;
    Ok(())
}

fn part(id: &str, n: u32, blob: &str) -> pb::PartRecord {
    pb::PartRecord {
        upload_id: id.into(),
        part_number: n,
        size: 6 << 20,
        md5: vec![n as u8; 16],
        placement: Some(placement(blob)),
        ..Default::default()
    }
}

/// The blob ids of test blobs `names`.
fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| blob_id(s)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_unreferenced_follows_commits_and_restarts() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start_on(tmp.path(), TcpListener::bind("127.0.0.1:0").await?, |_| {})?;
    let client = node.client();
    let all = strings(&["obj1", "obj2", "p1", "p2", "never"]);
    let unreferenced = |ids: Vec<String>| {
        let client = client.clone();
        async move { client.filter_unreferenced(ids).await }
    };

    open_epoch(&client).await?;
    assert!(client.create_bucket("b", 1).await?);
    client.put_object(object("k", "obj1")).await?;
    create_upload(&client, "m", "u1", wall_clock_ms()).await?;
    client.put_part("b", "m", part("u1", 1, "p1")).await?;
    client.put_part("b", "m", part("u1", 2, "p2")).await?;
    assert_eq!(
        unreferenced(all.clone()).await?,
        strings(&["obj2", "never"]),
        "a blob not yet committed (obj2) is unreferenced"
    );

    // Overwrite: obj1 becomes garbage.
    client.put_object(object("k", "obj2")).await?;
    assert_eq!(
        unreferenced(all.clone()).await?,
        strings(&["obj1", "never"])
    );

    // Complete with part 1 only: part 2 becomes garbage, part 1 lives on
    // in the object m.
    let done = client
        .complete_upload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "m".into(),
            upload_id: "u1".into(),
            parts: vec![pb::CompletedPart {
                part_number: 1,
                etag: hex::encode([1u8; 16]),
            }],
            now_ms: wall_clock_ms(),
            min_part_size: 5 << 20,
            checksums: None,
            ..Default::default()
        })
        .await?;
    assert_eq!(done.released, vec![placement("p2")]);
    assert_eq!(
        unreferenced(all.clone()).await?,
        strings(&["obj1", "p2", "never"])
    );

    // At most 1000 ids per call.
    let too_many: Vec<String> = (0..1001).map(|i| format!("x{i}")).collect();
    match client.filter_unreferenced(too_many).await {
        Err(MetaError::Refused {
            code: ErrorCode::InvalidArgument,
            ..
        }) => {}
        other => bail!("expected InvalidArgument, got {other:?}"),
    }
    let max: Vec<String> = (0..1000).map(|i| format!("x{i}")).collect();
    assert_eq!(client.filter_unreferenced(max).await?.len(), 1000);

    // The index is persistent state: a restart on the same directory keeps it.
    let config = node.shut_down().await?;
    let node = Node::start_on(
        &config.data_dir,
        TcpListener::bind(config.listen).await?,
        |_| {},
    )?;
    let client = node.client();
    assert_eq!(
        client.filter_unreferenced(all.clone()).await?,
        strings(&["obj1", "p2", "never"])
    );
    client.delete_object("b", "k").await?;
    client.delete_object("b", "m").await?;
    assert_eq!(client.filter_unreferenced(all.clone()).await?, all);
    node.shut_down().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_aborts_stale_uploads_only() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start_on(tmp.path(), TcpListener::bind("127.0.0.1:0").await?, |c| {
        c.stale_upload_check_interval = Duration::from_millis(200);
        c.stale_upload_expiry = Duration::from_secs(2);
    })?;
    let client = node.client();
    open_epoch(&client).await?;
    assert!(client.create_bucket("b", 1).await?);

    // Initiation is the leader's time, whatever the caller claims: "old"
    // claims to be a minute in the future and is still swept after 2 s.
    let created = Instant::now();
    create_upload(&client, "old", "u-old", wall_clock_ms() + 60_000).await?;
    client
        .put_part("b", "old", part("u-old", 1, "blob-old"))
        .await?;

    wait_for("the stale upload to be aborted", || async {
        match client.get_upload("b", "old", "u-old").await {
            Err(MetaError::Refused {
                code: ErrorCode::NoSuchUpload,
                ..
            }) => Some(()),
            _ => None,
        }
    })
    .await?;
    assert!(
        created.elapsed() >= Duration::from_secs(2),
        "aborted before its expiry (leader time)"
    );
    // Created now, claiming to be an hour old: younger than the 2 s expiry
    // by the leader's clock for the rest of the test.
    create_upload(&client, "fresh", "u-fresh", wall_clock_ms() - 3_600_000).await?;
    client
        .put_part("b", "fresh", part("u-fresh", 1, "blob-fresh"))
        .await?;

    // Aborted through the state machine: its parts are gone and its blob
    // is garbage for the datanodes' GC.
    match client
        .list_parts(pb::ListPartsRequest {
            bucket: "b".into(),
            key: "old".into(),
            upload_id: "u-old".into(),
            ..Default::default()
        })
        .await
    {
        Err(MetaError::Refused {
            code: ErrorCode::NoSuchUpload,
            ..
        }) => {}
        other => bail!("expected NoSuchUpload, got {other:?}"),
    }
    assert_eq!(
        client
            .filter_unreferenced(strings(&["blob-old", "blob-fresh"]))
            .await?,
        strings(&["blob-old"])
    );
    // The fresh upload and its part are untouched.
    let uploads = client
        .list_uploads(pb::ListUploadsRequest {
            bucket: "b".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(
        uploads
            .uploads
            .iter()
            .map(|u| u.upload_id.as_str())
            .collect::<Vec<_>>(),
        ["u-fresh"]
    );
    let parts = client
        .list_parts(pb::ListPartsRequest {
            bucket: "b".into(),
            key: "fresh".into(),
            upload_id: "u-fresh".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(parts.parts, vec![part("u-fresh", 1, "blob-fresh")]);
    node.shut_down().await?;
    Ok(())
}
