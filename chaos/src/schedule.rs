//! The seeded fault schedule: which fault, on what, when, for how long.
//!
//! Same seed and options → same schedule (rand's `StdRng`, ChaCha12, from
//! the seed; stable for one Cargo.lock). Targets that exist only at run time
//! (the meta leader) are named by their role in the schedule and resolved
//! when the fault starts; the run's fault log records what was hit.
//!
//! Every enabled kind occurs at least once per run (in a seeded order),
//! then further faults are drawn at random until the fault window is
//! filled; faults overlap (combined faults) when they fit the cluster's
//! failure budget: at most one meta node, one gateway and two datanodes
//! impaired at a time. Beyond that budget the cluster is not expected to
//! stay available (3 voters tolerate 1; 3+2 erasure coding with write
//! quorum 4 tolerates 2 datanodes), only safe, and a schedule that made it
//! unavailable would test nothing but timeouts.

use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A fault kind (`--faults` names, kebab-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `kill -9` of a datanode, restarted when the fault ends.
    KillDatanode,
    /// `kill -9` of the meta leader, restarted when the fault ends.
    KillMetaLeader,
    /// `kill -9` of a meta follower, restarted when the fault ends.
    KillMetaFollower,
    /// `kill -9` of a gateway, restarted when the fault ends.
    KillGateway,
    /// SIGSTOP of a gateway (a GC pause / VM freeze) while a write holds
    /// its stripe buffers (its shards streaming, its metadata commit not
    /// yet made), SIGCONT when the fault ends.
    PauseGateway,
    /// SIGSTOP / SIGCONT of the meta leader.
    PauseMetaLeader,
    /// A storage host (two datanodes) cut off the network.
    PartitionHost,
    /// The meta leader cut off from both followers (not from gateways and
    /// datanodes).
    IsolateMetaLeader,
    /// A gateway that reaches meta but not the datanodes of one host.
    PartitionGatewayDatanodes,
    /// Random packet loss into a storage host (iptables `statistic`).
    PacketLoss,
    /// Latency, jitter and a bandwidth cap on the links to a datanode (the
    /// fault proxy's toxics).
    SlowLink,
    /// A datanode's disk throttled (cgroup v1 blkio) to a few MiB/s.
    SlowDisk,
    /// A datanode's volume filled to the last byte (a ballast file).
    FullDisk,
    /// A datanode killed and restarted with an empty data dir.
    WipeDisk,
    /// A byte flipped in one of a datanode's shard files (bitrot).
    Bitrot,
    /// A process restarted with its wall clock 1 to 60 minutes ahead or
    /// behind (libfaketime, realtime only; half of the draws exactly an
    /// hour), and restarted on the true clock when the fault ends.
    ClockJump,
    /// SIGSTOP of three datanodes, one per storage host (more than the
    /// parity count), for longer than `node_down_after` plus audit
    /// passes, then SIGCONT: past the failure budget, alone in its window.
    PauseDatanodesPastDownAfter,
    /// Two storage hosts (four datanodes) cut off the meta nodes (iptables
    /// DROP; gateways still reach them) for as long as
    /// [`FaultKind::PauseDatanodesPastDownAfter`]; alone in its window.
    PartitionDatanodesFromMeta,
    /// Every disk read of two datanodes fails with EIO for longer than a
    /// scrub interval (`strace --inject` on their positioned reads).
    DiskReadErrors,
    /// Extra clients overwrite a few `storm/` keys back to back, against
    /// the reclaimer; the meta leader's pending deletions are sampled.
    OverwriteStorm,
    /// A client GETs a large object slowly, for longer than
    /// `delete_delay`, while another overwrites and deletes it.
    SlowReaderOverwrite,
    /// Every process restarted, one at a time, from the previous release
    /// (`--old-sluice-bin`) onto this one: meta followers, the meta leader,
    /// datanodes, gateways. When the fault ends the upgrade is finalized
    /// (`sluice admin version finalize`) and a feature of the new cluster
    /// version is used. Alone in its window; not part of `all`.
    RollingUpgrade,
    /// The meta nodes, half of the datanodes and one gateway upgraded as
    /// in [`FaultKind::RollingUpgrade`], then, before finalizing, every
    /// upgraded process rolled back to the previous release. Alone in its
    /// window; not part of `all`.
    UpgradeRollback,
}

