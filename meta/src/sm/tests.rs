//! State machine rules, exercised on the in-memory store without Raft.

use md5::{Digest, Md5};
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft::{MetaCommand, meta_command::Command};

use super::*;
use crate::store::MemStore;

const MIB: u64 = 1024 * 1024;

/// A log index for the next test entry (increasing, as Raft's are).
fn next_index() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn exec(kv: &MemStore, command: Command) -> Applied {
    exec_at(kv, command, 0)
}

/// [`exec`] of an entry the leader stamped with `now_ms`.
fn exec_at(kv: &MemStore, command: Command, now_ms: i64) -> Applied {
    let (batch, applied) = apply_command(
        kv,
        next_index(),
        &MetaCommand {
            command: Some(command),
            leader_now_ms: now_ms,
            requires_format: 1,
        },
    )
    .unwrap();
    kv.apply(batch).unwrap();
    applied
}

fn refused_code(a: &Applied) -> Option<ErrorCode> {
    match a {
        Applied::Refused { code, .. } => Some(*code),
        _ => None,
    }
}

/// The write epoch every fixture blob belongs to ([`bucket`] opens it).
const EPOCH: u64 = 1;

/// The blob id of test blob `name`: epoch [`EPOCH`], the name's bytes in
/// hex as the suffix (so the fence accepts it and [`name_of`] reverses it).
fn bid(name: &str) -> String {
    format!("e{EPOCH}.{}", hex::encode(name))
}

/// The test name of blob id `id` (the inverse of [`bid`]).
fn name_of(id: &str) -> String {
    id.strip_prefix(&format!("e{EPOCH}."))
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| id.to_string())
}

/// Opens write epoch [`EPOCH`] unless it is open already.
fn open_epoch(kv: &MemStore) {
    if epochs::is_open(kv, EPOCH).unwrap() {
        return;
    }
    let a = exec(
        kv,
        Command::OpenEpoch(pb::OpenEpochRequest {
            gateway_id: "test".into(),
            ..Default::default()
        }),
    );
    assert!(
        matches!(
            a,
            Applied::Epoch(pb::OpenEpochResponse { epoch: EPOCH, .. })
        ),
        "{a:?}"
    );
}

/// Creates bucket `name` (and opens the fixtures' write epoch).
fn bucket(kv: &MemStore, name: &str) {
    open_epoch(kv);
    let a = exec(
        kv,
        Command::CreateBucket(pb::CreateBucketRequest {
            name: name.into(),
            now_ms: 1,
            ..Default::default()
        }),
    );
    assert_eq!(a, Applied::Created(true));
}

fn placement(blob: &str) -> pb::Placement {
    pb::Placement {
        blob_id: bid(blob),
        size: 1,
        data_shards: 4,
        parity_shards: 2,
        block_size: 262_144,
        nodes: vec![1, 2, 3, 4, 5, 6],
        missing: vec![],
    }
}

fn object(b: &str, key: &str, blob: &str) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: b.into(),
        key: key.into(),
        size: 1,
        etag: "e".into(),
        parts: vec![pb::PartRecord {
            part_number: 1,
            placement: Some(placement(blob)),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn put(kv: &MemStore, b: &str, key: &str, blob: &str) -> Applied {
    exec(
        kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(object(b, key, blob)),
            ..Default::default()
        }),
    )
}

fn md5_of(data: &[u8]) -> Vec<u8> {
    Md5::digest(data).to_vec()
}

fn upload(kv: &MemStore, b: &str, key: &str, id: &str) {
    let up = pb::UploadRecord {
        bucket: b.into(),
        key: key.into(),
        upload_id: id.into(),
        initiated_ms: 5,
        ..Default::default()
    };
    // Initiated at leader time 5.
    assert_eq!(
        exec_at(
            kv,
            Command::CreateUpload(pb::CreateUploadRequest {
                upload: Some(up),
                ..Default::default()
            }),
            5,
        ),
        Applied::Done
    );
}

fn part(kv: &MemStore, key: &str, id: &str, n: u32, size: u64, body: &[u8], blob: &str) -> Applied {
    let part = pb::PartRecord {
        upload_id: id.into(),
        part_number: n,
        size,
        md5: md5_of(body),
        placement: Some(placement(blob)),
        ..Default::default()
    };
    exec(
        kv,
        Command::PutPart(pb::PutPartRequest {
            bucket: "b".into(),
            key: key.into(),
            part: Some(part),
            ..Default::default()
        }),
    )
}

fn completed(n: u32, body: &[u8]) -> pb::CompletedPart {
    pb::CompletedPart {
        part_number: n,
        etag: format!("\"{}\"", hex::encode(md5_of(body))),
    }
}

/// Completes upload `id` of b/k in an entry stamped at leader time 9.
fn complete(kv: &MemStore, id: &str, parts: Vec<pb::CompletedPart>) -> Applied {
    exec_at(
        kv,
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: id.into(),
            parts,
            now_ms: 9,
            min_part_size: 5 * MIB,
            checksums: None,
            ..Default::default()
        }),
        9,
    )
}

