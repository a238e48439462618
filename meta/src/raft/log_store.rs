//! [`LogStore`]: openraft's `RaftLogStorage` over a [`KvStore`].
//!
//! Layout: `Space::Log` maps the big-endian index to a protobuf
//! `raft.Entry`; `Space::LogMeta` holds `vote`, `committed` and `purged`
//! (protobuf `raft.Vote` / `raft.LogId`). Every write completes before the
//! call returns, so writes are serialized; a vote and an append are
//! acknowledged only after [`KvStore::flush`].

// openraft's StorageError / RPCError are what its traits return; helpers
// return them unboxed too rather than box and unbox at every call.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageIOError, Vote};
use prost::Message;
use sluice_proto::raft as rpb;

use super::convert::{FromPb, ToPb};
use super::{StorageError, TypeConfig};
use crate::store::{Batch, KvStore, Space};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// The Raft log, vote and committed id of one node. Cheap to clone (the
/// clone is the log reader replication tasks use).
pub struct LogStore<K: KvStore> {
    kv: Arc<K>,
}

impl<K: KvStore> Clone for LogStore<K> {
    fn clone(&self) -> Self {
        LogStore {
            kv: self.kv.clone(),
        }
    }
}

impl<K: KvStore> LogStore<K> {
    /// The log kept in `kv` (it may share the store with the state machine).
    pub fn new(kv: Arc<K>) -> Self {
        LogStore { kv }
    }

    fn read_log_id(&self, key: &[u8]) -> Result<Option<LogId<u64>>, StorageError> {
        let Some(bytes) = self
            .kv
            .get(Space::LogMeta, key)
            .map_err(|e| StorageIOError::read(&e))?
        else {
            return Ok(None);
        };
        let pb = rpb::LogId::decode(bytes.as_slice()).map_err(|e| StorageIOError::read(&e))?;
        Ok(Some(
            LogId::from_pb(pb).map_err(|e| StorageIOError::read(&e))?,
        ))
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    let pb = rpb::Entry::decode(bytes).map_err(|e| StorageIOError::read_logs(&e))?;
    Ok(Entry::from_pb(pb).map_err(|e| StorageIOError::read_logs(&e))?)
}

fn to_bound(b: Bound<&u64>) -> Bound<[u8; 8]> {
    match b {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn as_slice(b: &Bound<[u8; 8]>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl<K: KvStore> RaftLogReader<TypeConfig> for LogStore<K> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let start = to_bound(range.start_bound());
        let end = to_bound(range.end_bound());
        let rows = self
            .kv
            .scan(Space::Log, as_slice(&start), as_slice(&end), usize::MAX)
            .map_err(|e| StorageIOError::read_logs(&e))?;
        rows.iter().map(|(_, v)| decode_entry(v)).collect()
    }
}

impl<K: KvStore> RaftLogStorage<TypeConfig> for LogStore<K> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.read_log_id(PURGED)?;
        let last = self
            .kv
            .last(Space::Log)
            .map_err(|e| StorageIOError::read_logs(&e))?;
        let last_log_id = match last {
            Some((_, v)) => Some(decode_entry(&v)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let mut b = Batch::new();
        b.put(Space::LogMeta, VOTE, vote.to_pb().encode_to_vec());
        self.kv
            .apply(b)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.kv
            .flush()
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        let Some(bytes) = self
            .kv
            .get(Space::LogMeta, VOTE)
            .map_err(|e| StorageIOError::read_vote(&e))?
        else {
            return Ok(None);
        };
        let pb = rpb::Vote::decode(bytes.as_slice()).map_err(|e| StorageIOError::read_vote(&e))?;
        Ok(Some(
            Vote::from_pb(pb).map_err(|e| StorageIOError::read_vote(&e))?,
        ))
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError> {
        let mut b = Batch::new();
        match committed {
            Some(c) => b.put(Space::LogMeta, COMMITTED, c.to_pb().encode_to_vec()),
            None => b.delete(Space::LogMeta, COMMITTED),
        }
        self.kv.apply(b).map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError> {
        self.read_log_id(COMMITTED)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut b = Batch::new();
        for entry in entries {
            b.put(
                Space::Log,
                index_key(entry.log_id.index),
                entry.to_pb().encode_to_vec(),
            );
        }
        self.kv
            .apply(b)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Acknowledge only once the entries are durable.
        match self.kv.flush().await {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => {
                let err = StorageIOError::write_logs(&e);
                callback.log_io_completed(Err(std::io::Error::other(e)));
                return Err(err.into());
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let start = index_key(log_id.index);
        let keys = self
            .kv
            .keys_in(Space::Log, Bound::Included(&start), Bound::Unbounded)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let mut b = Batch::new();
        for k in keys {
            b.delete(Space::Log, k);
        }
        self.kv
            .apply(b)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let end = index_key(log_id.index);
        let keys = self
            .kv
            .keys_in(Space::Log, Bound::Unbounded, Bound::Included(&end))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // The marker goes with the first chunk; entries left below it by a
        // crash are never read (reads start above the marker) and the next
        // purge deletes them. Small batches because sled keeps memory after
        // a large one, with any sled cache size (figures in
        // bench/RESULTS.md).
        let mut keys = keys.into_iter().peekable();
        let mut b = Batch::new();
        b.put(Space::LogMeta, PURGED, log_id.to_pb().encode_to_vec());
        loop {
            for k in keys.by_ref().take(PURGE_BATCH_KEYS) {
                b.delete(Space::Log, k);
            }
            self.kv
                .apply(std::mem::take(&mut b))
                .map_err(|e| StorageIOError::write_logs(&e))?;
            if keys.peek().is_none() {
                return Ok(());
            }
        }
    }
}

/// Log entries deleted per batch by a purge.
const PURGE_BATCH_KEYS: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use openraft::CommittedLeaderId;

    fn log_id(index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[tokio::test]
    async fn purge_deletes_every_entry_up_to_the_id_across_batches() {
        let kv = Arc::new(MemStore::new());
        let n = 3 * PURGE_BATCH_KEYS as u64 + 17;
        let mut b = Batch::new();
        for i in 1..=n {
            b.put(Space::Log, index_key(i).to_vec(), vec![1]);
        }
        kv.apply(b).unwrap();
        let mut store = LogStore::new(kv.clone());
        let upto = n - 5;
        store.purge(log_id(upto)).await.unwrap();
        let left = kv
            .keys_in(Space::Log, Bound::Unbounded, Bound::Unbounded)
            .unwrap();
        let expected: Vec<Vec<u8>> = (upto + 1..=n).map(|i| index_key(i).to_vec()).collect();
        assert_eq!(left, expected);
        assert_eq!(store.read_log_id(PURGED).unwrap(), Some(log_id(upto)));
    }
}
