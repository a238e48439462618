//! The chaos cluster: 3 meta nodes, 6 datanodes on 3 storage hosts and 2
//! gateways, each a separate `sluice` process, each host its own Linux
//! network namespace on a private bridge, cluster mTLS and S3 over HTTPS
//! as in production (deploy/vm/README.md is the same layout by hand).
//!
//! ```text
//!  bridge namespace <id>-br: br0, one veth per host (v1..v9)
//!  m1..m3  10.0.0.11-13   meta (7001; metrics 7091)
//!  s1..s3  10.0.0.21-23   datanodes 2h-1 and 2h: fault proxy on :7101/:7102
//!                          -> datanode on 127.0.0.1:17101/17102; metrics 7191/7192
//!  g1, g2  10.0.0.31-32   gateways (S3 HTTPS :9000; metrics 9090), 3+2, write quorum 4
//!  client  10.0.0.100     the workload and `sluice admin`
//! ```
//!
//! Every datanode's data dir is its own loop-mounted XFS image (sparse,
//! [`VOLUME_BYTES`]), so a full disk or a throttled device is one
//! datanode's. Each datanode is reached only through its fault proxy
//! ([`crate::proxy`]), so latency and bandwidth toxics apply to every
//! connection to it. Everything (processes, mounts, loop devices,
//! namespaces, cgroups) is removed by [`Cluster::cleanup`], also on failure.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use sluice_harness::cluster::{self, Launch, NotReady};

/// Size of each datanode's sparse XFS image. The datanodes' reserved free
/// space is set to [`RESERVED_FREE_BYTES`].
pub const VOLUME_BYTES: u64 = 3 << 30;
/// `reserved_free_bytes` of every datanode.
pub const RESERVED_FREE_BYTES: u64 = 64 << 20;
/// Memory budgets written into every config (the RSS bound of a process is
/// its baseline plus its role's budgets plus [`RSS_SLACK_BYTES`]).
pub const GATEWAY_BUFFER_BUDGET: u64 = 64 << 20;
/// Gateway read budget.
pub const GATEWAY_READ_BUDGET: u64 = 32 << 20;
/// Datanode write budget.
pub const DATANODE_WRITE_BUDGET: u64 = 32 << 20;
/// Meta sled cache.
pub const META_SLED_CACHE: u64 = 32 << 20;
/// What no budget counts: TLS sessions, connection buffers, allocator
/// fragmentation after restarts, sled's growth with the data (the soak's
/// 4 MiB slack is for a steady load without faults or restarts).
pub const RSS_SLACK_BYTES: u64 = 64 << 20;
/// Election timeout of the meta nodes (min, max).
pub const ELECTION_TIMEOUT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(2));
/// Gateways' `node_down_after`: a datanode silent this long is down.
pub const NODE_DOWN_AFTER: Duration = Duration::from_secs(20);
/// Gateways' `audit_interval`.
pub const AUDIT_INTERVAL: Duration = Duration::from_secs(20);
/// Gateways' `heal_interval`.
pub const HEAL_INTERVAL: Duration = Duration::from_secs(5);
/// Datanodes' `scrub_interval`: bitrot is found within the run (the scrub
/// reads at its default 10 MiB/s), so settling includes healing it.
pub const SCRUB_INTERVAL: Duration = Duration::from_secs(30);
/// Datanodes' `gc_interval`.
pub const GC_INTERVAL: Duration = Duration::from_secs(30);
/// Datanodes' `gc_grace`.
pub const GC_GRACE: Duration = Duration::from_secs(60);
/// Meta's `delete_delay`: deleted blobs are reclaimed soon, so the small
/// volumes do not fill.
pub const DELETE_DELAY: Duration = Duration::from_secs(30);
/// Meta's `reclaim_interval`.
pub const RECLAIM_INTERVAL: Duration = Duration::from_secs(10);
/// Gateways' `read_lease_after`: well below [`DELETE_DELAY`] (a quarter of
/// it), as `docs/design/durability.md` §4 requires, so a slow GET leases
/// the blobs it reads long before the reclaimer may take them. The
/// gateway's default (1 min) is above the chaos `delete_delay`.
pub const READ_LEASE_AFTER: Duration = Duration::from_millis(DELETE_DELAY.as_millis() as u64 / 4);
/// S3 root key of the gateways.
pub const ACCESS_KEY: &str = "SLUICECHAOSKEY";
/// S3 root secret of the gateways.
pub const SECRET_KEY: &str = "sluice-chaos-secret-0123456789abcdef";

