//! Locators, the degraded index, heal intents, ReportMissing, the
//! UpdatePlacement compare-and-set, Collectable, ListPlacements, the
//! datanode registry's disk identity and the index migration from format 1.

use std::collections::BTreeSet;

use prost::Message;
use sluice_proto::raft as rpb;

use super::*;
use crate::sm::heal::{MAX_SHARDS_PER_CALL, intent_epoch};
use crate::sm::refs::{
    all_degraded, current_placement, locate, object_locator, part_locator, rebuild_index,
};
use crate::store::{Batch, Space};

/// A blob id of write epoch `epoch`.
fn blob(epoch: u64, n: u128) -> String {
    sluice_proto::blob_id::new_blob_id(epoch, n)
}

fn open_epoch(kv: &MemStore, epoch: u64) {
    let mut b = Batch::new();
    let rec = rpb::EpochRecord {
        gateway_id: "gw".into(),
        opened_ms: 1,
        renewed_ms: 1,
        renewals: 0,
        lease_ms: 0,
    };
    b.put(Space::Epochs, keys::epoch(epoch), rec.encode_to_vec());
    kv.apply(b).unwrap();
}

fn close_epoch(kv: &MemStore, epoch: u64) {
    let mut b = Batch::new();
    b.delete(Space::Epochs, keys::epoch(epoch));
    crate::sm::heal::drop_intents_of_epoch(kv, &mut b, epoch).unwrap();
    kv.apply(b).unwrap();
}

