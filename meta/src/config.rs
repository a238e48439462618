//! [`Config`] of a meta node (TOML, `[meta]`-style table of the binary).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_net::is_endpoint;
use sluice_util::byte_size::ByteSize;

/// Configuration of one meta node. Every field has a default (see
/// [`Config::default`]); durations are humantime strings ("250ms", "6s"),
/// sizes plain byte counts or bytesize strings ("64 MiB").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Raft node id, unique in the cluster. Default 1.
    pub node_id: u64,
    /// Address the gRPC server (Raft and Meta services) binds. Default
    /// `127.0.0.1:7001`. `run` takes an already bound listener; the binary
    /// binds this address.
    pub listen: SocketAddr,
    /// gRPC endpoint peers and clients use to reach this node. Default
    /// `http://127.0.0.1:7001`.
    pub advertise_addr: String,
    /// Directory of the sled database (Raft log, vote, state machine) and,
    /// in its `raft-snapshots` subdirectory, the snapshot files. Default
    /// `data/meta`.
    pub data_dir: PathBuf,
    /// Initial voters: node id -> advertise address. Empty means a
    /// single-voter cluster of this node. The node with the lowest id
    /// initializes the cluster on first start. In TOML a table whose keys
    /// are the ids: `[voters]` / `1 = "http://10.0.0.1:7001"`. Default empty.
    ///
    /// Only the very first start reads it: from then on membership lives in
    /// Raft (changed with `sluice admin meta add|remove|replace`), and a
    /// restarted node ignores this table.
    #[serde(with = "voter_map")]
    pub voters: BTreeMap<u64, String>,
    /// This node joins an existing cluster: on a start without Raft state it
    /// never initializes a cluster and waits until the leader adds it
    /// (`sluice admin meta add --id N --addr URL`); `voters` may then be
    /// empty or name the other nodes. Default false. Set it for every node
    /// added after the first start (a node whose data dir was wiped rejoins
    /// under a new id, after `sluice admin meta remove` of its old one:
    /// Raft assumes a voter never loses its log): a fresh node with
    /// `join = false` and no `voters` would initialize a cluster of its own.
    pub join: bool,
    /// sled page cache size in bytes. Default 64 MiB.
    #[serde(with = "sluice_util::byte_size")]
    pub sled_cache_bytes: ByteSize,
    /// Raft election timeout range. Defaults 1s and 2s.
    #[serde(with = "humantime_serde")]
    pub election_timeout_min: Duration,
    #[serde(with = "humantime_serde")]
    pub election_timeout_max: Duration,
    /// Leader heartbeat interval. Default 250ms.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Build a snapshot (and purge the log) after at least this many
    /// applied entries since the last one; a larger snapshot waits for
    /// proportionally more (its bytes / 1 KiB), so building costs the same
    /// per entry at any size. Default 5000.
    pub snapshot_logs_since_last: u64,
    /// Log entries kept before the last snapshot for lagging followers.
    /// Default 1000.
    pub max_in_snapshot_log_to_keep: u64,
    /// A datanode is live if it heartbeat within this window; for this long
    /// after becoming leader every registered datanode counts as live.
    /// Default 6s.
    #[serde(with = "humantime_serde")]
    pub datanode_liveness: Duration,
    /// TCP connect timeout for Raft RPCs to peers. Default 1s.
    #[serde(with = "humantime_serde")]
    pub peer_connect_timeout: Duration,
    /// How often the leader looks for stale multipart uploads (the first
    /// look is one interval after the node starts). Default 6h; any
    /// positive humantime ("200ms" in tests).
    #[serde(with = "humantime_serde")]
    pub stale_upload_check_interval: Duration,
    /// A multipart upload initiated longer ago than this (by its record's
    /// `initiated_ms`) is aborted by the leader's sweeper through Raft, like
    /// AbortMultipartUpload; its parts' shards become garbage for the
    /// datanodes' shard GC. Default 24h; any positive humantime.
    #[serde(with = "humantime_serde")]
    pub stale_upload_expiry: Duration,
    /// How often the leader runs the buckets' lifecycle rules (expiring
    /// objects, aborting incomplete multipart uploads; the first run is one
    /// interval after the node starts). Default 1h.
    #[serde(with = "humantime_serde")]
    pub lifecycle_check_interval: Duration,
    /// How long a lifecycle "day" is. Default 24h, with S3's rounding to
    /// midnight UTC; a shorter one (tests) is not rounded, like Ceph RGW's
    /// `rgw_lc_debug_interval`.
    #[serde(with = "humantime_serde")]
    pub lifecycle_day: Duration,
    /// Address of this node's Prometheus endpoint (`GET /metrics`), e.g.
    /// `"127.0.0.1:7091"`. Default `None`: no metrics endpoint. The role
    /// library does not read it: the `sluice` binary installs the process-wide
    /// metrics recorder and serves `/metrics` here (one recorder per process,
    /// so `sluice dev`, which runs every role in one process, has its own
    /// `--metrics-listen` flag instead).
    pub metrics_listen: Option<SocketAddr>,
    /// Most client session entries (op id -> first outcome) the table may
    /// hold: the leader refuses a new operation with `503 SlowDown` (meta's
    /// `SLOW_DOWN`) rather than go past it; nothing is evicted to make
    /// room. Read by the leader only (apply never reads it), so voters may
    /// differ. Default 100 000.
    pub session_table_max_entries: u64,
    /// A session entry applied longer ago than this (by the leader's
    /// monotonic clock) is expired by the leader's sweeper. At least
    /// `session_min_age`, and more than 2 × `epoch_lease` +
    /// `client_retry_deadline`. Default 10 min.
    #[serde(with = "humantime_serde")]
    pub session_expiry: Duration,
    /// While the table holds more than `session_high_water` ×
    /// `session_table_max_entries` entries, the leader's sweeper also
    /// removes the oldest entries applied longer ago than this, down to the
    /// mark; it never removes a younger one. At least 2 ×
    /// `client_retry_deadline`: the deadline, plus as much again for an
    /// attempt sent just before it to reach the leader. Default 45 s.
    #[serde(with = "humantime_serde")]
    pub session_min_age: Duration,
    /// The fraction of `session_table_max_entries` above which entries
    /// older than `session_min_age` are removed. In (0, 1]. Default 0.9.
    pub session_high_water: f64,
    /// The longest retry deadline of the MetaClients whose mutations this
    /// cluster serves: no attempt of an operation is sent later than this
    /// after the operation began (a gateway's client: 20 s). Bounds
    /// `session_min_age` and `session_expiry` from below. Default 20 s.
    #[serde(with = "humantime_serde")]
    pub client_retry_deadline: Duration,
    /// How often the leader expires old session entries. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub session_sweep_interval: Duration,
    /// The *initial* write epoch lease of a new cluster: a leader proposes
    /// it once while the replicated cluster settings hold no value
    /// (`sm::settings`); afterwards the replicated `epoch_lease_ms` is in
    /// force on every node, whatever this says, and is changed with
    /// `sluice admin settings set --epoch-lease`. A write epoch not renewed
    /// for the lease is closed by the leader's sweeper; OpenEpoch reports it
    /// to gateways, which renew every lease/3. 1 ms ..= 1 h. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub epoch_lease: Duration,
    /// How often the leader looks for expired write epochs. Default 2 s;
    /// any positive humantime ("50ms" in tests).
    #[serde(with = "humantime_serde")]
    pub epoch_sweep_interval: Duration,
    /// How often the leader's reclaimer deletes the shards of released
    /// blobs whose `delete_delay` passed. Default 30 s; any positive
    /// humantime ("100ms" in tests).
    #[serde(with = "humantime_serde")]
    pub reclaim_interval: Duration,
    /// A released blob's shards are deleted this long (leader time) after
    /// the release, so GETs that started before it read to the end; longer
    /// than a GET's per-stripe stall (30 s). Default 5 min.
    #[serde(with = "humantime_serde")]
    pub delete_delay: Duration,
    /// Most DeleteBlobs calls the reclaimer has in flight. Default 4.
    pub reclaim_concurrency: usize,
    /// Timeout of one DeleteBlobs call (connect included). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub reclaim_call_timeout: Duration,
    /// `[cluster_tls]`: this node's certificate (role `meta`, id
    /// `node_id`), key and the cluster CA, for mutual TLS on the Raft,
    /// Meta and Admin services and to the datanodes. Exactly one of this
    /// and `insecure_cluster` is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_tls: Option<sluice_net::ClusterTls>,
    /// Serve and dial cluster gRPC in plaintext, every caller allowed (a
    /// warning is logged at start). Default false.
    pub insecure_cluster: bool,
    /// The leader raises the cluster version by itself once every meta
    /// node (voters and learners) runs a binary that understands its
    /// replicated format, checked every `version_check_interval` (as
    /// CockroachDB does by default). Set it to false on the new binaries
    /// before a rolling upgrade to keep the option of rolling back to the
    /// previous release until `sluice admin version finalize`. Read by the
    /// leader only. Default true.
    pub auto_finalize: bool,
    /// How often the leader checks whether the cluster version can be
    /// finalized (with `auto_finalize`, or when none is recorded yet).
    /// Default 30 s.
    #[serde(with = "humantime_serde")]
    pub version_check_interval: Duration,
    /// Timeout of one `NodeVersion` call from the leader to another meta
    /// node (connect included). Default 2 s.
    #[serde(with = "humantime_serde")]
    pub version_call_timeout: Duration,
    /// Testing only: this node behaves as a binary that understands
    /// replicated formats up to this one (it reports it, applies entries up
    /// to it, and finalizes to it as leader), to test upgrades without two
    /// builds. Default none: the binary's own format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicated_format_override: Option<u32>,
    /// Testing only: command kind (`"CreateBucket"`) -> the replicated
    /// format it requires on this node as leader, in place of the
    /// binary's, to test the gate without a newer command kind. Not read
    /// from TOML.
    #[doc(hidden)]
    #[serde(skip)]
    pub testing_command_formats: Vec<(String, u32)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7001)),
            advertise_addr: "http://127.0.0.1:7001".to_string(),
            data_dir: PathBuf::from("data/meta"),
            voters: BTreeMap::new(),
            join: false,
            sled_cache_bytes: ByteSize::mib(64),
            election_timeout_min: Duration::from_millis(1000),
            election_timeout_max: Duration::from_millis(2000),
            heartbeat_interval: Duration::from_millis(250),
            snapshot_logs_since_last: 5000,
            max_in_snapshot_log_to_keep: 1000,
            datanode_liveness: Duration::from_secs(6),
            peer_connect_timeout: Duration::from_secs(1),
            stale_upload_check_interval: Duration::from_secs(6 * 3600),
            stale_upload_expiry: Duration::from_secs(24 * 3600),
            lifecycle_check_interval: Duration::from_secs(3600),
            lifecycle_day: Duration::from_secs(24 * 3600),
            metrics_listen: None,
            session_table_max_entries: crate::sm::sessions::DEFAULT_MAX_ENTRIES,
            session_expiry: Duration::from_secs(600),
            session_min_age: Duration::from_secs(45),
            session_high_water: 0.9,
            client_retry_deadline: Duration::from_secs(20),
            session_sweep_interval: Duration::from_secs(5),
            epoch_lease: Duration::from_millis(crate::sm::settings::DEFAULT_LEASE_MS),
            epoch_sweep_interval: Duration::from_secs(2),
            reclaim_interval: Duration::from_secs(30),
            delete_delay: Duration::from_secs(300),
            reclaim_concurrency: 4,
            reclaim_call_timeout: Duration::from_secs(10),
            cluster_tls: None,
            insecure_cluster: false,
            auto_finalize: true,
            version_check_interval: Duration::from_secs(30),
            version_call_timeout: Duration::from_secs(2),
            replicated_format_override: None,
            testing_command_formats: Vec::new(),
        }
    }
}

