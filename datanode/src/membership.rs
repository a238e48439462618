//! Registration with meta and heartbeats, in one background task.
//!
//! Meta may start after the datanode or be unreachable for a while: the
//! task retries registration every heartbeat interval until it succeeds,
//! then heartbeats at that pace; a refused heartbeat (meta forgot the
//! node) sends it back to registering. It ends when its worker is cancelled.
//!
//! Registration names the data dir's `disk_id` (see [`crate::identity`]);
//! when meta answers `disk_replaced` the node logs a warning: its shards
//! will be rebuilt by heal. The disk generation meta answers is exported as
//! `sluice_datanode_disk_generation`. Heartbeats carry the data dir's free
//! bytes (statvfs), the store's used bytes and `writable` (free space at or
//! above `reserved_free_bytes` and the disk not failed).

use std::sync::Arc;
use std::time::Duration;

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::HeartbeatRequest;
use sluice_util::worker::{WorkerHandle, Workers};
use tokio::time::MissedTickBehavior;

use crate::space::DiskSpace;
use crate::store::ShardStore;

/// Failed attempts between two warnings while meta stays unreachable.
const WARN_EVERY: u32 = 30;

pub(crate) struct Membership<S> {
    pub node_id: u64,
    pub advertise_addr: String,
    pub meta_endpoints: Vec<String>,
    pub heartbeat_interval: Duration,
    /// This data dir's identity.
    pub disk_id: String,
    pub space: Arc<DiskSpace>,
    /// For `used_bytes`.
    pub store: S,
    /// Failure-domain labels (config `zone`, `host`).
    pub zone: String,
    pub host: String,
    /// For the credit in use and the write budget reported to meta.
    pub credits: Arc<crate::grants::CreditHub>,
    /// How meta is dialed.
    pub transport: sluice_net::Transport,
    /// This node's workers, reported with each heartbeat.
    pub workers: Workers,
}

/// The heartbeat of node `id` at `addr` on disk `disk_id`, from a fresh
/// look at the disk and the store's stored bytes.
pub(crate) fn heartbeat_request(
    id: u64,
    addr: &str,
    disk_id: &str,
    space: &DiskSpace,
    used_bytes: u64,
) -> HeartbeatRequest {
    let reading = space.probe();
    HeartbeatRequest {
        id,
        addr: addr.to_string(),
        disk_id: disk_id.to_string(),
        writable: reading.writable,
        free_bytes: reading.free_bytes,
        used_bytes,
        zone: String::new(),
        host: String::new(),
        ..Default::default()
    }
}

impl<S: ShardStore> Membership<S> {
    pub(crate) async fn run(self, worker: WorkerHandle) {
        let cancel = worker.token().clone();
        // One attempt (with the client's own retries) fits in an interval.
        let meta = MetaClient::with_timeouts(
            self.meta_endpoints.clone(),
            self.heartbeat_interval.max(Duration::from_secs(1)),
            self.heartbeat_interval
                .clamp(Duration::from_secs(1), Duration::from_secs(5)),
        )
        .with_transport(self.transport.clone());
        let mut ticker = tokio::time::interval(self.heartbeat_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut registered = false;
        let mut failures = 0u32;
        let mut was_writable = true;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let attempt = async {
                if registered {
                    let mut req = heartbeat_request(
                        self.node_id,
                        &self.advertise_addr,
                        &self.disk_id,
                        &self.space,
                        self.store.stats().stored_bytes,
                    );
                    req.zone.clone_from(&self.zone);
                    req.host.clone_from(&self.host);
                    // Load, for `sluice admin status`.
                    req.credit_in_use_bytes = self.credits.in_use();
                    req.write_budget_bytes = self.credits.budget();
                    req.rss_bytes = sluice_meta_client::process_rss();
                    req.memory_budget_bytes = self.credits.budget();
                    req.workers = sluice_meta_client::worker_states(&self.workers.snapshot());
                    if req.writable != was_writable {
                        if req.writable {
                            tracing::info!(
                                node = self.node_id,
                                free_bytes = req.free_bytes,
                                "datanode writable again"
                            );
                        } else {
                            tracing::warn!(
                                node = self.node_id,
                                free_bytes = req.free_bytes,
                                reserve = self.space.reserve(),
                                "datanode not writable: below its free-space reserve or disk failed"
                            );
                        }
                        was_writable = req.writable;
                    }
                    meta.heartbeat(req).await
                } else {
                    let r = meta
                        .register_datanode_labelled(
                            self.node_id,
                            &self.advertise_addr,
                            &self.disk_id,
                            &self.zone,
                            &self.host,
                        )
                        .await?;
                    crate::metrics::set_disk_generation(
                        &self.node_id.to_string(),
                        r.disk_generation,
                    );
                    if r.disk_replaced {
                        tracing::warn!(
                            node = self.node_id,
                            disk_id = %self.disk_id,
                            disk_generation = r.disk_generation,
                            "data dir is new under a known node id: its shards will be rebuilt by heal"
                        );
                    }
                    Ok(())
                }
            };
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = attempt => r,
            };
            let what = if registered {
                "heartbeat"
            } else {
                "registration"
            };
            match result {
                Ok(()) => {
                    if !registered {
                        tracing::info!(node = self.node_id, addr = %self.advertise_addr, disk_id = %self.disk_id, "registered with meta");
                    } else if failures > 0 {
                        tracing::info!(node = self.node_id, "heartbeats to meta resumed");
                    }
                    registered = true;
                    failures = 0;
                    worker.ran();
                }
                Err(MetaError::Refused { code, message }) => {
                    tracing::warn!(node = self.node_id, ?code, %message, "meta refused {what}; registering again");
                    worker.note_error(format_args!("meta refused {what}: {code:?} {message}"));
                    registered = false;
                    failures += 1;
                }
                Err(e @ (MetaError::Unavailable(_) | MetaError::Denied(_))) => {
                    worker.note_error(format_args!("{what} with meta failed: {e}"));
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(WARN_EVERY) {
                        tracing::warn!(node = self.node_id, failures, error = %e, "{what} with meta failed; retrying");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::space::FREE_SPACE_RECHECK;

    #[test]
    fn heartbeats_carry_capacity_and_writability() {
        let space = DiskSpace::with_probe(
            Path::new("/x"),
            100,
            FREE_SPACE_RECHECK,
            Box::new(|_| Ok(150)),
        );
        let hb = heartbeat_request(3, "http://n3:7101", "ab", &space, 42);
        assert_eq!(
            hb,
            HeartbeatRequest {
                id: 3,
                addr: "http://n3:7101".into(),
                disk_id: "ab".into(),
                writable: true,
                free_bytes: 150,
                used_bytes: 42,
                ..Default::default()
            }
        );
        let full = DiskSpace::with_probe(
            Path::new("/x"),
            200,
            FREE_SPACE_RECHECK,
            Box::new(|_| Ok(150)),
        );
        let hb = heartbeat_request(3, "a", "ab", &full, 42);
        assert!(!hb.writable);
        assert_eq!(hb.free_bytes, 150);
    }
}