#[test]
fn create_bucket_twice_reports_existing_and_delete_requires_empty() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let again = exec(
        &kv,
        Command::CreateBucket(pb::CreateBucketRequest {
            name: "b".into(),
            now_ms: 2,
            ..Default::default()
        }),
    );
    assert_eq!(again, Applied::Created(false));
    assert_eq!(get_bucket(&kv, "b").unwrap().created_at_ms, 1);

    put(&kv, "b", "k", "blob1");
    let del = exec(
        &kv,
        Command::DeleteBucket(pb::BucketRequest {
            name: "b".into(),
            ..Default::default()
        }),
    );
    assert_eq!(refused_code(&del), Some(ErrorCode::BucketNotEmpty));
    exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "k".into(),
            ..Default::default()
        }),
    );

    upload(&kv, "b", "k", "u1");
    let del = exec(
        &kv,
        Command::DeleteBucket(pb::BucketRequest {
            name: "b".into(),
            ..Default::default()
        }),
    );
    assert_eq!(refused_code(&del), Some(ErrorCode::BucketNotEmpty));
    exec(
        &kv,
        Command::AbortUpload(pb::UploadKey {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u1".into(),
            ..Default::default()
        }),
    );

    assert_eq!(
        exec(
            &kv,
            Command::DeleteBucket(pb::BucketRequest {
                name: "b".into(),
                ..Default::default()
            })
        ),
        Applied::Done
    );
    let del = exec(
        &kv,
        Command::DeleteBucket(pb::BucketRequest {
            name: "b".into(),
            ..Default::default()
        }),
    );
    assert_eq!(refused_code(&del), Some(ErrorCode::NoSuchBucket));
    assert!(list_buckets(&kv).unwrap().is_empty());
}

#[test]
fn objects_are_last_modified_at_leader_time() {
    // A gateway 40 days behind stamps its records day 60; the leader's
    // entries say day 100. The records carry the leader's time, so a
    // 30-day expiry rule cannot take them right after they were written.
    const DAY: i64 = 86_400_000;
    let kv = MemStore::new();
    upload_with_parts(&kv);
    let mut obj = object("b", "single", "single-blob");
    obj.last_modified_ms = 60 * DAY;
    exec_at(
        &kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(obj),
            ..Default::default()
        }),
        100 * DAY,
    );
    assert_eq!(
        get_object(&kv, "b", "single").unwrap().last_modified_ms,
        100 * DAY
    );

    let applied = exec_at(
        &kv,
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u1".into(),
            parts: vec![completed(1, b"part1")],
            now_ms: 60 * DAY,
            min_part_size: 5 * MIB,
            ..Default::default()
        }),
        100 * DAY,
    );
    assert!(refused_code(&applied).is_none(), "{applied:?}");
    assert_eq!(
        get_object(&kv, "b", "k").unwrap().last_modified_ms,
        100 * DAY
    );
}

#[test]
fn put_object_releases_replaced_placements_but_not_on_retry() {
    let kv = MemStore::new();
    assert_eq!(
        refused_code(&put(&kv, "nope", "k", "x")),
        Some(ErrorCode::NoSuchBucket)
    );
    bucket(&kv, "b");
    assert_eq!(put(&kv, "b", "k", "blob1"), Applied::Released(vec![]));
    assert_eq!(
        put(&kv, "b", "k", "blob1"),
        Applied::Released(vec![]),
        "retry releases nothing"
    );
    assert_eq!(
        put(&kv, "b", "k", "blob2"),
        Applied::Released(vec![placement("blob1")])
    );
    assert_eq!(
        get_object(&kv, "b", "k").unwrap().parts[0].placement,
        Some(placement("blob2"))
    );
    let del = exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "k".into(),
            ..Default::default()
        }),
    );
    assert_eq!(del, Applied::Released(vec![placement("blob2")]));
    let del = exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "k".into(),
            ..Default::default()
        }),
    );
    assert_eq!(
        del,
        Applied::Released(vec![]),
        "deleting a missing key is fine"
    );
    assert!(matches!(
        get_object(&kv, "b", "k"),
        Err(SmError::Refused {
            code: ErrorCode::NoSuchKey,
            ..
        })
    ));
    assert!(matches!(
        get_object(&kv, "x", "k"),
        Err(SmError::Refused {
            code: ErrorCode::NoSuchBucket,
            ..
        })
    ));
}

#[test]
fn put_part_replaces_by_number_and_needs_upload() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    assert_eq!(
        refused_code(&part(&kv, "k", "u1", 1, 1, b"x", "p1")),
        Some(ErrorCode::NoSuchUpload)
    );
    upload(&kv, "b", "k", "u1");
    assert_eq!(
        part(&kv, "k", "u1", 1, 1, b"x", "p1"),
        Applied::Released(vec![])
    );
    assert_eq!(
        part(&kv, "k", "u1", 1, 1, b"x", "p1"),
        Applied::Released(vec![])
    );
    assert_eq!(
        part(&kv, "k", "u1", 1, 1, b"y", "p1b"),
        Applied::Released(vec![placement("p1")])
    );
    assert_eq!(
        refused_code(&part(&kv, "k", "u1", 0, 1, b"x", "p0")),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(
        refused_code(&part(&kv, "k", "u1", 10_001, 1, b"x", "p")),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(
        refused_code(&part(&kv, "other", "u1", 2, 1, b"x", "p")),
        Some(ErrorCode::NoSuchUpload)
    );
}

/// Five parts of an upload "u1" on b/k: 1..=3 of 5 MiB, 4 of 1 byte, 5 of 5 MiB.
fn upload_with_parts(kv: &MemStore) {
    bucket(kv, "b");
    upload(kv, "b", "k", "u1");
    for n in 1..=5u32 {
        let size = if n == 4 { 1 } else { 5 * MIB };
        part(
            kv,
            "k",
            "u1",
            n,
            size,
            format!("part{n}").as_bytes(),
            &format!("blob{n}"),
        );
    }
}

#[test]
fn complete_refuses_bad_lists() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    let c = |n| completed(n, format!("part{n}").as_bytes());

    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![])),
        Some(ErrorCode::InvalidPartOrder)
    );
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(2), c(1)])),
        Some(ErrorCode::InvalidPartOrder)
    );
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(1), c(1)])),
        Some(ErrorCode::InvalidPartOrder)
    );
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(1), c(6)])),
        Some(ErrorCode::InvalidPart)
    );
    let wrong_etag = pb::CompletedPart {
        part_number: 2,
        etag: hex::encode(md5_of(b"other")),
    };
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(1), wrong_etag])),
        Some(ErrorCode::InvalidPart)
    );
    // Part 4 (1 byte) may only be last.
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(3), c(4), c(5)])),
        Some(ErrorCode::EntityTooSmall)
    );
    assert_eq!(
        refused_code(&complete(&kv, "nope", vec![c(1)])),
        Some(ErrorCode::NoSuchUpload)
    );
    // Nothing changed by the refusals.
    assert_eq!(get_upload(&kv, "b", "k", "u1").unwrap().upload_id, "u1");
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
    assert_eq!(parts.parts.len(), 5);
}

