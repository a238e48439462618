//! The `put` and `get` workloads, after MinIO warp's benchmarks of the
//! same names (`warp put|get --obj.size --concurrent --duration`).
//!
//! `put`: each of `--concurrent` workers loops PutObject of `--obj-size`
//! freshly generated pseudo-random bytes (signed payload, as
//! `multipart-put` sends its parts) to a key of its own,
//! `PREFIX/RUN-ID/wWORKER/oN`, until `--duration` has elapsed.
//!
//! `get`: first writes `--objects` objects of `--obj-size`
//! (`PREFIX/RUN-ID/oN`, `--concurrent` at a time; not timed, not counted),
//! then each worker loops GetObject of one of them chosen at random,
//! reading the whole body. A body that breaks off, has another length than
//! `--obj-size` or comes with another ETag than its PutObject returned is a
//! failed request, counted under `BodyReadError`, `BodyLengthMismatch` or
//! `ETagMismatch` with the error responses.
//!
//! Only the PutObject or GetObject call is timed (GetObject until the last
//! byte; its time to the response headers is reported too), from the first
//! attempt to the end, SDK retries included. Requests in flight at the
//! deadline are dropped with their worker, as warp does. Afterwards what the
//! run wrote is deleted with DeleteObjects (unless `--keep`): for `put`,
//! every key a PutObject was started on (one dropped at the deadline may
//! have landed), for `get` the seeded objects. Reporting is
//! `multipart-put`'s ([`crate::load`], [`crate::report`]).
//!
//! Bounds: per worker, memory is one `--obj-size` payload buffer — `put`
//! fills it and reuses it once the SDK has released it (a second one only
//! while the SDK still holds the first); `get` reads the body chunk by
//! chunk and keeps none of it, so its payload is the HTTP client's chunk
//! buffers; seeding holds one buffer per seeding worker. `get` also keeps
//! the ETag of each of its at most [`MAX_OBJECTS`] objects. The cleanup
//! holds at most [`DELETE_IN_FLIGHT`] x [`DELETE_BATCH`] keys.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use aws_sdk_s3::operation::put_object::PutObjectError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use bytes::BytesMut;
use bytesize::ByteSize;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use crate::data::{fill, object_seed, splitmix64};
use crate::error::BenchError;
use crate::load::{
    FIRST_FAILURE_BACKOFF, LoadPhase, MAX_FAILURE_BACKOFF, Measured, Meter, Probe, connect,
    create_out_dir, new_run_seed, write_summary,
};
use crate::report::{Cleanup, ObjectShape, ObjectSummary, ProcessRss, size_text};
use crate::rss::{ProcTarget, parse_targets};
use crate::s3::{ChecksumMode, ClientOptions, ErrorTally, SLOW_DOWN};
use crate::samples::{Counted, SamplesWriter};
use crate::stats::{LatencyStats, mib_per_s, per_second};

/// Largest object a single PutObject may carry (AWS: 5 GiB).
const MAX_OBJECT_SIZE: u64 = 5 * 1024 * 1024 * 1024;
/// Smallest part of a multipart upload but the last (AWS: 5 MiB).
const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// Most objects `get` writes and reads (their ETags are kept: ~100 MiB).
pub const MAX_OBJECTS: u64 = 1_000_000;
/// Keys per DeleteObjects request (the S3 maximum).
pub const DELETE_BATCH: usize = 1000;
/// DeleteObjects requests in flight during the cleanup.
pub const DELETE_IN_FLIGHT: usize = 4;
/// The `worker` of [`object_seed`] for `get`'s seeded objects.
const SEED_WORKER: u64 = u64::MAX;

/// Error code counted for a GetObject body that broke off.
pub const BODY_READ_ERROR: &str = "BodyReadError";
/// Error code counted for a GetObject body of another length than `--obj-size`.
pub const BODY_LENGTH_MISMATCH: &str = "BodyLengthMismatch";
/// Error code counted for a GetObject ETag other than its PutObject's.
pub const ETAG_MISMATCH: &str = "ETagMismatch";

