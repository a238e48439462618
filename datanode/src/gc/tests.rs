//! GC passes over real shard files (DiskStore, mtimes set per shard) and
//! the in-memory store, with a scripted reference oracle.

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;

use super::*;
use crate::block_crc32c;
use crate::store::{Block, DiskStore, MemoryStore, ShardKey, ShardWriter};

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
#[error("meta unreachable")]
struct Unreachable;

/// Answers from a fixed set of referenced blobs and records every question.
#[derive(Default)]
struct FakeOracle {
    referenced: HashSet<String>,
    /// Answer every call with an error.
    fail: bool,
    /// Ids added to every answer (a misbehaving meta).
    extra: Vec<String>,
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

    async fn unreferenced(&self, blob_ids: Vec<String>) -> Result<Vec<String>, Unreachable> {
        self.asked.lock().unwrap().push(blob_ids.clone());
        if self.fail {
            return Err(Unreachable);
        }
        Ok(blob_ids
            .into_iter()
            .filter(|id| !self.referenced.contains(id))
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

async fn remaining<S: ShardStore>(store: &S) -> Vec<String> {
    let page = store.list("", 1000).await.unwrap();
    assert!(!page.is_truncated);
    page.shards.iter().map(|s| s.key.to_string()).collect()
}

fn pass(now: SystemTime, page_blobs: usize) -> GcPass {
    GcPass {
        grace: HOUR,
        now,
        page_blobs,
        node_label: "1".into(),
    }
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn collects_old_unreferenced_blobs_only() {
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
        extra: strings(&["young"]),
        ..FakeOracle::referencing(&["live"])
    };

    let report = collect(&store, &oracle, &pass(now, GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(
        report,
        GcReport {
            scanned_shards: 6,
            old_blobs: 2,
            unreferenced_blobs: 1,
            deleted_shards: 2,
        }
    );
    assert_eq!(
        oracle.asked(),
        vec![strings(&["garbage", "live"])],
        "only blobs whose every shard is past the grace are asked about"
    );
    assert_eq!(
        remaining(&store).await,
        strings(&["live.0", "mixed.0", "mixed.3", "young.0"])
    );
    assert_eq!(store.stats().shards, 4);

    // Two hours later the young and mixed blobs are past the grace too.
    let later = collect(&store, &oracle, &pass(now + 2 * HOUR, GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(later.deleted_shards, 3);
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
    let err = collect(&store, &oracle, &pass(now, GC_PAGE_BLOBS))
        .await
        .unwrap_err();
    assert!(matches!(err, GcError::Oracle(_)), "{err:?}");
    assert_eq!(oracle.asked().len(), 1, "the pass stops at the failure");
    assert_eq!(remaining(&store).await, strings(&["a.0", "b.0", "c.0"]));

    // A later pass with meta back collects them.
    let ok = FakeOracle::default();
    assert_eq!(
        collect(&store, &ok, &pass(now, GC_PAGE_BLOBS))
            .await
            .unwrap()
            .deleted_shards,
        3
    );
    assert!(remaining(&store).await.is_empty());
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
    let report = collect(&store, &oracle, &pass(now, 3)).await.unwrap();
    assert_eq!(report.scanned_shards, 20);
    assert_eq!(report.old_blobs, 10);
    assert_eq!(report.deleted_shards, 10);
    let sizes: Vec<usize> = oracle.asked().iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 3, 1]);
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
    // Just written: younger than the grace, nothing is even asked.
    let now = collect(&store, &oracle, &pass(SystemTime::now(), GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(now.deleted_shards, 0);
    assert!(oracle.asked().is_empty());
    let later = SystemTime::now() + 2 * HOUR;
    let report = collect(&store, &oracle, &pass(later, GC_PAGE_BLOBS))
        .await
        .unwrap();
    assert_eq!(report.deleted_shards, 1);
    assert_eq!(remaining(&store).await, strings(&["y.2"]));
}

#[test]
fn error_chain_joins_sources() {
    let e = GcError::Oracle(Box::new(Unreachable));
    assert_eq!(
        error_chain(&e),
        "ask meta which blobs are unreferenced: meta unreachable"
    );
}
