//! The gateway's data path ([`sluice_gateway::blob::BlobStore`]) on a
//! [`MemCluster`], with faults injected on the servers' calls: the write
//! quorum's decisions when datanodes fail PutShard, and the exactly-once
//! PutObject when meta's answer is lost.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use futures::StreamExt;
use sluice_gateway::blob::{BlobError, BlobStore};
use sluice_meta_client::MetaError;
use sluice_net::faults::{Action, Rule};
use sluice_proto::meta::{self as pb, ErrorCode, Placement};
use sluice_test_support::payload;
use sluice_tests::mem_cluster::{K, MemCluster};

fn body(
    data: &[u8],
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + use<> {
    let chunks: Vec<_> = data
        .chunks(10_000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

async fn read_all(store: &BlobStore, p: &Placement, size: u64) -> Result<Vec<u8>> {
    let mut stream = store.read(p, 0..size);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_quorum_decides_when_datanodes_fail_put_shard() -> Result<()> {
    let c = MemCluster::start().await?;
    let faults = c.faults();
    let data = payload(300_000, 7);
    let size = data.len() as u64;

    // Healthy: all six shards durable.
    let p = c.blobs.write("b/healthy", body(&data), Some(size)).await?;
    ensure!(p.missing.is_empty(), "missing shards: {:?}", p.missing);
    ensure!(
        read_all(&c.blobs, &p, size).await? == data,
        "healthy read differs"
    );

    // One datanode fails every PutShard: five of six is the quorum (k+1),
    // acknowledged with the failed shard listed missing, and readable.
    let one =
        faults.add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on("dn-6:7100"));
    let p = c.blobs.write("b/one-down", body(&data), Some(size)).await?;
    ensure!(one.fired() >= 1, "dn-6 saw no PutShard");
    let dn6 = p
        .nodes
        .iter()
        .position(|&n| n == 6)
        .context("dn-6 holds no shard of the placement")? as u32;
    ensure!(
        p.missing == vec![dn6],
        "missing {:?}, expected dn-6's shard {dn6}",
        p.missing
    );
    ensure!(
        read_all(&c.blobs, &p, size).await? == data,
        "read with a missing shard differs"
    );

    // A second datanode fails too: four durable shards are below the
    // quorum; the write is refused, not acknowledged.
    let two =
        faults.add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on("dn-5:7100"));
    match c.blobs.write("b/two-down", body(&data), Some(size)).await {
        Err(BlobError::QuorumNotReached { durable, needed }) => {
            ensure!(
                (durable, needed) == (K, K + 1),
                "durable {durable} of {needed}"
            );
        }
        other => anyhow::bail!("expected QuorumNotReached, got {other:?}"),
    }
    ensure!(two.fired() >= 1, "dn-5 saw no PutShard");

    // Faults lifted: writes are whole again.
    faults.clear();
    let p = c.blobs.write("b/healed", body(&data), Some(size)).await?;
    ensure!(
        p.missing.is_empty(),
        "missing shards after clearing: {:?}",
        p.missing
    );
    c.shut_down().await
}

fn record(
    bucket: &str,
    key: &str,
    placement: Placement,
    size: u64,
    etag: &str,
) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: bucket.into(),
        key: key.into(),
        size,
        etag: etag.into(),
        parts: vec![pb::PartRecord {
            part_number: 1,
            size,
            placement: Some(placement),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_put_object_answer_is_retried_to_its_first_outcome() -> Result<()> {
    let c = MemCluster::start().await?;
    let faults = c.faults();
    ensure!(
        c.meta_client.create_bucket("b", 0).await?,
        "bucket not created"
    );
    let data = payload(100_000, 11);
    let size = data.len() as u64;
    let p = c.blobs.write("b/k", body(&data), Some(size)).await?;
    let if_absent = pb::WriteCondition {
        if_none_match_any: true,
        ..Default::default()
    };

    // Meta commits the conditional put, and its answer is lost on the way
    // back: the client's retry carries the same operation id and gets the
    // first outcome (written), not a PreconditionFailed against its own
    // write.
    let dropped = faults.add(Rule::new("PutObject", Action::Drop).times(1));
    c.meta_client
        .put_object_if(
            record("b", "k", p.clone(), size, "e1"),
            Some(if_absent.clone()),
        )
        .await
        .context("the retried put")?;
    ensure!(
        (dropped.seen(), dropped.fired()) == (2, 1),
        "PutObject calls seen {}, answers dropped {}",
        dropped.seen(),
        dropped.fired()
    );
    let got = c.meta_client.get_object("b", "k").await?;
    ensure!(got.etag == "e1", "etag {}", got.etag);
    let placement = got.parts[0].placement.clone().context("no placement")?;
    ensure!(
        read_all(&c.blobs, &placement, size).await? == data,
        "object differs"
    );

    // A new writer with the same condition is refused: the key exists.
    let q = c.blobs.write("b/k", body(&data), Some(size)).await?;
    match c
        .meta_client
        .put_object_if(record("b", "k", q, size, "e2"), Some(if_absent))
        .await
    {
        Err(MetaError::Refused {
            code: ErrorCode::PreconditionFailed,
            ..
        }) => {}
        other => anyhow::bail!("expected PreconditionFailed, got {other:?}"),
    }
    ensure!(
        c.meta_client.get_object("b", "k").await?.etag == "e1",
        "the refused write landed"
    );

    // A failed call is retried too (the handler never ran), and a delayed
    // one waits.
    let failed =
        faults.add(Rule::new("GetObject", Action::Fail(tonic::Code::Unavailable)).times(2));
    ensure!(c.meta_client.get_object("b", "k").await?.etag == "e1");
    ensure!(failed.fired() == 2, "failures injected: {}", failed.fired());
    faults.add(Rule::new(
        "GetObject",
        Action::Delay(Duration::from_millis(300)),
    ));
    let started = Instant::now();
    c.meta_client.get_object("b", "k").await?;
    ensure!(
        started.elapsed() >= Duration::from_millis(300),
        "a delayed call answered after {:?}",
        started.elapsed()
    );
    c.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_replace_shards_whose_get_shard_fails_until_fewer_than_k_remain() -> Result<()> {
    let c = MemCluster::start().await?;
    let faults = c.faults();
    let data = payload(300_000, 13);
    let size = data.len() as u64;
    let p = c.blobs.write("b/read", body(&data), Some(size)).await?;
    ensure!(p.missing.is_empty(), "missing shards: {:?}", p.missing);

    // The datanodes of data shards 0 and 1 fail GetShard: both parity
    // shards stand in (reconstruction), the bytes are the same.
    for shard in [0, 1] {
        let addr = sluice_tests::mem_cluster::datanode_addr(p.nodes[shard]);
        faults.add(Rule::new("GetShard", Action::Fail(tonic::Code::Unavailable)).on(&addr));
    }
    ensure!(
        read_all(&c.blobs, &p, size).await? == data,
        "read with two shards failing differs"
    );

    // A third shard's datanode fails too: k = 4 of 6 cannot be met.
    let addr = sluice_tests::mem_cluster::datanode_addr(p.nodes[2]);
    faults.add(Rule::new("GetShard", Action::Fail(tonic::Code::Unavailable)).on(&addr));
    match read_all(&c.blobs, &p, size).await {
        Err(e) => match e.downcast_ref::<BlobError>() {
            Some(BlobError::TooFewShards { reason, .. }) => ensure!(
                reason.contains("3 of 4 shards readable"),
                "reason: {reason}"
            ),
            _ => anyhow::bail!("expected TooFewShards, got {e:#}"),
        },
        Ok(_) => anyhow::bail!("a read with three shards failing succeeded"),
    }
    c.shut_down().await
}
