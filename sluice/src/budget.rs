//! Memory budgets: how much memory this process may use, and the budget
//! defaults derived from it.
//!
//! The memory model (docs/design/memory.md) promises `RSS ≤ base + configured budgets`,
//! with the budgets defaulting from the memory limit of the process's
//! cgroup, not from host RAM. [`detect_memory_limit`] finds that limit:
//!
//! 1. cgroup v2: the process's cgroup is the `0::/path` line of
//!    `/proc/self/cgroup`; its `memory.max` (`max` = unlimited) and that of
//!    every ancestor up to the cgroup2 mount (from `/proc/self/mountinfo`,
//!    else `/sys/fs/cgroup`) limit it;
//! 2. cgroup v1 (hybrid hosts): the same walk over the `memory` controller's
//!    `memory.limit_in_bytes` (an "unlimited" v1 limit is a huge number);
//! 3. physical RAM (`MemTotal` of `/proc/meminfo`).
//!
//! The limit is the smallest of these; when none can be read (not Linux) it
//! is [`FALLBACK_LIMIT_BYTES`].
//!
//! # Policy
//!
//! A budget left unset (`None`) in a role's config gets a default that is a
//! fraction of the limit, clamped ([`Share`]). A process running one role:
//!
//! | budget                          | default                          |
//! |---------------------------------|----------------------------------|
//! | gateway `buffer_budget_bytes`   | limit / 4, in 16 MiB ..= 1 GiB   |
//! | gateway `read_budget_bytes`     | half the buffer budget           |
//! | datanode `write_budget_bytes`   | limit / 4, in 16 MiB ..= 1 GiB   |
//! | meta `sled_cache_bytes`         | the config's (default 64 MiB)    |
//!
//! `sluice dev` runs every role in one process and splits the limit: each of
//! its six datanodes gets limit / 32 in 8 MiB ..= 256 MiB, the gateway
//! limit / 8 in 16 MiB ..= 512 MiB (reads: half that). At most 3/8 of the
//! limit goes to budgets either way; the rest is for the base (code,
//! runtime, connections, allocator slack).
//!
//! # Layout
//!
//! * [`MemoryLimit`], [`detect_memory_limit`]: reading the limit.
//! * `parse_*`: the pure parsers of the `/proc` and `/sys` texts (unit tested).
//! * [`Share`] and its constants: the policy above.
//! * [`Budget`], `apply_*`: filling a role config's unset budgets and
//!   reporting every effective budget (logged at start, exported as
//!   `sluice_process_budget_bytes`).

use std::fmt;
use std::path::{Path, PathBuf};

use sluice_util::byte_size::ByteSize;

/// One mebibyte, in bytes.
pub const MIB: u64 = 1024 * 1024;
/// One gibibyte, in bytes.
pub const GIB: u64 = 1024 * MIB;

/// Limit assumed when neither a cgroup limit nor the physical RAM can be
/// read (e.g. not on Linux): 4 GiB.
pub const FALLBACK_LIMIT_BYTES: u64 = 4 * GIB;

/// Most cgroup directories visited walking from the process's cgroup to the
/// hierarchy's root (a bound on a path read from `/proc`).
const MAX_CGROUP_DEPTH: usize = 64;

/// Where a [`MemoryLimit`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// `memory.max` of this cgroup v2 directory.
    CgroupV2(PathBuf),
    /// `memory.limit_in_bytes` of this cgroup v1 directory.
    CgroupV1(PathBuf),
    /// `MemTotal` of `/proc/meminfo`: no smaller cgroup limit.
    PhysicalRam,
    /// Nothing readable: [`FALLBACK_LIMIT_BYTES`].
    Fallback,
}

/// The memory this process may use, in bytes, and where that number came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// Where it was read.
    pub source: LimitSource,
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", mib(self.bytes))?;
        match &self.source {
            LimitSource::CgroupV2(dir) => write!(f, "cgroup v2 {}/memory.max", dir.display())?,
            LimitSource::CgroupV1(dir) => {
                write!(f, "cgroup v1 {}/memory.limit_in_bytes", dir.display())?
            }
            LimitSource::PhysicalRam => f.write_str("physical RAM, no cgroup limit")?,
            LimitSource::Fallback => f.write_str("unknown; assumed")?,
        }
        f.write_str(")")
    }
}

