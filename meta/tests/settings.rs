//! Apply is a function of (state, entry): three in-process meta voters
//! with *different* local configs (epoch lease, session bounds and sweeps,
//! snapshot schedule, sled cache) apply the same writes and report the same
//! state digest at the same applied index, and OpenEpoch answers the
//! replicated lease, not the config of whichever node leads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_meta::Config;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::admin::{self as apb, admin_client::AdminClient};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// Node `id`'s config: everything a node may set differently from its
/// peers differs.
fn config(id: u64, addr: SocketAddr, dir: &Path, voters: &BTreeMap<u64, String>) -> Config {
    let base = Config {
        node_id: id,
        listen: addr,
        advertise_addr: url(addr),
        data_dir: dir.join(format!("meta{id}")),
        voters: voters.clone(),
        heartbeat_interval: Duration::from_millis(100),
        election_timeout_min: Duration::from_millis(400),
        election_timeout_max: Duration::from_millis(800),
        insecure_cluster: true,
        ..Config::default()
    };
    match id {
        1 => Config {
            epoch_lease: Duration::from_secs(7),
            epoch_sweep_interval: Duration::from_millis(100),
            session_table_max_entries: 1_000,
            session_high_water: 0.5,
            session_sweep_interval: Duration::from_secs(1),
            session_expiry: Duration::from_secs(120),
            snapshot_logs_since_last: 10,
            max_in_snapshot_log_to_keep: 2,
            sled_cache_bytes: ByteSize(2 << 20),
            stale_upload_check_interval: Duration::from_millis(200),
            lifecycle_check_interval: Duration::from_millis(300),
            ..base
        },
        2 => Config {
            epoch_lease: Duration::from_secs(11),
            epoch_sweep_interval: Duration::from_millis(700),
            session_table_max_entries: 5_000,
            session_high_water: 0.9,
            session_sweep_interval: Duration::from_secs(3),
            session_expiry: Duration::from_secs(900),
            snapshot_logs_since_last: 35,
            sled_cache_bytes: ByteSize(8 << 20),
            ..base
        },
        _ => Config {
            epoch_lease: Duration::from_secs(13),
            epoch_sweep_interval: Duration::from_secs(2),
            session_table_max_entries: 100_000,
            session_sweep_interval: Duration::from_secs(7),
            session_min_age: Duration::from_secs(60),
            session_expiry: Duration::from_secs(3600),
            snapshot_logs_since_last: 5_000,
            sled_cache_bytes: ByteSize(4 << 20),
            ..base
        },
    }
}

type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), sluice_meta::Error>>,
);

fn start(config: Config, listener: TcpListener) -> Running {
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(sluice_meta::run(config, listener, async {
        let _ = rx.await;
    }));
    (tx, handle)
}

fn blob_id(epoch: u64, name: &str) -> String {
    format!("e{epoch}.{}", hex::encode(name))
}

