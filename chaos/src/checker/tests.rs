use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::history::{ByteRange, Part, ReadResult, Value, content_hash};

fn value(id: u64) -> Value {
    Value {
        id,
        parts: vec![Part {
            seed: id * 7 + 1,
            len: 24,
        }],
    }
}

fn two_parts(id: u64) -> Value {
    Value {
        id,
        parts: vec![
            Part {
                seed: id * 7 + 1,
                len: 32,
            },
            Part {
                seed: id * 7 + 2,
                len: 20,
            },
        ],
    }
}

fn found(v: &Value, range: Option<ByteRange>) -> ReadResult {
    let b = v.range_bytes(range);
    ReadResult::Found {
        value_id: Some(v.id),
        len: b.len() as u64,
        hash: content_hash(&b),
    }
}

fn ok() -> Outcome {
    Outcome::Ok
}

fn indet() -> Outcome {
    Outcome::Indeterminate {
        reason: "timeout".into(),
    }
}

fn failed() -> Outcome {
    Outcome::Failed {
        code: "InternalError".into(),
    }
}

/// A history under construction; values are `value(id)` unless given.
#[derive(Default)]
struct H {
    entries: Vec<Entry>,
}

impl H {
    fn push(&mut self, client: u32, start: u64, end: u64, op: Op, outcome: Outcome) -> &mut Self {
        let id = self.entries.len() as u64;
        self.entries.push(Entry {
            id,
            client,
            start_us: start,
            end_us: end,
            op,
            outcome,
        });
        self
    }

    fn put(
        &mut self,
        c: u32,
        key: &str,
        id: u64,
        start: u64,
        end: u64,
        outcome: Outcome,
    ) -> &mut Self {
        self.put_value(c, key, value(id), start, end, outcome)
    }

    fn put_value(
        &mut self,
        c: u32,
        key: &str,
        value: Value,
        start: u64,
        end: u64,
        outcome: Outcome,
    ) -> &mut Self {
        let multipart = value.parts.len() > 1;
        self.push(
            c,
            start,
            end,
            Op::Put {
                key: key.into(),
                value,
                multipart,
            },
            outcome,
        )
    }

    fn delete(&mut self, c: u32, key: &str, start: u64, end: u64, outcome: Outcome) -> &mut Self {
        self.push(c, start, end, Op::Delete { key: key.into() }, outcome)
    }

    /// A whole-object Get that saw `value(id)` or nothing.
    fn get(&mut self, c: u32, key: &str, start: u64, end: u64, seen: Option<u64>) -> &mut Self {
        let result = seen.map_or(ReadResult::NotFound, |id| found(&value(id), None));
        self.get_raw(c, key, None, start, end, result)
    }

    fn get_raw(
        &mut self,
        c: u32,
        key: &str,
        range: Option<ByteRange>,
        start: u64,
        end: u64,
        result: ReadResult,
    ) -> &mut Self {
        self.push(
            c,
            start,
            end,
            Op::Get {
                key: key.into(),
                range,
            },
            Outcome::Read { result },
        )
    }

    fn list(&mut self, c: u32, prefix: &str, start: u64, end: u64, keys: &[&str]) -> &mut Self {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        self.push(
            c,
            start,
            end,
            Op::List {
                prefix: prefix.into(),
            },
            Outcome::Listed { keys },
        )
    }

    fn check(&self) -> CheckReport {
        check(&self.entries, &CheckOptions::default())
    }
}

fn kinds(r: &CheckReport) -> Vec<ViolationKind> {
    r.violations.iter().map(|v| v.kind).collect()
}

#[track_caller]
fn assert_passes(h: &H) {
    let r = h.check();
    assert!(r.passed(), "expected a pass:\n{}", r.render());
}

/// Exactly one violation, of `kind`; returned for more checks.
#[track_caller]
fn assert_one(h: &H, kind: ViolationKind) -> Violation {
    assert_one_with(h, kind, &CheckOptions::default())
}

