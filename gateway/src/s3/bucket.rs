//! Bucket operations: CreateBucket, HeadBucket, ListBuckets, DeleteBucket,
//! GetBucketLocation, and the bucket-name rules
//! (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html>).
//!
//! ListBuckets returns every bucket the caller sees, in name order, unless
//! `max-buckets` (1 to 10000) asks for pages; a truncated page carries a
//! `ContinuationToken` (opaque: base64 of the last name returned) that the
//! next request sends back. `prefix` keeps the names that begin with it
//! (<https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListBuckets.html>).

use s3s::dto::*;
use s3s::validation::NameValidation;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_util::clock::wall_clock_ms;

use super::error::{invalid_argument, meta_error};
use super::list::{decode_token, encode_token};
use super::{Gateway, owner, timestamp};
use crate::access::Caller;
use sluice_proto::meta as pb;

/// Whether `name` is a valid general-purpose bucket name: 3 to 63
/// characters of lowercase letters, digits, dots and hyphens, beginning and
/// ending with a letter or digit, no `..`, `.-` or `-.` (each dot-separated
/// label begins and ends with a letter or digit, as S3 answers
/// `InvalidBucketName` for `foo-.bar`), not shaped like an IPv4 address, and
/// none of the prefixes/suffixes S3 reserves.
pub fn is_valid_bucket_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if !(3..=63).contains(&bytes.len()) {
        return false;
    }
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return false;
    }
    let alnum = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !alnum(bytes.first()) || !alnum(bytes.last()) {
        return false;
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") || looks_like_ipv4(name) {
        return false;
    }
    let reserved_prefix = ["xn--", "sthree-", "amzn-s3-demo-"]
        .iter()
        .any(|p| name.starts_with(p));
    let reserved_suffix = ["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"]
        .iter()
        .any(|s| name.ends_with(s));
    !(reserved_prefix || reserved_suffix)
}

/// Four dot-separated groups of 1 to 3 digits, e.g. `192.168.5.4`.
fn looks_like_ipv4(name: &str) -> bool {
    let groups: Vec<&str> = name.split('.').collect();
    groups.len() == 4
        && groups
            .iter()
            .all(|g| (1..=3).contains(&g.len()) && g.bytes().all(|b| b.is_ascii_digit()))
}

/// [`is_valid_bucket_name`] as the rule s3s applies to every request path.
#[derive(Debug, Clone, Copy, Default)]
pub struct BucketNameRules;

impl NameValidation for BucketNameRules {
    fn validate_bucket_name(&self, name: &str) -> bool {
        is_valid_bucket_name(name)
    }
}

/// Largest `max-buckets` ListBuckets accepts.
const MAX_BUCKETS_PAGE: i32 = 10_000;

fn invalid_bucket_name() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InvalidBucketName,
        "The specified bucket is not valid.",
    )
}

pub(super) async fn create_bucket(
    gw: &Gateway,
    req: S3Request<CreateBucketInput>,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let caller = req.extensions.get::<Caller>().cloned();
    let input = req.input;
    if !is_valid_bucket_name(&input.bucket) {
        return Err(invalid_bucket_name());
    }
    let constraint = input
        .create_bucket_configuration
        .as_ref()
        .and_then(|c| c.location_constraint.as_ref())
        .map(|c| c.as_str().to_string())
        .filter(|c| !c.is_empty());
    if let Some(constraint) = constraint
        && constraint != gw.region
    {
        return Err(S3Error::with_message(
            S3ErrorCode::IllegalLocationConstraintException,
            format!(
                "The {constraint} location constraint is incompatible for the region specific endpoint this request was sent to."
            ),
        ));
    }
    // The creating access key becomes the bucket's owner (in meta, same
    // entry). Re-creating a bucket one owns answers 200; a bucket owned by
    // someone else is BucketAlreadyExists.
    let owner = caller.as_ref().map_or("", Caller::owner_key_id);
    let acl = super::acl::bucket_acl(
        input.acl.as_ref(),
        &super::acl::grant_headers!(input, grant_write),
    )?;
    let created = gw
        .meta
        .create_bucket_owned(&input.bucket, wall_clock_ms(), owner, acl)
        .await
        .map_err(meta_error)?;
    tracing::debug!(bucket = %input.bucket, created, "create bucket");
    // Settings cached for a bucket of this name (deleted since) are not
    // this bucket's.
    gw.buckets.invalidate(&input.bucket);
    if let Some(caller) = &caller {
        if created {
            // The cached grants predate the new owner grant.
            caller.refresh();
        } else if !caller.owns(&input.bucket) {
            return Err(S3Error::new(S3ErrorCode::BucketAlreadyExists));
        }
    }
    Ok(S3Response::new(CreateBucketOutput {
        location: Some(format!("/{}", input.bucket)),
    }))
}

