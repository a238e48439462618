//! One conformance suite for every [`ShardStore`], run against
//! [`DiskStore`] and [`MemoryStore`] by `conformance_suite!`, followed by
//! the few checks that only make sense on disk (restart, crash leftovers,
//! damaged headers).

use sluice_util::clock::wall_clock_ms;

use bytes::Bytes;

use super::*;
use crate::block_crc32c;

/// What the suite needs besides the store: fault injection and a look at
/// leftovers.
pub(crate) trait Harness: Sized {
    type Store: ShardStore;
    /// Whether uncommitted writes show up in [`Harness::temp_files`].
    const HAS_TEMP_FILES: bool;
    async fn new() -> Self;
    fn store(&self) -> &Self::Store;
    /// Flips a byte of block `block`'s stored data, keeping its checksum.
    async fn corrupt(&self, key: &ShardKey, block: u64, block_size: u32);
    /// Temp files (uncommitted writes) currently present.
    fn temp_files(&self) -> usize;
}

struct MemoryHarness(MemoryStore);

impl Harness for MemoryHarness {
    type Store = MemoryStore;
    const HAS_TEMP_FILES: bool = false;
    async fn new() -> Self {
        MemoryHarness(MemoryStore::new())
    }
    fn store(&self) -> &MemoryStore {
        &self.0
    }
    async fn corrupt(&self, key: &ShardKey, block: u64, _block_size: u32) {
        assert!(
            self.0.corrupt_block(key, block, 0),
            "no block {block} in {key}"
        );
    }
    fn temp_files(&self) -> usize {
        0
    }
}

struct DiskHarness {
    dir: tempfile::TempDir,
    store: DiskStore,
}

impl Harness for DiskHarness {
    type Store = DiskStore;
    const HAS_TEMP_FILES: bool = true;
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = DiskStore::open(dir.path(), 1)
            .await
            .expect("open disk store");
        DiskHarness { dir, store }
    }
    fn store(&self) -> &DiskStore {
        &self.store
    }
    async fn corrupt(&self, key: &ShardKey, block: u64, block_size: u32) {
        let path = self.store.shard_path(key);
        let mut bytes = std::fs::read(&path).expect("read shard file");
        let offset = (HEADER_LEN + block * (u64::from(block_size) + 4)) as usize;
        bytes[offset] ^= 1;
        std::fs::write(&path, bytes).expect("write shard file");
    }
    fn temp_files(&self) -> usize {
        count_temp_files(self.dir.path())
    }
}

fn count_temp_files(data_dir: &std::path::Path) -> usize {
    let mut n = 0;
    for d in std::fs::read_dir(data_dir.join("shards")).expect("read shards dir") {
        for f in std::fs::read_dir(d.expect("entry").path()).expect("read fanout dir") {
            let name = f.expect("entry").file_name();
            if name.to_string_lossy().contains(".tmp-") {
                n += 1;
            }
        }
    }
    n
}

// ------------------------------------------------------------------ helpers

fn key(blob: &str, index: u32) -> ShardKey {
    ShardKey::new(blob, index).expect("valid key")
}

/// `len` bytes of a pattern depending on `seed`, cut into blocks.
fn blocks(len: usize, block_size: u32, seed: u8) -> Vec<Block> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    data.chunks(block_size as usize)
        .map(|c| Block {
            data: Bytes::copy_from_slice(c),
            crc32c: block_crc32c(c),
        })
        .collect()
}

async fn put<S: ShardStore>(
    store: &S,
    key: &ShardKey,
    block_size: u32,
    blocks: &[Block],
) -> Committed {
    let mut w = store.create(key, block_size).await.expect("create");
    for b in blocks {
        w.write_block(b.clone()).await.expect("write block");
    }
    w.commit().await.expect("commit")
}

