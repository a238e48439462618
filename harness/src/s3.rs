//! S3 client setup and error accounting.
//!
//! The client uses the SDK's standard retry mode, so that the benchmark
//! sees what an ordinary SDK user sees, and an interceptor
//! ([`Intercept::read_after_attempt`]) that tallies the outcome of every
//! attempt: an error response that the SDK then retries (e.g. `503
//! SlowDown`) is counted once per attempt, by its S3 error code.
//!
//! The SDK's retry quota (a token bucket that throttled retries drain) is
//! shared by every client of a process with the same retry partition. Each
//! client built here gets a partition of its own, so that it starts with a
//! full quota like a fresh SDK process: a soak shape that drew hundreds of
//! SlowDowns does not leave the next client unable to retry.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_s3::config::retry::{RetryConfig, RetryPartition};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, ConfigBag, Intercept, Region, RequestChecksumCalculation, RuntimeComponents,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{BoxError, ProvideErrorMetadata};
use aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadError;
use aws_sdk_s3::operation::create_bucket::CreateBucketError;
use aws_sdk_s3::operation::create_multipart_upload::CreateMultipartUploadError;
use aws_sdk_s3::operation::delete_object::DeleteObjectError;
use aws_sdk_s3::operation::delete_objects::DeleteObjectsError;
use aws_sdk_s3::operation::get_object::GetObjectError;
use aws_sdk_s3::operation::head_bucket::HeadBucketError;
use aws_sdk_s3::operation::put_object::PutObjectError;
use aws_sdk_s3::operation::upload_part::UploadPartError;
use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};

use crate::error::HarnessError;

/// The S3 error code of throttling responses (`503 SlowDown`).
pub const SLOW_DOWN: &str = "SlowDown";

/// Request checksum policy, as the SDK's `RequestChecksumCalculation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChecksumMode {
    /// SDK default: uploads carry a CRC32 checksum (aws-chunked body with a trailer).
    WhenSupported,
    /// Only where the operation requires one: UploadPart is sent plain.
    WhenRequired,
}

/// How to reach the endpoint.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Endpoint URL, e.g. `http://127.0.0.1:9000`.
    pub endpoint: String,
    /// PEM file of the CA to trust for an `https://` endpoint instead of
    /// the system roots (like the aws CLI's `--ca-bundle`).
    pub ca_bundle: Option<std::path::PathBuf>,
    /// Signing region.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: String,
    /// Attempts per request, first included (1 = no retries).
    pub max_attempts: u32,
    /// Base of the SDK's exponential retry backoff (SDK default 1 s).
    pub initial_backoff: Duration,
    /// Time limit of one attempt.
    pub attempt_timeout: Duration,
    /// Request checksum policy.
    pub checksum: ChecksumMode,
}

/// Error responses counted by code. Shared by every request of a client.
#[derive(Debug, Default)]
pub struct ErrorTally {
    total: AtomicU64,
    by_code: Mutex<BTreeMap<String, u64>>,
}

impl ErrorTally {
    /// Counts one error response with `code`.
    pub fn record(&self, code: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self.by_code.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry(code.to_owned()).or_default() += 1;
    }

    /// All error responses so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Error responses with `code` so far.
    pub fn count(&self, code: &str) -> u64 {
        let map = self.by_code.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(code).copied().unwrap_or(0)
    }

    /// A copy of the counts by code.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.by_code
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forgets all counts (used after setup requests such as HeadBucket).
    pub fn reset(&self) {
        let mut map = self.by_code.lock().unwrap_or_else(PoisonError::into_inner);
        map.clear();
        self.total.store(0, Ordering::Relaxed);
    }
}

/// Interceptor that records every failed attempt into an [`ErrorTally`].
#[derive(Debug)]
struct CountErrors {
    tally: Arc<ErrorTally>,
}

/// The S3 code of an operation error of one of the operations this tool
/// sends, via the typed error's metadata.
macro_rules! code_of {
    ($err:expr, $($ty:ty),+) => {{
        let err = $err;
        let mut code: Option<String> = None;
        $(
            if code.is_none() {
                if let Some(e) = err.downcast_ref::<$ty>() {
                    code = e.code().map(str::to_owned);
                }
            }
        )+
        code
    }};
}

