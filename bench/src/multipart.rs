//! The `multipart-put` workload, after MinIO warp's benchmark of the same
//! name (`warp multipart-put --parts --part.size --concurrent
//! --part.concurrent --duration`).
//!
//! Each of `--concurrent` workers loops: CreateMultipartUpload, UploadPart
//! x `--parts` with up to `--part-concurrent` in flight, CompleteMultipartUpload
//! (unless `--complete false`), DeleteObject (with `--delete-after`). Every
//! part is freshly generated pseudo-random data. At the deadline everything
//! in flight is dropped: unfinished uploads are left as they are, never
//! aborted, as warp leaves them. Only UploadPart is timed, from the first
//! attempt to the final response, SDK retries included. The load phase
//! itself (sampling, server CPU, its end) is [`crate::load`]'s, shared with
//! `put` and `get`.
//!
//! With `--uploads-per-worker N` each worker stops after N uploads and the
//! run ends when every worker has stopped (or at `--duration`, whichever
//! comes first): that is how a fixed batch such as the SDK-default shape is
//! run. A caller of [`run_with`] can also collect every upload that
//! CompleteMultipartUpload acknowledged ([`CompletedLog`]) to read it back.
//!
//! Memory: each in-flight part owns one `--part-size` buffer, reused for the
//! worker's next part when the SDK has released it, so the payload held is
//! at most `concurrent x part_concurrent x part_size`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::BytesMut;
use bytesize::ByteSize;
use clap::ArgAction;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::completed::{CompletedLog, CompletedUpload};
use crate::data::{fill, part_seed};
use crate::error::BenchError;
use crate::load::{
    FIRST_FAILURE_BACKOFF, LoadPhase, MAX_FAILURE_BACKOFF, Meter, Probe, connect, create_out_dir,
    new_run_seed, write_summary,
};
use crate::report::{ProcessRss, Shape, Summary, UploadCounts};
use crate::rss::{ProcTarget, parse_targets};
use crate::s3::{ChecksumMode, ClientOptions, SLOW_DOWN};
use crate::samples::{Counted, SamplesWriter};
use crate::stats::{mib_per_s, per_second};

/// S3 limits on multipart uploads (AWS "Amazon S3 multipart upload limits").
const MAX_PARTS: u32 = 10_000;
/// Largest part S3 accepts, bytes (5 GiB).
const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;
/// Smallest non-final part AWS S3 accepts, bytes (5 MiB); smaller parts are
/// allowed here (other servers may accept them) but warned about.
const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// Flags of `sluice-bench multipart-put`.
#[derive(Debug, Clone, clap::Args)]
pub struct MultipartPutOptions {
    /// S3 endpoint URL, e.g. http://127.0.0.1:9000 (path-style addressing is used).
    #[arg(long)]
    pub endpoint: String,
    /// PEM file of the CA to trust for an https:// endpoint (like the aws
    /// CLI's --ca-bundle); default: the system roots.
    #[arg(long)]
    pub ca_bundle: Option<PathBuf>,
    /// Access key id.
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    pub access_key: String,
    /// Secret access key.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_key: String,
    /// Region to sign for (and the bucket's location constraint when it is created).
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Bucket to upload into; created if missing.
    #[arg(long, default_value = "sluice-bench")]
    pub bucket: String,
    /// Object key prefix; keys are PREFIX/RUN-ID/wWORKER/uUPLOAD (RUN-ID is new for every run).
    #[arg(long, default_value = "multipart-put")]
    pub prefix: String,
    /// Multipart uploads in parallel (warp --concurrent).
    #[arg(long, default_value_t = 1)]
    pub concurrent: usize,
    /// Parts per upload, 1..=10000 (warp --parts).
    #[arg(long, default_value_t = 100)]
    pub parts: u32,
    /// Size of every part, e.g. 10MiB or 8MiB (warp --part.size); at most 5GiB.
    #[arg(long, default_value = "10MiB")]
    pub part_size: ByteSize,
    /// Parts of one upload in parallel (warp --part.concurrent).
    #[arg(long, default_value_t = 1)]
    pub part_concurrent: usize,
    /// How long to generate load, e.g. 30s, 5m, 1h (warp --duration; same default).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Processes whose RSS is sampled every second and whose CPU time is read at the start and
    /// the end of the load: comma-separated `pid` or `name=pid` (`self` = this process),
    /// e.g. gateway=4242,meta=4243,dn1=4244.
    #[arg(long, default_value = "")]
    pub pids: String,
    /// Directory for samples.csv, summary.json and chart.svg (created if missing).
    #[arg(long, default_value = "sluice-bench-out")]
    pub out_dir: PathBuf,
    /// Complete each upload after its last part, as warp does (`--complete false` leaves them open).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub complete: bool,
    /// Delete each completed object (not timed), so that a long soak does not fill the disks.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub delete_after: bool,
    /// Uploads each worker starts before it stops (successful or not); the run then ends
    /// when every worker has stopped, or at --duration if that comes first. Unset = no limit.
    #[arg(long)]
    pub uploads_per_worker: Option<u64>,
    /// Attempts per request, the first included (SDK standard retry mode; 1 = no retries).
    /// Every failed attempt is counted by its S3 error code.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Time limit of one request attempt, e.g. 2m.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub attempt_timeout: Duration,
    /// Request checksums: when-supported (SDK default, CRC32 trailer on UploadPart) or
    /// when-required (UploadPart sent without a checksum).
    #[arg(long, value_enum, default_value_t = ChecksumMode::WhenSupported)]
    pub checksum: ChecksumMode,
}

