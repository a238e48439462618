//! Raft RPCs to peers over tonic: [`Network`] is openraft's
//! `RaftNetworkFactory`; each replication stream gets a [`PeerClient`] with
//! one lazily connected HTTP/2 channel.
//!
//! Bounds: every RPC is cut off at openraft's `hard_ttl` (derived from the
//! heartbeat and election timeouts); an AppendEntries carries at most
//! `max_payload_entries` entries and a snapshot chunk at most
//! `snapshot_max_chunk_size` bytes; messages are capped at
//! [`MAX_MESSAGE_BYTES`].

// openraft's StorageError / RPCError are what its traits return; helpers
// return them unboxed too rather than box and unbox at every call.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RPCTypes};
use sluice_proto::raft as rpb;
use sluice_proto::raft::raft_client::RaftClient;
use tonic::transport::Channel;

use super::TypeConfig;
use super::convert::{FromPb, ToPb};

/// Largest gRPC message between meta nodes, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Creates [`PeerClient`]s for openraft.
#[derive(Debug, Clone)]
pub struct Network {
    /// This node's id (reported in timeouts).
    pub node_id: u64,
    /// TCP connect timeout to a peer.
    pub connect_timeout: Duration,
    /// How peers are dialed (mutual TLS, or plaintext).
    pub transport: sluice_net::Transport,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            node_id: self.node_id,
            target,
            addr: node.addr.clone(),
            connect_timeout: self.connect_timeout,
            transport: self.transport.clone(),
            client: None,
        }
    }
}

/// The Raft RPC client to one peer.
pub struct PeerClient {
    node_id: u64,
    target: u64,
    addr: String,
    connect_timeout: Duration,
    transport: sluice_net::Transport,
    client: Option<RaftClient<Channel>>,
}

type RpcErr<E> = RPCError<u64, BasicNode, E>;

/// A peer refused a message it could not decode, or the transport failed.
#[derive(Debug, thiserror::Error)]
#[error("raft rpc to {addr}: {status}")]
struct TransportError {
    addr: String,
    status: tonic::Status,
}

/// The peer answered without a result.
#[derive(Debug, thiserror::Error)]
#[error("raft rpc to {addr}: {source}")]
struct BadResponse {
    addr: String,
    #[source]
    source: super::convert::ConvertError,
}

impl PeerClient {
    fn client<E: std::error::Error>(&mut self) -> Result<RaftClient<Channel>, RpcErr<E>> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let endpoint = self
            .transport
            .endpoint(&self.addr, sluice_net::Role::Meta)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let client = RaftClient::new(self.transport.dial(endpoint))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.client = Some(client.clone());
        Ok(client)
    }

    fn timeout<E: std::error::Error>(&self, action: RPCTypes, ttl: Duration) -> RpcErr<E> {
        RPCError::Timeout(Timeout {
            action,
            id: self.node_id,
            target: self.target,
            timeout: ttl,
        })
    }

    fn status<E: std::error::Error>(&self, status: tonic::Status) -> RpcErr<E> {
        let unreachable = matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown
        );
        let err = TransportError {
            addr: self.addr.clone(),
            status,
        };
        if unreachable {
            RPCError::Unreachable(Unreachable::new(&err))
        } else {
            RPCError::Network(NetworkError::new(&err))
        }
    }

    fn bad_response<E: std::error::Error>(
        &self,
        source: super::convert::ConvertError,
    ) -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&BadResponse {
            addr: self.addr.clone(),
            source,
        }))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr<RaftError<u64>>> {
        let mut client = self.client()?;
        let ttl = option.hard_ttl();
        let resp = match tokio::time::timeout(ttl, client.append_entries(rpc.to_pb())).await {
            Err(_) => return Err(self.timeout(RPCTypes::AppendEntries, ttl)),
            Ok(Err(status)) => return Err(self.status(status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        AppendEntriesResponse::from_pb(resp).map_err(|e| self.bad_response(e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<RaftError<u64, InstallSnapshotError>>> {
        let mut client = self.client()?;
        let ttl = option.hard_ttl();
        let resp = match tokio::time::timeout(ttl, client.install_snapshot(rpc.to_pb())).await {
            Err(_) => return Err(self.timeout(RPCTypes::InstallSnapshot, ttl)),
            Ok(Err(status)) => return Err(self.status(status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        use rpb::install_snapshot_response::Result as R;
        match resp.result {
            Some(R::Vote(v)) => {
                let vote = openraft::Vote::from_pb(v).map_err(|e| self.bad_response(e))?;
                Ok(InstallSnapshotResponse { vote })
            }
            Some(R::Mismatch(m)) => {
                let mismatch = openraft::error::SnapshotMismatch::from_pb(m)
                    .map_err(|e| self.bad_response(e))?;
                Err(RPCError::RemoteError(RemoteError::new(
                    self.target,
                    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch)),
                )))
            }
            None => Err(self.bad_response(super::convert::ConvertError {
                message: "InstallSnapshotResponse",
                field: "result",
            })),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr<RaftError<u64>>> {
        let mut client = self.client()?;
        let ttl = option.hard_ttl();
        let resp = match tokio::time::timeout(ttl, client.vote(rpc.to_pb())).await {
            Err(_) => return Err(self.timeout(RPCTypes::Vote, ttl)),
            Ok(Err(status)) => return Err(self.status(status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        VoteResponse::from_pb(resp).map_err(|e| self.bad_response(e))
    }
}

/// Maps a local Raft failure to the status a peer sees (it backs off).
pub(crate) fn fatal_status(f: &Fatal<u64>) -> tonic::Status {
    tonic::Status::unavailable(format!("raft is not running: {f}"))
}
