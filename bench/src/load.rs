//! The timed load phase every workload (`multipart-put`, `put`, `get`)
//! shares: the counters its workers report into ([`Meter`]), the sampler
//! that appends one row a second to `samples.csv`, the end of the phase
//! (the deadline, every worker done, or a stop signal), the server CPU read
//! at both ends of it ([`ServerCpu`]), and the setup and output steps around
//! it.
//!
//! Only what ends successfully before the deadline is counted; requests in
//! flight at the deadline are dropped with their worker, as warp does.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_s3::error::DisplayErrorContext;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::data::splitmix64;
use crate::error::BenchError;
use crate::report::ServerCpu;
use crate::rss::{ProcTarget, read_cpu_ticks};
use crate::s3::{ClientOptions, ErrorTally, SLOW_DOWN, build_client, ensure_bucket};
use crate::samples::{Sample, SamplesWriter, bytes_to_mib};
use crate::stats::{LatencyStats, LatencySummary, mib_per_s};

/// Failed requests logged individually before logging only every 100th.
const LOGGED_FAILURES: u64 = 20;
/// Pause after a failed upload or request before the worker starts the
/// next one, doubling up to [`MAX_FAILURE_BACKOFF`] (the SDK has already
/// retried; this keeps a worker from spinning against a dead endpoint).
pub const FIRST_FAILURE_BACKOFF: Duration = Duration::from_millis(100);
/// Cap of the pause after repeated failures.
pub const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(2);

/// Interval between two samples (throughput and RSS).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// A progress line (mean throughput so far) is logged every this many samples.
const PROGRESS_LOG_EVERY: usize = 10;

/// Counters of the timed requests, shared by the workers and the sampler.
#[derive(Debug)]
pub struct Meter {
    deadline: Instant,
    bytes: AtomicU64,
    ops: AtomicU64,
    latency: Mutex<LatencyStats>,
    failed_requests: Mutex<BTreeMap<String, u64>>,
    failures_seen: AtomicU64,
    buffers_allocated: AtomicU64,
}

