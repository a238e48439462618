//! [`run`]: one meta node — sled store, openraft, the gRPC server (Raft
//! and Meta services on one listener), and the leader's background tasks
//! (datanode liveness, stale upload sweeper, epoch and session sweeps,
//! the reclaimer of released blobs).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, SnapshotPolicy};
use sluice_net::net::Listener;
use sluice_proto::admin::admin_server::AdminServer;
use sluice_proto::meta::meta_server::MetaServer;
use sluice_proto::raft::raft_server::RaftServer;
use sluice_util::worker::{WorkerHandle, Workers};

use crate::admin::AdminService;
use crate::api::MetaService;
use crate::config::Config;
use crate::error::Error;
use crate::lifecycle::LifecycleSweeper;
use crate::liveness::{Liveness, watch_leadership};
use crate::raft::network::{MAX_MESSAGE_BYTES, Network};
use crate::raft::service::{NodeVersionFn, RaftService};
use crate::raft::{LogStore, MetaRaft, StateMachine};
use crate::reclaimer::{GrpcDeleter, Reclaimer};
use crate::store::SledStore;
use crate::sweeper::{LeaseSweeper, Sweeper, high_water_entries};
use crate::version::{Gate, Versions};

/// How long the leader waits for one InstallSnapshot call, the last of
/// which lasts the follower's whole install (`sluice-bench meta-load`).
const INSTALL_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);

