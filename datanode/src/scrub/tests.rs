//! Scrub passes over real shard files with a byte flipped, the pending
//! report retry, and the token bucket's arithmetic.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::*;
use crate::block_crc32c;
use crate::store::{Block, DiskStore, MemoryStore, ShardWriter};

#[derive(Debug, thiserror::Error)]
#[error("meta unreachable")]
struct Unreachable;

/// Records every report; fails while `fail` is set.
#[derive(Default)]
struct FakeReporter {
    fail: Mutex<bool>,
    reports: Mutex<Vec<(u64, Vec<String>)>>,
}

impl FakeReporter {
    fn reports(&self) -> Vec<(u64, Vec<String>)> {
        self.reports.lock().unwrap().clone()
    }
}

impl DamageReporter for FakeReporter {
    type Error = Unreachable;

    async fn report_missing(&self, node_id: u64, shards: Vec<ShardKey>) -> Result<(), Unreachable> {
        if *self.fail.lock().unwrap() {
            return Err(Unreachable);
        }
        self.reports
            .lock()
            .unwrap()
            .push((node_id, shards.iter().map(ToString::to_string).collect()));
        Ok(())
    }
}

fn key(blob: &str, index: u32) -> ShardKey {
    ShardKey::new(blob, index).unwrap()
}

/// Writes `blocks` blocks of 16 bytes.
async fn write_shard<S: ShardStore>(store: &S, blob: &str, index: u32, blocks: u8) {
    let mut w = store.create(&key(blob, index), 16).await.unwrap();
    for b in 0..blocks {
        let data = Bytes::from(vec![b.wrapping_add(index as u8); 16]);
        w.write_block(Block {
            crc32c: block_crc32c(&data),
            data,
        })
        .await
        .unwrap();
    }
    w.commit().await.unwrap();
}

async fn listed<S: ShardStore>(store: &S) -> Vec<String> {
    let page = store.list("", 1000).await.unwrap();
    page.shards.iter().map(|s| s.key.to_string()).collect()
}

/// Flips one bit at `offset` of the shard's file.
fn flip(store: &DiskStore, k: &ShardKey, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(store.shard_path(k))
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x04;
    f.write_all_at(&b, offset).unwrap();
}

struct Run {
    bucket: TokenBucket,
    pending: BTreeSet<ShardKey>,
    progress: ScrubProgress,
}

impl Run {
    fn new() -> Self {
        Run {
            // Fast enough to never wait in tests.
            bucket: TokenBucket::new(u64::MAX / 4, Instant::now()),
            pending: BTreeSet::new(),
            progress: ScrubProgress::default(),
        }
    }

    async fn pass<S: ShardStore, R: DamageReporter>(
        &mut self,
        store: &S,
        reporter: &R,
        page_blobs: usize,
    ) -> ScrubReport {
        let mut pass = ScrubPass {
            node_id: 7,
            node_label: "7".into(),
            page_blobs,
            bucket: &mut self.bucket,
            pending: &mut self.pending,
            progress: &self.progress,
        };
        scrub_pass(store, reporter, &mut pass).await.unwrap()
    }
}

