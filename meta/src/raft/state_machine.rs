//! [`StateMachine`]: openraft's `RaftStateMachine` over a [`KvStore`].
//!
//! Each log entry is applied in one atomic batch that also records it as
//! the last applied log id, so the state machine is always consistent with
//! its applied id, even after a crash (openraft re-applies later committed
//! entries on restart).
//!
//! A snapshot is a protobuf `raft.SnapshotBlob`: every record of the data
//! keyspaces (buckets, objects, uploads, parts, datanodes, the reference
//! and degraded indexes and heal intents). A snapshot taken before the
//! reference index existed has no index records, one of index format 1 has
//! empty index values; installing either derives the indexes from its
//! object, upload and part records. It is taken when
//! openraft asks for a builder, while no entry is being applied, so it is a
//! consistent view; the current snapshot is kept in `Space::Snapshot`.

// openraft's StorageError / RPCError are what its traits return; helpers
// return them unboxed too rather than box and unbox at every call.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageIOError, StoredMembership,
};
use prost::Message;
use sluice_proto::raft as rpb;

use super::convert::{FromPb, ToPb};
use super::{StorageError, TypeConfig};
use crate::sm::{self, Applied, refs};
use crate::store::{Batch, KvStore, Space};

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
const CURRENT: &[u8] = b"current";

/// The last applied log id and the membership it implies.
type AppliedState = (Option<LogId<u64>>, StoredMembership<u64, BasicNode>);

/// The keyspaces a snapshot carries: every state machine space but
/// `SmMeta` (sessions, epochs and pending deletions are replicated state:
/// a node that installs a snapshot must fence and deduplicate the same way).
const DATA_SPACES: [Space; 14] = [
    Space::Buckets,
    Space::Objects,
    Space::Uploads,
    Space::Parts,
    Space::Datanodes,
    Space::Refs,
    Space::Sessions,
    Space::SessionsByIndex,
    Space::Epochs,
    Space::Pending,
    Space::HealIntents,
    Space::Degraded,
    Space::Versions,
    Space::AccessKeys,
];

/// The metadata state machine of one node.
pub struct StateMachine<K: KvStore> {
    kv: Arc<K>,
    /// Distinguishes snapshots built at the same log id.
    snapshot_seq: Arc<AtomicU64>,
}

impl<K: KvStore> StateMachine<K> {
    /// The state machine kept in `kv`.
    pub fn new(kv: Arc<K>) -> Self {
        StateMachine {
            kv,
            snapshot_seq: Arc::new(AtomicU64::new(0)),
        }
    }

    fn read_applied(&self) -> Result<AppliedState, StorageError> {
        let read = |e: &dyn std::error::Error| {
            StorageIOError::read_state_machine(openraft::AnyError::error(e))
        };
        let applied = match self.kv.get(Space::SmMeta, APPLIED).map_err(|e| read(&e))? {
            Some(b) => {
                let pb = rpb::LogId::decode(b.as_slice()).map_err(|e| read(&e))?;
                Some(LogId::from_pb(pb).map_err(|e| read(&e))?)
            }
            None => None,
        };
        let membership = match self
            .kv
            .get(Space::SmMeta, MEMBERSHIP)
            .map_err(|e| read(&e))?
        {
            Some(b) => {
                let pb = rpb::StoredMembership::decode(b.as_slice()).map_err(|e| read(&e))?;
                StoredMembership::from_pb(pb).map_err(|e| read(&e))?
            }
            None => StoredMembership::default(),
        };
        Ok((applied, membership))
    }

    /// Reads every record of the data keyspaces into a snapshot blob.
    fn dump(&self) -> Result<Vec<u8>, StorageError> {
        let mut blob = rpb::SnapshotBlob::default();
        for space in DATA_SPACES {
            let mut from: Bound<Vec<u8>> = Bound::Unbounded;
            loop {
                const CHUNK: usize = 1024;
                let rows = self
                    .kv
                    .scan(
                        space,
                        crate::store::as_ref_bound(&from),
                        Bound::Unbounded,
                        CHUNK,
                    )
                    .map_err(|e| StorageIOError::read_state_machine(&e))?;
                let n = rows.len();
                for (key, value) in rows {
                    from = Bound::Excluded(key.clone());
                    blob.records.push(rpb::SnapshotRecord {
                        space: u32::from(space.id()),
                        key,
                        value,
                    });
                }
                if n < CHUNK {
                    break;
                }
            }
        }
        Ok(blob.encode_to_vec())
    }
}