/// Log entries per AppendEntries call. openraft 0.9 gives each call
/// `heartbeat_interval` (250 ms) and resends on timeout, while the follower
/// still appends every request already queued: with its default of 300
/// entries, records of 1,000-part objects (~100 KB each) made calls a
/// catching-up follower could not append in time, and the resent calls
/// queued on it without it ever catching up
/// (`sluice-bench meta-load --many-parts-objects 1000`). 64 entries bound a
/// call to 64 x the largest entry (6.4 MB of such records). Not lower: one
/// call per follower is in flight at a time, so this also caps a write
/// batch (16 throttled 64 writers; figures in bench/RESULTS.md).
const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// The snapshot files' directory, inside `data_dir` (beside sled's files).
pub const SNAPSHOT_DIR: &str = "raft-snapshots";
/// How long `run` waits, on start, for a previous instance in this process
/// to release the same data dir, and on shutdown for its own handles.
const STORE_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Bytes of snapshot a build may cost per log entry since the last one: a
/// node builds a snapshot once `max(snapshot_logs_since_last, current
/// snapshot bytes / this)` entries were applied since the last one, so the
/// build's cost per entry stays flat as the metadata grows (a build writes
/// the whole state). With openraft's fixed `LogsSinceLast(5000)` a large
/// store had each node spend most of its time building snapshots, and
/// PutObject throughput fell (`sluice-bench meta-load --objects 2000000`;
/// figures in bench/RESULTS.md); 4 KiB was still too little. At 1 KiB an
/// entry of a ~320-byte record (what the
/// snapshot holds per object, with its reference and session) pays ~3x its
/// size in snapshot writes, and the log kept between snapshots (in sled,
/// on disk; a restart does not replay it, the applied state is in sled
/// too) grows to snapshot bytes / 1 KiB entries, about a third of the
/// snapshot's size.
const SNAPSHOT_BYTES_PER_ENTRY: u64 = 1024;
/// How often the snapshot schedule looks at the applied index.
const SNAPSHOT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a meta node on `listener` until `shutdown` resolves.
///
/// On first start the node with the lowest id among the initial voters
/// (see [`Config::voters`]) initializes the cluster; a restarted node
/// keeps its state (membership included) and does not initialize again; a
/// node with `join = true` never initializes and waits to be added. On shutdown the Raft is
/// stopped, then the gRPC server, and the function returns only after the
/// sled database is closed, so the same `data_dir` can be reopened at once.
///
/// Errors: invalid config, the store cannot be opened, Raft fails to start
/// or initialize, or the gRPC server fails.
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
        sluice_net::Role::Meta,
    )?;
    transport.warn_if_insecure("meta");
    std::fs::create_dir_all(&config.data_dir).map_err(|source| Error::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    let kv = Arc::new(open_store(&config).await?);
    // Before Raft reads anything: a store of another format version is
    // refused or migrated here.
    let store_name = format!("meta store at {}", config.data_dir.display());
    if let Err(e) = crate::store::format::open_format(kv.as_ref(), &store_name).await {
        drop(kv);
        return Err(Error::StoreFormat(e));
    }

    let raft_config = openraft::Config {
        cluster_name: "sluice-meta".to_string(),
        heartbeat_interval: ms(config.heartbeat_interval),
        election_timeout_min: ms(config.election_timeout_min),
        election_timeout_max: ms(config.election_timeout_max),
        // Builds are triggered by `schedule_snapshots`.
        snapshot_policy: SnapshotPolicy::Never,
        // The last chunk's InstallSnapshot answers when the follower has
        // installed the snapshot, which for a large one takes minutes.
        // With openraft's 200 ms default the leader gave up and sent the
        // whole snapshot again on every timeout while the follower was
        // installing; the resent chunks queued on the follower. See
        // INSTALL_SNAPSHOT_TIMEOUT.
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT.as_millis() as u64,
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        max_in_snapshot_log_to_keep: config.max_in_snapshot_log_to_keep,
        ..Default::default()
    }
    .validate()?;
    let network = Network {
        node_id: config.node_id,
        connect_timeout: config.peer_connect_timeout,
        transport: transport.clone(),
    };
    let gate = Arc::new(Gate::new(
        config.replicated_format_override,
        config.testing_command_formats.clone(),
    ));
    let state_machine = StateMachine::open(kv.clone(), config.data_dir.join(SNAPSHOT_DIR))
        .await
        .map_err(Error::StateMachine)?
        .understanding(gate.format());
    let snapshot_bytes = state_machine.snapshot_bytes();
    let apply_blocked = state_machine.blocked_index();
    let digester = state_machine.digester();
    let initial_settings = crate::admin::settings::initial_settings(config.epoch_lease);
    let raft = MetaRaft::new(
        config.node_id,
        Arc::new(raft_config),
        network,
        LogStore::new(kv.clone()),
        state_machine,
    )
    .await?;
    tracing::info!(node_id = config.node_id, addr = %config.advertise_addr,
        replicated_format = gate.format(), version = crate::version::BINARY_VERSION,
        "meta node started");

    if let Err(e) = bootstrap(&raft, &config).await {
        let _ = raft.shutdown().await;
        return Err(e);
    }

    // Meta's background workers (`sluice admin status` lists them). The
    // leader-only ones idle on followers; all stop with the node.
    let workers = Workers::default();
    {
        let raft = raft.clone();
        let min_entries = config.snapshot_logs_since_last;
        workers.spawn("snapshot-schedule", move |w| {
            schedule_snapshots(raft, snapshot_bytes, min_entries, w)
        });
    }
    let liveness = Arc::new(Liveness::new(config.datanode_liveness));
    {
        let (raft, liveness) = (raft.clone(), liveness.clone());
        workers.spawn_loop("leadership-watch", move |w| {
            watch_leadership(raft, liveness, w)
        });
    }
    let versions = Versions {
        node_id: config.node_id,
        raft: raft.clone(),
        kv: kv.clone(),
        gate: gate.clone(),
        blocked: apply_blocked,
        transport: transport.clone(),
        call_timeout: config.version_call_timeout,
    };
    {
        let versions = versions.clone();
        let (auto, interval) = (config.auto_finalize, config.version_check_interval);
        workers.spawn_loop("version-finalizer", move |w| {
            versions.run(auto, interval, w)
        });
    }
    let sweeper = Sweeper {
        raft: raft.clone(),
        kv: kv.clone(),
        gate: gate.clone(),
        interval: config.stale_upload_check_interval,
        expiry: config.stale_upload_expiry,
    };
    workers.spawn_loop("upload-sweeper", move |w| sweeper.run(w));
    let lifecycle_sweeper = LifecycleSweeper {
        raft: raft.clone(),
        kv: kv.clone(),
        gate: gate.clone(),
        interval: config.lifecycle_check_interval,
        day: config.lifecycle_day,
    };
    workers.spawn_loop("lifecycle-sweeper", move |w| lifecycle_sweeper.run(w));
    let lease_sweeper = LeaseSweeper {
        raft: raft.clone(),
        kv: kv.clone(),
        gate: gate.clone(),
        epoch_interval: config.epoch_sweep_interval,
        initial_settings,
        session_interval: config.session_sweep_interval,
        session_expiry: config.session_expiry,
        session_min_age: config.session_min_age,
        session_high_water_entries: high_water_entries(
            config.session_table_max_entries,
            config.session_high_water,
        ),
    };
    workers.spawn_loop("lease-sweeper", move |w| lease_sweeper.run(w));
    let reclaimer = Reclaimer {
        raft: raft.clone(),
        kv: kv.clone(),
        gate: gate.clone(),
        deleter: Arc::new(GrpcDeleter::new(
            config.reclaim_call_timeout,
            transport.clone(),
        )),
        interval: config.reclaim_interval,
        delete_delay: config.delete_delay,
        concurrency: config.reclaim_concurrency,
        cursor: Default::default(),
        clock: Default::default(),
    };
    workers.spawn_loop("reclaimer", move |w| reclaimer.run(w));

    let loads = Arc::new(crate::admin::status::Loads::default());
    let admin = AdminService {
        node_id: config.node_id,
        raft: raft.clone(),
        kv: kv.clone(),
        liveness: liveness.clone(),
        members: Arc::new(crate::admin::members::Members::new(
            config.node_id,
            raft.clone(),
        )),
        loads: Arc::clone(&loads),
        memory_budget: config.sled_cache_bytes.as_u64(),
        transport: transport.clone(),
        workers: workers.clone(),
        gate: gate.clone(),
        versions: versions.clone(),
        digester,
        lease_limit: crate::admin::settings::LeaseLimit {
            session_expiry: config.session_expiry,
            client_retry_deadline: config.client_retry_deadline,
        },
    };
    let meta = MetaService {
        node_id: config.node_id,
        raft: raft.clone(),
        kv: kv.clone(),
        liveness,
        loads,
        sessions: crate::api::SessionGate::new(config.session_table_max_entries),
        gate,
        versions: versions.clone(),
        initial_settings,
    };
    let node_version: NodeVersionFn = Arc::new(move || versions.local().map_err(|e| e.to_string()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // With TCP_NODELAY (see Listener::incoming): without it a response of
    // more than one segment (a listing page, an AppendEntries answer)
    // waited for the peer's delayed ACK, ~40 ms.
    let incoming = listener.incoming();
    let server = transport
        .server(sluice_net::policy::META_SERVER)?
        .add_service(
            RaftServer::new(RaftService::new(raft.clone(), node_version))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            MetaServer::new(meta)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(AdminServer::new(admin))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let mut server = tokio::spawn(server);

    let mut shutdown = std::pin::pin!(shutdown);
    let early = tokio::select! {
        _ = &mut shutdown => None,
        r = &mut server => Some(r),
    };
    tracing::info!(node_id = config.node_id, "meta node stopping");
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    let _ = stop_tx.send(());
    let served = match early {
        Some(r) => r,
        None => server.await,
    };
    workers.shutdown().await;
    drop(raft);
    release_store(kv).await;
    tracing::info!(node_id = config.node_id, "meta node stopped");
    served??;
    Ok(())
}

/// Entries applied since the last snapshot after which the next is built:
/// at least `min_entries`, and the current snapshot's size over
/// [`SNAPSHOT_BYTES_PER_ENTRY`].
fn snapshot_threshold(min_entries: u64, snapshot_bytes: u64) -> u64 {
    min_entries.max(snapshot_bytes / SNAPSHOT_BYTES_PER_ENTRY)
}

/// Triggers a snapshot build whenever the entries applied since the last
/// snapshot reach [`snapshot_threshold`] (openraft ignores a trigger while
/// a build runs). Runs until `worker` is cancelled, or ends when the
/// trigger fails (Raft shut down).
async fn schedule_snapshots(
    raft: MetaRaft,
    snapshot_bytes: Arc<AtomicU64>,
    min_entries: u64,
    worker: WorkerHandle,
) {
    let mut metrics = raft.metrics();
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = worker.cancelled() => return,
        }
        let (applied, snapshot) = {
            let m = metrics.borrow_and_update();
            (
                m.last_applied.map_or(0, |l| l.index),
                m.snapshot.map_or(0, |l| l.index),
            )
        };
        let threshold = snapshot_threshold(min_entries, snapshot_bytes.load(Ordering::Relaxed));
        if applied.saturating_sub(snapshot) >= threshold
            && let Err(e) = raft.trigger().snapshot().await
        {
            worker.report_error(format_args!("snapshot trigger: {e}"));
            return;
        }
        worker.ran();
    }
}

/// Opens the sled store, waiting a little for a previous instance in this
/// process that is still closing the same directory.
async fn open_store(config: &Config) -> Result<SledStore, Error> {
    let started = Instant::now();
    loop {
        match SledStore::open(&config.data_dir, config.sled_cache_bytes.as_u64()) {
            Ok(s) => return Ok(s),
            Err(e) if started.elapsed() < STORE_RELEASE_WAIT && is_lock_error(&e) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(source) => {
                return Err(Error::Store {
                    path: config.data_dir.clone(),
                    source,
                });
            }
        }
    }
}

/// sled reports a held directory lock as an `Other` I/O error with this text.
fn is_lock_error(e: &crate::store::KvError) -> bool {
    matches!(e, crate::store::KvError::Sled(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock"))
}

/// Drops the last handle to the store once the Raft tasks have released
/// theirs, so sled closes and unlocks the directory.
async fn release_store(kv: Arc<SledStore>) {
    let started = Instant::now();
    let mut kv = kv;
    loop {
        match Arc::try_unwrap(kv) {
            Ok(store) => {
                drop(store);
                return;
            }
            Err(still_shared) if started.elapsed() < STORE_RELEASE_WAIT => {
                kv = still_shared;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => {
                tracing::warn!(
                    "metadata store still referenced after shutdown; it closes when the last handle drops"
                );
                return;
            }
        }
    }
}

/// Initializes the cluster if this node has never been initialized, is not
/// a joining node (`join = true`) and is the lowest-id initial voter. A node
/// with Raft state keeps the membership stored in Raft and ignores
/// `voters`.
async fn bootstrap(raft: &MetaRaft, config: &Config) -> Result<(), Error> {
    if raft.is_initialized().await? {
        tracing::info!("raft state found, not initializing");
        return Ok(());
    }
    if config.join {
        tracing::info!(
            node_id = config.node_id,
            addr = %config.advertise_addr,
            "no raft state and join = true: waiting to be added (sluice admin meta add)"
        );
        return Ok(());
    }
    let voters = config.initial_voters();
    let lowest = voters.keys().next().copied().unwrap_or(config.node_id);
    if lowest != config.node_id {
        tracing::info!(
            initializer = lowest,
            "waiting for the lowest-id voter to initialize the cluster"
        );
        return Ok(());
    }
    let members: std::collections::BTreeMap<u64, BasicNode> = voters
        .into_iter()
        .map(|(id, addr)| (id, BasicNode { addr }))
        .collect();
    match raft.initialize(members).await {
        Ok(()) => {
            tracing::info!("initialized the meta cluster");
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            tracing::info!(reason = %e, "cluster already initialized");
            Ok(())
        }
        Err(e) => Err(Error::Initialize(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_wait_longer_as_they_grow() {
        assert_eq!(snapshot_threshold(5000, 0), 5000);
        assert_eq!(snapshot_threshold(5000, 1024 * 5000), 5000);
        // A 100 MB snapshot: one build per ~97,700 entries.
        assert_eq!(snapshot_threshold(5000, 100_000_000), 97_656);
        assert_eq!(snapshot_threshold(100, 1 << 20), 1024);
    }
}
