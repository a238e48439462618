//! Streamed snapshots: built from the store into a file while entries keep
//! being applied, sent in openraft's chunks, installed record by record.
//!
//! # File format
//! A snapshot file is a protobuf encoding of `raft.SnapshotBlob`, written
//! in pieces: first its `format` field (the tag byte `0x10` and the
//! varint [`SNAPSHOT_FORMAT`]), then one record at a time (field 1,
//! `repeated SnapshotRecord records`: the tag byte `0x0A`, a varint length
//! and a `SnapshotRecord`). openraft sends the file as it is, so a
//! receiver reads the version before any record: a file without it, or
//! of a version newer than this binary understands, is refused before the
//! store is touched ([`SnapshotError::Format`] names both versions).
//!
//! # A consistent view while applies continue
//! openraft asks for a builder between two applies, at applied index I.
//! From then until the file is written, every apply first saves the
//! *pre-image* of each data record it is about to change (the value at I,
//! or "absent") in [`Space::PreImages`], in the same atomic batch as the
//! change and only for the first change of that record. The builder walks
//! each data space in key order and writes a record only when it has no
//! pre-image (so it was unchanged at the moment the builder looked; a
//! batch and the pre-image it carries are applied atomically, so a record
//! read before a change is still its value at I); afterwards it writes
//! every saved pre-image that holds a value. Every record present at I is
//! written exactly once, unless it changed first after the walk passed it,
//! when its (identical) value at I is written twice, which installing
//! tolerates. This is the copy-on-write idea of a storage snapshot, with
//! the copies in the store rather than memory, so memory stays flat.
//!
//! # Installing
//! A received snapshot is kept as a file and read through once: a file
//! that does not decode (a torn or mixed transfer) fails the install
//! before anything changes. Then it becomes the current snapshot and an
//! `installing` marker is set, in one batch, the data spaces are cleared
//! and loaded in batches of at most [`LOAD_BATCH_BYTES`] and
//! [`LOAD_BATCH_RECORDS`], and one last batch writes the applied id and
//! membership and removes the marker. A crash in between leaves the
//! marker, and [`super::StateMachine::open`] repeats the load from the file
//! before Raft starts. Meta nodes answer reads only as leader, and a node
//! that installs a snapshot is not the leader, so no client sees the half
//! loaded state.
//!
//! # Memory and disk
//! Building holds one scan of [`SCAN_ROWS`] records and a
//! [`FILE_BUFFER_BYTES`] write buffer; installing holds a
//! [`FILE_BUFFER_BYTES`] read buffer and a batch of at most
//! [`LOAD_BATCH_RECORDS`] records and about [`LOAD_BATCH_BYTES`] (plus one
//! record of at most [`MAX_RECORD_BYTES`]), and sled's node copies of one
//! batch;
//! clearing a space reads 64 rows at a time; openraft sends and receives
//! `snapshot_max_chunk_size` bytes at a time. While a build runs, an
//! apply's batch also carries the old value of each record it changes for
//! the first time (a delete of a record with a 64 KiB inline body carries
//! that body). Pre-images live in sled, counted in its cache like any
//! record, and are deleted when the build ends. On disk: one `.snap`, one
//! `.tmp` while a build writes, and at most two `.part` files of
//! transfers openraft abandoned (removed at the next start).

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::ops::Bound;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use sluice_proto::format::{self, FormatError, SNAPSHOT_FORMAT};
use sluice_proto::raft as rpb;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::store::format::FORMAT_KEY;
use crate::store::{Batch, KvError, KvStore, Op, Space, prefix_end};

