//! Client sessions: at-most-once application of operation ids (Ongaro's
//! Raft dissertation, §6.3).
//!
//! `Space::Sessions` maps an op id to the first [`Applied`] outcome of that
//! operation, encoded as `raft.SessionOutcome` ([`encode_outcome`]); `Space::SessionsByIndex` orders the entries
//! by the Raft log index they were applied at (`index u64 BE 0x00 op id`),
//! for expiry. Log indexes, not leader wall-clock stamps: a leader whose
//! clock is behind would stamp fresh entries as old, and the next leader
//! would expire them at once, so a retry inside `session_expiry` would be
//! applied a second time. The entry count lives in `Space::Sessions` under
//! the empty key (an empty op id is never recorded), so it travels with the
//! table in snapshots and the apply path never scans the table.
//!
//! Apply always records and never evicts: what it writes depends on the
//! log alone, never on a node's config. The table is bounded before Raft
//! instead: the leader refuses a new operation with `SLOW_DOWN` when the
//! table and the proposals not yet applied would hold more than
//! `session_table_max_entries` ([`admit`]). Only the leader's sweeper
//! removes entries (`ExpireSessions`), by *its own monotonic clock*: those
//! applied more than `session_expiry` ago, and while the table is above
//! its high-water mark the oldest of those applied more than
//! `session_min_age` ago, which is longer than any client's retry deadline
//! (crate::sweeper). A new leader has no samples of its clock and removes
//! nothing for its first `session_min_age`.

use std::ops::Bound;

use prost::Message;
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;

use super::{Applied, SmError};
use crate::store::{Batch, KvStore, Space};

type Outcome = Result<(Batch, Applied), SmError>;

/// Default `session_table_max_entries`.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// Most entries one `ExpireSessions` removes, whatever its `limit`.
pub const MAX_EXPIRE_BATCH: u32 = 10_000;

/// `Space::Sessions` key of the entry count (u64 BE).
const COUNT_KEY: &[u8] = b"";

const OUTCOME: &str = "session outcome";

/// A stored outcome that decodes but holds no outcome this binary knows
/// (no variant set, or an unknown error code).
#[allow(deprecated)]
fn bad_outcome(why: String) -> SmError {
    SmError::Decode {
        what: OUTCOME,
        source: prost::DecodeError::new(why),
    }
}

/// The stored form of `applied` (`raft.SessionOutcome`).
pub fn to_outcome(applied: &Applied) -> rpb::SessionOutcome {
    use rpb::session_outcome::Outcome as O;
    let outcome = match applied {
        Applied::None => O::None(rpb::Blank {}),
        Applied::Done => O::Done(rpb::Blank {}),
        Applied::Created(created) => O::Created(*created),
        Applied::Released(placements) => O::Released(rpb::OutcomePlacements {
            placements: placements.clone(),
        }),
        Applied::Versioned {
            released,
            version_id,
            delete_marker,
        } => O::Versioned(rpb::OutcomeVersioned {
            released: released.clone(),
            version_id: version_id.clone(),
            delete_marker: *delete_marker,
        }),
        Applied::Completed(r) => O::Completed(r.as_ref().clone()),
        Applied::Epoch(r) => O::Epoch(*r),
        Applied::Registered(r) => O::Registered(*r),
        Applied::Marked(n) => O::Marked(*n),
        Applied::Unmarked(n) => O::Unmarked(*n),
        Applied::KeyCreated(id) => O::KeyCreated(id.clone()),
        Applied::Leased(ids) => O::Leased(rpb::OutcomeBlobIds {
            blob_ids: ids.clone(),
        }),
        Applied::Claimed(ids) => O::Claimed(rpb::OutcomeBlobIds {
            blob_ids: ids.clone(),
        }),
        Applied::Refused { code, message } => O::Refused(rpb::OutcomeRefused {
            code: *code as i32,
            message: message.clone(),
        }),
    };
    rpb::SessionOutcome {
        outcome: Some(outcome),
    }
}

/// The outcome a stored `raft.SessionOutcome` holds.
///
/// Errors: [`SmError::Decode`] when no variant is set or the error code of
/// a refusal is unknown.
pub fn from_outcome(stored: rpb::SessionOutcome) -> Result<Applied, SmError> {
    use rpb::session_outcome::Outcome as O;
    Ok(
        match stored
            .outcome
            .ok_or_else(|| bad_outcome("no outcome set".to_string()))?
        {
            O::None(_) => Applied::None,
            O::Done(_) => Applied::Done,
            O::Created(created) => Applied::Created(created),
            O::Released(r) => Applied::Released(r.placements),
            O::Versioned(v) => Applied::Versioned {
                released: v.released,
                version_id: v.version_id,
                delete_marker: v.delete_marker,
            },
            O::Completed(r) => Applied::Completed(Box::new(r)),
            O::Epoch(r) => Applied::Epoch(r),
            O::Registered(r) => Applied::Registered(r),
            O::Marked(n) => Applied::Marked(n),
            O::Unmarked(n) => Applied::Unmarked(n),
            O::KeyCreated(id) => Applied::KeyCreated(id),
            O::Leased(ids) => Applied::Leased(ids.blob_ids),
            O::Claimed(ids) => Applied::Claimed(ids.blob_ids),
            O::Refused(r) => Applied::Refused {
                code: ErrorCode::try_from(r.code)
                    .map_err(|_| bad_outcome(format!("unknown error code {}", r.code)))?,
                message: r.message,
            },
        },
    )
}