fn degraded(kv: &MemStore) -> BTreeSet<String> {
    all_degraded(kv).unwrap().into_iter().collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// The fixture placement of blob id `id` as given (unlike [`placement`],
/// which takes a test name and maps it through [`bid`]).
fn placed(id: &str) -> pb::Placement {
    pb::Placement {
        blob_id: id.into(),
        ..placement("")
    }
}

/// [`placed`] with shard indices `missing` missing.
fn with_missing(id: &str, missing: &[u32]) -> pb::Placement {
    pb::Placement {
        missing: missing.to_vec(),
        ..placed(id)
    }
}

/// Puts object b/`key` with one part per placement; it must be committed.
fn put_placements(kv: &MemStore, key: &str, placements: Vec<pb::Placement>) {
    let object = pb::ObjectRecord {
        bucket: "b".into(),
        key: key.into(),
        size: 1,
        etag: "e".into(),
        parts: placements
            .into_iter()
            .enumerate()
            .map(|(i, p)| pb::PartRecord {
                part_number: i as u32 + 1,
                placement: Some(p),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let a = exec(
        kv,
        Command::PutObject(pb::PutObjectRequest {
            object: Some(object),
            ..Default::default()
        }),
    );
    assert!(matches!(a, Applied::Released(_)), "{a:?}");
}

fn put_part_placement(kv: &MemStore, key: &str, id: &str, n: u32, body: &[u8], p: pb::Placement) {
    let part = pb::PartRecord {
        upload_id: id.into(),
        part_number: n,
        size: 6 * MIB,
        md5: md5_of(body),
        placement: Some(p),
        ..Default::default()
    };
    let a = exec(
        kv,
        Command::PutPart(pb::PutPartRequest {
            bucket: "b".into(),
            key: key.into(),
            part: Some(part),
            ..Default::default()
        }),
    );
    assert!(matches!(a, Applied::Released(_)), "{a:?}");
}

fn shard(blob: &str, index: u32) -> pb::ShardRef {
    pb::ShardRef {
        blob_id: blob.into(),
        shard_index: index,
    }
}

fn report(kv: &MemStore, node: u64, shards: Vec<pb::ShardRef>) -> Applied {
    exec(
        kv,
        Command::ReportMissing(pb::ReportMissingRequest {
            node_id: node,
            shards,
            ..Default::default()
        }),
    )
}

fn present(kv: &MemStore, node: u64, shards: Vec<pb::ShardRef>) -> Applied {
    exec(
        kv,
        Command::ReportPresent(pb::ReportPresentRequest {
            node_id: node,
            shards,
            ..Default::default()
        }),
    )
}

fn begin(kv: &MemStore, blob: &str, index: u32, node: u64, epoch: u64) -> Applied {
    exec(
        kv,
        Command::BeginHeal(pb::BeginHealRequest {
            blob_id: blob.into(),
            shard_index: index,
            node_id: node,
            epoch,
            ..Default::default()
        }),
    )
}

fn update(kv: &MemStore, expected: pb::Placement, new: pb::Placement, epoch: u64) -> Applied {
    exec(
        kv,
        Command::UpdatePlacement(pb::UpdatePlacementRequest {
            blob_id: new.blob_id.clone(),
            expected: Some(expected),
            placement: Some(new),
            epoch,
            ..Default::default()
        }),
    )
}

fn placement_of(kv: &MemStore, blob: &str) -> pb::Placement {
    current_placement(kv, blob).unwrap().unwrap().1
}

fn collect(kv: &MemStore, node: u64, shards: &[pb::ShardRef]) -> Vec<pb::ShardRef> {
    collectable(kv, node, shards).unwrap()
}

/// Applies ClaimPending of `blobs` released at or below `index`: those claimed.
fn claim(kv: &MemStore, blobs: &[&str], index: u64) -> Vec<String> {
    match exec(
        kv,
        Command::ClaimPending(rpb::ClaimPending {
            blob_ids: blobs.iter().map(|b| b.to_string()).collect(),
            released_before_index: index,
        }),
    ) {
        Applied::Claimed(ids) => ids,
        other => panic!("ClaimPending applied as {other:?}"),
    }
}

#[test]
fn locators_name_the_object_the_part_and_move_with_complete() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let [o1, p1, p2, nope] = ["o1", "p1", "p2", "nope"].map(bid);
    put(&kv, "b", "k", "o1");
    assert_eq!(locate(&kv, &o1).unwrap(), Some(object_locator("b", "k", 1)));
    let (loc, p) = current_placement(&kv, &o1).unwrap().unwrap();
    assert_eq!(loc.part_number, 1);
    assert_eq!(p, placed(&o1));

    upload(&kv, "b", "m", "u1");
    put_part_placement(&kv, "m", "u1", 1, b"one", placed(&p1));
    put_part_placement(&kv, "m", "u1", 2, b"two", placed(&p2));
    assert_eq!(
        locate(&kv, &p2).unwrap(),
        Some(part_locator("b", "m", "u1", 2))
    );
    assert_eq!(placement_of(&kv, &p2), placed(&p2));

    let done = exec(
        &kv,
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "m".into(),
            upload_id: "u1".into(),
            parts: vec![completed(1, b"one"), completed(2, b"two")],
            now_ms: 9,
            min_part_size: 5 * MIB,
            ..Default::default()
        }),
    );
    assert!(matches!(done, Applied::Completed(_)), "{done:?}");
    assert_eq!(locate(&kv, &p1).unwrap(), Some(object_locator("b", "m", 1)));
    assert_eq!(locate(&kv, &p2).unwrap(), Some(object_locator("b", "m", 2)));
    assert_eq!(placement_of(&kv, &p2), placed(&p2));
    assert_eq!(locate(&kv, &nope).unwrap(), None);
    assert_eq!(current_placement(&kv, &nope).unwrap(), None);
}

#[test]
fn degraded_index_follows_every_record_change() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let [a1, a2, c1, c2] = ["a1", "a2", "c1", "c2"].map(bid);
    let [p1, p2, p3, p3b, q1] = ["p1", "p2", "p3", "p3b", "q1"].map(bid);
    put_placements(&kv, "a", vec![with_missing(&a1, &[5])]);
    put_placements(&kv, "c", vec![placed(&c1)]);
    assert_eq!(degraded(&kv), set(&[&a1]));
    // Overwrite with a healthy blob: the degraded one is released.
    put_placements(&kv, "a", vec![placed(&a2)]);
    assert!(degraded(&kv).is_empty());
    // Delete drops it.
    put_placements(&kv, "c", vec![with_missing(&c2, &[0, 1])]);
    assert_eq!(degraded(&kv), set(&[&c2]));
    exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "c".into(),
            ..Default::default()
        }),
    );
    assert!(degraded(&kv).is_empty());

    // Parts: degraded while in the upload, kept by Complete when listed,
    // dropped when unlisted or replaced.
    upload(&kv, "b", "m", "u1");
    put_part_placement(&kv, "m", "u1", 1, b"one", with_missing(&p1, &[2]));
    put_part_placement(&kv, "m", "u1", 2, b"two", with_missing(&p2, &[3]));
    put_part_placement(&kv, "m", "u1", 3, b"three", with_missing(&p3, &[3]));
    assert_eq!(degraded(&kv), set(&[&p1, &p2, &p3]));
    put_part_placement(&kv, "m", "u1", 3, b"three", placed(&p3b));
    assert_eq!(degraded(&kv), set(&[&p1, &p2]));
    let done = exec(
        &kv,
        Command::CompleteUpload(pb::CompleteUploadRequest {
            bucket: "b".into(),
            key: "m".into(),
            upload_id: "u1".into(),
            parts: vec![completed(1, b"one"), completed(3, b"three")],
            now_ms: 9,
            min_part_size: 5 * MIB,
            ..Default::default()
        }),
    );
    assert!(matches!(done, Applied::Completed(_)), "{done:?}");
    assert_eq!(degraded(&kv), set(&[&p1]), "p2 unlisted, p1 moved");

    // Abort drops the degraded parts of the upload.
    upload(&kv, "b", "n", "u2");
    put_part_placement(&kv, "n", "u2", 1, b"x", with_missing(&q1, &[0]));
    assert_eq!(degraded(&kv), set(&[&p1, &q1]));
    exec(
        &kv,
        Command::AbortUpload(pb::UploadKey {
            bucket: "b".into(),
            key: "n".into(),
            upload_id: "u2".into(),
            ..Default::default()
        }),
    );
    assert_eq!(degraded(&kv), set(&[&p1]));
}

