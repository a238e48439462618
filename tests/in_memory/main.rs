//! Tests on a cluster that runs on an in-process network
//! ([`sluice_tests::mem_cluster::MemCluster`]): a real meta node, real
//! datanodes and the gateway's S3 service in the test process, with no
//! sockets, driven by `aws-sdk-s3` and by the data path directly, with
//! faults injected on chosen gRPC calls ([`sluice_net::faults`]).
//!
//! * `blob` — the write quorum under failing PutShard calls; a lost
//!   PutObject answer retried to its first outcome.
//! * `s3` — S3 requests end to end: conditional writes, multipart rules,
//!   error codes; a PUT when too few datanodes take shards; a lost commit
//!   answer leaves one version.

mod blob;
mod s3;