/// Flags of `sluice-bench put` (and, with `--objects`, of `get`).
#[derive(Debug, Clone, clap::Args)]
pub struct ObjectOptions {
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
    /// Bucket to write into; created if missing.
    #[arg(long, default_value = "sluice-bench")]
    pub bucket: String,
    /// Object key prefix (default: the subcommand's name); keys are
    /// PREFIX/RUN-ID/wWORKER/oN (put) or PREFIX/RUN-ID/oN (get), RUN-ID new for every run.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Size of every object, e.g. 4KiB or 1MiB (warp --obj.size); at most 5GiB.
    #[arg(long, default_value = "10MiB")]
    pub obj_size: ByteSize,
    /// Workers, each with one request in flight (warp --concurrent).
    #[arg(long, default_value_t = 20)]
    pub concurrent: usize,
    /// How long to generate load, e.g. 30s, 5m, 1h (warp --duration; same default).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Server processes whose RSS is sampled every second and whose CPU time is read at the
    /// start and the end of the load: comma-separated `pid` or `name=pid` (`self` = this
    /// process), e.g. meta=4243,gw=4242,dn1=4244.
    #[arg(long, default_value = "")]
    pub pids: String,
    /// Directory for samples.csv, summary.json and chart.svg (created if missing).
    #[arg(long, default_value = "sluice-bench-out")]
    pub out_dir: PathBuf,
    /// Leave the objects the run wrote in the bucket (default: delete them at the end).
    #[arg(long)]
    pub keep: bool,
    /// Attempts per request, the first included (SDK standard retry mode; 1 = no retries).
    /// Every failed attempt is counted by its S3 error code.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Time limit of one request attempt, e.g. 2m.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub attempt_timeout: Duration,
    /// Request checksums: when-supported (SDK default, CRC32 trailer on PutObject) or
    /// when-required (PutObject sent without a checksum).
    #[arg(long, value_enum, default_value_t = ChecksumMode::WhenSupported)]
    pub checksum: ChecksumMode,
}

/// Flags of `sluice-bench get`.
#[derive(Debug, Clone, clap::Args)]
pub struct GetOptions {
    /// The flags `put` has.
    #[command(flatten)]
    pub object: ObjectOptions,
    /// Objects written before the load and read at random (default: 2 x --concurrent);
    /// 1..=1000000.
    #[arg(long)]
    pub objects: Option<u64>,
    /// Write each object as a multipart upload of parts of this size (the last part holds
    /// the rest), e.g. 10MiB as `multipart-put`'s seed shape writes them, so the load
    /// reads multipart objects; 5MiB..=5GiB and below --obj-size. Default: one PutObject.
    #[arg(long)]
    pub part_size: Option<ByteSize>,
}

