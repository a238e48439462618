//! `meta-load`: the metadata path at millions of objects.
//!
//! Starts three `sluice meta` voters as separate processes (plaintext
//! cluster gRPC, a metrics listener each), then, through the real metadata
//! API (`MetaClient`) and Raft:
//! 1. loads `--objects` object records into bucket `load` with
//!    `--concurrent` writers (keys `GGGGGG/IIIIIIIII`, `--per-prefix`
//!    objects under each common prefix), timing every PutObject;
//! 2. optionally loads `--many-parts-objects` records of `--parts` parts
//!    each into bucket `parts`;
//! 3. times ListObjects pages of 1,000 keys at the start, middle and end of
//!    `load`, the same with delimiter `/` (over the common prefixes), a
//!    page of `parts` (many-part records) and HeadObject (GetObject with
//!    `head_only`, as the gateway's HEAD asks) of random keys of both
//!    buckets, one request at a time;
//! 4. reads the leader's snapshot figures from its `/metrics`, then
//!    replaces a follower the supported way (RemoveVoter, then a node with
//!    a new id and an empty directory, `join = true`, added with AddVoter):
//!    the leader has purged its early log, so the new node catches up by
//!    the leader's snapshot; reports the time until it has applied what
//!    the leader had, its install time (its `/metrics`) and the peak RSS of
//!    the leader and the new node, sampled every 100 ms meanwhile.
//!
//! The figures are printed as a table and written to `<out-dir>/summary.json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::Rng;
use serde::Serialize;
use sluice_meta_client::MetaClient;
use sluice_proto::admin::{self as apb, admin_client::AdminClient};
use sluice_proto::meta as pb;
use tokio::process::Child;

use crate::rss::rss_bytes_of;
use crate::stats::{LatencyStats, LatencySummary};
use sluice_harness::cluster::{self, Launch, Role};

/// Flags of `sluice-bench meta-load`.
#[derive(Debug, Clone, clap::Args)]
pub struct MetaLoadOptions {
    /// The `sluice` binary to start the meta nodes from.
    #[arg(long, default_value = "target/release/sluice")]
    pub sluice_bin: PathBuf,
    /// Directory for the nodes' configs, data and logs (deleted at the end unless --keep).
    #[arg(long, default_value = "sluice-meta-load")]
    pub work_dir: PathBuf,
    /// Directory for summary.json.
    #[arg(long, default_value = "sluice-meta-load-out")]
    pub out_dir: PathBuf,
    /// Object records loaded into bucket `load`.
    #[arg(long, default_value_t = 100_000)]
    pub objects: u64,
    /// Objects under each common prefix of `load` (objects / per-prefix prefixes).
    #[arg(long, default_value_t = 20)]
    pub per_prefix: u64,
    /// PutObject calls in flight during the load.
    #[arg(long, default_value_t = 64)]
    pub concurrent: usize,
    /// Records of `--parts` parts each loaded into bucket `parts` (0: none).
    #[arg(long, default_value_t = 0)]
    pub many_parts_objects: u64,
    /// Parts of each record in bucket `parts`.
    #[arg(long, default_value_t = 1000)]
    pub parts: u32,
    /// Requests timed per listing position and kind.
    #[arg(long, default_value_t = 30)]
    pub list_requests: u32,
    /// HeadObject requests timed.
    #[arg(long, default_value_t = 1000)]
    pub head_requests: u32,
    /// sled page cache of each meta node, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub sled_cache_bytes: u64,
    /// Keep the work directory at the end.
    #[arg(long)]
    pub keep: bool,
}

