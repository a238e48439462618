//! `TestCluster`: meta voters, datanodes and a gateway running in this
//! process on port-0 listeners, each with its own directory and its own
//! shutdown trigger, so single processes can be stopped and restarted on the
//! same directory and the same address.
//!
//! Every wait is a condition polled until a deadline; a timeout fails with
//! the last observed state.
//!
//! Every node runs with real mutual TLS: one CA per test process (see
//! [`cluster_tls`]) issues each node's certificate, and the fixture's own
//! gRPC calls use a gateway certificate of its own ([`harness_transport`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use futures::future::BoxFuture;
use sluice_meta_client::CallFaults;
use sluice_meta_client::MetaClient;
use sluice_net::{ClusterTls, Identity, Role as AuthRole, Transport};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::{HasShardsRequest, NodeStatusRequest, ShardId};
use sluice_proto::meta::meta_client::MetaClient as MetaRpcClient;
use sluice_proto::meta::{
    ClusterStatusRequest, ClusterStatusResponse, ListPlacementsRequest, PlacedBlob,
};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    sluice_test_support::wait_until_every(what, timeout, POLL, probe).await
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
    /// Fault seam the gateway's `MetaClient` is built with (every meta call
    /// of the gateway: commits, epoch renewals, heal); `None` = no faults.
    pub meta_faults: Option<Arc<dyn CallFaults>>,
}

/// Total retry deadline per call of a gateway `MetaClient` built with
/// faults (the same as `MetaClient::new`).
const GATEWAY_META_RETRY_DEADLINE: Duration = Duration::from_secs(20);
/// Timeout per attempt of a gateway `MetaClient` built with faults.
const GATEWAY_META_RPC_TIMEOUT: Duration = Duration::from_secs(5);

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
            let Some(faults) = self.meta_faults else {
                return sluice_gateway::run_with_stats(
                    self.config,
                    listener,
                    stopped(stop),
                    self.stats,
                )
                .await
                .map_err(anyhow::Error::from);
            };
            let meta = MetaClient::with_faults(
                self.config.meta_endpoints.clone(),
                GATEWAY_META_RETRY_DEADLINE,
                GATEWAY_META_RPC_TIMEOUT,
                faults,
            );
            sluice_gateway::run_with_meta(self.config, listener, stopped(stop), self.stats, meta)
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

/// Everything [`TestCluster::start_setup`] configures: a config function
/// per role (applied after the fixture's own settings; the datanode one
/// sees `node_id` and may treat nodes differently) and the fault seam of
/// the gateway's `MetaClient`.
#[derive(Clone, Default)]
pub struct Setup {
    pub meta: Option<fn(&mut sluice_meta::Config)>,
    pub datanode: Option<fn(&mut sluice_datanode::Config)>,
    pub gateway: Option<fn(&mut sluice_gateway::Config)>,
    pub gateway_meta_faults: Option<Arc<dyn CallFaults>>,
    /// Serve S3 over HTTPS with a certificate from a test CA
    /// ([`TestCluster::s3_tls`]); clients built by the cluster trust it.
    pub https: bool,
}

impl From<Overrides> for Setup {
    fn from(o: Overrides) -> Self {
        Setup {
            meta: None,
            datanode: o.datanode,
            gateway: o.gateway,
            gateway_meta_faults: None,
            https: false,
        }
    }
}

/// A certificate authority made for one test (rcgen), issuing server
/// certificates for 127.0.0.1 and localhost.
pub struct TestCa {
    pub cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Result<TestCa> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(TestCa {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// Writes a fresh server certificate and key (mode 0600) for 127.0.0.1
    /// and localhost to `cert` and `key`.
    pub fn issue(&self, cert: &Path, key: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let leaf_key = rcgen::KeyPair::generate()?;
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        let leaf = params.signed_by(&leaf_key, &self.issuer)?;
        std::fs::write(cert, leaf.pem())?;
        std::fs::write(key, leaf_key.serialize_pem())?;
        std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600))?;
        Ok(())
    }
}