impl ObjectOptions {
    /// Checks flag ranges and parses `--pids`.
    ///
    /// # Errors
    /// [`BenchError::InvalidOption`] for zero concurrency, an object size
    /// of 0 or above 5 GiB, a zero duration or zero attempts;
    /// [`HarnessError::InvalidPids`](sluice_harness::HarnessError::InvalidPids) for a bad `--pids` list.
    pub fn validate(&self) -> Result<Vec<ProcTarget>, BenchError> {
        if self.concurrent == 0 {
            return Err(invalid("concurrent", "must be at least 1"));
        }
        let size = self.obj_size.as_u64();
        if size == 0 || size > MAX_OBJECT_SIZE {
            return Err(invalid("obj-size", "must be in 1B..=5GiB"));
        }
        if usize::try_from(size).is_err() {
            return Err(invalid(
                "obj-size",
                "does not fit in memory on this platform",
            ));
        }
        if self.duration.is_zero() {
            return Err(invalid("duration", "must be positive"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("max-attempts", "must be at least 1"));
        }
        Ok(parse_targets(&self.pids)?)
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

    /// `--obj-size` as a buffer length.
    fn buffer_len(&self) -> usize {
        // validate() checked that it fits.
        usize::try_from(self.obj_size.as_u64()).unwrap_or(usize::MAX)
    }

    fn shape(&self, objects: Option<u64>, part_size: Option<u64>) -> ObjectShape {
        ObjectShape {
            concurrent: self.concurrent,
            obj_size_bytes: self.obj_size.as_u64(),
            objects,
            part_size_bytes: part_size,
            duration_s: self.duration.as_secs_f64(),
            max_attempts: self.max_attempts,
            keep: self.keep,
        }
    }
}

impl GetOptions {
    /// [`ObjectOptions::validate`], and `--objects` in 1..=1000000; returns
    /// the processes to sample and the number of objects.
    ///
    /// # Errors
    /// As [`ObjectOptions::validate`]; [`BenchError::InvalidOption`] for
    /// `--objects` out of range.
    pub fn validate(&self) -> Result<(Vec<ProcTarget>, u64), BenchError> {
        let targets = self.object.validate()?;
        let objects = self
            .objects
            .unwrap_or_else(|| (self.object.concurrent as u64).saturating_mul(2));
        if objects == 0 || objects > MAX_OBJECTS {
            return Err(invalid("objects", "must be in 1..=1000000"));
        }
        if let Some(part) = self.part_size {
            let part = part.as_u64();
            if !(MIN_PART_SIZE..=MAX_OBJECT_SIZE).contains(&part) {
                return Err(invalid("part-size", "must be in 5MiB..=5GiB"));
            }
            if part >= self.object.obj_size.as_u64() {
                return Err(invalid("part-size", "must be below --obj-size"));
            }
        }
        Ok((targets, objects))
    }
}

fn invalid(flag: &'static str, reason: &str) -> BenchError {
    BenchError::InvalidOption {
        flag,
        reason: reason.to_owned(),
    }
}

/// Key of object `n` of `worker` in a `put` run.
fn put_key(key_prefix: &str, worker: u64, n: u64) -> String {
    format!("{key_prefix}/w{worker}/o{n}")
}

/// Key of seeded object `i` in a `get` run.
fn get_key(key_prefix: &str, i: u64) -> String {
    format!("{key_prefix}/o{i}")
}

/// How a [`put_object`] ended.
struct Put {
    /// The ETag the server returned, or the SDK error after all attempts.
    result: Result<Option<String>, SdkError<PutObjectError>>,
    /// Of the PutObject call alone, SDK retries included.
    latency: Duration,
    /// The payload buffer, when the SDK has released every reference to it.
    buffer: Option<BytesMut>,
}

/// A PutObject of fresh data of `seed` from `buffer` (or a new buffer of
/// `size` when there is none, counted in `meter`).
async fn put_object(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    seed: u64,
    size: usize,
    buffer: Option<BytesMut>,
    meter: &Meter,
) -> Put {
    let mut buffer = buffer.unwrap_or_else(|| {
        meter.buffer_allocated();
        BytesMut::zeroed(size)
    });
    buffer.resize(size, 0);
    fill(seed, &mut buffer);
    let body = buffer.freeze();
    let started = std::time::Instant::now();
    let result = client
        .put_object()
        .bucket(bucket)
        .key(key)
        .content_length(i64::try_from(size).unwrap_or(i64::MAX))
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .map(|out| out.e_tag().map(str::to_owned));
    let latency = started.elapsed();
    Put {
        result,
        latency,
        buffer: body.try_into_mut().ok(),
    }
}

/// One object of `get` written as a multipart upload (`--part-size`).
struct MultipartSeed<'a> {
    client: &'a aws_sdk_s3::Client,
    bucket: &'a str,
    key: &'a str,
    /// The object's seed: part `n` (from 1) holds the bytes of
    /// `part_seed(seed, 0, 0, n)`.
    seed: u64,
}

impl MultipartSeed<'_> {
    /// Uploads `size` bytes in parts of `part` bytes (the last holds the
    /// rest) from `buffer` (one part long; allocated and counted in `meter`
    /// if absent), completes the upload and returns its ETag. An upload that
    /// fails is aborted (best effort).
    async fn write(
        &self,
        size: u64,
        part: u64,
        buffer: &mut Option<BytesMut>,
        meter: &Meter,
    ) -> Result<Option<String>, crate::error::BoxError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(self.bucket)
            .key(self.key)
            .send()
            .await?;
        let upload_id = created.upload_id().unwrap_or_default().to_owned();
        match self.parts(&upload_id, size, part, buffer, meter).await {
            Ok(parts) => {
                let done = self
                    .client
                    .complete_multipart_upload()
                    .bucket(self.bucket)
                    .key(self.key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        aws_sdk_s3::types::CompletedMultipartUpload::builder()
                            .set_parts(Some(parts))
                            .build(),
                    )
                    .send()
                    .await?;
                Ok(done.e_tag().map(str::to_owned))
            }
            Err(e) => {
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(self.bucket)
                    .key(self.key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                Err(e)
            }
        }
    }

