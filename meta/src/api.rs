//! The `sluice.meta.Meta` gRPC service.
//!
//! Mutations are proposed with `client_write` on the leader; reads run
//! after `ensure_linearizable` on the leader. A follower answers both with
//! `NOT_LEADER` and the leader hint (`sluice_proto::error::not_leader`).
//! Heartbeats and ListDatanodes are leader-only too: liveness lives in the
//! leader's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::BasicNode;
use openraft::ServerState;
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use sluice_proto::error::{not_leader, status};
use sluice_proto::meta::{self as pb, ErrorCode, meta_server::Meta};
use sluice_proto::raft::meta_command::Command;
use tonic::{Request, Response, Status};

use crate::liveness::{Capacity, Liveness};
use crate::raft::MetaRaft;
use crate::sm::{self, Applied, SmError};
use crate::store::KvStore;
use crate::version::Gate;

pub(crate) struct MetaService<K: KvStore> {
    pub(crate) node_id: u64,
    pub(crate) raft: MetaRaft,
    pub(crate) kv: Arc<K>,
    pub(crate) liveness: Arc<Liveness>,
    /// Loads datanodes and gateways report, for `sluice admin status`.
    pub(crate) loads: Arc<crate::admin::status::Loads>,
    /// The leader's bound on the session table.
    pub(crate) sessions: SessionGate,
    /// The cluster version gate of this node's proposals.
    pub(crate) gate: Arc<Gate>,
    /// Records a fresh cluster's version before its first write epoch.
    pub(crate) versions: crate::version::Versions<K>,
    /// The cluster settings this node proposes while none are stored
    /// (from its config; see `crate::admin::settings::ensure_initial`).
    pub(crate) initial_settings: sluice_proto::raft::ClusterSettings,
}

/// Counter: operations the leader refused `SLOW_DOWN` because the session
/// table was full.
pub const SESSIONS_REFUSED_TOTAL: &str = "sluice_meta_sessions_refused_total";

/// The leader's bound on the session table (`session_table_max_entries`):
/// a command carrying an op id is proposed only while the table's entries,
/// plus every entry the proposals not yet applied may add, stay within the
/// bound ([`sm::sessions::admit`]). So the table never goes past it by a
/// gated command; OpenEpoch and RenewEpoch are not gated
/// ([`sm::admission_op_id`]), nor are the Admin service's commands
/// (operator actions, rare), and only they can take it over.
pub(crate) struct SessionGate {
    max: u64,
    /// Gated proposals whose write has not returned.
    in_flight: AtomicU64,
}

/// A gated proposal's place; given back when dropped.
struct Admitted<'a>(&'a AtomicU64);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SessionGate {
    /// A gate for at most `max` entries.
    pub(crate) fn new(max: u64) -> Self {
        SessionGate {
            max,
            in_flight: AtomicU64::new(0),
        }
    }

    /// Admits `command` on the leader, or refuses it `SLOW_DOWN`; the
    /// place it holds lasts as long as the returned guard. Elsewhere it
    /// admits (the write is answered `NOT_LEADER`).
    fn admit<K: KvStore>(
        &self,
        kv: &K,
        raft: &MetaRaft,
        command: &Command,
    ) -> Result<Option<Admitted<'_>>, Status> {
        let op_id = sm::admission_op_id(command);
        if op_id.is_empty() {
            return Ok(None);
        }
        let (leader, unapplied) = {
            let m = raft.metrics();
            let m = m.borrow();
            let applied = m.last_applied.map_or(0, |l| l.index);
            (
                m.state == ServerState::Leader,
                m.last_log_index.unwrap_or(0).saturating_sub(applied),
            )
        };
        if !leader {
            return Ok(None);
        }
        // Take the place before reading the table: a proposal is then
        // counted as in flight, or as applied, or both, never neither.
        let mine = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let admitted = Admitted(&self.in_flight);
        // Log entries not yet applied may be a previous leader's gated
        // proposals (or this leader's, counted twice: a safe overcount).
        match sm::sessions::admit(kv, op_id, mine + unapplied, self.max) {
            Ok(()) => Ok(Some(admitted)),
            Err(e) => {
                if matches!(&e, SmError::Refused { .. }) {
                    metrics::counter!(SESSIONS_REFUSED_TOTAL).increment(1);
                }
                Err(sm_status(e))
            }
        }
    }
}

