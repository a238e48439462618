//! [`run`]: the datanode process — disk identity, shard store, gRPC
//! server, membership, shard GC, scrub.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sluice_net::net::Listener;
use sluice_util::worker::Workers;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use sluice_meta_client::MetaClient;

use crate::gc::{self, Collector, MetaOracle};
use crate::identity::{self, Provenance};
use crate::locks::BlobLocks;
use crate::membership::Membership;
use crate::scrub::{self, MetaReporter, ScrubProgress, Scrubber};
use crate::service::{DatanodeService, ServiceOptions};
use crate::space::DiskSpace;
use crate::store::{DiskStore, StoreError};
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
/// Reads (or, on an empty data dir, writes) the data dir's identity and
/// refuses a data dir formatted by another node id
/// ([`crate::identity`]). Opens (and recovers) the shard store under
/// `config.data_dir`, serves
/// `sluice.datanode.Datanode`, and registers with meta and heartbeats in
/// the background (meta may be unreachable; registration is retried).
/// Shard GC runs in the background every `config.gc_interval`, scrub one
/// pass per `config.scrub_interval` (unless its bandwidth is 0).
/// On `shutdown` it stops accepting connections, lets in-flight requests
/// finish for `config.shutdown_grace`, then cancels them. It returns once
/// every task has ended and every file is closed, so the same `data_dir`
/// can be reopened at once.
///
/// Errors: [`Error::Config`] (before anything starts),
/// [`Error::Identity`] (foreign or damaged identity), [`Error::Store`]
/// (cannot open the data dir), [`Error::Serve`].
pub async fn run(
    config: Config,
    listener: impl Into<Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let listener = listener.into();
    let transport = sluice_net::Transport::for_listener(
        &listener,
        config.cluster_tls.as_ref(),
        config.insecure_cluster,
        sluice_net::Role::Datanode,
    )?;
    transport.warn_if_insecure("datanode");
    metrics::describe();
    gc::describe();
    scrub::describe();
    let (data_dir, node_id) = (config.data_dir.clone(), config.node_id);
    let (disk, provenance) =
        match tokio::task::spawn_blocking(move || identity::load_or_create(&data_dir, node_id))
            .await
        {
            Ok(r) => r?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return Err(StoreError::ShuttingDown.into()),
        };
    match provenance {
        Provenance::Existing => {}
        Provenance::Formatted => {
            tracing::info!(node = config.node_id, disk_id = %disk.disk_id, data_dir = %config.data_dir.display(), "formatted a new data dir")
        }
        Provenance::Upgraded => {
            tracing::warn!(node = config.node_id, disk_id = %disk.disk_id, data_dir = %config.data_dir.display(), "data dir holds shards but had no identity file; wrote one")
        }
    }
    crate::space::log_filesystem(&config.data_dir);
    let store = DiskStore::open(&config.data_dir, config.node_id).await?;
    store.set_keep_written_pages(config.keep_written_pages);
    let locks = BlobLocks::new();
    let space = Arc::new(DiskSpace::new(
        &config.data_dir,
        config.reserved_free_bytes.as_u64(),
    ));
    let cancel = CancellationToken::new();
    let stop_accepting = CancellationToken::new();
    let tasks = TaskTracker::new();
    let options = ServiceOptions {
        node_id: config.node_id,
        shard_channel_depth: config.shard_channel_depth,
        write_budget: config.write_budget(),
        credit_fsync_bytes: config.credit_fsync_bytes.as_u64(),
        credit_fsync_idle: config.credit_fsync_idle,
        max_shard_streams: config.max_shard_streams,
        verify_bandwidth: config.verify_bandwidth_bytes_per_sec.as_u64(),
    };
    let gc_meta = MetaClient::with_timeouts(
        config.meta_endpoints.clone(),
        GC_META_RETRY_DEADLINE,
        GC_META_RPC_TIMEOUT,
    )
    .with_transport(transport.clone());
    let collector = Collector {
        store: store.clone(),
        oracle: MetaOracle::new(gc_meta.clone()),
        locks: locks.clone(),
        node_id: config.node_id,
        interval: config.gc_interval,
        grace: config.gc_grace,
        max_ops_per_sec: config.gc_max_ops_per_sec,
    };
    // The datanode's background workers: they stop with `cancel`, and
    // their states go to meta with each heartbeat.
    let workers = Workers::new(cancel.clone());
    workers.spawn("gc", move |w| collector.run(w));
    let scrubber = Scrubber {
        store: store.clone(),
        reporter: MetaReporter::new(gc_meta),
        node_id: config.node_id,
        interval: config.scrub_interval,
        bandwidth: config.scrub_bandwidth_bytes_per_sec.as_u64(),
        progress: Arc::new(ScrubProgress::default()),
    };
    workers.spawn("scrubber", move |w| scrubber.run(w));
    let service = DatanodeService::new(
        store.clone(),
        options,
        stop_accepting.clone(),
        cancel.clone(),
        tasks.clone(),
        locks,
        Arc::clone(&space),
    );
    let membership = Membership {
        node_id: config.node_id,
        advertise_addr: config.advertise_addr.clone(),
        meta_endpoints: config.meta_endpoints.clone(),
        heartbeat_interval: config.heartbeat_interval,
        disk_id: disk.disk_id.clone(),
        space,
        store,
        zone: config.zone.clone(),
        host: config.host_label(),
        credits: service.credit_hub(),
        transport: transport.clone(),
        workers: workers.clone(),
    };
    workers.spawn("membership", move |w| membership.run(w));

    tracing::info!(
        node = config.node_id,
        listen = ?listener.local_addr(),
        advertise = %config.advertise_addr,
        data_dir = %config.data_dir.display(),
        write_budget_bytes = options.write_budget,
        "datanode serving"
    );
    // With TCP_NODELAY: small responses (acks, status) should not wait
    // for Nagle.
    let incoming = listener.incoming();
    let server = transport
        .server(sluice_net::policy::DATANODE_SERVER)?
        .initial_stream_window_size(receive_window(options.write_budget))
        .initial_connection_window_size(receive_window(options.write_budget))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // Streams per connection: refused past it by HTTP/2, and requests
        // past it wait in the connection's concurrency limit.
        .max_concurrent_streams(config.max_streams_per_connection)
        .concurrency_limit_per_connection(config.max_streams_per_connection as usize)
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
    workers.join().await;
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