/// A role of the `sluice` binary (the soak benchmark's type).
pub use sluice_harness::cluster::Role;

/// The sum of the budgets written into `role`'s config, bytes.
pub fn budget_bytes(role: Role) -> u64 {
    match role {
        Role::Meta => META_SLED_CACHE,
        Role::Datanode => DATANODE_WRITE_BUDGET,
        Role::Gateway => GATEWAY_BUFFER_BUDGET + GATEWAY_READ_BUDGET,
    }
}

/// A host: a network namespace with one address on the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// Short name (`m1`, `s2`, `g1`, `client`).
    pub name: String,
    /// Namespace name.
    pub ns: String,
    /// Its address.
    pub ip: String,
    /// Index of its veth on the bridge (`v<idx>`).
    pub idx: usize,
}

/// One `sluice` process.
#[derive(Debug)]
pub struct Node {
    /// `m1`..`m3`, `dn1`..`dn6`, `g1`, `g2`.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Meta and datanode id (gateways: 0).
    pub id: u64,
    /// Host name (key of [`Cluster::hosts`]).
    pub host: String,
    /// Main port on the host's address (for a datanode: its proxy's).
    pub port: u16,
    /// Metrics and health port.
    pub metrics_port: u16,
    /// Config file.
    pub config: PathBuf,
    /// Data dir (meta, datanode).
    pub data_dir: PathBuf,
    /// Datanode: the mount point of its XFS volume (data dir is `<volume>/data`).
    pub volume: Option<PathBuf>,
    /// Datanode: the loop device of its volume.
    pub loop_dev: Option<String>,
    /// Datanode: the proxy's control file.
    pub proxy_control: Option<PathBuf>,
    /// The `sluice` binary it runs (the previous release's until an
    /// upgrade fault restarts it on this one).
    pub bin: PathBuf,
    /// Log file (appended across restarts).
    pub log: PathBuf,
    /// RSS right after the cluster became ready, bytes.
    pub baseline_rss: Option<u64>,
    /// The running process.
    pub child: Option<Child>,
    /// Its pid while running.
    pub pid: Option<u32>,
    /// Datanode: its proxy process.
    pub proxy: Option<Child>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `sluice` binary (also the one `sluice admin` and the health
    /// probes run).
    pub bin: PathBuf,
    /// The previous release's `sluice` binary: every process starts on it
    /// (the upgrade faults move them to [`ClusterOptions::bin`]).
    pub old_bin: Option<PathBuf>,
    /// The `sluice-chaos` binary (for the proxies).
    pub chaos_bin: PathBuf,
    /// Run directory (configs, data images, logs).
    pub dir: PathBuf,
    /// Prefix of namespace names (short: veth and netns names are short).
    pub prefix: String,
    /// RUST_LOG of the processes.
    pub log_filter: String,
}

/// A running chaos cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Options it was started with.
    pub opts: ClusterOptions,
    /// Hosts by name.
    pub hosts: BTreeMap<String, Host>,
    /// The bridge's namespace.
    pub bridge_ns: String,
    /// Processes, in start order: m1..m3, dn1..dn6, g1, g2.
    pub nodes: Vec<Node>,
    /// Cluster CA directory.
    pub pki: PathBuf,
    /// CA bundle the S3 clients trust.
    pub s3_ca: PathBuf,
    /// Namespaces made (deleted at cleanup).
    namespaces: Vec<String>,
    /// Mount points made.
    mounts: Vec<PathBuf>,
    /// cgroup directories made.
    cgroups: Vec<PathBuf>,
}

/// Runs a command to completion; its stdout, or an error with stderr.
pub fn sh(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command inside a namespace.
pub fn ns_sh(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["ip", "netns", "exec", ns];
    all.extend_from_slice(args);
    sh(&all)
}

/// The tools a run needs on PATH.
pub const TOOLS: &[&str] = &[
    "ip",
    "iptables",
    "mkfs.xfs",
    "losetup",
    "mount",
    "umount",
    "fallocate",
];

/// Checks root and [`TOOLS`].
///
/// # Errors
/// What is missing.
pub fn preflight() -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("sluice-chaos needs root (network namespaces, loop mounts, iptables, cgroups)");
    }
    for tool in TOOLS {
        if sh(&["sh", "-c", &format!("command -v {tool}")]).is_err() {
            bail!("sluice-chaos needs `{tool}` on PATH");
        }
    }
    Ok(())
}

