//! Fixtures of the gateway's integration tests: real datanodes (TCP on
//! loopback, a temp data dir, no meta) and a [`BlobStore`] over them
//! through a [`FixedDatanodes`] set, so a test marks nodes down or full by
//! hand instead of waiting for heartbeats. The cluster-level fixtures (meta,
//! gateways, S3 clients) are in `sluice-tests`.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_gateway::blob::{BlobStore, BlobStoreConfig};
use sluice_gateway::datanodes::{DatanodeEntry, FixedDatanodes};
use sluice_gateway::epoch::WriteEpochs;
use sluice_test_support::RoleTask;
use tempfile::TempDir;
use tokio::net::TcpListener;

/// The write epoch blob ids name in these tests.
pub const EPOCH: u64 = 1;

/// A datanode run in this process on its own loopback port and temp dir.
pub struct Datanode {
    pub id: u64,
    /// Where it listens.
    pub listen: SocketAddr,
    /// Its gRPC endpoint, `http://<listen>`.
    pub addr: String,
    pub dir: TempDir,
    /// Changes the test makes to the default config.
    tweak: fn(&mut sluice_datanode::Config),
    task: RoleTask<sluice_datanode::Error>,
}

impl Datanode {
    /// Starts datanode `id` with the defaults changed by `tweak`. Its meta
    /// endpoint is a port where nothing listens: registration retries in
    /// the background, heartbeats are 30 s apart.
    pub async fn start(id: u64, tweak: fn(&mut sluice_datanode::Config)) -> Result<Datanode> {
        let dir = tempfile::tempdir()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let listen = listener.local_addr()?;
        let mut node = Datanode {
            id,
            listen,
            addr: format!("http://{listen}"),
            dir,
            tweak,
            task: RoleTask::default(),
        };
        node.run(listener);
        Ok(node)
    }

    fn run(&mut self, listener: TcpListener) {
        let mut config = sluice_datanode::Config {
            node_id: self.id,
            listen: self.listen,
            advertise_addr: self.addr.clone(),
            data_dir: self.dir.path().to_path_buf(),
            meta_endpoints: vec!["http://127.0.0.1:9".into()],
            heartbeat_interval: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(1),
            insecure_cluster: true,
            ..Default::default()
        };
        (self.tweak)(&mut config);
        self.task = RoleTask::spawn(|stop| sluice_datanode::run(config, listener, stop));
    }

    /// Stops it (its data dir stays).
    pub async fn shut_down(&mut self) -> Result<()> {
        self.task.stop().await
    }

    /// Signals it to stop and returns the stopping role without waiting:
    /// its listener closes at once, its open connections drain for
    /// `shutdown_grace`, and [`start_again`](Self::start_again) may run
    /// beside it. Await the returned task's `stop` to finish.
    pub fn begin_shut_down(&mut self) -> RoleTask<sluice_datanode::Error> {
        let mut stopping = std::mem::take(&mut self.task);
        stopping.signal();
        stopping
    }

    /// Starts the stopped node again on the same address and data dir,
    /// retrying the bind for up to `wait` (the old socket may linger).
    pub async fn start_again(&mut self, wait: Duration) -> Result<()> {
        let started = Instant::now();
        let listener = loop {
            match TcpListener::bind(self.listen).await {
                Ok(l) => break l,
                Err(e) if started.elapsed() < wait => {
                    tracing::debug!(error = %e, "rebinding");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => bail!("rebinding {}: {e}", self.listen),
            }
        };
        self.run(listener);
        Ok(())
    }

    /// Every file under its shard directories, temp files included.
    pub fn shard_files(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        walk(&self.dir.path().join("shards"), &mut out)?;
        Ok(out)
    }

    /// The committed file of shard `index` of `blob_id`, if any.
    pub fn shard_file(&self, blob_id: &str, index: u32) -> Result<Option<PathBuf>> {
        let name = format!("{blob_id}.{index}");
        Ok(self
            .shard_files()?
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == name)))
    }
}

/// Appends every file under `dir` (recursively) to `out`; nothing if `dir`
/// does not exist.
pub fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Scrub off: tests that damage shard files on purpose must not race a
/// scrub pass that would quarantine the file first.
pub fn no_scrub(c: &mut sluice_datanode::Config) {
    c.scrub_bandwidth_bytes_per_sec = bytesize::ByteSize(0);
}

/// The defaults unchanged.
pub fn defaults(_: &mut sluice_datanode::Config) {}

/// Every node of `nodes` live and writable.
pub fn up(nodes: &[Datanode]) -> Vec<DatanodeEntry> {
    nodes
        .iter()
        .map(|n| DatanodeEntry::up(n.id, n.addr.clone()))
        .collect()
}

/// A store over the fixed datanode set `entries` writing under
/// [`EPOCH`], and the set (to change it by hand, then
/// [`BlobStore::refresh_datanodes`]).
pub async fn fixed_store(
    config: BlobStoreConfig,
    entries: Vec<DatanodeEntry>,
) -> Result<(BlobStore, Arc<FixedDatanodes>)> {
    fixed_store_with(config, entries, WriteEpochs::fixed(EPOCH)).await
}

/// [`fixed_store`] writing under `epochs`.
pub async fn fixed_store_with(
    config: BlobStoreConfig,
    entries: Vec<DatanodeEntry>,
    epochs: WriteEpochs,
) -> Result<(BlobStore, Arc<FixedDatanodes>)> {
    let directory = Arc::new(FixedDatanodes::new(
        entries,
        sluice_net::Transport::Insecure,
    ));
    let store = BlobStore::start_with_directory(config, directory.clone(), epochs).await?;
    Ok((store, directory))
}