/// Formats a byte count as MiB for logs and the banner ("1024 MiB", "0.5 MiB").
pub fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// Reads the memory limit of this process (see the module docs). Never
/// fails: unreadable files are skipped, down to [`FALLBACK_LIMIT_BYTES`].
pub fn detect_memory_limit() -> MemoryLimit {
    let read = |path: &Path| std::fs::read_to_string(path).ok();
    let ram = read(Path::new("/proc/meminfo")).and_then(|t| parse_meminfo_total(&t));
    let proc_cgroup = read(Path::new("/proc/self/cgroup"))
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default();
    let mounts = read(Path::new("/proc/self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default();

    let mut candidates: Vec<MemoryLimit> = Vec::new();
    if let Some(path) = &proc_cgroup.v2 {
        let mount = mounts.v2.clone().unwrap_or_else(|| CgroupMount {
            root: "/".into(),
            mount_point: PathBuf::from("/sys/fs/cgroup"),
        });
        candidates.extend(smallest_limit(
            &mount,
            path,
            "memory.max",
            LimitSource::CgroupV2,
        ));
    }
    if let (Some(path), Some(mount)) = (&proc_cgroup.v1_memory, &mounts.v1_memory) {
        candidates.extend(smallest_limit(
            mount,
            path,
            "memory.limit_in_bytes",
            LimitSource::CgroupV1,
        ));
    }
    if let Some(bytes) = ram {
        candidates.push(MemoryLimit {
            bytes,
            source: LimitSource::PhysicalRam,
        });
    }
    // The smallest wins; on a tie the cgroup (pushed first) names the source.
    candidates
        .into_iter()
        .filter(|l| l.bytes > 0)
        .reduce(|best, l| if l.bytes < best.bytes { l } else { best })
        .unwrap_or(MemoryLimit {
            bytes: FALLBACK_LIMIT_BYTES,
            source: LimitSource::Fallback,
        })
}

/// The smallest limit in `file` over the cgroup at `path` and its ancestors.
fn smallest_limit(
    mount: &CgroupMount,
    path: &str,
    file: &str,
    source: fn(PathBuf) -> LimitSource,
) -> Option<MemoryLimit> {
    cgroup_dirs(mount, path)
        .into_iter()
        .filter_map(|dir| {
            let text = std::fs::read_to_string(dir.join(file)).ok()?;
            match parse_cgroup_limit(&text)? {
                CgroupLimit::Unlimited => None,
                CgroupLimit::Bytes(bytes) => Some(MemoryLimit {
                    bytes,
                    source: source(dir),
                }),
            }
        })
        .min_by_key(|l| l.bytes)
}

/// A cgroup memory limit file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLimit {
    /// `max`: no limit.
    Unlimited,
    /// A limit in bytes.
    Bytes(u64),
}

/// Parses `memory.max` (v2: a byte count or `max`) or
/// `memory.limit_in_bytes` (v1: a byte count). `None` if it is neither.
pub fn parse_cgroup_limit(text: &str) -> Option<CgroupLimit> {
    match text.trim() {
        "max" => Some(CgroupLimit::Unlimited),
        n => n.parse().ok().map(CgroupLimit::Bytes),
    }
}

/// Parses `MemTotal` out of `/proc/meminfo` (`MemTotal:  24683656 kB`), in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// This process's cgroups, from `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcCgroup {
    /// The cgroup v2 path (the `0::/path` line).
    pub v2: Option<String>,
    /// The cgroup v1 path of the `memory` controller (`N:memory:/path`).
    pub v1_memory: Option<String>,
}

/// Parses `/proc/self/cgroup` (`hierarchy-id:controllers:path` per line).
pub fn parse_proc_cgroup(text: &str) -> ProcCgroup {
    let mut out = ProcCgroup::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            out.v1_memory = Some(path.to_string());
        }
    }
    out
}