pub(super) async fn head_bucket(
    gw: &Gateway,
    req: S3Request<HeadBucketInput>,
) -> S3Result<S3Response<HeadBucketOutput>> {
    gw.meta
        .get_bucket(&req.input.bucket)
        .await
        .map_err(meta_error)?;
    Ok(S3Response::new(HeadBucketOutput {
        bucket_region: Some(gw.region.clone()),
        ..Default::default()
    }))
}

pub(super) async fn list_buckets(
    gw: &Gateway,
    req: S3Request<ListBucketsInput>,
) -> S3Result<S3Response<ListBucketsOutput>> {
    // Only the buckets the caller has a grant on (all for the root key).
    let caller = req.extensions.get::<Caller>().cloned();
    let input = req.input;
    let prefix = input.prefix.unwrap_or_default();
    let max = match input.max_buckets {
        None => None,
        Some(n) if (1..=MAX_BUCKETS_PAGE).contains(&n) => Some(n as usize),
        Some(_) => {
            return Err(invalid_argument(
                "max-buckets must be an integer between 1 and 10000",
            ));
        }
    };
    let after = input
        .continuation_token
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(decode_token)
        .transpose()?
        .unwrap_or_default();
    let mut buckets = gw.meta.list_buckets().await.map_err(meta_error)?;
    buckets.retain(|b| {
        b.name.starts_with(&prefix)
            && b.name > after
            && caller.as_ref().is_none_or(|c| c.sees(&b.name))
    });
    buckets.sort_by(|a, b| a.name.cmp(&b.name));
    let continuation_token = match max {
        Some(max) if buckets.len() > max => {
            buckets.truncate(max);
            buckets.last().map(|b| encode_token(&b.name))
        }
        _ => None,
    };
    let buckets = buckets
        .into_iter()
        .map(|b| Bucket {
            bucket_region: Some(gw.region.clone()),
            creation_date: Some(timestamp(b.created_at_ms)),
            name: Some(b.name),
        })
        .collect();
    Ok(S3Response::new(ListBucketsOutput {
        buckets: Some(buckets),
        owner: Some(owner()),
        prefix: (!prefix.is_empty()).then_some(prefix),
        continuation_token,
    }))
}

pub(super) async fn delete_bucket(
    gw: &Gateway,
    req: S3Request<DeleteBucketInput>,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    // Meta refuses with BucketNotEmpty while objects or uploads exist.
    let deleted = gw.meta.delete_bucket(&req.input.bucket).await;
    gw.buckets.invalidate(&req.input.bucket);
    deleted.map_err(meta_error)?;
    Ok(S3Response::new(DeleteBucketOutput {}))
}

pub(super) async fn get_bucket_location(
    gw: &Gateway,
    req: S3Request<GetBucketLocationInput>,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    gw.meta
        .get_bucket(&req.input.bucket)
        .await
        .map_err(meta_error)?;
    Ok(S3Response::new(GetBucketLocationOutput {
        location_constraint: location_constraint(&gw.region),
    }))
}

