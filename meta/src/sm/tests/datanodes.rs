//! Datanode drain and remove (admin), on the in-memory store: the rules of
//! `sm::registry`, labels kept across registrations, exactly-once replays.

use sluice_proto::admin as apb;
use sluice_proto::raft as rpb;

use super::*;
use crate::store::Space;

fn register(kv: &MemStore, id: u64, zone: &str, host: &str) -> Applied {
    exec(
        kv,
        Command::RegisterDatanode(pb::RegisterDatanodeRequest {
            id,
            addr: format!("http://127.0.0.1:{}", 7100 + id),
            disk_id: format!("disk-{id}"),
            zone: zone.into(),
            host: host.into(),
            ..Default::default()
        }),
    )
}

fn drain(id: u64, undrain: bool, op: &str) -> Command {
    Command::DrainDatanode(apb::DrainDatanodeRequest {
        id,
        undrain,
        op_id: op.into(),
    })
}

fn remove(id: u64, force: bool, op: &str) -> Command {
    Command::RemoveDatanode(apb::RemoveDatanodeRequest {
        id,
        force,
        op_id: op.into(),
    })
}

fn info(kv: &MemStore, id: u64) -> Option<pb::DatanodeInfo> {
    get_datanode(kv, id).unwrap()
}

/// Six datanodes 1..=6 on hosts a/b/c and one object placed on them.
fn cluster() -> MemStore {
    let kv = MemStore::default();
    for id in 1..=7 {
        register(&kv, id, "z1", ["a", "b", "c"][(id as usize - 1) % 3]);
    }
    bucket(&kv, "b");
    assert!(matches!(put(&kv, "b", "k", "x"), Applied::Released(_)));
    kv
}

#[test]
fn labels_are_recorded_and_draining_survives_reregistration() {
    let kv = cluster();
    let d = info(&kv, 2).expect("registered");
    assert_eq!(
        (d.zone.as_str(), d.host.as_str(), d.draining),
        ("z1", "b", false)
    );
    assert_eq!(exec(&kv, drain(2, false, "")), Applied::Done);
    assert!(info(&kv, 2).unwrap().draining);
    // A restart re-registers (new labels even): still draining.
    register(&kv, 2, "z2", "b2");
    let d = info(&kv, 2).unwrap();
    assert_eq!(
        (d.zone.as_str(), d.host.as_str(), d.draining),
        ("z2", "b2", true)
    );
    assert_eq!(exec(&kv, drain(2, true, "")), Applied::Done);
    assert!(!info(&kv, 2).unwrap().draining);
    assert_eq!(
        refused_code(&exec(&kv, drain(99, false, ""))),
        Some(ErrorCode::NoSuchDatanode)
    );
}

#[test]
fn placed_shards_count_non_missing_indices() {
    let kv = cluster();
    let counts = registry::placed_shards(&kv, &[1, 6, 7]).unwrap();
    assert_eq!(counts[&1], 1);
    assert_eq!(counts[&6], 1);
    assert_eq!(counts[&7], 0);
}

#[test]
fn remove_refuses_while_a_placement_names_the_node() {
    let kv = cluster();
    let a = exec(&kv, remove(3, false, ""));
    assert_eq!(refused_code(&a), Some(ErrorCode::DatanodeInUse), "{a:?}");
    assert!(info(&kv, 3).is_some());
    // A node no placement names is removed.
    assert_eq!(exec(&kv, remove(7, false, "")), Applied::Marked(0));
    assert!(info(&kv, 7).is_none());
    assert_eq!(
        refused_code(&exec(&kv, remove(7, false, ""))),
        Some(ErrorCode::NoSuchDatanode)
    );
}

#[test]
fn forced_remove_marks_shards_missing_while_k_remain() {
    let kv = cluster();
    // Node 3 is gone for good: forced removal marks its shard missing.
    assert_eq!(exec(&kv, remove(3, true, "")), Applied::Marked(1));
    assert!(info(&kv, 3).is_none());
    let (_, p) = crate::sm::refs::current_placement(&kv, &bid("x"))
        .unwrap()
        .unwrap();
    assert_eq!(p.missing, vec![2]);
    assert_eq!(crate::sm::refs::all_degraded(&kv).unwrap(), vec![bid("x")]);
    // Two more missing would leave 3 < k = 4 shards: refused, even forced.
    assert_eq!(exec(&kv, remove(4, true, "")), Applied::Marked(1));
    let a = exec(&kv, remove(5, true, ""));
    assert_eq!(refused_code(&a), Some(ErrorCode::DatanodeInUse), "{a:?}");
    assert!(info(&kv, 5).is_some());
}

#[test]
fn remove_after_the_shards_moved_and_pending_records_drop_the_node() {
    let kv = cluster();
    // Move shard 0 off node 1 (what the mover's compare-and-set does).
    let (_, before) = crate::sm::refs::current_placement(&kv, &bid("x"))
        .unwrap()
        .unwrap();
    exec(
        &kv,
        Command::BeginHeal(pb::BeginHealRequest {
            blob_id: bid("x"),
            shard_index: 0,
            node_id: 7,
            epoch: EPOCH,
            op_id: String::new(),
        }),
    );
    let mut after = before.clone();
    after.nodes[0] = 7;
    let a = exec(
        &kv,
        Command::UpdatePlacement(pb::UpdatePlacementRequest {
            blob_id: bid("x"),
            expected: Some(before),
            placement: Some(after),
            epoch: EPOCH,
            op_id: String::new(),
        }),
    );
    assert_eq!(a, Applied::Done);
    // A released blob whose pending deletion waits for nodes 1 and 2.
    let mut b = crate::store::Batch::new();
    let mut released = placement("gone");
    released.nodes = vec![1, 2];
    pending::record_released(&mut b, &[released.clone()], 5, 5);
    let mut only1 = placement("gone1");
    only1.nodes = vec![1];
    pending::record_released(&mut b, &[only1], 5, 5);
    kv.apply(b).unwrap();

    assert_eq!(exec(&kv, remove(1, false, "op-r")), Applied::Marked(0));
    assert!(info(&kv, 1).is_none());
    let rec: rpb::PendingDeletion = pending::get(&kv, &bid("gone")).unwrap().expect("kept");
    assert_eq!(rec.remaining_nodes, vec![2]);
    assert!(pending::get(&kv, &bid("gone1")).unwrap().is_none());
    assert!(
        kv.get(Space::Datanodes, &keys::datanode(1))
            .unwrap()
            .is_none()
    );
}

#[test]
fn drain_and_remove_are_exactly_once() {
    let kv = cluster();
    assert_eq!(exec(&kv, drain(7, false, "op-d")), Applied::Done);
    // Undrained meanwhile; a replay of op-d changes nothing.
    assert_eq!(exec(&kv, drain(7, true, "op-u")), Applied::Done);
    assert_eq!(exec(&kv, drain(7, false, "op-d")), Applied::Done);
    assert!(!info(&kv, 7).unwrap().draining);
    // A refused remove replays as refused even after it would succeed.
    let first = exec(&kv, remove(3, false, "op-x"));
    assert_eq!(refused_code(&first), Some(ErrorCode::DatanodeInUse));
    assert_eq!(exec(&kv, remove(7, false, "op-y")), Applied::Marked(0));
    // The node re-registers; a replay of op-y does not remove it again.
    register(&kv, 7, "z1", "a");
    assert_eq!(exec(&kv, remove(7, false, "op-y")), Applied::Marked(0));
    assert!(info(&kv, 7).is_some());
    assert_eq!(exec(&kv, remove(3, false, "op-x")), first);
}
