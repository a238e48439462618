//! `sluice-bench heal`: heal throughput and memory after a wiped datanode,
//! with and without client load.
//!
//! 1. Checks free disk, probes the config keys of the `sluice` binary and
//!    starts the soak cluster (1 meta, 6 datanodes, 1 gateway; same budgets)
//!    with the gateway's heal settings: `heal_bandwidth_bytes_per_sec` from
//!    `--heal-bandwidth`, `heal_interval = "1s"`, `audit_interval = "1h"`
//!    (so the audit that runs is the one the new disk id triggers). A
//!    binary whose gateway lacks one of these keys stops the run with an
//!    error before anything starts.
//! 2. Writes `--data` bytes as objects of `--object-size` with seeded
//!    content ([`objects`]).
//! 3. Kills the wiped node (`--wipe`, dn1) with SIGKILL, removes its data
//!    directory and starts it again from its config: same port and node
//!    id, new disk id. With `--load`, the seed shape of the soak runs
//!    against the gateway from then until the heal is done.
//! 4. Polls every second the gateway's heal metrics, every datanode's
//!    shard count and every process's RSS ([`progress::HealSample`]) until
//!    the heal is done ([`progress::heal_state`]) or `--timeout` passes.
//! 5. Kills `--read-back-down` (dn2, dn3) and reads every object back
//!    byte-identical, then starts them again and stops the cluster.
//! 6. Writes `<out>/heal/summary.json` and `<out>/heal/samples.csv` and
//!    prints the report with a PASS/FAIL line.
//!
//! PASS needs: every object written, heal done before the timeout, no
//! process died on its own, every peak RSS within baseline + budgets +
//! slack (the soak's bound, [`crate::soak::verdict::check_bound`]), and
//! every object read back identical.
//!
//! # Layout
//! * [`options`] — flags, full and smoke profiles, the resolved plan.
//! * [`objects`] — the data set: cutting, writing.
//! * [`metrics`] — scraping and summing `/metrics`.
//! * [`progress`] — heal samples, the done-criterion, the heal figures.

pub mod metrics;
pub mod objects;
pub mod options;
pub mod progress;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytesize::ByteSize;
use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};

use self::objects::{ObjectPlan, WriteReport, object_list, write_objects};
pub use self::options::HealOptions;
use self::options::HealPlan;
use self::progress::{
    DATANODE_SHARDS_STORED, DoneRule, HEAL_BYTES_TOTAL, HEAL_DEGRADED_BLOBS,
    HEAL_HEALED_BLOBS_TOTAL, HEAL_QUEUE_BLOBS, HealFigures, HealSample, HealState, heal_figures,
    heal_state,
};
use crate::data::splitmix64;
use crate::error::BenchError;
use crate::multipart::{MultipartPutOptions, RunHooks, run_with};
use crate::report::UploadCounts;
use crate::s3::{ChecksumMode, ClientOptions, ErrorTally, build_client, ensure_bucket};
use crate::samples::{Sample, bytes_to_mib};
use crate::soak::SoakError;
use crate::soak::cluster::{Cluster, ClusterSpec, ProcessExit};
use crate::soak::config::{AcceptedKeys, GatewayAccess, KnobOutcome, Role, probe_accepted_keys};
use crate::soak::verdict::{
    Check, ProcessFigures, ProcessInput, check_bound, process_figures, render_processes,
};
use crate::verify::{VerifyReport, verify_uploads};

/// Bucket the data set goes into.
const BUCKET: &str = "sluice-heal";
/// Interval between two polls.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// A progress line is logged every this many polls.
const PROGRESS_LOG_EVERY: usize = 10;
/// Time limit of one S3 attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts per read-back GET (the gateway may first try the nodes just
/// killed); with the SDK's backoff about two minutes.
const READ_BACK_ATTEMPTS: u32 = 10;
/// The gateway heal keys the run writes, with the value each gets (the
/// bandwidth comes from `--heal-bandwidth`).
pub const HEAL_KEYS: [&str; 3] = [
    "heal_bandwidth_bytes_per_sec",
    "heal_interval",
    "audit_interval",
];
/// `heal_interval` written into the gateway config.
const HEAL_INTERVAL: &str = "1s";
/// `audit_interval` written into the gateway config: long, so that the
/// audit measured is the one the new disk identity triggers.
const AUDIT_INTERVAL: &str = "1h";