#[test]
fn report_missing_marks_only_shards_the_node_holds() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let [x1, x2, pp, ghost] = ["x1", "x2", "pp", "ghost"].map(bid);
    // nodes are 1..=6 for indices 0..=5.
    put_placements(&kv, "k", vec![placed(&x1), placed(&x2)]);
    upload(&kv, "b", "m", "u1");
    put_part_placement(&kv, "m", "u1", 1, b"p", placed(&pp));

    assert_eq!(
        report(&kv, 3, vec![shard(&x1, 2), shard(&x2, 2), shard(&pp, 2)]),
        Applied::Marked(3),
        "two placements of one object and a part record in one entry"
    );
    assert_eq!(placement_of(&kv, &x1).missing, vec![2]);
    assert_eq!(placement_of(&kv, &x2).missing, vec![2]);
    assert_eq!(placement_of(&kv, &pp).missing, vec![2]);
    assert_eq!(degraded(&kv), set(&[&pp, &x1, &x2]));

    // Already missing, another node's index, an unknown blob: ignored.
    assert_eq!(
        report(
            &kv,
            3,
            vec![
                shard(&x1, 2),
                shard(&x1, 3),
                shard(&ghost, 2),
                shard(&x1, 9)
            ]
        ),
        Applied::Marked(0)
    );
    assert_eq!(placement_of(&kv, &x1).missing, vec![2]);
    // Another index of the same blob on its own node: sorted in.
    assert_eq!(report(&kv, 1, vec![shard(&x1, 0)]), Applied::Marked(1));
    assert_eq!(placement_of(&kv, &x1).missing, vec![0, 2]);
    // Never below k = 4 present: x1 has exactly 4 left, so node 4's report
    // of index 3 (and node 5's of 4, in the same entry) marks nothing, and
    // x2 (5 present) takes one mark only.
    assert_eq!(
        report(&kv, 4, vec![shard(&x1, 3), shard(&x2, 3)]),
        Applied::Marked(1)
    );
    assert_eq!(report(&kv, 5, vec![shard(&x1, 4)]), Applied::Marked(0));
    assert_eq!(placement_of(&kv, &x1).missing, vec![0, 2]);
    assert_eq!(placement_of(&kv, &x2).missing, vec![2, 3]);
    // The object record keeps everything else.
    let obj = get_object(&kv, "b", "k").unwrap();
    assert_eq!(obj.parts.len(), 2);
    assert_eq!(obj.etag, "e");

    let too_many: Vec<_> = (0..=MAX_SHARDS_PER_CALL as u128)
        .map(|i| shard(&blob(1, i), 0))
        .collect();
    assert_eq!(
        refused_code(&report(&kv, 1, too_many)),
        Some(ErrorCode::InvalidArgument)
    );
}

#[test]
fn report_present_unmarks_only_missing_shards_assigned_to_the_node() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let [x1, x2, pp, ghost] = ["x1", "x2", "pp", "ghost"].map(bid);
    // nodes are 1..=6 for indices 0..=5.
    put_placements(&kv, "k", vec![placed(&x1), placed(&x2)]);
    upload(&kv, "b", "m", "u1");
    put_part_placement(&kv, "m", "u1", 1, b"p", placed(&pp));
    assert_eq!(
        report(&kv, 3, vec![shard(&x1, 2), shard(&x2, 2), shard(&pp, 2)]),
        Applied::Marked(3)
    );
    assert_eq!(report(&kv, 1, vec![shard(&x1, 0)]), Applied::Marked(1));
    assert_eq!(degraded(&kv), set(&[&pp, &x1, &x2]));

    // Node 3 speaks for its index 2 only: index 0 is missing but node 1's,
    // index 3 is node 4's and not missing, index 9 is outside the
    // placement, the ghost blob is unreferenced.
    assert_eq!(
        present(
            &kv,
            3,
            vec![
                shard(&x1, 2),
                shard(&x1, 0),
                shard(&x1, 3),
                shard(&x1, 9),
                shard(&ghost, 2)
            ]
        ),
        Applied::Unmarked(1)
    );
    assert_eq!(placement_of(&kv, &x1).missing, vec![0]);
    assert_eq!(
        degraded(&kv),
        set(&[&pp, &x1, &x2]),
        "x1 still misses index 0"
    );
    // Two placements of one object and a part record in one entry; x1's
    // last missing shard goes with node 1's report.
    assert_eq!(
        present(&kv, 3, vec![shard(&x2, 2), shard(&pp, 2)]),
        Applied::Unmarked(2)
    );
    assert_eq!(present(&kv, 1, vec![shard(&x1, 0)]), Applied::Unmarked(1));
    for id in [&x1, &x2, &pp] {
        assert_eq!(placement_of(&kv, id), placed(id), "only missing changes");
    }
    assert!(degraded(&kv).is_empty(), "no missing shard, not degraded");
    // Not missing (any more): nothing to do, nothing written.
    assert_eq!(present(&kv, 3, vec![shard(&x1, 2)]), Applied::Unmarked(0));
    let obj = get_object(&kv, "b", "k").unwrap();
    assert_eq!(obj.parts.len(), 2);
    assert_eq!(obj.etag, "e");

    let too_many: Vec<_> = (0..=MAX_SHARDS_PER_CALL as u128)
        .map(|i| shard(&blob(1, i), 0))
        .collect();
    assert_eq!(
        refused_code(&present(&kv, 1, too_many)),
        Some(ErrorCode::InvalidArgument)
    );
}

