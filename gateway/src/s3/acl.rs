//! Canned ACLs (S3 "Access control list (ACL) overview", "Canned ACL"):
//! Get/PutBucketAcl, Get/PutObjectAcl, `x-amz-acl` on CreateBucket,
//! PutObject, CopyObject and CreateMultipartUpload, and the object-ACL
//! check of reads the bucket's grants and policy did not already allow.
//!
//! Sluice stores one canned ACL per bucket and per object
//! ([`pb::CannedAcl`]): `private`, `public-read`, `public-read-write`,
//! `authenticated-read`. A request may name one in `x-amz-acl`, or send an
//! `AccessControlPolicy` body whose grants are exactly a canned ACL's (the
//! owner's `FULL_CONTROL` plus the group grants), which is what s3cmd's
//! `setacl --acl-public` and boto3's `put_object_acl(AccessControlPolicy=…)`
//! send. Anything else (`x-amz-grant-*` headers, grants to other users,
//! `log-delivery-write`, `aws-exec-read`) is `501 NotImplemented`.
//! `bucket-owner-read` and `bucket-owner-full-control` are `private`: the
//! bucket owner owns every object here.
//!
//! The owner shown is the access key that created the bucket (the root key
//! for buckets it created and for buckets older than this field).

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;

use super::Gateway;
use super::error::{delete_marker_error, meta_error};

/// The URI of S3's AllUsers group (anyone, signed or not).
pub const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
/// The URI of S3's AuthenticatedUsers group (any valid access key).
pub const AUTHENTICATED_USERS: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

/// The `x-amz-grant-*` headers of an s3s input (`FULL_CONTROL`, `READ`,
/// `READ_ACP`, `WRITE_ACP`, plus `WRITE` where the input has it), for the
/// refusal of explicit grants.
macro_rules! grant_headers {
    ($input:expr) => {
        [
            $input.grant_full_control.as_deref(),
            $input.grant_read.as_deref(),
            $input.grant_read_acp.as_deref(),
            $input.grant_write_acp.as_deref(),
        ]
    };
    ($input:expr, grant_write) => {
        [
            $input.grant_full_control.as_deref(),
            $input.grant_read.as_deref(),
            $input.grant_read_acp.as_deref(),
            $input.grant_write_acp.as_deref(),
            $input.grant_write.as_deref(),
        ]
    };
}
pub(crate) use grant_headers;

fn not_implemented(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NotImplemented,
        format!(
            "{what} is not supported: only the canned ACLs private, public-read, public-read-write and authenticated-read are."
        ),
    )
}

/// The canned ACL named `name` (an `x-amz-acl` value).
/// Errors: `NotImplemented` for canned ACLs Sluice does not keep,
/// `InvalidArgument` for unknown names.
pub fn canned(name: &str) -> S3Result<pb::CannedAcl> {
    Ok(match name {
        "private" | "bucket-owner-read" | "bucket-owner-full-control" => pb::CannedAcl::AclPrivate,
        "public-read" => pb::CannedAcl::AclPublicRead,
        "public-read-write" => pb::CannedAcl::AclPublicReadWrite,
        "authenticated-read" => pb::CannedAcl::AclAuthenticatedRead,
        "log-delivery-write" | "aws-exec-read" => {
            return Err(not_implemented(&format!("The canned ACL {name}")));
        }
        other => {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                format!("Unknown canned ACL: {other}"),
            ));
        }
    })
}

/// The canned ACL of an optional `x-amz-acl` (`private` when absent).
pub fn canned_or_private(name: Option<&str>) -> S3Result<pb::CannedAcl> {
    name.map_or(Ok(pb::CannedAcl::AclPrivate), canned)
}

/// Refuses the `x-amz-grant-*` headers (explicit grants), which Sluice
/// does not keep.
fn no_explicit_grants(grants: &[Option<&str>]) -> S3Result<()> {
    if grants.iter().any(Option::is_some) {
        return Err(not_implemented("An x-amz-grant-* header"));
    }
    Ok(())
}

/// The ACL of an object written with `x-amz-acl` `acl` (private when
/// absent) and `x-amz-grant-*` headers `grants` (refused:
/// `NotImplemented`).
pub fn object_acl(
    acl: Option<&ObjectCannedACL>,
    grants: &[Option<&str>],
) -> S3Result<pb::CannedAcl> {
    no_explicit_grants(grants)?;
    canned_or_private(acl.map(|a| a.as_str()))
}