async fn read<S: ShardStore>(
    store: &S,
    key: &ShardKey,
    first: u64,
    count: u64,
) -> Vec<Result<Block, StoreError>> {
    let mut r = store.open(key, first, count).await.expect("open");
    let mut out = Vec::new();
    while let Some(b) = r.next_block().await {
        out.push(b);
    }
    assert_eq!(r.remaining(), 0);
    out
}

async fn read_ok<S: ShardStore>(store: &S, key: &ShardKey, first: u64, count: u64) -> Vec<Block> {
    read(store, key, first, count)
        .await
        .into_iter()
        .map(|b| b.expect("block verifies"))
        .collect()
}

// -------------------------------------------------------------- the suite

async fn write_then_read_all<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-a", 2);
    let data = blocks(4500, 1000, 7);
    assert_eq!(data.len(), 5);
    assert_eq!(
        put(s, &k, 1000, &data).await,
        Committed {
            payload_bytes: 4500,
            blocks: 5
        }
    );
    assert_eq!(read_ok(s, &k, 0, 0).await, data);
    assert_eq!(
        s.stats(),
        StoreStats {
            shards: 1,
            stored_bytes: stored_len(4500, 5)
        }
    );
    assert_eq!(h.temp_files(), 0);

    // A shard of only full blocks, and an empty shard.
    let full = blocks(3000, 1000, 9);
    put(s, &key("blob-a", 3), 1000, &full).await;
    assert_eq!(read_ok(s, &key("blob-a", 3), 0, 0).await, full);
    put(s, &key("blob-e", 0), 1000, &[]).await;
    assert!(read_ok(s, &key("blob-e", 0), 0, 0).await.is_empty());
    assert_eq!(s.stats().shards, 3);
}

async fn read_sub_ranges<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-r", 0);
    let data = blocks(4500, 1000, 1);
    put(s, &k, 1000, &data).await;
    assert_eq!(read_ok(s, &k, 1, 2).await, data[1..3]);
    assert_eq!(read_ok(s, &k, 3, 0).await, data[3..]);
    assert_eq!(read_ok(s, &k, 4, 1).await, data[4..]);
    assert!(read_ok(s, &k, 5, 0).await.is_empty());
    for (first, count) in [(6, 0), (4, 2), (0, 6)] {
        assert!(
            matches!(
                s.open(&k, first, count).await,
                Err(StoreError::RangeOutOfBounds { blocks: 5, .. })
            ),
            "range {first}+{count}"
        );
    }
}

