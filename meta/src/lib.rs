//! Sluice meta role: the metadata state machine (buckets, objects,
//! multipart uploads and their parts, the datanode registry), replicated
//! with openraft 0.9 and stored in sled behind a narrow storage trait.
//!
//! Start a node with [`run`] and a [`Config`]; talk to the cluster with
//! [`MetaClient`], which follows the leader.
//!
//! # Layout
//! * [`config`] — [`Config`] (TOML, defaults, `validate`).
//! * [`node`](run) — `run`: store, Raft, bootstrap, one gRPC server for the
//!   `sluice.raft.Raft` and `sluice.meta.Meta` services, ordered shutdown.
//! * [`store`] — the [`KvStore`](store::KvStore) seam: keyspaces, atomic
//!   batches, flush; [`SledStore`](store::SledStore) and
//!   [`MemStore`](store::MemStore).
//! * [`sm`] — the state machine as pure functions over a `KvStore`:
//!   mutations (S3 rules for buckets, objects, multipart), listings, and
//!   the blob reference index the datanodes' shard GC consults
//!   (`FilterUnreferenced`).
//! * [`raft`] — openraft type config, log store, state machine adapter and
//!   snapshots, protobuf conversions, tonic network and Raft service.
//! * `admin` — the `sluice.admin.Admin` gRPC service (`sluice admin`).
//! * `api` — the `sluice.meta.Meta` gRPC service (leader checks, NOT_LEADER
//!   hints); `liveness` — datanode heartbeats in leader memory;
//!   `sweeper` — the leader aborts multipart uploads older than
//!   `stale_upload_expiry` through Raft, closes write epochs whose lease
//!   ran out and expires client sessions; [`lifecycle`] — the leader runs
//!   the buckets' lifecycle rules; [`reclaimer`] — the leader
//!   deletes released blobs' shards after `delete_delay`.
//! * [`version`] — the cluster version gate: the replicated format this
//!   binary understands, the format each command requires, finalize.
//! * [`client`] — [`MetaClient`], the leader-following client.
//!
//! # Metrics
//! `sluice_meta_applied_entries_total`: Raft log entries applied to the
//! state machine. `sluice_meta_stale_uploads_aborted_total`: uploads the
//! sweeper aborted. `sluice_meta_epochs_closed_total`: write epochs closed
//! for an expired lease. `sluice_meta_sessions`: session table entries.
//! `sluice_meta_lifecycle_expired_total`, `sluice_meta_lifecycle_aborted_total`:
//! see [`lifecycle`].
//! `sluice_meta_pending_deletions`, `sluice_meta_reclaimed_blobs_total`:
//! see [`reclaimer`]. `sluice_meta_apply_blocked`,
//! `sluice_meta_apply_blocked_index`: apply stopped at an entry that needs
//! a newer binary (see [`version`]).

mod admin;
mod api;
pub mod config;
pub mod error;
pub mod lifecycle;
mod liveness;
mod node;
pub mod raft;
pub mod reclaimer;
pub mod sm;
pub mod store;
mod sweeper;
pub mod version;

pub use config::{Config, ConfigError};
pub use error::Error;
pub use node::run;
