//! Injecting and healing the faults of [`crate::schedule`] on a running
//! [`Cluster`].
//!
//! | kind | how | healed by |
//! |---|---|---|
//! | kill-* | SIGKILL (`kill -9`) | starting it again on the same data |
//! | pause-* | SIGSTOP | SIGCONT |
//! | partition-host | the host's veth on the bridge set down | set up |
//! | isolate-meta-leader | iptables DROP to/from both followers' addresses in the leader's namespace | rules deleted |
//! | partition-gateway-datanodes | iptables DROP to/from one storage host in the gateway's namespace | rules deleted |
//! | packet-loss | iptables `statistic --mode random` DROP in and out of a storage host's eth0 | rules deleted |
//! | slow-link | fault-proxy toxics: latency, jitter (a third of it), bandwidth cap | toxics cleared |
//! | slow-disk | cgroup v1 `blkio.throttle.{read,write}_bps_device` on the volume's loop device | back to the root cgroup |
//! | full-disk | a ballast file taking every free block of the volume | ballast removed |
//! | wipe-disk | SIGKILL, data dir emptied, started again at once | (heal rebuilds its shards) |
//! | bitrot | one byte flipped in one shard file | (scrub or read repair) |
//! | clock-jump | restarted under libfaketime, realtime ± 1..60 min | restarted on the true clock |
//! | pause-datanodes-past-down-after | SIGSTOP of one datanode per host, past `node_down_after` + 2 audits | SIGCONT |
//! | partition-datanodes-from-meta | iptables DROP to/from the meta nodes in two storage hosts' namespaces | rules deleted |
//! | disk-read-errors | `strace --inject` failing every positioned read (`pread64`, `preadv`, `preadv2`) of two datanodes with EIO | strace interrupted (it detaches); scrub's counters checked |
//! | overwrite-storm, slow-reader-overwrite | workload phases (the workload runs them at their times) | (nothing) |
//! | rolling-upgrade | every process stopped (SIGTERM) and started on this release, one at a time: meta followers, meta leader, datanodes, gateways; the new version's commands must be refused | `sluice admin version finalize`, then a new-version command must succeed |
//! | upgrade-rollback | the meta nodes, one datanode per host and one gateway upgraded the same way | each restarted on the previous release, before finalizing |

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cluster::{Cluster, ns_sh, sh};
use crate::history::now_us;
use crate::proxy::{Toxics, write_control};
use crate::schedule::{Fault, FaultKind, Target};

/// What undoes an injected fault.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case", tag = "undo")]
pub enum Undo {
    /// Start the process again.
    Restart {
        /// Node name.
        name: String,
    },
    /// SIGCONT.
    Continue {
        /// Node name.
        name: String,
    },
    /// Bring the host's bridge link back.
    LinkUp {
        /// Host name.
        host: String,
    },
    /// Delete these iptables rules (each an `-I` rule, deleted with `-D`).
    Iptables {
        /// Namespace.
        ns: String,
        /// Rules, as given after `-I`.
        rules: Vec<Vec<String>>,
    },
    /// Clear the datanode's proxy toxics.
    ClearToxics {
        /// Node name.
        name: String,
    },
    /// Lift the disk throttle.
    Unthrottle {
        /// Node name.
        name: String,
    },
    /// Remove the ballast file.
    RemoveBallast {
        /// Its path.
        path: PathBuf,
    },
    /// Restart on the true clock.
    RestartTrueClock {
        /// Node name.
        name: String,
    },
    /// Stop the read-error injectors and check what scrub did meanwhile.
    ReadErrorsOff {
        /// Datanode names.
        names: Vec<String>,
        /// The injecting strace processes.
        injectors: Vec<u32>,
        /// Their scrub counters when the flags were made.
        before: Vec<ScrubCounters>,
    },
    /// Finalize the upgrade (`sluice admin version finalize`) and use a
    /// feature of the new cluster version.
    Finalize,
    /// Restart these processes on the previous release, in this order.
    Downgrade {
        /// Node names.
        names: Vec<String>,
    },
    /// Several undos, each tried.
    Many {
        /// In order.
        undos: Vec<Undo>,
    },
    /// Nothing to undo.
    Nothing,
}

