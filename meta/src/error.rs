//! [`Error`]: why a meta node failed to start or stopped abnormally.

use std::path::PathBuf;

use openraft::BasicNode;
use openraft::error::{Fatal, InitializeError, RaftError};

use crate::config::ConfigError;
use crate::store::KvError;
use crate::store::format::StoreFormatError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `Config::validate` refused the config.
    #[error("invalid meta config: {0}")]
    Config(#[from] ConfigError),
    /// The data directory cannot be created.
    #[error("create data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// sled failed to open the directory (I/O error, corruption, or another
    /// process holds its lock).
    #[error("open metadata store in {path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: KvError,
    },
    /// The store's format version is newer than this binary understands,
    /// missing, or its migration failed (see `store::format`).
    #[error("{0}")]
    StoreFormat(#[source] StoreFormatError),
    /// Opening the state machine failed: its snapshot directory or an
    /// interrupted snapshot install (see `raft::snapshot`).
    #[error("open the state machine: {0}")]
    StateMachine(#[source] openraft::StorageError<u64>),
    /// openraft refused the derived Raft config.
    #[error("invalid raft config: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    /// Raft failed (storage error) while starting.
    #[error("raft stopped: {0}")]
    Raft(#[from] Fatal<u64>),
    /// Initializing a new cluster failed.
    #[error("initialize the cluster: {0}")]
    Initialize(#[source] RaftError<u64, InitializeError<u64, BasicNode>>),
    /// The gRPC server failed (e.g. the listener broke).
    #[error("serve gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Cluster TLS could not be set up.
    #[error("cluster TLS: {0}")]
    Auth(#[from] sluice_net::AuthError),
    /// The gRPC server task panicked.
    #[error("gRPC server task: {0}")]
    ServerTask(#[from] tokio::task::JoinError),
}
