//! Object versions: writes, deletes and delete markers per versioning
//! state, reads and listings by version, the reference index and heal's
//! locators across versions (docs/design/versioning.md).

use std::collections::BTreeSet;

use super::*;
use crate::sm::refs::{all_references, current_placement, rebuild_index};

pub(super) fn set_versioning(kv: &MemStore, b: &str, v: pb::Versioning) {
    let a = exec(
        kv,
        Command::PutBucketConfig(pb::PutBucketConfigRequest {
            name: b.into(),
            config: Some(pb::put_bucket_config_request::Config::Versioning(v.into())),
            ..Default::default()
        }),
    );
    assert_eq!(a, Applied::Done);
}

/// The version id a versioned PutObject reported.
fn put_version(kv: &MemStore, key: &str, blob: &str) -> String {
    match put(kv, "b", key, blob) {
        Applied::Versioned {
            released,
            version_id,
            delete_marker: false,
        } => {
            assert!(released.is_empty(), "{released:?}");
            version_id
        }
        other => panic!("{other:?}"),
    }
}

fn delete(kv: &MemStore, key: &str, version: &str) -> Applied {
    exec(
        kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: key.into(),
            version_id: version.into(),
            ..Default::default()
        }),
    )
}

fn get(kv: &MemStore, key: &str, version: &str) -> Result<pb::ObjectRecord, SmError> {
    get_version(kv, "b", key, version, true)
}

/// (key, version id, delete marker, is latest) of every listed version.
fn listed(kv: &MemStore, req: pb::ListVersionsRequest) -> Vec<(String, String, bool, bool)> {
    list_versions(
        kv,
        &pb::ListVersionsRequest {
            bucket: "b".into(),
            ..req
        },
    )
    .unwrap()
    .versions
    .into_iter()
    .map(|e| {
        let o = e.object.unwrap();
        (o.key, o.version_id, o.delete_marker, e.is_latest)
    })
    .collect()
}

/// Every version (as [`listed`] gives them) and common prefix of `req`,
/// paged `req.max_keys` at a time with the markers each page names.
fn page_all<K: KvStore>(kv: &K, req: pb::ListVersionsRequest) -> (Vec<Row>, Vec<String>) {
    let (mut km, mut vm) = (String::new(), String::new());
    let (mut got, mut cps) = (Vec::new(), Vec::new());
    loop {
        let r = list_versions(
            kv,
            &pb::ListVersionsRequest {
                key_marker: km.clone(),
                version_id_marker: vm.clone(),
                ..req.clone()
            },
        )
        .unwrap();
        got.extend(r.versions.into_iter().map(row));
        cps.extend(r.common_prefixes);
        if !r.is_truncated {
            return (got, cps);
        }
        (km, vm) = (r.next_key_marker, r.next_version_id_marker);
    }
}

/// (key, version id, delete marker, is latest).
type Row = (String, String, bool, bool);

fn row(e: pb::VersionEntry) -> Row {
    let o = e.object.unwrap();
    (o.key, o.version_id, o.delete_marker, e.is_latest)
}

fn refs(kv: &MemStore) -> BTreeSet<String> {
    all_references(kv)
        .unwrap()
        .iter()
        .map(|i| name_of(i))
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn unversioned_buckets_write_as_before() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    assert_eq!(put(&kv, "b", "k", "x"), Applied::Released(vec![]));
    assert_eq!(
        put(&kv, "b", "k", "y"),
        Applied::Released(vec![placement("x")])
    );
    let o = get(&kv, "k", "").unwrap();
    assert_eq!((o.seq, o.version_id.as_str()), (0, ""));
    assert_eq!(get(&kv, "k", "null").unwrap().etag, "e");
    assert_eq!(
        delete(&kv, "k", ""),
        Applied::Released(vec![placement("y")])
    );
    assert!(kv.scan_prefix(Space::Versions, b"", 1).unwrap().is_empty());
}

