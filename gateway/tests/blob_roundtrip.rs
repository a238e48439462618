//! `BlobStore` against six real datanodes (real gRPC, real shard files) on
//! port-0 listeners: write, ranged reads, reads with two datanodes down,
//! bitrot, aborted writes and delete.
//!
//! The datanodes point at an unreachable meta (they keep retrying their
//! registration in the background, which is harmless); the store uses a
//! fixed datanode list.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Datanode, EPOCH, walk};
use futures::StreamExt;
use sluice_gateway::blob::{BlobError, BlobStore, BlobStoreConfig};
use sluice_proto::meta::Placement;
use sluice_test_support::payload;

const K: usize = 4;
const M: usize = 2;
/// Small blocks so a few hundred KiB span many stripes.
const BLOCK: usize = 4096;
const STRIPE: u64 = (K * BLOCK) as u64;

struct Cluster {
    nodes: Vec<Datanode>,
    store: BlobStore,
}

impl Cluster {
    async fn start() -> Result<Cluster> {
        sluice_test_support::init_tracing();
        let mut nodes = Vec::new();
        for id in 1..=6 {
            nodes.push(Datanode::start(id, common::no_scrub).await?);
        }
        let config = BlobStoreConfig {
            data_shards: K,
            parity_shards: M,
            block_size: BLOCK,
            write_quorum: K + 1,
            datanode_refresh_interval: Duration::from_secs(60),
            shard_channel_depth: 4,
            ..Default::default()
        };
        let (store, _) = common::fixed_store(config, common::up(&nodes)).await?;
        Ok(Cluster { nodes, store })
    }

    fn node(&mut self, id: u64) -> &mut Datanode {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .expect("node id in cluster")
    }

    /// Every file of `blob_id` on every datanode.
    fn files_of(&self, blob_id: &str) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for n in &self.nodes {
            out.extend(
                n.shard_files()?
                    .into_iter()
                    .filter(|p| file_name(p).starts_with(blob_id)),
            );
        }
        Ok(out)
    }

    async fn shut_down(mut self) -> Result<()> {
        for n in &mut self.nodes {
            n.shut_down().await?;
        }
        Ok(())
    }
}