#[tokio::test]
async fn a_flipped_byte_quarantines_and_reports_that_shard_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 7).await.unwrap();
    write_shard(&store, "e1.aa", 0, 3).await;
    write_shard(&store, "e1.aa", 1, 3).await;
    write_shard(&store, "e1.bb", 0, 2).await;
    write_shard(&store, "e1.cc", 4, 1).await;
    // Second block of e1.aa.1: header 16 + one stored block of 20, +5.
    flip(&store, &key("e1.aa", 1), 16 + 20 + 5);
    // A bad header on e1.cc.4.
    flip(&store, &key("e1.cc", 4), 1);
    let reporter = FakeReporter::default();
    let mut run = Run::new();

    let report = run.pass(&store, &reporter, 1).await;
    assert_eq!(report.scrubbed_shards, 4);
    assert_eq!(report.corrupt_shards, 2);
    assert_eq!(report.reported_shards, 2);
    assert_eq!(report.pending_reports, 0);
    // Every stored byte of the sound shards and of e1.aa.1 up to its bad
    // block (header + block 0); nothing of the shard with a bad header.
    assert_eq!(
        report.scrubbed_bytes,
        (16 + 3 * 20) + (16 + 2 * 20) + (16 + 20)
    );
    assert_eq!(listed(&store).await, ["e1.aa.0", "e1.bb.0"]);
    assert_eq!(store.stats().shards, 2);
    assert_eq!(
        reporter.reports(),
        vec![(7, vec!["e1.aa.1".to_string(), "e1.cc.4".to_string()])]
    );
    // Quarantined for inspection, out of the shard namespace.
    let quarantined: Vec<String> = std::fs::read_dir(dir.path().join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(quarantined.len(), 2);
    assert!(quarantined.iter().any(|n| n.ends_with("-e1.aa.1")));
    assert_eq!(run.progress.shards_done.load(Ordering::Relaxed), 4);
    assert_eq!(run.progress.shards_total.load(Ordering::Relaxed), 4);

    // The next pass finds nothing more and reports nothing again.
    let again = run.pass(&store, &reporter, 1000).await;
    assert_eq!((again.scrubbed_shards, again.corrupt_shards), (2, 0));
    assert_eq!(reporter.reports().len(), 1, "reported once");
}

#[tokio::test]
async fn a_failed_report_is_sent_after_the_next_pass() {
    let store = MemoryStore::new();
    write_shard(&store, "x", 0, 2).await;
    write_shard(&store, "y", 0, 2).await;
    assert!(store.corrupt_block(&key("x", 0), 1, 3));
    let reporter = FakeReporter::default();
    *reporter.fail.lock().unwrap() = true;
    let mut run = Run::new();
    let first = run.pass(&store, &reporter, 1000).await;
    assert_eq!((first.corrupt_shards, first.reported_shards), (1, 0));
    assert_eq!(first.pending_reports, 1);
    assert_eq!(listed(&store).await, ["y.0"]);

    *reporter.fail.lock().unwrap() = false;
    let second = run.pass(&store, &reporter, 1000).await;
    assert_eq!((second.corrupt_shards, second.reported_shards), (0, 1));
    assert_eq!(second.pending_reports, 0);
    assert_eq!(reporter.reports(), vec![(7, vec!["x.0".to_string()])]);
}

#[test]
fn the_token_bucket_holds_the_rate() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(1000, t0);
    // A full second of burst, then debt.
    assert_eq!(b.take(600, t0), Duration::ZERO);
    assert_eq!(b.take(400, t0), Duration::ZERO);
    assert_eq!(b.take(500, t0), Duration::from_millis(500));
    // After waiting the debt out, 250 ms earn 250 bytes.
    let t1 = t0 + Duration::from_millis(500);
    assert_eq!(b.take(0, t1), Duration::ZERO);
    let t2 = t1 + Duration::from_millis(250);
    assert_eq!(b.take(250, t2), Duration::ZERO);
    assert_eq!(b.take(100, t2), Duration::from_millis(100));
    // Idle time saves up at most one second's worth.
    let t3 = t2 + Duration::from_secs(60);
    assert_eq!(b.take(1100, t3), Duration::from_millis(100));
    // A read larger than the bucket waits for its whole size.
    let mut b = TokenBucket::new(1000, t0);
    assert_eq!(b.take(3000, t0), Duration::from_secs(2));
    // Over a long run of reads the wait adds up to bytes / rate.
    let mut b = TokenBucket::new(10_000, t0);
    let (mut now, mut waited) = (t0, Duration::ZERO);
    for _ in 0..100 {
        let w = b.take(1000, now);
        waited += w;
        now += w;
    }
    // 100 kB at 10 kB/s: 10 s, minus the one-second burst.
    let secs = waited.as_secs_f64();
    assert!((secs - 9.0).abs() < 0.01, "{secs}");
}

#[tokio::test]
async fn an_empty_store_is_a_complete_pass() {
    let reporter = FakeReporter::default();
    let mut run = Run::new();
    let r = run.pass(&MemoryStore::new(), &reporter, 1000).await;
    assert_eq!(r, ScrubReport::default());
    assert!(reporter.reports().is_empty());
}

