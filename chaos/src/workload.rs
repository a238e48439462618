//! The workload: concurrent S3 clients that write, overwrite, delete, read
//! and list objects and record every request in the history
//! ([`crate::history`]), and the final read-back phase.
//!
//! # Clients
//!
//! `--clients` tasks, each with its own aws-sdk-s3 client (built by
//! [`sluice_harness::s3::build_client`]) on endpoint `i mod n` of
//! `--endpoints`, one operation at a time. The SDK makes exactly one
//! attempt per request (`max_attempts = 1`), so every request the server
//! may have seen is in the history; where the workload retries (a failed
//! UploadPart, a read-back GET) the retry is a new recorded operation.
//! Each client draws its choices from a `StdRng` seeded by
//! `splitmix64(seed ^ splitmix64(client))`, and pauses 20–100 ms
//! (`--pause-min`, `--pause-max`) between operations.
//!
//! # Key space
//!
//! * `obj/<client>/<n>`: keys of one client, each written once by a
//!   PutObject or a multipart upload (`n` counts up), later read or deleted
//!   by the same client. At most `--max-live-keys` of them are live per
//!   client: past that, a new-key write turns into a delete, so the test
//!   cluster's disks stay bounded.
//! * `hot/0` .. `hot/<hot-keys - 1>`: shared by every client, overwritten,
//!   deleted and read concurrently, where ordering bugs show.
//!
//! # Operation mix (per client, percent)
//!
//! | op | % |
//! | --- | --- |
//! | PutObject small (1–64 KiB) to a new key | 18 |
//! | PutObject small to a hot key | 12 |
//! | PutObject medium (256 KiB–4 MiB) to a new key | 4 |
//! | PutObject medium to a hot key | 3 |
//! | multipart upload, 2–3 parts (40% to a hot key) | 3 |
//! | DeleteObject of an own live key | 8 |
//! | DeleteObject of a hot key | 4 |
//! | GetObject whole (half hot keys, half own recent keys) | 26 |
//! | GetObject with a `Range` | 12 |
//! | ListObjectsV2, all pages, of `hot/`, `obj/<client>/` or `` | 10 |
//!
//! A multipart upload: CreateMultipartUpload (not recorded: it has no
//! effect a reader can see), UploadPart of parts of 5–6 MiB (85%) or
//! 6–16 MiB, the last part 1 B–1 MiB in 30% of uploads, each recorded
//! ([`Op::UploadPart`]); a part whose request did not succeed is sent
//! again, with the same bytes, up to 3 times. 15% of uploads (and every
//! upload with a part that never succeeded) end with
//! AbortMultipartUpload ([`Op::Abort`]), the others with
//! CompleteMultipartUpload, recorded as an [`Op::Put`] with
//! `multipart = true` whose value is the parts in order.
//!
//! Writes are paced by a process-wide byte budget (`--max-write-mib-s`,
//! default 8 MiB/s of bodies sent), well under what the 3+2 erasure-coded
//! test cluster can absorb.
//!
//! # Values
//!
//! Every write carries a value id unique in the run, `(client << 40) |
//! counter`, in the user metadata [`VALUE_ID_META`] (decimal); the bytes
//! of part `p` (0 for a PutObject, the part number for a multipart upload)
//! are `sluice_harness::data::fill` of `splitmix64(seed ^ splitmix64(id ^
//! splitmix64(p)))`, so the checker regenerates them ([`Value::bytes`]).
//! A read streams the body through SHA-256 and records the value id the
//! object's metadata names, the length and the hash.
//!
//! # Outcome classification ([`classify`])
//!
//! A request ends in one of:
//!
//! * **a 2xx response**: [`Outcome::Ok`] (writes, deletes, parts, aborts),
//!   [`Outcome::Read`] or [`Outcome::Listed`].
//! * **404 `NoSuchKey` on a GET**: `Read { NotFound }`.
//! * **a 4xx response, or 503 `SlowDown`**: [`Outcome::Failed`] with the S3
//!   code. Sound because S3 (and Sluice's gateway) answers 4xx only for a
//!   request it rejected before acting on it (auth, validation, missing
//!   bucket or upload, precondition), and `SlowDown` is the admission and
//!   buffer back-pressure answer, given before anything is committed to
//!   meta. With SDK retries off, no earlier attempt of the same request can
//!   have taken effect behind it.
//! * **no connection**: the connection could not be made (ECONNREFUSED,
//!   the 10 s connect timeout, a TLS handshake failure: hyper-util's
//!   `Connect` error kind): `Failed` with `ConnectionRefused`,
//!   `ConnectTimeout` or `ConnectError`. Sound because hyper writes a
//!   request only on an established connection, so the server never saw a
//!   byte of it. Recognised from the error chain (an `io::Error` of kind
//!   `ConnectionRefused`, which TCP reports only for a connect; the text
//!   `client error (Connect)` of hyper-util's error); if a dependency
//!   changes those, the error falls into the next case, which is
//!   conservative.
//! * **anything else**: [`Outcome::Indeterminate`]: any other 5xx (the
//!   gateway may have committed before failing), the attempt timeout, a
//!   reset or EOF on an established connection, a response that does not
//!   parse, a body that breaks off, an operation abandoned at stop
//!   (`stopped`). The checker treats them as possibly taking effect at any
//!   time after their start, which is always sound.
//!
//! A request that could not even be built (SDK construction failure) is
//! `Failed { ConstructionFailure }`: nothing was sent.
//!
//! # Stopping
//!
//! SIGTERM, SIGINT or `--duration` stop new operations (and multipart
//! uploads between their requests, leaving them open). Operations in
//! flight get `--attempt-timeout` to finish (each attempt is bounded by it
//! anyway); after that, or on a second signal, they are abandoned and
//! recorded `Indeterminate { reason: "stopped" }`. The history writer then
//! drains, and [`run_workload`] prints [`WorkloadStats`] as one JSON line
//! on stdout.
//!
//! # History file
//!
//! One writer thread, fed by a bounded channel (1024 entries), appends one
//! JSON line per entry with a single `write` each, so a killed workload
//! leaves a valid prefix (at worst a torn last line, which
//! [`read_back`] cuts off). Entry ids come from one counter.
//!
//! # Read-back
//!
//! [`read_back`] reads the history, and for every key any [`Op::Put`]
//! names (whatever its outcome) does a whole GetObject, retrying an
//! attempt that did not read (failed or indeterminate) up to 4 more times
//! with backoff, each attempt its own entry; then lists prefix `` (all
//! pages), retried likewise. It runs 4 clients numbered after the
//! history's highest, appends to the history with ids after its highest,
//! and prints `{"final_phase_start_us": N}` on stdout when it starts.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_harness::data::{fill, splitmix64};
use sluice_harness::s3::{ChecksumMode, ClientOptions, ErrorTally, build_client, ensure_bucket};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::history::{self, ByteRange, Entry, Op, Outcome, Part, ReadResult, VALUE_ID_META, Value};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Depth of the channel to the history writer.
const HISTORY_QUEUE: usize = 1024;

/// Retries of an UploadPart whose request did not succeed.
const PART_RETRIES: u32 = 3;

/// Share of multipart uploads aborted instead of completed.
const ABORT_SHARE: f64 = 0.15;

/// Attempts per key in the read-back phase.
const READ_BACK_ATTEMPTS: u32 = 5;

/// Concurrent clients of the read-back phase.
const READ_BACK_CLIENTS: u32 = 4;

