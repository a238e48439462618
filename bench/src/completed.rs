//! Completed multipart uploads and the bytes they must hold.
//!
//! Part payloads are a pure function of `(run seed, worker, upload, part
//! number)` ([`crate::data::part_seed`]), so an object written by
//! `multipart-put` can be checked byte for byte without keeping its data:
//! the benchmark records the few numbers that name it ([`CompletedUpload`])
//! and [`crate::verify`] regenerates the stream while reading it back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::data::{fill, part_seed};

/// Uploads a [`CompletedLog`] keeps by default: about 10 MB of records;
/// further completions are counted, not kept.
pub const DEFAULT_COMPLETED_LOG_LIMIT: usize = 100_000;

/// An upload that CompleteMultipartUpload acknowledged (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompletedUpload {
    /// Object key.
    pub key: String,
    /// Seed of the run that wrote it.
    pub run_seed: u64,
    /// Worker number (0-based).
    pub worker: u64,
    /// Upload number of that worker (1-based).
    pub upload: u64,
    /// Parts in the object (1..=10000), numbered from 1.
    pub parts: u32,
    /// Bytes per part; every part has this size.
    pub part_size: u64,
}

impl CompletedUpload {
    /// Object size, bytes.
    pub fn size(&self) -> u64 {
        u64::from(self.parts) * self.part_size
    }

    /// Overwrites `buf` with the payload of part `part_number` (1-based);
    /// `buf` must be `part_size` long for the whole part.
    pub fn fill_part(&self, part_number: u32, buf: &mut [u8]) {
        fill(
            part_seed(
                self.run_seed,
                self.worker,
                self.upload,
                u64::from(part_number),
            ),
            buf,
        );
    }
}

/// A bounded record of completed uploads, shared by the workers of a run.
#[derive(Debug)]
pub struct CompletedLog {
    limit: usize,
    entries: Mutex<Vec<CompletedUpload>>,
    dropped: AtomicU64,
}

impl Default for CompletedLog {
    fn default() -> Self {
        Self::new(DEFAULT_COMPLETED_LOG_LIMIT)
    }
}

impl CompletedLog {
    /// A log that keeps at most `limit` uploads.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            entries: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        }
    }

    /// Records `upload`, or counts it as dropped when the log is full.
    pub fn record(&self, upload: CompletedUpload) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() < self.limit {
            entries.push(upload);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A copy of the recorded uploads, in completion order.
    pub fn entries(&self) -> Vec<CompletedUpload> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Completions that did not fit.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(n: u64) -> CompletedUpload {
        CompletedUpload {
            key: format!("k{n}"),
            run_seed: 9,
            worker: 1,
            upload: n,
            parts: 3,
            part_size: 16,
        }
    }

    #[test]
    fn log_keeps_up_to_its_limit_and_counts_the_rest() {
        let log = CompletedLog::new(2);
        for n in 1..=5 {
            log.record(upload(n));
        }
        assert_eq!(log.entries(), vec![upload(1), upload(2)]);
        assert_eq!(log.dropped(), 3);
    }

    #[test]
    fn parts_are_the_benchmark_payloads() {
        let u = upload(4);
        assert_eq!(u.size(), 48);
        let mut got = [0u8; 16];
        u.fill_part(2, &mut got);
        let mut want = [0u8; 16];
        fill(part_seed(9, 1, 4, 2), &mut want);
        assert_eq!(got, want);
        u.fill_part(3, &mut want);
        assert_ne!(got, want);
    }
}
