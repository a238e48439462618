//! The persistence seam: a narrow ordered key/value store with keyspaces,
//! atomic batches and an explicit durability barrier.
//!
//! Everything the meta role keeps (Raft log, vote, committed id, the state
//! machine and its snapshot) goes through [`KvStore`]. Two implementations:
//! [`SledStore`] (on disk) and [`MemStore`] (a `BTreeMap`, for tests).
//!
//! To ensure correctness an implementation must:
//! * keep each [`Space`] separate and iterate keys in unsigned byte order;
//! * apply a [`Batch`] atomically: after a crash either all of its writes
//!   are visible or none, and readers never observe half a batch;
//! * make every write that returned before a [`KvStore::flush`] call durable
//!   once that call returns `Ok`.

#[cfg(test)]
pub(crate) mod hooked;
mod mem;
mod sled_store;

use std::future::Future;
use std::ops::Bound;

pub use mem::MemStore;
pub use sled_store::SledStore;

/// A keyspace. Keys of different spaces never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Space {
    /// Raft log: big-endian index -> `raft.Entry`.
    Log = 1,
    /// Raft log metadata: vote, committed and last purged log ids.
    LogMeta = 2,
    /// State machine metadata: last applied log id and membership.
    SmMeta = 3,
    /// The current snapshot (`raft.StoredSnapshot`: its meta and file name).
    Snapshot = 4,
    /// Pre-images of state machine records changed while a snapshot is
    /// built: generation (u64 BE) space byte key -> `0` (absent) or `1`
    /// followed by the value (see `raft::snapshot`).
    PreImages = 5,
    /// Bucket name -> `meta.Bucket`.
    Buckets = 10,
    /// bucket 0x00 key -> `meta.ObjectRecord`, its head: parts and inline
    /// body are in `Manifests` (see `sm::records`).
    Objects = 11,
    /// bucket 0x00 key 0x00 upload id -> `meta.UploadRecord`.
    Uploads = 12,
    /// upload id 0x00 part number (u32 BE) -> `meta.PartRecord`.
    Parts = 13,
    /// datanode id (u64 BE) -> `meta.DatanodeInfo`.
    Datanodes = 14,
    /// The reference index: blob id -> empty value, for every placement a
    /// part record or an object record references (see `sm::refs`).
    Refs = 15,
    /// Client sessions: operation id -> the first outcome of that
    /// operation (see `sm::sessions`).
    Sessions = 16,
    /// Session expiry order: applied-at log index (u64 BE) 0x00 operation id -> empty.
    SessionsByIndex = 17,
    /// Write epochs: epoch (u64 BE) -> open epoch record; the next epoch
    /// number lives under the empty key (see `sm::epochs`).
    Epochs = 18,
    /// Pending deletions of released blobs: blob id -> record (see `sm::pending`).
    Pending = 19,
    /// Heal intents (see `sm::heal`).
    HealIntents = 20,
    /// Degraded blobs: blob id -> empty, for every committed placement with
    /// missing shards (see `sm::heal`).
    Degraded = 21,
    /// Noncurrent object versions and delete markers: bucket 0x00 key 0x00
    /// (u64::MAX - seq) BE -> `meta.ObjectRecord` head, as in `Objects`
    /// (see `sm::versions`).
    Versions = 22,
    /// Object manifests: the space byte (`Objects` or `Versions`) and key
    /// of an object record -> `meta.ObjectManifest` (its parts and inline
    /// body; see `sm::records`).
    Manifests = 23,
    /// Access keys: access key id -> `meta.AccessKey` (secret and bucket
    /// grants; see `sm::access`).
    AccessKeys = 30,
    /// Read leases of GETs in progress (see `sm::leases`).
    ReadLeases = 24,
    /// Cluster-wide replicated settings and the cluster version (see `sm::settings`).
    Cluster = 25,
}

impl Space {
    /// The state machine's data spaces: what a snapshot carries. The
    /// other state machine space, `SmMeta` (applied id, membership), is
    /// written by the install from the snapshot's meta. Sessions, epochs
    /// and pending deletions are data: a node that installs a snapshot
    /// must fence and deduplicate the same way.
    pub const DATA: [Space; 17] = [
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
        Space::Manifests,
        Space::AccessKeys,
        Space::ReadLeases,
        Space::Cluster,
    ];