fn object(key: &str, blob: String) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: 3,
        etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
        last_modified_ms: 1,
        parts: vec![pb::PartRecord {
            part_number: 1,
            size: 3,
            placement: Some(pb::Placement {
                blob_id: blob,
                size: 3,
                data_shards: 2,
                parity_shards: 1,
                block_size: 262_144,
                nodes: vec![1, 2, 3],
                missing: vec![],
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn settings_of(client: &MetaClient) -> Result<apb::ClusterSettingsResponse> {
    Ok(client
        .call_on("GetClusterSettings", |ch| async move {
            AdminClient::new(ch)
                .get_cluster_settings(apb::GetClusterSettingsRequest {})
                .await
        })
        .await?)
}

/// Waits until the cluster version is recorded at `version` (a fresh
/// cluster's leader records it once every member answers).
async fn wait_cluster_version(client: &MetaClient, version: u32) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let shown = client
            .call_on("ShowVersion", |ch| async move {
                AdminClient::new(ch)
                    .show_version(apb::ShowVersionRequest {})
                    .await
            })
            .await;
        if let Ok(v) = &shown
            && v.cluster_version == version
            && v.nodes.iter().all(|n| n.cluster_version == version)
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("cluster version not {version} within {WAIT:?}: {shown:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn set_lease(
    client: &MetaClient,
    ms: u64,
) -> Result<apb::ClusterSettingsResponse, MetaError> {
    let req = apb::SetClusterSettingsRequest {
        epoch_lease_ms: Some(ms),
        op_id: sluice_meta_client::new_op_id(),
    };
    client
        .call_on("SetClusterSettings", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).set_cluster_settings(req).await }
        })
        .await
}

/// StateDigest of each node, asked directly, concurrently.
async fn digests(nodes: &[MetaClient]) -> Result<Vec<apb::StateDigestResponse>> {
    let asks = nodes.iter().map(|c| {
        c.call_on("StateDigest", |ch| async move {
            AdminClient::new(ch)
                .state_digest(apb::StateDigestRequest {})
                .await
        })
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .map(|r| r.map_err(anyhow::Error::from))
        .collect()
}

/// Polls the digests until all nodes report one applied index of at
/// least `min_index`; fails at once if two nodes at one index differ.
async fn equal_digests(nodes: &[MetaClient], min_index: u64) -> Result<apb::StateDigestResponse> {
    let started = tokio::time::Instant::now();
    loop {
        let d = digests(nodes).await?;
        for a in &d {
            for b in &d {
                if a.applied_index == b.applied_index && a.digest_hex != b.digest_hex {
                    bail!("nodes {} and {} diverged: {d:?}", a.node_id, b.node_id);
                }
            }
        }
        if d.iter().all(|x| x.applied_index == d[0].applied_index)
            && d[0].applied_index >= min_index
        {
            return Ok(d[0].clone());
        }
        if started.elapsed() > WAIT {
            bail!("the nodes never reported one applied index: {d:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn voters_with_different_configs_reach_the_same_state() -> Result<()> {
    sluice_test_support::init_tracing();
    let tmp = tempfile::tempdir()?;
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let voters: BTreeMap<u64, String> = (1..=3).map(|i| (i, url(addrs[i as usize - 1]))).collect();
    let mut running = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        running.push(start(config(id, addrs[i], tmp.path(), &voters), listener));
    }
    let client = MetaClient::new(voters.values().cloned().collect());
    let direct: Vec<MetaClient> = voters
        .values()
        .map(|a| MetaClient::with_timeouts(vec![a.clone()], WAIT, Duration::from_secs(5)))
        .collect();

    // A fresh cluster records its version (every voter understands 2),
    // then the first epoch gets the initial lease some leader seeded from
    // its config, and the settings say which: one value for every node.
    wait_cluster_version(&client, 2).await?;
    let e1 = client.open_epoch("gw-1").await?;
    let seeded = settings_of(&client).await?;
    assert!(!seeded.defaults);
    assert_eq!(e1.lease_ms, seeded.epoch_lease_ms);
    assert!(
        [7_000, 11_000, 13_000].contains(&e1.lease_ms),
        "{}",
        e1.lease_ms
    );

    assert!(client.create_bucket("b", 10).await?);
    for i in 0..20 {
        client
            .put_object(object(
                &format!("k{i:02}"),
                blob_id(e1.epoch, &format!("a{i}")),
            ))
            .await?;
    }
    client.delete_object("b", "k03").await?;

    // An out-of-range lease is refused and changes nothing.
    match set_lease(&client, 0).await {
        Err(e) if e.code() == Some(ErrorCode::InvalidArgument) => {}
        other => bail!("expected INVALID_ARGUMENT for a 0 ms lease, got {other:?}"),
    }
    // A lease no node is configured with; every node grants it from now on.
    let set = set_lease(&client, 4_321).await?;
    assert_eq!((set.epoch_lease_ms, set.defaults), (4_321, false));
    let e2 = client.open_epoch("gw-2").await?;
    assert_eq!(e2.lease_ms, 4_321);
    for i in 0..20 {
        client
            .put_object(object(
                &format!("k{i:02}"),
                blob_id(e2.epoch, &format!("b{i}")),
            ))
            .await?;
    }
    let leader_applied = client.cluster_status().await?.last_applied_index;

    let agreed = equal_digests(&direct, leader_applied).await?;
    assert!(agreed.records > 40, "{agreed:?}");
    let first = agreed.digest_hex.clone();

    // Asked through any node (a follower's NOT_LEADER hint leads the
    // client to the leader), the settings are the replicated ones.
    for c in &direct {
        assert_eq!(settings_of(c).await?.epoch_lease_ms, 4_321);
    }

    // One more write changes the digest, the same way on every node.
    client
        .put_object(object("k99", blob_id(e2.epoch, "c99")))
        .await?;
    let after = equal_digests(&direct, agreed.applied_index + 1).await?;
    assert_ne!(after.digest_hex, first);

    for (tx, handle) in running {
        let _ = tx.send(());
        tokio::time::timeout(WAIT, handle)
            .await
            .context("node did not stop")???;
    }
    Ok(())
}