/// Records read per store scan while building (the build's record buffer).
pub const SCAN_ROWS: usize = 32;
/// Bytes of keys and values per batch while installing.
pub const LOAD_BATCH_BYTES: usize = 4 << 20;
/// Records per batch while installing. sled 0.34 copies a tree node for
/// every insert and frees the old copies only when the batch that made
/// them ends (epoch-based reclamation), so a batch's garbage grows with
/// its record count times the node size: 4 MiB batches of ~100-byte
/// records (~40,000 each) took a new voter's RSS to many times the
/// snapshot's size (heaptrack: sled's `Node::set_leaf` and `parent_split`
/// under `apply_batch`).
pub const LOAD_BATCH_RECORDS: usize = 256;
/// The largest record a snapshot file may hold (a corrupt length beyond it
/// is refused instead of allocated).
pub const MAX_RECORD_BYTES: u64 = 64 << 20;
/// The buffer of a snapshot file being written or read.
pub const FILE_BUFFER_BYTES: usize = 256 << 10;
/// Keys deleted per batch when a space is cleared.
const CLEAR_CHUNK: usize = 64;
/// Receiving files kept at once (openraft receives one snapshot at a time;
/// one more covers a restarted transfer).
const MAX_RECEIVING: usize = 2;
/// The tag of `SnapshotBlob.records` (field 1, length-delimited).
const RECORD_TAG: u8 = 0x0A;
/// The tag of `SnapshotBlob.format` (field 2, varint): the file's first
/// bytes.
const FORMAT_TAG: u8 = 0x10;

/// Why a snapshot could not be written, read or installed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    #[error("store: {0}")]
    Kv(#[from] KvError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("snapshot record: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("snapshot record in unknown keyspace {0}")]
    UnknownSpace(u32),
    #[error("snapshot file has field tag {0:#x}, expected records (0x0a)")]
    BadTag(u8),
    #[error("snapshot record of {0} bytes exceeds the {MAX_RECORD_BYTES}-byte limit")]
    RecordTooLarge(u64),
    #[error("snapshot file ends inside a record")]
    Truncated,
    #[error("malformed varint in snapshot file")]
    BadVarint,
    #[error("pre-image row is malformed")]
    BadPreImage,
    #[error("stored snapshot has no meta")]
    NoMeta,
    #[error("a snapshot install was interrupted but no snapshot file is recorded")]
    NoFile,
    #[error(
        "snapshot of cluster version {version} needs a newer sluice (this binary understands replicated format {format}): upgrade this node"
    )]
    NeedsNewer { version: u32, format: u32 },
}

/// The store key of a pre-image: generation (u64 BE), space byte, key.
fn pre_image_key(generation: u64, space: Space, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&generation.to_be_bytes());
    k.push(space.id());
    k.extend_from_slice(key);
    k
}

/// Adds to `batch` the pre-image of every data record it changes that has
/// none yet in `generation`, so the batch and its pre-images apply
/// atomically. Reads the store (the values the batch replaces).
pub(crate) fn capture_pre_images<K: KvStore>(
    kv: &K,
    generation: u64,
    batch: &mut Batch,
) -> Result<(), KvError> {
    let mut seen = HashSet::new();
    let mut images = Batch::new();
    for op in &batch.ops {
        let (Op::Put(space, key, _) | Op::Delete(space, key)) = op;
        if !Space::DATA.contains(space) {
            continue;
        }
        let image_key = pre_image_key(generation, *space, key);
        if !seen.insert(image_key.clone()) || kv.get(Space::PreImages, &image_key)?.is_some() {
            continue;
        }
        let value = match kv.get(*space, key)? {
            Some(old) => [&[1u8][..], &old].concat(),
            None => vec![0],
        };
        images.put(Space::PreImages, image_key, value);
    }
    if !images.is_empty() {
        images.extend(std::mem::take(batch));
        *batch = images;
    }
    Ok(())
}

/// Deletes every key of `space` in `[start, end)`, in chunks.
fn clear_range<K: KvStore>(
    kv: &K,
    space: Space,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
) -> Result<u64, KvError> {
    let mut cleared = 0;
    loop {
        let rows = kv.scan(space, start, end, CLEAR_CHUNK)?;
        if rows.is_empty() {
            return Ok(cleared);
        }
        let mut b = Batch::new();
        for (k, _) in rows {
            b.delete(space, k);
            cleared += 1;
        }
        kv.apply(b)?;
    }
}

/// Deletes the pre-images of `generation`, or of every generation.
pub(crate) fn clear_pre_images<K: KvStore>(
    kv: &K,
    generation: Option<u64>,
) -> Result<u64, KvError> {
    match generation {
        None => clear_range(kv, Space::PreImages, Bound::Unbounded, Bound::Unbounded),
        Some(g) => {
            let prefix = g.to_be_bytes();
            let end = prefix_end(&prefix);
            let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            clear_range(kv, Space::PreImages, Bound::Included(&prefix), end)
        }
    }
}

