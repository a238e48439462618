//! Errors that stop a soak run. A shape that runs to its end but misses a
//! bound is not an error: it is a FAIL verdict.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{BenchError, BoxError};

/// What can stop `sluice-bench soak` before it reaches a verdict.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// Options, load phase or output files (see [`BenchError`]).
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// Less free disk space than `--min-free-disk`.
    #[error(
        "only {free_mib} MiB free in {path}, {required_mib} MiB required (--min-free-disk)",
        free_mib = free / (1 << 20),
        required_mib = required / (1 << 20)
    )]
    NotEnoughDisk {
        /// The work dir.
        path: PathBuf,
        /// Free bytes available to this user.
        free: u64,
        /// Bytes required.
        required: u64,
    },
    /// statvfs(2) of the work dir failed.
    #[error("statvfs {path}")]
    Statvfs {
        /// The work dir.
        path: PathBuf,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// A directory or file of the run could not be created, written or removed.
    #[error("{action} {path}")]
    Filesystem {
        /// What was being done: "create", "write", "remove".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The `sluice` binary is missing.
    #[error("sluice binary {path} not found (build it, or pass --sluice-bin)")]
    MissingBinary {
        /// The path tried.
        path: PathBuf,
    },
    /// The `sluice` binary could not be started.
    #[error("start {name} ({path})")]
    Spawn {
        /// Process name: `meta`, `dn1`..`dn6`, `gateway`, or `probe-<role>`.
        name: String,
        /// The binary.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `sluice admin certs` failed while making the cluster's certificates.
    #[error("{command}: {message}")]
    Certs {
        /// The command line.
        command: String,
        /// Its exit status and stderr, or the I/O error.
        message: String,
    },
    /// A knob given on the command line names a config key that this
    /// `sluice` binary does not accept.
    #[error("--{flag}: this sluice binary's {role} config has no `{key}`")]
    UnsupportedKnob {
        /// The flag, without dashes.
        flag: &'static str,
        /// Role whose config lacks the key.
        role: &'static str,
        /// The config key.
        key: &'static str,
    },
    /// No free loopback port could be reserved.
    #[error("reserve a loopback port")]
    Port(#[source] std::io::Error),
    /// A role config could not be serialised.
    #[error("serialise the {role} config")]
    Toml {
        /// The role.
        role: &'static str,
        /// The serialiser error.
        #[source]
        source: toml::ser::Error,
    },
    /// A cluster process exited while the cluster was starting.
    #[error("{name} exited during startup ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// Process name.
        name: String,
        /// Exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of the log.
        tail: String,
    },
    /// A cluster operation named a process the cluster does not have.
    #[error("the cluster has no process `{name}`")]
    NoSuchProcess {
        /// The name asked for.
        name: String,
    },
    /// A restart was asked for a process that is still running.
    #[error("{name} is still running; kill it before starting it again")]
    StillRunning {
        /// Process name.
        name: String,
    },
    /// A restarted process did not listen on its port in time.
    #[error("{name} restarted but does not listen on port {port} after {waited:?}")]
    RestartNotReady {
        /// Process name.
        name: String,
        /// Its main port.
        port: u16,
        /// How long the harness waited.
        waited: Duration,
    },
    /// The cluster did not accept a write within `--ready-timeout`.
    #[error("cluster not writable after {waited:?}")]
    NotReady {
        /// How long the harness waited.
        waited: Duration,
        /// The last error of the readiness probe.
        #[source]
        source: BoxError,
    },
}
