//! [`DiskStore`]: shards as files under `<data_dir>/shards/`.
//!
//! A shard lives at `shards/<ff>/<blob_id>.<shard_index>`, where `ff` is the
//! low byte of CRC32C(blob_id) in hex (256 directories, created at open).
//! A write goes to `<blob_id>.<shard_index>.tmp-<uuid>` in the same
//! directory; commit fsyncs it, renames it over the final name and fsyncs
//! the directory. Temp files left by a crash are removed at open.
//!
//! Once a shard file is fsynced its pages are dropped from the page cache
//! with `posix_fadvise(POSIX_FADV_DONTNEED)` (Linux) unless the store keeps
//! written pages ([`DiskStore::set_keep_written_pages`]): the whole file at
//! commit; at a partial fsync of a credited stream only its full pages, so
//! the next block's write does not have to read the partly written last
//! page back. Only clean pages are dropped, so this changes no durability:
//! it keeps the page cache from growing with every byte written, and the
//! next shards' writes reuse the freed pages instead of taking (and the
//! kernel later reclaiming) fresh ones (figures in bench/RESULTS.md).
//!
//! A listing page ([`ShardStore::list`], store order: fan-out directory,
//! then blob id) reads the cursor's directory, sorts its shard names and
//! resumes after the cursor, then reads the next directories until the
//! page is full. The unread rest of the last directory is kept for the
//! page that continues the walk (at most [`LIST_WALKS_KEPT`] walks), so a
//! walk reads each directory once. Reading and sorting a whole directory
//! is the memory bound of a page: about `shards / 256` names (~40 k at
//! 10 M shards).
//!
//! Deleting a blob ([`ShardStore::delete_blobs`]) computes its shard paths:
//! it tries `<blob_id>.<i>` for every possible index `i` in
//! `0..MAX_SHARDS_PER_BLOB` instead of reading the directory.
//!
//! Scrub moves a corrupt shard to `<data_dir>/quarantine/<ms>-<key>`
//! ([`ShardStore::quarantine`]), at most [`MAX_QUARANTINED_FILES`] of them;
//! none is ever deleted by Sluice (an operator clears the directory), so a
//! full quarantine leaves further corrupt shards in place.
//!
//! All file I/O runs on the blocking pool (but a dropped writer's unlink of
//! its temp file, on the dropping thread, and reads the caches can answer:
//! a reader first tries to open the shard and read each block on the async
//! worker with `openat2(RESOLVE_CACHED)` and `preadv2(RWF_NOWAIT)`, and
//! goes to the blocking pool only where that would wait; see [`Io`]);
//! memory per reader is one block, per writer at most two (the held first
//! block and the next, written together; see [`DiskWriter`]).

use std::collections::{BTreeSet, VecDeque};
use std::fs::{self, File};
use std::io::{ErrorKind, IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::format::{self, Geometry, HEADER_LEN, HeaderError};
use super::{
    Block, BlockRule, Committed, FANOUT, MAX_SHARDS_PER_BLOB, Quarantine, ShardEntry, ShardKey,
    ShardPage, ShardReader, ShardStore, ShardWriter, StoreError, StoreStats, fanout_of,
    list_position, resolve_range, validate_blob_id,
};
use crate::metrics;

/// Most listing walks whose place the store keeps between pages (the
/// unread rest of one fan-out directory's sorted shard names each); beyond
/// it the oldest is dropped, and that walk's next page reads its directory
/// again. Memory: up to one directory's names per kept walk, about
/// `shards / 256` names of ~60 bytes (~2.5 MB at 10 M shards). GC, scrub
/// and a ListShards client walk at the same time.
pub const LIST_WALKS_KEPT: usize = 4;
/// Most quarantined shard files kept under `<data_dir>/quarantine/`; past
/// it a corrupt shard stays in place. None is deleted automatically.
pub const MAX_QUARANTINED_FILES: usize = 64;
/// Marks a temp file name: `<blob_id>.<shard_index>.tmp-<uuid>`.
const TMP_MARKER: &str = ".tmp-";

/// Shards stored as checksummed files; see the module docs for the layout.
#[derive(Clone)]
pub struct DiskStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `<data_dir>/shards`.
    root: PathBuf,
    /// `<data_dir>/quarantine`.
    quarantine: PathBuf,
    /// One lock per fan-out directory, held while a shard file is replaced
    /// or removed so the totals below stay exact.
    locks: Vec<Mutex<()>>,
    shards: AtomicU64,
    stored_bytes: AtomicU64,
    /// Value of the `node` label on metrics.
    node_label: String,
    /// Places of listing walks, oldest first (at most [`LIST_WALKS_KEPT`]).
    walks: Mutex<VecDeque<WalkPlace>>,
    /// Keep fsynced shard pages in the page cache (see the module docs).
    keep_written_pages: AtomicBool,
}

/// Where a listing walk stands between two pages.
struct WalkPlace {
    /// The cursor that continues the walk: the last blob id it was served.
    after: String,
    /// Fan-out directory of `names`.
    fanout: usize,
    /// Shard names of that directory as read for an earlier page, sorted
    /// by `(blob_id, shard_index)`.
    names: Vec<(String, u32)>,
    /// First name not served yet.
    next: usize,
}

impl DiskStore {
    /// Opens (creating if needed) the store under `data_dir`, checks its
    /// format version (`dir_format`: a newer one is refused, an older one
    /// migrated), removes temp files left by a crash and counts the stored
    /// shards. `node_id` labels the metrics.
    pub async fn open(data_dir: &Path, node_id: u64) -> Result<DiskStore, StoreError> {
        let root = data_dir.join("shards");
        let quarantine = data_dir.join("quarantine");
        let data_dir = data_dir.to_path_buf();
        let inner = blocking(move || {
            // Before anything reads or creates `shards/`.
            super::dir_format::open_format(&data_dir)?;
            fs::create_dir_all(&root).map_err(StoreError::io("create directory", &root))?;
            fs::create_dir_all(&quarantine)
                .map_err(StoreError::io("create directory", &quarantine))?;
            for f in 0..FANOUT {
                let dir = root.join(fanout_dir_name(f));
                fs::create_dir_all(&dir).map_err(StoreError::io("create directory", &dir))?;
            }
            sync_dir(&root)?;
            sync_dir(&data_dir)?;
            let inner = Inner {
                root,
                quarantine,
                locks: (0..FANOUT).map(|_| Mutex::new(())).collect(),
                shards: AtomicU64::new(0),
                stored_bytes: AtomicU64::new(0),
                node_label: node_id.to_string(),
                walks: Mutex::new(VecDeque::with_capacity(LIST_WALKS_KEPT + 1)),
                keep_written_pages: AtomicBool::new(false),
            };
            inner.recover()?;
            Ok(inner)
        })
        .await?;
        Ok(DiskStore {
            inner: Arc::new(inner),
        })
    }

    /// Sets whether fsynced shard files keep their pages in the page cache
    /// (default false: dropped once durable; see the module docs). Applies
    /// to the fsyncs that follow.
    pub fn set_keep_written_pages(&self, keep: bool) {
        self.inner.keep_written_pages.store(keep, Ordering::Relaxed);
    }

    /// Path of the committed file of `key` (whether or not it exists); for
    /// tools and fault-injection tests.
    pub fn shard_path(&self, key: &ShardKey) -> PathBuf {
        self.inner.shard_path(key)
    }
}

