//! Running one shape against a running cluster and judging it.
//!
//! The load is the `multipart-put` engine itself ([`crate::multipart::run_with`]),
//! in this process, sampling the RSS of the cluster's eight processes; its
//! `samples.csv` is read back for the RSS verdict. Shapes that keep their
//! objects record every completed upload and read each one back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Serialize;

use super::cluster::{
    ClientLoad, Cluster, GATEWAY_DEFAULT_MAX_CONNECTIONS, GATEWAY_DEFAULT_MAX_INFLIGHT_REQUESTS,
    gateway_client_bytes,
};
use super::config::{GatewayAccess, KnobOutcome, Role};
use super::error::SoakError;
use super::options::{LoadShape, Plan, ShapeName};
use super::verdict::{
    Check, ProcessFigures, ProcessInput, check_alive, check_bound, check_growth, process_figures,
    render_processes,
};
use crate::completed::CompletedLog;
use crate::multipart::{MultipartPutOptions, RunHooks, run_with};
use crate::report::{Summary, UploadCounts};
use crate::s3::{ChecksumMode, ClientOptions, ErrorTally, build_client};
use crate::samples;
use crate::verify::{VerifyReport, verify_uploads};

/// Time limit of one UploadPart or GetObject attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts per read-back GET. Right after an overload the gateway may
/// still shed requests (slots held by uploads the clients abandoned), so
/// reads retry with the SDK's exponential backoff (1 s base, 20 s cap) for
/// up to about two minutes: the check is about the bytes, not availability.
const READ_BACK_ATTEMPTS: u32 = 10;
/// Base of the read-back retry backoff.
const READ_BACK_BACKOFF: Duration = Duration::from_secs(1);

/// The verdict of one shape, as printed and as written in `verdict.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeVerdict {
    /// Which shape.
    pub shape: ShapeName,
    /// Every required check held.
    pub pass: bool,
    /// Label of the cluster it ran on.
    pub cluster: &'static str,
    /// The workload.
    pub load: LoadShape,
    /// samples.csv, summary.json and chart.svg are here.
    pub out_dir: PathBuf,
    /// Load duration, seconds.
    pub elapsed_s: f64,
    /// UploadPart throughput, MiB/s.
    pub mib_per_s: f64,
    /// Successful UploadParts.
    pub parts: u64,
    /// UploadPart latency p50, ms.
    pub p50_ms: f64,
    /// UploadPart latency p99, ms.
    pub p99_ms: f64,
    /// UploadPart latency max, ms.
    pub max_ms: f64,
    /// `SlowDown` responses (every attempt).
    pub slowdown: u64,
    /// Error responses (every attempt).
    pub errors_total: u64,
    /// Error responses by S3 code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Upload outcomes.
    pub uploads: UploadCounts,
    /// Read-back of the completed uploads (shapes that keep their objects).
    pub read_back: Option<VerifyReport>,
    /// Error responses during the read-back by S3 code (every attempt).
    pub read_back_errors_by_code: BTreeMap<String, u64>,
    /// The checks.
    pub checks: Vec<Check>,
    /// RSS figures per process.
    pub processes: Vec<ProcessFigures>,
    /// CPU seconds (user + system) the cluster's processes used during
    /// the load, all processes together (the load generator excluded).
    pub server_cpu_s: f64,
    /// `server_cpu_s` per GiB of UploadPart payload acknowledged.
    pub server_cpu_s_per_gib: f64,
}

