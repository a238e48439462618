//! Cluster settings and the state digest (`sluice admin settings ...`,
//! `sluice admin meta digest`).
//!
//! Settings are replicated state (`sm::settings`): a change is a
//! `SetClusterSettings` log entry, validated again at apply. A node's
//! config `epoch_lease` only seeds a new cluster: [`ensure_initial`]
//! proposes it, with `only_if_absent`, while no settings record exists, so
//! whichever leader's initial value is applied first stays.

use std::time::Duration;

use sluice_proto::admin as apb;
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft as rpb;
use sluice_proto::raft::meta_command::Command;
use tonic::Status;

use crate::api::{linearizable, propose, sm_status, unexpected};
use crate::raft::{MetaRaft, StateDigester};
use crate::sm::{self, Applied};
use crate::store::KvStore;
use crate::version::Gate;

/// The settings a node proposes for a new cluster: its config's
/// `epoch_lease` (in range: `Config::validate` refuses longer, and
/// shorter than 1 ms rounds up).
pub(crate) fn initial_settings(epoch_lease: Duration) -> rpb::ClusterSettings {
    let ms = u64::try_from(epoch_lease.as_millis()).unwrap_or(u64::MAX);
    rpb::ClusterSettings {
        epoch_lease_ms: Some(ms.clamp(sm::settings::MIN_LEASE_MS, sm::settings::MAX_LEASE_MS)),
    }
}

/// The command that seeds the settings with `initial` unless a record
/// exists when it is applied.
pub(crate) fn initial_command(initial: &rpb::ClusterSettings) -> Command {
    Command::SetClusterSettings(rpb::SetClusterSettings {
        settings: Some(*initial),
        only_if_absent: true,
        op_id: String::new(),
    })
}

/// Proposes [`initial_command`] if this node's state holds no settings
/// record. Called by the leader before it opens a write epoch and by its
/// epoch sweep; a record committed but not yet applied here makes the
/// proposal a no-op at apply.
pub(crate) async fn ensure_initial<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    initial: &rpb::ClusterSettings,
) -> Result<(), Status> {
    if !should_seed(kv, gate, initial).map_err(sm_status)? {
        return Ok(());
    }
    let applied = propose(raft, kv, gate, initial_command(initial)).await?;
    if applied != Applied::Done {
        return Err(unexpected("SetClusterSettings", &applied));
    }
    tracing::info!(settings = ?initial, "seeded the cluster settings from this node's config");
    Ok(())
}

/// Whether this leader should propose [`initial_command`]: no settings
/// record is stored and the cluster version admits the command. Before an
/// upgrade to the settings' format is finalized nothing is seeded and the
/// defaults apply on every voter alike.
pub(crate) fn should_seed<K: KvStore>(
    kv: &K,
    gate: &Gate,
    initial: &rpb::ClusterSettings,
) -> Result<bool, sm::SmError> {
    Ok(sm::settings::stored(kv)?.is_none()
        && gate.required(&initial_command(initial)) <= sm::cluster_version::get(kv)?)
}

fn response(s: Option<rpb::ClusterSettings>) -> apb::ClusterSettingsResponse {
    let defaults = s.is_none();
    let s = sm::settings::with_defaults(s.unwrap_or_default());
    apb::ClusterSettingsResponse {
        epoch_lease_ms: s.epoch_lease_ms.unwrap_or(sm::settings::DEFAULT_LEASE_MS),
        defaults,
    }
}

/// The settings in force, read linearizably on the leader.
pub(crate) async fn get_settings<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
) -> Result<apb::ClusterSettingsResponse, Status> {
    linearizable(raft).await?;
    Ok(response(sm::settings::stored(kv).map_err(sm_status)?))
}

/// What the leader's own session config allows a lease to be: a session
/// entry must outlive 2 × the lease plus the clients' retry deadline
/// (`Config::validate` checks the same for the initial lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseLimit {
    pub session_expiry: Duration,
    pub client_retry_deadline: Duration,
}

impl LeaseLimit {
    fn check(&self, lease_ms: u64) -> Result<(), Status> {
        let lease = Duration::from_millis(lease_ms);
        if self.session_expiry <= lease * 2 + self.client_retry_deadline {
            return Err(sluice_proto::error::status(
                ErrorCode::InvalidArgument,
                format!(
                    "epoch lease {lease:?} too long for the leader's session_expiry ({:?}): it must exceed 2 x the lease + client_retry_deadline ({:?})",
                    self.session_expiry, self.client_retry_deadline
                ),
            ));
        }
        Ok(())
    }
}

/// Sets the fields present through the log and answers the settings
/// after the change.
pub(crate) async fn set_settings<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    limit: LeaseLimit,
    req: apb::SetClusterSettingsRequest,
) -> Result<apb::ClusterSettingsResponse, Status> {
    let settings = rpb::ClusterSettings {
        epoch_lease_ms: req.epoch_lease_ms,
    };
    if settings == rpb::ClusterSettings::default() {
        return Err(sluice_proto::error::status(
            ErrorCode::InvalidArgument,
            "no setting to change",
        ));
    }
    sm::settings::validate(&settings).map_err(sm_status)?;
    if let Some(ms) = settings.epoch_lease_ms {
        limit.check(ms)?;
    }
    let applied = propose(
        raft,
        kv,
        gate,
        Command::SetClusterSettings(rpb::SetClusterSettings {
            settings: Some(settings),
            only_if_absent: false,
            op_id: req.op_id,
        }),
    )
    .await?;
    if applied != Applied::Done {
        return Err(unexpected("SetClusterSettings", &applied));
    }
    tracing::info!(?settings, "cluster settings changed");
    // Applied on this node (the leader) before client_write returned.
    Ok(response(sm::settings::stored(kv).map_err(sm_status)?))
}

/// This node's digest of its applied state.
pub(crate) async fn state_digest<K: KvStore>(
    node_id: u64,
    digester: &StateDigester<K>,
) -> Result<apb::StateDigestResponse, Status> {
    let d = digester
        .digest()
        .await
        .map_err(|e| Status::internal(format!("state digest: {e}")))?;
    Ok(apb::StateDigestResponse {
        node_id,
        applied_index: d.applied_index,
        digest_hex: d.digest.hex(),
        records: d.digest.records,
    })
}
