//! Shard GC against a real in-process meta (single voter, port 0): the
//! MetaClient-backed Collectable oracle, meta going away (nothing
//! deleted), and a running datanode registering with its disk identity and
//! collecting garbage on its own.
//!
//! The live blob belongs to a write epoch the test opens (a commit naming a
//! closed epoch is refused); the garbage blobs have ids that name no
//! epoch (meta never commits those), so meta answers them collectable and
//! GC deletes them, while the placed shard is kept.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use sluice_datanode::gc::{GcError, GcPass, MetaOracle, collect};
use sluice_datanode::locks::BlobLocks;
use sluice_datanode::store::{Block, DiskStore, ShardKey, ShardStore, ShardWriter};
use sluice_datanode::{Config, block_crc32c};
use sluice_meta_client::MetaClient;
use sluice_proto::blob_id::new_blob_id;
use sluice_proto::datanode::ListShardsRequest;
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::meta as pb;
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);
const HOUR: Duration = Duration::from_secs(3600);

/// A running role: its stop signal and task.
struct Running<E> {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), E>>,
}

impl<E: std::error::Error + Send + Sync + 'static> Running<E> {
    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .context("did not stop")??
            .map_err(anyhow::Error::new)
    }
}

/// Starts a single-voter meta in `dir`; returns it and its endpoint.
async fn start_meta(dir: &Path) -> Result<(Running<sluice_meta::Error>, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let endpoint = format!("http://{addr}");
    let config = sluice_meta::Config {
        listen: addr,
        advertise_addr: endpoint.clone(),
        data_dir: dir.to_path_buf(),
        sled_cache_bytes: ByteSize(4 << 20),
        heartbeat_interval: Duration::from_millis(100),
        election_timeout_min: Duration::from_millis(400),
        election_timeout_max: Duration::from_millis(800),
        insecure_cluster: true,
        ..sluice_meta::Config::default()
    };
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(sluice_meta::run(config, listener, async {
        let _ = rx.await;
    }));
    Ok((Running { stop, task }, endpoint))
}

