//! [`StateMachine`]: openraft's `RaftStateMachine` over a [`KvStore`].
//!
//! Each log entry is applied in one atomic batch that also records it as
//! the last applied log id, so the state machine is always consistent with
//! its applied id, even after a crash (openraft re-applies later committed
//! entries on restart).
//!
//! A snapshot is a file of `raft.SnapshotRecord`s: every record of the data
//! keyspaces (buckets, objects, uploads, parts, datanodes, the reference
//! and degraded indexes and heal intents), built while entries keep being
//! applied and installed record by record (see [`super::snapshot`]). The
//! current snapshot's meta and file name are kept in `Space::Snapshot`, its
//! file in the snapshot directory given to [`StateMachine::open`].

// openraft's StorageError / RPCError are what its traits return; helpers
// return them unboxed too rather than box and unbox at every call.
#![allow(clippy::result_large_err)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageIOError, StoredMembership,
};
use prost::Message;
use sluice_proto::raft as rpb;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::convert::{FromPb, ToPb};
use super::snapshot::{self, SnapshotDir, SnapshotError};
use super::{StorageError, TypeConfig};
use crate::sm::{self, Applied};
use crate::store::{Batch, KvStore, Space};

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
/// Set (to the snapshot's meta) while a snapshot is being installed.
const INSTALLING: &[u8] = b"installing";
/// The current snapshot: its meta and file name (`raft.StoredSnapshot`).
const CURRENT: &[u8] = b"current_file";

/// Gauge: 1 once apply stopped at an entry this binary cannot apply (it
/// needs a newer sluice); the node's Raft has stopped.
pub const APPLY_BLOCKED: &str = "sluice_meta_apply_blocked";
/// Gauge: the log index of that entry.
pub const APPLY_BLOCKED_INDEX: &str = "sluice_meta_apply_blocked_index";

/// The last applied log id and the membership it implies.
type AppliedState = (Option<LogId<u64>>, StoredMembership<u64, BasicNode>);

/// The metadata state machine of one node.
pub struct StateMachine<K: KvStore> {
    kv: Arc<K>,
    dir: Arc<SnapshotDir>,
    /// The generation whose pre-images applies save (0: no build running).
    capture: Arc<AtomicU64>,
    /// Held by a snapshot build from its start to its end, and by an
    /// install, so the two never overlap.
    build_lock: Arc<AsyncMutex<()>>,
    /// Distinguishes builds (and their pre-image generations).
    snapshot_seq: Arc<AtomicU64>,
    /// Held while `CURRENT` is read and its file opened, and while it is
    /// replaced and the old file removed: a snapshot being sent never has
    /// its file removed between the two.
    current_lock: Arc<AsyncMutex<()>>,
    /// Bytes of the current snapshot file (0: none): what the next build
    /// will cost, read by the node's snapshot schedule.
    snapshot_bytes: Arc<AtomicU64>,
    /// The newest replicated format this node applies
    /// ([`crate::version::REPLICATED_FORMAT`] unless overridden in tests).
    format: u32,
    /// The index of the entry apply stopped at because this binary cannot
    /// apply it (0: none; see [`StateMachine::blocked_index`]).
    blocked: Arc<AtomicU64>,
    /// Held by every apply and install while it changes the store, and by
    /// a [`StateDigester`] while it hashes: a digest sees the state at
    /// one applied index.
    apply_lock: Arc<AsyncMutex<()>>,
}

/// Computes [`sm::state_digest`] of a running state machine at its applied
/// index, between two applies (openraft 0.9 has no call that runs a
/// closure on the state machine task, so applies and the digest share a
/// lock). Applies wait while the digest runs: it reads every record once,
/// so it stalls writes for about as long as a snapshot build's walk.
pub struct StateDigester<K: KvStore> {
    kv: Arc<K>,
    apply_lock: Arc<AsyncMutex<()>>,
}

impl<K: KvStore> Clone for StateDigester<K> {
    fn clone(&self) -> Self {
        StateDigester {
            kv: self.kv.clone(),
            apply_lock: self.apply_lock.clone(),
        }
    }
}

/// A digest and the applied log index it is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedDigest {
    /// The last applied log index (0: nothing applied).
    pub applied_index: u64,
    pub digest: sm::StateDigest,
}

impl<K: KvStore> StateDigester<K> {
    /// The digest of the applied state and its applied index.
    ///
    /// Errors: the store fails or a stored applied id does not decode.
    pub async fn digest(&self) -> Result<AppliedDigest, StorageError> {
        let guard = self.apply_lock.clone().lock_owned().await;
        let kv = self.kv.clone();
        let read = |e: &dyn std::error::Error| StorageIOError::read_state_machine(io_err(e));
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let applied = read_applied_id(kv.as_ref())?;
            let digest = sm::state_digest(kv.as_ref()).map_err(|e| read(&e))?;
            Ok::<_, StorageError>(AppliedDigest {
                applied_index: applied.map_or(0, |l| l.index),
                digest,
            })
        })
        .await
        .map_err(|e| read(&e))?
    }
}