/// Writes `SnapshotBlob` records one at a time.
struct RecordWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    records: u64,
    bytes: u64,
}

impl<W: Write> RecordWriter<W> {
    /// A writer that has written the file's format version to `out`.
    fn new(mut out: W) -> std::io::Result<Self> {
        let mut header = vec![FORMAT_TAG];
        prost::encoding::encode_varint(u64::from(SNAPSHOT_FORMAT), &mut header);
        out.write_all(&header)?;
        Ok(RecordWriter {
            out,
            buf: Vec::new(),
            records: 0,
            bytes: header.len() as u64,
        })
    }

    fn write(&mut self, space: Space, key: Vec<u8>, value: Vec<u8>) -> std::io::Result<()> {
        let record = rpb::SnapshotRecord {
            space: u32::from(space.id()),
            key,
            value,
        };
        self.buf.clear();
        self.buf.push(RECORD_TAG);
        record
            .encode_length_delimited(&mut self.buf)
            .map_err(std::io::Error::other)?;
        self.out.write_all(&self.buf)?;
        self.records += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }
}

/// Reads the records of a snapshot file (or blob) in order.
pub(crate) struct RecordReader<R: BufRead> {
    input: R,
    buf: Vec<u8>,
}

impl<R: BufRead> RecordReader<R> {
    /// A reader of `input` that has read and checked the file's format
    /// version.
    ///
    /// Errors: [`SnapshotError::Format`] when the file does not start with
    /// a format version, or with one newer than [`SNAPSHOT_FORMAT`].
    pub(crate) fn new(input: R) -> Result<Self, SnapshotError> {
        let mut reader = RecordReader {
            input,
            buf: Vec::new(),
        };
        let mut tag = [0u8];
        let found = match reader.input.read_exact(&mut tag) {
            Ok(()) if tag[0] == FORMAT_TAG => {
                u32::try_from(reader.read_varint()?).unwrap_or(u32::MAX)
            }
            Ok(()) => 0,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e.into()),
        };
        format::check("snapshot", found, SNAPSHOT_FORMAT)?;
        Ok(reader)
    }

    /// The next record, or `None` at the end of the input.
    pub(crate) fn next_record(&mut self) -> Result<Option<rpb::SnapshotRecord>, SnapshotError> {
        let mut tag = [0u8];
        match self.input.read_exact(&mut tag) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        if tag[0] != RECORD_TAG {
            return Err(SnapshotError::BadTag(tag[0]));
        }
        let len = self.read_varint()?;
        if len > MAX_RECORD_BYTES {
            return Err(SnapshotError::RecordTooLarge(len));
        }
        self.buf.resize(len as usize, 0);
        self.input.read_exact(&mut self.buf).map_err(truncated)?;
        Ok(Some(rpb::SnapshotRecord::decode(self.buf.as_slice())?))
    }

    fn read_varint(&mut self) -> Result<u64, SnapshotError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let mut byte = [0u8];
            self.input.read_exact(&mut byte).map_err(truncated)?;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(SnapshotError::BadVarint)
    }
}

fn truncated(e: std::io::Error) -> SnapshotError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        SnapshotError::Truncated
    } else {
        SnapshotError::Io(e)
    }
}

/// What writing a snapshot file produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Records written (a record changed after the walk passed it counts twice).
    pub records: u64,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Writes the snapshot of the state at the start of `generation` to `path`
