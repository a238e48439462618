//! Sluice wire protocol: the gRPC services and messages shared by the meta,
//! datanode and gateway roles, and the error detail carried in a status.
//!
//! # Layout
//! * `proto/meta.proto` — metadata API and the records the state machine stores.
//! * `proto/datanode.proto` — shard streams between gateways and datanodes.
//! * `proto/raft.proto` — Raft RPCs between meta nodes.
//! * `proto/admin.proto` — the admin API (`sluice admin`), served by meta.
//! * [`error`] — encoding of [`meta::ErrorDetail`] in a `tonic::Status`.
//! * `redact` — Debug of the messages holding a secret (redacted).
//! * [`blob_id`] — blob ids and the write epoch they name.
//! * [`format`] — the format versions of stored data, checked at open.
//! * [`framing`] — shard blocks framed as gRPC messages without copying them.

pub mod meta {
    tonic::include_proto!("sluice.meta");
}
pub mod datanode {
    tonic::include_proto!("sluice.datanode");
}
pub mod raft {
    tonic::include_proto!("sluice.raft");
}
// The generated server matches on the method path; with no RPC yet
// (the helpers add them) that match has a single arm.
pub mod admin {
    tonic::include_proto!("sluice.admin");
}
pub mod blob_id;
pub mod credit;
pub mod error;
pub mod format;
pub mod framing;
mod redact;
pub mod shard;
