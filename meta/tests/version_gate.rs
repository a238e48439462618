//! The cluster version gate on three real meta voters (port-0 listeners,
//! sled dirs, gRPC): an upgrade simulated with
//! `replicated_format_override` (nodes 1 and 2 run a "format 2" binary,
//! node 3 the previous one) and a command kind gated at format 2
//! (`testing_command_formats`).
//!
//! The leader refuses the gated command and the finalize (naming node 3)
//! until node 3 is upgraded; then finalize raises the cluster version on
//! every voter and the command is accepted. Node 3 rolled back after the
//! finalize stops applying at the first entry it cannot apply, and stays
//! stopped, instead of skipping it.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_meta::Config;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::admin::{self as apb, admin_client::AdminClient};
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft::{self as rpb, raft_client::RaftClient};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);

async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    sluice_test_support::wait_for_some(what, WAIT, check).await
}

type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), sluice_meta::Error>>,
);

struct Node {
    id: u64,
    addr: SocketAddr,
    dir: PathBuf,
    voters: BTreeMap<u64, String>,
    /// The replicated format this node's "binary" understands.
    format: u32,
    /// `auto_finalize`, checked every 100 ms; without it the version
    /// task first runs after an hour (the test finalizes).
    auto: bool,
    running: Option<Running>,
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

impl Node {
    fn config(&self) -> Config {
        Config {
            node_id: self.id,
            listen: self.addr,
            advertise_addr: url(self.addr),
            data_dir: self.dir.clone(),
            voters: self.voters.clone(),
            sled_cache_bytes: ByteSize(4 << 20),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            epoch_lease: Duration::from_secs(600),
            session_expiry: Duration::from_secs(1800),
            insecure_cluster: true,
            auto_finalize: self.auto,
            version_check_interval: if self.auto {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(3600)
            },
            replicated_format_override: Some(self.format),
            testing_command_formats: vec![("CreateBucket".into(), 2)],
            ..Config::default()
        }
    }

    fn start(&mut self, listener: TcpListener) {
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(sluice_meta::run(self.config(), listener, async {
            let _ = rx.await;
        }));
        self.running = Some((tx, handle));
    }

    /// Stops the node and starts it again as a binary of `format`.
    async fn restart_as(&mut self, format: u32) -> Result<()> {
        let (tx, handle) = self.running.take().context("node not running")?;
        let _ = tx.send(());
        tokio::time::timeout(WAIT, handle)
            .await
            .context("node did not stop")???;
        self.format = format;
        let listener = TcpListener::bind(self.addr)
            .await
            .context("rebind the same port")?;
        self.start(listener);
        Ok(())
    }

    async fn stop(&mut self) -> Result<()> {
        let (tx, handle) = self.running.take().context("node not running")?;
        let _ = tx.send(());
        tokio::time::timeout(WAIT, handle)
            .await
            .context("node did not stop")??
            .ok();
        Ok(())
    }

    /// This node's own NodeVersion answer.
    async fn version(&self) -> Option<rpb::NodeVersionResponse> {
        let mut c = RaftClient::connect(url(self.addr)).await.ok()?;
        c.node_version(rpb::NodeVersionRequest {})
            .await
            .ok()
            .map(tonic::Response::into_inner)
    }

