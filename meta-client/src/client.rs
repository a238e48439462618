//! [`MetaClient`]: the gateway's and datanode's handle on the meta cluster.
//!
//! It follows leader changes: a `NOT_LEADER` answer with a leader hint sends
//! the call to the hinted node, an unreachable node sends it to the next
//! configured one, and every call is retried with backoff until
//! `retry_deadline` has passed.
//!
//! Every mutation carries an operation id ([`new_op_id`]) chosen once per
//! method call and sent unchanged by every retry, so a retry after an
//! ambiguous failure (a lost response, a timeout) is applied at most once by
//! the state machine and answered with the first outcome. No attempt is sent
//! once `retry_deadline` has passed since the call began.
//!
//! [`CallFaults`] is the fault-injection seam on the transport: tests drop
//! responses with it to exercise the retry path.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::meta::meta_client::MetaClient as RpcClient;
use sluice_proto::meta::{self as pb, ErrorCode};
use tonic::transport::Channel;

/// What a meta call can fail with, in terms a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The state machine refused the call for an S3-level reason
    /// (`NoSuchBucket`, `InvalidPart`, ...).
    #[error("{code:?}: {message}")]
    Refused { code: ErrorCode, message: String },
    /// No leader answered within the retry deadline.
    #[error("meta cluster unavailable: {0}")]
    Unavailable(String),
    /// Meta refused this caller: no valid cluster certificate
    /// (`UNAUTHENTICATED`) or a role or id not allowed for the call
    /// (`PERMISSION_DENIED`). Not retried.
    #[error("meta refused the caller: {0}")]
    Denied(tonic::Status),
}

impl MetaError {
    /// The S3-level code, when the state machine refused the call.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            MetaError::Refused { code, .. } => Some(*code),
            MetaError::Unavailable(_) | MetaError::Denied(_) => None,
        }
    }
}

/// A fresh operation id: 32 random hex digits.
pub fn new_op_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What to do with a response that arrived (see [`CallFaults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Hand the response to the caller.
    Deliver,
    /// Throw it away as if the connection broke after the server answered;
    /// the client retries with the same operation id.
    Drop,
}

/// Fault injection on the meta transport (tests, chaos): consulted for
/// every successful response of RPC `rpc` (the method name, e.g.
/// `"PutObject"`).
pub trait CallFaults: Send + Sync + 'static {
    /// How long to stall before sending an attempt of `rpc` (a paused
    /// process, a slow link); `None` sends at once.
    fn before_call(&self, _rpc: &'static str) -> Option<Duration> {
        None
    }

    /// What to do with a response of `rpc` that arrived.
    fn on_response(&self, _rpc: &'static str) -> FaultAction {
        FaultAction::Deliver
    }
}

/// A cloneable, leader-following client for the `sluice.meta.Meta` service.
#[derive(Clone)]
pub struct MetaClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// Configured meta endpoints, e.g. `http://127.0.0.1:7001`.
    seeds: Vec<String>,
    /// One lazily connected channel per meta address; bounded by the number
    /// of distinct meta addresses seen: the seeds plus the leader hints,
    /// which carry members' addresses from the Raft membership (so a node
    /// added after this client started is reached through a hint, and a
    /// removed seed that no longer answers is skipped for the next one).
    channels: Mutex<HashMap<String, Channel>>,
    /// The address believed to be the leader.
    current: Mutex<String>,
    retry_deadline: Duration,
    rpc_timeout: Duration,
    faults: Option<Arc<dyn CallFaults>>,
    /// How meta nodes are dialed (mutual TLS, or plaintext).
    transport: sluice_net::Transport,
}

/// What a gateway reports with each epoch renewal (`RenewEpochRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayReport {
    /// The gateway process's resident set, bytes.
    pub rss_bytes: u64,
    /// The sum of its memory budgets, bytes.
    pub memory_budget_bytes: u64,
    /// S3 requests answered since the process started.
    pub requests_total: u64,
    /// `503 SlowDown` answers since the process started.
    pub slowdowns_total: u64,
    /// Its background workers ([`crate::worker_states`]).
    pub workers: Vec<pb::WorkerStatus>,
}

impl MetaClient {
    /// `seeds` are gRPC endpoints of meta nodes; at least one is required.
    pub fn new(seeds: Vec<String>) -> Self {
        Self::with_timeouts(seeds, Duration::from_secs(20), Duration::from_secs(5))
    }