impl Meter {
    /// Counters of a phase that ends at `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            bytes: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            latency: Mutex::new(LatencyStats::new()),
            failed_requests: Mutex::new(BTreeMap::new()),
            failures_seen: AtomicU64::new(0),
            buffers_allocated: AtomicU64::new(0),
        }
    }

    /// Records a successful timed request that moved `bytes`, unless it
    /// ended after the deadline (the run is over; warp drops such late
    /// results too). Returns whether it was recorded.
    pub fn op_done(&self, bytes: u64, latency: Duration) -> bool {
        if self.past_deadline() {
            return false;
        }
        self.latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(latency);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Records a request that failed after all attempts (not after the
    /// deadline), logging the first few and then every 100th.
    pub fn request_failed(
        &self,
        operation: &'static str,
        key: &str,
        error: impl std::error::Error,
    ) {
        if self.past_deadline() {
            return;
        }
        {
            let mut map = self
                .failed_requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *map.entry(operation.to_owned()).or_default() += 1;
        }
        let seen = self.failures_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen <= LOGGED_FAILURES || seen.is_multiple_of(100) {
            tracing::warn!(operation, key, failures = seen, error = %DisplayErrorContext(&error), "request failed after all attempts");
        }
    }

    /// Whether the deadline has passed: a worker starts no request then (the
    /// timer that drops it may fire a moment later).
    pub fn past_deadline(&self) -> bool {
        Instant::now() > self.deadline
    }

    /// Counts one payload buffer allocated.
    pub fn buffer_allocated(&self) {
        self.buffers_allocated.fetch_add(1, Ordering::Relaxed);
    }

    /// Timed requests recorded so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Bytes of those requests.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Payload buffers allocated so far.
    pub fn buffers_allocated(&self) -> u64 {
        self.buffers_allocated.load(Ordering::Relaxed)
    }

    /// Latency percentiles of the recorded requests.
    pub fn latency(&self) -> LatencySummary {
        self.latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary()
    }

    /// Requests that failed after all attempts, by operation.
    pub fn failed_requests(&self) -> BTreeMap<String, u64> {
        self.failed_requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What the sampler reads each second.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    /// The workers' counters.
    pub meter: &'a Meter,
    /// Error responses of the run's client.
    pub tally: &'a ErrorTally,
    /// Processes whose RSS (each sample) and CPU (both ends) are read.
    pub targets: &'a [ProcTarget],
}

/// What a finished load phase measured.
#[derive(Debug)]
pub struct Measured {
    /// One row a second (the last one may cover a partial second).
    pub samples: Vec<Sample>,
    /// From the start to the deadline, or to when every worker stopped or
    /// the stop came if that was earlier.
    pub elapsed: Duration,
    /// CPU of the sampled processes between the start and that end, per
    /// recorded request and per GiB.
    pub server_cpu: ServerCpu,
}

/// A load phase in progress: its clock, the server CPU at its start and
/// its workers.
#[derive(Debug)]
pub struct LoadPhase {
    start: Instant,
    deadline: Instant,
    cpu_before: Vec<Option<u64>>,
    workers: JoinSet<()>,
}

impl LoadPhase {
    /// Starts a phase of `duration` now, reading the CPU of `targets` first.
    pub fn begin(duration: Duration, targets: &[ProcTarget]) -> Self {
        let cpu_before = read_cpu_ticks(targets);
        let start = Instant::now();
        Self {
            start,
            deadline: start + duration,
            cpu_before,
            workers: JoinSet::new(),
        }
    }

    /// When the phase ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Runs `worker` until it returns or the deadline drops it.
    pub fn spawn(&mut self, worker: impl Future<Output = ()> + Send + 'static) {
        let deadline = self.deadline;
        self.workers.spawn(async move {
            // Elapsed = dropped at the deadline, with whatever it had in flight.
            let _ = tokio::time::timeout_at(deadline, worker).await;
        });
    }

    /// Samples every second into `csv` until the deadline, until every
    /// worker has stopped, or until `stop` holds `true` (then the workers
    /// are dropped at once); reads the server CPU at that end; waits until
    /// every worker is gone (its connections closed), so none outlives the
    /// phase.
    ///
    /// # Errors
    /// [`BenchError::WriteOutput`] when `csv` cannot be written.
    pub async fn finish(
        self,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
        probe: Probe<'_>,
        csv: &mut SamplesWriter,
    ) -> Result<Measured, BenchError> {
        let Self {
            start,
            deadline,
            cpu_before,
            mut workers,
        } = self;
        let (all_done_tx, all_done_rx) = tokio::sync::oneshot::channel();
        let (abort_tx, abort_rx) = tokio::sync::oneshot::channel::<()>();
        let joiner = tokio::spawn(async move {
            let aborted = tokio::select! {
                biased;
                Ok(()) = abort_rx => true,
                () = async { while workers.join_next().await.is_some() {} } => false,
            };
            if aborted {
                workers.shutdown().await;
            } else {
                let _ = all_done_tx.send(Instant::now());
            }
        });
        let (samples, end, stopped) = sample_until(
            start,
            deadline,
            all_done_rx,
            stop_requested(stop),
            probe,
            csv,
        )
        .await?;
        let cpu_after = read_cpu_ticks(probe.targets);
        if stopped {
            let _ = abort_tx.send(());
        }
        match joiner.await {
            Err(e) if !e.is_cancelled() => {
                tracing::error!(error = %e, "worker joiner ended abnormally");
            }
            _ => {}
        }
        let server_cpu = ServerCpu::between(
            probe.targets,
            &cpu_before,
            &cpu_after,
            probe.meter.ops(),
            probe.meter.bytes(),
        );
        Ok(Measured {
            samples,
            elapsed: end - start,
            server_cpu,
        })
    }
}

/// Resolves once `stop` holds `true`; never without a receiver, or when its
/// sender is gone without having said stop.
async fn stop_requested(stop: Option<tokio::sync::watch::Receiver<bool>>) {
    match stop {
        Some(mut rx) => {
            if rx.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Takes one sample per second until `deadline`, until `all_done`
/// resolves (every worker stopped) or until `stop` resolves, appending each
/// to `csv`. Returns the samples, the end of the load phase (`deadline`, or
/// when the workers stopped or the stop came if that was earlier; then a
/// last sample covers the partial second) and whether `stop` ended it.
async fn sample_until(
    start: Instant,
    deadline: Instant,
    mut all_done: tokio::sync::oneshot::Receiver<Instant>,
    stop: impl Future<Output = ()>,
    probe: Probe<'_>,
    csv: &mut SamplesWriter,
) -> Result<(Vec<Sample>, Instant, bool), BenchError> {
    let Probe {
        meter,
        tally,
        targets,
    } = probe;
    let mut stop = std::pin::pin!(stop);
    let mut stopped = false;
    let mut ticker = tokio::time::interval_at(start + SAMPLE_INTERVAL, SAMPLE_INTERVAL);
    // Ticks stay on start + k seconds; a tick missed by more than a period
    // (an overloaded machine) is skipped and the next sample covers the
    // longer interval, its throughput divided by the real elapsed time.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut samples = Vec::new();
    let mut last_at = start;
    let mut last_bytes = 0;
    let mut end = deadline;
    loop {
        let (now, last) = tokio::select! {
            scheduled = ticker.tick() => {
                if scheduled > deadline {
                    break;
                }
                (Instant::now().min(deadline), false)
            }
            done = &mut all_done => {
                // A closed channel means the joiner is gone: end now too.
                end = done.unwrap_or_else(|_| Instant::now()).min(deadline);
                if end <= last_at {
                    break;
                }
                (end, true)
            }
            () = &mut stop => {
                stopped = true;
                end = Instant::now().min(deadline);
                if end <= last_at {
                    break;
                }
                (end, true)
            }
        };
        let bytes = meter.bytes();
        let rss_mib = targets
            .iter()
            .map(|t| match t.rss_bytes() {
                Ok(rss) => rss.map(bytes_to_mib),
                Err(e) => {
                    tracing::warn!(process = %t.name, pid = t.pid, error = %e, "cannot sample RSS");
                    None
                }
            })
            .collect();
        let sample = Sample {
            elapsed_s: (now - start).as_secs_f64(),
            mib_per_s: mib_per_s(bytes.saturating_sub(last_bytes), now - last_at),
            ops_done: meter.ops(),
            errors: tally.total(),
            rss_mib,
        };
        csv.write(&sample)?;
        if samples.len() % PROGRESS_LOG_EVERY == PROGRESS_LOG_EVERY - 1 {
            tracing::info!(
                elapsed_s = sample.elapsed_s.round(),
                mib_per_s = format!("{:.1}", mib_per_s(bytes, now - start)),
                done = sample.ops_done,
                errors = sample.errors,
                slowdown = tally.count(SLOW_DOWN),
                "progress"
            );
        }
        samples.push(sample);
        last_at = now;
        last_bytes = bytes;
        if last {
            break;
        }
    }
    Ok((samples, end, stopped))
}

/// A seed for this run's payloads and keys: the clock and the process id,
/// spread.
pub fn new_run_seed() -> u64 {
    splitmix64(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()),
    )
}

/// Creates `out_dir` (and its parents) if missing.
///
/// # Errors
/// [`BenchError::WriteOutput`] when it cannot be created.
pub fn create_out_dir(out_dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(out_dir).map_err(|source| BenchError::WriteOutput {
        path: out_dir.to_owned(),
        source,
    })
}

/// A client for `options` whose error responses are counted in the
/// returned tally, and `bucket` created if missing; the setup's own error
/// responses (HeadBucket 404) are not counted.
///
/// # Errors
/// [`HarnessError::Bucket`](sluice_harness::HarnessError::Bucket) when the bucket neither exists nor can be created.
pub async fn connect(
    options: &ClientOptions,
    bucket: &str,
) -> Result<(aws_sdk_s3::Client, Arc<ErrorTally>), BenchError> {
    let tally = Arc::new(ErrorTally::default());
    let client = build_client(options, Arc::clone(&tally));
    let created = ensure_bucket(&client, bucket, &options.region).await?;
    tracing::info!(bucket, created, "bucket ready");
    tally.reset();
    Ok((client, tally))
}

/// Writes `summary` as pretty JSON to `out_dir/summary.json`.
///
/// # Errors
/// [`BenchError::Json`] or [`BenchError::WriteOutput`].
pub fn write_summary(out_dir: &Path, summary: &impl Serialize) -> Result<(), BenchError> {
    let path = out_dir.join("summary.json");
    let json = serde_json::to_string_pretty(summary)?;
    std::fs::write(&path, json + "\n").map_err(|source| BenchError::WriteOutput { path, source })
}