/// The bytes [`record`] stores for `applied`.
pub fn encode_outcome(applied: &Applied) -> Vec<u8> {
    to_outcome(applied).encode_to_vec()
}

/// The outcome of stored bytes `bytes`.
pub fn decode_outcome(bytes: &[u8]) -> Result<Applied, SmError> {
    from_outcome(super::decode(OUTCOME, bytes)?)
}

/// `SessionsByIndex` key: applied-at log index (u64 BE, so keys sort by
/// index) 0x00 op id.
pub fn by_index_key(index: u64, op_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + op_id.len());
    k.extend_from_slice(&index.to_be_bytes());
    k.push(0);
    k.extend_from_slice(op_id.as_bytes());
    k
}

fn op_of_index_key(key: &[u8]) -> Result<&[u8], SmError> {
    if key.len() < 9 || key[8] != 0 {
        return Err(SmError::BadKey(Space::SessionsByIndex));
    }
    Ok(&key[9..])
}

/// How many session entries the table holds.
pub fn count<K: KvStore>(kv: &K) -> Result<u64, SmError> {
    Ok(match kv.get(Space::Sessions, COUNT_KEY)? {
        Some(v) if v.len() == 8 => u64::from_be_bytes(v.try_into().unwrap_or([0; 8])),
        Some(_) => return Err(SmError::BadKey(Space::Sessions)),
        None => 0,
    })
}

/// The first outcome of operation `op_id`, if it was applied and its
/// session entry is still in the table.
pub fn lookup<K: KvStore>(kv: &K, op_id: &str) -> Result<Option<Applied>, SmError> {
    if op_id.is_empty() {
        return Ok(None);
    }
    match kv.get(Space::Sessions, op_id.as_bytes())? {
        Some(v) => Ok(Some(decode_outcome(&v)?)),
        None => Ok(None),
    }
}

/// Whether the leader may propose a command carrying `op_id` (see the
/// module docs): `Ok` for an empty op id, for an op id the table already
/// holds (a retry: apply answers it from the table and adds nothing), and
/// while the table's entries plus `pending` (entries that proposals not yet
/// applied may add, this one included) stay within `max`. Otherwise
/// `SLOW_DOWN`: nothing was proposed, and no entry is evicted to make room.
pub fn admit<K: KvStore>(kv: &K, op_id: &str, pending: u64, max: u64) -> Result<(), SmError> {
    if op_id.is_empty() || kv.get(Space::Sessions, op_id.as_bytes())?.is_some() {
        return Ok(());
    }
    let n = count(kv)?;
    if n.saturating_add(pending) <= max {
        return Ok(());
    }
    super::refuse(
        ErrorCode::SlowDown,
        format!(
            "session table full ({n} entries, {pending} proposals in flight, at most {max}); retry later"
        ),
    )
}

/// The applied-at log index of the oldest session entry.
pub fn oldest_index<K: KvStore>(kv: &K) -> Result<Option<u64>, SmError> {
    let first = kv.scan(
        Space::SessionsByIndex,
        Bound::Unbounded,
        Bound::Unbounded,
        1,
    )?;
    match first.first() {
        Some((k, _)) => {
            op_of_index_key(k)?;
            let index: [u8; 8] = k[..8]
                .try_into()
                .map_err(|_| SmError::BadKey(Space::SessionsByIndex))?;
            Ok(Some(u64::from_be_bytes(index)))
        }
        None => Ok(None),
    }
}

/// How many session entries were applied below log index `before_index`,
/// counting at most `limit` (at most [`MAX_EXPIRE_BATCH`]): what an
/// `ExpireSessions` with these arguments removes.
pub fn count_before<K: KvStore>(kv: &K, before_index: u64, limit: u32) -> Result<u64, SmError> {
    if before_index == 0 {
        return Ok(0);
    }
    let end = before_index.to_be_bytes();
    let rows = kv.scan(
        Space::SessionsByIndex,
        Bound::Unbounded,
        Bound::Excluded(end.as_slice()),
        limit.clamp(1, MAX_EXPIRE_BATCH) as usize,
    )?;
    Ok(rows.len() as u64)
}

