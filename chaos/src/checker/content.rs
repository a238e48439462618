//! Content check: a read's bytes are exactly the bytes of the value it
//! claims, and that value is a write of the same key that did not fail.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

use super::{Violation, ViolationKind, evidence};
use crate::history::{ByteRange, Entry, Op, Outcome, ReadResult, Value};

/// What the content check found.
pub(super) struct ContentResult {
    /// One violation per bad read.
    pub violations: Vec<Violation>,
    /// Reads (history indices) whose value id names no usable write of
    /// their key (none, unknown, another key's, a failed write's): the
    /// register check leaves them out, as they are reported here already
    /// and say nothing about the key's register.
    pub bad_reads: HashSet<usize>,
}

/// Checks every read that found an object.
pub(super) fn check_reads(history: &[Entry]) -> ContentResult {
    let mut puts: HashMap<u64, usize> = HashMap::new();
    for (i, e) in history.iter().enumerate() {
        if let Op::Put { value, .. } = &e.op {
            puts.entry(value.id).or_insert(i);
        }
    }
    let mut digests = Digests::default();
    let mut result = ContentResult {
        violations: Vec::new(),
        bad_reads: HashSet::new(),
    };
    for (i, e) in history.iter().enumerate() {
        let (
            Op::Get { key, range },
            Outcome::Read {
                result:
                    ReadResult::Found {
                        value_id,
                        len,
                        hash,
                    },
            },
        ) = (&e.op, &e.outcome)
        else {
            continue;
        };
        let bad = |message: String, idxs: Vec<usize>| Violation {
            kind: ViolationKind::CorruptRead,
            key: Some(key.clone()),
            message,
            entries: evidence(history, idxs),
        };
        let Some(id) = *value_id else {
            result.bad_reads.insert(i);
            result.violations.push(bad(
                format!("read #{} found an object with no value id", e.id),
                vec![i],
            ));
            continue;
        };
        let Some(&w) = puts.get(&id) else {
            result.bad_reads.insert(i);
            result.violations.push(bad(
                format!("read #{} found value {id}, which no Put wrote", e.id),
                vec![i],
            ));
            continue;
        };
        let Op::Put {
            key: put_key,
            value,
            ..
        } = &history[w].op
        else {
            unreachable!("puts holds Put entries")
        };
        if put_key != key {
            result.bad_reads.insert(i);
            let message = format!(
                "read #{} found value {id}, which Put #{} wrote under key {put_key:?}",
                e.id, history[w].id
            );
            result.violations.push(bad(message, vec![w, i]));
            continue;
        }
        if matches!(history[w].outcome, Outcome::Failed { .. }) {
            result.bad_reads.insert(i);
            let message = format!(
                "read #{} found value {id}, whose Put #{} failed (never took effect)",
                e.id, history[w].id
            );
            result.violations.push(bad(message, vec![w, i]));
            continue;
        }
        let (want_len, want_hash) = digests.get(value, *range);
        if *len != want_len || *hash != want_hash {
            let what = if *len != want_len {
                format!("{len} bytes, not the {want_len} of")
            } else {
                "bytes that are not those of".to_string()
            };
            let message = format!(
                "read #{} got {what} value {id}{} (written by Put #{}, {} part(s))",
                e.id,
                range
                    .map(|r| format!(" bytes {}-{}", r.first, r.last))
                    .unwrap_or_default(),
                history[w].id,
                value.parts.len()
            );
            result.violations.push(bad(message, vec![w, i]));
        }
    }
    result
}

/// A value id and the byte range read (first, last), if any.
type RangeOf = (u64, Option<(u64, u64)>);

/// (length, SHA-256 hex) of values' bytes, computed once per (id, range).
#[derive(Default)]
struct Digests {
    cache: HashMap<RangeOf, (u64, String)>,
}

impl Digests {
    fn get(&mut self, value: &Value, range: Option<ByteRange>) -> (u64, String) {
        self.cache
            .entry((value.id, range.map(|r| (r.first, r.last))))
            .or_insert_with(|| expected_digest(value, range))
            .clone()
    }
}

/// Length and SHA-256 of `value.range_bytes(range)`, generating one part
/// at a time (only the parts the range touches), so a 50 MiB value never
/// sits in memory whole.
pub(super) fn expected_digest(value: &Value, range: Option<ByteRange>) -> (u64, String) {
    let size = value.size();
    let (from, to) = match range {
        None => (0, size),
        Some(r) => {
            let end = r.last.saturating_add(1).min(size);
            (r.first.min(end), end)
        }
    };
    let mut hasher = Sha256::new();
    let mut buf = Vec::new();
    let mut offset = 0u64;
    for p in &value.parts {
        let (part_start, part_end) = (offset, offset + p.len);
        offset = part_end;
        let (s, e) = (part_start.max(from), part_end.min(to));
        if s >= e {
            continue;
        }
        buf.resize(p.len as usize, 0);
        sluice_harness::data::fill(p.seed, &mut buf);
        hasher.update(&buf[(s - part_start) as usize..(e - part_start) as usize]);
    }
    (to - from, hex::encode(hasher.finalize()))
}
