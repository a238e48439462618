//! Sluice gateway role: the stateless S3 front end. It authenticates S3
//! requests (SigV4 via s3s), keeps metadata in the meta cluster through
//! [`sluice_meta_client::MetaClient`], and streams every body stripe by stripe,
//! erasure coded, to the datanodes.
//!
//! The role is started with [`run`]`(config, listener, shutdown)`.
//!
//! Memory is bounded by construction: requests are admitted up to
//! `max_inflight_requests`, every stripe buffer comes from a gateway-wide
//! byte budget taken before the stripe is read, and no shard byte goes to a
//! datanode without that datanode's credit; overload is answered with
//! `503 SlowDown`. The formula and the deadlock-freedom argument are in
//! [`admission`].
//!
//! # Layout
//! * [`config`] — [`Config`] (TOML) and its validation.
//! * [`server`] — [`run`]: admission, the s3s service over hyper, request
//!   ids, graceful shutdown.
//! * [`health`] — `/health/live` and `/health/ready`.
//! * [`listener`] — S3 listener hardening: pending connections and slots,
//!   header, idle and body timeouts, the signed aws-chunked chunk cap.
//! * [`access`] — access keys (root key + keys in meta, cached) and
//!   per-bucket authorization (s3s `S3Auth` / `S3Access`).
//! * [`tls`] — HTTPS on the S3 listener (rustls, SIGHUP reload).
//! * [`admission`] — the in-flight limit and the FIFO byte budgets (pure, RAII guards).
//! * [`credit`] — the datanode credit streams (the gateway side of the protocol).
//! * [`metrics`] — Prometheus metric names.
//! * [`s3`] — the S3 operations, one file per area, and the S3 error mapping.
//! * [`blob`] — the data path: write, read and delete erasure-coded blobs.
//! * [`placement`], [`layout`], [`erasure`], [`datanodes`] — rendezvous
//!   placement, stripe arithmetic, Reed–Solomon coding, the live datanode set.
pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod aws_chunked;
pub mod blob;
pub mod config;
pub mod credit;
pub mod datanodes;
pub mod epoch;
pub(crate) mod erasure;
pub mod heal;
pub mod health;
pub mod layout;
pub mod listener;
pub(crate) mod metrics;
pub mod placement;
pub mod read_lease;
pub mod s3;
pub mod server;
pub(crate) mod tls;

pub use admission::GatewayStats;
pub use config::{Config, ConfigError};
pub use server::{Error, run, run_with_meta, run_with_stats, s3_service};
