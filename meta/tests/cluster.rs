//! In-process meta clusters on port-0 listeners, driven through MetaClient:
//! three voters with leader failover, snapshot catch-up and restart; a
//! single voter restarted on the same directory.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_meta::Config;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);

/// Polls `check` until it yields a value or `WAIT` passes.
async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    sluice_test_support::wait_for_some(what, WAIT, check).await
}

/// A started node: its stop signal and its `run` task.
type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), sluice_meta::Error>>,
);

struct Node {
    id: u64,
    addr: SocketAddr,
    dir: PathBuf,
    voters: BTreeMap<u64, String>,
    /// Started with `join = true` (added to a running cluster).
    join: bool,
    running: Option<Running>,
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

impl Node {
    fn config(&self) -> Config {
        Config {
            node_id: self.id,
            listen: self.addr,
            advertise_addr: url(self.addr),
            data_dir: self.dir.clone(),
            voters: self.voters.clone(),
            sled_cache_bytes: ByteSize(4 << 20),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            snapshot_logs_since_last: 20,
            max_in_snapshot_log_to_keep: 5,
            // The tests' one write epoch must outlive failovers and restarts.
            epoch_lease: Duration::from_secs(600),
            session_expiry: Duration::from_secs(1800),
            insecure_cluster: true,
            join: self.join,
            ..Config::default()
        }
    }

    fn start(&mut self, listener: TcpListener) {
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(sluice_meta::run(self.config(), listener, async {
            let _ = rx.await;
        }));
        self.running = Some((tx, handle));
    }

    async fn restart(&mut self) -> Result<()> {
        let listener = TcpListener::bind(self.addr)
            .await
            .context("rebind the same port")?;
        self.start(listener);
        Ok(())
    }

    async fn stop(&mut self) -> Result<()> {
        let (tx, handle) = self.running.take().context("node not running")?;
        let _ = tx.send(());
        tokio::time::timeout(WAIT, handle)
            .await
            .context("node did not stop")???;
        Ok(())
    }

    fn client(&self) -> MetaClient {
        MetaClient::with_timeouts(
            vec![url(self.addr)],
            Duration::from_secs(2),
            Duration::from_secs(2),
        )
    }
}

async fn cluster(dir: &Path, n: u64) -> Result<(Vec<Node>, Vec<TcpListener>)> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let voters: BTreeMap<u64, String> = if n == 1 {
        BTreeMap::new()
    } else {
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, url(*a)))
            .collect()
    };
    let nodes = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| Node {
            id: i as u64 + 1,
            addr: *a,
            dir: dir.join(format!("meta{}", i + 1)),
            voters: voters.clone(),
            join: false,
            running: None,
        })
        .collect();
    Ok((nodes, listeners))
}

/// The blob id of test blob `name` in write epoch 1 (opened by each test
/// first): the name's bytes in hex as the suffix.
fn blob_id(name: &str) -> String {
    format!("e1.{}", hex::encode(name))
}

/// Opens the tests' write epoch (the first of a fresh cluster: 1).
async fn open_epoch(client: &MetaClient) -> Result<()> {
    let e = client.open_epoch("test-gateway").await?;
    anyhow::ensure!(e.epoch == 1, "first epoch is {}", e.epoch);
    Ok(())
}