/// The kinds that need the previous release's binary
/// (`--old-sluice-bin`): named one by one, never part of `all`.
pub const UPGRADES: &[FaultKind] = &[FaultKind::RollingUpgrade, FaultKind::UpgradeRollback];

/// Every kind of `all`, in declaration order.
pub const ALL: &[FaultKind] = &[
    FaultKind::KillDatanode,
    FaultKind::KillMetaLeader,
    FaultKind::KillMetaFollower,
    FaultKind::KillGateway,
    FaultKind::PauseGateway,
    FaultKind::PauseMetaLeader,
    FaultKind::PartitionHost,
    FaultKind::IsolateMetaLeader,
    FaultKind::PartitionGatewayDatanodes,
    FaultKind::PacketLoss,
    FaultKind::SlowLink,
    FaultKind::SlowDisk,
    FaultKind::FullDisk,
    FaultKind::WipeDisk,
    FaultKind::Bitrot,
    FaultKind::ClockJump,
    FaultKind::PauseDatanodesPastDownAfter,
    FaultKind::PartitionDatanodesFromMeta,
    FaultKind::DiskReadErrors,
    FaultKind::OverwriteStorm,
    FaultKind::SlowReaderOverwrite,
];

impl FaultKind {
    /// The `--faults` name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillDatanode => "kill-datanode",
            FaultKind::KillMetaLeader => "kill-meta-leader",
            FaultKind::KillMetaFollower => "kill-meta-follower",
            FaultKind::KillGateway => "kill-gateway",
            FaultKind::PauseGateway => "pause-gateway",
            FaultKind::PauseMetaLeader => "pause-meta-leader",
            FaultKind::PartitionHost => "partition-host",
            FaultKind::IsolateMetaLeader => "isolate-meta-leader",
            FaultKind::PartitionGatewayDatanodes => "partition-gateway-datanodes",
            FaultKind::PacketLoss => "packet-loss",
            FaultKind::SlowLink => "slow-link",
            FaultKind::SlowDisk => "slow-disk",
            FaultKind::FullDisk => "full-disk",
            FaultKind::WipeDisk => "wipe-disk",
            FaultKind::Bitrot => "bitrot",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::PauseDatanodesPastDownAfter => "pause-datanodes-past-down-after",
            FaultKind::PartitionDatanodesFromMeta => "partition-datanodes-from-meta",
            FaultKind::DiskReadErrors => "disk-read-errors",
            FaultKind::OverwriteStorm => "overwrite-storm",
            FaultKind::SlowReaderOverwrite => "slow-reader-overwrite",
            FaultKind::RollingUpgrade => "rolling-upgrade",
            FaultKind::UpgradeRollback => "upgrade-rollback",
        }
    }

    /// Past the failure budget (more than the parity count of datanodes
    /// out): only safety is checked while it lasts.
    pub fn beyond_budget(self) -> bool {
        matches!(
            self,
            FaultKind::PauseDatanodesPastDownAfter | FaultKind::PartitionDatanodesFromMeta
        )
    }

    /// Runs alone in its window: the kinds past the failure budget, and
    /// the upgrades (which restart every process in turn).
    pub fn exclusive(self) -> bool {
        matches!(
            self,
            FaultKind::PauseDatanodesPastDownAfter
                | FaultKind::PartitionDatanodesFromMeta
                | FaultKind::RollingUpgrade
                | FaultKind::UpgradeRollback
        )
    }

    /// Needs the previous release's binary ([`UPGRADES`]).
    pub fn upgrade(self) -> bool {
        UPGRADES.contains(&self)
    }

    /// A length fixed by the cluster's timers instead of drawn from the
    /// run's fault durations.
    pub fn fixed_duration(self) -> Option<Duration> {
        use crate::cluster::SCRUB_INTERVAL;
        use crate::cluster::{AUDIT_INTERVAL, DELETE_DELAY, NODE_DOWN_AFTER, RECLAIM_INTERVAL};
        match self {
            // Long enough to be declared down and for two audits to report
            // every shard of the paused nodes missing.
            FaultKind::PauseDatanodesPastDownAfter | FaultKind::PartitionDatanodesFromMeta => {
                Some(NODE_DOWN_AFTER + 2 * AUDIT_INTERVAL)
            }
            // A scrub pass starts (or is running) within the window.
            FaultKind::DiskReadErrors => Some(SCRUB_INTERVAL * 3 / 2),
            // Twice the delay, so the pending deletions reach their
            // steady state under the storm.
            FaultKind::OverwriteStorm => Some(2 * DELETE_DELAY),
            // The slow GET (delete_delay + 5 reclaimer passes) and one
            // more pass.
            FaultKind::SlowReaderOverwrite => Some(slow_read_duration() + RECLAIM_INTERVAL),
            // The restarts themselves take longer (each process waits for
            // the one before it to be ready); the mixed-version cluster
            // then serves this long before it is finalized or rolled back.
            FaultKind::RollingUpgrade | FaultKind::UpgradeRollback => Some(UPGRADE_HOLD),
            _ => None,
        }
    }

    /// A workload phase, not an impairment: it fits any budget.
    pub fn workload_phase(self) -> bool {
        matches!(
            self,
            FaultKind::OverwriteStorm | FaultKind::SlowReaderOverwrite
        )
    }

    /// Damage that outlives the fault until heal restores it.
    pub fn permanent(self) -> bool {
        matches!(self, FaultKind::WipeDisk | FaultKind::Bitrot)
    }

    /// Whether a leader election follows (recovery time is measured).
    pub fn hits_leader(self) -> bool {
        matches!(
            self,
            FaultKind::KillMetaLeader | FaultKind::PauseMetaLeader | FaultKind::IsolateMetaLeader
        )
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ALL.iter()
            .chain(UPGRADES)
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault kind `{s}` (known: all, {})",
                    names().join(", ")
                )
            })
    }
}