/// A mounted cgroup hierarchy: `root` is the hierarchy path shown at
/// `mount_point` ("/" unless the mount is of a sub-tree, as in containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Path inside the hierarchy of the mount's root.
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
}

/// The cgroup mounts found in `/proc/self/mountinfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// The first `cgroup2` mount.
    pub v2: Option<CgroupMount>,
    /// The first v1 `cgroup` mount with the `memory` controller.
    pub v1_memory: Option<CgroupMount>,
}

/// Parses `/proc/self/mountinfo`: `id parent major:minor root mount-point
/// options [optional fields] - fstype source super-options` per line.
pub fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut out = CgroupMounts::default();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype)) =
            (left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        let mount = CgroupMount {
            root: unescape_mountinfo(root),
            mount_point: PathBuf::from(unescape_mountinfo(mount_point)),
        };
        match *fstype {
            "cgroup2" if out.v2.is_none() => out.v2 = Some(mount),
            "cgroup"
                if out.v1_memory.is_none()
                    && right
                        .get(2)
                        .is_some_and(|opts| opts.split(',').any(|o| o == "memory")) =>
            {
                out.v1_memory = Some(mount)
            }
            _ => {}
        }
    }
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = bytes
                .get(i + 1..i + 4)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directories of the cgroup at `path` and of its ancestors, leaf first,
/// down to the mount point itself. In a container the mount's root is the
/// container's own cgroup, which holds its limit (Docker on cgroup v1 mounts
/// `/docker/<id>` at `/sys/fs/cgroup/memory`; a private cgroup namespace
/// shows it as `/`); at the real hierarchy root the file is missing (v2) or
/// unlimited (v1), which costs nothing. Empty when `path` is not under the
/// mount's root.
pub fn cgroup_dirs(mount: &CgroupMount, path: &str) -> Vec<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let Some(relative) = path.strip_prefix(root) else {
        return Vec::new();
    };
    if !(relative.is_empty() || relative.starts_with('/') || root.is_empty()) {
        return Vec::new();
    }
    let parts: Vec<&str> = relative
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .take(MAX_CGROUP_DEPTH)
        .collect();
    (0..=parts.len())
        .rev()
        .map(|n| {
            parts[..n]
                .iter()
                .fold(mount.mount_point.clone(), |d, p| d.join(p))
        })
        .collect()
}

/// A default budget: `limit / divisor`, clamped to `min..=max` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The limit is divided by this.
    pub divisor: u64,
    /// Smallest default, bytes.
    pub min: u64,
    /// Largest default, bytes.
    pub max: u64,
}

impl Share {
    /// The budget for a memory limit of `limit` bytes.
    pub fn of(&self, limit: u64) -> u64 {
        (limit / self.divisor).clamp(self.min, self.max)
    }
}

/// Gateway stripe-buffer budget of a gateway process.
pub const GATEWAY_BUFFER: Share = Share {
    divisor: 4,
    min: 16 * MIB,
    max: GIB,
};
/// Datanode write budget of a datanode process.
pub const DATANODE_WRITE: Share = Share {
    divisor: 4,
    min: 16 * MIB,
    max: GIB,
};
/// Write budget of each of the datanodes of `sluice dev`.
pub const DEV_DATANODE_WRITE: Share = Share {
    divisor: 32,
    min: 8 * MIB,
    max: 256 * MIB,
};
/// Gateway buffer budget in `sluice dev`.
pub const DEV_GATEWAY_BUFFER: Share = Share {
    divisor: 8,
    min: 16 * MIB,
    max: 512 * MIB,
};

/// The default read budget of a gateway: half its buffer budget.
pub fn read_budget_for(buffer_budget: u64) -> u64 {
    buffer_budget / 2
}

/// Where an effective budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Set in the role's config.
    Config,
    /// Derived from the memory limit (the config left it unset).
    Derived,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Config => "config",
            Origin::Derived => "from memory limit",
        })
    }
}

