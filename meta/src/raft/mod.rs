//! Raft plumbing: the openraft type config, storage (log and state
//! machine over a [`KvStore`](crate::store::KvStore)), protobuf conversions,
//! and the tonic network.
//!
//! # Layout
//! * [`convert`] — openraft types <-> `sluice.raft` protobuf messages.
//! * [`log_store`] — [`LogStore`]: `RaftLogStorage` (log, vote, committed).
//! * [`state_machine`] — [`StateMachine`]: `RaftStateMachine` and snapshots.
//! * [`snapshot`] — streamed snapshot files: format, building, installing.
//! * [`network`] — `RaftNetworkFactory` over tonic clients.
//! * [`service`] — the `sluice.raft.Raft` gRPC server.

pub mod convert;
pub mod log_store;
pub mod network;
pub mod service;
pub mod snapshot;
pub mod state_machine;

pub use log_store::LogStore;
pub use state_machine::{AppliedDigest, StateDigester, StateMachine};

use crate::sm::Applied;

openraft::declare_raft_types!(
    /// Sluice meta's Raft types: commands are `sluice.raft.MetaCommand`
    /// protobuf messages, nodes carry their gRPC address.
    pub TypeConfig:
        D = sluice_proto::raft::MetaCommand,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft handle of a meta node.
pub type MetaRaft = openraft::Raft<TypeConfig>;
/// openraft's storage error for this config.
pub type StorageError = openraft::StorageError<u64>;
