//! The state digest: one hash of everything a snapshot carries, so voters
//! can show that they applied the log to the same state.
//!
//! [`state_digest`] streams every data space ([`Space::DATA`], in space id
//! order) in key order into BLAKE3. Each record is framed as its space id
//! (1 byte), its key length (u64 LE), the key, its value length (u64 LE)
//! and the value, after a domain string, so no two different states hash
//! the same bytes. It reads [`DIGEST_SCAN_ROWS`] records at a time: memory
//! stays flat whatever the state's size.
//!
//! The digest is of the state as the store holds it when the walk runs: a
//! caller that needs it at one applied index holds off applies meanwhile
//! (`crate::raft::state_machine::StateDigester`).

use std::ops::Bound;

use crate::store::{KvStore, Space, as_ref_bound};

use super::SmError;

/// Records read per store scan while hashing.
pub const DIGEST_SCAN_ROWS: usize = 64;

/// What the digest's byte stream starts with; a change of the framing
/// changes it.
const DOMAIN: &[u8] = b"sluice-meta-state-digest-v1";

/// A digest of the state machine's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateDigest {
    /// BLAKE3 of the framed records.
    pub hash: [u8; 32],
    /// Records hashed.
    pub records: u64,
}

impl StateDigest {
    /// The hash as lowercase hex.
    pub fn hex(&self) -> String {
        hex::encode(self.hash)
    }
}

/// The digest of every record of the data spaces of `kv` (see the module
/// docs).
pub fn state_digest<K: KvStore>(kv: &K) -> Result<StateDigest, SmError> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(DOMAIN);
    let mut spaces = Space::DATA;
    spaces.sort_by_key(|s| s.id());
    let mut records = 0u64;
    for space in spaces {
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let rows = kv.scan(
                space,
                as_ref_bound(&from),
                Bound::Unbounded,
                DIGEST_SCAN_ROWS,
            )?;
            let n = rows.len();
            for (k, v) in &rows {
                hasher.update(&[space.id()]);
                hasher.update(&(k.len() as u64).to_le_bytes());
                hasher.update(k);
                hasher.update(&(v.len() as u64).to_le_bytes());
                hasher.update(v);
            }
            records += n as u64;
            match rows.into_iter().last() {
                Some((k, _)) if n == DIGEST_SCAN_ROWS => from = Bound::Excluded(k),
                _ => break,
            }
        }
    }
    Ok(StateDigest {
        hash: *hasher.finalize().as_bytes(),
        records,
    })
}