/// Slack on top of the attempt timeout for a whole recorded operation
/// (a GET's body is streamed after the SDK's attempt ends).
const OP_SLACK: Duration = Duration::from_secs(5);

/// How to reach the cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// S3 endpoints, comma-separated; client `i` uses endpoint `i mod n`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// PEM file of the CA to trust for `https://` endpoints.
    #[arg(long)]
    pub ca_bundle: Option<PathBuf>,
    /// S3 access key id.
    #[arg(long)]
    pub access_key: String,
    /// S3 secret access key.
    #[arg(long)]
    pub secret_key: String,
    /// Signing region.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Bucket to use (created if missing).
    #[arg(long, default_value = "chaos")]
    pub bucket: String,
    /// Time limit of one request attempt.
    #[arg(long, default_value = "60s")]
    pub attempt_timeout: humantime::Duration,
}

impl Connection {
    /// An S3 client without SDK retries on endpoint `index mod n`, and
    /// without the SDK's response checksum validation: a corrupt body must
    /// reach the checker as bytes (and fail its SHA-256 comparison), not
    /// turn into a transport error that reads as indeterminate.
    fn client(&self, index: u32) -> aws_sdk_s3::Client {
        let endpoint = self.endpoints[index as usize % self.endpoints.len()].clone();
        let client = build_client(
            &ClientOptions {
                endpoint,
                ca_bundle: self.ca_bundle.clone(),
                region: self.region.clone(),
                access_key: self.access_key.clone(),
                secret_key: self.secret_key.clone(),
                max_attempts: 1,
                initial_backoff: Duration::from_millis(100),
                attempt_timeout: *self.attempt_timeout,
                checksum: ChecksumMode::WhenSupported,
            },
            Arc::new(ErrorTally::default()),
        );
        let config = client
            .config()
            .to_builder()
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            )
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.endpoints.is_empty() && self.endpoints.iter().all(|e| !e.trim().is_empty()),
            "--endpoints: empty endpoint in {:?}",
            self.endpoints
        );
        Ok(())
    }

    /// Time limit of one recorded operation.
    fn op_timeout(&self) -> Duration {
        *self.attempt_timeout + OP_SLACK
    }
}

/// `sluice-chaos workload`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// Cluster connection.
    #[command(flatten)]
    pub conn: Connection,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    pub clients: u32,
    /// Run seed: choices and object contents derive from it.
    #[arg(long)]
    pub seed: u64,
    /// History file to write (JSON lines; truncated first).
    #[arg(long)]
    pub history: PathBuf,
    /// Stop after this long (else at SIGTERM or SIGINT).
    #[arg(long)]
    pub duration: Option<humantime::Duration>,
    /// Smallest small PutObject, bytes.
    #[arg(long, default_value_t = KIB)]
    pub small_min: u64,
    /// Largest small PutObject, bytes.
    #[arg(long, default_value_t = 64 * KIB)]
    pub small_max: u64,
    /// Smallest medium PutObject, bytes.
    #[arg(long, default_value_t = 256 * KIB)]
    pub medium_min: u64,
    /// Largest medium PutObject, bytes.
    #[arg(long, default_value_t = 4 * MIB)]
    pub medium_max: u64,
    /// Shared hot keys `hot/0`.. .
    #[arg(long, default_value_t = 4)]
    pub hot_keys: u32,
    /// Live `obj/<client>/` keys per client before new-key writes turn
    /// into deletes.
    #[arg(long, default_value_t = 64)]
    pub max_live_keys: usize,
    /// Budget of bodies sent by all clients together, MiB/s (0: none).
    #[arg(long, default_value_t = 8.0)]
    pub max_write_mib_s: f64,
    /// Shortest pause between two operations of a client.
    #[arg(long, default_value = "20ms")]
    pub pause_min: humantime::Duration,
    /// Longest pause between two operations of a client.
    #[arg(long, default_value = "100ms")]
    pub pause_max: humantime::Duration,
    /// Overwrite storms, `AT/FOR` from the workload's start (e.g.
    /// `40s/60s`): `--storm-clients` more clients overwrite the
    /// `storm/` keys back to back.
    #[arg(long)]
    pub storm: Vec<String>,
    /// Clients of an overwrite storm.
    #[arg(long, default_value_t = 4)]
    pub storm_clients: u32,
    /// Keys `storm/0`.. an overwrite storm writes.
    #[arg(long, default_value_t = 2)]
    pub storm_keys: u32,
    /// Slow readers across an overwrite, each at this time from the
    /// workload's start: a large multipart object is written to
    /// `slow/<n>`, read slowly (`--slow-read-for`), and overwritten then
    /// deleted once its body has started.
    #[arg(long)]
    pub slow_read: Vec<humantime::Duration>,
    /// How long a slow reader takes over its body.
    #[arg(long, default_value = "80s")]
    pub slow_read_for: humantime::Duration,
    /// Parts of a slow reader's object (a multipart upload: each part is
    /// its own blob, whose shards the datanodes open only when the read
    /// reaches it).
    #[arg(long, default_value_t = 8)]
    pub slow_read_parts: u32,
    /// Size of each part of a slow reader's object, MiB (at least 5, S3's
    /// smallest part but the last).
    #[arg(long, default_value_t = 6)]
    pub slow_read_part_mib: u64,
}

/// Parses a `--storm` window, `AT/FOR`.
///
/// # Errors
/// Not two durations.
pub fn parse_window(s: &str) -> anyhow::Result<(Duration, Duration)> {
    let (at, dur) = s
        .split_once('/')
        .with_context(|| format!("storm window `{s}`: want AT/FOR"))?;
    Ok((
        *at.trim().parse::<humantime::Duration>()?,
        *dur.trim().parse::<humantime::Duration>()?,
    ))
}

/// First client number of the storm clients (after the workload's).
const STORM_CLIENT_BASE: u32 = 100;
/// First client number of the slow readers; their overwriters are
/// [`SLOW_OVERWRITER_BASE`] on.
const SLOW_READER_BASE: u32 = 200;
/// First client number of the slow readers' overwriters.
const SLOW_OVERWRITER_BASE: u32 = 300;

/// What a workload did: entries by operation kind and outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadStats {
    /// Seconds from start to the history's last entry written.
    pub elapsed_s: f64,
    /// Entries written.
    pub entries: u64,
    /// Body bytes sent by PutObject and UploadPart (any outcome).
    pub bytes_sent: u64,
    /// Kind (`put`, `put_multipart`, `upload_part`, `abort`, `delete`,
    /// `get`, `get_range`, `list`) → outcome (`ok`, `found`, `not_found`,
    /// `listed`, `failed:<code>`, `indeterminate`) → count.
    pub ops: BTreeMap<String, BTreeMap<String, u64>>,
}

