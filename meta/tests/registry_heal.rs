//! A real single-voter meta node: datanode registration with disk identity
//! (generation bump, duplicate-id refusal), capacity in ListDatanodes, and
//! the heal reads and writes (ReportMissing, ListPlacements, Collectable).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_meta::Config;
use sluice_meta_client::MetaClient;
use sluice_proto::blob_id::new_blob_id;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);

fn url(addr: std::net::SocketAddr) -> String {
    format!("http://{addr}")
}

fn object(blob: &str) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: "b".into(),
        key: "k".into(),
        size: 3,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        last_modified_ms: 1,
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 3,
            placement: Some(pb::Placement {
                blob_id: blob.into(),
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

fn shard(blob: &str, index: u32) -> pb::ShardRef {
    pb::ShardRef {
        blob_id: blob.into(),
        shard_index: index,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_capacity_and_heal_on_a_real_node() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = Config {
        node_id: 1,
        listen: addr,
        advertise_addr: url(addr),
        data_dir: tmp.path().join("meta1"),
        voters: BTreeMap::new(),
        sled_cache_bytes: ByteSize(4 << 20),
        heartbeat_interval: Duration::from_millis(100),
        election_timeout_min: Duration::from_millis(400),
        election_timeout_max: Duration::from_millis(800),
        // Short, so the test's write epoch closes once it stops renewing.
        epoch_lease: Duration::from_secs(3),
        epoch_sweep_interval: Duration::from_millis(50),
        insecure_cluster: true,
        ..Config::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(sluice_meta::run(config, listener, async {
        let _ = stopped.await;
    }));
    let client = MetaClient::with_timeouts(
        vec![url(addr)],
        Duration::from_secs(20),
        Duration::from_secs(5),
    );
    let deadline = Instant::now() + WAIT;
    while client.cluster_status().await.ok().and_then(|s| s.leader_id) != Some(1) {
        if Instant::now() > deadline {
            bail!("no leader");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Registration with disk identity.
    let r = client
        .register_datanode(4, "http://127.0.0.1:7104", "disk-a")
        .await?;
    assert_eq!((r.disk_generation, r.disk_replaced), (0, false));
    // Same id, other disk and other address while live: a second process.
    let dup = client
        .register_datanode(4, "http://127.0.0.1:7999", "disk-z")
        .await
        .expect_err("a live id is refused to another process");
    assert_eq!(dup.code(), Some(ErrorCode::DuplicateDatanode));
    // Same address, new disk: the node's disk was wiped or replaced.
    let r = client
        .register_datanode(4, "http://127.0.0.1:7104", "disk-b")
        .await?;
    assert_eq!((r.disk_generation, r.disk_replaced), (1, true));

    // Heartbeats carry capacity; a heartbeat with a new disk re-registers.
    client
        .heartbeat(pb::HeartbeatRequest {
            id: 4,
            addr: "http://127.0.0.1:7104".into(),
            disk_id: "disk-c".into(),
            writable: false,
            free_bytes: 512 << 20,
            used_bytes: 9 << 30,
            ..Default::default()
        })
        .await?;
    client
        .heartbeat(pb::HeartbeatRequest {
            id: 5,
            addr: "http://127.0.0.1:7105".into(),
            disk_id: "disk-5".into(),
            writable: true,
            free_bytes: 100 << 30,
            used_bytes: 1 << 20,
            ..Default::default()
        })
        .await?;
    let nodes = client.list_datanodes().await?;
    let by_id: BTreeMap<u64, &pb::DatanodeInfo> = nodes.iter().map(|d| (d.id, d)).collect();
    let four = by_id.get(&4).context("node 4")?;
    assert_eq!(four.disk_id, "disk-c");
    assert_eq!(four.disk_generation, 2);
    assert!(four.live && !four.writable);
    assert_eq!((four.free_bytes, four.used_bytes), (512 << 20, 9 << 30));
    let five = by_id.get(&5).context("node 5")?;
    assert_eq!(
        (
            five.disk_generation,
            five.writable,
            five.free_bytes,
            five.used_bytes
        ),
        (0, true, 100 << 30, 1 << 20)
    );
    assert!(five.last_heartbeat_ms > 0);

    // Heal reads and writes over gRPC.
    assert!(client.create_bucket("b", 1).await?);
    let epoch = client.open_epoch("registry-heal-test").await?.epoch;
    let blob = new_blob_id(epoch, 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    client.put_object(object(&blob)).await?;
    assert_eq!(client.report_missing(3, vec![shard(&blob, 2)]).await?, 1);
    let page = client
        .list_placements(pb::ListPlacementsRequest {
            after_blob_id: String::new(),
            limit: 0,
            degraded_only: true,
        })
        .await?;
    assert_eq!(page.blobs.len(), 1);
    let placed = &page.blobs[0];
    assert_eq!(
        placed.placement.as_ref().context("placement")?.missing,
        vec![2]
    );
    let locator = placed.locator.as_ref().context("locator")?;
    assert_eq!((locator.bucket.as_str(), locator.key.as_str()), ("b", "k"));
    // While the blob's epoch is open, even the unplaced shards on node 3
    // (the missing shard's stale file, a shard never placed there) stay.
    client.renew_epoch(epoch).await?;
    assert!(
        client
            .collectable(3, vec![shard(&blob, 2), shard(&blob, 0)])
            .await?
            .is_empty()
    );
    // Once the epoch closes (no more renewals), the shard never placed
    // there may go; the missing one stays while its index is still assigned
    // to node 3 (node 3 may only have been down: its copy may be needed
    // until heal moves the index), and node 1's placed shard stays.
    let deadline = Instant::now() + WAIT;
    loop {
        let got = client
            .collectable(3, vec![shard(&blob, 2), shard(&blob, 0)])
            .await?;
        if got == vec![shard(&blob, 0)] {
            break;
        }
        assert!(got.is_empty(), "collectable: {got:?}");
        if Instant::now() > deadline {
            bail!("the write epoch never closed");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        client
            .collectable(1, vec![shard(&blob, 0)])
            .await?
            .is_empty()
    );

    let _ = stop.send(());
    tokio::time::timeout(WAIT, node).await???;
    Ok(())
}
