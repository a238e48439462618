//! The reference index: which blobs the committed metadata references.
//!
//! [`Space::Refs`] holds one key per blob id that a part record or an
//! object record references (the value is empty). Every mutation updates
//! it in the same atomic batch as the records it writes, so the index is
//! always exactly the set of blobs of all part and object records. The
//! datanodes' shard GC asks [`filter_unreferenced`] which of their old
//! shards' blobs are garbage.
//!
//! To ensure correctness the index relies on the invariant the whole data
//! path already keeps: a blob is referenced by at most one record at a time.
//! Every shard write creates a fresh blob id; a retried commit of the same
//! record references the same blob and releases nothing; Complete moves a
//! part's blob from its part record to the object record. Under it, a blob
//! leaves the index exactly when a mutation releases it
//! ([`Applied::Released`](super::Applied::Released),
//! `CompleteUploadResponse.released`).
//!
//! The index is a keyspace like the others, so snapshots carry it. A store
//! written before the index existed is indexed once at startup
//! ([`ensure_index`]); a snapshot without index records is indexed while
//! it is installed ([`blobs_of_record`]).

use std::collections::HashSet;
use std::ops::Bound;

use sluice_proto::meta::{self as pb, ErrorCode};

use super::{SmError, decode, keys, refuse};
use crate::store::{Batch, KvStore, Space, as_ref_bound};

/// Most blob ids one [`filter_unreferenced`] call accepts.
pub const MAX_FILTER_IDS: usize = 1000;

/// `SmMeta` key whose presence says the reference index is complete.
pub const INDEX_MARKER: &[u8] = b"ref_index";
/// Value of [`INDEX_MARKER`]: the index format version.
pub const INDEX_VERSION: &[u8] = b"1";

/// Records read per scan while indexing an existing store.
const REBUILD_CHUNK: usize = 1024;

/// Adds the reference-index writes of one mutation to `b`: blobs of
/// `released` placements leave the index, blobs of `referenced` placements
/// (those of the records the mutation writes) are in it afterwards. A blob
/// in both stays; placements with an empty blob id are ignored.
pub(crate) fn update_index<'a>(
    b: &mut Batch,
    released: &[pb::Placement],
    referenced: impl IntoIterator<Item = &'a pb::Placement>,
) {
    let kept: HashSet<&str> = referenced
        .into_iter()
        .map(|p| p.blob_id.as_str())
        .filter(|id| !id.is_empty())
        .collect();
    for p in released {
        if !p.blob_id.is_empty() && !kept.contains(p.blob_id.as_str()) {
            b.delete(Space::Refs, keys::reference(&p.blob_id));
        }
    }
    for id in kept {
        b.put(Space::Refs, keys::reference(id), Vec::new());
    }
}

/// `true` when a part or object record references `blob_id`.
pub fn is_referenced<K: KvStore>(kv: &K, blob_id: &str) -> Result<bool, SmError> {
    Ok(kv.get(Space::Refs, &keys::reference(blob_id))?.is_some())
}

/// The ids of `blob_ids` that no part or object record references, in
/// request order (duplicates kept). Refuses `InvalidArgument` for more than
/// [`MAX_FILTER_IDS`] ids.
pub fn filter_unreferenced<K: KvStore>(
    kv: &K,
    blob_ids: &[String],
) -> Result<Vec<String>, SmError> {
    if blob_ids.len() > MAX_FILTER_IDS {
        return refuse(
            ErrorCode::InvalidArgument,
            format!(
                "{} blob ids asked, at most {MAX_FILTER_IDS} per call",
                blob_ids.len()
            ),
        );
    }
    let mut out = Vec::new();
    for id in blob_ids {
        if !is_referenced(kv, id)? {
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// The blob ids a stored record of `space` references: the placements of
/// an object record's parts, or a part record's placement. Records of other
/// spaces reference nothing.
pub fn blobs_of_record(space: Space, value: &[u8]) -> Result<Vec<String>, SmError> {
    let placements: Vec<pb::Placement> = match space {
        Space::Objects => {
            let o: pb::ObjectRecord = decode("object", value)?;
            o.parts.into_iter().filter_map(|p| p.placement).collect()
        }
        Space::Parts => {
            let p: pb::PartRecord = decode("part", value)?;
            p.placement.into_iter().collect()
        }
        _ => Vec::new(),
    };
    Ok(placements
        .into_iter()
        .map(|p| p.blob_id)
        .filter(|id| !id.is_empty())
        .collect())
}

/// Indexes a store written before the reference index existed: when the
/// [`INDEX_MARKER`] is missing, adds every blob of every object and part
/// record to the index (in chunks), then sets the marker. Returns how many
/// references were written, or `None` when the index was already complete.
///
/// Run it before Raft starts applying entries; an interrupted run leaves
/// the marker unset and is simply repeated at the next start.
pub fn ensure_index<K: KvStore>(kv: &K) -> Result<Option<u64>, SmError> {
    if kv.get(Space::SmMeta, INDEX_MARKER)?.is_some() {
        return Ok(None);
    }
    let mut indexed = 0u64;
    for space in [Space::Objects, Space::Parts] {
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let rows = kv.scan(space, as_ref_bound(&from), Bound::Unbounded, REBUILD_CHUNK)?;
            let n = rows.len();
            let mut b = Batch::new();
            for (k, v) in rows {
                for id in blobs_of_record(space, &v)? {
                    b.put(Space::Refs, keys::reference(&id), Vec::new());
                    indexed += 1;
                }
                from = Bound::Excluded(k);
            }
            kv.apply(b)?;
            if n < REBUILD_CHUNK {
                break;
            }
        }
    }
    let mut b = Batch::new();
    b.put(Space::SmMeta, INDEX_MARKER, INDEX_VERSION);
    kv.apply(b)?;
    Ok(Some(indexed))
}

/// Every blob id in the index, ascending (tests and tools; reads the whole
/// keyspace).
pub fn all_references<K: KvStore>(kv: &K) -> Result<Vec<String>, SmError> {
    kv.keys_in(Space::Refs, Bound::Unbounded, Bound::Unbounded)?
        .into_iter()
        .map(|k| String::from_utf8(k).map_err(|_| SmError::BadKey(Space::Refs)))
        .collect()
}
