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

/// `workers`' states as reported to meta (heartbeats, epoch renewals) and
/// listed by `sluice admin status`.
pub fn worker_states(
    workers: &[sluice_util::worker::WorkerStatus],
) -> Vec<sluice_proto::meta::WorkerStatus> {
    workers
        .iter()
        .map(|w| sluice_proto::meta::WorkerStatus {
            name: w.name.clone(),
            state: w.state.as_str().to_string(),
            last_error: w.last_error.clone().unwrap_or_default(),
            last_error_at_ms: w.last_error_at_ms,
            iterations: w.iterations,
        })
        .collect()
}
