//! Datanode configuration: TOML into [`Config`], checked by
//! [`Config::validate`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_net::is_endpoint;
use sluice_util::byte_size::ByteSize;

/// Largest accepted `shard_channel_depth` (blocks).
pub const MAX_SHARD_CHANNEL_DEPTH: usize = 1024;
/// Write budget when `write_budget_bytes` is unset: 64 MiB. This is the
/// library's default (tests, embedding); the `sluice` binary fills an unset
/// budget from the process's memory limit before the config gets here
/// (`sluice/src/budget.rs`, `DATANODE_WRITE` and `DEV_DATANODE_WRITE`).
pub const DEFAULT_WRITE_BUDGET_BYTES: u64 = 64 * 1024 * 1024;
/// Default `credit_fsync_bytes`: 1 MiB.
pub const DEFAULT_CREDIT_FSYNC_BYTES: u64 = 1024 * 1024;
/// Default `reserved_free_bytes`: 1 GiB.
pub const DEFAULT_RESERVED_FREE_BYTES: u64 = 1024 * 1024 * 1024;
/// Default `scrub_bandwidth_bytes_per_sec`: 10 MiB/s.
pub const DEFAULT_SCRUB_BANDWIDTH_BYTES_PER_SEC: u64 = 10 * 1024 * 1024;
/// Default `verify_bandwidth_bytes_per_sec`: 64 MiB/s.
pub const DEFAULT_VERIFY_BANDWIDTH_BYTES_PER_SEC: u64 = 64 * 1024 * 1024;
/// Default `gc_max_ops_per_sec`: 2000 shard operations per second.
pub const DEFAULT_GC_MAX_OPS_PER_SEC: u64 = 2000;
/// `max_shard_streams` when not configured.
pub const DEFAULT_MAX_SHARD_STREAMS: usize = 4096;
/// `max_streams_per_connection` when not configured.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Default `scrub_interval`: 7 days.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Configuration of one datanode. Durations are humantime strings in TOML
/// (`"2s"`); every field has a default (see [`Config::default`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This datanode's id in the cluster (>= 1); placements name it.
    pub node_id: u64,
    /// Address the binary binds the gRPC listener to.
    pub listen: SocketAddr,
    /// gRPC endpoint other roles use to reach this node, e.g.
    /// `"http://127.0.0.1:7101"`; registered with meta.
    pub advertise_addr: String,
    /// Directory holding the shard files (`<data_dir>/shards/`).
    pub data_dir: PathBuf,
    /// gRPC endpoints of the meta nodes, e.g. `["http://127.0.0.1:7001"]`.
    pub meta_endpoints: Vec<String>,
    /// Time between heartbeats to meta; registration is retried at the same
    /// pace until meta accepts it.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Shard blocks buffered between a PutShard stream and the disk writer
    /// (1..=[`MAX_SHARD_CHANNEL_DEPTH`]); bounds each upload's memory to
    /// about `(depth + 2) * block_size`.
    pub shard_channel_depth: usize,
    /// After shutdown is requested: how long in-flight requests may finish
    /// before they are cancelled (uncommitted shards are then discarded).
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Bytes of shard data this node may hold received-but-not-fsynced plus
    /// granted-but-unspent, shared among gateways as credits (see
    /// [`crate::credit`]). Unset = [`DEFAULT_WRITE_BUDGET_BYTES`] (a later
    /// release derives the default from the cgroup memory limit). A gateway
    /// needs credit for a whole block, so keep it at least
    /// `gateways × block size`; see [`Config::write_budget`].
    #[serde(with = "sluice_util::byte_size::optional")]
    pub write_budget_bytes: Option<ByteSize>,
    /// For PutShard streams that use credits: fsync the shard's temp file
    /// after every this many bytes written, and re-grant them (bytes,
    /// 1..=write budget).
    #[serde(with = "sluice_util::byte_size")]
    pub credit_fsync_bytes: ByteSize,
    /// For PutShard streams that use credits: fsync what is written when no
    /// block has arrived for this long, so a sender waiting for credit does
    /// not wait on its own unsynced bytes.
    #[serde(with = "humantime_serde")]
    pub credit_fsync_idle: Duration,
    /// Time between two shard GC passes (the first one interval after
    /// start). A pass lists every shard and asks meta about the old ones.
    /// Default 10 min; any positive humantime ("100ms" in tests).
    #[serde(with = "humantime_serde")]
    pub gc_interval: Duration,
    /// GC does not ask meta about shards last written less than this long
    /// ago (they are most likely about to be committed). An efficiency knob
    /// only: safety comes from meta's `Collectable` answer and the per-blob
    /// lock, not from this grace (see [`crate::gc`]). Default 10 min; any
    /// positive humantime.
    #[serde(with = "humantime_serde")]
    pub gc_grace: Duration,
    /// Pace of a GC pass: shard operations per second, where listing a
    /// shard is one operation and deleting it one more (default 2000; must
    /// be > 0). Bounds GC's share of the disk and of meta's `Collectable`
    /// load; a pass over `n` shards takes at least `n / gc_max_ops_per_sec`
    /// seconds (see [`crate::gc`]).
    pub gc_max_ops_per_sec: u64,
    /// Free bytes the data dir's filesystem keeps: below it the node
    /// heartbeats `writable = false` and PutShard refuses new shards with
    /// `RESOURCE_EXHAUSTED` (bytes; default 1 GiB; 0 = no reserve).
    #[serde(with = "sluice_util::byte_size")]
    pub reserved_free_bytes: ByteSize,
    /// Keep a shard's pages in the page cache after it is fsynced (default
    /// false: they are dropped with `posix_fadvise(POSIX_FADV_DONTNEED)`
    /// once durable, so written shards do not grow the page cache; reads
    /// cache what they read as before). True suits a node whose shards are
    /// read back soon after they are written and whose RAM holds them.
    pub keep_written_pages: bool,
    /// Read rate of scrub (bytes per second; default 10 MiB/s; 0 disables
    /// scrub). See [`crate::scrub`].
    #[serde(with = "sluice_util::byte_size")]
    pub scrub_bandwidth_bytes_per_sec: ByteSize,
    /// From the start of one scrub pass to the start of the next (default
    /// 7 days; any positive humantime, "100ms" in tests).
    #[serde(with = "humantime_serde")]
    pub scrub_interval: Duration,
    /// Read rate of VerifyShards, the heal audit's re-check of shards meta
    /// lists missing (bytes per second, shared by every call; default
    /// 64 MiB/s; 0 refuses VerifyShards, so such shards stay missing and
    /// heal rebuilds them). See [`crate::verify`].
    #[serde(with = "sluice_util::byte_size")]
    pub verify_bandwidth_bytes_per_sec: ByteSize,
    /// Address of this node's Prometheus endpoint (`GET /metrics`), e.g.
    /// `"127.0.0.1:7191"`. Default `None`: no metrics endpoint. The role
    /// library does not read it: the `sluice` binary installs the process-wide
    /// metrics recorder and serves `/metrics` here (one recorder per process,
    /// so `sluice dev`, which runs every role in one process, has its own
    /// `--metrics-listen` flag instead).
    pub metrics_listen: Option<SocketAddr>,
    /// Failure-domain label: the zone (rack, room, availability zone) this
    /// node is in. Default `""`: zones not configured. Placement never puts
    /// more than m shards of a blob in one zone when the cluster has enough
    /// zones (see the gateway's `placement` module). At most
    /// [`MAX_LABEL_LEN`] bytes, no control characters.
    pub zone: String,
    /// Failure-domain label: the machine this node runs on; datanodes
    /// sharing a disk or a machine must share it. Default (unset): the
    /// machine's hostname (see [`Config::host_label`]). Same limits as
    /// `zone`.
    pub host: Option<String>,
    /// Most PutShard and GetShard streams open at once over all
    /// connections (default 4096). One more is refused at once with
    /// `RESOURCE_EXHAUSTED` ("datanode busy"), which the gateway handles as
    /// a failed shard of a busy node (writes and reads use the other shards).
    pub max_shard_streams: usize,
    /// Most concurrent gRPC streams (requests) per connection, e.g. per
    /// gateway (default 1024): HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`,
    /// and requests past it on one connection wait.
    pub max_streams_per_connection: u32,
    /// `[cluster_tls]`: this node's certificate (role `datanode`, id
    /// `node_id`), key and the cluster CA, for mutual TLS on its server and
    /// to meta. Exactly one of this and `insecure_cluster` is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_tls: Option<sluice_net::ClusterTls>,
    /// Serve and dial cluster gRPC in plaintext, every caller allowed (a
    /// warning is logged at start). Default false.
    pub insecure_cluster: bool,
}