/// The S3 certificate of an HTTPS test cluster: the CA clients trust and
/// the files the gateway serves (rewrite them and send SIGHUP to reload).
pub struct S3TlsFiles {
    pub ca: TestCa,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How long the tests' S3 clients keep an idle connection in their pool:
/// well below the gateway's `header_read_timeout` (10 s), so a client does
/// not pick a pooled connection the gateway is closing.
///
/// hyper's client pool (hyper-util's legacy client, under the SDK) opens a
/// connection for a request and, when another pooled connection frees
/// first, sends the request there and pools the new connection unused. The
/// gateway closes a connection that sent nothing within
/// `header_read_timeout` (`sluice_gateway::listener`; over TLS the
/// handshake counts as the first byte, and a request head must follow
/// within it), while hyper keeps an idle connection 90 s: a request that
/// picks it just as the gateway closes it fails with "connection closed
/// before message completed". The SDK's retries hide that race;
/// `TestCluster::s3_without_retries`, which must see every
/// `503 SlowDown`, does not retry it.
pub const S3_CLIENT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

// A gateway default closer to it would bring the race back (the pool's
// idle clock starts after the connect): fail the build.
const _: () = assert!(
    2 * S3_CLIENT_POOL_IDLE_TIMEOUT.as_millis()
        <= sluice_gateway::listener::DEFAULT_HEADER_READ_TIMEOUT.as_millis()
);

/// The HTTP client of the tests' S3 clients: rustls, trusting only
/// `ca_pem` when given (the SDK's default roots otherwise), idle
/// connections dropped after [`S3_CLIENT_POOL_IDLE_TIMEOUT`], no proxy
/// (the SDK's default client would read proxy settings from the
/// environment; the tests talk to loopback only).
pub fn s3_http_client(ca_pem: Option<&str>) -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::tls;
    let mut builder = aws_smithy_http_client::Builder::new()
        .pool_idle_timeout(S3_CLIENT_POOL_IDLE_TIMEOUT)
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ));
    if let Some(ca_pem) = ca_pem {
        let trust = tls::TrustStore::empty()
            .with_native_roots(false)
            .with_pem_certificate(ca_pem.as_bytes());
        let context = tls::TlsContext::builder()
            .with_trust_store(trust)
            .build()
            .expect("TLS context");
        builder = builder.tls_context(context);
    }
    builder.build_https()
}

// ---------------------------------------------------------------------------
// Durability knobs (docs/design/durability.md), one function per role: tiny
// intervals so heal, GC, epochs and reclaim act within a test's seconds.
// Tests apply one of these first, then change what they exercise.

/// Meta: 5 s epoch leases swept every 100 ms, released blobs reclaimed every
/// 100 ms after a 2 s `delete_delay`.
///
/// The lease is 5 s, not 1 s, so a gateway starved of CPU on a loaded test
/// machine (few cores, several clusters at once) does not lose its epoch and
/// answer 503 in tests that do not exercise fencing;
/// `paused_gateway_commit_is_fenced` sets [`FENCING_EPOCH_LEASE`].
pub fn durable_meta(c: &mut sluice_meta::Config) {
    // Sessions keep their defaults (10 min, 100 000 entries): much longer
    // than any retry in these tests.
    c.session_expiry = Duration::from_secs(600);
    c.session_table_max_entries = 100_000;
    c.epoch_lease = Duration::from_secs(5);
    c.epoch_sweep_interval = Duration::from_millis(100);
    c.delete_delay = Duration::from_secs(2);
    c.reclaim_interval = Duration::from_millis(100);
    c.stale_upload_check_interval = Duration::from_secs(3600);
}

/// The epoch lease of the fencing test: 1 s.
pub const FENCING_EPOCH_LEASE: Duration = Duration::from_secs(1);

/// Datanode: GC every 200 ms with a 100 ms grace, no reserve (1 byte), no
/// scrub within a test (1 h), unthrottled scrub reads.
pub fn durable_datanode(c: &mut sluice_datanode::Config) {
    c.gc_interval = Duration::from_millis(200);
    c.gc_grace = Duration::from_millis(100);
    c.reserved_free_bytes = ByteSize(1);
    c.scrub_interval = Duration::from_secs(3600);
    c.scrub_bandwidth_bytes_per_sec = ByteSize(1024 * 1024 * 1024);
}

/// A `reserved_free_bytes` larger than any test machine's free space (1 PiB):
/// the datanode reports itself not writable and refuses PutShard.
pub const FULL_DISK_RESERVE: u64 = 1 << 50;