#[track_caller]
fn assert_one_with(h: &H, kind: ViolationKind, opts: &CheckOptions) -> Violation {
    let r = check(&h.entries, opts);
    assert_eq!(kinds(&r), vec![kind], "\n{}", r.render());
    assert!(r.inconclusive_keys.is_empty(), "\n{}", r.render());
    assert!(!r.passed());
    r.violations[0].clone()
}

fn entry_ids(v: &Violation) -> Vec<u64> {
    v.entries.iter().map(|e| e.id).collect()
}

// ---------------------------------------------------------------------
// Histories that must be caught
// ---------------------------------------------------------------------

#[test]
fn lost_write_final_read_not_found() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok()).get(2, "k", 100, 110, None);
    let v = assert_one(&h, ViolationKind::LostWrite);
    assert_eq!(v.key.as_deref(), Some("k"));
    assert_eq!(entry_ids(&v), vec![0, 1]);
}

#[test]
fn lost_write_final_read_older_value() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .put(1, "k", 2, 20, 30, ok())
        .get(3, "k", 40, 45, Some(2))
        .get(2, "k", 100, 110, Some(1));
    let v = assert_one(&h, ViolationKind::LostWrite);
    assert_eq!(
        entry_ids(&v),
        vec![0, 1, 3],
        "the older write, the lost one, the read"
    );
}

#[test]
fn stale_read_superseded_by_an_acknowledged_write() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .put(1, "k", 2, 20, 30, ok())
        .get(2, "k", 40, 50, Some(1))
        .put(1, "k", 3, 60, 70, ok())
        .get(2, "k", 80, 90, Some(3));
    let v = assert_one(&h, ViolationKind::StaleRead);
    assert_eq!(entry_ids(&v), vec![0, 1, 2]);
}

#[test]
fn stale_read_when_the_newer_value_is_seen_again_later() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .put(1, "k", 2, 20, 30, ok())
        .get(2, "k", 40, 50, Some(1))
        .get(2, "k", 60, 70, Some(2));
    assert_one(&h, ViolationKind::StaleRead);
}

#[test]
fn stale_not_found_after_a_put_that_followed_a_delete() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .delete(1, "k", 20, 30, ok())
        .put(1, "k", 2, 40, 50, ok())
        .get(2, "k", 60, 70, None)
        .delete(1, "k", 80, 90, ok());
    let v = assert_one(&h, ViolationKind::StaleRead);
    assert_eq!(entry_ids(&v), vec![2, 3]);
}

#[test]
fn resurrected_delete() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .delete(2, "k", 20, 30, ok())
        .get(3, "k", 40, 50, Some(1));
    let v = assert_one(&h, ViolationKind::ResurrectedDelete);
    assert_eq!(entry_ids(&v), vec![0, 1, 2]);
}

#[test]
fn torn_multipart_object_mixing_two_values() {
    let (a, b) = (two_parts(1), two_parts(2));
    let mut torn = a.bytes()[..32].to_vec();
    torn.extend_from_slice(&b.bytes()[32..]);
    let mut h = H::default();
    h.put_value(1, "k", a, 0, 10, ok())
        .put_value(1, "k", b, 20, 30, ok());
    h.get_raw(
        2,
        "k",
        None,
        40,
        50,
        ReadResult::Found {
            value_id: Some(1),
            len: 52,
            hash: content_hash(&torn),
        },
    );
    // The id alone would be a stale read too; the content check names the
    // torn bytes, the register check the id.
    let r = h.check();
    assert!(
        kinds(&r).contains(&ViolationKind::CorruptRead),
        "{}",
        r.render()
    );
    let corrupt = r
        .violations
        .iter()
        .find(|v| v.kind == ViolationKind::CorruptRead)
        .unwrap();
    assert_eq!(entry_ids(corrupt), vec![0, 2]);
}

#[test]
fn torn_multipart_object_missing_a_part() {
    let a = two_parts(1);
    let first = a.bytes()[..32].to_vec();
    let mut h = H::default();
    h.put_value(1, "k", a, 0, 10, ok());
    h.get_raw(
        2,
        "k",
        None,
        40,
        50,
        ReadResult::Found {
            value_id: Some(1),
            len: 32,
            hash: content_hash(&first),
        },
    );
    let v = assert_one(&h, ViolationKind::CorruptRead);
    assert!(v.message.contains("32 bytes"), "{}", v.message);
}

