//! `placement-sim`: the gateway's real placement code over simulated
//! clusters, no network and no disks.
//!
//! For every cluster shape (`--nodes` × `--zones`, each node its own host,
//! node `i` in zone `i mod zones`, capacities drawn from `--capacities-tb`)
//! it places `--blobs` blobs of `k + m` equal shards with
//! [`placement::place`] — the function the gateway's write path and the
//! rebalancer call — and measures:
//!
//! * *Fill* — each node's fill fraction relative to the cluster's
//!   (`used_i / cap_i ÷ Σused / Σcap − 1`): the largest and the standard
//!   deviation, the Poisson noise a finite blob count alone gives
//!   (`sqrt(mean_i 1/shards_i)`), the mean per capacity and the worst zone.
//!   Two weightings: *live* — the blobs arrive one batch of
//!   `--refresh-blobs` at a time and each batch is placed with the free
//!   bytes the nodes hold after the previous one (the gateway re-reads
//!   them from meta's heartbeat figures), reported at each `--fill` level;
//!   *frozen* — every blob placed with the free bytes of the empty
//!   cluster (the weights never change); *rebalance target* — every blob
//!   placed with the free bytes left after the live fill, which is what
//!   the rebalancer (`gateway/src/heal/mover.rs`) moves shards toward once
//!   a node's weight class changes (its first step, not its fixed point).
//!   The frozen passes place `--move-blobs` blobs.
//! * *Movement* — the share of shards whose node changes (as a set per
//!   blob, as the rebalancer compares) when one node of the largest
//!   capacity is added, and when node 1 is removed, frozen weights. The
//!   rendezvous optimum is the share the added node receives, or the share
//!   the removed node held (≈ 1/N at equal weights).
//! * *Heal fan-out* — after the live fill, the fullest node of the largest
//!   capacity is lost; every blob with a shard there gets its new node from
//!   [`rebuild::choose_targets`] (the heal worker's target choice) and is
//!   read from its first `k` surviving shards in index order (the rebuild's
//!   source order: data shards first). Reported: distinct nodes read and
//!   written, the busiest node's share of that work, and the hours to
//!   re-protect `--heal-node-tb` of shards (see [`HealFigures`]).
//!
//! Everything is seeded (`--seed`): capacities, object keys and blob ids.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::time::Instant;

use bytesize::ByteSize;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_gateway::heal::rebuild::{self, NodeView};
use sluice_gateway::placement::{self, Candidate};
use sluice_gateway::s3::object_placement_key;
use sluice_proto::blob_id::new_blob_id;
use sluice_proto::meta::Placement;

/// Bytes per (decimal) terabyte, as disks are sold.
const TB: f64 = 1e12;