    /// This node's applied index (ClusterStatus is answered by any node
    /// from its own Raft metrics).
    async fn applied(&self) -> Option<u64> {
        let mut raw = sluice_proto::meta::meta_client::MetaClient::connect(url(self.addr))
            .await
            .ok()?;
        raw.cluster_status(sluice_proto::meta::ClusterStatusRequest {})
            .await
            .ok()
            .map(|r| r.into_inner().last_applied_index)
    }
}

async fn show(client: &MetaClient) -> Result<apb::VersionResponse, MetaError> {
    client
        .call_on("ShowVersion", |ch| async move {
            AdminClient::new(ch)
                .show_version(apb::ShowVersionRequest {})
                .await
        })
        .await
}

async fn finalize(client: &MetaClient) -> Result<apb::VersionResponse, MetaError> {
    client
        .call_on("FinalizeVersion", |ch| async move {
            AdminClient::new(ch)
                .finalize_version(apb::FinalizeVersionRequest {})
                .await
        })
        .await
}

fn formats(v: &apb::VersionResponse) -> Vec<(u64, bool, u32, u32)> {
    v.nodes
        .iter()
        .map(|n| (n.id, n.reachable, n.replicated_format, n.cluster_version))
        .collect()
}

/// Nodes 1 and 2 at format 2 lead; node 3 (format 1) joins once they
/// have: a format-1 leader would finalize to its own format.
async fn cluster(dir: &Path, auto: bool) -> Result<(Vec<Node>, MetaClient)> {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let voters: BTreeMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, url(*a)))
        .collect();
    let mut nodes: Vec<Node> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| Node {
            id: i as u64 + 1,
            addr: *a,
            dir: dir.join(format!("meta{}", i + 1)),
            voters: voters.clone(),
            format: if i == 2 { 1 } else { 2 },
            auto,
            running: None,
        })
        .collect();
    let mut listeners = listeners.into_iter();
    for node in nodes.iter_mut().take(2) {
        node.start(listeners.next().context("listener")?);
    }
    let client = MetaClient::new(nodes.iter().map(|n| url(n.addr)).collect());
    wait_for("a leader among nodes 1 and 2", || async {
        let s = client.cluster_status().await.ok()?;
        s.leader_id.filter(|l| *l <= 2)
    })
    .await?;
    nodes[2].start(listeners.next().context("listener")?);
    Ok((nodes, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finalize_waits_for_every_voter_and_gates_new_commands() -> Result<()> {
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let (mut nodes, client) = cluster(tmp.path(), false).await?;

    // Every voter answers: nodes 1 and 2 understand format 2, node 3 only 1.
    let shown = wait_for("every voter's version", || async {
        let v = show(&client).await.ok()?;
        (v.nodes.len() == 3 && v.nodes.iter().all(|n| n.reachable)).then_some(v)
    })
    .await?;
    assert_eq!(shown.cluster_version, 1);
    assert_eq!(shown.leader_format, 2);
    assert_eq!(
        formats(&shown),
        vec![(1, true, 2, 1), (2, true, 2, 1), (3, true, 1, 1)]
    );
    assert!(shown.nodes.iter().all(|n| n.voter));
    assert!(
        shown
            .nodes
            .iter()
            .all(|n| n.binary_version == env!("CARGO_PKG_VERSION"))
    );

    // The gated command kind is refused before Raft, by the leader.
    match client.create_bucket("b", 1).await {
        Err(MetaError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::ClusterVersionGate);
            assert_eq!(
                message,
                "command CreateBucket needs cluster version 2; the cluster is at 1: finalize the upgrade first (sluice admin version finalize)"
            );
        }
        other => bail!("CreateBucket before finalize: {other:?}"),
    }
    // Other kinds are not gated.
    client.open_epoch("gw").await?;

    // Finalize is refused while node 3 runs the older binary.
    match finalize(&client).await {
        Err(MetaError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::ClusterVersionGate);
            let node3 = format!(
                "node 3 ({}) runs sluice {} (replicated format 1)",
                url(nodes[2].addr),
                env!("CARGO_PKG_VERSION")
            );
            assert!(message.contains(&node3), "{message}");
            assert!(message.starts_with("cannot finalize replicated format 2: "));
            assert!(!message.contains("node 1"), "{message}");
            assert!(!message.contains("node 2"), "{message}");
        }
        other => bail!("finalize with node 3 behind: {other:?}"),
    }
    assert_eq!(show(&client).await?.cluster_version, 1);

    // Node 3 is upgraded; finalize then raises the version everywhere.
    nodes[2].restart_as(2).await?;
    wait_for("node 3 reporting format 2", || async {
        let v = show(&client).await.ok()?;
        (formats(&v).get(2).map(|n| (n.1, n.2)) == Some((true, 2))).then_some(())
    })
    .await?;
    let done = finalize(&client).await?;
    assert!(done.finalized);
    assert_eq!(done.cluster_version, 2);
    let everywhere = wait_for("cluster version 2 on every voter", || async {
        let v = show(&client).await.ok()?;
        v.nodes
            .iter()
            .all(|n| n.reachable && n.cluster_version == 2)
            .then_some(v)
    })
    .await?;
    assert_eq!(everywhere.cluster_version, 2);
    for n in &nodes {
        assert_eq!(n.version().await.context("NodeVersion")?.cluster_version, 2);
    }
    // A second finalize changes nothing.
    let again = finalize(&client).await?;
    assert!(!again.finalized);
    assert_eq!(again.cluster_version, 2);
    assert!(client.create_bucket("b", 1).await?, "admitted at version 2");

    // Node 3 rolled back to the format-1 binary after the finalize (what
    // the upgrade docs forbid): it stops at the first entry it cannot
    // apply, and never skips it.
    nodes[2].restart_as(1).await?;
    let before = wait_for("node 3 back, caught up", || async {
        let v = nodes[2].version().await?;
        let applied = nodes[2].applied().await?;
        (v.replicated_format == 1 && applied > 0).then_some(applied)
    })
    .await?;
    assert!(client.create_bucket("c", 1).await?);
    let blocked = wait_for("node 3 to stop applying", || async {
        let v = nodes[2].version().await?;
        (v.apply_blocked_index > 0).then_some(v.apply_blocked_index)
    })
    .await?;
    assert!(
        blocked > before,
        "stopped at {blocked}, had applied {before}"
    );
    // The other two keep going; node 3 stays before the entry.
    assert!(client.create_bucket("d", 1).await?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v3 = nodes[2].version().await.context("NodeVersion of node 3")?;
    assert_eq!(v3.apply_blocked_index, blocked);
    assert_eq!(v3.cluster_version, 2);
    let applied3 = nodes[2].applied().await.context("node 3 status")?;
    assert!(
        applied3 < blocked,
        "node 3 applied {applied3}, blocked at {blocked}"
    );
    let leader_applied = client.cluster_status().await?.last_applied_index;
    assert!(leader_applied > blocked);
    let shown = show(&client).await?;
    let n3 = shown.nodes.iter().find(|n| n.id == 3).context("node 3")?;
    assert_eq!(n3.apply_blocked_index, blocked);

    for n in nodes.iter_mut() {
        n.stop().await?;
    }
    Ok(())
}

/// With `auto_finalize`, the leader records the version of the fresh
/// cluster (the least format of its members: 1, node 3 is older) and
/// raises it by itself once node 3 is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_finalizes_by_itself_once_every_voter_is_upgraded() -> Result<()> {
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let (mut nodes, client) = cluster(tmp.path(), true).await?;
    wait_for("every voter answering", || async {
        let v = show(&client).await.ok()?;
        (v.nodes.len() == 3 && v.nodes.iter().all(|n| n.reachable)).then_some(())
    })
    .await?;
    // Several passes of the version task: still 1, node 3 lags.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(show(&client).await?.cluster_version, 1);
    assert_eq!(
        client
            .create_bucket("b", 1)
            .await
            .err()
            .and_then(|e| e.code()),
        Some(ErrorCode::ClusterVersionGate)
    );

    nodes[2].restart_as(2).await?;
    wait_for("cluster version 2 on every voter", || async {
        let v = show(&client).await.ok()?;
        (v.cluster_version == 2
            && v.nodes
                .iter()
                .all(|n| n.reachable && n.cluster_version == 2))
        .then_some(())
    })
    .await?;
    assert!(client.create_bucket("b", 1).await?);
    for n in nodes.iter_mut() {
        n.stop().await?;
    }
    Ok(())
}
