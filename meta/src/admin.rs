//! The `sluice.admin.Admin` gRPC service: what `sluice admin` asks of the
//! meta cluster (see `proto/proto/admin.proto`).
//!
//! The trait impl stays thin: each area's logic lives in its own module.
//! Like [`crate::api`], calls that change or read replicated state run on
//! the leader, and a follower answers with `NOT_LEADER` and the leader hint.

mod keys;

use std::sync::Arc;

use sluice_proto::admin::{self as apb, admin_server::Admin};
use tonic::{Request, Response, Status};

use crate::liveness::Liveness;
use crate::raft::MetaRaft;
use crate::store::KvStore;

/// Shared handles the admin handlers need.
pub(crate) struct AdminService<K: KvStore> {
    #[allow(dead_code)]
    pub(crate) node_id: u64,
    pub(crate) raft: MetaRaft,
    pub(crate) kv: Arc<K>,
    #[allow(dead_code)]
    pub(crate) liveness: Arc<Liveness>,
}

#[tonic::async_trait]
impl<K: KvStore + 'static> Admin for AdminService<K> {
    // ---- s3auth
    async fn create_key(
        &self,
        request: Request<apb::CreateKeyRequest>,
    ) -> Result<Response<apb::CreateKeyResponse>, Status> {
        keys::create_key(&self.raft, self.kv.as_ref(), request.into_inner())
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
        keys::delete_key(&self.raft, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn allow_key(
        &self,
        request: Request<apb::KeyGrantRequest>,
    ) -> Result<Response<apb::KeyGrantResponse>, Status> {
        keys::set_grant(&self.raft, self.kv.as_ref(), request.into_inner(), true)
            .await
            .map(Response::new)
    }

    async fn deny_key(
        &self,
        request: Request<apb::KeyGrantRequest>,
    ) -> Result<Response<apb::KeyGrantResponse>, Status> {
        keys::set_grant(&self.raft, self.kv.as_ref(), request.into_inner(), false)
            .await
            .map(Response::new)
    }
}
