//! The reference index kept by every mutation, `filter_unreferenced`,
//! the index derived from the records, and the stale-upload scan.

use std::collections::BTreeSet;

use super::*;
use crate::sm::refs::{all_references, rebuild_index};
use crate::store::{Batch, Space};

/// The index as a set.
fn refs(kv: &MemStore) -> BTreeSet<String> {
    all_references(kv)
        .unwrap()
        .iter()
        .map(|id| name_of(id))
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// The blob ids of test blobs `names`.
fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| bid(s)).collect()
}

fn delete_object(kv: &MemStore, key: &str) -> Applied {
    exec(
        kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: key.into(),
            ..Default::default()
        }),
    )
}

fn abort(kv: &MemStore, key: &str, id: &str) -> Applied {
    exec(
        kv,
        Command::AbortUpload(pb::UploadKey {
            bucket: "b".into(),
            key: key.into(),
            upload_id: id.into(),
            ..Default::default()
        }),
    )
}

#[test]
fn put_part_and_replace_part() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    upload(&kv, "b", "k", "u1");
    part(&kv, "k", "u1", 1, 1, b"x", "p1");
    part(&kv, "k", "u1", 2, 1, b"y", "p2");
    assert_eq!(refs(&kv), set(&["p1", "p2"]));
    // A retried commit of the same part changes nothing.
    part(&kv, "k", "u1", 1, 1, b"x", "p1");
    assert_eq!(refs(&kv), set(&["p1", "p2"]));
    // Re-uploading part 1 replaces its blob.
    assert_eq!(
        part(&kv, "k", "u1", 1, 1, b"z", "p1b"),
        Applied::Released(vec![placement("p1")])
    );
    assert_eq!(refs(&kv), set(&["p1b", "p2"]));
    // A refused part (no such upload) references nothing.
    part(&kv, "k", "nope", 1, 1, b"x", "px");
    assert_eq!(refs(&kv), set(&["p1b", "p2"]));
}

#[test]
fn complete_keeps_listed_parts_and_drops_unlisted_and_replaced() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    // An object already at b/k, replaced by the completed upload.
    put(&kv, "b", "k", "old");
    assert_eq!(
        refs(&kv),
        set(&["blob1", "blob2", "blob3", "blob4", "blob5", "old"])
    );
    let c = |n: u32| completed(n, format!("part{n}").as_bytes());

    // A refused Complete (part 4 is too small to be followed) changes nothing.
    assert_eq!(
        refused_code(&complete(&kv, "u1", vec![c(3), c(4), c(5)])),
        Some(ErrorCode::EntityTooSmall)
    );
    assert_eq!(refs(&kv).len(), 6);

    // Parts 2 and 4 are not listed.
    let done = complete(&kv, "u1", vec![c(1), c(3), c(5)]);
    let Applied::Completed(resp) = done else {
        panic!("complete: {done:?}")
    };
    let released: BTreeSet<String> = resp.released.iter().map(|p| name_of(&p.blob_id)).collect();
    assert_eq!(released, set(&["blob2", "blob4", "old"]));
    assert_eq!(refs(&kv), set(&["blob1", "blob3", "blob5"]));
    // Re-completing the same list is answered from the object, unchanged.
    complete(&kv, "u1", vec![c(1), c(3), c(5)]);
    assert_eq!(refs(&kv), set(&["blob1", "blob3", "blob5"]));
    // Deleting the multipart object releases every part's blob.
    delete_object(&kv, "k");
    assert!(refs(&kv).is_empty());
}

#[test]
fn abort_drops_every_part() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    upload(&kv, "b", "k2", "u2");
    part(&kv, "k2", "u2", 1, 1, b"x", "other");
    abort(&kv, "k", "u1");
    assert_eq!(refs(&kv), set(&["other"]));
    assert_eq!(
        refused_code(&abort(&kv, "k", "u1")),
        Some(ErrorCode::NoSuchUpload)
    );
    assert_eq!(refs(&kv), set(&["other"]));
}

