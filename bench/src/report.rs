//! The end-of-run summaries: `summary.json` and the text printed to stdout.
//!
//! [`Summary`] is `multipart-put`'s, [`ObjectSummary`] that of `put` and
//! `get`; both carry the same error, RSS and [`ServerCpu`] figures and are
//! printed by the same helpers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::rss::{CLOCK_TICKS_PER_SECOND, ProcTarget, ticks_to_seconds};
use crate::samples::Sample;
use crate::stats::{LatencySummary, MIB};

/// Bytes in one GiB.
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The workload as configured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    /// Uploads in flight at once.
    pub concurrent: usize,
    /// Parts per upload.
    pub parts: u32,
    /// Bytes per part.
    pub part_size_bytes: u64,
    /// Parts of one upload in flight at once.
    pub part_concurrent: usize,
    /// Requested load duration, seconds.
    pub duration_s: f64,
    /// Whether uploads are completed.
    pub complete: bool,
    /// Whether completed objects are deleted.
    pub delete_after: bool,
    /// Attempts per request (SDK standard retry mode).
    pub max_attempts: u32,
}

/// What happened to the multipart uploads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UploadCounts {
    /// CreateMultipartUpload succeeded.
    pub started: u64,
    /// CompleteMultipartUpload succeeded.
    pub completed: u64,
    /// Abandoned after a request failed (all attempts); not aborted.
    pub failed: u64,
    /// All parts uploaded but, with `--complete false`, not completed.
    pub left_open: u64,
    /// Still in progress at the deadline; left as is, like warp.
    pub unfinished: u64,
    /// Completed objects deleted (`--delete-after`).
    pub deleted: u64,
}

/// RSS statistics of one sampled process, MiB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessRss {
    /// Name from `--pids`.
    pub name: String,
    /// Process id.
    pub pid: u32,
    /// First readable sample.
    pub first_mib: Option<f64>,
    /// Smallest sample.
    pub min_mib: Option<f64>,
    /// Largest sample.
    pub max_mib: Option<f64>,
    /// Last readable sample.
    pub last_mib: Option<f64>,
    /// Samples where the process could be read.
    pub samples: usize,
    /// The process was readable earlier but not at the last sample (it exited).
    pub exited: bool,
}

impl ProcessRss {
    /// Statistics of column `index` of `samples`.
    pub fn from_samples(name: &str, pid: u32, index: usize, samples: &[Sample]) -> Self {
        let values: Vec<f64> = samples
            .iter()
            .filter_map(|s| s.rss_mib.get(index).copied().flatten())
            .collect();
        let last_readable = samples
            .last()
            .and_then(|s| s.rss_mib.get(index).copied().flatten())
            .is_some();
        Self {
            name: name.to_owned(),
            pid,
            first_mib: values.first().copied(),
            min_mib: values.iter().copied().reduce(f64::min),
            max_mib: values.iter().copied().reduce(f64::max),
            last_mib: values.last().copied(),
            samples: values.len(),
            exited: !values.is_empty() && !last_readable,
        }
    }
}

/// Everything a run measured. Serialised as `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Always `multipart-put`.
    pub benchmark: &'static str,
    /// S3 endpoint URL.
    pub endpoint: String,
    /// Bucket written to.
    pub bucket: String,
    /// Key prefix of this run's objects.
    pub key_prefix: String,
    /// Workload shape.
    pub shape: Shape,
    /// Measured load duration, seconds.
    pub elapsed_s: f64,
    /// Parts uploaded (successful UploadPart calls that ended before the deadline).
    pub parts: u64,
    /// Bytes in those parts.
    pub bytes: u64,
    /// `bytes` per elapsed second, MiB/s.
    pub mib_per_s: f64,
    /// `parts` per elapsed second.
    pub parts_per_s: f64,
    /// Latency of successful UploadPart calls, SDK retries included.
    pub upload_part_latency: LatencySummary,
    /// Upload outcomes.
    pub uploads: UploadCounts,
    /// Error responses, every attempt counted (retried ones too).
    pub errors_total: u64,
    /// Error responses by S3 error code (or `HTTP<status>`, `Timeout`,
    /// `IoError`, `ConnectorError`, ... when there is no S3 code).
    pub errors_by_code: BTreeMap<String, u64>,
    /// `SlowDown` error responses (also in `errors_by_code`).
    pub slowdown: u64,
    /// Requests that failed after all attempts, by S3 operation.
    pub failed_requests: BTreeMap<String, u64>,
    /// Part-size payload buffers this run allocated (each is reused once the
    /// SDK releases it; the bound is `concurrent x part_concurrent`).
    pub payload_buffers: u64,
    /// RSS of the sampled processes.
    pub processes: Vec<ProcessRss>,
    /// CPU time of the sampled processes during the load phase (per part,
    /// per GiB of parts).
    pub server_cpu: ServerCpu,
}

