//! Gateway configuration: TOML into [`Config`], checked by [`Config::validate`].
//!
//! Durations are humantime strings (`"2s"`); sizes are plain integers of
//! bytes or bytesize strings (`"256 KiB"`).
//!
//! # Flow-control knobs (see [`crate::admission`] for the memory formula)
//! * `max_inflight_requests` — requests admitted at once; past it, `503 SlowDown`.
//! * `buffer_budget_bytes` — bytes of write-path stripe and shard buffers.
//! * `read_budget_bytes` — bytes of read-path stripes.
//! * `stall_timeout` — longest wait for a buffer or for datanode credit.
//! * `credit_idle_timeout` — unused datanode credit is returned after this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_util::byte_size::ByteSize;

/// Largest `k + m` the Reed–Solomon code over GF(2^8) supports.
pub const MAX_TOTAL_SHARDS: usize = 256;
/// Largest shard block size accepted (bytes); the wire contract's limit
/// (`sluice_proto::shard::MAX_BLOCK_SIZE`).
pub const MAX_BLOCK_SIZE: usize = sluice_proto::shard::MAX_BLOCK_SIZE as usize;
/// `max_inflight_requests` when not configured.
pub const DEFAULT_MAX_INFLIGHT_REQUESTS: usize = 256;
/// Write buffer budget when `buffer_budget_bytes` is unset: 256 MiB. This is
/// the library's default (tests, embedding); the `sluice` binary fills an
/// unset budget from the process's memory limit before the config gets
/// here (`sluice/src/budget.rs`, `GATEWAY_BUFFER` and `DEV_GATEWAY_BUFFER`),
/// so a deployed gateway uses this value only if set explicitly.
pub const DEFAULT_BUFFER_BUDGET_BYTES: u64 = 256 * 1024 * 1024;
/// Read buffer budget when `read_budget_bytes` is unset: 128 MiB (the
/// library's default; the binary derives it as half the buffer budget, see
/// [`DEFAULT_BUFFER_BUDGET_BYTES`]).
pub const DEFAULT_READ_BUDGET_BYTES: u64 = 128 * 1024 * 1024;
/// Largest accepted budget (bytes): what a `tokio::sync::Semaphore` can count.
pub const MAX_BUDGET_BYTES: u64 = (tokio::sync::Semaphore::MAX_PERMITS as u64) >> 1;