/// GetBucketVersioning: `Enabled` or `Suspended`, or no `Status` for a
/// bucket whose versioning was never set (S3 API reference,
/// "GetBucketVersioning"). Errors: `NoSuchBucket`.
pub(super) async fn get_bucket_versioning(
    gw: &Gateway,
    req: S3Request<GetBucketVersioningInput>,
) -> S3Result<S3Response<GetBucketVersioningOutput>> {
    let bucket = gw
        .meta
        .get_bucket(&req.input.bucket)
        .await
        .map_err(meta_error)?;
    let status = match bucket.versioning() {
        pb::Versioning::Unversioned => None,
        pb::Versioning::Enabled => Some(BucketVersioningStatus::ENABLED),
        pb::Versioning::Suspended => Some(BucketVersioningStatus::SUSPENDED),
    };
    Ok(S3Response::new(GetBucketVersioningOutput {
        status: status.map(|s| BucketVersioningStatus::from(s.to_string())),
        mfa_delete: None,
    }))
}

/// PutBucketVersioning (S3 API reference): `Status` `Enabled` or
/// `Suspended`; a bucket never returns to unversioned. Errors:
/// `MalformedXML` without a valid status, `NotImplemented` for
/// `MfaDelete` `Enabled` (MFA delete is not supported), `NoSuchBucket`.
pub(super) async fn put_bucket_versioning(
    gw: &Gateway,
    req: S3Request<PutBucketVersioningInput>,
) -> S3Result<S3Response<PutBucketVersioningOutput>> {
    let input = req.input;
    let config = input.versioning_configuration;
    if config
        .mfa_delete
        .as_ref()
        .is_some_and(|m| m.as_str() == MFADelete::ENABLED)
    {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "MFA delete is not supported.",
        ));
    }
    let versioning = match config.status.as_ref().map(|s| s.as_str()) {
        Some(BucketVersioningStatus::ENABLED) => pb::Versioning::Enabled,
        Some(BucketVersioningStatus::SUSPENDED) => pb::Versioning::Suspended,
        _ => {
            return Err(S3Error::with_message(
                S3ErrorCode::MalformedXML,
                "The XML you provided was not well-formed or did not validate against our published schema",
            ));
        }
    };
    gw.put_bucket_config(
        &input.bucket,
        pb::put_bucket_config_request::Config::Versioning(versioning.into()),
    )
    .await?;
    Ok(S3Response::new(PutBucketVersioningOutput::default()))
}

/// S3 answers an empty `LocationConstraint` for us-east-1.
fn location_constraint(region: &str) -> Option<BucketLocationConstraint> {
    (region != "us-east-1").then(|| BucketLocationConstraint::from(region.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_name_rules() {
        for good in [
            "abc",
            "my-bucket",
            "my.bucket.1",
            "0bucket9",
            &"a".repeat(63),
            "192.168.5.4a",
        ] {
            assert!(is_valid_bucket_name(good), "{good} should be valid");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "MyBucket",
            "my_bucket",
            "-bucket",
            "bucket-",
            ".bucket",
            "bucket.",
            "my..bucket",
            "foo-.bar",
            "foo.-bar",
            "192.168.5.4",
            "10.0.0.1",
            "xn--bucket",
            "sthree-bucket",
            "bucket-s3alias",
            "bucket--ol-s3",
            "buck et",
            "bücket",
            "",
        ] {
            assert!(!is_valid_bucket_name(bad), "{bad} should be invalid");
        }
        assert!(BucketNameRules.validate_bucket_name("good-name"));
        assert!(!BucketNameRules.validate_bucket_name("Bad"));
    }

    #[test]
    fn location_constraint_is_empty_for_us_east_1() {
        assert_eq!(location_constraint("us-east-1"), None);
        assert_eq!(
            location_constraint("eu-west-3").map(|c| c.as_str().to_string()),
            Some("eu-west-3".to_string())
        );
    }
}