/// Every kind's name.
pub fn names() -> Vec<&'static str> {
    ALL.iter().chain(UPGRADES).map(|k| k.name()).collect()
}

/// How long an upgraded (or half-upgraded) cluster serves before it is
/// finalized (or rolled back), from the fault's start.
pub const UPGRADE_HOLD: Duration = Duration::from_secs(20);

/// Parses `--faults`: `all` or a comma list of kinds.
///
/// # Errors
/// An unknown name.
pub fn parse_kinds(s: &str) -> Result<Vec<FaultKind>, String> {
    if s == "all" {
        return Ok(ALL.to_vec());
    }
    let mut kinds = s
        .split(',')
        .map(|p| p.trim().parse())
        .collect::<Result<Vec<FaultKind>, _>>()?;
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return Err("no fault kinds".into());
    }
    Ok(kinds)
}

/// What a fault hits, fixed by the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "name")]
pub enum Target {
    /// A datanode (`dn1`..`dn6`).
    Datanode(String),
    /// A storage host (`s1`..`s3`).
    Host(String),
    /// A gateway (`g1`, `g2`).
    Gateway(String),
    /// A gateway and the storage host it loses.
    GatewayHost(String, String),
    /// The meta leader when the fault starts.
    MetaLeader,
    /// A meta follower when the fault starts (the first non-leader from
    /// `m<n>` on).
    MetaFollower(u64),
    /// Any process, for clock jumps.
    Process(String),
    /// Several datanodes.
    Datanodes(Vec<String>),
    /// Several storage hosts.
    Hosts(Vec<String>),
    /// The workload itself (a workload phase).
    Workload,
    /// Every process (an upgrade).
    Cluster,
}

