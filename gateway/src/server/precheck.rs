//! Requests refused before admission and before s3s reads them: what can
//! be told from the head alone (see [`precheck`]).

use http::{Request, StatusCode};

/// Longest validity of a presigned URL, `X-Amz-Expires`, in seconds (7 days).
pub const MAX_PRESIGNED_EXPIRES_SECS: i64 = 604_800;

/// Seconds since the Unix epoch by this machine's clock.
pub(super) fn now_unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Rules s3s does not apply, checked before a request is admitted; the
/// error (status, code, message) to answer, if `req` breaks one:
///
/// * a presigned URL valid for more than 7 days (SigV4 `X-Amz-Expires`
///   over 604800 or negative, or a SigV2 `Expires` more than 7 days ahead)
///   -> 403 `AccessDenied`
///   (<https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html>);
/// * an `OPTIONS` request (a CORS preflight) without `Origin` -> 400
///   `BadRequest` (<https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html>;
///   with one, [`SluiceService`] evaluates the bucket's CORS rules);
/// * a request asking for server-side encryption (any
///   `x-amz-server-side-encryption*` or
///   `x-amz-copy-source-server-side-encryption-*` header: SSE-S3, SSE-KMS,
///   SSE-C) -> 501 `NotImplemented`: Sluice does not encrypt at rest, and
///   storing the object in the clear while the client believes otherwise
///   would be worse than refusing.
pub fn precheck<B>(req: &Request<B>) -> Option<(StatusCode, &'static str, &'static str)> {
    if req.headers().keys().any(|name| {
        let name = name.as_str();
        name.starts_with("x-amz-server-side-encryption")
            || name.starts_with("x-amz-copy-source-server-side-encryption")
    }) {
        return Some((
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "Server-side encryption is not supported.",
        ));
    }
    if *req.method() == http::Method::OPTIONS && !req.headers().contains_key(http::header::ORIGIN) {
        return Some((
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Insufficient information. Origin request header needed.",
        ));
    }
    let query = req.uri().query()?;
    let param = |wanted: &str| {
        query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(name, _)| *name == wanted)
            .map(|(_, value)| value)
    };
    // SigV2 query auth (boto3's default for presigned URLs) names the
    // expiry as a time, in Unix seconds; s3s refuses it once past.
    if param("Signature").is_some()
        && let Some(at) = param("Expires").and_then(|v| v.parse::<i64>().ok())
        && at - now_unix_secs() > MAX_PRESIGNED_EXPIRES_SECS
    {
        return Some((
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "Expires must be less than a week (in seconds) from now",
        ));
    }
    let expires = param("X-Amz-Expires")?;
    match expires.parse::<i64>() {
        Ok(secs) if secs < 0 => Some((
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "X-Amz-Expires must be non-negative",
        )),
        Ok(secs) if secs > MAX_PRESIGNED_EXPIRES_SECS => Some((
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "X-Amz-Expires must be less than a week (in seconds) that is; 604800",
        )),
        // Anything else is s3s's to judge.
        _ => None,
    }
}

/// Whether `req` announces a body: `Transfer-Encoding`, or a
/// `Content-Length` above zero.
pub(super) fn has_body<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(http::header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}