/// One effective budget of one role instance in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Role instance: `meta-1`, `datanode-3`, `gateway`.
    pub node: String,
    /// Which budget: `meta_sled_cache`, `datanode_write`, `gateway_buffer`, `gateway_read`.
    pub budget: &'static str,
    /// Size in bytes.
    pub bytes: u64,
    /// Configured or derived.
    pub origin: Origin,
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {} ({})",
            self.node,
            self.budget,
            mib(self.bytes),
            self.origin
        )
    }
}

/// Fills `slot` with `derived` if unset; returns the effective [`Budget`].
fn fill(slot: &mut Option<ByteSize>, derived: u64, node: &str, budget: &'static str) -> Budget {
    let origin = if slot.is_some() {
        Origin::Config
    } else {
        Origin::Derived
    };
    let bytes = slot.get_or_insert(ByteSize(derived)).as_u64();
    Budget {
        node: node.to_string(),
        budget,
        bytes,
        origin,
    }
}

/// The meta node's budget: its sled cache. `sled_cache_bytes` is a plain
/// byte count (default 64 MiB), so it is reported, never derived.
pub fn meta_budgets(config: &sluice_meta::Config) -> Vec<Budget> {
    vec![Budget {
        node: format!("meta-{}", config.node_id),
        budget: "meta_sled_cache",
        bytes: config.sled_cache_bytes.as_u64(),
        origin: Origin::Config,
    }]
}

/// Sets the datanode's `write_budget_bytes` to `share` of `limit` if unset.
pub fn apply_datanode(
    config: &mut sluice_datanode::Config,
    share: Share,
    limit: u64,
) -> Vec<Budget> {
    let node = format!("datanode-{}", config.node_id);
    vec![fill(
        &mut config.write_budget_bytes,
        share.of(limit),
        &node,
        "datanode_write",
    )]
}

