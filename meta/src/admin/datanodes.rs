//! Admin RPCs of the datanodes area: ListDatanodes, DrainDatanode and
//! RemoveDatanode (see the `// ---- datanodes` block of
//! `proto/admin.proto` and the rules in [`crate::sm::registry`]).
//!
//! All run on the leader: the list and the "still heard from" check need
//! the leader's liveness, and the mutations go through Raft with the
//! caller's op id (a retry gets the first outcome).

use openraft::BasicNode;
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use sluice_proto::admin as apb;
use sluice_proto::error::{not_leader, status};
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft::meta_command::Command;
use tonic::Status;

use super::AdminService;
use crate::sm::{self, Applied, SmError};
use crate::store::KvStore;

fn forward(f: ForwardToLeader<u64, BasicNode>) -> Status {
    not_leader(f.leader_id, f.leader_node.map(|n| n.addr))
}

fn sm_status(e: SmError) -> Status {
    match e {
        SmError::Refused { code, message } => status(code, message),
        other => status(ErrorCode::Internal, other.to_string()),
    }
}

impl<K: KvStore> AdminService<K> {
    /// Proposes `command` stamped with this leader's clock and waits for
    /// it to be applied; a refusal becomes its status, a command the
    /// cluster version does not admit FAILED_PRECONDITION.
    async fn propose(&self, command: Command) -> Result<Applied, Status> {
        let cmd = self.gate.command(self.kv.as_ref(), command)?;
        match self.raft.client_write(cmd).await {
            Ok(resp) => match resp.data {
                Applied::Refused { code, message } => Err(status(code, message)),
                applied => Ok(applied),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(forward(f)),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(status(ErrorCode::Internal, e.to_string()))
            }
            Err(RaftError::Fatal(f)) => {
                Err(Status::unavailable(format!("raft is not running: {f}")))
            }
        }
    }

    /// Returns once this node is the leader and has applied everything
    /// committed before the call.
    async fn linearizable(&self) -> Result<(), Status> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(forward(f)),
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(Status::unavailable(format!("leader lost its quorum: {e}")))
            }
            Err(RaftError::Fatal(f)) => {
                Err(Status::unavailable(format!("raft is not running: {f}")))
            }
        }
    }

    /// ListDatanodes: the registry with the leader's liveness and capacity,
    /// and per node the shards committed placements put on it.
    pub(crate) async fn list_datanodes_admin(&self) -> Result<apb::ListDatanodesResponse, Status> {
        self.linearizable().await?;
        let kv = self.kv.as_ref();
        let mut infos = sm::list_datanodes(kv).map_err(sm_status)?;
        let ids: Vec<u64> = infos.iter().map(|d| d.id).collect();
        let placed = sm::registry::placed_shards(kv, &ids).map_err(sm_status)?;
        let mut out = Vec::with_capacity(infos.len());
        for mut d in infos.drain(..) {
            let s = self.liveness.status(d.id);
            d.live = s.live;
            d.last_heartbeat_ms = s.last_heartbeat_ms;
            d.writable = s.capacity.writable;
            d.free_bytes = s.capacity.free_bytes;
            d.used_bytes = s.capacity.used_bytes;
            let placed_shards = placed.get(&d.id).copied().unwrap_or(0);
            out.push(apb::DatanodeStatus {
                drained: d.draining && placed_shards == 0,
                placed_shards,
                info: Some(d),
            });
        }
        Ok(apb::ListDatanodesResponse { datanodes: out })
    }

    /// DrainDatanode: sets the replicated `draining` mark.
    pub(crate) async fn drain_datanode_admin(
        &self,
        r: apb::DrainDatanodeRequest,
    ) -> Result<apb::DrainDatanodeResponse, Status> {
        let id = r.id;
        match self.propose(Command::DrainDatanode(r)).await? {
            Applied::Done => {}
            other => {
                return Err(status(
                    ErrorCode::Internal,
                    format!("DrainDatanode applied as {other:?}"),
                ));
            }
        }
        let placed = sm::registry::placed_shards(self.kv.as_ref(), &[id]).map_err(sm_status)?;
        Ok(apb::DrainDatanodeResponse {
            placed_shards: placed.get(&id).copied().unwrap_or(0),
        })
    }

    /// RemoveDatanode: refused while the node is still heard from (a
    /// running node re-registers with its next heartbeat), then the
    /// registry rule of [`sm::registry`].
    pub(crate) async fn remove_datanode_admin(
        &self,
        r: apb::RemoveDatanodeRequest,
    ) -> Result<apb::RemoveDatanodeResponse, Status> {
        self.linearizable().await?;
        let id = r.id;
        if self.liveness.status(id).heard {
            return Err(status(
                ErrorCode::DatanodeInUse,
                format!("datanode {id} is still running (heartbeats): stop it first"),
            ));
        }
        let marked = match self.propose(Command::RemoveDatanode(r)).await? {
            Applied::Marked(n) => n,
            other => {
                return Err(status(
                    ErrorCode::Internal,
                    format!("RemoveDatanode applied as {other:?}"),
                ));
            }
        };
        self.liveness.forget(id);
        Ok(apb::RemoveDatanodeResponse {
            marked_missing: u64::from(marked),
        })
    }
}