/// Configuration of one gateway (`sluice gateway --config gateway.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the S3 endpoint listens on (default `127.0.0.1:9000`).
    pub listen: SocketAddr,
    /// S3 region reported to clients and expected in SigV4 scopes (default `us-east-1`).
    pub region: String,
    /// Domains under which virtual-hosted-style requests name their bucket
    /// (`Host: <bucket>.<root domain>`), e.g. `["s3.example.test"]`; a single
    /// string is accepted too (`root_domain = "s3.example.test"`). Default
    /// none: every request is path style (`/<bucket>/<key>`), which keeps
    /// working for any other host either way. See [`crate::s3::host`].
    #[serde(alias = "root_domain", deserialize_with = "one_or_many")]
    pub root_domains: Vec<String>,
    /// S3 access key id clients sign with. Required.
    pub access_key: String,
    /// S3 secret access key. Required. Debug prints it redacted.
    pub secret_key: Secret,
    /// gRPC endpoints of the meta nodes, e.g. `["http://127.0.0.1:7000"]`. Required.
    pub meta_endpoints: Vec<String>,
    /// `[s3_tls]`: serve S3 over HTTPS (TLS 1.2 and 1.3) with this PEM
    /// certificate chain and private key; SIGHUP reloads both (see
    /// [`crate::tls`]). Exactly one of `s3_tls` and `s3_plaintext` must be
    /// set.
    pub s3_tls: Option<S3Tls>,
    /// Serve S3 over plain HTTP (default false): an explicit opt-in for
    /// development or a TLS-terminating proxy; logs a warning at start.
    pub s3_plaintext: bool,
    /// Erasure data shards per stripe, k (default 4).
    pub data_shards: u32,
    /// Erasure parity shards per stripe, m (default 2, at least 1).
    pub parity_shards: u32,
    /// Bytes per shard block in a full stripe, at most 8 MiB (default 262144,
    /// so a 4+2 stripe holds 1 MiB of payload).
    #[serde(with = "sluice_util::byte_size")]
    pub block_size: ByteSize,
    /// Shards that must be durable before a blob is committed, in `k..=k+m`.
    /// `None` (the default) means `k + 1`.
    pub write_quorum: Option<u32>,
    /// How often the live datanode set is re-read from meta (default 2 s).
    #[serde(with = "humantime_serde")]
    pub datanode_refresh_interval: Duration,
    /// Depth, in shard blocks, of the bounded channel feeding each shard stream (default 4).
    pub shard_channel_depth: usize,
    /// Most S3 connections served at once (default 1024). A connection takes
    /// a slot once the first byte of its first request arrived; until then
    /// it is pending (see `max_pending_connections`). A connection that has
    /// sent bytes waits for a free slot before it is read further.
    pub max_connections: usize,
    /// Most accepted connections that have not sent a byte yet (default
    /// 4096; each costs a socket and a small task, no buffers). Past it the
    /// gateway stops accepting (new clients wait in the TCP backlog) until
    /// one sends or is closed after `header_read_timeout`.
    pub max_pending_connections: usize,
    /// How long a request head may take: from accepting a connection to the
    /// first byte of its first request, and from the first byte of any
    /// request head to the whole head (default 10 s). Then the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may sit with no request in progress
    /// before the next request's first byte (default 60 s).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// While the gateway waits for a request body, at least
    /// `body_min_bytes` must arrive per `body_timeout` of waiting, or the
    /// request fails with `400 RequestTimeout` and releases its buffers
    /// (default 30 s; like nginx's `client_body_timeout`).
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// See `body_timeout` (integer or bytesize string, default 16 KiB).
    #[serde(with = "sluice_util::byte_size")]
    pub body_min_bytes: ByteSize,
    /// Idle time of an S3 connection before TCP keepalive probes start
    /// (default 60 s); `"0s"` turns TCP keepalive off.
    #[serde(with = "humantime_serde")]
    pub tcp_keepalive: Duration,
    /// Serve HTTP/2 (h2c) to S3 clients as well as HTTP/1.1 (default false).
    /// Each HTTP/2 connection may then hold its receive window
    /// (`HTTP2_CONNECTION_WINDOW_BYTES`, 1 MiB) outside the budgets.
    pub http2: bool,
    /// Largest signed `aws-chunked` chunk accepted (default 16 MiB). s3s
    /// holds a signed chunk whole to check its signature; a larger one is
    /// refused with `400 InvalidRequest` before its data is read.
    #[serde(with = "sluice_util::byte_size")]
    pub max_aws_chunk_bytes: ByteSize,
    /// Largest object body stored inline in its metadata record instead of
    /// erasure-coded shards (default 4 KiB; integer or bytesize string; 0
    /// turns inlining off; at most [`MAX_INLINE_BYTES`]). A PutObject or
    /// CopyObject of at most this many bytes is one Raft commit on the meta
    /// quorum and no datanode write; its body is held in gateway memory
    /// while it is read (at most this per request in flight) and is kept,
    /// replicated, in meta's store. MinIO inlines up to 128 KiB in xl.meta,
    /// Garage up to 3 KiB in its object table.
    #[serde(with = "sluice_util::byte_size")]
    pub inline_max_bytes: ByteSize,
    /// Most background deletions in flight of blobs this gateway wrote but
    /// whose commit meta refused (released blobs are deleted by meta, not
    /// here); a request that discards one while all are busy waits for a
    /// slot (default 64).
    pub max_background_deletes: usize,
    /// How long shutdown waits for open connections to finish their requests (default 30 s).
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Address of this gateway's Prometheus endpoint (`GET /metrics`), e.g.
    /// `"127.0.0.1:9090"`. Default `None`: no metrics endpoint. The role
    /// library does not read it: the `sluice` binary installs the process-wide
    /// metrics recorder and serves `/metrics` here (one recorder per process,
    /// so `sluice dev`, which runs every role in one process, has its own
    /// `--metrics-listen` flag instead).
    pub metrics_listen: Option<SocketAddr>,
    /// Most S3 requests admitted at once (default 256). A request past it
    /// gets `503 SlowDown` with `Retry-After: 1` before its body is read.
    pub max_inflight_requests: usize,
    /// Bytes of stripe and shard buffers all uploads together may hold
    /// (one stripe costs `(k + m) * block_size`); a request waits, FIFO,
    /// for its next stripe's share and stops reading its socket meanwhile.
    /// Unset = [`DEFAULT_BUFFER_BUDGET_BYTES`]; see [`Config::buffer_budget`].
    #[serde(with = "sluice_util::byte_size::optional")]
    pub buffer_budget_bytes: Option<ByteSize>,
    /// Bytes of decoded stripes all GETs together may hold (the read-side
    /// twin of `buffer_budget_bytes`). Unset = [`DEFAULT_READ_BUDGET_BYTES`];
    /// see [`Config::read_budget`].
    #[serde(with = "sluice_util::byte_size::optional")]
    pub read_budget_bytes: Option<ByteSize>,
    /// Longest a request waits for a stripe buffer, and a shard block for
    /// datanode credit, before the request ends with `503 SlowDown`
    /// (default 30 s).
    #[serde(with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// Datanode credit left unused this long is returned to the datanode (default 2 s).
    #[serde(with = "humantime_serde")]
    pub credit_idle_timeout: Duration,
    // --- write epochs and released blobs (docs/design/durability.md §3, §4) ---
    /// How often the gateway opens a new write epoch (default 10 min). The
    /// previous epoch is renewed until the writes begun under it finished,
    /// then left to expire on meta, which lets GC collect its garbage.
    #[serde(with = "humantime_serde")]
    pub epoch_rotation: Duration,
    /// A GET still streaming this long leases the blobs it reads, so that
    /// an overwrite or delete meanwhile cannot have them deleted under it
    /// (default 1 min). Keep it well below meta's `delete_delay` (default
    /// 5 min): a GET is unprotected between `delete_delay` and the moment
    /// its lease is committed.
    #[serde(with = "humantime_serde")]
    pub read_lease_after: Duration,
    // --- heal worker (docs/design/durability.md §6; see `crate::heal`) ---
    /// Whether this gateway runs the heal worker (default true).
    pub heal_enabled: bool,
    /// Shard bytes per second the heal worker may write (integer or
    /// bytesize string, default 32 MiB); 0 disables heal.
    #[serde(with = "sluice_util::byte_size")]
    pub heal_bandwidth_bytes_per_sec: ByteSize,
    /// How often the degraded list is polled (default 10 s).
    #[serde(with = "humantime_serde")]
    pub heal_interval: Duration,
    /// How often a full audit pass runs (default 6 h).
    #[serde(with = "humantime_serde")]
    pub audit_interval: Duration,
    /// A datanode down this long has its shards reported missing (default 10 min).
    #[serde(with = "humantime_serde")]
    pub node_down_after: Duration,
    /// Longest the audit waits for one `VerifyShards` answer, its re-check
    /// of shards marked missing on a live node (default 2 min; a call reads
    /// at most 256 MiB at the datanode's `verify_bandwidth_bytes_per_sec`
    /// and may wait for another gateway's call first). On timeout those
    /// shards stay missing and heal rebuilds them.
    #[serde(with = "humantime_serde")]
    pub audit_verify_timeout: Duration,
    /// Blobs healed at once, and heal stripes holding write budget at once (default 2).
    pub heal_concurrency: usize,
    /// Shard bytes per second the rebalancer may write (integer or
    /// bytesize string, default 8 MiB); 0 disables rebalancing. The
    /// rebalancer runs inside the heal worker (`heal_enabled`) and moves
    /// existing shards, one per blob per pass, toward the placement the
    /// current datanode set gives (e.g. onto a new datanode); see
    /// `crate::heal::mover`. Draining nodes are emptied at the heal rate.
    #[serde(with = "sluice_util::byte_size")]
    pub rebalance_bandwidth_bytes_per_sec: ByteSize,
    /// `[cluster_tls]`: this gateway's certificate (role `gateway`; each
    /// gateway process needs its own id, which the datanodes use for its
    /// credit), key and the cluster CA, for mutual TLS to meta and the
    /// datanodes. Exactly one of this and `insecure_cluster` is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_tls: Option<sluice_net::ClusterTls>,
    /// Dial meta and the datanodes in plaintext (a warning is logged at
    /// start). Default false.
    pub insecure_cluster: bool,
}

