//! Bucket subresources Sluice does not keep, answered as S3 answers for a
//! bucket that has none configured (so that `s3cmd info`, the AWS console
//! style tools and SDK "describe bucket" calls see a plain bucket rather
//! than `501 NotImplemented`): the bucket must exist (`404 NoSuchBucket`),
//! then
//! * 404 with S3's code: GetBucketEncryption
//!   (`ServerSideEncryptionConfigurationNotFoundError`),
//!   GetBucketOwnershipControls (`OwnershipControlsNotFoundError`),
//!   GetObjectLockConfiguration (`ObjectLockConfigurationNotFoundError`),
//!   GetBucketWebsite (`NoSuchWebsiteConfiguration`), GetBucketReplication
//!   (`ReplicationConfigurationNotFoundError`), GetPublicAccessBlock
//!   (`NoSuchPublicAccessBlockConfiguration`);
//! * 200 with nothing enabled: GetBucketLogging, GetBucketAccelerateConfiguration,
//!   GetBucketNotificationConfiguration; GetBucketRequestPayment answers
//!   `Payer` `BucketOwner`; GetBucketPolicyStatus answers `IsPublic` from
//!   the bucket policy (an `Allow` to `"*"`).
//!
//! Their Put counterparts stay `501 NotImplemented`, except
//! PutBucketRequestPayment with `BucketOwner`, a no-op.

use http::StatusCode;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use super::Gateway;
use super::error::meta_error;

async fn exists(gw: &Gateway, bucket: &str) -> S3Result<sluice_proto::meta::Bucket> {
    gw.meta.get_bucket(bucket).await.map_err(meta_error)
}

/// A 404 `code` S3 answers for a subresource never configured.
fn absent(code: &str, message: &str) -> S3Error {
    let code = S3ErrorCode::from_bytes(code.as_bytes())
        .unwrap_or_else(|| S3ErrorCode::Custom(code.to_string().into()));
    let mut e = S3Error::with_message(code, message.to_string());
    e.set_status_code(StatusCode::NOT_FOUND);
    e
}

pub(super) async fn get_bucket_encryption(
    gw: &Gateway,
    req: S3Request<GetBucketEncryptionInput>,
) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "ServerSideEncryptionConfigurationNotFoundError",
        "The server side encryption configuration was not found",
    ))
}

pub(super) async fn get_bucket_ownership_controls(
    gw: &Gateway,
    req: S3Request<GetBucketOwnershipControlsInput>,
) -> S3Result<S3Response<GetBucketOwnershipControlsOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "OwnershipControlsNotFoundError",
        "The bucket ownership controls were not found",
    ))
}

pub(super) async fn get_object_lock_configuration(
    gw: &Gateway,
    req: S3Request<GetObjectLockConfigurationInput>,
) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "ObjectLockConfigurationNotFoundError",
        "Object Lock configuration does not exist for this bucket",
    ))
}

pub(super) async fn get_bucket_website(
    gw: &Gateway,
    req: S3Request<GetBucketWebsiteInput>,
) -> S3Result<S3Response<GetBucketWebsiteOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "NoSuchWebsiteConfiguration",
        "The specified bucket does not have a website configuration",
    ))
}

pub(super) async fn get_bucket_replication(
    gw: &Gateway,
    req: S3Request<GetBucketReplicationInput>,
) -> S3Result<S3Response<GetBucketReplicationOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "ReplicationConfigurationNotFoundError",
        "The replication configuration was not found",
    ))
}

pub(super) async fn get_public_access_block(
    gw: &Gateway,
    req: S3Request<GetPublicAccessBlockInput>,
) -> S3Result<S3Response<GetPublicAccessBlockOutput>> {
    exists(gw, &req.input.bucket).await?;
    Err(absent(
        "NoSuchPublicAccessBlockConfiguration",
        "The public access block configuration was not found",
    ))
}

pub(super) async fn get_bucket_logging(
    gw: &Gateway,
    req: S3Request<GetBucketLoggingInput>,
) -> S3Result<S3Response<GetBucketLoggingOutput>> {
    exists(gw, &req.input.bucket).await?;
    Ok(S3Response::new(GetBucketLoggingOutput::default()))
}

pub(super) async fn get_bucket_accelerate_configuration(
    gw: &Gateway,
    req: S3Request<GetBucketAccelerateConfigurationInput>,
) -> S3Result<S3Response<GetBucketAccelerateConfigurationOutput>> {
    exists(gw, &req.input.bucket).await?;
    Ok(S3Response::new(
        GetBucketAccelerateConfigurationOutput::default(),
    ))
}

pub(super) async fn get_bucket_notification_configuration(
    gw: &Gateway,
    req: S3Request<GetBucketNotificationConfigurationInput>,
) -> S3Result<S3Response<GetBucketNotificationConfigurationOutput>> {
    exists(gw, &req.input.bucket).await?;
    Ok(S3Response::new(
        GetBucketNotificationConfigurationOutput::default(),
    ))
}

pub(super) async fn get_bucket_request_payment(
    gw: &Gateway,
    req: S3Request<GetBucketRequestPaymentInput>,
) -> S3Result<S3Response<GetBucketRequestPaymentOutput>> {
    exists(gw, &req.input.bucket).await?;
    Ok(S3Response::new(GetBucketRequestPaymentOutput {
        payer: Some(Payer::from_static(Payer::BUCKET_OWNER)),
    }))
}

pub(super) async fn get_bucket_policy_status(
    gw: &Gateway,
    req: S3Request<GetBucketPolicyStatusInput>,
) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
    let b = exists(gw, &req.input.bucket).await?;
    let is_public = !b.policy.is_empty()
        && super::policy::parse(&b.policy, &b.name).is_ok_and(|p| p.is_public());
    Ok(S3Response::new(GetBucketPolicyStatusOutput {
        policy_status: Some(PolicyStatus {
            is_public: Some(is_public),
        }),
    }))
}

/// PutBucketRequestPayment: `BucketOwner` (what every bucket here is) is
/// accepted as the no-op it is; `Requester` is `501 NotImplemented`.
pub(super) async fn put_bucket_request_payment(
    gw: &Gateway,
    req: S3Request<PutBucketRequestPaymentInput>,
) -> S3Result<S3Response<PutBucketRequestPaymentOutput>> {
    exists(gw, &req.input.bucket).await?;
    if req.input.request_payment_configuration.payer.as_str() != Payer::BUCKET_OWNER {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "Requester Pays buckets are not supported.",
        ));
    }
    Ok(S3Response::new(PutBucketRequestPaymentOutput {}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_subresources_are_404_with_s3s_codes() {
        let e = absent("ObjectLockConfigurationNotFoundError", "m");
        assert_eq!(e.code(), &S3ErrorCode::ObjectLockConfigurationNotFoundError);
        assert_eq!(e.status_code(), Some(StatusCode::NOT_FOUND));
        let e = absent("NoSuchPublicAccessBlockConfiguration", "m");
        assert_eq!(e.code().as_str(), "NoSuchPublicAccessBlockConfiguration");
        assert_eq!(e.status_code(), Some(StatusCode::NOT_FOUND));
    }
}
