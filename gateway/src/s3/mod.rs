//! The S3 API: [`Gateway`] implements [`s3s::S3`] by delegating each
//! operation to a function in the file of its area.
//!
//! # Layout
//! * `bucket.rs` — CreateBucket, HeadBucket, ListBuckets, DeleteBucket, GetBucketLocation, GetBucketVersioning; bucket-name rules.
//! * `acl.rs` — canned ACLs: Get/PutBucketAcl, Get/PutObjectAcl, `x-amz-acl`, the object-ACL check of reads.
//! * `attributes.rs` — GetObjectAttributes.
//! * `bucket_config.rs` — bucket tagging, policy and CORS configuration (Put/Get/Delete).
//! * `put.rs` — PutObject, and the blob write shared by every operation that stores a body.
//! * `get.rs` — GetObject, HeadObject: ranges, conditionals, partNumber; the streamed object body.
//! * `lifecycle.rs` — Put/Get/DeleteBucketLifecycleConfiguration: the rules' checks and stored form.
//! * `list.rs` — ListObjects (v1), ListObjectsV2, ListObjectVersions (from meta ListVersions), ListMultipartUploads; `encoding-type=url`.
//! * `multipart.rs` — Create/UploadPart/Complete/Abort multipart upload, ListParts.
//! * `copy.rs` — CopyObject, UploadPartCopy.
//! * `cors.rs` — bucket CORS: PutBucketCors validation, preflight and actual-request evaluation.
//! * `delete.rs` — DeleteObject, DeleteObjects.
//! * `policy.rs` — bucket policies: parsing (PutBucketPolicy) and evaluation, pure code.
//! * `tagging.rs` — Put/Get/DeleteObjectTagging and the `x-amz-tagging` header rules.
//! * `unconfigured.rs` — Get* of subresources Sluice does not keep (encryption, object lock, website, ...), answered as for a bucket with none.
//! * `checksum.rs` — ETag/MD5 and `x-amz-checksum-*` computation and verification.
//! * `error.rs` — the mapping of meta and data-path errors to S3 errors.
//!
//! Every body is streamed: bodies in through [`checksum::DigestingBody`] into
//! [`BlobStore::write`], bodies out from [`BlobStore::read`] part by part.
//! An object or part is committed in meta only after its blob is durable,
//! and the client's 200 comes only after that commit. Every blob is written
//! under a write epoch guard ([`crate::epoch`]) held from before its first
//! shard until its commit returns. Blobs a commit releases (a replaced
//! object, a replaced part) are deleted by meta after `delete_delay`; the
//! gateway deletes only blobs whose commit was refused (see [`Reclaimer`]).

pub mod acl;
pub mod attributes;
pub mod bucket;
pub mod bucket_config;
pub mod checksum;
pub mod copy;
pub mod cors;
pub mod delete;
pub mod error;
pub mod get;
pub mod host;
pub mod lifecycle;
pub mod list;
pub mod multipart;
pub mod policy;
pub mod put;
pub mod tagging;
pub mod unconfigured;

use std::sync::Arc;
use std::time::Duration;

use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};
use sluice_meta_client::MetaClient;
use sluice_proto::meta as pb;
use tokio::sync::Semaphore;

use crate::access::BucketCache;
use crate::blob::BlobStore;
use crate::read_lease::{DEFAULT_READ_LEASE_AFTER, ReadLeases};

/// The S3 front end: metadata through [`MetaClient`], bodies through [`BlobStore`]. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) meta: MetaClient,
    pub(crate) blobs: BlobStore,
    /// Region reported by GetBucketLocation / HeadBucket / ListBuckets.
    pub(crate) region: String,
    pub(crate) reclaimer: Reclaimer,
    /// Bucket settings (ACL, policy, CORS) as the access check and CORS
    /// see them; invalidated when this gateway changes them.
    pub(crate) buckets: Arc<BucketCache>,
    /// The root key's id: the owner shown for buckets it created.
    pub(crate) root_key_id: String,
    /// Largest object body stored inline in its metadata record
    /// (`inline_max_bytes`; 0: none).
    pub(crate) inline_max: u64,
    /// Read leases of GETs that stream past `read_lease_after`.
    pub(crate) read_leases: ReadLeases,
}

