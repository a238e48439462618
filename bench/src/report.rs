//! The end-of-run summary: `summary.json` and the text printed to stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::samples::Sample;
use crate::stats::{LatencySummary, MIB};

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
        let _ = writeln!(
            out,
            "  UploadPart:  p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (mean {:.1} ms, n={})",
            l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, l.mean_ms, l.count
        );
        let u = &self.uploads;
        let _ = writeln!(
            out,
            "  uploads:     started {}, completed {}, failed {}, left open {}, unfinished at deadline {}, deleted {}",
            u.started, u.completed, u.failed, u.left_open, u.unfinished, u.deleted
        );
        let _ = writeln!(
            out,
            "  errors:      {} error responses, SlowDown {}",
            self.errors_total, self.slowdown
        );
        for (code, count) in &self.errors_by_code {
            let _ = writeln!(out, "    {code}: {count}");
        }
        if !self.failed_requests.is_empty() {
            let failed: Vec<String> = self
                .failed_requests
                .iter()
                .map(|(op, n)| format!("{op} {n}"))
                .collect();
            let _ = writeln!(out, "  failed after retries: {}", failed.join(", "));
        }
        if !self.processes.is_empty() {
            let _ = writeln!(
                out,
                "  RSS (MiB)    {:<12} {:>8} {:>9} {:>9} {:>9} {:>9}",
                "process", "pid", "first", "min", "max", "last"
            );
            for p in &self.processes {
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
            parts_done: 1,
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
        };
        let text = summary.render_text();
        for needle in [
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
    }
}