#[test]
fn enabled_keeps_every_version_until_it_is_deleted_by_id() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    // Written before versioning: becomes the null version.
    put(&kv, "b", "k", "n");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "x");
    let v2 = put_version(&kv, "k", "y");
    assert_ne!(v1, v2);
    assert_eq!(refs(&kv), names(&["n", "x", "y"]));
    assert_eq!(
        name_of(
            &get(&kv, "k", "").unwrap().parts[0]
                .placement
                .as_ref()
                .unwrap()
                .blob_id
        ),
        "y"
    );
    assert_eq!(
        name_of(
            &get(&kv, "k", &v1).unwrap().parts[0]
                .placement
                .as_ref()
                .unwrap()
                .blob_id
        ),
        "x"
    );
    assert_eq!(
        name_of(
            &get(&kv, "k", "null").unwrap().parts[0]
                .placement
                .as_ref()
                .unwrap()
                .blob_id
        ),
        "n"
    );
    assert_eq!(
        listed(&kv, Default::default()),
        vec![
            ("k".into(), v2.clone(), false, true),
            ("k".into(), v1.clone(), false, false),
            ("k".into(), String::new(), false, false),
        ]
    );

    // A plain delete adds a marker and releases nothing.
    let marker = match delete(&kv, "k", "") {
        Applied::Versioned {
            released,
            version_id,
            delete_marker: true,
        } if released.is_empty() => version_id,
        other => panic!("{other:?}"),
    };
    assert_eq!(refs(&kv), names(&["n", "x", "y"]));
    assert_eq!(
        refused_code(&match get_version(&kv, "b", "k", "", false) {
            Err(SmError::Refused { code, message }) => Applied::Refused { code, message },
            other => panic!("{other:?}"),
        }),
        Some(ErrorCode::NoSuchKey)
    );
    assert!(get(&kv, "k", "").unwrap().delete_marker);
    assert!(matches!(
        get_version(&kv, "b", "k", &marker, false),
        Err(SmError::Refused {
            code: ErrorCode::MethodNotAllowed,
            ..
        })
    ));
    // ListObjects no longer shows the key; the bucket is not empty.
    let objects = list_objects(
        &kv,
        &pb::ListObjectsRequest {
            bucket: "b".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(objects.objects.is_empty());
    assert_eq!(
        refused_code(&exec(
            &kv,
            Command::DeleteBucket(pb::BucketRequest {
                name: "b".into(),
                ..Default::default()
            })
        )),
        Some(ErrorCode::BucketNotEmpty)
    );

    // Deleting the marker by id makes v2 current again.
    assert!(matches!(
        delete(&kv, "k", &marker),
        Applied::Versioned {
            delete_marker: true,
            ..
        }
    ));
    assert_eq!(get(&kv, "k", "").unwrap().version_id, v2);
    // Deleting the current version by id promotes v1 and releases y only.
    match delete(&kv, "k", &v2) {
        Applied::Versioned { released, .. } => assert_eq!(released, vec![placement("y")]),
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&kv, "k", "").unwrap().version_id, v1);
    assert_eq!(refs(&kv), names(&["n", "x"]));
    // A noncurrent version by id: only its blob goes.
    match delete(&kv, "k", "null") {
        Applied::Versioned {
            released,
            version_id,
            ..
        } => {
            assert_eq!(released, vec![placement("n")]);
            assert_eq!(version_id, "null");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(refs(&kv), names(&["x"]));
    // A missing version is no error and changes nothing.
    assert!(
        matches!(delete(&kv, "k", &v2), Applied::Versioned { ref released, .. } if released.is_empty())
    );
    assert!(matches!(
        get_version(&kv, "b", "k", &v2, true),
        Err(SmError::Refused {
            code: ErrorCode::NoSuchVersion,
            ..
        })
    ));
    assert!(matches!(
        get_version(&kv, "b", "k", "v2", true),
        Err(SmError::Refused {
            code: ErrorCode::InvalidArgument,
            ..
        })
    ));
    delete(&kv, "k", &v1);
    assert!(refs(&kv).is_empty());
    assert!(kv.scan_prefix(Space::Versions, b"", 1).unwrap().is_empty());
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
}

#[test]
fn suspended_writes_replace_only_the_null_version() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "x");
    set_versioning(&kv, "b", pb::Versioning::Suspended);
    match put(&kv, "b", "k", "n1") {
        Applied::Versioned {
            released,
            version_id,
            ..
        } => {
            assert!(released.is_empty());
            assert_eq!(version_id, "null");
        }
        other => panic!("{other:?}"),
    }
    // The next suspended write replaces the null version and releases it.
    match put(&kv, "b", "k", "n2") {
        Applied::Versioned { released, .. } => assert_eq!(released, vec![placement("n1")]),
        other => panic!("{other:?}"),
    }
    assert_eq!(refs(&kv), names(&["x", "n2"]));
    // A suspended delete removes the null version and writes a null marker.
    match delete(&kv, "k", "") {
        Applied::Versioned {
            released,
            version_id,
            delete_marker: true,
        } => {
            assert_eq!(released, vec![placement("n2")]);
            assert_eq!(version_id, "null");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        listed(&kv, Default::default()),
        vec![
            ("k".into(), String::new(), true, true),
            ("k".into(), v1.clone(), false, false)
        ]
    );
    // Enabled again: a new version over a null marker keeps the marker.
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v3 = put_version(&kv, "k", "z");
    assert_eq!(listed(&kv, Default::default()).len(), 3);
    assert_eq!(get(&kv, "k", "").unwrap().version_id, v3);
    assert_eq!(refs(&kv), names(&["x", "z"]));
}

#[test]
fn version_listing_pages_markers_and_prefixes() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let mut all = Vec::new();
    for key in ["a", "d/1", "d/2", "z"] {
        let v1 = put_version(&kv, key, &format!("{key}1"));
        let v2 = put_version(&kv, key, &format!("{key}2"));
        all.push((key.to_string(), v2, false, true));
        all.push((key.to_string(), v1, false, false));
    }
    // Page through three at a time with the markers the responses give.
    let (got, _) = page_all(
        &kv,
        pb::ListVersionsRequest {
            bucket: "b".into(),
            max_keys: 3,
            ..Default::default()
        },
    );
    assert_eq!(got, all);
    // A delimiter rolls d/ up into one prefix, skipped with a seek.
    let r = list_versions(
        &kv,
        &pb::ListVersionsRequest {
            bucket: "b".into(),
            delimiter: Some("/".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.common_prefixes, vec!["d/".to_string()]);
    assert_eq!(r.versions.len(), 4);
    // A prefix keeps to its keys.
    let got = listed(
        &kv,
        pb::ListVersionsRequest {
            prefix: "d/2".into(),
            ..Default::default()
        },
    );
    assert_eq!(got, all[4..6].to_vec());
}

#[test]
fn heal_locators_and_a_rebuilt_index_find_noncurrent_versions() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "k", "n");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "x");
    put_version(&kv, "k", "y");
    for (blob, version) in [("n", "null"), ("x", v1.as_str())] {
        let (locator, p) = current_placement(&kv, &bid(blob)).unwrap().unwrap();
        assert_eq!(p, placement(blob));
        let record = get(&kv, "k", version).unwrap();
        assert_eq!(locator.version_seq, record.seq, "{blob}");
    }
    // ReportMissing on a noncurrent version's blob changes that record.
    let a = exec(
        &kv,
        Command::ReportMissing(pb::ReportMissingRequest {
            node_id: 3,
            shards: vec![pb::ShardRef {
                blob_id: bid("x"),
                shard_index: 2,
            }],
            ..Default::default()
        }),
    );
    assert_eq!(a, Applied::Marked(1));
    let x = get(&kv, "k", &v1).unwrap();
    assert_eq!(x.parts[0].placement.as_ref().unwrap().missing, vec![2]);
    assert_eq!(
        get(&kv, "k", "").unwrap().parts[0]
            .placement
            .as_ref()
            .unwrap()
            .missing,
        Vec::<u32>::new()
    );
    let before = refs(&kv);
    rebuild_index(&kv).unwrap();
    assert_eq!(refs(&kv), before);
    assert_eq!(before, names(&["n", "x", "y"]));
}