    async fn parts(
        &self,
        upload_id: &str,
        size: u64,
        part: u64,
        buffer: &mut Option<BytesMut>,
        meter: &Meter,
    ) -> Result<Vec<aws_sdk_s3::types::CompletedPart>, crate::error::BoxError> {
        let mut parts = Vec::new();
        let mut offset = 0;
        let mut number = 1;
        while offset < size {
            let len = usize::try_from(part.min(size - offset)).unwrap_or(usize::MAX);
            let mut buf = buffer.take().unwrap_or_else(|| {
                meter.buffer_allocated();
                BytesMut::zeroed(len)
            });
            buf.resize(len, 0);
            fill(crate::data::part_seed(self.seed, 0, 0, number), &mut buf);
            let body = buf.freeze();
            let out = self
                .client
                .upload_part()
                .bucket(self.bucket)
                .key(self.key)
                .upload_id(upload_id)
                .part_number(i32::try_from(number).unwrap_or(i32::MAX))
                .content_length(i64::try_from(len).unwrap_or(i64::MAX))
                .body(ByteStream::from(body.clone()))
                .send()
                .await?;
            *buffer = body.try_into_mut().ok();
            parts.push(
                aws_sdk_s3::types::CompletedPart::builder()
                    .part_number(i32::try_from(number).unwrap_or(i32::MAX))
                    .set_e_tag(out.e_tag().map(str::to_owned))
                    .build(),
            );
            offset += len as u64;
            number += 1;
        }
        Ok(parts)
    }
}

/// Everything both workloads set up before the load.
struct Setup {
    targets: Vec<ProcTarget>,
    names: Vec<String>,
    client: aws_sdk_s3::Client,
    tally: Arc<ErrorTally>,
    run_seed: u64,
    key_prefix: String,
    csv: SamplesWriter,
}

async fn set_up(
    options: &ObjectOptions,
    benchmark: &str,
    targets: Vec<ProcTarget>,
) -> Result<Setup, BenchError> {
    create_out_dir(&options.out_dir)?;
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let (client, tally) = connect(&options.client_options(), &options.bucket).await?;
    let run_seed = new_run_seed();
    let prefix = options.prefix.as_deref().unwrap_or(benchmark);
    let key_prefix = format!("{prefix}/{run_seed:016x}");
    let csv = SamplesWriter::create(&options.out_dir.join("samples.csv"), Counted::Ops, &names)?;
    Ok(Setup {
        targets,
        names,
        client,
        tally,
        run_seed,
        key_prefix,
        csv,
    })
}

/// The figures of a finished load phase, before the cleanup (whose
/// requests are not counted).
struct Figures {
    measured: Measured,
    ops: u64,
    bytes: u64,
    latency: crate::stats::LatencySummary,
    errors_total: u64,
    errors_by_code: std::collections::BTreeMap<String, u64>,
    slowdown: u64,
    failed_requests: std::collections::BTreeMap<String, u64>,
    payload_buffers: u64,
}

impl Figures {
    fn take(measured: Measured, meter: &Meter, tally: &ErrorTally) -> Self {
        Self {
            measured,
            ops: meter.ops(),
            bytes: meter.bytes(),
            latency: meter.latency(),
            errors_total: tally.total(),
            errors_by_code: tally.snapshot(),
            slowdown: tally.count(SLOW_DOWN),
            failed_requests: meter.failed_requests(),
            payload_buffers: meter.buffers_allocated(),
        }
    }
}

