//! Write epochs, meta-owned deletion and writable placement against seven
//! real datanodes (real gRPC, real shard files) on port-0 listeners, and
//! the epoch renewal/rotation logic against a fake meta behind
//! [`EpochService`].
//!
//! The datanodes point at an unreachable meta (their registration retries
//! in the background, harmlessly); the store uses a fixed datanode list.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use common::Datanode;
use sluice_gateway::blob::{BlobError, BlobStore, BlobStoreConfig};
use sluice_gateway::datanodes::{DatanodeEntry, FixedDatanodes};
use sluice_gateway::epoch::{EpochConfig, EpochService, MAX_LIVE_EPOCHS, WriteEpochs};
use sluice_gateway::s3::Gateway;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::blob_id;
use sluice_proto::meta::{ErrorCode, OpenEpochResponse};

const K: usize = 4;
const M: usize = 2;
const BLOCK: usize = 4096;
const STRIPE: usize = K * BLOCK;
const NODES: u64 = 7;

struct Cluster {
    nodes: Vec<Datanode>,
    store: BlobStore,
    /// The store's datanode set, marked full by hand.
    directory: Arc<FixedDatanodes>,
}

impl Cluster {
    async fn start(epochs: WriteEpochs) -> Result<Cluster> {
        sluice_test_support::init_tracing();
        let mut nodes = Vec::new();
        for id in 1..=NODES {
            nodes.push(Datanode::start(id, common::defaults).await?);
        }
        let config = BlobStoreConfig {
            data_shards: K,
            parity_shards: M,
            block_size: BLOCK,
            write_quorum: K + 1,
            datanode_refresh_interval: Duration::from_secs(60),
            ..Default::default()
        };
        let (store, directory) =
            common::fixed_store_with(config, common::up(&nodes), epochs).await?;
        Ok(Cluster {
            nodes,
            store,
            directory,
        })
    }

    /// Marks the nodes in `full` live but not writable.
    async fn set_full(&self, full: &[u64]) -> Result<()> {
        self.directory.set(
            self.nodes
                .iter()
                .map(|n| DatanodeEntry {
                    writable: !full.contains(&n.id),
                    free_bytes: if full.contains(&n.id) { 0 } else { 1 << 30 },
                    ..DatanodeEntry::up(n.id, n.addr.clone())
                })
                .collect(),
        );
        self.store.refresh_datanodes().await?;
        Ok(())
    }

    /// Committed shard files of `blob` on each node: (node, count).
    fn shards_of(&self, blob: &str) -> Result<Vec<(u64, usize)>> {
        let prefix = format!("{blob}.");
        self.nodes
            .iter()
            .map(|n| {
                let count = n
                    .shard_files()?
                    .iter()
                    .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .filter(|f| f.starts_with(&prefix) && !f.contains(".tmp-"))
                    .count();
                Ok((n.id, count))
            })
            .collect()
    }

    fn shard_count(&self, blob: &str) -> Result<usize> {
        Ok(self.shards_of(blob)?.iter().map(|(_, c)| c).sum())
    }

    async fn shut_down(mut self) -> Result<()> {
        self.store.shutdown().await;
        for n in &mut self.nodes {
            n.shut_down().await?;
        }
        Ok(())
    }
}

fn body(
    len: usize,
    seed: u8,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + use<> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    futures::stream::iter(vec![Ok(Bytes::from(data))])
}

