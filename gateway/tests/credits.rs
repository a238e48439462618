//! The gateway's side of the byte-credit protocol against six real
//! datanodes (real gRPC, real shard files) on port-0 listeners with tiny
//! write budgets: writes much larger than every budget complete by
//! backpressure, the datanodes' ledgers never exceed their budgets (read
//! from their metrics through a recording `metrics` recorder), idle credit
//! is returned, a restarted datanode's credit stream reconnects, and
//! datanodes that grant nothing end a write with `DatanodesBusy`.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::Datanode;
use futures::StreamExt;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use sluice_gateway::blob::{BlobError, BlobStore, BlobStoreConfig};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::{CreditReport, CreditStreamRequest};
use sluice_util::byte_size::ByteSize;

const K: usize = 4;
const M: usize = 2;
const KIB: u64 = 1024;
/// Each datanode's write budget: four blocks.
const DN_BUDGET: u64 = 256 * KIB;
const BLOCK: usize = 64 * 1024;
const STRIPE: usize = K * BLOCK;
/// The gateway's write buffer budget: two stripes (a stripe costs (k+m) blocks).
const GW_BUDGET: u64 = 2 * ((K + M) * BLOCK) as u64;
const WAIT: Duration = Duration::from_secs(20);

// ---- a recorder that keeps every gauge's maximum and every counter ----

#[derive(Default)]
struct Track {
    /// (current, maximum)
    gauge: Mutex<(f64, f64)>,
    counter: Mutex<u64>,
}

impl Track {
    fn gauge<F: FnOnce(f64) -> f64>(&self, f: F) {
        let mut g = self.gauge.lock().unwrap();
        g.0 = f(g.0);
        g.1 = g.1.max(g.0);
    }
}

impl GaugeFn for Track {
    fn increment(&self, v: f64) {
        self.gauge(|c| c + v);
    }
    fn decrement(&self, v: f64) {
        self.gauge(|c| c - v);
    }
    fn set(&self, v: f64) {
        self.gauge(|_| v);
    }
}

impl CounterFn for Track {
    fn increment(&self, v: u64) {
        *self.counter.lock().unwrap() += v;
    }
    fn absolute(&self, v: u64) {
        let mut c = self.counter.lock().unwrap();
        *c = (*c).max(v);
    }
}

#[derive(Default)]
struct MaxRecorder {
    series: Mutex<BTreeMap<String, Arc<Track>>>,
}

fn series_name(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl MaxRecorder {
    fn track(&self, key: &Key) -> Arc<Track> {
        Arc::clone(
            self.series
                .lock()
                .unwrap()
                .entry(series_name(key))
                .or_default(),
        )
    }

    fn get(&self, series: &str) -> Option<Arc<Track>> {
        self.series.lock().unwrap().get(series).cloned()
    }

    /// (current, maximum) of a gauge; zeros if never set.
    fn gauge(&self, series: &str) -> (f64, f64) {
        self.get(series)
            .map(|t| *t.gauge.lock().unwrap())
            .unwrap_or((0.0, 0.0))
    }

    fn counter(&self, series: &str) -> u64 {
        self.get(series)
            .map(|t| *t.counter.lock().unwrap())
            .unwrap_or(0)
    }
}

impl Recorder for &'static MaxRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.track(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.track(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn recorder() -> &'static MaxRecorder {
    static RECORDER: OnceLock<&'static MaxRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let r: &'static MaxRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(r).expect("no other recorder in this test binary");
        r
    })
}

fn init_tracing() {
    sluice_test_support::init_tracing();
}

/// `name{node=<id>}`: how the recorder keys datanode `node`'s series.
fn series(node: &Datanode, name: &str) -> String {
    format!("{name}{{node={}}}", node.id)
}

/// Tiny write budgets and frequent fsyncs, so credit runs out often.
fn tiny_budget(c: &mut sluice_datanode::Config) {
    c.write_budget_bytes = Some(ByteSize(DN_BUDGET));
    c.credit_fsync_bytes = ByteSize(64 * KIB);
}

struct Cluster {
    nodes: Vec<Datanode>,
    store: BlobStore,
}

/// [`tiny_budget`], and a shutdown grace past the gateway's credit RPC
/// timeout (5 s): a draining connection outlives a credit stream attempt.
fn tiny_budget_long_grace(c: &mut sluice_datanode::Config) {
    tiny_budget(c);
    c.shutdown_grace = Duration::from_secs(7);
}

impl Cluster {
    /// Six datanodes with ids `first_id..first_id + 6` (distinct per test:
    /// the recorder is shared by the tests of this binary).
    async fn start(first_id: u64, stall: Duration) -> Result<Cluster> {
        Self::start_with(first_id, stall, tiny_budget).await
    }

