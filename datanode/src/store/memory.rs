//! [`MemoryStore`]: shards in a map, for tests of the code above the
//! [`ShardStore`] seam. It holds every shard in memory (unbounded by
//! design: tests only) and honours the same contract as the disk store,
//! including checksum verification on read.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::format::stored_len;
use super::{
    Block, BlockRule, Committed, Quarantine, ShardEntry, ShardKey, ShardPage, ShardReader,
    ShardStore, ShardWriter, StoreError, StoreStats, list_position, resolve_range,
    validate_blob_id,
};
use crate::block_crc32c;

/// In-memory shards; clones share the map.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shards: Arc<Mutex<BTreeMap<ShardKey, Arc<MemShard>>>>,
}

#[derive(Clone)]
struct MemShard {
    blocks: Vec<Block>,
    stored_bytes: u64,
    modified_ms: i64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<ShardKey, Arc<MemShard>>> {
        self.shards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fault injection: flips the low bit of byte `offset` of block `block`
    /// of a committed shard, keeping its stored checksum (bitrot). Returns
    /// whether there was such a byte.
    pub fn corrupt_block(&self, key: &ShardKey, block: u64, offset: usize) -> bool {
        let mut map = self.map();
        let Some(shard) = map.get_mut(key) else {
            return false;
        };
        let shard = Arc::make_mut(shard);
        let Some(b) = usize::try_from(block)
            .ok()
            .and_then(|i| shard.blocks.get_mut(i))
        else {
            return false;
        };
        if offset >= b.data.len() {
            return false;
        }
        let mut data = b.data.to_vec();
        data[offset] ^= 1;
        b.data = Bytes::from(data);
        true
    }
}

impl ShardStore for MemoryStore {
    type Writer = MemoryWriter;
    type Reader = MemoryReader;

    async fn create(&self, key: &ShardKey, block_size: u32) -> Result<MemoryWriter, StoreError> {
        Ok(MemoryWriter {
            store: self.clone(),
            key: key.clone(),
            rule: BlockRule::new(block_size)?,
            blocks: Vec::new(),
        })
    }

    async fn open(
        &self,
        key: &ShardKey,
        first_block: u64,
        block_count: u64,
    ) -> Result<MemoryReader, StoreError> {
        let shard = self
            .map()
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let (next, end) = resolve_range(key, shard.blocks.len() as u64, first_block, block_count)?;
        Ok(MemoryReader {
            key: key.clone(),
            shard,
            next,
            end,
        })
    }

    async fn delete_blobs(&self, blob_ids: &[String]) -> Result<u64, StoreError> {
        for id in blob_ids {
            validate_blob_id(id)?;
        }
        let mut map = self.map();
        let before = map.len();
        map.retain(|k, _| !blob_ids.iter().any(|id| id == k.blob_id()));
        Ok((before - map.len()) as u64)
    }

    async fn delete_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        Ok(self.map().remove(key).is_some())
    }

    /// The memory store has no header to damage: stored means valid.
    async fn has_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        Ok(self.map().contains_key(key))
    }

    /// Drops the shard (tests only: nothing is kept for inspection).
    async fn quarantine(&self, key: &ShardKey) -> Result<Quarantine, StoreError> {
        Ok(match self.map().remove(key) {
            Some(_) => Quarantine::Moved,
            None => Quarantine::NotStored,
        })
    }

    /// Store order like the disk store ([`list_position`]); each page
    /// sorts every shard after the cursor (tests only).
    async fn list(&self, after_blob_id: &str, limit: usize) -> Result<ShardPage, StoreError> {
        let limit = limit.max(1);
        let after = list_position(after_blob_id);
        let map = self.map();
        // (store position, shard index) of every shard after the cursor.
        let mut rest: Vec<_> = map
            .iter()
            .map(|(k, shard)| ((list_position(k.blob_id()), k.shard_index()), k, shard))
            .filter(|((position, _), ..)| *position > after)
            .collect();
        rest.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut page = ShardPage::default();
        let mut blobs = 0;
        for (_, key, shard) in rest {
            let new_blob = page
                .shards
                .last()
                .is_none_or(|e| e.key.blob_id() != key.blob_id());
            if new_blob {
                if blobs == limit {
                    page.is_truncated = true;
                    break;
                }
                blobs += 1;
            }
            page.shards.push(ShardEntry {
                key: key.clone(),
                stored_bytes: shard.stored_bytes,
                modified_ms: shard.modified_ms,
            });
        }
        Ok(page)
    }

    fn stats(&self) -> StoreStats {
        let map = self.map();
        StoreStats {
            shards: map.len() as u64,
            stored_bytes: map.values().map(|s| s.stored_bytes).sum(),
        }
    }
}

/// Collects blocks; `commit` inserts them into the map in one step.
pub struct MemoryWriter {
    store: MemoryStore,
    key: ShardKey,
    rule: BlockRule,
    blocks: Vec<Block>,
}

impl ShardWriter for MemoryWriter {
    async fn write_block(&mut self, block: Block) -> Result<(), StoreError> {
        self.rule.accept(block.data.len())?;
        self.blocks.push(block);
        Ok(())
    }

    /// Nothing to make durable: memory is the store.
    async fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn commit(self) -> Result<Committed, StoreError> {
        let committed = self.rule.committed();
        let modified_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        let shard = MemShard {
            blocks: self.blocks,
            stored_bytes: stored_len(committed.payload_bytes, committed.blocks),
            modified_ms,
        };
        self.store.map().insert(self.key, Arc::new(shard));
        Ok(committed)
    }
}

/// Reads blocks of a shard snapshot taken at `open`.
pub struct MemoryReader {
    key: ShardKey,
    shard: Arc<MemShard>,
    next: u64,
    end: u64,
}

impl ShardReader for MemoryReader {
    async fn next_block(&mut self) -> Option<Result<Block, StoreError>> {
        if self.next >= self.end {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let block = self.shard.blocks.get(usize::try_from(index).ok()?)?.clone();
        if block_crc32c(&block.data) != block.crc32c {
            return Some(Err(StoreError::Corrupt {
                key: self.key.clone(),
                block: Some(index),
                reason: "block checksum mismatch",
            }));
        }
        Some(Ok(block))
    }

    fn remaining(&self) -> u64 {
        self.end - self.next
    }
}