#[test]
fn bit_rot_served_is_a_corrupt_read() {
    let a = value(1);
    let mut bytes = a.bytes();
    bytes[5] ^= 1;
    let mut h = H::default();
    h.put_value(1, "k", a, 0, 10, ok());
    h.get_raw(
        2,
        "k",
        None,
        40,
        50,
        ReadResult::Found {
            value_id: Some(1),
            len: 24,
            hash: content_hash(&bytes),
        },
    );
    assert_one(&h, ViolationKind::CorruptRead);
}

#[test]
fn unknown_other_keys_failed_and_missing_value_ids_are_corrupt_reads() {
    for (seen, why) in [
        (Some(99), "no Put"),
        (Some(2), "under key"),
        (Some(3), "failed"),
        (None, "no value id"),
    ] {
        let mut h = H::default();
        h.put(1, "k", 1, 0, 10, ok())
            .put(1, "other", 2, 0, 10, ok())
            .put(1, "k", 3, 20, 30, failed());
        let result = match seen {
            Some(id) => found(&value(id), None),
            None => ReadResult::Found {
                value_id: None,
                len: 24,
                hash: content_hash(&value(1).bytes()),
            },
        };
        h.get_raw(2, "k", None, 40, 50, result);
        let v = assert_one(&h, ViolationKind::CorruptRead);
        assert!(v.message.contains(why), "{why}: {}", v.message);
    }
}

#[test]
fn listing_missing_an_acknowledged_key() {
    let mut h = H::default();
    h.put(1, "a/1", 1, 0, 10, ok())
        .put(1, "b/1", 2, 0, 10, ok())
        .list(2, "a/", 20, 30, &[])
        .list(2, "b/", 20, 30, &["b/1"]);
    let v = assert_one(&h, ViolationKind::ListingMismatch);
    assert_eq!(v.key.as_deref(), Some("a/1"));
    assert_eq!(entry_ids(&v), vec![0, 2]);
}

#[test]
fn listing_containing_a_deleted_key() {
    let mut h = H::default();
    h.put(1, "b", 1, 0, 10, ok())
        .delete(1, "b", 20, 30, ok())
        .list(2, "", 40, 50, &["b"]);
    let v = assert_one(&h, ViolationKind::ListingMismatch);
    assert_eq!(entry_ids(&v), vec![0, 1, 2]);
}

#[test]
fn listing_containing_a_key_never_written_or_outside_its_prefix_or_twice() {
    let mut h = H::default();
    h.list(2, "", 40, 50, &["ghost"]);
    assert_one(&h, ViolationKind::ListingMismatch);
    let mut h = H::default();
    h.put(1, "b", 1, 0, 10, ok()).list(2, "a", 40, 50, &["b"]);
    assert_one(&h, ViolationKind::ListingMismatch);
    let mut h = H::default();
    h.put(1, "b", 1, 0, 10, ok())
        .list(2, "", 40, 50, &["b", "b"]);
    assert_one(&h, ViolationKind::ListingMismatch);
}

#[test]
fn final_listing_is_checked_exactly_against_the_read_back() {
    // The Put is indeterminate, so during the run the listing could go
    // either way; after quiescence the read-back found it, so the final
    // listing must list it.
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, indet())
        .get(0, "k", 100, 110, Some(1))
        .list(0, "", 120, 130, &[]);
    assert_passes(&h);
    let opts = CheckOptions {
        final_phase_start_us: Some(100),
        ..CheckOptions::default()
    };
    let v = assert_one_with(&h, ViolationKind::ListingMismatch, &opts);
    assert_eq!(entry_ids(&v), vec![1, 2]);
    // And the other way round.
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .delete(1, "k", 20, 30, indet())
        .get(0, "k", 100, 110, None);
    h.list(0, "", 120, 130, &["k"]);
    assert_passes(&h);
    assert_one_with(&h, ViolationKind::ListingMismatch, &opts);
}

