//! The `sluice.raft.Raft` gRPC service: decodes a peer's RPC, hands it to
//! the local Raft, encodes the answer.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use std::sync::Arc;

use sluice_proto::raft as rpb;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::MetaRaft;
use super::convert::{FromPb, ToPb};
use super::network::fatal_status;

/// Serves Raft RPCs from peers.
#[derive(Clone)]
pub struct RaftService {
    raft: MetaRaft,
    /// One AppendEntries that carries entries is handed to Raft at a time.
    /// openraft 0.9's leader gives each AppendEntries `heartbeat_interval`
    /// (250 ms) and then sends the same entries again, while the one it gave
    /// up on stays queued in the follower's Raft core (an unbounded
    /// channel) and is appended anyway: a follower slower than that (a new
    /// voter catching up, loading a snapshot) queued resend after resend,
    /// each up to `max_payload_entries` records (64 × ~100 KB), and grew
    /// without bound. A call waiting here is dropped with its payload when the
    /// leader gives up on it (its stream is reset), before Raft sees it, so
    /// at most one payload is in Raft and the waiting ones last 250 ms.
    /// Heartbeats (no entries) pass without waiting.
    appending: Arc<Semaphore>,
    /// This node's `NodeVersion` answer (read from its store each call).
    version: NodeVersionFn,
}

/// Answers `NodeVersion`: this node's formats and applied cluster version,
/// or why they cannot be read.
pub type NodeVersionFn =
    Arc<dyn Fn() -> Result<rpb::NodeVersionResponse, String> + Send + Sync + 'static>;

impl RaftService {
    /// Serves RPCs for `raft`; `version` answers `NodeVersion`.
    pub fn new(raft: MetaRaft, version: NodeVersionFn) -> Self {
        RaftService {
            raft,
            appending: Arc::new(Semaphore::new(1)),
            version,
        }
    }
}

fn bad_request(e: super::convert::ConvertError) -> Status {
    Status::invalid_argument(e.to_string())
}

fn raft_status<E: std::error::Error>(e: RaftError<u64, E>) -> Status {
    match e {
        RaftError::Fatal(f) => fatal_status(&f),
        RaftError::APIError(api) => Status::internal(api.to_string()),
    }
}

#[tonic::async_trait]
impl rpb::raft_server::Raft for RaftService {
    async fn vote(
        &self,
        request: Request<rpb::VoteRequest>,
    ) -> Result<Response<rpb::VoteResponse>, Status> {
        let rpc = VoteRequest::from_pb(request.into_inner()).map_err(bad_request)?;
        let resp = self.raft.vote(rpc).await.map_err(raft_status)?;
        Ok(Response::new(resp.to_pb()))
    }

    async fn append_entries(
        &self,
        request: Request<rpb::AppendEntriesRequest>,
    ) -> Result<Response<rpb::AppendEntriesResponse>, Status> {
        let rpc = AppendEntriesRequest::from_pb(request.into_inner()).map_err(bad_request)?;
        let _permit = if rpc.entries.is_empty() {
            None
        } else {
            Some(
                self.appending
                    .acquire()
                    .await
                    .map_err(|_| Status::unavailable("shutting down"))?,
            )
        };
        let resp = self.raft.append_entries(rpc).await.map_err(raft_status)?;
        Ok(Response::new(resp.to_pb()))
    }

    async fn install_snapshot(
        &self,
        request: Request<rpb::InstallSnapshotRequest>,
    ) -> Result<Response<rpb::InstallSnapshotResponse>, Status> {
        let rpc = InstallSnapshotRequest::from_pb(request.into_inner()).map_err(bad_request)?;
        match self.raft.install_snapshot(rpc).await {
            Ok(resp) => Ok(Response::new(resp.to_pb())),
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) => {
                Ok(Response::new(rpb::InstallSnapshotResponse {
                    result: Some(rpb::install_snapshot_response::Result::Mismatch(m.to_pb())),
                }))
            }
            Err(RaftError::Fatal(f)) => Err(fatal_status(&f)),
        }
    }

    /// Answered even when this node's Raft stopped (apply blocked), so
    /// the leader can name it.
    async fn node_version(
        &self,
        _request: Request<rpb::NodeVersionRequest>,
    ) -> Result<Response<rpb::NodeVersionResponse>, Status> {
        (self.version)()
            .map(Response::new)
            .map_err(Status::internal)
    }
}