impl WorkloadStats {
    fn add(&mut self, e: &Entry) {
        self.entries += 1;
        let kind = match &e.op {
            Op::Put {
                multipart: false,
                value,
                ..
            } => {
                self.bytes_sent += value.size();
                "put"
            }
            Op::Put {
                multipart: true, ..
            } => "put_multipart",
            Op::UploadPart { part, .. } => {
                self.bytes_sent += part.len;
                "upload_part"
            }
            Op::Abort { .. } => "abort",
            Op::Delete { .. } => "delete",
            Op::Get { range: None, .. } => "get",
            Op::Get { range: Some(_), .. } => "get_range",
            Op::List { .. } => "list",
        };
        let outcome = match &e.outcome {
            Outcome::Ok => "ok".to_owned(),
            Outcome::Read {
                result: ReadResult::Found { .. },
            } => "found".to_owned(),
            Outcome::Read {
                result: ReadResult::NotFound,
            } => "not_found".to_owned(),
            Outcome::Listed { .. } => "listed".to_owned(),
            Outcome::Failed { code } => format!("failed:{code}"),
            Outcome::Indeterminate { .. } => "indeterminate".to_owned(),
        };
        *self
            .ops
            .entry(kind.to_owned())
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
}

// ---------------------------------------------------------------------------
// Outcome classification

/// A request that did not succeed, reduced to what decides its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The server answered with an error status.
    Status {
        /// HTTP status.
        status: u16,
        /// S3 error code, if the body had one.
        code: Option<String>,
    },
    /// No connection was made, so nothing was sent: `ConnectionRefused`,
    /// `ConnectTimeout` or `ConnectError`.
    NotConnected(&'static str),
    /// The request was never built.
    NotBuilt,
    /// The attempt timed out.
    Timeout,
    /// Anything else: the request may have reached the server.
    Unknown(String),
}

/// What `err` says about whether its request was seen.
pub fn failure_of<E>(err: &SdkError<E, HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(e) => Failure::Status {
            status: e.raw().status().as_u16(),
            code: e.err().code().map(str::to_owned),
        },
        SdkError::ConstructionFailure(_) => Failure::NotBuilt,
        SdkError::TimeoutError(_) => Failure::Timeout,
        SdkError::DispatchFailure(_) => match connect_failure(err) {
            Some(code) => Failure::NotConnected(code),
            None => Failure::Unknown(format!("dispatch: {}", DisplayErrorContext(err))),
        },
        SdkError::ResponseError(r) => Failure::Unknown(format!(
            "response (HTTP {}): {}",
            r.raw().status().as_u16(),
            DisplayErrorContext(err)
        )),
        _ => Failure::Unknown(format!("{}", DisplayErrorContext(err))),
    }
}

/// `Some(code)` when the chain of `err` shows that no connection was made:
/// an `io::Error` of kind `ConnectionRefused` (TCP reports it only for a
/// connect) or hyper-util's `Connect` error kind (connector failed: TCP
/// connect, its timeout, TLS handshake; the request is written only to an
/// established connection).
fn connect_failure(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let (mut refused, mut connect, mut timeout) = (false, false, false);
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        connect |= text == "client error (Connect)";
        timeout |= text.contains("HTTP connect timeout");
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => {
                refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
                io.get_ref()
                    .map(|inner| inner as &(dyn std::error::Error + 'static))
            }
            None => e.source(),
        };
    }
    if refused {
        Some("ConnectionRefused")
    } else if connect && timeout {
        Some("ConnectTimeout")
    } else if connect {
        Some("ConnectError")
    } else {
        None
    }
}

/// The outcome of a write, delete, part or abort that did not succeed (see
/// the module docs for the rules).
pub fn classify(failure: &Failure) -> Outcome {
    match failure {
        Failure::Status { status, code } => {
            let code = code.clone().unwrap_or_else(|| format!("HTTP{status}"));
            if (400..500).contains(status) || (*status == 503 && code == "SlowDown") {
                Outcome::Failed { code }
            } else {
                Outcome::Indeterminate {
                    reason: format!("HTTP {status} {code}"),
                }
            }
        }
        Failure::NotConnected(code) => Outcome::Failed {
            code: (*code).to_owned(),
        },
        Failure::NotBuilt => Outcome::Failed {
            code: "ConstructionFailure".to_owned(),
        },
        Failure::Timeout => Outcome::Indeterminate {
            reason: "attempt timeout".to_owned(),
        },
        Failure::Unknown(reason) => Outcome::Indeterminate {
            reason: reason.clone(),
        },
    }
}

/// The outcome of a GET that did not succeed: 404 `NoSuchKey` is a read of
/// nothing, the rest as [`classify`].
pub fn classify_read(failure: &Failure) -> Outcome {
    match failure {
        Failure::Status {
            status: 404,
            code: Some(code),
        } if code == "NoSuchKey" => Outcome::Read {
            result: ReadResult::NotFound,
        },
        other => classify(other),
    }
}

fn indeterminate(reason: &str) -> Outcome {
    Outcome::Indeterminate {
        reason: reason.to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Requests

/// Seed of part `part` of value `value_id`.
pub fn value_seed(run_seed: u64, value_id: u64, part: u32) -> u64 {
    splitmix64(run_seed ^ splitmix64(value_id ^ splitmix64(u64::from(part))))
}

fn part_bytes(part: Part) -> Bytes {
    let mut buf = vec![0u8; part.len as usize];
    fill(part.seed, &mut buf);
    Bytes::from(buf)
}

async fn put_object(
    s3: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    id: u64,
    body: Bytes,
) -> Outcome {
    let request = s3
        .put_object()
        .bucket(bucket)
        .key(key)
        .metadata(VALUE_ID_META, id.to_string())
        .body(ByteStream::from(body));
    match request.send().await {
        Ok(_) => Outcome::Ok,
        Err(e) => classify(&failure_of(&e)),
    }
}

async fn delete_object(s3: aws_sdk_s3::Client, bucket: String, key: String) -> Outcome {
    match s3.delete_object().bucket(bucket).key(key).send().await {
        Ok(_) => Outcome::Ok,
        Err(e) => classify(&failure_of(&e)),
    }
}

/// How a slow reader reads a body: at `bytes_per_s`, `started` firing
/// when the first bytes arrived.
struct Pace {
    bytes_per_s: f64,
    started: tokio::sync::oneshot::Sender<()>,
}

/// GetObject of `range` (the whole object without one), reading its body
/// as fast as it comes or at `pace`.
async fn get_object(
    s3: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    range: Option<ByteRange>,
    pace: Option<Pace>,
) -> Outcome {
    let mut request = s3.get_object().bucket(bucket).key(key);
    if let Some(r) = range {
        request = request.range(format!("bytes={}-{}", r.first, r.last));
    }
    let out = match request.send().await {
        Ok(out) => out,
        Err(e) => return classify_read(&failure_of(&e)),
    };
    let value_id = out
        .metadata()
        .and_then(|m| m.get(VALUE_ID_META))
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = out.body;
    let mut hash = Sha256::new();
    let mut len = 0u64;
    let (bytes_per_s, mut started) = match pace {
        Some(p) => (Some(p.bytes_per_s), Some(p.started)),
        None => (None, None),
    };
    let t0 = Instant::now();
    loop {
        match body.next().await {
            None => break,
            Some(Ok(chunk)) => {
                len += chunk.len() as u64;
                hash.update(&chunk);
                if let Some(tx) = started.take() {
                    let _ = tx.send(());
                }
                if let Some(rate) = bytes_per_s {
                    tokio::time::sleep_until(t0 + Duration::from_secs_f64(len as f64 / rate)).await;
                }
            }
            Some(Err(e)) => {
                return Outcome::Indeterminate {
                    reason: format!(
                        "body broke off after {len} bytes: {}",
                        DisplayErrorContext(&e)
                    ),
                };
            }
        }
    }
    Outcome::Read {
        result: ReadResult::Found {
            value_id,
            len,
            hash: hex::encode(hash.finalize()),
        },
    }
}

async fn list_objects(s3: aws_sdk_s3::Client, bucket: String, prefix: String) -> Outcome {
    let mut keys = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut request = s3.list_objects_v2().bucket(&bucket);
        if !prefix.is_empty() {
            request = request.prefix(&prefix);
        }
        if let Some(t) = token.take() {
            request = request.continuation_token(t);
        }
        let out = match request.send().await {
            Ok(out) => out,
            Err(e) => return classify(&failure_of(&e)),
        };
        keys.extend(
            out.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned)),
        );
        if out.is_truncated() != Some(true) {
            return Outcome::Listed { keys };
        }
        token = out.next_continuation_token().map(str::to_owned);
        if token.is_none() {
            return indeterminate("truncated listing without a continuation token");
        }
    }
}