#[test]
fn listings_concurrent_with_writes_pass_either_way() {
    for listed in [&["k"][..], &[][..]] {
        let mut h = H::default();
        h.put(1, "k", 1, 0, 10, ok())
            .delete(1, "k", 20, 60, ok())
            .list(2, "", 30, 40, listed);
        h.put(1, "j", 2, 35, 80, ok()).list(
            2,
            "j",
            40,
            50,
            if listed.is_empty() { &["j"] } else { &[] },
        );
        h.put(1, "i", 3, 0, 10, indet()).list(
            2,
            "i",
            40,
            50,
            if listed.is_empty() { &["i"] } else { &[] },
        );
        assert_passes(&h);
    }
}

#[test]
fn a_reordered_pair_of_reads_is_not_linearizable_and_is_shrunk() {
    // Two concurrent writes; reads see 1, then 2, then 1 again.
    let mut h = H::default();
    h.put(1, "k", 5, 0, 5, ok()).get(3, "k", 6, 8, Some(5));
    h.put(1, "k", 1, 10, 100, ok())
        .put(2, "k", 2, 10, 100, ok());
    h.get(3, "k", 20, 30, Some(1))
        .get(3, "k", 40, 50, Some(2))
        .get(3, "k", 60, 70, Some(1));
    h.put(1, "k", 7, 200, 210, ok())
        .get(3, "k", 220, 230, Some(7));
    let v = assert_one(&h, ViolationKind::NotLinearizable);
    assert_eq!(entry_ids(&v), vec![2, 3, 4, 5, 6], "{}", v.message);
}

#[test]
fn a_not_found_between_two_reads_of_one_value_is_not_linearizable() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .delete(2, "k", 20, 30, indet())
        .get(3, "k", 40, 50, None)
        .get(3, "k", 60, 70, Some(1));
    let v = assert_one(&h, ViolationKind::NotLinearizable);
    assert_eq!(entry_ids(&v), vec![0, 1, 2, 3]);
}

// ---------------------------------------------------------------------
// Histories that must pass
// ---------------------------------------------------------------------

#[test]
fn concurrent_writes_read_in_either_order() {
    for (during, after) in [(Some(2), 1), (Some(1), 2), (None, 1)] {
        let mut h = H::default();
        h.get(3, "k", 0, 5, None);
        h.put(1, "k", 1, 10, 100, ok()).put(2, "k", 2, 20, 90, ok());
        h.get(3, "k", 30, 40, during)
            .get(3, "k", 50, 60, Some(after))
            .get(3, "k", 110, 120, Some(after));
        assert_passes(&h);
    }
}

#[test]
fn indeterminate_write_that_landed_late() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .put(1, "k", 2, 20, 30, indet());
    h.get(2, "k", 40, 50, Some(1))
        .get(2, "k", 60, 70, Some(2))
        .get(2, "k", 100, 110, Some(2));
    assert_passes(&h);
}

#[test]
fn indeterminate_write_that_never_landed() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok())
        .put(1, "k", 2, 20, 30, indet())
        .put(1, "k", 3, 40, 50, failed());
    h.get(2, "k", 100, 110, Some(1));
    assert_passes(&h);
}

#[test]
fn indeterminate_delete_either_way() {
    for last in [None, Some(1)] {
        let mut h = H::default();
        h.put(1, "k", 1, 0, 10, ok())
            .delete(1, "k", 20, 30, indet());
        h.get(2, "k", 40, 50, Some(1)).get(2, "k", 100, 110, last);
        assert_passes(&h);
    }
}

#[test]
fn not_found_before_any_write_and_during_the_first() {
    let mut h = H::default();
    h.get(2, "k", 0, 5, None)
        .put(1, "k", 1, 10, 20, ok())
        .get(2, "k", 12, 18, None)
        .get(2, "k", 30, 40, Some(1));
    h.delete(1, "k", 50, 60, ok())
        .delete(1, "k", 70, 80, ok())
        .get(2, "k", 90, 95, None);
    assert_passes(&h);
}

