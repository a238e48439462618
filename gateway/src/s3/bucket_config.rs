//! A bucket's tagging, policy and CORS configuration: Put/Get/Delete of
//! each, stored whole in the bucket's record by one Raft command
//! (`PutBucketConfig`; an empty value deletes). Sources: the S3 API
//! reference pages PutBucketTagging, PutBucketPolicy, PutBucketCors and
//! their Get/Delete pages.
//!
//! * Tagging: at most 50 tags, each as an object tag ([`super::tagging`]);
//!   GetBucketTagging of an untagged bucket is `404 NoSuchTagSet`.
//! * Policy: checked by [`super::policy::parse`] (`400 MalformedPolicy`),
//!   returned verbatim; none is `404 NoSuchBucketPolicy`.
//! * CORS: checked by [`super::cors::validate`]; none is
//!   `404 NoSuchCORSConfiguration`.
//!
//! A change takes effect at once on the gateway that made it and within
//! [`crate::access::BUCKET_CACHE_TTL`] on the others.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;
use sluice_proto::meta::put_bucket_config_request::Config;

use super::Gateway;
use super::error::meta_error;
use super::{cors, policy, tagging};

async fn bucket(gw: &Gateway, name: &str) -> S3Result<pb::Bucket> {
    gw.meta.get_bucket(name).await.map_err(meta_error)
}

pub(super) async fn get_bucket_tagging(
    gw: &Gateway,
    req: S3Request<GetBucketTaggingInput>,
) -> S3Result<S3Response<GetBucketTaggingOutput>> {
    let b = bucket(gw, &req.input.bucket).await?;
    if b.tags.is_empty() {
        return Err(S3Error::with_message(
            S3ErrorCode::NoSuchTagSet,
            "The TagSet does not exist",
        ));
    }
    Ok(S3Response::new(GetBucketTaggingOutput {
        tag_set: tagging::to_tag_set(&b.tags),
    }))
}

pub(super) async fn put_bucket_tagging(
    gw: &Gateway,
    req: S3Request<PutBucketTaggingInput>,
) -> S3Result<S3Response<PutBucketTaggingOutput>> {
    let input = req.input;
    let tags = tagging::tags_of(input.tagging.tag_set);
    tagging::validate_bucket(&tags)?;
    gw.put_bucket_config(&input.bucket, Config::Tags(pb::BucketTags { tags }))
        .await?;
    Ok(S3Response::new(PutBucketTaggingOutput {}))
}

pub(super) async fn delete_bucket_tagging(
    gw: &Gateway,
    req: S3Request<DeleteBucketTaggingInput>,
) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
    gw.put_bucket_config(&req.input.bucket, Config::Tags(pb::BucketTags::default()))
        .await?;
    Ok(S3Response::new(DeleteBucketTaggingOutput {}))
}

pub(super) async fn get_bucket_policy(
    gw: &Gateway,
    req: S3Request<GetBucketPolicyInput>,
) -> S3Result<S3Response<GetBucketPolicyOutput>> {
    let b = bucket(gw, &req.input.bucket).await?;
    if b.policy.is_empty() {
        return Err(S3Error::with_message(
            S3ErrorCode::NoSuchBucketPolicy,
            "The bucket policy does not exist",
        ));
    }
    Ok(S3Response::new(GetBucketPolicyOutput {
        policy: Some(b.policy),
    }))
}

pub(super) async fn put_bucket_policy(
    gw: &Gateway,
    req: S3Request<PutBucketPolicyInput>,
) -> S3Result<S3Response<PutBucketPolicyOutput>> {
    let input = req.input;
    policy::parse(&input.policy, &input.bucket)?;
    gw.put_bucket_config(&input.bucket, Config::Policy(input.policy))
        .await?;
    Ok(S3Response::new(PutBucketPolicyOutput {}))
}

pub(super) async fn delete_bucket_policy(
    gw: &Gateway,
    req: S3Request<DeleteBucketPolicyInput>,
) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
    gw.put_bucket_config(&req.input.bucket, Config::Policy(String::new()))
        .await?;
    Ok(S3Response::new(DeleteBucketPolicyOutput {}))
}

pub(super) async fn get_bucket_cors(
    gw: &Gateway,
    req: S3Request<GetBucketCorsInput>,
) -> S3Result<S3Response<GetBucketCorsOutput>> {
    let b = bucket(gw, &req.input.bucket).await?;
    if b.cors.is_empty() {
        return Err(S3Error::with_message(
            S3ErrorCode::NoSuchCORSConfiguration,
            "The CORS configuration does not exist",
        ));
    }
    Ok(S3Response::new(GetBucketCorsOutput {
        cors_rules: Some(b.cors.iter().map(crate::access::cors_rule).collect()),
    }))
}

fn stored_rule(r: CORSRule) -> pb::CorsRule {
    pb::CorsRule {
        id: r.id.unwrap_or_default(),
        allowed_methods: r.allowed_methods,
        allowed_origins: r.allowed_origins,
        allowed_headers: r.allowed_headers.unwrap_or_default(),
        expose_headers: r.expose_headers.unwrap_or_default(),
        max_age_seconds: r.max_age_seconds,
    }
}

pub(super) async fn put_bucket_cors(
    gw: &Gateway,
    req: S3Request<PutBucketCorsInput>,
) -> S3Result<S3Response<PutBucketCorsOutput>> {
    let input = req.input;
    cors::validate(&input.cors_configuration)?;
    let rules = input
        .cors_configuration
        .cors_rules
        .into_iter()
        .map(stored_rule)
        .collect();
    gw.put_bucket_config(&input.bucket, Config::Cors(pb::BucketCors { rules }))
        .await?;
    Ok(S3Response::new(PutBucketCorsOutput {}))
}

pub(super) async fn delete_bucket_cors(
    gw: &Gateway,
    req: S3Request<DeleteBucketCorsInput>,
) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
    gw.put_bucket_config(&req.input.bucket, Config::Cors(pb::BucketCors::default()))
        .await?;
    Ok(S3Response::new(DeleteBucketCorsOutput {}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_rules_round_trip_through_the_record() {
        let rule = CORSRule {
            allowed_headers: Some(vec!["x-amz-*".into()]),
            allowed_methods: vec!["GET".into(), "PUT".into()],
            allowed_origins: vec!["https://*.example.com".into()],
            expose_headers: Some(vec!["ETag".into()]),
            id: Some("web".into()),
            max_age_seconds: Some(600),
        };
        let back = crate::access::cors_rule(&stored_rule(rule.clone()));
        assert_eq!(format!("{back:?}"), format!("{rule:?}"));
        let bare = CORSRule {
            allowed_headers: None,
            allowed_methods: vec!["GET".into()],
            allowed_origins: vec!["*".into()],
            expose_headers: None,
            id: None,
            max_age_seconds: None,
        };
        let back = crate::access::cors_rule(&stored_rule(bare.clone()));
        assert_eq!(format!("{back:?}"), format!("{bare:?}"));
    }
}
