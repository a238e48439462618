//! Access keys: create/delete, grants, bucket ownership by CreateBucket,
//! grants dropped with their bucket, and exactly-once replay.

use sluice_proto::raft as rpb;

use super::*;
use crate::sm::access::{get_access_key, list_access_keys};

fn create_key(kv: &MemStore, id: &str, op: &str) -> Applied {
    exec(
        kv,
        Command::CreateAccessKey(rpb::CreateAccessKey {
            id: id.into(),
            name: format!("name-{id}"),
            secret: format!("secret-{id}"),
            op_id: op.into(),
        }),
    )
}

fn grant(kv: &MemStore, id: &str, bucket: &str, allow: bool, rwo: (bool, bool, bool)) -> Applied {
    exec(
        kv,
        Command::SetKeyGrant(rpb::SetKeyGrant {
            id: id.into(),
            bucket: bucket.into(),
            read: rwo.0,
            write: rwo.1,
            owner: rwo.2,
            allow,
            op_id: String::new(),
        }),
    )
}

fn create_bucket_as(kv: &MemStore, name: &str, owner: &str) -> Applied {
    exec(
        kv,
        Command::CreateBucket(pb::CreateBucketRequest {
            name: name.into(),
            owner_key_id: owner.into(),
            ..Default::default()
        }),
    )
}

fn grants(kv: &MemStore, id: &str) -> Vec<(String, bool, bool, bool)> {
    get_access_key(kv, id)
        .unwrap()
        .unwrap()
        .grants
        .into_iter()
        .map(|g| (g.bucket, g.read, g.write, g.owner))
        .collect()
}

#[test]
fn keys_are_created_listed_and_deleted() {
    let kv = MemStore::new();
    assert_eq!(
        create_key(&kv, "SK1", "op1"),
        Applied::KeyCreated("SK1".into())
    );
    let k = get_access_key(&kv, "SK1").unwrap().unwrap();
    assert_eq!(k.secret, "secret-SK1");
    assert_eq!(k.name, "name-SK1");
    // A second key with the same id is refused.
    assert_eq!(
        refused_code(&create_key(&kv, "SK1", "op2")),
        Some(ErrorCode::InvalidArgument)
    );
    create_key(&kv, "SK2", "op3");
    let ids: Vec<String> = list_access_keys(&kv)
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(ids, ["SK1", "SK2"]);
    let del = |op: &str| {
        exec(
            &kv,
            Command::DeleteAccessKey(rpb::DeleteAccessKey {
                id: "SK1".into(),
                op_id: op.into(),
            }),
        )
    };
    assert_eq!(del("op4"), Applied::Done);
    assert!(get_access_key(&kv, "SK1").unwrap().is_none());
    assert_eq!(refused_code(&del("op5")), Some(ErrorCode::NoSuchAccessKey));
}

#[test]
fn create_bucket_makes_the_key_its_owner_and_delete_drops_grants() {
    let kv = MemStore::new();
    create_key(&kv, "SK1", "");
    create_key(&kv, "SK2", "");
    assert_eq!(create_bucket_as(&kv, "b1", "SK1"), Applied::Created(true));
    assert_eq!(grants(&kv, "SK1"), [("b1".into(), true, true, true)]);
    // Re-creating an existing bucket gives nobody anything.
    assert_eq!(create_bucket_as(&kv, "b1", "SK2"), Applied::Created(false));
    assert!(grants(&kv, "SK2").is_empty());
    // A bucket made by the root key (no owner id) has no key grants.
    assert_eq!(create_bucket_as(&kv, "b2", ""), Applied::Created(true));
    // An unknown owner id is ignored.
    assert_eq!(
        create_bucket_as(&kv, "b3", "nobody"),
        Applied::Created(true)
    );

    assert_eq!(
        grant(&kv, "SK2", "b1", true, (true, false, false)),
        Applied::Done
    );
    assert_eq!(grants(&kv, "SK2"), [("b1".into(), true, false, false)]);
    exec(
        &kv,
        Command::DeleteBucket(pb::BucketRequest {
            name: "b1".into(),
            op_id: String::new(),
        }),
    );
    assert!(grants(&kv, "SK1").is_empty());
    assert!(grants(&kv, "SK2").is_empty());
    // A new bucket of the same name starts without the old grants.
    create_bucket_as(&kv, "b1", "");
    assert!(grants(&kv, "SK2").is_empty());
}