#[test]
fn report_present_ignores_an_index_heal_moved_elsewhere() {
    let kv = MemStore::new();
    let x = healing(&kv); // index 2 missing on node 3, heal onto 9 begun
    assert_eq!(
        update(&kv, with_missing(&x, &[2]), healed(&x), 7),
        Applied::Done
    );
    // Node 3's copy is no longer assigned: its report changes nothing, and
    // node 9's index is not missing.
    assert_eq!(present(&kv, 3, vec![shard(&x, 2)]), Applied::Unmarked(0));
    assert_eq!(present(&kv, 9, vec![shard(&x, 2)]), Applied::Unmarked(0));
    assert_eq!(placement_of(&kv, &x), healed(&x));
    assert!(degraded(&kv).is_empty());

    // Moved while marked again: a missing index now assigned to node 9 is
    // not node 3's to un-mark.
    assert_eq!(report(&kv, 9, vec![shard(&x, 2)]), Applied::Marked(1));
    assert_eq!(present(&kv, 3, vec![shard(&x, 2)]), Applied::Unmarked(0));
    assert_eq!(placement_of(&kv, &x).missing, vec![2]);
    assert_eq!(present(&kv, 9, vec![shard(&x, 2)]), Applied::Unmarked(1));
    assert_eq!(placement_of(&kv, &x), healed(&x));
}

#[test]
fn a_heal_racing_report_present_loses_and_its_intent_is_harmless() {
    let kv = MemStore::new();
    let x = healing(&kv); // index 2 missing on node 3, heal onto 9 begun
    // The in-place variant of the same race: a second healer rebuilding
    // index 2 on node 3 itself.
    assert_eq!(begin(&kv, &x, 2, 3, 7), Applied::Done);
    assert_eq!(present(&kv, 3, vec![shard(&x, 2)]), Applied::Unmarked(1));
    assert_eq!(placement_of(&kv, &x), placed(&x));
    assert!(degraded(&kv).is_empty());

    // Both healers read the placement with index 2 missing: the missing
    // set changed, so the compare-and-set refuses either.
    for new in [healed(&x), placed(&x)] {
        assert_eq!(
            refused_code(&update(&kv, with_missing(&x, &[2]), new, 7)),
            Some(ErrorCode::PlacementChanged)
        );
    }
    assert_eq!(placement_of(&kv, &x), placed(&x), "refusals change nothing");
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), Some(7));
    assert_eq!(intent_epoch(&kv, 3, &x, 2).unwrap(), Some(7));

    // The intents keep GC off their shards until epoch 7 closes; then
    // node 9's copy is garbage (once x's own epoch is closed) and node 3's
    // stays, assigned to it.
    close_epoch(&kv, 3);
    assert!(collect(&kv, 9, &[shard(&x, 2)]).is_empty());
    assert!(collect(&kv, 3, &[shard(&x, 2)]).is_empty());
    close_epoch(&kv, 7);
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), None);
    assert_eq!(collect(&kv, 9, &[shard(&x, 2)]), vec![shard(&x, 2)]);
    assert!(collect(&kv, 3, &[shard(&x, 2)]).is_empty());
}

#[test]
fn begin_heal_needs_a_referenced_blob_and_an_open_epoch() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let x = blob(3, 1);
    open_epoch(&kv, 3); // the fence: x's epoch is open when it is put
    put_placements(&kv, "k", vec![with_missing(&x, &[2])]);
    open_epoch(&kv, 7);

    assert_eq!(
        refused_code(&begin(&kv, &blob(3, 99), 2, 9, 7)),
        Some(ErrorCode::PlacementChanged)
    );
    assert_eq!(
        refused_code(&begin(&kv, &x, 2, 9, 8)),
        Some(ErrorCode::EpochClosed)
    );
    assert_eq!(
        refused_code(&begin(&kv, &x, 6, 9, 7)),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(begin(&kv, &x, 2, 9, 7), Applied::Done);
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), Some(7));
    // Idempotent.
    let (b, a) = apply_command(
        &kv,
        next_index(),
        &MetaCommand {
            command: Some(Command::BeginHeal(pb::BeginHealRequest {
                blob_id: x.clone(),
                shard_index: 2,
                node_id: 9,
                epoch: 7,
                ..Default::default()
            })),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(a, Applied::Done);
    assert!(b.is_empty(), "a repeated BeginHeal writes nothing");

    // Re-begun under another epoch, the intent moves; closing the old
    // epoch keeps it, closing the new one drops it.
    open_epoch(&kv, 8);
    assert_eq!(begin(&kv, &x, 2, 9, 8), Applied::Done);
    assert_eq!(begin(&kv, &x, 3, 9, 7), Applied::Done);
    close_epoch(&kv, 7);
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), Some(8));
    assert_eq!(intent_epoch(&kv, 9, &x, 3).unwrap(), None);
    close_epoch(&kv, 8);
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), None);
    assert!(
        kv.scan(
            Space::HealIntents,
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            10
        )
        .unwrap()
        .is_empty(),
        "both key families are gone"
    );
}