/// What stops `sluice-bench heal` before it reaches a verdict.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    /// Cluster, disk or binary (see [`SoakError`]).
    #[error(transparent)]
    Soak(#[from] SoakError),
    /// Options or output files (see [`BenchError`]).
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// The binary's gateway config has no such heal key.
    #[error("binary does not know {key} (build the durability work first)")]
    MissingHealKey {
        /// The gateway config key.
        key: &'static str,
    },
    /// A process whose metrics the heal needs serves none.
    #[error(
        "{name} serves no /metrics (binary without metrics_listen); the heal cannot be followed"
    )]
    NoMetrics {
        /// Process name.
        name: String,
    },
    /// A process named on the command line is not in the cluster.
    #[error("--{flag}: the cluster has no datanode `{name}` (dn1..dn6)")]
    UnknownNode {
        /// The flag.
        flag: &'static str,
        /// The name given.
        name: String,
    },
}

/// The client load that ran during the heal.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Uploads in parallel.
    pub concurrent: usize,
    /// Parts per upload.
    pub parts_per_upload: u32,
    /// Bytes per part.
    pub part_size: u64,
    /// Load duration (= heal phase), seconds.
    pub elapsed_s: f64,
    /// UploadPart throughput, MiB/s.
    pub mib_per_s: f64,
    /// Parts uploaded.
    pub parts: u64,
    /// UploadPart latency p99, ms.
    pub p99_ms: f64,
    /// Error responses (every attempt) by S3 code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Upload outcomes.
    pub uploads: UploadCounts,
}

/// Everything `heal/summary.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct HealReport {
    /// `full` or `smoke`.
    pub mode: &'static str,
    /// Every required check held.
    pub pass: bool,
    /// The `sluice` binary.
    pub sluice_bin: PathBuf,
    /// Seconds since the Unix epoch at the start.
    pub started_unix_s: u64,
    /// Free bytes in the work dir at the start, and required.
    pub free_disk_bytes: u64,
    /// Bytes the disk check required.
    pub required_disk_bytes: u64,
    /// Config keys the binary accepts, per role.
    pub accepted_keys: AcceptedKeys,
    /// Budgets written into the configs (or not).
    pub knobs: Vec<KnobOutcome>,
    /// Heal keys written into the gateway config.
    pub heal_keys: BTreeMap<String, String>,
    /// `--heal-bandwidth`, bytes per second.
    pub heal_bandwidth_bytes_per_sec: u64,
    /// The data set.
    pub objects: ObjectPlan,
    /// Writing it.
    pub write: WriteReport,
    /// The wiped datanode.
    pub wiped: String,
    /// Its pid before and after the restart.
    pub wiped_pids: (u32, u32),
    /// The heal, from the samples.
    pub heal: HealFigures,
    /// Whether the heal was done before `--timeout`.
    pub heal_done: bool,
    /// The done-criterion's last word ("done" or what was missing).
    pub heal_state: String,
    /// Polls taken.
    pub samples: usize,
    /// Client load during the heal (`--load`).
    pub load: Option<LoadReport>,
    /// Datanodes down during the read-back.
    pub read_back_down: Vec<String>,
    /// The read-back.
    pub read_back: Option<VerifyReport>,
    /// Error responses during the read-back by S3 code (every attempt).
    pub read_back_errors_by_code: BTreeMap<String, u64>,
    /// RSS figures per process over the heal phase.
    pub processes: Vec<ProcessFigures>,
    /// The checks.
    pub checks: Vec<Check>,
    /// How the processes ended.
    pub exits: Vec<ProcessExit>,
}

fn mib(bytes: f64) -> f64 {
    bytes / f64::from(1u32 << 20)
}