impl ShapeVerdict {
    /// The verdict line, the RSS table and one line per check.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} {} (cluster {}): {:.2} MiB/s, UploadPart p50 {:.0} ms p99 {:.0} ms, SlowDown {}, errors {}, uploads {} completed of {} started",
            if self.pass { "PASS" } else { "FAIL" },
            self.shape.as_str(),
            self.cluster,
            self.mib_per_s,
            self.p50_ms,
            self.p99_ms,
            self.slowdown,
            self.errors_total,
            self.uploads.completed,
            self.uploads.started,
        );
        out.push_str(&format!(
            ", server CPU {:.1} s = {:.2} s/GiB",
            self.server_cpu_s, self.server_cpu_s_per_gib
        ));
        if let Some(r) = &self.read_back {
            out.push_str(&format!(
                ", read back {}/{} identical",
                r.identical, r.checked
            ));
            let retried: u64 = self.read_back_errors_by_code.values().sum();
            if retried > 0 {
                out.push_str(&format!(
                    " ({retried} read attempts retried: {:?})",
                    self.read_back_errors_by_code
                ));
            }
        }
        out.push('\n');
        out.push_str(&render_processes(
            &self.processes,
            self.shape == ShapeName::Seed,
        ));
        for c in &self.checks {
            let status = match (c.pass, c.required) {
                (true, _) => "ok  ",
                (false, true) => "FAIL",
                (false, false) => "info",
            };
            let note = if c.required {
                ""
            } else {
                " (reported, not required)"
            };
            out.push_str(&format!("    {status} {}: {}{note}\n", c.name, c.detail));
        }
        out
    }
}

