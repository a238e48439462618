//! `TestCluster`: meta voters, datanodes and a gateway running in this
//! process on port-0 listeners, each with its own directory and its own
//! shutdown trigger, so single processes can be stopped and restarted on the
//! same directory and the same address.
//!
//! Every wait is a condition polled until a deadline; a timeout fails with
//! the last observed state.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use futures::future::BoxFuture;
use sluice_meta::MetaClient;
use sluice_proto::datanode::NodeStatusRequest;
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::meta::meta_client::MetaClient as MetaRpcClient;
use sluice_proto::meta::{ClusterStatusRequest, ClusterStatusResponse};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;

pub const ACCESS_KEY: &str = "sluice-test-access-key";
pub const SECRET_KEY: &str = "sluice-test-secret-key-do-not-use";
pub const REGION: &str = "us-east-1";

/// How long a process may take to return from `run` after its shutdown
/// trigger fired.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for cluster-level conditions (leader elected, datanodes
/// live, gateway answering).
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval of [`wait_until`].
const POLL: Duration = Duration::from_millis(100);

/// Polls `probe` until it returns `Ok(value)`; `Err(state)` describes why the
/// condition does not hold yet. Fails after `timeout` with the last state.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(state) => {
                if started.elapsed() >= timeout {
                    bail!("timed out after {timeout:?} waiting for {what}; last state: {state}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A role whose `run(config, listener, shutdown)` can be spawned.
pub trait Role: Clone + Send + 'static {
    fn listen(&self) -> SocketAddr;
    fn run(
        self,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
    ) -> BoxFuture<'static, Result<()>>;
}

async fn stopped(rx: oneshot::Receiver<()>) {
    // A dropped sender (cluster dropped) also means stop.
    let _ = rx.await;
}

impl Role for sluice_meta::Config {
    fn listen(&self) -> SocketAddr {
        self.listen
    }
    fn run(
        self,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
    ) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            sluice_meta::run(self, listener, stopped(stop))
                .await
                .map_err(anyhow::Error::from)
        })
    }
}

impl Role for sluice_datanode::Config {
    fn listen(&self) -> SocketAddr {
        self.listen
    }
    fn run(
        self,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
    ) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            sluice_datanode::run(self, listener, stopped(stop))
                .await
                .map_err(anyhow::Error::from)
        })
    }
}

/// The gateway role: its config, and the admission and buffer counters
/// every run of it reports into (kept across restarts).
#[derive(Clone)]
pub struct GatewayRole {
    pub config: sluice_gateway::Config,
    pub stats: sluice_gateway::GatewayStats,
}

impl Role for GatewayRole {
    fn listen(&self) -> SocketAddr {
        self.config.listen
    }
    fn run(
        self,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
    ) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            sluice_gateway::run_with_stats(self.config, listener, stopped(stop), self.stats)
                .await
                .map_err(anyhow::Error::from)
        })
    }
}

/// Changes applied to the configs a [`TestCluster`] starts its nodes with
/// (after the fixture's own settings).
#[derive(Clone, Copy, Default)]
pub struct Overrides {
    pub datanode: Option<fn(&mut sluice_datanode::Config)>,
    pub gateway: Option<fn(&mut sluice_gateway::Config)>,
}

struct Running {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<()>>,
}

/// One in-process node: its config (address, directory) survives restarts.
pub struct Process<C: Role> {
    pub name: String,
    pub config: C,
    running: Option<Running>,
    /// The port-0 listener that picked the address, until first start.
    reserved: Option<TcpListener>,
}

