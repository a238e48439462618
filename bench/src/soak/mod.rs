//! `sluice-bench soak`: the memory-and-backpressure soak.
//!
//! Starts a multi-process Sluice cluster on loopback (one meta node, six
//! datanodes, one gateway, each its own `sluice` process so that each RSS
//! is measured), runs three shapes with the `multipart-put` engine, judges
//! each, and stops the cluster:
//!
//! * **seed** — warp's `multipart-put` that OOM-killed another server:
//!   5 uploads x 1 part in flight x 100 parts of 10 MiB for 30 minutes,
//!   objects deleted once completed. PASS: zero errors, every process's
//!   RSS after the warm-up grows less than max(5 %, 16 MiB) of its RSS at
//!   the end of the warm-up, every peak within its bound (baseline +
//!   budgets + the gateway's client terms + slack; see `verdict`).
//! * **sdk-default** — 8 uploads x 10 parts of 8 MiB, all in parallel (aws
//!   CLI / boto3 defaults), on the same cluster. PASS: all complete, zero
//!   SlowDown, every object reads back byte-identical (the RSS bound is
//!   reported, not required).
//! * **overload** — on a cluster restarted with small budgets, 64 uploads x
//!   16 parts in parallel for 3 minutes. PASS: SlowDown seen, every peak
//!   within its bound, no process died, every completed upload
//!   reads back byte-identical.
//!
//! Every shape also requires that no process died. `--smoke` shrinks all
//! of it to about two minutes with generous RSS bounds; its overload shape
//! reports SlowDown without requiring it, and requires at least one
//! completed upload so that the read-back checks something.
//! See bench/README.md#the-soak-benchmark for the commands and [`verdict`] for the exact
//! definitions.
//!
//! # Layout
//! * [`options`] — flags, full and smoke profiles, the resolved [`options::Plan`].
//! * [`disk`] — the free-space check (statvfs).
//! * [`config`] — role configs and the probe of the keys a binary accepts.
//! * [`cluster`] — starting, watching and stopping the eight processes.
//! * [`shapes`] — running a shape and assembling its checks.
//! * [`verdict`] — RSS figures and the checks, as pure functions.
//! * [`error`] — [`SoakError`].

pub mod cluster;
pub mod config;
pub mod disk;
pub mod error;
pub mod options;
pub mod shapes;
pub mod verdict;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use self::cluster::{Cluster, ClusterSpec, ProcessExit};
use self::config::{AcceptedKeys, GatewayAccess, KnobOutcome, Role, probe_accepted_keys};
pub use self::error::SoakError;
pub use self::options::SoakOptions;
use self::options::{Knobs, Plan, ShapeName};
use self::shapes::{ShapeVerdict, run_shape};
use crate::samples::bytes_to_mib;

/// Bucket every shape writes into.
const BUCKET: &str = "sluice-soak";

/// One process of a cluster, as recorded in `verdict.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    /// `meta`, `dn1`..`dn6`, `gateway`.
    pub name: String,
    /// Role.
    pub role: Role,
    /// OS process id.
    pub pid: u32,
    /// RSS right after startup, MiB.
    pub baseline_mib: Option<f64>,
    /// The role's budgets, MiB.
    pub budget_mib: f64,
    /// `/metrics` URL, when served.
    pub metrics_url: Option<String>,
    /// Log file.
    pub log: PathBuf,
}

/// One cluster the soak started.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// `main` (seed, sdk-default) or `overload`.
    pub label: &'static str,
    /// Gateway endpoint.
    pub endpoint: String,
    /// Budgets and admission settings: written into the configs or not.
    pub knobs: Vec<KnobOutcome>,
    /// The processes.
    pub processes: Vec<ProcessInfo>,
    /// How they ended.
    pub exits: Vec<ProcessExit>,
}

/// Everything `verdict.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// `full` or `smoke`.
    pub mode: &'static str,
    /// Every shape passed.
    pub pass: bool,
    /// The `sluice` binary.
    pub sluice_bin: PathBuf,
    /// Seconds since the Unix epoch at the start.
    pub started_unix_s: u64,
    /// Free bytes in the work dir at the start.
    pub free_disk_bytes: u64,
    /// RSS thresholds.
    pub rss_rules: options::RssRules,
    /// Config keys the binary accepts, per role (null = not listed).
    pub accepted_keys: AcceptedKeys,
    /// The clusters started.
    pub clusters: Vec<ClusterReport>,
    /// One verdict per shape run.
    pub shapes: Vec<ShapeVerdict>,
}