/// Longest `zone` / `host` label (bytes).
pub const MAX_LABEL_LEN: usize = 128;

/// The machine's hostname (`/proc/sys/kernel/hostname`, else `$HOSTNAME`,
/// else `"localhost"`).
pub fn machine_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7101)),
            advertise_addr: "http://127.0.0.1:7101".into(),
            data_dir: PathBuf::from("data/datanode"),
            meta_endpoints: vec!["http://127.0.0.1:7001".into()],
            heartbeat_interval: Duration::from_secs(2),
            shard_channel_depth: 8,
            shutdown_grace: Duration::from_secs(10),
            write_budget_bytes: None,
            credit_fsync_bytes: ByteSize(DEFAULT_CREDIT_FSYNC_BYTES),
            credit_fsync_idle: Duration::from_millis(5),
            gc_interval: Duration::from_secs(600),
            gc_grace: Duration::from_secs(600),
            gc_max_ops_per_sec: DEFAULT_GC_MAX_OPS_PER_SEC,
            reserved_free_bytes: ByteSize(DEFAULT_RESERVED_FREE_BYTES),
            keep_written_pages: false,
            scrub_bandwidth_bytes_per_sec: ByteSize(DEFAULT_SCRUB_BANDWIDTH_BYTES_PER_SEC),
            scrub_interval: DEFAULT_SCRUB_INTERVAL,
            verify_bandwidth_bytes_per_sec: ByteSize(DEFAULT_VERIFY_BANDWIDTH_BYTES_PER_SEC),
            metrics_listen: None,
            zone: String::new(),
            host: None,
            max_shard_streams: DEFAULT_MAX_SHARD_STREAMS,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            cluster_tls: None,
            insecure_cluster: false,
        }
    }
}

