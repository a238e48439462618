//! Exactly-once sessions, write epochs, the commit fence and pending
//! deletions, on the in-memory store.

use sluice_proto::raft as rpb;

use super::*;
use crate::store::Space;

/// Applies `command` at leader time `now_ms`, as the entry at log index
/// `now_ms` (these tests step both together); returns the outcome and
/// whether the batch wrote anything.
fn run(kv: &MemStore, now_ms: i64, command: Command) -> (Applied, bool) {
    let (batch, applied) = apply_command(
        kv,
        u64::try_from(now_ms).unwrap_or(0),
        &MetaCommand {
            leader_now_ms: now_ms,
            requires_format: 1,
            command: Some(command),
        },
    )
    .unwrap();
    let wrote = !batch.is_empty();
    kv.apply(batch).unwrap();
    (applied, wrote)
}

fn at(kv: &MemStore, now_ms: i64, command: Command) -> Applied {
    run(kv, now_ms, command).0
}

/// What the leader does with `command`: admits it against a session
/// table bound of `max` entries (nothing else in flight), then applies it
/// as [`at`] does; `Err` with the refusal's code when it was not admitted.
fn lead(kv: &MemStore, now_ms: i64, max: u64, command: Command) -> Result<Applied, ErrorCode> {
    match sessions::admit(kv, admission_op_id(&command), 1, max) {
        Ok(()) => Ok(at(kv, now_ms, command)),
        Err(SmError::Refused { code, .. }) => Err(code),
        Err(e) => panic!("{e}"),
    }
}

fn put_op(b: &str, key: &str, blob: &str, op: &str) -> Command {
    Command::PutObject(pb::PutObjectRequest {
        object: Some(object(b, key, blob)),
        condition: None,
        op_id: op.into(),
    })
}

fn delete_op(key: &str, op: &str) -> Command {
    Command::DeleteObject(pb::ObjectKey {
        bucket: "b".into(),
        key: key.into(),
        op_id: op.into(),
        ..Default::default()
    })
}

fn part_op(n: u32, body: &[u8], blob: &str, op: &str) -> Command {
    Command::PutPart(pb::PutPartRequest {
        bucket: "b".into(),
        key: "k".into(),
        part: Some(pb::PartRecord {
            upload_id: "u1".into(),
            part_number: n,
            size: 5 * MIB,
            md5: md5_of(body),
            placement: Some(placement(blob)),
            ..Default::default()
        }),
        op_id: op.into(),
    })
}

/// Every pending deletion, by test blob name.
fn pending_names(kv: &MemStore) -> Vec<String> {
    kv.scan(
        Space::Pending,
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        100,
    )
    .unwrap()
    .iter()
    .map(|(k, _)| name_of(&String::from_utf8_lossy(k)))
    .collect()
}

fn object_blob(kv: &MemStore, key: &str) -> String {
    let o = get_object(kv, "b", key).unwrap();
    name_of(&o.parts[0].placement.as_ref().unwrap().blob_id)
}

#[test]
fn put_retry_returns_first_outcome_and_releases_once() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    assert_eq!(
        at(&kv, 1000, put_op("b", "k", "x", "o1")),
        Applied::Released(vec![])
    );
    assert_eq!(
        at(&kv, 2000, put_op("b", "k", "y", "o2")),
        Applied::Released(vec![placement("x")])
    );
    // A late retry of o1 (its response was lost) must not put X back.
    let (again, wrote) = run(&kv, 3000, put_op("b", "k", "x", "o1"));
    assert_eq!(again, Applied::Released(vec![]));
    assert!(!wrote, "a deduplicated retry writes nothing");
    assert_eq!(object_blob(&kv, "k"), "y");
    assert_eq!(pending_names(&kv), ["x"]);
    let rec = pending::get(&kv, &bid("x")).unwrap().unwrap();
    assert_eq!(rec.released_ms, 2000, "released by the o2 apply");
    assert_eq!(rec.remaining_nodes, [1, 2, 3, 4, 5, 6]);
    assert!(pending::get(&kv, &bid("y")).unwrap().is_none());
    assert_eq!(
        sessions::count(&kv).unwrap(),
        2,
        "o1 and o2; fixture ops have no op id"
    );
}