#[test]
fn complete_builds_object_releases_unlisted_and_is_idempotent() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    put(&kv, "b", "k", "old-blob");
    let list = vec![
        completed(1, b"part1"),
        completed(3, b"part3"),
        completed(4, b"part4"),
    ];
    let Applied::Completed(resp) = complete(&kv, "u1", list.clone()) else {
        panic!("not completed")
    };
    let obj = resp.object.clone().unwrap();

    // ETag = hex(md5(md5(part1) ++ md5(part3) ++ md5(part4))) "-3".
    let mut cat = Vec::new();
    for body in [b"part1", b"part3", b"part4"] {
        cat.extend(md5_of(body));
    }
    assert_eq!(obj.etag, format!("{}-3", hex::encode(md5_of(&cat))));
    assert_eq!(obj.size, 10 * MIB + 1);
    assert_eq!(
        obj.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(),
        [1, 3, 4]
    );
    assert!(obj.multipart);
    assert_eq!(obj.upload_id, "u1");
    assert_eq!(obj.last_modified_ms, 9);
    let mut released: Vec<_> = resp.released.iter().map(|p| name_of(&p.blob_id)).collect();
    released.sort();
    assert_eq!(released, ["blob2", "blob5", "old-blob"]);

    // Upload and all part records are gone.
    assert!(get_upload(&kv, "b", "k", "u1").is_err());
    assert!(
        kv.scan_prefix(crate::store::Space::Parts, b"", 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(get_object(&kv, "b", "k").unwrap(), obj);

    // Completing again with the same list returns the same object.
    let Applied::Completed(again) = complete(&kv, "u1", list) else {
        panic!("not idempotent")
    };
    assert_eq!(again.object.unwrap(), obj);
    assert!(again.released.is_empty());
    // A different list is NoSuchUpload.
    let other = complete(&kv, "u1", vec![completed(1, b"part1")]);
    assert_eq!(refused_code(&other), Some(ErrorCode::NoSuchUpload));
}

fn tag(k: &str, v: &str) -> pb::Tag {
    pb::Tag {
        key: k.into(),
        value: v.into(),
    }
}

fn put_tags(kv: &MemStore, key: &str, tags: Vec<pb::Tag>) -> Applied {
    exec(
        kv,
        Command::PutObjectTagging(pb::PutObjectTaggingRequest {
            bucket: "b".into(),
            key: key.into(),
            tags,
            ..Default::default()
        }),
    )
}

#[test]
fn object_tagging_replaces_tags_only_and_needs_the_object() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "blob-k");
    let before = get_object(&kv, "b", "k").unwrap();
    assert_eq!(
        put_tags(&kv, "k", vec![tag("a", "1"), tag("b", "")]),
        Applied::Done
    );
    let tagged = get_object(&kv, "b", "k").unwrap();
    assert_eq!(tagged.tags, vec![tag("a", "1"), tag("b", "")]);
    // Body, placements, ETag and last-modified are the object's own.
    assert_eq!(
        pb::ObjectRecord {
            tags: vec![],
            ..tagged.clone()
        },
        before
    );
    // Replaced, not merged; empty removes them (DeleteObjectTagging).
    put_tags(&kv, "k", vec![tag("c", "3")]);
    assert_eq!(get_object(&kv, "b", "k").unwrap().tags, vec![tag("c", "3")]);
    put_tags(&kv, "k", vec![]);
    assert_eq!(get_object(&kv, "b", "k").unwrap(), before);
    // Nothing released: the blob is still referenced.
    assert!(
        filter_unreferenced(&kv, &[bid("blob-k")])
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        refused_code(&put_tags(&kv, "missing", vec![tag("a", "1")])),
        Some(ErrorCode::NoSuchKey)
    );
}

#[test]
fn complete_gives_the_object_the_uploads_tags() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let up = pb::UploadRecord {
        bucket: "b".into(),
        key: "k".into(),
        upload_id: "u1".into(),
        tags: vec![tag("team", "x")],
        ..Default::default()
    };
    exec(
        &kv,
        Command::CreateUpload(pb::CreateUploadRequest {
            upload: Some(up),
            ..Default::default()
        }),
    );
    part(&kv, "k", "u1", 1, 7, b"part1", "blob1");
    let Applied::Completed(resp) = complete(&kv, "u1", vec![completed(1, b"part1")]) else {
        panic!("not completed")
    };
    assert_eq!(resp.object.unwrap().tags, vec![tag("team", "x")]);
}