/// Gateway: 4+2 with write quorum 5, heal on every 200 ms, audit every 1 s,
/// a node down 2 s has its shards reported missing, unthrottled heal.
pub fn durable_gateway(c: &mut sluice_gateway::Config) {
    c.data_shards = 4;
    c.parity_shards = 2;
    c.write_quorum = Some(5);
    c.epoch_rotation = Duration::from_secs(600);
    c.heal_enabled = true;
    c.heal_interval = Duration::from_millis(200);
    c.audit_interval = Duration::from_secs(1);
    c.node_down_after = Duration::from_secs(2);
    c.heal_bandwidth_bytes_per_sec = ByteSize(1024 * 1024 * 1024);
    c.heal_concurrency = 4;
}

/// [`Setup`] with the three `durable_*` functions and no faults.
pub fn durable_setup() -> Setup {
    Setup {
        meta: Some(durable_meta),
        datanode: Some(durable_datanode),
        gateway: Some(durable_gateway),
        gateway_meta_faults: None,
        https: false,
    }
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
    /// Set when the gateway serves HTTPS ([`Setup::https`]).
    pub s3_tls: Option<S3TlsFiles>,
}

fn http(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// The test process's CA directory, created once (never removed while the
/// process runs), and the lock serializing certificate issuing in it.
struct Pki {
    dir: tempfile::TempDir,
    lock: std::sync::Mutex<()>,
}

fn pki() -> &'static Pki {
    static PKI: std::sync::OnceLock<Pki> = std::sync::OnceLock::new();
    PKI.get_or_init(|| Pki {
        dir: tempfile::Builder::new()
            .prefix("sluice-test-pki-")
            .tempdir()
            .expect("pki temp dir"),
        lock: std::sync::Mutex::new(()),
    })
}

/// The test process's CA certificate file.
pub fn ca_file() -> PathBuf {
    cluster_tls(AuthRole::Gateway, "harness").ca_file
}

/// `[cluster_tls]` for `role`/`id`, issued by the test process's CA on
/// first use (every cluster of the process shares the CA).
pub fn cluster_tls(role: AuthRole, id: &str) -> ClusterTls {
    let pki = pki();
    let _issuing = pki.lock.lock().unwrap_or_else(|e| e.into_inner());
    let identity = Identity::new(role, id).expect("test identity");
    sluice_net::pki::ensure_dir(pki.dir.path(), &[identity])
        .expect("issue a test certificate")
        .remove(0)
}

/// A transport presenting a certificate for `role`/`id`.
pub fn transport_as(role: AuthRole, id: &str) -> Transport {
    Transport::from_config(Some(&cluster_tls(role, id)), false, role).expect("test transport")
}

/// The fixture's own client transport: a gateway certificate `harness`
/// (may read and write metadata and call the datanodes' gateway RPCs).
pub fn harness_transport() -> Transport {
    static T: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();
    T.get_or_init(|| transport_as(AuthRole::Gateway, "harness"))
        .clone()
}

/// The transport of an operator's `sluice admin`: an admin certificate
/// `harness` (may call the `sluice.admin.Admin` service, nothing else that
/// writes).
pub fn admin_transport() -> Transport {
    static T: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();
    T.get_or_init(|| transport_as(AuthRole::Admin, "harness"))
        .clone()
}

async fn bind_any() -> Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind port-0 listener")
}

fn meta_config_base(
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
        cluster_tls: Some(cluster_tls(AuthRole::Meta, &id.to_string())),
        sled_cache_bytes: ByteSize(8 * 1024 * 1024),
        // Small, so the scenario's restarts go through snapshot install and
        // restore rather than only log replay.
        snapshot_logs_since_last: 20,
        max_in_snapshot_log_to_keep: 5,
        datanode_liveness: Duration::from_secs(3),
        // Released blobs are deleted 200 ms after their release (the
        // default 5 min would outlast every test's wait).
        delete_delay: Duration::from_millis(200),
        reclaim_interval: Duration::from_millis(100),
        epoch_sweep_interval: Duration::from_millis(200),
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
        cluster_tls: Some(cluster_tls(AuthRole::Datanode, &id.to_string())),
        heartbeat_interval: Duration::from_millis(300),
        shutdown_grace: Duration::from_secs(5),
        // Test dirs share the machine's disk: no free-space reserve.
        reserved_free_bytes: ByteSize(0),
        ..Default::default()
    }
}

