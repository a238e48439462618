//! [`ShardStore`]: the seam between the gRPC service and the disk.
//!
//! A shard is one erasure-coded column of a blob, identified by a
//! [`ShardKey`] `(blob_id, shard_index)` and stored as a sequence of shard
//! blocks. Every block but the last holds exactly `block_size` bytes; the
//! last holds `1..=block_size`. Each block is kept with its CRC32C
//! ([`crate::block_crc32c`]) and verified on every read.
//!
//! Two implementations share one conformance suite (`conformance.rs`):
//! [`DiskStore`] (the real one: temp file, fsync, rename, fsync directory)
//! and [`MemoryStore`] (for tests of code above the seam).
//!
//! # Listing order
//! [`ShardStore::list`] pages through blobs in *store order*
//! ([`list_position`]): by fan-out partition ([`fanout_of`], the low byte
//! of CRC32C(blob_id), which is the disk store's directory), then by blob
//! id bytes. It is not plain blob-id order: that order would make every
//! page of a disk store read all [`FANOUT`] directories, while in store
//! order a page resumes inside the one directory its cursor names.

pub mod dir_format;
mod disk;
mod format;
mod memory;

#[cfg(test)]
mod conformance;

use std::future::Future;
use std::path::PathBuf;

use bytes::Bytes;

pub use disk::{DiskReader, DiskStore, DiskWriter, MAX_QUARANTINED_FILES};
pub use format::{HEADER_LEN, MAX_BLOCK_SIZE, stored_len};
pub use memory::{MemoryReader, MemoryStore, MemoryWriter};

/// Longest accepted blob id, in bytes.
pub const MAX_BLOB_ID_LEN: usize = 128;
/// Most shards of one blob, so shard indexes are `0..MAX_SHARDS_PER_BLOB`:
/// the Reed–Solomon code over GF(2^8) has at most 256 shards (`k + m`,
/// the gateway's `MAX_TOTAL_SHARDS`). Deleting a blob probes this many
/// shard paths ([`ShardStore::delete_blobs`]).
pub const MAX_SHARDS_PER_BLOB: u32 = 256;
/// Number of listing partitions ([`fanout_of`]): the disk store's fan-out
/// directories under `shards/`.
pub const FANOUT: usize = 256;

/// Listing partition of a blob, `0..FANOUT`: the low byte of
/// CRC32C(blob_id). Stable across releases: it names the disk store's
/// directory of the blob's shards.
pub fn fanout_of(blob_id: &str) -> usize {
    (crate::block_crc32c(blob_id.as_bytes()) & 0xff) as usize
}

/// Where `blob_id` sorts in store order: `(fanout_of(blob_id), blob_id)`
/// (see the module docs). Any string has a position, so any string is a
/// valid [`ShardStore::list`] cursor; `""` sorts before every blob id.
pub fn list_position(blob_id: &str) -> (usize, &str) {
    if blob_id.is_empty() {
        // CRC32C("") is 0 too; spelled out so the start is not a coincidence.
        return (0, "");
    }
    (fanout_of(blob_id), blob_id)
}

/// Identifies one stored shard. Ordered by blob id, then shard index (not
/// the store order of [`ShardStore::list`], see [`list_position`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardKey {
    blob_id: String,
    shard_index: u32,
}

impl ShardKey {
    /// Validates `blob_id`: 1..=[`MAX_BLOB_ID_LEN`] bytes of ASCII letters,
    /// digits, `-`, `_` and `.` (epoch blob ids are `e<epoch>.<hex>`, see
    /// `sluice_proto::blob_id`), not starting with `.` and without `..` (it
    /// becomes part of a file name); and `shard_index`:
    /// `0..`[`MAX_SHARDS_PER_BLOB`].
    /// Errors: [`StoreError::InvalidBlobId`], [`StoreError::InvalidShardIndex`].
    pub fn new(blob_id: impl Into<String>, shard_index: u32) -> Result<Self, StoreError> {
        let blob_id = blob_id.into();
        validate_blob_id(&blob_id)?;
        if shard_index >= MAX_SHARDS_PER_BLOB {
            return Err(StoreError::InvalidShardIndex(shard_index));
        }
        Ok(ShardKey {
            blob_id,
            shard_index,
        })
    }