#[test]
fn multipart_etag_matches_known_value() {
    // Two parts whose binary MD5s are those of "a" and "b".
    let a = md5_of(b"a");
    let b = md5_of(b"b");
    let mut cat = a.clone();
    cat.extend(&b);
    let expected = format!("{}-2", hex::encode(md5_of(&cat)));
    assert_eq!(multipart_etag([a.as_slice(), b.as_slice()]), expected);
    assert_eq!(part_etag(&a), "0cc175b9c0f1b6a831c399e269772661");
}

#[test]
fn abort_releases_parts_and_unknown_upload_is_refused() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    let key = pb::UploadKey {
        bucket: "b".into(),
        key: "k".into(),
        upload_id: "u1".into(),
        ..Default::default()
    };
    let Applied::Released(rel) = exec(&kv, Command::AbortUpload(key.clone())) else {
        panic!()
    };
    assert_eq!(rel.len(), 5);
    assert!(
        kv.scan_prefix(crate::store::Space::Parts, b"", 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        refused_code(&exec(&kv, Command::AbortUpload(key))),
        Some(ErrorCode::NoSuchUpload)
    );
}

fn list(
    kv: &MemStore,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: &str,
    max: u32,
) -> pb::ListObjectsResponse {
    list_objects(
        kv,
        &pb::ListObjectsRequest {
            bucket: "b".into(),
            prefix: prefix.into(),
            delimiter: delimiter.map(str::to_string),
            start_after: start_after.into(),
            max_keys: max,
        },
    )
    .unwrap()
}

fn names(r: &pb::ListObjectsResponse) -> Vec<String> {
    r.objects.iter().map(|o| o.key.clone()).collect()
}

/// The listing a sorted model gives: keys after `start_after` under
/// `prefix`, rolled up at the first `delimiter` after the prefix into
/// common prefixes listed when they sort after `start_after`.
fn model_listing(
    keys: &std::collections::BTreeSet<String>,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: &str,
) -> (Vec<String>, Vec<String>) {
    let (mut objects, mut prefixes) = (Vec::new(), Vec::<String>::new());
    for k in keys {
        if !k.starts_with(prefix) || k.as_str() <= start_after {
            continue;
        }
        let rolled = delimiter.and_then(|d| {
            k[prefix.len()..]
                .find(d)
                .map(|i| k[..prefix.len() + i + d.len()].to_string())
        });
        match rolled {
            Some(cp) if cp.as_str() <= start_after => {}
            Some(cp) => {
                if prefixes.last() != Some(&cp) {
                    prefixes.push(cp);
                }
            }
            None => objects.push(k.clone()),
        }
    }
    (objects, prefixes)
}

/// ListObjects paged through next_marker equals a sorted in-memory model
/// over random keys (multi-byte characters, several delimiters, keys equal
/// to prefixes and markers), random prefixes, delimiters, markers and page
/// sizes; every page holds at most max_keys entries and a truncated page
/// exactly max_keys.
#[test]
fn list_objects_matches_a_sorted_model() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    const PIECES: [&str; 6] = ["a", "b", "/", "é", "-", "z/"];
    fn random_name(rng: &mut StdRng, max_pieces: usize) -> String {
        let n = rng.gen_range(0..=max_pieces);
        (0..n)
            .map(|_| PIECES[rng.gen_range(0..PIECES.len())])
            .collect()
    }
    for seed in 0..150 {
        let mut rng = StdRng::seed_from_u64(seed);
        let kv = MemStore::new();
        bucket(&kv, "b");
        let mut keys = std::collections::BTreeSet::new();
        for _ in 0..rng.gen_range(0..60) {
            let k = random_name(&mut rng, 6);
            if !k.is_empty() {
                keys.insert(k);
            }
        }
        for k in &keys {
            put(&kv, "b", k, k);
        }
        for _ in 0..15 {
            let prefix = random_name(&mut rng, 2);
            let delimiter =
                [None, Some("/"), Some("a"), Some("é"), Some("z/")][rng.gen_range(0..5)];
            let start_after = random_name(&mut rng, 3);
            let max = rng.gen_range(1..6u32);
            let want = model_listing(&keys, &prefix, delimiter, &start_after);
            let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
            let mut marker = start_after.clone();
            loop {
                let page = list(&kv, &prefix, delimiter, &marker, max);
                let entries = page.objects.len() + page.common_prefixes.len();
                assert!(entries <= max as usize, "seed {seed}: page over max_keys");
                objects.extend(names(&page));
                prefixes.extend(page.common_prefixes.iter().cloned());
                if !page.is_truncated {
                    break;
                }
                assert_eq!(entries, max as usize, "seed {seed}: short truncated page");
                marker = page.next_marker.clone();
            }
            assert_eq!(
                (objects, prefixes),
                want,
                "seed {seed}: prefix {prefix:?} delimiter {delimiter:?} after {start_after:?} max {max}"
            );
        }
    }
}