/// How long the slow reader's GET lasts: `delete_delay` and five
/// reclaimer passes. The old version's blobs are due `delete_delay` after
/// the overwrite, sampled and reclaimed within two more passes (50 s); the
/// GET's last parts (opened only when the read reaches them, some MiB
/// ahead of the client through the gateway's and the sockets' buffers)
/// come well after that, so they would be gone if nothing protected them.
pub fn slow_read_duration() -> Duration {
    crate::cluster::DELETE_DELAY + 5 * crate::cluster::RECLAIM_INTERVAL
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fault {
    /// Number in the schedule.
    pub n: usize,
    /// Kind.
    pub kind: FaultKind,
    /// What it hits.
    pub target: Target,
    /// Start, from the workload's start.
    #[serde(with = "humantime_serde_ms")]
    pub at: Duration,
    /// How long until it is healed.
    #[serde(with = "humantime_serde_ms")]
    pub duration: Duration,
    /// Kind-specific strength: loss per mille, latency ms, bandwidth KiB/s,
    /// disk bytes/s, clock offset seconds (signed, as i64 in `param2`).
    pub param: u64,
    /// Second parameter (jitter ms; clock offset sign: 0 forward, 1 back).
    pub param2: u64,
}

mod humantime_serde_ms {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl Fault {
    /// When it ends, from the workload's start.
    pub fn end(&self) -> Duration {
        self.at + self.duration
    }

    /// One line for logs and failure reports.
    pub fn describe(&self) -> String {
        format!(
            "#{} {} on {:?} at {:.1}s for {:.1}s (param {}, {})",
            self.n,
            self.kind,
            self.target,
            self.at.as_secs_f64(),
            self.duration.as_secs_f64(),
            self.param,
            self.param2
        )
    }

    /// Impairment it puts on the cluster: (meta nodes, gateways, datanodes).
    fn load(&self) -> (usize, usize, Vec<String>) {
        let host_dns = |h: &str| {
            let n: u64 = h[1..].parse().unwrap_or(1);
            vec![format!("dn{}", 2 * n - 1), format!("dn{}", 2 * n)]
        };
        match &self.target {
            Target::MetaLeader | Target::MetaFollower(_) => (1, 0, vec![]),
            Target::Gateway(_) => (0, 1, vec![]),
            Target::Datanode(d) => (0, 0, vec![d.clone()]),
            Target::Host(h) => (0, 0, host_dns(h)),
            // Only one gateway loses the host; the other keeps all six.
            Target::GatewayHost(_, h) => (0, 1, host_dns(h)),
            Target::Process(p) if p.starts_with('m') => (1, 0, vec![]),
            Target::Process(p) if p.starts_with('g') => (0, 1, vec![]),
            Target::Process(p) => (0, 0, vec![p.clone()]),
            Target::Datanodes(d) => (0, 0, d.clone()),
            Target::Hosts(hs) => (0, 0, hs.iter().flat_map(|h| host_dns(h)).collect()),
            Target::Workload | Target::Cluster => (0, 0, vec![]),
        }
    }
}

/// Schedule shape.
#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    /// Kinds to draw from.
    pub kinds: Vec<FaultKind>,
    /// Workload duration; faults start after `warmup` and end by
    /// `duration - cooldown`.
    pub duration: Duration,
    /// Fault-free time at the start.
    pub warmup: Duration,
    /// Fault-free time at the end (all faults healed).
    pub cooldown: Duration,
    /// Shortest and longest fault.
    pub fault_duration: (Duration, Duration),
    /// Mean gap between fault starts.
    pub mean_gap: Duration,
}

/// Draws the schedule for `seed`.
pub fn schedule(seed: u64, opts: &ScheduleOptions) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let window_end = opts.duration.saturating_sub(opts.cooldown);
    let mut first: Vec<FaultKind> = opts.kinds.clone();
    first.shuffle(&mut rng);
    // Permanent kinds first (stable: the rest keep their seeded order):
    // each needs HEAL_ALLOWANCE clear of the other, which a late start
    // would not leave room for.
    // Then the kinds past the budget, which need a window of their own.
    first.sort_by_key(|k| (!k.permanent(), !k.exclusive()));
    let mut faults: Vec<Fault> = Vec::new();
    let mut t = opts.warmup;
    let mut attempts = 0;
    while t < window_end && attempts < 10_000 {
        attempts += 1;
        let (lo, hi) = opts.fault_duration;
        let mut duration =
            Duration::from_millis(rng.gen_range(lo.as_millis() as u64..=hi.as_millis() as u64));
        if t + duration > window_end {
            duration = window_end.saturating_sub(t);
        }
        if duration < lo / 2 {
            break;
        }
        // The kinds not yet scheduled, in their seeded order (the first
        // that fits the budget now); then (or when none of them fits yet)
        // any kind at random.
        // While a kind past the budget is still to come, only it and the
        // permanent kinds are tried: anything else would fill its window.
        let exclusive_due = first.iter().any(|k| k.exclusive());
        let mut candidates: Vec<Option<usize>> = (0..first.len())
            .filter(|i| !exclusive_due || first[*i].exclusive() || first[*i].permanent())
            .map(Some)
            .collect();
        if !exclusive_due {
            candidates.push(None);
        }
        let mut placed = None;
        for ci in candidates {
            let kind = match ci {
                Some(i) => first[i],
                None => {
                    // While a kind is still to come, no random permanent
                    // fault may take the 90 s it needs.
                    let pool: Vec<FaultKind> = opts
                        .kinds
                        .iter()
                        .copied()
                        .filter(|k| (first.is_empty() || !k.permanent()) && !k.exclusive())
                        .collect();
                    if pool.is_empty() {
                        continue;
                    }
                    pool[rng.gen_range(0..pool.len())]
                }
            };
            let fault = draw(&mut rng, faults.len() + 1, kind, t, duration);
            if fault.end() <= window_end && fits(&faults, &fault) {
                placed = Some((ci, fault));
                break;
            }
        }
        match placed {
            Some((ci, fault)) => {
                if let Some(i) = ci {
                    first.remove(i);
                }
                faults.push(fault);
                let gap = rng.gen_range(
                    opts.mean_gap.as_millis() as u64 / 2..=opts.mean_gap.as_millis() as u64 * 3 / 2,
                );
                t += Duration::from_millis(gap.max(500));
            }
            // Try again a little later, when something has healed.
            None => t += Duration::from_secs(1),
        }
    }
    faults
}