impl<C: Role> Process<C> {
    fn new(name: String, config: C) -> Self {
        Process {
            name,
            config,
            running: None,
            reserved: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.config.listen()
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Errors if the process was started and its `run` already returned.
    fn check_alive(&self) -> Result<()> {
        match &self.running {
            Some(r) if r.handle.is_finished() => {
                bail!("{} exited on its own while it should be running", self.name)
            }
            _ => Ok(()),
        }
    }

    fn start_on(&mut self, listener: TcpListener) {
        assert!(self.running.is_none(), "{} is already running", self.name);
        let (stop, rx) = oneshot::channel();
        let run = self.config.clone().run(listener, rx);
        let name = self.name.clone();
        let handle = tokio::spawn(async move {
            let result = run.await;
            if let Err(e) = &result {
                // Seen even when the process dies before anyone stops it.
                eprintln!("{name}: run returned an error: {e:#}");
            }
            result
        });
        self.running = Some(Running { stop, handle });
    }

    /// Starts the process on its configured address (rebinding the port it
    /// had before, which must have been released by the previous `run`).
    pub async fn start(&mut self) -> Result<()> {
        if let Some(listener) = self.reserved.take() {
            self.start_on(listener);
            return Ok(());
        }
        let addr = self.addr();
        let listener = wait_until(
            &format!("{} to rebind {addr}", self.name),
            Duration::from_secs(10),
            || async move { TcpListener::bind(addr).await.map_err(|e| e.to_string()) },
        )
        .await?;
        self.start_on(listener);
        Ok(())
    }

    /// Fires the shutdown trigger and waits until `run` returned `Ok`.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(Running { stop, handle }) = self.running.take() else {
            bail!("{} is not running", self.name);
        };
        let _ = stop.send(());
        match tokio::time::timeout(STOP_TIMEOUT, handle).await {
            Err(_) => bail!(
                "{} did not return from run within {STOP_TIMEOUT:?} after shutdown",
                self.name
            ),
            Ok(Err(join)) => bail!("{} panicked: {join}", self.name),
            Ok(Ok(Err(e))) => {
                Err(e.context(format!("{} run returned an error on shutdown", self.name)))
            }
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }
}

pub type MetaNode = Process<sluice_meta::Config>;
pub type DataNode = Process<sluice_datanode::Config>;
pub type Gateway = Process<GatewayRole>;

pub struct TestCluster {
    /// Holds every node's directory; removed when the cluster is dropped.
    _root: tempfile::TempDir,
    /// Meta node `i` has node id `i + 1`.
    pub metas: Vec<MetaNode>,
    /// Datanode `i` has node id `i + 1`.
    pub datanodes: Vec<DataNode>,
    pub gateway: Gateway,
    meta: MetaClient,
}

fn http(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

async fn bind_any() -> Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind port-0 listener")
}

fn meta_config(
    id: u64,
    listen: SocketAddr,
    dir: PathBuf,
    voters: BTreeMap<u64, String>,
) -> sluice_meta::Config {
    sluice_meta::Config {
        node_id: id,
        listen,
        advertise_addr: http(listen),
        data_dir: dir,
        voters,
        sled_cache_bytes: 8 * 1024 * 1024,
        // Small, so the scenario's restarts go through snapshot install and
        // restore rather than only log replay.
        snapshot_logs_since_last: 20,
        max_in_snapshot_log_to_keep: 5,
        datanode_liveness: Duration::from_secs(3),
        ..Default::default()
    }
}

fn datanode_config(
    id: u64,
    listen: SocketAddr,
    dir: PathBuf,
    meta_endpoints: Vec<String>,
) -> sluice_datanode::Config {
    sluice_datanode::Config {
        node_id: id,
        listen,
        advertise_addr: http(listen),
        data_dir: dir,
        meta_endpoints,
        heartbeat_interval: Duration::from_millis(300),
        shutdown_grace: Duration::from_secs(5),
        ..Default::default()
    }
}

fn gateway_config(listen: SocketAddr, meta_endpoints: Vec<String>) -> sluice_gateway::Config {
    sluice_gateway::Config {
        listen,
        region: REGION.to_string(),
        access_key: ACCESS_KEY.to_string(),
        secret_key: SECRET_KEY.to_string(),
        meta_endpoints,
        data_shards: 4,
        parity_shards: 2,
        block_size: 256 * 1024,
        datanode_refresh_interval: Duration::from_millis(300),
        shutdown_grace: Duration::from_secs(5),
        ..Default::default()
    }
}

/// Shards a datanode reports through its `NodeStatus` RPC.
async fn node_status_shards(addr: SocketAddr) -> std::result::Result<u64, String> {
    let channel = Endpoint::from_shared(http(addr))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let status = DatanodeClient::new(channel)
        .node_status(NodeStatusRequest {})
        .await
        .map_err(|e| format!("NodeStatus on {addr}: {e}"))?;
    Ok(status.into_inner().shards)
}

/// `ClusterStatus` as node `addr` itself sees it (no leader following).
pub async fn meta_status(addr: SocketAddr) -> std::result::Result<ClusterStatusResponse, String> {
    let channel = Endpoint::from_shared(http(addr))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let status = MetaRpcClient::new(channel)
        .cluster_status(ClusterStatusRequest {})
        .await
        .map_err(|e| format!("ClusterStatus on {addr}: {e}"))?;
    Ok(status.into_inner())
}

/// Regular files below `dir`, recursively.
fn count_files(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            n += count_files(&entry.path())?;
        } else if ty.is_file() {
            n += 1;
        }
    }
    Ok(n)
}

