//! Registration with meta and heartbeats, in one background task.
//!
//! Meta may start after the datanode or be unreachable for a while: the
//! task retries registration every heartbeat interval until it succeeds,
//! then heartbeats at that pace; a refused heartbeat (meta forgot the
//! node) sends it back to registering. It ends when `cancel` fires.

use std::time::Duration;

use sluice_meta::{MetaClient, MetaError};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Failed attempts between two warnings while meta stays unreachable.
const WARN_EVERY: u32 = 30;

pub(crate) struct Membership {
    pub node_id: u64,
    pub advertise_addr: String,
    pub meta_endpoints: Vec<String>,
    pub heartbeat_interval: Duration,
}

impl Membership {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        // One attempt (with the client's own retries) fits in an interval.
        let meta = MetaClient::with_timeouts(
            self.meta_endpoints.clone(),
            self.heartbeat_interval.max(Duration::from_secs(1)),
            self.heartbeat_interval
                .clamp(Duration::from_secs(1), Duration::from_secs(5)),
        );
        let mut ticker = tokio::time::interval(self.heartbeat_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut registered = false;
        let mut failures = 0u32;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let attempt = async {
                if registered {
                    meta.heartbeat(sluice_proto::meta::HeartbeatRequest {
                        id: self.node_id,
                        addr: self.advertise_addr.clone(),
                        writable: true,
                        ..Default::default()
                    })
                    .await
                } else {
                    meta.register_datanode(self.node_id, &self.advertise_addr, "")
                        .await
                        .map(drop)
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
                        tracing::info!(node = self.node_id, addr = %self.advertise_addr, "registered with meta");
                    } else if failures > 0 {
                        tracing::info!(node = self.node_id, "heartbeats to meta resumed");
                    }
                    registered = true;
                    failures = 0;
                }
                Err(MetaError::Refused { code, message }) => {
                    tracing::warn!(node = self.node_id, ?code, %message, "meta refused {what}; registering again");
                    registered = false;
                    failures += 1;
                }
                Err(e @ MetaError::Unavailable(_)) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(WARN_EVERY) {
                        tracing::warn!(node = self.node_id, failures, error = %e, "{what} with meta failed; retrying");
                    }
                }
            }
        }
    }
}
