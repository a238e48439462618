//! `sluice-harness`: what the black-box tools share, and nothing of a
//! role. `sluice-bench` (and its soak smoke test) and `sluice-chaos`
//! drive Sluice from outside, through S3 and the `sluice` binary, and so do
//! the `sluice` binary's end-to-end tests; this
//! crate holds the pieces they have in common and depends on no Sluice
//! crate, so a role crate may take it as a dev-dependency (the datanode's
//! `gc-pass` example reads its peak RSS with [`rss`]).
//!
//! * [`s3`] — SDK client set-up (retry, timeouts, a custom CA) and the
//!   interceptor that counts every error response by S3 code.
//! * [`data`] — seeded pseudo-random payloads.
//! * [`rss`] — `/proc/PID/status` `VmRSS` and `/proc/PID/stat` CPU sampling.
//! * [`cluster`] — the launcher of `sluice` role processes: ports, cluster
//!   certificates by `sluice admin certs`, spawn with a log file, stop,
//!   kill, readiness.
//! * [`dev`] — `sluice dev` as a process, for the binary's end-to-end
//!   tests: its banner, its admin certificate, Ctrl-C.
//! * [`fake_s3`] — a minimal in-process S3 endpoint for tool tests.
//! * [`init_logging`] — the tools' log set-up.

pub mod cluster;
pub mod data;
pub mod dev;
pub mod error;
pub mod fake_s3;
pub mod rss;
pub mod s3;

pub use error::HarnessError;

/// Logs to stderr at `RUST_LOG`'s filter (default `info`), in colour only
/// on a terminal: the set-up of every tool's `main` (bench, chaos, the
/// roles' simulation examples).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