// ---------------------------------------------------------------------------
// History writing

/// Sends finished operations to the history writer.
#[derive(Clone)]
struct Recorder {
    tx: mpsc::Sender<Entry>,
    next_id: Arc<AtomicU64>,
}

impl Recorder {
    async fn record(&self, client: u32, start_us: u64, op: Op, outcome: Outcome) {
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            client,
            start_us,
            end_us: history::now_us(),
            op,
            outcome,
        };
        if self.tx.send(entry).await.is_err() {
            tracing::error!("history writer gone; entry lost");
        }
    }

    fn broken(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Starts the writer thread on `path` (appending or truncating); its
/// result is the tally of what it wrote.
fn spawn_writer(
    path: &Path,
    append: bool,
    first_id: u64,
) -> anyhow::Result<(
    Recorder,
    tokio::task::JoinHandle<anyhow::Result<WorkloadStats>>,
)> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .with_context(|| format!("opening the history {}", path.display()))?;
    let (tx, mut rx) = mpsc::channel::<Entry>(HISTORY_QUEUE);
    let shown = path.display().to_string();
    let writer = tokio::task::spawn_blocking(move || -> anyhow::Result<WorkloadStats> {
        let mut stats = WorkloadStats::default();
        let mut line = Vec::with_capacity(4096);
        while let Some(entry) = rx.blocking_recv() {
            line.clear();
            serde_json::to_writer(&mut line, &entry)?;
            line.push(b'\n');
            // One write per line, no user-space buffer: each line is in the
            // file once written, whatever happens to this process after.
            file.write_all(&line)
                .with_context(|| format!("writing the history {shown}"))?;
            stats.add(&entry);
        }
        file.flush()?;
        file.sync_data().ok();
        Ok(stats)
    });
    let recorder = Recorder {
        tx,
        next_id: Arc::new(AtomicU64::new(first_id)),
    };
    Ok((recorder, writer))
}

/// Resolves once `rx` holds `true` (or its sender is gone).
async fn fired(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Runs and records operations of one client.
#[derive(Clone)]
struct Requester {
    client: u32,
    recorder: Recorder,
    /// Fires when operations in flight are to be given up.
    abandon: Option<watch::Receiver<bool>>,
    op_timeout: Duration,
}

impl Requester {
    /// Runs `fut`, bounded by the operation timeout and the abandon signal,
    /// and records it as `op`.
    async fn run<T>(
        &self,
        op: Op,
        fut: impl Future<Output = (Outcome, Option<T>)>,
    ) -> (Outcome, Option<T>) {
        let start = history::now_us();
        // Boxed: the SDK's futures are large.
        let fut = Box::pin(fut);
        let bounded = async {
            tokio::time::timeout(self.op_timeout, fut)
                .await
                .unwrap_or_else(|_| (indeterminate("operation timeout"), None))
        };
        let (outcome, extra) = match self.abandon.clone() {
            Some(mut abandon) => tokio::select! {
                r = bounded => r,
                () = fired(&mut abandon) => (indeterminate("stopped"), None),
            },
            None => bounded.await,
        };
        self.recorder
            .record(self.client, start, op, outcome.clone())
            .await;
        (outcome, extra)
    }

    async fn run_plain(&self, op: Op, fut: impl Future<Output = Outcome>) -> Outcome {
        self.run::<()>(op, async { (fut.await, None) }).await.0
    }
}

// ---------------------------------------------------------------------------
// The workload

/// Process-wide pacing of bodies sent.
struct Pacer {
    bytes_per_s: f64,
    next: Mutex<Instant>,
}

impl Pacer {
    /// When a write of `bytes` may start.
    fn reserve(&self, bytes: u64) -> Instant {
        let now = Instant::now();
        if self.bytes_per_s <= 0.0 {
            return now;
        }
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let start = (*next).max(now);
        *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_s);
        start
    }
}

struct Shared {
    args: WorkloadArgs,
    pacer: Pacer,
}

#[derive(Debug, Clone, Copy)]
enum Choice {
    PutSmallNew,
    PutSmallHot,
    PutMediumNew,
    PutMediumHot,
    Multipart,
    DeleteOwn,
    DeleteHot,
    Get,
    GetRange,
    List,
}

/// The operation mix, percent (see the module docs).
const MIX: [(Choice, u32); 10] = [
    (Choice::PutSmallNew, 18),
    (Choice::PutSmallHot, 12),
    (Choice::PutMediumNew, 4),
    (Choice::PutMediumHot, 3),
    (Choice::Multipart, 3),
    (Choice::DeleteOwn, 8),
    (Choice::DeleteHot, 4),
    (Choice::Get, 26),
    (Choice::GetRange, 12),
    (Choice::List, 10),
];

/// Own keys recently written, for reads.
const RECENT_KEYS: usize = 256;

struct Client {
    id: u32,
    s3: aws_sdk_s3::Client,
    shared: Arc<Shared>,
    req: Requester,
    stop: watch::Receiver<bool>,
    rng: StdRng,
    values: u64,
    keys: u64,
    /// Own keys that may hold a value (not deleted since).
    live: Vec<String>,
    /// Own keys written, newest last.
    recent: VecDeque<String>,
    /// Size of the last value this client wrote under a key.
    sizes: HashMap<String, u64>,
}

impl Client {
    fn bucket(&self) -> String {
        self.shared.args.conn.bucket.clone()
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow() || self.req.recorder.broken()
    }

    fn next_value_id(&mut self) -> u64 {
        self.values += 1;
        (u64::from(self.id) << 40) | self.values
    }

    fn new_key(&mut self) -> String {
        self.keys += 1;
        format!("obj/{}/{}", self.id, self.keys)
    }

    fn hot_key(&mut self) -> String {
        format!(
            "hot/{}",
            self.rng.gen_range(0..self.shared.args.hot_keys.max(1))
        )
    }

    /// Waits for the write budget of `bytes`; false if stopped meanwhile.
    async fn pace(&mut self, bytes: u64) -> bool {
        let at = self.shared.pacer.reserve(bytes);
        let mut stop = self.stop.clone();
        tokio::select! {
            () = tokio::time::sleep_until(at) => !self.stopped(),
            () = fired(&mut stop) => false,
        }
    }

    fn wrote(&mut self, key: &str, size: u64, outcome: &Outcome) {
        self.sizes.insert(key.to_owned(), size);
        if key.starts_with("obj/") {
            if !matches!(outcome, Outcome::Failed { .. }) && !self.live.iter().any(|k| k == key) {
                self.live.push(key.to_owned());
            }
            if !self.recent.iter().any(|k| k == key) {
                self.recent.push_back(key.to_owned());
                if self.recent.len() > RECENT_KEYS {
                    self.recent.pop_front();
                }
            }
        }
    }

