//! `sluice-bench`: a load generator for S3 endpoints.
//!
//! `multipart-put` reproduces MinIO warp's benchmark of the same name:
//! `--concurrent` workers, each repeatedly creating a multipart upload,
//! uploading `--parts` parts of `--part-size` fresh pseudo-random bytes with
//! `--part-concurrent` in flight, and completing it, until `--duration` has
//! elapsed. Only UploadPart is timed. Every second it samples throughput
//! and the RSS of given server processes; at the end it reports
//! throughput, latency percentiles and error responses by S3 code, and
//! writes `samples.csv`, `summary.json` and `chart.svg`.
//!
//! `put` and `get` reproduce warp's benchmarks of those names:
//! `--concurrent` workers loop PutObject of fresh `--obj-size` objects, or
//! GetObject of `--objects` objects written beforehand, for `--duration`;
//! they report like `multipart-put` and delete what they wrote at the end
//! (see [`objects`]). All three also report the CPU time the `--pids`
//! processes used during the load, per request and per GiB.
//!
//! `soak` starts a multi-process Sluice cluster and runs the soak
//! shapes (seed, SDK-default, overload) with that engine, judging each by
//! RSS, errors, SlowDown and byte-identical read-back (see [`soak`] and
//! bench/README.md#the-soak-benchmark).
//!
//! `heal` starts the same cluster, writes a seeded data set, wipes one
//! datanode and follows the gateway's heal through `/metrics` until the
//! node holds its share again, then reads everything back with two other
//! nodes down (see [`heal`]).
//!
//! `meta-load` starts three meta voters and measures the metadata path at
//! a given number of objects: Raft write rate, listing and head latency at
//! the start, middle and end of the bucket, snapshot build and a replacement
//! voter's catch-up (see [`meta_load`]).
//!
//! The white-box simulations live beside the role they exercise:
//! `cargo run -p sluice-gateway --release --example placement-sim` (the
//! gateway's placement and heal-target code over simulated clusters) and
//! `cargo run -p sluice-datanode --release --example gc-pass` (one pass of
//! the datanode's GC over a real store of a million shard files).
//!
//! # Layout
//! * [`multipart`] — the `multipart-put` workload: options, workers, the run.
//! * [`objects`] — the `put` and `get` workloads and their cleanup.
//! * [`meta_load`] — the `meta-load` benchmark of the metadata path.
//! * [`load`] — the timed load phase they share: counters, the per-second
//!   sampler, server CPU at both ends, setup and output steps.
//! * [`s3`], [`data`], [`rss`] — from `sluice-harness`: SDK client setup
//!   and the error tally by S3 code, pseudo-random payloads, `--pids`
//!   parsing and `/proc` RSS and CPU sampling.
//! * [`completed`] — completed uploads and the bytes they must hold.
//! * [`verify`] — reading completed uploads back, byte for byte.
//! * [`stats`] — HDR latency percentiles, throughput arithmetic.
//! * [`samples`] — the `samples.csv` format (write and parse).
//! * [`report`] — the end-of-run summaries (`summary.json` and stdout text).
//! * [`chart`] — `chart.svg` (throughput and RSS over time).
//! * [`soak`] — the soak benchmark: cluster, shapes, verdicts.
//! * [`heal`] — the heal benchmark: wipe a datanode, follow the rebuild.
//! * [`error`] — [`BenchError`].

pub mod chart;
pub mod completed;
pub mod error;
pub mod heal;
pub mod load;
pub mod meta_load;
pub mod objects;
pub mod samples;
pub mod stats;

pub mod multipart;
pub mod report;
pub mod soak;
pub mod verify;
pub use error::BenchError;
pub use sluice_harness::{data, rss, s3};