#[test]
fn refusals_are_recorded_and_replayed() {
    let kv = MemStore::new();
    open_epoch(&kv);
    let first = at(&kv, 10, put_op("b", "k", "x", "o1"));
    assert_eq!(refused_code(&first), Some(ErrorCode::NoSuchBucket));
    bucket(&kv, "b");
    assert_eq!(at(&kv, 20, put_op("b", "k", "x", "o1")), first);
    assert!(get_object(&kv, "b", "k").is_err());
    // An empty op id is never deduplicated.
    assert_eq!(
        at(&kv, 30, put_op("b", "k", "x", "")),
        Applied::Released(vec![])
    );
}

#[test]
fn delete_retry_does_not_delete_the_new_object() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    at(&kv, 1, put_op("b", "k", "x", "o1"));
    let del = at(&kv, 2, delete_op("k", "d1"));
    assert_eq!(del, Applied::Released(vec![placement("x")]));
    at(&kv, 3, put_op("b", "k", "y", "o2"));
    assert_eq!(at(&kv, 4, delete_op("k", "d1")), del, "same outcome");
    assert_eq!(object_blob(&kv, "k"), "y");
    assert_eq!(pending_names(&kv), ["x"]);
}

#[test]
fn put_part_retry_keeps_the_replacement() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    upload(&kv, "b", "k", "u1");
    assert_eq!(
        at(&kv, 1, part_op(1, b"a", "x", "p1")),
        Applied::Released(vec![])
    );
    assert_eq!(
        at(&kv, 2, part_op(1, b"b", "y", "p2")),
        Applied::Released(vec![placement("x")])
    );
    assert_eq!(
        at(&kv, 3, part_op(1, b"a", "x", "p1")),
        Applied::Released(vec![])
    );
    let parts = list_parts(
        &kv,
        &pb::ListPartsRequest {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u1".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(parts.parts[0].md5, md5_of(b"b"));
    assert_eq!(pending_names(&kv), ["x"]);
}

#[test]
fn complete_and_abort_retries_answer_the_first_outcome() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    let req = |op: &str| {
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u1".into(),
            parts: vec![completed(1, b"part1"), completed(5, b"part5")],
            now_ms: 9,
            min_part_size: 5 * MIB,
            op_id: op.into(),
            ..Default::default()
        })
    };
    let first = at(&kv, 100, req("c1"));
    let Applied::Completed(resp) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(resp.released.len(), 3);
    // The object is overwritten; the completed parts are released once.
    let over = at(&kv, 200, put_op("b", "k", "z", "o2"));
    let Applied::Released(rel) = over else {
        panic!()
    };
    assert_eq!(rel.len(), 2);
    let (again, wrote) = run(&kv, 300, req("c1"));
    assert_eq!(again, first);
    assert!(!wrote);
    assert_eq!(object_blob(&kv, "k"), "z");
    let mut names = pending_names(&kv);
    names.sort();
    assert_eq!(names, ["blob1", "blob2", "blob3", "blob4", "blob5"]);

    // Abort: a retry returns the same released list and writes nothing.
    upload(&kv, "b", "k2", "u2");
    let part2 = |op: &str| {
        Command::PutPart(pb::PutPartRequest {
            bucket: "b".into(),
            key: "k2".into(),
            part: Some(pb::PartRecord {
                upload_id: "u2".into(),
                part_number: 1,
                placement: Some(placement("q1")),
                ..Default::default()
            }),
            op_id: op.into(),
        })
    };
    at(&kv, 400, part2("q"));
    let abort = || {
        Command::AbortUpload(pb::UploadKey {
            bucket: "b".into(),
            key: "k2".into(),
            upload_id: "u2".into(),
            op_id: "a1".into(),
        })
    };
    let first = at(&kv, 500, abort());
    assert_eq!(first, Applied::Released(vec![placement("q1")]));
    let (again, wrote) = run(&kv, 600, abort());
    assert_eq!(again, first);
    assert!(!wrote);
    assert_eq!(
        pending::get(&kv, &bid("q1")).unwrap().unwrap().released_ms,
        500
    );
}

#[test]
fn replay_after_expiry_is_fenced_by_the_closed_epoch() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    at(&kv, 1000, put_op("b", "k", "x", "o1"));
    at(&kv, 2000, put_op("b", "k", "y", "o2"));
    // Both sessions expire, then the epoch of X's gateway closes.
    at(
        &kv,
        700_000,
        Command::ExpireSessions(rpb::ExpireSessions {
            before_index: 600_000,
            limit: 10,
        }),
    );
    assert_eq!(sessions::count(&kv).unwrap(), 0);
    assert!(sessions::lookup(&kv, "o1").unwrap().is_none());
    at(
        &kv,
        700_000,
        Command::CloseEpochs(rpb::CloseEpochs {
            epochs: vec![EPOCH],
        }),
    );
    let late = at(&kv, 700_001, put_op("b", "k", "x", "o1"));
    assert_eq!(refused_code(&late), Some(ErrorCode::EpochClosed));
    assert_eq!(object_blob(&kv, "k"), "y");
    assert_eq!(pending_names(&kv), ["x"]);
}

