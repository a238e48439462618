//! The one place where metadata and data-path failures become S3 errors
//! (code + HTTP status, <https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html>).
//!
//! s3s renders the XML body (`Code`, `Message`); the server's request-id
//! layer adds `Resource` and `RequestId` to every error body
//! (see `crate::server`).

use http::StatusCode;
use s3s::{S3Error, S3ErrorCode};
use sluice_meta_client::MetaError;
use sluice_proto::meta::{self as pb, ErrorCode};

use crate::blob::BlobError;
use crate::metrics::{SlowDownReason, count_slowdown};
use crate::s3::checksum::DigestMismatch;

/// Seconds a client is asked to wait before retrying a `SlowDown`.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// `503 SlowDown` with `Retry-After`, counted under `reason` in
/// `sluice_gateway_slowdown_total`.
pub fn slow_down(reason: SlowDownReason) -> S3Error {
    count_slowdown(reason);
    let mut err = S3Error::with_message(S3ErrorCode::SlowDown, "Please reduce your request rate.");
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(RETRY_AFTER_SECONDS),
    );
    err.set_headers(headers);
    err
}

/// Message of the `503 ServiceUnavailable` a commit refused with
/// `EPOCH_CLOSED` gets.
pub const EPOCH_LOST_MESSAGE: &str = "write epoch lost; retry";

/// `err` with `Retry-After: RETRY_AFTER_SECONDS`.
fn with_retry_after(mut err: S3Error) -> S3Error {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(RETRY_AFTER_SECONDS),
    );
    err.set_headers(headers);
    err
}

/// `503 ServiceUnavailable` "write epoch lost; retry" with `Retry-After`:
/// the commit named a blob of a write epoch meta had closed (this gateway
/// was paused or cut off past its lease); the retry writes under a new one.
pub fn epoch_lost() -> S3Error {
    with_retry_after(S3Error::with_message(
        S3ErrorCode::ServiceUnavailable,
        EPOCH_LOST_MESSAGE,
    ))
}

/// S3 code for a code the meta state machine refused a call with.
pub fn meta_code(code: ErrorCode) -> S3ErrorCode {
    match code {
        ErrorCode::NoSuchBucket => S3ErrorCode::NoSuchBucket,
        ErrorCode::BucketAlreadyOwnedByYou => S3ErrorCode::BucketAlreadyOwnedByYou,
        ErrorCode::BucketNotEmpty => S3ErrorCode::BucketNotEmpty,
        ErrorCode::NoSuchKey => S3ErrorCode::NoSuchKey,
        ErrorCode::NoSuchUpload => S3ErrorCode::NoSuchUpload,
        ErrorCode::InvalidPart => S3ErrorCode::InvalidPart,
        ErrorCode::InvalidPartOrder => S3ErrorCode::InvalidPartOrder,
        ErrorCode::EntityTooSmall => S3ErrorCode::EntityTooSmall,
        ErrorCode::InvalidArgument => S3ErrorCode::InvalidArgument,
        ErrorCode::PreconditionFailed => S3ErrorCode::PreconditionFailed,
        ErrorCode::NoSuchVersion => S3ErrorCode::NoSuchVersion,
        ErrorCode::MethodNotAllowed => S3ErrorCode::MethodNotAllowed,
        // The client retries leader changes itself; one that leaks out is a
        // cluster without a leader.
        ErrorCode::NotLeader => S3ErrorCode::ServiceUnavailable,
        // The gateway lost its write epoch (paused or cut off past its
        // lease): retryable, the next attempt writes under a new epoch.
        ErrorCode::EpochClosed => S3ErrorCode::ServiceUnavailable,
        ErrorCode::NoSuchAccessKey => S3ErrorCode::InvalidAccessKeyId,
        // Meta's session table is full: the operation was not proposed.
        ErrorCode::SlowDown => S3ErrorCode::SlowDown,
        // A command of a newer release while the cluster's upgrade is not
        // finalized: refused before anything was written.
        ErrorCode::ClusterVersionGate => S3ErrorCode::ServiceUnavailable,
        ErrorCode::PlacementChanged
        | ErrorCode::DuplicateDatanode
        | ErrorCode::MembershipChangeRefused
        | ErrorCode::DatanodeInUse
        | ErrorCode::NoSuchDatanode => S3ErrorCode::InternalError,
        ErrorCode::Internal | ErrorCode::Unspecified => S3ErrorCode::InternalError,
    }
}