/// Why a [`Config`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node_id must be at least 1")]
    ZeroNodeId,
    #[error("advertise_addr {0:?} is not an http:// or https:// endpoint")]
    BadAdvertiseAddr(String),
    #[error("data_dir is empty")]
    EmptyDataDir,
    #[error("meta_endpoints is empty")]
    NoMetaEndpoints,
    #[error("meta endpoint {0:?} is not an http:// or https:// endpoint")]
    BadMetaEndpoint(String),
    #[error("heartbeat_interval must be positive")]
    ZeroHeartbeatInterval,
    #[error("shard_channel_depth {0} is outside 1..={MAX_SHARD_CHANNEL_DEPTH}")]
    BadShardChannelDepth(usize),
    #[error("write_budget_bytes must be positive")]
    ZeroWriteBudget,
    #[error("credit_fsync_bytes {fsync} is outside 1..={budget} (the write budget)")]
    BadCreditFsyncBytes { fsync: u64, budget: u64 },
    #[error("credit_fsync_idle must be positive")]
    ZeroCreditFsyncIdle,
    #[error("gc_interval must be positive")]
    ZeroGcInterval,
    #[error("gc_grace must be positive")]
    ZeroGcGrace,
    #[error("scrub_interval must be positive")]
    ZeroScrubInterval,
    #[error(
        "{field} label {value:?} is longer than {MAX_LABEL_LEN} bytes, empty or has control characters"
    )]
    BadLabel { field: &'static str, value: String },
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
    #[error("cluster security: {0}")]
    ClusterSecurity(String),
}