async fn missing_shard_is_not_found<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    assert!(
        matches!(s.open(&key("nope", 0), 0, 0).await, Err(StoreError::NotFound(k)) if k == key("nope", 0))
    );
    put(s, &key("blob", 0), 16, &blocks(20, 16, 0)).await;
    assert!(matches!(
        s.open(&key("blob", 1), 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn replace_is_atomic<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-x", 1);
    let old = blocks(3000, 1000, 1);
    let new = blocks(1500, 500, 2);
    put(s, &k, 1000, &old).await;
    let mut before = s.open(&k, 0, 0).await.expect("open old");
    put(s, &k, 500, &new).await;
    // A reader opened before the replace sees only the old shard.
    let mut seen = Vec::new();
    while let Some(b) = before.next_block().await {
        seen.push(b.expect("old block"));
    }
    assert_eq!(seen, old);
    assert_eq!(read_ok(s, &k, 0, 0).await, new);
    assert_eq!(
        s.stats(),
        StoreStats {
            shards: 1,
            stored_bytes: stored_len(1500, 3)
        }
    );
}

async fn uncommitted_write_is_invisible<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-u", 0);
    let data = blocks(2500, 1000, 3);
    let mut w = s.create(&k, 1000).await.expect("create");
    for b in &data {
        w.write_block(b.clone()).await.expect("write");
    }
    assert!(matches!(
        s.open(&k, 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.list("", 10).await.expect("list").shards.is_empty());
    assert_eq!(s.stats(), StoreStats::default());
    w.commit().await.expect("commit");
    assert_eq!(read_ok(s, &k, 0, 0).await, data);
}

async fn dropped_writer_leaves_nothing<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-d", 0);
    let old = blocks(2000, 1000, 4);
    put(s, &k, 1000, &old).await;
    let stats = s.stats();

    // Two blocks, and one block synced: a disk writer has created its temp
    // file either way (it holds a first block alone in memory).
    let mut w = s.create(&k, 1000).await.expect("create");
    for b in blocks(2000, 1000, 5) {
        w.write_block(b).await.expect("write");
    }
    let mut fresh = s.create(&key("blob-f", 3), 1000).await.expect("create");
    fresh
        .write_block(blocks(10, 1000, 6).remove(0))
        .await
        .expect("write");
    fresh.sync().await.expect("sync");
    if H::HAS_TEMP_FILES {
        assert_eq!(h.temp_files(), 2);
    }
    drop(w);
    drop(fresh);

    assert_eq!(read_ok(s, &k, 0, 0).await, old);
    assert!(matches!(
        s.open(&key("blob-f", 3), 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.stats(), stats);
    assert_eq!(h.temp_files(), 0);
}

async fn sync_is_durable_but_invisible_until_commit<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-s", 1);
    let data = blocks(3500, 1000, 2);
    let mut w = s.create(&k, 1000).await.expect("create");
    w.sync().await.expect("sync with no block");
    for (i, b) in data.iter().enumerate() {
        w.write_block(b.clone()).await.expect("write");
        if i % 2 == 1 {
            w.sync().await.expect("sync");
        }
    }
    w.sync().await.expect("sync after the last block");
    assert!(matches!(
        s.open(&k, 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.stats(), StoreStats::default());
    w.commit().await.expect("commit");
    assert_eq!(read_ok(s, &k, 0, 0).await, data);

    // Synced but never committed: dropped like any other write.
    let mut w = s.create(&key("blob-s", 2), 1000).await.expect("create");
    w.write_block(data[0].clone()).await.expect("write");
    w.sync().await.expect("sync");
    drop(w);
    assert!(matches!(
        s.open(&key("blob-s", 2), 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(h.temp_files(), 0);
    assert_eq!(s.stats().shards, 1);
}

async fn block_rules_are_enforced<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-b", 0);
    assert!(matches!(
        s.create(&k, 0).await,
        Err(StoreError::InvalidBlockSize(0))
    ));
    assert!(matches!(
        s.create(&k, MAX_BLOCK_SIZE + 1).await,
        Err(StoreError::InvalidBlockSize(_))
    ));

    let mut w = s.create(&k, 4).await.expect("create");
    let b = |d: &'static [u8]| Block {
        data: Bytes::from_static(d),
        crc32c: block_crc32c(d),
    };
    assert!(matches!(
        w.write_block(b(b"12345")).await,
        Err(StoreError::InvalidBlockLen {
            block: 0,
            len: 5,
            ..
        })
    ));
    assert!(matches!(
        w.write_block(b(b"")).await,
        Err(StoreError::InvalidBlockLen {
            block: 0,
            len: 0,
            ..
        })
    ));
    w.write_block(b(b"1234")).await.expect("full block");
    w.write_block(b(b"12")).await.expect("short last block");
    assert!(matches!(
        w.write_block(b(b"1")).await,
        Err(StoreError::BlockAfterShortBlock { block: 2 })
    ));
    drop(w);
    assert_eq!(s.stats().shards, 0);
}

async fn delete_blobs_removes_every_shard<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    for k in [key("x", 0), key("x", 1), key("y", 0), key("xx", 0)] {
        put(s, &k, 8, &blocks(20, 8, 0)).await;
    }
    assert_eq!(
        s.delete_blobs(&["x".into(), "missing".into()])
            .await
            .expect("delete"),
        2
    );
    assert!(matches!(
        s.open(&key("x", 0), 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.open(&key("x", 1), 0, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(read_ok(s, &key("y", 0), 0, 0).await.len(), 3);
    assert_eq!(read_ok(s, &key("xx", 0), 0, 0).await.len(), 3);
    assert_eq!(
        s.stats(),
        StoreStats {
            shards: 2,
            stored_bytes: 2 * stored_len(20, 3)
        }
    );
    assert_eq!(
        s.delete_blobs(&["x".into()]).await.expect("delete again"),
        0
    );
    assert_eq!(s.delete_blobs(&[]).await.expect("delete nothing"), 0);
    assert!(matches!(
        s.delete_blobs(&["../y".into()]).await,
        Err(StoreError::InvalidBlobId(_))
    ));
}

async fn list_pages_by_blob<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let started = wall_clock_ms() - 1_000;
    let stored = [
        ("d", 0),
        ("a", 2),
        ("c", 5),
        ("b", 1),
        ("a", 0),
        ("c", 0),
        ("c", 1),
    ];
    for (blob, index) in stored {
        put(s, &key(blob, index), 8, &blocks(10, 8, index as u8)).await;
    }
    let names = |p: &ShardPage| {
        p.shards
            .iter()
            .map(|e| e.key.to_string())
            .collect::<Vec<_>>()
    };
    // Store order: fan-out partition, then blob id (not plain "a" < "b").
    let mut order = vec!["a", "b", "c", "d"];
    order.sort_by_key(|b| list_position(b));
    // The shards of `blobs`, each blob's by index.
    let shards_of = |blobs: &[&str]| {
        let mut out = Vec::new();
        for b in blobs {
            let mut indexes: Vec<u32> = stored
                .iter()
                .filter(|(blob, _)| blob == b)
                .map(|(_, i)| *i)
                .collect();
            indexes.sort();
            out.extend(indexes.iter().map(|i| format!("{b}.{i}")));
        }
        out
    };

    let p = s.list("", 2).await.expect("list");
    assert_eq!(names(&p), shards_of(&order[..2]));
    assert!(p.is_truncated);
    let p = s.list(order[1], 2).await.expect("list");
    assert_eq!(names(&p), shards_of(&order[2..]));
    assert!(!p.is_truncated);
    // A cursor that names no stored blob resumes at its own position.
    let rest: Vec<&str> = order
        .iter()
        .copied()
        .filter(|b| list_position(b) > list_position("bb"))
        .collect();
    let p = s.list("bb", 1).await.expect("list");
    assert_eq!(
        (names(&p), p.is_truncated),
        (shards_of(&rest[..rest.len().min(1)]), rest.len() > 1)
    );
    let p = s.list(order[3], 2).await.expect("list");
    assert!(p.shards.is_empty() && !p.is_truncated);

    let all = s.list("", 100).await.expect("list");
    assert_eq!(all.shards.len(), stored.len());
    assert_eq!(names(&all), shards_of(&order));
    assert!(!all.is_truncated);
    for e in &all.shards {
        assert_eq!(e.stored_bytes, stored_len(10, 2), "{}", e.key);
        assert!(
            e.modified_ms >= started && e.modified_ms <= wall_clock_ms() + 1_000,
            "{}",
            e.key
        );
    }
}

/// Commits a one-block shard under each of `keys`, 16 at a time.
async fn put_many<S: ShardStore>(store: &S, keys: &[ShardKey]) {
    let mut tasks = tokio::task::JoinSet::new();
    for k in keys {
        if tasks.len() >= 16 {
            tasks.join_next().await.expect("a task").expect("put");
        }
        let (store, k) = (store.clone(), k.clone());
        tasks.spawn(async move {
            put(&store, &k, 8, &blocks(5, 8, k.shard_index() as u8)).await;
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("put");
    }
}

/// Walks the store from `""` in pages of `limit` blobs; checks each page's
/// shape and returns the shard names in the order served.
async fn walk<S: ShardStore>(store: &S, limit: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut after = String::new();
    loop {
        let page = store.list(&after, limit).await.expect("list");
        let mut blobs: Vec<&str> = page.shards.iter().map(|e| e.key.blob_id()).collect();
        blobs.dedup();
        assert!(
            blobs.len() <= limit,
            "{} blobs on a page of {limit}",
            blobs.len()
        );
        if let (Some(first), false) = (blobs.first(), after.is_empty()) {
            assert_ne!(*first, after, "a blob is split across pages");
        }
        out.extend(page.shards.iter().map(|e| e.key.to_string()));
        match page.shards.last() {
            Some(last) if page.is_truncated => {
                assert_eq!(blobs.len(), limit, "a truncated page is full");
                after = last.key.blob_id().to_string();
            }
            _ => return out,
        }
    }
}

/// The stored names of `keys` in store order.
fn in_store_order(keys: &[ShardKey]) -> Vec<String> {
    let mut keys = keys.to_vec();
    keys.sort_by(|a, b| {
        (list_position(a.blob_id()), a.shard_index())
            .cmp(&(list_position(b.blob_id()), b.shard_index()))
    });
    keys.iter().map(ToString::to_string).collect()
}

async fn list_walks_every_fanout_once<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    // 2100 blobs fill all 256 partitions; some with two shards, one with
    // the last possible index.
    let mut keys = Vec::new();
    for i in 0..2100u32 {
        let blob = format!("w{i:04}");
        keys.push(key(&blob, i % 5));
        if i % 3 == 0 {
            keys.push(key(&blob, 7));
        }
    }
    keys.push(key("w0001", MAX_SHARDS_PER_BLOB - 1));
    put_many(s, &keys).await;
    let partitions: std::collections::HashSet<usize> =
        keys.iter().map(|k| fanout_of(k.blob_id())).collect();
    assert_eq!(partitions.len(), FANOUT);

    let expected = in_store_order(&keys);
    for limit in [3, 40, 5000] {
        assert_eq!(walk(s, limit).await, expected, "pages of {limit} blobs");
    }
    // Starting after any cursor, stored or not, gives the rest in order.
    for cursor in ["w0042", "w0042x", "zzz"] {
        let rest: Vec<String> = expected
            .iter()
            .filter(|n| {
                let blob = n.rsplit_once('.').expect("name").0;
                list_position(blob) > list_position(cursor)
            })
            .cloned()
            .collect();
        let page = s.list(cursor, 5000).await.expect("list");
        let got: Vec<String> = page.shards.iter().map(|e| e.key.to_string()).collect();
        assert_eq!(got, rest, "after {cursor:?}");
    }
}

async fn a_walk_skips_what_is_deleted_meanwhile<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let keys: Vec<ShardKey> = (0..600).map(|i| key(&format!("m{i:03}"), 0)).collect();
    put_many(s, &keys).await;
    let expected = in_store_order(&keys);
    let first = s.list("", 10).await.expect("list");
    assert!(first.is_truncated);
    let after = first
        .shards
        .last()
        .expect("a shard")
        .key
        .blob_id()
        .to_string();
    // Delete the next blob of the walk (in the cursor's own directory,
    // whose names the disk store has already read) and one far ahead.
    let (next, far) = (&expected[10], &expected[500]);
    let blob = |n: &String| n.rsplit_once('.').expect("name").0.to_string();
    assert_eq!(
        s.delete_blobs(&[blob(next), blob(far)])
            .await
            .expect("delete"),
        2
    );
    let mut served: Vec<String> = first.shards.iter().map(|e| e.key.to_string()).collect();
    let mut after = after;
    loop {
        let page = s.list(&after, 10).await.expect("list");
        served.extend(page.shards.iter().map(|e| e.key.to_string()));
        match page.shards.last() {
            Some(last) if page.is_truncated => after = last.key.blob_id().to_string(),
            _ => break,
        }
    }
    let kept: Vec<String> = expected
        .iter()
        .filter(|n| *n != next && *n != far)
        .cloned()
        .collect();
    assert_eq!(served, kept);
}

async fn bitrot_is_reported_for_that_block_only<H: Harness>() {
    let h = H::new().await;
    let s = h.store();
    let k = key("blob-rot", 4);
    let data = blocks(3500, 1000, 8);
    put(s, &k, 1000, &data).await;
    h.corrupt(&k, 2, 1000).await;

    let got = read(s, &k, 0, 0).await;
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].as_ref().expect("block 0"), &data[0]);
    assert_eq!(got[1].as_ref().expect("block 1"), &data[1]);
    assert!(
        matches!(&got[2], Err(StoreError::Corrupt { key: bad, block: Some(2), .. }) if *bad == k),
        "{:?}",
        got[2]
    );
    assert_eq!(got[3].as_ref().expect("block 3"), &data[3]);
    assert_eq!(read_ok(s, &k, 3, 1).await, data[3..]);
    assert!(matches!(
        read(s, &k, 2, 1).await[0],
        Err(StoreError::Corrupt { block: Some(2), .. })
    ));
}

macro_rules! conformance_suite {
    ($name:ident, $harness:ty) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn write_then_read_all() {
                super::write_then_read_all::<$harness>().await
            }
            #[tokio::test]
            async fn read_sub_ranges() {
                super::read_sub_ranges::<$harness>().await
            }
            #[tokio::test]
            async fn missing_shard_is_not_found() {
                super::missing_shard_is_not_found::<$harness>().await
            }
            #[tokio::test]
            async fn replace_is_atomic() {
                super::replace_is_atomic::<$harness>().await
            }
            #[tokio::test]
            async fn uncommitted_write_is_invisible() {
                super::uncommitted_write_is_invisible::<$harness>().await
            }
            #[tokio::test]
            async fn dropped_writer_leaves_nothing() {
                super::dropped_writer_leaves_nothing::<$harness>().await
            }
            #[tokio::test]
            async fn sync_is_durable_but_invisible_until_commit() {
                super::sync_is_durable_but_invisible_until_commit::<$harness>().await
            }
            #[tokio::test]
            async fn block_rules_are_enforced() {
                super::block_rules_are_enforced::<$harness>().await
            }
            #[tokio::test]
            async fn delete_blobs_removes_every_shard() {
                super::delete_blobs_removes_every_shard::<$harness>().await
            }
            #[tokio::test]
            async fn list_pages_by_blob() {
                super::list_pages_by_blob::<$harness>().await
            }
            #[tokio::test]
            async fn list_walks_every_fanout_once() {
                super::list_walks_every_fanout_once::<$harness>().await
            }
            #[tokio::test]
            async fn a_walk_skips_what_is_deleted_meanwhile() {
                super::a_walk_skips_what_is_deleted_meanwhile::<$harness>().await
            }
            #[tokio::test]
            async fn bitrot_is_reported_for_that_block_only() {
                super::bitrot_is_reported_for_that_block_only::<$harness>().await
            }
        }
    };
}

conformance_suite!(memory, MemoryHarness);
conformance_suite!(disk, DiskHarness);

// ------------------------------------------------------------- disk only

mod disk_only {
    use super::*;

    #[tokio::test]
    async fn reopen_keeps_shards_and_totals() {
        let h = DiskHarness::new().await;
        let data = blocks(2100, 1000, 1);
        put(&h.store, &key("keep", 0), 1000, &data).await;
        put(&h.store, &key("keep", 1), 1000, &data).await;
        let stats = h.store.stats();
        drop(h.store);
        let store = DiskStore::open(h.dir.path(), 1).await.expect("reopen");
        assert_eq!(store.stats(), stats);
        assert_eq!(read_ok(&store, &key("keep", 1), 0, 0).await, data);
    }

    #[tokio::test]
    async fn open_removes_temp_files_of_a_crash() {
        let h = DiskHarness::new().await;
        put(&h.store, &key("kept", 0), 8, &blocks(9, 8, 0)).await;
        let mut w = h.store.create(&key("crashed", 0), 8).await.expect("create");
        // Two blocks: the first alone would still be held in memory.
        for b in blocks(16, 8, 1) {
            w.write_block(b).await.expect("write");
        }
        // A crash: the writer never runs its drop.
        std::mem::forget(w);
        assert_eq!(h.temp_files(), 1);
        let store = DiskStore::open(h.dir.path(), 1).await.expect("reopen");
        assert_eq!(h.temp_files(), 0);
        assert_eq!(store.stats().shards, 1);
        assert!(matches!(
            store.open(&key("crashed", 0), 0, 0).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn damaged_header_or_length_is_corruption() {
        let h = DiskHarness::new().await;
        let k = key("hdr", 0);
        put(&h.store, &k, 8, &blocks(20, 8, 0)).await;
        let path = h.store.shard_path(&k);
        let good = std::fs::read(&path).expect("read");

        let mut bad = good.clone();
        bad[9] ^= 0x40; // block_size
        std::fs::write(&path, &bad).expect("write");
        assert!(matches!(
            h.store.open(&k, 0, 0).await,
            Err(StoreError::Corrupt { block: None, .. })
        ));

        // Cut inside the last block's checksum.
        std::fs::write(&path, &good[..good.len() - 6]).expect("write");
        assert!(matches!(
            h.store.open(&k, 0, 0).await,
            Err(StoreError::Corrupt { block: None, .. })
        ));

        std::fs::write(&path, &good[..10]).expect("write");
        assert!(matches!(
            h.store.open(&k, 0, 0).await,
            Err(StoreError::Corrupt { block: None, .. })
        ));
    }

    /// A file cut short after its reader opened it (the geometry was read
    /// from the full length): the blocks before the cut still verify, the
    /// cut block and those after it are corruption, not short blocks.
    #[tokio::test]
    async fn a_file_cut_under_an_open_reader_is_corruption_from_the_cut() {
        let h = DiskHarness::new().await;
        let k = key("cut", 1);
        let data = blocks(3500, 1000, 3);
        put(&h.store, &k, 1000, &data).await;
        let mut r = h.store.open(&k, 0, 0).await.expect("open");
        let path = h.store.shard_path(&k);
        let good = std::fs::read(&path).expect("read");
        // 10 bytes into block 2's data: the header, blocks 0 and 1 with
        // their CRCs. Block 0 was read by `open`, block 1 is read after the
        // cut.
        let cut = HEADER_LEN as usize + 2 * (1000 + 4) + 10;
        std::fs::write(&path, &good[..cut]).expect("write");
        let mut got = Vec::new();
        while let Some(b) = r.next_block().await {
            got.push(b);
        }
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].as_ref().expect("block 0"), &data[0]);
        assert_eq!(got[1].as_ref().expect("block 1"), &data[1]);
        for (i, b) in got.iter().enumerate().skip(2) {
            assert!(
                matches!(b, Err(StoreError::Corrupt { block: Some(n), reason: "file truncated", .. }) if *n == i as u64),
                "block {i}: {b:?}"
            );
        }
    }

    /// Blocks larger than one read of the page cache round-trip, and a cut
    /// at a block boundary makes the next block truncated.
    #[tokio::test]
    async fn large_blocks_read_back_and_a_cut_at_a_boundary_is_corruption() {
        let h = DiskHarness::new().await;
        let k = key("large", 0);
        let block_size = 300_000u32;
        let data = blocks(2 * block_size as usize + 1234, block_size, 9);
        put(&h.store, &k, block_size, &data).await;
        assert_eq!(read_ok(&h.store, &k, 0, 0).await, data);
        let mut r = h.store.open(&k, 1, 0).await.expect("open");
        let path = h.store.shard_path(&k);
        let good = std::fs::read(&path).expect("read");
        let boundary = HEADER_LEN as usize + 2 * (block_size as usize + 4);
        std::fs::write(&path, &good[..boundary]).expect("write");
        assert_eq!(
            r.next_block().await.expect("block 1").expect("verifies"),
            data[1]
        );
        assert!(matches!(
            r.next_block().await,
            Some(Err(StoreError::Corrupt {
                block: Some(2),
                reason: "file truncated",
                ..
            }))
        ));
        assert!(r.next_block().await.is_none());
    }

    /// Blob ids (`<prefix><n>`) whose shards share directory `fanout`.
    fn ids_in_fanout(prefix: &str, fanout: usize, count: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .filter(|id| fanout_of(id) == fanout)
            .take(count)
            .collect()
    }

    #[tokio::test]
    async fn delete_blobs_in_a_crowded_directory_takes_only_that_blob() {
        let h = DiskHarness::new().await;
        let target = "target";
        let fanout = fanout_of(target);
        // 3000 other shards in the same directory (files written directly,
        // counted when the store is reopened), including ids that extend
        // the target's, plus a stray name that is not a shard.
        let dir = h.store.shard_path(&key(target, 0));
        let dir = dir.parent().expect("fanout dir");
        let mut others = ids_in_fanout("other", fanout, 2990);
        others.extend(ids_in_fanout(target, fanout, 10));
        assert!(others.iter().all(|id| id != target));
        for id in &others {
            std::fs::write(dir.join(format!("{id}.0")), b"x").expect("write");
        }
        std::fs::write(dir.join(format!("{target}.01")), b"stray").expect("write");
        drop(h.store);
        let store = DiskStore::open(h.dir.path(), 1).await.expect("reopen");
        for index in [0, 5, MAX_SHARDS_PER_BLOB - 1] {
            put(&store, &key(target, index), 8, &blocks(9, 8, 0)).await;
        }
        let before = store.stats();
        assert_eq!(before.shards, others.len() as u64 + 3);

        assert_eq!(
            store
                .delete_blobs(&[target.into(), target.into()])
                .await
                .expect("delete"),
            3
        );
        assert_eq!(
            store.stats(),
            StoreStats {
                shards: others.len() as u64,
                stored_bytes: before.stored_bytes - 3 * stored_len(9, 2),
            }
        );
        for index in [0, 5, MAX_SHARDS_PER_BLOB - 1] {
            assert!(!store.shard_path(&key(target, index)).exists());
        }
        for id in &others {
            assert!(dir.join(format!("{id}.0")).exists(), "{id} was deleted");
        }
        assert!(dir.join(format!("{target}.01")).exists());
    }

    #[tokio::test]
    async fn stray_files_are_ignored() {
        let h = DiskHarness::new().await;
        put(&h.store, &key("real", 0), 8, &blocks(9, 8, 0)).await;
        let dir = h
            .store
            .shard_path(&key("real", 0))
            .parent()
            .expect("fanout dir")
            .to_path_buf();
        std::fs::write(dir.join("README"), b"not a shard").expect("write");
        std::fs::write(dir.join("real.01"), b"not a shard").expect("write");
        let store = DiskStore::open(h.dir.path(), 1).await.expect("reopen");
        assert_eq!(store.stats().shards, 1);
        let names: Vec<String> = store
            .list("", 10)
            .await
            .expect("list")
            .shards
            .iter()
            .map(|e| e.key.to_string())
            .collect();
        assert_eq!(names, ["real.0"]);
        assert_eq!(
            store.delete_blobs(&["real".into()]).await.expect("delete"),
            1
        );
        assert!(dir.join("README").exists() && dir.join("real.01").exists());
    }
}