impl SoakReport {
    /// The text printed at the end: each shape's verdict, then the overall one.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.clusters {
            let not_applied: Vec<String> = c
                .knobs
                .iter()
                .filter(|k| !k.applied)
                .map(|k| format!("{}.{}", k.role.as_str(), k.key))
                .collect();
            if !not_applied.is_empty() {
                out.push_str(&format!(
                    "cluster {}: not applied (unknown to this sluice binary): {}\n",
                    c.label,
                    not_applied.join(", ")
                ));
            }
        }
        for s in &self.shapes {
            out.push_str(&s.render());
        }
        let failed: Vec<&str> = self
            .shapes
            .iter()
            .filter(|s| !s.pass)
            .map(|s| s.shape.as_str())
            .collect();
        if failed.is_empty() {
            out.push_str(&format!("soak ({}): PASS\n", self.mode));
        } else {
            out.push_str(&format!(
                "soak ({}): FAIL ({})\n",
                self.mode,
                failed.join(", ")
            ));
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

/// Runs the soak: checks the disk, starts the clusters, runs the shapes,
/// stops the clusters and writes `<out dir>/verdict.json`.
///
/// # Errors
/// Invalid options, too little disk, a missing binary, a cluster that does
/// not start, or output that cannot be written. Shapes that miss their
/// bounds are FAIL verdicts in the report, not errors.
pub async fn run(options: SoakOptions) -> Result<SoakReport, SoakError> {
    let plan = options.resolve()?;
    if !plan.sluice_bin.is_file() {
        return Err(SoakError::MissingBinary {
            path: plan.sluice_bin.clone(),
        });
    }
    let free = disk::require_free(&plan.work_dir, plan.min_free_disk)?;
    create_dir(&plan.work_dir)?;
    create_dir(&plan.out_dir)?;
    tracing::info!(work_dir = %plan.work_dir.display(), free_mib = free >> 20, "disk space checked");
    let accepted = probe_accepted_keys(&plan.sluice_bin, &plan.work_dir).await?;
    let access = GatewayAccess {
        region: "us-east-1".to_owned(),
        access_key: format!("SOAK{}", random_hex(8)),
        secret_key: random_hex(20),
    };
    let mut report = SoakReport {
        mode: if plan.smoke { "smoke" } else { "full" },
        pass: false,
        sluice_bin: plan.sluice_bin.clone(),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        free_disk_bytes: free,
        rss_rules: plan.rss,
        accepted_keys: accepted.clone(),
        clusters: Vec::new(),
        shapes: Vec::new(),
    };

    let main_shapes: Vec<ShapeName> = plan
        .shapes
        .iter()
        .copied()
        .filter(|s| *s != ShapeName::Overload)
        .collect();
    let mut result = Ok(());
    if !main_shapes.is_empty() {
        let spec = cluster_spec(&plan, "main", &plan.normal_knobs, false, &accepted, &access);
        result = run_on_cluster(&plan, &spec, &main_shapes, &access, &mut report).await;
    }
    if result.is_ok() && plan.shapes.contains(&ShapeName::Overload) {
        let spec = cluster_spec(
            &plan,
            "overload",
            &plan.overload_knobs,
            true,
            &accepted,
            &access,
        );
        result = run_on_cluster(&plan, &spec, &[ShapeName::Overload], &access, &mut report).await;
    }
    if !plan.keep {
        // Only succeeds when empty: nothing but the cluster data was put there.
        let _ = std::fs::remove_dir(&plan.work_dir);
    }
    report.pass = result.is_ok()
        && report.shapes.len() == plan.shapes.len()
        && report.shapes.iter().all(|s| s.pass);
    let path = plan.out_dir.join("verdict.json");
    let json = serde_json::to_string_pretty(&report).map_err(crate::BenchError::from)?;
    std::fs::write(&path, json + "\n").map_err(|source| SoakError::Filesystem {
        action: "write",
        path,
        source,
    })?;
    result.map(|()| report)
}

fn cluster_spec(
    plan: &Plan,
    label: &'static str,
    knobs: &Knobs,
    overload: bool,
    accepted: &AcceptedKeys,
    access: &GatewayAccess,
) -> ClusterSpec {
    ClusterSpec {
        label,
        bin: plan.sluice_bin.clone(),
        work_dir: plan.work_dir.clone(),
        log_dir: plan.out_dir.join("logs"),
        knobs: knobs.clone(),
        overload,
        accepted: accepted.clone(),
        log_filter: plan.cluster_log.clone(),
        ready_timeout: plan.ready_timeout,
        access: access.clone(),
        bucket: BUCKET.to_owned(),
        extra: BTreeMap::new(),
        insecure_cluster: plan.insecure_cluster,
        s3_https: plan.s3_https,
    }
}

/// Starts a cluster, runs `shapes` on it in order, and stops it (also when
/// a shape ends in an error).
async fn run_on_cluster(
    plan: &Plan,
    spec: &ClusterSpec,
    shapes: &[ShapeName],
    access: &GatewayAccess,
    report: &mut SoakReport,
) -> Result<(), SoakError> {
    let mut cluster = match Cluster::start(spec).await {
        Ok(cluster) => cluster,
        Err(e) => {
            // The children were killed when the half-started cluster was dropped.
            if !plan.keep {
                let _ = std::fs::remove_dir_all(spec.work_dir.join(spec.label));
            }
            return Err(e);
        }
    };
    let mut result = Ok(());
    for &shape in shapes {
        let load = match shape {
            ShapeName::Seed => &plan.seed,
            ShapeName::SdkDefault => &plan.sdk,
            ShapeName::Overload => &plan.overload,
        };
        match run_shape(&mut cluster, shape, load, plan, access, BUCKET).await {
            Ok(verdict) => report.shapes.push(verdict),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let processes = cluster
        .processes
        .iter()
        .map(|p| ProcessInfo {
            name: p.name.clone(),
            role: p.role,
            pid: p.pid,
            baseline_mib: p.baseline_bytes.map(bytes_to_mib),
            budget_mib: bytes_to_mib(p.budget_bytes),
            metrics_url: p.metrics_url.clone(),
            log: p.log.clone(),
        })
        .collect();
    let label = cluster.label;
    let endpoint = cluster.endpoint.clone();
    let knobs = cluster.knobs.clone();
    let exits = cluster.stop(plan.stop_timeout, plan.keep).await;
    report.clusters.push(ClusterReport {
        label,
        endpoint,
        knobs,
        processes,
        exits,
    });
    result
}