/// Flags of the `placement-sim` example (`cargo run -p sluice-gateway --example placement-sim`).
#[derive(Debug, Clone, clap::Args)]
pub struct PlacementSimOptions {
    /// Datanode counts to simulate (comma-separated); every count is run
    /// with every `--zones` value not larger than it.
    #[arg(long, value_delimiter = ',', default_value = "12,100,1000")]
    pub nodes: Vec<usize>,
    /// Zone counts to simulate (comma-separated); node i is in zone i mod Z.
    #[arg(long, value_delimiter = ',', default_value = "3,10,50")]
    pub zones: Vec<usize>,
    /// Node capacities in TB (10^12 bytes), comma-separated; each node
    /// draws one uniformly (or, with --even-zones, each zone cycles through them).
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,20")]
    pub capacities_tb: Vec<f64>,
    /// Give every zone the same capacity mix (node j of a zone gets
    /// capacity j mod len) instead of drawing each node's at random.
    #[arg(long)]
    pub even_zones: bool,
    /// Blobs placed by the live fill of each shape (each of k + m equal
    /// shards); per-node sampling noise is about 1/sqrt(shards per node).
    #[arg(long, default_value_t = 300_000)]
    pub blobs: usize,
    /// Blobs placed by the frozen-weight passes (frozen and rebalance-target
    /// fill, movement; four placements per blob).
    #[arg(long, default_value_t = 50_000)]
    pub move_blobs: usize,
    /// Cluster fill levels (fraction of total capacity, ascending) at which
    /// the live fill is reported; the last one is where it stops.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,0.75")]
    pub fill: Vec<f64>,
    /// Blobs placed between two refreshes of the nodes' free bytes (the
    /// gateway's view of meta's heartbeat figures).
    #[arg(long, default_value_t = 1000)]
    pub refresh_blobs: usize,
    /// Data shards per blob (k; the gateway's default is 4).
    #[arg(long, default_value_t = 4)]
    pub data_shards: usize,
    /// Parity shards per blob (m; the gateway's default is 2).
    #[arg(long, default_value_t = 2)]
    pub parity_shards: usize,
    /// Seed of capacities, keys and blob ids.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Heal: the shard bytes on the lost node, in TB.
    #[arg(long, default_value_t = 20.0)]
    pub heal_node_tb: f64,
    /// Heal: bytes per second each datanode gives heal, reads and writes
    /// together (e.g. 100MB).
    #[arg(long, default_value = "100MB")]
    pub node_heal_rate: ByteSize,
    /// Heal: gateways running the heal worker.
    #[arg(long, default_value_t = 2)]
    pub gateways: u32,
    /// Heal: each gateway's `heal_bandwidth_bytes_per_sec` (the gateway
    /// default is 32MiB).
    #[arg(long, default_value = "32MiB")]
    pub gateway_heal_rate: ByteSize,
    /// Threads placing blobs (default: the machine's parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Why a simulation cannot run.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A shape has fewer nodes than shards per blob.
    #[error("{nodes} nodes cannot hold {shards} distinct shards per blob")]
    TooFewNodes { nodes: usize, shards: usize },
    /// A flag value is out of range.
    #[error("invalid --{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
    /// `place` found no placement (it should whenever nodes ≥ k + m).
    #[error("no placement for blob {blob} on {nodes} nodes")]
    Unplaced { blob: usize, nodes: usize },
}

/// One simulated datanode; ids are 1..=N (node `i` has index `i - 1`).
#[derive(Debug, Clone, PartialEq)]
pub struct SimNode {
    pub id: u64,
    pub zone: String,
    pub capacity: u64,
}

/// Fill figures of one state (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct FillStats {
    /// How the weights were taken: "live", "frozen" or "rebalance target".
    pub weights: &'static str,
    pub blobs: usize,
    /// Σused / Σcap.
    pub cluster_fill: f64,
    /// The deviation of largest magnitude, signed.
    pub max_dev: f64,
    /// Population standard deviation of the deviations.
    pub sd_dev: f64,
    /// `sqrt(mean_i 1/shards_i)`: what sampling noise alone gives.
    pub noise_sd: f64,
    /// (capacity TB, mean fill of those nodes relative to the cluster's − 1).
    pub by_capacity: Vec<(f64, f64)>,
    /// The zone whose fill deviates most, and by how much.
    pub worst_zone: (String, f64),
}

/// Movement when one node joins or leaves (frozen weights).
#[derive(Debug, Clone, PartialEq)]
pub struct MoveFigures {
    /// Capacity of the added node, TB.
    pub added_tb: f64,
    /// Shards whose node changed / all shards.
    pub add_moved: f64,
    /// Shards the added node receives / all shards (the optimum).
    pub add_optimum: f64,
    /// Capacity of the removed node (node 1), TB.
    pub removed_tb: f64,
    pub remove_moved: f64,
    /// Shards the removed node held / all shards (the optimum).
    pub remove_optimum: f64,
}

/// Heal fan-out after losing one node (see the module doc).
///
/// With `D` the lost node's shard bytes, `L` its shard count, `r` each
/// node's heal rate and `io_j` the shard reads plus writes node `j` does:
/// `hours_nodes = D · max_j io_j / L / r` (the busiest node finishes last),
/// `hours_ideal = D · (k + 1) / ((N − 1) · r)` (every byte rebuilt costs k
/// reads and a write, spread evenly over the survivors) and
/// `hours_gateways = D / (G · g)` (the heal worker writes at most `g`
/// bytes/s per gateway, `G` gateways). The re-protection time is the
/// largest of `hours_nodes` and `hours_gateways`.
#[derive(Debug, Clone, PartialEq)]
pub struct HealFigures {
    pub lost_node: u64,
    pub lost_tb: f64,
    /// L.
    pub lost_shards: usize,
    /// Blobs for which `choose_targets` found no node.
    pub unplaced: usize,
    pub readers: usize,
    pub writers: usize,
    /// max_j io_j / L.
    pub busiest_share: f64,
    pub hours_nodes: f64,
    pub hours_ideal: f64,
    pub hours_gateways: f64,
}

