//! The datanode over real gRPC: `run()` on a port-0 listener with a real
//! data dir, driven by the generated client. Meta is deliberately
//! unreachable: the node must serve while registration keeps retrying.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_datanode::store::list_position;
use sluice_datanode::{Config, MAX_MESSAGE_BYTES, block_crc32c, run};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    DeleteBlobsRequest, GetShardRequest, ListShardsRequest, NodeStatusRequest, PutShardRequest,
    PutShardResponse, ShardBlock, ShardEnd, ShardHeader,
};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(10);
const BLOCK: usize = 64 * 1024;

struct Node {
    addr: String,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), sluice_datanode::Error>>,
}

impl Node {
    async fn start(data_dir: &Path) -> Result<Node> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = format!("http://{}", listener.local_addr()?);
        let config = Config {
            node_id: 7,
            listen: listener.local_addr()?,
            advertise_addr: addr.clone(),
            data_dir: data_dir.to_path_buf(),
            meta_endpoints: vec![unreachable_endpoint().await?],
            heartbeat_interval: Duration::from_millis(100),
            shutdown_grace: Duration::from_secs(2),
            insecure_cluster: true,
            // These tests corrupt shard files on purpose to test the read
            // path; a scrub pass racing them would quarantine the file.
            scrub_bandwidth_bytes_per_sec: ByteSize(0),
            ..Config::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, listener, async {
            let _ = stopped.await;
        }));
        Ok(Node { addr, stop, handle })
    }

    async fn client(&self) -> Result<DatanodeClient<Channel>> {
        Ok(DatanodeClient::connect(self.addr.clone())
            .await?
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.handle)
            .await
            .context("run() did not return")???;
        Ok(())
    }
}

/// An address nothing listens on.
async fn unreachable_endpoint() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    Ok(format!("http://{}", l.local_addr()?))
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn header(blob: &str, index: u32) -> PutShardRequest {
    PutShardRequest {
        msg: Some(Msg::Header(ShardHeader {
            blob_id: blob.into(),
            shard_index: index,
            block_size: BLOCK as u32,
            gateway_id: String::new(),
        })),
    }
}

fn block(data: &[u8]) -> PutShardRequest {
    PutShardRequest {
        msg: Some(Msg::Block(ShardBlock {
            data: data.to_vec().into(),
            crc32c: block_crc32c(data),
        })),
    }
}

fn end(blocks: u64, bytes: u64) -> PutShardRequest {
    PutShardRequest {
        msg: Some(Msg::End(ShardEnd { blocks, bytes })),
    }
}

async fn put(
    c: &mut DatanodeClient<Channel>,
    blob: &str,
    index: u32,
    data: &[u8],
) -> Result<PutShardResponse, tonic::Status> {
    let mut msgs = vec![header(blob, index)];
    msgs.extend(data.chunks(BLOCK).map(block));
    msgs.push(end(data.chunks(BLOCK).count() as u64, data.len() as u64));
    c.put_shard(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

/// Blocks of a GetShard stream until its end or first error.
async fn get(
    c: &mut DatanodeClient<Channel>,
    blob: &str,
    index: u32,
    first_block: u64,
    block_count: u64,
) -> Result<(Vec<Vec<u8>>, Option<tonic::Status>), tonic::Status> {
    let req = GetShardRequest {
        blob_id: blob.into(),
        shard_index: index,
        first_block,
        block_count,
    };
    let mut stream = c.get_shard(req).await?.into_inner();
    let mut blocks = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(resp) => {
                let b = resp.block.expect("response carries a block");
                assert_eq!(
                    block_crc32c(&b.data),
                    b.crc32c,
                    "datanode sends the stored checksum"
                );
                blocks.push(b.data.to_vec());
            }
            Err(status) => return Ok((blocks, Some(status))),
        }
    }
    Ok((blocks, None))
}

fn files_named(dir: &Path, pred: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(files_named(&path, pred));
        } else if pred(&e.file_name().to_string_lossy()) {
            out.push(path);
        }
    }
    out
}

fn temp_files(dir: &Path) -> usize {
    files_named(dir, &|n| n.contains(".tmp-")).len()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    if let Err(e) = sluice_test_support::eventually(what, WAIT, || Ok(cond())).await {
        panic!("{e}");
    }
}

