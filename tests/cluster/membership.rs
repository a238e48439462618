//! Datanode membership on an in-process cluster: eight datanodes labelled
//! on three hosts (h1 = 1, 2; h2 = 3, 4, 5; h3 = 6, 7, 8), 4+2.
//!
//! 1. Every placement keeps at most m = 2 shards on one host; with both
//!    datanodes of h1 stopped every object still reads back identical.
//! 2. Drain datanode 5 (admin `DrainDatanode`): the movers move all its
//!    shards; it is reported `drained`; with it stopped every object reads
//!    back identical; `RemoveDatanode` then succeeds. Removing a stopped,
//!    not drained datanode that holds shards is refused
//!    (FAILED_PRECONDITION), and so is removing a running one.
//! 3. A new datanode 9 on a new host takes new writes at once, and
//!    rebalance moves existing shards onto it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::primitives::ByteStream;
use sluice_meta_client::MetaError;
use sluice_proto::admin::admin_client::AdminClient;
use sluice_proto::admin::{
    DatanodeStatus, DrainDatanodeRequest, ListDatanodesRequest, RemoveDatanodeRequest,
};
use sluice_proto::meta::ErrorCode;
use sluice_util::byte_size::ByteSize;

use crate::fixtures::{
    Setup, TestCluster, assert_objects, durable_datanode, durable_gateway, durable_meta, wait_until,
};
use crate::{random_bytes, test_seed};

const BUCKET: &str = "members";
const WAIT: Duration = Duration::from_secs(60);

fn host_of(id: u64) -> &'static str {
    match id {
        1 | 2 => "h1",
        3..=5 => "h2",
        6..=8 => "h3",
        _ => "h4",
    }
}

fn labelled(c: &mut sluice_datanode::Config) {
    durable_datanode(c);
    c.host = Some(host_of(c.node_id).to_string());
}

fn gateway(c: &mut sluice_gateway::Config) {
    durable_gateway(c);
    // Stopped nodes stay "down", not lost, for this test's reads.
    c.node_down_after = Duration::from_secs(120);
    c.rebalance_bandwidth_bytes_per_sec = ByteSize(1024 * 1024 * 1024);
}

async fn admin_list(cluster: &TestCluster) -> Result<Vec<DatanodeStatus>, MetaError> {
    let r = cluster
        .admin()
        .call_on("ListDatanodes", |c| async move {
            AdminClient::new(c)
                .list_datanodes(ListDatanodesRequest {})
                .await
        })
        .await?;
    Ok(r.datanodes)
}

async fn admin_remove(cluster: &TestCluster, id: u64, force: bool) -> Result<u64, MetaError> {
    let r = cluster
        .admin()
        .call_on("RemoveDatanode", |c| async move {
            AdminClient::new(c)
                .remove_datanode(RemoveDatanodeRequest {
                    id,
                    force,
                    op_id: format!("remove-{id}-{force}"),
                })
                .await
        })
        .await?;
    Ok(r.marked_missing)
}

/// Shards per datanode over every committed placement, and a check that
/// no placement puts more than 2 shards on one host.
async fn shards_per_node(cluster: &TestCluster) -> Result<BTreeMap<u64, usize>> {
    let all = cluster
        .placements(false)
        .await
        .map_err(anyhow::Error::msg)?;
    let mut per_node = BTreeMap::new();
    for b in &all {
        let p = b.placement.as_ref().context("placement")?;
        let mut per_host: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &p.nodes {
            *per_node.entry(*n).or_default() += 1;
            *per_host.entry(host_of(*n)).or_default() += 1;
        }
        ensure!(
            per_host.values().all(|&c| c <= 2),
            "blob {} has more than m = 2 shards on one host: {:?}",
            p.blob_id,
            p.nodes
        );
        let distinct: BTreeSet<u64> = p.nodes.iter().copied().collect();
        ensure!(
            distinct.len() == p.nodes.len(),
            "repeated node: {:?}",
            p.nodes
        );
    }
    Ok(per_node)
}

