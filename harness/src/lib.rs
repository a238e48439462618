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

pub mod cluster;
pub mod data;
pub mod dev;
pub mod error;
pub mod fake_s3;
pub mod rss;
pub mod s3;

pub use error::HarnessError;
