//! Per-key linearizability of a register whose state is "absent" or one
//! value id.
//!
//! # The model
//! A Put of value `v` sets the state to `v`, a Delete sets it to absent,
//! a Get (whole or ranged) returns the state: NotFound for absent, Found
//! with the value id otherwise. The initial state is absent.
//!
//! # Which operations take part
//! Failed writes are dropped (they did not happen). Indeterminate or
//! failed reads are dropped (they observed nothing). Indeterminate writes
//! may take effect at any time after their start, or never: their end is
//! infinity, and a linearization may leave them out. Reads whose value id
//! the content check rejected are left out (already reported).
//!
//! An indeterminate Put whose value no read observes is dropped too.
//! Argument: value ids are unique, so in any linearization that contains
//! such a Put `p`, no read sits between `p` and the next write (such a read
//! would observe `p`'s value); removing `p` leaves every read seeing the
//! same state, and `p` has no response to order anything. So a
//! linearization without `p` exists whenever one with it does, and the
//! converse holds trivially (indeterminate operations may be left out).
//!
//! # The search
//! Wing & Gong's depth-first search over linearization orders, with
//! Lowe's memo of visited (linearized set, state) configurations: an
//! operation may be linearized next iff it starts no later than the
//! earliest end of the operations not yet linearized (intervals that
//! touch are concurrent). The linearized set is stored as "everything
//! before the first unlinearized acknowledged operation, in start order"
//! plus a bitmap of the window after it, plus a bitmap of the
//! indeterminate writes. Reductions, each preserving the existence of a
//! linearization:
//! - a read that may go next and matches the state is taken at once with
//!   no alternative (moving a read earlier, to a point where it is
//!   minimal and sees the same state, keeps a linearization valid);
//! - a value with reads still to come is never overwritten (ids are
//!   unique, it could not come back);
//! - a value with no reads left is "dead": all dead values are one state
//!   for the memo (no future operation tells them apart);
//! - an indeterminate Delete is never linearized when the key is already
//!   absent (a no-op a linearization can drop), and of the indeterminate
//!   Deletes that may go next only the earliest is tried (they are
//!   interchangeable).
//!
//! # Classification
//! Before searching, each read is compared with the acknowledged writes
//! that ended before it started: if none of the writes that could sit
//! between that write and the read produces what the read saw, the read
//! is a definite violation, named by the write it contradicts (see
//! [`ViolationKind`]); so is a read that ended before the write of the
//! value it returned started. Only keys with no such pattern are searched, and a
//! key the search rejects is shrunk to a small failing sub-history.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::{CheckOptions, Violation, ViolationKind, describe, evidence};
use crate::history::{Entry, Op, Outcome, ReadResult};

/// End of an operation that may take effect at any later time.
const OPEN: u64 = u64::MAX;

/// Findings reported per key at most (the rest are counted).
const MAX_FINDINGS_PER_KEY: usize = 10;

/// Time spent shrinking one key's failure at most (then the smallest
/// failing history found so far is reported).
const SHRINK_TIME: Duration = Duration::from_secs(10);

/// Shrinking attempts per key at most.
const SHRINK_TRIALS: usize = 200;

/// What one operation does to the register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Sets the state (`None`: a Delete).
    Write(Option<u64>),
    /// Observes the state.
    Read(Option<u64>),
}

/// One operation of a key's register history.
#[derive(Debug, Clone, Copy)]
pub(super) struct RegOp {
    /// Index of its entry in the history.
    pub entry: usize,
    /// What it does.
    pub kind: Kind,
    /// Start, µs.
    pub start: u64,
    /// End, µs, or [`OPEN`].
    pub end: u64,
}

impl RegOp {
    fn is_open(&self) -> bool {
        self.end == OPEN
    }

    /// `self` ended before `other` started: real-time order.
    fn precedes(&self, other: &RegOp) -> bool {
        self.end < other.start
    }
}