/// An object at b/k whose blob (epoch 3, left open) misses shard 2 on node
/// 3, a heal of it onto node 9 begun under epoch 7.
fn healing(kv: &MemStore) -> String {
    bucket(kv, "b");
    let x = blob(3, 1);
    open_epoch(kv, 3); // the fence: x's epoch is open when it is put
    put_placements(kv, "k", vec![placed(&x)]);
    assert_eq!(report(kv, 3, vec![shard(&x, 2)]), Applied::Marked(1));
    open_epoch(kv, 7);
    assert_eq!(begin(kv, &x, 2, 9, 7), Applied::Done);
    x
}

fn healed(x: &str) -> pb::Placement {
    let mut p = placed(x);
    p.nodes[2] = 9;
    p
}

#[test]
fn update_placement_compare_and_set() {
    let kv = MemStore::new();
    let x = healing(&kv);
    let expected = with_missing(&x, &[2]);
    assert_eq!(degraded(&kv), set(&[&x]));

    // Stale expected: the placement is not what the healer read.
    assert_eq!(
        refused_code(&update(&kv, placed(&x), healed(&x), 7)),
        Some(ErrorCode::PlacementChanged)
    );
    // Closed epoch.
    assert_eq!(
        refused_code(&update(&kv, expected.clone(), healed(&x), 8)),
        Some(ErrorCode::EpochClosed)
    );
    // No intent for the node the shard moves to.
    let mut elsewhere = placed(&x);
    elsewhere.nodes[2] = 10;
    assert_eq!(
        refused_code(&update(&kv, expected.clone(), elsewhere, 7)),
        Some(ErrorCode::PlacementChanged)
    );
    // No intent for a second moved index.
    let mut two = healed(&x);
    two.nodes[4] = 11;
    assert_eq!(
        refused_code(&update(&kv, expected.clone(), two, 7)),
        Some(ErrorCode::PlacementChanged)
    );
    // The new placement must keep the blob's shape.
    let mut shape = healed(&x);
    shape.block_size = 4096;
    assert_eq!(
        refused_code(&update(&kv, expected.clone(), shape, 7)),
        Some(ErrorCode::InvalidArgument)
    );
    let mut short = healed(&x);
    short.nodes.pop();
    assert_eq!(
        refused_code(&update(&kv, expected.clone(), short, 7)),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(placement_of(&kv, &x), expected, "refusals change nothing");

    assert_eq!(update(&kv, expected.clone(), healed(&x), 7), Applied::Done);
    assert_eq!(placement_of(&kv, &x), healed(&x));
    assert!(degraded(&kv).is_empty());
    assert_eq!(intent_epoch(&kv, 9, &x, 2).unwrap(), None, "consumed");
    // A second, duplicate heal loses the race.
    assert_eq!(
        refused_code(&update(&kv, expected, healed(&x), 7)),
        Some(ErrorCode::PlacementChanged)
    );

    // In-place repair (same node, index leaves missing) needs an intent too.
    assert_eq!(report(&kv, 1, vec![shard(&x, 0)]), Applied::Marked(1));
    let degraded_now = placement_of(&kv, &x);
    assert_eq!(
        refused_code(&update(&kv, degraded_now.clone(), healed(&x), 7)),
        Some(ErrorCode::PlacementChanged)
    );
    assert_eq!(begin(&kv, &x, 0, 1, 7), Applied::Done);
    assert_eq!(update(&kv, degraded_now, healed(&x), 7), Applied::Done);
    assert!(placement_of(&kv, &x).missing.is_empty());

    // Deleted meanwhile.
    exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "k".into(),
            ..Default::default()
        }),
    );
    assert_eq!(
        refused_code(&update(&kv, healed(&x), healed(&x), 7)),
        Some(ErrorCode::PlacementChanged)
    );
}

#[test]
fn update_placement_of_a_part_record() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    upload(&kv, "b", "m", "u1");
    let x = blob(3, 5);
    open_epoch(&kv, 3); // the fence: x's epoch is open when it is put
    put_part_placement(&kv, "m", "u1", 4, b"p", with_missing(&x, &[2]));
    open_epoch(&kv, 7);
    assert_eq!(begin(&kv, &x, 2, 9, 7), Applied::Done);
    assert_eq!(
        update(&kv, with_missing(&x, &[2]), healed(&x), 7),
        Applied::Done
    );
    assert_eq!(placement_of(&kv, &x), healed(&x));
    assert_eq!(
        locate(&kv, &x).unwrap(),
        Some(part_locator("b", "m", "u1", 4))
    );
    assert!(degraded(&kv).is_empty());
}