/// Sets the gateway's byte budgets where unset: `buffer_budget_bytes` to
/// `share` of `limit`, `read_budget_bytes` to half the (effective) buffer
/// budget; a derived budget is raised to at least one stripe
/// ([`sluice_gateway::Config::stripe_charge`]) so it always validates.
pub fn apply_gateway(config: &mut sluice_gateway::Config, share: Share, limit: u64) -> Vec<Budget> {
    let stripe = config.stripe_charge();
    let buffer = fill(
        &mut config.buffer_budget_bytes,
        share.of(limit).max(stripe),
        "gateway",
        "gateway_buffer",
    );
    let read = fill(
        &mut config.read_budget_bytes,
        read_budget_for(buffer.bytes).max(stripe),
        "gateway",
        "gateway_read",
    );
    vec![buffer, read]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_limit_files() {
        assert_eq!(parse_cgroup_limit("max\n"), Some(CgroupLimit::Unlimited));
        assert_eq!(
            parse_cgroup_limit("2147483648\n"),
            Some(CgroupLimit::Bytes(2 * GIB))
        );
        // v1 "unlimited" is a huge page-aligned number; min() with RAM caps it.
        assert_eq!(
            parse_cgroup_limit("9223372036854771712"),
            Some(CgroupLimit::Bytes(9_223_372_036_854_771_712))
        );
        assert_eq!(parse_cgroup_limit(""), None);
        assert_eq!(parse_cgroup_limit("lots"), None);
    }

    #[test]
    fn meminfo_total() {
        let text = "MemTotal:       24683656 kB\nMemFree:        17960000 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(parse_meminfo_total(text), Some(24_683_656 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: many kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: 5 MB\n"), None);
    }

    #[test]
    fn proc_cgroup_v2_only() {
        let c = parse_proc_cgroup("0::/system.slice/sluice.service\n");
        assert_eq!(c.v2.as_deref(), Some("/system.slice/sluice.service"));
        assert_eq!(c.v1_memory, None);
    }

    #[test]
    fn proc_cgroup_hybrid() {
        let text = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/8269ff94\n\
                    2:cpu,cpuacct:/\n0::/\n";
        let c = parse_proc_cgroup(text);
        assert_eq!(c.v2.as_deref(), Some("/"));
        assert_eq!(c.v1_memory.as_deref(), Some("/process_api/8269ff94"));
    }

    #[test]
    fn mountinfo_finds_cgroup_mounts() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        let m = parse_mountinfo(text);
        assert_eq!(
            m.v2,
            Some(CgroupMount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/unified".into()
            })
        );
        assert_eq!(
            m.v1_memory,
            Some(CgroupMount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/memory".into()
            })
        );
        // A container's namespaced mount of a sub-tree, with an escaped space.
        let m = parse_mountinfo(
            "1271 1270 0:26 /kubepods/pod\\0401 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n",
        );
        assert_eq!(
            m.v2,
            Some(CgroupMount {
                root: "/kubepods/pod 1".into(),
                mount_point: "/sys/fs/cgroup".into()
            })
        );
        assert_eq!(m.v1_memory, None);
        assert_eq!(parse_mountinfo("garbage\n\n"), CgroupMounts::default());
    }

    #[test]
    fn cgroup_dirs_walk_to_the_mount() {
        let mount = CgroupMount {
            root: "/".into(),
            mount_point: "/sys/fs/cgroup".into(),
        };
        assert_eq!(
            cgroup_dirs(&mount, "/system.slice/sluice.service"),
            vec![
                PathBuf::from("/sys/fs/cgroup/system.slice/sluice.service"),
                PathBuf::from("/sys/fs/cgroup/system.slice"),
                PathBuf::from("/sys/fs/cgroup"),
            ]
        );
        // A private cgroup namespace: the container's cgroup is the mount's root.
        assert_eq!(
            cgroup_dirs(&mount, "/"),
            vec![PathBuf::from("/sys/fs/cgroup")]
        );
        // Paths are not allowed to climb out of the mount.
        assert_eq!(
            cgroup_dirs(&mount, "/../etc"),
            vec![
                PathBuf::from("/sys/fs/cgroup/etc"),
                PathBuf::from("/sys/fs/cgroup")
            ]
        );
        let container = CgroupMount {
            root: "/kubepods/pod1".into(),
            mount_point: "/sys/fs/cgroup".into(),
        };
        assert_eq!(
            cgroup_dirs(&container, "/kubepods/pod1/app"),
            vec![
                PathBuf::from("/sys/fs/cgroup/app"),
                PathBuf::from("/sys/fs/cgroup")
            ]
        );
        // Docker on cgroup v1 (no cgroup namespace): the container's own
        // cgroup is mounted, and its limit file is at the mount point.
        let docker_v1 = CgroupMount {
            root: "/docker/a641".into(),
            mount_point: "/sys/fs/cgroup/memory".into(),
        };
        assert_eq!(
            cgroup_dirs(&docker_v1, "/docker/a641"),
            vec![PathBuf::from("/sys/fs/cgroup/memory")]
        );
        assert!(cgroup_dirs(&container, "/kubepods/pod10/app").is_empty());
        assert!(cgroup_dirs(&container, "/other").is_empty());
    }

    #[test]
    fn shares_clamp() {
        // 24 GiB of RAM, no cgroup limit: every single-role budget at its cap.
        let ram = 24 * GIB;
        assert_eq!(GATEWAY_BUFFER.of(ram), GIB);
        assert_eq!(read_budget_for(GATEWAY_BUFFER.of(ram)), 512 * MIB);
        assert_eq!(DATANODE_WRITE.of(ram), GIB);
        assert_eq!(DEV_DATANODE_WRITE.of(ram), 256 * MIB);
        assert_eq!(DEV_GATEWAY_BUFFER.of(ram), 512 * MIB);
        // A 2 GiB container: proportional.
        assert_eq!(GATEWAY_BUFFER.of(2 * GIB), 512 * MIB);
        assert_eq!(DATANODE_WRITE.of(2 * GIB), 512 * MIB);
        assert_eq!(DEV_DATANODE_WRITE.of(2 * GIB), 64 * MIB);
        assert_eq!(DEV_GATEWAY_BUFFER.of(2 * GIB), 256 * MIB);
        // A tiny one: the floors.
        assert_eq!(GATEWAY_BUFFER.of(32 * MIB), 16 * MIB);
        assert_eq!(DEV_DATANODE_WRITE.of(128 * MIB), 8 * MIB);
        assert_eq!(DEV_GATEWAY_BUFFER.of(0), 16 * MIB);
    }

    #[test]
    fn apply_fills_only_unset_budgets() {
        let mut unset = sluice_datanode::Config {
            node_id: 3,
            ..Default::default()
        };
        let b = apply_datanode(&mut unset, DEV_DATANODE_WRITE, 2 * GIB);
        assert_eq!(unset.write_budget_bytes, Some(ByteSize(64 * MIB)));
        assert_eq!(
            b,
            vec![Budget {
                node: "datanode-3".into(),
                budget: "datanode_write",
                bytes: 64 * MIB,
                origin: Origin::Derived
            }]
        );
        assert_eq!(
            b[0].to_string(),
            "datanode-3 datanode_write: 64 MiB (from memory limit)"
        );

        let mut set = sluice_datanode::Config {
            write_budget_bytes: Some(ByteSize(4 * MIB)),
            ..Default::default()
        };
        let b = apply_datanode(&mut set, DATANODE_WRITE, 24 * GIB);
        assert_eq!(set.write_budget_bytes, Some(ByteSize(4 * MIB)));
        assert_eq!((b[0].bytes, b[0].origin), (4 * MIB, Origin::Config));

        let meta = meta_budgets(&sluice_meta::Config::default());
        assert_eq!(meta[0].bytes, 64 * MIB);
        assert_eq!(meta[0].node, "meta-1");
    }

    #[test]
    fn gateway_budgets() {
        let mut config = sluice_gateway::Config::default();
        let b = apply_gateway(&mut config, GATEWAY_BUFFER, 2 * GIB);
        let pairs: Vec<_> = b.iter().map(|b| (b.budget, b.bytes, b.origin)).collect();
        assert_eq!(
            pairs,
            vec![
                ("gateway_buffer", 512 * MIB, Origin::Derived),
                ("gateway_read", 256 * MIB, Origin::Derived)
            ]
        );
        assert_eq!(config.buffer_budget_bytes, Some(ByteSize(512 * MIB)));
        assert_eq!(config.read_budget_bytes, Some(ByteSize(256 * MIB)));

        // A configured buffer budget is kept; reads default to half of it.
        let mut config = sluice_gateway::Config {
            buffer_budget_bytes: Some(ByteSize(40 * MIB)),
            ..Default::default()
        };
        let b = apply_gateway(&mut config, DEV_GATEWAY_BUFFER, 24 * GIB);
        assert_eq!((b[0].bytes, b[0].origin), (40 * MIB, Origin::Config));
        assert_eq!((b[1].bytes, b[1].origin), (20 * MIB, Origin::Derived));
        assert_eq!(config.read_budget_bytes, Some(ByteSize(20 * MIB)));

        // Derived budgets hold at least one stripe of a wide layout.
        let mut wide = sluice_gateway::Config {
            data_shards: 16,
            parity_shards: 4,
            block_size: ByteSize::mib(4),
            ..Default::default()
        };
        apply_gateway(&mut wide, GATEWAY_BUFFER, 64 * MIB);
        assert_eq!(wide.buffer_budget_bytes, Some(ByteSize(80 * MIB)));
        assert_eq!(wide.read_budget_bytes, Some(ByteSize(80 * MIB)));
    }

    #[test]
    fn detect_gives_a_positive_limit() {
        // Whatever the host, the limit is positive and at most physical RAM.
        let limit = detect_memory_limit();
        assert!(limit.bytes > 0, "{limit}");
        if let Some(ram) = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo_total(&t))
        {
            assert!(limit.bytes <= ram, "{limit} above RAM {ram}");
        }
    }

    #[test]
    fn display() {
        let l = MemoryLimit {
            bytes: 2 * GIB,
            source: LimitSource::CgroupV2("/sys/fs/cgroup/a".into()),
        };
        assert_eq!(
            l.to_string(),
            "2048 MiB (cgroup v2 /sys/fs/cgroup/a/memory.max)"
        );
        assert_eq!(mib(MIB / 2), "0.5 MiB");
    }
}