#[test]
fn delete_and_overwrite_object() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "a", "a1");
    put(&kv, "b", "c", "c1");
    assert_eq!(refs(&kv), set(&["a1", "c1"]));
    // A retried PUT of the same record keeps its blob.
    put(&kv, "b", "a", "a1");
    assert_eq!(refs(&kv), set(&["a1", "c1"]));
    // Overwrite: the old blob goes, the new one comes.
    put(&kv, "b", "a", "a2");
    assert_eq!(refs(&kv), set(&["a2", "c1"]));
    delete_object(&kv, "c");
    assert_eq!(refs(&kv), set(&["a2"]));
    // Deleting a missing key touches nothing.
    delete_object(&kv, "c");
    assert_eq!(refs(&kv), set(&["a2"]));

    // An object of several parts (as CompleteUpload writes) is indexed whole.
    let mut multi = object("b", "m", "m1");
    multi.parts.push(pb::PartRecord {
        part_number: 2,
        placement: Some(placement("m2")),
        ..Default::default()
    });
    multi.parts.push(pb::PartRecord {
        part_number: 3,
        placement: None,
        ..Default::default()
    });
    exec(
        &kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(multi),
            ..Default::default()
        }),
    );
    assert_eq!(refs(&kv), set(&["a2", "m1", "m2"]));
    put(&kv, "b", "m", "m3");
    assert_eq!(refs(&kv), set(&["a2", "m3"]));
}

#[test]
fn filter_unreferenced_answers_in_request_order() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "obj");
    upload(&kv, "b", "k", "u1");
    part(&kv, "k", "u1", 1, 1, b"x", "prt");
    assert_eq!(
        filter_unreferenced(&kv, &ids(&["zz", "obj", "aa", "prt", "zz"])).unwrap(),
        ids(&["zz", "aa", "zz"])
    );
    assert!(filter_unreferenced(&kv, &[]).unwrap().is_empty());
    let max: Vec<String> = (0..MAX_FILTER_IDS).map(|i| format!("x{i}")).collect();
    assert_eq!(
        filter_unreferenced(&kv, &max).unwrap().len(),
        MAX_FILTER_IDS
    );
    let too_many: Vec<String> = (0..=MAX_FILTER_IDS).map(|i| format!("x{i}")).collect();
    assert!(matches!(
        filter_unreferenced(&kv, &too_many),
        Err(SmError::Refused {
            code: ErrorCode::InvalidArgument,
            ..
        })
    ));
}

/// The index mutations keep is exactly the one the records derive.
#[test]
fn the_kept_index_is_the_one_the_records_derive() {
    let kv = MemStore::new();
    upload_with_parts(&kv);
    for i in 0..2000 {
        put(&kv, "b", &format!("k{i:04}"), &format!("o{i:04}"));
    }
    let expected = refs(&kv);
    assert_eq!(expected.len(), 2005);
    let mut wipe = Batch::new();
    for id in &expected {
        wipe.delete(Space::Refs, bid(id).into_bytes());
    }
    wipe.put(Space::Refs, b"ghost".to_vec(), Vec::new());
    kv.apply(wipe).unwrap();

    assert_eq!(rebuild_index(&kv).unwrap(), 2005);
    assert_eq!(refs(&kv), expected);
}

fn upload_at(kv: &MemStore, bucket: &str, key: &str, id: &str, initiated_ms: i64) {
    let up = pb::UploadRecord {
        bucket: bucket.into(),
        key: key.into(),
        upload_id: id.into(),
        initiated_ms,
        ..Default::default()
    };
    exec_at(
        kv,
        Command::CreateUpload(pb::CreateUploadRequest {
            upload: Some(up),
            ..Default::default()
        }),
        initiated_ms,
    );
}

#[test]
fn stale_uploads_pages_through_every_bucket() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    bucket(&kv, "c");
    let mut old = BTreeSet::new();
    for i in 0..60u32 {
        let bucket = if i % 2 == 0 { "b" } else { "c" };
        // Every third upload is old (initiated at 1000 + i, cutoff 5000).
        let at = if i % 3 == 0 {
            1000 + i64::from(i)
        } else {
            9000
        };
        let id = format!("u{i:02}");
        upload_at(&kv, bucket, &format!("key{}", i % 7), &id, at);
        if at < 5000 {
            old.insert(id);
        }
    }
    let mut found = BTreeSet::new();
    let mut pages = 0;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = stale_uploads(&kv, after.as_deref(), 5000, 7).unwrap();
        pages += 1;
        for u in page.stale {
            assert!(u.bucket == "b" || u.bucket == "c");
            assert!(found.insert(u.upload_id), "each upload once");
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(found, old);
    assert_eq!(found.len(), 20);
    assert_eq!(pages, 9, "60 uploads in pages of 7");
    // The cutoff is exclusive: initiated exactly at it is not stale.
    let at_cutoff = stale_uploads(&kv, None, 1000, 100).unwrap();
    assert!(at_cutoff.stale.is_empty() && at_cutoff.next.is_none());
}