pub use sluice_util::Secret;

/// `[s3_tls]` of the gateway config: the S3 listener's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Tls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1); keep it mode 0600.
    pub key_file: PathBuf,
}
/// Default of `rebalance_bandwidth_bytes_per_sec`: 8 MiB/s.
pub const DEFAULT_REBALANCE_BANDWIDTH_BYTES_PER_SEC: u64 = 8 * 1024 * 1024;

/// Default of `heal_bandwidth_bytes_per_sec`: 32 MiB/s.
pub const DEFAULT_HEAL_BANDWIDTH_BYTES_PER_SEC: u64 = 32 * 1024 * 1024;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            region: "us-east-1".to_string(),
            root_domains: Vec::new(),
            access_key: String::new(),
            secret_key: Secret::default(),
            meta_endpoints: Vec::new(),
            s3_tls: None,
            s3_plaintext: false,
            data_shards: 4,
            parity_shards: 2,
            block_size: ByteSize::kib(256),
            write_quorum: None,
            datanode_refresh_interval: Duration::from_secs(2),
            shard_channel_depth: 4,
            max_connections: crate::listener::DEFAULT_MAX_CONNECTIONS,
            max_pending_connections: crate::listener::DEFAULT_MAX_PENDING_CONNECTIONS,
            header_read_timeout: crate::listener::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: crate::listener::DEFAULT_IDLE_TIMEOUT,
            body_timeout: crate::listener::DEFAULT_BODY_TIMEOUT,
            body_min_bytes: ByteSize(crate::listener::DEFAULT_BODY_MIN_BYTES),
            tcp_keepalive: crate::listener::DEFAULT_TCP_KEEPALIVE,
            http2: false,
            max_aws_chunk_bytes: ByteSize(crate::listener::DEFAULT_MAX_AWS_CHUNK_BYTES),
            inline_max_bytes: ByteSize(DEFAULT_INLINE_BYTES),
            max_background_deletes: 64,
            shutdown_grace: Duration::from_secs(30),
            metrics_listen: None,
            max_inflight_requests: DEFAULT_MAX_INFLIGHT_REQUESTS,
            buffer_budget_bytes: None,
            read_budget_bytes: None,
            stall_timeout: Duration::from_secs(30),
            credit_idle_timeout: Duration::from_secs(2),
            epoch_rotation: crate::epoch::DEFAULT_EPOCH_ROTATION,
            read_lease_after: crate::read_lease::DEFAULT_READ_LEASE_AFTER,
            heal_enabled: true,
            heal_bandwidth_bytes_per_sec: ByteSize(DEFAULT_HEAL_BANDWIDTH_BYTES_PER_SEC),
            heal_interval: Duration::from_secs(10),
            audit_interval: Duration::from_secs(6 * 3600),
            node_down_after: Duration::from_secs(600),
            audit_verify_timeout: Duration::from_secs(120),
            heal_concurrency: 2,
            rebalance_bandwidth_bytes_per_sec: ByteSize(DEFAULT_REBALANCE_BANDWIDTH_BYTES_PER_SEC),
            cluster_tls: None,
            insecure_cluster: false,
        }
    }
}