    /// Like [`MetaClient::new`] with an explicit total retry deadline per
    /// call and a timeout per attempt.
    pub fn with_timeouts(
        seeds: Vec<String>,
        retry_deadline: Duration,
        rpc_timeout: Duration,
    ) -> Self {
        assert!(
            !seeds.is_empty(),
            "MetaClient needs at least one meta endpoint"
        );
        let current = seeds[0].clone();
        MetaClient {
            inner: Arc::new(Inner {
                seeds,
                channels: Mutex::new(HashMap::new()),
                current: Mutex::new(current),
                retry_deadline,
                rpc_timeout,
                faults: None,
                transport: sluice_net::Transport::Insecure,
            }),
        }
    }

    /// Like [`MetaClient::with_timeouts`], with `faults` consulted on every
    /// response.
    pub fn with_faults(
        seeds: Vec<String>,
        retry_deadline: Duration,
        rpc_timeout: Duration,
        faults: Arc<dyn CallFaults>,
    ) -> Self {
        let mut c = Self::with_timeouts(seeds, retry_deadline, rpc_timeout);
        Arc::get_mut(&mut c.inner).expect("fresh client").faults = Some(faults);
        c
    }

    /// A client like this one (seeds, timeouts, faults) dialing with
    /// `transport` (mutual TLS under `[cluster_tls]`), with fresh
    /// channels; a client made by the constructors dials plaintext.
    pub fn with_transport(&self, transport: sluice_net::Transport) -> Self {
        let current = self.inner.current.lock().expect("current lock").clone();
        MetaClient {
            inner: Arc::new(Inner {
                seeds: self.inner.seeds.clone(),
                channels: Mutex::new(HashMap::new()),
                current: Mutex::new(current),
                retry_deadline: self.inner.retry_deadline,
                rpc_timeout: self.inner.rpc_timeout,
                faults: self.inner.faults.clone(),
                transport,
            }),
        }
    }

    /// How this client dials meta; the gateway dials datanodes the same
    /// way.
    pub fn transport(&self) -> &sluice_net::Transport {
        &self.inner.transport
    }