/// The last applied log id stored in `kv`.
fn read_applied_id<K: KvStore>(kv: &K) -> Result<Option<LogId<u64>>, StorageError> {
    let read = |e: &dyn std::error::Error| StorageIOError::read_state_machine(io_err(e));
    match kv.get(Space::SmMeta, APPLIED).map_err(|e| read(&e))? {
        Some(b) => {
            let pb = rpb::LogId::decode(b.as_slice()).map_err(|e| read(&e))?;
            Ok(Some(LogId::from_pb(pb).map_err(|e| read(&e))?))
        }
        None => Ok(None),
    }
}

/// The batch that makes `stored` the current snapshot.
fn current_batch(stored: &rpb::StoredSnapshot) -> Batch {
    let mut b = Batch::new();
    b.put(Space::Snapshot, CURRENT, stored.encode_to_vec());
    b
}

fn io_err(e: &dyn std::error::Error) -> openraft::AnyError {
    openraft::AnyError::error(e)
}

impl<K: KvStore> StateMachine<K> {
    /// The state machine kept in `kv`, with snapshot files in `dir`
    /// (created if missing). Before returning it finishes a snapshot
    /// install a crash interrupted and removes stale snapshot files and
    /// pre-images.
    ///
    /// Errors: the directory or a snapshot file cannot be read or written,
    /// or the store fails.
    pub async fn open(kv: Arc<K>, dir: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let err = |e: &dyn std::error::Error| StorageIOError::read_snapshot(None, io_err(e));
        let dir = SnapshotDir::create(dir.into()).map_err(|e| err(&e))?;
        let current = read_current(kv.as_ref())?;
        if let Some(bytes) = kv.get(Space::SmMeta, INSTALLING).map_err(|e| err(&e))? {
            let pb = rpb::SnapshotMeta::decode(bytes.as_slice()).map_err(|e| err(&e))?;
            let meta = SnapshotMeta::from_pb(pb).map_err(|e| err(&e))?;
            let file = current
                .as_ref()
                .map(|c| dir.path_of(&c.file))
                .ok_or_else(|| err(&SnapshotError::NoFile))?;
            let loaded = snapshot::load_file(kv.as_ref(), &file, finish_batch(&meta))
                .map_err(|e| err(&e))?;
            kv.flush().await.map_err(|e| err(&e))?;
            tracing::info!(snapshot = %meta.snapshot_id, records = loaded.records,
                "finished a snapshot install interrupted by a restart");
        }
        dir.remove_others(current.as_ref().map(|c| c.file.as_str()), true)
            .map_err(|e| err(&e))?;
        snapshot::clear_pre_images(kv.as_ref(), None).map_err(|e| err(&e))?;
        let bytes = current
            .as_ref()
            .and_then(|c| std::fs::metadata(dir.path_of(&c.file)).ok())
            .map_or(0, |m| m.len());
        Ok(StateMachine {
            kv,
            dir: Arc::new(dir),
            capture: Arc::new(AtomicU64::new(0)),
            build_lock: Arc::new(AsyncMutex::new(())),
            snapshot_seq: Arc::new(AtomicU64::new(0)),
            current_lock: Arc::new(AsyncMutex::new(())),
            snapshot_bytes: Arc::new(AtomicU64::new(bytes)),
            format: crate::version::REPLICATED_FORMAT,
            blocked: Arc::new(AtomicU64::new(0)),
            apply_lock: Arc::new(AsyncMutex::new(())),
        })
    }

    /// This state machine applying replicated formats up to `format`
    /// only: a node that behaves as an older or newer binary (tests).
    pub fn understanding(mut self, format: u32) -> Self {
        self.format = format;
        self
    }

    /// The index of the log entry apply stopped at because it needs a
    /// newer binary (0: none). Apply then returns a storage error, on which
    /// openraft stops this node's Raft; a restart stops at the same entry
    /// until the binary is upgraded.
    pub fn blocked_index(&self) -> Arc<AtomicU64> {
        self.blocked.clone()
    }

    /// A handle that computes the state digest between applies.
    pub fn digester(&self) -> StateDigester<K> {
        StateDigester {
            kv: self.kv.clone(),
            apply_lock: self.apply_lock.clone(),
        }
    }

    /// The size in bytes of the current snapshot file, kept up to date by
    /// builds and installs (0: no snapshot yet).
    pub fn snapshot_bytes(&self) -> Arc<AtomicU64> {
        self.snapshot_bytes.clone()
    }