#[test]
fn collectable_answers_every_branch() {
    let kv = MemStore::new();
    let x = healing(&kv); // blob of epoch 3, shard 2 healed onto node 9
    open_epoch(&kv, 3);

    // Placed shards are never collectable; a missing one is not placed,
    // but its blob's epoch (3) is open.
    assert!(collect(&kv, 1, &[shard(&x, 0)]).is_empty());
    assert!(collect(&kv, 3, &[shard(&x, 2)]).is_empty());
    // The heal intent protects the shard being written on node 9.
    assert!(collect(&kv, 9, &[shard(&x, 2)]).is_empty());

    assert_eq!(
        update(&kv, with_missing(&x, &[2]), healed(&x), 7),
        Applied::Done
    );
    // Node 9 now holds the placed shard; node 3's stale copy waits for the
    // blob's epoch to close.
    assert!(collect(&kv, 9, &[shard(&x, 2)]).is_empty());
    assert!(collect(&kv, 3, &[shard(&x, 2)]).is_empty());
    close_epoch(&kv, 3);
    assert_eq!(collect(&kv, 3, &[shard(&x, 2)]), vec![shard(&x, 2)]);
    assert!(collect(&kv, 9, &[shard(&x, 2)]).is_empty());
    // Another node's index of a referenced blob is not this node's shard.
    assert_eq!(collect(&kv, 1, &[shard(&x, 3)]), vec![shard(&x, 3)]);

    // A reported-missing shard stays while its index is assigned to the
    // node, epoch closed or not: the node may only have been down, and its
    // file the copy a read or heal still needs. A heal that assigns the
    // index elsewhere releases it (node 3's copy above).
    assert_eq!(report(&kv, 1, vec![shard(&x, 0)]), Applied::Marked(1));
    assert!(collect(&kv, 1, &[shard(&x, 0)]).is_empty());

    // Unreferenced blobs: open epoch keeps them, closed (and ids that
    // name no epoch) not.
    open_epoch(&kv, 5);
    let young = blob(5, 1);
    let no_epoch = "0123456789abcdef".to_string();
    assert_eq!(
        collect(&kv, 1, &[shard(&young, 0), shard(&no_epoch, 1)]),
        vec![shard(&no_epoch, 1)]
    );

    // An intent on an unreferenced blob protects it until its epoch closes;
    // a released blob's shards wait for the reclaimer's claim.
    let gone = blob(2, 1);
    open_epoch(&kv, 2); // the fence: gone's epoch is open when it is put
    put_placements(&kv, "g", vec![placed(&gone)]);
    close_epoch(&kv, 2);
    assert_eq!(begin(&kv, &gone, 1, 9, 7), Applied::Done);
    exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "g".into(),
            ..Default::default()
        }),
    );
    let released_at = pending::get(&kv, &gone)
        .unwrap()
        .map(|d| d.released_index)
        .expect("pending");
    assert_eq!(claim(&kv, &[&gone], released_at), vec![gone.clone()]);
    assert!(collect(&kv, 9, &[shard(&gone, 1)]).is_empty(), "the intent");
    close_epoch(&kv, 7);
    assert_eq!(collect(&kv, 9, &[shard(&gone, 1)]), vec![shard(&gone, 1)]);

    // A pending deletion waits for its claim, whatever its epoch or its
    // leader time: no clock is read.
    let released = blob(5, 2);
    let mut b = Batch::new();
    let rec = rpb::PendingDeletion {
        placement: Some(placed(&released)),
        released_ms: 1000,
        remaining_nodes: vec![1, 2, 3, 4, 5, 6],
        released_index: 40,
        claimed: false,
    };
    b.put(
        Space::Pending,
        keys::pending(&released),
        rec.encode_to_vec(),
    );
    kv.apply(b).unwrap();
    assert!(collect(&kv, 1, &[shard(&released, 0)]).is_empty());
    assert!(claim(&kv, &[&released], 39).is_empty(), "released later");
    assert!(collect(&kv, 1, &[shard(&released, 0)]).is_empty());
    assert_eq!(claim(&kv, &[&released], 40), vec![released.clone()]);
    assert_eq!(
        collect(&kv, 1, &[shard(&released, 0)]),
        vec![shard(&released, 0)]
    );

    // Request order, duplicates kept; the bound.
    assert_eq!(
        collect(
            &kv,
            1,
            &[shard(&no_epoch, 1), shard(&young, 0), shard(&no_epoch, 1)]
        ),
        vec![shard(&no_epoch, 1), shard(&no_epoch, 1)]
    );
    let max: Vec<_> = (0..MAX_SHARDS_PER_CALL)
        .map(|i| shard(&no_epoch, i as u32))
        .collect();
    assert_eq!(collect(&kv, 1, &max).len(), MAX_SHARDS_PER_CALL);
    let too_many: Vec<_> = (0..=MAX_SHARDS_PER_CALL)
        .map(|i| shard(&no_epoch, i as u32))
        .collect();
    assert!(matches!(
        collectable(&kv, 1, &too_many),
        Err(SmError::Refused {
            code: ErrorCode::InvalidArgument,
            ..
        })
    ));
}