/// Expires every session entry and closes the test epoch, at `now_ms`.
fn expire_all_and_close(kv: &MemStore, now_ms: i64) {
    at(
        kv,
        now_ms,
        Command::ExpireSessions(rpb::ExpireSessions {
            before_index: u64::MAX,
            limit: 10_000,
        }),
    );
    assert_eq!(sessions::count(kv).unwrap(), 0);
    at(
        kv,
        now_ms + 1,
        Command::CloseEpochs(rpb::CloseEpochs {
            epochs: vec![EPOCH],
        }),
    );
    assert!(!epochs::is_open(kv, EPOCH).unwrap());
}

/// A PutObject applied, its response lost, its session entry expired and
/// its write epoch closed: refused EPOCH_CLOSED, the retry would make the
/// gateway delete the blob of the object the first application had
/// committed. The retry must succeed and change nothing.
#[test]
fn committed_put_replayed_after_expiry_succeeds_and_changes_nothing() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    assert_eq!(
        at(&kv, 1000, put_op("b", "k", "x", "o1")),
        Applied::Released(vec![])
    );
    expire_all_and_close(&kv, 2000);
    let before = get_object(&kv, "b", "k").unwrap();
    let (again, wrote) = run(&kv, 3000, put_op("b", "k", "x", "o1"));
    assert_eq!(
        again,
        Applied::Released(vec![]),
        "not refused: it committed"
    );
    assert_eq!(get_object(&kv, "b", "k").unwrap(), before);
    assert!(crate::sm::refs::is_referenced(&kv, &bid("x")).unwrap());
    assert!(pending_names(&kv).is_empty(), "nothing released");
    assert!(wrote, "only the new session entry");
    assert_eq!(sessions::lookup(&kv, "o1").unwrap(), Some(again));
    // A write that never committed is still fenced by the closed epoch.
    let late = at(&kv, 4000, put_op("b", "k2", "w", "o9"));
    assert_eq!(refused_code(&late), Some(ErrorCode::EpochClosed));
    assert!(get_object(&kv, "b", "k2").is_err(), "no record for k2");
}

/// A PutPart retried after its upload completed (session expired, epoch
/// closed): the part's blob now belongs to the object. The retry succeeds
/// and the object keeps it.
#[test]
fn committed_part_replayed_after_complete_succeeds() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    at(&kv, 50, part_op(1, b"part1", "p1", "pp1"));
    let done = at(
        &kv,
        100,
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u1".into(),
            parts: vec![completed(1, b"part1"), completed(5, b"part5")],
            now_ms: 9,
            min_part_size: 5 * MIB,
            op_id: "c1".into(),
            ..Default::default()
        }),
    );
    assert!(matches!(done, Applied::Completed(_)), "{done:?}");
    assert_eq!(object_blob(&kv, "k"), "p1");
    expire_all_and_close(&kv, 2000);
    let again = at(&kv, 3000, part_op(1, b"part1", "p1", "pp1"));
    assert_eq!(again, Applied::Released(vec![]));
    assert_eq!(object_blob(&kv, "k"), "p1");
    assert!(crate::sm::refs::is_referenced(&kv, &bid("p1")).unwrap());
    assert!(!pending_names(&kv).contains(&"p1".to_string()));
}

fn inline_put_op(key: &str, body: &[u8], op: &str) -> Command {
    Command::PutObject(pb::PutObjectRequest {
        object: Some(pb::ObjectRecord {
            bucket: "b".into(),
            key: key.into(),
            size: body.len() as u64,
            parts: vec![pb::PartRecord {
                part_number: 1,
                size: body.len() as u64,
                md5: md5_of(body),
                ..Default::default()
            }],
            inline_data: body.to_vec(),
            ..Default::default()
        }),
        condition: None,
        op_id: op.into(),
    })
}