/// Erasure layout and data-path tuning of a [`BlobStore`](crate::blob::BlobStore),
/// derived from [`Config`] by [`Config::blob_store_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobStoreConfig {
    /// k, data shards per stripe (>= 1).
    pub data_shards: usize,
    /// m, parity shards per stripe (>= 1, k + m <= 256).
    pub parity_shards: usize,
    /// Bytes per shard block in a full stripe (1..=[`MAX_BLOCK_SIZE`]);
    /// a stripe carries `k * block_size` payload bytes.
    pub block_size: usize,
    /// Shards that must be durable for a write to succeed (k..=k+m).
    pub write_quorum: usize,
    /// How often the datanode set is re-read from meta.
    pub datanode_refresh_interval: Duration,
    /// Shard blocks queued per shard stream (>= 1).
    pub shard_channel_depth: usize,
    /// Bytes of write buffers all writes may hold (>= one stripe,
    /// `(k + m) * block_size`).
    pub buffer_budget: u64,
    /// Bytes of read buffers all reads may hold (>= one stripe).
    pub read_budget: u64,
    /// Longest wait for a buffer or for datanode credit.
    pub stall_timeout: Duration,
    /// Datanode credit unused this long is returned.
    pub credit_idle_timeout: Duration,
    /// How often a new write epoch is opened (see [`crate::epoch`]).
    pub epoch_rotation: Duration,
}

impl Default for BlobStoreConfig {
    /// The data path of the gateway's default [`Config`]:
    /// one default per value, kept in `config.rs`.
    fn default() -> Self {
        Config::default().blob_store_config()
    }
}

impl BlobStoreConfig {
    /// The data path's rules, the one place they are written
    /// ([`Config::validate`] calls this
    /// on the config it derives): k >= 1, m >= 1, k + m <= 256; block size
    /// 1..=[`MAX_BLOCK_SIZE`]; write quorum k..=k+m; positive intervals and
    /// channel depth; each budget between one stripe and
    /// [`MAX_BUDGET_BYTES`]. Errors name
    /// the config key.
    pub fn check(&self) -> Result<(), ConfigError> {
        let as_u32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        for (name, value) in [
            ("data_shards", self.data_shards),
            ("parity_shards", self.parity_shards),
            ("block_size", self.block_size),
            ("shard_channel_depth", self.shard_channel_depth),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        for (name, value) in [
            ("datanode_refresh_interval", self.datanode_refresh_interval),
            ("stall_timeout", self.stall_timeout),
            ("credit_idle_timeout", self.credit_idle_timeout),
            ("epoch_rotation", self.epoch_rotation),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.block_size > MAX_BLOCK_SIZE {
            return Err(ConfigError::BlockSize(self.block_size as u64));
        }
        let total = self.data_shards.saturating_add(self.parity_shards);
        if total > MAX_TOTAL_SHARDS {
            return Err(ConfigError::TooManyShards(as_u32(total)));
        }
        if !(self.data_shards..=total).contains(&self.write_quorum) {
            return Err(ConfigError::WriteQuorum {
                quorum: as_u32(self.write_quorum),
                min: as_u32(self.data_shards),
                max: as_u32(total),
            });
        }
        let min = self.stripe_charge();
        for (name, budget) in [
            ("buffer_budget_bytes", self.buffer_budget),
            ("read_budget_bytes", self.read_budget),
        ] {
            if !(min..=MAX_BUDGET_BYTES).contains(&budget) {
                return Err(ConfigError::Budget { name, budget, min });
            }
        }
        Ok(())
    }

    /// Budget bytes a full stripe costs: `(k + m) * block_size`.
    pub fn stripe_charge(&self) -> u64 {
        (self.data_shards.saturating_add(self.parity_shards) as u64)
            .saturating_mul(self.block_size as u64)
    }
}

/// Why a [`Config`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("`{0}` must not be empty")]
    Empty(&'static str),
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
    #[error("block_size {0} exceeds {max} bytes", max = MAX_BLOCK_SIZE)]
    BlockSize(u64),
    #[error("data_shards + parity_shards = {0} exceeds {MAX_TOTAL_SHARDS}")]
    TooManyShards(u32),
    #[error(
        "write_quorum {quorum} is outside {min}..={max} (data_shards..=data_shards+parity_shards)"
    )]
    WriteQuorum { quorum: u32, min: u32, max: u32 },
    #[error("meta endpoint {0:?} is not an http:// or https:// URL")]
    MetaEndpoint(String),
    /// Neither or both of `[s3_tls]` and `s3_plaintext = true`.
    #[error(
        "set exactly one of `[s3_tls]` (cert_file, key_file: HTTPS) and `s3_plaintext = true` (plain HTTP)"
    )]
    S3Transport,
    /// A buffer budget cannot hold one stripe ((k + m) * block_size bytes),
    /// or is larger than [`MAX_BUDGET_BYTES`].
    #[error("{name} = {budget} bytes is outside {min}..={max} (one stripe of (k+m)*block_size bytes at least)", max = MAX_BUDGET_BYTES)]
    Budget {
        name: &'static str,
        budget: u64,
        min: u64,
    },
    #[error("cluster security: {0}")]
    ClusterSecurity(String),
    #[error("root domain {0:?} is not a DNS name (labels of letters, digits and hyphens; no port)")]
    RootDomain(String),
    #[error("root domains {0:?} and {1:?} overlap: one is under the other")]
    RootDomainsOverlap(String, String),
    #[error("inline_max_bytes {0} exceeds {MAX_INLINE_BYTES}")]
    InlineMax(u64),
}