/// What is wrong with a [`Config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("advertise_addr {0:?} must be an http:// or https:// URL")]
    AdvertiseAddr(String),
    #[error("epoch_lease ({0:?}) must be at most 1 h")]
    EpochLeaseTooLong(Duration),
    #[error("voter {id} has address {addr:?}, which is not an http:// or https:// URL")]
    VoterAddr { id: u64, addr: String },
    #[error("voters do not include this node's id {0}")]
    NotAVoter(u64),
    #[error(
        "need heartbeat_interval ({heartbeat:?}) < election_timeout_min ({min:?}) < election_timeout_max ({max:?})"
    )]
    Timeouts {
        heartbeat: Duration,
        min: Duration,
        max: Duration,
    },
    #[error("snapshot_logs_since_last must be greater than 0")]
    SnapshotInterval,
    #[error("datanode_liveness must be greater than 0")]
    Liveness,
    #[error("sled_cache_bytes is {0}, below the minimum of 1 MiB")]
    CacheTooSmall(u64),
    #[error("stale_upload_check_interval must be greater than 0")]
    StaleUploadCheckInterval,
    #[error("lifecycle_check_interval and lifecycle_day must be greater than 0")]
    Lifecycle,
    #[error("stale_upload_expiry must be greater than 0")]
    StaleUploadExpiry,
    #[error("session_table_max_entries must be greater than 0")]
    SessionTableMax,
    #[error(
        "session_expiry ({expiry:?}) must exceed 2 x epoch_lease ({lease:?}) + client_retry_deadline ({deadline:?}) and be at least session_min_age ({min_age:?})"
    )]
    SessionExpiry {
        expiry: Duration,
        lease: Duration,
        deadline: Duration,
        min_age: Duration,
    },
    #[error(
        "session_min_age ({min_age:?}) must be at least 2 x client_retry_deadline ({deadline:?})"
    )]
    SessionMinAge {
        min_age: Duration,
        deadline: Duration,
    },
    #[error("session_high_water ({0}) must be in (0, 1]")]
    SessionHighWater(String),
    #[error("{0} must be greater than 0")]
    Zero(&'static str),
    #[error("cluster security: {0}")]
    ClusterSecurity(String),
}