/// `true` when a registration of (addr, disk_id) under the id of `recorded`
/// is a second process claiming a live node's id: the node is heard from,
/// and both its disk id and its address differ. A restarted node keeps its
/// address or its disk, so either being equal lets it through.
fn claims_live_id(recorded: &pb::DatanodeInfo, live: bool, addr: &str, disk_id: &str) -> bool {
    live && !disk_id.is_empty()
        && !recorded.disk_id.is_empty()
        && recorded.disk_id != disk_id
        && recorded.addr != addr
}

fn registered(applied: Applied) -> Result<pb::RegisterDatanodeResponse, Status> {
    match applied {
        Applied::Registered(r) => Ok(r),
        other => Err(unexpected("RegisterDatanode", &other)),
    }
}

fn forward(f: ForwardToLeader<u64, BasicNode>) -> Status {
    not_leader(f.leader_id, f.leader_node.map(|n| n.addr))
}

pub(crate) fn sm_status(e: SmError) -> Status {
    match e {
        SmError::Refused { code, message } => status(code, message),
        // Overwritten more often than a read could keep up with: the
        // client retries.
        e @ SmError::Torn(_) => Status::unavailable(e.to_string()),
        other => {
            tracing::error!(error = %other, "metadata read failed");
            status(ErrorCode::Internal, other.to_string())
        }
    }
}

pub(crate) fn unexpected(what: &str, applied: &Applied) -> Status {
    status(
        ErrorCode::Internal,
        format!("{what} applied as {applied:?}"),
    )
}

fn released(what: &str, applied: Applied) -> Result<Response<pb::ReleasedResponse>, Status> {
    match applied {
        Applied::Released(released) => Ok(Response::new(pb::ReleasedResponse {
            released,
            ..Default::default()
        })),
        Applied::Versioned {
            released,
            version_id,
            delete_marker,
        } => Ok(Response::new(pb::ReleasedResponse {
            released,
            version_id,
            delete_marker,
        })),
        other => Err(unexpected(what, &other)),
    }
}

fn done(what: &str, applied: &Applied) -> Result<(), Status> {
    match applied {
        Applied::Done => Ok(()),
        other => Err(unexpected(what, other)),
    }
}

/// Proposes `command`, stamped with this leader's clock
/// (`leader_now_ms`), and waits for it to be applied. A retried op id gets
/// its first outcome (refusals included) from the session table. Shared by
/// the Meta and Admin services.
///
/// Refused FAILED_PRECONDITION, before Raft, when the cluster version is
/// below the command's required format ([`Gate::command`]).
pub(crate) async fn propose<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    command: Command,
) -> Result<Applied, Status> {
    let cmd = gate.command(kv, command)?;
    match raft.client_write(cmd).await {
        Ok(resp) => match resp.data {
            Applied::Refused { code, message } => Err(status(code, message)),
            applied => Ok(applied),
        },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(forward(f)),
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            Err(status(ErrorCode::Internal, e.to_string()))
        }
        Err(RaftError::Fatal(f)) => Err(Status::unavailable(format!("raft is not running: {f}"))),
    }
}

/// Returns once this node is the leader and has applied everything
/// committed before the call; `NOT_LEADER` with the hint elsewhere.
pub(crate) async fn linearizable(raft: &MetaRaft) -> Result<(), Status> {
    match raft.ensure_linearizable().await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(forward(f)),
        Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
            Err(Status::unavailable(format!("leader lost its quorum: {e}")))
        }
        Err(RaftError::Fatal(f)) => Err(Status::unavailable(format!("raft is not running: {f}"))),
    }
}

impl<K: KvStore> MetaService<K> {
    /// Proposes `command` (see [`propose`]) if the session table has room
    /// for it ([`SessionGate`]).
    async fn write(&self, command: Command) -> Result<Applied, Status> {
        let _admitted = self
            .sessions
            .admit(self.kv.as_ref(), &self.raft, &command)?;
        propose(&self.raft, self.kv.as_ref(), &self.gate, command).await
    }

