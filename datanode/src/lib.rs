//! Sluice datanode: stores erasure-coded shards on local disk and serves
//! them over gRPC (`sluice.datanode.Datanode`, see `proto/datanode.proto`).
//!
//! Each shard is a sequence of blocks, each kept with its CRC32C
//! ([`block_crc32c`]); a shard is written to a temp file, fsynced, renamed
//! into place and its directory fsynced before PutShard answers. Reads
//! verify every block and answer `DATA_LOSS` on bitrot, so the gateway
//! reconstructs from parity.
//!
//! Writes are bounded by byte credits: the datanode shares
//! `write_budget_bytes` among gateways over `Credits` streams and grants
//! bytes again only once they are fsynced (see [`credit`]).
//!
//! # Layout
//! * [`config`] — [`Config`] and its validation.
//! * [`credit`] — the pure byte-credit ledger and the gateway's side of the
//!   credit protocol; `grants` wires it to the Credits streams and the
//!   PutShard writers.
//! * [`store`] — the [`ShardStore`](store::ShardStore) seam: the shard file
//!   format, [`DiskStore`](store::DiskStore), [`MemoryStore`](store::MemoryStore)
//!   and their shared conformance suite.
//! * `service` — the gRPC handlers over a store (bounded channels both
//!   ways): PutShard (refused below the free-space reserve; the commit
//!   takes the blob lock), GetShard, HasShards, VerifyShards, ListShards,
//!   DeleteBlobs, Credits.
//! * [`verify`] — VerifyShards: reads shards through for the heal audit,
//!   at `verify_bandwidth_bytes_per_sec`, one call at a time.
//! * `status` — every error-to-gRPC-code mapping.
//! * [`identity`] — the data dir's `sluice-disk.toml` (`disk_id`, node id):
//!   written at format, foreign disks refused at start.
//! * [`space`] — statvfs free bytes against `reserved_free_bytes`.
//! * `membership` — registration with meta (with the `disk_id`) and
//!   heartbeats (free/used bytes, `writable`).
//! * [`locks`] — [`BlobLocks`](locks::BlobLocks): the per-blob lock GC holds
//!   from its meta question to the delete and PutShard's commit takes.
//! * [`gc`] — shard garbage collection: deletes exactly the shards meta's
//!   `Collectable` returns (the [`ReferenceOracle`](gc::ReferenceOracle)
//!   seam); `gc_grace` only skips young shards.
//! * [`scrub`] — reads every block at `scrub_bandwidth_bytes_per_sec`,
//!   quarantines damaged shards and reports them (the
//!   [`DamageReporter`](scrub::DamageReporter) seam).
//! * `server` — [`run`]: identity, store, server and background tasks, and
//!   shutdown.
//! * [`metrics`] — metric names.

pub mod config;
pub mod credit;
mod error;
mod framed;
pub mod gc;
mod grants;
pub mod identity;
pub mod locks;
mod membership;
pub mod metrics;
pub mod scrub;
mod server;
mod service;
pub mod space;
mod status;
pub mod store;
pub mod verify;

pub use config::{Config, ConfigError};
pub use error::Error;
pub use grants::CREDIT_GRANT_CHANNEL_DEPTH;
pub use server::{receive_window, run};
pub use service::{DEFAULT_LIST_LIMIT, GET_SHARD_CHANNEL_DEPTH, MAX_HAS_SHARDS, MAX_LIST_LIMIT};
pub use sluice_proto::shard::MAX_MESSAGE_BYTES;
pub use store::MAX_BLOCK_SIZE;

/// The block checksum, from the wire contract.
pub use sluice_proto::shard::block_crc32c;