/// The ACL of a bucket created with `x-amz-acl` `acl` and `x-amz-grant-*`
/// headers `grants`, as [`object_acl`].
pub fn bucket_acl(
    acl: Option<&BucketCannedACL>,
    grants: &[Option<&str>],
) -> S3Result<pb::CannedAcl> {
    no_explicit_grants(grants)?;
    canned_or_private(acl.map(|a| a.as_str()))
}

/// Whether `acl` lets a caller read (`READ`): anyone for the public ACLs,
/// any valid key for `authenticated-read`.
pub fn allows_read(acl: pb::CannedAcl, authenticated: bool) -> bool {
    match acl {
        pb::CannedAcl::AclPublicRead | pb::CannedAcl::AclPublicReadWrite => true,
        pb::CannedAcl::AclAuthenticatedRead => authenticated,
        pb::CannedAcl::AclPrivate => false,
    }
}

/// Whether bucket ACL `acl` lets a caller write objects (`WRITE`).
pub fn allows_write(acl: pb::CannedAcl) -> bool {
    acl == pb::CannedAcl::AclPublicReadWrite
}

fn group(uri: &str, permission: &'static str) -> Grant {
    Grant {
        grantee: Some(Grantee {
            type_: Type::from_static(Type::GROUP),
            uri: Some(uri.to_string()),
            display_name: None,
            email_address: None,
            id: None,
        }),
        permission: Some(Permission::from_static(permission)),
    }
}

/// The owner element: the access key id that owns the bucket.
pub fn owner(owner_id: &str) -> Owner {
    Owner {
        display_name: Some(owner_id.to_string()),
        id: Some(owner_id.to_string()),
    }
}

/// The grants S3 lists for canned ACL `acl` owned by `owner_id`.
pub fn grants(acl: pb::CannedAcl, owner_id: &str) -> Grants {
    let mut grants = vec![Grant {
        grantee: Some(Grantee {
            type_: Type::from_static(Type::CANONICAL_USER),
            id: Some(owner_id.to_string()),
            display_name: Some(owner_id.to_string()),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }];
    match acl {
        pb::CannedAcl::AclPrivate => {}
        pb::CannedAcl::AclPublicRead => grants.push(group(ALL_USERS, Permission::READ)),
        pb::CannedAcl::AclPublicReadWrite => {
            grants.push(group(ALL_USERS, Permission::READ));
            grants.push(group(ALL_USERS, Permission::WRITE));
        }
        pb::CannedAcl::AclAuthenticatedRead => {
            grants.push(group(AUTHENTICATED_USERS, Permission::READ))
        }
    }
    grants
}

/// The canned ACL an `AccessControlPolicy` body amounts to: its group
/// grants (grants to a user are taken as the owner's, which always has
/// `FULL_CONTROL`). Errors: `NotImplemented` for any other set of grants.
pub fn canned_of_policy(policy: &AccessControlPolicy) -> S3Result<pb::CannedAcl> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for g in policy.grants.iter().flatten() {
        let Some(grantee) = &g.grantee else {
            return Err(S3Error::new(S3ErrorCode::MalformedACLError));
        };
        let permission = g.permission.as_ref().map(|p| p.as_str().to_string());
        match grantee.type_.as_str() {
            Type::CANONICAL_USER => {
                if permission.as_deref() != Some(Permission::FULL_CONTROL) {
                    return Err(not_implemented("A grant to a user other than FULL_CONTROL"));
                }
            }
            Type::GROUP => {
                let uri = grantee.uri.clone().unwrap_or_default();
                groups.push((uri, permission.unwrap_or_default()));
            }
            _ => return Err(not_implemented("A grant to an e-mail address")),
        }
    }
    groups.sort();
    groups.dedup();
    let all = |p: &str| (ALL_USERS.to_string(), p.to_string());
    let authenticated = |p: &str| (AUTHENTICATED_USERS.to_string(), p.to_string());
    if groups.is_empty() {
        Ok(pb::CannedAcl::AclPrivate)
    } else if groups == [all(Permission::READ)] {
        Ok(pb::CannedAcl::AclPublicRead)
    } else if groups == [all(Permission::READ), all(Permission::WRITE)] {
        Ok(pb::CannedAcl::AclPublicReadWrite)
    } else if groups == [authenticated(Permission::READ)] {
        Ok(pb::CannedAcl::AclAuthenticatedRead)
    } else {
        Err(not_implemented("This set of grants"))
    }
}

/// The ACL of a PutBucketAcl/PutObjectAcl request: `x-amz-acl` or the
/// body. Errors: both or neither given (`InvalidRequest` /
/// `MissingSecurityHeader`), see [`canned`] and [`canned_of_policy`].
fn requested(
    header: Option<&str>,
    body: Option<&AccessControlPolicy>,
    grants: &[Option<&str>],
) -> S3Result<pb::CannedAcl> {
    no_explicit_grants(grants)?;
    match (header, body) {
        (Some(name), None) => canned(name),
        (None, Some(policy)) => canned_of_policy(policy),
        (Some(_), Some(_)) => Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "Specifying both Canned ACLs and Header Grants or an AccessControlPolicy is not allowed",
        )),
        (None, None) => Err(S3Error::with_message(
            S3ErrorCode::MissingSecurityHeader,
            "Your request was missing a required header: x-amz-acl",
        )),
    }
}