/// Maps a failed meta call to the S3 error the client gets. The "no such"
/// errors carry S3's standard message; the others keep meta's, which names
/// the offending part or argument.
pub fn meta_error(err: MetaError) -> S3Error {
    match err {
        MetaError::Refused {
            code: ErrorCode::EpochClosed,
            message,
        } => {
            tracing::warn!(%message, "commit refused: write epoch closed; answering 503");
            epoch_lost()
        }
        MetaError::Refused {
            code: ErrorCode::SlowDown,
            message,
        } => {
            tracing::info!(%message, "meta shed the operation; answering SlowDown");
            slow_down(SlowDownReason::Meta)
        }
        MetaError::Refused { code, message } => {
            let s3 = meta_code(code);
            if s3 == S3ErrorCode::InternalError {
                tracing::error!(?code, %message, "meta refused a call with an internal error");
                return internal_error();
            }
            match standard_message(&s3) {
                Some(standard)
                    if matches!(
                        code,
                        ErrorCode::NoSuchBucket
                            | ErrorCode::NoSuchKey
                            | ErrorCode::NoSuchUpload
                            | ErrorCode::NoSuchVersion
                            | ErrorCode::MethodNotAllowed
                            | ErrorCode::BucketNotEmpty
                    ) =>
                {
                    S3Error::with_message(s3, standard)
                }
                _ => S3Error::with_message(s3, message),
            }
        }
        MetaError::Denied(status) => {
            tracing::error!(%status, "meta refused this gateway's certificate");
            internal_error()
        }
        MetaError::Unavailable(reason) => {
            tracing::warn!(%reason, "meta cluster unavailable");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                "The metadata service is unavailable; please retry.",
            )
        }
    }
}

/// S3's message for the codes clients meet most, for errors raised without
/// one (s3s's own authentication and routing errors among them).
pub fn standard_message(code: &S3ErrorCode) -> Option<&'static str> {
    Some(match code {
        S3ErrorCode::AccessDenied => "Access Denied",
        S3ErrorCode::BucketNotEmpty => "The bucket you tried to delete is not empty",
        S3ErrorCode::InternalError => "We encountered an internal error. Please try again.",
        S3ErrorCode::InvalidAccessKeyId => {
            "The AWS Access Key Id you provided does not exist in our records."
        }
        S3ErrorCode::InvalidBucketName => "The specified bucket is not valid.",
        S3ErrorCode::InvalidRange => "The requested range is not satisfiable",
        S3ErrorCode::InvalidURI => "Couldn't parse the specified URI.",
        S3ErrorCode::KeyTooLongError => "Your key is too long",
        S3ErrorCode::MalformedXML => {
            "The XML you provided was not well-formed or did not validate against our published schema"
        }
        S3ErrorCode::MethodNotAllowed => {
            "The specified method is not allowed against this resource."
        }
        S3ErrorCode::MissingContentLength => "You must provide the Content-Length HTTP header.",
        S3ErrorCode::NoSuchBucket => "The specified bucket does not exist",
        S3ErrorCode::NoSuchKey => "The specified key does not exist.",
        S3ErrorCode::NoSuchVersion => "The specified version does not exist.",
        S3ErrorCode::NoSuchUpload => {
            "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."
        }
        S3ErrorCode::NotImplemented => {
            "A header you provided implies functionality that is not implemented."
        }
        S3ErrorCode::PreconditionFailed => {
            "At least one of the pre-conditions you specified did not hold"
        }
        S3ErrorCode::RequestTimeTooSkewed => {
            "The difference between the request time and the server's time is too large."
        }
        S3ErrorCode::ServiceUnavailable => "Please reduce your request rate.",
        S3ErrorCode::SignatureDoesNotMatch => {
            "The request signature we calculated does not match the signature you provided. Check your key and signing method."
        }
        S3ErrorCode::SlowDown => "Please reduce your request rate.",
        _ => return None,
    })
}

fn internal_error() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InternalError,
        "We encountered an internal error. Please try again.",
    )
}

/// Maps a data-path failure to the S3 error the client gets.
pub fn blob_error(err: BlobError) -> S3Error {
    blob_error_ref(&err)
}

