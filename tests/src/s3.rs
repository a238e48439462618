//! S3 assertions the integration tests share.

use std::fmt::Debug;

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use bytes::Bytes;

/// Fails unless `res` is an S3 error with HTTP `status` and, when given,
/// error `code`. Returns the error for further checks.
pub fn expect_error<T: Debug, E>(
    what: &str,
    res: std::result::Result<T, SdkError<E>>,
    status: u16,
    code: Option<&str>,
) -> Result<SdkError<E>>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let err = match res {
        Ok(v) => bail!("{what}: succeeded with {v:?}, want HTTP {status} {code:?}"),
        Err(e) => e,
    };
    let got_status = err.raw_response().map(|r| r.status().as_u16());
    let got_code = err.code().map(str::to_string);
    if got_status != Some(status) || (code.is_some() && got_code.as_deref() != code) {
        bail!(
            "{what}: got HTTP {got_status:?} code {got_code:?}, want HTTP {status} {code:?}; error: {}",
            aws_sdk_s3::error::DisplayErrorContext(&err)
        );
    }
    Ok(err)
}

/// Reads a whole object.
pub async fn get_all(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Bytes> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .with_context(|| format!("GET {bucket}/{key}"))?;
    let len = out.content_length();
    let body = out
        .body
        .collect()
        .await
        .with_context(|| format!("read body of {bucket}/{key}"))?
        .into_bytes();
    ensure!(
        len == Some(body.len() as i64),
        "GET {bucket}/{key}: Content-Length {len:?} but {} body bytes",
        body.len()
    );
    Ok(body)
}