/// Everything measured for one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeReport {
    pub nodes: usize,
    pub zones: usize,
    /// One per `--fill` level, then the frozen placement and the rebalance
    /// target.
    pub fill: Vec<FillStats>,
    pub moves: MoveFigures,
    pub heal: HealFigures,
    pub seconds: f64,
}

/// Checks the flags and lists the (nodes, zones) shapes to run.
pub fn shapes(o: &PlacementSimOptions) -> Result<Vec<(usize, usize)>, SimError> {
    let invalid = |flag, reason: &str| SimError::Invalid {
        flag,
        reason: reason.to_string(),
    };
    if o.capacities_tb.is_empty() || o.capacities_tb.iter().any(|&c| c.is_nan() || c <= 0.0) {
        return Err(invalid("capacities-tb", "give at least one capacity > 0"));
    }
    if o.fill.is_empty()
        || o.fill.iter().any(|&f| f.is_nan() || f <= 0.0 || f >= 1.0)
        || o.fill.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(invalid("fill", "give ascending fractions in (0, 1)"));
    }
    if o.data_shards == 0 || o.parity_shards == 0 {
        return Err(invalid("data-shards", "k and m must both be at least 1"));
    }
    if o.blobs == 0 || o.move_blobs == 0 || o.refresh_blobs == 0 {
        return Err(invalid(
            "blobs",
            "--blobs, --move-blobs and --refresh-blobs must be > 0",
        ));
    }
    if o.zones.contains(&0) {
        return Err(invalid("zones", "a zone count must be at least 1"));
    }
    let n = o.data_shards + o.parity_shards;
    let mut out = Vec::new();
    for &nodes in &o.nodes {
        if nodes < n {
            return Err(SimError::TooFewNodes { nodes, shards: n });
        }
        for &zones in o.zones.iter().filter(|&&z| z <= nodes) {
            out.push((nodes, zones));
        }
    }
    Ok(out)
}

/// Runs every shape; `progress` is told each shape's time.
pub fn run(
    o: &PlacementSimOptions,
    mut progress: impl FnMut(&ShapeReport),
) -> Result<Vec<ShapeReport>, SimError> {
    let mut out = Vec::new();
    for (nodes, zones) in shapes(o)? {
        let r = run_shape(o, nodes, zones)?;
        progress(&r);
        out.push(r);
    }
    Ok(out)
}

/// The simulated cluster of a shape (see the module doc).
pub fn cluster(o: &PlacementSimOptions, nodes: usize, zones: usize) -> Vec<SimNode> {
    let mut rng = StdRng::seed_from_u64(o.seed ^ ((nodes as u64) << 32) ^ zones as u64);
    let caps = &o.capacities_tb;
    (0..nodes)
        .map(|i| {
            let tb = if o.even_zones {
                caps[(i / zones) % caps.len()]
            } else {
                caps[rng.gen_range(0..caps.len())]
            };
            SimNode {
                id: i as u64 + 1,
                zone: zone_name(i % zones),
                capacity: (tb * TB) as u64,
            }
        })
        .collect()
}

fn zone_name(z: usize) -> String {
    format!("z{z:02}")
}

/// The placement key of blob `b`: a single-PUT object's key.
fn blob_key(seed: u64, b: usize) -> String {
    object_placement_key("sim", &format!("s{seed}/obj-{b:08}"))
}

/// Candidates as the gateway builds them: the nodes with at least
/// `min_free` free bytes (the others are not writable), free bytes
/// `capacity − used`.
fn candidates<'a>(nodes: &'a [SimNode], used: &[u64], min_free: u64) -> Vec<Candidate<'a>> {
    nodes
        .iter()
        .zip(used)
        .filter(|(n, u)| n.capacity.saturating_sub(**u) >= min_free)
        .map(|(n, u)| Candidate {
            id: n.id,
            zone: &n.zone,
            host: "",
            free_bytes: n.capacity - u,
        })
        .collect()
}