impl Config {
    /// The `host` label this node registers with: `host`, else the
    /// machine's hostname.
    pub fn host_label(&self) -> String {
        self.host.clone().unwrap_or_else(machine_hostname)
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id == 0 {
            return Err(ConfigError::ZeroNodeId);
        }
        if !is_endpoint(&self.advertise_addr) {
            return Err(ConfigError::BadAdvertiseAddr(self.advertise_addr.clone()));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::EmptyDataDir);
        }
        if self.meta_endpoints.is_empty() {
            return Err(ConfigError::NoMetaEndpoints);
        }
        if let Some(bad) = self.meta_endpoints.iter().find(|e| !is_endpoint(e)) {
            return Err(ConfigError::BadMetaEndpoint(bad.clone()));
        }
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::ZeroHeartbeatInterval);
        }
        if !(1..=MAX_SHARD_CHANNEL_DEPTH).contains(&self.shard_channel_depth) {
            return Err(ConfigError::BadShardChannelDepth(self.shard_channel_depth));
        }
        let budget = self.write_budget();
        if budget == 0 {
            return Err(ConfigError::ZeroWriteBudget);
        }
        if !(1..=budget).contains(&self.credit_fsync_bytes.as_u64()) {
            return Err(ConfigError::BadCreditFsyncBytes {
                fsync: self.credit_fsync_bytes.as_u64(),
                budget,
            });
        }
        if self.credit_fsync_idle.is_zero() {
            return Err(ConfigError::ZeroCreditFsyncIdle);
        }
        if self.gc_interval.is_zero() {
            return Err(ConfigError::ZeroGcInterval);
        }
        if self.gc_grace.is_zero() {
            return Err(ConfigError::ZeroGcGrace);
        }
        if self.gc_max_ops_per_sec == 0 {
            return Err(ConfigError::Zero("gc_max_ops_per_sec"));
        }
        if self.scrub_interval.is_zero() {
            return Err(ConfigError::ZeroScrubInterval);
        }
        let bad = |v: &str| v.len() > MAX_LABEL_LEN || v.chars().any(char::is_control);
        if bad(&self.zone) {
            return Err(ConfigError::BadLabel {
                field: "zone",
                value: self.zone.clone(),
            });
        }
        if let Some(h) = &self.host
            && (h.is_empty() || bad(h))
        {
            return Err(ConfigError::BadLabel {
                field: "host",
                value: h.clone(),
            });
        }
        if self.max_shard_streams == 0 {
            return Err(ConfigError::Zero("max_shard_streams"));
        }
        if self.max_streams_per_connection == 0 {
            return Err(ConfigError::Zero("max_streams_per_connection"));
        }
        sluice_net::validate_choice(
            self.cluster_tls.as_ref(),
            self.insecure_cluster,
            sluice_net::Role::Datanode,
            Some(&self.node_id.to_string()),
        )
        .map_err(|e| ConfigError::ClusterSecurity(e.to_string()))?;
        Ok(())
    }

    /// The effective write budget in bytes: `write_budget_bytes`, or
    /// [`DEFAULT_WRITE_BUDGET_BYTES`] when unset.
    pub fn write_budget(&self) -> u64 {
        self.write_budget_bytes
            .map_or(DEFAULT_WRITE_BUDGET_BYTES, |b| b.as_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `c` in plaintext (these tests are not about cluster TLS).
    fn insecure(c: &Config) -> Config {
        Config {
            cluster_tls: None,
            insecure_cluster: true,
            ..c.clone()
        }
    }

    #[test]
    fn default_is_valid() {
        insecure(&Config::default())
            .validate()
            .expect("default config validates");
        // Cluster security is a choice: TLS or an explicit plaintext opt-in.
        assert!(matches!(
            Config::default().validate(),
            Err(ConfigError::ClusterSecurity(_))
        ));
    }

    #[test]
    fn parses_toml_with_defaults() {
        let c: Config = toml::from_str(
            r#"
            node_id = 3
            listen = "0.0.0.0:7103"
            advertise_addr = "http://10.0.0.3:7103"
            data_dir = "/var/lib/sluice/dn3"
            meta_endpoints = ["http://10.0.0.1:7001", "http://10.0.0.2:7001"]
            heartbeat_interval = "500ms"
            "#,
        )
        .expect("parse");
        assert_eq!(c.node_id, 3);
        assert_eq!(c.listen, "0.0.0.0:7103".parse().unwrap());
        assert_eq!(c.meta_endpoints.len(), 2);
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.shard_channel_depth, 8);
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.write_budget_bytes, None);
        assert_eq!(c.write_budget(), 64 * 1024 * 1024);
        assert_eq!(c.credit_fsync_bytes, ByteSize(1024 * 1024));
        assert_eq!(c.credit_fsync_idle, Duration::from_millis(5));
        assert_eq!(c.gc_interval, Duration::from_secs(600));
        assert_eq!(c.gc_grace, Duration::from_secs(600));
        assert_eq!(c.gc_max_ops_per_sec, 2000);
        assert_eq!(c.reserved_free_bytes, ByteSize(1 << 30));
        assert!(!c.keep_written_pages);
        assert_eq!(c.scrub_bandwidth_bytes_per_sec, ByteSize(10 << 20));
        assert_eq!(c.scrub_interval, Duration::from_secs(7 * 24 * 3600));
        insecure(&c).validate().expect("valid");

        let c: Config = toml::from_str(
            "reserved_free_bytes = 0\nscrub_bandwidth_bytes_per_sec = 0\nscrub_interval = \"50ms\"\nkeep_written_pages = true",
        )
        .expect("parse disk fields");
        assert!(c.keep_written_pages);
        assert_eq!(c.reserved_free_bytes, ByteSize(0));
        assert_eq!(c.scrub_bandwidth_bytes_per_sec, ByteSize(0));
        assert_eq!(c.scrub_interval, Duration::from_millis(50));
        insecure(&c)
            .validate()
            .expect("a zero reserve and disabled scrub are valid");

        // Byte counts also read as bytesize strings, as in every role.
        let c: Config = toml::from_str(
            "write_budget_bytes = \"128 MiB\"\ncredit_fsync_bytes = \"2 MiB\"\nreserved_free_bytes = \"5 GiB\"\nscrub_bandwidth_bytes_per_sec = \"20 MiB\"",
        )
        .expect("parse bytesize strings");
        assert_eq!(c.write_budget_bytes, Some(ByteSize(128 << 20)));
        assert_eq!(c.credit_fsync_bytes, ByteSize(2 << 20));
        assert_eq!(c.reserved_free_bytes, ByteSize(5 << 30));
        assert_eq!(c.scrub_bandwidth_bytes_per_sec, ByteSize(20 << 20));

        let c: Config =
            toml::from_str("gc_interval = \"100ms\"\ngc_grace = \"2s\"\ngc_max_ops_per_sec = 50")
                .expect("parse gc fields");
        assert_eq!(c.gc_interval, Duration::from_millis(100));
        assert_eq!(c.gc_grace, Duration::from_secs(2));
        assert_eq!(c.gc_max_ops_per_sec, 50);
        insecure(&c).validate().expect("valid");

        let c: Config = toml::from_str(
            r#"
            write_budget_bytes = 4194304
            credit_fsync_bytes = 262144
            credit_fsync_idle = "2ms"
            "#,
        )
        .expect("parse credit fields");
        assert_eq!(c.write_budget(), 4 * 1024 * 1024);
        assert_eq!(c.credit_fsync_bytes, ByteSize(256 * 1024));
        assert_eq!(c.credit_fsync_idle, Duration::from_millis(2));
        insecure(&c).validate().expect("valid");

        let empty: Config = toml::from_str("").expect("parse empty");
        assert_eq!(empty, Config::default());
        assert!(
            toml::from_str::<Config>("nodeid = 1").is_err(),
            "unknown fields are rejected"
        );
    }

    #[test]
    fn the_deploy_example_parses_with_the_disk_keys() {
        let c: Config =
            toml::from_str(include_str!("../../deploy/datanode.toml")).expect("parse example");
        insecure(&c).validate().expect("example valid");
        assert_eq!(c.gc_grace, Duration::from_secs(600));
        assert_eq!(c.gc_max_ops_per_sec, DEFAULT_GC_MAX_OPS_PER_SEC);
        assert_eq!(c.reserved_free_bytes, ByteSize(DEFAULT_RESERVED_FREE_BYTES));
        assert!(!c.keep_written_pages);
        assert_eq!(
            c.scrub_bandwidth_bytes_per_sec,
            ByteSize(DEFAULT_SCRUB_BANDWIDTH_BYTES_PER_SEC)
        );
        assert_eq!(c.scrub_interval, DEFAULT_SCRUB_INTERVAL);
    }

    #[test]
    fn failure_domain_labels() {
        let c: Config = toml::from_str("zone = \"rack-a\"\nhost = \"s1\"\ninsecure_cluster = true")
            .expect("parse");
        assert_eq!(
            (c.zone.as_str(), c.host_label()),
            ("rack-a", "s1".to_string())
        );
        c.validate().expect("valid labels");
        let d = Config::default();
        assert_eq!(d.zone, "");
        assert_eq!(d.host_label(), machine_hostname());
        assert!(!d.host_label().is_empty());
        for (zone, host) in [
            ("a\nb", None),
            ("", Some(String::new())),
            ("", Some("x".repeat(MAX_LABEL_LEN + 1))),
        ] {
            let c = Config {
                zone: zone.into(),
                host,
                insecure_cluster: true,
                ..Config::default()
            };
            assert!(
                matches!(c.validate(), Err(ConfigError::BadLabel { .. })),
                "{c:?}"
            );
        }
    }

    #[test]
    fn validate_rejects_bad_fields() {
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            c.validate().expect_err("invalid")
        };
        assert_eq!(bad(|c| c.node_id = 0), ConfigError::ZeroNodeId);
        assert_eq!(
            bad(|c| c.advertise_addr = "127.0.0.1:7101".into()),
            ConfigError::BadAdvertiseAddr("127.0.0.1:7101".into())
        );
        assert_eq!(
            bad(|c| c.data_dir = PathBuf::new()),
            ConfigError::EmptyDataDir
        );
        assert_eq!(
            bad(|c| c.meta_endpoints.clear()),
            ConfigError::NoMetaEndpoints
        );
        assert_eq!(
            bad(|c| c.meta_endpoints.push("meta:7001".into())),
            ConfigError::BadMetaEndpoint("meta:7001".into())
        );
        assert_eq!(
            bad(|c| c.heartbeat_interval = Duration::ZERO),
            ConfigError::ZeroHeartbeatInterval
        );
        assert_eq!(
            bad(|c| c.shard_channel_depth = 0),
            ConfigError::BadShardChannelDepth(0)
        );
        assert_eq!(
            bad(|c| c.write_budget_bytes = Some(ByteSize(0))),
            ConfigError::ZeroWriteBudget
        );
        assert_eq!(
            bad(|c| c.credit_fsync_bytes = ByteSize(0)),
            ConfigError::BadCreditFsyncBytes {
                fsync: 0,
                budget: DEFAULT_WRITE_BUDGET_BYTES
            }
        );
        assert_eq!(
            bad(|c| {
                c.write_budget_bytes = Some(ByteSize(1000));
                c.credit_fsync_bytes = ByteSize(1001);
            }),
            ConfigError::BadCreditFsyncBytes {
                fsync: 1001,
                budget: 1000
            }
        );
        assert_eq!(
            bad(|c| c.credit_fsync_idle = Duration::ZERO),
            ConfigError::ZeroCreditFsyncIdle
        );
        assert_eq!(
            bad(|c| c.gc_interval = Duration::ZERO),
            ConfigError::ZeroGcInterval
        );
        assert_eq!(
            bad(|c| c.gc_grace = Duration::ZERO),
            ConfigError::ZeroGcGrace
        );
        assert_eq!(
            bad(|c| c.gc_max_ops_per_sec = 0),
            ConfigError::Zero("gc_max_ops_per_sec")
        );
        assert_eq!(
            bad(|c| c.scrub_interval = Duration::ZERO),
            ConfigError::ZeroScrubInterval
        );
    }
}