/// A delimiter listing over many common prefixes, each with many members,
/// reads about one row per prefix returned, not the prefixes' members.
#[test]
fn a_common_prefix_costs_one_row() {
    let kv = crate::store::hooked::Hooked::new(MemStore::new());
    bucket(&kv.inner, "b");
    for p in 0..100 {
        for m in 0..40 {
            let key = format!("d{p:03}/m{m:03}");
            put(&kv.inner, "b", &key, &key);
        }
    }
    put(&kv.inner, "b", "top", "top");
    let read = |req: pb::ListObjectsRequest| {
        let before = kv.rows_read.load(std::sync::atomic::Ordering::Relaxed);
        let page = list_objects(&kv, &req).unwrap();
        let rows = kv.rows_read.load(std::sync::atomic::Ordering::Relaxed) - before;
        (page, rows)
    };
    let (page, rows) = read(pb::ListObjectsRequest {
        bucket: "b".into(),
        delimiter: Some("/".into()),
        max_keys: 1000,
        ..Default::default()
    });
    assert_eq!(page.common_prefixes.len(), 100);
    assert_eq!(names(&page), ["top"]);
    assert!(rows <= 2 * 101, "{rows} rows read for 101 entries");
    // A small page reads about a page, not a chunk.
    let (page, rows) = read(pb::ListObjectsRequest {
        bucket: "b".into(),
        prefix: "d050/".into(),
        max_keys: 3,
        ..Default::default()
    });
    assert_eq!(names(&page), ["d050/m000", "d050/m001", "d050/m002"]);
    assert!(rows <= 4, "{rows} rows read for a page of 3");
}

#[test]
fn list_objects_prefix_delimiter_max_keys_start_after() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    bucket(&kv, "b2");
    put(&kv, "b2", "a", "x");
    for k in ["a", "b/1", "b/2", "b/3/x", "c", "d/1", "e", "é", "Z"] {
        put(&kv, "b", k, k);
    }
    let all = list(&kv, "", None, "", 0);
    assert_eq!(
        names(&all),
        ["Z", "a", "b/1", "b/2", "b/3/x", "c", "d/1", "e", "é"]
    );
    assert!(!all.is_truncated);
    assert!(all.objects.iter().all(|o| o.parts.is_empty()));

    let d = list(&kv, "", Some("/"), "", 0);
    assert_eq!(names(&d), ["Z", "a", "c", "e", "é"]);
    assert_eq!(d.common_prefixes, ["b/", "d/"]);

    // Common prefixes count once toward max_keys; pages continue from next_marker.
    let p1 = list(&kv, "", Some("/"), "", 3);
    assert_eq!(names(&p1), ["Z", "a"]);
    assert_eq!(p1.common_prefixes, ["b/"]);
    assert!(p1.is_truncated);
    assert_eq!(p1.next_marker, "b/");
    let p2 = list(&kv, "", Some("/"), &p1.next_marker, 3);
    assert_eq!(names(&p2), ["c", "e"]);
    assert_eq!(p2.common_prefixes, ["d/"]);
    assert!(p2.is_truncated);
    assert_eq!(p2.next_marker, "e");
    let p3 = list(&kv, "", Some("/"), &p2.next_marker, 3);
    assert_eq!(names(&p3), ["é"]);
    assert!(!p3.is_truncated);

    let sub = list(&kv, "b/", Some("/"), "", 0);
    assert_eq!(names(&sub), ["b/1", "b/2"]);
    assert_eq!(sub.common_prefixes, ["b/3/"]);
    let after = list(&kv, "b/", None, "b/1", 0);
    assert_eq!(names(&after), ["b/2", "b/3/x"]);
    let before_prefix = list(&kv, "b/", None, "a", 0);
    assert_eq!(names(&before_prefix), ["b/1", "b/2", "b/3/x"]);
    let exact = list(&kv, "", None, "", 9);
    assert!(
        !exact.is_truncated,
        "exactly max_keys entries is not truncated"
    );
    let trunc = list(&kv, "", None, "", 2);
    assert!(trunc.is_truncated);
    assert_eq!(trunc.next_marker, "a");

    let missing = list_objects(
        &kv,
        &pb::ListObjectsRequest {
            bucket: "none".into(),
            ..Default::default()
        },
    );
    assert!(matches!(
        missing,
        Err(SmError::Refused {
            code: ErrorCode::NoSuchBucket,
            ..
        })
    ));
}

fn uploads(
    kv: &MemStore,
    prefix: &str,
    delimiter: Option<&str>,
    key_marker: &str,
    id_marker: &str,
    max: u32,
) -> pb::ListUploadsResponse {
    list_uploads(
        kv,
        &pb::ListUploadsRequest {
            bucket: "b".into(),
            prefix: prefix.into(),
            delimiter: delimiter.map(str::to_string),
            key_marker: key_marker.into(),
            upload_id_marker: id_marker.into(),
            max_uploads: max,
        },
    )
    .unwrap()
}

fn pairs(r: &pb::ListUploadsResponse) -> Vec<(String, String)> {
    r.uploads
        .iter()
        .map(|u| (u.key.clone(), u.upload_id.clone()))
        .collect()
}

fn p(k: &str, id: &str) -> (String, String) {
    (k.to_string(), id.to_string())
}

#[test]
fn list_uploads_markers_follow_s3() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    for (k, id) in [
        ("a", "2"),
        ("a", "1"),
        ("a/x", "1"),
        ("b", "1"),
        ("c/1", "1"),
        ("c/2", "1"),
    ] {
        upload(&kv, "b", k, id);
    }
    let all = uploads(&kv, "", None, "", "", 0);
    assert_eq!(
        pairs(&all),
        [
            p("a", "1"),
            p("a", "2"),
            p("a/x", "1"),
            p("b", "1"),
            p("c/1", "1"),
            p("c/2", "1")
        ]
    );

    // key_marker only: keys strictly after it.
    assert_eq!(
        pairs(&uploads(&kv, "", None, "a", "", 0)),
        [p("a/x", "1"), p("b", "1"), p("c/1", "1"), p("c/2", "1")]
    );
    // Both markers: same key with a later id, then later keys.
    assert_eq!(
        pairs(&uploads(&kv, "", None, "a", "1", 2)),
        [p("a", "2"), p("a/x", "1")]
    );
    // upload_id_marker alone is ignored.
    assert_eq!(uploads(&kv, "", None, "", "9", 0).uploads.len(), 6);

    let page = uploads(&kv, "", None, "", "", 2);
    assert!(page.is_truncated);
    assert_eq!(
        (
            page.next_key_marker.as_str(),
            page.next_upload_id_marker.as_str()
        ),
        ("a", "2")
    );
    let next = uploads(
        &kv,
        "",
        None,
        &page.next_key_marker,
        &page.next_upload_id_marker,
        2,
    );
    assert_eq!(pairs(&next), [p("a/x", "1"), p("b", "1")]);

    let d = uploads(&kv, "", Some("/"), "", "", 0);
    assert_eq!(pairs(&d), [p("a", "1"), p("a", "2"), p("b", "1")]);
    assert_eq!(d.common_prefixes, ["a/", "c/"]);
    let d = uploads(&kv, "c", Some("/"), "", "", 0);
    assert!(d.uploads.is_empty());
    assert_eq!(d.common_prefixes, ["c/"]);
}