    /// [`start`](Self::start) with the datanodes' config set by `tweak`.
    async fn start_with(
        first_id: u64,
        stall: Duration,
        tweak: fn(&mut sluice_datanode::Config),
    ) -> Result<Cluster> {
        init_tracing();
        recorder();
        let mut nodes = Vec::new();
        for id in first_id..first_id + 6 {
            nodes.push(Datanode::start(id, tweak).await?);
        }
        let config = BlobStoreConfig {
            data_shards: K,
            parity_shards: M,
            block_size: BLOCK,
            write_quorum: K + 1,
            datanode_refresh_interval: Duration::from_secs(60),
            shard_channel_depth: 2,
            buffer_budget: GW_BUDGET,
            read_budget: GW_BUDGET,
            stall_timeout: stall,
            credit_idle_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        let (store, _) = common::fixed_store(config, common::up(&nodes)).await?;
        Ok(Cluster { nodes, store })
    }

    async fn shut_down(mut self) -> Result<()> {
        self.store.shutdown().await;
        for n in &mut self.nodes {
            n.shut_down().await?;
        }
        Ok(())
    }

    /// Fails if any datanode's ledger ever went past its budget.
    fn check_ledgers(&self) -> Result<()> {
        let r = recorder();
        for n in &self.nodes {
            let violations = r.counter(&series(n, "sluice_datanode_credit_violations_total"));
            ensure!(
                violations == 0,
                "datanode {}: {violations} credit violations",
                n.id
            );
            let (_, in_flight) = r.gauge(&series(n, "sluice_datanode_credit_inflight_bytes"));
            ensure!(
                in_flight <= DN_BUDGET as f64,
                "datanode {}: {in_flight} bytes in flight > budget {DN_BUDGET}",
                n.id
            );
            let granted = format!(
                "sluice_datanode_credit_granted_bytes{{gateway={},node={}}}",
                self.store.gateway_id(),
                n.id
            );
            let (_, granted) = r.gauge(&granted);
            ensure!(
                granted <= DN_BUDGET as f64,
                "datanode {}: granted {granted} > budget {DN_BUDGET}",
                n.id
            );
            ensure!(granted > 0.0, "datanode {}: never granted anything", n.id);
        }
        Ok(())
    }
}

/// Deterministic pseudo-random payload (xorshift64).
fn payload(len: usize, seed: u64) -> Bytes {
    sluice_test_support::payload(len, seed).into()
}

/// `data` as a body of 100 KiB chunks.
fn body(
    data: &Bytes,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + use<> {
    let chunks: Vec<_> = (0..data.len())
        .step_by(100 * 1024)
        .map(|i| Ok(data.slice(i..(i + 100 * 1024).min(data.len()))))
        .collect();
    futures::stream::iter(chunks)
}

async fn read_all(store: &BlobStore, p: &sluice_proto::meta::Placement) -> Result<Vec<u8>> {
    let mut stream = store.read(p, 0..p.size);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// Waits until the gateway has seen its credit stream to `node` break.
async fn credit_stream_broken(store: &BlobStore, node: u64) -> Result<()> {
    eventually("credit stream broken", || {
        let stats = store.credit_stats(node).ok_or("no stream")?;
        (!stats.connected)
            .then_some(())
            .ok_or_else(|| format!("{stats:?}"))
    })
    .await
}

async fn eventually(what: &str, mut cond: impl FnMut() -> Result<(), String>) -> Result<()> {
    sluice_test_support::wait_until(what, WAIT, || std::future::ready(cond())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_far_larger_than_every_budget_complete_within_credit() -> Result<()> {
    let cluster = Cluster::start(11, Duration::from_secs(30)).await?;
    // Each datanode receives 3 MiB, twelve times its budget; the gateway
    // pushes 18 MiB of blocks through a 768 KiB buffer budget. Four writes
    // at once share the datanodes' credit and the gateway's budget.
    let datas: Vec<Bytes> = (0..4)
        .map(|i| payload(3 * STRIPE * 16 + 777, 40 + i))
        .collect();
    let started = Instant::now();
    let writes = datas.iter().enumerate().map(|(i, data)| {
        let store = cluster.store.clone();
        let data = data.clone();
        async move {
            store
                .write(
                    &format!("bucket/big/{i}"),
                    body(&data),
                    Some(data.len() as u64),
                )
                .await
        }
    });
    let placements = futures::future::join_all(writes).await;
    eprintln!(
        "4 writes of {} bytes took {:?}",
        datas[0].len(),
        started.elapsed()
    );
    for (p, data) in placements.into_iter().zip(&datas) {
        let p = p?;
        ensure!(p.missing.is_empty(), "missing shards {:?}", p.missing);
        let got = read_all(&cluster.store, &p).await?;
        ensure!(got == data[..], "read back differs");
    }
    let stats = cluster.store.stats();
    ensure!(
        stats.buffer_high_water() <= GW_BUDGET,
        "gateway buffers {} > budget {GW_BUDGET}",
        stats.buffer_high_water()
    );
    ensure!(stats.buffer_high_water() > 0);
    ensure!(stats.read_high_water() <= GW_BUDGET);
    eventually("buffers released", || {
        (stats.buffer_in_use() == 0 && stats.read_in_use() == 0)
            .then_some(())
            .ok_or_else(|| format!("{} / {}", stats.buffer_in_use(), stats.read_in_use()))
    })
    .await?;
    cluster.check_ledgers()?;

    // Idle credit goes back: nothing is held on either side.
    let gateway = cluster.store.gateway_id().to_string();
    for n in &cluster.nodes {
        let node = n.id;
        eventually("idle credit returned", || {
            let local = cluster.store.credit_stats(node).ok_or("no stream")?;
            let series =
                format!("sluice_datanode_credit_granted_bytes{{gateway={gateway},node={node}}}");
            let (remote, _) = recorder().gauge(&series);
            (local.available == 0 && local.waiting == 0 && remote == 0.0 && local.connected)
                .then_some(())
                .ok_or_else(|| format!("node {node}: local {local:?}, datanode says {remote}"))
        })
        .await?;
    }
    cluster.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_datanode_grants_again_after_reconnect() -> Result<()> {
    let mut cluster = Cluster::start(21, Duration::from_secs(30)).await?;
    let data = payload(2 * STRIPE * 8, 7);
    let p = cluster.store.write("bucket/a", body(&data), None).await?;
    ensure!(p.missing.is_empty());
    let node = cluster.nodes[2].id;
    cluster.nodes[2].shut_down().await?;
    // The gateway sees its credit stream break (here before the node is
    // back; the write racing the old connection's drain is the next test).
    credit_stream_broken(&cluster.store, node).await?;
    cluster.nodes[2].start_again(WAIT).await?;
    // The broken stream lost its credit and reconnects with backoff; the
    // next write's PutShard waits for it to reopen (NodeCredit::stream_open),
    // so it does not go out on the dead connection and the restarted node
    // gets its shard.
    let again = cluster.store.write("bucket/b", body(&data), None).await?;
    ensure!(
        again.missing.is_empty(),
        "node {node} restarted: missing {:?}",
        again.missing
    );
    ensure!(read_all(&cluster.store, &again).await? == data[..]);
    ensure!(read_all(&cluster.store, &p).await? == data[..]);
    ensure!(
        cluster
            .store
            .credit_stats(node)
            .is_some_and(|s| s.connected)
    );
    cluster.shut_down().await
}

/// The race a restart opens: a datanode that is shutting down ends its
/// credit streams at once, but a connection with a request in flight stays
/// open (refusing new streams) for its shutdown grace. A write must not
/// open its PutShard on that connection just because the node is listening
/// again: it waits for the credit stream to reopen, which happens on a new
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_after_a_restart_does_not_use_the_draining_connection() -> Result<()> {
    restart_while_a_read_drains(41, tiny_budget).await
}

/// The same with a shutdown grace longer than a credit stream attempt may
/// take (7 s against 5 s): the write neither waits for the old node's drain
/// nor loses its shard. (The first attempt after the break is cancelled by
/// the connection that got the GOAWAY; the next goes out on a new
/// connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_longer_than_a_credit_attempt_still_holds_the_write_back() -> Result<()> {
    restart_while_a_read_drains(51, tiny_budget_long_grace).await
}

async fn restart_while_a_read_drains(
    first_id: u64,
    tweak: fn(&mut sluice_datanode::Config),
) -> Result<()> {
    let mut cluster = Cluster::start_with(first_id, Duration::from_secs(30), tweak).await?;
    // 16 blocks per shard: more than a GetShard stream's window plus the
    // gateway's read budget, so a read left unconsumed keeps its streams
    // open on the datanodes.
    let data = payload(2 * STRIPE * 8, 9);
    let p = cluster.store.write("bucket/a", body(&data), None).await?;
    ensure!(p.missing.is_empty());
    // The node holding data shard 0, which every read of `p` streams from.
    let node = p.nodes[0];
    let at = cluster
        .nodes
        .iter()
        .position(|n| n.id == node)
        .ok_or_else(|| anyhow::anyhow!("node {node} not in the cluster"))?;
    let mut reader = cluster.store.read(&p, 0..p.size);
    ensure!(
        reader
            .next()
            .await
            .transpose()?
            .is_some_and(|c| !c.is_empty())
    );

    let mut stopping = cluster.nodes[at].begin_shut_down();
    credit_stream_broken(&cluster.store, node).await?;
    cluster.nodes[at].start_again(WAIT).await?;
    ensure!(
        stopping.is_running(),
        "the old node drained before the write"
    );
    let again = cluster.store.write("bucket/b", body(&data), None).await?;
    ensure!(
        again.missing.is_empty(),
        "node {node} restarted: missing {:?}",
        again.missing
    );
    drop(reader);
    stopping.stop().await?;
    ensure!(read_all(&cluster.store, &again).await? == data[..]);
    ensure!(read_all(&cluster.store, &p).await? == data[..]);
    cluster.shut_down().await
}

/// Opens a credit stream as another gateway and takes the whole budget of
/// the datanode at `addr`, never spending it. Returns the stream (dropping
/// it gives the credit back).
async fn hog(addr: &str) -> Result<tonic::Streaming<sluice_proto::datanode::CreditGrant>> {
    let mut client = DatanodeClient::connect(addr.to_string()).await?;
    let mut grants = client
        .credits(CreditStreamRequest {
            gateway_id: "hog".into(),
        })
        .await?
        .into_inner();
    client
        .report_credits(CreditReport {
            gateway_id: "hog".into(),
            wanted_bytes: DN_BUDGET,
            returned_bytes: 0,
        })
        .await?;
    let mut got = 0;
    while got < DN_BUDGET {
        let grant = tokio::time::timeout(WAIT, grants.next())
            .await
            .context("waiting for the hog's grant")?
            .context("credit stream ended")??;
        got += grant.bytes;
    }
    Ok(grants)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn datanodes_without_credit_end_the_write_with_datanodes_busy() -> Result<()> {
    let stall = Duration::from_millis(300);
    let cluster = Cluster::start(31, stall).await?;
    let data = payload(STRIPE * 4, 9);
    // Connect the gateway's credit streams first: on a loaded machine the
    // first connection and grant can take longer than this short stall, so
    // the warm-up write is retried until all six shards were written.
    let warm_up = Instant::now();
    loop {
        match cluster.store.write("bucket/warm", body(&data), None).await {
            Ok(p) if p.missing.is_empty() => break,
            other => ensure!(
                warm_up.elapsed() < WAIT,
                "warm-up write still incomplete: {other:?}"
            ),
        }
    }
    // One datanode without credit (the hog gets the budget once the
    // gateway's idle credit has been returned): its shard fails after the stall
    // timeout, the write quorum (5 of 6) still holds.
    let hog_a = hog(&cluster.nodes[0].addr).await?;
    let p = cluster
        .store
        .write("bucket/one-starved", body(&data), None)
        .await?;
    let starved = p
        .nodes
        .iter()
        .position(|&n| n == cluster.nodes[0].id)
        .expect("all six nodes used") as u32;
    ensure!(p.missing == vec![starved], "missing {:?}", p.missing);
    ensure!(read_all(&cluster.store, &p).await? == data[..]);

    // Two: the write fails as DatanodesBusy (a SlowDown for the client).
    let hog_b = hog(&cluster.nodes[1].addr).await?;
    let started = Instant::now();
    let err = cluster
        .store
        .write("bucket/two-starved", body(&data), None)
        .await
        .expect_err("two shards without credit");
    // Which of the two waits (credit, or the buffers its blocks hold)
    // gives up first is a race of equal timeouts; both answer SlowDown.
    ensure!(
        matches!(
            err,
            BlobError::DatanodesBusy { .. } | BlobError::BufferStall { .. }
        ),
        "{err:?}"
    );
    ensure!(
        started.elapsed() >= stall,
        "failed after {:?}",
        started.elapsed()
    );
    ensure!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    // Its stripes' buffers came back.
    let stats = cluster.store.stats();
    eventually("buffers released", || {
        (stats.buffer_in_use() == 0)
            .then_some(())
            .ok_or_else(|| stats.buffer_in_use().to_string())
    })
    .await?;

    // The hogs leave: writes go through on all six again.
    drop((hog_a, hog_b));
    let p = cluster
        .store
        .write("bucket/after", body(&data), None)
        .await?;
    ensure!(p.missing.is_empty(), "missing {:?}", p.missing);
    cluster.shut_down().await
}