impl Intercept for CountErrors {
    fn name(&self) -> &'static str {
        "sluice-bench::CountErrors"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Err(err)) = context.output_or_error() else {
            return Ok(());
        };
        let status = context.response().map(|r| r.status().as_u16());
        let code = if let Some(op_err) = err.as_operation_error() {
            code_of!(
                op_err,
                UploadPartError,
                CreateMultipartUploadError,
                CompleteMultipartUploadError,
                DeleteObjectError,
                DeleteObjectsError,
                HeadBucketError,
                CreateBucketError,
                GetObjectError,
                PutObjectError
            )
            .or_else(|| status.map(|s| format!("HTTP{s}")))
            .unwrap_or_else(|| "UnknownServiceError".to_owned())
        } else if err.is_timeout_error() {
            "Timeout".to_owned()
        } else if let Some(conn) = err.as_connector_error() {
            if conn.is_timeout() {
                "ConnectTimeout"
            } else if conn.is_io() {
                "IoError"
            } else {
                "ConnectorError"
            }
            .to_owned()
        } else if err.is_response_error() {
            "ResponseError".to_owned()
        } else {
            "OtherError".to_owned()
        };
        self.tally.record(&code);
        Ok(())
    }
}

/// Numbers the retry partitions of the clients of this process.
static CLIENTS_BUILT: AtomicU64 = AtomicU64::new(0);

/// An HTTPS client trusting only the CA in the PEM file `ca_bundle`.
///
/// # Panics
/// When the file cannot be read or holds no usable certificate: a
/// benchmark given a wrong `--ca-bundle` cannot run at all.
fn https_client(ca_bundle: &std::path::Path) -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::tls;
    let pem = std::fs::read(ca_bundle)
        .unwrap_or_else(|e| panic!("reading the CA bundle {}: {e}", ca_bundle.display()));
    let trust = tls::TrustStore::empty()
        .with_native_roots(false)
        .with_pem_certificate(pem.as_slice());
    let context = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .unwrap_or_else(|e| panic!("TLS context from {}: {e}", ca_bundle.display()));
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https()
}

/// A path-style client for `options` whose failed attempts are counted in
/// `tally`, with a retry partition (and so a retry quota) of its own.
pub fn build_client(options: &ClientOptions, tally: Arc<ErrorTally>) -> aws_sdk_s3::Client {
    let partition = format!(
        "sluice-bench-{}",
        CLIENTS_BUILT.fetch_add(1, Ordering::Relaxed)
    );
    let checksum = match options.checksum {
        ChecksumMode::WhenSupported => RequestChecksumCalculation::WhenSupported,
        ChecksumMode::WhenRequired => RequestChecksumCalculation::WhenRequired,
    };
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&options.endpoint)
        .region(Region::new(options.region.clone()))
        .credentials_provider(Credentials::new(
            &options.access_key,
            &options.secret_key,
            None,
            None,
            "sluice-bench",
        ))
        .force_path_style(true)
        .retry_partition(RetryPartition::new(partition))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(options.max_attempts)
                .with_initial_backoff(options.initial_backoff),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(10))
                .operation_attempt_timeout(options.attempt_timeout)
                .build(),
        )
        // Like warp: a server that applies TCP backpressure (stops reading a
        // body while it waits for buffer space) is waiting, not stalled.
        // `attempt_timeout` still bounds every attempt.
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .request_checksum_calculation(checksum)
        .interceptor(CountErrors { tally });
    let config = match options.ca_bundle.as_deref().map(https_client) {
        Some(http) => config.http_client(http),
        None => config,
    };
    aws_sdk_s3::Client::from_conf(config.build())
}

/// Makes sure `bucket` exists: HeadBucket, then CreateBucket (with a
/// location constraint outside us-east-1) if that fails. Returns whether
/// the bucket was created.
///
/// # Errors
/// [`HarnessError::Bucket`] when the bucket neither exists nor can be created
/// (`BucketAlreadyOwnedByYou` counts as existing).
pub async fn ensure_bucket(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    region: &str,
) -> Result<bool, HarnessError> {
    if client.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(false);
    }
    let mut request = client.create_bucket().bucket(bucket);
    if region != "us-east-1" {
        request = request.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::from(region))
                .build(),
        );
    }
    match request.send().await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => Ok(false),
        Err(e) => Err(HarnessError::Bucket {
            bucket: bucket.to_owned(),
            source: Box::new(e),
        }),
    }
}

#[cfg(test)]
mod tests;