fn draw(rng: &mut StdRng, n: usize, kind: FaultKind, at: Duration, duration: Duration) -> Fault {
    let duration = kind.fixed_duration().unwrap_or(duration);
    let pick_dn = |rng: &mut StdRng| format!("dn{}", rng.gen_range(1..=6));
    let pick_host = |rng: &mut StdRng| format!("s{}", rng.gen_range(1..=3));
    let pick_gw = |rng: &mut StdRng| format!("g{}", rng.gen_range(1..=2));
    let (target, param, param2) = match kind {
        FaultKind::KillDatanode | FaultKind::WipeDisk | FaultKind::Bitrot | FaultKind::FullDisk => {
            (Target::Datanode(pick_dn(rng)), 0, 0)
        }
        FaultKind::SlowDisk => (
            Target::Datanode(pick_dn(rng)),
            rng.gen_range(1..=4) << 20,
            0,
        ),
        FaultKind::SlowLink => (
            Target::Datanode(pick_dn(rng)),
            rng.gen_range(20..=300),
            // Bandwidth cap, KiB/s; jitter is a third of the latency.
            rng.gen_range(512..=8192),
        ),
        FaultKind::KillMetaLeader | FaultKind::PauseMetaLeader | FaultKind::IsolateMetaLeader => {
            (Target::MetaLeader, 0, 0)
        }
        FaultKind::KillMetaFollower => (Target::MetaFollower(rng.gen_range(1..=3)), 0, 0),
        FaultKind::KillGateway | FaultKind::PauseGateway => (Target::Gateway(pick_gw(rng)), 0, 0),
        FaultKind::PartitionHost => (Target::Host(pick_host(rng)), 0, 0),
        FaultKind::PartitionGatewayDatanodes => {
            let g = pick_gw(rng);
            (Target::GatewayHost(g, pick_host(rng)), 0, 0)
        }
        FaultKind::PacketLoss => (Target::Host(pick_host(rng)), rng.gen_range(50..=300), 0),
        FaultKind::ClockJump => {
            let who = match rng.gen_range(0..3) {
                0 => pick_dn(rng),
                1 => pick_gw(rng),
                _ => format!("m{}", rng.gen_range(1..=3)),
            };
            // 1 to 60 minutes, forward or back, half of the draws a whole
            // hour: past S3's 15-minute signature skew (a gateway that far
            // off refuses every request: an outage of one gateway), within
            // the 2 hours that cluster certificates are backdated (further
            // back and the node only sees "certificate not yet valid": a
            // partition, tested elsewhere).
            let secs = if rng.gen_bool(0.5) {
                60 * 60
            } else {
                rng.gen_range(60..=60 * 60)
            };
            (Target::Process(who), secs, rng.gen_range(0..=1))
        }
        FaultKind::PauseDatanodesPastDownAfter => {
            // One datanode of each host: parity + 1 out, across every zone.
            let dns = (1..=3u64)
                .map(|h| format!("dn{}", 2 * h - rng.gen_range(0..=1)))
                .collect();
            (Target::Datanodes(dns), 0, 0)
        }
        FaultKind::PartitionDatanodesFromMeta => {
            let kept = rng.gen_range(1..=3u64);
            let hosts = (1..=3u64)
                .filter(|h| *h != kept)
                .map(|h| format!("s{h}"))
                .collect();
            (Target::Hosts(hosts), 0, 0)
        }
        FaultKind::DiskReadErrors => {
            // Two datanodes on two different hosts.
            let a = rng.gen_range(1..=3u64);
            let b = (a + rng.gen_range(1..=2u64) - 1) % 3 + 1;
            let dns = [a, b]
                .iter()
                .map(|h| format!("dn{}", 2 * h - rng.gen_range(0..=1)))
                .collect();
            (Target::Datanodes(dns), 0, 0)
        }
        FaultKind::OverwriteStorm | FaultKind::SlowReaderOverwrite => (Target::Workload, 0, 0),
        FaultKind::RollingUpgrade | FaultKind::UpgradeRollback => (Target::Cluster, 0, 0),
    };
    Fault {
        n,
        kind,
        target,
        at,
        duration,
        param,
        param2,
    }
}