    fn channel(&self, addr: &str) -> Result<Channel, MetaError> {
        let mut channels = self.inner.channels.lock().expect("channels lock");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = self
            .inner
            .transport
            .endpoint(addr, sluice_net::Role::Meta)
            .map_err(|e| MetaError::Unavailable(format!("bad meta address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        let channel = self.inner.transport.dial(endpoint);
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    fn next_seed_after(&self, addr: &str) -> String {
        let seeds = &self.inner.seeds;
        let pos = seeds.iter().position(|s| s == addr);
        match pos {
            Some(i) => seeds[(i + 1) % seeds.len()].clone(),
            None => seeds[0].clone(),
        }
    }

    /// Runs `f` against the leader, following hints and retrying until the
    /// deadline. `f` gets a fresh generated client each attempt.
    pub async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, MetaError>
    where
        F: Fn(RpcClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_on(what, |channel| {
            f(RpcClient::new(channel)
                .max_decoding_message_size(64 * 1024 * 1024)
                .max_encoding_message_size(64 * 1024 * 1024))
        })
        .await
    }

    /// Like [`MetaClient::call`] for any service meta serves (e.g. the
    /// `sluice.admin.Admin` service): `f` gets the channel to the node
    /// believed to be the leader and builds its own generated client.
    pub async fn call_on<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, MetaError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        let mut last_error: String;
        loop {
            let addr = self.inner.current.lock().expect("current lock").clone();
            let client = self.channel(&addr)?;
            if let Some(stall) = self.inner.faults.as_ref().and_then(|x| x.before_call(what)) {
                tokio::time::sleep(stall).await;
            }
            let result = tokio::time::timeout(self.inner.rpc_timeout, f(client)).await;
            let status = match result {
                Ok(Ok(resp)) => match &self.inner.faults {
                    Some(faults) if faults.on_response(what) == FaultAction::Drop => {
                        tonic::Status::unavailable(format!(
                            "{what}: response dropped (fault injection)"
                        ))
                    }
                    _ => return Ok(resp.into_inner()),
                },
                Ok(Err(status))
                    if matches!(
                        status.code(),
                        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                    ) =>
                {
                    return Err(MetaError::Denied(status));
                }
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded(format!("{what} timed out on {addr}")),
            };
            match sluice_proto::error::detail(&status) {
                Some(d) if d.code() == ErrorCode::NotLeader => {
                    let next = match d.leader_addr {
                        Some(l) if !l.is_empty() && l != addr => l,
                        // No leader known yet (election under way): wait, then
                        // ask the next node.
                        _ => self.next_seed_after(&addr),
                    };
                    last_error = format!("{addr} is not the leader");
                    *self.inner.current.lock().expect("current lock") = next;
                }
                Some(d) => {
                    return Err(MetaError::Refused {
                        code: d.code(),
                        message: d.message,
                    });
                }
                None => {
                    // Transport failure or timeout: try the next node.
                    last_error = format!("{what} on {addr}: {status}");
                    tracing::debug!(%addr, error = %status, "meta call failed, trying next node");
                    *self.inner.current.lock().expect("current lock") = self.next_seed_after(&addr);
                }
            }
            if started.elapsed() >= self.inner.retry_deadline {
                return Err(MetaError::Unavailable(last_error));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
            // A stalled caller (a paused process) sends no late retry.
            if started.elapsed() >= self.inner.retry_deadline {
                return Err(MetaError::Unavailable(last_error));
            }
        }
    }

    pub async fn create_bucket(&self, name: &str, now_ms: i64) -> Result<bool, MetaError> {
        self.create_bucket_owned(name, now_ms, "", pb::CannedAcl::AclPrivate)
            .await
    }

    /// CreateBucket by access key `owner_key_id` (empty: the root key) with
    /// canned ACL `acl`: a new bucket gets an owner grant for that key.
    pub async fn create_bucket_owned(
        &self,
        name: &str,
        now_ms: i64,
        owner_key_id: &str,
        acl: pb::CannedAcl,
    ) -> Result<bool, MetaError> {
        let req = pb::CreateBucketRequest {
            name: name.to_string(),
            now_ms,
            op_id: new_op_id(),
            owner_key_id: owner_key_id.to_string(),
            acl: acl.into(),
        };
        let r = self
            .call("CreateBucket", |mut c| {
                let req = req.clone();
                async move { c.create_bucket(req).await }
            })
            .await?;
        Ok(r.created)
    }

    pub async fn get_bucket(&self, name: &str) -> Result<pb::Bucket, MetaError> {
        let req = pb::BucketRequest {
            name: name.to_string(),
            op_id: String::new(),
        };
        let r = self
            .call("GetBucket", |mut c| {
                let req = req.clone();
                async move { c.get_bucket(req).await }
            })
            .await?;
        r.bucket
            .ok_or_else(|| MetaError::Unavailable("GetBucket answered without a bucket".into()))
    }

    pub async fn delete_bucket(&self, name: &str) -> Result<(), MetaError> {
        let req = pb::BucketRequest {
            name: name.to_string(),
            op_id: new_op_id(),
        };
        self.call("DeleteBucket", |mut c| {
            let req = req.clone();
            async move { c.delete_bucket(req).await }
        })
        .await?;
        Ok(())
    }

    /// The access key `id` with its secret and grants; `None` when meta
    /// has no such key.
    pub async fn get_access_key(&self, id: &str) -> Result<Option<pb::AccessKey>, MetaError> {
        let req = pb::GetAccessKeyRequest { id: id.to_string() };
        let r = self
            .call("GetAccessKey", |mut c| {
                let req = req.clone();
                async move { c.get_access_key(req).await }
            })
            .await;
        match r {
            Ok(r) => Ok(r.key),
            Err(e) if e.code() == Some(ErrorCode::NoSuchAccessKey) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn list_buckets(&self) -> Result<Vec<pb::Bucket>, MetaError> {
        let r = self
            .call("ListBuckets", |mut c| async move {
                c.list_buckets(pb::ListBucketsRequest {}).await
            })
            .await?;
        Ok(r.buckets)
    }

    /// Commits an object record; returns placements it replaced.
    pub async fn put_object(
        &self,
        object: pb::ObjectRecord,
    ) -> Result<Vec<pb::Placement>, MetaError> {
        Ok(self.put_object_if(object, None).await?.released)
    }

    /// [`MetaClient::put_object`] applied only if `condition` holds against
    /// the current object in the commit's own log entry. Errors besides
    /// put_object's: PreconditionFailed, NoSuchKey (If-Match, no object).
    /// The answer also names the version written (`version_id`).
    pub async fn put_object_if(
        &self,
        object: pb::ObjectRecord,
        condition: Option<pb::WriteCondition>,
    ) -> Result<pb::ReleasedResponse, MetaError> {
        let req = pb::PutObjectRequest {
            object: Some(object),
            condition,
            op_id: new_op_id(),
        };
        let r = self
            .call("PutObject", |mut c| {
                let req = req.clone();
                async move { c.put_object(req).await }
            })
            .await?;
        Ok(r)
    }

    /// The current version of `bucket`/`key`. Errors: NoSuchBucket,
    /// NoSuchKey.
    pub async fn get_object(&self, bucket: &str, key: &str) -> Result<pb::ObjectRecord, MetaError> {
        self.get_version(bucket, key, "", false).await
    }

    /// The version `version_id` of `bucket`/`key` ("" = current, "null" or
    /// an id); `with_delete_marker`: a delete marker is answered (its
    /// `delete_marker` set) instead of refused. Errors: NoSuchBucket,
    /// NoSuchKey, NoSuchVersion, InvalidArgument (malformed id),
    /// MethodNotAllowed (a marker named without `with_delete_marker`).
    pub async fn get_version(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        with_delete_marker: bool,
    ) -> Result<pb::ObjectRecord, MetaError> {
        self.read_version(bucket, key, version_id, with_delete_marker, false)
            .await
    }

    /// [`MetaClient::get_version`] without the part list and inline body:
    /// the record's `part_count` says how many parts it has. What HEAD
    /// (without partNumber), ACL and tagging reads need; the meta node
    /// reads no manifest for it.
    pub async fn head_version(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        with_delete_marker: bool,
    ) -> Result<pb::ObjectRecord, MetaError> {
        self.read_version(bucket, key, version_id, with_delete_marker, true)
            .await
    }

    async fn read_version(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        with_delete_marker: bool,
        head_only: bool,
    ) -> Result<pb::ObjectRecord, MetaError> {
        let req = pb::ObjectKey {
            bucket: bucket.to_string(),
            key: key.to_string(),
            op_id: String::new(),
            version_id: version_id.to_string(),
            with_delete_marker,
            head_only,
        };
        let r = self
            .call("GetObject", |mut c| {
                let req = req.clone();
                async move { c.get_object(req).await }
            })
            .await?;
        r.object
            .ok_or_else(|| MetaError::Unavailable("GetObject answered without an object".into()))
    }

    /// Deletes an object (a missing key is not an error); returns its placements.
    pub async fn delete_object(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Vec<pb::Placement>, MetaError> {
        Ok(self.delete_version(bucket, key, "").await?.released)
    }

    /// Deletes version `version_id` of `bucket`/`key` ("" = a delete of
    /// the key: in a versioned bucket it adds a delete marker). A missing
    /// key or version is not an error. Errors: NoSuchBucket,
    /// InvalidArgument (malformed id).
    pub async fn delete_version(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
    ) -> Result<pb::ReleasedResponse, MetaError> {
        let req = pb::ObjectKey {
            bucket: bucket.to_string(),
            key: key.to_string(),
            op_id: new_op_id(),
            version_id: version_id.to_string(),
            with_delete_marker: false,
            head_only: false,
        };
        self.call("DeleteObject", |mut c| {
            let req = req.clone();
            async move { c.delete_object(req).await }
        })
        .await
    }

    /// Replaces the canned ACL of the object at `bucket`/`key`. Errors:
    /// NoSuchBucket, NoSuchKey.
    pub async fn put_object_acl(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        acl: pb::CannedAcl,
    ) -> Result<(), MetaError> {
        let req = pb::PutObjectAclRequest {
            bucket: bucket.to_string(),
            key: key.to_string(),
            acl: acl.into(),
            op_id: new_op_id(),
            version_id: version_id.to_string(),
        };
        self.call("PutObjectAcl", |mut c| {
            let req = req.clone();
            async move { c.put_object_acl(req).await }
        })
        .await?;
        Ok(())
    }

    /// Replaces one subresource of bucket `name` whole (tags, ACL, policy
    /// or CORS rules; an empty value deletes it). Errors: NoSuchBucket.
    pub async fn put_bucket_config(
        &self,
        name: &str,
        config: pb::put_bucket_config_request::Config,
    ) -> Result<(), MetaError> {
        let req = pb::PutBucketConfigRequest {
            name: name.to_string(),
            config: Some(config),
            op_id: new_op_id(),
        };
        self.call("PutBucketConfig", |mut c| {
            let req = req.clone();
            async move { c.put_bucket_config(req).await }
        })
        .await?;
        Ok(())
    }

    /// Replaces the tags of the object at `bucket`/`key` (empty: removes
    /// them). Errors: NoSuchBucket, NoSuchKey.
    pub async fn put_object_tagging(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        tags: Vec<pb::Tag>,
    ) -> Result<(), MetaError> {
        let req = pb::PutObjectTaggingRequest {
            bucket: bucket.to_string(),
            key: key.to_string(),
            tags,
            op_id: new_op_id(),
            version_id: version_id.to_string(),
        };
        self.call("PutObjectTagging", |mut c| {
            let req = req.clone();
            async move { c.put_object_tagging(req).await }
        })
        .await?;
        Ok(())
    }

    pub async fn list_objects(
        &self,
        req: pb::ListObjectsRequest,
    ) -> Result<pb::ListObjectsResponse, MetaError> {
        self.call("ListObjects", |mut c| {
            let req = req.clone();
            async move { c.list_objects(req).await }
        })
        .await
    }

    /// S3 ListObjectVersions over the current records and the versions.
    pub async fn list_versions(
        &self,
        req: pb::ListVersionsRequest,
    ) -> Result<pb::ListVersionsResponse, MetaError> {
        self.call("ListVersions", |mut c| {
            let req = req.clone();
            async move { c.list_versions(req).await }
        })
        .await
    }

    pub async fn create_upload(&self, upload: pb::UploadRecord) -> Result<(), MetaError> {
        let req = pb::CreateUploadRequest {
            upload: Some(upload),
            op_id: new_op_id(),
        };
        self.call("CreateUpload", |mut c| {
            let req = req.clone();
            async move { c.create_upload(req).await }
        })
        .await?;
        Ok(())
    }

    pub async fn get_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<pb::UploadRecord, MetaError> {
        let req = pb::UploadKey {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
            op_id: String::new(),
        };
        let r = self
            .call("GetUpload", |mut c| {
                let req = req.clone();
                async move { c.get_upload(req).await }
            })
            .await?;
        r.upload
            .ok_or_else(|| MetaError::Unavailable("GetUpload answered without an upload".into()))
    }

    /// Commits a part record; returns the placement of the part it replaced.
    pub async fn put_part(
        &self,
        bucket: &str,
        key: &str,
        part: pb::PartRecord,
    ) -> Result<Vec<pb::Placement>, MetaError> {
        let req = pb::PutPartRequest {
            bucket: bucket.into(),
            key: key.into(),
            part: Some(part),
            op_id: new_op_id(),
        };
        let r = self
            .call("PutPart", |mut c| {
                let req = req.clone();
                async move { c.put_part(req).await }
            })
            .await?;
        Ok(r.released)
    }

    pub async fn list_parts(
        &self,
        req: pb::ListPartsRequest,
    ) -> Result<pb::ListPartsResponse, MetaError> {
        self.call("ListParts", |mut c| {
            let req = req.clone();
            async move { c.list_parts(req).await }
        })
        .await
    }

    pub async fn complete_upload(
        &self,
        mut req: pb::CompleteUploadRequest,
    ) -> Result<pb::CompleteUploadResponse, MetaError> {
        if req.op_id.is_empty() {
            req.op_id = new_op_id();
        }
        self.call("CompleteUpload", |mut c| {
            let req = req.clone();
            async move { c.complete_upload(req).await }
        })
        .await
    }

    /// Aborts an upload; returns the placements of its parts.
    pub async fn abort_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<pb::Placement>, MetaError> {
        let req = pb::UploadKey {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
            op_id: new_op_id(),
        };
        let r = self
            .call("AbortUpload", |mut c| {
                let req = req.clone();
                async move { c.abort_upload(req).await }
            })
            .await?;
        Ok(r.released)
    }

    pub async fn list_uploads(
        &self,
        req: pb::ListUploadsRequest,
    ) -> Result<pb::ListUploadsResponse, MetaError> {
        self.call("ListUploads", |mut c| {
            let req = req.clone();
            async move { c.list_uploads(req).await }
        })
        .await
    }

    /// Registers datanode `id` at `addr` with the identity of its disk.
    /// Refused with `DuplicateDatanode` when another live node holds the id.
    pub async fn register_datanode(
        &self,
        id: u64,
        addr: &str,
        disk_id: &str,
    ) -> Result<pb::RegisterDatanodeResponse, MetaError> {
        self.register_datanode_labelled(id, addr, disk_id, "", "")
            .await
    }

    /// [`MetaClient::register_datanode`] with the node's failure-domain
    /// labels (`zone` empty = zones not configured).
    pub async fn register_datanode_labelled(
        &self,
        id: u64,
        addr: &str,
        disk_id: &str,
        zone: &str,
        host: &str,
    ) -> Result<pb::RegisterDatanodeResponse, MetaError> {
        let req = pb::RegisterDatanodeRequest {
            id,
            addr: addr.into(),
            disk_id: disk_id.into(),
            op_id: new_op_id(),
            zone: zone.into(),
            host: host.into(),
        };
        self.call("RegisterDatanode", |mut c| {
            let req = req.clone();
            async move { c.register_datanode(req).await }
        })
        .await
    }

    /// Reports liveness and capacity of datanode `req.id`.
    pub async fn heartbeat(&self, req: pb::HeartbeatRequest) -> Result<(), MetaError> {
        self.call("Heartbeat", |mut c| {
            let req = req.clone();
            async move { c.heartbeat(req).await }
        })
        .await?;
        Ok(())
    }

    pub async fn list_datanodes(&self) -> Result<Vec<pb::DatanodeInfo>, MetaError> {
        let r = self
            .call("ListDatanodes", |mut c| async move {
                c.list_datanodes(pb::ListDatanodesRequest {}).await
            })
            .await?;
        Ok(r.datanodes)
    }

    /// The ids of `blob_ids` that no committed part or object record
    /// references (request order), read linearizably on the leader.
    /// At most `MAX_FILTER_IDS` (1000, `sluice_meta::sm::MAX_FILTER_IDS`) ids per call:
    /// more are refused with `InvalidArgument`. A blob still being written
    /// (not yet committed) is unreferenced too, so the datanode GC only
    /// asks about shards older than its grace period.
    pub async fn filter_unreferenced(
        &self,
        blob_ids: Vec<String>,
    ) -> Result<Vec<String>, MetaError> {
        let req = pb::FilterUnreferencedRequest { blob_ids };
        let r = self
            .call("FilterUnreferenced", |mut c| {
                let req = req.clone();
                async move { c.filter_unreferenced(req).await }
            })
            .await?;
        Ok(r.unreferenced)
    }

    /// Which of `shards` (at most 1000) of datanode `node_id` are garbage
    /// (see `CollectableRequest` in `proto/meta.proto`); linearizable.
    pub async fn collectable(
        &self,
        node_id: u64,
        shards: Vec<pb::ShardRef>,
    ) -> Result<Vec<pb::ShardRef>, MetaError> {
        let req = pb::CollectableRequest { node_id, shards };
        let r = self
            .call("Collectable", |mut c| {
                let req = req.clone();
                async move { c.collectable(req).await }
            })
            .await?;
        Ok(r.collectable)
    }

    /// Opens a write epoch for gateway `gateway_id`.
    pub async fn open_epoch(&self, gateway_id: &str) -> Result<pb::OpenEpochResponse, MetaError> {
        let req = pb::OpenEpochRequest {
            gateway_id: gateway_id.into(),
            op_id: new_op_id(),
        };
        self.call("OpenEpoch", |mut c| {
            let req = req.clone();
            async move { c.open_epoch(req).await }
        })
        .await
    }

    /// Renews write epoch `epoch`; `EpochClosed` when it was closed.
    pub async fn renew_epoch(&self, epoch: u64) -> Result<(), MetaError> {
        self.renew_epoch_reporting(epoch, GatewayReport::default())
            .await
    }

    /// [`MetaClient::renew_epoch`], reporting this gateway's load (kept in
    /// leader memory for `sluice admin status`).
    pub async fn renew_epoch_reporting(
        &self,
        epoch: u64,
        report: GatewayReport,
    ) -> Result<(), MetaError> {
        let req = pb::RenewEpochRequest {
            epoch,
            op_id: new_op_id(),
            rss_bytes: report.rss_bytes,
            memory_budget_bytes: report.memory_budget_bytes,
            requests_total: report.requests_total,
            slowdowns_total: report.slowdowns_total,
            workers: report.workers,
        };
        self.call("RenewEpoch", |mut c| {
            let req = req.clone();
            async move { c.renew_epoch(req).await }
        })
        .await?;
        Ok(())
    }

    /// One page of committed blobs (all, or only degraded ones).
    pub async fn list_placements(
        &self,
        req: pb::ListPlacementsRequest,
    ) -> Result<pb::ListPlacementsResponse, MetaError> {
        self.call("ListPlacements", |mut c| {
            let req = req.clone();
            async move { c.list_placements(req).await }
        })
        .await
    }

    /// Marks `shards` of datanode `node_id` missing in their placements;
    /// returns how many were marked.
    pub async fn report_missing(
        &self,
        node_id: u64,
        shards: Vec<pb::ShardRef>,
    ) -> Result<u32, MetaError> {
        let req = pb::ReportMissingRequest {
            node_id,
            shards,
            op_id: new_op_id(),
        };
        let r = self
            .call("ReportMissing", |mut c| {
                let req = req.clone();
                async move { c.report_missing(req).await }
            })
            .await?;
        Ok(r.marked)
    }

    /// Un-marks `shards` of datanode `node_id` that the caller found sound
    /// there; returns how many left `missing`.
    pub async fn report_present(
        &self,
        node_id: u64,
        shards: Vec<pb::ShardRef>,
    ) -> Result<u32, MetaError> {
        let req = pb::ReportPresentRequest {
            node_id,
            shards,
            op_id: new_op_id(),
        };
        let r = self
            .call("ReportPresent", |mut c| {
                let req = req.clone();
                async move { c.report_present(req).await }
            })
            .await?;
        Ok(r.unmarked)
    }

    /// Records a heal intent (`req.op_id` is filled in).
    pub async fn begin_heal(&self, mut req: pb::BeginHealRequest) -> Result<(), MetaError> {
        req.op_id = new_op_id();
        self.call("BeginHeal", |mut c| {
            let req = req.clone();
            async move { c.begin_heal(req).await }
        })
        .await?;
        Ok(())
    }

    /// Leases `blob_ids` under (epoch, lease id) for a GET in progress:
    /// the blobs whose deletion was already claimed (`lost`). Idempotent,
    /// so retried freely.
    pub async fn lease_blobs(&self, req: pb::LeaseBlobsRequest) -> Result<Vec<String>, MetaError> {
        let r = self
            .call("LeaseBlobs", |mut c| {
                let req = req.clone();
                async move { c.lease_blobs(req).await }
            })
            .await?;
        Ok(r.lost)
    }

    /// Ends read lease (epoch, lease id). Idempotent.
    pub async fn release_blobs(&self, epoch: u64, lease_id: u64) -> Result<(), MetaError> {
        let req = pb::ReleaseBlobsRequest { epoch, lease_id };
        self.call(
            "ReleaseBlobs",
            |mut c| async move { c.release_blobs(req).await },
        )
        .await?;
        Ok(())
    }

    /// Compare-and-set of a healed placement (`req.op_id` is filled in);
    /// `PlacementChanged` when the placement is no longer `req.expected`.
    pub async fn update_placement(
        &self,
        mut req: pb::UpdatePlacementRequest,
    ) -> Result<(), MetaError> {
        req.op_id = new_op_id();
        self.call("UpdatePlacement", |mut c| {
            let req = req.clone();
            async move { c.update_placement(req).await }
        })
        .await?;
        Ok(())
    }

    pub async fn cluster_status(&self) -> Result<pb::ClusterStatusResponse, MetaError> {
        self.call("ClusterStatus", |mut c| async move {
            c.cluster_status(pb::ClusterStatusRequest {}).await
        })
        .await
    }
}