    pub fn blob_id(&self) -> &str {
        &self.blob_id
    }

    pub fn shard_index(&self) -> u32 {
        self.shard_index
    }
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.blob_id, self.shard_index)
    }
}

/// Checks that `blob_id` is usable as a stored blob id (see [`ShardKey::new`]).
pub fn validate_blob_id(blob_id: &str) -> Result<(), StoreError> {
    let ok = !blob_id.is_empty()
        && blob_id.len() <= MAX_BLOB_ID_LEN
        && !blob_id.starts_with('.')
        && !blob_id.contains("..")
        // The disk store's temp-file marker.
        && !blob_id.contains(".tmp-")
        && blob_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidBlobId(
            blob_id.chars().take(MAX_BLOB_ID_LEN + 8).collect(),
        ))
    }
}

/// One shard block: its payload and the CRC32C of the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub data: Bytes,
    pub crc32c: u32,
}

/// What a committed shard write stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Payload bytes (sum of block lengths; headers and checksums excluded).
    pub payload_bytes: u64,
    pub blocks: u64,
}

/// One entry of a [`ShardStore::list`] page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEntry {
    pub key: ShardKey,
    /// Bytes the shard occupies in the store format: [`stored_len`].
    pub stored_bytes: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub modified_ms: i64,
}

/// A page of [`ShardStore::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardPage {
    /// In store order: by [`list_position`] of the blob id, then shard
    /// index; all shards of a blob are on the same page.
    pub shards: Vec<ShardEntry>,
    /// More blobs may follow (their names were seen; they may be gone by
    /// the next page, which is then empty and not truncated); ask again
    /// with `after_blob_id` = the last blob id of this page.
    pub is_truncated: bool,
}

/// Totals over every committed shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub shards: u64,
    /// Sum of [`ShardEntry::stored_bytes`].
    pub stored_bytes: u64,
}

/// Errors of a [`ShardStore`], grouped by what the caller can do about them.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No committed shard under this key.
    #[error("shard {0} not found")]
    NotFound(ShardKey),
    #[error(
        "invalid blob id {0:?}: want 1..=128 bytes of [A-Za-z0-9_.-], no leading dot, no \"..\" or \".tmp-\""
    )]
    InvalidBlobId(String),
    #[error("invalid shard index {0}: want 0..{MAX_SHARDS_PER_BLOB}")]
    InvalidShardIndex(u32),
    #[error("invalid block size {0}: want 1..={MAX_BLOCK_SIZE} bytes")]
    InvalidBlockSize(u32),
    /// A block longer than the shard's block size, or empty.
    #[error("block {block} has {len} bytes; want 1..={block_size}")]
    InvalidBlockLen {
        block: u64,
        len: usize,
        block_size: u32,
    },
    /// A short block was followed by another block.
    #[error("block {block} follows a short block; only the last block may be short")]
    BlockAfterShortBlock { block: u64 },
    /// The requested block range does not lie inside the shard.
    #[error("blocks {first}..{end} requested from shard {key} of {blocks} blocks")]
    RangeOutOfBounds {
        key: ShardKey,
        first: u64,
        end: u64,
        blocks: u64,
    },
    /// Stored bytes failed verification: a block checksum (`block` set), or
    /// the shard header / file length (`block` unset, the whole shard is bad).
    #[error("shard {key} corrupt{}: {reason}", block.map(|b| format!(" at block {b}")).unwrap_or_default())]
    Corrupt {
        key: ShardKey,
        block: Option<u64>,
        reason: &'static str,
    },
    /// The shard file was written in a format version this binary does
    /// not read (a newer release wrote it).
    #[error("shard {key}: {source}")]
    ShardFormat {
        key: ShardKey,
        #[source]
        source: sluice_proto::format::FormatError,
    },
    /// The data dir's format version is newer than this binary
    /// understands, missing, or has no migration (see `dir_format`).
    #[error(transparent)]
    DirFormat(sluice_proto::format::FormatError),
    /// The data dir's format file is not `sluice-datanode-format <n>`.
    #[error("format file {} does not read `sluice-datanode-format <version>`: found {found:?}", path.display())]
    BadFormatFile { path: PathBuf, found: String },
    /// An earlier write on this writer failed or was cancelled; drop it.
    #[error("shard writer for {0} failed earlier and must be dropped")]
    WriterFailed(ShardKey),
    /// The runtime is shutting down and refused to run the disk task.
    #[error("store is shutting down")]
    ShuttingDown,
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }
}