/// Latency of one timed request kind.
#[derive(Debug, Clone, Serialize)]
pub struct Timed {
    /// What was timed.
    pub what: String,
    /// Its latencies.
    pub latency: LatencySummary,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct MetaLoadSummary {
    /// Records in bucket `load`.
    pub objects: u64,
    /// Common prefixes of `load`.
    pub prefixes: u64,
    /// PutObject calls in flight.
    pub concurrent: usize,
    /// PutObject ops/s through Raft.
    pub put_ops_per_s: f64,
    /// PutObject latency.
    pub put_latency: LatencySummary,
    /// Records of `--parts` parts loaded, and their parts.
    pub many_parts: (u64, u32),
    /// Listings and heads.
    pub timed: Vec<Timed>,
    /// The leader's snapshot builds: count, mean seconds, last file bytes.
    pub snapshot_builds: u64,
    /// Mean build time, seconds.
    pub snapshot_build_mean_s: f64,
    /// Bytes of the last snapshot file the leader built.
    pub snapshot_bytes: u64,
    /// A replacement voter (new id, empty directory): seconds from its
    /// start to having applied what the leader had applied.
    pub catch_up_s: f64,
    /// Its snapshot install time (its `/metrics`), seconds.
    pub install_s: f64,
    /// Peak RSS while the follower caught up, MiB: leader, follower.
    pub peak_rss_mib: (f64, f64),
    /// RSS at the end of the load, MiB, per node.
    pub rss_after_load_mib: Vec<f64>,
}

/// One meta node process.
struct Node {
    id: u64,
    port: u16,
    metrics_port: u16,
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    fn rss_mib(&self) -> f64 {
        let Some(pid) = self.pid() else { return 0.0 };
        rss_bytes_of(pid).map_or(0.0, |b| b as f64 / (1 << 20) as f64)
    }

    fn start(&mut self, bin: &Path) -> Result<()> {
        let child = Launch::new(bin, Role::Meta, &self.config, &self.log, "info")
            .append(true)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    async fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let name = format!("meta{}", self.id);
            cluster::terminate(&mut child, &name, Duration::from_secs(20)).await;
        }
        Ok(())
    }

    /// A value of the node's Prometheus text (the first sample named `name`).
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = http_get(self.metrics_port, "/metrics").await.ok()?;
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let key = key.split('{').next()?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1 (the metrics listener).
async fn http_get(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body
        .split_once("\r\n\r\n")
        .map_or(body.clone(), |(_, b)| b.to_string()))
}

/// Writes the config of meta node `id` (a fresh pair of ports) and
/// returns it, not started. `voters`: the `[voters]` table; `join`: added
/// to a running cluster.
fn node(
    options: &MetaLoadOptions,
    id: u64,
    ports: [u16; 2],
    voters: &str,
    join: bool,
) -> Result<Node> {
    let [port, metrics] = ports;
    let dir = options.work_dir.join(format!("meta{id}"));
    let config = options.work_dir.join(format!("meta{id}.toml"));
    let text = format!(
        "node_id = {id}\nlisten = \"127.0.0.1:{port}\"\nadvertise_addr = \"http://127.0.0.1:{port}\"\n\
         data_dir = \"{data}\"\ninsecure_cluster = true\nmetrics_listen = \"127.0.0.1:{metrics}\"\n\
         sled_cache_bytes = {cache}\njoin = {join}\n{voters}",
        data = dir.display(),
        cache = options.sled_cache_bytes,
    );
    std::fs::write(&config, text)?;
    Ok(Node {
        id,
        port,
        metrics_port: metrics,
        dir,
        config,
        log: options.work_dir.join(format!("meta{id}.log")),
        child: None,
    })
}

/// The three initial voters (ids 1-3).
fn write_configs(options: &MetaLoadOptions) -> Result<Vec<Node>> {
    let ports = cluster::reserve_ports(6)?;
    let mut voters = String::from("[voters]\n");
    for (i, port) in ports[..3].iter().enumerate() {
        writeln!(voters, "{} = \"http://127.0.0.1:{port}\"", i + 1)?;
    }
    (0..3)
        .map(|i| {
            node(
                options,
                i as u64 + 1,
                [ports[i], ports[3 + i]],
                &voters,
                false,
            )
        })
        .collect()
}