/// A size in the largest binary unit that divides it (`4 KiB`, `1 MiB`,
/// `1536 KiB`, `1000 B`), exact unlike `ByteSize`'s rounded `1.5 MiB`.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

/// An amount of data in GiB from 1 GiB up, else in MiB.
fn amount_text(bytes: u64) -> String {
    if bytes as f64 >= GIB {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.2} MiB", bytes as f64 / MIB)
    }
}

fn opt_mib(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |mib| format!("{mib:.1}"))
}

impl Summary {
    /// The human-readable report printed at the end of a run.
    pub fn render_text(&self) -> String {
        let s = &self.shape;
        let l = &self.upload_part_latency;
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "sluice-bench multipart-put: {} uploads x {} parts of {:.2} MiB ({} part(s) in flight per upload), {:.1} s against {} bucket {}",
            s.concurrent,
            s.parts,
            s.part_size_bytes as f64 / MIB,
            s.part_concurrent,
            self.elapsed_s,
            self.endpoint,
            self.bucket
        );
        let _ = writeln!(
            out,
            "  parts:       {} ({:.2} GiB)",
            self.parts,
            self.bytes as f64 / MIB / 1024.0
        );
        let _ = writeln!(
            out,
            "  throughput:  {:.2} MiB/s, {:.2} parts/s",
            self.mib_per_s, self.parts_per_s
        );
        write_latency(&mut out, "UploadPart:", l);
        let u = &self.uploads;
        let _ = writeln!(
            out,
            "  uploads:     started {}, completed {}, failed {}, left open {}, unfinished at deadline {}, deleted {}",
            u.started, u.completed, u.failed, u.left_open, u.unfinished, u.deleted
        );
        write_errors(
            &mut out,
            self.errors_total,
            self.slowdown,
            &self.errors_by_code,
            &self.failed_requests,
        );
        write_cpu(&mut out, &self.server_cpu, "part");
        write_rss(&mut out, &self.processes);
        out
    }
}

/// One latency line: `label` padded to the report's column.
fn write_latency(out: &mut String, label: &str, l: &LatencySummary) {
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "  {label:<12} p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (mean {:.1} ms, n={})",
        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, l.mean_ms, l.count
    );
}

/// Error responses by code and requests that failed after all attempts.
fn write_errors(
    out: &mut String,
    total: u64,
    slowdown: u64,
    by_code: &BTreeMap<String, u64>,
    failed_requests: &BTreeMap<String, u64>,
) {
    let _ = writeln!(
        out,
        "  errors:      {total} error responses, SlowDown {slowdown}"
    );
    for (code, count) in by_code {
        let _ = writeln!(out, "    {code}: {count}");
    }
    if !failed_requests.is_empty() {
        let failed: Vec<String> = failed_requests
            .iter()
            .map(|(op, n)| format!("{op} {n}"))
            .collect();
        let _ = writeln!(out, "  failed after retries: {}", failed.join(", "));
    }
}

/// The server CPU line (nothing without `--pids`); `unit` names one timed request.
fn write_cpu(out: &mut String, cpu: &ServerCpu, unit: &str) {
    if cpu.processes.is_empty() {
        return;
    }
    let each: Vec<String> = cpu
        .processes
        .iter()
        .map(|p| match p.cpu_s {
            Some(s) => format!("{} {s:.2}", p.name),
            None => format!("{} -", p.name),
        })
        .collect();
    let per = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
    };
    let _ = writeln!(
        out,
        "  server CPU:  {:.2} s ({}), {} ms per {unit}, {} s per GiB",
        cpu.total_s,
        each.join(", "),
        per(cpu.per_op_s.map(|s| s * 1000.0), 3),
        per(cpu.per_gib_s, 2),
    );
}

