//! The `sluice.admin.Admin` gRPC service: what `sluice admin` asks of the
//! meta cluster (see `proto/proto/admin.proto`).
//!
//! The trait impl stays thin: each area's logic lives in its own module.
//! Like [`crate::api`], calls that change or read replicated state run on
//! the leader, and a follower answers with `NOT_LEADER` and the leader hint.
//!
//! # Layout
//! * [`members`] — meta voters: add, remove, replace, list.
//! * [`datanodes`] — list, drain and remove datanodes.
//! * `version` and `version finalize`: [`crate::version::Versions`].
//! * [`settings`] — replicated cluster settings and the state digest.

mod datanodes;
pub(crate) mod members;

mod keys;
pub(crate) mod settings;
pub(crate) mod status;

use std::sync::Arc;
use std::time::Duration;

use sluice_proto::admin as apb;
use sluice_proto::admin::admin_server::Admin;
use sluice_proto::admin::{StatusRequest, StatusResponse};
use tonic::{Request, Response, Status};

use crate::liveness::Liveness;
use crate::raft::{MetaRaft, StateDigester};
use crate::store::KvStore;
use crate::version::{Gate, Versions};

/// Shared handles the admin handlers need.
pub(crate) struct AdminService<K: KvStore> {
    #[allow(dead_code)]
    pub(crate) node_id: u64,
    pub(crate) raft: MetaRaft,
    pub(crate) kv: Arc<K>,
    pub(crate) liveness: Arc<Liveness>,
    /// Meta membership changes (one at a time per node).
    pub(crate) members: Arc<members::Members>,
    /// Loads reported by datanodes and gateways (`status`).
    pub(crate) loads: Arc<status::Loads>,
    /// This node's memory budgets (the sled cache), for `status`.
    pub(crate) memory_budget: u64,
    /// How this node dials other meta nodes (`status` asks each voter).
    pub(crate) transport: sluice_net::Transport,
    /// This node's background workers (`status` lists them).
    pub(crate) workers: sluice_util::worker::Workers,
    /// The cluster version gate of this node's proposals.
    pub(crate) gate: Arc<Gate>,
    /// `version` and `version finalize`.
    pub(crate) versions: Versions<K>,
    /// Computes this node's state digest between applies.
    pub(crate) digester: StateDigester<K>,
    /// The longest epoch lease this node's session config allows
    /// (checked when it sets the settings as leader).
    pub(crate) lease_limit: settings::LeaseLimit,
}

fn catch_up(ms: Option<u64>) -> Option<Duration> {
    ms.map(Duration::from_millis)
}