impl MultipartPutOptions {
    /// Checks flag ranges and parses `--pids`.
    ///
    /// # Errors
    /// [`BenchError::InvalidOption`] for zero concurrency, parts outside
    /// 1..=10000, a part size of 0 or above 5 GiB, a zero duration or zero
    /// attempts; [`HarnessError::InvalidPids`](sluice_harness::HarnessError::InvalidPids) for a bad `--pids` list.
    pub fn validate(&self) -> Result<Vec<ProcTarget>, BenchError> {
        let invalid = |flag: &'static str, reason: &str| BenchError::InvalidOption {
            flag,
            reason: reason.to_owned(),
        };
        if self.concurrent == 0 {
            return Err(invalid("concurrent", "must be at least 1"));
        }
        if self.part_concurrent == 0 {
            return Err(invalid("part-concurrent", "must be at least 1"));
        }
        if self.parts == 0 || self.parts > MAX_PARTS {
            return Err(invalid("parts", "must be in 1..=10000"));
        }
        if self.part_size.as_u64() == 0 || self.part_size.as_u64() > MAX_PART_SIZE {
            return Err(invalid("part-size", "must be in 1B..=5GiB"));
        }
        if usize::try_from(self.part_size.as_u64()).is_err() {
            return Err(invalid(
                "part-size",
                "does not fit in memory on this platform",
            ));
        }
        if self.duration.is_zero() {
            return Err(invalid("duration", "must be positive"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("max-attempts", "must be at least 1"));
        }
        if self.uploads_per_worker == Some(0) {
            return Err(invalid("uploads-per-worker", "must be at least 1"));
        }
        Ok(parse_targets(&self.pids)?)
    }

    fn shape(&self) -> Shape {
        Shape {
            concurrent: self.concurrent,
            parts: self.parts,
            part_size_bytes: self.part_size.as_u64(),
            part_concurrent: self.part_concurrent,
            duration_s: self.duration.as_secs_f64(),
            complete: self.complete,
            delete_after: self.delete_after,
            max_attempts: self.max_attempts,
        }
    }

    fn client_options(&self) -> ClientOptions {
        ClientOptions {
            endpoint: self.endpoint.clone(),
            ca_bundle: self.ca_bundle.clone(),
            region: self.region.clone(),
            access_key: self.access_key.clone(),
            secret_key: self.secret_key.clone(),
            max_attempts: self.max_attempts,
            initial_backoff: Duration::from_secs(1),
            attempt_timeout: self.attempt_timeout,
            checksum: self.checksum,
        }
    }
}

/// The timed UploadParts ([`Meter`]) and the outcomes of the uploads.
#[derive(Debug)]
struct Progress {
    meter: Meter,
    started: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    left_open: AtomicU64,
    deleted: AtomicU64,
}