fn gateway_config(listen: SocketAddr, meta_endpoints: Vec<String>) -> sluice_gateway::Config {
    sluice_gateway::Config {
        listen,
        region: REGION.to_string(),
        access_key: ACCESS_KEY.to_string(),
        secret_key: SECRET_KEY.into(),
        meta_endpoints,
        cluster_tls: Some(cluster_tls(AuthRole::Gateway, "gw")),
        data_shards: 4,
        parity_shards: 2,
        block_size: ByteSize::kib(256),
        datanode_refresh_interval: Duration::from_millis(300),
        shutdown_grace: Duration::from_secs(5),
        s3_plaintext: true,
        ..Default::default()
    }
}

/// Shards a datanode reports through its `NodeStatus` RPC.
async fn node_status_shards(addr: SocketAddr) -> std::result::Result<u64, String> {
    let channel = harness_transport()
        .endpoint(&http(addr), AuthRole::Datanode)
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
    let channel = harness_transport()
        .endpoint(&http(addr), AuthRole::Meta)
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
        Self::start_setup_without_gateway(metas, datanodes, overrides.into()).await
    }

    /// [`TestCluster::start_with`] configured by `setup` (config functions
    /// for every role, gateway meta faults).
    pub async fn start_setup(metas: usize, datanodes: usize, setup: Setup) -> Result<TestCluster> {
        let mut cluster = Self::start_setup_without_gateway(metas, datanodes, setup).await?;
        cluster.gateway.start().await?;
        cluster.wait_gateway().await?;
        Ok(cluster)
    }

    /// [`TestCluster::start_without_gateway`] configured by `setup`.
    pub async fn start_setup_without_gateway(
        metas: usize,
        datanodes: usize,
        setup: Setup,
    ) -> Result<TestCluster> {
        sluice_test_support::init_tracing();
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
            let mut meta_config = meta_config_base(id, meta_addrs[i], dir, voters.clone());
            if let Some(f) = setup.meta {
                f(&mut meta_config);
            }
            let mut node = Process::new(format!("meta-{id}"), meta_config);
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
            if let Some(f) = setup.datanode {
                f(&mut config);
            }
            let mut node = Process::new(format!("datanode-{id}"), config);
            node.start_on(listener);
            dn_nodes.push(node);
        }

        let gw_listener = bind_any().await?;
        let mut gw_config = gateway_config(gw_listener.local_addr()?, meta_endpoints.clone());
        let s3_tls = if setup.https {
            let ca = TestCa::new("sluice test S3 CA")?;
            let files = S3TlsFiles {
                cert: root.path().join("s3.crt"),
                key: root.path().join("s3.key"),
                ca,
            };
            files.ca.issue(&files.cert, &files.key)?;
            gw_config.s3_plaintext = false;
            gw_config.s3_tls = Some(sluice_gateway::config::S3Tls {
                cert_file: files.cert.clone(),
                key_file: files.key.clone(),
            });
            Some(files)
        } else {
            None
        };
        if let Some(f) = setup.gateway {
            f(&mut gw_config);
        }
        let mut gateway = Process::new(
            "gateway".into(),
            GatewayRole {
                config: gw_config,
                stats: sluice_gateway::GatewayStats::new(),
                meta_faults: setup.gateway_meta_faults.clone(),
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
            )
            .with_transport(harness_transport()),
            s3_tls,
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

    /// The S3 endpoint: `https://` when the gateway serves TLS.
    pub fn s3_endpoint(&self) -> String {
        match &self.s3_tls {
            Some(_) => format!("https://{}", self.gateway.addr()),
            None => http(self.gateway.addr()),
        }
    }

    /// An S3 client for the gateway with the given credentials (trusting
    /// the test CA when the gateway serves HTTPS).
    pub fn s3_with(&self, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
        self.s3_trusting(
            access_key,
            secret_key,
            self.s3_tls.as_ref().map(|t| t.ca.cert_pem.as_str()),
        )
    }

    /// An S3 client with the given credentials trusting only `ca_pem` (the
    /// SDK's default roots when `None`).
    pub fn s3_trusting(
        &self,
        access_key: &str,
        secret_key: &str,
        ca_pem: Option<&str>,
    ) -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .http_client(s3_http_client(ca_pem))
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(self.s3_endpoint())
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

    /// Starts a new meta node with the next id (`metas.len() + 1`) on a
    /// port-0 listener and its own directory, with `join = true`: it does
    /// not initialize a cluster and waits to be added as a member (see
    /// `meta_membership`). `configure` runs after the fixture's settings.
    /// Returns its index in `metas`.
    pub async fn add_meta_node(
        &mut self,
        configure: Option<fn(&mut sluice_meta::Config)>,
    ) -> Result<usize> {
        let id = self.metas.len() as u64 + 1;
        let listener = bind_any().await?;
        let dir = self._root.path().join(format!("meta-{id}"));
        std::fs::create_dir_all(&dir)?;
        let mut config = meta_config_base(id, listener.local_addr()?, dir, BTreeMap::new());
        config.join = true;
        if let Some(f) = configure {
            f(&mut config);
        }
        let mut node = Process::new(format!("meta-{id}"), config);
        node.start_on(listener);
        self.metas.push(node);
        Ok(self.metas.len() - 1)
    }
}