impl TestCluster {
    /// Starts `metas` meta voters (1 = single voter), `datanodes` datanodes
    /// and one gateway, and waits until a leader is elected, every datanode
    /// is live and the gateway answers S3 requests.
    pub async fn start(metas: usize, datanodes: usize) -> Result<TestCluster> {
        Self::start_with(metas, datanodes, Overrides::default()).await
    }

    /// [`TestCluster::start`] with config `overrides`.
    pub async fn start_with(
        metas: usize,
        datanodes: usize,
        overrides: Overrides,
    ) -> Result<TestCluster> {
        let mut cluster = Self::start_without_gateway(metas, datanodes, overrides).await?;
        cluster.gateway.start().await?;
        cluster.wait_gateway().await?;
        Ok(cluster)
    }

    /// Like [`TestCluster::start_with`], but leaves the gateway stopped (its
    /// listener is bound and kept for its first start).
    pub async fn start_without_gateway(
        metas: usize,
        datanodes: usize,
        overrides: Overrides,
    ) -> Result<TestCluster> {
        init_tracing();
        let root = tempfile::Builder::new()
            .prefix("sluice-cluster-")
            .tempdir()?;

        let mut meta_listeners = Vec::new();
        for _ in 0..metas {
            meta_listeners.push(bind_any().await?);
        }
        let meta_addrs: Vec<SocketAddr> = meta_listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<std::io::Result<_>>()?;
        let meta_endpoints: Vec<String> = meta_addrs.iter().map(|a| http(*a)).collect();
        // One voter: empty map = "self only", as `sluice dev` runs it.
        let voters: BTreeMap<u64, String> = if metas == 1 {
            BTreeMap::new()
        } else {
            meta_endpoints
                .iter()
                .enumerate()
                .map(|(i, e)| (i as u64 + 1, e.clone()))
                .collect()
        };

        let mut meta_nodes = Vec::new();
        for (i, listener) in meta_listeners.into_iter().enumerate() {
            let id = i as u64 + 1;
            let dir = root.path().join(format!("meta-{id}"));
            std::fs::create_dir_all(&dir)?;
            let mut node = Process::new(
                format!("meta-{id}"),
                meta_config(id, meta_addrs[i], dir, voters.clone()),
            );
            node.start_on(listener);
            meta_nodes.push(node);
        }

        let mut dn_nodes = Vec::new();
        for i in 0..datanodes {
            let id = i as u64 + 1;
            let listener = bind_any().await?;
            let dir = root.path().join(format!("datanode-{id}"));
            std::fs::create_dir_all(&dir)?;
            let mut config =
                datanode_config(id, listener.local_addr()?, dir, meta_endpoints.clone());
            if let Some(f) = overrides.datanode {
                f(&mut config);
            }
            let mut node = Process::new(format!("datanode-{id}"), config);
            node.start_on(listener);
            dn_nodes.push(node);
        }

        let gw_listener = bind_any().await?;
        let mut gw_config = gateway_config(gw_listener.local_addr()?, meta_endpoints.clone());
        if let Some(f) = overrides.gateway {
            f(&mut gw_config);
        }
        let mut gateway = Process::new(
            "gateway".into(),
            GatewayRole {
                config: gw_config,
                stats: sluice_gateway::GatewayStats::new(),
            },
        );
        gateway.reserved = Some(gw_listener);

        let cluster = TestCluster {
            _root: root,
            metas: meta_nodes,
            datanodes: dn_nodes,
            gateway,
            meta: MetaClient::with_timeouts(
                meta_endpoints,
                Duration::from_secs(5),
                Duration::from_secs(2),
            ),
        };
        cluster.wait_leader().await?;
        cluster.wait_datanodes_live().await?;
        Ok(cluster)
    }