#[test]
fn list_placements_pages_all_or_degraded_blobs() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    for i in 0..25u128 {
        let p = if i % 5 == 0 {
            with_missing(&blob(1, i), &[1])
        } else {
            placed(&blob(1, i))
        };
        put_placements(&kv, &format!("k{i:02}"), vec![p]);
    }
    upload(&kv, "b", "m", "u1");
    put_part_placement(&kv, "m", "u1", 1, b"p", with_missing(&blob(1, 100), &[0]));

    let page = |after: &str, limit: u32, degraded_only: bool| {
        list_placements(
            &kv,
            &pb::ListPlacementsRequest {
                after_blob_id: after.into(),
                limit,
                degraded_only,
            },
        )
        .unwrap()
    };
    let mut all = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let p = page(&after, 10, false);
        pages += 1;
        for b in &p.blobs {
            let pl = b.placement.as_ref().unwrap();
            assert_eq!(
                locate(&kv, &pl.blob_id).unwrap().as_ref(),
                b.locator.as_ref()
            );
            all.push(pl.blob_id.clone());
        }
        if !p.is_truncated {
            break;
        }
        after = all.last().unwrap().clone();
    }
    assert_eq!(pages, 3);
    assert_eq!(all.len(), 26);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "blob id order");

    let d = page("", 0, true);
    assert!(!d.is_truncated);
    let ids: Vec<_> = d
        .blobs
        .iter()
        .map(|b| b.placement.as_ref().unwrap().blob_id.clone())
        .collect();
    let mut want: Vec<_> = [0u128, 5, 10, 15, 20, 100]
        .iter()
        .map(|i| blob(1, *i))
        .collect();
    want.sort();
    assert_eq!(ids, want);
    let part = d
        .blobs
        .iter()
        .find(|b| b.placement.as_ref().unwrap().blob_id == blob(1, 100))
        .unwrap();
    assert_eq!(part.locator, Some(part_locator("b", "m", "u1", 1)));
    assert_eq!(page(&want[4], 0, true).blobs.len(), 1);
}

fn register(kv: &MemStore, id: u64, addr: &str, disk: &str) -> Applied {
    exec(
        kv,
        Command::RegisterDatanode(pb::RegisterDatanodeRequest {
            id,
            addr: addr.into(),
            disk_id: disk.into(),
            ..Default::default()
        }),
    )
}

fn generation(gen_: u64, replaced: bool) -> Applied {
    Applied::Registered(pb::RegisterDatanodeResponse {
        disk_generation: gen_,
        disk_replaced: replaced,
    })
}

#[test]
fn registration_bumps_the_disk_generation_on_a_new_disk() {
    let kv = MemStore::new();
    assert_eq!(register(&kv, 1, "http://a", "disk-a"), generation(0, false));
    assert_eq!(register(&kv, 1, "http://b", "disk-a"), generation(0, false));
    assert_eq!(register(&kv, 1, "http://b", "disk-b"), generation(1, true));
    let n = get_datanode(&kv, 1).unwrap().unwrap();
    assert_eq!((n.disk_id.as_str(), n.disk_generation), ("disk-b", 1));
    // A datanode without disk identity keeps the recorded disk.
    assert_eq!(register(&kv, 1, "http://b", ""), generation(1, false));
    assert_eq!(get_datanode(&kv, 1).unwrap().unwrap().disk_id, "disk-b");
    assert_eq!(register(&kv, 1, "http://b", "disk-c"), generation(2, true));
    // A record without disk id adopts the first one without a bump.
    assert_eq!(register(&kv, 2, "http://x", ""), generation(0, false));
    assert_eq!(register(&kv, 2, "http://x", "disk-x"), generation(0, false));
    assert_eq!(get_datanode(&kv, 2).unwrap().unwrap().disk_id, "disk-x");
    assert_eq!(
        refused_code(&register(&kv, 3, "", "d")),
        Some(ErrorCode::InvalidArgument)
    );
}

/// Rebuilding the indexes from the records gives back every locator and
/// the degraded index that mutations kept.
#[test]
fn rebuilt_indexes_match_the_kept_ones() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    for i in 0..1500u128 {
        let p = if i % 100 == 0 {
            with_missing(&blob(1, i), &[4])
        } else {
            placed(&blob(1, i))
        };
        put_placements(&kv, &format!("k{i:04}"), vec![p]);
    }
    upload(&kv, "b", "m", "u1");
    let pp = bid("pp");
    put_part_placement(&kv, "m", "u1", 3, b"p", with_missing(&pp, &[1]));
    let want_degraded = degraded(&kv);
    assert_eq!(want_degraded.len(), 16);

    let mut damage = Batch::new();
    for id in crate::sm::refs::all_references(&kv).unwrap() {
        damage.put(Space::Refs, id.into_bytes(), Vec::new());
    }
    for id in &want_degraded {
        damage.delete(Space::Degraded, id.as_bytes().to_vec());
    }
    damage.put(Space::Refs, b"ghost".to_vec(), Vec::new());
    kv.apply(damage).unwrap();

    assert_eq!(rebuild_index(&kv).unwrap(), 1501);
    assert_eq!(
        locate(&kv, &pp).unwrap(),
        Some(part_locator("b", "m", "u1", 3))
    );
    assert_eq!(
        locate(&kv, &blob(1, 1234)).unwrap(),
        Some(object_locator("b", "k1234", 1))
    );
    assert_eq!(locate(&kv, "ghost").unwrap(), None, "stale entries go");
    assert_eq!(degraded(&kv), want_degraded);
}