impl HealReport {
    /// The text printed at the end.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let w = &self.write;
        let _ = writeln!(
            out,
            "heal ({}): wrote {}/{} objects of {} ({:.1} MiB, {:.1} MiB/s), wiped {}",
            self.mode,
            w.written,
            w.objects,
            ByteSize::b(self.objects.object_size).to_string_as(true),
            bytes_to_mib(w.bytes),
            w.mib_per_s,
            self.wiped
        );
        let h = &self.heal;
        let opt = |v: Option<f64>, unit: &str| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}{unit}"))
        };
        let _ = writeln!(
            out,
            "  heal: {} blobs, {:.1} MiB of shards in {} = {} GiB/min (bandwidth setting {}/s); {} {} shards at the end ({} of an even share); peak degraded {}, peak queue {}",
            h.healed_blobs,
            mib(h.healed_bytes),
            opt(h.heal_s, " s"),
            opt(h.gib_per_min, ""),
            ByteSize::b(self.heal_bandwidth_bytes_per_sec).to_string_as(true),
            self.wiped,
            opt(h.wiped_shards_end, ""),
            opt(h.wiped_share_end.map(|s| s * 100.0), " %"),
            opt(h.peak_degraded_blobs, ""),
            opt(h.peak_queue_blobs, ""),
        );
        if !self.heal_done {
            let _ = writeln!(out, "  heal not done: {}", self.heal_state);
        }
        if let Some(l) = &self.load {
            let _ = writeln!(
                out,
                "  client load during heal: {} uploads x {} parts of {}: {:.2} MiB/s over {:.0} s, UploadPart p99 {:.0} ms, {} completed, errors {:?}",
                l.concurrent,
                l.parts_per_upload,
                ByteSize::b(l.part_size).to_string_as(true),
                l.mib_per_s,
                l.elapsed_s,
                l.p99_ms,
                l.uploads.completed,
                l.errors_by_code
            );
        }
        if let Some(r) = &self.read_back {
            let _ = writeln!(
                out,
                "  read back with {} down: {}/{} identical ({:.1} MiB in {:.1} s)",
                self.read_back_down.join(","),
                r.identical,
                r.checked,
                bytes_to_mib(r.bytes),
                r.elapsed_s
            );
        }
        out.push_str(&render_processes(&self.processes, false));
        for c in &self.checks {
            let status = match (c.pass, c.required) {
                (true, _) => "ok  ",
                (false, true) => "FAIL",
                (false, false) => "info",
            };
            let _ = writeln!(out, "    {status} {}: {}", c.name, c.detail);
        }
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.required && !c.pass)
            .map(|c| c.name)
            .collect();
        if failed.is_empty() {
            let _ = writeln!(out, "heal ({}): PASS", self.mode);
        } else {
            let _ = writeln!(out, "heal ({}): FAIL ({})", self.mode, failed.join(", "));
        }
        out
    }
}

fn create_dir(path: &Path) -> Result<(), SoakError> {
    std::fs::create_dir_all(path).map_err(|source| SoakError::Filesystem {
        action: "create",
        path: path.to_owned(),
        source,
    })
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02X}", rand::random::<u8>()))
        .collect()
}

/// The gateway heal settings for `plan`, checked against the keys the
/// binary accepts: every key when it accepts them all; an error naming the
/// first missing one otherwise (or, with `without_heal_keys`, only the
/// accepted ones).
///
/// # Errors
/// [`HealError::MissingHealKey`].
pub fn heal_keys(
    accepted: &AcceptedKeys,
    heal_bandwidth: u64,
    without_heal_keys: bool,
) -> Result<toml::Table, HealError> {
    let mut table = toml::Table::new();
    for key in HEAL_KEYS {
        if !accepted.accepts(Role::Gateway, key) {
            if without_heal_keys {
                tracing::warn!(key, "the gateway does not know this heal key; not written");
                continue;
            }
            return Err(HealError::MissingHealKey { key });
        }
        let value = match key {
            "heal_bandwidth_bytes_per_sec" => {
                toml::Value::Integer(i64::try_from(heal_bandwidth).unwrap_or(i64::MAX))
            }
            "heal_interval" => toml::Value::String(HEAL_INTERVAL.to_owned()),
            _ => toml::Value::String(AUDIT_INTERVAL.to_owned()),
        };
        table.insert(key.to_owned(), value);
    }
    Ok(table)
}