    /// Returns once this node is the leader and has applied everything
    /// committed before the call (see [`linearizable`]).
    async fn linearizable(&self) -> Result<(), Status> {
        linearizable(&self.raft).await
    }

    /// Refuses `DUPLICATE_DATANODE` when registering (addr, disk_id) as
    /// datanode `id` would take the id of another live process (see
    /// [`claims_live_id`]). Checked before Raft, on the leader's liveness;
    /// elsewhere the registry alone decides.
    /// (see [`speaks_for_itself`])
    fn refuse_duplicate(&self, id: u64, addr: &str, disk_id: &str) -> Result<(), Status> {
        if self.leader_only().is_err() {
            return Ok(());
        }
        let Some(recorded) = sm::get_datanode(self.kv.as_ref(), id).map_err(sm_status)? else {
            return Ok(());
        };
        if claims_live_id(&recorded, self.liveness.status(id).heard, addr, disk_id) {
            return Err(status(
                ErrorCode::DuplicateDatanode,
                format!(
                    "datanode {id} is live at {} with disk {}; refusing {addr} with disk {disk_id}",
                    recorded.addr, recorded.disk_id
                ),
            ));
        }
        Ok(())
    }

    /// `Ok` on the leader; `NOT_LEADER` with the hint elsewhere.
    fn leader_only(&self) -> Result<(), Status> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state == ServerState::Leader && m.current_leader == Some(self.node_id) {
            return Ok(());
        }
        let addr = m
            .current_leader
            .and_then(|id| m.membership_config.membership().get_node(&id))
            .map(|n| n.addr.clone());
        Err(not_leader(m.current_leader, addr))
    }
}

#[tonic::async_trait]
impl<K: KvStore> Meta for MetaService<K> {
    async fn create_bucket(
        &self,
        request: Request<pb::CreateBucketRequest>,
    ) -> Result<Response<pb::CreateBucketResponse>, Status> {
        match self
            .write(Command::CreateBucket(request.into_inner()))
            .await?
        {
            Applied::Created(created) => Ok(Response::new(pb::CreateBucketResponse { created })),
            other => Err(unexpected("CreateBucket", &other)),
        }
    }

    async fn get_bucket(
        &self,
        request: Request<pb::BucketRequest>,
    ) -> Result<Response<pb::GetBucketResponse>, Status> {
        self.linearizable().await?;
        let bucket =
            sm::get_bucket(self.kv.as_ref(), &request.get_ref().name).map_err(sm_status)?;
        Ok(Response::new(pb::GetBucketResponse {
            bucket: Some(bucket),
        }))
    }

    async fn delete_bucket(
        &self,
        request: Request<pb::BucketRequest>,
    ) -> Result<Response<pb::DeleteBucketResponse>, Status> {
        let applied = self
            .write(Command::DeleteBucket(request.into_inner()))
            .await?;
        done("DeleteBucket", &applied)?;
        Ok(Response::new(pb::DeleteBucketResponse {}))
    }

    async fn list_buckets(
        &self,
        _request: Request<pb::ListBucketsRequest>,
    ) -> Result<Response<pb::ListBucketsResponse>, Status> {
        self.linearizable().await?;
        let buckets = sm::list_buckets(self.kv.as_ref()).map_err(sm_status)?;
        Ok(Response::new(pb::ListBucketsResponse { buckets }))
    }

    async fn put_object(
        &self,
        request: Request<pb::PutObjectRequest>,
    ) -> Result<Response<pb::ReleasedResponse>, Status> {
        released(
            "PutObject",
            self.write(Command::PutObject(request.into_inner())).await?,
        )
    }

    async fn get_object(
        &self,
        request: Request<pb::ObjectKey>,
    ) -> Result<Response<pb::GetObjectResponse>, Status> {
        self.linearizable().await?;
        let r = request.get_ref();
        let object = sm::get_version_as(
            self.kv.as_ref(),
            &r.bucket,
            &r.key,
            &r.version_id,
            r.with_delete_marker,
            !r.head_only,
        )
        .map_err(sm_status)?;
        Ok(Response::new(pb::GetObjectResponse {
            object: Some(object),
        }))
    }