    async fn run(mut self) {
        while !self.stopped() {
            let mut roll = self.rng.gen_range(0..100);
            let mut choice = Choice::List;
            for (c, weight) in MIX {
                if roll < weight {
                    choice = c;
                    break;
                }
                roll -= weight;
            }
            self.step(choice).await;
            let (lo, hi) = (*self.shared.args.pause_min, *self.shared.args.pause_max);
            let pause = if hi > lo {
                self.rng.gen_range(lo..=hi)
            } else {
                lo
            };
            let mut stop = self.stop.clone();
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = fired(&mut stop) => break,
            }
        }
    }

    async fn step(&mut self, choice: Choice) {
        let a = &self.shared.args;
        let (small, medium) = ((a.small_min, a.small_max), (a.medium_min, a.medium_max));
        let full = self.live.len() >= a.max_live_keys;
        match choice {
            Choice::PutSmallNew | Choice::PutMediumNew | Choice::Multipart if full => {
                self.delete_own().await
            }
            Choice::PutSmallNew => {
                let key = self.new_key();
                self.put(key, small).await;
            }
            Choice::PutMediumNew => {
                let key = self.new_key();
                self.put(key, medium).await;
            }
            Choice::PutSmallHot => {
                let key = self.hot_key();
                self.put(key, small).await;
            }
            Choice::PutMediumHot => {
                let key = self.hot_key();
                self.put(key, medium).await;
            }
            Choice::Multipart => {
                let key = if self.rng.gen_bool(0.4) {
                    self.hot_key()
                } else {
                    self.new_key()
                };
                self.multipart(key).await;
            }
            Choice::DeleteOwn => self.delete_own().await,
            Choice::DeleteHot => {
                let key = self.hot_key();
                self.delete(key).await;
            }
            Choice::Get | Choice::GetRange => {
                let key = if self.recent.is_empty() || self.rng.gen_bool(0.5) {
                    self.hot_key()
                } else {
                    self.recent[self.rng.gen_range(0..self.recent.len())].clone()
                };
                let range = matches!(choice, Choice::GetRange).then(|| {
                    let size = self.sizes.get(&key).copied().unwrap_or(64 * KIB).max(1);
                    let first = self.rng.gen_range(0..size);
                    // Sometimes past the end: S3 clamps the last byte.
                    let span = if self.rng.gen_bool(0.1) {
                        1 << 30
                    } else {
                        self.rng.gen_range(0..256 * KIB)
                    };
                    ByteRange {
                        first,
                        last: first + span,
                    }
                });
                let fut = get_object(self.s3.clone(), self.bucket(), key.clone(), range, None);
                self.req.run_plain(Op::Get { key, range }, fut).await;
            }
            Choice::List => {
                let prefix = match self.rng.gen_range(0..3) {
                    0 => "hot/".to_owned(),
                    1 => format!("obj/{}/", self.id),
                    _ => String::new(),
                };
                let fut = list_objects(self.s3.clone(), self.bucket(), prefix.clone());
                self.req.run_plain(Op::List { prefix }, fut).await;
            }
        }
    }

    async fn put(&mut self, key: String, (min, max): (u64, u64)) {
        let id = self.next_value_id();
        let len = if max > min {
            self.rng.gen_range(min..=max)
        } else {
            min
        };
        if !self.pace(len).await {
            return;
        }
        let part = Part {
            seed: value_seed(self.shared.args.seed, id, 0),
            len,
        };
        let body = part_bytes(part);
        let op = Op::Put {
            key: key.clone(),
            value: Value {
                id,
                parts: vec![part],
            },
            multipart: false,
        };
        let fut = put_object(self.s3.clone(), self.bucket(), key.clone(), id, body);
        let outcome = self.req.run_plain(op, fut).await;
        self.wrote(&key, len, &outcome);
    }

    async fn delete_own(&mut self) {
        if self.live.is_empty() {
            let key = self.hot_key();
            return self.delete(key).await;
        }
        let i = self.rng.gen_range(0..self.live.len());
        let key = self.live[i].clone();
        self.delete(key).await;
    }

    async fn delete(&mut self, key: String) {
        let fut = delete_object(self.s3.clone(), self.bucket(), key.clone());
        let outcome = self
            .req
            .run_plain(Op::Delete { key: key.clone() }, fut)
            .await;
        if outcome == Outcome::Ok {
            self.live.retain(|k| *k != key);
        }
    }

    fn part_len(&mut self, last: bool) -> u64 {
        if last && self.rng.gen_bool(0.3) {
            self.rng.gen_range(1..=MIB)
        } else if self.rng.gen_bool(0.85) {
            self.rng.gen_range(5 * MIB..=6 * MIB)
        } else {
            self.rng.gen_range(6 * MIB..=16 * MIB)
        }
    }

    async fn multipart(&mut self, key: String) {
        let id = self.next_value_id();
        let count: u32 = self.rng.gen_range(2..=3);
        let run_seed = self.shared.args.seed;
        let parts: Vec<Part> = (1..=count)
            .map(|n| Part {
                seed: value_seed(run_seed, id, n),
                len: self.part_len(n == count),
            })
            .collect();
        let abort = self.rng.gen_bool(ABORT_SHARE);
        if !self.pace(parts.iter().map(|p| p.len).sum()).await {
            return;
        }
        let bucket = self.bucket();
        // CreateMultipartUpload is not recorded: nothing a reader sees
        // depends on it.
        let create = self
            .s3
            .create_multipart_upload()
            .bucket(&bucket)
            .key(&key)
            .metadata(VALUE_ID_META, id.to_string())
            .send();
        let upload_id = match tokio::time::timeout(self.req.op_timeout, create).await {
            Ok(Ok(out)) => match out.upload_id() {
                Some(u) => u.to_owned(),
                None => return tracing::warn!(key, "CreateMultipartUpload without an upload id"),
            },
            Ok(Err(e)) => {
                return tracing::debug!(key, err = %DisplayErrorContext(&e), "CreateMultipartUpload failed");
            }
            Err(_) => return tracing::debug!(key, "CreateMultipartUpload timed out"),
        };
        let stop = self.stop.clone();
        let recorder = self.req.recorder.clone();
        let stopped = move || *stop.borrow() || recorder.broken();
        let completed = upload_parts(
            &self.s3, &self.req, &bucket, &key, &upload_id, &parts, &stopped,
        )
        .await;
        if self.stopped() {
            return;
        }
        let completed = match completed {
            Some(c) if !abort => c,
            _ => {
                abort_upload(&self.s3, &self.req, &bucket, &key, upload_id).await;
                return;
            }
        };
        let size = parts.iter().map(|p| p.len).sum();
        let value = Value { id, parts };
        let outcome = complete_upload(
            &self.s3, &self.req, &bucket, &key, &upload_id, value, completed,
        )
        .await;
        self.wrote(&key, size, &outcome);
    }
}

/// A client of an overwrite storm: small PutObjects to `storm/<k>` back to
/// back (one GET in ten, so reads see the storm too) within its window.
struct Storm {
    id: u32,
    s3: aws_sdk_s3::Client,
    shared: Arc<Shared>,
    req: Requester,
    stop: watch::Receiver<bool>,
    rng: StdRng,
    from: Instant,
    until: Instant,
}

