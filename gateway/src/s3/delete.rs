//! DeleteObject and DeleteObjects (at most 1000 keys, per-key results, quiet mode).
//!
//! Deleting a missing key succeeds (204), as in S3. The deleted object's
//! blobs are released: meta records them as pending deletions with the
//! deletion and deletes them after `delete_delay`.

use futures::StreamExt;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use super::Gateway;
use super::error::{meta_error, reported_version};
use sluice_proto::meta::ReleasedResponse;

/// Most keys one DeleteObjects request may name.
pub const MAX_DELETE_KEYS: usize = 1000;

/// Deletions of one DeleteObjects request that run at once.
const DELETE_CONCURRENCY: usize = 8;

pub(super) async fn delete_object(
    gw: &Gateway,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let input = req.input;
    let r = gw
        .meta
        .delete_version(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
        )
        .await
        .map_err(meta_error)?;
    tracing::debug!(bucket = %input.bucket, key = %input.key, blobs = r.released.len(), "delete object");
    gw.reclaimer.release(&r.released);
    Ok(S3Response::new(DeleteObjectOutput {
        delete_marker: r.delete_marker.then_some(true),
        version_id: reported_version(r.version_id),
        ..Default::default()
    }))
}

/// Checks the size of a DeleteObjects request. Errors: `MalformedXML` for
/// no keys or more than [`MAX_DELETE_KEYS`], as S3 answers.
pub fn check_delete_count(count: usize) -> S3Result<()> {
    if count == 0 || count > MAX_DELETE_KEYS {
        return Err(S3Error::with_message(
            S3ErrorCode::MalformedXML,
            "The XML you provided was not well-formed or did not validate against our published schema",
        ));
    }
    Ok(())
}

pub(super) async fn delete_objects(
    gw: &Gateway,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let denied = req
        .extensions
        .get::<crate::access::DeniedKeys>()
        .map(|d| d.0.clone())
        .unwrap_or_default();
    let input = req.input;
    check_delete_count(input.delete.objects.len() + denied.len())?;
    let quiet = input.delete.quiet.unwrap_or(false);
    let bucket = input.bucket;
    // The bucket must exist even when every key is missing.
    gw.meta.get_bucket(&bucket).await.map_err(meta_error)?;

    type Outcome = (String, Option<String>, S3Result<ReleasedResponse>);
    let results: Vec<Outcome> = futures::stream::iter(input.delete.objects)
        .map(|o| {
            let bucket = bucket.clone();
            async move {
                let r = gw
                    .meta
                    .delete_version(&bucket, &o.key, o.version_id.as_deref().unwrap_or(""))
                    .await
                    .map_err(meta_error);
                // An empty <VersionId/> names no version.
                (o.key, o.version_id.filter(|v| !v.is_empty()), r)
            }
        })
        .buffered(DELETE_CONCURRENCY)
        .collect()
        .await;

    let mut deleted = Vec::new();
    let mut errors: Vec<Error> = denied
        .into_iter()
        .map(|key| Error {
            code: Some("AccessDenied".to_string()),
            key: Some(key),
            message: Some("Access Denied".to_string()),
            version_id: None,
        })
        .collect();
    for (key, asked, result) in results {
        match result {
            Ok(r) => {
                gw.reclaimer.release(&r.released);
                if !quiet {
                    // S3: a delete naming a version answers it as
                    // VersionId; one that added a marker names the marker.
                    let version = reported_version(r.version_id);
                    let (version_id, delete_marker_version_id) = match &asked {
                        // A marker deleted by id: both name it.
                        Some(_) if r.delete_marker => (version.clone(), version),
                        Some(_) => (version, None),
                        None if r.delete_marker => (None, version),
                        None => (version, None),
                    };
                    deleted.push(DeletedObject {
                        key: Some(key),
                        version_id,
                        delete_marker: r.delete_marker.then_some(true),
                        delete_marker_version_id,
                    });
                }
            }
            Err(e) => errors.push(Error {
                code: Some(e.code().as_str().to_string()),
                key: Some(key),
                message: e.message().map(str::to_string),
                version_id: asked,
            }),
        }
    }
    tracing::debug!(%bucket, deleted = deleted.len(), errors = errors.len(), "delete objects");
    Ok(S3Response::new(DeleteObjectsOutput {
        deleted: (!deleted.is_empty()).then_some(deleted),
        errors: (!errors.is_empty()).then_some(errors),
        request_charged: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_objects_takes_1_to_1000_keys() {
        assert!(check_delete_count(1).is_ok());
        assert!(check_delete_count(1000).is_ok());
        assert_eq!(
            check_delete_count(1001).unwrap_err().code(),
            &S3ErrorCode::MalformedXML
        );
        assert_eq!(
            check_delete_count(0).unwrap_err().code(),
            &S3ErrorCode::MalformedXML
        );
    }
}