    async fn delete_object(
        &self,
        request: Request<pb::ObjectKey>,
    ) -> Result<Response<pb::ReleasedResponse>, Status> {
        released(
            "DeleteObject",
            self.write(Command::DeleteObject(request.into_inner()))
                .await?,
        )
    }

    async fn put_object_tagging(
        &self,
        request: Request<pb::PutObjectTaggingRequest>,
    ) -> Result<Response<pb::PutObjectTaggingResponse>, Status> {
        let applied = self
            .write(Command::PutObjectTagging(request.into_inner()))
            .await?;
        done("PutObjectTagging", &applied)?;
        Ok(Response::new(pb::PutObjectTaggingResponse {}))
    }

    async fn put_object_acl(
        &self,
        request: Request<pb::PutObjectAclRequest>,
    ) -> Result<Response<pb::PutObjectAclResponse>, Status> {
        let applied = self
            .write(Command::PutObjectAcl(request.into_inner()))
            .await?;
        done("PutObjectAcl", &applied)?;
        Ok(Response::new(pb::PutObjectAclResponse {}))
    }

    async fn put_bucket_config(
        &self,
        request: Request<pb::PutBucketConfigRequest>,
    ) -> Result<Response<pb::PutBucketConfigResponse>, Status> {
        let applied = self
            .write(Command::PutBucketConfig(request.into_inner()))
            .await?;
        done("PutBucketConfig", &applied)?;
        Ok(Response::new(pb::PutBucketConfigResponse {}))
    }

    async fn list_objects(
        &self,
        request: Request<pb::ListObjectsRequest>,
    ) -> Result<Response<pb::ListObjectsResponse>, Status> {
        self.linearizable().await?;
        let resp = sm::list_objects(self.kv.as_ref(), request.get_ref()).map_err(sm_status)?;
        Ok(Response::new(resp))
    }

    async fn list_versions(
        &self,
        request: Request<pb::ListVersionsRequest>,
    ) -> Result<Response<pb::ListVersionsResponse>, Status> {
        self.linearizable().await?;
        let resp = sm::list_versions(self.kv.as_ref(), request.get_ref()).map_err(sm_status)?;
        Ok(Response::new(resp))
    }

    async fn create_upload(
        &self,
        request: Request<pb::CreateUploadRequest>,
    ) -> Result<Response<pb::CreateUploadResponse>, Status> {
        let applied = self
            .write(Command::CreateUpload(request.into_inner()))
            .await?;
        done("CreateUpload", &applied)?;
        Ok(Response::new(pb::CreateUploadResponse {}))
    }

    async fn get_upload(
        &self,
        request: Request<pb::UploadKey>,
    ) -> Result<Response<pb::GetUploadResponse>, Status> {
        self.linearizable().await?;
        let r = request.get_ref();
        let upload =
            sm::get_upload(self.kv.as_ref(), &r.bucket, &r.key, &r.upload_id).map_err(sm_status)?;
        Ok(Response::new(pb::GetUploadResponse {
            upload: Some(upload),
        }))
    }

    async fn put_part(
        &self,
        request: Request<pb::PutPartRequest>,
    ) -> Result<Response<pb::ReleasedResponse>, Status> {
        released(
            "PutPart",
            self.write(Command::PutPart(request.into_inner())).await?,
        )
    }

    async fn list_parts(
        &self,
        request: Request<pb::ListPartsRequest>,
    ) -> Result<Response<pb::ListPartsResponse>, Status> {
        self.linearizable().await?;
        let resp = sm::list_parts(self.kv.as_ref(), request.get_ref()).map_err(sm_status)?;
        Ok(Response::new(resp))
    }

    async fn complete_upload(
        &self,
        request: Request<pb::CompleteUploadRequest>,
    ) -> Result<Response<pb::CompleteUploadResponse>, Status> {
        match self
            .write(Command::CompleteUpload(request.into_inner()))
            .await?
        {
            Applied::Completed(resp) => Ok(Response::new(*resp)),
            other => Err(unexpected("CompleteUpload", &other)),
        }
    }

