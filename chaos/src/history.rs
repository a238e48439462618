//! The history of a chaos run: every S3 request a workload client made,
//! with when it started and ended, what it asked and what came back.
//!
//! The shape follows Jepsen's histories (Kingsbury, "Jepsen: On the perils
//! of network partitions", and Knossos): an operation is *ok* (the server
//! answered and the client knows the effect), *failed* (the server answered
//! with an error that says the operation did not take effect) or
//! *indeterminate* (timeout, reset, a 5xx that may have come after the
//! commit: it may or may not have taken effect, at any time after its
//! start). The checker ([`crate::checker`]) needs nothing else.
//!
//! Object contents are not stored: every value is generated from seeds
//! ([`Value::bytes`]), so the checker regenerates exactly what was written
//! and compares what was read, byte for byte, by SHA-256.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// User metadata key (`x-amz-meta-chaos-value`) carrying a value's id on
/// every object the workload writes, so a read says which write it claims
/// to return; the checker then verifies the bytes against that write.
pub const VALUE_ID_META: &str = "chaos-value";

/// One part of a value: `len` bytes of `sluice_harness::data::fill(seed)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// Seed of the part's pseudo-random bytes.
    pub seed: u64,
    /// Length, bytes.
    pub len: u64,
}

/// What one write puts under a key: a unique id and the parts whose
/// concatenation is the object's body (one part for PutObject, the
/// completed parts in order for a multipart upload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Value {
    /// Unique in the run (client number in the high bits).
    pub id: u64,
    /// The body, in order.
    pub parts: Vec<Part>,
}

impl Value {
    /// Body length, bytes.
    pub fn size(&self) -> u64 {
        self.parts.iter().map(|p| p.len).sum()
    }

    /// The whole body.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size() as usize);
        for p in &self.parts {
            let start = out.len();
            out.resize(start + p.len as usize, 0);
            sluice_harness::data::fill(p.seed, &mut out[start..]);
        }
        out
    }

    /// Bytes `range` of the body (clamped to its end, as S3 does), or the
    /// whole body.
    pub fn range_bytes(&self, range: Option<ByteRange>) -> Vec<u8> {
        let all = self.bytes();
        match range {
            None => all,
            Some(r) => {
                let end = (r.last + 1).min(all.len() as u64) as usize;
                let start = (r.first as usize).min(end);
                all[start..end].to_vec()
            }
        }
    }
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An HTTP byte range `bytes=first-last` (both inclusive, RFC 9110 14.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    /// First byte, inclusive.
    pub first: u64,
    /// Last byte, inclusive.
    pub last: u64,
}

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// PutObject (`multipart = false`) or a multipart upload completed by
    /// CompleteMultipartUpload (`multipart = true`; the start is the
    /// Complete request's, the parts are the ones it listed).
    Put {
        /// Object key.
        key: String,
        /// What it writes.
        value: Value,
        /// Written by a multipart upload.
        multipart: bool,
    },
    /// DeleteObject.
    Delete {
        /// Object key.
        key: String,
    },
    /// GetObject, whole or one range.
    Get {
        /// Object key.
        key: String,
        /// `Range` header, if any.
        range: Option<ByteRange>,
    },
    /// ListObjectsV2 over every page of `prefix`.
    List {
        /// Prefix listed.
        prefix: String,
    },
    /// UploadPart (for diagnosis; the checker only needs the completing
    /// [`Op::Put`]).
    UploadPart {
        /// Object key of the upload.
        key: String,
        /// The upload's id.
        upload_id: String,
        /// Part number, 1-based.
        part_number: u32,
        /// Its bytes.
        part: Part,
    },
    /// AbortMultipartUpload of an upload that was never completed (its
    /// parts must never become an object).
    Abort {
        /// Object key of the upload.
        key: String,
        /// The upload's id.
        upload_id: String,
    },
}