/// Default `inline_max_bytes`: 4 KiB.
pub const DEFAULT_INLINE_BYTES: u64 = 4 * 1024;
/// Largest `inline_max_bytes`: 64 KiB. Inline bodies live in meta's Raft
/// log, store and snapshots (which are built whole in memory), so they
/// stay small.
pub const MAX_INLINE_BYTES: u64 = 64 * 1024;

impl Config {
    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.region.is_empty() {
            return Err(ConfigError::Empty("region"));
        }
        if self.access_key.is_empty() {
            return Err(ConfigError::Empty("access_key"));
        }
        for (i, domain) in self.root_domains.iter().enumerate() {
            if !crate::s3::host::is_valid_root_domain(domain) {
                return Err(ConfigError::RootDomain(domain.clone()));
            }
            if let Some(other) = self.root_domains[..i]
                .iter()
                .find(|o| crate::s3::host::overlapping(o, domain))
            {
                return Err(ConfigError::RootDomainsOverlap(
                    other.clone(),
                    domain.clone(),
                ));
            }
        }
        if self.secret_key.is_empty() {
            return Err(ConfigError::Empty("secret_key"));
        }
        if self.meta_endpoints.is_empty() {
            return Err(ConfigError::Empty("meta_endpoints"));
        }
        if self.read_lease_after.is_zero() {
            return Err(ConfigError::Zero("read_lease_after"));
        }
        if self.s3_tls.is_some() == self.s3_plaintext {
            return Err(ConfigError::S3Transport);
        }
        if let Some(tls) = &self.s3_tls {
            if tls.cert_file.as_os_str().is_empty() {
                return Err(ConfigError::Empty("s3_tls.cert_file"));
            }
            if tls.key_file.as_os_str().is_empty() {
                return Err(ConfigError::Empty("s3_tls.key_file"));
            }
        }
        if let Some(bad) = self
            .meta_endpoints
            .iter()
            .find(|e| !sluice_net::is_endpoint(e))
        {
            return Err(ConfigError::MetaEndpoint(bad.clone()));
        }
        for (name, value) in [
            ("max_connections", self.max_connections),
            ("max_pending_connections", self.max_pending_connections),
            (
                "body_min_bytes",
                usize::try_from(self.body_min_bytes.as_u64()).unwrap_or(usize::MAX),
            ),
            (
                "max_aws_chunk_bytes",
                usize::try_from(self.max_aws_chunk_bytes.as_u64()).unwrap_or(usize::MAX),
            ),
            ("max_background_deletes", self.max_background_deletes),
            ("max_inflight_requests", self.max_inflight_requests),
            ("heal_concurrency", self.heal_concurrency),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        for (name, value) in [
            ("heal_interval", self.heal_interval),
            ("audit_interval", self.audit_interval),
            ("node_down_after", self.node_down_after),
            ("audit_verify_timeout", self.audit_verify_timeout),
            ("header_read_timeout", self.header_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("body_timeout", self.body_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.inline_max_bytes.as_u64() > MAX_INLINE_BYTES {
            return Err(ConfigError::InlineMax(self.inline_max_bytes.as_u64()));
        }
        // The data path's rules (shards, block size, quorum, intervals,
        // budgets) are written once, on the config the gateway derives.
        self.blob_store_config().check()?;
        sluice_net::validate_choice(
            self.cluster_tls.as_ref(),
            self.insecure_cluster,
            sluice_net::Role::Gateway,
            None,
        )
        .map_err(|e| ConfigError::ClusterSecurity(e.to_string()))?;
        Ok(())
    }

    /// The write buffer budget in bytes: `buffer_budget_bytes`, or
    /// [`DEFAULT_BUFFER_BUDGET_BYTES`] when unset.
    pub fn buffer_budget(&self) -> u64 {
        self.buffer_budget_bytes
            .map_or(DEFAULT_BUFFER_BUDGET_BYTES, |b| b.as_u64())
    }

    /// The read buffer budget in bytes: `read_budget_bytes`, or
    /// [`DEFAULT_READ_BUDGET_BYTES`] when unset.
    pub fn read_budget(&self) -> u64 {
        self.read_budget_bytes
            .map_or(DEFAULT_READ_BUDGET_BYTES, |b| b.as_u64())
    }

    /// Bytes one full stripe costs either budget: `(k + m) * block_size`
    /// (the k data blocks plus the m parity blocks encoded from them).
    pub fn stripe_charge(&self) -> u64 {
        self.blob_store_config().stripe_charge()
    }

    /// The data path's settings, derived from this config: the only way
    /// the gateway builds a [`BlobStoreConfig`], so each value has one
    /// default (here) and one check ([`BlobStoreConfig::check`]).
    pub fn blob_store_config(&self) -> BlobStoreConfig {
        BlobStoreConfig {
            data_shards: self.data_shards as usize,
            parity_shards: self.parity_shards as usize,
            // Past usize (32-bit targets) fails the block-size check.
            block_size: usize::try_from(self.block_size.as_u64()).unwrap_or(usize::MAX),
            write_quorum: self.effective_write_quorum() as usize,
            datanode_refresh_interval: self.datanode_refresh_interval,
            shard_channel_depth: self.shard_channel_depth,
            buffer_budget: self.buffer_budget(),
            read_budget: self.read_budget(),
            stall_timeout: self.stall_timeout,
            credit_idle_timeout: self.credit_idle_timeout,
            epoch_rotation: self.epoch_rotation,
        }
    }

    /// The S3 listener's limits.
    pub fn listener_limits(&self) -> crate::listener::ListenerLimits {
        crate::listener::ListenerLimits {
            max_connections: self.max_connections,
            max_pending_connections: self.max_pending_connections,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            tcp_keepalive: (!self.tcp_keepalive.is_zero()).then_some(self.tcp_keepalive),
            http2: self.http2,
        }
    }

    /// The limits on request bodies.
    pub fn body_limits(&self) -> crate::listener::BodyLimits {
        crate::listener::BodyLimits {
            body_timeout: self.body_timeout,
            body_min_bytes: self.body_min_bytes.as_u64(),
            max_aws_chunk_bytes: self.max_aws_chunk_bytes.as_u64(),
        }
    }

    /// The write quorum in effect: the configured one, else `k + 1`.
    pub fn effective_write_quorum(&self) -> u32 {
        self.write_quorum.unwrap_or(self.data_shards + 1)
    }
}

/// A list of strings written as a list or as one string.
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> Config {
        Config {
            access_key: "AK".into(),
            secret_key: "SK".into(),
            meta_endpoints: vec!["http://127.0.0.1:7000".into()],
            s3_plaintext: true,
            insecure_cluster: true,
            ..Config::default()
        }
    }

    /// `c` in plaintext (these tests are not about cluster TLS).
    fn insecure(c: &Config) -> Config {
        Config {
            cluster_tls: None,
            insecure_cluster: true,
            ..c.clone()
        }
    }

    #[test]
    fn debug_redacts_the_secret_key() {
        let c = Config {
            secret_key: "TOPSECRET".into(),
            ..valid()
        };
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("TOPSECRET") && shown.contains("<redacted>"),
            "{shown}"
        );
        let parsed: Config = toml::from_str("secret_key = \"TOPSECRET\"").unwrap();
        assert_eq!(parsed.secret_key.as_str(), "TOPSECRET");
    }

    #[test]
    fn exactly_one_s3_transport_is_configured() {
        let tls = Some(S3Tls {
            cert_file: "/etc/sluice/s3.crt".into(),
            key_file: "/etc/sluice/s3.key".into(),
        });
        let neither = Config {
            s3_plaintext: false,
            ..valid()
        };
        assert_eq!(neither.validate(), Err(ConfigError::S3Transport));
        let both = Config {
            s3_tls: tls.clone(),
            ..valid()
        };
        assert_eq!(both.validate(), Err(ConfigError::S3Transport));
        let https = Config {
            s3_tls: tls,
            s3_plaintext: false,
            ..valid()
        };
        assert_eq!(https.validate(), Ok(()));
        let text = toml::to_string(&https).expect("serialize");
        let back: Config = toml::from_str(&text).expect("parse back");
        assert_eq!(back, https);
        let parsed: Config = toml::from_str(
            "access_key = \"a\"\n[s3_tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n",
        )
        .expect("parse [s3_tls]");
        assert_eq!(
            parsed.s3_tls.map(|t| (t.cert_file, t.key_file)),
            Some(("c.pem".into(), "k.pem".into()))
        );
        let empty = Config {
            s3_tls: Some(S3Tls {
                cert_file: "".into(),
                key_file: "k".into(),
            }),
            s3_plaintext: false,
            ..valid()
        };
        assert_eq!(
            empty.validate(),
            Err(ConfigError::Empty("s3_tls.cert_file"))
        );
    }

    #[test]
    fn parses_toml_with_defaults_and_units() {
        let text = r#"
            listen = "0.0.0.0:9100"
            access_key = "AKIA"
            secret_key = "secret"
            meta_endpoints = ["http://10.0.0.1:7000", "http://10.0.0.2:7000"]
            block_size = "128 KiB"
            write_quorum = 6
            datanode_refresh_interval = "500ms"
            s3_plaintext = true
        "#;
        let config: Config = toml::from_str(text).expect("parse");
        assert_eq!(config.listen, "0.0.0.0:9100".parse::<SocketAddr>().unwrap());
        assert_eq!(config.region, "us-east-1");
        assert_eq!(config.meta_endpoints.len(), 2);
        assert_eq!(config.data_shards, 4);
        assert_eq!(config.parity_shards, 2);
        assert_eq!(config.block_size, ByteSize::kib(128));
        assert_eq!(config.write_quorum, Some(6));
        assert_eq!(config.datanode_refresh_interval, Duration::from_millis(500));
        assert_eq!(config.shard_channel_depth, 4);
        insecure(&config).validate().expect("valid");
        assert_eq!(config.effective_write_quorum(), 6);

        let plain: Config = toml::from_str("block_size = 4096").expect("integer size");
        assert_eq!(plain.block_size, ByteSize(4096));
    }

    #[test]
    fn epoch_rotation_parses_defaults_and_must_be_positive() {
        assert_eq!(valid().epoch_rotation, Duration::from_secs(600));
        let config: Config = toml::from_str(r#"epoch_rotation = "90s""#).expect("parse");
        assert_eq!(config.epoch_rotation, Duration::from_secs(90));
        let zero = Config {
            epoch_rotation: Duration::ZERO,
            ..valid()
        };
        assert_eq!(zero.validate(), Err(ConfigError::Zero("epoch_rotation")));
    }

    #[test]
    fn flow_control_knobs_parse_with_defaults() {
        let config = valid();
        assert_eq!(config.max_inflight_requests, 256);
        assert_eq!(config.buffer_budget(), 256 * 1024 * 1024);
        assert_eq!(config.read_budget(), 128 * 1024 * 1024);
        assert_eq!(config.stall_timeout, Duration::from_secs(30));
        assert_eq!(config.credit_idle_timeout, Duration::from_secs(2));
        assert_eq!(config.stripe_charge(), 6 * 256 * 1024);

        let text = r#"
            max_inflight_requests = 8
            buffer_budget_bytes = "4 MiB"
            read_budget_bytes = 2097152
            stall_timeout = "50ms"
            credit_idle_timeout = "500ms"
        "#;
        let config: Config = toml::from_str(text).expect("parse");
        assert_eq!(config.max_inflight_requests, 8);
        assert_eq!(config.buffer_budget_bytes, Some(ByteSize(4 * 1024 * 1024)));
        assert_eq!(config.buffer_budget(), 4 * 1024 * 1024);
        assert_eq!(config.read_budget(), 2 * 1024 * 1024);
        assert_eq!(config.stall_timeout, Duration::from_millis(50));
        assert_eq!(config.credit_idle_timeout, Duration::from_millis(500));
        let config = Config {
            buffer_budget_bytes: Some(ByteSize(4 << 20)),
            read_budget_bytes: Some(ByteSize(2 << 20)),
            ..valid()
        };
        let back: Config =
            toml::from_str(&toml::to_string(&config).expect("serialize")).expect("parse back");
        assert_eq!(back, config);
    }

    /// The flow-control knobs of `deploy/gateway.toml` are the defaults,
    /// and its commented budget lines parse when uncommented.
    #[test]
    fn deploy_example_flow_control_knobs() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gateway.toml");
        let text = std::fs::read_to_string(&path).expect("read deploy/gateway.toml");
        let config: Config = toml::from_str(&text).expect("parse");
        insecure(&config).validate().expect("valid");
        assert_eq!(config.max_inflight_requests, DEFAULT_MAX_INFLIGHT_REQUESTS);
        assert_eq!(
            (config.buffer_budget_bytes, config.read_budget_bytes),
            (None, None)
        );
        assert_eq!(config.stall_timeout, Config::default().stall_timeout);
        assert_eq!(
            config.credit_idle_timeout,
            Config::default().credit_idle_timeout
        );
        let uncommented = text
            .replace("# buffer_budget_bytes", "buffer_budget_bytes")
            .replace("# read_budget_bytes", "read_budget_bytes");
        let config: Config = toml::from_str(&uncommented).expect("parse uncommented");
        insecure(&config).validate().expect("valid uncommented");
        assert_eq!(
            config.buffer_budget_bytes,
            Some(ByteSize(DEFAULT_BUFFER_BUDGET_BYTES))
        );
        assert_eq!(
            config.read_budget_bytes,
            Some(ByteSize(DEFAULT_READ_BUDGET_BYTES))
        );
    }

    #[test]
    fn budgets_must_hold_one_stripe() {
        let stripe = 6 * 256 * 1024;
        assert_eq!(
            Config {
                buffer_budget_bytes: Some(ByteSize(stripe)),
                read_budget_bytes: Some(ByteSize(stripe)),
                ..valid()
            }
            .validate(),
            Ok(())
        );
        assert_eq!(
            Config {
                buffer_budget_bytes: Some(ByteSize(stripe - 1)),
                ..valid()
            }
            .validate(),
            Err(ConfigError::Budget {
                name: "buffer_budget_bytes",
                budget: stripe - 1,
                min: stripe
            })
        );
        assert_eq!(
            Config {
                read_budget_bytes: Some(ByteSize(1024)),
                ..valid()
            }
            .validate(),
            Err(ConfigError::Budget {
                name: "read_budget_bytes",
                budget: 1024,
                min: stripe
            })
        );
        assert_eq!(
            Config {
                buffer_budget_bytes: Some(ByteSize(u64::MAX)),
                ..valid()
            }
            .validate(),
            Err(ConfigError::Budget {
                name: "buffer_budget_bytes",
                budget: u64::MAX,
                min: stripe
            })
        );
        assert_eq!(
            Config {
                max_inflight_requests: 0,
                ..valid()
            }
            .validate(),
            Err(ConfigError::Zero("max_inflight_requests"))
        );
        assert_eq!(
            Config {
                stall_timeout: Duration::ZERO,
                ..valid()
            }
            .validate(),
            Err(ConfigError::Zero("stall_timeout"))
        );
        assert_eq!(
            Config {
                credit_idle_timeout: Duration::ZERO,
                ..valid()
            }
            .validate(),
            Err(ConfigError::Zero("credit_idle_timeout"))
        );
    }

    #[test]
    fn rejects_unknown_fields() {
        assert!(toml::from_str::<Config>("no_such_field = 1").is_err());
    }

    #[test]
    fn round_trips_through_toml() {
        let config = valid();
        let text = toml::to_string(&config).expect("serialize");
        let back: Config = toml::from_str(&text).expect("parse back");
        assert_eq!(back, config);
    }

    #[test]
    fn root_domains_are_one_or_many_and_checked() {
        let one: Config = toml::from_str("root_domain = \"s3.example.test\"").unwrap();
        assert_eq!(one.root_domains, ["s3.example.test"]);
        let many: Config =
            toml::from_str("root_domains = [\"s3.example.test\", \"s3.other.test\"]").unwrap();
        assert_eq!(many.root_domains, ["s3.example.test", "s3.other.test"]);
        assert_eq!(Config::default().root_domains, Vec::<String>::new());
        let with = |domains: &[&str]| Config {
            root_domains: domains.iter().map(|d| d.to_string()).collect(),
            ..valid()
        };
        assert_eq!(
            with(&["s3.example.test", "s3.other.test"]).validate(),
            Ok(())
        );
        assert_eq!(
            with(&["s3.example.test:9000"]).validate(),
            Err(ConfigError::RootDomain("s3.example.test:9000".into()))
        );
        assert_eq!(
            with(&["example.test", "s3.example.test"]).validate(),
            Err(ConfigError::RootDomainsOverlap(
                "example.test".into(),
                "s3.example.test".into()
            ))
        );
    }

    #[test]
    fn validate_reports_each_problem() {
        assert_eq!(valid().validate(), Ok(()));
        assert_eq!(valid().effective_write_quorum(), 5);
        assert_eq!(
            Config {
                access_key: String::new(),
                ..valid()
            }
            .validate(),
            Err(ConfigError::Empty("access_key"))
        );
        assert_eq!(
            Config {
                meta_endpoints: vec![],
                ..valid()
            }
            .validate(),
            Err(ConfigError::Empty("meta_endpoints"))
        );
        assert_eq!(
            Config {
                meta_endpoints: vec!["127.0.0.1:7000".into()],
                ..valid()
            }
            .validate(),
            Err(ConfigError::MetaEndpoint("127.0.0.1:7000".into()))
        );
        assert_eq!(
            Config {
                data_shards: 0,
                ..valid()
            }
            .validate(),
            Err(ConfigError::Zero("data_shards"))
        );
        assert_eq!(
            Config {
                write_quorum: Some(3),
                ..valid()
            }
            .validate(),
            Err(ConfigError::WriteQuorum {
                quorum: 3,
                min: 4,
                max: 6
            })
        );
        assert_eq!(
            Config {
                write_quorum: Some(7),
                ..valid()
            }
            .validate(),
            Err(ConfigError::WriteQuorum {
                quorum: 7,
                min: 4,
                max: 6
            })
        );
        assert_eq!(
            Config {
                write_quorum: Some(4),
                ..valid()
            }
            .validate(),
            Ok(())
        );
        assert_eq!(
            Config {
                data_shards: 200,
                parity_shards: 100,
                ..valid()
            }
            .validate(),
            Err(ConfigError::TooManyShards(300))
        );
        assert_eq!(
            Config {
                parity_shards: 0,
                ..valid()
            }
            .validate(),
            Err(ConfigError::Zero("parity_shards"))
        );
        assert_eq!(
            Config {
                block_size: ByteSize::mib(16),
                ..valid()
            }
            .validate(),
            Err(ConfigError::BlockSize(16 << 20))
        );
        // Past 32 bits reads, then fails the same check with its own value.
        let huge: Config = toml::from_str("block_size = \"5 GiB\"").expect("a byte size");
        assert_eq!(
            Config {
                block_size: huge.block_size,
                ..valid()
            }
            .validate(),
            Err(ConfigError::BlockSize(5 << 30))
        );
    }
}