/// Runs `shape` with `load` against `cluster` and judges it.
///
/// # Errors
/// Output files that cannot be written or read back, or a bucket the
/// engine cannot prepare. Failed requests and missed bounds are verdicts.
pub async fn run_shape(
    cluster: &mut Cluster,
    shape: ShapeName,
    load: &LoadShape,
    plan: &Plan,
    access: &GatewayAccess,
    bucket: &str,
) -> Result<ShapeVerdict, SoakError> {
    let out_dir = plan.out_dir.join(shape.as_str());
    let options = MultipartPutOptions {
        endpoint: cluster.endpoint.clone(),
        ca_bundle: cluster.ca_bundle.clone(),
        access_key: access.access_key.clone(),
        secret_key: access.secret_key.clone(),
        region: access.region.clone(),
        bucket: bucket.to_owned(),
        prefix: shape.as_str().to_owned(),
        concurrent: load.concurrent,
        parts: load.parts,
        part_size: ByteSize::b(load.part_size),
        part_concurrent: load.part_concurrent,
        duration: load.duration,
        pids: cluster.pids_spec(),
        out_dir: out_dir.clone(),
        complete: true,
        delete_after: load.delete_after,
        uploads_per_worker: load.uploads_per_worker,
        max_attempts: plan.max_attempts,
        attempt_timeout: ATTEMPT_TIMEOUT,
        checksum: ChecksumMode::WhenSupported,
    };
    let log = (!load.delete_after).then(|| Arc::new(CompletedLog::default()));
    let cpu_before = cluster_cpu_seconds(cluster);
    tracing::info!(
        shape = shape.as_str(),
        cluster = cluster.label,
        "shape started"
    );
    let summary = run_with(
        options,
        RunHooks {
            completed: log.clone(),
            chart_title: Some(format!(
                "sluice soak, {} shape: {} uploads x {} parts of {} ({} in flight per upload), cluster {}",
                shape.as_str(),
                load.concurrent,
                load.parts,
                ByteSize::b(load.part_size).to_string_as(true),
                load.part_concurrent,
                cluster.label
            )),
            stop: None,
        },
    )
    .await?;
    let server_cpu_s = (cluster_cpu_seconds(cluster) - cpu_before).max(0.0);
    let payload_gib = (summary.parts * load.part_size) as f64 / (1u64 << 30) as f64;

    let csv_path = out_dir.join("samples.csv");
    let text = std::fs::read_to_string(&csv_path).map_err(|source| SoakError::Filesystem {
        action: "read",
        path: csv_path,
        source,
    })?;
    let (names, rows) = samples::parse(&text)?;

    let read_tally = Arc::new(ErrorTally::default());
    let read_back = match &log {
        Some(log) => {
            let client = build_client(
                &ClientOptions {
                    endpoint: cluster.endpoint.clone(),
                    ca_bundle: cluster.ca_bundle.clone(),
                    region: access.region.clone(),
                    access_key: access.access_key.clone(),
                    secret_key: access.secret_key.clone(),
                    max_attempts: plan.max_attempts.max(READ_BACK_ATTEMPTS),
                    initial_backoff: READ_BACK_BACKOFF,
                    attempt_timeout: ATTEMPT_TIMEOUT,
                    checksum: ChecksumMode::WhenSupported,
                },
                Arc::clone(&read_tally),
            );
            let entries = log.entries();
            tracing::info!(objects = entries.len(), "reading completed uploads back");
            let mut report =
                verify_uploads(&client, bucket, entries, plan.verify_concurrency).await;
            // Completions the log could not hold count as unchecked.
            report.checked += log.dropped();
            Some(report)
        }
        None => None,
    };

    let exited = cluster.exited();
    let gateway_clients = gateway_client_bytes(ClientLoad {
        requests: load.concurrent * load.part_concurrent,
        max_inflight: applied_max_inflight(&cluster.knobs),
        // The soak leaves it to the gateway's default.
        max_connections: GATEWAY_DEFAULT_MAX_CONNECTIONS,
        tls: plan.s3_https,
    });
    let inputs: Vec<ProcessInput> = cluster
        .processes
        .iter()
        .map(|p| ProcessInput {
            name: p.name.clone(),
            pid: p.pid,
            baseline_bytes: p.baseline_bytes,
            budget_bytes: p.budget_bytes,
            client_terms_bytes: if p.role == Role::Gateway {
                gateway_clients
            } else {
                0
            },
        })
        .collect();
    let warmup = (shape == ShapeName::Seed).then_some(plan.warmup.as_secs_f64());
    let figures = process_figures(&inputs, &names, &rows, warmup, &plan.rss);

    let checks = shape_checks(
        shape,
        load,
        plan.smoke,
        &summary,
        &figures,
        &exited,
        read_back.as_ref(),
    );
    let l = &summary.upload_part_latency;
    let u = &summary.uploads;
    let pass = checks.iter().all(|c| c.pass || !c.required);
    let verdict = ShapeVerdict {
        shape,
        pass,
        cluster: cluster.label,
        load: load.clone(),
        out_dir,
        elapsed_s: summary.elapsed_s,
        mib_per_s: summary.mib_per_s,
        parts: summary.parts,
        p50_ms: l.p50_ms,
        p99_ms: l.p99_ms,
        max_ms: l.max_ms,
        slowdown: summary.slowdown,
        errors_total: summary.errors_total,
        errors_by_code: summary.errors_by_code.clone(),
        uploads: u.clone(),
        read_back,
        read_back_errors_by_code: read_tally.snapshot(),
        checks,
        processes: figures,
        server_cpu_s,
        server_cpu_s_per_gib: if payload_gib > 0.0 {
            server_cpu_s / payload_gib
        } else {
            0.0
        },
    };
    tracing::info!(shape = shape.as_str(), pass, "shape finished");
    Ok(verdict)
}

/// CPU seconds used so far by the cluster's processes, summed (a process
/// that is gone counts 0, so a restart during a shape undercounts).
fn cluster_cpu_seconds(cluster: &Cluster) -> f64 {
    cluster
        .processes
        .iter()
        .filter_map(|p| {
            crate::rss::ProcTarget {
                name: p.name.clone(),
                pid: p.pid,
            }
            .cpu_seconds()
        })
        .sum()
}

