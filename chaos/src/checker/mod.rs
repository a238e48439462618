//! The checker: decides whether a recorded [history](crate::history) is
//! one a correct object store could have produced.
//!
//! Three checks, each sound (a reported violation is a real one; nothing
//! is flagged that some valid execution explains):
//!
//! 1. **Content** (`content.rs`): every read that found an object names a
//!    value id; that id must be a [`Op::Put`] of the same key that did not
//!    fail, and the bytes received must be exactly the bytes (or the byte
//!    range) of that value, by SHA-256 and length. Values are regenerated
//!    from their seeds, lazily, once per id and range actually read.
//!    Otherwise: [`ViolationKind::CorruptRead`] (a torn or mixed multipart
//!    object, bit rot served, a value that never existed).
//! 2. **Per-key linearizability** (`register.rs`): each key is a
//!    read/write register whose state is "absent" or one value id; a Put
//!    sets it, a Delete clears it, a Get (whole or ranged) observes it.
//!    Keys are independent objects, so the history is checked key by key
//!    (linearizability is *local*: Herlihy & Wing 1990). The search is
//!    Wing & Gong's ("Testing and verifying concurrent objects", JPDC 1993)
//!    with Lowe's memoisation of (linearized set, state) ("Testing for
//!    linearizability", Concurrency and Computation 2017), as in Jepsen's
//!    Knossos and porcupine, with a per-key budget of explored states
//!    ([`CheckOptions::max_search_states`]). Because every write has a
//!    unique value, the register is the easy case Gibbons & Korach
//!    ("Testing shared memories", SIAM J. Comput. 1997) single out, and
//!    most failures are found directly as a pattern (a read contradicted
//!    by a write that ended before it started) and named
//!    [`ViolationKind::LostWrite`], [`ViolationKind::StaleRead`] or
//!    [`ViolationKind::ResurrectedDelete`]; what only the search finds is
//!    [`ViolationKind::NotLinearizable`], reported with a shrunk history.
//! 3. **Listings** (`listing.rs`): a listing may run concurrently with
//!    writes and is not atomic across pages, so during the run it is
//!    checked only where the answer is definite: a listed key that is
//!    absent throughout the listing in every linearization, or a missing
//!    key that is present throughout it in every linearization. The final
//!    listing of the read-back phase (after quiescence,
//!    [`CheckOptions::final_phase_start_us`]) is checked exactly against
//!    the read-back Gets. Otherwise: [`ViolationKind::ListingMismatch`].
//!
//! Operation outcomes follow Jepsen: *ok* took effect between its start
//! and end; *failed* did not take effect and is dropped; *indeterminate*
//! may take effect at any time after its start, or never (its end is
//! treated as infinity). An indeterminate or failed read tells nothing
//! and is dropped. [`Op::UploadPart`] and [`Op::Abort`] are informational
//! (an aborted upload's parts could only show up as an object through a
//! Put that names them, which no Put does, so the content check covers
//! it).

mod content;
pub mod digest;
mod listing;
mod register;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::history::{Entry, Op, Outcome};

/// How hard to look.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// States the linearizability search may explore per key before it
    /// gives up and calls the key inconclusive.
    pub max_search_states: usize,
    /// Start of the final read-back phase (CLOCK_MONOTONIC µs): entries
    /// starting at or after it are the read-back, run after quiescence,
    /// so its listing is checked exactly against its Gets. `None`: no
    /// exact check (listings are still checked for the definite cases).
    pub final_phase_start_us: Option<u64>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            max_search_states: 2_000_000,
            final_phase_start_us: None,
        }
    }
}

/// What the checker found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Entries in the history.
    pub operations: usize,
    /// Entries the server answered with their result: ok writes, deletes
    /// and parts, reads with a result, listings.
    pub acknowledged: usize,
    /// Entries whose effect is unknown.
    pub indeterminate: usize,
    /// Entries the server refused.
    pub failed: usize,
    /// Keys put, deleted or read.
    pub keys: usize,
    /// Everything wrong, each with its evidence.
    pub violations: Vec<Violation>,
    /// Keys whose search ran out of budget: neither passed nor failed.
    pub inconclusive_keys: Vec<String>,
}

/// One thing wrong with the history.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// What kind.
    pub kind: ViolationKind,
    /// The key, if it is about one.
    pub key: Option<String>,
    /// What is wrong, in words.
    pub message: String,
    /// The smallest part of the history found that shows it, by start.
    pub entries: Vec<Entry>,
}