/// The verdict on one key.
pub(super) enum KeyVerdict {
    Linearizable,
    Violations(Vec<Violation>),
    Inconclusive,
}

/// Checks one key: `idxs` are its entries, `bad_reads` the reads the
/// content check rejected.
pub(super) fn check_key(
    history: &[Entry],
    key: &str,
    idxs: &[usize],
    bad_reads: &HashSet<usize>,
    opts: &CheckOptions,
) -> KeyVerdict {
    let ops = register_ops(history, idxs, bad_reads);
    let (findings, total) = find_patterns(&ops);
    if !findings.is_empty() {
        return KeyVerdict::Violations(pattern_violations(history, key, &ops, &findings, total));
    }
    match search(&ops, opts.max_search_states) {
        Search::Linearizable => KeyVerdict::Linearizable,
        Search::Inconclusive => KeyVerdict::Inconclusive,
        Search::NotLinearizable => {
            let small = shrink(ops.clone(), opts.max_search_states);
            let message = format!(
                "no order of these {} operations (of {} on the key) is a valid register history; \
                 they are the smallest failing part found",
                small.len(),
                ops.len()
            );
            let entries = evidence(history, small.iter().map(|o| o.entry));
            KeyVerdict::Violations(vec![Violation {
                kind: ViolationKind::NotLinearizable,
                key: Some(key.to_string()),
                message,
                entries,
            }])
        }
    }
}

/// The register operations of entries `idxs` (see the module docs for
/// which take part).
pub(super) fn register_ops(
    history: &[Entry],
    idxs: &[usize],
    bad_reads: &HashSet<usize>,
) -> Vec<RegOp> {
    let read_result = |i: usize| -> Option<Option<u64>> {
        let e = &history[i];
        match (&e.op, &e.outcome) {
            (Op::Get { .. }, Outcome::Read { result }) if !bad_reads.contains(&i) => match result {
                ReadResult::NotFound => Some(None),
                ReadResult::Found {
                    value_id: Some(id), ..
                } => Some(Some(*id)),
                ReadResult::Found { value_id: None, .. } => None,
            },
            _ => None,
        }
    };
    let observed: HashSet<u64> = idxs
        .iter()
        .filter_map(|&i| read_result(i).flatten())
        .collect();
    let mut ops = Vec::new();
    for &i in idxs {
        let e = &history[i];
        let closed = e.end_us.max(e.start_us);
        let (kind, end) = match (&e.op, &e.outcome) {
            (_, Outcome::Failed { .. }) => continue,
            (Op::Put { value, .. }, Outcome::Ok) => (Kind::Write(Some(value.id)), closed),
            // Indeterminate (or an outcome a write cannot have: treated as
            // unknown, which can only hide violations, never invent them).
            (Op::Put { value, .. }, _) if observed.contains(&value.id) => {
                (Kind::Write(Some(value.id)), OPEN)
            }
            (Op::Put { .. }, _) => continue,
            (Op::Delete { .. }, Outcome::Ok) => (Kind::Write(None), closed),
            (Op::Delete { .. }, _) => (Kind::Write(None), OPEN),
            (Op::Get { .. }, _) => match read_result(i) {
                Some(x) => (Kind::Read(x), closed),
                None => continue,
            },
            _ => continue,
        };
        ops.push(RegOp {
            entry: i,
            kind,
            start: e.start_us,
            end,
        });
    }
    ops
}

// ---------------------------------------------------------------------
// Patterns
// ---------------------------------------------------------------------

/// A read contradicted by an acknowledged write that ended before it.
#[derive(Debug, Clone, Copy)]
struct Finding {
    kind: ViolationKind,
    /// The read (index into the ops).
    read: usize,
    /// The write or delete it contradicts.
    against: usize,
    /// The write of the value the read returned, if any.
    writer: Option<usize>,
}