/// The checks of `shape` (see the module docs of [`crate::soak`]); pure.
fn shape_checks(
    shape: ShapeName,
    load: &LoadShape,
    smoke: bool,
    summary: &Summary,
    figures: &[ProcessFigures],
    exited: &[(String, String)],
    read_back: Option<&VerifyReport>,
) -> Vec<Check> {
    let mut checks = vec![check_alive(figures, exited)];
    let u = &summary.uploads;
    match shape {
        ShapeName::Seed => {
            checks.push(Check::required(
                "progress",
                summary.parts > 0,
                format!("{} parts uploaded", summary.parts),
            ));
            checks.push(Check::required(
                "zero_errors",
                summary.errors_total == 0 && summary.failed_requests.is_empty(),
                format!(
                    "{} error responses {:?}, failed requests {:?}",
                    summary.errors_total, summary.errors_by_code, summary.failed_requests
                ),
            ));
            checks.push(check_growth(figures));
            checks.push(check_bound(figures));
        }
        ShapeName::SdkDefault => {
            let wanted = load.concurrent as u64 * load.uploads_per_worker.unwrap_or(1);
            checks.push(Check::required(
                "all_uploads_completed",
                u.completed == wanted,
                format!("{} of {wanted} completed", u.completed),
            ));
            checks.push(Check::required(
                "zero_slowdown",
                summary.slowdown == 0,
                format!("{} SlowDown responses", summary.slowdown),
            ));
            checks.push(read_back_check(read_back, u.completed, 1));
            // Not part of this shape's contract, but worth seeing.
            checks.push(Check {
                required: false,
                ..check_bound(figures)
            });
        }
        ShapeName::Overload => {
            checks.push(Check {
                name: "slowdown_seen",
                pass: summary.slowdown > 0,
                required: !smoke,
                detail: format!("{} SlowDown responses", summary.slowdown),
            });
            checks.push(check_bound(figures));
            // With far more parts in flight than admission slots, an upload
            // of many parts may never get all of them in: zero completions
            // is a legitimate full-size outcome. The small smoke shape does
            // complete uploads, so there the read-back must check some.
            let min_completed = u64::from(smoke);
            checks.push(read_back_check(read_back, u.completed, min_completed));
        }
    }
    checks
}

/// Every completed upload (at least `min_completed`) read back identical.
fn read_back_check(report: Option<&VerifyReport>, completed: u64, min_completed: u64) -> Check {
    let Some(r) = report else {
        return Check::required("read_back_identical", false, "not read back".to_owned());
    };
    let pass = r.checked == completed && r.all_identical() && completed >= min_completed;
    let mut detail = format!(
        "{}/{} identical ({} completed; {} differ, {} unreadable; {:.1} MiB in {:.1} s)",
        r.identical,
        r.checked,
        completed,
        r.mismatched,
        r.read_failed,
        r.bytes as f64 / (1024.0 * 1024.0),
        r.elapsed_s
    );
    if completed < min_completed {
        detail.push_str(&format!("; fewer than {min_completed} completed"));
    }
    if let Some(p) = r.problems.first() {
        detail.push_str(&format!("; first: {} {:?}", p.key, p.outcome));
    }
    Check::required("read_back_identical", pass, detail)
}