    async fn abort_upload(
        &self,
        request: Request<pb::UploadKey>,
    ) -> Result<Response<pb::ReleasedResponse>, Status> {
        released(
            "AbortUpload",
            self.write(Command::AbortUpload(request.into_inner()))
                .await?,
        )
    }

    async fn list_uploads(
        &self,
        request: Request<pb::ListUploadsRequest>,
    ) -> Result<Response<pb::ListUploadsResponse>, Status> {
        self.linearizable().await?;
        let resp = sm::list_uploads(self.kv.as_ref(), request.get_ref()).map_err(sm_status)?;
        Ok(Response::new(resp))
    }

    async fn register_datanode(
        &self,
        request: Request<pb::RegisterDatanodeRequest>,
    ) -> Result<Response<pb::RegisterDatanodeResponse>, Status> {
        speaks_for_itself(&request, request.get_ref().id)?;
        let r = request.into_inner();
        let id = r.id;
        self.refuse_duplicate(id, &r.addr, &r.disk_id)?;
        let response = registered(self.write(Command::RegisterDatanode(r)).await?)?;
        // Registration is a sign of life.
        if self.leader_only().is_ok() {
            self.liveness.beat(id);
        }
        Ok(Response::new(response))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        speaks_for_itself(&request, request.get_ref().id)?;
        self.leader_only()?;
        let r = request.into_inner();
        let recorded = sm::get_datanode(self.kv.as_ref(), r.id).map_err(sm_status)?;
        let stale = match &recorded {
            None => true,
            Some(d) => {
                d.addr != r.addr
                    || (!r.disk_id.is_empty() && d.disk_id != r.disk_id)
                    || d.zone != r.zone
                    || d.host != r.host
            }
        };
        if stale {
            // Unknown datanode, a new address or a new disk: (re)register it
            // first, so the liveness map only ever holds registered ids and
            // a changed disk bumps its generation.
            self.refuse_duplicate(r.id, &r.addr, &r.disk_id)?;
            registered(
                self.write(Command::RegisterDatanode(pb::RegisterDatanodeRequest {
                    id: r.id,
                    addr: r.addr.clone(),
                    disk_id: r.disk_id.clone(),
                    op_id: String::new(),
                    zone: r.zone.clone(),
                    host: r.host.clone(),
                }))
                .await?,
            )?;
        }
        self.loads.datanode(r.id, &r);
        self.liveness.beat_with(
            r.id,
            Capacity {
                writable: r.writable,
                free_bytes: r.free_bytes,
                used_bytes: r.used_bytes,
            },
        );
        Ok(Response::new(pb::HeartbeatResponse {}))
    }

    async fn list_datanodes(
        &self,
        _request: Request<pb::ListDatanodesRequest>,
    ) -> Result<Response<pb::ListDatanodesResponse>, Status> {
        self.leader_only()?;
        let mut datanodes = sm::list_datanodes(self.kv.as_ref()).map_err(sm_status)?;
        for d in &mut datanodes {
            let s = self.liveness.status(d.id);
            d.live = s.live;
            d.last_heartbeat_ms = s.last_heartbeat_ms;
            d.silent_ms = u64::try_from(s.silent.as_millis()).unwrap_or(u64::MAX);
            d.writable = s.capacity.writable;
            d.free_bytes = s.capacity.free_bytes;
            d.used_bytes = s.capacity.used_bytes;
        }
        Ok(Response::new(pb::ListDatanodesResponse { datanodes }))
    }

    async fn filter_unreferenced(
        &self,
        request: Request<pb::FilterUnreferencedRequest>,
    ) -> Result<Response<pb::FilterUnreferencedResponse>, Status> {
        self.linearizable().await?;
        // Refuses more than MAX_FILTER_IDS ids with INVALID_ARGUMENT.
        let unreferenced = sm::filter_unreferenced(self.kv.as_ref(), &request.get_ref().blob_ids)
            .map_err(sm_status)?;
        Ok(Response::new(pb::FilterUnreferencedResponse {
            unreferenced,
        }))
    }