fn blob_error_ref(err: &BlobError) -> S3Error {
    match err {
        BlobError::Body(io) => body_error(io),
        BlobError::BufferStall { waited } => {
            tracing::info!(
                ?waited,
                "no write or read buffer in time; answering SlowDown"
            );
            slow_down(SlowDownReason::Stall)
        }
        BlobError::DatanodesBusy { waited } => {
            tracing::warn!(
                ?waited,
                "datanodes granted no credit in time; answering SlowDown"
            );
            slow_down(SlowDownReason::Datanodes)
        }
        BlobError::NotEnoughWritable { .. } => {
            tracing::warn!(error = %err, "datanodes full");
            with_retry_after(S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                err.to_string(),
            ))
        }
        BlobError::TooFewShards { .. } => {
            tracing::warn!(error = %err, "read degraded below k shards");
            with_retry_after(S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                "Not enough storage nodes are available; please retry.",
            ))
        }
        BlobError::QuorumNotReached { .. } | BlobError::NotEnoughDatanodes { .. } => {
            tracing::warn!(error = %err, "data path degraded");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                "Not enough storage nodes are available; please retry.",
            )
        }
        other => {
            tracing::error!(error = %other, "data path failed");
            S3Error::with_message(
                S3ErrorCode::InternalError,
                "We encountered an internal error. Please try again.",
            )
        }
    }
}

/// Maps an error met while reading a request body.
///
/// A [`DigestMismatch`] (raised by our digesting body) is `BadDigest`; a
/// [`BlobError`] inside (a copy whose source read failed) maps as itself.
/// s3s's own body checks do not export their error types, so they are
/// recognised by their `Display` text: a bad aws-chunked chunk signature is
/// `SignatureDoesNotMatch`, a body that does not hash to
/// `x-amz-content-sha256` is `XAmzContentSHA256Mismatch`. Anything else
/// (client went away, truncated body) is `IncompleteBody`.
pub fn body_error(io: &std::io::Error) -> S3Error {
    if let Some(mismatch) = io
        .get_ref()
        .and_then(|e| e.downcast_ref::<DigestMismatch>())
    {
        return mismatch.to_s3();
    }
    if let Some(source) = io.get_ref().and_then(|e| e.downcast_ref::<BlobError>()) {
        return blob_error_ref(source);
    }
    let text = error_chain(io);
    // Raised by `crate::listener` below s3s; recognised by their text
    // because s3s's aws-chunked decoder wraps them.
    if text.contains("RequestBodyTimeout:") {
        tracing::info!(error = %text, "request body made too little progress");
        return custom(
            "RequestTimeout",
            StatusCode::BAD_REQUEST,
            "Your socket connection to the server was not read from or written to within the timeout period.",
        );
    }
    if let Some(at) = text.find("ChunkTooLarge: ") {
        let message = text[at + "ChunkTooLarge: ".len()..]
            .split(": ")
            .next()
            .unwrap_or("an aws-chunked chunk is too large");
        return S3Error::with_message(S3ErrorCode::InvalidRequest, message.to_string());
    }
    if text.contains("SignatureMismatch") {
        return S3Error::with_message(
            S3ErrorCode::SignatureDoesNotMatch,
            "The chunk signature we calculated does not match the signature you provided.",
        );
    }
    if text.contains("Sha256Mismatch") {
        return custom(
            "XAmzContentSHA256Mismatch",
            StatusCode::BAD_REQUEST,
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        );
    }
    tracing::debug!(error = %text, "request body ended early");
    S3Error::with_message(
        S3ErrorCode::IncompleteBody,
        "You did not provide the number of bytes specified by the Content-Length HTTP header.",
    )
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// An S3 error whose code s3s has no variant for.
pub fn custom(code: &'static str, status: StatusCode, message: &'static str) -> S3Error {
    let code: S3ErrorCode = code.parse().unwrap_or(S3ErrorCode::InternalError);
    let mut err = S3Error::with_message(code, message);
    err.set_status_code(status);
    err
}

/// The 404 (`NoSuchKey`, the latest version is a delete marker) or 405
/// (`MethodNotAllowed`, a delete marker named by `versionId`) S3 answers
/// for a delete marker, with `x-amz-delete-marker: true` and the marker's
/// `x-amz-version-id` (S3 "Working with delete markers").
pub fn delete_marker_error(marker: &pb::ObjectRecord, named: bool) -> S3Error {
    let (code, message) = if named {
        (
            S3ErrorCode::MethodNotAllowed,
            "The specified method is not allowed against this resource.",
        )
    } else {
        (S3ErrorCode::NoSuchKey, "The specified key does not exist.")
    };
    let mut err = S3Error::with_message(code, message);
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-amz-delete-marker",
        http::HeaderValue::from_static("true"),
    );
    if let Ok(v) = http::HeaderValue::from_str(sluice_meta_client::version_id::shown_id(marker)) {
        headers.insert("x-amz-version-id", v);
    }
    err.set_headers(headers);
    err
}

