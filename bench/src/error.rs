//! Errors of the benchmark library.

use std::path::PathBuf;

pub use sluice_harness::error::BoxError;

/// What can stop a benchmark run before or after the load phase. Errors of
/// individual S3 requests during the load phase are not here: they are
/// counted by S3 code in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag value is out of the range S3 or the benchmark accepts.
    #[error("invalid --{flag}: {reason}")]
    InvalidOption {
        /// Flag name without dashes.
        flag: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An output file (CSV, JSON, SVG) or the output directory could not be written.
    #[error("write {path}")]
    WriteOutput {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A samples CSV could not be parsed back.
    #[error("parse samples CSV line {line}: {reason}")]
    ParseSamples {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `summary.json` could not be serialised.
    #[error("serialise summary")]
    Json(#[from] serde_json::Error),
    /// The chart could not be drawn.
    #[error("draw chart {path}")]
    Chart {
        /// The SVG file.
        path: PathBuf,
        /// The plotters error.
        #[source]
        source: BoxError,
    },
    /// `get` could not write one of the objects it reads.
    #[error("write seed object `{key}`")]
    Seed {
        /// Object key.
        key: String,
        /// The S3 SDK error.
        #[source]
        source: BoxError,
    },
    /// A harness step: a `--pids` list, a `/proc` read, the bucket.
    #[error(transparent)]
    Harness(#[from] sluice_harness::HarnessError),
}