#[test]
fn list_parts_pages_by_marker() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    let req = |marker, max| pb::ListPartsRequest {
        bucket: "b".into(),
        key: "k".into(),
        upload_id: "u1".into(),
        part_number_marker: marker,
        max_parts: max,
    };
    let r = list_parts(&kv, &req(0, 2)).unwrap();
    assert_eq!(
        r.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(r.is_truncated);
    assert_eq!(r.next_part_number_marker, 2);
    let r = list_parts(&kv, &req(2, 0)).unwrap();
    assert_eq!(
        r.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert!(!r.is_truncated);
    let missing = list_parts(
        &kv,
        &pb::ListPartsRequest {
            upload_id: "zz".into(),
            ..req(0, 0)
        },
    );
    assert!(matches!(
        missing,
        Err(SmError::Refused {
            code: ErrorCode::NoSuchUpload,
            ..
        })
    ));
}

#[test]
fn register_datanode_upserts_address() {
    let kv = MemStore::new();
    exec(
        &kv,
        Command::RegisterDatanode(pb::RegisterDatanodeRequest {
            id: 2,
            addr: "http://a".into(),
            ..Default::default()
        }),
    );
    exec(
        &kv,
        Command::RegisterDatanode(pb::RegisterDatanodeRequest {
            id: 1,
            addr: "http://b".into(),
            ..Default::default()
        }),
    );
    exec(
        &kv,
        Command::RegisterDatanode(pb::RegisterDatanodeRequest {
            id: 2,
            addr: "http://c".into(),
            ..Default::default()
        }),
    );
    let nodes = list_datanodes(&kv).unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| (n.id, n.addr.as_str()))
            .collect::<Vec<_>>(),
        [(1, "http://b"), (2, "http://c")]
    );
}

mod access;
mod cluster_version;
mod datanodes;
mod exactly_once;
mod heal;
mod records;
mod refs;
mod settings;
mod versions;

fn put_config(kv: &MemStore, name: &str, config: pb::put_bucket_config_request::Config) -> Applied {
    exec(
        kv,
        Command::PutBucketConfig(pb::PutBucketConfigRequest {
            name: name.into(),
            config: Some(config),
            op_id: String::new(),
        }),
    )
}

#[test]
fn bucket_config_replaces_one_subresource_and_keeps_the_others() {
    use pb::put_bucket_config_request::Config;
    let kv = MemStore::new();
    exec(
        &kv,
        Command::CreateBucket(pb::CreateBucketRequest {
            name: "b".into(),
            now_ms: 7,
            owner_key_id: "SK1".into(),
            acl: pb::CannedAcl::AclPublicRead.into(),
            ..Default::default()
        }),
    );
    let created = get_bucket(&kv, "b").unwrap();
    assert_eq!(created.acl(), pb::CannedAcl::AclPublicRead);
    assert_eq!(created.owner_key_id, "SK1");
    assert_eq!(created.created_at_ms, 7);

    let rule = pb::CorsRule {
        allowed_methods: vec!["GET".into()],
        allowed_origins: vec!["*".into()],
        max_age_seconds: Some(60),
        ..Default::default()
    };
    let tags = vec![tag("team", "x")];
    for config in [
        Config::Tags(pb::BucketTags { tags: tags.clone() }),
        Config::Policy("{}".into()),
        Config::Cors(pb::BucketCors {
            rules: vec![rule.clone()],
        }),
        Config::Acl(pb::CannedAcl::AclAuthenticatedRead.into()),
    ] {
        assert_eq!(put_config(&kv, "b", config), Applied::Done);
    }
    let b = get_bucket(&kv, "b").unwrap();
    assert_eq!(
        b,
        pb::Bucket {
            name: "b".into(),
            created_at_ms: 7,
            tags: tags.clone(),
            acl: pb::CannedAcl::AclAuthenticatedRead.into(),
            policy: "{}".into(),
            cors: vec![rule],
            owner_key_id: "SK1".into(),
            lifecycle: vec![],
            versioning: 0,
        }
    );
    // An empty value deletes that subresource only.
    put_config(&kv, "b", Config::Cors(pb::BucketCors::default()));
    put_config(&kv, "b", Config::Policy(String::new()));
    let b = get_bucket(&kv, "b").unwrap();
    assert!(b.cors.is_empty() && b.policy.is_empty());
    assert_eq!(b.tags, tags);
    assert_eq!(
        refused_code(&put_config(&kv, "nope", Config::Policy("{}".into()))),
        Some(ErrorCode::NoSuchBucket)
    );
}

