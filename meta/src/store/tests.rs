//! One conformance suite for [`KvStore`], run against every implementation.

use std::ops::Bound;

use super::*;

fn conformance<K: KvStore>(kv: &K) {
    assert_eq!(kv.get(Space::Buckets, b"a").unwrap(), None);
    assert_eq!(kv.last(Space::Buckets).unwrap(), None);

    let mut b = Batch::new();
    for k in ["b", "a", "c", "ab", "\u{ff}"] {
        b.put(Space::Buckets, k, format!("v-{k}"));
    }
    b.put(Space::Objects, "a", "other space");
    b.put(Space::LogMeta, "z", "before");
    kv.apply(b).unwrap();

    assert_eq!(kv.get(Space::Buckets, b"a").unwrap(), Some(b"v-a".to_vec()));
    assert_eq!(
        kv.get(Space::Objects, b"a").unwrap(),
        Some(b"other space".to_vec())
    );
    let all = kv
        .scan(Space::Buckets, Bound::Unbounded, Bound::Unbounded, 100)
        .unwrap();
    let keys: Vec<_> = all
        .iter()
        .map(|(k, _)| String::from_utf8(k.clone()).unwrap())
        .collect();
    assert_eq!(keys, ["a", "ab", "b", "c", "\u{ff}"]);

    let some = kv
        .scan(
            Space::Buckets,
            Bound::Excluded(b"a"),
            Bound::Included(b"c"),
            2,
        )
        .unwrap();
    assert_eq!(
        some,
        vec![
            (b"ab".to_vec(), b"v-ab".to_vec()),
            (b"b".to_vec(), b"v-b".to_vec())
        ]
    );
    assert!(
        kv.scan(
            Space::Buckets,
            Bound::Excluded(b"c"),
            Bound::Excluded(b"c"),
            9
        )
        .unwrap()
        .is_empty()
    );
    assert!(
        kv.scan(
            Space::Buckets,
            Bound::Included(b"d"),
            Bound::Excluded(b"c"),
            9
        )
        .unwrap()
        .is_empty()
    );
    assert_eq!(kv.scan_prefix(Space::Buckets, b"a", 10).unwrap().len(), 2);
    assert_eq!(
        kv.last(Space::Buckets).unwrap().unwrap().0,
        "\u{ff}".as_bytes().to_vec()
    );
    assert_eq!(kv.last(Space::Objects).unwrap().unwrap().0, b"a".to_vec());

    let mut b = Batch::new();
    b.delete(Space::Buckets, "a");
    b.put(Space::Buckets, "b", "v2");
    b.delete(Space::Buckets, "missing");
    kv.apply(b).unwrap();
    assert_eq!(kv.get(Space::Buckets, b"a").unwrap(), None);
    assert_eq!(kv.get(Space::Buckets, b"b").unwrap(), Some(b"v2".to_vec()));
    assert_eq!(
        kv.keys_in(Space::Buckets, Bound::Unbounded, Bound::Unbounded)
            .unwrap()
            .len(),
        4
    );
    assert_eq!(
        kv.get(Space::LogMeta, b"z").unwrap(),
        Some(b"before".to_vec())
    );
}

#[test]
fn mem_store_conforms() {
    conformance(&MemStore::new());
}

#[test]
fn sled_store_conforms_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    {
        let kv = SledStore::open(dir.path(), 1 << 20).unwrap();
        conformance(&kv);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(kv.flush()).unwrap();
    }
    // Reopened in the same process right after the handle is dropped.
    let kv = SledStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(kv.get(Space::Buckets, b"b").unwrap(), Some(b"v2".to_vec()));
}

#[test]
fn prefix_end_increments_last_byte() {
    assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
    assert_eq!(prefix_end(b"\xff\xff"), None);
    assert_eq!(prefix_end(b""), None);
}