#[test]
fn ranged_reads_check_the_range_bytes() {
    let v = two_parts(1);
    let mut h = H::default();
    h.put_value(1, "k", v.clone(), 0, 10, ok());
    for (first, last) in [(5, 40), (0, 0), (30, 1000), (40, 51)] {
        let range = Some(ByteRange { first, last });
        h.get_raw(2, "k", range, 20, 30, found(&v, range));
    }
    assert_passes(&h);
    // The whole value's bytes under a range are wrong.
    h.get_raw(
        2,
        "k",
        Some(ByteRange { first: 5, last: 40 }),
        20,
        30,
        found(&v, None),
    );
    assert_one(&h, ViolationKind::CorruptRead);
}

#[test]
fn expected_digest_is_the_hash_of_range_bytes() {
    let v = two_parts(9);
    let ranges = [
        None,
        Some((0, 0)),
        Some((3, 31)),
        Some((31, 32)),
        Some((40, 1 << 40)),
        Some((60, 70)),
    ];
    for r in ranges.map(|r| r.map(|(first, last)| ByteRange { first, last })) {
        let bytes = v.range_bytes(r);
        assert_eq!(
            content::expected_digest(&v, r),
            (bytes.len() as u64, content_hash(&bytes)),
            "{r:?}"
        );
    }
}

#[test]
fn informational_and_failed_operations_are_counted_not_checked() {
    let mut h = H::default();
    let part = Part { seed: 3, len: 24 };
    h.push(
        1,
        0,
        5,
        Op::UploadPart {
            key: "m".into(),
            upload_id: "u".into(),
            part_number: 1,
            part,
        },
        ok(),
    );
    h.push(
        1,
        6,
        7,
        Op::Abort {
            key: "m".into(),
            upload_id: "u".into(),
        },
        ok(),
    );
    h.delete(1, "k", 8, 9, failed()).get(2, "k", 10, 20, None);
    h.push(
        2,
        21,
        22,
        Op::Get {
            key: "k".into(),
            range: None,
        },
        indet(),
    );
    h.list(2, "", 30, 40, &[]);
    let r = h.check();
    assert!(r.passed(), "{}", r.render());
    assert_eq!(
        (
            r.operations,
            r.acknowledged,
            r.indeterminate,
            r.failed,
            r.keys
        ),
        (6, 4, 1, 1, 1)
    );
}

#[test]
fn an_exhausted_budget_makes_the_key_inconclusive() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 100, ok())
        .put(2, "k", 2, 0, 100, ok())
        .put(3, "k", 3, 0, 100, ok());
    h.get(4, "k", 200, 210, Some(1));
    let r = check(
        &h.entries,
        &CheckOptions {
            max_search_states: 1,
            ..CheckOptions::default()
        },
    );
    assert_eq!(r.inconclusive_keys, vec!["k".to_string()], "{}", r.render());
    assert!(r.violations.is_empty());
    assert!(!r.passed());
    assert_passes(&h);
}

#[test]
fn render_names_the_violation_and_its_entries_as_json() {
    let mut h = H::default();
    h.put(1, "k", 1, 0, 10, ok()).get(2, "k", 100, 110, None);
    let text = h.check().render();
    assert!(text.contains("FAILED: 1 violations"), "{text}");
    assert!(text.contains("LostWrite on key \"k\""), "{text}");
    let json: Vec<Entry> = text
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix('{')
                .map(|_| serde_json::from_str(l.trim()).unwrap())
        })
        .collect();
    assert_eq!(json, h.entries);
}

// ---------------------------------------------------------------------
// A big valid history, simulated
// ---------------------------------------------------------------------

enum Plan {
    Put,
    Delete,
    Get,
}