/// Every read that an acknowledged write ending before it contradicts:
/// no operation that could be linearized between that write and the read
/// produces what the read returned. Sound on its own: in any
/// linearization the write precedes the read, and the state the read sees
/// is set by the write or by something linearized after it. Returns the
/// first [`MAX_FINDINGS_PER_KEY`] findings and how many there are.
fn find_patterns(ops: &[RegOp]) -> (Vec<Finding>, usize) {
    let writer: HashMap<u64, usize> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o.kind {
            Kind::Write(Some(v)) => Some((v, i)),
            _ => None,
        })
        .collect();
    let mut by_end: Vec<usize> = (0..ops.len())
        .filter(|&i| matches!(ops[i].kind, Kind::Write(_)) && !ops[i].is_open())
        .collect();
    by_end.sort_by_key(|&w| (ops[w].end, ops[w].start));
    // Deletes by start, with the running latest end: the latest end of
    // the Deletes that could be linearized before a given time.
    let mut deletes: Vec<&RegOp> = ops.iter().filter(|o| o.kind == Kind::Write(None)).collect();
    deletes.sort_by_key(|d| d.start);
    let latest_end: Vec<u64> = deletes
        .iter()
        .scan(0, |m, d| {
            *m = d.end.max(*m);
            Some(*m)
        })
        .collect();
    let mut found = Vec::new();
    let mut total = 0;
    for (r, read) in ops.iter().enumerate() {
        let Kind::Read(seen) = read.kind else {
            continue;
        };
        // Writes that produce `seen` and could be linearized between an
        // acknowledged write and the read all end by `floor`: only writes
        // that start after it contradict the read. For a value, that is
        // its (unique) write; for "absent", every Delete that could come
        // before the read ends.
        let floor = match seen {
            Some(v) => match writer.get(&v) {
                Some(&wv) if read.precedes(&ops[wv]) => {
                    // A value read before its write began.
                    total += 1;
                    if found.len() < MAX_FINDINGS_PER_KEY {
                        let kind = ViolationKind::NotLinearizable;
                        found.push(Finding {
                            kind,
                            read: r,
                            against: wv,
                            writer: Some(wv),
                        });
                    }
                    continue;
                }
                Some(&wv) if !ops[wv].is_open() => Some(ops[wv].end),
                _ => continue,
            },
            None => deletes
                .partition_point(|d| d.start <= read.end)
                .checked_sub(1)
                .map(|k| latest_end[k]),
        };
        let preceding = &by_end[..by_end.partition_point(|&w| ops[w].end < read.start)];
        let against = preceding
            .iter()
            .rev()
            .take_while(|&&w| floor.is_none_or(|f| ops[w].end > f))
            .find(|&&w| ops[w].kind != Kind::Write(seen) && floor.is_none_or(|f| ops[w].start > f));
        let Some(&w) = against else { continue };
        total += 1;
        if found.len() == MAX_FINDINGS_PER_KEY {
            continue;
        }
        let kind = match ops[w].kind {
            Kind::Write(None) => ViolationKind::ResurrectedDelete,
            Kind::Write(Some(v)) => classify_superseded(ops, w, v, r),
            Kind::Read(_) => unreachable!("by_end holds writes"),
        };
        found.push(Finding {
            kind,
            read: r,
            against: w,
            writer: seen.and_then(|v| writer.get(&v).copied()),
        });
    }
    (found, total)
}

/// A read `r` missed acknowledged Put `w` of `v`: a lost write if nothing
/// else could ever have replaced `v` after `w` and no read after `r` sees
/// `v` again; otherwise a stale read.
fn classify_superseded(ops: &[RegOp], w: usize, v: u64, r: usize) -> ViolationKind {
    let write = &ops[w];
    let replaceable = ops
        .iter()
        .enumerate()
        .any(|(u, op)| u != w && matches!(op.kind, Kind::Write(_)) && !op.precedes(write));
    let seen_again = ops
        .iter()
        .any(|op| op.kind == Kind::Read(Some(v)) && ops[r].precedes(op));
    if replaceable || seen_again {
        ViolationKind::StaleRead
    } else {
        ViolationKind::LostWrite
    }
}