impl Storm {
    async fn run(mut self) {
        let mut stop = self.stop.clone();
        tokio::select! {
            () = tokio::time::sleep_until(self.from) => {}
            () = fired(&mut stop) => return,
        }
        let bucket = self.shared.args.conn.bucket.clone();
        let mut values = 0u64;
        while Instant::now() < self.until && !*self.stop.borrow() && !self.req.recorder.broken() {
            let key = format!(
                "storm/{}",
                self.rng.gen_range(0..self.shared.args.storm_keys.max(1))
            );
            if self.rng.gen_range(0..10) == 0 {
                let fut = get_object(self.s3.clone(), bucket.clone(), key.clone(), None, None);
                self.req.run_plain(Op::Get { key, range: None }, fut).await;
                continue;
            }
            values += 1;
            let id = (u64::from(self.id) << 40) | values;
            let len = self.rng.gen_range(KIB..=8 * KIB);
            let at = self.shared.pacer.reserve(len);
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = fired(&mut stop) => return,
            }
            let part = Part {
                seed: value_seed(self.shared.args.seed, id, 0),
                len,
            };
            let op = Op::Put {
                key: key.clone(),
                value: Value {
                    id,
                    parts: vec![part],
                },
                multipart: false,
            };
            let fut = put_object(self.s3.clone(), bucket.clone(), key, id, part_bytes(part));
            self.req.run_plain(op, fut).await;
        }
    }
}

/// A slow reader across an overwrite: writes a large object to
/// `slow/<n>` as a multipart upload (`--slow-read-parts` parts, each its
/// own blob), GETs it reading the body at a pace that takes
/// `--slow-read-for`, and once the body has started, overwrites the key and
/// deletes it from another client. The later parts' blobs are opened only
/// when the read reaches them, after the reclaimer could have taken them:
/// only the GET's read lease keeps them. The GET is one recorded
/// operation: the run requires it to come back whole with the original
/// bytes.
struct SlowReader {
    n: usize,
    s3: aws_sdk_s3::Client,
    s3_writer: aws_sdk_s3::Client,
    shared: Arc<Shared>,
    req: Requester,
    writer: Requester,
    stop: watch::Receiver<bool>,
    at: Instant,
}

impl SlowReader {
    async fn run(self) {
        let mut stop = self.stop.clone();
        tokio::select! {
            () = tokio::time::sleep_until(self.at) => {}
            () = fired(&mut stop) => return,
        }
        let args = &self.shared.args;
        let bucket = args.conn.bucket.clone();
        let key = format!("slow/{}", self.n);
        let id = (u64::from(self.req.client) << 40) | 1;
        let parts: Vec<Part> = (1..=args.slow_read_parts.max(1))
            .map(|n| Part {
                seed: value_seed(args.seed, id, n),
                len: args.slow_read_part_mib * MIB,
            })
            .collect();
        let size: u64 = parts.iter().map(|p| p.len).sum();
        let outcome = put_multipart_object(
            &self.s3,
            &self.writer,
            &bucket,
            &key,
            Value { id, parts },
            &self.stop,
        )
        .await;
        if outcome != Outcome::Ok {
            tracing::warn!(%key, ?outcome, "slow reader: the original write was not acknowledged");
            return;
        }
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let overwrite = {
            let writer = self.writer.clone();
            let s3 = self.s3_writer.clone();
            let (bucket, key, seed) = (bucket.clone(), key.clone(), args.seed);
            async move {
                if started_rx.await.is_err() {
                    return;
                }
                let id = (u64::from(writer.client) << 40) | 1;
                let part = Part {
                    seed: value_seed(seed, id, 0),
                    len: 64 * KIB,
                };
                let op = Op::Put {
                    key: key.clone(),
                    value: Value {
                        id,
                        parts: vec![part],
                    },
                    multipart: false,
                };
                let fut = put_object(
                    s3.clone(),
                    bucket.clone(),
                    key.clone(),
                    id,
                    part_bytes(part),
                );
                writer.run_plain(op, fut).await;
                let fut = delete_object(s3, bucket, key.clone());
                writer.run_plain(Op::Delete { key }, fut).await;
            }
        };
        let overwriter = tokio::spawn(overwrite);
        let rate = size as f64 / args.slow_read_for.as_secs_f64().max(1.0);
        let pace = Pace {
            bytes_per_s: rate,
            started: started_tx,
        };
        let fut = get_object(self.s3.clone(), bucket, key.clone(), None, Some(pace));
        let outcome = self
            .req
            .run_plain(
                Op::Get {
                    key: key.clone(),
                    range: None,
                },
                fut,
            )
            .await;
        tracing::info!(%key, ?outcome, "slow reader done");
        let _ = overwriter.await;
    }
}

/// A multipart upload of `value` to `key` (parts retried with the same
/// bytes up to [`PART_RETRIES`] times, aborted if one still fails),
/// recorded as the normal clients record theirs: the outcome of the
/// CompleteMultipartUpload, or of the abort (never `Ok` then).
async fn put_multipart_object(
    s3: &aws_sdk_s3::Client,
    req: &Requester,
    bucket: &str,
    key: &str,
    value: Value,
    stop: &watch::Receiver<bool>,
) -> Outcome {
    let create = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .metadata(VALUE_ID_META, value.id.to_string())
        .send();
    let upload_id = match tokio::time::timeout(req.op_timeout, create).await {
        Ok(Ok(out)) => match out.upload_id() {
            Some(u) => u.to_owned(),
            None => {
                return Outcome::Failed {
                    code: "CreateMultipartUpload without an upload id".into(),
                };
            }
        },
        Ok(Err(e)) => {
            return Outcome::Failed {
                code: format!("CreateMultipartUpload: {}", DisplayErrorContext(&e)),
            };
        }
        Err(_) => {
            return Outcome::Failed {
                code: "CreateMultipartUpload timed out".into(),
            };
        }
    };
    let stopped = || *stop.borrow();
    let Some(completed) =
        upload_parts(s3, req, bucket, key, &upload_id, &value.parts, &stopped).await
    else {
        abort_upload(s3, req, bucket, key, upload_id).await;
        return Outcome::Failed {
            code: "a part was not uploaded; upload aborted".into(),
        };
    };
    complete_upload(s3, req, bucket, key, &upload_id, value, completed).await
}

/// Uploads `parts` of upload `upload_id`, each retried with the same bytes
/// up to [`PART_RETRIES`] times, every attempt recorded: the completed
/// parts, or `None` when one still failed or `stopped` said so.
async fn upload_parts(
    s3: &aws_sdk_s3::Client,
    req: &Requester,
    bucket: &str,
    key: &str,
    upload_id: &str,
    parts: &[Part],
    stopped: &(dyn Fn() -> bool + Sync),
) -> Option<Vec<CompletedPart>> {
    let mut completed = Vec::new();
    for (part_number, part) in (1..).zip(parts) {
        let body = part_bytes(*part);
        let mut etag = None;
        for attempt in 0..=PART_RETRIES {
            if stopped() {
                return None;
            }
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
            }
            let op = Op::UploadPart {
                key: key.to_owned(),
                upload_id: upload_id.to_owned(),
                part_number,
                part: *part,
            };
            let request = s3
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(part_number as i32)
                .body(ByteStream::from(body.clone()))
                .send();
            let fut = async {
                match request.await {
                    Ok(out) => (Outcome::Ok, out.e_tag().map(str::to_owned)),
                    Err(e) => (classify(&failure_of(&e)), None),
                }
            };
            if let (_, Some(tag)) = req.run(op, fut).await {
                etag = Some(tag);
                break;
            }
        }
        completed.push(
            CompletedPart::builder()
                .part_number(part_number as i32)
                .e_tag(etag?)
                .build(),
        );
    }
    Some(completed)
}

/// AbortMultipartUpload of `upload_id`, recorded.
async fn abort_upload(
    s3: &aws_sdk_s3::Client,
    req: &Requester,
    bucket: &str,
    key: &str,
    upload_id: String,
) {
    let request = s3
        .abort_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .send();
    let fut = async {
        match request.await {
            Ok(_) => Outcome::Ok,
            Err(e) => classify(&failure_of(&e)),
        }
    };
    let op = Op::Abort {
        key: key.to_owned(),
        upload_id,
    };
    req.run_plain(op, fut).await;
}