impl Cluster {
    /// The namespaces, certificates, configs and volumes; nothing started.
    ///
    /// # Errors
    /// Any setup command failing (the partial setup is removed).
    pub fn setup(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(opts.dir.join("logs"))?;
        let mut c = Cluster {
            bridge_ns: format!("{}-br", opts.prefix),
            pki: opts.dir.join("pki"),
            s3_ca: opts.dir.join("s3pki").join("ca.pem"),
            opts,
            hosts: BTreeMap::new(),
            nodes: Vec::new(),
            namespaces: Vec::new(),
            mounts: Vec::new(),
            cgroups: Vec::new(),
        };
        if let Err(e) = c.setup_inner() {
            c.cleanup_sync();
            return Err(e);
        }
        Ok(c)
    }

    fn setup_inner(&mut self) -> anyhow::Result<()> {
        sh(&["ip", "netns", "add", &self.bridge_ns])?;
        self.namespaces.push(self.bridge_ns.clone());
        ns_sh(
            &self.bridge_ns,
            &["ip", "link", "add", "br0", "type", "bridge"],
        )?;
        ns_sh(&self.bridge_ns, &["ip", "link", "set", "br0", "up"])?;
        let layout = [
            ("m1", "10.0.0.11"),
            ("m2", "10.0.0.12"),
            ("m3", "10.0.0.13"),
            ("s1", "10.0.0.21"),
            ("s2", "10.0.0.22"),
            ("s3", "10.0.0.23"),
            ("g1", "10.0.0.31"),
            ("g2", "10.0.0.32"),
            ("client", "10.0.0.100"),
        ];
        for (idx, (name, ip)) in layout.iter().enumerate() {
            let host = Host {
                name: name.to_string(),
                ns: format!("{}-{name}", self.opts.prefix),
                ip: ip.to_string(),
                idx: idx + 1,
            };
            self.add_host_ns(&host)?;
            self.hosts.insert(name.to_string(), host);
        }

        let bin = self.opts.bin.display().to_string();
        let pki = self.pki.display().to_string();
        let s3pki = self.opts.dir.join("s3pki").display().to_string();
        sh(&[&bin, "admin", "certs", "init", "--dir", &pki])?;
        sh(&[&bin, "admin", "certs", "init", "--dir", &s3pki])?;
        sh(&[
            &bin,
            "admin",
            "certs",
            "issue",
            "--dir",
            &s3pki,
            "--role",
            "gateway",
            "--id",
            "s3",
            "--ip",
            "10.0.0.31",
            "--ip",
            "10.0.0.32",
            "--dns",
            "s3.chaos.test",
        ])?;
        sh(&[
            &bin, "admin", "certs", "issue", "--dir", &pki, "--role", "admin", "--id", "chaos",
        ])?;

        for id in 1..=3u64 {
            self.plan_meta(id)?;
        }
        for id in 1..=6u64 {
            self.plan_datanode(id)?;
        }
        for id in 1..=2u64 {
            self.plan_gateway(id)?;
        }
        Ok(())
    }