impl Inner {
    fn dir(&self, fanout: usize) -> PathBuf {
        self.root.join(fanout_dir_name(fanout))
    }

    fn shard_path(&self, key: &ShardKey) -> PathBuf {
        self.dir(fanout_of(key.blob_id())).join(key.to_string())
    }

    fn lock(&self, fanout: usize) -> MutexGuard<'_, ()> {
        self.locks[fanout]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes the committed file of `key` (path computed, no scan).
    fn delete_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        let path = self.shard_path(key);
        let removed = self.remove_shard_file(fanout_of(key.blob_id()), &path)?;
        if removed && let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        Ok(removed)
    }

    /// Removes the shard file at `path` in directory `fanout` and accounts
    /// for it; `Ok(false)` when there is none. The directory is not synced.
    fn remove_shard_file(&self, fanout: usize, path: &Path) -> Result<bool, StoreError> {
        let _guard = self.lock(fanout);
        let len = match fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("stat", path)(e)),
        };
        let removed = remove_if_exists(path)?;
        if removed {
            self.account_delete(len);
        }
        Ok(removed)
    }

    /// Validates the header and length of `key`'s file without reading blocks.
    fn has_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        let path = self.shard_path(key);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("open", path)(e)),
        };
        let mut header = [0u8; HEADER_LEN as usize];
        match file.read_exact_at(&mut header, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(StoreError::io("read", path)(e)),
        }
        let Ok(block_size) = format::decode_header(&header) else {
            return Ok(false);
        };
        let len = file
            .metadata()
            .map_err(StoreError::io("stat", &path))?
            .len();
        Ok(Geometry::from_file_len(block_size, len).is_ok())
    }

    /// Renames `key`'s file into the quarantine directory unless it holds
    /// [`MAX_QUARANTINED_FILES`] already (then the file stays in place).
    fn quarantine(&self, key: &ShardKey) -> Result<Quarantine, StoreError> {
        if self.quarantined_files()? >= MAX_QUARANTINED_FILES {
            return Ok(Quarantine::Full);
        }
        let path = self.shard_path(key);
        let target = self.quarantine.join(format!(
            "{:020}-{key}",
            millis_since_epoch(SystemTime::now())
        ));
        {
            let _guard = self.lock(fanout_of(key.blob_id()));
            let len = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Quarantine::NotStored),
                Err(e) => return Err(StoreError::io("stat", path)(e)),
            };
            match fs::rename(&path, &target) {
                Ok(()) => self.account_delete(len),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Quarantine::NotStored),
                Err(e) => return Err(StoreError::io("rename", path)(e)),
            }
        }
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        sync_dir(&self.quarantine)?;
        Ok(Quarantine::Moved)
    }

    /// How many files the quarantine directory holds, counting at most
    /// [`MAX_QUARANTINED_FILES`].
    fn quarantined_files(&self) -> Result<usize, StoreError> {
        let dir = &self.quarantine;
        let mut n = 0;
        for entry in fs::read_dir(dir).map_err(StoreError::io("read directory", dir))? {
            entry.map_err(StoreError::io("read directory", dir))?;
            n += 1;
            if n >= MAX_QUARANTINED_FILES {
                break;
            }
        }
        Ok(n)
    }

    /// Removes temp files and counts committed shards.
    fn recover(&self) -> Result<(), StoreError> {
        let (mut shards, mut bytes, mut removed) = (0u64, 0u64, 0u64);
        for f in 0..FANOUT {
            let dir = self.dir(f);
            let mut dirty = false;
            for entry in fs::read_dir(&dir).map_err(StoreError::io("read directory", &dir))? {
                let entry = entry.map_err(StoreError::io("read directory", &dir))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.contains(TMP_MARKER) {
                    let path = entry.path();
                    remove_if_exists(&path)?;
                    dirty = true;
                    removed += 1;
                } else if parse_shard_name(name).is_some() {
                    let meta = entry
                        .metadata()
                        .map_err(StoreError::io("stat", entry.path()))?;
                    shards += 1;
                    bytes += meta.len();
                } else {
                    tracing::warn!(path = %entry.path().display(), "ignoring unexpected file in shard directory");
                }
            }
            if dirty {
                sync_dir(&dir)?;
            }
        }
        self.shards.store(shards, Ordering::Relaxed);
        self.stored_bytes.store(bytes, Ordering::Relaxed);
        if removed > 0 {
            tracing::info!(removed, root = %self.root.display(), "removed temp files of interrupted shard writes");
        }
        Ok(())
    }

    /// After an fsync of a shard file: drops its pages from the page cache
    /// unless written pages are kept: the full pages of the first
    /// `synced_len` bytes or, with `None`, all of them. Advice only: an
    /// error is logged, not returned (the data is durable either way).
    fn written_pages_synced(&self, file: &File, path: &Path, synced_len: Option<u64>) {
        if self.keep_written_pages.load(Ordering::Relaxed) {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            // The kernel drops the page a range ends inside when the range
            // ends at the end of the file, so the range stops at the last
            // full page instead.
            let len = match synced_len {
                Some(len) => {
                    let full_pages = len - len % rustix::param::page_size() as u64;
                    match std::num::NonZeroU64::new(full_pages) {
                        Some(len) => Some(len),
                        None => return,
                    }
                }
                None => None,
            };
            if let Err(e) = rustix::fs::fadvise(file, 0, len, rustix::fs::Advice::DontNeed) {
                tracing::debug!(path = %path.display(), error = %e, "posix_fadvise(DONTNEED) failed");
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (file, path, synced_len);
    }

    /// Accounts for a shard file of `new_len` bytes replacing one of
    /// `old_len` bytes (`None`: there was none).
    fn account_put(&self, old_len: Option<u64>, new_len: u64) {
        match old_len {
            Some(old) => {
                self.stored_bytes.fetch_sub(old, Ordering::Relaxed);
            }
            None => {
                self.shards.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stored_bytes.fetch_add(new_len, Ordering::Relaxed);
    }

    fn account_delete(&self, len: u64) {
        self.shards.fetch_sub(1, Ordering::Relaxed);
        self.stored_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Deletes every shard of `blob_ids` (validated, deduplicated) by
    /// probing each possible shard path: `<blob_id>.<i>` for `i` in
    /// `0..MAX_SHARDS_PER_BLOB`, under the directory's lock, then syncs each
    /// directory that lost a file.
    ///
    /// Why probe: the request names blobs, not indexes, and must also
    /// remove a stale copy of an index heal moved elsewhere, which no
    /// caller knows about. A miss is one failed `stat` (a hashed lookup in
    /// ext4 and XFS directories), so a blob costs about 256 lookups
    /// whatever the directory holds, where reading the directory costs all
    /// of its entries (~40 k in a 10 M-shard store) per request.
    fn delete_blobs(&self, blob_ids: BTreeSet<String>) -> Result<u64, StoreError> {
        let mut deleted = 0;
        let mut dirty = BTreeSet::new();
        for blob_id in &blob_ids {
            let fanout = fanout_of(blob_id);
            let dir = self.dir(fanout);
            for index in 0..MAX_SHARDS_PER_BLOB {
                if self.remove_shard_file(fanout, &dir.join(format!("{blob_id}.{index}")))? {
                    deleted += 1;
                    dirty.insert(fanout);
                }
            }
        }
        for fanout in dirty {
            sync_dir(&self.dir(fanout))?;
        }
        Ok(deleted)
    }

    /// Shard names (temp files and strangers skipped) of directory
    /// `fanout`, sorted by `(blob_id, shard_index)`. Holds the whole
    /// directory: about `shards / 256` names.
    fn read_names(&self, fanout: usize) -> Result<Vec<(String, u32)>, StoreError> {
        let dir = self.dir(fanout);
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(StoreError::io("read directory", &dir))? {
            let entry = entry.map_err(StoreError::io("read directory", &dir))?;
            let name = entry.file_name();
            if let Some((blob_id, shard_index)) = name.to_str().and_then(parse_shard_name) {
                names.push((blob_id.to_string(), shard_index));
            }
        }
        names.sort_unstable();
        Ok(names)
    }

    /// The kept place of the walk that continues with cursor `after`.
    fn take_walk(&self, after: &str) -> Option<WalkPlace> {
        if after.is_empty() {
            return None;
        }
        let mut walks = self.walks.lock().unwrap_or_else(PoisonError::into_inner);
        let i = walks.iter().position(|w| w.after == after)?;
        walks.remove(i)
    }

    /// Keeps `place` for the next page of its walk, dropping the oldest
    /// kept walk beyond [`LIST_WALKS_KEPT`].
    fn keep_walk(&self, place: WalkPlace) {
        let mut walks = self.walks.lock().unwrap_or_else(PoisonError::into_inner);
        walks.push_back(place);
        while walks.len() > LIST_WALKS_KEPT {
            walks.pop_front();
        }
    }

    /// One page in store order (see the module docs): continues a kept
    /// walk, or reads the cursor's directory and resumes after the cursor;
    /// then goes on directory by directory until `limit` blobs are served
    /// and one more shard name is seen (`is_truncated`), or the last
    /// directory ends. Each served shard is stat'ed (a shard deleted since
    /// its directory was read is skipped).
    fn list(&self, after: &str, limit: usize) -> Result<ShardPage, StoreError> {
        let limit = limit.max(1);
        let mut place = match self.take_walk(after) {
            Some(place) => place,
            None => {
                let (fanout, _) = list_position(after);
                let names = self.read_names(fanout)?;
                let next = names.partition_point(|(blob_id, _)| blob_id.as_str() <= after);
                WalkPlace {
                    after: String::new(),
                    fanout,
                    names,
                    next,
                }
            }
        };
        let mut page = ShardPage::default();
        let mut blobs = 0;
        loop {
            let Some((blob_id, shard_index)) = place.names.get(place.next) else {
                if place.fanout + 1 == FANOUT {
                    return Ok(page);
                }
                place.fanout += 1;
                place.names = self.read_names(place.fanout)?;
                place.next = 0;
                continue;
            };
            let last = page.shards.last().map(|e| e.key.blob_id());
            let new_blob = last != Some(blob_id.as_str());
            if new_blob && blobs == limit {
                page.is_truncated = true;
                place.after = last.unwrap_or_default().to_string();
                self.keep_walk(place);
                return Ok(page);
            }
            let key = ShardKey {
                blob_id: blob_id.clone(),
                shard_index: *shard_index,
            };
            place.next += 1;
            let path = self.dir(place.fanout).join(key.to_string());
            let meta = match fs::metadata(&path) {
                Ok(m) => m,
                // Deleted since the directory was read.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io("stat", path)(e)),
            };
            if new_blob {
                blobs += 1;
            }
            page.shards.push(ShardEntry {
                key,
                stored_bytes: meta.len(),
                modified_ms: meta.modified().map(millis_since_epoch).unwrap_or_default(),
            });
        }
    }
}

impl ShardStore for DiskStore {
    type Writer = DiskWriter;
    type Reader = DiskReader;

    async fn create(&self, key: &ShardKey, block_size: u32) -> Result<DiskWriter, StoreError> {
        let rule = BlockRule::new(block_size)?;
        let final_path = self.inner.shard_path(key);
        let tmp = final_path.with_file_name(format!(
            "{key}{TMP_MARKER}{}",
            uuid::Uuid::new_v4().simple()
        ));
        // No I/O yet: the temp file is created by the writer's first trip
        // to the blocking pool (see `DiskWriter`).
        Ok(DiskWriter {
            inner: Arc::clone(&self.inner),
            key: key.clone(),
            tmp,
            final_path,
            file: None,
            held: None,
            block_size,
            rule,
            state: WriterState::Open,
            abandoned: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn open(
        &self,
        key: &ShardKey,
        first_block: u64,
        block_count: u64,
    ) -> Result<DiskReader, StoreError> {
        let path = self.inner.shard_path(key);
        // A shard whose inode and first block are cached is opened on this
        // thread: no trip to the blocking pool and back.
        if cached_reads_enabled() {
            let opened = open_reader(
                path.clone(),
                key.clone(),
                first_block,
                block_count,
                Io::Cached,
            );
            if let Some(opened) = ReadFail::settled(opened) {
                return opened;
            }
        }
        let key = key.clone();
        blocking(move || {
            open_reader(path.clone(), key, first_block, block_count, Io::Blocking)
                .map_err(|e| e.into_store("read", &path))
        })
        .await
    }

    async fn delete_blobs(&self, blob_ids: &[String]) -> Result<u64, StoreError> {
        let mut wanted = BTreeSet::new();
        for id in blob_ids {
            validate_blob_id(id)?;
            wanted.insert(id.clone());
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.delete_blobs(wanted)).await
    }

    async fn delete_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        let (inner, key) = (Arc::clone(&self.inner), key.clone());
        blocking(move || inner.delete_shard(&key)).await
    }

    async fn has_shard(&self, key: &ShardKey) -> Result<bool, StoreError> {
        let (inner, key) = (Arc::clone(&self.inner), key.clone());
        blocking(move || inner.has_shard(&key)).await
    }

    async fn quarantine(&self, key: &ShardKey) -> Result<Quarantine, StoreError> {
        let (inner, key) = (Arc::clone(&self.inner), key.clone());
        blocking(move || inner.quarantine(&key)).await
    }

    async fn list(&self, after_blob_id: &str, limit: usize) -> Result<ShardPage, StoreError> {
        let inner = Arc::clone(&self.inner);
        let after = after_blob_id.to_string();
        blocking(move || inner.list(&after, limit)).await
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            shards: self.inner.shards.load(Ordering::Relaxed),
            stored_bytes: self.inner.stored_bytes.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriterState {
    Open,
    /// A write failed or was cancelled midway; the file content is unknown.
    Failed,
    /// Renamed into place; nothing to clean up.
    Committed,
}

/// A shard being written to its temp file; dropping it removes the file,
/// also when a trip to the blocking pool that the caller gave up on
/// creates it afterwards, and such a trip's commit never renames it into
/// place (`abandoned`).
///
/// Each trip to the blocking pool costs two thread switches and a wake-up,
/// which on a 1 MiB PutObject (six single-block shards) were a large part
/// of the datanode's CPU. So the writer makes as few as it can: creating
/// the temp file (and its header) waits for the first write that reaches
/// the disk, and the first block is held in memory until a second block, a
/// [`sync`](ShardWriter::sync) or the [`commit`](ShardWriter::commit)
/// comes. A single-block shard is then one trip (create, write, fsync,
/// rename, directory fsync); a longer one writes its first two blocks in
/// one trip and each later block in its own. The held block is part of
/// what the caller counts as received and not yet fsynced (the datanode's
/// write budget), as a block in a blocking write is. Errors of creating the
/// temp file (a missing directory, `EROFS`, `EDQUOT`) come from that first
/// trip, not from [`ShardStore::create`].
pub struct DiskWriter {
    inner: Arc<Inner>,
    key: ShardKey,
    tmp: PathBuf,
    final_path: PathBuf,
    /// The temp file, once a trip to the blocking pool has created it.
    file: Option<Arc<File>>,
    /// The first block, accepted and not yet written (only before `file`).
    held: Option<Block>,
    block_size: u32,
    rule: BlockRule,
    state: WriterState,
    /// Set by `Drop` (under the fan-out lock) when the shard is not
    /// committed; a trip still running checks it after creating the temp
    /// file and, under the same lock, before the commit's rename.
    abandoned: Arc<AtomicBool>,
}

impl DiskWriter {
    /// What a trip to the blocking pool starts from: the temp file (or
    /// what creates it) and the held block, taken out of the writer.
    fn take_pending(&mut self) -> Pending {
        Pending {
            file: self.file.clone(),
            held: self.held.take(),
            block_size: self.block_size,
            path: self.tmp.clone(),
            abandoned: Arc::clone(&self.abandoned),
        }
    }
}

/// The part of a writer's state a trip to the blocking pool takes along.
struct Pending {
    file: Option<Arc<File>>,
    held: Option<Block>,
    block_size: u32,
    path: PathBuf,
    abandoned: Arc<AtomicBool>,
}

impl Pending {
    /// On the blocking pool: creates the temp file with its header if it
    /// does not exist yet, then writes the held block and `next`, in one
    /// vectored write. Returns the file.
    fn write(self, next: Option<&Block>) -> Result<Arc<File>, StoreError> {
        // The writer was dropped while this trip waited in the pool's queue.
        if self.abandoned.load(Ordering::SeqCst) {
            return Err(dropped_writer("write", &self.path));
        }
        let (file, created) = match self.file {
            Some(file) => (file, false),
            None => {
                let file =
                    File::create_new(&self.path).map_err(StoreError::io("create", &self.path))?;
                // Dropped since the check above: its `Drop` may have found
                // no file to remove, so this trip removes it. (A drop after
                // this check finds the file.)
                if self.abandoned.load(Ordering::SeqCst) {
                    remove_temp_file(&self.path);
                    return Err(dropped_writer("create", &self.path));
                }
                (Arc::new(file), true)
            }
        };
        // The header of a created file, then each block and its CRC: at
        // most five slices, on the stack.
        let header = created.then(|| format::encode_header(self.block_size));
        let mut crcs = [[0u8; 4]; 2];
        for (crc, block) in crcs.iter_mut().zip(self.held.iter().chain(next)) {
            *crc = block.crc32c.to_le_bytes();
        }
        let mut bufs = [IoSlice::new(&[]); 5];
        let mut n = 0;
        if let Some(header) = &header {
            bufs[n] = IoSlice::new(header);
            n += 1;
        }
        for (block, crc) in self.held.iter().chain(next).zip(&crcs) {
            bufs[n] = IoSlice::new(&block.data);
            bufs[n + 1] = IoSlice::new(crc);
            n += 2;
        }
        if n > 0 {
            write_all_vectored(&file, &mut bufs[..n])
                .map_err(StoreError::io("write", &self.path))?;
        }
        Ok(file)
    }
}

impl ShardWriter for DiskWriter {
    async fn write_block(&mut self, block: Block) -> Result<(), StoreError> {
        if self.state != WriterState::Open {
            return Err(StoreError::WriterFailed(self.key.clone()));
        }
        self.rule.accept(block.data.len())?;
        if self.file.is_none() && self.held.is_none() {
            self.held = Some(block);
            return Ok(());
        }
        // Failed until the write is known to have completed (the future may
        // be dropped while the blocking write runs).
        self.state = WriterState::Failed;
        let pending = self.take_pending();
        let file = blocking(move || pending.write(Some(&block))).await?;
        self.file = Some(file);
        self.state = WriterState::Open;
        Ok(())
    }

    async fn sync(&mut self) -> Result<(), StoreError> {
        if self.state != WriterState::Open {
            return Err(StoreError::WriterFailed(self.key.clone()));
        }
        self.state = WriterState::Failed;
        let pending = self.take_pending();
        let inner = Arc::clone(&self.inner);
        let written = self.rule.committed();
        let synced_len = format::stored_len(written.payload_bytes, written.blocks);
        let file = blocking(move || {
            let path = pending.path.clone();
            let file = pending.write(None)?;
            let started = Instant::now();
            // Data and the length needed to read it back: fdatasync.
            file.sync_data().map_err(StoreError::io("fsync", &path))?;
            metrics::record_partial_fsync(&inner.node_label, started.elapsed());
            inner.written_pages_synced(&file, &path, Some(synced_len));
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        self.state = WriterState::Open;
        Ok(())
    }

    async fn commit(mut self) -> Result<Committed, StoreError> {
        if self.state != WriterState::Open {
            return Err(StoreError::WriterFailed(self.key.clone()));
        }
        self.state = WriterState::Failed;
        let committed = self.rule.committed();
        let new_len = format::stored_len(committed.payload_bytes, committed.blocks);
        let pending = self.take_pending();
        let abandoned = Arc::clone(&pending.abandoned);
        let inner = Arc::clone(&self.inner);
        let (tmp, final_path) = (self.tmp.clone(), self.final_path.clone());
        let fanout = fanout_of(self.key.blob_id());
        blocking(move || {
            let file = pending.write(None)?;
            let started = Instant::now();
            file.sync_all().map_err(StoreError::io("fsync", &tmp))?;
            {
                let _guard = inner.lock(fanout);
                if abandoned.load(Ordering::SeqCst) {
                    // The caller gave up: never rename. (Defence in depth:
                    // `Drop` unlinks the temp file after setting the flag,
                    // so a rename after that fails anyway.)
                    return Err(dropped_writer("rename", &tmp));
                }
                let old_len = match fs::metadata(&final_path) {
                    Ok(m) => Some(m.len()),
                    Err(e) if e.kind() == ErrorKind::NotFound => None,
                    Err(e) => return Err(StoreError::io("stat", final_path)(e)),
                };
                fs::rename(&tmp, &final_path).map_err(StoreError::io("rename", &tmp))?;
                inner.account_put(old_len, new_len);
            }
            if let Some(dir) = final_path.parent() {
                sync_dir(dir)?;
            }
            metrics::record_fsync(&inner.node_label, started.elapsed());
            inner.written_pages_synced(&file, &final_path, None);
            Ok(())
        })
        .await?;
        self.state = WriterState::Committed;
        Ok(committed)
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        // `Failed`: a trip may still be running (its future was dropped),
        // or one failed; `Open`: none is, and the file exists only if one
        // created it.
        match self.state {
            WriterState::Committed => {}
            WriterState::Open if self.file.is_none() => {}
            WriterState::Open => remove_temp_file(&self.tmp),
            WriterState::Failed => {
                // Under the fan-out lock, so a commit trip still running
                // either renamed before this or sees the flag before its
                // rename.
                {
                    let _guard = self.inner.lock(fanout_of(self.key.blob_id()));
                    self.abandoned.store(true, Ordering::SeqCst);
                }
                // A trip still running keeps writing to its open handle (an
                // orphaned inode once this unlinks it), or creates the file
                // after this and removes it itself.
                remove_temp_file(&self.tmp);
            }
        }
    }
}

/// Reads a block range of one shard file, one block per call; the first
/// block is read by `open`, with the header.
pub struct DiskReader {
    key: ShardKey,
    path: PathBuf,
    file: Arc<File>,
    geometry: Geometry,
    next: u64,
    end: u64,
    /// The block read before `next`, not yet taken.
    ready: Option<Result<Block, StoreError>>,
}

impl ShardReader for DiskReader {
    async fn next_block(&mut self) -> Option<Result<Block, StoreError>> {
        if let Some(block) = self.ready.take() {
            return Some(block);
        }
        if self.next >= self.end {
            return None;
        }
        let index = self.next;
        self.next += 1;
        if cached_reads_enabled() {
            let read = read_block(
                &self.file,
                &self.key,
                &self.path,
                self.geometry,
                index,
                Io::Cached,
            );
            if let Some(read) = ReadFail::settled(read) {
                return Some(read);
            }
        }
        let (file, key, path, geometry) = (
            Arc::clone(&self.file),
            self.key.clone(),
            self.path.clone(),
            self.geometry,
        );
        Some(
            blocking(move || {
                read_block(&file, &key, &path, geometry, index, Io::Blocking)
                    .map_err(|e| e.into_store("read", &path))
            })
            .await,
        )
    }

    fn ready_block(&mut self) -> Option<Result<Block, StoreError>> {
        self.ready.take()
    }

    fn remaining(&self) -> u64 {
        self.end - self.next + u64::from(self.ready.is_some())
    }
}

/// How a read meets the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Io {
    /// May wait for the disk: runs on the blocking pool.
    Blocking,
    /// Only what the dentry and page caches hold (`openat2`'s
    /// `RESOLVE_CACHED`, Linux 5.12; `preadv2`'s `RWF_NOWAIT`, Linux 4.14):
    /// runs on an async worker and fails with [`ReadFail::WouldBlock`]
    /// where it would wait for a read from the disk or a lock (on a miss
    /// the kernel may still submit readahead before it answers `EAGAIN`,
    /// and an atime update can touch the journal unless the file system is
    /// mounted `noatime`, as in deploy/vm/README.md). Costs the worker what
    /// the blocking pool would have spent: a copy out of the page cache and
    /// the block's CRC check, short for one block.
    Cached,
}

/// Why a read did not return what it read.
#[derive(Debug)]
enum ReadFail {
    /// An [`Io::Cached`] read would have waited: retry it blocking.
    WouldBlock,
    Store(StoreError),
}

impl From<StoreError> for ReadFail {
    fn from(e: StoreError) -> Self {
        ReadFail::Store(e)
    }
}

impl ReadFail {
    /// A read's outcome, `None` if it would have waited.
    fn settled<T>(read: Result<T, ReadFail>) -> Option<Result<T, StoreError>> {
        match read {
            Ok(v) => Some(Ok(v)),
            Err(ReadFail::Store(e)) => Some(Err(e)),
            Err(ReadFail::WouldBlock) => None,
        }
    }

    /// The store error of a failed read (a blocking read never gets
    /// `WouldBlock`; were it to, it is an I/O error of `op` on `path`).
    fn into_store(self, op: &'static str, path: &Path) -> StoreError {
        match self {
            ReadFail::Store(e) => e,
            ReadFail::WouldBlock => StoreError::io(op, path)(ErrorKind::WouldBlock.into()),
        }
    }
}

/// Whether reads try the caches first ([`Io::Cached`]); off for good once
/// the kernel, a file system or a seccomp filter says it cannot (`ENOSYS`,
/// `EINVAL`, `EOPNOTSUPP`, `EPERM`), so an old kernel pays one failed
/// syscall, not one per read. (The process needs glibc 2.26 or later for
/// `preadv2`.)
static CACHED_READS: AtomicBool = AtomicBool::new(true);

fn cached_reads_enabled() -> bool {
    cfg!(target_os = "linux") && CACHED_READS.load(Ordering::Relaxed)
}

/// Maps an I/O error of `op` on `path` under `io`: every failure of a
/// cached read (would block, unsupported, or any other) becomes
/// [`ReadFail::WouldBlock`].
fn io_fail(io: Io, op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ReadFail {
    move |e| {
        if io == Io::Blocking {
            return ReadFail::Store(StoreError::io(op, path)(e));
        }
        use rustix::io::Errno;
        if let Some(Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP | Errno::PERM) =
            Errno::from_io_error(&e)
        {
            CACHED_READS.store(false, Ordering::Relaxed);
        }
        // Any failure of a cached read is retried blocking, which reports
        // the error that stands (an EIO again, say) or succeeds (a seccomp
        // filter that refuses `openat2` or `preadv2` with EPERM).
        ReadFail::WouldBlock
    }
}

/// Opens shard file `path` and reads its header and the range's first
/// block, under `io`.
fn open_reader(
    path: PathBuf,
    key: ShardKey,
    first_block: u64,
    block_count: u64,
    io: Io,
) -> Result<DiskReader, ReadFail> {
    let file = match open_file(&path, io) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(StoreError::NotFound(key).into()),
        Err(e) => return Err(io_fail(io, "open", &path)(e)),
    };
    let corrupt = |reason| StoreError::Corrupt {
        key: key.clone(),
        block: None,
        reason,
    };
    let header = read_span(&file, 0, HEADER_LEN, io).map_err(io_fail(io, "read", &path))?;
    let Ok(header) = <[u8; HEADER_LEN as usize]>::try_from(header.as_slice()) else {
        return Err(corrupt("shorter than its header").into());
    };
    let block_size = format::decode_header(&header).map_err(|e| match e {
        HeaderError::Corrupt(reason) => corrupt(reason),
        HeaderError::Format(source) => StoreError::ShardFormat {
            key: key.clone(),
            source,
        },
    })?;
    let len = file
        .metadata()
        .map_err(StoreError::io("stat", &path))?
        .len();
    let geometry = Geometry::from_file_len(block_size, len).map_err(corrupt)?;
    let (next, end) = resolve_range(&key, geometry.blocks, first_block, block_count)?;
    let mut reader = DiskReader {
        key,
        path,
        file: Arc::new(file),
        geometry,
        next,
        end,
        ready: None,
    };
    if next < end {
        let block = read_block(
            &reader.file,
            &reader.key,
            &reader.path,
            reader.geometry,
            next,
            io,
        );
        let Some(block) = ReadFail::settled(block) else {
            return Err(ReadFail::WouldBlock);
        };
        reader.ready = Some(block);
        reader.next += 1;
    }
    Ok(reader)
}

/// Opens `path` read-only; under [`Io::Cached`] only by a path walk the
/// dentry cache answers (`EAGAIN` otherwise).
fn open_file(path: &Path, io: Io) -> std::io::Result<File> {
    match io {
        Io::Blocking => File::open(path),
        #[cfg(target_os = "linux")]
        Io::Cached => {
            use rustix::fs::{Mode, OFlags, ResolveFlags};
            let fd = rustix::fs::openat2(
                rustix::fs::CWD,
                path,
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::CACHED,
            )?;
            Ok(File::from(fd))
        }
        #[cfg(not(target_os = "linux"))]
        Io::Cached => Err(ErrorKind::WouldBlock.into()),
    }
}

/// Reads block `index` of a shard file and checks its CRC, under `io`.
fn read_block(
    file: &File,
    key: &ShardKey,
    path: &Path,
    geometry: Geometry,
    index: u64,
    io: Io,
) -> Result<Block, ReadFail> {
    let (offset, len) = geometry.block_span(index);
    // `len` is at most MAX_BLOCK_SIZE + 4 (checked with the header).
    let stored = read_span(file, offset, len, io).map_err(io_fail(io, "read", path))?;
    if stored.len() as u64 != len {
        return Err(StoreError::Corrupt {
            key: key.clone(),
            block: Some(index),
            reason: "file truncated",
        }
        .into());
    }
    match format::verify_stored_block(stored) {
        Some((data, crc32c)) => Ok(Block {
            data: Bytes::from(data),
            crc32c,
        }),
        None => Err(StoreError::Corrupt {
            key: key.clone(),
            block: Some(index),
            reason: "block checksum mismatch",
        }
        .into()),
    }
}

/// Reads up to `len` bytes at `offset` (fewer only at the end of the file)
/// into a new buffer. Blocking, with `pread` into the vector's spare
/// capacity: the buffer is not zero-filled first, as `read_exact_at` into
/// a `vec![0; len]` needs (a memset of every block, visible in a GET's
/// server CPU), and the file's offset is not used, so a reader whose
/// read was cancelled cannot race the blocking read it left behind.
/// Cached, with `preadv2(RWF_NOWAIT)` into the spare capacity likewise
/// ([`preadv2_nowait`]): `EAGAIN` where a page is not cached.
fn read_span(file: &File, offset: u64, len: u64, io: Io) -> std::io::Result<Vec<u8>> {
    let len = len as usize;
    let mut stored = Vec::with_capacity(len);
    while stored.len() < len {
        let at = offset + stored.len() as u64;
        let read = match io {
            Io::Blocking => {
                rustix::io::pread(file, rustix::buffer::spare_capacity(&mut stored), at)
                    .map_err(std::io::Error::from)
            }
            #[cfg(target_os = "linux")]
            Io::Cached => preadv2_nowait(file, &mut stored, len, at),
            #[cfg(not(target_os = "linux"))]
            Io::Cached => Err(ErrorKind::WouldBlock.into()),
        };
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // A blocking read may fill more than `len` of the allocation; what lies
    // past it is the next block's.
    stored.truncate(len);
    Ok(stored)
}

/// `preadv2(RWF_NOWAIT)` of up to `len - buf.len()` bytes at `offset`,
/// appended to `buf` without zero-filling it first (rustix's `preadv2`
/// takes initialized slices only, and zeroing every block shows in a
/// GET's server CPU): the count read, `EAGAIN` where a page is not
/// cached.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn preadv2_nowait(
    file: &File,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let want = len - buf.len();
    let spare = &mut buf.spare_capacity_mut()[..want];
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    let offset = libc::off_t::try_from(offset).map_err(|_| ErrorKind::InvalidInput)?;
    // SAFETY: the one iovec covers `spare`, memory `buf` owns and nothing
    // else references while this runs; the kernel writes at most
    // `iov_len` bytes into it and returns how many, so the first `n` bytes
    // past `buf.len()` are initialized when `set_len` counts them.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    let n = usize::try_from(n).map_err(|_| std::io::Error::last_os_error())?;
    assert!(n <= iov.iov_len, "preadv2 read past its buffer");
    // SAFETY: see above; `n <= iov_len`.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Removes a temp shard file, logging a failure other than its absence.
fn remove_temp_file(path: &Path) {
    if let Err(e) = fs::remove_file(path)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "failed to remove temp shard file");
    }
}

/// The error of a trip that finds its writer dropped.
fn dropped_writer(op: &'static str, path: &Path) -> StoreError {
    StoreError::io(op, path)(std::io::Error::other("the shard writer was dropped"))
}

/// Runs blocking file I/O on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::ShuttingDown),
    }
}

fn write_all_vectored(mut file: &File, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match file.write_vectored(bufs) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("fsync directory", dir))
}

/// Removes `path`; `Ok(false)` if it was already gone.
fn remove_if_exists(path: &Path) -> Result<bool, StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::io("remove", path)(e)),
    }
}

fn fanout_dir_name(fanout: usize) -> String {
    format!("{fanout:02x}")
}

/// Parses `<blob_id>.<shard_index>` (a valid [`ShardKey`]); `None` for
/// temp files and strangers.
fn parse_shard_name(name: &str) -> Option<(&str, u32)> {
    if name.contains(TMP_MARKER) {
        return None;
    }
    let (blob_id, index) = name.rsplit_once('.')?;
    let shard_index: u32 = index.parse().ok()?;
    (validate_blob_id(blob_id).is_ok()
        && shard_index < MAX_SHARDS_PER_BLOB
        && shard_index.to_string() == index)
        .then_some((blob_id, shard_index))
}

fn millis_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_parse_strictly() {
        assert_eq!(parse_shard_name("abc-1_2.7"), Some(("abc-1_2", 7)));
        assert_eq!(parse_shard_name("abc.7.tmp-0f0f"), None);
        assert_eq!(parse_shard_name("abc.07"), None);
        assert_eq!(parse_shard_name("abc"), None);
        // Epoch blob ids carry a dot; the index is after the last one.
        assert_eq!(parse_shard_name("e7.00ff.1"), Some(("e7.00ff", 1)));
        assert_eq!(parse_shard_name("a..b.1"), None);
        assert_eq!(parse_shard_name(".1"), None);
        // Indexes past the erasure code's limit are not shards.
        assert_eq!(parse_shard_name("abc.255"), Some(("abc", 255)));
        assert_eq!(parse_shard_name("abc.256"), None);
    }

    /// Bytes of `path` in the page cache, from `fincore` (util-linux;
    /// Debian's util-linux-extra): mincore(2) of the whole file, whole pages.
    #[cfg(target_os = "linux")]
    fn resident_bytes(path: &Path) -> u64 {
        let out = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path)
            .output()
            .expect("run fincore (util-linux; Debian: util-linux-extra)");
        assert!(out.status.success(), "fincore {}: {out:?}", path.display());
        let text = String::from_utf8(out.stdout).expect("fincore prints UTF-8");
        text.trim().parse().expect("fincore prints a byte count")
    }

    fn block(len: usize, fill: u8) -> Block {
        let data = vec![fill; len];
        Block {
            crc32c: sluice_proto::shard::block_crc32c(&data),
            data: Bytes::from(data),
        }
    }

    /// Writes two 64 KiB blocks with a partial fsync between them (as a
    /// credited stream does); returns the committed file's path and the
    /// bytes cached right after the partial fsync.
    #[cfg(target_os = "linux")]
    async fn write_two_blocks(store: &DiskStore, blob: &str) -> (PathBuf, u64) {
        let key = ShardKey::new(blob, 0).expect("key");
        let mut writer = store.create(&key, 65536).await.expect("create");
        writer.write_block(block(65536, 1)).await.expect("write");
        writer.sync().await.expect("sync");
        let after_sync = resident_bytes(&writer.tmp);
        writer.write_block(block(65536, 2)).await.expect("write");
        writer.commit().await.expect("commit");
        (store.shard_path(&key), after_sync)
    }

    /// A temp dir on a file system with a page cache of its own: tmpfs
    /// pages are the file's only copy and are never dropped, so a tmpfs
    /// `/tmp` is replaced by the crate's directory.
    #[cfg(target_os = "linux")]
    fn disk_backed_temp_dir() -> tempfile::TempDir {
        const TMPFS_MAGIC: u64 = 0x0102_1994;
        let tmp = std::env::temp_dir();
        let on_tmpfs = rustix::fs::statfs(&tmp)
            .map(|s| s.f_type as u64 == TMPFS_MAGIC)
            .unwrap_or(false);
        if on_tmpfs {
            tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temp dir")
        } else {
            tempfile::tempdir().expect("temp dir")
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn fsynced_shards_leave_the_page_cache_unless_kept() {
        let dir = disk_backed_temp_dir();
        let store = DiskStore::open(dir.path(), 1).await.expect("open");
        let first_block_len = HEADER_LEN + 65536 + 4;
        let stored_len = HEADER_LEN + 2 * (65536 + 4);
        let page = rustix::param::page_size() as u64;

        store.set_keep_written_pages(true);
        let (kept, after_sync) = write_two_blocks(&store, "kept").await;
        assert!(after_sync >= first_block_len, "{after_sync} bytes cached");
        assert!(
            resident_bytes(&kept) >= stored_len,
            "kept pages were dropped"
        );

        store.set_keep_written_pages(false);
        let (dropped, after_sync) = write_two_blocks(&store, "dropped").await;
        // The partial fsync keeps only the page the written bytes end in,
        // which the next block's write fills further.
        assert_eq!(after_sync, page, "the partial fsync's pages");
        assert_eq!(resident_bytes(&dropped), 0, "the commit left pages cached");

        // Dropped pages are read back from the disk, intact.
        let key = ShardKey::new("dropped", 0).expect("key");
        let mut reader = store.open(&key, 0, 2).await.expect("open");
        for fill in [1u8, 2] {
            let b = reader.next_block().await.expect("a block").expect("intact");
            assert_eq!(b.data, Bytes::from(vec![fill; 65536]));
        }
        assert!(reader.next_block().await.is_none());
    }

    /// A read from the caches ([`Io::Cached`]) gets what a blocking read
    /// gets, and only from pages the page cache holds: a shard whose pages
    /// were dropped at its commit is `WouldBlock` (the reader then reads it
    /// on the blocking pool, which caches it), a changed byte is still
    /// `Corrupt`, a missing shard still `NotFound`.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_cached_read_serves_only_cached_pages_and_checks_them() {
        let dir = disk_backed_temp_dir();
        let store = DiskStore::open(dir.path(), 1).await.expect("open");
        let (path, _) = write_two_blocks(&store, "cached").await;
        let key = ShardKey::new("cached", 0).expect("key");
        assert_eq!(resident_bytes(&path), 0, "the commit left pages cached");
        let cached =
            |first, count| open_reader(path.clone(), key.clone(), first, count, Io::Cached);
        assert!(
            matches!(cached(0, 2), Err(ReadFail::WouldBlock)),
            "a cached open of dropped pages waits for nothing"
        );
        assert!(
            CACHED_READS.load(Ordering::Relaxed),
            "this kernel and file system support cached reads"
        );

        // The store's reader falls back to the blocking pool, which caches
        // the pages; the cached path then serves them, identical.
        assert_eq!(
            read_all(&store, &key).await,
            [vec![1u8; 65536], vec![2u8; 65536]].map(Bytes::from)
        );
        let stored_len = HEADER_LEN + 2 * (65536 + 4);
        assert!(
            resident_bytes(&path) >= stored_len,
            "the blocking read cached the file"
        );
        let mut reader = cached(0, 2).expect("served from the page cache");
        assert_eq!(reader.remaining(), 2);
        let first = reader
            .ready_block()
            .expect("the first block")
            .expect("intact");
        assert_eq!(first.data, Bytes::from(vec![1u8; 65536]));
        let second = read_block(&reader.file, &key, &path, reader.geometry, 1, Io::Cached)
            .expect("the second block from the page cache");
        assert_eq!(second.data, Bytes::from(vec![2u8; 65536]));
        assert_eq!(second.crc32c, block(65536, 2).crc32c);
        let mut reader = cached(1, 1).expect("a range's first block");
        let only = reader.ready_block().expect("the block").expect("intact");
        assert_eq!(only.data, Bytes::from(vec![2u8; 65536]));

        // The second block's pages dropped (those wholly inside it): the
        // reader opens from the cache and reads that block blocking.
        let page = rustix::param::page_size() as u64;
        let second_at = HEADER_LEN + 65536 + 4;
        let file = File::open(&path).expect("open");
        rustix::fs::fadvise(
            &file,
            second_at.next_multiple_of(page),
            None,
            rustix::fs::Advice::DontNeed,
        )
        .expect("fadvise");
        let reader = cached(0, 2).expect("the first block is cached");
        assert!(matches!(
            read_block(&reader.file, &key, &path, reader.geometry, 1, Io::Cached),
            Err(ReadFail::WouldBlock)
        ));
        let mut reader = store.open(&key, 0, 2).await.expect("open");
        for fill in [1u8, 2] {
            let b = reader.next_block().await.expect("a block").expect("intact");
            assert_eq!(b.data, Bytes::from(vec![fill; 65536]));
        }
        assert!(reader.next_block().await.is_none());

        // A byte changed in the page cache (a write through it) is refused.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open for write");
        file.write_all_at(&[0xff], HEADER_LEN + 65536 + 4 + 10)
            .expect("flip");
        drop(file);
        let mut reader = cached(0, 2).expect("the first block is intact");
        assert!(reader.ready_block().expect("first").is_ok());
        match read_block(&reader.file, &key, &path, reader.geometry, 1, Io::Cached) {
            Err(ReadFail::Store(StoreError::Corrupt { block: Some(1), .. })) => {}
            other => panic!("a changed byte read from the cache: {other:?}"),
        }

        // A missing shard: the blocking open caches its negative dentry.
        let missing = ShardKey::new("missing", 0).expect("key");
        let missing_path = store.shard_path(&missing);
        assert!(matches!(
            store.open(&missing, 0, 0).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            open_reader(missing_path, missing, 0, 0, Io::Cached),
            Err(ReadFail::Store(StoreError::NotFound(_)))
        ));

        // A shard shorter than its header is Corrupt from the cache too.
        let short = ShardKey::new("short", 0).expect("key");
        let short_path = store.shard_path(&short);
        fs::write(&short_path, b"abc").expect("write");
        assert!(matches!(
            open_reader(short_path, short, 0, 0, Io::Cached),
            Err(ReadFail::Store(StoreError::Corrupt { block: None, .. }))
        ));
        assert!(
            CACHED_READS.load(Ordering::Relaxed),
            "no failure turned cached reads off"
        );
    }

    async fn temp_store() -> (tempfile::TempDir, DiskStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = DiskStore::open(dir.path(), 1).await.expect("open");
        (dir, store)
    }

    async fn read_all(store: &DiskStore, key: &ShardKey) -> Vec<Bytes> {
        let mut reader = store.open(key, 0, 0).await.expect("open");
        let mut out = Vec::new();
        while let Some(b) = reader.next_block().await {
            out.push(b.expect("intact").data);
        }
        out
    }

    #[tokio::test]
    async fn a_single_block_shard_reaches_the_disk_at_its_commit() {
        let (_dir, store) = temp_store().await;
        let key = ShardKey::new("single", 2).expect("key");
        let mut writer = store.create(&key, 65536).await.expect("create");
        assert!(!writer.tmp.exists(), "create touches no disk");
        writer.write_block(block(1000, 7)).await.expect("write");
        assert!(!writer.tmp.exists(), "the first block is held");
        let tmp = writer.tmp.clone();
        let committed = writer.commit().await.expect("commit");
        assert_eq!((committed.blocks, committed.payload_bytes), (1, 1000));
        assert!(!tmp.exists());
        let path = store.shard_path(&key);
        assert_eq!(
            fs::metadata(&path).expect("stat").len(),
            format::stored_len(1000, 1)
        );
        assert_eq!(read_all(&store, &key).await, [block(1000, 7).data]);
        assert_eq!(store.stats().shards, 1);
    }

    #[tokio::test]
    async fn sync_writes_the_held_block_before_it_returns() {
        let (_dir, store) = temp_store().await;
        let key = ShardKey::new("synced", 0).expect("key");
        let mut writer = store.create(&key, 4096).await.expect("create");
        writer.write_block(block(4096, 1)).await.expect("write");
        writer.sync().await.expect("sync");
        // What a credited stream reports as persisted is in the file.
        let stored = fs::read(&writer.tmp).expect("read temp file");
        assert_eq!(stored.len() as u64, format::stored_len(4096, 1));
        assert_eq!(&stored[HEADER_LEN as usize..][..4096], &[1u8; 4096][..]);
        writer.write_block(block(4096, 2)).await.expect("write");
        writer.write_block(block(10, 3)).await.expect("write");
        assert_eq!(
            fs::metadata(&writer.tmp).expect("stat").len(),
            format::stored_len(8192 + 10, 3)
        );
        writer.commit().await.expect("commit");
        assert_eq!(
            read_all(&store, &key).await,
            [block(4096, 1).data, block(4096, 2).data, block(10, 3).data]
        );
    }

    /// Faults around the held block: the stream cut after it (the writer
    /// dropped), and the disk under the shard's directory wiped before the
    /// trip that writes it (at the second block, and at the commit). The
    /// committed shard under the same key stays as it was each time.
    #[tokio::test]
    async fn a_held_block_that_never_reaches_the_disk_changes_nothing() {
        let (_dir, store) = temp_store().await;
        let key = ShardKey::new("kept", 0).expect("key");
        let mut writer = store.create(&key, 64).await.expect("create");
        writer.write_block(block(64, 9)).await.expect("write");
        writer.commit().await.expect("commit");
        let stats = store.stats();

        let mut cut = store.create(&key, 64).await.expect("create");
        cut.write_block(block(64, 1)).await.expect("write");
        drop(cut);
        assert_eq!(read_all(&store, &key).await, [block(64, 9).data]);

        // Another key in another fan-out directory, whose directory goes.
        let lost = ShardKey::new("lost", 0).expect("key");
        assert_ne!(fanout_of("lost"), fanout_of("kept"));
        let lost_dir = store.shard_path(&lost).parent().expect("dir").to_owned();
        let mut second = store.create(&lost, 64).await.expect("create");
        second.write_block(block(64, 1)).await.expect("write");
        let mut at_commit = store.create(&lost, 64).await.expect("create");
        at_commit.write_block(block(64, 1)).await.expect("write");
        fs::remove_dir_all(&lost_dir).expect("wipe the directory");
        assert!(matches!(
            second.write_block(block(64, 2)).await,
            Err(StoreError::Io { .. })
        ));
        assert!(matches!(
            second.commit().await,
            Err(StoreError::WriterFailed(_))
        ));
        assert!(matches!(
            at_commit.commit().await,
            Err(StoreError::Io { .. })
        ));
        assert!(matches!(
            store.open(&lost, 0, 0).await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.stats(), stats);
        assert_eq!(read_all(&store, &key).await, [block(64, 9).data]);
    }

    /// Temp files under the store's shard directories.
    fn temp_files(data_dir: &Path) -> usize {
        fs::read_dir(data_dir.join("shards"))
            .expect("shards dir")
            .flat_map(|d| fs::read_dir(d.expect("entry").path()).expect("fan-out dir"))
            .filter(|f| {
                let name = f.as_ref().expect("entry").file_name();
                name.to_string_lossy().contains(TMP_MARKER)
            })
            .count()
    }

    /// The caller gives up on a trip to the blocking pool before it runs
    /// (a PutShard stream reset, a shutdown): the trip that would create
    /// the temp file for a second block, for a partial fsync, or for the
    /// commit runs after the writer's `Drop`. Nothing may be left: no temp
    /// file, and no shard renamed into place outside the caller's locks.
    #[test]
    fn a_trip_that_runs_after_its_writer_is_dropped_leaves_nothing() {
        use futures::FutureExt as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = DiskStore::open(dir.path(), 1).await.expect("open");
            let stats = store.stats();
            for (i, ending) in ["second block", "sync", "commit"].into_iter().enumerate() {
                let key = ShardKey::new(format!("dropped-{i}"), 0).expect("key");
                let mut writer = store.create(&key, 64).await.expect("create");
                writer.write_block(block(64, 1)).await.expect("held");
                // The pool's one thread is busy, so the trip waits.
                let (release, wait) = std::sync::mpsc::channel::<()>();
                let busy = tokio::task::spawn_blocking(move || wait.recv());
                let polled_once = match ending {
                    "second block" => writer.write_block(block(64, 2)).now_or_never().is_some(),
                    "sync" => writer.sync().now_or_never().is_some(),
                    _ => {
                        let commit = writer.commit().now_or_never().is_some();
                        writer = store.create(&key, 64).await.expect("create");
                        commit
                    }
                };
                assert!(!polled_once, "{ending}: the trip is queued");
                drop(writer);
                release.send(()).expect("release");
                busy.await.expect("busy task").expect("released");
                // The queued trip has run once the next one has.
                tokio::task::spawn_blocking(|| ()).await.expect("drain");
                assert_eq!(temp_files(dir.path()), 0, "{ending}: a temp file was left");
                assert!(
                    matches!(store.open(&key, 0, 0).await, Err(StoreError::NotFound(_))),
                    "{ending}: a shard appeared"
                );
                assert_eq!(store.stats(), stats, "{ending}");
            }
        });
    }

    #[test]
    fn fanout_is_stable() {
        // CRC32C("abc") = 0x364B3FB7: a portable, release-stable placement.
        assert_eq!(fanout_of("abc"), 0xb7);
        assert_eq!(fanout_dir_name(fanout_of("abc")), "b7");
    }
}