/// Commits an object whose only part lives in blob `blob`.
async fn commit_object(meta: &MetaClient, key: &str, blob: &str) -> Result<()> {
    meta.put_object(pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: 4,
        etag: "e".into(),
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 4,
            placement: Some(pb::Placement {
                blob_id: blob.into(),
                size: 4,
                data_shards: 1,
                parity_shards: 0,
                block_size: 16,
                nodes: vec![1],
                missing: vec![],
            }),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// Writes shard 0 of `blob` and sets its mtime two hours back.
async fn old_shard(store: &DiskStore, blob: &str) -> Result<()> {
    let key = ShardKey::new(blob, 0)?;
    let mut w = store.create(&key, 16).await?;
    let data = Bytes::from_static(b"data");
    w.write_block(Block {
        crc32c: block_crc32c(&data),
        data,
    })
    .await?;
    w.commit().await?;
    std::fs::File::options()
        .write(true)
        .open(store.shard_path(&key))?
        .set_modified(SystemTime::now() - 2 * HOUR)?;
    Ok(())
}

/// The stored blob ids, sorted (the store lists in its own order).
async fn blob_ids(store: &DiskStore) -> Result<Vec<String>> {
    let page = store.list("", 1000).await?;
    let mut ids: Vec<String> = page
        .shards
        .iter()
        .map(|s| s.key.blob_id().to_string())
        .collect();
    ids.sort();
    Ok(ids)
}

fn pass() -> GcPass {
    GcPass::new(1, HOUR, SystemTime::now())
}

/// A client that gives up quickly (meta answering UNIMPLEMENTED is retried
/// until the deadline).
fn impatient(endpoint: &str) -> MetaClient {
    MetaClient::with_timeouts(
        vec![endpoint.to_string()],
        Duration::from_millis(600),
        Duration::from_millis(300),
    )
}

/// Opens a write epoch with `meta` and commits object `k` whose only part
/// lives in a fresh blob of that epoch; returns the blob id.
async fn commit_live(meta: &MetaClient) -> Result<String> {
    let epoch = meta.open_epoch("gc-test").await?.epoch;
    let live = new_blob_id(epoch, 0x11fe);
    commit_object(meta, "k", &live).await?;
    Ok(live)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_oracle_collects_garbage_and_nothing_when_meta_is_gone() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (meta, endpoint) = start_meta(&tmp.path().join("meta")).await?;
    let client = MetaClient::new(vec![endpoint.clone()]);
    client.create_bucket("b", 1).await?;
    let live = commit_live(&client).await?;

    let store = DiskStore::open(&tmp.path().join("dn"), 1).await?;
    old_shard(&store, &live).await?;
    old_shard(&store, "dead").await?;
    let oracle = MetaOracle::new(impatient(&endpoint));
    let locks = BlobLocks::new();
    // Only the unreferenced garbage blob goes; the placed shard stays.
    let report = collect(&store, &oracle, &locks, &pass()).await?;
    assert_eq!((report.old_shards, report.deleted_shards), (2, 1));
    assert_eq!(blob_ids(&store).await?, [live.as_str()]);

    // Meta goes away: the pass fails and deletes nothing.
    meta.stop().await?;
    old_shard(&store, "dead2").await?;
    let impatient = MetaOracle::new(MetaClient::with_timeouts(
        vec![endpoint],
        Duration::from_millis(300),
        Duration::from_millis(200),
    ));
    match collect(&store, &impatient, &locks, &pass()).await {
        Err(GcError::Oracle(_)) => {}
        other => bail!("expected an oracle error, got {other:?}"),
    }
    assert_eq!(blob_ids(&store).await?, ["dead2", live.as_str()]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_datanode_registers_its_disk_and_collects_garbage() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (meta, endpoint) = start_meta(&tmp.path().join("meta")).await?;
    let client = MetaClient::new(vec![endpoint.clone()]);
    client.create_bucket("b", 1).await?;
    let live = commit_live(&client).await?;

    // Shards left by an earlier run of the datanode.
    let data_dir = tmp.path().join("dn");
    {
        let store = DiskStore::open(&data_dir, 1).await?;
        old_shard(&store, &live).await?;
        old_shard(&store, "dead").await?;
    }

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", listener.local_addr()?);
    let config = Config {
        node_id: 1,
        listen: listener.local_addr()?,
        advertise_addr: addr.clone(),
        data_dir,
        meta_endpoints: vec![endpoint],
        heartbeat_interval: Duration::from_millis(200),
        shutdown_grace: Duration::from_secs(2),
        gc_interval: Duration::from_millis(100),
        gc_grace: HOUR,
        reserved_free_bytes: ByteSize(0),
        insecure_cluster: true,
        ..Config::default()
    };
    let (stop, rx) = oneshot::channel::<()>();
    let datanode = Running {
        stop,
        task: tokio::spawn(sluice_datanode::run(config, listener, async {
            let _ = rx.await;
        })),
    };

    let mut dn = DatanodeClient::connect(addr.clone()).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let nodes = client.list_datanodes().await?;
        if nodes.iter().any(|n| n.id == 1 && n.addr == addr && n.live) {
            break;
        }
        if Instant::now() > deadline {
            bail!("datanode never showed up live in meta: {nodes:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It registered with the disk id it wrote at start.
    let identity = std::fs::read_to_string(tmp.path().join("dn").join("sluice-disk.toml"))?;
    let disk: toml::Value = toml::from_str(&identity)?;
    assert_eq!(disk["node_id"].as_integer(), Some(1));
    assert_eq!(disk["disk_id"].as_str().map(str::len), Some(32));
    // Its GC passes collect the garbage and keep the placed shard.
    let expect = [live.as_str()];
    let deadline = Instant::now() + WAIT;
    loop {
        let shards = dn
            .list_shards(ListShardsRequest {
                after_blob_id: String::new(),
                limit: 100,
            })
            .await?
            .into_inner()
            .shards;
        let ids: Vec<&str> = shards.iter().map(|s| s.blob_id.as_str()).collect();
        if ids == expect {
            break;
        }
        assert!(
            ids.contains(&live.as_str()),
            "a referenced blob was collected"
        );
        if Instant::now() > deadline {
            bail!("timed out waiting for GC; shards: {ids:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    datanode.stop().await?;
    meta.stop().await?;
    Ok(())
}