/// CompleteMultipartUpload of `completed`, recorded as the put of `value`.
async fn complete_upload(
    s3: &aws_sdk_s3::Client,
    req: &Requester,
    bucket: &str,
    key: &str,
    upload_id: &str,
    value: Value,
    completed: Vec<CompletedPart>,
) -> Outcome {
    let request = s3
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(completed))
                .build(),
        )
        .send();
    let fut = async {
        match request.await {
            Ok(_) => Outcome::Ok,
            Err(e) => classify(&failure_of(&e)),
        }
    };
    let op = Op::Put {
        key: key.to_owned(),
        value,
        multipart: true,
    };
    req.run_plain(op, fut).await
}

/// Creates the bucket if missing, retrying until it exists or `stop`
/// fires (false then).
async fn bucket_ready(conn: &Connection, stop: &mut watch::Receiver<bool>) -> bool {
    let s3 = conn.client(0);
    loop {
        let attempt = tokio::time::timeout(
            conn.op_timeout(),
            ensure_bucket(&s3, &conn.bucket, &conn.region),
        );
        let result = tokio::select! {
            r = attempt => r,
            () = fired(stop) => return false,
        };
        match result {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => {
                tracing::warn!(err = %DisplayErrorContext(&e), bucket = conn.bucket, "bucket not ready; retrying")
            }
            Err(_) => tracing::warn!(bucket = conn.bucket, "bucket check timed out; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = fired(stop) => return false,
        }
    }
}

/// Runs the workload until SIGTERM, SIGINT or `--duration`, writing the
/// history; prints the stats as one JSON line on stdout and returns them.
///
/// # Errors
/// The history cannot be written, or the signal handlers not installed.
pub async fn run_workload(args: WorkloadArgs) -> anyhow::Result<WorkloadStats> {
    use tokio::signal::unix::{SignalKind, signal};
    args.conn.check()?;
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    for w in &args.storm {
        parse_window(w)?;
    }
    anyhow::ensure!(
        args.small_min <= args.small_max && args.medium_min <= args.medium_max,
        "size range with min above max"
    );
    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (abandon_tx, abandon_rx) = watch::channel(false);
    let grace = *args.conn.attempt_timeout;
    let duration: Option<Duration> = args.duration.map(|d| *d);
    let stopper = tokio::spawn(async move {
        let until_end = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let why = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
            () = until_end => "duration elapsed",
        };
        tracing::info!(why, "stopping: no new operations");
        let _ = stop_tx.send(true);
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
        tracing::info!("abandoning operations still in flight");
        let _ = abandon_tx.send(true);
        // Keep the senders until the run ends.
        std::future::pending::<()>().await;
    });

    let (recorder, writer) = spawn_writer(&args.history, false, 0)?;
    let mut stop = stop_rx.clone();
    if bucket_ready(&args.conn, &mut stop).await {
        tracing::info!(
            clients = args.clients,
            bucket = args.conn.bucket,
            "bucket ready; clients starting"
        );
        let shared = Arc::new(Shared {
            pacer: Pacer {
                bytes_per_s: args.max_write_mib_s * MIB as f64,
                next: Mutex::new(Instant::now()),
            },
            args: args.clone(),
        });
        let mut tasks = tokio::task::JoinSet::new();
        for id in 0..args.clients {
            let client = Client {
                id,
                s3: args.conn.client(id),
                shared: shared.clone(),
                req: Requester {
                    client: id,
                    recorder: recorder.clone(),
                    abandon: Some(abandon_rx.clone()),
                    op_timeout: args.conn.op_timeout(),
                },
                stop: stop_rx.clone(),
                rng: StdRng::seed_from_u64(splitmix64(args.seed ^ splitmix64(u64::from(id)))),
                values: 0,
                keys: 0,
                live: Vec::new(),
                recent: VecDeque::new(),
                sizes: HashMap::new(),
            };
            tasks.spawn(Box::pin(client.run()));
        }
        let requester = |client: u32, op_timeout: Duration| Requester {
            client,
            recorder: recorder.clone(),
            abandon: Some(abandon_rx.clone()),
            op_timeout,
        };
        for window in &args.storm {
            let (at, dur) = parse_window(window)?;
            for i in 0..args.storm_clients {
                let id = STORM_CLIENT_BASE + i;
                let storm = Storm {
                    id,
                    s3: args.conn.client(id),
                    shared: shared.clone(),
                    req: requester(id, args.conn.op_timeout()),
                    stop: stop_rx.clone(),
                    rng: StdRng::seed_from_u64(splitmix64(args.seed ^ splitmix64(u64::from(id)))),
                    from: started + at,
                    until: started + at + dur,
                };
                tasks.spawn(Box::pin(storm.run()));
            }
        }
        for (j, at) in args.slow_read.iter().enumerate() {
            let reader = SLOW_READER_BASE + j as u32;
            let writer = SLOW_OVERWRITER_BASE + j as u32;
            let slow = SlowReader {
                n: j,
                s3: args.conn.client(reader),
                s3_writer: args.conn.client(writer + 1),
                shared: shared.clone(),
                req: requester(reader, *args.slow_read_for + args.conn.op_timeout()),
                writer: requester(writer, args.conn.op_timeout()),
                stop: stop_rx.clone(),
                at: started + **at,
            };
            tasks.spawn(Box::pin(slow.run()));
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                tracing::error!(err = %e, "client task failed");
            }
        }
    }
    stopper.abort();
    drop(recorder);
    let mut stats = writer.await.context("history writer")??;
    stats.elapsed_s = started.elapsed().as_secs_f64();
    println!("{}", serde_json::to_string(&stats)?);
    std::io::stdout().flush()?;
    Ok(stats)
}

// ---------------------------------------------------------------------------
// Read-back

/// `sluice-chaos read-back`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReadBackArgs {
    /// Cluster connection.
    #[command(flatten)]
    pub conn: Connection,
    /// History of the workload; the final phase is appended to it.
    #[arg(long)]
    pub history: PathBuf,
}

/// Cuts a torn last line (a workload killed mid-write) off `path`.
fn cut_torn_tail(path: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if keep < bytes.len() {
        tracing::warn!(
            path = %path.display(),
            bytes = bytes.len() - keep,
            "history ends with a torn line; cutting it off"
        );
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(keep as u64)?;
    }
    Ok(())
}

/// GETs `key` whole until a read comes back, up to [`READ_BACK_ATTEMPTS`].
async fn read_back_key(s3: &aws_sdk_s3::Client, req: &Requester, bucket: &str, key: &str) {
    for attempt in 0..READ_BACK_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
        }
        let fut = get_object(s3.clone(), bucket.to_owned(), key.to_owned(), None, None);
        let outcome = req
            .run_plain(
                Op::Get {
                    key: key.to_owned(),
                    range: None,
                },
                fut,
            )
            .await;
        if matches!(outcome, Outcome::Read { .. }) {
            return;
        }
    }
    tracing::warn!(key, "no read in {READ_BACK_ATTEMPTS} attempts");
}