impl Gateway {
    /// A gateway over `meta` and `blobs`; at most `max_background_deletes`
    /// deletions of discarded blobs (commit refused) run at once.
    pub fn new(
        meta: MetaClient,
        blobs: BlobStore,
        region: String,
        max_background_deletes: usize,
    ) -> Self {
        let reclaimer = Reclaimer::new(blobs.clone(), max_background_deletes);
        let buckets = BucketCache::new(meta.clone());
        let read_leases = ReadLeases::new(
            Arc::new(meta.clone()),
            blobs.epochs().clone(),
            DEFAULT_READ_LEASE_AFTER,
        );
        Gateway {
            read_leases,
            meta,
            blobs,
            region,
            reclaimer,
            buckets,
            root_key_id: String::new(),
            inline_max: 0,
        }
    }

    /// The cache of bucket settings the access check and CORS share with
    /// the handlers.
    pub fn bucket_cache(&self) -> Arc<BucketCache> {
        Arc::clone(&self.buckets)
    }

    /// This gateway with `id` as the root key's id (shown as the owner of
    /// the buckets it created).
    pub fn with_root_key_id(mut self, id: &str) -> Self {
        self.root_key_id = id.to_string();
        self
    }

    /// This gateway leasing the blobs of GETs still streaming after
    /// `after` (see `Config::read_lease_after`, [`crate::read_lease`]).
    pub fn with_read_lease_after(mut self, after: Duration) -> Self {
        self.read_leases = ReadLeases::new(
            Arc::new(self.meta.clone()),
            self.blobs.epochs().clone(),
            after,
        );
        self
    }

    /// This gateway storing object bodies of at most `bytes` inline in
    /// their metadata record (see `Config::inline_max_bytes`).
    pub fn with_inline_max(mut self, bytes: u64) -> Self {
        self.inline_max = bytes;
        self
    }

    /// Replaces one subresource of `bucket` in meta and forgets this
    /// gateway's cached settings of it.
    pub(crate) async fn put_bucket_config(
        &self,
        bucket: &str,
        config: pb::put_bucket_config_request::Config,
    ) -> S3Result<()> {
        let result = self.meta.put_bucket_config(bucket, config).await;
        self.buckets.invalidate(bucket);
        result.map_err(error::meta_error)
    }

    /// What this gateway does with released and discarded blobs.
    pub fn reclaimer(&self) -> &Reclaimer {
        &self.reclaimer
    }

    /// Waits for every background deletion to finish; later discards delete inline.
    pub async fn drain(&self) {
        self.reclaimer.drain().await;
    }
}

/// What the gateway does with blobs that leave the namespace.
///
/// *Released* blobs (replaced by a commit, dropped by DeleteObject,
/// AbortMultipartUpload or CompleteMultipartUpload) are meta's: it records
/// each as a pending deletion in the same batch and deletes it after
/// `delete_delay`, so a GET that started before the release reads to the
/// end. [`Reclaimer::release`] only counts them.
///
/// *Discarded* blobs were written by this gateway and never became
/// referenced: their commit was definitely refused (meta applied the
/// refusal) or never sent. Those the gateway deletes itself, in the
/// background, with at most `max_background_deletes` deletions in flight
/// ([`Reclaimer::discard`]). A blob whose commit outcome is unknown is left
/// to datanode GC, which epoch fencing makes safe.
#[derive(Clone)]
pub struct Reclaimer {
    blobs: BlobStore,
    /// One permit per deletion in flight.
    permits: Arc<Semaphore>,
    max: u32,
}

