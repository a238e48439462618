//! Datanode disks through `run()`: a foreign data dir is refused at start,
//! and a real tiny filesystem (a 2 MiB tmpfs, mounted when the test runs as
//! root with the right to mount; skipped with a printed reason otherwise)
//! filling up: ENOSPC fails only the shard being written, the free-space
//! reserve refuses new shards, and deleting makes room again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_datanode::{Config, Error, block_crc32c, run};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    DeleteBlobsRequest, GetShardRequest, PutShardRequest, ShardBlock, ShardEnd, ShardHeader,
};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(10);
const BLOCK: usize = 64 * 1024;

struct Node {
    addr: String,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), Error>>,
}

async fn unreachable_endpoint() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    Ok(format!("http://{}", l.local_addr()?))
}

async fn config(node_id: u64, data_dir: &Path, reserve: u64) -> Result<(Config, TcpListener)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let config = Config {
        node_id,
        listen: listener.local_addr()?,
        advertise_addr: format!("http://{}", listener.local_addr()?),
        data_dir: data_dir.to_path_buf(),
        meta_endpoints: vec![unreachable_endpoint().await?],
        heartbeat_interval: Duration::from_millis(100),
        shutdown_grace: Duration::from_secs(2),
        reserved_free_bytes: ByteSize(reserve),
        scrub_bandwidth_bytes_per_sec: ByteSize(0),
        insecure_cluster: true,
        ..Config::default()
    };
    Ok((config, listener))
}

impl Node {
    async fn start(node_id: u64, data_dir: &Path, reserve: u64) -> Result<Node> {
        let (config, listener) = config(node_id, data_dir, reserve).await?;
        let addr = config.advertise_addr.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, listener, async {
            let _ = stopped.await;
        }));
        Ok(Node { addr, stop, handle })
    }

    async fn client(&self) -> Result<DatanodeClient<Channel>> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match DatanodeClient::connect(self.addr.clone()).await {
                Ok(c) => return Ok(c),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.handle)
            .await
            .context("run() did not return")???;
        Ok(())
    }
}

async fn put(
    c: &mut DatanodeClient<Channel>,
    blob: &str,
    len: usize,
) -> Result<u64, tonic::Status> {
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut msgs = vec![PutShardRequest {
        msg: Some(Msg::Header(ShardHeader {
            blob_id: blob.into(),
            shard_index: 0,
            block_size: BLOCK as u32,
            gateway_id: String::new(),
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
    c.put_shard(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner().bytes_written)
}

async fn read_len(c: &mut DatanodeClient<Channel>, blob: &str) -> Result<usize> {
    let mut stream = c
        .get_shard(GetShardRequest {
            blob_id: blob.into(),
            shard_index: 0,
            first_block: 0,
            block_count: 0,
        })
        .await?
        .into_inner();
    let mut len = 0;
    while let Some(m) = stream.next().await {
        len += m?.block.map(|b| b.data.len()).unwrap_or(0);
    }
    Ok(len)
}

fn temp_files(data_dir: &Path) -> usize {
    std::fs::read_dir(data_dir.join("shards"))
        .into_iter()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).into_iter().flatten())
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".tmp-")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_data_dir_is_refused_at_start() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start(3, tmp.path(), 0).await?;
    node.client().await?;
    node.stop().await?;
    let id = std::fs::read_to_string(tmp.path().join("sluice-disk.toml"))?;
    assert!(id.contains("node_id = 3"), "{id}");

    // The same disk under another node id.
    let (config, listener) = config(4, tmp.path(), 0).await?;
    match run(config, listener, async {}).await {
        Err(Error::Identity(e)) => {
            let msg = e.to_string();
            assert!(msg.contains("belongs to datanode 3"), "{msg}");
            assert!(msg.contains("foreign disk"), "{msg}");
        }
        other => bail!("expected a foreign-disk refusal, got {other:?}"),
    }
    // Its own node id still starts, with the same identity.
    let node = Node::start(3, tmp.path(), 0).await?;
    node.client().await?;
    node.stop().await?;
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("sluice-disk.toml"))?,
        id
    );
    Ok(())
}

/// A mounted tmpfs, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. "2m"), or says why it cannot.
    fn mount(size: &str) -> std::result::Result<Tmpfs, String> {
        if !nix_is_root() {
            return Err("not running as root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_filesystem_fails_only_the_shard_being_written() -> Result<()> {
    let fs = match Tmpfs::mount("2m") {
        Ok(fs) => fs,
        Err(reason) => {
            println!("skipped: needs a tiny tmpfs: {reason}");
            return Ok(());
        }
    };
    let data_dir = fs.path.join("dn");
    // No reserve: the disk really fills up.
    let node = Node::start(1, &data_dir, 0).await?;
    let mut c = node.client().await?;
    let mut stored = Vec::new();
    let full = loop {
        let blob = format!("e1.{:04x}", stored.len());
        match put(&mut c, &blob, 5 * BLOCK).await {
            Ok(_) => stored.push(blob),
            Err(status) => break status,
        }
        if stored.len() > 100 {
            bail!("a 2 MiB filesystem took {} shards of 320 KiB", stored.len());
        }
    };
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    assert!(!stored.is_empty());
    assert_eq!(
        temp_files(&data_dir),
        0,
        "the failed shard left no temp file"
    );
    // Every committed shard reads back whole.
    for blob in &stored {
        assert_eq!(read_len(&mut c, blob).await?, 5 * BLOCK);
    }
    // Deleting makes room: writes succeed again.
    c.delete_blobs(DeleteBlobsRequest {
        blob_ids: stored.drain(..2).collect(),
    })
    .await?;
    put(&mut c, "e1.again", 5 * BLOCK).await?;
    node.stop().await?;

    // With a reserve larger than what is left, new shards are refused
    // before any byte is written.
    let node = Node::start(1, &data_dir, 4 << 20).await?;
    let mut c = node.client().await?;
    let err = put(&mut c, "e1.refused", BLOCK).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "datanode below its free-space reserve");
    assert_eq!(temp_files(&data_dir), 0);
    assert_eq!(read_len(&mut c, "e1.again").await?, 5 * BLOCK);
    node.stop().await?;
    Ok(())
}