#[tonic::async_trait]
impl<K: KvStore + 'static> Admin for AdminService<K> {
    // ---- s3auth
    async fn create_key(
        &self,
        request: Request<apb::CreateKeyRequest>,
    ) -> Result<Response<apb::CreateKeyResponse>, Status> {
        keys::create_key(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            request.into_inner(),
        )
        .await
        .map(Response::new)
    }

    async fn list_keys(
        &self,
        _request: Request<apb::ListKeysRequest>,
    ) -> Result<Response<apb::ListKeysResponse>, Status> {
        keys::list_keys(&self.raft, self.kv.as_ref())
            .await
            .map(Response::new)
    }

    async fn delete_key(
        &self,
        request: Request<apb::DeleteKeyRequest>,
    ) -> Result<Response<apb::DeleteKeyResponse>, Status> {
        keys::delete_key(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            request.into_inner(),
        )
        .await
        .map(Response::new)
    }

    async fn allow_key(
        &self,
        request: Request<apb::KeyGrantRequest>,
    ) -> Result<Response<apb::KeyGrantResponse>, Status> {
        keys::set_grant(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            request.into_inner(),
            true,
        )
        .await
        .map(Response::new)
    }

    async fn deny_key(
        &self,
        request: Request<apb::KeyGrantRequest>,
    ) -> Result<Response<apb::KeyGrantResponse>, Status> {
        keys::set_grant(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            request.into_inner(),
            false,
        )
        .await
        .map(Response::new)
    }

    // ---- metamembers
    async fn add_voter(
        &self,
        request: Request<apb::AddVoterRequest>,
    ) -> Result<Response<apb::MembershipResponse>, Status> {
        let r = request.into_inner();
        let out = self
            .members
            .add_voter(r.id, r.addr, catch_up(r.catch_up_timeout_ms))
            .await?;
        Ok(Response::new(out))
    }

    async fn remove_voter(
        &self,
        request: Request<apb::RemoveVoterRequest>,
    ) -> Result<Response<apb::MembershipResponse>, Status> {
        let out = self.members.remove_voter(request.into_inner().id).await?;
        Ok(Response::new(out))
    }

    async fn replace_voter(
        &self,
        request: Request<apb::ReplaceVoterRequest>,
    ) -> Result<Response<apb::MembershipResponse>, Status> {
        let r = request.into_inner();
        let out = self
            .members
            .replace_voter(
                r.old_id,
                r.new_id,
                r.new_addr,
                catch_up(r.catch_up_timeout_ms),
            )
            .await?;
        Ok(Response::new(out))
    }

    async fn list_members(
        &self,
        _request: Request<apb::ListMembersRequest>,
    ) -> Result<Response<apb::ListMembersResponse>, Status> {
        Ok(Response::new(self.members.list().await?))
    }

    // ---- datanodes
    async fn list_datanodes(
        &self,
        _request: Request<apb::ListDatanodesRequest>,
    ) -> Result<Response<apb::ListDatanodesResponse>, Status> {
        Ok(Response::new(self.list_datanodes_admin().await?))
    }

    async fn drain_datanode(
        &self,
        request: Request<apb::DrainDatanodeRequest>,
    ) -> Result<Response<apb::DrainDatanodeResponse>, Status> {
        Ok(Response::new(
            self.drain_datanode_admin(request.into_inner()).await?,
        ))
    }

    async fn remove_datanode(
        &self,
        request: Request<apb::RemoveDatanodeRequest>,
    ) -> Result<Response<apb::RemoveDatanodeResponse>, Status> {
        Ok(Response::new(
            self.remove_datanode_admin(request.into_inner()).await?,
        ))
    }

    // ---- ops
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, tonic::Status> {
        status::status(status::StatusSources {
            node_id: self.node_id,
            raft: &self.raft,
            kv: self.kv.as_ref(),
            liveness: &self.liveness,
            loads: &self.loads,
            memory_budget: self.memory_budget,
            transport: &self.transport,
            workers: &self.workers,
        })
        .await
        .map(Response::new)
    }

    // ---- version
    async fn show_version(
        &self,
        _request: Request<apb::ShowVersionRequest>,
    ) -> Result<Response<apb::VersionResponse>, Status> {
        self.versions.show().await.map(Response::new)
    }

    async fn finalize_version(
        &self,
        _request: Request<apb::FinalizeVersionRequest>,
    ) -> Result<Response<apb::VersionResponse>, Status> {
        self.versions.finalize().await.map(Response::new)
    }

    // ---- cluster settings
    async fn get_cluster_settings(
        &self,
        _request: Request<apb::GetClusterSettingsRequest>,
    ) -> Result<Response<apb::ClusterSettingsResponse>, Status> {
        settings::get_settings(&self.raft, self.kv.as_ref())
            .await
            .map(Response::new)
    }

    async fn set_cluster_settings(
        &self,
        request: Request<apb::SetClusterSettingsRequest>,
    ) -> Result<Response<apb::ClusterSettingsResponse>, Status> {
        settings::set_settings(
            &self.raft,
            self.kv.as_ref(),
            &self.gate,
            self.lease_limit,
            request.into_inner(),
        )
        .await
        .map(Response::new)
    }

    async fn state_digest(
        &self,
        _request: Request<apb::StateDigestRequest>,
    ) -> Result<Response<apb::StateDigestResponse>, Status> {
        settings::state_digest(self.node_id, &self.digester)
            .await
            .map(Response::new)
    }
}