impl Progress {
    fn new(deadline: Instant) -> Self {
        Self {
            meter: Meter::new(deadline),
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            left_open: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
        }
    }

    /// [`Meter::request_failed`].
    fn request_failed(&self, operation: &'static str, key: &str, error: impl std::error::Error) {
        self.meter.request_failed(operation, key, error);
    }
}

/// What one worker needs.
#[derive(Debug)]
struct Worker {
    client: aws_sdk_s3::Client,
    bucket: String,
    key_prefix: String,
    parts: u32,
    part_size: usize,
    part_concurrent: usize,
    complete: bool,
    delete_after: bool,
    uploads_per_worker: Option<u64>,
    run_seed: u64,
    progress: Arc<Progress>,
    completed_log: Option<Arc<CompletedLog>>,
}

/// A reason an upload was abandoned (the failure is already recorded).
#[derive(Debug)]
struct Abandoned;

impl Worker {
    async fn run(self: Arc<Self>, id: u64) {
        // Buffers of parts that finished, for the next parts of this worker.
        let mut pool: Vec<BytesMut> = Vec::with_capacity(self.part_concurrent);
        let mut backoff = FIRST_FAILURE_BACKOFF;
        let last_upload = self.uploads_per_worker.unwrap_or(u64::MAX);
        for upload in 1..=last_upload {
            match self.upload_one(id, upload, &mut pool).await {
                Ok(()) => backoff = FIRST_FAILURE_BACKOFF,
                Err(Abandoned) if upload == last_upload => {}
                Err(Abandoned) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_FAILURE_BACKOFF);
                }
            }
        }
    }

    async fn upload_one(
        &self,
        id: u64,
        upload: u64,
        pool: &mut Vec<BytesMut>,
    ) -> Result<(), Abandoned> {
        let key = format!("{}/w{id}/u{upload}", self.key_prefix);
        let created = match self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                self.progress
                    .request_failed("CreateMultipartUpload", &key, e);
                return Err(Abandoned);
            }
        };
        let Some(upload_id) = created.upload_id().map(str::to_owned) else {
            self.progress
                .request_failed("CreateMultipartUpload", &key, MissingUploadId);
            return Err(Abandoned);
        };
        self.progress.started.fetch_add(1, Ordering::Relaxed);

        let mut in_flight: JoinSet<PartResult> = JoinSet::new();
        let mut completed_parts: Vec<CompletedPart> = Vec::with_capacity(self.parts as usize);
        let mut next_part: u32 = 1;
        let mut failed = false;
        loop {
            while !failed && next_part <= self.parts && in_flight.len() < self.part_concurrent {
                let buffer = pool.pop().unwrap_or_else(|| {
                    self.progress.meter.buffer_allocated();
                    BytesMut::zeroed(self.part_size)
                });
                let part = PartJob {
                    client: self.client.clone(),
                    bucket: self.bucket.clone(),
                    key: key.clone(),
                    upload_id: upload_id.clone(),
                    part_number: next_part,
                    seed: part_seed(self.run_seed, id, upload, u64::from(next_part)),
                    part_size: self.part_size,
                    progress: Arc::clone(&self.progress),
                };
                in_flight.spawn(part.run(buffer));
                next_part += 1;
            }
            let Some(joined) = in_flight.join_next().await else {
                break;
            };
            match joined {
                Ok(result) => {
                    if let Some(buffer) = result.buffer {
                        pool.push(buffer);
                    }
                    match result.outcome {
                        PartOutcome::Uploaded { e_tag } => completed_parts.push(
                            CompletedPart::builder()
                                .part_number(result.part_number)
                                .set_e_tag(e_tag)
                                .build(),
                        ),
                        PartOutcome::Failed => failed = true,
                    }
                }
                Err(join_error) => {
                    tracing::error!(key, error = %join_error, "part task ended abnormally");
                    failed = true;
                }
            }
        }
        if failed {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
            return Err(Abandoned);
        }
        if !self.complete {
            self.progress.left_open.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }

        completed_parts.sort_by_key(|p| p.part_number());
        let completion = CompletedMultipartUpload::builder()
            .set_parts(Some(completed_parts))
            .build();
        let result = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .upload_id(&upload_id)
            .multipart_upload(completion)
            .send()
            .await;
        if let Err(e) = result {
            self.progress
                .request_failed("CompleteMultipartUpload", &key, e);
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
            return Err(Abandoned);
        }
        self.progress.completed.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = &self.completed_log {
            log.record(CompletedUpload {
                key: key.clone(),
                run_seed: self.run_seed,
                worker: id,
                upload,
                parts: self.parts,
                part_size: self.part_size as u64,
            });
        }

        if self.delete_after {
            match self
                .client
                .delete_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
            {
                Ok(_) => {
                    self.progress.deleted.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.progress.request_failed("DeleteObject", &key, e),
            }
        }
        Ok(())
    }
}

