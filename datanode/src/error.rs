//! [`Error`]: why [`crate::run`] failed.

use crate::config::ConfigError;
use crate::identity::IdentityError;
use crate::store::StoreError;

/// Errors of [`crate::run`]; the cause is kept as the source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration failed [`crate::Config::validate`].
    #[error("invalid datanode config")]
    Config(#[from] ConfigError),
    /// The data dir's identity could not be read or written, or it belongs
    /// to another node (a foreign disk).
    #[error("data dir identity")]
    Identity(#[from] IdentityError),
    /// The shard store could not be opened (directory creation, recovery scan).
    #[error("open shard store")]
    Store(#[from] StoreError),
    /// Cluster TLS could not be set up.
    #[error("cluster TLS")]
    Auth(#[from] sluice_net::AuthError),
    /// The gRPC server failed.
    #[error("serve datanode gRPC")]
    Serve(#[from] tonic::transport::Error),
}