    async fn collectable(
        &self,
        request: Request<pb::CollectableRequest>,
    ) -> Result<Response<pb::CollectableResponse>, Status> {
        datanode_speaks_only_for_itself(&request, request.get_ref().node_id)?;
        self.linearizable().await?;
        let r = request.get_ref();
        // Refuses more than MAX_SHARDS_PER_CALL shards with INVALID_ARGUMENT.
        let collectable =
            sm::collectable(self.kv.as_ref(), r.node_id, &r.shards).map_err(sm_status)?;
        Ok(Response::new(pb::CollectableResponse { collectable }))
    }

    async fn open_epoch(
        &self,
        request: Request<pb::OpenEpochRequest>,
    ) -> Result<Response<pb::OpenEpochResponse>, Status> {
        // The lease granted is the replicated one: seed it first on a new
        // cluster, so the first gateway gets the configured lease. The
        // seed needs the cluster version of a fresh cluster recorded: do
        // it now rather than wait for the leader's version task (if a
        // member does not answer yet, the default lease is granted).
        if sm::cluster_version::recorded(self.kv.as_ref())
            .map_err(sm_status)?
            .is_none()
            && let Err(e) = self.versions.record_initial().await
        {
            tracing::debug!(reason = e.message(), "cluster version not recorded yet");
        }
        crate::admin::settings::ensure_initial(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            &self.initial_settings,
        )
        .await?;
        match self.write(Command::OpenEpoch(request.into_inner())).await? {
            Applied::Epoch(resp) => Ok(Response::new(resp)),
            other => Err(unexpected("OpenEpoch", &other)),
        }
    }

    async fn renew_epoch(
        &self,
        request: Request<pb::RenewEpochRequest>,
    ) -> Result<Response<pb::RenewEpochResponse>, Status> {
        let mut r = request.into_inner();
        // Load figures stay in leader memory, out of the Raft log.
        let report = sluice_meta_client::GatewayReport {
            rss_bytes: std::mem::take(&mut r.rss_bytes),
            memory_budget_bytes: std::mem::take(&mut r.memory_budget_bytes),
            requests_total: std::mem::take(&mut r.requests_total),
            slowdowns_total: std::mem::take(&mut r.slowdowns_total),
            workers: std::mem::take(&mut r.workers),
        };
        let epoch = r.epoch;
        let applied = self.write(Command::RenewEpoch(r)).await?;
        done("RenewEpoch", &applied)?;
        if report != sluice_meta_client::GatewayReport::default() {
            self.loads.gateway(epoch, report);
        }
        Ok(Response::new(pb::RenewEpochResponse {}))
    }

    async fn list_placements(
        &self,
        request: Request<pb::ListPlacementsRequest>,
    ) -> Result<Response<pb::ListPlacementsResponse>, Status> {
        self.linearizable().await?;
        let resp = sm::list_placements(self.kv.as_ref(), request.get_ref()).map_err(sm_status)?;
        Ok(Response::new(resp))
    }

    async fn report_missing(
        &self,
        request: Request<pb::ReportMissingRequest>,
    ) -> Result<Response<pb::ReportMissingResponse>, Status> {
        datanode_speaks_only_for_itself(&request, request.get_ref().node_id)?;
        match self
            .write(Command::ReportMissing(request.into_inner()))
            .await?
        {
            Applied::Marked(marked) => Ok(Response::new(pb::ReportMissingResponse { marked })),
            other => Err(unexpected("ReportMissing", &other)),
        }
    }

    async fn report_present(
        &self,
        request: Request<pb::ReportPresentRequest>,
    ) -> Result<Response<pb::ReportPresentResponse>, Status> {
        // The policy admits gateways only; should it ever admit datanodes,
        // one still speaks only for its own shards.
        datanode_speaks_only_for_itself(&request, request.get_ref().node_id)?;
        match self
            .write(Command::ReportPresent(request.into_inner()))
            .await?
        {
            Applied::Unmarked(unmarked) => {
                Ok(Response::new(pb::ReportPresentResponse { unmarked }))
            }
            other => Err(unexpected("ReportPresent", &other)),
        }
    }