/// Builds the summary and writes `summary.json` and `chart.svg`.
#[allow(clippy::too_many_arguments)]
fn finish(
    benchmark: &'static str,
    operation: &'static str,
    options: &ObjectOptions,
    setup: &Setup,
    shape: ObjectShape,
    figures: Figures,
    first_byte_latency: Option<crate::stats::LatencySummary>,
    cleanup: Cleanup,
) -> Result<ObjectSummary, BenchError> {
    let Figures {
        measured,
        ops,
        bytes,
        latency,
        errors_total,
        errors_by_code,
        slowdown,
        failed_requests,
        payload_buffers,
    } = figures;
    let elapsed = measured.elapsed;
    let summary = ObjectSummary {
        benchmark,
        operation,
        endpoint: options.endpoint.clone(),
        bucket: options.bucket.clone(),
        key_prefix: setup.key_prefix.clone(),
        shape,
        elapsed_s: elapsed.as_secs_f64(),
        ops,
        bytes,
        mib_per_s: mib_per_s(bytes, elapsed),
        ops_per_s: per_second(ops, elapsed),
        latency,
        first_byte_latency,
        errors_total,
        errors_by_code,
        slowdown,
        failed_requests,
        payload_buffers,
        processes: setup
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| ProcessRss::from_samples(&t.name, t.pid, i, &measured.samples))
            .collect(),
        server_cpu: measured.server_cpu,
        cleanup,
    };
    write_summary(&options.out_dir, &summary)?;
    let reading = summary
        .shape
        .objects
        .map(|n| format!(", {n} objects read at random"))
        .unwrap_or_default();
    let parts = summary
        .shape
        .part_size_bytes
        .map(|p| format!(" in {} parts", size_text(p)))
        .unwrap_or_default();
    let title = format!(
        "sluice-bench {benchmark}: {} x {} objects{parts}{reading}",
        options.concurrent,
        size_text(options.obj_size.as_u64()),
    );
    crate::chart::draw(
        &options.out_dir.join("chart.svg"),
        &title,
        operation,
        &setup.names,
        &measured.samples,
    )?;
    Ok(summary)
}

/// What `put`'s workers share.
#[derive(Debug)]
struct PutWorker {
    client: aws_sdk_s3::Client,
    bucket: String,
    key_prefix: String,
    obj_size: usize,
    run_seed: u64,
    meter: Meter,
    /// PutObjects each worker has started: its keys are o1..=oN.
    started: Vec<AtomicU64>,
}

impl PutWorker {
    async fn run(self: Arc<Self>, id: u64) {
        let mut buffer: Option<BytesMut> = None;
        let mut backoff = FIRST_FAILURE_BACKOFF;
        let started = &self.started[usize::try_from(id).unwrap_or(usize::MAX)];
        for n in 1.. {
            if self.meter.past_deadline() {
                return;
            }
            started.store(n, Ordering::Relaxed);
            let key = put_key(&self.key_prefix, id, n);
            let seed = object_seed(self.run_seed, id, n);
            let put = put_object(
                &self.client,
                &self.bucket,
                &key,
                seed,
                self.obj_size,
                buffer.take(),
                &self.meter,
            )
            .await;
            buffer = put.buffer;
            match put.result {
                Ok(_) => {
                    self.meter.op_done(self.obj_size as u64, put.latency);
                    backoff = FIRST_FAILURE_BACKOFF;
                }
                Err(e) => {
                    self.meter.request_failed("PutObject", &key, e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_FAILURE_BACKOFF);
                }
            }
        }
    }
}

/// Ends the load `phase` whose workers record into `meter`: samples until
/// the deadline into the run's CSV, then the figures of the phase.
async fn measure(
    phase: LoadPhase,
    setup: &mut Setup,
    meter: &Meter,
) -> Result<Figures, BenchError> {
    let measured = phase
        .finish(
            None,
            Probe {
                meter,
                tally: &setup.tally,
                targets: &setup.targets,
            },
            &mut setup.csv,
        )
        .await?;
    Ok(Figures::take(measured, meter, &setup.tally))
}

/// Runs `put`: load for `--duration`, then deletes what it wrote (unless
/// `--keep`); writes `samples.csv` (during the run), `summary.json` and
/// `chart.svg` into `--out-dir`.
///
/// # Errors
/// Invalid options, a bucket that cannot be created, or output files that
/// cannot be written. Failed S3 requests are counted, not returned.
pub async fn run_put(options: ObjectOptions) -> Result<ObjectSummary, BenchError> {
    let targets = options.validate()?;
    let mut setup = set_up(&options, "put", targets).await?;
    let mut phase = LoadPhase::begin(options.duration, &setup.targets);
    let worker = Arc::new(PutWorker {
        client: setup.client.clone(),
        bucket: options.bucket.clone(),
        key_prefix: setup.key_prefix.clone(),
        obj_size: options.buffer_len(),
        run_seed: setup.run_seed,
        meter: Meter::new(phase.deadline()),
        started: (0..options.concurrent).map(|_| AtomicU64::new(0)).collect(),
    });
    tracing::info!(
        endpoint = %options.endpoint, key_prefix = setup.key_prefix, concurrent = options.concurrent,
        obj_size = %size_text(options.obj_size.as_u64()),
        duration = %humantime::format_duration(options.duration), "put load started"
    );
    for id in 0..options.concurrent as u64 {
        phase.spawn(Arc::clone(&worker).run(id));
    }
    let figures = measure(phase, &mut setup, &worker.meter).await?;

    let started: Vec<u64> = worker
        .started
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    let total: u64 = started.iter().sum();
    let key_prefix = setup.key_prefix.clone();
    let keys = started.into_iter().zip(0u64..).flat_map(move |(n, id)| {
        let key_prefix = key_prefix.clone();
        (1..=n).map(move |k| put_key(&key_prefix, id, k))
    });
    let cleanup = clean_up(&setup.client, &options, keys, total).await;
    finish(
        "put",
        "PutObject",
        &options,
        &setup,
        options.shape(None, None),
        figures,
        None,
        cleanup,
    )
}