/// `n` operations of `clients` clients on one key of a real register,
/// each taking effect at a random point of its interval; `indeterminate`
/// of the writes are indeterminate, half of those landing (possibly after
/// the client gave up), half never. Ends with a read-back.
fn simulated_history(seed: u64, n: usize, clients: usize, indeterminate: usize) -> Vec<Entry> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut free: Vec<u64> = (0..clients).map(|_| rng.gen_range(0..50)).collect();
    let mut plans = Vec::new();
    for i in 0..n {
        let c = (0..clients).min_by_key(|&c| free[c]).expect("clients");
        let start = free[c] + rng.gen_range(0..10);
        let end = start + rng.gen_range(1..200);
        free[c] = end;
        let plan = match rng.gen_range(0..20) {
            0..=8 => Plan::Put,
            9..=10 => Plan::Delete,
            _ => Plan::Get,
        };
        plans.push((i, c as u32, start, end, plan));
    }
    let writes: Vec<usize> = plans
        .iter()
        .filter(|p| !matches!(p.4, Plan::Get))
        .map(|p| p.0)
        .collect();
    let unknown: HashSet<usize> = rand::seq::index::sample(&mut rng, writes.len(), indeterminate)
        .into_iter()
        .map(|i| writes[i])
        .collect();
    let mut effects: Vec<(u64, usize)> = Vec::new();
    for &(i, _, start, end, _) in &plans {
        if !unknown.contains(&i) {
            effects.push((rng.gen_range(start..=end), i));
        } else if rng.gen_bool(0.5) {
            effects.push((rng.gen_range(start..=end + 2000), i));
        }
    }
    effects.sort_unstable();
    let mut state = None;
    let mut seen = vec![None; n];
    for (_, i) in effects {
        match plans[i].4 {
            Plan::Put => state = Some(i as u64 + 1),
            Plan::Delete => state = None,
            Plan::Get => seen[i] = Some(state),
        }
    }
    let mut h = H::default();
    for (i, c, start, end, plan) in plans {
        let outcome = if unknown.contains(&i) { indet() } else { ok() };
        match plan {
            Plan::Put => h.put(c, "k", i as u64 + 1, start, end, outcome),
            Plan::Delete => h.delete(c, "k", start, end, outcome),
            Plan::Get => h.get(c, "k", start, end, seen[i].expect("every read took effect")),
        };
    }
    let last = h.entries.iter().map(|e| e.end_us).max().unwrap_or(0) + 5000;
    h.get(0, "k", last, last + 10, state);
    h.entries
}

#[test]
fn a_big_simulated_history_passes_within_the_budget() {
    for seed in 0..3 {
        let history = simulated_history(seed, 2000, 8, 30);
        let started = std::time::Instant::now();
        let r = check(&history, &CheckOptions::default());
        assert!(r.passed(), "seed {seed}:\n{}", r.render());
        assert_eq!(r.indeterminate, 30);
        eprintln!(
            "seed {seed}: {} operations checked in {:?}",
            r.operations,
            started.elapsed()
        );
    }
}

#[test]
fn a_planted_stale_final_read_in_a_big_history_is_caught() {
    let mut history = simulated_history(7, 2000, 8, 30);
    // The final read returns the first acknowledged value, which an
    // acknowledged write that began after it ended has superseded.
    let first = history
        .iter()
        .find(|e| matches!(e.op, Op::Put { .. }) && e.outcome == Outcome::Ok)
        .unwrap()
        .clone();
    let superseded = history.iter().any(|e| {
        matches!(e.op, Op::Put { .. } | Op::Delete { .. })
            && e.outcome == Outcome::Ok
            && e.start_us > first.end_us
    });
    assert!(superseded);
    let Op::Put { value, .. } = &first.op else {
        unreachable!()
    };
    let result = found(value, None);
    history.last_mut().unwrap().outcome = Outcome::Read { result };
    let r = check(&history, &CheckOptions::default());
    assert!(!r.passed());
    assert!(
        r.violations.iter().all(|v| matches!(
            v.kind,
            ViolationKind::LostWrite | ViolationKind::StaleRead | ViolationKind::ResurrectedDelete
        )),
        "{}",
        r.render()
    );
}

// ---------------------------------------------------------------------
// The search and its reductions against a plain exhaustive search
// ---------------------------------------------------------------------

/// An operation for [`brute_force`]: start, end (`u64::MAX` if
/// indeterminate), write (else read), the value written or seen.
type BruteOp = (u64, u64, bool, Option<u64>);