/// (created, fsynced). Runs while entries are applied; see the module docs.
pub(crate) fn write_file<K: KvStore>(
    kv: &K,
    generation: u64,
    path: &Path,
) -> Result<Written, SnapshotError> {
    let file = File::create(path)?;
    let mut w = RecordWriter::new(BufWriter::with_capacity(FILE_BUFFER_BYTES, file))?;
    for space in Space::DATA {
        let mut from: Option<Vec<u8>> = None;
        loop {
            let start = from.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let rows = kv.scan(space, start, Bound::Unbounded, SCAN_ROWS)?;
            let full = rows.len() == SCAN_ROWS;
            from = rows.last().map(|(k, _)| k.clone());
            for (key, value) in rows {
                let image = pre_image_key(generation, space, &key);
                if kv.get(Space::PreImages, &image)?.is_none() {
                    w.write(space, key, value)?;
                }
            }
            if !full {
                break;
            }
        }
    }
    // The records changed since the start, as they were then.
    let prefix = generation.to_be_bytes();
    let end = prefix_end(&prefix);
    let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
    let mut from: Option<Vec<u8>> = None;
    loop {
        let start = from
            .as_deref()
            .map_or(Bound::Included(&prefix[..]), Bound::Excluded);
        let rows = kv.scan(Space::PreImages, start, end, SCAN_ROWS)?;
        let full = rows.len() == SCAN_ROWS;
        from = rows.last().map(|(k, _)| k.clone());
        for (image_key, image) in rows {
            let (space, key) = image_key
                .get(8)
                .and_then(|id| Space::from_id(*id))
                .map(|s| (s, image_key[9..].to_vec()))
                .ok_or(SnapshotError::BadPreImage)?;
            match image.split_first() {
                Some((1, old)) => w.write(space, key, old.to_vec())?,
                Some((0, [])) => {}
                _ => return Err(SnapshotError::BadPreImage),
            }
        }
        if !full {
            break;
        }
    }
    let (records, bytes) = (w.records, w.bytes);
    let file = w.out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(Written { records, bytes })
}

/// The data space a snapshot record names; any other space is refused.
fn data_space(id: u32) -> Result<Space, SnapshotError> {
    u8::try_from(id)
        .ok()
        .and_then(Space::from_id)
        .filter(|s| Space::DATA.contains(s))
        .ok_or(SnapshotError::UnknownSpace(id))
}

/// Reads every record of the snapshot file at `path` and checks it: each
/// decodes, each is of a data space, the file ends on a record boundary,
/// and its cluster version is one a binary of replicated format `format`
/// understands (a snapshot of a cluster finalized past it may hold what
/// this binary cannot read). Returns the number of records. Holds one
/// record at a time.
pub(crate) fn check_file(path: &Path, format: u32) -> Result<u64, SnapshotError> {
    let input = BufReader::with_capacity(FILE_BUFFER_BYTES, File::open(path)?);
    let mut reader = RecordReader::new(input)?;
    let mut records = 0;
    while let Some(rec) = reader.next_record()? {
        let space = data_space(rec.space)?;
        if space == Space::Cluster
            && rec.key == crate::sm::cluster_version::KEY
            && let Ok(bytes) = <[u8; 4]>::try_from(rec.value.as_slice())
            && u32::from_be_bytes(bytes) > format
        {
            return Err(SnapshotError::NeedsNewer {
                version: u32::from_be_bytes(bytes),
                format,
            });
        }
        records += 1;
    }
    Ok(records)
}

/// What installing a snapshot file did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Records loaded.
    pub records: u64,
}

/// Replaces the data spaces with the records of the snapshot file at
/// `path`, then applies `finish` (the applied id and membership) in the
/// batch that also replaces `SmMeta` (all but the store's format version). Not atomic: the caller marks the
/// install first and repeats it after a crash (see the module docs).
pub(crate) fn load_file<K: KvStore>(
    kv: &K,
    path: &Path,
    finish: Batch,
) -> Result<Loaded, SnapshotError> {
    for space in Space::DATA {
        clear_range(kv, space, Bound::Unbounded, Bound::Unbounded)?;
    }
    let input = BufReader::with_capacity(FILE_BUFFER_BYTES, File::open(path)?);
    let mut reader = RecordReader::new(input)?;
    let mut batch = Batch::new();
    let mut batch_bytes = 0usize;
    let mut records = 0u64;
    while let Some(rec) = reader.next_record()? {
        let space = data_space(rec.space)?;
        batch_bytes += rec.key.len() + rec.value.len();
        batch.put(space, rec.key, rec.value);
        records += 1;
        if batch_bytes >= LOAD_BATCH_BYTES || batch.len() >= LOAD_BATCH_RECORDS {
            kv.apply(std::mem::take(&mut batch))?;
            batch_bytes = 0;
        }
    }
    kv.apply(batch)?;
    let mut last = Batch::new();
    for key in kv.keys_in(Space::SmMeta, Bound::Unbounded, Bound::Unbounded)? {
        if key != FORMAT_KEY {
            last.delete(Space::SmMeta, key);
        }
    }
    last.extend(finish);
    kv.apply(last)?;
    Ok(Loaded { records })
}