#[test]
fn tagging_by_version_and_markers_refused() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "x");
    put_version(&kv, "k", "y");
    let tags = vec![pb::Tag {
        key: "t".into(),
        value: "1".into(),
    }];
    let a = exec(
        &kv,
        Command::PutObjectTagging(pb::PutObjectTaggingRequest {
            bucket: "b".into(),
            key: "k".into(),
            tags: tags.clone(),
            version_id: v1.clone(),
            ..Default::default()
        }),
    );
    assert_eq!(a, Applied::Done);
    assert_eq!(get(&kv, "k", &v1).unwrap().tags, tags);
    assert!(get(&kv, "k", "").unwrap().tags.is_empty());
    let Applied::Versioned {
        version_id: marker, ..
    } = delete(&kv, "k", "")
    else {
        panic!()
    };
    let a = exec(
        &kv,
        Command::PutObjectTagging(pb::PutObjectTaggingRequest {
            bucket: "b".into(),
            key: "k".into(),
            tags,
            version_id: marker,
            ..Default::default()
        }),
    );
    assert_eq!(refused_code(&a), Some(ErrorCode::MethodNotAllowed));
}

#[test]
fn noncurrent_versions_expire_after_their_days_as_noncurrent() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let day = 1_000;
    let rule = pb::LifecycleRule {
        enabled: true,
        noncurrent_days: 2,
        ..Default::default()
    };
    let a = exec(
        &kv,
        Command::PutBucketConfig(pb::PutBucketConfigRequest {
            name: "b".into(),
            config: Some(pb::put_bucket_config_request::Config::Lifecycle(
                pb::BucketLifecycle { rules: vec![rule] },
            )),
            ..Default::default()
        }),
    );
    assert_eq!(a, Applied::Done);
    // v1 written at 0, replaced by v2 at 5 000 (so noncurrent since 5 000),
    // v2 replaced by v3 at 6 000.
    let put_at = |blob: &str, at: i64| {
        exec_at(
            &kv,
            Command::PutObject(pb::PutObjectRequest {
                object: Some(object("b", "k", blob)),
                ..Default::default()
            }),
            at,
        )
    };
    put_at("v1", 0);
    put_at("v2", 5_000);
    put_at("v3", 6_000);
    let bucket_rec = get_bucket(&kv, "b").unwrap();
    let page = |now: i64| {
        crate::sm::lifecycle::expired_versions(&kv, &bucket_rec, None, now, day, 256)
            .unwrap()
            .found
    };
    // Not by v1's own age: two days after it became noncurrent.
    assert!(page(6_999).is_empty());
    let found = page(7_000);
    assert_eq!(found.len(), 1, "{found:?}");
    // Applied at 7 000: v1 goes and its blob is released; v2 stays.
    let applied = exec_at(
        &kv,
        Command::ExpireObjects(sluice_proto::raft::ExpireObjects {
            objects: found.clone(),
            day_ms: day,
        }),
        7_000,
    );
    assert_eq!(applied, Applied::Released(vec![placement("v1")]));
    assert_eq!(refs(&kv), names(&["v2", "v3"]));
    // The same entry again changes nothing (the version is gone).
    let again = exec_at(
        &kv,
        Command::ExpireObjects(sluice_proto::raft::ExpireObjects {
            objects: found,
            day_ms: day,
        }),
        7_000,
    );
    assert_eq!(again, Applied::Released(vec![]));
    // v2 is noncurrent since 6 000: expired at 8 000, not before.
    assert!(page(7_999).is_empty());
    assert_eq!(page(8_000).len(), 1);
    // The current version is never expired by a noncurrent rule.
    assert_eq!(
        get(&kv, "k", "").unwrap().parts[0]
            .placement
            .as_ref()
            .unwrap()
            .blob_id,
        bid("v3")
    );
}