/// The RSS table (nothing without `--pids`).
fn write_rss(out: &mut String, processes: &[ProcessRss]) {
    if processes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  RSS (MiB)    {:<12} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "process", "pid", "first", "min", "max", "last"
    );
    for p in processes {
        let _ = writeln!(
            out,
            "               {:<12} {:>8} {:>9} {:>9} {:>9} {:>9}{}",
            p.name,
            p.pid,
            opt_mib(p.first_mib),
            opt_mib(p.min_mib),
            opt_mib(p.max_mib),
            opt_mib(p.last_mib),
            if p.exited { "  EXITED" } else { "" }
        );
    }
}

/// CPU time (user + system, all threads) one sampled process used during
/// the load phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessCpu {
    /// Name from `--pids`.
    pub name: String,
    /// Process id.
    pub pid: u32,
    /// Seconds; `None` when `/proc/PID/stat` could not be read at the
    /// start or the end (the process exited), or the counter went back (the
    /// pid was reused).
    pub cpu_s: Option<f64>,
}

/// CPU time of the sampled (server) processes over the load phase, read
/// from `/proc/PID/stat` (utime + stime) at its start and its end, and the
/// same per timed request and per GiB those requests moved.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerCpu {
    /// Clock ticks per second of the `/proc` figures (`USER_HZ`, assumed 100).
    pub clock_ticks_per_s: u64,
    /// Seconds of every process readable at both ends, summed.
    pub total_s: f64,
    /// `total_s` per timed request; `None` when none was done.
    pub per_op_s: Option<f64>,
    /// `total_s` per GiB moved by the timed requests; `None` when none was.
    pub per_gib_s: Option<f64>,
    /// Each process, in `--pids` order.
    pub processes: Vec<ProcessCpu>,
}

impl ServerCpu {
    /// The figures from the tick counts `before` and `after` (in `targets`
    /// order, `None` = unreadable) over a phase with `ops` timed requests
    /// that moved `bytes`.
    pub fn between(
        targets: &[ProcTarget],
        before: &[Option<u64>],
        after: &[Option<u64>],
        ops: u64,
        bytes: u64,
    ) -> Self {
        let processes: Vec<ProcessCpu> = targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let start = before.get(i).copied().flatten();
                let end = after.get(i).copied().flatten();
                let ticks = match (start, end) {
                    (Some(start), Some(end)) => end.checked_sub(start),
                    _ => None,
                };
                ProcessCpu {
                    name: t.name.clone(),
                    pid: t.pid,
                    cpu_s: ticks.map(ticks_to_seconds),
                }
            })
            .collect();
        let total_s: f64 = processes.iter().filter_map(|p| p.cpu_s).sum();
        Self {
            clock_ticks_per_s: CLOCK_TICKS_PER_SECOND,
            total_s,
            per_op_s: (ops > 0).then(|| total_s / ops as f64),
            per_gib_s: (bytes > 0).then(|| total_s / (bytes as f64 / GIB)),
            processes,
        }
    }
}

/// The `put` or `get` workload as configured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectShape {
    /// Workers, each with one request in flight.
    pub concurrent: usize,
    /// Bytes per object.
    pub obj_size_bytes: u64,
    /// `get`: objects written before the load and read at random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<u64>,
    /// `get --part-size`: the objects were written as multipart uploads of
    /// parts of this many bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part_size_bytes: Option<u64>,
    /// Requested load duration, seconds.
    pub duration_s: f64,
    /// Attempts per request (SDK standard retry mode).
    pub max_attempts: u32,
    /// `--keep`: the objects are left in place.
    pub keep: bool,
}

/// What the end-of-run cleanup deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Cleanup {
    /// `--keep` was given: nothing was deleted.
    pub kept: bool,
    /// Keys the run may have written: for `put` every key a PutObject was
    /// started on (one dropped at the deadline may have landed), for `get`
    /// the seeded objects.
    pub keys: u64,
    /// Keys DeleteObjects reported deleted.
    pub deleted: u64,
    /// Keys not deleted (a failed request or a per-key error).
    pub failed: u64,
}