/// The directory of a meta node's snapshot files: `<name>.snap` (kept),
/// `<name>.tmp` (being written), `receiving-*.part` (being received).
#[derive(Debug)]
pub(crate) struct SnapshotDir {
    path: PathBuf,
    /// Receiving files by inode, oldest first, at most [`MAX_RECEIVING`].
    receiving: Mutex<VecDeque<(u64, PathBuf)>>,
    names: AtomicU64,
}

impl SnapshotDir {
    pub(crate) fn create(path: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&path)?;
        Ok(SnapshotDir {
            path,
            receiving: Mutex::new(VecDeque::new()),
            names: AtomicU64::new(0),
        })
    }

    pub(crate) fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A fresh file name for a snapshot at log `index`.
    pub(crate) fn new_name(&self, index: u64) -> String {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = self.names.fetch_add(1, Ordering::Relaxed);
        format!("{index:020}-{nanos}-{n}.snap")
    }

    /// A new, empty file for a snapshot being received.
    pub(crate) async fn begin_receiving(&self) -> std::io::Result<tokio::fs::File> {
        let n = self.names.fetch_add(1, Ordering::Relaxed);
        let path = self
            .path
            .join(format!("receiving-{}-{n}.part", std::process::id()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        let ino = file.metadata().await?.ino();
        let evicted = {
            let mut receiving = self.receiving.lock().unwrap_or_else(|e| e.into_inner());
            receiving.push_back((ino, path));
            if receiving.len() > MAX_RECEIVING {
                receiving.pop_front()
            } else {
                None
            }
        };
        if let Some((_, old)) = evicted {
            let _ = tokio::fs::remove_file(old).await;
        }
        Ok(file)
    }

    /// Makes `file` (received, or any snapshot file handle) the durable
    /// file `name`: renamed when it is one of the receiving files, copied
    /// otherwise.
    pub(crate) async fn adopt(
        &self,
        file: &mut tokio::fs::File,
        name: &str,
    ) -> std::io::Result<PathBuf> {
        file.flush().await?;
        let ino = file.metadata().await?.ino();
        let received = {
            let mut receiving = self.receiving.lock().unwrap_or_else(|e| e.into_inner());
            let at = receiving.iter().position(|(i, _)| *i == ino);
            at.and_then(|at| receiving.remove(at)).map(|(_, p)| p)
        };
        let dest = self.path.join(name);
        match received {
            Some(src) => {
                file.sync_all().await?;
                tokio::fs::rename(src, &dest).await?;
            }
            None => {
                let tmp = dest.with_extension("tmp");
                let mut out = tokio::fs::File::create(&tmp).await?;
                file.seek(std::io::SeekFrom::Start(0)).await?;
                tokio::io::copy(file, &mut out).await?;
                out.sync_all().await?;
                tokio::fs::rename(&tmp, &dest).await?;
            }
        }
        sync_dir(&self.path)?;
        Ok(dest)
    }

    /// Removes snapshot files other than `keep`: kept (`.snap`) and
    /// half-written (`.tmp`) ones, and receiving ones too when `receiving`.
    pub(crate) fn remove_others(&self, keep: Option<&str>, receiving: bool) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let stale = (name.ends_with(".snap") && Some(name) != keep)
                || name.ends_with(".tmp")
                || (receiving && name.ends_with(".part"));
            if stale {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}

/// fsyncs a directory, so a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Every record of the snapshot encoding read from `r` (tests).
#[cfg(test)]
pub(crate) fn records_of(r: impl std::io::Read) -> Result<Vec<rpb::SnapshotRecord>, SnapshotError> {
    let mut reader = RecordReader::new(BufReader::new(r))?;
    let mut out = Vec::new();
    while let Some(rec) = reader.next_record()? {
        out.push(rec);
    }
    Ok(out)
}

/// The bytes of a snapshot file holding `records` (tests).
#[cfg(test)]
pub(crate) fn file_bytes(records: &[rpb::SnapshotRecord]) -> Vec<u8> {
    let mut w = RecordWriter::new(Vec::new()).unwrap();
    for r in records {
        let space = Space::from_id(r.space as u8).unwrap();
        w.write(space, r.key.clone(), r.value.clone()).unwrap();
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(space: Space, key: &[u8], value: &[u8]) -> rpb::SnapshotRecord {
        rpb::SnapshotRecord {
            space: u32::from(space.id()),
            key: key.to_vec(),
            value: value.to_vec(),
        }
    }

    /// The file is a `SnapshotBlob` (format and records) whose first field
    /// is the format version; it reads back record by record.
    #[test]
    fn the_file_is_a_snapshot_blob_that_starts_with_its_format() {
        let records = vec![
            record(Space::Buckets, b"b", b"bucket"),
            record(Space::Objects, b"b\0k", &[7u8; 300]),
            record(Space::Refs, b"e1.a", b""),
        ];
        let bytes = file_bytes(&records);
        assert_eq!(&bytes[..2], &[FORMAT_TAG, SNAPSHOT_FORMAT as u8]);
        let blob = rpb::SnapshotBlob::decode(bytes.as_slice()).unwrap();
        assert_eq!(blob.format, SNAPSHOT_FORMAT);
        assert_eq!(blob.records, records);
        assert_eq!(records_of(bytes.as_slice()).unwrap(), records);
        assert!(records_of(file_bytes(&[]).as_slice()).unwrap().is_empty());
    }

    #[test]
    fn a_malformed_file_is_refused() {
        let file = file_bytes(&[record(Space::Objects, b"k", b"value")]);
        let cut = &file[..file.len() - 1];
        assert!(matches!(records_of(cut), Err(SnapshotError::Truncated)));
        let header = &file[..2];
        assert!(matches!(
            records_of(&[header, &[0x12u8, 0x00][..]].concat()[..]),
            Err(SnapshotError::BadTag(0x12))
        ));
        // A length of 2^40 is refused before anything is allocated.
        let huge = [RECORD_TAG, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20];
        assert!(matches!(
            records_of(&[header, &huge[..]].concat()[..]),
            Err(SnapshotError::RecordTooLarge(_))
        ));
    }

    /// A file without a format version (records first, or nothing) and
    /// one of a newer version are refused, naming the versions.
    #[test]
    fn a_file_of_no_or_a_newer_format_is_refused() {
        let unversioned = rpb::SnapshotBlob {
            records: vec![record(Space::Objects, b"k", b"value")],
            format: 0,
        }
        .encode_to_vec();
        for file in [&unversioned[..], &[][..]] {
            assert!(matches!(
                records_of(file),
                Err(SnapshotError::Format(FormatError::Unversioned { .. }))
            ));
        }
        let mut newer = file_bytes(&[record(Space::Objects, b"k", b"value")]);
        newer[1] = (SNAPSHOT_FORMAT + 1) as u8;
        let e = records_of(newer.as_slice()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "snapshot has format version {}; this binary understands up to {}: use a newer sluice release",
                SNAPSHOT_FORMAT + 1,
                SNAPSHOT_FORMAT
            )
        );
    }

    #[test]
    fn pre_images_are_saved_once_per_record() {
        let kv = crate::store::MemStore::new();
        let mut b = Batch::new();
        b.put(Space::Objects, b"a".to_vec(), b"old".to_vec());
        kv.apply(b).unwrap();
        let mut b = Batch::new();
        b.put(Space::Objects, b"a".to_vec(), b"new".to_vec());
        b.put(Space::Objects, b"z".to_vec(), b"added".to_vec());
        b.put(Space::SmMeta, b"applied".to_vec(), b"x".to_vec());
        capture_pre_images(&kv, 7, &mut b).unwrap();
        kv.apply(b).unwrap();
        let mut again = Batch::new();
        again.delete(Space::Objects, b"a".to_vec());
        capture_pre_images(&kv, 7, &mut again).unwrap();
        assert_eq!(again.ops.len(), 1, "a second change saves nothing");
        let images = kv
            .scan(Space::PreImages, Bound::Unbounded, Bound::Unbounded, 10)
            .unwrap();
        assert_eq!(
            images,
            vec![
                (pre_image_key(7, Space::Objects, b"a"), b"\x01old".to_vec()),
                (pre_image_key(7, Space::Objects, b"z"), vec![0]),
            ]
        );
        assert_eq!(clear_pre_images(&kv, Some(8)).unwrap(), 0);
        assert_eq!(clear_pre_images(&kv, Some(7)).unwrap(), 2);
    }
}
