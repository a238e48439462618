//! GC passes over real shard files (DiskStore, mtimes set per shard) and
//! the in-memory store, with a scripted Collectable oracle; the per-blob
//! lock against a concurrent commit.

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;

use super::*;
use crate::block_crc32c;
use crate::store::{Block, DiskStore, MemoryStore, ShardKey, ShardReader, ShardWriter};

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
#[error("meta unreachable")]
struct Unreachable;

/// Answers from a fixed set of referenced blobs (every shard of them is
/// live) and referenced single shards, and records every question (as
/// `blob.index` strings).
#[derive(Default)]
struct FakeOracle {
    referenced: HashSet<String>,
    /// Shards (`blob.index`) placed on this node; other shards of the same
    /// blob are stale copies.
    referenced_shards: HashSet<String>,
    /// Answer every call with an error.
    fail: bool,
    /// Shards added to every answer (a misbehaving meta).
    extra: Vec<ShardKey>,
    asked: Mutex<Vec<Vec<String>>>,
}

impl FakeOracle {
    fn referencing(ids: &[&str]) -> Self {
        FakeOracle {
            referenced: ids.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn asked(&self) -> Vec<Vec<String>> {
        self.asked.lock().unwrap().clone()
    }
}

impl ReferenceOracle for FakeOracle {
    type Error = Unreachable;

    async fn collectable(
        &self,
        node_id: u64,
        shards: Vec<ShardKey>,
    ) -> Result<Vec<ShardKey>, Unreachable> {
        assert_eq!(node_id, 1, "GC asks about its own node");
        // Sorted: the pass asks in store order, which is not name order.
        let mut names: Vec<String> = shards.iter().map(ToString::to_string).collect();
        names.sort();
        self.asked.lock().unwrap().push(names);
        if self.fail {
            return Err(Unreachable);
        }
        Ok(shards
            .into_iter()
            .filter(|k| {
                !self.referenced.contains(k.blob_id())
                    && !self.referenced_shards.contains(&k.to_string())
            })
            .chain(self.extra.iter().cloned())
            .collect())
    }
}

async fn write_shard<S: ShardStore>(store: &S, blob: &str, index: u32) {
    let key = ShardKey::new(blob, index).unwrap();
    let mut w = store.create(&key, 16).await.unwrap();
    let data = Bytes::from(format!("{blob}.{index}").into_bytes());
    w.write_block(Block {
        crc32c: block_crc32c(&data),
        data,
    })
    .await
    .unwrap();
    w.commit().await.unwrap();
}

/// Writes a shard and sets its file's mtime `age` before `now`.
async fn aged_shard(store: &DiskStore, blob: &str, index: u32, now: SystemTime, age: Duration) {
    write_shard(store, blob, index).await;
    let path = store.shard_path(&ShardKey::new(blob, index).unwrap());
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(now - age)
        .unwrap();
}

/// The stored shards (`blob.index`), sorted by name.
async fn remaining<S: ShardStore>(store: &S) -> Vec<String> {
    let page = store.list("", 10_000).await.unwrap();
    assert!(!page.is_truncated);
    let mut names: Vec<String> = page.shards.iter().map(|s| s.key.to_string()).collect();
    names.sort();
    names
}

/// A pass that is never paced (tests of what it deletes, not how fast).
fn pass(now: SystemTime, page_blobs: usize) -> GcPass {
    GcPass {
        page_blobs,
        max_ops_per_sec: u64::MAX / 4,
        ..GcPass::new(1, HOUR, now)
    }
}

fn key(blob: &str, index: u32) -> ShardKey {
    ShardKey::new(blob, index).unwrap()
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn collects_old_collectable_shards_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    aged_shard(&store, "garbage", 0, now, 2 * HOUR).await;
    aged_shard(&store, "garbage", 1, now, 3 * HOUR).await;
    aged_shard(&store, "live", 0, now, 2 * HOUR).await;
    aged_shard(&store, "young", 0, now, HOUR / 6).await;
    // One shard of the blob is old, one was written a minute ago.
    aged_shard(&store, "mixed", 0, now, 2 * HOUR).await;
    aged_shard(&store, "mixed", 3, now, HOUR / 60).await;
    let oracle = FakeOracle {
        // Not asked about, so never deleted whatever meta says.
        extra: vec![key("young", 0)],
        ..FakeOracle::referencing(&["live"])
    };
    let locks = BlobLocks::new();

    let report = collect(&store, &oracle, &locks, &pass(now, GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(
        report,
        GcReport {
            scanned_shards: 6,
            old_shards: 4,
            collectable_shards: 3,
            deleted_shards: 3,
        }
    );
    assert_eq!(
        oracle.asked(),
        vec![strings(&["garbage.0", "garbage.1", "live.0", "mixed.0"])],
        "only shards past the grace are asked about"
    );
    assert_eq!(
        remaining(&store).await,
        strings(&["live.0", "mixed.3", "young.0"])
    );
    assert_eq!(store.stats().shards, 3);

    // Two hours later the young shards are past the grace too.
    let later = collect(
        &store,
        &oracle,
        &locks,
        &pass(now + 2 * HOUR, GC_PAGE_BLOBS),
    )
    .await
    .unwrap();
    assert_eq!(later.deleted_shards, 2);
    assert_eq!(remaining(&store).await, strings(&["live.0"]));
}

#[tokio::test]
async fn oracle_failure_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    for blob in ["a", "b", "c"] {
        aged_shard(&store, blob, 0, now, 2 * HOUR).await;
    }
    let oracle = FakeOracle {
        fail: true,
        ..Default::default()
    };
    let locks = BlobLocks::new();
    let err = collect(&store, &oracle, &locks, &pass(now, GC_PAGE_BLOBS))
        .await
        .unwrap_err();
    assert!(matches!(err, GcError::Oracle(_)), "{err:?}");
    assert_eq!(oracle.asked().len(), 1, "the pass stops at the failure");
    assert_eq!(remaining(&store).await, strings(&["a.0", "b.0", "c.0"]));

    // A later pass with meta back collects them.
    let ok = FakeOracle::default();
    assert_eq!(
        collect(&store, &ok, &locks, &pass(now, GC_PAGE_BLOBS))
            .await
            .unwrap()
            .deleted_shards,
        3
    );
    assert!(remaining(&store).await.is_empty());
    assert!(!locks.is_locked("a"), "locks are released after the pass");
}

#[tokio::test]
async fn pages_bound_every_oracle_call() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    let blobs: Vec<String> = (0..10).map(|i| format!("blob{i:02}")).collect();
    for b in &blobs {
        aged_shard(&store, b, 0, now, 2 * HOUR).await;
        aged_shard(&store, b, 1, now, 2 * HOUR).await;
    }
    let even: Vec<&str> = blobs.iter().step_by(2).map(String::as_str).collect();
    let oracle = FakeOracle::referencing(&even);
    let report = collect(&store, &oracle, &BlobLocks::new(), &pass(now, 3))
        .await
        .unwrap();
    assert_eq!(report.scanned_shards, 20);
    assert_eq!(report.old_shards, 20);
    assert_eq!(report.deleted_shards, 10);
    let sizes: Vec<usize> = oracle.asked().iter().map(Vec::len).collect();
    assert_eq!(sizes, [6, 6, 6, 2]);
    // A call never carries more than `call_shards`.
    let oracle = FakeOracle::referencing(&even);
    let narrow = GcPass {
        call_shards: 4,
        ..pass(now, GC_PAGE_BLOBS)
    };
    collect(&store, &oracle, &BlobLocks::new(), &narrow)
        .await
        .unwrap();
    let sizes: Vec<usize> = oracle.asked().iter().map(Vec::len).collect();
    assert_eq!(sizes, [4, 4, 2]);
    let left: Vec<String> = even
        .iter()
        .flat_map(|b| [format!("{b}.0"), format!("{b}.1")])
        .collect();
    assert_eq!(remaining(&store).await, left);
}

#[tokio::test]
async fn memory_store_shards_wait_out_the_grace() {
    let store = MemoryStore::new();
    write_shard(&store, "x", 0).await;
    write_shard(&store, "y", 2).await;
    let oracle = FakeOracle::referencing(&["y"]);
    let locks = BlobLocks::new();
    // Just written: younger than the grace, nothing is even asked.
    let now = collect(
        &store,
        &oracle,
        &locks,
        &pass(SystemTime::now(), GC_PAGE_BLOBS),
    )
    .await
    .unwrap();
    assert_eq!(now.deleted_shards, 0);
    assert!(oracle.asked().is_empty());
    let later = SystemTime::now() + 2 * HOUR;
    let report = collect(&store, &oracle, &locks, &pass(later, GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(report.deleted_shards, 1);
    assert_eq!(remaining(&store).await, strings(&["y.2"]));
}

#[tokio::test]
async fn a_stale_copy_of_one_index_is_deleted_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    // Shard 1 of the blob was healed onto another node; shard 0 is placed here.
    aged_shard(&store, "e3.00aa", 0, now, 2 * HOUR).await;
    aged_shard(&store, "e3.00aa", 1, now, 2 * HOUR).await;
    let oracle = FakeOracle {
        referenced_shards: strings(&["e3.00aa.0"]).into_iter().collect(),
        ..Default::default()
    };
    let report = collect(
        &store,
        &oracle,
        &BlobLocks::new(),
        &pass(now, GC_PAGE_BLOBS),
    )
    .await
    .unwrap();
    assert_eq!((report.collectable_shards, report.deleted_shards), (1, 1));
    assert_eq!(remaining(&store).await, strings(&["e3.00aa.0"]));
}

/// Answers "collectable" for everything, but only once released: the
/// window between meta's read and the delete.
struct GatedOracle {
    asked: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl ReferenceOracle for GatedOracle {
    type Error = Unreachable;

    async fn collectable(
        &self,
        _node_id: u64,
        shards: Vec<ShardKey>,
    ) -> Result<Vec<ShardKey>, Unreachable> {
        self.asked.notify_one();
        let _permit = self.release.acquire().await.unwrap();
        Ok(shards)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_of_the_same_blob_waits_for_the_delete() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    aged_shard(&store, "e9.0abc", 2, now, 2 * HOUR).await;
    aged_shard(&store, "other", 0, now, 2 * HOUR).await;
    let locks = BlobLocks::new();
    let oracle = std::sync::Arc::new(GatedOracle {
        asked: tokio::sync::Notify::new(),
        release: tokio::sync::Semaphore::new(0),
    });
    // GC asks about the shard and waits for meta's answer.
    let gc = tokio::spawn({
        let (store, locks, oracle) = (store.clone(), locks.clone(), oracle.clone());
        async move {
            let pass = GcPass {
                call_shards: 1,
                ..pass(now, GC_PAGE_BLOBS)
            };
            collect(&store, oracle.as_ref(), &locks, &pass).await
        }
    });
    oracle.asked.notified().await;
    assert!(locks.is_locked("e9.0abc"));
    // Meanwhile heal rewrites the same shard path: its commit takes the lock
    // like PutShard's does.
    let heal = tokio::spawn({
        let (store, locks) = (store.clone(), locks.clone());
        async move {
            let k = key("e9.0abc", 2);
            let mut w = store.create(&k, 16).await.unwrap();
            let data = Bytes::from_static(b"rebuilt");
            w.write_block(Block {
                crc32c: block_crc32c(&data),
                data,
            })
            .await
            .unwrap();
            let _blob = locks.lock(k.blob_id()).await;
            w.commit().await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!heal.is_finished(), "the commit waits for GC's lock");
    // Meta answers: the old copy is deleted, then the commit proceeds.
    oracle.release.add_permits(1);
    let report = gc.await.unwrap().unwrap();
    heal.await.unwrap();
    assert_eq!(report.deleted_shards, 2);
    // The rebuilt shard survived the GC that had decided about its path.
    assert_eq!(remaining(&store).await, strings(&["e9.0abc.2"]));
    let mut r = store.open(&key("e9.0abc", 2), 0, 0).await.unwrap();
    assert_eq!(
        r.next_block().await.unwrap().unwrap().data,
        Bytes::from_static(b"rebuilt")
    );
}

/// Writes `count` blobs `gc<n>` (shard 0; every seventh also shard 3) two
/// hours old, 16 at a time; returns their keys.
async fn aged_blobs(store: &DiskStore, count: usize, now: SystemTime) -> Vec<ShardKey> {
    let keys: Vec<ShardKey> = (0..count)
        .flat_map(|i| {
            let blob = format!("gc{i:04}");
            let extra = (i % 7 == 0).then(|| key(&blob, 3));
            std::iter::once(key(&blob, 0)).chain(extra)
        })
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for k in keys.clone() {
        if tasks.len() >= 16 {
            tasks.join_next().await.unwrap().unwrap();
        }
        let store = store.clone();
        tasks.spawn(async move {
            aged_shard(&store, k.blob_id(), k.shard_index(), now, 2 * HOUR).await;
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    keys
}

#[tokio::test]
async fn a_pass_over_every_fanout_directory_deletes_exactly_the_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1).await.unwrap();
    let now = SystemTime::now();
    let keys = aged_blobs(&store, 2100, now).await;
    let fanouts: HashSet<usize> = keys
        .iter()
        .map(|k| crate::store::fanout_of(k.blob_id()))
        .collect();
    assert_eq!(fanouts.len(), crate::store::FANOUT);
    // Every third blob is referenced; one more shard is a placed index of
    // an otherwise unreferenced blob.
    let referenced: Vec<String> = (0..2100).step_by(3).map(|i| format!("gc{i:04}")).collect();
    let oracle = FakeOracle {
        referenced: referenced.iter().cloned().collect(),
        referenced_shards: strings(&["gc0007.3"]).into_iter().collect(),
        ..Default::default()
    };
    let narrow = GcPass {
        call_shards: 64,
        ..pass(now, 50)
    };
    let report = collect(&store, &oracle, &BlobLocks::new(), &narrow)
        .await
        .unwrap();

    let mut kept: Vec<String> = keys
        .iter()
        .filter(|k| referenced.iter().any(|r| r == k.blob_id()) || k.to_string() == "gc0007.3")
        .map(ToString::to_string)
        .collect();
    kept.sort();
    let garbage = (keys.len() - kept.len()) as u64;
    assert_eq!(
        report,
        GcReport {
            scanned_shards: keys.len() as u64,
            old_shards: keys.len() as u64,
            collectable_shards: garbage,
            deleted_shards: garbage,
        }
    );
    assert_eq!(remaining(&store).await, kept);
    assert_eq!(store.stats().shards, kept.len() as u64);
    // Every shard was asked about exactly once, at most 64 per call.
    let asked = oracle.asked();
    assert!(asked.iter().all(|call| call.len() <= 64));
    let mut all: Vec<String> = asked.into_iter().flatten().collect();
    all.sort();
    let mut stored: Vec<String> = keys.iter().map(ToString::to_string).collect();
    stored.sort();
    assert_eq!(all, stored);
}

#[tokio::test]
async fn a_pass_is_paced_by_max_ops_per_sec() {
    let store = MemoryStore::new();
    for i in 0..1500 {
        write_shard(&store, &format!("p{i:04}"), 0).await;
    }
    // A third of the blobs is garbage: 1500 listed + 500 deleted = 2000
    // operations; at 1000/s with a one-second burst the pass cannot end
    // before one second (a lower bound: sleeps never end early).
    let referenced: Vec<String> = (0..1500)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("p{i:04}"))
        .collect();
    let oracle = FakeOracle {
        referenced: referenced.into_iter().collect(),
        ..Default::default()
    };
    let paced = GcPass {
        max_ops_per_sec: 1000,
        ..GcPass::new(1, HOUR, SystemTime::now() + 2 * HOUR)
    };
    let started = std::time::Instant::now();
    let report = collect(&store, &oracle, &BlobLocks::new(), &paced)
        .await
        .unwrap();
    assert_eq!((report.scanned_shards, report.deleted_shards), (1500, 500));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(950), "{took:?}");
}

#[test]
fn error_chain_joins_sources() {
    let e = GcError::Oracle(Box::new(Unreachable));
    assert_eq!(
        error_chain(&e),
        "ask meta which shards are collectable: meta unreachable"
    );
}