fn pattern_violations(
    history: &[Entry],
    key: &str,
    ops: &[RegOp],
    findings: &[Finding],
    total: usize,
) -> Vec<Violation> {
    let mut out: Vec<Violation> = findings
        .iter()
        .map(|f| {
            let (read, against) = (&ops[f.read], &ops[f.against]);
            let (re, we) = (&history[read.entry], &history[against.entry]);
            let Kind::Read(seen) = read.kind else { unreachable!("a finding's read is a read") };
            let what = match against.kind {
                Kind::Write(None) => format!("Delete #{}", we.id),
                Kind::Write(Some(v)) => format!("Put #{} of value {v}", we.id),
                Kind::Read(_) => unreachable!("a finding's write is a write"),
            };
            let message = match f.kind {
                ViolationKind::LostWrite => format!(
                    "read #{} returned {} but {what}, acknowledged at {} µs before the read started at {} µs, \
                     is the last write of the key and no later read sees it: the write was lost",
                    re.id,
                    describe(seen),
                    we.end_us,
                    re.start_us
                ),
                ViolationKind::ResurrectedDelete => format!(
                    "read #{} returned {} after {what} was acknowledged at {} µs, before the read started at {} µs, \
                     and that value's write could not come after the delete",
                    re.id,
                    describe(seen),
                    we.end_us,
                    re.start_us
                ),
                ViolationKind::NotLinearizable => format!(
                    "read #{} returned {} but ended at {} µs, before {what} started at {} µs",
                    re.id,
                    describe(seen),
                    re.end_us,
                    we.start_us
                ),
                _ => format!(
                    "read #{} returned {}, already superseded by {what}, acknowledged at {} µs before the read \
                     started at {} µs, with no write in between that could produce it",
                    re.id,
                    describe(seen),
                    we.end_us,
                    re.start_us
                ),
            };
            let idxs = [Some(read.entry), Some(against.entry), f.writer.map(|w| ops[w].entry)];
            Violation {
                kind: f.kind,
                key: Some(key.to_string()),
                message,
                entries: evidence(history, idxs.into_iter().flatten()),
            }
        })
        .collect();
    if total > findings.len()
        && let Some(last) = out.last_mut()
    {
        let more = total - findings.len();
        last.message.push_str(&format!(
            " ({more} more reads of this key are contradicted likewise, not shown)"
        ));
    }
    out
}

// ---------------------------------------------------------------------
// Search
// ---------------------------------------------------------------------

/// Outcome of a linearizability search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Search {
    Linearizable,
    NotLinearizable,
    /// The budget of explored states ran out.
    Inconclusive,
}

/// Searches for a linearization of `ops`, exploring at most `budget`
/// distinct configurations.
pub(super) fn search(ops: &[RegOp], budget: usize) -> Search {
    Searcher::new(ops).run(budget)
}

/// State (or written value) as a dense number: 0 is absent.
type Val = u32;
/// Memo key for every value with no reads left.
const DEAD: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
enum SKind {
    Write(Val),
    Read(Val),
}

#[derive(Debug, Clone, Copy)]
struct SOp {
    kind: SKind,
    start: u64,
    end: u64,
}

/// One level of the depth-first search.
struct Frame {
    /// The operation linearized to get here (none at the root).
    op: Option<usize>,
    prev_state: Val,
    prev_lo: usize,
    cands: Vec<usize>,
    next: usize,
}