/// CreateMultipartUpload answered 200 without an upload id.
#[derive(Debug, thiserror::Error)]
#[error("CreateMultipartUpload response has no UploadId")]
struct MissingUploadId;

/// One UploadPart.
struct PartJob {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    part_number: u32,
    seed: u64,
    part_size: usize,
    progress: Arc<Progress>,
}

/// How an UploadPart ended.
enum PartOutcome {
    /// 200, with the ETag the server returned.
    Uploaded { e_tag: Option<String> },
    /// Failed after all attempts (already recorded).
    Failed,
}

/// What a [`PartJob`] hands back to its worker.
struct PartResult {
    /// S3 part number (1..=10000).
    part_number: i32,
    outcome: PartOutcome,
    /// The payload buffer, when the SDK has released every reference to it.
    buffer: Option<BytesMut>,
}

impl PartJob {
    /// Fills `buffer` with fresh data and uploads it; only the UploadPart
    /// call (with its SDK retries) is timed.
    async fn run(self, mut buffer: BytesMut) -> PartResult {
        // part_number <= MAX_PARTS (10000), so it fits in i32.
        let part_number = i32::try_from(self.part_number).unwrap_or(i32::MAX);
        buffer.resize(self.part_size, 0);
        fill(self.seed, &mut buffer);
        let body = buffer.freeze();
        let started = std::time::Instant::now();
        let result = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(part_number)
            .content_length(i64::try_from(self.part_size).unwrap_or(i64::MAX))
            .body(ByteStream::from(body.clone()))
            .send()
            .await;
        let latency = started.elapsed();
        let buffer = body.try_into_mut().ok();
        let outcome = match result {
            Ok(out) => {
                self.progress.meter.op_done(self.part_size as u64, latency);
                PartOutcome::Uploaded {
                    e_tag: out.e_tag().map(str::to_owned),
                }
            }
            Err(e) => {
                self.progress.request_failed("UploadPart", &self.key, e);
                PartOutcome::Failed
            }
        };
        PartResult {
            part_number,
            outcome,
            buffer,
        }
    }
}