/// Runs the heal benchmark (see the module docs) and writes
/// `<out>/heal/summary.json`.
///
/// # Errors
/// Invalid options, too little disk, a missing binary or heal key, a
/// cluster that does not start, a wiped node that does not come back, or
/// output that cannot be written. A heal that misses its bounds is a FAIL
/// in the report, not an error.
pub async fn run(options: HealOptions) -> Result<HealReport, HealError> {
    let plan = options.resolve()?;
    if !plan.sluice_bin.is_file() {
        return Err(SoakError::MissingBinary {
            path: plan.sluice_bin.clone(),
        }
        .into());
    }
    let free = crate::soak::disk::require_free(&plan.work_dir, plan.min_free_disk)?;
    create_dir(&plan.work_dir)?;
    let out_dir = plan.out_dir.join("heal");
    create_dir(&out_dir)?;
    tracing::info!(work_dir = %plan.work_dir.display(), free_mib = free >> 20, required_mib = plan.min_free_disk >> 20, "disk space checked");
    let accepted = probe_accepted_keys(&plan.sluice_bin, &plan.work_dir).await?;
    let gateway_keys = heal_keys(&accepted, plan.heal_bandwidth, plan.without_heal_keys)?;
    let access = GatewayAccess {
        region: "us-east-1".to_owned(),
        access_key: format!("HEAL{}", random_hex(8)),
        secret_key: random_hex(20),
    };
    let spec = ClusterSpec {
        label: "heal",
        bin: plan.sluice_bin.clone(),
        work_dir: plan.work_dir.clone(),
        log_dir: plan.out_dir.join("logs"),
        knobs: plan.knobs.clone(),
        overload: false,
        accepted: accepted.clone(),
        log_filter: plan.cluster_log.clone(),
        ready_timeout: plan.ready_timeout,
        access: access.clone(),
        bucket: BUCKET.to_owned(),
        extra: BTreeMap::from([(Role::Gateway, gateway_keys.clone())]),
        insecure_cluster: false,
        s3_https: false,
    };
    let mut cluster = match Cluster::start(&spec).await {
        Ok(cluster) => cluster,
        Err(e) => {
            if !plan.keep {
                let _ = std::fs::remove_dir_all(spec.work_dir.join(spec.label));
            }
            return Err(e.into());
        }
    };
    let mut report = HealReport {
        mode: if plan.smoke { "smoke" } else { "full" },
        pass: false,
        sluice_bin: plan.sluice_bin.clone(),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        free_disk_bytes: free,
        required_disk_bytes: plan.min_free_disk,
        accepted_keys: accepted,
        knobs: cluster.knobs.clone(),
        heal_keys: gateway_keys
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        heal_bandwidth_bytes_per_sec: plan.heal_bandwidth,
        objects: plan.objects,
        write: WriteReport::default(),
        wiped: plan.wipe.clone(),
        wiped_pids: (0, 0),
        heal: HealFigures::default(),
        heal_done: false,
        heal_state: String::new(),
        samples: 0,
        load: None,
        read_back_down: plan.read_back_down.clone(),
        read_back: None,
        read_back_errors_by_code: BTreeMap::new(),
        processes: Vec::new(),
        checks: Vec::new(),
        exits: Vec::new(),
    };
    let result = run_on_cluster(&plan, &mut cluster, &access, &out_dir, &mut report).await;
    report.exits = cluster.stop(plan.stop_timeout, plan.keep).await;
    if !plan.keep {
        // Only succeeds when empty: nothing but the cluster data was put there.
        let _ = std::fs::remove_dir(&plan.work_dir);
    }
    report.pass = result.is_ok()
        && !report.checks.is_empty()
        && report.checks.iter().all(|c| c.pass || !c.required);
    let path = out_dir.join("summary.json");
    let json = serde_json::to_string_pretty(&report).map_err(BenchError::from)?;
    std::fs::write(&path, json + "\n").map_err(|source| SoakError::Filesystem {
        action: "write",
        path,
        source,
    })?;
    result.map(|()| report)
}

fn client(
    cluster: &Cluster,
    access: &GatewayAccess,
    attempts: u32,
    tally: Arc<ErrorTally>,
) -> aws_sdk_s3::Client {
    build_client(
        &ClientOptions {
            endpoint: cluster.endpoint.clone(),
            ca_bundle: cluster.ca_bundle.clone(),
            region: access.region.clone(),
            access_key: access.access_key.clone(),
            secret_key: access.secret_key.clone(),
            max_attempts: attempts,
            initial_backoff: Duration::from_secs(1),
            attempt_timeout: ATTEMPT_TIMEOUT,
            checksum: ChecksumMode::WhenSupported,
        },
        tally,
    )
}

/// Index of datanode `name` among the cluster's datanodes.
fn datanode_index(cluster: &Cluster, name: &str, flag: &'static str) -> Result<usize, HealError> {
    cluster
        .processes
        .iter()
        .filter(|p| p.role == Role::Datanode)
        .position(|p| p.name == name)
        .ok_or_else(|| HealError::UnknownNode {
            flag,
            name: name.to_owned(),
        })
}

