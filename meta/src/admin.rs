//! The `sluice.admin.Admin` gRPC service: what `sluice admin` asks of the
//! meta cluster (see `proto/proto/admin.proto`).
//!
//! The trait impl stays thin: each area's logic lives in its own module.
//! Like [`crate::api`], calls that change or read replicated state run on
//! the leader, and a follower answers with `NOT_LEADER` and the leader hint.

use std::sync::Arc;

use sluice_proto::admin::admin_server::Admin;

use crate::liveness::Liveness;
use crate::raft::MetaRaft;
use crate::store::KvStore;

/// Shared handles the admin handlers need.
pub(crate) struct AdminService<K: KvStore> {
    #[allow(dead_code)]
    pub(crate) node_id: u64,
    #[allow(dead_code)]
    pub(crate) raft: MetaRaft,
    #[allow(dead_code)]
    pub(crate) kv: Arc<K>,
    #[allow(dead_code)]
    pub(crate) liveness: Arc<Liveness>,
}

#[tonic::async_trait]
impl<K: KvStore + 'static> Admin for AdminService<K> {}