impl Config {
    /// Checks the fields against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_endpoint(&self.advertise_addr) {
            return Err(ConfigError::AdvertiseAddr(self.advertise_addr.clone()));
        }
        if let Some((id, addr)) = self.voters.iter().find(|(_, a)| !is_endpoint(a)) {
            return Err(ConfigError::VoterAddr {
                id: *id,
                addr: addr.clone(),
            });
        }
        if !self.join && !self.voters.is_empty() && !self.voters.contains_key(&self.node_id) {
            return Err(ConfigError::NotAVoter(self.node_id));
        }
        if !(self.heartbeat_interval < self.election_timeout_min
            && self.election_timeout_min < self.election_timeout_max)
        {
            return Err(ConfigError::Timeouts {
                heartbeat: self.heartbeat_interval,
                min: self.election_timeout_min,
                max: self.election_timeout_max,
            });
        }
        if self.snapshot_logs_since_last == 0 {
            return Err(ConfigError::SnapshotInterval);
        }
        if self.datanode_liveness.is_zero() {
            return Err(ConfigError::Liveness);
        }
        if self.sled_cache_bytes < ByteSize::mib(1) {
            return Err(ConfigError::CacheTooSmall(self.sled_cache_bytes.as_u64()));
        }
        if self.stale_upload_check_interval.is_zero() {
            return Err(ConfigError::StaleUploadCheckInterval);
        }
        if self.lifecycle_check_interval.is_zero() || self.lifecycle_day.is_zero() {
            return Err(ConfigError::Lifecycle);
        }
        if self.stale_upload_expiry.is_zero() {
            return Err(ConfigError::StaleUploadExpiry);
        }
        if self.session_table_max_entries == 0 {
            return Err(ConfigError::SessionTableMax);
        }
        for (name, d) in [
            ("session_sweep_interval", self.session_sweep_interval),
            ("client_retry_deadline", self.client_retry_deadline),
            ("epoch_lease", self.epoch_lease),
            ("epoch_sweep_interval", self.epoch_sweep_interval),
            ("reclaim_interval", self.reclaim_interval),
            ("reclaim_call_timeout", self.reclaim_call_timeout),
            ("version_check_interval", self.version_check_interval),
            ("version_call_timeout", self.version_call_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.reclaim_concurrency == 0 {
            return Err(ConfigError::Zero("reclaim_concurrency"));
        }
        if self.replicated_format_override == Some(0) {
            return Err(ConfigError::Zero("replicated_format_override"));
        }
        if self.epoch_lease > Duration::from_millis(crate::sm::settings::MAX_LEASE_MS) {
            return Err(ConfigError::EpochLeaseTooLong(self.epoch_lease));
        }
        sluice_net::validate_choice(
            self.cluster_tls.as_ref(),
            self.insecure_cluster,
            sluice_net::Role::Meta,
            Some(&self.node_id.to_string()),
        )
        .map_err(|e| ConfigError::ClusterSecurity(e.to_string()))?;
        if self.session_min_age < self.client_retry_deadline * 2 {
            return Err(ConfigError::SessionMinAge {
                min_age: self.session_min_age,
                deadline: self.client_retry_deadline,
            });
        }
        if self.session_expiry <= self.epoch_lease * 2 + self.client_retry_deadline
            || self.session_expiry < self.session_min_age
        {
            return Err(ConfigError::SessionExpiry {
                expiry: self.session_expiry,
                lease: self.epoch_lease,
                deadline: self.client_retry_deadline,
                min_age: self.session_min_age,
            });
        }
        if !(self.session_high_water > 0.0 && self.session_high_water <= 1.0) {
            return Err(ConfigError::SessionHighWater(
                self.session_high_water.to_string(),
            ));
        }
        Ok(())
    }

    /// The initial voters, with this node alone when `voters` is empty.
    pub fn initial_voters(&self) -> BTreeMap<u64, String> {
        if self.voters.is_empty() {
            BTreeMap::from([(self.node_id, self.advertise_addr.clone())])
        } else {
            self.voters.clone()
        }
    }
}

