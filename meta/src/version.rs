//! The cluster version gate, after CockroachDB's cluster version.
//!
//! Each binary understands replicated formats up to [`REPLICATED_FORMAT`].
//! Every log entry carries the format a replica must understand to apply
//! it (`MetaCommand.requires_format`, [`required_format`] of its command,
//! stamped by [`Gate::command`]). The cluster version, replicated state
//! ([`crate::sm::cluster_version`]), is the newest format every meta node
//! has reported it understands; the leader proposes a command only when
//! the cluster version is at least its required format, so during a
//! rolling upgrade no entry reaches a node that cannot apply it.
//!
//! Finalizing raises the cluster version: the leader asks every member
//! (voters and learners) for its format with the `NodeVersion` RPC and,
//! when none lags, proposes `FinalizeVersion` with its own format
//! ([`Versions::finalize`]); `sluice admin version finalize` does it on
//! demand, the leader's version task every `version_check_interval` when
//! `auto_finalize` is set. Until then every node may still be rolled back
//! to the previous release; after, a node of that release stops applying
//! at the first entry it cannot apply ([`crate::sm::SmError::NeedsNewer`])
//! rather than skip it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use sluice_proto::admin as apb;
use sluice_proto::error::{not_leader, status};
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft::raft_client::RaftClient;
use sluice_proto::raft::{self as rpb, MetaCommand, meta_command::Command};
use sluice_util::clock::wall_clock_ms;
use sluice_util::worker::WorkerHandle;
use tonic::Status;

use crate::raft::MetaRaft;
use crate::sm::{self, Applied, SmError};
use crate::store::KvStore;

/// The newest replicated format this binary understands. Bump it when a
/// release changes what replicas must understand to apply the log or
/// install a snapshot: a new command kind, a new field of a command or a
/// stored record that apply reads, a new snapshot format. The change is
/// then gated: give the new command kind (or the commands that set the
/// new field) the new format in [`required_format`], so the leader
/// proposes them only once the cluster version reached it.
///
/// | format | release | what it added |
/// |---|---|---|
/// | 1 | v0.1.0 | the first release's commands and records |
/// | 2 | v0.2.0 | `SetClusterSettings` (replicated cluster settings) and the lease an epoch records (`EpochRecord.lease_ms`) |
pub const REPLICATED_FORMAT: u32 = 2;

/// How often the leader retries recording a fresh cluster's version (at
/// most `version_check_interval`).
const FRESH_POLL: Duration = Duration::from_secs(1);

/// This binary's version (its Cargo package version).
pub const BINARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The name of a command kind, as errors and logs show it.
pub fn command_kind(command: &Command) -> &'static str {
    match command {
        Command::CreateBucket(_) => "CreateBucket",
        Command::DeleteBucket(_) => "DeleteBucket",
        Command::PutObject(_) => "PutObject",
        Command::DeleteObject(_) => "DeleteObject",
        Command::CreateUpload(_) => "CreateUpload",
        Command::PutPart(_) => "PutPart",
        Command::CompleteUpload(_) => "CompleteUpload",
        Command::AbortUpload(_) => "AbortUpload",
        Command::RegisterDatanode(_) => "RegisterDatanode",
        Command::OpenEpoch(_) => "OpenEpoch",
        Command::RenewEpoch(_) => "RenewEpoch",
        Command::CloseEpochs(_) => "CloseEpochs",
        Command::ReportMissing(_) => "ReportMissing",
        Command::BeginHeal(_) => "BeginHeal",
        Command::UpdatePlacement(_) => "UpdatePlacement",
        Command::CollectPending(_) => "CollectPending",
        Command::ExpireSessions(_) => "ExpireSessions",
        Command::PutObjectTagging(_) => "PutObjectTagging",
        Command::PutObjectAcl(_) => "PutObjectAcl",
        Command::PutBucketConfig(_) => "PutBucketConfig",
        Command::ExpireObjects(_) => "ExpireObjects",
        Command::ExpireUploads(_) => "ExpireUploads",
        Command::ReportPresent(_) => "ReportPresent",
        Command::LeaseBlobs(_) => "LeaseBlobs",
        Command::ReleaseBlobs(_) => "ReleaseBlobs",
        Command::ClaimPending(_) => "ClaimPending",
        Command::FinalizeVersion(_) => "FinalizeVersion",
        Command::SetClusterSettings(_) => "SetClusterSettings",
        Command::CreateAccessKey(_) => "CreateAccessKey",
        Command::DeleteAccessKey(_) => "DeleteAccessKey",
        Command::SetKeyGrant(_) => "SetKeyGrant",
        Command::DrainDatanode(_) => "DrainDatanode",
        Command::RemoveDatanode(_) => "RemoveDatanode",
    }
}

