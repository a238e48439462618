//! Fixtures Sluice's integration tests share; the tests themselves live in
//! `tests/*/main.rs` (`cluster`: processes on loopback sockets;
//! `in_memory`: a cluster on an in-process network).
//!
//! * [`mem_cluster`] — a real meta node and real datanodes on a
//!   [`sluice_net::net::MemNet`] (no sockets), with the gateway's data
//!   path and S3 service in the test process, an `aws-sdk-s3` client that
//!   calls that service directly, and the net's fault rules
//!   ([`sluice_net::faults`]).
//! * [`s3`] — assertions on S3 answers.

pub mod mem_cluster;
pub mod s3;