/// The gateway's `max_inflight_requests`: the value the soak wrote into its
/// config, else the gateway's default.
fn applied_max_inflight(knobs: &[KnobOutcome]) -> usize {
    knobs
        .iter()
        .find(|k| k.role == Role::Gateway && k.key == "max_inflight_requests" && k.applied)
        .and_then(|k| k.value.parse().ok())
        .unwrap_or(GATEWAY_DEFAULT_MAX_INFLIGHT_REQUESTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{ServerCpu, Shape};
    use crate::stats::LatencyStats;
    use crate::verify::{Outcome, Problem};

    #[test]
    fn max_inflight_is_the_applied_value_else_the_gateway_default() {
        let outcome = |role, key: &'static str, value: &str, applied| KnobOutcome {
            role,
            key,
            value: value.into(),
            applied,
        };
        let default = sluice_gateway::Config::default().max_inflight_requests;
        assert_eq!(applied_max_inflight(&[]), default);
        let written = [
            outcome(Role::Datanode, "write_budget_bytes", "8388608", true),
            outcome(Role::Gateway, "max_inflight_requests", "32", true),
        ];
        assert_eq!(applied_max_inflight(&written), 32);
        // The binary did not know the key: the gateway runs its default.
        let unknown = [outcome(Role::Gateway, "max_inflight_requests", "32", false)];
        assert_eq!(applied_max_inflight(&unknown), default);
    }

    fn load(concurrent: usize) -> LoadShape {
        LoadShape {
            concurrent,
            parts: 3,
            part_size: 5 << 20,
            part_concurrent: 3,
            duration: Duration::from_secs(30),
            uploads_per_worker: Some(1),
            delete_after: false,
        }
    }

    fn summary(parts: u64, completed: u64, slowdown: u64) -> Summary {
        Summary {
            benchmark: "multipart-put",
            endpoint: "http://127.0.0.1:1".into(),
            bucket: "b".into(),
            key_prefix: "p".into(),
            shape: Shape {
                concurrent: 2,
                parts: 3,
                part_size_bytes: 5 << 20,
                part_concurrent: 3,
                duration_s: 30.0,
                complete: true,
                delete_after: false,
                max_attempts: 3,
            },
            elapsed_s: 30.0,
            parts,
            bytes: parts * (5 << 20),
            mib_per_s: 1.0,
            parts_per_s: 1.0,
            upload_part_latency: LatencyStats::new().summary(),
            uploads: UploadCounts {
                started: completed,
                completed,
                ..UploadCounts::default()
            },
            errors_total: slowdown,
            errors_by_code: if slowdown > 0 {
                BTreeMap::from([("SlowDown".to_owned(), slowdown)])
            } else {
                BTreeMap::new()
            },
            slowdown,
            failed_requests: BTreeMap::new(),
            payload_buffers: 1,
            processes: Vec::new(),
            server_cpu: ServerCpu::default(),
        }
    }

    fn figures(peak: f64) -> Vec<ProcessFigures> {
        vec![ProcessFigures {
            name: "gateway".into(),
            pid: 1,
            baseline_mib: Some(20.0),
            budget_mib: 24.0,
            client_terms_mib: 0.0,
            bound_mib: Some(44.0),
            warmup_end_mib: Some(30.0),
            warmup_level_mib: Some(30.0),
            max_after_warmup_mib: Some(35.0),
            growth_mib: Some(5.0),
            allowed_growth_mib: Some(16.0),
            end_mib: Some(30.0),
            peak_mib: Some(peak),
            exited: false,
        }]
    }

    fn identical(n: u64) -> VerifyReport {
        VerifyReport {
            checked: n,
            identical: n,
            ..VerifyReport::default()
        }
    }

    fn verdict(checks: &[Check]) -> bool {
        checks.iter().all(|c| c.pass || !c.required)
    }

    fn named<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name} in {checks:?}"))
    }

    #[test]
    fn seed_requires_zero_errors_flat_rss_and_the_bound() {
        let ok = shape_checks(
            ShapeName::Seed,
            &load(5),
            false,
            &summary(100, 9, 0),
            &figures(40.0),
            &[],
            None,
        );
        assert!(verdict(&ok), "{ok:?}");
        let errors = shape_checks(
            ShapeName::Seed,
            &load(5),
            false,
            &summary(100, 9, 1),
            &figures(40.0),
            &[],
            None,
        );
        assert!(!named(&errors, "zero_errors").pass);
        assert!(!verdict(&errors));
        let over = shape_checks(
            ShapeName::Seed,
            &load(5),
            false,
            &summary(100, 9, 0),
            &figures(45.0),
            &[],
            None,
        );
        assert!(!named(&over, "rss_within_budget").pass);
        let idle = shape_checks(
            ShapeName::Seed,
            &load(5),
            false,
            &summary(0, 0, 0),
            &figures(40.0),
            &[],
            None,
        );
        assert!(!named(&idle, "progress").pass);
        let died = [("dn2".to_owned(), "signal: 9".to_owned())];
        let dead = shape_checks(
            ShapeName::Seed,
            &load(5),
            false,
            &summary(100, 9, 0),
            &figures(40.0),
            &died,
            None,
        );
        assert!(!named(&dead, "no_process_died").pass);
    }

    #[test]
    fn sdk_default_requires_all_complete_no_slowdown_identical_reads() {
        let ok = shape_checks(
            ShapeName::SdkDefault,
            &load(2),
            false,
            &summary(6, 2, 0),
            &figures(100.0),
            &[],
            Some(&identical(2)),
        );
        assert!(verdict(&ok), "{ok:?}");
        // The RSS bound is reported, not required.
        let bound = named(&ok, "rss_within_budget");
        assert!(!bound.pass && !bound.required);
        let slow = shape_checks(
            ShapeName::SdkDefault,
            &load(2),
            false,
            &summary(6, 2, 1),
            &figures(40.0),
            &[],
            Some(&identical(2)),
        );
        assert!(!verdict(&slow));
        let short = shape_checks(
            ShapeName::SdkDefault,
            &load(2),
            false,
            &summary(3, 1, 0),
            &figures(40.0),
            &[],
            Some(&identical(1)),
        );
        assert!(!named(&short, "all_uploads_completed").pass);
    }

    #[test]
    fn overload_requires_slowdown_only_in_full_mode() {
        let calm = summary(40, 3, 0);
        let full = shape_checks(
            ShapeName::Overload,
            &load(16),
            false,
            &calm,
            &figures(40.0),
            &[],
            Some(&identical(3)),
        );
        assert!(!verdict(&full));
        let smoke = shape_checks(
            ShapeName::Overload,
            &load(16),
            true,
            &calm,
            &figures(40.0),
            &[],
            Some(&identical(3)),
        );
        assert!(verdict(&smoke), "{smoke:?}");
        assert!(!named(&smoke, "slowdown_seen").required);
        // Zero completions: vacuous in full mode, a failure in smoke mode.
        let shed = summary(40, 0, 500);
        let full = shape_checks(
            ShapeName::Overload,
            &load(64),
            false,
            &shed,
            &figures(40.0),
            &[],
            Some(&identical(0)),
        );
        assert!(verdict(&full), "{full:?}");
        let smoke = shape_checks(
            ShapeName::Overload,
            &load(16),
            true,
            &shed,
            &figures(40.0),
            &[],
            Some(&identical(0)),
        );
        assert!(!named(&smoke, "read_back_identical").pass);
    }

    #[test]
    fn read_back_needs_every_completion_identical() {
        let ok = VerifyReport {
            checked: 3,
            identical: 3,
            bytes: 3 << 20,
            ..VerifyReport::default()
        };
        assert!(read_back_check(Some(&ok), 3, 1).pass);
        // A completion that was not checked.
        assert!(!read_back_check(Some(&ok), 4, 1).pass);
        // Nothing completed.
        let none = VerifyReport::default();
        let c = read_back_check(Some(&none), 0, 1);
        assert!(!c.pass);
        assert!(c.detail.contains("fewer than 1"), "{}", c.detail);
        let bad = VerifyReport {
            checked: 2,
            identical: 1,
            mismatched: 1,
            problems: vec![Problem {
                key: "k".into(),
                outcome: Outcome::Mismatch {
                    offset: 7,
                    reason: "byte differs in part 1".into(),
                },
            }],
            ..VerifyReport::default()
        };
        let c = read_back_check(Some(&bad), 2, 1);
        assert!(!c.pass);
        assert!(c.detail.contains("first: k"), "{}", c.detail);
        assert!(!read_back_check(None, 0, 0).pass);
    }
}