struct Searcher {
    /// Acknowledged operations by (start, end), then the open ones by start.
    ops: Vec<SOp>,
    /// Number of acknowledged (closed) operations.
    nd: usize,
    /// Linearized flags of the closed operations.
    det: Vec<u64>,
    /// Linearized flags of the open operations.
    ind: Vec<u64>,
    /// Closed operations linearized.
    done: usize,
    /// First closed operation not linearized.
    lo: usize,
    state: Val,
    /// Reads not yet linearized, per value.
    reads_left: Vec<u32>,
}

fn bit(words: &[u64], i: usize) -> bool {
    words[i / 64] >> (i % 64) & 1 == 1
}

fn flip(words: &mut [u64], i: usize) {
    words[i / 64] ^= 1 << (i % 64);
}

impl Searcher {
    fn new(ops: &[RegOp]) -> Self {
        let mut dense: HashMap<Option<u64>, Val> = HashMap::from([(None, 0)]);
        let mut val = |v: Option<u64>| {
            let n = dense.len() as Val;
            *dense.entry(v).or_insert(n)
        };
        let mut closed: Vec<&RegOp> = ops.iter().filter(|o| !o.is_open()).collect();
        closed.sort_by_key(|o| (o.start, o.end));
        let mut open: Vec<&RegOp> = ops.iter().filter(|o| o.is_open()).collect();
        open.sort_by_key(|o| o.start);
        let sops: Vec<SOp> = closed
            .iter()
            .chain(open.iter())
            .map(|o| SOp {
                kind: match o.kind {
                    Kind::Write(v) => SKind::Write(val(v)),
                    Kind::Read(v) => SKind::Read(val(v)),
                },
                start: o.start,
                end: o.end,
            })
            .collect();
        let mut reads_left = vec![0u32; dense.len()];
        for o in &sops {
            if let SKind::Read(v) = o.kind {
                reads_left[v as usize] += 1;
            }
        }
        let nd = closed.len();
        Self {
            det: vec![0; nd.div_ceil(64)],
            ind: vec![0; (sops.len() - nd).div_ceil(64)],
            ops: sops,
            nd,
            done: 0,
            lo: 0,
            state: 0,
            reads_left,
        }
    }

    fn is_lin(&self, i: usize) -> bool {
        if i < self.nd {
            bit(&self.det, i)
        } else {
            bit(&self.ind, i - self.nd)
        }
    }

    fn run(mut self, budget: usize) -> Search {
        if self.done == self.nd {
            return Search::Linearizable;
        }
        let mut memo: HashSet<Box<[u64]>> = HashSet::new();
        memo.insert(self.memo_key());
        let root = Frame {
            op: None,
            prev_state: 0,
            prev_lo: 0,
            cands: self.candidates(),
            next: 0,
        };
        let mut stack = vec![root];
        while let Some(top) = stack.last_mut() {
            if top.next == top.cands.len() {
                let f = stack.pop().expect("non-empty");
                if let Some(op) = f.op {
                    self.undo(op, f.prev_state, f.prev_lo);
                }
                continue;
            }
            let i = top.cands[top.next];
            top.next += 1;
            let (prev_state, prev_lo) = (self.state, self.lo);
            self.apply(i);
            if self.done == self.nd {
                return Search::Linearizable;
            }
            if !memo.insert(self.memo_key()) {
                self.undo(i, prev_state, prev_lo);
                continue;
            }
            if memo.len() > budget {
                return Search::Inconclusive;
            }
            let cands = self.candidates();
            stack.push(Frame {
                op: Some(i),
                prev_state,
                prev_lo,
                cands,
                next: 0,
            });
        }
        Search::NotLinearizable
    }

    fn apply(&mut self, i: usize) {
        if i < self.nd {
            flip(&mut self.det, i);
            self.done += 1;
            while self.lo < self.nd && bit(&self.det, self.lo) {
                self.lo += 1;
            }
        } else {
            flip(&mut self.ind, i - self.nd);
        }
        match self.ops[i].kind {
            SKind::Write(v) => self.state = v,
            SKind::Read(v) => self.reads_left[v as usize] -= 1,
        }
    }