/// The final phase: a whole GET of every key any Put in the history
/// names, then a listing of the bucket, appended to the history. Prints
/// `{"final_phase_start_us": N}` on stdout as it starts.
///
/// # Errors
/// The history cannot be read or appended to.
pub async fn read_back(args: ReadBackArgs) -> anyhow::Result<()> {
    args.conn.check()?;
    cut_torn_tail(&args.history)?;
    let entries = history::read_jsonl(&args.history)?;
    let first_id = entries.iter().map(|e| e.id + 1).max().unwrap_or(0);
    let first_client = entries.iter().map(|e| e.client + 1).max().unwrap_or(0);
    let keys: BTreeSet<String> = entries
        .iter()
        .filter_map(|e| match &e.op {
            Op::Put { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    drop(entries);
    let start = history::now_us();
    println!("{}", serde_json::json!({ "final_phase_start_us": start }));
    std::io::stdout().flush()?;
    tracing::info!(keys = keys.len(), "read-back starting");

    let (recorder, writer) = spawn_writer(&args.history, true, first_id)?;
    let queue = Arc::new(Mutex::new(keys.into_iter().collect::<VecDeque<_>>()));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..READ_BACK_CLIENTS {
        let client = first_client + i;
        let s3 = args.conn.client(i);
        let req = Requester {
            client,
            recorder: recorder.clone(),
            abandon: None,
            op_timeout: args.conn.op_timeout(),
        };
        let (queue, bucket) = (queue.clone(), args.conn.bucket.clone());
        tasks.spawn(async move {
            loop {
                let key = queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                let Some(key) = key else { break };
                read_back_key(&s3, &req, &bucket, &key).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("read-back client")?;
    }
    let req = Requester {
        client: first_client,
        recorder: recorder.clone(),
        abandon: None,
        op_timeout: args.conn.op_timeout(),
    };
    let s3 = args.conn.client(0);
    for attempt in 0..READ_BACK_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
        }
        let fut = list_objects(s3.clone(), args.conn.bucket.clone(), String::new());
        if let Outcome::Listed { .. } = req
            .run_plain(
                Op::List {
                    prefix: String::new(),
                },
                fut,
            )
            .await
        {
            break;
        }
    }
    drop((req, recorder));
    let stats = writer.await.context("history writer")??;
    tracing::info!(stats = %serde_json::to_string(&stats)?, "read-back done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_s3::operation::put_object::PutObjectError;
    use aws_sdk_s3::primitives::SdkBody;

    fn failed(code: &str) -> Outcome {
        Outcome::Failed {
            code: code.to_owned(),
        }
    }

    fn status(status: u16, code: Option<&str>) -> Failure {
        Failure::Status {
            status,
            code: code.map(str::to_owned),
        }
    }

    fn service_error(http: u16, code: &str) -> SdkError<PutObjectError, HttpResponse> {
        let err = PutObjectError::generic(ErrorMetadata::builder().code(code).build());
        let raw = HttpResponse::new(http.try_into().unwrap(), SdkBody::empty());
        SdkError::service_error(err, raw)
    }

    #[test]
    fn client_errors_and_slow_down_failed_server_errors_indeterminate() {
        assert_eq!(
            classify(&status(403, Some("AccessDenied"))),
            failed("AccessDenied")
        );
        assert_eq!(
            classify(&status(404, Some("NoSuchUpload"))),
            failed("NoSuchUpload")
        );
        assert_eq!(classify(&status(400, None)), failed("HTTP400"));
        assert_eq!(classify(&status(503, Some("SlowDown"))), failed("SlowDown"));
        for (s, code) in [
            (500, Some("InternalError")),
            (503, Some("ServiceUnavailable")),
            (502, None),
            (504, None),
        ] {
            assert!(
                classify(&status(s, code)).is_indeterminate(),
                "{s} {code:?}"
            );
        }
        assert!(classify(&Failure::Timeout).is_indeterminate());
        assert!(classify(&Failure::Unknown("reset".into())).is_indeterminate());
        assert_eq!(
            classify(&Failure::NotConnected("ConnectionRefused")),
            failed("ConnectionRefused")
        );
        assert_eq!(classify(&Failure::NotBuilt), failed("ConstructionFailure"));
    }

    #[test]
    fn a_missing_key_is_a_read_of_nothing_only_for_no_such_key() {
        let not_found = Outcome::Read {
            result: ReadResult::NotFound,
        };
        assert_eq!(classify_read(&status(404, Some("NoSuchKey"))), not_found);
        assert_eq!(
            classify_read(&status(404, Some("NoSuchBucket"))),
            failed("NoSuchBucket")
        );
        assert!(classify_read(&status(500, None)).is_indeterminate());
    }

    #[test]
    fn sdk_errors_reduce_to_failures() {
        assert_eq!(
            failure_of(&service_error(503, "SlowDown")),
            status(503, Some("SlowDown"))
        );
        assert_eq!(
            failure_of(&service_error(500, "InternalError")),
            status(500, Some("InternalError"))
        );

        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e: SdkError<PutObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(Box::new(refused)));
        assert_eq!(failure_of(&e), Failure::NotConnected("ConnectionRefused"));

        // A reset on an established connection: the request may have
        // arrived.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e: SdkError<PutObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(Box::new(reset)));
        assert!(matches!(failure_of(&e), Failure::Unknown(_)));
        assert!(classify(&failure_of(&e)).is_indeterminate());

        let e: SdkError<PutObjectError, HttpResponse> = SdkError::timeout_error("attempt timeout");
        assert_eq!(failure_of(&e), Failure::Timeout);
    }

    #[test]
    fn connect_errors_are_recognised_in_the_chain() {
        #[derive(Debug)]
        struct Wrap(
            &'static str,
            Option<Box<dyn std::error::Error + Send + Sync>>,
        );
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let timeout = Wrap(
            "client error (Connect)",
            Some(Box::new(Wrap(
                "HTTP connect timeout occurred after 10s",
                None,
            ))),
        );
        assert_eq!(connect_failure(&timeout), Some("ConnectTimeout"));
        let tls = Wrap(
            "client error (Connect)",
            Some(Box::new(Wrap("invalid peer certificate", None))),
        );
        assert_eq!(connect_failure(&tls), Some("ConnectError"));
        let send = Wrap(
            "client error (SendRequest)",
            Some(Box::new(Wrap("connection reset", None))),
        );
        assert_eq!(connect_failure(&send), None);
        // Refused wrapped in an io::Error payload.
        let nested =
            std::io::Error::other(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(connect_failure(&nested), Some("ConnectionRefused"));
    }

    #[test]
    fn value_seeds_differ_by_run_value_and_part() {
        let s = value_seed(1, 2, 0);
        assert_ne!(s, value_seed(2, 2, 0));
        assert_ne!(s, value_seed(1, 3, 0));
        assert_ne!(s, value_seed(1, 2, 1));
        assert_eq!(s, value_seed(1, 2, 0));
    }

    #[test]
    fn the_mix_adds_up_to_one_hundred() {
        assert_eq!(MIX.iter().map(|(_, w)| w).sum::<u32>(), 100);
    }

    #[test]
    fn stats_count_by_kind_and_outcome() {
        let mut stats = WorkloadStats::default();
        let put = Op::Put {
            key: "k".into(),
            value: Value {
                id: 1,
                parts: vec![Part { seed: 1, len: 10 }],
            },
            multipart: false,
        };
        for outcome in [Outcome::Ok, failed("SlowDown"), indeterminate("x")] {
            stats.add(&Entry {
                id: 0,
                client: 0,
                start_us: 0,
                end_us: 1,
                op: put.clone(),
                outcome,
            });
        }
        assert_eq!(stats.bytes_sent, 30);
        let put = &stats.ops["put"];
        assert_eq!(
            (put["ok"], put["failed:SlowDown"], put["indeterminate"]),
            (1, 1, 1)
        );
    }
}