/// A datanode's scrub counters (its metrics endpoint).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ScrubCounters {
    /// `sluice_datanode_scrub_read_errors_total`.
    pub read_errors: u64,
    /// `sluice_datanode_scrub_corrupt_shards_total`.
    pub corrupt: u64,
    /// `sluice_datanode_scrub_shards_total`.
    pub shards: u64,
}

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// The scheduled fault.
    pub fault: Fault,
    /// What it hit, resolved at run time (`m2 (leader)`, `dn3`, ...).
    pub hit: String,
    /// Injected at (CLOCK_MONOTONIC µs).
    pub start_us: u64,
    /// Healed at (CLOCK_MONOTONIC µs); 0 while active.
    pub end_us: u64,
    /// How to heal it.
    pub undo: Undo,
    /// An error injecting or healing it, if any.
    pub error: Option<String>,
}

/// The leader's name, asking a few times (there may be an election on).
async fn leader(cluster: &Cluster) -> Option<String> {
    for _ in 0..10 {
        if let Some(l) = cluster.leader().await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

fn ipt(ns: &str, op: &str, rule: &[String]) -> anyhow::Result<()> {
    let mut args: Vec<&str> = vec!["iptables", "-w", op];
    args.extend(rule.iter().map(String::as_str));
    ns_sh(ns, &args).map(|_| ())
}

/// Inserts every rule or none: on an error the ones inserted are deleted.
fn insert_all(ns: &str, rules: &[Vec<String>]) -> anyhow::Result<()> {
    for (i, r) in rules.iter().enumerate() {
        if let Err(e) = ipt(ns, "-I", r) {
            for done in &rules[..i] {
                let _ = ipt(ns, "-D", done);
            }
            return Err(e);
        }
    }
    Ok(())
}

fn rules_drop_between(peer_ips: &[String]) -> Vec<Vec<String>> {
    let mut rules = Vec::new();
    for ip in peer_ips {
        rules.push(vec![
            "INPUT".into(),
            "-s".into(),
            ip.clone(),
            "-j".into(),
            "DROP".into(),
        ]);
        rules.push(vec![
            "OUTPUT".into(),
            "-d".into(),
            ip.clone(),
            "-j".into(),
            "DROP".into(),
        ]);
    }
    rules
}

/// Injects `fault`.
///
/// # Errors
/// The fault could not be put in place (the event is still returned by the
/// caller's bookkeeping with the error).
pub async fn inject(cluster: &mut Cluster, fault: &Fault) -> anyhow::Result<(String, Undo)> {
    match (fault.kind, &fault.target) {
        (FaultKind::KillDatanode, Target::Datanode(n))
        | (FaultKind::KillGateway, Target::Gateway(n)) => {
            cluster.kill9(n).await?;
            Ok((n.clone(), Undo::Restart { name: n.clone() }))
        }
        (FaultKind::KillMetaLeader, _) => {
            let l = leader(cluster).await.context("no meta leader to kill")?;
            cluster.kill9(&l).await?;
            Ok((format!("{l} (leader)"), Undo::Restart { name: l }))
        }
        (FaultKind::KillMetaFollower, Target::MetaFollower(from)) => {
            let l = leader(cluster)
                .await
                .context("no meta leader known: no follower to pick")?;
            let f = (0..3)
                .map(|i| format!("m{}", (from - 1 + i) % 3 + 1))
                .find(|m| *m != l)
                .expect("a follower");
            cluster.kill9(&f).await?;
            Ok((format!("{f} (follower)"), Undo::Restart { name: f }))
        }
        (FaultKind::PauseGateway, Target::Gateway(n)) => {
            // Land the pause while the gateway holds write buffers: a
            // write is between its shard streams and its metadata commit.
            let held = write_in_flight(cluster, n).await;
            cluster.signal(n, Signal::SIGSTOP)?;
            let what = match held {
                Some(bytes) => format!("{n} (paused holding {bytes} write-buffer bytes)"),
                None => format!("{n} (paused with no write seen in flight within 5 s)"),
            };
            Ok((what, Undo::Continue { name: n.clone() }))
        }
        (FaultKind::PauseMetaLeader, _) => {
            let l = leader(cluster).await.context("no meta leader to pause")?;
            cluster.signal(&l, Signal::SIGSTOP)?;
            Ok((format!("{l} (leader)"), Undo::Continue { name: l }))
        }
        (FaultKind::PartitionHost, Target::Host(h)) => {
            let veth = format!("v{}", cluster.hosts[h].idx);
            ns_sh(&cluster.bridge_ns, &["ip", "link", "set", &veth, "down"])?;
            Ok((h.clone(), Undo::LinkUp { host: h.clone() }))
        }
        (FaultKind::IsolateMetaLeader, _) => {
            let l = leader(cluster).await.context("no meta leader to isolate")?;
            let peers: Vec<String> = ["m1", "m2", "m3"]
                .iter()
                .filter(|m| **m != l)
                .map(|m| cluster.hosts[*m].ip.clone())
                .collect();
            let ns = cluster.hosts[&l].ns.clone();
            let rules = rules_drop_between(&peers);
            insert_all(&ns, &rules)?;
            Ok((format!("{l} (leader)"), Undo::Iptables { ns, rules }))
        }
        (FaultKind::PartitionGatewayDatanodes, Target::GatewayHost(g, h)) => {
            let ns = cluster.hosts[g].ns.clone();
            let rules = rules_drop_between(&[cluster.hosts[h].ip.clone()]);
            insert_all(&ns, &rules)?;
            Ok((format!("{g} -/- {h}"), Undo::Iptables { ns, rules }))
        }
        (FaultKind::PacketLoss, Target::Host(h)) => {
            let ns = cluster.hosts[h].ns.clone();
            let p = format!("{:.3}", fault.param as f64 / 1000.0);
            // Only the host's link (eth0): the proxy -> datanode hop on
            // loopback stays lossless, so the loss rate is the link's.
            let rules: Vec<Vec<String>> = [("INPUT", "-i"), ("OUTPUT", "-o")]
                .iter()
                .map(|(chain, dir)| {
                    [
                        *chain,
                        dir,
                        "eth0",
                        "-p",
                        "tcp",
                        "-m",
                        "statistic",
                        "--mode",
                        "random",
                        "--probability",
                        &p,
                        "-j",
                        "DROP",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
                })
                .collect();
            insert_all(&ns, &rules)?;
            Ok((
                format!("{h} loss {}‰", fault.param),
                Undo::Iptables { ns, rules },
            ))
        }
        (FaultKind::SlowLink, Target::Datanode(n)) => {
            let control = cluster.node(n).proxy_control.clone().context("no proxy")?;
            let toxics = Toxics {
                latency_ms: fault.param,
                jitter_ms: fault.param / 3,
                bandwidth_bytes_per_sec: Some(fault.param2 * 1024),
                down: false,
            };
            write_control(&control, &toxics)?;
            Ok((
                format!(
                    "{n} +{} ms ±{} ms, {} KiB/s",
                    fault.param,
                    fault.param / 3,
                    fault.param2
                ),
                Undo::ClearToxics { name: n.clone() },
            ))
        }
        (FaultKind::SlowDisk, Target::Datanode(n)) => {
            cluster.throttle_disk(n, fault.param)?;
            Ok((
                format!("{n} disk {} B/s", fault.param),
                Undo::Unthrottle { name: n.clone() },
            ))
        }
        (FaultKind::FullDisk, Target::Datanode(n)) => {
            let vol = cluster.node(n).volume.clone().context("no volume")?;
            let ballast = vol.join("ballast");
            fill(&vol, &ballast)?;
            Ok((n.clone(), Undo::RemoveBallast { path: ballast }))
        }
        (FaultKind::WipeDisk, Target::Datanode(n)) => {
            cluster.kill9(n).await?;
            let data = cluster.node(n).data_dir.clone();
            let wiped = std::fs::remove_dir_all(&data)
                .and_then(|()| std::fs::create_dir_all(&data))
                .with_context(|| format!("wiping {}", data.display()));
            // Started again either way: a failed wipe is a harness error,
            // not a datanode left down.
            cluster.start(n, None)?;
            wiped?;
            Ok((n.clone(), Undo::Nothing))
        }
        (FaultKind::Bitrot, Target::Datanode(n)) => {
            let data = cluster.node(n).data_dir.clone();
            let what = flip_a_byte(&data, fault.n as u64)?;
            Ok((format!("{n}: {what}"), Undo::Nothing))
        }
        (FaultKind::ClockJump, Target::Process(p)) => {
            let sign = if fault.param2 == 0 { "+" } else { "-" };
            let offset = format!("{sign}{}", fault.param);
            cluster.kill9(p).await?;
            cluster.start(p, Some(&offset))?;
            Ok((
                format!("{p} clock {offset} s"),
                Undo::RestartTrueClock { name: p.clone() },
            ))
        }
        (FaultKind::PauseDatanodesPastDownAfter, Target::Datanodes(dns)) => {
            let mut undos = Vec::new();
            for n in dns {
                if let Err(e) = cluster.signal(n, Signal::SIGSTOP) {
                    for u in &undos {
                        let _ = Box::pin(heal(cluster, u)).await;
                    }
                    return Err(e);
                }
                undos.push(Undo::Continue { name: n.clone() });
            }
            Ok((dns.join(","), Undo::Many { undos }))
        }
        (FaultKind::PartitionDatanodesFromMeta, Target::Hosts(hosts)) => {
            let metas: Vec<String> = ["m1", "m2", "m3"]
                .iter()
                .map(|m| cluster.hosts[*m].ip.clone())
                .collect();
            let rules = rules_drop_between(&metas);
            let mut undos = Vec::new();
            for h in hosts {
                let ns = cluster.hosts[h].ns.clone();
                if let Err(e) = insert_all(&ns, &rules) {
                    for u in &undos {
                        let _ = Box::pin(heal(cluster, u)).await;
                    }
                    return Err(e);
                }
                undos.push(Undo::Iptables {
                    ns,
                    rules: rules.clone(),
                });
            }
            Ok((
                format!("{} -/- meta", hosts.join(",")),
                Undo::Many { undos },
            ))
        }
        (FaultKind::DiskReadErrors, Target::Datanodes(dns)) => {
            let mut before = Vec::new();
            for n in dns {
                before.push(
                    scrub_counters(cluster, n)
                        .await
                        .with_context(|| format!("{n}'s scrub metrics"))?,
                );
            }
            let mut injectors = Vec::new();
            for n in dns {
                match inject_read_errors(cluster, n).await {
                    Ok(pid) => injectors.push(pid),
                    Err(e) => {
                        stop_injectors(&injectors);
                        return Err(e);
                    }
                }
            }
            Ok((
                format!("{} reads fail with EIO", dns.join(",")),
                Undo::ReadErrorsOff {
                    names: dns.clone(),
                    injectors,
                    before,
                },
            ))
        }
        (FaultKind::OverwriteStorm | FaultKind::SlowReaderOverwrite, Target::Workload) => {
            Ok(("the workload".into(), Undo::Nothing))
        }
        (FaultKind::RollingUpgrade, Target::Cluster) => {
            let order = upgrade_order(cluster, &datanodes(cluster), &gateways(cluster)).await?;
            let new = cluster.opts.bin.clone();
            for n in &order {
                restart_on(cluster, n, &new).await?;
            }
            // Every process runs the new release, but until the upgrade is
            // finalized the cluster speaks the previous release's format:
            // the new version's commands are refused.
            expect_not_finalized(cluster).await?;
            Ok((format!("upgraded {}", order.join(",")), Undo::Finalize))
        }
        (FaultKind::UpgradeRollback, Target::Cluster) => {
            // Every meta node, one datanode of each host, one gateway.
            let dns: Vec<String> = datanodes(cluster).into_iter().step_by(2).collect();
            let gws: Vec<String> = gateways(cluster).into_iter().take(1).collect();
            let order = upgrade_order(cluster, &dns, &gws).await?;
            let new = cluster.opts.bin.clone();
            let mut done = Vec::new();
            for n in &order {
                if let Err(e) = restart_on(cluster, n, &new).await {
                    done.push(n.clone());
                    done.reverse();
                    let _ = Box::pin(heal(cluster, &Undo::Downgrade { names: done })).await;
                    return Err(e);
                }
                done.push(n.clone());
            }
            expect_not_finalized(cluster).await?;
            done.reverse();
            Ok((
                format!("upgraded {}", order.join(",")),
                Undo::Downgrade { names: done },
            ))
        }
        (kind, target) => bail!("fault {kind} cannot hit {target:?}"),
    }
}

/// Polls the gateway's `sluice_gateway_buffer_bytes_in_use` gauge (from
/// the client namespace, every 50 ms, up to 5 s) until a write holds
/// buffers; the bytes held, or `None`.
async fn write_in_flight(cluster: &Cluster, name: &str) -> Option<u64> {
    let url = format!("{}/metrics", cluster.metrics_url(name));
    let ns = cluster.hosts["client"].ns.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        let out = tokio::process::Command::new("ip")
            .args(["netns", "exec", &ns, "curl", "-sf", "--max-time", "1", &url])
            .output()
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(v) = gauge(&text, "sluice_gateway_buffer_bytes_in_use")
            && v > 0.0
        {
            return Some(v as u64);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Attaches `strace` to every thread of datanode `name` (and the threads
/// it starts), failing each positioned read with EIO: the datanode reads
/// shard files only with `pread64`/`preadv2` (raw syscalls through
/// rustix, which an `LD_PRELOAD` library would not see), and sockets never
/// with them, so only its disk reads fail. This kernel has no
/// device-mapper or fault injection to fail the device itself. Returns
/// strace's pid once it has attached.
async fn inject_read_errors(cluster: &Cluster, name: &str) -> anyhow::Result<u32> {
    let pid = cluster.node(name).pid.context("not running")?;
    let log = cluster
        .opts
        .dir
        .join("logs")
        .join(format!("{name}.strace.log"));
    let calls = "pread64,preadv,preadv2";
    let child = std::process::Command::new("strace")
        .args(["-f", "-qq", "-p", &pid.to_string()])
        .arg(format!("--trace={calls}"))
        .arg(format!("--inject={calls}:error=EIO"))
        .arg("-o")
        .arg(&log)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting strace")?;
    let spid = child.id();
    // Reaped by stop_injectors (waitpid), not by the Child.
    std::mem::forget(child);
    // Attached once strace traces every thread of the process.
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))?.count();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let traced = std::fs::read_dir(format!("/proc/{pid}/task"))?
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("status")).is_ok_and(|s| {
                    s.lines()
                        .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
                })
            })
            .count();
        if traced >= threads {
            return Ok(spid);
        }
        if tokio::time::Instant::now() >= deadline {
            stop_injectors(&[spid]);
            bail!("strace attached to {traced} of {threads} threads of {name} within 5 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Interrupts the injecting straces (they detach, the reads succeed again)
/// and reaps them.
fn stop_injectors(pids: &[u32]) {
    for pid in pids {
        let pid = nix::unistd::Pid::from_raw(*pid as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGINT);
        let _ = nix::sys::wait::waitpid(pid, None);
    }
}

/// `name`'s metrics page, fetched from the client namespace.
pub async fn metrics_text(cluster: &Cluster, name: &str) -> Option<String> {
    let url = format!("{}/metrics", cluster.metrics_url(name));
    let ns = cluster.hosts["client"].ns.clone();
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns, "curl", "-sf", "--max-time", "2", &url])
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sum over every label set of a metric (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = match rest.strip_prefix('{') {
                Some(r) => &r[r.find('}')? + 1..],
                None => rest,
            };
            rest.strip_prefix(' ')?.trim().parse::<f64>().ok()
        })
        .sum()
}

async fn scrub_counters(cluster: &Cluster, name: &str) -> anyhow::Result<ScrubCounters> {
    let text = metrics_text(cluster, name)
        .await
        .context("metrics endpoint did not answer")?;
    Ok(ScrubCounters {
        read_errors: metric_sum(&text, "sluice_datanode_scrub_read_errors_total") as u64,
        corrupt: metric_sum(&text, "sluice_datanode_scrub_corrupt_shards_total") as u64,
        shards: metric_sum(&text, "sluice_datanode_scrub_shards_total") as u64,
    })
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Undoes an injected fault.
///
/// # Errors
/// The undo step failed.
pub async fn heal(cluster: &mut Cluster, undo: &Undo) -> anyhow::Result<()> {
    match undo {
        Undo::Restart { name } => {
            if !cluster.running(name) {
                cluster.start(name, None)?;
            }
        }
        Undo::Continue { name } => cluster.signal(name, Signal::SIGCONT)?,
        Undo::LinkUp { host } => {
            let veth = format!("v{}", cluster.hosts[host].idx);
            ns_sh(&cluster.bridge_ns, &["ip", "link", "set", &veth, "up"])?;
        }
        Undo::Iptables { ns, rules } => {
            // Every rule is tried; the first error is reported.
            let results: Vec<anyhow::Result<()>> = rules.iter().map(|r| ipt(ns, "-D", r)).collect();
            results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        }
        Undo::ClearToxics { name } => {
            let control = cluster
                .node(name)
                .proxy_control
                .clone()
                .context("no proxy")?;
            write_control(&control, &Toxics::default())?;
        }
        Undo::Unthrottle { name } => cluster.unthrottle_disk(name),
        Undo::RemoveBallast { path } => std::fs::remove_file(path)?,
        Undo::RestartTrueClock { name } => {
            cluster.kill9(name).await?;
            cluster.start(name, None)?;
        }
        Undo::ReadErrorsOff {
            names,
            injectors,
            before,
        } => {
            stop_injectors(injectors);
            // Scrub must have met the errors and quarantined nothing for
            // them: an I/O error is no evidence of damage.
            let mut problems = Vec::new();
            for (n, b) in names.iter().zip(before) {
                let after = scrub_counters(cluster, n)
                    .await
                    .with_context(|| format!("{n}'s scrub metrics"))?;
                tracing::info!(node = %n, ?b, ?after, "scrub counters across the read errors");
                if after.corrupt > b.corrupt {
                    problems.push(format!(
                        "{n}: scrub quarantined {} shards on EIO",
                        after.corrupt - b.corrupt
                    ));
                }
                if after.read_errors <= b.read_errors {
                    problems.push(format!(
                        "{n}: scrub counted no read error while reads failed (scrub did not run in the window)"
                    ));
                }
            }
            if !problems.is_empty() {
                bail!("{}", problems.join("; "));
            }
        }
        Undo::Many { undos } => {
            let mut errors = Vec::new();
            for u in undos {
                if let Err(e) = Box::pin(heal(cluster, u)).await {
                    errors.push(format!("{e:#}"));
                }
            }
            if !errors.is_empty() {
                bail!("{}", errors.join("; "));
            }
        }
        Undo::Finalize => {
            let out = cluster.admin(&["version", "finalize"]).await?;
            tracing::info!(output = %out.trim(), "upgrade finalized");
            // A command of the new cluster version is accepted now.
            cluster
                .admin(&["settings", "set", "--epoch-lease", UPGRADE_PROBE_LEASE])
                .await
                .context("a new-version command after finalizing")?;
        }
        Undo::Downgrade { names } => {
            let old = cluster
                .opts
                .old_bin
                .clone()
                .context("no previous-release binary")?;
            for n in names {
                restart_on(cluster, n, &old).await?;
            }
        }
        Undo::Nothing => {}
    }
    Ok(())
}

/// The epoch lease the upgrade faults set to probe the new cluster
/// version: the default, so the cluster's behaviour does not change.
const UPGRADE_PROBE_LEASE: &str = "30s";

fn datanodes(cluster: &Cluster) -> Vec<String> {
    cluster.names(crate::cluster::Role::Datanode)
}

fn gateways(cluster: &Cluster) -> Vec<String> {
    cluster.names(crate::cluster::Role::Gateway)
}

/// The order of a rolling upgrade: the meta followers, then the meta
/// leader (so the leadership moves once, to an upgraded node), then
/// `datanodes`, then `gateways`.
async fn upgrade_order(
    cluster: &Cluster,
    datanodes: &[String],
    gateways: &[String],
) -> anyhow::Result<Vec<String>> {
    let l = leader(cluster)
        .await
        .context("no meta leader known: cannot order the upgrade")?;
    let mut order: Vec<String> = cluster
        .names(crate::cluster::Role::Meta)
        .into_iter()
        .filter(|m| *m != l)
        .collect();
    order.push(l);
    order.extend_from_slice(datanodes);
    order.extend_from_slice(gateways);
    Ok(order)
}

/// Stops `name` (SIGTERM, as an operator's service manager does), starts
/// it on `bin` and waits until it is ready; a meta node, until a leader
/// is known again.
async fn restart_on(cluster: &mut Cluster, name: &str, bin: &Path) -> anyhow::Result<()> {
    tracing::info!(node = name, bin = %bin.display(), "restarting on another release");
    cluster.stop(name, Duration::from_secs(15)).await;
    cluster.set_bin(name, bin);
    cluster.start(name, None)?;
    cluster
        .wait_ready(&[name.to_owned()], Duration::from_secs(120))
        .await?;
    if cluster.node(name).role == crate::cluster::Role::Meta {
        leader(cluster)
            .await
            .with_context(|| format!("no meta leader after restarting {name}"))?;
    }
    Ok(())
}

/// Checks that the upgrade is not finalized: a command of the new
/// cluster version is refused, saying so.
async fn expect_not_finalized(cluster: &Cluster) -> anyhow::Result<()> {
    match cluster
        .admin(&["settings", "set", "--epoch-lease", UPGRADE_PROBE_LEASE])
        .await
    {
        Ok(out) => bail!("a new-version command was accepted before finalizing: {out}"),
        Err(e) if format!("{e:#}").contains("finalize") => Ok(()),
        Err(e) => Err(e.context("a new-version command before finalizing")),
    }
}

/// Injects, recording the event (an injection error is recorded, not
/// returned: the run goes on).
pub async fn inject_event(cluster: &mut Cluster, fault: &Fault) -> Event {
    let result = inject(cluster, fault).await;
    // Stamped once the fault is in place (finding the leader first may take
    // seconds, during which writes still go to a healthy leader).
    let start_us = now_us();
    let (hit, undo, error) = match result {
        Ok((hit, undo)) => (hit, undo, None),
        Err(e) => (String::new(), Undo::Nothing, Some(format!("{e:#}"))),
    };
    tracing::info!(fault = %fault.describe(), %hit, error = ?error, "fault injected");
    Event {
        fault: fault.clone(),
        hit,
        start_us,
        end_us: 0,
        undo,
        error,
    }
}

/// Heals an event, recording the time and any error.
pub async fn heal_event(cluster: &mut Cluster, event: &mut Event) {
    if let Err(e) = heal(cluster, &event.undo).await {
        let msg = format!("heal: {e:#}");
        tracing::warn!(fault = %event.fault.describe(), error = %msg, "heal failed");
        event.error = Some(
            event
                .error
                .take()
                .map_or(msg.clone(), |p| format!("{p}; {msg}")),
        );
    }
    event.end_us = now_us();
    tracing::info!(fault = %event.fault.describe(), "fault healed");
}

/// Fills the filesystem of `vol` with `ballast` (every free block).
fn fill(vol: &Path, ballast: &Path) -> anyhow::Result<()> {
    let avail = sh(&["df", "-B1", "--output=avail", &vol.display().to_string()])?;
    let avail: u64 = avail.lines().nth(1).context("df output")?.trim().parse()?;
    // fallocate takes what is free; a last few blocks may stay (metadata).
    let mut len = avail;
    while len > 0 {
        if sh(&[
            "fallocate",
            "-l",
            &len.to_string(),
            &ballast.display().to_string(),
        ])
        .is_ok()
        {
            return Ok(());
        }
        len = len.saturating_sub(4 << 20);
    }
    bail!("could not fill {}", vol.display())
}

/// Flips one byte of one shard file under `data` (the files sorted, one
/// picked with `seed`; a byte past the file's first 64 bytes so that the
/// damage is in block data, which the block CRC guards).
fn flip_a_byte(data: &Path, seed: u64) -> anyhow::Result<String> {
    let mut files = Vec::new();
    walk(&data.join("shards"), &mut files);
    files.retain(|(_, len)| *len > 4096);
    files.sort();
    if files.is_empty() {
        bail!("no shard files under {}", data.display());
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let (path, len) = files[rng.gen_range(0..files.len())].clone();
    let offset = rng.gen_range(64..len);
    let mut bytes = std::fs::read(&path)?;
    bytes[offset as usize] ^= 0x5a;
    std::fs::write(&path, &bytes)?;
    Ok(format!(
        "{} byte {offset} flipped",
        path.strip_prefix(data).unwrap_or(&path).display()
    ))
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if md.is_dir() {
            walk(&e.path(), out);
        } else if md.is_file() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') && !name.contains("tmp") {
                out.push((e.path(), md.len()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauge_reads_the_named_unlabelled_value() {
        let text = "# TYPE sluice_gateway_buffer_bytes_in_use gauge\nsluice_gateway_buffer_bytes_in_use_max 9\nsluice_gateway_buffer_bytes_in_use 3145728\n";
        assert_eq!(
            gauge(text, "sluice_gateway_buffer_bytes_in_use"),
            Some(3_145_728.0)
        );
        assert_eq!(gauge(text, "sluice_gateway_inflight_requests"), None);
    }

    #[test]
    fn a_flipped_byte_lands_in_a_shard_file_past_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let shards = dir.path().join("shards").join("ab");
        std::fs::create_dir_all(&shards).unwrap();
        let original = vec![7u8; 10_000];
        std::fs::write(shards.join("blob.0"), &original).unwrap();
        std::fs::write(shards.join("small.1"), [1u8; 100]).unwrap();
        let what = flip_a_byte(dir.path(), 3).unwrap();
        assert!(what.contains("blob.0"), "{what}");
        let after = std::fs::read(shards.join("blob.0")).unwrap();
        let diff: Vec<usize> = (0..after.len())
            .filter(|i| after[*i] != original[*i])
            .collect();
        assert_eq!(diff.len(), 1);
        assert!(diff[0] >= 64);
        assert_eq!(
            std::fs::read(shards.join("small.1")).unwrap(),
            vec![1u8; 100]
        );
    }
}