async fn put_objects(
    cluster: &TestCluster,
    seed: u64,
    prefix: &str,
    count: usize,
    objects: &mut BTreeMap<String, bytes::Bytes>,
) -> Result<()> {
    let s3 = cluster.s3();
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        let data = random_bytes(seed + i as u64, 200 * 1024 + i * 37 * 1024);
        s3.put_object()
            .bucket(BUCKET)
            .key(&key)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .with_context(|| format!("put {key}"))?;
        objects.insert(key, data);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_remove_rebalance_across_hosts() -> Result<()> {
    let seed = test_seed("drain_remove_rebalance_across_hosts");
    let setup = Setup {
        meta: Some(durable_meta),
        datanode: Some(labelled),
        gateway: Some(gateway),
        gateway_meta_faults: None,
        https: false,
    };
    let mut cluster = TestCluster::start_setup(1, 8, setup).await?;
    let s3 = cluster.s3();
    s3.create_bucket().bucket(BUCKET).send().await?;

    // Labels reach the registry.
    let nodes = admin_list(&cluster).await?;
    for d in &nodes {
        let info = d.info.as_ref().context("info")?;
        ensure!(info.host == host_of(info.id), "labels of {info:?}");
    }

    // 1. Writes spread over hosts; losing host h1 loses no object.
    let mut objects = BTreeMap::new();
    put_objects(&cluster, seed, "a", 16, &mut objects).await?;
    shards_per_node(&cluster).await?;
    cluster.datanodes[0].stop().await?;
    cluster.datanodes[1].stop().await?;
    assert_objects(&s3, BUCKET, &objects)
        .await
        .context("reads with host h1 down")?;
    cluster.datanodes[0].start().await?;
    cluster.datanodes[1].start().await?;
    cluster.wait_datanodes_live().await?;

    // A running node is not removed; neither is a stopped one holding data.
    let err = admin_remove(&cluster, 6, false).await.expect_err("6 runs");
    ensure!(err.code() == Some(ErrorCode::DatanodeInUse), "{err}");
    cluster.datanodes[5].stop().await?;
    cluster.wait_datanodes(&[], &[6]).await?;
    let err = wait_until("datanode 6 no longer heard from", WAIT, || async {
        match admin_remove(&cluster, 6, false).await {
            Err(e) if e.to_string().contains("still holds") => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    ensure!(err.code() == Some(ErrorCode::DatanodeInUse), "{err}");
    cluster.datanodes[5].start().await?;
    cluster.wait_datanodes_live().await?;

    // 2. Drain datanode 5.
    let before = shards_per_node(&cluster).await?;
    ensure!(
        before.get(&5).copied().unwrap_or(0) > 0,
        "5 holds nothing: {before:?}"
    );
    cluster
        .admin()
        .call_on("DrainDatanode", |c| async move {
            AdminClient::new(c)
                .drain_datanode(DrainDatanodeRequest {
                    id: 5,
                    undrain: false,
                    op_id: "drain-5".into(),
                })
                .await
        })
        .await?;
    wait_until("datanode 5 drained", WAIT, || async {
        let list = admin_list(&cluster).await.map_err(|e| e.to_string())?;
        let five = list
            .iter()
            .find(|d| d.info.as_ref().is_some_and(|i| i.id == 5))
            .ok_or("5 not listed")?;
        if five.drained {
            Ok(())
        } else {
            Err(format!("{} shards left on 5", five.placed_shards))
        }
    })
    .await?;
    let after = shards_per_node(&cluster).await?;
    ensure!(!after.contains_key(&5), "{after:?}");
    // New writes skip the draining node, once the gateway has read the
    // datanode set since the drain: it reads it every
    // `datanode_refresh_interval`, and with meta answering in a few ms the
    // drain can finish within one interval.
    tokio::time::sleep(2 * cluster.gateway.config.config.datanode_refresh_interval).await;
    put_objects(&cluster, seed + 1000, "b", 6, &mut objects).await?;
    ensure!(!shards_per_node(&cluster).await?.contains_key(&5));
    cluster.datanodes[4].stop().await?;
    assert_objects(&s3, BUCKET, &objects)
        .await
        .context("reads with drained 5 stopped")?;
    let marked = wait_until("remove 5", WAIT, || async {
        admin_remove(&cluster, 5, false)
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    ensure!(marked == 0);
    let list = admin_list(&cluster).await?;
    ensure!(
        list.iter()
            .all(|d| d.info.as_ref().is_some_and(|i| i.id != 5)),
        "5 still listed"
    );

    // 3. A new datanode on a new host.
    let nine = cluster.add_datanode(Some(labelled)).await?;
    ensure!(nine == 9);
    wait_until("rebalance moves shards onto 9", WAIT, || async {
        let per = shards_per_node(&cluster).await.map_err(|e| e.to_string())?;
        match per.get(&9) {
            Some(&n) if n >= 4 => Ok(()),
            other => Err(format!("{other:?} shards on 9: {per:?}")),
        }
    })
    .await?;
    put_objects(&cluster, seed + 2000, "c", 8, &mut objects).await?;
    let per = shards_per_node(&cluster).await?;
    ensure!(per.get(&9).copied().unwrap_or(0) > 0, "{per:?}");
    assert_objects(&s3, BUCKET, &objects).await?;
    Ok(())
}