    /// Errors if any process that should be running has exited.
    pub fn check_alive(&self) -> Result<()> {
        for m in &self.metas {
            m.check_alive()?;
        }
        for d in &self.datanodes {
            d.check_alive()?;
        }
        self.gateway.check_alive()
    }

    /// Waits until every running meta node names the same leader, that leader
    /// is running and names itself. Returns the leader's node id.
    pub async fn wait_leader(&self) -> Result<u64> {
        let running: Vec<(u64, SocketAddr)> = self
            .metas
            .iter()
            .enumerate()
            .filter(|(_, m)| m.is_running())
            .map(|(i, m)| (i as u64 + 1, m.addr()))
            .collect();
        wait_until(
            "a meta leader every running voter agrees on",
            CONVERGE_TIMEOUT,
            || {
                let running = running.clone();
                async move {
                    self.check_alive().map_err(|e| e.to_string())?;
                    let mut views = Vec::new();
                    for (id, addr) in &running {
                        let s = meta_status(*addr).await?;
                        if s.node_id != *id {
                            return Err(format!(
                                "{addr} answered ClusterStatus as node {} instead of {id}",
                                s.node_id
                            ));
                        }
                        views.push((*id, s.leader_id, s.term));
                    }
                    let leader = views[0]
                        .1
                        .ok_or_else(|| format!("no leader yet: {views:?}"))?;
                    if views.iter().any(|v| v.1 != Some(leader))
                        || !running.iter().any(|(id, _)| *id == leader)
                    {
                        return Err(format!(
                            "voters disagree or leader not running: (id, leader, term) {views:?}"
                        ));
                    }
                    Ok(leader)
                }
            },
        )
        .await
    }

    /// Waits until meta reports every datanode live.
    pub async fn wait_datanodes_live(&self) -> Result<()> {
        let want: Vec<u64> = (1..=self.datanodes.len() as u64).collect();
        self.wait_datanodes(&want, &[]).await
    }

    /// Waits until meta reports every datanode in `live` live and every one
    /// in `dead` not live.
    pub async fn wait_datanodes(&self, live: &[u64], dead: &[u64]) -> Result<()> {
        wait_until(
            "datanode liveness in meta",
            CONVERGE_TIMEOUT,
            || async move {
                self.check_alive().map_err(|e| e.to_string())?;
                let nodes = self
                    .meta
                    .list_datanodes()
                    .await
                    .map_err(|e| e.to_string())?;
                let view: Vec<(u64, bool)> = nodes.iter().map(|d| (d.id, d.live)).collect();
                let ok = live.iter().all(|id| view.contains(&(*id, true)))
                    && dead.iter().all(|id| !view.contains(&(*id, true)));
                if ok {
                    Ok(())
                } else {
                    Err(format!("(id, live) = {view:?}"))
                }
            },
        )
        .await
    }