/// With a table of two entries: a retried DeleteObject and a retried
/// inline PutObject (no blob, so the reference index cannot recognise
/// the replay) each come after a newer acknowledged write of their key by
/// another op. Neither is applied again: the newer write survives. A new
/// op is refused `SLOW_DOWN` instead of evicting either entry.
#[test]
fn a_full_table_refuses_new_ops_and_never_reapplies_a_retry() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "x");
    let max = 2;

    let deleted = lead(&kv, 10, max, delete_op("k", "d1")).unwrap();
    assert_eq!(deleted, Applied::Released(vec![placement("x")]));
    assert_eq!(
        lead(&kv, 11, max, put_op("b", "k", "y", "w1")).unwrap(),
        Applied::Released(vec![]),
        "the newer write, acknowledged"
    );
    assert_eq!(sessions::count(&kv).unwrap(), 2);
    // A third operation: refused, nothing evicted.
    assert_eq!(
        lead(&kv, 12, max, put_op("b", "k", "z", "n3")),
        Err(ErrorCode::SlowDown)
    );
    assert_eq!(sessions::count(&kv).unwrap(), 2);
    // The retry of d1 is admitted (its entry is in the table) and answered
    // from it: k keeps the newer write.
    assert_eq!(lead(&kv, 13, max, delete_op("k", "d1")).unwrap(), deleted);
    assert_eq!(object_blob(&kv, "k"), "y");
    assert_eq!(pending_names(&kv), ["x"]);

    // The sweeper expires both entries (they aged), making room.
    at(
        &kv,
        20,
        Command::ExpireSessions(rpb::ExpireSessions {
            before_index: 20,
            limit: 10,
        }),
    );
    assert_eq!(sessions::count(&kv).unwrap(), 0);

    let first = lead(&kv, 30, max, inline_put_op("j", b"v1", "p1")).unwrap();
    assert_eq!(first, Applied::Released(vec![]));
    lead(&kv, 31, max, inline_put_op("j", b"v2", "w2")).unwrap();
    assert_eq!(
        lead(&kv, 32, max, delete_op("j", "n4")),
        Err(ErrorCode::SlowDown)
    );
    assert_eq!(
        lead(&kv, 33, max, inline_put_op("j", b"v1", "p1")).unwrap(),
        first
    );
    assert_eq!(get_object(&kv, "b", "j").unwrap().inline_data, b"v2");
    assert_eq!(sessions::count(&kv).unwrap(), 2);
    // A retry of the refused op is refused again; so is any new op, until
    // the sweeper removes entries.
    assert_eq!(
        lead(&kv, 34, max, put_op("b", "k", "z", "n3")),
        Err(ErrorCode::SlowDown)
    );
    assert_eq!(object_blob(&kv, "k"), "y");
    // Lease traffic is not gated: a gateway keeps its epoch under load.
    let renew = Command::RenewEpoch(pb::RenewEpochRequest {
        epoch: EPOCH,
        op_id: "r1".into(),
        ..Default::default()
    });
    assert_eq!(lead(&kv, 35, max, renew).unwrap(), Applied::Done);
}

/// Apply records every op id and evicts nothing, however many entries the
/// table holds: what it writes does not depend on any bound.
#[test]
fn apply_records_every_op_and_never_evicts() {
    let kv = MemStore::new();
    let create = |name: &str, op: &str| {
        Command::CreateBucket(pb::CreateBucketRequest {
            name: name.into(),
            now_ms: 1,
            op_id: op.into(),
            ..Default::default()
        })
    };
    for i in 0..300i64 {
        let (applied, _) = run(&kv, 100 + i, create(&format!("b{i}"), &format!("op{i}")));
        assert_eq!(applied, Applied::Created(true));
    }
    assert_eq!(sessions::count(&kv).unwrap(), 300);
    for i in 0..300 {
        assert_eq!(
            sessions::lookup(&kv, &format!("op{i}")).unwrap(),
            Some(Applied::Created(true))
        );
    }
    assert_eq!(sessions::oldest_index(&kv).unwrap(), Some(100));
    assert_eq!(sessions::count_before(&kv, 150, 1000).unwrap(), 50);
    assert_eq!(sessions::count_before(&kv, 150, 10).unwrap(), 10);
    // Admission counts in-flight proposals: 300 applied + 1 fits in 301.
    assert!(sessions::admit(&kv, "new", 1, 301).is_ok());
    assert!(sessions::admit(&kv, "new", 2, 301).is_err());
    assert!(sessions::admit(&kv, "op7", 2, 1).is_ok(), "a retry");
    assert!(sessions::admit(&kv, "", 2, 1).is_ok(), "no op id");
}