#[tokio::test]
async fn put_read_range_list_delete() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut c = node.client().await?;

    // 4 full blocks and a short one.
    let data = payload(4 * BLOCK + 1000, 1);
    let r = put(&mut c, "blob-1", 2, &data).await?;
    assert_eq!((r.bytes_written, r.blocks), (data.len() as u64, 5));
    put(&mut c, "blob-0", 0, &payload(100, 2)).await?;

    let (blocks, err) = get(&mut c, "blob-1", 2, 1, 3).await?;
    assert!(err.is_none());
    assert_eq!(blocks.concat(), data[BLOCK..4 * BLOCK]);
    let (blocks, _) = get(&mut c, "blob-1", 2, 3, 0).await?;
    assert_eq!(blocks.concat(), data[3 * BLOCK..]);
    assert_eq!(blocks[1].len(), 1000);

    let status = c.node_status(NodeStatusRequest {}).await?.into_inner();
    assert_eq!((status.node_id, status.shards), (7, 2));
    assert_eq!(
        status.bytes_stored,
        (16 + data.len() + 5 * 4 + 16 + 100 + 4) as u64
    );

    // ListShards pages in store order (fan-out partition, then blob id).
    let mut order = ["blob-0", "blob-1"];
    order.sort_by_key(|b| list_position(b));
    // (shard index, stored size) of each blob's one shard.
    let shard = |blob: &str| match blob {
        "blob-1" => (2, (16 + data.len() + 5 * 4) as u64),
        _ => (0, (16 + 100 + 4) as u64),
    };
    let page = c
        .list_shards(ListShardsRequest {
            after_blob_id: String::new(),
            limit: 1,
        })
        .await?
        .into_inner();
    assert_eq!(page.shards.len(), 1);
    assert_eq!(
        (page.shards[0].blob_id.as_str(), page.is_truncated),
        (order[0], true)
    );
    assert_eq!(
        (page.shards[0].shard_index, page.shards[0].size),
        shard(order[0])
    );
    let page = c
        .list_shards(ListShardsRequest {
            after_blob_id: order[0].into(),
            limit: 0,
        })
        .await?
        .into_inner();
    assert_eq!(
        (page.shards[0].blob_id.as_str(), page.shards[0].shard_index),
        (order[1], shard(order[1]).0)
    );
    assert_eq!(page.shards[0].size, shard(order[1]).1);
    assert!(!page.is_truncated);

    let err = get(&mut c, "blob-1", 2, 4, 2)
        .await
        .expect_err("range past the end");
    assert_eq!(err.code(), Code::OutOfRange);

    let deleted = c
        .delete_blobs(DeleteBlobsRequest {
            blob_ids: vec!["blob-1".into(), "nope".into()],
        })
        .await?;
    assert_eq!(deleted.into_inner().shards_deleted, 1);
    let err = get(&mut c, "blob-1", 2, 0, 0).await.expect_err("deleted");
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        c.node_status(NodeStatusRequest {})
            .await?
            .into_inner()
            .shards,
        1
    );

    node.stop().await
}

#[tokio::test]
async fn bad_checksum_or_protocol_stores_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut c = node.client().await?;

    let data = payload(3 * BLOCK, 3);
    let mut msgs = vec![
        header("bad", 0),
        block(&data[..BLOCK]),
        block(&data[BLOCK..2 * BLOCK]),
    ];
    let mut last = block(&data[2 * BLOCK..]);
    if let Some(Msg::Block(b)) = &mut last.msg {
        b.crc32c ^= 1;
    }
    msgs.push(last);
    let err = c
        .put_shard(tokio_stream::iter(msgs))
        .await
        .expect_err("checksum mismatch");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("block 2"), "{}", err.message());
    assert_eq!(
        get(&mut c, "bad", 0, 0, 0)
            .await
            .expect_err("not stored")
            .code(),
        Code::NotFound
    );

    let err = c
        .put_shard(tokio_stream::iter(vec![block(b"x")]))
        .await
        .expect_err("no header");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .put_shard(tokio_stream::iter(vec![header("bad", 0), header("bad", 0)]))
        .await
        .expect_err("2 headers");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = put(&mut c, "../etc", 0, b"x")
        .await
        .expect_err("bad blob id");
    assert_eq!(err.code(), Code::InvalidArgument);
    // A short block followed by another.
    let msgs = vec![header("bad", 1), block(b"short"), block(b"again")];
    let err = c
        .put_shard(tokio_stream::iter(msgs))
        .await
        .expect_err("short block not last");
    assert_eq!(err.code(), Code::InvalidArgument);
    // A stream that ends without its end message, or whose end message
    // does not match what arrived, or that goes on after it. Two blocks
    // each, so the store has created a temp file (it holds a first block
    // alone in memory) that the refusal must remove.
    let two = || [block(&data[..BLOCK]), block(&data[BLOCK..2 * BLOCK])];
    let msgs = [vec![header("bad", 2)], two().to_vec()].concat();
    let err = c
        .put_shard(tokio_stream::iter(msgs))
        .await
        .expect_err("no end message");
    assert_eq!(err.code(), Code::Aborted, "{}", err.message());
    let two_blocks = 2 * BLOCK as u64;
    for (what, after) in [
        ("end counts 3 blocks", vec![end(3, two_blocks)]),
        ("end counts 1 byte", vec![end(2, 1)]),
        (
            "block after the end",
            vec![end(2, two_blocks), block(&data[..BLOCK])],
        ),
    ] {
        let msgs = [vec![header("bad", 3)], two().to_vec(), after].concat();
        let err = c.put_shard(tokio_stream::iter(msgs)).await.expect_err(what);
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
    }

    wait_for("temp files removed", || temp_files(dir.path()) == 0).await;
    assert_eq!(
        c.node_status(NodeStatusRequest {})
            .await?
            .into_inner()
            .shards,
        0
    );
    node.stop().await
}