    /// Waits until the gateway answers ListBuckets.
    pub async fn wait_gateway(&self) -> Result<()> {
        let s3 = &self.s3();
        wait_until(
            "the gateway to answer ListBuckets",
            CONVERGE_TIMEOUT,
            || async move {
                self.check_alive().map_err(|e| e.to_string())?;
                s3.list_buckets()
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
            },
        )
        .await
    }

    /// Index into `metas` of the current leader.
    pub async fn leader_index(&self) -> Result<usize> {
        Ok(self.wait_leader().await? as usize - 1)
    }

    /// An S3 client for the gateway with the cluster's credentials.
    pub fn s3(&self) -> aws_sdk_s3::Client {
        self.s3_with(ACCESS_KEY, SECRET_KEY)
    }

    /// Like [`TestCluster::s3`], but every request is tried once: a
    /// `503 SlowDown` is seen by the test instead of retried by the SDK.
    /// The SDK's stalled-stream protection is off as well: it fails an
    /// upload whose body makes no progress for 5 s, which is what the
    /// gateway's backpressure does while a request waits its turn for a
    /// buffer (up to `stall_timeout`); the SDK would retry it, but this
    /// client retries nothing.
    pub fn s3_without_retries(&self) -> aws_sdk_s3::Client {
        let config =
            self.s3()
                .config()
                .to_builder()
                .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
                .stalled_stream_protection(
                    aws_sdk_s3::config::StalledStreamProtectionConfig::disabled(),
                )
                .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    /// The gateway's admission and buffer counters (high-water marks
    /// survive gateway restarts).
    pub fn gateway_stats(&self) -> &sluice_gateway::GatewayStats {
        &self.gateway.config.stats
    }

    /// An S3 client for the gateway with the given credentials.
    pub fn s3_with(&self, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(http(self.gateway.addr()))
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new(
                access_key,
                secret_key,
                None,
                None,
                "sluice-tests",
            ))
            .force_path_style(true)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(120))
                    .build(),
            )
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    /// Sum of the shards every datanode reports via `NodeStatus`.
    pub async fn shard_count(&self) -> std::result::Result<u64, String> {
        let mut total = 0;
        for d in &self.datanodes {
            total += node_status_shards(d.addr()).await?;
        }
        Ok(total)
    }

    /// Regular files in all datanode directories.
    pub fn datanode_file_count(&self) -> std::result::Result<u64, String> {
        let mut total = 0;
        for d in &self.datanodes {
            total += count_files(&d.config.data_dir).map_err(|e| format!("{}: {e}", d.name))?;
        }
        Ok(total)
    }

    /// Stops every process: gateway, datanodes, then meta nodes.
    pub async fn stop_all(&mut self) -> Result<()> {
        if self.gateway.is_running() {
            self.gateway.stop().await?;
        }
        for d in &mut self.datanodes {
            if d.is_running() {
                d.stop().await?;
            }
        }
        for m in &mut self.metas {
            if m.is_running() {
                m.stop().await?;
            }
        }
        Ok(())
    }

    /// Starts every process on its old directory and address and waits as
    /// [`TestCluster::start`] does.
    pub async fn start_all(&mut self) -> Result<()> {
        self.start_all_but_gateway().await?;
        self.gateway.start().await?;
        self.wait_gateway().await
    }

    /// Starts every meta node and datanode on its old directory and address;
    /// waits for a leader and for every datanode to be live.
    pub async fn start_all_but_gateway(&mut self) -> Result<()> {
        for m in &mut self.metas {
            m.start().await?;
        }
        self.wait_leader().await?;
        for d in &mut self.datanodes {
            d.start().await?;
        }
        self.wait_datanodes_live().await
    }
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,openraft=error,s3s=off")),
        )
        .with_test_writer()
        .try_init();
}