/// The oldest replicated format that can apply `command`: the format in
/// which its kind (or the newest field it sets) appeared. No wildcard arm,
/// so a new command kind does not compile until it is given one.
pub fn required_format(command: &Command) -> u32 {
    match command {
        Command::CreateBucket(_)
        | Command::DeleteBucket(_)
        | Command::PutObject(_)
        | Command::DeleteObject(_)
        | Command::CreateUpload(_)
        | Command::PutPart(_)
        | Command::CompleteUpload(_)
        | Command::AbortUpload(_)
        | Command::RegisterDatanode(_)
        | Command::OpenEpoch(_)
        | Command::RenewEpoch(_)
        | Command::CloseEpochs(_)
        | Command::ReportMissing(_)
        | Command::BeginHeal(_)
        | Command::UpdatePlacement(_)
        | Command::CollectPending(_)
        | Command::ExpireSessions(_)
        | Command::PutObjectTagging(_)
        | Command::PutObjectAcl(_)
        | Command::PutBucketConfig(_)
        | Command::ExpireObjects(_)
        | Command::ExpireUploads(_)
        | Command::ReportPresent(_)
        | Command::LeaseBlobs(_)
        | Command::ReleaseBlobs(_)
        | Command::ClaimPending(_)
        | Command::FinalizeVersion(_)
        | Command::CreateAccessKey(_)
        | Command::DeleteAccessKey(_)
        | Command::SetKeyGrant(_)
        | Command::DrainDatanode(_)
        | Command::RemoveDatanode(_) => 1,
        Command::SetClusterSettings(_) => 2,
    }
}

/// `command` as a log entry: stamped with this leader's clock
/// (`leader_now_ms`) and its required format. Proposers go through
/// [`Gate::command`], which also checks the cluster version; this is for
/// the few entries that must not wait on it (a format-1 no-op).
pub fn stamped(command: Command, requires_format: u32) -> MetaCommand {
    MetaCommand {
        leader_now_ms: wall_clock_ms(),
        requires_format,
        command: Some(command),
    }
}

/// Why the leader did not propose a command.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The cluster version is below the command's required format.
    #[error(
        "command {kind} needs cluster version {needs}; the cluster is at {cluster}: finalize the upgrade first (sluice admin version finalize)"
    )]
    Behind {
        kind: &'static str,
        needs: u32,
        cluster: u32,
    },
    /// Reading the cluster version failed.
    #[error("read the cluster version: {0}")]
    Read(#[from] SmError),
}

impl From<GateError> for Status {
    fn from(e: GateError) -> Status {
        match e {
            e @ GateError::Behind { .. } => status(ErrorCode::ClusterVersionGate, e.to_string()),
            e @ GateError::Read(_) => status(ErrorCode::Internal, e.to_string()),
        }
    }
}

/// One node's side of the gate: the format it understands (the binary's,
/// or `replicated_format_override` in tests) and the required formats it
/// stamps.
#[derive(Debug, Clone)]
pub struct Gate {
    format: u32,
    /// Command kind -> required format, replacing [`required_format`]'s
    /// (tests only: a gated command kind without a newer binary).
    testing_formats: Vec<(String, u32)>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(None, Vec::new())
    }
}

impl Gate {
    /// The gate of a node that understands formats up to `format`
    /// ([`REPLICATED_FORMAT`] when `None`).
    pub fn new(format: Option<u32>, testing_formats: Vec<(String, u32)>) -> Self {
        Gate {
            format: format.unwrap_or(REPLICATED_FORMAT),
            testing_formats,
        }
    }

    /// The newest replicated format this node understands.
    pub fn format(&self) -> u32 {
        self.format
    }

    /// The format `command` requires ([`required_format`]).
    pub fn required(&self, command: &Command) -> u32 {
        let kind = command_kind(command);
        self.testing_formats
            .iter()
            .find(|(k, _)| k == kind)
            .map_or_else(|| required_format(command), |(_, f)| *f)
    }