/// `f` over `range` split into `threads` contiguous pieces, run at once;
/// the results in range order.
fn par_ranges<T: Send>(
    range: Range<usize>,
    threads: usize,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let len = range.len();
    let threads = threads.clamp(1, len.max(1));
    let step = len.div_ceil(threads);
    let pieces: Vec<Range<usize>> = (0..threads)
        .map(|t| {
            let s = range.start + (t * step).min(len);
            s..(s + step).min(range.end)
        })
        .collect();
    if threads == 1 {
        return pieces.into_iter().map(&f).collect();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = pieces
            .into_iter()
            .map(|p| {
                let f = &f;
                s.spawn(move || f(p))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("placement thread panicked"))
            .collect()
    })
}

fn threads(o: &PlacementSimOptions) -> usize {
    o.threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs one shape: live fill, frozen fill and movement, heal.
pub fn run_shape(
    o: &PlacementSimOptions,
    nodes: usize,
    zones: usize,
) -> Result<ShapeReport, SimError> {
    let started = Instant::now();
    let (k, m) = (o.data_shards, o.parity_shards);
    let n = k + m;
    let cl = cluster(o, nodes, zones);
    let total: f64 = cl.iter().map(|c| c.capacity as f64).sum();
    let last = *o.fill.last().expect("checked");
    let shard_bytes = ((total * last) / (o.blobs * n) as f64).max(1.0) as u64;
    let threads = threads(o);

    // Live fill: batches placed with the free bytes left by the previous ones.
    let mut used = vec![0u64; nodes];
    let mut placed: Vec<u64> = Vec::with_capacity(o.blobs * n);
    let mut fill = Vec::new();
    let marks: Vec<usize> = o
        .fill
        .iter()
        .map(|f| ((o.blobs as f64 * f / last).round() as usize).clamp(1, o.blobs))
        .collect();
    let mut next = 0;
    let mut start = 0;
    while start < o.blobs {
        let end = (start + o.refresh_blobs).min(o.blobs).min(marks[next]);
        let cands = candidates(&cl, &used, shard_bytes);
        let batches = par_ranges(start..end, threads, |r| {
            r.map(|b| placement::place(&blob_key(o.seed, b), &cands, k, m).ok_or(b))
                .collect::<Vec<_>>()
        });
        for p in batches.into_iter().flatten() {
            let p = p.map_err(|blob| SimError::Unplaced {
                blob,
                nodes: cands.len(),
            })?;
            for id in &p {
                used[*id as usize - 1] += shard_bytes;
            }
            placed.extend(p);
        }
        start = end;
        if start == marks[next] {
            fill.push(fill_stats("live", &cl, &used, shard_bytes, start));
            next = (next + 1).min(marks.len() - 1);
        }
    }

    // Frozen weights: the empty cluster, plus one node added or node 1 removed.
    let empty = vec![0u64; nodes];
    let base = candidates(&cl, &empty, 0);
    let largest = o.capacities_tb.iter().copied().fold(0.0, f64::max);
    let added = SimNode {
        id: nodes as u64 + 1,
        zone: zone_name(nodes % zones),
        capacity: (largest * TB) as u64,
    };
    let mut grown = base.clone();
    grown.push(Candidate {
        id: added.id,
        zone: &added.zone,
        host: "",
        free_bytes: added.capacity,
    });
    let removed = cl[0].id;
    let shrunk: Vec<Candidate<'_>> = base.iter().copied().filter(|c| c.id != removed).collect();
    // What the rebalancer steers toward after the live fill: every blob
    // placed with the free bytes the nodes have now.
    let now = candidates(&cl, &used, shard_bytes);
    let parts = par_ranges(0..o.move_blobs, threads, |r| {
        let mut t = MoveTally {
            counts: vec![0; nodes],
            target: vec![0; nodes],
            ..MoveTally::default()
        };
        for b in r {
            let key = blob_key(o.seed, b);
            let before = placement::place(&key, &base, k, m).ok_or(b)?;
            let after_add = placement::place(&key, &grown, k, m).ok_or(b)?;
            let after_rm = placement::place(&key, &shrunk, k, m).ok_or(b)?;
            for id in &before {
                t.counts[*id as usize - 1] += 1;
            }
            for id in placement::place(&key, &now, k, m).ok_or(b)? {
                t.target[id as usize - 1] += 1;
            }
            t.add_moved += after_add.iter().filter(|x| !before.contains(x)).count();
            t.added_got += usize::from(after_add.contains(&added.id));
            t.rm_moved += after_rm.iter().filter(|x| !before.contains(x)).count();
            t.removed_held += usize::from(before.contains(&removed));
        }
        Ok::<_, usize>(t)
    });
    let mut t = MoveTally {
        counts: vec![0; nodes],
        target: vec![0; nodes],
        ..MoveTally::default()
    };
    for p in parts {
        let p = p.map_err(|blob| SimError::Unplaced { blob, nodes })?;
        t.add_moved += p.add_moved;
        t.added_got += p.added_got;
        t.rm_moved += p.rm_moved;
        t.removed_held += p.removed_held;
        for (a, b) in t.counts.iter_mut().zip(p.counts) {
            *a += b;
        }
        for (a, b) in t.target.iter_mut().zip(p.target) {
            *a += b;
        }
    }
    // Shards of the frozen passes stand for `blobs / move_blobs` as much
    // data each, so the cluster fill reads the same as the live one.
    let scaled = (shard_bytes as f64 * o.blobs as f64 / o.move_blobs as f64) as u64;
    for (name, counts) in [("frozen", &t.counts), ("rebalance target", &t.target)] {
        let used: Vec<u64> = counts.iter().map(|c| c * scaled).collect();
        fill.push(fill_stats(name, &cl, &used, scaled, o.move_blobs));
    }
    let all = (o.move_blobs * n) as f64;
    let moves = MoveFigures {
        added_tb: largest,
        add_moved: t.add_moved as f64 / all,
        add_optimum: t.added_got as f64 / all,
        removed_tb: cl[0].capacity as f64 / TB,
        remove_moved: t.rm_moved as f64 / all,
        remove_optimum: t.removed_held as f64 / all,
    };

    let heal = heal(o, &cl, &used, &placed, shard_bytes);
    Ok(ShapeReport {
        nodes,
        zones,
        fill,
        moves,
        heal,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[derive(Debug, Default)]
struct MoveTally {
    /// Shards per node, frozen weights.
    counts: Vec<u64>,
    /// Shards per node, weights after the live fill.
    target: Vec<u64>,
    add_moved: usize,
    added_got: usize,
    rm_moved: usize,
    removed_held: usize,
}

/// Fill figures of `used` bytes per node (index = id − 1).
pub fn fill_stats(
    weights: &'static str,
    nodes: &[SimNode],
    used: &[u64],
    shard_bytes: u64,
    blobs: usize,
) -> FillStats {
    let cap: f64 = nodes.iter().map(|c| c.capacity as f64).sum();
    let total: f64 = used.iter().map(|&u| u as f64).sum();
    let mean = total / cap;
    let devs: Vec<f64> = nodes
        .iter()
        .zip(used)
        .map(|(c, &u)| (u as f64 / c.capacity as f64) / mean - 1.0)
        .collect();
    let max_dev = devs
        .iter()
        .copied()
        .fold(0.0f64, |a, d| if d.abs() > a.abs() { d } else { a });
    let sd_dev = (devs.iter().map(|d| d * d).sum::<f64>() / devs.len() as f64).sqrt();
    let noise_sd = (used
        .iter()
        .map(|&u| 1.0 / (u / shard_bytes).max(1) as f64)
        .sum::<f64>()
        / used.len() as f64)
        .sqrt();
    let by_capacity: Vec<(f64, f64)> = group_dev(nodes, used, mean, |c| c.capacity)
        .into_iter()
        .map(|(c, d)| (c as f64 / TB, d))
        .collect();
    let worst_zone = group_dev(nodes, used, mean, |c| c.zone.clone())
        .into_iter()
        .fold((String::new(), 0.0f64), |a, z| {
            if z.1.abs() > a.1.abs() { z } else { a }
        });
    FillStats {
        weights,
        blobs,
        cluster_fill: mean,
        max_dev,
        sd_dev,
        noise_sd,
        by_capacity,
        worst_zone,
    }
}

/// The fill of each group of nodes (by `key`) relative to the cluster's
/// `mean` fill, minus 1, in key order.
fn group_dev<K: Ord>(
    nodes: &[SimNode],
    used: &[u64],
    mean: f64,
    key: impl Fn(&SimNode) -> K,
) -> Vec<(K, f64)> {
    let mut g: BTreeMap<K, (f64, f64)> = BTreeMap::new();
    for (c, &u) in nodes.iter().zip(used) {
        let e = g.entry(key(c)).or_default();
        e.0 += u as f64;
        e.1 += c.capacity as f64;
    }
    g.into_iter()
        .map(|(k, (u, c))| (k, (u / c) / mean - 1.0))
        .collect()
}

/// Heal fan-out after losing the fullest node of the largest capacity
/// (see [`HealFigures`]); `placed` holds `k + m` node ids per blob.
pub fn heal(
    o: &PlacementSimOptions,
    nodes: &[SimNode],
    used: &[u64],
    placed: &[u64],
    shard_bytes: u64,
) -> HealFigures {
    let (k, m) = (o.data_shards, o.parity_shards);
    let n = k + m;
    let lost = nodes
        .iter()
        .zip(used)
        .max_by_key(|(c, u)| (c.capacity, **u, std::cmp::Reverse(c.id)))
        .map(|(c, _)| c.id)
        .expect("a shape has nodes");
    let views: Vec<NodeView> = nodes
        .iter()
        .zip(used)
        .map(|(c, &u)| {
            let free = c.capacity.saturating_sub(u);
            NodeView {
                id: c.id,
                live: c.id != lost,
                writable: free >= shard_bytes,
                zone: c.zone.clone(),
                host: String::new(),
                free_bytes: free,
                draining: false,
            }
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(o.seed ^ 0x6865_616c);
    let mut reads = vec![0u64; nodes.len()];
    let mut writes = vec![0u64; nodes.len()];
    let (mut lost_shards, mut unplaced) = (0, 0);
    for blob in placed.chunks(n) {
        let Some(i) = blob.iter().position(|&id| id == lost) else {
            continue;
        };
        lost_shards += 1;
        let p = Placement {
            blob_id: new_blob_id(1, rng.r#gen()),
            size: shard_bytes * k as u64,
            data_shards: k as u32,
            parity_shards: m as u32,
            block_size: 1 << 20,
            nodes: blob.to_vec(),
            missing: vec![i as u32],
        };
        match rebuild::choose_targets(&p, &views) {
            Ok(targets) => {
                for (_, t) in targets {
                    writes[t as usize - 1] += 1;
                }
            }
            Err(_) => unplaced += 1,
        }
        for &src in blob.iter().filter(|&&id| id != lost).take(k) {
            reads[src as usize - 1] += 1;
        }
    }
    let count = |v: &[u64]| v.iter().filter(|&&x| x > 0).count();
    let busiest = reads
        .iter()
        .zip(&writes)
        .map(|(r, w)| r + w)
        .max()
        .unwrap_or(0);
    let l = lost_shards.max(1) as f64;
    let d = o.heal_node_tb * TB;
    let r = o.node_heal_rate.as_u64().max(1) as f64;
    let g = (o.gateway_heal_rate.as_u64().max(1) * u64::from(o.gateways.max(1))) as f64;
    HealFigures {
        lost_node: lost,
        lost_tb: nodes[lost as usize - 1].capacity as f64 / TB,
        lost_shards,
        unplaced,
        readers: count(&reads),
        writers: count(&writes),
        busiest_share: busiest as f64 / l,
        hours_nodes: d * busiest as f64 / l / r / 3600.0,
        hours_ideal: d * (k + 1) as f64 / ((nodes.len() - 1) as f64 * r) / 3600.0,
        hours_gateways: d / g / 3600.0,
    }
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", x * 100.0)
}

/// The report as markdown: the parameters, then one table per measure.
pub fn render(o: &PlacementSimOptions, shapes: &[ShapeReport]) -> String {
    let mut s = String::new();
    let caps: Vec<String> = o.capacities_tb.iter().map(|c| format!("{c}")).collect();
    let _ = writeln!(
        s,
        "placement-sim: k+m = {}+{}, {} blobs per shape, capacities {} TB ({}), seed {}, \
         free bytes refreshed every {} blobs\n",
        o.data_shards,
        o.parity_shards,
        o.blobs,
        caps.join("/"),
        if o.even_zones {
            "the same mix in every zone"
        } else {
            "drawn per node"
        },
        o.seed,
        o.refresh_blobs,
    );
    s.push_str("Fill: each node's fill relative to the cluster's\n\n");
    s.push_str(
        "| nodes | zones | weights | blobs | cluster fill | max dev | σ dev | noise σ | mean dev by capacity (TB) | worst zone |\n\
         |---:|---:|---|---:|---:|---:|---:|---:|---|---|\n",
    );
    for r in shapes {
        for f in &r.fill {
            let by: Vec<String> = f
                .by_capacity
                .iter()
                .map(|(c, d)| format!("{c}: {}", pct(*d)))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} % | {} | {:.2} % | {:.2} % | {} | {} {} |",
                r.nodes,
                r.zones,
                f.weights,
                f.blobs,
                f.cluster_fill * 100.0,
                pct(f.max_dev),
                f.sd_dev * 100.0,
                f.noise_sd * 100.0,
                by.join(", "),
                f.worst_zone.0,
                pct(f.worst_zone.1),
            );
        }
    }
    s.push_str(
        "\nMovement: share of all shards that change node (frozen weights)\n\n\
         | nodes | zones | add one node: moved | its share (optimum) | 1/N | remove node 1: moved | its share (optimum) | 1/N |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in shapes {
        let mv = &r.moves;
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} % ({} TB) | {:.3} % | {:.3} % | {:.3} % ({} TB) | {:.3} % | {:.3} % |",
            r.nodes,
            r.zones,
            mv.add_moved * 100.0,
            mv.added_tb,
            mv.add_optimum * 100.0,
            100.0 / (r.nodes + 1) as f64,
            mv.remove_moved * 100.0,
            mv.removed_tb,
            mv.remove_optimum * 100.0,
            100.0 / r.nodes as f64,
        );
    }
    let _ = writeln!(
        s,
        "\nHeal fan-out: the fullest largest node lost after the live fill; hours to re-protect \
         {} TB at {:.0} MB/s per datanode (reads + writes), and at {} gateways × {:.0} MiB/s\n",
        o.heal_node_tb,
        o.node_heal_rate.as_u64() as f64 / 1e6,
        o.gateways,
        o.gateway_heal_rate.as_u64() as f64 / (1024.0 * 1024.0),
    );
    s.push_str(
        "| nodes | zones | lost node | lost shards | nodes read | nodes written | busiest node's share | hours (datanodes) | hours (ideal) | hours (gateway gate) |\n\
         |---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in shapes {
        let h = &r.heal;
        let unplaced = if h.unplaced > 0 {
            format!(" ({} without target)", h.unplaced)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} ({} TB) | {}{} | {} | {} | {:.3} | {:.2} | {:.2} | {:.1} |",
            r.nodes,
            r.zones,
            h.lost_node,
            h.lost_tb,
            h.lost_shards,
            unplaced,
            h.readers,
            h.writers,
            h.busiest_share,
            h.hours_nodes,
            h.hours_ideal,
            h.hours_gateways,
        );
    }
    s.push_str(
        "\nhours (datanodes) = D · max_j(reads_j + writes_j) / L / r; hours (ideal) = D · (k+1) / ((N−1) · r); \
         hours (gateway gate) = D / (G · g); D = lost shard bytes, L = lost shards, r = per-node heal rate, \
         G = gateways, g = heal_bandwidth_bytes_per_sec. Re-protection takes the larger of the first and the last.\n",
    );
    s
}

#[cfg(test)]
mod tests;