#[test]
fn allow_and_deny_set_and_clear_permissions() {
    let kv = MemStore::new();
    create_key(&kv, "SK1", "");
    create_bucket_as(&kv, "b", "");
    create_bucket_as(&kv, "a", "");
    // Allow needs the bucket and a permission.
    assert_eq!(
        refused_code(&grant(&kv, "SK1", "missing", true, (true, false, false))),
        Some(ErrorCode::NoSuchBucket)
    );
    assert_eq!(
        refused_code(&grant(&kv, "SK1", "b", true, (false, false, false))),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(
        refused_code(&grant(&kv, "nokey", "b", true, (true, false, false))),
        Some(ErrorCode::NoSuchAccessKey)
    );
    grant(&kv, "SK1", "b", true, (true, false, false));
    grant(&kv, "SK1", "b", true, (false, true, false));
    grant(&kv, "SK1", "a", true, (false, false, true));
    // Sorted by bucket; allows accumulate.
    assert_eq!(
        grants(&kv, "SK1"),
        [
            ("a".into(), false, false, true),
            ("b".into(), true, true, false)
        ]
    );
    grant(&kv, "SK1", "b", false, (false, true, false));
    assert_eq!(grants(&kv, "SK1")[1], ("b".into(), true, false, false));
    // Deny with nothing named clears all; an empty grant disappears.
    grant(&kv, "SK1", "b", false, (false, false, false));
    grant(&kv, "SK1", "a", false, (false, false, true));
    assert!(grants(&kv, "SK1").is_empty());
    // Denying what is not granted is a no-op.
    assert_eq!(
        grant(&kv, "SK1", "b", false, (true, true, true)),
        Applied::Done
    );
}

#[test]
fn key_commands_are_applied_exactly_once() {
    let kv = MemStore::new();
    assert_eq!(
        create_key(&kv, "SK1", "create-op"),
        Applied::KeyCreated("SK1".into())
    );
    // A retry of the same op (even on a new leader, with another generated
    // id) gets the first outcome and stores nothing new.
    assert_eq!(
        create_key(&kv, "SK9", "create-op"),
        Applied::KeyCreated("SK1".into())
    );
    assert!(get_access_key(&kv, "SK9").unwrap().is_none());
    create_bucket_as(&kv, "b", "");
    let allow = |op: &str| {
        exec(
            &kv,
            Command::SetKeyGrant(rpb::SetKeyGrant {
                id: "SK1".into(),
                bucket: "b".into(),
                read: true,
                allow: true,
                op_id: op.into(),
                ..Default::default()
            }),
        )
    };
    let deny = |op: &str| {
        exec(
            &kv,
            Command::SetKeyGrant(rpb::SetKeyGrant {
                id: "SK1".into(),
                bucket: "b".into(),
                read: true,
                allow: false,
                op_id: op.into(),
                ..Default::default()
            }),
        )
    };
    assert_eq!(allow("allow-1"), Applied::Done);
    assert_eq!(deny("deny-1"), Applied::Done);
    // Replaying the allow does not re-grant after the deny.
    assert_eq!(allow("allow-1"), Applied::Done);
    assert!(grants(&kv, "SK1").is_empty());
    let delete = |op: &str| {
        exec(
            &kv,
            Command::DeleteAccessKey(rpb::DeleteAccessKey {
                id: "SK1".into(),
                op_id: op.into(),
            }),
        )
    };
    assert_eq!(delete("del-1"), Applied::Done);
    // The retried delete answers Done, not NoSuchAccessKey.
    assert_eq!(delete("del-1"), Applied::Done);
}
