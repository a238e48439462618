//! Errors of the harness.

use std::path::PathBuf;

/// A boxed source error (S3 SDK errors are generic types).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the harness's set-up steps can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A `--pids` list could not be parsed.
    #[error("invalid --pids `{spec}`: {reason}")]
    InvalidPids {
        /// The list as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `/proc/PID/status` exists but could not be read.
    #[error("read {path}")]
    ReadProc {
        /// The status file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The target bucket could not be checked or created.
    #[error("prepare bucket `{bucket}`")]
    Bucket {
        /// Bucket name.
        bucket: String,
        /// The S3 SDK error.
        #[source]
        source: BoxError,
    },
}