#[tokio::test]
async fn client_reset_mid_stream_discards_the_shard() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut c = node.client().await?;
    let old = payload(BLOCK, 9);
    put(&mut c, "reset", 0, &old).await?;

    let (tx, rx) = mpsc::channel(4);
    let mut uploader = c.clone();
    let call = tokio::spawn(async move { uploader.put_shard(ReceiverStream::new(rx)).await });
    tx.send(header("reset", 0)).await?;
    // Two blocks: the store holds a first block alone in memory and
    // creates the temp file when the second comes.
    tx.send(block(&payload(BLOCK, 1))).await?;
    tx.send(block(&payload(BLOCK, 2))).await?;
    wait_for("temp file of the upload", || temp_files(dir.path()) == 1).await;
    // The gateway gives up: dropping the call resets the HTTP/2 stream.
    call.abort();
    wait_for("temp file removed after reset", || {
        temp_files(dir.path()) == 0
    })
    .await;
    drop(tx);

    let (blocks, err) = get(&mut c, "reset", 0, 0, 0).await?;
    assert!(err.is_none());
    assert_eq!(blocks.concat(), old, "the committed shard is untouched");
    node.stop().await
}

#[tokio::test]
async fn bitrot_ends_the_stream_with_data_loss() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut c = node.client().await?;
    let data = payload(3 * BLOCK, 5);
    put(&mut c, "rot", 1, &data).await?;

    let files = files_named(dir.path(), &|n| n == "rot.1");
    assert_eq!(files.len(), 1);
    let mut bytes = std::fs::read(&files[0])?;
    bytes[16 + (BLOCK + 4) + 100] ^= 0x80; // inside block 1
    std::fs::write(&files[0], bytes)?;

    let (blocks, err) = get(&mut c, "rot", 1, 0, 0).await?;
    assert_eq!(blocks, vec![data[..BLOCK].to_vec()]);
    let err = err.expect("stream ends with an error");
    assert_eq!(err.code(), Code::DataLoss);
    assert!(err.message().contains("block 1"), "{}", err.message());
    let (blocks, err) = get(&mut c, "rot", 1, 2, 1).await?;
    assert!(err.is_none());
    assert_eq!(blocks.concat(), data[2 * BLOCK..]);

    // Rot in the first block of a range, which the open reads with the
    // header: the same answer, whether more blocks follow or not.
    put(&mut c, "rot0", 2, &data).await?;
    let files = files_named(dir.path(), &|n| n == "rot0.2");
    let mut bytes = std::fs::read(&files[0])?;
    bytes[16 + 100] ^= 0x80; // inside block 0
    std::fs::write(&files[0], bytes)?;
    for (first, count) in [(0, 0), (0, 1)] {
        let (blocks, err) = get(&mut c, "rot0", 2, first, count).await?;
        assert!(
            blocks.is_empty(),
            "{first}+{count}: {} blocks",
            blocks.len()
        );
        let err = err.expect("stream ends with an error");
        assert_eq!(err.code(), Code::DataLoss);
        assert!(err.message().contains("block 0"), "{}", err.message());
    }
    let (blocks, err) = get(&mut c, "rot0", 2, 1, 0).await?;
    assert!(err.is_none());
    assert_eq!(blocks.concat(), data[BLOCK..]);
    node.stop().await
}

#[tokio::test]
async fn restart_on_the_same_dir_keeps_shards() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = payload(2 * BLOCK + 7, 6);
    let node = Node::start(dir.path()).await?;
    put(&mut node.client().await?, "durable", 3, &data).await?;
    node.stop().await?;

    let node = Node::start(dir.path()).await?;
    let mut c = node.client().await?;
    let (blocks, err) = get(&mut c, "durable", 3, 0, 0).await?;
    assert!(err.is_none());
    assert_eq!(blocks.concat(), data);
    assert_eq!(
        c.node_status(NodeStatusRequest {})
            .await?
            .into_inner()
            .shards,
        1
    );
    node.stop().await
}