/// What `get`'s workers share.
#[derive(Debug)]
struct GetWorker {
    client: aws_sdk_s3::Client,
    bucket: String,
    key_prefix: String,
    obj_size: u64,
    run_seed: u64,
    /// The ETag PutObject returned for each seeded object, by index.
    e_tags: Vec<Option<String>>,
    meter: Meter,
    first_byte: Mutex<LatencyStats>,
    tally: Arc<ErrorTally>,
}

/// A GetObject that failed (already recorded).
#[derive(Debug)]
struct GetFailed;

/// A GetObject body that does not match what was written.
#[derive(Debug, thiserror::Error)]
enum BodyMismatch {
    #[error("body of {got} bytes, expected {expected}")]
    Length { expected: u64, got: u64 },
    #[error("ETag {got:?}, PutObject returned {expected}")]
    ETag {
        expected: String,
        got: Option<String>,
    },
}

impl GetWorker {
    async fn run(self: Arc<Self>, id: u64) {
        let mut rng = StdRng::seed_from_u64(splitmix64(self.run_seed ^ splitmix64(id)));
        let mut backoff = FIRST_FAILURE_BACKOFF;
        while !self.meter.past_deadline() {
            let i = rng.gen_range(0..self.e_tags.len());
            match self.get_one(i).await {
                Ok(()) => backoff = FIRST_FAILURE_BACKOFF,
                Err(GetFailed) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_FAILURE_BACKOFF);
                }
            }
        }
    }

    /// One timed GetObject of seeded object `i`, body read to the end and
    /// dropped chunk by chunk.
    async fn get_one(&self, i: usize) -> Result<(), GetFailed> {
        let key = get_key(&self.key_prefix, i as u64);
        let started = std::time::Instant::now();
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                self.meter.request_failed("GetObject", &key, e);
                return Err(GetFailed);
            }
        };
        let first_byte = started.elapsed();
        let e_tag = out.e_tag().map(str::to_owned);
        let mut body = out.body;
        let mut got: u64 = 0;
        loop {
            match body.try_next().await {
                Ok(Some(chunk)) => got += chunk.len() as u64,
                Ok(None) => break,
                Err(e) => return Err(self.broken(BODY_READ_ERROR, &key, e)),
            }
        }
        let latency = started.elapsed();
        if got != self.obj_size {
            let mismatch = BodyMismatch::Length {
                expected: self.obj_size,
                got,
            };
            return Err(self.broken(BODY_LENGTH_MISMATCH, &key, mismatch));
        }
        if let Some(expected) = &self.e_tags[i]
            && e_tag.as_deref() != Some(expected.as_str())
        {
            let mismatch = BodyMismatch::ETag {
                expected: expected.clone(),
                got: e_tag,
            };
            return Err(self.broken(ETAG_MISMATCH, &key, mismatch));
        }
        if self.meter.op_done(got, latency) {
            self.first_byte
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(first_byte);
        }
        Ok(())
    }

    /// Counts a GetObject whose response was a success but whose body was
    /// not: under `code` with the error responses, and as a failed request.
    fn broken(&self, code: &str, key: &str, error: impl std::error::Error) -> GetFailed {
        self.tally.record(code);
        self.meter.request_failed("GetObject", key, error);
        GetFailed
    }
}

