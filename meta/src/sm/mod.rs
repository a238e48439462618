//! The metadata state machine as pure functions over a [`KvStore`]: a
//! mutation reads the current state and returns the [`Batch`] that applies
//! it plus its [`Applied`] outcome; reads return the answer. No Raft, no
//! I/O besides the store, so every rule is unit tested directly.
//!
//! Semantics follow the comments of `proto/meta.proto` (S3 rules for
//! buckets, objects, multipart uploads and listings).
//!
//! # Layout
//! * `mutate` — [`apply_command`]: one function per `MetaCommand`.
//! * `read` — point lookups and S3 listings.
//! * [`refs`] — the reference index (blob id -> locator of its record) and
//!   the degraded index that every mutation keeps, and
//!   [`filter_unreferenced`].
//! * [`heal`] — heal intents, ReportMissing, ReportPresent, the UpdatePlacement
//!   compare-and-set and [`collectable`] for the datanodes' GC.
//! * [`registry`] — datanode registration with disk identity.
//! * `stale` — [`stale_uploads`]: bounded pages of expired uploads for the
//!   leader's sweeper.
//! * [`keys`] — key encodings of the keyspaces.
//! * [`access`] — access keys (S3 users) and their bucket grants.
//! * [`cluster_version`] — the cluster version `FinalizeVersion` raises.
//! * [`versions`] — object versions and delete markers.
//! * [`pending`], [`leases`] — pending deletions of released blobs and the
//!   read leases that hold them back.
//! * `records` — object records as head and manifest rows.
//! * [`settings`] — replicated cluster settings (the epoch lease).
//! * [`digest`] — [`state_digest`]: one hash of the data spaces.

pub mod access;
pub mod cluster_version;
pub mod digest;
pub mod epochs;
pub mod heal;
pub mod keys;
pub mod leases;
pub mod lifecycle;
mod mutate;
pub mod pending;
mod read;
pub mod records;
pub mod refs;
pub mod registry;
pub mod sessions;
pub mod settings;
mod stale;
pub mod versions;

#[cfg(test)]
mod tests;

use prost::Message;
use serde::{Deserialize, Serialize};
use sluice_proto::meta::{self as pb, ErrorCode};

use crate::store::{KvError, KvStore, Space};

pub use digest::{StateDigest, state_digest};
pub use heal::{MAX_SHARDS_PER_CALL, collectable};
pub use mutate::{admission_op_id, apply_command, apply_command_as, multipart_etag, part_etag};
pub use read::{
    get_bucket, get_datanode, get_object, get_upload, list_buckets, list_datanodes, list_objects,
    list_parts, list_placements, list_uploads, list_versions,
};
pub use refs::{MAX_FILTER_IDS, filter_unreferenced};
pub use stale::{StalePage, stale_uploads};
pub use versions::{get_version, get_version_as};

/// Most entries one listing returns (S3's limit); a request for 0 gets this.
pub const MAX_LIST: u32 = 1000;

/// Highest S3 part number.
pub const MAX_PART_NUMBER: u32 = 10_000;

/// The outcome of applying one log entry (openraft's `R`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum Applied {
    /// A blank or membership entry.
    #[default]
    None,
    /// A mutation without a payload in its answer succeeded.
    Done,
    /// CreateBucket: `true` when the bucket was created.
    Created(bool),
    /// Placements no longer referenced after the mutation.
    Released(Vec<pb::Placement>),
    /// PutObject or DeleteObject in a bucket whose versioning was ever
    /// set (or a DeleteObject naming a version): the placements released
    /// and the version written or removed (`ReleasedResponse`).
    Versioned {
        released: Vec<pb::Placement>,
        version_id: String,
        delete_marker: bool,
    },
    /// CompleteUpload succeeded.
    Completed(Box<pb::CompleteUploadResponse>),
    /// OpenEpoch succeeded.
    Epoch(pb::OpenEpochResponse),
    /// RegisterDatanode succeeded.
    Registered(pb::RegisterDatanodeResponse),
    /// ReportMissing: how many shards were marked missing.
    Marked(u32),
    /// ReportPresent: how many shards left `missing`.
    Unmarked(u32),
    /// CreateAccessKey: the id of the stored key (the secret is read from
    /// the record, so it is never in the session table).
    KeyCreated(String),
    /// LeaseBlobs: the blob ids not leased because their deletion was
    /// already claimed.
    Leased(Vec<String>),
    /// ClaimPending: the blob ids whose pending deletion is claimed.
    Claimed(Vec<String>),
    /// The mutation was refused for an S3-level reason; nothing changed.
    Refused { code: ErrorCode, message: String },
}

/// Why a state machine call did not produce its answer.
#[derive(Debug, thiserror::Error)]
pub enum SmError {
    /// Refused for an S3-level reason (NoSuchBucket, InvalidPart, ...).
    #[error("{code:?}: {message}")]
    Refused { code: ErrorCode, message: String },
    /// The store failed.
    #[error("metadata store: {0}")]
    Store(#[from] KvError),
    /// A stored record does not decode (corruption).
    #[error("decode {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    /// A stored key is not what its space promises (corruption).
    #[error("malformed key in {0:?}")]
    BadKey(Space),
    /// An object record and its manifest stayed of different writes over
    /// every retry of a read (see `records`): overwritten faster than read,
    /// or corrupt.
    #[error("object record in {0:?} and its manifest are of different writes")]
    Torn(Space),
    /// The log entry at `index` needs a binary that understands a newer
    /// replicated format than this one's `format`: apply stops here (a
    /// replica that skipped it would diverge from its peers).
    #[error(
        "log entry {index} needs a newer sluice ({what}; this binary understands replicated format {format}): upgrade this node"
    )]
    NeedsNewer {
        index: u64,
        what: String,
        format: u32,
    },
    /// A stored record decodes but breaks the store format's rules.
    #[error("corrupt record in {space:?}: {why}")]
    Corrupt { space: Space, why: &'static str },
}

pub(crate) fn refuse<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, SmError> {
    Err(SmError::Refused {
        code,
        message: message.into(),
    })
}

pub(crate) fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M, SmError> {
    M::decode(bytes).map_err(|source| SmError::Decode { what, source })
}

pub(crate) fn get<M: Message + Default, K: KvStore>(
    kv: &K,
    space: Space,
    key: &[u8],
    what: &'static str,
) -> Result<Option<M>, SmError> {
    match kv.get(space, key)? {
        Some(v) => Ok(Some(decode(what, &v)?)),
        None => Ok(None),
    }
}

pub(crate) fn require_bucket<K: KvStore>(kv: &K, bucket: &str) -> Result<pb::Bucket, SmError> {
    match get(kv, Space::Buckets, &keys::bucket(bucket), "bucket")? {
        Some(b) => Ok(b),
        None => refuse(ErrorCode::NoSuchBucket, format!("no such bucket: {bucket}")),
    }
}

/// The page size of a listing: 0 means the default ([`MAX_LIST`]), larger
/// values are capped at it.
pub(crate) fn page_size(requested: u32) -> usize {
    if requested == 0 {
        MAX_LIST as usize
    } else {
        requested.min(MAX_LIST) as usize
    }
}