    fn add_host_ns(&mut self, host: &Host) -> anyhow::Result<()> {
        sh(&["ip", "netns", "add", &host.ns])?;
        self.namespaces.push(host.ns.clone());
        ns_sh(&host.ns, &["ip", "link", "set", "lo", "up"])?;
        let veth = format!("v{}", host.idx);
        ns_sh(
            &self.bridge_ns,
            &[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                &host.ns,
            ],
        )?;
        ns_sh(
            &self.bridge_ns,
            &["ip", "link", "set", &veth, "master", "br0", "up"],
        )?;
        ns_sh(
            &host.ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", host.ip),
                "dev",
                "eth0",
            ],
        )?;
        ns_sh(&host.ns, &["ip", "link", "set", "eth0", "up"])?;
        Ok(())
    }

    fn issue(&self, role: &str, id: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let bin = self.opts.bin.display().to_string();
        let pki = self.pki.display().to_string();
        sh(&[
            &bin, "admin", "certs", "issue", "--dir", &pki, "--role", role, "--id", id,
        ])?;
        Ok((
            self.pki.join(format!("{role}-{id}.pem")),
            self.pki.join(format!("{role}-{id}.key")),
        ))
    }

    fn tls_table(&self, role: &str, id: &str) -> anyhow::Result<toml::Table> {
        let (cert, key) = self.issue(role, id)?;
        let mut t = toml::Table::new();
        t.insert(
            "ca_file".into(),
            self.pki.join("ca.pem").display().to_string().into(),
        );
        t.insert("cert_file".into(), cert.display().to_string().into());
        t.insert("key_file".into(), key.display().to_string().into());
        Ok(t)
    }

    fn meta_endpoints() -> toml::Value {
        toml::Value::Array(
            (1..=3)
                .map(|i| toml::Value::from(format!("https://10.0.0.1{i}:7001")))
                .collect(),
        )
    }

    fn write_config(&self, name: &str, table: &toml::Table) -> anyhow::Result<PathBuf> {
        let dir = self.opts.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("config.toml");
        std::fs::write(&path, toml::to_string(table)?)?;
        Ok(path)
    }

    fn push_node(
        &mut self,
        name: String,
        role: Role,
        id: u64,
        host: &str,
        (port, metrics_port): (u16, u16),
        (config, data_dir): (PathBuf, PathBuf),
    ) -> &mut Node {
        self.nodes.push(Node {
            log: self.opts.dir.join("logs").join(format!("{name}.log")),
            name,
            role,
            id,
            host: host.into(),
            port,
            metrics_port,
            config,
            data_dir,
            volume: None,
            loop_dev: None,
            proxy_control: None,
            bin: self
                .opts
                .old_bin
                .clone()
                .unwrap_or_else(|| self.opts.bin.clone()),
            baseline_rss: None,
            child: None,
            pid: None,
            proxy: None,
        });
        self.nodes.last_mut().expect("just pushed")
    }

    fn plan_meta(&mut self, id: u64) -> anyhow::Result<()> {
        let name = format!("m{id}");
        let ip = self.hosts[&name].ip.clone();
        let data_dir = self.opts.dir.join(&name).join("data");
        let mut t = toml::Table::new();
        t.insert("node_id".into(), (id as i64).into());
        t.insert("listen".into(), "0.0.0.0:7001".into());
        t.insert("advertise_addr".into(), format!("https://{ip}:7001").into());
        t.insert("data_dir".into(), data_dir.display().to_string().into());
        t.insert("metrics_listen".into(), "0.0.0.0:7091".into());
        t.insert("sled_cache_bytes".into(), (META_SLED_CACHE as i64).into());
        t.insert(
            "election_timeout_min".into(),
            humantime::format_duration(ELECTION_TIMEOUT.0)
                .to_string()
                .into(),
        );
        t.insert(
            "election_timeout_max".into(),
            humantime::format_duration(ELECTION_TIMEOUT.1)
                .to_string()
                .into(),
        );
        t.insert("delete_delay".into(), dur(DELETE_DELAY).into());
        t.insert("reclaim_interval".into(), dur(RECLAIM_INTERVAL).into());
        // Upgrades are finalized by the upgrade fault, by hand: a leader
        // that finalized on its own would close the rollback window. The
        // version task still records a fresh cluster's version, within
        // seconds (a cluster whose version was never recorded takes the
        // version its meta nodes all understand when they are next asked,
        // which after a rolling upgrade is the new one).
        t.insert("auto_finalize".into(), false.into());
        t.insert("version_check_interval".into(), "2s".into());
        t.insert(
            "cluster_tls".into(),
            self.tls_table("meta", &id.to_string())?.into(),
        );
        let mut voters = toml::Table::new();
        for i in 1..=3 {
            voters.insert(i.to_string(), format!("https://10.0.0.1{i}:7001").into());
        }
        t.insert("voters".into(), voters.into());
        let config = self.write_config(&name, &t)?;
        self.push_node(
            name.clone(),
            Role::Meta,
            id,
            &name,
            (7001, 7091),
            (config, data_dir),
        );
        Ok(())
    }

    fn plan_datanode(&mut self, id: u64) -> anyhow::Result<()> {
        let name = format!("dn{id}");
        let host = format!("s{}", id.div_ceil(2));
        let slot = 2 - (id % 2); // 1 or 2 on its host
        let ip = self.hosts[&host].ip.clone();
        let port = 7100 + slot as u16;
        let volume = self.opts.dir.join(&name).join("vol");
        let data_dir = volume.join("data");
        let mut t = toml::Table::new();
        t.insert("node_id".into(), (id as i64).into());
        t.insert(
            "listen".into(),
            format!("127.0.0.1:{}", 17100 + slot).into(),
        );
        t.insert(
            "advertise_addr".into(),
            format!("https://{ip}:{port}").into(),
        );
        t.insert("data_dir".into(), data_dir.display().to_string().into());
        t.insert("meta_endpoints".into(), Self::meta_endpoints());
        t.insert(
            "metrics_listen".into(),
            format!("0.0.0.0:{}", 7190 + slot).into(),
        );
        t.insert(
            "write_budget_bytes".into(),
            (DATANODE_WRITE_BUDGET as i64).into(),
        );
        t.insert(
            "reserved_free_bytes".into(),
            (RESERVED_FREE_BYTES as i64).into(),
        );
        t.insert("zone".into(), format!("zone-{host}").into());
        t.insert("host".into(), host.clone().into());
        // Unreferenced shards are collected within the run.
        t.insert("gc_interval".into(), dur(GC_INTERVAL).into());
        t.insert("gc_grace".into(), dur(GC_GRACE).into());
        t.insert("scrub_interval".into(), dur(SCRUB_INTERVAL).into());
        t.insert(
            "cluster_tls".into(),
            self.tls_table("datanode", &id.to_string())?.into(),
        );
        let config = self.write_config(&name, &t)?;
        let control = self.opts.dir.join(&name).join("proxy.json");
        crate::proxy::write_control(&control, &crate::proxy::Toxics::default())?;
        let n = self.push_node(
            name,
            Role::Datanode,
            id,
            &host,
            (port, 7190 + slot as u16),
            (config, data_dir),
        );
        n.volume = Some(volume);
        n.proxy_control = Some(control);
        let idx = self.nodes.len() - 1;
        self.mount_volume(idx)?;
        Ok(())
    }

    fn plan_gateway(&mut self, id: u64) -> anyhow::Result<()> {
        let name = format!("g{id}");
        let mut t = toml::Table::new();
        t.insert("listen".into(), "0.0.0.0:9000".into());
        t.insert("region".into(), "us-east-1".into());
        t.insert("access_key".into(), ACCESS_KEY.into());
        t.insert("secret_key".into(), SECRET_KEY.into());
        t.insert("meta_endpoints".into(), Self::meta_endpoints());
        t.insert("metrics_listen".into(), "0.0.0.0:9090".into());
        t.insert("data_shards".into(), 3.into());
        t.insert("parity_shards".into(), 2.into());
        t.insert("write_quorum".into(), 4.into());
        t.insert(
            "buffer_budget_bytes".into(),
            (GATEWAY_BUFFER_BUDGET as i64).into(),
        );
        t.insert(
            "read_budget_bytes".into(),
            (GATEWAY_READ_BUDGET as i64).into(),
        );
        // Heal within the run: audit often, a datanode is down soon.
        t.insert("audit_interval".into(), dur(AUDIT_INTERVAL).into());
        t.insert("heal_interval".into(), dur(HEAL_INTERVAL).into());
        t.insert("node_down_after".into(), dur(NODE_DOWN_AFTER).into());
        t.insert("read_lease_after".into(), dur(READ_LEASE_AFTER).into());
        t.insert(
            "cluster_tls".into(),
            self.tls_table("gateway", &name)?.into(),
        );
        let s3pki = self.opts.dir.join("s3pki");
        let mut s3 = toml::Table::new();
        s3.insert(
            "cert_file".into(),
            s3pki.join("gateway-s3.pem").display().to_string().into(),
        );
        s3.insert(
            "key_file".into(),
            s3pki.join("gateway-s3.key").display().to_string().into(),
        );
        t.insert("s3_tls".into(), s3.into());
        let config = self.write_config(&name, &t)?;
        self.push_node(
            name.clone(),
            Role::Gateway,
            0,
            &name,
            (9000, 9090),
            (config, PathBuf::new()),
        );
        Ok(())
    }

    /// A fresh sparse XFS image loop-mounted on the datanode's volume dir.
    fn mount_volume(&mut self, idx: usize) -> anyhow::Result<()> {
        let vol = self.nodes[idx].volume.clone().expect("datanode volume");
        let img = vol.with_extension("img");
        std::fs::create_dir_all(&vol)?;
        let f = std::fs::File::create(&img)?;
        f.set_len(VOLUME_BYTES)?;
        drop(f);
        sh(&["mkfs.xfs", "-q", &img.display().to_string()])?;
        let dev = sh(&["losetup", "--find", "--show", &img.display().to_string()])?
            .trim()
            .to_string();
        // Recorded before the mount, so a failed mount still frees it.
        self.nodes[idx].loop_dev = Some(dev.clone());
        sh(&["mount", &dev, &vol.display().to_string()])?;
        self.mounts.push(vol.clone());
        std::fs::create_dir_all(vol.join("data"))?;
        Ok(())
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Names of the nodes of `role`.
    pub fn names(&self, role: Role) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.role == role)
            .map(|n| n.name.clone())
            .collect()
    }

    /// The S3 endpoints of the gateways.
    pub fn s3_endpoints(&self) -> Vec<String> {
        self.names(Role::Gateway)
            .iter()
            .map(|g| format!("https://{}:9000", self.hosts[g].ip))
            .collect()
    }

    /// Starts `name` (and, for a datanode, its proxy if not running).
    /// `faketime` runs it under libfaketime with that offset (e.g. `+2h`),
    /// its realtime clock only.
    ///
    /// # Errors
    /// The process cannot be spawned.
    pub fn start(&mut self, name: &str, faketime: Option<&str>) -> anyhow::Result<()> {
        let bin = self.node(name).bin.clone();
        let chaos_bin = self.opts.chaos_bin.clone();
        let filter = self.opts.log_filter.clone();
        let ns = self.hosts[&self.node(name).host].ns.clone();
        let ip = self.hosts[&self.node(name).host].ip.clone();
        let node = self.node_mut(name);
        if node.role == Role::Datanode && node.proxy.is_none() {
            let slot = node.port - 7100;
            let log = append(&node.log.with_extension("proxy.log"))?;
            let child = Command::new("ip")
                .args(["netns", "exec", &ns])
                .arg(&chaos_bin)
                .arg("proxy")
                .arg("--listen")
                .arg(format!("{ip}:{}", node.port))
                .arg("--upstream")
                .arg(format!("127.0.0.1:{}", 17100 + slot))
                .arg("--control")
                .arg(node.proxy_control.as_ref().expect("control"))
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .context("starting a fault proxy")?;
            node.proxy = Some(child);
        }
        let mut launch = Launch::new(&bin, node.role, &node.config, &node.log, &filter)
            .append(true)
            .wrapper(["ip", "netns", "exec", ns.as_str()])
            .env("NO_COLOR", "1");
        if let Some(offset) = faketime {
            launch = launch.wrapper([
                "env".to_owned(),
                format!("LD_PRELOAD={}", faketime_lib()?.display()),
                format!("FAKETIME={offset}"),
                "FAKETIME_DONT_FAKE_MONOTONIC=1".to_owned(),
                "FAKETIME_DONT_RESET=1".to_owned(),
            ]);
        }
        let child = launch.spawn().with_context(|| format!("starting {name}"))?;
        node.pid = child.id();
        node.child = Some(child);
        Ok(())
    }

    /// Sets the binary `name` runs from its next start on.
    pub fn set_bin(&mut self, name: &str, bin: &Path) {
        self.node_mut(name).bin = bin.to_owned();
    }

    /// Sends `signal` to `name` (no wait).
    pub fn signal(&self, name: &str, signal: Signal) -> anyhow::Result<()> {
        if let Some(pid) = self.node(name).pid {
            cluster::signal(pid, signal).with_context(|| format!("{signal} to {name}"))?;
        }
        Ok(())
    }

    /// SIGKILL and reap.
    pub async fn kill9(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self.node_mut(name);
        if let Some(mut child) = node.child.take() {
            cluster::kill9(&mut child).await;
        }
        node.pid = None;
        Ok(())
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    pub async fn stop(&mut self, name: &str, grace: Duration) {
        let node = self.node_mut(name);
        if let Some(mut child) = node.child.take() {
            cluster::terminate(&mut child, name, grace).await;
        }
        node.pid = None;
    }

    /// Whether `name` is running (not exited).
    pub fn running(&mut self, name: &str) -> bool {
        let node = self.node_mut(name);
        match node.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Names of processes that should run but exited, with their status.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push((n.name.clone(), status.to_string()));
                n.child = None;
                n.pid = None;
            }
        }
        out
    }

    /// `http://<ip>:<metrics port>` of `name`.
    pub fn metrics_url(&self, name: &str) -> String {
        let n = self.node(name);
        format!("http://{}:{}", self.hosts[&n.host].ip, n.metrics_port)
    }

    /// Whether `name`'s /health/ready answers 200 (asked from the client
    /// namespace with `sluice health`).
    pub async fn ready(&self, name: &str) -> bool {
        cluster::health_ready(
            &self.client_wrapper(),
            &self.opts.bin,
            &self.metrics_url(name),
        )
        .await
    }

    /// `ip netns exec <client namespace>`.
    fn client_wrapper(&self) -> Vec<OsString> {
        ["ip", "netns", "exec", self.hosts["client"].ns.as_str()]
            .map(OsString::from)
            .to_vec()
    }

    /// Waits until every named process is ready.
    ///
    /// # Errors
    /// One exits or is not ready within `timeout`.
    pub async fn wait_ready(&mut self, names: &[String], timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let wrapper = self.client_wrapper();
        let bin = self.opts.bin.clone();
        for name in names {
            let url = self.metrics_url(name);
            let log = self.node(name).log.clone();
            let Some(child) = self.node_mut(name).child.as_mut() else {
                bail!("{name} exited; log {}:\n{}", log.display(), tail(&log, 20));
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = cluster::wait_ready(child, left, Duration::from_millis(500), || {
                cluster::health_ready(&wrapper, &bin, &url)
            })
            .await;
            match ready {
                Ok(()) => {}
                Err(NotReady::Exited(_)) => {
                    bail!("{name} exited; log {}:\n{}", log.display(), tail(&log, 20))
                }
                Err(NotReady::Timeout(_)) => bail!(
                    "{name} not ready after {timeout:?}; log {}:\n{}",
                    log.display(),
                    tail(&log, 20)
                ),
            }
        }
        Ok(())
    }

    /// Starts everything in the bootstrap order (meta, datanodes,
    /// gateways, each group ready before the next) and records each
    /// process's baseline RSS.
    ///
    /// # Errors
    /// A process that exits or is not ready in time.
    pub async fn start_all(&mut self) -> anyhow::Result<()> {
        for role in [Role::Meta, Role::Datanode, Role::Gateway] {
            let names = self.names(role);
            for n in &names {
                self.start(n, None)?;
            }
            self.wait_ready(&names, Duration::from_secs(120)).await?;
            tracing::info!(role = role.as_str(), count = names.len(), "ready");
        }
        for n in &mut self.nodes {
            n.baseline_rss = n.pid.and_then(rss_bytes);
        }
        Ok(())
    }

    /// Runs `sluice admin ARGS` from the client namespace with the
    /// operator certificate; its stdout.
    ///
    /// # Errors
    /// The command fails.
    pub async fn admin(&self, args: &[&str]) -> anyhow::Result<String> {
        let client = self.hosts["client"].ns.clone();
        let meta = (1..=3)
            .map(|i| format!("https://10.0.0.1{i}:7001"))
            .collect::<Vec<_>>()
            .join(",");
        let out = Command::new("ip")
            .args(["netns", "exec", &client])
            .arg(&self.opts.bin)
            .arg("admin")
            .args(args)
            .env("SLUICE_META", meta)
            .env("SLUICE_ADMIN_CA", self.pki.join("ca.pem"))
            .env("SLUICE_ADMIN_CERT", self.pki.join("admin-chaos.pem"))
            .env("SLUICE_ADMIN_KEY", self.pki.join("admin-chaos.key"))
            .stdin(Stdio::null())
            .output();
        let out = tokio::time::timeout(Duration::from_secs(20), out)
            .await
            .context("sluice admin timed out")??;
        if !out.status.success() {
            bail!(
                "sluice admin {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `sluice admin status --json`, parsed.
    ///
    /// # Errors
    /// The command fails or prints no JSON.
    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        let out = self.admin(&["status", "--json"]).await?;
        serde_json::from_str(&out).context("admin status --json")
    }

    /// The meta leader's node name (`m1`..`m3`), as the voters report it.
    pub async fn leader(&self) -> Option<String> {
        let status = self.status().await.ok()?;
        let id = status.get("leader_id")?.as_u64()?;
        (id >= 1).then(|| format!("m{id}"))
    }

    /// Makes a cgroup (v1 blkio) for `name`'s process and throttles its
    /// writes to its volume's loop device at `bps` bytes per second.
    ///
    /// # Errors
    /// No blkio controller, or the process is not running.
    pub fn throttle_disk(&mut self, name: &str, bps: u64) -> anyhow::Result<()> {
        let node = self.node(name);
        let pid = node.pid.context("not running")?;
        let dev = node.loop_dev.clone().context("no loop device")?;
        let sysname = Path::new(&dev)
            .file_name()
            .context("loop dev")?
            .to_string_lossy()
            .to_string();
        let majmin = std::fs::read_to_string(format!("/sys/block/{sysname}/dev"))?
            .trim()
            .to_string();
        let root = Path::new("/sys/fs/cgroup/blkio");
        if !root.join("blkio.throttle.write_bps_device").exists() {
            bail!(
                "slow-disk needs the cgroup v1 blkio controller at {}",
                root.display()
            );
        }
        let cg = root.join(format!("{}-{name}", self.opts.prefix));
        std::fs::create_dir_all(&cg).context("blkio cgroup (cgroup v1)")?;
        if !self.cgroups.contains(&cg) {
            self.cgroups.push(cg.clone());
        }
        std::fs::write(
            cg.join("blkio.throttle.write_bps_device"),
            format!("{majmin} {bps}"),
        )?;
        std::fs::write(
            cg.join("blkio.throttle.read_bps_device"),
            format!("{majmin} {bps}"),
        )?;
        for task in threads(pid) {
            let _ = std::fs::write(cg.join("tasks"), task.to_string());
        }
        Ok(())
    }

    /// Lifts [`Cluster::throttle_disk`]: back to the root cgroup.
    pub fn unthrottle_disk(&mut self, name: &str) {
        let cg = PathBuf::from("/sys/fs/cgroup/blkio").join(format!("{}-{name}", self.opts.prefix));
        if let Ok(tasks) = std::fs::read_to_string(cg.join("tasks")) {
            for t in tasks.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/blkio/tasks", t);
            }
        }
    }

    /// Removes everything the run made. Safe to call twice.
    pub async fn cleanup(&mut self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for name in names.iter().rev() {
            self.stop(name, Duration::from_secs(5)).await;
        }
        for n in &mut self.nodes {
            if let Some(mut p) = n.proxy.take() {
                let _ = p.start_kill();
                let _ = p.wait().await;
            }
        }
        self.cleanup_sync();
    }

    fn cleanup_sync(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                let _ = c.start_kill();
            }
            if let Some(p) = n.proxy.as_mut() {
                let _ = p.start_kill();
            }
        }
        for cg in self.cgroups.drain(..) {
            if let Ok(tasks) = std::fs::read_to_string(cg.join("tasks")) {
                for t in tasks.lines() {
                    let _ = std::fs::write("/sys/fs/cgroup/blkio/tasks", t);
                }
            }
            let _ = std::fs::remove_dir(&cg);
        }
        for m in self.mounts.drain(..).rev() {
            let m = m.display().to_string();
            if sh(&["umount", &m]).is_err() {
                let _ = sh(&["umount", "-l", &m]);
            }
        }
        for n in &mut self.nodes {
            if let Some(dev) = n.loop_dev.take() {
                let _ = sh(&["losetup", "-d", &dev]);
            }
        }
        for ns in self.namespaces.drain(..).rev() {
            let _ = sh(&["ip", "netns", "del", &ns]);
        }
    }

    /// The data images are large: removes them (kept logs and configs).
    pub fn remove_images(&self) {
        for n in &self.nodes {
            if let Some(v) = &n.volume {
                let _ = std::fs::remove_file(v.with_extension("img"));
            }
        }
    }
}

/// A duration as the configs write it (`20s`).
fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Opens a log for appending.
fn append(path: &Path) -> anyhow::Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?)
}

/// The last lines of a log (the harness's helper).
pub use sluice_harness::cluster::log_tail as tail;

/// VmRSS of a process, bytes.
pub use sluice_harness::rss::rss_bytes_of as rss_bytes;

/// Thread ids of a process.
fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// libfaketime's shared library (Debian's `faketime` package).
///
/// # Errors
/// Not installed.
pub fn faketime_lib() -> anyhow::Result<PathBuf> {
    for p in [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    bail!("libfaketime not found (apt-get install faketime)")
}
