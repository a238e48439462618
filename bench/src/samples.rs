//! The per-second samples file (`samples.csv`).
//!
//! Columns: `elapsed_s,mib_per_s,parts_done,errors,rss_mib_<name>...` —
//! seconds since the load started (3 decimals), throughput of the timed
//! requests in the interval ending then (MiB/s, 2 decimals; a request
//! counts when it returns, so with big parts or objects the figure moves in
//! whole-request steps), cumulative timed requests done (the column is
//! `parts_done` for `multipart-put`, whose requests are UploadParts, and
//! `ops_done` for `put` and `get`),
//! cumulative error responses (every attempt, retried ones included), then
//! the RSS of each sampled process in MiB (1 decimal), empty when the
//! process could not be read (exited).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::BenchError;
use crate::stats::MIB;

/// One row of `samples.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the load phase started.
    pub elapsed_s: f64,
    /// Throughput of the timed requests (UploadPart, PutObject or
    /// GetObject) over the interval that ends at `elapsed_s`, MiB/s.
    pub mib_per_s: f64,
    /// Timed requests done so far (column `parts_done` or `ops_done`).
    pub ops_done: u64,
    /// Error responses so far (each failed attempt counts).
    pub errors: u64,
    /// RSS per sampled process, MiB, in `--pids` order; `None` = unreadable.
    pub rss_mib: Vec<Option<f64>>,
}

/// Bytes to MiB.
pub fn bytes_to_mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// Name of the third column: what the timed requests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// `parts_done` (UploadParts of `multipart-put`).
    Parts,
    /// `ops_done` (PutObjects or GetObjects of `put` and `get`).
    Ops,
}

impl Counted {
    /// The column name.
    pub fn column(self) -> &'static str {
        match self {
            Counted::Parts => "parts_done",
            Counted::Ops => "ops_done",
        }
    }
}

/// The header line (without newline) for processes named `names`.
pub fn header(counted: Counted, names: &[String]) -> String {
    let mut line = format!("elapsed_s,mib_per_s,{},errors", counted.column());
    for name in names {
        line.push_str(",rss_mib_");
        line.push_str(name);
    }
    line
}

/// One data line (without newline).
pub fn format_row(sample: &Sample) -> String {
    let mut line = format!(
        "{:.3},{:.2},{},{}",
        sample.elapsed_s, sample.mib_per_s, sample.ops_done, sample.errors
    );
    for rss in &sample.rss_mib {
        line.push(',');
        if let Some(mib) = rss {
            line.push_str(&format!("{mib:.1}"));
        }
    }
    line
}

/// Parses a samples CSV written by [`SamplesWriter`]: the process names
/// from the header and every row.
///
/// # Errors
/// [`BenchError::ParseSamples`] on a missing or foreign header, a wrong
/// column count or a non-numeric field.
pub fn parse(text: &str) -> Result<(Vec<String>, Vec<Sample>), BenchError> {
    let mut lines = text.lines().enumerate();
    let bad = |line: usize, reason: String| BenchError::ParseSamples {
        line: line + 1,
        reason,
    };
    let (_, head) = lines.next().ok_or_else(|| bad(0, "empty file".into()))?;
    let columns: Vec<&str> = head.split(',').collect();
    let known_count = |c: &str| {
        [Counted::Parts, Counted::Ops]
            .iter()
            .any(|k| k.column() == c)
    };
    if columns.len() < 4
        || columns[..2] != ["elapsed_s", "mib_per_s"]
        || !known_count(columns[2])
        || columns[3] != "errors"
    {
        return Err(bad(0, format!("unexpected header `{head}`")));
    }
    let mut names = Vec::new();
    for column in &columns[4..] {
        let name = column
            .strip_prefix("rss_mib_")
            .ok_or_else(|| bad(0, format!("unexpected column `{column}`")))?;
        names.push(name.to_owned());
    }
    let mut rows = Vec::new();
    for (i, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != columns.len() {
            return Err(bad(
                i,
                format!("{} fields, expected {}", fields.len(), columns.len()),
            ));
        }
        let float = |f: &str| {
            f.parse::<f64>()
                .map_err(|_| bad(i, format!("`{f}` is not a number")))
        };
        let int = |f: &str| {
            f.parse::<u64>()
                .map_err(|_| bad(i, format!("`{f}` is not a count")))
        };
        let rss_mib = fields[4..]
            .iter()
            .map(|f| {
                if f.is_empty() {
                    Ok(None)
                } else {
                    float(f).map(Some)
                }
            })
            .collect::<Result<_, _>>()?;
        rows.push(Sample {
            elapsed_s: float(fields[0])?,
            mib_per_s: float(fields[1])?,
            ops_done: int(fields[2])?,
            errors: int(fields[3])?,
            rss_mib,
        });
    }
    Ok((names, rows))
}