    fn undo(&mut self, i: usize, prev_state: Val, prev_lo: usize) {
        if i < self.nd {
            flip(&mut self.det, i);
            self.done -= 1;
        } else {
            flip(&mut self.ind, i - self.nd);
        }
        self.lo = prev_lo;
        match self.ops[i].kind {
            SKind::Write(_) => self.state = prev_state,
            SKind::Read(v) => self.reads_left[v as usize] += 1,
        }
    }

    /// The operations to try next from this configuration.
    fn candidates(&self) -> Vec<usize> {
        // Earliest end among the closed operations not linearized; an
        // operation may go next iff it starts no later.
        let mut min_end = OPEN;
        let mut j = self.lo;
        while j < self.nd && self.ops[j].start <= min_end {
            if !self.is_lin(j) {
                min_end = min_end.min(self.ops[j].end);
            }
            j += 1;
        }
        let closed = (self.lo..j).filter(|&i| !self.is_lin(i) && self.ops[i].start <= min_end);
        let open = (self.nd..self.ops.len())
            .take_while(|&i| self.ops[i].start <= min_end)
            .filter(|&i| !self.is_lin(i));
        let eligible: Vec<usize> = closed.chain(open).collect();
        if let Some(&r) = eligible
            .iter()
            .find(|&&i| matches!(self.ops[i].kind, SKind::Read(v) if v == self.state))
        {
            return vec![r];
        }
        if self.state != 0 && self.reads_left[self.state as usize] > 0 {
            // The current value still has reads to come: nothing may
            // overwrite it, and none of its reads can go now.
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut open_delete_tried = false;
        for i in eligible {
            match self.ops[i].kind {
                SKind::Read(_) => {}
                SKind::Write(0) if i >= self.nd => {
                    if self.state != 0 && !open_delete_tried {
                        open_delete_tried = true;
                        out.push(i);
                    }
                }
                SKind::Write(_) => out.push(i),
            }
        }
        out
    }

    /// (first unlinearized closed op, state, window bitmap, open bitmap).
    /// Closed operations linearized past `lo` started no later than
    /// `lo`'s end (they went while `lo` was pending), so the window ends
    /// at the first closed operation starting after it.
    fn memo_key(&self) -> Box<[u64]> {
        let state = if self.state != 0 && self.reads_left[self.state as usize] == 0 {
            DEAD
        } else {
            self.state as u64
        };
        let (w0, w1) = if self.lo < self.nd {
            let lo_end = self.ops[self.lo].end;
            let hi = self.lo + self.ops[self.lo..self.nd].partition_point(|o| o.start <= lo_end);
            (self.lo / 64, hi.div_ceil(64))
        } else {
            (0, 0)
        };
        let mut key = Vec::with_capacity(2 + (w1 - w0) + self.ind.len());
        key.push(self.lo as u64);
        key.push(state);
        key.extend_from_slice(&self.det[w0..w1]);
        key.extend_from_slice(&self.ind);
        key.into_boxed_slice()
    }
}

// ---------------------------------------------------------------------
// Shrinking
// ---------------------------------------------------------------------

/// A small sub-history of `ops` (which fails) that still fails, within
/// [`SHRINK_TRIALS`] searches and [`SHRINK_TIME`]: first the
/// shortest failing prefix in time, then removal of whole values (a write
/// with all its reads), single reads, and Deletes once no read of "absent"
/// is left. Each removal is one that cannot turn a linearizable history
/// into a failing one, so what remains fails for the original reason.
fn shrink(ops: Vec<RegOp>, budget: usize) -> Vec<RegOp> {
    let deadline = Instant::now() + SHRINK_TIME;
    let mut trials = 0;
    let mut fails = |o: &[RegOp]| {
        trials += 1;
        trials <= SHRINK_TRIALS
            && Instant::now() < deadline
            && search(o, budget) == Search::NotLinearizable
    };
    let ops = shortest_failing_prefix(ops, &mut fails);
    let ops = remove_units(ops, value_units, &mut fails);
    let ops = remove_units(ops, read_units, &mut fails);
    remove_units(ops, delete_units, &mut fails)
}

/// The history as it stood at `t`: operations started before it; those
/// still running become indeterminate writes or, for reads, are dropped.
fn prefix_at(ops: &[RegOp], t: u64) -> Vec<RegOp> {
    ops.iter()
        .filter(|o| o.start < t)
        .filter_map(|o| match (o.end >= t, o.kind) {
            (false, _) => Some(*o),
            (true, Kind::Read(_)) => None,
            (true, Kind::Write(_)) => Some(RegOp { end: OPEN, ..*o }),
        })
        .collect()
}

fn shortest_failing_prefix(
    ops: Vec<RegOp>,
    fails: &mut impl FnMut(&[RegOp]) -> bool,
) -> Vec<RegOp> {
    let mut starts: Vec<u64> = ops.iter().map(|o| o.start).collect();
    starts.sort_unstable();
    starts.dedup();
    // Cut points: just after each start. The last one keeps everything.
    let cut = |k: usize| {
        if k + 1 < starts.len() {
            starts[k + 1]
        } else {
            OPEN
        }
    };
    let (mut lo, mut hi) = (0, starts.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(&prefix_at(&ops, cut(mid))) {
            hi = mid
        } else {
            lo = mid + 1
        }
    }
    if cut(hi) == OPEN {
        ops
    } else {
        prefix_at(&ops, cut(hi))
    }
}

/// Removes chunks of units (halving the chunk size) while the rest fails.
fn remove_units(
    mut ops: Vec<RegOp>,
    units_of: fn(&[RegOp]) -> Vec<Vec<usize>>,
    fails: &mut impl FnMut(&[RegOp]) -> bool,
) -> Vec<RegOp> {
    let mut units = units_of(&ops);
    let mut chunk = units.len().div_ceil(2).max(1);
    loop {
        let mut removed = false;
        let mut i = 0;
        while i < units.len() {
            let end = (i + chunk).min(units.len());
            let drop: HashSet<usize> = units[i..end].iter().flatten().copied().collect();
            let rest: Vec<RegOp> = ops
                .iter()
                .enumerate()
                .filter(|(j, _)| !drop.contains(j))
                .map(|(_, o)| *o)
                .collect();
            if !rest.is_empty() && fails(&rest) {
                ops = rest;
                units = units_of(&ops);
                removed = true;
            } else {
                i = end;
            }
        }
        if chunk == 1 && !removed {
            return ops;
        }
        chunk = (chunk / 2).max(1);
    }
}

/// Each written value with all its reads (a write nobody read alone).
fn value_units(ops: &[RegOp]) -> Vec<Vec<usize>> {
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut of_value: HashMap<u64, usize> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        if let Kind::Write(Some(v)) = o.kind {
            of_value.insert(v, units.len());
            units.push(vec![i]);
        }
    }
    for (i, o) in ops.iter().enumerate() {
        if let Kind::Read(Some(v)) = o.kind
            && let Some(&u) = of_value.get(&v)
        {
            units[u].push(i);
        }
    }
    units
}

/// Each read alone.
fn read_units(ops: &[RegOp]) -> Vec<Vec<usize>> {
    (0..ops.len())
        .filter(|&i| matches!(ops[i].kind, Kind::Read(_)))
        .map(|i| vec![i])
        .collect()
}

/// Each Delete alone, if no read of "absent" is left (else none).
fn delete_units(ops: &[RegOp]) -> Vec<Vec<usize>> {
    if ops.iter().any(|o| o.kind == Kind::Read(None)) {
        return Vec::new();
    }
    (0..ops.len())
        .filter(|&i| ops[i].kind == Kind::Write(None))
        .map(|i| vec![i])
        .collect()
}