fn object(bucket: &str, key: &str, blob: &str) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: bucket.into(),
        key: key.into(),
        size: 3,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        last_modified_ms: 1,
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 3,
            placement: Some(pb::Placement {
                blob_id: blob_id(blob),
                size: 3,
                data_shards: 4,
                parity_shards: 2,
                block_size: 262_144,
                nodes: vec![1, 2, 3, 4, 5, 6],
                missing: vec![],
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn leader_of(client: &MetaClient) -> Option<(u64, u64)> {
    let s = client.cluster_status().await.ok()?;
    s.leader_id.map(|l| (l, s.term))
}

/// Three started voters with the write epoch open and bucket `b` created
/// (by owner 10); returns them, a client of all three and the leader's id.
async fn three_voters_with_bucket_b(dir: &Path) -> Result<(Vec<Node>, MetaClient, u64)> {
    let (mut nodes, listeners) = cluster(dir, 3).await?;
    for (node, listener) in nodes.iter_mut().zip(listeners) {
        node.start(listener);
    }
    let seeds: Vec<String> = nodes.iter().map(|n| url(n.addr)).collect();
    let client = MetaClient::new(seeds);
    let (leader, _) = wait_for("a leader", || leader_of(&client)).await?;
    open_epoch(&client).await?;
    assert!(client.create_bucket("b", 10).await?);
    Ok((nodes, client, leader))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_fail_over_catch_up_and_restart() -> Result<()> {
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let (mut nodes, client, leader) = three_voters_with_bucket_b(tmp.path()).await?;
    assert!((1..=3).contains(&leader));
    assert!(
        !client.create_bucket("b", 11).await?,
        "re-create by the owner"
    );
    for i in 0..30 {
        assert!(
            client
                .put_object(object("b", &format!("k{i:02}"), &format!("blob{i}")))
                .await?
                .is_empty()
        );
    }
    let listing = client
        .list_objects(pb::ListObjectsRequest {
            bucket: "b".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(listing.objects.len(), 30);

    // A follower answers NOT_LEADER with the leader's address.
    let follower = nodes
        .iter()
        .find(|n| n.id != leader)
        .context("a follower")?;
    let mut raw = pb::meta_client::MetaClient::connect(url(follower.addr)).await?;
    let status = raw
        .heartbeat(pb::HeartbeatRequest {
            id: 1,
            addr: "http://127.0.0.1:1".into(),
            ..Default::default()
        })
        .await
        .expect_err("heartbeat on a follower");
    let detail = sluice_proto::error::detail(&status).context("NOT_LEADER detail")?;
    assert_eq!(detail.code(), ErrorCode::NotLeader);
    assert_eq!(detail.leader_id, Some(leader));
    let leader_node = nodes
        .iter()
        .find(|n| n.id == leader)
        .context("leader node")?;
    assert_eq!(detail.leader_addr, Some(url(leader_node.addr)));

    // Stop the leader: a new one is elected and the client follows it.
    let old = leader;
    nodes
        .iter_mut()
        .find(|n| n.id == old)
        .context("leader")?
        .stop()
        .await?;
    let survivor = nodes
        .iter()
        .find(|n| n.id != old)
        .context("survivor")?
        .client();
    let (new_leader, _) = wait_for("a new leader", || async {
        leader_of(&survivor).await.filter(|(l, _)| *l != old)
    })
    .await?;
    assert_ne!(new_leader, old);
    // Enough writes for snapshots and log purges past what the stopped node has.
    for i in 30..80 {
        client
            .put_object(object("b", &format!("k{i:02}"), &format!("blob{i}")))
            .await?;
    }
    let replaced = client.put_object(object("b", "k05", "blob5-new")).await?;
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0].blob_id, blob_id("blob5"));
    assert_eq!(
        client.get_object("b", "k05").await?.parts[0]
            .placement
            .as_ref()
            .unwrap()
            .blob_id,
        blob_id("blob5-new")
    );
    let status = client.cluster_status().await?;
    let target_index = status.last_applied_index;

    // Restart the old leader on the same directory and port; it catches up
    // (from a snapshot, its log tail was purged) and follows the new leader.
    let restarted = nodes
        .iter_mut()
        .find(|n| n.id == old)
        .context("old leader")?;
    restarted.restart().await?;
    let direct = restarted.client();
    wait_for("the restarted node to catch up", || async {
        let s = direct.cluster_status().await.ok()?;
        (s.leader_id == Some(new_leader) && s.last_applied_index >= target_index).then_some(())
    })
    .await?;
    assert_eq!(direct.cluster_status().await?.voters, vec![1, 2, 3]);

    let listing = client
        .list_objects(pb::ListObjectsRequest {
            bucket: "b".into(),
            max_keys: 1000,
            ..Default::default()
        })
        .await?;
    assert_eq!(listing.objects.len(), 80);
    match client.get_object("b", "missing").await {
        Err(MetaError::Refused {
            code: ErrorCode::NoSuchKey,
            ..
        }) => {}
        other => bail!("expected NoSuchKey, got {other:?}"),
    }

    for node in &mut nodes {
        if node.running.is_some() {
            node.stop().await?;
        }
    }
    Ok(())
}

/// An object whose body is inline in its record (`size` bytes of `fill`).
fn inline_object(key: &str, size: usize, fill: u8) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: size as u64,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        last_modified_ms: 1,
        inline_data: vec![fill; size],
        ..Default::default()
    }
}

/// A voter whose disk is lost is replaced the supported way while a
/// writer keeps writing: it is removed, and a node with a new id and an
/// empty directory (`join = true`) is added with AddVoter. The leader has
/// purged the log it would need, so the new node catches up by a snapshot
/// (several of openraft's 3 MiB chunks, built while entries keep being
/// applied) before it is promoted, and every acknowledged write is in its
/// store. (Restarting a wiped voter under its old id is not supported:
/// Raft assumes a voter never loses its log, and openraft 0.9 then sends
/// it entries without their predecessors.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_voter_catches_up_by_snapshot_under_write_load() -> Result<()> {
    use sluice_meta::store::{KvStore, SledStore, Space};
    use sluice_proto::admin::{self as apb, admin_client::AdminClient};
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let (mut nodes, client, leader) = three_voters_with_bucket_b(tmp.path()).await?;
    // About 8 MiB of records: the snapshot is sent in several chunks.
    const BODY: usize = 8 << 10;
    for i in 0..1000 {
        client
            .put_object(inline_object(&format!("k{i:05}"), BODY, i as u8))
            .await?;
    }
    // The leader no longer has entry 1: an empty node can only catch up by
    // a snapshot.
    let purged = client.cluster_status().await?.purged_index;
    assert!(purged >= Some(1), "leader purged {purged:?}");

    // A follower loses its disk: it is removed and stopped.
    let lost = nodes
        .iter_mut()
        .find(|n| n.id != leader)
        .context("a follower")?;
    let lost_id = lost.id;
    client
        .call_on("RemoveVoter", |ch| async move {
            AdminClient::new(ch)
                .remove_voter(apb::RemoveVoterRequest { id: lost_id })
                .await
        })
        .await?;
    lost.stop().await?;
    std::fs::remove_dir_all(&lost.dir)?;

    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 1000..1600 {
                let key = format!("k{i:05}");
                client
                    .put_object(inline_object(&key, BODY, i as u8))
                    .await?;
                acked.push(key);
            }
            anyhow::Ok(acked)
        })
    };
    // Its replacement: a new id, an empty directory, `join = true`.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let mut replacement = Node {
        id: 4,
        addr: listener.local_addr()?,
        dir: tmp.path().join("meta4"),
        voters: nodes[0].voters.clone(),
        join: true,
        running: None,
    };
    replacement.start(listener);
    let req = apb::AddVoterRequest {
        id: 4,
        addr: url(replacement.addr),
        catch_up_timeout_ms: Some(60_000),
    };
    let added = client
        .call_on("AddVoter", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).add_voter(req).await }
        })
        .await?;
    let members = added.members.context("members after AddVoter")?;
    assert!(
        members.members.iter().any(|m| m.id == 4 && m.voter),
        "{members:?}"
    );
    let acked = writer.await??;
    assert_eq!(acked.len(), 600);
    let target_index = client.cluster_status().await?.last_applied_index;
    let direct = replacement.client();
    wait_for("the replacement to catch up", || async {
        let s = direct.cluster_status().await.ok()?;
        (s.last_applied_index >= target_index).then_some(())
    })
    .await?;
    replacement.stop().await?;

    // Its own store holds every object, each with its body.
    let kv = SledStore::open(&replacement.dir, 4 << 20)?;
    let keys = kv.keys_in(
        Space::Objects,
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
    )?;
    assert_eq!(keys.len(), 1600);
    for i in [0usize, 999, 1000, 1599] {
        // The record's head and its manifest (which holds the body).
        let record =
            sluice_meta::sm::records::get(&kv, Space::Objects, format!("b\0k{i:05}").as_bytes())?
                .with_context(|| format!("object k{i:05} on the replacement"))?;
        assert_eq!(record.inline_data, vec![i as u8; BODY]);
    }
    // One snapshot file (installed or built since) is kept beside sled.
    let snapshots: Vec<_> = std::fs::read_dir(replacement.dir.join("raft-snapshots"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .collect();
    assert_eq!(snapshots.len(), 1);
    drop(kv);

    for node in &mut nodes {
        if node.running.is_some() {
            node.stop().await?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_voter_restart_keeps_everything() -> Result<()> {
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let (mut nodes, listeners) = cluster(tmp.path(), 1).await?;
    let node = &mut nodes[0];
    node.start(listeners.into_iter().next().context("listener")?);
    let client = MetaClient::with_timeouts(
        vec![url(node.addr)],
        Duration::from_secs(20),
        Duration::from_secs(5),
    );

    open_epoch(&client).await?;
    assert!(client.create_bucket("photos", 1).await?);
    client
        .put_object(object("photos", "a/1.jpg", "blob-a"))
        .await?;
    client
        .create_upload(pb::UploadRecord {
            bucket: "photos".into(),
            key: "big".into(),
            upload_id: "u1".into(),
            initiated_ms: 2,
            ..Default::default()
        })
        .await?;
    let part = pb::PartRecord {
        upload_id: "u1".into(),
        part_number: 1,
        size: 6 << 20,
        md5: vec![7; 16],
        ..Default::default()
    };
    assert!(
        client
            .put_part("photos", "big", part.clone())
            .await?
            .is_empty()
    );
    client
        .register_datanode(4, "http://127.0.0.1:7104", "disk-4")
        .await?;
    let beat = |id: u64, addr: &str| pb::HeartbeatRequest {
        id,
        addr: addr.into(),
        disk_id: format!("disk-{id}"),
        writable: true,
        ..Default::default()
    };
    client.heartbeat(beat(4, "http://127.0.0.1:7104")).await?;
    // An unknown datanode's heartbeat registers it.
    client.heartbeat(beat(5, "http://127.0.0.1:7105")).await?;
    let dns = client.list_datanodes().await?;
    assert_eq!(
        dns.iter().map(|d| (d.id, d.live)).collect::<Vec<_>>(),
        [(4, true), (5, true)]
    );
    assert!(dns.iter().all(|d| d.last_heartbeat_ms > 0));

    node.stop().await?;
    // run() returned: the sled directory is unlocked and opens at once.
    drop(
        sluice_meta::store::SledStore::open(&node.dir, 1 << 20)
            .context("reopen right after stop")?,
    );
    node.restart().await?;

    let obj = client.get_object("photos", "a/1.jpg").await?;
    assert_eq!(
        obj.parts[0].placement.as_ref().map(|p| p.blob_id.clone()),
        Some(blob_id("blob-a"))
    );
    let uploads = client
        .list_uploads(pb::ListUploadsRequest {
            bucket: "photos".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(uploads.uploads.len(), 1);
    let parts = client
        .list_parts(pb::ListPartsRequest {
            bucket: "photos".into(),
            key: "big".into(),
            upload_id: "u1".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(parts.parts, vec![part]);
    assert_eq!(client.list_buckets().await?.len(), 1);
    let dns = client.list_datanodes().await?;
    assert_eq!(dns.len(), 2);
    assert!(
        dns.iter().all(|d| d.live),
        "registered datanodes are live right after election"
    );

    match client.delete_bucket("photos").await {
        Err(MetaError::Refused {
            code: ErrorCode::BucketNotEmpty,
            ..
        }) => {}
        other => bail!("expected BucketNotEmpty, got {other:?}"),
    }
    node.stop().await?;
    Ok(())
}