// ---------------------------------------------------------------------------
// Durability helpers: placements, heal, shard files on disk, read-back.

/// Most blobs per `ListPlacements` page (the server's own maximum).
const PLACEMENTS_PAGE: u32 = 1000;
/// Most shards per `HasShards` call (the datanode's maximum).
const HAS_SHARDS_BATCH: usize = 1000;
/// Directory below a datanode's `data_dir` holding its shard files.
const SHARDS_DIR: &str = "shards";

/// A connected gRPC client for the datanode at `addr`.
async fn datanode_client(
    addr: SocketAddr,
) -> std::result::Result<DatanodeClient<tonic::transport::Channel>, String> {
    let channel = harness_transport()
        .endpoint(&http(addr), AuthRole::Datanode)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    Ok(DatanodeClient::new(channel))
}

/// Which of `shards` (any number) the datanode at `addr` holds, via its
/// `HasShards` RPC, in request order.
pub async fn has_shards(
    addr: SocketAddr,
    shards: &[(String, u32)],
) -> std::result::Result<Vec<bool>, String> {
    let mut client = datanode_client(addr).await?;
    let mut present = Vec::with_capacity(shards.len());
    for batch in shards.chunks(HAS_SHARDS_BATCH) {
        let req = HasShardsRequest {
            shards: batch
                .iter()
                .map(|(blob_id, shard_index)| ShardId {
                    blob_id: blob_id.clone(),
                    shard_index: *shard_index,
                })
                .collect(),
        };
        let resp = client
            .has_shards(req)
            .await
            .map_err(|e| format!("HasShards on {addr}: {e}"))?
            .into_inner();
        if resp.present.len() != batch.len() {
            return Err(format!(
                "HasShards on {addr}: {} answers for {} shards",
                resp.present.len(),
                batch.len()
            ));
        }
        present.extend(resp.present);
    }
    Ok(present)
}

/// Whether `name` is a committed shard file name, `<blob_id>.<shard index>`
/// (not a temp file, not a quarantined or otherwise renamed copy).
fn is_shard_file_name(name: &str) -> bool {
    !name.contains(".tmp-")
        && name.rsplit_once('.').is_some_and(|(blob, idx)| {
            !blob.is_empty() && !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit())
        })
}

/// Shard files (see [`is_shard_file_name`]) below `dir`, recursively; an
/// absent `dir` has none.
fn shard_files_below(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            // A quarantined (corrupt) copy is not a stored shard.
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.contains("quarantine") && !name.contains("trash") {
                shard_files_below(&entry.path(), out)?;
            }
        } else if ty.is_file() && entry.file_name().to_str().is_some_and(is_shard_file_name) {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Flips every bit of the byte at `offset` of the file at `path` (bit rot);
/// returns the byte it held.
pub fn flip_byte(path: &Path, offset: u64) -> Result<u8> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("open {} to corrupt it", path.display()))?;
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(&mut b)
        .with_context(|| format!("read byte {offset} of {}", path.display()))?;
    let old = b[0];
    b[0] = !old;
    f.seek(SeekFrom::Start(offset))?;
    f.write_all(&b)?;
    f.sync_all()?;
    Ok(old)
}

