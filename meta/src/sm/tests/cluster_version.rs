//! The cluster version (FinalizeVersion) and entries this binary cannot
//! apply, on the in-memory store.

use std::ops::Bound;

use sluice_proto::raft as rpb;

use super::*;
use crate::sm::cluster_version as cv;
use crate::store::{Pair, Space};
use crate::version::REPLICATED_FORMAT;

/// Every record of the state machine's data spaces.
fn dump(kv: &MemStore) -> Vec<(Space, Pair)> {
    Space::DATA
        .iter()
        .flat_map(|s| {
            kv.scan(*s, Bound::Unbounded, Bound::Unbounded, usize::MAX)
                .unwrap()
                .into_iter()
                .map(move |p| (*s, p))
        })
        .collect()
}

fn entry(command: Option<Command>, requires_format: u32) -> MetaCommand {
    MetaCommand {
        leader_now_ms: 1,
        requires_format,
        command,
    }
}

fn finalize_as(kv: &MemStore, version: u32, format: u32) -> Result<Applied, SmError> {
    let cmd = entry(
        Some(Command::FinalizeVersion(rpb::FinalizeVersion { version })),
        1,
    );
    let (batch, applied) = apply_command_as(kv, next_index(), &cmd, format)?;
    kv.apply(batch).unwrap();
    Ok(applied)
}

#[test]
fn an_entry_requiring_a_newer_format_stops_apply_and_changes_nothing() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let before = dump(&kv);
    let cmd = entry(
        Some(Command::CreateBucket(pb::CreateBucketRequest {
            name: "c".into(),
            now_ms: 1,
            op_id: "op-1".into(),
            ..Default::default()
        })),
        REPLICATED_FORMAT + 1,
    );
    let err = apply_command(&kv, 77, &cmd).unwrap_err();
    match &err {
        SmError::NeedsNewer {
            index,
            what,
            format,
        } => {
            assert_eq!(*index, 77);
            assert_eq!(*format, REPLICATED_FORMAT);
            assert_eq!(
                what,
                &format!(
                    "CreateBucket at replicated format {}",
                    REPLICATED_FORMAT + 1
                )
            );
        }
        other => panic!("expected NeedsNewer, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "log entry 77 needs a newer sluice (CreateBucket at replicated format {}; this binary understands replicated format {}): upgrade this node",
            REPLICATED_FORMAT + 1,
            REPLICATED_FORMAT
        )
    );
    assert_eq!(dump(&kv), before, "nothing written, no session recorded");
    // The same entry applies on a binary that understands the format.
    let (batch, applied) = apply_command_as(&kv, 77, &cmd, REPLICATED_FORMAT + 1).unwrap();
    assert_eq!(applied, Applied::Created(true));
    assert!(!batch.is_empty());
}

#[test]
fn an_entry_with_an_unknown_command_kind_stops_apply_and_changes_nothing() {
    let kv = MemStore::new();
    bucket(&kv, "b");
    let before = dump(&kv);
    // What prost decodes for a oneof variant this binary does not know.
    let cmd = entry(None, 2);
    let err = apply_command(&kv, 78, &cmd).unwrap_err();
    assert!(
        matches!(&err, SmError::NeedsNewer { index: 78, what, .. }
            if what == "command kind unknown to this binary, replicated format 2"),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade this node"), "{err}");
    assert_eq!(dump(&kv), before);
    // Even when it claims no newer format: no entry without a command is
    // ever skipped.
    assert!(matches!(
        apply_command(&kv, 79, &entry(None, 0)),
        Err(SmError::NeedsNewer { index: 79, .. })
    ));
}

#[test]
fn finalize_raises_the_cluster_version_and_never_lowers_it() {
    let kv = MemStore::new();
    assert_eq!(cv::get(&kv).unwrap(), 1, "absent means 1");
    assert_eq!(cv::recorded(&kv).unwrap(), None);
    // Equal to the implied version: recorded.
    assert_eq!(finalize_as(&kv, 1, 3).unwrap(), Applied::Done);
    assert_eq!(cv::recorded(&kv).unwrap(), Some(1));
    assert_eq!(finalize_as(&kv, 3, 3).unwrap(), Applied::Done);
    assert_eq!(cv::get(&kv).unwrap(), 3);
    // Equal again: a retried finalize succeeds and writes nothing.
    let before = dump(&kv);
    assert_eq!(finalize_as(&kv, 3, 3).unwrap(), Applied::Done);
    assert_eq!(dump(&kv), before);
    // Lower: refused, unchanged.
    let lower = finalize_as(&kv, 2, 3).unwrap();
    assert_eq!(refused_code(&lower), Some(ErrorCode::InvalidArgument));
    assert!(
        matches!(&lower, Applied::Refused { message, .. }
            if message == "the cluster version is 3; it never goes down (asked 2)"),
        "{lower:?}"
    );
    assert_eq!(cv::get(&kv).unwrap(), 3);
    assert_eq!(
        refused_code(&finalize_as(&kv, 0, 3).unwrap()),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(dump(&kv), before);
}

#[test]
fn finalize_above_this_binarys_format_stops_apply() {
    let kv = MemStore::new();
    finalize_as(&kv, 1, 1).unwrap();
    let before = dump(&kv);
    let err = finalize_as(&kv, 2, 1).unwrap_err();
    assert!(
        matches!(&err, SmError::NeedsNewer { what, format: 1, .. } if what == "cluster version 2"),
        "{err:?}"
    );
    assert_eq!(dump(&kv), before);
    assert_eq!(cv::get(&kv).unwrap(), 1);
}
