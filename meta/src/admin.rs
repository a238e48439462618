//! The `sluice.admin.Admin` gRPC service: what `sluice admin` asks of the
//! meta cluster (see `proto/proto/admin.proto`).
//!
//! The trait impl stays thin: each area's logic lives in its own module.
//! Like [`crate::api`], calls that change or read replicated state run on
//! the leader, and a follower answers with `NOT_LEADER` and the leader hint.
//!
//! # Layout
//! * [`datanodes`] — list, drain and remove datanodes.

mod datanodes;

use std::sync::Arc;

use sluice_proto::admin as apb;
use sluice_proto::admin::admin_server::Admin;
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
    pub(crate) liveness: Arc<Liveness>,
}

#[tonic::async_trait]
impl<K: KvStore + 'static> Admin for AdminService<K> {
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
}