/// ReportMissing naming the current version's blob and a noncurrent
/// version's blob of the same key in one call must mark both.
#[test]
fn report_missing_marks_current_and_noncurrent_of_one_key() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "b"); // noncurrent, blob id sorts second
    put_version(&kv, "k", "a"); // current, blob id sorts first
    let a = exec(
        &kv,
        Command::ReportMissing(pb::ReportMissingRequest {
            node_id: 3,
            shards: vec![
                pb::ShardRef {
                    blob_id: bid("a"),
                    shard_index: 2,
                },
                pb::ShardRef {
                    blob_id: bid("b"),
                    shard_index: 2,
                },
            ],
            ..Default::default()
        }),
    );
    let old = get(&kv, "k", &v1).unwrap();
    assert_eq!(
        old.parts[0].placement.as_ref().unwrap().missing,
        vec![2],
        "noncurrent not marked"
    );
    assert_eq!(a, Applied::Marked(2));
}

/// Paging one version at a time (with and without a delimiter) lists the
/// same entries as one page.
#[test]
fn paging_by_one_matches_one_page() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "a", "n0");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    put_version(&kv, "a", "a1");
    delete(&kv, "a", "");
    put_version(&kv, "c/1", "c1");
    delete(&kv, "c/1", "");
    put_version(&kv, "c/2", "c2");
    put_version(&kv, "d", "d1");
    set_versioning(&kv, "b", pb::Versioning::Suspended);
    put(&kv, "b", "d", "d2");
    delete(&kv, "e", "");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    put_version(&kv, "e", "e1");
    delete(&kv, "e", "");
    for delimiter in [None, Some("/".to_string())] {
        let all = list_versions(
            &kv,
            &pb::ListVersionsRequest {
                bucket: "b".into(),
                delimiter: delimiter.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        let whole: Vec<_> = all.versions.iter().cloned().map(row).collect();
        let (got, cps) = page_all(
            &kv,
            pb::ListVersionsRequest {
                bucket: "b".into(),
                delimiter: delimiter.clone(),
                max_keys: 1,
                ..Default::default()
            },
        );
        assert_eq!(got, whole, "{delimiter:?}");
        assert_eq!(cps, all.common_prefixes);
    }
}

/// The layout invariants (docs/design/versioning.md) and the reference index
/// against the records, after every step of a random sequence.
fn all_rows(kv: &MemStore, space: Space) -> Vec<crate::store::Pair> {
    let all = std::ops::Bound::Unbounded;
    kv.scan(space, all, all, 100_000).unwrap()
}

fn check_invariants(kv: &MemStore, released: &[String]) {
    use std::collections::BTreeMap;
    // Records by key: current and rows.
    let mut blobs = BTreeSet::new();
    let mut by_key: BTreeMap<String, (Option<pb::ObjectRecord>, Vec<pb::ObjectRecord>)> =
        BTreeMap::new();
    for (k, v) in all_rows(kv, Space::Objects) {
        let head: pb::ObjectRecord = prost::Message::decode(v.as_slice()).unwrap();
        let o = crate::sm::records::complete(kv, Space::Objects, &k, head)
            .unwrap()
            .expect("every head has its manifest");
        for p in &o.parts {
            let id = &p.placement.as_ref().unwrap().blob_id;
            assert!(blobs.insert(id.clone()), "blob {id} twice");
        }
        let k = o.key.clone();
        by_key.entry(k).or_default().0 = Some(o);
    }
    for (k, v) in all_rows(kv, Space::Versions) {
        let head: pb::ObjectRecord = prost::Message::decode(v.as_slice()).unwrap();
        let o = crate::sm::records::complete(kv, Space::Versions, &k, head)
            .unwrap()
            .expect("every head has its manifest");
        for p in &o.parts {
            let id = &p.placement.as_ref().unwrap().blob_id;
            assert!(blobs.insert(id.clone()), "blob {id} twice");
        }
        let k = o.key.clone();
        by_key.entry(k).or_default().1.push(o);
    }
    // Every manifest belongs to a record that names it.
    for (mk, _) in all_rows(kv, Space::Manifests) {
        let space = Space::from_id(mk[0]).expect("a record space");
        let head: pb::ObjectRecord = prost::Message::decode(
            kv.get(space, &mk[1..])
                .unwrap()
                .expect("orphan manifest")
                .as_slice(),
        )
        .unwrap();
        assert!(head.part_count > 0, "a manifest for a record without parts");
    }
    let r: BTreeSet<String> = all_references(kv).unwrap().into_iter().collect();
    assert_eq!(r, blobs, "refs vs records");
    for id in released {
        assert!(!r.contains(id), "released {id} still referenced");
    }
    for id in &blobs {
        let (_, p) = current_placement(kv, id)
            .unwrap()
            .expect("locator resolves");
        assert_eq!(&p.blob_id, id);
    }
    for (key, (cur, rows)) in &by_key {
        let nulls = cur
            .iter()
            .chain(rows.iter())
            .filter(|o| o.version_id.is_empty())
            .count();
        assert!(nulls <= 1, "{key}: {nulls} nulls");
        if let Some(c) = cur {
            for r in rows {
                assert!(c.seq > r.seq, "{key}: current older than a row");
            }
        }
        for w in rows.windows(2) {
            assert!(w[0].seq > w[1].seq);
        }
        if cur.is_none() && !rows.is_empty() {
            assert!(
                rows[0].delete_marker,
                "{key}: latest non-marker row without current"
            );
        }
    }
    // Paging by one equals one page.
    let all = list_versions(
        kv,
        &pb::ListVersionsRequest {
            bucket: "b".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let whole: Vec<_> = all.versions.iter().cloned().map(row).collect();
    let (got, _) = page_all(
        kv,
        pb::ListVersionsRequest {
            bucket: "b".into(),
            max_keys: 1,
            ..Default::default()
        },
    );
    assert_eq!(got, whole);
    for pre in ["", "l", "l/"] {
        let all = list_versions(
            kv,
            &pb::ListVersionsRequest {
                bucket: "b".into(),
                prefix: pre.into(),
                delimiter: Some("/".into()),
                ..Default::default()
            },
        )
        .unwrap();
        let whole: Vec<_> = all.versions.iter().cloned().map(row).collect();
        let (got, cps) = page_all(
            kv,
            pb::ListVersionsRequest {
                bucket: "b".into(),
                prefix: pre.into(),
                delimiter: Some("/".into()),
                max_keys: 1,
                ..Default::default()
            },
        );
        assert_eq!(got, whole);
        assert_eq!(cps, all.common_prefixes);
    }
    let latest: Vec<_> = whole.iter().filter(|x| x.3).map(|x| x.0.clone()).collect();
    assert_eq!(
        latest,
        by_key.keys().cloned().collect::<Vec<_>>(),
        "one latest per key"
    );
}

#[test]
fn random_ops_keep_invariants() {
    for seed in 1..=300u64 {
        let kv = MemStore::new();
        bucket(&kv, "b");
        // Current versions expire a day after they were written (all at
        // leader time 0), noncurrent ones a day after they became so.
        let rule = pb::LifecycleRule {
            enabled: true,
            expiration_days: 1,
            noncurrent_days: 1,
            ..Default::default()
        };
        exec(
            &kv,
            Command::PutBucketConfig(pb::PutBucketConfigRequest {
                name: "b".into(),
                config: Some(pb::put_bucket_config_request::Config::Lifecycle(
                    pb::BucketLifecycle { rules: vec![rule] },
                )),
                ..Default::default()
            }),
        );
        let mut rng = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = |n: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let keys = ["k", "l/1", "l/2"];
        let mut blob = 0;
        let mut log = Vec::new();
        for _ in 0..40 {
            let key = keys[next(3) as usize];
            let op = next(10);
            let applied = match op {
                0..=3 => {
                    blob += 1;
                    let name = format!("s{seed}-{blob}");
                    log.push(format!("put {key} {name}"));
                    put(&kv, "b", key, &name)
                }
                4 | 5 => {
                    log.push(format!("delete {key}"));
                    delete(&kv, key, "")
                }
                6 => {
                    let vs = listed(
                        &kv,
                        pb::ListVersionsRequest {
                            prefix: key.into(),
                            ..Default::default()
                        },
                    );
                    let vs: Vec<_> = vs.into_iter().filter(|v| v.0 == key).collect();
                    if vs.is_empty() {
                        continue;
                    }
                    let v = &vs[next(vs.len() as u64) as usize];
                    let id = if v.1.is_empty() {
                        "null".to_string()
                    } else {
                        v.1.clone()
                    };
                    log.push(format!("delete {key} id {id}"));
                    delete(&kv, key, &id)
                }
                7 => {
                    let s = if next(2) == 0 {
                        pb::Versioning::Enabled
                    } else {
                        pb::Versioning::Suspended
                    };
                    log.push(format!("versioning {s:?}"));
                    set_versioning(&kv, "b", s);
                    continue;
                }
                8 => {
                    let bucket_rec = get_bucket(&kv, "b").unwrap();
                    let found = crate::sm::lifecycle::expired_versions(
                        &kv,
                        &bucket_rec,
                        None,
                        100_000,
                        1_000,
                        256,
                    )
                    .unwrap()
                    .found;
                    log.push(format!("expire versions {}", found.len()));
                    exec_at(
                        &kv,
                        Command::ExpireObjects(sluice_proto::raft::ExpireObjects {
                            objects: found,
                            day_ms: 1_000,
                        }),
                        100_000,
                    )
                }
                _ => {
                    let objects = keys
                        .iter()
                        .map(|k| sluice_proto::raft::ExpireObject {
                            bucket: "b".into(),
                            key: k.to_string(),
                            etag: "e".into(),
                            last_modified_ms: 0,
                            version_id: String::new(),
                        })
                        .collect();
                    log.push("expire current".to_string());
                    exec_at(
                        &kv,
                        Command::ExpireObjects(sluice_proto::raft::ExpireObjects {
                            objects,
                            day_ms: 1_000,
                        }),
                        100_000,
                    )
                }
            };
            let released: Vec<String> = match &applied {
                Applied::Released(r) | Applied::Versioned { released: r, .. } => {
                    r.iter().map(|p| p.blob_id.clone()).collect()
                }
                Applied::Refused { .. } => panic!("{applied:?} {log:?}"),
                _ => vec![],
            };
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_invariants(&kv, &released)
            }));
            if res.is_err() {
                panic!("seed {seed}: {log:#?}");
            }
        }
    }
}

