//! Listing check.
//!
//! A listing runs concurrently with writes and, over several pages, is not
//! even atomic; each key's presence is observed at some unknown moment
//! between its start and end. So during the run only definite cases are
//! flagged, each sound for every linearization of the key:
//! - a listed key that is absent throughout the listing: no Put of it that
//!   could have taken effect (ok or indeterminate) started before the
//!   listing ended, or an acknowledged Delete ended before the listing
//!   started and every such Put ended before that Delete started;
//! - a key with the listed prefix that is missing although present
//!   throughout: an acknowledged Put ended before the listing started and
//!   no Delete (ok or indeterminate) could come between that Put and the
//!   listing's end (later Puts keep it present; only Deletes remove it);
//! - a key outside the prefix, or listed twice.
//!
//! The read-back phase runs after the cluster healed and every client
//! stopped, so nothing changes during it: its listings are checked
//! exactly, against the last whole-object Get of each key in that phase
//! (Found must be listed, NotFound must not be).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{CheckOptions, Violation, ViolationKind, evidence};
use crate::history::{Entry, Op, Outcome, ReadResult};

/// Violations reported per key at most.
const MAX_PER_KEY: usize = 5;

/// A Put or Delete that may have taken effect.
#[derive(Debug, Clone, Copy)]
struct Span {
    entry: usize,
    start: u64,
    /// `u64::MAX` if indeterminate.
    end: u64,
    acked: bool,
}

#[derive(Debug, Default)]
struct KeyWrites {
    puts: Vec<Span>,
    deletes: Vec<Span>,
}

/// Checks every listing of the history.
pub(super) fn check_listings(history: &[Entry], opts: &CheckOptions) -> Vec<Violation> {
    let writes = key_writes(history);
    let final_reads = opts
        .final_phase_start_us
        .map(|t| final_reads(history, t))
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for (li, e) in history.iter().enumerate() {
        let (Op::List { prefix }, Outcome::Listed { keys }) = (&e.op, &e.outcome) else {
            continue;
        };
        let mut flagged: HashSet<String> = HashSet::new();
        let mut flag = |key: &str, message: String, mut idxs: Vec<usize>| {
            let n = per_key.entry(key.to_string()).or_default();
            if *n >= MAX_PER_KEY || !flagged.insert(key.to_string()) {
                return;
            }
            *n += 1;
            idxs.push(li);
            out.push(Violation {
                kind: ViolationKind::ListingMismatch,
                key: Some(key.to_string()),
                message: format!("listing #{} of prefix {prefix:?}: {message}", e.id),
                entries: evidence(history, idxs),
            });
        };
        let mut listed: HashSet<&str> = HashSet::new();
        for k in keys {
            if !listed.insert(k) {
                flag(k, format!("{k:?} is listed twice"), vec![]);
            } else if !k.starts_with(prefix.as_str()) {
                flag(k, format!("{k:?} does not start with the prefix"), vec![]);
            } else if let Some((why, idxs)) = definitely_absent(writes.get(k.as_str()), e) {
                flag(
                    k,
                    format!("lists {k:?}, which was absent throughout: {why}"),
                    idxs,
                );
            }
        }
        let under_prefix = writes
            .range(prefix.as_str()..)
            .take_while(|(k, _)| k.starts_with(prefix.as_str()));
        for (k, w) in under_prefix {
            if !listed.contains(k)
                && let Some((why, idxs)) = definitely_present(w, e)
            {
                flag(
                    k,
                    format!("lacks {k:?}, which was present throughout: {why}"),
                    idxs,
                );
            }
        }
        if opts.final_phase_start_us.is_some_and(|t| e.start_us >= t) {
            for (k, &(r, found)) in &final_reads {
                if !k.starts_with(prefix.as_str()) || found == listed.contains(k.as_str()) {
                    continue;
                }
                let why = if found {
                    format!("lacks {k:?}, which the read-back Get found")
                } else {
                    format!("lists {k:?}, which the read-back Get did not find")
                };
                flag(k, why, vec![r]);
            }
        }
    }
    out
}

/// Puts and Deletes that may have taken effect, per key.
fn key_writes(history: &[Entry]) -> BTreeMap<&str, KeyWrites> {
    let mut out: BTreeMap<&str, KeyWrites> = BTreeMap::new();
    for (i, e) in history.iter().enumerate() {
        if matches!(e.outcome, Outcome::Failed { .. }) {
            continue;
        }
        let acked = e.outcome == Outcome::Ok;
        let span = Span {
            entry: i,
            start: e.start_us,
            end: if acked {
                e.end_us.max(e.start_us)
            } else {
                u64::MAX
            },
            acked,
        };
        match &e.op {
            Op::Put { key, .. } => out.entry(key).or_default().puts.push(span),
            Op::Delete { key } => out.entry(key).or_default().deletes.push(span),
            _ => {}
        }
    }
    out
}

/// The last whole-object Get of each key starting at or after `t`:
/// (its history index, whether it found the object).
fn final_reads(history: &[Entry], t: u64) -> BTreeMap<String, (usize, bool)> {
    let mut out: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    for (i, e) in history.iter().enumerate() {
        let (Op::Get { key, range: None }, Outcome::Read { result }) = (&e.op, &e.outcome) else {
            continue;
        };
        if e.start_us < t {
            continue;
        }
        let found = matches!(result, ReadResult::Found { .. });
        let later = out
            .get(key)
            .is_none_or(|&(j, _)| history[j].start_us <= e.start_us);
        if later {
            out.insert(key.clone(), (i, found));
        }
    }
    out
}

/// Why `list`'s key with `writes` is absent during all of it, if it is.
fn definitely_absent(writes: Option<&KeyWrites>, list: &Entry) -> Option<(String, Vec<usize>)> {
    let puts: Vec<&Span> = writes
        .map(|w| w.puts.iter().filter(|p| p.start <= list.end_us).collect())
        .unwrap_or_default();
    let Some(last_put) = puts.iter().max_by_key(|p| p.end) else {
        return Some((
            "no Put of it that could take effect started before the listing ended".to_string(),
            vec![],
        ));
    };
    let delete = writes?
        .deletes
        .iter()
        .filter(|d| d.acked && d.end < list.start_us)
        .max_by_key(|d| d.start)?;
    (last_put.end < delete.start).then(|| {
        let why = format!(
            "a Delete was acknowledged at {} µs, before the listing started, and every Put of it that could take \
             effect ended before that Delete started",
            delete.end
        );
        (why, vec![last_put.entry, delete.entry])
    })
}

/// Why `list`'s missing key with `writes` is present during all of it, if
/// it is.
fn definitely_present(writes: &KeyWrites, list: &Entry) -> Option<(String, Vec<usize>)> {
    let put = writes
        .puts
        .iter()
        .filter(|p| p.acked && p.end < list.start_us)
        .max_by_key(|p| p.start)?;
    let deletable = writes
        .deletes
        .iter()
        .any(|d| d.end >= put.start && d.start <= list.end_us);
    (!deletable).then(|| {
        let why = format!(
            "a Put was acknowledged at {} µs, before the listing started, and no Delete could come between it and \
             the listing's end",
            put.end
        );
        (why, vec![put.entry])
    })
}