fn owner_id(gw: &Gateway, bucket: &pb::Bucket) -> String {
    if bucket.owner_key_id.is_empty() {
        gw.root_key_id.clone()
    } else {
        bucket.owner_key_id.clone()
    }
}

pub(super) async fn get_bucket_acl(
    gw: &Gateway,
    req: S3Request<GetBucketAclInput>,
) -> S3Result<S3Response<GetBucketAclOutput>> {
    let bucket = gw
        .meta
        .get_bucket(&req.input.bucket)
        .await
        .map_err(meta_error)?;
    let owner_id = owner_id(gw, &bucket);
    Ok(S3Response::new(GetBucketAclOutput {
        grants: Some(grants(bucket.acl(), &owner_id)),
        owner: Some(owner(&owner_id)),
    }))
}

pub(super) async fn put_bucket_acl(
    gw: &Gateway,
    req: S3Request<PutBucketAclInput>,
) -> S3Result<S3Response<PutBucketAclOutput>> {
    let input = req.input;
    let acl = requested(
        input.acl.as_ref().map(|a| a.as_str()),
        input.access_control_policy.as_ref(),
        &grant_headers!(input, grant_write),
    )?;
    gw.put_bucket_config(
        &input.bucket,
        pb::put_bucket_config_request::Config::Acl(acl.into()),
    )
    .await?;
    Ok(S3Response::new(PutBucketAclOutput {}))
}

pub(super) async fn get_object_acl(
    gw: &Gateway,
    req: S3Request<GetObjectAclInput>,
) -> S3Result<S3Response<GetObjectAclOutput>> {
    let input = req.input;
    let bucket = gw
        .meta
        .get_bucket(&input.bucket)
        .await
        .map_err(meta_error)?;
    let obj = gw
        .meta
        .head_version(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
            false,
        )
        .await
        .map_err(meta_error)?;
    let owner_id = owner_id(gw, &bucket);
    Ok(S3Response::new(GetObjectAclOutput {
        grants: Some(grants(obj.acl(), &owner_id)),
        owner: Some(owner(&owner_id)),
        request_charged: None,
    }))
}

pub(super) async fn put_object_acl(
    gw: &Gateway,
    req: S3Request<PutObjectAclInput>,
) -> S3Result<S3Response<PutObjectAclOutput>> {
    let input = req.input;
    let acl = requested(
        input.acl.as_ref().map(|a| a.as_str()),
        input.access_control_policy.as_ref(),
        &grant_headers!(input, grant_write),
    )?;
    gw.meta
        .put_object_acl(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
            acl,
        )
        .await
        .map_err(meta_error)?;
    Ok(S3Response::new(PutObjectAclOutput::default()))
}