impl Reclaimer {
    fn new(blobs: BlobStore, max_in_flight: usize) -> Self {
        let max = u32::try_from(max_in_flight.max(1)).unwrap_or(u32::MAX);
        Reclaimer {
            blobs,
            permits: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// Notes blobs a commit or delete released: meta deletes them after
    /// `delete_delay`; the gateway only counts them
    /// (`sluice_gateway_blobs_released_total`).
    pub fn release(&self, placements: &[pb::Placement]) {
        if placements.is_empty() {
            return;
        }
        crate::metrics::count_released(placements.len());
        tracing::debug!(
            blobs = placements.len(),
            "released blobs (meta deletes them after delete_delay)"
        );
    }

    /// Deletes blobs this gateway wrote that no record references nor ever
    /// will (their commit was refused or never sent), in the background.
    /// Waits for a slot while `max` deletions are running (back-pressure
    /// instead of an unbounded task set); after [`Gateway::drain`], deletes
    /// inline.
    pub async fn discard(&self, placements: Vec<pb::Placement>) {
        if placements.is_empty() {
            return;
        }
        crate::metrics::count_discarded(placements.len());
        match self.permits.clone().acquire_owned().await {
            Ok(permit) => {
                let blobs = self.blobs.clone();
                tokio::spawn(async move {
                    blobs.delete(&placements).await;
                    drop(permit);
                });
            }
            // Draining: delete inline.
            Err(_) => self.blobs.delete(&placements).await,
        }
    }

    async fn drain(&self) {
        if let Ok(all) = self.permits.acquire_many(self.max).await {
            all.forget();
        }
        self.permits.close();
    }
}

/// An s3s timestamp for `ms` milliseconds since the Unix epoch.
pub(crate) fn timestamp(ms: i64) -> Timestamp {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .into()
}

/// Milliseconds since the Unix epoch of an s3s timestamp.
pub(crate) fn timestamp_ms(ts: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = ts.clone().into();
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// The quoted ETag of an unquoted value.
pub(crate) fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_string())
}

/// The owner shown in listings (single-tenant gateway: the configured key's owner).
pub(crate) fn owner() -> Owner {
    Owner {
        display_name: Some("sluice".to_string()),
        id: Some("sluice".to_string()),
    }
}

/// `HttpMeta` from the headers S3 stores with an object.
pub(crate) fn http_meta(
    content_type: Option<String>,
    content_encoding: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    expires: Option<&Timestamp>,
    metadata: Option<Metadata>,
) -> pb::HttpMeta {
    pb::HttpMeta {
        content_type,
        content_encoding: content_encoding.and_then(|e| stored_content_encoding(&e)),
        cache_control,
        content_disposition,
        content_language,
        expires_ms: expires.map(timestamp_ms),
        user_metadata: metadata.unwrap_or_default().into_iter().collect(),
    }
}

/// The `Content-Encoding` an object keeps: the request's codings without
/// `aws-chunked`, which only describes how the body was sent (S3 drops it:
/// <https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html>).
/// `None` when nothing else is left.
fn stored_content_encoding(header: &str) -> Option<String> {
    let codings: Vec<&str> = header
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

/// The key the blob of a single-PUT (or copied) object is placed under: `bucket/key`.
pub fn object_placement_key(bucket: &str, key: &str) -> String {
    format!("{bucket}/{key}")
}

/// The key the blob of a multipart part is placed under: `bucket/key/upload_id/part_number`.
pub(crate) fn part_placement_key(
    bucket: &str,
    key: &str,
    upload_id: &str,
    part_number: u32,
) -> String {
    format!("{bucket}/{key}/{upload_id}/{part_number}")
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        bucket::create_bucket(self, req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        bucket::head_bucket(self, req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        bucket::list_buckets(self, req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        bucket::delete_bucket(self, req).await
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        bucket::get_bucket_versioning(self, req).await
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        bucket::put_bucket_versioning(self, req).await
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        acl::get_bucket_acl(self, req).await
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        acl::put_bucket_acl(self, req).await
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        acl::get_object_acl(self, req).await
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        acl::put_object_acl(self, req).await
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        bucket_config::get_bucket_tagging(self, req).await
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        bucket_config::put_bucket_tagging(self, req).await
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        bucket_config::delete_bucket_tagging(self, req).await
    }

    async fn get_bucket_policy(
        &self,
        req: S3Request<GetBucketPolicyInput>,
    ) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        bucket_config::get_bucket_policy(self, req).await
    }

    async fn put_bucket_policy(
        &self,
        req: S3Request<PutBucketPolicyInput>,
    ) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        bucket_config::put_bucket_policy(self, req).await
    }

    async fn delete_bucket_policy(
        &self,
        req: S3Request<DeleteBucketPolicyInput>,
    ) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        bucket_config::delete_bucket_policy(self, req).await
    }

    async fn get_bucket_cors(
        &self,
        req: S3Request<GetBucketCorsInput>,
    ) -> S3Result<S3Response<GetBucketCorsOutput>> {
        bucket_config::get_bucket_cors(self, req).await
    }

    async fn put_bucket_cors(
        &self,
        req: S3Request<PutBucketCorsInput>,
    ) -> S3Result<S3Response<PutBucketCorsOutput>> {
        bucket_config::put_bucket_cors(self, req).await
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        bucket_config::delete_bucket_cors(self, req).await
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        lifecycle::get_bucket_lifecycle_configuration(self, req).await
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        lifecycle::put_bucket_lifecycle_configuration(self, req).await
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        lifecycle::delete_bucket_lifecycle(self, req).await
    }

    async fn get_bucket_encryption(
        &self,
        req: S3Request<GetBucketEncryptionInput>,
    ) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
        unconfigured::get_bucket_encryption(self, req).await
    }

