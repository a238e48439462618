//! The gateway's data path against a real meta node and six real
//! datanodes (real Raft, real shard files in temp dirs) that talk over an
//! in-process [`MemNet`] instead of sockets, with faults injected on the
//! servers' calls ([`sluice_auth::faults`]): the write quorum's decisions
//! when datanodes fail PutShard, and the exactly-once PutObject when
//! meta's answer is lost.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use futures::StreamExt;
use sluice_auth::Transport;
use sluice_auth::faults::{Action, Rule};
use sluice_auth::net::MemNet;
use sluice_gateway::blob::{BlobError, BlobStore, BlobStoreConfig};
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{self as pb, ErrorCode, Placement};
use sluice_test_support::{RoleTask, payload};
use tempfile::TempDir;

const K: usize = 4;
const M: usize = 2;
const BLOCK: usize = 4096;
const META: &str = "http://meta-1:7001";

struct Cluster {
    net: MemNet,
    meta: RoleTask<sluice_meta::Error>,
    datanodes: Vec<RoleTask<sluice_datanode::Error>>,
    _dirs: Vec<TempDir>,
    client: MetaClient,
    store: BlobStore,
}

fn unused_socket() -> std::net::SocketAddr {
    // `listen` is not bound on a memory net; configs still carry one.
    "127.0.0.1:0".parse().expect("socket address")
}

impl Cluster {
    async fn start() -> Result<Cluster> {
        sluice_test_support::init_tracing();
        let net = MemNet::new();
        let mut dirs = Vec::new();

        let dir = tempfile::tempdir()?;
        let config = sluice_meta::Config {
            node_id: 1,
            listen: unused_socket(),
            advertise_addr: META.into(),
            data_dir: dir.path().to_path_buf(),
            sled_cache_bytes: 4 << 20,
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            insecure_cluster: true,
            ..Default::default()
        };
        dirs.push(dir);
        let listener = net.listen(META)?;
        let meta = RoleTask::spawn(|stop| sluice_meta::run(config, listener, stop));

        let mut datanodes = Vec::new();
        for id in 1..=(K + M) as u64 {
            let dir = tempfile::tempdir()?;
            let addr = format!("http://dn-{id}:7100");
            let config = sluice_datanode::Config {
                node_id: id,
                listen: unused_socket(),
                advertise_addr: addr.clone(),
                data_dir: dir.path().to_path_buf(),
                meta_endpoints: vec![META.into()],
                heartbeat_interval: Duration::from_millis(200),
                shutdown_grace: Duration::from_secs(1),
                insecure_cluster: true,
                ..Default::default()
            };
            dirs.push(dir);
            let listener = net.listen(&addr)?;
            datanodes.push(RoleTask::spawn(|stop| {
                sluice_datanode::run(config, listener, stop)
            }));
        }

        let client = MetaClient::with_timeouts(
            vec![META.into()],
            Duration::from_secs(20),
            Duration::from_secs(5),
        )
        .with_transport(Transport::Memory(net.clone()));
        sluice_test_support::wait_until(
            "six live datanodes registered with meta",
            Duration::from_secs(30),
            || async {
                let live = match client.list_datanodes().await {
                    Ok(d) => d.iter().filter(|d| d.live).count(),
                    Err(e) => return Err(e.to_string()),
                };
                if live == K + M {
                    Ok(())
                } else {
                    Err(format!("{live} live"))
                }
            },
        )
        .await?;
        let config = BlobStoreConfig {
            data_shards: K,
            parity_shards: M,
            block_size: BLOCK,
            write_quorum: K + 1,
            datanode_refresh_interval: Duration::from_secs(60),
            shard_channel_depth: 4,
            ..Default::default()
        };
        let store = BlobStore::start(config, client.clone()).await?;
        Ok(Cluster {
            net,
            meta,
            datanodes,
            _dirs: dirs,
            client,
            store,
        })
    }

    async fn shut_down(mut self) -> Result<()> {
        self.net.faults().clear();
        for d in &mut self.datanodes {
            d.stop().await?;
        }
        self.meta.stop().await
    }
}

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
    let c = Cluster::start().await?;
    let faults = c.net.faults();
    let data = payload(300_000, 7);
    let size = data.len() as u64;

    // Healthy: all six shards durable.
    let p = c.store.write("b/healthy", body(&data), Some(size)).await?;
    ensure!(p.missing.is_empty(), "missing shards: {:?}", p.missing);
    ensure!(
        read_all(&c.store, &p, size).await? == data,
        "healthy read differs"
    );

    // One datanode fails every PutShard: five of six is the quorum (k+1),
    // acknowledged with the failed shard listed missing, and readable.
    let one =
        faults.add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on("dn-6:7100"));
    let p = c.store.write("b/one-down", body(&data), Some(size)).await?;
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
        read_all(&c.store, &p, size).await? == data,
        "read with a missing shard differs"
    );

    // A second datanode fails too: four durable shards are below the
    // quorum; the write is refused, not acknowledged.
    let two =
        faults.add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on("dn-5:7100"));
    match c.store.write("b/two-down", body(&data), Some(size)).await {
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
    let p = c.store.write("b/healed", body(&data), Some(size)).await?;
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
    let c = Cluster::start().await?;
    let faults = c.net.faults();
    ensure!(c.client.create_bucket("b", 0).await?, "bucket not created");
    let data = payload(100_000, 11);
    let size = data.len() as u64;
    let p = c.store.write("b/k", body(&data), Some(size)).await?;
    let if_absent = pb::WriteCondition {
        if_none_match_any: true,
        ..Default::default()
    };

    // Meta commits the conditional put, and its answer is lost on the way
    // back: the client's retry carries the same operation id and gets the
    // first outcome (written), not a PreconditionFailed against its own
    // write.
    let dropped = faults.add(Rule::new("PutObject", Action::Drop).times(1));
    c.client
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
    let got = c.client.get_object("b", "k").await?;
    ensure!(got.etag == "e1", "etag {}", got.etag);
    let placement = got.parts[0].placement.clone().context("no placement")?;
    ensure!(
        read_all(&c.store, &placement, size).await? == data,
        "object differs"
    );

    // A new writer with the same condition is refused: the key exists.
    let q = c.store.write("b/k", body(&data), Some(size)).await?;
    match c
        .client
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
        c.client.get_object("b", "k").await?.etag == "e1",
        "the refused write landed"
    );

    // A failed call is retried too (the handler never ran), and a delayed
    // one waits.
    let failed =
        faults.add(Rule::new("GetObject", Action::Fail(tonic::Code::Unavailable)).times(2));
    ensure!(c.client.get_object("b", "k").await?.etag == "e1");
    ensure!(failed.fired() == 2, "failures injected: {}", failed.fired());
    faults.add(Rule::new(
        "GetObject",
        Action::Delay(Duration::from_millis(300)),
    ));
    let started = Instant::now();
    c.client.get_object("b", "k").await?;
    ensure!(
        started.elapsed() >= Duration::from_millis(300),
        "a delayed call answered after {:?}",
        started.elapsed()
    );
    c.shut_down().await
}