/// Reads every `(key, data)` of `bucket` back and compares SHA-256 and
/// bytes; fails naming every key that differs or cannot be read.
pub async fn assert_objects(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    objects: &BTreeMap<String, bytes::Bytes>,
) -> Result<()> {
    use futures::StreamExt;
    let failures: Vec<String> = futures::stream::iter(objects.iter())
        .map(|(key, want)| async move {
            match crate::get_all(s3, bucket, key).await {
                Err(e) => Some(format!("{key}: {e:#}")),
                Ok(got) if crate::sha256_hex(&got) != crate::sha256_hex(want) => Some(format!(
                    "{key}: {} bytes sha256 {}, want {} bytes sha256 {}",
                    got.len(),
                    crate::sha256_hex(&got),
                    want.len(),
                    crate::sha256_hex(want)
                )),
                Ok(_) => None,
            }
        })
        .buffer_unordered(8)
        .filter_map(|f| async move { f })
        .collect()
        .await;
    if !failures.is_empty() {
        bail!(
            "{} of {} objects in {bucket} did not read back byte-identical: {failures:?}",
            failures.len(),
            objects.len()
        );
    }
    Ok(())
}

impl TestCluster {
    /// The test's own `MetaClient` (no faults).
    pub fn meta(&self) -> &MetaClient {
        &self.meta
    }

    /// A leader-following client with the admin certificate, for the
    /// `sluice.admin.Admin` service (what `sluice admin` uses).
    pub fn admin(&self) -> MetaClient {
        self.meta.with_transport(admin_transport())
    }

    /// Every committed blob (or only the degraded ones) via `ListPlacements`.
    pub async fn placements(
        &self,
        degraded_only: bool,
    ) -> std::result::Result<Vec<PlacedBlob>, String> {
        let mut all = Vec::new();
        let mut after = String::new();
        loop {
            let page = self
                .meta
                .list_placements(ListPlacementsRequest {
                    after_blob_id: after.clone(),
                    limit: PLACEMENTS_PAGE,
                    degraded_only,
                })
                .await
                .map_err(|e| format!("ListPlacements(degraded_only={degraded_only}): {e}"))?;
            let last = page
                .blobs
                .last()
                .and_then(|b| b.placement.as_ref())
                .map(|p| p.blob_id.clone());
            all.extend(page.blobs);
            match last {
                Some(id) if page.is_truncated => after = id,
                _ => return Ok(all),
            }
        }
    }

    /// Ids of the datanodes meta reports live.
    pub async fn live_datanodes(&self) -> std::result::Result<Vec<u64>, String> {
        let nodes = self
            .meta
            .list_datanodes()
            .await
            .map_err(|e| format!("ListDatanodes: {e}"))?;
        Ok(nodes.iter().filter(|d| d.live).map(|d| d.id).collect())
    }