/// Writes objects 0..`count` of `get` with `options.concurrent` workers;
/// returns their ETags by index.
///
/// # Errors
/// [`BenchError::Seed`] when one cannot be written (after the SDK's
/// retries); the others stop then, and `written` tells how many indexes
/// were started (at most `count` of them were written).
async fn seed_objects(
    options: &ObjectOptions,
    setup: &Setup,
    count: u64,
    part_size: Option<u64>,
    written: &Arc<AtomicU64>,
) -> Result<Vec<Option<String>>, BenchError> {
    let e_tags = Arc::new(Mutex::new(vec![None; usize::try_from(count).unwrap_or(0)]));
    let failed = Arc::new(AtomicBool::new(false));
    // Seeding is not measured: its buffers are counted by a meter of its own.
    let meter = Arc::new(Meter::new(tokio::time::Instant::now()));
    let mut seeders = JoinSet::new();
    for _ in 0..(options.concurrent as u64).min(count) {
        let client = setup.client.clone();
        let bucket = options.bucket.clone();
        let key_prefix = setup.key_prefix.clone();
        let (written, e_tags, failed, meter) = (
            Arc::clone(written),
            Arc::clone(&e_tags),
            Arc::clone(&failed),
            Arc::clone(&meter),
        );
        let size = options.buffer_len();
        let run_seed = setup.run_seed;
        seeders.spawn(async move {
            let mut buffer = None;
            while !failed.load(Ordering::Relaxed) {
                let i = written.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let key = get_key(&key_prefix, i);
                let seed = object_seed(run_seed, SEED_WORKER, i);
                let result = match part_size {
                    None => {
                        let put =
                            put_object(&client, &bucket, &key, seed, size, buffer.take(), &meter)
                                .await;
                        buffer = put.buffer;
                        put.result
                            .map_err(|e| -> crate::error::BoxError { Box::new(e) })
                    }
                    Some(part) => {
                        let upload = MultipartSeed {
                            client: &client,
                            bucket: &bucket,
                            key: &key,
                            seed,
                        };
                        upload.write(size as u64, part, &mut buffer, &meter).await
                    }
                };
                match result {
                    Ok(e_tag) => {
                        e_tags.lock().unwrap_or_else(PoisonError::into_inner)
                            [usize::try_from(i).unwrap_or(usize::MAX)] = e_tag;
                    }
                    Err(source) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(BenchError::Seed { key, source });
                    }
                }
            }
            Ok(())
        });
    }
    let mut first_error = None;
    while let Some(joined) = seeders.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => tracing::error!(error = %e, "seeding task ended abnormally"),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let e_tags = std::mem::take(&mut *e_tags.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(e_tags)
}

/// Runs `get`: writes the objects, loads for `--duration`, then deletes
/// the objects (unless `--keep`); writes `samples.csv` (during the run),
/// `summary.json` and `chart.svg` into `--out-dir`.
///
/// # Errors
/// Invalid options, a bucket that cannot be created, an object that cannot
/// be written before the load (what was written is deleted first unless
/// `--keep`), or output files that cannot be written. Failed requests
/// during the load are counted, not returned.
pub async fn run_get(options: GetOptions) -> Result<ObjectSummary, BenchError> {
    let (targets, objects) = options.validate()?;
    let mut setup = set_up(&options.object, "get", targets).await?;
    tracing::info!(
        objects,
        obj_size = %size_text(options.object.obj_size.as_u64()),
        part_size = ?options.part_size,
        key_prefix = setup.key_prefix,
        "writing the objects to read"
    );
    let written = Arc::new(AtomicU64::new(0));
    let part_size = options.part_size.map(|p| p.as_u64());
    let options = options.object;
    let e_tags = match seed_objects(&options, &setup, objects, part_size, &written).await {
        Ok(e_tags) => e_tags,
        Err(e) => {
            let started = written.load(Ordering::Relaxed).min(objects);
            let key_prefix = setup.key_prefix.clone();
            let keys = (0..started).map(move |i| get_key(&key_prefix, i));
            let cleanup = clean_up(&setup.client, &options, keys, started).await;
            tracing::info!(?cleanup, "seeding failed; cleaned up");
            return Err(e);
        }
    };
    // Seeding is not part of the measurement.
    setup.tally.reset();

    let mut phase = LoadPhase::begin(options.duration, &setup.targets);
    let worker = Arc::new(GetWorker {
        client: setup.client.clone(),
        bucket: options.bucket.clone(),
        key_prefix: setup.key_prefix.clone(),
        obj_size: options.obj_size.as_u64(),
        run_seed: setup.run_seed,
        e_tags,
        meter: Meter::new(phase.deadline()),
        first_byte: Mutex::new(LatencyStats::new()),
        tally: Arc::clone(&setup.tally),
    });
    tracing::info!(
        endpoint = %options.endpoint, concurrent = options.concurrent,
        duration = %humantime::format_duration(options.duration), "get load started"
    );
    for id in 0..options.concurrent as u64 {
        phase.spawn(Arc::clone(&worker).run(id));
    }
    let figures = measure(phase, &mut setup, &worker.meter).await?;
    let first_byte = worker
        .first_byte
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .summary();

    let key_prefix = setup.key_prefix.clone();
    let keys = (0..objects).map(move |i| get_key(&key_prefix, i));
    let cleanup = clean_up(&setup.client, &options, keys, objects).await;
    finish(
        "get",
        "GetObject",
        &options,
        &setup,
        options.shape(Some(objects), part_size),
        figures,
        Some(first_byte),
        cleanup,
    )
}