impl Op {
    /// The key this operation is about (`None` for a listing).
    pub fn key(&self) -> Option<&str> {
        match self {
            Op::Put { key, .. }
            | Op::Delete { key }
            | Op::Get { key, .. }
            | Op::UploadPart { key, .. }
            | Op::Abort { key, .. } => Some(key),
            Op::List { .. } => None,
        }
    }
}

/// What a read returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "read", rename_all = "snake_case")]
pub enum ReadResult {
    /// 404 NoSuchKey.
    NotFound,
    /// 200/206 with a body.
    Found {
        /// The value id the object's metadata names (`None` if it had none:
        /// a write the workload never made).
        value_id: Option<u64>,
        /// Body length received, bytes.
        len: u64,
        /// SHA-256 of the body received.
        hash: String,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A write or delete the server acknowledged.
    Ok,
    /// A read's result.
    Read {
        /// What came back.
        result: ReadResult,
    },
    /// A listing's keys (all pages, in order).
    Listed {
        /// Keys returned.
        keys: Vec<String>,
    },
    /// The server said the operation did not happen (4xx, or a 503
    /// SlowDown before any effect).
    Failed {
        /// S3 error code or HTTP status.
        code: String,
    },
    /// Unknown whether it took effect (timeout, reset, 500/502/504 after
    /// the body was sent).
    Indeterminate {
        /// What the client saw.
        reason: String,
    },
}

impl Outcome {
    /// True for an operation that may have taken effect without the
    /// client knowing.
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Outcome::Indeterminate { .. })
    }
}

/// One operation of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Sequence number in the history (unique).
    pub id: u64,
    /// Workload client (process-wide: one S3 client each, one operation
    /// at a time per client).
    pub client: u32,
    /// Start: CLOCK_MONOTONIC in microseconds ([`now_us`]; one clock for
    /// every process of the machine, so the orchestrator's fault log and
    /// the workload's history compare directly, and no wall-clock jump
    /// moves it).
    pub start_us: u64,
    /// End, same clock; for an indeterminate
    /// operation the time the client gave up (the checker treats it as
    /// open forever).
    pub end_us: u64,
    /// What was asked.
    pub op: Op,
    /// How it ended.
    pub outcome: Outcome,
}

/// CLOCK_MONOTONIC now, microseconds: the time base of every history
/// entry and fault event.
pub fn now_us() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000
}

/// Reads a history written as JSON lines, one [`Entry`] per line.
///
/// # Errors
/// I/O, or a line that is not an entry (its line number is given).
pub fn read_jsonl(path: &std::path::Path) -> anyhow::Result<Vec<Entry>> {
    use anyhow::Context;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}:{}: not a history entry", path.display(), i + 1))
        })
        .collect()
}

/// Writes a history as JSON lines.
///
/// # Errors
/// I/O.
pub fn write_jsonl(path: &std::path::Path, entries: &[Entry]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for e in entries {
        serde_json::to_writer(&mut out, e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_bytes_are_the_parts_in_order_and_ranges_clamp() {
        let v = Value {
            id: 1,
            parts: vec![Part { seed: 7, len: 10 }, Part { seed: 8, len: 5 }],
        };
        let all = v.bytes();
        assert_eq!(all.len(), 15);
        let mut p2 = vec![0u8; 5];
        sluice_harness::data::fill(8, &mut p2);
        assert_eq!(&all[10..], &p2[..]);
        assert_eq!(
            v.range_bytes(Some(ByteRange {
                first: 12,
                last: 100
            })),
            p2[2..].to_vec()
        );
        assert_eq!(content_hash(&v.range_bytes(None)), content_hash(&all));
    }

    #[test]
    fn entries_round_trip_as_json_lines() {
        let e = Entry {
            id: 3,
            client: 1,
            start_us: 10,
            end_us: 20,
            op: Op::Get {
                key: "k".into(),
                range: Some(ByteRange { first: 0, last: 9 }),
            },
            outcome: Outcome::Read {
                result: ReadResult::Found {
                    value_id: Some(4),
                    len: 10,
                    hash: "ab".into(),
                },
            },
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        write_jsonl(&path, std::slice::from_ref(&e)).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), vec![e]);
    }
}