/// Kinds of violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ViolationKind {
    /// The bytes read are not the claimed value's (torn multipart, mixed
    /// values, bit rot served), or the value id is unknown, another key's,
    /// or a failed write's.
    CorruptRead,
    /// An acknowledged write that no valid ordering keeps: after it, with
    /// nothing else able to change the key, a read (typically the final
    /// read-back) returns an older value or nothing, and no later read
    /// sees it again.
    LostWrite,
    /// A read returns a value already superseded by a write or delete
    /// that was acknowledged before the read started.
    StaleRead,
    /// A read returns a value an acknowledged delete had removed before
    /// the read started (the value cannot have been written again: ids are
    /// unique).
    ResurrectedDelete,
    /// The key's history is not linearizable as a register, in a way none
    /// of the named patterns shows (or a read that ended before the write
    /// of the value it returned started).
    NotLinearizable,
    /// A listing contains a key that was absent throughout it, or lacks
    /// one that was present throughout it.
    ListingMismatch,
}

impl CheckReport {
    /// No violations and no inconclusive keys.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.inconclusive_keys.is_empty()
    }

    /// Human-readable: the counts, then each violation with its entries as
    /// JSON lines, then the inconclusive keys.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} operations: {} acknowledged, {} indeterminate, {} failed; {} keys",
            self.operations, self.acknowledged, self.indeterminate, self.failed, self.keys
        );
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        let _ = writeln!(
            out,
            "{verdict}: {} violations, {} inconclusive keys",
            self.violations.len(),
            self.inconclusive_keys.len()
        );
        for (i, v) in self.violations.iter().enumerate() {
            let key = v
                .key
                .as_deref()
                .map(|k| format!(" on key {k:?}"))
                .unwrap_or_default();
            let _ = writeln!(out, "\n#{} {:?}{key}: {}", i + 1, v.kind, v.message);
            for e in &v.entries {
                let line = serde_json::to_string(e)
                    .unwrap_or_else(|e| format!("(unserialisable entry: {e})"));
                let _ = writeln!(out, "  {line}");
            }
        }
        if !self.inconclusive_keys.is_empty() {
            let _ = writeln!(
                out,
                "\ninconclusive (search budget exceeded): {}",
                self.inconclusive_keys.join(", ")
            );
        }
        out
    }
}

/// Checks `history` (entries in any order).
pub fn check(history: &[Entry], opts: &CheckOptions) -> CheckReport {
    let mut report = count(history);
    let content = content::check_reads(history);
    report.violations.extend(content.violations);

    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, e) in history.iter().enumerate() {
        if let Op::Put { key, .. } | Op::Delete { key } | Op::Get { key, .. } = &e.op {
            by_key.entry(key).or_default().push(i);
        }
    }
    report.keys = by_key.len();
    for (key, idxs) in &by_key {
        match register::check_key(history, key, idxs, &content.bad_reads, opts) {
            register::KeyVerdict::Linearizable => {}
            register::KeyVerdict::Violations(v) => report.violations.extend(v),
            register::KeyVerdict::Inconclusive => report.inconclusive_keys.push((*key).to_string()),
        }
    }
    report
        .violations
        .extend(listing::check_listings(history, opts));
    report
}

/// The counts of a report with no findings yet.
fn count(history: &[Entry]) -> CheckReport {
    let mut r = CheckReport {
        operations: history.len(),
        acknowledged: 0,
        indeterminate: 0,
        failed: 0,
        keys: 0,
        violations: Vec::new(),
        inconclusive_keys: Vec::new(),
    };
    for e in history {
        match e.outcome {
            Outcome::Ok | Outcome::Read { .. } | Outcome::Listed { .. } => r.acknowledged += 1,
            Outcome::Failed { .. } => r.failed += 1,
            Outcome::Indeterminate { .. } => r.indeterminate += 1,
        }
    }
    r
}

/// Clones of `history[idxs]`, deduplicated, in order of start.
fn evidence(history: &[Entry], idxs: impl IntoIterator<Item = usize>) -> Vec<Entry> {
    let mut seen = HashSet::new();
    let mut out: Vec<Entry> = idxs
        .into_iter()
        .filter(|i| seen.insert(*i))
        .map(|i| history[i].clone())
        .collect();
    out.sort_by_key(|e| (e.start_us, e.end_us, e.id));
    out
}

/// "value 7" or "not found", for messages.
fn describe(state: Option<u64>) -> String {
    match state {
        Some(id) => format!("value {id}"),
        None => "not found".to_string(),
    }
}
