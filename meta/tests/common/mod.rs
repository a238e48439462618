//! Shared by the meta integration tests: an in-process single-voter meta
//! node, record builders, and the lost-response fault.
#![allow(dead_code)] // each test binary uses a subset

pub mod fake_datanode;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use sluice_meta::Config;
use sluice_meta_client::MetaClient;
use sluice_meta_client::client::{CallFaults, FaultAction};
use sluice_proto::meta as pb;
use sluice_test_support::RoleTask;
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub const WAIT: Duration = Duration::from_secs(30);

pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    sluice_test_support::wait_for_some(what, WAIT, check).await
}

pub struct Node {
    pub config: Config,
    task: RoleTask<sluice_meta::Error>,
}

impl Node {
    /// A single voter in `dir` on a fresh port, `tune` applied to a test
    /// config.
    pub async fn start(dir: &Path, tune: impl FnOnce(&mut Config)) -> Result<Node> {
        Self::start_on(dir, TcpListener::bind("127.0.0.1:0").await?, tune)
    }

    /// Like [`Node::start`] on `listener` (a restart rebinds the address
    /// it had).
    pub fn start_on(
        dir: &Path,
        listener: TcpListener,
        tune: impl FnOnce(&mut Config),
    ) -> Result<Node> {
        let addr = listener.local_addr()?;
        let mut config = Config {
            node_id: 1,
            listen: addr,
            advertise_addr: format!("http://{addr}"),
            data_dir: dir.to_path_buf(),
            sled_cache_bytes: ByteSize(4 << 20),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            insecure_cluster: true,
            ..Config::default()
        };
        tune(&mut config);
        let run_config = config.clone();
        let task = RoleTask::spawn(|stop| sluice_meta::run(run_config, listener, stop));
        Ok(Node { config, task })
    }

    pub fn client(&self) -> MetaClient {
        MetaClient::with_timeouts(
            vec![self.config.advertise_addr.clone()],
            Duration::from_secs(20),
            Duration::from_secs(5),
        )
    }

    /// Stops the node; its config restarts it on the same directory and
    /// port.
    pub async fn shut_down(mut self) -> Result<Config> {
        self.task.stop().await?;
        Ok(self.config)
    }

    /// Stops the node and opens its store read-only for inspection.
    pub async fn stop(self) -> Result<sluice_meta::store::SledStore> {
        let config = self.shut_down().await?;
        Ok(sluice_meta::store::SledStore::open(
            &config.data_dir,
            1 << 20,
        )?)
    }
}

pub fn object(key: &str, blob: &str, nodes: Vec<u64>) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: 3,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 3,
            placement: Some(pb::Placement {
                blob_id: blob.into(),
                size: 3,
                data_shards: 1,
                parity_shards: nodes.len() as u32 - 1,
                block_size: 262_144,
                nodes,
                missing: vec![],
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn blob_of(o: &pb::ObjectRecord) -> String {
    o.parts[0].placement.as_ref().unwrap().blob_id.clone()
}

/// Drops the first PutObject response (the commit was applied) and stalls
/// the retry 3 s, while the test lets another writer overwrite the key.
#[derive(Default)]
pub struct LoseFirstPut {
    pub attempts: AtomicUsize,
    responses: AtomicUsize,
    pub dropped: Notify,
}

impl CallFaults for LoseFirstPut {
    fn before_call(&self, rpc: &'static str) -> Option<Duration> {
        if rpc == "PutObject" && self.attempts.fetch_add(1, Ordering::SeqCst) == 1 {
            // The retry: a paused process; the test overwrites meanwhile.
            return Some(Duration::from_secs(3));
        }
        None
    }

    fn on_response(&self, rpc: &'static str) -> FaultAction {
        if rpc == "PutObject" && self.responses.fetch_add(1, Ordering::SeqCst) == 0 {
            self.dropped.notify_one();
            return FaultAction::Drop;
        }
        FaultAction::Deliver
    }
}