/// What [`ShardStore::quarantine`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quarantine {
    /// The shard moved out of the shard namespace.
    Moved,
    /// The quarantine is full: the shard stays in place (still listed;
    /// reads fail its checksum and route around it, heal rewrites it).
    Full,
    /// No shard was stored under the key.
    NotStored,
}

/// Stores shards. Cloning is cheap and shares the store.
///
/// To ensure correctness, implementations guarantee:
/// * a shard becomes visible (to [`open`](Self::open), [`list`](Self::list),
///   [`stats`](Self::stats)) only when [`ShardWriter::commit`] returns `Ok`,
///   and for a durable store only once it survives a crash;
/// * committing over an existing key replaces it atomically: a reader sees
///   the old or the new shard, never a mix;
/// * a writer dropped before `commit` leaves nothing behind (a commit
///   dropped while it runs may still have made the shard visible, as a
///   crash right after it would);
/// * every block read is checked against its stored CRC32C, and a mismatch
///   is reported as [`StoreError::Corrupt`] for that block only.
pub trait ShardStore: Clone + Send + Sync + 'static {
    type Writer: ShardWriter;
    type Reader: ShardReader;

    /// Starts writing shard `key` whose full blocks are `block_size` bytes.
    /// Errors: [`StoreError::InvalidBlockSize`], [`StoreError::Io`].
    fn create(
        &self,
        key: &ShardKey,
        block_size: u32,
    ) -> impl Future<Output = Result<Self::Writer, StoreError>> + Send;

    /// Opens blocks `[first_block, first_block + block_count)` of a
    /// committed shard; `block_count == 0` means to the end.
    /// Errors: [`StoreError::NotFound`], [`StoreError::RangeOutOfBounds`],
    /// [`StoreError::Corrupt`] (bad header or length), [`StoreError::Io`].
    fn open(
        &self,
        key: &ShardKey,
        first_block: u64,
        block_count: u64,
    ) -> impl Future<Output = Result<Self::Reader, StoreError>> + Send;

    /// Deletes every shard of the given blobs, whatever their index
    /// (unknown blobs are fine); returns how many shards were deleted.
    /// Nothing is scanned: a disk store probes the [`MAX_SHARDS_PER_BLOB`]
    /// possible paths of each blob, so the cost follows the request, not
    /// the store.
    /// Errors: [`StoreError::InvalidBlobId`], [`StoreError::Io`].
    fn delete_blobs(
        &self,
        blob_ids: &[String],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes one shard by its key (its path is computed, nothing is
    /// scanned); `Ok(false)` when it was not stored.
    /// Errors: [`StoreError::Io`].
    fn delete_shard(&self, key: &ShardKey)
    -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether a committed shard with a valid header (and a length that
    /// fits its block size) is stored under `key`; no block is read.
    /// Errors: [`StoreError::Io`] (the answer is unknown).
    fn has_shard(&self, key: &ShardKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Moves shard `key` out of the shard namespace (scrub found it
    /// corrupt): it is no longer listed, opened or counted. A durable
    /// store keeps a bounded number of quarantined files and never deletes
    /// one (a corrupt shard may still hold the only good copy of some
    /// blocks); when that many are kept, the shard stays where it is
    /// ([`Quarantine::Full`]).
    /// Errors: [`StoreError::Io`].
    fn quarantine(
        &self,
        key: &ShardKey,
    ) -> impl Future<Output = Result<Quarantine, StoreError>> + Send;

    /// Lists the shards of the first `limit` (at least 1) blobs after
    /// `after_blob_id` in store order ([`list_position`]; `""` starts at
    /// the beginning, and the cursor need not name a stored blob).
    ///
    /// A *walk* is a sequence of pages, each asked with the previous
    /// page's last blob id, from `""` until a page is not truncated. A walk
    /// returns every shard committed before it started and not deleted
    /// before it got there exactly once, in store order; a shard committed
    /// or deleted during the walk may or may not be returned (a disk store
    /// serves the rest of a directory from the names it read for the
    /// previous page). Each entry's size and time are read when its page
    /// is served.
    ///
    /// Cost: a walk over a disk store reads each fan-out directory about
    /// once and stats each listed shard once (O(shards)), holding at most
    /// one directory's names per walk in memory; see [`DiskStore`].
    /// Errors: [`StoreError::Io`].
    fn list(
        &self,
        after_blob_id: &str,
        limit: usize,
    ) -> impl Future<Output = Result<ShardPage, StoreError>> + Send;

    /// Totals over committed shards.
    fn stats(&self) -> StoreStats;
}

/// An uncommitted shard. Dropping it without [`commit`](Self::commit)
/// discards everything written.
pub trait ShardWriter: Send + 'static {
    /// Appends the next block. `block.crc32c` must be the CRC32C of
    /// `block.data` (the caller verified it); it is stored as given.
    /// Errors: [`StoreError::InvalidBlockLen`],
    /// [`StoreError::BlockAfterShortBlock`], [`StoreError::WriterFailed`],
    /// [`StoreError::Io`].
    fn write_block(&mut self, block: Block) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Makes every block written so far durable (for a disk store: the
    /// temp file's data is fsynced), so the caller may stop counting those
    /// bytes as held in memory. The shard stays invisible until
    /// [`commit`](Self::commit), and dropping the writer still discards it.
    /// Errors: [`StoreError::WriterFailed`], [`StoreError::Io`].
    fn sync(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Makes the shard durable and visible, replacing any shard with the same key.
    fn commit(self) -> impl Future<Output = Result<Committed, StoreError>> + Send;
}

/// Yields the blocks of an opened range, in order, one at a time.
pub trait ShardReader: Send + 'static {
    /// The next block, `None` after the last one. A
    /// [`StoreError::Corrupt`] concerns that block only; reading may go on.
    fn next_block(&mut self) -> impl Future<Output = Option<Result<Block, StoreError>>> + Send;

    /// A block already read (a disk store reads the first block of the
    /// range with the header: from the page cache on the async worker, or
    /// in one trip to the blocking pool), taken
    /// without waiting; `None` if the next block must be read. What
    /// [`next_block`](Self::next_block) would have returned next.
    fn ready_block(&mut self) -> Option<Result<Block, StoreError>> {
        None
    }

    /// Blocks left to read (a ready block included).
    fn remaining(&self) -> u64;
}

/// Tracks the block-length rule while a shard is written: every block but
/// the last is exactly `block_size` bytes, the last `1..=block_size`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockRule {
    block_size: u32,
    blocks: u64,
    payload_bytes: u64,
    saw_short: bool,
}

impl BlockRule {
    pub(crate) fn new(block_size: u32) -> Result<Self, StoreError> {
        if block_size == 0 || block_size > MAX_BLOCK_SIZE {
            return Err(StoreError::InvalidBlockSize(block_size));
        }
        Ok(BlockRule {
            block_size,
            blocks: 0,
            payload_bytes: 0,
            saw_short: false,
        })
    }

    /// Accepts the next block of `len` bytes or says why not.
    pub(crate) fn accept(&mut self, len: usize) -> Result<(), StoreError> {
        let block = self.blocks;
        if len == 0 || len > self.block_size as usize {
            return Err(StoreError::InvalidBlockLen {
                block,
                len,
                block_size: self.block_size,
            });
        }
        if self.saw_short {
            return Err(StoreError::BlockAfterShortBlock { block });
        }
        self.saw_short = len < self.block_size as usize;
        self.blocks += 1;
        self.payload_bytes += len as u64;
        Ok(())
    }

    pub(crate) fn committed(&self) -> Committed {
        Committed {
            payload_bytes: self.payload_bytes,
            blocks: self.blocks,
        }
    }
}

/// Resolves `[first_block, first_block + block_count)` (`0` = to the end)
/// against a shard of `blocks` blocks into `first..end`.
pub(crate) fn resolve_range(
    key: &ShardKey,
    blocks: u64,
    first: u64,
    count: u64,
) -> Result<(u64, u64), StoreError> {
    let end = if count == 0 {
        blocks.max(first)
    } else {
        first.saturating_add(count)
    };
    if first > blocks || end > blocks {
        return Err(StoreError::RangeOutOfBounds {
            key: key.clone(),
            first,
            end,
            blocks,
        });
    }
    Ok((first, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_id_rules() {
        assert!(ShardKey::new("0123abcdEF_-x", 3).is_ok());
        // Epoch blob ids (`sluice_proto::blob_id`) carry one dot.
        assert!(ShardKey::new("e42.000000000000000000000000deadbeef", 0).is_ok());
        assert!(ShardKey::new("a.b", 0).is_ok());
        for bad in [
            "",
            ".hidden",
            "a..b",
            "a.tmp-b",
            "../x",
            "a/b",
            "é",
            &"x".repeat(MAX_BLOB_ID_LEN + 1),
        ] {
            assert!(
                matches!(ShardKey::new(bad, 0), Err(StoreError::InvalidBlobId(_))),
                "{bad:?}"
            );
        }
        assert!(ShardKey::new("x".repeat(MAX_BLOB_ID_LEN), 0).is_ok());
        assert!(ShardKey::new("a", MAX_SHARDS_PER_BLOB - 1).is_ok());
        for bad in [MAX_SHARDS_PER_BLOB, u32::MAX] {
            assert!(
                matches!(ShardKey::new("a", bad), Err(StoreError::InvalidShardIndex(i)) if i == bad),
                "{bad}"
            );
        }
    }

    #[test]
    fn store_order_is_fanout_then_blob_id() {
        // CRC32C("abc") = 0x364B3FB7: a portable, release-stable placement.
        assert_eq!(fanout_of("abc"), 0xb7);
        assert_eq!(list_position("abc"), (0xb7, "abc"));
        assert_eq!(list_position(""), (0, ""));
        let mut ids: Vec<String> = (0..2000).map(|i| format!("b{i}")).collect();
        ids.sort_by(|a, b| list_position(a).cmp(&list_position(b)));
        assert!(ids.iter().all(|id| list_position("") < list_position(id)));
        // Partitions are contiguous and in order; blob ids sort within each.
        for w in ids.windows(2) {
            let (fa, fb) = (fanout_of(&w[0]), fanout_of(&w[1]));
            assert!(fa < fb || (fa == fb && w[0] < w[1]), "{w:?}");
        }
        let used: std::collections::HashSet<usize> = ids.iter().map(|id| fanout_of(id)).collect();
        assert_eq!(used.len(), FANOUT, "2000 ids fill every partition");
    }

    #[test]
    fn block_rule_allows_one_short_last_block() {
        assert!(matches!(
            BlockRule::new(0),
            Err(StoreError::InvalidBlockSize(0))
        ));
        assert!(BlockRule::new(MAX_BLOCK_SIZE + 1).is_err());
        let mut r = BlockRule::new(4).unwrap();
        r.accept(4).unwrap();
        r.accept(4).unwrap();
        assert!(matches!(
            r.accept(5),
            Err(StoreError::InvalidBlockLen {
                block: 2,
                len: 5,
                ..
            })
        ));
        assert!(matches!(
            r.accept(0),
            Err(StoreError::InvalidBlockLen {
                block: 2,
                len: 0,
                ..
            })
        ));
        r.accept(1).unwrap();
        assert!(matches!(
            r.accept(1),
            Err(StoreError::BlockAfterShortBlock { block: 3 })
        ));
        assert_eq!(
            r.committed(),
            Committed {
                payload_bytes: 9,
                blocks: 3
            }
        );
    }

    #[test]
    fn ranges_resolve_inside_the_shard() {
        let k = ShardKey::new("b", 0).unwrap();
        assert_eq!(resolve_range(&k, 5, 0, 0).unwrap(), (0, 5));
        assert_eq!(resolve_range(&k, 5, 1, 2).unwrap(), (1, 3));
        assert_eq!(resolve_range(&k, 5, 3, 0).unwrap(), (3, 5));
        assert_eq!(resolve_range(&k, 5, 5, 0).unwrap(), (5, 5));
        assert_eq!(resolve_range(&k, 0, 0, 0).unwrap(), (0, 0));
        assert!(resolve_range(&k, 5, 6, 0).is_err());
        assert!(resolve_range(&k, 5, 4, 2).is_err());
        assert!(resolve_range(&k, 5, u64::MAX, 2).is_err());
    }
}