async fn run_on_cluster(
    plan: &HealPlan,
    cluster: &mut Cluster,
    access: &GatewayAccess,
    out_dir: &Path,
    report: &mut HealReport,
) -> Result<(), HealError> {
    let wiped = datanode_index(cluster, &plan.wipe, "wipe")?;
    for name in &plan.read_back_down {
        datanode_index(cluster, name, "read-back-down")?;
    }
    if !plan.without_heal_keys {
        for p in &cluster.processes {
            if matches!(p.role, Role::Gateway | Role::Datanode) && p.metrics_url.is_none() {
                return Err(HealError::NoMetrics {
                    name: p.name.clone(),
                });
            }
        }
    }

    // 2. The data set.
    let write_tally = Arc::new(ErrorTally::default());
    let s3 = client(cluster, access, plan.max_attempts, Arc::clone(&write_tally));
    ensure_bucket(&s3, BUCKET, &access.region)
        .await
        .map_err(BenchError::from)?;
    let run_seed = splitmix64(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()),
    );
    let objects = object_list(&plan.objects, &format!("heal/{run_seed:016x}"), run_seed);
    tracing::info!(objects = objects.len(), object_size = %ByteSize::b(plan.objects.object_size).to_string_as(true), "writing the data set");
    let (write, written) = write_objects(&s3, BUCKET, objects, plan.write_concurrency).await;
    tracing::info!(
        written = write.written,
        failed = write.failed,
        mib_per_s = format!("{:.1}", write.mib_per_s),
        "data set written"
    );
    report.write = write;

    // 3. Wipe and restart.
    let names: Vec<String> = cluster.processes.iter().map(|p| p.name.clone()).collect();
    let mut samples = vec![poll(cluster, 0.0).await];
    let old_pid = cluster
        .processes
        .iter()
        .find(|p| p.name == plan.wipe)
        .map_or(0, |p| p.pid);
    let new_pid = cluster.restart_wiped(&plan.wipe).await?;
    report.wiped_pids = (old_pid, new_pid);
    let restarted = Instant::now();
    tracing::info!(node = %plan.wipe, old_pid, new_pid, "wiped node started again; following the heal");

    // 4. Optional client load, until the heal is done.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load_task = plan.load.as_ref().map(|load| {
        let options = MultipartPutOptions {
            endpoint: cluster.endpoint.clone(),
            ca_bundle: cluster.ca_bundle.clone(),
            access_key: access.access_key.clone(),
            secret_key: access.secret_key.clone(),
            region: access.region.clone(),
            bucket: BUCKET.to_owned(),
            prefix: "heal-load".to_owned(),
            concurrent: load.concurrent,
            parts: load.parts,
            part_size: ByteSize::b(load.part_size),
            part_concurrent: load.part_concurrent,
            duration: plan.timeout,
            // RSS is sampled by the heal poll.
            pids: String::new(),
            out_dir: out_dir.join("load"),
            complete: true,
            delete_after: load.delete_after,
            uploads_per_worker: None,
            max_attempts: plan.max_attempts,
            attempt_timeout: ATTEMPT_TIMEOUT,
            checksum: ChecksumMode::WhenSupported,
        };
        let hooks = RunHooks {
            chart_title: Some(format!(
                "sluice heal: client load during the heal ({} uploads x {} parts of {})",
                load.concurrent,
                load.parts,
                ByteSize::b(load.part_size).to_string_as(true)
            )),
            stop: Some(stop_rx),
            ..RunHooks::default()
        };
        tokio::spawn(run_with(options, hooks))
    });

    // 5. Follow the heal.
    let rule = DoneRule {
        settle_samples: plan.settle_samples,
        share_tolerance: plan.share_tolerance,
        wiped,
    };
    let csv_path = out_dir.join("samples.csv");
    let mut csv = std::io::BufWriter::new(std::fs::File::create(&csv_path).map_err(|source| {
        BenchError::WriteOutput {
            path: csv_path.clone(),
            source,
        }
    })?);
    let datanodes: Vec<String> = cluster
        .processes
        .iter()
        .filter(|p| p.role == Role::Datanode)
        .map(|p| p.name.clone())
        .collect();
    let write_row = |csv: &mut std::io::BufWriter<std::fs::File>, s: &HealSample| {
        csv.write_all(format_csv_row(s).as_bytes())
            .and_then(|()| csv.flush())
            .map_err(|source| BenchError::WriteOutput {
                path: csv_path.clone(),
                source,
            })
    };
    csv.write_all(csv_header(&datanodes, &names).as_bytes())
        .map_err(|source| BenchError::WriteOutput {
            path: csv_path.clone(),
            source,
        })?;
    write_row(&mut csv, &samples[0])?;
    let mut ticker = tokio::time::interval_at(restarted + POLL_INTERVAL, POLL_INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let deadline = restarted + plan.timeout;
    let mut state = HealState::Waiting("not polled yet".to_owned());
    let mut died = Vec::new();
    // One sample a second until the timeout: the samples are bounded by it.
    while Instant::now() < deadline {
        ticker.tick().await;
        let sample = poll(cluster, restarted.elapsed().as_secs_f64()).await;
        write_row(&mut csv, &sample)?;
        samples.push(sample);
        state = heal_state(&samples, &rule);
        died = cluster.exited();
        if samples.len() % PROGRESS_LOG_EVERY == 0 {
            let s = samples.last().cloned().unwrap_or_default();
            tracing::info!(
                elapsed_s = s.elapsed_s.round(),
                healed_blobs = ?s.healed_blobs,
                healed_mib = ?s.heal_bytes.map(|b| mib(b).round()),
                degraded = ?s.degraded_blobs,
                queue = ?s.queue_blobs,
                wiped_shards = ?s.shards.get(wiped).copied().flatten(),
                state = ?state,
                "heal progress"
            );
        }
        if state == HealState::Done || !died.is_empty() {
            break;
        }
    }
    let _ = stop_tx.send(true);
    report.heal_done = state == HealState::Done;
    report.heal_state = match &state {
        HealState::Done => "done".to_owned(),
        HealState::Waiting(why) => why.clone(),
    };
    report.heal = heal_figures(&samples, wiped);
    report.samples = samples.len();
    tracing::info!(done = report.heal_done, state = %report.heal_state, "heal phase over");
    if let Some(task) = load_task {
        match task.await {
            Ok(Ok(s)) => {
                report.load = Some(LoadReport {
                    concurrent: s.shape.concurrent,
                    parts_per_upload: s.shape.parts,
                    part_size: s.shape.part_size_bytes,
                    elapsed_s: s.elapsed_s,
                    mib_per_s: s.mib_per_s,
                    parts: s.parts,
                    p99_ms: s.upload_part_latency.p99_ms,
                    errors_by_code: s.errors_by_code,
                    uploads: s.uploads,
                })
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "the client load failed"),
            Err(e) => tracing::warn!(error = %e, "the client load task ended abnormally"),
        }
    }

    // RSS over the heal phase, the soak's bound.
    let inputs: Vec<ProcessInput> = cluster
        .processes
        .iter()
        .map(|p| ProcessInput {
            name: p.name.clone(),
            pid: p.pid,
            baseline_bytes: p.baseline_bytes,
            budget_bytes: p.budget_bytes,
            // The heal phase's few reads are left to the slack.
            client_terms_bytes: 0,
        })
        .collect();
    let rss_rows: Vec<Sample> = samples
        .iter()
        .skip(1)
        .map(|s| Sample {
            elapsed_s: s.elapsed_s,
            mib_per_s: 0.0,
            ops_done: 0,
            errors: 0,
            rss_mib: s.rss_mib.clone(),
        })
        .collect();
    report.processes = process_figures(&inputs, &names, &rss_rows, None, &plan.rss);

    // 6. Read-back with nodes down.
    let read_tally = Arc::new(ErrorTally::default());
    if died.is_empty() {
        for name in &plan.read_back_down {
            cluster.kill(name).await?;
        }
        let reader = client(
            cluster,
            access,
            plan.max_attempts.max(READ_BACK_ATTEMPTS),
            Arc::clone(&read_tally),
        );
        tracing::info!(objects = written.len(), down = ?plan.read_back_down, "reading the data set back");
        report.read_back =
            Some(verify_uploads(&reader, BUCKET, written, plan.verify_concurrency).await);
        for name in &plan.read_back_down {
            if let Err(e) = cluster.restart(name).await {
                tracing::warn!(process = %name, error = %e, "cannot start again after the read-back");
            }
        }
    }
    report.read_back_errors_by_code = read_tally.snapshot();
    report.checks = heal_checks(report, &died);
    Ok(())
}

