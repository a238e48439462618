//! The service over a real gRPC server with a fault-injecting store: a
//! full disk (ENOSPC) or an I/O error fails only the shard being written,
//! the free-space reserve refuses new shards, HasShards, VerifyShards, and
//! the commit waiting for its blob's lock.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::{HasShardsRequest, ShardBlock, ShardEnd, ShardHeader, ShardId};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::{Channel, Server};

use super::*;
use crate::store::{
    Committed, DiskReader, DiskStore, DiskWriter, HEADER_LEN, ShardPage, StoreStats,
};

const BLOCK: usize = 4096;

/// How a doomed writer fails.
#[derive(Clone, Copy)]
enum Fault {
    /// `ENOSPC` once this many payload bytes were written.
    NoSpaceAfter(u64),
    /// `EIO` on the commit's fsync.
    IoOnCommit,
}

/// A [`DiskStore`] whose writers of chosen blobs fail.
#[derive(Clone)]
struct FaultStore {
    inner: DiskStore,
    doomed: Arc<Mutex<HashSet<String>>>,
    fault: Fault,
}

struct FaultWriter {
    inner: DiskWriter,
    doomed: Option<Fault>,
    written: u64,
}

fn io_error(errno: nix::errno::Errno) -> StoreError {
    StoreError::Io {
        op: "write",
        path: "fault".into(),
        source: std::io::Error::from(errno),
    }
}

impl ShardWriter for FaultWriter {
    async fn write_block(&mut self, block: Block) -> Result<(), StoreError> {
        self.written += block.data.len() as u64;
        if let Some(Fault::NoSpaceAfter(n)) = self.doomed
            && self.written > n
        {
            return Err(io_error(nix::errno::Errno::ENOSPC));
        }
        self.inner.write_block(block).await
    }

    async fn sync(&mut self) -> Result<(), StoreError> {
        self.inner.sync().await
    }

    async fn commit(self) -> Result<Committed, StoreError> {
        if let Some(Fault::IoOnCommit) = self.doomed {
            return Err(io_error(nix::errno::Errno::EIO));
        }
        self.inner.commit().await
    }
}

impl ShardStore for FaultStore {
    type Writer = FaultWriter;
    type Reader = DiskReader;

