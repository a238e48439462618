//! VerifyShards: reads shards through and checks them as scrub does, for
//! the heal audit, which un-marks in meta only the shards found sound
//! (`docs/design/durability.md` §6, "Audit").
//!
//! A shard is sound when it is stored, its header is good, every block
//! passes its CRC32C and length check, and its shape is the one its blob's
//! placement gives: blocks of the asked `block_size`, `payload_bytes` in
//! all. The shape check is what scrub cannot do alone: a shard cut at a
//! block boundary, or one of another write under the same key, has only
//! good blocks.
//!
//! Bounds: at most [`MAX_VERIFY_SHARDS`] shards and [`MAX_VERIFY_BYTES`]
//! of asked payload per call (a single larger shard may go alone); one
//! call runs at a time per datanode (others wait their turn, FIFO), so
//! one block (at most `MAX_BLOCK_SIZE`) is held at once; reads are paced
//! by a [`TokenBucket`] of `verify_bandwidth_bytes_per_sec` shared by
//! every call. Nothing on disk changes: a corrupt shard stays for heal to
//! rewrite (scrub quarantines it on its own pass).

use sluice_proto::datanode::{ShardVerdict, VerifyShard};

use crate::scrub::{TokenBucket, pace};
use crate::store::{HEADER_LEN, ShardKey, ShardReader, ShardStore, StoreError};

pub use sluice_proto::shard::{MAX_VERIFY_BYTES, MAX_VERIFY_SHARDS};

/// Why a VerifyShards request is refused as a whole.
pub fn check_request(shards: &[VerifyShard]) -> Result<(), String> {
    if shards.len() > MAX_VERIFY_SHARDS {
        return Err(format!(
            "VerifyShards asks about {} shards; at most {MAX_VERIFY_SHARDS} per call",
            shards.len()
        ));
    }
    let bytes = shards
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.payload_bytes));
    if shards.len() > 1 && bytes > MAX_VERIFY_BYTES {
        return Err(format!(
            "VerifyShards asks to read {bytes} bytes; at most {MAX_VERIFY_BYTES} per call of more than one shard"
        ));
    }
    Ok(())
}

/// Reads shard `s` of `store` through, paced by `bucket`, and judges it.
/// Errors only when the store is shutting down.
pub async fn verify_shard<S: ShardStore>(
    store: &S,
    s: &VerifyShard,
    bucket: &mut TokenBucket,
) -> Result<ShardVerdict, StoreError> {
    // A blob id the store cannot hold is not stored here.
    let Ok(key) = ShardKey::new(s.blob_id.clone(), s.shard_index) else {
        return Ok(ShardVerdict::ShardAbsent);
    };
    if s.block_size == 0 {
        return Ok(ShardVerdict::ShardCorrupt);
    }
    let block_size = u64::from(s.block_size);
    let blocks = s.payload_bytes.div_ceil(block_size);
    let mut reader = match store.open(&key, 0, 0).await {
        Ok(r) => r,
        Err(e) => return verdict_of(e),
    };
    pace(bucket, HEADER_LEN).await;
    if reader.remaining() != blocks {
        return Ok(ShardVerdict::ShardCorrupt);
    }
    let mut block = 0u64;
    while let Some(next) = reader.next_block().await {
        let b = match next {
            Ok(b) => b,
            Err(e) => return verdict_of(e),
        };
        pace(bucket, b.data.len() as u64 + 4).await;
        let want = if block + 1 == blocks {
            s.payload_bytes - block * block_size
        } else {
            block_size
        };
        if b.data.len() as u64 != want {
            return Ok(ShardVerdict::ShardCorrupt);
        }
        block += 1;
    }
    Ok(if block == blocks {
        ShardVerdict::ShardSound
    } else {
        ShardVerdict::ShardCorrupt
    })
}

/// The verdict a store error while reading a shard gives.
fn verdict_of(e: StoreError) -> Result<ShardVerdict, StoreError> {
    match e {
        StoreError::NotFound(_) => Ok(ShardVerdict::ShardAbsent),
        StoreError::ShuttingDown => Err(e),
        StoreError::Corrupt { .. } | StoreError::RangeOutOfBounds { .. } => {
            Ok(ShardVerdict::ShardCorrupt)
        }
        _ => Ok(ShardVerdict::ShardUnread),
    }
}
