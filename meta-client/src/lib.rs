//! The client side of the meta role, for the nodes that call it (gateway,
//! datanode, the `sluice` admin commands): [`MetaClient`] over gRPC, the
//! version-id text S3 shows, and the RSS a node reports. It depends on the
//! wire contract (`sluice-proto`) and cluster transport (`sluice-net`)
//! only, not on the meta server (openraft, sled).

pub mod client;
mod rss;
pub mod version_id;

pub use client::{CallFaults, FaultAction, GatewayReport, MetaClient, MetaError, new_op_id};
pub use rss::process_rss;