    /// Waits until no placement is degraded (`ListPlacements degraded_only`
    /// is empty), every placement has `k + m` nodes, all of them live, and
    /// every datanode holds (`HasShards`) every shard placed on it.
    /// Returns the committed blobs.
    pub async fn wait_healed(&self, what: &str, timeout: Duration) -> Result<Vec<PlacedBlob>> {
        wait_until(&format!("heal: {what}"), timeout, || async move {
            self.check_alive().map_err(|e| e.to_string())?;
            let degraded = self.placements(true).await?;
            if let Some(first) = degraded.first() {
                return Err(format!(
                    "{} degraded blobs, first: {:?}",
                    degraded.len(),
                    first.placement
                ));
            }
            let live = self.live_datanodes().await?;
            let all = self.placements(false).await?;
            // node id -> shards placed on it
            let mut placed: BTreeMap<u64, Vec<(String, u32)>> = BTreeMap::new();
            for b in &all {
                let p = b
                    .placement
                    .as_ref()
                    .ok_or_else(|| format!("placed blob without a placement: {b:?}"))?;
                if !p.missing.is_empty() {
                    return Err(format!(
                        "not listed as degraded but has missing shards: {p:?}"
                    ));
                }
                if p.nodes.len() != (p.data_shards + p.parity_shards) as usize {
                    return Err(format!("placement with {} nodes: {p:?}", p.nodes.len()));
                }
                if let Some(n) = p.nodes.iter().find(|n| !live.contains(n)) {
                    return Err(format!(
                        "blob {} has a shard on datanode {n}, not live (live: {live:?})",
                        p.blob_id
                    ));
                }
                for (i, n) in p.nodes.iter().enumerate() {
                    placed
                        .entry(*n)
                        .or_default()
                        .push((p.blob_id.clone(), i as u32));
                }
            }
            for (node, shards) in &placed {
                let dn = self
                    .datanodes
                    .get(*node as usize - 1)
                    .ok_or_else(|| format!("placement names unknown datanode {node}"))?;
                let present = has_shards(dn.addr(), shards).await?;
                let absent: Vec<&(String, u32)> = shards
                    .iter()
                    .zip(&present)
                    .filter(|(_, p)| !**p)
                    .map(|(s, _)| s)
                    .collect();
                if !absent.is_empty() {
                    return Err(format!(
                        "datanode {node} lacks {} of its {} shards, e.g. {:?}",
                        absent.len(),
                        shards.len(),
                        &absent[..absent.len().min(3)]
                    ));
                }
            }
            Ok(all)
        })
        .await
    }

    /// Starts one more datanode (id `datanodes.len() + 1`) on a fresh
    /// directory, configured like the others and then by `f`; returns its
    /// id once meta reports it live.
    pub async fn add_datanode(
        &mut self,
        f: Option<fn(&mut sluice_datanode::Config)>,
    ) -> Result<u64> {
        let id = self.datanodes.len() as u64 + 1;
        let listener = bind_any().await?;
        let dir = self._root.path().join(format!("datanode-{id}"));
        std::fs::create_dir_all(&dir)?;
        let meta_endpoints: Vec<String> = self.metas.iter().map(|m| http(m.addr())).collect();
        let mut config = datanode_config(id, listener.local_addr()?, dir, meta_endpoints);
        if let Some(f) = f {
            f(&mut config);
        }
        let mut node = Process::new(format!("datanode-{id}"), config);
        node.start_on(listener);
        self.datanodes.push(node);
        self.wait_datanodes(&[id], &[]).await?;
        Ok(id)
    }

    /// Removes everything in stopped datanode `index`'s data dir (a wiped or
    /// replaced disk: the next start formats it with a new disk id).
    pub fn wipe_datanode_dir(&self, index: usize) -> Result<()> {
        let d = &self.datanodes[index];
        ensure!(!d.is_running(), "wipe {}: it is still running", d.name);
        let dir = &d.config.data_dir;
        std::fs::remove_dir_all(dir).with_context(|| format!("wipe {}", dir.display()))?;
        std::fs::create_dir_all(dir).with_context(|| format!("recreate {}", dir.display()))?;
        Ok(())
    }

    /// Committed shard files of datanode `index` on disk.
    pub fn shard_files(&self, index: usize) -> std::result::Result<Vec<PathBuf>, String> {
        let d = &self.datanodes[index];
        let mut out = Vec::new();
        shard_files_below(&d.config.data_dir.join(SHARDS_DIR), &mut out)
            .map_err(|e| format!("{}: {e}", d.name))?;
        Ok(out)
    }

    /// Committed shard files of every datanode.
    pub fn shard_file_count(&self) -> std::result::Result<usize, String> {
        let mut n = 0;
        for i in 0..self.datanodes.len() {
            n += self.shard_files(i)?.len();
        }
        Ok(n)
    }

    /// The file of shard `shard_index` of `blob_id` on datanode `index`.
    pub fn shard_file(
        &self,
        index: usize,
        blob_id: &str,
        shard_index: u32,
    ) -> std::result::Result<Option<PathBuf>, String> {
        let name = format!("{blob_id}.{shard_index}");
        Ok(self
            .shard_files(index)?
            .into_iter()
            .find(|p| p.file_name().and_then(|n| n.to_str()) == Some(name.as_str())))
    }
}