/// The object at `bucket`/`key` for a read, checked against its ACL when
/// the access check deferred to it ([`crate::access::ObjectAclCheck`] in
/// `extensions`): allowed when the policy granted the read or the
/// object's ACL grants the caller `READ`;
/// otherwise `403 AccessDenied`, and a missing key is `403` too unless the
/// caller may list the bucket (S3 hides which keys exist).
///
/// `version_id` names the version (`None`: the current one); a delete
/// marker is answered as S3 does ([`delete_marker_error`]: 404 for the
/// latest version, 405 when named). Unless `whole`, the record comes
/// without its part list and inline body (`part_count` set), which meta
/// answers without reading them.
pub(super) async fn readable_object(
    gw: &Gateway,
    extensions: &http::Extensions,
    bucket: &str,
    key: &str,
    version_id: Option<&str>,
    whole: bool,
) -> S3Result<pb::ObjectRecord> {
    let check = extensions.get::<crate::access::ObjectAclCheck>();
    let version = version_id.unwrap_or("");
    let read = if whole {
        gw.meta.get_version(bucket, key, version, true).await
    } else {
        gw.meta.head_version(bucket, key, version, true).await
    };
    let found = match read {
        Ok(obj) if obj.delete_marker => Err(delete_marker_error(&obj, version_id.is_some())),
        other => other.map_err(meta_error),
    };
    let Some(check) = check else { return found };
    let denied = || S3Error::with_message(S3ErrorCode::AccessDenied, "Access Denied");
    match found {
        Ok(obj) if check.granted || allows_read(obj.acl(), check.authenticated) => Ok(obj),
        Ok(_) => Err(denied()),
        Err(e) if e.code() == &S3ErrorCode::NoSuchKey && !check.can_list => Err(denied()),
        // NoSuchKey to a lister, NoSuchBucket, 503: as they are.
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(groups: &[(&str, &'static str)]) -> AccessControlPolicy {
        let mut g = grants(pb::CannedAcl::AclPrivate, "OWNER");
        g.extend(groups.iter().map(|(uri, p)| group(uri, p)));
        AccessControlPolicy {
            grants: Some(g),
            owner: Some(owner("OWNER")),
        }
    }

    #[test]
    fn canned_names_and_bodies_round_trip() {
        for (name, acl) in [
            ("private", pb::CannedAcl::AclPrivate),
            ("public-read", pb::CannedAcl::AclPublicRead),
            ("public-read-write", pb::CannedAcl::AclPublicReadWrite),
            ("authenticated-read", pb::CannedAcl::AclAuthenticatedRead),
            ("bucket-owner-full-control", pb::CannedAcl::AclPrivate),
        ] {
            assert_eq!(canned(name).unwrap(), acl, "{name}");
            let listed = AccessControlPolicy {
                grants: Some(grants(acl, "OWNER")),
                owner: Some(owner("OWNER")),
            };
            assert_eq!(canned_of_policy(&listed).unwrap(), acl, "{name}");
        }
        assert_eq!(
            grants(pb::CannedAcl::AclPublicReadWrite, "O").len(),
            3,
            "owner FULL_CONTROL, AllUsers READ and WRITE"
        );
        assert_eq!(
            canned("log-delivery-write").unwrap_err().code(),
            &S3ErrorCode::NotImplemented
        );
        assert_eq!(
            canned("everyone").unwrap_err().code(),
            &S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn bodies_that_are_no_canned_acl_are_refused() {
        // s3cmd setacl --acl-public: the owner plus AllUsers READ.
        assert_eq!(
            canned_of_policy(&body(&[(ALL_USERS, Permission::READ)])).unwrap(),
            pb::CannedAcl::AclPublicRead
        );
        for groups in [
            vec![(ALL_USERS, Permission::WRITE)],
            vec![(AUTHENTICATED_USERS, Permission::FULL_CONTROL)],
            vec![
                (ALL_USERS, Permission::READ),
                (AUTHENTICATED_USERS, Permission::READ),
            ],
        ] {
            assert_eq!(
                canned_of_policy(&body(&groups)).unwrap_err().code(),
                &S3ErrorCode::NotImplemented,
                "{groups:?}"
            );
        }
        let mut reader = body(&[]);
        reader.grants.as_mut().unwrap().push(Grant {
            grantee: Some(Grantee {
                type_: Type::from_static(Type::CANONICAL_USER),
                id: Some("OTHER".into()),
                display_name: None,
                email_address: None,
                uri: None,
            }),
            permission: Some(Permission::from_static(Permission::READ)),
        });
        assert_eq!(
            canned_of_policy(&reader).unwrap_err().code(),
            &S3ErrorCode::NotImplemented
        );
    }

    #[test]
    fn requests_name_exactly_one_acl() {
        assert_eq!(
            requested(Some("public-read"), None, &[]).unwrap(),
            pb::CannedAcl::AclPublicRead
        );
        assert_eq!(
            requested(None, None, &[]).unwrap_err().code(),
            &S3ErrorCode::MissingSecurityHeader
        );
        assert_eq!(
            requested(Some("private"), Some(&body(&[])), &[])
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidRequest
        );
        assert_eq!(
            requested(
                None,
                None,
                &[Some(
                    "uri=\"http://acs.amazonaws.com/groups/global/AllUsers\""
                )]
            )
            .unwrap_err()
            .code(),
            &S3ErrorCode::NotImplemented
        );
    }

    #[test]
    fn read_and_write_follow_the_groups() {
        use pb::CannedAcl::*;
        assert!(allows_read(AclPublicRead, false));
        assert!(allows_read(AclPublicReadWrite, false));
        assert!(!allows_read(AclAuthenticatedRead, false));
        assert!(allows_read(AclAuthenticatedRead, true));
        assert!(!allows_read(AclPrivate, true));
        assert!(allows_write(AclPublicReadWrite));
        assert!(!allows_write(AclPublicRead));
    }
}