/// Time the heal needs to restore what a datanode fault left degraded
/// (missed writes, a wiped disk, a rotten shard): detection (an audit or a
/// scrub interval of the run's cluster) plus rebuild.
pub const HEAL_ALLOWANCE: Duration = Duration::from_secs(90);

/// Whether `f` fits the failure budget beside the faults active at its start.
fn fits(faults: &[Fault], f: &Fault) -> bool {
    // Permanent damage (a wiped disk, a rotten shard) outlives its window
    // until heal restores it. A write acknowledged at quorum k+1 while a
    // datanode was out has one shard to spare (3+2: 4 written, 3 needed),
    // so two permanent faults less than HEAL_ALLOWANCE apart could destroy
    // data Sluice never promised to keep; they are kept that far apart.
    let permanent = |g: &Fault| g.kind.permanent();
    if permanent(f)
        && faults.iter().any(|g| {
            permanent(g) && g.at < f.end() + HEAL_ALLOWANCE && f.at < g.end() + HEAL_ALLOWANCE
        })
    {
        return false;
    }
    let active: Vec<&Fault> = faults
        .iter()
        .filter(|g| g.at < f.end() && f.at < g.end())
        .collect();
    // A fault past the budget shares its window with workload phases only.
    if active.iter().any(|g| {
        (f.kind.exclusive() && !g.kind.workload_phase())
            || (g.kind.exclusive() && !f.kind.workload_phase())
    }) {
        return false;
    }
    let (mut meta, mut gw, mut dns) = f.load();
    for g in &active {
        let (m, w, d) = g.load();
        meta += m;
        gw += w;
        dns.extend(d);
    }
    dns.sort();
    dns.dedup();
    // Two faults on one process at once would heal each other's effects.
    let same_process = active
        .iter()
        .any(|g| g.target == f.target || overlap_target(g, f));
    meta <= 1 && gw <= 1 && (dns.len() <= 2 || f.kind.exclusive()) && !same_process
}