/// Appends samples to a CSV file, flushing each row so that a run that is
/// killed still leaves every sample taken so far.
#[derive(Debug)]
pub struct SamplesWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl SamplesWriter {
    /// Creates (truncates) `path` and writes the header for `names`.
    ///
    /// # Errors
    /// [`BenchError::WriteOutput`] when the file cannot be created or written.
    pub fn create(path: &Path, counted: Counted, names: &[String]) -> Result<Self, BenchError> {
        let file = File::create(path).map_err(|source| BenchError::WriteOutput {
            path: path.to_owned(),
            source,
        })?;
        let mut writer = Self {
            path: path.to_owned(),
            out: BufWriter::new(file),
        };
        writer.write_line(&header(counted, names))?;
        Ok(writer)
    }

    /// Appends one row and flushes it to the file.
    ///
    /// # Errors
    /// [`BenchError::WriteOutput`] on an I/O error.
    pub fn write(&mut self, sample: &Sample) -> Result<(), BenchError> {
        self.write_line(&format_row(sample))
    }

    fn write_line(&mut self, line: &str) -> Result<(), BenchError> {
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|source| BenchError::WriteOutput {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sample {
        Sample {
            elapsed_s: 1.0004,
            mib_per_s: 33.333,
            ops_done: 12,
            errors: 3,
            rss_mib: vec![Some(250.04), None, Some(1024.0)],
        }
    }

    #[test]
    fn header_and_row_format() {
        let names = vec!["gateway".to_owned(), "meta".to_owned(), "dn1".to_owned()];
        assert_eq!(
            header(Counted::Parts, &names),
            "elapsed_s,mib_per_s,parts_done,errors,rss_mib_gateway,rss_mib_meta,rss_mib_dn1"
        );
        assert_eq!(format_row(&sample()), "1.000,33.33,12,3,250.0,,1024.0");
        assert_eq!(
            header(Counted::Parts, &[]),
            "elapsed_s,mib_per_s,parts_done,errors"
        );
        assert_eq!(
            header(Counted::Ops, &[]),
            "elapsed_s,mib_per_s,ops_done,errors"
        );
    }

    #[test]
    fn writer_output_parses_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("samples.csv");
        let names = vec!["gateway".to_owned(), "meta".to_owned(), "dn1".to_owned()];
        let mut writer = SamplesWriter::create(&path, Counted::Parts, &names).expect("create");
        writer.write(&sample()).expect("write");
        let mut second = sample();
        second.elapsed_s = 2.0;
        second.rss_mib = vec![None, None, None];
        writer.write(&second).expect("write");
        drop(writer);

        let text = std::fs::read_to_string(&path).expect("read back");
        assert_eq!(text.lines().count(), 3);
        let (parsed_names, rows) = parse(&text).expect("parse");
        assert_eq!(parsed_names, names);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].elapsed_s, 1.0);
        assert_eq!(rows[0].mib_per_s, 33.33);
        assert_eq!(rows[0].ops_done, 12);
        assert_eq!(rows[0].rss_mib, vec![Some(250.0), None, Some(1024.0)]);
        assert_eq!(rows[1].rss_mib, vec![None, None, None]);

        let ops = dir.path().join("ops.csv");
        let mut writer = SamplesWriter::create(&ops, Counted::Ops, &[]).expect("create");
        writer
            .write(&Sample {
                rss_mib: vec![],
                ..sample()
            })
            .expect("write");
        drop(writer);
        let (names, rows) = parse(&std::fs::read_to_string(&ops).expect("read")).expect("parse");
        assert!(names.is_empty());
        assert_eq!(rows[0].ops_done, 12);
    }

    #[test]
    fn parse_rejects_malformed() {
        assert!(parse("").is_err());
        assert!(parse("a,b,c,d\n").is_err());
        assert!(parse("elapsed_s,mib_per_s,bytes_done,errors\n").is_err());
        assert!(parse("elapsed_s,mib_per_s,parts_done,errors,x\n").is_err());
        assert!(parse("elapsed_s,mib_per_s,parts_done,errors\n1,2,3\n").is_err());
        assert!(parse("elapsed_s,mib_per_s,parts_done,errors\n1,2,x,4\n").is_err());
    }
}