async fn eventually(what: &str, cond: impl FnMut() -> Result<bool>) -> Result<()> {
    sluice_test_support::eventually(what, Duration::from_secs(10), cond).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_ids_name_the_write_epoch() -> Result<()> {
    let cluster = Cluster::start(WriteEpochs::fixed(42)).await?;
    let guard = cluster.store.epochs().begin_write();
    assert_eq!(guard.epoch(), 42);
    let p = cluster
        .store
        .write_under(&guard, "bucket/key", body(3 * STRIPE + 5, 1), None)
        .await?;
    assert!(p.blob_id.starts_with("e42."), "{}", p.blob_id);
    assert_eq!(blob_id::epoch_of(&p.blob_id).unwrap(), 42);
    assert_eq!(p.blob_id.len(), "e42.".len() + 32);
    // Every shard is stored under the epoch id.
    assert_eq!(cluster.shard_count(&p.blob_id)?, K + M);
    // Two writes never share an id.
    let q = cluster.store.write("bucket/key", body(10, 2), None).await?;
    assert_eq!(blob_id::epoch_of(&q.blob_id).unwrap(), 42);
    assert_ne!(p.blob_id, q.blob_id);
    drop(guard);
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_datanodes_get_no_new_shards_and_too_few_writable_is_503() -> Result<()> {
    let cluster = Cluster::start(WriteEpochs::fixed(3)).await?;
    // One of seven full: six writable nodes hold every shard.
    cluster.set_full(&[5]).await?;
    for i in 0..12 {
        let p = cluster
            .store
            .write(&format!("bucket/k{i}"), body(STRIPE + 7, i as u8), None)
            .await?;
        assert!(!p.nodes.contains(&5), "{:?}", p.nodes);
        assert!(p.missing.is_empty(), "{:?}", p.missing);
        let on_full = cluster
            .shards_of(&p.blob_id)?
            .into_iter()
            .find(|(n, _)| *n == 5)
            .map(|(_, c)| c);
        assert_eq!(on_full, Some(0));
    }
    // Three of seven full: 4 writable < write quorum 5, although all 7 are
    // live: refused before any shard is written.
    cluster.set_full(&[1, 3, 5]).await?;
    let err = cluster
        .store
        .write("bucket/full", body(STRIPE, 9), None)
        .await
        .expect_err("4 writable < quorum 5");
    assert!(
        matches!(
            err,
            BlobError::NotEnoughWritable {
                writable: 4,
                needed: 5
            }
        ),
        "{err:?}"
    );
    let s3 = sluice_gateway::s3::error::blob_error(err);
    assert_eq!(s3.status_code().map(|s| s.as_u16()), Some(503));
    assert_eq!(s3.code().as_str(), "ServiceUnavailable");
    assert!(
        s3.message()
            .is_some_and(|m| m.starts_with("not enough writable datanodes: 4 writable, 5 needed")),
        "{:?}",
        s3.message()
    );
    // Back to writable: writes go through again.
    cluster.set_full(&[]).await?;
    cluster
        .store
        .write("bucket/again", body(100, 4), None)
        .await?;
    cluster.shut_down().await
}

/// A gateway over the cluster with a meta that is never reached (the
/// reclaimer does not call meta).
fn gateway(cluster: &Cluster) -> Gateway {
    Gateway::new(
        MetaClient::new(vec!["http://127.0.0.1:9".into()]),
        cluster.store.clone(),
        "us-east-1".into(),
        4,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_blobs_are_left_to_meta_and_refused_commits_are_deleted() -> Result<()> {
    let cluster = Cluster::start(WriteEpochs::fixed(5)).await?;
    let gw = gateway(&cluster);
    let released = cluster
        .store
        .write("bucket/old", body(2 * STRIPE, 1), None)
        .await?;
    assert_eq!(cluster.shard_count(&released.blob_id)?, K + M);
    // What a commit, DeleteObject or AbortMultipartUpload released: meta
    // deletes it after delete_delay; the gateway deletes nothing.
    gw.reclaimer().release(std::slice::from_ref(&released));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cluster.shard_count(&released.blob_id)?,
        K + M,
        "still there"
    );

    // A commit whose outcome is unknown: left to datanode GC.
    let unknown = cluster
        .store
        .write("bucket/unknown", body(STRIPE, 2), None)
        .await?;
    sluice_gateway::s3::put::discard_uncommitted(
        &gw,
        &MetaError::Unavailable("no leader".into()),
        Some(unknown.clone()),
    )
    .await;
    // A commit meta refused (here: the write epoch was closed): the blob is
    // unreferenced forever and the gateway deletes it.
    let refused = cluster
        .store
        .write("bucket/refused", body(STRIPE, 3), None)
        .await?;
    sluice_gateway::s3::put::discard_uncommitted(
        &gw,
        &MetaError::Refused {
            code: ErrorCode::EpochClosed,
            message: "epoch 5 is closed".into(),
        },
        Some(refused.clone()),
    )
    .await;
    gw.drain().await;
    assert_eq!(cluster.shard_count(&refused.blob_id)?, 0, "discarded");
    assert_eq!(cluster.shard_count(&unknown.blob_id)?, K + M, "left to GC");
    assert_eq!(
        cluster.shard_count(&released.blob_id)?,
        K + M,
        "left to meta"
    );
    cluster.shut_down().await
}

// ------------------------------------------------ epoch logic against a fake

/// A fake meta for write epochs: opens epochs 1, 2, 3, ...; refuses
/// renewals of closed epochs with EPOCH_CLOSED; fails the first
/// `fail_opens` opens as unavailable; records every renewal.
#[derive(Default)]
struct FakeMeta {
    state: Mutex<FakeState>,
    lease_ms: u64,
}

#[derive(Default)]
struct FakeState {
    next: u64,
    closed: Vec<u64>,
    renewals: Vec<u64>,
    fail_opens: usize,
    opens: usize,
}

impl FakeMeta {
    fn new(lease_ms: u64) -> Arc<FakeMeta> {
        Arc::new(FakeMeta {
            lease_ms,
            ..Default::default()
        })
    }

    fn renewals_of(&self, epoch: u64) -> usize {
        let s = self.state.lock().unwrap();
        s.renewals.iter().filter(|&&e| e == epoch).count()
    }

    fn close(&self, epoch: u64) {
        self.state.lock().unwrap().closed.push(epoch);
    }
}

#[async_trait::async_trait]
impl EpochService for FakeMeta {
    async fn open(&self) -> Result<OpenEpochResponse, MetaError> {
        let mut s = self.state.lock().unwrap();
        s.opens += 1;
        if s.fail_opens > 0 {
            s.fail_opens -= 1;
            return Err(MetaError::Unavailable("no leader".into()));
        }
        s.next += 1;
        Ok(OpenEpochResponse {
            epoch: s.next,
            lease_ms: self.lease_ms,
        })
    }

    async fn renew(&self, epoch: u64) -> Result<(), MetaError> {
        let mut s = self.state.lock().unwrap();
        if s.closed.contains(&epoch) {
            return Err(MetaError::Refused {
                code: ErrorCode::EpochClosed,
                message: format!("epoch {epoch} is closed"),
            });
        }
        s.renewals.push(epoch);
        Ok(())
    }
}

fn config(rotation_ms: u64) -> EpochConfig {
    EpochConfig {
        rotation: Duration::from_millis(rotation_ms),
        start_deadline: Duration::from_secs(5),
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    eventually(what, || Ok(cond())).await
}

#[tokio::test]
async fn renews_every_third_of_the_lease() -> Result<()> {
    let meta = FakeMeta::new(300);
    let epochs = WriteEpochs::start(meta.clone(), config(60_000)).await?;
    assert_eq!(epochs.current(), 1);
    tokio::time::sleep(Duration::from_millis(1050)).await;
    // 100 ms apart: about 10 renewals in 1 s (scheduling slack allowed).
    let n = meta.renewals_of(1);
    assert!((7..=11).contains(&n), "{n} renewals");
    epochs.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = meta.renewals_of(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(meta.renewals_of(1), after, "stop ends renewals");
    Ok(())
}

#[tokio::test]
async fn rotation_keeps_an_old_epoch_renewed_while_a_write_holds_it() -> Result<()> {
    let meta = FakeMeta::new(60);
    let epochs = WriteEpochs::start(meta.clone(), config(150)).await?;
    let write = epochs.begin_write();
    assert_eq!(write.epoch(), 1);
    wait_for("rotation", || epochs.current() >= 2).await?;
    // New writes use the new epoch; the old one stays live with its guard.
    assert!(epochs.begin_write().epoch() >= 2);
    assert!(epochs.live().contains(&(1, 1)), "{:?}", epochs.live());
    let before = meta.renewals_of(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        meta.renewals_of(1) >= before + 3,
        "epoch 1 still renewed while its write runs"
    );
    // The write committed: epoch 1 leaves the live set and is left to expire.
    drop(write);
    assert!(
        !epochs.live().iter().any(|(e, _)| *e == 1),
        "{:?}",
        epochs.live()
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    let stopped = meta.renewals_of(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        meta.renewals_of(1),
        stopped,
        "no renewal after the last write"
    );
    epochs.stop();
    Ok(())
}

#[tokio::test]
async fn a_lost_epoch_is_replaced_at_once_and_its_writes_keep_its_number() -> Result<()> {
    let meta = FakeMeta::new(60);
    let epochs = WriteEpochs::start(meta.clone(), config(60_000)).await?;
    let write = epochs.begin_write();
    assert_eq!(write.epoch(), 1);
    // The process was cut off past its lease: meta closed epoch 1.
    meta.close(1);
    wait_for("a new current epoch", || epochs.current() == 2).await?;
    assert_eq!(epochs.lost(), 1);
    assert_eq!(epochs.live(), vec![(2, 0)], "the lost epoch is not renewed");
    // The write begun under epoch 1 still names it (its commit is refused
    // by meta with EPOCH_CLOSED); new writes use epoch 2.
    assert_eq!(write.epoch(), 1);
    assert_eq!(epochs.begin_write().epoch(), 2);
    drop(write);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(epochs.lost(), 1, "counted once");
    assert_eq!(epochs.current(), 2, "no rotation: the rotation is 60 s");
    epochs.stop();
    Ok(())
}

#[tokio::test]
async fn start_retries_open_until_it_succeeds_or_the_deadline_passes() -> Result<()> {
    let meta = FakeMeta::new(300);
    meta.state.lock().unwrap().fail_opens = 3;
    let epochs = WriteEpochs::start(meta.clone(), config(60_000)).await?;
    assert_eq!(epochs.current(), 1);
    assert_eq!(meta.state.lock().unwrap().opens, 4);
    epochs.stop();

    let down = FakeMeta::new(300);
    down.state.lock().unwrap().fail_opens = usize::MAX;
    let err = WriteEpochs::start(
        down,
        EpochConfig {
            rotation: Duration::from_secs(60),
            start_deadline: Duration::from_millis(500),
        },
    )
    .await
    .err()
    .expect("meta never answers");
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn epochs_held_by_long_writes_are_bounded() -> Result<()> {
    let meta = FakeMeta::new(60);
    let epochs = WriteEpochs::start(meta.clone(), config(20)).await?;
    let mut writes = Vec::new();
    for _ in 0..40 {
        writes.push(epochs.begin_write());
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert!(
            epochs.live().len() <= MAX_LIVE_EPOCHS,
            "{:?}",
            epochs.live()
        );
    }
    assert_eq!(epochs.live().len(), MAX_LIVE_EPOCHS, "{:?}", epochs.live());
    writes.clear();
    wait_for("old epochs drained", || epochs.live().len() == 1).await?;
    epochs.stop();
    Ok(())
}