/// Adds to `b` the session entry of `op_id` (applied at log index `index`
/// with outcome `applied`). Never evicts: the leader bounds the table
/// before proposing ([`admit`]).
pub(crate) fn record<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    op_id: &str,
    applied: &Applied,
    index: u64,
) -> Result<(), SmError> {
    let encoded = encode_outcome(applied);
    let n = count(kv)? + 1;
    b.put(Space::Sessions, op_id.as_bytes().to_vec(), encoded);
    b.put(
        Space::SessionsByIndex,
        by_index_key(index, op_id),
        Vec::new(),
    );
    b.put(Space::Sessions, COUNT_KEY, n.to_be_bytes().to_vec());
    Ok(())
}

/// Removes up to `limit` (at most [`MAX_EXPIRE_BATCH`]) session entries
/// applied at a log index below `before_index`, oldest first.
pub(crate) fn expire_sessions<K: KvStore>(kv: &K, r: &rpb::ExpireSessions) -> Outcome {
    if r.before_index == 0 {
        return Ok((Batch::new(), Applied::Done));
    }
    let limit = r.limit.clamp(1, MAX_EXPIRE_BATCH) as usize;
    let end = r.before_index.to_be_bytes();
    let rows = kv.scan(
        Space::SessionsByIndex,
        Bound::Unbounded,
        Bound::Excluded(end.as_slice()),
        limit,
    )?;
    let mut b = Batch::new();
    if rows.is_empty() {
        return Ok((b, Applied::Done));
    }
    let n = count(kv)?.saturating_sub(rows.len() as u64);
    for (k, _) in rows {
        b.delete(Space::Sessions, op_of_index_key(&k)?.to_vec());
        b.delete(Space::SessionsByIndex, k);
    }
    b.put(Space::Sessions, COUNT_KEY, n.to_be_bytes().to_vec());
    Ok((b, Applied::Done))
}

#[cfg(test)]
mod tests {
    use sluice_proto::meta as pb;

    use super::*;

    fn placement(blob: &str) -> pb::Placement {
        pb::Placement {
            blob_id: blob.into(),
            size: 7,
            data_shards: 2,
            parity_shards: 1,
            block_size: 4,
            nodes: vec![1, 2, 3],
            missing: vec![2],
        }
    }

    /// One outcome of every variant, with payloads that differ from their
    /// defaults (a field the encoding dropped would show).
    fn every_variant() -> Vec<Applied> {
        vec![
            Applied::None,
            Applied::Done,
            Applied::Created(true),
            Applied::Created(false),
            Applied::Released(vec![placement("e1.a"), placement("e1.b")]),
            Applied::Released(Vec::new()),
            Applied::Versioned {
                released: vec![placement("e1.c")],
                version_id: "v00000000000000000007".into(),
                delete_marker: true,
            },
            Applied::Completed(Box::new(pb::CompleteUploadResponse {
                object: Some(pb::ObjectRecord {
                    bucket: "b".into(),
                    key: "k".into(),
                    etag: "\"abc-2\"".into(),
                    ..Default::default()
                }),
                released: vec![placement("e1.d")],
                version_id: "v1".into(),
            })),
            Applied::Epoch(pb::OpenEpochResponse {
                epoch: 9,
                lease_ms: 30_000,
            }),
            Applied::Registered(pb::RegisterDatanodeResponse {
                disk_generation: 4,
                disk_replaced: true,
            }),
            Applied::Marked(3),
            Applied::Unmarked(0),
            Applied::KeyCreated("SK1".into()),
            Applied::Leased(vec!["e1.x".into()]),
            Applied::Claimed(vec!["e1.y".into(), "e1.z".into()]),
            Applied::Refused {
                code: ErrorCode::NoSuchBucket,
                message: "no such bucket: b".into(),
            },
        ]
    }

    #[test]
    fn every_outcome_round_trips_through_its_stored_form() {
        for applied in every_variant() {
            let bytes = encode_outcome(&applied);
            assert_eq!(decode_outcome(&bytes).unwrap(), applied);
        }
    }

    #[test]
    fn a_stored_outcome_without_a_known_variant_is_refused() {
        let empty = rpb::SessionOutcome { outcome: None }.encode_to_vec();
        assert!(matches!(
            decode_outcome(&empty),
            Err(SmError::Decode { what: OUTCOME, .. })
        ));
        let unknown_code = rpb::SessionOutcome {
            outcome: Some(rpb::session_outcome::Outcome::Refused(
                rpb::OutcomeRefused {
                    code: 9999,
                    message: String::new(),
                },
            )),
        }
        .encode_to_vec();
        let e = decode_outcome(&unknown_code).unwrap_err();
        assert!(e.to_string().contains("unknown error code 9999"), "{e}");
    }
}