#[test]
fn expire_sessions_is_bounded_and_ordered() {
    let kv = MemStore::new();
    for i in 0..5i64 {
        at(
            &kv,
            10 * (i + 1),
            Command::CreateBucket(pb::CreateBucketRequest {
                name: format!("b{i}"),
                now_ms: 1,
                op_id: format!("op{i}"),
                ..Default::default()
            }),
        );
    }
    let expire = |before_index, limit| {
        Command::ExpireSessions(rpb::ExpireSessions {
            before_index,
            limit,
        })
    };
    at(&kv, 100, expire(35, 1));
    assert_eq!(sessions::count(&kv).unwrap(), 4);
    assert!(sessions::lookup(&kv, "op0").unwrap().is_none());
    at(&kv, 100, expire(35, 100));
    assert_eq!(sessions::count(&kv).unwrap(), 2, "op1 (20), op2 (30) gone");
    assert_eq!(sessions::oldest_index(&kv).unwrap(), Some(40));
    at(&kv, 100, expire(0, 100));
    assert_eq!(sessions::count(&kv).unwrap(), 2);
}

#[test]
fn epochs_open_renew_close_and_never_reopen() {
    let kv = MemStore::new();
    let open = |op: &str| {
        Command::OpenEpoch(pb::OpenEpochRequest {
            gateway_id: "gw-1".into(),
            op_id: op.into(),
        })
    };
    let renew = |epoch| {
        Command::RenewEpoch(pb::RenewEpochRequest {
            epoch,
            op_id: String::new(),
            ..Default::default()
        })
    };
    let Applied::Epoch(e1) = at(&kv, 1000, open("e-a")) else {
        panic!()
    };
    assert_eq!(e1.epoch, 1);
    // No settings record: the default lease. At cluster version 1 (no
    // version recorded) the epoch records none, as a v0.1.0 voter would.
    assert_eq!(e1.lease_ms, epochs::DEFAULT_LEASE_MS);
    assert_eq!(epochs::get_epoch(&kv, 1).unwrap().unwrap().lease_ms, 0);
    // A retried OpenEpoch gets the same epoch.
    assert_eq!(at(&kv, 1001, open("e-a")), Applied::Epoch(e1));
    let Applied::Epoch(e2) = at(&kv, 1002, open("e-b")) else {
        panic!()
    };
    assert_eq!(e2.epoch, 2);
    let rec = epochs::get_epoch(&kv, 1).unwrap().unwrap();
    assert_eq!(
        (rec.gateway_id.as_str(), rec.opened_ms, rec.renewed_ms),
        ("gw-1", 1000, 1000)
    );

    assert_eq!(at(&kv, 5000, renew(1)), Applied::Done);
    assert_eq!(epochs::get_epoch(&kv, 1).unwrap().unwrap().renewed_ms, 5000);
    // Leader time going back never shortens a lease.
    at(&kv, 4000, renew(1));
    assert_eq!(epochs::get_epoch(&kv, 1).unwrap().unwrap().renewed_ms, 5000);
    assert_eq!(
        epochs::list_open(&kv, None, 10)
            .unwrap()
            .iter()
            .map(|(e, _)| *e)
            .collect::<Vec<_>>(),
        [1, 2]
    );

    at(
        &kv,
        6000,
        Command::CloseEpochs(rpb::CloseEpochs { epochs: vec![1, 7] }),
    );
    assert!(!epochs::is_open(&kv, 1).unwrap());
    assert!(epochs::is_open(&kv, 2).unwrap());
    assert!(!epochs::is_open(&kv, 0).unwrap(), "epoch 0 is never open");
    assert_eq!(
        refused_code(&at(&kv, 6001, renew(1))),
        Some(ErrorCode::EpochClosed)
    );
    let Applied::Epoch(e3) = at(&kv, 6002, open("e-c")) else {
        panic!()
    };
    assert_eq!(e3.epoch, 3, "a closed number is never reused");
    assert_eq!(
        epochs::list_open(&kv, Some(2), 10).unwrap().len(),
        1,
        "paging after epoch 2"
    );
}