fn load_key(i: u64, per_prefix: u64) -> String {
    format!("{:06}/{i:09}", i / per_prefix)
}

fn placement(epoch: u64, blob: u64, size: u64) -> pb::Placement {
    pb::Placement {
        blob_id: format!("e{epoch}.{blob:016x}"),
        size,
        data_shards: 4,
        parity_shards: 2,
        block_size: 262_144,
        nodes: vec![1, 2, 3, 4, 5, 6],
        missing: vec![],
    }
}

/// A record like a gateway's for a `parts`-part object (one placement per part).
fn record(bucket: &str, key: &str, epoch: u64, first_blob: u64, parts: u32) -> pb::ObjectRecord {
    const PART: u64 = 5 << 20;
    pb::ObjectRecord {
        bucket: bucket.into(),
        key: key.into(),
        size: PART * u64::from(parts),
        etag: format!("{:032x}-{parts}", first_blob),
        last_modified_ms: 1_700_000_000_000,
        parts: (1..=parts)
            .map(|n| pb::PartRecord {
                part_number: n,
                size: PART,
                md5: vec![7; 16],
                placement: Some(placement(epoch, first_blob + u64::from(n), PART)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Loads `count` records through `concurrent` writers; returns ops/s and latencies.
async fn load(
    client: &MetaClient,
    concurrent: usize,
    count: u64,
    make: Arc<dyn Fn(u64) -> pb::ObjectRecord + Send + Sync>,
) -> Result<(f64, LatencyStats)> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrent {
        let (client, next, make) = (client.clone(), next.clone(), make.clone());
        workers.spawn(async move {
            let mut stats = LatencyStats::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(stats);
                }
                let t = Instant::now();
                client
                    .put_object(make(i))
                    .await
                    .with_context(|| format!("PutObject {i}"))?;
                stats.record(t.elapsed());
                if i > 0 && i % 100_000 == 0 {
                    tracing::info!(loaded = i, secs = started.elapsed().as_secs(), "loading");
                }
            }
        });
    }
    let mut all = LatencyStats::new();
    while let Some(done) = workers.join_next().await {
        let stats = done??;
        all.merge(&stats);
    }
    Ok((count as f64 / started.elapsed().as_secs_f64(), all))
}

async fn time_requests<F, Fut>(what: &str, n: u32, mut call: F) -> Result<Timed>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut stats = LatencyStats::new();
    for i in 0..n {
        let t = Instant::now();
        call(i).await?;
        stats.record(t.elapsed());
    }
    Ok(Timed {
        what: what.to_string(),
        latency: stats.summary(),
    })
}

fn list_request(bucket: &str, after: String, delimiter: bool) -> pb::ListObjectsRequest {
    pb::ListObjectsRequest {
        bucket: bucket.into(),
        start_after: after,
        delimiter: delimiter.then(|| "/".to_string()),
        max_keys: 1000,
        ..Default::default()
    }
}

/// Runs the benchmark (see the module docs).
pub async fn run(options: MetaLoadOptions) -> Result<MetaLoadSummary> {
    if !options.sluice_bin.is_file() {
        bail!(
            "{} is not a file (build it: cargo build --release --bin sluice)",
            options.sluice_bin.display()
        );
    }
    if options.objects < 2000 || options.per_prefix == 0 {
        bail!("--objects must be at least 2000 and --per-prefix positive");
    }
    if options.work_dir.exists() {
        std::fs::remove_dir_all(&options.work_dir)?;
    }
    std::fs::create_dir_all(&options.work_dir)?;
    std::fs::create_dir_all(&options.out_dir)?;
    let mut nodes = write_configs(&options)?;
    for node in &mut nodes {
        node.start(&options.sluice_bin)?;
    }
    let result = measure(&options, &mut nodes).await;
    for node in &mut nodes {
        node.stop().await?;
    }
    let summary = result?;
    std::fs::write(
        options.out_dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    if !options.keep {
        std::fs::remove_dir_all(&options.work_dir)?;
    }
    Ok(summary)
}

async fn leader(client: &MetaClient) -> Result<pb::ClusterStatusResponse> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = client.cluster_status().await
            && s.leader_id.is_some()
        {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("no meta leader within 60 s (see the logs in the work directory)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn measure(options: &MetaLoadOptions, nodes: &mut Vec<Node>) -> Result<MetaLoadSummary> {
    let client = MetaClient::new(nodes.iter().map(Node::url).collect());
    leader(&client).await?;
    let epoch = client.open_epoch("meta-load").await?.epoch;
    let stop_renew = Arc::new(AtomicBool::new(false));
    let renew = {
        let (client, stop) = (client.clone(), stop_renew.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if let Err(e) = client.renew_epoch(epoch).await {
                    tracing::warn!(error = %e, "renewing the write epoch");
                }
            }
        })
    };
    let result = measure_with_epoch(options, nodes, &client, epoch).await;
    stop_renew.store(true, Ordering::Relaxed);
    renew.abort();
    result
}

async fn measure_with_epoch(
    options: &MetaLoadOptions,
    nodes: &mut Vec<Node>,
    client: &MetaClient,
    epoch: u64,
) -> Result<MetaLoadSummary> {
    client.create_bucket("load", 1).await?;
    let per_prefix = options.per_prefix;
    let n = options.objects;
    tracing::info!(
        objects = n,
        concurrent = options.concurrent,
        "loading bucket load"
    );
    let (put_ops_per_s, put_latency) = load(
        client,
        options.concurrent,
        n,
        Arc::new(move |i| record("load", &load_key(i, per_prefix), epoch, i << 12, 1)),
    )
    .await?;
    let many = options.many_parts_objects;
    if many > 0 {
        client.create_bucket("parts", 1).await?;
        let parts = options.parts;
        tracing::info!(objects = many, parts, "loading bucket parts");
        let base = (n + 1) << 12;
        load(
            client,
            options.concurrent.min(8),
            many,
            Arc::new(move |i| record("parts", &format!("m{i:09}"), epoch, base + i * 4096, parts)),
        )
        .await?;
    }
    let rss_after_load_mib = nodes.iter().map(Node::rss_mib).collect();

    let reps = options.list_requests;
    let prefixes = n.div_ceil(per_prefix);
    let mut timed = Vec::new();
    for (label, at) in [("start", 0), ("middle", n / 2), ("end", n - 1001)] {
        let after = if at == 0 {
            String::new()
        } else {
            load_key(at, per_prefix)
        };
        timed.push(
            time_requests(&format!("list 1000 keys, {label}"), reps, |_| {
                let req = list_request("load", after.clone(), false);
                async move {
                    let page = client.list_objects(req).await?;
                    anyhow::ensure!(page.objects.len() == 1000, "short page");
                    Ok(())
                }
            })
            .await?,
        );
    }
    if prefixes > 1001 {
        for (label, at) in [
            ("start", 0),
            ("middle", prefixes / 2),
            ("end", prefixes - 1001),
        ] {
            let after = if at == 0 {
                String::new()
            } else {
                format!("{at:06}/")
            };
            timed.push(
                time_requests(
                    &format!("list 1000 prefixes (delimiter /), {label}"),
                    reps,
                    |_| {
                        let req = list_request("load", after.clone(), true);
                        async move {
                            let page = client.list_objects(req).await?;
                            anyhow::ensure!(page.common_prefixes.len() == 1000, "short page");
                            Ok(())
                        }
                    },
                )
                .await?,
            );
        }
    }
    if many > 0 {
        let page_of = many.min(1000);
        timed.push(
            time_requests(
                &format!("list {page_of} keys of {}-part objects", options.parts),
                reps,
                |_| {
                    let req = list_request("parts", String::new(), false);
                    async move {
                        let page = client.list_objects(req).await?;
                        anyhow::ensure!(page.objects.len() as u64 == page_of, "short page");
                        Ok(())
                    }
                },
            )
            .await?,
        );
    }
    let keys: Vec<String> = {
        let mut rng = rand::thread_rng();
        (0..options.head_requests)
            .map(|_| load_key(rng.gen_range(0..n), per_prefix))
            .collect()
    };
    timed.push(
        time_requests(
            "head (record of a random key)",
            options.head_requests,
            |i| {
                let key = keys[i as usize].clone();
                async move {
                    client.head_version("load", &key, "", false).await?;
                    Ok(())
                }
            },
        )
        .await?,
    );
    if many > 0 {
        let keys: Vec<String> = {
            let mut rng = rand::thread_rng();
            (0..options.head_requests)
                .map(|_| format!("m{:09}", rng.gen_range(0..many)))
                .collect()
        };
        timed.push(
            time_requests(
                &format!("head of a {}-part object", options.parts),
                options.head_requests,
                |i| {
                    let key = keys[i as usize].clone();
                    async move {
                        let head = client.head_version("parts", &key, "", false).await?;
                        anyhow::ensure!(head.parts.is_empty(), "HEAD answered the part list");
                        Ok(())
                    }
                },
            )
            .await?,
        );
    }

    // Snapshots: the leader's builds so far, then a wiped follower.
    let status = leader(client).await?;
    let leader_id = status.leader_id.context("leader")?;
    let leader_ix = nodes
        .iter()
        .position(|x| x.id == leader_id)
        .context("leader node")?;
    let builds = nodes[leader_ix]
        .metric("sluice_meta_snapshot_build_seconds_count")
        .await
        .unwrap_or(0.0);
    let build_sum = nodes[leader_ix]
        .metric("sluice_meta_snapshot_build_seconds_sum")
        .await
        .unwrap_or(0.0);
    let snapshot_bytes = nodes[leader_ix]
        .metric("sluice_meta_snapshot_bytes")
        .await
        .unwrap_or(0.0);
    // A follower is replaced: removed, then a new node (id 4, empty
    // directory, join = true) is added; AddVoter returns once it caught up.
    let lost = nodes
        .iter()
        .find(|x| x.id != leader_id)
        .map(|x| x.id)
        .context("a follower")?;
    client
        .call_on("RemoveVoter", |ch| async move {
            AdminClient::new(ch)
                .remove_voter(apb::RemoveVoterRequest { id: lost })
                .await
        })
        .await?;
    let lost_ix = nodes
        .iter()
        .position(|x| x.id == lost)
        .context("lost node")?;
    nodes[lost_ix].stop().await?;
    std::fs::remove_dir_all(&nodes[lost_ix].dir)?;
    let ports = cluster::reserve_ports(2)?;
    let mut replacement = node(options, 4, [ports[0], ports[1]], "", true)?;
    let target = leader(client).await?.last_applied_index;
    let started = Instant::now();
    replacement.start(&options.sluice_bin)?;
    let req = apb::AddVoterRequest {
        id: 4,
        addr: replacement.url(),
        catch_up_timeout_ms: Some(1_800_000),
    };
    let mut add = Some({
        // AddVoter answers once the learner caught up: minutes for a large
        // snapshot, past the default call timeout.
        let client = MetaClient::with_timeouts(
            nodes.iter().map(Node::url).collect(),
            Duration::from_secs(5),
            Duration::from_secs(1800),
        );
        tokio::spawn(async move {
            client
                .call_on("AddVoter", |ch| {
                    let req = req.clone();
                    async move { AdminClient::new(ch).add_voter(req).await }
                })
                .await
        })
    });
    nodes.push(replacement);
    let new_ix = nodes.len() - 1;
    let direct = MetaClient::with_timeouts(
        vec![nodes[new_ix].url()],
        Duration::from_secs(2),
        Duration::from_secs(5),
    );
    let (mut peak_leader, mut peak_follower) = (0.0f64, 0.0f64);
    loop {
        peak_leader = peak_leader.max(nodes[leader_ix].rss_mib());
        peak_follower = peak_follower.max(nodes[new_ix].rss_mib());
        if let Ok(s) = direct.cluster_status().await
            && s.last_applied_index >= target
        {
            break;
        }
        if let Some(handle) = add.take_if(|h| h.is_finished()) {
            // AddVoter answered: an error (learner never caught up) ends the run.
            handle.await??;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("the new voter did not catch up within 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let catch_up_s = started.elapsed().as_secs_f64();
    if let Some(handle) = add {
        handle.await??;
    }
    let install_s = nodes[new_ix]
        .metric("sluice_meta_snapshot_install_seconds_sum")
        .await
        .unwrap_or(0.0);

    Ok(MetaLoadSummary {
        objects: n,
        prefixes,
        concurrent: options.concurrent,
        put_ops_per_s,
        put_latency: put_latency.summary(),
        many_parts: (many, options.parts),
        timed,
        snapshot_builds: builds as u64,
        snapshot_build_mean_s: if builds > 0.0 {
            build_sum / builds
        } else {
            0.0
        },
        snapshot_bytes: snapshot_bytes as u64,
        catch_up_s,
        install_s,
        peak_rss_mib: (peak_leader, peak_follower),
        rss_after_load_mib,
    })
}

/// The summary as a Markdown table.
pub fn render(s: &MetaLoadSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "meta-load: {} objects under {} prefixes, 3 voters, {} writers",
        s.objects, s.prefixes, s.concurrent
    );
    let _ = writeln!(out, "| measure | value |\n|---|---|");
    let _ = writeln!(
        out,
        "| PutObject through Raft | {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms |",
        s.put_ops_per_s, s.put_latency.p50_ms, s.put_latency.p99_ms
    );
    for t in &s.timed {
        let _ = writeln!(
            out,
            "| {} | p50 {:.2} ms, p99 {:.2} ms |",
            t.what, t.latency.p50_ms, t.latency.p99_ms
        );
    }
    let _ = writeln!(
        out,
        "| snapshot build (leader) | {} builds, mean {:.2} s, last file {:.1} MiB |",
        s.snapshot_builds,
        s.snapshot_build_mean_s,
        s.snapshot_bytes as f64 / (1 << 20) as f64
    );
    let _ = writeln!(
        out,
        "| replacement voter catch-up | {:.1} s (install {:.2} s) |",
        s.catch_up_s, s.install_s
    );
    let _ = writeln!(
        out,
        "| peak RSS during catch-up | leader {:.1} MiB, follower {:.1} MiB |",
        s.peak_rss_mib.0, s.peak_rss_mib.1
    );
    let rss: Vec<String> = s
        .rss_after_load_mib
        .iter()
        .map(|r| format!("{r:.1}"))
        .collect();
    let _ = writeln!(out, "| RSS after the load | {} MiB |", rss.join(" / "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_like_their_numbers_and_group_by_prefix() {
        let keys: Vec<String> = (0..45).map(|i| load_key(i, 20)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(load_key(19, 20), "000000/000000019");
        assert_eq!(load_key(20, 20), "000001/000000020");
    }

    #[test]
    fn a_many_part_record_has_one_distinct_blob_per_part() {
        let r = record("parts", "m1", 3, 4096, 1000);
        assert_eq!(r.parts.len(), 1000);
        assert_eq!(r.size, 1000 * (5 << 20));
        let blobs: std::collections::BTreeSet<_> = r
            .parts
            .iter()
            .map(|p| p.placement.as_ref().unwrap().blob_id.clone())
            .collect();
        assert_eq!(blobs.len(), 1000);
        assert!(blobs.iter().all(|b| b.starts_with("e3.")));
        assert_eq!(
            r.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(),
            (1..=1000).collect::<Vec<_>>()
        );
    }
}