/// Everything a `put` or `get` run measured. Serialised as `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectSummary {
    /// `put` or `get`.
    pub benchmark: &'static str,
    /// The timed request: `PutObject` or `GetObject`.
    pub operation: &'static str,
    /// S3 endpoint URL.
    pub endpoint: String,
    /// Bucket written to.
    pub bucket: String,
    /// Key prefix of this run's objects.
    pub key_prefix: String,
    /// Workload shape.
    pub shape: ObjectShape,
    /// Measured load duration, seconds.
    pub elapsed_s: f64,
    /// Successful timed requests that ended before the deadline.
    pub ops: u64,
    /// Object bytes those requests moved.
    pub bytes: u64,
    /// `bytes` per elapsed second, MiB/s.
    pub mib_per_s: f64,
    /// `ops` per elapsed second.
    pub ops_per_s: f64,
    /// Latency of successful timed requests, SDK retries included
    /// (GetObject: until the last byte of the body).
    pub latency: LatencySummary,
    /// `get`: time to the response headers of those GetObjects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_byte_latency: Option<LatencySummary>,
    /// Error responses, every attempt counted (retried ones too), plus
    /// bodies that broke off or did not match (`BodyReadError`,
    /// `BodyLengthMismatch`, `ETagMismatch`).
    pub errors_total: u64,
    /// Those by S3 error code (or `HTTP<status>`, `Timeout`, `IoError`, ...).
    pub errors_by_code: BTreeMap<String, u64>,
    /// `SlowDown` error responses (also in `errors_by_code`).
    pub slowdown: u64,
    /// Requests that failed after all attempts, by S3 operation.
    pub failed_requests: BTreeMap<String, u64>,
    /// Object-size payload buffers the load phase allocated (`put`: one
    /// per worker, a second only while the SDK still held the first).
    pub payload_buffers: u64,
    /// RSS of the sampled processes.
    pub processes: Vec<ProcessRss>,
    /// CPU time of the sampled processes during the load phase.
    pub server_cpu: ServerCpu,
    /// What was deleted at the end.
    pub cleanup: Cleanup,
}

