//! Cluster settings (validated and applied as log entries, read by
//! OpenEpoch) and the state digest, on the in-memory store.

use sluice_proto::raft as rpb;

use super::*;
use crate::sm::settings;
use crate::store::Space;

fn set(epoch_lease_ms: Option<u64>, only_if_absent: bool) -> Command {
    Command::SetClusterSettings(rpb::SetClusterSettings {
        settings: Some(rpb::ClusterSettings { epoch_lease_ms }),
        only_if_absent,
        op_id: String::new(),
    })
}

fn open(kv: &MemStore) -> pb::OpenEpochResponse {
    match exec(
        kv,
        Command::OpenEpoch(pb::OpenEpochRequest {
            gateway_id: "gw".into(),
            ..Default::default()
        }),
    ) {
        Applied::Epoch(e) => e,
        other => panic!("{other:?}"),
    }
}

#[test]
fn open_epoch_grants_the_replicated_lease() {
    let kv = MemStore::new();
    assert_eq!(settings::stored(&kv).unwrap(), None);
    // Cluster version 1 (an upgrade from v0.1.0 not yet finalized): the
    // default lease, and the epoch records none, as a v0.1.0 voter's.
    let e = open(&kv);
    assert_eq!(e.lease_ms, settings::DEFAULT_LEASE_MS);
    assert_eq!(
        epochs::get_epoch(&kv, e.epoch).unwrap().unwrap().lease_ms,
        0
    );
    assert_eq!(
        exec(
            &kv,
            Command::FinalizeVersion(rpb::FinalizeVersion { version: 2 })
        ),
        Applied::Done
    );
    assert_eq!(open(&kv).lease_ms, settings::DEFAULT_LEASE_MS);

    assert_eq!(exec(&kv, set(Some(600), true)), Applied::Done);
    let e = open(&kv);
    assert_eq!(e.lease_ms, 600);
    assert_eq!(
        epochs::get_epoch(&kv, e.epoch).unwrap().unwrap().lease_ms,
        600
    );

    // A second initial value changes nothing: the first one applied stays.
    assert_eq!(exec(&kv, set(Some(9_000), true)), Applied::Done);
    assert_eq!(settings::epoch_lease_ms(&kv).unwrap(), 600);

    // An explicit change does; the epoch opened before keeps its lease.
    assert_eq!(exec(&kv, set(Some(45_000), false)), Applied::Done);
    assert_eq!(open(&kv).lease_ms, 45_000);
    assert_eq!(
        epochs::get_epoch(&kv, e.epoch).unwrap().unwrap().lease_ms,
        600
    );

    // A partial update (no field) keeps every value.
    assert_eq!(exec(&kv, set(None, false)), Applied::Done);
    assert_eq!(
        settings::effective(&kv).unwrap(),
        rpb::ClusterSettings {
            epoch_lease_ms: Some(45_000)
        }
    );
}

#[test]
fn an_out_of_range_setting_is_refused_and_changes_nothing() {
    let kv = MemStore::new();
    assert_eq!(exec(&kv, set(Some(2_000), false)), Applied::Done);
    for bad in [0, settings::MAX_LEASE_MS + 1, u64::MAX] {
        let before = state_digest(&kv).unwrap();
        let a = exec(&kv, set(Some(bad), false));
        assert_eq!(
            refused_code(&a),
            Some(ErrorCode::InvalidArgument),
            "{bad}: {a:?}"
        );
        // An initial value out of range is refused the same way.
        let a = exec(&kv, set(Some(bad), true));
        assert_eq!(
            refused_code(&a),
            Some(ErrorCode::InvalidArgument),
            "{bad}: {a:?}"
        );
        assert_eq!(state_digest(&kv).unwrap(), before);
        assert_eq!(settings::epoch_lease_ms(&kv).unwrap(), 2_000);
    }
    for good in [settings::MIN_LEASE_MS, settings::MAX_LEASE_MS] {
        assert_eq!(exec(&kv, set(Some(good), false)), Applied::Done);
        assert_eq!(settings::epoch_lease_ms(&kv).unwrap(), good);
    }
}

/// The same records, written in a different order and in different
/// batches.
fn fill(kv: &MemStore, reversed: bool) {
    let mut ops = vec![
        (Space::Buckets, b"b".to_vec(), b"bucket".to_vec()),
        (Space::Objects, b"b\0k1".to_vec(), b"one".to_vec()),
        (Space::Objects, b"b\0k2".to_vec(), b"two".to_vec()),
        (Space::Cluster, b"settings".to_vec(), vec![8, 1]),
        (Space::ReadLeases, b"x".to_vec(), Vec::new()),
    ];
    if reversed {
        ops.reverse();
    }
    for (space, k, v) in ops {
        let mut b = crate::store::Batch::new();
        b.put(space, k, v);
        kv.apply(b).unwrap();
    }
}

#[test]
fn the_digest_is_of_the_content_only_and_sees_every_change() {
    let (a, b) = (MemStore::new(), MemStore::new());
    fill(&a, false);
    fill(&b, true);
    let da = state_digest(&a).unwrap();
    assert_eq!(da, state_digest(&b).unwrap());
    assert_eq!(da.records, 5);
    assert_eq!(da.hex().len(), 64);
    // Spaces outside the snapshot (Raft's own) are not part of it.
    let mut m = crate::store::Batch::new();
    m.put(Space::SmMeta, b"applied".to_vec(), b"x".to_vec());
    b.apply(m).unwrap();
    assert_eq!(state_digest(&b).unwrap(), da);

    let changed = |f: &dyn Fn(&mut crate::store::Batch)| {
        let kv = MemStore::new();
        fill(&kv, false);
        let mut batch = crate::store::Batch::new();
        f(&mut batch);
        kv.apply(batch).unwrap();
        state_digest(&kv).unwrap()
    };
    // A value, a key, a removal, a record moved to another space, and a
    // byte moved from key to value each give another digest.
    let variants = [
        changed(&|b| b.put(Space::Objects, b"b\0k1".to_vec(), b"One".to_vec())),
        changed(&|b| b.put(Space::Cluster, b"settings".to_vec(), vec![8, 2])),
        changed(&|b| b.delete(Space::Objects, b"b\0k2".to_vec())),
        changed(&|b| {
            b.delete(Space::ReadLeases, b"x".to_vec());
            b.put(Space::Refs, b"x".to_vec(), Vec::new());
        }),
        changed(&|b| {
            b.delete(Space::Objects, b"b\0k2".to_vec());
            b.put(Space::Objects, b"b\0k".to_vec(), b"2two".to_vec());
        }),
    ];
    for (i, v) in variants.iter().enumerate() {
        assert_ne!(*v, da, "variant {i}");
        for w in &variants[i + 1..] {
            assert_ne!(v.hash, w.hash);
        }
    }
}

#[test]
fn the_digest_reads_past_one_scan() {
    let kv = MemStore::new();
    let n = crate::sm::digest::DIGEST_SCAN_ROWS as u64 * 3 + 5;
    for i in 0..n {
        let mut b = crate::store::Batch::new();
        b.put(Space::Refs, i.to_be_bytes().to_vec(), Vec::new());
        kv.apply(b).unwrap();
    }
    let d = state_digest(&kv).unwrap();
    assert_eq!(d.records, n);
    // The last record counts too.
    let mut b = crate::store::Batch::new();
    b.put(Space::Refs, (n - 1).to_be_bytes().to_vec(), vec![1]);
    kv.apply(b).unwrap();
    assert_ne!(state_digest(&kv).unwrap(), d);
}
