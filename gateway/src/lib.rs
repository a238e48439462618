//! Sluice gateway role: the stateless S3 front end. It authenticates S3
//! requests (SigV4 via s3s), keeps metadata in the meta cluster through
//! [`sluice_meta::MetaClient`], and streams every body stripe by stripe,
//! erasure coded, to the datanodes.
//!
//! The role is started with [`run`]`(config, listener, shutdown)`.
//!
//! # Layout
//! * [`config`] — [`Config`] (TOML) and its validation.
//! * [`server`] — [`run`]: the s3s service over hyper, request ids, graceful shutdown.
//! * [`s3`] — the S3 operations, one file per area, and the S3 error mapping.
//! * [`blob`] — the data path: write, read and delete erasure-coded blobs.
//! * [`placement`], [`layout`], [`erasure`], [`datanodes`] — rendezvous
//!   placement, stripe arithmetic, Reed–Solomon coding, the live datanode set.
pub mod blob;
pub mod config;
pub mod datanodes;
pub mod erasure;
pub mod layout;
pub mod placement;
pub mod s3;
pub mod server;

pub use config::{Config, ConfigError};
pub use server::{Error, run, s3_service};