    /// `command` stamped as a log entry ([`stamped`]) if the cluster
    /// version in `kv` (this leader's applied state) is at least its
    /// required format; [`GateError::Behind`] otherwise. The cluster
    /// version never goes down, so a command admitted here stays admitted
    /// until it is applied.
    pub fn command<K: KvStore>(&self, kv: &K, command: Command) -> Result<MetaCommand, GateError> {
        let needs = self.required(&command);
        if needs > sm::cluster_version::INITIAL {
            let cluster = sm::cluster_version::get(kv)?;
            if needs > cluster {
                return Err(GateError::Behind {
                    kind: command_kind(&command),
                    needs,
                    cluster,
                });
            }
        }
        Ok(stamped(command, needs))
    }
}

/// This node's answer to `NodeVersion`, and the leader's show and
/// finalize.
pub(crate) struct Versions<K: KvStore> {
    pub node_id: u64,
    pub raft: MetaRaft,
    pub kv: Arc<K>,
    pub gate: Arc<Gate>,
    /// The index of the entry apply stopped at (0: none), set by the
    /// state machine.
    pub blocked: Arc<AtomicU64>,
    /// How this node dials the other members (mutual TLS as itself).
    pub transport: sluice_net::Transport,
    /// `version_call_timeout`: one NodeVersion call, connect included.
    pub call_timeout: Duration,
}

impl<K: KvStore> Clone for Versions<K> {
    fn clone(&self) -> Self {
        Versions {
            node_id: self.node_id,
            raft: self.raft.clone(),
            kv: self.kv.clone(),
            gate: self.gate.clone(),
            blocked: self.blocked.clone(),
            transport: self.transport.clone(),
            call_timeout: self.call_timeout,
        }
    }
}

impl<K: KvStore> Versions<K> {
    /// This node's `NodeVersion` answer.
    pub fn local(&self) -> Result<rpb::NodeVersionResponse, SmError> {
        Ok(rpb::NodeVersionResponse {
            node_id: self.node_id,
            replicated_format: self.gate.format(),
            binary_version: BINARY_VERSION.to_string(),
            cluster_version: sm::cluster_version::get(self.kv.as_ref())?,
            apply_blocked_index: self.blocked.load(Ordering::Relaxed),
        })
    }

    /// Member `id`'s answer (this node's own without a call).
    async fn ask(&self, id: u64, addr: &str, voter: bool) -> apb::MetaNodeVersion {
        let answer = if id == self.node_id {
            self.local().map_err(|e| e.to_string())
        } else {
            self.call(addr).await
        };
        let mut out = apb::MetaNodeVersion {
            id,
            addr: addr.to_string(),
            voter,
            ..Default::default()
        };
        match answer {
            Ok(v) if v.node_id == id => {
                out.reachable = true;
                out.replicated_format = v.replicated_format;
                out.binary_version = v.binary_version;
                out.cluster_version = v.cluster_version;
                out.apply_blocked_index = v.apply_blocked_index;
            }
            Ok(v) => out.error = format!("answered as node {}", v.node_id),
            Err(e) => out.error = e,
        }
        out
    }

