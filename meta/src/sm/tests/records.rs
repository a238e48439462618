//! Object records as head and manifest rows (`sm::records`): listings and
//! HEAD read no part list; GET never joins a head with the manifest of
//! another write.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::store::hooked::{Access, Hooked};

/// A record of `parts` parts, each its own blob `<blob>.<n>`.
fn many_parts(b: &str, key: &str, blob: &str, parts: u32) -> pb::ObjectRecord {
    pb::ObjectRecord {
        bucket: b.into(),
        key: key.into(),
        size: u64::from(parts),
        etag: format!("{blob}-{parts}"),
        multipart: true,
        parts: (1..=parts)
            .map(|n| pb::PartRecord {
                part_number: n,
                size: 1,
                placement: Some(placement(&format!("{blob}.{n}"))),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn put_record(kv: &MemStore, record: pb::ObjectRecord) {
    let a = exec(
        kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(record),
            ..Default::default()
        }),
    );
    assert!(
        matches!(a, Applied::Released(_) | Applied::Versioned { .. }),
        "{a:?}"
    );
}

#[test]
fn listings_and_head_read_no_part_list() {
    let kv = Hooked::new(MemStore::new());
    bucket(&kv.inner, "b");
    for i in 0..20 {
        put_record(
            &kv.inner,
            many_parts("b", &format!("k{i:02}"), &format!("o{i}"), 1000),
        );
    }
    let manifest_reads = Arc::new(AtomicU32::new(0));
    let counter = manifest_reads.clone();
    kv.set_hook(move |access, _| {
        if matches!(
            access,
            Access::Get(Space::Manifests) | Access::Scan(Space::Manifests)
        ) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });

    let page = list_objects(
        &kv,
        &pb::ListObjectsRequest {
            bucket: "b".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(page.objects.len(), 20);
    assert!(
        page.objects
            .iter()
            .all(|o| o.parts.is_empty() && o.part_count == 1000)
    );
    let versions = list_versions(
        &kv,
        &pb::ListVersionsRequest {
            bucket: "b".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(versions.versions.len(), 20);
    let head = get_version_as(&kv, "b", "k07", "", true, false).unwrap();
    assert_eq!(
        (head.etag.as_str(), head.part_count, head.parts.len()),
        ("o7-1000", 1000, 0)
    );
    assert_eq!(head.manifest_crc64, 0, "storage fields stay inside meta");
    assert_eq!(manifest_reads.load(Ordering::Relaxed), 0);

    // GET reads the whole record: head and manifest.
    let whole = get_version(&kv, "b", "k07", "", true).unwrap();
    assert_eq!(manifest_reads.load(Ordering::Relaxed), 1);
    assert_eq!(whole, {
        let mut r = many_parts("b", "k07", "o7", 1000);
        r.seq = whole.seq;
        r.version_id = whole.version_id.clone();
        r
    });
}

/// A GET whose head read is followed, before its manifest read, by an
/// overwrite (the read RPCs run beside applies) answers the new record
/// whole, never the old head with the new part list.
#[test]
fn a_read_racing_an_overwrite_answers_one_write_whole() {
    let kv = Arc::new(Hooked::new(MemStore::new()));
    bucket(&kv.inner, "b");
    put_record(&kv.inner, many_parts("b", "k", "old", 3));
    let landed = Arc::new(AtomicBool::new(false));
    let flag = landed.clone();
    kv.set_hook(move |access, inner| {
        if access == Access::Got(Space::Objects) && !flag.swap(true, Ordering::Relaxed) {
            put_record(inner, many_parts("b", "k", "new", 5));
        }
    });
    let read = get_version(kv.as_ref(), "b", "k", "", false).unwrap();
    assert!(
        landed.load(Ordering::Relaxed),
        "the overwrite landed between the reads"
    );
    assert_eq!(read.etag, "new-5");
    assert_eq!(read.parts.len(), 5);
    assert!(read.parts.iter().all(|p| {
        p.placement
            .as_ref()
            .unwrap()
            .blob_id
            .starts_with(&bid("new."))
    }));

    // Overwrites landing after every head read: the read gives up with
    // Torn (the client retries) instead of answering a mix.
    let n = Arc::new(Mutex::new(0u32));
    let count = n.clone();
    kv.set_hook(move |access, inner| {
        if access == Access::Got(Space::Objects) {
            let mut n = count.lock().unwrap();
            *n += 1;
            put_record(inner, many_parts("b", "k", &format!("w{n}"), 2 + *n % 3));
        }
    });
    assert!(matches!(
        get_version(kv.as_ref(), "b", "k", "", false),
        Err(SmError::Torn(Space::Objects))
    ));
    kv.clear_hook();
    let last = *n.lock().unwrap();
    let now = get_version(kv.as_ref(), "b", "k", "", false).unwrap();
    assert_eq!(now.etag, format!("w{last}-{}", 2 + last % 3));
}

/// Versioning moves a record between `Objects` and `Versions`: its
/// manifest moves with it, and deleting a version removes its manifest.
#[test]
fn manifests_follow_their_records_through_versioning() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    super::versions::set_versioning(&kv, "b", pb::Versioning::Enabled);
    put_record(&kv, many_parts("b", "k", "v1", 4));
    put_record(&kv, many_parts("b", "k", "v2", 6));
    let listed = list_versions(
        &kv,
        &pb::ListVersionsRequest {
            bucket: "b".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let ids: Vec<(String, u32)> = listed
        .versions
        .iter()
        .map(|v| {
            let o = v.object.as_ref().unwrap();
            (o.version_id.clone(), o.part_count)
        })
        .collect();
    assert_eq!(ids.iter().map(|i| i.1).collect::<Vec<_>>(), [6, 4]);
    let old = get_version(&kv, "b", "k", &ids[1].0, false).unwrap();
    assert_eq!((old.etag.as_str(), old.parts.len()), ("v1-4", 4));
    let manifests = |kv: &MemStore| {
        kv.scan(
            Space::Manifests,
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            100,
        )
        .unwrap()
        .len()
    };
    assert_eq!(manifests(&kv), 2);
    for (id, _) in &ids {
        exec(
            &kv,
            Command::DeleteObject(pb::ObjectKey {
                bucket: "b".into(),
                key: "k".into(),
                version_id: id.clone(),
                ..Default::default()
            }),
        );
    }
    assert_eq!(manifests(&kv), 0);
}