fn overlap_target(a: &Fault, b: &Fault) -> bool {
    let (_, _, da) = a.load();
    let (_, _, db) = b.load();
    da.iter().any(|d| db.contains(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kinds: Vec<FaultKind>) -> ScheduleOptions {
        ScheduleOptions {
            kinds,
            duration: Duration::from_secs(300),
            warmup: Duration::from_secs(10),
            cooldown: Duration::from_secs(30),
            fault_duration: (Duration::from_secs(5), Duration::from_secs(25)),
            mean_gap: Duration::from_secs(10),
        }
    }

    #[test]
    fn same_seed_same_schedule_other_seed_other_schedule() {
        let o = opts(ALL.to_vec());
        assert_eq!(schedule(7, &o), schedule(7, &o));
        assert_ne!(schedule(7, &o), schedule(8, &o));
    }

    #[test]
    fn every_kind_occurs_and_faults_stay_in_the_window_and_budget() {
        for seed in 0..40 {
            let mut o = opts(ALL.to_vec());
            // Every kind, including two minute-long ones past the budget.
            o.duration = Duration::from_secs(600);
            // The run's default gap on odd seeds.
            if seed % 2 == 1 {
                o.mean_gap = Duration::from_secs(12);
            }
            let s = schedule(seed, &o);
            for k in ALL {
                assert!(s.iter().any(|f| f.kind == *k), "seed {seed}: {k} missing");
            }
            for f in &s {
                assert!(
                    f.at >= o.warmup && f.end() <= o.duration - o.cooldown,
                    "{}",
                    f.describe()
                );
                let active: Vec<Fault> = s
                    .iter()
                    .filter(|g| g.n != f.n && g.at < f.end() && f.at < g.end() && g.n < f.n)
                    .cloned()
                    .collect();
                assert!(
                    fits(&active, f),
                    "seed {seed}: {} over budget",
                    f.describe()
                );
            }
            // Permanent faults are HEAL_ALLOWANCE apart.
            for a in s
                .iter()
                .filter(|f| matches!(f.kind, FaultKind::WipeDisk | FaultKind::Bitrot))
            {
                for b in s.iter().filter(|f| {
                    f.n > a.n && matches!(f.kind, FaultKind::WipeDisk | FaultKind::Bitrot)
                }) {
                    assert!(
                        b.at >= a.end() + HEAL_ALLOWANCE,
                        "seed {seed}: {} then {}",
                        a.describe(),
                        b.describe()
                    );
                }
            }
            // Some faults are combined (overlap in time).
            assert!(
                s.iter().any(|f| s
                    .iter()
                    .any(|g| g.n != f.n && g.at < f.end() && f.at < g.end())),
                "seed {seed}: no overlap"
            );
        }
    }

    #[test]
    fn a_fault_past_the_budget_runs_alone_for_its_timers() {
        let short = [
            FaultKind::KillMetaLeader,
            FaultKind::KillDatanode,
            FaultKind::PartitionHost,
            FaultKind::PauseGateway,
            FaultKind::WipeDisk,
            FaultKind::Bitrot,
            FaultKind::PauseDatanodesPastDownAfter,
        ];
        for seed in 0..40 {
            let mut o = opts(short.to_vec());
            o.duration = Duration::from_secs(240);
            o.warmup = Duration::from_secs(15);
            o.fault_duration = (Duration::from_secs(5), Duration::from_secs(15));
            o.mean_gap = Duration::from_secs(12);
            let s = schedule(seed, &o);
            let ex: Vec<&Fault> = s.iter().filter(|f| f.kind.exclusive()).collect();
            assert!(!ex.is_empty(), "seed {seed}: not scheduled");
            for f in ex {
                assert_eq!(
                    Some(f.duration),
                    FaultKind::PauseDatanodesPastDownAfter.fixed_duration()
                );
                let Target::Datanodes(d) = &f.target else {
                    panic!("{}", f.describe())
                };
                assert_eq!(d.len(), 3, "parity + 1");
                assert!(
                    s.iter()
                        .all(|g| g.n == f.n || g.end() <= f.at || g.at >= f.end()),
                    "seed {seed}: {} overlapped",
                    f.describe()
                );
            }
        }
    }

    #[test]
    fn kinds_parse_and_unknown_names_are_refused() {
        assert_eq!(parse_kinds("all").unwrap().len(), ALL.len());
        assert_eq!(
            parse_kinds("bitrot,kill-datanode").unwrap(),
            vec![FaultKind::KillDatanode, FaultKind::Bitrot]
        );
        assert!(
            parse_kinds("kill-everything")
                .unwrap_err()
                .contains("unknown fault kind")
        );
    }

    #[test]
    fn budget_refuses_a_third_datanode_and_a_second_meta_fault() {
        let host = draw(
            &mut StdRng::seed_from_u64(1),
            1,
            FaultKind::PartitionHost,
            Duration::ZERO,
            Duration::from_secs(10),
        );
        let Target::Host(h) = &host.target else {
            panic!()
        };
        let n: u64 = h[1..].parse().unwrap();
        let other = format!("dn{}", if n == 3 { 1 } else { 2 * n + 1 });
        let third = Fault {
            n: 2,
            kind: FaultKind::KillDatanode,
            target: Target::Datanode(other),
            at: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            param: 0,
            param2: 0,
        };
        assert!(!fits(std::slice::from_ref(&host), &third));
        let leader = Fault {
            n: 3,
            kind: FaultKind::KillMetaLeader,
            target: Target::MetaLeader,
            at: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            param: 0,
            param2: 0,
        };
        assert!(fits(std::slice::from_ref(&host), &leader));
        let follower = Fault {
            n: 4,
            kind: FaultKind::KillMetaFollower,
            target: Target::MetaFollower(1),
            at: Duration::from_secs(2),
            duration: Duration::from_secs(5),
            param: 0,
            param2: 0,
        };
        assert!(!fits(&[host, leader], &follower));
    }
}