    async fn call(&self, addr: &str) -> Result<rpb::NodeVersionResponse, String> {
        let endpoint = self
            .transport
            .endpoint(addr, sluice_net::Role::Meta)
            .map_err(|e| e.to_string())?;
        let call = async {
            let channel = self
                .transport
                .connect(endpoint.connect_timeout(self.call_timeout))
                .await
                .map_err(|e| e.to_string())?;
            RaftClient::new(channel)
                .node_version(rpb::NodeVersionRequest {})
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| s.message().to_string())
        };
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| format!("no answer within {:?}", self.call_timeout))?
    }

    /// `Ok` on the leader; `NOT_LEADER` with the hint elsewhere.
    fn leader_only(&self) -> Result<Vec<(u64, String, bool)>, Status> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        if !(m.state == ServerState::Leader && m.current_leader == Some(self.node_id)) {
            let addr = m
                .current_leader
                .and_then(|id| membership.get_node(&id))
                .map(|n| n.addr.clone());
            return Err(not_leader(m.current_leader, addr));
        }
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        Ok(membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone(), voters.contains(id)))
            .collect())
    }

    /// The cluster version and every member's answer (on the leader).
    pub async fn show(&self) -> Result<apb::VersionResponse, Status> {
        crate::api::linearizable(&self.raft).await?;
        let members = self.leader_only()?;
        let nodes = futures::future::join_all(
            members
                .iter()
                .map(|(id, addr, voter)| self.ask(*id, addr, *voter)),
        )
        .await;
        let cluster_version = sm::cluster_version::get(self.kv.as_ref())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(apb::VersionResponse {
            cluster_version,
            leader_format: self.gate.format(),
            nodes,
            finalized: false,
        })
    }

    /// Raises the cluster version to this leader's format when every
    /// member answered that it understands it; FAILED_PRECONDITION naming
    /// the members that lag or did not answer otherwise. A cluster already
    /// there is answered as it is (`finalized` false); one with no
    /// recorded version gets it recorded.
    pub async fn finalize(&self) -> Result<apb::VersionResponse, Status> {
        let shown = self.show().await?;
        let target = self.gate.format();
        self.finalize_to(shown, target).await
    }

    /// Finalizes to `target` given every member's answer in `shown`.
    async fn finalize_to(
        &self,
        mut shown: apb::VersionResponse,
        target: u32,
    ) -> Result<apb::VersionResponse, Status> {
        let lagging: Vec<String> = shown
            .nodes
            .iter()
            .filter_map(|n| {
                if !n.reachable {
                    Some(format!(
                        "node {} ({}) did not answer: {}",
                        n.id, n.addr, n.error
                    ))
                } else if n.replicated_format < target {
                    Some(format!(
                        "node {} ({}) runs sluice {} (replicated format {})",
                        n.id, n.addr, n.binary_version, n.replicated_format
                    ))
                } else {
                    None
                }
            })
            .collect();
        if !lagging.is_empty() {
            return Err(status(
                ErrorCode::ClusterVersionGate,
                format!(
                    "cannot finalize replicated format {target}: {}; upgrade or restore them first",
                    lagging.join("; ")
                ),
            ));
        }
        let recorded = sm::cluster_version::recorded(self.kv.as_ref())
            .map_err(|e| Status::internal(e.to_string()))?;
        if recorded.is_some_and(|v| v >= target) {
            return Ok(shown);
        }
        // Every member understands `target` (none is below it), and so
        // does this leader.
        let command = Command::FinalizeVersion(rpb::FinalizeVersion { version: target });
        match crate::api::propose(&self.raft, self.kv.as_ref(), &self.gate, command).await? {
            Applied::Done => {}
            other => return Err(crate::api::unexpected("FinalizeVersion", &other)),
        }
        tracing::info!(
            from = shown.cluster_version,
            to = target,
            "finalized the cluster version"
        );
        shown.finalized = recorded.unwrap_or(0) < target;
        shown.cluster_version = target;
        Ok(shown)
    }

    /// Records the version of a cluster that has none (a fresh one): the
    /// least format its members understand, once every member answered.
    pub(crate) async fn record_initial(&self) -> Result<apb::VersionResponse, Status> {
        let shown = self.show().await?;
        let least = shown.nodes.iter().map(|n| n.replicated_format).min();
        match least {
            Some(least) if shown.nodes.iter().all(|n| n.reachable) => {
                self.finalize_to(shown, least).await
            }
            _ => Err(status(
                ErrorCode::ClusterVersionGate,
                "not every meta node answered NodeVersion yet",
            )),
        }
    }

    /// The leader's version task: every `interval`, finalizes when
    /// `auto_finalize` is set and every member understands this leader's
    /// format, and in any case records the version of a cluster that has
    /// none ([`Self::record_initial`]: a fresh cluster starts at its
    /// binaries' format). Idle on followers.
    pub async fn run(self, auto_finalize: bool, interval: Duration, worker: WorkerHandle) {
        let mut ticker = crate::sweeper::periodic(interval);
        // A fresh cluster's version is recorded as soon as every member
        // answers, not a whole interval after the first election: until
        // then the commands of this release's newer formats are refused.
        let fresh_poll = interval.min(FRESH_POLL);
        loop {
            if matches!(sm::cluster_version::recorded(self.kv.as_ref()), Ok(None)) {
                tokio::time::sleep(fresh_poll).await;
            } else {
                ticker.tick().await;
            }
            if !crate::sweeper::is_leader(&self.raft) {
                worker.idle();
                continue;
            }
            let recorded = match sm::cluster_version::recorded(self.kv.as_ref()) {
                Ok(v) => v,
                Err(e) => {
                    worker.report_error(format_args!("read the cluster version: {e}"));
                    continue;
                }
            };
            let pass = match recorded {
                None => self.record_initial().await,
                Some(v) if auto_finalize && v < self.gate.format() => self.finalize().await,
                Some(_) => {
                    worker.ran();
                    continue;
                }
            };
            match pass {
                Ok(_) => worker.ran(),
                Err(s)
                    if sluice_proto::error::detail(&s)
                        .is_some_and(|d| d.code() == ErrorCode::ClusterVersionGate) =>
                {
                    // Members still lag: the normal state mid-upgrade.
                    tracing::debug!(reason = s.message(), "cluster version not finalized yet");
                    worker.ran();
                }
                // Lost leadership meanwhile.
                Err(s)
                    if sluice_proto::error::detail(&s)
                        .is_some_and(|d| d.code() == ErrorCode::NotLeader) =>
                {
                    worker.idle()
                }
                Err(s) => worker.report_error(format_args!("finalize: {}", s.message())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use sluice_proto::meta as pb;

    fn create_bucket() -> Command {
        Command::CreateBucket(pb::CreateBucketRequest {
            name: "b".into(),
            ..Default::default()
        })
    }

    fn finalize(kv: &MemStore, version: u32) {
        let cmd = stamped(
            Command::FinalizeVersion(rpb::FinalizeVersion { version }),
            1,
        );
        let (batch, applied) = sm::apply_command_as(kv, 1, &cmd, 5).unwrap();
        assert_eq!(applied, Applied::Done);
        kv.apply(batch).unwrap();
    }

    #[test]
    fn the_first_releases_kinds_require_format_1_and_settings_format_2() {
        assert_eq!(REPLICATED_FORMAT, 2);
        let kinds = [
            create_bucket(),
            Command::FinalizeVersion(rpb::FinalizeVersion { version: 1 }),
            Command::ExpireSessions(rpb::ExpireSessions::default()),
            Command::PutObject(pb::PutObjectRequest::default()),
            Command::SetKeyGrant(rpb::SetKeyGrant::default()),
        ];
        for c in &kinds {
            assert_eq!(required_format(c), 1, "{}", command_kind(c));
            assert!(required_format(c) <= REPLICATED_FORMAT);
        }
        assert_eq!(command_kind(&kinds[1]), "FinalizeVersion");
        let settings = Command::SetClusterSettings(rpb::SetClusterSettings::default());
        assert_eq!(required_format(&settings), 2);
        assert_eq!(command_kind(&settings), "SetClusterSettings");
        // Refused by the gate of a cluster still at version 1 (an upgrade
        // from v0.1.0 not yet finalized), admitted once it is at 2.
        let kv = MemStore::new();
        let err = Gate::default().command(&kv, settings.clone()).unwrap_err();
        assert!(
            err.to_string().contains("finalize the upgrade first"),
            "{err}"
        );
        finalize(&kv, 2);
        assert_eq!(
            Gate::default()
                .command(&kv, settings)
                .unwrap()
                .requires_format,
            2
        );
    }

    #[test]
    fn the_gate_stamps_the_required_format_and_refuses_past_the_cluster_version() {
        let kv = MemStore::new();
        let gate = Gate::default();
        let cmd = gate.command(&kv, create_bucket()).unwrap();
        assert_eq!(cmd.requires_format, 1);
        assert!(cmd.leader_now_ms > 0);
        assert_eq!(cmd.command, Some(create_bucket()));

        // A kind this node's leader gates at format 2 (testing table).
        let gate = Gate::new(Some(2), vec![("CreateBucket".into(), 2)]);
        assert_eq!(gate.format(), 2);
        let err = gate.command(&kv, create_bucket()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "command CreateBucket needs cluster version 2; the cluster is at 1: finalize the upgrade first (sluice admin version finalize)"
        );
        let s = Status::from(err);
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        let detail = sluice_proto::error::detail(&s).unwrap();
        assert_eq!(detail.code(), ErrorCode::ClusterVersionGate);
        // Other kinds are not affected.
        let other = Command::ExpireSessions(rpb::ExpireSessions::default());
        assert_eq!(gate.command(&kv, other).unwrap().requires_format, 1);

        finalize(&kv, 2);
        let cmd = gate.command(&kv, create_bucket()).unwrap();
        assert_eq!(cmd.requires_format, 2);
        // A replica of format 1 stops at it; one of format 2 applies it.
        assert!(matches!(
            sm::apply_command_as(&kv, 9, &cmd, 1),
            Err(SmError::NeedsNewer { index: 9, .. })
        ));
        assert_eq!(
            sm::apply_command_as(&kv, 9, &cmd, 2).unwrap().1,
            Applied::Created(true)
        );
    }
}