    fn read_applied(&self) -> Result<AppliedState, StorageError> {
        let read = |e: &dyn std::error::Error| StorageIOError::read_state_machine(io_err(e));
        let applied = read_applied_id(self.kv.as_ref())?;
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
}

/// The `SmMeta` writes that end an install of the snapshot `meta`.
fn finish_batch(meta: &SnapshotMeta<u64, BasicNode>) -> Batch {
    let mut b = Batch::new();
    if let Some(l) = &meta.last_log_id {
        b.put(Space::SmMeta, APPLIED, l.to_pb().encode_to_vec());
    }
    b.put(
        Space::SmMeta,
        MEMBERSHIP,
        meta.last_membership.to_pb().encode_to_vec(),
    );
    b
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

/// Builds a snapshot of the state at the moment `get_snapshot_builder` was
/// called, while entries keep being applied.
pub struct SnapshotBuilder<K: KvStore> {
    kv: Arc<K>,
    dir: Arc<SnapshotDir>,
    /// The applied state at the start, or why reading it failed.
    prepared: Result<AppliedState, StorageError>,
    seq: u64,
    /// The pre-image generation of this build.
    generation: u64,
    capture: Arc<AtomicU64>,
    /// The build lock, released when the build ends (or is dropped).
    lock: Option<OwnedMutexGuard<()>>,
    current_lock: Arc<AsyncMutex<()>>,
    snapshot_bytes: Arc<AtomicU64>,
}

impl<K: KvStore> SnapshotBuilder<K> {
    /// Stops pre-image capture for this build (a no-op once stopped).
    fn stop_capture(&self) {
        let _ =
            self.capture
                .compare_exchange(self.generation, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl<K: KvStore> Drop for SnapshotBuilder<K> {
    fn drop(&mut self) {
        self.stop_capture();
    }
}

impl<K: KvStore> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<K> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (last_log_id, last_membership) =
            std::mem::replace(&mut self.prepared, Ok(Default::default()))?;
        // Unique per build, across nodes and restarts (the file name has
        // the clock and a counter): two builds at one log id differ in
        // bytes (a record changed after the walk passed it is written
        // twice), and openraft resumes a transfer by snapshot id.
        let name = self.dir.new_name(last_log_id.map_or(0, |l| l.index));
        let stem = name.trim_end_matches(".snap");
        let snapshot_id = match &last_log_id {
            Some(l) => format!(
                "{}-{}-{}-{}-{stem}",
                l.leader_id.term, l.leader_id.node_id, l.index, self.seq
            ),
            None => format!("none-{}-{stem}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        };
        let sig = meta.signature();
        let err = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(Some(sig.clone()), io_err(e))
        };
        let started = Instant::now();
        let path = self.dir.path_of(&name);
        let tmp = path.with_extension("tmp");
        let (kv, generation, dest) = (self.kv.clone(), self.generation, path.clone());
        let written = tokio::task::spawn_blocking(move || {
            let written = snapshot::write_file(kv.as_ref(), generation, &tmp)?;
            std::fs::rename(&tmp, &dest)?;
            Ok::<_, SnapshotError>(written)
        })
        .await
        .map_err(|e| err(&e))?
        .map_err(|e| err(&e))?;
        snapshot::sync_dir(path.parent().unwrap_or(&path)).map_err(|e| err(&e))?;
        // The view is written: applies need not save pre-images any more.
        self.stop_capture();
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            snapshot::clear_pre_images(kv.as_ref(), Some(generation))
        })
        .await
        .map_err(|e| err(&e))?
        .map_err(|e| err(&e))?;

        // Keep it unless a newer snapshot was installed meanwhile.
        let current_lock = self.current_lock.clone();
        let _current = current_lock.lock().await;
        let current = read_current(self.kv.as_ref())?;
        let newer_exists = current
            .and_then(|c| c.meta)
            .and_then(|m| m.last_log_id)
            .map(|l| l.index > meta.last_log_id.map_or(0, |x| x.index))
            .unwrap_or(false);
        let file = tokio::fs::File::open(&path).await.map_err(|e| err(&e))?;
        if newer_exists {
            // The open handle still reads it.
            std::fs::remove_file(&path).map_err(|e| err(&e))?;
        } else {
            let stored = rpb::StoredSnapshot {
                meta: Some(meta.to_pb()),
                file: name.clone(),
            };
            self.kv.apply(current_batch(&stored)).map_err(|e| err(&e))?;
            self.kv.flush().await.map_err(|e| err(&e))?;
            self.dir
                .remove_others(Some(&name), false)
                .map_err(|e| err(&e))?;
            self.snapshot_bytes.store(written.bytes, Ordering::Relaxed);
        }
        drop(_current);
        self.lock = None;
        let secs = started.elapsed().as_secs_f64();
        metrics::histogram!("sluice_meta_snapshot_build_seconds").record(secs);
        metrics::gauge!("sluice_meta_snapshot_bytes").set(written.bytes as f64);
        tracing::info!(snapshot = %meta.snapshot_id, records = written.records,
            bytes = written.bytes, secs, "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
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
        let _applying = self.apply_lock.lock().await;
        let mut results = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let (mut batch, applied) = match &entry.payload {
                EntryPayload::Blank => (Batch::new(), Applied::None),
                EntryPayload::Normal(cmd) => {
                    match sm::apply_command_as(self.kv.as_ref(), log_id.index, cmd, self.format) {
                        Ok(done) => done,
                        Err(e) => {
                            if let sm::SmError::NeedsNewer { index, .. } = &e {
                                self.blocked.store(*index, Ordering::Relaxed);
                                metrics::gauge!(APPLY_BLOCKED).set(1.0);
                                metrics::gauge!(APPLY_BLOCKED_INDEX).set(*index as f64);
                                tracing::error!(error = %e, "stopped applying the log");
                            }
                            return Err(StorageIOError::apply(log_id, &e).into());
                        }
                    }
                }
                EntryPayload::Membership(m) => {
                    let mut b = Batch::new();
                    let stored = StoredMembership::new(Some(log_id), m.clone());
                    b.put(Space::SmMeta, MEMBERSHIP, stored.to_pb().encode_to_vec());
                    (b, Applied::None)
                }
            };
            let generation = self.capture.load(Ordering::Acquire);
            if generation != 0 {
                snapshot::capture_pre_images(self.kv.as_ref(), generation, &mut batch)
                    .map_err(|e| StorageIOError::apply(log_id, &e))?;
            }
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
        // Called between applies: the applied state read here is the view
        // the builder writes, and pre-images are saved from the next apply.
        let lock = self.build_lock.clone().lock_owned().await;
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let generation = seq + 1;
        let prepared = snapshot::clear_pre_images(self.kv.as_ref(), None)
            .map_err(|e| StorageError::from(StorageIOError::read_state_machine(&e)))
            .and_then(|_| self.read_applied());
        if prepared.is_ok() {
            self.capture.store(generation, Ordering::Release);
        }
        SnapshotBuilder {
            kv: self.kv.clone(),
            dir: self.dir.clone(),
            prepared,
            seq,
            generation,
            capture: self.capture.clone(),
            lock: Some(lock),
            current_lock: self.current_lock.clone(),
            snapshot_bytes: self.snapshot_bytes.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let file = self
            .dir
            .begin_receiving()
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let sig = meta.signature();
        let err = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(Some(sig.clone()), io_err(e))
        };
        // A build in progress reads the store this replaces: wait for it.
        let _lock = self.build_lock.clone().lock_owned().await;
        let _applying = self.apply_lock.clone().lock_owned().await;
        let started = Instant::now();
        let name = self.dir.new_name(meta.last_log_id.map_or(0, |l| l.index));
        let path = self
            .dir
            .adopt(&mut snapshot, &name)
            .await
            .map_err(|e| err(&e))?;
        drop(snapshot);
        // Read it whole once before the store is touched: a file that
        // does not decode (a torn or mixed transfer) fails the install
        // here, leaving the node as it was.
        let (check, format) = (path.clone(), self.format);
        let checked = tokio::task::spawn_blocking(move || snapshot::check_file(&check, format))
            .await
            .map_err(|e| err(&e))?;
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&path);
            if let SnapshotError::NeedsNewer { .. } = &e {
                let index = meta.last_log_id.map_or(0, |l| l.index);
                self.blocked.store(index, Ordering::Relaxed);
                metrics::gauge!(APPLY_BLOCKED).set(1.0);
                metrics::gauge!(APPLY_BLOCKED_INDEX).set(index as f64);
                tracing::error!(error = %e, "refused a snapshot");
            }
            return Err(err(&e).into());
        }

        // From here a crash repeats the load at the next open.
        let stored = rpb::StoredSnapshot {
            meta: Some(meta.to_pb()),
            file: name.clone(),
        };
        let mut b = current_batch(&stored);
        b.put(Space::SmMeta, INSTALLING, meta.to_pb().encode_to_vec());
        let current_lock = self.current_lock.clone();
        let current = current_lock.lock().await;
        self.kv.apply(b).map_err(|e| err(&e))?;
        self.kv.flush().await.map_err(|e| err(&e))?;
        drop(current);

        let (kv, finish) = (self.kv.clone(), finish_batch(meta));
        let loaded =
            tokio::task::spawn_blocking(move || snapshot::load_file(kv.as_ref(), &path, finish))
                .await
                .map_err(|e| err(&e))?
                .map_err(|e| err(&e))?;
        self.kv.flush().await.map_err(|e| err(&e))?;
        let current = current_lock.lock().await;
        self.dir
            .remove_others(Some(&name), false)
            .map_err(|e| err(&e))?;
        drop(current);
        if let Ok(m) = std::fs::metadata(self.dir.path_of(&name)) {
            self.snapshot_bytes.store(m.len(), Ordering::Relaxed);
        }
        let secs = started.elapsed().as_secs_f64();
        metrics::histogram!("sluice_meta_snapshot_install_seconds").record(secs);
        tracing::info!(snapshot = %meta.snapshot_id, records = loaded.records,
            secs, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        // The file named is not removed before it is open (see `current_lock`).
        let _current = self.current_lock.lock().await;
        let Some(stored) = read_current(self.kv.as_ref())? else {
            return Ok(None);
        };
        let read = |e: &dyn std::error::Error| StorageIOError::read_snapshot(None, io_err(e));
        let meta_pb = stored.meta.ok_or_else(|| read(&SnapshotError::NoMeta))?;
        let meta = SnapshotMeta::from_pb(meta_pb).map_err(|e| read(&e))?;
        let file = tokio::fs::File::open(self.dir.path_of(&stored.file))
            .await
            .map_err(|e| read(&e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
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
    use crate::sm::refs;
    use crate::store::MemStore;
    use crate::store::hooked::{Access, Hooked};

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

    /// A state machine over `kv` with its snapshot files in a new
    /// directory (removed when the returned guard drops).
    async fn open<K: KvStore>(kv: Arc<K>) -> (StateMachine<K>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sm = StateMachine::open(kv, dir.path().join("snapshots"))
            .await
            .unwrap();
        (sm, dir)
    }

    /// Opens write epoch 1 (gateway g) and creates bucket b.
    fn epoch_and_bucket() -> [Command; 2] {
        [
            Command::OpenEpoch(pb::OpenEpochRequest {
                gateway_id: "g".into(),
                ..Default::default()
            }),
            Command::CreateBucket(pb::CreateBucketRequest {
                name: "b".into(),
                now_ms: 1,
                ..Default::default()
            }),
        ]
    }

    /// A state machine with write epoch 1 open, objects a (blob e1.a) and,
    /// deleted, c (e1.c), and an upload with one part (e1.b).
    async fn populated() -> (StateMachine<MemStore>, tempfile::TempDir) {
        let (mut sm, dir) = open(Arc::new(MemStore::new())).await;
        let commands: Vec<Command> = epoch_and_bucket()
            .into_iter()
            .chain([
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
                delete_object("c"),
            ])
            .collect();
        let entries: Vec<_> = commands
            .into_iter()
            .enumerate()
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        sm.apply(entries).await.unwrap();
        (sm, dir)
    }

    /// The records of a snapshot file.
    async fn blob_of(file: Box<tokio::fs::File>) -> rpb::SnapshotBlob {
        let file = file.into_std().await;
        rpb::SnapshotBlob {
            records: snapshot::records_of(file).unwrap(),
            format: sluice_proto::format::SNAPSHOT_FORMAT,
        }
    }

    /// A snapshot file (not a receiving one) of `bytes`.
    async fn file_of(dir: &tempfile::TempDir, bytes: &[u8]) -> Box<tokio::fs::File> {
        let path = dir.path().join(format!("file-{}", bytes.len()));
        std::fs::write(&path, bytes).unwrap();
        Box::new(tokio::fs::File::open(&path).await.unwrap())
    }

    fn references(kv: &MemStore) -> BTreeSet<String> {
        refs::all_references(kv).unwrap().into_iter().collect()
    }

    fn expected() -> BTreeSet<String> {
        ["e1.a", "e1.b"].map(String::from).into()
    }

    async fn snapshot<K: KvStore>(sm: &mut StateMachine<K>) -> Snapshot<TypeConfig> {
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap()
    }

    /// An entry this binary cannot apply stops apply at it: the error names
    /// the entry, nothing of it or after it is applied (the applied id stays
    /// before it), the blocked index is set, and applying it again fails
    /// again (it is never skipped).
    #[tokio::test]
    async fn an_entry_needing_a_newer_binary_stops_apply_at_it() {
        let (mut sm, _dir) = populated().await;
        let blocked = sm.blocked_index();
        let (applied_before, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied_before.map(|l| l.index), Some(7));
        let mut newer = entry(
            8,
            Command::CreateBucket(pb::CreateBucketRequest {
                name: "n".into(),
                ..Default::default()
            }),
        );
        if let EntryPayload::Normal(cmd) = &mut newer.payload {
            cmd.requires_format = crate::version::REPLICATED_FORMAT + 1;
        }
        let unknown = Entry {
            log_id: LogId::new(LeaderId::new(1, 1), 8),
            payload: EntryPayload::Normal(rpb::MetaCommand::default()),
        };
        for bad in [newer, unknown] {
            let later = entry(
                9,
                Command::CreateBucket(pb::CreateBucketRequest {
                    name: "later".into(),
                    ..Default::default()
                }),
            );
            let err = sm.apply(vec![bad, later]).await.unwrap_err();
            assert!(
                err.to_string().contains("log entry 8 needs a newer sluice"),
                "{err}"
            );
            assert_eq!(blocked.load(Ordering::Relaxed), 8);
            let (applied, _) = sm.applied_state().await.unwrap();
            assert_eq!(applied, applied_before);
            for name in ["n", "later"] {
                assert_eq!(sm::get_bucket(sm.kv.as_ref(), name).ok(), None);
            }
        }
        // The same entry on a binary that understands the newer format.
        let mut sm = twin(&sm).understanding(crate::version::REPLICATED_FORMAT + 1);
        let mut newer = entry(
            8,
            Command::CreateBucket(pb::CreateBucketRequest {
                name: "n".into(),
                ..Default::default()
            }),
        );
        if let EntryPayload::Normal(cmd) = &mut newer.payload {
            cmd.requires_format = crate::version::REPLICATED_FORMAT + 1;
        }
        assert_eq!(
            sm.apply(vec![newer]).await.unwrap(),
            vec![Applied::Created(true)]
        );
    }

    /// A snapshot of a cluster finalized past this binary's format is
    /// refused before the store is touched.
    #[tokio::test]
    async fn a_snapshot_of_a_newer_cluster_version_is_refused() {
        let (source, _dir) = populated().await;
        let newer = crate::version::REPLICATED_FORMAT + 1;
        let mut source = twin(&source).understanding(newer);
        let finalize = Entry {
            log_id: LogId::new(LeaderId::new(1, 1), 8),
            payload: EntryPayload::Normal(crate::version::stamped(
                Command::FinalizeVersion(rpb::FinalizeVersion { version: newer }),
                1,
            )),
        };
        source.apply(vec![finalize]).await.unwrap();
        let snap = snapshot(&mut source).await;

        let kv = Arc::new(MemStore::new());
        let (mut target, _target_dir) = open(kv.clone()).await;
        let err = target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "snapshot of cluster version {newer} needs a newer sluice"
            )),
            "{err}"
        );
        assert_eq!(target.blocked_index().load(Ordering::Relaxed), 8);
        assert_eq!(target.applied_state().await.unwrap().0, None);
        assert_eq!(sm::cluster_version::recorded(kv.as_ref()).unwrap(), None);
    }

    #[tokio::test]
    async fn snapshots_carry_the_reference_index() {
        let (mut source, _dir) = populated().await;
        assert_eq!(references(&source.kv), expected());
        let snap = snapshot(&mut source).await;

        let kv = Arc::new(MemStore::new());
        let (mut target, _target_dir) = open(kv.clone()).await;
        target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(references(&kv), expected());
        assert_eq!(
            refs::locate(kv.as_ref(), "e1.b").unwrap(),
            Some(refs::part_locator("b", "m", "u1", 1))
        );
        let ask = ["e1.a", "e1.c", "e1.b"].map(String::from);
        assert_eq!(
            sm::filter_unreferenced(kv.as_ref(), &ask).unwrap(),
            vec!["e1.c".to_string()]
        );
    }

    /// A snapshot file of a newer format is refused before the store is
    /// touched, with an error naming both versions; the store keeps its
    /// format version through an install.
    #[tokio::test]
    async fn an_installed_snapshot_has_the_same_digest_and_settings() {
        let (mut source, _dir) = populated().await;
        let set = Command::SetClusterSettings(rpb::SetClusterSettings {
            settings: Some(rpb::ClusterSettings {
                epoch_lease_ms: Some(1_234),
            }),
            ..Default::default()
        });
        source.apply([entry(20, set)]).await.unwrap();
        let at_source = source.digester().digest().await.unwrap();
        assert_eq!(at_source.applied_index, 20);
        assert_eq!(
            at_source.digest,
            sm::state_digest(source.kv.as_ref()).unwrap()
        );
        let snap = snapshot(&mut source).await;

        let kv = Arc::new(MemStore::new());
        let (mut target, _target_dir) = open(kv.clone()).await;
        let empty = target.digester().digest().await.unwrap();
        assert_eq!((empty.applied_index, empty.digest.records), (0, 0));
        target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(target.digester().digest().await.unwrap(), at_source);
        assert_eq!(sm::settings::epoch_lease_ms(kv.as_ref()).unwrap(), 1_234);
    }

    #[tokio::test]
    async fn a_snapshot_of_a_newer_format_is_refused() {
        use sluice_proto::format::{META_STORE_FORMAT, SNAPSHOT_FORMAT};

        let (mut source, dir) = populated().await;
        let snap = snapshot(&mut source).await;
        let records = blob_of(snap.snapshot).await.records;
        let mut newer = snapshot::file_bytes(&records);
        newer[1] = (SNAPSHOT_FORMAT + 1) as u8;

        let kv = Arc::new(MemStore::new());
        crate::store::format::open_format(kv.as_ref(), "t")
            .await
            .unwrap();
        let (mut target, _target_dir) = open(kv.clone()).await;
        let e = target
            .install_snapshot(&snap.meta, file_of(&dir, &newer).await)
            .await
            .unwrap_err();
        let want = format!(
            "snapshot has format version {}; this binary understands up to {SNAPSHOT_FORMAT}",
            SNAPSHOT_FORMAT + 1
        );
        assert!(e.to_string().contains(&want), "{e}");
        assert!(data_rows(kv.as_ref()).is_empty());
        assert_eq!(target.applied_state().await.unwrap().0, None);

        target
            .install_snapshot(
                &snap.meta,
                file_of(&dir, &snapshot::file_bytes(&records)).await,
            )
            .await
            .unwrap();
        assert_eq!(references(&kv), expected());
        assert_eq!(
            crate::store::format::read_format(kv.as_ref(), "t").unwrap(),
            Some(META_STORE_FORMAT)
        );
    }

    #[tokio::test]
    async fn snapshots_carry_access_keys() {
        let (mut source, _dir) = populated().await;
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
        let (mut target, _target_dir) = open(kv.clone()).await;
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

    /// Every record of the data spaces, in order.
    fn data_rows<K: KvStore>(kv: &K) -> Vec<(Space, Vec<u8>, Vec<u8>)> {
        let mut rows = Vec::new();
        for space in Space::DATA {
            for (k, v) in kv
                .scan(
                    space,
                    std::ops::Bound::Unbounded,
                    std::ops::Bound::Unbounded,
                    usize::MAX,
                )
                .unwrap()
            {
                rows.push((space, k, v));
            }
        }
        rows
    }

    /// A second handle on the same state machine (what a test hook applies
    /// through while the first is building).
    fn twin<K: KvStore>(sm: &StateMachine<K>) -> StateMachine<K> {
        StateMachine {
            kv: sm.kv.clone(),
            dir: sm.dir.clone(),
            capture: sm.capture.clone(),
            build_lock: sm.build_lock.clone(),
            snapshot_seq: sm.snapshot_seq.clone(),
            current_lock: sm.current_lock.clone(),
            snapshot_bytes: sm.snapshot_bytes.clone(),
            format: sm.format,
            blocked: sm.blocked.clone(),
            // Its own: the hook applies through it from inside a store
            // access, which may be one of the first handle's applies.
            apply_lock: Arc::new(AsyncMutex::new(())),
        }
    }

    fn delete_object(key: &str) -> Command {
        Command::DeleteObject(pb::ObjectKey {
            bucket: "b".into(),
            key: key.into(),
            ..Default::default()
        })
    }

    /// Applies keep landing while the snapshot is written (between its
    /// pages and between reading a record and checking it): overwrites,
    /// deletes and new keys before and behind the walk. The snapshot holds
    /// exactly the state when the builder was taken.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_is_the_state_when_its_build_started() {
        let setup: Vec<Command> = epoch_and_bucket()
            .into_iter()
            .chain(
                (0..120).map(|i| put_object(&format!("k{i:03}"), &format!("e1.{:x}", 0x1000 + i))),
            )
            .collect();
        let setup: Vec<_> = setup
            .into_iter()
            .enumerate()
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        let kv = Arc::new(Hooked::default());
        let (mut sm, _dir) = open(kv.clone()).await;
        sm.apply(setup.clone()).await.unwrap();
        let reference_kv = Arc::new(MemStore::new());
        let (mut reference, _reference_dir) = open(reference_kv.clone()).await;
        reference.apply(setup.clone()).await.unwrap();

        assert_eq!(
            data_rows(kv.as_ref()).len(),
            363,
            "bucket, 2 epoch rows, 120 objects, their manifests and refs"
        );
        let mut builder = sm.get_snapshot_builder().await;
        // Later entries: overwrite, delete and add keys all over the range.
        let mut later = std::collections::VecDeque::new();
        let mut index = setup.len() as u64;
        for i in 0..60u32 {
            let command = match i % 4 {
                0 => put_object(&format!("k{:03}", i * 2), &format!("e1.{:x}", 0x2000 + i)),
                1 => delete_object(&format!("k{:03}", 119 - i)),
                2 => put_object(&format!("k{:03}x", i), &format!("e1.{:x}", 0x3000 + i)),
                _ => delete_object(&format!("k{:03}x", i - 1)),
            };
            index += 1;
            later.push_back(entry(index, command));
        }
        // Two land before the build starts writing.
        sm.apply([later.pop_front().unwrap(), later.pop_front().unwrap()])
            .await
            .unwrap();
        let later = Arc::new(std::sync::Mutex::new(later));
        let applied_during = Arc::new(AtomicU64::new(0));
        {
            let (later, applied_during) = (later.clone(), applied_during.clone());
            let mut applier = twin(&sm);
            let handle = tokio::runtime::Handle::current();
            // Before every page of the walk and every pre-image check.
            kv.set_hook(move |access, _| {
                let walking = match access {
                    Access::Get(space) => space == Space::PreImages,
                    Access::Scan(space) => Space::DATA.contains(&space),
                    Access::Got(_) => false,
                };
                let next = walking.then(|| later.lock().unwrap().pop_front()).flatten();
                if let Some(e) = next {
                    handle.block_on(applier.apply([e])).unwrap();
                    applied_during.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let snap = builder.build_snapshot().await.unwrap();
        kv.clear_hook();
        assert!(
            applied_during.load(Ordering::Relaxed) >= 50,
            "only {} entries applied during the build",
            applied_during.load(Ordering::Relaxed)
        );
        let rest: Vec<_> = later.lock().unwrap().drain(..).collect();
        sm.apply(rest).await.unwrap();
        // The build's pre-images are gone and applies stopped saving them.
        assert_eq!(sm.capture.load(Ordering::Relaxed), 0);
        assert!(
            kv.inner
                .scan(
                    Space::PreImages,
                    std::ops::Bound::Unbounded,
                    std::ops::Bound::Unbounded,
                    1
                )
                .unwrap()
                .is_empty()
        );
        assert_ne!(data_rows(kv.as_ref()), data_rows(reference_kv.as_ref()));

        let target_kv = Arc::new(MemStore::new());
        let (mut target, _target_dir) = open(target_kv.clone()).await;
        assert_eq!(
            snap.meta.last_log_id,
            reference.applied_state().await.unwrap().0
        );
        target
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        let (got, want) = (
            data_rows(target_kv.as_ref()),
            data_rows(reference_kv.as_ref()),
        );
        let first_difference = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            got == want,
            "{} records installed, {} expected; first difference at {first_difference:?}",
            got.len(),
            want.len()
        );
        assert_eq!(
            target.applied_state().await.unwrap(),
            reference.applied_state().await.unwrap()
        );
    }

    /// A crash after the install marker and half the load: the next open
    /// finishes the install from the kept file.
    #[tokio::test]
    async fn an_interrupted_install_is_finished_at_open() {
        let (mut source, _dir) = populated().await;
        let snap = snapshot(&mut source).await;
        let records = blob_of(snap.snapshot).await;

        let kv = Arc::new(MemStore::new());
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        std::fs::create_dir_all(&snapshots).unwrap();
        std::fs::write(
            snapshots.join("x.snap"),
            snapshot::file_bytes(&records.records),
        )
        .unwrap();
        let stored = rpb::StoredSnapshot {
            meta: Some(snap.meta.to_pb()),
            file: "x.snap".into(),
        };
        let mut b = Batch::new();
        b.put(Space::SmMeta, INSTALLING, snap.meta.to_pb().encode_to_vec());
        b.put(Space::Snapshot, CURRENT, stored.encode_to_vec());
        // What the crash left: a record the snapshot does not have, and
        // the previous applied id.
        b.put(Space::Objects, b"b\0stale".to_vec(), b"x".to_vec());
        b.put(
            Space::SmMeta,
            APPLIED,
            LogId::new(LeaderId::new(1, 1), 1).to_pb().encode_to_vec(),
        );
        kv.apply(b).unwrap();

        let mut sm = StateMachine::open(kv.clone(), &snapshots).await.unwrap();
        assert_eq!(data_rows(kv.as_ref()), data_rows(source.kv.as_ref()));
        assert!(kv.get(Space::SmMeta, INSTALLING).unwrap().is_none());
        assert_eq!(sm.applied_state().await.unwrap().0, snap.meta.last_log_id);
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snap.meta);
        assert_eq!(blob_of(current.snapshot).await, records);
    }

    /// A received file that does not decode (here a valid snapshot with
    /// the tail of another transfer after it, what openraft leaves when a
    /// transfer restarts at offset 0 under the same id) fails the install
    /// before the store is touched; the node opens again as it was.
    #[tokio::test]
    async fn a_torn_snapshot_file_fails_the_install_and_changes_nothing() {
        let (mut source, dir) = populated().await;
        let snap = snapshot(&mut source).await;
        let mut bytes = snapshot::file_bytes(&blob_of(snap.snapshot).await.records);
        bytes.extend_from_slice(&[0x30, 0x01, 0x02]);
        let path = dir.path().join("torn");
        std::fs::write(&path, &bytes).unwrap();

        let kv = Arc::new(MemStore::new());
        let target_dir = tempfile::tempdir().unwrap();
        let snapshots = target_dir.path().join("snapshots");
        let mut target = StateMachine::open(kv.clone(), &snapshots).await.unwrap();
        target
            .apply(
                epoch_and_bucket()
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| entry(i as u64 + 1, c)),
            )
            .await
            .unwrap();
        let before = data_rows(kv.as_ref());
        let applied = target.applied_state().await.unwrap();
        let file = Box::new(tokio::fs::File::open(&path).await.unwrap());
        let installed = target.install_snapshot(&snap.meta, file).await;
        assert!(installed.is_err(), "a torn file installs");
        assert_eq!(data_rows(kv.as_ref()), before);
        assert!(kv.get(Space::SmMeta, INSTALLING).unwrap().is_none());
        drop(target);
        let mut reopened = StateMachine::open(kv.clone(), &snapshots).await.unwrap();
        assert_eq!(reopened.applied_state().await.unwrap(), applied);
        assert!(reopened.get_current_snapshot().await.unwrap().is_none());
    }

    /// Two builds at the same applied id (two nodes, or one node before
    /// and after a restart) get different snapshot ids.
    #[tokio::test]
    async fn builds_at_one_log_id_have_distinct_ids() {
        let (mut a, _dir_a) = populated().await;
        let (mut b, _dir_b) = populated().await;
        let (first, second, third) = (
            snapshot(&mut a).await.meta,
            snapshot(&mut b).await.meta,
            snapshot(&mut a).await.meta,
        );
        assert_eq!(first.last_log_id, second.last_log_id);
        assert_ne!(first.snapshot_id, second.snapshot_id);
        assert_ne!(first.snapshot_id, third.snapshot_id);
    }

    /// openraft's state machine worker opens the current snapshot (to send
    /// it) while a build task replaces it and removes the old file: the
    /// open still finds its file (an error here would end the Raft).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sending_the_current_snapshot_races_a_build() {
        let kv = Arc::new(Hooked::default());
        let (mut sm, _dir) = open(kv.clone()).await;
        let entries: Vec<_> = epoch_and_bucket()
            .into_iter()
            .chain([put_object("a", "e1.a")])
            .enumerate()
            .map(|(i, c)| entry(i as u64 + 1, c))
            .collect();
        sm.apply(entries).await.unwrap();
        snapshot(&mut sm).await;
        sm.apply([entry(4, put_object("b", "e1.b"))]).await.unwrap();
        let mut builder = sm.get_snapshot_builder().await;
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let build = tokio::spawn(async move {
            go_rx.await.unwrap();
            let built = builder.build_snapshot().await.unwrap();
            // The hook may be gone already (it stopped waiting).
            let _ = done_tx.send(());
            built.meta
        });
        let mut go_tx = Some(go_tx);
        kv.set_hook(move |access, _| {
            if access == Access::Got(Space::Snapshot)
                && let Some(go) = go_tx.take()
            {
                // The worker has read the current snapshot's name: let the
                // build run to its end (it cannot, while the file is being
                // opened: the wait times out).
                go.send(()).unwrap();
                let _ = done_rx.recv_timeout(std::time::Duration::from_secs(2));
            }
        });
        let sent = sm.get_current_snapshot().await;
        kv.clear_hook();
        let built = build.await.unwrap();
        let sent = sent
            .expect("the current snapshot opens")
            .expect("one exists");
        assert_ne!(sent.meta.snapshot_id, built.snapshot_id);
        let now = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(now.meta, built);
    }
}