/// A malformed snapshot.
#[derive(Debug, thiserror::Error)]
enum SnapshotError {
    #[error("snapshot record in unknown keyspace {0}")]
    UnknownSpace(u32),
    #[error("stored snapshot has no meta")]
    NoMeta,
}

fn read_current<K: KvStore>(kv: &K) -> Result<Option<rpb::StoredSnapshot>, StorageError> {
    let Some(bytes) = kv
        .get(Space::Snapshot, CURRENT)
        .map_err(|e| StorageIOError::read_snapshot(None, &e))?
    else {
        return Ok(None);
    };
    let stored = rpb::StoredSnapshot::decode(bytes.as_slice())
        .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
    Ok(Some(stored))
}

/// Builds a snapshot from the view captured by `get_snapshot_builder`.
pub struct SnapshotBuilder<K: KvStore> {
    kv: Arc<K>,
    /// The applied state and the snapshot blob, or why reading them failed.
    prepared: Result<(AppliedState, Vec<u8>), StorageError>,
    seq: u64,
}

impl<K: KvStore> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<K> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let ((last_log_id, last_membership), data) =
            std::mem::replace(&mut self.prepared, Ok(Default::default()))?;
        let snapshot_id = match &last_log_id {
            Some(l) => format!(
                "{}-{}-{}-{}",
                l.leader_id.term, l.leader_id.node_id, l.index, self.seq
            ),
            None => format!("none-{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        };
        let sig = meta.signature();
        // Keep it unless a newer snapshot was installed meanwhile.
        let current = read_current(self.kv.as_ref())?;
        let newer_exists = current
            .and_then(|c| c.meta)
            .and_then(|m| m.last_log_id)
            .map(|l| l.index > meta.last_log_id.map_or(0, |x| x.index))
            .unwrap_or(false);
        if !newer_exists {
            let stored = rpb::StoredSnapshot {
                meta: Some(meta.to_pb()),
                data: data.clone(),
            };
            let mut b = Batch::new();
            b.put(Space::Snapshot, CURRENT, stored.encode_to_vec());
            self.kv
                .apply(b)
                .map_err(|e| StorageIOError::write_snapshot(Some(sig.clone()), &e))?;
            self.kv
                .flush()
                .await
                .map_err(|e| StorageIOError::write_snapshot(Some(sig.clone()), &e))?;
        }
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<K: KvStore> RaftStateMachine<TypeConfig> for StateMachine<K> {
    type SnapshotBuilder = SnapshotBuilder<K>;

    async fn applied_state(&mut self) -> Result<AppliedState, StorageError> {
        self.read_applied()
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut results = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let (mut batch, applied) = match &entry.payload {
                EntryPayload::Blank => (Batch::new(), Applied::None),
                EntryPayload::Normal(cmd) => sm::apply_command(self.kv.as_ref(), log_id.index, cmd)
                    .map_err(|e| StorageIOError::apply(log_id, &e))?,
                EntryPayload::Membership(m) => {
                    let mut b = Batch::new();
                    let stored = StoredMembership::new(Some(log_id), m.clone());
                    b.put(Space::SmMeta, MEMBERSHIP, stored.to_pb().encode_to_vec());
                    (b, Applied::None)
                }
            };
            batch.put(Space::SmMeta, APPLIED, log_id.to_pb().encode_to_vec());
            self.kv
                .apply(batch)
                .map_err(|e| StorageIOError::apply(log_id, &e))?;
            metrics::counter!("sluice_meta_applied_entries_total").increment(1);
            results.push(applied);
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let prepared = self
            .read_applied()
            .and_then(|applied| Ok((applied, self.dump()?)));
        SnapshotBuilder {
            kv: self.kv.clone(),
            prepared,
            seq: self.snapshot_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let sig = meta.signature();
        let err = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(Some(sig.clone()), openraft::AnyError::error(e))
        };
        let data = snapshot.into_inner();
        let blob = rpb::SnapshotBlob::decode(data.as_slice()).map_err(|e| err(&e))?;

        let mut b = Batch::new();
        for space in DATA_SPACES.into_iter().chain([Space::SmMeta]) {
            for key in self
                .kv
                .keys_in(space, Bound::Unbounded, Bound::Unbounded)
                .map_err(|e| err(&e))?
            {
                b.delete(space, key);
            }
        }
        // A snapshot from before the reference index (no index records) or
        // of index format 1 (empty values, no degraded index): its indexes
        // are derived from its records once they are installed.
        let refs_id = u32::from(Space::Refs.id());
        let derived = [refs_id, u32::from(Space::Degraded.id())];
        let has_index = blob.records.iter().any(|r| r.space == refs_id);
        let old_format = blob
            .records
            .iter()
            .any(|r| r.space == refs_id && r.value.is_empty());
        let reindex = !has_index || old_format;
        for rec in blob.records {
            let space = u8::try_from(rec.space)
                .ok()
                .and_then(Space::from_id)
                .filter(|s| DATA_SPACES.contains(s))
                .ok_or_else(|| err(&SnapshotError::UnknownSpace(rec.space)))?;
            if reindex && derived.contains(&rec.space) {
                continue;
            }
            b.put(space, rec.key, rec.value);
        }
        if !reindex {
            b.put(Space::SmMeta, refs::INDEX_MARKER, refs::INDEX_VERSION);
        }
        if let Some(l) = &meta.last_log_id {
            b.put(Space::SmMeta, APPLIED, l.to_pb().encode_to_vec());
        }
        b.put(
            Space::SmMeta,
            MEMBERSHIP,
            meta.last_membership.to_pb().encode_to_vec(),
        );
        let stored = rpb::StoredSnapshot {
            meta: Some(meta.to_pb()),
            data,
        };
        b.put(Space::Snapshot, CURRENT, stored.encode_to_vec());
        self.kv.apply(b).map_err(|e| err(&e))?;
        if reindex {
            // Sets the index marker when done; interrupted, it is repeated
            // by `ensure_index` at the next start.
            let references = refs::rebuild_index(self.kv.as_ref()).map_err(|e| err(&e))?;
            tracing::info!(references, "indexed the blobs of an old-format snapshot");
        }
        self.kv.flush().await.map_err(|e| err(&e))?;
        tracing::info!(snapshot = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(stored) = read_current(self.kv.as_ref())? else {
            return Ok(None);
        };
        let read = |e: &dyn std::error::Error| {
            StorageIOError::read_snapshot(None, openraft::AnyError::error(e))
        };
        let meta_pb = stored.meta.ok_or_else(|| read(&SnapshotError::NoMeta))?;
        let meta = SnapshotMeta::from_pb(meta_pb).map_err(|e| read(&e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::LeaderId;
    use sluice_proto::meta as pb;
    use sluice_proto::raft::meta_command::Command;

    use super::*;
    use crate::store::MemStore;

    fn entry(index: u64, command: Command) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(LeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(rpb::MetaCommand {
                command: Some(command),
                ..Default::default()
            }),
        }
    }

    fn placement(blob: &str) -> pb::Placement {
        pb::Placement {
            blob_id: blob.into(),
            size: 1,
            data_shards: 1,
            parity_shards: 0,
            block_size: 1,
            nodes: vec![1],
            missing: vec![],
        }
    }

    fn put_object(key: &str, blob: &str) -> Command {
        Command::PutObject(pb::PutObjectRequest {
            object: Some(pb::ObjectRecord {
                bucket: "b".into(),
                key: key.into(),
                parts: vec![pb::PartRecord {
                    part_number: 1,
                    placement: Some(placement(blob)),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// A state machine with write epoch 1 open, objects a (blob e1.a) and,
    /// deleted, c (e1.c), and an upload with one part (e1.b).
    async fn populated() -> StateMachine<MemStore> {
        let mut sm = StateMachine::new(Arc::new(MemStore::new()));
        let commands = vec![
            Command::OpenEpoch(pb::OpenEpochRequest {
                gateway_id: "g".into(),
                ..Default::default()
            }),
            Command::CreateBucket(pb::CreateBucketRequest {
                name: "b".into(),
                now_ms: 1,
                ..Default::default()
            }),
            put_object("a", "e1.a"),
            put_object("c", "e1.c"),
            Command::CreateUpload(pb::CreateUploadRequest {
                upload: Some(pb::UploadRecord {
                    bucket: "b".into(),
                    key: "m".into(),
                    upload_id: "u1".into(),
                    initiated_ms: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            Command::PutPart(pb::PutPartRequest {
                bucket: "b".into(),
                key: "m".into(),
                part: Some(pb::PartRecord {
                    upload_id: "u1".into(),
                    part_number: 1,
                    placement: Some(placement("e1.b")),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            Command::DeleteObject(pb::ObjectKey {
                bucket: "b".into(),
                key: "c".into(),
                ..Default::default()
            }),
        ];
        let entries: Vec<_> = commands
            .into_iter()
            .enumerate()
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        sm.apply(entries).await.unwrap();
        sm
    }

    fn references(kv: &MemStore) -> BTreeSet<String> {
        refs::all_references(kv).unwrap().into_iter().collect()
    }

    fn expected() -> BTreeSet<String> {
        ["e1.a", "e1.b"].map(String::from).into()
    }

    async fn snapshot(sm: &mut StateMachine<MemStore>) -> Snapshot<TypeConfig> {
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn snapshots_carry_the_reference_index() {
        let mut source = populated().await;
        assert_eq!(references(&source.kv), expected());
        let snap = snapshot(&mut source).await;

        let kv = Arc::new(MemStore::new());
        let mut target = StateMachine::new(kv.clone());
        target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(references(&kv), expected());
        assert!(kv.get(Space::SmMeta, refs::INDEX_MARKER).unwrap().is_some());
        let ask = ["e1.a", "e1.c", "e1.b"].map(String::from);
        assert_eq!(
            sm::filter_unreferenced(kv.as_ref(), &ask).unwrap(),
            vec!["e1.c".to_string()]
        );
    }

    #[tokio::test]
    async fn a_snapshot_without_the_index_is_indexed_on_install() {
        let mut source = populated().await;
        let snap = snapshot(&mut source).await;
        // What a node of the previous release sends: no index records.
        let mut blob = rpb::SnapshotBlob::decode(snap.snapshot.into_inner().as_slice()).unwrap();
        let before = blob.records.len();
        blob.records
            .retain(|r| r.space != u32::from(Space::Refs.id()));
        assert_eq!(before - blob.records.len(), 2);

        let kv = Arc::new(MemStore::new());
        // A stale reference the install must not keep.
        let mut ghost = Batch::new();
        ghost.put(Space::Refs, b"ghost".to_vec(), Vec::new());
        kv.apply(ghost).unwrap();
        let mut target = StateMachine::new(kv.clone());
        target
            .install_snapshot(&snap.meta, Box::new(Cursor::new(blob.encode_to_vec())))
            .await
            .unwrap();
        assert_eq!(references(&kv), expected());
        assert!(kv.get(Space::SmMeta, refs::INDEX_MARKER).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_format_1_snapshot_gets_locators_on_install() {
        let mut source = populated().await;
        let snap = snapshot(&mut source).await;
        // What a node of index format 1 sends: empty index values.
        let mut blob = rpb::SnapshotBlob::decode(snap.snapshot.into_inner().as_slice()).unwrap();
        for r in &mut blob.records {
            if r.space == u32::from(Space::Refs.id()) {
                r.value.clear();
            }
        }
        let kv = Arc::new(MemStore::new());
        let mut target = StateMachine::new(kv.clone());
        target
            .install_snapshot(&snap.meta, Box::new(Cursor::new(blob.encode_to_vec())))
            .await
            .unwrap();
        assert_eq!(references(&kv), expected());
        assert!(refs::index_is_current(kv.as_ref()).unwrap());
        assert_eq!(
            refs::locate(kv.as_ref(), "e1.a").unwrap(),
            Some(refs::object_locator("b", "a", 1))
        );
        assert_eq!(
            refs::locate(kv.as_ref(), "e1.b").unwrap(),
            Some(refs::part_locator("b", "m", "u1", 1))
        );
    }

    #[tokio::test]
    async fn snapshots_carry_access_keys() {
        let mut source = populated().await;
        source
            .apply(vec![
                entry(
                    100,
                    Command::CreateAccessKey(rpb::CreateAccessKey {
                        id: "SK1".into(),
                        name: "alice".into(),
                        secret: "s3cret".into(),
                        op_id: String::new(),
                    }),
                ),
                entry(
                    101,
                    Command::SetKeyGrant(rpb::SetKeyGrant {
                        id: "SK1".into(),
                        bucket: "b".into(),
                        read: true,
                        allow: true,
                        ..Default::default()
                    }),
                ),
            ])
            .await
            .unwrap();
        let snap = snapshot(&mut source).await;
        let kv = Arc::new(MemStore::new());
        let mut target = StateMachine::new(kv.clone());
        target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        let key = sm::access::get_access_key(kv.as_ref(), "SK1")
            .unwrap()
            .expect("key installed");
        assert_eq!(
            (key.name.as_str(), key.secret.as_str()),
            ("alice", "s3cret")
        );
        assert_eq!(key.grants.len(), 1);
        assert!(key.grants[0].read && !key.grants[0].write);
    }
}