/// The `x-amz-version-id` of a stored version: `None` for a record written
/// while its bucket was unversioned (`seq` 0, a `null` version that may
/// predate versioning), else its id or `null`.
pub fn version_header(record: &pb::ObjectRecord) -> Option<String> {
    (record.seq != 0 || !record.version_id.is_empty())
        .then(|| sluice_meta_client::version_id::shown_id(record).to_string())
}

/// The `x-amz-version-id` of a write or delete from meta's answer ("" when
/// the bucket was never versioned).
pub fn reported_version(version_id: String) -> Option<String> {
    (!version_id.is_empty()).then_some(version_id)
}

/// `InvalidArgument` (400) with a message.
pub fn invalid_argument(message: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, message.into())
}

/// `InvalidRequest` (400) with a message.
pub fn invalid_request(message: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, message.into())
}

/// `InternalError` (500) for a broken invariant; the detail is logged, not sent.
pub fn internal(what: &str) -> S3Error {
    tracing::error!(what, "internal error");
    S3Error::with_message(
        S3ErrorCode::InternalError,
        "We encountered an internal error. Please try again.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::checksum::ChecksumAlgorithm;

    fn refused(code: ErrorCode) -> S3Error {
        meta_error(MetaError::Refused {
            code,
            message: "m".into(),
        })
    }

    #[test]
    fn meta_errors_map_to_s3_codes_and_statuses() {
        let table = [
            (ErrorCode::NoSuchBucket, "NoSuchBucket", 404),
            (ErrorCode::NoSuchKey, "NoSuchKey", 404),
            (ErrorCode::NoSuchUpload, "NoSuchUpload", 404),
            (ErrorCode::BucketNotEmpty, "BucketNotEmpty", 409),
            (
                ErrorCode::BucketAlreadyOwnedByYou,
                "BucketAlreadyOwnedByYou",
                409,
            ),
            (ErrorCode::InvalidPart, "InvalidPart", 400),
            (ErrorCode::InvalidPartOrder, "InvalidPartOrder", 400),
            (ErrorCode::EntityTooSmall, "EntityTooSmall", 400),
            (ErrorCode::InvalidArgument, "InvalidArgument", 400),
            (ErrorCode::NoSuchVersion, "NoSuchVersion", 404),
            (ErrorCode::MethodNotAllowed, "MethodNotAllowed", 405),
            (ErrorCode::NotLeader, "ServiceUnavailable", 503),
            (ErrorCode::Internal, "InternalError", 500),
        ];
        for (code, name, status) in table {
            let e = refused(code);
            assert_eq!(e.code().as_str(), name, "{code:?}");
            assert_eq!(
                e.status_code().map(|s| s.as_u16()),
                Some(status),
                "{code:?}"
            );
        }
        assert_eq!(
            refused(ErrorCode::NoSuchKey).message(),
            Some("The specified key does not exist.")
        );
        assert_eq!(refused(ErrorCode::InvalidPart).message(), Some("m"));
        let e = meta_error(MetaError::Unavailable("no leader".into()));
        assert_eq!(e.code(), &S3ErrorCode::ServiceUnavailable);
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }

    fn retry_after(e: &S3Error) -> Option<&[u8]> {
        e.headers()
            .and_then(|h| h.get("retry-after"))
            .map(|v| v.as_bytes())
    }

    #[test]
    fn a_commit_of_a_closed_epoch_is_a_retryable_503() {
        let e = meta_error(MetaError::Refused {
            code: ErrorCode::EpochClosed,
            message: "epoch 7 is closed".into(),
        });
        assert_eq!(e.code(), &S3ErrorCode::ServiceUnavailable);
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(e.message(), Some("write epoch lost; retry"));
        assert_eq!(retry_after(&e), Some(&b"1"[..]));
    }

    #[test]
    fn a_full_session_table_is_a_slow_down_with_retry_after() {
        let e = refused(ErrorCode::SlowDown);
        assert_eq!(e.code(), &S3ErrorCode::SlowDown);
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(e.message(), Some("Please reduce your request rate."));
        assert_eq!(retry_after(&e), Some(&b"1"[..]));
    }

    #[test]
    fn too_few_writable_datanodes_is_a_503() {
        let e = blob_error(BlobError::NotEnoughWritable {
            writable: 4,
            needed: 5,
        });
        assert_eq!(e.code(), &S3ErrorCode::ServiceUnavailable);
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(
            e.message(),
            Some(
                "not enough writable datanodes: 4 writable, 5 needed (datanodes full or below their free-space reserve)"
            )
        );
        assert_eq!(retry_after(&e), Some(&b"1"[..]));
    }

    #[test]
    fn blob_errors_map_to_s3_codes_and_statuses() {
        let e = blob_error(BlobError::NotEnoughDatanodes { live: 3, needed: 6 });
        assert_eq!(
            (e.code(), e.status_code()),
            (
                &S3ErrorCode::ServiceUnavailable,
                Some(StatusCode::SERVICE_UNAVAILABLE)
            )
        );
        let e = blob_error(BlobError::QuorumNotReached {
            durable: 4,
            needed: 5,
        });
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
        let e = blob_error(BlobError::TooFewShards {
            blob_id: "b".into(),
            reason: "3 of 4 shards readable".into(),
        });
        assert_eq!(
            (e.code(), e.status_code()),
            (
                &S3ErrorCode::ServiceUnavailable,
                Some(StatusCode::SERVICE_UNAVAILABLE)
            )
        );
        let e = blob_error(BlobError::Unreadable {
            blob_id: "b".into(),
            reason: "r".into(),
        });
        assert_eq!(
            (e.code(), e.status_code()),
            (
                &S3ErrorCode::InternalError,
                Some(StatusCode::INTERNAL_SERVER_ERROR)
            )
        );

        let bad = std::io::Error::other(DigestMismatch::Checksum(ChecksumAlgorithm::Crc32));
        let e = blob_error(BlobError::Body(bad));
        assert_eq!(
            (e.code(), e.status_code()),
            (&S3ErrorCode::BadDigest, Some(StatusCode::BAD_REQUEST))
        );
        assert_eq!(
            e.message(),
            Some("The CRC32 you specified did not match the calculated checksum.")
        );

        let sig = std::io::Error::other("AwsChunkedStreamError: SignatureMismatch");
        let e = blob_error(BlobError::Body(sig));
        assert_eq!(
            (e.code(), e.status_code()),
            (
                &S3ErrorCode::SignatureDoesNotMatch,
                Some(StatusCode::FORBIDDEN)
            )
        );

        let sha = std::io::Error::other("UploadStreamError: Sha256Mismatch");
        let e = blob_error(BlobError::Body(sha));
        assert_eq!(e.code().as_str(), "XAmzContentSHA256Mismatch");
        assert_eq!(e.status_code(), Some(StatusCode::BAD_REQUEST));

        for err in [
            BlobError::BufferStall {
                waited: std::time::Duration::from_secs(30),
            },
            BlobError::DatanodesBusy {
                waited: std::time::Duration::from_secs(30),
            },
        ] {
            let e = blob_error(err);
            assert_eq!(
                (e.code(), e.status_code()),
                (
                    &S3ErrorCode::SlowDown,
                    Some(StatusCode::SERVICE_UNAVAILABLE)
                )
            );
            assert_eq!(
                e.headers()
                    .and_then(|h| h.get("retry-after"))
                    .map(|v| v.as_bytes()),
                Some(&b"1"[..])
            );
        }
        // A stall of the read side of a copy reaches the write path as a body error.
        let copy = std::io::Error::other(BlobError::BufferStall {
            waited: std::time::Duration::from_millis(5),
        });
        assert_eq!(
            blob_error(BlobError::Body(copy)).code(),
            &S3ErrorCode::SlowDown
        );

        let gone = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection reset");
        let e = blob_error(BlobError::Body(gone));
        assert_eq!(
            (e.code(), e.status_code()),
            (&S3ErrorCode::IncompleteBody, Some(StatusCode::BAD_REQUEST))
        );
    }

    #[test]
    fn standard_messages() {
        assert_eq!(
            standard_message(&S3ErrorCode::InvalidBucketName),
            Some("The specified bucket is not valid.")
        );
        assert_eq!(standard_message(&S3ErrorCode::InvalidTag), None);
    }

    #[test]
    fn s3_only_errors_have_their_statuses() {
        let cases = [
            (S3Error::new(S3ErrorCode::InvalidRange), 416),
            (S3Error::new(S3ErrorCode::PreconditionFailed), 412),
            (S3Error::new(S3ErrorCode::NotModified), 304),
            (S3Error::new(S3ErrorCode::InvalidBucketName), 400),
            (S3Error::new(S3ErrorCode::SlowDown), 503),
            (invalid_argument("x"), 400),
            (invalid_request("x"), 400),
            (
                custom("InvalidPartNumber", StatusCode::RANGE_NOT_SATISFIABLE, "x"),
                416,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(
                e.status_code().map(|s| s.as_u16()),
                Some(status),
                "{}",
                e.code().as_str()
            );
        }
    }
}