/// Node id -> address, with the ids as map keys (TOML keys are strings).
mod voter_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &BTreeMap<u64, String>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(v.iter().map(|(id, addr)| (id.to_string(), addr)))
    }

    #[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord)]
    #[serde(untagged)]
    enum Key {
        Int(u64),
        Str(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u64, String>, D::Error> {
        let raw = BTreeMap::<Key, String>::deserialize(d)?;
        raw.into_iter()
            .map(|(k, addr)| match k {
                Key::Int(id) => Ok((id, addr)),
                Key::Str(s) => s
                    .parse::<u64>()
                    .map(|id| (id, addr))
                    .map_err(|_| D::Error::custom(format!("voter id {s:?} is not an integer"))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults in plaintext (these tests are not about cluster TLS).
    fn dflt() -> Config {
        Config {
            insecure_cluster: true,
            ..Config::default()
        }
    }

    fn insecure(c: &Config) -> Config {
        Config {
            cluster_tls: None,
            insecure_cluster: true,
            ..c.clone()
        }
    }

    #[test]
    fn cluster_security_is_required() {
        assert!(matches!(
            Config::default().validate(),
            Err(ConfigError::ClusterSecurity(_))
        ));
    }

    #[test]
    fn parses_toml_with_defaults_and_sizes() {
        let c: Config = toml::from_str(
            r#"
            node_id = 2
            advertise_addr = "http://10.0.0.2:7001"
            sled_cache_bytes = "128 MiB"
            election_timeout_min = "500ms"
            election_timeout_max = "1s"
            heartbeat_interval = "100ms"
            [voters]
            1 = "http://10.0.0.1:7001"
            2 = "http://10.0.0.2:7001"
            "#,
        )
        .unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.sled_cache_bytes, ByteSize::mib(128));
        assert_eq!(c.election_timeout_min, Duration::from_millis(500));
        assert_eq!(c.voters.len(), 2);
        assert_eq!(c.snapshot_logs_since_last, 5000);
        assert_eq!(c.datanode_liveness, Duration::from_secs(6));
        assert_eq!(c.stale_upload_check_interval, Duration::from_secs(6 * 3600));
        assert_eq!(c.stale_upload_expiry, Duration::from_secs(24 * 3600));
        insecure(&c).validate().unwrap();

        let s: Config =
            toml::from_str("stale_upload_check_interval = \"200ms\"\nstale_upload_expiry = \"1s\"")
                .unwrap();
        assert_eq!(s.stale_upload_check_interval, Duration::from_millis(200));
        assert_eq!(s.stale_upload_expiry, Duration::from_secs(1));
        insecure(&s).validate().unwrap();

        let n: Config = toml::from_str("sled_cache_bytes = 2097152").unwrap();
        assert_eq!(n.sled_cache_bytes, ByteSize::mib(2));
        assert!(toml::from_str::<Config>("bogus = 1").is_err());
        assert!(toml::from_str::<Config>("[voters]\nx = \"http://a:1\"").is_err());
        // Serializes back to TOML that parses to the same config.
        let back: Config = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn validate_rejects_bad_values() {
        dflt().validate().unwrap();
        let bad = Config {
            voters: BTreeMap::from([(5, "http://x:1".to_string())]),
            ..dflt()
        };
        assert_eq!(bad.validate(), Err(ConfigError::NotAVoter(1)));
        // A joining node need not be among the initial voters.
        let joining = Config {
            voters: BTreeMap::from([(5, "http://x:1".to_string())]),
            join: true,
            ..dflt()
        };
        joining.validate().unwrap();
        let parsed: Config = toml::from_str("node_id = 4\njoin = true").unwrap();
        assert!(parsed.join);
        let bad = Config {
            election_timeout_min: Duration::from_millis(100),
            ..dflt()
        };
        assert!(matches!(bad.validate(), Err(ConfigError::Timeouts { .. })));
        let bad = Config {
            advertise_addr: "127.0.0.1:7001".into(),
            ..dflt()
        };
        assert!(matches!(bad.validate(), Err(ConfigError::AdvertiseAddr(_))));
        let bad = Config {
            stale_upload_check_interval: Duration::ZERO,
            ..dflt()
        };
        assert_eq!(bad.validate(), Err(ConfigError::StaleUploadCheckInterval));
        let bad = Config {
            stale_upload_expiry: Duration::ZERO,
            ..dflt()
        };
        assert_eq!(bad.validate(), Err(ConfigError::StaleUploadExpiry));
        assert_eq!(dflt().initial_voters().len(), 1);
        let bad = Config {
            session_expiry: Duration::from_secs(80),
            ..dflt()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::SessionExpiry { .. })
        ));
        let ok = Config {
            session_expiry: Duration::from_secs(81),
            ..dflt()
        };
        ok.validate().unwrap();
        // The minimum age covers a retry deadline and as much again.
        let bad = Config {
            session_min_age: Duration::from_secs(39),
            ..dflt()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::SessionMinAge { .. })
        ));
        let bad = Config {
            client_retry_deadline: Duration::from_secs(25),
            ..dflt()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::SessionMinAge { .. })
        ));
        let bad = Config {
            session_min_age: Duration::from_secs(900),
            ..dflt()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::SessionExpiry { .. })
        ));
        // Compressed time (tests): every bound scales with the deadline.
        let fast = Config {
            client_retry_deadline: Duration::from_millis(100),
            session_min_age: Duration::from_millis(200),
            epoch_lease: Duration::from_millis(300),
            session_expiry: Duration::from_millis(701),
            ..dflt()
        };
        fast.validate().unwrap();
        for hw in [0.0, 1.5, f64::NAN] {
            let bad = Config {
                session_high_water: hw,
                ..dflt()
            };
            assert!(matches!(
                bad.validate(),
                Err(ConfigError::SessionHighWater(_))
            ));
        }
        let bad = Config {
            reclaim_interval: Duration::ZERO,
            ..dflt()
        };
        assert_eq!(bad.validate(), Err(ConfigError::Zero("reclaim_interval")));
        let bad = Config {
            session_table_max_entries: 0,
            ..dflt()
        };
        assert_eq!(bad.validate(), Err(ConfigError::SessionTableMax));
    }

    #[test]
    fn durability_keys_parse_with_defaults() {
        let c = dflt();
        assert_eq!(c.session_table_max_entries, 100_000);
        assert_eq!(c.session_expiry, Duration::from_secs(600));
        assert_eq!(c.session_min_age, Duration::from_secs(45));
        assert_eq!(c.session_high_water, 0.9);
        assert_eq!(c.client_retry_deadline, Duration::from_secs(20));
        assert_eq!(c.session_sweep_interval, Duration::from_secs(5));
        assert_eq!(c.epoch_lease, Duration::from_secs(30));
        assert_eq!(c.delete_delay, Duration::from_secs(300));
        let t: Config = toml::from_str(
            "epoch_sweep_interval = \"50ms\"\nreclaim_interval = \"100ms\"\ndelete_delay = \"1s\"\nsession_expiry = \"15m\"",
        )
        .unwrap();
        assert_eq!(t.epoch_sweep_interval, Duration::from_millis(50));
        assert_eq!(t.reclaim_interval, Duration::from_millis(100));
        assert_eq!(t.delete_delay, Duration::from_secs(1));
        assert_eq!(t.session_expiry, Duration::from_secs(900));
        insecure(&t).validate().unwrap();
    }
}
