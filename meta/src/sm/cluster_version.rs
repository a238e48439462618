//! The cluster version: the newest replicated format every meta node has
//! reported it understands, raised by a `FinalizeVersion` entry (see
//! [`crate::version`]). The leader proposes a command only when the
//! cluster version is at least the command's required format.
//!
//! Stored in `Space::Cluster` under [`KEY`] as a u32 big-endian. Absent
//! means 1, the first replicated format: every binary understands it.

use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;

use super::{Applied, SmError, refuse};
use crate::store::{Batch, KvStore, Space};

/// The key of the cluster version in `Space::Cluster`.
pub const KEY: &[u8] = b"version";

/// The cluster version of a state with none recorded.
pub const INITIAL: u32 = 1;

/// The recorded cluster version, `None` when none was ever finalized.
///
/// Errors: the store fails, or the value is not 4 bytes (corruption).
pub fn recorded<K: KvStore>(kv: &K) -> Result<Option<u32>, SmError> {
    match kv.get(Space::Cluster, KEY)? {
        None => Ok(None),
        Some(v) => {
            let bytes: [u8; 4] = v
                .as_slice()
                .try_into()
                .map_err(|_| SmError::BadKey(Space::Cluster))?;
            Ok(Some(u32::from_be_bytes(bytes)))
        }
    }
}

/// The cluster version: the recorded one, or [`INITIAL`].
pub fn get<K: KvStore>(kv: &K) -> Result<u32, SmError> {
    Ok(recorded(kv)?.unwrap_or(INITIAL))
}

/// Applies `FinalizeVersion`: raises the cluster version to `r.version`.
/// The version never goes down: an equal one changes nothing and succeeds
/// (a retried finalize; an absent version is recorded), a lower one is
/// refused. `format` is the newest replicated format this binary
/// understands: a version above it is an error that stops apply (this
/// binary cannot know what the cluster now writes), never a refusal, which
/// would leave this replica at a version its peers have left.
pub(crate) fn finalize<K: KvStore>(
    kv: &K,
    index: u64,
    r: &rpb::FinalizeVersion,
    format: u32,
) -> Result<(Batch, Applied), SmError> {
    if r.version > format {
        return Err(SmError::NeedsNewer {
            index,
            what: format!("cluster version {}", r.version),
            format,
        });
    }
    if r.version == 0 {
        return refuse(
            ErrorCode::InvalidArgument,
            "cluster version 0 does not exist",
        );
    }
    let current = recorded(kv)?;
    match current {
        Some(v) if r.version < v => refuse(
            ErrorCode::InvalidArgument,
            format!(
                "the cluster version is {v}; it never goes down (asked {})",
                r.version
            ),
        ),
        Some(v) if r.version == v => Ok((Batch::new(), Applied::Done)),
        _ => {
            let mut b = Batch::new();
            b.put(Space::Cluster, KEY, r.version.to_be_bytes().to_vec());
            Ok((b, Applied::Done))
        }
    }
}