/// A [`DiskStore`] whose reads of the shards in `eio` fail with EIO, as a
/// storage hiccup would: no evidence about their bytes.
#[derive(Clone)]
struct FlakyStore {
    inner: DiskStore,
    eio: Arc<Mutex<BTreeSet<ShardKey>>>,
}

impl ShardStore for FlakyStore {
    type Writer = <DiskStore as ShardStore>::Writer;
    type Reader = <DiskStore as ShardStore>::Reader;

    async fn create(&self, key: &ShardKey, block_size: u32) -> Result<Self::Writer, StoreError> {
        self.inner.create(key, block_size).await
    }
    async fn open(
        &self,
        key: &ShardKey,
        first: u64,
        count: u64,
    ) -> Result<Self::Reader, StoreError> {
        if self.eio.lock().unwrap().contains(key) {
            return Err(StoreError::Io {
                op: "open",
                path: self.inner.shard_path(key),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        self.inner.open(key, first, count).await
    }
    async fn delete_blobs(&self, ids: &[String]) -> Result<u64, StoreError> {
        self.inner.delete_blobs(ids).await
    }
    async fn delete_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        self.inner.delete_shard(key).await
    }
    async fn has_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        self.inner.has_shard(key).await
    }
    async fn quarantine(&self, key: &ShardKey) -> Result<Quarantine, StoreError> {
        self.inner.quarantine(key).await
    }
    async fn list(&self, after: &str, limit: usize) -> Result<crate::store::ShardPage, StoreError> {
        self.inner.list(after, limit).await
    }
    fn stats(&self) -> crate::store::StoreStats {
        self.inner.stats()
    }
}

#[tokio::test]
async fn an_io_error_is_retried_next_pass_never_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let inner = DiskStore::open(dir.path(), 7).await.unwrap();
    write_shard(&inner, "e1.aa", 0, 2).await;
    write_shard(&inner, "e1.aa", 1, 2).await;
    let store = FlakyStore {
        inner,
        eio: Arc::new(Mutex::new(BTreeSet::from([key("e1.aa", 1)]))),
    };
    let reporter = FakeReporter::default();
    let mut run = Run::new();

    // EIO on e1.aa.1: counted, left in place, not reported.
    let report = run.pass(&store, &reporter, 1000).await;
    assert_eq!((report.corrupt_shards, report.read_errors), (0, 1));
    assert_eq!(listed(&store).await, ["e1.aa.0", "e1.aa.1"]);
    assert!(reporter.reports().is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("quarantine"))
            .unwrap()
            .count(),
        0
    );

    // The hiccup passes: the next pass reads it whole.
    store.eio.lock().unwrap().clear();
    let report = run.pass(&store, &reporter, 1000).await;
    assert_eq!((report.corrupt_shards, report.read_errors), (0, 0));
    assert_eq!(report.scrubbed_shards, 2);
    assert!(reporter.reports().is_empty());
}

#[tokio::test]
async fn a_full_quarantine_deletes_nothing_and_leaves_the_shard_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 7).await.unwrap();
    let quarantine = dir.path().join("quarantine");
    for i in 0..crate::store::MAX_QUARANTINED_FILES {
        std::fs::write(quarantine.join(format!("{i:020}-old")), b"kept").unwrap();
    }
    write_shard(&store, "e1.aa", 0, 2).await;
    flip(&store, &key("e1.aa", 0), 16 + 3);
    let reporter = FakeReporter::default();
    let mut run = Run::new();

    let report = run.pass(&store, &reporter, 1000).await;
    // Found corrupt and reported, but not moved: nothing was deleted to
    // make room, and the shard file is where it was.
    assert_eq!(report.corrupt_shards, 1);
    assert_eq!(reporter.reports(), vec![(7, vec!["e1.aa.0".to_string()])]);
    assert_eq!(
        std::fs::read_dir(&quarantine).unwrap().count(),
        crate::store::MAX_QUARANTINED_FILES
    );
    assert!(store.shard_path(&key("e1.aa", 0)).exists());
    assert_eq!(listed(&store).await, ["e1.aa.0"]);
}