fn is_temp(p: &Path) -> bool {
    file_name(p).contains(".tmp-")
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `data` as a body of uneven chunks: small ones, ones spanning several
/// stripes, ones ending mid-stripe.
fn body(
    data: &[u8],
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + use<> {
    let sizes = [
        1000usize,
        3 * STRIPE as usize + 5,
        7,
        STRIPE as usize,
        20_000,
        1,
    ];
    let mut chunks = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < data.len() {
        let n = sizes[i % sizes.len()].min(data.len() - pos);
        chunks.push(Ok(Bytes::copy_from_slice(&data[pos..pos + n])));
        pos += n;
        i += 1;
    }
    futures::stream::iter(chunks)
}

async fn read_all(
    store: &BlobStore,
    p: &Placement,
    range: std::ops::Range<u64>,
) -> Result<Vec<u8>, BlobError> {
    let mut stream = store.read(p, range);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// Ranges that start/end on and across stripe and block boundaries and in
/// the short last stripe.
fn ranges(size: u64) -> Vec<std::ops::Range<u64>> {
    let all = vec![
        0..size,
        0..1,
        size - 1..size,
        10..20,
        STRIPE - 1..STRIPE + 1,
        STRIPE..2 * STRIPE,
        BLOCK as u64 - 3..3 * BLOCK as u64 + 3,
        STRIPE + 100..4 * STRIPE + 7,
        size.saturating_sub(STRIPE + 10)..size,
        size - 5..size - 2,
    ];
    all.into_iter()
        .filter(|r| r.start < r.end && r.end <= size)
        .collect()
}

async fn check_reads(store: &BlobStore, p: &Placement, data: &[u8]) -> Result<()> {
    for r in ranges(data.len() as u64) {
        let got = read_all(store, p, r.clone())
            .await
            .with_context(|| format!("reading {r:?}"))?;
        ensure!(
            got == data[r.start as usize..r.end as usize],
            "range {r:?} differs"
        );
    }
    Ok(())
}

/// Waits up to 10 s for `cond`.
async fn eventually(what: &str, cond: impl FnMut() -> Result<bool>) -> Result<()> {
    sluice_test_support::eventually(what, Duration::from_secs(10), cond).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_ranges() -> Result<()> {
    let cluster = Cluster::start().await?;
    let data = payload(5 * STRIPE as usize + 1234, 7);
    let p = cluster
        .store
        .write("bucket/key/upload/1", body(&data), Some(data.len() as u64))
        .await?;
    assert_eq!(p.size, data.len() as u64);
    assert_eq!(
        (p.data_shards, p.parity_shards, p.block_size),
        (K as u32, M as u32, BLOCK as u32)
    );
    // `e<epoch>.<32 hex>` under the store's fixed epoch.
    assert_eq!(sluice_proto::blob_id::epoch_of(&p.blob_id).unwrap(), EPOCH);
    assert_eq!(p.blob_id.len(), "e1.".len() + 32, "{}", p.blob_id);
    let mut nodes = p.nodes.clone();
    nodes.sort_unstable();
    assert_eq!(nodes, vec![1, 2, 3, 4, 5, 6]);
    assert!(p.missing.is_empty(), "{:?}", p.missing);
    // Every shard is a committed file on its node.
    for (i, node) in p.nodes.iter().enumerate() {
        let name = format!("{}.{i}", p.blob_id);
        let files = cluster
            .nodes
            .iter()
            .find(|n| n.id == *node)
            .expect("node")
            .shard_files()?;
        assert!(
            files.iter().any(|f| file_name(f) == name),
            "shard {i} not on node {node}"
        );
    }
    check_reads(&cluster.store, &p, &data).await?;

    // An exact multiple of the stripe, and an empty blob.
    let data2 = payload(3 * STRIPE as usize, 8);
    let p2 = cluster
        .store
        .write("bucket/key2", body(&data2), None)
        .await?;
    assert_eq!(read_all(&cluster.store, &p2, 0..p2.size).await?, data2);
    assert_eq!(
        read_all(&cluster.store, &p2, STRIPE - 2..2 * STRIPE + 2).await?,
        data2[STRIPE as usize - 2..2 * STRIPE as usize + 2]
    );
    let empty = cluster
        .store
        .write("bucket/empty", futures::stream::iter(Vec::new()), None)
        .await?;
    assert_eq!(empty.size, 0);
    assert!(empty.missing.is_empty());
    assert!(read_all(&cluster.store, &empty, 0..0).await?.is_empty());
    assert_eq!(
        cluster.files_of(&empty.blob_id)?.len(),
        6,
        "empty shards are stored too"
    );

    // A one-byte blob: one stripe whose blocks are 1 byte.
    let p3 = cluster
        .store
        .write("bucket/one", body(b"z"), Some(1))
        .await?;
    assert_eq!(read_all(&cluster.store, &p3, 0..1).await?, b"z");
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_reconstruct_with_two_datanodes_down() -> Result<()> {
    let mut cluster = Cluster::start().await?;
    let data = payload(6 * STRIPE as usize + 999, 21);
    let p = cluster
        .store
        .write("bucket/degraded", body(&data), None)
        .await?;
    // Stop the nodes of two data shards: every stripe needs parity.
    let (a, b) = (p.nodes[0], p.nodes[2]);
    cluster.node(a).shut_down().await?;
    cluster.node(b).shut_down().await?;
    check_reads(&cluster.store, &p, &data).await?;

    // Writes: 4 reachable shards are below the write quorum of 5.
    let err = cluster
        .store
        .write("bucket/degraded2", body(&data), None)
        .await
        .expect_err("quorum");
    assert!(
        matches!(err, BlobError::QuorumNotReached { needed: 5, .. }),
        "{err:?}"
    );
    // No shard of the failed write was committed on the live nodes. (Its
    // streams were reset before the end, so none can be; temp files are the
    // datanode's to remove.)
    for n in cluster.nodes.iter().filter(|n| n.id != a && n.id != b) {
        let committed: Vec<PathBuf> = n
            .shard_files()?
            .into_iter()
            .filter(|f| !file_name(f).starts_with(&p.blob_id) && !is_temp(f))
            .collect();
        assert!(committed.is_empty(), "node {}: {committed:?}", n.id);
    }
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_with_one_datanode_down_records_missing_shard() -> Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.node(4).shut_down().await?;
    let data = payload(2 * STRIPE as usize + 17, 5);
    let p = cluster
        .store
        .write("bucket/partial", body(&data), None)
        .await?;
    let down = p
        .nodes
        .iter()
        .position(|&n| n == 4)
        .expect("6 of 6 nodes used") as u32;
    assert_eq!(p.missing, vec![down]);
    check_reads(&cluster.store, &p, &data).await?;
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_block_is_reconstructed() -> Result<()> {
    let cluster = Cluster::start().await?;
    let data = payload(4 * STRIPE as usize + 300, 99);
    let p = cluster
        .store
        .write("bucket/bitrot", body(&data), None)
        .await?;
    // Flip one byte inside block 1 of shard 1 (header 16 bytes, block 0 and its CRC).
    let name = format!("{}.1", p.blob_id);
    let file = cluster
        .files_of(&p.blob_id)?
        .into_iter()
        .find(|f| file_name(f) == name)
        .context("shard 1 file")?;
    let mut bytes = std::fs::read(&file)?;
    let offset = 16 + BLOCK + 4 + 10;
    bytes[offset] ^= 0xff;
    std::fs::write(&file, &bytes)?;
    check_reads(&cluster.store, &p, &data).await?;
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_error_leaves_nothing_and_delete_removes_shards() -> Result<()> {
    let cluster = Cluster::start().await?;
    // The body fails after three stripes, once every datanode is writing
    // its shard's temp file: the shard streams are reset and every datanode
    // discards its partial shard.
    let good = payload(3 * STRIPE as usize + 100, 3);
    let dirs: Vec<PathBuf> = cluster
        .nodes
        .iter()
        .map(|n| n.dir.path().join("shards"))
        .collect();
    let fail = futures::stream::once(async move {
        let writing = || -> Result<bool> {
            let mut n = 0;
            for d in &dirs {
                let mut files = Vec::new();
                walk(d, &mut files)?;
                // Past the 16-byte header: the datanode has a writer and is writing blocks.
                n += files
                    .iter()
                    .filter(|f| is_temp(f) && f.metadata().map(|m| m.len() > 16).unwrap_or(false))
                    .count();
            }
            Ok(n == 6)
        };
        let waited = eventually("all six shards being written", writing).await;
        Err(std::io::Error::other(format!(
            "client went away ({waited:?})"
        )))
    });
    let chunks = futures::stream::iter(vec![Ok(Bytes::from(good))]).chain(fail);
    let err = cluster
        .store
        .write("bucket/aborted", Box::pin(chunks), None)
        .await
        .expect_err("body error");
    let BlobError::Body(io) = &err else {
        panic!("{err:?}")
    };
    assert!(io.to_string().contains("(Ok(()))"), "{io}");
    eventually("aborted shards discarded", || {
        let mut files = 0;
        for n in &cluster.nodes {
            files += n.shard_files()?.len();
        }
        Ok(files == 0)
    })
    .await?;

    let data = payload(STRIPE as usize + 1, 4);
    let p = cluster
        .store
        .write("bucket/deleted", body(&data), None)
        .await?;
    assert_eq!(cluster.files_of(&p.blob_id)?.len(), 6);
    cluster.store.delete(std::slice::from_ref(&p)).await;
    assert!(cluster.files_of(&p.blob_id)?.is_empty());
    // Reading a deleted blob fails cleanly.
    let err = read_all(&cluster.store, &p, 0..p.size)
        .await
        .expect_err("deleted");
    assert!(matches!(err, BlobError::TooFewShards { .. }), "{err:?}");
    cluster.shut_down().await
}
