//! Client sessions: at-most-once application of operation ids (Ongaro's
//! Raft dissertation, §6.3).
//!
//! Owner: the exactly-once/epochs work.

use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;

use super::{Applied, SmError, refuse};
use crate::store::{Batch, KvStore};

type Outcome = Result<(Batch, Applied), SmError>;

pub(crate) fn expire_sessions<K: KvStore>(_kv: &K, _r: &rpb::ExpireSessions) -> Outcome {
    refuse(ErrorCode::Internal, "ExpireSessions is not built yet")
}