fn lease(kv: &MemStore, epoch: u64, lease_id: u64, blobs: &[&str]) -> Applied {
    exec(
        kv,
        Command::LeaseBlobs(pb::LeaseBlobsRequest {
            epoch,
            lease_id,
            blob_ids: blobs.iter().map(|b| b.to_string()).collect(),
        }),
    )
}

fn release_lease(kv: &MemStore, epoch: u64, lease_id: u64) {
    let r = exec(
        kv,
        Command::ReleaseBlobs(pb::ReleaseBlobsRequest { epoch, lease_id }),
    );
    assert_eq!(r, Applied::Done);
}

/// A released blob (its object deleted) and the index that released it.
fn released_blob(kv: &MemStore, key: &str, n: u128) -> (String, u64) {
    let id = blob(2, n);
    open_epoch(kv, 2);
    put_placements(kv, key, vec![placed(&id)]);
    exec(
        kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: key.into(),
            ..Default::default()
        }),
    );
    let index = pending::get(kv, &id)
        .unwrap()
        .expect("pending")
        .released_index;
    (id, index)
}

#[test]
fn a_read_lease_holds_back_the_claim_until_released_or_its_epoch_closes() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let (x, at) = released_blob(&kv, "x", 1);
    let (y, _) = released_blob(&kv, "y", 2);
    open_epoch(&kv, 9);
    // A GET reading x and y leases both under epoch 9.
    assert_eq!(lease(&kv, 9, 1, &[&x, &y]), Applied::Leased(Vec::new()));
    assert_eq!(lease(&kv, 9, 2, &[&x]), Applied::Leased(Vec::new()));
    assert!(claim(&kv, &[&x, &y], u64::MAX).is_empty(), "both leased");
    assert!(collect(&kv, 1, &[shard(&x, 0), shard(&y, 0)]).is_empty());
    // Lease 1 ends: y is free, x still held by lease 2.
    release_lease(&kv, 9, 1);
    release_lease(&kv, 9, 1);
    assert_eq!(claim(&kv, &[&x, &y], u64::MAX), vec![y.clone()]);
    assert_eq!(
        collect(&kv, 1, &[shard(&x, 0), shard(&y, 0)]),
        vec![shard(&y, 0)]
    );
    // The holder's epoch closes (its gateway died): its leases end.
    exec(
        &kv,
        Command::CloseEpochs(rpb::CloseEpochs { epochs: vec![9] }),
    );
    assert_eq!(claim(&kv, &[&x], at), vec![x.clone()]);
    assert_eq!(collect(&kv, 1, &[shard(&x, 0)]), vec![shard(&x, 0)]);
    assert!(
        kv.scan(
            Space::ReadLeases,
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            10
        )
        .unwrap()
        .is_empty(),
        "no lease key left"
    );
}

#[test]
fn a_lease_after_the_claim_reports_the_blob_lost() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let (x, at) = released_blob(&kv, "x", 1);
    let live = blob(2, 3);
    put_placements(&kv, "live", vec![placed(&live)]);
    assert_eq!(claim(&kv, &[&x], at), vec![x.clone()]);
    open_epoch(&kv, 9);
    assert_eq!(
        lease(&kv, 9, 1, &[&live, &x]),
        Applied::Leased(vec![x.clone()])
    );
    // A claimed record stays claimed; a repeated claim names it again.
    assert_eq!(claim(&kv, &[&x], 0), vec![x.clone()]);
    // The live blob, once released later, is held by the lease.
    exec(
        &kv,
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: "live".into(),
            ..Default::default()
        }),
    );
    assert!(claim(&kv, &[&live], u64::MAX).is_empty());
}

#[test]
fn leases_need_an_open_epoch_and_bounded_clean_ids() {
    let kv = MemStore::new();
    let x = blob(2, 1);
    assert_eq!(
        refused_code(&lease(&kv, 4, 1, &[&x])),
        Some(ErrorCode::EpochClosed)
    );
    open_epoch(&kv, 4);
    assert_eq!(
        refused_code(&lease(&kv, 4, 1, &["bad\0id"])),
        Some(ErrorCode::InvalidArgument)
    );
    let many: Vec<String> = (0..=crate::sm::leases::MAX_LEASE_BLOBS)
        .map(|i| format!("b{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        refused_code(&lease(&kv, 4, 1, &many)),
        Some(ErrorCode::InvalidArgument)
    );
}