    async fn create(&self, key: &ShardKey, block_size: u32) -> Result<FaultWriter, StoreError> {
        let doomed = self
            .doomed
            .lock()
            .unwrap()
            .contains(key.blob_id())
            .then_some(self.fault);
        Ok(FaultWriter {
            inner: self.inner.create(key, block_size).await?,
            doomed,
            written: 0,
        })
    }
    async fn open(&self, key: &ShardKey, first: u64, count: u64) -> Result<DiskReader, StoreError> {
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
    async fn quarantine(&self, key: &ShardKey) -> Result<crate::store::Quarantine, StoreError> {
        self.inner.quarantine(key).await
    }
    async fn list(&self, after: &str, limit: usize) -> Result<ShardPage, StoreError> {
        self.inner.list(after, limit).await
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

struct Harness {
    service: DatanodeService<FaultStore>,
    store: FaultStore,
    locks: BlobLocks,
    free: Arc<AtomicU64>,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A node whose disk reports `free` bytes against a reserve of 1000.
    async fn start(fault: Fault, free: u64) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = FaultStore {
            inner: DiskStore::open(dir.path(), 1).await.unwrap(),
            doomed: Arc::default(),
            fault,
        };
        let free = Arc::new(AtomicU64::new(free));
        let probe_free = Arc::clone(&free);
        // Re-read on every call, so the tests can change it.
        let space = Arc::new(DiskSpace::with_probe(
            dir.path(),
            1000,
            Duration::ZERO,
            Box::new(move |_: &Path| Ok(probe_free.load(Ordering::Relaxed))),
        ));
        let locks = BlobLocks::new();
        let options = ServiceOptions {
            node_id: 1,
            shard_channel_depth: 4,
            write_budget: 1 << 20,
            credit_fsync_bytes: 64 * 1024,
            credit_fsync_idle: Duration::from_millis(5),
            max_shard_streams: crate::config::DEFAULT_MAX_SHARD_STREAMS,
            verify_bandwidth: crate::config::DEFAULT_VERIFY_BANDWIDTH_BYTES_PER_SEC,
        };
        let service = DatanodeService::new(
            store.clone(),
            options,
            CancellationToken::new(),
            CancellationToken::new(),
            TaskTracker::new(),
            locks.clone(),
            space,
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::builder()
            .add_service(service.clone().into_server())
            .serve_with_incoming(TcpListenerStream::new(listener));
        tokio::spawn(server);
        Harness {
            service,
            store,
            locks,
            free,
            addr,
            _dir: dir,
        }
    }

    async fn client(&self) -> DatanodeClient<Channel> {
        DatanodeClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    fn doom(&self, blob: &str) {
        self.store.doomed.lock().unwrap().insert(blob.to_string());
    }

    fn temp_files(&self) -> usize {
        let root = self._dir.path().join("shards");
        std::fs::read_dir(&root)
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count()
    }
}

fn messages(blob: &str, gateway: &str, len: usize) -> Vec<PutShardRequest> {
    let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut msgs = vec![PutShardRequest {
        msg: Some(Msg::Header(ShardHeader {
            blob_id: blob.into(),
            shard_index: 0,
            block_size: BLOCK as u32,
            gateway_id: gateway.into(),
        })),
    }];
    for chunk in data.chunks(BLOCK) {
        msgs.push(PutShardRequest {
            msg: Some(Msg::Block(ShardBlock {
                data: chunk.to_vec().into(),
                crc32c: block_crc32c(chunk),
            })),
        });
    }
    msgs.push(PutShardRequest {
        msg: Some(Msg::End(ShardEnd {
            blocks: data.chunks(BLOCK).count() as u64,
            bytes: len as u64,
        })),
    });
    msgs
}

async fn put(
    c: &mut DatanodeClient<Channel>,
    blob: &str,
    gateway: &str,
    len: usize,
) -> Result<PutShardResponse, Status> {
    c.put_shard(tokio_stream::iter(messages(blob, gateway, len)))
        .await
        .map(Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_fails_only_that_shard() {
    let h = Harness::start(Fault::NoSpaceAfter(3 * BLOCK as u64), 1 << 30).await;
    h.doom("e1.full");
    let (mut a, mut b) = (h.client().await, h.client().await);
    let (full, fine) = tokio::join!(
        put(&mut a, "e1.full", "", 10 * BLOCK),
        put(&mut b, "e1.fine", "", 10 * BLOCK),
    );
    let err = full.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(fine.unwrap().bytes_written, 10 * BLOCK as u64);
    assert_eq!(h.temp_files(), 0, "the failed shard's temp file is removed");
    assert_eq!(h.service.credits.in_flight(), 0, "held credit is returned");
    let present = h
        .client()
        .await
        .has_shards(HasShardsRequest {
            shards: vec![
                ShardId {
                    blob_id: "e1.full".into(),
                    shard_index: 0,
                },
                ShardId {
                    blob_id: "e1.fine".into(),
                    shard_index: 0,
                },
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .present;
    assert_eq!(present, [false, true]);
    // The node goes on taking other shards.
    put(&mut a, "e1.next", "", BLOCK).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_error_on_commit_is_internal_and_leaves_nothing() {
    let h = Harness::start(Fault::IoOnCommit, 1 << 30).await;
    h.doom("e1.eio");
    let mut c = h.client().await;
    let err = put(&mut c, "e1.eio", "", 3 * BLOCK).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert_eq!(h.temp_files(), 0);
    assert_eq!(h.store.stats().shards, 0);
    assert_eq!(h.service.credits.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_reserve_new_shards_are_refused() {
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 999).await;
    let mut c = h.client().await;
    let err = put(&mut c, "e1.a", "", BLOCK).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "datanode below its free-space reserve");
    assert_eq!(h.store.stats().shards, 0);
    assert_eq!(h.temp_files(), 0);
    // Exactly the reserve free is enough again.
    h.free.store(1000, Ordering::Relaxed);
    put(&mut c, "e1.a", "", BLOCK).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn has_shards_checks_headers_and_bounds_the_request() {
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 1 << 30).await;
    let mut c = h.client().await;
    put(&mut c, "e1.good", "", 2 * BLOCK).await.unwrap();
    put(&mut c, "e1.bad", "", 2 * BLOCK).await.unwrap();
    // Damage the header's magic of e1.bad.
    let path = h
        .store
        .inner
        .shard_path(&ShardKey::new("e1.bad", 0).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let id = |b: &str, i| ShardId {
        blob_id: b.into(),
        shard_index: i,
    };
    let present = c
        .has_shards(HasShardsRequest {
            shards: vec![
                id("e1.good", 0),
                id("e1.good", 1),
                id("e1.bad", 0),
                id("../etc", 0),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .present;
    assert_eq!(present, [true, false, false, false]);
    let too_many = HasShardsRequest {
        shards: (0..=MAX_HAS_SHARDS as u32)
            .map(|i| id("e1.good", i))
            .collect(),
    };
    let err = c.has_shards(too_many).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_shards_fails_a_flipped_byte_and_passes_a_good_shard() {
    use sluice_proto::datanode::{ShardVerdict, VerifyShard, VerifyShardsRequest};
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 1 << 30).await;
    let mut c = h.client().await;
    let len = 2 * BLOCK + 100;
    for blob in ["e1.good", "e1.flip", "e1.cut"] {
        put(&mut c, blob, "", len).await.unwrap();
    }
    let path = |blob: &str| h.store.inner.shard_path(&ShardKey::new(blob, 0).unwrap());
    // One byte inside block 1's data of e1.flip: its header stays good.
    let mut bytes = std::fs::read(path("e1.flip")).unwrap();
    bytes[HEADER_LEN as usize + BLOCK + 4 + 10] ^= 0x01;
    std::fs::write(path("e1.flip"), bytes).unwrap();
    // e1.cut loses its last block: every block left is good.
    let cut = std::fs::OpenOptions::new()
        .write(true)
        .open(path("e1.cut"))
        .unwrap();
    cut.set_len(HEADER_LEN + 2 * (BLOCK as u64 + 4)).unwrap();
    drop(cut);

    let ask = |blob: &str, block_size: usize, payload: usize| VerifyShard {
        blob_id: blob.into(),
        shard_index: 0,
        block_size: block_size as u32,
        payload_bytes: payload as u64,
    };
    let vc = c.clone();
    let verdicts = |shards: Vec<VerifyShard>| {
        let mut c = vc.clone();
        async move {
            c.verify_shards(VerifyShardsRequest { shards })
                .await
                .map(|r| r.into_inner().verdicts)
        }
    };
    use ShardVerdict::*;
    let got = verdicts(vec![
        ask("e1.good", BLOCK, len),
        ask("e1.flip", BLOCK, len),
        ask("e1.cut", BLOCK, len),
        ask("e1.none", BLOCK, len),
        ask("../etc", BLOCK, len),
        // The good shard, asked with a shape it does not have.
        ask("e1.good", BLOCK, len - 1),
        ask("e1.good", BLOCK, len + BLOCK),
        ask("e1.good", BLOCK / 2, len),
    ])
    .await
    .unwrap();
    let want = [
        ShardSound,
        ShardCorrupt,
        ShardCorrupt,
        ShardAbsent,
        ShardAbsent,
        ShardCorrupt,
        ShardCorrupt,
        ShardCorrupt,
    ]
    .map(|v| v as i32);
    assert_eq!(got, want);
    // HasShards reads headers only: it cannot tell.
    let present = c
        .has_shards(HasShardsRequest {
            shards: ["e1.good", "e1.flip", "e1.cut"]
                .map(|b| ShardId {
                    blob_id: b.into(),
                    shard_index: 0,
                })
                .to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .present;
    assert_eq!(present, [true, true, true]);
    // Verification changes nothing on disk.
    assert!(path("e1.flip").exists());

    // Bounds: shards per call, and bytes per call of more than one shard.
    let too_many = (0..=crate::verify::MAX_VERIFY_SHARDS)
        .map(|_| ask("e1.good", BLOCK, len))
        .collect();
    let err = verdicts(too_many).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let big = crate::verify::MAX_VERIFY_BYTES as usize;
    let err = verdicts(vec![ask("e1.none", BLOCK, big), ask("e1.good", BLOCK, len)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        verdicts(vec![ask("e1.none", BLOCK, 2 * big)])
            .await
            .unwrap(),
        [ShardAbsent as i32],
        "one shard larger than the bound goes alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_waits_for_its_blob_lock() {
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 1 << 30).await;
    let gc = h.locks.lock("e1.locked").await;
    let mut c = h.client().await;
    let mut other = h.client().await;
    let pending = tokio::spawn(async move { put(&mut c, "e1.locked", "", BLOCK).await });
    // Another blob commits meanwhile.
    put(&mut other, "e1.free", "", BLOCK).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!pending.is_finished(), "the commit waits for the GC's lock");
    assert_eq!(h.store.stats().shards, 1);
    drop(gc);
    pending.await.unwrap().unwrap();
    assert_eq!(h.store.stats().shards, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_streams_past_max_shard_streams_are_refused_as_busy() {
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 1 << 30).await;
    let mut c = h.client().await;
    // Every stream slot taken (as by that many open streams).
    let held: Vec<_> = (0..crate::config::DEFAULT_MAX_SHARD_STREAMS)
        .map(|_| h.service.shard_stream_permit().expect("a free slot"))
        .collect();
    let err = put(&mut c, "e1.a", "", BLOCK).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(
        err.message(),
        "datanode 1 busy: 4096 shard streams open (max_shard_streams)"
    );
    let get = sluice_proto::datanode::GetShardRequest {
        blob_id: "e1.a".into(),
        shard_index: 0,
        first_block: 0,
        block_count: 1,
    };
    let err = c.get_shard(get.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(h.store.stats().shards, 0);
    // Slots free again: the same requests are served.
    drop(held);
    put(&mut c, "e1.a", "", BLOCK).await.unwrap();
    let mut stream = c.get_shard(get).await.expect("GetShard").into_inner();
    assert!(stream.message().await.expect("a block").is_some());
    // Ended streams gave their slots back.
    drop(stream);
    let free = tokio::time::timeout(Duration::from_secs(5), async {
        while h.service.shard_streams.available_permits()
            != crate::config::DEFAULT_MAX_SHARD_STREAMS
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(free.is_ok(), "shard stream slots not returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_read_whole_by_the_open_keeps_its_stream_slot_until_dropped() {
    use futures::StreamExt as _;
    let h = Harness::start(Fault::NoSpaceAfter(u64::MAX), 1 << 30).await;
    let mut c = h.client().await;
    put(&mut c, "e1.one", "", BLOCK).await.unwrap();
    let free = || h.service.shard_streams.available_permits();
    let all = crate::config::DEFAULT_MAX_SHARD_STREAMS;
    assert_eq!(free(), all);
    let request = sluice_proto::datanode::GetShardRequest {
        blob_id: "e1.one".into(),
        shard_index: 0,
        first_block: 0,
        block_count: 1,
    };
    // The one block was read by the open: no reader task, so the slot is
    // held by what the response body keeps.
    let mut blocks = h.service.shard_blocks(request).await.unwrap();
    assert_eq!(free(), all - 1);
    let block = blocks.next().await.unwrap().unwrap();
    assert_eq!(block.data.len(), BLOCK);
    assert!(blocks.next().await.is_none(), "one block, then the end");
    assert_eq!(free(), all - 1);
    drop(blocks);
    assert_eq!(free(), all);
}
