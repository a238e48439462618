//! Cluster settings: the parameters that change what apply writes or
//! answers, kept as replicated state so that apply is a function of the
//! state and the entry alone.
//!
//! `Space::Cluster` holds one [`rpb::ClusterSettings`] under the key
//! [`SETTINGS_KEY`]; it is a data space, so it travels in snapshots. An
//! absent record, or an absent field of it, means the default
//! ([`DEFAULT_LEASE_MS`]). Only a `SetClusterSettings` entry changes it: a
//! node's config never reaches apply. A node's `epoch_lease` is only the
//! *initial* value, which a leader proposes with `only_if_absent` while no
//! record exists (`crate::admin::settings::ensure_initial`); afterwards the
//! operator changes it with `sluice admin settings set`.
//!
//! What stays node-local on purpose: everything the leader decides before
//! proposing (the session table bound `session_table_max_entries` is
//! checked at admission, `crate::api`; sweep intervals, expiries and the
//! leader's monotonic clocks decide *when* it proposes an entry, and the
//! entry carries what apply needs, such as `ExpireSessions.before_index`
//! or `leader_now_ms`). Compile-time bounds (`MAX_LIST`, ...) are the
//! binary's, the same on every voter of one release.

use prost::Message;
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;

use super::{Applied, SmError, refuse};
use crate::store::{Batch, KvStore, Space};

type Outcome = Result<(Batch, Applied), SmError>;

/// `Space::Cluster` key of the [`rpb::ClusterSettings`] record.
pub const SETTINGS_KEY: &[u8] = b"settings";

/// Default `epoch_lease_ms` (and of the `epoch_lease` config): 30 s.
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// Shortest epoch lease a settings change may set.
pub const MIN_LEASE_MS: u64 = 1;

/// Longest epoch lease: an epoch of a gateway that died stays open, and
/// fences none of its late commits, for up to this long.
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// The stored settings record, `None` while none was ever set.
pub fn stored<K: KvStore>(kv: &K) -> Result<Option<rpb::ClusterSettings>, SmError> {
    super::get(kv, Space::Cluster, SETTINGS_KEY, "cluster settings")
}

/// The settings in force: the stored record with every absent field set
/// to its default.
pub fn effective<K: KvStore>(kv: &K) -> Result<rpb::ClusterSettings, SmError> {
    Ok(with_defaults(stored(kv)?.unwrap_or_default()))
}

/// `s` with every absent field set to its default.
pub fn with_defaults(mut s: rpb::ClusterSettings) -> rpb::ClusterSettings {
    s.epoch_lease_ms = Some(s.epoch_lease_ms.unwrap_or(DEFAULT_LEASE_MS));
    s
}

/// The epoch lease (ms) OpenEpoch grants now.
pub fn epoch_lease_ms<K: KvStore>(kv: &K) -> Result<u64, SmError> {
    Ok(stored(kv)?
        .and_then(|s| s.epoch_lease_ms)
        .unwrap_or(DEFAULT_LEASE_MS))
}

/// Checks every field present in `s`: `INVALID_ARGUMENT` naming the first
/// one out of range.
pub fn validate(s: &rpb::ClusterSettings) -> Result<(), SmError> {
    if let Some(ms) = s.epoch_lease_ms
        && !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms)
    {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("epoch_lease_ms {ms} is out of range ({MIN_LEASE_MS}..={MAX_LEASE_MS})"),
        );
    }
    Ok(())
}

/// Applies a `SetClusterSettings`: validates, then merges the present
/// fields into the stored record. With `only_if_absent` and a record
/// already stored, changes nothing (and still succeeds).
pub(crate) fn set_cluster_settings<K: KvStore>(kv: &K, r: &rpb::SetClusterSettings) -> Outcome {
    let update = r.settings.unwrap_or_default();
    validate(&update)?;
    let current = stored(kv)?;
    if r.only_if_absent && current.is_some() {
        return Ok((Batch::new(), Applied::Done));
    }
    let mut next = current.unwrap_or_default();
    if let Some(ms) = update.epoch_lease_ms {
        next.epoch_lease_ms = Some(ms);
    }
    let mut b = Batch::new();
    b.put(Space::Cluster, SETTINGS_KEY, next.encode_to_vec());
    Ok((b, Applied::Done))
}