#[test]
fn object_acl_replaces_the_acl_only() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "blob-k");
    let before = get_object(&kv, "b", "k").unwrap();
    let set = |key: &str| {
        exec(
            &kv,
            Command::PutObjectAcl(pb::PutObjectAclRequest {
                bucket: "b".into(),
                key: key.into(),
                acl: pb::CannedAcl::AclPublicRead.into(),
                ..Default::default()
            }),
        )
    };
    assert_eq!(set("k"), Applied::Done);
    let after = get_object(&kv, "b", "k").unwrap();
    assert_eq!(after.acl(), pb::CannedAcl::AclPublicRead);
    assert_eq!(pb::ObjectRecord { acl: 0, ..after }, before);
    assert_eq!(refused_code(&set("missing")), Some(ErrorCode::NoSuchKey));
}

#[test]
fn lifecycle_expires_only_the_version_it_saw() {
    use sluice_proto::raft as rpb;
    let kv = MemStore::new();
    bucket(&kv, "b");
    exec(
        &kv,
        Command::PutBucketConfig(pb::PutBucketConfigRequest {
            name: "b".into(),
            config: Some(pb::put_bucket_config_request::Config::Lifecycle(
                pb::BucketLifecycle {
                    rules: vec![pb::LifecycleRule {
                        enabled: true,
                        prefix: "logs/".into(),
                        expiration_days: 1,
                        ..Default::default()
                    }],
                },
            )),
            op_id: String::new(),
        }),
    );
    put(&kv, "b", "logs/old", "blob-old");
    put(&kv, "b", "logs/replaced", "blob-r1");
    put(&kv, "b", "keep/x", "blob-x");
    let b = get_bucket(&kv, "b").unwrap();
    // Every record was written at last_modified 0; one day is 10 ms here.
    let page = lifecycle::expired_objects(&kv, &b, None, 10, 10, 100).unwrap();
    let keys: Vec<&str> = page.found.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["logs/old", "logs/replaced"]);
    assert_eq!(page.next, None);
    // A small page stops after its last record (keep/x, logs/old).
    let first = lifecycle::expired_objects(&kv, &b, None, 10, 10, 2).unwrap();
    assert_eq!(first.found.len(), 1);
    assert_eq!(first.found[0].key, "logs/old");
    let second = lifecycle::expired_objects(&kv, &b, first.next.as_deref(), 10, 10, 2).unwrap();
    assert_eq!(second.found[0].key, "logs/replaced");
    assert_eq!(second.next, None);

    // The fault this guards against: a PUT lands between the scan and the
    // expiration; the new object must survive a rule evaluated on the old.
    let mut newer = object("b", "logs/replaced", "blob-r2");
    newer.etag = "e2".into();
    newer.last_modified_ms = 5;
    exec_at(
        &kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(newer.clone()),
            ..Default::default()
        }),
        5,
    );
    let mut listed = page.found.clone();
    listed.push(listed[0].clone()); // a duplicate is expired once
    let expire = |objects: Vec<rpb::ExpireObject>, now_ms: i64| {
        exec_at(
            &kv,
            Command::ExpireObjects(rpb::ExpireObjects {
                objects,
                day_ms: 10,
            }),
            now_ms,
        )
    };
    // Applied before the rule's day has passed (leader time 9): nothing.
    assert_eq!(expire(listed.clone(), 9), Applied::Released(vec![]));
    let Applied::Released(released) = expire(listed, 10) else {
        panic!("not applied")
    };
    let ids: Vec<String> = released.iter().map(|p| p.blob_id.clone()).collect();
    assert_eq!(ids, [bid("blob-old")]);
    assert_eq!(
        refused_code(&exec(
            &kv,
            Command::DeleteObject(pb::ObjectKey {
                bucket: "b".into(),
                key: "logs/old".into(),
                ..Default::default()
            })
        )),
        None,
        "deleting a missing key is not an error"
    );
    assert!(get_object(&kv, "b", "logs/old").is_err());
    assert_eq!(get_object(&kv, "b", "logs/replaced").unwrap(), newer);
    assert!(get_object(&kv, "b", "keep/x").is_ok());
    // The rules are read when the entry is applied: an object the sweeper
    // found before the configuration was deleted is left alone.
    put(&kv, "b", "logs/late", "blob-late");
    let b = get_bucket(&kv, "b").unwrap();
    let found = lifecycle::expired_objects(&kv, &b, None, 10, 10, 100)
        .unwrap()
        .found;
    assert_eq!(found.len(), 1);
    put_config(
        &kv,
        "b",
        pb::put_bucket_config_request::Config::Lifecycle(pb::BucketLifecycle::default()),
    );
    assert_eq!(expire(found, 10), Applied::Released(vec![]));
    assert!(get_object(&kv, "b", "logs/late").is_ok());
    // The expired blob left the reference index; the kept ones did not.
    assert_eq!(
        filter_unreferenced(&kv, &[bid("blob-old"), bid("blob-r2"), bid("blob-x")]).unwrap(),
        vec![bid("blob-old")]
    );
}