/// What a library caller can collect from a run besides the [`Summary`].
#[derive(Debug, Clone, Default)]
pub struct RunHooks {
    /// Receives every upload that CompleteMultipartUpload acknowledged
    /// before the deadline (whether or not it is then deleted).
    pub completed: Option<Arc<CompletedLog>>,
    /// Title of `chart.svg` instead of one naming the shape of the run.
    pub chart_title: Option<String>,
    /// Ends the load early once it holds `true`: the sampler takes a last
    /// sample and every worker is dropped with its parts in flight (as at
    /// the deadline). Used to run load exactly as long as another phase.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Runs the benchmark: prepares the bucket, generates load for
/// `--duration` while sampling every second, then writes `samples.csv`
/// (during the run), `summary.json` and `chart.svg` into `--out-dir`.
///
/// # Errors
/// Invalid options, a bucket that cannot be created, or output files that
/// cannot be written. Failed S3 requests during the load are counted, not
/// returned.
pub async fn run(options: MultipartPutOptions) -> Result<Summary, BenchError> {
    run_with(options, RunHooks::default()).await
}

/// [`run`], reporting into `hooks` as well.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    options: MultipartPutOptions,
    hooks: RunHooks,
) -> Result<Summary, BenchError> {
    let targets = options.validate()?;
    if options.part_size.as_u64() < MIN_PART_SIZE && options.parts > 1 {
        tracing::warn!(part_size = %options.part_size.to_string_as(true), "parts below 5 MiB are rejected by AWS S3 at CompleteMultipartUpload");
    }
    create_out_dir(&options.out_dir)?;
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let (client, tally) = connect(&options.client_options(), &options.bucket).await?;

    let run_seed = new_run_seed();
    let key_prefix = format!("{}/{run_seed:016x}", options.prefix);
    let csv_path = options.out_dir.join("samples.csv");
    let mut csv = SamplesWriter::create(&csv_path, Counted::Parts, &names)?;

    let mut phase = LoadPhase::begin(options.duration, &targets);
    let progress = Arc::new(Progress::new(phase.deadline()));
    let part_size = usize::try_from(options.part_size.as_u64()).unwrap_or(usize::MAX);
    let worker = Arc::new(Worker {
        client,
        bucket: options.bucket.clone(),
        key_prefix: key_prefix.clone(),
        parts: options.parts,
        part_size,
        part_concurrent: options.part_concurrent.min(options.parts as usize),
        complete: options.complete,
        delete_after: options.delete_after,
        uploads_per_worker: options.uploads_per_worker,
        run_seed,
        progress: Arc::clone(&progress),
        completed_log: hooks.completed.clone(),
    });
    tracing::info!(
        endpoint = %options.endpoint, key_prefix, concurrent = options.concurrent, parts = options.parts,
        part_size = %options.part_size.to_string_as(true), part_concurrent = options.part_concurrent,
        duration = %humantime::format_duration(options.duration), "load started"
    );
    for id in 0..options.concurrent as u64 {
        phase.spawn(Arc::clone(&worker).run(id));
    }
    // Workers end when their uploads are done or at the deadline (dropped
    // with their parts in flight), or all at once on a stop.
    let measured = phase
        .finish(
            hooks.stop.clone(),
            Probe {
                meter: &progress.meter,
                tally: &tally,
                targets: &targets,
            },
            &mut csv,
        )
        .await?;

    let elapsed = measured.elapsed;
    let meter = &progress.meter;
    let bytes = meter.bytes();
    let parts = meter.ops();
    let started = progress.started.load(Ordering::Relaxed);
    let completed = progress.completed.load(Ordering::Relaxed);
    let failed = progress.failed.load(Ordering::Relaxed);
    let left_open = progress.left_open.load(Ordering::Relaxed);
    let summary = Summary {
        benchmark: "multipart-put",
        endpoint: options.endpoint.clone(),
        bucket: options.bucket.clone(),
        key_prefix,
        shape: options.shape(),
        elapsed_s: elapsed.as_secs_f64(),
        parts,
        bytes,
        mib_per_s: mib_per_s(bytes, elapsed),
        parts_per_s: per_second(parts, elapsed),
        upload_part_latency: meter.latency(),
        uploads: UploadCounts {
            started,
            completed,
            failed,
            left_open,
            unfinished: started.saturating_sub(completed + failed + left_open),
            deleted: progress.deleted.load(Ordering::Relaxed),
        },
        errors_total: tally.total(),
        errors_by_code: tally.snapshot(),
        slowdown: tally.count(SLOW_DOWN),
        failed_requests: meter.failed_requests(),
        payload_buffers: meter.buffers_allocated(),
        processes: targets
            .iter()
            .enumerate()
            .map(|(i, t)| ProcessRss::from_samples(&t.name, t.pid, i, &measured.samples))
            .collect(),
        server_cpu: measured.server_cpu,
    };

    write_summary(&options.out_dir, &summary)?;
    let title = hooks.chart_title.unwrap_or_else(|| {
        format!(
            "sluice-bench multipart-put: {} x {} parts of {} ({} in flight per upload)",
            options.concurrent,
            options.parts,
            options.part_size.to_string_as(true),
            options.part_concurrent
        )
    });
    crate::chart::draw(
        &options.out_dir.join("chart.svg"),
        &title,
        "UploadPart",
        &names,
        &measured.samples,
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests;