/// Linearizable as a register, by trying every order of every choice of
/// indeterminate writes, with no reduction at all.
fn brute_force(history: &[Entry]) -> bool {
    let mut required = Vec::new();
    let mut optional = Vec::new();
    for e in history {
        let acked = e.outcome == Outcome::Ok;
        let end = if acked { e.end_us } else { u64::MAX };
        match (&e.op, &e.outcome) {
            (_, Outcome::Failed { .. }) => {}
            (Op::Put { value, .. }, _) => {
                let op = (e.start_us, end, true, Some(value.id));
                if acked {
                    required.push(op)
                } else {
                    optional.push(op)
                }
            }
            (Op::Delete { .. }, _) => {
                let op = (e.start_us, end, true, None);
                if acked {
                    required.push(op)
                } else {
                    optional.push(op)
                }
            }
            (Op::Get { .. }, Outcome::Read { result }) => {
                let seen = match result {
                    ReadResult::NotFound => None,
                    ReadResult::Found { value_id, .. } => *value_id,
                };
                required.push((e.start_us, e.end_us, false, seen));
            }
            _ => {}
        }
    }
    fn orders(ops: &[BruteOp], placed: u32, state: Option<u64>) -> bool {
        if placed.count_ones() as usize == ops.len() {
            return true;
        }
        let unplaced = |i: usize| placed & (1 << i) == 0;
        (0..ops.len()).filter(|&a| unplaced(a)).any(|a| {
            let (start, _, write, val) = ops[a];
            let blocked = (0..ops.len()).any(|b| b != a && unplaced(b) && ops[b].1 < start);
            if blocked || (!write && val != state) {
                return false;
            }
            orders(ops, placed | 1 << a, if write { val } else { state })
        })
    }
    (0..1u32 << optional.len()).any(|mask| {
        let mut ops = required.clone();
        ops.extend(
            (0..optional.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| optional[i]),
        );
        orders(&ops, 0, None)
    })
}

/// A small random history of one key: up to `n` operations with random
/// outcomes and reads of random (but existing, not failed) values.
fn random_history(rng: &mut StdRng, n: usize) -> H {
    let mut h = H::default();
    let mut ids = Vec::new();
    for i in 0..rng.gen_range(1..=n) {
        let start = rng.gen_range(0..30);
        let end = start + rng.gen_range(0..12);
        let c = i as u32;
        match rng.gen_range(0..10) {
            0..=3 => {
                let id = i as u64 + 1;
                let outcome = match rng.gen_range(0..6) {
                    0 => indet(),
                    1 => failed(),
                    _ => ok(),
                };
                if outcome != failed() {
                    ids.push(id);
                }
                h.put(c, "k", id, start, end, outcome);
            }
            4..=5 => {
                h.delete(
                    c,
                    "k",
                    start,
                    end,
                    if rng.gen_bool(0.3) { indet() } else { ok() },
                );
            }
            _ => {
                let seen = if ids.is_empty() || rng.gen_bool(0.3) {
                    None
                } else {
                    Some(ids[rng.gen_range(0..ids.len())])
                };
                h.get(c, "k", start, end, seen);
            }
        }
    }
    h
}

#[test]
fn verdicts_and_evidence_agree_with_an_exhaustive_search() {
    let mut rng = StdRng::seed_from_u64(11);
    let (mut passed, mut failed_) = (0, 0);
    for round in 0..4000 {
        let h = random_history(&mut rng, 7);
        let r = h.check();
        let expected = brute_force(&h.entries);
        assert!(r.inconclusive_keys.is_empty());
        assert_eq!(
            r.passed(),
            expected,
            "round {round}: brute force says {expected}:\n{}",
            r.render()
        );
        for v in &r.violations {
            assert!(
                !brute_force(&v.entries),
                "round {round}: the evidence is linearizable:\n{}",
                r.render()
            );
        }
        if expected { passed += 1 } else { failed_ += 1 }
    }
    // Both kinds of history were tried.
    assert!(
        passed > 500 && failed_ > 500,
        "{passed} passed, {failed_} failed"
    );
}