#[test]
fn commits_are_fenced_by_epoch_and_release() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    upload(&kv, "b", "k", "u1");
    let other_epoch = sluice_proto::blob_id::new_blob_id(9, 0xab);
    // A closed epoch, and ids that name no epoch (no release makes them).
    for (blob, code) in [
        (other_epoch.as_str(), ErrorCode::EpochClosed),
        ("legacy-blob", ErrorCode::InvalidArgument),
        ("0123abcd", ErrorCode::InvalidArgument),
    ] {
        let mut obj = object("b", "k", "x");
        obj.parts[0].placement.as_mut().unwrap().blob_id = blob.into();
        let a = at(
            &kv,
            1,
            Command::PutObject(pb::PutObjectRequest {
                object: Some(obj),
                condition: None,
                op_id: String::new(),
            }),
        );
        assert_eq!(refused_code(&a), Some(code), "{blob}");
        if code == ErrorCode::InvalidArgument {
            let Applied::Refused { message, .. } = &a else {
                panic!("{a:?}")
            };
            assert!(
                message.contains("is not e<epoch>.<hex digits>"),
                "{message}"
            );
        }
    }
    assert!(get_object(&kv, "b", "k").is_err(), "nothing committed");

    // Released blob X cannot come back, as an object or as a part.
    at(&kv, 2, put_op("b", "k", "x", ""));
    at(&kv, 3, put_op("b", "k", "y", ""));
    let back = at(&kv, 4, put_op("b", "k2", "x", ""));
    assert_eq!(refused_code(&back), Some(ErrorCode::InvalidArgument));
    let back = at(&kv, 5, part_op(1, b"a", "x", ""));
    assert_eq!(refused_code(&back), Some(ErrorCode::InvalidArgument));
    // S3-level refusals come first.
    let nb = at(&kv, 6, put_op("nope", "k", "x", ""));
    assert_eq!(refused_code(&nb), Some(ErrorCode::NoSuchBucket));
}

#[test]
fn collect_pending_drops_confirmed_nodes_then_the_record() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let mut obj = object("b", "k", "x");
    obj.parts[0].placement.as_mut().unwrap().nodes = vec![3, 1, 3, 2];
    at(
        &kv,
        1000,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(obj),
            condition: None,
            op_id: String::new(),
        }),
    );
    at(&kv, 2000, put_op("b", "k", "y", ""));
    let rec = pending::get(&kv, &bid("x")).unwrap().unwrap();
    assert_eq!(rec.remaining_nodes, [3, 1, 2], "deduplicated, in order");

    // Released by the entry at index 2000: due once the reclaimer's cutoff
    // (the index it applied a delete delay ago) reaches it.
    assert_eq!(rec.released_index, 2000);
    assert!(
        pending::due(&kv, Some(1999), None, 10)
            .unwrap()
            .due
            .is_empty()
    );
    let page = pending::due(&kv, Some(2000), None, 10).unwrap();
    assert_eq!(page.due.len(), 1);
    assert_eq!(page.scanned, 1);
    assert_eq!(page.next, None);

    let collect = |done: Vec<(u64, Vec<String>)>| {
        Command::CollectPending(rpb::CollectPending {
            done: done
                .into_iter()
                .map(|(node_id, blob_ids)| rpb::CollectedShards { node_id, blob_ids })
                .collect(),
        })
    };
    at(
        &kv,
        3000,
        collect(vec![(1, vec![bid("x"), bid("unknown")])]),
    );
    assert_eq!(
        pending::get(&kv, &bid("x"))
            .unwrap()
            .unwrap()
            .remaining_nodes,
        [3, 2]
    );
    at(
        &kv,
        3001,
        collect(vec![(3, vec![bid("x")]), (2, vec![bid("x")])]),
    );
    assert!(pending::get(&kv, &bid("x")).unwrap().is_none());
    assert!(pending_names(&kv).is_empty());
    // Once gone, the blob is no longer "released": the fence only guards
    // blobs whose shards may still exist. Its epoch decides from now on.
}

#[test]
fn due_pages_in_blob_order() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    for i in 0..5 {
        at(&kv, 10, put_op("b", &format!("k{i}"), &format!("a{i}"), ""));
        at(&kv, 20, put_op("b", &format!("k{i}"), &format!("b{i}"), ""));
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = pending::due(&kv, Some(20), after.as_deref(), 2).unwrap();
        seen.extend(
            page.due
                .iter()
                .map(|r| name_of(&r.placement.as_ref().unwrap().blob_id)),
        );
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, ["a0", "a1", "a2", "a3", "a4"]);
}

#[test]
fn upload_initiation_uses_leader_time() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let create = |id: &str| {
        Command::CreateUpload(pb::CreateUploadRequest {
            upload: Some(pb::UploadRecord {
                bucket: "b".into(),
                key: "k".into(),
                upload_id: id.into(),
                initiated_ms: 5,
                ..Default::default()
            }),
            op_id: String::new(),
        })
    };
    at(&kv, 123_456, create("u1"));
    assert_eq!(
        get_upload(&kv, "b", "k", "u1").unwrap().initiated_ms,
        123_456
    );
}