/// Deletes `keys` (`total` of them) unless `--keep`.
async fn clean_up(
    client: &aws_sdk_s3::Client,
    options: &ObjectOptions,
    keys: impl Iterator<Item = String>,
    total: u64,
) -> Cleanup {
    if options.keep {
        tracing::info!(keys = total, "--keep: leaving the objects in place");
        return Cleanup {
            kept: true,
            keys: total,
            ..Cleanup::default()
        };
    }
    tracing::info!(keys = total, "deleting the objects of the run");
    let cleanup = delete_keys(client, &options.bucket, keys, total).await;
    if cleanup.failed > 0 {
        tracing::warn!(
            failed = cleanup.failed,
            deleted = cleanup.deleted,
            "some objects could not be deleted"
        );
    }
    cleanup
}

/// Deletes `keys` with DeleteObjects, [`DELETE_BATCH`] keys a request and
/// [`DELETE_IN_FLIGHT`] requests at a time; `total` is their number.
pub async fn delete_keys(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    keys: impl Iterator<Item = String>,
    total: u64,
) -> Cleanup {
    let mut cleanup = Cleanup {
        kept: false,
        keys: total,
        deleted: 0,
        failed: 0,
    };
    let mut keys = keys.peekable();
    let mut in_flight = JoinSet::new();
    loop {
        while in_flight.len() < DELETE_IN_FLIGHT && keys.peek().is_some() {
            let batch: Vec<String> = keys.by_ref().take(DELETE_BATCH).collect();
            in_flight.spawn(delete_batch(client.clone(), bucket.to_owned(), batch));
        }
        let Some(joined) = in_flight.join_next().await else {
            break;
        };
        match joined {
            Ok((deleted, failed)) => {
                cleanup.deleted += deleted;
                cleanup.failed += failed;
            }
            Err(e) => tracing::error!(error = %e, "delete task ended abnormally"),
        }
    }
    // Keys of a batch whose task died are neither deleted nor failed above.
    cleanup.failed = cleanup.failed.max(total.saturating_sub(cleanup.deleted));
    cleanup
}

/// One quiet DeleteObjects; returns (deleted, failed) key counts.
async fn delete_batch(client: aws_sdk_s3::Client, bucket: String, keys: Vec<String>) -> (u64, u64) {
    let count = keys.len() as u64;
    let objects: Result<Vec<ObjectIdentifier>, _> = keys
        .into_iter()
        .map(|key| ObjectIdentifier::builder().key(key).build())
        .collect();
    let delete = objects.and_then(|objects| {
        Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
    });
    let delete = match delete {
        Ok(delete) => delete,
        Err(e) => {
            tracing::error!(error = %e, "cannot build DeleteObjects request");
            return (0, count);
        }
    };
    match client
        .delete_objects()
        .bucket(&bucket)
        .delete(delete)
        .send()
        .await
    {
        Ok(out) => {
            let failed = out.errors().len() as u64;
            if let Some(first) = out.errors().first() {
                tracing::warn!(
                    failed,
                    key = first.key().unwrap_or(""),
                    code = first.code().unwrap_or(""),
                    message = first.message().unwrap_or(""),
                    "DeleteObjects could not delete some keys"
                );
            }
            (count.saturating_sub(failed), failed)
        }
        Err(e) => {
            tracing::warn!(keys = count, error = %DisplayErrorContext(&e), "DeleteObjects failed");
            (0, count)
        }
    }
}

#[cfg(test)]
mod tests;