#[test]
fn many_versions_cross_scan_chunks() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    put(&kv, "b", "a", "a-null");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    for key in ["a", "p/1", "p/2", "z"] {
        for i in 0..300 {
            put_version(&kv, key, &format!("{key}-{i}"));
        }
    }
    assert_eq!(
        get(&kv, "a", "null").unwrap().parts[0]
            .placement
            .as_ref()
            .unwrap()
            .blob_id,
        bid("a-null")
    );
    for (delim, maxk) in [
        (None, 1000u32),
        (Some("/".to_string()), 1000),
        (None, 7),
        (Some("/".to_string()), 7),
    ] {
        let (got, cps) = page_all(
            &kv,
            pb::ListVersionsRequest {
                bucket: "b".into(),
                delimiter: delim.clone(),
                max_keys: maxk,
                ..Default::default()
            },
        );
        let n = if delim.is_some() { 601 } else { 1201 };
        assert_eq!(got.len(), n, "{delim:?} {maxk}");
        assert_eq!(
            got.iter().filter(|x| x.3).count(),
            if delim.is_some() { 2 } else { 4 }
        );
        assert_eq!(cps.len(), if delim.is_some() { 1 } else { 0 });
        let mut sorted = got.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len());
    }
}

/// Collectable racing a DeleteObject by id that promotes a noncurrent
/// version: the promoted (now current) version's shard must not be
/// collectable.
#[test]
fn collectable_races_a_promotion() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    put_version(&kv, "k", "x");
    let v2 = put_version(&kv, "k", "y");
    exec(
        &kv,
        Command::CloseEpochs(sluice_proto::raft::CloseEpochs {
            epochs: vec![EPOCH],
        }),
    );
    // The entry deleting v2 by id (promotes v1), not applied yet.
    let (promote, _) = apply_command(
        &kv,
        next_index(),
        &MetaCommand {
            command: Some(Command::DeleteObject(pb::ObjectKey {
                bucket: "b".into(),
                key: "k".into(),
                version_id: v2,
                ..Default::default()
            })),
            leader_now_ms: 0,
            requires_format: 1,
        },
    )
    .unwrap();
    // Applied just before the first read of Versions: a Raft entry
    // applied between two reads of a concurrent read RPC.
    let racy = crate::store::hooked::Hooked::new(kv);
    let mut promote = Some(promote);
    racy.set_hook(move |access, inner| {
        if access == crate::store::hooked::Access::Get(Space::Versions)
            && let Some(b) = promote.take()
        {
            inner.apply(b).unwrap();
        }
    });
    let shard = pb::ShardRef {
        blob_id: bid("x"),
        shard_index: 0,
    };
    let out = crate::sm::collectable(&racy, 1, &[shard]).unwrap();
    // x is now the current version of k.
    assert_eq!(
        get(&racy.inner, "k", "").unwrap().parts[0]
            .placement
            .as_ref()
            .unwrap()
            .blob_id,
        bid("x")
    );
    assert!(
        out.is_empty(),
        "shard 0 of the current version is collectable: {out:?}"
    );
}

