//! [`run`]: the datanode process — shard store, gRPC server, membership,
//! shard GC.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;

use sluice_meta::MetaClient;

use crate::gc::{self, Collector, MetaOracle};
use crate::membership::Membership;
use crate::service::{DatanodeService, ServiceOptions};
use crate::store::DiskStore;
use crate::{Config, Error, metrics};

/// HTTP/2 receive window, per stream and per connection, for a datanode
/// whose write budget is `write_budget` bytes: the budget itself (clamped
/// to what HTTP/2 allows, 64 KiB to 2^31 - 1).
///
/// Credits, not windows, bound the datanode's memory: bytes a gateway sent
/// against credit are counted (outstanding, then in-flight) wherever they
/// sit, including in these windows. No gateway holds more credit than the
/// budget, so a window of the budget's size never stalls a transfer that
/// credit allows: credit alone paces the gateways (RFC 9113, section 5.2).
pub fn receive_window(write_budget: u64) -> u32 {
    const MIN: u64 = 64 * 1024;
    const MAX: u64 = (1 << 31) - 1;
    u32::try_from(write_budget.clamp(MIN, MAX)).expect("clamped to u32")
}

/// HTTP/2 keepalive ping interval; a peer that does not answer within
/// [`KEEPALIVE_TIMEOUT`] is dropped and its uncommitted shards discarded.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Shard GC's meta calls: total retry time per call, and per attempt.
const GC_META_RETRY_DEADLINE: Duration = Duration::from_secs(30);
const GC_META_RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a datanode on `listener` until `shutdown` resolves.
///
/// Opens (and recovers) the shard store under `config.data_dir`, serves
/// `sluice.datanode.Datanode`, and registers with meta and heartbeats in
/// the background (meta may be unreachable; registration is retried).
/// Shard GC runs in the background every `config.gc_interval`.
/// On `shutdown` it stops accepting connections, lets in-flight requests
/// finish for `config.shutdown_grace`, then cancels them. It returns once
/// every task has ended and every file is closed, so the same `data_dir`
/// can be reopened at once.
///
/// Errors: [`Error::Config`] (before anything starts), [`Error::Store`]
/// (cannot open the data dir), [`Error::Serve`].
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    metrics::describe();
    gc::describe();
    let store = DiskStore::open(&config.data_dir, config.node_id).await?;
    let cancel = CancellationToken::new();
    let stop_accepting = CancellationToken::new();
    let tasks = TaskTracker::new();
    let options = ServiceOptions {
        node_id: config.node_id,
        shard_channel_depth: config.shard_channel_depth,
        write_budget: config.write_budget(),
        credit_fsync_bytes: config.credit_fsync_bytes,
        credit_fsync_idle: config.credit_fsync_idle,
    };
    let collector = Collector {
        store: store.clone(),
        oracle: MetaOracle::new(MetaClient::with_timeouts(
            config.meta_endpoints.clone(),
            GC_META_RETRY_DEADLINE,
            GC_META_RPC_TIMEOUT,
        )),
        node_id: config.node_id,
        interval: config.gc_interval,
        grace: config.gc_grace,
    };
    tasks.spawn(collector.run(cancel.clone()));
    let service = DatanodeService::new(
        store,
        options,
        stop_accepting.clone(),
        cancel.clone(),
        tasks.clone(),
    );
    let membership = Membership {
        node_id: config.node_id,
        advertise_addr: config.advertise_addr.clone(),
        meta_endpoints: config.meta_endpoints.clone(),
        heartbeat_interval: config.heartbeat_interval,
    };
    tasks.spawn(membership.run(cancel.clone()));

    tracing::info!(
        node = config.node_id,
        listen = ?listener.local_addr().ok(),
        advertise = %config.advertise_addr,
        data_dir = %config.data_dir.display(),
        write_budget_bytes = options.write_budget,
        "datanode serving"
    );
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            // Small responses (acks, status) should not wait for Nagle.
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    let server = Server::builder()
        .initial_stream_window_size(receive_window(options.write_budget))
        .initial_connection_window_size(receive_window(options.write_budget))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, stop_accepting.clone().cancelled_owned());

    let result = drive(
        server,
        shutdown,
        &stop_accepting,
        &cancel,
        config.shutdown_grace,
    )
    .await;
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    tracing::info!(node = config.node_id, "datanode stopped");
    Ok(result?)
}

/// Serves until `shutdown`, then drains for `grace` and cancels what is left.
async fn drive(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    shutdown: impl Future<Output = ()>,
    stop_accepting: &CancellationToken,
    cancel: &CancellationToken,
    grace: Duration,
) -> Result<(), tonic::transport::Error> {
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r,
        () = shutdown => {}
    }
    stop_accepting.cancel();
    if let Ok(r) = tokio::time::timeout(grace, &mut server).await {
        return r;
    }
    tracing::warn!(
        ?grace,
        "requests still running after the shutdown grace; cancelling them"
    );
    cancel.cancel();
    match tokio::time::timeout(grace, &mut server).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                "connections still open after cancelling requests; leaving them to close"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::receive_window;

    #[test]
    fn windows_are_the_budget_within_http2_limits() {
        assert_eq!(receive_window(64 * 1024 * 1024), 64 * 1024 * 1024);
        assert_eq!(receive_window(1), 64 * 1024);
        assert_eq!(receive_window(u64::MAX), (1 << 31) - 1);
    }
}
