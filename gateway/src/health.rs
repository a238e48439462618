//! `GET /health/live` and `GET /health/ready` of the gateway, answered on
//! the S3 port without authentication (load balancers check the port they
//! balance, as MinIO's `/minio/health/live`) and by the `sluice` binary on
//! the metrics/health listener.
//!
//! * live: the process is up and serving: always `200`.
//! * ready: the meta leader answers `ListDatanodes` within
//!   [`READY_PROBE_TIMEOUT`] and at least `write_quorum` datanodes are live
//!   and writable; else `503` with the reason.
//!
//! The answer is one line of text. A ready result is cached for
//! [`READY_CACHE`] and probes are serialized, so a flood of probes makes at
//! most one meta call at a time.
//!
//! On the S3 port only *unsigned* `GET`/`HEAD` requests of exactly these
//! paths are health checks: a signed request for the object `live` in a
//! bucket named `health` is an ordinary S3 request.

use std::time::{Duration, Instant};

use sluice_meta_client::MetaClient;

/// Path of the liveness check.
pub const LIVE_PATH: &str = "/health/live";
/// Path of the readiness check.
pub const READY_PATH: &str = "/health/ready";
/// Longest a readiness probe waits for meta.
pub const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a readiness result is reused.
pub const READY_CACHE: Duration = Duration::from_secs(1);

/// A health answer: whether the check passed and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub ok: bool,
    pub reason: String,
}

impl Health {
    pub fn ok(reason: impl Into<String>) -> Self {
        Health {
            ok: true,
            reason: reason.into(),
        }
    }

    pub fn failing(reason: impl Into<String>) -> Self {
        Health {
            ok: false,
            reason: reason.into(),
        }
    }

    /// HTTP status of the answer: 200 or 503.
    pub fn status(&self) -> http::StatusCode {
        if self.ok {
            http::StatusCode::OK
        } else {
            http::StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// The gateway's readiness check (see the module docs).
pub struct GatewayHealth {
    meta: MetaClient,
    write_quorum: usize,
    /// The last answer and when it was made (one entry).
    last: tokio::sync::Mutex<Option<(Instant, Health)>>,
}

impl GatewayHealth {
    pub fn new(meta: MetaClient, write_quorum: usize) -> Self {
        GatewayHealth {
            meta,
            write_quorum,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Liveness: the gateway is serving.
    pub fn live(&self) -> Health {
        Health::ok("live: gateway serving")
    }

    /// Readiness (see the module docs).
    pub async fn ready(&self) -> Health {
        let mut last = self.last.lock().await;
        if let Some((at, health)) = &*last
            && at.elapsed() < READY_CACHE
        {
            return health.clone();
        }
        let health = match tokio::time::timeout(READY_PROBE_TIMEOUT, self.meta.list_datanodes())
            .await
        {
            Err(_) => Health::failing(format!(
                "not ready: the meta leader did not answer within {READY_PROBE_TIMEOUT:?}"
            )),
            Ok(Err(e)) => Health::failing(format!("not ready: meta leader unreachable: {e}")),
            Ok(Ok(nodes)) => {
                let writable = nodes.iter().filter(|d| d.live && d.writable).count();
                if writable >= self.write_quorum {
                    Health::ok(format!(
                        "ready: meta leader reachable, {writable} writable datanodes (write quorum {})",
                        self.write_quorum
                    ))
                } else {
                    Health::failing(format!(
                        "not ready: {writable} writable datanodes, the write quorum needs {}",
                        self.write_quorum
                    ))
                }
            }
        };
        *last = Some((Instant::now(), health.clone()));
        health
    }
}