    async fn get_bucket_ownership_controls(
        &self,
        req: S3Request<GetBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<GetBucketOwnershipControlsOutput>> {
        unconfigured::get_bucket_ownership_controls(self, req).await
    }

    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        unconfigured::get_object_lock_configuration(self, req).await
    }

    async fn get_bucket_website(
        &self,
        req: S3Request<GetBucketWebsiteInput>,
    ) -> S3Result<S3Response<GetBucketWebsiteOutput>> {
        unconfigured::get_bucket_website(self, req).await
    }

    async fn get_bucket_replication(
        &self,
        req: S3Request<GetBucketReplicationInput>,
    ) -> S3Result<S3Response<GetBucketReplicationOutput>> {
        unconfigured::get_bucket_replication(self, req).await
    }

    async fn get_public_access_block(
        &self,
        req: S3Request<GetPublicAccessBlockInput>,
    ) -> S3Result<S3Response<GetPublicAccessBlockOutput>> {
        unconfigured::get_public_access_block(self, req).await
    }

    async fn get_bucket_logging(
        &self,
        req: S3Request<GetBucketLoggingInput>,
    ) -> S3Result<S3Response<GetBucketLoggingOutput>> {
        unconfigured::get_bucket_logging(self, req).await
    }

    async fn get_bucket_accelerate_configuration(
        &self,
        req: S3Request<GetBucketAccelerateConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketAccelerateConfigurationOutput>> {
        unconfigured::get_bucket_accelerate_configuration(self, req).await
    }

    async fn get_bucket_notification_configuration(
        &self,
        req: S3Request<GetBucketNotificationConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketNotificationConfigurationOutput>> {
        unconfigured::get_bucket_notification_configuration(self, req).await
    }

    async fn get_bucket_request_payment(
        &self,
        req: S3Request<GetBucketRequestPaymentInput>,
    ) -> S3Result<S3Response<GetBucketRequestPaymentOutput>> {
        unconfigured::get_bucket_request_payment(self, req).await
    }

    async fn get_bucket_policy_status(
        &self,
        req: S3Request<GetBucketPolicyStatusInput>,
    ) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
        unconfigured::get_bucket_policy_status(self, req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        list::list_object_versions(self, req).await
    }

    async fn put_bucket_request_payment(
        &self,
        req: S3Request<PutBucketRequestPaymentInput>,
    ) -> S3Result<S3Response<PutBucketRequestPaymentOutput>> {
        unconfigured::put_bucket_request_payment(self, req).await
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        tagging::get_object_tagging(self, req).await
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        tagging::put_object_tagging(self, req).await
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        tagging::delete_object_tagging(self, req).await
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        attributes::get_object_attributes(self, req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        bucket::get_bucket_location(self, req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        put::put_object(self, req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        get::get_object(self, req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        get::head_object(self, req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        delete::delete_object(self, req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        delete::delete_objects(self, req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        copy::copy_object(self, req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        list::list_objects(self, req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        list::list_objects_v2(self, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        list::list_multipart_uploads(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        multipart::create_multipart_upload(self, req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        multipart::upload_part(self, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        copy::upload_part_copy(self, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete_multipart_upload(self, req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        multipart::abort_multipart_upload(self, req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        multipart::list_parts(self, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_in_milliseconds() {
        let ms = 1_700_000_000_123;
        assert_eq!(timestamp_ms(&timestamp(ms)), ms);
        assert_eq!(timestamp_ms(&timestamp(0)), 0);
    }

    #[test]
    fn aws_chunked_is_not_stored_as_a_content_encoding() {
        assert_eq!(
            stored_content_encoding("gzip, aws-chunked").as_deref(),
            Some("gzip")
        );
        assert_eq!(stored_content_encoding("aws-chunked"), None);
        assert_eq!(
            stored_content_encoding("AWS-Chunked,gzip,br").as_deref(),
            Some("gzip, br")
        );
        assert_eq!(stored_content_encoding("gzip").as_deref(), Some("gzip"));
        let meta = http_meta(
            None,
            Some("gzip, aws-chunked".into()),
            None,
            None,
            None,
            None,
            None,
        );
        assert_eq!(meta.content_encoding.as_deref(), Some("gzip"));
    }

    #[test]
    fn placement_keys() {
        assert_eq!(object_placement_key("b", "k/x"), "b/k/x");
        assert_eq!(part_placement_key("b", "k", "u1", 7), "b/k/u1/7");
    }
}