impl ObjectSummary {
    /// The human-readable report printed at the end of a run.
    pub fn render_text(&self) -> String {
        let s = &self.shape;
        let mut out = String::new();
        let size = size_text(s.obj_size_bytes);
        let reading = s
            .objects
            .map(|n| format!(", reading {n} objects at random"))
            .unwrap_or_default();
        let parts = s
            .part_size_bytes
            .map(|p| format!(" (multipart, {} parts)", size_text(p)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "sluice-bench {}: {} workers x {size} objects{parts}{reading}, {:.1} s against {} bucket {}",
            self.benchmark, s.concurrent, self.elapsed_s, self.endpoint, self.bucket
        );
        let _ = writeln!(
            out,
            "  requests:    {} {} ({})",
            self.ops,
            self.operation,
            amount_text(self.bytes)
        );
        let _ = writeln!(
            out,
            "  throughput:  {:.2} MiB/s, {:.2} ops/s",
            self.mib_per_s, self.ops_per_s
        );
        write_latency(&mut out, &format!("{}:", self.operation), &self.latency);
        if let Some(first) = &self.first_byte_latency {
            write_latency(&mut out, "first byte:", first);
        }
        write_errors(
            &mut out,
            self.errors_total,
            self.slowdown,
            &self.errors_by_code,
            &self.failed_requests,
        );
        write_cpu(&mut out, &self.server_cpu, "op");
        write_rss(&mut out, &self.processes);
        let c = &self.cleanup;
        if c.kept {
            let _ = writeln!(
                out,
                "  cleanup:     kept (--keep): up to {} objects under {}/",
                c.keys, self.key_prefix
            );
        } else {
            let _ = writeln!(
                out,
                "  cleanup:     deleted {} of {} keys, {} failed",
                c.deleted, c.keys, c.failed
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f64, rss: Vec<Option<f64>>) -> Sample {
        Sample {
            elapsed_s: t,
            mib_per_s: 10.0,
            ops_done: 1,
            errors: 0,
            rss_mib: rss,
        }
    }

    #[test]
    fn process_rss_statistics() {
        let samples = vec![
            row(1.0, vec![Some(100.0), None]),
            row(2.0, vec![Some(300.0), Some(50.0)]),
            row(3.0, vec![Some(200.0), None]),
        ];
        let a = ProcessRss::from_samples("a", 1, 0, &samples);
        assert_eq!(
            (
                a.first_mib,
                a.min_mib,
                a.max_mib,
                a.last_mib,
                a.samples,
                a.exited
            ),
            (Some(100.0), Some(100.0), Some(300.0), Some(200.0), 3, false)
        );
        let b = ProcessRss::from_samples("b", 2, 1, &samples);
        assert_eq!(
            (b.first_mib, b.last_mib, b.samples, b.exited),
            (Some(50.0), Some(50.0), 1, true)
        );
        let never = ProcessRss::from_samples("c", 3, 5, &samples);
        assert_eq!(
            (never.samples, never.exited, never.max_mib),
            (0, false, None)
        );
    }

    #[test]
    fn text_and_json_carry_the_figures() {
        let summary = Summary {
            benchmark: "multipart-put",
            endpoint: "http://127.0.0.1:9000".into(),
            bucket: "b".into(),
            key_prefix: "bench/1".into(),
            shape: Shape {
                concurrent: 5,
                parts: 100,
                part_size_bytes: 10 * 1024 * 1024,
                part_concurrent: 1,
                duration_s: 60.0,
                complete: true,
                delete_after: false,
                max_attempts: 3,
            },
            elapsed_s: 60.0,
            parts: 200,
            bytes: 200 * 10 * 1024 * 1024,
            mib_per_s: 33.33,
            parts_per_s: 3.33,
            upload_part_latency: LatencySummary {
                count: 200,
                mean_ms: 150.0,
                p50_ms: 140.0,
                p90_ms: 200.0,
                p99_ms: 300.0,
                max_ms: 450.5,
            },
            uploads: UploadCounts {
                started: 7,
                completed: 2,
                unfinished: 5,
                ..UploadCounts::default()
            },
            errors_total: 4,
            errors_by_code: BTreeMap::from([
                ("SlowDown".to_owned(), 3),
                ("InternalError".to_owned(), 1),
            ]),
            slowdown: 3,
            failed_requests: BTreeMap::new(),
            payload_buffers: 5,
            processes: vec![ProcessRss::from_samples(
                "gateway",
                42,
                0,
                &[row(1.0, vec![Some(250.0)])],
            )],
            server_cpu: ServerCpu::between(
                &[ProcTarget {
                    name: "gateway".into(),
                    pid: 42,
                }],
                &[Some(1000)],
                &[Some(3000)],
                200,
                200 * 10 * 1024 * 1024,
            ),
        };
        let text = summary.render_text();
        for needle in [
            "  UploadPart:  p50 140.0 ms",
            "server CPU:  20.00 s (gateway 20.00), 100.000 ms per part, 10.24 s per GiB",
            "33.33 MiB/s",
            "p99 300.0 ms",
            "max 450.5 ms",
            "SlowDown: 3",
            "InternalError: 1",
            "gateway",
            "250.0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        let json: serde_json::Value = serde_json::to_value(&summary).expect("serialise");
        assert_eq!(json["slowdown"], 3);
        assert_eq!(json["upload_part_latency"]["p99_ms"], 300.0);
        assert_eq!(json["errors_by_code"]["SlowDown"], 3);
        assert_eq!(json["processes"][0]["max_mib"], 250.0);
        assert_eq!(json["uploads"]["unfinished"], 5);
        assert_eq!(json["server_cpu"]["total_s"], 20.0);
        assert_eq!(json["server_cpu"]["clock_ticks_per_s"], 100);
    }

    fn targets(names: &[&str]) -> Vec<ProcTarget> {
        names
            .iter()
            .zip(1..)
            .map(|(name, pid)| ProcTarget {
                name: (*name).to_owned(),
                pid,
            })
            .collect()
    }

    #[test]
    fn sizes_in_exact_binary_units() {
        assert_eq!(size_text(4096), "4 KiB");
        assert_eq!(size_text(1 << 20), "1 MiB");
        assert_eq!(size_text(1536 * 1024), "1536 KiB");
        assert_eq!(size_text(5 << 30), "5 GiB");
        assert_eq!(size_text(1000), "1000 B");
        assert_eq!(size_text(0), "0 B");
        assert_eq!(amount_text(3 << 29), "1.50 GiB");
        assert_eq!(amount_text(1 << 19), "0.50 MiB");
    }

    #[test]
    fn server_cpu_per_op_and_per_gib() {
        let t = targets(&["meta", "gw", "dn1", "dn2"]);
        // gw: 12.5 s; meta: 0.5 s; dn1 exited; dn2's counter went back (pid reused).
        let cpu = ServerCpu::between(
            &t,
            &[Some(100), Some(250), Some(10), Some(500)],
            &[Some(150), Some(1500), None, Some(20)],
            1000,
            2 << 30,
        );
        let each: Vec<Option<f64>> = cpu.processes.iter().map(|p| p.cpu_s).collect();
        assert_eq!(each, vec![Some(0.5), Some(12.5), None, None]);
        assert_eq!(cpu.total_s, 13.0);
        assert_eq!(cpu.per_op_s, Some(0.013));
        assert_eq!(cpu.per_gib_s, Some(6.5));
        assert_eq!(cpu.clock_ticks_per_s, 100);

        let idle = ServerCpu::between(&t[..1], &[Some(7)], &[Some(7)], 0, 0);
        assert_eq!(
            (idle.total_s, idle.per_op_s, idle.per_gib_s),
            (0.0, None, None)
        );
        let none = ServerCpu::between(&[], &[], &[], 10, 10);
        assert!(none.processes.is_empty());
        let mut text = String::new();
        write_cpu(&mut text, &none, "op");
        assert!(text.is_empty(), "no CPU line without --pids");
    }

    fn object_summary(benchmark: &'static str) -> ObjectSummary {
        let get = benchmark == "get";
        let latency = LatencySummary {
            count: 1000,
            mean_ms: 2.0,
            p50_ms: 1.5,
            p90_ms: 3.0,
            p99_ms: 9.0,
            max_ms: 25.0,
        };
        ObjectSummary {
            benchmark,
            operation: if get { "GetObject" } else { "PutObject" },
            endpoint: "http://127.0.0.1:9000".into(),
            bucket: "b".into(),
            key_prefix: "put/0123".into(),
            shape: ObjectShape {
                concurrent: 32,
                obj_size_bytes: 4096,
                part_size_bytes: None,
                objects: get.then_some(64),
                duration_s: 60.0,
                max_attempts: 3,
                keep: false,
            },
            elapsed_s: 60.0,
            ops: 1000,
            bytes: 1000 * 4096,
            mib_per_s: 0.07,
            ops_per_s: 16.67,
            latency,
            first_byte_latency: get.then_some(LatencySummary {
                p50_ms: 0.5,
                ..latency
            }),
            errors_total: 2,
            errors_by_code: BTreeMap::from([("BodyLengthMismatch".to_owned(), 2)]),
            slowdown: 0,
            failed_requests: BTreeMap::from([(
                if get { "GetObject" } else { "PutObject" }.to_owned(),
                2,
            )]),
            payload_buffers: 32,
            processes: vec![],
            server_cpu: ServerCpu::between(
                &targets(&["gw"]),
                &[Some(0)],
                &[Some(500)],
                1000,
                1000 * 4096,
            ),
            cleanup: Cleanup {
                kept: false,
                keys: 1010,
                deleted: 1010,
                failed: 0,
            },
        }
    }

    #[test]
    fn object_summary_text_and_json() {
        let put = object_summary("put");
        let text = put.render_text();
        for needle in [
            "sluice-bench put: 32 workers x 4 KiB objects, 60.0 s",
            "requests:    1000 PutObject (3.91 MiB)",
            "16.67 ops/s",
            "  PutObject:   p50 1.5 ms, p90 3.0 ms, p99 9.0 ms, max 25.0 ms",
            "BodyLengthMismatch: 2",
            "failed after retries: PutObject 2",
            "server CPU:  5.00 s (gw 5.00), 5.000 ms per op, 1310.72 s per GiB",
            "deleted 1010 of 1010 keys, 0 failed",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(!text.contains("first byte"), "{text}");
        let json = serde_json::to_value(&put).expect("serialise");
        assert_eq!(json["benchmark"], "put");
        assert_eq!(json["shape"]["obj_size_bytes"], 4096);
        assert!(json["shape"].get("objects").is_none());
        assert!(json.get("first_byte_latency").is_none());
        assert_eq!(json["server_cpu"]["per_op_s"], 0.005);
        assert_eq!(json["cleanup"]["deleted"], 1010);

        let mut get = object_summary("get");
        get.cleanup.kept = true;
        let text = get.render_text();
        for needle in [
            "reading 64 objects at random",
            "  GetObject:   p50 1.5",
            "  first byte:  p50 0.5 ms",
            "kept (--keep): up to 1010 objects under put/0123/",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        let json = serde_json::to_value(&get).expect("serialise");
        assert_eq!(json["shape"]["objects"], 64);
        assert_eq!(json["first_byte_latency"]["p50_ms"], 0.5);
    }
}
