//! A fake datanode for the reclaimer's tests: it answers DeleteBlobs only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use sluice_proto::datanode::datanode_server::{Datanode, DatanodeServer};
use sluice_proto::datanode::*;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// A datanode that only answers DeleteBlobs: records the ids and when,
/// and fails the first `fail_first` calls with UNAVAILABLE.
#[derive(Default)]
pub struct FakeDatanode {
    pub deleted: Mutex<Vec<(Instant, String)>>,
    pub calls: AtomicUsize,
    pub fail_first: usize,
}

/// The gRPC face of a [`FakeDatanode`].
pub struct FakeServer(Arc<FakeDatanode>);

impl std::ops::Deref for FakeServer {
    type Target = FakeDatanode;
    fn deref(&self) -> &FakeDatanode {
        &self.0
    }
}

#[tonic::async_trait]
impl Datanode for FakeServer {
    async fn put_shard(
        &self,
        _r: Request<Streaming<PutShardRequest>>,
    ) -> Result<Response<PutShardResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type GetShardStream = ReceiverStream<Result<GetShardResponse, Status>>;
    async fn get_shard(
        &self,
        _r: Request<GetShardRequest>,
    ) -> Result<Response<Self::GetShardStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_blobs(
        &self,
        r: Request<DeleteBlobsRequest>,
    ) -> Result<Response<DeleteBlobsResponse>, Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            return Err(Status::unavailable("fake datanode is down"));
        }
        let ids = r.into_inner().blob_ids;
        let n = ids.len() as u64;
        let now = Instant::now();
        self.deleted
            .lock()
            .unwrap()
            .extend(ids.into_iter().map(|id| (now, id)));
        Ok(Response::new(DeleteBlobsResponse { shards_deleted: n }))
    }
    async fn list_shards(
        &self,
        _r: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn node_status(
        &self,
        _r: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn has_shards(
        &self,
        _r: Request<HasShardsRequest>,
    ) -> Result<Response<HasShardsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn verify_shards(
        &self,
        _r: Request<VerifyShardsRequest>,
    ) -> Result<Response<VerifyShardsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type CreditsStream = ReceiverStream<Result<CreditGrant, Status>>;
    async fn credits(
        &self,
        _r: Request<CreditStreamRequest>,
    ) -> Result<Response<Self::CreditsStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn report_credits(
        &self,
        _r: Request<CreditReport>,
    ) -> Result<Response<CreditReportResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

pub async fn serve_fake(fake: Arc<FakeDatanode>) -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DatanodeServer::new(FakeServer(fake)))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    Ok((addr, task))
}

impl FakeDatanode {
    /// Blob ids deleted so far (repeats counted).
    pub fn deleted_count(&self) -> usize {
        self.deleted.lock().unwrap().len()
    }
}