/// Two reads of a big valid history swap results: whatever is caught is
/// caught at once, with a few entries of evidence.
#[test]
fn swapped_reads_in_a_big_history_are_caught_with_small_evidence() {
    let mut caught = 0;
    for seed in 0..12u64 {
        let mut history = simulated_history(seed, 2000, 8, 30);
        let mut rng = StdRng::seed_from_u64(seed + 100);
        let reads: Vec<usize> = (0..history.len())
            .filter(|&i| matches!(history[i].op, Op::Get { .. }))
            .collect();
        let k = rng.gen_range(0..reads.len() - 3);
        let (a, b) = (reads[k], reads[k + 2]);
        let (oa, ob) = (history[a].outcome.clone(), history[b].outcome.clone());
        history[a].outcome = ob;
        history[b].outcome = oa;
        let r = check(&history, &CheckOptions::default());
        assert!(r.inconclusive_keys.is_empty(), "seed {seed}");
        assert!(
            r.violations.iter().all(|v| v.entries.len() <= 4),
            "seed {seed}:\n{}",
            r.render()
        );
        caught += usize::from(!r.passed());
    }
    assert!(caught >= 4, "{caught} caught");
}

/// Listings of a simulated run on a few keys, each listing taken at one
/// random point of its interval, always pass.
#[test]
fn listings_of_a_simulated_run_pass() {
    let keys = ["a/1", "a/2", "b/1", "b/2"];
    for seed in 0..5u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut free = [0u64; 6];
        // (effect time, op index); ops: (client, start, end, op, outcome).
        let mut ops: Vec<(u32, u64, u64, Op, Outcome)> = Vec::new();
        let mut effects = Vec::new();
        for i in 0..600u64 {
            let c = (0..free.len()).min_by_key(|&c| free[c]).unwrap();
            let start = free[c] + rng.gen_range(0..5);
            let end = start + rng.gen_range(1..60);
            free[c] = end;
            let key = keys[rng.gen_range(0..keys.len())].to_string();
            let unknown = rng.gen_bool(0.05);
            let (op, outcome) = match rng.gen_range(0..10) {
                0..=3 => (
                    Op::Put {
                        key,
                        value: value(i + 1),
                        multipart: false,
                    },
                    if unknown { indet() } else { ok() },
                ),
                4..=5 => (Op::Delete { key }, if unknown { indet() } else { ok() }),
                6 => (
                    Op::Put {
                        key,
                        value: value(i + 1),
                        multipart: false,
                    },
                    failed(),
                ),
                _ => (
                    Op::List {
                        prefix: ["", "a/", "b/"][rng.gen_range(0..3)].to_string(),
                    },
                    Outcome::Listed { keys: vec![] },
                ),
            };
            let effect = match (&outcome, rng.gen_bool(0.5)) {
                (Outcome::Failed { .. }, _) | (Outcome::Indeterminate { .. }, false) => None,
                (Outcome::Indeterminate { .. }, true) => Some(rng.gen_range(start..end + 500)),
                _ => Some(rng.gen_range(start..=end)),
            };
            if let Some(t) = effect {
                effects.push((t, ops.len()));
            }
            ops.push((c as u32, start, end, op, outcome));
        }
        effects.sort_unstable();
        let mut present: std::collections::BTreeSet<String> = Default::default();
        for (_, i) in effects {
            match &ops[i].3 {
                Op::Put { key, .. } => {
                    present.insert(key.clone());
                }
                Op::Delete { key } => {
                    present.remove(key);
                }
                Op::List { prefix } => {
                    let listed = present
                        .iter()
                        .filter(|k| k.starts_with(prefix.as_str()))
                        .cloned()
                        .collect();
                    ops[i].4 = Outcome::Listed { keys: listed };
                }
                _ => {}
            }
        }
        let mut h = H::default();
        for (c, start, end, op, outcome) in ops {
            h.push(c, start, end, op, outcome);
        }
        let r = h.check();
        assert!(r.passed(), "seed {seed}:\n{}", r.render());
        // Listings that drop every key are caught.
        for e in &mut h.entries {
            if let Outcome::Listed { keys } = &mut e.outcome {
                keys.clear();
            }
        }
        let r = h.check();
        assert!(
            !r.violations.is_empty()
                && r.violations
                    .iter()
                    .all(|v| v.kind == ViolationKind::ListingMismatch)
        );
    }
}