    async fn begin_heal(
        &self,
        request: Request<pb::BeginHealRequest>,
    ) -> Result<Response<pb::BeginHealResponse>, Status> {
        let applied = self.write(Command::BeginHeal(request.into_inner())).await?;
        done("BeginHeal", &applied)?;
        Ok(Response::new(pb::BeginHealResponse {}))
    }

    async fn update_placement(
        &self,
        request: Request<pb::UpdatePlacementRequest>,
    ) -> Result<Response<pb::UpdatePlacementResponse>, Status> {
        let applied = self
            .write(Command::UpdatePlacement(request.into_inner()))
            .await?;
        done("UpdatePlacement", &applied)?;
        Ok(Response::new(pb::UpdatePlacementResponse {}))
    }

    async fn lease_blobs(
        &self,
        request: Request<pb::LeaseBlobsRequest>,
    ) -> Result<Response<pb::LeaseBlobsResponse>, Status> {
        match self
            .write(Command::LeaseBlobs(request.into_inner()))
            .await?
        {
            Applied::Leased(lost) => Ok(Response::new(pb::LeaseBlobsResponse { lost })),
            other => Err(unexpected("LeaseBlobs", &other)),
        }
    }

    async fn release_blobs(
        &self,
        request: Request<pb::ReleaseBlobsRequest>,
    ) -> Result<Response<pb::ReleaseBlobsResponse>, Status> {
        let applied = self
            .write(Command::ReleaseBlobs(request.into_inner()))
            .await?;
        done("ReleaseBlobs", &applied)?;
        Ok(Response::new(pb::ReleaseBlobsResponse {}))
    }

    async fn cluster_status(
        &self,
        _request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        Ok(Response::new(pb::ClusterStatusResponse {
            node_id: self.node_id,
            leader_id: m.current_leader,
            leader_addr: m
                .current_leader
                .and_then(|id| membership.get_node(&id))
                .map(|n| n.addr.clone()),
            term: m.current_term,
            last_applied_index: m.last_applied.map_or(0, |l| l.index),
            voters: membership.voter_ids().collect(),
            purged_index: m.purged.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
        }))
    }

    /// s3auth: the gateway's lookup of an access key (secret and grants).
    async fn get_access_key(
        &self,
        request: Request<pb::GetAccessKeyRequest>,
    ) -> Result<Response<pb::GetAccessKeyResponse>, Status> {
        self.linearizable().await?;
        let key = sm::access::require_access_key(self.kv.as_ref(), &request.get_ref().id)
            .map_err(sm_status)?;
        Ok(Response::new(pb::GetAccessKeyResponse { key: Some(key) }))
    }
}

/// Under mutual TLS a datanode registers and heartbeats only as itself:
/// the caller's certificate must be `spiffe://sluice/datanode/<id>` for
/// the request's `id` (the role is already checked by the policy layer).
/// In insecure mode there is no identity and the call passes.
/// A datanode's certificate speaks only for its own node id in any call
/// that names a node (`ReportMissing`, `ReportPresent`, `Collectable`): one compromised
/// datanode must not mark another node's shards missing or ask which of
/// them are garbage. Callers of other roles the policy admits (a gateway's
/// heal audit reports any node's shards) pass.
fn datanode_speaks_only_for_itself<T>(request: &Request<T>, id: u64) -> Result<(), Status> {
    match sluice_net::caller(request) {
        Some(c) if c.role == sluice_net::Role::Datanode => speaks_for_itself(request, id),
        _ => Ok(()),
    }
}

fn speaks_for_itself<T>(request: &Request<T>, id: u64) -> Result<(), Status> {
    match sluice_net::caller(request) {
        None => Ok(()),
        Some(c) if c.role == sluice_net::Role::Datanode && c.numeric_id() == Some(id) => Ok(()),
        Some(c) => Err(Status::permission_denied(format!(
            "{c} may not speak for datanode {id}"
        ))),
    }
}