    /// The prefix byte of this space.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The space with prefix byte `id`, if any.
    pub fn from_id(id: u8) -> Option<Space> {
        [
            Space::Log,
            Space::LogMeta,
            Space::SmMeta,
            Space::Snapshot,
            Space::PreImages,
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
            Space::Manifests,
            Space::AccessKeys,
            Space::ReadLeases,
            Space::Cluster,
        ]
        .into_iter()
        .find(|s| s.id() == id)
    }
}

/// One write of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` of the space to `value`.
    Put(Space, Vec<u8>, Vec<u8>),
    /// Removes `key` of the space (a missing key is fine).
    Delete(Space, Vec<u8>),
}

/// Writes applied atomically by [`KvStore::apply`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a [`Op::Put`].
    pub fn put(&mut self, space: Space, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put(space, key.into(), value.into()));
    }
    /// Adds a [`Op::Delete`].
    pub fn delete(&mut self, space: Space, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Delete(space, key.into()));
    }
    /// `true` when the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// How many writes the batch holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// Appends the writes of `other` (applied after this batch's).
    pub fn extend(&mut self, other: Batch) {
        self.ops.extend(other.ops);
    }
}

/// A key/value pair read from a space.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Errors of a storage backend.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The sled database failed (I/O error, corruption, lock held).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A key read back without its space prefix (corruption).
    #[error("key without space prefix in the store")]
    BadKey,
}

/// An ordered key/value store with keyspaces. See the module docs for the
/// invariants every implementation keeps.
pub trait KvStore: Send + Sync + 'static {
    /// The value at `key` in `space`.
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;

    /// Up to `limit` pairs of `space` with keys in `(start, end)`, ascending.
    fn scan(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Pair>, KvError>;

    /// The pair with the greatest key in `space`.
    fn last(&self, space: Space) -> Result<Option<Pair>, KvError>;

    /// Applies `batch` atomically.
    fn apply(&self, batch: Batch) -> Result<(), KvError>;

    /// Returns once every write applied before the call is durable.
    fn flush(&self) -> impl Future<Output = Result<(), KvError>> + Send;

    /// Pairs of `space` with keys starting with `prefix`, up to `limit`.
    fn scan_prefix(&self, space: Space, prefix: &[u8], limit: usize) -> Result<Vec<Pair>, KvError> {
        let end = prefix_end(prefix);
        let end_bound = match &end {
            Some(e) => Bound::Excluded(e.as_slice()),
            None => Bound::Unbounded,
        };
        self.scan(space, Bound::Included(prefix), end_bound, limit)
    }

    /// Every key of `space` in `(start, end)`; reads in chunks.
    fn keys_in(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Result<Vec<Vec<u8>>, KvError> {
        const CHUNK: usize = 1024;
        let mut keys = Vec::new();
        let mut from: Bound<Vec<u8>> = match start {
            Bound::Included(k) => Bound::Included(k.to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        loop {
            let chunk = self.scan(space, as_ref_bound(&from), end, CHUNK)?;
            let n = chunk.len();
            if let Some((k, _)) = chunk.last() {
                from = Bound::Excluded(k.clone());
            }
            keys.extend(chunk.into_iter().map(|(k, _)| k));
            if n < CHUNK {
                return Ok(keys);
            }
        }
    }
}

/// Borrows an owned bound.
pub fn as_ref_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The smallest key greater than every key starting with `prefix`, or
/// `None` when there is none (empty prefix or all bytes 0xFF).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Prefixes `key` with the space byte.
fn space_key(space: Space, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(space.id());
    k.extend_from_slice(key);
    k
}

/// The bounds of `(start, end)` within `space`, as full keys.
fn space_bounds(
    space: Space,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = match start {
        Bound::Included(k) => Bound::Included(space_key(space, k)),
        Bound::Excluded(k) => Bound::Excluded(space_key(space, k)),
        Bound::Unbounded => Bound::Included(vec![space.id()]),
    };
    let end = match end {
        Bound::Included(k) => Bound::Included(space_key(space, k)),
        Bound::Excluded(k) => Bound::Excluded(space_key(space, k)),
        Bound::Unbounded => Bound::Excluded(vec![space.id() + 1]),
    };
    (start, end)
}

/// `true` when the range is empty (start past end), which `BTreeMap::range`
/// would panic on.
fn range_is_empty(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