#[test]
fn conditional_writes_are_checked_in_the_commit_entry() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let put_if = |blob: &str, etag: &str, condition: pb::WriteCondition| {
        let mut obj = object("b", "k", blob);
        obj.etag = etag.into();
        exec(
            &kv,
            Command::PutObject(pb::PutObjectRequest {
                object: Some(obj),
                condition: Some(condition),
                op_id: String::new(),
            }),
        )
    };
    let absent = pb::WriteCondition {
        if_none_match_any: true,
        ..Default::default()
    };
    // If-Match on a missing key is NoSuchKey, as S3 answers.
    let must_match = |etag: &str| pb::WriteCondition {
        if_match_etag: etag.into(),
        ..Default::default()
    };
    assert_eq!(
        refused_code(&put_if("blob-0", "e0", must_match("e1"))),
        Some(ErrorCode::NoSuchKey)
    );
    // Two writers that both checked "absent" before writing: one commits.
    assert!(matches!(
        put_if("blob-1", "e1", absent.clone()),
        Applied::Released(_)
    ));
    assert_eq!(
        refused_code(&put_if("blob-2", "e2", absent)),
        Some(ErrorCode::PreconditionFailed)
    );
    assert_eq!(get_object(&kv, "b", "k").unwrap().etag, "e1");
    // If-Match: only against the current ETag.
    assert_eq!(
        refused_code(&put_if("blob-3", "e3", must_match("e0"))),
        Some(ErrorCode::PreconditionFailed)
    );
    assert!(matches!(
        put_if("blob-3", "e3", must_match("e1")),
        Applied::Released(_)
    ));
    assert_eq!(get_object(&kv, "b", "k").unwrap().etag, "e3");
    // The refused writes' blobs were never referenced.
    assert_eq!(
        filter_unreferenced(&kv, &[bid("blob-2"), bid("blob-3")]).unwrap(),
        vec![bid("blob-2")]
    );
    let not_this = pb::WriteCondition {
        if_none_match_etag: "e3".into(),
        ..Default::default()
    };
    assert_eq!(
        refused_code(&put_if("blob-4", "e4", not_this)),
        Some(ErrorCode::PreconditionFailed)
    );
}

/// A lifecycle entry without the length of a day is refused whole, so no
/// object or upload is judged by its ETag alone.
#[test]
fn lifecycle_entries_without_day_ms_are_refused() {
    use sluice_proto::raft as rpb;
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "blob-k");
    upload(&kv, "b", "k", "u1");
    let key = get_object(&kv, "b", "k").unwrap();
    for day_ms in [0, -1] {
        let objects = exec_at(
            &kv,
            Command::ExpireObjects(rpb::ExpireObjects {
                objects: vec![rpb::ExpireObject {
                    bucket: "b".into(),
                    key: "k".into(),
                    etag: key.etag.clone(),
                    last_modified_ms: key.last_modified_ms,
                    version_id: String::new(),
                }],
                day_ms,
            }),
            1_000_000,
        );
        let uploads = exec_at(
            &kv,
            Command::ExpireUploads(rpb::ExpireUploads {
                uploads: vec![pb::UploadKey {
                    bucket: "b".into(),
                    key: "k".into(),
                    upload_id: "u1".into(),
                    ..Default::default()
                }],
                day_ms,
            }),
            1_000_000,
        );
        for applied in [objects, uploads] {
            let Applied::Refused { code, message } = &applied else {
                panic!("{applied:?}")
            };
            assert_eq!(*code, ErrorCode::InvalidArgument);
            assert!(message.contains(&format!("day_ms {day_ms}")), "{message}");
        }
    }
    assert!(get_object(&kv, "b", "k").is_ok());
    assert!(get_upload(&kv, "b", "k", "u1").is_ok());
}

#[test]
fn lifecycle_aborts_only_uploads_the_rules_still_select() {
    use sluice_proto::raft as rpb;
    let kv = MemStore::new();
    bucket(&kv, "b");
    let abort_rule = pb::put_bucket_config_request::Config::Lifecycle(pb::BucketLifecycle {
        rules: vec![pb::LifecycleRule {
            enabled: true,
            prefix: "tmp/".into(),
            abort_incomplete_days: 1,
            ..Default::default()
        }],
    });
    put_config(&kv, "b", abort_rule.clone());
    // Initiated at 5; a day is 10 ms here.
    upload(&kv, "b", "tmp/u", "u1");
    part(&kv, "tmp/u", "u1", 1, 3, b"abc", "blob-u1");
    upload(&kv, "b", "keep/u", "u2");
    let b = get_bucket(&kv, "b").unwrap();
    let found = lifecycle::expired_uploads(&kv, &b, None, 15, 10, 100)
        .unwrap()
        .found;
    let ids: Vec<&str> = found.iter().map(|u| u.upload_id.as_str()).collect();
    assert_eq!(ids, ["u1"]);
    let expire = |now_ms: i64| {
        exec_at(
            &kv,
            Command::ExpireUploads(rpb::ExpireUploads {
                uploads: found.clone(),
                day_ms: 10,
            }),
            now_ms,
        )
    };
    // Before the day is over: nothing.
    assert_eq!(expire(14), Applied::Released(vec![]));
    // The configuration deleted after the page was read: nothing.
    put_config(
        &kv,
        "b",
        pb::put_bucket_config_request::Config::Lifecycle(pb::BucketLifecycle::default()),
    );
    assert_eq!(expire(15), Applied::Released(vec![]));
    put_config(&kv, "b", abort_rule);
    let Applied::Released(released) = expire(15) else {
        panic!("not applied")
    };
    let ids: Vec<String> = released.iter().map(|p| p.blob_id.clone()).collect();
    assert_eq!(ids, [bid("blob-u1")]);
    assert_eq!(
        refused_code(&exec(
            &kv,
            Command::AbortUpload(pb::UploadKey {
                bucket: "b".into(),
                key: "tmp/u".into(),
                upload_id: "u1".into(),
                op_id: String::new(),
            })
        )),
        Some(ErrorCode::NoSuchUpload),
        "aborted"
    );
    // Applied again (a replayed page): nothing left to abort.
    assert_eq!(expire(15), Applied::Released(vec![]));
}