#[test]
fn a_nul_in_a_key_cannot_reach_another_keys_versions() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    set_versioning(&kv, "b", pb::Versioning::Enabled);
    let v1 = put_version(&kv, "k", "nul-1");
    let v2 = put_version(&kv, "k", "nul-2");
    // "k\0A" would sort among k's versions in the key layout.
    assert_eq!(
        refused_code(&delete(&kv, "k\0A", "")),
        Some(ErrorCode::InvalidArgument)
    );
    // Deleting k's current version promotes the one before it.
    assert!(matches!(delete(&kv, "k", &v2), Applied::Versioned { .. }));
    assert_eq!(get(&kv, "k", "").unwrap().version_id, v1);
    check_invariants(&kv, &[]);
}

/// Arbitrary names (any chars, NUL and empty included) through every
/// key-taking mutation: a name that is empty or holds NUL is refused with
/// InvalidArgument and changes nothing; the key space keeps its
/// invariants and holds no such name.
#[test]
fn arbitrary_names_never_enter_the_key_space() {
    const PALETTE: [char; 10] = [
        '\0',
        '\u{1}',
        '/',
        'k',
        'l',
        'é',
        '\u{ffff}',
        '\u{10ffff}',
        ' ',
        '%',
    ];
    for seed in 1..=200u64 {
        let kv = MemStore::new();
        bucket(&kv, "b");
        if seed % 2 == 0 {
            set_versioning(&kv, "b", pb::Versioning::Enabled);
        }
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut log = Vec::new();
        for step in 0..30 {
            let len = next(5) as usize;
            let key: String = (0..len).map(|_| PALETTE[next(10) as usize]).collect();
            let valid = !key.is_empty() && !key.contains('\0');
            let upload = format!("u{seed}-{step}");
            let command = match next(9) {
                0 | 1 => Command::PutObject(pb::PutObjectRequest {
                    object: Some(object("b", &key, &format!("a{seed}-{step}"))),
                    ..Default::default()
                }),
                2 => Command::DeleteObject(pb::ObjectKey {
                    bucket: "b".into(),
                    key: key.clone(),
                    ..Default::default()
                }),
                3 => Command::PutObjectTagging(pb::PutObjectTaggingRequest {
                    bucket: "b".into(),
                    key: key.clone(),
                    ..Default::default()
                }),
                4 => Command::PutObjectAcl(pb::PutObjectAclRequest {
                    bucket: "b".into(),
                    key: key.clone(),
                    ..Default::default()
                }),
                5 => Command::CreateUpload(pb::CreateUploadRequest {
                    upload: Some(pb::UploadRecord {
                        bucket: "b".into(),
                        key: key.clone(),
                        upload_id: upload,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                6 => Command::AbortUpload(pb::UploadKey {
                    bucket: "b".into(),
                    key: key.clone(),
                    upload_id: upload,
                    ..Default::default()
                }),
                7 => Command::CompleteUpload(pb::CompleteUploadRequest {
                    bucket: "b".into(),
                    key: key.clone(),
                    upload_id: upload,
                    ..Default::default()
                }),
                _ => Command::ExpireObjects(sluice_proto::raft::ExpireObjects {
                    objects: vec![sluice_proto::raft::ExpireObject {
                        bucket: "b".into(),
                        key: key.clone(),
                        etag: "e".into(),
                        ..Default::default()
                    }],
                    day_ms: 1_000,
                }),
            };
            log.push(format!("{key:?} {command:?}"));
            let applied = exec_at(&kv, command, 100_000);
            if !valid {
                assert_eq!(
                    refused_code(&applied),
                    Some(ErrorCode::InvalidArgument),
                    "seed {seed}: {log:#?}"
                );
            }
            let released: Vec<String> = match &applied {
                Applied::Released(r) | Applied::Versioned { released: r, .. } => {
                    r.iter().map(|p| p.blob_id.clone()).collect()
                }
                _ => vec![],
            };
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_invariants(&kv, &released);
                let valid = |k: &str| !k.is_empty() && !k.contains('\0');
                for space in [Space::Objects, Space::Versions] {
                    for (_, v) in all_rows(&kv, space) {
                        let o: pb::ObjectRecord = prost::Message::decode(v.as_slice()).unwrap();
                        assert!(valid(&o.key), "{space:?} holds key {:?}", o.key);
                    }
                }
                for (_, v) in all_rows(&kv, Space::Uploads) {
                    let u: pb::UploadRecord = prost::Message::decode(v.as_slice()).unwrap();
                    assert!(valid(&u.key), "an upload of key {:?}", u.key);
                }
            }));
            if res.is_err() {
                panic!("seed {seed}: {log:#?}");
            }
        }
    }
}