/// The checks of a run (see the module docs); pure.
fn heal_checks(report: &HealReport, died: &[(String, String)]) -> Vec<Check> {
    let w = &report.write;
    let mut checks = vec![
        Check::required(
            "write_complete",
            w.failed == 0 && w.written == w.objects && w.objects > 0,
            format!(
                "{}/{} objects written, {} failed{}",
                w.written,
                w.objects,
                w.failed,
                w.errors
                    .first()
                    .map_or_else(String::new, |e| format!("; first: {e}"))
            ),
        ),
        Check::required(
            "no_process_died",
            died.is_empty(),
            if died.is_empty() {
                "no process exited on its own".to_owned()
            } else {
                format!(
                    "died: {}",
                    died.iter()
                        .map(|(n, s)| format!("{n} ({s})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
        ),
        Check::required(
            "heal_done",
            report.heal_done,
            if report.heal_done {
                format!(
                    "{} blobs healed, {} holds {} shards",
                    report.heal.healed_blobs,
                    report.wiped,
                    report.heal.wiped_shards_end.unwrap_or(0.0)
                )
            } else {
                format!("not done: {}", report.heal_state)
            },
        ),
        check_bound(&report.processes),
    ];
    checks.push(match &report.read_back {
        Some(r) => Check::required(
            "read_back_identical",
            r.checked == w.written && r.all_identical() && r.checked > 0,
            format!(
                "{}/{} identical with {} down ({} differ, {} unreadable){}",
                r.identical,
                r.checked,
                report.read_back_down.join(","),
                r.mismatched,
                r.read_failed,
                r.problems.first().map_or_else(String::new, |p| format!(
                    "; first: {} {:?}",
                    p.key, p.outcome
                ))
            ),
        ),
        None => Check::required(
            "read_back_identical",
            false,
            "not read back (a process died)".to_owned(),
        ),
    });
    if let Some(l) = &report.load {
        checks.push(Check {
            name: "client_load",
            pass: l.parts > 0,
            required: false,
            detail: format!(
                "{:.2} MiB/s during the heal, errors {:?}",
                l.mib_per_s, l.errors_by_code
            ),
        });
    }
    checks
}

/// One poll: the gateway's heal metrics, every datanode's shard count and
/// every process's RSS. Unreachable metrics read as `None`.
async fn poll(cluster: &Cluster, elapsed_s: f64) -> HealSample {
    let mut sample = HealSample {
        elapsed_s,
        ..HealSample::default()
    };
    for p in &cluster.processes {
        let sums = match &p.metrics_url {
            Some(url) if p.role != Role::Meta => match metrics::scrape(url).await {
                Ok(text) => Some(metrics::parse_sums(&text)),
                Err(e) => {
                    tracing::debug!(process = %p.name, error = %e, "cannot scrape metrics");
                    None
                }
            },
            _ => None,
        };
        let get = |name: &str| sums.as_ref().and_then(|m| m.get(name).copied());
        match p.role {
            Role::Gateway => {
                sample.heal_bytes = get(HEAL_BYTES_TOTAL);
                sample.healed_blobs = get(HEAL_HEALED_BLOBS_TOTAL);
                sample.degraded_blobs = get(HEAL_DEGRADED_BLOBS);
                sample.queue_blobs = get(HEAL_QUEUE_BLOBS);
            }
            // A freshly started datanode may not have set the gauge yet: none stored.
            Role::Datanode => sample
                .shards
                .push(get(DATANODE_SHARDS_STORED).or_else(|| sums.as_ref().map(|_| 0.0))),
            Role::Meta => {}
        }
        sample
            .rss_mib
            .push(p.target().rss_bytes().ok().flatten().map(bytes_to_mib));
    }
    sample
}

/// Header line of `heal/samples.csv`.
pub fn csv_header(datanodes: &[String], processes: &[String]) -> String {
    let mut line = String::from("elapsed_s,heal_bytes,healed_blobs,degraded_blobs,queue_blobs");
    for d in datanodes {
        let _ = write!(line, ",shards_{d}");
    }
    for p in processes {
        let _ = write!(line, ",rss_mib_{p}");
    }
    line.push('\n');
    line
}

/// One line of `heal/samples.csv`; unknown values are empty.
pub fn format_csv_row(s: &HealSample) -> String {
    let cell =
        |v: Option<f64>, decimals: usize| v.map_or_else(String::new, |v| format!("{v:.decimals$}"));
    let mut line = format!(
        "{:.3},{},{},{},{}",
        s.elapsed_s,
        cell(s.heal_bytes, 0),
        cell(s.healed_blobs, 0),
        cell(s.degraded_blobs, 0),
        cell(s.queue_blobs, 0)
    );
    for v in &s.shards {
        let _ = write!(line, ",{}", cell(*v, 0));
    }
    for v in &s.rss_mib {
        let _ = write!(line, ",{}", cell(*v, 1));
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn accepted(gateway: Option<&[&str]>) -> AcceptedKeys {
        AcceptedKeys(BTreeMap::from([(
            Role::Gateway,
            gateway.map(|keys| {
                keys.iter()
                    .map(|k| (*k).to_owned())
                    .collect::<BTreeSet<_>>()
            }),
        )]))
    }

    #[test]
    fn heal_keys_are_written_only_when_the_gateway_knows_them() {
        let all = accepted(Some(&[
            "listen",
            "heal_bandwidth_bytes_per_sec",
            "heal_interval",
            "audit_interval",
        ]));
        let t = heal_keys(&all, 64 << 20, false).expect("known");
        assert_eq!(
            t["heal_bandwidth_bytes_per_sec"],
            toml::Value::Integer(64 << 20)
        );
        assert_eq!(t["heal_interval"], toml::Value::String("1s".into()));
        assert_eq!(t["audit_interval"], toml::Value::String("1h".into()));

        let old = accepted(Some(&["listen", "region"]));
        let e = heal_keys(&old, 1, false).expect_err("an old binary");
        assert_eq!(
            e.to_string(),
            "binary does not know heal_bandwidth_bytes_per_sec (build the durability work first)"
        );
        let partial = accepted(Some(&["heal_bandwidth_bytes_per_sec", "heal_interval"]));
        assert!(matches!(
            heal_keys(&partial, 1, false),
            Err(HealError::MissingHealKey {
                key: "audit_interval"
            })
        ));
        // The mechanics test writes what it can.
        let t = heal_keys(&partial, 1, true).expect("mechanics");
        assert_eq!(t.len(), 2);
        assert!(heal_keys(&old, 1, true).expect("mechanics").is_empty());
        // A binary that lists nothing gets every key.
        assert_eq!(
            heal_keys(&accepted(None), 1, false).expect("unknown").len(),
            3
        );
    }

    #[test]
    fn csv_rows_leave_unknown_values_empty() {
        let header = csv_header(
            &["dn1".into(), "dn2".into()],
            &["meta".into(), "dn1".into()],
        );
        assert_eq!(
            header,
            "elapsed_s,heal_bytes,healed_blobs,degraded_blobs,queue_blobs,shards_dn1,shards_dn2,rss_mib_meta,rss_mib_dn1\n"
        );
        let row = format_csv_row(&HealSample {
            elapsed_s: 1.5,
            heal_bytes: Some(1024.0),
            healed_blobs: Some(3.0),
            degraded_blobs: None,
            queue_blobs: Some(0.0),
            shards: vec![Some(7.0), None],
            rss_mib: vec![Some(40.25), None],
        });
        assert_eq!(row, "1.500,1024,3,,0,7,,40.2,\n");
        assert_eq!(header.matches(',').count(), row.matches(',').count());
    }

    fn report(written: u64, heal_done: bool, read_back: Option<VerifyReport>) -> HealReport {
        HealReport {
            mode: "smoke",
            pass: false,
            sluice_bin: PathBuf::from("sluice"),
            started_unix_s: 0,
            free_disk_bytes: 0,
            required_disk_bytes: 0,
            accepted_keys: AcceptedKeys::default(),
            knobs: vec![],
            heal_keys: BTreeMap::new(),
            heal_bandwidth_bytes_per_sec: 1,
            objects: ObjectPlan {
                count: 4,
                object_size: 1,
                parts: 1,
                part_size: 1,
            },
            write: WriteReport {
                objects: 4,
                written,
                failed: 4 - written,
                ..WriteReport::default()
            },
            wiped: "dn1".into(),
            wiped_pids: (1, 2),
            heal: HealFigures::default(),
            heal_done,
            heal_state: if heal_done {
                "done".into()
            } else {
                "3 degraded blobs".into()
            },
            samples: 3,
            load: None,
            read_back_down: vec!["dn2".into(), "dn3".into()],
            read_back,
            read_back_errors_by_code: BTreeMap::new(),
            processes: vec![ProcessFigures {
                name: "gateway".into(),
                pid: 1,
                baseline_mib: Some(10.0),
                budget_mib: 10.0,
                client_terms_mib: 0.0,
                bound_mib: Some(20.0),
                warmup_end_mib: None,
                warmup_level_mib: None,
                max_after_warmup_mib: None,
                growth_mib: None,
                allowed_growth_mib: None,
                end_mib: Some(12.0),
                peak_mib: Some(15.0),
                exited: false,
            }],
            checks: vec![],
            exits: vec![],
        }
    }

    fn identical(n: u64) -> VerifyReport {
        VerifyReport {
            checked: n,
            identical: n,
            ..VerifyReport::default()
        }
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks
            .iter()
            .filter(|c| c.required && !c.pass)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn checks_require_writes_heal_memory_and_identical_reads() {
        let good = report(4, true, Some(identical(4)));
        assert!(failed(&heal_checks(&good, &[])).is_empty());

        let mut r = report(3, false, Some(identical(3)));
        r.processes[0].peak_mib = Some(25.0);
        let checks = heal_checks(&r, &[("dn4".into(), "signal: 6".into())]);
        assert_eq!(
            failed(&checks),
            vec![
                "write_complete",
                "no_process_died",
                "heal_done",
                "rss_within_budget"
            ]
        );
        let mut r = report(4, true, Some(identical(4)));
        r.read_back.as_mut().expect("read").identical = 3;
        assert_eq!(failed(&heal_checks(&r, &[])), vec!["read_back_identical"]);
        let r = report(4, true, None);
        assert_eq!(failed(&heal_checks(&r, &[])), vec!["read_back_identical"]);
        let text = {
            let mut r = report(4, true, Some(identical(4)));
            r.checks = heal_checks(&r, &[]);
            r.render()
        };
        assert!(text.ends_with("heal (smoke): PASS\n"), "{text}");
        let mut r = report(4, false, Some(identical(4)));
        r.checks = heal_checks(&r, &[]);
        assert!(r.render().contains("heal (smoke): FAIL (heal_done)"));
    }
}
